// matmul_int_avx2: WEIGHT_I8 / WEIGHT_I4 kernels for AVX2 + FMA + F16C, and
// W8A8 (int8 activations) with AVX2 integer dot products.
//
// Tiles of C weight rows x R batch rows, as in matmul_avx2.c: a weight
// vector decoded once feeds R dot products. The reduction order of one
// output element is fixed by the format alone (top of matmul_int.c):
//   INT8:  per group an 8-lane accumulator, steps of 8 columns, the group's
//          tail zero-padded; total = fma(acc, scale, total); hsum8(total).
//   INT4:  steps of 16 columns = 8 bytes: lane l takes column s + 2l (the
//          low nibble of byte l), then s + 2l + 1 (its high nibble). The
//          activations are split into even and odd columns to match, once
//          per step for the whole tile, instead of re-ordering every
//          weight vector.
//   W8A8:  exact int32 group sums, then w8a8_term() per group in order:
//          the same bits as the scalar level.
#include "kernels/cpu/matmul_simd.h"
#include "kernels/cpu/simd_x86.h"

#if defined(__x86_64__) || defined(__i386__)
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>


// Largest tile: 4 outputs x 2 batch rows (an element holds a group
// accumulator and a total: 16 ymm registers allow 8 elements only in the
// 4 x 1 and 2 x 2 shapes for fp32; W8A8 has one accumulator per element).
#define TILE_OUTPUTS 4
#define TILE_ROWS 2


// Integer horizontal sum (exact, so the order does not matter).
AVX2_INLINE int32_t hsum8_epi32(__m256i v) {
    __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0x4e));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0xb1));
    return _mm_cvtsi128_si32(sum);
}

// ---- INT8 codes, fp32 activations (W8A16) -------------------------------------

// 8 codes at p as the floats c = q - zero (exact): signed codes when
// symmetric, unsigned minus the group's zero-point when asymmetric.
AVX2_INLINE __m256 widen_i8(const uint8_t* p, __m256i zero, int asymmetric) {
    __m128i bytes = _mm_loadl_epi64((const __m128i*)p);
    if (asymmetric) return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(bytes), zero));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

// out: (R rows of stride d_out, C outputs); w: (C, cols) codes; scales and
// zeros: (C, n_groups) from the tile's first row (zeros NULL when
// symmetric); x: (R, cols). C, R and asymmetric are constants at every call.
AVX2_INLINE void i8_tile(float* out, int d_out, const uint8_t* w, const uint16_t* scales, const uint8_t* zeros,
                         const float* x, int cols, int group_size, int C, int R, int asymmetric) {
    const int n_groups = cols / group_size;
    __m256 total[TILE_OUTPUTS][TILE_ROWS], acc[TILE_OUTPUTS][TILE_ROWS], xv[TILE_ROWS];
    __m256i zero[TILE_OUTPUTS];
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = _mm256_setzero_ps();
    }
    for (int g = 0; g < n_groups; g++) {
        const int begin = g * group_size, end = begin + group_size;
        UNROLL_TILE for (int c = 0; c < C; c++) {
            zero[c] = asymmetric ? _mm256_set1_epi32(zeros[(size_t)c * (size_t)n_groups + (size_t)g])
                                 : _mm256_setzero_si256();
            UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm256_setzero_ps();
        }
        int i = begin;
        for (; i + 8 <= end; i += 8) {
            UNROLL_TILE for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(x + (size_t)r * (size_t)cols + (size_t)i);
            UNROLL_TILE for (int c = 0; c < C; c++) {
                const uint8_t* p = w + (size_t)c * (size_t)cols + (size_t)i;
                if ((i & 63) == 0) prefetch_ahead(p, (size_t)C * (size_t)cols); // the next tile, once per line
                __m256 wv = widen_i8(p, zero[c], asymmetric);
                UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm256_fmadd_ps(wv, xv[r], acc[c][r]);
            }
        }
        if (i < end) { // the group's tail, zero-padded (padded codes decode to -zero, times x = 0)
            size_t tail = (size_t)(end - i);
            UNROLL_TILE for (int r = 0; r < R; r++) {
                float padded[8] = {0};
                memcpy(padded, x + (size_t)r * (size_t)cols + (size_t)i, tail * sizeof(float));
                xv[r] = _mm256_loadu_ps(padded);
            }
            UNROLL_TILE for (int c = 0; c < C; c++) {
                uint8_t padded[8] = {0};
                memcpy(padded, w + (size_t)c * (size_t)cols + (size_t)i, tail);
                __m256 wv = widen_i8(padded, zero[c], asymmetric);
                UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm256_fmadd_ps(wv, xv[r], acc[c][r]);
            }
        }
        UNROLL_TILE for (int c = 0; c < C; c++) {
            __m256 scale = _mm256_set1_ps(_cvtsh_ss(scales[(size_t)c * (size_t)n_groups + (size_t)g]));
            UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = _mm256_fmadd_ps(acc[c][r], scale, total[c][r]);
        }
    }
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) out[(size_t)r * (size_t)d_out + (size_t)c] = hsum8(total[c][r]);
    }
}

