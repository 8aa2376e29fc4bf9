// Progress: Leitner boxes and due dates, the file format, numbers out of
// range, bad lines skipped and reported, corrupt and foreign files moved
// aside, a folder at the path, the XDG path, atomic saves that a SIGKILL in
// the middle never leaves truncated, and "Progress saved" only after a write.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lab/quiz/progress.h"
#include "tests/test_support.h"

static const int64_t DAY = 86400;

static void test_leitner_boxes(void** state) {
    (void)state;
    quiz_progress p = {0};
    error_info err = {{0}};
    int64_t t = 1000000;
    assert_true(quiz_record_due(NULL, t)); // never seen: due
    assert_int_equal(quiz_progress_record(&p, "tf1", true, t, &err), 0);
    const quiz_record* r = quiz_progress_find(&p, "tf1");
    assert_int_equal(r->box, 2); // new and right: skips box 1
    assert_false(quiz_record_due(r, t + DAY - 1));
    assert_true(quiz_record_due(r, t + DAY));
    int expected_boxes[] = {3, 4, 5, 5};
    int64_t expected_waits[] = {3 * DAY, 7 * DAY, 16 * DAY, 16 * DAY};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(quiz_progress_record(&p, "tf1", true, t, &err), 0);
        r = quiz_progress_find(&p, "tf1");
        assert_int_equal(r->box, expected_boxes[i]);
        assert_false(quiz_record_due(r, t + expected_waits[i] - 1));
        assert_true(quiz_record_due(r, t + expected_waits[i]));
    }
    assert_int_equal(quiz_progress_record(&p, "tf1", false, t + 5, &err), 0);
    r = quiz_progress_find(&p, "tf1");
    assert_int_equal(r->box, 1); // wrong: back to the first box, due at once
    assert_true(quiz_record_due(r, t + 5));
    assert_int_equal(r->n_correct, 5);
    assert_int_equal(r->n_wrong, 1);
    assert_int_equal(r->last_seen, t + 5);
    assert_int_equal(quiz_progress_record(&p, "has space", true, t, &err), -1);
    quiz_progress_free(&p);
}

static void scratch_path(char* out, size_t capacity, const char* name) {
    snprintf(out, capacity, "%s/%s", test_scratch_dir(), name);
}

static void test_save_and_load_round_trip(void** state) {
    (void)state;
    char path[512];
    scratch_path(path, sizeof path, "nested/dir/progress");
    unlink(path);
    quiz_progress p = {0}, loaded;
    error_info err = {{0}};
    char warning[1024];
    assert_int_equal(quiz_progress_load(path, &loaded, warning, sizeof warning, &err), 0); // missing: empty
    assert_int_equal(loaded.n_records, 0);
    assert_string_equal(warning, "");
    quiz_progress_record(&p, "tf1", true, 1700000000, &err);
    quiz_progress_record(&p, "drill-kv-size", false, 1700000100, &err);
    quiz_progress_record(&p, "drill-kv-size", true, 1700000200, &err);
    assert_int_equal(quiz_progress_save(path, &p, &err), 0);
    assert_int_equal(quiz_progress_load(path, &loaded, warning, sizeof warning, &err), 0);
    assert_string_equal(warning, "");
    assert_int_equal(loaded.n_records, 2);
    const quiz_record* r = quiz_progress_find(&loaded, "drill-kv-size");
    assert_int_equal(r->box, 2);
    assert_int_equal(r->n_correct, 1);
    assert_int_equal(r->n_wrong, 1);
    assert_int_equal(r->last_seen, 1700000200);
    char* text = test_read_text(path);
    assert_true(strncmp(text, "servelab-quiz-progress 1\n", 25) == 0);
    assert_non_null(strstr(text, "\ntf1 2 1 0 1700000000\n"));
    free(text);
    quiz_progress_free(&p);
    quiz_progress_free(&loaded);
}

static void expect_parse_error(const char* text, const char* expected) {
    quiz_progress p;
    error_info err = {{0}};
    assert_int_equal(quiz_progress_parse(text, strlen(text), &p, NULL, &err), -1);
    if (!strstr(err.message, expected)) fail_msg("expected '%s' in: %s", expected, err.message);
    assert_null(p.records);
}

