// The engine audit (engine/audit.h): clean runs pass every check (and the
// checks had something to look at: copies, preemptions, prefix hits,
// sharded all-reduces); each deliberate fault it covers, and each bug issue
// 43 names, is caught with a message naming the invariant and both numbers.
// The bugs nothing else catches are put into a real engine here, test-only:
// a layout whose functions are swapped for buggy ones, or a state corrupted
// through the engine's structs between two steps.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <string.h>

#include "engine/engine.h"
#include "engine/fault.h"
#include "engine/model_synth.h"
#include "engine/tokenizer.h"
#include "tests/test_support.h"

enum { BLOCK = 16, MAX_STEPS = 400 };

static model tiny;

static int setup(void** state) {
    (void)state;
    error_info err = {{0}};
    return model_synthesize(&tiny, "tiny", TOK_MIN_VOCAB_SIZE, MODEL_DTYPE_FP32, SYNTH_DEFAULT_SEED, &err);
}

static int teardown(void** state) {
    (void)state;
    model_free(&tiny);
    return 0;
}

// A failed check leaves its test early: the next one starts with no fault.
static int no_fault(void** state) {
    (void)state;
    fault_install(0);
    return 0;
}

static engine_config audited(int num_blocks) {
    engine_config c = engine_config_default();
    c.kv_dtype = KV_F32;
    c.num_blocks = num_blocks;
    c.block_size = BLOCK;
    c.n_threads = 1;
    c.audit = true;
    return c;
}

// A prompt of n tokens: BOS, then ids from `seed` (equal seeds, equal prompts).
static void make_prompt(int32_t* out, int n, int seed) {
    out[0] = 1;
    for (int i = 1; i < n; i++)
        out[i] = 3 + (i * 37 + seed * 11) % 200;
}

static void add(engine* e, const int32_t* prompt, int n_prompt, int max_new, int n_samples) {
    error_info err = {{0}};
    request_params p = {prompt, n_prompt, max_new, n_samples, n_samples > 1 ? 1.0f : 0.0f, 0.0f, 7, 0.0, true};
    assert_int_equal(engine_add_request(e, &p, NULL, &err), 0);
}

// Steps until the engine is idle (one more step then audits the idle pool);
// returns the first audit error's step, 0 when every step passed.
static uint64_t run_to_end(engine* e, error_info* err) {
    const step_record* r = NULL;
    for (int i = 0; i < MAX_STEPS; i++) {
        bool had_work = engine_has_work(e);
        if (engine_step(e, &r, err)) return e->step_counter;
        if (!had_work) return 0;
    }
    fail_msg("the engine did not finish in %d steps", MAX_STEPS);
    return 0;
}

static void assert_contains(const char* text, const char* part) {
    if (!strstr(text, part)) fail_msg("expected \"%s\" in: %s", part, text);
}

// ---- clean runs ----------------------------------------------------------------------------

// Shared prefixes, forks with copy-on-write, preemption in a small pool, and
// the audit counted its checks; then the same with 2 shards, and contiguous.
static void test_clean_runs_pass_every_check(void** state) {
    (void)state;
    error_info err = {{0}};
    engine_config configs[3] = {audited(12), audited(12), audited(64)};
    configs[1].tp_shards = 2;
    configs[2].layout = KV_LAYOUT_CONTIGUOUS;
    for (int k = 0; k < 3; k++) {
        engine e;
        assert_int_equal(engine_init(&e, &tiny, &configs[k], &err), 0);
        int32_t prompt[40];
        make_prompt(prompt, 40, 0);
        for (int i = 0; i < 4; i++)
            add(&e, prompt, 36 + i, 40, i == 0 ? 3 : 1); // one 32-token prefix shared
        uint64_t failed_at = run_to_end(&e, &err);
        if (failed_at) fail_msg("config %d: %s", k, err.message);
        assert_true(e.audit.n_checks > 100);
        if (k < 2) { // what the paged checks had to look at
            assert_true(e.pool.total_copies > 0);
            assert_true(e.scheduler.total_preemptions > 0);
            assert_true(e.total_prefix_hit_tokens > 0);
        }
        engine_free(&e);
    }
}

// ---- the engine's own faults ---------------------------------------------------------------

