// The quiz session as pure functions: choosing questions (topics, Leitner
// order), grading every kind of answer, recording progress, statistics,
// and the full-screen view drawn headless (the feedback box scrolling what
// does not fit, and the keys that scroll it).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "lab/quiz/app.h"
#include "lab/quiz/session.h"
#include "lab/quiz/view.h"

typedef struct fixture {
    quiz_bank bank;
    quiz_model_list models;
    quiz_progress progress;
} fixture;

static int setup(void** state) {
    fixture* f = calloc(1, sizeof *f);
    error_info err = {{0}};
    if (quiz_bank_load("quiz/bank.lua", &f->bank, &err) || quiz_models_load("quiz/models.lua", &f->models, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void** state) {
    fixture* f = *state;
    quiz_bank_free(&f->bank);
    quiz_models_free(&f->models);
    quiz_progress_free(&f->progress);
    free(f);
    return 0;
}

static const int64_t NOW = 1800000000;

static quiz_session start(fixture* f, unsigned topics, int n, uint64_t seed) {
    quiz_session s;
    quiz_session_options o = {topics, n, seed, QUIZ_LANG_EN, NOW, false, false};
    error_info err = {{0}};
    if (quiz_session_start(&s, &o, &f->bank, &f->models, &f->progress, &err)) fail_msg("%s", err.message);
    return s;
}

static void test_topics_and_count(void** state) {
    fixture* f = *state;
    for (int t = 0; t < QUIZ_TOPIC_COUNT; t++) {
        quiz_session s = start(f, QUIZ_TOPIC_BIT(t), 100, (uint64_t)t);
        assert_true(s.n_questions > 0);
        for (int i = 0; i < s.n_questions; i++)
            assert_true(s.questions[i].topics & QUIZ_TOPIC_BIT(t));
        quiz_session_free(&s);
    }
    quiz_session s = start(f, QUIZ_ALL_TOPICS, 100, 1);
    assert_int_equal(s.n_questions, f->bank.n_items + QUIZ_DRILL_COUNT); // everything, once
    quiz_session_free(&s);
    s = start(f, QUIZ_ALL_TOPICS, 5, 1);
    assert_int_equal(s.n_questions, 5);
    quiz_session_free(&s);
    quiz_session_options o = {QUIZ_ALL_TOPICS, 100, 1, QUIZ_LANG_EN, NOW, true, false};
    error_info err = {{0}};
    assert_int_equal(quiz_session_start(&s, &o, &f->bank, &f->models, &f->progress, &err), 0);
    assert_int_equal(s.n_questions, f->bank.n_items);
    for (int i = 0; i < s.n_questions; i++)
        assert_non_null(s.questions[i].item);
    quiz_session_free(&s);
    o.bank_only = false;
    o.drills_only = true;
    assert_int_equal(quiz_session_start(&s, &o, &f->bank, &f->models, &f->progress, &err), 0);
    assert_int_equal(s.n_questions, QUIZ_DRILL_COUNT);
    quiz_session_free(&s);
}

// Items seen recently and answered right are not due; the session asks the
// due ones (wrong ones and new ones) before any of them.
static void test_due_items_come_first(void** state) {
    fixture* f = *state;
    error_info err = {{0}};
    // Everything answered right a moment ago (box 2, due tomorrow) except five.
    int n_total = f->bank.n_items + QUIZ_DRILL_COUNT;
    for (int i = 0; i < f->bank.n_items; i++)
        if (i % 7 != 0) quiz_progress_record(&f->progress, f->bank.items[i].id, true, NOW - 10, &err);
    for (int k = 0; k < QUIZ_DRILL_COUNT; k++)
        quiz_progress_record(&f->progress, quiz_drill_id((quiz_drill_kind)k), true, NOW - 10, &err);
    quiz_progress_record(&f->progress, "tf2", false, NOW - 10, &err); // wrong: box 1, due now
    int n_due = 0;
    for (int i = 0; i < f->bank.n_items; i++)
        n_due += quiz_record_due(quiz_progress_find(&f->progress, f->bank.items[i].id), NOW);
    assert_int_equal(n_due, 5 + 1); // items 0, 7, 14, 21, 28 never seen, and tf2
    quiz_session s = start(f, QUIZ_ALL_TOPICS, n_due, 9);
    for (int i = 0; i < s.n_questions; i++) {
        assert_false(s.questions[i].ahead_of_schedule);
        assert_true(quiz_record_due(quiz_progress_find(&f->progress, s.questions[i].id), NOW));
    }
    quiz_session_free(&s);
    s = start(f, QUIZ_ALL_TOPICS, n_total, 9);
    int ahead = 0;
    for (int i = 0; i < s.n_questions; i++)
        ahead += s.questions[i].ahead_of_schedule;
    assert_int_equal(ahead, n_total - n_due);
    quiz_session_free(&s);
}

static const quiz_question* advance_to(quiz_session* s, bool (*wanted)(const quiz_question*)) {
    while (s->stage != QUIZ_STAGE_DONE) {
        const quiz_question* q = quiz_session_question(s);
        if (wanted(q)) return q;
        s->stage = QUIZ_STAGE_FEEDBACK;
        quiz_session_next(s);
    }
    return NULL;
}

static bool is_true_false(const quiz_question* q) { return q->item && q->item->has_truth; }
static bool is_choice(const quiz_question* q) { return q->item && q->item->n_choices > 0; }
static bool is_text(const quiz_question* q) { return q->item && q->item->model_answer.en; }
static bool is_drill(const quiz_question* q) { return q->item == NULL; }

static quiz_input_result feed(quiz_session* s, const char* line) {
    error_info err = {{0}};
    return quiz_session_input(s, line, &err);
}

static const quiz_record* record_of(fixture* f, const quiz_question* q) {
    return quiz_progress_find(&f->progress, q->id);
}

static void test_true_false_answers(void** state) {
    fixture* f = *state;
    quiz_session s = start(f, QUIZ_ALL_TOPICS, 100, 3);
    // Right, and the student's reason matched: right.
    const quiz_question* q = advance_to(&s, is_true_false);
    const char* right = q->item->truth ? "true" : "f";
    assert_int_equal(feed(&s, "maybe"), QUIZ_INPUT_RETRY);
    assert_int_equal(feed(&s, right), QUIZ_INPUT_SELF_GRADE);
    assert_non_null(
        strstr(s.feedback, quiz_text_get(&q->item->explanation, QUIZ_LANG_EN))); // the justification is shown
    assert_int_equal(feed(&s, "perhaps"), QUIZ_INPUT_RETRY);
    assert_int_equal(feed(&s, "y"), QUIZ_INPUT_GRADED);
    assert_int_equal(record_of(f, q)->n_correct, 1);
    assert_int_equal(record_of(f, q)->box, 2);
    assert_string_equal(quiz_session_claim(&s), q->item->claim);
    assert_non_null(strstr(s.feedback, "p: prove it"));
    quiz_session_next(&s);
    // Right, but the reason did not match: wrong.
    q = advance_to(&s, is_true_false);
    assert_int_equal(feed(&s, q->item->truth ? "t" : "false"), QUIZ_INPUT_SELF_GRADE);
    assert_int_equal(feed(&s, "n"), QUIZ_INPUT_GRADED);
    assert_int_equal(record_of(f, q)->n_wrong, 1);
    quiz_session_next(&s);
    // Wrong: graded at once, with the answer and its reason.
    q = advance_to(&s, is_true_false);
    assert_int_equal(feed(&s, q->item->truth ? "f" : "t"), QUIZ_INPUT_GRADED);
    assert_non_null(strstr(s.feedback, q->item->truth ? "it is True" : "it is False"));
    assert_int_equal(record_of(f, q)->n_wrong, 1);
    assert_int_equal(s.n_correct, 1);
    assert_int_equal(s.n_wrong, 2);
    quiz_session_free(&s);
}

static void test_choice_text_and_numeric_answers(void** state) {
    fixture* f = *state;
    quiz_session s = start(f, QUIZ_ALL_TOPICS, 100, 4);
    const quiz_question* q = advance_to(&s, is_choice);
    int right = -1;
    for (int k = 0; k < q->item->n_choices; k++)
        if (q->choice_order[k] == q->item->correct_choice) right = k;
    char letter[2] = {(char)('a' + right), 0};
    char question[4096];
    quiz_session_format_question(&s, question, sizeof question);
    char shown[512];
    snprintf(shown, sizeof shown, "  %s) %s\n", letter, q->item->choices[q->item->correct_choice].en);
    assert_non_null(strstr(question, shown)); // the letter shown is the letter graded
    assert_int_equal(feed(&s, "z"), QUIZ_INPUT_RETRY);
    assert_int_equal(feed(&s, letter), QUIZ_INPUT_GRADED);
    assert_true(s.last_correct);
    quiz_session_next(&s);
    q = advance_to(&s, is_choice);
    for (int k = 0; k < q->item->n_choices; k++)
        if (q->choice_order[k] != q->item->correct_choice) letter[0] = (char)('A' + k); // capitals work too
    assert_int_equal(feed(&s, letter), QUIZ_INPUT_GRADED);
    assert_false(s.last_correct);
    assert_int_equal(record_of(f, q)->box, 1);
    quiz_session_next(&s);
    q = advance_to(&s, is_text);
    assert_int_equal(feed(&s, "because the bytes"), QUIZ_INPUT_SELF_GRADE);
    assert_non_null(strstr(s.feedback, q->item->model_answer.en));
    assert_int_equal(feed(&s, "yes"), QUIZ_INPUT_GRADED);
    assert_true(s.last_correct);
    quiz_session_next(&s);
    q = advance_to(&s, is_drill);
    assert_null(quiz_session_claim(&s)); // drills have no lesson claim
    assert_int_equal(feed(&s, "lots"), QUIZ_INPUT_RETRY);
    assert_non_null(strstr(s.feedback, "not a number"));
    char typed[64];
    double factor = q->drill.answer.unit[0] ? quiz_unit_factor(q->drill.answer.unit, NULL) : 1.0;
    snprintf(typed, sizeof typed, "%.8g", q->drill.answer.value / factor);
    assert_int_equal(feed(&s, typed), QUIZ_INPUT_GRADED);
    assert_true(s.last_correct);
    assert_non_null(strstr(s.feedback, "Worked:"));
    assert_int_equal(record_of(f, q)->n_correct, 1);
    quiz_session_next(&s);
    assert_int_equal(feed(&s, "q"), QUIZ_INPUT_QUIT);
    assert_int_equal(s.stage, QUIZ_STAGE_DONE);
    assert_null(quiz_session_question(&s));
    quiz_session_free(&s);
}

static void test_hinglish_rendering(void** state) {
    fixture* f = *state;
    quiz_session_options o = {QUIZ_TOPIC_BIT(QUIZ_TOPIC_PARALLELISM), 1, 1, QUIZ_LANG_HI_EN, NOW, true, false};
    quiz_session s;
    error_info err = {{0}};
    assert_int_equal(quiz_session_start(&s, &o, &f->bank, &f->models, &f->progress, &err), 0);
    char question[4096];
    quiz_session_format_question(&s, question, sizeof question);
    assert_non_null(strstr(question, s.questions[0].item->prompt.hi_en));
    quiz_session_free(&s);
}

static void test_stats_per_topic(void** state) {
    fixture* f = *state;
    error_info err = {{0}};
    quiz_progress_record(&f->progress, "tf3", true, NOW, &err);  // kv-sizing
    quiz_progress_record(&f->progress, "se1", false, NOW, &err); // kv-sizing
    quiz_progress_record(&f->progress, "se1", true, NOW, &err);
    quiz_progress_record(&f->progress, "se1", true, NOW, &err);
    char* text = NULL;
    size_t size = 0;
    FILE* out = open_memstream(&text, &size);
    quiz_stats_print(out, &f->bank, &f->progress, NOW);
    fclose(out);
    // kv-sizing: 4 bank items (tf3 se1 se2 edge8) + 2 drills; two seen, 3 right of 4; tf3 (box 2) and se1 (box 3) not
    // due.
    assert_non_null(strstr(text, "kv-sizing           6      2        3        1       75%        4\n"));
    assert_non_null(strstr(text, "parallelism         1      0        0        0         -        1\n"));
    assert_non_null(strstr(text, "falls due in 24.0 hours"));
    free(text);
}

static char* dump(const ui_screen* screen) {
    char* text = NULL;
    size_t size = 0;
    FILE* out = open_memstream(&text, &size);
    ui_screen_dump(screen, out);
    fclose(out);
    return text;
}

static void test_view_draws_headless(void** state) {
    fixture* f = *state;
    quiz_session s = start(f, QUIZ_ALL_TOPICS, 100, 5);
    const quiz_question* q = advance_to(&s, is_true_false);
    ui_screen screen;
    assert_int_equal(ui_screen_init(&screen, 100, 30, false, false), 0);
    quiz_view_draw(&screen, &s, "tru", NULL, 0);
    char* text = dump(&screen);
    assert_non_null(strstr(text, q->id));
    assert_non_null(strstr(text, "> tru_"));
    assert_non_null(strstr(text, "Esc or Ctrl-C: quit"));
    char first_words[24];
    snprintf(first_words, sizeof first_words, "%.20s", q->item->prompt.en);
    assert_non_null(strstr(text, first_words));
    free(text);
    feed(&s, q->item->truth ? "f" : "t");
    quiz_view_draw(&screen, &s, "", NULL, 0);
    text = dump(&screen);
    assert_non_null(strstr(text, "p: prove it"));
    assert_non_null(strstr(text, "Wrong: it is"));
    free(text);
    quiz_view_draw(&screen, &s, "", "PASS tf1 ... -- measured", 0);
    text = dump(&screen);
    assert_non_null(strstr(text, "PASS tf1 ... -- measured"));
    free(text);
    // Wrapping keeps every word, and nothing is drawn past the width.
    ui_screen_resize(&screen, 40, 12);
    quiz_view_draw(&screen, &s, "", NULL, 0);
    text = dump(&screen);
    for (char* line = text; *line;) {
        char* end = strchr(line, '\n');
        assert_true(end - line <= 40);
        line = end + 1;
    }
    free(text);
    ui_screen_resize(&screen, 20, 5);
    quiz_view_draw(&screen, &s, "", NULL, 0);
    text = dump(&screen);
    assert_non_null(strstr(text, "terminal too small"));
    free(text);
    ui_screen_free(&screen);
    quiz_session_free(&s);
}

// The answer that grades right (or wrong) for the current question.
static void answer_for(const quiz_question* q, bool right, char* out, size_t capacity) {
    if (q->item && q->item->has_truth) {
        snprintf(out, capacity, "%s", q->item->truth == right ? "t" : "f");
    } else if (q->item && q->item->n_choices) {
        int shown = 0;
        for (int k = 0; k < q->item->n_choices; k++)
            if (q->choice_order[k] == q->item->correct_choice) shown = k;
        snprintf(out, capacity, "%c", 'a' + (right ? shown : (shown + 1) % q->item->n_choices));
    } else if (q->item) {
        snprintf(out, capacity, "my own words");
    } else {
        double factor = q->drill.answer.unit[0] ? quiz_unit_factor(q->drill.answer.unit, NULL) : 1.0;
        snprintf(out, capacity, "%.6g %s", q->drill.answer.value / factor * (right ? 1.0 : 3.0), q->drill.answer.unit);
    }
}

static void expect_feedback_whole(const quiz_session* s, int cols, int rows) {
    quiz_view_layout layout = quiz_view_layout_for(s, NULL, cols, rows);
    int needed = quiz_view_feedback_rows(&layout, s->feedback), shown = layout.feedback.h - 2;
    if (needed > shown)
        fail_msg("%s at %dx%d: the feedback needs %d rows, its box shows %d:\n%s", quiz_session_question(s)->id, cols,
                 rows, needed, shown, s->feedback);
}

// At 80x24, the smallest size the lab supports, every question's feedback
// (verdict, explanation or worked answer, prove-it hint) is shown whole
// below its question: in both languages, graded right and wrong, and for
// 40 fresh draws of every drill. tf9, which teaches two regimes, was cut
// until it fit its 9 rows (at 522 characters it needed 10).
static void test_every_feedback_is_whole_at_80x24(void** state) {
    fixture* f = *state;
    int checked = 0;
    for (int lang = 0; lang < 2; lang++)
        for (int right = 0; right < 2; right++)
            for (uint64_t seed = 0; seed < 40; seed++) {
                quiz_session s;
                quiz_session_options o = {QUIZ_ALL_TOPICS, 100,     seed, lang ? QUIZ_LANG_HI_EN : QUIZ_LANG_EN, NOW,
                                          false,           seed > 0}; // the bank once, then drills only
                error_info err = {{0}};
                if (quiz_session_start(&s, &o, &f->bank, &f->models, &f->progress, &err)) fail_msg("%s", err.message);
                while (s.stage != QUIZ_STAGE_DONE) {
                    char answer[64];
                    answer_for(quiz_session_question(&s), right, answer, sizeof answer);
                    // While asking, a retry hint has a box (3 rows or more) below the answer.
                    if (quiz_view_layout_for(&s, NULL, 80, 24).feedback.h < 3)
                        fail_msg("%s: no feedback box while asking at 80x24", quiz_session_question(&s)->id);
                    assert_int_not_equal(feed(&s, answer), QUIZ_INPUT_RETRY);
                    expect_feedback_whole(&s, 80, 24);
                    if (s.stage == QUIZ_STAGE_SELF_GRADE) {
                        assert_int_equal(feed(&s, "y"), QUIZ_INPUT_GRADED);
                        expect_feedback_whole(&s, 80, 24);
                    }
                    checked++;
                    quiz_session_next(&s);
                }
                quiz_session_free(&s);
            }
    assert_int_equal(checked, 2 * 2 * (f->bank.n_items + 40 * QUIZ_DRILL_COUNT));
}

// ---- text that does not fit scrolls ------------------------------------------------------

// A prove-it result line of exactly `length` characters (< 4000) in the form
// lesson_prove_claim prints, its evidence numbered so that order shows.
static void long_result_line(char* out, int length, const char* claim) {
    int used = snprintf(out, 4096,
                        "PASS %s \"the KV cache grows quadratically with sequence length\": FALSE, as the bank says "
                        "-- measured: linear, x2.00 per doubling; KV bytes written",
                        claim);
    for (int k = 1; used < length; k++)
        used += snprintf(out + used, (size_t)(4096 - used), " at S=%d: %d B,", 64 * k, 18432 * k);
    out[length] = '\0';
}

// The text of row y from column x0 up to x1, trailing blanks left out.
static void row_text(const ui_screen* screen, int x0, int x1, int y, char* out, size_t size) {
    size_t used = 0;
    out[0] = '\0';
    for (int x = x0; x < x1; x++) {
        const char* cell = screen->cells[y * screen->cols + x].text;
        size_t n = strlen(cell);
        if (used + n + 1 > size) break;
        memcpy(out + used, cell, n + 1);
        used += n;
    }
    while (used > 0 && out[used - 1] == ' ')
        out[--used] = '\0';
}

// Text without its blanks: what wrapping at spaces must keep, in order.
static void without_blanks(const char* text, char* out, size_t size) {
    size_t used = 0;
    for (; *text && used + 1 < size; text++)
        if (*text != ' ' && *text != '\n') out[used++] = *text;
    out[used] = '\0';
}

// ui_put's cut hook: what the view cut (nothing may be).
static char cut_text[512];
static void record_cut(void* user, const char* text, int x, int y, int shown, int columns) {
    (void)user;
    if (!cut_text[0])
        snprintf(cut_text, sizeof cut_text, "'%s' at (%d, %d): %d of its columns shown, %d there", text, x, y, shown,
                 columns);
}

// Draws the feedback box (the prove-it `notice`, or the session's feedback)
// at every scroll position of a cols x rows screen and checks that every
// character of the text appears in some position, in order, each row the
// same wherever it shows; that the frame says "more above" exactly when
// rows are hidden above and "more below" exactly when rows are hidden
// below; that nothing drawn is cut (the key bar, the box titles); and that
// scrolling past the end shows the end. Returns the
// largest top (0: the text fits whole).
static int expect_reachable(const quiz_session* s, const char* notice, int cols, int rows) {
    const char* text = notice ? notice : s->feedback;
    const char* id = quiz_session_question(s)->id;
    int need_cols, need_rows;
    assert_true(quiz_view_fits(s, notice, cols, rows, &need_cols, &need_rows));
    quiz_view_layout layout = quiz_view_layout_for(s, notice, cols, rows);
    quiz_view_scroll first = quiz_view_scroll_for(s, notice, cols, rows, 0);
    if (layout.feedback.h < 3 || first.page != layout.feedback.h - 2)
        fail_msg("%s at %dx%d: no feedback box (h %d)", id, cols, rows, layout.feedback.h);
    int total = quiz_view_feedback_rows(&layout, text);
    if (first.last_top != (total > first.page ? total - first.page : 0))
        fail_msg("%s at %dx%d: the text takes %d rows, the box shows %d and scrolls down %d", id, cols, rows, total,
                 first.page, first.last_top);
    ui_screen screen;
    assert_int_equal(ui_screen_init(&screen, cols, rows, true, false), 0);
    ui_screen_set_cut_hook(&screen, record_cut, NULL);
    enum { ROW_BYTES = 1024 };
    char(*seen)[ROW_BYTES] = calloc((size_t)total + 1, ROW_BYTES);
    bool* filled = calloc((size_t)total + 1, sizeof *filled);
    char row[ROW_BYTES];
    for (int top = 0; top <= first.last_top + 2; top++) { // two past the end: it stays at the end
        quiz_view_scroll v = quiz_view_scroll_for(s, notice, cols, rows, top);
        int shown_top = top < first.last_top ? top : first.last_top;
        assert_int_equal(v.top, shown_top);
        cut_text[0] = '\0';
        quiz_view_draw(&screen, s, "", notice, top);
        if (cut_text[0]) fail_msg("%s at %dx%d, top %d: the view cut %s", id, cols, rows, top, cut_text);
        for (int i = 0; i < v.page && shown_top + i < total; i++) {
            row_text(&screen, layout.feedback.x + 2, layout.feedback.x + layout.feedback.w - 2,
                     layout.feedback.y + 1 + i, row, sizeof row);
            int k = shown_top + i;
            if (filled[k] && strcmp(seen[k], row) != 0)
                fail_msg("%s at %dx%d: row %d reads '%s' at top %d, '%s' before", id, cols, rows, k, row, top, seen[k]);
            snprintf(seen[k], ROW_BYTES, "%s", row);
            filled[k] = true;
        }
        char top_edge[ROW_BYTES], bottom_edge[ROW_BYTES];
        row_text(&screen, 0, cols, layout.feedback.y, top_edge, sizeof top_edge);
        row_text(&screen, 0, cols, layout.feedback.y + layout.feedback.h - 1, bottom_edge, sizeof bottom_edge);
        bool above = strstr(top_edge, "more") != NULL, below = strstr(bottom_edge, "more") != NULL;
        if (above != (shown_top > 0) || below != (shown_top < first.last_top))
            fail_msg("%s at %dx%d, top %d of %d: frame reads '%s' / '%s'", id, cols, rows, shown_top, first.last_top,
                     top_edge, bottom_edge);
    }
    size_t joined_size = (size_t)(total + 1) * ROW_BYTES;
    char* joined = calloc(1, joined_size);
    for (int k = 0; k < total; k++) {
        if (!filled[k]) fail_msg("%s at %dx%d: row %d of %d never shown", id, cols, rows, k, total);
        strcat(joined, seen[k]);
    }
    char* expected = calloc(1, joined_size);
    char* got = calloc(1, joined_size);
    without_blanks(text, expected, joined_size);
    without_blanks(joined, got, joined_size);
    if (strcmp(expected, got) != 0) fail_msg("%s at %dx%d: scrolling shows\n%s\nnot\n%s", id, cols, rows, joined, text);
    free(expected);
    free(got);
    free(joined);
    free(filled);
    free(seen);
    ui_screen_free(&screen);
    return first.last_top;
}

// What 'p' shows: the line quiz_app prints first, then the result line.
static void prove_it_notice(const quiz_session* s, int length, char* out, size_t size) {
    char line[4096];
    long_result_line(line, length, quiz_session_claim(s));
    snprintf(out, size, "running the lesson check for %s in quiz/../lessons (headless)...\n%s\n", quiz_session_claim(s),
             line);
}

// A 600-character prove-it line is shown whole at 80x24 below every bank
// question that has a claim: it takes the body below the header. (The
// feedback box below the question had 9 rows or fewer for its 10, and cut
// the rest without a word.)
static void test_prove_it_is_whole_at_80x24(void** state) {
    fixture* f = *state;
    quiz_session s;
    quiz_session_options o = {QUIZ_ALL_TOPICS, 100, 3, QUIZ_LANG_EN, NOW, true, false};
    error_info err = {{0}};
    if (quiz_session_start(&s, &o, &f->bank, &f->models, &f->progress, &err)) fail_msg("%s", err.message);
    int checked = 0;
    while (s.stage != QUIZ_STAGE_DONE) {
        char answer[64], notice[4200];
        answer_for(quiz_session_question(&s), false, answer, sizeof answer);
        feed(&s, answer);
        if (s.stage == QUIZ_STAGE_SELF_GRADE) feed(&s, "n");
        assert_int_equal(s.stage, QUIZ_STAGE_FEEDBACK);
        if (quiz_session_claim(&s)) {
            prove_it_notice(&s, 600, notice, sizeof notice);
            assert_int_equal(expect_reachable(&s, notice, 80, 24), 0);
            checked++;
        }
        quiz_session_next(&s);
    }
    assert_true(checked >= 20);
    quiz_session_free(&s);
}

// Where it does not fit, it scrolls, and every character of it can be
// reached: smaller terminals, and a longer line at 80x24.
static void test_prove_it_scrolls_where_it_does_not_fit(void** state) {
    fixture* f = *state;
    quiz_session s = start(f, QUIZ_ALL_TOPICS, 100, 5);
    advance_to(&s, is_true_false);
    while (s.stage != QUIZ_STAGE_DONE && !quiz_session_claim(&s)) {
        s.stage = QUIZ_STAGE_FEEDBACK;
        quiz_session_next(&s);
        advance_to(&s, is_true_false);
    }
    assert_int_not_equal(s.stage, QUIZ_STAGE_DONE);
    feed(&s, quiz_session_question(&s)->item->truth ? "f" : "t");
    assert_int_equal(s.stage, QUIZ_STAGE_FEEDBACK);
    char notice[4200];
    prove_it_notice(&s, 600, notice, sizeof notice);
    static const int SIZES[][2] = {{80, 12}, {80, 10}, {60, 14}, {45, 12}, {30, 8}};
    for (size_t i = 0; i < sizeof SIZES / sizeof SIZES[0]; i++)
        if (expect_reachable(&s, notice, SIZES[i][0], SIZES[i][1]) == 0)
            fail_msg("600 characters at %dx%d fit without scrolling: the test checks nothing", SIZES[i][0],
                     SIZES[i][1]);
    prove_it_notice(&s, 2400, notice, sizeof notice);
    assert_true(expect_reachable(&s, notice, 80, 24) > 0);
    // The marks and the key bar say how, in words.
    ui_screen screen;
    assert_int_equal(ui_screen_init(&screen, 80, 12, true, false), 0);
    quiz_view_draw(&screen, &s, "", notice, 1);
    char* text = dump(&screen);
    assert_non_null(strstr(text, "more above (↑, PgUp)"));
    assert_non_null(strstr(text, "more below (↓, PgDn)"));
    assert_non_null(strstr(text, "↑↓ PgUp PgDn: scroll"));
    assert_non_null(strstr(text, "Enter or space: next"));
    free(text);
    ui_screen_free(&screen);
    assert_int_equal(ui_screen_init(&screen, 80, 12, false, false), 0); // ASCII terminals
    quiz_view_draw(&screen, &s, "", notice, 1);
    text = dump(&screen);
    assert_non_null(strstr(text, "more above (Up, PgUp)"));
    assert_non_null(strstr(text, "more below (Down, PgDn)"));
    free(text);
    ui_screen_free(&screen);
    quiz_session_free(&s);
}

// Draws the question being asked with the answer half typed: nothing is
// cut (or the view says which size it needs).
static void expect_nothing_cut(const quiz_session* s, int cols, int rows) {
    ui_screen screen;
    assert_int_equal(ui_screen_init(&screen, cols, rows, true, false), 0);
    ui_screen_set_cut_hook(&screen, record_cut, NULL);
    cut_text[0] = '\0';
    quiz_view_draw(&screen, s, "the bytes", NULL, 0);
    if (cut_text[0]) fail_msg("%s at %dx%d: the view cut %s", quiz_session_question(s)->id, cols, rows, cut_text);
    ui_screen_free(&screen);
}

// The graded feedback scrolls too where it does not fit, and never
// vanishes: at sizes from the quiz's smallest up, every question's feedback
// (bank items and drills, right and wrong) can be read whole.
static void test_feedback_scrolls_at_small_sizes(void** state) {
    fixture* f = *state;
    static const int SIZES[][2] = {{80, 8}, {80, 9}, {80, 12}, {80, 16}, {60, 12}, {40, 14}, {30, 20}};
    int checked = 0, scrolled = 0;
    for (int right = 0; right < 2; right++)
        for (uint64_t seed = 0; seed < 3; seed++) {
            quiz_session s;
            quiz_session_options o = {QUIZ_ALL_TOPICS, 100, seed, QUIZ_LANG_EN, NOW, false, seed > 0};
            error_info err = {{0}};
            if (quiz_session_start(&s, &o, &f->bank, &f->models, &f->progress, &err)) fail_msg("%s", err.message);
            while (s.stage != QUIZ_STAGE_DONE) {
                char answer[64];
                answer_for(quiz_session_question(&s), right, answer, sizeof answer);
                for (size_t i = 0; i < sizeof SIZES / sizeof SIZES[0]; i++) // the question being asked
                    expect_nothing_cut(&s, SIZES[i][0], SIZES[i][1]);
                feed(&s, answer);
                for (int graded = 0; graded < 2; graded++) {
                    for (size_t i = 0; i < sizeof SIZES / sizeof SIZES[0]; i++) {
                        int need_cols, need_rows;
                        if (!quiz_view_fits(&s, NULL, SIZES[i][0], SIZES[i][1], &need_cols, &need_rows)) continue;
                        scrolled += expect_reachable(&s, NULL, SIZES[i][0], SIZES[i][1]) > 0;
                        checked++;
                    }
                    if (s.stage != QUIZ_STAGE_SELF_GRADE) break;
                    feed(&s, "y");
                }
                quiz_session_next(&s);
            }
            quiz_session_free(&s);
        }
    assert_true(checked > 200);
    assert_true(scrolled > 50);
}

// ---- the keys that scroll (quiz_app) --------------------------------------------------------

static int fake_prove(const char* lessons_dir, const char* claim_id, FILE* out, error_info* err) {
    (void)err;
    assert_string_equal(lessons_dir, "quiz/../lessons");
    char line[4096];
    long_result_line(line, 600, claim_id);
    fprintf(out, "running the lesson check for %s in quiz/../lessons (headless)...\n%s\n", claim_id, line);
    return 0;
}

static void test_scroll_keys(void** state) {
    fixture* f = *state;
    quiz_app app;
    memset(&app, 0, sizeof app);
    quiz_app_drawn drawn = {0, 0};
    app.drawn = &drawn;
    app.prove = fake_prove;
    snprintf(app.lessons_dir, sizeof app.lessons_dir, "quiz/../lessons");
    app.session = start(f, QUIZ_ALL_TOPICS, 100, 5);
    app.session_started = true;
    quiz_session* s = &app.session;
    advance_to(s, is_true_false);
    while (s->stage != QUIZ_STAGE_DONE && !quiz_session_claim(s)) {
        s->stage = QUIZ_STAGE_FEEDBACK;
        quiz_session_next(s);
        advance_to(s, is_true_false);
    }
    int question = s->current;
    feed(s, quiz_session_question(s)->item->truth ? "f" : "t");
    assert_int_equal(s->stage, QUIZ_STAGE_FEEDBACK);
    assert_true(quiz_app_key(&app, QUIZ_KEY_DOWN)); // nothing drawn yet: nothing to scroll
    assert_int_equal(app.feedback_top, 0);
    assert_true(quiz_app_key(&app, 'p'));
    assert_non_null(app.notice);
    ui_screen screen;
    assert_int_equal(ui_screen_init(&screen, 80, 10, true, false), 0);
    quiz_app_draw(&screen, &app);
    quiz_view_scroll v = quiz_view_scroll_for(s, app.notice, 80, 10, 0);
    assert_true(v.last_top >= 2 && v.page >= 2);
    char* text = dump(&screen);
    assert_non_null(strstr(text, "more below"));
    assert_null(strstr(text, "more above"));
    free(text);
    assert_true(quiz_app_key(&app, QUIZ_KEY_DOWN));
    assert_int_equal(app.feedback_top, 1);
    quiz_app_draw(&screen, &app);
    text = dump(&screen);
    assert_non_null(strstr(text, "more above"));
    free(text);
    assert_true(quiz_app_key(&app, QUIZ_KEY_END));
    assert_int_equal(app.feedback_top, v.last_top);
    assert_true(quiz_app_key(&app, QUIZ_KEY_DOWN)); // the end holds
    assert_true(quiz_app_key(&app, QUIZ_KEY_PGDN));
    assert_int_equal(app.feedback_top, v.last_top);
    quiz_app_draw(&screen, &app);
    text = dump(&screen);
    assert_null(strstr(text, "more below"));
    assert_non_null(strstr(text, "more above"));
    free(text);
    assert_true(quiz_app_key(&app, QUIZ_KEY_PGUP)); // a page less one row
    int expected = v.last_top - (v.page - 1);
    assert_int_equal(app.feedback_top, expected > 0 ? expected : 0);
    assert_true(quiz_app_key(&app, QUIZ_KEY_HOME));
    assert_int_equal(app.feedback_top, 0);
    assert_true(quiz_app_key(&app, QUIZ_KEY_UP)); // the top holds
    assert_int_equal(app.feedback_top, 0);
    assert_true(quiz_app_key(&app, QUIZ_KEY_PGDN));
    assert_int_equal(app.feedback_top, v.page - 1 < v.last_top ? v.page - 1 : v.last_top);
    // On a terminal where it all fits, nothing is hidden and the keys rest at 0.
    ui_screen_resize(&screen, 80, 24);
    quiz_app_draw(&screen, &app);
    text = dump(&screen);
    assert_null(strstr(text, "more "));
    free(text);
    assert_true(quiz_app_key(&app, QUIZ_KEY_DOWN));
    assert_int_equal(app.feedback_top, 0);
    ui_screen_resize(&screen, 80, 10);
    quiz_app_draw(&screen, &app);
    assert_true(quiz_app_key(&app, QUIZ_KEY_DOWN));
    assert_int_equal(app.feedback_top, 1);
    // The quiz's keys work as before: 'p' runs it again from the top; Enter goes on.
    assert_true(quiz_app_key(&app, 'p'));
    assert_int_equal(app.feedback_top, 0);
    assert_non_null(app.notice);
    assert_true(quiz_app_key(&app, QUIZ_KEY_DOWN));
    assert_true(quiz_app_key(&app, '\n'));
    assert_null(app.notice);
    assert_int_equal(app.feedback_top, 0);
    assert_int_equal(s->current, question + 1);
    assert_int_equal(s->stage, QUIZ_STAGE_ASK);
    // While typing an answer, the scroll keys type nothing.
    assert_true(quiz_app_key(&app, QUIZ_KEY_DOWN));
    assert_string_equal(app.input, "");
    ui_screen_free(&screen);
    quiz_session_free(s);
}

// The bank writes every right choice first; the session shuffles them. A
// student who always answers the same letter scores no better than chance
// + 10%, over 200 sessions of the whole bank.
static void test_no_letter_is_right_more_often_than_chance(void** state) {
    fixture* f = *state;
    int hits[QUIZ_MAX_CHOICES] = {0}, asked = 0;
    double chance = 0;
    for (uint64_t seed = 1; seed <= 200; seed++) {
        quiz_session s;
        quiz_session_options o = {QUIZ_ALL_TOPICS, 100, seed, QUIZ_LANG_EN, NOW, true, false};
        error_info err = {{0}};
        if (quiz_session_start(&s, &o, &f->bank, &f->models, &f->progress, &err)) fail_msg("%s", err.message);
        for (int i = 0; i < s.n_questions; i++) {
            const quiz_question* q = &s.questions[i];
            if (!q->item || q->item->n_choices < 2) continue;
            asked++;
            chance += 1.0 / q->item->n_choices;
            for (int k = 0; k < q->item->n_choices; k++)
                hits[k] += q->choice_order[k] == q->item->correct_choice;
        }
        quiz_session_free(&s);
    }
    assert_true(asked >= 200 * 16);
    chance /= asked;
    for (int k = 0; k < QUIZ_MAX_CHOICES; k++)
        if ((double)hits[k] / asked > chance + 0.10)
            fail_msg("always '%c' scores %.0f%% over %d questions; chance is %.0f%%", 'a' + k, 100.0 * hits[k] / asked,
                     asked, 100 * chance);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_topics_and_count, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_letter_is_right_more_often_than_chance, setup, teardown),
        cmocka_unit_test_setup_teardown(test_due_items_come_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_true_false_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_choice_text_and_numeric_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hinglish_rendering, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats_per_topic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_view_draws_headless, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_feedback_is_whole_at_80x24, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prove_it_is_whole_at_80x24, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prove_it_scrolls_where_it_does_not_fit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_feedback_scrolls_at_small_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scroll_keys, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
