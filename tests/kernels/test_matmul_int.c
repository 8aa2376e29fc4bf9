// matmul on the packed integer formats (WEIGHT_I8, WEIGHT_I4; symmetric and
// asymmetric; W8A16, W4A16 and W8A8), built here from random codes and
// scales (not through the quantizer), at every SIMD level:
//   - W8A16 / W4A16 agree with a double-precision reference of the
//     dequantized weights within (cols + 8) * FLT_EPSILON * sum |w_i x_i|, a
//     rigorous bound for fp32 sums in any order (so levels agree with each
//     other within twice that), and exactly when every product and sum is
//     representable; W4A16's reference takes each x_i rounded to bf16 (by
//     an independent rounding here), which a kernel that skipped the
//     rounding misses by far more than the bound;
//   - the AVX512_BF16 W4A16 kernel gives the bits of the fp32 phase kernel;
//   - W8A8 equals, bit for bit and at every level, the integer math spelled
//     out in matmul_int.c, recomputed here from its definition;
//   - every level is batch-invariant to the bit for 1, 2 and 3 threads;
//   - byte counts are exact and weight_row_to_f32 decodes every format.
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
#include "kernels/cpu/matmul_simd.h" // matmul_w8a8_unbuffered, matmul_quantize_row_avx2
#include "kernels/cpu/thread_pool.h"
#include "tests/test_support.h"
#include "tests/kernels/matmul_set_check.h"

// ---- test data ----------------------------------------------------------------

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

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

// The formats under test: dtype x symmetric / asymmetric x activation bits.
typedef struct int_format {
    weight_dtype dtype;
    bool asymmetric;
    int activation_bits;
    const char* name;
} int_format;

static const int_format formats[] = {
    {WEIGHT_I8, false, 0, "W8A16 sym"}, {WEIGHT_I8, true, 0, "W8A16 asym"}, {WEIGHT_I4, false, 0, "W4A16 sym"},
    {WEIGHT_I4, true, 0, "W4A16 asym"}, {WEIGHT_I8, false, 8, "W8A8"},
};
#define N_FORMATS 5

// How scales and activations are drawn.
typedef enum value_kind {
    VALUES_RANDOM, // scales 2^[-8, 0) * [0.5, 1), x uniform in [-1, 1)
    VALUES_DYADIC, // scales 2^[-2, 0], x in quarters: every fp32 sum is exact for small shapes
} value_kind;

// A packed matrix, built byte by byte from the format's definition, and
// what each value stands for.
typedef struct int_matrix {
    weight_matrix w;
    uint8_t* values;  // (rows, row_bytes) packed codes
    uint16_t* scales; // (rows, n_groups) fp16
    uint8_t* zeros;   // (rows, n_groups), NULL when symmetric
    int* codes;       // (rows, cols) c = q - zero, the integer a value stands for
    double* exact;    // (rows, cols) scale * c, the dequantized weight
} int_matrix;

static float random_scale(value_kind kind) {
    if (kind == VALUES_DYADIC) return ldexpf(1.0f, random_int(-2, 0));
    float scale = ldexpf(0.5f + 0.5f * fabsf(random_uniform()), -random_int(0, 8));
    return fp16_to_fp32(fp32_to_fp16(scale));
}

static int_matrix make_int_matrix(const int_format* f, int rows, int cols, int group_size, value_kind kind) {
    assert_int_equal(cols % group_size, 0);
    const int n_groups = cols / group_size;
    const size_t row_bytes = f->dtype == WEIGHT_I4 ? ((size_t)cols + 1) / 2 : (size_t)cols;
    int_matrix m = {0};
    m.values = calloc((size_t)rows * row_bytes + 1, 1);
    m.scales = malloc((size_t)rows * (size_t)n_groups * sizeof(uint16_t));
    m.zeros = f->asymmetric ? malloc((size_t)rows * (size_t)n_groups) : NULL;
    m.codes = malloc((size_t)rows * (size_t)cols * sizeof(int));
    m.exact = malloc((size_t)rows * (size_t)cols * sizeof(double));
    assert_true(m.values && m.scales && m.codes && m.exact && (m.zeros || !f->asymmetric));
    for (int o = 0; o < rows; o++) {
        for (int g = 0; g < n_groups; g++) {
            size_t index = (size_t)o * (size_t)n_groups + (size_t)g;
            float scale = random_scale(kind);
            m.scales[index] = fp32_to_fp16(scale);
            assert_true(fp16_to_fp32(m.scales[index]) == scale);
            int zero = 0;
            if (f->asymmetric) {
                zero = f->dtype == WEIGHT_I4 ? random_int(0, 15) : random_int(0, 255);
                m.zeros[index] = (uint8_t)zero;
            }
            for (int i = g * group_size; i < (g + 1) * group_size; i++) {
                // q: the stored code; c = q - zero. Symmetric INT4 stores q + 8.
                int q, c;
                if (f->dtype == WEIGHT_I8 && !f->asymmetric) {
                    c = q = random_int(-127, 127);
                    m.values[(size_t)o * row_bytes + (size_t)i] = (uint8_t)(int8_t)q;
                } else if (f->dtype == WEIGHT_I8) {
                    q = random_int(0, 255);
                    c = q - zero;
                    m.values[(size_t)o * row_bytes + (size_t)i] = (uint8_t)q;
                } else {
                    if (f->asymmetric) {
                        q = random_int(0, 15);
                        c = q - zero;
                    } else {
                        c = random_int(-7, 7);
                        q = c + 8;
                    }
                    m.values[(size_t)o * row_bytes + (size_t)(i / 2)] |= (uint8_t)(q << (i % 2 ? 4 : 0));
                }
                m.codes[(size_t)o * (size_t)cols + (size_t)i] = c;
                m.exact[(size_t)o * (size_t)cols + (size_t)i] = (double)scale * c;
            }
        }
    }
    m.w = (weight_matrix){.dtype = f->dtype,
                          .rows = rows,
                          .cols = cols,
                          .group_size = group_size,
                          .values = m.values,
                          .scales_f16 = m.scales,
                          .zero_points = m.zeros,
                          .activation_bits = f->activation_bits};
    return m;
}

