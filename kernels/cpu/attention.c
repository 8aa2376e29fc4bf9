#include "kernels/cpu/attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/ops.h"

// One cached element, widened to fp32 (an int8 one still unscaled).
static inline float kv_element(const void* slots, kv_dtype dtype, size_t index) {
    if (dtype == KV_F16) return fp16_to_fp32(((const uint16_t*)slots)[index]);
    if (dtype == KV_I8) return (float)((const int8_t*)slots)[index];
    return ((const float*)slots)[index];
}

// The reference order (llama2.c's run.c), for every element type.
void attention_row_scalar(float* out, const float* query, const kv_layer_view* kv, int n_context, int n_heads,
                          int n_kv_heads, int head_dim, float* scores) {
    const int slot_heads = kv_view_slot_heads(kv, n_kv_heads), slot_stride = slot_heads * head_dim;
    const int queries_per_kv_head = n_heads / n_kv_heads;
    for (int h = 0; h < n_heads; h++) {
        const float* q = query + (size_t)h * (size_t)head_dim;
        const size_t head_offset = (size_t)(h / queries_per_kv_head) * (size_t)head_dim;
        for (int t = 0, b = 0, s = 0; t < n_context; t++, s++) { // slot = block b's slot s, no division
            if (s == kv->block_size) s = 0, b++;
            int64_t slot = (int64_t)kv->block_table[b] * kv->block_size + s;
            size_t k = (size_t)slot * (size_t)slot_stride + head_offset;
            float score = 0.0f;
            for (int i = 0; i < head_dim; i++) score += q[i] * kv_element(kv->key_slots, kv->dtype, k + (size_t)i);
            if (kv->dtype == KV_I8)
                score *= kv->key_scales[(size_t)slot * (size_t)slot_heads + (size_t)(h / queries_per_kv_head)];
            score /= sqrtf((float)head_dim);
            scores[t] = score;
        }
        softmax(scores, n_context);
        float* out_head = out + (size_t)h * (size_t)head_dim;
        memset(out_head, 0, (size_t)head_dim * sizeof(float));
        for (int t = 0, b = 0, s = 0; t < n_context; t++, s++) {
            if (s == kv->block_size) s = 0, b++;
            int64_t slot = (int64_t)kv->block_table[b] * kv->block_size + s;
            size_t v = (size_t)slot * (size_t)slot_stride + head_offset;
            float weight = scores[t];
            if (kv->dtype == KV_I8)
                weight *= kv->value_scales[(size_t)slot * (size_t)slot_heads + (size_t)(h / queries_per_kv_head)];
            for (int i = 0; i < head_dim; i++)
                out_head[i] += weight * kv_element(kv->value_slots, kv->dtype, v + (size_t)i);
        }
    }
}

// What one row's attention reports: every cached key and value of its
// context read once (grouped heads share the same loads), whether or not
// the kernel shared those loads with other rows of the same prompt (the
// step record counts KV per row, as the CUDA path does).
static void count_row_traffic(kernel_traffic* traffic, kv_dtype dtype, int n_context, int n_heads, int n_kv_heads,
                              int head_dim) {
    if (!traffic) return;
    traffic->kv_bytes_read += 2ull * (uint64_t)n_context * (uint64_t)kv_slot_bytes(dtype, n_kv_heads, head_dim);
    traffic->attention_flops += 4ull * (uint64_t)n_heads * (uint64_t)n_context * (uint64_t)head_dim;
    traffic->activation_bytes += 2ull * (uint64_t)n_heads * (uint64_t)head_dim * sizeof(float);
}

void attention_row(float* out, const float* query, const kv_layer_view* kv, int n_context, int n_heads,
                   int n_kv_heads, int head_dim, float* scores, kernel_traffic* traffic) {
    // fp16 caches use the vector kernel where the CPU has one. fp32 and int8
    // caches keep llama2.c's scalar order (exact reference results), with
    // AVX2 across positions. Both vector kernels take every head's scores at
    // once, so that the cache is read in one pass in slot order; without
    // that memory the fp16 kernel goes head by head, the others take the
    // scalar path (the same bits either way).
    const bool avx2 = cpu_simd_level_selected() >= CPU_SIMD_AVX2;
    // (n_heads, n_context)
    float* all_scores = avx2 ? malloc((size_t)n_heads * (size_t)n_context * sizeof(float)) : NULL;
    if (kv->dtype == KV_F16 && avx2)
        attention_row_f16_avx2(out, query, kv, n_context, n_heads, n_kv_heads, head_dim, scores, all_scores);
    else if (all_scores)
        attention_rows_exact_avx2(out, query, kv, n_context, 1, n_heads, n_kv_heads, head_dim, all_scores);
    else
        attention_row_scalar(out, query, kv, n_context, n_heads, n_kv_heads, head_dim, scores);
    free(all_scores);
    count_row_traffic(traffic, kv->dtype, n_context, n_heads, n_kv_heads, head_dim);
}

