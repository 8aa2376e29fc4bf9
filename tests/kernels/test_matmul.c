// matmul: correct against a double-precision reference for every dtype and
// SIMD level, batch-invariant to the bit (a row's outputs do not depend on
// the batch size, its position in the batch, or the thread count), fp32
// identical to llama2.c's sequential loop, exact traffic counts; and the
// thread pool runs every task exactly once, run after run.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_simd.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/test_support.h"
#include "tests/kernels/matmul_set_check.h"

// ---- test data ----------------------------------------------------------------

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float random_uniform(void) { // in [-1, 1)
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

// A weight matrix with its payload, plus every value widened to double
// exactly as the kernel must see it (fp16 widened, q8 times its scale).
typedef struct test_matrix {
    weight_matrix w;
    void* values;  // (rows, cols) of the dtype
    float* scales; // (rows * cols / group_size) for Q8_0, else NULL
    double* exact; // (rows, cols) the values the kernel multiplies by
} test_matrix;

static test_matrix make_matrix(weight_dtype dtype, int rows, int cols, int group_size) {
    test_matrix m = {{dtype, rows, cols, dtype == WEIGHT_Q8_0 ? group_size : 0, NULL, NULL, NULL, NULL, 0, NULL, 0, NULL},
                     NULL, NULL, NULL};
    size_t count = (size_t)rows * (size_t)cols;
    float* source = malloc(count * sizeof(float));
    m.exact = malloc(count * sizeof(double));
    assert_non_null(source);
    assert_non_null(m.exact);
    for (size_t i = 0; i < count; i++)
        source[i] = random_uniform();
    if (dtype == WEIGHT_F32) {
        m.values = source;
        for (size_t i = 0; i < count; i++)
            m.exact[i] = source[i];
    } else if (dtype == WEIGHT_F16) {
        uint16_t* halves = malloc(count * sizeof(uint16_t));
        assert_non_null(halves);
        fp16_from_fp32_array(halves, source, count);
        for (size_t i = 0; i < count; i++)
            m.exact[i] = fp16_to_fp32(halves[i]);
        m.values = halves;
        free(source);
    } else {
        assert_int_equal(count % (size_t)group_size, 0);
        size_t n_groups = count / (size_t)group_size;
        int8_t* q = malloc(count);
        m.scales = malloc(n_groups * sizeof(float));
        assert_non_null(q);
        assert_non_null(m.scales);
        for (size_t g = 0; g < n_groups; g++) { // symmetric, max |v| -> 127
            float max_abs = 0.0f;
            for (size_t i = g * (size_t)group_size; i < (g + 1) * (size_t)group_size; i++)
                max_abs = fmaxf(max_abs, fabsf(source[i]));
            m.scales[g] = max_abs > 0.0f ? max_abs / 127.0f : 1.0f;
            for (size_t i = g * (size_t)group_size; i < (g + 1) * (size_t)group_size; i++) {
                q[i] = (int8_t)lrintf(source[i] / m.scales[g]);
                m.exact[i] = (double)q[i] * (double)m.scales[g];
            }
        }
        m.values = q;
        free(source);
    }
    m.w.values = m.values;
    m.w.scales = m.scales;
    return m;
}

static void free_matrix(test_matrix* m) {
    free(m->values);
    free(m->scales);
    free(m->exact);
}

static float* random_rows(int n_rows, int cols) {
    float* x = malloc((size_t)n_rows * (size_t)cols * sizeof(float));
    assert_non_null(x);
    for (size_t i = 0; i < (size_t)n_rows * (size_t)cols; i++)
        x[i] = random_uniform();
    return x;
}

// ---- SIMD levels ----------------------------------------------------------------

static const cpu_simd_level all_levels[] = {CPU_SIMD_SCALAR, CPU_SIMD_AVX2, CPU_SIMD_AVX512};
#define N_LEVELS 3

static void test_cpu_features(void** state) {
    (void)state;
    const cpu_features* f = cpu_features_get();
    // Each level implies the flags it uses.
    if (f->best >= CPU_SIMD_AVX2) assert_true(f->avx2 && f->fma && f->f16c);
    if (f->best >= CPU_SIMD_AVX512) assert_true(f->avx512f && f->avx512bw && f->avx512vl);
    assert_true(f->selected <= f->best);
    // The selected level is the environment's choice, lowered to the hardware.
    const char* forced = getenv("SERVELAB_SIMD");
    cpu_simd_level parsed;
    if (forced && forced[0] && cpu_simd_level_parse(forced, &parsed) == 0)
        assert_int_equal(f->selected, parsed < f->best ? parsed : f->best);
    else
        assert_int_equal(f->selected, f->best);
    assert_int_equal(f->env_ignored, forced && forced[0] && cpu_simd_level_parse(forced, &parsed) != 0);
    assert_int_equal(cpu_simd_level_selected(), f->selected);
    // Names round-trip; unknown names are refused.
    for (int k = 0; k < N_LEVELS; k++) {
        cpu_simd_level back;
        assert_int_equal(cpu_simd_level_parse(cpu_simd_level_name(all_levels[k]), &back), 0);
        assert_int_equal(back, all_levels[k]);
    }
    assert_int_equal(cpu_simd_level_parse("AVX2", &parsed), 0);
    assert_int_equal(parsed, CPU_SIMD_AVX2);
    assert_int_equal(cpu_simd_level_parse("sse4", &parsed), -1);
    assert_int_equal(cpu_simd_level_parse("", &parsed), -1);
    // Clamping lowers to the hardware and never raises.
    assert_int_equal(cpu_simd_level_clamp(CPU_SIMD_SCALAR), CPU_SIMD_SCALAR);
    assert_int_equal(cpu_simd_level_clamp(CPU_SIMD_AVX512), f->best);
    for (int k = 0; k < N_LEVELS; k++)
        test_simd_level_available(all_levels[k]); // under CI: all must exist
}

// ---- correctness against a double-precision reference -----------------------

typedef struct shape {
    int rows, cols, group_size; // group_size for Q8_0 only
} shape;

// Odd sizes on purpose: cols not a multiple of 8 or 16, a single column,
// odd row counts; Q8 groups that span rows (16 x 172 with group 64 is
// stories260K's w2 layout; 7 x 172 group 28; 6 x 30 group 45; 19 x 257
// group 19), groups of whole rows (9 x 40, group 120), groups shorter than a
// vector (group 10). A group must divide rows x cols, so 7 x 172 cannot take
// group 64.
static const shape odd_shapes[] = {
    {16, 172, 64}, {7, 172, 28}, {1, 1, 1},     {5, 3, 5},   {33, 17, 17},
    {9, 40, 120},  {16, 64, 32}, {13, 100, 10}, {6, 30, 45}, {19, 257, 19},
};

// Worst-case rounding bound for an fp32 dot product of n terms in any
// summation order: (n + a few) * FLT_EPSILON * sum |w_i x_i|. Rigorous, so
// the test cannot flake, yet a wrong index or scale misses by far more.
static void check_against_reference(const test_matrix* m, const float* x, int n_rows, const float* out,
                                    const char* what) {
    for (int r = 0; r < n_rows; r++) {
        for (int o = 0; o < m->w.rows; o++) {
            double sum = 0.0, sum_abs = 0.0;
            for (int i = 0; i < m->w.cols; i++) {
                double term =
                    m->exact[(size_t)o * (size_t)m->w.cols + (size_t)i] * x[(size_t)r * (size_t)m->w.cols + (size_t)i];
                sum += term;
                sum_abs += fabs(term);
            }
            double got = out[(size_t)r * (size_t)m->w.rows + (size_t)o];
            double bound = (m->w.cols + 8) * (double)FLT_EPSILON * sum_abs + 1e-30;
            if (!(fabs(got - sum) <= bound)) // NaN fails too
                fail_msg("%s: out[%d][%d] = %.9g, reference %.9g (bound %.3g)", what, r, o, got, sum, bound);
        }
    }
}

static void test_matches_double_reference(void** state) {
    (void)state;
    const weight_dtype dtypes[] = {WEIGHT_F32, WEIGHT_F16, WEIGHT_Q8_0};
    const int batch_sizes[] = {1, 3, 13};
    for (size_t s = 0; s < sizeof odd_shapes / sizeof odd_shapes[0]; s++) {
        for (int d = 0; d < 3; d++) {
            const shape* sh = &odd_shapes[s];
            test_matrix m = make_matrix(dtypes[d], sh->rows, sh->cols, sh->group_size);
            for (int b = 0; b < 3; b++) {
                int n_rows = batch_sizes[b];
                float* x = random_rows(n_rows, sh->cols);
                float* out = malloc((size_t)n_rows * (size_t)sh->rows * sizeof(float));
                for (int k = 0; k < N_LEVELS; k++) {
                    if (!test_simd_level_available(all_levels[k])) continue;
                    char what[128];
                    snprintf(what, sizeof what, "dtype %d %dx%d group %d, %d rows, %s", dtypes[d], sh->rows, sh->cols,
                             m.w.group_size, n_rows, cpu_simd_level_name(all_levels[k]));
                    matmul_at_level(out, x, n_rows, &m.w, NULL, all_levels[k], NULL);
                    check_against_reference(&m, x, n_rows, out, what);
                }
                free(out);
                free(x);
            }
            free_matrix(&m);
        }
    }
}

// A value that big in the wrong place, or a lost group scale, is caught even
// where the bound above is loose: every Q8 group here has its own scale.
static void test_q8_each_group_uses_its_own_scale(void** state) {
    (void)state;
    // 172 = 2 x 64 + 44: row 1 starts 44 values into group 2, and so on.
    test_matrix m = make_matrix(WEIGHT_Q8_0, 16, 172, 64);
    for (size_t g = 0; g < 16 * 172 / 64; g++)
        m.scales[g] = ldexpf(1.0f, (int)(g % 24) - 12); // 43 groups
    for (size_t i = 0; i < 16 * 172; i++)
        m.exact[i] = (double)((int8_t*)m.values)[i] * m.scales[i / 64];
    float* x = random_rows(3, 172);
    float out[3 * 16];
    for (int k = 0; k < N_LEVELS; k++) {
        if (!test_simd_level_available(all_levels[k])) continue;
        for (int n_rows = 1; n_rows <= 3; n_rows++) {
            matmul_at_level(out, x, n_rows, &m.w, NULL, all_levels[k], NULL);
            check_against_reference(&m, x, n_rows, out, cpu_simd_level_name(all_levels[k]));
        }
    }
    free(x);
    free_matrix(&m);
}

// ---- batch invariance -----------------------------------------------------------

// Big enough that matmul_parallel really splits the outputs between threads.
static const shape invariance_shapes[] = {
    {301, 517, 47},  // Q8: 517 = 11 x 47, every row holds whole groups (tiles of several outputs)
    {301, 517, 329}, // Q8: 329 = 7 x 47 divides neither way: groups span rows
    {64, 1000, 250}, // fp16: a 1000 = 62 x 16 + 8 tail
};

static void check_invariance(const test_matrix* m, cpu_simd_level level, thread_pool* pool, int n_rows) {
    const int d_in = m->w.cols, d_out = m->w.rows;
    float* x = random_rows(n_rows, d_in);
    float* batch = malloc((size_t)n_rows * (size_t)d_out * sizeof(float));
    float* reversed = malloc((size_t)n_rows * (size_t)d_out * sizeof(float));
    float* x_reversed = malloc((size_t)n_rows * (size_t)d_in * sizeof(float));
    float* single = malloc((size_t)d_out * sizeof(float));
    for (int r = 0; r < n_rows; r++)
        memcpy(x_reversed + (size_t)r * d_in, x + (size_t)(n_rows - 1 - r) * d_in, (size_t)d_in * sizeof(float));
    // NaN bytes in every output first: an element nobody writes cannot pass.
    memset(batch, 0xff, (size_t)n_rows * (size_t)d_out * sizeof(float));
    memset(reversed, 0xff, (size_t)n_rows * (size_t)d_out * sizeof(float));
    matmul_at_level(batch, x, n_rows, &m->w, pool, level, NULL);
    matmul_at_level(reversed, x_reversed, n_rows, &m->w, pool, level, NULL);
    char what[128];
    snprintf(what, sizeof what, "dtype %d %dx%d, %s, %d threads", m->w.dtype, d_out, d_in, cpu_simd_level_name(level),
             thread_pool_size(pool));
    check_against_reference(m, x, n_rows, batch, what);
    for (int r = 0; r < n_rows; r++) {
        // Alone, on one thread: the reference bits for row r.
        memset(single, 0, (size_t)d_out * sizeof(float));
        matmul_at_level(single, x + (size_t)r * d_in, 1, &m->w, NULL, level, NULL);
        if (memcmp(single, batch + (size_t)r * d_out, (size_t)d_out * sizeof(float)) != 0)
            fail_msg("dtype %d %dx%d, %s, %d threads: row %d of %d differs from the same row alone", m->w.dtype, d_out,
                     d_in, cpu_simd_level_name(level), thread_pool_size(pool), r, n_rows);
        if (memcmp(single, reversed + (size_t)(n_rows - 1 - r) * d_out, (size_t)d_out * sizeof(float)) != 0)
            fail_msg("dtype %d, %s: row %d moved to position %d changed its result", m->w.dtype,
                     cpu_simd_level_name(level), r, n_rows - 1 - r);
        // Alone, on the pool.
        matmul_at_level(single, x + (size_t)r * d_in, 1, &m->w, pool, level, NULL);
        if (memcmp(single, batch + (size_t)r * d_out, (size_t)d_out * sizeof(float)) != 0)
            fail_msg("dtype %d, %s: row %d alone on %d threads differs", m->w.dtype, cpu_simd_level_name(level), r,
                     thread_pool_size(pool));
    }
    free(single);
    free(x_reversed);
    free(reversed);
    free(batch);
    free(x);
}

static void test_batch_invariance(void** state) {
    (void)state;
    const weight_dtype dtypes[] = {WEIGHT_F32, WEIGHT_F16, WEIGHT_Q8_0};
    for (int threads = 1; threads <= 3; threads++) {
        thread_pool* pool;
        assert_int_equal(thread_pool_create(threads, &pool), 0);
        assert_int_equal(thread_pool_size(pool), threads);
        for (size_t s = 0; s < sizeof invariance_shapes / sizeof invariance_shapes[0]; s++) {
            for (int d = 0; d < 3; d++) {
                if (dtypes[d] != WEIGHT_Q8_0 && s == 1) continue; // group layout matters for Q8 only
                const shape* sh = &invariance_shapes[s];
                test_matrix m = make_matrix(dtypes[d], sh->rows, sh->cols, sh->group_size);
                for (int k = 0; k < N_LEVELS; k++) {
                    if (!test_simd_level_available(all_levels[k])) continue;
                    // 5, 10 and 13 rows: fp16 tiles of 5, 5 + 5 and 6 + 6 + 1 rows at AVX-512.
                    for (int n_rows = 5; n_rows <= 13; n_rows += n_rows == 5 ? 5 : 3)
                        check_invariance(&m, all_levels[k], pool, n_rows);
                    if (threads == 2 && s == 2) check_invariance(&m, all_levels[k], pool, 64);
                }
                free_matrix(&m);
            }
        }
        thread_pool_free(pool);
    }
}

// fp16 with many rows (a prefill chunk, a large batch): blocks of 12 rows
// in tiles of up to 6, groups of 64 outputs, every row still with the bits
// it has alone. Shapes with every kind of edge: outputs not a multiple of
// the tile's 4 or of the group's 64, columns with a tail (1555 = 97 x 16 +
// 3), exactly one vector, one vector and a tail, less than a vector; row
// counts that end a block part-way and split unevenly into tiles.
static void test_f16_many_rows_same_bits(void** state) {
    (void)state;
    static const int shapes[][2] = {{37, 1555}, {100, 1555}, {130, 16}, {9, 17}, {12, 7}, {41, 768}};
    static const int row_counts[] = {31, 32, 37, 63};
    for (int threads = 1; threads <= 2; threads++) {
        thread_pool* pool;
        assert_int_equal(thread_pool_create(threads, &pool), 0);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            test_matrix m = make_matrix(WEIGHT_F16, shapes[s][0], shapes[s][1], 0);
            for (int k = 0; k < N_LEVELS; k++) {
                if (!test_simd_level_available(all_levels[k])) continue;
                for (size_t n = 0; n < sizeof row_counts / sizeof row_counts[0]; n++)
                    check_invariance(&m, all_levels[k], pool, row_counts[n]);
            }
            free_matrix(&m);
        }
        thread_pool_free(pool);
    }
}

