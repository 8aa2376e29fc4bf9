// Drills: the model shapes are the published ones, and every generator's
// answer equals an independent computation from the inputs it drew, over
// many random draws (the speculative ones, with their usual mistakes graded
// wrong); the quantization drills agree with engine/quant.h and
// their worked answers use the s it uses; the decode-time drill counts the
// weight bytes the engine's kernels count for a decode token.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/devices.h"
#include "engine/engine.h"
#include "engine/model_quant.h"
#include "engine/model_synth.h"
#include "engine/quant.h"
#include "lab/cmd/commands.h"
#include "lab/quiz/drills.h"
#include "tests/test_support.h"

enum { DRAWS = 400 };

static quiz_model_list load_models(void) {
    quiz_model_list list;
    error_info err = {{0}};
    if (quiz_models_load("quiz/models.lua", &list, &err)) fail_msg("%s", err.message);
    return list;
}

static const quiz_model* find_model(const quiz_model_list* list, const char* name) {
    for (int i = 0; i < list->n_models; i++)
        if (strcmp(list->models[i].name, name) == 0) return &list->models[i];
    fail_msg("model %s is not in quiz/models.lua", name);
    return NULL;
}

static void test_models_match_published_sizes(void** state) {
    (void)state;
    quiz_model_list list = load_models();
    // Parameter totals as published on each model card / safetensors index.
    static const struct {
        const char* name;
        double params;
    } PUBLISHED[] = {
        {"Llama-2-7B", 6738415616.0}, {"Llama-2-13B", 13015864320.0}, {"Llama-2-70B", 68976648192.0},
        {"Llama-3-8B", 8030261248.0}, {"Mistral-7B", 7241732096.0},   {"Qwen2.5-7B", 7615616512.0},
    };
    for (size_t i = 0; i < sizeof PUBLISHED / sizeof PUBLISHED[0]; i++) {
        const quiz_model* m = find_model(&list, PUBLISHED[i].name);
        double params = (double)quiz_model_params(m);
        // Qwen2.5's q/k/v biases (0.002%) are left out; the rest is exact.
        if (fabs(params - PUBLISHED[i].params) > 1e-3 * PUBLISHED[i].params)
            fail_msg("%s: %.0f parameters from the shape, published %.0f", m->name, params, PUBLISHED[i].params);
    }
    // Well-known KV bytes per token in FP16: 512 KiB (Llama-2-7B, no GQA),
    // 320 KiB (Llama-2-70B, 8 KV heads), 128 KiB (Llama-3-8B), 56 KiB (Qwen2.5-7B).
    assert_int_equal(quiz_model_kv_bytes_per_token(find_model(&list, "Llama-2-7B"), true, 2), 512 * 1024);
    assert_int_equal(quiz_model_kv_bytes_per_token(find_model(&list, "Llama-2-70B"), true, 2), 320 * 1024);
    assert_int_equal(quiz_model_kv_bytes_per_token(find_model(&list, "Llama-2-70B"), false, 2), 2560 * 1024);
    assert_int_equal(quiz_model_kv_bytes_per_token(find_model(&list, "Llama-3-8B"), true, 2), 128 * 1024);
    assert_int_equal(quiz_model_kv_bytes_per_token(find_model(&list, "Qwen2.5-7B"), true, 2), 56 * 1024);
    quiz_models_free(&list);
}

static void test_bad_model_file(void** state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/bad_models.lua", test_scratch_dir());
    const char* text = "return { { name = 'M', n_layers = 2, d_model = 64, n_heads = 4, n_kv_heads = 3, head_dim = 16, "
                       "vocab_size = 10, intermediate_size = 8, tied_embeddings = false, "
                       "max_position_embeddings = 4096 } }";
    assert_true(test_write_file(path, text, strlen(text)));
    quiz_model_list list;
    error_info err = {{0}};
    assert_int_equal(quiz_models_load(path, &list, &err), -1);
    assert_non_null(strstr(err.message, "n_kv_heads 3 does not divide n_heads 4"));
    text = "return { { name = 'M', n_layers = 2.5 } }";
    assert_true(test_write_file(path, text, strlen(text)));
    assert_int_equal(quiz_models_load(path, &list, &err), -1);
    assert_non_null(strstr(err.message, "field 'n_layers': expected a whole number"));
    // A context shorter than the shortest S a drill asks about.
    text = "return { { name = 'M', n_layers = 2, d_model = 64, n_heads = 4, n_kv_heads = 2, head_dim = 16, "
           "vocab_size = 10, intermediate_size = 8, tied_embeddings = false, max_position_embeddings = 256 } }";
    assert_true(test_write_file(path, text, strlen(text)));
    assert_int_equal(quiz_models_load(path, &list, &err), -1);
    assert_non_null(strstr(err.message, "model M: field 'max_position_embeddings': expected at least 512 tokens"));
}

// ---- independent computations, from the drawn inputs only ------------------------------

// The parameter count written out again, matrix by matrix.
static double params_of(const quiz_model* m) {
    double d = m->d_model, h = m->n_heads * (double)m->head_dim, kv = m->n_kv_heads * (double)m->head_dim;
    double layer = d * h /*wq*/ + d * kv /*wk*/ + d * kv /*wv*/ + h * d /*wo*/ + 3.0 * d * m->intermediate_size + 2 * d;
    return m->vocab_size * d * (m->tied_embeddings ? 1 : 2) + m->n_layers * layer + d;
}

static double bytes_in_format(double n, const quiz_drill_inputs* in) {
    return in->format == QUIZ_WEIGHTS_FP16   ? 2 * n
           : in->format == QUIZ_WEIGHTS_INT8 ? n + 2 * n / in->group_size
                                             : n / 2 + 2 * n / in->group_size;
}

