// The paged KV block pool and the contiguous baseline: a random-operation
// property test against a reference model of the pool, copy-on-write of KV
// content, the prefix cache (chained hashes, token checks, LRU eviction),
// KV sizes, first-fit reservations and bad arguments.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdbool.h>
#include <string.h>

#include "engine/kv_blocks.h"
#include "engine/kv_contiguous.h"
#include "engine/kv_memory.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/fp16.h"
#include "tests/test_support.h"

// A hand-built model shape, validated so head_dim and kv_dim are filled in.
static model_config tiny_config(int dim, int n_heads, int n_kv_heads, int n_layers) {
    model_config config;
    memset(&config, 0, sizeof config);
    config.dim = dim;
    config.hidden_dim = 2 * dim;
    config.n_layers = n_layers;
    config.n_heads = n_heads;
    config.n_kv_heads = n_kv_heads;
    config.vocab_size = 32;
    config.max_seq_len = 64;
    error_info err = {{0}};
    assert_int_equal(model_config_validate(&config, "tiny", &err), 0);
    return config;
}

static int count_events(const kv_pool* pool, block_event_kind kind) {
    int n = 0;
    for (int i = 0; i < pool->n_events; i++)
        n += pool->events[i].kind == kind;
    return n;
}

static bool has_event(const kv_pool* pool, block_event_kind kind, int32_t block, int32_t other_block) {
    for (int i = 0; i < pool->n_events; i++)
        if (pool->events[i].kind == kind && pool->events[i].block == block &&
            pool->events[i].other_block == other_block)
            return true;
    return false;
}

// ---- the property test: random operations against a reference model -------------

enum {
    POOL_BLOCKS = 64,
    BLOCK_SIZE = 4,
    MAX_TABLES = 12,
    MAX_SEQ_TOKENS = 48, // 12 blocks per sequence at most
    MAX_SEQ_BLOCKS = MAX_SEQ_TOKENS / BLOCK_SIZE,
    N_TEMPLATES = 4, // prompts share prefixes with these
    N_OPERATIONS = 100000,
    N_EVENT_KINDS = 6,
};

typedef enum operation {
    OP_NEW,      // a fresh sequence with k blocks (no prefix lookup)
    OP_APPEND,   // one more token (new block at a boundary, copy-on-write when shared)
    OP_FORK,     // a second table sharing every block
    OP_FREE,     // release every block of a table
    OP_CACHE,    // enter one full block into the prefix cache
    OP_LOOKUP,   // a prompt that reuses cached prefix blocks
    OP_PRESSURE, // take every free block and then some evictable ones, give them back
    N_OPERATION_KINDS,
} operation;

static const char* const operation_names[N_OPERATION_KINDS] = {"new",   "append", "fork",    "free",
                                                               "cache", "lookup", "pressure"};

typedef struct test_table {
    bool live;
    int32_t sequence; // id given to the pool
    int n_tokens;
    int n_blocks;
    int32_t blocks[MAX_SEQ_BLOCKS]; // (n_blocks) block ids in position order
    int32_t tokens[MAX_SEQ_TOKENS]; // (n_tokens) token ids
} test_table;

// What the pool should hold, maintained independently of kv_blocks.c.
typedef struct pool_model {
    int32_t ref[POOL_BLOCKS];
    bool cached[POOL_BLOCKS];
    uint64_t hash[POOL_BLOCKS]; // valid while cached
    uint64_t parent[POOL_BLOCKS];
    int32_t tokens[POOL_BLOCKS][BLOCK_SIZE];
    int32_t free_stack[POOL_BLOCKS]; // (n_free) top at n_free - 1
    int n_free;
    int32_t lru[POOL_BLOCKS]; // (n_lru) evictable blocks, least recently used first
    int n_lru;
    int events[N_EVENT_KINDS]; // events expected since the last clear
    uint64_t evictions;
    uint64_t copies;
} pool_model;

typedef struct harness {
    kv_pool pool;
    pool_model model;
    test_table tables[MAX_TABLES];
    int32_t templates[N_TEMPLATES][MAX_SEQ_TOKENS];
    uint64_t rng;
    int32_t next_sequence;
    int64_t lookup_hits;
    int64_t new_cache_entries;
    int64_t duplicate_cache_calls;
    int64_t failed_allocations;
} harness;

static uint64_t next_random(harness* h) { // xorshift64
    h->rng ^= h->rng << 13;
    h->rng ^= h->rng >> 7;
    h->rng ^= h->rng << 17;
    return h->rng;
}

static int random_below(harness* h, int n) { return (int)(next_random(h) % (uint64_t)n); }

static int32_t model_lookup(const pool_model* m, uint64_t hash, uint64_t parent, const int32_t* tokens) {
    for (int32_t b = 0; b < POOL_BLOCKS; b++)
        if (m->cached[b] && m->hash[b] == hash && m->parent[b] == parent &&
            memcmp(m->tokens[b], tokens, sizeof m->tokens[b]) == 0)
            return b;
    return -1;
}

static void model_lru_remove(pool_model* m, int32_t block) {
    for (int i = 0; i < m->n_lru; i++) {
        if (m->lru[i] != block) continue;
        memmove(m->lru + i, m->lru + i + 1, (size_t)(m->n_lru - i - 1) * sizeof *m->lru);
        m->n_lru--;
        return;
    }
    fail_msg("model: block %d not on the evictable list", block);
}

static void model_release(pool_model* m, int32_t block) {
    assert_true(m->ref[block] > 0);
    m->ref[block]--;
    if (m->ref[block] == 0) {
        assert_false(m->cached[block]);
        m->free_stack[m->n_free++] = block;
        m->events[BLOCK_FREE]++;
    } else if (m->ref[block] == 1 && m->cached[block]) {
        m->lru[m->n_lru++] = block;
    }
}

