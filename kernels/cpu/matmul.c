#include "kernels/cpu/matmul.h"

#include "base/arena.h"
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/matmul_simd.h"
#include "kernels/cpu/ops.h"

#include <stdlib.h>

void traffic_add(kernel_traffic* total, const kernel_traffic* part) {
    total->weight_bytes_read += part->weight_bytes_read;
    total->kv_bytes_read += part->kv_bytes_read;
    total->kv_bytes_written += part->kv_bytes_written;
    total->activation_bytes += part->activation_bytes;
    total->matmul_flops += part->matmul_flops;
    total->attention_flops += part->attention_flops;
}

static size_t dtype_value_bytes(weight_dtype dtype) {
    switch (dtype) {
    case WEIGHT_F32: return 4;
    case WEIGHT_F16: return 2;
    case WEIGHT_Q8_0: return 1;
    case WEIGHT_I8:
    case WEIGHT_I4: break; // packed rows: int_rows_bytes()
    }
    return 0;
}

const char* matmul_activation_format(const weight_matrix* w) {
    if (matmul_is_w8a8(w) || matmul_is_a8_blocks(w)) return "int8";
    return w->dtype == WEIGHT_I4 ? "bf16" : "fp32";
}

// WEIGHT_I8 / WEIGHT_I4 bytes of `rows` rows: packed codes, then 2 bytes per
// fp16 scale and (asymmetric) 1 per zero-point, one of each per group.
static uint64_t int_rows_bytes(const weight_matrix* w, uint64_t rows) {
    uint64_t groups = rows * (uint64_t)(w->cols / w->group_size);
    return rows * int_row_bytes(w) + groups * sizeof(uint16_t) + (w->zero_points ? groups : 0);
}

uint64_t weight_matrix_bytes(const weight_matrix* w) {
    if (w->dtype == WEIGHT_I8 || w->dtype == WEIGHT_I4) return int_rows_bytes(w, (uint64_t)w->rows);
    uint64_t count = (uint64_t)w->rows * (uint64_t)w->cols;
    uint64_t bytes = count * dtype_value_bytes(w->dtype);
    if (w->dtype == WEIGHT_Q8_0) bytes += count / (uint64_t)w->group_size * sizeof(float);
    return bytes;
}

// ---- the fp16 tile layout (matmul.h) -----------------------------------------

size_t matmul_f16_tile_halves(int rows, int cols) { return (size_t)((rows + 3) / 4) * 4 * f16_tile_row_halves(cols); }

bool matmul_f16_tiles_used(void) { return cpu_simd_level_selected() == CPU_SIMD_AVX512; }

const uint16_t* matmul_f16_tiles_from_row(const weight_matrix* w, int row) {
    if (!w->f16_tiles || row % 4 != 0) return NULL;
    return w->f16_tiles + (size_t)row * f16_tile_row_halves(w->cols);
}

void matmul_f16_fill_tiles(uint16_t* tiles, const weight_matrix* w) {
    const uint16_t* values = w->values; // (rows, cols)
    const int steps = (w->cols + 15) / 16;
    for (int g = 0; g < (w->rows + 3) / 4; g++)
        for (int k = 0; k < steps; k++)
            for (int c = 0; c < 4; c++) {
                uint16_t* to = tiles + (((size_t)g * (size_t)steps + (size_t)k) * 4 + (size_t)c) * 16;
                const int row = 4 * g + c;
                for (int j = 0; j < 16; j++) {
                    const int col = 16 * k + j;
                    to[j] = row < w->rows && col < w->cols ? values[(size_t)row * (size_t)w->cols + (size_t)col] : 0;
                }
            }
}

// ---- the fp32 tile layout (matmul.h) -----------------------------------------

size_t matmul_f32_tile_floats(int rows, int cols) { return (size_t)((rows + 15) / 16) * 16 * (size_t)cols; }

bool matmul_f32_tiles_used(void) { return cpu_simd_level_selected() == CPU_SIMD_AVX512; }

const float* matmul_f32_tiles_from_row(const weight_matrix* w, int row) {
    if (!w->f32_tiles || row % 16 != 0) return NULL;
    return w->f32_tiles + (size_t)row * (size_t)w->cols;
}

void matmul_f32_fill_tiles(float* tiles, const weight_matrix* w) {
    const float* values = w->values; // (rows, cols)
    const size_t cols = (size_t)w->cols;
    for (int g = 0; g < (w->rows + 15) / 16; g++)
        for (size_t i = 0; i < cols; i++) {
            float* to = tiles + ((size_t)g * cols + i) * 16;
            for (int j = 0; j < 16; j++) {
                const int row = 16 * g + j;
                to[j] = row < w->rows ? values[(size_t)row * cols + i] : 0.0f;
            }
        }
}

