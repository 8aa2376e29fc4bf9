// The memory-pressure faults (engine/fault.h) do the bug they name,
// measurably: evict-most-recent takes the other end of the LRU list;
// preempt-oldest preempts the sequence admitted first; recompute-extra-token
// puts the victim's last token in twice; chunk-ignores-budget lets a prefill
// chunk take the whole step budget on top of the decodes; and
// tp-allreduce-one-way counts half of a ring all-reduce's bytes. Each test
// runs the same scenario without the fault too, so that the same
// measurement shows the difference (lesson 10 and lesson 09 hold the
// engine to independent references; these pin down what each fault does).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <string.h>

#include "engine/engine.h"
#include "engine/fault.h"
#include "engine/kv_blocks.h"
#include "engine/model_synth.h"
#include "engine/tokenizer.h"
#include "tests/test_support.h"

#define VOCAB 259 // the byte-level vocabulary of the synthetic presets
#define MAX_TOKENS 128

static model tiny;

static int setup(void** state) {
    (void)state;
    error_info err = {{0}};
    return model_synthesize(&tiny, "tiny", VOCAB, MODEL_DTYPE_FP32, SYNTH_DEFAULT_SEED, &err);
}

static int teardown(void** state) {
    (void)state;
    model_free(&tiny);
    fault_install(0);
    return 0;
}

// ---- evict-most-recent --------------------------------------------------------------------

// Three cached blocks released in the order 0, 1, 2 (each then held only
// by the cache, so evictable); a fourth allocation with no free block
// evicts block 0, the least recently used; under the fault, block 2.
static int32_t evicted_by_a_full_pool(fault_set faults) {
    fault_set previous = fault_install(faults);
    kv_pool pool;
    error_info err = {{0}};
    enum { BLOCKS = 3, BLOCK_SIZE = 4 };
    if (kv_pool_init(&pool, &tiny.config, KV_F32, BLOCKS, BLOCK_SIZE, &err)) fail_msg("kv_pool_init: %s", err.message);
    for (int i = 0; i < BLOCKS; i++) {
        int32_t block = kv_pool_allocate(&pool, i);
        assert_int_equal(block >= 0, 1);
        int32_t tokens[BLOCK_SIZE] = {10 + i, 20 + i, 30 + i, 40 + i};
        pool.blocks[block].n_filled = BLOCK_SIZE;
        kv_pool_cache(&pool, block, kv_block_hash(0, tokens, BLOCK_SIZE), 0, tokens);
    }
    for (int32_t block = 0; block < BLOCKS; block++) kv_pool_release(&pool, block, block);
    assert_int_equal(kv_pool_available(&pool), BLOCKS);
    uint64_t evictions_before = pool.total_evictions;
    int32_t taken = kv_pool_allocate(&pool, 9);
    assert_int_equal(pool.total_evictions, evictions_before + 1);
    if (kv_pool_validate(&pool, &err)) fail_msg("kv_pool_validate: %s", err.message);
    kv_pool_free(&pool);
    fault_install(previous);
    return taken;
}

static void test_evict_most_recent_takes_the_newest_cached_block(void** state) {
    (void)state;
    assert_int_equal(evicted_by_a_full_pool(0), 0);
    assert_int_equal(evicted_by_a_full_pool((fault_set)1 << FAULT_EVICT_MOST_RECENT), 2);
}

// ---- preempt-oldest, recompute-extra-token ------------------------------------------------

typedef struct pressure_run {
    int32_t victim;               // the first sequence preempted, or -1
    int victim_tokens_at_preemption; // its n_tokens right after it was preempted
    int32_t tokens[3][MAX_TOKENS];   // each sequence's tokens at the end
    int n_tokens[3];
} pressure_run;

