// The machine profile's cache (lab/common/machine_profile.h): a fresh file
// is used as it is; a corrupt, foreign, old or unreadable one is measured
// again with one line saying why; a reader never sees half a file; and
// `servelab machine` says the same.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lab/common/machine_profile.h"
#include "tests/test_support.h"

// A folder of its own for each test, set as SERVELAB_CACHE_DIR; `path` gets
// the profile's path in it.
static void fresh_cache_dir(const char* name, char* path, size_t capacity) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", test_scratch_dir(), name);
    char command[600];
    snprintf(command, sizeof command, "rm -rf '%s'", dir);
    assert_int_equal(system(command), 0);
    setenv("SERVELAB_CACHE_DIR", dir, 1);
    error_info err = {{0}};
    assert_int_equal(machine_profile_cache_path(path, capacity, &err), 0);
    char expected[600];
    snprintf(expected, sizeof expected, "%s/machine-profile.txt", dir);
    assert_string_equal(path, expected);
}

// A profile with this machine's key and made-up numbers (no measuring).
static machine_profile made_up_profile(void) {
    machine_profile p;
    machine_profile_current_key(&p, 0);
    p.measured_at_s = (int64_t)time(NULL) - 60;
    p.repeats = MACHINE_PROFILE_REPEATS;
    p.bandwidth_bytes_per_s =
        (measured_spread){.percentile_90 = 25e9, .percentile_75 = 20e9, .median = 16e9, .min = 10e9, .max = 26e9};
    p.peak_flops =
        (measured_spread){.percentile_90 = 120e9, .percentile_75 = 100e9, .median = 80e9, .min = 50e9, .max = 290e9};
    p.peak_w4a8_flops =
        (measured_spread){.percentile_90 = 150e9, .percentile_75 = 140e9, .median = 90e9, .min = 60e9, .max = 160e9};
    return p;
}

static void write_text(const char* path, const char* text) { assert_true(test_write_file(path, text, strlen(text))); }

// The cache as machine_profile_obtain finds it: origin, and the note's words.
static void expect_obtained(machine_profile_origin expected_origin, const char* note_words) {
    machine_profile p;
    machine_profile_origin origin;
    char note[1400];
    error_info err = {{0}};
    assert_int_equal(machine_profile_obtain(false, 0, &p, &origin, note, sizeof note, &err), 0);
    assert_int_equal(origin, expected_origin);
    if (note_words) {
        if (!strstr(note, note_words)) fail_msg("note '%s' does not say '%s'", note, note_words);
        assert_null(strchr(note, '\n')); // one line
    } else {
        assert_string_equal(note, "");
    }
    assert_true(p.bandwidth_bytes_per_s.min <= p.bandwidth_bytes_per_s.median);
    assert_true(p.bandwidth_bytes_per_s.median <= p.bandwidth_bytes_per_s.percentile_75);
    assert_true(p.bandwidth_bytes_per_s.percentile_75 <= p.bandwidth_bytes_per_s.percentile_90);
    assert_true(p.bandwidth_bytes_per_s.percentile_90 <= p.bandwidth_bytes_per_s.max);
    assert_true(p.peak_flops.min > 0 && p.peak_flops.median <= p.peak_flops.percentile_90);
    assert_int_equal(p.repeats, 101);
}

