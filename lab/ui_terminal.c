#include "lab/ui_terminal.h"

#include <curses.h>
#include <langinfo.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

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

// A crash (SIGSEGV, SIGABRT, ...) must not leave the user's shell in raw
// mode on the alternate screen. endwin() is not safe in a signal handler, so
// the handler does what is: it writes the escape sequences that leave the
// alternate screen and show the cursor, puts back the terminal modes saved
// before curses started, then lets the signal take its default course (a
// core dump, the exit status) by raising it again.
static struct termios saved_modes;
static bool have_saved_modes = false;

static void on_fatal_signal(int signal_number) {
    static const char reset[] = "\033[?1049l\033[?25h\033[0m\r\n";
    if (curses_active) {
        ssize_t ignored = write(STDOUT_FILENO, reset, sizeof reset - 1);
        (void)ignored;
        if (have_saved_modes) tcsetattr(STDIN_FILENO, TCSANOW, &saved_modes);
    }
    signal(signal_number, SIG_DFL);
    raise(signal_number);
}

int ui_terminal_open(bool* utf8, bool* color) {
    const char* codeset = nl_langinfo(CODESET);
    *utf8 = codeset && (strcmp(codeset, "UTF-8") == 0 || strcmp(codeset, "utf8") == 0);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_stop_signal;
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGHUP, &action, NULL);
    have_saved_modes = tcgetattr(STDIN_FILENO, &saved_modes) == 0;
    struct sigaction fatal;
    memset(&fatal, 0, sizeof fatal);
    fatal.sa_handler = on_fatal_signal;
    fatal.sa_flags = (int)SA_RESETHAND;
    static const int FATAL_SIGNALS[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof FATAL_SIGNALS / sizeof FATAL_SIGNALS[0]; i++) sigaction(FATAL_SIGNALS[i], &fatal, NULL);
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
