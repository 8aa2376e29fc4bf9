// machine_profile: this machine's memory bandwidth and peak FLOP rate,
// measured once and cached.
//
// Measured each time a lesson asked, the ridge (peak / bandwidth) moved
// from 1.8 to 10.3 FLOP/B across the lessons of one run on a shared 2-core
// machine, so two lessons judged against two different machines. The
// profile is now measured once, with its spread (median, min and max of 15
// repeats), and kept in a cache file that every later lesson, fault-matrix
// child and `servelab machine` reads.
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
    MACHINE_PROFILE_FORMAT = 1,
    MACHINE_PROFILE_MAX_AGE_S = 7 * 24 * 3600,
    MACHINE_PROFILE_REPEATS = 15,
};

// A quantity measured MACHINE_PROFILE_REPEATS times.
typedef struct measured_spread {
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
// key fields too. About 0.5 s on a 2-core machine.
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

// Ridge point (FLOP per byte): median over median, and the widest range the
// spreads allow (min peak / max bandwidth .. max peak / min bandwidth).
double machine_profile_ridge(const machine_profile* p);
double machine_profile_ridge_low(const machine_profile* p);
double machine_profile_ridge_high(const machine_profile* p);

#endif
