// The CUDA entry points of a build without nvcc: nothing is found, and the
// message says how to get a CUDA build.
#include <stdio.h>

#include "kernels/cuda/cuda_info.h"

int cuda_backend_built(void) { return 0; }

int cuda_device_count(char* message, size_t message_capacity) {
    snprintf(message, message_capacity, "built without CUDA (nvcc was not found; rebuild with CUDA=1)");
    return 0;
}
