// kv_layout: how a KV budget is handed to sequences, behind one table of
// functions that the block manager calls.
//
// Paged (vLLM, engine/kv_layout_paged.c): a pool of fixed-size blocks,
// given out one block at a time as a sequence grows, shared between
// sequences with equal prefixes and between forks (copy on write).
// Contiguous (before vLLM, engine/kv_layout_contiguous.c): one run of
// slots per request, reserved whole at admission for everything it may
// ever hold; nothing is shared.
#ifndef SERVELAB_KV_LAYOUT_H
#define SERVELAB_KV_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/kv_memory.h"
#include "engine/sequence.h"

typedef enum kv_layout { KV_LAYOUT_PAGED = 0, KV_LAYOUT_CONTIGUOUS = 1 } kv_layout;

// The running sequences, which admission looks through for a prefix being
// computed right now, and which occupancy is measured over.
typedef struct running_view {
    const sequence* sequences; // every sequence, by id
    const int32_t* running;    // (n_running) ids
    int n_running;
} running_view;

// Occupancy and waste after a step, in blocks (paged) and token slots.
typedef struct kv_usage {
    int blocks_total, blocks_free, blocks_used, blocks_cached; // paged; 0 for contiguous
    int64_t slots_total;           // slots in the memory
    int64_t slots_used;            // slots holding a token (shared blocks once)
    int64_t slots_allocated;       // paged: slots of used blocks; contiguous: reserved slots
    int64_t tail_waste_slots;      // paged: slots past each sequence's last computed token in its last block
    int64_t reserved_unused_slots; // contiguous: reserved but holding no token
    int64_t external_fragmentation_slots; // contiguous: free slots outside the largest hole
} kv_usage;

struct block_manager;

typedef struct kv_layout_ops {
    const char* unit_name;  // what memory is counted in: "blocks" or "slots"
    bool shares_blocks;     // forks and equal prefixes may share memory
    // Most units a sequence of `length` tokens can need, and all there are (rejection).
    int64_t (*units_for_length)(const struct block_manager* bm, int length);
    int64_t (*capacity_units)(const struct block_manager* bm);
    int64_t (*available_units)(const struct block_manager* bm); // admission may take now
    int64_t (*slots)(const struct block_manager* bm);
    kv_memory* (*memory)(struct block_manager* bm);
    int (*admission_cost)(const struct block_manager* bm, const sequence* s, running_view running, int* hit_blocks,
                          bool* pending);
    int (*admit)(struct block_manager* bm, sequence* s, int* prefix_hit_tokens);
    int (*prepare_decode)(struct block_manager* bm, sequence* s);
    void (*release)(struct block_manager* bm, sequence* s);
    void (*fork)(struct block_manager* bm, const sequence* parent, sequence* child); // shares_blocks only
    void (*after_compute)(struct block_manager* bm, sequence* s, int from, int to);
    int32_t (*tail_waste)(const struct block_manager* bm, const sequence* s);
    kv_usage (*measure)(struct block_manager* bm, running_view running);
} kv_layout_ops;

extern const kv_layout_ops kv_layout_paged_ops;
extern const kv_layout_ops kv_layout_contiguous_ops;

#endif
