// The forward pass against llama2.c on the real stories260K checkpoint, the
// export formats, fp16 weights, weight-byte accounting and batch invariance.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/forward.h"
#include "engine/model.h"
#include "engine/model_write.h"
#include "engine/tokenizer.h"
#include "tests/test_support.h"

#define GOLDEN_NEW_TOKENS 200

// ---- helpers ----------------------------------------------------------------

static void load_or_fail(model* m, const char* path, model_dtype_choice dtype) {
    error_info err = {{0}};
    if (model_load(m, path, dtype, &err)) fail_msg("model_load(%s): %s", path, err.message);
}

// Runs a prompt (BOS first) as one batch with block size block_size and
// returns the logits of every row (n_prompt, vocab) in a malloc'ed array.
static float* prompt_logits(const model* m, const int32_t* ids, int n_prompt, int block_size) {
    const model_config* c = &m->config;
    int n_blocks = (c->max_seq_len + block_size - 1) / block_size;
    kv_memory kv;
    forward_state state;
    error_info err = {{0}};
    assert_int_equal(kv_memory_init(&kv, c, KV_F32, n_blocks, block_size, &err), 0);
    assert_int_equal(forward_state_init(&state, c, n_prompt, c->max_seq_len, &err), 0);
    // Blocks in reverse order: a scattered table must give the same numbers.
    int32_t* table = malloc((size_t)n_blocks * sizeof *table);
    for (int b = 0; b < n_blocks; b++) table[b] = n_blocks - 1 - b;
    batch_row* rows = malloc((size_t)n_prompt * sizeof *rows);
    for (int i = 0; i < n_prompt; i++) rows[i] = (batch_row){ids[i], i, 0, true};
    const int32_t* tables[1] = {table};
    int32_t* slots = malloc((size_t)n_prompt * sizeof *slots);
    forward_batch_map_slots(slots, rows, n_prompt, tables, block_size);
    forward_batch batch = {n_prompt, rows, 1, tables, slots};
    float* logits = malloc((size_t)n_prompt * (size_t)c->vocab_size * sizeof(float));
    if (forward(m, &state, &kv, &batch, logits, NULL, &err)) fail_msg("forward: %s", err.message);
    free(rows);
    free(slots);
    free(table);
    forward_state_free(&state);
    kv_memory_free(&kv);
    return logits;
}

static float max_abs_diff(const float* a, const float* b, int n, float* max_abs_ref) {
    float diff = 0.0f, ref = 0.0f;
    for (int i = 0; i < n; i++) {
        diff = fmaxf(diff, fabsf(a[i] - b[i]));
        ref = fmaxf(ref, fabsf(b[i]));
    }
    if (max_abs_ref) *max_abs_ref = ref;
    return diff;
}

// Parses stories260K.golden: case k's prompt ids and greedy ids.
typedef struct golden_case {
    int32_t prompt[64];
    int n_prompt;
    int32_t greedy[GOLDEN_NEW_TOKENS];
    int n_greedy;
} golden_case;

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

static int load_golden(golden_case* cases, int capacity) {
    char path[512];
    if (!shared_model_path(path, sizeof path, "stories260K.golden")) return 0;
    FILE* file = fopen(path, "r");
    char line[8192];
    int n = -1;
    while (fgets(line, sizeof line, file)) {
        if (strncmp(line, "prompt:", 7) == 0 && n + 1 < capacity) {
            n++;
            cases[n].n_prompt = parse_ids(line + 7, cases[n].prompt, 64);
        } else if (strncmp(line, "greedy:", 7) == 0 && n >= 0) {
            cases[n].n_greedy = parse_ids(line + 7, cases[n].greedy, GOLDEN_NEW_TOKENS);
        }
    }
    fclose(file);
    return n + 1;
}

// ---- stories260K against llama2.c ------------------------------------------

