// The servelab binary as a user runs it: the acceptance commands of the
// foundation, and clear failures (exit 1 or 2, one line) on bad input.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/test_support.h"

typedef struct command_result {
    int exit_status;  // -1 when killed by a signal
    char* out;        // stdout
    char* err;        // stderr
} command_result;

static const char* servelab_binary(void) {
    const char* bin = getenv("SERVELAB_BIN");
    return bin ? bin : "bin/servelab";
}

static char* read_text(const char* path) {
    size_t size = 0;
    unsigned char* bytes = test_read_file(path, &size);
    char* text = realloc(bytes, size + 1);
    text[size] = '\0';
    return text;
}

static command_result run_servelab(const char* arguments) {
    char out_path[512], err_path[512], command[4096];
    snprintf(out_path, sizeof out_path, "%s/cli.out", test_scratch_dir());
    snprintf(err_path, sizeof err_path, "%s/cli.err", test_scratch_dir());
    snprintf(command, sizeof command, "%s %s >%s 2>%s </dev/null", servelab_binary(), arguments, out_path, err_path);
    int raw = system(command);
    command_result result = {-1, read_text(out_path), read_text(err_path)};
    // system() runs sh; a signal in the child shows as 128 + signal.
    if (raw != -1 && WIFEXITED(raw) && WEXITSTATUS(raw) < 128) result.exit_status = WEXITSTATUS(raw);
    return result;
}

static void free_result(command_result* r) {
    free(r->out);
    free(r->err);
}

static int count_lines(const char* text) {
    int n = 0;
    for (; *text; text++) n += *text == '\n';
    return n;
}

// The greedy line of golden case `index` (0-based), without "greedy: ".
static char* golden_line(int index) {
    char path[512];
    if (!shared_model_path(path, sizeof path, "stories260K.golden")) return NULL;
    char* text = read_text(path);
    char* line = text;
    for (int k = 0; (line = strstr(line, "greedy: ")) != NULL; k++, line++) {
        if (k == index) {
            line += strlen("greedy: ");
            char* result = strndup(line, strcspn(line, "\n"));
            free(text);
            return result;
        }
    }
    free(text);
    return NULL;
}

static void test_generate_ids_match_golden(void** state) {
    (void)state;
    char model_path[512], arguments[1024];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    for (int k = 0; k < 2; k++) {
        snprintf(arguments, sizeof arguments, "generate --model %s --ids -n 200%s", model_path,
                 k == 1 ? " --prompt-ids \"300 400 100\"" : "");
        command_result r = run_servelab(arguments);
        assert_int_equal(r.exit_status, 0);
        char* expected = golden_line(k);
        assert_non_null(expected);
        size_t length = strcspn(r.out, "\n");
        if (length != strlen(expected) || strncmp(r.out, expected, length) != 0)
            fail_msg("case %d:\nours     %.*s\nllama2.c %s", k, (int)length, r.out, expected);
        assert_non_null(strstr(r.err, "weight bytes read per token"));
        free(expected);
        free_result(&r);
    }
}

static void test_generate_text_matches_golden(void** state) {
    (void)state;
    char model_path[512], tok_path[512], golden_path[512], arguments[2048];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    REQUIRE_SHARED_MODEL(tok_path, "tok512.bin");
    REQUIRE_SHARED_MODEL(golden_path, "stories260K.golden-text");
    snprintf(arguments, sizeof arguments,
             "generate --model %s --tokenizer %s --prompt \"Once upon a time\" -n 200 --temperature 0", model_path,
             tok_path);
    command_result r = run_servelab(arguments);
    assert_int_equal(r.exit_status, 0);
    char* golden = read_text(golden_path);
    const char* marker = "=== prompt: Once upon a time\n";
    char* start = strstr(golden, marker) + strlen(marker);
    size_t length = strstr(start, "\n===") - start;
    if (strncmp(r.out, start, length) != 0) fail_msg("ours:\n%s\nllama2.c:\n%.*s", r.out, (int)length, start);
    free(golden);
    free_result(&r);
}

static void test_generate_without_arguments_prints_text(void** state) {
    (void)state;
    command_result r = run_servelab("generate -n 40");
    assert_int_equal(r.exit_status, 0);
    assert_true(strlen(r.out) > 20);
    assert_non_null(strstr(r.err, "servelab: "));
    char path[512];
    if (shared_model_path(path, sizeof path, "stories260K.bin")) // the default when ../shared is there
        assert_non_null(strstr(r.err, "stories260K.bin"));
    free_result(&r);
}

