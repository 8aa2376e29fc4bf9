// fuzz_gguf: the GGUF reader (engine/gguf.c), the llama model loader on it
// (engine/gguf_model.c) and the tokenizer it carries (engine/gguf_vocab.c).
//
// The input is the whole file, opened (mapped) from an in-memory file. Its
// size modulo 3 picks the dtype choice (the file's own, fp32 or fp16), so
// the zero-copy, widening, rounding and Q8_0/Q4_0 regrouping paths are all
// reached. A loaded model is looked through (every matrix by name, the
// bytes a decode streams, one embedding row widened); a loaded tokenizer
// encodes and decodes a short fixed text. Errors are expected; a crash, a
// leak or a sanitizer report is a bug.
//
// Seeds: no model file is committed. LLVMFuzzerInitialize writes small
// GGUF files into the run's corpus folder (the first folder on the command
// line, build/fuzz/corpus/fuzz_gguf under `make fuzz`) when they are
// missing: a llama model of dim 32, one layer, 2 heads, 1 KV head, hidden
// 64 and a 300-token vocabulary (3 specials, 256 byte pieces, 41 merges)
// with its matrices in F32, F16, BF16, Q8_0 and Q4_0, with and without
// output.weight, and a tokenizer-only file (about 10-60 KB each).
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "engine/gguf_model.h"
#include "engine/gguf_vocab.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/matmul.h"
#include "tests/fuzz/support.h"

int LLVMFuzzerInitialize(int* argc, char*** argv);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static const char TEXT[] = "Once upon a time, Zoë saw 日本 <0x41> \t\x01\xff!";

// ---- the seeds: a tiny GGUF writer ------------------------------------------------------------

typedef fuzz_buffer buffer;
static void put(buffer* b, const void* data, size_t n) { fuzz_put(b, data, n); }

