// machine_probe: the two numbers every roofline on this machine is drawn
// against, measured rather than looked up.
//
//   bandwidth: how fast all threads together can stream a buffer far larger
//              than the last-level cache from main memory (GB/s, 1e9 bytes);
//   peak FMA:  how many fp32 FLOPs per second all threads together reach
//              with independent fused multiply-adds at the process's SIMD
//              level (GFLOP/s, 2 FLOPs per lane per FMA).
//
// Decode is bounded by the first (time per token >= bytes per token /
// bandwidth), prefill by the second; `servelab bench` divides what the
// engine achieves by these. Both return the median of `repeats` runs (the
// machine may be shared, and a median ignores the odd slow run) and 0 when
// they cannot run (the buffer cannot be allocated).
#ifndef SERVELAB_MACHINE_PROBE_H
#define SERVELAB_MACHINE_PROBE_H

#include <stddef.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"

// Size of the last-level (L3) cache in bytes as the OS reports it, or 32 MiB
// when it does not say.
size_t machine_l3_cache_bytes(void);

// The default streaming buffer: 8 x the L3 and at least 256 MiB, so that
// at most 1/8 of what is read can come from the cache, capped at 4 GiB.
size_t machine_stream_default_bytes(void);

// Streaming-read bandwidth in GB/s: every thread of `pool` (NULL: the caller
// alone) sums its own contiguous share of a buffer_bytes buffer (0: the
// default above) with vector loads; the buffer is touched once first (page
// faults are not bandwidth). repeats < 1 counts as 1.
double machine_stream_read_gb_s(thread_pool* pool, size_t buffer_bytes, int repeats);

// One stretch of memory a gather read visits: `bytes` from `start`
// (64-byte aligned, bytes a multiple of 64).
typedef struct probe_chunk {
    const void* start;
    size_t bytes;
} probe_chunk;

// Seconds the calling thread takes to read chunks[0 .. n_chunks) in order
// with vector loads, computing nothing: what the memory system alone makes
// of an access pattern, such as a paged KV cache's scattered blocks against
// one contiguous run of the same bytes. prefetch_ahead_bytes 0 leaves the
// prefetching to the hardware; otherwise every line that far ahead in the
// chunks' order is asked for in software as the attention kernel asks for
// its next run, and the pages of the chunk after are primed.
double machine_gather_read_seconds(const probe_chunk* chunks, int n_chunks, size_t prefetch_ahead_bytes);

// Peak fp32 FMA rate in GFLOP/s at the process's SIMD level
// (cpu_simd_level_selected(): AVX-512, AVX2 or scalar), every thread of
// `pool` running independent FMA chains out of registers.
double machine_peak_fma_gflop_s(thread_pool* pool, int repeats);

// The same at an explicit level (lowered to what the CPU has).
double machine_peak_fma_gflop_s_at_level(thread_pool* pool, cpu_simd_level level, int repeats);

// The median of n > 0 values (sorts them in place): how every repeated
// measurement here and in `servelab bench` is summarised.
double probe_median(double* values, int n);

#endif
