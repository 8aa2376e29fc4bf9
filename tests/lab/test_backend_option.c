// --backend cpu|cuda (lab/engine_options.c): cpu runs as before; cuda runs
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
#include <sys/wait.h>

#include "kernels/cuda/cuda_info.h"
#include "tests/test_support.h"

// Exit status of `servelab <arguments>` (-1 when killed by a signal);
// stderr's text in *err (malloc'ed).
static int run_servelab(const char* arguments, char** out, char** err) {
    char out_path[512], err_path[512], command[2048];
    snprintf(out_path, sizeof out_path, "%s/backend.out", test_scratch_dir());
    snprintf(err_path, sizeof err_path, "%s/backend.err", test_scratch_dir());
    snprintf(command, sizeof command, "%s %s >%s 2>%s </dev/null", test_servelab_binary(), arguments, out_path,
             err_path);
    int raw = system(command);
    *out = test_read_text(out_path);
    *err = test_read_text(err_path);
    return raw != -1 && WIFEXITED(raw) && WEXITSTATUS(raw) < 128 ? WEXITSTATUS(raw) : -1;
}

static void test_backend_cpu_runs(void** state) {
    (void)state;
    char *out, *err;
    int status = run_servelab("generate --model tiny --backend cpu --prompt-ids \"1 2 3\" -n 4 --ids", &out, &err);
    if (status != 0) fail_msg("--backend cpu exited %d: %s", status, err);
    assert_true(strlen(out) > 0);
    char *plain_out, *plain_err; // the same run without the flag: the same ids
    assert_int_equal(run_servelab("generate --model tiny --prompt-ids \"1 2 3\" -n 4 --ids", &plain_out, &plain_err),
                     0);
    assert_string_equal(out, plain_out);
    free(out), free(err), free(plain_out), free(plain_err);
}

static void test_backend_cuda_fails_clearly_without_a_device(void** state) {
    (void)state;
    char message[256];
    const int n_devices = cuda_device_count(message, sizeof message);
    const char* commands[] = {"generate --model tiny --backend cuda -n 4", "sim --model tiny --backend cuda"};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        char *out, *err;
        int status = run_servelab(commands[i], &out, &err);
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
        free(out), free(err);
    }
}

static void test_backend_unknown_value(void** state) {
    (void)state;
    char *out, *err;
    assert_int_equal(run_servelab("generate --model tiny --backend tpu", &out, &err), 2);
    assert_non_null(strstr(err, "--backend: expected cpu or cuda, found 'tpu'"));
    free(out), free(err);
    assert_int_equal(run_servelab("generate --model tiny --backend", &out, &err), 2);
    assert_non_null(strstr(err, "--backend needs a value"));
    free(out), free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_cpu_runs),
        cmocka_unit_test(test_backend_cuda_fails_clearly_without_a_device),
        cmocka_unit_test(test_backend_unknown_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
