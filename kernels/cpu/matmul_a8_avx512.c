// matmul_a8_avx512: group-wise W8A8 and W4A8 with AVX512_VNNI (vpdpbusd),
// in the order of matmul_a8.c, on blocks of 32 activations.
//
// A step is 128 columns = 4 blocks, for a tile of 4 outputs x R rows.
// vpdpbusd multiplies unsigned weight bytes by signed activation codes and
// adds each 4 neighbouring products into one int32 lane, so the weights go
// in as unsigned u = c + offset (INT4: the stored nibble, offset 8; INT8:
// q ^ 0x80, offset 128) and the prepared zero_sums take offset * sum a back
// out of each block sum: exact, no sign trick per activation row.
//   INT4: the step's 64 packed bytes hold 16 bytes of each block; masked to
//         their low nibbles they are the even columns, shifted by 4 the odd
//         ones, and the activations come prepared in that order (A8_NIBBLES),
//         so two vpdpbusd leave block k's sum in the 4 lanes of quarter k.
//   INT8: two 64-byte loads (blocks 0-1, 2-3), one vpdpbusd each; two
//         128-bit shuffles and an add put block k in quarter k as above.
// Four outputs' vectors are then added across their quarters' lanes
// (unpack and add twice: lane 4k + c = block k of output c), the offset
// sums subtracted, and lane by lane: to float (exact), times the weight
// scale, times the activation scale, into that lane's running total, which
// is T[k] of output c in matmul_a8.c's order. Weight bytes streamed per step
// are the packed format's: 64 (INT4) or 128 (INT8) per output, plus scales.
#include "kernels/cpu/matmul_simd.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define A8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define A8_INLINE                                                                                                      \
    static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

#define A8_ROWS_MAX 4 // rows per tile: 4 x 4 block sums per step fill 16 accumulators

// Lane 4k + c = the sum of the four lanes of quarter k of v[c] (exact).
A8_INLINE __m512i sum_quarters(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
    __m512i pair01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
    __m512i pair23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v2, v3), _mm512_unpackhi_epi32(v2, v3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(pair01, pair23), _mm512_unpackhi_epi64(pair01, pair23));
}

// Per-call constants of one matrix.
typedef struct a8_shape {
    int cols, group_size, n_groups, groups_per_step; // groups_per_step: 4 (group 32), 2 (64) or 1 (a multiple of 128)
    size_t row_bytes, code_stride;
    __m512i scale_lane; // lane 4k + c: where output c's scale of block k lies in the loaded scales
} a8_shape;

// The weight scales of one step for outputs c < C: lane 4k + c = s of
// block k's group (0 for c >= C). scales: (C, n_groups) fp16 of the tile.
A8_INLINE __m512 step_weight_scales(const a8_shape* s, const uint16_t* scales, int step, int n_live_blocks, int C) {
    const int first = s->groups_per_step > 1 ? step * s->groups_per_step : step * 128 / s->group_size;
    const int n_live = s->groups_per_step == 4 ? n_live_blocks : s->groups_per_step == 2 ? (n_live_blocks + 1) / 2 : 1;
    const __mmask8 live = (__mmask8)((1u << n_live) - 1u);
    __m128i h[4];
    UNROLL_TILE for (int c = 0; c < 4; c++)
        h[c] = c < C ? _mm_maskz_loadu_epi16(live, scales + (size_t)c * (size_t)s->n_groups + (size_t)first)
                     : _mm_setzero_si128();
    __m256i halves = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi64(h[0], h[1])),
                                             _mm_unpacklo_epi64(h[2], h[3]), 1); // output c at 4c .. 4c + 3
    return _mm512_permutexvar_ps(s->scale_lane, _mm512_cvtph_ps(halves));
}