static void test_parse_is_strict(void** state) {
    (void)state;
    expect_parse_error("", "not a servelab progress file");
    expect_parse_error("{\"json\": true}\n", "not a servelab progress file");
    expect_parse_error("servelab-quiz-progress 2\n", "not a servelab progress file");
    expect_parse_error("servelab-quiz-progress 1\ntf1 2 1 0 17", "truncated");
    expect_parse_error("servelab-quiz-progress 1\ntf1 2 1 0\n", "line 2: expected");
    expect_parse_error("servelab-quiz-progress 1\n# c\ntf1 9 1 0 5\n", "line 3");
    expect_parse_error("servelab-quiz-progress 1\ntf1 2 1 0 5 extra\n", "line 2");
    expect_parse_error("servelab-quiz-progress 1\ntf1 2 -1 0 5\n", "line 2");
    expect_parse_error("servelab-quiz-progress 1\ntf1 2 1 0 5\ntf1 2 1 0 5\n", "appears twice");
    const char with_nul[] = "servelab-quiz-progress 1\ntf1\0 2 1 0 5\n";
    quiz_progress p;
    error_info err = {{0}};
    assert_int_equal(quiz_progress_parse(with_nul, sizeof with_nul - 1, &p, NULL, &err), -1);
    assert_non_null(strstr(err.message, "NUL"));
    const char* good = "servelab-quiz-progress 1\n# id box correct wrong last_seen\n\ntf1 2 1 0 5\nse3 1 0 2 7\n";
    assert_int_equal(quiz_progress_parse(good, strlen(good), &p, NULL, &err), 0);
    assert_int_equal(p.n_records, 2);
    quiz_progress_free(&p);
}

