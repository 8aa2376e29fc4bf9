// Workloads: generated ones, and JSON Lines files read with Jansson: the
// requests they give, and the whole message of every kind of bad line
// (file, line, field, what was expected and what was found), including the
// inputs that made the old hand-written parser read past the end of the
// line and the prompt message that used to be garbled.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "lab/bench/workload.h"
#include "tests/test_support.h"

static const int VOCAB = TOK_MIN_VOCAB_SIZE; // the byte-level tokenizer's 259

static tokenizer* byte_tokenizer(void) {
    tokenizer* tok = NULL;
    error_info err = {{0}};
    if (tok_byte_level(&tok, &err)) fail_msg("tok_byte_level: %s", err.message);
    return tok;
}

// Reads `length` bytes of text as the file "w.jsonl"; returns the status.
static int read_text(workload* w, const char* text, size_t length, const tokenizer* tok, int max_seq_len,
                     error_info* err) {
    FILE* file = fmemopen((void*)text, length, "r");
    assert_non_null(file);
    int status = workload_read_stream(w, file, "w.jsonl", tok, VOCAB, max_seq_len, err);
    fclose(file);
    return status;
}

// The text must fail with exactly `expected`.
static void expect_error(const char* text, size_t length, const tokenizer* tok, int max_seq_len, const char* expected) {
    workload w;
    error_info err = {{0}};
    if (read_text(&w, text, length, tok, max_seq_len, &err) == 0) fail_msg("'%s' was accepted", text);
    if (strcmp(err.message, expected) != 0)
        fail_msg("input '%.200s'\n     gave '%s'\n expected '%s'", text, err.message, expected);
    assert_null(w.requests);
    assert_int_equal(w.n_requests, 0);
}

#define EXPECT_ERROR(text, tok, max_seq_len, expected) expect_error((text), strlen(text), (tok), (max_seq_len), (expected))

static void test_generated_workload_is_seeded(void** state) {
    (void)state;
    workload_spec spec = {8, {LENGTH_UNIFORM, 4, 12}, {LENGTH_FIXED, 5, 0}, 2.0, 3, 42, VOCAB, 32};
    workload a, b;
    error_info err = {{0}};
    assert_int_equal(workload_generate(&a, &spec, &err), 0);
    assert_int_equal(workload_generate(&b, &spec, &err), 0);
    assert_int_equal(a.n_requests, 8);
    for (int r = 0; r < a.n_requests; r++) {
        assert_int_equal(a.requests[r].n_prompt, b.requests[r].n_prompt);
        assert_memory_equal(a.requests[r].prompt, b.requests[r].prompt, (size_t)a.requests[r].n_prompt * sizeof(int32_t));
        assert_int_equal(a.requests[r].prompt[0], TOK_BOS_ID);
        assert_memory_equal(a.requests[r].prompt + 1, a.requests[0].prompt + 1, 3 * sizeof(int32_t)); // shared prefix
        assert_int_equal(a.requests[r].max_tokens, 5);
        if (r > 0) assert_true(a.requests[r].arrival_time >= a.requests[r - 1].arrival_time);
    }
    workload_free(&a);
    workload_free(&b);
    length_distribution d;
    assert_int_equal(length_distribution_parse("--prompt-len", "lognormal:100:20", &d, &err), 0);
    assert_int_equal(d.kind, LENGTH_LOGNORMAL);
    assert_int_equal(length_distribution_parse("--prompt-len", "uniform:9:3", &d, &err), -1);
    assert_string_equal(err.message, "--prompt-len: expected fixed:N, uniform:LOW:HIGH or lognormal:MEAN:SD with "
                                     "lengths >= 1, found 'uniform:9:3'");
}

// Issue 46 item 7c: fixed:2147483647 became an int length whose sum with the
// prompt overflowed (UBSan), and inf passed "a >= 1" into llround.
static void test_lengths_beyond_the_limit_are_refused(void** state) {
    (void)state;
    static const char* const TOO_LONG[] = {"fixed:2147483647", "fixed:inf",     "uniform:1:1e300",
                                           "lognormal:1e12:5", "lognormal:8:inf", "fixed:1048577"};
    for (size_t i = 0; i < sizeof TOO_LONG / sizeof TOO_LONG[0]; i++) {
        length_distribution d;
        error_info err = {{0}};
        if (length_distribution_parse("--output-len", TOO_LONG[i], &d, &err) != -1)
            fail_msg("%s was accepted", TOO_LONG[i]);
        char expected[256];
        snprintf(expected, sizeof expected, "--output-len: lengths above 1048576 tokens are not supported, found '%s'",
                 TOO_LONG[i]);
        assert_string_equal(err.message, expected);
    }
    length_distribution d;
    error_info err = {{0}};
    assert_int_equal(length_distribution_parse("--output-len", "fixed:1048576", &d, &err), 0);
}