// Three greedy requests of 17..19 prompt tokens and 40 new ones on 9 blocks
// of 16: each needs 4 blocks near its end, 12 in all, so one is preempted
// (lesson 10's scenario). n_blocks = 64 runs them without preemption.
static void run_under_pressure(fault_set faults, int n_blocks, pressure_run* out) {
    memset(out, 0, sizeof *out);
    out->victim = -1;
    fault_set previous = fault_install(faults);
    engine_config c = engine_config_default();
    c.kv_dtype = KV_F32;
    c.num_blocks = n_blocks;
    c.watermark_blocks = 1;
    c.n_threads = 1;
    engine e;
    error_info err = {{0}};
    if (engine_init(&e, &tiny, &c, &err)) fail_msg("engine_init: %s", err.message);
    for (int i = 0; i < 3; i++) {
        int32_t prompt[32];
        int n_prompt = 17 + i;
        prompt[0] = TOK_BOS_ID;
        for (int t = 1; t < n_prompt; t++) prompt[t] = 3 + (t * 37 + i * 101) % (VOCAB - 3);
        request_params p = {prompt, n_prompt, 40, 1, 0.0f, 0.9f, 1, 0.0, true};
        if (engine_add_request(&e, &p, NULL, &err)) fail_msg("add_request: %s", err.message);
    }
    while (engine_has_work(&e)) {
        const step_record* r;
        if (engine_step(&e, &r, &err)) fail_msg("engine_step: %s", err.message);
        if (r->n_preempted > 0 && out->victim < 0)
            for (int id = 0; id < 3; id++)
                if (test_sequence(&e, id)->n_preemptions > 0) {
                    out->victim = id;
                    out->victim_tokens_at_preemption = test_sequence(&e, id)->n_tokens;
                }
    }
    for (int id = 0; id < 3; id++) {
        const sequence* s = test_sequence(&e, id);
        assert_true(s->n_tokens <= MAX_TOKENS);
        out->n_tokens[id] = s->n_tokens;
        memcpy(out->tokens[id], s->tokens, (size_t)s->n_tokens * sizeof(int32_t));
    }
    engine_free(&e);
    fault_install(previous);
}

static void test_preempt_oldest_takes_the_first_admitted(void** state) {
    (void)state;
    pressure_run normal, faulty;
    run_under_pressure(0, 9, &normal);
    run_under_pressure((fault_set)1 << FAULT_PREEMPT_OLDEST, 9, &faulty);
    print_message("victim: %d without the fault, %d under preempt-oldest\n", normal.victim, faulty.victim);
    assert_int_equal(normal.victim, 2); // admitted last
    assert_int_equal(faulty.victim, 0); // admitted first
}

// Without the fault the preempted sequence ends with the tokens it has when
// nothing is preempted; under it, its last token before the preemption
// appears twice in a row and the sequence is not the same.
static void test_recompute_extra_token_repeats_the_last_token(void** state) {
    (void)state;
    pressure_run alone, normal, faulty;
    run_under_pressure(0, 64, &alone);
    run_under_pressure(0, 9, &normal);
    run_under_pressure((fault_set)1 << FAULT_RECOMPUTE_EXTRA_TOKEN, 9, &faulty);
    assert_int_equal(alone.victim, -1);
    assert_int_equal(normal.victim, 2);
    assert_int_equal(faulty.victim, 2);
    for (int id = 0; id < 3; id++) {
        assert_int_equal(normal.n_tokens[id], alone.n_tokens[id]);
        assert_memory_equal(normal.tokens[id], alone.tokens[id], (size_t)alone.n_tokens[id] * sizeof(int32_t));
    }
    int n = faulty.victim_tokens_at_preemption; // counts the extra token
    assert_int_equal(n, normal.victim_tokens_at_preemption + 1);
    assert_int_equal(faulty.tokens[2][n - 1], faulty.tokens[2][n - 2]);
    assert_memory_equal(faulty.tokens[2], alone.tokens[2], (size_t)(n - 1) * sizeof(int32_t));
    assert_memory_not_equal(faulty.tokens[2], alone.tokens[2], (size_t)alone.n_tokens[2] * sizeof(int32_t));
}

// ---- chunk-ignores-budget -----------------------------------------------------------------

