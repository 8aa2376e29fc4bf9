// matmul_a8: group-wise W8A8 and W4A8 (activation_bits 8, activation_block
// B > 0): the activation quantizer, the scalar kernel, and the reduction
// order every level follows (the SIMD kernels: matmul_a8_avx2.c and
// matmul_a8_avx512.c, which needs AVX512_VNNI).
//
// The scheme of llama.cpp's q8_0 / q4_0 CPU path: the activations are
// quantized once per call to int8 with one scale per block of B columns,
// then every block's dot product with the weights is an integer sum.
//
// ---- the activations -------------------------------------------------------
// Block b of a row (columns [b * B, (b + 1) * B)) is quantized as a whole
// row is for per-token W8A8 (matmul_quantize_row, matmul_int.c):
//   a_scale_b = max_{i in b} |x_i| / 127,  a_i = round_half_even(x_i / a_scale_b)
// clamped to [-127, 127]; a zero block has a_scale_b 0 and codes 0, a block
// holding NaN or inf has a_scale_b NaN and codes 0.
//
// ---- the order, at every level ---------------------------------------------
// B divides group_size, so block b lies in one weight group g(b) = b * B /
// group_size, with fp16 scale s_g. c_i = q_i (INT8) or nibble_i - 8 (INT4).
//   isum_b = sum_{i in b} c_i * a_i              exact int32 (any order)
//   term_b = ((float)isum_b * s_g(b)) * a_scale_b  (w8a8_term: rounded twice)
//   T[b mod 4] += term_b    four running totals from +0, blocks in order
//   out = (T[0] + T[2]) + (T[1] + T[3])
// Why four totals: the VNNI kernel finishes 4 blocks (128 columns) of 4
// outputs in one 16-lane vector, lane 4k + c holding block k of output c,
// so each lane keeps its own total (one vector add per 4 x 4 block sums
// instead of 16 scalar ones). Integer sums are exact and the float steps
// are the same per element, so every level gives the same bits, whatever
// the batch, the row's position, the tile or the thread count.
// |isum_b| <= B * 127 * 128 fits int32 while B <= 132104.
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_simd.h"

#include <float.h>
#include <math.h>
#include <string.h>

void matmul_quantize_row_blocks(int8_t* codes, float* scales, const float* x, int cols, int block) {
    for (int b = 0; b * block < cols; b++)
        matmul_quantize_row(codes + (size_t)b * (size_t)block, &scales[b], x + (size_t)b * (size_t)block, block);
}

// The offset that makes a weight code unsigned for vpdpbusd (u8 x s8):
// INT8 codes are stored signed and read as u = q + 128 (q ^ 0x80); INT4
// nibbles are q + 8 already. sum c a = sum u a - offset * sum a.
static int32_t unsigned_offset(const weight_matrix* w) { return w->dtype == WEIGHT_I4 ? 8 : 128; }

void matmul_a8_prepare_row(int8_t* codes, float* scales, int32_t* zero_sums, const float* x, const weight_matrix* w,
                           a8_order order) {
    const int cols = w->cols, block = w->activation_block;
    const size_t stride = matmul_a8_code_stride(cols);
    int8_t* plain = codes; // (cols) codes in column order
    int8_t scratch[128];
    for (int b = 0; b * block < cols; b++) {
#if defined(__x86_64__) || defined(__i386__)
        if (cpu_simd_level_selected() >= CPU_SIMD_AVX2)
            matmul_quantize_row_avx2(plain + (size_t)b * (size_t)block, &scales[b], x + (size_t)b * (size_t)block,
                                     block);
        else
#endif
            matmul_quantize_row(plain + (size_t)b * (size_t)block, &scales[b], x + (size_t)b * (size_t)block, block);
        int32_t sum = 0;
        for (int i = b * block; i < (b + 1) * block; i++)
            sum += plain[i];
        zero_sums[b] = sum * unsigned_offset(w);
    }
    memset(codes + cols, 0, stride - (size_t)cols);
    if (order == A8_COLUMNS) return;
    if (order == A8_NIBBLES_32) { // per block of 32: byte j is column 2j, byte 16 + j column 2j + 1
        for (size_t chunk = 0; chunk < stride; chunk += 32) {
            memcpy(scratch, codes + chunk, 32);
            for (int j = 0; j < 16; j++) {
                codes[chunk + (size_t)j] = scratch[2 * j];
                codes[chunk + 16 + (size_t)j] = scratch[2 * j + 1];
            }
        }
        return;
    }
    // A8_NIBBLES, 128 columns at a time: byte 16k + j of the first half is
    // column 32k + 2j (the low nibble of packed byte 16k + j), of the
    // second half column 32k + 2j + 1 (its high nibble).
    for (size_t chunk = 0; chunk < stride; chunk += 128) {
        memcpy(scratch, codes + chunk, 128);
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 16; j++) {
                codes[chunk + (size_t)(16 * k + j)] = scratch[32 * k + 2 * j];
                codes[chunk + 64 + (size_t)(16 * k + j)] = scratch[32 * k + 2 * j + 1];
            }
    }
}

