// matmul_avx512: fp16 and Q8_0 matmul kernels for AVX-512 (F, BW, VL).
//
// The same design as matmul_avx2.c (read that first) with 16-lane vectors:
// tiles of C outputs x R batch rows, one accumulator per output element.
// AVX-512 adds two things used here: 32 vector registers (tiles up to 4 x 4)
// and masked loads, so the tail of a row is read with the lanes past its end
// switched off instead of copied into a padded buffer. Only the tail: full
// vectors use plain loads (masking every load made the Q8 kernel 4x slower
// on Zen 5).
//
// ---- The fixed reduction order (batch invariance) --------------------------
// out[r][o] = sum_i W[o][i] * x[r][i] is always reduced like this:
//   1. one 16-lane fp32 accumulator, starting at +0; for i = 0, 16, 32, ...
//      while i + 16 <= n: acc = fma(W[o][i..i+15], x[r][i..i+15], acc);
//   2. the last n % 16 values, loaded with the other lanes zeroed, are one
//      more fma (masked-off lanes add 0 * 0);
//   3. hsum16(): lanes l + (l+8), then the fixed tree of hsum8().
// Q8_0: steps 1-2 per group segment, then total = fma(segment, scale,
// total) in column order, then step 3. Tiles and threads only decide which
// elements run side by side, never how one is computed.
#include "kernels/cpu/matmul_simd.h"
#include "kernels/cpu/simd_x86.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <stdbool.h>


// Largest tile: 4 x 4 accumulators + 4 activations + a weight vector fit
// in the 32 zmm registers.
#define TILE_MAX 4

// The fp16 tile goes up to 4 outputs x 6 rows: 24 accumulators + 6
// activations + the widened weight vector = 31 registers, and 4 widenings
// per 24 FMAs instead of per 16 (a batch's FMAs share the ports with them).
// Batches are blocked: F16_ROW_BLOCK rows of activations (12 x 768 x 4
// bytes = 36 KiB) stay in L1 while a group of F16_OUTPUT_GROUP outputs'
// weights (64 x 1.5 KiB in fp16) waits in L2 for the next block of rows.
// Without the blocking, 16 rows (48 KiB) no longer fit beside the weights
// in a 48 KiB L1.
//
// Prefill and large batches take the same tiles. A path that widened a
// panel of 64 weight rows to fp32 once and ran 4 x 6 tiles over it (from
// 32 rows) was never faster here once the tiles were blocked, and much
// slower at 32-64 rows: stories110m's 84 layer matrices on Zen 5, GFLOP/s
// tile / panel, three runs of each, one thread: 146-148 / 97-118 at 32
// rows, 157-160 / 122-150 at 128, 160-161 / 133-160 at 512; two threads:
// 275-276 / 212-220 at 32, 275-277 / 257-266 at 512. It was removed.
#define F16_TILE_ROWS_MAX 6
#define F16_ROW_BLOCK 12
#define F16_OUTPUT_GROUP 64


// ---- fp16 ------------------------------------------------------------------