// ---- the scalar level: one dot product per dtype, reduced in index order ---

static float dot_f32(const float* weights, const float* x, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++)
        sum += weights[i] * x[i];
    return sum;
}

static float dot_f16(const uint16_t* weights, const float* x, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++)
        sum += fp16_to_fp32(weights[i]) * x[i];
    return sum;
}

// Q8_0: each group's integer dot product is scaled once by its group scale.
// Groups are counted over the flattened matrix (llama2.c's export does the
// same), so a group may start in one row and end in the next: `flat_offset`
// is the index of x[0]'s weight in the whole matrix.
static float dot_q8(const int8_t* weights, const float* scales, const float* x, int n, size_t flat_offset,
                    int group_size) {
    float sum = 0.0f;
    int i = 0;
    while (i < n) {
        size_t group = (flat_offset + (size_t)i) / (size_t)group_size;
        size_t group_end_flat = (group + 1) * (size_t)group_size;
        int end = group_end_flat - flat_offset < (size_t)n ? (int)(group_end_flat - flat_offset) : n;
        float group_sum = 0.0f;
        for (; i < end; i++)
            group_sum += (float)weights[i] * x[i];
        sum += group_sum * scales[group];
    }
    return sum;
}

// fp32 outputs o .. o+7 of one batch row: eight dot_f32() run side by side.
// Each sum is still `sum += W[o][i] * x[i]` for i = 0, 1, ... (a multiply
// rounded, then an add rounded: llama2.c's bits), but one dot product is a
// chain of dependent adds (4 cycles each), so eight independent chains keep
// the adder busy: stories260K's matmuls take ~0.7 cycles per multiply-add
// this way against ~2 with one chain, which is most of its per-token time.
static void dot_f32_x8(float* out, const float* weights, const float* x, int n) {
    const float *w0 = weights, *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n, *w4 = w3 + n, *w5 = w4 + n, *w6 = w5 + n,
                *w7 = w6 + n;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f, s6 = 0.0f, s7 = 0.0f;
    for (int i = 0; i < n; i++) {
        float xi = x[i];
        s0 += w0[i] * xi;
        s1 += w1[i] * xi;
        s2 += w2[i] * xi;
        s3 += w3[i] * xi;
        s4 += w4[i] * xi;
        s5 += w5[i] * xi;
        s6 += w6[i] * xi;
        s7 += w7[i] * xi;
    }
    out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3, out[4] = s4, out[5] = s5, out[6] = s6, out[7] = s7;
}

// The scalar level, and the only fp32 path: element by element, outputs
// outermost so one weight row stays in cache while every batch row uses it.
static void matmul_scalar_range(float* out, const float* in, int n_rows, const weight_matrix* w, int o_begin,
                                int o_end) {
    const int d_out = w->rows, d_in = w->cols;
#if defined(__x86_64__) || defined(__i386__)
    // Sixteen outputs in the lanes of AVX-512 vectors, still llama2.c's
    // order (matmul_f32_avx512.c from tiles, else matmul_avx512.c);
    // SERVELAB_SIMD=scalar turns it off.
    const bool avx512 = cpu_simd_level_selected() == CPU_SIMD_AVX512;
    if (w->dtype == WEIGHT_F32 && w->f32_tiles && o_begin % 16 == 0 && avx512) {
        matmul_f32_tiles_avx512(out, in, n_rows, w, o_begin, o_end);
        return;
    }
    if (w->dtype == WEIGHT_F32 && d_in >= 16 && avx512) {
        int n_blocks = (o_end - o_begin) / 16;
        matmul_f32_avx512(out, in, n_rows, w, o_begin, n_blocks);
        o_begin += 16 * n_blocks;
    }
#endif
    if (w->dtype == WEIGHT_F32) { // eight outputs at a time (same bits as one at a time)
        for (; o_begin + 8 <= o_end; o_begin += 8)
            for (int r = 0; r < n_rows; r++) {
                float eight[8];
                dot_f32_x8(eight, (const float*)w->values + (size_t)o_begin * (size_t)d_in,
                           in + (size_t)r * (size_t)d_in, d_in);
                for (int k = 0; k < 8; k++)
                    out[(size_t)r * (size_t)d_out + (size_t)(o_begin + k)] = eight[k];
            }
    }
    for (int o = o_begin; o < o_end; o++) {
        size_t row_offset = (size_t)o * (size_t)d_in;
        for (int r = 0; r < n_rows; r++) {
            const float* x = in + (size_t)r * (size_t)d_in;
            float value;
            switch (w->dtype) {
            case WEIGHT_F32: value = dot_f32((const float*)w->values + row_offset, x, d_in); break;
            case WEIGHT_F16: value = dot_f16((const uint16_t*)w->values + row_offset, x, d_in); break;
            default:
                value = dot_q8((const int8_t*)w->values + row_offset, w->scales, x, d_in, row_offset, w->group_size);
                break;
            }
            out[(size_t)r * (size_t)d_out + (size_t)o] = value;
        }
    }
}

