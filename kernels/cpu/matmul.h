// matmul: a batch of activation rows times a weight matrix.
//
//   out[r][o] = sum_i in[r][i] * W[o][i]      for every row r and output o
//
// Weights are row-major [out][in] as in llama2.c checkpoints. Each output
// element is one dot product reduced in index order i = 0, 1, ..., so a row
// gives bit-identical results whatever else is in the batch (DESIGN.md,
// batch invariance). The weight matrix is read once per call for the whole
// batch, which is exactly what the traffic counter records.
#ifndef SERVELAB_MATMUL_H
#define SERVELAB_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kernel_traffic.h"

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

// out: (n_rows, w->rows) floats; in: (n_rows, w->cols) floats.
void matmul(float* out, const float* in, int n_rows, const weight_matrix* w, kernel_traffic* traffic);

// Widens row `row` of w into out (w->cols floats): the embedding lookup.
void weight_row_to_f32(float* out, const weight_matrix* w, int row, kernel_traffic* traffic);

#endif