static void test_bos_logits_match_reference(void** state) {
    (void)state;
    char model_path[512], logits_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    REQUIRE_SHARED_MODEL(logits_path, "stories260K.bos-logits");
    model m;
    load_or_fail(&m, model_path, MODEL_DTYPE_DEFAULT);
    assert_int_equal(m.config.vocab_size, 512);
    float reference[512];
    FILE* file = fopen(logits_path, "r");
    for (int i = 0; i < 512; i++) assert_int_equal(fscanf(file, "%f", &reference[i]), 1);
    fclose(file);
    int32_t bos = TOK_BOS_ID;
    float* logits = prompt_logits(&m, &bos, 1, 16);
    float max_ref;
    float diff = max_abs_diff(logits, reference, 512, &max_ref);
    print_message("BOS logits: max |diff| %.3g, max |ref| %.3g, relative %.3g\n", (double)diff, (double)max_ref,
                  (double)(diff / max_ref));
    assert_true(diff / max_ref < 1e-5f);
    free(logits);
    model_free(&m);
}

static void test_greedy_ids_match_golden(void** state) {
    (void)state;
    char model_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    char golden_path[512];
    REQUIRE_SHARED_MODEL(golden_path, "stories260K.golden"); // only in ../shared, not in ./models
    golden_case cases[8];
    int n_cases = load_golden(cases, 8);
    assert_true(n_cases >= 2);
    model m;
    load_or_fail(&m, model_path, MODEL_DTYPE_DEFAULT);
    for (int k = 0; k < n_cases; k++) {
        assert_int_equal(cases[k].n_greedy, GOLDEN_NEW_TOKENS);
        int32_t prompt[65] = {TOK_BOS_ID};
        memcpy(prompt + 1, cases[k].prompt, (size_t)cases[k].n_prompt * sizeof(int32_t));
        int32_t out[GOLDEN_NEW_TOKENS];
        test_generation run = test_engine_generate(&m, prompt, 1 + cases[k].n_prompt, GOLDEN_NEW_TOKENS, 0.0f, 0.0f, 1, out);
        assert_int_equal(run.n_generated, GOLDEN_NEW_TOKENS);
        for (int i = 0; i < GOLDEN_NEW_TOKENS; i++)
            if (out[i] != cases[k].greedy[i])
                fail_msg("case %d: token %d is %d, llama2.c gave %d", k, i, out[i], cases[k].greedy[i]);
    }
    model_free(&m);
}

// The golden text: "=== prompt: P" then the text llama2.c printed.
static char* golden_text_for(const char* prompt) {
    char path[512];
    if (!shared_model_path(path, sizeof path, "stories260K.golden-text")) return NULL;
    char* text = test_read_text(path);
    char marker[256];
    snprintf(marker, sizeof marker, "=== prompt: %s\n", prompt);
    char* start = strstr(text, marker);
    assert_non_null(start);
    start += strlen(marker);
    char* end = strstr(start, "\n===");
    size_t length = end ? (size_t)(end - start) : strlen(start);
    while (length > 0 && start[length - 1] == '\n') length--;
    char* result = strndup(start, length);
    free(text);
    return result;
}

static void check_golden_text(const char* prompt_text) {
    char model_path[512], tok_path[512], golden_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    REQUIRE_SHARED_MODEL(tok_path, "tok512.bin");
    REQUIRE_SHARED_MODEL(golden_path, "stories260K.golden-text");
    model m;
    load_or_fail(&m, model_path, MODEL_DTYPE_DEFAULT);
    tokenizer* tok = NULL;
    error_info err = {{0}};
    assert_int_equal(tok_load(&tok, tok_path, 512, &err), 0);
    int32_t ids[512 + GOLDEN_NEW_TOKENS];
    int n_prompt = 0;
    assert_int_equal(tok_encode(tok, prompt_text, true, false, ids, 512, &n_prompt, &err), 0);
    int n_out = test_engine_generate(&m, ids, n_prompt, GOLDEN_NEW_TOKENS, 0.0f, 0.0f, 1, ids + n_prompt).n_generated;
    size_t needed = tok_decode_text(tok, TOK_BOS_ID, ids + 1, n_prompt - 1 + n_out, NULL, 0);
    char* text = malloc(needed + 1);
    tok_decode_text(tok, TOK_BOS_ID, ids + 1, n_prompt - 1 + n_out, text, needed + 1);
    char* golden = golden_text_for(prompt_text);
    if (strncmp(text, golden, strlen(golden)) != 0)
        fail_msg("text for '%s' differs from llama2.c's:\n--- ours\n%s\n--- llama2.c\n%s", prompt_text, text, golden);
    free(golden);
    free(text);
    tok_free(tok);
    model_free(&m);
}

