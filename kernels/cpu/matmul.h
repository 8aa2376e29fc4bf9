// matmul: a batch of activation rows times a weight matrix.
//
//   out[r][o] = sum_i in[r][i] * W[o][i]      for every row r and output o
//
// Weights are row-major [out][in] as in llama2.c checkpoints. The weight
// matrix is read once per call for the whole batch, which is exactly what
// the traffic counter records.
//
// Batch invariance (DESIGN.md): each output element is one dot product
// reduced in an order fixed by the dtype and the SIMD level alone, so
// out[r][o] has the same bits whether the batch holds 1 row or 64, wherever
// row r sits in it, and however many threads share the work (the outputs
// are split between threads; every element is computed by one thread).
//   - WEIGHT_F32: always the scalar loop sum += W[o][i] * x[i], i = 0, 1, ...,
//     as llama2.c's run.c does, so fp32 greedy decoding matches it exactly.
//   - WEIGHT_F16, WEIGHT_Q8_0: scalar (same loop, fp16 widened / one scale
//     per group), or AVX2 / AVX-512 with the fixed vector order described
//     in matmul_avx2.c and matmul_avx512.c. Different levels round
//     differently; one level always gives the same bits.
#ifndef SERVELAB_MATMUL_H
#define SERVELAB_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kernel_traffic.h"
#include "kernels/cpu/thread_pool.h"

typedef enum weight_dtype {
    WEIGHT_F32 = 0,  // float32 values
    WEIGHT_F16 = 1,  // IEEE half values, widened to fp32 in the kernel
    WEIGHT_Q8_0 = 2, // int8 values + one fp32 scale per group (llama2.c export v2)
} weight_dtype;

typedef struct weight_matrix {
    weight_dtype dtype;
    int rows;            // output features (d_out)
    int cols;            // input features (d_in)
    int group_size;      // WEIGHT_Q8_0: values per scale over the flattened matrix
                         // (divides rows * cols; a group may span two rows); else 0
    const void* values;  // (rows, cols) of float, uint16_t (fp16) or int8_t
    const float* scales; // WEIGHT_Q8_0: (rows * cols / group_size) fp32; else NULL
} weight_matrix;

// Bytes the matrix occupies: payload plus per-group scales.
uint64_t weight_matrix_bytes(const weight_matrix* w);

// out: (n_rows, w->rows) floats; in: (n_rows, w->cols) floats. One thread,
// the process's SIMD level (cpu_simd_level_selected()).
void matmul(float* out, const float* in, int n_rows, const weight_matrix* w, kernel_traffic* traffic);

// matmul with the output features split into chunks run on `pool` (NULL:
// the calling thread alone). Same bits as matmul() for any pool size.
void matmul_parallel(float* out, const float* in, int n_rows, const weight_matrix* w, thread_pool* pool,
                     kernel_traffic* traffic);

// matmul_parallel at an explicit SIMD level, lowered to what the CPU has
// (cpu_simd_level_clamp): for tests and benchmarks that compare levels in
// one process. WEIGHT_F32 ignores the level (always the scalar order).
void matmul_at_level(float* out, const float* in, int n_rows, const weight_matrix* w, thread_pool* pool,
                     cpu_simd_level level, kernel_traffic* traffic);

// Widens row `row` of w into out (w->cols floats): the embedding lookup.
void weight_row_to_f32(float* out, const weight_matrix* w, int row, kernel_traffic* traffic);

#endif
