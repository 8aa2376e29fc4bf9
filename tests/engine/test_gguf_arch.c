// The per-model hyper-parameters a GGUF file sets, through the real loader
// and forward pass: architecture qwen2 (q/k/v biases, NEOX RoPE pairs, its
// RoPE base and RMSNorm epsilon), and on architecture llama a RoPE base,
// a partial rotary dimension count and an epsilon other than llama2.c's.
//
// No such file is in ../shared, so each test writes a tiny one (one layer,
// F32 tensors of known pseudo-random values) with the writer below, loads it
// with gguf_model_from_file, runs forward() over a short prompt, and
// compares every position's logits with a straightforward double-precision
// transformer written out in this file from the equations (llama.cpp's
// ggml_rope for the pairings). Each test also checks that the same file read
// with llama2.c's values gives logits farther than the tolerance from the
// reference, so that a setting the forward pass ignored would fail it.
// Last, the tokens that end a generation, from the tokenizer metadata.
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
#include "engine/forward.h"
#include "engine/gguf.h"
#include "engine/gguf_model.h"
#include "engine/kv_memory.h"
#include "engine/model.h"
#include "tests/test_support.h"

// ---- a tiny GGUF writer --------------------------------------------------------------------

typedef struct byte_buffer {
    unsigned char* bytes;
    size_t size, capacity;
} byte_buffer;