static void test_greedy_text_once_upon_a_time(void** state) {
    (void)state;
    check_golden_text("Once upon a time");
}

static void test_greedy_text_the_little_dog(void** state) {
    (void)state;
    check_golden_text("The little dog");
}

// ---- weight bytes -------------------------------------------------------------

static void test_weight_bytes_are_exact(void** state) {
    (void)state;
    char model_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    model m32, m16;
    load_or_fail(&m32, model_path, MODEL_DTYPE_FP32);
    load_or_fail(&m16, model_path, MODEL_DTYPE_FP16);
    // File: 28-byte header + fp32 weights + two RoPE tables (512 x 4 floats each).
    uint64_t file_floats = (1056540 - 28) / 4 - 2 * 512 * 4;
    assert_int_equal(m32.n_parameters, file_floats);
    assert_int_equal(m32.weight_bytes, 4 * file_floats);
    uint64_t norm_floats = (2 * 5 + 1) * 64;
    assert_int_equal(m16.weight_bytes, 2 * (file_floats - norm_floats) + 4 * norm_floats);

    // The kernels' own count of weight bytes per decoded token equals the
    // model's formula: every matrix once, the norms, one embedding row.
    int32_t prompt[1] = {TOK_BOS_ID};
    int32_t out[10];
    test_generation run = test_engine_generate(&m32, prompt, 1, 10, 0.0f, 0.0f, 1, out);
    assert_int_equal(run.n_generated, 10);
    assert_int_equal(run.n_decode_steps, 9);
    assert_int_equal(run.decode_traffic.weight_bytes_read, 9 * model_decode_weight_bytes(&m32));
    // Matmul FLOPs per token: 2 x every matrix value (embedding lookup excluded).
    uint64_t matrix_values = m32.n_parameters - norm_floats; // the classifier is the embedding
    assert_int_equal(run.decode_traffic.matmul_flops, 9 * 2 * matrix_values);
    model_free(&m32);
    model_free(&m16);
}

static void test_fp16_weights_stay_close(void** state) {
    (void)state;
    char model_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    model m32, m16;
    load_or_fail(&m32, model_path, MODEL_DTYPE_FP32);
    load_or_fail(&m16, model_path, MODEL_DTYPE_FP16);
    assert_int_equal(m16.dtype, WEIGHT_F16);
    int32_t ids[4] = {TOK_BOS_ID, 300, 400, 100};
    float* a = prompt_logits(&m32, ids, 4, 16);
    float* b = prompt_logits(&m16, ids, 4, 16);
    float max_ref;
    float diff = max_abs_diff(b, a, 4 * 512, &max_ref);
    print_message("fp16 vs fp32 logits: relative %.3g\n", (double)(diff / max_ref));
    assert_true(diff / max_ref < 1e-2f);
    assert_true(diff > 0.0f); // fp16 really rounded the weights
    free(a);
    free(b);
    model_free(&m32);
    model_free(&m16);
}

// ---- export formats ---------------------------------------------------------

