#include "kernels/cpu/ops.h"

#include <math.h>
#include <stddef.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops_simd.h"

// 1 / sqrt(mean of squares + eps), from a sum of squares taken in index order.
static float inverse_rms(float sum_squares, int size, float eps) {
    sum_squares /= (float)size;
    sum_squares += eps;
    return 1.0f / sqrtf(sum_squares);
}

static void scale_row(float* out, const float* row, const float* weight, float inverse, int size) {
    for (int i = 0; i < size; i++) out[i] = weight[i] * (inverse * row[i]);
}

void rmsnorm(float* out, const float* x, const float* weight, int n_rows, int size, float eps,
             kernel_traffic* traffic) {
    for (int r = 0; r < n_rows; r++) {
        const float* row = x + (size_t)r * (size_t)size;
        float sum_squares = 0.0f;
        for (int i = 0; i < size; i++) sum_squares += row[i] * row[i];
        scale_row(out + (size_t)r * (size_t)size, row, weight, inverse_rms(sum_squares, size, eps), size);
    }
    if (traffic) {
        traffic->weight_bytes_read += (uint64_t)size * sizeof(float);
        traffic->activation_bytes += 2ull * (uint64_t)n_rows * (uint64_t)size * sizeof(float);
    }
}

void residual_rmsnorm(float* out, float* x, const float* const* deltas, int n_deltas, const float* weight, int n_rows,
                      int size, float eps, kernel_traffic* traffic) {
    for (int r = 0; r < n_rows; r++) {
        const size_t offset = (size_t)r * (size_t)size;
        float* row = x + offset;
        float sum_squares = 0.0f;
        for (int i = 0; i < size; i++) {
            float delta = deltas[0][offset + (size_t)i];
            for (int k = 1; k < n_deltas; k++) delta += deltas[k][offset + (size_t)i];
            float value = row[i] + delta;
            row[i] = value;
            sum_squares += value * value;
        }
        if (weight) scale_row(out + offset, row, weight, inverse_rms(sum_squares, size, eps), size);
    }
    if (traffic) {
        // Read x and each delta, write x, and (normed) write out.
        uint64_t passes = 2u + (uint64_t)n_deltas + (weight ? 1u : 0u);
        traffic->activation_bytes += passes * (uint64_t)n_rows * (uint64_t)size * sizeof(float);
        if (weight) traffic->weight_bytes_read += (uint64_t)size * sizeof(float);
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

// The rotation of the pair whose frequency index is pair_index (even) of rotary_dims.
static void rope_rotation_with_base(int pair_index, int position, int rotary_dims, float base, float* cos_angle,
                                    float* sin_angle) {
    float frequency = 1.0f / powf(base, (float)pair_index / (float)rotary_dims);
    float angle = (float)position * frequency;
    *cos_angle = cosf(angle);
    *sin_angle = sinf(angle);
}

// The rotation of the pair starting at index pair_index (even) inside a head.
static void rope_rotation(int pair_index, int position, int head_dim, float* cos_angle, float* sin_angle) {
    rope_rotation_with_base(pair_index, position, head_dim, 10000.0f, cos_angle, sin_angle);
}

static void rotate_pair(float* vector, int i, float cos_angle, float sin_angle) {
    float x0 = vector[i], x1 = vector[i + 1];
    vector[i] = x0 * cos_angle - x1 * sin_angle;
    vector[i + 1] = x0 * sin_angle + x1 * cos_angle;
}

static void count_rope(kernel_traffic* traffic, int query_dim, int key_dim) {
    if (traffic) traffic->activation_bytes += 2ull * (uint64_t)(query_dim + key_dim) * sizeof(float);
}

void rope(float* query, float* key, int position, int n_heads, int n_kv_heads, int head_dim, kernel_traffic* traffic) {
    int query_dim = n_heads * head_dim, key_dim = n_kv_heads * head_dim;
    for (int i = 0; i < query_dim; i += 2) {
        float cos_angle, sin_angle;
        rope_rotation(i % head_dim, position, head_dim, &cos_angle, &sin_angle);
        // The key has fewer heads under grouped-query attention; its pairs use
        // the same angles as the query pairs at the same index inside a head.
        rotate_pair(query, i, cos_angle, sin_angle);
        if (i < key_dim) rotate_pair(key, i, cos_angle, sin_angle);
    }
    count_rope(traffic, query_dim, key_dim);
}

void rope_rotations(float* rotations, int position, int head_dim) {
    for (int i = 0; i < head_dim; i += 2) rope_rotation(i, position, head_dim, &rotations[i], &rotations[i + 1]);
}

void rope_rotate(float* query, float* key, const float* rotations, int n_heads, int n_kv_heads, int head_dim,
                 kernel_traffic* traffic) {
    // Heads outermost, the query and key heads that share angles in one loop.
    for (int h = 0; h < n_heads; h++) {
        float* query_head = query + (size_t)h * (size_t)head_dim;
        float* key_head = h < n_kv_heads ? key + (size_t)h * (size_t)head_dim : NULL;
        for (int i = 0; i < head_dim; i += 2) {
            rotate_pair(query_head, i, rotations[i], rotations[i + 1]);
            if (key_head) rotate_pair(key_head, i, rotations[i], rotations[i + 1]);
        }
    }
    count_rope(traffic, n_heads * head_dim, n_kv_heads * head_dim);
}

void rope_rotations_for(float* rotations, int position, const rope_config* config) {
    for (int i = 0; i < config->rotary_dims; i += 2)
        rope_rotation_with_base(i, position, config->rotary_dims, config->base, &rotations[i], &rotations[i + 1]);
}

// NEOX pairing: element p turns with element p + half, by the angle of pair p.
static void rotate_half_pairs(float* head, int half, const float* rotations) {
    for (int p = 0; p < half; p++) {
        float cos_angle = rotations[2 * p], sin_angle = rotations[2 * p + 1];
        float x0 = head[p], x1 = head[p + half];
        head[p] = x0 * cos_angle - x1 * sin_angle;
        head[p + half] = x0 * sin_angle + x1 * cos_angle;
    }
}

void rope_rotate_for(float* query, float* key, const float* rotations, int n_heads, int n_kv_heads, int head_dim,
                     const rope_config* config, kernel_traffic* traffic) {
    const int rotary_dims = config->rotary_dims;
    for (int h = 0; h < n_heads; h++) {
        float* query_head = query + (size_t)h * (size_t)head_dim;
        float* key_head = h < n_kv_heads ? key + (size_t)h * (size_t)head_dim : NULL;
        if (config->neox_pairs) {
            rotate_half_pairs(query_head, rotary_dims / 2, rotations);
            if (key_head) rotate_half_pairs(key_head, rotary_dims / 2, rotations);
            continue;
        }
        for (int i = 0; i < rotary_dims; i += 2) {
            rotate_pair(query_head, i, rotations[i], rotations[i + 1]);
            if (key_head) rotate_pair(key_head, i, rotations[i], rotations[i + 1]);
        }
    }
    count_rope(traffic, n_heads * head_dim, n_kv_heads * head_dim);
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

void swiglu_vector(float* gate, const float* up, int size, kernel_traffic* traffic) {
#if defined(__x86_64__) || defined(__i386__)
    if (cpu_simd_level_selected() >= CPU_SIMD_AVX2) {
        swiglu_avx2(gate, up, size);
        if (traffic) traffic->activation_bytes += 3ull * (uint64_t)size * sizeof(float);
        return;
    }
#endif
    swiglu(gate, up, size, traffic);
}

void residual_add(float* x, const float* delta, int size, kernel_traffic* traffic) {
    for (int i = 0; i < size; i++) x[i] += delta[i];
    if (traffic) traffic->activation_bytes += 3ull * (uint64_t)size * sizeof(float);
}

void bias_add(float* x, const float* bias, int n_rows, int size, kernel_traffic* traffic) {
    for (int r = 0; r < n_rows; r++) {
        float* row = x + (size_t)r * (size_t)size;
        for (int i = 0; i < size; i++)
            row[i] += bias[i];
    }
    if (traffic) {
        traffic->weight_bytes_read += (uint64_t)size * sizeof(float);
        traffic->activation_bytes += 2ull * (uint64_t)n_rows * (uint64_t)size * sizeof(float);
    }
}
