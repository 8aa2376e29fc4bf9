// The quiz session as pure functions: choosing questions (topics, Leitner
// order), grading every kind of answer, recording progress, statistics,
// and the full-screen view drawn headless.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "lab/quiz_session.h"
#include "lab/quiz_view.h"

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
    quiz_view_draw(&screen, &s, "tru", NULL);
    char* text = dump(&screen);
    assert_non_null(strstr(text, q->id));
    assert_non_null(strstr(text, "> tru_"));
    assert_non_null(strstr(text, "Esc or Ctrl-C: quit"));
    char first_words[24];
    snprintf(first_words, sizeof first_words, "%.20s", q->item->prompt.en);
    assert_non_null(strstr(text, first_words));
    free(text);
    feed(&s, q->item->truth ? "f" : "t");
    quiz_view_draw(&screen, &s, "", NULL);
    text = dump(&screen);
    assert_non_null(strstr(text, "p: prove it"));
    assert_non_null(strstr(text, "Wrong: it is"));
    free(text);
    quiz_view_draw(&screen, &s, "", "PASS tf1 ... -- measured");
    text = dump(&screen);
    assert_non_null(strstr(text, "PASS tf1 ... -- measured"));
    free(text);
    // Wrapping keeps every word, and nothing is drawn past the width.
    ui_screen_resize(&screen, 40, 12);
    quiz_view_draw(&screen, &s, "", NULL);
    text = dump(&screen);
    for (char* line = text; *line;) {
        char* end = strchr(line, '\n');
        assert_true(end - line <= 40);
        line = end + 1;
    }
    free(text);
    ui_screen_resize(&screen, 20, 5);
    quiz_view_draw(&screen, &s, "", NULL);
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
    quiz_view_layout layout = quiz_view_layout_for(s, cols, rows);
    int needed = quiz_view_feedback_rows(&layout, s->feedback), shown = layout.feedback.h - 2;
    if (needed > shown)
        fail_msg("%s at %dx%d: the feedback needs %d rows, its box shows %d:\n%s", quiz_session_question(s)->id, cols,
                 rows, needed, shown, s->feedback);
}

// At 80x24, the smallest size the lab supports, every question's feedback
// (verdict, explanation or worked answer, prove-it hint) is shown whole
// below its question: in both languages, graded right and wrong, and for
// 40 fresh draws of every drill. The tightest today are edge8 (8 rows of
// 8) and se2, se3 (7 of 7); the decode-time drill keeps a row spare.
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_topics_and_count, setup, teardown),
        cmocka_unit_test_setup_teardown(test_due_items_come_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_true_false_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_choice_text_and_numeric_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hinglish_rendering, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats_per_topic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_view_draws_headless, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_feedback_is_whole_at_80x24, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
