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

#include "tests/test_support.h"

static int count_lines(const char* text) {
    int n = 0;
    for (; *text; text++) n += *text == '\n';
    return n;
}

// The greedy line of golden case `index` (0-based), without "greedy: ".
static char* golden_line(int index) {
    char path[512];
    if (!shared_model_path(path, sizeof path, "stories260K.golden")) return NULL;
    char* text = test_read_text(path);
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
    char* golden = test_read_text(golden_path);
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
    assert_non_null(strstr(r.err, "synthetic (random weights, shapes of tiny) (fp16"));
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
    assert_non_null(strstr(missing.err, "no/such/file.bin: no such file; leave out --model for the default model"));
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

// Every subcommand answers --help and -h the same way (lab/cmd/cli.h): its
// usage on stdout, exit 0, even after a flag it does not know; and names
// itself and its --help when a flag is unknown.
static void test_every_command_shares_help_and_unknown_option(void** state) {
    (void)state;
    static const char* const COMMANDS[] = {"lab", "generate", "sim", "serve", "bench-serve", "quant",
                                           "quiz", "synth", "bench", "calc", "tokenize"};
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++) {
        const char* usage = "usage: servelab ";
        char arguments[128], expected[160];
        snprintf(arguments, sizeof arguments, "%s --no-such-flag", COMMANDS[i]);
        command_result r = run_servelab(arguments);
        snprintf(expected, sizeof expected, "unknown option '--no-such-flag' (see servelab %s --help)", COMMANDS[i]);
        if (strcmp(COMMANDS[i], "synth") == 0) // synth's one argument is a preset: any other is unexpected
            snprintf(expected, sizeof expected, "unexpected argument '--no-such-flag' (see servelab synth --help)");
        if (r.exit_status != 2 || !strstr(r.err, expected))
            fail_msg("'%s': exit %d, stderr '%s', expected 2 and '%s'", arguments, r.exit_status, r.err, expected);
        free_result(&r);
        snprintf(arguments, sizeof arguments, "%s --no-such-flag -h", COMMANDS[i]);
        r = run_servelab(arguments);
        if (strcmp(COMMANDS[i], "calc") == 0 || strcmp(COMMANDS[i], "tokenize") == 0) {
            // These two read -h in order: the unknown flag before it is the answer.
            assert_int_equal(r.exit_status, 2);
        } else if (r.exit_status != 0 || strncmp(r.out, usage, strlen(usage)) != 0 || r.err[0]) {
            fail_msg("'%s': exit %d, stdout '%.60s', stderr '%s': expected the usage", arguments, r.exit_status, r.out,
                     r.err);
        }
        free_result(&r);
    }
    // A subcommand's subcommand points at the help that covers it.
    command_result r = run_servelab("lesson run --no-such-flag");
    assert_int_equal(r.exit_status, 2);
    assert_non_null(strstr(r.err, "servelab lesson run: unknown option '--no-such-flag' (see servelab lesson --help)"));
    free_result(&r);
}

// ---- sim and trace ------------------------------------------------------------

// The value of "key": in the object that follows "run": in a JSON text.
static double json_field(const char* json, const char* run, const char* key) {
    char pattern[128];
    snprintf(pattern, sizeof pattern, "\"%s\":{", run);
    const char* object = strstr(json, pattern);
    if (!object) fail_msg("no run '%s' in %s", run, json);
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char* field = strstr(object, pattern);
    if (!field) fail_msg("no key '%s' in run '%s'", key, run);
    return strtod(field + strlen(pattern), NULL);
}

static void test_sim_json_reports_both_layouts(void** state) {
    (void)state;
    char model_path[512], arguments[1024];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    snprintf(arguments, sizeof arguments,
             "sim --model %s --requests 12 --prompt-len uniform:8:40 --output-len fixed:12 --kv-mem 512KiB "
             "--reserve request --shared-prefix 16 --json",
             model_path);
    command_result r = run_servelab(arguments);
    if (r.exit_status != 0) fail_msg("sim failed: %s", r.err);
    const char* keys[] = {"completed", "throughput_tok_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "peak_running",
                          "kv_util_pct", "kv_waste_pct", "preemptions", "prefix_hit_tokens"};
    for (int run = 0; run < 2; run++)
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            (void)json_field(r.out, run == 0 ? "paged" : "contiguous", keys[k]);
    assert_int_equal((int)json_field(r.out, "paged", "completed"), 12);
    assert_int_equal((int)json_field(r.out, "contiguous", "completed"), 12);
    // Every request generated exactly its 12 tokens.
    assert_int_equal((int)json_field(r.out, "paged", "generated_tokens"), 12 * 12);
    assert_true(json_field(r.out, "paged", "throughput_tok_s") > 0);
    // The shared 16-token prefix is one block: later requests reuse it.
    assert_true(json_field(r.out, "paged", "prefix_hit_tokens") >= 16);
    assert_int_equal((int)json_field(r.out, "contiguous", "prefix_hit_tokens"), 0);
    double waste = json_field(r.out, "paged", "kv_waste_pct");
    assert_true(waste >= 0 && waste < 100);
    free_result(&r);
}