// out: (R rows of stride d_out, C <= 4 outputs); w: the tile's C weight rows
// (row_bytes apart); scales: (C, n_groups); a: (R, code_stride) codes,
// a_scales and zero_sums: (R, n_blocks).
A8_INLINE void a8_tile(float* out, int d_out, const uint8_t* w, const uint16_t* scales, const int8_t* a,
                       const float* a_scales, const int32_t* zero_sums, const a8_shape* s, int i4, int C, int R) {
    const int n_blocks = s->cols / 32;
    const __m512i low_nibbles = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8((char)0x80);
    const __m512i quarter_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 total[A8_ROWS_MAX];
    UNROLL_TILE for (int r = 0; r < R; r++)
        total[r] = _mm512_setzero_ps();
    for (int step = 0; step * 4 < n_blocks; step++) {
        const int n_live = n_blocks - step * 4 < 4 ? n_blocks - step * 4 : 4;
        const __mmask16 live_lanes = (__mmask16)((1u << (4 * n_live)) - 1u);
        const __mmask8 live_blocks = (__mmask8)((1u << n_live) - 1u);
        const int live_bytes = n_live * (i4 ? 16 : 32); // of each weight row in this step
        __m512i a0[A8_ROWS_MAX], a1[A8_ROWS_MAX], sums[4][A8_ROWS_MAX];
        UNROLL_TILE for (int r = 0; r < R; r++) {
            const int8_t* p = a + (size_t)r * s->code_stride + (size_t)step * 128;
            a0[r] = _mm512_loadu_si512(p);
            a1[r] = _mm512_loadu_si512(p + 64);
        }
        UNROLL_TILE for (int c = 0; c < 4; c++) {
            UNROLL_TILE for (int r = 0; r < R; r++)
                sums[c][r] = _mm512_setzero_si512();
            if (c >= C) continue;
            const uint8_t* p = w + (size_t)c * s->row_bytes + (size_t)step * (i4 ? 64 : 128);
            prefetch_ahead(p, 4 * s->row_bytes); // the next tile's bytes
            if (i4) {
                __m512i packed = live_bytes == 64 ? _mm512_loadu_si512(p)
                                                  : _mm512_maskz_loadu_epi8(((__mmask64)1 << live_bytes) - 1, p);
                __m512i even = _mm512_and_si512(packed, low_nibbles);
                __m512i odd = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles);
                UNROLL_TILE for (int r = 0; r < R; r++) {
                    sums[c][r] = _mm512_dpbusd_epi32(sums[c][r], even, a0[r]);
                    sums[c][r] = _mm512_dpbusd_epi32(sums[c][r], odd, a1[r]);
                }
            } else {
                prefetch_ahead(p + 64, 4 * s->row_bytes);
                const int bytes0 = live_bytes < 64 ? live_bytes : 64, bytes1 = live_bytes - bytes0;
                __m512i w0 =
                    bytes0 == 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(((__mmask64)1 << bytes0) - 1, p);
                __m512i w1 = bytes1 == 64 ? _mm512_loadu_si512(p + 64)
                                          : _mm512_maskz_loadu_epi8(((__mmask64)1 << bytes1) - 1, p + 64);
                // Bytes past the row load as 0 and flip to 128, against activation codes of 0.
                w0 = _mm512_xor_si512(w0, flip);
                w1 = _mm512_xor_si512(w1, flip);
                UNROLL_TILE for (int r = 0; r < R; r++) {
                    __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, a0[r]); // blocks 0, 0, 1, 1
                    __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w1, a1[r]); // blocks 2, 2, 3, 3
                    sums[c][r] = _mm512_add_epi32(_mm512_shuffle_i32x4(s0, s1, _MM_SHUFFLE(2, 0, 2, 0)),
                                                  _mm512_shuffle_i32x4(s0, s1, _MM_SHUFFLE(3, 1, 3, 1)));
                }
            }
        }
        const __m512 w_scales = step_weight_scales(s, scales, step, n_live, C);
        UNROLL_TILE for (int r = 0; r < R; r++) {
            const size_t first_block = (size_t)r * (size_t)n_blocks + (size_t)step * 4;
            // Block k's values in every lane of quarter k.
            __m512i offsets = _mm512_permutexvar_epi32(
                quarter_of_lane, _mm512_castsi128_si512(_mm_maskz_loadu_epi32(live_blocks, zero_sums + first_block)));
            __m512 a_scale = _mm512_permutexvar_ps(
                quarter_of_lane, _mm512_castps128_ps512(_mm_maskz_loadu_ps(live_blocks, a_scales + first_block)));
            __m512i isum = _mm512_sub_epi32(sum_quarters(sums[0][r], sums[1][r], sums[2][r], sums[3][r]), offsets);
            __m512 term = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), w_scales);
            term = _mm512_mul_ps(term, a_scale);
            total[r] = _mm512_mask_add_ps(total[r], live_lanes, total[r], term);
        }
    }
    // out = (T0 + T2) + (T1 + T3): quarters 0 + 2 and 1 + 3, then the two added.
    const __mmask8 live_outputs = (__mmask8)((1u << C) - 1u);
    UNROLL_TILE for (int r = 0; r < R; r++) {
        __m512 halves = _mm512_add_ps(total[r], _mm512_shuffle_f32x4(total[r], total[r], _MM_SHUFFLE(1, 0, 3, 2)));
        __m128 sum = _mm_add_ps(_mm512_castps512_ps128(halves), _mm512_extractf32x4_ps(halves, 1));
        _mm_mask_storeu_ps(out + (size_t)r * (size_t)d_out, live_outputs, sum);
    }
}