// ---- splitting the outputs between threads ---------------------------------

// Below this many multiply-adds a call runs on the calling thread: handing
// out work and waking a worker costs several microseconds, about what ~100k
// SIMD multiply-adds take. Every matmul of stories260K (the largest, its
// 512x64 classifier, is 32768) then runs without a handshake; at 2^15 the
// classifier went to the pool and the idle worker's spinning was 18% of
// the process's CPU time on a 2-core machine that other jobs share.
#define MATMUL_MIN_PARALLEL_MACS (1 << 17)

// Chunks per thread: several, so that a thread that finishes early takes
// the other's last chunks instead of idling. Each thread runs its own
// chunks in memory order (thread_pool.h), so they stay one long stream for
// the hardware prefetcher however many there are: 8 measured 8% faster
// fp16 decode than 4 (and 2% for W4A16), side by side in one process.
#define MATMUL_CHUNKS_PER_THREAD 8

typedef enum a8_kernel { A8_KERNEL_SCALAR, A8_KERNEL_AVX2, A8_KERNEL_VNNI } a8_kernel;

typedef struct matmul_job {
    float* out;             // (n_rows, w->rows)
    const float* in;        // (n_rows, w->cols)
    int n_rows;             // batch rows
    const weight_matrix* w; // (w->rows, w->cols)
    cpu_simd_level level;   // already clamped to the CPU
    int outputs_per_task;   // output features per chunk
    const int8_t* in_codes; // W8A8: (n_rows, w->cols) quantized activations; NULL when not allocated
    const float* in_scales; // W8A8: (n_rows) their scales
    const float* in_phased; // INT4 phase kernel: (n_rows, w->cols) in its column order; NULL when not allocated
    const uint16_t* in_bf16_words; // the same with AVX512_BF16: (n_rows, w->cols) bf16 words; NULL when not used
    const float* in_bf16_rows;     // W4A16 otherwise: (n_rows, w->cols) the rows rounded to bf16; NULL when not
    const int8_t* in_a8_codes;     // group-wise W8A8 / W4A8: (n_rows, matmul_a8_code_stride(cols)) codes in
                                   // a8_vnni's order or column order; NULL when not allocated
    const float* in_a8_scales;     // (n_rows, cols / activation_block) their scales
    const int32_t* in_a8_zero_sums; // (n_rows, cols / activation_block) the VNNI kernel's offset sums
    a8_kernel a8;                  // group-wise: which kernel runs
} matmul_job;

// Which kernel a group-wise W8A8 / W4A8 job at `level` runs: VNNI where it
// fits, else AVX2 for blocks of 32 (also AVX-512 without VNNI), else the
// scalar one; all give the same bits.
static a8_kernel a8_kernel_for(const weight_matrix* w, cpu_simd_level level) {
#if defined(__x86_64__) || defined(__i386__)
    if (level == CPU_SIMD_AVX512 && cpu_features_get()->avx512vnni && matmul_a8_vnni_fits(w)) return A8_KERNEL_VNNI;
    if (level >= CPU_SIMD_AVX2 && w->activation_block == 32) return A8_KERNEL_AVX2;
#else
    (void)w, (void)level;
#endif
    return A8_KERNEL_SCALAR;
}

