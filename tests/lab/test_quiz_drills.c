// Drills: the model shapes are the published ones, and every generator's
// answer equals an independent computation from the inputs it drew, over
// many random draws; the quantization drills agree with engine/quant.h.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/devices.h"
#include "engine/quant.h"
#include "lab/quiz_drills.h"
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
                       "vocab_size = 10, intermediate_size = 8, tied_embeddings = false } }";
    assert_true(test_write_file(path, text, strlen(text)));
    quiz_model_list list;
    error_info err = {{0}};
    assert_int_equal(quiz_models_load(path, &list, &err), -1);
    assert_non_null(strstr(err.message, "n_kv_heads 3 does not divide n_heads 4"));
    text = "return { { name = 'M', n_layers = 2.5 } }";
    assert_true(test_write_file(path, text, strlen(text)));
    assert_int_equal(quiz_models_load(path, &list, &err), -1);
    assert_non_null(strstr(err.message, "field 'n_layers': expected a whole number"));
}

// ---- independent computations, from the drawn inputs only ------------------------------

// The parameter count written out again, matrix by matrix.
static double params_of(const quiz_model* m) {
    double d = m->d_model, h = m->n_heads * (double)m->head_dim, kv = m->n_kv_heads * (double)m->head_dim;
    double layer = d * h /*wq*/ + d * kv /*wk*/ + d * kv /*wv*/ + h * d /*wo*/ + 3.0 * d * m->intermediate_size + 2 * d;
    return m->vocab_size * d * (m->tied_embeddings ? 1 : 2) + m->n_layers * layer + d;
}

static double expected_answer(const quiz_drill* d, const quiz_model_list* models) {
    const quiz_drill_inputs* in = &d->in;
    const quiz_model* m = in->model >= 0 ? &models->models[in->model] : NULL;
    int n_devices = 0;
    const device_model* devices = device_models(&n_devices);
    switch (d->kind) {
    case QUIZ_DRILL_KV_SIZE: {
        double width = (in->grouped_query ? m->n_kv_heads * m->head_dim : m->d_model);
        return 2.0 * in->batch * in->seq_len * m->n_layers * width * in->bytes_per_value;
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
        double free_bytes = devices[in->device].capacity_bytes - 2.0 * params_of(m);
        double per_sequence = 2.0 * m->n_layers * m->n_kv_heads * m->head_dim * 2.0 * in->seq_len;
        return floor(free_bytes / per_sequence);
    }
    case QUIZ_DRILL_STEP_RATIO: return (pow(2, in->bits) - 1) / (pow(2, in->low_bits) - 1);
    case QUIZ_DRILL_WEIGHT_BYTES:
    case QUIZ_DRILL_DECODE_TIME: {
        double n = params_of(m);
        double bytes = in->format == QUIZ_WEIGHTS_FP16   ? 2 * n
                       : in->format == QUIZ_WEIGHTS_INT8 ? n + 2 * n / in->group_size
                                                         : n / 2 + 2 * n / in->group_size;
        if (d->kind == QUIZ_DRILL_WEIGHT_BYTES) return bytes;
        return bytes / devices[in->device].bandwidth_bytes_per_s * 1000.0;
    }
    default: { // quantization by hand, exact decimal arithmetic
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
            double engine[] = {p.scale, p.zero_point, q, quant_dequantize(q, &p)};
            assert_true(d.answer.value == engine[kind - QUIZ_DRILL_QUANT_SCALE]);
        }
    }
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
        cmocka_unit_test(test_same_seed_same_drill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