static void free_int_matrix(int_matrix* m) {
    free(m->values);
    free(m->scales);
    free(m->zeros);
    free(m->codes);
    free(m->exact);
}

static float* random_rows(int n_rows, int cols, value_kind kind) {
    float* x = malloc((size_t)n_rows * (size_t)cols * sizeof(float) + 1);
    assert_non_null(x);
    for (size_t i = 0; i < (size_t)n_rows * (size_t)cols; i++)
        x[i] = kind == VALUES_DYADIC ? (float)random_int(-4, 4) / 4.0f : random_uniform();
    return x;
}

static float* alloc_out(int n_rows, int rows) {
    float* out = malloc((size_t)n_rows * (size_t)rows * sizeof(float) + 1);
    assert_non_null(out);
    memset(out, 0xff, (size_t)n_rows * (size_t)rows * sizeof(float)); // NaN: unwritten outputs fail
    return out;
}

// ---- SIMD levels ----------------------------------------------------------------

static const cpu_simd_level all_levels[] = {CPU_SIMD_SCALAR, CPU_SIMD_AVX2, CPU_SIMD_AVX512};
#define N_LEVELS 3

static void test_cpu_features_vnni(void** state) {
    (void)state;
    const cpu_features* f = cpu_features_get();
    if (f->avx512vnni) assert_true(f->avx512f);
    if (f->avx512bf16) assert_true(f->avx512f && f->avx512bw);
    if (!f->avx512vnni || f->best < CPU_SIMD_AVX512) {
        // Without it the AVX-512 level runs the AVX2 W8A8 kernel (the same
        // bits), so the VNNI kernel would go untested.
        if (getenv("CI")) fail_msg("CI is set but this CPU lacks AVX-512 VNNI");
        print_message("note: no AVX-512 VNNI here; its W8A8 kernel is not exercised\n");
    }
    if (!f->avx512bf16 || f->best < CPU_SIMD_AVX512) {
        // The same for W4A16's AVX512_BF16 kernel (test_i4_bf16_same_bits).
        if (getenv("CI")) fail_msg("CI is set but this CPU lacks AVX512_BF16");
        print_message("note: no AVX512_BF16 here; its W4A16 kernel is not exercised\n");
    }
}

// ---- references -------------------------------------------------------------------

// x rounded to the nearest bf16 (8 significant bits), ties to even, written
// independently of fp16.c: the significand scaled to [128, 256) and rounded
// by nearbyint (the default mode: ties to even). Subnormals become a zero
// of their sign, as the hardware converters make them; inf stays inf.
static float reference_bf16(float x) {
    if (!isfinite(x) || x == 0.0f) return x;
    if (fabsf(x) < FLT_MIN) return copysignf(0.0f, x);
    int exponent;
    double significand = frexp((double)x, &exponent); // [0.5, 1)
    return (float)ldexp(nearbyint(significand * 256.0), exponent - 8);
}

// The activation a format's products see: bf16 for W4A16, fp32 otherwise.
static double format_activation(const int_matrix* m, float x) {
    return m->w.dtype == WEIGHT_I4 ? (double)reference_bf16(x) : (double)x;
}

// W8A16 / W4A16: the rigorous bound of an fp32 sum of cols products in any
// order, (cols + 8) * FLT_EPSILON * sum |w_i x_i|: the test cannot flake,
// and a wrong code, scale or zero-point misses by far more. With
// `exact_sums` (VALUES_DYADIC) the bound is 0.
static void check_against_reference(const int_matrix* m, const float* x, int n_rows, const float* out, bool exact_sums,
                                    const char* what) {
    for (int r = 0; r < n_rows; r++) {
        for (int o = 0; o < m->w.rows; o++) {
            double sum = 0.0, sum_abs = 0.0;
            for (int i = 0; i < m->w.cols; i++) {
                double term = m->exact[(size_t)o * (size_t)m->w.cols + (size_t)i] *
                              format_activation(m, x[(size_t)r * (size_t)m->w.cols + (size_t)i]);
                sum += term;
                sum_abs += fabs(term);
            }
            double got = out[(size_t)r * (size_t)m->w.rows + (size_t)o];
            double bound = exact_sums ? 0.0 : (m->w.cols + 8) * (double)FLT_EPSILON * sum_abs + 1e-30;
            if (!(fabs(got - sum) <= bound)) // NaN fails too
                fail_msg("%s: out[%d][%d] = %.9g, reference %.9g (bound %.3g)", what, r, o, got, sum, bound);
        }
    }
}

// W8A8 from its definition (matmul_int.c): the activation codes and scale
// of one row, computed here independently of the kernels' helpers.
static float expected_activation_codes(const float* x, int cols, int8_t* codes) {
    float max_abs = 0.0f;
    bool finite = true;
    for (int i = 0; i < cols; i++) {
        if (!isfinite(x[i]))
            finite = false;
        else
            max_abs = fmaxf(max_abs, fabsf(x[i]));
    }
    float a_scale = finite ? max_abs / 127.0f : NAN;
    for (int i = 0; i < cols; i++) {
        codes[i] = 0;
        if (!(a_scale > 0.0f && isfinite(a_scale))) continue;
        float v = fminf(fmaxf(x[i] / a_scale, -127.0f), 127.0f);
        codes[i] = (int8_t)nearbyintf(v); // half to even in the default rounding mode
    }
    return a_scale;
}

