// cuda_context: opening the device, device memory, copies, events, scratch.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cuda_common.cuh"

static int context_open(cuda_context* context, error_info* err);

extern "C" int cuda_context_create(cuda_context** out, error_info* err) {
    *out = NULL;
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0)
        return error_set(err, "no CUDA device found (%s)",
                         status != cudaSuccess ? cudaGetErrorString(status) : "cudaGetDeviceCount returned 0");
    cuda_context* context = (cuda_context*)calloc(1, sizeof *context);
    if (!context) return error_set(err, "cuda_context_create: out of host memory");
    if (context_open(context, err)) {
        cuda_context_destroy(context); // frees whatever was made before the failure
        return -1;
    }
    *out = context;
    return 0;
}

static int context_open(cuda_context* context, error_info* err) {
    context->device = 0;
    CUDA_CHECK(cudaSetDevice(context->device), err);
    cudaDeviceProp properties;
    CUDA_CHECK(cudaGetDeviceProperties(&properties, context->device), err);
    context->n_multiprocessors = properties.multiProcessorCount;
    snprintf(context->device_name, sizeof context->device_name, "%.200s, %.1f GiB, compute capability %d.%d, %d SMs",
             properties.name, (double)properties.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), properties.major,
             properties.minor, properties.multiProcessorCount);
    if (properties.major < 8)
        return error_set(err, "%s: the CUDA backend is built for compute capability 8.0 and later",
                         context->device_name);
    CUDA_CHECK(cudaStreamCreateWithFlags(&context->stream, cudaStreamNonBlocking), err);
    CUDA_CHECK(cudaEventCreate(&context->timer_start), err);
    CUDA_CHECK(cudaEventCreate(&context->timer_stop), err);
    CUBLAS_CHECK(cublasCreate(&context->cublas), err);
    CUBLAS_CHECK(cublasSetStream(context->cublas, context->stream), err);
    // fp32 GEMMs stay fp32 (no TF32), so that WEIGHT_F32 results stay
    // close to the CPU reference.
    CUBLAS_CHECK(cublasSetMathMode(context->cublas, CUBLAS_DEFAULT_MATH), err);
    CUBLAS_CHECK(cublasLtCreate(&context->cublas_lt), err);
    CUDA_CHECK(cudaMalloc(&context->cublas_lt_workspace, CUBLASLT_WORKSPACE_BYTES), err);
    return 0;
}

extern "C" void cuda_context_destroy(cuda_context* context) {
    if (!context) return;
    if (context->stream) cudaStreamSynchronize(context->stream);
    for (int i = 0; i < 4; i++)
        cudaFree(context->scratch[i]);
    cudaFree(context->cublas_lt_workspace);
    cudaFree(context->rope_frequencies);
    if (context->cublas_lt) cublasLtDestroy(context->cublas_lt);
    if (context->cublas) cublasDestroy(context->cublas);
    if (context->timer_start) cudaEventDestroy(context->timer_start);
    if (context->timer_stop) cudaEventDestroy(context->timer_stop);
    if (context->stream) cudaStreamDestroy(context->stream);
    free(context);
}

extern "C" const char* cuda_context_device_name(const cuda_context* context) { return context->device_name; }

extern "C" int cuda_device_alloc(cuda_context* context, void** device_out, size_t bytes, const char* what,
                                 error_info* err) {
    (void)context;
    *device_out = NULL;
    cudaError_t status = cudaMalloc(device_out, bytes > 0 ? bytes : 1);
    if (status != cudaSuccess) {
        *device_out = NULL;
        return error_set(err, "%s: cudaMalloc of %zu bytes failed at %s:%d: %s", what, bytes, __FILE__, __LINE__,
                         cudaGetErrorString(status));
    }
    return 0;
}

extern "C" void cuda_device_free(void* device_pointer) {
    if (device_pointer) cudaFree(device_pointer);
}

extern "C" int cuda_copy_to_device(cuda_context* context, void* device_destination, const void* source, size_t bytes,
                                   error_info* err) {
    if (bytes == 0) return 0;
    // Pageable host memory: the copy has finished reading `source` when
    // the call returns, so callers may reuse their buffer at once.
    CUDA_CHECK(cudaMemcpyAsync(device_destination, source, bytes, cudaMemcpyHostToDevice, context->stream), err);
    CUDA_CHECK(cudaStreamSynchronize(context->stream), err);
    return 0;
}

extern "C" int cuda_copy_to_host(cuda_context* context, void* destination, const void* device_source, size_t bytes,
                                 error_info* err) {
    if (bytes == 0) return 0;
    CUDA_CHECK(cudaMemcpyAsync(destination, device_source, bytes, cudaMemcpyDeviceToHost, context->stream), err);
    CUDA_CHECK(cudaStreamSynchronize(context->stream), err);
    return 0;
}

extern "C" int cuda_copy_on_device(cuda_context* context, void* device_destination, const void* device_source,
                                   size_t bytes, error_info* err) {
    if (bytes == 0) return 0;
    CUDA_CHECK(cudaMemcpyAsync(device_destination, device_source, bytes, cudaMemcpyDeviceToDevice, context->stream),
               err);
    return 0;
}