// The fp16 tile layout holds each value where matmul.h says, +0 in the
// padding, and a view from row 4k on starts at its group.
static void test_f16_tile_layout(void** state) {
    (void)state;
    static const int shapes[][2] = {{1, 1}, {4, 16}, {5, 17}, {7, 33}, {12, 768}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int rows = shapes[s][0], cols = shapes[s][1];
        test_matrix m = make_matrix(WEIGHT_F16, rows, cols, 0);
        const int groups = (rows + 3) / 4, steps = (cols + 15) / 16;
        assert_int_equal(matmul_f16_tile_halves(rows, cols), (size_t)groups * (size_t)steps * 64);
        uint16_t* tiles = malloc(matmul_f16_tile_halves(rows, cols) * sizeof(uint16_t));
        assert_non_null(tiles);
        matmul_f16_fill_tiles(tiles, &m.w);
        const uint16_t* values = m.values;
        for (int g = 0; g < groups; g++)
            for (int k = 0; k < steps; k++)
                for (int c = 0; c < 4; c++)
                    for (int j = 0; j < 16; j++) {
                        int row = 4 * g + c, col = 16 * k + j;
                        uint16_t want = row < rows && col < cols ? values[(size_t)row * (size_t)cols + (size_t)col] : 0;
                        assert_int_equal(tiles[(((size_t)g * (size_t)steps + (size_t)k) * 4 + (size_t)c) * 16 + (size_t)j],
                                         want);
                    }
        assert_null(matmul_f16_tiles_from_row(&m.w, 0)); // no tiles yet
        m.w.f16_tiles = tiles;
        assert_ptr_equal(matmul_f16_tiles_from_row(&m.w, 0), tiles);
        if (rows > 4) assert_ptr_equal(matmul_f16_tiles_from_row(&m.w, 4), tiles + (size_t)steps * 64);
        assert_null(matmul_f16_tiles_from_row(&m.w, 1));
        free(tiles);
        free_matrix(&m);
    }
}