static void put_u32(buffer* b, uint32_t v) { put(b, &v, 4); } // the fuzzing hosts are little-endian
static void put_u64(buffer* b, uint64_t v) { put(b, &v, 8); }
static void put_str(buffer* b, const char* s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_u32(buffer* b, const char* key, uint32_t v) {
    put_str(b, key);
    put_u32(b, GGUF_VALUE_UINT32);
    put_u32(b, v);
}
static void kv_str(buffer* b, const char* key, const char* v) {
    put_str(b, key);
    put_u32(b, GGUF_VALUE_STRING);
    put_str(b, v);
}
static void kv_f32(buffer* b, const char* key, float v) {
    put_str(b, key);
    put_u32(b, GGUF_VALUE_FLOAT32);
    put(b, &v, 4);
}

enum { SEED_DIM = 32, SEED_HIDDEN = 64, SEED_HEADS = 2, SEED_KV_HEADS = 1, SEED_VOCAB = 300 };

// The vocabulary: <unk> <s> </s>, the 256 byte pieces, then merges of
// frequent English pieces (with "▁" for a space, as SentencePiece writes).
#define SP "\xe2\x96\x81" // U+2581, SentencePiece's space

static void put_vocab(buffer* b) {
    static const char* const merges[41] = {
        SP, "e", "t", "a", "o", "n", "i", "s", "h", "r", "d", "l", "u", "m", "c",
        SP "t", "he", SP "a", "in", "on", SP "the", "er", "an", SP "s", "en",
        SP "O", "nce", SP "Once", SP "up", SP "upon", SP "ti", "me",
        SP "time", ",", "Z", "\xc3\xab", "\xe6\x97\xa5", "\xe6\x9c\xac", "!", "<", ">"};
    put_str(b, "tokenizer.ggml.tokens");
    put_u32(b, GGUF_VALUE_ARRAY);
    put_u32(b, GGUF_VALUE_STRING);
    put_u64(b, SEED_VOCAB);
    put_str(b, "<unk>");
    put_str(b, "<s>");
    put_str(b, "</s>");
    for (int byte = 0; byte < 256; byte++) {
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", byte);
        put_str(b, piece);
    }
    for (int i = 0; i < 41; i++) put_str(b, merges[i]);
    put_str(b, "tokenizer.ggml.scores");
    put_u32(b, GGUF_VALUE_ARRAY);
    put_u32(b, GGUF_VALUE_FLOAT32);
    put_u64(b, SEED_VOCAB);
    for (int i = 0; i < SEED_VOCAB; i++) {
        float score = i < 259 ? 0.0f : -(float)(i - 259);
        put(b, &score, 4);
    }
    put_str(b, "tokenizer.ggml.token_type");
    put_u32(b, GGUF_VALUE_ARRAY);
    put_u32(b, GGUF_VALUE_INT32);
    put_u64(b, SEED_VOCAB);
    for (int i = 0; i < SEED_VOCAB; i++) {
        int32_t type = i == 0 ? TOK_TYPE_UNKNOWN : i < 3 ? TOK_TYPE_CONTROL : i < 259 ? TOK_TYPE_BYTE : TOK_TYPE_NORMAL;
        put(b, &type, 4);
    }
    kv_str(b, "tokenizer.ggml.model", "llama");
    kv_u32(b, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(b, "tokenizer.ggml.eos_token_id", 2);
    kv_u32(b, "tokenizer.ggml.unknown_token_id", 0);
}

typedef struct seed_tensor {
    char name[48];
    uint64_t ne0, ne1;
    gguf_tensor_type type;
} seed_tensor;

// Bytes of a tensor's data; its values are small, deterministic and varied.
static void put_tensor_data(buffer* b, const seed_tensor* t, int salt) {
    uint64_t n = t->ne0 * t->ne1;
    for (uint64_t i = 0; i < n; i += t->type == GGUF_TENSOR_Q8_0 || t->type == GGUF_TENSOR_Q4_0 ? 32 : 1) {
        float value = (float)((int)((i * 37 + (uint64_t)salt * 11) % 17) - 8) / 64.0f;
        if (t->type == GGUF_TENSOR_F32) {
            put(b, &value, 4);
        } else if (t->type == GGUF_TENSOR_F16) {
            uint16_t half = fp32_to_fp16(value);
            put(b, &half, 2);
        } else if (t->type == GGUF_TENSOR_BF16) {
            uint16_t half = fp32_to_bf16(value);
            put(b, &half, 2);
        } else { // a block: an fp16 scale, then 32 codes (Q8_0) or 16 bytes of nibbles (Q4_0)
            uint16_t d = fp32_to_fp16(0.01f + (float)(i % 7) / 256.0f);
            put(b, &d, 2);
            uint8_t codes[32];
            for (int j = 0; j < 32; j++) codes[j] = (uint8_t)((i / 32 * 13 + (uint64_t)j * 7 + (uint64_t)salt) % 251);
            put(b, codes, t->type == GGUF_TENSOR_Q8_0 ? 32 : 16);
        }
    }
}

static uint8_t* model_seed(gguf_tensor_type matrix_type, bool with_output, size_t* size) {
    seed_tensor tensors[16];
    int n = 0;
    const uint64_t kv_dim = SEED_DIM / SEED_HEADS * SEED_KV_HEADS;
    tensors[n++] = (seed_tensor){"token_embd.weight", SEED_DIM, SEED_VOCAB, matrix_type};
    tensors[n++] = (seed_tensor){"output_norm.weight", SEED_DIM, 1, GGUF_TENSOR_F32};
    if (with_output) tensors[n++] = (seed_tensor){"output.weight", SEED_DIM, SEED_VOCAB, matrix_type};
    tensors[n++] = (seed_tensor){"blk.0.attn_q.weight", SEED_DIM, SEED_DIM, matrix_type};
    tensors[n++] = (seed_tensor){"blk.0.attn_k.weight", SEED_DIM, kv_dim, matrix_type};
    tensors[n++] = (seed_tensor){"blk.0.attn_v.weight", SEED_DIM, kv_dim, matrix_type};
    tensors[n++] = (seed_tensor){"blk.0.attn_output.weight", SEED_DIM, SEED_DIM, matrix_type};
    tensors[n++] = (seed_tensor){"blk.0.attn_norm.weight", SEED_DIM, 1, GGUF_TENSOR_F32};
    tensors[n++] = (seed_tensor){"blk.0.ffn_gate.weight", SEED_DIM, SEED_HIDDEN, matrix_type};
    tensors[n++] = (seed_tensor){"blk.0.ffn_down.weight", SEED_HIDDEN, SEED_DIM, matrix_type};
    tensors[n++] = (seed_tensor){"blk.0.ffn_up.weight", SEED_DIM, SEED_HIDDEN, matrix_type};
    tensors[n++] = (seed_tensor){"blk.0.ffn_norm.weight", SEED_DIM, 1, matrix_type == GGUF_TENSOR_BF16
                                                                            ? GGUF_TENSOR_BF16
                                                                            : GGUF_TENSOR_F32};
    buffer b = {NULL, 0, 0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, (uint64_t)n);
    put_u64(&b, 16); // 9 model keys + 7 tokenizer keys
    kv_str(&b, "general.architecture", "llama");
    kv_u32(&b, "llama.context_length", 64);
    kv_u32(&b, "llama.embedding_length", SEED_DIM);
    kv_u32(&b, "llama.feed_forward_length", SEED_HIDDEN);
    kv_u32(&b, "llama.block_count", 1);
    kv_u32(&b, "llama.attention.head_count", SEED_HEADS);
    kv_u32(&b, "llama.attention.head_count_kv", SEED_KV_HEADS);
    kv_u32(&b, "llama.rope.dimension_count", SEED_DIM / SEED_HEADS);
    kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    put_vocab(&b); // 7 keys
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        put_str(&b, tensors[i].name);
        put_u32(&b, tensors[i].ne1 > 1 ? 2 : 1);
        put_u64(&b, tensors[i].ne0);
        if (tensors[i].ne1 > 1) put_u64(&b, tensors[i].ne1);
        put_u32(&b, tensors[i].type);
        put_u64(&b, offset);
        uint64_t bytes = tensors[i].ne0 * tensors[i].ne1 / gguf_tensor_block_elements(tensors[i].type) *
                         gguf_tensor_block_bytes(tensors[i].type);
        offset += (bytes + 31) / 32 * 32;
    }
    for (int i = 0; i < n; i++) {
        static const uint8_t zeros[32] = {0};
        put(&b, zeros, (32 - b.size % 32) % 32);
        put_tensor_data(&b, &tensors[i], i);
    }
    *size = b.size;
    return b.bytes;
}

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    const char* folder = fuzz_seed_folder(*argc, *argv);
    if (!folder) return 0; // a reproducer run: no seeds needed
    const struct {
        const char* name;
        gguf_tensor_type type;
        bool with_output;
    } seeds[] = {{"seed-f32.gguf", GGUF_TENSOR_F32, true},   {"seed-f16-tied.gguf", GGUF_TENSOR_F16, false},
                 {"seed-bf16.gguf", GGUF_TENSOR_BF16, true}, {"seed-q8_0.gguf", GGUF_TENSOR_Q8_0, true},
                 {"seed-q4_0.gguf", GGUF_TENSOR_Q4_0, false}};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        size_t size = 0;
        uint8_t* bytes = model_seed(seeds[i].type, seeds[i].with_output, &size);
        fuzz_write_seed(folder, seeds[i].name, bytes, size);
        free(bytes);
    }
    buffer vocab_only = {NULL, 0, 0};
    put(&vocab_only, "GGUF", 4);
    put_u32(&vocab_only, 2);
    put_u64(&vocab_only, 0);
    put_u64(&vocab_only, 8);
    kv_str(&vocab_only, "general.architecture", "llama");
    put_vocab(&vocab_only);
    fuzz_write_seed(folder, "seed-vocab-only-v2.gguf", vocab_only.bytes, vocab_only.size);
    free(vocab_only.bytes);
    return 0;
}

