// lab_terminal: the lab in a terminal: ncurses keys in, frames out at most
// 30 times a second, and run mode stepping the engine in between.
#include "lab/cmd/lab_app.h"

#include <curses.h>
#include <stdio.h>

#include "lab/ui/terminal.h"

static int translate_key(int c) {
    switch (c) {
    case KEY_UP: return KEY_CODE_UP;
    case KEY_DOWN: return KEY_CODE_DOWN;
    case KEY_LEFT: return KEY_CODE_LEFT;
    case KEY_RIGHT: return KEY_CODE_RIGHT;
    case KEY_F(1): return KEY_CODE_F1;
    case KEY_ENTER:
    case '\n':
    case '\r': return KEY_CODE_ENTER;
    case '\t': return KEY_CODE_TAB;
    case 27: return KEY_CODE_ESC;
    case KEY_BACKSPACE:
    case 127:
    case 8: return KEY_CODE_BACKSPACE;
    case KEY_RESIZE: return KEY_CODE_RESIZE;
    case KEY_PPAGE: return KEY_CODE_PGUP;
    case KEY_NPAGE: return KEY_CODE_PGDN;
    default: return c;
    }
}

// Frames at most every 1/30 s; the engine steps in between.
static const double FRAME_INTERVAL_S = 1.0 / 30.0;

typedef struct terminal_loop {
    ui_screen screen;
    double last_frame;  // monotonic seconds of the last frame drawn
    bool dirty;         // the screen no longer shows the state
    bool machine_shown; // the background machine measurement is on the screen
} terminal_loop;

// Draws a frame when the state changed and the last frame is 1/30 s old.
static void draw_if_due(lab_app* a, terminal_loop* loop, double now) {
    if (lab_serve_poll(a)) loop->dirty = true; // a client came, went or sent a request
    double unused_gb_s, unused_gflop_s;
    if (!loop->machine_shown && dashboard_machine_figures(&a->d, &unused_gb_s, &unused_gflop_s))
        loop->machine_shown = loop->dirty = true; // the background measurement just finished: show it
    if (!loop->dirty || now - loop->last_frame < FRAME_INTERVAL_S) return;
    lab_draw(&loop->screen, a);
    ui_screen_flush_curses(&loop->screen);
    refresh();
    loop->last_frame = now;
    loop->dirty = false;
}

// How long to wait for a key: until the next step or frame is due.
static double key_wait_s(const lab_app* a, const terminal_loop* loop, double now) {
    double wait = 0.1;
    if (a->v.running) {
        int speed = UI_SPEEDS[a->v.speed_index];
        if (speed == 0 || now >= a->next_step_at)
            wait = 0;
        else
            wait = a->next_step_at - now;
    }
    // Serving with nothing to do: poll for clients every 20 ms rather than spin.
    if (a->server && a->v.running && wait < 0.02 && !server_has_work(a->server)) wait = 0.02;
    if (loop->dirty && wait > FRAME_INTERVAL_S) wait = FRAME_INTERVAL_S;
    return wait;
}

// Waits up to wait_s for a key and acts on it.
static void read_key(lab_app* a, terminal_loop* loop, double wait_s) {
    timeout((int)(wait_s * 1000));
    int c = getch();
    if (c == ERR) return;
    int key = translate_key(c);
    if (key == KEY_CODE_RESIZE) {
        ui_screen_resize(&loop->screen, COLS, LINES);
        a->cols = COLS;
        a->rows = LINES;
    } else
        lab_handle_key(a, key);
    lab_track_run_time(a);
    loop->dirty = true;
}

// Run mode: a step when the speed says one is due.
static void step_if_due(lab_app* a, terminal_loop* loop) {
    if (!a->v.running || a->quit || (a->server && !server_has_work(a->server))) return;
    double now = lab_monotonic_seconds();
    int speed = UI_SPEEDS[a->v.speed_index];
    if (speed != 0 && now < a->next_step_at) return;
    lab_step(a);
    a->next_step_at = (a->next_step_at > 0 && speed ? a->next_step_at : now) + (speed ? 1.0 / speed : 0);
    if (a->next_step_at < now - 1.0) a->next_step_at = now; // fell behind: do not burst
    lab_track_run_time(a);
    loop->dirty = true;
}

int lab_run_terminal(lab_app* a) {
    bool utf8 = false, color = false;
    if (ui_terminal_open(&utf8, &color)) {
        fprintf(stderr, "servelab lab: cannot open the terminal (use --dump-frame for headless use)\n");
        return 1;
    }
    terminal_loop loop = {.last_frame = 0, .dirty = true, .machine_shown = false};
    if (ui_screen_init(&loop.screen, COLS, LINES, utf8, color)) {
        ui_terminal_close();
        fprintf(stderr, "servelab lab: out of memory\n");
        return 1;
    }
    a->cols = COLS;
    a->rows = LINES;
    while (!a->quit && !ui_terminal_stop_requested()) {
        double now = lab_monotonic_seconds();
        draw_if_due(a, &loop, now);
        if (a->lesson_resume_pending && !loop.dirty) { // its "running" frame is on the screen
            lab_resume_lesson(a);
            loop.dirty = true;
            continue;
        }
        read_key(a, &loop, key_wait_s(a, &loop, now));
        step_if_due(a, &loop);
    }
    ui_screen_free(&loop.screen);
    ui_terminal_close();
    lab_report_run_rate(a, "terminal");
    return 0;
}