// The pool's allocation rule: top of the free stack, else the least recently
// used evictable block. Returns the block the pool must hand out, or -1.
static int32_t model_allocate(pool_model* m, bool* evicted) {
    int32_t block;
    *evicted = false;
    if (m->n_free > 0) {
        block = m->free_stack[--m->n_free];
    } else if (m->n_lru > 0) {
        block = m->lru[0];
        model_lru_remove(m, block);
        assert_int_equal(m->ref[block], 1);
        m->cached[block] = false;
        m->evictions++;
        m->events[BLOCK_EVICT]++;
        *evicted = true;
    } else {
        return -1;
    }
    m->ref[block] = 1;
    m->events[BLOCK_ALLOCATE]++;
    return block;
}

// After the pool evicted `block`: its old content is no longer found.
static void check_evicted(harness* h, int32_t block) {
    const pool_model* m = &h->model;
    assert_false(h->pool.blocks[block].cached);
    assert_int_equal(kv_pool_lookup(&h->pool, m->hash[block], m->parent[block], m->tokens[block]), -1);
}

static int32_t h_allocate(harness* h, int32_t sequence) {
    bool evicted;
    int32_t expected = model_allocate(&h->model, &evicted);
    int32_t block = kv_pool_allocate(&h->pool, sequence);
    assert_int_equal(block, expected);
    if (block < 0) return -1;
    assert_int_equal(h->pool.blocks[block].ref_count, 1);
    assert_int_equal(h->pool.blocks[block].n_filled, 0);
    if (evicted) check_evicted(h, block);
    return block;
}

static void h_retain(harness* h, int32_t block, int32_t sequence) {
    pool_model* m = &h->model;
    assert_true(m->ref[block] > 0);
    if (m->cached[block] && m->ref[block] == 1) model_lru_remove(m, block);
    m->ref[block]++;
    m->events[BLOCK_SHARE]++;
    kv_pool_retain(&h->pool, block, sequence);
}

static void h_release(harness* h, int32_t block, int32_t sequence) {
    model_release(&h->model, block);
    kv_pool_release(&h->pool, block, sequence);
}

static void h_cache(harness* h, int32_t block, uint64_t hash, uint64_t parent, const int32_t* tokens) {
    pool_model* m = &h->model;
    if (!m->cached[block] && model_lookup(m, hash, parent, tokens) < 0) {
        m->cached[block] = true;
        m->hash[block] = hash;
        m->parent[block] = parent;
        memcpy(m->tokens[block], tokens, sizeof m->tokens[block]);
        m->ref[block]++;
        m->events[BLOCK_CACHE]++;
        h->new_cache_entries++;
    } else {
        h->duplicate_cache_calls++;
    }
    kv_pool_cache(&h->pool, block, hash, parent, tokens);
}

// Reference KV content of a token: exact in fp16 (integers and halves below 1024).
static void token_row(int32_t token, int position, float* key, float* value) {
    for (int j = 0; j < 4; j++) {
        key[j] = (float)(token * 64 + position + j);
        value[j] = -key[j] - 0.5f;
    }
}

static void write_token(harness* h, const test_table* t, int position) {
    int32_t block = t->blocks[position / BLOCK_SIZE];
    int64_t slot = (int64_t)block * BLOCK_SIZE + position % BLOCK_SIZE;
    float key[4], value[4];
    token_row(t->tokens[position], position, key, value);
    kv_write_row(kv_memory_layer_keys(&h->pool.memory, 0), kv_memory_layer_values(&h->pool.memory, 0), NULL, NULL,
                 KV_F16, slot, key, value, 1, h->pool.memory.kv_dim, NULL);
    kv_block* b = &h->pool.blocks[block];
    if (b->n_filled < position % BLOCK_SIZE + 1) b->n_filled = position % BLOCK_SIZE + 1;
}

static int32_t h_copy_on_write(harness* h, int32_t block, int32_t sequence) {
    pool_model* m = &h->model;
    int n_filled = h->pool.blocks[block].n_filled;
    bool evicted;
    int32_t expected = model_allocate(m, &evicted);
    int32_t copy = kv_pool_copy_on_write(&h->pool, block, sequence);
    assert_int_equal(copy, expected);
    if (copy < 0) return -1;
    if (evicted) check_evicted(h, copy);
    m->copies++;
    m->events[BLOCK_COPY]++;
    model_release(m, block);
    assert_int_equal(h->pool.blocks[copy].n_filled, n_filled);
    const size_t slot_bytes = (size_t)h->pool.memory.kv_dim * 2;
    const char* keys = kv_memory_layer_keys(&h->pool.memory, 0);
    const char* values = kv_memory_layer_values(&h->pool.memory, 0);
    assert_memory_equal(keys + (size_t)copy * BLOCK_SIZE * slot_bytes, keys + (size_t)block * BLOCK_SIZE * slot_bytes,
                        (size_t)n_filled * slot_bytes);
    assert_memory_equal(values + (size_t)copy * BLOCK_SIZE * slot_bytes,
                        values + (size_t)block * BLOCK_SIZE * slot_bytes, (size_t)n_filled * slot_bytes);
    return copy;
}

// Hashes of the first n_full blocks of a token list, each chained on its parent.
static void chain_hashes(const int32_t* tokens, int n_full, uint64_t* hashes) {
    uint64_t parent = 0;
    for (int i = 0; i < n_full; i++) {
        hashes[i] = kv_block_hash(parent, tokens + (size_t)i * BLOCK_SIZE, BLOCK_SIZE);
        parent = hashes[i];
    }
}

static int free_table_slot(const harness* h) {
    for (int i = 0; i < MAX_TABLES; i++)
        if (!h->tables[i].live) return i;
    return -1;
}

static test_table* random_live_table(harness* h) {
    int live[MAX_TABLES], n = 0;
    for (int i = 0; i < MAX_TABLES; i++)
        if (h->tables[i].live) live[n++] = i;
    return n ? &h->tables[live[random_below(h, n)]] : NULL;
}

