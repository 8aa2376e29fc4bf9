// servelab calc: its numbers equal the quiz drills' answers for the same
// shape, device and length, the KV bytes per token the engine's pool
// allocates, and a Llama-2-7B / H100 case worked by hand; bad input is one
// line naming it and exit 2; --json parses.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/devices.h"
#include "engine/engine.h"
#include "engine/kv_memory.h"
#include "engine/model_synth.h"
#include "engine/tokenizer.h"
#include "lab/quiz/drills.h"
#include "tests/test_support.h"

// calc's --device words, in device_models() order.
static const char* const DEVICE_KEYS[] = {"A100", "H100", "H200", "L4", "RTX4090"};

static json_t* calc_json(const char* arguments) {
    char command[512];
    snprintf(command, sizeof command, "calc --json %s", arguments);
    command_result r = run_servelab(command);
    if (r.exit_status != 0) fail_msg("servelab %s: exit %d: %s", command, r.exit_status, r.err);
    json_error_t error;
    json_t* root = json_loads(r.out, 0, &error);
    if (!root) fail_msg("servelab %s: not JSON (%s): %s", command, error.text, r.out);
    free_result(&r);
    return root;
}

static double result(json_t* root, const char* name) {
    json_t* value = json_object_get(json_object_get(root, "results"), name);
    if (!json_is_number(value)) fail_msg("results.%s is missing or not a number", name);
    return json_number_value(value);
}

static quiz_model_list load_models(void) {
    quiz_model_list list;
    error_info err = {{0}};
    if (quiz_models_load("quiz/models.lua", &list, &err)) fail_msg("%s", err.message);
    return list;
}

// ---- worked by hand ----------------------------------------------------------------------

static void test_llama2_7b_on_h100_by_hand(void** state) {
    (void)state;
    json_t* root = calc_json("--model Llama-2-7B --device H100 --seq 4096 --batch 1");
    // 2 x 32 layers x (32 x 128) x 2 bytes; int8: 2 x 32 x 4096 x 1 + 2 x 32 x 32 heads x 4-byte scale.
    assert_true(result(root, "kv_bytes_per_token_fp16") == 524288.0);
    assert_true(result(root, "kv_bytes_per_token_int8") == 270336.0);
    assert_true(result(root, "kv_bytes_batch") == 2147483648.0); // 524288 x 4096: 2 GiB a sequence
    // 32000 x 4096 x 2 + 32 x (2 x 4096^2 + 2 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096) + 4096.
    assert_true(result(root, "parameters") == 6738415616.0);
    assert_true(result(root, "weight_bytes_fp16") == 13476831232.0);
    // The H100 holds 80 GiB: floor((80 x 2^30 - 13476831232) / 2147483648) = floor(33.72); int8 KV:
    // / 1107296256 = floor(65.41). (80e9 bytes would give 30 and 60.)
    assert_true(result(root, "sequences_fit_fp16_kv") == 33.0);
    assert_true(result(root, "sequences_fit_int8_kv") == 65.0);
    // Per token: 6738415616 - 32000 x 4096 + 4096 - 65 x 4096 norm gains = 6607081472 fp16 weights,
    // + 266240 x 4 bytes of fp32 norms = 13215227904 bytes; / 3.35e12 B/s = 3.9448 ms.
    assert_true(result(root, "decode_weight_bytes") == 13215227904.0);
    assert_true(fabs(result(root, "decode_s_per_token_batch1_weights") / (13215227904.0 / 3.35e12) - 1) < 1e-9);
    // Ridge: 989e12 / 3.35e12 = 295.2 FLOP/byte; fp16 weights give 1 FLOP per byte per sequence, so B ~ 295.
    double ridge_batch = result(root, "ridge_batch");
    assert_true(ridge_batch > 295.0 && ridge_batch < 296.0);
    json_decref(root);
}

static void test_text_shows_the_formulas_filled_in(void** state) {
    (void)state;
    command_result r = run_servelab("calc --model Llama-2-7B --device H100");
    assert_int_equal(r.exit_status, 0);
    assert_non_null(strstr(r.out, "2 x 32 x 4096 (32 KV heads x 128) x 2"));
    assert_non_null(strstr(r.out, "= 524288 bytes"));
    assert_non_null(strstr(r.out, "floor((85899345920 - 13476831232) / (524288 x 4096))"));
    assert_non_null(strstr(r.out, "= 33 sequences"));
    free_result(&r);
}

