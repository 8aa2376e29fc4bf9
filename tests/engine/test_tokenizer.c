// Tests for engine/tokenizer: llama2.c-exact encoding on tok512.bin, round
// trips, the byte-level tokenizer, merge rules on small hand-made vocabs, and
// refusal of corrupt tokenizer files.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include "tests/test_support.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "engine/tokenizer.h"

// ---- helpers ---------------------------------------------------------------

static void assert_ids(const int32_t* got, int n_got, const int32_t* expected, int n_expected) {
    for (int i = 0; i < n_got && i < n_expected; i++) {
        if (got[i] != expected[i])
            fail_msg("id %d: got %d, expected %d", i, (int)got[i], (int)expected[i]);
    }
    assert_int_equal(n_got, n_expected);
}

static void assert_message_has(const error_info* err, const char* key) {
    if (!strstr(err->message, key)) fail_msg("error \"%s\" lacks \"%s\"", err->message, key);
}

static tokenizer* load_tok512(void) {
    char path[512];
    REQUIRE_SHARED_MODEL(path, "tok512.bin");
    tokenizer* t = NULL;
    error_info err;
    error_clear(&err);
    if (tok_load(&t, path, 512, &err) != 0) fail_msg("tok_load: %s", err.message);
    return t;
}

// Encodes text with BOS into ids (room for 4096), failing the test on error.
static int encode_or_fail(const tokenizer* t, const char* text, bool add_bos, bool add_eos,
                          int32_t* ids, int capacity) {
    error_info err;
    error_clear(&err);
    int n = -1;
    if (tok_encode(t, text, add_bos, add_eos, ids, capacity, &n, &err) != 0)
        fail_msg("tok_encode: %s", err.message);
    return n;
}

// Encodes with BOS and decodes after it: for tok512 the dummy space is
// stripped after BOS, so this gives back the exact text.
static void assert_round_trip(const tokenizer* t, const char* text) {
    size_t text_bytes = strlen(text);
    int capacity = (int)text_bytes + 3;
    int32_t* ids = malloc((size_t)capacity * sizeof *ids);
    char* decoded = malloc(text_bytes + 1);
    assert_non_null(ids);
    assert_non_null(decoded);
    int n = encode_or_fail(t, text, true, false, ids, capacity);
    assert_true(n >= 1);
    assert_int_equal(ids[0], TOK_BOS_ID);
    for (int i = 0; i < n; i++) assert_true(ids[i] >= 0 && ids[i] < tok_vocab_size(t));
    size_t needed = tok_decode_text(t, ids[0], ids + 1, n - 1, decoded, text_bytes + 1);
    assert_int_equal(needed, text_bytes);
    assert_string_equal(decoded, text);
    free(ids);
    free(decoded);
}

// ---- hand-made tokenizer files ----------------------------------------------
// A valid llama2.c-format file: <unk>, BOS, EOS, the 256 byte pieces (as
// SentencePiece exports them), then `extra` pieces with their scores.

typedef struct {
    const char* piece;
    float score;
} test_piece;

typedef struct {
    unsigned char* bytes;  // (size) the file
    size_t size;           // bytes
    size_t capacity;       // bytes allocated
} byte_buffer;

static void put_bytes(byte_buffer* b, const void* bytes, size_t n) {
    if (b->size + n > b->capacity) {
        b->capacity = (b->size + n) * 2;
        b->bytes = realloc(b->bytes, b->capacity);
        assert_non_null(b->bytes);
    }
    memcpy(b->bytes + b->size, bytes, n);
    b->size += n;
}

static void put_u32(byte_buffer* b, uint32_t value) {
    unsigned char le[4] = {(unsigned char)value, (unsigned char)(value >> 8),
                           (unsigned char)(value >> 16), (unsigned char)(value >> 24)};
    put_bytes(b, le, 4);
}

static void put_token(byte_buffer* b, const char* piece, float score) {
    uint32_t score_bits;
    memcpy(&score_bits, &score, 4);
    put_u32(b, score_bits);
    put_u32(b, (uint32_t)strlen(piece));
    put_bytes(b, piece, strlen(piece));
}

