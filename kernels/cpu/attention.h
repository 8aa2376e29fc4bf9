// attention: one query row attends to its sequence's cached keys and values.
//
// The cache is paged: a layer's keys live in fixed-size blocks of
// block_size token slots, and a sequence's block table lists, in order, the
// physical block that holds each run of block_size positions. Position p is
// found at block block_table[p / block_size], slot p % block_size. A
// contiguous cache is the special case block_size = 1 with consecutive ids
// (or one big block).
//
// For each head h (sharing KV head h / (n_heads / n_kv_heads)):
//   score[t] = q_h . k_t / sqrt(head_dim)      t = 0 .. n_context-1
//   p = softmax(score);  out_h = sum_t p[t] v_t
// The sums run over t in position order whatever the block size or layout,
// so the result is bit-identical for any block size (DESIGN.md). Keys and
// values are stored as fp32 or fp16 (widened when read; math in fp32).
#ifndef SERVELAB_ATTENTION_H
#define SERVELAB_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cpu/kernel_traffic.h"

typedef enum kv_dtype {
    KV_F16 = 0, // IEEE half, 2 bytes per element (the default, as in vLLM)
    KV_F32 = 1, // float, 4 bytes per element
    KV_I8 = 2,  // int8, 1 byte per element + one fp32 scale per token and KV head
                // (symmetric: scale = max|x| / 127 over that head's head_dim values)
} kv_dtype;

static inline const char* kv_dtype_name(kv_dtype dtype) {
    return dtype == KV_F16 ? "fp16" : dtype == KV_I8 ? "int8" : "fp32";
}

// Bytes of one element (the per-head scales of KV_I8 come on top).
static inline int kv_dtype_bytes(kv_dtype dtype) { return dtype == KV_F16 ? 2 : dtype == KV_I8 ? 1 : 4; }

// Bytes one token's keys (or values) take in one layer: elements + scales.
static inline int kv_slot_bytes(kv_dtype dtype, int n_kv_heads, int head_dim) {
    return n_kv_heads * head_dim * kv_dtype_bytes(dtype) + (dtype == KV_I8 ? n_kv_heads * 4 : 0);
}

typedef struct kv_layer_view {
    kv_dtype dtype;
    const void* key_slots;      // (n_slots, kv_dim) this layer's keys, n_slots = n_blocks * block_size
    const void* value_slots;    // (n_slots, kv_dim) this layer's values
    const int32_t* block_table; // (ceil(n_context / block_size)) physical block ids
    int block_size;             // token slots per block
    const float* key_scales;    // KV_I8: (n_slots, n_kv_heads) per-token, per-head scales; else NULL
    const float* value_scales;  // KV_I8: (n_slots, n_kv_heads)
    // KV heads each slot holds; 0: the n_kv_heads the kernel is given. Set
    // for a view of some of a cache's heads (so that threads can share one
    // row's heads): key_slots, value_slots and the scales then point at the
    // view's first head, and slots keep the whole cache's stride.
    int slot_kv_heads;
} kv_layer_view;

// KV heads per slot of `kv` for a kernel given n_kv_heads (see slot_kv_heads).
static inline int kv_view_slot_heads(const kv_layer_view* kv, int n_kv_heads) {
    return kv->slot_kv_heads > 0 ? kv->slot_kv_heads : n_kv_heads;
}

// out: (n_heads * head_dim); query: (n_heads * head_dim);
// scores: scratch of (n_context) floats.
void attention_row(float* out, const float* query, const kv_layer_view* kv, int n_context, int n_heads,
                   int n_kv_heads, int head_dim, float* scores, kernel_traffic* traffic);

// Most rows attention_rows takes at once.
#define ATTENTION_ROWS_MAX 4

// attention_row for n_rows consecutive rows of one sequence (a prompt):
// row j attends to the first n_context + j positions. out, query:
// (n_rows, n_heads * head_dim); scores: scratch of (n_context + n_rows - 1)
// floats. Each row gets exactly the bits attention_row gives it alone; on
// AVX2 (2 .. ATTENTION_ROWS_MAX rows, any element type) the keys and values
// the rows share are read and widened once for all of them. Traffic is
// reported per row, as n_rows calls of attention_row would.
void attention_rows(float* out, const float* query, const kv_layer_view* kv, int n_context, int n_rows,
                    int n_heads, int n_kv_heads, int head_dim, float* scores, kernel_traffic* traffic);

// Slot index (block * block_size + offset) holding `position` of a sequence.
static inline int64_t kv_slot_of_position(const int32_t* block_table, int block_size, int position) {
    return (int64_t)block_table[position / block_size] * block_size + position % block_size;
}

// Stores one row's new key and value (kv_dim floats each, narrowed to the
// cache's dtype) at `slot`: key_slots/value_slots are (n_slots, kv_dim);
// for KV_I8 the per-head scales go to key_scales/value_scales (n_slots,
// n_kv_heads), else those are NULL.
void kv_write_row(void* key_slots, void* value_slots, float* key_scales, float* value_scales, kv_dtype dtype,
                  int64_t slot, const float* key, const float* value, int n_kv_heads, int head_dim,
                  kernel_traffic* traffic);

#endif
