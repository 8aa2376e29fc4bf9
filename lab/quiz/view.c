#include "lab/quiz/view.h"

#include <stdio.h>
#include <string.h>

// Columns of UTF-8 text (continuation bytes take none).
static int text_columns(const char* text, int bytes) {
    int columns = 0;
    for (int i = 0; i < bytes; i++)
        columns += ((unsigned char)text[i] & 0xc0) != 0x80;
    return columns;
}

// Wraps text at r.w columns, skipping its first `skip` rows and drawing the
// next r.h into r (when screen is not NULL); returns the rows the whole
// text takes (counted to the end, drawn or not).
static int wrap_from(ui_screen* screen, ui_rect r, ui_color color, int attr, const char* text, int skip) {
    if (r.w < 1) return 0;
    int row = 0;
    char line[1024];
    const char* p = text;
    while (*p) {
        // The longest run of words that fits in r.w columns, up to a newline.
        int end = 0, last_break = -1;
        while (p[end] && p[end] != '\n' && text_columns(p, end + 1) <= r.w && end < (int)sizeof line - 1) {
            if (p[end] == ' ') last_break = end;
            end++;
        }
        bool line_ends = p[end] == '\0' || p[end] == '\n';
        int take = !line_ends && last_break > 0 ? last_break : end;
        if (screen && row >= skip && row < skip + r.h) {
            memcpy(line, p, (size_t)take);
            line[take] = '\0';
            ui_put(screen, r.x, r.y + row - skip, r.w, color, attr, line);
        }
        row++;
        p += take;
        if (*p == ' ' || *p == '\n') p++;
    }
    return row;
}

