#include "lab/ui_terminal.h"

#include <curses.h>
#include <langinfo.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "lab/ui_screen.h"

static volatile sig_atomic_t stop_requested = 0;
static void on_stop_signal(int signal_number) {
    (void)signal_number;
    stop_requested = 1;
}

static bool curses_active = false;
static bool restore_registered = false;

void ui_terminal_close(void) {
    if (curses_active) {
        endwin();
        curses_active = false;
    }
}

bool ui_terminal_stop_requested(void) { return stop_requested != 0; }

int ui_terminal_open(bool* utf8, bool* color) {
    const char* codeset = nl_langinfo(CODESET);
    *utf8 = codeset && (strcmp(codeset, "UTF-8") == 0 || strcmp(codeset, "utf8") == 0);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_stop_signal;
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGHUP, &action, NULL);
    if (!initscr()) return -1;
    curses_active = true;
    if (!restore_registered) atexit(ui_terminal_close);
    restore_registered = true;
    cbreak();
    noecho();
    keypad(stdscr, TRUE);
    curs_set(0);
    set_escdelay(25);
    const char* no_color = getenv("NO_COLOR");
    *color = has_colors() && !(no_color && no_color[0]);
    if (*color) ui_screen_init_curses_colors();
    return 0;
}
