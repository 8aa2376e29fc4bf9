// The terminal is given back however a full-screen command ends, and the
// exit status says how it ended. tmux runs `servelab lab` (or `servelab
// quiz`) in a detached pane on a private server; the test signals the
// process and then reads, from the shell that started it, the exit status
// and `stty -a`, and asks tmux whether the pane is still on the alternate
// screen.
//
//   SIGQUIT (Ctrl-\), SIGTERM, SIGINT, SIGHUP: the key loop ends, the
//     terminal is restored, and the status is 128 + the signal.
//   SIGKILL: nothing in the process runs; the watcher process started with
//     the terminal (servelab-terminal-watcher) restores it, and the shell
//     sees 137 as for any killed program.
//   q: status 0, and the watcher is gone with the lab.
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

static char tmux_socket[64]; // private server: -L servelab-restore-<pid>-<run>
static char run_marker[96];  // unique text in the command line, to find its pid in /proc

static void skip_without_tmux(void) { test_tmux_require(); }
static int tmux(const char* arguments) { return test_tmux(tmux_socket, arguments); }
static void sleep_ms(int ms) { test_sleep_ms(ms); }
static char* wait_for_text(const char* text) { return test_tmux_wait_for_text(tmux_socket, "restore", text, 20000); }
static bool alternate_screen_on(void) { return test_tmux_alternate_screen_on(tmux_socket, "restore"); }

typedef struct pane_files {
    char rc[512];   // "rc=N" from the shell after the command ended
    char stty[512]; // stty -a after it ended
} pane_files;

// Starts `servelab <subcommand> ...` in a fresh 160x50 session. After it
// ends the shell writes its status, waits a second (the watcher restores
// the terminal from another process, just after the shell sees the death),
// saves `stty -a`, prints a marker and stays so the pane can be read.
static void start_pane(const char* command_arguments, pane_files* files) {
    static int runs = 0;
    runs++;
    snprintf(tmux_socket, sizeof tmux_socket, "servelab-restore-%d-%d", (int)getpid(), runs);
    snprintf(files->rc, sizeof files->rc, "%s/rc-%d.txt", test_scratch_dir(), runs);
    snprintf(files->stty, sizeof files->stty, "%s/stty-%d.txt", test_scratch_dir(), runs);
    remove(files->rc);
    remove(files->stty);
    char arguments[4096];
    // \$? reaches the pane's shell as $? (the outer shell leaves it alone).
    snprintf(arguments, sizeof arguments,
             "-f /dev/null new-session -d -s restore -x 160 -y 50 \"sh -c 'XDG_DATA_HOME=%s %s %s; "
             "echo rc=\\$? > %s; sleep 1; stty -a > %s; echo PANE-DONE; sleep 60'\"",
             test_scratch_dir(), test_servelab_binary(), command_arguments, files->rc, files->stty);
    assert_int_equal(tmux(arguments), 0);
}

static void start_lab(pane_files* files) {
    static int labs = 0;
    snprintf(run_marker, sizeof run_marker, "restore-run-%d-%ld-%d", (int)getpid(), (long)time(NULL), ++labs);
    char arguments[512];
    snprintf(arguments, sizeof arguments, "lab --model tiny --system %s", run_marker);
    start_pane(arguments, files);
}

static int stop_server(void** state) {
    (void)state;
    tmux("kill-server");
    return 0;
}

static char* read_proc_text(const char* pid, const char* file, size_t* length) {
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/%s", pid, file);
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    static char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    if (length) *length = n;
    return text;
}

// The pid of the process whose command line holds run_marker and `word`
// (" lab " or " quiz "), not the `sh -c` around it; -1 when none.
static pid_t find_process(const char* word) {
    DIR* proc = opendir("/proc");
    assert_non_null(proc);
    pid_t found = -1;
    for (struct dirent* entry; (entry = readdir(proc)) != NULL && found < 0;) {
        size_t n = 0;
        char* cmdline = read_proc_text(entry->d_name, "cmdline", &n);
        if (!cmdline) continue;
        for (size_t i = 0; i < n; i++)
            if (cmdline[i] == '\0') cmdline[i] = ' ';
        if (strstr(cmdline, run_marker) && strstr(cmdline, word) && !strstr(cmdline, "stty"))
            found = (pid_t)atoi(entry->d_name);
    }
    closedir(proc);
    return found;
}

