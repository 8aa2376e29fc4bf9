// engine: one model, one KV memory, one scheduler; engine_step() runs one
// iteration (schedule -> run -> sample -> postprocess -> record) and returns
// its step record.
//
// Several engines can live in one process (a lesson runs paged and
// contiguous side by side): all state is in the struct, nothing global.
#ifndef SERVELAB_ENGINE_H
#define SERVELAB_ENGINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "engine/audit.h"
#include "engine/batch.h"
#include "engine/forward.h"
#include "engine/kv_blocks.h"
#include "engine/kv_contiguous.h"
#include "engine/kv_layout.h"
#include "engine/links.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "engine/step_record.h"

typedef enum engine_backend {
    BACKEND_CPU = 0,  // forward() on the CPU kernels
    BACKEND_CUDA = 1, // forward_cuda_run() on the GPU (engine/forward_cuda.h)
} engine_backend;

typedef struct engine_config {
    kv_layout layout;
    kv_dtype kv_dtype;          // KV_F16 (default) or KV_F32
    int block_size;             // tokens per block, 1..256 (paged)
    int num_blocks;             // blocks in the pool; 0 = from kv_mem_bytes
    uint64_t kv_mem_bytes;      // KV budget when num_blocks is 0
    reserve_policy reserve;
    batching_policy batching;
    int max_seqs;               // sequences running at once
    int max_batched_tokens;     // tokens computed per step (prefill chunks + decodes)
    bool chunked_prefill;       // split long prompts over steps
    bool prefix_caching;        // reuse cached full blocks of equal prefixes (paged)
    int watermark_blocks;       // blocks kept free at admission for running sequences to grow
    int n_threads;              // worker threads for the kernels; 0 = one per online CPU
    int tp_shards;              // simulated tensor parallelism: shards per layer, 1 = off (engine/tensor_parallel.h)
    link_kind tp_link;          // the link the all-reduces are timed on (engine/links.h)
    engine_backend backend;     // where the forward pass runs (default BACKEND_CPU)
    speculative_config speculative; // speculative decoding (engine/speculative.h); kind SPEC_NONE = off
    const model* draft_model;   // SPEC_DRAFT: the proposer (speculative_load_draft), not owned; same vocabulary
    bool audit;                 // check every step against independent counts (engine/audit.h); off by
                                // default, on when SERVELAB_AUDIT=1 and no fault is installed
} engine_config;

// The defaults: paged, fp16 KV, block size 16, 64 MiB, continuous batching,
// 128 sequences, 512 tokens per step, chunked prefill and prefix caching on,
// no tensor parallelism (1 shard; NVLink when sharded).
//
// With tp_shards = N > 1 the n_threads threads are split between the shards:
// the shards run as N tasks of one pool of min(N, n_threads) threads, and
// each shard has its own pool of n_threads / N threads (at least 1) for its
// matmuls and attention rows, so each shard is "one GPU" with its own cores.
engine_config engine_config_default(void);

typedef struct request_params {
    const int32_t* prompt;  // (n_prompt) token ids, BOS first
    int n_prompt;
    int max_new_tokens;
    int n_samples;          // > 1: forks sharing the prompt's blocks
    float temperature;
    float top_p;
    uint64_t seed;          // sample k uses seed + k
    double arrival_time;    // engine clock, seconds (0 = now)
    bool ignore_eos;        // keep going past EOS/BOS until max_new_tokens (benchmarks)
} request_params;

// Called with the logits a sequence samples from (before sampling), for
// tests and lessons: position is the position of the token they follow.
typedef void (*logits_observer)(void* user, int32_t sequence_id, int position, const float* logits, int vocab_size);

typedef struct engine {
    const model* model;
    engine_config config;
    kv_pool pool;               // paged layout: the memory the scheduler's block manager hands out
    kv_contiguous contiguous;   // contiguous layout: the same
    scheduler scheduler;        // the sequences, the queues and the block manager
    step_batch batch;           // this step's plan, rows and samples (reused every step)
    forward_state forward;
    struct forward_cuda* cuda;  // BACKEND_CUDA: weights, KV pool and activations on the GPU; else NULL
    thread_pool* workers;       // the kernels' worker threads (owned)
    float* logits;              // (logits_rows, vocab) one row per sequence sampling this step
    int logits_rows;
    int n_requests;
    uint64_t step_counter;
    double clock_seconds;       // sum of step wall times plus idle jumps
    step_record record;         // the last step's record (it owns its arrays)
    FILE* trace;                // JSON Lines trace, or NULL
    uint64_t total_prefix_hit_tokens;
    logits_observer observer;
    void* observer_user;
    engine_audit audit;         // config.audit: what the audit keeps between steps
    speculative_state spec;     // config.speculative: the draft's pool and activations, the totals
    float* observed_logits;     // (SPEC_MAX_K + 1, vocab) a verifying sequence's rows kept for the observer
} engine;

