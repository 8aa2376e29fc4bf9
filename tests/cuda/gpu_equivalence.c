// gpu_equivalence: every CUDA kernel against the CPU reference (kernels/cpu).
//
// Built only when CUDA is on (Makefile: GPU_TEST_BINS). Not a cmocka test:
// without a CUDA device it prints "GPU tests NOT RUN: ..." and exits 77,
// which scripts/run-tests.sh reports as not run (never as passed). With a
// device it prints one line per check and cmocka-style summary lines, so
// that run-tests.sh counts its passes and failures like any test binary.
//
// Checks (random data from a fixed seed; shapes chosen to reach every path
// of cuda_matmul_path and every load width of the attention kernel):
//   matmul: fp32, fp16, Q8_0, W8A16 and W4A16 (symmetric and asymmetric,
//     several group sizes), W8A8 (bit for bit), 1 to 64 activation rows;
//   embedding rows (bit for bit);
//   KV write into slots, fp32 / fp16 / int8 (bit for bit, scales too);
//   paged attention: block sizes 8/16/32, fp32/fp16/int8 KV, grouped heads,
//     contexts 1 to 32768 (one partition, and split + reduce), random
//     block tables;
//   RMSNorm, fused residual + RMSNorm, RoPE, SwiGLU, residual add;
//   the engine with --backend cuda against --backend cpu on stories260K:
//     greedy ids equal (fp32 and fp16 KV, a batch of prompts, greedy forks
//     that copy-on-write their shared tail block), and the step records'
//     bytes and FLOPs equal. The model is looked up in $SERVELAB_MODELS,
//     ../shared/models and ./models; without it those checks are skipped
//     (reported as skipped, never as passed).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/model.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_info.h"

static int n_passed, n_failed, n_skipped;
static cuda_context* gpu;

// ---- small helpers ------------------------------------------------------------

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rng_uniform(float low, float high) {
    return low + (high - low) * (float)(rng_next() & 0xffffff) / 16777216.0f;
}
static int rng_int(int low, int high) { return low + (int)(rng_next() % (uint32_t)(high - low + 1)); }

static void* xmalloc(size_t bytes) {
    void* p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "gpu_equivalence: out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static void check(int ok, const char* name, const char* detail) {
    if (ok) {
        n_passed++;
        printf("[       OK ] %s\n", name);
    } else {
        n_failed++;
        printf("[  FAILED  ] %s: %s\n", name, detail);
    }
    fflush(stdout);
}

// Device copy of a host array (NULL on failure, with the reason printed).
static void* to_device(const void* host, size_t bytes, error_info* err) {
    void* device = NULL;
    if (cuda_device_alloc(gpu, &device, bytes, "test data", err)) return NULL;
    if (host && cuda_copy_to_device(gpu, device, host, bytes, err)) {
        cuda_device_free(device);
        return NULL;
    }
    return device;
}

// Largest |gpu - cpu| / scale[i] over count values, NaN-aware (NaN in one
// but not the other is infinite error).
static double worst_error(const float* gpu_values, const float* cpu_values, const double* scale, size_t count,
                          size_t* worst_index) {
    double worst = 0.0;
    *worst_index = 0;
    for (size_t i = 0; i < count; i++) {
        double error;
        if (isnan(gpu_values[i]) || isnan(cpu_values[i]))
            error = isnan(gpu_values[i]) && isnan(cpu_values[i]) ? 0 : INFINITY;
        else
            error = fabs((double)gpu_values[i] - (double)cpu_values[i]) / (scale ? scale[i] : 1.0);
        if (error > worst) {
            worst = error;
            *worst_index = i;
        }
    }
    return worst;
}

// ---- matmul -------------------------------------------------------------------

typedef struct matrix_case {
    weight_dtype dtype;
    int rows, cols, group_size;
    int asymmetric;      // I8 / I4
    int activation_bits; // 8: W8A8
} matrix_case;

// Host matrix with random payload in the CPU's packed formats.
typedef struct host_matrix {
    weight_matrix w;
    void* values;
    float* scales;
    uint16_t* scales_f16;
    uint8_t* zero_points;
} host_matrix;

