// step_record: what one engine step did, the one source of truth for the
// dashboard, lessons, --trace files and benchmarks (DESIGN.md). A reader
// needs nothing else from the engine: the pool's blocks, the queues and
// every live sequence are in it, measured once per step (and between steps
// by engine_view, or into a reader's own record by engine_snapshot; one
// sequence alone by engine_sequence_status).
//
// Byte and FLOP counts are the kernels' own (kernel_traffic), summed over
// the step's forward pass; pool figures are measured after the step.
#ifndef SERVELAB_STEP_RECORD_H
#define SERVELAB_STEP_RECORD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/kv_blocks.h"
#include "engine/kv_layout.h"
#include "engine/sequence.h"
#include "engine/tensor_parallel.h"
#include "kernels/cpu/kernel_traffic.h"

typedef enum step_phase { PHASE_PREFILL = 0, PHASE_DECODE = 1 } step_phase;

typedef struct step_sequence {
    int32_t id;            // sequence id
    int32_t request_id;
    step_phase phase;
    int32_t n_tokens;      // tokens computed this step
    int32_t context_length; // tokens in its cache after the step
    int32_t table_offset;  // its block table: block_ids[table_offset .. + n_table)
    int32_t n_table;
    int32_t tail_fill;     // slots used in its last block (paged)
    int32_t tail_waste_slots; // paged: slots of its blocks past its last computed token, or past its prompt while
                              // it prefills (decoding: n_blocks x block_size - context; the token just sampled
                              // holds no slot yet), 0..block_size - 1; contiguous 0
    // Speculative decoding (engine/speculative.h), this step; all 0 without it. A verifying
    // sequence ran n_tokens = 1 + spec_drafted rows: its last token and the guesses.
    int32_t spec_drafted;     // guesses proposed for it
    int32_t spec_accepted;    // guesses the target kept (a prefix of them)
    int32_t spec_rejected;    // spec_drafted - spec_accepted: the first refused guess and all after it
    int32_t spec_bonus;       // 1 when every guess was kept and the last row gave one more token
    int32_t spec_emitted;     // tokens appended to its output: spec_accepted + 1, fewer when a stop rule cut it
    int32_t spec_rollback_first_position; // first position whose KV slot was written and then rolled back, -1 if none
    int32_t spec_rollback_slots;  // slots written then rolled back: positions [first, first + spec_rollback_slots)
    int32_t spec_rollback_blocks; // blocks the rollback gave back to the pool (their ids are BLOCK_FREE events)
} step_sequence;

// The position of the first row the sequence ran this step: its context
// after the step less the rows it kept (a verifying sequence's refused
// guesses were rolled back, so they are not in its context).
static inline int step_sequence_first_row(const step_sequence* s) {
    return s->context_length - (s->n_tokens - s->spec_rollback_slots);
}

// Where a pool block stands after the step (the dashboard's pool map).
typedef enum block_state {
    BLOCK_STATE_FREE = 0,   // ref_count 0
    BLOCK_STATE_USED = 1,   // one block table holds it
    BLOCK_STATE_SHARED = 2, // two or more block tables hold it
    BLOCK_STATE_CACHED = 3, // only the prefix cache holds it (evictable)
} block_state;

typedef struct step_block {
    int32_t ref_count;     // owners: block tables + 1 while in the prefix cache
    int32_t n_filled;      // slots holding a token, 0..block_size
    block_state state;
} step_block;

// One sequence the engine still holds (added and not released), whether or
// not it ran this step: the request list of the dashboard and lessons.
typedef struct step_sequence_status {
    int32_t id;
    int32_t request_id;
    int32_t sample_index;     // 0 .. n_samples - 1 within its request
    sequence_state state;
    stop_reason stop;         // why it finished (SEQ_FINISHED only; STOP_CANCELLED when cancelled)
    int32_t n_prompt;
    int32_t n_tokens;         // prompt + generated
    int32_t max_new_tokens;   // the most tokens it may generate (its request's)
    int32_t n_computed;       // tokens whose KV is cached
    int32_t fork_parent;      // the sequence it was forked from, or -1
    int32_t n_preemptions;
    int32_t tail_waste_slots; // as in step_sequence
    double arrival_time;      // engine clock, seconds
    double first_token_time;  // engine clock of its first new token, or -1
    double finish_time;       // engine clock when it finished, or -1
    uint64_t spec_total_drafted;  // guesses proposed for it so far (speculative decoding; else 0)
    uint64_t spec_total_accepted; // guesses kept so far: its acceptance rate is accepted / drafted
    // Borrowed from the engine: valid until the next engine_step or
    // engine_release_sequence (copying every live sequence's tokens each
    // step would cost O(all tokens) per step).
    const int32_t* tokens;    // (n_tokens) prompt then generated ids
    const int32_t* block_table; // (n_table) paged: block ids; contiguous: slot ids
    int32_t n_table;
} step_sequence_status;