// ---- one input --------------------------------------------------------------------------------

static void exercise_model(const model* m) {
    volatile uint64_t bytes = model_decode_weight_bytes(m);
    (void)bytes;
    char name[64];
    const char* kinds[] = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"};
    for (int l = 0; l < m->config.n_layers; l++)
        for (int k = 0; k < 7; k++) {
            snprintf(name, sizeof name, "layers.%d.%s", l, kinds[k]);
            FUZZ_CHECK(model_matrix_by_name(m, name) != NULL);
        }
    const weight_matrix* embedding = model_matrix_by_name(m, "token_embedding");
    FUZZ_CHECK(embedding && model_matrix_by_name(m, "classifier"));
    float* row = malloc((size_t)embedding->cols * sizeof *row);
    if (row) {
        weight_row_to_f32(row, embedding, embedding->rows - 1, NULL);
        free(row);
    }
}

static void exercise_tokenizer(const tokenizer* tok) {
    int needed = 0;
    error_info err = {{0}};
    tok_encode(tok, TEXT, true, true, NULL, 0, &needed, &err);
    if (needed <= 0) return;
    int32_t* ids = malloc((size_t)needed * sizeof *ids);
    int n = 0;
    if (ids && tok_encode(tok, TEXT, true, true, ids, needed, &n, &err) == 0) {
        FUZZ_CHECK(n == needed);
        for (int i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < tok_vocab_size(tok));
        char text[256];
        tok_decode_text(tok, ids[0], ids + 1, n - 1, text, sizeof text);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    char path[64];
    int fd = fuzz_memory_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    static const model_dtype_choice choices[] = {MODEL_DTYPE_DEFAULT, MODEL_DTYPE_FP32, MODEL_DTYPE_FP16};
    gguf_file f;
    error_info err = {{0}};
    if (gguf_open(&f, path, &err) == 0) {
        tokenizer* tok = NULL;
        error_info tok_err = {{0}};
        if (tok_from_gguf(&tok, &f, &tok_err) == 0) {
            exercise_tokenizer(tok);
            tok_free(tok);
        } else {
            FUZZ_CHECK(tok_err.message[0] != '\0');
        }
        model m;
        gguf_model_options options = {choices[size % 3], 0, false};
        if (gguf_model_from_file(&m, &f, &options, &err) == 0) {
            exercise_model(&m);
            model_free(&m);
        } else {
            FUZZ_CHECK(err.message[0] != '\0' && strchr(err.message, '\n') == NULL);
        }
        gguf_close(&f);
    } else {
        FUZZ_CHECK(err.message[0] != '\0' && strchr(err.message, '\n') == NULL); // a failure says why, in one line
    }
    close(fd);
    return 0;
}
