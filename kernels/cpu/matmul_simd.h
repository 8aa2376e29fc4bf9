// matmul_simd: the SIMD kernels behind matmul_parallel (internal to kernels/cpu;
// engine code calls matmul.h only).
//
// Each function computes out[r][o] for every batch row r < n_rows and every
// output o in [o_begin, o_end), with the same shapes as matmul():
// out (n_rows, w->rows) floats, in (n_rows, w->cols) floats.
//
// The batch-invariance contract (matmul.h) holds for each function on its
// own: out[r][o] is computed by the same instructions in the same order
// whatever n_rows, r, o_begin and o_end are. Only call them once
// cpu_features says the CPU has the level (x86-64 builds only).
#ifndef SERVELAB_MATMUL_SIMD_H
#define SERVELAB_MATMUL_SIMD_H

#include "kernels/cpu/matmul.h"

void matmul_f16_avx2(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);
void matmul_q8_avx2(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);
void matmul_f16_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);
void matmul_q8_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);
// WEIGHT_F32 in the scalar loop's exact order (matmul_avx512.c), outputs
// [o_begin, o_begin + 16 * n_blocks).
void matmul_f32_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int n_blocks);
// The same bits from w->f32_tiles (matmul_f32_avx512.c); o_begin a multiple of 16.
void matmul_f32_tiles_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);

// ---- the packed integer formats (WEIGHT_I8, WEIGHT_I4): matmul_int*.c ----------
//
// W8A16 (fp32 activations) and W4A16 (activations rounded to bf16), per
// level; the reduction orders are written out at the top of matmul_int.c.
void matmul_int_scalar(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);
void matmul_i8_avx2(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);
void matmul_i4_avx2(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);
void matmul_i8_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);
void matmul_i4_avx512(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);

// W4A16 on rows already rounded to bf16 (x_bf16: (n_rows, w->cols) floats,
// each a bf16 value), as matmul_at_level prepares them once per call: the
// same bits as the functions above on the unrounded rows, which round them
// as they load them. The AVX-512 one is not the phase kernel (the matrices
// of matmul_i4_uses_phase_order take that). matmul_round_to_bf16_avx2: dst[i] =
// fp32_round_to_bf16(src[i]), the same bits.
void matmul_i4_rounded_scalar(float* out, const float* x_bf16, int n_rows, const weight_matrix* w, int o_begin,
                              int o_end);
void matmul_i4_rounded_avx2(float* out, const float* x_bf16, int n_rows, const weight_matrix* w, int o_begin,
                            int o_end);
void matmul_i4_rounded_avx512(float* out, const float* x_bf16, int n_rows, const weight_matrix* w, int o_begin,
                              int o_end);
void matmul_round_to_bf16_avx2(float* dst, const float* src, size_t count);

// INT4 in the matrices of matmul_i4_uses_phase_order at AVX-512 has its
// own column order (matmul_int.c, "the phase kernel"):
// the activations are put in that order once per call, by
// matmul_i4_phase_order_avx512 into phased (n_rows, cols), and
// matmul_i4_phased_avx512 takes them in that order. matmul_i4_avx512 on
// plain activations gives the same bits (it reorders per call itself).
void matmul_i4_phase_order_avx512(float* phased, const float* in, int n_rows, int cols);
void matmul_i4_phased_avx512(float* out, const float* x_phase, int n_rows, const weight_matrix* w, int o_begin,
                             int o_end);
// The same order with AVX512_BF16 (vdpbf16ps), on activations put once per
// call into bf16 words by matmul_i4_bf16_order_avx512 (words: (n_rows,
// cols)): the same bits as matmul_i4_phased_avx512, in half the
// instructions. Only call it when cpu_features says avx512bf16.
void matmul_i4_bf16_order_avx512(uint16_t* words, const float* in, int n_rows, int cols);
void matmul_i4_bf16_avx512(float* out, const uint16_t* x_words, int n_rows, const weight_matrix* w, int o_begin,
                           int o_end);

// W8A8 on activations already quantized by matmul_quantize_row: codes
// (n_rows, w->cols) int8, code_scales (n_rows). The integer group sums are
// exact and the float combination is w8a8_term() in group order at every
// level, so all three give the same bits.
void matmul_w8a8_scalar(float* out, const int8_t* codes, const float* code_scales, int n_rows, const weight_matrix* w,
                        int o_begin, int o_end);
void matmul_w8a8_avx2(float* out, const int8_t* codes, const float* code_scales, int n_rows, const weight_matrix* w,
                      int o_begin, int o_end);
void matmul_w8a8_avx512vnni(float* out, const int8_t* codes, const float* code_scales, int n_rows,
                            const weight_matrix* w, int o_begin, int o_end);