// WEIGHT_I8 / WEIGHT_I4 at the job's level (the orders: matmul_int.c).
static void matmul_int_range(const matmul_job* job, int o_begin, int o_end) {
    float* out = job->out;
    const weight_matrix* w = job->w;
    const int n_rows = job->n_rows;
    if (matmul_is_a8_blocks(w)) {
        if (!job->in_a8_codes)
            matmul_a8_unbuffered(out, job->in, n_rows, w, o_begin, o_end);
#if defined(__x86_64__) || defined(__i386__)
        else if (job->a8 == A8_KERNEL_VNNI)
            matmul_a8_avx512vnni(out, job->in_a8_codes, job->in_a8_scales, job->in_a8_zero_sums, n_rows, w, o_begin,
                                 o_end);
        else if (job->a8 == A8_KERNEL_AVX2)
            matmul_a8_avx2(out, job->in_a8_codes, job->in_a8_scales, job->in_a8_zero_sums, n_rows, w, o_begin, o_end);
#endif
        else
            matmul_a8_scalar(out, job->in_a8_codes, job->in_a8_scales, n_rows, w, o_begin, o_end);
        return;
    }
    if (matmul_is_w8a8(w)) {
        if (!job->in_codes) {
            matmul_w8a8_unbuffered(out, job->in, n_rows, w, o_begin, o_end);
            return;
        }
#if defined(__x86_64__) || defined(__i386__)
        if (job->level == CPU_SIMD_AVX512 && cpu_features_get()->avx512vnni) {
            matmul_w8a8_avx512vnni(out, job->in_codes, job->in_scales, n_rows, w, o_begin, o_end);
            return;
        }
        if (job->level >= CPU_SIMD_AVX2) { // also AVX-512 without VNNI: integer sums, the same bits
            matmul_w8a8_avx2(out, job->in_codes, job->in_scales, n_rows, w, o_begin, o_end);
            return;
        }
#endif
        matmul_w8a8_scalar(out, job->in_codes, job->in_scales, n_rows, w, o_begin, o_end);
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    if (job->level == CPU_SIMD_AVX512) {
        if (job->in_bf16_words)
            matmul_i4_bf16_avx512(out, job->in_bf16_words, n_rows, w, o_begin, o_end);
        else if (job->in_phased)
            matmul_i4_phased_avx512(out, job->in_phased, n_rows, w, o_begin, o_end);
        else if (w->dtype == WEIGHT_I8)
            matmul_i8_avx512(out, job->in, n_rows, w, o_begin, o_end);
        else if (job->in_bf16_rows)
            matmul_i4_rounded_avx512(out, job->in_bf16_rows, n_rows, w, o_begin, o_end);
        else
            matmul_i4_avx512(out, job->in, n_rows, w, o_begin, o_end);
        return;
    }
    if (job->level == CPU_SIMD_AVX2) {
        if (w->dtype == WEIGHT_I8)
            matmul_i8_avx2(out, job->in, n_rows, w, o_begin, o_end);
        else if (job->in_bf16_rows)
            matmul_i4_rounded_avx2(out, job->in_bf16_rows, n_rows, w, o_begin, o_end);
        else
            matmul_i4_avx2(out, job->in, n_rows, w, o_begin, o_end);
        return;
    }
#endif
    if (job->in_bf16_rows)
        matmul_i4_rounded_scalar(out, job->in_bf16_rows, n_rows, w, o_begin, o_end);
    else
        matmul_int_scalar(out, job->in, n_rows, w, o_begin, o_end);
}

static void matmul_range(const matmul_job* job, int o_begin, int o_end) {
    float* out = job->out;
    const float* in = job->in;
    const weight_matrix* w = job->w;
    if (w->dtype == WEIGHT_I8 || w->dtype == WEIGHT_I4) {
        matmul_int_range(job, o_begin, o_end);
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    if (w->dtype == WEIGHT_F16 && job->level == CPU_SIMD_AVX512) {
        matmul_f16_avx512(out, in, job->n_rows, w, o_begin, o_end);
        return;
    }
    if (w->dtype == WEIGHT_F16 && job->level == CPU_SIMD_AVX2) {
        matmul_f16_avx2(out, in, job->n_rows, w, o_begin, o_end);
        return;
    }
    if (w->dtype == WEIGHT_Q8_0 && job->level == CPU_SIMD_AVX512) {
        matmul_q8_avx512(out, in, job->n_rows, w, o_begin, o_end);
        return;
    }
    if (w->dtype == WEIGHT_Q8_0 && job->level == CPU_SIMD_AVX2) {
        matmul_q8_avx2(out, in, job->n_rows, w, o_begin, o_end);
        return;
    }
#endif
    matmul_scalar_range(out, in, job->n_rows, w, o_begin, o_end);
}

static void matmul_task(void* ctx, int task, int thread) {
    (void)thread; // a chunk's result depends only on its outputs, not on who runs it
    const matmul_job* job = ctx;
    int o_begin = task * job->outputs_per_task;
    int o_end = o_begin + job->outputs_per_task < job->w->rows ? o_begin + job->outputs_per_task : job->w->rows;
    matmul_range(job, o_begin, o_end);
}

// ---- inputs prepared once per call: W8A8 codes, INT4 bf16 rows -------------

// What a W4A16 call's rows are prepared as.
typedef enum i4_input {
    I4_PHASED,     // rounded and in the fp32 phase kernel's order (floats)
    I4_BF16_WORDS, // rounded and in the AVX512_BF16 kernel's order (bf16 words)
    I4_BF16_ROWS,  // rounded, in place (floats): the other INT4 kernels, every level
} i4_input;

typedef struct prepare_job {
    matmul_job* matmul; // what the rows are for
    void* block;        // W8A8: (n_rows, cols) codes then (n_rows) scales; INT4: (n_rows, cols) floats
                        // or, as I4_BF16_WORDS, bf16 words
    i4_input i4;        // INT4: which form
} prepare_job;

// Bytes of the W8A8 codes in a prepared block, rounded up to 64 so that
// the scales after them are aligned.
static size_t codes_bytes(size_t n_rows, size_t cols) { return (n_rows * cols + 63) / 64 * 64; }

// The same for group-wise W8A8 / W4A8: rows of matmul_a8_code_stride bytes
// (a multiple of 128), then the scales, then the offset sums.
static size_t a8_codes_bytes(const weight_matrix* w, size_t n_rows) { return n_rows * matmul_a8_code_stride(w->cols); }

static size_t a8_block_bytes(const weight_matrix* w, size_t n_rows) {
    size_t n_blocks = (size_t)(w->cols / w->activation_block);
    return a8_codes_bytes(w, n_rows) + n_rows * n_blocks * (sizeof(float) + sizeof(int32_t));
}

static void prepare_task(void* ctx, int task, int thread) {
    (void)thread;
    const prepare_job* job = ctx;
    const matmul_job* m = job->matmul;
    const size_t cols = (size_t)m->w->cols, n_rows = (size_t)m->n_rows;
    const float* x = m->in + (size_t)task * cols;
    if (matmul_is_a8_blocks(m->w)) {
        const size_t n_blocks = cols / (size_t)m->w->activation_block;
        int8_t* codes = (int8_t*)job->block + (size_t)task * matmul_a8_code_stride(m->w->cols);
        float* scales = (float*)((int8_t*)job->block + a8_codes_bytes(m->w, n_rows)) + (size_t)task * n_blocks;
        int32_t* zero_sums = (int32_t*)((int8_t*)job->block + a8_codes_bytes(m->w, n_rows) +
                                        n_rows * n_blocks * sizeof(float)) + (size_t)task * n_blocks;
        const a8_order order = m->w->dtype != WEIGHT_I4     ? A8_COLUMNS
                               : m->a8 == A8_KERNEL_VNNI ? A8_NIBBLES
                               : m->a8 == A8_KERNEL_AVX2 ? A8_NIBBLES_32
                                                         : A8_COLUMNS;
        matmul_a8_prepare_row(codes, scales, zero_sums, x, m->w, order);
        return;
    }
    if (!matmul_is_w8a8(m->w)) {
        float* row = (float*)job->block + (size_t)task * cols;
#if defined(__x86_64__) || defined(__i386__)
        if (job->i4 == I4_BF16_WORDS) {
            matmul_i4_bf16_order_avx512((uint16_t*)job->block + (size_t)task * cols, x, 1, m->w->cols);
            return;
        }
        if (job->i4 == I4_PHASED) {
            matmul_i4_phase_order_avx512(row, x, 1, m->w->cols);
            return;
        }
        if (m->level >= CPU_SIMD_AVX2) {
            matmul_round_to_bf16_avx2(row, x, cols);
            return;
        }
#endif
        for (size_t i = 0; i < cols; i++) row[i] = fp32_round_to_bf16(x[i]);
        return;
    }
    int8_t* codes = (int8_t*)job->block + (size_t)task * cols;
    float* scale = (float*)((int8_t*)job->block + codes_bytes(n_rows, cols)) + task;
#if defined(__x86_64__) || defined(__i386__)
    if (m->level >= CPU_SIMD_AVX2) {
        matmul_quantize_row_avx2(codes, scale, x, m->w->cols);
        return;
    }
#endif
    matmul_quantize_row(codes, scale, x, m->w->cols);
}

// Prepared inputs of a decode step are small (one row: a few KiB), so they
// come from a stack arena of the caller's rather than the heap: with an
// aligned_alloc and a free per matmul call, the tiny model decoded W4A16 at
// 0.85x and W8A8 at 0.89-0.93x its fp16 speed; from the arena, 0.93-0.94x
// and 1.02-1.03x (bench --quick, 5 repeats, two runs each). Larger blocks
// (prefill) come from the heap; once per call is cheap for them.
#define PREPARE_STACK_BYTES (16 * 1024)

// A cursor (base/arena.h) over the caller's stack block, which has room
// for `capacity` bytes.
typedef struct prepare_arena {
    arena_cursor cursor; // base: the 64-byte aligned stack block
    size_t capacity;     // bytes in it
} prepare_arena;

// `bytes` from the arena, on a cache line of their own, or NULL when they
// do not fit (a measuring cursor says where they would end).
static void* take_prepared_block(prepare_arena* arena, size_t bytes) {
    if (!arena) return NULL;
    arena_cursor measure = {NULL, arena->cursor.used};
    arena_take(&measure, bytes);
    if (measure.used > arena->capacity) return NULL;
    return arena_take(&arena->cursor, bytes);
}

// Puts the activations in the form the kernel reads them in, once per call
// instead of once per chunk: W8A8 quantizes them (codes and a scale per
// row), W4A16 rounds them to bf16 (and the phase kernels reorder them).
// The block comes from `arena` when it fits, else from the heap; returns
// what the caller must free (NULL for an arena block, when there is
// nothing to prepare, or with no memory: the kernels then do it per chunk,
// with the same bits). Rows are split between threads when there are
// enough values to pay for it.
static void* prepare_input(matmul_job* job, thread_pool* pool, prepare_arena* arena) {
    const size_t cols = (size_t)job->w->cols, n_rows = (size_t)job->n_rows;
    const bool w8a8 = matmul_is_w8a8(job->w), a8_blocks = matmul_is_a8_blocks(job->w);
    const bool phased = job->level == CPU_SIMD_AVX512 && matmul_i4_uses_phase_order(job->w);
    if (n_rows == 0 || (!w8a8 && !a8_blocks && job->w->dtype != WEIGHT_I4)) return NULL;
    if (a8_blocks) {
        void* heap = NULL;
        const size_t bytes = a8_block_bytes(job->w, n_rows);
        prepare_job p = {job, take_prepared_block(arena, bytes), I4_BF16_ROWS};
        if (!p.block) p.block = heap = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!p.block) return NULL;
        thread_pool_run(n_rows * cols >= MATMUL_MIN_PARALLEL_MACS ? pool : NULL, job->n_rows, prepare_task, &p);
        const size_t n_blocks = cols / (size_t)job->w->activation_block;
        job->in_a8_codes = p.block;
        job->in_a8_scales = (const float*)((const int8_t*)p.block + a8_codes_bytes(job->w, n_rows));
        job->in_a8_zero_sums = (const int32_t*)(job->in_a8_scales + n_rows * n_blocks);
        return heap;
    }
    // 64-byte aligned: the kernels read rows with 64-byte vector loads, and
    // a row of malloc's 16-byte alignment splits every one of them over two
    // cache lines (the phase kernel ran 25% slower on such rows).
    const i4_input i4 = !phased                          ? I4_BF16_ROWS
                        : cpu_features_get()->avx512bf16 ? I4_BF16_WORDS
                                                         : I4_PHASED;
    size_t bytes = w8a8                  ? codes_bytes(n_rows, cols) + n_rows * sizeof(float)
                   : i4 == I4_BF16_WORDS ? n_rows * cols * sizeof(uint16_t)
                                         : n_rows * cols * sizeof(float);
    void* heap = NULL;
    prepare_job p = {job, take_prepared_block(arena, bytes), i4};
    if (!p.block) p.block = heap = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p.block) return NULL;
    thread_pool_run(n_rows * cols >= MATMUL_MIN_PARALLEL_MACS ? pool : NULL, job->n_rows, prepare_task, &p);
    if (w8a8) {
        job->in_codes = p.block;
        job->in_scales = (const float*)((const int8_t*)p.block + codes_bytes(n_rows, cols));
    } else if (i4 == I4_BF16_WORDS)
        job->in_bf16_words = p.block;
    else if (i4 == I4_PHASED)
        job->in_phased = p.block;
    else
        job->in_bf16_rows = p.block;
    return heap;
}

