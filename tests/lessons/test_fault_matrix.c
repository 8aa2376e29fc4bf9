// The lesson fault matrix: every claim the shipped lessons check PASSes on
// the engine as it is, declares the faults that must break it, and turns to
// DISAGREE under each of them (servelab lesson faults --matrix); a FAIL (a
// guard, an error or a crash) is not a detection.
// The matrix machinery itself is shown to fail on lessons built to fool it.
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

#include "engine/fault.h"
#include "lab/lesson/lesson.h"
#include "tests/test_support.h"

// Timing verdicts are not meaningful under the sanitizers (they slow the
// kernels unevenly), and the matrix needs every clean verdict to PASS: the
// real lessons' matrix runs in the release build (make test).
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_SANITIZER 1
#else
#define UNDER_SANITIZER 0
#endif

// `servelab ARGUMENTS`: the exit status (-1 when killed) and stdout then
// stderr in *output (malloc'ed).
static int servelab(const char* arguments, char** output) {
    command_result result = run_servelab(arguments);
    size_t out_length = strlen(result.out), err_length = strlen(result.err);
    *output = malloc(out_length + err_length + 1);
    assert_non_null(*output);
    memcpy(*output, result.out, out_length);
    memcpy(*output + out_length, result.err, err_length + 1);
    int status = result.exit_status;
    free_result(&result);
    return status;
}

static const char* const BANK_CLAIMS[] = {
    "tf1",  "tf2",  "tf3",  "tf4",  "tf5",  "tf6",  "tf7",  "tf8",  "tf9",  "tf10", "se1",  "se2",
    "se3",  "se4",  "se5",  "se6",  "se7",  "se8",  "why1", "why2", "why3", "why4", "why5", "why6", "edge1",
    "edge2", "edge3", "edge4", "edge5", "edge6", "edge7", "edge8", "recall1",
    // beyond the bank: the lab's own claims
    "w4a8-prefill",   // lesson 06
    "kv-int8-bytes",  // lesson 01
    "kv-int8-logits", // lesson 01
    "tp-comm-bound",  // lesson 09
    "lru-eviction",   // lesson 10
    "preempt-victim", // lesson 10
    "recompute-ref",  // lesson 10
    "chunk-stall",    // lesson 10
    "spec-greedy", "spec-sampling", "spec-formula", "spec-bytes", "spec-crossover", "spec-rollback", // lesson 11
    "gptq-feedback",  // lesson 07
};

// A claim whose every declared fault stops its check with a FAIL (a guard
// inside measure raising an error) is detected by none of them: the matrix
// calls it a problem, and so does this test. Until guards43 the guards of
// se3, se5, se6 and tf7 were such a known gap; each now turns its guard's
// comparison into the verdict (DISAGREE naming both numbers), so no claim is
// exempt. test_matrix_does_not_count_a_guard_fail_as_turned keeps a lesson
// whose only check is a guard, to show the matrix still reports one.
static const char UNDETECTED_MARK[] = " is detected by none of its faults";

// Fails on the first "CLAIM is detected by none of its faults" line of a
// lesson's matrix output.
static void fail_on_undetected_claims(const char* text, const char* lesson_name) {
    const char* at = strstr(text, UNDETECTED_MARK);
    if (!at) return;
    const char* start = at;
    while (start > text && start[-1] != ' ' && start[-1] != '\n') start--;
    fail_msg("lessons/%s: claim %.*s is detected by none of its faults (a guard, an error or a crash stopped it under "
             "each)", lesson_name, (int)(at - start), start);
}

// ---- the shipped lessons' matrix, one process per lesson, in parallel -----------------
//
// `lesson faults --matrix` runs a lesson clean, then once per fault it
// declares; the lessons are independent, so each gets its own process, as
// many at a time as there are cores (TEST_JOBS), the longest first. The
// matrix of all lessons is their outputs in the order of lessons/ (the
// summary lines added up).

static lesson_file_name lesson_names[LESSON_MAX_FILES];
static int n_lessons_found;
static char* matrix_outputs[LESSON_MAX_FILES]; // the output of each lesson's matrix (malloc'ed)
static int matrix_status[LESSON_MAX_FILES];