// out[r][o] = sum over groups in order of ((float)isum * w_scale) * a_scale,
// isum the exact integer dot product of the group.
static void expected_w8a8(const int_matrix* m, const float* x, int n_rows, float* expected) {
    const int rows = m->w.rows, cols = m->w.cols, n_groups = cols / m->w.group_size;
    int8_t* codes = malloc((size_t)cols + 1);
    assert_non_null(codes);
    for (int r = 0; r < n_rows; r++) {
        float a_scale = expected_activation_codes(x + (size_t)r * (size_t)cols, cols, codes);
        for (int o = 0; o < rows; o++) {
            float total = 0.0f;
            for (int g = 0; g < n_groups; g++) {
                int64_t isum = 0;
                for (int i = g * m->w.group_size; i < (g + 1) * m->w.group_size; i++)
                    isum += (int64_t)codes[i] * m->codes[(size_t)o * (size_t)cols + (size_t)i];
                float term = (float)isum * fp16_to_fp32(m->scales[(size_t)o * (size_t)n_groups + (size_t)g]);
                term = term * a_scale;
                total = total + term;
            }
            expected[(size_t)r * (size_t)rows + (size_t)o] = total;
        }
    }
    free(codes);
}

// W8A8 is also close to the unquantized product: each activation moves by
// at most a_scale / 2, so |error| <= a_scale / 2 * sum |w_i| (+ rounding).
static void check_w8a8_close(const int_matrix* m, const float* x, int n_rows, const float* out, const char* what) {
    const int cols = m->w.cols;
    for (int r = 0; r < n_rows; r++) {
        const float* row = x + (size_t)r * (size_t)cols;
        double max_abs = 0.0;
        for (int i = 0; i < cols; i++)
            max_abs = fmax(max_abs, fabs(row[i]));
        for (int o = 0; o < m->w.rows; o++) {
            double sum = 0.0, sum_abs = 0.0, weight_abs = 0.0;
            for (int i = 0; i < cols; i++) {
                double wv = m->exact[(size_t)o * (size_t)cols + (size_t)i];
                sum += wv * row[i];
                sum_abs += fabs(wv * row[i]);
                weight_abs += fabs(wv);
            }
            double bound = max_abs / 127.0 * 0.5 * weight_abs * 1.001 + (cols + 8) * (double)FLT_EPSILON * sum_abs * 4;
            double got = out[(size_t)r * (size_t)m->w.rows + (size_t)o];
            if (!(fabs(got - sum) <= bound))
                fail_msg("%s: out[%d][%d] = %.9g, unquantized %.9g (bound %.3g)", what, r, o, got, sum, bound);
        }
    }
}

// ---- correctness at every level ------------------------------------------------

typedef struct shape {
    int rows, cols, group_size;
} shape;

// cols not a multiple of 8, 16, 32 or 64 (1, 3, 17, 33, 172, 257), odd cols
// (a half-used last INT4 byte), odd group sizes (INT4 groups that start in
// the middle of a byte), groups shorter than a vector and per-channel
// groups, row counts that are not multiples of the tiles. Groups of a
// multiple of 128, and symmetric groups of 32 or 64 in rows of a multiple
// of 128, take the AVX-512 INT4 phase kernel (256 / 32, 384 / 64, 256 /
// 128, 512 / 256, 8320 / 128: more columns than the kernel's own stack
// scratch holds, which matmul_at_level's once-per-call reordering does not
// need). 8200 / 41: a long row in the other INT4 kernels.
static const shape odd_shapes[] = {
    {1, 1, 1},     {5, 3, 3},     {5, 3, 1},     {33, 17, 17},  {7, 33, 11},    {16, 172, 43}, {6, 172, 4},
    {9, 257, 257}, {13, 256, 32}, {11, 96, 96},  {3, 100, 50},  {19, 130, 65},  {5, 200, 8},   {10, 1000, 125},
    {2, 64, 64},   {7, 66, 33},   {6, 256, 128}, {5, 512, 256}, {3, 8320, 128}, {3, 8200, 41}, {9, 384, 64},
};
#define N_ODD_SHAPES (sizeof odd_shapes / sizeof odd_shapes[0])

static void run_and_check(const int_matrix* m, const float* x, int n_rows, cpu_simd_level level, bool exact_sums,
                          const char* format_name) {
    char what[160];
    snprintf(what, sizeof what, "%s %dx%d group %d, %d rows, %s", format_name, m->w.rows, m->w.cols, m->w.group_size,
             n_rows, cpu_simd_level_name(level));
    float* out = alloc_out(n_rows, m->w.rows);
    matmul_at_level(out, x, n_rows, &m->w, NULL, level, NULL);
    if (m->w.activation_bits == 8) {
        float* expected = alloc_out(n_rows, m->w.rows);
        expected_w8a8(m, x, n_rows, expected);
        for (size_t k = 0; k < (size_t)n_rows * (size_t)m->w.rows; k++) {
            if (memcmp(&out[k], &expected[k], sizeof(float)) != 0)
                fail_msg("%s: out[%zu] = %.9g, the integer math gives %.9g", what, k, out[k], expected[k]);
        }
        if (!exact_sums) check_w8a8_close(m, x, n_rows, out, what);
        free(expected);
    } else {
        check_against_reference(m, x, n_rows, out, exact_sums, what);
    }
    free(out);
}

static void test_matches_reference(void** state) {
    (void)state;
    const int batch_sizes[] = {1, 2, 5, 13};
    for (size_t s = 0; s < N_ODD_SHAPES; s++) {
        const shape* sh = &odd_shapes[s];
        for (int f = 0; f < N_FORMATS; f++) {
            int_matrix m = make_int_matrix(&formats[f], sh->rows, sh->cols, sh->group_size, VALUES_RANDOM);
            for (int b = 0; b < 4; b++) {
                float* x = random_rows(batch_sizes[b], sh->cols, VALUES_RANDOM);
                for (int k = 0; k < N_LEVELS; k++) {
                    if (!test_simd_level_available(all_levels[k])) continue;
                    run_and_check(&m, x, batch_sizes[b], all_levels[k], false, formats[f].name);
                }
                free(x);
            }
            free_int_matrix(&m);
        }
    }
}

