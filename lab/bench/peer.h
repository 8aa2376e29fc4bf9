// bench_peer: servelab against llama.cpp on the very same GGUF files,
// measured in the same minutes, never against published figures.
//
// Rounds are interleaved: in each round, per weight format, servelab runs
// (decode, prefill 128 and 512) and then llama.cpp's llama-bench runs the
// same file; then both decode again beside a one-core busy loop; then
// batch-16 decode, servelab and llama-batched-bench at 16 parallel
// sequences. A ratio is taken round by round (servelab / llama.cpp in the
// same round) before its median, so a slow minute of a shared machine hits
// both sides of a ratio rather than one.
//
// Formats are told by the file names (f32, f16, q8_0, q4_0, as
// llama-quantize's type names): a directory's *.gguf files, or paths
// separated by commas. servelab loads each file itself (engine/gguf_model).
#ifndef SERVELAB_BENCH_PEER_H
#define SERVELAB_BENCH_PEER_H

#include <stdbool.h>

#include "base/error.h"

typedef struct bench_peer_options {
    const char* bench_path;         // llama.cpp's llama-bench; NULL: the section is "not measured"
    const char* batched_bench_path; // llama-batched-bench; NULL: no batch-16 row
    const char* models;             // a directory of GGUF files, or GGUF paths separated by commas
    int rounds;                     // interleaved rounds, the medians' count
    int n_threads;                  // both engines
    bool quick;                     // 16 decode tokens, prefill 128 only: a smoke test
    bool busy;                      // also decode beside a one-core busy loop
} bench_peer_options;

typedef enum bench_peer_kind {
    PEER_DECODE,  // batch-1 decode, tok/s
    PEER_PREFILL, // prompt tokens per second
    PEER_BATCH,   // decode of 16 sequences at once, output tok/s of all of them
    PEER_BUSY,    // decode beside a one-core busy loop over decode alone (each engine's own)
} bench_peer_kind;

// A figure over the rounds.
typedef struct bench_peer_spread {
    double median, min, max;
} bench_peer_spread;

#define BENCH_PEER_MAX_ROWS 20 // 4 formats x (decode, 2 prefills, busy), and batch 16
typedef struct bench_peer_row {
    bench_peer_kind kind;
    char format[8];                   // "f32", "f16", "q8_0", "q4_0"
    int tokens;                       // decoded or prompt tokens per sequence
    int rounds;                       // rounds measured
    bench_peer_spread servelab, peer; // tok/s (PEER_BUSY: busy tok/s / quiet tok/s)
    bench_peer_spread ratio;          // servelab / llama.cpp, round by round
} bench_peer_row;

typedef struct bench_peer_report {
    bool measured;          // false: no peer given (or the run was skipped)
    char peer[512];         // the llama-bench path
    char not_measured[160]; // why, when not measured
    int rounds, n_threads;
    bench_peer_row rows[BENCH_PEER_MAX_ROWS];
    int n_rows;
} bench_peer_report;

// Each finished row of a round, for a progress line.
typedef void (*bench_peer_progress_fn)(void* user, const char* line);

// Runs the section. Without options->bench_path the report says "not
// measured" and 0 is returned. -1 with err when a file cannot be opened or
// classified, or the peer fails or prints what it cannot read.
int bench_peer_run(const bench_peer_options* options, bench_peer_report* report, bench_peer_progress_fn progress,
                   void* progress_user, error_info* err);

// "fp32 decode 128", "q4_0 prefill 512", "f16 batch 16 decode 128", "q4_0 decode, 1 core busy"
void bench_peer_row_name(const bench_peer_row* row, char* out, int out_size);

// The row of that kind and format (tokens: 0 = any), or NULL.
const bench_peer_row* bench_peer_find(const bench_peer_report* r, bench_peer_kind kind, const char* format, int tokens);

#endif
