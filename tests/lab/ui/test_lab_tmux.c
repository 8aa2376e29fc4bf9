// The dashboard in a real terminal: tmux runs `servelab lab` in a detached
// session on a private server, the test sends keys, captures the pane and
// checks what a user would see: panes drawn, a step taken, the layout
// redone on resize (SIGWINCH), a clear message when the terminal is too
// small, and after `q`, SIGTERM or a crash the terminal back in its normal mode
// (alternate screen off, stty shows canonical mode and echo).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "tests/test_support.h"

static char tmux_socket[64];  // private server: -L servelab-test-<pid>-<start>
static char run_marker[96];   // unique --system text to find the lab's pid in /proc

static void skip_without_tmux(void) { test_tmux_require(); }
static int tmux(const char* arguments) { return test_tmux(tmux_socket, arguments); }
static char* wait_for_text(const char* text) { return test_tmux_wait_for_text(tmux_socket, "lab", text, 15000); }
static bool alternate_screen_on(void) { return test_tmux_alternate_screen_on(tmux_socket, "lab"); }

// Starts the lab in a fresh 160x50 session; after it exits the shell saves
// `stty -a` and prints a marker, then stays so the pane can be captured.
// `model_and_flags`: "--model tiny", or a model and more flags.
static void start_lab_with(const char* stty_path, const char* model_and_flags) {
    // A server of its own per start: the previous test's server may still be
    // shutting down after kill-server, and must not be reached.
    static int runs = 0;
    runs++;
    snprintf(tmux_socket, sizeof tmux_socket, "servelab-test-%d-%d", (int)getpid(), runs);
    snprintf(run_marker, sizeof run_marker, "tmux-run-%d-%ld-%d", (int)getpid(), (long)time(NULL), runs);
    remove(stty_path);
    char arguments[2048];
    snprintf(arguments, sizeof arguments,
             "-f /dev/null new-session -d -s lab -x 160 -y 50 \"sh -c '%s lab %s --system %s; "
             "stty -a > %s; echo LAB-EXITED; sleep 60'\"",
             test_servelab_binary(), model_and_flags, run_marker, stty_path);
    assert_int_equal(tmux(arguments), 0);
}

static void start_lab(const char* stty_path) { start_lab_with(stty_path, "--model tiny"); }

static int stop_server(void** state) {
    (void)state;
    tmux("kill-server");
    return 0;
}

// The pid of the lab started with our marker, found through /proc.
static pid_t lab_pid(void) {
    DIR* proc = opendir("/proc");
    assert_non_null(proc);
    pid_t found = -1;
    for (struct dirent* entry; (entry = readdir(proc)) != NULL && found < 0;) {
        char path[300];
        snprintf(path, sizeof path, "/proc/%s/cmdline", entry->d_name);
        FILE* f = fopen(path, "rb");
        if (!f) continue;
        char cmdline[4096];
        size_t n = fread(cmdline, 1, sizeof cmdline - 1, f);
        fclose(f);
        for (size_t i = 0; i < n; i++)
            if (cmdline[i] == '\0') cmdline[i] = ' ';
        cmdline[n] = '\0';
        // The lab itself, not the `sh -c` that started it (whose cmdline holds "stty").
        if (strstr(cmdline, run_marker) && strstr(cmdline, " lab ") && !strstr(cmdline, "stty"))
            found = (pid_t)atoi(entry->d_name);
    }
    closedir(proc);
    return found;
}

static void assert_terminal_restored(const char* stty_path) {
    free(wait_for_text("LAB-EXITED"));
    assert_false(alternate_screen_on());
    char* stty = test_read_text(stty_path);
    // stty -a lists "-icanon" / "-echo" when curses modes leaked.
    if (!strstr(stty, " icanon") || strstr(stty, "-icanon") || !strstr(stty, " echo ") || strstr(stty, " -echo "))
        fail_msg("the terminal was left in curses mode:\n%s", stty);
    free(stty);
}

static void test_lab_draws_steps_resizes_and_quits(void** state) {
    (void)state;
    skip_without_tmux();
    char stty_path[512];
    snprintf(stty_path, sizeof stty_path, "%s/stty-quit.txt", test_scratch_dir());
    start_lab(stty_path);
    free(wait_for_text("step 0"));
    char* screen = wait_for_text("Lesson"); // the last pane drawn: the frame is complete
    static const char* const PANES[] = {"Requests", "Block tables", "Block pool", "Fragmentation", "Memory traffic",
                                        "Step size", "Lesson"};
    for (size_t i = 0; i < sizeof PANES / sizeof PANES[0]; i++)
        if (!strstr(screen, PANES[i])) fail_msg("pane '%s' is not drawn at 160x50:\n%s", PANES[i], screen);
    free(screen);
    assert_true(alternate_screen_on());
    assert_int_equal(tmux("send-keys -t lab Space"), 0);
    free(wait_for_text("step 1 "));
    free(wait_for_text("this CPU: ")); // its bandwidth and FMA rate, measuring or measured
    // A smaller window: SIGWINCH, and the page layout at 80x24.
    assert_int_equal(tmux("resize-window -t lab -x 80 -y 24"), 0);
    free(wait_for_text("page 1"));
    assert_int_equal(tmux("resize-window -t lab -x 60 -y 16"), 0);
    free(wait_for_text("terminal too small: need at least 80x24"));
    assert_int_equal(tmux("resize-window -t lab -x 160 -y 50"), 0);
    free(wait_for_text("Memory traffic"));
    assert_int_equal(tmux("send-keys -t lab q"), 0);
    assert_terminal_restored(stty_path);
}