static void test_saved_profile_reads_back_and_is_used(void** state) {
    (void)state;
    char path[1024];
    fresh_cache_dir("roundtrip", path, sizeof path);
    machine_profile saved = made_up_profile();
    error_info err = {{0}};
    assert_int_equal(machine_profile_save(path, &saved, &err), 0); // creates the folder too
    machine_profile key, loaded;
    machine_profile_current_key(&key, 0);
    error_info why = {{0}};
    assert_int_equal(machine_profile_load(path, &key, (int64_t)time(NULL), &loaded, &why), 0);
    assert_string_equal(loaded.cpu_model, saved.cpu_model);
    assert_true(loaded.bandwidth_bytes_per_s.percentile_90 == 25e9 &&
                loaded.bandwidth_bytes_per_s.percentile_75 == 20e9);
    assert_true(loaded.bandwidth_bytes_per_s.median == 16e9 && loaded.bandwidth_bytes_per_s.min == 10e9);
    assert_true(loaded.peak_flops.percentile_90 == 120e9 && loaded.peak_flops.max == 290e9);
    assert_true(loaded.peak_w4a8_flops.percentile_75 == 140e9 && loaded.peak_w4a8_flops.min == 60e9);
    assert_true(machine_profile_ridge(&loaded) == 4.8);      // 120e9 / 25e9: the 290e9 glitch is not the figure
    assert_true(machine_profile_ridge_low(&loaded) == 4.0);  // 100e9 / 25e9
    assert_true(machine_profile_ridge_high(&loaded) == 6.0); // 120e9 / 20e9
    // Fresh: obtain uses it, measures nothing, says nothing.
    machine_profile used;
    machine_profile_origin origin;
    char note[1400];
    assert_int_equal(machine_profile_obtain(false, 0, &used, &origin, note, sizeof note, &err), 0);
    assert_int_equal(origin, MACHINE_PROFILE_FROM_CACHE);
    assert_true(used.bandwidth_bytes_per_s.percentile_90 == 25e9);
    // --remeasure measures even so, and replaces the file.
    assert_int_equal(machine_profile_obtain(true, 0, &used, &origin, note, sizeof note, &err), 0);
    assert_int_equal(origin, MACHINE_PROFILE_MEASURED);
    assert_non_null(strstr(note, "asked to measure again"));
    assert_int_equal(machine_profile_load(path, &key, (int64_t)time(NULL), &loaded, &why), 0);
    assert_true(loaded.bandwidth_bytes_per_s.percentile_90 == used.bandwidth_bytes_per_s.percentile_90);
}

static void test_missing_cache_is_measured_and_written(void** state) {
    (void)state;
    char path[1024];
    fresh_cache_dir("missing/deeper", path, sizeof path);
    expect_obtained(MACHINE_PROFILE_MEASURED, "no cached profile");
    expect_obtained(MACHINE_PROFILE_FROM_CACHE, NULL); // the second reads what the first wrote
}

// Each broken file is measured again, the note naming what was wrong.
static void test_corrupt_files_are_measured_again(void** state) {
    (void)state;
    char path[1024];
    fresh_cache_dir("corrupt", path, sizeof path);
    machine_profile good = made_up_profile();
    error_info err = {{0}};
    assert_int_equal(machine_profile_save(path, &good, &err), 0);
    char* whole = test_read_text(path);
    size_t length = strlen(whole);
    assert_true(length > 100);
    char text[2048];
    static const struct {
        const char* from;
        const char* to;
        const char* says;
    } edits[] = {
        {"peak_flops ", "peak_flop ", "expected 'peak_flops"},
        {"cores ", "cores x", "expected 'cores N'"},
        {"bandwidth_bytes_per_s 2", "bandwidth_bytes_per_s nan 2", "bandwidth_bytes_per_s P90 P75"},
        {"peak_flops 120000000000 ", "peak_flops 1 ", "peak_flops P90 P75"}, // the 90th below the 75th
        {" 290000000000\n", "\n", "peak_flops P90 P75"},                     // a number missing
        {"peak_w4a8_flops 150000000000", "peak_w4a8_flops -1", "peak_w4a8_flops P90 P75"},
        {"end\n", "end\nextra\n", "text after 'end'"},
        {"servelab-machine-profile 3", "servelab-machine-profile 2", "format 2, this build reads 3"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        const char* at = strstr(whole, edits[i].from);
        if (!at) fail_msg("the saved file has no '%s':\n%s", edits[i].from, whole);
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - whole), whole, edits[i].to, at + strlen(edits[i].from));
        write_text(path, text);
        expect_obtained(MACHINE_PROFILE_MEASURED, edits[i].says);
        expect_obtained(MACHINE_PROFILE_FROM_CACHE, NULL); // and the new file is whole
    }
    // Cut short anywhere: half a file is never taken for a profile.
    for (size_t cut = 0; cut < length; cut += 7) {
        snprintf(text, sizeof text, "%.*s", (int)cut, whole);
        write_text(path, text);
        machine_profile key, loaded;
        machine_profile_current_key(&key, 0);
        error_info why = {{0}};
        assert_int_equal(machine_profile_load(path, &key, (int64_t)time(NULL), &loaded, &why), -1);
        if (!strstr(why.message, "corrupt")) fail_msg("cut at %zu: '%s'", cut, why.message);
    }
    write_text(path, "\x01\x02 binary garbage\n");
    expect_obtained(MACHINE_PROFILE_MEASURED, "corrupt: line 1");
    free(whole);
}

