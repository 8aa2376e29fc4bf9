// generate: the stop rule of a generation (stop_reason, generate_stops_at),
// which the engine applies to every sampled token, and generate(), a
// one-sequence decode loop that nothing calls: the engine (engine/engine.c)
// is the driver, and tests decode through it (test_engine_generate in
// tests/test_support.c).
//
// generate() runs the prompt (BOS first) as one batch (prefill), then one
// token per step (decode) until a stop token (generate_stops_at: the model's
// EOS and the like, or llama2.c's EOS and BOS), the token limit, or the
// model's maximum length.
#ifndef SERVELAB_GENERATE_H
#define SERVELAB_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/model.h"
#include "kernels/cpu/kernel_traffic.h"

typedef struct generate_options {
    int max_new_tokens; // tokens to generate at most
    float temperature;  // 0 = greedy
    float top_p;        // nucleus threshold; 0 or 1 = off
    uint64_t seed;      // sampler seed
} generate_options;

typedef enum stop_reason {
    STOP_LENGTH = 0,  // max_new_tokens reached
    STOP_EOS = 1,     // the model emitted EOS
    STOP_BOS = 2,     // the model emitted BOS after the first token
    STOP_CONTEXT = 3, // the model's max_seq_len was reached
    STOP_CANCELLED = 4, // cancelled by its owner (engine_cancel_sequence)
} stop_reason;

typedef struct generate_stats {
    int n_prompt_tokens;          // including BOS
    int n_generated;              // tokens returned (EOS/BOS not counted)
    double prefill_seconds;
    double decode_seconds;        // all decode steps
    int n_decode_steps;           // forward passes after the prefill
    kernel_traffic prefill_traffic;
    kernel_traffic decode_traffic; // summed over decode steps
    stop_reason stop;
} generate_stats;

// Called once per generated token with the previous token (for decoding
// the text piece) and the new one. May be NULL.
typedef void (*token_callback)(void* user, int32_t previous_token, int32_t token);

// prompt_ids: (n_prompt) ids starting with BOS. out_ids: room for
// options->max_new_tokens ids; *n_out gets how many were produced.
int generate(const model* m, const int32_t* prompt_ids, int n_prompt, const generate_options* options,
             int32_t* out_ids, int* n_out, token_callback on_token, void* user, generate_stats* stats,
             error_info* err);

const char* stop_reason_name(stop_reason reason);

// Whether sampling `token` ends a generation on model m, and why: one of
// m->stop_tokens (a GGUF's EOS, EOT, <|im_end|>...) gives STOP_EOS; a model
// without them (llama2.c checkpoints, synthetic presets) stops on EOS 2
// (STOP_EOS) and BOS 1 (STOP_BOS, llama2.c's "a new story").
bool generate_stops_at(const model* m, int32_t token, stop_reason* reason);

#endif