// ---- the quiz drills ---------------------------------------------------------------------

// Every drill calc can answer, over many draws: the sequences that fit, the
// batch-1 decode time, the KV size (fp16, grouped-query) and the weight bytes.
static void test_agrees_with_the_quiz_drills(void** state) {
    (void)state;
    quiz_model_list models = load_models();
    quiz_rng rng;
    quiz_rng_seed(&rng, 33);
    error_info err = {{0}};
    char arguments[256];
    for (int draw = 0; draw < 12; draw++) {
        quiz_drill d;
        assert_int_equal(quiz_drill_generate(QUIZ_DRILL_SEQUENCES_FIT, &models, &rng, &d, &err), 0);
        snprintf(arguments, sizeof arguments, "--model %s --device %s --seq %d", models.models[d.in.model].name,
                 DEVICE_KEYS[d.in.device], d.in.seq_len);
        json_t* root = calc_json(arguments);
        if (result(root, "sequences_fit_fp16_kv") != d.answer.value)
            fail_msg("%s: calc %.0f, drill %.0f", arguments, result(root, "sequences_fit_fp16_kv"), d.answer.value);
        json_decref(root);

        assert_int_equal(quiz_drill_generate(QUIZ_DRILL_DECODE_TIME, &models, &rng, &d, &err), 0);
        const char* format = d.in.format == QUIZ_WEIGHTS_FP16   ? "fp16"
                             : d.in.format == QUIZ_WEIGHTS_INT8 ? "int8"
                                                                : "int4";
        if (d.in.format == QUIZ_WEIGHTS_FP16)
            snprintf(arguments, sizeof arguments, "--model %s --device %s --weights fp16",
                     models.models[d.in.model].name, DEVICE_KEYS[d.in.device]);
        else
            snprintf(arguments, sizeof arguments, "--model %s --device %s --weights %s:g%d",
                     models.models[d.in.model].name, DEVICE_KEYS[d.in.device], format, d.in.group_size);
        root = calc_json(arguments);
        double ms = result(root, "decode_s_per_token_batch1_weights") * 1e3;
        if (fabs(ms - d.answer.value) > 1e-9 * d.answer.value)
            fail_msg("%s: calc %.9g ms, drill %.9g ms", arguments, ms, d.answer.value);
        quiz_decode_weights read = quiz_decode_weight_bytes(&models.models[d.in.model], d.in.format, d.in.group_size);
        assert_true(result(root, "decode_weight_bytes") == round(read.total_bytes));
        json_decref(root);

        assert_int_equal(quiz_drill_generate(QUIZ_DRILL_KV_SIZE, &models, &rng, &d, &err), 0);
        if (d.in.grouped_query && d.in.bytes_per_value == 2) {
            snprintf(arguments, sizeof arguments, "--model %s --seq %d --batch %d", models.models[d.in.model].name,
                     d.in.seq_len, d.in.batch);
            root = calc_json(arguments);
            assert_true(result(root, "kv_bytes_batch") == d.answer.value);
            json_decref(root);
        }

        assert_int_equal(quiz_drill_generate(QUIZ_DRILL_WEIGHT_BYTES, &models, &rng, &d, &err), 0);
        if (d.in.format == QUIZ_WEIGHTS_FP16)
            snprintf(arguments, sizeof arguments, "--model %s", models.models[d.in.model].name);
        else
            snprintf(arguments, sizeof arguments, "--model %s --weights %s:g%d", models.models[d.in.model].name,
                     d.in.format == QUIZ_WEIGHTS_INT8 ? "int8" : "int4", d.in.group_size);
        root = calc_json(arguments);
        const char* key = d.in.format == QUIZ_WEIGHTS_FP16   ? "weight_bytes_fp16"
                          : d.in.format == QUIZ_WEIGHTS_INT8 ? "weight_bytes_int8"
                                                             : "weight_bytes_int4";
        if (fabs(result(root, key) - d.answer.value) > 0.5)
            fail_msg("%s: %s calc %.0f, drill %.0f", arguments, key, result(root, key), d.answer.value);
        json_decref(root);
    }
    // And the KV bytes per token, for every shape, equal the quiz's function.
    for (int i = 0; i < models.n_models; i++) {
        snprintf(arguments, sizeof arguments, "--model %s", models.models[i].name);
        json_t* root = calc_json(arguments);
        assert_true(result(root, "kv_bytes_per_token_fp16") ==
                    (double)quiz_model_kv_bytes_per_token(&models.models[i], true, 2));
        json_decref(root);
    }
    quiz_models_free(&models);
}

