// The engine against the reference forward pass (engine/reference_forward.h),
// which is written separately from the math and shares no arithmetic with
// engine/forward.c. First the reference itself against llama2.c's run.c
// (stories260K's BOS logits and greedy goldens); then every logit row the
// engine samples from, under each configuration it has (paged KV at block
// sizes 1, 16, 256 and contiguous, the prefix cache, forks, preemption,
// chunked prefill, tensor parallelism, fp16 and int8 KV, quantized weights,
// GGUF files in fp32, fp16, Q8_0 and Q4_0), against the reference run on the
// same tokens; last, the KV faults of engine/fault.h that change the math
// must push the engine out of the reference's tolerance.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/fault.h"
#include "engine/gguf_model.h"
#include "engine/model_quant.h"
#include "engine/model_synth.h"
#include "engine/reference_forward.h"
#include "engine/tokenizer.h"
#include "tests/test_support.h"

// fp32 paths: the engine's kernels sum in a fixed order that is not always
// the reference's (attention and softmax are blocked), so they agree to
// rounding: 1e-4 relative to the row's largest logit is ~800 fp32 ulps.
#define FP32_TOLERANCE 1e-4

// ---- what a run observed

typedef struct observed_row {
    int32_t sequence_id;
    int position; // of the token the logits follow
    float* logits;
} observed_row;

typedef struct observation {
    observed_row* rows;
    int n_rows, capacity;
    int vocab;
} observation;

static void observe(void* user, int32_t id, int position, const float* logits, int vocab) {
    observation* o = user;
    if (o->n_rows == o->capacity) {
        o->capacity = o->capacity ? 2 * o->capacity : 64;
        o->rows = realloc(o->rows, (size_t)o->capacity * sizeof *o->rows);
        assert_non_null(o->rows);
    }
    observed_row* row = &o->rows[o->n_rows++];
    row->sequence_id = id;
    row->position = position;
    row->logits = malloc((size_t)vocab * sizeof(float));
    assert_non_null(row->logits);
    memcpy(row->logits, logits, (size_t)vocab * sizeof(float));
    o->vocab = vocab;
}

static void observation_free(observation* o) {
    for (int i = 0; i < o->n_rows; i++)
        free(o->rows[i].logits);
    free(o->rows);
}

typedef struct test_request {
    int32_t prompt[160];
    int n_prompt;
    int max_new_tokens;
    int n_samples;
    float temperature;
    uint64_t seed;
} test_request;

// What one configuration gave against the reference, and the evidence that
// the configuration did what it is named for.
typedef struct comparison {
    double worst_relative;         // max over rows of max |engine - reference| / max |reference|
    double worst_relative_fp32_kv; // the same against a reference that keeps its KV in fp32
    int rows_compared;
    int sequences;
    uint64_t preemptions;
    uint64_t block_copies;
    int prefix_hit_tokens;
    int prefill_steps;    // steps that computed prompt tokens
    int max_step_prefill; // most prompt tokens in one step
} comparison;

// The engine's largest relative difference from the reference over every
// row sequence `id` sampled from.
static double compare_sequence(const reference_weights* ref, reference_kv_storage kv_storage, const sequence* s,
                               const observation* o, int32_t id, int* rows_compared) {
    const int vocab = ref->config.vocab_size;
    reference_run run;
    error_info err = {{0}};
    if (reference_run_init(&run, ref, s->n_tokens, &err)) fail_msg("reference_run_init: %s", err.message);
    run.kv_storage = kv_storage;
    float* logits = malloc((size_t)vocab * sizeof(float));
    assert_non_null(logits);
    double worst = 0.0;
    for (int p = 0; p < s->n_tokens; p++) {
        if (reference_run_token(&run, s->tokens[p], logits, &err)) fail_msg("reference_run_token: %s", err.message);
        for (int r = 0; r < o->n_rows; r++) {
            if (o->rows[r].sequence_id != id || o->rows[r].position != p) continue;
            double diff = 0.0, largest = 0.0;
            for (int i = 0; i < vocab; i++) {
                diff = fmax(diff, fabs((double)o->rows[r].logits[i] - (double)logits[i]));
                largest = fmax(largest, fabs((double)logits[i]));
            }
            worst = fmax(worst, diff / largest);
            (*rows_compared)++;
        }
    }
    free(logits);
    reference_run_free(&run);
    return worst;
}

