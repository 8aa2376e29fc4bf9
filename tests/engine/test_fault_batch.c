// The batching and parallelism faults (engine/fault.h) do the bug they
// name, measurably, and nothing else: static-batching makes "continuous"
// admission wait for an empty batch; unbatched-decode runs a step one row
// per forward() call, so the weights are counted once per row while the
// logits keep their bits (fp32 batch invariance); tp-full-weights hands
// every shard the whole feed-forward block, so each shard streams it in
// full while the sums stay right. Each test also runs without the fault, so
// that the same measurement shows the difference.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/fault.h"
#include "engine/model_synth.h"
#include "engine/tokenizer.h"
#include "tests/test_support.h"

#define MAX_REQUESTS 8
#define MAX_STEPS 256
#define VOCAB 259 // the byte-level vocabulary of the synthetic presets

// What one engine run produced and measured.
typedef struct batch_run {
    int steps;
    int max_running_while_admitting;    // the most sequences running when a later one was admitted
    uint64_t decode_weight_bytes[MAX_STEPS]; // (steps) weight bytes of each decode-only step, else 0
    int decode_rows[MAX_STEPS];         // (steps) decode rows of that step
    uint64_t prefill_weight_bytes;      // the first step's (all prompts), with prefill_rows rows
    int prefill_rows;
    uint64_t shard_weight_bytes[MAX_STEPS][MAX_TP_SHARDS]; // (steps, shards) each shard's weights of a decode-only step
    int hidden_size;                    // shard 0's hidden features (the model's without sharding)
    float* logits;                      // (MAX_REQUESTS, MAX_STEPS, VOCAB) each sampled token's logits
    int n_logits[MAX_REQUESTS];
    int32_t tokens[MAX_REQUESTS][MAX_STEPS];
    int n_tokens[MAX_REQUESTS];
} batch_run;

static void observe(void* user, int32_t id, int position, const float* logits, int vocab) {
    (void)position;
    batch_run* out = user;
    if (id >= MAX_REQUESTS || out->n_logits[id] >= MAX_STEPS) return;
    memcpy(out->logits + ((size_t)id * MAX_STEPS + (size_t)out->n_logits[id]) * VOCAB, logits,
           (size_t)vocab * sizeof(float));
    out->n_logits[id]++;
}

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

static engine_config test_config(void) {
    engine_config c = engine_config_default();
    c.kv_dtype = KV_F32;
    c.num_blocks = 128;
    c.n_threads = 1;
    c.max_seqs = 4;
    return c;
}

// n_requests greedy requests; request i has a prompt of 4 + 3 i tokens and
// 6 + 5 ((3 i) mod n_requests) new tokens (EOS ignored), so that every group
// of 4 in arrival order mixes short and long ones. All are queued before
// the first step, under `faults`.
static void run(const model* m, const engine_config* c, fault_set faults, int n_requests, batch_run* out) {
    memset(out, 0, sizeof *out);
    out->logits = calloc((size_t)MAX_REQUESTS * MAX_STEPS * VOCAB, sizeof(float));
    assert_non_null(out->logits);
    fault_set previous = fault_install(faults);
    engine e;
    error_info err = {{0}};
    if (engine_init(&e, m, c, &err)) fail_msg("engine_init: %s", err.message);
    engine_set_logits_observer(&e, observe, out);
    for (int i = 0; i < n_requests; i++) {
        int32_t prompt[32];
        int n_prompt = 4 + 3 * i;
        prompt[0] = TOK_BOS_ID;
        for (int t = 1; t < n_prompt; t++) prompt[t] = 3 + (t * 37 + i * 101) % (VOCAB - 3);
        request_params p = {prompt, n_prompt, 6 + 5 * ((3 * i) % n_requests), 1, 0.0f, 0.9f, 1, 0.0, true};
        if (engine_add_request(&e, &p, NULL, &err)) fail_msg("add_request: %s", err.message);
    }
    while (engine_has_work(&e)) {
        int running_before = e.scheduler.n_running, waiting_before = e.scheduler.n_waiting;
        const step_record* r;
        if (engine_step(&e, &r, &err)) fail_msg("engine_step: %s", err.message);
        assert_true(out->steps < MAX_STEPS);
        if (e.scheduler.n_waiting < waiting_before && running_before > out->max_running_while_admitting)
            out->max_running_while_admitting = running_before;
        if (out->steps == 0) {
            out->prefill_weight_bytes = r->traffic.weight_bytes_read;
            out->prefill_rows = r->prefill_tokens + r->decode_tokens;
        }
        if (r->prefill_tokens == 0 && r->decode_tokens > 0) {
            out->decode_weight_bytes[out->steps] = r->traffic.weight_bytes_read;
            out->decode_rows[out->steps] = r->decode_tokens;
            for (int k = 0; k < r->tp_shards && r->tp_shards > 1; k++)
                out->shard_weight_bytes[out->steps][k] = r->shard_traffic[k].weight_bytes_read;
        }
        out->steps++;
    }
    out->hidden_size = e.forward.shards[0].hidden_size;
    for (int id = 0; id < n_requests; id++) {
        const sequence* s = test_sequence(&e, id);
        out->n_tokens[id] = s->n_tokens - s->n_prompt;
        memcpy(out->tokens[id], s->tokens + s->n_prompt, (size_t)out->n_tokens[id] * sizeof(int32_t));
    }
    engine_free(&e);
    fault_install(previous);
}