static void make_matrix(host_matrix* m, const matrix_case* c) {
    memset(m, 0, sizeof *m);
    const size_t count = (size_t)c->rows * (size_t)c->cols;
    m->w.dtype = c->dtype;
    m->w.rows = c->rows;
    m->w.cols = c->cols;
    m->w.group_size = c->group_size;
    m->w.activation_bits = c->activation_bits;
    if (c->dtype == WEIGHT_F32) {
        float* v = xmalloc(count * 4);
        for (size_t i = 0; i < count; i++)
            v[i] = rng_uniform(-0.1f, 0.1f);
        m->values = v;
    } else if (c->dtype == WEIGHT_F16) {
        uint16_t* v = xmalloc(count * 2);
        for (size_t i = 0; i < count; i++)
            v[i] = fp32_to_fp16(rng_uniform(-0.1f, 0.1f));
        m->values = v;
    } else if (c->dtype == WEIGHT_Q8_0) {
        int8_t* v = xmalloc(count);
        for (size_t i = 0; i < count; i++)
            v[i] = (int8_t)rng_int(-127, 127);
        m->scales = xmalloc(count / (size_t)c->group_size * 4);
        for (size_t g = 0; g < count / (size_t)c->group_size; g++)
            m->scales[g] = rng_uniform(1e-4f, 1e-3f);
        m->values = v;
    } else {
        const size_t n_groups = (size_t)c->rows * (size_t)(c->cols / c->group_size);
        const size_t row_bytes = c->dtype == WEIGHT_I4 ? ((size_t)c->cols + 1) / 2 : (size_t)c->cols;
        uint8_t* v = xmalloc((size_t)c->rows * row_bytes);
        for (int o = 0; o < c->rows; o++)
            for (int i = 0; i < c->cols; i++) {
                uint8_t* row = v + (size_t)o * row_bytes;
                if (c->dtype == WEIGHT_I4) {
                    int nibble = c->asymmetric ? rng_int(0, 15) : rng_int(-7, 7) + 8;
                    row[i >> 1] |= (uint8_t)(nibble << (4 * (i & 1)));
                } else {
                    row[i] = c->asymmetric ? (uint8_t)rng_int(0, 255) : (uint8_t)(int8_t)rng_int(-127, 127);
                }
            }
        m->scales_f16 = xmalloc(n_groups * 2);
        for (size_t g = 0; g < n_groups; g++)
            m->scales_f16[g] = fp32_to_fp16(rng_uniform(1e-3f, 2e-2f));
        if (c->asymmetric) {
            m->zero_points = xmalloc(n_groups);
            for (size_t g = 0; g < n_groups; g++)
                m->zero_points[g] = (uint8_t)(c->dtype == WEIGHT_I4 ? rng_int(0, 15) : rng_int(0, 255));
        }
        m->values = v;
    }
    m->w.values = m->values;
    m->w.scales = m->scales;
    m->w.scales_f16 = m->scales_f16;
    m->w.zero_points = m->zero_points;
}

static void free_matrix(host_matrix* m) {
    free(m->values);
    free(m->scales);
    free(m->scales_f16);
    free(m->zero_points);
}

static const char* case_name(const matrix_case* c, char* buffer, size_t capacity) {
    const char* kind = c->activation_bits == 8 ? "w8a8"
                       : c->dtype == WEIGHT_I4 ? "w4a16"
                       : c->dtype == WEIGHT_I8 ? "w8a16"
                                               : weight_dtype_name(c->dtype);
    snprintf(buffer, capacity, "%s%s %dx%d g%d", kind, c->asymmetric ? " asym" : "", c->rows, c->cols, c->group_size);
    return buffer;
}

static void test_matmul_case(const matrix_case* c, int n_rows) {
    char name[160], label[96], detail[512];
    snprintf(name, sizeof name, "matmul %s, %d rows", case_name(c, label, sizeof label), n_rows);
    host_matrix m;
    make_matrix(&m, c);
    const size_t in_count = (size_t)n_rows * (size_t)c->cols, out_count = (size_t)n_rows * (size_t)c->rows;
    float* in = xmalloc(in_count * 4);
    for (size_t i = 0; i < in_count; i++)
        in[i] = rng_uniform(-2.0f, 2.0f);
    float* expected = xmalloc(out_count * 4);
    float* got = xmalloc(out_count * 4);
    double* scale = xmalloc(out_count * sizeof(double));
    // Error scale per output: sum_i |w_i x_i| (the size of the rounding a reordered sum can make).
    float* row = xmalloc((size_t)c->cols * 4);
    for (int o = 0; o < c->rows; o++) {
        weight_row_to_f32(row, &m.w, o, NULL);
        for (int r = 0; r < n_rows; r++) {
            double sum = 0.0;
            for (int i = 0; i < c->cols; i++)
                sum += fabs((double)row[i] * in[(size_t)r * (size_t)c->cols + (size_t)i]);
            scale[(size_t)r * (size_t)c->rows + (size_t)o] = sum > 1e-30 ? sum : 1e-30;
        }
    }
    error_info err = {{0}};
    cuda_weights w;
    float *device_in = NULL, *device_out = NULL;
    kernel_traffic gpu_traffic = {0}, cpu_traffic = {0};
    int failed = cuda_weights_upload(gpu, &w, &m.w, &err);
    if (!failed) failed = !(device_in = to_device(in, in_count * 4, &err));
    if (!failed) failed = !(device_out = to_device(NULL, out_count * 4, &err));
    if (!failed) failed = cuda_matmul(gpu, device_out, device_in, n_rows, &w, &gpu_traffic, &err);
    if (!failed) failed = cuda_copy_to_host(gpu, got, device_out, out_count * 4, &err);
    if (!failed) failed = cuda_synchronize(gpu, &err);
    const char* path = failed ? "?" : cuda_matmul_path(&w, n_rows);
    snprintf(name, sizeof name, "matmul %s, %d rows [%s]", label, n_rows, path);
    if (failed) {
        check(0, name, err.message);
    } else {
        matmul(expected, in, n_rows, &m.w, &cpu_traffic); // the CPU's figures for the same call
        const int exact = c->activation_bits == 8;
        // fp16 activations (cuBLAS paths) round x to 11 bits; fp32 paths only reorder the sum.
        const double tolerance = exact ? 0.0 : strstr(path, "cublas") && c->dtype != WEIGHT_F32 ? 4e-3 : 3e-5;
        size_t at = 0;
        const double worst = exact ? worst_error(got, expected, NULL, out_count, &at)
                                   : worst_error(got, expected, scale, out_count, &at);
        const int bits_equal = !exact || memcmp(got, expected, out_count * 4) == 0;
        const int traffic_equal = memcmp(&gpu_traffic, &cpu_traffic, sizeof gpu_traffic) == 0;
        snprintf(detail, sizeof detail, "worst error %.3g (tolerance %.3g%s) at output %zu: gpu %.9g cpu %.9g%s", worst,
                 tolerance, exact ? ", bit for bit" : " x sum|w x|", at, (double)got[at], (double)expected[at],
                 traffic_equal ? "" : "; traffic figures differ from the CPU's");
        check(worst <= tolerance && bits_equal && traffic_equal, name, detail);
    }
    cuda_device_free(device_in);
    cuda_device_free(device_out);
    cuda_weights_free(&w);
    free(in);
    free(expected);
    free(got);
    free(scale);
    free(row);
    free_matrix(&m);
}

