// Chat templates: recognition from a template's markers, the text each
// family writes, special tokens encoded as tokens, and `generate --chat` on
// a copy of stories260K-f32.gguf given a Zephyr-style template at test time.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/chat_template.h"
#include "engine/gguf_vocab.h"
#include "engine/tokenizer.h"
#include "tests/test_support.h"

static bool gguf_reference_path(char* out, size_t capacity, const char* name) {
    const char* shared = getenv("SERVELAB_SHARED");
    int written = snprintf(out, capacity, "%s/gguf/%s", shared ? shared : "../shared", name);
    struct stat st;
    return written > 0 && (size_t)written < capacity && stat(out, &st) == 0;
}

#define REQUIRE_GGUF_FILE(buffer, name)                                                       \
    do {                                                                                      \
        if (!gguf_reference_path((buffer), sizeof(buffer), (name))) {                         \
            if (getenv("CI")) fail_msg("../shared/gguf/%s is missing and CI is set", (name)); \
            print_message("skipping: ../shared/gguf/%s is missing\n", (name));                \
            skip();                                                                           \
        }                                                                                     \
    } while (0)

// Fragments in the style of each family's Jinja template (written for this
// test: only the markers matter to the recogniser).
static void test_recognise(void** state) {
    (void)state;
    assert_int_equal(chat_template_recognise("{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + "
                                             "m['content'] + '<|eot_id|>' }}"),
                     CHAT_TEMPLATE_LLAMA3);
    assert_int_equal(chat_template_recognise("{{'<|im_start|>' + message['role'] + '\n'}}"), CHAT_TEMPLATE_CHATML);
    assert_int_equal(chat_template_recognise("{{ bos_token + '[INST] ' + content + ' [/INST]' }}"),
                     CHAT_TEMPLATE_LLAMA2);
    assert_int_equal(chat_template_recognise("{{ '<|user|>\n' + c + eos_token }}{{ '<|assistant|>' }}"),
                     CHAT_TEMPLATE_ZEPHYR);
    assert_int_equal(chat_template_recognise("{{ 'User: ' + content }}"), CHAT_TEMPLATE_NONE);
    assert_int_equal(chat_template_recognise(NULL), CHAT_TEMPLATE_NONE);
}

static void expect_applied(chat_template_kind kind, const char* expected) {
    const chat_message messages[3] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}};
    const chat_message next = {"user", "Why?"};
    chat_message all[4] = {messages[0], messages[1], messages[2], next};
    char out[512];
    size_t needed = 0;
    error_info err = {{0}};
    if (chat_template_apply(kind, all, 4, true, out, sizeof out, &needed, &err)) fail_msg("%s", err.message);
    assert_string_equal(out, expected);
    assert_int_equal(needed, strlen(expected));
    // Too small: fails, says how much it needs, stays NUL-terminated.
    char small[8];
    assert_int_equal(chat_template_apply(kind, all, 4, true, small, sizeof small, &needed, &err), -1);
    assert_int_equal(needed, strlen(expected));
    assert_int_equal(strlen(small), 7);
}

static void test_apply_each_family(void** state) {
    (void)state;
    expect_applied(CHAT_TEMPLATE_LLAMA3, "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                                         "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                                         "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
                                         "<|start_header_id|>user<|end_header_id|>\n\nWhy?<|eot_id|>"
                                         "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_applied(CHAT_TEMPLATE_CHATML, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                         "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n"
                                         "<|im_start|>assistant\n");
    expect_applied(CHAT_TEMPLATE_LLAMA2,
                   "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] Why? [/INST]");
    expect_applied(CHAT_TEMPLATE_ZEPHYR, "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello</s>\n"
                                         "<|user|>\nWhy?</s>\n<|assistant|>\n");
    char out[64];
    size_t needed = 0;
    error_info err = {{0}};
    chat_message odd = {"tool", "x"};
    assert_int_equal(chat_template_apply(CHAT_TEMPLATE_CHATML, &odd, 1, true, out, sizeof out, &needed, &err), -1);
    assert_non_null(strstr(err.message, "role 'tool'"));
    assert_int_equal(chat_template_apply(CHAT_TEMPLATE_NONE, &odd, 1, true, out, sizeof out, &needed, &err), -1);
}

