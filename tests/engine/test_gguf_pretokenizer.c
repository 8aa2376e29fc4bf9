// The byte-level BPE pre-tokenizers a GGUF names in tokenizer.ggml.pre
// (engine/tokenizer.h tok_pretokenizer): GPT-2's, Llama 3's ("llama-bpe"),
// Qwen2's and SmolLM's. There are no vocabulary files for the last three in
// ../shared, so each is checked on hand-picked strings whose pieces were
// worked out by hand from the split pattern's alternatives (first matching
// alternative at each position, greedy): digit runs, contractions,
// whitespace runs, newlines, symbols and letters outside ASCII. Then
// Llama 3's whole-word rule, and the refusal of a pre-tokenizer not known.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "engine/gguf.h"
#include "engine/gguf_vocab.h"
#include "engine/tokenizer.h"

enum { MAX_PIECES = 16 };

// Splits text under pre and compares with the expected pieces (NULL-ended).
static void expect_pieces(tok_pretokenizer pre, const char* text, const char* const* expected) {
    size_t ends[MAX_PIECES];
    int n = tok_pretokenize(pre, text, ends, MAX_PIECES);
    int n_expected = 0;
    while (expected[n_expected])
        n_expected++;
    char got[512] = "";
    size_t begin = 0, used = 0;
    for (int i = 0; i < n && i < MAX_PIECES; i++) {
        used += (size_t)snprintf(got + used, sizeof got - used, "[%.*s]", (int)(ends[i] - begin), text + begin);
        begin = ends[i];
    }
    bool same = n == n_expected;
    begin = 0;
    for (int i = 0; same && i < n; i++) {
        same = ends[i] - begin == strlen(expected[i]) && memcmp(text + begin, expected[i], ends[i] - begin) == 0;
        begin = ends[i];
    }
    if (!same) fail_msg("pre-tokenizer %d on '%s': got %d pieces %s, expected %d", (int)pre, text, n, got, n_expected);
}

#define PIECES(...) ((const char* const[]){__VA_ARGS__, NULL})

// Llama 3: \p{N}{1,3}, contractions in either case, one non-letter before
// letters, symbols keep the newlines after them.
static void test_llama3_pieces(void** state) {
    (void)state;
    const tok_pretokenizer p = TOK_PRE_LLAMA3;
    expect_pieces(p, "Hello world", PIECES("Hello", " world"));
    expect_pieces(p, "12345 apples", PIECES("123", "45", " apples")); // digits in threes, from the left
    expect_pieces(p, "1234567", PIECES("123", "456", "7"));
    expect_pieces(p, "3.14", PIECES("3", ".", "14"));
    expect_pieces(p, " 42", PIECES(" ", "42"));               // a space before digits stands alone
    expect_pieces(p, "I'M here", PIECES("I", "'M", " here")); // (?:'[mM]) takes upper case too
    expect_pieces(p, "we'll", PIECES("we", "'ll"));
    expect_pieces(p, "(hello)", PIECES("(hello", ")"));           // [^\r\n\p{L}\p{N}]?\p{L}+
    expect_pieces(p, "a  b", PIECES("a", " ", " b"));             // \s+(?!\S) leaves the last space to "b"
    expect_pieces(p, "x\n\ny", PIECES("x", "\n\n", "y"));         // \s*[\r\n]+
    expect_pieces(p, "  \n x", PIECES("  \n", " x"));             // through the last newline of the run
    expect_pieces(p, "hi!!\n\nok", PIECES("hi", "!!\n\n", "ok")); // symbols then [\r\n]*
    expect_pieces(p, "end  ", PIECES("end", "  "));               // trailing spaces: one piece
    expect_pieces(p,
                  "\xc3\xbc"
                  "ber \xe6\x97\xa5\xe6\x9c\xac",
                  PIECES("\xc3\xbc"
                         "ber",
                         " \xe6\x97\xa5\xe6\x9c\xac"));
}

// Qwen2: Llama 3's pattern, every digit alone.
static void test_qwen2_pieces(void** state) {
    (void)state;
    const tok_pretokenizer p = TOK_PRE_QWEN2;
    expect_pieces(p, "12345 apples", PIECES("1", "2", "3", "4", "5", " apples"));
    expect_pieces(p, "3.14", PIECES("3", ".", "1", "4"));
    expect_pieces(p, "It'S", PIECES("It", "'S"));
    expect_pieces(p, "a\tb", PIECES("a", "\tb")); // a tab is a non-letter before letters
    expect_pieces(p, "x \n", PIECES("x", " \n"));
}

// SmolLM: number characters split first, then GPT-2's pattern between them.
static void test_smollm_pieces(void** state) {
    (void)state;
    const tok_pretokenizer p = TOK_PRE_SMOLLM;
    expect_pieces(p, "abc 123 def", PIECES("abc", " ", "1", "2", "3", " def")); // the space before 1 ends its stretch
    expect_pieces(p, "I'M", PIECES("I", "'", "M")); // GPT-2's contractions are lower case only
    expect_pieces(p, "I'm", PIECES("I", "'m"));
    expect_pieces(p, "a  b", PIECES("a", " ", " b"));
}

// GPT-2 (the default), for contrast: " ?\p{N}+" keeps a number whole with its space.
static void test_gpt2_pieces(void** state) {
    (void)state;
    const tok_pretokenizer p = TOK_PRE_GPT2;
    expect_pieces(p, "abc 12345", PIECES("abc", " 12345"));
    expect_pieces(p, "(hello)", PIECES("(", "hello", ")"));
    expect_pieces(p, "x\n\ny", PIECES("x", "\n", "\n", "y"));
}