// With tiles the AVX-512 fp16 kernel gives the row-major kernel's bits, for
// row counts that fill tiles of 1-6 rows and blocks of 12, rows and columns
// that leave partial groups and steps, on 1 and 2 threads; and reading the
// tiles is what it does (tiles holding other values change its results).
static void test_f16_tiles_same_bits(void** state) {
    (void)state;
    if (!test_simd_level_available(CPU_SIMD_AVX512)) return;
    static const int shapes[][2] = {{1, 5}, {9, 17}, {13, 40}, {64, 768}, {130, 200}, {300, 2048}};
    static const int row_counts[] = {1, 2, 3, 5, 6, 7, 12, 13, 16, 31};
    for (int threads = 1; threads <= 2; threads++) {
        thread_pool* pool;
        assert_int_equal(thread_pool_create(threads, &pool), 0);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int rows = shapes[s][0], cols = shapes[s][1];
            test_matrix m = make_matrix(WEIGHT_F16, rows, cols, 0);
            uint16_t* tiles = malloc(matmul_f16_tile_halves(rows, cols) * sizeof(uint16_t));
            assert_non_null(tiles);
            matmul_f16_fill_tiles(tiles, &m.w);
            for (size_t n = 0; n < sizeof row_counts / sizeof row_counts[0]; n++) {
                const int n_rows = row_counts[n];
                float* x = random_rows(n_rows, cols);
                float* plain = malloc((size_t)n_rows * (size_t)rows * sizeof(float));
                float* tiled = malloc((size_t)n_rows * (size_t)rows * sizeof(float));
                assert_non_null(plain);
                assert_non_null(tiled);
                m.w.f16_tiles = NULL;
                matmul_at_level(plain, x, n_rows, &m.w, pool, CPU_SIMD_AVX512, NULL);
                m.w.f16_tiles = tiles;
                matmul_at_level(tiled, x, n_rows, &m.w, pool, CPU_SIMD_AVX512, NULL);
                assert_memory_equal(plain, tiled, (size_t)n_rows * (size_t)rows * sizeof(float));
                free(x);
                free(plain);
                free(tiled);
            }
            // Zeroed tiles: every output 0, so the tiles (not the values) were read.
            memset(tiles, 0, matmul_f16_tile_halves(rows, cols) * sizeof(uint16_t));
            float* x = random_rows(3, cols);
            float* out = malloc(3 * (size_t)rows * sizeof(float));
            assert_non_null(out);
            matmul_at_level(out, x, 3, &m.w, pool, CPU_SIMD_AVX512, NULL);
            for (size_t i = 0; i < 3 * (size_t)rows; i++) assert_true(out[i] == 0.0f);
            free(x);
            free(out);
            m.w.f16_tiles = NULL;
            free(tiles);
            free_matrix(&m);
        }
        thread_pool_free(pool);
    }
}