// Each device's memory as the card holds it, in binary units (nvidia-smi
// shows 81920 MiB on an A100 80GB; the L4's 24 GiB are 22.5 with ECC on),
// in device_models() order: A100, H100, H200, L4, RTX 4090.
static double memory_bytes(int device) {
    static const double GIB[] = {80, 80, 141, 24, 24};
    int n_devices = 0;
    device_models(&n_devices);
    assert_int_equal(n_devices, (int)(sizeof GIB / sizeof GIB[0]));
    return GIB[device] * 1024.0 * 1024.0 * 1024.0;
}

static double expected_answer(const quiz_drill* d, const quiz_model_list* models) {
    const quiz_drill_inputs* in = &d->in;
    const quiz_model* m = in->model >= 0 ? &models->models[in->model] : NULL;
    int n_devices = 0;
    const device_model* devices = device_models(&n_devices);
    switch (d->kind) {
    case QUIZ_DRILL_KV_SIZE: {
        double heads = in->grouped_query ? m->n_kv_heads : m->n_heads;
        // INT8 stores a 4-byte fp32 scale per token, layer, K/V and head (engine/kv_memory.h).
        double per_head = m->head_dim * (double)in->bytes_per_value + (in->bytes_per_value == 1 ? 4.0 : 0.0);
        return 2.0 * in->batch * in->seq_len * m->n_layers * heads * per_head;
    }
    case QUIZ_DRILL_BLOCKS_NEEDED:
    case QUIZ_DRILL_TAIL_WASTE: {
        double blocks = 0, empty = 0;
        for (int i = 0; i < in->n_lengths; i++) {
            double n = ceil((double)in->lengths[i] / in->block_size);
            blocks += n;
            empty += n * in->block_size - in->lengths[i];
        }
        return d->kind == QUIZ_DRILL_BLOCKS_NEEDED ? blocks : empty;
    }
    case QUIZ_DRILL_SEQUENCES_FIT: {
        double free_bytes = memory_bytes(in->device) - 2.0 * params_of(m);
        double per_sequence = 2.0 * m->n_layers * m->n_kv_heads * m->head_dim * 2.0 * in->seq_len;
        return floor(free_bytes / per_sequence);
    }
    case QUIZ_DRILL_STEP_RATIO: return (pow(2, in->bits) - 1) / (pow(2, in->low_bits) - 1);
    case QUIZ_DRILL_WEIGHT_BYTES: return bytes_in_format(params_of(m), in);
    case QUIZ_DRILL_DECODE_TIME: {
        // What a decode token reads: the layer matrices and the output matrix,
        // one embedding row, and the norm gains in fp32 (as engine/model.c counts).
        double dm = m->d_model, h = m->n_heads * (double)m->head_dim, kv = m->n_kv_heads * (double)m->head_dim;
        double layer_matrices = m->n_layers * (2 * dm * h + 2 * dm * kv + 3.0 * dm * m->intermediate_size);
        double output_matrix = (double)m->vocab_size * dm, embedding_row = dm;
        double norms = (2.0 * m->n_layers + 1) * dm;
        double bytes = bytes_in_format(layer_matrices + output_matrix + embedding_row, in) + 4 * norms;
        return bytes / devices[in->device].bandwidth_bytes_per_s * 1000.0;
    }
    case QUIZ_DRILL_SPEC_TOKENS:
    case QUIZ_DRILL_SPEC_SPEEDUP: {
        // Expected tokens per target pass, summed over how many drafts are
        // accepted: j = 0..k-1 accepted then a rejection (chance a^j (1 - a))
        // gives j + 1 tokens; all k accepted (a^k) gives k + 1.
        double a = in->acceptance, tokens = pow(a, in->draft_tokens) * (in->draft_tokens + 1);
        for (int j = 0; j < in->draft_tokens; j++)
            tokens += pow(a, j) * (1 - a) * (j + 1);
        if (d->kind == QUIZ_DRILL_SPEC_TOKENS) return tokens;
        return tokens / (1 + in->draft_tokens * in->draft_cost_ratio);
    }
    default: {               // quantization by hand, exact decimal arithmetic
        if (in->symmetric) { // codes -(2^(b-1)-1) .. 2^(b-1)-1, z = 0
            double code_max = pow(2, in->bits - 1) - 1;
            double s = fmax(fabs((double)in->range_min), fabs((double)in->range_max)) / code_max;
            double q = fmin(fmax(round((double)in->value / s), -code_max), code_max);
            if (d->kind == QUIZ_DRILL_QUANT_SCALE) return s;
            if (d->kind == QUIZ_DRILL_QUANT_ZERO_POINT) return 0;
            if (d->kind == QUIZ_DRILL_QUANT_CODE) return q;
            return s * q;
        }
        double levels = pow(2, in->bits) - 1;
        double s = ((double)in->range_max - (double)in->range_min) / levels;
        double z = round(-(double)in->range_min / s);
        double q = fmin(fmax(round((double)in->value / s) + z, 0), levels);
        if (d->kind == QUIZ_DRILL_QUANT_SCALE) return s;
        if (d->kind == QUIZ_DRILL_QUANT_ZERO_POINT) return z;
        if (d->kind == QUIZ_DRILL_QUANT_CODE) return q;
        return s * (q - z);
    }
    }
}