// Fills in a job for out = in . w^T at `level` and returns how many chunks
// (tasks) it is split into: one when the pool has one thread or the matrix
// is too small to share, else several per thread.
static int plan_job(matmul_job* job, float* out, const float* in, int n_rows, const weight_matrix* w,
                    cpu_simd_level level, int n_threads) {
    const int d_out = w->rows, d_in = w->cols;
    *job = (matmul_job){out, in, n_rows, w, cpu_simd_level_clamp(level), d_out, NULL, NULL, NULL, NULL, NULL,
                        NULL, NULL, NULL, A8_KERNEL_SCALAR};
    if (w->dtype == WEIGHT_F32) job->level = CPU_SIMD_SCALAR; // llama2.c's order, bit for bit
    if (matmul_is_a8_blocks(w)) job->a8 = a8_kernel_for(w, job->level);
    if (d_out <= 0 || n_rows <= 0) return 0;
    uint64_t macs = (uint64_t)n_rows * (uint64_t)d_in * (uint64_t)d_out;
    if (n_threads <= 1 || macs < MATMUL_MIN_PARALLEL_MACS) return 1;
    // Chunks of a multiple of 8 outputs, so the SIMD kernels' tiles (up to
    // 4 outputs) are not cut short inside a chunk; fp32 of 16, the outputs
    // its kernels run side by side (a group of the fp32 tile layout).
    int wanted = n_threads * MATMUL_CHUNKS_PER_THREAD;
    int per_task = (d_out + wanted - 1) / wanted;
    const int chunk_multiple = w->dtype == WEIGHT_F32 ? 16 : 8;
    job->outputs_per_task = (per_task + chunk_multiple - 1) / chunk_multiple * chunk_multiple;
    return (d_out + job->outputs_per_task - 1) / job->outputs_per_task;
}