// matmul() and matmul_parallel() use the process's level and give the same
// bits as matmul_at_level at that level, on any pool.
static void test_entry_points_agree(void** state) {
    (void)state;
    test_matrix m = make_matrix(WEIGHT_F16, 130, 200, 0);
    float* x = random_rows(5, 200);
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
    free_matrix(&m);
}

// q, k, v as one set and w1, w3 as a gated pair: every dtype, rows that
// split into chunks and a small matrix that runs on the caller alone, a
// set larger than MATMUL_SET_MAX (run as two), and 1 row (decode) or 5.
static void test_set_and_gated_pair_equal_separate_calls(void** state) {
    (void)state;
    const weight_dtype dtypes[] = {WEIGHT_F32, WEIGHT_F16, WEIGHT_Q8_0};
    const char* names[] = {"fp32", "fp16", "q8_0"};
    for (int d = 0; d < 3; d++) {
        // Rows: 360 and 360 (a pair), 40, then 3 x 200 (past the set's maximum).
        test_matrix m[6] = {make_matrix(dtypes[d], 360, 256, 32), make_matrix(dtypes[d], 360, 256, 32),
                            make_matrix(dtypes[d], 40, 256, 32),  make_matrix(dtypes[d], 200, 256, 32),
                            make_matrix(dtypes[d], 200, 256, 32), make_matrix(dtypes[d], 200, 256, 32)};
        const weight_matrix* w[6];
        for (int k = 0; k < 6; k++) w[k] = &m[k].w;
        for (int n_rows = 1; n_rows <= 5; n_rows += 4) {
            float* x = random_rows(n_rows, 256);
            check_set_matches_separate_calls(w, 3, x, n_rows, names[d]);
            check_set_matches_separate_calls(w, 6, x, n_rows, names[d]);
            free(x);
        }
        for (int k = 0; k < 6; k++) free_matrix(&m[k]);
    }
}

