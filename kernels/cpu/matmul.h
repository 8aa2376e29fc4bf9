// matmul: a batch of activation rows times a weight matrix.
//
//   out[r][o] = sum_i in[r][i] * W[o][i]      for every row r and output o
//
// Weights are row-major [out][in] as in llama2.c checkpoints. The weight
// matrix is read once per call for the whole batch, which is exactly what
// the traffic counter records.
//
// Batch invariance (DESIGN.md): each output element is one dot product
// reduced in an order fixed by the dtype and the SIMD level alone, so
// out[r][o] has the same bits whether the batch holds 1 row or 64, wherever
// row r sits in it, and however many threads share the work (the outputs
// are split between threads; every element is computed by one thread).
//   - WEIGHT_F32: always the scalar loop sum += W[o][i] * x[i], i = 0, 1, ...,
//     as llama2.c's run.c does, so fp32 greedy decoding matches it exactly
//     (the AVX-512 kernels run 16 such loops in the lanes: the same bits).
//   - WEIGHT_F16, WEIGHT_Q8_0: scalar (same loop, fp16 widened / one scale
//     per group), or AVX2 / AVX-512 with the fixed vector order described
//     in matmul_avx2.c and matmul_avx512.c. Different levels round
//     differently; one level always gives the same bits.
//   - WEIGHT_I8, WEIGHT_I4 (W8A16, W4A16, per-token W8A8): the per-group
//     order is documented at the top of matmul_int.c; W8A8's int32 group
//     sums are exact, so it gives the same bits at every level.
//   - Group-wise W8A8 and W4A8 (activation_block > 0): the order at the top
//     of matmul_a8.c; int32 block sums, the same bits at every level.
#ifndef SERVELAB_MATMUL_H
#define SERVELAB_MATMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kernel_traffic.h"
#include "kernels/cpu/thread_pool.h"

typedef enum weight_dtype {
    WEIGHT_F32 = 0,  // float32 values
    WEIGHT_F16 = 1,  // IEEE half values, widened to fp32 in the kernel
    WEIGHT_Q8_0 = 2, // int8 values + one fp32 scale per group (llama2.c export v2)
    WEIGHT_I8 = 3,   // servelab INT8: 8-bit codes + fp16 scale (+ zero-point) per group
    WEIGHT_I4 = 4,   // servelab INT4: two 4-bit codes per byte + fp16 scale (+ zero-point) per group
} weight_dtype;

// The packed integer formats (WEIGHT_I8, WEIGHT_I4). Groups run along a row
// (group_size divides cols; per-channel is group_size = cols), so group g of
// row o covers columns [g * group_size, (g + 1) * group_size).
//   symmetric:  r_hat = scale * q,              q signed: int8 in [-127, 127];
//               int4 in [-7, 7] stored as the nibble q + 8
//   asymmetric: r_hat = scale * (q - zero),     q unsigned: uint8 in [0, 255];
//               int4 nibble in [0, 15]; zero one uint8 per group
// INT4 packing: byte j of a row holds column 2j in its low nibble and
// column 2j + 1 in its high nibble; an odd cols leaves the last high nibble 0;
// each row starts on a new byte (row stride (cols + 1) / 2 bytes).
// Bytes: payload + 2 per group scale + (asymmetric) 1 per group zero-point.
typedef struct weight_matrix {
    weight_dtype dtype;
    int rows;            // output features (d_out)
    int cols;            // input features (d_in)
    int group_size;      // WEIGHT_Q8_0: values per scale over the flattened matrix
                         // (divides rows * cols; a group may span two rows);
                         // WEIGHT_I8/I4: values per scale along a row (divides cols); else 0
    const void* values;  // (rows, cols) of float, uint16_t (fp16), int8_t / uint8_t codes,
                         // or (rows, (cols + 1) / 2) bytes of packed nibbles for WEIGHT_I4
    const float* scales; // WEIGHT_Q8_0: (rows * cols / group_size) fp32; else NULL
    const uint16_t* scales_f16;  // WEIGHT_I8/I4: (rows, cols / group_size) fp16 scales; else NULL
    const uint8_t* zero_points;  // WEIGHT_I8/I4 asymmetric: (rows, cols / group_size); NULL if symmetric
    int activation_bits;         // 0: float activations (fp32; bf16 for WEIGHT_I4, see below);
                                 // 8: int8 activations, quantized at run time (symmetric) once per
                                 // call, products accumulated in int32; see activation_block
    const uint16_t* f16_tiles;   // WEIGHT_F16: the same values again in the tile layout below, which
                                 // the AVX-512 kernel reads instead of `values`; NULL: it reads `values`
    int activation_block;        // with activation_bits 8 and symmetric weights: 0 = one activation
                                 // scale per row (per token; WEIGHT_I8 only: W8A8, matmul_int.c);
                                 // B > 0 dividing group_size = one scale per B columns (group-wise:
                                 // W8A8 on WEIGHT_I8, W4A8 on WEIGHT_I4, matmul_a8.c). Anything else
                                 // leaves the activations in float (WEIGHT_I8 with B not dividing
                                 // group_size: per token)
    const float* f32_tiles;      // WEIGHT_F32: the same values again in the fp32 tile layout below,
                                 // which the AVX-512 kernel reads instead of `values`; NULL: it reads
                                 // `values`
} weight_matrix;