// A prompt of n tokens: a template's prefix, then (sometimes) a divergent tail.
static void make_prompt(harness* h, int32_t* tokens, int n) {
    const int32_t* base = h->templates[random_below(h, N_TEMPLATES)];
    int diverge_at = random_below(h, 3) == 0 ? n : random_below(h, n + 1);
    for (int i = 0; i < n; i++)
        tokens[i] = i < diverge_at ? base[i] : (int32_t)random_below(h, 8);
}

static bool op_new(harness* h) {
    int slot = free_table_slot(h);
    if (slot < 0) return false;
    int k = 1 + random_below(h, 4);
    if (kv_pool_available(&h->pool) < k) return false;
    test_table* t = &h->tables[slot];
    t->sequence = h->next_sequence++;
    t->n_tokens = (k - 1) * BLOCK_SIZE + 1 + random_below(h, BLOCK_SIZE);
    make_prompt(h, t->tokens, t->n_tokens);
    for (int i = 0; i < k; i++) {
        t->blocks[i] = h_allocate(h, t->sequence);
        assert_true(t->blocks[i] >= 0); // kv_pool_available promised k blocks
    }
    t->n_blocks = k;
    t->live = true;
    for (int p = 0; p < t->n_tokens; p++)
        write_token(h, t, p);
    return true;
}

static bool op_append(harness* h, int64_t* copies) {
    test_table* t = random_live_table(h);
    if (!t || t->n_tokens == MAX_SEQ_TOKENS) return false;
    int position = t->n_tokens;
    if (position % BLOCK_SIZE == 0) {
        int32_t block = h_allocate(h, t->sequence);
        if (block < 0) {
            h->failed_allocations++;
            return false;
        }
        t->blocks[t->n_blocks++] = block;
    } else {
        int32_t tail = t->blocks[t->n_blocks - 1];
        assert_false(h->pool.blocks[tail].cached); // only full blocks are cached
        if (h->pool.blocks[tail].ref_count > 1) {
            int32_t copy = h_copy_on_write(h, tail, t->sequence);
            if (copy < 0) {
                h->failed_allocations++;
                return false;
            }
            (*copies)++;
            t->blocks[t->n_blocks - 1] = copy;
        }
    }
    t->tokens[position] = (int32_t)random_below(h, 8);
    t->n_tokens++;
    write_token(h, t, position);
    return true;
}

static bool op_fork(harness* h) {
    int slot = free_table_slot(h);
    test_table* parent = random_live_table(h);
    if (slot < 0 || !parent) return false;
    test_table* child = &h->tables[slot];
    *child = *parent;
    child->sequence = h->next_sequence++;
    for (int i = 0; i < child->n_blocks; i++)
        h_retain(h, child->blocks[i], child->sequence);
    return true;
}

static bool op_free(harness* h) {
    test_table* t = random_live_table(h);
    if (!t) return false;
    if (random_below(h, 2)) // tail first (as the engine does) or head first: different LRU orders
        for (int i = t->n_blocks - 1; i >= 0; i--)
            h_release(h, t->blocks[i], t->sequence);
    else
        for (int i = 0; i < t->n_blocks; i++)
            h_release(h, t->blocks[i], t->sequence);
    t->live = false;
    return true;
}

static bool op_cache(harness* h) {
    test_table* t = random_live_table(h);
    if (!t || t->n_tokens < BLOCK_SIZE) return false;
    int n_full = t->n_tokens / BLOCK_SIZE;
    int index = random_below(h, n_full);
    uint64_t hashes[MAX_SEQ_BLOCKS];
    chain_hashes(t->tokens, index + 1, hashes);
    assert_int_equal(h->pool.blocks[t->blocks[index]].n_filled, BLOCK_SIZE);
    h_cache(h, t->blocks[index], hashes[index], index ? hashes[index - 1] : 0, t->tokens + (size_t)index * BLOCK_SIZE);
    return true;
}

static bool op_lookup(harness* h) {
    int slot = free_table_slot(h);
    if (slot < 0) return false;
    test_table* t = &h->tables[slot];
    t->sequence = h->next_sequence++;
    t->n_tokens = 1 + random_below(h, 32);
    make_prompt(h, t->tokens, t->n_tokens);
    int n_full = t->n_tokens / BLOCK_SIZE;
    uint64_t hashes[MAX_SEQ_BLOCKS];
    chain_hashes(t->tokens, n_full, hashes);
    int hits = 0;
    while (hits < n_full) {
        uint64_t parent = hits ? hashes[hits - 1] : 0;
        const int32_t* tokens = t->tokens + (size_t)hits * BLOCK_SIZE;
        int32_t block = kv_pool_lookup(&h->pool, hashes[hits], parent, tokens);
        assert_int_equal(block, model_lookup(&h->model, hashes[hits], parent, tokens));
        if (block < 0) break;
        assert_int_equal(h->pool.blocks[block].n_filled, BLOCK_SIZE);
        h_retain(h, block, t->sequence);
        t->blocks[hits++] = block;
    }
    h->lookup_hits += hits;
    int needed = (t->n_tokens + BLOCK_SIZE - 1) / BLOCK_SIZE;
    if (needed - hits > kv_pool_available(&h->pool)) { // cannot admit: give the hits back
        for (int i = hits - 1; i >= 0; i--)
            h_release(h, t->blocks[i], t->sequence);
        return true;
    }
    for (int i = hits; i < needed; i++) {
        t->blocks[i] = h_allocate(h, t->sequence);
        assert_true(t->blocks[i] >= 0);
    }
    t->n_blocks = needed;
    t->live = true;
    for (int p = hits * BLOCK_SIZE; p < t->n_tokens; p++)
        write_token(h, t, p);
    return true;
}

