// matmul_int_avx512: WEIGHT_I8 / WEIGHT_I4 kernels for AVX-512 (F, BW, VL),
// and W8A8 with AVX512_VNNI (vpdpbusd).
//
// The design of matmul_int_avx2.c with 16-lane vectors, 32 registers (tiles
// up to 4 x 4, or 8 x 1 for a single row) and masked tails. Every tile
// prefetches the next tile's weights (prefetch_ahead). The reduction orders
// (matmul_int.c):
//   INT8:  per group a 16-lane accumulator, steps of 16 columns, the tail
//          loaded masked (as 0); total = fma(acc, scale, total); hsum16.
//   INT4:  steps of 32 columns = 16 bytes: lane l takes column s + 2l (low
//          nibble of byte l), then s + 2l + 1 (high nibble); hsum16. Groups
//          of a multiple of 128, and groups of 32 or 64: steps of
//          128 columns = 64 bytes, lane l takes s + 8l .. s + 8l + 7 (the
//          phase kernel below).
//   W8A8:  exact int32 group sums, then w8a8_term() per group in order.
// Measured on 2 Zen 5 cores (35 GB/s stream-read), 5632 x 2048, group 128,
// 1 row, 2 threads: INT8 43 GB/s, INT4 33 GB/s, W8A8 48 GB/s of packed weights.
#include "kernels/cpu/matmul_simd.h"
#include "kernels/cpu/simd_x86.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <stdbool.h>

#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define VNNI_INLINE                                                                                                    \
    static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

// Tiles: up to 4 x 4; a single batch row takes up to 8 outputs, so that 8
// accumulator chains hide the FMA latency (~1.2 ns here) when R = 1: with
// 4 the 1-row INT8 and INT4 kernels were bound by it.
#define TILE_MAX 4
#define TILE_OUTPUTS_MAX 8

// The tile shapes the kernels are compiled for, C outputs x R rows: TILE(c,
// r) for the one asked for (each a separate, fully unrolled instance).
#define SWITCH_TILE_SHAPES(C, R, TILE)                                                                                 \
    switch ((C)*8 + (R)) {                                                                                             \
    case 1 * 8 + 1: TILE(1, 1); break;                                                                                 \
    case 1 * 8 + 2: TILE(1, 2); break;                                                                                 \
    case 1 * 8 + 3: TILE(1, 3); break;                                                                                 \
    case 1 * 8 + 4: TILE(1, 4); break;                                                                                 \
    case 2 * 8 + 1: TILE(2, 1); break;                                                                                 \
    case 2 * 8 + 2: TILE(2, 2); break;                                                                                 \
    case 2 * 8 + 3: TILE(2, 3); break;                                                                                 \
    case 2 * 8 + 4: TILE(2, 4); break;                                                                                 \
    case 3 * 8 + 1: TILE(3, 1); break;                                                                                 \
    case 3 * 8 + 2: TILE(3, 2); break;                                                                                 \
    case 4 * 8 + 1: TILE(4, 1); break;                                                                                 \
    case 4 * 8 + 2: TILE(4, 2); break;                                                                                 \
    case 5 * 8 + 1: TILE(5, 1); break;                                                                                 \
    case 6 * 8 + 1: TILE(6, 1); break;                                                                                 \
    case 7 * 8 + 1: TILE(7, 1); break;                                                                                 \
    case 8 * 8 + 1: TILE(8, 1); break;                                                                                 \
    default: break; /* larger tiles are never asked for */                                                             \
    }

// The first n (< 16) lanes.
AVX512_INLINE __mmask16 first_lanes(int n) { return (__mmask16)((1u << n) - 1u); }

// The end of group g of a tile: total = fma(acc, scale_g, total) per
// element; scales: (C, n_groups) fp16.
AVX512_INLINE void add_group_to_totals(__m512 total[][TILE_MAX], __m512 acc[][TILE_MAX], const uint16_t* scales,
                                       int n_groups, int g, int C, int R) {
    UNROLL_TILE for (int c = 0; c < C; c++) {
        __m512 scale = _mm512_set1_ps(_cvtsh_ss(scales[(size_t)c * (size_t)n_groups + (size_t)g]));
        UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = _mm512_fmadd_ps(acc[c][r], scale, total[c][r]);
    }
}

// The end of a tile: out[r][c] = hsum16(total[c][r]) (out rows of stride d_out).
AVX512_INLINE void store_totals(float* out, int d_out, __m512 total[][TILE_MAX], int C, int R) {
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) out[(size_t)r * (size_t)d_out + (size_t)c] = hsum16(total[c][r]);
    }
}

// ---- INT8 codes, fp32 activations (W8A16) -------------------------------------

// 16 code bytes as the floats c = q - zero (exact).
AVX512_INLINE __m512 widen_i8(__m128i bytes, __m512i zero, int asymmetric) {
    if (asymmetric) return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(bytes), zero));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
}

// out: (R rows of stride d_out, C outputs); w: (C, cols) codes; scales,
// zeros: (C, n_groups) (zeros NULL when symmetric); x: (R, cols).
AVX512_INLINE void i8_tile(float* out, int d_out, const uint8_t* w, const uint16_t* scales, const uint8_t* zeros,
                           const float* x, int cols, int group_size, int C, int R, int asymmetric) {
    const int n_groups = cols / group_size;
    __m512 total[TILE_OUTPUTS_MAX][TILE_MAX], acc[TILE_OUTPUTS_MAX][TILE_MAX], xv[TILE_MAX];
    __m512i zero[TILE_OUTPUTS_MAX];
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = _mm512_setzero_ps();
    }
    for (int g = 0; g < n_groups; g++) {
        const int begin = g * group_size, end = begin + group_size;
        UNROLL_TILE for (int c = 0; c < C; c++) {
            zero[c] = asymmetric ? _mm512_set1_epi32(zeros[(size_t)c * (size_t)n_groups + (size_t)g])
                                 : _mm512_setzero_si512();
            UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm512_setzero_ps();
        }
        int i = begin;
        for (; i + 16 <= end; i += 16) {
            UNROLL_TILE for (int r = 0; r < R; r++) xv[r] = _mm512_loadu_ps(x + (size_t)r * (size_t)cols + (size_t)i);
            UNROLL_TILE for (int c = 0; c < C; c++) {
                const uint8_t* p = w + (size_t)c * (size_t)cols + (size_t)i;
                if ((i & 63) == 0) prefetch_ahead(p, (size_t)C * (size_t)cols); // the next tile, once per line
                __m512 wv = widen_i8(_mm_loadu_si128((const __m128i*)p), zero[c], asymmetric);
                UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm512_fmadd_ps(wv, xv[r], acc[c][r]);
            }
        }
        if (i < end) { // the tail: lanes past it are not read, x loads as 0
            __mmask16 live = first_lanes(end - i);
            UNROLL_TILE for (int r = 0; r < R; r++) {
                xv[r] = _mm512_maskz_loadu_ps(live, x + (size_t)r * (size_t)cols + (size_t)i);
            }
            UNROLL_TILE for (int c = 0; c < C; c++) {
                __m128i bytes = _mm_maskz_loadu_epi8(live, w + (size_t)c * (size_t)cols + (size_t)i);
                __m512 wv = widen_i8(bytes, zero[c], asymmetric);
                UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm512_fmadd_ps(wv, xv[r], acc[c][r]);
            }
        }
        add_group_to_totals(total, acc, scales, n_groups, g, C, R);
    }
    store_totals(out, d_out, total, C, R);
}