static byte_buffer build_file(int max_token_length, const test_piece* extra, int n_extra) {
    byte_buffer b = {NULL, 0, 0};
    put_u32(&b, (uint32_t)max_token_length);
    put_token(&b, "<unk>", 0.0f);
    put_token(&b, "\n<s>\n", 0.0f);
    put_token(&b, "\n</s>\n", 0.0f);
    for (int byte = 0; byte < 256; byte++) {
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", byte);
        put_token(&b, piece, 0.0f);
    }
    for (int i = 0; i < n_extra; i++) put_token(&b, extra[i].piece, extra[i].score);
    return b;
}

static const char* scratch_file(const char* name, const void* bytes, size_t size) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", test_scratch_dir(), name);
    assert_true(test_write_file(path, bytes, size));
    return path;
}

static tokenizer* load_built(const char* name, const test_piece* extra, int n_extra) {
    byte_buffer b = build_file(8, extra, n_extra);
    const char* path = scratch_file(name, b.bytes, b.size);
    free(b.bytes);
    tokenizer* t = NULL;
    error_info err;
    error_clear(&err);
    if (tok_load(&t, path, TOK_MIN_VOCAB_SIZE + n_extra, &err) != 0) fail_msg("%s", err.message);
    return t;
}

// ---- tok512: the golden prompts ---------------------------------------------
// Reference ids from an independent Python implementation of llama2.c run.c
// encode() on tok512.bin. Checked further: a pure-Python stories260K forward
// pass fed these ids reproduces stories260K.golden-text exactly, and
// other splits of the same text ("... d o g", "... t im e") do not.

static void test_golden_prompts(void** state) {
    (void)state;
    tokenizer* t = load_tok512();
    int32_t ids[64];

    static const int32_t once[] = {1, 403, 407, 261, 378};  // BOS " Once" " upon" " a" " time"
    assert_ids(ids, encode_or_fail(t, "Once upon a time", true, false, ids, 64), once, 5);

    static const int32_t dog[] = {1, 291, 376, 400, 428};  // BOS " The" " little" " do" "g"
    assert_ids(ids, encode_or_fail(t, "The little dog", true, false, ids, 64), dog, 5);

    static const int32_t dog_eos[] = {1, 291, 376, 400, 428, 2};
    assert_ids(ids, encode_or_fail(t, "The little dog", true, true, ids, 64), dog_eos, 6);
    static const int32_t dog_bare[] = {291, 376, 400, 428};
    assert_ids(ids, encode_or_fail(t, "The little dog", false, false, ids, 64), dog_bare, 4);

    // Empty text: no dummy prefix, only what was asked for.
    static const int32_t bos_eos[] = {1, 2};
    assert_ids(ids, encode_or_fail(t, "", true, true, ids, 64), bos_eos, 2);
    assert_int_equal(encode_or_fail(t, "", false, false, ids, 64), 0);
    tok_free(t);
}

static void test_reference_encodings(void** state) {
    (void)state;
    tokenizer* t = load_tok512();
    int32_t ids[64];

    // Merges, digits, and byte fallback for "\n" (13 = 0x0A + 3) and "\t" (12).
    static const int32_t hello[] = {1,   346, 306, 414, 432, 263, 304, 341, 443, 410,
                                    475, 479, 472, 13,  12,  413, 412, 430, 419};
    assert_ids(ids, encode_or_fail(t, "Hello, world! 123\n\ttabs", true, false, ids, 64), hello,
               19);

    // "é" and "—" are pieces; "ï", the CJK and the emoji fall back to bytes.
    static const int32_t utf8[] = {1,   297, 412, 198, 178, 360, 280, 412, 431,
                                   485, 410, 481, 410, 233, 154, 168, 233, 159,
                                   175, 235, 173, 161, 410, 243, 162, 156, 133};
    assert_ids(ids, encode_or_fail(t, "naïve café — 日本語 🙂", true, false, ids, 64),
               utf8, 27);
    tok_free(t);
}

// ---- tok512: decoding ----------------------------------------------------------

