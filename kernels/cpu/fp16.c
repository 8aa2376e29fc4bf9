#include "kernels/cpu/fp16.h"

#include <string.h>

#include "kernels/cpu/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include "kernels/cpu/simd_x86.h"

// F16C converts 8 values per instruction with the same rounding (nearest,
// ties to even), overflow, subnormal and quiet-NaN rules as the scalar
// code below, so the arrays get the same bits either way (test_fp16).
static AVX2_TARGET void fp16_from_fp32_f16c(uint16_t* out, const float* in, size_t count) {
    size_t i = 0;
    for (; i + 8 <= count; i += 8)
        _mm_storeu_si128((__m128i*)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < count; i++) out[i] = fp32_to_fp16(in[i]);
}

static AVX2_TARGET void fp16_to_fp32_f16c(float* out, const uint16_t* in, size_t count) {
    size_t i = 0;
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(in + i))));
    for (; i < count; i++) out[i] = fp16_to_fp32(in[i]);
}
#endif

static uint32_t float_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static float bits_float(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

float fp16_to_fp32(uint16_t half) {
    uint32_t sign = (uint32_t)(half & 0x8000u) << 16;
    uint32_t exponent = (half >> 10) & 0x1fu;
    uint32_t mantissa = half & 0x3ffu;
    if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13)); // inf, NaN
    if (exponent == 0) {
        if (mantissa == 0) return bits_float(sign); // +-0
        // Subnormal: value = mantissa * 2^-24, exact in fp32.
        float magnitude = (float)mantissa * (1.0f / 16777216.0f);
        return sign ? -magnitude : magnitude;
    }
    return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t fp32_to_fp16(float value) {
    uint32_t bits = float_bits(value);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t exponent = (bits >> 23) & 0xffu;
    uint32_t mantissa = bits & 0x7fffffu;

    if (exponent == 0xff) { // inf stays inf; NaN becomes a quiet NaN
        return (uint16_t)(sign | 0x7c00u | (mantissa ? 0x200u | (mantissa >> 13) : 0u));
    }
    int half_exponent = (int)exponent - 127 + 15;
    if (half_exponent >= 0x1f) return (uint16_t)(sign | 0x7c00u); // overflow -> inf
    if (half_exponent <= 0) {
        // Subnormal or zero in fp16: shift the full significand (with its
        // implicit 1) right and round to nearest even on the dropped bits.
        if (half_exponent < -10) return sign; // below half the smallest subnormal
        uint32_t significand = mantissa | 0x800000u;
        int shift = 14 - half_exponent; // 14..24
        uint32_t result = significand >> shift;
        uint32_t remainder = significand & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1);
        if (remainder > halfway || (remainder == halfway && (result & 1u))) result++;
        return (uint16_t)(sign | result); // a carry into the exponent is still correct
    }
    uint32_t result = ((uint32_t)half_exponent << 10) | (mantissa >> 13);
    uint32_t remainder = mantissa & 0x1fffu;
    if (remainder > 0x1000u || (remainder == 0x1000u && (result & 1u))) result++; // may carry to inf
    return (uint16_t)(sign | result);
}

void fp16_from_fp32_array(uint16_t* out, const float* in, size_t count) {
#if defined(__x86_64__) || defined(__i386__)
    if (cpu_simd_level_selected() >= CPU_SIMD_AVX2) {
        fp16_from_fp32_f16c(out, in, count);
        return;
    }
#endif
    for (size_t i = 0; i < count; i++) out[i] = fp32_to_fp16(in[i]);
}

void fp16_to_fp32_array(float* out, const uint16_t* in, size_t count) {
#if defined(__x86_64__) || defined(__i386__)
    if (cpu_simd_level_selected() >= CPU_SIMD_AVX2) {
        fp16_to_fp32_f16c(out, in, count);
        return;
    }
#endif
    for (size_t i = 0; i < count; i++) out[i] = fp16_to_fp32(in[i]);
}

uint16_t fp32_to_bf16(float value) {
    uint32_t bits = float_bits(value);
    uint32_t exponent = bits & 0x7f800000u, mantissa = bits & 0x007fffffu;
    if (exponent == 0x7f800000u && mantissa != 0) return (uint16_t)((bits | 0x00400000u) >> 16); // quiet NaN
    if (exponent == 0) return (uint16_t)((bits & 0x80000000u) >> 16);                           // +-0, subnormals
    // Adding 0x7fff plus the bit that stays (the lowest kept) rounds to
    // nearest with ties to even; a carry into the exponent is the correct
    // next binade, up to +-inf.
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

float bf16_to_fp32(uint16_t bf16) { return bits_float((uint32_t)bf16 << 16); }

float fp32_round_to_bf16(float value) { return bf16_to_fp32(fp32_to_bf16(value)); }