// Runs the requests through an engine with config c (one_at_a_time: each
// added when the previous has finished, so the next one can hit the prefix
// cache) and compares every sampled row with the reference.
static comparison compare_with_reference(const model* m, const reference_weights* ref, const engine_config* c,
                                         const test_request* requests, int n_requests, bool one_at_a_time) {
    comparison out = {0};
    observation seen = {0};
    engine e;
    error_info err = {{0}};
    if (engine_init(&e, m, c, &err)) fail_msg("engine_init: %s", err.message);
    engine_set_logits_observer(&e, observe, &seen);
    int next = 0;
    for (int guard = 0; next < n_requests || engine_has_work(&e); guard++) {
        if (guard > 100000) fail_msg("engine did not finish");
        while (next < n_requests && (!one_at_a_time || !engine_has_work(&e))) {
            const test_request* q = &requests[next++];
            request_params p = {q->prompt,
                                q->n_prompt,
                                q->max_new_tokens,
                                q->n_samples ? q->n_samples : 1,
                                q->temperature,
                                0.0f,
                                q->seed,
                                0.0,
                                true};
            if (engine_add_request(&e, &p, NULL, &err)) fail_msg("add_request: %s", err.message);
        }
        const step_record* r;
        if (engine_step(&e, &r, &err)) fail_msg("engine_step: %s", err.message);
        out.preemptions += (uint64_t)r->n_preempted;
        for (int k = 0; k < r->n_events; k++)
            out.block_copies += r->events[k].kind == BLOCK_COPY;
        out.prefix_hit_tokens += r->prefix_hit_tokens;
        out.prefill_steps += r->prefill_tokens > 0;
        if (r->prefill_tokens > out.max_step_prefill) out.max_step_prefill = r->prefill_tokens;
    }
    const sequence* s;
    for (int32_t id = 0; (s = test_sequence(&e, id)) != NULL; id++) {
        assert_int_equal(s->state, SEQ_FINISHED);
        // The reference's cache stores K and V as the engine's does (rounded
        // by its own code, reference_forward.c), and once more in fp32.
        reference_kv_storage storage = c->kv_dtype == KV_F16  ? REFERENCE_KV_F16
                                       : c->kv_dtype == KV_I8 ? REFERENCE_KV_I8
                                                              : REFERENCE_KV_F32;
        out.worst_relative = fmax(out.worst_relative, compare_sequence(ref, storage, s, &seen, id, &out.rows_compared));
        int rows_again = 0;
        out.worst_relative_fp32_kv =
            fmax(out.worst_relative_fp32_kv, storage == REFERENCE_KV_F32
                                                 ? out.worst_relative
                                                 : compare_sequence(ref, REFERENCE_KV_F32, s, &seen, id, &rows_again));
        out.sequences++;
    }
    // Every row the engine sampled from was compared (none fell outside a sequence).
    assert_int_equal(out.rows_compared, seen.n_rows);
    assert_true(out.rows_compared > 0);
    engine_free(&e);
    observation_free(&seen);
    return out;
}

// n prompts of different lengths (BOS first), ids inside a 512-token vocabulary.
static void make_requests(test_request* requests, int n, int first_length, int length_step, int max_new_tokens) {
    for (int i = 0; i < n; i++) {
        test_request* r = &requests[i];
        memset(r, 0, sizeof *r);
        r->n_prompt = first_length + length_step * i;
        r->prompt[0] = TOK_BOS_ID;
        for (int t = 1; t < r->n_prompt; t++)
            r->prompt[t] = 3 + (int32_t)((t * 37 + i * 101) % 500);
        r->max_new_tokens = max_new_tokens;
        r->n_samples = 1;
    }
}