int engine_init(engine* e, const model* m, const engine_config* config, error_info* err);
void engine_free(engine* e);

// Queues a request (n_samples sequences once its prompt is computed).
// Rejects one that can never fit the pool. *first_sequence_id gets the id
// of its first sequence; the others follow consecutively.
int engine_add_request(engine* e, const request_params* params, int32_t* first_sequence_id, error_info* err);

// Cancels a sequence (a user gave up on it): a waiting one leaves the
// queue, a running one returns its blocks (or reservation) and leaves the
// batch; either way it is finished from now on. Its stop reason is
// STOP_CANCELLED. Finished: no-op.
int engine_cancel_sequence(engine* e, int32_t id, error_info* err);

// Frees what a finished (or cancelled) sequence holds: its tokens, block
// table and sampler scratch (about 4.3 KB a request on stories260K's 512
// tokens, sampler scratch alone 8 bytes per vocabulary entry: 256 KB at
// 32,000). A long-running server calls it when it has read a sequence's
// output; without it every request ever served stays in memory. A waiting,
// running or preempted sequence is refused (cancel it first), as is an id
// never handed out. Ids are never reused: the released id's slot keeps its
// scalar fields (request, sample index, times, stop reason) so that ids of
// later requests stay consecutive, but engine_sequence_status() finds
// nothing for it and engine_release_sequence() refuses it a second time.
int engine_release_sequence(engine* e, int32_t id, error_info* err);

// Sequences whose memory the engine still holds (added and not released).
int engine_live_sequences(const engine* e);

// Forks a sequence that has not finished into one more sample of its
// request: same tokens so far, its own sampler (temperature, seed). Paged and
// holding KV: the child shares every block of the parent and both run from
// the next step; the first write into a shared tail block copies it
// (copy-on-write). Contiguous, or a parent holding no KV: the child waits
// and computes its tokens again (contiguous memory cannot be shared).
int engine_fork_sequence(engine* e, int32_t id, float temperature, uint64_t seed, int32_t* child_id,
                         error_info* err);

// Runs one step. *record points into the engine until the next step.
int engine_step(engine* e, const step_record** record, error_info* err);

// The last step's record with its window brought up to now: the queues,
// every live sequence, the pool and its blocks as they are after the calls
// since that step (adds, cancels, forks, releases). Before the first step,
// a record of step 0 with only that window. NULL when out of memory.
// Valid until the next engine call.
const step_record* engine_view(engine* e);

// A snapshot of the queues and every live sequence as they are now, between
// steps too (adds, forks, cancels and releases show at once), written into
// `view`, a record the caller owns: zeroed before its first use, reused
// across calls, freed with step_record_free. Only the configuration, the
// counts, the queues and the live sequences are filled; the engine's own
// record is left as the last step wrote it (engine_view also brings the pool
// up to now, in that record). Its sequences' tokens and block tables are
// borrowed: valid until the next engine call. -1 when out of memory.
int engine_snapshot(const engine* e, step_record* view);

// True while any request is waiting or running.
bool engine_has_work(const engine* e);

// Moves the engine clock forward (the simulator's idle time).
void engine_advance_clock(engine* e, double seconds);

// Writes every following step record to `trace` as JSON Lines (NULL stops).
void engine_set_trace(engine* e, FILE* trace);

// Sequence `id` as it is now (between steps too), written into *out as the
// record's live list shows it, in O(1). False, *out untouched, for an id
// never handed out or released. Its tokens and block table are borrowed:
// valid until the next engine call.
bool engine_sequence_status(const engine* e, int32_t id, step_sequence_status* out);

void engine_set_logits_observer(engine* e, logits_observer observer, void* user);

// Slots a layout offers for the budget (paged: n_blocks x block_size).
int64_t engine_pool_slots(const engine* e);

#endif
