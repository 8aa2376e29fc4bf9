// attention_exact_avx2: attention over fp32 and int8 caches with AVX2, in
// exactly the scalar reference's order (llama2.c's run.c), so that it gives
// the reference's bits and greedy decodes still match llama2.c token for
// token.
//
// The reference sums one score's head_dim products one after the other: a
// chain of dependent adds that no single dot product can vectorise. So the
// positions go in the lanes instead: eight positions' keys are transposed so
// that lane j holds position t0 + j, and each lane then runs the reference's
// chain (multiply, round, add, round) for its own position. The value pass
// already has the order a vector wants: each output element is a running sum
// over positions, so the dimensions go in the lanes.
//
// The target has no FMA on purpose: GCC contracts a multiply and an add into
// an fma where the target allows it, and the reference rounds the product.
#include <math.h>
#include <string.h>

#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/ops.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define EXACT_TARGET __attribute__((target("avx2")))
#define EXACT_INLINE static inline __attribute__((always_inline, target("avx2")))

enum { LANES = 8 };

// Dimensions [dim, dim + 8) of eight fp32 rows, transposed: column c holds
// element dim + c of rows 0..7. Each 256-bit register is loaded as two
// 128-bit halves (rows j and j + 4), so that the transpose needs only the
// in-lane unpacks and shuffles.
EXACT_INLINE void columns_f32(__m256 columns[LANES], const float* const rows[LANES], int dim) {
    __m256 low[4], high[4]; // low[j]: dims 0..3 of rows j | j+4; high[j]: dims 4..7
    #pragma GCC unroll 8
    for (int j = 0; j < 4; j++) {
        low[j] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(rows[j] + dim)),
                                      _mm_loadu_ps(rows[j + 4] + dim), 1);
        high[j] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(rows[j] + dim + 4)),
                                       _mm_loadu_ps(rows[j + 4] + dim + 4), 1);
    }
    #pragma GCC unroll 8
    for (int half = 0; half < 2; half++) {
        const __m256* r = half ? high : low;
        __m256 a = _mm256_unpacklo_ps(r[0], r[1]), b = _mm256_unpackhi_ps(r[0], r[1]);
        __m256 c = _mm256_unpacklo_ps(r[2], r[3]), d = _mm256_unpackhi_ps(r[2], r[3]);
        columns[4 * half + 0] = _mm256_shuffle_ps(a, c, 0x44);
        columns[4 * half + 1] = _mm256_shuffle_ps(a, c, 0xEE);
        columns[4 * half + 2] = _mm256_shuffle_ps(b, d, 0x44);
        columns[4 * half + 3] = _mm256_shuffle_ps(b, d, 0xEE);
    }
}