static void put(byte_buffer* b, const void* data, size_t n) {
    if (b->size + n > b->capacity) {
        b->capacity = (b->size + n) * 2 + 256;
        b->bytes = realloc(b->bytes, b->capacity);
        assert_non_null(b->bytes);
    }
    memcpy(b->bytes + b->size, data, n);
    b->size += n;
}
static void put_u32(byte_buffer* b, uint32_t v) { put(b, &v, 4); } // the test hosts are little-endian
static void put_u64(byte_buffer* b, uint64_t v) { put(b, &v, 8); }
static void put_str(byte_buffer* b, const char* s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_u32(byte_buffer* b, const char* key, uint32_t v) {
    put_str(b, key);
    put_u32(b, GGUF_VALUE_UINT32);
    put_u32(b, v);
}
static void kv_f32(byte_buffer* b, const char* key, float v) {
    put_str(b, key);
    put_u32(b, GGUF_VALUE_FLOAT32);
    put(b, &v, 4);
}
static void kv_str(byte_buffer* b, const char* key, const char* v) {
    put_str(b, key);
    put_u32(b, GGUF_VALUE_STRING);
    put_str(b, v);
}

// ---- the test model ------------------------------------------------------------------------

enum { MAX_TENSORS = 16, PROMPT_TOKENS = 6 };

typedef struct arch_case {
    const char* architecture; // "llama" or "qwen2"
    int dim, n_heads, n_kv_heads, hidden_dim, vocab_size;
    bool with_bias;   // blk.0.attn_{q,k,v}.bias
    bool with_output; // output.weight (else tied to token_embd)
    // Written to the metadata when nonzero (else the key is left out).
    float rope_base;
    int rope_dims;
    float rms_epsilon;
    bool with_vocab; // tokenizer.ggml.tokens (VOCAB_PIECES) and eos_token_id 4
} arch_case;

// A ChatML-like vocabulary: EOS is <|im_end|> (4); <|endoftext|> (5) ends a
// generation by its text, as llama.cpp's end-of-generation set has it.
static const char* const VOCAB_PIECES[12] = {
    "<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "a", "b", "c", "d", "e", "f"};
enum { VOCAB_EOS = 4, VOCAB_ENDOFTEXT = 5 };

// One tensor of the file: row-major (ne1 rows of ne0 floats).
typedef struct test_tensor {
    char name[48];
    int ne0, ne1;
    float* values; // (ne1, ne0)
} test_tensor;

typedef struct test_model_file {
    test_tensor tensors[MAX_TENSORS];
    int n_tensors;
    byte_buffer file;
} test_model_file;

// Deterministic values in [-scale, scale): a 64-bit LCG, seeded per tensor.
static void fill_values(float* out, int n, uint64_t seed, float scale) {
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < n; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        out[i] = scale * ((float)(state >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
    }
}

static void add_tensor(test_model_file* f, const char* name, int ne0, int ne1, float scale, float offset) {
    assert_true(f->n_tensors < MAX_TENSORS);
    test_tensor* t = &f->tensors[f->n_tensors];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ne0 = ne0;
    t->ne1 = ne1;
    t->values = malloc((size_t)ne0 * (size_t)ne1 * sizeof(float));
    assert_non_null(t->values);
    fill_values(t->values, ne0 * ne1, (uint64_t)f->n_tensors + 1, scale);
    for (int i = 0; i < ne0 * ne1; i++)
        t->values[i] += offset;
    f->n_tensors++;
}

static const test_tensor* tensor_named(const test_model_file* f, const char* name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static void write_model_file(test_model_file* f, const arch_case* a) {
    memset(f, 0, sizeof *f);
    const int kv_dim = a->dim / a->n_heads * a->n_kv_heads;
    // Norm gains near 1; small embeddings, so that a large epsilon shows.
    add_tensor(f, "token_embd.weight", a->dim, a->vocab_size, 0.1f, 0.0f);
    add_tensor(f, "output_norm.weight", a->dim, 1, 0.2f, 1.0f);
    if (a->with_output) add_tensor(f, "output.weight", a->dim, a->vocab_size, 0.5f, 0.0f);
    add_tensor(f, "blk.0.attn_norm.weight", a->dim, 1, 0.2f, 1.0f);
    add_tensor(f, "blk.0.attn_q.weight", a->dim, a->dim, 0.6f, 0.0f);
    add_tensor(f, "blk.0.attn_k.weight", a->dim, kv_dim, 0.6f, 0.0f);
    add_tensor(f, "blk.0.attn_v.weight", a->dim, kv_dim, 0.6f, 0.0f);
    if (a->with_bias) {
        add_tensor(f, "blk.0.attn_q.bias", a->dim, 1, 0.5f, 0.0f);
        add_tensor(f, "blk.0.attn_k.bias", kv_dim, 1, 0.5f, 0.0f);
        add_tensor(f, "blk.0.attn_v.bias", kv_dim, 1, 0.5f, 0.0f);
    }
    add_tensor(f, "blk.0.attn_output.weight", a->dim, a->dim, 0.5f, 0.0f);
    add_tensor(f, "blk.0.ffn_norm.weight", a->dim, 1, 0.2f, 1.0f);
    add_tensor(f, "blk.0.ffn_gate.weight", a->dim, a->hidden_dim, 0.5f, 0.0f);
    add_tensor(f, "blk.0.ffn_up.weight", a->dim, a->hidden_dim, 0.5f, 0.0f);
    add_tensor(f, "blk.0.ffn_down.weight", a->hidden_dim, a->dim, 0.5f, 0.0f);

    char key[96];
    int n_kv = 7 + (a->rope_base > 0) + (a->rope_dims > 0) + (a->rms_epsilon > 0) + (a->with_vocab ? 2 : 0);
    byte_buffer* b = &f->file;
    put(b, "GGUF", 4);
    put_u32(b, 3);
    put_u64(b, (uint64_t)f->n_tensors);
    put_u64(b, (uint64_t)n_kv);
    kv_str(b, "general.architecture", a->architecture);
#define ARCH_KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a->architecture, suffix), key)
    kv_u32(b, ARCH_KEY("context_length"), 32);
    kv_u32(b, ARCH_KEY("embedding_length"), (uint32_t)a->dim);
    kv_u32(b, ARCH_KEY("feed_forward_length"), (uint32_t)a->hidden_dim);
    kv_u32(b, ARCH_KEY("block_count"), 1);
    kv_u32(b, ARCH_KEY("attention.head_count"), (uint32_t)a->n_heads);
    kv_u32(b, ARCH_KEY("attention.head_count_kv"), (uint32_t)a->n_kv_heads);
    if (a->rope_base > 0) kv_f32(b, ARCH_KEY("rope.freq_base"), a->rope_base);
    if (a->rope_dims > 0) kv_u32(b, ARCH_KEY("rope.dimension_count"), (uint32_t)a->rope_dims);
    if (a->rms_epsilon > 0) kv_f32(b, ARCH_KEY("attention.layer_norm_rms_epsilon"), a->rms_epsilon);
#undef ARCH_KEY
    if (a->with_vocab) {
        assert_int_equal(a->vocab_size, 12);
        put_str(b, "tokenizer.ggml.tokens");
        put_u32(b, GGUF_VALUE_ARRAY);
        put_u32(b, GGUF_VALUE_STRING);
        put_u64(b, 12);
        for (int i = 0; i < 12; i++)
            put_str(b, VOCAB_PIECES[i]);
        kv_u32(b, "tokenizer.ggml.eos_token_id", VOCAB_EOS);
    }
    uint64_t offset = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const test_tensor* t = &f->tensors[i];
        put_str(b, t->name);
        put_u32(b, t->ne1 > 1 ? 2 : 1);
        put_u64(b, (uint64_t)t->ne0);
        if (t->ne1 > 1) put_u64(b, (uint64_t)t->ne1);
        put_u32(b, GGUF_TENSOR_F32);
        put_u64(b, offset);
        offset += ((uint64_t)t->ne0 * (uint64_t)t->ne1 * 4 + 31) / 32 * 32;
    }
    static const unsigned char zeros[32] = {0};
    for (int i = 0; i < f->n_tensors; i++) {
        put(b, zeros, (32 - b->size % 32) % 32);
        put(b, f->tensors[i].values, (size_t)f->tensors[i].ne0 * (size_t)f->tensors[i].ne1 * 4);
    }
}

static void free_model_file(test_model_file* f) {
    for (int i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].values);
    free(f->file.bytes);
}

// ---- the reference transformer, in double ---------------------------------------------------

// What the reference computes with (the file's values, or llama2.c's for the contrast).
typedef struct reference_settings {
    double rope_base;
    int rope_dims;
    bool neox_pairs;
    double rms_epsilon;
    bool add_bias;
} reference_settings;

static void reference_rmsnorm(double* out, const double* x, const float* gain, int n, double eps) {
    double sum_squares = 0.0;
    for (int i = 0; i < n; i++)
        sum_squares += x[i] * x[i];
    double inverse = 1.0 / sqrt(sum_squares / n + eps);
    for (int i = 0; i < n; i++)
        out[i] = gain[i] * x[i] * inverse;
}

// out (rows) = W (rows, cols) . x (cols) [+ bias]
static void reference_matvec(double* out, const test_tensor* w, const double* x, const test_tensor* bias) {
    for (int o = 0; o < w->ne1; o++) {
        double sum = bias ? bias->values[o] : 0.0;
        for (int i = 0; i < w->ne0; i++)
            sum += (double)w->values[(size_t)o * (size_t)w->ne0 + (size_t)i] * x[i];
        out[o] = sum;
    }
}

// ggml_rope's rule: pair p of the first rope_dims dimensions turns by
// position * base^(-2p / rope_dims); NEOX pairs element p with p + rope_dims/2,
// "normal" pairs 2p with 2p + 1; dimensions past rope_dims are left alone.
static void reference_rope(double* head, int position, const reference_settings* s) {
    for (int p = 0; p < s->rope_dims / 2; p++) {
        double angle = position * pow(s->rope_base, -2.0 * p / s->rope_dims);
        int i0 = s->neox_pairs ? p : 2 * p, i1 = s->neox_pairs ? p + s->rope_dims / 2 : 2 * p + 1;
        double x0 = head[i0], x1 = head[i1];
        head[i0] = x0 * cos(angle) - x1 * sin(angle);
        head[i1] = x0 * sin(angle) + x1 * cos(angle);
    }
}

// Logits of every position of the prompt: logits (n_tokens, vocab).
static void reference_logits(const test_model_file* f, const arch_case* a, const reference_settings* s,
                             const int32_t* tokens, int n_tokens, double* logits) {
    const int dim = a->dim, head_dim = a->dim / a->n_heads, kv_dim = head_dim * a->n_kv_heads;
    const int queries_per_kv_head = a->n_heads / a->n_kv_heads;
    double x[64], xb[64], q[64], attention[64], delta[64], gate[128], up[128];
    double keys[PROMPT_TOKENS][64], values[PROMPT_TOKENS][64]; // (position, kv_dim)
    assert_true(dim <= 64 && a->hidden_dim <= 128 && n_tokens <= PROMPT_TOKENS);
    const test_tensor* embedding = tensor_named(f, "token_embd.weight");
    const test_tensor* classifier = a->with_output ? tensor_named(f, "output.weight") : embedding;
    for (int pos = 0; pos < n_tokens; pos++) {
        for (int i = 0; i < dim; i++)
            x[i] = embedding->values[(size_t)tokens[pos] * (size_t)dim + (size_t)i];
        // attention
        reference_rmsnorm(xb, x, tensor_named(f, "blk.0.attn_norm.weight")->values, dim, s->rms_epsilon);
        reference_matvec(q, tensor_named(f, "blk.0.attn_q.weight"), xb,
                         s->add_bias ? tensor_named(f, "blk.0.attn_q.bias") : NULL);
        reference_matvec(keys[pos], tensor_named(f, "blk.0.attn_k.weight"), xb,
                         s->add_bias ? tensor_named(f, "blk.0.attn_k.bias") : NULL);
        reference_matvec(values[pos], tensor_named(f, "blk.0.attn_v.weight"), xb,
                         s->add_bias ? tensor_named(f, "blk.0.attn_v.bias") : NULL);
        for (int h = 0; h < a->n_heads; h++)
            reference_rope(q + h * head_dim, pos, s);
        for (int h = 0; h < a->n_kv_heads; h++)
            reference_rope(keys[pos] + h * head_dim, pos, s);
        for (int h = 0; h < a->n_heads; h++) {
            const int kv_head = h / queries_per_kv_head;
            double scores[PROMPT_TOKENS], max_score = -INFINITY, sum = 0.0;
            for (int t = 0; t <= pos; t++) {
                double dot = 0.0;
                for (int i = 0; i < head_dim; i++)
                    dot += q[h * head_dim + i] * keys[t][kv_head * head_dim + i];
                scores[t] = dot / sqrt((double)head_dim);
                if (scores[t] > max_score) max_score = scores[t];
            }
            for (int t = 0; t <= pos; t++)
                sum += scores[t] = exp(scores[t] - max_score);
            for (int i = 0; i < head_dim; i++) {
                double mixed = 0.0;
                for (int t = 0; t <= pos; t++)
                    mixed += scores[t] / sum * values[t][kv_head * head_dim + i];
                attention[h * head_dim + i] = mixed;
            }
        }
        (void)kv_dim;
        reference_matvec(delta, tensor_named(f, "blk.0.attn_output.weight"), attention, NULL);
        for (int i = 0; i < dim; i++)
            x[i] += delta[i];
        // feed-forward
        reference_rmsnorm(xb, x, tensor_named(f, "blk.0.ffn_norm.weight")->values, dim, s->rms_epsilon);
        reference_matvec(gate, tensor_named(f, "blk.0.ffn_gate.weight"), xb, NULL);
        reference_matvec(up, tensor_named(f, "blk.0.ffn_up.weight"), xb, NULL);
        for (int i = 0; i < a->hidden_dim; i++)
            gate[i] = gate[i] / (1.0 + exp(-gate[i])) * up[i];
        reference_matvec(delta, tensor_named(f, "blk.0.ffn_down.weight"), gate, NULL);
        for (int i = 0; i < dim; i++)
            x[i] += delta[i];
        reference_rmsnorm(xb, x, tensor_named(f, "output_norm.weight")->values, dim, s->rms_epsilon);
        reference_matvec(logits + (size_t)pos * (size_t)a->vocab_size, classifier, xb, NULL);
    }
}

// ---- the engine's logits -------------------------------------------------------------------

static const int32_t PROMPT[PROMPT_TOKENS] = {3, 1, 4, 1, 5, 9};

// Loads f's bytes and runs the whole prompt as one batch: logits (n_tokens, vocab).
// n_shards > 1: tensor-parallel over that many simulated devices.
static void engine_logits_sharded(const test_model_file* f, model* m, float* logits, int n_shards) {
    gguf_file parsed;
    error_info err = {{0}};
    if (gguf_parse(&parsed, f->file.bytes, f->file.size, "arch-test.gguf", &err))
        fail_msg("gguf_parse: %s", err.message);
    gguf_model_options options = {MODEL_DTYPE_DEFAULT, 0, false};
    if (gguf_model_from_file(m, &parsed, &options, &err)) fail_msg("gguf_model_from_file: %s", err.message);
    gguf_close(&parsed);
    const model_config* c = &m->config;
    kv_memory kv;
    forward_state state;
    assert_int_equal(kv_memory_init(&kv, c, KV_F32, 1, 16, &err), 0);
    assert_int_equal(forward_state_init(&state, c, PROMPT_TOKENS, 16, &err), 0);
    if (n_shards > 1 && forward_state_set_tensor_parallel(&state, m, n_shards, 1, &err))
        fail_msg("--tp %d: %s", n_shards, err.message);
    const int32_t table[1] = {0};
    const int32_t* tables[1] = {table};
    batch_row rows[PROMPT_TOKENS];
    for (int i = 0; i < PROMPT_TOKENS; i++)
        rows[i] = (batch_row){PROMPT[i], i, 0, true};
    int32_t slots[PROMPT_TOKENS];
    forward_batch_map_slots(slots, rows, PROMPT_TOKENS, tables, 16);
    forward_batch batch = {PROMPT_TOKENS, rows, 1, tables, slots};
    if (forward(m, &state, &kv, &batch, logits, NULL, &err)) fail_msg("forward: %s", err.message);
    forward_state_free(&state);
    kv_memory_free(&kv);
}

static void engine_logits(const test_model_file* f, model* m, float* logits) { engine_logits_sharded(f, m, logits, 1); }

static double max_abs_difference(const float* ours, const double* reference, int n) {
    double worst = 0.0;
    for (int i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)ours[i] - reference[i]));
    return worst;
}

