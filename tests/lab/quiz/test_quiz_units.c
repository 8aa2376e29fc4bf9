// The unit parser on good and bad input, and numeric grading: tolerance,
// bare numbers in the unit asked, and the GB vs GiB explanation.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "lab/quiz/units.h"

static void expect_quantity(const char* text, double base_value, quiz_dimension dim, const char* unit) {
    quiz_quantity q;
    error_info err = {{0}};
    if (quiz_parse_quantity(text, &q, &err)) fail_msg("'%s': %s", text, err.message);
    if (fabs(q.value - base_value) > 1e-9 * fabs(base_value))
        fail_msg("'%s': %.17g, expected %.17g", text, q.value, base_value);
    assert_int_equal(q.dim, dim);
    assert_string_equal(q.unit, unit);
    assert_int_equal(q.has_unit, unit[0] != '\0');
}

static void test_parses_numbers_with_units(void** state) {
    (void)state;
    expect_quantity("12.5 GiB", 12.5 * 1073741824.0, QUIZ_DIM_BYTES, "GiB");
    expect_quantity("12.5GiB", 12.5 * 1073741824.0, QUIZ_DIM_BYTES, "GiB");
    expect_quantity("  12.5 gib  ", 12.5 * 1073741824.0, QUIZ_DIM_BYTES, "GiB");
    expect_quantity("13.4 GB", 13.4e9, QUIZ_DIM_BYTES, "GB");
    expect_quantity("1.5e9 B", 1.5e9, QUIZ_DIM_BYTES, "B");
    expect_quantity("4096 bytes", 4096, QUIZ_DIM_BYTES, "B");
    expect_quantity("2 KB", 2000, QUIZ_DIM_BYTES, "KB");
    expect_quantity("2 KiB", 2048, QUIZ_DIM_BYTES, "KiB");
    expect_quantity("3 MB", 3e6, QUIZ_DIM_BYTES, "MB");
    expect_quantity("3 MiB", 3 * 1048576.0, QUIZ_DIM_BYTES, "MiB");
    expect_quantity("1 TiB", 1099511627776.0, QUIZ_DIM_BYTES, "TiB");
    expect_quantity("45%", 45, QUIZ_DIM_PERCENT, "%");
    expect_quantity("45 %", 45, QUIZ_DIM_PERCENT, "%");
    expect_quantity("17x", 17, QUIZ_DIM_RATIO, "x");
    expect_quantity("17 X", 17, QUIZ_DIM_RATIO, "x");
    expect_quantity("17\xc3\x97", 17, QUIZ_DIM_RATIO, "x");
    expect_quantity("3.2 ms", 3.2, QUIZ_DIM_TIME, "ms");
    expect_quantity("0.5 s", 500, QUIZ_DIM_TIME, "s");
    expect_quantity("250 us", 0.25, QUIZ_DIM_TIME, "us");
    expect_quantity("-0.75", -0.75, QUIZ_DIM_NUMBER, "");
    expect_quantity(".5", 0.5, QUIZ_DIM_NUMBER, "");
    expect_quantity("+3", 3, QUIZ_DIM_NUMBER, "");
}

static void expect_parse_error(const char* text, const char* expected) {
    quiz_quantity q;
    error_info err = {{0}};
    assert_int_equal(quiz_parse_quantity(text, &q, &err), -1);
    if (!strstr(err.message, expected)) fail_msg("'%s': expected '%s' in: %s", text, expected, err.message);
}

static void test_rejects_bad_input(void** state) {
    (void)state;
    expect_parse_error("", "no answer");
    expect_parse_error("   ", "no answer");
    expect_parse_error("abc", "not a number");
    expect_parse_error("GiB", "not a number");
    expect_parse_error("nan", "not a number");
    expect_parse_error("inf GB", "not a number");
    expect_parse_error("0x10", "unknown unit 'x10'");
    expect_parse_error("1e999", "out of range");
    expect_parse_error("12 parsecs", "unknown unit 'parsecs'");
    expect_parse_error("12 GB extra", "unknown unit 'GB extra'");
    expect_parse_error("1,024 MB", "without ','");
    expect_parse_error("1,5", "without ','");
    expect_parse_error("-", "not a number");
    expect_parse_error("12 GBGBGBGBGBGBGBGBGBGBGBGBGBGBGBGBGBGB", "unknown unit");
}

static quiz_numeric gib(double value_gib) {
    quiz_numeric n = {value_gib * 1073741824.0, QUIZ_DIM_BYTES, "GiB", 0.01, 0};
    return n;
}