static void free_run(batch_run* run_out) { free(run_out->logits); }

// The largest |a - b| over every logit of every request's steps, relative
// to the largest |b| of that step.
static double max_relative_difference(const batch_run* a, const batch_run* b, int n_requests) {
    double worst = 0;
    for (int id = 0; id < n_requests; id++) {
        assert_int_equal(a->n_logits[id], b->n_logits[id]);
        for (int step = 0; step < a->n_logits[id]; step++) {
            const float* x = a->logits + ((size_t)id * MAX_STEPS + (size_t)step) * VOCAB;
            const float* y = b->logits + ((size_t)id * MAX_STEPS + (size_t)step) * VOCAB;
            double largest = 0, difference = 0;
            for (int v = 0; v < VOCAB; v++) {
                if (fabs(y[v]) > largest) largest = fabs(y[v]);
                if (fabs((double)x[v] - y[v]) > difference) difference = fabs((double)x[v] - y[v]);
            }
            if (difference / largest > worst) worst = difference / largest;
        }
    }
    return worst;
}

// ---- static-batching --------------------------------------------------------------------------

// 8 requests of different lengths, at most 4 at a time. Continuous batching
// admits the fifth as soon as the first finishes, while 3 still run; under
// the fault it waits until all 4 have finished, which is static batching's
// schedule step for step.
static void test_static_batching_fault_waits_for_an_empty_batch(void** state) {
    (void)state;
    engine_config continuous = test_config(), static_batching = test_config();
    static_batching.batching = BATCHING_STATIC;
    batch_run normal, faulty, reference;
    run(&tiny, &continuous, 0, 8, &normal);
    run(&tiny, &continuous, (fault_set)1 << FAULT_STATIC_BATCHING, 8, &faulty);
    run(&tiny, &static_batching, 0, 8, &reference);
    print_message("steps: continuous %d, continuous under static-batching %d, static %d; most running at an "
                  "admission: %d, %d, %d\n",
                  normal.steps, faulty.steps, reference.steps, normal.max_running_while_admitting,
                  faulty.max_running_while_admitting, reference.max_running_while_admitting);
    assert_int_equal(normal.max_running_while_admitting, 3);
    assert_int_equal(faulty.max_running_while_admitting, 0);
    assert_int_equal(faulty.steps, reference.steps);
    assert_true(normal.steps < faulty.steps);
    // The same greedy tokens: the fault changes when requests run, not what they compute.
    for (int id = 0; id < 8; id++) {
        assert_int_equal(faulty.n_tokens[id], normal.n_tokens[id]);
        assert_memory_equal(faulty.tokens[id], normal.tokens[id], (size_t)normal.n_tokens[id] * sizeof(int32_t));
    }
    free_run(&normal);
    free_run(&faulty);
    free_run(&reference);
}

// ---- unbatched-decode --------------------------------------------------------------------------

// 4 requests at once: every decode step of n rows counts n times the weight
// bytes of a batched step (the embedding rows aside, which both count per
// row), and the prompts' step counts them once per prompt token. The
// logits keep their bits: fp32 batch invariance makes a row alone compute
// what it computes in a batch.
static void test_unbatched_decode_reads_the_weights_per_row(void** state) {
    (void)state;
    engine_config c = test_config();
    batch_run batched, unbatched;
    run(&tiny, &c, 0, 4, &batched);
    run(&tiny, &c, (fault_set)1 << FAULT_UNBATCHED_DECODE, 4, &unbatched);
    assert_int_equal(unbatched.steps, batched.steps);
    const uint64_t embedding_row_bytes = (uint64_t)tiny.config.dim * sizeof(float);
    int checked = 0;
    for (int s = 0; s < batched.steps; s++) {
        int rows = batched.decode_rows[s];
        if (rows == 0) continue;
        assert_int_equal(unbatched.decode_rows[s], rows);
        uint64_t shared = batched.decode_weight_bytes[s] - (uint64_t)rows * embedding_row_bytes;
        assert_int_equal(unbatched.decode_weight_bytes[s], (uint64_t)rows * shared + (uint64_t)rows * embedding_row_bytes);
        checked += rows > 1;
    }
    assert_true(checked > 0); // some steps did batch several rows
    int rows = batched.prefill_rows;
    assert_int_equal(rows, 4 + 7 + 10 + 13);
    // Only a prompt's last row wants logits: the final norm and the
    // classifier are read once for the 4 such rows batched, and once per
    // such row (4 calls) unbatched; everything else once per call.
    uint64_t logits_part = ((uint64_t)tiny.config.vocab_size + 1) * (uint64_t)tiny.config.dim * sizeof(float);
    uint64_t per_call = batched.prefill_weight_bytes - (uint64_t)rows * embedding_row_bytes - logits_part;
    assert_int_equal(unbatched.prefill_weight_bytes,
                     (uint64_t)rows * per_call + 4 * logits_part + (uint64_t)rows * embedding_row_bytes);
    print_message("prefill of %d rows: weights %llu bytes batched, %llu one row at a time\n", rows,
                  (unsigned long long)batched.prefill_weight_bytes, (unsigned long long)unbatched.prefill_weight_bytes);
    for (int id = 0; id < 4; id++) {
        assert_int_equal(unbatched.n_logits[id], batched.n_logits[id]);
        assert_memory_equal(unbatched.logits + (size_t)id * MAX_STEPS * VOCAB, batched.logits + (size_t)id * MAX_STEPS * VOCAB,
                            (size_t)batched.n_logits[id] * VOCAB * sizeof(float));
    }
    free_run(&batched);
    free_run(&unbatched);
}