// fp32 forward against the double reference: logits are O(1) here, and one
// layer of fp32 sums over <= 64 terms stays within about 1e-5 of it.
#define LOGIT_TOLERANCE 1e-4

// The engine's logits for case a equal the reference with `expected`, and
// differ from the reference with `contrast` by more than the tolerance.
static void check_case(const arch_case* a, const reference_settings* expected, const reference_settings* contrast) {
    test_model_file f;
    write_model_file(&f, a);
    model m;
    const int n_logits = PROMPT_TOKENS * a->vocab_size;
    float* ours = malloc((size_t)n_logits * sizeof *ours);
    double* reference = malloc((size_t)n_logits * sizeof *reference);
    double* other = malloc((size_t)n_logits * sizeof *other);
    engine_logits(&f, &m, ours);
    reference_logits(&f, a, expected, PROMPT, PROMPT_TOKENS, reference);
    reference_logits(&f, a, contrast, PROMPT, PROMPT_TOKENS, other);
    double error = max_abs_difference(ours, reference, n_logits);
    double contrast_error = max_abs_difference(ours, other, n_logits);
    print_message("%s: max |ours - reference| %.2e, against the contrast %.2e\n", a->architecture, error,
                  contrast_error);
    assert_true(error < LOGIT_TOLERANCE);
    assert_true(contrast_error > 100 * LOGIT_TOLERANCE);
    model_free(&m);
    free(ours), free(reference), free(other);
    free_model_file(&f);
}