static A8_TARGET __attribute__((noinline)) void a8_tile_any(float* out, int d_out, const uint8_t* w,
                                                            const uint16_t* scales, const int8_t* a,
                                                            const float* a_scales, const int32_t* zero_sums,
                                                            const a8_shape* s, int i4, int C, int R) {
#define A8_TILE(c, r)                                                                                                  \
    (i4 ? a8_tile(out, d_out, w, scales, a, a_scales, zero_sums, s, 1, c, r)                                           \
        : a8_tile(out, d_out, w, scales, a, a_scales, zero_sums, s, 0, c, r))
    switch (C * 8 + R) {
    case 1 * 8 + 1: A8_TILE(1, 1); break;
    case 1 * 8 + 2: A8_TILE(1, 2); break;
    case 1 * 8 + 3: A8_TILE(1, 3); break;
    case 1 * 8 + 4: A8_TILE(1, 4); break;
    case 2 * 8 + 1: A8_TILE(2, 1); break;
    case 2 * 8 + 2: A8_TILE(2, 2); break;
    case 2 * 8 + 3: A8_TILE(2, 3); break;
    case 2 * 8 + 4: A8_TILE(2, 4); break;
    case 3 * 8 + 1: A8_TILE(3, 1); break;
    case 3 * 8 + 2: A8_TILE(3, 2); break;
    case 3 * 8 + 3: A8_TILE(3, 3); break;
    case 3 * 8 + 4: A8_TILE(3, 4); break;
    case 4 * 8 + 1: A8_TILE(4, 1); break;
    case 4 * 8 + 2: A8_TILE(4, 2); break;
    case 4 * 8 + 3: A8_TILE(4, 3); break;
    case 4 * 8 + 4: A8_TILE(4, 4); break;
    default: break; // larger tiles are never asked for
    }
#undef A8_TILE
}

A8_TARGET void matmul_a8_avx512vnni(float* out, const int8_t* codes, const float* scales, const int32_t* zero_sums,
                                    int n_rows, const weight_matrix* w, int o_begin, int o_end) {
    a8_shape s = {w->cols,
                  w->group_size,
                  w->cols / w->group_size,
                  0,
                  int_row_bytes(w),
                  matmul_a8_code_stride(w->cols),
                  _mm512_setzero_si512()};
    s.groups_per_step = w->group_size == 32 ? 4 : w->group_size == 64 ? 2 : 1;
    int lane[16]; // lane 4k + c reads output c's loaded scale 4c + (its group within the step)
    for (int k = 0; k < 4; k++)
        UNROLL_TILE for (int c = 0; c < 4; c++)
            lane[4 * k + c] = 4 * c + k * s.groups_per_step / 4;
    s.scale_lane = _mm512_loadu_si512(lane);
    const int n_blocks = w->cols / 32, i4 = w->dtype == WEIGHT_I4;
    const size_t n_groups = (size_t)s.n_groups;
    // Outputs outside, rows inside: a tile's weights (4 rows, a few KiB)
    // stay in L1 while every row tile of the batch uses them.
    for (int o = o_begin; o < o_end; o += 4) {
        const int C = o_end - o < 4 ? o_end - o : 4;
        for (int r = 0; r < n_rows; r += A8_ROWS_MAX) {
            const int R = n_rows - r < A8_ROWS_MAX ? n_rows - r : A8_ROWS_MAX;
            a8_tile_any(out + (size_t)r * (size_t)w->rows + (size_t)o, w->rows,
                        (const uint8_t*)w->values + (size_t)o * s.row_bytes, w->scales_f16 + (size_t)o * n_groups,
                        codes + (size_t)r * s.code_stride, scales + (size_t)r * (size_t)n_blocks,
                        zero_sums + (size_t)r * (size_t)n_blocks, &s, i4, C, R);
        }
    }
}

#endif
