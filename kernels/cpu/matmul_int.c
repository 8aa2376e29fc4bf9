// matmul_int: the packed integer formats (WEIGHT_I8, WEIGHT_I4) at the scalar
// level, the W8A8 activation quantizer, and the reduction order of every
// level (the SIMD kernels are in matmul_int_avx2.c and matmul_int_avx512.c).
//
// Notation: row o of W has G = cols / group_size groups; group g covers
// columns [g * group_size, (g + 1) * group_size) and has the fp16 scale
// s_g and the zero-point z_g (8 for symmetric INT4, 0 for symmetric INT8).
// c_i = q_i - z_g is the integer a code stands for (|c_i| <= 255), exact in
// fp32 and in int32.
//
// ---- W8A16 / W4A16 (activation_bits 0): 16-bit activations -----------------
// out[r][o] = sum_g s_g * sum_{i in g} c_i * x[r][i], where W4A16 first
// rounds every activation to bf16 (fp32_round_to_bf16, at every level) and
// W8A16 keeps them in fp32. Why the difference: with bf16 activations the
// AVX-512 level can use vdpbf16ps, which halves the instructions of the
// compute-bound W4A16 kernel (below); W8A16's kernel waits on memory, so
// it keeps the extra precision for free. A bf16 times |c_i| <= 255 is exact
// in fp32, so every product below is exact for W4A16. Reduced like this:
//   scalar:  group_sum = 0; for i in g in order: group_sum += (float)c_i * x_i
//            (product rounded, then sum rounded); total += group_sum * s_g
//            (rounded twice), groups in order, total starting at +0.
//   AVX2:    per group an 8-lane accumulator from +0. INT8: steps of 8
//            columns, acc = fma(c[i..i+7], x[i..i+7], acc) (lane l: columns
//            i = l mod 8); the group's last < 8 columns zero-padded, one more
//            fma. INT4: steps of 16 columns, lane l takes column s + 2l then
//            s + 2l + 1 (two fmas, in that order) for each step s; the last
//            partial step zero-padded. Then total = fma(acc, s_g, total)
//            lane-wise, groups in order, and hsum8(total) at the end.
//   AVX-512: the same with 16 lanes: INT8 steps of 16 columns, INT4 steps of
//            32 (lane l: s + 2l, then s + 2l + 1); tails loaded masked, as 0;
//            hsum16 at the end. INT4 with a group size that is a multiple
//            of 128: steps of 128 columns, lane l takes s + 8l + k for k =
//            4, 0, 5, 1, 6, 2, 7, 3 in that order (the phase kernels: the
//            order of vdpbf16ps, so that AVX512_BF16 changes no bit).
//            INT4 with groups of 32 or 64 in rows of a multiple of 128
//            columns: the same steps and order, but lane l's 8
//            columns of a step lie in one group, so every step ends with
//            total = fma(acc, s of lane l's group, total) lane-wise and acc
//            restarts from +0.
// Each level rounds differently (they agree to about cols * 2^-24 relative
// to sum |w x|); one level always gives the same bits, whatever the batch,
// the tile, the row's position or the thread count.
//
// ---- W8A8 (activation_bits 8, symmetric INT8 only) -------------------------
// Each activation row is quantized once per call (matmul_quantize_row):
//   a_scale = max_i |x_i| / 127,  a_i = round_half_even(x_i / a_scale)
// clamped to [-127, 127]; a zero row has a_scale 0 and codes 0 (its outputs
// are 0, no NaN); a row holding NaN or inf has a_scale NaN and codes 0 (its
// outputs are NaN). Then per output, at every level:
//   isum_g = sum_{i in g} a_i * q_i          exact int32 (any order)
//   total += ((float)isum_g * s_g) * a_scale  rounded three times, groups in order
// Integer sums are exact, so the levels differ only in how fast they get
// isum_g: W8A8 gives the same bits at every level. isum_g fits int32 while
// group_size <= 2^31 / 127^2 = 133143 (larger groups wrap, alike everywhere).
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_simd.h"

#include <float.h>
#include <stdbool.h>
#include <math.h>
#include <string.h>

// ---- W8A16 / W4A16, scalar -------------------------------------------------

// Output o for one activation row x (w->cols floats), in the scalar order.
// W4A16's x is rounded to bf16 here when round_x, else it already is.
static float dot_int_row(const weight_matrix* w, int o, const float* x, bool round_x) {
    const int cols = w->cols, group_size = w->group_size;
    const size_t n_groups = (size_t)(cols / group_size), first_group = (size_t)o * n_groups;
    const uint8_t* row = (const uint8_t*)w->values + (size_t)o * int_row_bytes(w);
    const int asymmetric = w->zero_points != NULL;
    float total = 0.0f;
    for (size_t g = 0; g < n_groups; g++) {
        const int begin = (int)g * group_size, end = begin + group_size;
        const int zero = int_zero_point(w, first_group + g);
        float group_sum = 0.0f;
        if (w->dtype == WEIGHT_I4) {
            for (int i = begin; i < end; i++)
                group_sum += (float)(i4_nibble(row, i) - zero) * (round_x ? fp32_round_to_bf16(x[i]) : x[i]);
        } else if (asymmetric) {
            for (int i = begin; i < end; i++)
                group_sum += (float)(row[i] - zero) * x[i];
        } else {
            for (int i = begin; i < end; i++)
                group_sum += (float)(int8_t)row[i] * x[i];
        }
        total += group_sum * fp16_to_fp32(w->scales_f16[first_group + g]);
    }
    return total;
}