// Wraps text into r (drawn when screen is not NULL); returns the rows used.
static int wrap(ui_screen* screen, ui_rect r, ui_color color, int attr, const char* text) {
    int rows = wrap_from(screen, r, color, attr, text, 0);
    return rows < r.h ? rows : r.h;
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

bool quiz_view_fits(const quiz_session* s, const char* notice, int cols, int rows, int* need_cols, int* need_rows) {
    *need_cols = cols > QUIZ_MIN_COLS ? cols : QUIZ_MIN_COLS;
    *need_rows = QUIZ_MIN_ROWS;
    if (s->stage != QUIZ_STAGE_DONE && !notice) {
        // Header, the question in its frame, the answer box (3) and the key bar.
        int need = 1 + question_rows(s, *need_cols) + 2 + 3 + 1;
        if (need > *need_rows) *need_rows = need;
    }
    return cols >= *need_cols && rows >= *need_rows;
}

// The key bar for the stage, with the scroll keys first when the feedback
// box scrolls. Each hint has shorter forms, so that a narrow terminal shows
// short hints rather than a hint cut in half.
static void key_bar(ui_line* bar, const quiz_session* s, const char* notice, bool scrolls, bool utf8) {
    ui_line_init(bar);
    if (scrolls) {
        if (utf8)
            ui_line_text(bar, 6, " ↑↓ PgUp PgDn: scroll ", " ↑↓ PgUp/Dn ", " ↑↓", NULL);
        else
            ui_line_text(bar, 6, " Up/Down PgUp/PgDn: scroll ", " Up/Dn PgUp/Dn ", " Up/Dn", NULL);
    }
    switch (s->stage) {
    case QUIZ_STAGE_ASK:
        ui_line_text(bar, 9, " Enter: answer", " Enter:answer", NULL);
        ui_line_text(bar, 5, "   Backspace: erase", "  Bksp: erase", " Bksp:erase", NULL);
        ui_line_text(bar, 7, "   Esc or Ctrl-C: quit (progress is saved)", "   Esc: quit (saved)", " Esc:quit", NULL);
        break;
    case QUIZ_STAGE_SELF_GRADE:
        ui_line_text(bar, 9, " y: mine matched", " y: matched", " y:yes", NULL);
        ui_line_text(bar, 9, "   n: it did not", "  n: did not", " n:no", NULL);
        ui_line_text(bar, 7, "   q or Esc: quit", "  q: quit", " q:quit", NULL);
        break;
    case QUIZ_STAGE_FEEDBACK:
        if (quiz_session_claim(s) && notice)
            ui_line_text(bar, 8, " p: run it again", " p: again", " p:again", NULL);
        else if (quiz_session_claim(s))
            ui_line_text(bar, 8, " p: prove it (run the lesson check)", " p: prove it", " p:prove", NULL);
        ui_line_text(bar, 9, "   Enter or space: next", "  Enter: next", " Enter:next", NULL);
        ui_line_text(bar, 7, "   q: quit", "  q: quit", " q:quit", NULL);
        break;
    default: ui_line_text(bar, 9, " any key: leave", NULL); break;
    }
}

quiz_view_layout quiz_view_layout_for(const quiz_session* s, const char* notice, int cols, int rows) {
    quiz_view_layout layout;
    int body_height = rows - 2; // between the header and the key bar
    if (notice) {
        // The prove-it output has the body to itself: the question was
        // answered, and its result line runs to several hundred characters.
        layout.question = layout.answer = (ui_rect){0, 1, cols, 0};
        layout.feedback = (ui_rect){0, 1, cols, body_height >= 3 ? body_height : 0};
        return layout;
    }
    // Two fifths of the body, or more where the question needs it (the
    // feedback box gives up its rows first; quiz_view_fits made sure the
    // question and the answer box fit).
    int question_height = body_height * 2 / 5;
    if (question_height < 4) question_height = 4;
    int question_needs = question_rows(s, cols) + 2;
    if (question_height < question_needs) question_height = question_needs;
    bool graded = s->stage == QUIZ_STAGE_SELF_GRADE || s->stage == QUIZ_STAGE_FEEDBACK;
    if (graded && body_height - question_height - 3 < 3) question_height = 0; // the feedback must show
    layout.question = (ui_rect){0, 1, cols, question_height};
    layout.answer = (ui_rect){0, 1 + question_height, cols, 3};
    int feedback_y = layout.answer.y + 3, feedback_height = rows - 1 - feedback_y;
    layout.feedback = (ui_rect){0, feedback_y, cols, feedback_height >= 3 ? feedback_height : 0};
    return layout;
}

// The text inside the feedback box: 2 columns of margin each side.
static ui_rect feedback_text_rect(const quiz_view_layout* layout) {
    ui_rect box = layout->feedback;
    return (ui_rect){box.x + 2, box.y + 1, box.w - 4 > 1 ? box.w - 4 : 1, box.h >= 3 ? box.h - 2 : 0};
}

int quiz_view_feedback_rows(const quiz_view_layout* layout, const char* text) {
    return wrap_from(NULL, feedback_text_rect(layout), UI_DEFAULT, 0, text, 0);
}

quiz_view_scroll quiz_view_scroll_for(const quiz_session* s, const char* notice, int cols, int rows, int top) {
    quiz_view_layout layout = quiz_view_layout_for(s, notice, cols, rows);
    quiz_view_scroll v = {0, 0, feedback_text_rect(&layout).h};
    int total = quiz_view_feedback_rows(&layout, notice ? notice : s->feedback);
    v.last_top = total > v.page && v.page > 0 ? total - v.page : 0;
    v.top = top < 0 ? 0 : top > v.last_top ? v.last_top : top;
    return v;
}

// "more above" / "more below" in the feedback box's frame, at its right end,
// so that no row of text is given up for them (a 3-row box shows one).
static void scroll_marks(ui_screen* screen, ui_rect box, int title_columns, const quiz_view_scroll* v) {
    bool utf8 = screen->utf8;
    for (int edge = 0; edge < 2; edge++) {
        bool more = edge == 0 ? v->top > 0 : v->top < v->last_top;
        if (!more) continue;
        ui_line mark;
        ui_line_init(&mark);
        if (edge == 0)
            ui_line_text(&mark, 9, utf8 ? " more above (↑, PgUp) " : " more above (Up, PgUp) ",
                         utf8 ? " more above (↑) " : " more above (Up) ", utf8 ? " ↑ more " : " ^ more ", NULL);
        else
            ui_line_text(&mark, 9, utf8 ? " more below (↓, PgDn) " : " more below (Down, PgDn) ",
                         utf8 ? " more below (↓) " : " more below (Down) ", utf8 ? " ↓ more " : " v more ", NULL);
        // The top edge holds the title at its left: the mark keeps clear of it.
        int room = box.w - 4 - (edge == 0 ? title_columns + 1 : 0);
        char text[UI_LINE_FORM_BYTES];
        int columns = ui_line_fit(&mark, room, text, sizeof text);
        if (columns <= 0 || columns > room) continue;
        ui_put(screen, box.x + box.w - 2 - columns, edge == 0 ? box.y : box.y + box.h - 1, columns, UI_TITLE,
               UI_REVERSE, text);
    }
}

void quiz_view_draw(ui_screen* screen, const quiz_session* s, const char* input, const char* notice, int feedback_top) {
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
    if (!quiz_view_fits(s, notice, cols, rows, &need_cols, &need_rows)) {
        // Never a question in part: the student would answer what they cannot see.
        char need[96];
        snprintf(need, sizeof need, "terminal too small: need at least %dx%d (Esc leaves)", need_cols, need_rows);
        quiz_view_wrap(screen, (ui_rect){0, rows > 1 ? 1 : 0, cols, rows > 1 ? rows - 1 : 1}, UI_BAD, UI_BOLD, need);
        return;
    }
    int body_height = rows - 2; // between the header and the key bar
    bool scrolls = false;
    if (s->stage == QUIZ_STAGE_DONE) {
        ui_rect done = {0, 1, cols, body_height};
        ui_box(screen, done, "done", true);
        char summary[256];
        snprintf(summary, sizeof summary, "Session over: %d right, %d wrong. Progress is saved.", s->n_correct,
                 s->n_wrong);
        quiz_view_wrap(screen, (ui_rect){2, 2, cols - 4, body_height - 2}, UI_DEFAULT, UI_PLAIN, summary);
    } else {
        quiz_view_layout layout = quiz_view_layout_for(s, notice, cols, rows);
        ui_rect question_box = layout.question, answer_box = layout.answer, feedback_box = layout.feedback;
        if (question_box.h > 0) {
            char question[4096];
            quiz_session_format_question(s, question, sizeof question);
            ui_box(screen, question_box, "question", s->stage == QUIZ_STAGE_ASK);
            quiz_view_wrap(screen, (ui_rect){2, question_box.y + 1, cols - 4, question_box.h - 2}, UI_DEFAULT, UI_PLAIN,
                           question);
        }
        if (answer_box.h > 0) {
            // ui_box writes ">title " in cols - 4 columns: the short hint where the long one would be cut.
            const char* hint = quiz_session_input_hint(s);
            if (ui_text_columns(hint) + 2 > cols - 4) hint = quiz_session_input_hint_short(s);
            ui_box(screen, answer_box, hint, s->stage == QUIZ_STAGE_ASK);
            ui_printf(screen, 2, answer_box.y + 1, cols - 4, UI_DEFAULT, UI_BOLD, "> %s%s", input ? input : "",
                      s->stage == QUIZ_STAGE_ASK ? "_" : "");
        }
        if (feedback_box.h >= 3) {
            bool graded = s->stage == QUIZ_STAGE_FEEDBACK;
            const char* feedback_title = notice ? "prove it" : "feedback";
            ui_box(screen, feedback_box, feedback_title, s->stage != QUIZ_STAGE_ASK);
            ui_color color = notice || !graded ? UI_DEFAULT : (s->last_correct ? UI_GOOD : UI_BAD);
            quiz_view_scroll v = quiz_view_scroll_for(s, notice, cols, rows, feedback_top);
            wrap_from(screen, feedback_text_rect(&layout), color, UI_PLAIN, notice ? notice : s->feedback, v.top);
            // ui_box writes "> title " (focused) or " title ".
            scroll_marks(screen, feedback_box, ui_text_columns(feedback_title) + 3, &v);
            scrolls = v.last_top > 0;
        }
    }
    ui_line keys;
    key_bar(&keys, s, notice, scrolls, screen->utf8);
    ui_line_put(screen, 0, rows - 1, cols, UI_DEFAULT, UI_REVERSE, &keys);
}
