// quant: b-bit quantizers (symmetric / asymmetric; per tensor, channel or
// group), their error statistics, and the packed INT8 / INT4 formats.
// The methods that choose codes more cleverly than rounding live beside it:
// quant_awq.c (activation-aware scales) and quant_gptq.c (error feedback).
#include "engine/quant.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/fault.h"
#include "kernels/cpu/fp16.h"

// ---- codes ---------------------------------------------------------------------------

// Bits outside 2..8 (which quant_scheme_validate rejects) give an empty code
// range [0, 0] rather than an undefined shift.
int32_t quant_code_min(int bits, bool symmetric) {
    if (bits < 2 || bits > 8) return 0;
    return symmetric ? -((1 << (bits - 1)) - 1) : 0;
}

int32_t quant_code_max(int bits, bool symmetric) {
    if (bits < 2 || bits > 8) return 0;
    return symmetric ? (1 << (bits - 1)) - 1 : (1 << bits) - 1;
}

// ---- choosing s and z ----------------------------------------------------------------

// The packed formats store s in fp16, so s is chosen among fp16 values. It
// is rounded UP to the next fp16 value (not to nearest): with s >= the exact
// (r_max - r_min) / (2^b - 1), the 2^b levels s (q - z) still reach within
// s/2 of both ends of the range even after z is rounded, so every in-range
// value stays within half a step. Rounding to nearest can shrink s by up to
// 2^-11, which over 255 steps moves the top level by 0.12 s; added to the
// 0.5 s from rounding z, an edge value would then miss its level by up to
// 0.62 s. A scale that is already exact in fp16 is kept as it is.
#define FP16_SMALLEST_POSITIVE 0x0001u // 2^-24, a subnormal
#define FP16_LARGEST_FINITE 0x7bffu    // 65504

static float scale_to_fp16_at_or_above(double exact_scale, bool* overflowed) {
    *overflowed = false;
    // A zero range (all-zero data) has no natural step. Any positive s makes
    // every value (all 0.0) quantize to z and decode to exactly 0, so take the
    // smallest positive fp16: finite statistics, and no division by zero.
    if (!(exact_scale > 0.0)) return fp16_to_fp32(FP16_SMALLEST_POSITIVE);
    uint16_t half = fp32_to_fp16((float)exact_scale);
    if ((half & 0x7fffu) == 0) half = FP16_SMALLEST_POSITIVE;               // underflowed to 0
    if (half < 0x7c00u && (double)fp16_to_fp32(half) < exact_scale) half++; // positive fp16 bits are ordered
    if (half >= 0x7c00u) {                                                  // beyond fp16: saturate
        *overflowed = true;
        half = FP16_LARGEST_FINITE;
    }
    return fp16_to_fp32(half);
}

quant_params quant_params_for_range(float range_min, float range_max, int bits, bool symmetric) {
    // Widen to include 0 so that 0.0 is a level (padding and ReLU zeros stay
    // exact). The comparisons are written so that NaN bounds become 0.
    double low = range_min < 0.0f ? (double)range_min : 0.0;
    double high = range_max > 0.0f ? (double)range_max : 0.0;
    int32_t code_min = quant_code_min(bits, symmetric), code_max = quant_code_max(bits, symmetric);
    quant_params p;
    bool overflowed;
    if (symmetric) {
        // s = max|r| / (2^(b-1) - 1), z = 0: the range is [-max|r|, max|r|].
        double magnitude = fmax(-low, high);
        if (fault_on(FAULT_SYM_SCALE_FULL_RANGE)) magnitude = high - low; // the asymmetric width, over half the levels
        p.scale = scale_to_fp16_at_or_above(magnitude / (double)code_max, &overflowed);
        p.zero_point = 0;
        if (overflowed) magnitude = (double)p.scale * (double)code_max;
        p.range_min = (float)-magnitude;
        p.range_max = (float)magnitude;
        return p;
    }
    // s = (r_max - r_min) / (2^b - 1), z = round(-r_min / s). With r_min <= 0
    // <= r_max and s at or above the exact step, -r_min / s lies in
    // [0, 2^b - 1]; the clamp only guards the saturated (overflowed) case.
    p.scale = scale_to_fp16_at_or_above((high - low) / (double)code_max, &overflowed);
    double zero = round(-low / (double)p.scale);
    if (fault_enabled_set) { // the quantizer faults (engine/fault.h); one test per range
        if (fault_on(FAULT_ZERO_POINT_PLUS)) zero = round(low / (double)p.scale);
        if (fault_on(FAULT_ROUND_FLOOR)) zero = floor((fault_on(FAULT_ZERO_POINT_PLUS) ? low : -low) / (double)p.scale);
    }
    if (zero < (double)code_min) zero = (double)code_min;
    if (zero > (double)code_max) zero = (double)code_max;
    p.zero_point = (int32_t)zero;
    if (overflowed) { // the range the levels can actually reach
        low = (double)p.scale * (double)(code_min - p.zero_point);
        high = (double)p.scale * (double)(code_max - p.zero_point);
    }
    p.range_min = (float)low;
    p.range_max = (float)high;
    return p;
}

