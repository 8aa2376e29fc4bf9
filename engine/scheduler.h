// scheduler: which sequences run in the next step, how many tokens each,
// and what happens to them after it.
//
// It owns the serving loop's state: every sequence by id, the waiting and
// running queues, the count of finished ones, and the block manager that
// gives them KV memory. It knows nothing of models or kernels, so it runs
// (and is tested) on a bare pool.
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

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/batch.h"
#include "engine/block_manager.h"
#include "engine/sequence.h"

typedef enum batching_policy {
    BATCHING_CONTINUOUS = 0, // admit and retire at every step
    BATCHING_STATIC = 1,     // admit a batch only when the previous one has fully finished
} batching_policy;

typedef struct scheduler_config {
    batching_policy batching;
    int max_seqs;           // sequences admitted to run at once
    int max_batched_tokens; // tokens computed per step (prefill chunks + decodes)
    bool chunked_prefill;   // split long prompts over steps
    int watermark_blocks;   // blocks kept free at admission for running sequences to grow (paged)
    int max_seq_len;        // the model's: no sequence grows past it
} scheduler_config;

typedef struct scheduler {
    scheduler_config config;
    block_manager kv;           // the KV layout's bookkeeping over the engine's memory
    sequence* sequences;        // (n_sequences) by id; a released id's slot is empty until reused
    int n_sequences;            // ids handed out so far: 0 .. n_sequences - 1
    int sequences_capacity;     // room in sequences, waiting, running, live_ids and reusable_ids
    int32_t* reusable_ids;      // (n_reusable) released ids, taken again (last released first) before a
                                // new one: a server releases every finished sequence, and without reuse
                                // its table grew ~200 B a sequence forever (106 MB after 384k)
    int n_reusable;
    int32_t next_id;            // the id scheduler_new_sequence's slot takes on commit
    int32_t* waiting;           // (n_waiting) ids, first come first served; preempted ones go to the front
    int n_waiting;
    int32_t* running;           // (n_running) ids in admission order
    int n_running;
    int32_t* live_ids;          // (n_live) ids added and not released, ascending
    int n_live;
    int n_finished;             // cancelled ones included
    int n_cancelled;
    int n_released;             // finished sequences whose memory scheduler_release freed
    uint64_t admit_counter;     // admissions so far: the order preemption undoes
    uint64_t total_preemptions;
} scheduler;

// Takes over `kv` (scheduler_free frees it).
int scheduler_init(scheduler* s, const scheduler_config* config, const block_manager* kv, error_info* err);
void scheduler_free(scheduler* s);

// ---- sequences

// Room for one more sequence, whose id will be s->next_id (a released id
// when there is one, else n_sequences, so an engine that never releases
// hands out 0, 1, 2, ... as before): the caller
// initialises it (sequence_init, its sampler) and then calls
// scheduler_add_waiting() or scheduler_commit(). NULL when out of memory.
sequence* scheduler_new_sequence(scheduler* s, error_info* err);

// The new sequence takes its id and is live; it is in no queue yet.
void scheduler_commit(scheduler* s);

// The new sequence takes its id and waits to be admitted.
void scheduler_add_waiting(scheduler* s);

// A sequence continuing `parent_id` for one more sample: same request and
// tokens, its own sample index and seed; no sampler, no KV, no queue yet
// (scheduler_place_fork() puts it somewhere). NULL when out of memory.
sequence* scheduler_clone(scheduler* s, int32_t parent_id, int32_t sample_index, uint64_t seed, error_info* err);

// Paged and the parent holds KV: the child shares every parent block and
// runs from the next step. Otherwise it waits and computes its tokens again.
void scheduler_place_fork(scheduler* s, int32_t parent_id, int32_t child_id);

// Finishes a waiting or running sequence as cancelled, returning its memory.
void scheduler_cancel(scheduler* s, int32_t id, double clock_seconds);

// Frees a finished sequence's tokens, table and sampler; its id stays taken.
void scheduler_release(scheduler* s, int32_t id);

// ---- one step

// Plans the step into *b: the sequences and their token counts (preempting
// and admitting as the rules above say), and the forward pass's rows.
// -1 when out of memory.
int scheduler_schedule(scheduler* s, step_batch* b, error_info* err);

// After the forward pass and sampling: advances every scheduled sequence
// by its tokens, spawns pending forks, appends the sampled tokens and
// finishes the sequences that stop (their memory goes back), recording
// their ids in b->finished_ids. -1 when out of memory.
int scheduler_postprocess(scheduler* s, step_batch* b, double clock_seconds, error_info* err);

// True while any sequence is waiting or running.
bool scheduler_has_work(const scheduler* s);

#endif