// The same for int8 rows, each element widened to the float it is (the
// reference's (float)code).
EXACT_INLINE void columns_i8(__m256 columns[LANES], const int8_t* const rows[LANES], int dim) {
    __m256 r[LANES];
    #pragma GCC unroll 8
    for (int j = 0; j < LANES; j++) {
        long long eight;
        memcpy(&eight, rows[j] + dim, sizeof eight);
        r[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(eight)));
    }
    __m256 t[LANES], s[LANES];
    #pragma GCC unroll 8
    for (int j = 0; j < LANES; j += 2) {
        t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    }
    #pragma GCC unroll 8
    for (int j = 0; j < LANES; j += 4) {
        s[j + 0] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
        s[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
        s[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
        s[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
    }
    #pragma GCC unroll 8
    for (int c = 0; c < 4; c++) {
        columns[c] = _mm256_permute2f128_ps(s[c], s[c + 4], 0x20);
        columns[c + 4] = _mm256_permute2f128_ps(s[c], s[c + 4], 0x31);
    }
}

// One element of a row of either element type, as the reference reads it.
EXACT_INLINE float element_of(const void* row, kv_dtype dtype, int dim) {
    return dtype == KV_I8 ? (float)((const int8_t*)row)[dim] : ((const float*)row)[dim];
}

// Scores of G groups of eight positions for R query rows of one head
// (queries[j]: row j's query of the head; rows[g]: group g's keys of the
// head's KV head, a repeated row where fewer than eight remain;
// scales[g]: their int8 key scales, or NULL). score[j * G + g], lane s:
// the reference's chain over dims 0 .. head_dim-1 for row j and position
// 8g + s, times its scale, divided by sqrt(head_dim). Each transposed key
// block serves the R rows. The R * G chains are independent, so the CPU
// overlaps them (one chain alone would wait on the latency of every add);
// R * G <= 8 leaves registers for the 8 columns. R and G are constants at
// every call, so the loops unroll and the accumulators stay in registers.
EXACT_INLINE void group_scores(__m256 score[8], const float* const queries[ATTENTION_ROWS_MAX], int R, int G,
                               const void* const rows[4][LANES], kv_dtype dtype, int head_dim,
                               const float scales[4][LANES]) {
    #pragma GCC unroll 8
    for (int a = 0; a < R * G; a++) score[a] = _mm256_setzero_ps();
    int dim = 0;
    for (; dim + LANES <= head_dim; dim += LANES)
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            __m256 columns[LANES];
            if (dtype == KV_I8)
                columns_i8(columns, (const int8_t* const*)rows[g], dim);
            else
                columns_f32(columns, (const float* const*)rows[g], dim);
            #pragma GCC unroll 8
            for (int c = 0; c < LANES; c++)
                #pragma GCC unroll 4
                for (int j = 0; j < R; j++)
                    score[j * G + g] = _mm256_add_ps(score[j * G + g],
                                                     _mm256_mul_ps(_mm256_set1_ps(queries[j][dim + c]), columns[c]));
        }
    for (; dim < head_dim; dim++) // the last head_dim % 8 dimensions, one column at a time
        for (int g = 0; g < G; g++) {
            const void* const* r = rows[g];
            __m256 column = _mm256_setr_ps(element_of(r[0], dtype, dim), element_of(r[1], dtype, dim),
                                           element_of(r[2], dtype, dim), element_of(r[3], dtype, dim),
                                           element_of(r[4], dtype, dim), element_of(r[5], dtype, dim),
                                           element_of(r[6], dtype, dim), element_of(r[7], dtype, dim));
            for (int j = 0; j < R; j++)
                score[j * G + g] =
                    _mm256_add_ps(score[j * G + g], _mm256_mul_ps(_mm256_set1_ps(queries[j][dim]), column));
        }
    const __m256 root = _mm256_set1_ps(sqrtf((float)head_dim));
    #pragma GCC unroll 8
    for (int a = 0; a < R * G; a++) {
        if (scales) score[a] = _mm256_mul_ps(score[a], _mm256_loadu_ps(scales[a % G]));
        score[a] = _mm256_div_ps(score[a], root);
    }
}

// Slot of `position` and its first element in `slots` (all of its KV heads).
static const char* slot_row(const void* slots, const kv_layer_view* kv, int position, int slot_bytes,
                            int64_t* slot) {
    *slot = kv_slot_of_position(kv->block_table, kv->block_size, position);
    return (const char*)slots + (size_t)*slot * (size_t)slot_bytes;
}

// The rows' scores for every head, into all_scores (R, n_heads,
// scores_stride): row j at positions 0 .. n_context + j - 1 (a row's
// positions past its own context are computed with the others and left
// unused). The keys are read slot by slot (G * 8 positions, every head), so
// the cache streams in memory order rather than a head's row at a time.
EXACT_INLINE void all_heads_scores(float* all_scores, size_t scores_stride, const float* query, const kv_layer_view* kv,
                                   int n_context, int R, int G, int n_heads, int n_kv_heads, int head_dim) {
    const int slot_heads = kv_view_slot_heads(kv, n_kv_heads), element_bytes = kv_dtype_bytes(kv->dtype);
    const int slot_bytes = slot_heads * head_dim * element_bytes, queries_per_kv_head = n_heads / n_kv_heads;
    const int last_context = n_context + R - 1, block = G * LANES;
    const size_t width = (size_t)n_heads * (size_t)head_dim;
    const bool int8 = kv->dtype == KV_I8;
    for (int t0 = 0; t0 < last_context; t0 += block) {
        const int n = last_context - t0 < block ? last_context - t0 : block;
        const char* slot_keys[4 * LANES]; // the positions' slots, the first repeated past the end
        int64_t slots[4 * LANES];
        for (int s = 0; s < block; s++)
            slot_keys[s] = slot_row(kv->key_slots, kv, t0 + (s < n ? s : 0), slot_bytes, &slots[s]);
        for (int h = 0; h < n_heads; h++) {
            const int kv_head = h / queries_per_kv_head;
            const size_t head_bytes = (size_t)kv_head * (size_t)head_dim * (size_t)element_bytes;
            const void* rows[4][LANES];
            float key_scales[4][LANES]; // the positions' int8 key scales of this KV head
            for (int s = 0; s < block; s++) {
                rows[s / LANES][s % LANES] = slot_keys[s] + head_bytes;
                key_scales[s / LANES][s % LANES] =
                    int8 ? kv->key_scales[(size_t)slots[s] * (size_t)slot_heads + (size_t)kv_head] : 0.0f;
            }
            const float* queries[ATTENTION_ROWS_MAX];
            for (int j = 0; j < R; j++) queries[j] = query + (size_t)j * width + (size_t)h * (size_t)head_dim;
            __m256 score[8];
            group_scores(score, queries, R, G, (const void* const(*)[LANES])rows, kv->dtype, head_dim,
                         int8 ? (const float(*)[LANES])key_scales : NULL);
            for (int j = 0; j < R; j++) {
                float lanes[4 * LANES];
                for (int g = 0; g < G; g++) _mm256_storeu_ps(lanes + g * LANES, score[j * G + g]);
                float* row_scores = all_scores + ((size_t)j * (size_t)n_heads + (size_t)h) * scores_stride;
                memcpy(row_scores + t0, lanes, (size_t)n * sizeof(float));
            }
        }
    }
}

// out (R, n_heads * head_dim): row j's heads, each the sum over t <
// n_context + j in order of weight_t * v_t, position by position (every
// head of a slot, in memory order; a value vector is loaded once for the
// rows). The last head_dim % 8 elements of a head in scalar code, which
// rounds the same way (no FMA in this target).
EXACT_INLINE void all_heads_values(float* out, const float* all_scores, size_t scores_stride, const kv_layer_view* kv,
                                   int n_context, int R, int n_heads, int n_kv_heads, int head_dim) {
    const int slot_heads = kv_view_slot_heads(kv, n_kv_heads), element_bytes = kv_dtype_bytes(kv->dtype);
    const int slot_bytes = slot_heads * head_dim * element_bytes, queries_per_kv_head = n_heads / n_kv_heads;
    const bool int8 = kv->dtype == KV_I8;
    const int vector_dims = head_dim / LANES * LANES;
    const size_t width = (size_t)n_heads * (size_t)head_dim;
    memset(out, 0, (size_t)R * width * sizeof(float));
    for (int t = 0; t < n_context + R - 1; t++) {
        const int first_row = t < n_context ? 0 : t - n_context + 1; // rows whose context holds t
        int64_t slot;
        const char* values = slot_row(kv->value_slots, kv, t, slot_bytes, &slot);
        for (int h = 0; h < n_heads; h++) {
            const int kv_head = h / queries_per_kv_head;
            const void* row = values + (size_t)kv_head * (size_t)head_dim * (size_t)element_bytes;
            const float scale = int8 ? kv->value_scales[(size_t)slot * (size_t)slot_heads + (size_t)kv_head] : 1.0f;
            float weights[ATTENTION_ROWS_MAX];
            for (int j = first_row; j < R; j++) {
                weights[j] = all_scores[((size_t)j * (size_t)n_heads + (size_t)h) * scores_stride + (size_t)t];
                if (int8) weights[j] *= scale;
            }
            for (int dim = 0; dim < vector_dims; dim += LANES) {
                __m256 v;
                if (int8) {
                    long long codes;
                    memcpy(&codes, (const int8_t*)row + dim, sizeof codes);
                    v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(codes)));
                } else {
                    v = _mm256_loadu_ps((const float*)row + dim);
                }
                for (int j = first_row; j < R; j++) {
                    float* o = out + (size_t)j * width + (size_t)h * (size_t)head_dim + (size_t)dim;
                    const __m256 weighted = _mm256_mul_ps(_mm256_set1_ps(weights[j]), v);
                    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), weighted));
                }
            }
            for (int dim = vector_dims; dim < head_dim; dim++)
                for (int j = first_row; j < R; j++)
                    out[(size_t)j * width + (size_t)h * (size_t)head_dim + (size_t)dim] +=
                        weights[j] * element_of(row, kv->dtype, dim);
        }
    }
}

