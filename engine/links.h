// links: models of the interconnect between accelerators, for the
// simulated tensor parallelism (engine/tensor_parallel.h). Data only, like
// engine/devices.h: the cost of one all-reduce is the analytic
//   seconds = latency + bytes sent per shard / bandwidth
// where a ring all-reduce of an M-byte message over N shards sends
// 2 (N - 1) / N x M bytes from every shard (and receives as many), all
// shards at once, each over its own link.
#ifndef SERVELAB_LINKS_H
#define SERVELAB_LINKS_H

#include <stdint.h>

typedef enum link_kind {
    LINK_NVLINK = 0, // NVLink 4 between H100 SXM GPUs
    LINK_PCIE = 1,   // PCIe 4.0 x16 through the host
} link_kind;

typedef struct link_model {
    const char* name;             // "nvlink", "pcie" (as on the command line)
    const char* description;
    double bandwidth_bytes_per_s; // one direction, per GPU
    double latency_seconds;       // fixed cost of one all-reduce (launch, synchronisation)
} link_model;

const link_model* link_model_get(link_kind kind);

// Parses "nvlink" or "pcie". Returns 0 and sets *out, or -1.
int link_kind_parse(const char* text, link_kind* out);

// Bytes each shard sends in one ring all-reduce of message_bytes:
// 2 (N - 1) / N x message_bytes (0 for one shard).
uint64_t link_ring_allreduce_bytes(int n_shards, uint64_t message_bytes);

// Seconds of n_allreduces all-reduces that send bytes_per_shard in total
// from each shard: n_allreduces x latency + bytes_per_shard / bandwidth.
double link_allreduce_seconds(const link_model* link, int n_allreduces, uint64_t bytes_per_shard);

#endif