static AVX512_TARGET __attribute__((noinline)) void i8_tile_any(float* out, int d_out, const uint8_t* w,
                                                                const uint16_t* scales, const uint8_t* zeros,
                                                                const float* x, int cols, int group_size, int C, int R){
#define I8_TILE(c, r)                                                                                                  \
    (zeros ? i8_tile(out, d_out, w, scales, zeros, x, cols, group_size, c, r, 1)                                       \
           : i8_tile(out, d_out, w, scales, zeros, x, cols, group_size, c, r, 0))
    SWITCH_TILE_SHAPES(C, R, I8_TILE)
#undef I8_TILE
}

AVX512_TARGET
    void matmul_i8_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end) {
    const uint8_t* values = (const uint8_t*)w->values;
    const int d_out = w->rows, cols = w->cols;
    const size_t n_groups = (size_t)(cols / w->group_size);
    // Two accumulators per element, at most 16: 8 outputs x 1 row (8 FMA
    // chains: 4 left the 1-row matvec bound by FMA latency), 4 x 2, or 2 x 4.
    const int max_outputs = n_rows == 1 ? TILE_OUTPUTS_MAX : n_rows >= 3 ? 2 : TILE_MAX;
    const int max_rows = n_rows >= 3 ? TILE_MAX : 2;
    for (int o = o_begin; o < o_end; o += max_outputs) {
        int C = o_end - o < max_outputs ? o_end - o : max_outputs;
        const size_t first_group = (size_t)o * n_groups;
        for (int r = 0; r < n_rows; r += max_rows) {
            int R = n_rows - r < max_rows ? n_rows - r : max_rows;
            i8_tile_any(out + (size_t)r * (size_t)d_out + (size_t)o, d_out, values + (size_t)o * (size_t)cols,
                        w->scales_f16 + first_group, w->zero_points ? w->zero_points + first_group : NULL,
                        in + (size_t)r * (size_t)cols, cols, w->group_size, C, R);
        }
    }
}

// ---- INT4 codes, fp32 activations (W4A16) -------------------------------------
//
// A step is 32 columns from an even column s = 16 packed bytes. Widened to
// dwords, byte l's low 4 bits are column s + 2l and its next 4 bits column
// s + 2l + 1; vpermps looks a 16-entry table up with the low 4 bits of each
// dword, so one lookup turns the low nibbles into floats (the table holds
// k - zero, so it also subtracts the zero-point) and a shift by 4 and a
// second lookup do the high nibbles: 6 vector instructions per 32 columns
// per output with the two FMAs. (That count is what bounds the kernel: a
// shuffle-free decode by broadcast + variable shifts took 9 and was slower.)
// The activations are split into even and odd columns once per step for
// the whole tile.
//
// The order: per group, lane l of one accumulator takes, step by step,
// column s + 2l then s + 2l + 1, both by fma.

// x[0 .. 31] (lanes switched off in lo / hi read as 0) split into even[l]
// = x[2l] and odd[l] = x[2l + 1], first rounded to bf16 (W4A16's
// activations) when round_x (else x already is).
AVX512_INLINE void split_x(__m512 lo, __m512 hi, __m512* even, __m512* odd, int round_x) {
    const __m512i even_index = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd_index = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    if (round_x) {
        lo = round_to_bf16_16(lo);
        hi = round_to_bf16_16(hi);
    }
    *even = _mm512_permutex2var_ps(lo, even_index, hi);
    *odd = _mm512_permutex2var_ps(lo, odd_index, hi);
}

// 16 packed bytes as the integers n - zero of their even and odd columns.
AVX512_INLINE void widen_i4(__m128i packed, __m512 table, __m512* even, __m512* odd) {
    __m512i bytes = _mm512_cvtepu8_epi32(packed);
    *even = _mm512_permutexvar_ps(bytes, table);
    *odd = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
}

// The start of group g of an INT4 tile: table[c][k] = k - zero (what
// nibble k stands for: zero 8 when symmetric, q + 8 stored; else the
// group's zero-point from zeros (C, n_groups)) and the accumulators at +0.
AVX512_INLINE void start_i4_group(__m512* table, __m512 acc[][TILE_MAX], const uint8_t* zeros, int n_groups, int g,
                                  int C, int R, int asymmetric) {
    const __m512 nibbles = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    UNROLL_TILE for (int c = 0; c < C; c++) {
        float zero = asymmetric ? (float)zeros[(size_t)c * (size_t)n_groups + (size_t)g] : 8.0f;
        table[c] = _mm512_sub_ps(nibbles, _mm512_set1_ps(zero));
        UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm512_setzero_ps();
    }
}

