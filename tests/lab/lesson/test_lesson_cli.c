// servelab lesson as a user runs it: every lesson in lessons/ passes
// headless, together they check every claim of the question bank (why6
// waits for the tensor-parallel mode), and list/check/new/run behave.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lab/lesson/lesson.h"
#include "tests/test_support.h"

// Sanitizers slow the kernels unevenly, so timing verdicts there may
// honestly come out the other way: under them a DISAGREE is allowed (the
// run still has to finish without FAIL, leak or crash).
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_SANITIZER 1
#else
#define UNDER_SANITIZER 0
#endif

// Runs `servelab ARGUMENTS` with stdout and stderr in one file; returns the
// exit status (-1 when killed) and the output in *output (malloc'ed).
static int servelab(const char* arguments, char** output) {
    const char* bin = getenv("SERVELAB_BIN") ? getenv("SERVELAB_BIN") : "bin/servelab";
    char path[512], command[2048];
    snprintf(path, sizeof path, "%s/lesson-cli.out", test_scratch_dir());
    snprintf(command, sizeof command, "%s %s >%s 2>&1 </dev/null", bin, arguments, path);
    int raw = system(command);
    *output = test_read_text(path);
    return raw != -1 && WIFEXITED(raw) && WEXITSTATUS(raw) < 128 ? WEXITSTATUS(raw) : -1;
}

// The clean headless run of lessons/NAME (`lesson run --headless
// --time-limit S`): made once per `make test` by scripts/clean-lessons.sh
// into SERVELAB_CLEAN_LESSONS (NAME.out, NAME.status) and read from there;
// run here when that is not set or lacks this lesson.
static int clean_lesson_run(const char* name, const char* arguments, char** output) {
    const char* shared = getenv("SERVELAB_CLEAN_LESSONS");
    if (shared && shared[0]) {
        char out_path[700], status_path[700];
        snprintf(out_path, sizeof out_path, "%.300s/%.255s.out", shared, name);
        snprintf(status_path, sizeof status_path, "%.300s/%.255s.status", shared, name);
        char* status = test_read_text(status_path);
        *output = status ? test_read_text(out_path) : NULL;
        if (status && *output) {
            int value = atoi(status);
            free(status);
            printf("(the clean run of make test: %s)\n", out_path);
            return value < 128 ? value : -1;
        }
        free(status);
        free(*output);
        printf("(%s has no run of %s: running it)\n", shared, name);
    }
    return servelab(arguments, output);
}

static const char* const BANK_CLAIMS[] = {
    "tf1",  "tf2",  "tf3",  "tf4",  "tf5",  "tf6",  "tf7",  "tf8",  "tf9",  "tf10", "se1",  "se2",
    "se3",  "se4",  "se5",  "se6",  "se7",  "se8",  "why1", "why2", "why3", "why4", "why5", "edge1",
    "edge2", "edge3", "edge4", "edge5", "edge6", "edge7", "edge8", "recall1",
};