static void test_reads_requests(void** state) {
    (void)state;
    tokenizer* tok = byte_tokenizer();
    // Both prompt forms, blank lines (also CRLF ones), whole numbers written
    // as reals, ids without BOS (it is put first), sorted by arrival with
    // ties in file order.
    const char* text = "{\"prompt_ids\": [5, 6.0, 1e1], \"max_tokens\": 4.0, \"arrival\": 2}\r\n"
                       "\n"
                       "   \t\r\n"
                       "{\"prompt\": \"h\\u00e9\", \"max_tokens\": 2, \"arrival\": 0.5}\n"
                       "{ \"max_tokens\" : 3 , \"prompt_ids\" : [ 1 , 258 ] , \"arrival\" : 0.5 }\n"
                       "{\"prompt\": \"\", \"max_tokens\": 1}"; // the last line has no newline
    workload w;
    error_info err = {{0}};
    if (read_text(&w, text, strlen(text), tok, 16, &err)) fail_msg("%s", err.message);
    assert_int_equal(w.n_requests, 4);
    // "" is BOS alone, at time 0.
    assert_int_equal(w.requests[0].n_prompt, 1);
    assert_int_equal(w.requests[0].prompt[0], TOK_BOS_ID);
    assert_int_equal(w.requests[0].max_tokens, 1);
    // "hé": BOS, 'h' + 3, then the two UTF-8 bytes of é (0xC3 0xA9) + 3.
    const int32_t he[] = {TOK_BOS_ID, 'h' + 3, 0xC3 + 3, 0xA9 + 3};
    assert_int_equal(w.requests[1].n_prompt, 4);
    assert_memory_equal(w.requests[1].prompt, he, sizeof he);
    assert_true(w.requests[1].arrival_time == 0.5);
    const int32_t given_bos[] = {TOK_BOS_ID, 258};
    assert_int_equal(w.requests[2].n_prompt, 2);
    assert_memory_equal(w.requests[2].prompt, given_bos, sizeof given_bos);
    assert_int_equal(w.requests[2].max_tokens, 3);
    const int32_t added_bos[] = {TOK_BOS_ID, 5, 6, 10};
    assert_int_equal(w.requests[3].n_prompt, 4);
    assert_memory_equal(w.requests[3].prompt, added_bos, sizeof added_bos);
    assert_int_equal(w.requests[3].max_tokens, 4);
    assert_true(w.requests[3].arrival_time == 2.0);
    assert_true(workload_mean_output(&w) == 2.5);
    workload_free(&w);

    // A prompt that exactly fills the model: 15 ids + 1 output = 16.
    text = "{\"prompt_ids\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15], \"max_tokens\": 1}\n";
    if (read_text(&w, text, strlen(text), NULL, 16, &err)) fail_msg("%s", err.message);
    assert_int_equal(w.requests[0].n_prompt, 15);
    workload_free(&w);
    tok_free(tok);
}

