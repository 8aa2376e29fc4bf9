#include "engine/kv_memory.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/streamed_memory.h"

int kv_memory_init(kv_memory* kv, const model_config* config, kv_dtype dtype, int n_blocks, int block_size,
                   error_info* err) {
    memset(kv, 0, sizeof *kv);
    if (n_blocks <= 0 || block_size <= 0)
        return error_set(err, "kv cache: expected positive block count and block size, found %d blocks of %d",
                         n_blocks, block_size);
    kv->dtype = dtype;
    kv->n_layers = config->n_layers;
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->kv_dim = config->kv_dim;
    kv->n_kv_heads = config->n_kv_heads;
    kv->head_dim = config->head_dim;
    size_t elements = (size_t)config->n_layers * (size_t)n_blocks * (size_t)block_size * (size_t)config->kv_dim;
    size_t element_bytes = (size_t)kv_dtype_bytes(dtype);
    if (elements > SIZE_MAX / 2 / element_bytes)
        return error_set(err, "kv cache: %d blocks of %d slots do not fit in memory", n_blocks, block_size);
    // Zeroed, on huge pages where it is large (streamed_memory.h), and not
    // touched here: a page becomes resident when a block on it is first
    // written, so a pool far larger than the workload costs only what the
    // workload fills. (Every slot is written by the forward pass before
    // attention reads it; untouched pages read as zeros anyway.)
    kv->keys = streamed_memory_map_zeroed(elements * element_bytes);
    kv->values = streamed_memory_map_zeroed(elements * element_bytes);
    bool scales_ok = true;
    if (dtype == KV_I8) {
        size_t n_scales = elements / (size_t)config->head_dim;
        kv->key_scales = calloc(n_scales, sizeof(float));
        kv->value_scales = calloc(n_scales, sizeof(float));
        scales_ok = kv->key_scales && kv->value_scales;
    }
    if (!kv->keys || !kv->values || !scales_ok) {
        kv_memory_free(kv);
        return error_set(err, "kv cache: out of memory for %zu bytes", 2 * elements * element_bytes);
    }
    return 0;
}

// Bytes of the keys (or of the values) array; the mapping's length.
static size_t array_bytes(const kv_memory* kv) {
    return (size_t)kv->n_layers * (size_t)kv->n_blocks * (size_t)kv->block_size * (size_t)kv->kv_dim *
           (size_t)kv_dtype_bytes(kv->dtype);
}

void kv_memory_free(kv_memory* kv) {
    streamed_memory_unmap(kv->keys, array_bytes(kv));
    streamed_memory_unmap(kv->values, array_bytes(kv));
    free(kv->key_scales);
    free(kv->value_scales);
    memset(kv, 0, sizeof *kv);
}

uint64_t kv_memory_block_bytes(const model_config* config, kv_dtype dtype, int block_size) {
    return 2ull * (uint64_t)block_size * (uint64_t)config->n_layers *
           (uint64_t)kv_slot_bytes(dtype, config->n_kv_heads, config->head_dim);
}

uint64_t kv_memory_bytes(const kv_memory* kv) {
    return 2ull * (uint64_t)kv->n_blocks * (uint64_t)kv->block_size * (uint64_t)kv->n_layers *
           (uint64_t)kv_slot_bytes(kv->dtype, kv->n_kv_heads, kv->head_dim);
}

// Bytes from the start of one layer's slots to the next layer's.
static size_t layer_stride_bytes(const kv_memory* kv) {
    return (size_t)kv->n_blocks * (size_t)kv->block_size * (size_t)kv->kv_dim * (size_t)kv_dtype_bytes(kv->dtype);
}

void* kv_memory_layer_keys(const kv_memory* kv, int layer) {
    return (char*)kv->keys + (size_t)layer * layer_stride_bytes(kv);
}

void* kv_memory_layer_values(const kv_memory* kv, int layer) {
    return (char*)kv->values + (size_t)layer * layer_stride_bytes(kv);
}

