// sequence: one stream of tokens being generated, and what the engine
// knows about it.
//
// A request with n samples becomes n sequences that share the prompt. A
// sequence's tokens are its prompt followed by what it generated;
// n_computed of them have their keys and values in the cache. Each step
// computes the next chunk [n_computed, n_computed + chunk): a prefill chunk
// while prompt tokens (or, after preemption, earlier tokens) remain, one
// decode token otherwise.
#ifndef SERVELAB_SEQUENCE_H
#define SERVELAB_SEQUENCE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/stop_rule.h"
#include "engine/sampler.h"
#include "engine/speculative.h"

typedef enum sequence_state {
    SEQ_WAITING = 0,   // queued, holds no KV
    SEQ_PREFILL = 1,   // admitted, computing its tokens in chunks
    SEQ_DECODE = 2,    // admitted, one new token per step
    SEQ_PREEMPTED = 3, // pushed out to free blocks; waits to be recomputed
    SEQ_FINISHED = 4,
} sequence_state;

typedef struct sequence {
    int32_t id;            // unique in the engine
    int32_t request_id;    // the request it belongs to
    int32_t sample_index;  // 0 .. n_samples - 1 within the request
    sequence_state state;
    int32_t* tokens;       // (capacity) prompt then generated ids
    int n_tokens;
    int capacity;          // n_prompt + max_new_tokens, at most max_seq_len
    int n_prompt;
    int max_new_tokens;
    int n_computed;        // tokens whose KV is cached
    int32_t* block_table;  // (table_capacity) paged: block ids; contiguous: slot ids
    int n_table;
    int table_capacity;
    int32_t reservation_start; // contiguous: first reserved slot, else -1
    int n_hashed_blocks;   // leading full blocks already offered to the prefix cache
    uint64_t last_block_hash; // hash of block n_hashed_blocks - 1 (0 if none)
    uint64_t admit_order;  // when it was (last) admitted: preemption takes the latest
    sampler sampler;
    double arrival_time;     // engine clock, seconds
    double first_token_time; // engine clock when its first new token was sampled, or -1
    double finish_time;      // engine clock when it finished, or -1
    int n_preemptions;
    stop_reason stop;
    int32_t fork_parent;   // sequence it was forked from, or -1
    int pending_forks;     // paged: samples still to fork off once the prompt is computed
    uint64_t seed;         // sampler seed of this sample (request seed + sample_index)
    bool ignore_eos;       // generate max_new_tokens whatever the model says
    // Speculative decoding (engine/speculative.h):
    int32_t spec_guesses[SPEC_MAX_K]; // this step's guesses, verified at positions n_computed + 1 ..
    int n_spec_guesses;    // proposed for this step (the scheduler may cut them to the token budget)
    float* spec_draft_probabilities; // (k, vocab) the draft's q for each guess (temperature > 0), or NULL
    int32_t* draft_block_table; // (draft_table_capacity) the draft model's KV blocks, in its own pool
    int n_draft_table;
    int draft_table_capacity;
    int draft_n_computed;  // tokens whose KV the draft model has cached
    uint64_t spec_total_drafted;  // guesses proposed so far
    uint64_t spec_total_accepted; // guesses kept so far
} sequence;

// Allocates the token and table arrays; prompt copied. Returns -1 on failure.
int sequence_init(sequence* s, int32_t id, int32_t request_id, const int32_t* prompt, int n_prompt,
                  int max_new_tokens, int max_seq_len, error_info* err);
void sequence_free(sequence* s);

// Makes room for n more table entries.
int sequence_reserve_table(sequence* s, int n_entries);

// Tokens still to be computed before the next token can be sampled.
static inline int sequence_pending_tokens(const sequence* s) { return s->n_tokens - s->n_computed; }

const char* sequence_state_name(sequence_state state);

#endif
