#include "lab/quiz_view.h"

#include <stdio.h>
#include <string.h>

// Columns of UTF-8 text (continuation bytes take none).
static int text_columns(const char* text, int bytes) {
    int columns = 0;
    for (int i = 0; i < bytes; i++)
        columns += ((unsigned char)text[i] & 0xc0) != 0x80;
    return columns;
}

// Wraps text into r (drawn when screen is not NULL); returns the rows used.
static int wrap(ui_screen* screen, ui_rect r, ui_color color, int attr, const char* text) {
    int row = 0;
    char line[1024];
    const char* p = text;
    while (*p && row < r.h) {
        // The longest run of words that fits in r.w columns, up to a newline.
        int end = 0, last_break = -1;
        while (p[end] && p[end] != '\n' && text_columns(p, end + 1) <= r.w && end < (int)sizeof line - 1) {
            if (p[end] == ' ') last_break = end;
            end++;
        }
        bool line_ends = p[end] == '\0' || p[end] == '\n';
        int take = !line_ends && last_break > 0 ? last_break : end;
        memcpy(line, p, (size_t)take);
        line[take] = '\0';
        if (screen) ui_put(screen, r.x, r.y + row, r.w, color, attr, line);
        row++;
        p += take;
        if (*p == ' ' || *p == '\n') p++;
    }
    return row;
}

int quiz_view_wrap(ui_screen* screen, ui_rect r, ui_color color, int attr, const char* text) {
    return wrap(screen, r, color, attr, text);
}

enum { QUIZ_MIN_COLS = 30, QUIZ_MIN_ROWS = 8 };

// Rows of the question wrapped at the question box's width (cols - 4).
static int question_rows(const quiz_session* s, int cols) {
    char question[4096];
    quiz_session_format_question(s, question, sizeof question);
    return wrap(NULL, (ui_rect){0, 0, cols - 4 > 1 ? cols - 4 : 1, 1 << 20}, UI_DEFAULT, 0, question);
}

bool quiz_view_fits(const quiz_session* s, int cols, int rows, int* need_cols, int* need_rows) {
    *need_cols = cols > QUIZ_MIN_COLS ? cols : QUIZ_MIN_COLS;
    *need_rows = QUIZ_MIN_ROWS;
    if (s->stage != QUIZ_STAGE_DONE) {
        // Header, the question in its frame, the answer box (3) and the key bar.
        int need = 1 + question_rows(s, *need_cols) + 2 + 3 + 1;
        if (need > *need_rows) *need_rows = need;
    }
    return cols >= *need_cols && rows >= *need_rows;
}

static const char* key_bar(const quiz_session* s) {
    switch (s->stage) {
    case QUIZ_STAGE_ASK: return " Enter: answer   Backspace: erase   Esc or Ctrl-C: quit (progress is saved)";
    case QUIZ_STAGE_SELF_GRADE: return " y: mine matched   n: it did not   q or Esc: quit";
    case QUIZ_STAGE_FEEDBACK:
        return quiz_session_claim(s) ? " p: prove it (run the lesson check)   Enter or space: next   q: quit"
                                     : " Enter or space: next   q: quit";
    default: return " any key: leave";
    }
}

quiz_view_layout quiz_view_layout_for(const quiz_session* s, int cols, int rows) {
    quiz_view_layout layout;
    int body_height = rows - 2; // between the header and the key bar
    // Two fifths of the body, or more where the question needs it (the
    // feedback box gives up its rows first; quiz_view_fits made sure the
    // question and the answer box fit).
    int question_height = body_height * 2 / 5;
    if (question_height < 4) question_height = 4;
    int question_needs = question_rows(s, cols) + 2;
    if (question_height < question_needs) question_height = question_needs;
    layout.question = (ui_rect){0, 1, cols, question_height};
    layout.answer = (ui_rect){0, 1 + question_height, cols, 3};
    int feedback_y = layout.answer.y + 3, feedback_height = rows - 1 - feedback_y;
    layout.feedback = (ui_rect){0, feedback_y, cols, feedback_height >= 3 ? feedback_height : 0};
    return layout;
}

