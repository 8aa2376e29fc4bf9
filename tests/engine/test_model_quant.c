// Quantizing a whole model: one of stories260K's shape (synthetic weights,
// so no file is needed) against its fp32 self, packed bytes
// with no fp copy left, every method and scheme running through the engine,
// and the int8 KV cache.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/model_eval.h"
#include "engine/model_quant.h"
#include "engine/model_synth.h"
#include "engine/tokenizer.h"
#include "tests/test_support.h"

// Two streams the model itself writes: a prompt and the fp32 model's greedy
// continuation, what a good quantization must keep predicting (the role
// llama2.c's greedy ids of stories260K played when these tests read
// ../shared; the model is now synthetic, of stories260K's exact shape, so
// they run in any clone).
typedef struct golden_streams {
    int32_t tokens[2][256];
    int32_t* sequences[2];
    int lengths[2];
} golden_streams;

static void make_golden_streams(const model* m, golden_streams* g) {
    static const int32_t prompts[2][4] = {{TOK_BOS_ID, 300, 400, 100}, {TOK_BOS_ID, 87, 422, 260}};
    for (int k = 0; k < 2; k++) {
        memcpy(g->tokens[k], prompts[k], sizeof prompts[k]);
        test_generation run = test_engine_generate(m, prompts[k], 4, 252, 0.0f, 0.0f, 0, g->tokens[k] + 4);
        g->sequences[k] = g->tokens[k];
        g->lengths[k] = 4 + run.n_generated;
    }
}

static void load_stories(model* m) { test_synthesize_stories260k_shape(m); }

static model_comparison quantize_and_compare(const char* spec_text, double* bytes_ratio, model_quant_report* report_out) {
    model reference, quantized;
    load_stories(&reference);
    load_stories(&quantized);
    golden_streams g;
    make_golden_streams(&reference, &g);
    model_quant_spec spec;
    error_info err = {{0}};
    assert_int_equal(model_quant_spec_parse(spec_text, &spec, &err), 0);
    model_quant_report report = {0};
    // Calibrate on the first golden stream, evaluate on both.
    if (model_quantize(&quantized, &spec, (const int32_t* const*)g.sequences, g.lengths, 1, NULL, &report, &err))
        fail_msg("quantize %s: %s", spec_text, err.message);
    model_comparison c;
    if (model_compare(&reference, &quantized, (const int32_t* const*)g.sequences, g.lengths, 2, NULL, &c, &err))
        fail_msg("compare: %s", err.message);
    print_message("%-20s KL %.5f  top-1 %.2f%%  ppl %.3f (fp32 %.3f)  bytes %llu -> %llu\n", spec_text, c.kl_mean,
                  100 * c.top1_agreement, c.ppl_test, c.ppl_reference, (unsigned long long)report.weight_bytes_before,
                  (unsigned long long)report.weight_bytes_after);
    if (bytes_ratio) *bytes_ratio = (double)report.weight_bytes_before / (double)report.weight_bytes_after;
    assert_int_equal(report.weight_bytes_before, reference.weight_bytes);
    assert_int_equal(report.weight_bytes_after, quantized.weight_bytes);
    if (report_out) *report_out = report;
    else model_quant_report_free(&report);
    model_free(&reference);
    model_free(&quantized);
    return c;
}

// W8A16 by default: int8 per output channel, asymmetric (a zero-point per
// channel). Symmetric int8 (w8a16:sym) has a KL as small but flips a few
// near-tied argmaxes more; its figures are printed by the next test.
static void test_w8a16_keeps_top1_above_99_percent(void** state) {
    (void)state;
    double ratio;
    model_comparison c = quantize_and_compare("w8a16", &ratio, NULL);
    assert_true(c.n_positions > 390);
    assert_true(c.top1_agreement >= 0.99);
    assert_true(c.kl_mean < 0.01);
    assert_true(ratio > 3.5); // fp32 -> int8 + a scale per channel
}

static void test_w4a16_g32_is_reported(void** state) {
    (void)state;
    double ratio;
    model_comparison c = quantize_and_compare("w4a16:g32", &ratio, NULL);
    // Four bits cost accuracy on a 260K-parameter model; the figures are
    // printed above and in the closing note; here they must be sane.
    assert_true(isfinite(c.kl_mean) && c.kl_mean > 0);
    assert_true(c.top1_agreement > 0.5);
    assert_true(ratio > 5.0);
}