// The quantizer faults (engine/fault.h) as the buggy code would compute q:
// floor instead of round, and a code kept in its b bits by wrapping around
// (q mod the number of levels, as storing the low bits does) instead of
// saturating. Out of line, so that the normal path below stays as it was.
static int32_t quantize_with_faults(float r, const quant_params* p, int32_t code_min, int32_t code_max) {
    double scaled = (double)r / (double)p->scale;
    double q = (fault_on(FAULT_ROUND_FLOOR) ? floor(scaled) : round(scaled)) + (double)p->zero_point;
    if (fault_on(FAULT_WRAP_NOT_CLIP)) {
        double levels = (double)code_max - (double)code_min + 1.0;
        double wrapped = fmod(q - (double)code_min, levels); // exact in double, even for an outlier's huge q
        if (wrapped < 0.0) wrapped += levels;
        return (int32_t)((double)code_min + wrapped);
    }
    if (q < (double)code_min) q = (double)code_min;
    if (q > (double)code_max) q = (double)code_max;
    return (int32_t)q;
}

// q = round(r / s) + z, saturated; `faulty` is the caller's one reading of
// the fault set, a local that the loops below keep in a register (the
// global itself, a uint32_t, could alias the int32_t codes they store, and
// re-reading it per value made RTN of 1024 x 4096 g64 16% slower).
static inline int32_t quantize_to_code(float r, const quant_params* p, int32_t code_min, int32_t code_max,
                                       bool faulty) {
    if (isnan(r)) return p->zero_point; // no honest code: decode it as 0
    if (faulty) return quantize_with_faults(r, p, code_min, code_max);
    // Clamp before converting to an integer, because r / s can be far
    // outside int32 for an outlier.
    double q = round((double)r / (double)p->scale) + (double)p->zero_point;
    if (q < (double)code_min) q = (double)code_min;
    if (q > (double)code_max) q = (double)code_max;
    return (int32_t)q;
}

int32_t quant_quantize(float r, const quant_params* p, int bits, bool symmetric, bool* clipped) {
    bool outside = !(r >= p->range_min && r <= p->range_max); // NaN counts as outside
    if (clipped) *clipped = outside;
    return quantize_to_code(r, p, quant_code_min(bits, symmetric), quant_code_max(bits, symmetric),
                            fault_enabled_set != 0);
}

float quant_dequantize(int32_t q, const quant_params* p) { return p->scale * (float)(q - p->zero_point); }

// Sum of squared errors of quantizing n values with p, in double (the error
// each value sees is computed against the float r_hat the kernels produce).
static double sum_squared_error(const float* values, size_t n, const quant_params* p, int bits, bool symmetric) {
    double sum = 0.0;
    int32_t code_min = quant_code_min(bits, symmetric), code_max = quant_code_max(bits, symmetric);
    bool faulty = fault_enabled_set != 0;
    for (size_t i = 0; i < n; i++) {
        float r_hat = quant_dequantize(quantize_to_code(values[i], p, code_min, code_max, faulty), p);
        double e = (double)values[i] - (double)r_hat;
        sum += e * e;
    }
    return sum;
}

