// audit: after each step, the engine's state and step record checked
// against quantities worked out independently of the code that produced
// them (issue 43). On with engine_config.audit (`--audit`, lab.engine{audit
// = true}) or from the environment (audit_requested_by_environment).
//
// What is checked, each by its own count rather than by calling the
// function the engine used:
//   ref-count        a block's ref count = the block tables listing it + 1
//                    when the prefix cache indexes it (tables walked here)
//   pool-balance     free + used + cached = total, each counted from the
//                    tables and the cache, and equal to the record's figures
//   pool-whole       with nothing waiting or running, every block is free
//                    or held by the prefix cache alone
//   kv-written       KV bytes written = tokens x n_layers x 2 x slot bytes
//   kv-read          KV bytes read = sum over each sequence's rows of its
//                    context (c0 + 1 .. c0 + n) x n_layers x 2 x slot bytes
//   attention-flops  4 x n_heads x head_dim x n_layers x the rows' contexts
//   weight-bytes     every matrix once a step, the embedding once a token,
//                    each norm's gain once (fp32 and fp16 models, CPU)
//   allreduce-bytes  per all-reduce 2 (N - 1) / N x rows x dim x 4
//   write-shared     no block a sequence wrote this step is in another table
//   copy-bytes       copy-on-write bytes = the copier's position mod
//                    block_size slots x n_layers x 2 x slot bytes
//   table-length     a sequence holds ceil(tokens / block_size) blocks (one
//                    fewer while its just-sampled token waits for a block)
//   reservation-length  a contiguous sequence reserves what its policy says:
//                    the model's maximum, or its prompt + max_tokens
//   tail-waste       tail waste = (block_size - tokens mod block_size) mod
//                    block_size, 0 at exact multiples
//   prefix-chain     a cached block in a table holds the sequence's token
//                    ids at that position and names the block before it as
//                    its parent
//   slots-used       the record's used slots = the distinct cache slots the
//                    running sequences' computed positions map to
//                    through their tables (paged and contiguous)
//   length-stop      no live sequence has generated max_tokens or more
//   lru-eviction     an evicted block was used less recently than every
//                    block left evictable that the step did not touch (by
//                    the pool clock remembered at the last audit)
//   preempted-first  in the waiting queue every preempted sequence stands
//                    before every request not yet admitted
//   allreduce-count  2 all-reduces per layer in a sharded step with rows
//   preemption       the victims were admitted after every sequence that
//                    survived (by the audit's own admission count), and the counters (record, scheduler, each
//                    sequence's) moved by the same number
// Contiguous engines are held to the traffic, tail-waste, slots-used,
// preemption and waiting-order checks only.
//
// A broken invariant is an error naming the invariant, the step, the block
// or sequence, and both numbers; engine_step returns it.
#ifndef SERVELAB_AUDIT_H
#define SERVELAB_AUDIT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

struct engine;
struct step_record;

// What the audit remembers between steps (owned by the engine).
typedef struct engine_audit {
    int32_t* holders; // (2, n_blocks) scratch: tables listing each block; those of the step's sequences
    int n_blocks;
    uint32_t* slot_marks;      // (n_slot_marks) epoch a slot was last counted in slots-used
    int64_t n_slot_marks;
    uint32_t slot_epoch;
    uint64_t* evictable_since; // (n_blocks) last_used of each block only the cache held at the last audit, else 0
    uint64_t last_total_preemptions;
    uint64_t admissions;       // sequences the audit has seen start running
    int32_t* last_preemptions; // (n_ids) each sequence id's n_preemptions after the last audit
    int32_t* last_request;     // (n_ids) the request that id belonged to (ids are reused)
    uint64_t* admitted_order;  // (n_ids) the audit's own admission number of a running sequence, 0 if none
    int n_ids;
    uint64_t n_checks; // invariants checked so far (a test can see the audit ran)
} engine_audit;

// True when the environment asks for the audit: SERVELAB_AUDIT=1 for an
// engine built without a deliberate fault (what `make test` sets: the fault
// tests and the fault matrix watch what a fault does), SERVELAB_AUDIT=all
// for every engine (what `--audit` on `lesson run` and `bench` sets).
bool audit_requested_by_environment(bool faults_installed);

// Checks the step just recorded in `r`. -1 with err naming the first broken invariant.
int audit_step(engine_audit* a, const struct engine* e, const struct step_record* r, error_info* err);

void audit_free(engine_audit* a);

#endif
