// fp16: IEEE 754 binary16 <-> binary32 conversion.
//
// Weights stored as fp16 halve the bytes streamed per token; the math stays
// in fp32 (each value is widened when it is used). Conversion to fp16 rounds
// to nearest, ties to even, as hardware converters do; values too large
// become +-inf, NaN stays NaN (quiet), tiny values become subnormals or 0.
#ifndef SERVELAB_FP16_H
#define SERVELAB_FP16_H

#include <stddef.h>
#include <stdint.h>

float fp16_to_fp32(uint16_t half);
uint16_t fp32_to_fp16(float value);

// Converts count values; out and in must not overlap.
void fp16_from_fp32_array(uint16_t* out, const float* in, size_t count);
void fp16_to_fp32_array(float* out, const uint16_t* in, size_t count);

// bfloat16: the top 16 bits of a binary32 (8 exponent bits, 8 significant
// bits). W4A16 keeps its activations in bf16 (matmul_int.c). The rounding is
// that of the AVX-512 BF16 converters (VCVTNEPS2BF16), bit for bit: nearest,
// ties to even; too large gives +-inf; a NaN stays NaN, made quiet; a
// subnormal becomes a zero of its sign (the converters read subnormal inputs
// as 0). A bf16 times a small integer (|c| <= 255) is exact in fp32.
uint16_t fp32_to_bf16(float value);
float bf16_to_fp32(uint16_t bf16);

// bf16_to_fp32(fp32_to_bf16(value)): value rounded to the nearest bf16.
float fp32_round_to_bf16(float value);

#endif