// ---- fp32: llama2.c's loop, bit for bit ---------------------------------------

static void test_f32_is_the_sequential_loop(void** state) {
    (void)state;
    const int d_out = 97, d_in = 331, n_rows = 6;
    test_matrix m = make_matrix(WEIGHT_F32, d_out, d_in, 0);
    float* x = random_rows(n_rows, d_in);
    float expected[6 * 97], got[6 * 97];
    const float* w = m.values;
    for (int r = 0; r < n_rows; r++) {
        for (int o = 0; o < d_out; o++) { // run.c's matmul: val += w[i * n + j] * x[j]
            float val = 0.0f;
            for (int j = 0; j < d_in; j++) {
                volatile float product = w[(size_t)o * d_in + j] * x[(size_t)r * d_in + j]; // no FMA contraction
                val += product;
            }
            expected[r * d_out + o] = val;
        }
    }
    for (int threads = 1; threads <= 3; threads++) {
        thread_pool* pool;
        assert_int_equal(thread_pool_create(threads, &pool), 0);
        for (int k = 0; k < N_LEVELS; k++) {
            memset(got, 0, sizeof got);
            matmul_at_level(got, x, n_rows, &m.w, pool, all_levels[k], NULL);
            assert_memory_equal(got, expected, sizeof got);
        }
        thread_pool_free(pool);
    }
    free(x);
    free_matrix(&m);
}

