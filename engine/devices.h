// devices: models of accelerators, to project a measured step onto them
// ("this step on an H100 would take ..."). Data only: the projection is
// the roofline, time = max(bytes / bandwidth, FLOPs / peak rate).
#ifndef SERVELAB_DEVICES_H
#define SERVELAB_DEVICES_H

#include <stdint.h>

typedef struct device_model {
    const char* name;
    double bandwidth_bytes_per_s; // HBM / GDDR bandwidth
    double capacity_bytes;        // device memory
    double peak_fp16_flops;       // dense tensor-core FP16 (FP32 accumulate where vendors list both)
    double peak_int8_ops;         // dense tensor-core INT8
} device_model;

// The models, in a fixed order (A100, H100, H200, L4, RTX 4090).
const device_model* device_models(int* count);

// Seconds one step of `bytes` and `flops` takes on the device under the
// roofline (int8: use the INT8 peak).
double device_step_seconds(const device_model* d, uint64_t bytes, uint64_t flops, int int8);

// The ridge point: FLOP per byte where the roofline turns from memory- to compute-bound.
double device_ridge_point(const device_model* d, int int8);

#endif