// Candidate ranges for the clipping search: the min/max range times
// 1.00, 0.992, ..., 0.208 (100 shrink factors, as GPTQ's and AWQ's
// reference searches do over a grid from the full range down to ~0.2).
#define CLIP_CANDIDATES 100
#define CLIP_SHRINK_STEP 0.008

quant_params quant_params_for_values(const float* values, size_t n, int bits, bool symmetric, bool clip_search) {
    // Start at 0 (the range always includes 0) and skip NaN: `v < low` is
    // false for NaN.
    float low = 0.0f, high = 0.0f;
    for (size_t i = 0; i < n; i++) {
        if (values[i] < low) low = values[i];
        if (values[i] > high) high = values[i];
    }
    quant_params best = quant_params_for_range(low, high, bits, symmetric);
    if (!clip_search || n == 0) return best;
    // Shrinking the range makes the step smaller for every value at the cost
    // of saturating the few beyond it; keep the shrink with the least MSE.
    // A candidate must be strictly better, so ties keep the wider range and
    // the search can never be worse than min/max (shrink 1.0 is candidate 0).
    double best_error = sum_squared_error(values, n, &best, bits, symmetric);
    for (int k = 1; k < CLIP_CANDIDATES; k++) {
        double shrink = 1.0 - CLIP_SHRINK_STEP * k;
        quant_params candidate =
            quant_params_for_range((float)(shrink * (double)low), (float)(shrink * (double)high), bits, symmetric);
        double error = sum_squared_error(values, n, &candidate, bits, symmetric);
        if (error < best_error) {
            best_error = error;
            best = candidate;
        }
    }
    return best;
}

// ---- error statistics ------------------------------------------------------------------

typedef struct error_tally {
    int64_t n_values;
    int64_t n_clipped;
    double sum_squared; // of r - r_hat
    float max_abs_error;
    bool within_half_step;
} error_tally;

static void tally_value(error_tally* t, float r, float r_hat, const quant_params* p) {
    double e = fabs((double)r - (double)r_hat);
    t->n_values++;
    t->sum_squared += e * e;
    if ((float)e > t->max_abs_error) t->max_abs_error = (float)e;
    if (r >= p->range_min && r <= p->range_max) {
        // r - r_hat is exact in double; only r_hat = s (q - z) was rounded
        // to float, by at most half an ulp of |r_hat|. Allow a few of those.
        double tolerance = 0.5 * (double)p->scale + 4.0 * FLT_EPSILON * ((double)fabsf(r_hat) + (double)p->scale);
        if (!(e <= tolerance)) t->within_half_step = false;
    } else {
        t->n_clipped++;
    }
}

static quant_stats stats_from_tally(const error_tally* t, float scale, int32_t zero_point) {
    quant_stats stats;
    stats.scale = scale;
    stats.zero_point = zero_point;
    stats.n_values = t->n_values;
    stats.n_clipped = t->n_clipped;
    stats.mse = t->n_values > 0 ? t->sum_squared / (double)t->n_values : 0.0;
    stats.max_abs_error = t->max_abs_error;
    stats.within_half_step = t->within_half_step;
    return stats;
}

quant_stats quant_measure(const float* values, size_t n, const quant_params* p, int bits, bool symmetric) {
    error_tally t = {0, 0, 0.0, 0.0f, true};
    int32_t code_min = quant_code_min(bits, symmetric), code_max = quant_code_max(bits, symmetric);
    bool faulty = fault_enabled_set != 0;
    for (size_t i = 0; i < n; i++)
        tally_value(&t, values[i], quant_dequantize(quantize_to_code(values[i], p, code_min, code_max, faulty), p), p);
    return stats_from_tally(&t, p->scale, p->zero_point);
}

// ---- matrices ----------------------------------------------------------------------------

