#include "engine/gguf_vocab.h"

#include <stdlib.h>
#include <string.h>

// A special token id: absent gives fallback; llama.cpp writes 0xFFFFFFFF
// (or -1 as int32) for "none", which becomes -1.
static int read_special_id(const gguf_file* f, const char* key, int32_t fallback, int32_t* out, error_info* err) {
    const gguf_kv* kv = gguf_find_kv(f, key);
    *out = fallback;
    if (!kv) return 0;
    if (kv->type == GGUF_VALUE_INT32 && gguf_get_uint(f, key, UINT32_MAX, &(uint64_t){0}, NULL) < 0) {
        *out = -1; // a negative int32: none
        return 0;
    }
    uint64_t value;
    if (gguf_get_uint(f, key, UINT32_MAX, &value, err) < 0) return -1;
    *out = value == UINT32_MAX || value > INT32_MAX ? -1 : (int32_t)value;
    return 0;
}

static int read_flag(const gguf_file* f, const char* key, bool fallback, bool* out, error_info* err) {
    *out = fallback;
    return gguf_get_bool(f, key, out, err) < 0 ? -1 : 0;
}

// tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE).
static int read_tokenizer_kind(const gguf_file* f, bool* is_bpe, error_info* err) {
    char model_name[32];
    int found = gguf_get_string(f, "tokenizer.ggml.model", model_name, sizeof model_name, err);
    if (found < 0) return -1;
    if (!found) return error_set(err, "%s: metadata 'tokenizer.ggml.model' is missing: the file has no tokenizer", f->name);
    *is_bpe = strcmp(model_name, "gpt2") == 0;
    if (strcmp(model_name, "llama") != 0 && !*is_bpe)
        return error_set(err, "%s: tokenizer.ggml.model: '%s' is not supported (supported: llama, the SentencePiece "
                              "kind; gpt2, byte-level BPE)",
                         f->name, model_name);
    return 0;
}

// A gpt2 tokenizer's pre-tokenizer (tokenizer.ggml.pre) and merge rules.
static int read_bpe_rules(const gguf_file* f, tok_pretokenizer* pretokenizer, const gguf_kv** merges,
                          error_info* err) {
    // Each pre-tokenizer is its own split pattern (tokenizer.h); the
    // names are llama.cpp's (llama-vocab.cpp) for the same pattern.
    static const struct {
        const char* name;
        tok_pretokenizer pretokenizer;
    } known[] = {{"default", TOK_PRE_GPT2},  {"gpt-2", TOK_PRE_GPT2},
                 {"gpt2", TOK_PRE_GPT2},     {"llama-bpe", TOK_PRE_LLAMA3},
                 {"llama3", TOK_PRE_LLAMA3}, {"llama-v3", TOK_PRE_LLAMA3},
                 {"qwen2", TOK_PRE_QWEN2},   {"deepseek-r1-qwen", TOK_PRE_QWEN2},
                 {"smollm", TOK_PRE_SMOLLM}};
    char pre[64] = "default";
    if (gguf_get_string(f, "tokenizer.ggml.pre", pre, sizeof pre, err) < 0) return -1;
    size_t k = 0, n_known = sizeof known / sizeof known[0];
    while (k < n_known && strcmp(pre, known[k].name) != 0)
        k++;
    if (k == n_known)
        return error_set(err,
                         "%s: tokenizer.ggml.pre: '%s' is not supported (supported: default, gpt-2, llama-bpe, "
                         "qwen2, smollm)",
                         f->name, pre);
    *pretokenizer = known[k].pretokenizer;
    *merges = gguf_find_kv(f, "tokenizer.ggml.merges");
    if (!*merges || (*merges)->type != GGUF_VALUE_ARRAY || (*merges)->array_type != GGUF_VALUE_STRING ||
        (*merges)->array_count < 1 || (*merges)->array_count > TOK_MAX_VOCAB_SIZE)
        return error_set(err, "%s: metadata 'tokenizer.ggml.merges': expected 1..%d strings for a gpt2 tokenizer",
                         f->name, TOK_MAX_VOCAB_SIZE);
    return 0;
}

// The per-token arrays of the metadata: tokens (required), scores and
// token_type (optional, one value per token).
typedef struct token_arrays {
    const gguf_kv* tokens; // tokenizer.ggml.tokens: strings
    const gguf_kv* scores; // tokenizer.ggml.scores: float32, or NULL
    const gguf_kv* types;  // tokenizer.ggml.token_type: int32, or NULL
} token_arrays;