static void test_every_lesson_passes_and_covers_the_bank(void** state) {
    (void)state;
    static lesson_file_name names[LESSON_MAX_FILES];
    int n = lesson_list_folder("lessons", names, LESSON_MAX_FILES);
    assert_true(n >= 7);
    bool seen[sizeof BANK_CLAIMS / sizeof BANK_CLAIMS[0]] = {false};
    for (int i = 0; i < n; i++) {
        char path[400], arguments[600];
        snprintf(path, sizeof path, "lessons/%.255s", names[i]);
        lesson_info info;
        error_info err = {{0}};
        assert_int_equal(lesson_read_info(path, &info, &err), 0);
        snprintf(arguments, sizeof arguments, "lesson run %s --headless --time-limit %d", path, UNDER_SANITIZER ? 900 : 60);
        char* out = NULL;
        int status = clean_lesson_run(names[i], arguments, &out);
        // The whole output into the test log (print_message cuts a message
        // at cmocka's 4 KiB buffer, mid-line).
        fputs(out, stdout);
        fflush(stdout);
        // One line per declared claim, then the summary.
        // UNDECIDED (a timing the machine was too noisy to decide) is
        // neither a pass nor a failure: counted apart, and printed.
        int passes = 0, undecided = 0;
        for (const char* line = out; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : line + strlen(line)) {
            if (strncmp(line, "FAIL ", 5) == 0) fail_msg("%s: a check failed: %.300s", path, line);
            if (strncmp(line, "DISAGREE ", 9) == 0 && !UNDER_SANITIZER) fail_msg("%s: %.300s", path, line);
            bool is_undecided = strncmp(line, "UNDECIDED ", 10) == 0;
            if (strncmp(line, "PASS ", 5) != 0 && strncmp(line, "DISAGREE ", 9) != 0 && !is_undecided) continue;
            passes += line[0] == 'P';
            undecided += is_undecided;
            if (is_undecided) printf("(undecided on this machine, not a failure: %.200s)\n", line);
            char id[16] = "";
            sscanf(line + (line[0] == 'P' ? 5 : is_undecided ? 10 : 9), "%15s", id);
            for (size_t k = 0; k < sizeof BANK_CLAIMS / sizeof BANK_CLAIMS[0]; k++)
                if (strcmp(id, BANK_CLAIMS[k]) == 0) seen[k] = true;
            // The words after the claim say what the bank says of it.
            const lesson_bank_claim* bank = lesson_bank_claim_find(id);
            if (line[0] == 'P' && bank) {
                char words[64];
                snprintf(words, sizeof words,
                         "\": %s, as the bank says -- measured: ", bank->bank_answer ? "TRUE" : "FALSE");
                const char* end = strchr(line, '\n');
                const char* at = strstr(line, words);
                if (!at || (end && at > end)) fail_msg("%s: the line does not say '%s': %.300s", path, words, line);
            }
            // Evidence carries numbers.
            const char* evidence = strstr(line, " -- ");
            assert_non_null(evidence);
            assert_true(strcspn(evidence, "0123456789") < strcspn(evidence, "\n"));
        }
        char summary[128];
        if (undecided > 0)
            snprintf(summary, sizeof summary, "%d passed, %d failed, %d undecided (too noisy to decide: not failures)\n",
                     passes, info.n_claims - passes - undecided, undecided);
        else
            snprintf(summary, sizeof summary, "%d passed, %d failed\n", passes, info.n_claims - passes);
        size_t length = strlen(out), summary_length = strlen(summary);
        assert_true(length >= summary_length);
        assert_string_equal(out + length - summary_length, summary);
        if (!UNDER_SANITIZER) {
            assert_int_equal(status, 0);
            assert_int_equal(passes + undecided, info.n_claims);
        }
        free(out);
    }
    for (size_t k = 0; k < sizeof BANK_CLAIMS / sizeof BANK_CLAIMS[0]; k++)
        if (!seen[k]) fail_msg("no lesson checks claim %s", BANK_CLAIMS[k]);
}

static void test_list_shows_titles_and_claims(void** state) {
    (void)state;
    char* out = NULL;
    assert_int_equal(servelab("lesson list", &out), 0);
    assert_non_null(strstr(out, "01-kv-sizing.lua"));
    assert_non_null(strstr(out, "claims: tf3 se1 se2 edge8"));
    free(out);
    assert_int_equal(servelab("lesson list no/such/folder", &out), 1);
    assert_non_null(strstr(out, "no such folder"));
    free(out);
}

static void test_check_reports_syntax_errors_with_line(void** state) {
    (void)state;
    char path[512], arguments[700];
    snprintf(path, sizeof path, "%s/broken.lua", test_scratch_dir());
    const char* broken = "lab.lesson{title = 'broken', claims = {'b1'}}\n\nlocal x = (1 + \n";
    assert_true(test_write_file(path, broken, strlen(broken)));
    snprintf(arguments, sizeof arguments, "lesson check %s", path);
    char* out = NULL;
    assert_int_equal(servelab(arguments, &out), 1);
    char expected[600];
    snprintf(expected, sizeof expected, "%s:4:", path);
    if (!strstr(out, expected)) fail_msg("expected '%s' in: %s", expected, out);
    free(out);
    snprintf(arguments, sizeof arguments, "lesson run %s --headless", path);
    assert_int_equal(servelab(arguments, &out), 1);
    assert_non_null(strstr(out, expected));
    assert_non_null(strstr(out, "0 passed, 1 failed"));
    free(out);
    assert_int_equal(servelab("lesson check lessons/05-quantization-basics.lua", &out), 0);
    assert_non_null(strstr(out, "ok: \"Quantization basics"));
    free(out);
}