// ---- the fp16 tile layout ---------------------------------------------------------
//
// The AVX-512 fp16 kernel multiplies 4 weight rows at a time, 16 columns
// per step. Row-major, those are 4 streams 2 * cols bytes apart, and each
// row of a decode matrix (768 columns: 24 cache lines) is too short for the
// hardware prefetcher to follow; in the tile layout the same values are one
// stream read front to back. Rows are taken in groups of 4 and each group's
// columns in steps of 16; step k of group g holds the 16 columns of its 4
// rows one after the other:
//   tiles[((g * steps + k) * 4 + c) * 16 + j] = W[4g + c][16k + j]
// with steps = ceil(cols / 16), and +0 where 4g + c >= rows or 16k + j >=
// cols. Shape (ceil(rows / 4), steps, 4, 16) halves. Only the memory order
// changes: each output is still reduced in the order of matmul_avx512.c,
// so the results have the same bits with or without tiles. Measured on 2
// Zen 5 cores, stories110m's 85 matrices through matmul_set_parallel,
// matmul_swiglu_parallel and matmul_parallel as a decode step calls them,
// the two layouts alternating in one process (medians of 21 rounds, 11
// runs): one row 1.10-1.26x the GB/s of the row-major kernel (one run
// 0.99), 4 rows 0.99-1.20x, 16 rows 0.97-1.12x, a 128-row prefill 1.00-1.03x.

// Halves the tile layout of a (rows, cols) matrix takes.
size_t matmul_f16_tile_halves(int rows, int cols);

// Whether the kernels of this process read fp16 tiles (the selected SIMD
// level is AVX-512): only then is a tiled copy worth its memory.
bool matmul_f16_tiles_used(void);

// The tiles of w from row `row` on, for a view of its rows [row, ...): NULL
// where w has none or row is not the first of a group of 4.
const uint16_t* matmul_f16_tiles_from_row(const weight_matrix* w, int row);

// Writes w's values (WEIGHT_F16, row-major) in the tile layout into tiles:
// matmul_f16_tile_halves(w->rows, w->cols) halves.
void matmul_f16_fill_tiles(uint16_t* tiles, const weight_matrix* w);

// ---- the fp32 tile layout ---------------------------------------------------------
//
// The fp32 kernel keeps llama2.c's order (one output's sum runs over the
// columns in order), so it puts 16 outputs side by side, one per lane
// (matmul_f32_avx512.c), and reads the 16 rows' values of one column as one
// 64-byte vector. Rows are taken in groups of 16, and group g holds, column
// after column, the 16 rows' values of that column:
//   tiles[(g * cols + i) * 16 + j] = W[16g + j][i]
// and +0 where 16g + j >= rows. Shape (ceil(rows / 16), cols, 16) floats;
// each group is one stream read front to back. Row-major, the same 16 rows
// are 16 streams and every 16 x 16 block must be transposed in registers
// (matmul_avx512.c's matmul_f32_avx512, the kernel without tiles).
// The tiles are a second copy of the weights: an fp32 model's memory
// doubles where the AVX-512 kernel runs (stories110m: 438 MB + 438 MB),
// as with fp16 tiles; the kernel streams only the tiles.

// Floats the tile layout of a (rows, cols) matrix takes.
size_t matmul_f32_tile_floats(int rows, int cols);

// Whether the kernels of this process read fp32 tiles (the selected SIMD
// level is AVX-512).
bool matmul_f32_tiles_used(void);