// Special texts become their ids; the rest is encoded as tok_encode does.
static void test_special_tokens_in_text(void** state) {
    (void)state;
    char path[512];
    REQUIRE_GGUF_FILE(path, "vocab/ggml-vocab-llama-spm.gguf");
    tokenizer* t = NULL;
    error_info err = {{0}};
    if (tok_load_gguf(&t, path, &err)) fail_msg("%s", err.message);
    int32_t ids[64], part[32];
    int n = 0, n_part = 0;
    assert_int_equal(tok_encode_special(t, "[INST] Hi [/INST] Hello </s><s>[INST] Why?", true, false, ids, 64, &n, &err), 0);
    int32_t expected[64];
    int n_expected = 0;
    expected[n_expected++] = 1;
    assert_int_equal(tok_encode(t, "[INST] Hi [/INST] Hello ", false, false, part, 32, &n_part, &err), 0);
    memcpy(expected + n_expected, part, (size_t)n_part * sizeof *part);
    n_expected += n_part;
    expected[n_expected++] = 2; // </s>
    expected[n_expected++] = 1; // <s>
    assert_int_equal(tok_encode(t, "[INST] Why?", false, false, part, 32, &n_part, &err), 0);
    memcpy(expected + n_expected, part, (size_t)n_part * sizeof *part);
    n_expected += n_part;
    assert_int_equal(n, n_expected);
    assert_memory_equal(ids, expected, (size_t)n * sizeof *ids);
    // Too small: fails with the exact count.
    assert_int_equal(tok_encode_special(t, "[INST] Hi [/INST] Hello </s><s>[INST] Why?", true, false, ids, 3, &n, &err), -1);
    assert_int_equal(n, n_expected);
    tok_free(t);

    REQUIRE_GGUF_FILE(path, "vocab/ggml-vocab-gpt-2.gguf");
    if (tok_load_gguf(&t, path, &err)) fail_msg("%s", err.message);
    assert_int_equal(tok_encode_special(t, "Hi<|endoftext|>Hi", false, false, ids, 64, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 17250); // "Hi"
    assert_int_equal(ids[1], 50256);
    assert_int_equal(ids[2], 17250);
    tok_free(t);
}

static void put_u64(unsigned char* p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

// stories260K-f32.gguf with one more key, tokenizer.chat_template, written
// right after the header: a multiple of 32 bytes (the alignment), so every
// tensor stays where its offset says.
static void write_with_template(const char* source, const char* destination, const char* template_text) {
    size_t size = 0;
    unsigned char* bytes = test_read_file(source, &size);
    assert_non_null(bytes);
    const char* key = "tokenizer.chat_template";
    size_t text_length = strlen(template_text);
    size_t inserted = 8 + strlen(key) + 4 + 8 + text_length;
    size_t padding = (32 - inserted % 32) % 32; // spaces at the end of the template
    inserted += padding;
    unsigned char* out = malloc(size + inserted);
    memcpy(out, bytes, 24);
    uint64_t n_kv = 0;
    for (int i = 0; i < 8; i++) n_kv |= (uint64_t)bytes[16 + i] << (8 * i);
    put_u64(out + 16, n_kv + 1);
    unsigned char* p = out + 24;
    put_u64(p, strlen(key));
    memcpy(p + 8, key, strlen(key));
    p += 8 + strlen(key);
    p[0] = 8, p[1] = p[2] = p[3] = 0; // GGUF_VALUE_STRING
    put_u64(p + 4, text_length + padding);
    memcpy(p + 12, template_text, text_length);
    memset(p + 12 + text_length, ' ', padding);
    memcpy(out + 24 + inserted, bytes + 24, size - 24);
    assert_true(test_write_file(destination, out, size + inserted));
    free(out);
    free(bytes);
}

static void test_generate_chat_on_a_templated_file(void** state) {
    (void)state;
    char source[512], path[600];
    REQUIRE_GGUF_FILE(source, "stories260K-f32.gguf");
    snprintf(path, sizeof path, "%s/stories-zephyr.gguf", test_scratch_dir());
    write_with_template(source, path, "{% for m in messages %}{% if m['role'] == 'user' %}{{ '<|user|>\\n' + "
                                      "m['content'] + eos_token }}{% elif m['role'] == 'system' %}{{ '<|system|>\\n' + "
                                      "m['content'] + eos_token }}{% endif %}{% endfor %}{{ '<|assistant|>' }}");
    char arguments[800];
    snprintf(arguments, sizeof arguments, "info %s", path);
    command_result r = run_servelab(arguments);
    assert_int_equal(r.exit_status, 0);
    if (!strstr(r.out, "chat template: zephyr (recognised")) fail_msg("info says:\n%s", r.out);
    free_result(&r);
    snprintf(arguments, sizeof arguments, "generate --model %s --chat --system 'Be kind.' --prompt 'Hi' -n 8", path);
    r = run_servelab(arguments);
    if (r.exit_status != 0) fail_msg("exit %d: %s", r.exit_status, r.err);
    // The prompt printed back as its pieces: </s> is EOS (id 2, a control
    // token, not the text "</s>"), and the text after it gets SentencePiece's
    // leading space, as llama.cpp gives text that follows a special token.
    if (!strstr(r.out, "<|system|>\nBe kind.</s> \n<|user|>\nHi</s> \n<|assistant|>\n")) fail_msg("printed:\n%s", r.out);
    free_result(&r);
    // Without a template: refused with the reason.
    snprintf(arguments, sizeof arguments, "generate --model %s --chat --prompt 'Hi' -n 2", source);
    r = run_servelab(arguments);
    assert_int_equal(r.exit_status, 2);
    assert_non_null(strstr(r.err, "no chat template servelab recognises"));
    free_result(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recognise),
        cmocka_unit_test(test_apply_each_family),
        cmocka_unit_test(test_special_tokens_in_text),
        cmocka_unit_test(test_generate_chat_on_a_templated_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
