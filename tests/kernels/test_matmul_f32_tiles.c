// The fp32 tile layout (matmul.h) and the AVX-512 kernel that reads it
// (matmul_f32_avx512.c): the layout puts W[16g + j][i] where matmul.h says,
// and the kernel gives, for every shape (rows and columns that leave a
// partial group), batch size and thread count, the bits of llama2.c's
// scalar loop sum += W[o][i] * x[i], i = 0, 1, ... (batch invariance
// included); a view of a matrix from a row of a group on reads its tiles.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <string.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

// In [-1, 1) times a power of two from 2^-6 to 2^6: values of many
// magnitudes, so that a fused multiply-add or another order of the sum
// changes the last bits of most outputs.
static float random_value(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    const float unit = (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
    return unit * (float)(1u << ((rng_state >> 8) % 13)) / 64.0f;
}

static float* random_floats(size_t count) {
    float* values = malloc(count * sizeof(float));
    assert_non_null(values);
    for (size_t i = 0; i < count; i++)
        values[i] = random_value();
    return values;
}

// llama2.c's matmul, written out here so that the test does not share the
// library's code: out (n_rows, rows), weights (rows, cols), x (n_rows, cols).
static void sequential_matmul(float* out, const float* weights, const float* x, int n_rows, int rows, int cols) {
    for (int r = 0; r < n_rows; r++)
        for (int o = 0; o < rows; o++) {
            float sum = 0.0f;
            for (int i = 0; i < cols; i++)
                sum += weights[(size_t)o * (size_t)cols + (size_t)i] * x[(size_t)r * (size_t)cols + (size_t)i];
            out[(size_t)r * (size_t)rows + (size_t)o] = sum;
        }
}

// A (rows, cols) fp32 matrix with its tiles.
typedef struct tiled_matrix {
    weight_matrix w;
    float* values; // (rows, cols)
    float* tiles;  // matmul_f32_tile_floats(rows, cols)
} tiled_matrix;

static tiled_matrix make_tiled(int rows, int cols) {
    tiled_matrix m;
    memset(&m, 0, sizeof m);
    m.values = random_floats((size_t)rows * (size_t)cols);
    m.tiles = malloc(matmul_f32_tile_floats(rows, cols) * sizeof(float));
    assert_non_null(m.tiles);
    m.w.dtype = WEIGHT_F32;
    m.w.rows = rows;
    m.w.cols = cols;
    m.w.values = m.values;
    matmul_f32_fill_tiles(m.tiles, &m.w);
    m.w.f32_tiles = m.tiles;
    return m;
}

static void free_tiled(tiled_matrix* m) {
    free(m->values);
    free(m->tiles);
}

// ---- the layout ---------------------------------------------------------------

static void test_layout(void** state) {
    (void)state;
    static const int shapes[][2] = {{1, 1}, {15, 3}, {16, 16}, {17, 5}, {33, 7}, {48, 768}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int rows = shapes[s][0], cols = shapes[s][1];
        const int groups = (rows + 15) / 16;
        assert_int_equal(matmul_f32_tile_floats(rows, cols), (size_t)groups * 16 * (size_t)cols);
        tiled_matrix m = make_tiled(rows, cols);
        for (int g = 0; g < groups; g++)
            for (int i = 0; i < cols; i++)
                for (int j = 0; j < 16; j++) {
                    const int row = 16 * g + j;
                    const float want = row < rows ? m.values[(size_t)row * (size_t)cols + (size_t)i] : 0.0f;
                    const float got = m.tiles[((size_t)g * (size_t)cols + (size_t)i) * 16 + (size_t)j];
                    assert_memory_equal(&got, &want, sizeof got); // +0 padding, not -0
                }
        assert_ptr_equal(matmul_f32_tiles_from_row(&m.w, 0), m.tiles);
        if (rows > 16) assert_ptr_equal(matmul_f32_tiles_from_row(&m.w, 16), m.tiles + 16 * (size_t)cols);
        assert_null(matmul_f32_tiles_from_row(&m.w, 1));
        assert_null(matmul_f32_tiles_from_row(&m.w, 8));
        m.w.f32_tiles = NULL;
        assert_null(matmul_f32_tiles_from_row(&m.w, 0));
        free_tiled(&m);
    }
}

// ---- the kernel: llama2.c's bits --------------------------------------------

// Without AVX-512 the process never builds tiles and the kernel never runs:
// the test says so (skipped), rather than passing.
static bool kernel_runs(void) { return matmul_f32_tiles_used(); }

// Every shape (partial groups of rows, any column count), batch 1..13 (the
// kernel's tiles of 1-6 rows and their remainders), 1..3 threads: the
// sequential loop's bits. A batch's row r is compared with the same row
// computed alone, so this is batch invariance too.
static void test_same_bits_as_sequential_loop(void** state) {
    (void)state;
    if (!kernel_runs()) skip();
    static const int shapes[][2] = {{1, 1},   {3, 2},    {15, 17},  {16, 16},   {17, 1},    {31, 33},
                                    {64, 64}, {100, 77}, {257, 48}, {768, 768}, {2048, 96}, {96, 2048}};
    for (int threads = 1; threads <= 3; threads++) {
        thread_pool* pool;
        assert_int_equal(thread_pool_create(threads, &pool), 0);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int rows = shapes[s][0], cols = shapes[s][1];
            tiled_matrix m = make_tiled(rows, cols);
            for (int n_rows = 1; n_rows <= 13; n_rows++) {
                if (rows * cols > 100000 && n_rows > 2 && n_rows != 7 && n_rows != 13) continue; // time
                float* x = random_floats((size_t)n_rows * (size_t)cols);
                float* want = malloc((size_t)n_rows * (size_t)rows * sizeof(float));
                float* got = malloc((size_t)n_rows * (size_t)rows * sizeof(float));
                assert_non_null(want);
                assert_non_null(got);
                sequential_matmul(want, m.values, x, n_rows, rows, cols);
                matmul_parallel(got, x, n_rows, &m.w, pool, NULL);
                for (size_t k = 0; k < (size_t)n_rows * (size_t)rows; k++) {
                    if (memcmp(&got[k], &want[k], sizeof(float)) != 0)
                        fail_msg("%dx%d, %d rows, %d threads: out[%zu] = %.9g, the sequential loop gives %.9g", rows,
                                 cols, n_rows, threads, k, (double)got[k], (double)want[k]);
                }
                free(x);
                free(want);
                free(got);
            }
            free_tiled(&m);
        }
        thread_pool_free(pool);
    }
}