// ---- the engine's KV pool ----------------------------------------------------------------

// A preset engine with 8 blocks of 16 tokens: the bytes its pool holds,
// divided by its 128 slots, are calc's KV bytes per token (fp16 and int8).
static void test_agrees_with_the_engine_pool(void** state) {
    (void)state;
    const char* presets[] = {"tiny", "small", "small:kv6", "medium"};
    for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++) {
        model m;
        error_info err = {{0}};
        if (model_synthesize(&m, presets[p], TOK_MIN_VOCAB_SIZE, MODEL_DTYPE_DEFAULT, SYNTH_DEFAULT_SEED, &err))
            fail_msg("%s", err.message);
        char arguments[128];
        snprintf(arguments, sizeof arguments, "--model %s", presets[p]);
        json_t* root = calc_json(arguments);
        const kv_dtype dtypes[] = {KV_F16, KV_I8};
        const char* keys[] = {"kv_bytes_per_token_fp16", "kv_bytes_per_token_int8"};
        for (int k = 0; k < 2; k++) {
            engine_config config = engine_config_default();
            config.kv_dtype = dtypes[k];
            config.num_blocks = 8;
            config.block_size = 16;
            config.n_threads = 1;
            engine e;
            if (engine_init(&e, &m, &config, &err)) fail_msg("%s: %s", presets[p], err.message);
            double per_token = (double)kv_memory_bytes(&e.pool.memory) / (8.0 * 16.0);
            if (result(root, keys[k]) != per_token)
                fail_msg("%s %s: calc %.0f, engine pool %.0f", presets[p], keys[k], result(root, keys[k]), per_token);
            engine_free(&e);
        }
        // The weights calc counts for the preset are the engine's decode bytes at fp16 too.
        assert_true(result(root, "decode_weight_bytes") == (double)model_decode_weight_bytes(&m));
        json_decref(root);
        model_free(&m);
    }
}

// A model file: stories260K.bin (5 layers, 4 KV heads of 8), its KV bytes
// per token by hand, and its decode bytes as the engine counts them in fp16.
static void test_a_model_file(void** state) {
    (void)state;
    char path[512], arguments[600];
    REQUIRE_SHARED_MODEL(path, "stories260K.bin");
    snprintf(arguments, sizeof arguments, "--model %s --device L4", path);
    json_t* root = calc_json(arguments);
    assert_true(result(root, "kv_bytes_per_token_fp16") == 2.0 * 5 * 32 * 2);               // 640
    assert_true(result(root, "kv_bytes_per_token_int8") == 2.0 * 5 * 32 + 2.0 * 5 * 4 * 4); // 480
    model m;
    error_info err = {{0}};
    if (model_load(&m, path, MODEL_DTYPE_FP16, &err)) fail_msg("%s", err.message);
    assert_true(result(root, "decode_weight_bytes") == (double)model_decode_weight_bytes(&m));
    model_free(&m);
    json_decref(root);
}

// ---- speculative decoding ------------------------------------------------------------------

// a = 0.8, k = 4, c = 0.25: 1 + 0.8 + 0.64 + 0.512 + 0.4096 = 3.3616 tokens per
// target pass, and a round of 1 + 4 x 0.25 = 2 target passes: 1.6808x. At a = 1
// every draft and the bonus: k + 1; at a = 0 the target's own token only.
// Without --draft-cost, c is a W4A16 g32 draft's decode bytes over fp16 Llama-2-7B's:
// 6607081472 x (4/8 + 2/32) + 4 x 266240 = 3717548288 over 13215227904 = 0.28131.
static void test_speculative_by_hand(void** state) {
    (void)state;
    json_t* root = calc_json("--acceptance 0.8 --draft-tokens 4 --draft-cost 0.25");
    assert_true(fabs(result(root, "spec_tokens_per_target_pass") - 3.3616) < 1e-9);
    assert_true(fabs(result(root, "spec_speedup") - 1.6808) < 1e-9);
    // Weight bytes per token drop by the speedup: 13215227904 / 1.6808.
    assert_true(fabs(result(root, "spec_decode_weight_bytes_per_token") - 13215227904.0 / 1.6808) < 1.0);
    json_decref(root);
    root = calc_json("--acceptance 1 --draft-tokens 3 --draft-cost 0.5");
    assert_true(result(root, "spec_tokens_per_target_pass") == 4.0);
    assert_true(fabs(result(root, "spec_speedup") - 1.6) < 1e-9);
    json_decref(root);
    root = calc_json("--acceptance 0 --draft-tokens 8 --draft-cost 0.1");
    assert_true(result(root, "spec_tokens_per_target_pass") == 1.0);
    assert_true(fabs(result(root, "spec_speedup") - 1.0 / 1.8) < 1e-9); // slower than plain decode
    json_decref(root);
    root = calc_json("--model Llama-2-7B --acceptance 0.8");
    assert_true(fabs(result(root, "spec_draft_cost_ratio") - 3717548288.0 / 13215227904.0) < 1e-9);
    json_decref(root);
    // No --acceptance, no speculative lines.
    root = calc_json("--model Llama-2-7B");
    assert_null(json_object_get(json_object_get(root, "results"), "spec_speedup"));
    json_decref(root);
    command_result r = run_servelab("calc --acceptance 0.05 --draft-tokens 8 --draft-cost 0.3");
    assert_int_equal(r.exit_status, 0);
    assert_non_null(strstr(r.out, "slower than plain decode"));
    free_result(&r);
}

