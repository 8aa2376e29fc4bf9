// Device discovery for the CUDA backend. Every CUDA call's status is checked
// and reported with the call and its file:line.
#include <cstdio>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_info.h"

extern "C" int cuda_backend_built(void) { return 1; }

extern "C" int cuda_device_count(char* message, size_t message_capacity) {
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        snprintf(message, message_capacity, "cudaGetDeviceCount failed at %s:%d: %s", __FILE__, __LINE__,
                 cudaGetErrorString(status));
        return 0;
    }
    if (count == 0)
        snprintf(message, message_capacity, "cudaGetDeviceCount reported 0 devices");
    else {
        cudaDeviceProp properties;
        status = cudaGetDeviceProperties(&properties, 0);
        if (status != cudaSuccess)
            snprintf(message, message_capacity, "cudaGetDeviceProperties failed at %s:%d: %s", __FILE__, __LINE__,
                     cudaGetErrorString(status));
        else
            snprintf(message, message_capacity, "%s, %.1f GiB, compute capability %d.%d", properties.name,
                     (double)properties.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), properties.major,
                     properties.minor);
    }
    return count;
}