static void test_each_generator_matches_an_independent_computation(void** state) {
    (void)state;
    quiz_model_list models = load_models();
    for (int kind = 0; kind < QUIZ_DRILL_COUNT; kind++) {
        int gqa_with = 0, gqa_without = 0, zero_waste = 0, clipped = 0, distinct = 0, symmetric = 0;
        double previous = -1;
        for (int draw = 0; draw < DRAWS; draw++) {
            quiz_rng rng;
            quiz_rng_seed(&rng, (uint64_t)draw * 7919u + (uint64_t)kind);
            quiz_drill d;
            error_info err = {{0}};
            if (quiz_drill_generate((quiz_drill_kind)kind, &models, &rng, &d, &err)) fail_msg("%s", err.message);
            double expected = expected_answer(&d, &models);
            double got = d.answer.value;
            // Counts and codes exactly; sizes and times to 1e-9; s and r_hat
            // within the fp16 rounding the engine applies to s (2^-11).
            double allowed = 1e-9 * fabs(expected);
            if (kind == QUIZ_DRILL_QUANT_SCALE || kind == QUIZ_DRILL_QUANT_RHAT) allowed = 1e-3 * fabs(expected) + 1e-6;
            if (fabs(got - expected) > allowed)
                fail_msg("%s draw %d: generator %.10g, independent %.10g\n%s", quiz_drill_id((quiz_drill_kind)kind),
                         draw, got, expected, d.prompt);
            // The answer as the student would type it is graded right, in the unit asked.
            char typed[64];
            double factor = d.answer.unit[0] ? quiz_unit_factor(d.answer.unit, NULL) : 1.0;
            snprintf(typed, sizeof typed, "%.6g %s", expected / factor, d.answer.unit);
            quiz_numeric_verdict verdict;
            assert_int_equal(quiz_check_numeric(&d.answer, typed, &verdict, &err), 0);
            if (!verdict.correct)
                fail_msg("%s: '%s' graded wrong: %s", quiz_drill_id((quiz_drill_kind)kind), typed, verdict.feedback);
            assert_true(strlen(d.prompt) > 40 && strlen(d.explanation) > 20);
            gqa_with += d.in.grouped_query && d.in.model >= 0 &&
                        models.models[d.in.model].n_kv_heads < models.models[d.in.model].n_heads;
            gqa_without += kind == QUIZ_DRILL_KV_SIZE && !d.in.grouped_query;
            zero_waste += kind == QUIZ_DRILL_TAIL_WASTE && expected == 0;
            clipped += d.in.bits && d.in.range_max > d.in.range_min &&
                       (d.in.value < d.in.range_min || d.in.value > d.in.range_max);
            distinct += got != previous;
            symmetric += d.in.symmetric;
            previous = got;
        }
        // Fresh numbers each time, and the interesting cases do come up.
        if (kind != QUIZ_DRILL_STEP_RATIO && kind != QUIZ_DRILL_QUANT_ZERO_POINT) assert_true(distinct > DRAWS / 4);
        if (kind == QUIZ_DRILL_KV_SIZE) assert_true(gqa_with > 20 && gqa_without > 20);
        if (kind == QUIZ_DRILL_TAIL_WASTE) assert_true(zero_waste > 0);
        if (kind == QUIZ_DRILL_QUANT_CODE) assert_true(clipped > 20);
        // Symmetric and asymmetric drills both come up (the zero point only asymmetric: z = 0 otherwise).
        if (kind >= QUIZ_DRILL_QUANT_SCALE && kind <= QUIZ_DRILL_QUANT_RHAT && kind != QUIZ_DRILL_QUANT_ZERO_POINT)
            assert_true(symmetric > DRAWS / 5 && symmetric < DRAWS / 2);
        if (kind == QUIZ_DRILL_QUANT_ZERO_POINT) assert_int_equal(symmetric, 0);
    }
    quiz_models_free(&models);
}

// s, z, q and r_hat of the drills are what engine/quant.h computes.
static void test_quantization_drills_agree_with_the_engine(void** state) {
    (void)state;
    quiz_model_list models = load_models();
    for (int draw = 0; draw < DRAWS; draw++) {
        for (int kind = QUIZ_DRILL_QUANT_SCALE; kind <= QUIZ_DRILL_QUANT_RHAT; kind++) {
            quiz_rng rng;
            quiz_rng_seed(&rng, (uint64_t)draw);
            quiz_drill d;
            error_info err = {{0}};
            assert_int_equal(quiz_drill_generate((quiz_drill_kind)kind, &models, &rng, &d, &err), 0);
            quant_params p = quant_params_for_range(d.in.range_min, d.in.range_max, d.in.bits, d.in.symmetric);
            int32_t q = quant_quantize(d.in.value, &p, d.in.bits, d.in.symmetric, NULL);
            double from_engine[] = {p.scale, p.zero_point, q, quant_dequantize(q, &p)};
            assert_true(d.answer.value == from_engine[kind - QUIZ_DRILL_QUANT_SCALE]);
        }
    }
    quiz_models_free(&models);
}

// Every worked quantization answer takes z, q and r_hat from the FP16 s
// the engine stores (engine/quant.c rounds s up to fp16), and prints that s.
static void test_quantization_worked_answer_uses_the_engines_fp16_scale(void** state) {
    (void)state;
    quiz_model_list models = load_models();
    int asymmetric = 0, symmetric = 0;
    for (int draw = 0; draw < DRAWS; draw++) {
        for (int kind = QUIZ_DRILL_QUANT_SCALE; kind <= QUIZ_DRILL_QUANT_RHAT; kind++) {
            quiz_rng rng;
            quiz_rng_seed(&rng, (uint64_t)draw * 31u + (uint64_t)kind);
            quiz_drill d;
            error_info err = {{0}};
            assert_int_equal(quiz_drill_generate((quiz_drill_kind)kind, &models, &rng, &d, &err), 0);
            quant_params p = quant_params_for_range(d.in.range_min, d.in.range_max, d.in.bits, d.in.symmetric);
            // r / s and -r_min / s as the worked answer rounds them, then the s it names.
            char expected[3][64];
            snprintf(expected[0], sizeof expected[0], "round(%.4f)", (double)d.in.value / (double)p.scale);
            if (d.in.symmetric) {
                snprintf(expected[1], sizeof expected[1], "r_hat = s q = %.6g x", (double)p.scale);
                symmetric++;
            } else {
                snprintf(expected[1], sizeof expected[1], "round(%.4f) = %d", -(double)d.in.range_min / (double)p.scale,
                         p.zero_point);
                asymmetric++;
            }
            snprintf(expected[2], sizeof expected[2], "so s = %.6g from here on", (double)p.scale);
            for (int i = 0; i < 3; i++)
                if (!strstr(d.explanation, expected[i]))
                    fail_msg("%s draw %d: '%s' is not in the worked answer (s in FP16 = %.8g):\n%s",
                             quiz_drill_id((quiz_drill_kind)kind), draw, expected[i], (double)p.scale, d.explanation);
        }
    }
    assert_true(asymmetric > DRAWS && symmetric > DRAWS / 2);
    quiz_models_free(&models);
}

