#include "engine/devices.h"

// Vendor datasheet figures, dense (no 2:4 sparsity). RTX 4090: FP16 tensor
// rate with FP16 accumulate (82.6 TFLOPS with FP32 accumulate), the one
// inference kernels use. Bandwidths and FLOP rates are decimal (1e12), as
// datasheets give them; memory is what the card holds, in binary units: the
// "80GB" of an H100 is 80 GiB (80 x 2^30, 7.4% more than 80e9 bytes), which
// decides how many sequences fit (Llama-2-7B at 4096 tokens: 33, not 30).
#define GIB 1073741824.0
static const device_model DEVICES[] = {
    {"A100 80GB SXM", 2.039e12, 80 * GIB, 312e12, 624e12},
    {"H100 SXM", 3.35e12, 80 * GIB, 989e12, 1979e12},
    {"H200 SXM", 4.8e12, 141 * GIB, 989e12, 1979e12},
    {"L4", 0.3e12, 24 * GIB, 121e12, 242e12},
    {"RTX 4090", 1.008e12, 24 * GIB, 165e12, 661e12},
};

const device_model* device_models(int* count) {
    *count = (int)(sizeof DEVICES / sizeof DEVICES[0]);
    return DEVICES;
}

double device_step_seconds(const device_model* d, uint64_t bytes, uint64_t flops, int int8) {
    double memory = (double)bytes / d->bandwidth_bytes_per_s;
    double compute = (double)flops / (int8 ? d->peak_int8_ops : d->peak_fp16_flops);
    return memory > compute ? memory : compute;
}

double device_ridge_point(const device_model* d, int int8) {
    return (int8 ? d->peak_int8_ops : d->peak_fp16_flops) / d->bandwidth_bytes_per_s;
}
