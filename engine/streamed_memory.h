// streamed_memory: allocations that the kernels stream through every step
// (a model's weights, their quantized or sharded copies, the KV cache).
//
// Large blocks start on a 2 MiB boundary with a transparent-huge-page hint,
// because streamed through 4 KiB pages every 4 KiB costs a TLB miss, and a
// paged KV cache read in a scattered block order pays it at every jump: on
// huge pages stories110m's fp16 weights stream 1.15x faster
// (docs/bench-log.md, "Huge pages for streamed memory"). Where the kernel
// has no huge pages to give, the memory works the same on small pages.
#ifndef SERVELAB_STREAMED_MEMORY_H
#define SERVELAB_STREAMED_MEMORY_H

#include <stddef.h>

// `bytes` (a multiple of 64) of uninitialised memory, 64-byte aligned;
// NULL when out of memory. free() releases it.
void* streamed_memory_alloc(size_t bytes);

// The same, zeroed (any bytes > 0; rounded up to 64 internally). Zeroing
// touches every page now: the whole block is resident from the start.
void* streamed_memory_calloc(size_t bytes);

// Zeroed memory for a large pool that may be mostly unused (the KV cache):
// an anonymous mapping, page-aligned and 2 MiB-aligned with the huge-page
// hint when at least 4 MiB. Nothing is touched here: a page becomes
// resident when it is first written (reading an untouched page gives
// zeros), so a 2 GiB pool of which 10 MiB hold tokens costs about 10 MiB.
// NULL when the address space cannot hold it. Release with
// streamed_memory_unmap(memory, the same bytes), never free().
void* streamed_memory_map_zeroed(size_t bytes);
void streamed_memory_unmap(void* memory, size_t bytes);

#endif
