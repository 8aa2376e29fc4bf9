// output_file: regular files are replaced atomically, a failed write leaves
// the old file, and devices such as /dev/null are written, never replaced.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/output_file.h"
#include "tests/test_support.h"

static void test_regular_file_is_replaced_on_commit_only(void** state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/out.txt", test_scratch_dir());
    assert_true(test_write_file(path, "old\n", 4));
    output_file f;
    error_info err = {{0}};
    assert_int_equal(output_file_open(&f, path, &err), 0);
    assert_false(f.direct);
    fputs("new contents\n", f.stream);
    fflush(f.stream);
    char* before = test_read_text(path); // not yet committed: readers see the old file
    assert_string_equal(before, "old\n");
    free(before);
    assert_int_equal(output_file_commit(&f, false, &err), 0);
    char* after = test_read_text(path);
    assert_string_equal(after, "new contents\n");
    free(after);
    assert_int_not_equal(access(f.temporary, F_OK), 0); // no temporary left behind
}

static void test_failed_write_keeps_the_old_file(void** state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/keep.txt", test_scratch_dir());
    assert_true(test_write_file(path, "keep\n", 5));
    output_file f;
    error_info err = {{0}};
    assert_int_equal(output_file_open(&f, path, &err), 0);
    fputs("half", f.stream);
    assert_int_not_equal(output_file_commit(&f, true, &err), 0);
    assert_non_null(strstr(err.message, "keep.txt: write failed"));
    char* text = test_read_text(path);
    assert_string_equal(text, "keep\n");
    free(text);
    assert_int_not_equal(access(f.temporary, F_OK), 0);
    assert_int_equal(output_file_open(&f, path, &err), 0);
    output_file_abort(&f);
    text = test_read_text(path);
    assert_string_equal(text, "keep\n");
    free(text);
}

static void test_device_is_written_not_replaced(void** state) {
    (void)state;
    output_file f;
    error_info err = {{0}};
    assert_int_equal(output_file_open(&f, "/dev/null", &err), 0);
    assert_true(f.direct);
    fputs("discarded\n", f.stream);
    assert_int_equal(output_file_commit(&f, false, &err), 0);
    struct stat st;
    assert_int_equal(stat("/dev/null", &st), 0);
    assert_true(S_ISCHR(st.st_mode));
}

// Issue 46 item 9: a link planted at the temporary's name (path.tmp.<pid>,
// which anyone can guess) or at the destination is never written through:
// the file it points to keeps its bytes.
static void test_planted_links_are_not_followed(void** state) {
    (void)state;
    char victim[512], path[512], temporary[600];
    snprintf(victim, sizeof victim, "%s/victim.txt", test_scratch_dir());
    snprintf(path, sizeof path, "%s/saved.txt", test_scratch_dir());
    snprintf(temporary, sizeof temporary, "%s.tmp.%ld", path, (long)getpid());
    assert_true(test_write_file(victim, "victim\n", 7));
    unlink(path);
    unlink(temporary);
    assert_int_equal(symlink(/* relative to the link's folder, which holds it */ "victim.txt", temporary), 0);
    output_file f;
    error_info err = {{0}};
    assert_int_equal(output_file_open(&f, path, &err), 0);
    fputs("saved\n", f.stream);
    assert_int_equal(output_file_commit(&f, false, &err), 0);
    char* text = test_read_text(victim);
    assert_string_equal(text, "victim\n");
    free(text);
    text = test_read_text(path);
    assert_string_equal(text, "saved\n");
    free(text);
    struct stat st;
    assert_int_equal(lstat(temporary, &st), 0); // the planted link is left alone
    assert_true(S_ISLNK(st.st_mode));
    unlink(temporary);

    // A link at the destination, to a file and to nothing: refused, named.
    unlink(path);
    assert_int_equal(symlink("victim.txt", path), 0);
    assert_int_not_equal(output_file_open(&f, path, &err), 0);
    assert_non_null(strstr(err.message, "saved.txt: is a symbolic link"));
    text = test_read_text(victim);
    assert_string_equal(text, "victim\n");
    free(text);
    unlink(path);
    char missing[600];
    snprintf(missing, sizeof missing, "%s/nothing-here", test_scratch_dir());
    assert_int_equal(symlink("nothing-here", path), 0);
    assert_int_not_equal(output_file_open(&f, path, &err), 0);
    assert_int_not_equal(access(missing, F_OK), 0);
    unlink(path);
}

static void test_bad_destinations_are_named(void** state) {
    (void)state;
    output_file f;
    error_info err = {{0}};
    assert_int_not_equal(output_file_open(&f, "/nonexistent-dir/x.txt", &err), 0);
    assert_non_null(strstr(err.message, "/nonexistent-dir/x.txt"));
    assert_int_not_equal(output_file_open(&f, test_scratch_dir(), &err), 0);
    assert_non_null(strstr(err.message, "is a directory"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regular_file_is_replaced_on_commit_only),
        cmocka_unit_test(test_failed_write_keeps_the_old_file),
        cmocka_unit_test(test_device_is_written_not_replaced),
        cmocka_unit_test(test_planted_links_are_not_followed),
        cmocka_unit_test(test_bad_destinations_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
