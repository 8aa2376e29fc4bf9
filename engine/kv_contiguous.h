// kv_contiguous: the pre-paging baseline, one contiguous run per request.
//
// The same KV memory budget, seen as n_slots token slots. At admission a
// request reserves one run of slots long enough for everything it may ever
// hold (the model's max length, as pre-vLLM servers did, or prompt +
// max_tokens when the output length is known in advance), placed at the
// first hole that fits. Reserved slots that never receive a token are
// internal waste; free slots split into holes too small for the next
// request are external fragmentation. Attention reads the run through a
// block table with block_size 1 (one slot per entry), so the math is the
// same as in the paged pool.
#ifndef SERVELAB_KV_CONTIGUOUS_H
#define SERVELAB_KV_CONTIGUOUS_H

#include <stdint.h>

#include "base/error.h"
#include "engine/kv_memory.h"

typedef struct kv_reservation {
    int32_t sequence; // owner
    int32_t start;    // first slot
    int32_t length;   // slots reserved
} kv_reservation;

typedef struct kv_contiguous {
    int n_slots;                   // token slots in the budget
    kv_memory memory;              // (n_slots) blocks of one slot
    kv_reservation* reservations;  // (n_reservations) sorted by start
    int n_reservations;
    int reservations_capacity;
} kv_contiguous;

int kv_contiguous_init(kv_contiguous* c, const model_config* config, kv_dtype dtype, int n_slots, error_info* err);
void kv_contiguous_free(kv_contiguous* c);

// Reserves `length` consecutive slots for `sequence` at the first hole that
// fits; returns the first slot, or -1 when no hole is long enough.
int32_t kv_contiguous_reserve(kv_contiguous* c, int32_t sequence, int length);

// Returns the sequence's run to the free space (no-op if it has none).
void kv_contiguous_release(kv_contiguous* c, int32_t sequence);

typedef struct kv_contiguous_usage {
    int64_t reserved_slots;   // slots inside reservations
    int64_t free_slots;       // slots outside reservations
    int64_t largest_hole;     // the longest run of free slots
    int n_holes;              // runs of free slots
} kv_contiguous_usage;

kv_contiguous_usage kv_contiguous_measure(const kv_contiguous* c);

#endif