// Scales 2^-2 .. 2^0, activations in quarters, |c| <= 255, at most 8
// groups of at most 257 values: every partial sum is a multiple of 2^-4
// below 8 * 255 * 257 < 2^19, exact in fp32 in any order, so every level
// must return exactly the double reference. A wrong column, code, zero-point or scale cannot hide
// in rounding here.
static void test_exact_when_representable(void** state) {
    (void)state;
    for (size_t s = 0; s < N_ODD_SHAPES; s++) {
        const shape* sh = &odd_shapes[s];
        if (sh->cols / sh->group_size > 8 || sh->group_size > 257) continue;
        for (int f = 0; f < N_FORMATS; f++) {
            if (formats[f].activation_bits == 8) continue; // exact by construction: test_matches_reference
            int_matrix m = make_int_matrix(&formats[f], sh->rows, sh->cols, sh->group_size, VALUES_DYADIC);
            float* x = random_rows(5, sh->cols, VALUES_DYADIC);
            for (int k = 0; k < N_LEVELS; k++) {
                if (!test_simd_level_available(all_levels[k])) continue;
                for (int n_rows = 1; n_rows <= 5; n_rows += 2)
                    run_and_check(&m, x, n_rows, all_levels[k], true, formats[f].name);
            }
            free(x);
            free_int_matrix(&m);
        }
    }
}

// W4A16 rounds every activation to bf16, on every path: rows rounded once
// per call for the tile kernels (64, 1000 and 8200 columns) and for the
// phase kernels (256 and 8320 columns in groups of 128). x = d +- 2^-12 with d a nonzero quarter
// of magnitude <= 1: bf16 rounding gives d back (2^-12 is under half a
// bf16 step at 0.25), and with d every product and sum is exact in fp32
// (multiples of 2^-4 below 2^17), so the result must equal the double
// reference on d exactly. A path that skipped the rounding would be off
// by the 2^-12 terms.
static void test_w4a16_rounds_activations(void** state) {
    (void)state;
    const shape shapes[] = {{7, 64, 32}, {13, 1000, 125}, {3, 8200, 41}, {6, 256, 128}, {3, 8320, 128}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shape* sh = &shapes[s];
        for (int f = 2; f <= 3; f++) { // W4A16 sym and asym
            int_matrix m = make_int_matrix(&formats[f], sh->rows, sh->cols, sh->group_size, VALUES_DYADIC);
            const int n_rows = 13;
            float* x = random_rows(n_rows, sh->cols, VALUES_DYADIC);
            for (size_t i = 0; i < (size_t)n_rows * (size_t)sh->cols; i++) {
                float d = (float)random_int(1, 4) / 4.0f * (random_int(0, 1) ? 1.0f : -1.0f);
                x[i] = d + (random_int(0, 1) ? 1.0f : -1.0f) * ldexpf(1.0f, -12);
                assert_true(reference_bf16(x[i]) == d);
            }
            for (int k = 0; k < N_LEVELS; k++) {
                if (!test_simd_level_available(all_levels[k])) continue;
                for (int rows = 1; rows <= n_rows; rows += 4)
                    run_and_check(&m, x, rows, all_levels[k], true, formats[f].name);
            }
            free(x);
            free_int_matrix(&m);
        }
    }
}

// W8A8 gives the same bits at every level (integer sums are exact and the
// float combination is fixed); so does the no-scratch fallback.
static void test_w8a8_levels_identical(void** state) {
    (void)state;
    const shape shapes[] = {{37, 300, 100}, {8, 1000, 1000}, {21, 129, 43}, {5, 7, 7}};
    for (size_t s = 0; s < 4; s++) {
        const shape* sh = &shapes[s];
        int_matrix m = make_int_matrix(&formats[4], sh->rows, sh->cols, sh->group_size, VALUES_RANDOM);
        const int n_rows = 9;
        float* x = random_rows(n_rows, sh->cols, VALUES_RANDOM);
        float* scalar = alloc_out(n_rows, sh->rows);
        float* other = alloc_out(n_rows, sh->rows);
        matmul_at_level(scalar, x, n_rows, &m.w, NULL, CPU_SIMD_SCALAR, NULL);
        for (int k = 1; k < N_LEVELS; k++) {
            if (!test_simd_level_available(all_levels[k])) continue;
            matmul_at_level(other, x, n_rows, &m.w, NULL, all_levels[k], NULL);
            assert_memory_equal(scalar, other, (size_t)n_rows * (size_t)sh->rows * sizeof(float));
        }
        memset(other, 0xff, (size_t)n_rows * (size_t)sh->rows * sizeof(float));
        matmul_w8a8_unbuffered(other, x, n_rows, &m.w, 0, sh->rows);
        assert_memory_equal(scalar, other, (size_t)n_rows * (size_t)sh->rows * sizeof(float));
        free(other);
        free(scalar);
        free(x);
        free_int_matrix(&m);
    }
}

// ---- W8A8 activation quantization --------------------------------------------

static void check_quantize_row(const float* x, int cols) {
    int8_t* expected = malloc((size_t)cols + 1);
    int8_t* codes = malloc((size_t)cols + 1);
    assert_true(expected && codes);
    float expected_scale = expected_activation_codes(x, cols, expected);
    float scale;
    matmul_quantize_row(codes, &scale, x, cols);
    assert_memory_equal(codes, expected, (size_t)cols);
    assert_true(memcmp(&scale, &expected_scale, sizeof scale) == 0 || (isnan(scale) && isnan(expected_scale)));
    if (test_simd_level_available(CPU_SIMD_AVX2)) {
        memset(codes, 0x55, (size_t)cols);
        matmul_quantize_row_avx2(codes, &scale, x, cols);
        assert_memory_equal(codes, expected, (size_t)cols);
        assert_true(memcmp(&scale, &expected_scale, sizeof scale) == 0 || (isnan(scale) && isnan(expected_scale)));
    }
    free(codes);
    free(expected);
}