void attention_rows(float* out, const float* query, const kv_layer_view* kv, int n_context, int n_rows,
                    int n_heads, int n_kv_heads, int head_dim, float* scores, kernel_traffic* traffic) {
    const size_t width = (size_t)n_heads * (size_t)head_dim;
    if (n_rows >= 2 && n_rows <= ATTENTION_ROWS_MAX && cpu_simd_level_selected() >= CPU_SIMD_AVX2) {
        // (n_rows, n_heads, n_context + n_rows - 1): every row's scores.
        float* all_scores = malloc((size_t)n_rows * (size_t)n_heads * (size_t)(n_context + n_rows - 1) * sizeof(float));
        if (all_scores) {
            if (kv->dtype == KV_F16)
                attention_rows_f16_avx2(out, query, kv, n_context, n_rows, n_heads, n_kv_heads, head_dim, all_scores);
            else
                attention_rows_exact_avx2(out, query, kv, n_context, n_rows, n_heads, n_kv_heads, head_dim, all_scores);
            free(all_scores);
            for (int j = 0; j < n_rows; j++)
                count_row_traffic(traffic, kv->dtype, n_context + j, n_heads, n_kv_heads, head_dim);
            return;
        }
    }
    for (int j = 0; j < n_rows; j++)
        attention_row(out + (size_t)j * width, query + (size_t)j * width, kv, n_context + j, n_heads, n_kv_heads,
                      head_dim, scores, traffic);
}

// Symmetric int8 per head: scale = max|x| / 127 (0 for an all-zero head,
// whose codes are then all 0).
static void quantize_heads(int8_t* codes, float* scales, const float* x, int n_kv_heads, int head_dim) {
    for (int h = 0; h < n_kv_heads; h++) {
        const float* head = x + (size_t)h * (size_t)head_dim;
        float max_abs = 0.0f;
        for (int i = 0; i < head_dim; i++) max_abs = fmaxf(max_abs, fabsf(head[i]));
        float scale = max_abs / 127.0f;
        scales[h] = scale;
        for (int i = 0; i < head_dim; i++)
            codes[(size_t)h * (size_t)head_dim + (size_t)i] = scale > 0.0f ? (int8_t)lrintf(head[i] / scale) : 0;
    }
}

void kv_write_row(void* key_slots, void* value_slots, float* key_scales, float* value_scales, kv_dtype dtype,
                  int64_t slot, const float* key, const float* value, int n_kv_heads, int head_dim,
                  kernel_traffic* traffic) {
    const int kv_dim = n_kv_heads * head_dim;
    size_t offset = (size_t)slot * (size_t)kv_dim;
    if (dtype == KV_F16) {
        fp16_from_fp32_array((uint16_t*)key_slots + offset, key, (size_t)kv_dim);
        fp16_from_fp32_array((uint16_t*)value_slots + offset, value, (size_t)kv_dim);
    } else if (dtype == KV_I8) {
        size_t scale_offset = (size_t)slot * (size_t)n_kv_heads;
        quantize_heads((int8_t*)key_slots + offset, key_scales + scale_offset, key, n_kv_heads, head_dim);
        quantize_heads((int8_t*)value_slots + offset, value_scales + scale_offset, value, n_kv_heads, head_dim);
    } else {
        memcpy((float*)key_slots + offset, key, (size_t)kv_dim * sizeof(float));
        memcpy((float*)value_slots + offset, value, (size_t)kv_dim * sizeof(float));
    }
    if (traffic) {
        traffic->kv_bytes_written += 2ull * (uint64_t)kv_slot_bytes(dtype, n_kv_heads, head_dim);
        traffic->activation_bytes += 2ull * (uint64_t)kv_dim * sizeof(float);
    }
}
