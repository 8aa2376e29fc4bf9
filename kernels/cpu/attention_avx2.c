// Attention over an fp16 KV cache with AVX2 + F16C + FMA.
//
// Same equations and the same order over positions t as the scalar kernel
// in attention.c; only the sums over head_dim are vectorised: q.k uses one
// 8-lane accumulator over head_dim in order, then a fixed horizontal sum,
// then the scalar tail. Every row is computed the same way whatever the
// batch, block size or layout, so batch invariance holds within this level.
//
// Memory order. A cached slot holds every KV head side by side (kv_dim
// elements, 1.5 KiB for stories110M in fp16). Walking one head at a time
// over the whole context reads 128 bytes of every slot and comes back for
// the next head, n_heads passes over memory with a 1.5 KiB stride. When the
// caller's scratch holds every head's scores, the kernel instead walks the
// slots once, in position order, and does every head at each slot: one
// sequential pass over the keys and one over the values, block after block,
// so a paged cache and a contiguous one are read the same way. Each
// element's operations and their order are unchanged (a score is the same
// dot product; out_h still adds p[t] v_t for t = 0, 1, ...), so the bits are
// the same in either order.
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/simd_x86.h"

// ---- softmax with a vector exp ------------------------------------------------
//
// softmax() in ops.c calls libm's expf once per score: at stories260K's
// size that was a fifth of a decode step. This one computes exp 8 lanes at
// a time (exp8() in simd_x86.h, within 2 ulp of expf) and sums in a fixed
// order: the 8 lanes over full vectors, hsum8(), then the tail in order. Only the fp16
// kernels use it, so the fp32 path keeps llama2.c's bits; within this level
// a row's result still depends on nothing but its scores.


// The largest of x[0 .. size), 8 lanes at a time (a maximum is the same
// value in any order; the scalar loop was a chain of dependent compares,
// about 2% of a long prompt's time). _mm256_max_ps(x, m) keeps m when x is
// NaN, as the scalar x > m ? x : m does, and a NaN x[0] stays the result.
AVX2_INLINE float max8(const float* x, int size) {
    __m256 lanes = _mm256_set1_ps(x[0]);
    int i = 0;
    for (; i + 8 <= size; i += 8) lanes = _mm256_max_ps(_mm256_loadu_ps(x + i), lanes);
    float partial[8];
    _mm256_storeu_ps(partial, lanes);
    float max_value = partial[0];
    for (int k = 1; k < 8; k++) max_value = partial[k] > max_value ? partial[k] : max_value;
    for (; i < size; i++) max_value = x[i] > max_value ? x[i] : max_value;
    return max_value;
}

AVX2_INLINE void softmax8(float* x, int size) {
    const __m256 max_vector = _mm256_set1_ps(max8(x, size));
    __m256 sum_vector = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= size; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), max_vector));
        _mm256_storeu_ps(x + i, e);
        sum_vector = _mm256_add_ps(sum_vector, e);
    }
    float sum = hsum8(sum_vector);
    if (i < size) { // the tail through one padded vector; only its live lanes are kept
        float tail[8] = {0};
        memcpy(tail, x + i, (size_t)(size - i) * sizeof(float));
        _mm256_storeu_ps(tail, exp8(_mm256_sub_ps(_mm256_loadu_ps(tail), max_vector)));
        for (int k = 0; k < size - i; k++)
            sum += x[i + k] = tail[k];
    }
    const __m256 sum_broadcast = _mm256_set1_ps(sum);
    for (i = 0; i + 8 <= size; i += 8)
        _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), sum_broadcast));
    for (; i < size; i++)
        x[i] /= sum;
}

// ---- q.k and p.v ----------------------------------------------------------------

AVX2_INLINE float dot_f16(const float* q, const uint16_t* k, int n) {
    __m256 accumulator = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 keys = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(k + i)));
        accumulator = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), keys, accumulator);
    }
    float sum = hsum8(accumulator);
    for (; i < n; i++)
        sum += q[i] * _cvtsh_ss(k[i]);
    return sum;
}

AVX2_INLINE void add_scaled_f16(float* out, float weight, const uint16_t* v, int n) {
    __m256 w = _mm256_set1_ps(weight);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 values = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(v + i)));
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(w, values, _mm256_loadu_ps(out + i)));
    }
    for (; i < n; i++)
        out[i] = fmaf(weight, _cvtsh_ss(v[i]), out[i]);
}

// ---- every head at once, in runs of positions -------------------------------------
//
// The slot-major pass reads the cache in position order, POSITION_RUN slots
// at a time (their addresses gathered from the block table once, so a
// paged and a contiguous cache run the same code), and does every head on
// the run before moving on. Two things make it faster than a dot product
// and an add per (slot, head), with the same bits:
//   - scores: 8 heads' q.k of a slot side by side, and their 8 hsum8()
//     trees at once (hsum8_x8: the same additions, the same first operands);
//   - values: a head's output stays in registers over the whole run
//     instead of being loaded and stored once per slot (each element still
//     gets fma(p[t], v_t, out) for t = 0, 1, ...).

#define POSITION_RUN 16

// Loops over 8 slots or 4 vectors are unrolled so that their accumulators
// live in registers (GCC's plain -O2 kept them in memory: 3x slower).
#define UNROLL8 _Pragma("GCC unroll 8")