static void test_quantize_row(void** state) {
    (void)state;
    // max 127 gives a_scale 1: the codes are x rounded half to even.
    const float ties[] = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f, 3.49f, -127.0f, 0.0f};
    int8_t codes[12];
    float scale;
    matmul_quantize_row(codes, &scale, ties, 12);
    const int8_t rounded[] = {127, 0, 2, 2, 0, -2, -2, 126, -126, 3, -127, 0};
    assert_true(scale == 1.0f);
    assert_memory_equal(codes, rounded, sizeof rounded);
    check_quantize_row(ties, 12);
    // Lengths around the SIMD widths, and the special rows.
    for (int cols = 1; cols <= 100; cols += 3) {
        float* x = random_rows(1, cols, VALUES_RANDOM);
        check_quantize_row(x, cols);
        x[cols / 2] = 0.0f * x[0];
        check_quantize_row(x, cols);
        free(x);
    }
    float special[40] = {0};
    check_quantize_row(special, 40); // zero row: scale 0, codes 0
    special[7] = 1e-44f;             // subnormal: max / 127 underflows to 0
    check_quantize_row(special, 40);
    special[33] = NAN;
    check_quantize_row(special, 40);
    special[33] = -INFINITY;
    check_quantize_row(special, 40);
}

// A zero row gives 0 (not NaN); a row holding NaN or inf gives NaN; other
// rows of the batch are not affected.
static void test_w8a8_special_rows(void** state) {
    (void)state;
    int_matrix m = make_int_matrix(&formats[4], 40, 64, 16, VALUES_RANDOM);
    float* x = random_rows(4, 64, VALUES_RANDOM);
    memset(x + 64, 0, 64 * sizeof(float)); // row 1: zeros
    x[2 * 64 + 5] = NAN;                   // row 2
    x[3 * 64 + 63] = INFINITY;             // row 3
    float* alone = alloc_out(1, 40);
    float* out = alloc_out(4, 40);
    for (int k = 0; k < N_LEVELS; k++) {
        if (!test_simd_level_available(all_levels[k])) continue;
        matmul_at_level(out, x, 4, &m.w, NULL, all_levels[k], NULL);
        matmul_at_level(alone, x, 1, &m.w, NULL, all_levels[k], NULL);
        assert_memory_equal(out, alone, 40 * sizeof(float));
        for (int o = 0; o < 40; o++) {
            assert_true(isfinite(out[o]));
            assert_true(out[40 + o] == 0.0f);
            assert_true(isnan(out[80 + o]));
            assert_true(isnan(out[120 + o]));
        }
    }
    free(out);
    free(alone);
    free(x);
    free_int_matrix(&m);
}

// activation_bits = 8 means W8A8 only for symmetric INT8; other packed
// matrices keep fp32 activations and give the same bits as without it.
static void test_activation_bits_ignored_elsewhere(void** state) {
    (void)state;
    for (int f = 0; f < 4; f++) {
        if (formats[f].dtype == WEIGHT_I8 && !formats[f].asymmetric) continue;
        int_matrix m = make_int_matrix(&formats[f], 20, 96, 32, VALUES_RANDOM);
        float* x = random_rows(3, 96, VALUES_RANDOM);
        float a[60], b[60];
        for (int k = 0; k < N_LEVELS; k++) {
            if (!test_simd_level_available(all_levels[k])) continue;
            m.w.activation_bits = 0;
            matmul_at_level(a, x, 3, &m.w, NULL, all_levels[k], NULL);
            m.w.activation_bits = 8;
            matmul_at_level(b, x, 3, &m.w, NULL, all_levels[k], NULL);
            assert_memory_equal(a, b, sizeof a);
        }
        free(x);
        free_int_matrix(&m);
    }
}

// ---- batch invariance -----------------------------------------------------------

// Big enough that matmul_parallel splits the outputs between threads.
static const shape invariance_shapes[] = {
    {301, 517, 47},  // odd cols, odd groups: INT4 groups starting mid-byte
    {64, 1024, 128}, // the common layout: full vectors, whole bytes
    {130, 384, 384}, // per-channel
    {72, 768, 32},   // groups of 32: four to a step of the INT4 phase kernel, a scale per lane
};

static void check_invariance(const int_matrix* m, const char* format_name, cpu_simd_level level, thread_pool* pool,
                             int n_rows) {
    const int d_in = m->w.cols, d_out = m->w.rows;
    float* x = random_rows(n_rows, d_in, VALUES_RANDOM);
    float* x_reversed = random_rows(n_rows, d_in, VALUES_RANDOM);
    float* batch = alloc_out(n_rows, d_out);
    float* reversed = alloc_out(n_rows, d_out);
    float* single = alloc_out(1, d_out);
    for (int r = 0; r < n_rows; r++)
        memcpy(x_reversed + (size_t)r * d_in, x + (size_t)(n_rows - 1 - r) * d_in, (size_t)d_in * sizeof(float));
    matmul_at_level(batch, x, n_rows, &m->w, pool, level, NULL);
    matmul_at_level(reversed, x_reversed, n_rows, &m->w, pool, level, NULL);
    char what[160];
    snprintf(what, sizeof what, "%s %dx%d group %d, %s, %d threads", format_name, d_out, d_in, m->w.group_size,
             cpu_simd_level_name(level), thread_pool_size(pool));
    if (m->w.activation_bits == 0) check_against_reference(m, x, n_rows, batch, false, what);
    for (int r = 0; r < n_rows; r++) {
        memset(single, 0, (size_t)d_out * sizeof(float));
        matmul_at_level(single, x + (size_t)r * d_in, 1, &m->w, NULL, level, NULL);
        if (memcmp(single, batch + (size_t)r * d_out, (size_t)d_out * sizeof(float)) != 0)
            fail_msg("%s: row %d of %d differs from the same row alone", what, r, n_rows);
        if (memcmp(single, reversed + (size_t)(n_rows - 1 - r) * d_out, (size_t)d_out * sizeof(float)) != 0)
            fail_msg("%s: row %d moved to position %d changed its result", what, r, n_rows - 1 - r);
        matmul_at_level(single, x + (size_t)r * d_in, 1, &m->w, pool, level, NULL);
        if (memcmp(single, batch + (size_t)r * d_out, (size_t)d_out * sizeof(float)) != 0)
            fail_msg("%s: row %d alone on the pool differs", what, r);
    }
    free(single);
    free(reversed);
    free(batch);
    free(x_reversed);
    free(x);
}