static void count_traffic(kernel_traffic* traffic, const weight_matrix* w, int n_rows) {
    if (!traffic) return;
    traffic->weight_bytes_read += weight_matrix_bytes(w);
    traffic->activation_bytes += (uint64_t)n_rows * (uint64_t)(w->cols + w->rows) * sizeof(float);
    traffic->matmul_flops += 2ull * (uint64_t)n_rows * (uint64_t)w->cols * (uint64_t)w->rows;
}

void matmul_at_level(float* out, const float* in, int n_rows, const weight_matrix* w, thread_pool* pool,
                     cpu_simd_level level, kernel_traffic* traffic) {
    matmul_job job;
    int n_tasks = plan_job(&job, out, in, n_rows, w, level, thread_pool_size(pool));
    _Alignas(64) unsigned char stack_block[PREPARE_STACK_BYTES];
    prepare_arena arena = {{stack_block, 0}, sizeof stack_block};
    void* prepared = n_tasks > 0 ? prepare_input(&job, pool, &arena) : NULL;
    thread_pool_run(pool, n_tasks, matmul_task, &job);
    free(prepared);
    count_traffic(traffic, w, n_rows);
}

// ---- several matrices in one run of the pool ---------------------------------

// The chunks of every matrix of a set, numbered one after the other.
typedef struct matmul_set_job {
    matmul_job parts[MATMUL_SET_MAX];
    int first_task[MATMUL_SET_MAX + 1]; // part k's chunks are tasks first_task[k] .. first_task[k + 1] - 1
    int n_parts;
} matmul_set_job;

