// quiz_view: the full-screen quiz, drawn into the dashboard's virtual
// screen (lab/ui/screen.h), so it can be flushed to ncurses or dumped as
// text in tests. Drawing only: the session decides what there is to show.
#ifndef SERVELAB_QUIZ_VIEW_H
#define SERVELAB_QUIZ_VIEW_H

#include <stdbool.h>

#include "lab/quiz/session.h"
#include "lab/ui/screen.h"

// Draws the header (question k/n, score), the question, the answer being
// typed (`input`), the feedback (or `notice`, e.g. the prove-it output,
// when not NULL) scrolled to its row `feedback_top` (clamped, see
// quiz_view_scroll_for), and a key bar for the stage.
void quiz_view_draw(ui_screen* screen, const quiz_session* s, const char* input, const char* notice, int feedback_top);

// True when a cols x rows screen shows the whole question and the answer
// box (while `notice` is shown, which hides them, the quiz's smallest size
// 30x8 will do); else *need_cols x *need_rows is a size that does (the view
// says so).
bool quiz_view_fits(const quiz_session* s, const char* notice, int cols, int rows, int* need_cols, int* need_rows);

// Where the boxes go on a cols x rows screen (a pure function of the size,
// the question and the stage, so that tests check fits without a
// terminal). An empty rectangle (h 0) is not drawn:
//   - asking: the question, the answer box, and the feedback box below
//     them when 3 or more rows are left for it;
//   - graded (SELF_GRADE, FEEDBACK): the same, but where fewer than 3 rows
//     are left the question (already answered) gives its rows to the
//     feedback, so that the feedback never vanishes;
//   - `notice` (the prove-it output) shown: the feedback box takes the
//     whole body below the header (prove-it lines run to several hundred
//     characters).
typedef struct quiz_view_layout {
    ui_rect question; // the question in its frame
    ui_rect answer;   // the line being typed, framed (3 rows)
    ui_rect feedback; // the feedback or the prove-it output, framed
} quiz_view_layout;

quiz_view_layout quiz_view_layout_for(const quiz_session* s, const char* notice, int cols, int rows);

// Rows `text` takes inside the feedback box of `layout` (its frame left
// out). More than layout.feedback.h - 2 and the box scrolls.
int quiz_view_feedback_rows(const quiz_view_layout* layout, const char* text);

// Text that does not fit the feedback box scrolls, a row at a time or a
// page at a time; the frame then says "more above" / "more below".
typedef struct quiz_view_scroll {
    int top;      // the first row of the text shown, 0..last_top
    int last_top; // the top that shows the end of the text (0: all of it fits)
    int page;     // rows of text shown at once (0: no feedback box)
} quiz_view_scroll;

// Where the feedback text (`notice` when not NULL, else the session's
// feedback) stands on a cols x rows screen when scrolled to `top`.
quiz_view_scroll quiz_view_scroll_for(const quiz_session* s, const char* notice, int cols, int rows, int top);

// Writes `text` into r, wrapped at spaces, '\n' starting a new line.
// Returns the rows used (the text is cut at the rectangle's bottom).
int quiz_view_wrap(ui_screen* screen, ui_rect r, ui_color color, int attr, const char* text);

#endif