static engine_config fp32_config(void) {
    engine_config c = engine_config_default();
    c.kv_dtype = KV_F32;
    c.num_blocks = 256;
    c.n_threads = 2;
    return c;
}

static void expect_within(const char* model_name, const char* label, const comparison* got, double tolerance) {
    print_message("%-14s %-34s %3d rows, %2d sequences: worst relative difference %.3g (bound %.3g)\n", model_name,
                  label, got->rows_compared, got->sequences, got->worst_relative, tolerance);
    if (!(got->worst_relative <= tolerance))
        fail_msg("%s, %s: the engine differs from the reference by %.3g relative, bound %.3g", model_name, label,
                 got->worst_relative, tolerance);
}

static void load_or_fail(model* m, const char* path, model_dtype_choice dtype) {
    error_info err = {{0}};
    if (model_load(m, path, dtype, &err)) fail_msg("model_load: %s", err.message);
}

static void view_or_fail(reference_weights* w, const model* m) {
    error_info err = {{0}};
    if (reference_weights_from_model(w, m, &err)) fail_msg("reference_weights_from_model: %s", err.message);
}

// ---- the reference against llama2.c's run.c

static void test_reference_matches_llama2c_bos_logits(void** state) {
    (void)state;
    char model_path[512], logits_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    REQUIRE_SHARED_MODEL(logits_path, "stories260K.bos-logits");
    model m;
    load_or_fail(&m, model_path, MODEL_DTYPE_FP32);
    reference_weights w;
    view_or_fail(&w, &m);
    assert_int_equal(w.owned_bytes, 0); // fp32: every matrix borrowed from the model
    float expected[512], logits[512];
    FILE* file = fopen(logits_path, "r");
    assert_non_null(file);
    for (int i = 0; i < 512; i++)
        assert_int_equal(fscanf(file, "%f", &expected[i]), 1);
    fclose(file);
    int32_t bos = TOK_BOS_ID;
    error_info err = {{0}};
    assert_int_equal(reference_last_logits(&w, &bos, 1, logits, &err), 0);
    double diff = 0.0, largest = 0.0;
    for (int i = 0; i < 512; i++) {
        diff = fmax(diff, fabs((double)logits[i] - expected[i]));
        largest = fmax(largest, fabs((double)expected[i]));
    }
    print_message("reference BOS logits against llama2.c: relative %.3g\n", diff / largest);
    assert_true(diff / largest < 1e-5);
    reference_weights_free(&w);
    model_free(&m);
}

static int parse_ids(const char* text, int32_t* ids, int capacity) {
    int n = 0;
    char* end;
    for (;;) {
        long v = strtol(text, &end, 10);
        if (end == text || n >= capacity) return n;
        ids[n++] = (int32_t)v;
        text = end;
    }
}

// Greedy decoding with the reference gives llama2.c's 200 ids for every golden case.
static void test_reference_greedy_matches_llama2c_golden(void** state) {
    (void)state;
    char model_path[512], golden_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    REQUIRE_SHARED_MODEL(golden_path, "stories260K.golden");
    model m;
    load_or_fail(&m, model_path, MODEL_DTYPE_FP32);
    reference_weights w;
    view_or_fail(&w, &m);
    FILE* file = fopen(golden_path, "r");
    assert_non_null(file);
    char line[8192];
    int32_t prompt[64], expected[256];
    int n_prompt = -1, n_cases = 0;
    float logits[512];
    error_info err = {{0}};
    while (fgets(line, sizeof line, file)) {
        if (strncmp(line, "prompt:", 7) == 0) n_prompt = parse_ids(line + 7, prompt, 64);
        if (strncmp(line, "greedy:", 7) != 0 || n_prompt < 0) continue;
        int n_expected = parse_ids(line + 7, expected, 256);
        assert_int_equal(n_expected, 200);
        reference_run run;
        assert_int_equal(reference_run_init(&run, &w, 1 + n_prompt + n_expected, &err), 0);
        int32_t token = TOK_BOS_ID;
        for (int i = 0; i < n_prompt; i++) {
            assert_int_equal(reference_run_token(&run, token, NULL, &err), 0);
            token = prompt[i];
        }
        for (int i = 0; i < n_expected; i++) {
            assert_int_equal(reference_run_token(&run, token, logits, &err), 0);
            int best = 0;
            for (int v = 1; v < 512; v++)
                if (logits[v] > logits[best]) best = v;
            if (best != expected[i])
                fail_msg("golden case %d: token %d is %d, llama2.c gave %d", n_cases, i, best, expected[i]);
            token = best;
        }
        reference_run_free(&run);
        n_cases++;
        n_prompt = -1;
    }
    fclose(file);
    assert_true(n_cases >= 2);
    print_message("reference greedy ids equal llama2.c's in %d golden cases of 200 tokens\n", n_cases);
    reference_weights_free(&w);
    model_free(&m);
}