static void test_new_writes_a_skeleton_that_runs(void** state) {
    (void)state;
    char name[512], arguments[700];
    snprintf(name, sizeof name, "%s/my-lesson", test_scratch_dir());
    char path[600];
    snprintf(path, sizeof path, "%s.lua", name);
    remove(path);
    char* out = NULL;
    snprintf(arguments, sizeof arguments, "lesson new %s", name);
    assert_int_equal(servelab(arguments, &out), 0);
    free(out);
    snprintf(arguments, sizeof arguments, "lesson check %s", path);
    assert_int_equal(servelab(arguments, &out), 0);
    assert_non_null(strstr(out, "1 claims: mine1"));
    free(out);
    snprintf(arguments, sizeof arguments, "lesson run %s --headless", path);
    assert_int_equal(servelab(arguments, &out), 0);
    // mine1 is not a bank claim: the skeleton says what it expects
    // (bank_answer is refused for it), and the line says whose answer it is.
    if (!strstr(out, "PASS mine1 \"every decode step writes one token's keys and values\": TRUE, as the lesson expects "
                     "(a claim beyond the bank: the lesson's own) -- measured: "))
        fail_msg("%s", out);
    assert_non_null(strstr(out, "1 passed, 0 failed\n"));
    free(out);
    // Its check can fail: both faults it declares turn it (the skeleton
    // once declared none, so the matrix said it could not fail).
    snprintf(arguments, sizeof arguments, "lesson faults --matrix --output %s/skeleton-output %s", test_scratch_dir(),
             path);
    if (servelab(arguments, &out) != 0) fail_msg("%s", out);
    assert_non_null(strstr(out, "2 of 2 declared (claim, fault) pairs turned"));
    free(out);
    snprintf(arguments, sizeof arguments, "lesson new %s", name);
    assert_int_equal(servelab(arguments, &out), 1); // never overwritten
    assert_non_null(strstr(out, "already exists"));
    free(out);
}

// Issue 46 item 9: `lesson new` wrote NAME.lua.tmp<pid> with fopen("w"),
// through whatever link was there. The child's pid is known before it
// execs servelab, so links go at the temporary's old and new names first;
// the file they point to must keep its bytes.
static void test_new_never_writes_through_planted_links(void** state) {
    (void)state;
    char name[512], path[600], victim[600], old_temporary[700], temporary[700];
    snprintf(name, sizeof name, "%s/linked-lesson", test_scratch_dir());
    snprintf(path, sizeof path, "%s.lua", name);
    snprintf(victim, sizeof victim, "%s/lesson-victim", test_scratch_dir());
    assert_true(test_write_file(victim, "victim\n", 7));
    remove(path);
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        char byte;
        close(go[1]);
        if (read(go[0], &byte, 1) != 1) _exit(90);
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        const char* bin = getenv("SERVELAB_BIN") ? getenv("SERVELAB_BIN") : "bin/servelab";
        execl(bin, bin, "lesson", "new", name, (char*)NULL);
        _exit(91);
    }
    close(go[0]);
    snprintf(old_temporary, sizeof old_temporary, "%s.tmp%ld", path, (long)child);
    snprintf(temporary, sizeof temporary, "%s.tmp.%ld", path, (long)child);
    remove(old_temporary);
    remove(temporary);
    assert_int_equal(symlink(/* relative to the link's folder, which holds it */ "lesson-victim", old_temporary), 0);
    assert_int_equal(symlink("lesson-victim", temporary), 0);
    assert_int_equal(write(go[1], "x", 1), 1);
    close(go[1]);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    char* text = test_read_text(victim);
    assert_string_equal(text, "victim\n");
    free(text);
    text = test_read_text(path);
    assert_non_null(strstr(text, "mine1"));
    free(text);
    remove(old_temporary);
    remove(temporary);
    remove(path);
    // A dangling link at NAME.lua: "already exists", and nothing is created where it points.
    char missing[700];
    snprintf(missing, sizeof missing, "%s/lesson-nothing", test_scratch_dir());
    remove(missing);
    assert_int_equal(symlink("lesson-nothing", path), 0);
    char arguments[700];
    char* out = NULL;
    snprintf(arguments, sizeof arguments, "lesson new %s", name);
    assert_int_equal(servelab(arguments, &out), 1);
    assert_non_null(strstr(out, "already exists"));
    free(out);
    assert_int_not_equal(access(missing, F_OK), 0);
    remove(path);
}