static void test_matmul(void) {
    const matrix_case cases[] = {
        {WEIGHT_F32, 96, 256, 0, 0, 0},     {WEIGHT_F32, 70, 172, 0, 0, 0},      {WEIGHT_F16, 256, 512, 0, 0, 0},
        {WEIGHT_F16, 64, 172, 0, 0, 0},     {WEIGHT_F16, 33, 90, 0, 0, 0},       {WEIGHT_Q8_0, 64, 256, 64, 0, 0},
        {WEIGHT_Q8_0, 30, 50, 40, 0, 0},    {WEIGHT_I8, 256, 1024, 128, 0, 0},   {WEIGHT_I8, 256, 1024, 1024, 0, 0},
        {WEIGHT_I8, 128, 512, 64, 1, 0},    {WEIGHT_I8, 50, 172, 43, 0, 0},      {WEIGHT_I8, 40, 60, 20, 1, 0},
        {WEIGHT_I4, 256, 1024, 64, 0, 0},   {WEIGHT_I4, 256, 1024, 128, 1, 0},   {WEIGHT_I4, 96, 4096, 4096, 0, 0},
        {WEIGHT_I4, 64, 172, 43, 1, 0},     {WEIGHT_I4, 31, 90, 30, 0, 0},       {WEIGHT_I4, 17, 33, 33, 1, 0},
        {WEIGHT_I8, 256, 1024, 1024, 0, 8}, {WEIGHT_I8, 256, 1024, 128, 0, 8},   {WEIGHT_I8, 64, 172, 43, 0, 8},
        {WEIGHT_I8, 100, 300, 300, 0, 8},   {WEIGHT_I8, 4096, 4096, 4096, 0, 8}, {WEIGHT_I4, 4096, 4096, 128, 0, 0},
    };
    const int row_counts[] = {1, 2, 3, 5, 8, 13, 32, 33, 64};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t r = 0; r < sizeof row_counts / sizeof row_counts[0]; r++) {
            if (cases[c].rows >= 4096 && row_counts[r] != 1 && row_counts[r] != 8 && row_counts[r] != 64) continue;
            test_matmul_case(&cases[c], row_counts[r]);
        }
}

