// simd_x86: what the x86 SIMD kernels share (internal to kernels/cpu).
//
// The target attributes every vector kernel carries (the build itself stays
// portable: no -mavx2), and the fixed horizontal sums whose order is part of
// each kernel's batch-invariance contract: one tree, written once.
#ifndef SERVELAB_SIMD_X86_H
#define SERVELAB_SIMD_X86_H

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <stdint.h>

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

// Fixed horizontal sum: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
AVX2_INLINE float hsum8(__m256 v) {
    __m128 quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); // l + (l+4)
    __m128 pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));                        // q0+q2, q1+q3
    return _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)));
}

// Fixed horizontal sum: l + (l+8) for l < 8, then the tree of hsum8().
AVX512_INLINE float hsum16(__m512 v) {
    __m256 half =
        _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 quad = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
    __m128 pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    return _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)));
}

// fp32_round_to_bf16 (fp16.h) in 8 lanes, the same bits: nearest, ties to
// even, by adding 0x7fff plus the lowest kept bit; NaN made quiet and cut;
// zeros and subnormals to a zero of their sign.
AVX2_INLINE __m256 round_to_bf16_8(__m256 x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i lowest_kept = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256 rounded =
        _mm256_castsi256_ps(_mm256_add_epi32(bits, _mm256_add_epi32(lowest_kept, _mm256_set1_epi32(0x7fff))));
    const __m256 quiet_nan = _mm256_castsi256_ps(_mm256_or_si256(bits, _mm256_set1_epi32(0x00400000)));
    const __m256 signed_zero = _mm256_castsi256_ps(_mm256_and_si256(bits, _mm256_set1_epi32(INT32_MIN)));
    const __m256i exponent = _mm256_and_si256(bits, _mm256_set1_epi32(0x7f800000));
    const __m256 no_exponent = _mm256_castsi256_ps(_mm256_cmpeq_epi32(exponent, _mm256_setzero_si256()));
    __m256 result = _mm256_blendv_ps(rounded, quiet_nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    result = _mm256_blendv_ps(result, signed_zero, no_exponent);
    return _mm256_and_ps(result, _mm256_castsi256_ps(_mm256_set1_epi32((int)0xffff0000u)));
}

// dst[i] = fp32_round_to_bf16(src[i]) for i < count (the tail through a
// zero-padded vector: the same bits). dst and src must not overlap.
AVX2_INLINE void round_floats_to_bf16(float* dst, const float* src, size_t count) {
    size_t i = 0;
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(dst + i, round_to_bf16_8(_mm256_loadu_ps(src + i)));
    if (i == count) return;
    float tail[8] = {0};
    for (size_t k = 0; i + k < count; k++) tail[k] = src[i + k];
    _mm256_storeu_ps(tail, round_to_bf16_8(_mm256_loadu_ps(tail)));
    for (size_t k = 0; i + k < count; k++) dst[i + k] = tail[k];
}

// The same in 16 lanes.
AVX512_INLINE __m512 round_to_bf16_16(__m512 x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lowest_kept = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lowest_kept, _mm512_set1_epi32(0x7fff)));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    rounded = _mm512_mask_or_epi32(rounded, is_nan, bits, _mm512_set1_epi32(0x00400000));
    rounded = _mm512_mask_and_epi32(rounded, _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7f800000)), bits,
                                    _mm512_set1_epi32(INT32_MIN));
    return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32((int)0xffff0000u)));
}

// e^x in 8 lanes, Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r,
// 2^n put in the exponent; within 2 ulp of libm's expf. x is clamped to
// [-87.3, 88.4] (no infinities, no denormal results).
AVX2_INLINE __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.37626f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x); // x - n ln2, ln2 in two parts
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(exponent));
}
#endif

#endif