// ---- decode time: the bytes the engine counts ---------------------------------------------

// Weight bytes the kernels counted for one decode step (batch 1) of m.
static uint64_t engine_decode_weight_bytes(model* m) {
    error_info err = {{0}};
    engine_config c = engine_config_default();
    c.n_threads = 1;   // 2 cores shared by every test binary: the counts do not depend on threads
    c.num_blocks = 16; // 256 slots: the 4-token prompt and 3 new tokens fit many times over
    engine e;
    if (engine_init(&e, m, &c, &err)) fail_msg("%s", err.message);
    int32_t prompt[4] = {1, 300, 400, 100};
    request_params p = {prompt, 4, 3, 1, 0.0f, 0.0f, 0, 0.0, true};
    assert_int_equal(engine_add_request(&e, &p, NULL, &err), 0);
    uint64_t decode_bytes = 0;
    while (engine_has_work(&e) && decode_bytes == 0) {
        const step_record* r;
        assert_int_equal(engine_step(&e, &r, &err), 0);
        if (r->prefill_tokens == 0 && r->decode_tokens == 1) decode_bytes = r->traffic.weight_bytes_read;
    }
    engine_free(&e);
    assert_true(decode_bytes > 0);
    // The kernels' tally is the engine's own count of a decode token's bytes.
    assert_int_equal(decode_bytes, model_decode_weight_bytes(m));
    return decode_bytes;
}

static void synthesize_small(model* m) {
    error_info err = {{0}};
    if (model_synthesize(m, "small", 512, MODEL_DTYPE_FP16, SYNTH_DEFAULT_SEED, &err)) fail_msg("%s", err.message);
}

static void quantize(model* m, const char* spec_text) {
    model_quant_spec spec;
    error_info err = {{0}};
    if (model_quant_spec_parse(spec_text, &spec, &err) || model_quantize(m, &spec, NULL, NULL, 0, NULL, NULL, &err))
        fail_msg("%s: %s", spec_text, err.message);
}

// The drill's answer for the small preset's shape, turned back into bytes,
// equals what the engine's kernels counted for a decode token: in FP16,
// INT8 with a scale per 64 and INT4 with a scale per 128 (synthesizing and
// quantizing a preset is most of this test's time, so three of the seven
// format and group pairs the drill draws are measured).
static void test_decode_time_counts_the_bytes_the_engine_reads(void** state) {
    (void)state;
    const synth_preset* preset = synth_find_preset("small");
    assert_non_null(preset);
    const model_config* shape = &preset->shape;
    quiz_model small = {.n_layers = shape->n_layers,
                        .d_model = shape->dim,
                        .n_heads = shape->n_heads,
                        .n_kv_heads = shape->n_kv_heads,
                        .head_dim = shape->dim / shape->n_heads,
                        .vocab_size = 512,
                        .intermediate_size = shape->hidden_dim,
                        .tied_embeddings = true};
    snprintf(small.name, sizeof small.name, "small preset");
    quiz_model_list list = {&small, 1};
    static const struct {
        quiz_weight_format format;
        int group_size;
        const char* spec; // how the engine quantizes the fp16 preset to it (NULL: stays fp16)
    } MEASURED[3] = {{QUIZ_WEIGHTS_FP16, 0, NULL},
                     {QUIZ_WEIGHTS_INT4, 128, "w4a16:g128:rtn:sym"},
                     {QUIZ_WEIGHTS_INT8, 64, "w8a16:g64:rtn:sym"}};
    double engine_bytes[3];
    model m;
    synthesize_small(&m);
    engine_bytes[0] = (double)engine_decode_weight_bytes(&m);
    quantize(&m, MEASURED[1].spec);
    engine_bytes[1] = (double)engine_decode_weight_bytes(&m);
    model_free(&m);
    synthesize_small(&m);
    quantize(&m, MEASURED[2].spec);
    engine_bytes[2] = (double)engine_decode_weight_bytes(&m);
    model_free(&m);
    int n_devices = 0;
    const device_model* devices = device_models(&n_devices);
    int compared[3] = {0};
    for (int draw = 0; draw < 2000; draw++) {
        quiz_rng rng;
        quiz_rng_seed(&rng, (uint64_t)draw);
        quiz_drill d;
        error_info err = {{0}};
        assert_int_equal(quiz_drill_generate(QUIZ_DRILL_DECODE_TIME, &list, &rng, &d, &err), 0);
        for (int k = 0; k < 3; k++) {
            if (d.in.format != MEASURED[k].format || d.in.group_size != MEASURED[k].group_size) continue;
            double drill_bytes = d.answer.value / 1e3 * devices[d.in.device].bandwidth_bytes_per_s;
            if (fabs(drill_bytes - engine_bytes[k]) > 1e-9 * engine_bytes[k])
                fail_msg("%s\nthe drill counts %.0f bytes per token, the engine's kernels %.0f\n%s", d.prompt,
                         drill_bytes, engine_bytes[k], d.explanation);
            quiz_decode_weights counted = quiz_decode_weight_bytes(&small, d.in.format, d.in.group_size);
            assert_true(counted.total_bytes == engine_bytes[k]);
            compared[k]++;
        }
    }
    for (int k = 0; k < 3; k++)
        assert_true(compared[k] > 10);
}