// ---- bad input ---------------------------------------------------------------------------

static void test_bad_input_is_one_line_and_exit_2(void** state) {
    (void)state;
    const struct {
        const char* arguments;
        const char* named;
    } cases[] = {
        {"calc --device B200", "'B200'"},
        {"calc --model Llama-9-1T", "'Llama-9-1T'"},
        {"calc --seq 0", "--seq"},
        {"calc --seq 12x", "--seq"},
        {"calc --batch -3", "--batch"},
        {"calc --kv-dtype fp8", "'fp8'"},
        {"calc --weights int3", "'int3'"},
        {"calc --weights int4:g0", "--weights"},
        {"calc --weights fp16:g32", "'fp16:g32'"},
        {"calc --frobnicate", "'--frobnicate'"},
        {"calc --model", "--model"},
        {"calc --acceptance 1.2", "--acceptance"},
        {"calc --acceptance 0.8 --draft-tokens 0", "--draft-tokens"},
        {"calc --acceptance 0.8 --draft-cost -1", "--draft-cost"},
        {"calc --acceptance 0.8 --draft-weights fp16", "--draft-weights"},
        {"calc --draft-tokens 4", "need --acceptance"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        command_result r = run_servelab(cases[i].arguments);
        if (r.exit_status != 2) fail_msg("%s: exit %d, expected 2 (%s)", cases[i].arguments, r.exit_status, r.err);
        if (!strstr(r.err, cases[i].named))
            fail_msg("%s: stderr does not name %s: %s", cases[i].arguments, cases[i].named, r.err);
        char* newline = strchr(r.err, '\n');
        if (!newline || newline[1] != '\0') fail_msg("%s: not one line: %s", cases[i].arguments, r.err);
        assert_string_equal(r.out, "");
        free_result(&r);
    }
}

static void test_json_parses_with_formulas(void** state) {
    (void)state;
    json_t* root = calc_json("--model small --device machine --kv-dtype int8 --weights int4:g32");
    assert_string_equal(json_string_value(json_object_get(root, "kv_dtype")), "int8");
    assert_int_equal(json_integer_value(json_object_get(root, "group_size")), 32);
    json_t* formulas = json_object_get(root, "formulas");
    assert_true(json_array_size(formulas) >= 8);
    for (size_t i = 0; i < json_array_size(formulas); i++)
        assert_non_null(json_string_value(json_object_get(json_array_get(formulas, i), "formula")));
    // This machine's bandwidth is not modelled: no decode time, a null bandwidth.
    assert_true(json_is_null(json_object_get(json_object_get(root, "device"), "bandwidth_bytes_per_s")));
    assert_null(json_object_get(json_object_get(root, "results"), "decode_s_per_token"));
    json_decref(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2_7b_on_h100_by_hand),
        cmocka_unit_test(test_text_shows_the_formulas_filled_in),
        cmocka_unit_test(test_agrees_with_the_quiz_drills),
        cmocka_unit_test(test_agrees_with_the_engine_pool),
        cmocka_unit_test(test_a_model_file),
        cmocka_unit_test(test_speculative_by_hand),
        cmocka_unit_test(test_bad_input_is_one_line_and_exit_2),
        cmocka_unit_test(test_json_parses_with_formulas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