static void test_field_errors_name_file_line_and_field(void** state) {
    (void)state;
    tokenizer* tok = byte_tokenizer();
    const char* good = "{\"prompt_ids\": [1, 40, 50], \"max_tokens\": 4}\n";
    char text[512];
    snprintf(text, sizeof text, "%s%s", good, "{\"prompt_ids\": [1, 2, \"x\"], \"max_tokens\": 4}\n");
    EXPECT_ERROR(text, tok, 16,
                 "w.jsonl:2: expected a number for field 'prompt_ids' item 3 (a token id 0..258), got the string \"x\"");
    snprintf(text, sizeof text, "%s\n%s", good, "{\"prompt_ids\": [5], \"max_tokens\": -5}");
    EXPECT_ERROR(text, tok, 512, "w.jsonl:3: expected a whole number 1..512 for field 'max_tokens', got -5");
    EXPECT_ERROR("{\"prompt_ids\": [5], \"max_tokens\": 2.5}", tok, 16,
                 "w.jsonl:1: expected a whole number 1..16 for field 'max_tokens', got 2.5");
    EXPECT_ERROR("{\"prompt_ids\": [5], \"max_tokens\": \"4\"}", tok, 16,
                 "w.jsonl:1: expected a whole number 1..16 for field 'max_tokens', got the string \"4\"");
    EXPECT_ERROR("{\"prompt_ids\": [5], \"max_tokens\": 17}", tok, 16,
                 "w.jsonl:1: expected a whole number 1..16 for field 'max_tokens', got 17");
    EXPECT_ERROR("{\"prompt_ids\": [5], \"max_tokens\": 4, \"arrival\": -1}", tok, 16,
                 "w.jsonl:1: expected seconds >= 0 for field 'arrival', got -1");
    EXPECT_ERROR("{\"prompt_ids\": [5], \"max_tokens\": 4, \"arrival\": null}", tok, 16,
                 "w.jsonl:1: expected seconds >= 0 for field 'arrival', got null");
    EXPECT_ERROR("{\"prompt_ids\": [259], \"max_tokens\": 1}", tok, 16,
                 "w.jsonl:1: expected a token id 0..258 for field 'prompt_ids' item 1, got 259");
    EXPECT_ERROR("{\"prompt_ids\": [3, -1], \"max_tokens\": 1}", tok, 16,
                 "w.jsonl:1: expected a token id 0..258 for field 'prompt_ids' item 2, got -1");
    EXPECT_ERROR("{\"prompt_ids\": [1.5], \"max_tokens\": 1}", tok, 16,
                 "w.jsonl:1: expected a token id 0..258 for field 'prompt_ids' item 1, got 1.5");
    EXPECT_ERROR("{\"prompt_ids\": [[1]], \"max_tokens\": 1}", tok, 16,
                 "w.jsonl:1: expected a number for field 'prompt_ids' item 1 (a token id 0..258), got an array");
    EXPECT_ERROR("{\"prompt_ids\": 3, \"max_tokens\": 1}", tok, 16,
                 "w.jsonl:1: expected an array of token ids for field 'prompt_ids', got 3");
    EXPECT_ERROR("{\"prompt_ids\": [], \"max_tokens\": 1}", tok, 16,
                 "w.jsonl:1: expected at least one token id for field 'prompt_ids', got []");
    EXPECT_ERROR("{\"prompt_ids\": [2,3,4,5,6,7,8,9,10,11,12,13,14,15,16], \"max_tokens\": 1}", tok, 16,
                 "w.jsonl:1: expected at most 15 ids (BOS included) for field 'prompt_ids', got 16: the model's 16 "
                 "positions need one for the output");
    EXPECT_ERROR("{\"prompt_ids\": [1, 2, 3, 4, 5, 6, 7, 8], \"max_tokens\": 9}", tok, 16,
                 "w.jsonl:1: prompt (8 tokens) + max_tokens (9) exceed the model's 16");
    EXPECT_ERROR("{\"prompt\": 5, \"max_tokens\": 2}", tok, 16, "w.jsonl:1: expected a string for field 'prompt', got 5");
    EXPECT_ERROR("{\"prompt\": \"hi\", \"max_tokens\": 2}", NULL, 16,
                 "w.jsonl:1: field 'prompt': text needs a tokenizer; use \"prompt_ids\"");
    EXPECT_ERROR("{\"prompt\": \"a\", \"max_tokens\": 2, \"temperature\": 1}", tok, 16,
                 "w.jsonl:1: unknown key \"temperature\" (expected prompt, prompt_ids, max_tokens, arrival)");
    EXPECT_ERROR("{\"prompt\": \"a\", \"max_tokens\": 2, \"\\u00e9\\n\": 1}", tok, 16,
                 "w.jsonl:1: unknown key \"???\" (expected prompt, prompt_ids, max_tokens, arrival)");
    EXPECT_ERROR("{\"prompt\": \"a\", \"prompt_ids\": [3], \"max_tokens\": 1}", tok, 16,
                 "w.jsonl:1: both \"prompt\" and \"prompt_ids\": give one of them");
    EXPECT_ERROR("{\"max_tokens\": 1}", tok, 16, "w.jsonl:1: no \"prompt\" or \"prompt_ids\"");
    EXPECT_ERROR("{\"prompt\": \"a\"}", tok, 16, "w.jsonl:1: missing \"max_tokens\"");
    EXPECT_ERROR("[1]", tok, 16, "w.jsonl:1: expected an object {\"prompt\": ..., \"max_tokens\": ...}, got an array");
    EXPECT_ERROR("\"a very long string that is cut in the message\"", tok, 16,
                 "w.jsonl:1: expected an object {\"prompt\": ..., \"max_tokens\": ...}, got the string "
                 "\"a very long string that ...\"");
    EXPECT_ERROR("", tok, 16, "w.jsonl: no requests in the file");
    EXPECT_ERROR("\n  \n", tok, 16, "w.jsonl: no requests in the file");
    tok_free(tok);
}