// Batch sizes that leave every tile height (1 to 4 rows) somewhere: a
// result that depended on its tile would differ from the row alone.
static const int invariance_batches[] = {2, 6, 7, 13};

static void test_batch_invariance(void** state) {
    (void)state;
    for (int threads = 1; threads <= 3; threads++) {
        thread_pool* pool;
        assert_int_equal(thread_pool_create(threads, &pool), 0);
        for (size_t s = 0; s < sizeof invariance_shapes / sizeof invariance_shapes[0]; s++) {
            const shape* sh = &invariance_shapes[s];
            for (int f = 0; f < N_FORMATS; f++) {
                int_matrix m = make_int_matrix(&formats[f], sh->rows, sh->cols, sh->group_size, VALUES_RANDOM);
                for (int k = 0; k < N_LEVELS; k++) {
                    if (!test_simd_level_available(all_levels[k])) continue;
                    for (int b = 0; b < 4; b++)
                        check_invariance(&m, formats[f].name, all_levels[k], pool, invariance_batches[b]);
                    if (threads == 2 && s == 1) check_invariance(&m, formats[f].name, all_levels[k], pool, 40);
                }
                free_int_matrix(&m);
            }
        }
        thread_pool_free(pool);
    }
}

// The INT4 phase kernel reorders the activations once per call
// (matmul_at_level) or, without that buffer, per chunk into its own scratch
// (matmul_i4_avx512 on plain rows): both give the same bits.
static void test_i4_phase_order_prepared_or_not(void** state) {
    (void)state;
    if (!test_simd_level_available(CPU_SIMD_AVX512)) {
        print_message("skipping: no AVX-512 on this CPU, so no phase kernel to compare\n");
        skip();
    }
    const shape phase_shapes[] = {{6, 256, 128}, {37, 512, 256}, {9, 1024, 512}, {13, 256, 32}, {11, 768, 64}};
    for (int f = 2; f <= 3; f++) { // W4A16 sym and asym
        for (int s = 0; s < 5; s++) {
            const shape* sh = &phase_shapes[s];
            int_matrix m = make_int_matrix(&formats[f], sh->rows, sh->cols, sh->group_size, VALUES_RANDOM);
            for (int n_rows = 1; n_rows <= 6; n_rows++) {
                float* x = random_rows(n_rows, sh->cols, VALUES_RANDOM);
                float* prepared = alloc_out(n_rows, sh->rows);
                float* per_chunk = alloc_out(n_rows, sh->rows);
                matmul_at_level(prepared, x, n_rows, &m.w, NULL, CPU_SIMD_AVX512, NULL);
                matmul_i4_avx512(per_chunk, x, n_rows, &m.w, 0, sh->rows);
                if (memcmp(prepared, per_chunk, (size_t)n_rows * (size_t)sh->rows * sizeof(float)) != 0)
                    fail_msg("%s %dx%d group %d, %d rows: prepared and per-chunk phase order differ", formats[f].name,
                             sh->rows, sh->cols, sh->group_size, n_rows);
                free(per_chunk);
                free(prepared);
                free(x);
            }
            free_int_matrix(&m);
        }
    }
}

// The AVX512_BF16 W4A16 kernel against the fp32 phase kernel, both called
// directly on their own prepared inputs: the same bits, for 1 to 6 rows
// (every tile height), symmetric and asymmetric, on activations of every
// magnitude from 2^-40 to 2^40 (rounding to bf16 at every scale), and on
// rows with a NaN or an inf.
static void test_i4_bf16_same_bits(void** state) {
    (void)state;
    if (!test_simd_level_available(CPU_SIMD_AVX512) || !cpu_features_get()->avx512bf16) {
        print_message("skipping: no AVX512_BF16 on this CPU, so no bf16 kernel to compare\n");
        skip();
    }
    const shape bf16_shapes[] = {{6, 256, 128}, {37, 512, 256}, {9, 2048, 128}, {13, 256, 32}, {11, 768, 64}};
    for (int f = 2; f <= 3; f++) { // W4A16 sym and asym
        for (int s = 0; s < 5; s++) {
            const shape* sh = &bf16_shapes[s];
            int_matrix m = make_int_matrix(&formats[f], sh->rows, sh->cols, sh->group_size, VALUES_RANDOM);
            assert_true(matmul_i4_uses_phase_order(&m.w));
            for (int n_rows = 1; n_rows <= 6; n_rows++) {
                const size_t n_values = (size_t)n_rows * (size_t)sh->cols;
                float* x = random_rows(n_rows, sh->cols, VALUES_RANDOM);
                for (size_t i = 0; i < n_values; i++)
                    x[i] = ldexpf(x[i], random_int(-40, 40));
                if (n_rows == 5) x[3] = NAN, x[sh->cols + 7] = -INFINITY; // rows 0 and 1
                float* phased = malloc(n_values * sizeof(float));
                uint16_t* words = malloc(n_values * sizeof(uint16_t));
                float* by_fma = alloc_out(n_rows, sh->rows);
                float* by_bf16 = alloc_out(n_rows, sh->rows);
                assert_true(phased && words);
                matmul_i4_phase_order_avx512(phased, x, n_rows, sh->cols);
                matmul_i4_bf16_order_avx512(words, x, n_rows, sh->cols);
                matmul_i4_phased_avx512(by_fma, phased, n_rows, &m.w, 0, sh->rows);
                matmul_i4_bf16_avx512(by_bf16, words, n_rows, &m.w, 0, sh->rows);
                for (size_t k = 0; k < (size_t)n_rows * (size_t)sh->rows; k++) {
                    if (memcmp(&by_fma[k], &by_bf16[k], sizeof(float)) != 0 && !(isnan(by_fma[k]) && isnan(by_bf16[k])))
                        fail_msg("%s %dx%d group %d, %d rows: out[%zu] = %a by fma, %a by vdpbf16ps", formats[f].name,
                                 sh->rows, sh->cols, sh->group_size, n_rows, k, by_fma[k], by_bf16[k]);
                }
                if (n_rows == 5) assert_true(isnan(by_bf16[0])); // the NaN reaches its row's outputs
                free(by_bf16);
                free(by_fma);
                free(words);
                free(phased);
                free(x);
            }
            free_int_matrix(&m);
        }
    }
}

