// cuda_info: is there a CUDA device, and what is it?
//
// Built from kernels/cuda/cuda_info.cu when nvcc is present (CUDA=auto or
// CUDA=1), and from kernels/cuda/cuda_absent.c otherwise, so that the CPU
// build never needs the CUDA toolkit and callers need no #ifdef.
#ifndef SERVELAB_CUDA_INFO_H
#define SERVELAB_CUDA_INFO_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// 1 when this binary was built with the CUDA backend, else 0.
int cuda_backend_built(void);

// Number of CUDA devices found (0 when none or when built without CUDA);
// on 0, message says why in one line (message_capacity bytes).
int cuda_device_count(char* message, size_t message_capacity);

#ifdef __cplusplus
}
#endif

#endif