static void test_reference_refuses_bad_input(void** state) {
    (void)state;
    model m;
    error_info err = {{0}};
    assert_int_equal(model_synthesize(&m, "tiny", 512, MODEL_DTYPE_FP32, SYNTH_DEFAULT_SEED, &err), 0);
    reference_weights w;
    view_or_fail(&w, &m);
    float logits[512];
    int32_t tokens[2] = {TOK_BOS_ID, 512};
    assert_int_equal(reference_last_logits(&w, tokens, 2, logits, &err), -1);
    assert_non_null(strstr(err.message, "token 512 is outside the vocabulary (0 to 511)"));
    assert_int_equal(reference_last_logits(&w, tokens, 0, logits, &err), -1);
    assert_non_null(strstr(err.message, "no tokens"));
    reference_run run;
    assert_int_equal(reference_run_init(&run, &w, m.config.max_seq_len + 1, &err), -1);
    assert_non_null(strstr(err.message, "positions asked"));
    reference_weights_free(&w);
    // A matrix whose shape is not the config's is named, not read past its end.
    layer_weights* layers = malloc((size_t)m.config.n_layers * sizeof *layers);
    assert_non_null(layers);
    memcpy(layers, m.layers, (size_t)m.config.n_layers * sizeof *layers);
    layers[1].wk.rows = 7;
    model wrong = m;
    wrong.layers = layers;
    assert_int_equal(reference_weights_from_model(&w, &wrong, &err), -1);
    assert_non_null(strstr(err.message, "layers.1.wk: expected a (32, 64) matrix, found (7, 64)"));
    assert_null(w.layers); // nothing left to free
    free(layers);
    model_free(&m);
}

// ---- the engine against the reference, configuration by configuration

