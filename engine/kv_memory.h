// kv_memory: the raw storage of cached keys and values, in blocks.
//
// Layout: keys[layer][block][slot][kv_dim] and the same for values, in fp16
// (default) or fp32. One layer's blocks are contiguous so that attention
// for a layer walks a single array; inside a block the slots of consecutive
// positions sit next to each other, so reading a block's keys is one
// sequential stream of block_size * kv_dim elements (for stories260K with
// block size 16 in fp16: 16 x 32 x 2 = 1 KiB per layer per block).
// Which block belongs to which sequence is not decided here: a block table
// (block ids per sequence) says so. The paged pool (engine/kv_blocks.c)
// and the contiguous allocator (engine/kv_contiguous.c) build on it.
#ifndef SERVELAB_KV_MEMORY_H
#define SERVELAB_KV_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/model.h"
#include "kernels/cpu/attention.h"

typedef struct kv_memory {
    kv_dtype dtype;  // element type of keys and values
    int n_layers;    // model layers
    int n_blocks;    // physical blocks
    int block_size;  // token slots per block
    int kv_dim;      // elements per slot (n_kv_heads * head_dim)
    int n_kv_heads;
    int head_dim;
    void* keys;      // (n_layers, n_blocks, block_size, kv_dim) elements
    void* values;    // (n_layers, n_blocks, block_size, kv_dim) elements
    float* key_scales;   // KV_I8: (n_layers, n_blocks, block_size, n_kv_heads); else NULL
    float* value_scales; // KV_I8: same
} kv_memory;

int kv_memory_init(kv_memory* kv, const model_config* config, kv_dtype dtype, int n_blocks, int block_size,
                   error_info* err);
void kv_memory_free(kv_memory* kv);

// Bytes of one block (keys and values, every layer):
// 2 x block_size x n_layers x kv_dim x bytes per element (+ for int8 the
// per-token, per-head scales: 2 x block_size x n_layers x n_kv_heads x 4).
uint64_t kv_memory_block_bytes(const model_config* config, kv_dtype dtype, int block_size);

// Memory the system can give without swapping: MemAvailable from
// /proc/meminfo, else all physical memory (sysconf), else UINT64_MAX.
uint64_t kv_memory_available_bytes(void);

// "1.5 GiB", "512 bytes": bytes for messages.
void kv_memory_format_bytes(uint64_t bytes, char* out, size_t capacity);

// 0 when a KV cache of `bytes` fits in the available memory; else -1 with
// a message starting with `what` (the flag, e.g. "--kv-mem 1PiB") that
// names both sizes.
int kv_memory_check_fits(const char* what, uint64_t bytes, error_info* err);

// Bytes of keys plus values for all layers and blocks.
uint64_t kv_memory_bytes(const kv_memory* kv);

// The start of layer `layer`'s key (or value) slots: (n_blocks * block_size, kv_dim).
void* kv_memory_layer_keys(const kv_memory* kv, int layer);
void* kv_memory_layer_values(const kv_memory* kv, int layer);
float* kv_memory_layer_key_scales(const kv_memory* kv, int layer);   // NULL unless KV_I8
float* kv_memory_layer_value_scales(const kv_memory* kv, int layer); // NULL unless KV_I8

// Copies the first n_slots slots of block `source` to block `destination`,
// keys and values of every layer (copy-on-write). Returns bytes copied.
uint64_t kv_memory_copy_block(kv_memory* kv, int source, int destination, int n_slots);

#endif
