// batch: what one step computes, from the scheduler's plan to the tokens
// sampled from it.
//
// scheduler_schedule() fills the plan (which sequences, how many tokens
// each) and the rows a forward pass runs; the engine runs them and samples
// one token per sequence that reached its last token; scheduler_postprocess()
// appends those tokens, forks, finishes and frees.
#ifndef SERVELAB_BATCH_H
#define SERVELAB_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/forward.h"
#include "engine/sampler.h"
#include "engine/step_record.h"

typedef struct scheduled_sequence {
    int32_t id;
    int n_tokens;     // tokens to compute this step
    step_phase phase;
    // Speculative decoding (engine/speculative.h): a verifying decode runs its last token and
    // n_guesses guesses (n_tokens = 1 + n_guesses); the engine fills the outcome.
    int n_guesses;
    int n_accepted;   // guesses kept
    int n_emitted;    // tokens to append (sampled[] from its first logit row): n_accepted + 1
    int bonus;        // 1 when every guess was kept
    int rollback_first_position; // filled by scheduler_postprocess: slots rolled back, or -1
    int rollback_slots;
    int rollback_blocks;
} scheduled_sequence;

// A token sampled for one sequence, and whether the model ends there.
typedef struct sampled_token {
    int32_t token;
    bool stops;          // an end token (EOS, BOS, a GGUF's stop tokens) and the sequence does not ignore it
    stop_reason reason;  // STOP_EOS or STOP_BOS when it stops
} sampled_token;

typedef struct step_batch {
    // ---- the plan (scheduler_schedule)
    scheduled_sequence* items;   // (n_items) in batch order
    int n_items;
    int n_preempted;             // sequences preempted to make room this step
    int prefix_hit_tokens;       // prompt tokens reused from the prefix cache by this step's admissions
    // ---- the rows (scheduler_schedule): forward.n_rows rows, one per new token
    batch_row* rows;             // (rows_capacity) token id, position, index into block_tables, wants logits
    const int32_t** block_tables; // (n_items) each sequence's block table (contiguous: slot ids)
    int32_t* slot_mapping;       // (rows_capacity) KV slot each row's key and value go to
                                 // (forward_batch_map_slots; the paged-wrong-slot fault shifts one)
    forward_batch forward;       // rows, block_tables and slot_mapping as forward() and forward_cuda_run() take them
    int n_logit_rows;            // rows that want logits: one per sequence that reaches its last token
    int prefill_tokens;
    int decode_tokens;
    // ---- the samples (the engine, after the forward pass), in logit-row order
    sampled_token* sampled;      // (n_logit_rows) one per sequence, or a verifying sequence's n_emitted from its first row
    // A sequence with pending forks spawns them as it samples: fork k of it
    // gets its own sampler and first token, from the same logits.
    sampler* fork_samplers;      // (n_forks) handed to the new sequences by scheduler_postprocess
    sampled_token* fork_tokens;  // (n_forks)
    int n_forks;
    // ---- the outcome (scheduler_postprocess)
    int32_t* finished_ids;       // (n_finished) sequences that finished this step, in order
    int n_finished;
    // ---- room
    int items_capacity;          // items and block_tables
    int rows_capacity;           // rows, slot_mapping and sampled
    int forks_capacity;
    int finished_capacity;
} step_batch;

// Room for n_items sequences, n_rows rows and n_finished finished ids;
// -1 when out of memory.
int step_batch_reserve(step_batch* b, int n_items, int n_rows, int n_finished);

// Room for n_forks forks this step; -1 when out of memory.
int step_batch_reserve_forks(step_batch* b, int n_forks);

void step_batch_free(step_batch* b);

#endif
