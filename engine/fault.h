// fault: realistic bugs the engine can be started with, on purpose.
//
// A lesson's verdict is only worth something if it turns when the engine is
// wrong in the way the claim is about. Each fault below is one such bug,
// written as a branch in the real code path: with no fault enabled every
// branch is a predictable not-taken test of one word, so the engine is the
// same code at the same speed (the shipped build carries them all).
//
// The set is process-wide and chosen once, before any engine, model or
// quantizer is made: by `--fault NAME[,NAME]` on lab, sim, generate and
// lesson run, or by a lesson runner that installs it around one run. It is
// never changed while an engine is stepping.
#ifndef SERVELAB_FAULT_H
#define SERVELAB_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef enum fault_id {
    // paged attention and the KV cache
    FAULT_PAGED_WRONG_SLOT,      // paged attention reads the tail block's slot one off (the previous slot)
    FAULT_SKIP_LAST_BLOCK,       // paged attention never reads the last block of the context
    FAULT_KV_COUNT_DROPPED,      // KV bytes written are not counted
    FAULT_KV_COUNT_DOUBLED,      // KV bytes written and read are counted twice
    FAULT_WEIGHT_COUNT_DOUBLED,  // weight bytes read are counted twice
    FAULT_FLOPS_ALLOCATED,       // attention FLOPs are counted over allocated slots, not the context
    FAULT_NO_COW,                // a fork writes into the block it shares, without copying it
    FAULT_PREFIX_NO_REFCOUNT,    // the prefix cache shares blocks without counting references
    FAULT_STATIC_BATCHING,       // "continuous" batching admits only when the batch is empty
    FAULT_RESERVE_REQUEST_LENGTH, // a contiguous reservation covers the request, not the max context
    FAULT_UNBATCHED_DECODE,      // a batched step runs its rows one by one, reading the weights each time
    // quantization
    FAULT_ROUND_FLOOR,           // quantization rounds down instead of to the nearest code
    FAULT_ZERO_POINT_PLUS,       // the zero-point uses +r_min/s instead of -r_min/s
    FAULT_SYM_SCALE_FULL_RANGE,  // the symmetric scale uses r_max - r_min instead of max|r|
    FAULT_WRAP_NOT_CLIP,         // out-of-range codes wrap around instead of saturating
    FAULT_GROUP_TENSOR_MAX,      // each group's scale uses the whole tensor's max, not the group's
    FAULT_AWQ_NO_SCALING,        // AWQ searches its scales but quantizes the unscaled weights
    FAULT_GPTQ_NO_FEEDBACK,      // GPTQ rounds each column without feeding the error forward
    // parallelism
    FAULT_TP_FULL_WEIGHTS,       // a tensor-parallel shard streams the whole FFN block (w1, w3, w2), not its slice
    // quantized models
    FAULT_QUANT_KEEPS_FP16,      // a quantized model keeps a copy of its unquantized weights allocated
    FAULT_W8A8_FLOAT_ACTIVATIONS, // W8A8 never quantizes its activations (runs as W8A16)
    // paged KV blocks
    FAULT_PAGED_ALLOCATE_AHEAD,  // paged admission takes blocks for prompt + max_tokens at once
    FAULT_COW_SHORT_COPY,        // copy-on-write copies one slot fewer than the block holds
    FAULT_KV_INT8_SCALES_UNCOUNTED, // int8 KV's per-token, per-head fp32 scales are left out of the KV bytes
    // memory pressure (lesson 10)
    FAULT_EVICT_MOST_RECENT,     // a full pool evicts the most recently used cached prefix block, not the least
    FAULT_PREEMPT_OLDEST,        // preemption takes the sequence admitted first, not the one admitted last
    FAULT_RECOMPUTE_EXTRA_TOKEN, // a preempted sequence's last token is appended twice before its recompute
    FAULT_CHUNK_IGNORES_BUDGET,  // a prefill chunk takes the whole step budget, not what the decodes left of it
    FAULT_TP_ALLREDUCE_ONE_WAY,  // an all-reduce counts its reduce-scatter only: (N-1)/N of the message, not 2(N-1)/N
    // speculative decoding
    FAULT_SPEC_NO_RESIDUAL,      // a refused guess is replaced by a draw from p, not from the residual max(0, p - q)
    FAULT_SPEC_NO_ROLLBACK,      // the refused guesses' KV blocks are not given back to the pool
    FAULT_COUNT
} fault_id;

typedef uint32_t fault_set; // bit (1u << fault_id) per enabled fault
_Static_assert(FAULT_COUNT <= 32, "fault_set holds one bit per fault: widen it past 32 faults");

// The faults this process runs with; 0 in every normal run.
extern fault_set fault_enabled_set;

static inline bool fault_on(fault_id id) { return (fault_enabled_set >> id) & 1u; }

// Installs the set for what follows; returns the previous one (a lesson
// runner restores it after the run).
fault_set fault_install(fault_set set);

// "no-cow" -> FAULT_NO_COW; -1 for an unknown name.
int fault_lookup(const char* name);
const char* fault_name(fault_id id);
const char* fault_description(fault_id id); // one line: what breaks

// Parses "name[,name...]" (spaces allowed around commas); an unknown name is
// an error that lists the known ones.
int fault_set_parse(const char* text, fault_set* out, error_info* err);

// "no-cow,round-floor" into out (empty for 0).
void fault_set_describe(fault_set set, char* out, size_t capacity);

#endif
