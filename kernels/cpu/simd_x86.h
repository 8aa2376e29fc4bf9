// simd_x86: what the x86 SIMD kernels share (internal to kernels/cpu).
//
// The target attributes every vector kernel carries (the build itself stays
// portable: no -mavx2), and the fixed horizontal sums whose order is part of
// each kernel's batch-invariance contract: one tree, written once.
#ifndef SERVELAB_SIMD_X86_H
#define SERVELAB_SIMD_X86_H

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

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
#endif

#endif