static AVX2_TARGET __attribute__((noinline)) void i8_tile_any(float* out, int d_out, const uint8_t* w,
                                                              const uint16_t* scales, const uint8_t* zeros,
                                                              const float* x, int cols, int group_size, int C, int R) {
#define I8_TILE(c, r)                                                                                                  \
    (zeros ? i8_tile(out, d_out, w, scales, zeros, x, cols, group_size, c, r, 1)                                       \
           : i8_tile(out, d_out, w, scales, zeros, x, cols, group_size, c, r, 0))
    switch (C * 8 + R) {
    case 1 * 8 + 1: I8_TILE(1, 1); break;
    case 1 * 8 + 2: I8_TILE(1, 2); break;
    case 2 * 8 + 1: I8_TILE(2, 1); break;
    case 2 * 8 + 2: I8_TILE(2, 2); break;
    case 3 * 8 + 1: I8_TILE(3, 1); break;
    case 4 * 8 + 1: I8_TILE(4, 1); break;
    default: break; // larger tiles are never asked for
    }
#undef I8_TILE
}

AVX2_TARGET void matmul_i8_avx2(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin,
                                int o_end) {
    const uint8_t* values = (const uint8_t*)w->values;
    const int d_out = w->rows, cols = w->cols;
    const size_t n_groups = (size_t)(cols / w->group_size);
    // Two accumulators per element: 4 outputs x 1 row, or 2 x 2 for a batch.
    const int max_outputs = n_rows >= 2 ? 2 : 4;
    for (int o = o_begin; o < o_end; o += max_outputs) {
        int C = o_end - o < max_outputs ? o_end - o : max_outputs;
        const size_t first_group = (size_t)o * n_groups;
        for (int r = 0; r < n_rows; r += TILE_ROWS) {
            int R = n_rows - r < TILE_ROWS ? n_rows - r : TILE_ROWS;
            i8_tile_any(out + (size_t)r * (size_t)d_out + (size_t)o, d_out, values + (size_t)o * (size_t)cols,
                        w->scales_f16 + first_group, w->zero_points ? w->zero_points + first_group : NULL,
                        in + (size_t)r * (size_t)cols, cols, w->group_size, C, R);
        }
    }
}

// ---- INT4 codes, bf16 activations (W4A16) -------------------------------------

// 8 packed bytes (16 columns from an even column s) as the floats c = q -
// zero: even[l] = column s + 2l (low nibble of byte l), odd[l] = s + 2l + 1.
AVX2_INLINE void widen_i4(const uint8_t* p, __m256i zero, __m256* even, __m256* odd) {
    __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
    *even = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(bytes, _mm256_set1_epi32(0x0f)), zero));
    *odd = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bytes, 4), zero));
}