static void int_outputs(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end,
                        bool round_x) {
    const int d_out = w->rows, d_in = w->cols;
    for (int o = o_begin; o < o_end; o++) { // outputs outermost: one weight row stays in cache
        for (int r = 0; r < n_rows; r++)
            out[(size_t)r * (size_t)d_out + (size_t)o] = dot_int_row(w, o, in + (size_t)r * (size_t)d_in, round_x);
    }
}

void matmul_i4_rounded_scalar(float* out, const float* x_bf16, int n_rows, const weight_matrix* w, int o_begin,
                              int o_end) {
    int_outputs(out, x_bf16, n_rows, w, o_begin, o_end, false);
}

// W4A16's rows not rounded yet (matmul_at_level could not allocate them
// rounded) are rounded per product here: the same values, more slowly.
void matmul_int_scalar(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end) {
    int_outputs(out, in, n_rows, w, o_begin, o_end, w->dtype == WEIGHT_I4);
}

void int_row_to_f32(float* out, const weight_matrix* w, int row) {
    const size_t n_groups = (size_t)(w->cols / w->group_size), first_group = (size_t)row * n_groups;
    const uint8_t* codes = (const uint8_t*)w->values + (size_t)row * int_row_bytes(w);
    for (int i = 0; i < w->cols; i++) {
        size_t g = first_group + (size_t)(i / w->group_size);
        int zero = int_zero_point(w, g);
        int c = w->dtype == WEIGHT_I4 ? i4_nibble(codes, i) - zero
                : w->zero_points      ? codes[i] - zero
                                      : (int8_t)codes[i];
        out[i] = fp16_to_fp32(w->scales_f16[g]) * (float)c;
    }
}

// ---- W8A8: the activation quantizer ----------------------------------------

// a_scale of a row: max |x| / 127; NaN when the row holds a NaN or an inf.
static float activation_scale(const float* x, int cols) {
    float max_abs = 0.0f;
    int finite = 1;
    for (int i = 0; i < cols; i++) {
        float a = fabsf(x[i]);
        if (!(a <= FLT_MAX)) finite = 0;
        max_abs = a > max_abs ? a : max_abs;
    }
    return finite ? max_abs / 127.0f : NAN;
}

// Codes exist only for a finite scale > 0: otherwise they are all 0 (a zero
// row, a row so small that max / 127 underflows, or a non-finite one).
static int scale_quantizes(float scale) { return scale > 0.0f && scale <= FLT_MAX; }

void matmul_quantize_row(int8_t* codes, float* scale, const float* x, int cols) {
    float a_scale = activation_scale(x, cols);
    *scale = a_scale;
    if (!scale_quantizes(a_scale)) {
        memset(codes, 0, (size_t)(cols > 0 ? cols : 0));
        return;
    }
    for (int i = 0; i < cols; i++)
        codes[i] = quantize_activation(x[i], a_scale);
}

// ---- W8A8, scalar ------------------------------------------------------------

// isum in uint32: a wrap (group_size > 133143) is then defined, and equals
// the SIMD kernels' two's-complement wrap.
void matmul_w8a8_scalar(float* out, const int8_t* codes, const float* code_scales, int n_rows, const weight_matrix* w,
                        int o_begin, int o_end) {
    const int d_out = w->rows, cols = w->cols, group_size = w->group_size;
    const size_t n_groups = (size_t)(cols / group_size);
    for (int o = o_begin; o < o_end; o++) {
        const int8_t* row = (const int8_t*)w->values + (size_t)o * (size_t)cols;
        const uint16_t* scales = w->scales_f16 + (size_t)o * n_groups;
        for (int r = 0; r < n_rows; r++) {
            const int8_t* a = codes + (size_t)r * (size_t)cols;
            float total = 0.0f;
            for (size_t g = 0; g < n_groups; g++) {
                uint32_t isum = 0;
                for (int i = (int)g * group_size; i < ((int)g + 1) * group_size; i++)
                    isum += (uint32_t)(a[i] * row[i]);
                total += w8a8_term((int32_t)isum, fp16_to_fp32(scales[g]), code_scales[r]);
            }
            out[(size_t)r * (size_t)d_out + (size_t)o] = total;
        }
    }
}

void matmul_w8a8_unbuffered(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end) {
    const int d_out = w->rows, cols = w->cols, group_size = w->group_size;
    const size_t n_groups = (size_t)(cols / group_size);
    for (int r = 0; r < n_rows; r++) {
        const float* x = in + (size_t)r * (size_t)cols;
        const float a_scale = activation_scale(x, cols);
        const int quantizes = scale_quantizes(a_scale);
        for (int o = o_begin; o < o_end; o++) {
            const int8_t* row = (const int8_t*)w->values + (size_t)o * (size_t)cols;
            const uint16_t* scales = w->scales_f16 + (size_t)o * n_groups;
            float total = 0.0f;
            for (size_t g = 0; g < n_groups; g++) {
                uint32_t isum = 0;
                for (int i = (int)g * group_size; quantizes && i < ((int)g + 1) * group_size; i++)
                    isum += (uint32_t)(quantize_activation(x[i], a_scale) * row[i]);
                total += w8a8_term((int32_t)isum, fp16_to_fp32(scales[g]), a_scale);
            }
            out[(size_t)r * (size_t)d_out + (size_t)o] = total;
        }
    }
}