// out: (R rows of stride d_out, C consecutive outputs); x: (R, cols) floats.
// w: the tile's weights, either row-major, (C, cols) halves, or (tiled) its
// group of the fp16 tile layout (matmul.h), where row c's 16 columns from i
// start at w + 4 * i + 16 * c and a step past the last column holds +0.
// C, R and tiled are constants at every call site.
AVX512_INLINE void f16_tile(float* out, int d_out, const uint16_t* w, const float* x, int cols, int C, int R,
                            bool tiled) {
    __m512 acc[TILE_MAX][F16_TILE_ROWS_MAX], xv[F16_TILE_ROWS_MAX];
    UNROLL_TILE for (int c = 0; c < C; c++) { UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm512_setzero_ps(); }
    int i = 0;
    for (; i + 16 <= cols; i += 16) {
        UNROLL_TILE for (int r = 0; r < R; r++) xv[r] = _mm512_loadu_ps(x + (size_t)r * (size_t)cols + (size_t)i);
        UNROLL_TILE for (int c = 0; c < C; c++) {
            const uint16_t* p = tiled ? w + 4 * (size_t)i + 16 * (size_t)c : w + (size_t)c * (size_t)cols + (size_t)i;
            // The next tile's line at this column, once per 64-byte line (row-
            // major: rows of 768 halves are 24 lines, too short for the hardware
            // prefetcher). Tiles are one stream, which the hardware follows by
            // itself for one row (asking as well made it 0.91-0.92x), but a
            // batch's tiles take longer per line and need the lead: without it
            // 4 and 16 rows ran at 0.73x the row-major kernel.
            if (tiled ? R > 1 && (c & 1) == 0 : (i & 31) == 0)
                prefetch_ahead(p, F16_PREFETCH_TILES(R) * (size_t)(tiled ? 4 : C) * (size_t)cols * sizeof(uint16_t));
            __m512 wv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
            UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm512_fmadd_ps(wv, xv[r], acc[c][r]);
        }
    }
    if (i < cols) { // the tail: lanes past the end are not read and load as 0 (tiles hold +0 there)
        __mmask16 live = (__mmask16)((1u << (cols - i)) - 1u);
        UNROLL_TILE for (int r = 0; r < R; r++) {
            xv[r] = _mm512_maskz_loadu_ps(live, x + (size_t)r * (size_t)cols + (size_t)i);
        }
        UNROLL_TILE for (int c = 0; c < C; c++) {
            __m256i half = tiled ? _mm256_loadu_si256((const __m256i*)(w + 4 * (size_t)i + 16 * (size_t)c))
                                 : _mm256_maskz_loadu_epi16(live, w + (size_t)c * (size_t)cols + (size_t)i);
            __m512 wv = _mm512_cvtph_ps(half);
            UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm512_fmadd_ps(wv, xv[r], acc[c][r]);
        }
    }
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) out[(size_t)r * (size_t)d_out + (size_t)c] = hsum16(acc[c][r]);
    }
}

// Every tile shape the blocking below asks for: C outputs (1-4) x R rows (1-6).
#define F16_TILE_CASE(C, R, TILED) \
    case C * 8 + R: f16_tile(out, d_out, w, x, cols, C, R, TILED); break;
#define F16_TILE_ROWS(R, TILED) \
    F16_TILE_CASE(1, R, TILED) F16_TILE_CASE(2, R, TILED) F16_TILE_CASE(3, R, TILED) F16_TILE_CASE(4, R, TILED)
#define F16_TILE_SWITCH(TILED)                                                                              \
    switch (C * 8 + R) {                                                                                    \
        F16_TILE_ROWS(1, TILED) F16_TILE_ROWS(2, TILED) F16_TILE_ROWS(3, TILED) F16_TILE_ROWS(4, TILED)     \
        F16_TILE_ROWS(5, TILED) F16_TILE_ROWS(6, TILED) default : break; /* larger tiles are never asked for */ \
    }

static AVX512_TARGET __attribute__((noinline)) void f16_tile_rows_any(float* out, int d_out, const uint16_t* w,
                                                                      const float* x, int cols, int C, int R) {
    F16_TILE_SWITCH(false)
}

static AVX512_TARGET __attribute__((noinline)) void f16_tile_tiled_any(float* out, int d_out, const uint16_t* w,
                                                                       const float* x, int cols, int C, int R) {
    F16_TILE_SWITCH(true)
}

