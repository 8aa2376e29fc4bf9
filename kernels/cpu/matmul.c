#include "kernels/cpu/matmul.h"

#include "kernels/cpu/fp16.h"

void traffic_add(kernel_traffic* total, const kernel_traffic* part) {
    total->weight_bytes_read += part->weight_bytes_read;
    total->kv_bytes_read += part->kv_bytes_read;
    total->kv_bytes_written += part->kv_bytes_written;
    total->activation_bytes += part->activation_bytes;
    total->matmul_flops += part->matmul_flops;
    total->attention_flops += part->attention_flops;
}

static size_t dtype_value_bytes(weight_dtype dtype) {
    switch (dtype) {
    case WEIGHT_F32: return 4;
    case WEIGHT_F16: return 2;
    case WEIGHT_Q8_0: return 1;
    }
    return 0;
}

uint64_t weight_matrix_bytes(const weight_matrix* w) {
    uint64_t count = (uint64_t)w->rows * (uint64_t)w->cols;
    uint64_t bytes = count * dtype_value_bytes(w->dtype);
    if (w->dtype == WEIGHT_Q8_0) bytes += count / (uint64_t)w->group_size * sizeof(float);
    return bytes;
}

// ---- one dot product per dtype, reduced in index order --------------------

static float dot_f32(const float* weights, const float* x, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += weights[i] * x[i];
    return sum;
}

static float dot_f16(const uint16_t* weights, const float* x, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += fp16_to_fp32(weights[i]) * x[i];
    return sum;
}

// Q8_0: each group's integer dot product is scaled once by its group scale.
// Groups are counted over the flattened matrix (llama2.c's export does the
// same), so a group may start in one row and end in the next: `flat_offset`
// is the index of x[0]'s weight in the whole matrix.
static float dot_q8(const int8_t* weights, const float* scales, const float* x, int n, size_t flat_offset,
                    int group_size) {
    float sum = 0.0f;
    int i = 0;
    while (i < n) {
        size_t group = (flat_offset + (size_t)i) / (size_t)group_size;
        size_t group_end_flat = (group + 1) * (size_t)group_size;
        int end = group_end_flat - flat_offset < (size_t)n ? (int)(group_end_flat - flat_offset) : n;
        float group_sum = 0.0f;
        for (; i < end; i++) group_sum += (float)weights[i] * x[i];
        sum += group_sum * scales[group];
    }
    return sum;
}

void matmul(float* out, const float* in, int n_rows, const weight_matrix* w, kernel_traffic* traffic) {
    const int d_out = w->rows, d_in = w->cols;
    // Output feature outermost: one weight row stays in cache while every
    // batch row uses it, so the matrix streams from memory once per call.
    for (int o = 0; o < d_out; o++) {
        size_t row_offset = (size_t)o * (size_t)d_in;
        for (int r = 0; r < n_rows; r++) {
            const float* x = in + (size_t)r * (size_t)d_in;
            float value;
            switch (w->dtype) {
            case WEIGHT_F32: value = dot_f32((const float*)w->values + row_offset, x, d_in); break;
            case WEIGHT_F16: value = dot_f16((const uint16_t*)w->values + row_offset, x, d_in); break;
            default:
                value = dot_q8((const int8_t*)w->values + row_offset, w->scales, x, d_in, row_offset, w->group_size);
                break;
            }
            out[(size_t)r * (size_t)d_out + (size_t)o] = value;
        }
    }
    if (traffic) {
        traffic->weight_bytes_read += weight_matrix_bytes(w);
        traffic->activation_bytes += (uint64_t)n_rows * (uint64_t)(d_in + d_out) * sizeof(float);
        traffic->matmul_flops += 2ull * (uint64_t)n_rows * (uint64_t)d_in * (uint64_t)d_out;
    }
}

void weight_row_to_f32(float* out, const weight_matrix* w, int row, kernel_traffic* traffic) {
    size_t offset = (size_t)row * (size_t)w->cols;
    for (int i = 0; i < w->cols; i++) {
        switch (w->dtype) {
        case WEIGHT_F32: out[i] = ((const float*)w->values)[offset + (size_t)i]; break;
        case WEIGHT_F16: out[i] = fp16_to_fp32(((const uint16_t*)w->values)[offset + (size_t)i]); break;
        default:
            out[i] = (float)((const int8_t*)w->values)[offset + (size_t)i] *
                     w->scales[(offset + (size_t)i) / (size_t)w->group_size];
            break;
        }
    }
    if (traffic) {
        uint64_t row_bytes = (uint64_t)w->cols * dtype_value_bytes(w->dtype);
        if (w->dtype == WEIGHT_Q8_0) { // the scales of every group the row touches
            uint64_t first = offset / (size_t)w->group_size, last = (offset + (size_t)w->cols - 1) / (size_t)w->group_size;
            row_bytes += (last - first + 1) * sizeof(float);
        }
        traffic->weight_bytes_read += row_bytes;
        traffic->activation_bytes += (uint64_t)w->cols * sizeof(float);
    }
}