static void test_foreign_or_old_profiles_are_measured_again(void** state) {
    (void)state;
    char path[1024];
    fresh_cache_dir("stale", path, sizeof path);
    error_info err = {{0}};
    machine_profile p = made_up_profile();
    snprintf(p.cpu_model, sizeof p.cpu_model, "Some Other CPU 9000");
    assert_int_equal(machine_profile_save(path, &p, &err), 0);
    expect_obtained(MACHINE_PROFILE_MEASURED, "measured on CPU 'Some Other CPU 9000'");

    p = made_up_profile();
    p.cores += 1;
    assert_int_equal(machine_profile_save(path, &p, &err), 0);
    expect_obtained(MACHINE_PROFILE_MEASURED, "cores online");

    p = made_up_profile();
    p.threads += 1;
    assert_int_equal(machine_profile_save(path, &p, &err), 0);
    expect_obtained(MACHINE_PROFILE_MEASURED, "threads");

    p = made_up_profile();
    p.measured_at_s = (int64_t)time(NULL) - 8 * 86400; // 8 days: past the 7 kept
    assert_int_equal(machine_profile_save(path, &p, &err), 0);
    expect_obtained(MACHINE_PROFILE_MEASURED, "measured 8 days ago (kept 7)");

    p = made_up_profile();
    p.measured_at_s = (int64_t)time(NULL) - 6 * 86400; // 6 days: still fresh
    assert_int_equal(machine_profile_save(path, &p, &err), 0);
    expect_obtained(MACHINE_PROFILE_FROM_CACHE, NULL);

    p = made_up_profile();
    p.measured_at_s = (int64_t)time(NULL) + 3 * 86400;
    assert_int_equal(machine_profile_save(path, &p, &err), 0);
    expect_obtained(MACHINE_PROFILE_MEASURED, "future");
}

// A folder where the file should be: unreadable, measured again, and the
// note says it could not be cached (the profile is still used).
static void test_unreadable_cache_is_measured_and_said(void** state) {
    (void)state;
    char path[1024];
    fresh_cache_dir("unreadable", path, sizeof path);
    assert_int_equal(mkdir(getenv("SERVELAB_CACHE_DIR"), 0700), 0);
    assert_int_equal(mkdir(path, 0700), 0);
    expect_obtained(MACHINE_PROFILE_MEASURED, "not cached");
}

// A writer replacing the file again and again while a reader reads it: the
// reader only ever finds a whole profile (a file written in place, cut
// between two writes, would be read half-written).
static void test_a_reader_never_sees_half_a_file(void** state) {
    (void)state;
    char path[1024];
    fresh_cache_dir("atomic", path, sizeof path);
    machine_profile p = made_up_profile();
    error_info err = {{0}};
    assert_int_equal(machine_profile_save(path, &p, &err), 0);
    pid_t writer = fork();
    assert_true(writer >= 0);
    if (writer == 0) {
        for (int i = 0;; i++) {
            machine_profile q = made_up_profile();
            q.bandwidth_bytes_per_s.percentile_90 = 25e9 + (double)(i % 1000); // a different length now and then
            if (machine_profile_save(path, &q, &err)) _exit(1);
        }
    }
    machine_profile key, loaded;
    machine_profile_current_key(&key, 0);
    int reads = 0, whole = 0;
    char last_problem[512] = "";
    for (double start = (double)clock() / CLOCKS_PER_SEC; (double)clock() / CLOCKS_PER_SEC - start < 0.5 || reads < 500;
         reads++) {
        error_info why = {{0}};
        if (machine_profile_load(path, &key, (int64_t)time(NULL), &loaded, &why) == 0)
            whole++;
        else
            snprintf(last_problem, sizeof last_problem, "%s", why.message);
    }
    kill(writer, SIGKILL);
    int status = 0;
    waitpid(writer, &status, 0);
    if (whole != reads) fail_msg("%d of %d reads found no whole profile: %s", reads - whole, reads, last_problem);
    // And no temporary file is left behind by the writes that finished.
    char command[1200];
    snprintf(command, sizeof command, "test $(ls '%s' | wc -l) -le 2", getenv("SERVELAB_CACHE_DIR"));
    assert_int_equal(system(command), 0); // the profile, and at most the one the killed writer had open
}