static void test_run_flags_and_failures(void** state) {
    (void)state;
    char* out = NULL;
    assert_int_equal(servelab("lesson", &out), 2);
    free(out);
    assert_int_equal(servelab("lesson dance", &out), 2);
    assert_non_null(strstr(out, "unknown subcommand"));
    free(out);
    assert_int_equal(servelab("lesson run", &out), 2);
    free(out);
    assert_int_equal(servelab("lesson run lessons/01-kv-sizing.lua --time-limit soon", &out), 2);
    assert_non_null(strstr(out, "--time-limit"));
    free(out);
    assert_int_equal(servelab("lesson run lessons/01-kv-sizing.lua --memory-limit 1KiB", &out), 2);
    free(out);
    assert_int_equal(servelab("lesson --help", &out), 0);
    assert_non_null(strstr(out, "PASS tf3 \"<claim>\": FALSE, as the bank says -- measured: <evidence>"));
    free(out);
    // --only reports one claim.
    assert_int_equal(servelab("lesson run lessons/03-prefix-sharing.lua --headless --only edge6", &out), 0);
    assert_null(strstr(out, "tf10"));
    assert_non_null(strstr(out, "PASS edge6 "));
    assert_non_null(strstr(out, "1 passed, 0 failed\n"));
    free(out);
    // A lesson that escapes the sandbox fails with its line; the process exits normally.
    char path[512], arguments[700];
    snprintf(path, sizeof path, "%s/escape.lua", test_scratch_dir());
    const char* escape = "lab.lesson{title = 'escape', claims = {'e1'}}\nos.execute('true')\n";
    assert_true(test_write_file(path, escape, strlen(escape)));
    snprintf(arguments, sizeof arguments, "lesson run %s --headless", path);
    assert_int_equal(servelab(arguments, &out), 1);
    assert_non_null(strstr(out, "escape.lua:2: os.execute is not available to lessons"));
    assert_non_null(strstr(out, "FAIL e1 "));
    free(out);
}

// Issue 44: a terminal run shows the lesson's title first, and a lesson
// that stops on a Lua error prints the error with its file and line (and
// the claims it never reached, with the bank's own sentence and answer).
static void test_run_shows_the_title_and_where_a_lesson_crashed(void** state) {
    (void)state;
    char path[512], arguments[700];
    snprintf(path, sizeof path, "%s/crashing.lua", test_scratch_dir());
    const char* crashing = "lab.lesson{title = 'A lesson that crashes', claims = {'tf3'}}\n"
                           "lab.say('before the crash')\n"
                           "local missing = nil\n"
                           "local value = missing.field\n";
    assert_true(test_write_file(path, crashing, strlen(crashing)));
    char* out = NULL;
    snprintf(arguments, sizeof arguments, "lesson run %s", path); // the terminal run (stdin is not a terminal)
    assert_int_equal(servelab(arguments, &out), 1);
    char title[700];
    snprintf(title, sizeof title, "== A lesson that crashes (%s) ==\nbefore the crash\n", path);
    if (strncmp(out, title, strlen(title)) != 0) fail_msg("no title first:\n%s", out);
    assert_non_null(strstr(out, "crashing.lua:4: attempt to index a nil value (local 'missing')"));
    assert_non_null(strstr(out,
                           "FAIL tf3 \"the KV cache grows quadratically with sequence length\": not judged, the check "
                           "itself failed (the bank says FALSE) -- never checked: "));
    free(out);
}