// Every fp32 configuration of the engine on one model. tp_max: the most
// shards the model's KV heads allow (checked: 2 and, where it divides, 4).
static void check_fp32_configurations(const model* m, const char* model_name) {
    reference_weights ref;
    view_or_fail(&ref, m);
    test_request requests[6];
    make_requests(requests, 4, 5, 13, 12); // prompts of 5, 18, 31, 44 tokens, 12 new each
    comparison got;

    const int block_sizes[3] = {1, 16, 256};
    for (int i = 0; i < 3; i++) {
        engine_config c = fp32_config();
        c.block_size = block_sizes[i];
        c.num_blocks = 2048 / block_sizes[i] + 4;
        char label[64];
        snprintf(label, sizeof label, "paged, block size %d, batch of 4", block_sizes[i]);
        got = compare_with_reference(m, &ref, &c, requests, 4, false);
        expect_within(model_name, label, &got, FP32_TOLERANCE);
    }
    {
        engine_config c = fp32_config();
        c.layout = KV_LAYOUT_CONTIGUOUS;
        got = compare_with_reference(m, &ref, &c, requests, 4, false);
        expect_within(model_name, "contiguous", &got, FP32_TOLERANCE);
    }
    {
        // Two requests over one 40-token prefix, the second after the first
        // finished: it reads the first's cached blocks (2 full blocks of 16).
        test_request shared[2];
        make_requests(shared, 2, 48, 0, 10);
        memcpy(shared[1].prompt, shared[0].prompt, 40 * sizeof(int32_t));
        engine_config c = fp32_config();
        got = compare_with_reference(m, &ref, &c, shared, 2, true);
        assert_true(got.prefix_hit_tokens >= 32);
        expect_within(model_name, "prefix cache hit", &got, FP32_TOLERANCE);
    }
    {
        // Three samples of one request (temperature 1): forks that share the
        // prompt's blocks and copy the tail block on their first write.
        test_request fork = requests[2];
        fork.n_samples = 3;
        fork.temperature = 1.0f;
        fork.seed = 7;
        engine_config c = fp32_config();
        c.block_size = 4;
        c.num_blocks = 512;
        got = compare_with_reference(m, &ref, &c, &fork, 1, false);
        assert_int_equal(got.sequences, 3);
        assert_true(got.block_copies >= 2);
        expect_within(model_name, "fork n=3 (copy on write)", &got, FP32_TOLERANCE);
    }
    {
        // 4 requests growing to 35..74 tokens (218 in all) in 96 slots: the
        // scheduler must preempt and recompute.
        test_request long_requests[4];
        make_requests(long_requests, 4, 5, 13, 30);
        engine_config c = fp32_config();
        c.block_size = 4;
        c.num_blocks = 24;
        c.prefix_caching = false;
        got = compare_with_reference(m, &ref, &c, long_requests, 4, false);
        assert_true(got.preemptions > 0);
        expect_within(model_name, "preempted and recomputed", &got, FP32_TOLERANCE);
    }
    {
        // 8 prompt tokens a step against prompts of up to 44.
        engine_config c = fp32_config();
        c.max_batched_tokens = 8;
        c.chunked_prefill = true;
        got = compare_with_reference(m, &ref, &c, requests, 4, false);
        assert_true(got.max_step_prefill <= 8 && got.prefill_steps >= 11);
        expect_within(model_name, "chunked prefill, 8 tokens a step", &got, FP32_TOLERANCE);
    }
    for (int shards = 2; shards <= 4; shards *= 2) {
        if (m->config.n_kv_heads % shards != 0) continue;
        engine_config c = fp32_config();
        c.tp_shards = shards;
        c.n_threads = shards;
        char label[64];
        snprintf(label, sizeof label, "tensor parallel, %d shards", shards);
        got = compare_with_reference(m, &ref, &c, requests, 4, false);
        expect_within(model_name, label, &got, FP32_TOLERANCE);
    }
    reference_weights_free(&ref);
}

static void test_engine_matches_reference_on_tiny(void** state) {
    (void)state;
    model m;
    error_info err = {{0}};
    assert_int_equal(model_synthesize(&m, "tiny", 512, MODEL_DTYPE_FP32, SYNTH_DEFAULT_SEED, &err), 0);
    check_fp32_configurations(&m, "tiny (fp32)");
    model_free(&m);
}

static void test_engine_matches_reference_on_stories260k(void** state) {
    (void)state;
    char path[512];
    REQUIRE_SHARED_MODEL(path, "stories260K.bin");
    model m;
    load_or_fail(&m, path, MODEL_DTYPE_FP32);
    check_fp32_configurations(&m, "stories260K");
    model_free(&m);
}

// ---- KV caches that round

