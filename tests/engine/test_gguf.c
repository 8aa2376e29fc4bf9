// GGUF files made by llama.cpp (../shared/gguf, see its README): the
// container reader, the llama model loader against the llama2.c checkpoint
// and against llama.cpp's greedy and logit goldens, the lossless Q8_0/Q4_0
// regrouping, the SentencePiece tokenizer against llama.cpp's test vectors,
// and hostile files (truncated, bit-flipped, absurd counts and offsets).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/forward.h"
#include "engine/gguf.h"
#include "engine/gguf_model.h"
#include "engine/gguf_vocab.h"
#include "engine/kv_memory.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/fp16.h"
#include "tests/test_support.h"

// ---- the reference files -------------------------------------------------------------------

// ../shared/gguf/<name> (SERVELAB_SHARED moves ../shared); false when absent.
static bool gguf_reference_path(char* out, size_t capacity, const char* name) {
    const char* shared = getenv("SERVELAB_SHARED");
    int written = snprintf(out, capacity, "%s/gguf/%s", shared ? shared : "../shared", name);
    struct stat st;
    return written > 0 && (size_t)written < capacity && stat(out, &st) == 0;
}

// Skips without ../shared/gguf; fails under CI, which always has it.
#define REQUIRE_GGUF_FILE(buffer, name)                                                               \
    do {                                                                                              \
        if (!gguf_reference_path((buffer), sizeof(buffer), (name))) {                                 \
            if (getenv("CI")) fail_msg("../shared/gguf/%s is missing and CI is set", (name));         \
            print_message("skipping: ../shared/gguf/%s is missing (llama.cpp reference files)\n", (name)); \
            skip();                                                                                   \
        }                                                                                             \
    } while (0)

static void load_gguf_or_fail(model* m, const char* path, model_dtype_choice dtype, int context_length) {
    gguf_model_options options = {dtype, context_length, false};
    error_info err = {{0}};
    if (gguf_model_load(m, path, &options, &err)) fail_msg("gguf_model_load(%s): %s", path, err.message);
}

// One case of a MODEL.golden file (README §8).
#define GOLDEN_STEPS 64
typedef struct golden_case {
    char prompt[128];
    int32_t prompt_ids[64];
    int n_prompt;
    int32_t greedy[GOLDEN_STEPS];
    float margin[GOLDEN_STEPS];
} golden_case;

static int read_numbers_line(const char* line, const char* tag, double* out, int capacity) {
    if (strncmp(line, tag, strlen(tag)) != 0) return -1;
    const char* p = line + strlen(tag);
    int n = 0;
    char* end;
    while (n < capacity) {
        double value = strtod(p, &end);
        if (end == p) break;
        out[n++] = value;
        p = end;
    }
    return n;
}

// Reads golden/<model>.golden: three cases in order. Fails the test on a bad file.
static void load_golden(const char* model_name, golden_case cases[3]) {
    char name[128], path[512];
    snprintf(name, sizeof name, "golden/%s.golden", model_name);
    REQUIRE_GGUF_FILE(path, name);
    char* text = test_read_text(path);
    int k = -1;
    double numbers[GOLDEN_STEPS + 1];
    for (char* line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        if (strncmp(line, "prompt: ", 8) == 0 || strcmp(line, "prompt:") == 0) {
            assert_true(++k < 3);
            memset(&cases[k], 0, sizeof cases[k]);
            snprintf(cases[k].prompt, sizeof cases[k].prompt, "%s", line[7] ? line + 8 : "");
        } else if (strncmp(line, "prompt_ids:", 11) == 0) {
            int n = read_numbers_line(line, "prompt_ids:", numbers, 64);
            for (int i = 0; i < n; i++) cases[k].prompt_ids[i] = (int32_t)numbers[i];
            cases[k].n_prompt = n;
        } else if (strncmp(line, "greedy:", 7) == 0) {
            assert_int_equal(read_numbers_line(line, "greedy:", numbers, GOLDEN_STEPS), GOLDEN_STEPS);
            for (int i = 0; i < GOLDEN_STEPS; i++) cases[k].greedy[i] = (int32_t)numbers[i];
        } else if (strncmp(line, "margin:", 7) == 0) {
            assert_int_equal(read_numbers_line(line, "margin:", numbers, GOLDEN_STEPS), GOLDEN_STEPS);
            for (int i = 0; i < GOLDEN_STEPS; i++) cases[k].margin[i] = (float)numbers[i];
        }
    }
    free(text);
    assert_int_equal(k, 2);
    for (int c = 0; c < 3; c++) assert_true(cases[c].n_prompt >= 1 && cases[c].prompt_ids[0] == 1);
}

// golden/<model>.logits-<k>: vocab floats, one a line.
static float* load_golden_logits(const char* model_name, int k, int vocab) {
    char name[128], path[512];
    snprintf(name, sizeof name, "golden/%s.logits-%d", model_name, k);
    REQUIRE_GGUF_FILE(path, name);
    char* text = test_read_text(path);
    float* logits = malloc((size_t)vocab * sizeof *logits);
    char* p = text;
    for (int i = 0; i < vocab; i++) {
        char* end;
        logits[i] = strtof(p, &end);
        if (end == p) fail_msg("%s: line %d is not a number", path, i + 1);
        p = end;
    }
    free(text);
    return logits;
}

// ---- running a model -----------------------------------------------------------------------

static int argmax_lowest(const float* logits, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i; // strictly greater: the lowest id wins a tie, as llama.cpp's golden
    return best;
}

