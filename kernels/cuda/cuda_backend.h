// cuda_backend: the CUDA kernels of servelab, behind a plain C API so that
// the engine's C11 code (and the GPU test and benchmark programs) can call
// them. Built from kernels/cuda/*.cu only when nvcc is present (CUDA=auto
// or CUDA=1); callers that must also build without CUDA check
// cuda_backend_built() (kernels/cuda/cuda_info.h) first.
//
// The math is the CPU reference's (kernels/cpu): same weight formats (the
// packed WEIGHT_I8 / WEIGHT_I4 bytes upload as they are), same KV layout
// (engine/kv_memory.h: (n_slots, kv_dim) per layer, block tables of
// physical block ids), same byte and FLOP accounting (kernel_traffic.h).
// Results agree with the CPU within the rounding of a different reduction
// order, except where a comment says "bit for bit" (W8A8 matmul, KV writes,
// the W8A8 activation codes).
//
// Every pointer named `device_*` or documented "device" lives in GPU memory;
// every other pointer is host memory. Functions return 0, or -1 after
// writing one line into err that names the CUDA / cuBLAS call that failed
// with its file:line (CUDA_CHECK in cuda_common.cuh). All work runs on the
// context's one stream, in order; results are ready after
// cuda_synchronize() or a copy to the host.
#ifndef SERVELAB_CUDA_BACKEND_H
#define SERVELAB_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

