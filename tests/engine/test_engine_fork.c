// engine_fork_sequence: a running sequence forked mid-decode shares every
// block with its child, the first write into the shared tail copies it, and
// the outputs equal runs without the fork (greedy child) or diverge from the
// parent (sampled child). Contiguous forks recompute. On the synthetic preset
// tiny (no model file), through the public engine API.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <string.h>

#include "engine/engine.h"
#include "engine/model_synth.h"
#include "tests/test_support.h"

enum { NEW_TOKENS = 40, FORK_AFTER = 10, MAX_IDS = 64 };

// BOS and four ids ("Once upon a time" in tok512, the vocabulary of 512
// the synthetic model is made with).
static const int32_t PROMPT[] = {1, 403, 407, 261, 378};
static const int N_PROMPT = 5;

typedef struct fork_run {
    int32_t parent_tokens[MAX_IDS]; // (n_parent) generated ids of the parent
    int n_parent;
    int32_t child_tokens[MAX_IDS];  // (n_child) generated ids of the child, from the fork on
    int n_child;
    int shared_blocks_at_fork;      // table entries of the child equal to the parent's right after the fork
    int parent_blocks_at_fork;
    uint64_t copy_bytes;            // copy-on-write bytes over the whole run
    bool child_waited;              // the child was queued instead of sharing
} fork_run;

// The preset tiny (2 layers, kv_dim 32) with fp32 weights and tok512's 512 ids.
static void load_model(model* m) {
    error_info err = {{0}};
    if (model_synthesize(m, "tiny", 512, MODEL_DTYPE_FP32, SYNTH_DEFAULT_SEED, &err))
        fail_msg("model_synthesize: %s", err.message);
}

static engine_config fork_config(kv_layout layout) {
    engine_config c = engine_config_default();
    c.layout = layout;
    c.kv_dtype = KV_F32;
    c.num_blocks = 64;
    c.block_size = 16;
    c.n_threads = 1;
    return c;
}

static void copy_generated(const sequence* s, int32_t* out, int* n) {
    *n = s->n_tokens - s->n_prompt;
    memcpy(out, s->tokens + s->n_prompt, (size_t)*n * sizeof *out);
}

// One greedy request; when fork_temperature >= 0, sequence 0 is forked after
// FORK_AFTER new tokens. Runs until everything finishes.
static void run(const model* m, kv_layout layout, float fork_temperature, fork_run* out) {
    memset(out, 0, sizeof *out);
    engine_config c = fork_config(layout);
    engine e;
    error_info err = {{0}};
    assert_int_equal(engine_init(&e, m, &c, &err), 0);
    request_params p = {PROMPT, N_PROMPT, NEW_TOKENS, 1, 0.0f, 0.9f, 11, 0.0, true};
    int32_t parent = -1, child = -1;
    assert_int_equal(engine_add_request(&e, &p, &parent, &err), 0);
    const step_record* r = NULL;
    while (engine_has_work(&e)) {
        assert_int_equal(engine_step(&e, &r, &err), 0);
        out->copy_bytes += r->copy_bytes;
        const sequence* s = test_sequence(&e, parent);
        if (fork_temperature >= 0 && child < 0 && s->n_tokens - s->n_prompt == FORK_AFTER) {
            assert_int_equal(engine_fork_sequence(&e, parent, fork_temperature, 99, &child, &err), 0);
            s = test_sequence(&e, parent);
            const sequence* k = test_sequence(&e, child);
            assert_int_equal(k->request_id, s->request_id);
            assert_int_equal(k->sample_index, 1);
            assert_int_equal(k->n_tokens, s->n_tokens);
            assert_memory_equal(k->tokens, s->tokens, (size_t)s->n_tokens * sizeof(int32_t));
            out->child_waited = k->state == SEQ_WAITING;
            out->parent_blocks_at_fork = s->n_table;
            for (int i = 0; i < k->n_table && i < s->n_table; i++)
                out->shared_blocks_at_fork += k->block_table[i] == s->block_table[i];
        }
    }
    copy_generated(test_sequence(&e, parent), out->parent_tokens, &out->n_parent);
    if (child >= 0) {
        const sequence* k = test_sequence(&e, child);
        assert_int_equal(k->stop, STOP_LENGTH);
        copy_generated(k, out->child_tokens, &out->n_child);
    }
    engine_free(&e);
}

static void test_greedy_fork_shares_blocks_and_matches_the_unforked_run(void** state) {
    (void)state;
    model m;
    load_model(&m);
    fork_run base, forked;
    run(&m, KV_LAYOUT_PAGED, -1.0f, &base);
    run(&m, KV_LAYOUT_PAGED, 0.0f, &forked);
    assert_int_equal(base.n_parent, NEW_TOKENS);
    // 5 prompt + 10 new tokens: one block of 16, partly filled, in both tables.
    assert_int_equal(forked.parent_blocks_at_fork, 1);
    assert_int_equal(forked.shared_blocks_at_fork, 1);
    assert_false(forked.child_waited);
    // Both wrote into the shared tail: the first writer copied its filled
    // slots (the 14 computed tokens; the 15th is computed after the fork) as
    // fp32 keys and values: 2 x n_layers x 14 slots x kv_dim x 4 bytes.
    const uint64_t copied_slots = N_PROMPT + FORK_AFTER - 1;
    const uint64_t layers = (uint64_t)m.config.n_layers, kv_dim = (uint64_t)m.config.kv_dim;
    assert_int_equal(forked.copy_bytes, 2u * layers * copied_slots * kv_dim * 4);
    assert_int_equal(base.copy_bytes, 0);
    // Greedy child and parent both continue exactly as the unforked run.
    assert_int_equal(forked.n_parent, NEW_TOKENS);
    assert_memory_equal(forked.parent_tokens, base.parent_tokens, NEW_TOKENS * sizeof(int32_t));
    assert_int_equal(forked.n_child, NEW_TOKENS);
    assert_memory_equal(forked.child_tokens, base.parent_tokens, NEW_TOKENS * sizeof(int32_t));
    model_free(&m);
}

