// engine_release_sequence on the synthetic preset tiny (no model file
// needed; the requests ignore EOS, so the weights do not matter): a finished (or cancelled)
// sequence's memory is freed, its id stays taken and is refused afterwards,
// a waiting or running one is refused, and the step records and the outputs
// of the other sequences are those of a run without releases. The step
// record's window (queues, live sequences, block states, tail waste) says
// what the engine holds after every step, and through engine_view() between
// steps. Under ASan (make check) LeakSanitizer also proves that engine_free
// frees a mix of released and unreleased sequences exactly once.
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

enum { NEW_TOKENS = 24, N_REQUESTS = 6, MAX_STEPS = 400 };

// Five ids of tiny's 512-entry vocabulary, BOS first.
static const int32_t PROMPT[] = {1, 403, 407, 261, 378};
static const int N_PROMPT = 5;

static void load_model(model* m) {
    error_info err = {{0}};
    assert_int_equal(model_synthesize(m, "tiny", 512, MODEL_DTYPE_FP32, SYNTH_DEFAULT_SEED, &err), 0);
}

static void start(engine* e, const model* m) {
    engine_config c = engine_config_default();
    c.kv_dtype = KV_F32;
    c.num_blocks = 64;
    c.block_size = 16;
    c.n_threads = 1;
    error_info err = {{0}};
    assert_int_equal(engine_init(e, m, &c, &err), 0);
}

// Request k: greedy, max_tokens NEW_TOKENS - k so that they finish at different steps.
static void add_requests(engine* e) {
    error_info err = {{0}};
    for (int k = 0; k < N_REQUESTS; k++) {
        request_params p = {PROMPT, N_PROMPT, NEW_TOKENS - k, 1, 0.0f, 1.0f, 7, 0.0, true};
        int32_t id = -1;
        assert_int_equal(engine_add_request(e, &p, &id, &err), 0);
        assert_int_equal(id, k);
    }
}

// What a run records per step, to compare a run with releases against one without.
typedef struct step_digest {
    int n_sequences, n_running, n_waiting, n_finished, n_finished_now, blocks_free, blocks_used;
    int64_t slots_used;
} step_digest;

// A record's queues and live sequences (a step's, engine_view's or a
// reader's engine_snapshot) must be the engine's own. Returns the tail
// waste of the running ones.
static int64_t check_queues_window(const engine* e, const step_record* r) {
    const scheduler* now = &e->scheduler; // the engine's own state, which the record must match
    assert_int_equal(r->n_waiting, now->n_waiting);
    assert_int_equal(r->n_running, now->n_running);
    for (int i = 0; i < now->n_waiting; i++) assert_int_equal(r->waiting_ids[i], now->waiting[i]);
    for (int i = 0; i < now->n_running; i++) assert_int_equal(r->running_ids[i], now->running[i]);
    assert_int_equal(r->n_live_sequences, engine_live_sequences(e));
    assert_int_equal(r->n_sequence_ids, now->n_sequences);
    int64_t running_tail_waste = 0;
    for (int i = 0, id = 0; i < r->n_live_sequences; i++, id++) {
        const step_sequence_status* q = &r->live_sequences[i];
        while (!test_sequence(e, id)) id++; // released ids are left out
        const sequence* s = test_sequence(e, id);
        assert_int_equal(q->id, id);
        assert_int_equal(q->state, s->state);
        assert_int_equal(q->n_tokens, s->n_tokens);
        assert_int_equal(q->n_prompt, s->n_prompt);
        assert_ptr_equal(q->tokens, s->tokens);
        // Past the computed tokens when decoding (the sampled token holds no
        // slot yet), past the whole prompt while it prefills in chunks.
        int holding = s->state == SEQ_DECODE ? s->n_computed : s->n_tokens;
        int64_t tail = (int64_t)s->n_table * e->config.block_size - holding;
        assert_int_equal(q->tail_waste_slots, tail > 0 ? tail : 0);
        assert_in_range(q->tail_waste_slots, 0, e->config.block_size - 1);
        if (s->state == SEQ_PREFILL || s->state == SEQ_DECODE) running_tail_waste += q->tail_waste_slots;
    }
    return running_tail_waste;
}