static void test_json_errors_give_line_and_column(void** state) {
    (void)state;
    tokenizer* tok = byte_tokenizer();
    EXPECT_ERROR("{\"prompt\": \"a\", \"max_tokens\": 2,}", tok, 16,
                 "w.jsonl:1:33: invalid JSON: string or '}' expected near '}'");
    EXPECT_ERROR("{\"prompt_ids\": [3], \"max_tokens\": 1} x", tok, 16,
                 "w.jsonl:1:38: invalid JSON: extra text after the object near 'x'");
    EXPECT_ERROR("{\"prompt_ids\": [5], \"max_tokens\": 4, \"max_tokens\": 3}", tok, 16,
                 "w.jsonl:1:49: invalid JSON: duplicate object key near '\"max_tokens\"'");
    EXPECT_ERROR("{\"prompt_ids\": [3], \"max_tokens\": 1e400}", tok, 16,
                 "w.jsonl:1:39: invalid JSON: real number overflow near '1e400'");
    EXPECT_ERROR("{\"prompt_ids\": [3], \"max_tokens\": NaN}", tok, 16,
                 "w.jsonl:1:37: invalid JSON: invalid token near 'NaN'");
    EXPECT_ERROR("{\"prompt\": \"a\\u0000b\", \"max_tokens\": 2}", tok, 16,
                 "w.jsonl:1:21: invalid JSON: \\u0000 in a string (a prompt is text without NUL)");
    // Not UTF-8 (Latin-1 é).
    EXPECT_ERROR("{\"prompt\": \"caf\xe9\", \"max_tokens\": 2}", tok, 16,
                 "w.jsonl:1:15: invalid JSON: unable to decode byte 0xe9 near '\"caf'");
    tok_free(tok);
}

// The old parser stepped over the NUL that ends the line after a '\' or a
// "\u" at its very end and read on past the buffer (workload.c:119,129
// before Jansson). The line ends the file, with no newline after it, so
// that the escape is the last byte read. Under `make check` ASan would
// report the over-read; here each must give a clean message.
static void test_escape_at_end_of_input_is_a_clean_error(void** state) {
    (void)state;
    tokenizer* tok = byte_tokenizer();
    EXPECT_ERROR("{\"prompt\": \"abc\\", tok, 16, "w.jsonl:1:16: invalid JSON: invalid escape near '\"abc\\'");
    EXPECT_ERROR("{\"prompt\": \"\\", tok, 16, "w.jsonl:1:13: invalid JSON: invalid escape near '\"\\'");
    EXPECT_ERROR("{\"prompt\": \"\\u", tok, 16, "w.jsonl:1:14: invalid JSON: invalid escape near '\"\\u'");
    EXPECT_ERROR("{\"prompt\": \"\\u12", tok, 16, "w.jsonl:1:16: invalid JSON: invalid escape near '\"\\u12'");
    EXPECT_ERROR("{\"prompt\": \"abc", tok, 16, "w.jsonl:1:15: invalid JSON: premature end of input near '\"abc'");

    // The same lines through workload_read and a real file: the second line
    // is the last, without a newline.
    const char* lines[] = {"{\"prompt\": \"abc\\", "{\"prompt\": \"\\u"};
    const char* expected[] = {"%s:2:16: invalid JSON: invalid escape near '\"abc\\'",
                              "%s:2:14: invalid JSON: invalid escape near '\"\\u'"};
    for (int i = 0; i < 2; i++) {
        char path[512], text[256], message[1024];
        snprintf(path, sizeof path, "%s/escape-%d.jsonl", test_scratch_dir(), i);
        snprintf(text, sizeof text, "{\"prompt\": \"ok\", \"max_tokens\": 1}\n%s", lines[i]);
        assert_true(test_write_file(path, text, strlen(text)));
        workload w;
        error_info err = {{0}};
        assert_int_equal(workload_read(&w, path, tok, VOCAB, 16, &err), -1);
        snprintf(message, sizeof message, expected[i], path);
        assert_string_equal(err.message, message);
    }
    tok_free(tok);
}