// Issue 44: a lesson declared tf10 with bank_answer = true (the bank says
// false), measured nothing, and printed a PASS. Now the check names the
// line and what the bank says.
static void test_bank_answer_must_be_the_banks(void** state) {
    (void)state;
    char path[512], arguments[700];
    snprintf(path, sizeof path, "%s/wrong-bank.lua", test_scratch_dir());
    const char* wrong = "lab.lesson{title = 'wrong bank answer', claims = {'tf10'}}\n"
                        "lab.check{id = 'tf10', claim = 'shared prompts share KV', bank_answer = true,\n"
                        "          verdict = true, evidence = '1 of 1'}\n";
    assert_true(test_write_file(path, wrong, strlen(wrong)));
    char* out = NULL;
    snprintf(arguments, sizeof arguments, "lesson run %s --headless", path);
    assert_int_equal(servelab(arguments, &out), 1);
    if (!strstr(out, "wrong-bank.lua:2: bad argument #1 to 'check' (field 'bank_answer': the question bank says 'tf10' "
                     "is false (\"two requests sharing a system prompt must each store its KV\"), not true)"))
        fail_msg("%s", out);
    assert_null(strstr(out, "PASS "));
    assert_non_null(strstr(out, "0 passed, 1 failed\n"));
    free(out);
    // `lesson check` reads the literal answer without running the lesson;
    // the same call written in a comment or a string is not a check.
    const char* linted = "lab.lesson{title = 'wrong bank answer', claims = {'tf10', 'kv9', 'tf3'}}\n"
                         "-- lab.check{id = 'tf3', bank_answer = true}\n"
                         "local example = \"lab.check{id = 'tf3', bank_answer = true}\"\n"
                         "lab.check{id = 'tf10', claim = 'shared prompts share KV', bank_answer = true,\n"
                         "          verdict = true, evidence = '1 of 1'}\n"
                         "lab.check{id = 'kv9', claim = 'c', bank_answer = false, verdict = true, evidence = 'e'}\n"
                         "lab.check{id = 'tf3', claim = 'c', bank_answer = false, verdict = true, evidence = 'e'}\n";
    assert_true(test_write_file(path, linted, strlen(linted)));
    snprintf(arguments, sizeof arguments, "lesson check %s", path);
    assert_int_equal(servelab(arguments, &out), 1);
    if (!strstr(out, "wrong-bank.lua:4: lab.check{id = 'tf10'}: bank_answer = true, but the question bank says 'tf10' "
                     "is false") ||
        !strstr(out, "wrong-bank.lua:6: lab.check{id = 'kv9'}: bank_answer is for the question bank's claims") ||
        strstr(out, "'tf3'}: bank_answer") || strstr(out, ": ok:"))
        fail_msg("%s", out);
    free(out);
}

// The tutorial of lessons/README.md (its lua blocks, in order, up to "5. Run
// it") is a lesson that runs as the guide says: kv1 is not a bank claim, so
// it gives expected (bank_answer is refused for it), passes, and turns
// under both faults it declares.
static void test_tutorial_lesson_runs_as_written(void** state) {
    (void)state;
    char* guide = test_read_text("lessons/README.md");
    assert_non_null(guide);
    const char* start = strstr(guide, "## Tutorial");
    const char* end = start ? strstr(start, "**5. Run it.**") : NULL;
    if (!start || !end) fail_msg("lessons/README.md: no '## Tutorial' ... '**5. Run it.**' section");
    size_t capacity = (size_t)(end - start) + 1, used = 0;
    char* lesson_text = calloc(1, capacity);
    assert_non_null(lesson_text);
    for (const char* block = strstr(start, "```lua\n"); block && block < end; block = strstr(block, "```lua\n")) {
        block += strlen("```lua\n");
        const char* close = strstr(block, "```");
        assert_non_null(close);
        memcpy(lesson_text + used, block, (size_t)(close - block));
        used += (size_t)(close - block);
        block = close + 3;
    }
    free(guide);
    char path[512], arguments[700];
    snprintf(path, sizeof path, "%s/10-kv-writes.lua", test_scratch_dir());
    assert_true(test_write_file(path, lesson_text, used));
    free(lesson_text);
    char* out = NULL;
    snprintf(arguments, sizeof arguments, "lesson run %s --headless", path);
    if (servelab(arguments, &out) != 0) fail_msg("%s", out);
    assert_non_null(strstr(out, "PASS kv1 \"each decode step writes one token's keys and values\": TRUE, as the lesson "
                                "expects (a claim beyond the bank: the lesson's own) -- measured: "));
    free(out);
    snprintf(arguments, sizeof arguments, "lesson faults --matrix --output %s/tutorial-output %s", test_scratch_dir(),
             path);
    if (servelab(arguments, &out) != 0) fail_msg("%s", out);
    assert_non_null(strstr(out, "2 of 2 declared (claim, fault) pairs turned"));
    free(out);
}

// The line of `out` that starts with `prefix` (NULL if none), copied into line[size].
static const char* find_line(const char* out, const char* prefix, char* line, size_t size) {
    for (const char* at = out; *at; at = strchr(at, '\n') ? strchr(at, '\n') + 1 : at + strlen(at)) {
        if (strncmp(at, prefix, strlen(prefix)) != 0) continue;
        size_t length = strcspn(at, "\n");
        snprintf(line, size, "%.*s", (int)(length < size ? length : size - 1), at);
        return line;
    }
    return NULL;
}

