// cpu_features: which SIMD instruction sets this CPU has, found at run time.
//
// The build is portable (no -march=native, no global -mavx2): the SIMD
// kernels carry __attribute__((target(...))) and are only called after the
// check here says the CPU and the OS support them. So one binary runs on any
// x86-64, and uses AVX2 or AVX-512 where they exist.
//
// The environment variable SERVELAB_SIMD=scalar|avx2|avx512 lowers the level
// for a whole process (tests, benchmarks, "how much did SIMD buy us?"). It
// can only lower it: asking for avx512 on an AVX2-only CPU gives avx2.
#ifndef SERVELAB_CPU_FEATURES_H
#define SERVELAB_CPU_FEATURES_H

#include <stdbool.h>

// Kernel levels, each one a superset of the one below it.
typedef enum cpu_simd_level {
    CPU_SIMD_SCALAR = 0, // plain C, any CPU
    CPU_SIMD_AVX2 = 1,   // AVX2 + FMA + F16C: 8 fp32 lanes
    CPU_SIMD_AVX512 = 2, // the above + AVX-512 F, BW, VL: 16 fp32 lanes, masked loads
} cpu_simd_level;

typedef struct cpu_features {
    bool avx2, fma, f16c;             // what the CPU reports (and the OS enables)
    bool avx512f, avx512bw, avx512vl; //
    bool avx512vnni;                  // int8 dot products (vpdpbusd): the AVX-512 level's W8A8
                                      // kernel uses it when present; it is not a level of its own
    bool avx512bf16;                  // bf16 dot products (vdpbf16ps): the AVX-512 level's W4A16
                                      // kernel uses it when present, for the same bits; not a level
    cpu_simd_level best;              // highest level the hardware supports
    cpu_simd_level selected;          // best, lowered by SERVELAB_SIMD if set
    bool env_ignored;                 // SERVELAB_SIMD was set but not understood
} cpu_features;

// Detected once per process (thread-safe), then constant.
const cpu_features* cpu_features_get(void);

// The level kernels use when the caller does not ask for one: ->selected.
cpu_simd_level cpu_simd_level_selected(void);

// Lowers `requested` to what the hardware supports (never raises it), so a
// kernel asked for AVX-512 on an AVX2 machine runs AVX2 instead of faulting.
cpu_simd_level cpu_simd_level_clamp(cpu_simd_level requested);

// "scalar", "avx2", "avx512".
const char* cpu_simd_level_name(cpu_simd_level level);

// Parses a level name (case-insensitive). Returns 0 and sets *out, or -1
// when text is not one of the names above.
int cpu_simd_level_parse(const char* text, cpu_simd_level* out);

#endif
