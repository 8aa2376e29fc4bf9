// sampler: picks the next token from a row of logits.
//
// temperature 0 is greedy (argmax, the first maximum on ties). Otherwise the
// logits are divided by the temperature, turned into probabilities by
// softmax, and a token is drawn, from the smallest set of tokens whose
// probability reaches top_p when 0 < top_p < 1 (nucleus sampling), else
// from all of them. The generator is llama2.c's xorshift*, so a seed gives
// the same draws on every machine.
#ifndef SERVELAB_SAMPLER_H
#define SERVELAB_SAMPLER_H

#include <stdint.h>

#include "base/error.h"

typedef struct sampler_candidate {
    float probability;
    int32_t token;
} sampler_candidate;

typedef struct sampler {
    int vocab_size;
    float temperature;              // 0 = greedy
    float top_p;                    // in (0, 1) for nucleus sampling, else off
    uint64_t rng_state;             // xorshift* state, never 0
    sampler_candidate* candidates;  // (vocab_size) scratch for top-p
} sampler;

int sampler_init(sampler* s, int vocab_size, float temperature, float top_p, uint64_t seed, error_info* err);
void sampler_free(sampler* s);

// Chooses a token from logits: (vocab_size) floats, overwritten with
// probabilities when sampling.
int32_t sampler_sample(sampler* s, float* logits);

// Index of the largest value (the first one on ties); values: (n) floats.
int32_t sampler_argmax(const float* values, int n);

// A uniform float in [0, 1) from the generator (24 random bits).
float sampler_random_unit(uint64_t* state);

#endif