// out, x as for i8_tile; w: (C rows of row_bytes) packed nibbles, the
// tile's rows contiguous; zeros (C, n_groups) when asymmetric (else the
// zero-point is 8); round_x as for split_x.
AVX512_INLINE void i4_tile(float* out, int d_out, const uint8_t* w, size_t row_bytes, const uint16_t* scales,
                           const uint8_t* zeros, const float* x, int cols, int group_size, int C, int R, int asymmetric,
                           int round_x) {
    const int n_groups = cols / group_size;
    __m512 total[TILE_OUTPUTS_MAX][TILE_MAX], acc[TILE_OUTPUTS_MAX][TILE_MAX], x_even[TILE_MAX], x_odd[TILE_MAX];
    __m512 table[TILE_OUTPUTS_MAX]; // table[c][k] = k - zero: what nibble k stands for in this group
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = _mm512_setzero_ps();
    }
    for (int g = 0; g < n_groups; g++) {
        const int begin = g * group_size, end = begin + group_size;
        start_i4_group(table, acc, zeros, n_groups, g, C, R, asymmetric);
        int i = begin;
        // Full steps from an even column read the packed bytes directly.
        for (; (begin & 1) == 0 && i + 32 <= end; i += 32) {
            UNROLL_TILE for (int r = 0; r < R; r++) {
                const float* p = x + (size_t)r * (size_t)cols + (size_t)i;
                split_x(_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16), &x_even[r], &x_odd[r], round_x);
            }
            UNROLL_TILE for (int c = 0; c < C; c++) {
                const uint8_t* p = w + (size_t)c * row_bytes + (size_t)(i / 2);
                if ((i & 127) == 0) prefetch_ahead(p, (size_t)C * row_bytes); // once per 64-byte line
                __m512 w_even, w_odd;
                widen_i4(_mm_loadu_si128((const __m128i*)p), table[c], &w_even, &w_odd);
                UNROLL_TILE for (int r = 0; r < R; r++) {
                    acc[c][r] = _mm512_fmadd_ps(w_even, x_even[r], acc[c][r]);
                    acc[c][r] = _mm512_fmadd_ps(w_odd, x_odd[r], acc[c][r]);
                }
            }
        }
        // The tail (x loaded masked, as 0, so codes past it add 0), and every
        // step of a group that starts at an odd column (repacked).
        for (; i < end; i += 32) {
            const int n = end - i < 32 ? end - i : 32;
            const __mmask16 live_lo = n >= 16 ? (__mmask16)0xffff : first_lanes(n);
            const __mmask16 live_hi = n >= 32 ? (__mmask16)0xffff : n > 16 ? first_lanes(n - 16) : 0;
            UNROLL_TILE for (int r = 0; r < R; r++) {
                const float* p = x + (size_t)r * (size_t)cols + (size_t)i;
                split_x(_mm512_maskz_loadu_ps(live_lo, p), _mm512_maskz_loadu_ps(live_hi, p + 16), &x_even[r],
                        &x_odd[r], round_x);
            }
            UNROLL_TILE for (int c = 0; c < C; c++) {
                const uint8_t* row = w + (size_t)c * row_bytes;
                __m128i packed;
                if ((begin & 1) == 0) {
                    packed = _mm_maskz_loadu_epi8(first_lanes((n + 1) / 2), row + i / 2);
                } else {
                    uint8_t repacked[16];
                    repack_i4(repacked, 16, row, i, n);
                    packed = _mm_loadu_si128((const __m128i*)repacked);
                }
                __m512 w_even, w_odd;
                widen_i4(packed, table[c], &w_even, &w_odd);
                UNROLL_TILE for (int r = 0; r < R; r++) {
                    acc[c][r] = _mm512_fmadd_ps(w_even, x_even[r], acc[c][r]);
                    acc[c][r] = _mm512_fmadd_ps(w_odd, x_odd[r], acc[c][r]);
                }
            }
        }
        add_group_to_totals(total, acc, scales, n_groups, g, C, R);
    }
    store_totals(out, d_out, total, C, R);
}

static AVX512_TARGET __attribute__((noinline)) void i4_tile_any(float* out, int d_out, const uint8_t* w,
                                                                size_t row_bytes, const uint16_t* scales,
                                                                const uint8_t* zeros, const float* x, int cols,
                                                                int group_size, int C, int R, int round_x) {
#define I4_TILE_ROUNDED(c, r, rounding)                                                                                \
    (zeros ? i4_tile(out, d_out, w, row_bytes, scales, zeros, x, cols, group_size, c, r, 1, rounding)                  \
           : i4_tile(out, d_out, w, row_bytes, scales, zeros, x, cols, group_size, c, r, 0, rounding))
#define I4_TILE(c, r) (round_x ? I4_TILE_ROUNDED(c, r, 1) : I4_TILE_ROUNDED(c, r, 0))
    SWITCH_TILE_SHAPES(C, R, I4_TILE)
#undef I4_TILE
#undef I4_TILE_ROUNDED
}

// ---- INT4, groups of a multiple of 128 columns (or 32, 64): 8 phases per 64 bytes ----
//
// The kernel above spends 3 shuffles per 32 columns (a byte-to-dword
// widening and two table lookups), and shuffles are what bound it. Here a
// step is 128 columns = 64 packed bytes loaded as 16 dwords: dword l holds
// the 8 nibbles of columns s + 8l .. s + 8l + 7, so shifting it right by
// 4k and looking the low 4 bits up in the table gives column s + 8l + k in
// lane l. 8 lookups and 7 shifts per 128 columns, no widening: a third
// fewer shuffles. The activations are rounded to bf16 and put in the same
// order once per row and call (x_phase: lane l of phase k = x[s + 8l + k]),
// not per output.
//
// The order is the one of the AVX512_BF16 kernel further down, so that
// both give the same bits: per group, lane l of one accumulator takes, step
// by step, the columns s + 8l + k for k = 4, 0, 5, 1, 6, 2, 7, 3, each by
// fma (phase_of_turn); then as above total = fma(acc, scale, total) per
// group, and hsum16. Used whenever the group size is a multiple of 128, or
// 32 or 64 (matmul_i4_uses_phase_order; folded per lane, below),
// for every batch row alike.

#define PHASE_STEP 128 // columns per step: 64 bytes of codes
#define PHASE_ROWS_MAX 4
#define PHASE_SCRATCH_FLOATS 8192 // rows x cols of reordered activations on the stack (32 KiB)

// One step's codes of a tile's C rows (64 bytes each, from step_codes in
// the first row), and the same bytes of the next tile (tile_bytes further)
// asked for.
AVX512_INLINE void load_step_codes(__m512i* codes, const uint8_t* step_codes, size_t row_bytes, size_t tile_bytes,
                                   int C) {
    UNROLL_TILE for (int c = 0; c < C; c++) {
        const uint8_t* p = step_codes + (size_t)c * row_bytes;
        prefetch_ahead(p, tile_bytes);
        codes[c] = _mm512_loadu_si512((const void*)p);
    }
}

// The phase (column s + 8l + k of lane l) the fp32 kernel takes at its
// n-th turn of a step: 4, 0, 5, 1, 6, 2, 7, 3 (see vdpbf16ps below).
static inline int phase_of_turn(int n) { return (n >> 1) + (n & 1 ? 0 : 4); }

// ---- groups of 32 or 64 columns (symmetric): per-lane scales ----
//
// Lane l of a step takes the 8 columns s + 8l .. s + 8l + 7, which lie in
// one group when the group size is 32 or 64 (4 or 8 lanes to a group).
// Such a step is folded into the totals lane by lane, each lane times its
// own group's scale: total = fma(acc, scale of lane l's group, total), and
// the accumulators restart from +0. One fold per step and output costs a
// masked load of 4 (or 2) fp16 scales, a conversion, a permute, R fmas and
// R zeroings, where a fold per group (the tiles above) cost the same 4
// (or 2) times over, with a whole 32-column step of unpacking between folds.
// Symmetric, the zero-point is 8 in every group and one table serves the
// whole row. Asymmetric, each lane has its group's zero-point z, so the
// lookup takes 32 entries, entry n = n - 16, at index nibble + 16 - z (in
// 1 .. 31): an and and an add per lookup, and the offsets once per step.

