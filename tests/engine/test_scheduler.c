// The scheduler on a bare pool, without a model: admission by free blocks
// (with the watermark and max_seqs), chunked prefill under the token
// budget, preemption by recompute, and static against continuous batching.
// A step here is schedule, then a made-up sample for every logit row, then
// postprocess: the scheduler's rules are all that runs.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdbool.h>
#include <string.h>

#include "engine/fault.h"
#include "engine/scheduler.h"
#include "tests/test_support.h"

enum { MAX_PROMPT = 64, TOKEN = 7 };

typedef struct harness {
    model_config shape; // only its KV shape matters: the pool's block bytes
    kv_pool pool;
    kv_contiguous contiguous;
    scheduler sched;
    step_batch batch;
    int n_requests;
} harness;

static scheduler_config policy(int max_seqs, int max_batched_tokens, bool chunked_prefill, int watermark_blocks) {
    return (scheduler_config){BATCHING_CONTINUOUS, max_seqs, max_batched_tokens, chunked_prefill, watermark_blocks,
                              MAX_PROMPT * 2};
}

static void shape(harness* h) {
    memset(h, 0, sizeof *h);
    h->shape = (model_config){.dim = 8, .hidden_dim = 16, .n_layers = 1, .n_heads = 2, .n_kv_heads = 2,
                              .vocab_size = 32, .max_seq_len = MAX_PROMPT * 2};
    error_info err = {{0}};
    assert_int_equal(model_config_validate(&h->shape, "scheduler test", &err), 0);
}

static void start_paged(harness* h, int n_blocks, int block_size, scheduler_config config) {
    shape(h);
    error_info err = {{0}};
    assert_int_equal(kv_pool_init(&h->pool, &h->shape, KV_F32, n_blocks, block_size, &err), 0);
    block_manager kv;
    assert_int_equal(block_manager_init_paged(&kv, &h->pool, false, &err), 0);
    assert_int_equal(scheduler_init(&h->sched, &config, &kv, &err), 0);
}

static void stop(harness* h) {
    scheduler_free(&h->sched);
    step_batch_free(&h->batch);
    kv_pool_free(&h->pool);
    kv_contiguous_free(&h->contiguous);
}

// Queues a request of n_prompt tokens (distinct per request) that generates max_new tokens.
static int32_t add(harness* h, int n_prompt, int max_new) {
    int32_t prompt[MAX_PROMPT];
    for (int i = 0; i < n_prompt; i++) prompt[i] = (h->n_requests * 31 + i) % h->shape.vocab_size;
    error_info err = {{0}};
    sequence* s = scheduler_new_sequence(&h->sched, &err);
    assert_non_null(s);
    assert_int_equal(sequence_init(s, h->sched.n_sequences, h->n_requests++, prompt, n_prompt, max_new,
                                   h->shape.max_seq_len, &err),
                     0);
    int32_t id = s->id;
    scheduler_add_waiting(&h->sched);
    return id;
}

// One step: schedule, sample TOKEN for every row that wants logits, postprocess.
static const step_batch* step(harness* h) {
    error_info err = {{0}};
    assert_int_equal(scheduler_schedule(&h->sched, &h->batch, &err), 0);
    for (int i = 0; i < h->batch.n_logit_rows; i++) h->batch.sampled[i] = (sampled_token){TOKEN, false, STOP_EOS};
    assert_int_equal(scheduler_postprocess(&h->sched, &h->batch, 0.0, &err), 0);
    assert_int_equal(kv_pool_validate(&h->pool, &err), 0);
    return &h->batch;
}

static const sequence* seq(const harness* h, int32_t id) { return &h->sched.sequences[id]; }

// ---- admission ---------------------------------------------------------------------------