// Qwen2.5-7B, INT4 with an FP16 scale per 128 weights, on an H200, by hand:
//   layer matrices  28 x (2 x 3584 x 3584 + 2 x 3584 x 512 + 3 x 3584 x 18944) = 6525288448
//   output matrix   152064 x 3584                                               =  544997376
//   embedding       one row: 3584 (not the table: 545M weights)
//   matrices read   7070289408 weights x (4 / 8 + 2 / 128) bytes               = 3645617976
//   norm gains      (2 x 28 + 1) x 3584 = 204288, fp32 in the engine: x 4      =     817152
//   total 3646435128 bytes / 4.8e12 B/s = 0.7597 ms. Counting the whole
//   table (all 7615487488 weights x 0.515625) gives 3926735736 bytes,
//   0.8181 ms: 7.7% more, outside the drill's 1% tolerance.
static void test_decode_time_of_qwen_int4_on_h200_by_hand(void** state) {
    (void)state;
    quiz_model_list models = load_models();
    const quiz_model* qwen = find_model(&models, "Qwen2.5-7B");
    quiz_model_list only_qwen = {(quiz_model*)qwen, 1};
    int n_devices = 0;
    const device_model* devices = device_models(&n_devices);
    const double by_hand_bytes = 3646435128.0, by_hand_ms = by_hand_bytes / 4.8e12 * 1e3;
    bool found = false;
    for (int draw = 0; draw < 5000 && !found; draw++) {
        quiz_rng rng;
        quiz_rng_seed(&rng, (uint64_t)draw);
        quiz_drill d;
        error_info err = {{0}};
        assert_int_equal(quiz_drill_generate(QUIZ_DRILL_DECODE_TIME, &only_qwen, &rng, &d, &err), 0);
        if (d.in.format != QUIZ_WEIGHTS_INT4 || d.in.group_size != 128 || !strstr(devices[d.in.device].name, "H200"))
            continue;
        found = true;
        if (fabs(d.answer.value - by_hand_ms) > 1e-9 * by_hand_ms)
            fail_msg("drill %.6f ms, by hand %.6f ms\n%s", d.answer.value, by_hand_ms, d.explanation);
        assert_non_null(strstr(d.explanation, "3646435128"));
        assert_non_null(strstr(d.explanation, "= 0.7597 ms"));
        quiz_numeric_verdict verdict;
        assert_int_equal(quiz_check_numeric(&d.answer, "0.7597 ms", &verdict, &err), 0);
        assert_true(verdict.correct);
        assert_int_equal(quiz_check_numeric(&d.answer, "0.8181 ms", &verdict, &err), 0); // the whole table
        assert_false(verdict.correct);
    }
    assert_true(found);
    quiz_decode_weights counted = quiz_decode_weight_bytes(qwen, QUIZ_WEIGHTS_INT4, 128);
    assert_true(counted.matrix_weights == 7070289408u && counted.norm_weights == 204288u);
    assert_true(counted.total_bytes == by_hand_bytes);
    quiz_models_free(&models);
}

// ---- the model's context -------------------------------------------------------------------

// No drill of any family asks about a sequence longer than the model's
// context (Llama-2: 4096; the drills once drew 8192 and 16384 for it), and
// the families that draw S do reach the longest S each model allows.
static void test_no_drill_goes_past_the_context(void** state) {
    (void)state;
    quiz_model_list models = load_models();
    for (int i = 0; i < models.n_models; i++) {
        const quiz_model* m = &models.models[i];
        quiz_model_list one = {(quiz_model*)m, 1};
        for (int kind = 0; kind < QUIZ_DRILL_COUNT; kind++) {
            int longest = 0;
            for (int draw = 0; draw < DRAWS; draw++) {
                quiz_rng rng;
                quiz_rng_seed(&rng, (uint64_t)draw * 104729u + (uint64_t)kind);
                quiz_drill d;
                error_info err = {{0}};
                if (quiz_drill_generate((quiz_drill_kind)kind, &one, &rng, &d, &err)) fail_msg("%s", err.message);
                if (d.in.seq_len > m->context_tokens)
                    fail_msg("%s on %s: S = %d, past its context of %d tokens\n%s",
                             quiz_drill_id((quiz_drill_kind)kind), m->name, d.in.seq_len, m->context_tokens, d.prompt);
                if (d.in.seq_len > longest) longest = d.in.seq_len;
            }
            // kv-size draws S up to 8192, sequences-fit up to 16384: capped by the context where it is shorter.
            int reach = kind == QUIZ_DRILL_KV_SIZE ? 8192 : kind == QUIZ_DRILL_SEQUENCES_FIT ? 16384 : 0;
            if (reach > m->context_tokens) reach = m->context_tokens;
            if (longest != reach)
                fail_msg("%s on %s: the longest S drawn is %d, expected %d", quiz_drill_id((quiz_drill_kind)kind),
                         m->name, longest, reach);
        }
    }
    quiz_models_free(&models);
}

// ---- memory in GiB, KV in INT8 with its scales --------------------------------------------

// Llama-2-7B on an H100 at S = 4096: (80 x 2^30 - 13476831232) / 2^31 =
// 33.7, so 33 sequences; the decimal 80e9 gave 30, which is now graded wrong.
static void test_sequences_fit_counts_gib(void** state) {
    (void)state;
    quiz_model_list models = load_models();
    quiz_model_list llama = {(quiz_model*)find_model(&models, "Llama-2-7B"), 1};
    bool found = false;
    for (int draw = 0; draw < 5000 && !found; draw++) {
        quiz_rng rng;
        quiz_rng_seed(&rng, (uint64_t)draw);
        quiz_drill d;
        error_info err = {{0}};
        assert_int_equal(quiz_drill_generate(QUIZ_DRILL_SEQUENCES_FIT, &llama, &rng, &d, &err), 0);
        if (d.in.seq_len != 4096 || !strstr(device_models(&(int){0})[d.in.device].name, "H100")) continue;
        found = true;
        assert_true(d.answer.value == 33.0);
        assert_non_null(strstr(d.prompt, "80 GiB of memory (80 x 2^30 bytes)"));
        assert_non_null(strstr(d.explanation, "85899345920"));
        quiz_numeric_verdict verdict;
        assert_int_equal(quiz_check_numeric(&d.answer, "33", &verdict, &err), 0);
        assert_true(verdict.correct);
        assert_int_equal(quiz_check_numeric(&d.answer, "30", &verdict, &err), 0);
        assert_false(verdict.correct);
    }
    assert_true(found);
    quiz_models_free(&models);
}