// lane_group[l] = 8l / group_size: which of the step's groups lane l is in.
AVX512_INLINE __m512i lane_groups(int group_size) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_srli_epi32(lane, group_size == 32 ? 2 : 3);
}

// The end of a step of small groups: step_scales (C rows of n_groups fp16,
// at the step's first group), 128 / group_size of them per row in `live`.
AVX512_INLINE void add_step_to_totals(__m512 total[][TILE_MAX], __m512 acc[][TILE_MAX], const uint16_t* step_scales,
                                      int n_groups, __m512i lane_group, __mmask8 live, int C, int R) {
    UNROLL_TILE for (int c = 0; c < C; c++) {
        __m128i halves = _mm_maskz_loadu_epi16(live, step_scales + (size_t)c * (size_t)n_groups);
        __m512 scale = _mm512_permutexvar_ps(lane_group, _mm512_castps128_ps512(_mm_cvtph_ps(halves)));
        UNROLL_TILE for (int r = 0; r < R; r++) {
            total[c][r] = _mm512_fmadd_ps(acc[c][r], scale, total[c][r]);
            acc[c][r] = _mm512_setzero_ps();
        }
    }
}

// 16 - zero of each lane's group, a step of asymmetric small groups:
// step_zeros (the row's zero-points from the step's first group), `live`
// of them; lane l's group from lane_group.
AVX512_INLINE __m512i lane_zero_offsets(const uint8_t* step_zeros, __m512i lane_group, __mmask8 live) {
    __m512i zero = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8((__mmask16)live, step_zeros));
    return _mm512_sub_epi32(_mm512_set1_epi32(16), _mm512_permutexvar_epi32(lane_group, zero));
}

// phased: (cols) the row x rounded to bf16 and reordered per step:
// phased[s + 16k + l] = x[s + 8l + k].
AVX512_INLINE void phase_order(float* phased, const float* x, int cols) {
    const __m512i gather = _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120);
    for (int s = 0; s < cols; s += PHASE_STEP)
        for (int k = 0; k < 8; k++)
            _mm512_storeu_ps(phased + s + 16 * k, round_to_bf16_16(_mm512_i32gather_ps(
                                                      _mm512_add_epi32(gather, _mm512_set1_epi32(k)), x + s, 4)));
}

// out, scales, zeros as for i4_tile; x_phase: (R rows of cols) in phase
// order. Written as i4_bf16_tile below (one loop over the steps, a
// countdown to each group's end).
AVX512_INLINE void i4_phase_tile(float* out, int d_out, const uint8_t* w, size_t row_bytes, const uint16_t* scales,
                                 const uint8_t* zeros, const float* x_phase, int cols, int group_size, int C, int R,
                                 int asymmetric, int small_groups) {
    const int n_groups = cols / group_size, steps_per_group = group_size / PHASE_STEP;
    const __m512i lane_group = lane_groups(group_size);
    // Small groups only; the step's first scale is i / PHASE_STEP * groups_per_step, a shift and no division:
    const int groups_per_step = group_size < PHASE_STEP ? PHASE_STEP / group_size : 1;
    const __mmask8 live_scales = (__mmask8)((1u << groups_per_step) - 1u);
    const int lane_zeros = asymmetric && small_groups; // a zero-point per lane: the 32-entry lookup
    const __m512 table_low = _mm512_setr_ps(-16, -15, -14, -13, -12, -11, -10, -9, -8, -7, -6, -5, -4, -3, -2, -1);
    const __m512 table_high = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i low_nibble = _mm512_set1_epi32(0x0f);
    __m512i offset[TILE_OUTPUTS_MAX];                // lane_zeros: 16 - zero per lane, this step
    const size_t tile_bytes = (size_t)C * row_bytes; // the prefetch runs one tile ahead
    __m512 total[TILE_OUTPUTS_MAX][TILE_MAX], acc[TILE_OUTPUTS_MAX][TILE_MAX];
    __m512 table[TILE_OUTPUTS_MAX]; // table[c][k] = k - zero
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = _mm512_setzero_ps();
    }
    int g = 0, steps_left = steps_per_group;
    start_i4_group(table, acc, zeros, n_groups, g, C, R, asymmetric);
    for (int i = 0; i < cols; i += PHASE_STEP) {
        const float* step_x = x_phase + (size_t)i;
        __m512i codes[TILE_OUTPUTS_MAX];
        load_step_codes(codes, w + (size_t)(i / 2), row_bytes, tile_bytes, C);
        if (lane_zeros) {
            UNROLL_TILE for (int c = 0; c < C; c++) offset[c] =
                lane_zero_offsets(zeros + (size_t)c * (size_t)n_groups + (size_t)(i / PHASE_STEP * groups_per_step),
                                  lane_group, live_scales);
        }
        UNROLL_TILE for (int n = 0; n < 8; n++) {
            const int k = phase_of_turn(n);
            __m512 xv[TILE_MAX];
            UNROLL_TILE for (int r = 0; r < R; r++) xv[r] =
                _mm512_loadu_ps(step_x + (size_t)r * (size_t)cols + (size_t)(16 * k));
            UNROLL_TILE for (int c = 0; c < C; c++) {
                const __m512i shifted = k ? _mm512_srli_epi32(codes[c], 4 * k) : codes[c];
                const __m512 wv =
                    lane_zeros
                        ? _mm512_permutex2var_ps(
                              table_low, _mm512_add_epi32(_mm512_and_si512(shifted, low_nibble), offset[c]), table_high)
                        : _mm512_permutexvar_ps(shifted, table[c]);
                UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm512_fmadd_ps(wv, xv[r], acc[c][r]);
            }
        }
        if (small_groups) {
            add_step_to_totals(total, acc, scales + i / PHASE_STEP * groups_per_step, n_groups, lane_group, live_scales,
                               C, R);
        } else if (--steps_left == 0) {
            add_group_to_totals(total, acc, scales, n_groups, g, C, R);
            if (++g < n_groups) start_i4_group(table, acc, zeros, n_groups, g, C, R, asymmetric);
            steps_left = steps_per_group;
        }
    }
    store_totals(out, d_out, total, C, R);
}