typedef struct step_record {
    uint64_t step;                 // 1, 2, ...
    double clock_seconds;          // engine clock at the end of the step
    uint64_t wall_ns;              // wall time of the step
    uint64_t device_ns;            // --backend cuda: the forward pass on the GPU (CUDA events); 0 on the CPU
    int n_sequences;               // sequences that ran
    step_sequence* sequences;      // (n_sequences)
    int32_t* block_ids;            // (sum of n_table) the tables, concatenated
    int prefill_tokens;
    int decode_tokens;
    kernel_traffic traffic;        // bytes and FLOPs reported by the kernels (every shard + replicated parts)
    // Tensor parallelism (engine_config.tp_shards; engine/tensor_parallel.h).
    // shard_traffic[k] is what shard k's kernels did: its slices of wq..w3,
    // RoPE, KV writes and attention of its heads, SwiGLU of its hidden
    // slice. `traffic` = the sum over shards + the replicated parts
    // (embedding, RMSNorms, residual adds with the all-reduce sums,
    // classifier). With 1 shard, shard 0 is all of the layers' work.
    int tp_shards;                 // 1 = no sharding
    const char* tp_link;           // link model name (engine/links.h)
    kernel_traffic shard_traffic[MAX_TP_SHARDS]; // (tp_shards)
    int n_allreduces;              // 2 per layer when sharded, else 0
    uint64_t allreduce_bytes;      // bytes each shard sent: per all-reduce 2 (N - 1) / N x rows x dim x 4 (fp32)
    double allreduce_seconds;      // analytic link time: n_allreduces x latency + allreduce_bytes / bandwidth
    // Paged pool (zeros for contiguous):
    int blocks_total;
    int blocks_free;
    int blocks_used;               // held by at least one sequence
    int blocks_cached;             // evictable: only the prefix cache holds them
    // Both layouts, in token slots:
    int64_t slots_total;           // slots in the pool
    int64_t slots_used;            // slots holding a token (shared blocks once)
    int64_t slots_allocated;       // paged: slots of used blocks; contiguous: reserved slots
    int64_t tail_waste_slots;      // paged: slots past each sequence's last computed token in its last block
    int64_t reserved_unused_slots; // contiguous: reserved but holding no token
    int64_t external_fragmentation_slots; // contiguous: free slots outside the largest hole
    kv_layout layout;
    int block_size;                // the engine's block size (tokens per block; paged)
    step_block* blocks;            // (blocks_total) every pool block after the step (paged; NULL for contiguous)
    int blocks_in_prefix_cache;    // indexed by the prefix cache, in use or evictable (paged)
    uint64_t total_copies;         // copy-on-write copies since the engine started (paged)
    uint64_t total_evictions;      // cached blocks reclaimed since the engine started (paged)
    int n_waiting;
    int n_running;
    int32_t* waiting_ids;          // (n_waiting) first come first served; preempted ones at the front
    int32_t* running_ids;          // (n_running) in admission order
    int n_finished;                // finished since the engine started (cancelled included)
    int n_cancelled;               // cancelled since the engine started
    int n_requests;                // requests added since the engine started
    int n_sequence_ids;            // ids handed out: 0 .. n_sequence_ids - 1 (released ones included)
    int n_live_sequences;          // added and not released
    step_sequence_status* live_sequences; // (n_live_sequences) in id order
    int n_preempted;               // preemptions this step
    int prefix_hit_tokens;         // prompt tokens reused from the prefix cache this step
    uint64_t copy_bytes;           // KV bytes copied by copy-on-write this step
    uint64_t total_preemptions;    // since the engine started
    uint64_t total_prefix_hit_tokens; // since the engine started
    int n_events;
    block_event* events;           // (n_events) block events of this step
    int n_finished_now;
    int32_t* finished_ids;         // (n_finished_now) sequences that finished this step
    // Speculative decoding (engine/speculative.h; the "spec" group of the JSON trace, written
    // only when it is on). `traffic` is the target's forward pass alone; the draft model's
    // passes are in spec_draft_traffic, so a reader can split the bytes of the two.
    const char* spec_kind;         // "none", "draft", "lookup"
    int spec_k;                    // most guesses per sequence per step (0 when off)
    int spec_verify_tokens;        // target rows of verifying sequences: each 1 + its guesses
    int spec_drafted;              // guesses proposed this step, all sequences
    int spec_accepted;             // guesses kept
    int spec_rejected;             // guesses refused (rolled back)
    int spec_bonus;                // bonus tokens (every guess of a sequence kept)
    int spec_emitted;              // tokens the verifying sequences appended (a plain decode's 1 is not in it)
    int spec_rollback_slots;       // KV slots written and rolled back, target cache
    int spec_rollback_blocks;      // blocks the rollbacks gave back to the target pool
    int spec_draft_passes;         // forward calls of the draft model (0 for lookup)
    kernel_traffic spec_draft_traffic; // what the draft model's passes read, wrote and computed
    uint64_t spec_draft_weight_bytes;  // spec_draft_traffic.weight_bytes_read
    uint64_t spec_target_weight_bytes; // traffic.weight_bytes_read: the target's pass
    uint64_t spec_draft_kv_bytes;  // the draft's KV bytes read + written
    int spec_draft_blocks_total;   // the draft model's own KV pool (draft only), after the step
    int spec_draft_blocks_used;
    uint64_t spec_total_drafted;   // since the engine started
    uint64_t spec_total_accepted;
    uint64_t spec_total_emitted;   // tokens appended by decoding sequences (verifying or not: lookup may find nothing)
    uint64_t spec_total_target_passes; // decode sequence-steps (each one target pass for that sequence):
                                       // tokens per target pass = spec_total_emitted / this
    // Room in the arrays above (the engine's bookkeeping, not for readers).
    int sequences_capacity, block_ids_capacity, finished_capacity, waiting_capacity, running_capacity, live_capacity;
} step_record;

