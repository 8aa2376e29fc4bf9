// cuda_ops: RMSNorm, residual add (alone or fused with the next RMSNorm),
// RoPE and SwiGLU on the GPU; the equations of kernels/cpu/ops.h, with
// the same traffic figures. Reductions run in a tree instead of index
// order, so results differ from the CPU's in the last bits.
#include <cmath>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"

constexpr int NORM_THREADS = 256;

// One block per row. fused: x += delta first (written back), in the same
// pass that sums the squares; then out = weight * x / rms.
template <bool FUSED>
__global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_kernel(float* out, float* x, const float* delta, const float* weight, int size, float eps) {
    __shared__ float reduce[32];
    float* row = x + (size_t)blockIdx.x * (size_t)size;
    float* out_row = out + (size_t)blockIdx.x * (size_t)size;
    float sum_squares = 0.0f;
    for (int i = threadIdx.x; i < size; i += NORM_THREADS) {
        float value = row[i];
        if (FUSED) {
            value += delta[(size_t)blockIdx.x * (size_t)size + i];
            row[i] = value;
        }
        sum_squares += value * value;
    }
    sum_squares = block_sum(sum_squares, reduce);
    // The CPU's order of operations: mean, plus eps, 1 / sqrt.
    const float inverse_rms = 1.0f / sqrtf(sum_squares / (float)size + eps);
    for (int i = threadIdx.x; i < size; i += NORM_THREADS)
        out_row[i] = weight[i] * (inverse_rms * row[i]);
}

__global__ void residual_add_kernel(float* x, const float* delta, int64_t count) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += delta[i];
}

__global__ void swiglu_kernel(float* gate, const float* up, int64_t count) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        float value = gate[i];
        value *= 1.0f / (1.0f + expf(-value));
        gate[i] = value * up[i];
    }
}

// One thread per (row, pair): pair index i (even) inside the query row;
// the key shares the angles of the first n_kv_heads * head_dim entries.
// frequencies: (head_dim / 2) the CPU's 1 / powf(10000, 2j / head_dim),
// computed by the host's libm: angle = position * frequency is then the
// same float as on the CPU (a device powf may differ by an ulp, which at
// position 30000 moves the angle by 2e-3 rad).
__global__ void rope_kernel(float* query, float* key, const int32_t* positions, const float* frequencies, int n_rows,
                            int n_heads, int n_kv_heads, int head_dim, int query_stride, int key_stride) {
    const int query_pairs = n_heads * head_dim / 2, key_dim = n_kv_heads * head_dim;
    const int64_t count = (int64_t)n_rows * query_pairs;
    for (int64_t index = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; index < count;
         index += (int64_t)gridDim.x * blockDim.x) {
        const int row = (int)(index / query_pairs), i = 2 * (int)(index % query_pairs);
        const int pair_index = i % head_dim;
        const float angle = (float)positions[row] * frequencies[pair_index / 2];
        float sin_angle, cos_angle;
        sincosf(angle, &sin_angle, &cos_angle);
        float* q = query + (size_t)row * query_stride + i;
        const float q0 = q[0], q1 = q[1];
        q[0] = q0 * cos_angle - q1 * sin_angle;
        q[1] = q0 * sin_angle + q1 * cos_angle;
        if (i < key_dim) {
            float* k = key + (size_t)row * key_stride + i;
            const float k0 = k[0], k1 = k[1];
            k[0] = k0 * cos_angle - k1 * sin_angle;
            k[1] = k0 * sin_angle + k1 * cos_angle;
        }
    }
}

__global__ void gather_rows_kernel(float* out, const float* in, const int32_t* row_indices, int width) {
    const float* source = in + (size_t)row_indices[blockIdx.x] * (size_t)width;
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        out[(size_t)blockIdx.x * (size_t)width + i] = source[i];
}

extern "C" int cuda_gather_rows(cuda_context* context, float* device_out, const float* device_in,
                                const int32_t* device_row_indices, int n_rows, int width, error_info* err) {
    if (n_rows <= 0) return 0;
    gather_rows_kernel<<<(unsigned)n_rows, 256, 0, context->stream>>>(device_out, device_in, device_row_indices, width);
    LAUNCH_CHECK("gather_rows_kernel", err);
    return 0; // a copy, as forward.c's memcpy: no traffic counted
}

