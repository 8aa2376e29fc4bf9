// Group-wise W8A8 and W4A8 (activation_bits 8, activation_block > 0), on
// matrices built here from random codes and scales, at every SIMD level:
//   - every level gives, bit for bit, the order written at the top of
//     kernels/cpu/matmul_a8.c, recomputed here from its definition with a
//     quantizer of this file's own (so the scalar, AVX2 and VNNI kernels
//     and the fallback without scratch memory are all checked against it);
//   - groups 32, 64, 128 and 256 (the VNNI kernel), 96 and 16 (the scalar
//     one), per channel; row lengths that end in a partial 128-column step;
//   - a row's bits do not depend on the batch, its position or the threads;
//   - the result is close to the float product, and group-wise scales beat
//     one scale per row on a row with an outlier.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_simd.h" // matmul_a8_unbuffered
#include "kernels/cpu/thread_pool.h"
#include "tests/test_support.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t random_bits(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float random_uniform(void) { // in [-1, 1)
    return (float)((random_bits() >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static int random_int(int low, int high) { // in [low, high]
    return low + (int)(random_bits() % (uint64_t)(high - low + 1));
}

static const cpu_simd_level all_levels[] = {CPU_SIMD_SCALAR, CPU_SIMD_AVX2, CPU_SIMD_AVX512};
#define N_LEVELS 3

// A symmetric packed matrix and its integer codes.
typedef struct a8_matrix {
    weight_matrix w;
    uint8_t* values;  // (rows, row_bytes) packed codes
    uint16_t* scales; // (rows, cols / group_size) fp16
    int32_t* codes;   // (rows, cols) c = q (INT8) or nibble - 8 (INT4)
} a8_matrix;

static a8_matrix make_matrix(weight_dtype dtype, int rows, int cols, int group_size, int block) {
    a8_matrix m = {{0}, NULL, NULL, NULL};
    const size_t row_bytes = dtype == WEIGHT_I4 ? ((size_t)cols + 1) / 2 : (size_t)cols;
    const size_t n_groups = (size_t)(cols / group_size);
    m.values = calloc((size_t)rows, row_bytes);
    m.scales = malloc((size_t)rows * n_groups * sizeof *m.scales);
    m.codes = malloc((size_t)rows * (size_t)cols * sizeof *m.codes);
    assert_non_null(m.values);
    assert_non_null(m.scales);
    assert_non_null(m.codes);
    for (int o = 0; o < rows; o++) {
        for (int i = 0; i < cols; i++) {
            int32_t c = dtype == WEIGHT_I4 ? random_int(-8, 7) : random_int(-127, 127);
            m.codes[(size_t)o * (size_t)cols + (size_t)i] = c;
            uint8_t* row = m.values + (size_t)o * row_bytes;
            if (dtype == WEIGHT_I8)
                row[i] = (uint8_t)(int8_t)c;
            else
                row[i / 2] |= (uint8_t)((c + 8) << (4 * (i & 1)));
        }
        for (size_t g = 0; g < n_groups; g++)
            m.scales[(size_t)o * n_groups + g] =
                fp32_to_fp16(ldexpf(0.5f + 0.5f * fabsf(random_uniform()), -random_int(4, 9)));
    }
    m.w = (weight_matrix){.dtype = dtype,
                          .rows = rows,
                          .cols = cols,
                          .group_size = group_size,
                          .values = m.values,
                          .scales_f16 = m.scales,
                          .activation_bits = 8,
                          .activation_block = block};
    return m;
}

static void free_matrix(a8_matrix* m) {
    free(m->values);
    free(m->scales);
    free(m->codes);
}

// Rows of activations in [-1, 1), with a few larger values, a zero block
// and an all-equal block now and then.
static float* random_rows(int n_rows, int cols) {
    float* x = malloc((size_t)n_rows * (size_t)cols * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < (size_t)n_rows * (size_t)cols; i++)
        x[i] = random_int(0, 50) == 0 ? 8.0f * random_uniform() : random_uniform();
    return x;
}

// ---- the definition, recomputed ------------------------------------------------

// This file's own quantizer of one block: scale = max |x| / 127 (NaN when
// the block is not finite), codes round(x / scale) to nearest even,
// clamped to [-127, 127], all 0 unless the scale is finite and > 0.
static float quantize_block(const float* x, int n, int32_t* codes) {
    float max_abs = 0.0f;
    bool finite = true;
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            finite = false;
        else if (fabsf(x[i]) > max_abs)
            max_abs = fabsf(x[i]);
    }
    float scale = finite ? max_abs / 127.0f : NAN;
    for (int i = 0; i < n; i++) {
        float v = finite && scale > 0.0f ? x[i] / scale : 0.0f;
        v = fminf(fmaxf(v, -127.0f), 127.0f);
        codes[i] = (int32_t)nearbyintf(v);
    }
    return scale;
}

// out (n_rows, rows) by the order of matmul_a8.c.
static void expected_a8(const a8_matrix* m, const float* x, int n_rows, float* out) {
    const int cols = m->w.cols, block = m->w.activation_block, n_groups = cols / m->w.group_size;
    int32_t* a = malloc((size_t)block * sizeof *a);
    assert_non_null(a);
    for (int r = 0; r < n_rows; r++)
        for (int o = 0; o < m->w.rows; o++) {
            float totals[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int b = 0; b * block < cols; b++) {
                float a_scale = quantize_block(x + (size_t)r * (size_t)cols + (size_t)(b * block), block, a);
                int64_t isum = 0;
                for (int i = 0; i < block; i++)
                    isum += (int64_t)a[i] * m->codes[(size_t)o * (size_t)cols + (size_t)(b * block + i)];
                float w_scale =
                    fp16_to_fp32(m->scales[(size_t)o * (size_t)n_groups + (size_t)(b * block / m->w.group_size)]);
                float term = (float)isum * w_scale;
                term = term * a_scale;
                totals[b % 4] += term;
            }
            out[(size_t)r * (size_t)m->w.rows + (size_t)o] = (totals[0] + totals[2]) + (totals[1] + totals[3]);
        }
    free(a);
}

// Bits equal, NaN equal to NaN.
static void assert_same_bits(const float* got, const float* want, size_t n, const char* what) {
    for (size_t k = 0; k < n; k++) {
        if (isnan(got[k]) && isnan(want[k])) continue;
        if (memcmp(&got[k], &want[k], sizeof(float)) != 0)
            fail_msg("%s: element %zu is %.9g, expected %.9g", what, k, (double)got[k], (double)want[k]);
    }
}

typedef struct a8_shape {
    int rows, cols, group_size, block; // group_size == cols: per channel
} a8_shape;

static const a8_shape shapes[] = {
    {13, 128, 32, 32}, {9, 256, 64, 32}, {10, 384, 128, 32}, {7, 512, 256, 32}, // the VNNI kernel
    {11, 96, 32, 32},  {6, 224, 32, 32}, {5, 192, 64, 32},                      // a partial last step
    {8, 768, 768, 32},                                                          // per channel
    {5, 192, 96, 32},  {6, 80, 16, 16},  {4, 172, 172, 172},                    // the scalar kernel
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static const weight_dtype dtypes[] = {WEIGHT_I8, WEIGHT_I4};

static void test_every_level_gives_the_definition(void** state) {
    (void)state;
    for (size_t s = 0; s < N_SHAPES; s++)
        for (int d = 0; d < 2; d++) {
            const a8_shape* sh = &shapes[s];
            a8_matrix m = make_matrix(dtypes[d], sh->rows, sh->cols, sh->group_size, sh->block);
            for (int n_rows = 1; n_rows <= 9; n_rows += 4) {
                float* x = random_rows(n_rows, sh->cols);
                float* want = malloc((size_t)n_rows * (size_t)sh->rows * sizeof *want);
                float* got = malloc((size_t)n_rows * (size_t)sh->rows * sizeof *got);
                assert_non_null(want);
                assert_non_null(got);
                expected_a8(&m, x, n_rows, want);
                char what[128];
                for (int k = 0; k < N_LEVELS; k++) {
                    if (!test_simd_level_available(all_levels[k])) continue;
                    snprintf(what, sizeof what, "%s %dx%d g%d block %d, %d rows, %s",
                             dtypes[d] == WEIGHT_I4 ? "W4A8" : "W8A8", sh->rows, sh->cols, sh->group_size, sh->block,
                             n_rows, cpu_simd_level_name(all_levels[k]));
                    memset(got, 0xff, (size_t)n_rows * (size_t)sh->rows * sizeof *got);
                    matmul_at_level(got, x, n_rows, &m.w, NULL, all_levels[k], NULL);
                    assert_same_bits(got, want, (size_t)n_rows * (size_t)sh->rows, what);
                }
                memset(got, 0xff, (size_t)n_rows * (size_t)sh->rows * sizeof *got);
                matmul_a8_unbuffered(got, x, n_rows, &m.w, 0, sh->rows);
                assert_same_bits(got, want, (size_t)n_rows * (size_t)sh->rows, "unbuffered");
                free(x);
                free(want);
                free(got);
            }
            free_matrix(&m);
        }
}

// A zero block gives a term of 0, a block holding NaN or inf a NaN output.
static void test_special_blocks(void** state) {
    (void)state;
    for (int d = 0; d < 2; d++) {
        a8_matrix m = make_matrix(dtypes[d], 8, 256, 32, 32);
        float* x = random_rows(3, 256);
        for (int i = 32; i < 64; i++)
            x[i] = 0.0f;       // row 0: block 1 zero
        x[256 + 100] = NAN;    // row 1: NaN
        x[512 + 5] = INFINITY; // row 2: inf
        float want[3 * 8], got[3 * 8];
        expected_a8(&m, x, 3, want);
        for (int r = 1; r < 3; r++)
            for (int o = 0; o < 8; o++)
                assert_true(isnan(want[r * 8 + o]));
        for (int k = 0; k < N_LEVELS; k++) {
            if (!test_simd_level_available(all_levels[k])) continue;
            matmul_at_level(got, x, 3, &m.w, NULL, all_levels[k], NULL);
            assert_same_bits(got, want, 3 * 8, cpu_simd_level_name(all_levels[k]));
        }
        free(x);
        free_matrix(&m);
    }
}

// The quantizer matmul exports for lessons: this file's rule, block by block.
static void test_quantize_row_blocks(void** state) {
    (void)state;
    float* x = random_rows(1, 160);
    for (int i = 64; i < 96; i++)
        x[i] = 0.0f;
    int8_t codes[160];
    float scales[5];
    int32_t want[32];
    matmul_quantize_row_blocks(codes, scales, x, 160, 32);
    for (int b = 0; b < 5; b++) {
        float want_scale = quantize_block(x + 32 * b, 32, want);
        assert_memory_equal(&scales[b], &want_scale, sizeof(float));
        for (int i = 0; i < 32; i++)
            assert_int_equal(codes[32 * b + i], want[i]);
    }
    assert_true(scales[2] == 0.0f);
    free(x);
}

// ---- batch invariance ------------------------------------------------------------

static void test_batch_invariance(void** state) {
    (void)state;
    static const a8_shape big[] = {{301, 768, 32, 32}, {200, 1024, 128, 32}, {136, 320, 64, 32}};
    static const int batches[] = {2, 5, 7, 13};
    for (int threads = 1; threads <= 3; threads++) {
        thread_pool* pool;
        assert_int_equal(thread_pool_create(threads, &pool), 0);
        for (size_t s = 0; s < sizeof big / sizeof big[0]; s++)
            for (int d = 0; d < 2; d++) {
                a8_matrix m = make_matrix(dtypes[d], big[s].rows, big[s].cols, big[s].group_size, big[s].block);
                const int rows = m.w.rows, cols = m.w.cols;
                for (int k = 0; k < N_LEVELS; k++) {
                    if (!test_simd_level_available(all_levels[k])) continue;
                    for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
                        const int n = batches[b];
                        float* x = random_rows(n, cols);
                        float* batch = malloc((size_t)n * (size_t)rows * sizeof(float));
                        float* single = malloc((size_t)rows * sizeof(float));
                        assert_non_null(batch);
                        assert_non_null(single);
                        matmul_at_level(batch, x, n, &m.w, pool, all_levels[k], NULL);
                        for (int r = 0; r < n; r++) {
                            matmul_at_level(single, x + (size_t)r * (size_t)cols, 1, &m.w, NULL, all_levels[k], NULL);
                            if (memcmp(single, batch + (size_t)r * (size_t)rows, (size_t)rows * sizeof(float)) != 0)
                                fail_msg("%s %dx%d g%d %s, %d threads: row %d of %d differs from the row alone",
                                         dtypes[d] == WEIGHT_I4 ? "W4A8" : "W8A8", rows, cols, m.w.group_size,
                                         cpu_simd_level_name(all_levels[k]), threads, r, n);
                        }
                        free(x);
                        free(batch);
                        free(single);
                    }
                }
                free_matrix(&m);
            }
        thread_pool_free(pool);
    }
}

// ---- accuracy ----------------------------------------------------------------------

// Relative error of out against the fp64 product of the dequantized weights.
static double relative_error(const a8_matrix* m, const float* x, const float* out) {
    const int cols = m->w.cols, n_groups = cols / m->w.group_size;
    double error = 0.0, size = 0.0;
    for (int o = 0; o < m->w.rows; o++) {
        double exact = 0.0;
        for (int i = 0; i < cols; i++)
            exact += (double)m->codes[(size_t)o * (size_t)cols + (size_t)i] *
                     fp16_to_fp32(m->scales[(size_t)o * (size_t)n_groups + (size_t)(i / m->w.group_size)]) * x[i];
        error += fabs(out[o] - exact);
        size += fabs(exact);
    }
    return error / size;
}

// Close to the float product (int8 activations cost about 1%), and a row
// whose first block holds one value 100x the rest loses most of its
// precision with one scale per row, not with one per block of 32.
static void test_close_and_better_than_per_token(void** state) {
    (void)state;
    for (int d = 0; d < 2; d++) {
        a8_matrix m = make_matrix(dtypes[d], 64, 512, 32, 32);
        float* x = random_rows(1, 512);
        float out[64];
        matmul(out, x, 1, &m.w, NULL);
        double grouped = relative_error(&m, x, out);
        assert_true(grouped < 0.02);
        x[3] = 100.0f;
        matmul(out, x, 1, &m.w, NULL);
        grouped = relative_error(&m, x, out);
        if (dtypes[d] == WEIGHT_I8) {
            m.w.activation_block = 0; // per token: matmul_int.c's W8A8
            matmul(out, x, 1, &m.w, NULL);
            double per_token = relative_error(&m, x, out);
            if (!(grouped * 4 < per_token))
                fail_msg("outlier row: group-wise error %.4g, per-token %.4g", grouped, per_token);
        }
        assert_true(grouped < 0.02);
        free(x);
        free_matrix(&m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_level_gives_the_definition),
        cmocka_unit_test(test_special_blocks),
        cmocka_unit_test(test_quantize_row_blocks),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_close_and_better_than_per_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