// W8A8 straight from fp32 activations, quantizing every value where it is
// used (no scratch memory; about 5x slower): what matmul_at_level falls back
// to when it cannot allocate the codes. Same bits as the kernels above.
void matmul_w8a8_unbuffered(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);

// ---- group-wise W8A8 / W4A8 (matmul_is_a8_blocks): matmul_a8*.c ---------------
//
// The activations are prepared once per call by matmul_a8_prepare_row into
// codes (n_rows, matmul_a8_code_stride(cols)) int8 in the kernel's column
// order (a8_order), scales (n_rows, n_blocks) fp32 and zero_sums (n_rows,
// n_blocks) int32 (the VNNI kernel's correction: the weights' unsigned
// offset times the block's code sum). n_blocks = cols / activation_block.
typedef enum a8_order {
    A8_COLUMNS,    // codes in column order (the scalar kernel, and the VNNI kernel for INT8)
    A8_NIBBLES,    // per 128 columns: the 64 even columns, then the 64 odd ones (the VNNI kernel for INT4)
    A8_NIBBLES_32, // per 32 columns: the 16 even columns, then the 16 odd ones (the AVX2 kernel for INT4)
} a8_order;

// Bytes of one prepared row of codes: cols rounded up to 128, zero-padded.
static inline size_t matmul_a8_code_stride(int cols) { return ((size_t)cols + 127) / 128 * 128; }

// Whether the VNNI kernel takes this matrix: blocks of 32 and groups of
// 32, 64 or a multiple of 128 (one step of it is 128 columns).
static inline bool matmul_a8_vnni_fits(const weight_matrix* w) {
    return w->activation_block == 32 && (w->group_size == 32 || w->group_size == 64 || w->group_size % 128 == 0);
}

void matmul_a8_prepare_row(int8_t* codes, float* scales, int32_t* zero_sums, const float* x, const weight_matrix* w,
                           a8_order order);
void matmul_a8_scalar(float* out, const int8_t* codes, const float* scales, int n_rows, const weight_matrix* w,
                      int o_begin, int o_end);
// AVX2 (maddubs / madd), activation_block 32 only.
void matmul_a8_avx2(float* out, const int8_t* codes, const float* scales, const int32_t* zero_sums, int n_rows,
                    const weight_matrix* w, int o_begin, int o_end);
void matmul_a8_avx512vnni(float* out, const int8_t* codes, const float* scales, const int32_t* zero_sums, int n_rows,
                          const weight_matrix* w, int o_begin, int o_end);
// Straight from fp32 rows, each block quantized where it is used (no
// scratch; far slower): the fallback without memory, the same bits.
void matmul_a8_unbuffered(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin, int o_end);

// matmul_quantize_row with AVX2: the same codes and scale, bit for bit.
void matmul_quantize_row_avx2(int8_t* codes, float* scale, const float* x, int cols);

// weight_row_to_f32 for WEIGHT_I8 / WEIGHT_I4: out[i] = scale * (q - zero).
void int_row_to_f32(float* out, const weight_matrix* w, int row);

// `UNROLL_TILE for (...)`: a loop over a tile's outputs or rows (at most
// 8, a constant at every call site) is unrolled completely, so the tile's
// accumulators live in registers, not in an array in memory. GCC takes a
// count; clang's plain "unroll" means completely.
#if defined(__clang__)
#define UNROLL_TILE _Pragma("unroll")
#else
#define UNROLL_TILE _Pragma("GCC unroll 8")
#endif

// Q8_0 tiles may share one column split between several weight rows only
// when every row splits into groups at the same columns: a row holds whole
// groups (cols % group_size == 0) or a group holds whole rows.
static inline int q8_rows_share_segments(const weight_matrix* w) {
    return w->cols % w->group_size == 0 || w->group_size % w->cols == 0;
}

// ---- packed integer helpers, shared by every level ----------------------------

// Asks for the cache line `ahead` bytes past p (a hint: it never faults, so
// it may point past the matrix; the address is computed as an integer).
// The packed kernels read a tile of C whole rows, which lie next to each
// other in memory, and fetch the next tile's bytes while they work on this
// one: INT4 rows of 2048 columns are 16 cache lines, too short for the
// hardware prefetcher to lock on to (the 1-row INT4 matvec on 2 Zen 5
// cores: 21 GB/s without this, 33 with it, where stream-read is 35).
static inline void prefetch_ahead(const void* p, size_t ahead) {
    __builtin_prefetch((const void*)((uintptr_t)p + ahead));
}