// llama.cpp's golden procedure (README §7.1): the prompt as one batch, the
// last row's logits into first_logits (vocab floats, may be NULL), then
// n_steps greedy ids fed back one at a time, never stopping at EOS or BOS.
static void greedy_like_golden(const model* m, const int32_t* prompt, int n_prompt, int n_steps, int32_t* out,
                               float* first_logits) {
    const model_config* c = &m->config;
    const int block_size = 16, context = n_prompt + n_steps;
    const int n_blocks = (context + block_size - 1) / block_size;
    kv_memory kv;
    forward_state state;
    error_info err = {{0}};
    assert_int_equal(kv_memory_init(&kv, c, KV_F32, n_blocks, block_size, &err), 0);
    assert_int_equal(forward_state_init(&state, c, n_prompt, context, &err), 0);
    int32_t* table = malloc((size_t)n_blocks * sizeof *table);
    for (int b = 0; b < n_blocks; b++) table[b] = b;
    const int32_t* tables[1] = {table};
    batch_row* rows = malloc((size_t)n_prompt * sizeof *rows);
    float* logits = malloc((size_t)n_prompt * (size_t)c->vocab_size * sizeof *logits);
    for (int i = 0; i < n_prompt; i++) rows[i] = (batch_row){prompt[i], i, 0, true};
    int32_t* slots = malloc((size_t)n_prompt * sizeof *slots);
    forward_batch_map_slots(slots, rows, n_prompt, tables, block_size);
    forward_batch batch = {n_prompt, rows, 1, tables, slots};
    if (forward(m, &state, &kv, &batch, logits, NULL, &err)) fail_msg("forward: %s", err.message);
    const float* last = logits + (size_t)(n_prompt - 1) * (size_t)c->vocab_size;
    if (first_logits) memcpy(first_logits, last, (size_t)c->vocab_size * sizeof *logits);
    int32_t token = argmax_lowest(last, c->vocab_size);
    for (int step = 0; step < n_steps; step++) {
        out[step] = token;
        if (step + 1 == n_steps) break;
        rows[0] = (batch_row){token, n_prompt + step, 0, true};
        forward_batch_map_slots(slots, rows, 1, tables, block_size);
        forward_batch one = {1, rows, 1, tables, slots};
        if (forward(m, &state, &kv, &one, logits, NULL, &err)) fail_msg("forward: %s", err.message);
        token = argmax_lowest(logits, c->vocab_size);
    }
    free(logits);
    free(rows);
    free(slots);
    free(table);
    forward_state_free(&state);
    kv_memory_free(&kv);
}

// KL(p || q) of the softmaxes of two logit vectors, p the reference (nats).
static double kl_divergence(const float* reference, const float* ours, int n) {
    double max_p = reference[0], max_q = ours[0];
    for (int i = 1; i < n; i++) {
        if (reference[i] > max_p) max_p = reference[i];
        if (ours[i] > max_q) max_q = ours[i];
    }
    double sum_p = 0, sum_q = 0;
    for (int i = 0; i < n; i++) {
        sum_p += exp(reference[i] - max_p);
        sum_q += exp(ours[i] - max_q);
    }
    double kl = 0;
    for (int i = 0; i < n; i++) {
        double log_p = reference[i] - max_p - log(sum_p), log_q = ours[i] - max_q - log(sum_q);
        kl += exp(log_p) * (log_p - log_q);
    }
    return kl;
}

static float max_abs_difference(const float* a, const float* b, int n) {
    float worst = 0.0f;
    for (int i = 0; i < n; i++) worst = fmaxf(worst, fabsf(a[i] - b[i]));
    return worst;
}

static float max_abs(const float* a, int n) {
    float worst = 0.0f;
    for (int i = 0; i < n; i++) worst = fmaxf(worst, fabsf(a[i]));
    return worst;
}

// What one model file gives against its golden, over the three prompts.
typedef struct golden_comparison {
    int equal_ids;           // greedy ids equal at the same position (of 3 x 64)
    int first_divergence[3]; // step of the first different id per prompt, 64 when none
    float worst_abs;         // max |logit - golden| at the first position, over the prompts
    double worst_kl;         // max KL(golden || ours) at the first position
} golden_comparison;

static golden_comparison compare_with_golden(const model* m, const char* golden_model) {
    golden_case cases[3];
    load_golden(golden_model, cases);
    golden_comparison result = {0, {64, 64, 64}, 0.0f, 0.0};
    const int vocab = m->config.vocab_size;
    float* logits = malloc((size_t)vocab * sizeof *logits);
    for (int k = 0; k < 3; k++) {
        int32_t ids[GOLDEN_STEPS];
        greedy_like_golden(m, cases[k].prompt_ids, cases[k].n_prompt, GOLDEN_STEPS, ids, logits);
        float* golden = load_golden_logits(golden_model, k, vocab);
        result.worst_abs = fmaxf(result.worst_abs, max_abs_difference(logits, golden, vocab));
        double kl = kl_divergence(golden, logits, vocab);
        if (kl > result.worst_kl) result.worst_kl = kl;
        for (int i = 0; i < GOLDEN_STEPS; i++) {
            if (ids[i] == cases[k].greedy[i]) result.equal_ids++;
            else if (result.first_divergence[k] == 64) result.first_divergence[k] = i;
        }
        free(golden);
    }
    free(logits);
    print_message("%s: greedy ids equal %d/192, first divergence %d %d %d, first-position logits max abs %.3g, "
                  "KL %.3g\n",
                  golden_model, result.equal_ids, result.first_divergence[0], result.first_divergence[1],
                  result.first_divergence[2], (double)result.worst_abs, result.worst_kl);
    return result;
}

// ---- the container -------------------------------------------------------------------------