// Llama-2-7B, INT8 KV: 2 x 32 x 32 x (128 + 4) = 270336 bytes per token,
// the bytes the engine's pool stores; the 262144 of the values alone are
// 3.0% short, outside the drill's 1%.
static void test_int8_kv_counts_the_scales(void** state) {
    (void)state;
    quiz_model_list models = load_models();
    quiz_model_list llama = {(quiz_model*)find_model(&models, "Llama-2-7B"), 1};
    int found = 0;
    for (int draw = 0; draw < 2000; draw++) {
        quiz_rng rng;
        quiz_rng_seed(&rng, (uint64_t)draw);
        quiz_drill d;
        error_info err = {{0}};
        assert_int_equal(quiz_drill_generate(QUIZ_DRILL_KV_SIZE, &llama, &rng, &d, &err), 0);
        if (d.in.bytes_per_value != 1) continue;
        found++;
        double per_token = 270336.0 * d.in.batch * d.in.seq_len;
        assert_true(d.answer.value == per_token);
        assert_non_null(strstr(d.prompt, "one FP32 scale (4 bytes) per token, layer, K/V and head"));
        char typed[64];
        double factor = quiz_unit_factor(d.answer.unit, NULL);
        snprintf(typed, sizeof typed, "%.6g %s", 262144.0 * d.in.batch * d.in.seq_len / factor, d.answer.unit);
        quiz_numeric_verdict verdict;
        assert_int_equal(quiz_check_numeric(&d.answer, typed, &verdict, &err), 0);
        if (verdict.correct) fail_msg("'%s' (no scales) was graded right:\n%s", typed, d.prompt);
    }
    assert_true(found > 20);
    quiz_models_free(&models);
}

// ---- every drill family against servelab calc ---------------------------------------------

// calc's --device words, in device_models() order.
static const char* const DEVICE_KEYS[] = {"A100", "H100", "H200", "L4", "RTX4090"};

// Runs `servelab calc --json ARGUMENTS` in this process (command_calc, its
// stdout sent to a scratch file) and returns its "results" object's value `name`.
static double calc_result(const char* arguments, const char* name) {
    char line[512], path[512];
    snprintf(line, sizeof line, "calc --json %s", arguments);
    char* argv[24];
    int argc = 0;
    for (char* word = strtok(line, " "); word && argc < 23; word = strtok(NULL, " "))
        argv[argc++] = word;
    argv[argc] = NULL;
    snprintf(path, sizeof path, "%s/calc.json", test_scratch_dir());
    fflush(stdout);
    int saved = dup(1), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 1);
    close(fd);
    int status = command_calc(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    char* text = test_read_text(path);
    if (status != 0) fail_msg("servelab calc --json %s: exit %d: %s", arguments, status, text);
    json_error_t error;
    json_t* root = json_loads(text, 0, &error);
    if (!root) fail_msg("servelab calc --json %s: not JSON (%s): %s", arguments, error.text, text);
    json_t* value = json_object_get(json_object_get(root, "results"), name);
    if (!json_is_number(value)) fail_msg("calc %s: results.%s is missing", arguments, name);
    double number = json_number_value(value);
    json_decref(root);
    free(text);
    return number;
}

// A quiz folder for calc with every model of quiz/models.lua and, for each,
// a twin "<name>-MHA" with n_kv_heads = n_heads: the shape the kv-size
// drill asks about when it says "suppose it had no grouped-query attention".
static void write_quiz_dir_with_mha_twins(const quiz_model_list* models, char* dir, size_t capacity) {
    char cwd[512], path[1100], bank[1100];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(dir, capacity, "%s/%s/calc-quiz", cwd, test_scratch_dir());
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/bank.lua", dir);
    snprintf(bank, sizeof bank, "%s/quiz/bank.lua", cwd);
    unlink(path);
    assert_int_equal(symlink(bank, path), 0);
    static char text[16384];
    int used = snprintf(text, sizeof text, "return {\n");
    for (int i = 0; i < models->n_models; i++)
        for (int twin = 0; twin < 2; twin++) {
            const quiz_model* m = &models->models[i];
            used += snprintf(text + used, sizeof text - (size_t)used,
                             "{ name = '%s%s', n_layers = %d, d_model = %d, n_heads = %d, n_kv_heads = %d, "
                             "head_dim = %d, vocab_size = %d, intermediate_size = %d, tied_embeddings = %s, "
                             "max_position_embeddings = %d },\n",
                             m->name, twin ? "-MHA" : "", m->n_layers, m->d_model, m->n_heads,
                             twin ? m->n_heads : m->n_kv_heads, m->head_dim, m->vocab_size, m->intermediate_size,
                             m->tied_embeddings ? "true" : "false", m->context_tokens);
        }
    snprintf(text + used, sizeof text - (size_t)used, "}\n");
    snprintf(path, sizeof path, "%s/models.lua", dir);
    assert_true(test_write_file(path, text, strlen(text)));
}

static const char* weights_argument(const quiz_drill_inputs* in, char* out, size_t capacity) {
    if (in->format == QUIZ_WEIGHTS_FP16)
        snprintf(out, capacity, "fp16");
    else
        snprintf(out, capacity, "%s:g%d", in->format == QUIZ_WEIGHTS_INT8 ? "int8" : "int4", in->group_size);
    return out;
}

