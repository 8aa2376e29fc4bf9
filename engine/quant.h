// quant: b-bit quantization of real tensors, its error, and the methods that
// choose the codes (RTN, AWQ, GPTQ).
//
// Asymmetric (b bits):  s = (r_max - r_min) / (2^b - 1),  z = round(-r_min / s)
//                       q = clamp(round(r / s) + z, 0, 2^b - 1),  r_hat = s (q - z)
// Symmetric:            s = max|r| / (2^(b-1) - 1),  z = 0
//                       q = clamp(round(r / s), -(2^(b-1) - 1), 2^(b-1) - 1),  r_hat = s q
// The range [r_min, r_max] is the values' min and max, widened to include 0
// so that 0.0 is exactly representable (r_hat(0) = 0, which keeps padding and
// ReLU zeros exact); with clip_search it is shrunk to the range that gives
// the least mean squared error, and values outside it saturate (counted as
// clipped). Scales are rounded to fp16 when chosen, because the packed
// formats store them in fp16: the statistics then describe exactly what the
// kernels compute.
//
// Granularity: one (s, z) per tensor, per output channel (row), or per group
// of group_size consecutive inputs within a row (group_size divides cols).
// Matrices are row-major (rows = output channels, cols = inputs), as in the
// model.
#ifndef SERVELAB_QUANT_H
#define SERVELAB_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/cpu/matmul.h"

typedef enum quant_granularity {
    QUANT_PER_TENSOR = 0,
    QUANT_PER_CHANNEL = 1,
    QUANT_PER_GROUP = 2,
} quant_granularity;

typedef struct quant_scheme {
    int bits;                      // 2..8
    bool symmetric;
    quant_granularity granularity;
    int group_size;                // QUANT_PER_GROUP: inputs per group, divides cols
    bool clip_search;              // shrink ranges to minimise MSE
} quant_scheme;

typedef struct quant_params {
    float scale;        // s: the real-value gap between neighbouring codes (fp16-representable)
    int32_t zero_point; // z: the code that decodes to 0.0 (0 when symmetric)
    float range_min;    // the range the scale was chosen for (after clipping)
    float range_max;
} quant_params;

typedef struct quant_stats {
    float scale;            // of this set; for a whole matrix, the mean over its sets
    int32_t zero_point;     // of this set; for a whole matrix, 0
    int64_t n_values;
    int64_t n_clipped;      // values outside [range_min, range_max], saturated
    double mse;             // mean of (r - r_hat)^2
    float max_abs_error;    // max |r - r_hat|
    bool within_half_step;  // every in-range value has |r - r_hat| <= s/2 (+ float epsilon)
} quant_stats;

// ---- one set of values ------------------------------------------------------------

// The smallest and largest code: symmetric [-(2^(b-1)-1), 2^(b-1)-1], else [0, 2^b - 1].
int32_t quant_code_min(int bits, bool symmetric);
int32_t quant_code_max(int bits, bool symmetric);

// s and z for a given range (widened to include 0).
quant_params quant_params_for_range(float range_min, float range_max, int bits, bool symmetric);

// s and z for n values (min/max, or the MSE-best clipped range).
quant_params quant_params_for_values(const float* values, size_t n, int bits, bool symmetric, bool clip_search);

// q for r (saturating; *clipped set when r was outside the range; may be NULL).
int32_t quant_quantize(float r, const quant_params* p, int bits, bool symmetric, bool* clipped);

// r_hat = s (q - z).
float quant_dequantize(int32_t q, const quant_params* p);

// Error statistics of quantizing n values with p.
quant_stats quant_measure(const float* values, size_t n, const quant_params* p, int bits, bool symmetric);

// ---- matrices ------------------------------------------------------------------------

// Checks bits (2..8) and the group size against cols. 0 or -1 with err.
int quant_scheme_validate(const quant_scheme* scheme, int cols, error_info* err);

// Parameter sets of a (rows, cols) matrix: 1, rows, or rows * cols / group_size.
int quant_param_count(int rows, int cols, const quant_scheme* scheme);

// The set that element (row, col) belongs to.
int quant_param_index(int row, int col, int rows, int cols, const quant_scheme* scheme);

// Round-to-nearest (RTN): codes (rows, cols) and params (quant_param_count).
int quant_matrix_rtn(const float* w, int rows, int cols, const quant_scheme* scheme, int32_t* codes,
                     quant_params* params, error_info* err);

// r_hat for every element: out (rows, cols).
void quant_matrix_dequantize(const int32_t* codes, const quant_params* params, int rows, int cols,
                             const quant_scheme* scheme, float* out);

// Statistics of one parameter set (set_index), or of the whole matrix when
// set_index is -1 (mse over all values, max error over all, mean scale).
quant_stats quant_matrix_stats(const float* w, const int32_t* codes, const quant_params* params, int rows, int cols,
                               const quant_scheme* scheme, int set_index);

// ---- packed formats (kernels/cpu/matmul.h: WEIGHT_I8, WEIGHT_I4) ----------------------

// Bytes of the packed matrix: payload + fp16 scales + zero-points. Needs
// bits 8 or 4; per tensor and per channel store one scale per group of cols.
uint64_t quant_packed_bytes(int rows, int cols, const quant_scheme* scheme);

// Packs codes + params into `storage` (quant_packed_bytes bytes, caller
// owned) and fills *out to point into it. bits must be 8 or 4.
int quant_pack(const int32_t* codes, const quant_params* params, int rows, int cols, const quant_scheme* scheme,
               void* storage, weight_matrix* out, error_info* err);

// ---- methods ---------------------------------------------------------------------------

// AWQ (activation-aware weight quantization): for one or more matrices that
// read the same input (e.g. wq, wk, wv), with calibration inputs x
// (n_samples, cols), finds per-input-channel scales s_c = mean|x_c|^alpha,
// alpha on a grid in [0, 1], minimising the matrices' summed output error
//   || x W^T - (x / s) RTN(W diag(s))^T ||^2
// over the calibration samples. Writes channel_scales (cols) and *alpha.
// The caller multiplies W's columns by s, quantizes that with RTN, and
// divides the input by s (folded into the preceding operation).
int quant_awq_search(const float* const* matrices, const int* rows, int n_matrices, int cols, const float* x,
                     int n_samples, const quant_scheme* scheme, float* channel_scales, float* alpha, error_info* err);

// GPTQ: with H = 2 X^T X (+ damp * mean(diag) * I) from the calibration
// inputs x (n_samples, cols), quantizes w column by column (in blocks of
// block_size columns with lazy batched updates), spreading each column's
// error onto the columns not yet quantized through the Cholesky factor of
// H^-1. Groups get their (s, z) from the partly updated weights when the
// first column of the group is reached. Writes codes (rows, cols) and
// params (quant_param_count). w is not modified.
int quant_gptq(const float* w, int rows, int cols, const float* x, int n_samples, const quant_scheme* scheme,
               float damp, int block_size, int32_t* codes, quant_params* params, error_info* err);

#endif
