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

#endif