// The record is the window into the engine: its queues, live sequences,
// block states and tail waste must say what the engine holds after the step.
static void check_record_window(const engine* e, const step_record* r) {
    assert_int_equal(check_queues_window(e, r), r->tail_waste_slots);
    for (int i = 0; i < r->n_sequences; i++)
        assert_in_range(r->sequences[i].tail_waste_slots, 0, e->config.block_size - 1);
    int counts[4] = {0};
    assert_int_equal(r->blocks_total, e->pool.n_blocks);
    for (int b = 0; b < r->blocks_total; b++) {
        const kv_block* k = &e->pool.blocks[b];
        const step_block* seen = &r->blocks[b];
        assert_int_equal(seen->ref_count, k->ref_count);
        assert_int_equal(seen->n_filled, k->n_filled);
        int owners = k->ref_count - (k->cached ? 1 : 0);
        block_state expected = k->ref_count == 0 ? BLOCK_STATE_FREE
                               : owners == 0     ? BLOCK_STATE_CACHED
                               : owners > 1      ? BLOCK_STATE_SHARED
                                                 : BLOCK_STATE_USED;
        assert_int_equal(seen->state, expected);
        counts[seen->state]++;
    }
    assert_int_equal(counts[BLOCK_STATE_FREE], r->blocks_free);
    assert_int_equal(counts[BLOCK_STATE_CACHED], r->blocks_cached);
    assert_int_equal(counts[BLOCK_STATE_USED] + counts[BLOCK_STATE_SHARED], r->blocks_used);
}

// Runs to the end; with `release`, every sequence is released as soon as a
// step finishes it. Fills digests (one per step) and each sequence's output.
static int run(const model* m, bool release, step_digest* digests, int32_t outputs[N_REQUESTS][NEW_TOKENS]) {
    engine e;
    start(&e, m);
    add_requests(&e);
    error_info err = {{0}};
    int steps = 0;
    while (engine_has_work(&e) && steps < MAX_STEPS) {
        const step_record* r = NULL;
        assert_int_equal(engine_step(&e, &r, &err), 0);
        check_record_window(&e, r);
        digests[steps] = (step_digest){r->n_sequences,    r->n_running,   r->n_waiting,   r->n_finished,
                                       r->n_finished_now, r->blocks_free, r->blocks_used, r->slots_used};
        for (int i = 0; i < r->n_finished_now; i++) {
            int32_t id = r->finished_ids[i];
            const sequence* s = test_sequence(&e, id);
            assert_non_null(s);
            assert_int_equal(s->n_tokens - s->n_prompt, NEW_TOKENS - id);
            memcpy(outputs[id], s->tokens + s->n_prompt, (size_t)(s->n_tokens - s->n_prompt) * sizeof(int32_t));
            if (release) {
                assert_int_equal(engine_release_sequence(&e, id, &err), 0);
                assert_null(test_sequence(&e, id));
            }
        }
        steps++;
    }
    assert_false(engine_has_work(&e));
    assert_int_equal(engine_live_sequences(&e), release ? 0 : N_REQUESTS);
    assert_int_equal(e.pool.n_free + e.pool.n_evictable, e.pool.n_blocks);
    engine_free(&e);
    return steps;
}

// Releasing as sequences finish changes neither the step records nor what the others generate.
static void test_release_keeps_records_and_outputs(void** state) {
    (void)state;
    model m;
    load_model(&m);
    static step_digest plain[MAX_STEPS], released[MAX_STEPS];
    static int32_t plain_out[N_REQUESTS][NEW_TOKENS], released_out[N_REQUESTS][NEW_TOKENS];
    int n_plain = run(&m, false, plain, plain_out);
    int n_released = run(&m, true, released, released_out);
    assert_int_equal(n_plain, n_released);
    assert_true(n_plain >= NEW_TOKENS); // the longest request decodes NEW_TOKENS times
    for (int i = 0; i < n_plain; i++) {
        assert_int_equal(plain[i].n_sequences, released[i].n_sequences);
        assert_int_equal(plain[i].n_running, released[i].n_running);
        assert_int_equal(plain[i].n_waiting, released[i].n_waiting);
        assert_int_equal(plain[i].n_finished, released[i].n_finished);
        assert_int_equal(plain[i].n_finished_now, released[i].n_finished_now);
        assert_int_equal(plain[i].blocks_free, released[i].blocks_free);
        assert_int_equal(plain[i].blocks_used, released[i].blocks_used);
        assert_int_equal(plain[i].slots_used, released[i].slots_used);
    }
    for (int k = 0; k < N_REQUESTS; k++)
        assert_memory_equal(plain_out[k], released_out[k], (size_t)(NEW_TOKENS - k) * sizeof(int32_t));
    model_free(&m);
}