static void test_header_of_stories(void** state) {
    (void)state;
    char path[512];
    REQUIRE_GGUF_FILE(path, "stories260K-f32.gguf");
    gguf_file f;
    error_info err = {{0}};
    if (gguf_open(&f, path, &err)) fail_msg("%s", err.message);
    // TENSORS.txt: v3, 48 tensors, 19 keys, data at 14176, alignment 32.
    assert_int_equal(f.version, 3);
    assert_int_equal(f.n_tensors, 48);
    assert_int_equal(f.n_kv, 19);
    assert_int_equal(f.data_offset, 14176);
    assert_int_equal(f.alignment, 32);
    const gguf_tensor* q = gguf_find_tensor(&f, "blk.0.attn_k.weight");
    assert_non_null(q);
    assert_int_equal(q->ne[0], 64);
    assert_int_equal(q->ne[1], 32);
    assert_int_equal(q->offset, 278784);
    assert_int_equal(q->bytes, 8192);
    uint64_t value = 0;
    assert_int_equal(gguf_get_uint(&f, "llama.attention.head_count_kv", 1000, &value, &err), 1);
    assert_int_equal(value, 4);
    assert_int_equal(gguf_get_uint(&f, "llama.no_such_key", 1000, &value, &err), 0);
    // A string asked for as a number names the key.
    assert_int_equal(gguf_get_uint(&f, "general.architecture", 1000, &value, &err), -1);
    assert_non_null(strstr(err.message, "'general.architecture': expected an integer, found string"));
    char text[32];
    assert_int_equal(gguf_get_string(&f, "tokenizer.ggml.model", text, sizeof text, &err), 1);
    assert_string_equal(text, "llama");
    gguf_close(&f);
}

// ---- stories260K: the same weights as the llama2.c checkpoint ---------------------------------

static void test_stories_gguf_equals_checkpoint(void** state) {
    (void)state;
    char gguf_path[512], bin_path[512];
    REQUIRE_GGUF_FILE(gguf_path, "stories260K-f32.gguf");
    REQUIRE_SHARED_MODEL(bin_path, "stories260K.bin");
    model from_gguf, from_bin;
    // The converter writes context_length 128 (README §11); the checkpoint's is 512.
    load_gguf_or_fail(&from_gguf, gguf_path, MODEL_DTYPE_DEFAULT, 512);
    error_info err = {{0}};
    if (model_load(&from_bin, bin_path, MODEL_DTYPE_DEFAULT, &err)) fail_msg("%s", err.message);
    const model_config *a = &from_gguf.config, *b = &from_bin.config;
    assert_int_equal(a->dim, b->dim);
    assert_int_equal(a->hidden_dim, b->hidden_dim);
    assert_int_equal(a->n_layers, b->n_layers);
    assert_int_equal(a->n_heads, b->n_heads);
    assert_int_equal(a->n_kv_heads, 4);
    assert_int_equal(a->n_kv_heads, b->n_kv_heads);
    assert_int_equal(a->vocab_size, 512);
    assert_int_equal(from_gguf.format, MODEL_FORMAT_GGUF);
    assert_int_equal(from_gguf.dtype, WEIGHT_F32);
    // F32 tensors are the file's bytes, not a copy.
    assert_non_null(from_gguf.file_mapping);
    assert_true((const unsigned char*)from_gguf.layers[0].wq.values >= (const unsigned char*)from_gguf.file_mapping);
    // Every matrix holds the checkpoint's values bit for bit.
    const char* names[] = {"token_embedding", "layers.0.wq", "layers.2.wk", "layers.4.w2", "layers.3.w3", "classifier"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const weight_matrix *x = model_matrix_by_name(&from_gguf, names[i]), *y = model_matrix_by_name(&from_bin, names[i]);
        assert_int_equal(x->rows, y->rows);
        assert_int_equal(x->cols, y->cols);
        assert_memory_equal(x->values, y->values, (size_t)x->rows * (size_t)x->cols * sizeof(float));
    }
    assert_memory_equal(from_gguf.rms_final, from_bin.rms_final, (size_t)a->dim * sizeof(float));

    // llama2.c's own golden (../shared/models/stories260K.golden: BOS, and
    // BOS 300 400 100, 200 greedy ids each) through the same engine.
    const int32_t prompts[2][4] = {{1}, {1, 300, 400, 100}};
    const int lengths[2] = {1, 4};
    for (int p = 0; p < 2; p++) {
        int32_t ids_gguf[200], ids_bin[200];
        int n_gguf = test_engine_generate(&from_gguf, prompts[p], lengths[p], 200, 0.0f, 0.0f, 1, ids_gguf).n_generated;
        int n_bin = test_engine_generate(&from_bin, prompts[p], lengths[p], 200, 0.0f, 0.0f, 1, ids_bin).n_generated;
        assert_int_equal(n_gguf, n_bin);
        assert_memory_equal(ids_gguf, ids_bin, (size_t)n_gguf * sizeof(int32_t));
    }
    // Logits of one prompt: the same bits.
    int32_t prompt[5] = {1, 403, 407, 261, 378};
    int32_t ids_a[8], ids_b[8];
    float* logits_a = malloc(512 * sizeof(float));
    float* logits_b = malloc(512 * sizeof(float));
    greedy_like_golden(&from_gguf, prompt, 5, 8, ids_a, logits_a);
    greedy_like_golden(&from_bin, prompt, 5, 8, ids_b, logits_b);
    assert_memory_equal(logits_a, logits_b, 512 * sizeof(float));
    assert_memory_equal(ids_a, ids_b, sizeof ids_a);
    free(logits_a);
    free(logits_b);
    model_free(&from_gguf);
    model_free(&from_bin);
}

static void test_stories_gguf_against_llama_cpp(void** state) {
    (void)state;
    char path[512];
    REQUIRE_GGUF_FILE(path, "stories260K-f32.gguf");
    model m;
    load_gguf_or_fail(&m, path, MODEL_DTYPE_DEFAULT, 0);
    assert_int_equal(m.config.max_seq_len, 128); // the file's context_length
    golden_comparison r = compare_with_golden(&m, "stories260K-f32");
    // README §7.2: llama2.c's fp32 is within 7.6e-6 of llama.cpp; every margin >= 0.07.
    assert_int_equal(r.equal_ids, 192);
    assert_true(r.worst_abs < 2e-5f);
    model_free(&m);
}

// ---- synth-gqa: F16, Q8_0 and Q4_0 as llama-quantize wrote them -----------------------------------