// The watcher child of `parent`: a process named servelab-terminal-watcher
// whose parent is `parent`; -1 when there is none.
static pid_t find_watcher(pid_t parent) {
    DIR* proc = opendir("/proc");
    assert_non_null(proc);
    pid_t found = -1;
    for (struct dirent* entry; (entry = readdir(proc)) != NULL && found < 0;) {
        char* cmdline = read_proc_text(entry->d_name, "cmdline", NULL);
        if (!cmdline || strcmp(cmdline, "servelab-terminal-watcher") != 0) continue;
        char* stat = read_proc_text(entry->d_name, "stat", NULL);
        char* after_name = stat ? strrchr(stat, ')') : NULL;
        char state = 0;
        int ppid = -1;
        if (after_name && sscanf(after_name + 1, " %c %d", &state, &ppid) == 2 && ppid == (int)parent && state != 'Z')
            found = (pid_t)atoi(entry->d_name);
    }
    closedir(proc);
    return found;
}

static bool process_alive(pid_t pid) {
    char name[32];
    snprintf(name, sizeof name, "%d", (int)pid);
    char* stat = read_proc_text(name, "stat", NULL);
    if (!stat) return false;
    char* after_name = strrchr(stat, ')');
    return after_name && after_name[1] == ' ' && after_name[2] != 'Z';
}

// After the command ended: its exit status, the pane off the alternate
// screen, and the tty in cooked mode (canonical, echo).
static void assert_ended_restored(const pane_files* files, int expected_status, const char* how) {
    free(wait_for_text("PANE-DONE"));
    char expected[32];
    snprintf(expected, sizeof expected, "rc=%d\n", expected_status);
    char* rc = test_read_text(files->rc);
    if (strcmp(rc, expected) != 0) fail_msg("%s: expected exit status %d, the shell saw '%s'", how, expected_status, rc);
    free(rc);
    if (alternate_screen_on()) fail_msg("%s: the pane is still on the alternate screen", how);
    char* stty = test_read_text(files->stty);
    if (!strstr(stty, " icanon") || strstr(stty, "-icanon") || !strstr(stty, " echo ") || strstr(stty, " -echo "))
        fail_msg("%s: the terminal was left in curses mode:\n%s", how, stty);
    free(stty);
}

// The lab signalled while running: restored, status 128 + signal.
static void check_lab_signal(int signal_number, const char* name) {
    skip_without_tmux();
    pane_files files;
    start_lab(&files);
    free(wait_for_text("step 0"));
    assert_int_equal(tmux("send-keys -t restore r"), 0); // running: the signal arrives mid-run
    free(wait_for_text("RUNNING"));
    assert_true(alternate_screen_on());
    pid_t pid = find_process(" lab ");
    assert_true(pid > 0);
    assert_int_equal(kill(pid, signal_number), 0);
    assert_ended_restored(&files, 128 + signal_number, name);
}

static void test_lab_sigquit_restores_and_exits_131(void** state) {
    (void)state;
    check_lab_signal(SIGQUIT, "SIGQUIT");
}

static void test_lab_sigterm_exits_143(void** state) {
    (void)state;
    check_lab_signal(SIGTERM, "SIGTERM");
}

static void test_lab_sigint_exits_130(void** state) {
    (void)state;
    check_lab_signal(SIGINT, "SIGINT");
}

static void test_lab_sighup_exits_129(void** state) {
    (void)state;
    check_lab_signal(SIGHUP, "SIGHUP");
}

// SIGKILL: no handler runs; the watcher gives the terminal back.
static void test_lab_sigkill_terminal_restored_by_watcher(void** state) {
    (void)state;
    skip_without_tmux();
    pane_files files;
    start_lab(&files);
    free(wait_for_text("step 0"));
    assert_true(alternate_screen_on());
    pid_t pid = find_process(" lab ");
    assert_true(pid > 0);
    pid_t watcher = find_watcher(pid);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_ended_restored(&files, 128 + SIGKILL, "SIGKILL");
    if (watcher <= 0) fail_msg("no servelab-terminal-watcher child of the lab (pid %d)", (int)pid);
    assert_false(process_alive(watcher)); // its work done, it exited
}