// ---- the tests -----------------------------------------------------------------------------

static const reference_settings LLAMA2C = {10000.0, 0, false, 1e-5, false}; // rope_dims filled in per case

// qwen2: biases, NEOX pairs, base 1e6, epsilon 1e-6, as Qwen2.5's files
// say; grouped-query attention (4 query heads on 2 KV heads), tied output.
static void test_qwen2_matches_reference(void** state) {
    (void)state;
    const arch_case qwen2 = {"qwen2", 32, 4, 2, 48, 12, true, false, 1000000.0f, 0, 1e-6f, false};
    const reference_settings expected = {1000000.0, 8, true, (double)1e-6f, true};
    reference_settings contrast = LLAMA2C; // adjacent pairs, no bias: what a llama forward pass would do
    contrast.rope_dims = 8;
    contrast.rope_base = 1000000.0;
    contrast.rms_epsilon = (double)1e-6f;
    check_case(&qwen2, &expected, &contrast);
    // Each qwen2 difference alone moves the logits beyond the tolerance.
    reference_settings adjacent = expected;
    adjacent.neox_pairs = false;
    check_case(&qwen2, &expected, &adjacent);
    reference_settings unbiased = expected;
    unbiased.add_bias = false;
    check_case(&qwen2, &expected, &unbiased);
}

