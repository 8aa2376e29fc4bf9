// streamed_memory: allocations that the kernels stream through every step
// (a model's weights, their quantized or sharded copies, the KV cache).
//
// Large blocks start on a 2 MiB boundary with a transparent-huge-page hint.
// Streamed through 4 KiB pages, every 4 KiB costs a TLB miss, and a paged KV
// cache read in a scattered block order pays it at every jump: the 85 fp16
// matrices of stories110m streamed 1.15x faster on huge pages, and a
// shuffled 16-slot-block cache of its shape read 1.10-1.15x slower than a
// contiguous one against 1.15-1.17x on small pages (512 and 2048 tokens,
// medians of paired runs on 2 Zen 5 cores). Where the kernel has no huge
// pages to give, the memory works the same on small pages.
#ifndef SERVELAB_STREAMED_MEMORY_H
#define SERVELAB_STREAMED_MEMORY_H

#include <stddef.h>

// `bytes` (a multiple of 64) of uninitialised memory, 64-byte aligned;
// NULL when out of memory. free() releases it.
void* streamed_memory_alloc(size_t bytes);

// The same, zeroed (any bytes > 0; rounded up to 64 internally).
void* streamed_memory_calloc(size_t bytes);

#endif