// Three requests decode while a 200-token prompt prefills with a budget of
// 32 tokens per step: the largest step computes 32 tokens (29 of prompt and
// 3 decodes); under the fault the chunk takes all 32 and the step 35.
static int largest_step_beside_decodes(fault_set faults) {
    fault_set previous = fault_install(faults);
    engine_config c = engine_config_default();
    c.kv_dtype = KV_F32;
    c.num_blocks = 64;
    c.max_batched_tokens = 32;
    c.n_threads = 1;
    engine e;
    error_info err = {{0}};
    if (engine_init(&e, &tiny, &c, &err)) fail_msg("engine_init: %s", err.message);
    int32_t prompt[200];
    for (int i = 0; i < 3; i++) {
        prompt[0] = TOK_BOS_ID;
        for (int t = 1; t < 6; t++) prompt[t] = 3 + (t * 37 + i * 101) % (VOCAB - 3);
        request_params p = {prompt, 6, 60, 1, 0.0f, 0.9f, 1, 0.0, true};
        if (engine_add_request(&e, &p, NULL, &err)) fail_msg("add_request: %s", err.message);
    }
    const step_record* r;
    for (int s = 0; s < 4; s++)
        if (engine_step(&e, &r, &err)) fail_msg("engine_step: %s", err.message);
    for (int t = 1; t < 200; t++) prompt[t] = 3 + (t * 37) % (VOCAB - 3);
    request_params long_prompt = {prompt, 200, 2, 1, 0.0f, 0.9f, 1, 0.0, true};
    if (engine_add_request(&e, &long_prompt, NULL, &err)) fail_msg("add_request: %s", err.message);
    int largest = 0, prefilled = 0;
    while (engine_has_work(&e) && prefilled < 200) {
        if (engine_step(&e, &r, &err)) fail_msg("engine_step: %s", err.message);
        prefilled += r->prefill_tokens;
        assert_int_equal(r->decode_tokens, 3);
        if (r->prefill_tokens + r->decode_tokens > largest) largest = r->prefill_tokens + r->decode_tokens;
    }
    assert_int_equal(prefilled, 200);
    engine_free(&e);
    fault_install(previous);
    return largest;
}

static void test_chunk_ignores_budget_goes_over_it(void** state) {
    (void)state;
    assert_int_equal(largest_step_beside_decodes(0), 32);
    assert_int_equal(largest_step_beside_decodes((fault_set)1 << FAULT_CHUNK_IGNORES_BUDGET), 35);
}

// ---- tp-allreduce-one-way -----------------------------------------------------------------

// One decode row at tp 2: 2 all-reduces per layer, each sending 2 (N - 1) / N
// x dim x 4 bytes from every shard (256 for tiny); the fault counts half.
static void decode_allreduce(fault_set faults, int* n_allreduces, uint64_t* bytes) {
    fault_set previous = fault_install(faults);
    engine_config c = engine_config_default();
    c.kv_dtype = KV_F32;
    c.num_blocks = 16;
    c.n_threads = 1;
    c.tp_shards = 2;
    engine e;
    error_info err = {{0}};
    if (engine_init(&e, &tiny, &c, &err)) fail_msg("engine_init: %s", err.message);
    int32_t prompt[4] = {TOK_BOS_ID, 40, 41, 42};
    request_params p = {prompt, 4, 3, 1, 0.0f, 0.9f, 1, 0.0, true};
    if (engine_add_request(&e, &p, NULL, &err)) fail_msg("add_request: %s", err.message);
    const step_record* r;
    if (engine_step(&e, &r, &err) || engine_step(&e, &r, &err)) fail_msg("engine_step: %s", err.message);
    assert_int_equal(r->decode_tokens, 1);
    *n_allreduces = r->n_allreduces;
    *bytes = r->allreduce_bytes;
    engine_free(&e);
    fault_install(previous);
}

static void test_tp_allreduce_one_way_counts_half(void** state) {
    (void)state;
    int n_normal = 0, n_faulty = 0;
    uint64_t normal = 0, faulty = 0;
    decode_allreduce(0, &n_normal, &normal);
    decode_allreduce((fault_set)1 << FAULT_TP_ALLREDUCE_ONE_WAY, &n_faulty, &faulty);
    const uint64_t per_allreduce = 2 * (2 - 1) * (uint64_t)tiny.config.dim * sizeof(float) / 2;
    assert_int_equal(n_normal, 2 * tiny.config.n_layers);
    assert_int_equal(n_faulty, n_normal);
    assert_int_equal(normal, (uint64_t)n_normal * per_allreduce);
    assert_int_equal(faulty, normal / 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_evict_most_recent_takes_the_newest_cached_block),
        cmocka_unit_test(test_preempt_oldest_takes_the_first_admitted),
        cmocka_unit_test(test_recompute_extra_token_repeats_the_last_token),
        cmocka_unit_test(test_chunk_ignores_budget_goes_over_it),
        cmocka_unit_test(test_tp_allreduce_one_way_counts_half),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