// x[0 .. 15] split into even[l] = x[2l] and odd[l] = x[2l + 1], first
// rounded to bf16 (W4A16's activations) when round_x (else x already is).
// shuffle_ps works within 128-bit halves ([x0 x2 x8 x10 | x4 x6 x12 x14]);
// the 64-bit permute (0, 2, 1, 3) then puts the pairs in column order.
AVX2_INLINE void split_x(const float* p, __m256* even, __m256* odd, int round_x) {
    __m256 lo = _mm256_loadu_ps(p), hi = _mm256_loadu_ps(p + 8);
    if (round_x) {
        lo = round_to_bf16_8(lo);
        hi = round_to_bf16_8(hi);
    }
    *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xd8));
    *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xdd)), 0xd8));
}

// out, x as for i8_tile; w: (C rows of row_bytes) packed nibbles; zeros
// NULL when symmetric (zero-point 8); round_x as for split_x.
AVX2_INLINE void i4_tile(float* out, int d_out, const uint8_t* w, size_t row_bytes, const uint16_t* scales,
                         const uint8_t* zeros, const float* x, int cols, int group_size, int C, int R, int round_x) {
    const int n_groups = cols / group_size;
    __m256 total[TILE_OUTPUTS][TILE_ROWS], acc[TILE_OUTPUTS][TILE_ROWS], x_even[TILE_ROWS], x_odd[TILE_ROWS];
    __m256i zero[TILE_OUTPUTS];
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = _mm256_setzero_ps();
    }
    for (int g = 0; g < n_groups; g++) {
        const int begin = g * group_size, end = begin + group_size;
        UNROLL_TILE for (int c = 0; c < C; c++) {
            zero[c] = _mm256_set1_epi32(zeros ? zeros[(size_t)c * (size_t)n_groups + (size_t)g] : 8);
            UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm256_setzero_ps();
        }
        int i = begin;
        // Full steps from an even column read the packed bytes directly.
        for (; (begin & 1) == 0 && i + 16 <= end; i += 16) {
            UNROLL_TILE for (int r = 0; r < R; r++) {
                split_x(x + (size_t)r * (size_t)cols + (size_t)i, &x_even[r], &x_odd[r], round_x);
            }
            UNROLL_TILE for (int c = 0; c < C; c++) {
                const uint8_t* p = w + (size_t)c * row_bytes + (size_t)(i / 2);
                if ((i & 127) == 0) prefetch_ahead(p, (size_t)C * row_bytes); // the next tile, once per line
                __m256 w_even, w_odd;
                widen_i4(p, zero[c], &w_even, &w_odd);
                UNROLL_TILE for (int r = 0; r < R; r++) {
                    acc[c][r] = _mm256_fmadd_ps(w_even, x_even[r], acc[c][r]);
                    acc[c][r] = _mm256_fmadd_ps(w_odd, x_odd[r], acc[c][r]);
                }
            }
        }
        // The tail, and every step of a group that starts at an odd column:
        // repacked and zero-padded (padded x is 0, so padded codes add 0).
        for (; i < end; i += 16) {
            const int n = end - i < 16 ? end - i : 16;
            UNROLL_TILE for (int r = 0; r < R; r++) {
                float padded[16] = {0};
                memcpy(padded, x + (size_t)r * (size_t)cols + (size_t)i, (size_t)n * sizeof(float));
                split_x(padded, &x_even[r], &x_odd[r], round_x);
            }
            UNROLL_TILE for (int c = 0; c < C; c++) {
                uint8_t repacked[8];
                __m256 w_even, w_odd;
                repack_i4(repacked, 8, w + (size_t)c * row_bytes, i, n);
                widen_i4(repacked, zero[c], &w_even, &w_odd);
                UNROLL_TILE for (int r = 0; r < R; r++) {
                    acc[c][r] = _mm256_fmadd_ps(w_even, x_even[r], acc[c][r]);
                    acc[c][r] = _mm256_fmadd_ps(w_odd, x_odd[r], acc[c][r]);
                }
            }
        }
        UNROLL_TILE for (int c = 0; c < C; c++) {
            __m256 scale = _mm256_set1_ps(_cvtsh_ss(scales[(size_t)c * (size_t)n_groups + (size_t)g]));
            UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = _mm256_fmadd_ps(acc[c][r], scale, total[c][r]);
        }
    }
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) out[(size_t)r * (size_t)d_out + (size_t)c] = hsum8(total[c][r]);
    }
}