// A number after `"key": ` in servelab calc's JSON.
static double calc_json_number(const char* json, const char* key) {
    char quoted[96];
    snprintf(quoted, sizeof quoted, "\"%s\": ", key);
    const char* at = strstr(json, quoted);
    if (!at) fail_msg("servelab calc --json has no %s", key);
    return strtod(at + strlen(quoted), NULL);
}

// Lesson 04 narrates every step, and tf9 teaches both plateaus: a short
// context that crosses the ridge and a long one held by its KV reads, with
// the engine's counts equal to the shapes' closed form. Its Llama-2-7B
// projection must give what servelab calc (a separate implementation in C)
// gives for the same model, device and context.
static void test_batching_lesson_teaches_both_plateaus(void** state) {
    (void)state;
    char* out = NULL;
    int status = servelab("lesson run lessons/04-batching.lua --headless --verbose --time-limit 120", &out);
    fputs(out, stdout);
    assert_int_equal(status, 0);
    // Narration before every check: each check line follows at least one '# ' line after the previous check.
    int narration_since_check = 0, checks = 0;
    for (const char* line = out; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : line + strlen(line)) {
        if (strncmp(line, "# ", 2) == 0) narration_since_check++;
        if (strncmp(line, "PASS ", 5) == 0 || strncmp(line, "UNDECIDED ", 10) == 0) {
            if (narration_since_check == 0) fail_msg("a check with no narration before it: %.120s", line);
            narration_since_check = 0;
            checks++;
        }
    }
    assert_int_equal(checks, 4);
    static char tf9[8192], edge5[8192];
    assert_non_null(find_line(out, "PASS tf9 ", tf9, sizeof tf9));
    assert_non_null(strstr(tf9, "two plateaus: compute at a short context, KV reads at a long one"));
    assert_non_null(strstr(tf9, "context 1: "));
    assert_non_null(strstr(tf9, "context 480: "));
    assert_non_null(strstr(tf9, "FLOPs equal the shapes' closed form at all 8 points"));
    static const int LLAMA_BATCHES[] = {1, 8, 15, 33}; // the issue's; 33 4096-token sequences fit in 80 GiB
    for (size_t i = 0; i < sizeof LLAMA_BATCHES / sizeof LLAMA_BATCHES[0]; i++) {
        int batch = LLAMA_BATCHES[i];
        char arguments[128], expected[96];
        snprintf(arguments, sizeof arguments, "calc --model Llama-2-7B --device H100 --seq 4096 --batch %d --json",
                 batch);
        char* json = NULL;
        assert_int_equal(servelab(arguments, &json), 0);
        snprintf(expected, sizeof expected, "B=%d %.0f tok/s (memory-bound", batch,
                 calc_json_number(json, "decode_tokens_per_s"));
        if (!strstr(tf9, expected)) fail_msg("tf9's Llama-2-7B projection lacks \"%s\" (servelab calc's)", expected);
        if (batch == 33) {
            snprintf(expected, sizeof expected, ", %.0f sequences fit",
                     calc_json_number(json, "sequences_fit_fp16_kv"));
            if (!strstr(tf9, expected)) fail_msg("tf9's note lacks \"%s\" (servelab calc's)", expected);
        }
        free(json);
    }
    // edge5 says why paging gains little alone, with the waste it measured.
    assert_non_null(find_line(out, "PASS edge5 ", edge5, sizeof edge5));
    assert_non_null(strstr(edge5, "not for the bank's reason"));
    assert_non_null(strstr(edge5, "no other request wants that memory (0 waited"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_shows_titles_and_claims),
        cmocka_unit_test(test_check_reports_syntax_errors_with_line),
        cmocka_unit_test(test_new_writes_a_skeleton_that_runs),
        cmocka_unit_test(test_new_never_writes_through_planted_links),
        cmocka_unit_test(test_run_flags_and_failures),
        cmocka_unit_test(test_run_shows_the_title_and_where_a_lesson_crashed),
        cmocka_unit_test(test_bank_answer_must_be_the_banks),
        cmocka_unit_test(test_tutorial_lesson_runs_as_written),
        cmocka_unit_test(test_every_lesson_passes_and_covers_the_bank),
        cmocka_unit_test(test_batching_lesson_teaches_both_plateaus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