static bool grade(const quiz_numeric* expected, const char* input, quiz_numeric_verdict* v) {
    error_info err = {{0}};
    if (quiz_check_numeric(expected, input, v, &err)) fail_msg("'%s' not graded: %s", input, err.message);
    return v->correct;
}

static void test_grades_within_tolerance(void** state) {
    (void)state;
    quiz_numeric expected = gib(8.0);
    quiz_numeric_verdict v;
    assert_true(grade(&expected, "8 GiB", &v));
    assert_true(grade(&expected, "8.07 GiB", &v)); // 0.9% off
    assert_false(grade(&expected, "8.1 GiB", &v)); // 1.25% off
    assert_true(grade(&expected, "8", &v));        // a bare number is in the unit asked
    assert_true(grade(&expected, "8192 MiB", &v)); // any byte unit works
    assert_true(grade(&expected, "8589934592 B", &v));
    assert_true(grade(&expected, "8.59 GB", &v));
    assert_non_null(strstr(v.feedback, "8 GiB (8.59 GB)"));
    assert_false(grade(&expected, "16 GiB", &v));
    assert_false(v.unit_mixup);
    assert_null(strstr(v.feedback, "factor"));
    // Counts graded exactly or within an absolute tolerance.
    quiz_numeric blocks = {73, QUIZ_DIM_NUMBER, "", 0, 0};
    assert_true(grade(&blocks, "73", &v));
    assert_false(grade(&blocks, "74", &v));
    quiz_numeric fit = {9, QUIZ_DIM_NUMBER, "", 0, 1};
    assert_true(grade(&fit, "10", &v));
    assert_false(grade(&fit, "11", &v));
    quiz_numeric ratio = {17, QUIZ_DIM_RATIO, "x", 0.01, 0};
    assert_true(grade(&ratio, "17x", &v));
    assert_true(grade(&ratio, "17", &v));
    assert_false(grade(&ratio, "2x", &v));
    quiz_numeric time_ms = {1.532, QUIZ_DIM_TIME, "ms", 0.01, 0};
    assert_true(grade(&time_ms, "1.53 ms", &v));
    assert_true(grade(&time_ms, "0.00153 s", &v));
    assert_true(grade(&time_ms, "1532 us", &v));
}

static void test_explains_gb_versus_gib(void** state) {
    (void)state;
    quiz_numeric expected = gib(12.5); // 13.42 GB
    quiz_numeric_verdict v;
    // The GiB number with a GB label, and the GB number with a GiB label: both off by 2^30 / 10^9.
    assert_false(grade(&expected, "12.5 GB", &v));
    assert_true(v.unit_mixup);
    assert_non_null(strstr(v.feedback, "GB/GiB factor"));
    assert_non_null(strstr(v.feedback, "1,073,741,824"));
    assert_false(grade(&expected, "13.42 GiB", &v));
    assert_true(v.unit_mixup);
    // MiB vs MB has its own factor.
    quiz_numeric mib = {640 * 1048576.0, QUIZ_DIM_BYTES, "MiB", 0.01, 0};
    assert_false(grade(&mib, "640 MB", &v));
    assert_true(v.unit_mixup);
    assert_non_null(strstr(v.feedback, "MB/MiB factor"));
    // A plain wrong number is not blamed on units.
    assert_false(grade(&expected, "20 GiB", &v));
    assert_false(v.unit_mixup);
}

static void test_wrong_kind_of_unit_asks_again(void** state) {
    (void)state;
    quiz_numeric expected = gib(8.0);
    quiz_numeric_verdict v;
    error_info err = {{0}};
    assert_int_equal(quiz_check_numeric(&expected, "8 ms", &v, &err), -1);
    assert_non_null(strstr(err.message, "a time"));
    assert_non_null(strstr(err.message, "a size in bytes"));
    assert_int_equal(quiz_check_numeric(&expected, "eight", &v, &err), -1);
    quiz_numeric ratio = {17, QUIZ_DIM_RATIO, "x", 0.01, 0};
    assert_int_equal(quiz_check_numeric(&ratio, "17 GB", &v, &err), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parses_numbers_with_units),     cmocka_unit_test(test_rejects_bad_input),
        cmocka_unit_test(test_grades_within_tolerance),       cmocka_unit_test(test_explains_gb_versus_gib),
        cmocka_unit_test(test_wrong_kind_of_unit_asks_again),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
