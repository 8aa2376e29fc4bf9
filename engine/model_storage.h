// model_storage: one allocation holding every tensor of a model.
//
// Loaders and the synthesizer both call model_storage_allocate, which sizes
// the tensors for a config and dtype, allocates them in one 64-byte-aligned
// block (streamed_memory_alloc) and points the model's fields into it; they then fill the values.
#ifndef SERVELAB_MODEL_STORAGE_H
#define SERVELAB_MODEL_STORAGE_H

#include "engine/model.h"

// Allocates out->storage and out->layers for config with matrices of dtype
// (group_size is used for WEIGHT_Q8_0) and sets weight_bytes, n_parameters.
// The values are uninitialised. On failure nothing stays allocated.
int model_storage_allocate(model* out, const model_config* config, weight_dtype dtype, int group_size,
                           error_info* err);

// Where this process's fp16 or fp32 kernel reads a tile layout (matmul.h),
// lays every matrix of the model's dtype that the forward pass multiplies
// with (the layers' and the classifier) out again that way in
// out->tile_storage and points their f16_tiles / f32_tiles at it. Call once
// the values are filled. Without tiles (another
// dtype or SIMD level, or no memory for them) the kernels read the
// row-major values, with the same results.
void model_storage_build_tiles(model* m);

// The layer's matrices by index, in checkpoint order:
// 0 wq, 1 wk, 2 wv, 3 wo, 4 w1, 5 w2, 6 w3.
const weight_matrix* model_storage_layer_matrix(const layer_weights* layer, int index);

#endif
