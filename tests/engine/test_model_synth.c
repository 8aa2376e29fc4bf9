// Synthetic presets: deterministic from the seed, the documented shapes and
// sizes, weight statistics with outlier channels, and a real generation.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/model_storage.h"
#include "engine/streamed_memory.h"
#include "engine/model_synth.h"
#include "engine/model_write.h"
#include "kernels/cpu/fp16.h"
#include "tests/test_support.h"

#define BYTE_VOCAB 259

static void synth_or_fail(model* m, const char* name, model_dtype_choice dtype, uint64_t seed) {
    error_info err = {{0}};
    if (model_synthesize(m, name, BYTE_VOCAB, dtype, seed, &err)) fail_msg("%s", err.message);
}

static void test_same_seed_same_weights(void** state) {
    (void)state;
    model a, b, c;
    synth_or_fail(&a, "tiny", MODEL_DTYPE_DEFAULT, 7);
    synth_or_fail(&b, "tiny", MODEL_DTYPE_DEFAULT, 7);
    synth_or_fail(&c, "tiny", MODEL_DTYPE_DEFAULT, 8);
    assert_int_equal(a.dtype, WEIGHT_F16); // fp16 is the synthetic default
    assert_int_equal(a.weight_bytes, b.weight_bytes);
    size_t wq_bytes = (size_t)a.layers[1].wq.rows * (size_t)a.layers[1].wq.cols * 2;
    assert_memory_equal(a.layers[1].wq.values, b.layers[1].wq.values, wq_bytes);
    assert_memory_equal(a.rms_final, b.rms_final, (size_t)a.config.dim * sizeof(float));
    assert_memory_not_equal(a.layers[1].wq.values, c.layers[1].wq.values, wq_bytes);
    model_free(&a);
    model_free(&b);
    model_free(&c);
}

