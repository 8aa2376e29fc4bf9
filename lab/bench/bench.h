// bench: the measurements behind `servelab bench`, as data: running and
// timing. Judging them against the targets is lab/bench/targets.h.
//
// Everything is measured in one process, side by side, and every figure is
// the median of `repeats` runs (the machine may be shared: a median ignores
// the odd slow run). Speed-ups are measured run for run: each repeat of a
// quantized decode is followed by one of fp16, each repeat of the batch
// sizes runs them all, and the ratio's median is over those pairs. Decode and prefill run through the real engine
// (engine_step), so the numbers are what `generate` and `sim` users get,
// and their bytes and FLOPs are the step records' kernel_traffic, counted
// by the kernels that did the work:
//   bytes streamed per decode token = weight bytes + KV bytes read + KV bytes
//   written (activations stay in the caches and are not counted);
//   prefill FLOPs = matmul + attention FLOPs.
#ifndef SERVELAB_BENCH_H
#define SERVELAB_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/model.h"
#include "lab/bench/peer.h"

typedef struct bench_options {
    const char* model_arg;   // preset or llama2.c checkpoint (default stories110m)
    int n_threads;           // worker threads, the probes' too; 0 = one per online CPU
    int repeats;             // runs per figure, the median is kept
    bool quick;              // fewer tokens and steps, a small stream buffer: a smoke test
    uint64_t synth_seed;     // weights of a preset
    bench_peer_options peer; // against llama.cpp on the same GGUF files (lab/bench/peer.h)
    bool peer_only;          // that section alone
} bench_options;

#define BENCH_MAX_DECODE 5
#define BENCH_MAX_PREFILL 6
#define BENCH_MAX_BATCH 7
#define BENCH_MAX_ATTENTION 6
#define BENCH_MAX_PROBES (BENCH_MAX_DECODE + 2)

typedef struct bench_decode {
    char dtype[24];         // "fp32", "fp16", "w8a16", "w4a16 g128", "w8a8"
    double tok_s;           // decoded tokens per second at batch 1
    double gb_s;            // bytes streamed per token x tok_s / 1e9
    double frac_of_bw;      // gb_s / the measured streaming bandwidth
    double bytes_per_token; // weights + KV read + KV written
    double x_fp16;          // median over the repeats of tok_s / fp16's tok_s in the same repeat (fp16
                            // decodes beside every other format, run for run); 1 for fp16
} bench_decode;

typedef struct bench_prefill {
    char dtype[24];
    int tokens;          // prompt length (capped at the model's max_seq_len - 1)
    double tok_s;        // prompt tokens per second
    double gflop_s;      // (matmul + attention FLOPs) / time
    double frac_of_peak; // gflop_s / the measured peak FMA rate
} bench_prefill;

typedef struct bench_batch {
    int batch;       // sequences decoding together
    double tok_s;    // tokens per second, all sequences together
    double x_batch1; // median over the repeats of tok_s / batch 1's tok_s in the same repeat
} bench_batch;

typedef struct bench_attention {
    const char* layout;  // "paged" (block size 16, blocks scattered) or "contiguous"
    int context;         // tokens attended to
    double us_per_token; // one query through every layer's attention, one thread
    // The bytes that attention reads, read alone in the same order with
    // nothing computed (machine_gather_read_seconds), one thread: with the
    // hardware prefetcher only, and with the kernel's software prefetch. The
    // paged/contiguous ratio of these is what the memory system alone makes
    // of the scattered blocks, the floor under the kernel's own ratio.
    double read_us_per_token;
    double read_prefetched_us_per_token;
} bench_attention;

typedef struct bench_small_model {
    bool measured; // false when stories260K is not found
    char path[512];
    double tok_s; // batch-1 decode through the engine
    double us_per_token;
} bench_small_model;

typedef struct bench_report {
    char model[512];            // what --model named
    int n_threads;              // threads used
    const char* simd_level;     // "avx512", "avx2", "scalar"
    size_t stream_buffer_bytes; // buffer of the bandwidth probe
    double bandwidth_gb_s;      // streaming read, all threads: the highest probe
    double peak_gflop_s;        // fp32 FMA, all threads: the highest probe
    // The machine probes, in the order they ran: before the sections, after
    // each weight format's decode, prefill and batch sections, and after
    // the rest. A shared VM's speed drifts over the minutes of a run; more
    // probes catch its fast moments, which the fractions are taken against.
    double probe_bandwidth_gb_s[BENCH_MAX_PROBES]; // streaming read, GB/s
    double probe_peak_gflop_s[BENCH_MAX_PROBES];   // fp32 FMA, GFLOP/s
    int n_probes;
    int decode_tokens; // tokens per decode run
    bench_decode decode[BENCH_MAX_DECODE];
    int n_decode;
    bench_prefill prefill[BENCH_MAX_PREFILL];
    int n_prefill;
    char batch_dtype[24]; // the weights batch scaling runs on (fp16)
    bench_batch batch[BENCH_MAX_BATCH];
    int n_batch;
    double roofline_flat_batch;      // batch where B x FLOPs/token / peak = bytes/token / bandwidth
    double roofline_bytes_per_token; // batch-1 fp16 decode: weight + KV bytes per token
    double roofline_flops_per_token; // and FLOPs per token
    // The most any batch's decode could gain over the measured batch 1 if
    // every FLOP ran at the FMA peak: peak / (FLOPs per token x batch-1
    // tok/s). A speed-up target above it needs more arithmetic than the
    // machine has, however good the kernels.
    double batch_peak_ceiling_x;
    bench_attention attention[BENCH_MAX_ATTENTION];
    int n_attention;
    bench_small_model small_model;
    bool peer_only;         // only the peer section ran
    bench_peer_report peer; // servelab against llama.cpp, side by side
} bench_report;

// Each finished part of the run ("decode fp16 ..."), with how many parts
// are done of how many a whole run has, goes to `progress` when it is not
// NULL, so that a long run shows it is alive.
typedef void (*bench_progress_fn)(void* user, const char* line, int parts_done, int parts_total);

// Tokens per second of `batch` requests of prompt_tokens tokens that each
// generate max_new, on m through a fresh engine of n_threads: the steps that
// are pure prefill (prefill) or that decode every sequence and nothing else.
int bench_engine_rate(const model* m, int n_threads, int batch, int prompt_tokens, int max_new, bool prefill,
                      uint64_t seed, double* tok_s, error_info* err);

// Runs every section. Returns -1 with err when a model cannot be opened or
// an engine cannot be built (nothing is half-reported then).
int bench_run(const bench_options* options, bench_report* report, bench_progress_fn progress, void* progress_user,
              error_info* err);

#endif