// ---- traffic -------------------------------------------------------------------

static void test_traffic_counts(void** state) {
    (void)state;
    const weight_dtype dtypes[] = {WEIGHT_F32, WEIGHT_F16, WEIGHT_Q8_0};
    const uint64_t expected_weight_bytes[] = {7 * 172 * 4, 7 * 172 * 2, 7 * 172 + 7 * 172 / 43 * 4};
    thread_pool* pool;
    assert_int_equal(thread_pool_create(2, &pool), 0);
    for (int d = 0; d < 3; d++) {
        test_matrix m = make_matrix(dtypes[d], 7, 172, 43);
        assert_int_equal(weight_matrix_bytes(&m.w), expected_weight_bytes[d]);
        float* x = random_rows(13, 172);
        float out[13 * 7];
        kernel_traffic t = {1, 2, 3, 4, 5, 6}; // calls add to what is there
        matmul_at_level(out, x, 13, &m.w, pool, CPU_SIMD_AVX512, &t);
        // The weights count once for the whole 13-row batch.
        assert_int_equal(t.weight_bytes_read, 1 + expected_weight_bytes[d]);
        assert_int_equal(t.kv_bytes_read, 2);
        assert_int_equal(t.kv_bytes_written, 3);
        assert_int_equal(t.activation_bytes, 4 + 13 * (172 + 7) * 4);
        assert_int_equal(t.matmul_flops, 5 + 2 * 13 * 172 * 7);
        assert_int_equal(t.attention_flops, 6);
        matmul(out, x, 1, &m.w, &t);
        assert_int_equal(t.weight_bytes_read, 1 + 2 * expected_weight_bytes[d]);
        assert_int_equal(t.matmul_flops, 5 + 2 * 14 * 172 * 7);
        free(x);
        free_matrix(&m);
    }
    thread_pool_free(pool);
}