static AVX512_TARGET __attribute__((noinline)) void i4_phase_tile_any(float* out, int d_out, const uint8_t* w,
                                                                      size_t row_bytes, const uint16_t* scales,
                                                                      const uint8_t* zeros, const float* x_phase,
                                                                      int cols, int group_size, int C, int R) {
#define I4_PHASE_TILE(c, r)                                                                                            \
    (zeros && group_size < PHASE_STEP                                                                                  \
         ? i4_phase_tile(out, d_out, w, row_bytes, scales, zeros, x_phase, cols, group_size, c, r, 1, 1)               \
     : zeros ? i4_phase_tile(out, d_out, w, row_bytes, scales, zeros, x_phase, cols, group_size, c, r, 1, 0)           \
     : group_size < PHASE_STEP                                                                                         \
         ? i4_phase_tile(out, d_out, w, row_bytes, scales, zeros, x_phase, cols, group_size, c, r, 0, 1)               \
         : i4_phase_tile(out, d_out, w, row_bytes, scales, zeros, x_phase, cols, group_size, c, r, 0, 0))
    SWITCH_TILE_SHAPES(C, R, I4_PHASE_TILE)
#undef I4_PHASE_TILE
}

// ---- the same with AVX512_BF16: 4 phases of 32 columns per 64 bytes -----------
//
// vdpbf16ps adds to fp32 lane j the products of the bf16 pairs in 16-bit
// lanes 2j + 1 and then 2j, each sum rounded to fp32 (nearest even) as
// Intel's pseudo-code says; measured bit for bit on this machine's Zen 5
// against two fmas, 32 million lanes. Seen as 32 words, a step's 64 bytes
// hold in word 2j the nibbles of columns s + 8j .. s + 8j + 3 and in word
// 2j + 1 those of s + 8j + 4 .. s + 8j + 7; shifted right by 4k, a word's
// low 4 bits are column s + 8j + k, resp. s + 8j + 4 + k, and vpermw looks
// the bf16 value of k - zero up with the low 5 bits (the table repeats
// after 16, so the next nibble's bit does not matter). So phase k adds
// column s + 8j + 4 + k, then s + 8j + k, to lane j: over k = 0..3 the
// order 4, 0, 5, 1, 6, 2, 7, 3 of the fp32 kernel. Every product (|c| <=
// 15 times a bf16) is exact, so each addition rounds the same sum in both
// kernels: the same bits, for half the instructions (12 per 128 columns
// instead of 24). Sums below 2^-126 are the exception: vdpbf16ps flushes
// them to zero, fma does not.
//
// Why this is as fast as W4A16 gets: a step is 11 vector operations per
// output row (3 shifts, 4 vpermw, 4 vdpbf16ps) beside a load and a
// prefetch, and vpermw and vdpbf16ps share ports on Zen 5 (together about
// 2.6 per cycle, where each alone issues 2), so a step costs about 4
// cycles: one thread computes about 40 GB/s of packed weights held in L2,
// which two cores' worth is what memory streams at. Timing a vpternlogd in
// place of vpermw (wrong results) gained only 5-8%, and prefetching 2
// tiles ahead instead of 1 nothing: what would help is fewer operations per
// weight, which is what int8 activations (matmul_a8_avx512.c) give.

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define BF16_INLINE                                                                                                    \
    static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))

// words: (cols) the row x as bf16 in the kernel's order, per step of 128
// columns: words[s + 32k + 2j] = x[s + 8j + k], words[s + 32k + 2j + 1] =
// x[s + 8j + 4 + k] (k < 4, j < 16). Rounded as everywhere (round_to_bf16_16,
// the converters' bits), so this needs no BF16 instruction.
AVX512_INLINE void bf16_phase_order(uint16_t* words, const float* x, int cols) {
    const __m512i gather = _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120);
    for (int s = 0; s < cols; s += PHASE_STEP) {
        for (int k = 0; k < 4; k++) {
            __m512 low = _mm512_i32gather_ps(_mm512_add_epi32(gather, _mm512_set1_epi32(k)), x + s, 4);
            __m512 high = _mm512_i32gather_ps(_mm512_add_epi32(gather, _mm512_set1_epi32(k + 4)), x + s, 4);
            // Dword j = word 2j (low half) | word 2j + 1 (high half): the
            // rounded floats' upper halves, side by side.
            __m512i pair = _mm512_or_si512(_mm512_castps_si512(round_to_bf16_16(high)),
                                           _mm512_srli_epi32(_mm512_castps_si512(round_to_bf16_16(low)), 16));
            _mm512_storeu_si512((void*)(words + s + 32 * k), pair);
        }
    }
}

// The start of group g of a bf16 tile: table[c] = the 32 words bf16(n mod
// 16 - zero) for n < 32 (start_i4_group's values: small integers, exact in
// bf16), and the accumulators at +0.
BF16_INLINE void start_bf16_group(__m512i* table, __m512 acc[][TILE_MAX], const uint8_t* zeros, int n_groups, int g,
                                  int C, int R, int asymmetric) {
    __m512 values[TILE_OUTPUTS_MAX];
    start_i4_group(values, acc, zeros, n_groups, g, C, R, asymmetric);
    UNROLL_TILE for (int c = 0; c < C; c++) table[c] = (__m512i)_mm512_cvtne2ps_pbh(values[c], values[c]);
}