// First come first served while the pool has blocks for the prompt (plus
// the watermark once something runs), and under max_seqs.
static void test_admission_by_free_blocks(void** state) {
    (void)state;
    harness h;
    // 8 blocks of 4: prompts of 10 tokens take 3 blocks each, so two fit.
    start_paged(&h, 8, 4, policy(8, 512, true, 0));
    for (int k = 0; k < 3; k++) add(&h, 10, 4);
    const step_batch* b = step(&h);
    assert_int_equal(b->n_items, 2);
    assert_int_equal(b->items[0].id, 0);
    assert_int_equal(b->items[1].id, 1);
    assert_int_equal(b->items[0].phase, PHASE_PREFILL);
    assert_int_equal(b->items[0].n_tokens, 10);
    assert_int_equal(h.sched.n_waiting, 1);
    assert_int_equal(h.sched.waiting[0], 2);
    assert_int_equal(h.pool.n_free, 2);
    stop(&h);

    // The watermark: 6 blocks and 1 kept free once one runs: the second
    // prompt's 3 blocks + 1 > the 3 left, so it waits.
    start_paged(&h, 6, 4, policy(8, 512, true, 1));
    add(&h, 10, 4);
    add(&h, 10, 4);
    b = step(&h);
    assert_int_equal(b->n_items, 1);
    assert_int_equal(h.sched.n_waiting, 1);
    stop(&h);

    // max_seqs 1: one runs, however many blocks are free.
    start_paged(&h, 64, 4, policy(1, 512, true, 0));
    add(&h, 10, 4);
    add(&h, 10, 4);
    b = step(&h);
    assert_int_equal(b->n_items, 1);
    assert_int_equal(h.sched.n_running, 1);
    stop(&h);
}

// ---- chunked prefill ---------------------------------------------------------------------

// A 20-token prompt under an 8-token budget, beside a running decode that
// takes its one token first, prefills in chunks of 7, 7 and 6; only the
// last chunk's last row wants logits.
static void test_chunked_prefill(void** state) {
    (void)state;
    harness h;
    start_paged(&h, 64, 4, policy(8, 8, true, 0));
    int32_t a = add(&h, 3, 8);
    step(&h); // a's prompt, and its first token
    int32_t b_id = add(&h, 20, 4);
    int done = 0; // a's decode token leaves 7 of the 8: b prefills 7, 7, then the last 6
    for (int k = 0; k < 3; k++) {
        const step_batch* b = step(&h);
        assert_int_equal(b->n_items, 2);
        assert_int_equal(b->items[0].id, a);
        assert_int_equal(b->items[0].phase, PHASE_DECODE);
        assert_int_equal(b->items[1].id, b_id);
        assert_int_equal(b->items[1].phase, PHASE_PREFILL);
        int chunk = k < 2 ? 7 : 6;
        assert_int_equal(b->items[1].n_tokens, chunk);
        assert_int_equal(b->forward.n_rows, 1 + chunk);
        // Rows of the chunk sit at consecutive positions after what is cached,
        // and their KV goes to the slot their block table gives them.
        int decode_position = b->rows[0].position;
        assert_int_equal(b->slot_mapping[0],
                         seq(&h, a)->block_table[decode_position / 4] * 4 + decode_position % 4);
        const int32_t* table = seq(&h, b_id)->block_table;
        for (int t = 0; t < chunk; t++) {
            int position = done + t;
            assert_int_equal(b->rows[1 + t].position, position);
            assert_int_equal(b->slot_mapping[1 + t], table[position / 4] * 4 + position % 4);
        }
        assert_int_equal(b->n_logit_rows, k < 2 ? 1 : 2); // a's decode; b's only at its end
        done += chunk;
        if (done >= 20) break;
    }
    assert_int_equal(seq(&h, b_id)->n_computed, 20);
    assert_int_equal(seq(&h, b_id)->state, SEQ_DECODE);
    stop(&h);
}

// The paged-wrong-slot fault is made in the slot mapping: a prompt's last
// token (the one that wants logits) maps one slot short inside its tail
// block; one in its block's first slot, and every other row, keeps its slot.
static void test_paged_wrong_slot_fault_shifts_the_newest_slot(void** state) {
    (void)state;
    harness h;
    start_paged(&h, 64, 4, policy(8, 64, false, 0));
    int32_t in_tail = add(&h, 6, 4);     // last position 5: offset 1 of its second block
    int32_t block_start = add(&h, 5, 4); // last position 4: offset 0 of its second block
    fault_set previous = fault_install((fault_set)1 << FAULT_PAGED_WRONG_SLOT);
    const step_batch* b = step(&h);
    fault_install(previous);
    assert_int_equal(b->forward.n_rows, 11);
    assert_ptr_equal(b->forward.slot_mapping, b->slot_mapping);
    for (int r = 0; r < b->forward.n_rows; r++) {
        const batch_row* row = &b->rows[r];
        const int32_t* table = seq(&h, row->sequence == 0 ? in_tail : block_start)->block_table;
        int32_t exact = table[row->position / 4] * 4 + row->position % 4;
        bool shifted = row->sequence == 0 && row->position == 5;
        assert_int_equal(b->slot_mapping[r], shifted ? exact - 1 : exact);
    }
    stop(&h);
}

// ---- preemption by recompute ---------------------------------------------------------------