static bool op_pressure(harness* h) {
    int n_evictable = h->pool.n_evictable;
    int wanted = h->pool.n_free + (n_evictable ? 1 + random_below(h, n_evictable) : 0);
    int32_t taken[POOL_BLOCKS];
    int32_t sequence = h->next_sequence++;
    for (int i = 0; i < wanted; i++) {
        taken[i] = h_allocate(h, sequence);
        assert_true(taken[i] >= 0);
    }
    if (n_evictable == 0 && h->model.n_lru == 0) assert_int_equal(h_allocate(h, sequence), -1);
    for (int i = 0; i < wanted; i++)
        h_release(h, taken[i], sequence);
    return true;
}

// Every invariant, compared against the tables and the model.
static void check_pool(const harness* h) {
    const kv_pool* pool = &h->pool;
    const pool_model* m = &h->model;
    error_info err = {{0}};
    if (kv_pool_validate(pool, &err)) fail_msg("kv_pool_validate: %s", err.message);

    int table_refs[POOL_BLOCKS] = {0};
    for (int i = 0; i < MAX_TABLES; i++) {
        const test_table* t = &h->tables[i];
        if (!t->live) continue;
        assert_int_equal(t->n_blocks, (t->n_tokens + BLOCK_SIZE - 1) / BLOCK_SIZE);
        for (int k = 0; k < t->n_blocks; k++)
            table_refs[t->blocks[k]]++;
    }
    bool on_free_stack[POOL_BLOCKS] = {false};
    assert_int_equal(pool->n_free, m->n_free);
    for (int i = 0; i < pool->n_free; i++) {
        assert_int_equal(pool->free_stack[i], m->free_stack[i]);
        on_free_stack[pool->free_stack[i]] = true;
    }
    int n_referenced = 0, n_evictable = 0, n_cached = 0;
    for (int32_t b = 0; b < POOL_BLOCKS; b++) {
        const kv_block* block = &pool->blocks[b];
        assert_int_equal(block->cached, m->cached[b]);
        assert_int_equal(block->ref_count, table_refs[b] + (block->cached ? 1 : 0));
        assert_int_equal(block->ref_count, m->ref[b]);
        if (block->ref_count == 0)
            assert_true(on_free_stack[b]);
        else
            assert_false(on_free_stack[b]); // free and referenced, never both
        n_referenced += block->ref_count > 0;
        n_cached += block->cached;
        n_evictable += block->cached && block->ref_count == 1;
    }
    assert_int_equal(pool->n_free + n_referenced, POOL_BLOCKS);
    assert_int_equal(pool->n_evictable, n_evictable);
    assert_int_equal(pool->n_cached, n_cached);
    assert_int_equal(kv_pool_available(pool), pool->n_free + n_evictable);

    int i = 0; // the evictable list, in LRU order
    for (int32_t b = pool->lru_head; b >= 0; b = pool->blocks[b].lru_next, i++) {
        assert_true(i < m->n_lru);
        assert_int_equal(b, m->lru[i]);
    }
    assert_int_equal(i, m->n_lru);

    for (int kind = 0; kind < N_EVENT_KINDS; kind++)
        assert_int_equal(count_events(pool, (block_event_kind)kind), m->events[kind]);
    assert_int_equal(pool->total_evictions, m->evictions);
    assert_int_equal(pool->total_copies, m->copies);

    // Each table reads back the KV rows it wrote, through its own block table.
    const uint16_t* keys = kv_memory_layer_keys(&pool->memory, 0);
    const uint16_t* values = kv_memory_layer_values(&pool->memory, 0);
    for (int t_index = 0; t_index < MAX_TABLES; t_index++) {
        const test_table* t = &h->tables[t_index];
        if (!t->live) continue;
        for (int k = 0; k < t->n_blocks; k++) {
            int expected = t->n_tokens - k * BLOCK_SIZE < BLOCK_SIZE ? t->n_tokens - k * BLOCK_SIZE : BLOCK_SIZE;
            assert_int_equal(pool->blocks[t->blocks[k]].n_filled, expected);
        }
        for (int p = 0; p < t->n_tokens; p++) {
            int64_t slot = kv_slot_of_position(t->blocks, BLOCK_SIZE, p);
            float key[4], value[4];
            token_row(t->tokens[p], p, key, value);
            for (int j = 0; j < 4; j++) {
                if (fp16_to_fp32(keys[slot * 4 + j]) != key[j] || fp16_to_fp32(values[slot * 4 + j]) != value[j])
                    fail_msg("sequence %d position %d (block %d): KV row overwritten", t->sequence, p,
                             t->blocks[p / BLOCK_SIZE]);
            }
        }
    }
}

static void begin_operation(harness* h) {
    kv_pool_clear_events(&h->pool);
    memset(h->model.events, 0, sizeof h->model.events);
}

