// --backend cpu|cuda (lab/common/engine_options.c): cpu runs as before; cuda runs
// the forward pass on the GPU where there is one, and otherwise fails with
// one clear line and exit 2 (never a crash): no device, or a build without
// CUDA. (The GPU's results are checked in tests/cuda/gpu_equivalence.c.)
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_info.h"
#include "tests/test_support.h"

static void test_backend_cpu_runs(void** state) {
    (void)state;
    command_result r = run_servelab("generate --model tiny --backend cpu --prompt-ids \"1 2 3\" -n 4 --ids");
    if (r.exit_status != 0) fail_msg("--backend cpu exited %d: %s", r.exit_status, r.err);
    assert_true(strlen(r.out) > 0);
    command_result plain = run_servelab("generate --model tiny --prompt-ids \"1 2 3\" -n 4 --ids");
    assert_int_equal(plain.exit_status, 0); // the same run without the flag: the same ids
    assert_string_equal(r.out, plain.out);
    free_result(&r);
    free_result(&plain);
}

static void test_backend_cuda_fails_clearly_without_a_device(void** state) {
    (void)state;
    char message[256];
    const int n_devices = cuda_device_count(message, sizeof message);
    const char* commands[] = {"generate --model tiny --backend cuda -n 4", "sim --model tiny --backend cuda"};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        command_result r = run_servelab(commands[i]);
        const int status = r.exit_status;
        const char *out = r.out, *err = r.err;
        if (n_devices > 0) { // a GPU machine: it runs
            if (status != 0) fail_msg("'%s' exited %d on a machine with a CUDA device: %s", commands[i], status, err);
        } else if (!cuda_backend_built()) {
            if (status != 2 || !strstr(err, "--backend cuda: this servelab was built without CUDA"))
                fail_msg("'%s' exited %d with '%s', expected 2 and 'built without CUDA'", commands[i], status, err);
        } else {
            if (status != 2) fail_msg("'%s' exited %d, expected 2 (stderr: %s)", commands[i], status, err);
            if (!strstr(err, "--backend cuda: no CUDA device found (") || !strstr(err, message))
                fail_msg("'%s': stderr '%s' does not say that no device was found and why ('%s')", commands[i], err,
                         message);
            assert_string_equal(out, "");
        }
        free_result(&r);
    }
}

static void test_backend_unknown_value(void** state) {
    (void)state;
    command_result r = run_servelab("generate --model tiny --backend tpu");
    assert_int_equal(r.exit_status, 2);
    assert_non_null(strstr(r.err, "--backend: expected cpu or cuda, found 'tpu'"));
    free_result(&r);
    r = run_servelab("generate --model tiny --backend");
    assert_int_equal(r.exit_status, 2);
    assert_non_null(strstr(r.err, "--backend needs a value"));
    free_result(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_cpu_runs),
        cmocka_unit_test(test_backend_cuda_fails_clearly_without_a_device),
        cmocka_unit_test(test_backend_unknown_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