static int find_token_arrays(const gguf_file* f, token_arrays* a, error_info* err) {
    const gguf_kv* tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (!tokens) return error_set(err, "%s: metadata 'tokenizer.ggml.tokens' is missing", f->name);
    if (tokens->type != GGUF_VALUE_ARRAY || tokens->array_type != GGUF_VALUE_STRING)
        return error_set(err, "%s: metadata 'tokenizer.ggml.tokens': expected an array of strings", f->name);
    if (tokens->array_count < 1 || tokens->array_count > TOK_MAX_VOCAB_SIZE)
        return error_set(err, "%s: tokenizer.ggml.tokens: %llu tokens, expected 1..%d", f->name,
                         (unsigned long long)tokens->array_count, TOK_MAX_VOCAB_SIZE);
    const int n = (int)tokens->array_count;
    const gguf_kv* scores = gguf_find_kv(f, "tokenizer.ggml.scores");
    const gguf_kv* types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    if (scores && (scores->type != GGUF_VALUE_ARRAY || scores->array_type != GGUF_VALUE_FLOAT32 ||
                   scores->array_count != tokens->array_count))
        return error_set(err, "%s: metadata 'tokenizer.ggml.scores': expected %d float32 values", f->name, n);
    if (types && (types->type != GGUF_VALUE_ARRAY || types->array_type != GGUF_VALUE_INT32 ||
                  types->array_count != tokens->array_count))
        return error_set(err, "%s: metadata 'tokenizer.ggml.token_type': expected %d int32 values", f->name, n);
    *a = (token_arrays){tokens, scores, types};
    return 0;
}

// What tok_vocab points at until tok_from_vocab has copied it.
typedef struct vocab_arrays {
    tok_piece_bytes* pieces; // (vocab_size) each token's text, pointing into the file
    float* scores;           // (vocab_size) 0 where the file has no scores
    int32_t* types;          // (vocab_size) or NULL: the file has no token_type
    tok_piece_bytes* merges; // (n_merges) pointing into the file, or NULL
} vocab_arrays;

static void vocab_arrays_free(vocab_arrays* owned) {
    free(owned->merges);
    free(owned->pieces);
    free(owned->scores);
    free(owned->types);
}

// Each token's text, score and type, from the file into vocab.
static int copy_tokens(const gguf_file* f, const token_arrays* a, tok_vocab* vocab, vocab_arrays* owned,
                       error_info* err) {
    const int n = vocab->vocab_size;
    owned->pieces = calloc((size_t)n, sizeof *owned->pieces);
    owned->scores = calloc((size_t)n, sizeof *owned->scores);
    owned->types = a->types ? calloc((size_t)n, sizeof *owned->types) : NULL;
    if (!owned->pieces || !owned->scores || (a->types && !owned->types)) {
        vocab_arrays_free(owned);
        return error_set(err, "%s: out of memory for %d tokens", f->name, n);
    }
    uint64_t cursor = 0;
    for (int i = 0; i < n; i++) {
        gguf_string s = gguf_array_string_next(a->tokens, &cursor);
        owned->pieces[i] = (tok_piece_bytes){s.bytes, (size_t)s.length};
        owned->scores[i] = a->scores ? (float)gguf_array_number(a->scores, (uint64_t)i) : 0.0f;
        if (owned->types) owned->types[i] = (int32_t)gguf_array_number(a->types, (uint64_t)i);
    }
    vocab->pieces = owned->pieces;
    vocab->scores = owned->scores;
    vocab->types = owned->types;
    return 0;
}

// A gpt2 tokenizer's merge rules "LEFT RIGHT", in rank order, into vocab.
static int copy_merges(const gguf_file* f, const gguf_kv* merges, tok_vocab* vocab, vocab_arrays* owned,
                       error_info* err) {
    owned->merges = calloc((size_t)merges->array_count, sizeof *owned->merges);
    if (!owned->merges) {
        vocab_arrays_free(owned);
        return error_set(err, "%s: out of memory for %llu merges", f->name, (unsigned long long)merges->array_count);
    }
    uint64_t cursor = 0;
    for (uint64_t i = 0; i < merges->array_count; i++) {
        gguf_string rule = gguf_array_string_next(merges, &cursor);
        owned->merges[i] = (tok_piece_bytes){rule.bytes, (size_t)rule.length};
    }
    vocab->merges = owned->merges;
    vocab->n_merges = (int)merges->array_count;
    return 0;
}