// out, scales, zeros as for i4_tile; x_words: (R rows of cols) from
// bf16_phase_order. One loop over the steps of the whole row and a
// countdown to each group's end, rather than a loop over groups around a
// loop over their steps: with groups of 128 columns (one step each) the
// nested loops' address arithmetic outgrew the 16 general registers
// (spilled to xmm), and this form measured 1.10x faster on 85
// stories110m-shaped matrices (1 row, 2 threads, in one process).
BF16_INLINE void i4_bf16_tile(float* out, int d_out, const uint8_t* w, size_t row_bytes, const uint16_t* scales,
                              const uint8_t* zeros, const uint16_t* x_words, int cols, int group_size, int C, int R,
                              int asymmetric, int small_groups) {
    const int n_groups = cols / group_size, steps_per_group = group_size / PHASE_STEP;
    const __m512i lane_group = lane_groups(group_size);
    // Small groups only; the step's first scale is i / PHASE_STEP * groups_per_step, a shift and no division:
    const int groups_per_step = group_size < PHASE_STEP ? PHASE_STEP / group_size : 1;
    const __mmask8 live_scales = (__mmask8)((1u << groups_per_step) - 1u);
    const int lane_zeros = asymmetric && small_groups; // a zero-point per lane: the 32-entry lookup
    // Word n = bf16(n - 16), n < 32 (cvtne2ps_pbh puts its second operand in the low words).
    const __m512i table_32 = (__m512i)_mm512_cvtne2ps_pbh(
        _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_setr_ps(-16, -15, -14, -13, -12, -11, -10, -9, -8, -7, -6, -5, -4, -3, -2, -1));
    const __m512i low_nibble = _mm512_set1_epi16(0x0f);
    __m512i offset[TILE_OUTPUTS_MAX];                // lane_zeros: 16 - zero in both words of each lane, this step
    const size_t tile_bytes = (size_t)C * row_bytes; // the prefetch runs one tile ahead
    __m512 total[TILE_OUTPUTS_MAX][TILE_MAX], acc[TILE_OUTPUTS_MAX][TILE_MAX];
    __m512i table[TILE_OUTPUTS_MAX];
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = _mm512_setzero_ps();
    }
    int g = 0, steps_left = steps_per_group;
    start_bf16_group(table, acc, zeros, n_groups, g, C, R, asymmetric);
    for (int i = 0; i < cols; i += PHASE_STEP) {
        const uint16_t* step_x = x_words + (size_t)i;
        __m512i codes[TILE_OUTPUTS_MAX];
        load_step_codes(codes, w + (size_t)(i / 2), row_bytes, tile_bytes, C);
        if (lane_zeros) {
            UNROLL_TILE for (int c = 0; c < C; c++) {
                __m512i lane_offset =
                    lane_zero_offsets(zeros + (size_t)c * (size_t)n_groups + (size_t)(i / PHASE_STEP * groups_per_step),
                                      lane_group, live_scales);
                offset[c] = _mm512_or_si512(lane_offset, _mm512_slli_epi32(lane_offset, 16)); // both words of a lane
            }
        }
        UNROLL_TILE for (int k = 0; k < 4; k++) {
            __m512i xv[TILE_MAX];
            UNROLL_TILE for (int r = 0; r < R; r++) xv[r] =
                _mm512_loadu_si512((const void*)(step_x + (size_t)r * (size_t)cols + (size_t)(32 * k)));
            UNROLL_TILE for (int c = 0; c < C; c++) {
                const __m512i shifted = k ? _mm512_srli_epi16(codes[c], 4 * k) : codes[c];
                const __m512i wv =
                    lane_zeros ? _mm512_permutexvar_epi16(
                                     _mm512_add_epi16(_mm512_and_si512(shifted, low_nibble), offset[c]), table_32)
                               : _mm512_permutexvar_epi16(shifted, table[c]);
                UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] =
                    _mm512_dpbf16_ps(acc[c][r], (__m512bh)wv, (__m512bh)xv[r]);
            }
        }
        if (small_groups) {
            add_step_to_totals(total, acc, scales + i / PHASE_STEP * groups_per_step, n_groups, lane_group, live_scales,
                               C, R);
        } else if (--steps_left == 0) {
            add_group_to_totals(total, acc, scales, n_groups, g, C, R);
            if (++g < n_groups) start_bf16_group(table, acc, zeros, n_groups, g, C, R, asymmetric);
            steps_left = steps_per_group;
        }
    }
    store_totals(out, d_out, total, C, R);
}

static BF16_TARGET __attribute__((noinline)) void i4_bf16_tile_any(float* out, int d_out, const uint8_t* w,
                                                                   size_t row_bytes, const uint16_t* scales,
                                                                   const uint8_t* zeros, const uint16_t* x_words,
                                                                   int cols, int group_size, int C, int R) {
#define I4_BF16_TILE(c, r)                                                                                             \
    (zeros && group_size < PHASE_STEP                                                                                  \
         ? i4_bf16_tile(out, d_out, w, row_bytes, scales, zeros, x_words, cols, group_size, c, r, 1, 1)                \
     : zeros ? i4_bf16_tile(out, d_out, w, row_bytes, scales, zeros, x_words, cols, group_size, c, r, 1, 0)            \
     : group_size < PHASE_STEP                                                                                         \
         ? i4_bf16_tile(out, d_out, w, row_bytes, scales, zeros, x_words, cols, group_size, c, r, 0, 1)                \
         : i4_bf16_tile(out, d_out, w, row_bytes, scales, zeros, x_words, cols, group_size, c, r, 0, 0))
    SWITCH_TILE_SHAPES(C, R, I4_BF16_TILE)
#undef I4_BF16_TILE
}

// ---- both phase kernels over a chunk --------------------------------------------

// Every output of [o_begin, o_end) for one tile of R_tile <= PHASE_ROWS_MAX
// rows (out: the tile's first row), by the fp32 kernel on x_phase or, when
// x_words is not NULL, the bf16 one; both (R_tile, cols).
static AVX512_TARGET void i4_phase_outputs(float* out, const float* x_phase, const uint16_t* x_words, int R_tile,
                                           const weight_matrix* w, int o_begin, int o_end) {
    const uint8_t* values = (const uint8_t*)w->values;
    const size_t n_groups = (size_t)(w->cols / w->group_size), row_bytes = int_row_bytes(w);
    // Same register budget as i4_tile: 8 x 1, 4 x 2, 2 x 3 or 2 x 4.
    const int max_outputs = R_tile == 1 ? TILE_OUTPUTS_MAX : R_tile >= 3 ? 2 : TILE_MAX;
    for (int o = o_begin; o < o_end; o += max_outputs) {
        const int C = o_end - o < max_outputs ? o_end - o : max_outputs;
        const size_t first_group = (size_t)o * n_groups;
        const uint8_t* tile_values = values + (size_t)o * row_bytes;
        const uint16_t* tile_scales = w->scales_f16 + first_group;
        const uint8_t* tile_zeros = w->zero_points ? w->zero_points + first_group : NULL;
        if (x_words)
            i4_bf16_tile_any(out + o, w->rows, tile_values, row_bytes, tile_scales, tile_zeros, x_words, w->cols,
                             w->group_size, C, R_tile);
        else
            i4_phase_tile_any(out + o, w->rows, tile_values, row_bytes, tile_scales, tile_zeros, x_phase, w->cols,
                              w->group_size, C, R_tile);
    }
}

// Row tiles outside, outputs inside: the chunk's weights, a few KiB per
// output, stay in L2 for the next row tile. One of x_phase, x_words.
static AVX512_TARGET void i4_phase_rows(float* out, const float* x_phase, const uint16_t* x_words, int n_rows,
                                        const weight_matrix* w, int o_begin, int o_end) {
    for (int r = 0; r < n_rows; r += PHASE_ROWS_MAX) {
        const int R_tile = n_rows - r < PHASE_ROWS_MAX ? n_rows - r : PHASE_ROWS_MAX;
        const size_t skip = (size_t)r * (size_t)w->cols;
        i4_phase_outputs(out + (size_t)r * (size_t)w->rows, x_words ? NULL : x_phase + skip,
                         x_words ? x_words + skip : NULL, R_tile, w, o_begin, o_end);
    }
}

AVX512_TARGET void matmul_i4_phase_order_avx512(float* phased, const float* in, int n_rows, int cols) {
    for (int r = 0; r < n_rows; r++)
        phase_order(phased + (size_t)r * (size_t)cols, in + (size_t)r * (size_t)cols, cols);
}