static void test_sampled_fork_diverges_from_its_parent(void** state) {
    (void)state;
    model m;
    load_model(&m);
    fork_run base, forked;
    run(&m, KV_LAYOUT_PAGED, -1.0f, &base);
    run(&m, KV_LAYOUT_PAGED, 1.0f, &forked);
    // The parent is unaffected by its child's writes (copy-on-write).
    assert_memory_equal(forked.parent_tokens, base.parent_tokens, NEW_TOKENS * sizeof(int32_t));
    // The child shares the first FORK_AFTER tokens, then samples its own.
    assert_memory_equal(forked.child_tokens, base.parent_tokens, FORK_AFTER * sizeof(int32_t));
    assert_memory_not_equal(forked.child_tokens + FORK_AFTER, base.parent_tokens + FORK_AFTER,
                            (NEW_TOKENS - FORK_AFTER) * sizeof(int32_t));
    assert_true(forked.copy_bytes > 0);
    model_free(&m);
}

static void test_contiguous_fork_recomputes_and_matches(void** state) {
    (void)state;
    model m;
    load_model(&m);
    fork_run base, forked;
    run(&m, KV_LAYOUT_PAGED, -1.0f, &base);
    run(&m, KV_LAYOUT_CONTIGUOUS, 0.0f, &forked);
    assert_true(forked.child_waited); // private memory: nothing to share
    assert_int_equal(forked.shared_blocks_at_fork, 0);
    assert_int_equal(forked.copy_bytes, 0);
    assert_memory_equal(forked.parent_tokens, base.parent_tokens, NEW_TOKENS * sizeof(int32_t));
    assert_int_equal(forked.n_child, NEW_TOKENS);
    assert_memory_equal(forked.child_tokens, base.parent_tokens, NEW_TOKENS * sizeof(int32_t));
    model_free(&m);
}

static void test_fork_rejects_bad_and_finished_sequences(void** state) {
    (void)state;
    model m;
    load_model(&m);
    engine_config c = fork_config(KV_LAYOUT_PAGED);
    engine e;
    error_info err = {{0}};
    assert_int_equal(engine_init(&e, &m, &c, &err), 0);
    int32_t child = -1;
    assert_int_not_equal(engine_fork_sequence(&e, 0, 0.0f, 1, &child, &err), 0);
    assert_non_null(strstr(err.message, "no sequence 0"));
    request_params p = {PROMPT, N_PROMPT, 2, 1, 0.0f, 0.9f, 11, 0.0, true};
    int32_t id = -1;
    assert_int_equal(engine_add_request(&e, &p, &id, &err), 0);
    const step_record* r = NULL;
    while (engine_has_work(&e)) assert_int_equal(engine_step(&e, &r, &err), 0);
    assert_int_not_equal(engine_fork_sequence(&e, id, 0.0f, 1, &child, &err), 0);
    assert_non_null(strstr(err.message, "finished"));
    assert_int_equal(child, -1);
    engine_free(&e);
    model_free(&m);
}

// A fork whose sampler cannot be made (here a negative temperature; out of
// memory fails at the same point) leaves no child behind: no new id, no
// live sequence outside the queues. The next fork takes the id, and both
// run to the end.
static void test_failed_fork_leaves_no_child(void** state) {
    (void)state;
    model m;
    load_model(&m);
    engine_config c = fork_config(KV_LAYOUT_PAGED);
    engine e;
    error_info err = {{0}};
    assert_int_equal(engine_init(&e, &m, &c, &err), 0);
    request_params p = {PROMPT, N_PROMPT, 8, 1, 0.0f, 0.9f, 11, 0.0, true};
    int32_t parent = -1;
    assert_int_equal(engine_add_request(&e, &p, &parent, &err), 0);
    const step_record* r = NULL;
    assert_int_equal(engine_step(&e, &r, &err), 0); // the prompt: the parent now decodes
    int32_t child = -1;
    assert_int_not_equal(engine_fork_sequence(&e, parent, -1.0f, 99, &child, &err), 0);
    assert_non_null(strstr(err.message, "--temperature"));
    assert_int_equal(child, -1);
    assert_int_equal(engine_live_sequences(&e), 1);
    assert_null(test_sequence(&e, parent + 1));
    assert_int_equal(engine_fork_sequence(&e, parent, 0.0f, 99, &child, &err), 0);
    assert_int_equal(child, parent + 1);
    while (engine_has_work(&e)) assert_int_equal(engine_step(&e, &r, &err), 0);
    assert_int_equal(test_sequence(&e, parent)->n_tokens - N_PROMPT, 8);
    assert_int_equal(test_sequence(&e, child)->n_tokens - N_PROMPT, 8);
    engine_free(&e);
    model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_fork_shares_blocks_and_matches_the_unforked_run),
        cmocka_unit_test(test_sampled_fork_diverges_from_its_parent),
        cmocka_unit_test(test_contiguous_fork_recomputes_and_matches),
        cmocka_unit_test(test_fork_rejects_bad_and_finished_sequences),
        cmocka_unit_test(test_failed_fork_leaves_no_child),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