// The files in the scratch folder whose names start with `prefix`.
static int count_files(const char* dir_path, const char* prefix, char* last, size_t capacity) {
    DIR* dir = opendir(dir_path);
    int n = 0;
    struct dirent* e;
    while (dir && (e = readdir(dir)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            n++;
            snprintf(last, capacity, "%s/%s", dir_path, e->d_name);
        }
    if (dir) closedir(dir);
    return n;
}

static void test_corrupt_and_foreign_files_are_moved_aside(void** state) {
    (void)state;
    const char* contents[] = {
        "servelab-quiz-progress 1\ntf1 2 1 0 1700000000\ntf2 3 1", // torn: no final newline
        "[Desktop Entry]\nName=something else\n",                  // foreign
    };
    char dir[512];
    for (int k = 0; k < 2; k++) {
        snprintf(dir, sizeof dir, "%s/corrupt%d", test_scratch_dir(), k);
        mkdir(dir, 0755);
        char path[600], aside[800];
        snprintf(path, sizeof path, "%s/progress", dir);
        assert_true(test_write_file(path, contents[k], strlen(contents[k])));
        quiz_progress p;
        error_info err = {{0}};
        char warning[2048];
        assert_int_equal(quiz_progress_load(path, &p, warning, sizeof warning, &err), 0);
        assert_int_equal(p.n_records, 0); // fresh
        assert_int_equal(count_files(dir, "progress.corrupt-", aside, sizeof aside), 1);
        // The warning names the file, what was wrong, and where it went.
        assert_non_null(strstr(warning, path));
        assert_non_null(strstr(warning, k == 0 ? "truncated" : "not a servelab progress file"));
        assert_non_null(strstr(warning, aside));
        assert_int_equal(access(path, F_OK), -1);
        char* kept = test_read_text(aside);
        assert_string_equal(kept, contents[k]); // moved, not changed
        free(kept);
        // The fresh progress saves over the old name.
        quiz_progress_record(&p, "tf1", true, 5, &err);
        assert_int_equal(quiz_progress_save(path, &p, &err), 0);
        quiz_progress_free(&p);
        assert_int_equal(quiz_progress_load(path, &p, warning, sizeof warning, &err), 0);
        assert_string_equal(warning, "");
        assert_int_equal(p.n_records, 1);
        quiz_progress_free(&p);
    }
}

// Every number is range-checked, not wrapped: sscanf("%d") stored a count
// of 99999999999 as 1215752191, and a last_seen near INT64_MAX overflowed
// last_seen + interval.
static void test_numbers_out_of_range_are_rejected(void** state) {
    (void)state;
    expect_parse_error("servelab-quiz-progress 1\ntf1 2 99999999999 0 5\n",
                       "line 2: correct '99999999999' is out of range (0..2147483647)");
    expect_parse_error("servelab-quiz-progress 1\ntf1 2 1 2147483648 5\n", "line 2: wrong '2147483648' is out of range");
    expect_parse_error("servelab-quiz-progress 1\ntf1 2 1 0 9223372036854775807\n",
                       "line 2: last_seen '9223372036854775807' is out of range (0..253402300799, the end of year 9999)");
    expect_parse_error("servelab-quiz-progress 1\ntf1 2 1 0 99999999999999999999999\n", // beyond int64
                       "last_seen '99999999999999999999999' is out of range");
    expect_parse_error("servelab-quiz-progress 1\ntf1 2 1 0 253402300800\n", "last_seen '253402300800' is out of range");
    expect_parse_error("servelab-quiz-progress 1\ntf1 2 1 0 -1\n", "last_seen '-1' is out of range");
    expect_parse_error("servelab-quiz-progress 1\ntf1 4294967298 1 0 5\n", "box '4294967298' is out of range (0..5)");
    expect_parse_error("servelab-quiz-progress 1\ntf1 2 1e3 0 5\n", "correct '1e3' is not a whole number");
    expect_parse_error("servelab-quiz-progress 1\ntf1 2 +3 0 5\n", "correct '+3' is not a whole number");
    // The largest values that fit are kept exactly.
    const char* edge = "servelab-quiz-progress 1\ntf1 5 2147483647 2147483647 253402300799\n";
    quiz_progress p;
    error_info err = {{0}};
    assert_int_equal(quiz_progress_parse(edge, strlen(edge), &p, NULL, &err), 0);
    assert_int_equal(p.records[0].n_correct, INT_MAX);
    assert_int_equal(p.records[0].n_wrong, INT_MAX);
    assert_true(p.records[0].last_seen == INT64_C(253402300799));
    // Counting on from INT_MAX stops there instead of wrapping negative.
    assert_int_equal(quiz_progress_record(&p, "tf1", true, 10, &err), 0);
    assert_int_equal(quiz_progress_record(&p, "tf1", false, 10, &err), 0);
    assert_int_equal(p.records[0].n_correct, INT_MAX);
    assert_int_equal(p.records[0].n_wrong, INT_MAX);
    quiz_progress_free(&p);
    // A record built in memory with a huge last_seen is not due: the sum
    // last_seen + 16 days would wrap to the distant past.
    quiz_record far = {"tf1", QUIZ_MAX_BOX, 1, 0, INT64_MAX - 10};
    assert_false(quiz_record_due(&far, 0));
    assert_false(quiz_record_due(&far, INT64_MAX - 11));
}

// One bad line used to set aside the whole file, good records and all.
static void test_bad_lines_are_skipped_and_reported(void** state) {
    (void)state;
    const char* text = "servelab-quiz-progress 1\n"
                       "tf1 2 1 0 1700000000\n"
                       "tf2 3 99999999999 0 1700000000\n" // line 3: the first bad one
                       "se1 1 0 2 1700000100\n"
                       "tf1 5 9 9 1700000200\n" // line 5: tf1 again; the first is kept
                       "why1 2 1 0\n"           // line 6: a field missing
                       "why2 9 1 0 1700000300\n"
                       "ok2 4 2 0 1700000400\n";
    quiz_progress p;
    quiz_progress_skipped skipped;
    error_info err = {{0}};
    assert_int_equal(quiz_progress_parse(text, strlen(text), &p, &skipped, &err), 0);
    assert_int_equal(p.n_records, 3);
    assert_non_null(quiz_progress_find(&p, "tf1"));
    assert_non_null(quiz_progress_find(&p, "se1"));
    assert_non_null(quiz_progress_find(&p, "ok2"));
    assert_int_equal(quiz_progress_find(&p, "tf1")->box, 2);
    assert_int_equal(skipped.n_lines, 4);
    assert_int_equal(skipped.first_line, 3);
    assert_string_equal(skipped.first_problem, "correct '99999999999' is out of range (0..2147483647)");
    quiz_progress_free(&p);

    // Through the file: the good records load, the warning is one line
    // naming file:line and field, and the file as it was is kept aside.
    char dir[512], path[600], aside[800];
    snprintf(dir, sizeof dir, "%s/badlines", test_scratch_dir());
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/progress", dir);
    assert_true(test_write_file(path, text, strlen(text)));
    char warning[2048];
    assert_int_equal(quiz_progress_load(path, &p, warning, sizeof warning, &err), 0);
    assert_int_equal(p.n_records, 3);
    char expected[700];
    snprintf(expected, sizeof expected, "%s:3: correct '99999999999' is out of range (0..2147483647)", path);
    if (strncmp(warning, expected, strlen(expected)) != 0) fail_msg("expected '%s' first in: %s", expected, warning);
    assert_non_null(strstr(warning, "skipped that line (and 3 more bad lines), kept 3 good records"));
    assert_null(strchr(warning, '\n'));
    assert_int_equal(count_files(dir, "progress.corrupt-", aside, sizeof aside), 1);
    assert_non_null(strstr(warning, aside));
    char* kept = test_read_text(aside);
    assert_string_equal(kept, text);
    free(kept);
    char* unchanged = test_read_text(path); // left in place, not moved aside
    assert_string_equal(unchanged, text);
    free(unchanged);
    // The next save keeps the good records and drops the bad lines.
    assert_int_equal(quiz_progress_save(path, &p, &err), 0);
    quiz_progress_free(&p);
    assert_int_equal(quiz_progress_load(path, &p, warning, sizeof warning, &err), 0);
    assert_string_equal(warning, "");
    assert_int_equal(p.n_records, 3);
    quiz_progress_free(&p);
}

// A folder at the progress path: read() fails with EISDIR, which came out
// as "Input/output error".
static void test_directory_at_the_path_is_named(void** state) {
    (void)state;
    char parent[512], path[600], expected[700];
    scratch_path(parent, sizeof parent, "folder-here");
    mkdir(parent, 0755);
    snprintf(path, sizeof path, "%s/progress", parent);
    mkdir(path, 0755);
    snprintf(expected, sizeof expected, "%s is a directory", path);
    quiz_progress p = {0};
    error_info err = {{0}};
    char warning[1024];
    assert_int_equal(quiz_progress_load(path, &p, warning, sizeof warning, &err), -1);
    assert_string_equal(err.message, expected);
    quiz_progress_record(&p, "tf1", true, 5, &err);
    error_clear(&err);
    assert_int_equal(quiz_progress_save(path, &p, &err), -1);
    assert_string_equal(err.message, expected);
    quiz_progress_free(&p);
    struct stat info;
    assert_int_equal(stat(path, &info), 0);
    assert_true(S_ISDIR(info.st_mode)); // untouched
}

// Issue 46 item 9: links planted at the save's temporary names (the old
// path.tmp-<pid> and output_file's path.tmp.<pid>) or at the progress path
// itself never get the victim written: the save used O_TRUNC through them.
static void test_planted_links_are_not_written_through(void** state) {
    (void)state;
    char victim[512], path[512], old_temporary[600], temporary[600];
    scratch_path(victim, sizeof victim, "progress-victim");
    scratch_path(path, sizeof path, "progress-linked");
    snprintf(old_temporary, sizeof old_temporary, "%s.tmp-%ld", path, (long)getpid());
    snprintf(temporary, sizeof temporary, "%s.tmp.%ld", path, (long)getpid());
    assert_true(test_write_file(victim, "victim\n", 7));
    unlink(path);
    unlink(old_temporary);
    unlink(temporary);
    assert_int_equal(symlink(/* relative to the link's folder, which holds it */ "progress-victim", old_temporary), 0);
    assert_int_equal(symlink("progress-victim", temporary), 0);
    quiz_progress p = {0};
    error_info err = {{0}};
    quiz_progress_record(&p, "tf1", true, 5, &err);
    assert_int_equal(quiz_progress_save(path, &p, &err), 0);
    char* text = test_read_text(victim);
    assert_string_equal(text, "victim\n");
    free(text);
    struct stat info;
    assert_int_equal(lstat(path, &info), 0);
    assert_true(S_ISREG(info.st_mode));
    unlink(old_temporary);
    unlink(temporary);

    unlink(path);
    assert_int_equal(symlink("progress-victim", path), 0);
    assert_int_equal(quiz_progress_save(path, &p, &err), -1);
    assert_non_null(strstr(err.message, "is a symbolic link"));
    text = test_read_text(victim);
    assert_string_equal(text, "victim\n");
    free(text);
    unlink(path);
    quiz_progress_free(&p);
}

// ---- through the servelab binary -------------------------------------------------------------

// An empty XDG_DATA_HOME under the scratch folder. Absolute: a relative
// XDG_DATA_HOME is ignored (by the XDG spec), and the quiz would write to
// the real ~/.local/share instead.
static const char* fresh_home(char* buffer, size_t capacity, const char* name) {
    const char* scratch = test_scratch_dir();
    char cwd[512] = "";
    if (scratch[0] != '/') assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(buffer, capacity, "%s%s%s/home-%s", cwd, cwd[0] ? "/" : "", scratch, name);
    char command[1200];
    snprintf(command, sizeof command, "rm -rf '%s'", buffer);
    assert_int_equal(system(command), 0);
    assert_int_equal(mkdir(buffer, 0755), 0);
    return buffer;
}

// Runs `servelab quiz --plain` (one drill) with XDG_DATA_HOME=home on pipes.
// Once the progress is loaded (the first prompt is out), `before_answer`
// runs (may be NULL), then `answers` is typed and stdin closed. Returns the
// exit status; *out gets stdout and stderr together (malloc'ed).
static int run_plain_quiz(const char* home, void (*before_answer)(const char* home), const char* answers,
                          char** out) {
    int to_child[2], from_child[2];
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        dup2(to_child[0], STDIN_FILENO);
        dup2(from_child[1], STDOUT_FILENO);
        dup2(from_child[1], STDERR_FILENO);
        close(to_child[1]);
        close(from_child[0]);
        setenv("XDG_DATA_HOME", home, 1);
        execl(test_servelab_binary(), test_servelab_binary(), "quiz", "--plain", "--only", "drills", "--n", "1",
              "--seed", "1", (char*)NULL);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    size_t capacity = 1 << 16, used = 0;
    char* text = calloc(1, capacity);
    bool answered = false;
    for (;;) {
        if (!answered && strstr(text, "> ")) {
            if (before_answer) before_answer(home);
            assert_true(write(to_child[1], answers, strlen(answers)) == (ssize_t)strlen(answers));
            close(to_child[1]);
            answered = true;
        }
        ssize_t got = read(from_child[0], text + used, capacity - used - 1);
        if (got <= 0) break;
        used += (size_t)got;
    }
    if (!answered) close(to_child[1]);
    close(from_child[0]);
    int status = 0;
    waitpid(child, &status, 0);
    *out = text;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A folder takes the progress file's place after the load: the save fails.
static void put_folder_at_progress_path(const char* home) {
    char path[1200];
    snprintf(path, sizeof path, "%s/servelab/progress", home);
    assert_int_equal(mkdir(path, 0755), 0);
}

// "Progress saved to" was printed after a session with nothing answered
// (no file written) and after a failed save.
static void test_progress_saved_only_after_a_write(void** state) {
    (void)state;
    char home[1024], path[1200], *out = NULL;
    // Answered and written: saved.
    fresh_home(home, sizeof home, "written");
    snprintf(path, sizeof path, "%s/servelab/progress", home);
    assert_int_equal(run_plain_quiz(home, NULL, "0\n", &out), 0);
    if (!strstr(out, "Progress saved to")) fail_msg("no 'Progress saved to' in:\n%s", out);
    assert_int_equal(access(path, F_OK), 0);
    free(out);
    // Nothing answered: nothing written, and it says so.
    fresh_home(home, sizeof home, "nothing");
    snprintf(path, sizeof path, "%s/servelab/progress", home);
    assert_int_equal(run_plain_quiz(home, NULL, "", &out), 0);
    if (strstr(out, "Progress saved")) fail_msg("nothing was written, yet:\n%s", out);
    assert_non_null(strstr(out, "Nothing answered, so nothing saved"));
    assert_int_equal(access(path, F_OK), -1);
    free(out);
    // The save fails.
    fresh_home(home, sizeof home, "failed");
    snprintf(path, sizeof path, "%s/servelab", home);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/servelab/progress", home);
    assert_int_equal(run_plain_quiz(home, put_folder_at_progress_path, "0\n", &out), 0);
    if (strstr(out, "Progress saved")) fail_msg("the save failed, yet:\n%s", out);
    char expected[1400];
    snprintf(expected, sizeof expected, "servelab quiz: warning: %s is a directory\n", path);
    if (!strstr(out, expected)) fail_msg("expected '%s' in:\n%s", expected, out);
    assert_non_null(strstr(out, "Progress NOT saved to"));
    free(out);
}

// A bad line reaches the student as one line on stderr naming the file,
// the line and the field; the good records still count.
static void test_cli_reports_a_bad_line(void** state) {
    (void)state;
    char home[1024], dir[1100], path[1200];
    fresh_home(home, sizeof home, "bad-line");
    snprintf(dir, sizeof dir, "%s/servelab", home);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/progress", dir);
    const char* text = "servelab-quiz-progress 1\ntf1 2 1 0 1700000000\ntf2 2 1 0 9223372036854775807\n";
    assert_true(test_write_file(path, text, strlen(text)));
    char* saved_xdg = getenv("XDG_DATA_HOME") ? strdup(getenv("XDG_DATA_HOME")) : NULL;
    setenv("XDG_DATA_HOME", home, 1); // run_servelab's child inherits it
    command_result result = run_servelab("quiz --stats");
    if (saved_xdg) setenv("XDG_DATA_HOME", saved_xdg, 1);
    else unsetenv("XDG_DATA_HOME");
    free(saved_xdg);
    assert_int_equal(result.exit_status, 0);
    char expected[4096];
    snprintf(expected, sizeof expected,
             "servelab quiz: warning: %s:3: last_seen '9223372036854775807' is out of range "
             "(0..253402300799, the end of year 9999); skipped that line, kept 1 good record; "
             "the file as it was is copied to %s.corrupt-",
             path, path);
    if (strncmp(result.err, expected, strlen(expected)) != 0) fail_msg("expected '%s' in:\n%s", expected, result.err);
    const char* newline = strchr(result.err, '\n');
    assert_non_null(newline);
    assert_string_equal(newline + 1, ""); // one line
    // tf1 was kept: one item seen, answered right once.
    if (!strstr(result.out, "all                47      1        1        0"))
        fail_msg("tf1 not counted in:\n%s", result.out);
    free_result(&result);
}

static void test_default_path_follows_xdg(void** state) {
    (void)state;
    char path[1024], *saved_xdg = getenv("XDG_DATA_HOME") ? strdup(getenv("XDG_DATA_HOME")) : NULL;
    char* saved_home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    error_info err = {{0}};
    setenv("XDG_DATA_HOME", "/data/home", 1);
    setenv("HOME", "/home/student", 1);
    assert_int_equal(quiz_progress_default_path(path, sizeof path, &err), 0);
    assert_string_equal(path, "/data/home/servelab/progress");
    setenv("XDG_DATA_HOME", "relative/dir", 1); // invalid by the spec: ignored
    assert_int_equal(quiz_progress_default_path(path, sizeof path, &err), 0);
    assert_string_equal(path, "/home/student/.local/share/servelab/progress");
    unsetenv("XDG_DATA_HOME");
    assert_int_equal(quiz_progress_default_path(path, sizeof path, &err), 0);
    assert_string_equal(path, "/home/student/.local/share/servelab/progress");
    unsetenv("HOME");
    assert_int_equal(quiz_progress_default_path(path, sizeof path, &err), -1);
    if (saved_xdg) setenv("XDG_DATA_HOME", saved_xdg, 1);
    if (saved_home) setenv("HOME", saved_home, 1);
    free(saved_xdg);
    free(saved_home);
}

// A child saves a large progress file over and over; it is killed at
// random moments. After every kill the file must parse and hold every
// record: a save is all or nothing.
enum { KILL_RECORDS = 3000, KILLS = 12 }; // about 80 KB per save

static void test_kill_mid_write_never_truncates(void** state) {
    (void)state;
    char path[512];
    scratch_path(path, sizeof path, "killed/progress");
    unlink(path);
    srand(12345);
    // Built once here (the children inherit it): by parsing, which is linear.
    size_t capacity = 64 + (size_t)KILL_RECORDS * 48, used = 0;
    char* text = malloc(capacity);
    used += (size_t)snprintf(text, capacity, "servelab-quiz-progress 1\n");
    for (int i = 0; i < KILL_RECORDS; i++)
        used += (size_t)snprintf(text + used, capacity - used, "item-%d %d %d %d %d\n", i, i % 6, i % 3, i % 5,
                                 1700000000 + i);
    quiz_progress records;
    error_info parse_err = {{0}};
    if (quiz_progress_parse(text, used, &records, NULL, &parse_err)) fail_msg("%s", parse_err.message);
    free(text);
    for (int kill_number = 0; kill_number < KILLS; kill_number++) {
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            quiz_progress p = records;
            error_info err = {{0}};
            for (int64_t round = 0;; round++) {
                p.records[0].last_seen = round; // each save differs a little
                if (quiz_progress_save(path, &p, &err)) _exit(3);
            }
        }
        // Let it complete at least one save, then kill it at a random point.
        while (access(path, F_OK) != 0)
            usleep(1000);
        struct timespec pause = {0, (long)(rand() % 20000) * 1000L};
        nanosleep(&pause, NULL);
        kill(child, SIGKILL);
        int status = 0;
        waitpid(child, &status, 0);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        quiz_progress p;
        error_info err = {{0}};
        char warning[2048];
        assert_int_equal(quiz_progress_load(path, &p, warning, sizeof warning, &err), 0);
        if (warning[0]) fail_msg("kill %d: %s", kill_number, warning);
        assert_int_equal(p.n_records, KILL_RECORDS);
        quiz_progress_free(&p);
    }
    quiz_progress_free(&records);
}

// Run by hand (not by `make test`, which sets SERVELAB_BIN), the CLI tests
// should drive the servelab of this test's own build (<build>/tests/lab/quiz/ ->
// <build>/bin/servelab), not whatever bin/servelab holds.
static void default_to_this_builds_servelab(void) {
    if (getenv("SERVELAB_BIN")) return;
    char self[1024], servelab[1100];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return;
    self[n] = '\0';
    char* tests = strstr(self, "/tests/lab/");
    if (!tests) return;
    *tests = '\0';
    snprintf(servelab, sizeof servelab, "%s/bin/servelab", self);
    if (access(servelab, X_OK) == 0) setenv("SERVELAB_BIN", servelab, 1);
}

int main(void) {
    default_to_this_builds_servelab();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leitner_boxes),
        cmocka_unit_test(test_save_and_load_round_trip),
        cmocka_unit_test(test_parse_is_strict),
        cmocka_unit_test(test_numbers_out_of_range_are_rejected),
        cmocka_unit_test(test_bad_lines_are_skipped_and_reported),
        cmocka_unit_test(test_directory_at_the_path_is_named),
        cmocka_unit_test(test_planted_links_are_not_written_through),
        cmocka_unit_test(test_corrupt_and_foreign_files_are_moved_aside),
        cmocka_unit_test(test_default_path_follows_xdg),
        cmocka_unit_test(test_kill_mid_write_never_truncates),
        cmocka_unit_test(test_progress_saved_only_after_a_write),
        cmocka_unit_test(test_cli_reports_a_bad_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
