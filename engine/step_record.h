// step_record: what one engine step did, the one source of truth for the
// dashboard, lessons, --trace files and benchmarks (DESIGN.md).
//
// Byte and FLOP counts are the kernels' own (kernel_traffic), summed over
// the step's forward pass; pool figures are measured after the step.
#ifndef SERVELAB_STEP_RECORD_H
#define SERVELAB_STEP_RECORD_H

#include <stdint.h>
#include <stdio.h>

#include "engine/kv_blocks.h"
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
} step_sequence;

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
    int64_t tail_waste_slots;      // paged: slots past each sequence's last token in its last block
    int64_t reserved_unused_slots; // contiguous: reserved but holding no token
    int64_t external_fragmentation_slots; // contiguous: free slots outside the largest hole
    int n_waiting;
    int n_running;
    int n_finished;                // finished since the engine started
    int n_preempted;               // preemptions this step
    int prefix_hit_tokens;         // prompt tokens reused from the prefix cache this step
    uint64_t copy_bytes;           // KV bytes copied by copy-on-write this step
    int n_events;
    block_event* events;           // (n_events) block events of this step
    int n_finished_now;
    int32_t* finished_ids;         // (n_finished_now) sequences that finished this step
} step_record;

// Writes the record as one JSON object on one line (JSON Lines).
void step_record_write_json(const step_record* record, FILE* out);

const char* block_event_name(block_event_kind kind);

#endif
