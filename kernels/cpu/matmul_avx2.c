// matmul_avx2: fp16 and Q8_0 matmul kernels for AVX2 + FMA + F16C.
//
// Work is cut into tiles of C weight rows (outputs) x R batch rows: each
// weight vector loaded (and widened) once feeds R dot products, each
// activation vector loaded once feeds C, and the C x R accumulators are
// independent FMA chains that hide the FMA latency (4 cycles).
//
// ---- The fixed reduction order (batch invariance) --------------------------
// One output element out[r][o] = sum_i W[o][i] * x[r][i] is always reduced
// like this, whatever tile it sits in:
//   1. one 8-lane fp32 accumulator, starting at +0; for i = 0, 8, 16, ...
//      while i + 8 <= n: acc = fma(W[o][i..i+7], x[r][i..i+7], acc), so
//      lane l sums the products with i % 8 == l, in increasing i;
//   2. the last n % 8 values, zero-padded to a full vector, are one more
//      fma (padded lanes add 0 * 0);
//   3. the lanes are added in the fixed tree of hsum8().
// Q8_0 does the same per group segment (below), then adds the segments'
// scaled accumulators in column order. A tile only decides how many such
// elements run side by side, never how one is computed, so a row's result
// is the same bits alone or in a batch, in any tile or thread.
#include "kernels/cpu/matmul_simd.h"
#include "kernels/cpu/simd_x86.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>


// Largest tile: 4 outputs x 2 batch rows. For fp16 that is 8 accumulators
// + 2 activations + 1 weight vector of the 16 ymm registers; 8 independent
// FMA chains cover 2 FMAs per cycle x 4 cycles latency. (4 rows x 2 outputs
// measured slower: ~50 vs ~80 GFLOP/s on one Zen 5 core at 16 rows.)
#define TILE_OUTPUTS 4
#define TILE_ROWS 2


// ---- fp16 ------------------------------------------------------------------

// out: (R rows of stride d_out, C consecutive outputs); w: (C, cols) halves;
// x: (R, cols) floats. C and R are constants at every call site, so the
// loops unroll and the accumulators live in registers.
AVX2_INLINE void f16_tile(float* out, int d_out, const uint16_t* w, const float* x, int cols, int C, int R) {
    __m256 acc[TILE_OUTPUTS][TILE_ROWS], xv[TILE_ROWS];
    UNROLL_TILE for (int c = 0; c < C; c++) { UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm256_setzero_ps(); }
    int i = 0;
    for (; i + 8 <= cols; i += 8) {
        UNROLL_TILE for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(x + (size_t)r * (size_t)cols + (size_t)i);
        UNROLL_TILE for (int c = 0; c < C; c++) {
            const uint16_t* p = w + (size_t)c * (size_t)cols + (size_t)i;
            // F16_PREFETCH_TILES ahead, once per 64-byte line (see matmul_avx512.c).
            if ((i & 31) == 0) prefetch_ahead(p, F16_PREFETCH_TILES(R) * (size_t)C * (size_t)cols * sizeof(uint16_t));
            __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
            UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm256_fmadd_ps(wv, xv[r], acc[c][r]);
        }
    }
    if (i < cols) { // the tail, zero-padded to one vector (never read past the arrays)
        size_t tail = (size_t)(cols - i);
        UNROLL_TILE for (int r = 0; r < R; r++) {
            float padded[8] = {0};
            memcpy(padded, x + (size_t)r * (size_t)cols + (size_t)i, tail * sizeof(float));
            xv[r] = _mm256_loadu_ps(padded);
        }
        UNROLL_TILE for (int c = 0; c < C; c++) {
            uint16_t padded[8] = {0};
            memcpy(padded, w + (size_t)c * (size_t)cols + (size_t)i, tail * sizeof(uint16_t));
            __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)padded));
            UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm256_fmadd_ps(wv, xv[r], acc[c][r]);
        }
    }
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) out[(size_t)r * (size_t)d_out + (size_t)c] = hsum8(acc[c][r]);
    }
}

static AVX2_TARGET __attribute__((noinline)) void f16_tile_any(float* out, int d_out, const uint16_t* w, const float* x,
                                                               int cols, int C, int R) {
    switch (C * 8 + R) {
    case 1 * 8 + 1: f16_tile(out, d_out, w, x, cols, 1, 1); break;
    case 1 * 8 + 2: f16_tile(out, d_out, w, x, cols, 1, 2); break;
    case 2 * 8 + 1: f16_tile(out, d_out, w, x, cols, 2, 1); break;
    case 2 * 8 + 2: f16_tile(out, d_out, w, x, cols, 2, 2); break;
    case 3 * 8 + 1: f16_tile(out, d_out, w, x, cols, 3, 1); break;
    case 3 * 8 + 2: f16_tile(out, d_out, w, x, cols, 3, 2); break;
    case 4 * 8 + 1: f16_tile(out, d_out, w, x, cols, 4, 1); break;
    case 4 * 8 + 2: f16_tile(out, d_out, w, x, cols, 4, 2); break;
    default: break; // larger tiles are never asked for
    }
}

