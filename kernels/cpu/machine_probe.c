#include "kernels/cpu/machine_probe.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/simd_x86.h"

#define MIB ((size_t)1 << 20)

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double probe_median(double* values, int n) {
    for (int i = 1; i < n; i++) // insertion sort: n is a handful of repeats
        for (int j = i; j > 0 && values[j - 1] > values[j]; j--) {
            double swap = values[j];
            values[j] = values[j - 1];
            values[j - 1] = swap;
        }
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// ---- the L3 size -------------------------------------------------------------

size_t machine_l3_cache_bytes(void) {
#ifdef _SC_LEVEL3_CACHE_SIZE
    long bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (bytes > 0) return (size_t)bytes;
#endif
    // Some C libraries do not fill the sysconf value; sysfs says "32768K".
    FILE* file = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (file) {
        unsigned long value = 0;
        char unit = 0;
        int fields = fscanf(file, "%lu%c", &value, &unit);
        fclose(file);
        if (fields >= 1 && value > 0) return (size_t)value * (unit == 'K' ? 1024u : unit == 'M' ? 1024u * 1024u : 1u);
    }
    return 32 * MIB;
}

size_t machine_stream_default_bytes(void) {
    size_t bytes = 8 * machine_l3_cache_bytes();
    if (bytes < 256 * MIB) bytes = 256 * MIB;
    if (bytes > 4096 * MIB) bytes = 4096 * MIB;
    return bytes;
}

// ---- streaming read ----------------------------------------------------------

// Bytes each read kernel consumes per loop step: 4 vectors of 64 bytes, so
// four independent add chains keep the loads in flight.
#define STREAM_STEP_BYTES 256

typedef struct stream_job {
    const unsigned char* buffer; // (n_bytes), aligned to 64
    size_t n_bytes;              // a multiple of STREAM_STEP_BYTES
    int n_tasks;                 // contiguous shares of the buffer
    cpu_simd_level level;        // already clamped to the CPU
    bool touch;                  // first pass: write the pages instead of reading
    uint64_t* sums;              // (n_tasks) what each share summed to (kept so that no read is dead code)
} stream_job;

#if defined(__x86_64__) || defined(__i386__)
AVX512_TARGET static uint64_t sum_avx512(const unsigned char* p, size_t n_bytes) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i < n_bytes; i += STREAM_STEP_BYTES) {
        a = _mm512_add_epi64(a, _mm512_load_si512((const void*)(p + i)));
        b = _mm512_add_epi64(b, _mm512_load_si512((const void*)(p + i + 64)));
        c = _mm512_add_epi64(c, _mm512_load_si512((const void*)(p + i + 128)));
        d = _mm512_add_epi64(d, _mm512_load_si512((const void*)(p + i + 192)));
    }
    uint64_t lanes[8]; // summed as unsigned: the sum is a checksum, its wrap-around is meant
    _mm512_storeu_si512((void*)lanes, _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
    return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

AVX2_TARGET static uint64_t sum_avx2(const unsigned char* p, size_t n_bytes) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i < n_bytes; i += STREAM_STEP_BYTES) {
        a = _mm256_add_epi64(a, _mm256_add_epi64(_mm256_load_si256((const __m256i*)(p + i)),
                                                 _mm256_load_si256((const __m256i*)(p + i + 32))));
        b = _mm256_add_epi64(b, _mm256_add_epi64(_mm256_load_si256((const __m256i*)(p + i + 64)),
                                                 _mm256_load_si256((const __m256i*)(p + i + 96))));
        c = _mm256_add_epi64(c, _mm256_add_epi64(_mm256_load_si256((const __m256i*)(p + i + 128)),
                                                 _mm256_load_si256((const __m256i*)(p + i + 160))));
        d = _mm256_add_epi64(d, _mm256_add_epi64(_mm256_load_si256((const __m256i*)(p + i + 192)),
                                                 _mm256_load_si256((const __m256i*)(p + i + 224))));
    }
    __m256i total = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i*)lanes, total);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

static uint64_t sum_scalar(const unsigned char* p, size_t n_bytes) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < n_bytes; i += 32) {
        uint64_t words[4];
        memcpy(words, p + i, sizeof words);
        a += words[0];
        b += words[1];
        c += words[2];
        d += words[3];
    }
    return a + b + c + d;
}