int quant_scheme_validate(const quant_scheme* scheme, int cols, error_info* err) {
    if (!scheme) return error_set(err, "quant scheme: missing (NULL)");
    if (scheme->bits < 2 || scheme->bits > 8)
        return error_set(err, "quant scheme: bits = %d: expected 2..8", scheme->bits);
    if (cols < 1) return error_set(err, "quant scheme: cols = %d: expected at least 1", cols);
    switch (scheme->granularity) {
    case QUANT_PER_TENSOR:
    case QUANT_PER_CHANNEL: return 0;
    case QUANT_PER_GROUP:
        if (scheme->group_size < 1 || cols % scheme->group_size != 0)
            return error_set(err, "quant scheme: group_size = %d: expected a divisor of cols = %d", scheme->group_size,
                             cols);
        return 0;
    }
    return error_set(err, "quant scheme: granularity = %d: expected per-tensor (0), per-channel (1) or per-group (2)",
                     (int)scheme->granularity);
}

int quant_param_count(int rows, int cols, const quant_scheme* scheme) {
    switch (scheme->granularity) {
    case QUANT_PER_TENSOR: return 1;
    case QUANT_PER_CHANNEL: return rows;
    case QUANT_PER_GROUP: return scheme->group_size > 0 ? rows * (cols / scheme->group_size) : 0;
    }
    return 0;
}

int quant_param_index(int row, int col, int rows, int cols, const quant_scheme* scheme) {
    (void)rows;
    switch (scheme->granularity) {
    case QUANT_PER_TENSOR: return 0;
    case QUANT_PER_CHANNEL: return row;
    case QUANT_PER_GROUP:
        return scheme->group_size > 0 ? row * (cols / scheme->group_size) + col / scheme->group_size : 0;
    }
    return 0;
}

int quant_matrix_rtn(const float* w, int rows, int cols, const quant_scheme* scheme, int32_t* codes,
                     quant_params* params, error_info* err) {
    if (quant_scheme_validate(scheme, cols, err)) return -1;
    if (rows < 1) return error_set(err, "quant rtn: rows = %d: expected at least 1", rows);
    if (!w || !codes || !params) return error_set(err, "quant rtn: weights, codes and params must not be NULL");
    // Every set is contiguous in the row-major matrix: the whole matrix, one
    // row, or group_size consecutive values of a row.
    size_t total = (size_t)rows * (size_t)cols;
    int n_sets = quant_param_count(rows, cols, scheme);
    size_t set_length = total / (size_t)n_sets;
    // FAULT_GROUP_TENSOR_MAX: every group gets the (s, z) of the whole matrix.
    bool groups_from_tensor = scheme->granularity == QUANT_PER_GROUP && fault_on(FAULT_GROUP_TENSOR_MAX);
    bool faulty = fault_enabled_set != 0;
    int32_t code_min = quant_code_min(scheme->bits, scheme->symmetric);
    int32_t code_max = quant_code_max(scheme->bits, scheme->symmetric);
    quant_params tensor_params = {0};
    if (groups_from_tensor)
        tensor_params = quant_params_for_values(w, total, scheme->bits, scheme->symmetric, scheme->clip_search);
    for (int k = 0; k < n_sets; k++) {
        const float* set = w + (size_t)k * set_length;
        params[k] = groups_from_tensor ? tensor_params
                                       : quant_params_for_values(set, set_length, scheme->bits, scheme->symmetric,
                                                                 scheme->clip_search);
        for (size_t i = 0; i < set_length; i++)
            codes[(size_t)k * set_length + i] = quantize_to_code(set[i], &params[k], code_min, code_max, faulty);
    }
    return 0;
}

void quant_matrix_dequantize(const int32_t* codes, const quant_params* params, int rows, int cols,
                             const quant_scheme* scheme, float* out) {
    for (int o = 0; o < rows; o++)
        for (int i = 0; i < cols; i++) {
            size_t at = (size_t)o * (size_t)cols + (size_t)i;
            out[at] = quant_dequantize(codes[at], &params[quant_param_index(o, i, rows, cols, scheme)]);
        }
}

