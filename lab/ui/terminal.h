// ui_terminal: taking over the terminal for a full-screen view, and always
// giving it back.
//
// One place for what every full-screen command needs (the dashboard, the
// quiz): SIGINT, SIGTERM, SIGHUP and SIGQUIT only raise a flag that the key
// loop polls (so the loop ends and restores the screen itself, and main
// returns 128 + the signal, as a shell reports a death by signal), ncurses
// in cbreak mode without echo, keypad keys, a hidden cursor, a short Esc
// delay, colour pairs unless NO_COLOR is set or the terminal has none, and
// endwin() registered at exit as a last resort. A crash (SIGSEGV, SIGABRT,
// ...) restores the terminal in its handler; a death no handler sees
// (SIGKILL, the OOM killer) is caught by a watcher process started here,
// named servelab-terminal-watcher, that restores the terminal once the
// process is gone.
#ifndef SERVELAB_UI_TERMINAL_H
#define SERVELAB_UI_TERMINAL_H

#include <signal.h>
#include <stdbool.h>

// Opens the terminal. *utf8: the locale's codeset is UTF-8 (call
// setlocale first); *color: colour pairs are set up. 0, or -1 when there is
// no terminal to open (ncurses could not start).
int ui_terminal_open(bool* utf8, bool* color);

// Gives the terminal back (endwin). Safe to call more than once.
void ui_terminal_close(void);

// True once SIGINT, SIGTERM, SIGHUP or SIGQUIT arrived after ui_terminal_open.
bool ui_terminal_stop_requested(void);

// The first of those signals to arrive, or 0: main exits with 128 + it.
int ui_terminal_stop_signal(void);

// The flag behind both, for work that must notice a stop while the key
// loop waits on it (a busy lesson: lesson_options.stop_flag).
const volatile sig_atomic_t* ui_terminal_stop_flag(void);

#endif