static void test_random_operations_keep_invariants(void** state) {
    (void)state;
    harness* h = calloc(1, sizeof *h);
    assert_non_null(h);
    model_config config = tiny_config(8, 2, 1, 1);
    assert_int_equal(config.kv_dim, 4);
    error_info err = {{0}};
    assert_int_equal(kv_pool_init(&h->pool, &config, KV_F16, POOL_BLOCKS, BLOCK_SIZE, &err), 0);
    h->model.n_free = POOL_BLOCKS;
    for (int b = 0; b < POOL_BLOCKS; b++)
        h->model.free_stack[b] = POOL_BLOCKS - 1 - b;
    h->rng = 0x9e3779b97f4a7c15ull;
    h->next_sequence = 1;
    for (int t = 0; t < N_TEMPLATES; t++)
        for (int i = 0; i < MAX_SEQ_TOKENS; i++)
            h->templates[t][i] = (int32_t)random_below(h, 8);
    check_pool(h);

    int64_t counts[N_OPERATION_KINDS] = {0};
    int64_t copies_in_appends = 0;
    // Weights out of 100; free is frequent enough to keep tables turning over,
    // and the 12 tables x up to 12 blocks exceed the 64-block pool, so the free
    // stack runs dry and allocation evicts.
    static const int weights[N_OPERATION_KINDS] = {12, 30, 8, 14, 14, 14, 8};
    for (int n = 0; n < N_OPERATIONS; n++) {
        int draw = random_below(h, 100), kind = 0;
        while (draw >= weights[kind])
            draw -= weights[kind++];
        begin_operation(h);
        bool ran = false;
        switch ((operation)kind) {
        case OP_NEW: ran = op_new(h); break;
        case OP_APPEND: ran = op_append(h, &copies_in_appends); break;
        case OP_FORK: ran = op_fork(h); break;
        case OP_FREE: ran = op_free(h); break;
        case OP_CACHE: ran = op_cache(h); break;
        case OP_LOOKUP: ran = op_lookup(h); break;
        case OP_PRESSURE: ran = op_pressure(h); break;
        case N_OPERATION_KINDS: break;
        }
        counts[kind] += ran;
        check_pool(h);
    }

    for (int kind = 0; kind < N_OPERATION_KINDS; kind++) {
        print_message("%-8s %7lld\n", operation_names[kind], (long long)counts[kind]);
        assert_true(counts[kind] >= 1000);
    }
    print_message("copies %llu, evictions %llu, lookup hits %lld, new cache entries %lld, duplicates %lld, "
                  "failed allocations %lld\n",
                  (unsigned long long)h->pool.total_copies, (unsigned long long)h->pool.total_evictions,
                  (long long)h->lookup_hits, (long long)h->new_cache_entries, (long long)h->duplicate_cache_calls,
                  (long long)h->failed_allocations);
    assert_true(h->pool.total_copies >= 100);
    assert_int_equal(h->pool.total_copies, (uint64_t)copies_in_appends);
    assert_true(h->pool.total_evictions >= 100);
    assert_true(h->lookup_hits >= 1000);
    assert_true(h->duplicate_cache_calls >= 100);
    assert_true(h->failed_allocations >= 1);

    // Free everything: each block is free or held by the cache alone.
    begin_operation(h);
    for (int i = 0; i < MAX_TABLES; i++)
        if (h->tables[i].live) {
            for (int k = h->tables[i].n_blocks - 1; k >= 0; k--)
                h_release(h, h->tables[i].blocks[k], h->tables[i].sequence);
            h->tables[i].live = false;
        }
    check_pool(h);
    for (int32_t b = 0; b < POOL_BLOCKS; b++) {
        const kv_block* block = &h->pool.blocks[b];
        assert_true(block->ref_count == 0 || (block->cached && block->ref_count == 1));
    }
    assert_int_equal(h->pool.n_free + h->pool.n_evictable, POOL_BLOCKS);
    assert_int_equal(kv_pool_available(&h->pool), POOL_BLOCKS);

    // Take every block (evicting the whole cache), then give them all back.
    begin_operation(h);
    int32_t all[POOL_BLOCKS];
    for (int i = 0; i < POOL_BLOCKS; i++)
        all[i] = h_allocate(h, 0);
    assert_int_equal(kv_pool_allocate(&h->pool, 0), -1);
    assert_int_equal(h->pool.n_cached, 0);
    assert_int_equal(h->pool.n_evictable, 0);
    for (int i = 0; i < POOL_BLOCKS; i++)
        h_release(h, all[i], 0);
    check_pool(h);
    assert_int_equal(h->pool.n_free, POOL_BLOCKS);

    kv_pool_free(&h->pool);
    free(h);
}

// ---- copy-on-write ------------------------------------------------------------------

static void test_copy_on_write_copies_kv(void** state) {
    (void)state;
    model_config config = tiny_config(8, 2, 1, 2); // two layers: both must be copied
    kv_pool pool;
    error_info err = {{0}};
    assert_int_equal(kv_pool_init(&pool, &config, KV_F16, 4, 4, &err), 0);
    const int kv_dim = config.kv_dim;
    const size_t slot_bytes = (size_t)kv_dim * 2, block_bytes = 4 * slot_bytes;

    int32_t block = kv_pool_allocate(&pool, 1);
    assert_int_equal(block, 0);
    for (int layer = 0; layer < 2; layer++)
        for (int slot = 0; slot < 3; slot++) {
            float key[4], value[4];
            for (int j = 0; j < 4; j++) {
                key[j] = 100.0f * (float)layer + 10.0f * (float)slot + (float)j + 0.25f;
                value[j] = -key[j];
            }
            kv_write_row(kv_memory_layer_keys(&pool.memory, layer), kv_memory_layer_values(&pool.memory, layer), NULL,
                         NULL, KV_F16, (int64_t)block * 4 + slot, key, value, 1, kv_dim, NULL);
        }
    pool.blocks[block].n_filled = 3;
    kv_pool_retain(&pool, block, 2); // a fork
    assert_int_equal(pool.blocks[block].ref_count, 2);
    kv_pool_clear_events(&pool);

    int32_t copy = kv_pool_copy_on_write(&pool, block, 2);
    assert_int_equal(copy, 1);
    assert_int_equal(pool.blocks[block].ref_count, 1);
    assert_int_equal(pool.blocks[copy].ref_count, 1);
    assert_int_equal(pool.blocks[copy].n_filled, 3);
    assert_int_equal(pool.total_copies, 1);
    assert_int_equal(pool.copy_bytes, 2ull * 2 * 3 * (uint64_t)slot_bytes); // keys+values, 2 layers, 3 slots
    assert_true(has_event(&pool, BLOCK_COPY, block, copy));
    assert_true(has_event(&pool, BLOCK_ALLOCATE, copy, -1));
    assert_int_equal(count_events(&pool, BLOCK_FREE), 0); // the original is still held

    static const unsigned char zeros[64] = {0};
    for (int layer = 0; layer < 2; layer++) {
        const char* keys = kv_memory_layer_keys(&pool.memory, layer);
        const char* values = kv_memory_layer_values(&pool.memory, layer);
        const uint16_t* key_halves = (const uint16_t*)(keys + (size_t)copy * block_bytes);
        assert_true(fp16_to_fp32(key_halves[2 * kv_dim + 3]) == 100.0f * (float)layer + 23.25f);
        assert_memory_equal(keys + (size_t)copy * block_bytes, keys + (size_t)block * block_bytes, 3 * slot_bytes);
        assert_memory_equal(values + (size_t)copy * block_bytes, values + (size_t)block * block_bytes, 3 * slot_bytes);
        // Only the filled slots move: slot 3 of the copy is untouched.
        assert_memory_equal(keys + (size_t)copy * block_bytes + 3 * slot_bytes, zeros, slot_bytes);
    }

    // A second copy while nothing is available fails and keeps the sharing.
    kv_pool_retain(&pool, copy, 3);
    assert_int_equal(kv_pool_allocate(&pool, 4), 2);
    assert_int_equal(kv_pool_allocate(&pool, 4), 3);
    assert_int_equal(kv_pool_copy_on_write(&pool, copy, 3), -1);
    assert_int_equal(pool.blocks[copy].ref_count, 2);
    assert_int_equal(pool.total_copies, 1);
    assert_int_equal(kv_pool_validate(&pool, &err), 0);
    kv_pool_free(&pool);
}