// Split over 2 simulated devices (each its own query and KV heads), each
// shard adds its own slice of the biases: the same logits as the reference.
static void test_qwen2_tensor_parallel(void** state) {
    (void)state;
    const arch_case qwen2 = {"qwen2", 32, 4, 2, 48, 12, true, false, 1000000.0f, 0, 1e-6f, false};
    const reference_settings expected = {1000000.0, 8, true, (double)1e-6f, true};
    test_model_file f;
    write_model_file(&f, &qwen2);
    model m;
    float ours[PROMPT_TOKENS * 12];
    double reference[PROMPT_TOKENS * 12];
    engine_logits_sharded(&f, &m, ours, 2);
    reference_logits(&f, &qwen2, &expected, PROMPT, PROMPT_TOKENS, reference);
    double error = max_abs_difference(ours, reference, PROMPT_TOKENS * 12);
    print_message("qwen2 on 2 shards: max |ours - reference| %.2e\n", error);
    assert_true(error < LOGIT_TOLERANCE);
    model_free(&m);
    free_model_file(&f);
}

// The model's config says what the metadata said.
static void test_qwen2_config(void** state) {
    (void)state;
    const arch_case qwen2 = {"qwen2", 32, 4, 2, 48, 12, true, true, 1000000.0f, 0, 1e-6f, false};
    test_model_file f;
    write_model_file(&f, &qwen2);
    gguf_file parsed;
    error_info err = {{0}};
    assert_int_equal(gguf_parse(&parsed, f.file.bytes, f.file.size, "qwen2.gguf", &err), 0);
    model m;
    if (gguf_model_from_file(&m, &parsed, NULL, &err)) fail_msg("%s", err.message);
    assert_true(m.config.rope_neox);
    assert_float_equal(m.config.rope_base, 1000000.0f, 0.0f);
    assert_float_equal(m.config.rms_epsilon, 1e-6f, 0.0f);
    assert_int_equal(m.config.rope_dims, 8);
    assert_false(m.config.shared_classifier);
    assert_non_null(m.layers[0].bq);
    assert_float_equal(m.layers[0].bk[3], tensor_named(&f, "blk.0.attn_k.bias")->values[3], 0.0f);
    // 3 biases of dim + 2 kv_dim fp32 values are weights like any other.
    const uint64_t bias_bytes = (32 + 2 * 16) * 4;
    model unbiased_model;
    model_free(&m);
    gguf_close(&parsed);
    free_model_file(&f);
    arch_case unbiased = qwen2;
    unbiased.architecture = "llama";
    unbiased.with_bias = false;
    write_model_file(&f, &unbiased);
    assert_int_equal(gguf_parse(&parsed, f.file.bytes, f.file.size, "llama.gguf", &err), 0);
    if (gguf_model_from_file(&unbiased_model, &parsed, NULL, &err)) fail_msg("%s", err.message);
    assert_false(unbiased_model.config.rope_neox);
    assert_null(unbiased_model.layers[0].bq);
    gguf_close(&parsed);
    free_model_file(&f);
    write_model_file(&f, &qwen2);
    assert_int_equal(gguf_parse(&parsed, f.file.bytes, f.file.size, "qwen2.gguf", &err), 0);
    assert_int_equal(gguf_model_from_file(&m, &parsed, NULL, &err), 0);
    assert_int_equal(model_decode_weight_bytes(&m) - model_decode_weight_bytes(&unbiased_model), bias_bytes);
    model_free(&m);
    model_free(&unbiased_model);
    gguf_close(&parsed);
    free_model_file(&f);
}