static void test_synth_f16_against_llama_cpp(void** state) {
    (void)state;
    char path[512];
    REQUIRE_GGUF_FILE(path, "synth-gqa-f16.gguf");
    model m;
    load_gguf_or_fail(&m, path, MODEL_DTYPE_DEFAULT, 0);
    assert_int_equal(m.dtype, WEIGHT_F16);
    assert_int_equal(m.config.n_kv_heads, 4);
    assert_int_equal(m.config.vocab_size, 32000);
    assert_true((const unsigned char*)m.layers[1].w2.values >= (const unsigned char*)m.file_mapping);
    golden_comparison r = compare_with_golden(&m, "synth-gqa-f16");
    // llama.cpp's generic F16 path rounds the activations to fp16 (README
    // §7.3: 1.4e-3 against its own fp32-activation path); ours keeps fp32.
    assert_int_equal(r.equal_ids, 192);
    assert_true(r.worst_abs < 5e-3f);
    golden_comparison against_f32 = compare_with_golden(&m, "synth-gqa-f32");
    assert_int_equal(against_f32.equal_ids, 192);
    model_free(&m);
}

static void test_synth_q8_0_against_llama_cpp(void** state) {
    (void)state;
    char path[512];
    REQUIRE_GGUF_FILE(path, "synth-gqa-q8_0.gguf");
    model m;
    load_gguf_or_fail(&m, path, MODEL_DTYPE_DEFAULT, 0);
    assert_int_equal(m.dtype, WEIGHT_I8);
    assert_int_equal(m.layers[0].wq.group_size, 32);
    assert_null(m.layers[0].wq.zero_points);
    // Bytes per token as the file's: 34 bytes per 32 weights.
    assert_int_equal(weight_matrix_bytes(&m.layers[0].wq), 128 * 128 / 32 * 34);
    golden_comparison r = compare_with_golden(&m, "synth-gqa-q8_0");
    // llama.cpp rounds the activations to Q8_0 as well (README §7.3); the
    // W8A16 kernel keeps them fp32. Its own q8_0 vs f32: max abs 0.051.
    assert_true(r.worst_abs < 0.05f);
    assert_true(r.worst_kl < 1e-3);
    for (int k = 0; k < 3; k++) assert_true(r.first_divergence[k] >= 1);
    model_free(&m);
}

static void test_synth_q4_0_against_llama_cpp(void** state) {
    (void)state;
    char path[512];
    REQUIRE_GGUF_FILE(path, "synth-gqa-q4_0.gguf");
    model m;
    load_gguf_or_fail(&m, path, MODEL_DTYPE_DEFAULT, 0);
    assert_int_equal(m.dtype, WEIGHT_I4);
    assert_int_equal(weight_matrix_bytes(&m.layers[0].w1), 384 * 128 / 32 * 18);
    golden_comparison r = compare_with_golden(&m, "synth-gqa-q4_0");
    // Both sides use the same 4-bit weights; the activations differ (bf16
    // here, Q8_0 there), far less than Q4_0's own error (0.79 vs f32).
    assert_true(r.worst_abs < 0.1f);
    assert_true(r.worst_kl < 1e-2);
    model_free(&m);
}

// The regrouped Q8_0 / Q4_0 matrices hold exactly the file's values:
// every row widened by the kernel equals the block decoded here by hand.
static void check_regrouped(const char* file, gguf_tensor_type type) {
    char path[512];
    REQUIRE_GGUF_FILE(path, file);
    model m;
    load_gguf_or_fail(&m, path, MODEL_DTYPE_DEFAULT, 0);
    gguf_file f;
    error_info err = {{0}};
    if (gguf_open(&f, path, &err)) fail_msg("%s", err.message);
    const char* tensors[] = {"blk.3.ffn_down.weight", "blk.0.attn_k.weight", "token_embd.weight"};
    const char* matrices[] = {"layers.3.w2", "layers.0.wk", "token_embedding"};
    for (int i = 0; i < 3; i++) {
        const gguf_tensor* t = gguf_find_tensor(&f, tensors[i]);
        assert_int_equal(t->type, type);
        const weight_matrix* w = model_matrix_by_name(&m, matrices[i]);
        float* row = malloc((size_t)w->cols * sizeof *row);
        int rows_checked[3] = {0, w->rows / 2, w->rows - 1};
        for (int r = 0; r < 3; r++) {
            weight_row_to_f32(row, w, rows_checked[r], NULL);
            for (int col = 0; col < w->cols; col++) {
                uint64_t index = (uint64_t)rows_checked[r] * (uint64_t)w->cols + (uint64_t)col;
                const unsigned char* block = t->data + index / 32 * (type == GGUF_TENSOR_Q8_0 ? 34 : 18);
                float d = fp16_to_fp32((uint16_t)(block[0] | block[1] << 8));
                int j = (int)(index % 32);
                float expected = type == GGUF_TENSOR_Q8_0
                                     ? d * (float)(int8_t)block[2 + j]
                                     : d * (float)((j < 16 ? block[2 + j] & 15 : block[2 + j - 16] >> 4) - 8);
                if (row[col] != expected)
                    fail_msg("%s row %d col %d: %g, the file says %g", tensors[i], rows_checked[r], col,
                             (double)row[col], (double)expected);
            }
        }
        free(row);
    }
    gguf_close(&f);
    model_free(&m);
}

static void test_q8_0_regrouped_exactly(void** state) {
    (void)state;
    check_regrouped("synth-gqa-q8_0.gguf", GGUF_TENSOR_Q8_0);
}

static void test_q4_0_regrouped_exactly(void** state) {
    (void)state;
    check_regrouped("synth-gqa-q4_0.gguf", GGUF_TENSOR_Q4_0);
}

// The loader runs Q8_0 with int8 activations (W8A8 g32, as llama.cpp); with
// float activations the regrouped weights are the file's values exactly.
static void use_float_activations(model* m) {
    for (int l = 0; l < m->config.n_layers; l++) {
        layer_weights* w = &m->layers[l];
        weight_matrix* matrices[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w1, &w->w2, &w->w3};
        for (int k = 0; k < 7; k++) matrices[k]->activation_bits = 0;
    }
    m->classifier.activation_bits = 0;
}