// ---- the prefix cache -----------------------------------------------------------------

static void test_chained_hashes_depend_on_the_parent(void** state) {
    (void)state;
    const int32_t a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, a_swapped[4] = {2, 1, 3, 4};
    uint64_t root_a = kv_block_hash(0, a, 4), root_b = kv_block_hash(0, b, 4);
    assert_true(root_a == kv_block_hash(0, a, 4)); // deterministic
    assert_true(root_a != 0 && root_b != 0);
    assert_true(root_a != root_b);
    assert_true(root_a != kv_block_hash(0, a_swapped, 4)); // order matters
    // Same tokens after a different parent: a different prefix, a different hash.
    assert_true(kv_block_hash(root_a, a, 4) != kv_block_hash(root_b, a, 4));
    assert_true(kv_block_hash(root_a, a, 4) != root_a);
    assert_true(kv_block_hash(0, a, 3) != root_a);
}

static void test_lookup_checks_tokens_and_parent(void** state) {
    (void)state;
    model_config config = tiny_config(8, 2, 1, 1);
    kv_pool pool;
    error_info err = {{0}};
    assert_int_equal(kv_pool_init(&pool, &config, KV_F16, 8, 4, &err), 0);
    const int32_t tokens_a[4] = {10, 11, 12, 13}, tokens_b[4] = {20, 21, 22, 23};
    uint64_t hash_a = kv_block_hash(0, tokens_a, 4);
    uint64_t hash_child = kv_block_hash(hash_a, tokens_b, 4);

    int32_t a = kv_pool_allocate(&pool, 1), child = kv_pool_allocate(&pool, 1);
    assert_int_equal(kv_pool_lookup(&pool, hash_a, 0, tokens_a), -1); // nothing cached yet
    kv_pool_clear_events(&pool);
    kv_pool_cache(&pool, a, hash_a, 0, tokens_a);
    kv_pool_cache(&pool, child, hash_child, hash_a, tokens_b);
    assert_int_equal(pool.n_cached, 2);
    assert_int_equal(pool.blocks[a].ref_count, 2); // the table's and the cache's
    assert_true(pool.blocks[a].cached);
    assert_true(has_event(&pool, BLOCK_CACHE, a, -1));
    assert_true(has_event(&pool, BLOCK_CACHE, child, -1));

    assert_int_equal(kv_pool_lookup(&pool, hash_a, 0, tokens_a), a);
    assert_int_equal(kv_pool_lookup(&pool, hash_child, hash_a, tokens_b), child);
    // A forced hash collision: a's hash with other tokens is not a.
    assert_int_equal(kv_pool_lookup(&pool, hash_a, 0, tokens_b), -1);
    // The same tokens and hash after another parent is not the same prefix.
    assert_int_equal(kv_pool_lookup(&pool, hash_child, 0, tokens_b), -1);
    assert_int_equal(kv_pool_lookup(&pool, hash_a, hash_child, tokens_a), -1);

    // Equal content computed again by another sequence: no second entry.
    int32_t duplicate = kv_pool_allocate(&pool, 2);
    kv_pool_clear_events(&pool);
    kv_pool_cache(&pool, duplicate, hash_a, 0, tokens_a);
    assert_int_equal(pool.n_cached, 2);
    assert_false(pool.blocks[duplicate].cached);
    assert_int_equal(pool.blocks[duplicate].ref_count, 1);
    assert_int_equal(count_events(&pool, BLOCK_CACHE), 0);
    assert_int_equal(kv_pool_lookup(&pool, hash_a, 0, tokens_a), a);
    // Caching a block twice does not take a second reference.
    kv_pool_cache(&pool, a, hash_a, 0, tokens_a);
    assert_int_equal(pool.blocks[a].ref_count, 2);
    assert_int_equal(pool.n_cached, 2);

    // Only the cache holds `a` now: evictable, still found, and a hit revives it.
    kv_pool_release(&pool, a, 1);
    assert_int_equal(pool.n_evictable, 1);
    assert_int_equal(kv_pool_lookup(&pool, hash_a, 0, tokens_a), a);
    kv_pool_retain(&pool, a, 3);
    assert_int_equal(pool.n_evictable, 0);
    assert_int_equal(pool.blocks[a].ref_count, 2);
    assert_int_equal(kv_pool_validate(&pool, &err), 0);
    kv_pool_free(&pool);
}