// Heavier lessons first (the CPU of their clean run and faulted runs).
static int lesson_weight(const char* name) {
    static const char* const LONGEST[] = {"06-", "11-", "04-", "01-", "02-", "05-", "07-", "09-", "10-", "08-"};
    for (int k = 0; k < (int)(sizeof LONGEST / sizeof LONGEST[0]); k++)
        if (strncmp(name, LONGEST[k], strlen(LONGEST[k])) == 0) return 100 - k;
    return 0;
}

// The matrices of lessons order[0..n), `jobs` at a time.
static void run_matrix_processes(const int* order, int n, long jobs) {
    pid_t children[LESSON_MAX_FILES] = {0};
    int running = 0, next = 0;
    while (next < n || running > 0) {
        if (next < n && running < jobs) {
            int i = order[next++];
            char command[2048];
            snprintf(command, sizeof command,
                     "exec %s lesson faults --matrix --output %s/matrix-output-%d lessons/%s >%s/matrix-%d.out 2>&1 "
                     "</dev/null",
                     test_servelab_binary(), test_scratch_dir(), i, lesson_names[i], test_scratch_dir(), i);
            fflush(NULL);
            pid_t child = fork();
            assert_true(child >= 0);
            if (child == 0) {
                execl("/bin/sh", "sh", "-c", command, (char*)NULL);
                _exit(127);
            }
            children[i] = child;
            running++;
            continue;
        }
        int raw = 0;
        pid_t done = wait(&raw);
        assert_true(done > 0);
        for (int i = 0; i < n_lessons_found; i++) {
            if (children[i] != done || done == 0) continue;
            free(matrix_outputs[i]);
            char path[600];
            snprintf(path, sizeof path, "%s/matrix-%d.out", test_scratch_dir(), i);
            matrix_outputs[i] = test_read_text(path);
            if (!matrix_outputs[i]) matrix_outputs[i] = strdup("");
            matrix_status[i] = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
            children[i] = 0;
            // As each lesson ends, its summary (the whole matrix comes in the test's own output).
            const char* summary = strstr(matrix_outputs[i], "fault matrix: ");
            printf("lessons/%s: exit %d: %.*s\n", lesson_names[i], matrix_status[i],
                   summary ? (int)strcspn(summary, "\n") : 10, summary ? summary : "no summary");
            fflush(stdout);
        }
        running--;
    }
}

// Only clean verdicts that came out DISAGREE, nothing STILL, nothing undeclared, no crash:
// what a timing claim reads when the machine is oversubscribed.
static bool only_clean_disagreements(const char* out) {
    return strstr(out, " is DISAGREE with no fault: ") && !strstr(out, " is FAIL with no fault")
           && strncmp(out, "STILL ", 6) != 0 && !strstr(out, "\nSTILL ") && !strstr(out, "declares no fault")
           && !strstr(out, ": under ") && !strstr(out, ": no fault: ");
}