static void test_lab_restores_terminal_on_sigterm(void** state) {
    (void)state;
    skip_without_tmux();
    char stty_path[512];
    snprintf(stty_path, sizeof stty_path, "%s/stty-term.txt", test_scratch_dir());
    start_lab(stty_path);
    free(wait_for_text("step 0"));
    assert_int_equal(tmux("send-keys -t lab r"), 0); // running: SIGTERM arrives mid-run
    free(wait_for_text("RUNNING"));
    pid_t pid = lab_pid();
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGTERM), 0);
    assert_terminal_restored(stty_path);
}

// A crash: the lab dies of the signal, and the terminal is still given back.
static void test_lab_restores_terminal_on_a_crash(void** state) {
    (void)state;
    skip_without_tmux();
    char stty_path[512];
    snprintf(stty_path, sizeof stty_path, "%s/stty-crash.txt", test_scratch_dir());
    start_lab(stty_path);
    free(wait_for_text("step 0"));
    pid_t pid = lab_pid();
    assert_true(pid > 0);
    // SIGABRT (what abort() and failed asserts raise): the sanitizer build's
    // runtime takes over SIGSEGV itself, but leaves SIGABRT to the program.
    assert_int_equal(kill(pid, SIGABRT), 0);
    assert_terminal_restored(stty_path);
}

// `lab --serve 0` in a real terminal: the header shows the address; a curl
// client's request waits while the lab is paused (1 client, 1 queued, step
// 0), runs when r is pressed, and streams to its end; q restores the terminal.
static void test_lab_serve_in_a_terminal(void** state) {
    (void)state;
    skip_without_tmux();
    test_require_program("curl"); // the client (Debian: apt-get install curl; make test-deps)
    char model[512], flags[700], stty_path[512], out_path[512], command[2048];
    REQUIRE_SHARED_MODEL(model, "stories260K.bin");
    snprintf(flags, sizeof flags, "--model %s --serve 0", model);
    snprintf(stty_path, sizeof stty_path, "%s/stty-serve.txt", test_scratch_dir());
    snprintf(out_path, sizeof out_path, "%s/serve-client.txt", test_scratch_dir());
    remove(out_path);
    start_lab_with(stty_path, flags);
    char* screen = wait_for_text("serving http://127.0.0.1:");
    int port = atoi(strstr(screen, "serving http://127.0.0.1:") + strlen("serving http://127.0.0.1:"));
    free(screen);
    assert_true(port > 0);
    snprintf(command, sizeof command,
             "curl -sSN -m 60 http://127.0.0.1:%d/v1/completions -d '{\"model\": \"stories260K\", \"prompt\": "
             "\"Once upon a time\", \"max_tokens\": 20, \"stream\": true}' > %s 2>&1 "
             "|| echo \"curl exited with status $?\" >> %s &",
             port, out_path, out_path);
    assert_int_equal(system(command), 0);
    // Paused: the request is queued at the server and no step has run. When
    // it never arrives, what the client said (curl's error) is the cause.
    for (int waited_ms = 0;; waited_ms += 100) {
        screen = test_tmux_output(tmux_socket, "capture-pane -p -t lab");
        if (strstr(screen, "1 client  1 queued")) break;
        if (waited_ms >= 15000) {
            char* said = test_read_text(out_path);
            fail_msg("the lab never showed '1 client  1 queued' for the curl request; curl's output (%s): %s\n"
                     "last capture:\n%s",
                     out_path, said && said[0] ? said : "(none)", screen);
        }
        free(screen);
        test_sleep_ms(100);
    }
    if (!strstr(screen, "step 0 ")) fail_msg("the paused lab stepped:\n%s", screen);
    free(screen);
    test_sleep_ms(300);
    char* client = test_read_text(out_path);
    if (client && client[0]) fail_msg("the client got bytes while the lab was paused: %s", client);
    free(client);
    assert_int_equal(tmux("send-keys -t lab r"), 0);
    free(wait_for_text("finished 1"));
    free(wait_for_text("0 clients  0 queued"));
    client = test_read_text(out_path);
    if (!client || !strstr(client, "\"finish_reason\":\"length\"") || !strstr(client, "data: [DONE]"))
        fail_msg("the client's stream did not end with length and [DONE]: %s", client ? client : "(none)");
    free(client);
    assert_int_equal(tmux("send-keys -t lab q"), 0);
    assert_terminal_restored(stty_path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_lab_draws_steps_resizes_and_quits, stop_server),
        cmocka_unit_test_teardown(test_lab_restores_terminal_on_sigterm, stop_server),
        cmocka_unit_test_teardown(test_lab_restores_terminal_on_a_crash, stop_server),
        cmocka_unit_test_teardown(test_lab_serve_in_a_terminal, stop_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