// fp16 and int8 KV round each cached K and V element. The reference rounds
// its own cache by the same rule (written separately: reference_forward.c),
// so both attend over the same stored values except where inputs that
// differ in their last bits (the fp16 attention's vector exp is within 2
// ulp of expf) fall on the two sides of a rounding boundary: that element
// then moves by one step of the format. The bound is that step: 2^-11 of
// the element for fp16 (4.9e-4), 1/127 of the head's largest for int8
// (7.9e-3). Against the reference that keeps fp32 KV, the difference is
// what the rounding costs, and it must be larger than the bound: that shows
// the engine's KV did round and the rounding reference explains it.
static void check_rounding_kv(const model* m, const char* model_name) {
    reference_weights ref;
    view_or_fail(&ref, m);
    test_request requests[4];
    make_requests(requests, 4, 5, 13, 12);
    const kv_dtype dtypes[2] = {KV_F16, KV_I8};
    const double one_step[2] = {1.0 / 2048.0, 1.0 / 127.0};
    for (int i = 0; i < 2; i++) {
        engine_config c = fp32_config();
        c.kv_dtype = dtypes[i];
        comparison got = compare_with_reference(m, &ref, &c, requests, 4, false);
        char label[64];
        snprintf(label, sizeof label, "%s KV", kv_dtype_name(dtypes[i]));
        print_message("%-14s %-34s against fp32 KV in the reference: %.3g\n", model_name, label,
                      got.worst_relative_fp32_kv);
        expect_within(model_name, label, &got, one_step[i]);
        assert_true(got.worst_relative_fp32_kv > one_step[i]); // the engine's KV did round
    }
    reference_weights_free(&ref);
}

static void test_rounding_kv_against_reference(void** state) {
    (void)state;
    model m;
    error_info err = {{0}};
    assert_int_equal(model_synthesize(&m, "tiny", 512, MODEL_DTYPE_FP32, SYNTH_DEFAULT_SEED, &err), 0);
    check_rounding_kv(&m, "tiny (fp32)");
    model_free(&m);
    char path[512];
    REQUIRE_SHARED_MODEL(path, "stories260K.bin");
    load_or_fail(&m, path, MODEL_DTYPE_FP32);
    check_rounding_kv(&m, "stories260K");
    model_free(&m);
}

// ---- quantized weights against the reference on their dequantized values

// What the engine's matmuls do to their input rows, as a relative error
// per element (of the row's largest): int8 activations (W8A8, and GGUF
// Q8_0 and Q4_0 as llama.cpp runs them) round to 1/254; WEIGHT_I4 without
// int8 activations rounds them to bf16 (8 significant bits: 2^-8);
// otherwise fp32, none. Each layer has 7 matmuls and the classifier one
// more, and to first order their errors add, so the logits' bound is
// (n_layers * 7 + 1) times that (FP32_TOLERANCE when the activations stay
// fp32).
static double activation_bound(const model* m) {
    const weight_matrix* w = &m->layers[0].wq;
    double per_element = w->activation_bits == 8 ? 1.0 / 254.0 : w->dtype == WEIGHT_I4 ? 1.0 / 256.0 : 0.0;
    return per_element > 0.0 ? (m->config.n_layers * 7 + 1) * per_element : FP32_TOLERANCE;
}

// The reference runs on the very values the codes stand for
// (reference_weights_from_model widens each row), so the weights agree
// exactly and only what the scheme does to activations is left: W8A16
// keeps them fp32 (bound FP32_TOLERANCE); W4A16 rounds them to bf16 (8
// significant bits: <= 2^-8 relative) at each of a layer's 7 matmuls;
// W8A8 quantizes them to int8 per token (<= 1/254 of the row's largest).
static void test_quantized_weights_against_dequantized_reference(void** state) {
    (void)state;
    const char* specs[3] = {"w8a16", "w4a16:g32", "w8a8"};
    test_request requests[4];
    make_requests(requests, 4, 5, 13, 12);
    for (int i = 0; i < 3; i++) {
        model m;
        error_info err = {{0}};
        test_synthesize_stories260k_shape(&m);
        model_quant_spec spec;
        assert_int_equal(model_quant_spec_parse(specs[i], &spec, &err), 0);
        if (model_quantize(&m, &spec, NULL, NULL, 0, NULL, NULL, &err)) fail_msg("model_quantize: %s", err.message);
        reference_weights ref;
        view_or_fail(&ref, &m);
        assert_true(ref.owned_bytes > 0); // the view was dequantized, not borrowed
        engine_config c = fp32_config();
        comparison got = compare_with_reference(&m, &ref, &c, requests, 4, false);
        expect_within(specs[i], "quantized weights, paged 16", &got, activation_bound(&m));
        reference_weights_free(&ref);
        model_free(&m);
    }
}