// hsum8() of 8 vectors at once: lane k of the result is hsum8(v[k]).
AVX2_INLINE __m256 hsum8_x8(const __m256* v) {
    __m256 quads[4], pairs[2];
    // quads[j]: lanes 0-3 hold v[2j]'s l + (l+4), lanes 4-7 v[2j+1]'s.
    UNROLL8 for (int j = 0; j < 4; j++)
        quads[j] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x20),
                                 _mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x31));
    // pairs[m]: 128-bit half k holds q0+q2, q1+q3 of v[4m + k], then of v[4m + 2 + k].
    UNROLL8 for (int m = 0; m < 2; m++)
        pairs[m] = _mm256_add_ps(_mm256_shuffle_ps(quads[2 * m], quads[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(quads[2 * m], quads[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    // Lane 4k + j holds pair0 + pair1 of v[2j + k]; put v[k]'s in lane k.
    __m256 sums = _mm256_add_ps(_mm256_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm256_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// out[i] = fma(p[s], v_s[i], out[i]) for s = 0 .. n-1 in order, every i of
// the head: add_scaled_f16 per slot, with out held in registers, 32
// elements (8 vectors) at a time, then 32, 8, and the scalar tail. Each
// vector of out is a chain of n dependent FMAs (4 cycles each), so the
// more vectors are in flight at once, the closer to 2 FMAs per cycle.
AVX2_INLINE void add_scaled_run(float* out, const float* p, const uint16_t* const* v, int n, int head_dim) {
    int i = 0;
    for (; i + 64 <= head_dim; i += 64) {
        __m256 a[8];
        UNROLL8 for (int k = 0; k < 8; k++) a[k] = _mm256_loadu_ps(out + i + 8 * k);
        for (int s = 0; s < n; s++) {
            const uint16_t* values = v[s] + i;
            __m256 w = _mm256_set1_ps(p[s]);
            UNROLL8 for (int k = 0; k < 8; k++)
                a[k] = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(values + 8 * k))), a[k]);
        }
        UNROLL8 for (int k = 0; k < 8; k++) _mm256_storeu_ps(out + i + 8 * k, a[k]);
    }
    for (; i + 32 <= head_dim; i += 32) {
        __m256 a0 = _mm256_loadu_ps(out + i), a1 = _mm256_loadu_ps(out + i + 8), a2 = _mm256_loadu_ps(out + i + 16),
               a3 = _mm256_loadu_ps(out + i + 24);
        for (int s = 0; s < n; s++) {
            const uint16_t* values = v[s] + i;
            __m256 w = _mm256_set1_ps(p[s]);
            a0 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)values)), a0);
            a1 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(values + 8))), a1);
            a2 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(values + 16))), a2);
            a3 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(values + 24))), a3);
        }
        _mm256_storeu_ps(out + i, a0);
        _mm256_storeu_ps(out + i + 8, a1);
        _mm256_storeu_ps(out + i + 16, a2);
        _mm256_storeu_ps(out + i + 24, a3);
    }
    for (; i + 8 <= head_dim; i += 8) {
        __m256 a = _mm256_loadu_ps(out + i);
        for (int s = 0; s < n; s++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(p[s]), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(v[s] + i))), a);
        _mm256_storeu_ps(out + i, a);
    }
    for (; i < head_dim; i++) {
        float a = out[i];
        for (int s = 0; s < n; s++) a = fmaf(p[s], _cvtsh_ss(v[s][i]), a);
        out[i] = a;
    }
}

// The slots of positions [t0, t0 + n) (n <= POSITION_RUN): slots[s] is the
// first element of position t0 + s's keys (or values) in `base`, whose
// slots are slot_stride elements apart.
static void gather_run(const uint16_t** slots, const uint16_t* base, const kv_layer_view* kv, int t0, int n,
                       int slot_stride) {
    int b = t0 / kv->block_size, offset = t0 % kv->block_size; // once per run, not per position
    for (int s = 0; s < n; s++) {
        slots[s] = base + ((size_t)kv->block_table[b] * (size_t)kv->block_size + (size_t)offset) * (size_t)slot_stride;
        if (++offset == kv->block_size) offset = 0, b++;
    }
}

// Asks for every cache line of rows[first .. last), kv_dim fp16 each. A
// run is one block of a paged cache (or parts of two), and the hardware
// prefetcher loses the stream at every jump to another block; fetching
// the next run while this one is computed lets a paged cache stream like a
// contiguous one. Spread over the run, not all at once, so the loads of
// the current run are not queued behind them.
static void prefetch_rows(const uint16_t* const* rows, int first, int last, int kv_dim) {
    const size_t row_bytes = (size_t)kv_dim * sizeof(uint16_t);
    for (int s = first; s < last; s++)
        for (size_t b = 0; b < row_bytes; b += 64) _mm_prefetch((const char*)rows[s] + b, _MM_HINT_T0);
}

// The prefetch above keeps the loads of the next run waiting less, but the
// hardware prefetchers keep more lines in flight than it can, and they lose
// the stream at every jump to another block: stories110M's 24 KiB blocks,
// shuffled, read 1.3-1.4x slower than a contiguous cache at 8192 tokens.
// So where the run AHEAD_RUNS runs on starts in another block, about one
// line of every 4 KiB of it is touched now, and the hardware picks each
// page's stream up from there before the loads reach it (paged another
// 7-12% faster). A contiguous cache never jumps and is left to the
// hardware alone; a run that starts mid-block is not primed.
#define AHEAD_RUNS 2

static void prime_block_jump(const uint16_t* base, const kv_layer_view* kv, int first, int limit, int slot_stride) {
    if (first >= limit || first == 0) return;
    const int64_t slot = kv_slot_of_position(kv->block_table, kv->block_size, first);
    if (slot == kv_slot_of_position(kv->block_table, kv->block_size, first - 1) + 1) return;
    const size_t stride_bytes = (size_t)slot_stride * sizeof(uint16_t);
    const int step = stride_bytes >= 4096 ? 1 : (int)(4096 / stride_bytes); // positions per 4 KiB
    const int last = first + POSITION_RUN < limit ? first + POSITION_RUN : limit;
    for (int t = first; t < last; t += step)
        _mm_prefetch((const char*)(base + (size_t)kv_slot_of_position(kv->block_table, kv->block_size, t) *
                                              (size_t)slot_stride), _MM_HINT_T0);
}