AVX512_TARGET void matmul_i4_phased_avx512(float* out, const float* x_phase, int n_rows, const weight_matrix* w,
                                           int o_begin, int o_end) {
    i4_phase_rows(out, x_phase, NULL, n_rows, w, o_begin, o_end);
}

AVX512_TARGET void matmul_i4_bf16_order_avx512(uint16_t* words, const float* in, int n_rows, int cols) {
    for (int r = 0; r < n_rows; r++)
        bf16_phase_order(words + (size_t)r * (size_t)cols, in + (size_t)r * (size_t)cols, cols);
}

AVX512_TARGET void matmul_i4_bf16_avx512(float* out, const uint16_t* x_words, int n_rows, const weight_matrix* w,
                                         int o_begin, int o_end) {
    i4_phase_rows(out, NULL, x_words, n_rows, w, o_begin, o_end);
}

// The phase kernel without a prepared input (matmul_at_level could not
// allocate one): each tile of rows is reordered into a stack scratch, per
// call. Returns false when even one row does not fit the scratch.
static AVX512_TARGET bool matmul_i4_phase_unprepared(float* out, const float* in, int n_rows, const weight_matrix* w,
                                                     int o_begin, int o_end) {
    const int cols = w->cols;
    int rows_per_tile = PHASE_SCRATCH_FLOATS / cols < PHASE_ROWS_MAX ? PHASE_SCRATCH_FLOATS / cols : PHASE_ROWS_MAX;
    if (rows_per_tile < 1) return false;
    float x_phase[PHASE_SCRATCH_FLOATS]; // (rows_per_tile, cols)
    for (int r = 0; r < n_rows; r += rows_per_tile) {
        const int R_tile = n_rows - r < rows_per_tile ? n_rows - r : rows_per_tile;
        matmul_i4_phase_order_avx512(x_phase, in + (size_t)r * (size_t)cols, R_tile, cols);
        i4_phase_outputs(out + (size_t)r * (size_t)w->rows, x_phase, NULL, R_tile, w, o_begin, o_end);
    }
    return true;
}

// Every output of [o_begin, o_end) for n_rows rows of x (rounded to bf16
// already, or by the tiles when round_x).
static AVX512_TARGET void i4_outputs(float* out, const float* x, int n_rows, const weight_matrix* w, int o_begin,
                                     int o_end, int round_x) {
    const uint8_t* values = (const uint8_t*)w->values;
    const int d_out = w->rows, cols = w->cols;
    const size_t n_groups = (size_t)(cols / w->group_size), row_bytes = int_row_bytes(w);
    // Two accumulators per element, two split activations per row and a
    // table per output: 4 x 2 or 2 x 4 fit the 32 registers.
    const int max_outputs = n_rows == 1 ? TILE_OUTPUTS_MAX : n_rows >= 3 ? 2 : TILE_MAX;
    const int max_rows = n_rows >= 3 ? TILE_MAX : 2;
    for (int o = o_begin; o < o_end; o += max_outputs) {
        int C = o_end - o < max_outputs ? o_end - o : max_outputs;
        const size_t first_group = (size_t)o * n_groups;
        for (int r = 0; r < n_rows; r += max_rows) {
            int R = n_rows - r < max_rows ? n_rows - r : max_rows;
            i4_tile_any(out + (size_t)r * (size_t)d_out + (size_t)o, d_out, values + (size_t)o * row_bytes, row_bytes,
                        w->scales_f16 + first_group, w->zero_points ? w->zero_points + first_group : NULL,
                        x + (size_t)r * (size_t)cols, cols, w->group_size, C, R, round_x);
        }
    }
}

AVX512_TARGET void matmul_i4_rounded_avx512(float* out, const float* x_bf16, int n_rows, const weight_matrix* w,
                                            int o_begin, int o_end) {
    i4_outputs(out, x_bf16, n_rows, w, o_begin, o_end, 0);
}

AVX512_TARGET void matmul_i4_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin,
                                    int o_end) {
    if (matmul_i4_uses_phase_order(w) && matmul_i4_phase_unprepared(out, in, n_rows, w, o_begin, o_end)) return;
    i4_outputs(out, in, n_rows, w, o_begin, o_end, 1); // rows not rounded yet: the tiles round them as loaded
}

// ---- W8A8 with VNNI ----------------------------------------------------------------
//
// vpdpbusd adds products of unsigned by signed bytes, four per int32 lane.
// The activations are made unsigned by adding 128 (a ^ 0x80 = a + 128 in
// [1, 255]) and the excess taken back out: sum (a + 128) w - sum 128 w =
// sum a w, where sum 128 w is one more vpdpbusd per weight vector. Lanes
// wrap modulo 2^32, which cancels in the difference: isum is exact whenever
// it fits int32 (as at the other levels). A tail's dead lanes load the
// weight as 0, so they add nothing to either sum.

