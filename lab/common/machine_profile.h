// machine_profile: this machine's memory bandwidth and peak FLOP rate,
// measured once and cached.
//
// Measured each time a lesson asked, the ridge (peak / bandwidth) moved
// from 1.8 to 10.3 FLOP/B across the lessons of one run on a shared 2-core
// machine, so two lessons judged against two different machines. The
// profile is now measured once (101 repeats of each quantity, about 2 ms
// each) and kept in a cache file that every later lesson, fault-matrix
// child and `servelab machine` reads.
//
// Another program on the machine only ever slows a sample, so the fast end
// of the samples is the hardware: at a load of 10 on 2 cores the medians
// fell to 6-9 GB/s and 49-132 GFLOP/s and the minima to 2 GB/s and 7
// GFLOP/s, while the fastest stayed at 28-37 GB/s and about 150 GFLOP/s.
// But the single fastest sample is not trusted either: one read 290 GFLOP/s,
// twice what two cores can do (a clock that stalled under the VM). So the
// figure is the 90th percentile (10 samples above it absorb such glitches),
// the ridge is its peak over its bandwidth, and the ridge's band runs over
// the 75th to 90th percentiles; the median, min and max are the noise seen.
//
// The cache file lives in $SERVELAB_CACHE_DIR, else $XDG_CACHE_HOME/servelab,
// else ~/.cache/servelab (machine-profile.txt). It is stale, and measured
// again, when its format version, CPU model string, core count or thread
// count differ from this process's, when it is older than 7 days, or when it
// cannot be read or parsed whole. It is written to a temporary file in the
// same folder and renamed into place, so a reader never sees half of it.
#ifndef SERVELAB_MACHINE_PROFILE_H
#define SERVELAB_MACHINE_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

enum {
    MACHINE_PROFILE_FORMAT = 3,
    MACHINE_PROFILE_MAX_AGE_S = 7 * 24 * 3600,
    MACHINE_PROFILE_REPEATS = 101,
};

// A quantity measured MACHINE_PROFILE_REPEATS times.
typedef struct measured_spread {
    double percentile_90; // the 91st of 101 in increasing order: the figure used
    double percentile_75; // the 76th of 101
    double median;
    double min;
    double max;
} measured_spread;

typedef struct machine_profile {
    // What makes a profile stale (the cache's key).
    int format;
    char cpu_model[128]; // /proc/cpuinfo's "model name" (or "unknown")
    int cores;           // online processors
    int threads;         // threads the measurement ran on
    // The measurement.
    int64_t measured_at_s; // Unix time
    int repeats;
    measured_spread bandwidth_bytes_per_s; // a 64 MiB stream read with every thread
    measured_spread peak_flops;            // an fp16 matmul, 128 rows x 1024 x 1024 (FLOP/s)
    // The same matmul with 4-bit weights and 8-bit activations (W4A8: int8
    // dot products, groups of 32), FLOPs counted as fp16's (2 per weight and
    // row): what a compute-bound W4A8 step can do against an fp16 one, a
    // gain no byte or FLOP count shows.
    measured_spread peak_w4a8_flops;
} machine_profile;

// Where the profile came from, for the line a reader is shown.
typedef enum machine_profile_origin {
    MACHINE_PROFILE_FROM_CACHE = 0,
    MACHINE_PROFILE_MEASURED = 1, // no usable cache, or asked to measure again
} machine_profile_origin;

// The key of this process: format, CPU model, cores, and `threads` (0: one
// per online processor, as thread_pool_create(0) gives).
void machine_profile_current_key(machine_profile* key, int threads);

// Measures the profile now on `threads` threads (0: every core), filling the
// key fields too. About 1 s on a 2-core machine.
int machine_profile_measure(machine_profile* out, int threads, error_info* err);

// The cache file's path: $SERVELAB_CACHE_DIR, $XDG_CACHE_HOME/servelab or
// $HOME/.cache/servelab, then /machine-profile.txt. Fails when none is set.
int machine_profile_cache_path(char* path, size_t capacity, error_info* err);

// Reads `path` and checks it against `key` at time `now_s`. 0: `out` holds a
// fresh profile. -1: stale, corrupt or unreadable; `why` says which in one
// line ("no cached profile", "cached for CPU 'X', this is 'Y'", "measured
// 9 days ago (kept 7)", "line 4: expected 'cores N'", ...).
int machine_profile_load(const char* path, const machine_profile* key, int64_t now_s, machine_profile* out,
                         error_info* why);

// Writes `p` to `path`: a temporary file in the same folder, then rename,
// so the file is whole or absent. Creates the cache folder when missing.
int machine_profile_save(const char* path, const machine_profile* p, error_info* err);

// The profile to use: the cached one when fresh (and `remeasure` is false),
// else measured now and saved. `note` gets one line when it was measured
// (why, and where it was saved or why it could not be); "" when cached.
// Fails only when measuring fails; a cache that cannot be written is a note.
int machine_profile_obtain(bool remeasure, int threads, machine_profile* out, machine_profile_origin* origin,
                           char* note, size_t note_capacity, error_info* err);

// Ridge point (FLOP per byte): peak over bandwidth at their 90th
// percentiles; and its band (75th-percentile peak / 90th-percentile
// bandwidth .. 90th-percentile peak / 75th-percentile bandwidth).
double machine_profile_ridge(const machine_profile* p);
double machine_profile_ridge_low(const machine_profile* p);
double machine_profile_ridge_high(const machine_profile* p);

#endif