static void test_decode_pieces(void** state) {
    (void)state;
    tokenizer* t = load_tok512();
    assert_int_equal(tok_vocab_size(t), 512);
    assert_false(tok_is_byte_level(t));

    assert_string_equal(tok_decode_piece(t, TOK_BOS_ID, 403), "Once");  // space dropped after BOS
    assert_string_equal(tok_decode_piece(t, 403, 407), " upon");
    assert_string_equal(tok_decode_piece(t, 403, 13), "\n");  // "<0x0A>" is the byte itself
    assert_string_equal(tok_decode_piece(t, 403, 3 + 0xC3), "\xC3");
    assert_string_equal(tok_decode_piece(t, 403, 3), "");  // byte 0 cannot be in a C string
    assert_string_equal(tok_decode_piece(t, 403, TOK_BOS_ID), "\n<s>\n");

    // Out of range: "" and no crash.
    assert_string_equal(tok_decode_piece(t, 0, -1), "");
    assert_string_equal(tok_decode_piece(t, 0, 512), "");
    assert_string_equal(tok_decode_piece(t, 0, INT32_MAX), "");
    assert_string_equal(tok_decode_piece(t, 0, INT32_MIN), "");
    assert_string_equal(tok_decode_piece(NULL, 0, 5), "");
    tok_free(t);
}

static void test_round_trip_tok512(void** state) {
    (void)state;
    tokenizer* t = load_tok512();
    assert_round_trip(t, "Hello, world! 123\n\ttabs");
    assert_round_trip(t, "naïve café — 日本語 🙂");
    assert_round_trip(t, "Once upon a time");
    assert_round_trip(t, "  leading spaces and trailing  ");
    assert_round_trip(t, "");
    tok_free(t);
}

// Random byte strings, malformed UTF-8 included: encoding never writes an id
// outside the vocab and decoding gives the bytes back. Control bytes other
// than whitespace are left out: decoding drops them, as llama2.c does.
static void test_round_trip_random_bytes(void** state) {
    (void)state;
    tokenizer* t = load_tok512();
    uint32_t seed = 12345;
    char text[200];
    for (int round = 0; round < 300; round++) {
        int length = round % 150;
        for (int i = 0; i < length; i++) {
            unsigned char byte;
            do {
                seed = seed * 1664525u + 1013904223u;  // LCG: reproducible
                byte = (unsigned char)(seed >> 24);
            } while (!tok_piece_is_printable((char[]){(char)byte, 0}));
            // Half the strings stay ASCII so that merges happen often.
            text[i] = (round % 2 == 0 && byte >= 0x80) ? (char)(byte - 0x80 + 0x20) : (char)byte;
            if (round % 2 == 0 && (unsigned char)text[i] >= 0x7F) text[i] = 'e';
        }
        text[length] = '\0';
        assert_round_trip(t, text);
    }
    tok_free(t);
}

// A long text stays correct and finishes quickly (the merge loop looks up
// each pair once, not on every pass as llama2.c does).
static void test_long_text(void** state) {
    (void)state;
    tokenizer* t = load_tok512();
    const char* sentence =
        "Once upon a time, there was a little girl named Lily. She loved to play.";
    size_t sentence_bytes = strlen(sentence);
    int repeats = 200;  // joined by spaces: about 15 KB
    size_t text_bytes = (sentence_bytes + 1) * (size_t)repeats - 1;
    char* text = malloc(text_bytes + 1);
    assert_non_null(text);
    for (int i = 0; i < repeats; i++) {
        memcpy(text + i * (sentence_bytes + 1), sentence, sentence_bytes);
        text[i * (sentence_bytes + 1) + sentence_bytes] = ' ';
    }
    text[text_bytes] = '\0';
    assert_round_trip(t, text);

    // Each sentence after the first follows a space, as the first follows
    // the dummy prefix, and no tok512 piece spans ". ": so the ids are the
    // sentence's ids repeated (the Python reference agrees on 5 repeats).
    int32_t one[64];
    int n_one = encode_or_fail(t, sentence, false, false, one, 64);
    assert_int_equal(n_one, 21);
    int capacity = (int)text_bytes + 3;
    int32_t* ids = malloc((size_t)capacity * sizeof *ids);
    assert_non_null(ids);
    int n = encode_or_fail(t, text, false, false, ids, capacity);
    assert_int_equal(n, n_one * repeats);
    for (int i = 0; i < n; i++) assert_int_equal(ids[i], one[i % n_one]);
    free(ids);
    free(text);
    tok_free(t);
}