// ---- several rows of one sequence at once (a prompt) ---------------------------
//
// Rows j = 0 .. R-1 of a prompt sit at consecutive positions: row j attends
// to positions 0 .. n_context + j - 1. Positions below n_context are shared
// by all R rows, so each of their keys and values is loaded and widened
// once for the R rows instead of once per row: R times less cache traffic
// and widening in the passes that dominate a long prompt's attention. Every
// dot product, softmax and output element is computed by the same
// operations in the same order as for the row alone (R = 1; the loops are
// only interleaved), so the bits are the same.

// dots[j][h] = dot_f16(query_j head h, that head's key in `slot`) / scale
// for the R rows (queries: (R, n_heads * head_dim)) and heads
// [h0, h0 + G), G * R <= 8: per dot product one 8-lane accumulator from +0
// over head_dim in order, hsum8 (hsum8_x8), the scalar tail, then the
// division (8 of them as one vector when there is no tail; each lane
// rounds as divss does), with each key vector widened once for the R rows.
AVX2_INLINE __m256 dots_vector(const float* queries, size_t query_row_stride, const uint16_t* slot, int R, int h0,
                               int G, int queries_per_kv_head, int head_dim, float scale) {
    const uint16_t* k[8];
    const float* q[8]; // [g * R + j]
    __m256 acc[8];
    UNROLL8 for (int a = 0; a < 8; a++) {
        int g = a / R < G ? a / R : 0, j = a % R;
        k[a] = slot + (size_t)((h0 + g) / queries_per_kv_head) * (size_t)head_dim;
        q[a] = queries + (size_t)j * query_row_stride + (size_t)(h0 + g) * (size_t)head_dim;
        acc[a] = _mm256_setzero_ps();
    }
    const int live = G * R;
    int i = 0;
    for (; i + 8 <= head_dim; i += 8) {
        __m256 keys[8];
        // One widening per head, shared by its R rows.
        UNROLL8 for (int a = 0; a < 8; a++) keys[a] = a % R == 0
            ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(k[a] + i))) : _mm256_setzero_ps();
        UNROLL8 for (int a = 0; a < 8; a++) if (a < live) acc[a] =
            _mm256_fmadd_ps(_mm256_loadu_ps(q[a] + i), keys[a - a % R], acc[a]);
    }
    if (i == head_dim) return _mm256_div_ps(hsum8_x8(acc), _mm256_set1_ps(scale));
    float sums[8];
    _mm256_storeu_ps(sums, hsum8_x8(acc));
    for (int a = 0; a < live; a++) {
        float sum = sums[a];
        for (int t = i; t < head_dim; t++) sum += q[a][t] * _cvtsh_ss(k[a][t]);
        sums[a] = sum / scale;
    }
    return _mm256_loadu_ps(sums);
}

// dots_vector's lanes a < G * R stored as dots[j][g] (stride dots_row_stride).
AVX2_INLINE void dots_rows(float* dots, size_t dots_row_stride, const float* queries, size_t query_row_stride,
                           const uint16_t* slot, int R, int h0, int G, int queries_per_kv_head, int head_dim,
                           float scale) {
    float sums[8];
    _mm256_storeu_ps(sums, dots_vector(queries, query_row_stride, slot, R, h0, G, queries_per_kv_head, head_dim, scale));
    for (int a = 0; a < G * R; a++) dots[(size_t)(a % R) * dots_row_stride + (size_t)(a / R)] = sums[a];
}

// Transposes 8 x 8 floats in registers: afterwards lane s of v[a] is what
// lane a of v[s] was.
AVX2_INLINE void transpose8(__m256* v) {
    __m256 t[8], u[8];
    UNROLL8 for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm256_unpacklo_ps(v[2 * k], v[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_ps(v[2 * k], v[2 * k + 1]);
    }
    UNROLL8 for (int k = 0; k < 2; k++) {
        u[4 * k] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * k + 1] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * k + 2] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * k + 3] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    UNROLL8 for (int k = 0; k < 4; k++) {
        v[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
        v[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
}

// outs[j][i] = fma(p_j[s], v_s[i], outs[j][i]) for s = 0 .. n-1 in order,
// every i of the head, for the R rows (p_j = p + j * p_row_stride, outs_j =
// out + j * out_row_stride): add_scaled_run's chain per element, with each
// value vector widened once for the R rows. Columns go in blocks of
// 8 * (8 / R) (R * (8 / R) <= 8 accumulators), then 8 at a time, then one
// by one.
AVX2_INLINE void add_scaled_rows(float* out, size_t out_row_stride, const float* p, size_t p_row_stride,
                                 const uint16_t* const* v, int n, int R, int head_dim) {
    const int vectors = 8 / R, block = 8 * vectors, live = R * vectors; // per row: vectors, columns
    int i = 0;
    for (; i + block <= head_dim; i += block) {
        __m256 a[8]; // [j * vectors + k]: row j, columns i + 8k ..
        UNROLL8 for (int x = 0; x < 8; x++) a[x] = x < live ? _mm256_loadu_ps(out + (size_t)(x / vectors) * out_row_stride +
                                                                                (size_t)i + (size_t)(8 * (x % vectors)))
                                                       : _mm256_setzero_ps();
        for (int s = 0; s < n; s++) {
            const uint16_t* values = v[s] + i;
            __m256 wide[8];
            UNROLL8 for (int x = 0; x < 8; x++) wide[x] = x < vectors
                ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(values + 8 * x))) : _mm256_setzero_ps();
            UNROLL8 for (int x = 0; x < 8; x++) if (x < live) a[x] = _mm256_fmadd_ps(
                _mm256_set1_ps(p[(size_t)(x / vectors) * p_row_stride + (size_t)s]), wide[x % vectors], a[x]);
        }
        UNROLL8 for (int x = 0; x < 8; x++) if (x < live) _mm256_storeu_ps(
            out + (size_t)(x / vectors) * out_row_stride + (size_t)i + (size_t)(8 * (x % vectors)), a[x]);
    }
    for (; i + 8 <= head_dim; i += 8) {
        for (int j = 0; j < R; j++) {
            float* o = out + (size_t)j * out_row_stride + (size_t)i;
            __m256 a = _mm256_loadu_ps(o);
            for (int s = 0; s < n; s++)
                a = _mm256_fmadd_ps(_mm256_set1_ps(p[(size_t)j * p_row_stride + (size_t)s]),
                                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(v[s] + i))), a);
            _mm256_storeu_ps(o, a);
        }
    }
    for (; i < head_dim; i++) {
        for (int j = 0; j < R; j++) {
            float* o = out + (size_t)j * out_row_stride + (size_t)i;
            float a = *o;
            for (int s = 0; s < n; s++) a = fmaf(p[(size_t)j * p_row_stride + (size_t)s], _cvtsh_ss(v[s][i]), a);
            *o = a;
        }
    }
}