AVX512_TARGET void matmul_f16_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin,
                                     int o_end) {
    const uint16_t* values = (const uint16_t*)w->values;
    // Tiles, when there are any, are read instead of values; their groups
    // start at every 4th output (chunks are multiples of 8 outputs, matmul.c).
    const uint16_t* tiles = o_begin % 4 == 0 ? w->f16_tiles : NULL;
    const int d_out = w->rows, cols = w->cols;
    const size_t tile_row_halves = f16_tile_row_halves(cols);
    // A group of outputs' weights (L2) meets a block of batch rows (L1):
    // each tile's 4 weight rows stay in L1 while the block's rows pass over
    // them, and the group's weights stream from memory once per call.
    for (int og = o_begin; og < o_end; og += F16_OUTPUT_GROUP) {
        const int og_end = o_end - og < F16_OUTPUT_GROUP ? o_end : og + F16_OUTPUT_GROUP;
        for (int rb = 0; rb < n_rows; rb += F16_ROW_BLOCK) {
            const int block_rows = n_rows - rb < F16_ROW_BLOCK ? n_rows - rb : F16_ROW_BLOCK;
            // The block's rows in as few tiles of at most F16_TILE_ROWS_MAX
            // as possible, of even heights (8 rows: 4 + 4, not 6 + 2).
            const int n_tiles = (block_rows + F16_TILE_ROWS_MAX - 1) / F16_TILE_ROWS_MAX;
            for (int o = og; o < og_end; o += TILE_MAX) {
                int C = og_end - o < TILE_MAX ? og_end - o : TILE_MAX;
                for (int t = 0, r = rb; t < n_tiles; t++) {
                    int R = block_rows / n_tiles + (t < block_rows % n_tiles);
                    float* tile_out = out + (size_t)r * (size_t)d_out + (size_t)o;
                    const float* tile_in = in + (size_t)r * (size_t)cols;
                    if (tiles)
                        f16_tile_tiled_any(tile_out, d_out, tiles + (size_t)o * tile_row_halves, tile_in, cols, C, R);
                    else
                        f16_tile_rows_any(tile_out, d_out, values + (size_t)o * (size_t)cols, tile_in, cols, C, R);
                    r += R;
                }
            }
        }
    }
}

// ---- Q8_0 ------------------------------------------------------------------

// Widens 16 int8 at p to floats (exact).
AVX512_INLINE __m512 widen_q8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}

// The same for the lanes of `live` only; the others are not read and are 0.
AVX512_INLINE __m512 widen_q8_masked(const int8_t* p, __mmask16 live) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(live, p)));
}

// out: (R rows of stride d_out, C outputs); w: (C, cols) int8 starting at
// flat index row_offset; x: (R, cols). C > 1 needs q8_rows_share_segments().
AVX512_INLINE void q8_tile(float* out, int d_out, const int8_t* w, const float* scales, size_t row_offset,
                           size_t group_size, const float* x, int cols, int C, int R) {
    __m512 total[TILE_MAX][TILE_MAX], acc[TILE_MAX][TILE_MAX], xv[TILE_MAX];
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = _mm512_setzero_ps();
    }
    // group[c]: the group of row c's current segment. Each segment after
    // the first starts a new group, so it counts up by one (no division).
    size_t group[TILE_MAX];
    UNROLL_TILE for (int c = 0; c < C; c++) group[c] = (row_offset + (size_t)c * (size_t)cols) / group_size;
    for (int s = 0; s < cols;) {
        size_t group_end = (group[0] + 1) * group_size; // flat index
        int e = group_end - row_offset < (size_t)cols ? (int)(group_end - row_offset) : cols;
        UNROLL_TILE for (int c = 0; c < C; c++) {
            UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm512_setzero_ps();
        }
        int i = s;
        for (; i + 16 <= e; i += 16) {
            UNROLL_TILE for (int r = 0; r < R; r++) xv[r] = _mm512_loadu_ps(x + (size_t)r * (size_t)cols + (size_t)i);
            UNROLL_TILE for (int c = 0; c < C; c++) {
                __m512 wv = widen_q8(w + (size_t)c * (size_t)cols + (size_t)i);
                UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm512_fmadd_ps(wv, xv[r], acc[c][r]);
            }
        }
        if (i < e) { // the segment's tail: masked loads, the other lanes add 0 * 0
            __mmask16 live = (__mmask16)((1u << (e - i)) - 1u);
            UNROLL_TILE for (int r = 0; r < R; r++) {
                xv[r] = _mm512_maskz_loadu_ps(live, x + (size_t)r * (size_t)cols + (size_t)i);
            }
            UNROLL_TILE for (int c = 0; c < C; c++) {
                __m512 wv = widen_q8_masked(w + (size_t)c * (size_t)cols + (size_t)i, live);
                UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm512_fmadd_ps(wv, xv[r], acc[c][r]);
            }
        }
        UNROLL_TILE for (int c = 0; c < C; c++) {
            __m512 scale = _mm512_set1_ps(scales[group[c]++]);
            UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = _mm512_fmadd_ps(acc[c][r], scale, total[c][r]);
        }
        s = e;
    }
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) out[(size_t)r * (size_t)d_out + (size_t)c] = hsum16(total[c][r]);
    }
}