// The command says why it measured, and prints the spread.
static void test_machine_command_says_why(void** state) {
    (void)state;
    char path[1024];
    fresh_cache_dir("command", path, sizeof path);
    assert_int_equal(mkdir(getenv("SERVELAB_CACHE_DIR"), 0700), 0);
    write_text(path, "servelab-machine-profile 3\ncpu_model x\n");
    command_result r = run_servelab("machine");
    assert_int_equal(r.exit_status, 0);
    if (!strstr(r.err, "corrupt: line 3")) fail_msg("stderr: %s", r.err);
    assert_non_null(strstr(r.out, "ridge"));
    assert_non_null(strstr(r.out, "just now"));
    free_result(&r);
    r = run_servelab("machine");
    assert_int_equal(r.exit_status, 0);
    assert_string_equal(r.err, "");
    assert_non_null(strstr(r.out, "read from the cache"));
    free_result(&r);
    r = run_servelab("machine --remeasur");
    assert_int_equal(r.exit_status, 2);
    assert_non_null(strstr(r.err, "--remeasure"));
    free_result(&r);
}

// A lesson's lab.machine(): measured when the cache is corrupt, with the
// note on stderr (not among the lesson's lines), then read from the cache.
static void test_lesson_reads_the_cached_profile(void** state) {
    (void)state;
    char path[1024], lesson_path[1200];
    fresh_cache_dir("lesson", path, sizeof path);
    assert_int_equal(mkdir(getenv("SERVELAB_CACHE_DIR"), 0700), 0);
    write_text(path, "servelab-machine-profile 3\n");
    snprintf(lesson_path, sizeof lesson_path, "%s/profile.lua", getenv("SERVELAB_CACHE_DIR"));
    write_text(lesson_path,
               "lab.lesson{title = 'profile', claims = {'p1'}}\n"
               "local m = lab.machine()\n"
               "lab.check{id = 'p1', claim = 'the ridge lies in its spread', expected = true,\n"
               "    breaks_with = {'weight-count-doubled'},\n"
               "    verdict = m.ridge_low <= m.ridge and m.ridge <= m.ridge_high and m.repeats == 101,\n"
               "    evidence = string.format('ridge %.2f (%.2f..%.2f), from the %s', m.ridge, m.ridge_low,\n"
               "        m.ridge_high, m.source)}\n");
    char arguments[1400];
    snprintf(arguments, sizeof arguments, "lesson run %s --headless --time-limit 60", lesson_path);
    command_result r = run_servelab(arguments);
    if (r.exit_status != 0 || !strstr(r.out, "PASS p1") || !strstr(r.out, "from the measured"))
        fail_msg("first run, exit %d:\n%s\n%s", r.exit_status, r.out, r.err);
    if (!strstr(r.err, "note: machine profile measured") || !strstr(r.err, "corrupt: line 2"))
        fail_msg("stderr does not say why it measured: %s", r.err);
    assert_null(strstr(r.out, "machine profile measured"));
    free_result(&r);
    r = run_servelab(arguments);
    if (r.exit_status != 0 || !strstr(r.out, "from the cache") || strstr(r.err, "machine profile"))
        fail_msg("second run, exit %d:\n%s\n%s", r.exit_status, r.out, r.err);
    free_result(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_saved_profile_reads_back_and_is_used),
        cmocka_unit_test(test_missing_cache_is_measured_and_written),
        cmocka_unit_test(test_corrupt_files_are_measured_again),
        cmocka_unit_test(test_foreign_or_old_profiles_are_measured_again),
        cmocka_unit_test(test_unreadable_cache_is_measured_and_said),
        cmocka_unit_test(test_a_reader_never_sees_half_a_file),
        cmocka_unit_test(test_machine_command_says_why),
        cmocka_unit_test(test_lesson_reads_the_cached_profile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