// BOS, EOS and unknown ids and the two prompt flags, with llama.cpp's
// defaults: SentencePiece adds BOS and a leading space, BPE neither.
static int read_special_tokens(const gguf_file* f, bool is_bpe, tok_vocab* vocab, error_info* err) {
    return read_special_id(f, "tokenizer.ggml.bos_token_id", is_bpe ? -1 : 1, &vocab->bos_id, err) ||
           read_special_id(f, "tokenizer.ggml.eos_token_id", is_bpe ? -1 : 2, &vocab->eos_id, err) ||
           read_special_id(f, "tokenizer.ggml.unknown_token_id", is_bpe ? -1 : 0, &vocab->unk_id, err) ||
           read_flag(f, "tokenizer.ggml.add_bos_token", !is_bpe, &vocab->add_bos, err) ||
           read_flag(f, "tokenizer.ggml.add_space_prefix", !is_bpe, &vocab->add_space_prefix, err);
}

int tok_from_gguf(tokenizer** out, const gguf_file* f, error_info* err) {
    *out = NULL;
    bool is_bpe = false;
    if (read_tokenizer_kind(f, &is_bpe, err)) return -1;
    const gguf_kv* merges = NULL;
    tok_pretokenizer pretokenizer = TOK_PRE_GPT2;
    if (is_bpe && read_bpe_rules(f, &pretokenizer, &merges, err)) return -1;
    token_arrays arrays = {0};
    if (find_token_arrays(f, &arrays, err)) return -1;

    tok_vocab vocab = {
        .vocab_size = (int)arrays.tokens->array_count, .sentencepiece_spaces = !is_bpe, .pretokenizer = pretokenizer};
    vocab_arrays owned = {0};
    if (copy_tokens(f, &arrays, &vocab, &owned, err)) return -1;
    if (merges && copy_merges(f, merges, &vocab, &owned, err)) return -1;
    int status = read_special_tokens(f, is_bpe, &vocab, err);
    if (status == 0) status = tok_from_vocab(out, &vocab, f->name, err);
    vocab_arrays_free(&owned);
    return status ? -1 : 0;
}

static void add_stop_token(int32_t id, int64_t vocab_size, int32_t* stop_tokens, int capacity, int* n) {
    if (id < 0 || id >= vocab_size || *n >= capacity) return;
    for (int i = 0; i < *n; i++)
        if (stop_tokens[i] == id) return;
    stop_tokens[(*n)++] = id;
}

int gguf_vocab_stop_tokens(const gguf_file* f, int32_t* stop_tokens, int capacity, int* n_stop_tokens,
                           error_info* err) {
    *n_stop_tokens = 0;
    const gguf_kv* tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (!tokens || tokens->type != GGUF_VALUE_ARRAY || tokens->array_type != GGUF_VALUE_STRING) return 0;
    const int64_t vocab_size = (int64_t)tokens->array_count;
    static const char* const id_keys[3] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id"};
    for (int k = 0; k < 3; k++) {
        int32_t id;
        if (read_special_id(f, id_keys[k], -1, &id, err)) return -1;
        add_stop_token(id, vocab_size, stop_tokens, capacity, n_stop_tokens);
    }
    static const char* const end_texts[7] = {"<|eot_id|>",    "<|im_end|>", "<|end|>", "<end_of_turn>",
                                             "<|endoftext|>", "<|eom_id|>", "<EOT>"};
    uint64_t cursor = 0;
    for (int64_t i = 0; i < vocab_size; i++) {
        gguf_string piece = gguf_array_string_next(tokens, &cursor);
        if (piece.length < 5 || piece.length > 13 || piece.bytes[0] != '<') continue; // the texts' lengths
        for (int k = 0; k < 7; k++)
            if (gguf_string_equals(piece, end_texts[k]))
                add_stop_token((int32_t)i, vocab_size, stop_tokens, capacity, n_stop_tokens);
    }
    return 0;
}

int tok_load_gguf(tokenizer** out, const char* path, error_info* err) {
    *out = NULL;
    gguf_file f;
    if (gguf_open(&f, path, err)) return -1;
    int status = tok_from_gguf(out, &f, err);
    gguf_close(&f);
    return status;
}