static AVX512_TARGET __attribute__((noinline)) void q8_tile_any(float* out, int d_out, const int8_t* w,
                                                                const float* scales, size_t row_offset,
                                                                size_t group_size, const float* x, int cols, int C,
                                                                int R) {
    switch (C * 8 + R) {
    case 1 * 8 + 1: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 1, 1); break;
    case 1 * 8 + 2: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 1, 2); break;
    case 1 * 8 + 3: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 1, 3); break;
    case 1 * 8 + 4: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 1, 4); break;
    case 2 * 8 + 1: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 2, 1); break;
    case 2 * 8 + 2: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 2, 2); break;
    case 2 * 8 + 3: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 2, 3); break;
    case 2 * 8 + 4: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 2, 4); break;
    case 3 * 8 + 1: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 3, 1); break;
    case 3 * 8 + 2: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 3, 2); break;
    case 4 * 8 + 1: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 4, 1); break;
    case 4 * 8 + 2: q8_tile(out, d_out, w, scales, row_offset, group_size, x, cols, 4, 2); break;
    default: break; // larger tiles are never asked for
    }
}

AVX512_TARGET void matmul_q8_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin,
                                    int o_end) {
    const int8_t* values = (const int8_t*)w->values;
    const int d_out = w->rows, cols = w->cols;
    const size_t group_size = (size_t)w->group_size;
    // Two accumulators per element (segment, total), so at most 16 per tile:
    // 4 outputs x 2 rows, or 2 x 4 for a batch; 1 output when rows split
    // into groups at different columns.
    const int max_outputs = !q8_rows_share_segments(w) ? 1 : n_rows >= 3 ? 2 : TILE_MAX;
    for (int o = o_begin; o < o_end; o += max_outputs) {
        int C = o_end - o < max_outputs ? o_end - o : max_outputs;
        size_t row_offset = (size_t)o * (size_t)cols;
        for (int r = 0; r < n_rows; r += TILE_MAX) {
            int R = n_rows - r < TILE_MAX ? n_rows - r : TILE_MAX;
            q8_tile_any(out + (size_t)r * (size_t)d_out + (size_t)o, d_out, values + row_offset, w->scales, row_offset,
                        group_size, in + (size_t)r * (size_t)cols, cols, C, R);
        }
    }
}

// ---- fp32: llama2.c's order, 16 outputs in the lanes -------------------------------
//
// WEIGHT_F32 must give the bits of the scalar loop sum += W[o][i] * x[i]
// (a multiply rounded, then an add rounded; i = 0, 1, ...). That order
// allows no split of one sum, but 16 sums side by side: lane k of one
// accumulator is output o + k. A 16 x 16 block of weights is transposed in
// registers so that vector j holds column i + j of the 16 rows, and then
// acc = acc + (column_j * x[i + j]) for j in order: separate multiply and
// add instructions, never an FMA. The columns past the last full block go
// through the scalar loop, continuing each lane's sum. 2-3x fewer cycles
// per multiply-add than dot_f32_x8 (the transposition is 64 shuffles per
// 256 multiply-adds), which is most of stories260K's matmul time.