static void test_export_v1_and_legacy_round_trip_exactly(void** state) {
    (void)state;
    char model_path[512], v1_path[512], legacy_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    snprintf(v1_path, sizeof v1_path, "%s/stories260K.v1.bin", test_scratch_dir());
    snprintf(legacy_path, sizeof legacy_path, "%s/stories260K.v0.bin", test_scratch_dir());
    model original, v1, legacy;
    load_or_fail(&original, model_path, MODEL_DTYPE_DEFAULT);
    error_info err = {{0}};
    assert_int_equal(model_write_checkpoint(&original, v1_path, MODEL_FORMAT_EXPORT_V1, 0, &err), 0);
    assert_int_equal(model_write_checkpoint(&original, legacy_path, MODEL_FORMAT_LEGACY, 0, &err), 0);
    load_or_fail(&v1, v1_path, MODEL_DTYPE_DEFAULT);
    load_or_fail(&legacy, legacy_path, MODEL_DTYPE_DEFAULT);
    assert_int_equal(v1.format, MODEL_FORMAT_EXPORT_V1);
    assert_int_equal(legacy.format, MODEL_FORMAT_LEGACY);
    // The rewritten legacy file is byte-identical to llama2.c's original
    // except for the RoPE tables, which are skipped on reading.
    size_t size_a, size_b;
    unsigned char* a = test_read_file(model_path, &size_a);
    unsigned char* b = test_read_file(legacy_path, &size_b);
    assert_int_equal(size_a, size_b);
    size_t rope_start = size_a - 2 * 512 * 4 * 4;
    assert_memory_equal(a, b, rope_start);
    free(a);
    free(b);
    int32_t ids[4] = {TOK_BOS_ID, 300, 400, 100};
    float* reference = prompt_logits(&original, ids, 4, 16);
    float* from_v1 = prompt_logits(&v1, ids, 4, 16);
    assert_memory_equal(reference, from_v1, 4 * 512 * sizeof(float));
    free(reference);
    free(from_v1);
    model_free(&original);
    model_free(&v1);
    model_free(&legacy);
}

static void test_export_v2_q8_loads_and_stays_close(void** state) {
    (void)state;
    char model_path[512], v2_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    snprintf(v2_path, sizeof v2_path, "%s/stories260K.q80.bin", test_scratch_dir());
    model original, q8, q8_widened;
    load_or_fail(&original, model_path, MODEL_DTYPE_DEFAULT);
    error_info err = {{0}};
    const int group_size = 64;
    assert_int_equal(model_write_checkpoint(&original, v2_path, MODEL_FORMAT_EXPORT_V2, group_size, &err), 0);
    load_or_fail(&q8, v2_path, MODEL_DTYPE_DEFAULT);
    load_or_fail(&q8_widened, v2_path, MODEL_DTYPE_FP32);
    assert_int_equal(q8.format, MODEL_FORMAT_EXPORT_V2);
    assert_int_equal(q8.dtype, WEIGHT_Q8_0);
    assert_int_equal(q8.layers[0].wq.group_size, group_size);
    // Exact bytes: one int8 per matrix value plus one fp32 scale per 64.
    uint64_t norm_floats = (2 * 5 + 1) * 64;
    uint64_t matrix_values = original.n_parameters - norm_floats;
    assert_int_equal(q8.weight_bytes, matrix_values + matrix_values / group_size * 4 + norm_floats * 4);
    // The file size matches what the loader demanded.
    size_t file_size;
    free(test_read_file(v2_path, &file_size));
    assert_int_equal(file_size, 256 + norm_floats * 4 + matrix_values + matrix_values / group_size * 4);
    // Every dequantized weight is within half a step of the original.
    const weight_matrix* w2 = &q8_widened.layers[3].w2; // groups span rows here (hidden 172)
    const weight_matrix* w2_ref = &original.layers[3].w2;
    const float* q8_scales = q8.layers[3].w2.scales;
    for (int i = 0; i < w2->rows * w2->cols; i++) {
        float error = fabsf(((const float*)w2->values)[i] - ((const float*)w2_ref->values)[i]);
        assert_true(error <= q8_scales[i / group_size] * 0.5f + 1e-7f);
    }
    // The int8 kernel and the widened fp32 weights agree closely, and both
    // stay close to the fp32 model.
    int32_t ids[4] = {TOK_BOS_ID, 300, 400, 100};
    float* reference = prompt_logits(&original, ids, 4, 16);
    float* quantized = prompt_logits(&q8, ids, 4, 16);
    float* widened = prompt_logits(&q8_widened, ids, 4, 16);
    float max_ref;
    float diff_q = max_abs_diff(quantized, reference, 4 * 512, &max_ref);
    float diff_kernel = max_abs_diff(quantized, widened, 4 * 512, NULL);
    print_message("q8_0 vs fp32 logits: relative %.3g; q8 kernel vs widened %.3g\n", (double)(diff_q / max_ref),
                  (double)(diff_kernel / max_ref));
    assert_true(diff_q / max_ref < 0.05f);
    assert_true(diff_kernel / max_ref < 1e-4f);
    free(reference);
    free(quantized);
    free(widened);
    model_free(&original);
    model_free(&q8);
    model_free(&q8_widened);
}