static void test_capacity_overflow(void** state) {
    (void)state;
    tokenizer* t = load_tok512();
    int32_t ids[8];
    for (int i = 0; i < 8; i++) ids[i] = -7;
    error_info err;
    error_clear(&err);
    int n = -1;
    // "Once upon a time" needs 5 ids with BOS; offer 3 of the 8.
    assert_int_equal(tok_encode(t, "Once upon a time", true, false, ids, 3, &n, &err), -1);
    assert_message_has(&err, "needs 5 ids");
    assert_message_has(&err, "capacity is 3");
    assert_int_equal(n, 5);  // the count needed, so a caller can retry
    for (int i = 0; i < 8; i++) assert_int_equal(ids[i], -7);

    // Exactly enough is fine; EOS needs one more.
    assert_int_equal(tok_encode(t, "Once upon a time", true, false, ids, 5, &n, &err), 0);
    assert_int_equal(n, 5);
    assert_int_equal(tok_encode(t, "Once upon a time", true, true, ids, 5, &n, &err), -1);
    assert_int_equal(n, 6);

    // Asking for the size with no array.
    assert_int_equal(tok_encode(t, "Once upon a time", true, false, NULL, 0, &n, &err), -1);
    assert_int_equal(n, 5);
    assert_int_equal(tok_encode(t, "x", true, false, NULL, 4, &n, &err), -1);
    assert_message_has(&err, "capacity");
    assert_int_equal(tok_encode(t, NULL, true, false, ids, 8, &n, &err), -1);
    assert_message_has(&err, "text is NULL");
    tok_free(t);
}

// ---- merge rules on hand-made vocabs -------------------------------------------
// Ids: 259 " ", 260 "a", 261 "b", then the merges.

static void test_merge_tie_goes_left(void** state) {
    (void)state;
    int32_t ids[16];
    // "ab" and "bb" score the same: the leftmost pair merges (llama2.c takes
    // a strictly higher score, so the first one found stays).
    const test_piece tie[] = {{" ", -1}, {"a", -1}, {"b", -1}, {"ab", 5}, {"bb", 5}};
    tokenizer* t = load_built("tie.bin", tie, 5);
    static const int32_t left[] = {259, 262, 261};  // " " "ab" "b"
    assert_ids(ids, encode_or_fail(t, "abb", false, false, ids, 16), left, 3);
    tok_free(t);

    // A higher score wins wherever it is.
    const test_piece higher[] = {{" ", -1}, {"a", -1}, {"b", -1}, {"ab", 5}, {"bb", 6}};
    t = load_built("higher.bin", higher, 5);
    static const int32_t right[] = {259, 260, 263};  // " " "a" "bb"
    assert_ids(ids, encode_or_fail(t, "abb", false, false, ids, 16), right, 3);
    tok_free(t);
}

static void test_merge_repeats_until_none(void** state) {
    (void)state;
    int32_t ids[16];
    // " a" (8) first, then " ab" (7) from it, then " abab" from two pieces.
    const test_piece chain[] = {{" ", 0},   {"a", 0},  {"b", 0},    {" a", 8},
                                {" ab", 7}, {"ab", 6}, {" abab", 1}};
    tokenizer* t = load_built("chain.bin", chain, 7);
    static const int32_t expected[] = {1, 265, 2};  // BOS " abab" EOS
    assert_ids(ids, encode_or_fail(t, "abab", true, true, ids, 16), expected, 3);
    tok_free(t);

    // llama2.c starts its best score at -1e10: a piece scoring lower never
    // forms, even when it is the only merge.
    const test_piece low[] = {{" ", 0}, {"a", 0}, {"b", 0}, {"ab", -2e10f}};
    t = load_built("low.bin", low, 4);
    static const int32_t unmerged[] = {259, 260, 261};
    assert_ids(ids, encode_or_fail(t, "ab", false, false, ids, 16), unmerged, 3);
    tok_free(t);
}