// ---- synth-gqa: 32,000-token vocabulary, GQA, as a llama2.c file and as GGUF

// ../shared/gguf/<name> (SERVELAB_SHARED moves ../shared); false when absent.
static bool gguf_reference_path(char* out, size_t capacity, const char* name) {
    const char* shared = getenv("SERVELAB_SHARED");
    int written = snprintf(out, capacity, "%s/gguf/%s", shared ? shared : "../shared", name);
    FILE* file = written > 0 && (size_t)written < capacity ? fopen(out, "rb") : NULL;
    if (file) fclose(file);
    return file != NULL;
}

// Skips without ../shared/gguf; fails under CI, which always has it.
#define REQUIRE_GGUF_FILE(buffer, name)                                                                                \
    do {                                                                                                               \
        if (!gguf_reference_path((buffer), sizeof(buffer), (name))) {                                                  \
            if (getenv("CI")) fail_msg("../shared/gguf/%s is missing and CI is set", (name));                          \
            print_message("skipping: ../shared/gguf/%s is missing (llama.cpp reference files)\n", (name));             \
            skip();                                                                                                    \
        }                                                                                                              \
    } while (0)

static void check_gguf(const char* path, const char* name, const test_request* requests) {
    model m;
    error_info err = {{0}};
    gguf_model_options options = {MODEL_DTYPE_DEFAULT, 0, false};
    if (gguf_model_load(&m, path, &options, &err)) fail_msg("gguf_model_load: %s", err.message);
    reference_weights ref;
    view_or_fail(&ref, &m);
    engine_config c = fp32_config();
    comparison got = compare_with_reference(&m, &ref, &c, requests, 4, false);
    char label[64];
    snprintf(label, sizeof label, "GGUF as %s%s, paged 16", weight_dtype_name(m.dtype),
             m.layers[0].wq.activation_bits == 8 ? " (int8 activations)" : "");
    expect_within(name, label, &got, activation_bound(&m));
    reference_weights_free(&ref);
    model_free(&m);
}

static void test_synth_gqa_against_reference(void** state) {
    (void)state;
    char path[512], f16_path[512], q8_path[512], q4_path[512], stories_path[512];
    REQUIRE_GGUF_FILE(path, "synth-gqa.bin");
    REQUIRE_GGUF_FILE(f16_path, "synth-gqa-f16.gguf");
    REQUIRE_GGUF_FILE(q8_path, "synth-gqa-q8_0.gguf");
    REQUIRE_GGUF_FILE(q4_path, "synth-gqa-q4_0.gguf");
    REQUIRE_GGUF_FILE(stories_path, "stories260K-f32.gguf");
    model m;
    load_or_fail(&m, path, MODEL_DTYPE_FP32);
    assert_true(m.config.n_kv_heads < m.config.n_heads);
    reference_weights ref;
    view_or_fail(&ref, &m);
    test_request requests[4];
    make_requests(requests, 4, 5, 13, 12);
    engine_config c = fp32_config();
    comparison got = compare_with_reference(&m, &ref, &c, requests, 4, false);
    expect_within("synth-gqa.bin", "paged, block size 16, batch of 4", &got, FP32_TOLERANCE);
    c.tp_shards = 2;
    got = compare_with_reference(&m, &ref, &c, requests, 4, false);
    expect_within("synth-gqa.bin", "tensor parallel, 2 shards", &got, FP32_TOLERANCE);
    reference_weights_free(&ref);
    model_free(&m);
    check_gguf(f16_path, "synth-gqa-f16.gguf", requests);
    check_gguf(q8_path, "synth-gqa-q8_0.gguf", requests);
    check_gguf(q4_path, "synth-gqa-q4_0.gguf", requests);
    check_gguf(stories_path, "stories260K-f32.gguf", requests);
}

// ---- the faults that change the math leave the reference

