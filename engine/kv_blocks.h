// kv_blocks: the paged KV block pool.
//
// The KV memory (engine/kv_memory.h) is cut into n_blocks blocks of
// block_size token slots. A sequence owns a block table, the list of its
// blocks in position order; blocks are handed out one at a time as the
// sequence grows, so a sequence never holds more than block_size - 1 empty
// slots (its tail). A block is in exactly one of three states:
//
//   free       ref_count 0, on the free stack, holds nothing useful
//   in use     ref_count >= 1: held by ref_count owners, where an owner is
//              a block table, or the prefix cache (which holds one reference
//              on every block it indexes)
//   evictable  in the prefix cache and held by nothing else (ref_count 1):
//              its KV stays valid so a later request with the same prefix can
//              reuse it, but the pool takes it back, least recently used
//              first, when the free stack is empty.
//
// Prefix caching: a full block is identified by a chained hash of (its
// parent block's hash, its block_size token ids), so equal hashes mean equal
// whole prefixes. The cache keeps the token ids and parent hash of each entry
// and compares them on lookup, so a 64-bit hash collision cannot alias two
// different prefixes.
//
// Every change is logged as a block_event for the current step's record.
#ifndef SERVELAB_KV_BLOCKS_H
#define SERVELAB_KV_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/kv_memory.h"

typedef enum block_event_kind {
    BLOCK_ALLOCATE = 0, // a free (or evicted) block given to a sequence
    BLOCK_FREE = 1,     // the last reference dropped: back on the free stack
    BLOCK_SHARE = 2,    // another owner took a reference (fork, prefix hit)
    BLOCK_COPY = 3,     // copy-on-write: block copied into other_block
    BLOCK_EVICT = 4,    // an evictable cached block reclaimed for reuse
    BLOCK_CACHE = 5,    // a full block entered the prefix cache
} block_event_kind;

typedef struct block_event {
    block_event_kind kind;
    int32_t block;       // the block the event is about
    int32_t sequence;    // the sequence involved, -1 for the pool itself
    int32_t other_block; // BLOCK_COPY: the new copy; else -1
} block_event;

typedef struct kv_block {
    int32_t ref_count;     // owners: block tables + 1 while in the prefix cache
    int32_t n_filled;      // slots holding a token, 0..block_size
    bool cached;           // indexed by the prefix cache
    uint64_t hash;         // chained hash (valid when cached)
    uint64_t parent_hash;  // the previous block's hash (0 for the first block)
    uint64_t last_used;    // pool clock when last released or hit (LRU order)
    int32_t lru_previous;  // evictable list links, -1 at the ends
    int32_t lru_next;
    int32_t bucket_next;   // next block in the same hash bucket, -1 at the end
} kv_block;

typedef struct kv_pool {
    int n_blocks;              // physical blocks
    int block_size;            // token slots per block
    kv_memory memory;          // the keys and values themselves
    kv_block* blocks;          // (n_blocks) bookkeeping per block
    int32_t* block_tokens;     // (n_blocks, block_size) token ids of cached blocks
    int32_t* free_stack;       // (n_blocks) ids of free blocks; top at n_free - 1
    int n_free;
    int32_t lru_head;          // least recently used evictable block, or -1
    int32_t lru_tail;          // most recently used evictable block, or -1
    int n_evictable;
    int n_cached;              // blocks in the prefix cache (evictable or in use)
    int32_t* buckets;          // (n_buckets) first block of each hash chain, or -1
    int n_buckets;             // a power of two >= 2 * n_blocks
    uint64_t clock;            // advances on every release and hit
    block_event* events;       // (events_capacity) events since the last clear
    int n_events;
    int events_capacity;
    uint64_t total_copies;     // copy-on-write copies since creation
    uint64_t total_evictions;  // evictions since creation
    uint64_t copy_bytes;       // KV bytes moved by copy-on-write since the last clear
} kv_pool;

int kv_pool_init(kv_pool* pool, const model_config* config, kv_dtype dtype, int n_blocks, int block_size,
                 error_info* err);
void kv_pool_free(kv_pool* pool);

// Blocks a sequence could get now: free plus evictable.
int kv_pool_available(const kv_pool* pool);

// A block for `sequence` with ref_count 1 and nothing filled: from the free
// stack, else by evicting the least recently used cached block. -1 when
// every block is in use.
int32_t kv_pool_allocate(kv_pool* pool, int32_t sequence);

// Another reference to `block` (a fork, or a prefix-cache hit).
void kv_pool_retain(kv_pool* pool, int32_t block, int32_t sequence);

// Drops one reference; at 0 the block is free, at 1 with only the cache
// holding it, it becomes evictable.
void kv_pool_release(kv_pool* pool, int32_t block, int32_t sequence);

// Copy-on-write: `block` is shared, and `sequence` must write into it. Gives
// the sequence a private copy of its n_filled slots and drops its reference
// to the original. Returns the copy, or -1 when no block is available.
int32_t kv_pool_copy_on_write(kv_pool* pool, int32_t block, int32_t sequence);

// Chained hash of a full block: (parent hash, block_size token ids).
uint64_t kv_block_hash(uint64_t parent_hash, const int32_t* token_ids, int n_tokens);

// The cached block holding exactly these tokens after this parent, or -1.
// Does not take a reference (call kv_pool_retain to use it).
int32_t kv_pool_lookup(const kv_pool* pool, uint64_t hash, uint64_t parent_hash, const int32_t* token_ids);

// Enters a full, computed block into the prefix cache (taking the cache's
// reference). Does nothing when an equal block is already cached.
void kv_pool_cache(kv_pool* pool, int32_t block, uint64_t hash, uint64_t parent_hash, const int32_t* token_ids);

// Checks the pool's internal invariants (free stack, LRU list, hash chains,
// counts); fills err with the first broken one. For tests.
int kv_pool_validate(const kv_pool* pool, error_info* err);

// Forgets the logged events (the engine calls this at the start of a step).
void kv_pool_clear_events(kv_pool* pool);

#endif