static void test_methods_and_schemes_all_run(void** state) {
    (void)state;
    const char* specs[] = {"w4a16:g16:awq", "w4a16:g16:gptq", "w4a16:g16:rtn", "w8a8",
                           "w8a16:sym",     "w8a16:g32",      "w4a16:channel:sym"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        model_quant_report report;
        model_comparison c = quantize_and_compare(specs[i], NULL, &report);
        assert_true(isfinite(c.kl_mean));
        assert_true(c.top1_agreement > 0.5);
        // One report per matrix: embedding + 7 per layer.
        assert_int_equal(report.n_layers, 1 + 7 * 5);
        assert_string_equal(report.layers[0].name, "token_embedding");
        assert_string_equal(report.layers[35].name, "layers.4.w3");
        if (strstr(specs[i], "awq")) assert_true(report.layers[1].awq_alpha >= 0); // wq got AWQ scales
        model_quant_report_free(&report);
    }
}

// The quantized model keeps only packed bytes: its weight bytes are exactly
// the packed matrices plus the fp32 norm gains.
static void test_packed_bytes_exact_and_no_fp_copy(void** state) {
    (void)state;
    model m;
    load_stories(&m);
    model_quant_spec spec;
    error_info err = {{0}};
    assert_int_equal(model_quant_spec_parse("w4a16:g16:asym", &spec, &err), 0);
    assert_int_equal(model_quantize(&m, &spec, NULL, NULL, 0, NULL, NULL, &err), 0);
    assert_int_equal(m.dtype, WEIGHT_I4);
    uint64_t expected = (2 * 5 + 1) * 64 * 4; // norms
    // Each matrix: rows x ceil(cols/2) payload + per group (2 B scale + 1 B zero).
    const weight_matrix* all[36];
    all[0] = &m.token_embedding;
    for (int l = 0; l < 5; l++) {
        const weight_matrix* w[7] = {&m.layers[l].wq, &m.layers[l].wk, &m.layers[l].wv, &m.layers[l].wo,
                                     &m.layers[l].w1, &m.layers[l].w2, &m.layers[l].w3};
        for (int i = 0; i < 7; i++) all[1 + 7 * l + i] = w[i];
    }
    for (int i = 0; i < 36; i++) {
        const weight_matrix* w = all[i];
        assert_int_equal(w->dtype, WEIGHT_I4);
        assert_non_null(w->zero_points);
        int groups_per_row = w->cols / w->group_size;
        expected += (uint64_t)w->rows * (uint64_t)((w->cols + 1) / 2) + (uint64_t)w->rows * (uint64_t)groups_per_row * 3;
    }
    assert_int_equal(m.weight_bytes, expected);
    assert_ptr_equal(m.classifier.values, m.token_embedding.values); // still shared
    model_free(&m);
    // Quantizing twice is refused.
    load_stories(&m);
    assert_int_equal(model_quantize(&m, &spec, NULL, NULL, 0, NULL, NULL, &err), 0);
    assert_int_equal(model_quantize(&m, &spec, NULL, NULL, 0, NULL, NULL, &err), -1);
    assert_non_null(strstr(err.message, "already quantized"));
    model_free(&m);
}