// qwen2 without its biases is refused by name, as llama.cpp refuses it.
static void test_qwen2_without_bias_refused(void** state) {
    (void)state;
    const arch_case qwen2 = {"qwen2", 32, 4, 2, 48, 12, false, false, 1000000.0f, 0, 1e-6f, false};
    test_model_file f;
    write_model_file(&f, &qwen2);
    gguf_file parsed;
    error_info err = {{0}};
    assert_int_equal(gguf_parse(&parsed, f.file.bytes, f.file.size, "qwen2.gguf", &err), 0);
    model m;
    assert_int_not_equal(gguf_model_from_file(&m, &parsed, NULL, &err), 0);
    assert_non_null(strstr(err.message, "tensor 'blk.0.attn_q.bias' is missing (qwen2 has q/k/v biases)"));
    gguf_close(&parsed);
    free_model_file(&f);
}

// llama with a RoPE base of 500000 (Llama 3), a quarter of each head
// rotated (partial rotary) and a large epsilon: each setting is honoured.
static void test_llama_hyperparameters_honoured(void** state) {
    (void)state;
    const arch_case llama = {"llama", 32, 2, 1, 48, 12, false, true, 500000.0f, 4, 1e-2f, false};
    const reference_settings expected = {500000.0, 4, false, (double)1e-2f, false};
    reference_settings contrast = LLAMA2C;
    contrast.rope_dims = 16;
    check_case(&llama, &expected, &contrast);
    reference_settings whole_head = expected;
    whole_head.rope_dims = 16;
    check_case(&llama, &expected, &whole_head);
    reference_settings base_10000 = expected;
    base_10000.rope_base = 10000.0;
    // Base only changes pair 1 of 2 (pair 0 turns at frequency 1 whatever
    // the base): 500000^-0.5 against 10000^-0.5 per position.
    check_case(&llama, &expected, &base_10000);
    reference_settings eps_default = expected;
    eps_default.rms_epsilon = 1e-5;
    check_case(&llama, &expected, &eps_default);
}