static void test_codepoints_and_fallback(void** state) {
    (void)state;
    int32_t ids[16];
    // "é" (2 bytes) is a piece; "è" is not and falls back to its bytes.
    const test_piece pieces[] = {{" ", 0}, {"é", 0}, {"x", 0}};
    tokenizer* t = load_built("utf8.bin", pieces, 3);
    static const int32_t expected[] = {259, 260, 0xC3 + 3, 0xA8 + 3, 261};
    assert_ids(ids, encode_or_fail(t, "éèx", false, false, ids, 16), expected, 5);
    tok_free(t);

    // No " " piece: the dummy prefix becomes the byte fallback for ' '
    // (llama2.c would store -1 there).
    const test_piece no_space[] = {{"x", 0}};
    t = load_built("nospace.bin", no_space, 1);
    static const int32_t fallback[] = {1, ' ' + 3, 259};
    assert_ids(ids, encode_or_fail(t, "x", true, false, ids, 16), fallback, 3);
    char text[8];
    assert_int_equal(tok_decode_text(t, ids[0], ids + 1, 2, text, sizeof text), 2);
    assert_string_equal(text, " x");  // only a piece starting with ' ' loses it after BOS
    tok_free(t);
}

// Only the exact form "<0xXX>" decodes to a byte (llama2.c's sscanf would
// also take "<0x41" and "<0x41>!"); hex digits of either case.
static void test_byte_piece_form(void** state) {
    (void)state;
    const test_piece pieces[] = {
        {" ", 0}, {"<0x4G>", 0}, {"<0x41", 0}, {"<0x41>!", 0}, {"<0x4a>", 0}};
    tokenizer* t = load_built("forms.bin", pieces, 5);
    assert_string_equal(tok_decode_piece(t, 0, 3 + 0x41), "A");
    assert_string_equal(tok_decode_piece(t, 0, 260), "<0x4G>");
    assert_string_equal(tok_decode_piece(t, 0, 261), "<0x41");
    assert_string_equal(tok_decode_piece(t, 0, 262), "<0x41>!");
    assert_string_equal(tok_decode_piece(t, 0, 263), "J");
    tok_free(t);
}

// ---- the byte-level tokenizer ---------------------------------------------------

static void test_byte_level(void** state) {
    (void)state;
    tokenizer* t = NULL;
    error_info err;
    error_clear(&err);
    assert_int_equal(tok_byte_level(&t, &err), 0);
    assert_int_equal(tok_vocab_size(t), 259);
    assert_true(tok_is_byte_level(t));

    const char* text = "Hi\n\xC3\xA9!";  // "Hi\né!"
    int32_t ids[16];
    static const int32_t expected[] = {1,        'H' + 3,  'i' + 3, '\n' + 3,
                                       0xC3 + 3, 0xA9 + 3, '!' + 3, 2};
    assert_ids(ids, encode_or_fail(t, text, true, true, ids, 16), expected, 8);
    assert_ids(ids, encode_or_fail(t, text, false, false, ids, 16), expected + 1, 6);
    static const int32_t empty[] = {1};
    assert_ids(ids, encode_or_fail(t, "", true, false, ids, 16), empty, 1);

    assert_string_equal(tok_decode_piece(t, TOK_BOS_ID, 'A' + 3), "A");
    assert_string_equal(tok_decode_piece(t, TOK_BOS_ID, ' ' + 3), " ");  // no prefix to strip
    assert_string_equal(tok_decode_piece(t, 0, TOK_UNK_ID), "");
    assert_string_equal(tok_decode_piece(t, 0, TOK_BOS_ID), "");
    assert_string_equal(tok_decode_piece(t, 0, TOK_EOS_ID), "");
    assert_string_equal(tok_decode_piece(t, 0, 258), "\xFF");
    assert_string_equal(tok_decode_piece(t, 0, 259), "");
    assert_string_equal(tok_decode_piece(t, 0, -1), "");

    assert_round_trip(t, "Hello, world! 123\n\ttabs");
    assert_round_trip(t, "naïve café — 日本語 🙂");
    assert_round_trip(t, " leading space kept");

    int n = -1;
    assert_int_equal(tok_encode(t, "abc", true, true, ids, 4, &n, &err), -1);
    assert_message_has(&err, "needs 5 ids");
    assert_int_equal(n, 5);
    tok_free(t);
}

