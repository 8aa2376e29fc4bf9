// The paged layout: a pool of blocks handed out one at a time, shared by
// prefix and by fork (engine/kv_layout.h).
#include <stdlib.h>
#include <string.h>

#include "engine/block_manager.h"
#include "engine/fault.h"

static int blocks_for(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

// Blocks a sequence takes at admission: those of its tokens so far.
// The bug (paged-allocate-ahead): those of everything it may ever hold,
// prompt + max_tokens, as a reservation would.
static int admission_blocks(const sequence* s, int block_size) {
    int tokens = s->n_tokens;
    if (fault_on(FAULT_PAGED_ALLOCATE_AHEAD) && s->capacity > tokens) tokens = s->capacity;
    return blocks_for(tokens, block_size);
}

static int64_t units_for_length(const block_manager* bm, int length) { return blocks_for(length, bm->block_size); }
static int64_t capacity_units(const block_manager* bm) { return bm->pool->n_blocks; }
static int64_t available_units(const block_manager* bm) { return kv_pool_available(bm->pool); }
static int64_t slots(const block_manager* bm) { return (int64_t)bm->pool->n_blocks * bm->pool->block_size; }
static kv_memory* memory(block_manager* bm) { return &bm->pool->memory; }

// Walks the sequence's full blocks from the start while they are cached.
// Never counts the block holding the last token: at least one token must be
// computed to produce the logits of the next one.
// *evictable_hits counts the hits that only the cache holds now: taking them
// removes them from what the pool can hand out.
static int count_prefix_hits(const block_manager* bm, const sequence* s, uint64_t* last_hash, int* evictable_hits) {
    const int bs = bm->block_size;
    int hits = 0;
    uint64_t parent = 0;
    *evictable_hits = 0;
    if (!bm->prefix_caching) return 0;
    while ((hits + 1) * bs <= s->n_tokens - 1) {
        const int32_t* tokens = s->tokens + (size_t)hits * (size_t)bs;
        uint64_t hash = kv_block_hash(parent, tokens, bs);
        int32_t block = kv_pool_lookup(bm->pool, hash, parent, tokens);
        if (block < 0) break;
        if (bm->pool->blocks[block].ref_count == 1) (*evictable_hits)++;
        parent = hash;
        hits++;
    }
    if (last_hash) *last_hash = parent;
    return hits;
}

// True when block `index` of s (by content) is being computed now by a
// running sequence: same tokens at the same place, not yet cached.
static bool prefix_block_pending(const block_manager* bm, const sequence* s, int index, running_view running) {
    const int bs = bm->block_size;
    const int32_t* tokens = s->tokens;
    for (int r = 0; r < running.n_running; r++) {
        const sequence* other = &running.sequences[running.running[r]];
        if (other->state != SEQ_PREFILL || other->n_tokens < (index + 1) * bs) continue;
        if (other->n_computed >= (index + 1) * bs) continue; // computed: it is (or will be) cached
        if (memcmp(other->tokens, tokens, (size_t)(index + 1) * (size_t)bs * sizeof *tokens) == 0) return true;
    }
    return false;
}

static int admission_cost(const block_manager* bm, const sequence* s, running_view running, int* hit_blocks,
                          bool* pending) {
    int evictable_hits;
    int hits = count_prefix_hits(bm, s, NULL, &evictable_hits);
    *hit_blocks = hits;
    *pending = false;
    if (bm->prefix_caching && (hits + 1) * bm->block_size <= s->n_tokens - 1)
        *pending = prefix_block_pending(bm, s, hits, running);
    return admission_blocks(s, bm->block_size) - hits + evictable_hits;
}

static void release(block_manager* bm, sequence* s) {
    // Release in reverse so the tail goes first: the prefix blocks, which
    // other requests are likelier to share, stay cached the longest.
    for (int i = s->n_table - 1; i >= 0; i--) kv_pool_release(bm->pool, s->block_table[i], s->id);
    s->n_table = 0;
    s->n_hashed_blocks = 0;
    s->last_block_hash = 0;
}

static int admit(block_manager* bm, sequence* s, int* prefix_hit_tokens) {
    *prefix_hit_tokens = 0;
    s->n_table = 0;
    const int bs = bm->block_size;
    uint64_t last_hash = 0;
    int evictable_hits;
    int hits = count_prefix_hits(bm, s, &last_hash, &evictable_hits);
    int needed = admission_blocks(s, bs);
    if (needed - hits + evictable_hits > kv_pool_available(bm->pool) || sequence_reserve_table(s, needed)) return -1;
    // Share the cached prefix blocks (walking the chain again to find them).
    // The bug (prefix-no-refcount): the table lists them without a reference.
    const bool count_references = !fault_on(FAULT_PREFIX_NO_REFCOUNT);
    uint64_t parent = 0;
    for (int i = 0; i < hits; i++) {
        const int32_t* tokens = s->tokens + (size_t)i * (size_t)bs;
        uint64_t hash = kv_block_hash(parent, tokens, bs);
        int32_t block = kv_pool_lookup(bm->pool, hash, parent, tokens);
        if (count_references) kv_pool_retain(bm->pool, block, s->id);
        s->block_table[s->n_table++] = block;
        parent = hash;
    }
    for (int i = hits; i < needed; i++) {
        int32_t block = kv_pool_allocate(bm->pool, s->id);
        if (block < 0) { // cannot happen after the check above; undo rather than run with a hole
            release(bm, s);
            return -1;
        }
        s->block_table[s->n_table++] = block;
    }
    s->n_computed = hits * bs;
    s->n_hashed_blocks = hits;
    s->last_block_hash = last_hash;
    *prefix_hit_tokens = hits * bs;
    return 0;
}

static int prepare_decode(block_manager* bm, sequence* s) {
    const int bs = bm->block_size;
    int position = s->n_computed; // the slot the next token's KV goes to
    int index = position / bs;
    if (index == s->n_table) {
        if (sequence_reserve_table(s, 1)) return -1;
        int32_t block = kv_pool_allocate(bm->pool, s->id);
        if (block < 0) return -1;
        s->block_table[s->n_table++] = block;
        return 0;
    }
    int32_t block = s->block_table[index];
    // Shared: copy before writing (the bug no-cow writes into it as it is).
    if (bm->pool->blocks[block].ref_count > 1 && !fault_on(FAULT_NO_COW)) {
        int32_t copy = kv_pool_copy_on_write(bm->pool, block, s->id);
        if (copy < 0) return -1;
        s->block_table[index] = copy;
    }
    return 0;
}

static void fork_blocks(block_manager* bm, const sequence* parent, sequence* child) {
    for (int i = 0; i < parent->n_table; i++) {
        kv_pool_retain(bm->pool, parent->block_table[i], child->id);
        child->block_table[i] = parent->block_table[i];
    }
    child->n_table = parent->n_table;
    child->n_hashed_blocks = parent->n_hashed_blocks;
    child->last_block_hash = parent->last_block_hash;
}

static void after_compute(block_manager* bm, sequence* s, int from, int to) {
    const int bs = bm->block_size;
    for (int position = from; position < to; position++) {
        kv_block* block = &bm->pool->blocks[s->block_table[position / bs]];
        if (block->n_filled < position % bs + 1) block->n_filled = position % bs + 1;
    }
    if (!bm->prefix_caching) return;
    while ((s->n_hashed_blocks + 1) * bs <= s->n_computed) {
        int index = s->n_hashed_blocks;
        const int32_t* tokens = s->tokens + (size_t)index * (size_t)bs;
        uint64_t hash = kv_block_hash(s->last_block_hash, tokens, bs);
        kv_pool_cache(bm->pool, s->block_table[index], hash, s->last_block_hash, tokens);
        s->last_block_hash = hash;
        s->n_hashed_blocks++;
    }
}

static int32_t tail_waste(const block_manager* bm, const sequence* s) {
    // Slots of its blocks that no token of it fills: past its last token
    // whose keys and values are in the cache (n_computed, the record's
    // `context`) or, while it prefills, due there in a later chunk (its
    // blocks were taken for the whole prompt). The token just sampled is
    // not counted: it has no keys until the next step writes them (at
    // context 33 in blocks of 16, 15 empty slots, and tail_fill 1 + 15 =
    // block_size; counting it gave 14, one less than lesson 02's count).
    // At most block_size - 1: a block is taken only for tokens due.
    int tokens_holding_slots = s->state == SEQ_DECODE ? s->n_computed : s->n_tokens;
    int64_t tail = (int64_t)s->n_table * bm->block_size - tokens_holding_slots;
    return tail > 0 ? (int32_t)tail : 0;
}

static kv_usage measure(block_manager* bm, running_view running) {
    const kv_pool* pool = bm->pool;
    kv_usage u = {0};
    u.slots_total = slots(bm);
    u.blocks_total = pool->n_blocks;
    u.blocks_free = pool->n_free;
    u.blocks_cached = pool->n_evictable;
    // Count each physical block once, however many tables share it.
    bm->mark_epoch++;
    for (int i = 0; i < running.n_running; i++) {
        const sequence* s = &running.sequences[running.running[i]];
        for (int b = 0; b < s->n_table; b++) {
            int32_t block = s->block_table[b];
            if (bm->mark[block] == bm->mark_epoch) continue;
            bm->mark[block] = bm->mark_epoch;
            u.blocks_used++;
            u.slots_used += pool->blocks[block].n_filled;
        }
        u.tail_waste_slots += tail_waste(bm, s);
    }
    u.slots_allocated = (int64_t)u.blocks_used * pool->block_size;
    return u;
}

const kv_layout_ops kv_layout_paged_ops = {
    .unit_name = "blocks",
    .shares_blocks = true,
    .units_for_length = units_for_length,
    .capacity_units = capacity_units,
    .available_units = available_units,
    .slots = slots,
    .memory = memory,
    .admission_cost = admission_cost,
    .admit = admit,
    .prepare_decode = prepare_decode,
    .release = release,
    .fork = fork_blocks,
    .after_compute = after_compute,
    .tail_waste = tail_waste,
    .measure = measure,
};

int block_manager_init_paged(block_manager* bm, kv_pool* pool, bool prefix_caching, error_info* err) {
    *bm = (block_manager){.layout = KV_LAYOUT_PAGED,
                          .ops = &kv_layout_paged_ops,
                          .block_size = pool->block_size,
                          .prefix_caching = prefix_caching,
                          .pool = pool};
    bm->mark = calloc((size_t)pool->n_blocks, sizeof *bm->mark);
    if (!bm->mark) return error_set(err, "block manager: out of memory for %d blocks", pool->n_blocks);
    return 0;
}
