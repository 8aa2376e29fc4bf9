#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"

// splitmix64's finalizer: the xorshift* state must not start at the seed
// itself. Forks sample with seed + k, and a small seed is a state with few
// bits set, whose first draws are near 0: of the first draws from seeds
// 1..2000, 14 fell below 0.0018 (3.6 expected), so a token of probability
// 0.18% came up four times too often among the forks of a request.
static uint64_t mix_seed(uint64_t seed) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z ? z : 0x9E3779B97F4A7C15ull; // xorshift never leaves 0
}

int sampler_init(sampler* s, int vocab_size, float temperature, float top_p, uint64_t seed, error_info* err) {
    memset(s, 0, sizeof *s);
    if (vocab_size <= 0) return error_set(err, "sampler: vocab_size: expected a positive value, found %d", vocab_size);
    if (!(temperature >= 0.0f) || !isfinite(temperature))
        return error_set(err, "--temperature: expected a number >= 0, found %g", (double)temperature);
    if (!(top_p >= 0.0f && top_p <= 1.0f))
        return error_set(err, "--top-p: expected a number in [0, 1], found %g", (double)top_p);
    s->vocab_size = vocab_size;
    s->temperature = temperature;
    s->top_p = top_p > 0.0f && top_p < SAMPLER_MIN_TOP_P ? SAMPLER_MIN_TOP_P : top_p;
    s->rng_state = mix_seed(seed);
    s->candidates = malloc((size_t)vocab_size * sizeof *s->candidates);
    if (!s->candidates) return error_set(err, "sampler: out of memory for %d tokens", vocab_size);
    return 0;
}

void sampler_free(sampler* s) {
    free(s->candidates);
    memset(s, 0, sizeof *s);
}

static uint32_t random_u32(uint64_t* state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

float sampler_random_unit(uint64_t* state) { return (float)(random_u32(state) >> 8) / 16777216.0f; }

int32_t sampler_argmax(const float* values, int n) {
    // The best value kept in a register, not reloaded through `best` every
    // step (which the compiler must do: a load that depends on the last
    // comparison). The first index of the maximum wins; NaN never does.
    int32_t best = 0;
    float best_value = values[0];
    for (int i = 1; i < n; i++)
        if (values[i] > best_value) best_value = values[i], best = i;
    return best;
}

// Draws from the whole distribution: the first token whose cumulative
// probability exceeds coin.
static int32_t sample_all(const float* probabilities, int n, float coin) {
    float cumulative = 0.0f;
    for (int i = 0; i < n; i++) {
        cumulative += probabilities[i];
        if (coin < cumulative) return i;
    }
    return n - 1; // rounding left the total a hair under 1
}

static int by_probability_descending(const void* a, const void* b) {
    const sampler_candidate* x = a;
    const sampler_candidate* y = b;
    if (x->probability > y->probability) return -1;
    if (x->probability < y->probability) return 1;
    return x->token < y->token ? -1 : x->token > y->token; // a total order: same result on every libc
}

// The nucleus: s->candidates[0..last] by descending probability, up to the
// first whose running total passes top_p; *total gets that total. Tokens
// below (1 - top_p) / (n - 1) can never be in it, so they are dropped before
// sorting (llama2.c's shortcut). -1 when none is left (all below the cutoff).
static int find_nucleus(sampler* s, const float* probabilities, float* total) {
    const int n = s->vocab_size;
    const float cutoff = (1.0f - s->top_p) / (float)(n > 1 ? n - 1 : 1);
    int n_candidates = 0;
    for (int i = 0; i < n; i++) {
        if (probabilities[i] >= cutoff) {
            s->candidates[n_candidates].probability = probabilities[i];
            s->candidates[n_candidates].token = i;
            n_candidates++;
        }
    }
    if (n_candidates == 0) return -1;
    qsort(s->candidates, (size_t)n_candidates, sizeof *s->candidates, by_probability_descending);
    float cumulative = 0.0f;
    int last = n_candidates - 1;
    for (int i = 0; i < n_candidates; i++) {
        cumulative += s->candidates[i].probability;
        if (cumulative > s->top_p) {
            last = i;
            break;
        }
    }
    *total = cumulative;
    return last;
}

static int32_t sample_top_p(sampler* s, const float* probabilities, float coin) {
    float cumulative = 0.0f;
    int last = find_nucleus(s, probabilities, &cumulative);
    if (last < 0) return sampler_argmax(probabilities, s->vocab_size);
    float threshold = coin * cumulative;
    float running = 0.0f;
    for (int i = 0; i <= last; i++) {
        running += s->candidates[i].probability;
        if (threshold < running) return s->candidates[i].token;
    }
    return s->candidates[last].token;
}

float sampler_top_p_from_double(double top_p) {
    if (top_p > 0.0 && top_p < (double)SAMPLER_MIN_TOP_P) return SAMPLER_MIN_TOP_P;
    return (float)top_p;
}

int32_t sampler_sample(sampler* s, float* logits) {
    if (s->temperature < SAMPLER_MIN_TEMPERATURE) return sampler_argmax(logits, s->vocab_size);
    for (int i = 0; i < s->vocab_size; i++) logits[i] /= s->temperature;
    softmax(logits, s->vocab_size);
    float coin = sampler_random_unit(&s->rng_state);
    if (s->top_p <= 0.0f || s->top_p >= 1.0f) return sample_all(logits, s->vocab_size, coin);
    return sample_top_p(s, logits, coin);
}

void sampler_distribution(sampler* s, float* logits) {
    const int n = s->vocab_size;
    if (s->temperature < SAMPLER_MIN_TEMPERATURE) {
        int32_t best = sampler_argmax(logits, n);
        memset(logits, 0, (size_t)n * sizeof *logits);
        logits[best] = 1.0f;
        return;
    }
    for (int i = 0; i < n; i++) logits[i] /= s->temperature;
    softmax(logits, n);
    if (s->top_p <= 0.0f || s->top_p >= 1.0f) return;
    // The nucleus sample_top_p draws from, renormalized.
    float cumulative = 0.0f;
    int last = find_nucleus(s, logits, &cumulative);
    if (last < 0) {
        int32_t best = sampler_argmax(logits, n);
        memset(logits, 0, (size_t)n * sizeof *logits);
        logits[best] = 1.0f;
        return;
    }
    memset(logits, 0, (size_t)n * sizeof *logits);
    for (int i = 0; i <= last; i++) logits[s->candidates[i].token] = s->candidates[i].probability / cumulative;
}

int32_t sampler_draw(sampler* s, const float* probabilities) {
    return sample_all(probabilities, s->vocab_size, sampler_random_unit(&s->rng_state));
}