// The record's scalar fields, by the names the JSON trace uses. One table
// drives the JSON writer and the Lua host, so the two cannot name a field
// differently.
typedef enum step_field_kind {
    STEP_FIELD_INT = 0,          // int
    STEP_FIELD_U64 = 1,          // uint64_t
    STEP_FIELD_I64 = 2,          // int64_t
    STEP_FIELD_DOUBLE = 3,       // double, written with `decimals` digits
    STEP_FIELD_STRING = 4,       // const char* (NULL written as "")
    STEP_FIELD_TRAFFIC = 5,      // kernel_traffic: its step_traffic_fields, inline
    STEP_FIELD_SHARD_TRAFFIC = 6, // kernel_traffic[tp_shards]: an array of traffic objects
} step_field_kind;

typedef struct step_record_field {
    const char* group;    // the JSON object it sits in ("tp", "pool", "queues"), NULL at the top
    const char* name;     // JSON member name
    step_field_kind kind;
    size_t offset;        // offsetof(step_record, ...) (or kernel_traffic for step_traffic_fields)
    int decimals;         // STEP_FIELD_DOUBLE: digits after the point
    int omit_when_zero;   // 1: left out when 0 (device_ns exists only on --backend cuda)
} step_record_field;

extern const step_record_field step_record_fields[];
extern const int step_record_field_count;
extern const step_record_field step_traffic_fields[]; // offsets into kernel_traffic
extern const int step_traffic_field_count;

// Writes the record as one JSON object on one line (JSON Lines).
void step_record_write_json(const step_record* record, FILE* out);

// Frees the arrays the record owns: the engine's own record in engine_free,
// a reader's snapshot (engine_snapshot) when the reader is done with it.
void step_record_free(step_record* record);

// ---- for the engine only --------------------------------------------------------------------

struct engine;
struct scheduler;
struct step_batch;

// Writes sequence s as readers see it: the one mapping from the engine's
// sequence to step_sequence_status, for the record's live list and
// engine_sequence_status().
void step_sequence_status_fill(step_sequence_status* out, const struct scheduler* sched, const sequence* s);

// Zeroes the step's figures, keeping the arrays the record owns.
void step_record_clear(step_record* record);

// Fills everything but the traffic (the forward pass writes it as it runs)
// and the times: from the step's batch, the sequences that ran and those
// that finished; from the scheduler, the pool, its blocks, the queues and
// every live sequence, measured once after the step. -1 when out of memory.
int step_record_fill(step_record* record, struct engine* e, const struct step_batch* b);

// Fills the configuration, the counts, the queues and every live sequence
// as the engine holds them now, and nothing else: engine_snapshot().
int step_record_fill_queues(step_record* record, const struct engine* e);

// Refills only what the engine holds now (step_record_fill_queues, then the
// pool and its blocks), keeping the last step's own figures (its sequences,
// traffic, events, times): engine_view() between steps.
int step_record_fill_state(step_record* record, struct engine* e);

const char* block_event_name(block_event_kind kind);

#endif