static void test_printable_and_decode_text(void** state) {
    (void)state;
    assert_false(tok_piece_is_printable(""));
    assert_false(tok_piece_is_printable(NULL));
    assert_false(tok_piece_is_printable("\x01"));
    assert_false(tok_piece_is_printable("\x7F"));
    assert_true(tok_piece_is_printable("a"));
    assert_true(tok_piece_is_printable("\n"));
    assert_true(tok_piece_is_printable("\t"));
    assert_true(tok_piece_is_printable("\x01\x02"));  // only single bytes are filtered
    assert_true(tok_piece_is_printable("\xC3"));      // a UTF-8 fragment is kept

    tokenizer* t = NULL;
    assert_int_equal(tok_byte_level(&t, NULL), 0);
    const int32_t ids[] = {'H' + 3, 0x01 + 3, 'e' + 3, 'l' + 3, 'l' + 3, 'o' + 3, 2};
    char out[16];
    // The control byte and EOS are dropped: "Hello".
    assert_int_equal(tok_decode_text(t, TOK_BOS_ID, ids, 7, out, sizeof out), 5);
    assert_string_equal(out, "Hello");
    // Cut safely, still NUL-terminated, still reporting the full length.
    memset(out, 'z', sizeof out);
    assert_int_equal(tok_decode_text(t, TOK_BOS_ID, ids, 7, out, 4), 5);
    assert_string_equal(out, "Hel");
    assert_int_equal(out[4], 'z');
    assert_int_equal(tok_decode_text(t, TOK_BOS_ID, ids, 7, out, 1), 5);
    assert_string_equal(out, "");
    assert_int_equal(tok_decode_text(t, TOK_BOS_ID, ids, 7, NULL, 0), 5);
    assert_int_equal(tok_decode_text(t, TOK_BOS_ID, ids, 0, out, sizeof out), 0);
    assert_string_equal(out, "");
    tok_free(t);
}

// ---- corrupt files ------------------------------------------------------------------

// Loads path and expects failure with a message naming the file and holding
// both keys (key_b may be NULL).
static void expect_load_error(const char* path, int vocab_size, const char* key_a,
                              const char* key_b) {
    static char sentinel;
    tokenizer* t = (tokenizer*)&sentinel;  // not NULL: tok_load must clear it
    error_info err;
    error_clear(&err);
    if (tok_load(&t, path, vocab_size, &err) != -1)
        fail_msg("%s loaded, expected [%s]", path, key_a);
    assert_null(t);
    assert_message_has(&err, path);
    assert_message_has(&err, key_a);
    if (key_b) assert_message_has(&err, key_b);
}

// Offset of token `index` in a valid file.
static size_t token_offset(const byte_buffer* b, int index) {
    size_t offset = 4;
    for (int i = 0; i < index; i++) {
        uint32_t length = (uint32_t)b->bytes[offset + 4] | (uint32_t)b->bytes[offset + 5] << 8 |
                          (uint32_t)b->bytes[offset + 6] << 16 |
                          (uint32_t)b->bytes[offset + 7] << 24;
        offset += 8 + length;
    }
    return offset;
}

static void set_u32(byte_buffer* b, size_t offset, uint32_t value) {
    b->bytes[offset] = (unsigned char)value;
    b->bytes[offset + 1] = (unsigned char)(value >> 8);
    b->bytes[offset + 2] = (unsigned char)(value >> 16);
    b->bytes[offset + 3] = (unsigned char)(value >> 24);
}

// Ids 259.. : " ", "a", "b", "ab"; vocab 263, max_token_length 8.
static const test_piece valid_extra[] = {{" ", 0}, {"a", -1}, {"b", -2}, {"ab", -3}};
enum { VALID_VOCAB = TOK_MIN_VOCAB_SIZE + 4 };

static void test_valid_file_loads(void** state) {
    (void)state;
    tokenizer* t = load_built("valid.bin", valid_extra, 4);
    assert_int_equal(tok_vocab_size(t), VALID_VOCAB);
    int32_t ids[8];
    static const int32_t expected[] = {1, 259, 262};  // BOS " " "ab"
    assert_ids(ids, encode_or_fail(t, "ab", true, false, ids, 8), expected, 3);
    tok_free(t);
}

