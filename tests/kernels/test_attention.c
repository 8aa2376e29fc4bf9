// attention_row: correct against a double-precision reference, the same bits
// for a paged cache (scattered blocks) as for a contiguous one, and the
// AVX2 kernel's one-pass slot order equal to its head-by-head order, bit
// for bit (batch invariance does not depend on which one runs).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fp16.h"
#include "tests/test_support.h"

// Grouped-query heads and a head_dim that exercises every part of the AVX2
// kernel: 44 = one 32-element run of 4 vectors, one more vector, and a
// scalar tail of 4 (no multiple of 8). Contexts 1, 20, 39, 58, 77 end runs
// of 16 positions and groups of 8 scores part-way.
enum { N_HEADS = 6, N_KV_HEADS = 3, HEAD_DIM = 44, KV_DIM = N_KV_HEADS * HEAD_DIM, CONTEXT = 77, BLOCK = 16 };
enum { N_BLOCKS = (CONTEXT + BLOCK - 1) / BLOCK + 3 }; // a few spare blocks: the table skips some

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static float random_uniform(void) { // in [-1, 1)
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

typedef struct caches {
    float keys[CONTEXT][KV_DIM], values[CONTEXT][KV_DIM]; // position order, fp32
    float query[N_HEADS * HEAD_DIM];
    int32_t contiguous_table[CONTEXT]; // block size 1: slot = position
    int32_t paged_table[N_BLOCKS];     // block size 16, scattered
    void* contiguous_keys;             // (CONTEXT, KV_DIM) of the dtype
    void* contiguous_values;
    void* paged_keys; // (N_BLOCKS * BLOCK, KV_DIM) of the dtype
    void* paged_values;
} caches;

static void store(void* slots, kv_dtype dtype, size_t index, float value) {
    if (dtype == KV_F16)
        ((uint16_t*)slots)[index] = fp32_to_fp16(value);
    else
        ((float*)slots)[index] = value;
}

static void build(caches* c, kv_dtype dtype) {
    size_t element = (size_t)kv_dtype_bytes(dtype);
    c->contiguous_keys = calloc((size_t)CONTEXT * KV_DIM, element);
    c->contiguous_values = calloc((size_t)CONTEXT * KV_DIM, element);
    c->paged_keys = calloc((size_t)N_BLOCKS * BLOCK * KV_DIM, element);
    c->paged_values = calloc((size_t)N_BLOCKS * BLOCK * KV_DIM, element);
    assert_non_null(c->paged_values);
    for (int b = 0; b < N_BLOCKS; b++)
        c->paged_table[b] = (N_BLOCKS - 1 - b) * 5 % N_BLOCKS; // 5 is coprime to N_BLOCKS
    for (int t = 0; t < CONTEXT; t++) {
        c->contiguous_table[t] = t;
        int64_t paged_slot = kv_slot_of_position(c->paged_table, BLOCK, t);
        for (int i = 0; i < KV_DIM; i++) {
            c->keys[t][i] = random_uniform();
            c->values[t][i] = random_uniform();
            if (dtype == KV_F16) { // what the cache holds, exactly
                c->keys[t][i] = fp16_to_fp32(fp32_to_fp16(c->keys[t][i]));
                c->values[t][i] = fp16_to_fp32(fp32_to_fp16(c->values[t][i]));
            }
            store(c->contiguous_keys, dtype, (size_t)t * KV_DIM + (size_t)i, c->keys[t][i]);
            store(c->contiguous_values, dtype, (size_t)t * KV_DIM + (size_t)i, c->values[t][i]);
            store(c->paged_keys, dtype, (size_t)paged_slot * KV_DIM + (size_t)i, c->keys[t][i]);
            store(c->paged_values, dtype, (size_t)paged_slot * KV_DIM + (size_t)i, c->values[t][i]);
        }
    }
    for (int i = 0; i < N_HEADS * HEAD_DIM; i++)
        c->query[i] = 2.0f * random_uniform();
}

static void release(caches* c) {
    free(c->contiguous_keys);
    free(c->contiguous_values);
    free(c->paged_keys);
    free(c->paged_values);
}

static kv_layer_view contiguous_view(const caches* c, kv_dtype dtype) {
    return (kv_layer_view){dtype, c->contiguous_keys, c->contiguous_values, c->contiguous_table, 1, NULL, NULL, 0};
}

static kv_layer_view paged_view(const caches* c, kv_dtype dtype) {
    return (kv_layer_view){dtype, c->paged_keys, c->paged_values, c->paged_table, BLOCK, NULL, NULL, 0};
}

static void check_against_reference(const caches* c, const float* out) {
    const int group = N_HEADS / N_KV_HEADS;
    for (int h = 0; h < N_HEADS; h++) {
        double scores[CONTEXT], max_score = -INFINITY, sum = 0.0;
        for (int t = 0; t < CONTEXT; t++) {
            double dot = 0.0;
            for (int i = 0; i < HEAD_DIM; i++)
                dot += (double)c->query[h * HEAD_DIM + i] * c->keys[t][(h / group) * HEAD_DIM + i];
            scores[t] = dot / sqrt((double)HEAD_DIM);
            max_score = fmax(max_score, scores[t]);
        }
        for (int t = 0; t < CONTEXT; t++)
            sum += scores[t] = exp(scores[t] - max_score);
        for (int i = 0; i < HEAD_DIM; i++) {
            double expected = 0.0;
            for (int t = 0; t < CONTEXT; t++)
                expected += scores[t] / sum * c->values[t][(h / group) * HEAD_DIM + i];
            assert_true(fabs(out[h * HEAD_DIM + i] - expected) < 1e-5);
        }
    }
}

static void check_layouts(kv_dtype dtype) {
    caches* c = calloc(1, sizeof *c);
    assert_non_null(c);
    build(c, dtype);
    float scores[CONTEXT], contiguous_out[N_HEADS * HEAD_DIM], paged_out[N_HEADS * HEAD_DIM];
    kv_layer_view contiguous = contiguous_view(c, dtype), paged = paged_view(c, dtype);
    kernel_traffic traffic = {0};
    attention_row(contiguous_out, c->query, &contiguous, CONTEXT, N_HEADS, N_KV_HEADS, HEAD_DIM, scores, &traffic);
    attention_row(paged_out, c->query, &paged, CONTEXT, N_HEADS, N_KV_HEADS, HEAD_DIM, scores, NULL);
    check_against_reference(c, contiguous_out);
    assert_memory_equal(contiguous_out, paged_out, sizeof paged_out); // the layout changes where, not what
    assert_int_equal(traffic.kv_bytes_read, 2ull * CONTEXT * (uint64_t)kv_slot_bytes(dtype, N_KV_HEADS, HEAD_DIM));
    assert_int_equal(traffic.attention_flops, 4ull * N_HEADS * CONTEXT * HEAD_DIM);
    release(c);
    free(c);
}

static void test_paged_equals_contiguous_fp16(void** state) {
    (void)state;
    check_layouts(KV_F16);
}

static void test_paged_equals_contiguous_fp32(void** state) {
    (void)state;
    check_layouts(KV_F32);
}

static void test_slot_order_equals_head_order(void** state) {
    (void)state;
    if (!test_simd_level_available(CPU_SIMD_AVX2)) return;
    caches* c = calloc(1, sizeof *c);
    assert_non_null(c);
    build(c, KV_F16);
    float scores[CONTEXT], all_scores[N_HEADS * CONTEXT];
    float head_order[N_HEADS * HEAD_DIM], slot_order[N_HEADS * HEAD_DIM];
    for (int layout = 0; layout < 2; layout++) {
        kv_layer_view view = layout ? paged_view(c, KV_F16) : contiguous_view(c, KV_F16);
        for (int n = 1; n <= CONTEXT; n += 19) { // partial last blocks too
            attention_row_f16_avx2(head_order, c->query, &view, n, N_HEADS, N_KV_HEADS, HEAD_DIM, scores, NULL);
            attention_row_f16_avx2(slot_order, c->query, &view, n, N_HEADS, N_KV_HEADS, HEAD_DIM, scores, all_scores);
            assert_memory_equal(head_order, slot_order, sizeof slot_order);
        }
    }
    release(c);
    free(c);
}

// The AVX2 kernel's other paths: head_dim 72 (a 64-element value run of 8
// vectors, then one vector; no scalar tail, so the 8 scores are divided as
// one vector) and 10 heads (8 heads' dot products side by side, then 2).
// Slot order against head order, bit for bit.
enum { WIDE_HEADS = 10, WIDE_KV_HEADS = 5, WIDE_DIM = 72, WIDE_KV = WIDE_KV_HEADS * WIDE_DIM, WIDE_CONTEXT = 53 };

static void test_wide_heads_slot_order(void** state) {
    (void)state;
    if (!test_simd_level_available(CPU_SIMD_AVX2)) return;
    uint16_t* keys = malloc((size_t)WIDE_CONTEXT * WIDE_KV * sizeof *keys);   // (WIDE_CONTEXT, WIDE_KV)
    uint16_t* values = malloc((size_t)WIDE_CONTEXT * WIDE_KV * sizeof *values); // (WIDE_CONTEXT, WIDE_KV)
    assert_non_null(keys);
    assert_non_null(values);
    int32_t table[WIDE_CONTEXT];
    float query[WIDE_HEADS * WIDE_DIM], scores[WIDE_CONTEXT], all_scores[WIDE_HEADS * WIDE_CONTEXT];
    float head_order[WIDE_HEADS * WIDE_DIM], slot_order[WIDE_HEADS * WIDE_DIM];
    for (int t = 0; t < WIDE_CONTEXT; t++) table[t] = WIDE_CONTEXT - 1 - t; // reversed slots
    for (int i = 0; i < WIDE_CONTEXT * WIDE_KV; i++) {
        keys[i] = fp32_to_fp16(random_uniform());
        values[i] = fp32_to_fp16(random_uniform());
    }
    for (int i = 0; i < WIDE_HEADS * WIDE_DIM; i++) query[i] = 0.5f * random_uniform();
    kv_layer_view view = {KV_F16, keys, values, table, 1, NULL, NULL, 0};
    for (int n = 1; n <= WIDE_CONTEXT; n += 13) {
        attention_row_f16_avx2(head_order, query, &view, n, WIDE_HEADS, WIDE_KV_HEADS, WIDE_DIM, scores, NULL);
        attention_row_f16_avx2(slot_order, query, &view, n, WIDE_HEADS, WIDE_KV_HEADS, WIDE_DIM, scores, all_scores);
        assert_memory_equal(head_order, slot_order, sizeof slot_order);
    }
    free(keys);
    free(values);
}

// attention_rows: each of up to ATTENTION_ROWS_MAX rows of a prompt gets
// the bits attention_row gives it alone, for every row count, a context
// that ends runs of 16 positions anywhere, grouped-query heads, head sizes
// with and without a scalar tail (44: 32 + 8 + 4; 64; 20: 16 + 4; 32), a
// paged (scattered, block 5) and a contiguous table, fp16 and fp32 caches.
// At AVX-512 one row's heads and a prompt's rows go through different
// pairings (keys8_pairs), so this also compares those with each other.
typedef struct rows_shape {
    int n_heads, n_kv_heads, head_dim;
} rows_shape;

static void check_rows_shape(const rows_shape* shape, kv_dtype dtype, int block_size) {
    enum { MAX_POSITIONS = 70 };
    const int kv_dim = shape->n_kv_heads * shape->head_dim, width = shape->n_heads * shape->head_dim;
    const int n_blocks = (MAX_POSITIONS + block_size - 1) / block_size;
    const size_t element = (size_t)kv_dtype_bytes(dtype);
    void* keys = calloc((size_t)n_blocks * (size_t)block_size * (size_t)kv_dim, element);
    void* values = calloc((size_t)n_blocks * (size_t)block_size * (size_t)kv_dim, element);
    int32_t* table = malloc((size_t)n_blocks * sizeof *table);
    float* query = malloc((size_t)ATTENTION_ROWS_MAX * (size_t)width * sizeof *query);
    float* together = malloc((size_t)ATTENTION_ROWS_MAX * (size_t)width * sizeof *together);
    float* alone = malloc((size_t)width * sizeof *alone);
    float scores[MAX_POSITIONS];
    assert_true(keys && values && table && query && together && alone);
    for (int b = 0; b < n_blocks; b++) table[b] = block_size == 1 ? b : (n_blocks - 1 - b) * 7 % n_blocks;
    for (size_t i = 0; i < (size_t)n_blocks * (size_t)block_size * (size_t)kv_dim; i++) {
        store(keys, dtype, i, random_uniform());
        store(values, dtype, i, random_uniform());
    }
    for (int i = 0; i < ATTENTION_ROWS_MAX * width; i++) query[i] = 2.0f * random_uniform();
    kv_layer_view view = {dtype, keys, values, table, block_size, NULL, NULL, 0};
    for (int n_rows = 1; n_rows <= ATTENTION_ROWS_MAX; n_rows++) {
        for (int n_context = 1; n_context + n_rows - 1 <= MAX_POSITIONS; n_context += 3) {
            kernel_traffic traffic_together = {0}, traffic_alone = {0};
            attention_rows(together, query, &view, n_context, n_rows, shape->n_heads, shape->n_kv_heads,
                           shape->head_dim, scores, &traffic_together);
            for (int j = 0; j < n_rows; j++) {
                attention_row(alone, query + (size_t)j * (size_t)width, &view, n_context + j, shape->n_heads,
                              shape->n_kv_heads, shape->head_dim, scores, &traffic_alone);
                if (memcmp(alone, together + (size_t)j * (size_t)width, (size_t)width * sizeof(float)) != 0)
                    fail_msg("%s, %d heads / %d KV heads of %d, block %d: row %d of %d at context %d differs from "
                             "the row alone",
                             kv_dtype_name(dtype), shape->n_heads, shape->n_kv_heads, shape->head_dim, block_size, j,
                             n_rows, n_context + j);
            }
            assert_memory_equal(&traffic_together, &traffic_alone, sizeof traffic_alone);
        }
    }
    free(keys);
    free(values);
    free(table);
    free(query);
    free(together);
    free(alone);
}

static void test_rows_equal_each_row_alone(void** state) {
    (void)state;
    // {6, 2, 32}: heads 2 and 3 (one pair at AVX-512) read different KV heads.
    const rows_shape shapes[] = {{6, 3, 44}, {12, 12, 64}, {5, 5, 20}, {8, 2, 16}, {6, 2, 32}};
    for (int s = 0; s < 5; s++) {
        check_rows_shape(&shapes[s], KV_F16, 1);
        check_rows_shape(&shapes[s], KV_F16, 5);
        check_rows_shape(&shapes[s], KV_F32, 5);
    }
}

// fp32 and int8 caches: the AVX2 kernel (positions in the lanes for the
// scores) gives the scalar reference's bits, which is what keeps greedy
// decodes equal to llama2.c's: one row, and 2 .. ATTENTION_ROWS_MAX rows of
// a prompt, each row as the reference computes it alone. Head sizes with
// and without a tail of head_dim % 8 (44, 64, 20, 3, 72), grouped-query
// heads, contexts that end a group of 8, 16 or 32 positions anywhere, a
// scattered table of block 5, slots of different magnitudes (alike within
// a row, so that the order of a row's sum shows in its bits), and a view
// of the last KV head only (a thread's slice).
static void check_exact_shape(const rows_shape* shape, kv_dtype dtype) {
    enum { MAX_POSITIONS = 75, BLOCK_SIZE = 5, N_TABLE = MAX_POSITIONS / BLOCK_SIZE, R_MAX = ATTENTION_ROWS_MAX };
    const int kv_dim = shape->n_kv_heads * shape->head_dim, width = shape->n_heads * shape->head_dim;
    const size_t n_slots = (size_t)N_TABLE * BLOCK_SIZE, element = (size_t)kv_dtype_bytes(dtype);
    const bool int8 = dtype == KV_I8;
    int8_t* keys = calloc(n_slots * (size_t)kv_dim, element);                           // (n_slots, kv_dim), dtype
    int8_t* values = calloc(n_slots * (size_t)kv_dim, element);                         // (n_slots, kv_dim)
    float* key_scales = malloc(n_slots * (size_t)shape->n_kv_heads * sizeof(float));   // (n_slots, n_kv_heads)
    float* value_scales = malloc(n_slots * (size_t)shape->n_kv_heads * sizeof(float)); // (n_slots, n_kv_heads)
    float* query = malloc((size_t)R_MAX * (size_t)width * sizeof *query);              // (R_MAX, width)
    float* all_scores = malloc((size_t)R_MAX * (size_t)shape->n_heads * MAX_POSITIONS * sizeof *all_scores);
    float* expected = malloc((size_t)width * sizeof *expected);
    float* got = malloc((size_t)R_MAX * (size_t)width * sizeof *got); // (R_MAX, width)
    float scores[MAX_POSITIONS];
    int32_t table[N_TABLE];
    assert_true(keys && values && key_scales && value_scales && query && all_scores && expected && got);
    for (int b = 0; b < N_TABLE; b++) table[b] = (N_TABLE - 1 - b) * 7 % N_TABLE; // 7 is coprime to 15
    for (size_t i = 0; i < n_slots * (size_t)kv_dim; i++) {
        const int slot = (int)(i / (size_t)kv_dim);
        if (int8) {
            keys[i] = (int8_t)(127.0f * random_uniform());
            values[i] = (int8_t)(127.0f * random_uniform());
        } else { // keys of 2^-3 .. 2^3 (scores of a few units: no one-hot softmax), values 2^-20 .. 2^20
            ((float*)keys)[i] = ldexpf(random_uniform(), slot % 7 - 3);
            ((float*)values)[i] = ldexpf(random_uniform(), slot % 41 - 20);
        }
    }
    for (size_t i = 0; i < n_slots * (size_t)shape->n_kv_heads; i++) {
        key_scales[i] = 0.01f * (1.0f + random_uniform());
        value_scales[i] = 0.03f * (1.0f + random_uniform());
    }
    for (int i = 0; i < R_MAX * width; i++) query[i] = ldexpf(random_uniform(), int8 ? -4 : -(i % 3));
    kv_layer_view whole = {dtype, keys, values, table, BLOCK_SIZE, int8 ? key_scales : NULL, int8 ? value_scales : NULL,
                           0};
    // The last KV head alone, as a thread's slice sees it.
    const int group = shape->n_heads / shape->n_kv_heads, last = shape->n_kv_heads - 1;
    kv_layer_view slice = whole;
    slice.key_slots = keys + (size_t)last * (size_t)shape->head_dim * element;
    slice.value_slots = values + (size_t)last * (size_t)shape->head_dim * element;
    slice.key_scales = int8 ? key_scales + last : NULL;
    slice.value_scales = int8 ? value_scales + last : NULL;
    slice.slot_kv_heads = shape->n_kv_heads;
    const size_t slice_offset = (size_t)last * (size_t)group * (size_t)shape->head_dim;
    const size_t slice_bytes = (size_t)group * (size_t)shape->head_dim * sizeof(float);
    for (int n_context = 1; n_context <= MAX_POSITIONS; n_context += n_context < 40 ? 1 : 7) {
        attention_row_scalar(expected, query, &whole, n_context, shape->n_heads, shape->n_kv_heads, shape->head_dim,
                             scores);
        attention_rows_exact_avx2(got, query, &whole, n_context, 1, shape->n_heads, shape->n_kv_heads,
                                  shape->head_dim, all_scores);
        if (memcmp(got, expected, (size_t)width * sizeof(float)) != 0)
            fail_msg("%s, %d heads / %d KV heads of %d, context %d: the AVX2 kernel differs from the scalar one",
                     kv_dtype_name(dtype), shape->n_heads, shape->n_kv_heads, shape->head_dim, n_context);
        memset(got, 0xff, (size_t)width * sizeof(float));
        attention_rows_exact_avx2(got, query + slice_offset, &slice, n_context, 1, group, 1, shape->head_dim,
                                  all_scores);
        if (memcmp(got, expected + slice_offset, slice_bytes) != 0)
            fail_msg("%s, %d heads / %d KV heads of %d, context %d: the last KV head's slice differs",
                     kv_dtype_name(dtype), shape->n_heads, shape->n_kv_heads, shape->head_dim, n_context);
        for (int n_rows = 2; n_rows <= R_MAX && n_context + n_rows - 1 <= MAX_POSITIONS; n_rows++) {
            memset(got, 0xff, (size_t)n_rows * (size_t)width * sizeof(float));
            attention_rows_exact_avx2(got, query, &whole, n_context, n_rows, shape->n_heads, shape->n_kv_heads,
                                      shape->head_dim, all_scores);
            for (int j = 0; j < n_rows; j++) {
                attention_row_scalar(expected, query + (size_t)j * (size_t)width, &whole, n_context + j,
                                     shape->n_heads, shape->n_kv_heads, shape->head_dim, scores);
                if (memcmp(got + (size_t)j * (size_t)width, expected, (size_t)width * sizeof(float)) != 0)
                    fail_msg("%s, %d heads / %d KV heads of %d: row %d of %d at context %d differs from the "
                             "scalar row",
                             kv_dtype_name(dtype), shape->n_heads, shape->n_kv_heads, shape->head_dim, j, n_rows,
                             n_context + j);
            }
        }
    }
    free(keys);
    free(values);
    free(key_scales);
    free(value_scales);
    free(query);
    free(all_scores);
    free(expected);
    free(got);
}

static void test_exact_kernel_equals_scalar(void** state) {
    (void)state;
    if (!test_simd_level_available(CPU_SIMD_AVX2)) return;
    const rows_shape shapes[] = {{6, 3, 44}, {12, 12, 64}, {5, 5, 20}, {8, 2, 16}, {2, 2, 3}, {4, 1, 72}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        check_exact_shape(&shapes[s], KV_F32);
        check_exact_shape(&shapes[s], KV_I8);
    }
}

// A view of some KV heads (slot_kv_heads: the cache's full stride), as
// forward() gives each thread a slice of a decode row's heads: every slice
// gets the bits of the whole row for its heads, and the slices' traffic
// adds up to the row's. Both layouts, fp16 and fp32, every split of the 3 KV heads.
static void test_head_slices_equal_the_whole_row(void** state) {
    (void)state;
    const kv_dtype dtypes[] = {KV_F16, KV_F32};
    const int group = N_HEADS / N_KV_HEADS;
    for (int d = 0; d < 2; d++) {
        caches* c = calloc(1, sizeof *c);
        assert_non_null(c);
        build(c, dtypes[d]);
        const size_t element = (size_t)kv_dtype_bytes(dtypes[d]);
        for (int layout = 0; layout < 2; layout++) {
            kv_layer_view whole = layout ? paged_view(c, dtypes[d]) : contiguous_view(c, dtypes[d]);
            float scores[CONTEXT], expected[N_HEADS * HEAD_DIM], got[N_HEADS * HEAD_DIM];
            kernel_traffic whole_traffic = {0};
            attention_row(expected, c->query, &whole, CONTEXT, N_HEADS, N_KV_HEADS, HEAD_DIM, scores, &whole_traffic);
            for (int n_slices = 2; n_slices <= N_KV_HEADS; n_slices++) {
                memset(got, 0xff, sizeof got);
                kernel_traffic slices_traffic = {0};
                for (int k = 0; k < n_slices; k++) {
                    int begin = N_KV_HEADS * k / n_slices, end = N_KV_HEADS * (k + 1) / n_slices;
                    kv_layer_view slice = whole;
                    slice.key_slots = (const char*)whole.key_slots + (size_t)begin * HEAD_DIM * element;
                    slice.value_slots = (const char*)whole.value_slots + (size_t)begin * HEAD_DIM * element;
                    slice.slot_kv_heads = N_KV_HEADS;
                    size_t offset = (size_t)begin * (size_t)group * HEAD_DIM;
                    attention_row(got + offset, c->query + offset, &slice, CONTEXT, (end - begin) * group, end - begin,
                                  HEAD_DIM, scores, &slices_traffic);
                }
                if (memcmp(got, expected, sizeof got) != 0)
                    fail_msg("%s, %s, %d slices: a slice's heads differ from the whole row's",
                             kv_dtype_name(dtypes[d]), layout ? "paged" : "contiguous", n_slices);
                assert_memory_equal(&slices_traffic, &whole_traffic, sizeof whole_traffic);
            }
        }
        release(c);
        free(c);
    }
}

// The softmax's maximum, wherever it is: two scores of about 200 and 190
// among zeros give weights of about 1 and e^-10. A maximum that missed
// them (say, in the last positions after the full vectors) would clamp
// both exponents to the same value and average the two values instead.
// Every pair of positions of an 11-position context (one vector + 3).
static void test_softmax_finds_the_maximum_anywhere(void** state) {
    (void)state;
    enum { CTX = 11, DIM = 8 };
    uint16_t keys[CTX * DIM], values[CTX * DIM];
    int32_t table[CTX];
    float query[DIM] = {1.0f}, out[DIM], scores[CTX];
    const float root = sqrtf((float)DIM);
    for (int t = 0; t < CTX; t++) table[t] = t;
    for (int first = 0; first < CTX; first++)
        for (int second = 0; second < CTX; second++) {
            if (second == first) continue;
            for (int t = 0; t < CTX; t++)
                for (int i = 0; i < DIM; i++) {
                    float key = i != 0 ? 0.0f : t == first ? 200.0f * root : t == second ? 190.0f * root : 0.0f;
                    keys[t * DIM + i] = fp32_to_fp16(key);
                    values[t * DIM + i] = fp32_to_fp16(i == 0 ? (float)t : 0.0f);
                }
            kv_layer_view view = {KV_F16, keys, values, table, 1, NULL, NULL, 0};
            attention_row(out, query, &view, CTX, 1, 1, DIM, scores, NULL);
            if (fabsf(out[0] - (float)first) > 0.01f)
                fail_msg("scores of ~200 at %d and ~190 at %d: output %.4f, expected about %d", first, second,
                         (double)out[0], first);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paged_equals_contiguous_fp16),
        cmocka_unit_test(test_paged_equals_contiguous_fp32),
        cmocka_unit_test(test_slot_order_equals_head_order),
        cmocka_unit_test(test_wide_heads_slot_order),
        cmocka_unit_test(test_rows_equal_each_row_alone),
        cmocka_unit_test(test_head_slices_equal_the_whole_row),
        cmocka_unit_test(test_exact_kernel_equals_scalar),
        cmocka_unit_test(test_softmax_finds_the_maximum_anywhere),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