static void test_synthetic_preset_generates(void** state) {
    (void)state;
    command_result r = run_servelab("generate --model tiny --prompt \"Hello\" -n 16 --seed 3");
    assert_int_equal(r.exit_status, 0);
    assert_true(strncmp(r.out, "Hello", 5) == 0);
    assert_non_null(strstr(r.err, "tiny (fp16"));
    command_result again = run_servelab("generate --model tiny --prompt \"Hello\" -n 16 --seed 3");
    assert_string_equal(r.out, again.out); // same seeds, same text
    free_result(&again);
    free_result(&r);
}

static void test_truncated_checkpoint_fails_cleanly(void** state) {
    (void)state;
    char model_path[512], truncated[512], arguments[1024];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    size_t size;
    unsigned char* bytes = test_read_file(model_path, &size);
    snprintf(truncated, sizeof truncated, "%s/stories.bin", test_scratch_dir());
    assert_true(test_write_file(truncated, bytes, 1000));
    free(bytes);
    snprintf(arguments, sizeof arguments, "generate --model %s", truncated);
    command_result r = run_servelab(arguments);
    assert_true(r.exit_status == 1 || r.exit_status == 2);
    assert_int_equal(count_lines(r.err), 1);
    assert_non_null(strstr(r.err, "stories.bin: truncated: expected 1056540 bytes, found 1000"));
    assert_string_equal(r.out, "");
    free_result(&r);
}

static void test_bad_flags_fail_with_usage_status(void** state) {
    (void)state;
    struct {
        const char* arguments;
        const char* expected;
    } cases[] = {
        {"generate --frobnicate", "unknown option '--frobnicate'"},
        {"generate -n 12x", "-n: expected a whole number"},
        {"generate -n -5", "-n: expected a whole number"},
        {"generate --temperature hot", "--temperature: expected a number"},
        {"generate --top-p 2", "--top-p: expected a number from 0 to 1"},
        {"generate --dtype fp8", "--dtype: expected fp32 or fp16, found 'fp8'"},
        {"generate --model", "--model needs a value"},
        {"generate --model tiny --prompt-ids \"1 2 99999\"", "id 99999 is outside the vocabulary 0..258"},
        {"generate --model tiny --prompt-ids \"12 abc\"", "expected space-separated token ids"},
        {"frobnicate", "unknown command 'frobnicate'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        command_result r = run_servelab(cases[i].arguments);
        if (r.exit_status != 2) fail_msg("'%s' exited %d, expected 2 (stderr: %s)", cases[i].arguments, r.exit_status, r.err);
        if (!strstr(r.err, cases[i].expected)) fail_msg("'%s': stderr '%s' lacks '%s'", cases[i].arguments, r.err, cases[i].expected);
        assert_int_equal(count_lines(r.err), 1);
        free_result(&r);
    }
    command_result missing = run_servelab("generate --model no/such/file.bin");
    assert_int_equal(missing.exit_status, 1);
    assert_non_null(strstr(missing.err, "no/such/file.bin: cannot open"));
    free_result(&missing);
}

static void test_help_and_info(void** state) {
    (void)state;
    command_result r = run_servelab("--help");
    assert_int_equal(r.exit_status, 0);
    assert_non_null(strstr(r.out, "generate"));
    free_result(&r);
    r = run_servelab("generate --help");
    assert_int_equal(r.exit_status, 0);
    assert_non_null(strstr(r.out, "--prompt-ids"));
    free_result(&r);
    r = run_servelab("info");
    assert_int_equal(r.exit_status, 0);
    assert_non_null(strstr(r.out, "cuda:"));
    assert_non_null(strstr(r.out, "medium"));
    free_result(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_ids_match_golden),
        cmocka_unit_test(test_generate_text_matches_golden),
        cmocka_unit_test(test_generate_without_arguments_prints_text),
        cmocka_unit_test(test_synthetic_preset_generates),
        cmocka_unit_test(test_truncated_checkpoint_fails_cleanly),
        cmocka_unit_test(test_bad_flags_fail_with_usage_status),
        cmocka_unit_test(test_help_and_info),
    };
    return cmocka_run_group_tests_name("lab/cli", tests, NULL, NULL);
}
