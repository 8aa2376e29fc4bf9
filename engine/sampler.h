// sampler: picks the next token from a row of logits.
//
// temperature 0 is greedy (argmax, the first maximum on ties), and so is any
// temperature below SAMPLER_MIN_TEMPERATURE. Otherwise the
// logits are divided by the temperature, turned into probabilities by
// softmax, and a token is drawn, from the smallest set of tokens whose
// probability reaches top_p when 0 < top_p < 1 (nucleus sampling), else
// from all of them. The generator is llama2.c's xorshift*, so a seed gives
// the same draws on every machine.
#ifndef SERVELAB_SAMPLER_H
#define SERVELAB_SAMPLER_H

#include <stdint.h>

#include "base/error.h"

// Temperatures below this sample greedily. Dividing logits of ~10 by a
// subnormal temperature (< ~6e-38) overflows to inf and the softmax to NaN;
// at 1e-3 the softmax already puts all mass on the argmax for any gap above
// 0.1 logit (e^-100), so greedy is what such a temperature means anyway.
#define SAMPLER_MIN_TEMPERATURE 1e-3f

// top_p values in (0, SAMPLER_MIN_TOP_P) are raised to it: a float cannot
// hold 1e-46 (it becomes 0, which means "top-p off"), and any top_p this
// small keeps only the likeliest token, as SAMPLER_MIN_TOP_P does.
#define SAMPLER_MIN_TOP_P 1e-6f

// A top_p given as a double (a JSON number, a command-line value) as the
// float the sampler takes: 0 stays 0 (off), values in (0, SAMPLER_MIN_TOP_P)
// become SAMPLER_MIN_TOP_P, others are converted as they are.
float sampler_top_p_from_double(double top_p);

typedef struct sampler_candidate {
    float probability;
    int32_t token;
} sampler_candidate;

typedef struct sampler {
    int vocab_size;
    float temperature;              // 0 (or below SAMPLER_MIN_TEMPERATURE) = greedy
    float top_p;                    // in (0, 1) for nucleus sampling, else off
    uint64_t rng_state;             // xorshift* state, never 0
    sampler_candidate* candidates;  // (vocab_size) scratch for top-p
} sampler;

int sampler_init(sampler* s, int vocab_size, float temperature, float top_p, uint64_t seed, error_info* err);
void sampler_free(sampler* s);

// Chooses a token from logits: (vocab_size) floats, overwritten with
// probabilities when sampling.
int32_t sampler_sample(sampler* s, float* logits);

// The distribution sampler_sample draws from, written over logits: divided
// by the temperature and softmaxed; with 0 < top_p < 1 the tokens outside
// the nucleus zeroed and the rest renormalised; greedy: 1 on the argmax.
// Speculative sampling applies it to the target's and the draft's logits
// alike, so that p and q are cut the same way.
void sampler_distribution(sampler* s, float* logits);

// A token drawn from probabilities (vocab_size floats summing to about 1)
// with the sampler's generator.
int32_t sampler_draw(sampler* s, const float* probabilities);

// Index of the largest value (the first one on ties); values: (n) floats.
int32_t sampler_argmax(const float* values, int n);

// A uniform float in [0, 1) from the generator (24 random bits).
float sampler_random_unit(uint64_t* state);

#endif
