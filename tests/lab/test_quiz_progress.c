// Progress: Leitner boxes and due dates, the file format, corrupt and
// foreign files moved aside, the XDG path, and atomic saves that a
// SIGKILL in the middle never leaves truncated.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lab/quiz_progress.h"
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
    assert_int_equal(quiz_progress_parse(text, strlen(text), &p, &err), -1);
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
    assert_int_equal(quiz_progress_parse(with_nul, sizeof with_nul - 1, &p, &err), -1);
    assert_non_null(strstr(err.message, "NUL"));
    const char* good = "servelab-quiz-progress 1\n# id box correct wrong last_seen\n\ntf1 2 1 0 5\nse3 1 0 2 7\n";
    assert_int_equal(quiz_progress_parse(good, strlen(good), &p, &err), 0);
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
    if (quiz_progress_parse(text, used, &records, &parse_err)) fail_msg("%s", parse_err.message);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leitner_boxes),
        cmocka_unit_test(test_save_and_load_round_trip),
        cmocka_unit_test(test_parse_is_strict),
        cmocka_unit_test(test_corrupt_and_foreign_files_are_moved_aside),
        cmocka_unit_test(test_default_path_follows_xdg),
        cmocka_unit_test(test_kill_mid_write_never_truncates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