// A normal quit: status 0, and the watcher ends with the lab, silently.
static void test_lab_quit_ends_the_watcher(void** state) {
    (void)state;
    skip_without_tmux();
    pane_files files;
    start_lab(&files);
    free(wait_for_text("step 0"));
    pid_t pid = find_process(" lab ");
    assert_true(pid > 0);
    pid_t watcher = find_watcher(pid);
    if (watcher <= 0) fail_msg("no servelab-terminal-watcher child of the lab (pid %d)", (int)pid);
    assert_int_equal(tmux("send-keys -t restore q"), 0);
    assert_ended_restored(&files, 0, "q");
    assert_false(process_alive(watcher));
}

// Ctrl-C while a lesson is busy inside one long library call (a
// backtracking pattern the time check cannot enter, with a 600 s limit):
// the lesson is stopped from outside the interpreter, the key loop gets
// back, and the lab exits 130 with the terminal restored, in seconds.
static void test_lab_ctrl_c_stops_a_busy_lesson(void** state) {
    (void)state;
    skip_without_tmux();
    char lesson_path[512];
    snprintf(lesson_path, sizeof lesson_path, "%s/busy-lesson.lua", test_scratch_dir());
    const char* busy = "lab.lesson{title = 'busy', claims = {'b1'}}\n"
                       "string.find(string.rep('a', 60), string.rep('a-', 30) .. 'b')\n";
    assert_true(test_write_file(lesson_path, busy, strlen(busy)));
    pane_files files;
    snprintf(run_marker, sizeof run_marker, "restore-busy-%d-%ld", (int)getpid(), (long)time(NULL));
    char arguments[1200];
    snprintf(arguments, sizeof arguments, "lab --model tiny --system %s --lesson %s --time-limit 600", run_marker,
             lesson_path);
    start_pane(arguments, &files);
    free(wait_for_text("space starts the lesson"));
    assert_int_equal(tmux("send-keys -t restore Space"), 0);
    pid_t pid = find_process(" lab ");
    assert_true(pid > 0);
    // Busy: the lab's CPU clock moves while the lesson backtracks.
    sleep_ms(1500);
    assert_true(process_alive(pid));
    struct timespec sent, ended;
    clock_gettime(CLOCK_MONOTONIC, &sent);
    // What Ctrl-C sends the lab (tmux's C-c would also reach the pane's
    // non-interactive sh, which an interactive shell ignores).
    assert_int_equal(kill(pid, SIGINT), 0);
    assert_ended_restored(&files, 128 + SIGINT, "Ctrl-C during a busy lesson");
    clock_gettime(CLOCK_MONOTONIC, &ended);
    double seconds = (double)(ended.tv_sec - sent.tv_sec) + (double)(ended.tv_nsec - sent.tv_nsec) * 1e-9;
    print_message("Ctrl-C to restored terminal: %.1f s (the pane's shell sleeps 1 s before stty)\n", seconds);
    assert_true(seconds < 20.0); // the lesson's own limit was 600 s
}

// The quiz's full-screen view: SIGQUIT (Ctrl-\ in the terminal) restores it too.
static void test_quiz_sigquit_restores_and_exits_131(void** state) {
    (void)state;
    skip_without_tmux();
    pane_files files;
    static int quizzes = 0;
    // The seed is the marker: unique per run, and harmless to the quiz.
    snprintf(run_marker, sizeof run_marker, "%d%03d", (int)getpid() % 100000, ++quizzes);
    char arguments[512];
    snprintf(arguments, sizeof arguments, "quiz --quiz-dir quiz --n 3 --seed %s", run_marker);
    start_pane(arguments, &files);
    free(wait_for_text("question 1 of 3"));
    assert_true(alternate_screen_on());
    pid_t pid = find_process(" quiz ");
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGQUIT), 0);
    assert_ended_restored(&files, 128 + SIGQUIT, "quiz SIGQUIT");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_lab_sigquit_restores_and_exits_131, stop_server),
        cmocka_unit_test_teardown(test_lab_sigterm_exits_143, stop_server),
        cmocka_unit_test_teardown(test_lab_sigint_exits_130, stop_server),
        cmocka_unit_test_teardown(test_lab_sighup_exits_129, stop_server),
        cmocka_unit_test_teardown(test_lab_sigkill_terminal_restored_by_watcher, stop_server),
        cmocka_unit_test_teardown(test_lab_quit_ends_the_watcher, stop_server),
        cmocka_unit_test_teardown(test_quiz_sigquit_restores_and_exits_131, stop_server),
        cmocka_unit_test_teardown(test_lab_ctrl_c_stops_a_busy_lesson, stop_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