// The message used to be formatted into the buffer it read the tokenizer's
// message from (snprintf with overlapping arguments), which printed
// "w.jsonl:1: prompt: w.jsonl:1: prompt: acity is 512" and the like.
static void test_prompt_too_long_message_is_whole(void** state) {
    (void)state;
    tokenizer* tok = byte_tokenizer();
    char text[1024];
    memset(text, 0, sizeof text);
    int n = snprintf(text, sizeof text, "{\"prompt\": \"");
    memset(text + n, 'a', 600);
    snprintf(text + n + 600, sizeof text - (size_t)n - 600, "\", \"max_tokens\": 4}\n");
    EXPECT_ERROR(text, tok, 512,
                 "w.jsonl:1: field 'prompt': the text is 601 tokens (BOS included), more than the model's 512");
    tok_free(tok);
}

static void test_nul_bytes_nesting_and_long_lines_are_refused(void** state) {
    (void)state;
    tokenizer* tok = byte_tokenizer();
    static const char with_nul[] = "{\"prompt_ids\": [3], \"max_tokens\": 1}\n{\"prompt\": \"a\0b\", \"max_tokens\": 1}\n";
    expect_error(with_nul, sizeof with_nul - 1, tok, 16,
                 "w.jsonl:2:14: a NUL byte; JSON Lines are text (is this a binary file?)");

    // Jansson's depth cap (JSON_PARSER_MAX_DEPTH, 2048) ends deep nesting
    // before its recursion can exhaust the stack.
    size_t depth = 100000;
    char* deep = malloc(depth + 1);
    assert_non_null(deep);
    memset(deep, '[', depth);
    deep[depth] = '\0';
    EXPECT_ERROR(deep, tok, 16, "w.jsonl:1:2049: invalid JSON: nested deeper than 2048 levels");
    memcpy(deep, "{\"a\":", 5); // arrays nested inside an object's value
    memset(deep + 5, '[', depth - 5);
    EXPECT_ERROR(deep, tok, 16, "w.jsonl:1:2053: invalid JSON: nested deeper than 2048 levels");
    free(deep);

    // A line of exactly WORKLOAD_MAX_LINE_BYTES (padded with spaces) is read;
    // one byte more is refused without reading the rest.
    const char* request = "{\"prompt_ids\": [3], \"max_tokens\": 1}";
    size_t size = WORKLOAD_MAX_LINE_BYTES + 2;
    char* big = malloc(size + 1);
    assert_non_null(big);
    memset(big, ' ', size);
    memcpy(big, request, strlen(request));
    big[WORKLOAD_MAX_LINE_BYTES] = '\n';
    workload w;
    error_info err = {{0}};
    if (read_text(&w, big, WORKLOAD_MAX_LINE_BYTES + 1, tok, 16, &err)) fail_msg("%s", err.message);
    assert_int_equal(w.n_requests, 1);
    workload_free(&w);
    big[WORKLOAD_MAX_LINE_BYTES] = ' ';
    big[size] = '\0';
    expect_error(big, size, tok, 16, "w.jsonl:1: line longer than 1048576 bytes (one request per line)");
    free(big);
    tok_free(tok);
}

static void test_missing_file(void** state) {
    (void)state;
    workload w;
    error_info err = {{0}};
    assert_int_equal(workload_read(&w, "build/no/such.jsonl", NULL, VOCAB, 16, &err), -1);
    assert_string_equal(err.message, "build/no/such.jsonl: cannot open: No such file or directory");
    FILE* file = fmemopen((void*)"{}", 2, "r");
    assert_non_null(file);
    assert_int_equal(workload_read_stream(&w, file, "w.jsonl", NULL, VOCAB, 1, &err), -1);
    assert_string_equal(err.message, "w.jsonl: the model's vocab_size 259 and max_seq_len 1 leave no room for a request");
    fclose(file);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lengths_beyond_the_limit_are_refused),
        cmocka_unit_test(test_generated_workload_is_seeded),
        cmocka_unit_test(test_reads_requests),
        cmocka_unit_test(test_field_errors_name_file_line_and_field),
        cmocka_unit_test(test_json_errors_give_line_and_column),
        cmocka_unit_test(test_escape_at_end_of_input_is_a_clean_error),
        cmocka_unit_test(test_prompt_too_long_message_is_whole),
        cmocka_unit_test(test_nul_bytes_nesting_and_long_lines_are_refused),
        cmocka_unit_test(test_missing_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