static void matmul_set_task(void* ctx, int task, int thread) {
    const matmul_set_job* set = ctx;
    int k = 0;
    while (task >= set->first_task[k + 1]) k++;
    matmul_task((void*)&set->parts[k], task - set->first_task[k], thread);
}

// Plans every part and prepares its input; returns the total task count.
// Parts too small to share run on the caller alone, as matmul_parallel
// runs them: *use_pool says whether any part is worth waking the pool for.
static int plan_set(matmul_set_job* set, const matmul_output* outputs, int n_parts, const float* in, int n_rows,
                    thread_pool* pool, prepare_arena* arena, void** prepared, bool* use_pool) {
    set->n_parts = n_parts;
    set->first_task[0] = 0;
    *use_pool = false;
    for (int k = 0; k < n_parts; k++) {
        int n_tasks = plan_job(&set->parts[k], outputs[k].out, in, n_rows, outputs[k].w, cpu_simd_level_selected(),
                               thread_pool_size(pool));
        *use_pool = *use_pool || n_tasks > 1;
        prepared[k] = n_tasks > 0 ? prepare_input(&set->parts[k], pool, arena) : NULL;
        set->first_task[k + 1] = set->first_task[k] + n_tasks;
    }
    return set->first_task[n_parts];
}

// After a set's run: frees the prepared inputs and counts each matrix's traffic.
static void finish_set(void** prepared, const matmul_output* outputs, int n_parts, int n_rows,
                       kernel_traffic* traffic) {
    for (int k = 0; k < n_parts; k++) {
        free(prepared[k]);
        count_traffic(traffic, outputs[k].w, n_rows);
    }
}

void matmul_set_parallel(const matmul_output* outputs, int n_outputs, const float* in, int n_rows,
                         thread_pool* pool, kernel_traffic* traffic) {
    if (n_outputs <= 0) return;
    if (n_outputs > MATMUL_SET_MAX) { // more than one set holds: in sets of MATMUL_SET_MAX
        matmul_set_parallel(outputs, MATMUL_SET_MAX, in, n_rows, pool, traffic);
        matmul_set_parallel(outputs + MATMUL_SET_MAX, n_outputs - MATMUL_SET_MAX, in, n_rows, pool, traffic);
        return;
    }
    matmul_set_job set;
    void* prepared[MATMUL_SET_MAX];
    bool use_pool;
    _Alignas(64) unsigned char stack_block[PREPARE_STACK_BYTES];
    prepare_arena arena = {{stack_block, 0}, sizeof stack_block};
    int n_tasks = plan_set(&set, outputs, n_outputs, in, n_rows, pool, &arena, prepared, &use_pool);
    thread_pool_run(use_pool ? pool : NULL, n_tasks, matmul_set_task, &set);
    finish_set(prepared, outputs, n_outputs, n_rows, traffic);
}

// ---- the gated feed-forward: gate = silu(w_gate . x) * (w_up . x) ------------