// 4 blocks of 4, two prompts of 7 (2 blocks each) fill the pool. When the
// first crosses into a third block, the latest admitted is preempted: its
// blocks go back, it keeps its tokens and waits at the front, and once
// blocks are free it computes all of them again as a prefill.
static void test_preemption_by_recompute(void** state) {
    (void)state;
    harness h;
    start_paged(&h, 4, 4, policy(8, 512, true, 0));
    int32_t first = add(&h, 7, 3);
    int32_t latest = add(&h, 7, 20);
    step(&h); // both prefill; 8 tokens each (7 + 1 sampled)
    assert_int_equal(h.pool.n_free, 0);
    const step_batch* b = step(&h); // both decode position 7: the last slot of block 1
    assert_int_equal(b->n_preempted, 0);
    b = step(&h); // position 8 needs a third block each: none free
    assert_int_equal(b->n_preempted, 1);
    assert_int_equal(h.sched.total_preemptions, 1);
    assert_int_equal(b->n_items, 1);
    assert_int_equal(b->items[0].id, first);
    const sequence* victim = seq(&h, latest);
    assert_int_equal(victim->state, SEQ_PREEMPTED);
    assert_int_equal(victim->n_computed, 0);
    assert_int_equal(victim->n_table, 0);
    assert_int_equal(victim->n_tokens, 9); // its tokens stay: 7 prompt + 2 sampled
    assert_int_equal(victim->n_preemptions, 1);
    assert_int_equal(h.sched.waiting[0], latest);
    // The first finishes (3 new tokens), then the victim is admitted again
    // and recomputes its 9 tokens in one prefill.
    int guard = 0;
    while (seq(&h, first)->state != SEQ_FINISHED && guard++ < 10) step(&h);
    assert_int_equal(seq(&h, first)->stop, STOP_LENGTH);
    bool recomputed = false;
    for (guard = 0; guard < 4 && !recomputed; guard++) {
        b = step(&h);
        for (int i = 0; i < b->n_items; i++)
            if (b->items[i].id == latest) {
                assert_int_equal(b->items[i].phase, PHASE_PREFILL);
                assert_int_equal(b->items[i].n_tokens, 9);
                recomputed = true;
            }
    }
    assert_true(recomputed);
    stop(&h);
}

// ---- static against continuous batching -----------------------------------------------------

// Runs 6 requests (request k generates 2 + k tokens) with max_seqs 4 to the end. Returns the
// step at which request 4 was first admitted, and whether any sequence was
// admitted while others were running.
static int run_batching(batching_policy batching, bool* admitted_while_running) {
    harness h;
    scheduler_config config = policy(4, 512, true, 0);
    config.batching = batching;
    start_paged(&h, 64, 4, config);
    for (int k = 0; k < 6; k++) add(&h, 5, 2 + k);
    int fifth_admitted = -1;
    *admitted_while_running = false;
    for (int n = 1; n <= 40 && scheduler_has_work(&h.sched); n++) {
        int running_before = h.sched.n_running;
        int waiting_before = h.sched.n_waiting;
        step(&h);
        bool admitted = h.sched.n_waiting < waiting_before;
        if (admitted && running_before > 0) *admitted_while_running = true;
        if (fifth_admitted < 0 && seq(&h, 4)->state != SEQ_WAITING) fifth_admitted = n;
    }
    assert_false(scheduler_has_work(&h.sched));
    assert_int_equal(h.sched.n_finished, 6);
    stop(&h);
    return fifth_admitted;
}

// Static batching admits a batch only into an empty engine: request 4 waits
// until the longest of the first four (5 new tokens) has finished.
// Continuous batching admits it as soon as the shortest (2) has.
static void test_static_against_continuous_batching(void** state) {
    (void)state;
    bool static_mixed, continuous_mixed;
    int static_fifth = run_batching(BATCHING_STATIC, &static_mixed);
    int continuous_fifth = run_batching(BATCHING_CONTINUOUS, &continuous_mixed);
    assert_false(static_mixed);
    assert_true(continuous_mixed);
    // Static: step 1 prefills the four and samples their first tokens, the
    // longest has its 5th at step 5, so request 4 is admitted at step 6.
    assert_int_equal(static_fifth, 6);
    // Continuous: the shortest finishes at step 2, request 4 is admitted at step 3.
    assert_int_equal(continuous_fifth, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admission_by_free_blocks),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_paged_wrong_slot_fault_shifts_the_newest_slot),
        cmocka_unit_test(test_preemption_by_recompute),
        cmocka_unit_test(test_static_against_continuous_batching),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