static AVX2_TARGET __attribute__((noinline)) void i4_tile_any(float* out, int d_out, const uint8_t* w, size_t row_bytes,
                                                              const uint16_t* scales, const uint8_t* zeros,
                                                              const float* x, int cols, int group_size, int C, int R,
                                                              int round_x) {
#define I4_TILE(c, r)                                                                                                  \
    (round_x ? i4_tile(out, d_out, w, row_bytes, scales, zeros, x, cols, group_size, c, r, 1)                          \
             : i4_tile(out, d_out, w, row_bytes, scales, zeros, x, cols, group_size, c, r, 0))
    switch (C * 8 + R) {
    case 1 * 8 + 1: I4_TILE(1, 1); break;
    case 1 * 8 + 2: I4_TILE(1, 2); break;
    case 2 * 8 + 1: I4_TILE(2, 1); break;
    case 2 * 8 + 2: I4_TILE(2, 2); break;
    case 3 * 8 + 1: I4_TILE(3, 1); break;
    case 4 * 8 + 1: I4_TILE(4, 1); break;
    default: break; // larger tiles are never asked for
    }
#undef I4_TILE
}

// Every output of [o_begin, o_end) for n_rows rows of x (rounded to bf16
// already, or by the tiles when round_x).
static AVX2_TARGET void i4_outputs(float* out, const float* x, int n_rows, const weight_matrix* w, int o_begin,
                                   int o_end, int round_x) {
    const uint8_t* values = (const uint8_t*)w->values;
    const int d_out = w->rows, cols = w->cols;
    const size_t n_groups = (size_t)(cols / w->group_size), row_bytes = int_row_bytes(w);
    const int max_outputs = n_rows >= 2 ? 2 : 4;
    for (int o = o_begin; o < o_end; o += max_outputs) {
        int C = o_end - o < max_outputs ? o_end - o : max_outputs;
        const size_t first_group = (size_t)o * n_groups;
        for (int r = 0; r < n_rows; r += TILE_ROWS) {
            int R = n_rows - r < TILE_ROWS ? n_rows - r : TILE_ROWS;
            i4_tile_any(out + (size_t)r * (size_t)d_out + (size_t)o, d_out, values + (size_t)o * row_bytes, row_bytes,
                        w->scales_f16 + first_group, w->zero_points ? w->zero_points + first_group : NULL,
                        x + (size_t)r * (size_t)cols, cols, w->group_size, C, R, round_x);
        }
    }
}

AVX2_TARGET void matmul_i4_rounded_avx2(float* out, const float* x_bf16, int n_rows, const weight_matrix* w,
                                        int o_begin, int o_end) {
    i4_outputs(out, x_bf16, n_rows, w, o_begin, o_end, 0);
}

AVX2_TARGET void matmul_round_to_bf16_avx2(float* dst, const float* src, size_t count) {
    round_floats_to_bf16(dst, src, count);
}

// Rows not rounded yet (matmul_at_level could not allocate them rounded):
// the tiles round them as they load them, the same bits, more slowly.
AVX2_TARGET void matmul_i4_avx2(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin,
                                int o_end) {
    i4_outputs(out, in, n_rows, w, o_begin, o_end, 1);
}

// ---- W8A8: int8 activations x int8 weights ---------------------------------------
//
// vpmaddubsw multiplies unsigned by signed bytes, so the sign moves from the
// activation to the weight: |a| * (w * sign(a)) = a * w. With |a|, |w| <=
// 127 a pair of products is at most 2 * 127^2 = 32258 and never saturates
// the int16 sum; vpmaddwd by 1 widens the pairs to int32.