AVX2_TARGET void matmul_f16_avx2(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin,
                                 int o_end) {
    const uint16_t* values = (const uint16_t*)w->values;
    const int d_out = w->rows, cols = w->cols;
    // Outputs outermost: a tile's 4 weight rows (a few KiB) stay in L1 while
    // every batch row passes over them, so weights stream from memory once.
    for (int o = o_begin; o < o_end; o += TILE_OUTPUTS) {
        int C = o_end - o < TILE_OUTPUTS ? o_end - o : TILE_OUTPUTS;
        for (int r = 0; r < n_rows; r += TILE_ROWS) {
            int R = n_rows - r < TILE_ROWS ? n_rows - r : TILE_ROWS;
            f16_tile_any(out + (size_t)r * (size_t)d_out + (size_t)o, d_out, values + (size_t)o * (size_t)cols,
                         in + (size_t)r * (size_t)cols, cols, C, R);
        }
    }
}

// ---- Q8_0 ------------------------------------------------------------------
//
// Per element: the row is cut where a quantization group ends (groups run
// over the flattened matrix, so one can start in the previous row). Each
// segment [s, e) is reduced as in steps 1-2 above into a fresh accumulator,
// int8 widened exactly to fp32; then total = fma(segment, scale, total),
// segments in column order; then hsum8(total).

// Widens 8 int8 at p to 8 floats (exact).
AVX2_INLINE __m256 widen_q8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

// out: (R rows of stride d_out, C outputs); w: (C, cols) int8 starting at
// flat index row_offset; x: (R, cols). C > 1 needs q8_rows_share_segments().
AVX2_INLINE void q8_tile(float* out, int d_out, const int8_t* w, const float* scales, size_t row_offset,
                         size_t group_size, const float* x, int cols, int C, int R) {
    __m256 total[TILE_OUTPUTS][TILE_ROWS], acc[TILE_OUTPUTS][TILE_ROWS], xv[TILE_ROWS];
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = _mm256_setzero_ps();
    }
    // group[c]: the group of row c's current segment. Each segment after
    // the first starts a new group, so it counts up by one (no division).
    size_t group[TILE_OUTPUTS];
    UNROLL_TILE for (int c = 0; c < C; c++) group[c] = (row_offset + (size_t)c * (size_t)cols) / group_size;
    for (int s = 0; s < cols;) {
        size_t group_end = (group[0] + 1) * group_size; // flat index
        int e = group_end - row_offset < (size_t)cols ? (int)(group_end - row_offset) : cols;
        UNROLL_TILE for (int c = 0; c < C; c++) {
            UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm256_setzero_ps();
        }
        int i = s;
        for (; i + 8 <= e; i += 8) {
            UNROLL_TILE for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(x + (size_t)r * (size_t)cols + (size_t)i);
            UNROLL_TILE for (int c = 0; c < C; c++) {
                __m256 wv = widen_q8(w + (size_t)c * (size_t)cols + (size_t)i);
                UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm256_fmadd_ps(wv, xv[r], acc[c][r]);
            }
        }
        if (i < e) {
            size_t tail = (size_t)(e - i);
            UNROLL_TILE for (int r = 0; r < R; r++) {
                float padded[8] = {0};
                memcpy(padded, x + (size_t)r * (size_t)cols + (size_t)i, tail * sizeof(float));
                xv[r] = _mm256_loadu_ps(padded);
            }
            UNROLL_TILE for (int c = 0; c < C; c++) {
                int8_t padded[8] = {0};
                memcpy(padded, w + (size_t)c * (size_t)cols + (size_t)i, tail);
                __m256 wv = widen_q8(padded);
                UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm256_fmadd_ps(wv, xv[r], acc[c][r]);
            }
        }
        UNROLL_TILE for (int c = 0; c < C; c++) {
            __m256 scale = _mm256_set1_ps(scales[group[c]++]);
            UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = _mm256_fmadd_ps(acc[c][r], scale, total[c][r]);
        }
        s = e;
    }
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) out[(size_t)r * (size_t)d_out + (size_t)c] = hsum8(total[c][r]);
    }
}

static AVX2_TARGET __attribute__((noinline)) void q8_tile_any(float* out, int d_out, const int8_t* w,
                                                              const float* scales, size_t row_offset, size_t group_size,
                                                              const float* x, int cols, int C, int R) {
    switch (C * 8 + R) {
    case 1 * 8 + 1: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 1, 1); break;
    case 1 * 8 + 2: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 1, 2); break;
    case 2 * 8 + 1: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 2, 1); break;
    case 2 * 8 + 2: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 2, 2); break;
    case 3 * 8 + 1: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 3, 1); break;
    case 4 * 8 + 1: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 4, 1); break;
    default: break; // larger tiles are never asked for
    }
}

AVX2_TARGET void matmul_q8_avx2(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin,
                                int o_end) {
    const int8_t* values = (const int8_t*)w->values;
    const int d_out = w->rows, cols = w->cols;
    const size_t group_size = (size_t)w->group_size;
    // Two accumulators per element (segment, total), so at most 8 per tile:
    // 4 outputs x 1 row, or 2 x 2 for a batch; 1 output when rows split
    // into groups at different columns.
    const int max_outputs = !q8_rows_share_segments(w) ? 1 : n_rows >= 2 ? 2 : 4;
    for (int o = o_begin; o < o_end; o += max_outputs) {
        int C = o_end - o < max_outputs ? o_end - o : max_outputs;
        size_t row_offset = (size_t)o * (size_t)cols;
        for (int r = 0; r < n_rows; r += TILE_ROWS) {
            int R = n_rows - r < TILE_ROWS ? n_rows - r : TILE_ROWS;
            q8_tile_any(out + (size_t)r * (size_t)d_out + (size_t)o, d_out, values + row_offset, w->scales, row_offset,
                        group_size, in + (size_t)r * (size_t)cols, cols, C, R);
        }
    }
}

#endif