// c_i of column i of weight row `row` (symmetric codes).
static int32_t weight_code(const weight_matrix* w, const uint8_t* row, int i) {
    return w->dtype == WEIGHT_I4 ? i4_nibble(row, i) - 8 : (int8_t)row[i];
}

// isum_b of the block of columns [begin, begin + block) with its codes a
// (block); uint32, so that a wrap would be defined (and equal the SIMD one).
static int32_t block_isum(const weight_matrix* w, const uint8_t* row, int begin, const int8_t* a) {
    uint32_t isum = 0;
    for (int i = 0; i < w->activation_block; i++)
        isum += (uint32_t)(weight_code(w, row, begin + i) * a[i]);
    return (int32_t)isum;
}

// The running totals of the order above, finished.
static float finish_totals(const float totals[4]) { return (totals[0] + totals[2]) + (totals[1] + totals[3]); }

void matmul_a8_scalar(float* out, const int8_t* codes, const float* scales, int n_rows, const weight_matrix* w,
                      int o_begin, int o_end) {
    const int cols = w->cols, block = w->activation_block, n_blocks = cols / block;
    const size_t n_groups = (size_t)(cols / w->group_size), stride = matmul_a8_code_stride(cols);
    for (int o = o_begin; o < o_end; o++) { // outputs outermost: one weight row stays in cache
        const uint8_t* row = (const uint8_t*)w->values + (size_t)o * int_row_bytes(w);
        const uint16_t* w_scales = w->scales_f16 + (size_t)o * n_groups;
        for (int r = 0; r < n_rows; r++) {
            float totals[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int b = 0; b < n_blocks; b++) {
                const int begin = b * block;
                int32_t isum = block_isum(w, row, begin, codes + (size_t)r * stride + (size_t)begin);
                float w_scale = fp16_to_fp32(w_scales[begin / w->group_size]);
                totals[b % 4] += w8a8_term(isum, w_scale, scales[(size_t)r * (size_t)n_blocks + (size_t)b]);
            }
            out[(size_t)r * (size_t)w->rows + (size_t)o] = finish_totals(totals);
        }
    }
}

// The scale matmul_quantize_row gives a block whose max |x| is max_abs
// (INFINITY for a block holding NaN or inf).
static float block_scale(float max_abs) { return max_abs <= FLT_MAX ? max_abs / 127.0f : NAN; }

void matmul_a8_unbuffered(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end) {
    const int cols = w->cols, block = w->activation_block, n_blocks = cols / block;
    const size_t n_groups = (size_t)(cols / w->group_size);
    for (int r = 0; r < n_rows; r++) {
        const float* x = in + (size_t)r * (size_t)cols;
        for (int o = o_begin; o < o_end; o++) {
            const uint8_t* row = (const uint8_t*)w->values + (size_t)o * int_row_bytes(w);
            const uint16_t* w_scales = w->scales_f16 + (size_t)o * n_groups;
            float totals[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int b = 0; b < n_blocks; b++) {
                const int begin = b * block;
                float max_abs = 0.0f, a_scale = 0.0f;
                for (int i = begin; i < begin + block; i++) {
                    float a = fabsf(x[i]);
                    max_abs = !(a <= FLT_MAX) ? INFINITY : a > max_abs ? a : max_abs;
                }
                a_scale = block_scale(max_abs);
                const int quantizes = a_scale > 0.0f && a_scale <= FLT_MAX;
                uint32_t isum = 0;
                for (int i = begin; quantizes && i < begin + block; i++)
                    isum += (uint32_t)(weight_code(w, row, i) * quantize_activation(x[i], a_scale));
                float w_scale = fp16_to_fp32(w_scales[begin / w->group_size]);
                totals[b % 4] += w8a8_term((int32_t)isum, w_scale, a_scale);
            }
            out[(size_t)r * (size_t)w->rows + (size_t)o] = finish_totals(totals);
        }
    }
}