// W4A16 outside the phase kernels: matmul_at_level rounds the rows to bf16
// once per call; without that block each level's kernel rounds them as it
// loads them. Both give the same bits.
static void test_i4_rows_prepared_or_not(void** state) {
    (void)state;
    const shape row_shapes[] = {{37, 200, 40}, {9, 1000, 125}, {5, 8200, 41}};
    for (int f = 2; f <= 3; f++) { // W4A16 sym and asym
        for (int s = 0; s < 3; s++) {
            const shape* sh = &row_shapes[s];
            int_matrix m = make_int_matrix(&formats[f], sh->rows, sh->cols, sh->group_size, VALUES_RANDOM);
            for (int n_rows = 1; n_rows <= 13; n_rows += 6) {
                float* x = random_rows(n_rows, sh->cols, VALUES_RANDOM);
                float* prepared = alloc_out(n_rows, sh->rows);
                float* per_chunk = alloc_out(n_rows, sh->rows);
                for (int k = 0; k < N_LEVELS; k++) {
                    if (!test_simd_level_available(all_levels[k])) continue;
                    matmul_at_level(prepared, x, n_rows, &m.w, NULL, all_levels[k], NULL);
                    if (all_levels[k] == CPU_SIMD_AVX512)
                        matmul_i4_avx512(per_chunk, x, n_rows, &m.w, 0, sh->rows);
                    else if (all_levels[k] == CPU_SIMD_AVX2)
                        matmul_i4_avx2(per_chunk, x, n_rows, &m.w, 0, sh->rows);
                    else
                        matmul_int_scalar(per_chunk, x, n_rows, &m.w, 0, sh->rows);
                    if (memcmp(prepared, per_chunk, (size_t)n_rows * (size_t)sh->rows * sizeof(float)) != 0)
                        fail_msg("%s %dx%d group %d, %d rows, %s: prepared and per-chunk rounding differ",
                                 formats[f].name, sh->rows, sh->cols, sh->group_size, n_rows,
                                 cpu_simd_level_name(all_levels[k]));
                }
                free(per_chunk);
                free(prepared);
                free(x);
            }
            free_int_matrix(&m);
        }
    }
}

// The set and the gated pair in every integer format: W8A8 quantizes and
// the INT4 phase kernel reorders each matrix's input as matmul_parallel does.
static void test_set_and_gated_pair_equal_separate_calls(void** state) {
    (void)state;
    for (int f = 0; f < N_FORMATS; f++) {
        int_matrix m[3] = {make_int_matrix(&formats[f], 320, 256, 128, VALUES_RANDOM),
                           make_int_matrix(&formats[f], 320, 256, 128, VALUES_RANDOM),
                           make_int_matrix(&formats[f], 48, 256, 128, VALUES_RANDOM)};
        const weight_matrix* w[3] = {&m[0].w, &m[1].w, &m[2].w};
        for (int n_rows = 1; n_rows <= 7; n_rows += 6) {
            float* x = random_rows(n_rows, 256, VALUES_RANDOM);
            check_set_matches_separate_calls(w, 3, x, n_rows, formats[f].name);
            free(x);
        }
        for (int k = 0; k < 3; k++)
            free_int_matrix(&m[k]);
    }
}

// A set whose matrices prepare their shared input differently (W8A8 codes
// and scale, W4A16 bf16 rows or phase-ordered words): each prepared block
// is its own, although all come from one stack arena per call.
static void test_set_of_mixed_formats(void** state) {
    (void)state;
    int_matrix m[3] = {make_int_matrix(&formats[4], 96, 256, 128, VALUES_RANDOM),
                       make_int_matrix(&formats[2], 64, 256, 32, VALUES_RANDOM),
                       make_int_matrix(&formats[3], 80, 256, 128, VALUES_RANDOM)};
    const weight_matrix* w[3] = {&m[0].w, &m[1].w, &m[2].w};
    for (int n_rows = 1; n_rows <= 5; n_rows += 4) {
        float* x = random_rows(n_rows, 256, VALUES_RANDOM);
        check_set_matches_separate_calls(w, 3, x, n_rows, "W8A8 + W4A16 sym g32 + W4A16 asym g128");
        free(x);
    }
    for (int k = 0; k < 3; k++)
        free_int_matrix(&m[k]);
}

