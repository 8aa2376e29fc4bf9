// matmul_f32_avx512: WEIGHT_F32 matmul in llama2.c's order, read from the
// fp32 tile layout (matmul.h).
//
// llama2.c reduces each output as sum += W[o][i] * x[i] for i = 0, 1, ...:
// a multiply rounded, then an add rounded, one column after the other. One
// sum allows no split, but outputs are independent, so 16 of them run side
// by side, one per lane: lane j of an accumulator is output 16g + j, and
// column step i is
//   acc = acc + (tiles[g][i][0..15] * broadcast(x[i]))
// with a separate multiply and add (never an FMA: that rounds once, not
// twice). Each lane does exactly the scalar loop's operations on its own
// output, so the results have its bits, whatever the batch, the tile shape
// or the thread. Padded rows (past w->rows) are +0 and their lanes are not
// stored.
//
// One column step of a group is one 64-byte load, a broadcast shared by the
// groups of the tile, a multiply and an add: a few instructions per 64
// bytes, so the loop waits on memory rather than on the core. The 4-cycle
// add latency is hidden by several independent accumulators: 4 groups for
// one activation row (decode), 2 groups x up to 6 rows for a batch.
#include "kernels/cpu/matmul_simd.h"
#include "kernels/cpu/simd_x86.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

// Largest tiles: 4 groups x 1 row (decode), 2 groups x 6 rows (batches):
// 12 accumulators + 2 weight vectors + a broadcast fit in 32 registers.
#define F32_GROUPS_MAX 4
#define F32_ROWS_MAX 6

// out: (R rows of stride d_out, from output o); tiles: group g's (cols, 16)
// floats at tiles + g * 16 * cols; x: (R, cols). n_outputs: outputs of the
// tile that exist (the lanes past them are padding, not stored). G and R
// are constants at every call site.
AVX512_INLINE void f32_tile(float* out, int d_out, const float* tiles, const float* x, int cols, int n_outputs, int G,
                            int R) {
    __m512 acc[F32_GROUPS_MAX][F32_ROWS_MAX];
    const size_t group_floats = 16 * (size_t)cols;
    UNROLL_TILE for (int g = 0; g < G; g++) { UNROLL_TILE for (int r = 0; r < R; r++) acc[g][r] = _mm512_setzero_ps(); }
    for (int i = 0; i < cols; i++) {
        __m512 column[F32_GROUPS_MAX];
        UNROLL_TILE for (int g = 0; g < G; g++) column[g] = _mm512_loadu_ps(tiles + g * group_floats + 16 * (size_t)i);
        UNROLL_TILE for (int r = 0; r < R; r++) {
            const __m512 xi = _mm512_set1_ps(x[(size_t)r * (size_t)cols + (size_t)i]);
            UNROLL_TILE for (int g = 0; g < G; g++) acc[g][r] = _mm512_add_ps(acc[g][r], _mm512_mul_ps(column[g], xi));
        }
    }
    UNROLL_TILE for (int g = 0; g < G; g++) {
        const int live = n_outputs - 16 * g;
        if (live <= 0) break;
        const __mmask16 stored = live >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << live) - 1u);
        UNROLL_TILE for (int r = 0; r < R; r++) {
            _mm512_mask_storeu_ps(out + (size_t)r * (size_t)d_out + 16 * (size_t)g, stored, acc[g][r]);
        }
    }
}

#define F32_TILE_CASE(G, R)                                                                                            \
    case G * 8 + R:                                                                                                    \
        f32_tile(out, d_out, tiles, x, cols, n_outputs, G, R);                                                         \
        break;
#define F32_TILE_ROWS(R) F32_TILE_CASE(1, R) F32_TILE_CASE(2, R)

static AVX512_TARGET __attribute__((noinline)) void
f32_tile_any(float* out, int d_out, const float* tiles, const float* x, int cols, int n_outputs, int G, int R) {
    switch (G * 8 + R) {
        F32_TILE_CASE(4, 1)
        F32_TILE_ROWS(1)
        F32_TILE_ROWS(2)
        F32_TILE_ROWS(3) F32_TILE_ROWS(4) F32_TILE_ROWS(5) F32_TILE_ROWS(6) default
            : break; // larger tiles are never asked for
    }
}

AVX512_TARGET void matmul_f32_tiles_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin,
                                           int o_end) {
    const int d_out = w->rows, cols = w->cols;
    const float* tiles = w->f32_tiles; // o_begin is the first row of a group (the caller checks)
    // One activation row: 4 groups at a time (4 chains of adds in flight);
    // a batch: 2 groups x up to 6 rows, each pair's weights (2 x 16 x cols
    // floats, 128 KiB at 1024 columns) staying in L2 while the rows pass.
    const int groups_per_tile = n_rows == 1 ? 4 : 2;
    for (int o = o_begin; o < o_end; o += 16 * groups_per_tile) {
        const int n_outputs = o_end - o < 16 * groups_per_tile ? o_end - o : 16 * groups_per_tile;
        const int G = (n_outputs + 15) / 16;
        const float* group_tiles = tiles + (size_t)o * (size_t)cols;
        for (int r = 0; r < n_rows; r += F32_ROWS_MAX) {
            const int R = n_rows - r < F32_ROWS_MAX ? n_rows - r : F32_ROWS_MAX;
            float* tile_out = out + (size_t)r * (size_t)d_out + (size_t)o;
            const float* tile_in = in + (size_t)r * (size_t)cols;
            if (G == 3) { // 2 + 1 groups: shapes the switch has
                f32_tile_any(tile_out, d_out, group_tiles, tile_in, cols, 32, 2, R);
                f32_tile_any(tile_out + 32, d_out, group_tiles + 32 * (size_t)cols, tile_in, cols, n_outputs - 32, 1,
                             R);
            } else
                f32_tile_any(tile_out, d_out, group_tiles, tile_in, cols, n_outputs, G, R);
        }
    }
}

#endif
