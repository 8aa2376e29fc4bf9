#include "engine/links.h"

#include <string.h>

// Bandwidths are one direction per GPU, as a ring uses them: NVLink 4 has
// 18 links of 25 GB/s each way (900 GB/s both ways, 450 GB/s each way);
// PCIe 4.0 x16 has 16 lanes of 16 GT/s, 31.5 GB/s each way. Latencies are
// the order of magnitude of a small-message NCCL all-reduce on such
// machines (a few microseconds on NVLink, about twice that over PCIe).
static const link_model LINKS[] = {
    {"nvlink", "NVLink 4 (H100 SXM), 450 GB/s per direction", 450e9, 5e-6},
    {"pcie", "PCIe 4.0 x16, 31.5 GB/s per direction", 31.5e9, 10e-6},
};

const link_model* link_model_get(link_kind kind) {
    return &LINKS[kind == LINK_PCIE ? 1 : 0];
}

int link_kind_parse(const char* text, link_kind* out) {
    if (strcmp(text, "nvlink") == 0) *out = LINK_NVLINK;
    else if (strcmp(text, "pcie") == 0) *out = LINK_PCIE;
    else return -1;
    return 0;
}

uint64_t link_ring_allreduce_bytes(int n_shards, uint64_t message_bytes) {
    if (n_shards <= 1) return 0;
    return 2ull * (uint64_t)(n_shards - 1) * message_bytes / (uint64_t)n_shards;
}

double link_allreduce_seconds(const link_model* link, int n_allreduces, uint64_t bytes_per_shard) {
    if (n_allreduces <= 0) return 0.0;
    return (double)n_allreduces * link->latency_seconds + (double)bytes_per_shard / link->bandwidth_bytes_per_s;
}
