// quiz_app: one quiz session with everything it needs (the bank, the model
// shapes, the progress file, the "prove it" hook), shared by the two hosts
// that show it full screen: `servelab quiz` and the lab's quiz page (key z).
// The plain line-by-line front end (cmd_quiz.c) uses it too.
#ifndef SERVELAB_QUIZ_APP_H
#define SERVELAB_QUIZ_APP_H

#include <stdbool.h>
#include <stdio.h>

#include "base/error.h"
#include "lab/quiz/data.h"
#include "lab/quiz/session.h"
#include "lab/ui/screen.h"

// The scroll keys of the feedback box, with curses's codes (KEY_UP, KEY_DOWN,
// KEY_PPAGE, KEY_NPAGE, KEY_HOME, KEY_END; quiz_app.c checks they agree), so
// that `servelab quiz` passes getch() through and the lab maps its own.
enum {
    QUIZ_KEY_DOWN = 0402,
    QUIZ_KEY_UP = 0403,
    QUIZ_KEY_HOME = 0406,
    QUIZ_KEY_PGDN = 0522,
    QUIZ_KEY_PGUP = 0523,
    QUIZ_KEY_END = 0550,
};

// The size the view was last drawn at. The scroll keys need it (a page's
// rows, where the text ends); hosts draw from a const app, so quiz_app_draw
// records it through a pointer.
typedef struct quiz_app_drawn {
    int cols, rows; // 0 x 0 before the first draw
} quiz_app_drawn;

typedef struct quiz_app {
    quiz_bank bank;
    quiz_model_list models;
    quiz_progress progress;
    quiz_session session;
    bool session_started;
    char progress_path[1024];
    quiz_prove_fn prove;   // runs the lesson check of a claim
    char lessons_dir[1100]; // where prove finds the lessons: beside the quiz data (quiz/../lessons)
    char input[256];       // the answer being typed (full-screen view)
    char* notice;          // the prove-it output shown instead of the feedback, or NULL (malloc'ed)
    int feedback_top;      // the first row of the feedback (or prove-it) text shown; scroll keys move it
    quiz_app_drawn* drawn; // malloc'ed by quiz_app_load
    char save_error[512];  // why the last quiz_app_save failed, "" after one that worked
} quiz_app;

// Loads the bank and models from quiz_dir (NULL: found as quiz_find_dir
// does) and the progress file. A corrupt progress file is moved aside:
// `warning` (capacity bytes) then says so. -1 with err on failure.
int quiz_app_load(quiz_app* app, const char* quiz_dir, char* warning, size_t capacity, error_info* err);

// Starts a session (the app must be loaded).
int quiz_app_start(quiz_app* app, const quiz_session_options* options, error_info* err);

// Saves the progress atomically. 0, or -1 when the file was not written:
// then save_error says why, and so does `warnings` (may be NULL).
int quiz_app_save(quiz_app* app, FILE* warnings);

// One key of the full-screen view (curses key codes: '\n', 27 for Esc,
// 127 for backspace, QUIZ_KEY_* to scroll the feedback: up and down a row,
// PgUp and PgDn a page less one row, Home and End). Returns false when the
// session should end. A new text in the feedback box (an answer graded,
// 'p', the next question) starts at its top.
bool quiz_app_key(quiz_app* app, int key);

// True when a cols x rows screen cannot show the whole question (the view
// then says which size it needs, and only Esc should act).
bool quiz_app_too_small(const quiz_app* app, int cols, int rows);

// Draws the full-screen view.
void quiz_app_draw(ui_screen* screen, const quiz_app* app);

void quiz_app_free(quiz_app* app);

#endif
