#include "engine/kv_blocks.h"

#include <stdlib.h>
#include <string.h>

#include "engine/fault.h"

// ---- events --------------------------------------------------------------------

static void log_event(kv_pool* pool, block_event_kind kind, int32_t block, int32_t sequence, int32_t other) {
    if (pool->n_events == pool->events_capacity) {
        int capacity = pool->events_capacity ? 2 * pool->events_capacity : 256;
        block_event* grown = realloc(pool->events, (size_t)capacity * sizeof *grown);
        if (!grown) return; // an event lost to memory pressure; the state itself stays right
        pool->events = grown;
        pool->events_capacity = capacity;
    }
    pool->events[pool->n_events++] = (block_event){kind, block, sequence, other};
}

void kv_pool_clear_events(kv_pool* pool) {
    pool->n_events = 0;
    pool->copy_bytes = 0;
}

// ---- setup -----------------------------------------------------------------------

int kv_pool_init(kv_pool* pool, const model_config* config, kv_dtype dtype, int n_blocks, int block_size,
                 error_info* err) {
    memset(pool, 0, sizeof *pool);
    if (block_size < 1 || block_size > 256)
        return error_set(err, "--block-size: expected 1..256 tokens, found %d", block_size);
    if (n_blocks < 1) return error_set(err, "kv pool: expected at least one block, found %d", n_blocks);
    if (kv_memory_init(&pool->memory, config, dtype, n_blocks, block_size, err)) return -1;
    pool->n_blocks = n_blocks;
    pool->block_size = block_size;
    pool->n_buckets = 1;
    while (pool->n_buckets < 2 * n_blocks) pool->n_buckets *= 2;
    pool->blocks = calloc((size_t)n_blocks, sizeof *pool->blocks);
    pool->block_tokens = calloc((size_t)n_blocks * (size_t)block_size, sizeof *pool->block_tokens);
    pool->free_stack = malloc((size_t)n_blocks * sizeof *pool->free_stack);
    pool->buckets = malloc((size_t)pool->n_buckets * sizeof *pool->buckets);
    if (!pool->blocks || !pool->block_tokens || !pool->free_stack || !pool->buckets) {
        kv_pool_free(pool);
        return error_set(err, "kv pool: out of memory for %d blocks", n_blocks);
    }
    for (int b = 0; b < pool->n_buckets; b++) pool->buckets[b] = -1;
    // Lowest ids on top of the stack, so a fresh pool hands out 0, 1, 2, ...
    for (int b = 0; b < n_blocks; b++) {
        pool->free_stack[b] = n_blocks - 1 - b;
        pool->blocks[b].lru_previous = pool->blocks[b].lru_next = pool->blocks[b].bucket_next = -1;
    }
    pool->n_free = n_blocks;
    pool->lru_head = pool->lru_tail = -1;
    return 0;
}

void kv_pool_free(kv_pool* pool) {
    kv_memory_free(&pool->memory);
    free(pool->blocks);
    free(pool->block_tokens);
    free(pool->free_stack);
    free(pool->buckets);
    free(pool->events);
    memset(pool, 0, sizeof *pool);
}

int kv_pool_available(const kv_pool* pool) { return pool->n_free + pool->n_evictable; }

// ---- the evictable (LRU) list ----------------------------------------------------

static void lru_append(kv_pool* pool, int32_t block) {
    kv_block* b = &pool->blocks[block];
    b->lru_previous = pool->lru_tail;
    b->lru_next = -1;
    if (pool->lru_tail >= 0) pool->blocks[pool->lru_tail].lru_next = block;
    else pool->lru_head = block;
    pool->lru_tail = block;
    pool->n_evictable++;
}

static void lru_remove(kv_pool* pool, int32_t block) {
    kv_block* b = &pool->blocks[block];
    if (b->lru_previous >= 0) pool->blocks[b->lru_previous].lru_next = b->lru_next;
    else pool->lru_head = b->lru_next;
    if (b->lru_next >= 0) pool->blocks[b->lru_next].lru_previous = b->lru_previous;
    else pool->lru_tail = b->lru_previous;
    b->lru_previous = b->lru_next = -1;
    pool->n_evictable--;
}

// ---- the hash index ---------------------------------------------------------------

