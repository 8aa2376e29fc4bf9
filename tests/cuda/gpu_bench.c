// gpu_bench: the device table of issue 9, measured with CUDA events.
//
//   copy:      device-to-device cudaMemcpy of 1 GiB; bandwidth counts the
//              bytes read plus the bytes written (2 GiB a copy)
//   attention: paged decode attention, batch 64, contexts 1k / 4k / 16k,
//              Llama-3-8B's heads (32 query heads, 8 KV heads, head_dim 128),
//              fp16 KV, block size 16, random block tables; effective TB/s
//              = the KV bytes the kernel reports reading / time
//   matvec:    one activation row through W4A16 (g128), W8A16 (per channel)
//              and fp16 matrices of 4096x4096, 14336x4096 and 4096x14336
//              (out x in); effective TB/s = weight bytes / time. Several
//              copies of each matrix are cycled so that each call streams
//              from HBM, not from the 50 MB L2.
//   decode:    the engine with --backend cuda on the `large` preset (TinyLlama's
//              shape, byte-level vocabulary) in fp16, W8A16, W4A16 (g64) and
//              W8A8 (RTN quantization), batch 1 and 32, fp16 KV: tokens/s
//              over the decode steps, from the steps' CUDA-event times, and
//              weight bytes / step time as effective TB/s.
// The last lines give each figure as a fraction of the copy bandwidth.
// Without a device: "GPU benchmark NOT RUN: no CUDA device" and exit 77.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/model_quant.h"
#include "engine/model_synth.h"
#include "engine/model_write.h"
#include "kernels/cpu/fp16.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_info.h"

static cuda_context* gpu;
static error_info err;

#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        if (call) {                                                                                                    \
            fprintf(stderr, "gpu_bench: %s\n", err.message);                                                           \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static void* host_alloc(size_t bytes) {
    void* p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "gpu_bench: out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static void fill_random(void* bytes, size_t count) {
    uint8_t* p = bytes;
    for (size_t i = 0; i < count; i++)
        p[i] = (uint8_t)rng_next();
}

typedef struct summary_line {
    char name[96];
    double terabytes_per_second;
} summary_line;
static summary_line summary[32];
static int n_summary;

static void record(const char* name, double bytes, double milliseconds) {
    double tbps = bytes / (milliseconds * 1e-3) / 1e12;
    printf("  %-44s %9.1f us  %7.3f TB/s\n", name, milliseconds * 1e3, tbps);
    if (n_summary < 32) {
        snprintf(summary[n_summary].name, sizeof summary[n_summary].name, "%s", name);
        summary[n_summary++].terabytes_per_second = tbps;
    }
}

static double copy_bandwidth(void) {
    const size_t bytes = (size_t)1 << 30;
    void *source = NULL, *destination = NULL;
    TRY(cuda_device_alloc(gpu, &source, bytes, "copy source", &err));
    TRY(cuda_device_alloc(gpu, &destination, bytes, "copy destination", &err));
    TRY(cuda_memset_device(gpu, source, 1, bytes, &err));
    TRY(cuda_copy_on_device(gpu, destination, source, bytes, &err)); // warm-up
    const int reps = 10;
    double ms = 0.0;
    TRY(cuda_timer_start(gpu, &err));
    for (int i = 0; i < reps; i++)
        TRY(cuda_copy_on_device(gpu, destination, source, bytes, &err));
    TRY(cuda_timer_stop(gpu, &ms, &err));
    cuda_device_free(source);
    cuda_device_free(destination);
    double tbps = 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e12;
    printf("  %-44s %9.1f us  %7.3f TB/s (read + write)\n", "device-to-device copy, 1 GiB", ms * 1e3 / reps, tbps);
    return tbps;
}