static size_t layer_scale_stride(const kv_memory* kv) {
    return (size_t)kv->n_blocks * (size_t)kv->block_size * (size_t)kv->n_kv_heads;
}

float* kv_memory_layer_key_scales(const kv_memory* kv, int layer) {
    return kv->key_scales ? kv->key_scales + (size_t)layer * layer_scale_stride(kv) : NULL;
}

float* kv_memory_layer_value_scales(const kv_memory* kv, int layer) {
    return kv->value_scales ? kv->value_scales + (size_t)layer * layer_scale_stride(kv) : NULL;
}

uint64_t kv_memory_copy_block(kv_memory* kv, int source, int destination, int n_slots) {
    size_t slot_bytes = (size_t)kv->kv_dim * (size_t)kv_dtype_bytes(kv->dtype);
    size_t block_bytes = (size_t)kv->block_size * slot_bytes;
    size_t copy_bytes = (size_t)n_slots * slot_bytes;
    for (int l = 0; l < kv->n_layers; l++) {
        char* keys = kv_memory_layer_keys(kv, l);
        char* values = kv_memory_layer_values(kv, l);
        memcpy(keys + (size_t)destination * block_bytes, keys + (size_t)source * block_bytes, copy_bytes);
        memcpy(values + (size_t)destination * block_bytes, values + (size_t)source * block_bytes, copy_bytes);
        if (kv->dtype == KV_I8) {
            size_t block_scales = (size_t)kv->block_size * (size_t)kv->n_kv_heads;
            size_t copy_scales = (size_t)n_slots * (size_t)kv->n_kv_heads * sizeof(float);
            float* key_scales = kv_memory_layer_key_scales(kv, l);
            float* value_scales = kv_memory_layer_value_scales(kv, l);
            memcpy(key_scales + (size_t)destination * block_scales, key_scales + (size_t)source * block_scales, copy_scales);
            memcpy(value_scales + (size_t)destination * block_scales, value_scales + (size_t)source * block_scales,
                   copy_scales);
        }
    }
    return 2ull * (uint64_t)kv->n_layers * (uint64_t)n_slots *
           (uint64_t)kv_slot_bytes(kv->dtype, kv->n_kv_heads, kv->head_dim);
}

uint64_t kv_memory_available_bytes(void) {
    // MemAvailable: what can be allocated without swapping (free memory plus
    // reclaimable caches), as the kernel estimates it.
    FILE* meminfo = fopen("/proc/meminfo", "r");
    if (meminfo) {
        char line[256];
        unsigned long long kib = 0;
        bool found = false;
        while (!found && fgets(line, sizeof line, meminfo))
            found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
        fclose(meminfo);
        if (found) return (uint64_t)kib * 1024u;
    }
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0) return (uint64_t)pages * (uint64_t)page_size;
    return UINT64_MAX; // unknown: no limit from here
}

void kv_memory_format_bytes(uint64_t bytes, char* out, size_t capacity) {
    static const char* const UNITS[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double value = (double)bytes;
    int unit = 0;
    while (value >= 1024.0 && unit < 6) {
        value /= 1024.0;
        unit++;
    }
    if (unit == 0) snprintf(out, capacity, "%llu bytes", (unsigned long long)bytes);
    else snprintf(out, capacity, "%.1f %s", value, UNITS[unit]);
}

int kv_memory_check_fits(const char* what, uint64_t bytes, error_info* err) {
    uint64_t available = kv_memory_available_bytes();
    if (bytes <= available) return 0;
    char asked[32], have[32];
    kv_memory_format_bytes(bytes, asked, sizeof asked);
    kv_memory_format_bytes(available, have, sizeof have);
    return error_set(err, "%s: the KV cache would take %s but only %s of memory is available (MemAvailable); "
                          "ask for less",
                     what, asked, have);
}