// --dtype fp32 widens every matrix: the Q8_0 file then gives the W8A16
// logits to within fp32 rounding (the same values, another sum order).
static void test_dtype_choice_widens(void** state) {
    (void)state;
    char path[512];
    REQUIRE_GGUF_FILE(path, "synth-gqa-q8_0.gguf");
    model packed, widened;
    load_gguf_or_fail(&packed, path, MODEL_DTYPE_DEFAULT, 0);
    load_gguf_or_fail(&widened, path, MODEL_DTYPE_FP32, 0);
    assert_int_equal(widened.dtype, WEIGHT_F32);
    assert_int_equal(packed.layers[0].wq.activation_bits, 8);
    assert_int_equal(packed.layers[0].wq.activation_block, 32);
    use_float_activations(&packed);
    int32_t prompt[5] = {1, 9038, 2501, 263, 931}, ids[1];
    float* a = malloc(32000 * sizeof(float));
    float* b = malloc(32000 * sizeof(float));
    greedy_like_golden(&packed, prompt, 5, 1, ids, a);
    greedy_like_golden(&widened, prompt, 5, 1, ids, b);
    assert_true(max_abs_difference(a, b, 32000) < 1e-4f * max_abs(b, 32000));
    free(a);
    free(b);
    model_free(&packed);
    model_free(&widened);
}

// ---- the tokenizer --------------------------------------------------------------------------

// llama.cpp's test-tokenizer-0 cases (README §9): every case of VOCAB.inp
// gives the ids of VOCAB.out, without BOS or EOS. Returns the cases passed.
static int run_tokenizer_vectors(const char* vocab_name, int expected_vocab_size) {
    char vocab_path[512], inp_path[512], out_path[512], name[256];
    snprintf(name, sizeof name, "vocab/%s", vocab_name);
    REQUIRE_GGUF_FILE(vocab_path, name);
    snprintf(name, sizeof name, "vocab/%s.inp", vocab_name);
    REQUIRE_GGUF_FILE(inp_path, name);
    snprintf(name, sizeof name, "vocab/%s.out", vocab_name);
    REQUIRE_GGUF_FILE(out_path, name);
    tokenizer* t = NULL;
    error_info err = {{0}};
    if (tok_load_gguf(&t, vocab_path, &err)) fail_msg("%s", err.message);
    assert_int_equal(tok_vocab_size(t), expected_vocab_size);
    char* inputs = test_read_text(inp_path);
    char* outputs = test_read_text(out_path);
    const char* separator = "\n__ggml_vocab_test__\n";
    int cases = 0, passed = 0;
    char* input = inputs;
    char* output_line = outputs;
    int32_t* ids = malloc(65536 * sizeof *ids);
    for (char* end; (end = strstr(input, separator)) != NULL; input = end + strlen(separator)) {
        *end = '\0';
        char* line_end = strchr(output_line, '\n');
        if (line_end) *line_end = '\0';
        int expected[512], n_expected = 0;
        for (char *p = output_line, *stop; n_expected < 512; p = stop) {
            long id = strtol(p, &stop, 10);
            if (stop == p) break;
            expected[n_expected++] = (int)id;
        }
        int n = 0;
        // llama.cpp's test: no BOS, no EOS, special text not parsed.
        if (tok_encode(t, input, false, false, ids, 65536, &n, &err)) fail_msg("case %d: %s", cases, err.message);
        bool same = n == n_expected;
        for (int i = 0; same && i < n; i++) same = ids[i] == expected[i];
        if (same) passed++;
        else print_message("%s case %d differs: '%s' (%d ids, expected %d)\n", vocab_name, cases, input, n, n_expected);
        cases++;
        output_line = line_end ? line_end + 1 : output_line + strlen(output_line);
    }
    print_message("%s tokenizer vectors: %d/%d cases give llama.cpp's ids\n", vocab_name, passed, cases);
    assert_int_equal(cases, 46);
    free(ids);
    free(inputs);
    free(outputs);
    tok_free(t);
    return passed;
}

static void test_llama_spm_vectors(void** state) {
    (void)state;
    assert_int_equal(run_tokenizer_vectors("ggml-vocab-llama-spm.gguf", 32000), 46);
}

static void test_gpt2_vectors(void** state) {
    (void)state;
    assert_int_equal(run_tokenizer_vectors("ggml-vocab-gpt-2.gguf", 50257), 46);
}

// The models' own tokenizers give llama.cpp's prompt ids (golden prompt_ids).
static void check_prompt_ids(const char* file, const char* golden_model) {
    char path[512];
    REQUIRE_GGUF_FILE(path, file);
    tokenizer* t = NULL;
    error_info err = {{0}};
    if (tok_load_gguf(&t, path, &err)) fail_msg("%s", err.message);
    assert_true(tok_adds_bos(t));
    assert_int_equal(tok_bos_id(t), 1);
    assert_int_equal(tok_eos_id(t), 2);
    golden_case cases[3];
    load_golden(golden_model, cases);
    for (int k = 0; k < 3; k++) {
        int32_t ids[64];
        int n = 0;
        assert_int_equal(tok_encode(t, cases[k].prompt, true, false, ids, 64, &n, &err), 0);
        assert_int_equal(n, cases[k].n_prompt);
        assert_memory_equal(ids, cases[k].prompt_ids, (size_t)n * sizeof(int32_t));
    }
    tok_free(t);
}

static void test_model_tokenizers_give_golden_prompt_ids(void** state) {
    (void)state;
    check_prompt_ids("stories260K-f32.gguf", "stories260K-f32");
    check_prompt_ids("synth-gqa-q4_0.gguf", "synth-gqa-q4_0");
}