static void test_spec_parsing(void** state) {
    (void)state;
    model_quant_spec s;
    error_info err = {{0}};
    assert_int_equal(model_quant_spec_parse("w4a16:g32:gptq", &s, &err), 0);
    assert_int_equal(s.scheme, QUANT_W4A16);
    assert_int_equal(s.group_size, 32);
    assert_int_equal(s.method, QUANT_GPTQ);
    assert_false(s.symmetric);
    assert_int_equal(model_quant_spec_parse("w8a16", &s, &err), 0);
    assert_int_equal(s.group_size, 0);
    assert_false(s.symmetric);
    assert_int_equal(model_quant_spec_parse("w8a8", &s, &err), 0);
    assert_true(s.symmetric);
    assert_int_equal(model_quant_spec_parse("w3a16", &s, &err), -1);
    assert_non_null(strstr(err.message, "expected w8a16, w4a16 or w8a8"));
    assert_int_equal(model_quant_spec_parse("w4a16:gx", &s, &err), -1);
    assert_int_equal(model_quant_spec_parse("w8a8:asym", &s, &err), -1);
    assert_non_null(strstr(err.message, "symmetric"));
    assert_int_equal(model_quant_spec_parse("w4a16:fast", &s, &err), -1);
    // W4A8: group 32, symmetric by default (llama.cpp's q4_0 layout).
    assert_int_equal(model_quant_spec_parse("w4a8", &s, &err), 0);
    assert_int_equal(s.scheme, QUANT_W4A8);
    assert_int_equal(s.group_size, 32);
    assert_true(s.symmetric);
    assert_int_equal(model_quant_spec_parse("w4a8:g128:sym", &s, &err), 0);
    assert_int_equal(s.group_size, 128);
    assert_int_equal(model_quant_spec_parse("w4a8:asym", &s, &err), -1);
    assert_non_null(strstr(err.message, "symmetric"));
    assert_int_equal(model_quant_spec_parse("w8a8:g32:token", &s, &err), 0);
    assert_true(s.per_token_activations);
    char text[64];
    model_quant_spec_describe(&s, text, sizeof text);
    assert_string_equal(text, "w8a8 g32 rtn sym token");
    assert_int_equal(model_quant_spec_parse("w4a8:token", &s, &err), -1);
    assert_non_null(strstr(err.message, "w8a8"));
}

