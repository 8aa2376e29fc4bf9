// ops_avx2: the elementwise ops with a vector exp, AVX2 + FMA.
//
// swiglu() in ops.c calls libm's expf per element: in a 512-token prefill
// of stories110m that was 4% of the time. Here exp is exp8() (within 2 ulp
// of expf), and every element, the last ones included, goes through the
// same 8-lane code, so an element's result depends on nothing but its two
// inputs (not on where a chunk of outputs starts or ends).
#include "kernels/cpu/ops_simd.h"
#include "kernels/cpu/simd_x86.h"

#if defined(__x86_64__) || defined(__i386__)
#include <string.h>

// silu(g) * u per lane, in swiglu()'s order: g * (1 / (1 + e^-g)), then * u.
AVX2_INLINE __m256 swiglu8(__m256 gate, __m256 up) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gate));
    __m256 value = _mm256_mul_ps(gate, _mm256_div_ps(one, _mm256_add_ps(one, e)));
    return _mm256_mul_ps(value, up);
}

AVX2_TARGET void swiglu_avx2(float* gate, const float* up, int size) {
    int i = 0;
    for (; i + 8 <= size; i += 8)
        _mm256_storeu_ps(gate + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < size) { // the tail through one zero-padded vector; only its live lanes are kept
        float g[8] = {0}, u[8] = {0};
        memcpy(g, gate + i, (size_t)(size - i) * sizeof(float));
        memcpy(u, up + i, (size_t)(size - i) * sizeof(float));
        _mm256_storeu_ps(g, swiglu8(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
        memcpy(gate + i, g, (size_t)(size - i) * sizeof(float));
    }
}
#endif
