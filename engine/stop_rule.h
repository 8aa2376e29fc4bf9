// stop_rule: when a sampled token ends a sequence, and why.
//
// The engine applies it to every sampled token (engine.c, sample_batch),
// unless the request asked to ignore EOS (benchmarks).
#ifndef SERVELAB_STOP_RULE_H
#define SERVELAB_STOP_RULE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/model.h"

typedef enum stop_reason {
    STOP_LENGTH = 0,    // max_new_tokens reached
    STOP_EOS = 1,       // the model emitted EOS (or another of its stop tokens)
    STOP_BOS = 2,       // the model emitted BOS after the first token
    STOP_CONTEXT = 3,   // the model's max_seq_len was reached
    STOP_CANCELLED = 4, // cancelled by its owner (engine_cancel_sequence)
} stop_reason;

// "length", "eos", "bos", "context", "cancelled".
const char* stop_reason_name(stop_reason reason);

// Whether sampling `token` ends a sequence on model m, and why: one of
// m->stop_tokens (a GGUF's EOS, EOT, <|im_end|>...) gives STOP_EOS; a model
// without them (llama2.c checkpoints, synthetic presets) stops on EOS 2
// (STOP_EOS) and BOS 1 (STOP_BOS, llama2.c's "a new story").
bool token_ends_sequence(const model* m, int32_t token, stop_reason* reason);

#endif