static void test_eviction_is_least_recently_used(void** state) {
    (void)state;
    model_config config = tiny_config(8, 2, 1, 1);
    kv_pool pool;
    error_info err = {{0}};
    assert_int_equal(kv_pool_init(&pool, &config, KV_F16, 6, 4, &err), 0);
    int32_t tokens[4][4];
    uint64_t hashes[4], parents[4];
    uint64_t parent = 0;
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 4; j++)
            tokens[i][j] = 4 * i + j;
        assert_int_equal(kv_pool_allocate(&pool, 1), i); // a fresh pool hands out 0, 1, 2, ...
        pool.blocks[i].n_filled = 4;
        parents[i] = parent;
        hashes[i] = kv_block_hash(parent, tokens[i], 4);
        kv_pool_cache(&pool, i, hashes[i], parents[i], tokens[i]);
        parent = hashes[i];
    }
    // Released in the order 2, 0, 3, 1; then 0 is hit and released again,
    // so it becomes the most recently used: eviction order 2, 3, 1, 0.
    static const int32_t release_order[4] = {2, 0, 3, 1};
    for (int i = 0; i < 4; i++)
        kv_pool_release(&pool, release_order[i], 1);
    assert_int_equal(pool.n_evictable, 4);
    assert_int_equal(pool.n_free, 2);
    assert_int_equal(kv_pool_available(&pool), 6);
    assert_int_equal(kv_pool_lookup(&pool, hashes[0], 0, tokens[0]), 0);
    kv_pool_retain(&pool, 0, 2);
    assert_int_equal(pool.n_evictable, 3);
    kv_pool_release(&pool, 0, 2);
    assert_int_equal(pool.n_evictable, 4);

    kv_pool_clear_events(&pool);
    assert_int_equal(kv_pool_allocate(&pool, 3), 4); // free blocks go before any eviction
    assert_int_equal(kv_pool_allocate(&pool, 3), 5);
    assert_int_equal(pool.total_evictions, 0);
    assert_int_equal(pool.n_cached, 4);
    static const int32_t eviction_order[4] = {2, 3, 1, 0};
    for (int i = 0; i < 4; i++) {
        int32_t victim = eviction_order[i];
        assert_int_equal(kv_pool_allocate(&pool, 3), victim);
        assert_int_equal(pool.total_evictions, (uint64_t)(i + 1));
        assert_int_equal(pool.n_cached, 3 - i);
        assert_int_equal(pool.n_evictable, 3 - i);
        assert_false(pool.blocks[victim].cached);
        assert_int_equal(pool.blocks[victim].ref_count, 1);
        assert_int_equal(pool.blocks[victim].n_filled, 0);
        assert_int_equal(kv_pool_lookup(&pool, hashes[victim], parents[victim], tokens[victim]), -1);
        assert_true(has_event(&pool, BLOCK_EVICT, victim, -1));
        assert_int_equal(kv_pool_validate(&pool, &err), 0);
    }
    assert_int_equal(count_events(&pool, BLOCK_EVICT), 4);
    assert_int_equal(count_events(&pool, BLOCK_ALLOCATE), 6);
    assert_int_equal(kv_pool_allocate(&pool, 3), -1);
    kv_pool_free(&pool);
}

// ---- exhaustion and availability --------------------------------------------------------

static void test_allocate_fails_when_every_block_is_held(void** state) {
    (void)state;
    model_config config = tiny_config(8, 2, 1, 1);
    kv_pool pool;
    error_info err = {{0}};
    assert_int_equal(kv_pool_init(&pool, &config, KV_F16, 4, 4, &err), 0);
    assert_int_equal(kv_pool_available(&pool), 4);
    int32_t blocks[4];
    for (int i = 0; i < 4; i++) {
        blocks[i] = kv_pool_allocate(&pool, 1);
        assert_int_equal(blocks[i], i);
        assert_int_equal(kv_pool_available(&pool), 3 - i);
    }
    assert_int_equal(kv_pool_allocate(&pool, 2), -1);
    assert_int_equal(kv_pool_allocate(&pool, 2), -1); // and it stays that way
    assert_int_equal(pool.n_free, 0);

    const int32_t tokens[4] = {1, 2, 3, 4};
    kv_pool_cache(&pool, blocks[1], kv_block_hash(0, tokens, 4), 0, tokens);
    assert_int_equal(kv_pool_available(&pool), 0); // cached but still used by the table
    kv_pool_release(&pool, blocks[1], 1);
    assert_int_equal(pool.n_free, 0);
    assert_int_equal(pool.n_evictable, 1);
    assert_int_equal(kv_pool_available(&pool), 1);
    kv_pool_release(&pool, blocks[3], 1);
    assert_int_equal(pool.n_free, 1);
    assert_int_equal(kv_pool_available(&pool), 2);
    assert_int_equal(kv_pool_allocate(&pool, 2), 3); // the free block first
    assert_int_equal(kv_pool_allocate(&pool, 2), 1); // then the evictable one
    assert_int_equal(kv_pool_allocate(&pool, 2), -1);
    assert_int_equal(kv_pool_available(&pool), 0);
    assert_int_equal(kv_pool_validate(&pool, &err), 0);
    kv_pool_free(&pool);
}

// ---- sizes ----------------------------------------------------------------------------------

static void test_kv_bytes(void** state) {
    (void)state;
    error_info err = {{0}};
    // dim 8, 2 heads, 1 KV head, 1 layer: head_dim 4. 2 x 64 x 4 x 1 x 1 x 4 x 2 = 4096.
    model_config small = tiny_config(8, 2, 1, 1);
    kv_pool pool;
    assert_int_equal(kv_pool_init(&pool, &small, KV_F16, 64, 4, &err), 0);
    assert_int_equal(kv_memory_bytes(&pool.memory), 4096);
    assert_int_equal(kv_memory_block_bytes(&small, KV_F16, 4), 64);
    kv_pool_free(&pool);

    // dim 64, 8 heads, 2 KV heads, 3 layers: head_dim 8. 2 x 10 x 16 x 3 x 2 x 8 x 4 = 61440.
    model_config grouped = tiny_config(64, 8, 2, 3);
    assert_int_equal(grouped.head_dim, 8);
    kv_memory kv;
    assert_int_equal(kv_memory_init(&kv, &grouped, KV_F32, 10, 16, &err), 0);
    assert_int_equal(kv_memory_bytes(&kv), 61440);
    assert_int_equal(kv_memory_block_bytes(&grouped, KV_F32, 16), 6144);
    // One layer's keys span n_blocks x block_size x kv_dim elements.
    assert_int_equal((char*)kv_memory_layer_keys(&kv, 2) - (char*)kv_memory_layer_keys(&kv, 1), 10 * 16 * 16 * 4);
    kv_memory_free(&kv);
    assert_int_equal(kv_memory_init(&kv, &grouped, KV_F16, 10, 16, &err), 0);
    assert_int_equal(kv_memory_bytes(&kv), 30720);
    kv_memory_free(&kv);
}

