// matmul_simd: the SIMD kernels behind matmul_parallel (internal to kernels/cpu;
// engine code calls matmul.h only).
//
// Each function computes out[r][o] for every batch row r < n_rows and every
// output o in [o_begin, o_end), with the same shapes as matmul():
// out (n_rows, w->rows) floats, in (n_rows, w->cols) floats.
//
// The batch-invariance contract (matmul.h) holds for each function on its
// own: out[r][o] is computed by the same instructions in the same order
// whatever n_rows, r, o_begin and o_end are. Only call them once
// cpu_features says the CPU has the level (x86-64 builds only).
#ifndef SERVELAB_MATMUL_SIMD_H
#define SERVELAB_MATMUL_SIMD_H

#include "kernels/cpu/matmul.h"

void matmul_f16_avx2(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);
void matmul_q8_avx2(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);
void matmul_f16_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);
void matmul_q8_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);

// `UNROLL_TILE for (...)`: a loop over a tile's outputs or rows (at most
// 4, a constant at every call site) is unrolled completely, so the tile's
// accumulators live in registers, not in an array in memory. GCC takes a
// count; clang's plain "unroll" means completely.
#if defined(__clang__)
#define UNROLL_TILE _Pragma("unroll")
#else
#define UNROLL_TILE _Pragma("GCC unroll 4")
#endif

// Q8_0 tiles may share one column split between several weight rows only
// when every row splits into groups at the same columns: a row holds whole
// groups (cols % group_size == 0) or a group holds whole rows.
static inline int q8_rows_share_segments(const weight_matrix* w) {
    return w->cols % w->group_size == 0 || w->group_size % w->cols == 0;
}

#endif