// matmul() and matmul_parallel() use the process's level.
static void test_entry_points_agree(void** state) {
    (void)state;
    for (int f = 0; f < N_FORMATS; f++) {
        int_matrix m = make_int_matrix(&formats[f], 130, 200, 40, VALUES_RANDOM);
        float* x = random_rows(5, 200, VALUES_RANDOM);
        float a[5 * 130], b[5 * 130], c[5 * 130];
        thread_pool* pool;
        assert_int_equal(thread_pool_create(2, &pool), 0);
        matmul(a, x, 5, &m.w, NULL);
        matmul_parallel(b, x, 5, &m.w, pool, NULL);
        matmul_at_level(c, x, 5, &m.w, NULL, cpu_simd_level_selected(), NULL);
        assert_memory_equal(a, b, sizeof a);
        assert_memory_equal(a, c, sizeof a);
        thread_pool_free(pool);
        free(x);
        free_int_matrix(&m);
    }
}

// ---- bytes, traffic and dequantized rows -----------------------------------------

static void test_traffic_counts(void** state) {
    (void)state;
    // Odd cols (a half-used last INT4 byte), per-channel; and 4 groups per row.
    const shape shapes[] = {{7, 173, 173}, {7, 172, 43}};
    thread_pool* pool;
    assert_int_equal(thread_pool_create(2, &pool), 0);
    for (int s = 0; s < 2; s++) {
        const int rows = shapes[s].rows, cols = shapes[s].cols, groups = cols / shapes[s].group_size;
        for (int f = 0; f < N_FORMATS; f++) {
            int_matrix m = make_int_matrix(&formats[f], rows, cols, shapes[s].group_size, VALUES_RANDOM);
            uint64_t row_bytes = formats[f].dtype == WEIGHT_I4 ? (uint64_t)(cols + 1) / 2 : (uint64_t)cols;
            uint64_t per_row = row_bytes + 2 * (uint64_t)groups + (formats[f].asymmetric ? (uint64_t)groups : 0);
            assert_int_equal(weight_matrix_bytes(&m.w), rows * per_row);
            float* x = random_rows(13, cols, VALUES_RANDOM);
            float out[13 * 7];
            kernel_traffic t = {1, 2, 3, 4, 5, 6}; // calls add to what is there
            matmul_at_level(out, x, 13, &m.w, pool, CPU_SIMD_AVX512, &t);
            assert_int_equal(t.weight_bytes_read, 1 + rows * per_row); // once for the whole batch
            assert_int_equal(t.kv_bytes_read, 2);
            assert_int_equal(t.kv_bytes_written, 3);
            assert_int_equal(t.activation_bytes, 4 + 13 * (uint64_t)(cols + rows) * 4);
            assert_int_equal(t.matmul_flops, 5 + 2 * 13 * (uint64_t)cols * rows);
            assert_int_equal(t.attention_flops, 6);
            // An embedding lookup reads one row and its groups' scales and zero-points.
            kernel_traffic lookup = {0};
            float decoded[173];
            weight_row_to_f32(decoded, &m.w, 3, &lookup);
            assert_int_equal(lookup.weight_bytes_read, per_row);
            assert_int_equal(lookup.activation_bytes, (uint64_t)cols * 4);
            free(x);
            free_int_matrix(&m);
        }
    }
    // The empty batch: nothing written, the weights still counted (as for the other dtypes).
    int_matrix m = make_int_matrix(&formats[4], 40, 24, 8, VALUES_RANDOM);
    float out[4] = {1, 2, 3, 4};
    kernel_traffic t = {0};
    matmul_parallel(out, NULL, 0, &m.w, pool, &t);
    assert_true(out[0] == 1 && out[3] == 4);
    assert_int_equal(t.weight_bytes_read, 40 * (24 + 3 * 2));
    assert_int_equal(t.activation_bytes, 0);
    free_int_matrix(&m);
    thread_pool_free(pool);
}

// weight_row_to_f32 gives scale * (q - zero), rounded once to fp32.
static void test_row_to_f32(void** state) {
    (void)state;
    for (size_t s = 0; s < N_ODD_SHAPES; s++) {
        const shape* sh = &odd_shapes[s];
        for (int f = 0; f < N_FORMATS; f++) {
            int_matrix m = make_int_matrix(&formats[f], sh->rows, sh->cols, sh->group_size, VALUES_RANDOM);
            float* row = malloc((size_t)sh->cols * sizeof(float));
            assert_non_null(row);
            for (int o = 0; o < sh->rows; o++) {
                weight_row_to_f32(row, &m.w, o, NULL);
                for (int i = 0; i < sh->cols; i++) {
                    float want = (float)m.exact[(size_t)o * (size_t)sh->cols + (size_t)i];
                    if (memcmp(&row[i], &want, sizeof want) != 0)
                        fail_msg("%s %dx%d group %d: row %d col %d = %.9g, expected %.9g", formats[f].name, sh->rows,
                                 sh->cols, sh->group_size, o, i, row[i], want);
                }
            }
            free(row);
            free_int_matrix(&m);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_features_vnni),
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_exact_when_representable),
        cmocka_unit_test(test_w4a16_rounds_activations),
        cmocka_unit_test(test_w8a8_levels_identical),
        cmocka_unit_test(test_quantize_row),
        cmocka_unit_test(test_w8a8_special_rows),
        cmocka_unit_test(test_activation_bits_ignored_elsewhere),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_i4_phase_order_prepared_or_not),
        cmocka_unit_test(test_i4_bf16_same_bits),
        cmocka_unit_test(test_i4_rows_prepared_or_not),
        cmocka_unit_test(test_entry_points_agree),
        cmocka_unit_test(test_set_and_gated_pair_equal_separate_calls),
        cmocka_unit_test(test_set_of_mixed_formats),
        cmocka_unit_test(test_traffic_counts),
        cmocka_unit_test(test_row_to_f32),
    };
    return cmocka_run_group_tests_name("kernels/matmul_int", tests, NULL, NULL);
}
