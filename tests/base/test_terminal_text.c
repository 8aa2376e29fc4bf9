// terminal_text: C0, DEL and C1 controls (raw and as UTF-8) become '?',
// valid UTF-8 passes, and a character split across calls is kept whole
// (issue 46 item 10).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "base/terminal_text.h"

static void expect_clean(const char* input, const char* expected) {
    char text[256];
    snprintf(text, sizeof text, "%s", input);
    terminal_text_clean(text);
    assert_string_equal(text, expected);
}

static void test_c0_and_del_become_question_marks(void** state) {
    (void)state;
    expect_clean("plain name 1.0", "plain name 1.0");
    expect_clean("a\x1b[2Jb", "a?[2Jb");                            // clear screen
    expect_clean("\x1b]0;pwned\x07title", "?]0;pwned?title");       // window title
    expect_clean("line\nbreak\ttab\rcr\x7f", "line?break?tab?cr?"); // names keep no line breaks
}

static void test_c1_controls_raw_and_utf8(void** state) {
    (void)state;
    expect_clean("a\xc2\x9b"
                 "2Jb",
                 "a?2Jb"); // U+009B CSI as UTF-8
    expect_clean("\xc2\x9d"
                 "0;t\xc2\x9c",
                 "?0;t?");                  // U+009D OSC ... U+009C ST
    expect_clean("\xc2\x80\xc2\x9f", "??"); // the ends of C1
    expect_clean("a\x9b"
                 "2J\x9d",
                 "a?2J?");                // raw 8-bit CSI and OSC
    expect_clean("\xc2\xa0", "\xc2\xa0"); // U+00A0 (no-break space) is not C1
}

static void test_valid_utf8_passes_and_invalid_does_not(void** state) {
    (void)state;
    expect_clean("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xe4\xb8\xad",
                 "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xe4\xb8\xad");
    expect_clean("\xc0\xaf", "??");      // overlong '/'
    expect_clean("\xed\xa0\x80", "???"); // a surrogate
    expect_clean("\xff\xfe", "??");
    expect_clean("cut \xe2\x82", "cut ?"); // a character cut at the end
    expect_clean("\xe2\x82"
                 "A",
                 "?A");                 // cut short by ASCII, which still prints
    expect_clean("\xe2\x1b[m", "??[m"); // cut short by ESC, which is still caught
}

// Pieces of generated text: '\n' and '\t' kept, and a character whose
// bytes come one piece at a time (byte-fallback tokens) printed whole.
static void test_stream_keeps_line_breaks_and_split_characters(void** state) {
    (void)state;
    char buffer[256] = "";
    FILE* stream = fmemopen(buffer, sizeof buffer, "w");
    assert_non_null(stream);
    terminal_text text = {.keep_line_breaks = true};
    const char* pieces[] = {"Once", "\n", "\t", "\xe2", "\x82", "\xac", " \x1b]0;x\x07", "\xc2", "\x9b", "2J", "\xe4"};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
        terminal_text_write(&text, pieces[i], stream);
    terminal_text_flush(&text, stream);
    fclose(stream);
    assert_string_equal(buffer, "Once\n\t\xe2\x82\xac ?]0;x??2J?");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_c0_and_del_become_question_marks),
        cmocka_unit_test(test_c1_controls_raw_and_utf8),
        cmocka_unit_test(test_valid_utf8_passes_and_invalid_does_not),
        cmocka_unit_test(test_stream_keeps_line_breaks_and_split_characters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