typedef struct caught_fault {
    fault_id fault;
    int tp_shards;
    const char* message; // a part of the audit's message
} caught_fault;

static void test_faults_are_caught(void** state) {
    (void)state;
    const caught_fault cases[] = {
        {FAULT_KV_COUNT_DROPPED, 1, "audit: kv bytes written 0, but"},
        {FAULT_KV_COUNT_DOUBLED, 1, "audit: kv bytes written"},
        {FAULT_SKIP_LAST_BLOCK, 1, "audit: kv bytes read"},
        {FAULT_FLOPS_ALLOCATED, 1, "audit: attention flops"},
        {FAULT_WEIGHT_COUNT_DOUBLED, 1, "audit: weight bytes read"},
        {FAULT_UNBATCHED_DECODE, 1, "audit: weight bytes read"},
        {FAULT_TP_FULL_WEIGHTS, 2, "audit: weight bytes read"},
        {FAULT_PREFIX_NO_REFCOUNT, 1, "holders"},
        {FAULT_NO_COW, 1, "tables of this step's sequences hold"},
        {FAULT_COW_SHORT_COPY, 1, "audit: copy-on-write copied"},
        {FAULT_PAGED_ALLOCATE_AHEAD, 1, "blocks, but"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        fault_install((fault_set)1 << cases[k].fault);
        engine_config c = audited(64);
        c.tp_shards = cases[k].tp_shards;
        engine e;
        error_info err = {{0}};
        assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
        int32_t prompt[40];
        make_prompt(prompt, 40, 0);
        add(&e, prompt, 36, 12, 2); // two samples: a shared, partly filled tail block
        add(&e, prompt, 38, 12, 1); // a prefix hit on the first two blocks
        uint64_t failed_at = run_to_end(&e, &err);
        if (!failed_at) fail_msg("fault %s: no audit error", fault_name(cases[k].fault));
        assert_contains(err.message, cases[k].message);
        assert_contains(err.message, " at step ");
        engine_free(&e);
        fault_install(0);
    }
}

// ---- bugs put in through the layout's functions --------------------------------------------

// A release that never gives back the sequence's first block.
static void release_keeping_first_block(block_manager* bm, sequence* s) {
    for (int i = s->n_table - 1; i > 0; i--)
        kv_pool_release(bm->pool, s->block_table[i], s->id);
    s->n_table = 0;
    s->n_hashed_blocks = 0;
    s->last_block_hash = 0;
}

// Tail waste as bs - n mod bs over the tokens holding slots: right except
// at exact multiples (16, not 0).
static int32_t tail_waste_wrong_at_multiples(const block_manager* bm, const sequence* s) {
    int holding = s->state == SEQ_DECODE ? s->n_computed : s->n_tokens;
    if ((int64_t)s->n_table * bm->block_size < holding) return 0;
    return bm->block_size - holding % bm->block_size;
}

static void test_released_sequence_keeping_its_first_block(void** state) {
    (void)state;
    kv_layout_ops buggy = kv_layout_paged_ops;
    buggy.release = release_keeping_first_block;
    engine_config c = audited(64);
    c.prefix_caching = false; // the first block is not the cache's to hold
    engine e;
    error_info err = {{0}};
    assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
    e.scheduler.kv.ops = &buggy;
    int32_t prompt[20];
    make_prompt(prompt, 20, 3);
    add(&e, prompt, 20, 5, 1);
    assert_true(run_to_end(&e, &err) > 0);
    // One request: once it is done nothing runs, and the pool is not whole.
    assert_contains(err.message, "audit: pool not whole at step 5: nothing runs, yet block 0 has ref count 1 "
                                 "(expected 0: free)");
    engine_free(&e);
}

static void test_tail_waste_wrong_at_exact_multiples(void** state) {
    (void)state;
    kv_layout_ops buggy = kv_layout_paged_ops;
    buggy.tail_waste = tail_waste_wrong_at_multiples;
    engine e;
    error_info err = {{0}};
    engine_config c = audited(64);
    assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
    e.scheduler.kv.ops = &buggy;
    int32_t prompt[20];
    make_prompt(prompt, 20, 4);
    add(&e, prompt, 20, 30, 1);
    assert_true(run_to_end(&e, &err) > 0);
    assert_contains(err.message,
                    "tail waste 16 slots, but 33 tokens (the newest not yet written) in 2 blocks of 16 leave 0");
    engine_free(&e);
}

// ---- bugs put in by corrupting the state between steps -------------------------------------

static void step_ok(engine* e, int n) {
    error_info err = {{0}};
    const step_record* r;
    for (int i = 0; i < n; i++)
        if (engine_step(e, &r, &err)) fail_msg("step %d: %s", i, err.message);
}

static void test_extra_reference_is_named(void** state) {
    (void)state;
    engine e;
    error_info err = {{0}};
    engine_config c = audited(64);
    assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
    int32_t prompt[20];
    make_prompt(prompt, 20, 5);
    add(&e, prompt, 20, 30, 1);
    step_ok(&e, 3);
    // The full first block, which the prefix cache holds too (a phantom
    // reference on the partly filled tail would send the next decode to
    // copy-on-write, which drops it again).
    int32_t block = test_sequence(&e, 0)->block_table[0];
    e.pool.blocks[block].ref_count++; // a retain nobody will release
    const step_record* r;
    assert_int_equal(engine_step(&e, &r, &err), -1);
    char expected[128];
    snprintf(expected, sizeof expected, "audit: block %d ref count 3, but 2 holders (1 tables + cache) at step 4",
             block);
    assert_contains(err.message, expected);
    engine_free(&e);
}

static void test_lost_free_block_breaks_the_balance(void** state) {
    (void)state;
    engine e;
    error_info err = {{0}};
    engine_config c = audited(64);
    assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
    int32_t prompt[20];
    make_prompt(prompt, 20, 6);
    add(&e, prompt, 20, 30, 1);
    step_ok(&e, 2);
    e.pool.n_free--; // a free block dropped off the free stack: neither free nor held
    const step_record* r;
    assert_int_equal(engine_step(&e, &r, &err), -1);
    assert_contains(err.message, "audit: record says free 61 + used 2 + cached 0 of 64 blocks, the tables and cache "
                                 "give free 62 + used 2 + cached 0 of 64 at step 3");
    engine_free(&e);
}

// Puts cached block `block` at entry `entry` of sequence 1's table, as a
// parent-blind prefix hash would have (counted, so only the chain is
// wrong), then expects the next step's audit to say `expected`.
static void swap_in_cached_block(engine* e, int entry, int32_t block, const char* expected) {
    sequence* b = (sequence*)test_sequence(e, 1);
    assert_true(e->pool.blocks[block].cached);
    kv_pool_retain(&e->pool, block, b->id);
    kv_pool_release(&e->pool, b->block_table[entry], b->id);
    b->block_table[entry] = block;
    const step_record* r;
    error_info err = {{0}};
    assert_int_equal(engine_step(e, &r, &err), -1);
    assert_contains(err.message, expected);
}

// What a prefix-cache hash that ignores the parent block would hand out: a
// cached block with the right tokens, cached after a different first block.
static void test_prefix_hit_under_another_parent(void** state) {
    (void)state;
    engine e;
    error_info err = {{0}};
    engine_config c = audited(64);
    assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
    int32_t first[40], second[40];
    make_prompt(first, 40, 7);
    memcpy(second, first, sizeof second);
    for (int i = 1; i < BLOCK; i++)
        second[i] = 250 - i; // another first block, the same second block
    add(&e, first, 40, 30, 1);
    add(&e, second, 40, 30, 1);
    step_ok(&e, 2);
    assert_true(e.pool.blocks[test_sequence(&e, 1)->block_table[1]].cached);
    int32_t other_parents_block = test_sequence(&e, 0)->block_table[1];
    char expected[96];
    snprintf(expected, sizeof expected, "audit: prefix block %d at table entry 1 of sequence 1 was cached under parent",
             other_parents_block);
    swap_in_cached_block(&e, 1, other_parents_block, expected);
    engine_free(&e);
}

// The same bug one block earlier: the second prompt starts with the first
// prompt's second block, which a parent-blind hash would hand out as its
// first block (seen with a local patch to kv_block_hash and kv_pool_lookup,
// reverted; here the table is set as that patch left it).
static void test_prefix_hit_at_another_position(void** state) {
    (void)state;
    engine e;
    error_info err = {{0}};
    engine_config c = audited(64);
    assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
    int32_t first[40], second[40];
    make_prompt(first, 40, 8);
    for (int i = 0; i < 40; i++)
        second[i] = i < BLOCK ? first[BLOCK + i] : 5 + i;
    add(&e, first, 40, 30, 1);
    add(&e, second, 40, 30, 1);
    step_ok(&e, 2);
    int32_t second_block = test_sequence(&e, 0)->block_table[1];
    char expected[96];
    snprintf(expected, sizeof expected, "audit: prefix block %d is the first block of sequence 1, but was cached",
             second_block);
    swap_in_cached_block(&e, 0, second_block, expected);
    engine_free(&e);
}

// A scheduler that preempts the earliest admitted: its admission stamps are
// turned around before every step, so its "latest" is the oldest.
static void test_preempting_the_oldest_is_named(void** state) {
    (void)state;
    engine e;
    error_info err = {{0}};
    engine_config c = audited(10);
    c.prefix_caching = false;
    assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
    int32_t prompt[20];
    for (int i = 0; i < 4; i++) {
        make_prompt(prompt, 20, 10 + i);
        add(&e, prompt, 20, 60, 1);
    }
    const step_record* r = NULL;
    int status = 0;
    for (int step = 0; step < MAX_STEPS && status == 0 && engine_has_work(&e); step++) {
        for (int i = 0; i < e.scheduler.n_running; i++) {
            sequence* s = &e.scheduler.sequences[e.scheduler.running[i]];
            s->admit_order = 1000000 - s->admit_order % 1000000;
        }
        status = engine_step(&e, &r, &err);
    }
    assert_int_equal(status, -1);
    assert_contains(err.message, "was preempted (admission 1) while sequence");
    engine_free(&e);
}

// ---- invariants added for the mutants (scripts/mutants/) -----------------------------------

// Two finished requests leave their full blocks to the cache alone (A's
// older than B's), then a third needs more blocks than are free: eviction
// must take A's. With `rotate_lru`, A's oldest block is moved to the LRU
// list's young end first, as an eviction that picks the wrong end would
// treat it: the audit names the block that should have gone. Returns the
// step the audit failed at, 0 when every step passed.
static uint64_t evict_after_two_requests(bool rotate_lru, uint64_t* evictions, error_info* err) {
    engine e;
    engine_config c = audited(8);
    assert_int_equal(engine_init(&e, &tiny, &c, err), 0);
    int32_t prompt[100];
    make_prompt(prompt, 40, 20);
    add(&e, prompt, 40, 4, 1);
    assert_int_equal(run_to_end(&e, err), 0);
    make_prompt(prompt, 40, 21);
    add(&e, prompt, 40, 4, 1);
    assert_int_equal(run_to_end(&e, err), 0);
    kv_pool* pool = &e.pool;
    assert_int_equal(pool->n_evictable, 4); // two full blocks of each request
    if (rotate_lru) {
        int32_t oldest = pool->lru_head, second = pool->blocks[oldest].lru_next;
        pool->lru_head = second;
        pool->blocks[second].lru_previous = -1;
        pool->blocks[pool->lru_tail].lru_next = oldest;
        pool->blocks[oldest].lru_previous = pool->lru_tail;
        pool->blocks[oldest].lru_next = -1;
        pool->lru_tail = oldest;
    }
    make_prompt(prompt, 90, 22);
    add(&e, prompt, 90, 4, 1); // 6 blocks: the 4 free ones and 2 evicted
    uint64_t failed_at = run_to_end(&e, err);
    *evictions = pool->total_evictions;
    engine_free(&e);
    return failed_at;
}

static void test_evicting_a_younger_block_is_named(void** state) {
    (void)state;
    error_info err = {{0}};
    uint64_t evictions = 0;
    if (evict_after_two_requests(false, &evictions, &err)) fail_msg("clean eviction: %s", err.message);
    assert_int_equal(evictions, 2);
    assert_true(evict_after_two_requests(true, &evictions, &err) > 0);
    assert_contains(err.message, "audit: eviction took block");
    assert_contains(err.message, "was older and stayed evictable");
}

// A preemption in a pool of 10 blocks with a fifth request still waiting
// behind the victim; the queue turned around, the audit names the victim.
static void test_preempted_behind_a_new_request_is_named(void** state) {
    (void)state;
    engine e;
    error_info err = {{0}};
    engine_config c = audited(10);
    c.prefix_caching = false;
    c.max_seqs = 4;
    assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
    int32_t prompt[20];
    for (int i = 0; i < 5; i++) {
        make_prompt(prompt, 20, 30 + i);
        add(&e, prompt, 20, 60, 1);
    }
    const step_record* r = NULL;
    scheduler* sched = &e.scheduler;
    bool found = false;
    for (int step = 0; step < MAX_STEPS && !found && engine_has_work(&e); step++) {
        if (engine_step(&e, &r, &err)) fail_msg("step %d: %s", step, err.message);
        found = sched->n_waiting >= 2 && sched->sequences[sched->waiting[0]].state == SEQ_PREEMPTED &&
                sched->sequences[sched->waiting[1]].state == SEQ_WAITING;
    }
    assert_true(found);
    int32_t victim = sched->waiting[0], newcomer = sched->waiting[1];
    sched->waiting[0] = newcomer; // what a scheduler that queues the victim at the back leaves
    sched->waiting[1] = victim;
    assert_int_equal(audit_step(&e.audit, &e, r, &err), -1);
    char expected[96];
    snprintf(expected, sizeof expected, "audit: preempted sequence %d waits at place 2 of %d, behind sequence %d",
             victim, sched->n_waiting, newcomer);
    assert_contains(err.message, expected);
    engine_free(&e);
}

// A contiguous cache whose usage counts each decoding sequence's newest
// token, sampled but not yet written (slots from n_tokens, not n_computed).
static kv_usage measure_counting_sampled_tokens(block_manager* bm, running_view running) {
    kv_usage u = kv_layout_contiguous_ops.measure(bm, running);
    for (int i = 0; i < running.n_running; i++)
        if (running.sequences[running.running[i]].state == SEQ_DECODE) u.slots_used++;
    return u;
}

static void test_slots_used_counting_unwritten_tokens_is_named(void** state) {
    (void)state;
    kv_layout_ops buggy = kv_layout_contiguous_ops;
    buggy.measure = measure_counting_sampled_tokens;
    engine e;
    error_info err = {{0}};
    engine_config c = audited(64);
    c.layout = KV_LAYOUT_CONTIGUOUS;
    assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
    int32_t prompt[20];
    make_prompt(prompt, 20, 50);
    add(&e, prompt, 20, 5, 1);
    step_ok(&e, 1); // the prompt: slots 0..19 written, the first token sampled, as the unbuggy measure says
    e.scheduler.kv.ops = &buggy;
    const step_record* r;
    assert_int_equal(engine_step(&e, &r, &err), -1);
    assert_contains(err.message, "audit: record says 22 slots used, but the running sequences' computed positions "
                                 "fill 21 at step 2");
    engine_free(&e);
}

// A contiguous reservation one slot short of the request (prompt 20 +
// max_tokens 5 = 25 slots): the table is cut as such an admission leaves it.
static void test_short_reservation_is_named(void** state) {
    (void)state;
    engine e;
    error_info err = {{0}};
    engine_config c = audited(64);
    c.layout = KV_LAYOUT_CONTIGUOUS;
    c.reserve = RESERVE_REQUEST;
    assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
    int32_t prompt[20];
    make_prompt(prompt, 20, 60);
    add(&e, prompt, 20, 5, 1);
    step_ok(&e, 1);
    ((sequence*)test_sequence(&e, 0))->n_table--;
    const step_record* r;
    assert_int_equal(engine_step(&e, &r, &err), -1);
    assert_contains(err.message, "audit: sequence 0 reserves 24 slots, but its prompt + max_tokens gives 25 at step 2");
    engine_free(&e);
}

// A request that should have stopped at max_tokens: its limit lowered to
// what it has generated, as a length test written with > would leave it.
static void test_sequence_past_max_tokens_is_named(void** state) {
    (void)state;
    engine e;
    error_info err = {{0}};
    engine_config c = audited(64);
    assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
    int32_t prompt[20];
    make_prompt(prompt, 20, 70);
    add(&e, prompt, 20, 10, 1);
    const step_record* r = NULL;
    for (int i = 0; i < 3; i++)
        if (engine_step(&e, &r, &err)) fail_msg("step %d: %s", i, err.message);
    sequence* s = (sequence*)test_sequence(&e, 0);
    assert_int_equal(s->n_tokens - s->n_prompt, 3);
    s->max_new_tokens = 3;
    assert_int_equal(audit_step(&e.audit, &e, r, &err), -1);
    assert_contains(err.message, "audit: sequence 0 has generated 3 tokens of its max_tokens 3 and is still");
    engine_free(&e);
}

// The same request run to its end, its stop reason then changed to what a
// missed length test leaves (the context: prompt + max_tokens is full).
static void test_length_stop_reported_as_context_is_named(void** state) {
    (void)state;
    engine e;
    error_info err = {{0}};
    engine_config c = audited(64);
    assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
    int32_t prompt[20];
    make_prompt(prompt, 20, 71);
    add(&e, prompt, 20, 4, 1);
    const step_record* r = NULL;
    for (int i = 0; i < 20 && (r == NULL || r->n_finished_now == 0); i++)
        if (engine_step(&e, &r, &err)) fail_msg("step %d: %s", i, err.message);
    assert_int_equal(r->n_finished_now, 1);
    sequence* s = (sequence*)test_sequence(&e, r->finished_ids[0]);
    assert_int_equal(s->stop, STOP_LENGTH);
    s->stop = STOP_CONTEXT;
    assert_int_equal(audit_step(&e.audit, &e, r, &err), -1);
    assert_contains(err.message, "stopped for the context after generating 4 tokens, its max_tokens 4");
    engine_free(&e);
}

// Two shards: the record's all-reduce count is checked against the layers.
static void test_allreduce_count_is_checked(void** state) {
    (void)state;
    engine e;
    error_info err = {{0}};
    engine_config c = audited(64);
    c.tp_shards = 2;
    assert_int_equal(engine_init(&e, &tiny, &c, &err), 0);
    int32_t prompt[20];
    make_prompt(prompt, 20, 40);
    add(&e, prompt, 20, 4, 1);
    const step_record* r = NULL;
    if (engine_step(&e, &r, &err)) fail_msg("%s", err.message);
    assert_int_equal(r->n_allreduces, 2 * tiny.config.n_layers);
    ((step_record*)r)->n_allreduces -= 1; // the all-reduce after the last layer not counted
    assert_int_equal(audit_step(&e.audit, &e, r, &err), -1);
    char expected[96];
    snprintf(expected, sizeof expected, "audit: %d all-reduces, but 2 x %d layers = %d", 2 * tiny.config.n_layers - 1,
             tiny.config.n_layers, 2 * tiny.config.n_layers);
    assert_contains(err.message, expected);
    engine_free(&e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean_runs_pass_every_check),
        cmocka_unit_test_teardown(test_faults_are_caught, no_fault),
        cmocka_unit_test(test_released_sequence_keeping_its_first_block),
        cmocka_unit_test(test_tail_waste_wrong_at_exact_multiples),
        cmocka_unit_test(test_extra_reference_is_named),
        cmocka_unit_test(test_lost_free_block_breaks_the_balance),
        cmocka_unit_test(test_prefix_hit_under_another_parent),
        cmocka_unit_test(test_prefix_hit_at_another_position),
        cmocka_unit_test(test_preempting_the_oldest_is_named),
        cmocka_unit_test(test_evicting_a_younger_block_is_named),
        cmocka_unit_test(test_preempted_behind_a_new_request_is_named),
        cmocka_unit_test(test_allreduce_count_is_checked),
        cmocka_unit_test(test_slots_used_counting_unwritten_tokens_is_named),
        cmocka_unit_test(test_short_reservation_is_named),
        cmocka_unit_test(test_sequence_past_max_tokens_is_named),
        cmocka_unit_test(test_length_stop_reported_as_context_is_named),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
