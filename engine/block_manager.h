// block_manager: a sequence's KV memory, paged or contiguous.
//
// The block manager decides who holds which part of the KV memory; the
// pool (engine/kv_blocks.h) or the contiguous allocator
// (engine/kv_contiguous.h) it is given holds the memory itself. What each
// layout does is in its own file behind engine/kv_layout.h:
//
// Paged: blocks come from the pool one at a time. At admission a sequence
// gets blocks for every token it must compute now; blocks whose chained hash
// is in the prefix cache are shared instead of computed. In decode it gets a
// new block each time it crosses a block boundary, and copies a shared tail
// block before writing into it (copy-on-write).
// Contiguous: at admission one run of slots for the whole reservation.
#ifndef SERVELAB_BLOCK_MANAGER_H
#define SERVELAB_BLOCK_MANAGER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/kv_blocks.h"
#include "engine/kv_contiguous.h"
#include "engine/kv_layout.h"
#include "engine/sequence.h"

typedef enum reserve_policy {
    RESERVE_MAX = 0,     // contiguous: every request reserves the model's max length
    RESERVE_REQUEST = 1, // contiguous: prompt + max_tokens (an oracle that knows output lengths)
} reserve_policy;

typedef struct block_manager {
    kv_layout layout;
    const kv_layout_ops* ops;   // the layout's functions
    int block_size;             // tokens per block (paged)
    bool prefix_caching;        // share cached full blocks of equal prefixes (paged)
    reserve_policy reserve;     // contiguous
    int max_seq_len;            // the model's: what RESERVE_MAX reserves
    kv_pool* pool;              // paged: the pool (not owned), else NULL
    kv_contiguous* contiguous;  // contiguous: the slots (not owned), else NULL
    uint64_t* mark;             // paged: (n_blocks) scratch for counting shared blocks once
    uint64_t mark_epoch;
} block_manager;

// A paged manager over `pool`.
int block_manager_init_paged(block_manager* bm, kv_pool* pool, bool prefix_caching, error_info* err);

// A contiguous manager over `contiguous`; RESERVE_MAX reserves max_seq_len slots.
int block_manager_init_contiguous(block_manager* bm, kv_contiguous* contiguous, reserve_policy reserve,
                                  int max_seq_len, error_info* err);

void block_manager_free(block_manager* bm);

// Blocks (paged) or slots (contiguous) the sequence needs to be admitted now,
// after prefix-cache hits; *hit_blocks gets the number of cached blocks it
// would reuse. *pending is true when one of its prompt blocks is being
// computed right now by another running sequence (admit it next step and
// reuse that block instead of computing it twice).
int block_manager_admission_cost(const block_manager* bm, const sequence* s, running_view running, int* hit_blocks,
                                 bool* pending);

// Blocks (paged) or slots (contiguous) admission may take now.
int64_t block_manager_available(const block_manager* bm);

// Gives the sequence its memory for admission. Returns -1 when it does not fit.
int block_manager_admit(block_manager* bm, sequence* s, int* prefix_hit_tokens);

// Makes sure the slot of the sequence's next token exists and is private
// (allocating a block or copying a shared one). -1 when the pool is empty.
int block_manager_prepare_decode(block_manager* bm, sequence* s);

// Speculative decoding (engine/speculative.h): makes the slots of the
// n_ahead positions after the next one exist and be private, as
// prepare_decode does for the next; never preempts. Returns how many it
// prepared (fewer when the pool runs out).
int block_manager_prepare_ahead(block_manager* bm, sequence* s, int n_ahead);

// Speculative rollback: gives back the blocks past the sequence's first
// n_tokens tokens (paged; a contiguous reservation stays). Returns the
// number of blocks given back.
int block_manager_truncate(block_manager* bm, sequence* s, int n_tokens);

// Returns every block (or the reservation) of the sequence.
void block_manager_release(block_manager* bm, sequence* s);

// Child shares all of parent's blocks (layouts that share blocks only).
void block_manager_fork(block_manager* bm, const sequence* parent, sequence* child);

// After tokens [from, to) of s were written: block fill counts, and full
// blocks offered to the prefix cache.
void block_manager_after_compute(block_manager* bm, sequence* s, int from, int to);

// Largest number of blocks (paged) or slots (contiguous) a sequence of
// `length` tokens needs, and how many the whole memory has (for rejection).
int64_t block_manager_units_for_length(const block_manager* bm, int length);
int64_t block_manager_capacity_units(const block_manager* bm);

// Slots the memory offers (paged: n_blocks x block_size).
int64_t block_manager_slots(const block_manager* bm);

// The keys and values themselves.
kv_memory* block_manager_memory(block_manager* bm);

// Slots of the sequence's memory past its last token (paged: 0..block_size - 1; contiguous: 0).
int32_t block_manager_tail_waste(const block_manager* bm, const sequence* s);

// Occupancy and waste over the running sequences (each shared block once).
kv_usage block_manager_measure(block_manager* bm, running_view running);

#endif