typedef struct fault_scenario {
    const char* name;
    engine_config config;
    test_request requests[24];
    int n_requests;
} fault_scenario;

static void test_kv_faults_leave_the_reference(void** state) {
    (void)state;
    model m;
    error_info err = {{0}};
    assert_int_equal(model_synthesize(&m, "tiny", 512, MODEL_DTYPE_FP32, SYNTH_DEFAULT_SEED, &err), 0);
    reference_weights ref;
    view_or_fail(&ref, &m);
    static fault_scenario scenarios[3];
    fault_scenario* batch = &scenarios[0];
    batch->name = "batch of 4, block 16";
    batch->config = fp32_config();
    make_requests(batch->requests, 4, 5, 13, 12);
    batch->n_requests = 4;
    fault_scenario* fork = &scenarios[1];
    fork->name = "fork n=3, block 4";
    fork->config = fp32_config();
    fork->config.block_size = 4;
    make_requests(fork->requests, 1, 31, 0, 12);
    fork->requests[0].n_samples = 3, fork->requests[0].temperature = 1.0f, fork->requests[0].seed = 7;
    fork->n_requests = 1;
    // 24 requests over one 40-token prefix in 256 slots: cached prefix
    // blocks are evicted and reused while other tables still list them.
    fault_scenario* prefix = &scenarios[2];
    prefix->name = "shared prefix under eviction";
    prefix->config = fp32_config();
    prefix->config.block_size = 4;
    prefix->config.num_blocks = 64;
    make_requests(prefix->requests, 24, 48, 0, 8);
    for (int r = 0; r < 24; r++)
        for (int i = 40; i < 48; i++)
            prefix->requests[r].prompt[i] = 3 + (r * 7 + i) % 200;
    prefix->n_requests = 24;
    // Clean, every scenario agrees with the reference.
    for (int k = 0; k < 3; k++) {
        comparison got = compare_with_reference(&m, &ref, &scenarios[k].config, scenarios[k].requests,
                                                scenarios[k].n_requests, false);
        expect_within("tiny, clean", scenarios[k].name, &got, FP32_TOLERANCE);
    }
    // Each fault: the largest difference over the scenarios.
    const fault_id must_turn[5] = {FAULT_PAGED_WRONG_SLOT, FAULT_SKIP_LAST_BLOCK, FAULT_NO_COW, FAULT_COW_SHORT_COPY,
                                   FAULT_PREFIX_NO_REFCOUNT};
    for (int f = 0; f < (int)FAULT_COUNT; f++) {
        double worst = 0.0;
        fault_install((fault_set)1 << f);
        for (int k = 0; k < 3; k++) {
            comparison got = compare_with_reference(&m, &ref, &scenarios[k].config, scenarios[k].requests,
                                                    scenarios[k].n_requests, false);
            worst = fmax(worst, got.worst_relative);
        }
        fault_install(0);
        bool expected = false;
        for (int i = 0; i < 5; i++)
            expected |= (int)must_turn[i] == f;
        print_message("fault %-26s worst relative difference %.3g: %s\n", fault_name((fault_id)f), worst,
                      worst > FP32_TOLERANCE ? "caught" : "not caught (the logits stay the reference's)");
        if (expected && !(worst > FP32_TOLERANCE))
            fail_msg("fault %s left the engine within %.3g of the reference", fault_name((fault_id)f), worst);
    }
    reference_weights_free(&ref);
    model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_matches_llama2c_bos_logits),
        cmocka_unit_test(test_reference_greedy_matches_llama2c_golden),
        cmocka_unit_test(test_reference_refuses_bad_input),
        cmocka_unit_test(test_engine_matches_reference_on_tiny),
        cmocka_unit_test(test_engine_matches_reference_on_stories260k),
        cmocka_unit_test(test_rounding_kv_against_reference),
        cmocka_unit_test(test_quantized_weights_against_dequantized_reference),
        cmocka_unit_test(test_synth_gqa_against_reference),
        cmocka_unit_test(test_kv_faults_leave_the_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