// ---- batch invariance of the forward pass --------------------------------------

static void test_prefill_equals_token_by_token_for_any_block_size(void** state) {
    (void)state;
    char model_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    model m;
    load_or_fail(&m, model_path, MODEL_DTYPE_DEFAULT);
    const int n = 40;
    int32_t ids[40];
    for (int i = 0; i < n; i++) ids[i] = i == 0 ? TOK_BOS_ID : 3 + (i * 37) % 500;
    float* batched = prompt_logits(&m, ids, n, 16);
    int block_sizes[] = {1, 7, 64, 512};
    for (size_t k = 0; k < sizeof block_sizes / sizeof block_sizes[0]; k++) {
        float* other = prompt_logits(&m, ids, n, block_sizes[k]);
        assert_memory_equal(batched, other, (size_t)n * 512 * sizeof(float));
        free(other);
    }
    // Token by token (one row per forward call) gives the same bits.
    kv_memory kv;
    forward_state fs;
    error_info err = {{0}};
    assert_int_equal(kv_memory_init(&kv, &m.config, KV_F32, 32, 16, &err), 0);
    assert_int_equal(forward_state_init(&fs, &m.config, 1, 512, &err), 0);
    int32_t table[32];
    for (int b = 0; b < 32; b++) table[b] = b;
    const int32_t* tables[1] = {table};
    float logits[512];
    for (int i = 0; i < n; i++) {
        batch_row row = {ids[i], i, 0, true};
        int32_t slot;
        forward_batch_map_slots(&slot, &row, 1, tables, 16);
        forward_batch step = {1, &row, 1, tables, &slot};
        assert_int_equal(forward(&m, &fs, &kv, &step, logits, NULL, &err), 0);
        assert_memory_equal(logits, batched + (size_t)i * 512, sizeof logits);
    }
    forward_state_free(&fs);
    kv_memory_free(&kv);
    free(batched);
    model_free(&m);
}

static void test_two_sequences_in_one_batch_equal_each_alone(void** state) {
    (void)state;
    char model_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    model m;
    load_or_fail(&m, model_path, MODEL_DTYPE_DEFAULT);
    int32_t a[5] = {TOK_BOS_ID, 300, 400, 100, 261};
    int32_t b[3] = {TOK_BOS_ID, 403, 407};
    float* alone_a = prompt_logits(&m, a, 5, 16);
    float* alone_b = prompt_logits(&m, b, 3, 16);
    kv_memory kv;
    forward_state fs;
    error_info err = {{0}};
    assert_int_equal(kv_memory_init(&kv, &m.config, KV_F32, 4, 16, &err), 0);
    assert_int_equal(forward_state_init(&fs, &m.config, 8, 512, &err), 0);
    int32_t table_a[1] = {2}, table_b[1] = {0};
    const int32_t* tables[2] = {table_a, table_b};
    // Interleaved rows of two sequences in one batch.
    batch_row rows[8] = {{1, 0, 0, true}, {1, 0, 1, true}, {300, 1, 0, true}, {403, 1, 1, true},
                         {400, 2, 0, true}, {407, 2, 1, true}, {100, 3, 0, true}, {261, 4, 0, true}};
    int32_t slots[8];
    forward_batch_map_slots(slots, rows, 8, tables, 16);
    forward_batch batch = {8, rows, 2, tables, slots};
    float logits[8 * 512];
    assert_int_equal(forward(&m, &fs, &kv, &batch, logits, NULL, &err), 0);
    int a_row = 0, b_row = 0;
    for (int r = 0; r < 8; r++) {
        const float* expected = rows[r].sequence == 0 ? alone_a + (size_t)(a_row++) * 512 : alone_b + (size_t)(b_row++) * 512;
        assert_memory_equal(logits + (size_t)r * 512, expected, 512 * sizeof(float));
    }
    forward_state_free(&fs);
    kv_memory_free(&kv);
    free(alone_a);
    free(alone_b);
    model_free(&m);
}

