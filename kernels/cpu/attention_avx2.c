// Attention over an fp16 KV cache with AVX2 + F16C + FMA.
//
// Same equations and the same order over positions t as the scalar kernel
// in attention.c; only the sums over head_dim are vectorised: q.k uses one
// 8-lane accumulator over head_dim in order, then a fixed horizontal sum,
// then the scalar tail. Every row is computed the same way whatever the
// batch, block size or layout, so batch invariance holds within this level.
//
// Memory order. A cached slot holds every KV head side by side (kv_dim
// elements, 1.5 KiB for stories110M in fp16). Walking one head at a time
// over the whole context reads 128 bytes of every slot and comes back for
// the next head, n_heads passes over memory with a 1.5 KiB stride. When the
// caller's scratch holds every head's scores, the kernel instead walks the
// slots once, in position order, and does every head at each slot: one
// sequential pass over the keys and one over the values, block after block,
// so a paged cache and a contiguous one are read the same way. Each
// element's operations and their order are unchanged (a score is the same
// dot product; out_h still adds p[t] v_t for t = 0, 1, ...), so the bits are
// the same in either order.
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd_x86.h"

AVX2_INLINE float dot_f16(const float* q, const uint16_t* k, int n) {
    __m256 accumulator = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 keys = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(k + i)));
        accumulator = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), keys, accumulator);
    }
    float sum = hsum8(accumulator);
    for (; i < n; i++)
        sum += q[i] * _cvtsh_ss(k[i]);
    return sum;
}

AVX2_INLINE void add_scaled_f16(float* out, float weight, const uint16_t* v, int n) {
    __m256 w = _mm256_set1_ps(weight);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 values = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(v + i)));
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(w, values, _mm256_loadu_ps(out + i)));
    }
    for (; i < n; i++)
        out[i] = fmaf(weight, _cvtsh_ss(v[i]), out[i]);
}

// Every head at once, slots in position order. all_scores: (n_heads, n_context).
AVX2_TARGET static void attention_slot_major(float* out, const float* query, const kv_layer_view* kv, int n_context,
                                             int n_heads, int n_kv_heads, int head_dim, float* all_scores) {
    const int kv_dim = n_kv_heads * head_dim;
    const int queries_per_kv_head = n_heads / n_kv_heads;
    const uint16_t* keys = kv->key_slots;
    const uint16_t* values = kv->value_slots;
    const float scale = sqrtf((float)head_dim);
    const int block_size = kv->block_size;
    for (int t0 = 0, b = 0; t0 < n_context; t0 += block_size, b++) {
        const uint16_t* slot_keys = keys + (size_t)kv->block_table[b] * (size_t)block_size * (size_t)kv_dim;
        int n_slots = n_context - t0 < block_size ? n_context - t0 : block_size;
        for (int s = 0; s < n_slots; s++, slot_keys += kv_dim)
            for (int h = 0; h < n_heads; h++)
                all_scores[(size_t)h * (size_t)n_context + (size_t)(t0 + s)] =
                    dot_f16(query + (size_t)h * (size_t)head_dim,
                            slot_keys + (size_t)(h / queries_per_kv_head) * (size_t)head_dim, head_dim) /
                    scale;
    }
    for (int h = 0; h < n_heads; h++)
        softmax(all_scores + (size_t)h * (size_t)n_context, n_context);
    memset(out, 0, (size_t)n_heads * (size_t)head_dim * sizeof(float));
    for (int t0 = 0, b = 0; t0 < n_context; t0 += block_size, b++) {
        const uint16_t* slot_values = values + (size_t)kv->block_table[b] * (size_t)block_size * (size_t)kv_dim;
        int n_slots = n_context - t0 < block_size ? n_context - t0 : block_size;
        for (int s = 0; s < n_slots; s++, slot_values += kv_dim)
            for (int h = 0; h < n_heads; h++)
                add_scaled_f16(out + (size_t)h * (size_t)head_dim,
                               all_scores[(size_t)h * (size_t)n_context + (size_t)(t0 + s)],
                               slot_values + (size_t)(h / queries_per_kv_head) * (size_t)head_dim, head_dim);
    }
}

// One head at a time, with scratch for one head's scores: (n_context).
AVX2_TARGET static void attention_head_major(float* out, const float* query, const kv_layer_view* kv, int n_context,
                                             int n_heads, int n_kv_heads, int head_dim, float* scores) {
    const int kv_dim = n_kv_heads * head_dim;
    const int queries_per_kv_head = n_heads / n_kv_heads;
    const uint16_t* keys = kv->key_slots;
    const uint16_t* values = kv->value_slots;
    const float scale = sqrtf((float)head_dim);
    for (int h = 0; h < n_heads; h++) {
        const float* q = query + (size_t)h * (size_t)head_dim;
        const size_t head_offset = (size_t)(h / queries_per_kv_head) * (size_t)head_dim;
        for (int t = 0; t < n_context; t++) {
            int64_t slot = kv_slot_of_position(kv->block_table, kv->block_size, t);
            scores[t] = dot_f16(q, keys + (size_t)slot * (size_t)kv_dim + head_offset, head_dim) / scale;
        }
        softmax(scores, n_context);
        float* out_head = out + (size_t)h * (size_t)head_dim;
        memset(out_head, 0, (size_t)head_dim * sizeof(float));
        for (int t = 0; t < n_context; t++) {
            int64_t slot = kv_slot_of_position(kv->block_table, kv->block_size, t);
            add_scaled_f16(out_head, scores[t], values + (size_t)slot * (size_t)kv_dim + head_offset, head_dim);
        }
    }
}

void attention_row_f16_avx2(float* out, const float* query, const kv_layer_view* kv, int n_context, int n_heads,
                            int n_kv_heads, int head_dim, float* scores, float* all_scores) {
    if (all_scores)
        attention_slot_major(out, query, kv, n_context, n_heads, n_kv_heads, head_dim, all_scores);
    else
        attention_head_major(out, query, kv, n_context, n_heads, n_kv_heads, head_dim, scores);
}
