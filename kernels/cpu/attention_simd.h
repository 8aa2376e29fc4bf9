// attention_simd: the vectorised attention kernels (internal to kernels/cpu).
#ifndef SERVELAB_ATTENTION_SIMD_H
#define SERVELAB_ATTENTION_SIMD_H

#include "kernels/cpu/attention.h"

// The reference: llama2.c's order, scalar, for every element type.
// scores: (n_context) scratch.
void attention_row_scalar(float* out, const float* query, const kv_layer_view* kv, int n_context, int n_heads,
                          int n_kv_heads, int head_dim, float* scores);

// fp32 or int8 keys and values with AVX2 (no FMA needed): n_rows (1 ..
// ATTENTION_ROWS_MAX) rows of one sequence, row j at context n_context + j,
// each with the reference's bits (positions in the lanes for the scores,
// dimensions for the values; the rows share each key and value load).
// out, query: (n_rows, n_heads * head_dim); all_scores: (n_rows, n_heads,
// n_context + n_rows - 1) scratch.
void attention_rows_exact_avx2(float* out, const float* query, const kv_layer_view* kv, int n_context, int n_rows,
                               int n_heads, int n_kv_heads, int head_dim, float* all_scores);

// fp16 keys and values; callable only when the CPU has AVX2, FMA and F16C.
// scores: (n_context) scratch; all_scores: (n_heads, n_context) scratch, or
// NULL to go head by head with `scores` alone (the same bits either way).
void attention_row_f16_avx2(float* out, const float* query, const kv_layer_view* kv, int n_context, int n_heads,
                            int n_kv_heads, int head_dim, float* scores, float* all_scores);

// attention_rows for fp16 with AVX2: n_rows (1 .. ATTENTION_ROWS_MAX) rows
// of one sequence, row j at context n_context + j; all_scores: (n_rows,
// n_heads, n_context + n_rows - 1) scratch. Each row gets the bits
// attention_row_f16_avx2 gives it alone.
void attention_rows_f16_avx2(float* out, const float* query, const kv_layer_view* kv, int n_context, int n_rows,
                             int n_heads, int n_kv_heads, int head_dim, float* all_scores);

#endif
