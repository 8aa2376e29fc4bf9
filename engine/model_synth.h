// model_synth: synthetic models generated from a seed, with no file.
//
// So that the lab runs with nothing downloaded, and so that models of any
// size exist for the memory-bandwidth lessons, presets are generated
// deterministically (same seed, same weights, on every machine).
//
// The recipe imitates the statistics of trained LLM weights rather than
// plain uniform noise, because the quantization lessons depend on them:
//   W[o][i] = N(0,1) * sigma * row_gain[o] * column_gain[i]
//   sigma        = 1 / sqrt(d_in)            (keeps activations O(1))
//   row_gain     = exp(0.25 N(0,1))          per output channel: channels differ
//   column_gain  = exp(0.25 N(0,1)), and 0.5% of input channels (at least
//                  one) multiplied by a factor drawn from [10, 20]: the
//                  outlier channels that stretch a per-tensor range, so that
//                  per-tensor INT4 suffers while per-group scales recover.
//   RMSNorm gains = |1 + 0.1 N(0,1)|; embedding = N(0,1) * 2 / sqrt(dim);
//   the classifier shares the embedding.
// Every tensor draws from its own splitmix64 stream seeded by (seed, tensor
// index), so a tensor's values do not depend on the others.
#ifndef SERVELAB_MODEL_SYNTH_H
#define SERVELAB_MODEL_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/model.h"

#define SYNTH_DEFAULT_SEED 20240601u

typedef struct synth_preset {
    const char* name;
    const char* summary;  // one line for --help
    model_config shape;   // vocab_size 0: the tokenizer decides it; else fixed (stories110m: 32000)
} synth_preset;

// The preset called name, or NULL. "PRESET:kvN" names PRESET with N KV
// heads, for every N that divides its query heads ("small:kv6" is small's
// multi-head twin: the same shape, with one KV head per query head).
const synth_preset* synth_find_preset(const char* name);

// All presets, terminated by an entry with name NULL.
const synth_preset* synth_presets(void);

// Generates preset `name` with vocab_size tokens (259 for the byte-level
// tokenizer, 512 with tok512), unless the preset fixes its vocabulary
// (stories110m: 32000; a smaller tokenizer then simply never produces the
// upper ids). dtype DEFAULT means fp16.
int model_synthesize(model* out, const char* name, int vocab_size, model_dtype_choice dtype, uint64_t seed,
                     error_info* err);

#endif