// The kernel reads the tiles, not the values: with the tiles zeroed every
// output is 0 (and with them back, the values' results return).
static void test_tiles_are_read(void** state) {
    (void)state;
    if (!kernel_runs()) skip();
    tiled_matrix m = make_tiled(40, 24);
    float* x = random_floats(3 * 24);
    float out[3 * 40];
    memset(m.tiles, 0, matmul_f32_tile_floats(40, 24) * sizeof(float));
    matmul(out, x, 3, &m.w, NULL);
    for (size_t k = 0; k < 3 * 40; k++)
        assert_true(out[k] == 0.0f);
    free(x);
    free_tiled(&m);
}

// A view of rows [row_begin, rows), as tensor parallelism takes one: from
// a row of a group on it reads the tiles from there; from any other row it
// has none (the row-major kernel). Both give the sequential loop's bits.
static void test_row_views(void** state) {
    (void)state;
    if (!kernel_runs()) skip();
    const int rows = 70, cols = 19, n_rows = 5;
    tiled_matrix m = make_tiled(rows, cols);
    float* x = random_floats((size_t)n_rows * (size_t)cols);
    static const int row_begins[] = {16, 32, 48, 8, 33};
    for (size_t b = 0; b < sizeof row_begins / sizeof row_begins[0]; b++) {
        const int row_begin = row_begins[b], view_rows = rows - row_begin;
        weight_matrix view = m.w;
        view.rows = view_rows;
        view.values = m.values + (size_t)row_begin * (size_t)cols;
        view.f32_tiles = matmul_f32_tiles_from_row(&m.w, row_begin);
        assert_true((view.f32_tiles != NULL) == (row_begin % 16 == 0));
        float want[5 * 70], got[5 * 70];
        sequential_matmul(want, view.values, x, n_rows, view_rows, cols);
        matmul(got, x, n_rows, &view, NULL);
        assert_memory_equal(got, want, (size_t)n_rows * (size_t)view_rows * sizeof(float));
    }
    free(x);
    free_tiled(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_same_bits_as_sequential_loop),
        cmocka_unit_test(test_tiles_are_read),
        cmocka_unit_test(test_row_views),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
