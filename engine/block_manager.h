// block_manager: a sequence's KV memory, paged or contiguous.
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

#include "engine/engine.h"

// Blocks (paged) or slots (contiguous) the sequence needs to be admitted now,
// after prefix-cache hits; *hit_blocks gets the number of cached blocks it
// would reuse. *pending is true when one of its prompt blocks is being
// computed right now by another running sequence (admit it next step and
// reuse that block instead of computing it twice).
int block_manager_admission_cost(engine* e, const sequence* s, int* hit_blocks, bool* pending);

// Gives the sequence its memory for admission. Returns -1 when it does not fit.
int block_manager_admit(engine* e, sequence* s, int* prefix_hit_tokens);

// Makes sure the slot of the sequence's next token exists and is private
// (allocating a block or copying a shared one). -1 when the pool is empty.
int block_manager_prepare_decode(engine* e, sequence* s);

// Returns every block (or the reservation) of the sequence.
void block_manager_release(engine* e, sequence* s);

// Child shares all of parent's blocks.
void block_manager_fork(engine* e, const sequence* parent, sequence* child);

// After tokens [from, to) of s were written: block fill counts, and full
// blocks offered to the prefix cache.
void block_manager_after_compute(engine* e, sequence* s, int from, int to);

// Largest number of slots a sequence of `length` tokens needs (for rejection).
int block_manager_blocks_for_length(const engine* e, int length);

#endif
