// Attention over an fp16 KV cache with AVX2 + F16C + FMA.
//
// Same equations and the same order over positions t as the scalar kernel
// in attention.c; only the sums over head_dim are vectorised: q.k uses one
// 8-lane accumulator over head_dim in order, then a fixed horizontal sum,
// then the scalar tail. Every row is computed the same way whatever the
// batch, block size or layout, so batch invariance holds within this level.
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd_x86.h"

AVX2_TARGET static float dot_f16(const float* q, const uint16_t* k, int n) {
    __m256 accumulator = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 keys = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(k + i)));
        accumulator = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), keys, accumulator);
    }
    float sum = hsum8(accumulator);
    for (; i < n; i++) sum += q[i] * _cvtsh_ss(k[i]);
    return sum;
}

AVX2_TARGET static void add_scaled_f16(float* out, float weight, const uint16_t* v,
                                                                    int n) {
    __m256 w = _mm256_set1_ps(weight);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 values = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(v + i)));
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(w, values, _mm256_loadu_ps(out + i)));
    }
    for (; i < n; i++) out[i] = fmaf(weight, _cvtsh_ss(v[i]), out[i]);
}

AVX2_TARGET void attention_row_f16_avx2(float* out, const float* query,
                                                                     const kv_layer_view* kv, int n_context,
                                                                     int n_heads, int n_kv_heads, int head_dim,
                                                                     float* scores) {
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