// How many tiles ahead the fp16 kernels prefetch their weights, for a tile
// of R batch rows: rows of 768 halves are 24 cache lines, too short for the
// hardware prefetcher to lock on to. A tile of more rows takes longer, so
// the same lead in time is fewer tiles. Measured on 2 Zen 5 cores, the 85
// matrices of stories110m in fp16, interleaved in one process: 1 row 69.5
// GB/s one tile ahead against 62.1 two ahead; 4 rows 64.2 one ahead against
// 68.3 two ahead.
#define F16_PREFETCH_TILES(R) ((R) <= 2 ? 1 : 2)

// Halves one weight row takes in the fp16 tile layout (matmul.h): its
// columns rounded up to whole steps of 16. A group of 4 rows is 4 of these.
static inline size_t f16_tile_row_halves(int cols) { return (size_t)(cols + 15) / 16 * 16; }

// Group-wise int8 activations (W8A8 on symmetric INT8, W4A8 on symmetric
// INT4): activation_bits 8 and an activation block that divides the group.
static inline bool matmul_is_a8_blocks(const weight_matrix* w) {
    return (w->dtype == WEIGHT_I8 || w->dtype == WEIGHT_I4) && w->activation_bits == 8 && w->zero_points == NULL &&
           w->activation_block > 0 && w->group_size % w->activation_block == 0;
}

// Per-token W8A8 runs only for symmetric INT8 weights without a group-wise
// activation block; any other matrix with activation_bits = 8 and no
// group-wise block keeps its activations in float.
static inline bool matmul_is_w8a8(const weight_matrix* w) {
    return w->dtype == WEIGHT_I8 && w->activation_bits == 8 && w->zero_points == NULL && !matmul_is_a8_blocks(w);
}

// Whether WEIGHT_I4 at AVX-512 runs the phase kernel (one step of it is
// 128 columns): groups of a multiple of 128 columns, or groups of 32 or 64
// in rows of a multiple of 128 columns (a step then holds 4 or 2 whole
// groups).
static inline bool matmul_i4_uses_phase_order(const weight_matrix* w) {
    if (w->dtype != WEIGHT_I4) return false;
    if (w->group_size % 128 == 0) return true;
    return (w->group_size == 32 || w->group_size == 64) && w->cols % 128 == 0;
}

// Bytes of one packed row: cols codes, or two INT4 codes per byte.
static inline size_t int_row_bytes(const weight_matrix* w) {
    return w->dtype == WEIGHT_I4 ? ((size_t)w->cols + 1) / 2 : (size_t)w->cols;
}

// The code that decodes to 0 for group `index` of the matrix (row * groups
// + group): the stored zero-point, 8 for symmetric INT4 (codes stored as
// q + 8), 0 for symmetric INT8 (whose codes are signed).
static inline int int_zero_point(const weight_matrix* w, size_t index) {
    if (w->zero_points) return w->zero_points[index];
    return w->dtype == WEIGHT_I4 ? 8 : 0;
}

// The 4-bit code of column `col` of a packed INT4 row.
static inline int i4_nibble(const uint8_t* row, int col) {
    uint8_t byte = row[col >> 1];
    return col & 1 ? byte >> 4 : byte & 0x0f;
}

// Columns [col, col + n) of a packed INT4 row, repacked into n_bytes bytes
// as if they started a row (column col in the low nibble of byte 0), the
// nibbles past n zero. The SIMD kernels' slow path: a group's last partial
// step, and groups that start at an odd column (odd group_size).
static inline void repack_i4(uint8_t* bytes, int n_bytes, const uint8_t* row, int col, int n) {
    for (int j = 0; j < n_bytes; j++)
        bytes[j] = 0;
    for (int j = 0; j < n; j++)
        bytes[j >> 1] |= (uint8_t)(i4_nibble(row, col + j) << (4 * (j & 1)));
}

// One activation code: x / scale, clamped to [-127, 127] the way MAXPS /
// MINPS do it (v > lo ? v : lo), rounded half to even by adding and
// subtracting 1.5 * 2^23 (exact for |v| < 2^22; what CVTPS2DQ does in the
// default rounding mode). Only called with a finite scale > 0.
static inline int8_t quantize_activation(float x, float scale) {
    float v = x / scale;
    v = v > -127.0f ? v : -127.0f;
    v = v < 127.0f ? v : 127.0f;
    v = (v + 12582912.0f) - 12582912.0f;
    return (int8_t)v;
}

// One group's share of a W8A8 output: (float)isum * w_scale, rounded, then
// times a_scale, rounded; the caller adds it to the running total. Separate
// statements, so no compiler fuses them into an FMA (-std=c11 turns GCC's
// contraction off; clang contracts only within one expression): every
// level computes these same three roundings.
static inline float w8a8_term(int32_t isum, float w_scale, float a_scale) {
    float term = (float)isum * w_scale;
    term = term * a_scale;
    return term;
}

#endif