// streamed_memory_alloc: every block on a cache line, large ones on a 2 MiB
// boundary (where a huge page can back them), all of it writable and freed.
static void test_streamed_memory_alignment(void** state) {
    (void)state;
    const size_t sizes[] = {64, 4096, (size_t)4 << 20, ((size_t)6 << 20) + 64, (size_t)37 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char* p = streamed_memory_alloc(sizes[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        if (sizes[i] >= ((size_t)4 << 20)) assert_int_equal((uintptr_t)p % ((size_t)2 << 20), 0);
        memset(p, 0x5a, sizes[i]); // the whole block is there
        assert_int_equal(p[sizes[i] - 1], 0x5a);
        free(p);
    }
    // A model's storage comes from it: the first tensor starts on its boundary.
    model m;
    synth_or_fail(&m, "small", MODEL_DTYPE_FP16, 7);
    assert_int_equal((uintptr_t)m.storage % ((size_t)2 << 20), 0);
    model_free(&m);
}

// streamed_memory_calloc (the KV cache's storage): zeroed even where the
// allocator hands back memory that was just dirtied and freed, at sizes that
// are not a multiple of 64, small and huge-page sized.
static void test_streamed_memory_calloc_zeroes(void** state) {
    (void)state;
    const size_t sizes[] = {1, 100, 4096, ((size_t)4 << 20) + 8, (size_t)9 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t rounded = (sizes[i] + 63) / 64 * 64;
        unsigned char* dirty = streamed_memory_alloc(rounded);
        assert_non_null(dirty);
        memset(dirty, 0xa5, rounded);
        free(dirty);
        unsigned char* p = streamed_memory_calloc(sizes[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        if (sizes[i] >= ((size_t)4 << 20)) assert_int_equal((uintptr_t)p % ((size_t)2 << 20), 0);
        size_t nonzero = 0;
        for (size_t b = 0; b < sizes[i]; b++) nonzero += p[b] != 0;
        assert_int_equal(nonzero, 0);
        free(p);
    }
}

static void test_preset_shapes_and_sizes(void** state) {
    (void)state;
    struct {
        const char* name;
        double min_millions, max_millions;
    } expected[] = {{"tiny", 0.05, 0.2}, {"small", 13.0, 16.0}, {"medium", 95.0, 110.0}, {"large", 900.0, 1100.0}};
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        const synth_preset* p = synth_find_preset(expected[i].name);
        assert_non_null(p);
        model_config config = p->shape;
        config.vocab_size = BYTE_VOCAB;
        config.shared_classifier = true;
        error_info err = {{0}};
        assert_int_equal(model_config_validate(&config, p->name, &err), 0);
        assert_true(config.n_kv_heads < config.n_heads); // every preset uses grouped-query attention
        // Count parameters from the shape (the storage is not filled).
        uint64_t L = (uint64_t)config.n_layers, d = (uint64_t)config.dim, kv = (uint64_t)config.kv_dim,
                 h = (uint64_t)config.hidden_dim;
        uint64_t params = (uint64_t)BYTE_VOCAB * d + L * (2 * d * d + 2 * kv * d + 3 * h * d + 2 * d) + d;
        double millions = (double)params / 1e6;
        print_message("%-6s %.2fM parameters, %.1f MiB in fp16\n", p->name, millions,
                      (double)(params * 2) / (1024.0 * 1024.0));
        assert_true(millions >= expected[i].min_millions && millions <= expected[i].max_millions);
    }
    // small fits in a 32 MiB L3 in fp16; medium is far over it.
    model small;
    synth_or_fail(&small, "small", MODEL_DTYPE_DEFAULT, 1);
    assert_true(small.weight_bytes < 32ull * 1024 * 1024);
    assert_true(small.weight_bytes > 20ull * 1024 * 1024);
    model_free(&small);
    assert_null(synth_find_preset("huge"));
    model m;
    error_info err = {{0}};
    assert_int_equal(model_synthesize(&m, "huge", BYTE_VOCAB, MODEL_DTYPE_DEFAULT, 1, &err), -1);
    assert_non_null(strstr(err.message, "huge: not a file and not a preset"));
}

static void test_weight_bytes_exact_for_both_dtypes(void** state) {
    (void)state;
    model m16, m32;
    synth_or_fail(&m16, "tiny", MODEL_DTYPE_FP16, 3);
    synth_or_fail(&m32, "tiny", MODEL_DTYPE_FP32, 3);
    assert_int_equal(m16.n_parameters, m32.n_parameters);
    uint64_t norm_values = (uint64_t)(2 * m16.config.n_layers + 1) * (uint64_t)m16.config.dim;
    uint64_t matrix_values = m16.n_parameters - norm_values;
    assert_int_equal(m16.weight_bytes, matrix_values * 2 + norm_values * 4);
    assert_int_equal(m32.weight_bytes, matrix_values * 4 + norm_values * 4);
    // fp16 storage holds exactly the fp16 rounding of the fp32 weights.
    const weight_matrix* w16 = &m16.layers[0].w2;
    const weight_matrix* w32 = &m32.layers[0].w2;
    for (int i = 0; i < w16->rows * w16->cols; i++)
        assert_int_equal(((const uint16_t*)w16->values)[i], fp32_to_fp16(((const float*)w32->values)[i]));
    model_free(&m16);
    model_free(&m32);
}

// The recipe's outlier input channels: the largest column mean |w| is many
// times the median, and rows differ in scale too.
static void test_weights_have_outlier_channels(void** state) {
    (void)state;
    model m;
    synth_or_fail(&m, "small", MODEL_DTYPE_FP32, SYNTH_DEFAULT_SEED);
    const weight_matrix* w = &m.layers[2].w1; // (hidden, dim)
    double* column_mean = calloc((size_t)w->cols, sizeof(double));
    const float* values = w->values;
    for (int o = 0; o < w->rows; o++)
        for (int i = 0; i < w->cols; i++) column_mean[i] += fabs(values[(size_t)o * (size_t)w->cols + (size_t)i]);
    double max_mean = 0.0;
    int above_5x = 0;
    double* sorted = malloc((size_t)w->cols * sizeof(double));
    memcpy(sorted, column_mean, (size_t)w->cols * sizeof(double));
    for (int i = 1; i < w->cols; i++) // insertion sort: 384 values
        for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            double t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
    double median = sorted[w->cols / 2];
    for (int i = 0; i < w->cols; i++) {
        if (column_mean[i] > max_mean) max_mean = column_mean[i];
        if (column_mean[i] > 5.0 * median) above_5x++;
    }
    print_message("w1 columns: max/median mean|w| = %.1f, %d of %d above 5x\n", max_mean / median, above_5x, w->cols);
    assert_true(max_mean / median >= 8.0);
    assert_true(above_5x >= 1 && above_5x <= w->cols / 100); // about 0.5%, not a broad shift
    free(sorted);
    free(column_mean);
    model_free(&m);
}

// Up to 40 tokens sampled (temperature 0.8, seed 5) after "Hi!": how many.
static int sample_after_hi(const model* m, int32_t ids[40]) {
    int32_t prompt[4] = {1, 3 + 'H', 3 + 'i', 3 + '!'};
    return test_engine_generate(m, prompt, 4, 40, 0.8f, 0.9f, 5, ids).n_generated;
}

static void test_generation_is_deterministic_and_round_trips(void** state) {
    (void)state;
    model m;
    synth_or_fail(&m, "tiny", MODEL_DTYPE_FP32, 11);
    int32_t prompt[4] = {1, 3 + 'H', 3 + 'i', 3 + '!'};
    int32_t a[40], b[40];
    int n_a = sample_after_hi(&m, a), n_b = sample_after_hi(&m, b);
    error_info err = {{0}};
    assert_int_equal(n_a, n_b);
    assert_true(n_a > 0);
    assert_memory_equal(a, b, (size_t)n_a * sizeof(int32_t));
    for (int i = 0; i < n_a; i++) assert_true(a[i] >= 0 && a[i] < BYTE_VOCAB);
    // Written as a legacy checkpoint (what llama2.c can run) and read back,
    // greedy generation gives the same ids.
    char path[512];
    snprintf(path, sizeof path, "%s/tiny.bin", test_scratch_dir());
    assert_int_equal(model_write_checkpoint(&m, path, MODEL_FORMAT_LEGACY, 0, &err), 0);
    model loaded;
    if (model_load(&loaded, path, MODEL_DTYPE_DEFAULT, &err)) fail_msg("%s", err.message);
    n_a = test_engine_generate(&m, prompt, 4, 30, 0.0f, 0.0f, 1, a).n_generated;
    n_b = test_engine_generate(&loaded, prompt, 4, 30, 0.0f, 0.0f, 1, b).n_generated;
    assert_true(n_a > 0);
    assert_int_equal(n_a, n_b);
    assert_memory_equal(a, b, (size_t)n_a * sizeof(int32_t));
    model_free(&loaded);
    model_free(&m);
}

// fp16 and fp32 weights get a tiled copy for the AVX-512 kernel (and only
// there), sized as matmul.h says, and generation reads the same logits with it as
// without: the sampled ids (temperature 0.8) agree token for token.
static void test_tiles_built_and_same_generation(void** state) {
    (void)state;
    model m;
    synth_or_fail(&m, "small", MODEL_DTYPE_FP16, 5);
    const int n_matrices = 7 * m.config.n_layers + 1;
    weight_matrix* matrices[7 * 64 + 1];
    assert_true(n_matrices <= 7 * 64 + 1);
    for (int l = 0; l < m.config.n_layers; l++)
        for (int i = 0; i < 7; i++) matrices[7 * l + i] = (weight_matrix*)model_storage_layer_matrix(&m.layers[l], i);
    matrices[n_matrices - 1] = &m.classifier;
    uint64_t halves = 0;
    for (int k = 0; k < n_matrices; k++) {
        halves += matmul_f16_tile_halves(matrices[k]->rows, matrices[k]->cols);
        assert_true((matrices[k]->f16_tiles != NULL) == matmul_f16_tiles_used());
    }
    if (matmul_f16_tiles_used()) {
        assert_non_null(m.tile_storage);
        assert_int_equal(m.tile_bytes, halves * sizeof(uint16_t));
        assert_ptr_equal(matrices[0]->f16_tiles, m.tile_storage);
    } else {
        assert_null(m.tile_storage);
        assert_int_equal(m.tile_bytes, 0);
    }
    int32_t with_tiles[40], without[40];
    const int n_with = sample_after_hi(&m, with_tiles);
    for (int k = 0; k < n_matrices; k++) matrices[k]->f16_tiles = NULL;
    const int n_without = sample_after_hi(&m, without);
    assert_true(n_with > 0);
    assert_int_equal(n_with, n_without);
    assert_memory_equal(with_tiles, without, (size_t)n_with * sizeof(int32_t));
    model_free(&m);
    // fp32 weights get their own layout (16 rows a group, matmul.h), with
    // the same generation as without it.
    synth_or_fail(&m, "tiny", MODEL_DTYPE_FP32, 5);
    assert_null(m.classifier.f16_tiles);
    uint64_t floats = 0;
    for (int l = 0; l < m.config.n_layers; l++)
        for (int i = 0; i < 7; i++) {
            weight_matrix* w = (weight_matrix*)model_storage_layer_matrix(&m.layers[l], i);
            floats += matmul_f32_tile_floats(w->rows, w->cols);
            assert_true((w->f32_tiles != NULL) == matmul_f32_tiles_used());
        }
    floats += matmul_f32_tile_floats(m.classifier.rows, m.classifier.cols);
    assert_true((m.classifier.f32_tiles != NULL) == matmul_f32_tiles_used());
    assert_int_equal(m.tile_bytes, matmul_f32_tiles_used() ? floats * sizeof(float) : 0);
    const int n_f32_with = sample_after_hi(&m, with_tiles);
    for (int l = 0; l < m.config.n_layers; l++)
        for (int i = 0; i < 7; i++) ((weight_matrix*)model_storage_layer_matrix(&m.layers[l], i))->f32_tiles = NULL;
    m.classifier.f32_tiles = NULL;
    const int n_f32_without = sample_after_hi(&m, without);
    assert_true(n_f32_with > 0);
    assert_int_equal(n_f32_with, n_f32_without);
    assert_memory_equal(with_tiles, without, (size_t)n_f32_with * sizeof(int32_t));
    model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_same_weights),
        cmocka_unit_test(test_streamed_memory_alignment),
        cmocka_unit_test(test_streamed_memory_calloc_zeroes),
        cmocka_unit_test(test_preset_shapes_and_sizes),
        cmocka_unit_test(test_weight_bytes_exact_for_both_dtypes),
        cmocka_unit_test(test_weights_have_outlier_channels),
        cmocka_unit_test(test_generation_is_deterministic_and_round_trips),
        cmocka_unit_test(test_tiles_built_and_same_generation),
    };
    return cmocka_run_group_tests_name("engine/model_synth", tests, NULL, NULL);
}