static void test_trace_writes_one_json_object_per_step(void** state) {
    (void)state;
    char model_path[512], trace_path[512], arguments[2048];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    snprintf(trace_path, sizeof trace_path, "%s/trace.jsonl", test_scratch_dir());
    snprintf(arguments, sizeof arguments, "generate --model %s --prompt-ids \"300 400 100\" -n 20 --trace %s --ids",
             model_path, trace_path);
    command_result r = run_servelab(arguments);
    assert_int_equal(r.exit_status, 0);
    char* trace = test_read_text(trace_path);
    // One prefill step then 19 decode steps (the 20th token needs no forward pass).
    assert_int_equal(count_lines(trace), 20);
    assert_true(strncmp(trace, "{\"step\":1,", 10) == 0);
    assert_non_null(strstr(trace, "\"prefill_tokens\":4,"));
    for (const char* line = trace; *line; line = strchr(line, '\n') + 1) {
        assert_true(line[0] == '{');
        const char* end = strchr(line, '\n');
        assert_true(end[-1] == '}');
        assert_non_null(strstr(line, "\"weight_bytes\":"));
        assert_non_null(strstr(line, "\"blocks\":["));
    }
    free(trace);
    free_result(&r);
}

static void test_sim_bad_input(void** state) {
    (void)state;
    struct {
        const char* arguments;
        const char* expected;
        int status;
    } cases[] = {
        {"sim --model tiny --prompt-len normal:5", "--prompt-len: expected fixed:N", 2},
        {"sim --model tiny --output-len uniform:9:3", "--output-len: expected", 2},
        {"sim --model tiny --kv sideways", "--kv: expected paged, contiguous or both", 2},
        {"sim --model tiny --kv-mem lots", "--kv-mem: expected a size", 2},
        {"sim --model tiny --block-size 300", "--block-size: expected a whole number from 1 to 256", 2},
        {"sim --model tiny --workload build/no/such.jsonl", "no/such.jsonl: cannot open", 2},
        {"sim --model tiny --requests 0", "--requests: expected a whole number from 1", 2},
        {"sim --model tiny --kv contiguous --kv-mem 32KiB --requests 2", "could never run", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        command_result r = run_servelab(cases[i].arguments);
        if (r.exit_status != cases[i].status)
            fail_msg("'%s' exited %d, expected %d (stderr: %s)", cases[i].arguments, r.exit_status, cases[i].status, r.err);
        if (!strstr(r.err, cases[i].expected)) fail_msg("'%s': stderr '%s' lacks '%s'", cases[i].arguments, r.err, cases[i].expected);
        free_result(&r);
    }
    // A workload file with a broken line names the line.
    char path[512], arguments[1024];
    snprintf(path, sizeof path, "%s/bad.jsonl", test_scratch_dir());
    const char* text = "{\"prompt_ids\": [1, 40, 50], \"max_tokens\": 4}\n{\"prompt_ids\": [1, 2, \"x\"], \"max_tokens\": 4}\n";
    assert_true(test_write_file(path, text, strlen(text)));
    snprintf(arguments, sizeof arguments, "sim --model tiny --workload %s", path);
    command_result r = run_servelab(arguments);
    assert_int_equal(r.exit_status, 2);
    assert_non_null(strstr(r.err, "bad.jsonl:2: expected a number"));
    free_result(&r);
    // ... and a good one runs.
    text = "{\"prompt_ids\": [1, 40, 50], \"max_tokens\": 4, \"arrival\": 0.01}\n{\"prompt\": \"hi\", \"max_tokens\": 3}\n";
    assert_true(test_write_file(path, text, strlen(text)));
    snprintf(arguments, sizeof arguments, "sim --model tiny --workload %s --kv paged --json", path);
    r = run_servelab(arguments);
    assert_int_equal(r.exit_status, 0);
    assert_int_equal((int)json_field(r.out, "paged", "generated_tokens"), 7);
    free_result(&r);
}

// ---- quant ---------------------------------------------------------------------------

static void test_quant_json_reports_every_layer(void** state) {
    (void)state;
    char model_path[512], arguments[1024];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    snprintf(arguments, sizeof arguments, "quant --model %s --scheme w4a16 --group 32 --method awq --json", model_path);
    command_result r = run_servelab(arguments);
    if (r.exit_status != 0) fail_msg("quant failed: %s", r.err);
    const char* keys[] = {"\"weight_bytes\":", "\"weight_bytes_ref\":", "\"kl_mean\":", "\"top1_agreement\":",
                          "\"ppl\":", "\"ppl_ref\":", "\"layers\":[", "\"name\":\"layers.4.w3\"", "\"scale_mean\":",
                          "\"mse\":", "\"max_err\":", "\"clipped\":"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        if (!strstr(r.out, keys[k])) fail_msg("quant --json lacks %s: %s", keys[k], r.out);
    double bytes = strtod(strstr(r.out, "\"weight_bytes\":") + 15, NULL);
    double bytes_ref = strtod(strstr(r.out, "\"weight_bytes_ref\":") + 19, NULL);
    assert_true(bytes_ref == 1040128.0);
    assert_true(bytes < bytes_ref / 5);
    double top1 = strtod(strstr(r.out, "\"top1_agreement\":") + 17, NULL);
    assert_true(top1 > 0.5 && top1 <= 1.0);
    free_result(&r);
}

static void test_quant_tensor_prints_levels(void** state) {
    (void)state;
    command_result r = run_servelab("quant --model tiny --tensor layers.1.wq --bits 3 --granularity tensor --asym");
    if (r.exit_status != 0) fail_msg("quant --tensor failed: %s", r.err);
    assert_non_null(strstr(r.out, "layers.1.wq: (64, 64), 3-bit asymmetric, per tensor, 1 parameter sets"));
    assert_non_null(strstr(r.out, "every in-range error <= s/2: yes"));
    assert_non_null(strstr(r.out, "histogram"));
    // 2^3 = 8 levels are marked in the histogram ('|' after the bin start).
    int marked = 0;
    for (const char* p = strstr(r.out, "histogram"); (p = strchr(p, '\n')) != NULL; p++)
        if (p[1] != '\0' && strlen(p) > 14 && p[13] == '|') marked++;
    assert_true(marked >= 6 && marked <= 8); // neighbouring levels may share a bin
    free_result(&r);
    struct {
        const char* arguments;
        const char* expected;
    } cases[] = {
        {"quant --model tiny --tensor layers.9.wq --bits 4", "no tensor 'layers.9.wq'"},
        {"quant --model tiny --tensor layers.0.wq --bits 9", "--bits: expected a whole number from 2 to 8"},
        {"quant --model tiny --tensor layers.0.wq --bits 4 --granularity group:7", "group"},
        {"quant --model tiny --scheme w5a16", "expected w8a16, w4a16 or w8a8"},
        {"quant --model tiny --scheme w8a8 --asym", "symmetric"},
        {"quant --model tiny", "give --scheme"},
        {"generate --model tiny --quant w4a16:gx", "group 'gx'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        command_result bad = run_servelab(cases[i].arguments);
        if (bad.exit_status != 1 && bad.exit_status != 2)
            fail_msg("'%s' exited %d (stderr: %s)", cases[i].arguments, bad.exit_status, bad.err);
        if (!strstr(bad.err, cases[i].expected)) fail_msg("'%s': stderr '%s' lacks '%s'", cases[i].arguments, bad.err, cases[i].expected);
        free_result(&bad);
    }
}

static void test_engine_paths_run_quantized(void** state) {
    (void)state;
    command_result r = run_servelab("generate --model tiny --quant w4a16:g32:gptq --prompt Hi -n 8 --seed 1 --temperature 0.7");
    if (r.exit_status != 0) fail_msg("generate --quant failed: %s", r.err);
    assert_non_null(strstr(r.err, "synthetic (random weights, shapes of tiny) (int4"));
    free_result(&r);
    r = run_servelab("sim --model tiny --quant w8a8 --requests 4 --prompt-len fixed:8 --output-len fixed:4 --kv paged "
                     "--kv-dtype int8 --json");
    if (r.exit_status != 0) fail_msg("sim --quant failed: %s", r.err);
    assert_int_equal((int)json_field(r.out, "paged", "generated_tokens"), 16);
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
        cmocka_unit_test(test_every_command_shares_help_and_unknown_option),
        cmocka_unit_test(test_sim_json_reports_both_layouts),
        cmocka_unit_test(test_trace_writes_one_json_object_per_step),
        cmocka_unit_test(test_sim_bad_input),
        cmocka_unit_test(test_quant_json_reports_every_layer),
        cmocka_unit_test(test_quant_tensor_prints_levels),
        cmocka_unit_test(test_engine_paths_run_quantized),
    };
    return cmocka_run_group_tests_name("lab/cli", tests, NULL, NULL);
}