static void test_embedding(void) {
    const matrix_case cases[] = {{WEIGHT_F32, 100, 64, 0, 0, 0},   {WEIGHT_F16, 100, 72, 0, 0, 0},
                                 {WEIGHT_Q8_0, 100, 64, 32, 0, 0}, {WEIGHT_I8, 100, 64, 32, 1, 0},
                                 {WEIGHT_I4, 100, 66, 33, 0, 0},   {WEIGHT_I4, 100, 64, 16, 1, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char name[160], label[96];
        snprintf(name, sizeof name, "embedding rows %s", case_name(&cases[c], label, sizeof label));
        host_matrix m;
        make_matrix(&m, &cases[c]);
        const int n_rows = 9, cols = cases[c].cols;
        int32_t ids[9];
        float* expected = xmalloc((size_t)n_rows * (size_t)cols * 4);
        float* got = xmalloc((size_t)n_rows * (size_t)cols * 4);
        for (int r = 0; r < n_rows; r++) {
            ids[r] = rng_int(0, cases[c].rows - 1);
            weight_row_to_f32(expected + (size_t)r * (size_t)cols, &m.w, ids[r], NULL);
        }
        error_info err = {{0}};
        cuda_weights w;
        void *device_ids = NULL, *device_out = NULL;
        int failed = cuda_weights_upload(gpu, &w, &m.w, &err);
        if (!failed) failed = !(device_ids = to_device(ids, sizeof ids, &err));
        if (!failed) failed = !(device_out = to_device(NULL, (size_t)n_rows * (size_t)cols * 4, &err));
        if (!failed) failed = cuda_embed_rows(gpu, device_out, device_ids, n_rows, &w, NULL, &err);
        if (!failed) failed = cuda_copy_to_host(gpu, got, device_out, (size_t)n_rows * (size_t)cols * 4, &err);
        check(!failed && memcmp(got, expected, (size_t)n_rows * (size_t)cols * 4) == 0, name,
              failed ? err.message : "rows differ from weight_row_to_f32");
        cuda_device_free(device_ids);
        cuda_device_free(device_out);
        cuda_weights_free(&w);
        free(expected);
        free(got);
        free_matrix(&m);
    }
}

// ---- the paged KV cache -------------------------------------------------------

typedef struct kv_case {
    kv_dtype dtype;
    int n_heads, n_kv_heads, head_dim, block_size;
    int contexts[4]; // one query row per context (0 ends the list)
} kv_case;

typedef struct host_pool {
    int n_slots, kv_dim;
    void* keys; // (n_slots, kv_dim)
    void* values;
    float* key_scales; // KV_I8: (n_slots, n_kv_heads)
    float* value_scales;
} host_pool;

static void make_pool(host_pool* pool, kv_dtype dtype, int n_slots, int n_kv_heads, int head_dim) {
    pool->n_slots = n_slots;
    pool->kv_dim = n_kv_heads * head_dim;
    const size_t count = (size_t)n_slots * (size_t)pool->kv_dim;
    pool->keys = xmalloc(count * (size_t)kv_dtype_bytes(dtype));
    pool->values = xmalloc(count * (size_t)kv_dtype_bytes(dtype));
    pool->key_scales = pool->value_scales = NULL;
    if (dtype == KV_I8) {
        pool->key_scales = xmalloc((size_t)n_slots * (size_t)n_kv_heads * 4);
        pool->value_scales = xmalloc((size_t)n_slots * (size_t)n_kv_heads * 4);
    }
    // Random rows written the way the engine writes them (kv_write_row).
    float* key = xmalloc((size_t)pool->kv_dim * 4);
    float* value = xmalloc((size_t)pool->kv_dim * 4);
    for (int slot = 0; slot < n_slots; slot++) {
        for (int i = 0; i < pool->kv_dim; i++)
            key[i] = rng_uniform(-1.5f, 1.5f), value[i] = rng_uniform(-1.0f, 1.0f);
        kv_write_row(pool->keys, pool->values, pool->key_scales, pool->value_scales, dtype, slot, key, value,
                     n_kv_heads, head_dim, NULL);
    }
    free(key);
    free(value);
}

static void free_pool(host_pool* pool) {
    free(pool->keys);
    free(pool->values);
    free(pool->key_scales);
    free(pool->value_scales);
}

// Device copy of a host pool as a cuda_kv_layer (NULL pointers on failure).
static int upload_pool(cuda_kv_layer* layer, const host_pool* pool, kv_dtype dtype, int n_kv_heads, int head_dim,
                       int block_size, error_info* err) {
    const size_t bytes = (size_t)pool->n_slots * (size_t)pool->kv_dim * (size_t)kv_dtype_bytes(dtype);
    memset(layer, 0, sizeof *layer);
    layer->dtype = dtype;
    layer->n_kv_heads = n_kv_heads;
    layer->head_dim = head_dim;
    layer->block_size = block_size;
    if (!(layer->keys = to_device(pool->keys, bytes, err))) return -1;
    if (!(layer->values = to_device(pool->values, bytes, err))) return -1;
    if (dtype == KV_I8) {
        const size_t scale_bytes = (size_t)pool->n_slots * (size_t)n_kv_heads * 4;
        if (!(layer->key_scales = to_device(pool->key_scales, scale_bytes, err))) return -1;
        if (!(layer->value_scales = to_device(pool->value_scales, scale_bytes, err))) return -1;
    }
    return 0;
}

static void free_layer(cuda_kv_layer* layer) {
    cuda_device_free(layer->keys);
    cuda_device_free(layer->values);
    cuda_device_free(layer->key_scales);
    cuda_device_free(layer->value_scales);
}

static void test_attention_case(const kv_case* c) {
    char name[200], detail[512];
    int n_rows = 0, max_context = 0, total_blocks = 0;
    while (n_rows < 4 && c->contexts[n_rows] > 0) {
        if (c->contexts[n_rows] > max_context) max_context = c->contexts[n_rows];
        total_blocks += (c->contexts[n_rows] + c->block_size - 1) / c->block_size;
        n_rows++;
    }
    snprintf(name, sizeof name, "paged attention %s, %d/%d heads x %d, block %d, contexts %d %d %d %d",
             kv_dtype_name(c->dtype), c->n_heads, c->n_kv_heads, c->head_dim, c->block_size, c->contexts[0],
             c->contexts[1], c->contexts[2], c->contexts[3]);
    // A pool with spare blocks; each row's table is a random set of distinct blocks, in random order.
    const int n_blocks = total_blocks + 7;
    host_pool pool;
    make_pool(&pool, c->dtype, n_blocks * c->block_size, c->n_kv_heads, c->head_dim);
    int32_t* permutation = xmalloc((size_t)n_blocks * 4);
    for (int b = 0; b < n_blocks; b++)
        permutation[b] = b;
    for (int b = n_blocks - 1; b > 0; b--) {
        int j = rng_int(0, b);
        int32_t t = permutation[b];
        permutation[b] = permutation[j];
        permutation[j] = t;
    }
    int32_t offsets[4] = {0}, lengths[4] = {0};
    int32_t* tables = xmalloc((size_t)total_blocks * 4 + 4);
    for (int r = 0, used = 0; r < n_rows; r++) {
        offsets[r] = used;
        lengths[r] = c->contexts[r];
        int n_table = (lengths[r] + c->block_size - 1) / c->block_size;
        memcpy(tables + used, permutation + used, (size_t)n_table * 4);
        used += n_table;
    }
    const int q_dim = c->n_heads * c->head_dim;
    float* query = xmalloc((size_t)n_rows * (size_t)q_dim * 4);
    for (size_t i = 0; i < (size_t)n_rows * (size_t)q_dim; i++)
        query[i] = rng_uniform(-1.0f, 1.0f);
    float* expected = xmalloc((size_t)n_rows * (size_t)q_dim * 4);
    float* got = xmalloc((size_t)n_rows * (size_t)q_dim * 4);
    float* scores = xmalloc((size_t)max_context * 4);
    kernel_traffic cpu_traffic = {0}, gpu_traffic = {0};
    for (int r = 0; r < n_rows; r++) {
        kv_layer_view view = {c->dtype,      pool.keys,       pool.values,      tables + offsets[r],
                              c->block_size, pool.key_scales, pool.value_scales, 0};
        attention_row(expected + (size_t)r * (size_t)q_dim, query + (size_t)r * (size_t)q_dim, &view, lengths[r],
                      c->n_heads, c->n_kv_heads, c->head_dim, scores, &cpu_traffic);
    }
    error_info err = {{0}};
    cuda_kv_layer layer;
    void *device_tables = NULL, *device_offsets = NULL, *device_lengths = NULL, *device_query = NULL,
         *device_out = NULL;
    int failed = upload_pool(&layer, &pool, c->dtype, c->n_kv_heads, c->head_dim, c->block_size, &err);
    if (!failed) failed = !(device_tables = to_device(tables, (size_t)total_blocks * 4 + 4, &err));
    if (!failed) failed = !(device_offsets = to_device(offsets, sizeof offsets, &err));
    if (!failed) failed = !(device_lengths = to_device(lengths, sizeof lengths, &err));
    if (!failed) failed = !(device_query = to_device(query, (size_t)n_rows * (size_t)q_dim * 4, &err));
    if (!failed) failed = !(device_out = to_device(NULL, (size_t)n_rows * (size_t)q_dim * 4, &err));
    if (!failed)
        failed = cuda_paged_attention(gpu, device_out, device_query, q_dim, &layer, device_tables, device_offsets,
                                      device_lengths, n_rows, max_context, c->n_heads, lengths, &gpu_traffic, &err);
    if (!failed) failed = cuda_copy_to_host(gpu, got, device_out, (size_t)n_rows * (size_t)q_dim * 4, &err);
    if (!failed) failed = cuda_synchronize(gpu, &err);
    if (failed) {
        check(0, name, err.message);
    } else {
        // The output is a convex mix of value rows (|v| <= 1, int8 dequantized alike):
        // errors are judged against 1, with room for 32k-term fp32 sums in another order.
        size_t at = 0;
        const double worst = worst_error(got, expected, NULL, (size_t)n_rows * (size_t)q_dim, &at);
        const double tolerance = 2e-5 + 2e-8 * max_context;
        const int traffic_equal = memcmp(&gpu_traffic, &cpu_traffic, sizeof gpu_traffic) == 0;
        snprintf(detail, sizeof detail, "worst error %.3g (tolerance %.3g) at %zu: gpu %.9g cpu %.9g%s", worst,
                 tolerance, at, (double)got[at], (double)expected[at],
                 traffic_equal ? "" : "; traffic figures differ from the CPU's");
        check(worst <= tolerance && traffic_equal, name, detail);
    }
    cuda_device_free(device_tables);
    cuda_device_free(device_offsets);
    cuda_device_free(device_lengths);
    cuda_device_free(device_query);
    cuda_device_free(device_out);
    free_layer(&layer);
    free(permutation);
    free(tables);
    free(query);
    free(expected);
    free(got);
    free(scores);
    free_pool(&pool);
}

static void test_attention(void) {
    static const kv_dtype dtypes[] = {KV_F32, KV_F16, KV_I8};
    static const int block_sizes[] = {8, 16, 32};
    // (heads, KV heads, head_dim): stories260K's, TinyLlama's, Llama's,
    // an odd head_dim (96: padded lanes), many heads per KV head (16: two
    // head groups), head_dim 2, 256 and 18 (narrow loads).
    static const int shapes[][3] = {{8, 4, 8},   {32, 4, 64}, {32, 8, 128}, {12, 4, 96},
                                    {32, 2, 64}, {4, 4, 2},   {4, 2, 256},  {6, 3, 18}};
    static const int contexts[][4] = {
        {1, 2, 3, 0}, {17, 100, 511, 512}, {513, 1000, 1, 2047}, {4096, 33, 0, 0}, {32768, 1, 0, 0}};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t b = 0; b < 3; b++)
                for (size_t x = 0; x < sizeof contexts / sizeof contexts[0]; x++) {
                    // The longest contexts once per dtype and shape (the CPU reference is slow there).
                    if (contexts[x][0] >= 4096 && b != (s % 3)) continue;
                    kv_case c = {dtypes[d],      shapes[s][0],
                                 shapes[s][1],   shapes[s][2],
                                 block_sizes[b], {contexts[x][0], contexts[x][1], contexts[x][2], contexts[x][3]}};
                    test_attention_case(&c);
                }
}

