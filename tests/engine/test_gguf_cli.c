// The GGUF files of ../shared/gguf through the servelab binary: info,
// tokenize and generate name a .gguf like any other model.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/test_support.h"

// ../shared/gguf (SERVELAB_SHARED moves ../shared) into out; skips without
// it, fails under CI, which always has it.
static void require_gguf_dir(char* out, size_t capacity) {
    const char* shared = getenv("SERVELAB_SHARED");
    snprintf(out, capacity, "%s/gguf", shared ? shared : "../shared");
    struct stat st;
    if (stat(out, &st) != 0) {
        if (getenv("CI")) fail_msg("%s is missing and CI is set", out);
        print_message("skipping: %s is missing (llama.cpp reference files)\n", out);
        skip();
    }
}

static command_result run(const char* format, ...) __attribute__((format(printf, 1, 2)));
static command_result run(const char* format, ...) {
    char arguments[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(arguments, sizeof arguments, format, args);
    va_end(args);
    return run_servelab(arguments);
}

static void expect_contains(const char* text, const char* needle) {
    if (!strstr(text, needle)) fail_msg("expected '%s' in:\n%s", needle, text);
}

static void test_info_describes_each_model(void** state) {
    (void)state;
    char dir[512];
    require_gguf_dir(dir, sizeof dir);
    command_result r = run("info %s/synth-gqa-q8_0.gguf", dir);
    assert_int_equal(r.exit_status, 0);
    expect_contains(r.out, "architecture: llama");
    expect_contains(r.out, "tensor types: F32 x9 Q8_0 x30");
    expect_contains(r.out, "KV heads 4 (grouped-query), head_dim 16, vocab 32000, context 128");
    // 2 x 4 layers x 4 KV heads x 16 dims x 2 bytes.
    expect_contains(r.out, "KV cache per token: fp32 2048 bytes, fp16 1024");
    expect_contains(r.out, "int8 symmetric, group 32");
    free_result(&r);
    const char* others[] = {"stories260K-f32", "synth-gqa-f16", "synth-gqa-q4_0"};
    for (int i = 0; i < 3; i++) {
        r = run("info %s/%s.gguf", dir, others[i]);
        assert_int_equal(r.exit_status, 0);
        expect_contains(r.out, "a decode step reads");
        free_result(&r);
    }
    // A file that is not a GGUF, and a GGUF of an architecture the forward pass lacks.
    r = run("info %s/synth-gqa.bin", dir);
    assert_int_equal(r.exit_status, 1);
    expect_contains(r.err, "not a GGUF file");
    free_result(&r);
    r = run("info %s/vocab/ggml-vocab-gpt-2.gguf", dir);
    assert_int_equal(r.exit_status, 1);
    expect_contains(r.out, "tokenizer: byte-level BPE (GPT-2), 50257 tokens, BOS 50256");
    expect_contains(r.out, "unsupported architecture gpt2 (supported: llama, qwen2)");
    free_result(&r);
}

static void test_tokenize_gives_llama_cpp_ids(void** state) {
    (void)state;
    char dir[512];
    require_gguf_dir(dir, sizeof dir);
    // golden/synth-gqa-*.golden prompt_ids.
    command_result r = run("tokenize --model %s/synth-gqa-q4_0.gguf --ids 'Once upon a time'", dir);
    assert_int_equal(r.exit_status, 0);
    assert_string_equal(r.out, "1 9038 2501 263 931\n");
    free_result(&r);
    // vocab/ggml-vocab-llama-spm.gguf.out, case 12 (no BOS, as llama.cpp's test).
    r = run("tokenize --model %s/vocab/ggml-vocab-llama-spm.gguf --ids --no-bos ' Hello world'", dir);
    assert_int_equal(r.exit_status, 0);
    assert_string_equal(r.out, "29871 15043 3186\n");
    free_result(&r);
    r = run("tokenize --model %s/stories260K-f32.gguf 'Once upon'", dir);
    assert_int_equal(r.exit_status, 0);
    expect_contains(r.out, "403  ' Once'");
    free_result(&r);
    // vocab/ggml-vocab-gpt-2.gguf.out, case 16: byte-level BPE, no BOS by default.
    r = run("tokenize --model %s/vocab/ggml-vocab-gpt-2.gguf --ids 'Hello, world!'", dir);
    assert_int_equal(r.exit_status, 0);
    assert_string_equal(r.out, "15496 11 995 0\n");
    free_result(&r);
}

// generate on the GGUF copy of stories260K prints what it prints on the
// llama2.c checkpoint (the weights are the same bytes).
static void test_generate_on_gguf_equals_checkpoint(void** state) {
    (void)state;
    char dir[512], bin_path[512];
    require_gguf_dir(dir, sizeof dir);
    REQUIRE_SHARED_MODEL(bin_path, "stories260K.bin");
    command_result a = run("generate --model %s/stories260K-f32.gguf --prompt 'The little dog' -n 60", dir);
    command_result b = run("generate --model %s --prompt 'The little dog' -n 60", bin_path);
    assert_int_equal(a.exit_status, 0);
    assert_int_equal(b.exit_status, 0);
    assert_true(strlen(a.out) > 40);
    assert_string_equal(a.out, b.out);
    free_result(&a);
    free_result(&b);
    // The quantized files say in one line what their blocks became.
    a = run("generate --model %s/synth-gqa-q4_0.gguf -n 4 --ids", dir);
    assert_int_equal(a.exit_status, 0);
    expect_contains(a.err, "Q4_0 -> int4 g32 (W4A8");
    free_result(&a);
}

// ---- terminal escapes in the file's text (issue 46 item 10) ---------------------------------

static uint64_t read_u64(const unsigned char* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static size_t find_key(const unsigned char* bytes, size_t size, const char* key) {
    size_t n = strlen(key);
    for (size_t i = 0; i + n <= size; i++)
        if (memcmp(bytes + i, key, n) == 0) return i + n;
    fail_msg("'%s' not found", key);
    return 0;
}

// Overwrites the text of string value `target` (its bytes end at the
// array's end or the next string) with `text`, padded with 'x' to its length.
static void overwrite_text(unsigned char* at, uint64_t length, const char* text) {
    size_t n = strlen(text);
    if (n > length) fail_msg("piece of %llu bytes is too short for %zu", (unsigned long long)length, n);
    memset(at, 'x', (size_t)length);
    memcpy(at, text, n);
}

// stories260K-f32.gguf with general.name "llama" made U+009B "2J" ESC, and
// the first two pieces of 8 bytes or more (after the byte tokens) made
// ESC ] 0 ; pw BEL (set the title) and U+009B 2 J ESC [ m. Their ids into
// hostile_ids; the file's path into path.
static void write_hostile_gguf(const char* dir, char* path, size_t capacity, int hostile_ids[2]) {
    char good[600];
    snprintf(good, sizeof good, "%s/stories260K-f32.gguf", dir);
    size_t size = 0;
    unsigned char* bytes = test_read_file(good, &size);
    assert_non_null(bytes);
    size_t name_at = find_key(bytes, size, "general.name") + 4; // value type
    assert_int_equal(read_u64(bytes + name_at), 5);
    memcpy(bytes + name_at + 8, "\xc2\x9b" "2J\x1b", 5);
    size_t at = find_key(bytes, size, "tokenizer.ggml.tokens") + 4 + 4; // value type, element type
    const uint64_t count = read_u64(bytes + at);
    at += 8;
    int found = 0;
    for (uint64_t id = 0; id < count && found < 2; id++) {
        uint64_t length = read_u64(bytes + at);
        if (id > 258 && length >= 8) {
            overwrite_text(bytes + at + 8, length, found == 0 ? "\x1b]0;pw\x07" : "\xc2\x9b" "2J\x1b[m");
            hostile_ids[found++] = (int)id;
        }
        at += 8 + (size_t)length;
    }
    assert_int_equal(found, 2);
    snprintf(path, capacity, "%s/hostile-text.gguf", test_scratch_dir());
    assert_true(test_write_file(path, bytes, size));
    free(bytes);
}

static void expect_no_controls(const char* text, const char* what) {
    for (const unsigned char* c = (const unsigned char*)text; *c; c++)
        if ((*c < 0x20 && *c != '\n' && *c != '\t') || *c == 0x7f || (c[0] == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f))
            fail_msg("%s: a control (0x%02x) reached the terminal:\n%s", what, *c, text);
}

// info shows general.name with '?' for U+009B (C1) as for ESC (C0).
static void test_info_filters_c1_in_the_name(void** state) {
    (void)state;
    char dir[512], path[600];
    int ids[2];
    require_gguf_dir(dir, sizeof dir);
    write_hostile_gguf(dir, path, sizeof path, ids);
    command_result r = run("info %s", path);
    if (r.exit_status != 0) fail_msg("info failed: %s", r.err);
    expect_no_controls(r.out, "info");
    expect_contains(r.out, "architecture: llama, name ?2J?");
    free_result(&r);
}

// generate prints pieces with '?' for controls, while the byte token
// <0x0A> (id 13) still breaks the line.
static void test_generate_filters_controls_in_pieces(void** state) {
    (void)state;
    char dir[512], path[600];
    int ids[2];
    require_gguf_dir(dir, sizeof dir);
    write_hostile_gguf(dir, path, sizeof path, ids);
    command_result r = run("generate --model %s --prompt-ids '%d 13 %d' -n 1", path, ids[0], ids[1]);
    if (r.exit_status != 0) fail_msg("generate failed: %s", r.err);
    expect_no_controls(r.out, "generate");
    expect_contains(r.out, "?]0;pw?x");
    expect_contains(r.out, "\n?2J?[mx");
    free_result(&r);
}

// quant calibrates on built-in stories, the longest 131 tokens: a GGUF
// whose context is 128 (llama.cpp's llama2.c converter writes that) gets
// them cut to its context instead of an error.
static void test_quant_on_gguf(void** state) {
    (void)state;
    char dir[512];
    require_gguf_dir(dir, sizeof dir);
    command_result r = run("quant --model %s/stories260K-f32.gguf --scheme w4a8", dir);
    if (r.exit_status != 0) fail_msg("quant on a GGUF failed: %s", r.err);
    expect_contains(r.out, "top-1 agreement");
    free_result(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_info_describes_each_model),
        cmocka_unit_test(test_tokenize_gives_llama_cpp_ids),
        cmocka_unit_test(test_generate_on_gguf_equals_checkpoint),
        cmocka_unit_test(test_quant_on_gguf),
        cmocka_unit_test(test_info_filters_c1_in_the_name),
        cmocka_unit_test(test_generate_filters_controls_in_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