quant_stats quant_matrix_stats(const float* w, const int32_t* codes, const quant_params* params, int rows, int cols,
                               const quant_scheme* scheme, int set_index) {
    error_tally t = {0, 0, 0.0, 0.0f, true};
    if (rows < 1 || quant_scheme_validate(scheme, cols, NULL)) return stats_from_tally(&t, 0.0f, 0);
    int n_sets = quant_param_count(rows, cols, scheme);
    if (set_index >= n_sets || set_index < -1) return stats_from_tally(&t, 0.0f, 0);
    // The codes are taken as given (GPTQ's are not the nearest levels), so the
    // error is measured against what they decode to. Each set is one
    // contiguous run of the row-major matrix (see quant_matrix_rtn).
    size_t set_length = (size_t)rows * (size_t)cols / (size_t)n_sets;
    int first = set_index >= 0 ? set_index : 0, last = set_index >= 0 ? set_index : n_sets - 1;
    for (int k = first; k <= last; k++)
        for (size_t at = (size_t)k * set_length; at < (size_t)(k + 1) * set_length; at++)
            tally_value(&t, w[at], quant_dequantize(codes[at], &params[k]), &params[k]);
    if (set_index >= 0) return stats_from_tally(&t, params[set_index].scale, params[set_index].zero_point);
    double scale_sum = 0.0;
    for (int k = 0; k < n_sets; k++)
        scale_sum += (double)params[k].scale;
    return stats_from_tally(&t, (float)(scale_sum / (double)n_sets), 0);
}

// ---- packed formats ------------------------------------------------------------------------
//
// Layout inside the caller's storage (all offsets in bytes):
//   [0, 2 G)             scales_f16   (rows, groups_per_row) fp16    G = rows * groups_per_row
//   [2 G, 2 G + P)       values       (rows, cols) int8 / uint8, or (rows, (cols + 1) / 2) nibbles
//   [2 G + P, + G)       zero_points  (rows, groups_per_row) uint8, asymmetric only
// The fp16 scales come first so that they are 2-byte aligned whatever the
// payload size P (an odd rows * cols would misalign anything after it).

static int packed_groups_per_row(int cols, const quant_scheme* scheme) {
    return scheme->granularity == QUANT_PER_GROUP ? cols / scheme->group_size : 1;
}

static uint64_t packed_payload_bytes(int rows, int cols, int bits) {
    uint64_t row_bytes = bits == 8 ? (uint64_t)cols : ((uint64_t)cols + 1) / 2;
    return (uint64_t)rows * row_bytes;
}

uint64_t quant_packed_bytes(int rows, int cols, const quant_scheme* scheme) {
    if (!scheme || (scheme->bits != 8 && scheme->bits != 4) || rows < 1) return 0;
    if (quant_scheme_validate(scheme, cols, NULL)) return 0;
    uint64_t groups = (uint64_t)rows * (uint64_t)packed_groups_per_row(cols, scheme);
    return packed_payload_bytes(rows, cols, scheme->bits) + 2 * groups + (scheme->symmetric ? 0 : groups);
}

static int pack_check_arguments(const int32_t* codes, const quant_params* params, int rows, int cols,
                                const quant_scheme* scheme, const void* storage, const weight_matrix* out,
                                error_info* err) {
    if (quant_scheme_validate(scheme, cols, err)) return -1;
    if (scheme->bits != 8 && scheme->bits != 4)
        return error_set(err, "quant pack: bits = %d: the packed formats hold 8 (WEIGHT_I8) or 4 (WEIGHT_I4) bits",
                         scheme->bits);
    if (rows < 1) return error_set(err, "quant pack: rows = %d: expected at least 1", rows);
    if (!codes || !params || !storage || !out)
        return error_set(err, "quant pack: codes, params, storage and out must not be NULL");
    if ((uintptr_t)storage % _Alignof(uint16_t) != 0)
        return error_set(err, "quant pack: storage must be 2-byte aligned for the fp16 scales");
    return 0;
}