// Llama 3 takes a pre-token that is itself a piece whole (llama.cpp's
// ignore_merges); GPT-2 merges its bytes by rank.
static void test_llama3_whole_words(void** state) {
    (void)state;
    static const char* const texts[6] = {"h", "e", "l", "o", "he", "hello"};
    tok_piece_bytes pieces[6];
    float scores[6] = {0};
    for (int i = 0; i < 6; i++)
        pieces[i] = (tok_piece_bytes){texts[i], strlen(texts[i])};
    const tok_piece_bytes merges[1] = {{"h e", 3}};
    tok_vocab vocab = {.vocab_size = 6,
                       .pieces = pieces,
                       .scores = scores,
                       .bos_id = -1,
                       .eos_id = -1,
                       .unk_id = -1,
                       .merges = merges,
                       .n_merges = 1};
    int32_t ids[8];
    int n = 0;
    error_info err = {{0}};
    tokenizer* gpt2 = NULL;
    assert_int_equal(tok_from_vocab(&gpt2, &vocab, "test", &err), 0);
    assert_int_equal(tok_encode(gpt2, "hello", false, false, ids, 8, &n, &err), 0);
    assert_int_equal(n, 4); // he l l o
    assert_int_equal(ids[0], 4);
    tok_free(gpt2);
    vocab.pretokenizer = TOK_PRE_LLAMA3;
    tokenizer* llama3 = NULL;
    assert_int_equal(tok_from_vocab(&llama3, &vocab, "test", &err), 0);
    assert_int_equal(tok_encode(llama3, "hello", false, false, ids, 8, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 5);
    tok_free(llama3);
}

// ---- tokenizer.ggml.pre in a file ------------------------------------------------------------

typedef struct file_buffer {
    unsigned char* bytes;
    size_t size;
} file_buffer;

static void put(file_buffer* b, const void* data, size_t n) {
    b->bytes = realloc(b->bytes, b->size + n);
    assert_non_null(b->bytes);
    memcpy(b->bytes + b->size, data, n);
    b->size += n;
}
static void put_u32(file_buffer* b, uint32_t v) { put(b, &v, 4); }
static void put_u64(file_buffer* b, uint64_t v) { put(b, &v, 8); }
static void put_str(file_buffer* b, const char* s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_str(file_buffer* b, const char* key, const char* value) {
    put_str(b, key);
    put_u32(b, GGUF_VALUE_STRING);
    put_str(b, value);
}
static void kv_strings(file_buffer* b, const char* key, const char* const* values, int n) {
    put_str(b, key);
    put_u32(b, GGUF_VALUE_ARRAY);
    put_u32(b, GGUF_VALUE_STRING);
    put_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++)
        put_str(b, values[i]);
}

// tok_from_gguf on a gpt2 vocabulary whose tokenizer.ggml.pre is `pre`:
// 0 and the tokenizer, or -1 and the message.
static int load_with_pre(const char* pre, tokenizer** tok, char* message, size_t capacity) {
    static const char* const tokens[6] = {"h", "e", "l", "o", "he", "hello"};
    static const char* const merges[1] = {"h e"};
    file_buffer b = {NULL, 0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 4);
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_str(&b, "tokenizer.ggml.pre", pre);
    kv_strings(&b, "tokenizer.ggml.tokens", tokens, 6);
    kv_strings(&b, "tokenizer.ggml.merges", merges, 1);
    gguf_file f;
    error_info err = {{0}};
    assert_int_equal(gguf_parse(&f, b.bytes, b.size, "pre.gguf", &err), 0);
    int status = tok_from_gguf(tok, &f, &err);
    snprintf(message, capacity, "%s", err.message);
    gguf_close(&f);
    free(b.bytes);
    return status;
}

static void test_pre_names(void** state) {
    (void)state;
    char message[sizeof((error_info){{0}}).message];
    static const char* const accepted[] = {"default", "gpt-2", "llama-bpe", "llama3", "qwen2", "smollm"};
    static const int expected_ids[] = {2, 2, 1, 1, 2, 2}; // "hello": he l l o merged, or whole under Llama 3
    for (size_t i = 0; i < sizeof accepted / sizeof accepted[0]; i++) {
        tokenizer* tok = NULL;
        if (load_with_pre(accepted[i], &tok, message, sizeof message)) fail_msg("%s: %s", accepted[i], message);
        int32_t ids[8];
        int n = 0;
        error_info err = {{0}};
        assert_int_equal(tok_encode(tok, "hello", false, false, ids, 8, &n, &err), 0);
        if ((n == 1) != (expected_ids[i] == 1)) fail_msg("pre '%s': %d ids for 'hello'", accepted[i], n);
        tok_free(tok);
    }
    tokenizer* tok = NULL;
    assert_int_not_equal(load_with_pre("tekken", &tok, message, sizeof message), 0);
    assert_null(tok);
    assert_non_null(strstr(message, "tokenizer.ggml.pre: 'tekken' is not supported (supported: default, gpt-2, "
                                    "llama-bpe, qwen2, smollm)"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama3_pieces),      cmocka_unit_test(test_qwen2_pieces),
        cmocka_unit_test(test_smollm_pieces),      cmocka_unit_test(test_gpt2_pieces),
        cmocka_unit_test(test_llama3_whole_words), cmocka_unit_test(test_pre_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
