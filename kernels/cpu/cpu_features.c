#include "kernels/cpu/cpu_features.h"

#include <pthread.h>
#include <stdlib.h>
#include <strings.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define X86_DETECTION 1
#include <cpuid.h>
#else
#define X86_DETECTION 0
#endif

// Written once under pthread_once, read-only afterwards: process-wide facts
// about the machine, not engine state (DESIGN.md allows several engines per
// process; they all see the same CPU).
static cpu_features detected;
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;

#if X86_DETECTION
// F16C from CPUID leaf 1, ECX bit 29: older clang's __builtin_cpu_supports
// does not know the name "f16c".
static bool cpuid_has_f16c(void) {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
}

// AVX512_VNNI from CPUID leaf 7, ECX bit 11 (as for F16C, not every
// compiler's __builtin_cpu_supports knows the name). The zmm state it needs
// is the one avx512f already checked with XGETBV.
static bool cpuid_has_avx512vnni(void) {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 11));
}

// AVX512_BF16 from CPUID leaf 7, sub-leaf 1, EAX bit 5 (zmm state as above).
static bool cpuid_has_avx512bf16(void) {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5));
}
#endif

static void detect(void) {
#if X86_DETECTION
    // __builtin_cpu_supports also checks XGETBV, i.e. that the OS saves the
    // wider registers, so "avx512f" means the instructions are really usable.
    __builtin_cpu_init();
    detected.avx2 = __builtin_cpu_supports("avx2");
    detected.fma = __builtin_cpu_supports("fma");
    detected.f16c = cpuid_has_f16c() && __builtin_cpu_supports("avx"); // converts into ymm registers
    detected.avx512f = __builtin_cpu_supports("avx512f");
    detected.avx512bw = __builtin_cpu_supports("avx512bw");
    detected.avx512vl = __builtin_cpu_supports("avx512vl");
    detected.avx512vnni = detected.avx512f && cpuid_has_avx512vnni();
    detected.avx512bf16 = detected.avx512f && detected.avx512bw && cpuid_has_avx512bf16();
#endif
    detected.best = CPU_SIMD_SCALAR;
    if (detected.avx2 && detected.fma && detected.f16c) {
        detected.best = CPU_SIMD_AVX2;
        if (detected.avx512f && detected.avx512bw && detected.avx512vl) detected.best = CPU_SIMD_AVX512;
    }
    detected.selected = detected.best;
    const char* forced = getenv("SERVELAB_SIMD");
    if (forced && forced[0]) {
        cpu_simd_level level;
        if (cpu_simd_level_parse(forced, &level) == 0)
            detected.selected = level < detected.best ? level : detected.best;
        else
            detected.env_ignored = true; // the lab can say so; kernels never print
    }
}

const cpu_features* cpu_features_get(void) {
    pthread_once(&detect_once, detect);
    return &detected;
}

cpu_simd_level cpu_simd_level_selected(void) { return cpu_features_get()->selected; }

cpu_simd_level cpu_simd_level_clamp(cpu_simd_level requested) {
    cpu_simd_level best = cpu_features_get()->best;
    if (requested < CPU_SIMD_SCALAR) return CPU_SIMD_SCALAR;
    return requested < best ? requested : best;
}

const char* cpu_simd_level_name(cpu_simd_level level) {
    switch (level) {
    case CPU_SIMD_SCALAR: return "scalar";
    case CPU_SIMD_AVX2: return "avx2";
    case CPU_SIMD_AVX512: return "avx512";
    }
    return "unknown";
}

int cpu_simd_level_parse(const char* text, cpu_simd_level* out) {
    static const cpu_simd_level levels[] = {CPU_SIMD_SCALAR, CPU_SIMD_AVX2, CPU_SIMD_AVX512};
    for (size_t k = 0; k < sizeof levels / sizeof levels[0]; k++) {
        if (strcasecmp(text, cpu_simd_level_name(levels[k])) == 0) {
            *out = levels[k];
            return 0;
        }
    }
    return -1;
}
