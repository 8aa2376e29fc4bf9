// forward_cuda: the forward pass of engine/forward.h on an NVIDIA GPU
// (--backend cuda), through the kernels of kernels/cuda.
//
// The engine's scheduler, block manager and step record stay on the host
// and are the same code: only the math moves. At init every weight matrix
// is uploaded once, and the KV pool becomes one device allocation
// (cudaMalloc, never managed memory) with the layout of engine/kv_memory.h,
// so block ids and slots mean the same on both sides. Each step uploads
// the batch's token ids, positions, slots and block tables in one copy,
// replays the step's copy-on-write block copies on the device pool, runs
// the layers, and copies the wanted logits back. Byte and FLOP counts come
// from the same accounting as the CPU's (each CUDA kernel adds the CPU
// kernel's figures); the time of the pass comes from CUDA events.
//
// Built as a stub that reports "built without CUDA" when nvcc was absent.
#ifndef SERVELAB_FORWARD_CUDA_H
#define SERVELAB_FORWARD_CUDA_H

#include <stdint.h>

#include "base/error.h"
#include "engine/forward.h"
#include "engine/kv_blocks.h"
#include "engine/kv_memory.h"
#include "engine/model.h"
#include "kernels/cpu/kernel_traffic.h"

typedef struct forward_cuda forward_cuda;

// Opens the device, uploads m's weights and makes a device KV pool shaped
// like `kv` (its dtype, blocks, block size), for batches of up to max_rows
// rows. Fails with one line: no device, out of device memory, a CUDA call.
int forward_cuda_init(forward_cuda** out, const model* m, const kv_memory* kv, int max_rows, error_info* err);
void forward_cuda_free(forward_cuda* fc); // NULL is fine

// forward() on the GPU: the same batch, the same logits (rows with
// wants_logits, in row order, (n, vocab_size) floats on the host). First
// replays the BLOCK_COPY events among events[0 .. n_events) (the step's
// copy-on-write copies, made by the block manager on the host pool) on the
// device pool. *device_ns: the pass's time on the GPU (CUDA events).
int forward_cuda_run(forward_cuda* fc, const model* m, const forward_batch* batch, const block_event* events,
                     int n_events, float* logits, kernel_traffic* traffic, uint64_t* device_ns, error_info* err);

#endif