static void test_kv_write(void) {
    static const kv_dtype dtypes[] = {KV_F32, KV_F16, KV_I8};
    for (size_t d = 0; d < 3; d++) {
        const int n_kv_heads = 4, head_dim = 24, kv_dim = n_kv_heads * head_dim, n_slots = 64, n_rows = 10;
        const int key_stride = kv_dim + 8; // rows of a wider qkv buffer
        char name[96];
        snprintf(name, sizeof name, "KV write %s", kv_dtype_name(dtypes[d]));
        host_pool expected;
        make_pool(&expected, dtypes[d], n_slots, n_kv_heads, head_dim);
        float* keys = xmalloc((size_t)n_rows * (size_t)key_stride * 4);
        float* values = xmalloc((size_t)n_rows * (size_t)key_stride * 4);
        int64_t slots[10];
        for (int r = 0; r < n_rows; r++) {
            slots[r] = r * 6 + 1; // distinct slots
            for (int i = 0; i < key_stride; i++)
                keys[(size_t)r * (size_t)key_stride + (size_t)i] = rng_uniform(-3.0f, 3.0f),
                                                      values[(size_t)r * (size_t)key_stride + (size_t)i] =
                                                          rng_uniform(-3.0f, 3.0f);
            if (r == 3) // an all-zero head: scale 0, codes 0
                for (int i = 0; i < head_dim; i++)
                    keys[(size_t)r * (size_t)key_stride + (size_t)i] = 0.0f;
        }
        error_info err = {{0}};
        cuda_kv_layer layer;
        void *device_keys = NULL, *device_values = NULL, *device_slots = NULL;
        int failed = upload_pool(&layer, &expected, dtypes[d], n_kv_heads, head_dim, 8, &err);
        if (!failed) failed = !(device_keys = to_device(keys, (size_t)n_rows * (size_t)key_stride * 4, &err));
        if (!failed) failed = !(device_values = to_device(values, (size_t)n_rows * (size_t)key_stride * 4, &err));
        if (!failed) failed = !(device_slots = to_device(slots, sizeof slots, &err));
        kernel_traffic gpu_traffic = {0}, cpu_traffic = {0};
        if (!failed)
            failed = cuda_kv_write(gpu, &layer, device_keys, device_values, key_stride, device_slots, n_rows,
                                   &gpu_traffic, &err);
        for (int r = 0; r < n_rows; r++)
            kv_write_row(expected.keys, expected.values, expected.key_scales, expected.value_scales, dtypes[d],
                         slots[r], keys + (size_t)r * (size_t)key_stride, values + (size_t)r * (size_t)key_stride,
                         n_kv_heads, head_dim, &cpu_traffic);
        const size_t bytes = (size_t)n_slots * (size_t)kv_dim * (size_t)kv_dtype_bytes(dtypes[d]);
        void* got_keys = xmalloc(bytes);
        void* got_values = xmalloc(bytes);
        float* got_scales = xmalloc((size_t)n_slots * (size_t)n_kv_heads * 4 * 2);
        if (!failed) failed = cuda_copy_to_host(gpu, got_keys, layer.keys, bytes, &err);
        if (!failed) failed = cuda_copy_to_host(gpu, got_values, layer.values, bytes, &err);
        int same =
            !failed && memcmp(got_keys, expected.keys, bytes) == 0 && memcmp(got_values, expected.values, bytes) == 0;
        if (!failed && dtypes[d] == KV_I8) {
            const size_t scale_bytes = (size_t)n_slots * (size_t)n_kv_heads * 4;
            failed = cuda_copy_to_host(gpu, got_scales, layer.key_scales, scale_bytes, &err) ||
                     cuda_copy_to_host(gpu, got_scales + (size_t)n_slots * (size_t)n_kv_heads, layer.value_scales,
                                       scale_bytes, &err);
            same = same && !failed && memcmp(got_scales, expected.key_scales, scale_bytes) == 0 &&
                   memcmp(got_scales + (size_t)n_slots * (size_t)n_kv_heads, expected.value_scales, scale_bytes) == 0;
        }
        same = same && memcmp(&gpu_traffic, &cpu_traffic, sizeof gpu_traffic) == 0;
        check(!failed && same, name, failed ? err.message : "pool bytes (or traffic) differ from kv_write_row's");
        cuda_device_free(device_keys);
        cuda_device_free(device_values);
        cuda_device_free(device_slots);
        free_layer(&layer);
        free(keys);
        free(values);
        free(got_keys);
        free(got_values);
        free(got_scales);
        free_pool(&expected);
    }
}