// out: (R rows of stride d_out, C outputs); w: (C, cols) int8; a: (R, cols)
// activation codes with a_scales (R); scales: (C, n_groups).
AVX2_INLINE void w8a8_tile(float* out, int d_out, const int8_t* w, const uint16_t* scales, const int8_t* a,
                           const float* a_scales, int cols, int group_size, int C, int R) {
    const int n_groups = cols / group_size;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[TILE_OUTPUTS][TILE_ROWS], codes[TILE_ROWS], magnitude[TILE_ROWS];
    float total[TILE_OUTPUTS][TILE_ROWS];
    UNROLL_TILE for (int c = 0; c < C; c++) { UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] = 0.0f; }
    for (int g = 0; g < n_groups; g++) {
        const int begin = g * group_size, end = begin + group_size;
        UNROLL_TILE for (int c = 0; c < C; c++) {
            UNROLL_TILE for (int r = 0; r < R; r++) acc[c][r] = _mm256_setzero_si256();
        }
        for (int i = begin; i < end; i += 32) {
            const int n = end - i < 32 ? end - i : 32;
            UNROLL_TILE for (int r = 0; r < R; r++) {
                const int8_t* p = a + (size_t)r * (size_t)cols + (size_t)i;
                if (n == 32) {
                    codes[r] = _mm256_loadu_si256((const __m256i*)p);
                } else { // zero-padded: a padded 0 makes its product 0
                    int8_t padded[32] = {0};
                    memcpy(padded, p, (size_t)n);
                    codes[r] = _mm256_loadu_si256((const __m256i*)padded);
                }
                magnitude[r] = _mm256_abs_epi8(codes[r]);
            }
            UNROLL_TILE for (int c = 0; c < C; c++) {
                const int8_t* p = w + (size_t)c * (size_t)cols + (size_t)i;
                __m256i wv;
                if (n == 32) {
                    if ((i & 63) == 0) prefetch_ahead(p, (size_t)C * (size_t)cols); // the next tile, once per line
                    wv = _mm256_loadu_si256((const __m256i*)p);
                } else {
                    int8_t padded[32] = {0};
                    memcpy(padded, p, (size_t)n);
                    wv = _mm256_loadu_si256((const __m256i*)padded);
                }
                UNROLL_TILE for (int r = 0; r < R; r++) {
                    __m256i pairs = _mm256_maddubs_epi16(magnitude[r], _mm256_sign_epi8(wv, codes[r]));
                    acc[c][r] = _mm256_add_epi32(acc[c][r], _mm256_madd_epi16(pairs, ones));
                }
            }
        }
        UNROLL_TILE for (int c = 0; c < C; c++) {
            float w_scale = _cvtsh_ss(scales[(size_t)c * (size_t)n_groups + (size_t)g]);
            UNROLL_TILE for (int r = 0; r < R; r++) total[c][r] +=
                w8a8_term(hsum8_epi32(acc[c][r]), w_scale, a_scales[r]);
        }
    }
    UNROLL_TILE for (int c = 0; c < C; c++) {
        UNROLL_TILE for (int r = 0; r < R; r++) out[(size_t)r * (size_t)d_out + (size_t)c] = total[c][r];
    }
}

static AVX2_TARGET __attribute__((noinline)) void w8a8_tile_any(float* out, int d_out, const int8_t* w,
                                                                const uint16_t* scales, const int8_t* a,
                                                                const float* a_scales, int cols, int group_size, int C,
                                                                int R) {
#define W8A8_TILE(c, r) w8a8_tile(out, d_out, w, scales, a, a_scales, cols, group_size, c, r)
    switch (C * 8 + R) {
    case 1 * 8 + 1: W8A8_TILE(1, 1); break;
    case 1 * 8 + 2: W8A8_TILE(1, 2); break;
    case 2 * 8 + 1: W8A8_TILE(2, 1); break;
    case 2 * 8 + 2: W8A8_TILE(2, 2); break;
    case 3 * 8 + 1: W8A8_TILE(3, 1); break;
    case 3 * 8 + 2: W8A8_TILE(3, 2); break;
    case 4 * 8 + 1: W8A8_TILE(4, 1); break;
    case 4 * 8 + 2: W8A8_TILE(4, 2); break;
    default: break; // larger tiles are never asked for
    }
#undef W8A8_TILE
}