// n_bytes (a multiple of STREAM_STEP_BYTES) from p, summed at `level`.
static uint64_t sum_at_level(cpu_simd_level level, const unsigned char* p, size_t n_bytes) {
#if defined(__x86_64__) || defined(__i386__)
    if (level == CPU_SIMD_AVX512) return sum_avx512(p, n_bytes);
    if (level == CPU_SIMD_AVX2) return sum_avx2(p, n_bytes);
#else
    (void)level;
#endif
    return sum_scalar(p, n_bytes);
}

static void stream_task(void* ctx, int task, int thread) {
    (void)thread;
    const stream_job* job = ctx;
    size_t steps = job->n_bytes / STREAM_STEP_BYTES;
    size_t begin = steps * (size_t)task / (size_t)job->n_tasks * STREAM_STEP_BYTES;
    size_t end = steps * (size_t)(task + 1) / (size_t)job->n_tasks * STREAM_STEP_BYTES;
    const unsigned char* share = job->buffer + begin;
    if (job->touch) { // each thread faults in the pages it will read (first touch places them near it)
        memset((void*)share, task & 0x7f, end - begin);
        return;
    }
    job->sums[task] = sum_at_level(job->level, share, end - begin);
}

double machine_stream_read_gb_s(thread_pool* pool, size_t buffer_bytes, int repeats) {
    if (buffer_bytes == 0) buffer_bytes = machine_stream_default_bytes();
    buffer_bytes = (buffer_bytes + STREAM_STEP_BYTES - 1) / STREAM_STEP_BYTES * STREAM_STEP_BYTES;
    if (repeats < 1) repeats = 1;
    void* buffer = NULL;
    // 2 MiB alignment lets the kernel back the buffer with huge pages, so the
    // measurement is of memory, not of TLB misses.
    if (posix_memalign(&buffer, 2 * MIB, buffer_bytes) != 0) return 0.0;
#ifdef MADV_HUGEPAGE
    madvise(buffer, buffer_bytes, MADV_HUGEPAGE); // a hint; failure is harmless
#endif
    int n_tasks = thread_pool_size(pool);
    uint64_t* sums = calloc((size_t)n_tasks, sizeof *sums);
    double* rates = malloc((size_t)repeats * sizeof *rates); // (repeats) GB/s
    if (!sums || !rates) {
        free(buffer);
        free(sums);
        free(rates);
        return 0.0;
    }
    stream_job job = {buffer, buffer_bytes, n_tasks, cpu_simd_level_selected(), true, sums};
    thread_pool_run(pool, n_tasks, stream_task, &job);
    job.touch = false;
    thread_pool_run(pool, n_tasks, stream_task, &job); // warm-up: threads awake, TLB filled
    volatile uint64_t sink = 0;                        // the sums are used, so no read is dead code
    for (int k = 0; k < repeats; k++) {
        double start = seconds_now();
        thread_pool_run(pool, n_tasks, stream_task, &job);
        double elapsed = seconds_now() - start;
        for (int t = 0; t < n_tasks; t++)
            sink += sums[t];
        rates[k] = elapsed > 0 ? (double)buffer_bytes / elapsed * 1e-9 : 0.0;
    }
    (void)sink;
    double median = probe_median(rates, repeats);
    free(rates);
    free(sums);
    free(buffer);
    return median;
}

// ---- a gather read: an access pattern's cost to the memory system alone ----------

// The line `ahead` bytes past (chunk, offset) in the chunks' order, or NULL
// past the last one. Advances the cursor by one line.
typedef struct gather_cursor {
    int chunk;
    size_t offset;
} gather_cursor;

static const unsigned char* cursor_line(const probe_chunk* chunks, int n_chunks, gather_cursor* c) {
    while (c->chunk < n_chunks && c->offset >= chunks[c->chunk].bytes) c->chunk++, c->offset = 0;
    if (c->chunk >= n_chunks) return NULL;
    const unsigned char* line = (const unsigned char*)chunks[c->chunk].start + c->offset;
    c->offset += 64;
    return line;
}