static void bench_attention(int context_length) {
    const int batch = 64, n_heads = 32, n_kv_heads = 8, head_dim = 128, block_size = 16;
    const int kv_dim = n_kv_heads * head_dim, blocks_per_row = (context_length + block_size - 1) / block_size;
    const int n_blocks = batch * blocks_per_row;
    const size_t pool_bytes = (size_t)n_blocks * block_size * kv_dim * 2;
    cuda_kv_layer layer = {KV_F16, NULL, NULL, NULL, NULL, n_kv_heads, head_dim, block_size};
    TRY(cuda_device_alloc(gpu, &layer.keys, pool_bytes, "KV pool keys", &err));
    TRY(cuda_device_alloc(gpu, &layer.values, pool_bytes, "KV pool values", &err));
    TRY(cuda_memset_device(gpu, layer.keys, 0x11, pool_bytes, &err)); // small finite fp16 values
    TRY(cuda_memset_device(gpu, layer.values, 0x22, pool_bytes, &err));
    // Random tables: a shuffled pool, as after many allocations and frees.
    int32_t* tables = host_alloc((size_t)n_blocks * 4);
    for (int b = 0; b < n_blocks; b++)
        tables[b] = b;
    for (int b = n_blocks - 1; b > 0; b--) {
        int j = (int)(rng_next() % (uint32_t)(b + 1));
        int32_t t = tables[b];
        tables[b] = tables[j];
        tables[j] = t;
    }
    int32_t offsets[64], lengths[64];
    for (int r = 0; r < batch; r++)
        offsets[r] = r * blocks_per_row, lengths[r] = context_length;
    float* query = host_alloc((size_t)batch * n_heads * head_dim * 4);
    for (size_t i = 0; i < (size_t)batch * n_heads * head_dim; i++)
        query[i] = (float)(rng_next() % 1000) / 1000.0f;
    void *device_tables, *device_offsets, *device_lengths, *device_query, *device_out;
    TRY(cuda_device_alloc(gpu, &device_tables, (size_t)n_blocks * 4, "tables", &err));
    TRY(cuda_device_alloc(gpu, &device_offsets, sizeof offsets, "offsets", &err));
    TRY(cuda_device_alloc(gpu, &device_lengths, sizeof lengths, "lengths", &err));
    TRY(cuda_device_alloc(gpu, &device_query, (size_t)batch * n_heads * head_dim * 4, "query", &err));
    TRY(cuda_device_alloc(gpu, &device_out, (size_t)batch * n_heads * head_dim * 4, "out", &err));
    TRY(cuda_copy_to_device(gpu, device_tables, tables, (size_t)n_blocks * 4, &err));
    TRY(cuda_copy_to_device(gpu, device_offsets, offsets, sizeof offsets, &err));
    TRY(cuda_copy_to_device(gpu, device_lengths, lengths, sizeof lengths, &err));
    TRY(cuda_copy_to_device(gpu, device_query, query, (size_t)batch * n_heads * head_dim * 4, &err));
    kernel_traffic traffic = {0};
    TRY(cuda_paged_attention(gpu, device_out, device_query, n_heads * head_dim, &layer, device_tables, device_offsets,
                             device_lengths, batch, context_length, n_heads, lengths, &traffic, &err)); // warm-up
    const int reps = 20;
    double ms = 0.0;
    TRY(cuda_timer_start(gpu, &err));
    for (int i = 0; i < reps; i++)
        TRY(cuda_paged_attention(gpu, device_out, device_query, n_heads * head_dim, &layer, device_tables,
                                 device_offsets, device_lengths, batch, context_length, n_heads, NULL, NULL, &err));
    TRY(cuda_timer_stop(gpu, &ms, &err));
    char name[96];
    snprintf(name, sizeof name, "paged attention fp16 KV, batch 64, ctx %dk", context_length / 1024);
    record(name, (double)traffic.kv_bytes_read, ms / reps);
    cuda_device_free(layer.keys);
    cuda_device_free(layer.values);
    cuda_device_free(device_tables);
    cuda_device_free(device_offsets);
    cuda_device_free(device_lengths);
    cuda_device_free(device_query);
    cuda_device_free(device_out);
    free(tables);
    free(query);
}