static void run_matrices(void) {
    if (n_lessons_found > 0) return;
    n_lessons_found = lesson_list_folder("lessons", lesson_names, LESSON_MAX_FILES);
    assert_true(n_lessons_found >= 7);
    int order[LESSON_MAX_FILES];
    for (int i = 0; i < n_lessons_found; i++) order[i] = i;
    for (int i = 1; i < n_lessons_found; i++) // insertion sort: heaviest first
        for (int j = i; j > 0 && lesson_weight(lesson_names[order[j]]) > lesson_weight(lesson_names[order[j - 1]]); j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    long jobs = getenv("TEST_JOBS") ? atol(getenv("TEST_JOBS")) : sysconf(_SC_NPROCESSORS_ONLN);
    if (jobs < 1) jobs = 1;
    run_matrix_processes(order, n_lessons_found, jobs);
    // The clean run of a timing claim may read DISAGREE while the other
    // lessons' matrices and test programs share the cores (make test runs
    // them in parallel); such a lesson's matrix runs once more, alone in
    // this program. Its clean verdict is test_lesson_cli's to judge; here
    // what counts is that each claim turns under its faults.
    int again[LESSON_MAX_FILES], n_again = 0;
    for (int i = 0; i < n_lessons_found; i++) {
        if (matrix_status[i] == 0 || !only_clean_disagreements(matrix_outputs[i])) continue;
        printf("lessons/%s: a clean verdict read DISAGREE beside the other matrices; once more, alone. It said:\n%s",
               lesson_names[i], matrix_outputs[i]);
        again[n_again++] = i;
    }
    if (n_again) run_matrix_processes(again, n_again, 1);
}

static void test_every_claim_turns_under_its_faults(void** state) {
    (void)state;
    if (UNDER_SANITIZER) {
        print_message("skipping: the lesson fault matrix runs in the release build (make test); timing verdicts "
                      "under the sanitizers are not meaningful\n");
        skip();
    }
    run_matrices();
    int n_claims = 0, n_lessons = 0, turned = 0, pairs = 0, extra = 0, problems = 0, stopped = 0;
    size_t total_length = 0;
    for (int i = 0; i < n_lessons_found; i++) total_length += strlen(matrix_outputs[i]) + 1;
    char* out = calloc(total_length + 1, 1);
    assert_non_null(out);
    for (int i = 0; i < n_lessons_found; i++) {
        const char* text = matrix_outputs[i];
        printf("== lessons/%s (exit %d)\n", lesson_names[i], matrix_status[i]);
        fputs(text, stdout); // the whole matrix into the test log
        fflush(stdout);
        strcat(out, "\n");
        strcat(out, text);
        const char* summary = strstr(text, "fault matrix: ");
        if (!summary) fail_msg("lessons/%s: no matrix summary:\n%s", lesson_names[i], text);
        int c = 0, l = 0, t = 0, p = 0, e = 0, n = -1;
        assert_int_equal(sscanf(summary,
                                "fault matrix: %d claims in %d lessons; %d of %d declared (claim, fault) pairs turned; "
                                "%d undeclared turns; %d problems",
                                &c, &l, &t, &p, &e, &n),
                         6);
        n_claims += c, n_lessons += l, turned += t, pairs += p, extra += e, problems += n;
        const char* stopped_count = strstr(summary, " undecided (noisy timings: not turned, not failed); ");
        int s = -1;
        if (!stopped_count || sscanf(stopped_count, " undecided (noisy timings: not turned, not failed); %d stopped", &s) != 1)
            fail_msg("lessons/%s: the summary does not count the pairs stopped by a guard:\n%s", lesson_names[i], summary);
        stopped += s;
        fail_on_undetected_claims(text, lesson_names[i]);
        if (n != 0 || matrix_status[i] != 0)
            fail_msg("lessons/%s: the matrix exited %d with %d problems", lesson_names[i], matrix_status[i], n);
    }
    printf("all lessons: %d claims in %d lessons; %d of %d declared (claim, fault) pairs turned (DISAGREE); %d stopped "
           "by a guard, an error or a crash (not detected); %d undeclared turns; %d problems\n",
           n_claims, n_lessons, turned, pairs, stopped, extra, problems);
    assert_null(strstr(out, "\nSTILL "));
    assert_null(strstr(out, "declares no fault"));
    assert_null(strstr(out, "with no fault:"));
    // Every claim of the bank is in the matrix, with at least one fault that
    // turned it to DISAGREE.
    for (size_t k = 0; k < sizeof BANK_CLAIMS / sizeof BANK_CLAIMS[0]; k++) {
        char pattern[64];
        snprintf(pattern, sizeof pattern, "turned   %-18s ", BANK_CLAIMS[k]);
        char undecided[64]; // a noisy timing this run: its pairs are not judged (neither turned nor STILL)
        snprintf(undecided, sizeof undecided, "undecid. %-18s ", BANK_CLAIMS[k]);
        if (!strstr(out, pattern) && strstr(out, undecided))
            printf("claim %s: UNDECIDED this run (a noisy timing): its faults were not judged\n", BANK_CLAIMS[k]);
        else if (!strstr(out, pattern))
            fail_msg("no fault turns claim %s in the matrix", BANK_CLAIMS[k]);
    }
    assert_int_equal(n_lessons, n_lessons_found);
    assert_int_equal(n_claims, (int)(sizeof BANK_CLAIMS / sizeof BANK_CLAIMS[0]));
    assert_int_equal(turned + stopped, pairs);
    assert_true(turned >= n_claims);
    assert_int_equal(problems, 0);
    free(out);
}

// A lesson whose verdict ignores the engine: declared faults cannot turn
// it, so the matrix must say STILL and fail. A second claim declares no
// fault at all.
static void test_matrix_fails_on_a_check_that_cannot_fail(void** state) {
    (void)state;
    char path[512], arguments[1200];
    snprintf(path, sizeof path, "%s/blind.lua", test_scratch_dir());
    const char* text = "lab.lesson{title = \"blind\", claims = {\"b1\", \"b2\"}}\n"
                       "local e = lab.engine{model = \"tiny\", block_size = 16, num_blocks = 16}\n"
                       "e:add{ids = {1, 2, 3}, max_tokens = 2}\n"
                       "e:run{}\n"
                       "lab.check{id = \"b1\", claim = \"always\", expected = true, verdict = true,\n"
                       "          evidence = \"nothing measured: 1\", breaks_with = {\"no-cow\"}}\n"
                       "lab.check{id = \"b2\", claim = \"also always\", expected = true, verdict = true,\n"
                       "          evidence = \"nothing measured: 2\"}\n";
    assert_true(test_write_file(path, text, strlen(text)));
    snprintf(arguments, sizeof arguments, "lesson faults --matrix --output %s/matrix-output %s", test_scratch_dir(), path);
    char* out = NULL;
    assert_int_equal(servelab(arguments, &out), 1);
    assert_non_null(strstr(out, "STILL    b1                 no-cow                   PASS"));
    assert_non_null(strstr(out, "b2 declares no fault"));
    assert_non_null(strstr(out, "0 of 1 declared (claim, fault) pairs turned"));
    free(out);
}

// The other way round: a check that reads the fault's effect turns, and the
// table lists its declaration.
static void test_matrix_passes_a_check_that_sees_its_fault(void** state) {
    (void)state;
    char path[512], arguments[1200];
    snprintf(path, sizeof path, "%s/seeing.lua", test_scratch_dir());
    // kv-count-doubled doubles the KV bytes the step record reports: one
    // token of the tiny preset writes 2 x L x kv_dim x 2 bytes (fp16).
    const char* text =
        "lab.lesson{title = \"seeing\", claims = {\"s1\"}}\n"
        "local model = lab.model(\"tiny\")\n"
        "local shape = model:info()\n"
        "local e = lab.engine{model = model, block_size = 16, num_blocks = 16}\n"
        "e:add{ids = {1}, max_tokens = 4}\n"
        "local r = e:step()\n"
        "local expected = 2 * shape.n_layers * shape.kv_dim * 2\n"
        "lab.check{id = \"s1\", claim = \"one token writes 2 L kv_dim p bytes\", expected = true,\n"
        "          verdict = r.bytes.kv_written == expected, breaks_with = {\"kv-count-doubled\"},\n"
        "          evidence = string.format(\"%d bytes written, %d expected\", r.bytes.kv_written, expected)}\n";
    assert_true(test_write_file(path, text, strlen(text)));
    snprintf(arguments, sizeof arguments, "lesson faults --matrix --output %s/matrix-output %s", test_scratch_dir(), path);
    char* out = NULL;
    int status = servelab(arguments, &out);
    if (!strstr(out, "turned   s1                 kv-count-doubled         DISAGREE")) fail_msg("%s", out);
    assert_int_equal(status, 0);
    free(out);
    snprintf(arguments, sizeof arguments, "lesson faults --output %s/matrix-output %s", test_scratch_dir(), path);
    assert_int_equal(servelab(arguments, &out), 0);
    assert_non_null(strstr(out, "| s1 | seeing.lua | kv-count-doubled |"));
    free(out);
}

// A guard is not a detection: a check whose measure raises an error on the
// fault's numbers FAILs, and the matrix lists that pair as stopped, does
// not count it as turned, and calls the claim a problem; the same numbers
// held by a verdict turn to DISAGREE and count.
static void test_matrix_does_not_count_a_guard_fail_as_turned(void** state) {
    (void)state;
    char path[512], arguments[1200];
    snprintf(path, sizeof path, "%s/guarded.lua", test_scratch_dir());
    const char* text =
        "lab.lesson{title = \"guarded\", claims = {\"g1\", \"g2\"}}\n"
        "local model = lab.model(\"tiny\")\n"
        "local shape = model:info()\n"
        "local e = lab.engine{model = model, block_size = 16, num_blocks = 16}\n"
        "e:add{ids = {1}, max_tokens = 4}\n"
        "local r = e:step()\n"
        "local expected = 2 * shape.n_layers * shape.kv_dim * 2\n"
        "local evidence = string.format(\"%d bytes written, %d expected\", r.bytes.kv_written, expected)\n"
        "lab.check{id = \"g1\", claim = \"one token writes 2 L kv_dim p bytes\", expected = true,\n"
        "          breaks_with = {\"kv-count-doubled\"}, measure = function()\n"
        "              if r.bytes.kv_written ~= expected then error(\"guard: \" .. evidence, 0) end\n"
        "              return true, evidence\n"
        "          end}\n"
        "lab.check{id = \"g2\", claim = \"one token writes 2 L kv_dim p bytes\", expected = true,\n"
        "          verdict = r.bytes.kv_written == expected, evidence = evidence, breaks_with = {\"kv-count-doubled\"}}\n";
    assert_true(test_write_file(path, text, strlen(text)));
    snprintf(arguments, sizeof arguments, "lesson faults --matrix --output %s/matrix-output %s", test_scratch_dir(), path);
    char* out = NULL;
    int status = servelab(arguments, &out);
    if (!strstr(out, "stopped  g1                 kv-count-doubled         FAIL -- stopped by a guard, not detected: "
                     "measure failed: guard: 512 bytes written, 256 expected"))
        fail_msg("%s", out);
    assert_non_null(strstr(out, "turned   g2                 kv-count-doubled         DISAGREE -- 512 bytes written"));
    assert_null(strstr(out, "turned   g1 "));
    assert_non_null(strstr(out, "g1 is detected by none of its faults"));
    assert_null(strstr(out, "g2 is detected by none"));
    assert_non_null(strstr(out, "1 of 2 declared (claim, fault) pairs turned"));
    assert_non_null(strstr(out, "; 1 problems;"));
    assert_non_null(strstr(out, "; 1 stopped by a guard, an error or a crash (not detected)"));
    assert_int_equal(status, 1);
    free(out);
    // lesson run --fault says the same of each line.
    snprintf(arguments, sizeof arguments, "lesson run %s --headless --output %s/matrix-output --fault kv-count-doubled", path,
             test_scratch_dir());
    assert_int_equal(servelab(arguments, &out), 1);
    if (!strstr(out, "[stopped under kv-count-doubled, not detected: only a DISAGREE counts as turned]")) fail_msg("%s", out);
    assert_non_null(strstr(out, "[turned by kv-count-doubled, as its breaks_with declares]"));
    free(out);
}

// lesson run --fault marks each line: turned as declared, or still PASS.
static void test_run_with_a_fault_says_what_turned(void** state) {
    (void)state;
    char path[512], arguments[1200];
    snprintf(path, sizeof path, "%s/seeing.lua", test_scratch_dir());
    snprintf(arguments, sizeof arguments, "lesson run %s --headless --output %s/matrix-output --fault kv-count-doubled", path,
             test_scratch_dir());
    char* out = NULL;
    assert_int_equal(servelab(arguments, &out), 1);
    if (!strstr(out, "[turned by kv-count-doubled, as its breaks_with declares]")) fail_msg("%s", out);
    free(out);
    snprintf(arguments, sizeof arguments, "lesson run %s --headless --output %s/matrix-output --fault no-such-bug", path,
             test_scratch_dir());
    assert_int_equal(servelab(arguments, &out), 2);
    assert_non_null(strstr(out, "unknown fault 'no-such-bug'"));
    free(out);
}

// lessons/README.md's claim -> faults table is the command's output, not
// typed: it must match what the lessons declare now.
//
// `servelab lesson faults lessons/*.lua` runs every lesson clean once more.
// Under make test the clean runs are already made (scripts/clean-lessons.sh,
// SERVELAB_CLEAN_LESSONS) and the matrices list every declared (claim,
// fault) pair, so the table is put together from them: the claims in the
// order each clean run checked them, each with the faults its matrix lines
// name, in the order of the faults (the matrix's outer loop), as
// fault_set_describe writes them. Run alone, this runs the command itself.
static char* table_from_clean_runs_and_matrices(void) {
    const char* shared = getenv("SERVELAB_CLEAN_LESSONS");
    if (!shared || !shared[0]) return NULL;
    run_matrices();
    size_t capacity = 1 << 16, length = 0;
    char* table = malloc(capacity);
    assert_non_null(table);
    length += (size_t)snprintf(table, capacity, "| claim | lesson | faults that must turn it (`breaks_with`) |\n|---|---|---|\n");
    for (int i = 0; i < n_lessons_found; i++) {
        char path[700];
        snprintf(path, sizeof path, "%.300s/%.255s.out", shared, lesson_names[i]);
        char* clean = test_read_text(path);
        if (!clean) {
            printf("(%s is missing: running `lesson faults` itself)\n", path);
            free(table);
            return NULL;
        }
        for (char* line = clean; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : line + strlen(line)) {
            const char* rest = strncmp(line, "PASS ", 5) == 0       ? line + 5
                               : strncmp(line, "DISAGREE ", 9) == 0 ? line + 9
                               : strncmp(line, "FAIL ", 5) == 0     ? line + 5
                               : strncmp(line, "UNDECIDED ", 10) == 0 ? line + 10
                                                                    : NULL;
            char id[32] = "";
            if (!rest || sscanf(rest, "%31s", id) != 1) continue;
            char faults[512] = "";
            for (const char* m = matrix_outputs[i]; *m; m = strchr(m, '\n') ? strchr(m, '\n') + 1 : m + strlen(m)) {
                char word[16], claim[32], fault[64];
                if (sscanf(m, "%15s %31s %63s", word, claim, fault) != 3) continue;
                if ((strcmp(word, "turned") != 0 && strcmp(word, "stopped") != 0 && strcmp(word, "STILL") != 0 &&
                     strcmp(word, "undecid.") != 0) ||
                    strcmp(claim, id) != 0)
                    continue;
                size_t used = strlen(faults);
                snprintf(faults + used, sizeof faults - used, "%s%s", used ? " " : "", fault);
            }
            if (length + 1024 > capacity) {
                capacity *= 2;
                table = realloc(table, capacity);
                assert_non_null(table);
            }
            length += (size_t)snprintf(table + length, capacity - length, "| %s | %s | %s |\n", id, lesson_names[i],
                                       faults[0] ? faults : "(none declared)");
        }
        free(clean);
    }
    return table;
}

static void test_readme_table_is_generated(void** state) {
    (void)state;
    if (UNDER_SANITIZER) {
        // A documentation check: every lesson already runs under the
        // sanitizers in test_lesson_cli, and this would run them all again.
        print_message("skipping: the README table is checked in the release build (make test)\n");
        skip();
    }
    char* out = table_from_clean_runs_and_matrices();
    if (out) {
        printf("(the table from make test's clean runs and the matrices)\n");
    } else {
        char arguments[1024];
        // Under the sanitizers lesson 06 needs over a minute of CPU.
        snprintf(arguments, sizeof arguments, "lesson faults --time-limit %d --output %s/matrix-output lessons/*.lua",
                 UNDER_SANITIZER ? 900 : 60, test_scratch_dir());
        assert_int_equal(servelab(arguments, &out), 0);
    }
    char* readme = test_read_text("lessons/README.md");
    static const char BEGIN[] = "<!-- fault-table: generated by `servelab lesson faults lessons/*.lua`; do not edit by hand -->\n";
    const char* start = strstr(readme, BEGIN);
    const char* end = start ? strstr(start, "<!-- end fault-table -->") : NULL;
    assert_non_null(start);
    assert_non_null(end);
    start += strlen(BEGIN);
    size_t length = (size_t)(end - start);
    if (length != strlen(out) || strncmp(start, out, length) != 0)
        fail_msg("lessons/README.md's fault table differs from `servelab lesson faults lessons/*.lua`; regenerate it "
                 "(scripts/update-fault-table.sh). The command prints:\n%s", out);
    free(readme);
    free(out);
}

static void test_info_lists_every_fault(void** state) {
    (void)state;
    char* out = NULL;
    assert_int_equal(servelab("info --faults", &out), 0);
    for (int id = 0; id < FAULT_COUNT; id++) {
        char pattern[64];
        snprintf(pattern, sizeof pattern, "  %s ", fault_name(id));
        if (!strstr(out, pattern)) fail_msg("info --faults does not list %s:\n%s", fault_name(id), out);
    }
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_info_lists_every_fault),
        cmocka_unit_test(test_matrix_fails_on_a_check_that_cannot_fail),
        cmocka_unit_test(test_matrix_passes_a_check_that_sees_its_fault),
        cmocka_unit_test(test_matrix_does_not_count_a_guard_fail_as_turned),
        cmocka_unit_test(test_run_with_a_fault_says_what_turned),
        cmocka_unit_test(test_readme_table_is_generated),
        cmocka_unit_test(test_every_claim_turns_under_its_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