extern "C" int cuda_memset_device(cuda_context* context, void* device_destination, int byte, size_t bytes,
                                  error_info* err) {
    if (bytes == 0) return 0;
    CUDA_CHECK(cudaMemsetAsync(device_destination, byte, bytes, context->stream), err);
    return 0;
}

extern "C" int cuda_synchronize(cuda_context* context, error_info* err) {
    CUDA_CHECK(cudaStreamSynchronize(context->stream), err);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

extern "C" int cuda_timer_start(cuda_context* context, error_info* err) {
    CUDA_CHECK(cudaEventRecord(context->timer_start, context->stream), err);
    return 0;
}

extern "C" int cuda_timer_stop(cuda_context* context, double* elapsed_ms, error_info* err) {
    float milliseconds = 0.0f;
    CUDA_CHECK(cudaEventRecord(context->timer_stop, context->stream), err);
    CUDA_CHECK(cudaEventSynchronize(context->timer_stop), err);
    CUDA_CHECK(cudaEventElapsedTime(&milliseconds, context->timer_start, context->timer_stop), err);
    *elapsed_ms = milliseconds;
    return 0;
}

int cuda_scratch(cuda_context* context, int slot, size_t bytes, void** out, error_info* err) {
    if (context->scratch_bytes[slot] < bytes) {
        CUDA_CHECK(cudaStreamSynchronize(context->stream), err); // a queued kernel may still use the old one
        cudaFree(context->scratch[slot]);
        context->scratch[slot] = NULL;
        context->scratch_bytes[slot] = 0;
        size_t grown = bytes + bytes / 4; // room to grow a little without another cudaMalloc
        CUDA_CHECK(cudaMalloc(&context->scratch[slot], grown), err);
        context->scratch_bytes[slot] = grown;
    }
    *out = context->scratch[slot];
    return 0;
}

// ---- weights ----------------------------------------------------------------

static int upload_array(cuda_context* context, void** device_out, const void* host, size_t bytes, const char* what,
                        error_info* err) {
    if (!host) return 0;
    if (cuda_device_alloc(context, device_out, bytes, what, err)) return -1;
    return cuda_copy_to_device(context, *device_out, host, bytes, err);
}

extern "C" int cuda_weights_upload(cuda_context* context, cuda_weights* out, const weight_matrix* host,
                                   error_info* err) {
    memset(out, 0, sizeof *out);
    out->dtype = host->dtype;
    out->rows = host->rows;
    out->cols = host->cols;
    out->group_size = host->group_size;
    out->activation_bits = host->activation_bits;
    out->bytes = weight_matrix_bytes(host);
    const size_t count = (size_t)host->rows * (size_t)host->cols;
    size_t payload = 0, n_groups = 0;
    switch (host->dtype) {
    case WEIGHT_F32: payload = count * 4; break;
    case WEIGHT_F16: payload = count * 2; break;
    case WEIGHT_Q8_0: payload = count; break;
    case WEIGHT_I8: payload = count; break;
    case WEIGHT_I4: payload = (size_t)host->rows * (((size_t)host->cols + 1) / 2); break;
    default: return error_set(err, "cuda_weights_upload: unknown weight dtype %d", (int)host->dtype);
    }
    if ((host->dtype == WEIGHT_I8 || host->dtype == WEIGHT_I4 || host->dtype == WEIGHT_Q8_0) &&
        (host->group_size <= 0 || (host->dtype != WEIGHT_Q8_0 && host->cols % host->group_size != 0) ||
         (host->dtype == WEIGHT_Q8_0 && count % (size_t)host->group_size != 0)))
        return error_set(err, "cuda_weights_upload: group_size %d does not divide the %dx%d matrix", host->group_size,
                         host->rows, host->cols);
    if (host->dtype == WEIGHT_I8 || host->dtype == WEIGHT_I4)
        n_groups = (size_t)host->rows * (size_t)(host->cols / host->group_size);
    int failed = upload_array(context, &out->values, host->values, payload, "weights", err);
    if (!failed && host->dtype == WEIGHT_Q8_0)
        failed = upload_array(context, (void**)&out->scales, host->scales, count / (size_t)host->group_size * 4,
                              "weight scales", err);
    if (!failed && n_groups)
        failed = upload_array(context, (void**)&out->scales_f16, host->scales_f16, n_groups * 2, "weight scales", err);
    if (!failed && n_groups && host->zero_points)
        failed =
            upload_array(context, (void**)&out->zero_points, host->zero_points, n_groups, "weight zero-points", err);
    if (failed) cuda_weights_free(out);
    return failed;
}

extern "C" void cuda_weights_free(cuda_weights* weights) {
    cuda_device_free(weights->values);
    cuda_device_free(weights->scales);
    cuda_device_free(weights->scales_f16);
    cuda_device_free(weights->zero_points);
    weights->values = NULL;
    weights->scales = NULL;
    weights->scales_f16 = NULL;
    weights->zero_points = NULL;
}
