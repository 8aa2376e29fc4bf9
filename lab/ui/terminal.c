#include "lab/ui/terminal.h"

#include <curses.h>
#include <errno.h>
#include <fcntl.h>
#include <langinfo.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "lab/ui/screen.h"

// The state below is file-scope because the signal handlers and the atexit
// handler read it, and a handler is given no pointer; only this file
// changes it.

// The stop signals: each only records itself; the key loop polls and ends,
// restores the terminal, and main returns 128 + the signal.
static volatile sig_atomic_t stop_signal = 0;
static void on_stop_signal(int signal_number) {
    if (stop_signal == 0) stop_signal = signal_number;
}
static const int STOP_SIGNALS[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// What the fatal-signal and atexit handlers must put back.
static struct {
    bool curses_active;        // initscr ran and endwin has not
    bool restore_registered;   // atexit(ui_terminal_close) done
    struct termios saved_modes; // the terminal's modes before curses changed them
    bool have_saved_modes;
    int watcher_fd;            // the lab's end of the watcher's socket, or -1
    pid_t watcher_pid;         // the watcher process (below), or -1
} terminal = {false, false, {0}, false, -1, -1};

// What leaves the alternate screen, shows the cursor and resets the attributes.
static const char RESET_SEQUENCE[] = "\033[?1049l\033[?25h\033[0m\r\n";

// ---- the watcher -------------------------------------------------------------------------
//
// A signal handler cannot help when the process is killed outright
// (SIGKILL, the OOM killer): nothing of it runs. So a small child process
// watches: it holds one end of a socket pair, the lab the other. When the
// lab ends in any way its end closes and the child's read() returns 0; the
// child then puts the terminal back (the escape sequences, the saved modes)
// and exits. When the lab gives the terminal back itself it first sends one
// byte, "restored, stay quiet", and the child exits without a word. A
// socket rather than a pipe so that the lab's send() can never raise
// SIGPIPE (MSG_NOSIGNAL) should the child be gone.
static const char WATCHER_NAME[] = "servelab-terminal-watcher";

// Closes every descriptor but stdin, stdout and `keep` (async-signal-safe).
static void close_all_but(int keep) {
    int closed_by_range = -1;
#ifdef SYS_close_range
    if (keep > 3) closed_by_range = (int)syscall(SYS_close_range, 3u, (unsigned)(keep - 1), 0u);
    else closed_by_range = 0;
    if (closed_by_range == 0) closed_by_range = (int)syscall(SYS_close_range, (unsigned)(keep + 1), ~0u, 0u);
#endif
    if (closed_by_range != 0)
        for (int fd = 3; fd < 4096; fd++)
            if (fd != keep) close(fd);
    if (keep != STDERR_FILENO) close(STDERR_FILENO);
}

static void watcher_main(int fd, size_t args_length) {
    // Its own name in ps and /proc/PID/cmdline (the argument area is this
    // process's copy), so that neither a user nor a test takes it for the lab.
    if (args_length > sizeof WATCHER_NAME) {
        memset(program_invocation_name, 0, args_length);
        memcpy(program_invocation_name, WATCHER_NAME, sizeof WATCHER_NAME);
    }
    struct sigaction ignore;
    memset(&ignore, 0, sizeof ignore);
    ignore.sa_handler = SIG_IGN;
    // The terminal's signals go to the whole foreground group, this child
    // included; it must outlive the lab. SIGTTOU: once the lab is gone a
    // job-control shell takes the terminal back, and writing to it or
    // tcsetattr() from the background would stop the child.
    static const int IGNORED[] = {SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGTSTP, SIGTTOU, SIGTTIN, SIGPIPE, SIGWINCH};
    for (size_t i = 0; i < sizeof IGNORED / sizeof IGNORED[0]; i++) sigaction(IGNORED[i], &ignore, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    close_all_but(fd);
    char byte;
    ssize_t n;
    do n = read(fd, &byte, 1);
    while (n < 0 && errno == EINTR);
    if (n <= 0) { // the lab is gone without giving the terminal back
        ssize_t ignored = write(STDOUT_FILENO, RESET_SEQUENCE, sizeof RESET_SEQUENCE - 1);
        (void)ignored;
        tcsetattr(STDIN_FILENO, TCSANOW, &terminal.saved_modes);
    }
    _exit(0);
}

// Bytes of this process's argument area, as /proc/self/cmdline shows it
// (0 when unknown: the watcher then keeps the lab's name).
static size_t argument_area_length(void) {
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buffer[4096];
    size_t total = 0;
    ssize_t n;
    bool starts_with_name = false;
    while ((n = read(fd, buffer, sizeof buffer)) > 0) {
        if (total == 0)
            starts_with_name = program_invocation_name &&
                               strncmp(buffer, program_invocation_name, (size_t)n) == 0 &&
                               strlen(program_invocation_name) < (size_t)n;
        total += (size_t)n;
    }
    close(fd);
    return starts_with_name ? total : 0;
}

static void start_watcher(void) {
    if (terminal.watcher_pid > 0 || !terminal.have_saved_modes) return;
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return; // no watcher: the handlers remain
    size_t args_length = argument_area_length();
    fflush(NULL); // nothing buffered gets written twice
    pid_t pid = fork();
    if (pid == 0) watcher_main(fds[1], args_length); // never returns
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        return;
    }
    terminal.watcher_fd = fds[0];
    terminal.watcher_pid = pid;
}

// Tells the watcher the terminal is back (it exits quietly) and reaps it.
static void stop_watcher(void) {
    if (terminal.watcher_pid <= 0) return;
    ssize_t sent = send(terminal.watcher_fd, "q", 1, MSG_NOSIGNAL);
    (void)sent;
    close(terminal.watcher_fd);
    terminal.watcher_fd = -1;
    // It exits at once; should it not (stopped by a debugger), stop waiting
    // after a second and leave it to init.
    for (int waited_ms = 0; waited_ms < 1000; waited_ms++) {
        pid_t done = waitpid(terminal.watcher_pid, NULL, WNOHANG);
        if (done == terminal.watcher_pid || (done < 0 && errno != EINTR)) break;
        struct timespec millisecond = {0, 1000000L};
        nanosleep(&millisecond, NULL);
    }
    terminal.watcher_pid = -1;
}

// ---- opening and closing --------------------------------------------------------------

void ui_terminal_close(void) {
    if (terminal.curses_active) {
        endwin();
        terminal.curses_active = false;
    }
    stop_watcher();
}

bool ui_terminal_stop_requested(void) { return stop_signal != 0; }

const volatile sig_atomic_t* ui_terminal_stop_flag(void) { return &stop_signal; }

int ui_terminal_stop_signal(void) { return (int)stop_signal; }

// A crash (SIGSEGV, SIGABRT, ...) must not leave the user's shell in raw
// mode on the alternate screen. endwin() is not safe in a signal handler, so
// the handler does what is: it writes the escape sequences that leave the
// alternate screen and show the cursor, puts back the terminal modes saved
// before curses started, tells the watcher so, then lets the signal take its
// default course (a core dump, the exit status) by raising it again.
static void on_fatal_signal(int signal_number) {
    if (terminal.curses_active) {
        ssize_t ignored = write(STDOUT_FILENO, RESET_SEQUENCE, sizeof RESET_SEQUENCE - 1);
        (void)ignored;
        if (terminal.have_saved_modes) tcsetattr(STDIN_FILENO, TCSANOW, &terminal.saved_modes);
        if (terminal.watcher_fd >= 0) ignored = send(terminal.watcher_fd, "q", 1, MSG_NOSIGNAL);
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
    for (size_t i = 0; i < sizeof STOP_SIGNALS / sizeof STOP_SIGNALS[0]; i++) sigaction(STOP_SIGNALS[i], &action, NULL);
    terminal.have_saved_modes = tcgetattr(STDIN_FILENO, &terminal.saved_modes) == 0;
    struct sigaction fatal;
    memset(&fatal, 0, sizeof fatal);
    fatal.sa_handler = on_fatal_signal;
    fatal.sa_flags = (int)SA_RESETHAND;
    static const int FATAL_SIGNALS[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof FATAL_SIGNALS / sizeof FATAL_SIGNALS[0]; i++) sigaction(FATAL_SIGNALS[i], &fatal, NULL);
    // At exit, even one inside initscr() (which exits when it cannot start).
    if (!terminal.restore_registered) atexit(ui_terminal_close);
    terminal.restore_registered = true;
    start_watcher(); // before curses changes a thing: its saved modes are the user's
    if (!initscr()) {
        stop_watcher();
        return -1;
    }
    terminal.curses_active = true;
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
