// lab_app: `servelab lab` while it runs: the dashboard with its lesson, quiz
// page and server, and what a key does to them. The lab puts the rooms
// together (ui, lesson, quiz, serve), so it sits in lab/cmd, above them all:
//
//   lab/cmd/lab.c           the flags; opens and closes the app
//   lab/cmd/lab_app.c       the actions: step, run time, lesson, server, quiz page
//   lab/cmd/lab_keys.c      one key, in any mode
//   lab/cmd/lab_terminal.c  the terminal loop (ncurses, frame throttling)
//   lab/cmd/lab_replay.c    the headless replay (--keys, --dump-frame)
#ifndef SERVELAB_LAB_APP_H
#define SERVELAB_LAB_APP_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "lab/lesson/lesson.h"
#include "lab/quiz/app.h"
#include "lab/serve/server.h"
#include "lab/ui/dashboard.h"
#include "lab/ui/panes.h"

// Keys beyond plain characters, as the terminal and --keys both name them.
enum {
    KEY_CODE_UP = 0x1001,
    KEY_CODE_DOWN,
    KEY_CODE_LEFT,
    KEY_CODE_RIGHT,
    KEY_CODE_F1,
    KEY_CODE_ENTER,
    KEY_CODE_TAB,
    KEY_CODE_ESC,
    KEY_CODE_BACKSPACE,
    KEY_CODE_RESIZE,
    KEY_CODE_PGUP,
    KEY_CODE_PGDN,
    KEY_CODE_FRAME,
    KEY_CODE_WAIT_BASE = 0x100000,   // + milliseconds (at most 600000)
    KEY_CODE_RESIZE_BASE = 0x200000, // + cols * 1024 + rows (each at most 1000)
};

typedef struct lab_app {
    dashboard d;
    ui_view v;
    bool quit;
    double next_step_at; // run mode: monotonic seconds of the next step
    // Run mode's cost, reported at exit: steps taken while running and the
    // wall time spent running (drawing and key handling included).
    uint64_t run_steps;
    double run_seconds;
    double run_since; // monotonic seconds when running last started, 0 when paused
    // --lesson: the lesson drives its own engines; space resumes it until it
    // ends, and the panes draw the engine it works on.
    lesson* lesson;
    lesson_status lesson_state;
    bool lesson_started;
    bool lesson_resume_pending; // the terminal draws "running" before the (blocking) resume
    bool in_terminal;
    // The quiz page (z): the quiz drawn in place of the panes until it ends
    // or Esc; the engines wait meanwhile.
    quiz_app quiz;
    bool quiz_loaded, quiz_open;
    uint64_t quiz_seed; // 0: from the clock
    int cols, rows;     // the screen keys act on (the terminal's, or --size and <resize:>)
    // --serve: the server inside the lab, stepped by lab_step (no engine thread
    // of its own), so that a paused lab holds every client's request.
    server* server;
    char serve_model[256]; // the `model` its clients name
    // Tests: the hook that watches the headless replay's screen (NULL in the program).
    ui_cut_hook cut_hook;
    void* cut_hook_user;
} lab_app;

// ---- lab_app.c: the actions

double lab_monotonic_seconds(void);
void lab_set_message(lab_app* a, const char* text);
// Adds the time since running started when the lab is paused; call after
// anything that may start or stop run mode.
void lab_track_run_time(lab_app* a);
// Stops run mode and prints its rate on stderr (mode: "terminal", "headless").
void lab_report_run_rate(lab_app* a, const char* mode);
// Space or n: one step of whatever the panes follow (the server's engine,
// the lesson, or the lab's own engines).
void lab_step(lab_app* a);
bool lab_lesson_active(const lab_app* a);
// Runs the lesson to its next pause, its end or an error.
void lab_resume_lesson(lab_app* a);
// Opens the lesson at path; a broken lesson shows in its pane (-1 with err).
int lab_open_lesson(lab_app* a, const char* path, double time_limit_s, error_info* err);
// --serve: copies the server's connection and queue counts into the
// dashboard; true when they changed (the frame is then redrawn).
bool lab_serve_poll(lab_app* a);
void lab_open_quiz(lab_app* a);
// The quiz page's key; closes the page, saving progress, when the quiz ends.
void lab_quiz_key(lab_app* a, int key);
void lab_draw(ui_screen* screen, const lab_app* a);

// ---- lab_keys.c

// One key, in any mode; the state says what happened.
void lab_handle_key(lab_app* a, int key);

// ---- lab_terminal.c and lab_replay.c: the two loops; each returns the exit status

int lab_run_terminal(lab_app* a);
// Headless: keys in order (the --keys syntax); the final screen (after any
// <frame> screens) goes to dump_path ("-": stdout).
int lab_run_headless(lab_app* a, const char* keys_text, const char* dump_path, int cols, int rows);
// "COLSxROWS", each 1..1000 (--size and <resize:>).
int lab_parse_size(const char* text, int* cols, int* rows, error_info* err);

#endif