static void test_truncated_files(void** state) {
    (void)state;
    byte_buffer valid = build_file(8, valid_extra, 4);
    size_t token_37 = token_offset(&valid, 37);  // "<0x22>", 6 bytes

    expect_load_error(scratch_file("empty.bin", valid.bytes, 0), VALID_VOCAB, "truncated",
                      "max_token_length missing");
    expect_load_error(scratch_file("three.bin", valid.bytes, 3), VALID_VOCAB, "truncated",
                      "max_token_length missing");
    expect_load_error(scratch_file("header.bin", valid.bytes, 4), VALID_VOCAB, "truncated",
                      "token 0 missing, the file holds 0 tokens");
    expect_load_error(scratch_file("mid_score.bin", valid.bytes, token_37 + 2), VALID_VOCAB,
                      "truncated", "token 37 score missing");
    expect_load_error(scratch_file("mid_length.bin", valid.bytes, token_37 + 6), VALID_VOCAB,
                      "truncated", "token 37 length field missing");
    expect_load_error(scratch_file("mid_bytes.bin", valid.bytes, token_37 + 8 + 3), VALID_VOCAB,
                      "truncated", "token 37 needs 6 piece bytes");
    expect_load_error(scratch_file("last_byte.bin", valid.bytes, valid.size - 1), VALID_VOCAB,
                      "truncated", "token 262 needs 2 piece bytes");

    // A vocab_size larger than the file holds is truncation at the first
    // missing token, found without allocating for the tokens that are not there.
    const char* path = scratch_file("valid.bin", valid.bytes, valid.size);
    expect_load_error(path, VALID_VOCAB + 1, "truncated",
                      "token 263 missing, the file holds 263 tokens but vocab_size is 264");
    expect_load_error(path, INT_MAX, "truncated", "token 263 missing");
    free(valid.bytes);
}

static void test_bad_fields(void** state) {
    (void)state;
    byte_buffer valid = build_file(8, valid_extra, 4);
    byte_buffer b = {malloc(valid.size + 16), valid.size, valid.size + 16};
    assert_non_null(b.bytes);
    size_t token_10 = token_offset(&valid, 10);

    static const struct {
        const char* name;
        int32_t length;
        const char* key;
    } lengths[] = {
        {"negative_length.bin", -5, "token 10 length is -5, expected 1..8"},
        {"huge_length.bin", INT32_MAX, "token 10 length is 2147483647"},
        {"zero_length.bin", 0, "token 10 length is 0"},
        {"long_length.bin", 9, "token 10 length is 9, expected 1..8 (max_token_length)"},
    };
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        memcpy(b.bytes, valid.bytes, valid.size);
        set_u32(&b, token_10 + 4, (uint32_t)lengths[i].length);
        expect_load_error(scratch_file(lengths[i].name, b.bytes, b.size), VALID_VOCAB,
                          lengths[i].key, NULL);
    }

    static const struct {
        const char* name;
        int32_t value;
        const char* key;
    } headers[] = {
        {"negative_max.bin", -1, "max_token_length is -1, expected 1..4096"},
        {"zero_max.bin", 0, "max_token_length is 0"},
        {"huge_max.bin", 1000000, "max_token_length is 1000000"},
        // A max below the longest piece ("<unk>", 5 bytes) is caught at token 0.
        {"small_max.bin", 4, "token 0 length is 5, expected 1..4"},
    };
    for (size_t i = 0; i < sizeof headers / sizeof headers[0]; i++) {
        memcpy(b.bytes, valid.bytes, valid.size);
        set_u32(&b, 0, (uint32_t)headers[i].value);
        expect_load_error(scratch_file(headers[i].name, b.bytes, b.size), VALID_VOCAB,
                          headers[i].key, NULL);
    }

    memcpy(b.bytes, valid.bytes, valid.size);
    set_u32(&b, token_offset(&valid, 5), 0x7FC00000u);  // a quiet NaN
    expect_load_error(scratch_file("nan_score.bin", b.bytes, b.size), VALID_VOCAB,
                      "token 5 score is NaN", NULL);

    // Trailing bytes, and a vocab_size smaller than the file's.
    memcpy(b.bytes, valid.bytes, valid.size);
    memcpy(b.bytes + valid.size, "xyz", 3);
    expect_load_error(scratch_file("trailing.bin", b.bytes, valid.size + 3), VALID_VOCAB,
                      "3 trailing bytes after token 262", NULL);
    expect_load_error(scratch_file("valid.bin", valid.bytes, valid.size), VALID_VOCAB - 1,
                      "10 trailing bytes after token 261", "vocab_size");
    free(b.bytes);
    free(valid.bytes);
}