// One activation row through `copies` copies of a rows x cols matrix in
// turn (together >= 512 MiB, ten times the L2).
static void bench_matvec(const char* kind, weight_dtype dtype, int group_size, int rows, int cols) {
    weight_matrix host = {0};
    host.dtype = dtype;
    host.rows = rows;
    host.cols = cols;
    host.group_size = group_size;
    const size_t payload =
        dtype == WEIGHT_I4 ? (size_t)rows * cols / 2 : (size_t)rows * cols * (dtype == WEIGHT_F16 ? 2 : 1);
    void* values = host_alloc(payload);
    fill_random(values, payload);
    uint16_t* scales = NULL;
    if (dtype == WEIGHT_F16) { // finite halves in [-0.06, 0.06]
        uint16_t* halves = values;
        for (size_t i = 0; i < payload / 2; i++)
            halves[i] = fp32_to_fp16((float)((int)(rng_next() % 2001) - 1000) * 6e-5f);
    } else {
        const size_t n_groups = (size_t)rows * (size_t)(cols / group_size);
        scales = host_alloc(n_groups * 2);
        for (size_t g = 0; g < n_groups; g++)
            scales[g] = fp32_to_fp16(0.01f);
        host.scales_f16 = scales;
    }
    host.values = values;
    const uint64_t matrix_bytes = weight_matrix_bytes(&host);
    int copies = (int)((512ull << 20) / matrix_bytes) + 1;
    if (copies > 64) copies = 64;
    cuda_weights* matrices = host_alloc((size_t)copies * sizeof *matrices);
    for (int c = 0; c < copies; c++)
        TRY(cuda_weights_upload(gpu, &matrices[c], &host, &err));
    float* x = host_alloc((size_t)cols * 4);
    for (int i = 0; i < cols; i++)
        x[i] = (float)(rng_next() % 1000) / 1000.0f - 0.5f;
    void *device_x, *device_out;
    TRY(cuda_device_alloc(gpu, &device_x, (size_t)cols * 4, "x", &err));
    TRY(cuda_device_alloc(gpu, &device_out, (size_t)rows * 4, "out", &err));
    TRY(cuda_copy_to_device(gpu, device_x, x, (size_t)cols * 4, &err));
    for (int c = 0; c < copies; c++)
        TRY(cuda_matmul(gpu, device_out, device_x, 1, &matrices[c], NULL, &err));
    const int reps = copies * (copies < 8 ? 8 : 2);
    double ms = 0.0;
    TRY(cuda_timer_start(gpu, &err));
    for (int i = 0; i < reps; i++)
        TRY(cuda_matmul(gpu, device_out, device_x, 1, &matrices[i % copies], NULL, &err));
    TRY(cuda_timer_stop(gpu, &ms, &err));
    char name[96];
    snprintf(name, sizeof name, "%s matvec %dx%d [%s]", kind, rows, cols, cuda_matmul_path(&matrices[0], 1));
    record(name, (double)matrix_bytes, ms / reps);
    for (int c = 0; c < copies; c++)
        cuda_weights_free(&matrices[c]);
    cuda_device_free(device_x);
    cuda_device_free(device_out);
    free(matrices);
    free(values);
    free(scales);
    free(x);
}

// Decode steps of `batch` sequences (16-token prompts, 48 new tokens each)
// on the engine's CUDA backend. Records tokens/s on the device and the
// weight bytes the step records report per second.
static void bench_decode(const model* m, const char* scheme, int batch, double* tokens_per_second) {
    engine_config config = engine_config_default();
    config.backend = BACKEND_CUDA;
    config.kv_mem_bytes = 512ull << 20;
    config.max_seqs = batch;
    config.n_threads = 1;
    engine e;
    TRY(engine_init(&e, m, &config, &err));
    int32_t prompt[16];
    for (int r = 0; r < batch; r++) {
        prompt[0] = 1;
        for (int t = 1; t < 16; t++)
            prompt[t] = (int32_t)(rng_next() % (uint32_t)m->config.vocab_size);
        request_params p = {prompt, 16, 48, 1, 0.0f, 0.0f, (uint64_t)r, 0.0, true};
        TRY(engine_add_request(&e, &p, NULL, &err));
    }
    uint64_t decode_ns = 0, decode_tokens = 0, weight_bytes = 0;
    while (engine_has_work(&e)) {
        const step_record* r;
        TRY(engine_step(&e, &r, &err));
        if (r->prefill_tokens == 0 && r->decode_tokens == batch) { // full decode steps only
            decode_ns += r->device_ns;
            decode_tokens += (uint64_t)r->decode_tokens;
            weight_bytes += r->traffic.weight_bytes_read;
        }
    }
    engine_free(&e);
    *tokens_per_second = decode_ns ? (double)decode_tokens / ((double)decode_ns * 1e-9) : 0.0;
    char name[96];
    snprintf(name, sizeof name, "decode large %s, batch %d", scheme, batch);
    printf("  %-44s %9.1f tok/s  (weights %.3f TB/s)\n", name, *tokens_per_second,
           decode_ns ? (double)weight_bytes / ((double)decode_ns * 1e-9) / 1e12 : 0.0);
    if (n_summary < 32 && decode_ns) {
        snprintf(summary[n_summary].name, sizeof summary[n_summary].name, "%.60s (weights)", name);
        summary[n_summary++].terabytes_per_second = (double)weight_bytes / ((double)decode_ns * 1e-9) / 1e12;
    }
}