// Lane p of the result = the sum of the 16 lanes of v[p] (exact, wrapping):
// a transpose-and-add in 45 instructions instead of 16 horizontal sums.
VNNI_INLINE __m512i reduce16_epi32(const __m512i v[16]) {
    __m512i pairs[8], quads[4], halves[2];
    // Per 128-bit quarter: [v2k, v2k+1, v2k, v2k+1] partial sums.
    UNROLL_TILE for (int k = 0; k < 8; k++) pairs[k] =
        _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_epi32(v[2 * k], v[2 * k + 1]));
    // Per quarter: [v4k, v4k+1, v4k+2, v4k+3].
    UNROLL_TILE for (int k = 0; k < 4; k++) quads[k] = _mm512_add_epi32(
        _mm512_unpacklo_epi64(pairs[2 * k], pairs[2 * k + 1]), _mm512_unpackhi_epi64(pairs[2 * k], pairs[2 * k + 1]));
    // Quarters added pairwise: [q0+q2 of quads[2k], q1+q3 of quads[2k], the same of quads[2k+1]].
    UNROLL_TILE for (int k = 0; k < 2; k++) halves[k] =
        _mm512_add_epi32(_mm512_shuffle_i32x4(quads[2 * k], quads[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_i32x4(quads[2 * k], quads[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(halves[0], halves[1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(halves[0], halves[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// out: (R rows of stride d_out, C outputs); w: (C, cols) int8; a: (R, cols)
// codes with a_scales (R); scales: (C, n_groups). A full 4 x 4 tile combines
// its 16 group sums in one vector, lane p = 4c + r: the same three roundings
// per element as w8a8_term() (separate multiplies, no FMA), so the same bits.
VNNI_INLINE void w8a8_tile(float* out, int d_out, const int8_t* w, const uint16_t* scales, const int8_t* a,
                           const float* a_scales, int cols, int group_size, int C, int R) {
    const int n_groups = cols / group_size;
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512i acc[TILE_OUTPUTS_MAX][TILE_MAX], excess[TILE_OUTPUTS_MAX], biased[TILE_MAX];
    float total[TILE_OUTPUTS_MAX][TILE_MAX];
    const int full = C == 4 && R == 4;
    const __m512i quarter_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 total_lanes = _mm512_setzero_ps(), a_scale_lanes = _mm512_setzero_ps(); // lane 4c + r
    if (full) a_scale_lanes = _mm512_broadcast_f32x4(_mm_loadu_ps(a_scales));
    UNROLL_TILE for (int c = 0; c < C; c++) { UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = 0.0f; }
    for (int g = 0; g < n_groups; g++) {
        const int begin = g * group_size, end = begin + group_size;
        UNROLL_TILE for (int c = 0; c < C; c++) {
            excess[c] = _mm512_setzero_si512();
            UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm512_setzero_si512();
        }
        for (int i = begin; i < end; i += 64) {
            const int n = end - i < 64 ? end - i : 64;
            const __mmask64 live = n == 64 ? ~(__mmask64)0 : ((__mmask64)1 << n) - 1;
            UNROLL_TILE for (int r = 0; r < R; r++) {
                const int8_t* p = a + (size_t)r * (size_t)cols + (size_t)i;
                __m512i codes = n == 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(live, p);
                biased[r] = _mm512_xor_si512(codes, bias);
            }
            UNROLL_TILE for (int c = 0; c < C; c++) {
                const int8_t* p = w + (size_t)c * (size_t)cols + (size_t)i;
                prefetch_ahead(p, (size_t)C * (size_t)cols); // the next tile
                __m512i wv = n == 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(live, p);
                excess[c] = _mm512_dpbusd_epi32(excess[c], bias, wv);
                UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm512_dpbusd_epi32(acc[c][r], biased[r], wv);
            }
        }
        if (full) {
            __m512i sums[16];
            UNROLL_TILE for (int c = 0; c < 4; c++) {
                UNROLL_TILE for (int r = 0; r < 4; r++) sums[4 * c + r] = _mm512_sub_epi32(acc[c][r], excess[c]);
            }
            __m128 w_scales = _mm_setr_ps(_cvtsh_ss(scales[(size_t)g]), _cvtsh_ss(scales[(size_t)n_groups + (size_t)g]),
                                          _cvtsh_ss(scales[2 * (size_t)n_groups + (size_t)g]),
                                          _cvtsh_ss(scales[3 * (size_t)n_groups + (size_t)g]));
            __m512 term = _mm512_mul_ps(_mm512_cvtepi32_ps(reduce16_epi32(sums)),
                                        _mm512_permutexvar_ps(quarter_of_lane, _mm512_castps128_ps512(w_scales)));
            term = _mm512_mul_ps(term, a_scale_lanes);
            total_lanes = _mm512_add_ps(total_lanes, term);
            continue;
        }
        UNROLL_TILE for (int c = 0; c < C; c++) {
            float w_scale = _cvtsh_ss(scales[(size_t)c * (size_t)n_groups + (size_t)g]);
            UNROLL_TILE for (int r = 0; r < R; r++) {
                int32_t isum = _mm512_reduce_add_epi32(_mm512_sub_epi32(acc[c][r], excess[c]));
                total[c][r] += w8a8_term(isum, w_scale, a_scales[r]);
            }
        }
    }
    if (full) _mm512_storeu_ps(&total[0][0], total_lanes); // [c][r] with TILE_MAX = 4 rows: lane 4c + r
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) out[(size_t)r * (size_t)d_out + (size_t)c] = total[c][r];
    }
}

static VNNI_TARGET __attribute__((noinline)) void w8a8_tile_any(float* out, int d_out, const int8_t* w,
                                                                const uint16_t* scales, const int8_t* a,
                                                                const float* a_scales, int cols, int group_size, int C,
                                                                int R) {
#define W8A8_TILE(c, r) w8a8_tile(out, d_out, w, scales, a, a_scales, cols, group_size, c, r)
    switch (C * 8 + R) {
    case 1 * 8 + 1: W8A8_TILE(1, 1); break;
    case 1 * 8 + 2: W8A8_TILE(1, 2); break;
    case 1 * 8 + 3: W8A8_TILE(1, 3); break;
    case 1 * 8 + 4: W8A8_TILE(1, 4); break;
    case 2 * 8 + 1: W8A8_TILE(2, 1); break;
    case 2 * 8 + 2: W8A8_TILE(2, 2); break;
    case 2 * 8 + 3: W8A8_TILE(2, 3); break;
    case 2 * 8 + 4: W8A8_TILE(2, 4); break;
    case 3 * 8 + 1: W8A8_TILE(3, 1); break;
    case 3 * 8 + 2: W8A8_TILE(3, 2); break;
    case 3 * 8 + 3: W8A8_TILE(3, 3); break;
    case 3 * 8 + 4: W8A8_TILE(3, 4); break;
    case 4 * 8 + 1: W8A8_TILE(4, 1); break;
    case 4 * 8 + 2: W8A8_TILE(4, 2); break;
    case 4 * 8 + 3: W8A8_TILE(4, 3); break;
    case 4 * 8 + 4: W8A8_TILE(4, 4); break;
    case 5 * 8 + 1: W8A8_TILE(5, 1); break;
    case 6 * 8 + 1: W8A8_TILE(6, 1); break;
    case 7 * 8 + 1: W8A8_TILE(7, 1); break;
    case 8 * 8 + 1: W8A8_TILE(8, 1); break;
    default: break; // larger tiles are never asked for
    }
#undef W8A8_TILE
}

VNNI_TARGET void matmul_w8a8_avx512vnni(float* out, const int8_t* codes, const float* code_scales, int n_rows,
                                        const weight_matrix* w, int o_begin, int o_end) {
    const int8_t* values = (const int8_t*)w->values;
    const int d_out = w->rows, cols = w->cols;
    const size_t n_groups = (size_t)(cols / w->group_size);
    // One accumulator per element (16) + 4 excess + 4 activations: 4 x 4,
    // or 8 outputs for a single row.
    const int max_outputs = n_rows == 1 ? TILE_OUTPUTS_MAX : TILE_MAX;
    for (int o = o_begin; o < o_end; o += max_outputs) {
        int C = o_end - o < max_outputs ? o_end - o : max_outputs;
        for (int r = 0; r < n_rows; r += TILE_MAX) {
            int R = n_rows - r < TILE_MAX ? n_rows - r : TILE_MAX;
            w8a8_tile_any(out + (size_t)r * (size_t)d_out + (size_t)o, d_out, values + (size_t)o * (size_t)cols,
                          w->scales_f16 + (size_t)o * n_groups, codes + (size_t)r * (size_t)cols, code_scales + r, cols,
                          w->group_size, C, R);
        }
    }
}

#endif