int quiz_view_feedback_rows(const quiz_view_layout* layout, const char* text) {
    int width = layout->feedback.w - 4 > 1 ? layout->feedback.w - 4 : 1;
    return wrap(NULL, (ui_rect){0, 0, width, 1 << 20}, UI_DEFAULT, 0, text);
}

void quiz_view_draw(ui_screen* screen, const quiz_session* s, const char* input, const char* notice) {
    ui_screen_clear(screen);
    int cols = screen->cols, rows = screen->rows;
    ui_rect header = {0, 0, cols, 1};
    ui_fill(screen, header, " ", UI_TITLE, UI_REVERSE);
    // The counts stay whole at any width (ui_line drops the title first).
    ui_line title;
    ui_line_init(&title);
    char question_of[64];
    snprintf(question_of, sizeof question_of, "   question %d of %d",
             s->current < s->n_questions ? s->current + 1 : s->n_questions, s->n_questions);
    ui_line_text(&title, 3, "servelab quiz", "quiz", NULL);
    ui_line_text(&title, 9, question_of, NULL);
    ui_line_number(&title, 8, false, "   right ", s->n_correct, 1, "");
    ui_line_number(&title, 8, false, "  wrong ", s->n_wrong, 1, "");
    ui_line_put(screen, 1, 0, cols - 2, UI_TITLE, UI_REVERSE | UI_BOLD, &title);
    int need_cols, need_rows;
    if (!quiz_view_fits(s, cols, rows, &need_cols, &need_rows)) {
        // Never a question in part: the student would answer what they cannot see.
        char need[96];
        snprintf(need, sizeof need, "terminal too small: need at least %dx%d (Esc leaves)", need_cols, need_rows);
        quiz_view_wrap(screen, (ui_rect){0, rows > 1 ? 1 : 0, cols, rows > 1 ? rows - 1 : 1}, UI_BAD, UI_BOLD, need);
        return;
    }
    int body_height = rows - 2; // between the header and the key bar
    if (s->stage == QUIZ_STAGE_DONE) {
        ui_rect done = {0, 1, cols, body_height};
        ui_box(screen, done, "done", true);
        char summary[256];
        snprintf(summary, sizeof summary, "Session over: %d right, %d wrong. Progress is saved.", s->n_correct,
                 s->n_wrong);
        quiz_view_wrap(screen, (ui_rect){2, 2, cols - 4, body_height - 2}, UI_DEFAULT, UI_PLAIN, summary);
    } else {
        char question[4096];
        quiz_session_format_question(s, question, sizeof question);
        quiz_view_layout layout = quiz_view_layout_for(s, cols, rows);
        ui_rect question_box = layout.question, answer_box = layout.answer, feedback_box = layout.feedback;
        ui_box(screen, question_box, "question", s->stage == QUIZ_STAGE_ASK);
        quiz_view_wrap(screen, (ui_rect){2, 2, cols - 4, question_box.h - 2}, UI_DEFAULT, UI_PLAIN, question);
        ui_box(screen, answer_box, quiz_session_input_hint(s), s->stage == QUIZ_STAGE_ASK);
        ui_printf(screen, 2, answer_box.y + 1, cols - 4, UI_DEFAULT, UI_BOLD, "> %s%s", input ? input : "",
                  s->stage == QUIZ_STAGE_ASK ? "_" : "");
        if (feedback_box.h >= 3) {
            bool graded = s->stage == QUIZ_STAGE_FEEDBACK;
            ui_box(screen, feedback_box, notice ? "prove it" : "feedback", s->stage != QUIZ_STAGE_ASK);
            ui_color color = notice || !graded ? UI_DEFAULT : (s->last_correct ? UI_GOOD : UI_BAD);
            quiz_view_wrap(screen, (ui_rect){2, feedback_box.y + 1, cols - 4, feedback_box.h - 2}, color, UI_PLAIN,
                           notice ? notice : s->feedback);
        }
    }
    ui_put(screen, 0, rows - 1, cols, UI_DEFAULT, UI_REVERSE, key_bar(s));
}