// An empty batch writes nothing and still counts the weights (as before).
static void test_empty_batch(void** state) {
    (void)state;
    test_matrix m = make_matrix(WEIGHT_F16, 40, 24, 0);
    float out[4] = {1, 2, 3, 4};
    kernel_traffic t = {0};
    thread_pool* pool;
    assert_int_equal(thread_pool_create(2, &pool), 0);
    matmul_parallel(out, NULL, 0, &m.w, pool, &t);
    assert_true(out[0] == 1 && out[3] == 4);
    assert_int_equal(t.weight_bytes_read, 40 * 24 * 2);
    assert_int_equal(t.activation_bytes, 0);
    thread_pool_free(pool);
    free_matrix(&m);
}

// ---- thread pool ---------------------------------------------------------------

typedef struct count_ctx {
    atomic_int* runs;      // (n_tasks) times each task ran
    int n_threads;         // pool size: valid thread ids are 0 .. n_threads-1
    atomic_int bad_thread; // tasks that saw an out-of-range thread id
} count_ctx;

static void count_task(void* ctx, int task, int thread) {
    count_ctx* c = ctx;
    atomic_fetch_add(&c->runs[task], 1);
    if (thread < 0 || thread >= c->n_threads) atomic_fetch_add(&c->bad_thread, 1);
}

static void test_pool_runs_every_task_once(void** state) {
    (void)state;
    const int sizes[] = {1, 2, 3, 8};
    const int task_counts[] = {0, 1, 2, 7, 1000};
    for (int s = 0; s < 4; s++) {
        thread_pool* pool;
        assert_int_equal(thread_pool_create(sizes[s], &pool), 0);
        assert_int_equal(thread_pool_size(pool), sizes[s]);
        atomic_int runs[1000];
        count_ctx ctx = {runs, sizes[s], 0};
        const int repeats = 300; // reuse: the same pool, run after run
        for (int k = 0; k < 5; k++) {
            int n = task_counts[k];
            for (int t = 0; t < 1000; t++)
                atomic_init(&runs[t], 0);
            for (int rep = 0; rep < repeats; rep++)
                thread_pool_run(pool, n, count_task, &ctx);
            for (int t = 0; t < 1000; t++) {
                int want = t < n ? repeats : 0;
                if (atomic_load(&runs[t]) != want)
                    fail_msg("pool of %d, %d tasks: task %d ran %d times, expected %d", sizes[s], n, t,
                             atomic_load(&runs[t]), want);
            }
        }
        assert_int_equal(atomic_load(&ctx.bad_thread), 0);
        thread_pool_free(pool);
    }
}

// Every worker really takes part: with tasks that wait for each other, a
// run only finishes when all n threads hold a task at the same time.
typedef struct barrier_ctx {
    atomic_int arrived;
    int n_threads;
    atomic_int seen_thread[8]; // tasks run by each thread id
} barrier_ctx;

static void barrier_task(void* ctx, int task, int thread) {
    (void)task;
    barrier_ctx* b = ctx;
    atomic_fetch_add(&b->seen_thread[thread], 1);
    atomic_fetch_add(&b->arrived, 1);
    while (atomic_load(&b->arrived) < b->n_threads)
        usleep(100);
}