double machine_gather_read_seconds(const probe_chunk* chunks, int n_chunks, size_t prefetch_ahead_bytes) {
    const cpu_simd_level level = cpu_simd_level_selected();
    // The prefetching cursor starts prefetch_ahead_bytes into the stream.
    gather_cursor lead = {0, 0};
    for (size_t skipped = 0; prefetch_ahead_bytes > 0 && skipped < prefetch_ahead_bytes; skipped += 64)
        if (!cursor_line(chunks, n_chunks, &lead)) break;
    int primed = -1; // the last chunk whose pages were primed
    uint64_t sum = 0;
    double start = seconds_now();
    for (int i = 0; i < n_chunks; i++) {
        const unsigned char* p = chunks[i].start;
        const size_t n_bytes = chunks[i].bytes / STREAM_STEP_BYTES * STREAM_STEP_BYTES;
        for (size_t done = 0; done < n_bytes; done += STREAM_STEP_BYTES) {
            if (prefetch_ahead_bytes > 0) {
                // As the attention kernel does: every line a fixed distance
                // ahead, and where that distance enters a new chunk, one
                // line of every 4 KiB page of the chunk after it, so that
                // the hardware prefetcher has found each page's stream
                // before the loads get there.
                for (int k = 0; k < STREAM_STEP_BYTES / 64; k++) {
                    const unsigned char* line = cursor_line(chunks, n_chunks, &lead);
                    if (!line) break;
                    __builtin_prefetch(line, 0, 3);
                }
                const int next = lead.chunk + 1;
                if (next < n_chunks && next > primed) {
                    const size_t prime = chunks[next].bytes < prefetch_ahead_bytes ? chunks[next].bytes
                                                                                  : prefetch_ahead_bytes;
                    for (size_t b = 0; b < prime; b += 4096)
                        __builtin_prefetch((const unsigned char*)chunks[next].start + b, 0, 3);
                    primed = next;
                }
            }
            sum += sum_at_level(level, p + done, STREAM_STEP_BYTES);
        }
        if (n_bytes < chunks[i].bytes) sum += sum_scalar(p + n_bytes, (chunks[i].bytes - n_bytes) / 32 * 32);
    }
    double elapsed = seconds_now() - start;
    static volatile uint64_t sink; // the sums are used, so no read is dead code
    sink += sum;
    return elapsed;
}

// ---- peak FMA rate -----------------------------------------------------------

// Independent accumulators per thread: an FMA has a latency of 4 cycles and
// two units issue one each per cycle, so at least 8 chains must be in
// flight; 16 (AVX-512, of 32 registers) and 12 (AVX2, of 16) leave margin.
#define FMA_CHAINS_AVX512 16
#define FMA_CHAINS_AVX2 12
#define FMA_CHAINS_SCALAR 8
// Loop iterations per run: ~2^21 x 16 FMAs is ~5-15 ms per thread, long
// enough for the clock to resolve it, short enough to repeat.
#define FMA_ITERATIONS (1 << 21)

typedef struct fma_job {
    cpu_simd_level level;
    long iterations;
    float* results; // (n_tasks) kept so the chains are not dead code
} fma_job;

// acc = acc * 0.9999 + 1e-4 converges to 1 and never overflows nor reaches
// subnormals, which would slow some CPUs down.
#if defined(__x86_64__) || defined(__i386__)
AVX512_TARGET static float fma_chains_avx512(long iterations) {
    __m512 acc[FMA_CHAINS_AVX512];
    const __m512 factor = _mm512_set1_ps(0.9999f), addend = _mm512_set1_ps(1e-4f);
    for (int c = 0; c < FMA_CHAINS_AVX512; c++)
        acc[c] = _mm512_set1_ps((float)c);
    for (long i = 0; i < iterations; i++) {
        _Pragma("GCC unroll 16") for (int c = 0; c < FMA_CHAINS_AVX512; c++) acc[c] =
            _mm512_fmadd_ps(acc[c], factor, addend);
    }
    __m512 total = acc[0];
    for (int c = 1; c < FMA_CHAINS_AVX512; c++)
        total = _mm512_add_ps(total, acc[c]);
    return hsum16(total);
}