// The SwiGLU of a gated pair: llama2.c's (libm expf) for fp32 weights, whose
// results are compared with llama2.c's bit for bit; the vector one otherwise.
static void gated_swiglu(const weight_matrix* w_gate, float* gate, const float* up, int size,
                         kernel_traffic* traffic) {
    if (w_gate->dtype == WEIGHT_F32) swiglu(gate, up, size, traffic);
    else swiglu_vector(gate, up, size, traffic);
}

// Task = the same chunk of outputs of both matrices, then SwiGLU on those
// outputs of every row while they are still in cache.
static void gated_task(void* ctx, int task, int thread) {
    const matmul_set_job* set = ctx;
    const matmul_job *gate = &set->parts[0], *up = &set->parts[1];
    matmul_task((void*)gate, task, thread);
    matmul_task((void*)up, task, thread);
    const int hidden = gate->w->rows, o_begin = task * gate->outputs_per_task;
    const int o_end = o_begin + gate->outputs_per_task < hidden ? o_begin + gate->outputs_per_task : hidden;
    for (int r = 0; r < gate->n_rows; r++) {
        size_t row = (size_t)r * (size_t)hidden + (size_t)o_begin;
        gated_swiglu(gate->w, gate->out + row, up->out + row, o_end - o_begin, NULL);
    }
}

void matmul_swiglu_parallel(float* gate, float* up, const float* in, int n_rows, const weight_matrix* w_gate,
                            const weight_matrix* w_up, thread_pool* pool, kernel_traffic* traffic) {
    if (w_gate->rows != w_up->rows || w_gate->cols != w_up->cols) { // not a gated pair: the plain steps
        matmul_parallel(gate, in, n_rows, w_gate, pool, traffic);
        matmul_parallel(up, in, n_rows, w_up, pool, traffic);
        for (int r = 0; r < n_rows; r++)
            gated_swiglu(w_gate, gate + (size_t)r * (size_t)w_gate->rows, up + (size_t)r * (size_t)w_up->rows,
                         w_gate->rows, traffic);
        return;
    }
    const matmul_output outputs[2] = {{gate, w_gate}, {up, w_up}};
    matmul_set_job set;
    void* prepared[2];
    bool use_pool;
    _Alignas(64) unsigned char stack_block[PREPARE_STACK_BYTES];
    prepare_arena arena = {{stack_block, 0}, sizeof stack_block};
    plan_set(&set, outputs, 2, in, n_rows, pool, &arena, prepared, &use_pool);
    // Both matrices have the same shape, so the same chunks of outputs.
    int n_tasks = set.first_task[1];
    thread_pool_run(use_pool ? pool : NULL, n_tasks, gated_task, &set);
    finish_set(prepared, outputs, 2, n_rows, traffic);
    if (traffic) traffic->activation_bytes += 3ull * (uint64_t)n_rows * (uint64_t)w_gate->rows * sizeof(float);
}

void matmul_parallel(float* out, const float* in, int n_rows, const weight_matrix* w, thread_pool* pool,
                     kernel_traffic* traffic) {
    matmul_at_level(out, in, n_rows, w, pool, cpu_simd_level_selected(), traffic);
}

void matmul(float* out, const float* in, int n_rows, const weight_matrix* w, kernel_traffic* traffic) {
    matmul_parallel(out, in, n_rows, w, NULL, traffic);
}

void weight_row_to_f32(float* out, const weight_matrix* w, int row, kernel_traffic* traffic) {
    if (w->dtype == WEIGHT_I8 || w->dtype == WEIGHT_I4) {
        int_row_to_f32(out, w, row);
        if (traffic) {
            traffic->weight_bytes_read += int_rows_bytes(w, 1);
            traffic->activation_bytes += (uint64_t)w->cols * sizeof(float);
        }
        return;
    }
    size_t offset = (size_t)row * (size_t)w->cols;
    for (int i = 0; i < w->cols; i++) {
        switch (w->dtype) {
        case WEIGHT_F32: out[i] = ((const float*)w->values)[offset + (size_t)i]; break;
        case WEIGHT_F16: out[i] = fp16_to_fp32(((const uint16_t*)w->values)[offset + (size_t)i]); break;
        default:
            out[i] = (float)((const int8_t*)w->values)[offset + (size_t)i] *
                     w->scales[(offset + (size_t)i) / (size_t)w->group_size];
            break;
        }
    }
    if (traffic) {
        uint64_t row_bytes = (uint64_t)w->cols * dtype_value_bytes(w->dtype);
        if (w->dtype == WEIGHT_Q8_0) { // the scales of every group the row touches
            uint64_t first = offset / (size_t)w->group_size,
                     last = (offset + (size_t)w->cols - 1) / (size_t)w->group_size;
            row_bytes += (last - first + 1) * sizeof(float);
        }
        traffic->weight_bytes_read += row_bytes;
        traffic->activation_bytes += (uint64_t)w->cols * sizeof(float);
    }
}