static double seconds_now(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

// The large model in fp16 is synthesized once (single-threaded, the slow
// part) and kept as an fp32 checkpoint in $TMPDIR; each quantized variant
// loads that file and quantizes it (RTN, on every CPU).
static void bench_decode_schemes(void) {
    static const char* schemes[] = {"fp16", "w8a16", "w4a16", "w8a8"};
    double batch1[4] = {0};
    char path[512];
    snprintf(path, sizeof path, "%s/servelab-gpu-bench-large-%d.bin", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    int have_file = 0;
    for (int s = 0; s < 4; s++) {
        model m;
        const double prepare_start = seconds_now();
        if (s > 0 && have_file)
            TRY(model_load(&m, path, MODEL_DTYPE_FP16, &err));
        else
            TRY(model_synthesize(&m, "large", 259, MODEL_DTYPE_FP16, SYNTH_DEFAULT_SEED, &err));
        if (s == 0) have_file = model_write_checkpoint(&m, path, MODEL_FORMAT_EXPORT_V1, 0, &err) == 0;
        if (s > 0) {
            model_quant_spec spec;
            TRY(model_quant_spec_parse(schemes[s], &spec, &err));
            thread_pool* pool = NULL;
            if (thread_pool_create(0, &pool) != 0) pool = NULL;
            TRY(model_quantize(&m, &spec, NULL, NULL, 0, pool, NULL, &err));
            thread_pool_free(pool);
        }
        printf("  (large %s: prepared on the host in %.1f s)\n", schemes[s], seconds_now() - prepare_start);
        bench_decode(&m, schemes[s], 1, &batch1[s]);
        double batch32 = 0.0;
        bench_decode(&m, schemes[s], 32, &batch32);
        model_free(&m);
        fflush(stdout);
    }
    if (have_file) remove(path);
    if (batch1[0] > 0)
        printf("  W4A16 / fp16 decode tokens/s at batch 1: %.2fx (target >= 2.5x)\n", batch1[2] / batch1[0]);
}

int main(void) {
    char message[256];
    if (cuda_device_count(message, sizeof message) == 0) {
        printf("GPU benchmark NOT RUN: no CUDA device (%s)\n", message);
        return 77;
    }
    TRY(cuda_context_create(&gpu, &err));
    printf("GPU: %s\n\n", cuda_context_device_name(gpu));
    printf("measurement                                       time/call   effective\n");
    const double copy_tbps = copy_bandwidth();
    bench_attention(1024);
    bench_attention(4096);
    bench_attention(16384);
    static const int shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
    for (int s = 0; s < 3; s++) {
        bench_matvec("W4A16 g128", WEIGHT_I4, 128, shapes[s][0], shapes[s][1]);
        bench_matvec("W8A16 per-channel", WEIGHT_I8, shapes[s][1], shapes[s][0], shapes[s][1]);
        bench_matvec("fp16", WEIGHT_F16, 0, shapes[s][0], shapes[s][1]);
    }
    printf("\n");
    bench_decode_schemes();
    printf("\nsummary: fraction of the measured copy bandwidth (%.3f TB/s)\n", copy_tbps);
    for (int i = 0; i < n_summary; i++)
        printf("  %-44s %5.1f%%\n", summary[i].name, 100.0 * summary[i].terabytes_per_second / copy_tbps);
    cuda_context_destroy(gpu);
    return 0;
}
