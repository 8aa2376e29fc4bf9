#include "engine/kv_memory.h"

#include <stdlib.h>
#include <string.h>

int kv_memory_init(kv_memory* kv, const model_config* config, int n_blocks, int block_size, error_info* err) {
    memset(kv, 0, sizeof *kv);
    if (n_blocks <= 0 || block_size <= 0)
        return error_set(err, "kv cache: expected positive block count and block size, found %d blocks of %d",
                         n_blocks, block_size);
    kv->n_layers = config->n_layers;
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->kv_dim = config->kv_dim;
    size_t floats = (size_t)config->n_layers * (size_t)n_blocks * (size_t)block_size * (size_t)config->kv_dim;
    kv->keys = calloc(floats, sizeof(float));
    kv->values = calloc(floats, sizeof(float));
    if (!kv->keys || !kv->values) {
        kv_memory_free(kv);
        return error_set(err, "kv cache: out of memory for %zu bytes", 2 * floats * sizeof(float));
    }
    return 0;
}

void kv_memory_free(kv_memory* kv) {
    free(kv->keys);
    free(kv->values);
    memset(kv, 0, sizeof *kv);
}

uint64_t kv_memory_bytes(const kv_memory* kv) {
    return 2ull * (uint64_t)kv->n_blocks * (uint64_t)kv->block_size * (uint64_t)kv->n_layers * (uint64_t)kv->kv_dim *
           sizeof(float);
}

static size_t layer_stride(const kv_memory* kv) {
    return (size_t)kv->n_blocks * (size_t)kv->block_size * (size_t)kv->kv_dim;
}

float* kv_memory_layer_keys(const kv_memory* kv, int layer) { return kv->keys + (size_t)layer * layer_stride(kv); }

float* kv_memory_layer_values(const kv_memory* kv, int layer) {
    return kv->values + (size_t)layer * layer_stride(kv);
}