// The GGUF copy of tok512 decodes like tok512.bin: spaces back from "▁".
static void test_stories_tokenizer_matches_tok512(void** state) {
    (void)state;
    char gguf_path[512], tok_path[512];
    REQUIRE_GGUF_FILE(gguf_path, "stories260K-f32.gguf");
    REQUIRE_SHARED_MODEL(tok_path, "tok512.bin");
    tokenizer *a = NULL, *b = NULL;
    error_info err = {{0}};
    if (tok_load_gguf(&a, gguf_path, &err) || tok_load(&b, tok_path, 512, &err)) fail_msg("%s", err.message);
    const char* texts[] = {"Once upon a time, there was a little girl named Lily.", "  two  spaces\nand a newline",
                           "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80", ""};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t ids_a[256], ids_b[256];
        int n_a = 0, n_b = 0;
        // No EOS: the converter renamed the special pieces (tok512's "\n</s>\n" is "</s>" in the GGUF).
        assert_int_equal(tok_encode(a, texts[i], true, false, ids_a, 256, &n_a, &err), 0);
        assert_int_equal(tok_encode(b, texts[i], true, false, ids_b, 256, &n_b, &err), 0);
        assert_int_equal(n_a, n_b);
        assert_memory_equal(ids_a, ids_b, (size_t)n_a * sizeof(int32_t));
        char text_a[512], text_b[512];
        tok_decode_text(a, ids_a[0], ids_a + 1, n_a - 1, text_a, sizeof text_a);
        tok_decode_text(b, ids_b[0], ids_b + 1, n_b - 1, text_b, sizeof text_b);
        assert_string_equal(text_a, text_b);
    }
    tok_free(a);
    tok_free(b);
}

// ---- hostile files --------------------------------------------------------------------------

// Loads bytes as a model and a tokenizer: either works, or fails with one
// line that starts with the file's name. Returns 0 when the model loaded.
static int load_hostile(const unsigned char* bytes, size_t size, char* message, size_t capacity) {
    gguf_file f;
    error_info err = {{0}};
    int status = gguf_parse(&f, bytes, size, "hostile.gguf", &err);
    if (status == 0) {
        model m;
        memset(&m, 0xab, sizeof m);
        status = gguf_model_from_file(&m, &f, NULL, &err);
        if (status == 0) {
            assert_int_equal(m.config.dim, 64);
            model_free(&m);
        } else {
            assert_null(m.layers);
            assert_null(m.storage);
        }
        tokenizer* t = NULL;
        error_info tok_err = {{0}};
        if (tok_from_gguf(&t, &f, &tok_err) == 0) {
            int32_t ids[64];
            int n = 0;
            tok_encode(t, "Once upon a time", true, false, ids, 64, &n, &tok_err);
            tok_free(t);
        } else {
            assert_non_null(strstr(tok_err.message, "hostile.gguf: "));
        }
        gguf_close(&f);
    }
    if (status != 0) {
        if (strncmp(err.message, "hostile.gguf: ", 14) != 0) fail_msg("message does not name the file: %s", err.message);
        assert_null(strchr(err.message, '\n'));
    }
    snprintf(message, capacity, "%s", err.message);
    return status;
}

static void expect_refused(const unsigned char* bytes, size_t size, const char* expected) {
    char message[512];
    if (load_hostile(bytes, size, message, sizeof message) == 0) fail_msg("accepted; expected '%s'", expected);
    if (!strstr(message, expected)) fail_msg("message '%s' does not say '%s'", message, expected);
}

