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
    static char paths[3][512];
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
    snprintf(command, sizeof command, "sh scripts/run-tests.sh %s >%s 2>&1", programs, out_path);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_77_is_not_run_never_passed),
        cmocka_unit_test(test_other_failures_still_fail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
