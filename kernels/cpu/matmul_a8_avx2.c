// matmul_a8_avx2: group-wise W8A8 and W4A8 with AVX2, on blocks of 32
// activations, in the order of matmul_a8.c.
//
// One block of one output and one row at a time: vpmaddubsw multiplies
// unsigned by signed bytes into int16 pairs and vpmaddwd adds the pairs
// into 8 int32 lanes, summed to isum_b; the float steps are matmul_a8.c's
// in scalar code. The int16 pairs must not saturate:
//   INT4: the stored nibble u = c + 8 <= 15 times |a| <= 127, twice, is
//         at most 3810; the activations come in A8_NIBBLES_32 order (the 16
//         even columns, then the 16 odd ones), to meet the low and high
//         nibbles of the block's 16 packed bytes; zero_sums take 8 * sum a
//         back out.
//   INT8: u = q + 128 could reach 2 * 255 * 127 and saturate, so the sign
//         moves to the activations instead: |q| times a with q's sign,
//         at most 2 * 127 * 127 = 32258 (no offset to take out).
// Integer sums are exact, so the bits are the scalar kernel's.
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/matmul_simd.h"
#include "kernels/cpu/simd_x86.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

// The sum of the 8 int32 lanes (exact).
AVX2_INLINE int32_t sum_lanes(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

// isum of one block: w the block's weight bytes (16 packed or 32 codes), a its 32 codes.
AVX2_INLINE int32_t block_isum(const uint8_t* w, const int8_t* a, int32_t zero_sum, int i4) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i codes = _mm256_loadu_si256((const __m256i*)a);
    __m256i pairs;
    if (i4) {
        const __m128i packed = _mm_loadu_si128((const __m128i*)w), low = _mm_set1_epi8(0x0f);
        const __m256i nibbles =
            _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
        pairs = _mm256_maddubs_epi16(nibbles, codes);
    } else {
        const __m256i q = _mm256_loadu_si256((const __m256i*)w);
        pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(codes, q));
        zero_sum = 0;
    }
    return sum_lanes(_mm256_madd_epi16(pairs, ones)) - zero_sum;
}

AVX2_TARGET void matmul_a8_avx2(float* out, const int8_t* codes, const float* scales, const int32_t* zero_sums,
                                int n_rows, const weight_matrix* w, int o_begin, int o_end) {
    const int cols = w->cols, n_blocks = cols / 32, i4 = w->dtype == WEIGHT_I4;
    const size_t n_groups = (size_t)(cols / w->group_size), stride = matmul_a8_code_stride(cols),
                 row_bytes = int_row_bytes(w), block_bytes = i4 ? 16 : 32;
    for (int o = o_begin; o < o_end; o++) { // outputs outermost: one weight row stays in cache
        const uint8_t* row = (const uint8_t*)w->values + (size_t)o * row_bytes;
        const uint16_t* w_scales = w->scales_f16 + (size_t)o * n_groups;
        prefetch_ahead(row, row_bytes);
        for (int r = 0; r < n_rows; r++) {
            const int8_t* a = codes + (size_t)r * stride;
            const float* a_scales = scales + (size_t)r * (size_t)n_blocks;
            const int32_t* sums = zero_sums + (size_t)r * (size_t)n_blocks;
            float totals[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int b = 0; b < n_blocks; b++) {
                int32_t isum = block_isum(row + (size_t)b * block_bytes, a + (size_t)b * 32, sums[b], i4);
                totals[b % 4] += w8a8_term(isum, _cvtsh_ss(w_scales[b * 32 / w->group_size]), a_scales[b]);
            }
            out[(size_t)r * (size_t)w->rows + (size_t)o] = (totals[0] + totals[2]) + (totals[1] + totals[3]);
        }
    }
}

#endif
