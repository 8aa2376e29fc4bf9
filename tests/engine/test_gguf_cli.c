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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
