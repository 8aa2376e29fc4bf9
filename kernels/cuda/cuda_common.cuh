// cuda_common: what the .cu files of the CUDA backend share (internal).
//
// CUDA_CHECK / CUBLAS_CHECK / LAUNCH_CHECK turn a failed call into one line
// in err, naming the call's text and its file:line, and return -1 from the
// enclosing function: "cudaMalloc(&pointer, bytes) failed at
// kernels/cuda/cuda_context.cu:57: out of memory".
#ifndef SERVELAB_CUDA_COMMON_CUH
#define SERVELAB_CUDA_COMMON_CUH

#include <cstdint>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_backend.h"

#define CUDA_CHECK(call, err)                                                                                          \
    do {                                                                                                               \
        cudaError_t cuda_status_ = (call);                                                                             \
        if (cuda_status_ != cudaSuccess)                                                                               \
            return error_set((err), "%s failed at %s:%d: %s", #call, __FILE__, __LINE__,                               \
                             cudaGetErrorString(cuda_status_));                                                        \
    } while (0)

#define CUBLAS_CHECK(call, err)                                                                                        \
    do {                                                                                                               \
        cublasStatus_t cublas_status_ = (call);                                                                        \
        if (cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                                   \
            return error_set((err), "%s failed at %s:%d: %s", #call, __FILE__, __LINE__,                               \
                             cublasGetStatusString(cublas_status_));                                                   \
    } while (0)

// After a <<<...>>> launch: a bad configuration shows up here at once; a
// fault inside the kernel shows up at the next synchronizing call.
#define LAUNCH_CHECK(kernel_name, err)                                                                                 \
    do {                                                                                                               \
        cudaError_t cuda_status_ = cudaGetLastError();                                                                 \
        if (cuda_status_ != cudaSuccess)                                                                               \
            return error_set((err), "launch of %s failed at %s:%d: %s", kernel_name, __FILE__, __LINE__,               \
                             cudaGetErrorString(cuda_status_));                                                        \
    } while (0)

struct cuda_context {
    int device;
    char device_name[320];
    int n_multiprocessors;
    cudaStream_t stream;
    cublasHandle_t cublas;
    cublasLtHandle_t cublas_lt;
    cudaEvent_t timer_start;
    cudaEvent_t timer_stop;
    // Scratch, grown on demand (cuda_scratch); each user names its slot.
    void* scratch[4];          // device buffers
    size_t scratch_bytes[4];   // their sizes
    void* cublas_lt_workspace; // device, CUBLASLT_WORKSPACE_BYTES
    float* rope_frequencies;   // device (rope_head_dim / 2): the host's powf values (cuda_ops.cu)
    int rope_head_dim;         // head_dim the table was made for; 0: none yet
};

enum cuda_scratch_slot {
    SCRATCH_ACTIVATIONS = 0, // fp16 activations for cuBLAS, or int8 codes + scales for W8A8
    SCRATCH_WEIGHTS = 1,     // a dequantized fp16 matrix, or the int32 result of cuBLASLt
    SCRATCH_ATTENTION = 2,   // split-context partial results
    SCRATCH_SPARE = 3,
};

#define CUBLASLT_WORKSPACE_BYTES (32u << 20)

// A device buffer of at least `bytes` in `slot` (grown, never shrunk; its
// old contents are lost when it grows). Waits for the stream before freeing.
int cuda_scratch(cuda_context* context, int slot, size_t bytes, void** out, error_info* err);

// Blocks of `threads` threads to cover `count` items, capped for grid-stride loops.
static inline unsigned cuda_blocks_for(int64_t count, int threads) {
    int64_t blocks = (count + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
    return (unsigned)(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

// ---- device helpers shared by the kernels ----------------------------------

// Sum over the warp; every lane gets the total.
__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

__device__ __forceinline__ float warp_max(float value) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    return value;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024);
// every thread gets the total. shared: 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float value, float* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    value = warp_sum(value);
    __syncthreads(); // shared may still be read by a previous call
    if (lane == 0) shared[warp] = value;
    __syncthreads();
    value = lane < n_warps ? shared[lane] : 0.0f;
    return warp_sum(value);
}

__device__ __forceinline__ float block_max(float value, float* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    value = warp_max(value);
    __syncthreads();
    if (lane == 0) shared[warp] = value;
    __syncthreads();
    value = lane < n_warps ? shared[lane] : -INFINITY;
    return warp_max(value);
}

// IEEE half bits -> float (the bits as stored by the CPU's fp16.c).
__device__ __forceinline__ float half_bits_to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

#endif