// calc's number for the drill, in the drill's units; false for the families
// calc has no line for (blocks and tail waste, quantization codes, step
// ratios: tests above check those against the engine and by hand).
static bool calc_answer(const quiz_drill* d, const quiz_model_list* models, double* out) {
    const quiz_drill_inputs* in = &d->in;
    const char* name = in->model >= 0 ? models->models[in->model].name : "";
    char arguments[256], weights[32];
    switch (d->kind) {
    case QUIZ_DRILL_KV_SIZE: {
        // calc knows fp16 and int8 KV; fp32 (p = 4) is the fp16 bytes twice over.
        snprintf(arguments, sizeof arguments, "--model %s%s --seq %d --batch %d --kv-dtype %s", name,
                 in->grouped_query ? "" : "-MHA", in->seq_len, in->batch, in->bytes_per_value == 1 ? "int8" : "fp16");
        *out = calc_result(arguments, "kv_bytes_batch") * (in->bytes_per_value == 4 ? 2.0 : 1.0);
        return true;
    }
    case QUIZ_DRILL_SEQUENCES_FIT:
        snprintf(arguments, sizeof arguments, "--model %s --device %s --seq %d", name, DEVICE_KEYS[in->device],
                 in->seq_len);
        *out = calc_result(arguments, "sequences_fit_fp16_kv");
        return true;
    case QUIZ_DRILL_DECODE_TIME:
        snprintf(arguments, sizeof arguments, "--model %s --device %s --weights %s", name, DEVICE_KEYS[in->device],
                 weights_argument(in, weights, sizeof weights));
        *out = calc_result(arguments, "decode_s_per_token_batch1_weights") * 1e3; // the drill asks in ms
        return true;
    case QUIZ_DRILL_WEIGHT_BYTES: {
        snprintf(arguments, sizeof arguments, "--model %s --weights %s", name,
                 weights_argument(in, weights, sizeof weights));
        const char* key = in->format == QUIZ_WEIGHTS_FP16   ? "weight_bytes_fp16"
                          : in->format == QUIZ_WEIGHTS_INT8 ? "weight_bytes_int8"
                                                            : "weight_bytes_int4";
        *out = calc_result(arguments, key);
        return true;
    }
    case QUIZ_DRILL_SPEC_TOKENS:
    case QUIZ_DRILL_SPEC_SPEEDUP:
        snprintf(arguments, sizeof arguments, "--acceptance %.2f --draft-tokens %d --draft-cost %.2f", in->acceptance,
                 in->draft_tokens, in->draft_cost_ratio);
        *out =
            calc_result(arguments, d->kind == QUIZ_DRILL_SPEC_TOKENS ? "spec_tokens_per_target_pass" : "spec_speedup");
        return true;
    case QUIZ_DRILL_BLOCKS_NEEDED:
    case QUIZ_DRILL_TAIL_WASTE:
    case QUIZ_DRILL_QUANT_SCALE:
    case QUIZ_DRILL_QUANT_ZERO_POINT:
    case QUIZ_DRILL_QUANT_CODE:
    case QUIZ_DRILL_QUANT_RHAT:
    case QUIZ_DRILL_STEP_RATIO: return false;
    default: fail_msg("drill kind %d: say whether calc can answer it", (int)d->kind); return false;
    }
}

// For every drill family calc answers, every model, and (kv-size) every
// precision with and without grouped-query attention: calc's number is the
// drill's answer within the drill's own tolerance.
static void test_every_drill_family_agrees_with_calc(void** state) {
    (void)state;
    quiz_model_list models = load_models();
    char dir[1024];
    write_quiz_dir_with_mha_twins(&models, dir, sizeof dir);
    setenv("SERVELAB_QUIZ_DIR", dir, 1);
    int compared_families = 0;
    for (int kind = 0; kind < QUIZ_DRILL_COUNT; kind++) {
        bool calc_family = false;
        for (int i = 0; i < models.n_models; i++) {
            quiz_model_list one = {&models.models[i], 1};
            bool mha = models.models[i].n_kv_heads == models.models[i].n_heads;
            // kv-size: p = 1, 2, 4, each grouped and not (a model without GQA has only the first);
            // the others: one draw per model.
            bool seen[5][2] = {{false}};
            int wanted = kind == QUIZ_DRILL_KV_SIZE ? (mha ? 3 : 6) : 1, compared = 0;
            for (int draw = 0; draw < 400 && compared < wanted; draw++) {
                quiz_rng rng;
                quiz_rng_seed(&rng, (uint64_t)draw * 7u + (uint64_t)kind);
                quiz_drill d;
                error_info err = {{0}};
                if (quiz_drill_generate((quiz_drill_kind)kind, &one, &rng, &d, &err)) fail_msg("%s", err.message);
                bool* variant = &seen[d.in.bytes_per_value][d.in.grouped_query];
                if (kind == QUIZ_DRILL_KV_SIZE && *variant) continue;
                double from_calc = 0;
                if (!calc_answer(&d, &one, &from_calc)) break;
                calc_family = true;
                *variant = true;
                compared++;
                double allowed = d.answer.rel_tolerance * fabs(d.answer.value) + d.answer.abs_tolerance;
                if (fabs(from_calc - d.answer.value) > allowed)
                    fail_msg("%s, %s: calc %.10g, the drill %.10g (allowed +-%.3g)\n%s",
                             quiz_drill_id((quiz_drill_kind)kind), models.models[i].name, from_calc, d.answer.value,
                             allowed, d.prompt);
            }
            if (calc_family && compared < wanted)
                fail_msg("%s, %s: %d of %d variants drawn", quiz_drill_id((quiz_drill_kind)kind), models.models[i].name,
                         compared, wanted);
        }
        compared_families += calc_family;
    }
    // kv-size, sequences-fit, decode-time, weight-bytes, spec-tokens-per-pass, spec-speedup
    assert_int_equal(compared_families, 6);
    unsetenv("SERVELAB_QUIZ_DIR");
    quiz_models_free(&models);
}

// ---- speculative decoding ------------------------------------------------------------------