// The tiles of w from row `row` on, for a view of its rows [row, ...): NULL
// where w has none or row is not the first of a group of 16.
const float* matmul_f32_tiles_from_row(const weight_matrix* w, int row);

// Writes w's values (WEIGHT_F32, row-major) in the tile layout into tiles:
// matmul_f32_tile_floats(w->rows, w->cols) floats.
void matmul_f32_fill_tiles(float* tiles, const weight_matrix* w);

// Bytes the matrix occupies: payload plus per-group scales.
uint64_t weight_matrix_bytes(const weight_matrix* w);

// What the kernels multiply this matrix's weights with: "int8" (W8A8, W4A8),
// "bf16" (WEIGHT_I4, i.e. W4A16: every activation rounded to bf16 first,
// kernels/cpu/matmul_int.c) or "fp32" (every other format). Sums are fp32
// (int32 for W8A8) in every case.
const char* matmul_activation_format(const weight_matrix* w);

// out: (n_rows, w->rows) floats; in: (n_rows, w->cols) floats. One thread,
// the process's SIMD level (cpu_simd_level_selected()).
void matmul(float* out, const float* in, int n_rows, const weight_matrix* w, kernel_traffic* traffic);

// matmul with the output features split into chunks run on `pool` (NULL:
// the calling thread alone). Same bits as matmul() for any pool size.
void matmul_parallel(float* out, const float* in, int n_rows, const weight_matrix* w, thread_pool* pool,
                     kernel_traffic* traffic);

// One matrix of a set that reads the same input.
typedef struct matmul_output {
    float* out;             // (n_rows, w->rows)
    const weight_matrix* w; // (w->rows, w->cols), cols equal across the set
} matmul_output;

// Most matrices matmul_set_parallel runs in one run of the pool (more are
// run in several).
#define MATMUL_SET_MAX 4

// matmul_parallel of every output of the set on the same input (q, k and v
// of a layer), in one run of the pool: one wait at the end instead of one
// per matrix, and a thread that is done with one matrix's chunks goes on to
// the next's. Every output gets the bits matmul_parallel gives it.
void matmul_set_parallel(const matmul_output* outputs, int n_outputs, const float* in, int n_rows,
                         thread_pool* pool, kernel_traffic* traffic);

// The gated feed-forward: gate = w_gate . in and up = w_up . in, then
// swiglu(gate, up) on every row, as one run of the pool whose chunks each
// compute the same outputs of both matrices and apply SwiGLU to them at
// once (no pass of its own over the hidden activations, no single-threaded
// step between the matmuls and the next). The same bits as two
// matmul_parallel calls and, per row, swiglu() when w_gate is fp32
// (llama2.c's bits) or swiglu_vector() for any other dtype; the same traffic.
// gate, up: (n_rows, w_gate->rows); w_up has w_gate's shape.
void matmul_swiglu_parallel(float* gate, float* up, const float* in, int n_rows, const weight_matrix* w_gate,
                            const weight_matrix* w_up, thread_pool* pool, kernel_traffic* traffic);

// matmul_parallel at an explicit SIMD level, lowered to what the CPU has
// (cpu_simd_level_clamp): for tests and benchmarks that compare levels in
// one process. WEIGHT_F32 ignores the level (always the scalar order; the
// process's level only decides whether 16 outputs run in vector lanes).
void matmul_at_level(float* out, const float* in, int n_rows, const weight_matrix* w, thread_pool* pool,
                     cpu_simd_level level, kernel_traffic* traffic);

// Widens row `row` of w into out (w->cols floats): the embedding lookup.
void weight_row_to_f32(float* out, const weight_matrix* w, int row, kernel_traffic* traffic);

// W8A8 (WEIGHT_I8 symmetric, activation_bits 8): the quantization matmul
// applies to each activation row x (cols floats) before its integer dot
// products: codes (cols) int8 and *scale = max |x| / 127 (the rules for
// zero and non-finite rows, and every format's reduction order, are at the
// top of kernels/cpu/matmul_int.c). For lessons and tests: matmul does this itself.
void matmul_quantize_row(int8_t* codes, float* scale, const float* x, int cols);

// Group-wise W8A8 / W4A8 (activation_block = block > 0): the same rule per
// block of `block` columns: codes (cols) int8, scales (cols / block) floats,
// scales[b] = max |x| over block b / 127 (block divides cols). For lessons
// and tests: matmul does this itself.
void matmul_quantize_row_blocks(int8_t* codes, float* scales, const float* x, int cols, int block);

#endif
