// kernel_traffic: what one kernel call read, wrote and computed.
//
// DESIGN.md: byte and FLOP counts come from the kernels that did the work,
// never from a separate estimate. Every kernel takes a kernel_traffic* (may
// be NULL) and adds its own figures to it, under the rule "every operand is
// read once per call": a weight matrix multiplied by a batch of rows counts
// its bytes once, however many rows there are.
#ifndef SERVELAB_KERNEL_TRAFFIC_H
#define SERVELAB_KERNEL_TRAFFIC_H

#include <stdint.h>

typedef struct kernel_traffic {
    uint64_t weight_bytes_read;     // bytes of model weights (payload + scales)
    uint64_t kv_bytes_read;         // bytes of cached keys and values attended to
    uint64_t kv_bytes_written;      // bytes of new keys and values stored
    uint64_t activation_bytes;      // bytes of activations read plus written
    uint64_t matmul_flops;          // 2 per multiply-add in weight matmuls
    uint64_t attention_flops;       // 2 per multiply-add in q.k and p.v
} kernel_traffic;

// Adds every field of `part` into `total`.
void traffic_add(kernel_traffic* total, const kernel_traffic* part);

#endif
