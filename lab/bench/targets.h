// targets: judging a bench report. The measuring (lab/bench/bench.h) says
// what the machine did; this says whether that reaches what the CPU
// performance work aims at, and how each figure reads in the verdict.
#ifndef SERVELAB_BENCH_TARGETS_H
#define SERVELAB_BENCH_TARGETS_H

#include <stdbool.h>

#include "lab/bench/bench.h"

// The targets of the CPU-performance issue, judged on a report: what was
// measured against what the issue asks. A target whose figures the run did
// not produce (a model too short for 512 tokens, no stories260K) is
// reported as not measured, never as met.
#define BENCH_MAX_TARGETS 16
typedef struct bench_target {
    char what[64];     // "fp16 decode, of bandwidth"
    char measured[64]; // "67%" or "not measured"
    char wanted[40];   // ">= 85%"
    bool was_measured; // the run produced every figure the target needs
    bool met;          // was_measured and the figures reach the target
} bench_target;

// Fills out (BENCH_MAX_TARGETS) and returns how many targets there are.
int bench_targets(const bench_report* r, bench_target* out);

#endif