// What each scheme asks the kernels for, matrix by matrix: W4A8 and grouped
// W8A8 quantize activations in blocks of 32 (or of the group, where 32 does
// not divide it); per-channel or ":token" W8A8 one scale per row. And the
// integer-activation models stay close to their 16-bit-activation twins.
static void test_w4a8_and_grouped_w8a8(void** state) {
    (void)state;
    static const struct {
        const char* spec;
        weight_dtype dtype;
        int group_size, activation_block; // of wq (64 columns)
    } cases[] = {
        {"w4a8:g32", WEIGHT_I4, 32, 32}, {"w4a8:g64", WEIGHT_I4, 0, 32}, // g64 = all 64 columns: per channel
        {"w4a8:g16", WEIGHT_I4, 16, 16}, {"w8a8:g32", WEIGHT_I8, 32, 32},
        {"w8a8:g32:token", WEIGHT_I8, 32, 0}, {"w8a8", WEIGHT_I8, 0, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        model m;
        load_stories(&m);
        model_quant_spec spec;
        error_info err = {{0}};
        assert_int_equal(model_quant_spec_parse(cases[k].spec, &spec, &err), 0);
        assert_int_equal(model_quantize(&m, &spec, NULL, NULL, 0, NULL, NULL, &err), 0);
        const weight_matrix* wq = &m.layers[0].wq;
        assert_int_equal(wq->dtype, cases[k].dtype);
        assert_int_equal(wq->activation_bits, 8);
        assert_int_equal(wq->group_size, cases[k].group_size ? cases[k].group_size : wq->cols);
        assert_int_equal(wq->activation_block, cases[k].activation_block);
        assert_null(wq->zero_points);
        // w2 has 172 columns: no group of these divides them, so per channel,
        // and W4A8's activation block is then the whole row.
        const weight_matrix* w2 = &m.layers[0].w2;
        assert_int_equal(w2->group_size, 172);
        assert_int_equal(w2->activation_block,
                         cases[k].dtype == WEIGHT_I4 ? (w2->group_size % 32 == 0 ? 32 : w2->group_size) : 0);
        model_free(&m);
    }
    model_comparison w4a8 = quantize_and_compare("w4a8:g32", NULL, NULL);
    model_comparison w4a16 = quantize_and_compare("w4a16:g32:sym", NULL, NULL);
    model_comparison w8a8 = quantize_and_compare("w8a8:g32", NULL, NULL);
    // g32 symmetric 4-bit keeps 46.7% of the top-1 on this random model
    // (its 16-bit-activation twin 46.5%; stories260K's trained weights kept
    // over half): the claim is that int8 activations cost little beside it.
    assert_true(w4a8.top1_agreement > 0.4);
    assert_true(w4a8.top1_agreement > w4a16.top1_agreement - 0.05);
    assert_true(w4a8.kl_mean < 2 * w4a16.kl_mean + 0.01);
    assert_true(w8a8.top1_agreement >= 0.95);
}

// The engine runs a quantized model (W4A16 and W8A8) and an int8 KV cache;
// greedy decoding with an int8 cache stays close to the fp32 cache.
static void test_engine_runs_quantized_model_and_int8_kv(void** state) {
    (void)state;
    model m;
    load_stories(&m);
    golden_streams g;
    make_golden_streams(&m, &g);
    int32_t prompt[4] = {TOK_BOS_ID, 300, 400, 100};
    int32_t out[3][100];
    kv_dtype dtypes[3] = {KV_F32, KV_I8, KV_F16};
    for (int d = 0; d < 3; d++) {
        engine_config c = engine_config_default();
        c.kv_dtype = dtypes[d];
        c.num_blocks = 64;
        engine e;
        error_info err = {{0}};
        assert_int_equal(engine_init(&e, &m, &c, &err), 0);
        if (dtypes[d] == KV_I8) // elements + one fp32 scale per token and KV head
            assert_int_equal(kv_memory_bytes(&e.pool.memory), 2ull * 64 * 16 * 5 * (4 * 8 * 1 + 4 * 4));
        request_params p = {prompt, 4, 100, 1, 0.0f, 0.0f, 0, 0.0, true};
        assert_int_equal(engine_add_request(&e, &p, NULL, &err), 0);
        while (engine_has_work(&e)) {
            const step_record* r;
            assert_int_equal(engine_step(&e, &r, &err), 0);
        }
        memcpy(out[d], test_sequence(&e, 0)->tokens + 4, sizeof out[d]);
        engine_free(&e);
    }
    int agree_i8 = 0, agree_f16 = 0;
    for (int i = 0; i < 100; i++) {
        agree_i8 += out[1][i] == out[0][i];
        agree_f16 += out[2][i] == out[0][i];
    }
    print_message("greedy tokens equal to the fp32-KV run: int8 KV %d/100, fp16 KV %d/100\n", agree_i8, agree_f16);
    assert_memory_equal(out[0], g.tokens[0] + 4, sizeof out[0]); // fp32 KV: the greedy stream exactly
    assert_true(agree_i8 >= 20); // the first tokens at least; drift after a flip is expected
    // Quantized models through the engine.
    const char* specs[2] = {"w4a16:g16", "w8a8"};
    for (int k = 0; k < 2; k++) {
        model q;
        load_stories(&q);
        model_quant_spec spec;
        error_info err = {{0}};
        assert_int_equal(model_quant_spec_parse(specs[k], &spec, &err), 0);
        assert_int_equal(model_quantize(&q, &spec, NULL, NULL, 0, NULL, NULL, &err), 0);
        engine_config c = engine_config_default();
        engine e;
        assert_int_equal(engine_init(&e, &q, &c, &err), 0);
        request_params p = {prompt, 4, 40, 1, 0.8f, 0.9f, 3, 0.0, true};
        assert_int_equal(engine_add_request(&e, &p, NULL, &err), 0);
        uint64_t weight_bytes = 0;
        while (engine_has_work(&e)) {
            const step_record* r;
            assert_int_equal(engine_step(&e, &r, &err), 0);
            if (r->decode_tokens > 0 && r->prefill_tokens == 0) weight_bytes = r->traffic.weight_bytes_read;
        }
        assert_int_equal(test_sequence(&e, 0)->n_tokens, 44);
        // A decode step streams the packed matrices (not fp32 ones).
        assert_int_equal(weight_bytes, model_decode_weight_bytes(&q));
        engine_free(&e);
        model_free(&q);
    }
    model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_parsing),
        cmocka_unit_test(test_w4a8_and_grouped_w8a8),
        cmocka_unit_test(test_w8a16_keeps_top1_above_99_percent),
        cmocka_unit_test(test_w4a16_g32_is_reported),
        cmocka_unit_test(test_methods_and_schemes_all_run),
        cmocka_unit_test(test_packed_bytes_exact_and_no_fp_copy),
        cmocka_unit_test(test_engine_runs_quantized_model_and_int8_kv),
    };
    return cmocka_run_group_tests_name("engine/model_quant", tests, NULL, NULL);
}
