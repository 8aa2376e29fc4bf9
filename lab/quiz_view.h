// quiz_view: the full-screen quiz, drawn into the dashboard's virtual
// screen (lab/ui_screen.h), so it can be flushed to ncurses or dumped as
// text in tests. Drawing only: the session decides what there is to show.
#ifndef SERVELAB_QUIZ_VIEW_H
#define SERVELAB_QUIZ_VIEW_H

#include <stdbool.h>

#include "lab/quiz_session.h"
#include "lab/ui_screen.h"

// Draws the header (question k/n, score), the question, the answer being
// typed (`input`), the feedback (or `notice`, e.g. the prove-it output,
// when not NULL) and a key bar for the stage.
void quiz_view_draw(ui_screen* screen, const quiz_session* s, const char* input, const char* notice);

// True when a cols x rows screen shows the whole question and the answer
// box; else *need_cols x *need_rows is a size that does (the view says so).
bool quiz_view_fits(const quiz_session* s, int cols, int rows, int* need_cols, int* need_rows);

// Where the boxes go on a cols x rows screen (a pure function of the size
// and the question, so that tests check fits without a terminal). The
// feedback box is empty (h 0) when fewer than 3 rows are left for it.
typedef struct quiz_view_layout {
    ui_rect question; // the question in its frame
    ui_rect answer;   // the line being typed, framed (3 rows)
    ui_rect feedback; // the feedback or the prove-it output, framed
} quiz_view_layout;

quiz_view_layout quiz_view_layout_for(const quiz_session* s, int cols, int rows);

// Rows `text` needs inside the feedback box of `layout` (its frame left out):
// more than layout.feedback.h - 2 and the end of the text is not shown.
int quiz_view_feedback_rows(const quiz_view_layout* layout, const char* text);

// Writes `text` into r, wrapped at spaces, '\n' starting a new line.
// Returns the rows used (the text is cut at the rectangle's bottom).
int quiz_view_wrap(ui_screen* screen, ui_rect r, ui_color color, int attr, const char* text);

#endif
