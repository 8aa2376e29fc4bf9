// scripts/run-tests.sh and exit status 77 ("could not run here", what the
// GPU programs return without a CUDA device): such a program is reported
// as not run, whatever it printed, and is never counted as passed or failed.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "tests/test_support.h"

// Writes an executable shell script `name` into the scratch directory that
// prints `output` and exits with `status`; returns its path (static buffer
// per slot).
static const char* fake_test(int slot, const char* name, const char* output, int status) {
    static char paths[6][512];
    char text[1024];
    snprintf(paths[slot], sizeof paths[slot], "%s/%s", test_scratch_dir(), name);
    snprintf(text, sizeof text, "#!/bin/sh\nprintf '%s'\nexit %d\n", output, status);
    assert_true(test_write_file(paths[slot], text, strlen(text)));
    assert_int_equal(chmod(paths[slot], 0755), 0);
    return paths[slot];
}

// Runs the runner on the given programs; returns its exit status and its
// output in *out (malloc'ed).
static int run_runner(const char* programs, char** out) {
    char out_path[512], command[2048];
    snprintf(out_path, sizeof out_path, "%s/runner.out", test_scratch_dir());
    // Its own logs and times, never those of the `make test` running this.
    snprintf(command, sizeof command, "TEST_LOG_DIR=%s/logs TEST_JOBS=2 sh scripts/run-tests.sh %s >%s 2>&1",
             test_scratch_dir(), programs, out_path);
    int raw = system(command);
    *out = test_read_text(out_path);
    return raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

static void test_exit_77_is_not_run_never_passed(void** state) {
    (void)state;
    // A program that claims passes but exits 77 (as if it had printed them
    // before finding no device), and one ordinary passing program.
    const char* gpu =
        fake_test(0, "fake_gpu", "GPU tests NOT RUN: no CUDA device (none here)\\n[  PASSED  ] 9 test(s).\\n", 77);
    const char* plain = fake_test(1, "fake_plain", "[  PASSED  ] 2 test(s).\\n", 0);
    char programs[1100], *out;
    snprintf(programs, sizeof programs, "%s %s", gpu, plain);
    int status = run_runner(programs, &out);
    assert_int_equal(status, 0);
    if (!strstr(out, "tests: 2 passed, 0 failed, 0 skipped, 1 not run")) fail_msg("runner said: %s", out);
    assert_non_null(strstr(out, "NOT RUN (exit 77): GPU tests NOT RUN: no CUDA device (none here)"));
    free(out);
}

static void test_other_failures_still_fail(void** state) {
    (void)state;
    const char* crash = fake_test(2, "fake_crash", "no summary\\n", 3);
    char* out;
    assert_int_equal(run_runner(crash, &out), 1);
    if (!strstr(out, "tests: 0 passed, 1 failed, 0 skipped, 0 not run")) fail_msg("runner said: %s", out);
    free(out);
}

// The last line of text (no trailing newline in the copy; static buffer).
static const char* last_line(const char* text) {
    static char line[512];
    size_t length = strlen(text);
    while (length > 0 && text[length - 1] == '\n') length--;
    size_t start = length;
    while (start > 0 && text[start - 1] != '\n') start--;
    snprintf(line, sizeof line, "%.*s", (int)(length - start), text + start);
    return line;
}

// The summary: each failed test by name with its log, a crash with the end
// of its log, the slowest programs with their times; every line of a
// program's output streamed with its name; the total line last.
static void test_summary_names_failures_and_slowest(void** state) {
    (void)state;
    const char* failing = fake_test(3, "fake_failing",
                                    "[==========] 2 test(s) run.\\n[  PASSED  ] 1 test(s).\\n"
                                    "[  FAILED  ] 1 test(s), listed below:\\n[  FAILED  ] test_the_broken_one\\n",
                                    1);
    const char* crash = fake_test(4, "fake_crashing", "the last words\\n", 139);
    const char* slow = fake_test(5, "fake_slow", "slowly\\n[  PASSED  ] 3 test(s).\\n", 0);
    char programs[1700], *out;
    snprintf(programs, sizeof programs, "%s %s %s", failing, crash, slow);
    assert_int_equal(run_runner(programs, &out), 1);
    assert_string_equal(last_line(out), "tests: 4 passed, 2 failed, 0 skipped, 0 not run");
    assert_non_null(strstr(out, "[fake_slow] slowly\n"));
    assert_non_null(strstr(out, "[fake_failing] [  FAILED  ] test_the_broken_one\n"));
    assert_non_null(strstr(out, "FAILED:\n"));
    char expected[700];
    snprintf(expected, sizeof expected, "!! fake_failing: test_the_broken_one \n   log: %s/logs/fake_failing.log\n",
             test_scratch_dir());
    if (!strstr(out, expected)) fail_msg("expected '%s' in: %s", expected, out);
    assert_non_null(strstr(out, "!! fake_crashing: (exited with status 139 without a cmocka summary"));
    assert_non_null(strstr(out, "the last words"));
    assert_non_null(strstr(out, "slowest programs (wall, CPU):\n"));
    assert_non_null(strstr(out, " s  fake_slow\n"));
    // The log holds the program's own output, without the prefix.
    char log_path[600];
    snprintf(log_path, sizeof log_path, "%s/logs/fake_slow.log", test_scratch_dir());
    char* log = test_read_text(log_path);
    assert_non_null(log);
    assert_string_equal(log, "slowly\n[  PASSED  ] 3 test(s).\n");
    free(log);
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_77_is_not_run_never_passed),
        cmocka_unit_test(test_other_failures_still_fail),
        cmocka_unit_test(test_summary_names_failures_and_slowest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