static double grade(const quiz_drill* d, double typed_value) {
    char typed[64];
    snprintf(typed, sizeof typed, "%.3g%s", typed_value, d->answer.unit);
    quiz_numeric_verdict verdict;
    error_info err = {{0}};
    assert_int_equal(quiz_check_numeric(&d->answer, typed, &verdict, &err), 0);
    return verdict.correct;
}

// a = 0.8, k = 4: 1 + 0.8 + 0.64 + 0.512 + 0.4096 = 3.3616 tokens per target
// pass; with c = 0.25 a round costs 2 target passes, 1.6808x. The usual
// mistakes, typed to three digits, are graded wrong on every draw: 1 + k a
// (4.2 here), the sum stopped at a^(k-1) (2.952), the drafted tokens alone
// (2.3616), k + 1 (5), 1 / (1 - a) (5); and for the speedup, the draft's
// cost left out (3.3616), the target pass left out (3.3616), k + 1 draft
// passes (1.494), the linear count (2.1), one draft pass in all (2.689).
static void test_speculative_drills_by_hand_and_mistakes_graded_wrong(void** state) {
    (void)state;
    assert_true(fabs(quiz_spec_tokens_per_target_pass(0.8, 4) - 3.3616) < 1e-12);
    assert_true(fabs(quiz_spec_speedup(0.8, 4, 0.25) - 1.6808) < 1e-12);
    assert_true(quiz_spec_tokens_per_target_pass(1.0, 4) == 5.0); // no 0 / 0 at a = 1
    assert_true(quiz_spec_tokens_per_target_pass(0.0, 4) == 1.0); // nothing accepted: the target's own token
    quiz_model_list models = load_models();
    int slower = 0, faster = 0;
    for (int kind = QUIZ_DRILL_SPEC_TOKENS; kind <= QUIZ_DRILL_SPEC_SPEEDUP; kind++) {
        for (int draw = 0; draw < DRAWS; draw++) {
            quiz_rng rng;
            quiz_rng_seed(&rng, (uint64_t)draw * 613u + (uint64_t)kind);
            quiz_drill d;
            error_info err = {{0}};
            if (quiz_drill_generate((quiz_drill_kind)kind, &models, &rng, &d, &err)) fail_msg("%s", err.message);
            const double a = d.in.acceptance, c = d.in.draft_cost_ratio, k = d.in.draft_tokens;
            assert_true(a >= 0.4 && a <= 0.95 && k >= 2 && k <= 8);
            double geometric = 0;
            for (int i = 0; i <= d.in.draft_tokens; i++)
                geometric += pow(a, i);
            double wrong[5];
            if (kind == QUIZ_DRILL_SPEC_TOKENS) {
                double mistakes[] = {1 + k * a, geometric - pow(a, k), geometric - 1, k + 1, 1 / (1 - a)};
                memcpy(wrong, mistakes, sizeof wrong);
            } else {
                assert_true(c >= 0.02 && c <= 0.6);
                double mistakes[] = {geometric, geometric / (k * c), geometric / ((k + 1) * c + 1),
                                     (1 + k * a) / (k * c + 1), geometric / (c + 1)};
                memcpy(wrong, mistakes, sizeof wrong);
                slower += d.answer.value < 1;
                faster += d.answer.value > 1;
            }
            assert_true(grade(&d, d.answer.value));
            for (int m = 0; m < 5; m++)
                if (grade(&d, wrong[m]))
                    fail_msg("%s draw %d: mistake %d (%.4g) graded right against %.4g\n%s",
                             quiz_drill_id((quiz_drill_kind)kind), draw, m, wrong[m], d.answer.value, d.prompt);
            // The worked answer shows the sum it comes from, with the drawn numbers.
            char sum[64];
            snprintf(sum, sizeof sum, "1 + a + ... + a^%d", d.in.draft_tokens);
            assert_non_null(strstr(d.explanation, sum));
        }
    }
    // Both sides of 1 come up: speculation can lose when the draft is dear and a is low.
    assert_true(slower > DRAWS / 50 && faster > DRAWS / 2);
    quiz_models_free(&models);
}

static void test_same_seed_same_drill(void** state) {
    (void)state;
    quiz_model_list models = load_models();
    for (int kind = 0; kind < QUIZ_DRILL_COUNT; kind++) {
        quiz_rng a, b;
        quiz_rng_seed(&a, 42);
        quiz_rng_seed(&b, 42);
        quiz_drill x, y;
        error_info err = {{0}};
        assert_int_equal(quiz_drill_generate((quiz_drill_kind)kind, &models, &a, &x, &err), 0);
        assert_int_equal(quiz_drill_generate((quiz_drill_kind)kind, &models, &b, &y, &err), 0);
        assert_string_equal(x.prompt, y.prompt);
        assert_true(x.answer.value == y.answer.value);
        assert_int_equal(quiz_drill_parse_id(quiz_drill_id((quiz_drill_kind)kind)), kind);
        assert_true(quiz_drill_topics((quiz_drill_kind)kind) != 0);
    }
    quiz_models_free(&models);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_models_match_published_sizes),
        cmocka_unit_test(test_bad_model_file),
        cmocka_unit_test(test_each_generator_matches_an_independent_computation),
        cmocka_unit_test(test_quantization_drills_agree_with_the_engine),
        cmocka_unit_test(test_quantization_worked_answer_uses_the_engines_fp16_scale),
        cmocka_unit_test(test_decode_time_counts_the_bytes_the_engine_reads),
        cmocka_unit_test(test_decode_time_of_qwen_int4_on_h200_by_hand),
        cmocka_unit_test(test_no_drill_goes_past_the_context),
        cmocka_unit_test(test_sequences_fit_counts_gib),
        cmocka_unit_test(test_int8_kv_counts_the_scales),
        cmocka_unit_test(test_every_drill_family_agrees_with_calc),
        cmocka_unit_test(test_speculative_drills_by_hand_and_mistakes_graded_wrong),
        cmocka_unit_test(test_same_seed_same_drill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
