// scheduler: which sequences run in the next step, and how many tokens each.
//
// Iteration-level (continuous) batching, as in Orca and vLLM:
//   1. every running sequence gets its next work: one decode token, or the
//      next chunk of its prefill, within the step's token budget
//      (max_batched_tokens); a decode that needs a block when the pool is
//      empty preempts the most recently admitted sequence (its blocks are
//      freed and it is recomputed later), possibly itself;
//   2. then waiting requests are admitted first-come first-served while the
//      pool has blocks for their prompt plus a small watermark, and there is
//      room under max_seqs and the token budget.
// Static batching admits only when nothing is running, and then as many as
// fit; the batch runs until its longest member finishes.
#ifndef SERVELAB_SCHEDULER_H
#define SERVELAB_SCHEDULER_H

#include "engine/engine.h"

typedef struct scheduled_sequence {
    int32_t id;
    int n_tokens;     // tokens to compute this step
    step_phase phase;
} scheduled_sequence;

typedef struct schedule_result {
    scheduled_sequence* items; // (max_seqs) in batch order
    int n_items;
    int n_preempted;
    int prefix_hit_tokens;
} schedule_result;

int scheduler_schedule(engine* e, schedule_result* out, error_info* err);

// Takes a finished sequence out of the running list.
void scheduler_remove_running(engine* e, int32_t id);

#endif
