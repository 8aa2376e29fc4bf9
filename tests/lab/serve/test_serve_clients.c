// `servelab serve` driven by clients nobody here wrote (issue 31):
//   - the official OpenAI Node client, the version locked in
//     tests/serve/package-lock.json (tests/serve/openai_client.mjs):
//     completions and chat, streaming and not, errors as typed errors;
//   - curl (tests/serve/curl_test.sh).
// Each script starts its own server on a free loopback port and stops it.
//
// The client is installed here on first use (npm ci into
// tests/serve/node_modules, git-ignored). Without node/npm, or when npm
// cannot install (offline), the program says NOT RUN and exits 77: it is
// never reported as passed.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/test_support.h"

static char model_path[512];

// Runs a shell command with stdout and stderr into the scratch file `name`;
// returns its exit status (-1 for a signal) and the output (malloc'ed).
static int run_logged(const char* command, const char* name, char** output) {
    char log_path[600], full[4096];
    snprintf(log_path, sizeof log_path, "%s/%s", test_scratch_dir(), name);
    snprintf(full, sizeof full, "%s >%s 2>&1 </dev/null", command, log_path);
    int raw = system(full);
    *output = test_read_text(log_path);
    return raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

// The openai version package.json asks for, and the one installed (or "").
static void openai_versions(char* wanted, char* installed, size_t capacity) {
    json_error_t error;
    json_t* package = json_load_file("tests/serve/package.json", 0, &error);
    json_t* module = json_load_file("tests/serve/node_modules/openai/package.json", 0, &error);
    const char* w = json_string_value(json_object_get(json_object_get(package, "dependencies"), "openai"));
    const char* i = json_string_value(json_object_get(module, "version"));
    snprintf(wanted, capacity, "%s", w ? w : "?");
    snprintf(installed, capacity, "%s", i ? i : "");
    json_decref(package);
    json_decref(module);
}

static void test_openai_node_client(void** state) {
    (void)state;
    char command[2048];
    snprintf(command, sizeof command,
             "SERVELAB_BIN=%s SERVELAB_MODEL=%s timeout 180 node tests/serve/openai_client.mjs", test_servelab_binary(),
             model_path);
    char* output = NULL;
    int status = run_logged(command, "openai_client.log", &output);
    fputs(output, stdout);
    fflush(stdout);
    if (status != 0) fail_msg("the OpenAI client test exited with %d", status);
    assert_non_null(strstr(output, "PASS: the official OpenAI client"));
    free(output);
}

static void test_curl(void** state) {
    (void)state;
    if (system("command -v curl >/dev/null 2>&1") != 0) {
        if (getenv("CI")) fail_msg("curl is missing and CI is set");
        print_message("skipping: curl is not installed\n");
        skip();
    }
    char command[2048];
    snprintf(command, sizeof command, "SERVELAB_BIN=%s SERVELAB_MODEL=%s timeout 180 sh tests/serve/curl_test.sh",
             test_servelab_binary(), model_path);
    char* output = NULL;
    int status = run_logged(command, "curl_test.log", &output);
    fputs(output, stdout);
    fflush(stdout);
    if (status != 0) fail_msg("the curl test exited with %d", status);
    assert_non_null(strstr(output, "PASS: curl"));
    free(output);
}

int main(void) {
    if (!shared_model_path(model_path, sizeof model_path, "stories260K.bin")) {
        if (getenv("CI")) {
            printf("test_serve_clients: stories260K.bin is missing and CI is set\n");
            return 1;
        }
        printf("NOT RUN: stories260K.bin is in neither ../shared/models nor ./models ('make models')\n");
        return 77;
    }
    if (system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") != 0) {
        printf("NOT RUN: node and npm are needed for the OpenAI client test (Debian: apt-get install nodejs npm)\n");
        return 77;
    }
    char wanted[64], installed[64];
    openai_versions(wanted, installed, sizeof wanted);
    if (strcmp(wanted, installed) != 0) {
        char* output = NULL;
        int status = run_logged("(cd tests/serve && timeout 300 npm ci --no-audit --no-fund)", "npm_ci.log", &output);
        openai_versions(wanted, installed, sizeof wanted);
        if (status != 0 || strcmp(wanted, installed) != 0) {
            printf("NOT RUN: npm ci could not install openai %s into tests/serve (offline?):\n%s\n", wanted, output);
            free(output);
            return 77;
        }
        free(output);
    }
    printf("openai %s (tests/serve/package-lock.json), node: ", installed);
    fflush(stdout);
    if (system("node --version") != 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_node_client),
        cmocka_unit_test(test_curl),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