// Waiting and running sequences are refused, a cancelled one is released,
// a released id is refused twice, a released id's slot is reused by the
// next sequence (so a server's table stays as large as what it holds at
// once), unknown ids refused.
static void test_release_refuses_and_ids_stay_unique(void** state) {
    (void)state;
    model m;
    load_model(&m);
    engine e;
    start(&e, &m);
    add_requests(&e);
    error_info err = {{0}};
    assert_int_equal(engine_live_sequences(&e), N_REQUESTS);
    // Before any step, the view already lists the queued requests.
    const step_record* view = engine_view(&e);
    assert_non_null(view);
    assert_int_equal(view->step, 0);
    assert_int_equal(view->n_waiting, N_REQUESTS);
    assert_int_equal(view->n_live_sequences, N_REQUESTS);
    for (int k = 0; k < N_REQUESTS; k++) {
        assert_int_equal(view->waiting_ids[k], k);
        assert_int_equal(view->live_sequences[k].state, SEQ_WAITING);
    }
    assert_int_equal(view->blocks_free, e.pool.n_blocks);

    // Waiting: refused, and it stays in the queue.
    assert_int_equal(engine_release_sequence(&e, 0, &err), -1);
    assert_non_null(strstr(err.message, "waiting"));
    assert_int_equal(e.scheduler.n_waiting, N_REQUESTS);

    const step_record* r = NULL;
    assert_int_equal(engine_step(&e, &r, &err), 0);
    const sequence* s0 = test_sequence(&e, 0);
    assert_true(s0->state == SEQ_PREFILL || s0->state == SEQ_DECODE);
    err.message[0] = '\0';
    assert_int_equal(engine_release_sequence(&e, 0, &err), -1);
    assert_non_null(strstr(err.message, "sequence 0"));
    assert_non_null(strstr(err.message, "cancel it first"));
    assert_non_null(test_sequence(&e, 0)); // refused: untouched

    // Cancelled: released, its blocks are already back, its id is gone for good.
    int free_before = e.pool.n_free + e.pool.n_evictable;
    assert_int_equal(engine_cancel_sequence(&e, 1, &err), 0);
    assert_true(e.pool.n_free + e.pool.n_evictable > free_before);
    // A reader's snapshot follows the cancel at once and leaves the engine's
    // record as the step wrote it.
    step_record snapshot = {0};
    assert_int_equal(engine_snapshot(&e, &snapshot), 0);
    check_queues_window(&e, &snapshot);
    assert_int_equal(snapshot.n_cancelled, 1);
    assert_int_equal(e.record.n_cancelled, 0);
    step_record_free(&snapshot);
    view = engine_view(&e); // between steps: the cancel shows, the step's own figures stay
    assert_int_equal(view->step, 1);
    assert_int_equal(view->n_cancelled, 1);
    assert_int_equal(view->live_sequences[1].state, SEQ_FINISHED);
    assert_int_equal(view->live_sequences[1].stop, STOP_CANCELLED);
    assert_int_equal(view->blocks_free + view->blocks_cached, e.pool.n_free + e.pool.n_evictable);
    check_record_window(&e, view);
    assert_int_equal(engine_release_sequence(&e, 1, &err), 0);
    assert_null(test_sequence(&e, 1));
    assert_int_equal(engine_live_sequences(&e), N_REQUESTS - 1);
    view = engine_view(&e);
    assert_int_equal(view->n_live_sequences, N_REQUESTS - 1);
    assert_int_equal(view->n_sequence_ids, N_REQUESTS);
    check_record_window(&e, view);
    assert_int_equal(engine_release_sequence(&e, 1, &err), -1);
    assert_non_null(strstr(err.message, "already released"));
    assert_int_equal(engine_cancel_sequence(&e, 1, &err), 0); // finished: still a no-op
    int32_t child = -1;
    assert_int_equal(engine_fork_sequence(&e, 1, 0.0f, 3, &child, &err), -1);

    // Unknown ids.
    assert_int_equal(engine_release_sequence(&e, -1, &err), -1);
    assert_int_equal(engine_release_sequence(&e, N_REQUESTS, &err), -1);
    assert_non_null(strstr(err.message, "no sequence"));
    assert_null(test_sequence(&e, N_REQUESTS));

    // A new request takes the released id 1 and no new slot; the next one a fresh id.
    request_params p = {PROMPT, N_PROMPT, 4, 1, 0.0f, 1.0f, 7, 0.0, true};
    int32_t id = -1;
    assert_int_equal(engine_add_request(&e, &p, &id, &err), 0);
    assert_int_equal(id, 1);
    assert_non_null(test_sequence(&e, 1));
    assert_int_equal(test_sequence(&e, 1)->state, SEQ_WAITING);
    view = engine_view(&e);
    assert_int_equal(view->n_sequence_ids, N_REQUESTS);
    assert_int_equal(view->n_live_sequences, N_REQUESTS);
    for (int k = 0; k < N_REQUESTS; k++) // live_sequences stays in id order
        assert_int_equal(view->live_sequences[k].id, k);
    assert_int_equal(engine_add_request(&e, &p, &id, &err), 0);
    assert_int_equal(id, N_REQUESTS);

    // Run to the end releasing everything; the pool comes back whole.
    int steps = 0;
    while (engine_has_work(&e) && steps++ < MAX_STEPS) {
        assert_int_equal(engine_step(&e, &r, &err), 0);
        for (int i = 0; i < r->n_finished_now; i++)
            assert_int_equal(engine_release_sequence(&e, r->finished_ids[i], &err), 0);
    }
    assert_false(engine_has_work(&e));
    assert_int_equal(engine_live_sequences(&e), 0);
    assert_int_equal(e.scheduler.n_released, N_REQUESTS + 2);
    assert_int_equal(e.pool.n_free + e.pool.n_evictable, e.pool.n_blocks);
    engine_free(&e);
    model_free(&m);
}