// R rows with G groups of positions per pass (R * G <= 8; constants).
EXACT_INLINE void exact_rows(float* out, const float* query, const kv_layer_view* kv, int n_context, int R, int G,
                             int n_heads, int n_kv_heads, int head_dim, float* all_scores) {
    const size_t scores_stride = (size_t)(n_context + R - 1);
    all_heads_scores(all_scores, scores_stride, query, kv, n_context, R, G, n_heads, n_kv_heads, head_dim);
    for (int j = 0; j < R; j++)
        for (int h = 0; h < n_heads; h++)
            softmax(all_scores + ((size_t)j * (size_t)n_heads + (size_t)h) * scores_stride, n_context + j);
    all_heads_values(out, all_scores, scores_stride, kv, n_context, R, n_heads, n_kv_heads, head_dim);
}

EXACT_TARGET void attention_rows_exact_avx2(float* out, const float* query, const kv_layer_view* kv, int n_context,
                                            int n_rows, int n_heads, int n_kv_heads, int head_dim, float* all_scores) {
    switch (n_rows) { // one row: 4 groups of positions for 4 chains; more rows bring chains of their own
    case 1: exact_rows(out, query, kv, n_context, 1, 4, n_heads, n_kv_heads, head_dim, all_scores); break;
    case 2: exact_rows(out, query, kv, n_context, 2, 2, n_heads, n_kv_heads, head_dim, all_scores); break;
    case 3: exact_rows(out, query, kv, n_context, 3, 2, n_heads, n_kv_heads, head_dim, all_scores); break;
    default: exact_rows(out, query, kv, n_context, 4, 2, n_heads, n_kv_heads, head_dim, all_scores); break;
    }
}

#else // not x86: never called (cpu_simd_level_selected() is scalar there)

void attention_rows_exact_avx2(float* out, const float* query, const kv_layer_view* kv, int n_context, int n_rows,
                               int n_heads, int n_kv_heads, int head_dim, float* all_scores) {
    const size_t width = (size_t)n_heads * (size_t)head_dim;
    for (int j = 0; j < n_rows; j++)
        attention_row_scalar(out + (size_t)j * width, query + (size_t)j * width, kv, n_context + j, n_heads,
                             n_kv_heads, head_dim, all_scores);
}

#endif