uint64_t kv_block_hash(uint64_t parent_hash, const int32_t* token_ids, int n_tokens) {
    // FNV-1a over the parent hash and the token ids, then a splitmix finaliser
    // so that nearby inputs spread over all 64 bits.
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 8; i++) h = (h ^ ((parent_hash >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    for (int t = 0; t < n_tokens; t++)
        for (int i = 0; i < 4; i++) h = (h ^ (((uint32_t)token_ids[t] >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return (h ^ (h >> 31)) | 1; // never 0, which marks "no parent"
}

static int bucket_of(const kv_pool* pool, uint64_t hash) { return (int)(hash & (uint64_t)(pool->n_buckets - 1)); }

int32_t kv_pool_lookup(const kv_pool* pool, uint64_t hash, uint64_t parent_hash, const int32_t* token_ids) {
    for (int32_t b = pool->buckets[bucket_of(pool, hash)]; b >= 0; b = pool->blocks[b].bucket_next) {
        const kv_block* block = &pool->blocks[b];
        if (block->hash == hash && block->parent_hash == parent_hash &&
            memcmp(pool->block_tokens + (size_t)b * (size_t)pool->block_size, token_ids,
                   (size_t)pool->block_size * sizeof *token_ids) == 0)
            return b;
    }
    return -1;
}

static void index_remove(kv_pool* pool, int32_t block) {
    int32_t* link = &pool->buckets[bucket_of(pool, pool->blocks[block].hash)];
    while (*link != block) link = &pool->blocks[*link].bucket_next;
    *link = pool->blocks[block].bucket_next;
    pool->blocks[block].bucket_next = -1;
    pool->blocks[block].cached = false;
    pool->n_cached--;
}

void kv_pool_cache(kv_pool* pool, int32_t block, uint64_t hash, uint64_t parent_hash, const int32_t* token_ids) {
    kv_block* b = &pool->blocks[block];
    // A block nobody holds (ref_count 0: on the free stack) is never entered;
    // only a table that kept an uncounted reference (the prefix-no-refcount
    // fault) could offer one, and caching it would index a free block.
    if (b->cached || b->ref_count <= 0 || kv_pool_lookup(pool, hash, parent_hash, token_ids) >= 0) return;
    b->hash = hash;
    b->parent_hash = parent_hash;
    memcpy(pool->block_tokens + (size_t)block * (size_t)pool->block_size, token_ids,
           (size_t)pool->block_size * sizeof *token_ids);
    int bucket = bucket_of(pool, hash);
    b->bucket_next = pool->buckets[bucket];
    pool->buckets[bucket] = block;
    b->cached = true;
    b->ref_count++; // the cache's own reference
    pool->n_cached++;
    log_event(pool, BLOCK_CACHE, block, -1, -1);
}

// ---- allocate, share, release -------------------------------------------------------

int32_t kv_pool_allocate(kv_pool* pool, int32_t sequence) {
    int32_t block;
    if (pool->n_free > 0) {
        block = pool->free_stack[--pool->n_free];
    } else if (pool->lru_head >= 0) {
        // The least recently used cached prefix goes first; the
        // evict-most-recent fault takes the other end of the list.
        block = fault_on(FAULT_EVICT_MOST_RECENT) ? pool->lru_tail : pool->lru_head;
        lru_remove(pool, block);
        index_remove(pool, block);
        pool->blocks[block].ref_count = 0;
        pool->total_evictions++;
        log_event(pool, BLOCK_EVICT, block, sequence, -1);
    } else {
        return -1;
    }
    kv_block* b = &pool->blocks[block];
    b->ref_count = 1;
    b->n_filled = 0;
    b->hash = b->parent_hash = 0;
    log_event(pool, BLOCK_ALLOCATE, block, sequence, -1);
    return block;
}

void kv_pool_retain(kv_pool* pool, int32_t block, int32_t sequence) {
    kv_block* b = &pool->blocks[block];
    if (b->cached && b->ref_count == 1) lru_remove(pool, block); // evictable no more
    b->ref_count++;
    b->last_used = ++pool->clock;
    log_event(pool, BLOCK_SHARE, block, sequence, -1);
}

void kv_pool_release(kv_pool* pool, int32_t block, int32_t sequence) {
    kv_block* b = &pool->blocks[block];
    // A release of a block nobody holds (possible only after a reference
    // went uncounted: the prefix-no-refcount fault) is refused: pushing it
    // on the free stack again could overflow the stack's n_blocks entries.
    if (b->ref_count <= 0) return;
    b->ref_count--;
    b->last_used = ++pool->clock;
    if (b->ref_count == 0) {
        if (b->cached) { // the cache's own reference was taken by an uncounted owner: unindex it
            lru_remove(pool, block);
            index_remove(pool, block);
        }
        b->n_filled = 0;
        pool->free_stack[pool->n_free++] = block;
        log_event(pool, BLOCK_FREE, block, sequence, -1);
    } else if (b->ref_count == 1 && b->cached) {
        lru_append(pool, block); // only the cache holds it now
    }
}

int32_t kv_pool_copy_on_write(kv_pool* pool, int32_t block, int32_t sequence) {
    int32_t copy = kv_pool_allocate(pool, sequence);
    if (copy < 0) return -1;
    int n_filled = pool->blocks[block].n_filled;
    // The bug (cow-short-copy): the copy stops one slot short of the fill.
    int n_copied = fault_on(FAULT_COW_SHORT_COPY) && n_filled > 0 ? n_filled - 1 : n_filled;
    pool->copy_bytes += kv_memory_copy_block(&pool->memory, block, copy, n_copied);
    pool->blocks[copy].n_filled = n_filled;
    pool->total_copies++;
    log_event(pool, BLOCK_COPY, block, sequence, copy);
    kv_pool_release(pool, block, sequence);
    return copy;
}

// ---- invariants -----------------------------------------------------------------------

int kv_pool_validate(const kv_pool* pool, error_info* err) {
    char* on_free_stack = calloc((size_t)pool->n_blocks, 1);
    if (!on_free_stack) return error_set(err, "validate: out of memory");
    int status = 0;
    for (int i = 0; i < pool->n_free && status == 0; i++) {
        int32_t b = pool->free_stack[i];
        if (b < 0 || b >= pool->n_blocks || on_free_stack[b])
            status = error_set(err, "free stack entry %d: block %d out of range or listed twice", i, b);
        else on_free_stack[b] = 1;
    }
    int n_cached = 0, n_evictable = 0;
    for (int32_t b = 0; b < pool->n_blocks && status == 0; b++) {
        const kv_block* block = &pool->blocks[b];
        if (block->ref_count < 0) status = error_set(err, "block %d: ref_count %d", b, block->ref_count);
        else if ((block->ref_count == 0) != (on_free_stack[b] != 0))
            status = error_set(err, "block %d: ref_count %d but %s the free stack", b, block->ref_count,
                               on_free_stack[b] ? "on" : "not on");
        else if (block->cached && block->ref_count < 1)
            status = error_set(err, "block %d: cached without the cache's reference", b);
        else if (block->n_filled < 0 || block->n_filled > pool->block_size)
            status = error_set(err, "block %d: n_filled %d", b, block->n_filled);
        if (status) break;
        if (block->cached) {
            n_cached++;
            if (kv_pool_lookup(pool, block->hash, block->parent_hash,
                               pool->block_tokens + (size_t)b * (size_t)pool->block_size) != b)
                status = error_set(err, "block %d: cached but not found by its hash", b);
            if (block->ref_count == 1) n_evictable++;
        }
    }
    int walked = 0;
    for (int32_t b = pool->lru_head; b >= 0 && status == 0 && walked <= pool->n_blocks; b = pool->blocks[b].lru_next) {
        walked++;
        if (!pool->blocks[b].cached || pool->blocks[b].ref_count != 1)
            status = error_set(err, "block %d: on the evictable list with ref_count %d, cached %d", b,
                               pool->blocks[b].ref_count, pool->blocks[b].cached);
    }
    if (status == 0 && (walked != pool->n_evictable || n_evictable != pool->n_evictable))
        status = error_set(err, "evictable count %d, list has %d, cached blocks with ref 1: %d", pool->n_evictable,
                           walked, n_evictable);
    if (status == 0 && n_cached != pool->n_cached)
        status = error_set(err, "cached count %d, found %d", pool->n_cached, n_cached);
    free(on_free_stack);
    return status;
}
