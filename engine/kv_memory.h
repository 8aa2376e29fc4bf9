// kv_memory: the raw storage of cached keys and values, in blocks.
//
// Layout: keys[layer][block][slot][kv_dim] and the same for values, fp32.
// One layer's blocks are contiguous so that attention for a layer walks a
// single array; inside a block the slots of consecutive positions sit next
// to each other, so reading a block's keys is one sequential stream of
// block_size * kv_dim floats. Which block belongs to which sequence is not
// decided here: a block table (a list of block ids per sequence) says so.
// The paged block pool (reference counts, sharing, prefix cache) is built
// on top of this storage; plain generation uses one table of consecutive
// blocks.
#ifndef SERVELAB_KV_MEMORY_H
#define SERVELAB_KV_MEMORY_H

#include <stdint.h>

#include "engine/error.h"
#include "engine/model.h"

typedef struct kv_memory {
    int n_layers;   // model layers
    int n_blocks;   // physical blocks
    int block_size; // token slots per block
    int kv_dim;     // floats per slot (n_kv_heads * head_dim)
    float* keys;    // (n_layers, n_blocks, block_size, kv_dim)
    float* values;  // (n_layers, n_blocks, block_size, kv_dim)
} kv_memory;

int kv_memory_init(kv_memory* kv, const model_config* config, int n_blocks, int block_size, error_info* err);
void kv_memory_free(kv_memory* kv);

// Bytes of keys plus values for all layers and blocks:
// 2 x n_blocks x block_size x n_layers x kv_dim x 4.
uint64_t kv_memory_bytes(const kv_memory* kv);

// The start of layer `layer`'s key (or value) blocks.
float* kv_memory_layer_keys(const kv_memory* kv, int layer);
float* kv_memory_layer_values(const kv_memory* kv, int layer);

#endif
