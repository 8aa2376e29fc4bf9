// A newcomer's first hour (issue 29), as a user meets it: long commands
// show a progress line on a terminal (here forced with --progress, since
// the tests' stderr is a file) and nothing when not asked; the default sim
// is the short run; random weights say so; info names the kernels this CPU
// runs; help states the defaults the code uses; lesson list works from any
// folder; a mistyped command gets a suggestion; counts agree in number.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "kernels/cpu/cpu_features.h"
#include "lab/quiz/drills.h"
#include "lab/quiz/models.h"
#include "tests/test_support.h"

// The line of `text` that starts with `prefix` (up to its newline), or "".
static void line_starting(const char* text, const char* prefix, char* out, size_t capacity) {
    out[0] = '\0';
    for (const char* line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (strncmp(line, prefix, strlen(prefix)) == 0) {
            snprintf(out, capacity, "%.*s", (int)strcspn(line, "\n"), line);
            return;
        }
}

// The integer after "\"key\":" in the object that follows "\"run\":{".
static long json_integer(const char* json, const char* run, const char* key) {
    char pattern[128];
    snprintf(pattern, sizeof pattern, "\"%s\":{", run);
    const char* object = strstr(json, pattern);
    if (!object) fail_msg("no run '%s' in %s", run, json);
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char* field = strstr(object, pattern);
    if (!field) fail_msg("no key '%s' in run '%s'", key, run);
    return strtol(field + strlen(pattern), NULL, 10);
}

// ---- progress ------------------------------------------------------------------------

// A forced progress line is on stderr, rewritten with \r, names the command
// and counts `unit`, ending at `final_count` ("16/16 requests finished").
static void assert_progress_line(const command_result* r, const char* command, const char* final_count) {
    char start[64];
    snprintf(start, sizeof start, "\rservelab %s: ", command);
    if (!strstr(r->err, start)) fail_msg("no progress line '%s' on stderr: %s", start + 1, r->err);
    if (!strstr(r->err, final_count)) fail_msg("the progress line never reached '%s': %s", final_count, r->err);
    assert_null(strchr(r->out, '\r')); // stdout stays clean
}

static void test_sim_progress_only_when_asked(void** state) {
    (void)state;
    const char* run = "sim --model tiny --requests 6 --prompt-len fixed:8 --output-len fixed:4 --json";
    char arguments[256];
    snprintf(arguments, sizeof arguments, "%s --progress", run);
    command_result r = run_servelab(arguments);
    if (r.exit_status != 0) fail_msg("%s: %s", arguments, r.err);
    assert_progress_line(&r, "sim", "6/6 requests finished");
    assert_non_null(strstr(r.err, "contiguous (run 2 of 2)")); // the last run; tiny may finish the first between ticks
    assert_true(r.out[0] == '{'); // --json: stdout is the JSON alone
    assert_int_equal(json_integer(r.out, "paged", "completed"), 6);
    free_result(&r);
    // stderr is a file, not a terminal: no progress line at all.
    r = run_servelab(run);
    assert_int_equal(r.exit_status, 0);
    assert_null(strchr(r.err, '\r'));
    assert_null(strstr(r.err, "requests finished"));
    free_result(&r);
}

static void test_bench_quant_lesson_progress(void** state) {
    (void)state;
    command_result r = run_servelab("bench --quick --model tiny --json --progress");
    if (r.exit_status != 0) fail_msg("bench: %s", r.err);
    assert_progress_line(&r, "bench", "35/35 parts");
    assert_null(strstr(r.err, "bench: decode")); // on the line, not a line each
    free_result(&r);

    r = run_servelab("quant --model tiny --scheme w4a16 --group 32 --method awq --json --progress");
    if (r.exit_status != 0) fail_msg("quant: %s", r.err);
    assert_progress_line(&r, "quant", "5/5 parts");
    free_result(&r);
    r = run_servelab("quant --model tiny --scheme w4a16 --group 32 --method awq --json");
    assert_int_equal(r.exit_status, 0);
    assert_null(strchr(r.err, '\r'));
    free_result(&r);

    command_result with = run_servelab("lesson run lessons/01-kv-sizing.lua --headless --full --progress");
    command_result without = run_servelab("lesson run lessons/01-kv-sizing.lua --headless --full");
    if (with.exit_status != 0) fail_msg("lesson --full: %s%s", with.out, with.err);
    assert_progress_line(&with, "lesson", "6/6 checks");
    assert_string_equal(with.out, without.out); // the check lines and summary are untouched
    assert_null(strchr(without.err, '\r'));
    free_result(&with);
    free_result(&without);
}

// ---- the default sim --------------------------------------------------------------------

// The default teaches paged KV in seconds (93 s before, at what is now
// --full): 16 requests, all running at once when paged, 4 when contiguous.
static void test_default_sim_is_the_short_run(void** state) {
    (void)state;
    command_result r = run_servelab("sim --json");
    if (r.exit_status != 0) fail_msg("sim: %s", r.err);
    assert_int_equal(json_integer(r.out, "paged", "requests"), 16);
    assert_int_equal(json_integer(r.out, "paged", "completed"), 16);
    assert_int_equal(json_integer(r.out, "contiguous", "completed"), 16);
    assert_int_equal(json_integer(r.out, "paged", "peak_running"), 16);
    assert_int_equal(json_integer(r.out, "contiguous", "peak_running"), 4);
    free_result(&r);
    r = run_servelab("sim --help");
    assert_int_equal(r.exit_status, 0);
    assert_non_null(strstr(r.out, "The default run takes seconds"));
    assert_non_null(strstr(r.out, "  --full "));
    assert_non_null(strstr(r.out, "(default 16; --full 64)"));
    free_result(&r);
}

// ---- labels and info --------------------------------------------------------------------

static void test_random_weights_say_so(void** state) {
    (void)state;
    command_result r = run_servelab("generate --model tiny -n 2 --ids");
    assert_int_equal(r.exit_status, 0);
    assert_non_null(strstr(r.err, "servelab: synthetic (random weights, shapes of tiny) ("));
    free_result(&r);
    // servelab synth output: a preset's shape with the byte-level vocabulary.
    char path[512], arguments[1024];
    snprintf(path, sizeof path, "%s/newcomer-tiny.bin", test_scratch_dir());
    snprintf(arguments, sizeof arguments, "synth tiny --out %s", path);
    r = run_servelab(arguments);
    assert_int_equal(r.exit_status, 0);
    free_result(&r);
    snprintf(arguments, sizeof arguments, "generate --model %s -n 2 --ids", path);
    r = run_servelab(arguments);
    assert_int_equal(r.exit_status, 0);
    char expected[700];
    snprintf(expected, sizeof expected, "%s, synthetic (random weights, shapes of tiny)", path);
    if (!strstr(r.err, expected)) fail_msg("'%s' lacks '%s'", r.err, expected);
    free_result(&r);
    // A trained checkpoint is not called synthetic.
    char model[512];
    if (shared_model_path(model, sizeof model, "stories260K.bin")) {
        snprintf(arguments, sizeof arguments, "generate --model %s -n 2 --ids", model);
        r = run_servelab(arguments);
        assert_int_equal(r.exit_status, 0);
        assert_null(strstr(r.err, "synthetic"));
        free_result(&r);
    }
    r = run_servelab("info");
    assert_non_null(strstr(r.out, "synthetic presets (random weights"));
    free_result(&r);
}

static void test_info_names_what_this_cpu_runs(void** state) {
    (void)state;
    command_result r = run_servelab("info");
    assert_int_equal(r.exit_status, 0);
    char expected[96];
    snprintf(expected, sizeof expected, "backends: cpu, %s kernels", cpu_simd_level_name(cpu_simd_level_selected()));
    if (!strstr(r.out, expected)) fail_msg("'%s' lacks '%s'", r.out, expected);
    assert_null(strstr(r.out, "scalar fp32 math")); // the line from before the SIMD kernels
    assert_non_null(strstr(r.out, "int8"));
    assert_non_null(strstr(r.out, "int4"));
    assert_non_null(strstr(r.out, "KV cache: fp16, fp32, int8"));
    free_result(&r);
}

// ---- help states the real defaults ------------------------------------------------------

static void test_help_states_the_defaults_used(void** state) {
    (void)state;
    char line[512];
    command_result r = run_servelab("generate --help");
    assert_int_equal(r.exit_status, 0);
    line_starting(r.out, "  --kv-dtype", line, sizeof line);
    if (!strstr(line, "default fp32")) fail_msg("generate --help: '%s' should say default fp32", line);
    assert_null(strstr(r.out, "default fp16"));
    line_starting(r.out, "  --max-seqs", line, sizeof line);
    if (!strstr(line, "default 1)")) fail_msg("generate --help: '%s' should say default 1", line);
    line_starting(r.out, "  --kv-mem", line, sizeof line);
    assert_null(strstr(line, "default 64MiB"));
    free_result(&r);
    r = run_servelab("sim --help");
    assert_int_equal(r.exit_status, 0);
    line_starting(r.out, "  --kv paged", line, sizeof line);
    if (!strstr(line, "default both")) fail_msg("sim --help: '%s' should say default both", line);
    assert_null(strstr(r.out, "(default paged)"));
    line_starting(r.out, "  --kv-dtype", line, sizeof line);
    assert_non_null(strstr(line, "default fp16"));
    free_result(&r);
}

// ---- lesson list from another folder ----------------------------------------------------

static void test_lesson_list_from_another_folder(void** state) {
    (void)state;
    char binary[PATH_MAX], folder[PATH_MAX];
    if (!realpath(test_servelab_binary(), binary)) fail_msg("cannot resolve %s", test_servelab_binary());
    if (!realpath(test_scratch_dir(), folder)) fail_msg("cannot resolve %s", test_scratch_dir());
    char out_path[PATH_MAX + 32], command[4 * PATH_MAX];
    snprintf(out_path, sizeof out_path, "%s/lesson-list.out", folder);
    // The scratch folder has no lessons/ of its own.
    snprintf(command, sizeof command, "cd %s && %s lesson list >%s 2>&1 </dev/null", folder, binary, out_path);
    int raw = system(command);
    char* out = test_read_text(out_path);
    if (raw == -1 || !WIFEXITED(raw) || WEXITSTATUS(raw) != 0) fail_msg("lesson list outside the root: %s", out);
    assert_non_null(strstr(out, "01-kv-sizing.lua"));
    assert_non_null(strstr(out, "claims:"));
    free(out);
}

// ---- a mistyped command -----------------------------------------------------------------

static void test_unknown_command_suggests_the_nearest(void** state) {
    (void)state;
    static const struct {
        const char* typed;
        const char* suggestion; // NULL: nothing is near
    } cases[] = {
        {"generat", "did you mean 'generate'?"}, {"smi", "did you mean 'sim'?"},
        {"lesosn", "did you mean 'lesson'?"},    {"gen", "did you mean 'generate'?"},
        {"frobnicate", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        command_result r = run_servelab(cases[i].typed);
        assert_int_equal(r.exit_status, 2);
        assert_non_null(strstr(r.err, "unknown command"));
        if (cases[i].suggestion && !strstr(r.err, cases[i].suggestion))
            fail_msg("'%s': '%s' lacks '%s'", cases[i].typed, r.err, cases[i].suggestion);
        if (!cases[i].suggestion && strstr(r.err, "did you mean"))
            fail_msg("'%s': nothing is near, yet: %s", cases[i].typed, r.err);
        free_result(&r);
    }
}

// ---- counts agree in number -------------------------------------------------------------

// "= 1 sequences." and "1 empty slots" were printed by the drills whenever
// the draw came to one. 4000 draws of each reach a count of 1 many times.
static void test_drill_counts_agree_in_number(void** state) {
    (void)state;
    quiz_model_list models;
    error_info err = {{0}};
    if (quiz_models_load("quiz/models.lua", &models, &err)) fail_msg("%s", err.message);
    static const quiz_drill_kind KINDS[] = {QUIZ_DRILL_SEQUENCES_FIT, QUIZ_DRILL_TAIL_WASTE, QUIZ_DRILL_BLOCKS_NEEDED};
    int ones = 0;
    for (size_t k = 0; k < sizeof KINDS / sizeof KINDS[0]; k++) {
        quiz_rng rng;
        quiz_rng_seed(&rng, 29);
        for (int draw = 0; draw < 4000; draw++) {
            quiz_drill d;
            if (quiz_drill_generate(KINDS[k], &models, &rng, &d, &err)) fail_msg("%s", err.message);
            if (strstr(d.explanation, " 1 sequences") || strstr(d.explanation, " 1 empty slots") ||
                strstr(d.explanation, " 1 blocks"))
                fail_msg("a count of 1 with a plural noun: %s", d.explanation);
            ones += strstr(d.explanation, "= 1 sequence.") || strstr(d.explanation, " 1 empty slot (");
        }
    }
    quiz_models_free(&models);
    assert_true(ones > 0); // the draws did reach the singular
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_progress_only_when_asked),
        cmocka_unit_test(test_bench_quant_lesson_progress),
        cmocka_unit_test(test_default_sim_is_the_short_run),
        cmocka_unit_test(test_random_weights_say_so),
        cmocka_unit_test(test_info_names_what_this_cpu_runs),
        cmocka_unit_test(test_help_states_the_defaults_used),
        cmocka_unit_test(test_lesson_list_from_another_folder),
        cmocka_unit_test(test_unknown_command_suggests_the_nearest),
        cmocka_unit_test(test_drill_counts_agree_in_number),
    };
    return cmocka_run_group_tests_name("lab/cli_newcomer", tests, NULL, NULL);
}
