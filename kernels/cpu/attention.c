#include "kernels/cpu/attention.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/ops.h"

void attention_row(float* out, const float* query, const kv_layer_view* kv, int n_context, int n_heads,
                   int n_kv_heads, int head_dim, float* scores, kernel_traffic* traffic) {
    const int kv_dim = n_kv_heads * head_dim;
    const int queries_per_kv_head = n_heads / n_kv_heads;
    for (int h = 0; h < n_heads; h++) {
        const float* q = query + (size_t)h * (size_t)head_dim;
        const size_t head_offset = (size_t)(h / queries_per_kv_head) * (size_t)head_dim;
        for (int t = 0; t < n_context; t++) {
            int64_t slot = kv_slot_of_position(kv->block_table, kv->block_size, t);
            const float* k = kv->key_blocks + (size_t)slot * (size_t)kv_dim + head_offset;
            float score = 0.0f;
            for (int i = 0; i < head_dim; i++) score += q[i] * k[i];
            score /= sqrtf((float)head_dim);
            scores[t] = score;
        }
        softmax(scores, n_context);
        float* out_head = out + (size_t)h * (size_t)head_dim;
        memset(out_head, 0, (size_t)head_dim * sizeof(float));
        for (int t = 0; t < n_context; t++) {
            int64_t slot = kv_slot_of_position(kv->block_table, kv->block_size, t);
            const float* v = kv->value_blocks + (size_t)slot * (size_t)kv_dim + head_offset;
            float weight = scores[t];
            for (int i = 0; i < head_dim; i++) out_head[i] += weight * v[i];
        }
    }
    if (traffic) {
        // Every cached key and value of this sequence is read once per row
        // (grouped heads share the same loads).
        traffic->kv_bytes_read += 2ull * (uint64_t)n_context * (uint64_t)kv_dim * sizeof(float);
        traffic->attention_flops += 4ull * (uint64_t)n_heads * (uint64_t)n_context * (uint64_t)head_dim;
        traffic->activation_bytes += 2ull * (uint64_t)n_heads * (uint64_t)head_dim * sizeof(float);
    }
}

void kv_write_row(float* key_blocks, float* value_blocks, int64_t slot, const float* key, const float* value,
                  int kv_dim, kernel_traffic* traffic) {
    memcpy(key_blocks + (size_t)slot * (size_t)kv_dim, key, (size_t)kv_dim * sizeof(float));
    memcpy(value_blocks + (size_t)slot * (size_t)kv_dim, value, (size_t)kv_dim * sizeof(float));
    if (traffic) {
        traffic->kv_bytes_written += 2ull * (uint64_t)kv_dim * sizeof(float);
        traffic->activation_bytes += 2ull * (uint64_t)kv_dim * sizeof(float);
    }
}