// The C headers below declare C functions: C linkage when a .cu includes them.
#ifdef __cplusplus
extern "C" {
#endif

#include "base/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kernel_traffic.h"
#include "kernels/cpu/matmul.h"

// ---- context: one device, one stream, one cuBLAS handle, scratch ---------

typedef struct cuda_context cuda_context;

// Opens device 0. Without a device: -1 and "no CUDA device found (...)".
int cuda_context_create(cuda_context** out, error_info* err);
void cuda_context_destroy(cuda_context* context);

// "NVIDIA H200, 139.8 GiB, compute capability 9.0, 132 SMs".
const char* cuda_context_device_name(const cuda_context* context);

// ---- device memory (plain cudaMalloc, never managed memory) --------------

// `what` names the buffer in the error message ("KV pool", "weights").
int cuda_device_alloc(cuda_context* context, void** device_out, size_t bytes, const char* what, error_info* err);
void cuda_device_free(void* device_pointer); // NULL is fine
int cuda_copy_to_device(cuda_context* context, void* device_destination, const void* source, size_t bytes,
                        error_info* err);
int cuda_copy_to_host(cuda_context* context, void* destination, const void* device_source, size_t bytes,
                      error_info* err); // waits for the copy
int cuda_copy_on_device(cuda_context* context, void* device_destination, const void* device_source, size_t bytes,
                        error_info* err); // asynchronous, on the stream
int cuda_memset_device(cuda_context* context, void* device_destination, int byte, size_t bytes, error_info* err);

// Waits for the stream and reports any error a kernel raised.
int cuda_synchronize(cuda_context* context, error_info* err);

// ---- timing with CUDA events on the stream ---------------------------------

// Records the start event; cuda_timer_stop records the stop event, waits
// for it and gives the milliseconds between the two.
int cuda_timer_start(cuda_context* context, error_info* err);
int cuda_timer_stop(cuda_context* context, double* elapsed_ms, error_info* err);

// ---- weights: uploaded once ----------------------------------------------

typedef struct cuda_weights {
    weight_dtype dtype;   // WEIGHT_F32, F16, Q8_0, I8 or I4 (as on the host)
    int rows;             // output features
    int cols;             // input features
    int group_size;       // as weight_matrix.group_size
    int activation_bits;  // 8: W8A8 (symmetric WEIGHT_I8 only), else 0
    void* values;         // device: the host matrix's payload bytes, unchanged
    float* scales;        // device, WEIGHT_Q8_0: (rows * cols / group_size) fp32; else NULL
    uint16_t* scales_f16; // device, WEIGHT_I8/I4: (rows, cols / group_size) fp16; else NULL
    uint8_t* zero_points; // device, asymmetric WEIGHT_I8/I4: (rows, cols / group_size); else NULL
    uint64_t bytes;       // weight_matrix_bytes() of the host matrix (traffic accounting)
} cuda_weights;

int cuda_weights_upload(cuda_context* context, cuda_weights* out, const weight_matrix* host, error_info* err);
void cuda_weights_free(cuda_weights* weights);

// ---- matmul: out[r][o] = sum_i in[r][i] * W[o][i] --------------------------
//
// device_out: (n_rows, w->rows) floats; device_in: (n_rows, w->cols) floats.
// Paths:
//   n_rows <= 32, fp32 activations: the matvec kernel (1, 2, 4 or 8 rows a
//     pass; 16-byte weight loads, dequantization in registers, group scale
//     applied once per 16 bytes) when the row bytes and groups line up on
//     16 bytes, else a plain kernel that dequantizes one element at a time;
//   n_rows > 32, WEIGHT_F16 / F32: cuBLAS (cublasGemmEx, fp32 accumulate),
//     the activations converted to fp16 for F16;
//   n_rows > 32, WEIGHT_I8 / I4 (W8A16 / W4A16): the matrix dequantized to
//     fp16 scratch, then cuBLAS as for F16;
//   W8A8: activations quantized per row (bit for bit matmul_quantize_row),
//     then integer group sums with dp4a combined in group order: bit for
//     bit the CPU's W8A8 result. Per-channel W8A8 (one group a row) with
//     n_rows > 32 runs the integer GEMM on tensor cores through cuBLASLt
//     (same bits: one group leaves nothing to reorder).
// traffic gets the CPU's figures (matmul.c): the weight bytes once, the
// activations read and written, 2 FLOPs per multiply-add.
int cuda_matmul(cuda_context* context, float* device_out, const float* device_in, int n_rows, const cuda_weights* w,
                kernel_traffic* traffic, error_info* err);

// Which kernel cuda_matmul would run, for tests and the benchmark:
// "matvec16" (16-byte loads), "matvec", "w8a8", "cublas-f16", "cublas-f32",
// "dequant+cublas", "cublaslt-i8".
const char* cuda_matmul_path(const cuda_weights* w, int n_rows);

// Embedding lookup: row token_ids[r] of w, widened to fp32, into
// device_out (n_rows, w->cols). device_token_ids: (n_rows) int32.
int cuda_embed_rows(cuda_context* context, float* device_out, const int32_t* device_token_ids, int n_rows,
                    const cuda_weights* w, kernel_traffic* traffic, error_info* err);

// ---- element-wise and per-row ops (kernels/cpu/ops.h, on n_rows rows) -------

// out = weight * x / sqrt(mean(x^2) + eps) per row; x, out: (n_rows, size), out may equal x.
int cuda_rmsnorm(cuda_context* context, float* device_out, const float* device_x, const float* device_weight,
                 int n_rows, int size, float eps, kernel_traffic* traffic, error_info* err);

// Fused residual add + RMSNorm, one pass: x += delta, then out = rmsnorm(x)
// (kernels/cpu/ops.h residual_rmsnorm with one delta, and its traffic).
// x: (n_rows, size) updated in place; delta, out: (n_rows, size).
int cuda_residual_rmsnorm(cuda_context* context, float* device_out, float* device_x, const float* device_delta,
                          const float* device_weight, int n_rows, int size, float eps, kernel_traffic* traffic,
                          error_info* err);

// x += delta; (count) floats.
int cuda_residual_add(cuda_context* context, float* device_x, const float* device_delta, int64_t count,
                      kernel_traffic* traffic, error_info* err);

// RoPE on each row's query (n_heads * head_dim) and key (n_kv_heads *
// head_dim) at device_positions[r]; query_stride / key_stride: floats from
// one row to the next.
int cuda_rope(cuda_context* context, float* device_query, float* device_key, const int32_t* device_positions,
              int n_rows, int n_heads, int n_kv_heads, int head_dim, int query_stride, int key_stride,
              kernel_traffic* traffic, error_info* err);

// out[i] = in[row_indices[i]] for i < n_rows: rows of `width` floats.
// device_row_indices: (n_rows) int32.
int cuda_gather_rows(cuda_context* context, float* device_out, const float* device_in,
                     const int32_t* device_row_indices, int n_rows, int width, error_info* err);

// gate[i] = silu(gate[i]) * up[i]; (count) floats.
int cuda_swiglu(cuda_context* context, float* device_gate, const float* device_up, int64_t count,
                kernel_traffic* traffic, error_info* err);

// ---- the paged KV cache ------------------------------------------------------

// One layer of the device KV pool, the layout of engine/kv_memory.h.
typedef struct cuda_kv_layer {
    kv_dtype dtype;
    void* keys;          // device (n_slots, kv_dim) elements
    void* values;        // device (n_slots, kv_dim)
    float* key_scales;   // device, KV_I8: (n_slots, n_kv_heads); else NULL
    float* value_scales; // device, KV_I8: (n_slots, n_kv_heads)
    int n_kv_heads;
    int head_dim;
    int block_size; // token slots per block
} cuda_kv_layer;

// Stores row r's key and value (device (n_rows, key_stride) floats, the
// first kv_dim used) at slot device_slots[r], narrowed to the cache dtype:
// bit for bit kv_write_row's bytes (fp16 round to nearest even; int8 with
// scale max|x| / 127 per head).
int cuda_kv_write(cuda_context* context, const cuda_kv_layer* layer, const float* device_keys,
                  const float* device_values, int key_stride, const int64_t* device_slots, int n_rows,
                  kernel_traffic* traffic, error_info* err);

// Paged attention for n_rows query rows (decode rows, or each row of a
// prefill chunk at its own position): row r attends to the first
// device_context_lengths[r] positions of its sequence, whose block table
// is device_block_tables[device_table_offsets[r] ...]. device_query,
// device_out: (n_rows, query_stride) floats holding n_heads * head_dim.
// One pass over K and V with an online softmax in fp32; contexts longer
// than one partition (CUDA_ATTENTION_PARTITION tokens) are split over
// thread blocks and merged by a reduce kernel; the query heads that share
// a KV head read its keys and values once. max_context_length bounds every
// device_context_lengths[r] (it sizes the grid). host_context_lengths
// (n_rows) feeds the traffic figures (NULL: no traffic counted).
#define CUDA_ATTENTION_PARTITION 512
int cuda_paged_attention(cuda_context* context, float* device_out, const float* device_query, int query_stride,
                         const cuda_kv_layer* layer, const int32_t* device_block_tables,
                         const int32_t* device_table_offsets, const int32_t* device_context_lengths, int n_rows,
                         int max_context_length, int n_heads, const int32_t* host_context_lengths,
                         kernel_traffic* traffic, error_info* err);

#ifdef __cplusplus
}
#endif

#endif