// With --tp 2 the fault still runs one row per call, and each shard's
// tally is the sum over the calls.
static void test_unbatched_decode_sums_shard_traffic(void** state) {
    (void)state;
    engine_config c = test_config();
    c.tp_shards = 2;
    batch_run batched, unbatched;
    run(&tiny, &c, 0, 4, &batched);
    run(&tiny, &c, (fault_set)1 << FAULT_UNBATCHED_DECODE, 4, &unbatched);
    // A shard holds no embedding or classifier: its share of a decode step
    // of n rows is exactly n times the batched share.
    int multi_row_steps = 0;
    for (int s = 0; s < batched.steps; s++) {
        int rows = batched.decode_rows[s];
        if (rows == 0) continue;
        for (int k = 0; k < 2; k++)
            assert_int_equal(unbatched.shard_weight_bytes[s][k], (uint64_t)rows * batched.shard_weight_bytes[s][k]);
        multi_row_steps += rows > 1;
    }
    assert_true(multi_row_steps > 0);
    assert_true(max_relative_difference(&unbatched, &batched, 4) < 1e-5);
    free_run(&batched);
    free_run(&unbatched);
}

// ---- tp-full-weights --------------------------------------------------------------------------

// Each shard of 2 streams the whole w1, w3, w2 (3 x dim x hidden fp32
// values per layer) and its half of the attention matrices; the logits stay
// those of the correct split (fp32 rounding: the masked columns add zeros).
static void check_tp_full_weights(model_dtype_choice dtype, const char* label) {
    model m;
    error_info err = {{0}};
    if (model_synthesize(&m, "tiny", VOCAB, dtype, SYNTH_DEFAULT_SEED, &err)) fail_msg("%s", err.message);
    engine_config c = test_config();
    c.tp_shards = 2;
    batch_run split, full;
    run(&m, &c, 0, 2, &split);
    run(&m, &c, (fault_set)1 << FAULT_TP_FULL_WEIGHTS, 2, &full);
    const model_config* mc = &m.config;
    const uint64_t element = dtype == MODEL_DTYPE_FP16 ? 2 : 4;
    const uint64_t ffn = 3ull * (uint64_t)mc->dim * (uint64_t)mc->hidden_dim * element * (uint64_t)mc->n_layers;
    for (int k = 0; k < 2; k++) {
        // The last step decodes one row (the longer request alone).
        const uint64_t split_bytes = split.shard_weight_bytes[split.steps - 1][k];
        const uint64_t full_bytes = full.shard_weight_bytes[full.steps - 1][k];
        print_message("tiny %s shard %d: weights per decode step %llu split, %llu with tp-full-weights\n", label, k,
                      (unsigned long long)split_bytes, (unsigned long long)full_bytes);
        assert_true(split_bytes > 0);
        // Its half of the FFN becomes the whole FFN: + ffn / 2.
        assert_int_equal(full_bytes, split_bytes + ffn / 2);
    }
    assert_int_equal(split.hidden_size, mc->hidden_dim / 2);
    assert_int_equal(full.hidden_size, mc->hidden_dim);
    double difference = max_relative_difference(&full, &split, 2);
    print_message("tiny %s: logits max relative difference %.3g\n", label, difference);
    assert_true(difference < 1e-4);
    for (int id = 0; id < 2; id++)
        assert_memory_equal(full.tokens[id], split.tokens[id], (size_t)split.n_tokens[id] * sizeof(int32_t));
    free_run(&split);
    free_run(&full);
    model_free(&m);
}

static void test_tp_full_weights_streams_the_whole_ffn(void** state) {
    (void)state;
    check_tp_full_weights(MODEL_DTYPE_FP32, "fp32");
    check_tp_full_weights(MODEL_DTYPE_FP16, "fp16");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_static_batching_fault_waits_for_an_empty_batch),
        cmocka_unit_test(test_unbatched_decode_reads_the_weights_per_row),
        cmocka_unit_test(test_unbatched_decode_sums_shard_traffic),
        cmocka_unit_test(test_tp_full_weights_streams_the_whole_ffn),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