static void test_pool_uses_every_thread(void** state) {
    (void)state;
    thread_pool* pool;
    assert_int_equal(thread_pool_create(3, &pool), 0);
    barrier_ctx b = {0, 3, {0}};
    thread_pool_run(pool, 3, barrier_task, &b); // would hang if a worker never ran
    for (int t = 0; t < 3; t++)
        assert_int_equal(atomic_load(&b.seen_thread[t]), 1);
    thread_pool_free(pool);
}

// Each thread starts on its own contiguous span, in order, and a thread that
// is held up does not hold up the run: the other one takes its tasks from
// the back. Task 0 (the caller's first) waits until the worker has run more
// than its own half, which only stealing makes possible.
typedef struct steal_ctx {
    atomic_int runs_by_worker;   // tasks run by thread 1
    atomic_int timed_out;        // task 0 gave up waiting
    int n_tasks;
    int worker_order[64];        // (n_tasks) the tasks thread 1 ran, in the order it ran them
} steal_ctx;

static void steal_task(void* ctx, int task, int thread) {
    steal_ctx* c = ctx;
    if (thread == 1) c->worker_order[atomic_fetch_add(&c->runs_by_worker, 1)] = task;
    if (task != 0 || thread != 0) return;
    for (int waited_ms = 0; atomic_load(&c->runs_by_worker) <= c->n_tasks / 2; waited_ms++) {
        if (waited_ms == 10000) {
            atomic_store(&c->timed_out, 1);
            return;
        }
        usleep(1000);
    }
}

static void test_pool_threads_run_spans_and_take_a_held_up_threads_tasks(void** state) {
    (void)state;
    thread_pool* pool;
    assert_int_equal(thread_pool_create(2, &pool), 0);
    steal_ctx c = {0, 0, 64, {0}};
    thread_pool_run(pool, c.n_tasks, steal_task, &c);
    assert_int_equal(atomic_load(&c.timed_out), 0);
    int worker_runs = atomic_load(&c.runs_by_worker);
    assert_true(worker_runs > c.n_tasks / 2);
    // Its own span 32..63 in order, then the caller's from the back: 31, 30, ...
    for (int k = 0; k < worker_runs; k++)
        assert_int_equal(c.worker_order[k], k < 32 ? 32 + k : 31 - (k - 32));
    thread_pool_free(pool);
}

static void test_pool_sizes(void** state) {
    (void)state;
    static int not_a_pool;
    thread_pool* pool = (thread_pool*)&not_a_pool; // create() must overwrite it
    assert_int_equal(thread_pool_create(0, &pool), 0);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    assert_int_equal(thread_pool_size(pool), online > 0 ? online : 1);
    thread_pool_free(pool);
    assert_int_equal(thread_pool_create(THREAD_POOL_MAX_THREADS + 1, &pool), EINVAL);
    assert_null(pool);
    assert_int_equal(thread_pool_size(NULL), 1);
    thread_pool_free(NULL);
    // A NULL pool runs inline, as thread 0.
    atomic_int runs[5];
    for (int t = 0; t < 5; t++)
        atomic_init(&runs[t], 0);
    count_ctx ctx = {runs, 1, 0};
    thread_pool_run(NULL, 5, count_task, &ctx);
    for (int t = 0; t < 5; t++)
        assert_int_equal(atomic_load(&runs[t]), 1);
    assert_int_equal(atomic_load(&ctx.bad_thread), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_features),
        cmocka_unit_test(test_matches_double_reference),
        cmocka_unit_test(test_q8_each_group_uses_its_own_scale),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_f16_many_rows_same_bits),
        cmocka_unit_test(test_f16_tile_layout),
        cmocka_unit_test(test_f16_tiles_same_bits),
        cmocka_unit_test(test_entry_points_agree),
        cmocka_unit_test(test_set_and_gated_pair_equal_separate_calls),
        cmocka_unit_test(test_f32_is_the_sequential_loop),
        cmocka_unit_test(test_traffic_counts),
        cmocka_unit_test(test_empty_batch),
        cmocka_unit_test(test_pool_runs_every_task_once),
        cmocka_unit_test(test_pool_uses_every_thread),
        cmocka_unit_test(test_pool_threads_run_spans_and_take_a_held_up_threads_tasks),
        cmocka_unit_test(test_pool_sizes),
    };
    return cmocka_run_group_tests_name("kernels/matmul", tests, NULL, NULL);
}