AVX2_TARGET static float fma_chains_avx2(long iterations) {
    __m256 acc[FMA_CHAINS_AVX2];
    const __m256 factor = _mm256_set1_ps(0.9999f), addend = _mm256_set1_ps(1e-4f);
    for (int c = 0; c < FMA_CHAINS_AVX2; c++)
        acc[c] = _mm256_set1_ps((float)c);
    for (long i = 0; i < iterations; i++) {
        _Pragma("GCC unroll 12") for (int c = 0; c < FMA_CHAINS_AVX2; c++) acc[c] =
            _mm256_fmadd_ps(acc[c], factor, addend);
    }
    __m256 total = acc[0];
    for (int c = 1; c < FMA_CHAINS_AVX2; c++)
        total = _mm256_add_ps(total, acc[c]);
    return hsum8(total);
}
#endif

// The scalar level has no fused instruction in a portable build: a multiply
// and an add per step, counted as the same 2 FLOPs.
static float fma_chains_scalar(long iterations) {
    float acc[FMA_CHAINS_SCALAR];
    for (int c = 0; c < FMA_CHAINS_SCALAR; c++)
        acc[c] = (float)c;
    for (long i = 0; i < iterations; i++) {
        _Pragma("GCC unroll 8") for (int c = 0; c < FMA_CHAINS_SCALAR; c++) acc[c] = acc[c] * 0.9999f + 1e-4f;
    }
    float total = 0.0f;
    for (int c = 0; c < FMA_CHAINS_SCALAR; c++)
        total += acc[c];
    return total;
}

// FLOPs one thread does per run at `level`.
static double fma_flops_per_run(cpu_simd_level level, long iterations) {
    int lanes_times_chains = level == CPU_SIMD_AVX512 ? 16 * FMA_CHAINS_AVX512
                             : level == CPU_SIMD_AVX2 ? 8 * FMA_CHAINS_AVX2
                                                      : FMA_CHAINS_SCALAR;
    return 2.0 * (double)lanes_times_chains * (double)iterations;
}

static void fma_task(void* ctx, int task, int thread) {
    (void)thread;
    const fma_job* job = ctx;
#if defined(__x86_64__) || defined(__i386__)
    if (job->level == CPU_SIMD_AVX512) {
        job->results[task] = fma_chains_avx512(job->iterations);
        return;
    }
    if (job->level == CPU_SIMD_AVX2) {
        job->results[task] = fma_chains_avx2(job->iterations);
        return;
    }
#endif
    job->results[task] = fma_chains_scalar(job->iterations);
}

double machine_peak_fma_gflop_s_at_level(thread_pool* pool, cpu_simd_level level, int repeats) {
    if (repeats < 1) repeats = 1;
    level = cpu_simd_level_clamp(level);
    int n_tasks = thread_pool_size(pool);
    float* results = calloc((size_t)n_tasks, sizeof *results);
    double* rates = malloc((size_t)repeats * sizeof *rates); // (repeats) GFLOP/s
    if (!results || !rates) {
        free(results);
        free(rates);
        return 0.0;
    }
    // The scalar loop does 16x fewer FLOPs per iteration than AVX-512; fewer
    // iterations keep its run about as long.
    fma_job job = {level, level == CPU_SIMD_SCALAR ? FMA_ITERATIONS / 4 : FMA_ITERATIONS, results};
    thread_pool_run(pool, n_tasks, fma_task, &job); // warm-up: wide units powered, clocks settled
    volatile float sink = 0.0f;
    for (int k = 0; k < repeats; k++) {
        double start = seconds_now();
        thread_pool_run(pool, n_tasks, fma_task, &job);
        double elapsed = seconds_now() - start;
        for (int t = 0; t < n_tasks; t++)
            sink += results[t];
        rates[k] = elapsed > 0 ? fma_flops_per_run(level, job.iterations) * n_tasks / elapsed * 1e-9 : 0.0;
    }
    (void)sink;
    double median = probe_median(rates, repeats);
    free(rates);
    free(results);
    return median;
}

double machine_peak_fma_gflop_s(thread_pool* pool, int repeats) {
    return machine_peak_fma_gflop_s_at_level(pool, cpu_simd_level_selected(), repeats);
}