// r[j] = column j of the 16 rows in r (the classic three-stage transpose).
AVX512_INLINE void transpose16(__m512* r) {
    __m512 t[16];
    UNROLL_TILE for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    UNROLL_TILE for (int k = 0; k < 4; k++) {
        __m512d a = _mm512_castps_pd(t[4 * k]), b = _mm512_castps_pd(t[4 * k + 1]);
        __m512d c = _mm512_castps_pd(t[4 * k + 2]), d = _mm512_castps_pd(t[4 * k + 3]);
        r[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    UNROLL_TILE for (int k = 0; k < 4; k++) {
        t[k] = _mm512_shuffle_f32x4(r[k], r[k + 4], 0x88);
        t[k + 4] = _mm512_shuffle_f32x4(r[k], r[k + 4], 0xdd);
        t[k + 8] = _mm512_shuffle_f32x4(r[k + 8], r[k + 12], 0x88);
        t[k + 12] = _mm512_shuffle_f32x4(r[k + 8], r[k + 12], 0xdd);
    }
    UNROLL_TILE for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
        r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
    }
}

// Outputs [o, o + 16) for n_rows <= F32_ROWS batch rows: out (rows of
// stride d_out); w: the 16 weight rows (stride cols); x: (n_rows, cols).
#define F32_ROWS 8
static AVX512_TARGET void f32_block16(float* out, int d_out, const float* w, const float* x, int cols, int n_rows) {
    __m512 acc[F32_ROWS];
    UNROLL_TILE for (int r = 0; r < F32_ROWS; r++) acc[r] = _mm512_setzero_ps();
    int i = 0;
    // The 16 rows are read side by side, 16 streams that the hardware
    // prefetcher follows poorly. So each step also asks for the next
    // block's next KiB in memory order: over the block's cols / 16 steps,
    // exactly the next block (16 * cols floats). One block ahead into L1:
    // stories110m's 84 layer matrices at 1 row, 2 threads, read 39.4-39.8
    // GB/s, against 28.3-29.2 without (two blocks ahead 34.5-35.1, into L2
    // only 30.7-31.4).
    const char* next_block = (const char*)(w + 16 * (size_t)cols);
    for (; i + 16 <= cols; i += 16) {
        __m512 column[16];
        UNROLL_TILE for (int k = 0; k < 16; k++) _mm_prefetch(next_block + ((size_t)i + (size_t)k) * 64, _MM_HINT_T0);
        UNROLL_TILE for (int k = 0; k < 16; k++) column[k] = _mm512_loadu_ps(w + (size_t)k * (size_t)cols + i);
        transpose16(column);
        for (int r = 0; r < n_rows; r++) {
            const float* xr = x + (size_t)r * (size_t)cols + i;
            __m512 sum = acc[r];
            UNROLL_TILE for (int j = 0; j < 16; j++) sum = _mm512_add_ps(sum, _mm512_mul_ps(column[j], _mm512_set1_ps(xr[j])));
            acc[r] = sum;
        }
    }
    for (int r = 0; r < n_rows; r++) {
        float sums[16];
        _mm512_storeu_ps(sums, acc[r]);
        const float* xr = x + (size_t)r * (size_t)cols;
        for (int k = 0; k < 16; k++) {
            float sum = sums[k];
            const float* row = w + (size_t)k * (size_t)cols;
            for (int t = i; t < cols; t++) sum += row[t] * xr[t];
            out[(size_t)r * (size_t)d_out + (size_t)k] = sum;
        }
    }
}

// Outputs [o_begin, o_begin + 16 * n_blocks) of every batch row.
AVX512_TARGET void matmul_f32_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin,
                                     int n_blocks) {
    const float* values = (const float*)w->values;
    const int d_out = w->rows, cols = w->cols;
    for (int b = 0; b < n_blocks; b++) {
        int o = o_begin + 16 * b;
        for (int r = 0; r < n_rows; r += F32_ROWS)
            f32_block16(out + (size_t)r * (size_t)d_out + (size_t)o, d_out, values + (size_t)o * (size_t)cols,
                        in + (size_t)r * (size_t)cols, cols, n_rows - r < F32_ROWS ? n_rows - r : F32_ROWS);
    }
}

#endif