static void put_u64(unsigned char* p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u32(unsigned char* p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

// Byte offset of the first occurrence of needle in the header.
static size_t find_bytes(const unsigned char* bytes, size_t size, const char* needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= size; i++)
        if (memcmp(bytes + i, needle, n) == 0) return i;
    fail_msg("'%s' not found", needle);
    return 0;
}

static void test_hostile_headers(void** state) {
    (void)state;
    char path[512];
    REQUIRE_GGUF_FILE(path, "stories260K-f32.gguf");
    size_t size = 0;
    unsigned char* good = test_read_file(path, &size);
    unsigned char* bytes = malloc(size);
    char message[512];
    memcpy(bytes, good, size);
    assert_int_equal(load_hostile(bytes, size, message, sizeof message), 0);

    // Truncations: inside the header, the metadata, the tensor infos, the data.
    expect_refused(bytes, 3, "truncated: 3 bytes");
    expect_refused(bytes, 10, "counts missing");
    expect_refused(bytes, 100, "19 metadata pairs and 48 tensors cannot fit in 100 bytes");
    expect_refused(bytes, 8000, "truncated");
    expect_refused(bytes, 13000, "truncated");
    expect_refused(bytes, size - 1, "ends past the file");
    expect_refused(bytes, size / 2, "ends past the file");

    memcpy(bytes, "GGUG", 4);
    expect_refused(bytes, size, "magic: expected \"GGUF\"");
    memcpy(bytes, good, size);
    put_u32(bytes + 4, 1);
    expect_refused(bytes, size, "version: expected 2 or 3, found 1");
    put_u32(bytes + 4, 2); // version 2 has the same layout for these files
    assert_int_equal(load_hostile(bytes, size, message, sizeof message), 0);
    memcpy(bytes, good, size);
    put_u64(bytes + 8, UINT64_MAX);
    expect_refused(bytes, size, "n_tensors: 18446744073709551615");
    put_u64(bytes + 8, 60000);
    expect_refused(bytes, size, "cannot fit");
    memcpy(bytes, good, size);
    put_u64(bytes + 16, 1ull << 40);
    expect_refused(bytes, size, "n_kv");

    // The tokens array: an absurd count, then an absurd string length.
    memcpy(bytes, good, size);
    size_t key = find_bytes(bytes, size, "tokenizer.ggml.tokens");
    size_t count_at = key + strlen("tokenizer.ggml.tokens") + 4 + 4; // key, value type, element type
    put_u64(bytes + count_at, 1ull << 60);
    expect_refused(bytes, size, "array of 1152921504606846976 string");
    memcpy(bytes, good, size);
    put_u64(bytes + count_at + 8, 1ull << 62); // the first string's length
    expect_refused(bytes, size, "string 0 of 512 truncated");
    memcpy(bytes, good, size);
    put_u32(bytes + key + strlen("tokenizer.ggml.tokens"), 99); // value type
    expect_refused(bytes, size, "value type 99");

    // A tensor info: name, n_dims, ne, type, offset (the last tensor, blk.4.ffn_norm.weight).
    memcpy(bytes, good, size);
    size_t name_at = find_bytes(bytes, size, "blk.4.ffn_norm.weight");
    size_t dims_at = name_at + strlen("blk.4.ffn_norm.weight");
    put_u32(bytes + dims_at, 5);
    expect_refused(bytes, size, "n_dims 5, expected 1..4");
    memcpy(bytes, good, size);
    put_u64(bytes + dims_at + 4, 0);
    expect_refused(bytes, size, "ne[0] = 0");
    memcpy(bytes, good, size);
    put_u32(bytes + dims_at + 12, 77);
    expect_refused(bytes, size, "type 77 is not a ggml type");
    memcpy(bytes, good, size);
    put_u32(bytes + dims_at + 12, GGUF_TENSOR_Q4_K); // 64 elements: not a multiple of 256
    expect_refused(bytes, size, "not a multiple of Q4_K's block of 256");
    memcpy(bytes, good, size);
    put_u64(bytes + dims_at + 16, 1ull << 50);
    expect_refused(bytes, size, "ends past the file");
    put_u64(bytes + dims_at + 16, 1170944 + 8);
    expect_refused(bytes, size, "not a multiple of the alignment 32");
    put_u64(bytes + dims_at + 16, 1170944 - 256); // onto blk.4.ffn_up.weight's last bytes
    expect_refused(bytes, size, "overlaps");

    // Metadata the model needs: wrong type, absurd value, unsupported architecture.
    memcpy(bytes, good, size);
    size_t heads_at = find_bytes(bytes, size, "llama.attention.head_count_kv") + strlen("llama.attention.head_count_kv");
    put_u32(bytes + heads_at + 4, 3);
    expect_refused(bytes, size, "n_kv_heads: expected a divisor of n_heads 8, found 3");
    put_u32(bytes + heads_at, GGUF_VALUE_FLOAT32);
    expect_refused(bytes, size, "'llama.attention.head_count_kv': expected an integer, found float32");
    memcpy(bytes, good, size);
    size_t arch_at = find_bytes(bytes, size, "general.architecture") + strlen("general.architecture") + 4 + 8;
    memcpy(bytes + arch_at, "gpt2x", 5); // 'llama' is 5 bytes
    expect_refused(bytes, size, "unsupported architecture gpt2x (supported: llama, qwen2)");
    memcpy(bytes, good, size);
    size_t rope_at = find_bytes(bytes, size, "llama.rope.dimension_count") + strlen("llama.rope.dimension_count");
    put_u32(bytes + rope_at + 4, 5);
    expect_refused(bytes, size, "rope.dimension_count: 5, expected an even count of at most head_dim 8");
    put_u32(bytes + rope_at + 4, 10);
    expect_refused(bytes, size, "rope.dimension_count: 10, expected an even count of at most head_dim 8");
    memcpy(bytes, good, size);
    memcpy(bytes + find_bytes(bytes, size, "blk.2.attn_q.weight"), "blk.2.attn_q.bias__", 19);
    expect_refused(bytes, size, "tensor 'blk.2.attn_q.weight' is missing");
    free(bytes);
    free(good);
}

// ---- general.alignment 1: tensors at odd addresses (issue 46 item 8) -------------------------

typedef struct gguf_bytes {
    unsigned char* bytes;
    size_t size, capacity;
} gguf_bytes;

static void append(gguf_bytes* b, const void* data, size_t n) {
    if (b->size + n > b->capacity) {
        b->capacity = (b->size + n) * 2;
        b->bytes = realloc(b->bytes, b->capacity);
        assert_non_null(b->bytes);
    }
    memcpy(b->bytes + b->size, data, n);
    b->size += n;
}

static void append_u32(gguf_bytes* b, uint32_t v) { append(b, &v, 4); } // the test hosts are little-endian
static void append_u64(gguf_bytes* b, uint64_t v) { append(b, &v, 8); }

// The same file with general.alignment = 1 and every tensor moved so that
// its address in the returned buffer is 1 past a multiple of 4: no F32 value
// sits where a float may be loaded.
static gguf_bytes misaligned_copy(const unsigned char* good, size_t size) {
    gguf_file f;
    error_info err = {{0}};
    if (gguf_parse(&f, good, size, "stories260K-f32.gguf", &err)) fail_msg("%s", err.message);
    assert_null(gguf_find_kv(&f, "general.alignment")); // the default 32 applies to this file
    // Metadata runs from byte 24 to the first tensor info (its name's u64 length).
    size_t infos_at = find_bytes(good, size, f.tensors[0].name) - 8;
    gguf_bytes out = {0};
    append(&out, good, 8); // magic and version
    append_u64(&out, (uint64_t)f.n_tensors);
    append_u64(&out, (uint64_t)f.n_kv + 1);
    append(&out, good + 24, infos_at - 24);
    append_u64(&out, strlen("general.alignment"));
    append(&out, "general.alignment", strlen("general.alignment"));
    append_u32(&out, GGUF_VALUE_UINT32);
    append_u32(&out, 1);
    size_t header_bytes = out.size;
    for (int i = 0; i < f.n_tensors; i++)
        header_bytes += 8 + strlen(f.tensors[i].name) + 4 + 8 * (size_t)f.tensors[i].n_dims + 4 + 8;
    // Data starts right after the header (alignment 1): place each tensor at
    // an absolute offset that is 1 mod 4 (malloc's buffer is 16-aligned).
    uint64_t* offsets = malloc((size_t)f.n_tensors * sizeof *offsets);
    uint64_t cursor = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        while ((header_bytes + cursor) % 4 != 1)
            cursor++;
        offsets[i] = cursor;
        cursor += f.tensors[i].bytes;
    }
    for (int i = 0; i < f.n_tensors; i++) {
        const gguf_tensor* t = &f.tensors[i];
        append_u64(&out, strlen(t->name));
        append(&out, t->name, strlen(t->name));
        append_u32(&out, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++)
            append_u64(&out, t->ne[d]);
        append_u32(&out, (uint32_t)t->type);
        append_u64(&out, offsets[i]);
    }
    assert_int_equal(out.size, header_bytes);
    for (int i = 0; i < f.n_tensors; i++) {
        while (out.size < header_bytes + offsets[i])
            append(&out, "\xee", 1);
        append(&out, f.tensors[i].data, (size_t)f.tensors[i].bytes);
    }
    free(offsets);
    gguf_close(&f);
    return out;
}