// Per-group scales and zero-points. Per tensor and per channel repeat
// their one set in every group (one group per row).
static int pack_group_params(const quant_params* params, int rows, int cols, const quant_scheme* scheme,
                             uint16_t* scales_f16, uint8_t* zero_points, error_info* err) {
    int groups_per_row = packed_groups_per_row(cols, scheme);
    int group_size = cols / groups_per_row;
    int32_t code_max = quant_code_max(scheme->bits, scheme->symmetric);
    for (int o = 0; o < rows; o++)
        for (int g = 0; g < groups_per_row; g++) {
            int k = quant_param_index(o, g * group_size, rows, cols, scheme);
            const quant_params* p = &params[k];
            uint16_t half = fp32_to_fp16(p->scale);
            // The statistics were computed with this exact scale; a scale
            // that fp16 would change would make the kernels disagree with them.
            if (!(p->scale > 0.0f) || fp16_to_fp32(half) != p->scale)
                return error_set(err, "quant pack: scale %g of set %d: expected a positive fp16-representable value",
                                 (double)p->scale, k);
            scales_f16[(size_t)o * (size_t)groups_per_row + (size_t)g] = half;
            if (scheme->symmetric) {
                if (p->zero_point != 0)
                    return error_set(err, "quant pack: zero-point %d of set %d: expected 0 when symmetric",
                                     (int)p->zero_point, k);
            } else {
                if (p->zero_point < 0 || p->zero_point > code_max)
                    return error_set(err, "quant pack: zero-point %d of set %d: expected 0..%d", (int)p->zero_point, k,
                                     (int)code_max);
                zero_points[(size_t)o * (size_t)groups_per_row + (size_t)g] = (uint8_t)p->zero_point;
            }
        }
    return 0;
}

// Codes: int8 / uint8 as they are; INT4 as nibbles (symmetric q + 8),
// column 2j in the low nibble of byte j and column 2j + 1 in the high.
static int pack_codes(const int32_t* codes, int rows, int cols, int bits, bool symmetric, uint8_t* payload,
                      error_info* err) {
    int32_t code_min = quant_code_min(bits, symmetric), code_max = quant_code_max(bits, symmetric);
    size_t row_bytes = bits == 8 ? (size_t)cols : ((size_t)cols + 1) / 2;
    memset(payload, 0, (size_t)rows * row_bytes); // an odd cols leaves the last high nibble 0
    for (int o = 0; o < rows; o++)
        for (int i = 0; i < cols; i++) {
            int32_t q = codes[(size_t)o * (size_t)cols + (size_t)i];
            if (q < code_min || q > code_max)
                return error_set(err, "quant pack: code %d at (%d, %d): expected %d..%d", (int)q, o, i, (int)code_min,
                                 (int)code_max);
            uint8_t* row = payload + (size_t)o * row_bytes;
            if (bits == 8) {
                row[i] = (uint8_t)(q & 0xff); // int8 as two's complement, uint8 as is
            } else {
                uint8_t nibble = (uint8_t)(symmetric ? q + 8 : q);
                row[i / 2] |= (uint8_t)(i % 2 == 0 ? nibble : nibble << 4);
            }
        }
    return 0;
}

int quant_pack(const int32_t* codes, const quant_params* params, int rows, int cols, const quant_scheme* scheme,
               void* storage, weight_matrix* out, error_info* err) {
    if (pack_check_arguments(codes, params, rows, cols, scheme, storage, out, err)) return -1;

    int bits = scheme->bits;
    bool symmetric = scheme->symmetric;
    int groups_per_row = packed_groups_per_row(cols, scheme);
    size_t n_groups = (size_t)rows * (size_t)groups_per_row;
    uint16_t* scales_f16 = (uint16_t*)storage;           // (rows, groups_per_row)
    uint8_t* payload = (uint8_t*)storage + 2 * n_groups; // see the layout above
    uint8_t* zero_points =
        symmetric ? NULL : payload + packed_payload_bytes(rows, cols, bits); // (rows, groups_per_row)
    if (pack_group_params(params, rows, cols, scheme, scales_f16, zero_points, err)) return -1;
    if (pack_codes(codes, rows, cols, bits, symmetric, payload, err)) return -1;

    memset(out, 0, sizeof *out);
    out->dtype = bits == 8 ? WEIGHT_I8 : WEIGHT_I4;
    out->rows = rows;
    out->cols = cols;
    out->group_size = cols / groups_per_row;
    out->values = payload;
    out->scales = NULL;
    out->scales_f16 = scales_f16;
    out->zero_points = zero_points;
    out->activation_bits = 0;
    out->f16_tiles = NULL;
    out->f32_tiles = NULL;
    return 0;
}