// ---- the contiguous baseline ------------------------------------------------------------------

static void assert_usage(const kv_contiguous* c, int64_t reserved, int64_t free_slots, int64_t largest, int holes) {
    kv_contiguous_usage usage = kv_contiguous_measure(c);
    assert_int_equal(usage.reserved_slots, reserved);
    assert_int_equal(usage.free_slots, free_slots);
    assert_int_equal(usage.largest_hole, largest);
    assert_int_equal(usage.n_holes, holes);
}

static void test_contiguous_first_fit(void** state) {
    (void)state;
    model_config config = tiny_config(8, 2, 1, 1);
    kv_contiguous c;
    error_info err = {{0}};
    assert_int_equal(kv_contiguous_init(&c, &config, KV_F16, 100, &err), 0);
    assert_usage(&c, 0, 100, 100, 1);
    assert_int_equal(kv_contiguous_reserve(&c, 1, 20), 0);  // A: 0..20
    assert_int_equal(kv_contiguous_reserve(&c, 2, 30), 20); // B: 20..50
    assert_int_equal(kv_contiguous_reserve(&c, 3, 10), 50); // C: 50..60
    assert_usage(&c, 60, 40, 40, 1);
    kv_contiguous_release(&c, 2); // holes 20..50 and 60..100
    assert_usage(&c, 30, 70, 40, 2);
    assert_int_equal(kv_contiguous_reserve(&c, 4, 25), 20); // fits B's hole: 20..45
    assert_usage(&c, 55, 45, 40, 2);                        // holes 45..50, 60..100
    assert_int_equal(kv_contiguous_reserve(&c, 5, 35), 60); // not in 45..50: after C
    assert_usage(&c, 90, 10, 5, 2);                         // holes 45..50, 95..100
    // 10 slots free, but no run of 6: external fragmentation.
    assert_int_equal(kv_contiguous_reserve(&c, 6, 6), -1);
    assert_int_equal(kv_contiguous_reserve(&c, 6, 5), 45); // exactly fills the first hole
    assert_usage(&c, 95, 5, 5, 1);
    assert_int_equal(kv_contiguous_reserve(&c, 7, 0), -1);
    assert_int_equal(kv_contiguous_reserve(&c, 7, 101), -1);
    kv_contiguous_release(&c, 99); // no run: nothing changes
    assert_usage(&c, 95, 5, 5, 1);
    kv_contiguous_release(&c, 1); // A's run frees the start
    assert_usage(&c, 75, 25, 20, 2);
    assert_int_equal(kv_contiguous_reserve(&c, 8, 20), 0);
    assert_usage(&c, 95, 5, 5, 1);
    assert_int_equal(c.n_reservations, 5);     // runs of sequences 3, 4, 5, 6 and 8
    for (int i = 1; i < c.n_reservations; i++) // kept sorted and disjoint
        assert_true(c.reservations[i - 1].start + c.reservations[i - 1].length <= c.reservations[i].start);
    kv_contiguous_free(&c);

    assert_int_equal(kv_contiguous_init(&c, &config, KV_F16, 0, &err), -1);
    assert_non_null(strstr(err.message, "slot"));
}

// ---- bad arguments ------------------------------------------------------------------------------

static void test_rejects_bad_pool_sizes(void** state) {
    (void)state;
    model_config config = tiny_config(8, 2, 1, 1);
    kv_pool pool;
    error_info err = {{0}};
    assert_int_equal(kv_pool_init(&pool, &config, KV_F16, 16, 0, &err), -1);
    assert_non_null(strstr(err.message, "--block-size"));
    assert_non_null(strstr(err.message, "found 0"));
    kv_pool_free(&pool); // safe after a failed init
    error_clear(&err);
    assert_int_equal(kv_pool_init(&pool, &config, KV_F16, 16, 257, &err), -1);
    assert_non_null(strstr(err.message, "--block-size"));
    assert_non_null(strstr(err.message, "found 257"));
    error_clear(&err);
    assert_int_equal(kv_pool_init(&pool, &config, KV_F16, 0, 16, &err), -1);
    assert_non_null(strstr(err.message, "block"));
    assert_null(strstr(err.message, "--block-size"));
    assert_non_null(strstr(err.message, "found 0"));
    assert_int_equal(kv_pool_init(&pool, &config, KV_F16, -3, 16, &err), -1);
    kv_pool_free(&pool);
    // The limits themselves are accepted.
    assert_int_equal(kv_pool_init(&pool, &config, KV_F16, 1, 256, &err), 0);
    assert_int_equal(kv_pool_allocate(&pool, 1), 0);
    kv_pool_free(&pool);
    assert_int_equal(kv_pool_init(&pool, &config, KV_F16, 1, 1, &err), 0);
    kv_pool_free(&pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_operations_keep_invariants),
        cmocka_unit_test(test_copy_on_write_copies_kv),
        cmocka_unit_test(test_chained_hashes_depend_on_the_parent),
        cmocka_unit_test(test_lookup_checks_tokens_and_parent),
        cmocka_unit_test(test_eviction_is_least_recently_used),
        cmocka_unit_test(test_allocate_fails_when_every_block_is_held),
        cmocka_unit_test(test_kv_bytes),
        cmocka_unit_test(test_contiguous_first_fit),
        cmocka_unit_test(test_rejects_bad_pool_sizes),
    };
    return cmocka_run_group_tests_name("engine/kv_blocks", tests, NULL, NULL);
}