// ---- the value pass on AVX-512 ----------------------------------------------
//
// add_scaled_rows with 16-lane vectors where the CPU has them: each output
// element still gets fma(p_j[s], v_s[i], out) for s = 0, 1, ... in order
// (a lane does exactly what the 8-lane kernel's lane does), so the bits are
// the same; a value vector is widened once per 16 columns instead of 8, and
// one FMA covers 16 of a row's columns. 8 / R vectors per row (8
// accumulators in all: enough chains for 2 FMAs per cycle), blocks of
// 128 / R columns; the columns past the last whole block go through
// add_scaled_rows. Only for R >= 2: one row has a single head's 64 columns
// (4 vectors), too few chains to beat the 8-lane kernel's 8.

#define AVX512_BLOCK_COLUMNS(R) (128 / (R))

AVX512_INLINE void add_scaled_rows_x16(float* out, size_t out_row_stride, const float* p, size_t p_row_stride,
                                       const uint16_t* const* v, int n, int R, int head_dim) {
    const int vectors = 8 / R, block = 16 * vectors; // per row: vectors, columns
    int i = 0;
    for (; i + block <= head_dim; i += block) {
        __m512 a[8]; // [j * vectors + k]: row j, columns i + 16k ..
        UNROLL8 for (int x = 0; x < 8; x++) a[x] = _mm512_loadu_ps(out + (size_t)(x / vectors) * out_row_stride +
                                                                   (size_t)i + (size_t)(16 * (x % vectors)));
        for (int s = 0; s < n; s++) {
            const uint16_t* values = v[s] + i;
            __m512 wide[8];
            UNROLL8 for (int x = 0; x < 8; x++) wide[x] = x < vectors
                ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(values + 16 * x))) : _mm512_setzero_ps();
            UNROLL8 for (int x = 0; x < 8; x++) a[x] = _mm512_fmadd_ps(
                _mm512_set1_ps(p[(size_t)(x / vectors) * p_row_stride + (size_t)s]), wide[x % vectors], a[x]);
        }
        UNROLL8 for (int x = 0; x < 8; x++) _mm512_storeu_ps(
            out + (size_t)(x / vectors) * out_row_stride + (size_t)i + (size_t)(16 * (x % vectors)), a[x]);
    }
    if (i < head_dim) {
        const uint16_t* rest[POSITION_RUN];
        for (int s = 0; s < n; s++) rest[s] = v[s] + i;
        add_scaled_rows(out + i, out_row_stride, p, p_row_stride, rest, n, R, head_dim - i);
    }
}

static AVX512_TARGET __attribute__((noinline)) void add_scaled_rows_avx512(float* out, size_t out_row_stride,
                                                                            const float* p, size_t p_row_stride,
                                                                            const uint16_t* const* v, int n, int R,
                                                                            int head_dim) {
    switch (R) {
    case 2: add_scaled_rows_x16(out, out_row_stride, p, p_row_stride, v, n, 2, head_dim); break;
    case 4: add_scaled_rows_x16(out, out_row_stride, p, p_row_stride, v, n, 4, head_dim); break;
    default: add_scaled_rows(out, out_row_stride, p, p_row_stride, v, n, R, head_dim); break;
    }
}

// One row (decode) has a single head's 64 columns per block: 4 vectors,
// too few FMA chains. So two heads go side by side: 8 chains, heads h and
// h + 1 (out: their 2 * head_dim outputs; p0, p1: their weights; v0, v1:
// their value rows). Each element still gets fma(p[s], v_s[i], out) for s
// = 0, 1, ... in order: the bits of add_scaled_rows with R = 1.
static AVX512_TARGET __attribute__((noinline)) void add_scaled_head_pair_avx512(float* out, const float* p0,
                                                                                const float* p1,
                                                                                const uint16_t* const* v0,
                                                                                const uint16_t* const* v1, int n,
                                                                                int head_dim) {
    int i = 0;
    for (; i + 64 <= head_dim; i += 64) {
        __m512 a[8]; // [0..3]: head h, columns i + 16x; [4..7]: head h + 1
        UNROLL8 for (int x = 0; x < 4; x++) {
            a[x] = _mm512_loadu_ps(out + i + 16 * x);
            a[4 + x] = _mm512_loadu_ps(out + head_dim + i + 16 * x);
        }
        for (int s = 0; s < n; s++) {
            const __m512 w0 = _mm512_set1_ps(p0[s]), w1 = _mm512_set1_ps(p1[s]);
            UNROLL8 for (int x = 0; x < 4; x++) {
                a[x] = _mm512_fmadd_ps(w0, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(v0[s] + i + 16 * x))),
                                       a[x]);
                a[4 + x] = _mm512_fmadd_ps(
                    w1, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(v1[s] + i + 16 * x))), a[4 + x]);
            }
        }
        UNROLL8 for (int x = 0; x < 4; x++) {
            _mm512_storeu_ps(out + i + 16 * x, a[x]);
            _mm512_storeu_ps(out + head_dim + i + 16 * x, a[4 + x]);
        }
    }
    if (i < head_dim) {
        const uint16_t* rest[POSITION_RUN];
        for (int s = 0; s < n; s++) rest[s] = v0[s] + i;
        add_scaled_rows(out + i, 0, p0, 0, rest, n, 1, head_dim - i);
        for (int s = 0; s < n; s++) rest[s] = v1[s] + i;
        add_scaled_rows(out + head_dim + i, 0, p1, 0, rest, n, 1, head_dim - i);
    }
}