// ---- element-wise and per-row ops ----------------------------------------------

static void compare_ops(const char* name, const float* got, const float* expected, size_t count, double tolerance) {
    char detail[256];
    size_t at = 0;
    double worst = 0.0;
    for (size_t i = 0; i < count; i++) { // relative to max(1, |expected|)
        double scale = fabs((double)expected[i]) > 1.0 ? fabs((double)expected[i]) : 1.0;
        double error = fabs((double)got[i] - (double)expected[i]) / scale;
        if (!(error <= worst)) worst = error, at = i;
    }
    snprintf(detail, sizeof detail, "worst error %.3g (tolerance %.3g) at %zu: gpu %.9g cpu %.9g", worst, tolerance, at,
             (double)got[at], (double)expected[at]);
    check(worst <= tolerance, name, detail);
}

static void test_ops(void) {
    const int n_rows = 7, size = 2048 + 36, n_heads = 8, n_kv_heads = 2, head_dim = 64;
    const size_t count = (size_t)n_rows * (size_t)size;
    float* x = xmalloc(count * 4);
    float* delta = xmalloc(count * 4);
    float* weight = xmalloc((size_t)size * 4);
    float* expected = xmalloc(count * 4);
    float* expected_x = xmalloc(count * 4);
    float* got = xmalloc(count * 4);
    for (size_t i = 0; i < count; i++)
        x[i] = rng_uniform(-4.0f, 4.0f), delta[i] = rng_uniform(-1.0f, 1.0f);
    for (int i = 0; i < size; i++)
        weight[i] = rng_uniform(0.5f, 1.5f);
    error_info err = {{0}};
    float* dx = to_device(x, count * 4, &err);
    float* ddelta = to_device(delta, count * 4, &err);
    float* dweight = to_device(weight, (size_t)size * 4, &err);
    float* dout = to_device(NULL, count * 4, &err);
    int32_t positions[7] = {0, 1, 5, 100, 1000, 4095, 32767};
    int32_t* dpositions = to_device(positions, sizeof positions, &err);
    if (!dx || !ddelta || !dweight || !dout || !dpositions) {
        check(0, "ops: device buffers", err.message);
        return;
    }
    // RMSNorm
    rmsnorm(expected, x, weight, n_rows, size, 1e-5f, NULL);
    int failed = cuda_rmsnorm(gpu, dout, dx, dweight, n_rows, size, 1e-5f, NULL, &err) ||
                 cuda_copy_to_host(gpu, got, dout, count * 4, &err);
    if (failed)
        check(0, "rmsnorm", err.message);
    else
        compare_ops("rmsnorm", got, expected, count, 1e-5);
    // Fused residual + RMSNorm: x += delta, out = rmsnorm(x)
    memcpy(expected_x, x, count * 4);
    residual_add(expected_x, delta, (int)count, NULL);
    rmsnorm(expected, expected_x, weight, n_rows, size, 1e-5f, NULL);
    failed = cuda_residual_rmsnorm(gpu, dout, dx, ddelta, dweight, n_rows, size, 1e-5f, NULL, &err) ||
             cuda_copy_to_host(gpu, got, dout, count * 4, &err);
    if (failed)
        check(0, "residual + rmsnorm (fused)", err.message);
    else
        compare_ops("residual + rmsnorm (fused): normalized", got, expected, count, 1e-5);
    if (!failed && !cuda_copy_to_host(gpu, got, dx, count * 4, &err))
        check(memcmp(got, expected_x, count * 4) == 0, "residual + rmsnorm (fused): x += delta, bit for bit",
              "x differs from residual_add's");
    // Residual add alone (x now holds x + delta on both sides)
    residual_add(expected_x, delta, (int)count, NULL);
    failed = cuda_residual_add(gpu, dx, ddelta, (int64_t)count, NULL, &err) ||
             cuda_copy_to_host(gpu, got, dx, count * 4, &err);
    check(!failed && memcmp(got, expected_x, count * 4) == 0, "residual add, bit for bit",
          failed ? err.message : "differs from residual_add");
    // SwiGLU on (count) values: gate = x, up = delta
    memcpy(expected, expected_x, count * 4);
    swiglu(expected, delta, (int)count, NULL);
    failed =
        cuda_swiglu(gpu, dx, ddelta, (int64_t)count, NULL, &err) || cuda_copy_to_host(gpu, got, dx, count * 4, &err);
    if (failed)
        check(0, "swiglu", err.message);
    else
        compare_ops("swiglu", got, expected, count, 1e-5);
    // RoPE: rows of a q (n_heads * head_dim) and k (n_kv_heads * head_dim) at 7 positions
    const int q_dim = n_heads * head_dim, k_dim = n_kv_heads * head_dim, stride = q_dim + 2 * k_dim;
    float* qkv = xmalloc((size_t)n_rows * (size_t)stride * 4);
    for (size_t i = 0; i < (size_t)n_rows * (size_t)stride; i++)
        qkv[i] = rng_uniform(-2.0f, 2.0f);
    float* dqkv = to_device(qkv, (size_t)n_rows * (size_t)stride * 4, &err);
    for (int r = 0; r < n_rows; r++)
        rope(qkv + (size_t)r * (size_t)stride, qkv + (size_t)r * (size_t)stride + q_dim, positions[r], n_heads,
             n_kv_heads, head_dim, NULL);
    float* got_qkv = xmalloc((size_t)n_rows * (size_t)stride * 4);
    failed = !dqkv ||
             cuda_rope(gpu, dqkv, dqkv + q_dim, dpositions, n_rows, n_heads, n_kv_heads, head_dim, stride, stride, NULL,
                       &err) ||
             cuda_copy_to_host(gpu, got_qkv, dqkv, (size_t)n_rows * (size_t)stride * 4, &err);
    // The frequencies are the CPU's own powf values (cuda_rope computes them
    // on the host), so the angles are the same floats; sinf / cosf of one
    // float agree to an ulp or two even at 32767 rad.
    if (failed)
        check(0, "rope", err.message);
    else
        compare_ops("rope (positions up to 32767)", got_qkv, qkv, (size_t)n_rows * (size_t)stride, 1e-5);
    cuda_device_free(dx);
    cuda_device_free(ddelta);
    cuda_device_free(dweight);
    cuda_device_free(dout);
    cuda_device_free(dpositions);
    cuda_device_free(dqkv);
    free(x);
    free(delta);
    free(weight);
    free(expected);
    free(expected_x);
    free(got);
    free(qkv);
    free(got_qkv);
}