extern "C" int cuda_rmsnorm(cuda_context* context, float* device_out, const float* device_x, const float* device_weight,
                            int n_rows, int size, float eps, kernel_traffic* traffic, error_info* err) {
    if (n_rows <= 0 || size <= 0) return 0;
    rmsnorm_kernel<false><<<(unsigned)n_rows, NORM_THREADS, 0, context->stream>>>(
        device_out, (float*)device_x, nullptr, device_weight, size, eps); // x is only read when not fused
    LAUNCH_CHECK("rmsnorm_kernel", err);
    if (traffic) {
        traffic->weight_bytes_read += (uint64_t)size * sizeof(float);
        traffic->activation_bytes += 2ull * (uint64_t)n_rows * (uint64_t)size * sizeof(float);
    }
    return 0;
}

extern "C" int cuda_residual_rmsnorm(cuda_context* context, float* device_out, float* device_x,
                                     const float* device_delta, const float* device_weight, int n_rows, int size,
                                     float eps, kernel_traffic* traffic, error_info* err) {
    if (n_rows <= 0 || size <= 0) return 0;
    rmsnorm_kernel<true><<<(unsigned)n_rows, NORM_THREADS, 0, context->stream>>>(device_out, device_x, device_delta,
                                                                                 device_weight, size, eps);
    LAUNCH_CHECK("rmsnorm_kernel (fused residual)", err);
    if (traffic) { // kernels/cpu/ops.c residual_rmsnorm with one delta: read x and delta, write x and out
        traffic->activation_bytes += 4ull * (uint64_t)n_rows * (uint64_t)size * sizeof(float);
        traffic->weight_bytes_read += (uint64_t)size * sizeof(float);
    }
    return 0;
}

extern "C" int cuda_residual_add(cuda_context* context, float* device_x, const float* device_delta, int64_t count,
                                 kernel_traffic* traffic, error_info* err) {
    if (count <= 0) return 0;
    residual_add_kernel<<<cuda_blocks_for(count, 256), 256, 0, context->stream>>>(device_x, device_delta, count);
    LAUNCH_CHECK("residual_add_kernel", err);
    if (traffic) traffic->activation_bytes += 3ull * (uint64_t)count * sizeof(float);
    return 0;
}

extern "C" int cuda_swiglu(cuda_context* context, float* device_gate, const float* device_up, int64_t count,
                           kernel_traffic* traffic, error_info* err) {
    if (count <= 0) return 0;
    swiglu_kernel<<<cuda_blocks_for(count, 256), 256, 0, context->stream>>>(device_gate, device_up, count);
    LAUNCH_CHECK("swiglu_kernel", err);
    if (traffic) traffic->activation_bytes += 3ull * (uint64_t)count * sizeof(float);
    return 0;
}

extern "C" int cuda_rope(cuda_context* context, float* device_query, float* device_key, const int32_t* device_positions,
                         int n_rows, int n_heads, int n_kv_heads, int head_dim, int query_stride, int key_stride,
                         kernel_traffic* traffic, error_info* err) {
    if (n_rows <= 0) return 0;
    if (head_dim % 2 != 0 || n_kv_heads > n_heads)
        return error_set(err, "cuda_rope: head_dim %d must be even and n_kv_heads %d <= n_heads %d", head_dim,
                         n_kv_heads, n_heads);
    if (context->rope_head_dim != head_dim) { // once per head_dim: the table of kernels/cpu/ops.c's rope()
        std::vector<float> frequencies((size_t)head_dim / 2);
        for (int j = 0; j < head_dim / 2; j++)
            frequencies[(size_t)j] = 1.0f / powf(10000.0f, (float)(2 * j) / (float)head_dim);
        CUDA_CHECK(cudaStreamSynchronize(context->stream), err); // the old table may still be in use
        cudaFree(context->rope_frequencies);
        context->rope_frequencies = nullptr;
        context->rope_head_dim = 0;
        CUDA_CHECK(cudaMalloc(&context->rope_frequencies, frequencies.size() * sizeof(float) + 4), err);
        CUDA_CHECK(cudaMemcpy(context->rope_frequencies, frequencies.data(), frequencies.size() * sizeof(float),
                              cudaMemcpyHostToDevice),
                   err);
        context->rope_head_dim = head_dim;
    }
    const int64_t count = (int64_t)n_rows * n_heads * head_dim / 2;
    rope_kernel<<<cuda_blocks_for(count, 256), 256, 0, context->stream>>>(
        device_query, device_key, device_positions, context->rope_frequencies, n_rows, n_heads, n_kv_heads, head_dim,
        query_stride, key_stride);
    LAUNCH_CHECK("rope_kernel", err);
    if (traffic)
        traffic->activation_bytes +=
            2ull * (uint64_t)n_rows * (uint64_t)(n_heads + n_kv_heads) * (uint64_t)head_dim * sizeof(float);
    return 0;
}