static void test_bad_paths_and_vocab_sizes(void** state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/no-such-tokenizer.bin", test_scratch_dir());
    expect_load_error(path, 512, "cannot open", "No such file");
    expect_load_error(test_scratch_dir(), 512, "not a regular file", NULL);

    byte_buffer valid = build_file(8, valid_extra, 4);
    const char* written = scratch_file("valid.bin", valid.bytes, valid.size);
    free(valid.bytes);
    expect_load_error(written, 0, "vocab_size is 0, expected at least 259", NULL);
    expect_load_error(written, -3, "vocab_size is -3", NULL);
    expect_load_error(written, 258, "vocab_size is 258", NULL);

    error_info err;
    error_clear(&err);
    assert_int_equal(tok_load(NULL, written, VALID_VOCAB, &err), -1);
    assert_message_has(&err, "out is NULL");
    tokenizer* t = NULL;
    assert_int_equal(tok_load(&t, NULL, VALID_VOCAB, &err), -1);
    assert_null(t);
    tok_free(NULL);  // allowed, like free(NULL)
}

static void test_file_vocab_size(void** state) {
    (void)state;
    byte_buffer valid = build_file(8, valid_extra, 4);
    error_info err;
    error_clear(&err);
    int vocab_size = -1;
    const char* path = scratch_file("count.bin", valid.bytes, valid.size);
    assert_int_equal(tok_file_vocab_size(path, &vocab_size, &err), 0);
    assert_int_equal(vocab_size, VALID_VOCAB);

    // The same checks as tok_load, token count aside.
    size_t token_37 = token_offset(&valid, 37);
    path = scratch_file("count_cut.bin", valid.bytes, token_37 + 8 + 3);
    assert_int_equal(tok_file_vocab_size(path, &vocab_size, &err), -1);
    assert_int_equal(vocab_size, 0);
    assert_message_has(&err, path);
    assert_message_has(&err, "truncated: token 37 needs 6 piece bytes");
    path = scratch_file("count_empty.bin", valid.bytes, 0);
    assert_int_equal(tok_file_vocab_size(path, &vocab_size, &err), -1);
    assert_message_has(&err, "max_token_length missing");
    set_u32(&valid, token_37 + 4, 0);
    path = scratch_file("count_zero.bin", valid.bytes, valid.size);
    assert_int_equal(tok_file_vocab_size(path, &vocab_size, &err), -1);
    assert_message_has(&err, "token 37 length is 0");
    free(valid.bytes);

    char shared[512];
    if (shared_model_path(shared, sizeof shared, "tok512.bin")) {
        assert_int_equal(tok_file_vocab_size(shared, &vocab_size, &err), 0);
        assert_int_equal(vocab_size, 512);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_prompts),
        cmocka_unit_test(test_reference_encodings),
        cmocka_unit_test(test_decode_pieces),
        cmocka_unit_test(test_round_trip_tok512),
        cmocka_unit_test(test_round_trip_random_bytes),
        cmocka_unit_test(test_long_text),
        cmocka_unit_test(test_capacity_overflow),
        cmocka_unit_test(test_merge_tie_goes_left),
        cmocka_unit_test(test_merge_repeats_until_none),
        cmocka_unit_test(test_codepoints_and_fallback),
        cmocka_unit_test(test_byte_piece_form),
        cmocka_unit_test(test_byte_level),
        cmocka_unit_test(test_printable_and_decode_text),
        cmocka_unit_test(test_valid_file_loads),
        cmocka_unit_test(test_truncated_files),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_bad_paths_and_vocab_sizes),
        cmocka_unit_test(test_file_vocab_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