// ---- the key pass on AVX-512: rows or heads in pairs -------------------------------
//
// For 2 or 4 rows of a prompt, a dot product's 8-lane accumulator shares a
// 16-lane register with another row's: lanes 0-7 row 2p, lanes 8-15 row
// 2p + 1, against the same key widened into both halves. Each lane runs
// exactly the FMA chain of dots_vector (one 8-lane accumulator from +0 over
// head_dim in order), half as many FMA instructions; the rows' queries are
// packed in pairs once per call. 8 slots x 4 rows of a head are then
// summed together: the same three levels of additions as hsum8() (l +
// (l+4), q0 + q2 and q1 + q3, then their sum), each on 16 lanes at a time,
// and divided by sqrt(head_dim) as one vector. Same bits as dots_vector
// followed by its division. Only for head_dim a multiple of 8 (no scalar
// tail), which is every model here.
//
// A 512-token stories110m prefill's attention (fp16 KV, every layer, one
// thread), the old kernel beside this one in the same process, 11
// alternating rounds: 4-row groups (a prompt's usual) 190.9 -> 130.4 us
// per token (1.41-1.50x), 2-row groups 255.1 -> 202.9 (1.17-1.30x).
//
// One decode row pairs its heads instead (h even in lanes 0-7, h + 1 in
// lanes 8-15, each against its own KV head's key; n_heads even). The same
// kernel, 12 layers, one thread, 41 alternating rounds: context 8 10.6 ->
// 9.0 us, 72 96.1 -> 76.9, 136 193.6 -> 155.8, 512 838.7 -> 784.9. With the
// value pass also taking two heads at once (add_scaled_head_pair_avx512),
// against the same old kernel: 72 1.30-1.37x, 136 1.30x, 512 1.33-1.44x;
// at 2048 and 8192, where the cache streams from memory, 0.95-0.99x.
// (Spreading the next run's prefetches over the heads instead of issuing
// them before the pass made those 0.87-0.93x; not kept.)

// Most floats of packed queries (R rows x n_heads x head_dim): 4 rows of a
// model of dim 2048, on the stack.
#define PACKED_QUERY_FLOATS (4 * 2048)

// packed[(h * R / 2 + p) * steps + k] = dims 8k .. 8k+7 of head h of row
// 2p (lanes 0-7) and of row 2p + 1 (lanes 8-15); steps = head_dim / 8.
static AVX512_TARGET void pack_query_pairs(__m512* packed, const float* query, size_t width, int R, int n_heads,
                                           int head_dim) {
    const int steps = head_dim / 8;
    for (int h = 0; h < n_heads; h++)
        for (int p = 0; p < R / 2; p++)
            for (int k = 0; k < steps; k++) {
                const float* low = query + (size_t)(2 * p) * width + (size_t)h * (size_t)head_dim + (size_t)(8 * k);
                const __m512d both = _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(low))),
                                                        _mm256_castps_pd(_mm256_loadu_ps(low + width)), 1);
                packed[((size_t)h * (size_t)(R / 2) + (size_t)p) * (size_t)steps + (size_t)k] = _mm512_castpd_ps(both);
            }
}

// One row's queries by pairs of heads: packed[(h / 2) * steps + k] = dims
// 8k .. 8k+7 of head h (lanes 0-7) and of head h + 1 (lanes 8-15), h even.
static AVX512_TARGET void pack_head_pairs(__m512* packed, const float* query, int n_heads, int head_dim) {
    const int steps = head_dim / 8;
    for (int h = 0; h < n_heads; h += 2)
        for (int k = 0; k < steps; k++) {
            const float* low = query + (size_t)h * (size_t)head_dim + (size_t)(8 * k);
            const __m512d both = _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(low))),
                                                    _mm256_castps_pd(_mm256_loadu_ps(low + head_dim)), 1);
            packed[(size_t)(h / 2) * (size_t)steps + (size_t)k] = _mm512_castpd_ps(both);
        }
}