// Forked samples (n = 3): the parent can be released while its children still
// share its prompt blocks; they finish with their own outputs. Leaves one
// sequence unreleased so that engine_free frees a mix (ASan checks both).
static void test_release_parent_of_running_forks(void** state) {
    (void)state;
    model m;
    load_model(&m);
    engine e;
    start(&e, &m);
    error_info err = {{0}};
    request_params p = {PROMPT, N_PROMPT, 8, 3, 0.8f, 1.0f, 5, 0.0, true};
    int32_t parent = -1;
    assert_int_equal(engine_add_request(&e, &p, &parent, &err), 0);
    const step_record* r = NULL;
    assert_int_equal(engine_step(&e, &r, &err), 0); // prefill, then the two forks
    assert_int_equal(e.scheduler.n_sequences, 3);
    assert_int_equal(engine_cancel_sequence(&e, parent, &err), 0);
    assert_int_equal(engine_release_sequence(&e, parent, &err), 0);
    int steps = 0;
    while (engine_has_work(&e) && steps++ < MAX_STEPS)
        assert_int_equal(engine_step(&e, &r, &err), 0);
    for (int32_t id = 1; id <= 2; id++) {
        const sequence* s = test_sequence(&e, id);
        assert_non_null(s);
        assert_int_equal(s->state, SEQ_FINISHED);
        assert_int_equal(s->n_tokens - s->n_prompt, 8);
    }
    assert_int_equal(engine_release_sequence(&e, 1, &err), 0);
    assert_int_equal(engine_live_sequences(&e), 1);
    assert_int_equal(e.pool.n_free + e.pool.n_evictable, e.pool.n_blocks);
    engine_free(&e); // sequence 2 unreleased: freed here
    model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_release_keeps_records_and_outputs),
        cmocka_unit_test(test_release_refuses_and_ids_stay_unique),
        cmocka_unit_test(test_release_parent_of_running_forks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