static bool address_aligned(const void* p, size_t alignment) { return (uintptr_t)p % alignment == 0; }

// general.alignment 1 is a power of two, so the file loads; its F32
// tensors must then be copied to aligned memory rather than read in place
// (a misaligned float load is undefined behaviour: UBSan flagged
// kernels/cpu/matmul.c). The logits are the aligned file's, bit for bit.
static void test_alignment_one_copies_misaligned_tensors(void** state) {
    (void)state;
    char path[512];
    REQUIRE_GGUF_FILE(path, "stories260K-f32.gguf");
    size_t size = 0;
    unsigned char* good = test_read_file(path, &size);
    gguf_bytes odd = misaligned_copy(good, size);
    assert_true(address_aligned(odd.bytes, 16));

    error_info err = {{0}};
    gguf_file aligned_file, odd_file;
    model aligned, misaligned;
    assert_int_equal(gguf_parse(&aligned_file, good, size, "aligned.gguf", &err), 0);
    if (gguf_model_from_file(&aligned, &aligned_file, NULL, &err)) fail_msg("%s", err.message);
    if (gguf_parse(&odd_file, odd.bytes, odd.size, "odd.gguf", &err)) fail_msg("%s", err.message);
    assert_int_equal(odd_file.alignment, 1);
    assert_false(address_aligned(gguf_find_tensor(&odd_file, "blk.0.attn_q.weight")->data, 4));
    if (gguf_model_from_file(&misaligned, &odd_file, NULL, &err)) fail_msg("%s", err.message);

    // The forward pass first: under UBSan a float read in place at an odd
    // address stops here.
    int32_t prompt[5] = {1, 403, 407, 261, 378};
    int32_t ids_aligned[8], ids_misaligned[8];
    float* logits_aligned = malloc(512 * sizeof(float));
    float* logits_misaligned = malloc(512 * sizeof(float));
    greedy_like_golden(&aligned, prompt, 5, 8, ids_aligned, logits_aligned);
    greedy_like_golden(&misaligned, prompt, 5, 8, ids_misaligned, logits_misaligned);
    assert_memory_equal(logits_aligned, logits_misaligned, 512 * sizeof(float));
    assert_memory_equal(ids_aligned, ids_misaligned, sizeof ids_aligned);
    free(logits_aligned);
    free(logits_misaligned);

    // Every matrix and norm the kernels read is float-aligned.
    const model_config* c = &misaligned.config;
    assert_true(address_aligned(misaligned.token_embedding.values, 4));
    assert_true(address_aligned(misaligned.classifier.values, 4));
    assert_true(address_aligned(misaligned.rms_final, 4));
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights* w = &misaligned.layers[l];
        const weight_matrix* matrices[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w1, &w->w2, &w->w3};
        for (int k = 0; k < 7; k++)
            if (!address_aligned(matrices[k]->values, 4)) fail_msg("layer %d matrix %d is misaligned", l, k);
        assert_true(address_aligned(w->rms_attention, 4));
        assert_true(address_aligned(w->rms_ffn, 4));
    }
    model_free(&aligned);
    model_free(&misaligned);
    gguf_close(&aligned_file);
    gguf_close(&odd_file);
    free(odd.bytes);
    free(good);
}

// Every header byte of stories260K-f32.gguf flipped in turn (XOR 0xff,
// then the low bit): each load succeeds or says why in one line.
static void test_bit_flipped_headers(void** state) {
    (void)state;
    char path[512];
    REQUIRE_GGUF_FILE(path, "stories260K-f32.gguf");
    size_t size = 0;
    unsigned char* bytes = test_read_file(path, &size);
    const size_t header_bytes = 14176; // TENSORS.txt: the data section starts here
    int refused = 0, loaded = 0;
    char message[512];
    for (size_t i = 0; i < header_bytes; i++) {
        const unsigned char masks[2] = {0xff, 0x01};
        for (int k = 0; k < 2; k++) {
            bytes[i] ^= masks[k];
            if (load_hostile(bytes, size, message, sizeof message) == 0) loaded++;
            else refused++;
            bytes[i] ^= masks[k];
        }
    }
    print_message("bit flips over %zu header bytes: %d refused with a message, %d still load\n", header_bytes,
                  refused, loaded);
    assert_true(refused > 0 && loaded > 0);
    free(bytes);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_of_stories),
        cmocka_unit_test(test_stories_gguf_equals_checkpoint),
        cmocka_unit_test(test_stories_gguf_against_llama_cpp),
        cmocka_unit_test(test_synth_f16_against_llama_cpp),
        cmocka_unit_test(test_synth_q8_0_against_llama_cpp),
        cmocka_unit_test(test_synth_q4_0_against_llama_cpp),
        cmocka_unit_test(test_q8_0_regrouped_exactly),
        cmocka_unit_test(test_q4_0_regrouped_exactly),
        cmocka_unit_test(test_dtype_choice_widens),
        cmocka_unit_test(test_llama_spm_vectors),
        cmocka_unit_test(test_gpt2_vectors),
        cmocka_unit_test(test_model_tokenizers_give_golden_prompt_ids),
        cmocka_unit_test(test_stories_tokenizer_matches_tok512),
        cmocka_unit_test(test_hostile_headers),
        cmocka_unit_test(test_alignment_one_copies_misaligned_tensors),
        cmocka_unit_test(test_bit_flipped_headers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