// The upper 8 lanes (AVX512F only: no DQ in the target).
AVX512_INLINE __m256 upper_half(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// The three addition levels of hsum8(), each for several dot products at
// once (keys8_pairs lays out which lanes hold what).
AVX512_INLINE __m512 add_halves(__m512 a, __m512 b) { // per 8-lane half: l + (l+4), for a then b
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}
AVX512_INLINE __m512 add_pairs(__m512 a, __m512 b) { // per chunk of 4: q0 + q2, q1 + q3, for a then b
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
AVX512_INLINE __m512 add_last(__m512 a, __m512 b) { // per chunk: pair0 + pair1 of a's two dots, then b's
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Scores of 8 slots (keys[s]: slot s's first element) for every head, of
// R = 2 * pairs rows (head_pairs 0: packed by pack_query_pairs) or of one
// row whose heads go in pairs (head_pairs 1, pairs 1: pack_head_pairs;
// lanes 8-15 then hold head h + 1, against its own KV head's key). Row j,
// head h, slot s goes to scores[j * row_stride + h * head_stride + s].
// pairs and head_pairs are constants at every call site, so the 8 slots'
// accumulators stay in registers.
AVX512_INLINE void keys8_pairs(float* scores, size_t row_stride, size_t head_stride, const uint16_t* const* keys,
                               const __m512* packed, const int pairs, const int head_pairs, int n_heads,
                               int queries_per_kv_head, int head_dim, float scale) {
    const int steps = head_dim / 8;
    const __m512 divisor = _mm512_set1_ps(scale);
    // The second 8-lane half's scores: the next row, or the next head.
    const size_t upper_stride = head_pairs ? head_stride : row_stride;
    for (int h = 0; h < n_heads; h += head_pairs ? 2 : 1) {
        const size_t head_offset = (size_t)(h / queries_per_kv_head) * (size_t)head_dim;
        // head_pairs: where head h + 1's key is, from head h's (0 when they share a KV head).
        const size_t next_head = head_pairs ? (size_t)((h + 1) / queries_per_kv_head) * (size_t)head_dim - head_offset
                                            : 0;
        const __m512* q = packed + (size_t)(head_pairs ? h / 2 : h * pairs) * (size_t)steps;
        const uint16_t* k[8];
        UNROLL8 for (int s = 0; s < 8; s++) k[s] = keys[s] + head_offset;
        __m512 acc[16]; // [s * pairs + p]
        _Pragma("GCC unroll 16") for (int a = 0; a < 8 * pairs; a++) acc[a] = _mm512_setzero_ps();
        for (int i = 0; i < steps; i++) {
            const __m512 q0 = q[i], q1 = q[pairs == 2 ? steps + i : i];
            UNROLL8 for (int s = 0; s < 8; s++) {
                const __m128i low = _mm_loadu_si128((const __m128i*)(k[s] + 8 * i));
                const __m256i halves =
                    head_pairs ? _mm256_inserti128_si256(_mm256_castsi128_si256(low),
                                                         _mm_loadu_si128((const __m128i*)(k[s] + next_head + 8 * i)), 1)
                               : _mm256_broadcastsi128_si256(low);
                const __m512 key = _mm512_cvtph_ps(halves);
                acc[s * pairs] = _mm512_fmadd_ps(q0, key, acc[s * pairs]);
                if (pairs == 2) acc[s * 2 + 1] = _mm512_fmadd_ps(q1, key, acc[s * 2 + 1]);
            }
        }
        float* head_scores = scores + (size_t)h * head_stride;
        if (pairs == 2) {
            // acc[2s + p]: slot s, rows 2p | 2p + 1. halves[m]: 128-bit chunk c =
            // row c at slot m; two[n]: chunk c = row c at slots 2n, 2n + 1 (2
            // values each); sums[u]: chunk c = row c at slots 4u .. 4u + 3.
            __m512 halves[8], two[4], sums[2];
            UNROLL8 for (int m = 0; m < 8; m++) halves[m] = add_halves(acc[2 * m], acc[2 * m + 1]);
            UNROLL8 for (int n = 0; n < 4; n++) two[n] = add_pairs(halves[2 * n], halves[2 * n + 1]);
            UNROLL8 for (int u = 0; u < 2; u++)
                sums[u] = _mm512_div_ps(add_last(two[2 * u], two[2 * u + 1]), divisor);
            const __m512 rows01 = _mm512_permutex2var_ps(
                sums[0], _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23), sums[1]);
            const __m512 rows23 = _mm512_permutex2var_ps(
                sums[0], _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31), sums[1]);
            _mm256_storeu_ps(head_scores, _mm512_castps512_ps256(rows01));
            _mm256_storeu_ps(head_scores + row_stride, upper_half(rows01));
            _mm256_storeu_ps(head_scores + 2 * row_stride, _mm512_castps512_ps256(rows23));
            _mm256_storeu_ps(head_scores + 3 * row_stride, upper_half(rows23));
        } else {
            // acc[s]: slot s, rows 0 | 1. halves[m]: rows 0, 1 at slot 2m, then
            // at slot 2m + 1; two[n]: chunk c = (row c % 2, slot 4n + c / 2)
            // and (the same row, slot 4n + 2 + c / 2); sums: chunk 0 = row 0
            // at slots 0, 2, 4, 6, chunk 1 = row 1 there, chunks 2 and 3 the
            // same at slots 1, 3, 5, 7.
            __m512 halves[4], two[2];
            UNROLL8 for (int m = 0; m < 4; m++) halves[m] = add_halves(acc[2 * m], acc[2 * m + 1]);
            UNROLL8 for (int n = 0; n < 2; n++) two[n] = add_pairs(halves[2 * n], halves[2 * n + 1]);
            const __m512 sums = _mm512_div_ps(add_last(two[0], two[1]), divisor);
            const __m512 rows01 =
                _mm512_permutexvar_ps(_mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15), sums);
            _mm256_storeu_ps(head_scores, _mm512_castps512_ps256(rows01));
            _mm256_storeu_ps(head_scores + upper_stride, upper_half(rows01));
        }
    }
}

static AVX512_TARGET __attribute__((noinline)) void keys8_row_pairs(float* scores, size_t row_stride,
                                                                     size_t head_stride, const uint16_t* const* keys,
                                                                     const __m512* packed, int R, int n_heads,
                                                                     int queries_per_kv_head, int head_dim,
                                                                     float scale) {
    if (R == 4)
        keys8_pairs(scores, row_stride, head_stride, keys, packed, 2, 0, n_heads, queries_per_kv_head, head_dim, scale);
    else if (R == 2)
        keys8_pairs(scores, row_stride, head_stride, keys, packed, 1, 0, n_heads, queries_per_kv_head, head_dim, scale);
    else // one row, its heads in pairs
        keys8_pairs(scores, row_stride, head_stride, keys, packed, 1, 1, n_heads, queries_per_kv_head, head_dim, scale);
}

// Every head at once, positions in order, for R rows (1 <= R <=
// ATTENTION_ROWS_MAX) of one sequence; out, query: (R, n_heads * head_dim);
// all_scores: (R, n_heads, n_context + R - 1). R is a constant at each call
// site, so the register loops unroll.
AVX2_INLINE void attention_rows_slot_major(float* out, const float* query, const kv_layer_view* kv, int n_context,
                                           int R, int n_heads, int n_kv_heads, int head_dim, float* all_scores) {
    const int kv_dim = n_kv_heads * head_dim, last_context = n_context + R - 1;
    const int slot_stride = kv_view_slot_heads(kv, n_kv_heads) * head_dim; // kv_dim unless a view of some heads
    const int queries_per_kv_head = n_heads / n_kv_heads;
    const size_t width = (size_t)n_heads * (size_t)head_dim;
    const size_t row_scores = (size_t)n_heads * (size_t)last_context; // one row's (n_heads, last_context)
    const float scale = sqrtf((float)head_dim);
    const int G = 8 / R; // heads per dots_rows call
    const uint16_t* slots[POSITION_RUN];
    const uint16_t* next_slots[POSITION_RUN];
    const uint16_t* heads[POSITION_RUN];
    float dots[ATTENTION_ROWS_MAX * 8]; // (R, G): one slot's dots of a head group
    // 2 or 4 rows on AVX-512 with no scalar tail: the paired key pass
    // (keys8_row_pairs), its queries packed here.
    __m512 packed_storage[PACKED_QUERY_FLOATS / 16];
    const __m512* packed = NULL;
    if ((R == 2 || R == 4 || (R == 1 && n_heads % 2 == 0)) && head_dim % 8 == 0 &&
        width * (size_t)R <= PACKED_QUERY_FLOATS && cpu_simd_level_selected() >= CPU_SIMD_AVX512) {
        if (R == 1)
            pack_head_pairs(packed_storage, query, n_heads, head_dim);
        else
            pack_query_pairs(packed_storage, query, width, R, n_heads, head_dim);
        packed = packed_storage;
    }
    // Keys: the shared positions for every row at once, then each row's own.
    for (int t0 = 0; t0 < last_context; t0 += POSITION_RUN) {
        int n = last_context - t0 < POSITION_RUN ? last_context - t0 : POSITION_RUN;
        gather_run(slots, kv->key_slots, kv, t0, n, slot_stride);
        prime_block_jump(kv->key_slots, kv, t0 + AHEAD_RUNS * POSITION_RUN, last_context, slot_stride);
        int n_next = last_context - (t0 + n) < POSITION_RUN ? last_context - (t0 + n) : POSITION_RUN;
        if (n_next > 0) gather_run(next_slots, kv->key_slots, kv, t0 + n, n_next, slot_stride);
        // Positions every row sees, 8 slots at a time, each head group on
        // them before the next 8: the keys are read in position order, not
        // once per head group (at 8192 tokens paged 11% faster, contiguous
        // 6%). The scores of the 8 slots are transposed in registers and
        // stored as 8 consecutive positions of each (row, head), not one
        // float at a time.
        const int shared = n_context - t0 >= n ? n : n_context - t0 > 0 ? n_context - t0 : 0;
        for (int s8 = 0; s8 < shared; s8 += 8) {
            const int count = shared - s8 < 8 ? shared - s8 : 8;
            if (packed && count == 8) {
                for (int k = s8; k < s8 + 8 && k < n_next; k++) prefetch_rows(next_slots, k, k + 1, kv_dim);
                keys8_row_pairs(all_scores + (size_t)(t0 + s8), row_scores, (size_t)last_context, slots + s8, packed,
                                R, n_heads, queries_per_kv_head, head_dim, scale);
                continue;
            }
            for (int h0 = 0; h0 < n_heads; h0 += G) {
                const int m = n_heads - h0 < G ? n_heads - h0 : G, live = m * R;
                __m256 block[8];
                UNROLL8 for (int k = 0; k < 8; k++) {
                    if (k >= count) {
                        block[k] = _mm256_setzero_ps();
                        continue;
                    }
                    if (h0 == 0 && s8 + k < n_next) prefetch_rows(next_slots, s8 + k, s8 + k + 1, kv_dim);
                    block[k] = dots_vector(query, width, slots[s8 + k], R, h0, m, queries_per_kv_head, head_dim, scale);
                }
                transpose8(block); // block[a]: lane k = slot s8 + k's score of lane a (row a % R, head h0 + a / R)
                const __m256i first = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                UNROLL8 for (int a = 0; a < 8; a++) {
                    if (a >= live) continue;
                    float* to = all_scores + (size_t)(a % R) * row_scores + (size_t)(h0 + a / R) * (size_t)last_context +
                                (size_t)(t0 + s8);
                    if (count == 8) _mm256_storeu_ps(to, block[a]);
                    else _mm256_maskstore_ps(to, first, block[a]);
                }
            }
        }
        for (int s = shared; s < n; s++) {
            if (s < n_next) prefetch_rows(next_slots, s, s + 1, kv_dim);
            const int t = t0 + s;
            const int first_row = t < n_context ? 0 : t - n_context + 1; // rows that see position t
            const int rows = R - first_row;
            for (int h0 = 0; h0 < n_heads; h0 += rows == R ? G : 8) {
                if (rows == R) {
                    int m = n_heads - h0 < G ? n_heads - h0 : G;
                    dots_rows(dots, 8, query, width, slots[s], R, h0, m, queries_per_kv_head, head_dim, scale);
                    for (int j = 0; j < R; j++)
                        for (int g = 0; g < m; g++)
                            all_scores[(size_t)j * row_scores + (size_t)(h0 + g) * (size_t)last_context + (size_t)t] =
                                dots[j * 8 + g];
                    continue;
                }
                int m = n_heads - h0 < 8 ? n_heads - h0 : 8;
                for (int j = first_row; j < R; j++) { // a position only the later rows see: row by row
                    dots_rows(dots, 8, query + (size_t)j * width, width, slots[s], 1, h0, m, queries_per_kv_head,
                              head_dim, scale);
                    for (int g = 0; g < m; g++)
                        all_scores[(size_t)j * row_scores + (size_t)(h0 + g) * (size_t)last_context + (size_t)t] =
                            dots[g];
                }
            }
        }
    }
    for (int j = 0; j < R; j++)
        for (int h = 0; h < n_heads; h++)
            softmax8(all_scores + (size_t)j * row_scores + (size_t)h * (size_t)last_context, n_context + j);
    memset(out, 0, (size_t)R * width * sizeof(float));
    // The 16-lane value pass where it helps (same bits, see add_scaled_rows_x16).
    const bool wide_values = (R == 2 || R == 4) && head_dim >= AVX512_BLOCK_COLUMNS(R) &&
                             cpu_simd_level_selected() >= CPU_SIMD_AVX512;
    // One row: heads in pairs (add_scaled_head_pair_avx512).
    const bool paired_heads = R == 1 && n_heads % 2 == 0 && head_dim >= 64 &&
                              cpu_simd_level_selected() >= CPU_SIMD_AVX512;
    const uint16_t* next_heads[POSITION_RUN]; // head h + 1's value rows when paired
    // Values: runs of the shared positions for all rows, then the rest row by row.
    for (int t0 = 0; t0 < n_context; t0 += POSITION_RUN) {
        int n = n_context - t0 < POSITION_RUN ? n_context - t0 : POSITION_RUN;
        gather_run(slots, kv->value_slots, kv, t0, n, slot_stride);
        prime_block_jump(kv->value_slots, kv, t0 + AHEAD_RUNS * POSITION_RUN, n_context, slot_stride);
        int n_next = n_context - (t0 + n) < POSITION_RUN ? n_context - (t0 + n) : POSITION_RUN;
        if (n_next > 0) gather_run(next_slots, kv->value_slots, kv, t0 + n, n_next, slot_stride);
        for (int h = 0; h < n_heads; h++) {
            prefetch_rows(next_slots, h * n_next / n_heads, (h + 1) * n_next / n_heads, kv_dim);
            const size_t head_offset = (size_t)(h / queries_per_kv_head) * (size_t)head_dim;
            for (int s = 0; s < n; s++) heads[s] = slots[s] + head_offset;
            float* out_head = out + (size_t)h * (size_t)head_dim;
            const float* p = all_scores + (size_t)h * (size_t)last_context + (size_t)t0;
            if (paired_heads) { // heads h and h + 1 together
                prefetch_rows(next_slots, (h + 1) * n_next / n_heads, (h + 2) * n_next / n_heads, kv_dim);
                const size_t next_offset = (size_t)((h + 1) / queries_per_kv_head) * (size_t)head_dim;
                for (int s = 0; s < n; s++) next_heads[s] = slots[s] + next_offset;
                add_scaled_head_pair_avx512(out_head, p, p + last_context, heads, next_heads, n, head_dim);
                h++;
            } else if (wide_values)
                add_scaled_rows_avx512(out_head, width, p, row_scores, heads, n, R, head_dim);
            else
                add_scaled_rows(out_head, width, p, row_scores, heads, n, R, head_dim);
        }
    }
    if (R > 1) {
        gather_run(slots, kv->value_slots, kv, n_context, R - 1, slot_stride);
        for (int j = 1; j < R; j++)
            for (int h = 0; h < n_heads; h++) {
                const size_t head_offset = (size_t)(h / queries_per_kv_head) * (size_t)head_dim;
                for (int s = 0; s < j; s++) heads[s] = slots[s] + head_offset;
                add_scaled_run(out + (size_t)j * width + (size_t)h * (size_t)head_dim,
                               all_scores + (size_t)j * row_scores + (size_t)h * (size_t)last_context +
                                   (size_t)n_context,
                               heads, j, head_dim);
            }
    }
}

// One head at a time, with scratch for one head's scores: (n_context).
AVX2_TARGET static void attention_head_major(float* out, const float* query, const kv_layer_view* kv, int n_context,
                                             int n_heads, int n_kv_heads, int head_dim, float* scores) {
    const int slot_stride = kv_view_slot_heads(kv, n_kv_heads) * head_dim;
    const int queries_per_kv_head = n_heads / n_kv_heads;
    const uint16_t* keys = kv->key_slots;
    const uint16_t* values = kv->value_slots;
    const float scale = sqrtf((float)head_dim);
    for (int h = 0; h < n_heads; h++) {
        const float* q = query + (size_t)h * (size_t)head_dim;
        const size_t head_offset = (size_t)(h / queries_per_kv_head) * (size_t)head_dim;
        for (int t = 0; t < n_context; t++) {
            int64_t slot = kv_slot_of_position(kv->block_table, kv->block_size, t);
            scores[t] = dot_f16(q, keys + (size_t)slot * (size_t)slot_stride + head_offset, head_dim) / scale;
        }
        softmax8(scores, n_context);
        float* out_head = out + (size_t)h * (size_t)head_dim;
        memset(out_head, 0, (size_t)head_dim * sizeof(float));
        for (int t = 0; t < n_context; t++) {
            int64_t slot = kv_slot_of_position(kv->block_table, kv->block_size, t);
            add_scaled_f16(out_head, scores[t], values + (size_t)slot * (size_t)slot_stride + head_offset, head_dim);
        }
    }
}

AVX2_TARGET void attention_rows_f16_avx2(float* out, const float* query, const kv_layer_view* kv, int n_context,
                                         int n_rows, int n_heads, int n_kv_heads, int head_dim, float* all_scores) {
    switch (n_rows) {
    case 1: attention_rows_slot_major(out, query, kv, n_context, 1, n_heads, n_kv_heads, head_dim, all_scores); break;
    case 2: attention_rows_slot_major(out, query, kv, n_context, 2, n_heads, n_kv_heads, head_dim, all_scores); break;
    case 3: attention_rows_slot_major(out, query, kv, n_context, 3, n_heads, n_kv_heads, head_dim, all_scores); break;
    case 4: attention_rows_slot_major(out, query, kv, n_context, 4, n_heads, n_kv_heads, head_dim, all_scores); break;
    default: break; // larger groups are never asked for (ATTENTION_ROWS_MAX)
    }
}

void attention_row_f16_avx2(float* out, const float* query, const kv_layer_view* kv, int n_context, int n_heads,
                            int n_kv_heads, int head_dim, float* scores, float* all_scores) {
    if (all_scores)
        attention_rows_f16_avx2(out, query, kv, n_context, 1, n_heads, n_kv_heads, head_dim, all_scores);
    else
        attention_head_major(out, query, kv, n_context, n_heads, n_kv_heads, head_dim, scores);
}