AVX2_TARGET void matmul_w8a8_avx2(float* out, const int8_t* codes, const float* code_scales, int n_rows,
                                  const weight_matrix* w, int o_begin, int o_end) {
    const int8_t* values = (const int8_t*)w->values;
    const int d_out = w->rows, cols = w->cols;
    const size_t n_groups = (size_t)(cols / w->group_size);
    // One accumulator per element: 4 outputs x 2 rows (8 of the 16 ymm).
    for (int o = o_begin; o < o_end; o += TILE_OUTPUTS) {
        int C = o_end - o < TILE_OUTPUTS ? o_end - o : TILE_OUTPUTS;
        for (int r = 0; r < n_rows; r += TILE_ROWS) {
            int R = n_rows - r < TILE_ROWS ? n_rows - r : TILE_ROWS;
            w8a8_tile_any(out + (size_t)r * (size_t)d_out + (size_t)o, d_out, values + (size_t)o * (size_t)cols,
                          w->scales_f16 + (size_t)o * n_groups, codes + (size_t)r * (size_t)cols, code_scales + r, cols,
                          w->group_size, C, R);
        }
    }
}

// ---- W8A8: quantizing an activation row ----------------------------------------
//
// The same codes and scale as matmul_quantize_row: the maximum is exact in
// any order, vdivps rounds as the scalar division does, vmaxps / vminps
// clamp as quantize_activation() spells out, and vcvtps2dq rounds half to
// even like its 1.5 * 2^23 trick.

AVX2_TARGET void matmul_quantize_row_avx2(int8_t* codes, float* scale, const float* x, int cols) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 largest = _mm256_set1_ps(FLT_MAX);
    __m256 max_abs = _mm256_setzero_ps(), not_finite = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= cols; i += 8) {
        __m256 magnitude = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
        not_finite = _mm256_or_ps(not_finite, _mm256_cmp_ps(magnitude, largest, _CMP_NLE_UQ)); // NaN or inf
        max_abs = _mm256_max_ps(magnitude, max_abs);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, max_abs);
    float max_value = 0.0f;
    int finite = _mm256_movemask_ps(not_finite) == 0;
    for (int l = 0; l < 8; l++)
        max_value = lanes[l] > max_value ? lanes[l] : max_value;
    for (; i < cols; i++) {
        float magnitude = fabsf(x[i]);
        if (!(magnitude <= FLT_MAX)) finite = 0;
        max_value = magnitude > max_value ? magnitude : max_value;
    }
    const float a_scale = finite ? max_value / 127.0f : NAN;
    *scale = a_scale;
    if (!(a_scale > 0.0f && a_scale <= FLT_MAX)) { // zero, underflowed or non-finite: codes 0
        memset(codes, 0, (size_t)(cols > 0 ? cols : 0));
        return;
    }
    const __m256 divisor = _mm256_set1_ps(a_scale), low = _mm256_set1_ps(-127.0f), high = _mm256_set1_ps(127.0f);
    const __m256i byte_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    i = 0;
    for (; i + 32 <= cols; i += 32) {
        __m256i q[4];
        for (int k = 0; k < 4; k++) {
            __m256 v = _mm256_div_ps(_mm256_loadu_ps(x + i + 8 * k), divisor);
            q[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, low), high));
        }
        // packs work per 128-bit half: the bytes come out as dwords
        // (q0 0-3, q1 0-3, q2 0-3, q3 0-3 | q0 4-7, ...), put in order by byte_order.
        __m256i words01 = _mm256_packs_epi32(q[0], q[1]), words23 = _mm256_packs_epi32(q[2], q[3]);
        __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(words01, words23), byte_order);
        _mm256_storeu_si256((__m256i*)(codes + i), bytes);
    }
    for (; i < cols; i++)
        codes[i] = quantize_activation(x[i], a_scale);
}

#endif
