// The quantizer: hand-computed s, z, q and r_hat; the error bounds of the
// question bank (half a step, saturation, the 17x INT4 step); granularity,
// symmetric vs asymmetric and clipping on synthetic weights; AWQ and GPTQ
// against RTN on a layer with activation outliers; the packed formats.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "engine/quant.h"
#include "kernels/cpu/fp16.h"
#include "tests/test_support.h"

// ---- a seeded normal generator (splitmix64 + Box-Muller) -----------------------------

typedef struct rng {
    uint64_t state;
} rng;

static uint64_t rng_next(rng* r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in (0, 1].
static double rng_uniform(rng* r) { return ((double)(rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0); }

static float rng_normal(rng* r) {
    double radius = sqrt(-2.0 * log(rng_uniform(r)));
    return (float)(radius * cos(6.283185307179586 * rng_uniform(r)));
}

// Weights shaped like a trained layer's (engine/model_synth.c's recipe):
// w (rows, cols) = N(0, 1/cols) * row gain * column gain, gains e^(0.25 N),
// and 0.5% of the input columns (at least one) scaled 10-20x.
static void fill_outlier_weights(float* w, int rows, int cols, uint64_t seed) {
    rng r = {seed};
    float* row_gain = malloc((size_t)rows * sizeof *row_gain);       // (rows)
    float* column_gain = malloc((size_t)cols * sizeof *column_gain); // (cols)
    assert_non_null(row_gain);
    assert_non_null(column_gain);
    for (int o = 0; o < rows; o++)
        row_gain[o] = expf(0.25f * rng_normal(&r));
    for (int i = 0; i < cols; i++)
        column_gain[i] = expf(0.25f * rng_normal(&r));
    int n_outliers = cols / 200 > 0 ? cols / 200 : 1;
    for (int k = 0; k < n_outliers; k++)
        column_gain[rng_next(&r) % (uint64_t)cols] *= 10.0f + 10.0f * (float)rng_uniform(&r);
    float sigma = 1.0f / sqrtf((float)cols);
    for (int o = 0; o < rows; o++)
        for (int i = 0; i < cols; i++)
            w[(size_t)o * (size_t)cols + (size_t)i] = rng_normal(&r) * sigma * row_gain[o] * column_gain[i];
    free(row_gain);
    free(column_gain);
}

// Activations x (n, cols) as a layer sees them: correlated channels (a
// rank-8 signal shared by all channels plus independent noise, because
// real hidden states are far from independent, and GPTQ works through
// those correlations) with per-channel gains e^(0.3 N), and 4 channels
// 20-50x larger than the rest (the outliers AWQ protects). The channel
// structure belongs to the layer, so it comes from structure_seed; the
// tokens come from sample_seed.
enum { ACTIVATION_RANK = 8 };

static void fill_activations(float* x, int n, int cols, uint64_t structure_seed, uint64_t sample_seed) {
    rng structure = {structure_seed}, samples = {sample_seed};
    float* gain = malloc((size_t)cols * sizeof *gain);                       // (cols)
    float* mixing = malloc((size_t)ACTIVATION_RANK * cols * sizeof *mixing); // (rank, cols)
    assert_non_null(gain);
    assert_non_null(mixing);
    for (int c = 0; c < cols; c++)
        gain[c] = expf(0.3f * rng_normal(&structure));
    for (int k = 0; k < 4; k++)
        gain[rng_next(&structure) % (uint64_t)cols] *= 20.0f + 30.0f * (float)rng_uniform(&structure);
    for (int k = 0; k < ACTIVATION_RANK * cols; k++)
        mixing[k] = rng_normal(&structure) / sqrtf((float)ACTIVATION_RANK);
    for (int s = 0; s < n; s++) {
        float latent[ACTIVATION_RANK];
        for (int k = 0; k < ACTIVATION_RANK; k++)
            latent[k] = rng_normal(&samples);
        for (int c = 0; c < cols; c++) {
            float signal = 0.0f;
            for (int k = 0; k < ACTIVATION_RANK; k++)
                signal += latent[k] * mixing[k * cols + c];
            x[(size_t)s * (size_t)cols + (size_t)c] = (0.9f * signal + 0.3f * rng_normal(&samples)) * gain[c];
        }
    }
    free(gain);
    free(mixing);
}

static quant_scheme scheme_of(int bits, bool symmetric, quant_granularity granularity, int group_size,
                              bool clip_search) {
    quant_scheme s = {bits, symmetric, granularity, group_size, clip_search};
    return s;
}

// RTN of w (rows, cols) under scheme; returns the whole-matrix statistics.
static quant_stats rtn_stats(const float* w, int rows, int cols, const quant_scheme* scheme) {
    size_t count = (size_t)rows * (size_t)cols;
    int32_t* codes = malloc(count * sizeof *codes);
    quant_params* params = malloc((size_t)quant_param_count(rows, cols, scheme) * sizeof *params);
    assert_non_null(codes);
    assert_non_null(params);
    error_info err = {{0}};
    if (quant_matrix_rtn(w, rows, cols, scheme, codes, params, &err)) fail_msg("rtn: %s", err.message);
    quant_stats stats = quant_matrix_stats(w, codes, params, rows, cols, scheme, -1);
    free(codes);
    free(params);
    return stats;
}

// ---- one set of values, by hand ----------------------------------------------------------

static void test_code_ranges(void** state) {
    (void)state;
    assert_int_equal(quant_code_min(8, false), 0);
    assert_int_equal(quant_code_max(8, false), 255);
    assert_int_equal(quant_code_min(8, true), -127);
    assert_int_equal(quant_code_max(8, true), 127);
    assert_int_equal(quant_code_min(4, false), 0);
    assert_int_equal(quant_code_max(4, false), 15);
    assert_int_equal(quant_code_min(4, true), -7);
    assert_int_equal(quant_code_max(4, true), 7);
    assert_int_equal(quant_code_min(2, true), -1);
    assert_int_equal(quant_code_max(2, true), 1);
    assert_int_equal(quant_code_max(2, false), 3);
}

// Asymmetric 4 bits over {-0.5, 0, 0.3, 1.375}:
//   s = (1.375 - (-0.5)) / 15 = 1.875 / 15 = 0.125   (2^-3, exact in fp16)
//   z = round(0.5 / 0.125) = 4
//   q(0.3)   = round(2.4) + 4 = 6,   r_hat = 0.125 (6 - 4) = 0.25, error 0.05
//   q(-0.5)  = round(-4) + 4 = 0,    r_hat = -0.5 (r_min)
//   q(1.375) = round(11) + 4 = 15,   r_hat = 1.375 (r_max)
//   q(0)     = 4 = z,                r_hat = 0 exactly
static void test_asymmetric_by_hand(void** state) {
    (void)state;
    const float values[4] = {-0.5f, 0.0f, 0.3f, 1.375f};
    quant_params p = quant_params_for_values(values, 4, 4, false, false);
    assert_true(p.scale == 0.125f);
    assert_int_equal(p.zero_point, 4);
    assert_true(p.range_min == -0.5f && p.range_max == 1.375f);
    const int32_t expected_q[4] = {0, 4, 6, 15};
    const float expected_r_hat[4] = {-0.5f, 0.0f, 0.25f, 1.375f};
    for (int i = 0; i < 4; i++) {
        bool clipped = true;
        int32_t q = quant_quantize(values[i], &p, 4, false, &clipped);
        assert_int_equal(q, expected_q[i]);
        assert_false(clipped);
        assert_true(quant_dequantize(q, &p) == expected_r_hat[i]);
    }
    quant_stats st = quant_measure(values, 4, &p, 4, false);
    // errors 0, 0, 0.05, 0: mse = 0.05^2 / 4 = 0.000625 (0.3f is not exact, hence the tolerance)
    assert_true(fabs(st.mse - 0.000625) < 1e-9);
    assert_true(fabsf(st.max_abs_error - 0.05f) < 1e-7f);
    assert_true(st.within_half_step);
    assert_int_equal(st.n_clipped, 0);
    assert_int_equal(st.n_values, 4);
    assert_true(st.scale == 0.125f);
    assert_int_equal(st.zero_point, 4);
}

// Symmetric 8 bits over {-0.5, 0.1, 1.984375}:
//   s = max|r| / 127 = 1.984375 / 127 = 1/64 = 0.015625 (exact), z = 0
//   q(0.1) = round(6.4) = 6,        r_hat = 6/64 = 0.09375
//   q(-0.5) = round(-32) = -32,     r_hat = -0.5
//   q(1.984375) = 127,              r_hat = 1.984375
// The range is [-1.984375, 1.984375]: symmetric spends the negative codes
// down to -127 even though the data stops at -0.5.
static void test_symmetric_by_hand(void** state) {
    (void)state;
    const float values[3] = {-0.5f, 0.1f, 1.984375f};
    quant_params p = quant_params_for_values(values, 3, 8, true, false);
    assert_true(p.scale == 0.015625f);
    assert_int_equal(p.zero_point, 0);
    assert_true(p.range_min == -1.984375f && p.range_max == 1.984375f);
    assert_int_equal(quant_quantize(0.1f, &p, 8, true, NULL), 6);
    assert_true(quant_dequantize(6, &p) == 0.09375f);
    assert_int_equal(quant_quantize(-0.5f, &p, 8, true, NULL), -32);
    assert_true(quant_dequantize(-32, &p) == -0.5f);
    assert_int_equal(quant_quantize(1.984375f, &p, 8, true, NULL), 127);
    assert_true(quant_dequantize(127, &p) == 1.984375f);
    assert_int_equal(quant_quantize(0.0f, &p, 8, true, NULL), 0);
    // Far beyond either end: the extreme codes +-127, no wrap-around.
    assert_int_equal(quant_quantize(1e30f, &p, 8, true, NULL), 127);
    assert_int_equal(quant_quantize(-1e30f, &p, 8, true, NULL), -127);
}

// A range whose exact step is not an fp16 value: [-1, 2] at 8 bits.
//   exact s = 3 / 255 = 0.0117647...; fp16 steps there are 2^-17, and
//   3/255 / 2^-17 = 1542.02, so the fp16 neighbours are 1542 * 2^-17 (below)
//   and 1543 * 2^-17 = 0.01177215576171875 (above). s takes the one above, so
//   that the 255 steps still span the whole range.
//   z = round(1 / 0.01177215576) = round(84.946) = 85
//   top level = (255 - 85) s = 2.00126..., bottom = -85 s = -1.00063...
static void test_scale_is_the_fp16_value_at_or_above_the_exact_step(void** state) {
    (void)state;
    quant_params p = quant_params_for_range(-1.0f, 2.0f, 8, false);
    float below = 1542.0f / 131072.0f, above = 1543.0f / 131072.0f;
    assert_true(below < 3.0f / 255.0f && 3.0f / 255.0f < above);
    assert_true(fp16_to_fp32(fp32_to_fp16(above)) == above);
    assert_true(p.scale == above);
    assert_int_equal(p.zero_point, 85);
    // Every value of the range is within half a step of a level, the ends included.
    float values[3001];
    for (int i = 0; i <= 3000; i++)
        values[i] = -1.0f + 3.0f * (float)i / 3000.0f;
    quant_stats st = quant_measure(values, 3001, &p, 8, false);
    assert_true(st.within_half_step);
    assert_int_equal(st.n_clipped, 0);
    assert_true(st.max_abs_error <= 0.5f * p.scale * (1.0f + 1e-5f));
}

// A value exactly between two levels is rounded to one of them and misses
// by exactly s/2, the largest error an in-range value can have.
static void test_halfway_value_has_error_of_half_a_step(void** state) {
    (void)state;
    quant_params p = quant_params_for_range(-0.5f, 1.375f, 4, false); // s = 0.125, z = 4 (as above)
    float s = p.scale;
    float halfway = s * 2.5f; // between the levels s*2 (q = 6) and s*3 (q = 7): 0.3125, exact
    int32_t q = quant_quantize(halfway, &p, 4, false, NULL);
    assert_true(q == 6 || q == 7);
    float error = fabsf(halfway - quant_dequantize(q, &p));
    assert_true(error == s / 2.0f); // 0.0625 exactly
    float negative = -s * 1.5f;     // between -s and -2s
    error = fabsf(negative - quant_dequantize(quant_quantize(negative, &p, 4, false, NULL), &p));
    assert_true(error == s / 2.0f);
    quant_stats st = quant_measure(&halfway, 1, &p, 4, false);
    assert_true(st.max_abs_error == s / 2.0f);
    assert_true(st.within_half_step);
    assert_true(fabs(st.mse - 0.0625 * 0.0625) < 1e-15);
}

// Outside the range, values saturate at the extreme codes instead of
// wrapping: far above r_max -> q = 2^b - 1 and r_hat = r_max; far below
// r_min -> q = 0 and r_hat = s (0 - z) = r_min. Both are counted as clipped.
static void test_far_outside_values_saturate(void** state) {
    (void)state;
    const float data[4] = {-0.5f, 0.0f, 0.3f, 1.375f}; // s = 0.125, z = 4: r_min and r_max are levels
    quant_params p = quant_params_for_values(data, 4, 4, false, false);
    bool clipped = false;
    int32_t q = quant_quantize(1000.0f, &p, 4, false, &clipped);
    assert_int_equal(q, 15);
    assert_true(clipped);
    assert_true(quant_dequantize(q, &p) == p.range_max);
    assert_true(quant_dequantize(q, &p) == 1.375f);
    clipped = false;
    q = quant_quantize(-1000.0f, &p, 4, false, &clipped);
    assert_int_equal(q, 0);
    assert_true(clipped);
    assert_true(quant_dequantize(q, &p) == -0.5f); // s (0 - z) = 0.125 * -4
    // 0.0 maps to z and back to exactly 0.
    q = quant_quantize(0.0f, &p, 4, false, &clipped);
    assert_int_equal(q, p.zero_point);
    assert_false(clipped);
    assert_true(quant_dequantize(q, &p) == 0.0f);
    // The statistics count the two outliers and exclude them from the half-step check.
    const float mixed[5] = {-1000.0f, -0.5f, 0.3125f, 1.375f, 1000.0f};
    quant_stats st = quant_measure(mixed, 5, &p, 4, false);
    assert_int_equal(st.n_clipped, 2);
    assert_true(st.within_half_step);
    assert_true(st.max_abs_error == 1000.0f - 0.5f); // -1000 decodes to -0.5
}

// The question bank: INT4 is not "twice" INT8's error; its step is
// (2^8 - 1) / (2^4 - 1) = 255 / 15 = 17 times larger. The range
// [-1, 2.984375] (length 255/64) makes both steps exact in fp16:
//   INT8: s = (255/64) / 255 = 1/64,   z = 64
//   INT4: s = (255/64) / 15 = 17/64 = 0.265625,   z = round(3.76) = 4
// so the comparison holds exactly after fp16 rounding too.
static void test_int4_step_is_17_times_int8(void** state) {
    (void)state;
    quant_params p8 = quant_params_for_range(-1.0f, 2.984375f, 8, false);
    quant_params p4 = quant_params_for_range(-1.0f, 2.984375f, 4, false);
    assert_true(p8.scale == 1.0f / 64.0f);
    assert_true(p4.scale == 17.0f / 64.0f);
    assert_int_equal(p8.zero_point, 64);
    assert_int_equal(p4.zero_point, 4);
    assert_true(p4.scale == 17.0f * p8.scale);
    // And the error follows: on uniform data the MSE ratio is about 17^2 = 289.
    float values[4096];
    rng r = {11};
    for (int i = 0; i < 4096; i++)
        values[i] = -1.0f + 3.984375f * (float)(rng_uniform(&r) - 1e-9);
    double ratio = quant_measure(values, 4096, &p4, 4, false).mse / quant_measure(values, 4096, &p8, 8, false).mse;
    print_message("INT4 / INT8: step ratio %.1f, MSE ratio %.1f\n", (double)(p4.scale / p8.scale), ratio);
    assert_true(ratio > 200.0 && ratio < 400.0);
}

// All-zero data has no range: s must still be positive and finite, every
// value decodes to exactly 0, and the statistics are finite.
static void test_zero_range_is_guarded(void** state) {
    (void)state;
    const float zeros[8] = {0};
    for (int symmetric = 0; symmetric <= 1; symmetric++)
        for (int clip = 0; clip <= 1; clip++) {
            quant_params p = quant_params_for_values(zeros, 8, 4, symmetric, clip);
            assert_true(p.scale > 0.0f && isfinite(p.scale));
            assert_true(fp16_to_fp32(fp32_to_fp16(p.scale)) == p.scale);
            assert_int_equal(p.zero_point, 0);
            quant_stats st = quant_measure(zeros, 8, &p, 4, symmetric);
            assert_true(st.mse == 0.0);
            assert_true(st.max_abs_error == 0.0f);
            assert_true(st.within_half_step);
            assert_int_equal(st.n_clipped, 0);
        }
    // A range below fp16's smallest step still gets a positive scale.
    const float tiny[2] = {1e-12f, -3e-12f};
    quant_params p = quant_params_for_values(tiny, 2, 8, false, false);
    assert_true(p.scale > 0.0f);
    assert_true(quant_measure(tiny, 2, &p, 8, false).within_half_step);
    // A range beyond fp16 saturates the scale at 65504 and counts what it cannot reach.
    const float huge[2] = {-1e9f, 1e9f};
    p = quant_params_for_values(huge, 2, 4, true, false);
    assert_true(p.scale == 65504.0f);
    assert_int_equal(quant_measure(huge, 2, &p, 4, true).n_clipped, 2);
}

// With min/max ranges every value is within s/2 of its level, for random
// sets at every bit width (this is what rounding s up to fp16 guarantees;
// rounding it to nearest would miss at the range ends for some sets).
static void test_min_max_ranges_keep_every_value_within_half_a_step(void** state) {
    (void)state;
    rng r = {5};
    float values[64];
    for (int trial = 0; trial < 2000; trial++) {
        int bits = 2 + trial % 7;
        bool symmetric = (trial / 7) % 2;
        float offset = (float)rng_uniform(&r) * 2.0f - 0.5f, spread = (float)(rng_uniform(&r) * 3.0);
        for (int i = 0; i < 64; i++)
            values[i] = offset + spread * rng_normal(&r);
        quant_params p = quant_params_for_values(values, 64, bits, symmetric, false);
        assert_true(p.zero_point >= quant_code_min(bits, symmetric) && p.zero_point <= quant_code_max(bits, symmetric));
        quant_stats st = quant_measure(values, 64, &p, bits, symmetric);
        if (!st.within_half_step || st.n_clipped != 0)
            fail_msg("trial %d (bits %d, symmetric %d): max error %g for s = %g", trial, bits, (int)symmetric,
                     (double)st.max_abs_error, (double)p.scale);
        assert_true(quant_dequantize(quant_quantize(0.0f, &p, bits, symmetric, NULL), &p) == 0.0f);
    }
}

// ---- matrices ---------------------------------------------------------------------------

static void test_param_count_and_index(void** state) {
    (void)state;
    quant_scheme tensor = scheme_of(4, false, QUANT_PER_TENSOR, 0, false);
    quant_scheme channel = scheme_of(4, false, QUANT_PER_CHANNEL, 0, false);
    quant_scheme group = scheme_of(4, false, QUANT_PER_GROUP, 32, false);
    assert_int_equal(quant_param_count(6, 128, &tensor), 1);
    assert_int_equal(quant_param_count(6, 128, &channel), 6);
    assert_int_equal(quant_param_count(6, 128, &group), 24);
    assert_int_equal(quant_param_index(5, 127, 6, 128, &tensor), 0);
    assert_int_equal(quant_param_index(5, 127, 6, 128, &channel), 5);
    assert_int_equal(quant_param_index(5, 127, 6, 128, &group), 23); // 5 * 4 + 127 / 32
    assert_int_equal(quant_param_index(2, 32, 6, 128, &group), 9);   // 2 * 4 + 1
}

// The per-set statistics of an RTN matrix are those of quant_measure on the
// set's values, and the whole-matrix mse is the mean over every element.
static void test_matrix_stats_agree_with_measure(void** state) {
    (void)state;
    enum { rows = 8, cols = 96 };
    float w[rows * cols];
    fill_outlier_weights(w, rows, cols, 3);
    quant_scheme scheme = scheme_of(4, false, QUANT_PER_GROUP, 32, false);
    int32_t codes[rows * cols];
    quant_params params[rows * cols / 32];
    float r_hat[rows * cols];
    error_info err = {{0}};
    assert_int_equal(quant_matrix_rtn(w, rows, cols, &scheme, codes, params, &err), 0);
    quant_matrix_dequantize(codes, params, rows, cols, &scheme, r_hat);
    double sum = 0.0;
    for (int k = 0; k < rows * cols; k++)
        sum += ((double)w[k] - (double)r_hat[k]) * ((double)w[k] - (double)r_hat[k]);
    for (int k = 0; k < rows * cols / 32; k++) {
        quant_stats a = quant_matrix_stats(w, codes, params, rows, cols, &scheme, k);
        quant_stats b = quant_measure(w + k * 32, 32, &params[k], 4, false);
        assert_true(a.mse == b.mse);
        assert_true(a.max_abs_error == b.max_abs_error);
        assert_true(a.scale == params[k].scale);
        assert_int_equal(a.zero_point, params[k].zero_point);
        assert_int_equal(a.n_values, 32);
        assert_true(a.within_half_step);
    }
    quant_stats all = quant_matrix_stats(w, codes, params, rows, cols, &scheme, -1);
    assert_int_equal(all.n_values, rows * cols);
    assert_true(fabs(all.mse - sum / (rows * cols)) <= 1e-12 * all.mse);
    assert_true(all.within_half_step);
    assert_int_equal(all.n_clipped, 0);
}

// The question bank: one per-tensor scale bloated by outlier columns wastes
// the 15 steps of INT4 for every other weight; per-channel scales follow
// each row's size, per-group scales confine an outlier to its own group.
static void test_finer_granularity_lowers_the_error(void** state) {
    (void)state;
    enum { rows = 256, cols = 512 };
    float* w = malloc((size_t)rows * cols * sizeof *w);
    assert_non_null(w);
    fill_outlier_weights(w, rows, cols, 2024);
    quant_scheme tensor = scheme_of(4, false, QUANT_PER_TENSOR, 0, false);
    quant_scheme channel = scheme_of(4, false, QUANT_PER_CHANNEL, 0, false);
    quant_scheme group = scheme_of(4, false, QUANT_PER_GROUP, 64, false);
    quant_stats t = rtn_stats(w, rows, cols, &tensor);
    quant_stats c = rtn_stats(w, rows, cols, &channel);
    quant_stats g = rtn_stats(w, rows, cols, &group);
    print_message(
        "INT4 asym (256, 512) with outlier columns: MSE per-tensor %.3e, per-channel %.3e, per-group(64) %.3e\n", t.mse,
        c.mse, g.mse);
    print_message("  mean scale per-tensor %.4g, per-channel %.4g, per-group %.4g\n", (double)t.scale, (double)c.scale,
                  (double)g.scale);
    assert_true(g.mse < c.mse);
    assert_true(c.mse < t.mse);
    assert_true(t.within_half_step && c.within_half_step && g.within_half_step);
    free(w);
}

// The question bank: symmetric is not strictly worse. On zero-centred
// weights it wastes no range (about (15/14)^2 = 1.15x the asymmetric MSE,
// one code fewer); on one-sided data (ReLU outputs) it wastes the negative
// half of its codes, and asymmetric is several times better.
static void test_symmetric_vs_asymmetric(void** state) {
    (void)state;
    enum { rows = 64, cols = 256 };
    float* centred = malloc((size_t)rows * cols * sizeof *centred);
    float* relu = malloc((size_t)rows * cols * sizeof *relu);
    assert_non_null(centred);
    assert_non_null(relu);
    rng r = {77};
    for (int k = 0; k < rows * cols; k++)
        centred[k] = rng_normal(&r) * 0.02f;
    for (int k = 0; k < rows * cols; k++)
        relu[k] = fabsf(rng_normal(&r)); // all >= 0
    quant_scheme sym = scheme_of(4, true, QUANT_PER_CHANNEL, 0, false);
    quant_scheme asym = scheme_of(4, false, QUANT_PER_CHANNEL, 0, false);
    double centred_sym = rtn_stats(centred, rows, cols, &sym).mse,
           centred_asym = rtn_stats(centred, rows, cols, &asym).mse;
    double relu_sym = rtn_stats(relu, rows, cols, &sym).mse, relu_asym = rtn_stats(relu, rows, cols, &asym).mse;
    print_message("INT4 per-channel: zero-centred sym %.3e asym %.3e (x%.2f); one-sided sym %.3e asym %.3e (x%.2f)\n",
                  centred_sym, centred_asym, centred_sym / centred_asym, relu_sym, relu_asym, relu_sym / relu_asym);
    assert_true(centred_sym < 2.0 * centred_asym && centred_asym < 2.0 * centred_sym);
    assert_true(relu_sym > 2.0 * relu_asym);
    free(centred);
    free(relu);
}

// Clipping trades a few saturated outliers for a finer step everywhere
// else; the search keeps min/max when nothing better exists, so it can
// never raise the MSE, and on heavy-tailed data it clips and wins.
static void test_clip_search_never_hurts_and_counts_clips(void** state) {
    (void)state;
    enum { rows = 32, cols = 256 };
    float* heavy = malloc((size_t)rows * cols * sizeof *heavy);
    float* outliers = malloc((size_t)rows * cols * sizeof *outliers);
    assert_non_null(heavy);
    assert_non_null(outliers);
    rng r = {9};
    // Student-t-like tails: a normal divided by the root of a small chi-square.
    for (int k = 0; k < rows * cols; k++) {
        float a = rng_normal(&r), b = rng_normal(&r), c = rng_normal(&r);
        heavy[k] = a / sqrtf((b * b + c * c) / 2.0f + 1e-3f);
    }
    fill_outlier_weights(outliers, rows, cols, 31);
    const float* data[2] = {heavy, outliers};
    const quant_granularity granularities[3] = {QUANT_PER_TENSOR, QUANT_PER_CHANNEL, QUANT_PER_GROUP};
    for (int d = 0; d < 2; d++)
        for (int gi = 0; gi < 3; gi++)
            for (int bits = 3; bits <= 8; bits += 5)
                for (int symmetric = 0; symmetric <= 1; symmetric++) {
                    quant_scheme plain = scheme_of(bits, symmetric, granularities[gi], 64, false);
                    quant_scheme clipped = scheme_of(bits, symmetric, granularities[gi], 64, true);
                    quant_stats a = rtn_stats(data[d], rows, cols, &plain);
                    quant_stats b = rtn_stats(data[d], rows, cols, &clipped);
                    assert_true(b.mse <= a.mse);
                    assert_int_equal(a.n_clipped, 0);
                    if (d == 0 && bits == 3) {
                        assert_true(b.n_clipped > 0);
                        assert_true(b.mse < a.mse);
                    }
                    if (d == 0 && bits == 3 && gi == 1 && !symmetric)
                        print_message("INT3 per-channel heavy tails: MSE min/max %.4e, clipped %.4e (%lld of %lld "
                                      "values clipped)\n",
                                      a.mse, b.mse, (long long)b.n_clipped, (long long)b.n_values);
                }
    free(heavy);
    free(outliers);
}

// ---- AWQ and GPTQ against RTN ------------------------------------------------------------

// ||x w^T - x w_hat^T||^2 / (n rows): the layer's output error (x (n, cols)).
static double output_mse(const float* x, int n, const float* w, const float* w_hat, int rows, int cols) {
    double sum = 0.0;
    for (int s = 0; s < n; s++)
        for (int o = 0; o < rows; o++) {
            double exact = 0.0, approx = 0.0;
            for (int c = 0; c < cols; c++) {
                exact += (double)x[(size_t)s * cols + c] * (double)w[(size_t)o * cols + c];
                approx += (double)x[(size_t)s * cols + c] * (double)w_hat[(size_t)o * cols + c];
            }
            sum += (exact - approx) * (exact - approx);
        }
    return sum / ((double)n * rows);
}

enum { LAYER_ROWS = 128, LAYER_COLS = 256, CALIB_SAMPLES = 256, EVAL_SAMPLES = 256 };

static void test_awq_and_gptq_beat_rtn_on_activation_outliers(void** state) {
    (void)state;
    const int rows = LAYER_ROWS, cols = LAYER_COLS;
    size_t wsize = (size_t)rows * cols;
    float* w = malloc(wsize * sizeof *w);                                    // (rows, cols)
    float* w_hat = malloc(wsize * sizeof *w_hat);                            // (rows, cols)
    float* x_calib = malloc((size_t)CALIB_SAMPLES * cols * sizeof *x_calib); // (n, cols)
    float* x_eval = malloc((size_t)EVAL_SAMPLES * cols * sizeof *x_eval);    // (n, cols)
    int32_t* codes = malloc(wsize * sizeof *codes);
    float scales[LAYER_COLS];
    assert_true(w && w_hat && x_calib && x_eval && codes);
    rng r = {4242};
    for (size_t k = 0; k < wsize; k++)
        w[k] = rng_normal(&r) * 0.0625f;
    fill_activations(x_calib, CALIB_SAMPLES, cols, 100, 1);
    fill_activations(x_eval, EVAL_SAMPLES, cols, 100, 2);
    quant_scheme scheme = scheme_of(4, false, QUANT_PER_GROUP, 64, false);
    quant_params* params = malloc((size_t)quant_param_count(rows, cols, &scheme) * sizeof *params);
    assert_non_null(params);
    error_info err = {{0}};

    // RTN.
    assert_int_equal(quant_matrix_rtn(w, rows, cols, &scheme, codes, params, &err), 0);
    quant_matrix_dequantize(codes, params, rows, cols, &scheme, w_hat);
    double rtn = output_mse(x_eval, EVAL_SAMPLES, w, w_hat, rows, cols);

    // AWQ: quantize W diag(s) and feed it x / s.
    const float* matrices[1] = {w};
    const int matrix_rows[1] = {rows};
    float alpha = -1.0f;
    if (quant_awq_search(matrices, matrix_rows, 1, cols, x_calib, CALIB_SAMPLES, &scheme, scales, &alpha, &err))
        fail_msg("awq: %s", err.message);
    float* w_scaled = malloc(wsize * sizeof *w_scaled);
    float* x_scaled = malloc((size_t)EVAL_SAMPLES * cols * sizeof *x_scaled);
    assert_true(w_scaled && x_scaled);
    for (size_t k = 0; k < wsize; k++)
        w_scaled[k] = w[k] * scales[k % cols];
    for (size_t k = 0; k < (size_t)EVAL_SAMPLES * cols; k++)
        x_scaled[k] = x_eval[k] / scales[k % cols];
    assert_int_equal(quant_matrix_rtn(w_scaled, rows, cols, &scheme, codes, params, &err), 0);
    quant_matrix_dequantize(codes, params, rows, cols, &scheme, w_hat);
    // (x / s) RTN(W s)^T against x W^T, on the evaluation inputs.
    double awq = 0.0;
    for (int s = 0; s < EVAL_SAMPLES; s++)
        for (int o = 0; o < rows; o++) {
            double exact = 0.0, approx = 0.0;
            for (int c = 0; c < cols; c++) {
                exact += (double)x_eval[(size_t)s * cols + c] * (double)w[(size_t)o * cols + c];
                approx += (double)x_scaled[(size_t)s * cols + c] * (double)w_hat[(size_t)o * cols + c];
            }
            awq += (exact - approx) * (exact - approx);
        }
    awq /= (double)EVAL_SAMPLES * rows;

    // GPTQ.
    if (quant_gptq(w, rows, cols, x_calib, CALIB_SAMPLES, &scheme, 0.01f, 128, codes, params, &err))
        fail_msg("gptq: %s", err.message);
    quant_matrix_dequantize(codes, params, rows, cols, &scheme, w_hat);
    double gptq = output_mse(x_eval, EVAL_SAMPLES, w, w_hat, rows, cols);
    // GPTQ moves weights by more than half a step on purpose: its per-weight
    // error is larger than RTN's while the output error is smaller.
    quant_stats gptq_weights = quant_matrix_stats(w, codes, params, rows, cols, &scheme, -1);

    print_message("INT4 g64 layer (128, 256), activation outliers: output MSE RTN %.4e, AWQ %.4e (alpha %.2f), "
                  "GPTQ %.4e\n",
                  rtn, awq, (double)alpha, gptq);
    print_message("  GPTQ weight MSE %.3e, max |w - w_hat| %.3g (within s/2: %s)\n", gptq_weights.mse,
                  (double)gptq_weights.max_abs_error, gptq_weights.within_half_step ? "yes" : "no");
    assert_true(alpha > 0.0f && alpha <= 1.0f);
    assert_true(awq < rtn);
    assert_true(gptq < rtn);

    // Per channel too, and symmetric.
    quant_scheme channel = scheme_of(4, true, QUANT_PER_CHANNEL, 0, false);
    assert_int_equal(quant_matrix_rtn(w, rows, cols, &channel, codes, params, &err), 0);
    quant_matrix_dequantize(codes, params, rows, cols, &channel, w_hat);
    double rtn_channel = output_mse(x_eval, EVAL_SAMPLES, w, w_hat, rows, cols);
    assert_int_equal(quant_gptq(w, rows, cols, x_calib, CALIB_SAMPLES, &channel, 0.01f, 64, codes, params, &err), 0);
    quant_matrix_dequantize(codes, params, rows, cols, &channel, w_hat);
    double gptq_channel = output_mse(x_eval, EVAL_SAMPLES, w, w_hat, rows, cols);
    print_message("INT4 sym per-channel: output MSE RTN %.4e, GPTQ %.4e\n", rtn_channel, gptq_channel);
    assert_true(gptq_channel < rtn_channel);

    free(w);
    free(w_hat);
    free(x_calib);
    free(x_eval);
    free(codes);
    free(params);
    free(w_scaled);
    free(x_scaled);
}

// alpha = 0 is plain RTN; on inputs with no channel structure AWQ finds
// nothing to protect. Two runs give the same bits.
static void test_awq_is_deterministic_and_normalised(void** state) {
    (void)state;
    enum { rows = 32, cols = 64, n = 64 };
    float w[rows * cols], wk[16 * cols], x[n * cols];
    rng r = {8};
    for (int k = 0; k < rows * cols; k++)
        w[k] = rng_normal(&r);
    for (int k = 0; k < 16 * cols; k++)
        wk[k] = rng_normal(&r);
    fill_activations(x, n, cols, 3, 4);
    const float* matrices[2] = {w, wk};
    const int matrix_rows[2] = {rows, 16};
    quant_scheme scheme = scheme_of(4, false, QUANT_PER_GROUP, 32, false);
    float s1[cols], s2[cols], a1, a2;
    error_info err = {{0}};
    assert_int_equal(quant_awq_search(matrices, matrix_rows, 2, cols, x, n, &scheme, s1, &a1, &err), 0);
    assert_int_equal(quant_awq_search(matrices, matrix_rows, 2, cols, x, n, &scheme, s2, &a2, &err), 0);
    assert_memory_equal(s1, s2, sizeof s1);
    assert_true(a1 == a2);
    // Normalised: the largest and smallest scales multiply to 1.
    float largest = 0.0f, smallest = INFINITY;
    for (int c = 0; c < cols; c++) {
        largest = fmaxf(largest, s1[c]);
        smallest = fminf(smallest, s1[c]);
    }
    assert_true(fabs((double)largest * smallest - 1.0) < 1e-5);
    // Bad input is rejected, not crashed on.
    assert_int_equal(quant_awq_search(matrices, matrix_rows, 2, cols, x, 0, &scheme, s1, &a1, &err), -1);
    assert_non_null(strstr(err.message, "n_samples"));
}

// GPTQ's bookkeeping: deterministic, a dead input column decodes to 0, the
// block size does not change the result beyond rounding, and inputs that
// no damping can make positive definite give an error, not garbage.
static void test_gptq_dead_columns_blocks_and_failures(void** state) {
    (void)state;
    enum { rows = 16, cols = 64, n = 96 };
    float w[rows * cols], x[n * cols], r_hat[rows * cols];
    int32_t codes_a[rows * cols], codes_b[rows * cols];
    quant_params params_a[rows * cols / 16], params_b[rows * cols / 16];
    rng r = {21};
    for (int k = 0; k < rows * cols; k++)
        w[k] = rng_normal(&r);
    fill_activations(x, n, cols, 5, 6);
    for (int s = 0; s < n; s++)
        x[s * cols + 7] = 0.0f; // input 7 is dead
    quant_scheme scheme = scheme_of(4, false, QUANT_PER_GROUP, 16, false);
    error_info err = {{0}};
    assert_int_equal(quant_gptq(w, rows, cols, x, n, &scheme, 0.01f, 32, codes_a, params_a, &err), 0);
    assert_int_equal(quant_gptq(w, rows, cols, x, n, &scheme, 0.01f, 32, codes_b, params_b, &err), 0);
    assert_memory_equal(codes_a, codes_b, sizeof codes_a);
    assert_memory_equal(params_a, params_b, sizeof params_a);
    quant_matrix_dequantize(codes_a, params_a, rows, cols, &scheme, r_hat);
    for (int o = 0; o < rows; o++)
        assert_true(r_hat[o * cols + 7] == 0.0f);
    // Block sizes that do and do not align with the groups agree closely
    // (the same math; only the order of the double-precision updates differs).
    assert_int_equal(quant_gptq(w, rows, cols, x, n, &scheme, 0.01f, 5, codes_b, params_b, &err), 0);
    int differing = 0;
    for (int k = 0; k < rows * cols; k++)
        differing += codes_a[k] != codes_b[k];
    assert_true(differing <= rows * cols / 100);
    // NaN inputs: H is not positive definite for any damping.
    x[3] = NAN;
    assert_int_equal(quant_gptq(w, rows, cols, x, n, &scheme, 0.01f, 32, codes_b, params_b, &err), -1);
    assert_non_null(strstr(err.message, "positive definite"));
    x[3] = 1.0f;
    assert_int_equal(quant_gptq(w, rows, cols, x, n, &scheme, 0.01f, 0, codes_b, params_b, &err), -1);
    assert_non_null(strstr(err.message, "block_size"));
}

// ---- packed formats ------------------------------------------------------------------------

// The test's own reading of kernels/cpu/matmul.h's WEIGHT_I8 / WEIGHT_I4:
// r_hat = scale * (q - zero) with group g of row o covering columns
// [g * group_size, (g + 1) * group_size).
static float unpack_value(const weight_matrix* m, int o, int i) {
    int groups_per_row = m->cols / m->group_size;
    int g = o * groups_per_row + i / m->group_size;
    float scale = fp16_to_fp32(m->scales_f16[g]);
    int32_t q;
    if (m->dtype == WEIGHT_I8) {
        if (m->zero_points)
            q = ((const uint8_t*)m->values)[(size_t)o * m->cols + i];
        else
            q = ((const int8_t*)m->values)[(size_t)o * m->cols + i];
    } else {
        uint8_t byte = ((const uint8_t*)m->values)[(size_t)o * ((m->cols + 1) / 2) + i / 2];
        int32_t nibble = i % 2 == 0 ? (byte & 0x0f) : (byte >> 4); // column 2j low, 2j + 1 high
        q = m->zero_points ? nibble : nibble - 8;
    }
    int32_t zero = m->zero_points ? m->zero_points[g] : 0;
    return scale * (float)(q - zero);
}

static bool inside(const void* p, size_t size, const uint8_t* base, size_t total) {
    return (const uint8_t*)p >= base && (const uint8_t*)p + size <= base + total;
}

static void check_pack_round_trip(int rows, int cols, quant_scheme scheme) {
    size_t count = (size_t)rows * cols;
    float* w = malloc(count * sizeof *w);
    float* r_hat = malloc(count * sizeof *r_hat);
    int32_t* codes = malloc(count * sizeof *codes);
    quant_params* params = malloc((size_t)quant_param_count(rows, cols, &scheme) * sizeof *params);
    assert_true(w && r_hat && codes && params);
    fill_outlier_weights(w, rows, cols, (uint64_t)(rows * 131 + cols));
    error_info err = {{0}};
    assert_int_equal(quant_matrix_rtn(w, rows, cols, &scheme, codes, params, &err), 0);
    quant_matrix_dequantize(codes, params, rows, cols, &scheme, r_hat);

    int groups_per_row = scheme.granularity == QUANT_PER_GROUP ? cols / scheme.group_size : 1;
    size_t groups = (size_t)rows * groups_per_row;
    size_t payload = scheme.bits == 8 ? count : (size_t)rows * ((cols + 1) / 2);
    size_t expected = payload + 2 * groups + (scheme.symmetric ? 0 : groups);
    uint64_t bytes = quant_packed_bytes(rows, cols, &scheme);
    assert_int_equal(bytes, expected);
    uint8_t* storage = malloc(bytes);
    assert_non_null(storage);
    memset(storage, 0xAB, bytes); // a region the packer forgets would show up
    weight_matrix m;
    if (quant_pack(codes, params, rows, cols, &scheme, storage, &m, &err)) fail_msg("pack: %s", err.message);
    assert_int_equal(m.dtype, scheme.bits == 8 ? WEIGHT_I8 : WEIGHT_I4);
    assert_int_equal(m.rows, rows);
    assert_int_equal(m.cols, cols);
    assert_int_equal(m.group_size, scheme.granularity == QUANT_PER_GROUP ? scheme.group_size : cols);
    assert_null(m.scales);
    assert_int_equal(m.activation_bits, 0);
    assert_true(scheme.symmetric ? m.zero_points == NULL : m.zero_points != NULL);
    // The three regions lie inside the storage and fill it exactly.
    assert_true(inside(m.values, payload, storage, bytes));
    assert_true(inside(m.scales_f16, 2 * groups, storage, bytes));
    if (!scheme.symmetric) assert_true(inside(m.zero_points, groups, storage, bytes));
    for (int o = 0; o < rows; o++)
        for (int i = 0; i < cols; i++) {
            float packed = unpack_value(&m, o, i), reference = r_hat[(size_t)o * cols + i];
            if (packed != reference)
                fail_msg("(%d, %d) of %dx%d, %d bits, symmetric %d, granularity %d: packed %g, dequantized %g", o, i,
                         rows, cols, scheme.bits, (int)scheme.symmetric, (int)scheme.granularity, (double)packed,
                         (double)reference);
        }
    if (scheme.bits == 4 && cols % 2 == 1)
        for (int o = 0; o < rows; o++)
            assert_int_equal(((const uint8_t*)m.values)[(size_t)o * ((cols + 1) / 2) + cols / 2] >> 4, 0);
    free(storage);
    free(w);
    free(r_hat);
    free(codes);
    free(params);
}

static void test_pack_round_trips_through_the_documented_layout(void** state) {
    (void)state;
    for (int bits = 4; bits <= 8; bits += 4)
        for (int symmetric = 0; symmetric <= 1; symmetric++) {
            check_pack_round_trip(5, 33, scheme_of(bits, symmetric, QUANT_PER_GROUP, 11, false));
            check_pack_round_trip(5, 33, scheme_of(bits, symmetric, QUANT_PER_GROUP, 33, false));
            check_pack_round_trip(3, 33, scheme_of(bits, symmetric, QUANT_PER_TENSOR, 0, false));
            check_pack_round_trip(7, 64, scheme_of(bits, symmetric, QUANT_PER_CHANNEL, 0, false));
            check_pack_round_trip(4, 128, scheme_of(bits, symmetric, QUANT_PER_GROUP, 32, true));
        }
}

// Byte-level checks of the nibble order on a tiny hand-made matrix:
// symmetric INT4 codes {-7, 7, 0} -> nibbles {1, 15, 8}: byte 0 = 0xF1
// (column 0 low, column 1 high), byte 1 = 0x08 (column 2 low, high nibble 0).
static void test_int4_nibble_order(void** state) {
    (void)state;
    quant_scheme scheme = scheme_of(4, true, QUANT_PER_CHANNEL, 0, false);
    const int32_t codes[3] = {-7, 7, 0};
    quant_params p = {0.5f, 0, -3.5f, 3.5f};
    uint16_t storage[8];
    assert_int_equal(quant_packed_bytes(1, 3, &scheme), 2 + 2);
    weight_matrix m;
    error_info err = {{0}};
    assert_int_equal(quant_pack(codes, &p, 1, 3, &scheme, storage, &m, &err), 0);
    const uint8_t* bytes = m.values;
    assert_int_equal(bytes[0], 0xF1);
    assert_int_equal(bytes[1], 0x08);
    assert_int_equal(m.scales_f16[0], fp32_to_fp16(0.5f));
    // Asymmetric: codes {3, 12} with z = 5 -> byte 0xC3, zero-point 5.
    quant_scheme asym = scheme_of(4, false, QUANT_PER_CHANNEL, 0, false);
    const int32_t asym_codes[2] = {3, 12};
    quant_params pa = {0.25f, 5, -1.25f, 2.5f};
    assert_int_equal(quant_pack(asym_codes, &pa, 1, 2, &asym, storage, &m, &err), 0);
    assert_int_equal(((const uint8_t*)m.values)[0], 0xC3);
    assert_int_equal(m.zero_points[0], 5);
    // A code outside the format is an error, not a silently wrapped nibble.
    const int32_t bad[2] = {3, 16};
    assert_int_equal(quant_pack(bad, &pa, 1, 2, &asym, storage, &m, &err), -1);
    assert_non_null(strstr(err.message, "code 16"));
    // So is a scale the fp16 field cannot hold exactly.
    quant_params inexact = {0.1f, 5, -0.5f, 1.0f};
    assert_int_equal(quant_pack(asym_codes, &inexact, 1, 2, &asym, storage, &m, &err), -1);
    assert_non_null(strstr(err.message, "fp16"));
}

// ---- bad schemes ---------------------------------------------------------------------------

static void test_bad_schemes_are_rejected(void** state) {
    (void)state;
    error_info err = {{0}};
    quant_scheme scheme = scheme_of(1, false, QUANT_PER_CHANNEL, 0, false);
    assert_int_equal(quant_scheme_validate(&scheme, 64, &err), -1);
    assert_non_null(strstr(err.message, "bits = 1"));
    scheme.bits = 9;
    assert_int_equal(quant_scheme_validate(&scheme, 64, &err), -1);
    assert_non_null(strstr(err.message, "bits = 9"));
    scheme = scheme_of(4, false, QUANT_PER_GROUP, 48, false);
    assert_int_equal(quant_scheme_validate(&scheme, 64, &err), -1);
    assert_non_null(strstr(err.message, "group_size = 48"));
    scheme.group_size = 0;
    assert_int_equal(quant_scheme_validate(&scheme, 64, &err), -1);
    scheme.group_size = 32;
    assert_int_equal(quant_scheme_validate(&scheme, 64, &err), 0);
    scheme.granularity = (quant_granularity)7;
    assert_int_equal(quant_scheme_validate(&scheme, 64, &err), -1);
    assert_non_null(strstr(err.message, "granularity"));

    // The matrix functions check the scheme before touching anything.
    float w[2 * 64] = {0};
    int32_t codes[2 * 64];
    quant_params params[8];
    scheme = scheme_of(9, false, QUANT_PER_TENSOR, 0, false);
    assert_int_equal(quant_matrix_rtn(w, 2, 64, &scheme, codes, params, &err), -1);
    assert_non_null(strstr(err.message, "bits = 9"));
    scheme = scheme_of(4, false, QUANT_PER_GROUP, 48, false);
    assert_int_equal(quant_gptq(w, 2, 64, w, 2, &scheme, 0.01f, 128, codes, params, &err), -1);
    assert_non_null(strstr(err.message, "group_size"));

    // Packing needs 8 or 4 bits.
    scheme = scheme_of(5, true, QUANT_PER_CHANNEL, 0, false);
    assert_int_equal(quant_matrix_rtn(w, 2, 64, &scheme, codes, params, &err), 0);
    assert_int_equal(quant_packed_bytes(2, 64, &scheme), 0);
    uint16_t storage[256];
    weight_matrix m;
    assert_int_equal(quant_pack(codes, params, 2, 64, &scheme, storage, &m, &err), -1);
    assert_non_null(strstr(err.message, "bits = 5"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_code_ranges),
        cmocka_unit_test(test_asymmetric_by_hand),
        cmocka_unit_test(test_symmetric_by_hand),
        cmocka_unit_test(test_scale_is_the_fp16_value_at_or_above_the_exact_step),
        cmocka_unit_test(test_halfway_value_has_error_of_half_a_step),
        cmocka_unit_test(test_far_outside_values_saturate),
        cmocka_unit_test(test_int4_step_is_17_times_int8),
        cmocka_unit_test(test_zero_range_is_guarded),
        cmocka_unit_test(test_min_max_ranges_keep_every_value_within_half_a_step),
        cmocka_unit_test(test_param_count_and_index),
        cmocka_unit_test(test_matrix_stats_agree_with_measure),
        cmocka_unit_test(test_finer_granularity_lowers_the_error),
        cmocka_unit_test(test_symmetric_vs_asymmetric),
        cmocka_unit_test(test_clip_search_never_hurts_and_counts_clips),
        cmocka_unit_test(test_awq_and_gptq_beat_rtn_on_activation_outliers),
        cmocka_unit_test(test_awq_is_deterministic_and_normalised),
        cmocka_unit_test(test_gptq_dead_columns_blocks_and_failures),
        cmocka_unit_test(test_pack_round_trips_through_the_documented_layout),
        cmocka_unit_test(test_int4_nibble_order),
        cmocka_unit_test(test_bad_schemes_are_rejected),
    };
    return cmocka_run_group_tests_name("engine/quant", tests, NULL, NULL);
}
