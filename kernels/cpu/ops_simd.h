// ops_simd: the vector versions of elementwise ops (internal to
// kernels/cpu; callers use ops.h, which picks them at run time).
#ifndef SERVELAB_OPS_SIMD_H
#define SERVELAB_OPS_SIMD_H

#if defined(__x86_64__) || defined(__i386__)
// swiglu_vector() on AVX2: gate, up: (size) floats.
void swiglu_avx2(float* gate, const float* up, int size);
#endif

#endif