// ---- the engine: --backend cuda against --backend cpu ---------------------------

static int find_model(char* path, size_t capacity, const char* name) {
    const char* directories[] = {getenv("SERVELAB_MODELS"), "../shared/models", "models"};
    for (size_t i = 0; i < sizeof directories / sizeof directories[0]; i++) {
        if (!directories[i]) continue;
        snprintf(path, capacity, "%s/%s", directories[i], name);
        FILE* file = fopen(path, "rb");
        if (file) {
            fclose(file);
            return 1;
        }
    }
    return 0;
}

typedef struct engine_run {
    int32_t ids[8][160]; // (sequences, tokens) every sequence's tokens at the end
    int n_ids[8];
    int n_sequences;
    kernel_traffic traffic; // summed over the steps
    uint64_t device_ns;     // summed over the steps (CUDA only)
    int n_steps;
} engine_run;

// Runs `n_prompts` greedy requests (n_samples each) to the end on `backend`.
static int run_engine(engine_run* out, const model* m, engine_backend backend, kv_dtype dtype, int n_prompts,
                      int n_samples, error_info* err) {
    static const int32_t prompts[3][6] = {{1, 403, 407, 261, 378, 0}, {1, 50, 60, 70, 0, 0}, {1, 403, 407, 0, 0, 0}};
    static const int prompt_lengths[3] = {5, 4, 3};
    memset(out, 0, sizeof *out);
    engine_config config = engine_config_default();
    config.backend = backend;
    config.kv_dtype = dtype;
    config.block_size = 8;
    config.n_threads = 1;
    engine e;
    if (engine_init(&e, m, &config, err)) return -1;
    for (int i = 0; i < n_prompts; i++) {
        request_params p = {prompts[i], prompt_lengths[i], 120, n_samples, 0.0f, 0.0f, (uint64_t)i, 0.0, true};
        if (engine_add_request(&e, &p, NULL, err)) {
            engine_free(&e);
            return -1;
        }
    }
    while (engine_has_work(&e)) {
        const step_record* r;
        if (engine_step(&e, &r, err)) {
            engine_free(&e);
            return -1;
        }
        traffic_add(&out->traffic, &r->traffic);
        out->device_ns += r->device_ns;
        out->n_steps++;
    }
    out->n_sequences = e.scheduler.n_sequences < 8 ? e.scheduler.n_sequences : 8;
    for (int i = 0; i < out->n_sequences; i++) {
        const sequence* s = &e.scheduler.sequences[i]; // none released here
        out->n_ids[i] = s->n_tokens < 160 ? s->n_tokens : 160;
        memcpy(out->ids[i], s->tokens, (size_t)out->n_ids[i] * sizeof(int32_t));
    }
    engine_free(&e);
    return 0;
}

