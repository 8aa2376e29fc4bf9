#include "kernels/cpu/ops.h"

#include <math.h>
#include <stddef.h>

void rmsnorm(float* out, const float* x, const float* weight, int n_rows, int size, float eps,
             kernel_traffic* traffic) {
    for (int r = 0; r < n_rows; r++) {
        const float* row = x + (size_t)r * (size_t)size;
        float* out_row = out + (size_t)r * (size_t)size;
        float sum_squares = 0.0f;
        for (int i = 0; i < size; i++) sum_squares += row[i] * row[i];
        sum_squares /= (float)size;
        sum_squares += eps;
        float inverse_rms = 1.0f / sqrtf(sum_squares);
        for (int i = 0; i < size; i++) out_row[i] = weight[i] * (inverse_rms * row[i]);
    }
    if (traffic) {
        traffic->weight_bytes_read += (uint64_t)size * sizeof(float);
        traffic->activation_bytes += 2ull * (uint64_t)n_rows * (uint64_t)size * sizeof(float);
    }
}

void softmax(float* x, int size) {
    float max_value = x[0];
    for (int i = 1; i < size; i++)
        if (x[i] > max_value) max_value = x[i];
    float sum = 0.0f;
    for (int i = 0; i < size; i++) {
        x[i] = expf(x[i] - max_value); // subtracting the max keeps expf finite
        sum += x[i];
    }
    for (int i = 0; i < size; i++) x[i] /= sum;
}

void rope(float* query, float* key, int position, int n_heads, int n_kv_heads, int head_dim, kernel_traffic* traffic) {
    int query_dim = n_heads * head_dim, key_dim = n_kv_heads * head_dim;
    for (int i = 0; i < query_dim; i += 2) {
        int pair_index = i % head_dim;
        float frequency = 1.0f / powf(10000.0f, (float)pair_index / (float)head_dim);
        float angle = (float)position * frequency;
        float cos_angle = cosf(angle), sin_angle = sinf(angle);
        // The key has fewer heads under grouped-query attention; its pairs use
        // the same angles as the query pairs at the same index inside a head.
        int n_vectors = i < key_dim ? 2 : 1;
        for (int v = 0; v < n_vectors; v++) {
            float* vector = v == 0 ? query : key;
            float x0 = vector[i], x1 = vector[i + 1];
            vector[i] = x0 * cos_angle - x1 * sin_angle;
            vector[i + 1] = x0 * sin_angle + x1 * cos_angle;
        }
    }
    if (traffic) traffic->activation_bytes += 2ull * (uint64_t)(query_dim + key_dim) * sizeof(float);
}

void swiglu(float* gate, const float* up, int size, kernel_traffic* traffic) {
    for (int i = 0; i < size; i++) {
        float value = gate[i];
        value *= 1.0f / (1.0f + expf(-value));
        value *= up[i];
        gate[i] = value;
    }
    if (traffic) traffic->activation_bytes += 3ull * (uint64_t)size * sizeof(float);
}

void residual_add(float* x, const float* delta, int size, kernel_traffic* traffic) {
    for (int i = 0; i < size; i++) x[i] += delta[i];
    if (traffic) traffic->activation_bytes += 3ull * (uint64_t)size * sizeof(float);
}
