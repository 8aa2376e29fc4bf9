// seeded_random: the workload generators' random numbers (sim's synthetic
// workloads, bench-serve's requests). splitmix64: small, seedable, and the
// same sequence on every machine, so a --seed names one workload everywhere.
#ifndef SERVELAB_SEEDED_RANDOM_H
#define SERVELAB_SEEDED_RANDOM_H

#include <math.h>
#include <stdint.h>

static inline uint64_t seeded_next(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in (0, 1]: never 0, so log() of it is finite (exponential gaps).
static inline double seeded_unit(uint64_t* state) {
    return ((double)(seeded_next(state) >> 11) + 1.0) / 9007199254740992.0;
}

// Standard normal (Box-Muller).
static inline double seeded_normal(uint64_t* state) {
    return sqrt(-2.0 * log(seeded_unit(state))) * cos(6.283185307179586 * seeded_unit(state));
}

#endif