static void test_engine_backends(void) {
    char path[512];
    if (!find_model(path, sizeof path, "stories260K.bin")) {
        n_skipped++;
        printf("[  SKIPPED ] engine --backend cuda on stories260K: stories260K.bin not found in $SERVELAB_MODELS, "
               "../shared/models or ./models\n");
        return;
    }
    model m;
    error_info err = {{0}};
    if (model_load(&m, path, MODEL_DTYPE_FP32, &err)) {
        check(0, "engine: load stories260K", err.message);
        return;
    }
    static const struct {
        kv_dtype dtype;
        int n_prompts, n_samples;
        const char* name;
    } cases[] = {{KV_F32, 1, 1, "stories260K greedy ids, fp32 KV, one prompt"},
                 {KV_F16, 3, 1, "stories260K greedy ids, fp16 KV, three prompts batched"},
                 {KV_F16, 2, 2, "stories260K greedy forks (copy-on-write on the device pool)"},
                 {KV_I8, 1, 1, "stories260K greedy ids, int8 KV"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        static engine_run cpu, gpu_run;
        char detail[512];
        if (run_engine(&cpu, &m, BACKEND_CPU, cases[c].dtype, cases[c].n_prompts, cases[c].n_samples, &err) ||
            run_engine(&gpu_run, &m, BACKEND_CUDA, cases[c].dtype, cases[c].n_prompts, cases[c].n_samples, &err)) {
            check(0, cases[c].name, err.message);
            continue;
        }
        int same = cpu.n_sequences == gpu_run.n_sequences && cpu.n_sequences > 0;
        int first_sequence = -1, first_token = -1;
        for (int i = 0; same && i < cpu.n_sequences; i++) {
            for (int t = 0; t < cpu.n_ids[i] && t < gpu_run.n_ids[i]; t++)
                if (cpu.ids[i][t] != gpu_run.ids[i][t]) {
                    first_sequence = i, first_token = t;
                    break;
                }
            same = first_sequence < 0 && cpu.n_ids[i] == gpu_run.n_ids[i];
        }
        snprintf(detail, sizeof detail, "%d sequences; first difference at sequence %d, token %d (cpu %d, gpu %d)",
                 cpu.n_sequences, first_sequence, first_token,
                 first_sequence >= 0 ? cpu.ids[first_sequence][first_token] : -1,
                 first_sequence >= 0 ? gpu_run.ids[first_sequence][first_token] : -1);
        check(same, cases[c].name, detail);
        char name[160];
        snprintf(name, sizeof name, "%s: step-record bytes and FLOPs equal the CPU's", cases[c].name);
        snprintf(detail, sizeof detail, "weights %llu vs %llu, KV read %llu vs %llu, activations %llu vs %llu",
                 (unsigned long long)gpu_run.traffic.weight_bytes_read,
                 (unsigned long long)cpu.traffic.weight_bytes_read, (unsigned long long)gpu_run.traffic.kv_bytes_read,
                 (unsigned long long)cpu.traffic.kv_bytes_read, (unsigned long long)gpu_run.traffic.activation_bytes,
                 (unsigned long long)cpu.traffic.activation_bytes);
        check(same && memcmp(&cpu.traffic, &gpu_run.traffic, sizeof cpu.traffic) == 0 && gpu_run.device_ns > 0 &&
                  cpu.device_ns == 0,
              name, detail);
    }
    model_free(&m);
}

int main(void) {
    char message[256];
    if (cuda_device_count(message, sizeof message) == 0) {
        printf("GPU tests NOT RUN: no CUDA device (%s)\n", message);
        return 77;
    }
    error_info err = {{0}};
    if (cuda_context_create(&gpu, &err)) {
        printf("[  FAILED  ] 1 test(s): opening the CUDA device: %s\n", err.message);
        return 1;
    }
    printf("GPU: %s\n", cuda_context_device_name(gpu));
    test_matmul();
    test_embedding();
    test_kv_write();
    test_attention();
    test_ops();
    test_engine_backends();
    cuda_context_destroy(gpu);
    printf("[==========] %d test(s) run.\n", n_passed + n_failed);
    printf("[  PASSED  ] %d test(s).\n", n_passed);
    if (n_skipped) printf("[  SKIPPED ] %d test(s), listed above.\n", n_skipped);
    if (n_failed) printf("[  FAILED  ] %d test(s), listed above.\n", n_failed);
    return n_failed ? 1 : 0;
}