// A llama file with llama2.c's values (keys absent) runs llama2.c's math.
static void test_llama_defaults(void** state) {
    (void)state;
    const arch_case llama = {"llama", 32, 2, 1, 48, 12, false, false, 0.0f, 0, 0.0f, false};
    reference_settings expected = LLAMA2C;
    expected.rope_dims = 16;
    reference_settings neox = expected;
    neox.neox_pairs = true;
    check_case(&llama, &expected, &neox);
}

// ---- the tokens that end a generation -------------------------------------------------------

// llama2.c checkpoints and synthetic presets (no stop tokens) stop on EOS 2
// and BOS 1; a GGUF stops on its EOS and end-of-turn tokens and on nothing else.
static void test_stop_tokens(void** state) {
    (void)state;
    model llama2c = {0};
    stop_reason reason = STOP_LENGTH;
    assert_true(token_ends_sequence(&llama2c, 2, &reason));
    assert_int_equal(reason, STOP_EOS);
    assert_true(token_ends_sequence(&llama2c, 1, &reason));
    assert_int_equal(reason, STOP_BOS);
    assert_false(token_ends_sequence(&llama2c, VOCAB_EOS, &reason));

    arch_case chatml = {"qwen2", 32, 4, 2, 48, 12, true, false, 1000000.0f, 0, 1e-6f, true};
    test_model_file f;
    write_model_file(&f, &chatml);
    gguf_file parsed;
    error_info err = {{0}};
    assert_int_equal(gguf_parse(&parsed, f.file.bytes, f.file.size, "chatml.gguf", &err), 0);
    model m;
    if (gguf_model_from_file(&m, &parsed, NULL, &err)) fail_msg("%s", err.message);
    assert_int_equal(m.n_stop_tokens, 2);
    assert_int_equal(m.stop_tokens[0], VOCAB_EOS);
    assert_int_equal(m.stop_tokens[1], VOCAB_ENDOFTEXT);
    reason = STOP_LENGTH;
    assert_true(token_ends_sequence(&m, VOCAB_ENDOFTEXT, &reason));
    assert_int_equal(reason, STOP_EOS);
    assert_false(token_ends_sequence(&m, 2, &reason)); // "</s>" is an ordinary piece here
    assert_false(token_ends_sequence(&m, 1, &reason));

    // The engine stops there: make the greedy first token a stop token.
    const int32_t prompt[2] = {6, 7};
    int32_t out[4];
    test_generation run = test_engine_generate(&m, prompt, 2, 4, 0.0f, 0.0f, 0, out);
    assert_true(run.n_generated >= 1);
    const int32_t first = out[0];
    m.stop_tokens[0] = first;
    m.n_stop_tokens = 1;
    run = test_engine_generate(&m, prompt, 2, 4, 0.0f, 0.0f, 0, out);
    assert_int_equal(run.n_generated, 0);
    assert_int_equal(run.stop, STOP_EOS);
    model_free(&m);
    gguf_close(&parsed);
    free_model_file(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen2_matches_reference),
        cmocka_unit_test(test_qwen2_tensor_parallel),
        cmocka_unit_test(test_qwen2_config),
        cmocka_unit_test(test_qwen2_without_bias_refused),
        cmocka_unit_test(test_llama_hyperparameters_honoured),
        cmocka_unit_test(test_llama_defaults),
        cmocka_unit_test(test_stop_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