static void test_forward_rejects_bad_rows(void** state) {
    (void)state;
    char model_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    model m;
    load_or_fail(&m, model_path, MODEL_DTYPE_DEFAULT);
    kv_memory kv;
    forward_state fs;
    error_info err = {{0}};
    assert_int_equal(kv_memory_init(&kv, &m.config, KV_F32, 2, 16, &err), 0);
    assert_int_equal(forward_state_init(&fs, &m.config, 1, 512, &err), 0);
    int32_t table[2] = {0, 1};
    const int32_t* tables[1] = {table};
    float logits[512];
    batch_row bad_token = {512, 0, 0, true};
    const int32_t slot = 0; // the rows are rejected before their slots are read
    forward_batch batch = {1, &bad_token, 1, tables, &slot};
    assert_int_equal(forward(&m, &fs, &kv, &batch, logits, NULL, &err), -1);
    assert_non_null(strstr(err.message, "token 512 outside the vocabulary"));
    batch_row bad_position = {1, 512, 0, true};
    batch.rows = &bad_position;
    assert_int_equal(forward(&m, &fs, &kv, &batch, logits, NULL, &err), -1);
    assert_non_null(strstr(err.message, "position 512"));
    int32_t bad_table[1] = {5};
    const int32_t* bad_tables[1] = {bad_table};
    batch_row row = {1, 0, 0, true};
    forward_batch bad_block = {1, &row, 1, bad_tables, &slot};
    assert_int_equal(forward(&m, &fs, &kv, &bad_block, logits, NULL, &err), -1);
    assert_non_null(strstr(err.message, "block 5 outside the pool of 2"));
    const int32_t bad_slot = 2 * 16; // one past the pool's 2 blocks of 16
    forward_batch bad_slot_batch = {1, &row, 1, tables, &bad_slot};
    assert_int_equal(forward(&m, &fs, &kv, &bad_slot_batch, logits, NULL, &err), -1);
    assert_non_null(strstr(err.message, "slot 32 outside the pool's 32 slots"));
    forward_state_free(&fs);
    kv_memory_free(&kv);
    model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bos_logits_match_reference),
        cmocka_unit_test(test_greedy_ids_match_golden),
        cmocka_unit_test(test_greedy_text_once_upon_a_time),
        cmocka_unit_test(test_greedy_text_the_little_dog),
        cmocka_unit_test(test_weight_bytes_are_exact),
        cmocka_unit_test(test_fp16_weights_stay_close),
        cmocka_unit_test(test_export_v1_and_legacy_round_trip_exactly),
        cmocka_unit_test(test_export_v2_q8_loads_and_stays_close),
        cmocka_unit_test(test_prefill_equals_token_by_token_for_any_block_size),
        cmocka_unit_test(test_two_sequences_in_one_batch_equal_each_alone),
        cmocka_unit_test(test_forward_rejects_bad_rows),
    };
    return cmocka_run_group_tests_name("engine/model", tests, NULL, NULL);
}
