// servelab lab: the dashboard. Flags and the two loops live here: the
// terminal loop (ncurses, signals, frame throttling) and the headless
// replay (--keys / --dump-frame) that tests and docs use. The data side is
// lab/ui/dashboard.c, the drawing lab/ui/panes.c.
#include <curses.h>
#include <langinfo.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/devices.h"
#include "engine/model_synth.h"
#include "engine/output_file.h"
#include "lab/cmd/cli.h"
#include "lab/cmd/commands.h"
#include "lab/ui/dashboard.h"
#include "lab/common/engine_options.h"
#include "lab/lesson/lesson.h"
#include "lab/quiz/app.h"
#include "lab/serve/server.h"
#include "lab/ui/panes.h"
#include "lab/ui/terminal.h"

static const char LAB_USAGE[] =
    "usage: servelab [lab] [options]\n"
    "\n"
    "The dashboard: a paged engine and a contiguous one run the same requests\n"
    "in lockstep; step them one at a time or run them, and watch block tables,\n"
    "the block pool, fragmentation, memory traffic and quantization step sizes.\n"
    "Keys are listed in the help overlay (? or F1).\n"
    "\n"
    "  --model PATH|PRESET       (default: stories260K when found, else small)\n"
    "  --tokenizer FILE   --dtype fp32|fp16   --quant SCHEME\n"
    "  --prompt TEXT             a starting request (repeatable; default two prompts)\n"
    "  --max-tokens N            new tokens per request (default 96)\n"
    "  --system TEXT             the system prompt that p requests share\n"
    "  --kv paged|contiguous     which engine the requests and traffic panes follow\n"
    "  --lesson FILE             run a Lua lesson: space continues it at each pause, the\n"
    "                            panes draw its engine and the Lesson pane its checks\n"
    "  --time-limit S            the lesson's CPU seconds (default 60); Ctrl-C also stops it\n"
    "  --serve PORT              run the OpenAI-compatible server (servelab serve) inside the\n"
    "                            lab on 127.0.0.1:PORT (0: any free port; the address goes to\n"
    "                            stderr): clients' requests are the sequences in the panes, and\n"
    "                            the lab steps the server's engine, so while it is paused the\n"
    "                            clients wait (space steps, r runs)\n"
    "headless:\n"
    "  --keys KEYS               replay keys: plain characters and <space> <tab> <enter>\n"
    "                            <esc> <f1> <up> <down> <left> <right> <pgup> <pgdn>\n"
    "                            <wait:MS>, <resize:COLSxROWS> (the terminal resized) and\n"
    "                            <frame> (draw a frame now, as the terminal would)\n"
    "  --dump-frame FILE         write the final screen as UTF-8 text (- = stdout)\n"
    "  --size COLSxROWS          the virtual screen (default 160x50)\n"
    "  --quiz-seed N             the questions of the quiz page (z), for repeatable runs\n"
    "  --measure-machine         measure this CPU's bandwidth and peak FMA rate first\n"
    "                            (the terminal lab always measures, in the background)\n"
    "With --serve, <wait:MS> waits MS real milliseconds (clients are real), stepping\n"
    "in run mode whenever a request waits.\n"
    "Without --keys or --dump-frame, stdin and stdout must be a terminal (exit 2 otherwise).\n"
    "\n";

enum {
    KEY_CODE_UP = 0x1001, KEY_CODE_DOWN, KEY_CODE_LEFT, KEY_CODE_RIGHT, KEY_CODE_F1, KEY_CODE_ENTER,
    KEY_CODE_TAB, KEY_CODE_ESC, KEY_CODE_BACKSPACE, KEY_CODE_RESIZE, KEY_CODE_PGUP, KEY_CODE_PGDN, KEY_CODE_FRAME,
    KEY_CODE_WAIT_BASE = 0x100000,  // + milliseconds (at most 600000)
    KEY_CODE_RESIZE_BASE = 0x200000, // + cols * 1024 + rows (each at most 1000)
};

static const int BLOCK_SIZES[] = {1, 2, 4, 8, 16, 32, 64, 128};

typedef struct lab_app {
    dashboard d;
    ui_view v;
    bool quit;
    double next_step_at; // run mode: monotonic seconds of the next step
    // Run mode's cost, reported at exit: steps taken while running and the
    // wall time spent running (drawing and key handling included).
    uint64_t run_steps;
    double run_seconds;
    double run_since;    // monotonic seconds when running last started, 0 when paused
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
    uint64_t quiz_seed;  // 0: from the clock
    int cols, rows;      // the screen keys act on (the terminal's, or --size and <resize:>)
    // --serve: the server inside the lab, stepped by do_step (no engine thread
    // of its own), so that a paused lab holds every client's request.
    server* server;
    char serve_model[256]; // the `model` its clients name
} lab_app;

static double monotonic_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void set_message(lab_app* a, const char* text) { snprintf(a->v.message, sizeof a->v.message, "%s", text); }

// Adds the time since running started when the lab is paused; call after
// anything that may start or stop run mode.
static void track_run_time(lab_app* a) {
    double now = monotonic_seconds();
    if (a->v.running && a->run_since == 0) a->run_since = now;
    else if (!a->v.running && a->run_since > 0) {
        a->run_seconds += now - a->run_since;
        a->run_since = 0;
    }
}

static void report_run_rate(lab_app* a, const char* mode) {
    a->v.running = false;
    track_run_time(a);
    if (a->run_steps == 0 || a->run_seconds <= 0) return;
    fprintf(stderr, "servelab lab: run mode (%s): %llu steps in %.2f s of wall time = %.1f steps/s\n", mode,
            (unsigned long long)a->run_steps, a->run_seconds, (double)a->run_steps / a->run_seconds);
}

// ---- a lesson in the dashboard ------------------------------------------------------------

static void lesson_said(void* user, const char* text) { dashboard_lesson_log(user, LOG_NARRATION, text); }

static void lesson_checked(void* user, const lesson_check_result* result) {
    char* line = NULL;
    size_t size = 0;
    FILE* out = open_memstream(&line, &size);
    if (!out) return;
    lesson_print_check(out, result); // the same line as the headless runner prints
    fclose(out);
    if (size && line[size - 1] == '\n') line[size - 1] = '\0';
    static const lesson_log_kind KINDS[] = {LOG_PASS, LOG_DISAGREE, LOG_FAIL};
    dashboard_lesson_log(user, KINDS[result->outcome], line);
    free(line);
}

static bool lesson_active(const lab_app* a) { return a->lesson && a->lesson_state == LESSON_PAUSED; }

// Runs the lesson to its next pause, its end or an error; the dashboard keeps
// running whatever happens in the lesson.
static void resume_lesson(lab_app* a) {
    lesson_log* log = &a->d.lesson;
    a->lesson_resume_pending = false;
    a->lesson_state = lesson_resume(a->lesson);
    a->lesson_started = true;
    dashboard_follow_engine(&a->d, lesson_focus_engine(a->lesson));
    int passed = 0, failed = 0;
    if (a->lesson_state == LESSON_PAUSED) {
        snprintf(log->state, sizeof log->state, "paused: space continues the lesson");
        return;
    }
    if (a->lesson_state == LESSON_FAILED) dashboard_lesson_log(&a->d, LOG_FAIL, lesson_error(a->lesson));
    lesson_finish(a->lesson);
    lesson_counts(a->lesson, &passed, &failed);
    snprintf(log->state, sizeof log->state, "%s: %d passed, %d failed; space returns to the lab's engines",
             a->lesson_state == LESSON_DONE ? "done" : "failed", passed, failed);
}

static int open_lesson(lab_app* a, const char* path, double time_limit_s, error_info* err) {
    lesson_options options = lesson_options_default();
    options.interactive = true; // lab.pause() waits for space
    options.time_limit_s = time_limit_s;
    // Ctrl-C, SIGTERM, SIGHUP, SIGQUIT: the lesson stops even inside a long
    // call, so the key loop gets back to restoring the terminal at once.
    options.stop_flag = ui_terminal_stop_flag();
    options.on_say = lesson_said;
    options.on_check = lesson_checked;
    options.user = &a->d;
    snprintf(a->d.lesson.title, sizeof a->d.lesson.title, "lesson %s", path);
    if (lesson_open(&a->lesson, path, &options, err)) {
        // The lab still opens: the pane shows what is wrong with the lesson.
        dashboard_lesson_log(&a->d, LOG_FAIL, err->message);
        snprintf(a->d.lesson.state, sizeof a->d.lesson.state, "cannot run: fix the lesson and open it again");
        a->lesson = NULL;
        return -1;
    }
    a->lesson_state = LESSON_PAUSED;
    snprintf(a->d.lesson.state, sizeof a->d.lesson.state, "ready: space starts the lesson");
    return 0;
}

// --serve: copies the server's connection and queue counts into the
// dashboard; true when they changed (the frame is then redrawn).
static bool serve_poll(lab_app* a) {
    if (!a->server) return false;
    server_activity now = server_activity_now(a->server);
    bool changed = now.connections != a->d.serve_clients || now.in_flight != a->d.serve_in_flight ||
                   now.submitted != a->d.serve_submitted;
    a->d.serve_clients = now.connections;
    a->d.serve_in_flight = now.in_flight;
    a->d.serve_submitted = now.submitted;
    return changed;
}

// --serve: one step of the server's engine, when a request waits for one.
static void serve_step(lab_app* a) {
    error_info err = {{0}};
    if (a->v.running) a->run_steps++;
    if (!server_has_work(a->server)) {
        // Run mode stays on: the next client's request runs as it arrives.
        snprintf(a->v.message, sizeof a->v.message, "no requests: waiting for clients (curl %s/v1/completions)",
                 a->d.serve_address);
        return;
    }
    bool stepped = false;
    if (server_step(a->server, &stepped, &err)) {
        set_message(a, err.message);
        a->v.running = false;
    }
    dashboard_follow_engine(&a->d, server_engine(a->server)); // its newest step joins the history
    serve_poll(a);
}

static void do_step(lab_app* a) {
    error_info err = {{0}};
    if (a->server) {
        serve_step(a);
        return;
    }
    if (lesson_active(a)) { // space belongs to the lesson until it ends
        if (a->in_terminal) { // show that it runs before it blocks the loop
            a->lesson_resume_pending = true;
            snprintf(a->d.lesson.state, sizeof a->d.lesson.state, "running the lesson...");
        } else resume_lesson(a);
        return;
    }
    if (a->d.lesson_engine) { // the lesson ended: back to the lab's own engines
        dashboard_follow_engine(&a->d, NULL);
        set_message(a, "back to the lab's engines");
        return;
    }
    if (a->v.running) a->run_steps++;
    if (!dashboard_has_work(&a->d)) {
        set_message(a, "no work: add a request with a");
        a->v.running = false;
        return;
    }
    if (dashboard_step(&a->d, &err)) {
        set_message(a, err.message);
        a->v.running = false;
    }
}

static void change_block_size(lab_app* a, int direction) {
    int n = (int)(sizeof BLOCK_SIZES / sizeof BLOCK_SIZES[0]), at = 0;
    for (int i = 0; i < n; i++)
        if (BLOCK_SIZES[i] == a->d.config.block_size) at = i;
    at += direction;
    if (at < 0 || at >= n) return;
    a->v.pending_block_size = BLOCK_SIZES[at];
    a->v.mode = UI_MODE_CONFIRM;
}

// ---- the quiz page ----------------------------------------------------------------------

static void open_quiz(lab_app* a) {
    error_info err = {{0}};
    char warning[1024] = "";
    if (!a->quiz_loaded && quiz_app_load(&a->quiz, NULL, warning, sizeof warning, &err)) {
        set_message(a, err.message);
        return;
    }
    a->quiz_loaded = true;
    int64_t now = (int64_t)time(NULL);
    quiz_session_options options = {QUIZ_ALL_TOPICS, 10, a->quiz_seed ? a->quiz_seed : (uint64_t)now, QUIZ_LANG_EN,
                                    now, false, false};
    if (quiz_app_start(&a->quiz, &options, &err)) {
        set_message(a, err.message);
        return;
    }
    a->v.running = false;
    a->quiz_open = true;
    if (warning[0]) set_message(a, warning);
}

static void quiz_key(lab_app* a, int key) {
    // The quiz scrolls a long prove-it result or feedback with the arrows and
    // the page keys (lab/quiz/app.h); the other special keys mean nothing there.
    static const int SCROLL_KEYS[][2] = {{KEY_CODE_UP, QUIZ_KEY_UP},
                                         {KEY_CODE_DOWN, QUIZ_KEY_DOWN},
                                         {KEY_CODE_PGUP, QUIZ_KEY_PGUP},
                                         {KEY_CODE_PGDN, QUIZ_KEY_PGDN}};
    int code = key == KEY_CODE_ENTER ? '\n' : key == KEY_CODE_ESC ? 27 : key == KEY_CODE_BACKSPACE ? 127 : key;
    bool scroll = false;
    for (size_t i = 0; i < sizeof SCROLL_KEYS / sizeof SCROLL_KEYS[0]; i++)
        if (key == SCROLL_KEYS[i][0]) {
            code = SCROLL_KEYS[i][1];
            scroll = true;
        }
    if (!scroll && key >= KEY_CODE_UP && key != KEY_CODE_ENTER && key != KEY_CODE_ESC && key != KEY_CODE_BACKSPACE)
        return;
    // Behind "terminal too small" only Esc acts (it leaves the quiz): an
    // answer typed blind would be graded.
    if (quiz_app_too_small(&a->quiz, a->cols, a->rows) && key != KEY_CODE_ESC) return;
    if (quiz_app_key(&a->quiz, code) && a->quiz.session.stage != QUIZ_STAGE_DONE) return;
    a->quiz_open = false;
    char text[sizeof a->v.message];
    if (quiz_app_save(&a->quiz, NULL) == 0)
        snprintf(text, sizeof text, "quiz: %d right, %d wrong; progress saved to %.400s", a->quiz.session.n_correct,
                 a->quiz.session.n_wrong, a->quiz.progress_path);
    else
        snprintf(text, sizeof text, "quiz: %d right, %d wrong; progress NOT saved: %.400s", a->quiz.session.n_correct,
                 a->quiz.session.n_wrong, a->quiz.save_error);
    set_message(a, text);
}

static void draw_lab(ui_screen* screen, const lab_app* a) {
    if (a->quiz_open) quiz_app_draw(screen, &a->quiz);
    else ui_draw(screen, &a->d, &a->v);
}

// One key, in any mode. Returns nothing: the state says what happened.
static void handle_key(lab_app* a, int key) {
    ui_view* v = &a->v;
    error_info err = {{0}};
    if (a->quiz_open) {
        quiz_key(a, key);
        return;
    }
    // Behind "terminal too small" nothing the student cannot see happens; q still quits.
    if (ui_layout_compute(a->cols, a->rows, v->page).mode == LAYOUT_TOO_SMALL) {
        if (key == 'q') a->quit = true;
        return;
    }
    if (v->mode == UI_MODE_EDIT) {
        size_t len = strlen(v->edit);
        if (key == KEY_CODE_ENTER) {
            v->mode = UI_MODE_NORMAL;
            if (len && dashboard_add_prompt(&a->d, v->edit, a->d.max_new_tokens, 1, 0.0f, &err))
                set_message(a, err.message);
            v->edit[0] = '\0';
        } else if (key == KEY_CODE_ESC) {
            v->mode = UI_MODE_NORMAL;
            v->edit[0] = '\0';
        } else if (key == KEY_CODE_BACKSPACE) {
            if (len) v->edit[len - 1] = '\0';
        } else if (key >= 0x20 && key < 0x7f && len + 1 < sizeof v->edit) {
            v->edit[len] = (char)key;
            v->edit[len + 1] = '\0';
        }
        return;
    }
    if (v->mode == UI_MODE_CONFIRM) {
        v->mode = UI_MODE_NORMAL;
        if (key == 'y' || key == 'Y') {
            if (dashboard_set_block_size(&a->d, v->pending_block_size, &err)) set_message(a, err.message);
            else set_message(a, "engines restarted with the new block size; requests replayed");
        }
        return;
    }
    if (v->help) { // any key closes the overlay
        v->help = false;
        return;
    }
    v->message[0] = '\0';
    step_size_view* q = &a->d.step_size;
    bool on_step_size = v->focus == PANE_STEP_SIZE;
    int n_devices = 0;
    device_models(&n_devices);
    switch (key) {
    case ' ': case 'n': do_step(a); break;
    case 'r':
        if (lesson_active(a)) set_message(a, "a lesson is running: space continues it");
        else v->running = !v->running;
        a->next_step_at = 0;
        break;
    case '+': case '=': if (v->speed_index < 7) v->speed_index++; break;
    case '-': if (v->speed_index > 0) v->speed_index--; break;
    case 'a': case 'f': case 'p': case 'x': case '[': case ']':
        if (a->server) { // the panes draw the server's engine: its requests come from clients
            char text[sizeof v->message];
            snprintf(text, sizeof text, "serving: requests come from clients, e.g. curl %s/v1/completions -d "
                     "'{\"model\":\"%.100s\",\"prompt\":\"Hi\",\"stream\":true}'", a->d.serve_address, a->serve_model);
            set_message(a, text);
            break;
        }
        if (key == 'a') {
            v->mode = UI_MODE_EDIT;
            v->edit[0] = '\0';
        }
        if (key == 'f' && dashboard_fork_selected(&a->d, &err)) set_message(a, err.message);
        if (key == 'p' && dashboard_add_shared_prompt(&a->d, &err)) set_message(a, err.message);
        if (key == 'x' && dashboard_cancel_selected(&a->d, &err)) set_message(a, err.message);
        if (key == '[' || key == ']') change_block_size(a, key == '[' ? -1 : +1);
        break;
    case 'd': v->device = (v->device + 1) % n_devices; break;
    case 'z': open_quiz(a); break;
    case '?': case KEY_CODE_F1: v->help = true; break;
    case KEY_CODE_PGUP: ui_lesson_scroll(&a->d, v, a->cols, a->rows, -1); break;
    case KEY_CODE_PGDN: ui_lesson_scroll(&a->d, v, a->cols, a->rows, +1); break;
    case 'q': a->quit = true; break;
    case KEY_CODE_TAB:
        v->focus = (ui_pane)((v->focus + 1) % PANE_COUNT);
        v->page = ui_pane_page(v->focus);
        break;
    case '1': case '2': case '3': case '4': case '5':
        v->page = key - '1';
        for (int p = 0; p < PANE_COUNT; p++)
            if (ui_pane_page((ui_pane)p) == v->page) {
                v->focus = (ui_pane)p;
                break;
            }
        break;
    case KEY_CODE_UP: case KEY_CODE_DOWN: {
        int delta = key == KEY_CODE_UP ? -1 : 1;
        if (on_step_size) {
            q->layer += delta;
            dashboard_update_step_size(&a->d);
        } else {
            int n = dashboard_primary(&a->d)->n_sequences;
            a->d.selected += delta;
            if (a->d.selected < 0) a->d.selected = 0;
            if (a->d.selected >= n) a->d.selected = n > 0 ? n - 1 : 0;
        }
        break;
    }
    case KEY_CODE_LEFT: case KEY_CODE_RIGHT:
        if (on_step_size) {
            q->tensor += key == KEY_CODE_LEFT ? -1 : 1;
            dashboard_update_step_size(&a->d);
        }
        break;
    case 'b': // bits 2..8, cycling
        q->scheme.bits = q->scheme.bits >= 8 ? 2 : q->scheme.bits + 1;
        dashboard_update_step_size(&a->d);
        break;
    case 'g':
        q->scheme.granularity = (quant_granularity)((q->scheme.granularity + 1) % 3);
        q->set_index = 0;
        dashboard_update_step_size(&a->d);
        break;
    case 'm':
        q->scheme.symmetric = !q->scheme.symmetric;
        dashboard_update_step_size(&a->d);
        break;
    case ',': case '.':
        q->set_index += key == ',' ? -1 : 1;
        dashboard_update_step_size(&a->d);
        break;
    default: break;
    }
}

static int parse_size(const char* text, int* cols, int* rows, error_info* err) {
    char tail = 0;
    if (sscanf(text, "%dx%d%c", cols, rows, &tail) != 2 || *cols < 1 || *rows < 1 || *cols > 1000 || *rows > 1000)
        return error_set(err, "--size: expected COLSxROWS such as 120x40, found '%s'", text);
    return 0;
}

// Parses the --keys escape syntax into key codes; -1 with err on a bad escape.
static int parse_keys(const char* text, int* keys, int capacity, int* n, error_info* err) {
    static const struct { const char* name; int key; } NAMES[] = {
        {"space", ' '}, {"tab", KEY_CODE_TAB}, {"enter", KEY_CODE_ENTER}, {"esc", KEY_CODE_ESC},
        {"f1", KEY_CODE_F1}, {"up", KEY_CODE_UP}, {"down", KEY_CODE_DOWN}, {"left", KEY_CODE_LEFT},
        {"right", KEY_CODE_RIGHT}, {"backspace", KEY_CODE_BACKSPACE}, {"lt", '<'}, {"pgup", KEY_CODE_PGUP},
        {"pgdn", KEY_CODE_PGDN}, {"frame", KEY_CODE_FRAME},
    };
    *n = 0;
    for (const char* p = text; *p;) {
        if (*n == capacity) return error_set(err, "--keys: more than %d keys", capacity);
        if (*p != '<') {
            keys[(*n)++] = (unsigned char)*p++;
            continue;
        }
        const char* end = strchr(p, '>');
        if (!end) return error_set(err, "--keys: '<' without '>' at '%s'", p);
        char name[32];
        int len = (int)(end - p - 1);
        if (len <= 0 || len >= (int)sizeof name) return error_set(err, "--keys: bad escape at '%s'", p);
        memcpy(name, p + 1, (size_t)len);
        name[len] = '\0';
        int key = -1;
        for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++)
            if (strcmp(name, NAMES[i].name) == 0) key = NAMES[i].key;
        if (key < 0 && strncmp(name, "wait:", 5) == 0) {
            int ms = 0;
            if (parse_int_arg("<wait:MS>", name + 5, 0, 600000, &ms, err)) return -1;
            key = KEY_CODE_WAIT_BASE + ms;
        }
        if (key < 0 && strncmp(name, "resize:", 7) == 0) {
            int cols = 0, rows = 0;
            if (parse_size(name + 7, &cols, &rows, err)) return -1;
            key = KEY_CODE_RESIZE_BASE + cols * 1024 + rows;
        }
        if (key < 0)
            return error_set(err, "--keys: unknown key <%s> (expected space tab enter esc f1 up down left right "
                                  "pgup pgdn backspace lt frame wait:MS resize:COLSxROWS)", name);
        keys[(*n)++] = key;
        p = end + 1;
    }
    return 0;
}

// --serve, headless: <wait:MS> is real time, since the clients are real:
// in run mode the server steps whenever a request waits, at most at the
// lab's speed; paused, the clients' requests wait.
static void serve_wait(lab_app* a, int ms) {
    double deadline = monotonic_seconds() + ms / 1000.0;
    for (double now = monotonic_seconds(); now < deadline; now = monotonic_seconds()) {
        int speed = UI_SPEEDS[a->v.speed_index];
        if (a->v.running && now >= a->next_step_at && server_has_work(a->server)) {
            do_step(a);
            a->next_step_at = speed ? now + 1.0 / speed : 0;
            continue;
        }
        serve_poll(a);
        double pause = a->v.running && a->next_step_at > now ? a->next_step_at - now : 0.005;
        if (pause > 0.005) pause = 0.005; // 5 ms: a new request starts within one
        if (pause > deadline - now) pause = deadline - now;
        struct timespec t = {0, (long)(pause * 1e9)};
        nanosleep(&t, NULL);
    }
    serve_poll(a);
}

// Headless: keys in order; <wait:MS> advances a virtual clock, and in run
// mode the engine takes the steps the speed allows in that time (speed
// "max" counts as 1000/s), so a replay is deterministic.
static int run_headless(lab_app* a, const char* keys_text, const char* dump_path, int cols, int rows) {
    error_info err = {{0}};
    int capacity = (int)strlen(keys_text) + 1, n = 0;
    int* keys = malloc((size_t)capacity * sizeof *keys); // (capacity) key codes
    if (!keys) return 1;
    if (parse_keys(keys_text, keys, capacity, &n, &err)) {
        fprintf(stderr, "servelab lab: %s\n", err.message);
        free(keys);
        return 2;
    }
    ui_screen screen;
    const char* no_color = getenv("NO_COLOR");
    if (ui_screen_init(&screen, cols, rows, true, !(no_color && no_color[0]))) {
        free(keys);
        return 1;
    }
    a->cols = cols;
    a->rows = rows;
    // <frame>: the screen then, kept in memory and written before the final
    // frame, so that one replay shows several states (and the dump is still
    // written whole or not at all).
    char* frames = NULL;
    size_t frames_bytes = 0;
    FILE* frames_out = open_memstream(&frames, &frames_bytes);
    for (int i = 0; i < n && !a->quit; i++) {
        if (keys[i] >= KEY_CODE_RESIZE_BASE) {
            int code = keys[i] - KEY_CODE_RESIZE_BASE;
            if (ui_screen_resize(&screen, code / 1024, code % 1024) == 0) {
                a->cols = screen.cols;
                a->rows = screen.rows;
            }
        } else if (keys[i] >= KEY_CODE_WAIT_BASE && a->server) {
            serve_wait(a, keys[i] - KEY_CODE_WAIT_BASE);
        } else if (keys[i] >= KEY_CODE_WAIT_BASE) {
            if (!a->v.running) continue;
            int speed = UI_SPEEDS[a->v.speed_index] ? UI_SPEEDS[a->v.speed_index] : 1000;
            long steps = (long)(keys[i] - KEY_CODE_WAIT_BASE) * speed / 1000;
            for (long k = 0; k < steps && a->v.running; k++) do_step(a);
        } else if (keys[i] == KEY_CODE_FRAME) {
            serve_poll(a);
            draw_lab(&screen, a);
            if (frames_out) ui_screen_dump(&screen, frames_out);
        } else handle_key(a, keys[i]);
        track_run_time(a);
    }
    free(keys);
    report_run_rate(a, "headless");
    serve_poll(a);
    draw_lab(&screen, a);
    int status = 0;
    bool frames_failed = !frames_out || fclose(frames_out) != 0;
    if (frames_failed) fprintf(stderr, "servelab lab: out of memory for the <frame> frames\n");
    if (dump_path && strcmp(dump_path, "-") == 0) {
        if (frames_failed || fwrite(frames, 1, frames_bytes, stdout) != frames_bytes ||
            ui_screen_dump(&screen, stdout) || fflush(stdout) != 0)
            status = 1;
    } else if (dump_path) {
        output_file out;
        if (output_file_open(&out, dump_path, &err) ||
            output_file_commit(&out,
                               frames_failed || fwrite(frames, 1, frames_bytes, out.stream) != frames_bytes ||
                                   ui_screen_dump(&screen, out.stream) != 0,
                               &err)) {
            fprintf(stderr, "servelab lab: --dump-frame: %s\n", err.message);
            status = 1;
        }
    }
    free(frames);
    ui_screen_free(&screen);
    return status;
}

// ---- the terminal -------------------------------------------------------------------------

static int translate_key(int c) {
    switch (c) {
    case KEY_UP: return KEY_CODE_UP;
    case KEY_DOWN: return KEY_CODE_DOWN;
    case KEY_LEFT: return KEY_CODE_LEFT;
    case KEY_RIGHT: return KEY_CODE_RIGHT;
    case KEY_F(1): return KEY_CODE_F1;
    case KEY_ENTER: case '\n': case '\r': return KEY_CODE_ENTER;
    case '\t': return KEY_CODE_TAB;
    case 27: return KEY_CODE_ESC;
    case KEY_BACKSPACE: case 127: case 8: return KEY_CODE_BACKSPACE;
    case KEY_RESIZE: return KEY_CODE_RESIZE;
    case KEY_PPAGE: return KEY_CODE_PGUP;
    case KEY_NPAGE: return KEY_CODE_PGDN;
    default: return c;
    }
}

static int run_terminal(lab_app* a) {
    bool utf8 = false, color = false;
    if (ui_terminal_open(&utf8, &color)) {
        fprintf(stderr, "servelab lab: cannot open the terminal (use --dump-frame for headless use)\n");
        return 1;
    }
    ui_screen screen;
    if (ui_screen_init(&screen, COLS, LINES, utf8, color)) {
        ui_terminal_close();
        fprintf(stderr, "servelab lab: out of memory\n");
        return 1;
    }
    a->cols = COLS;
    a->rows = LINES;
    // Frames at most every 1/30 s; the engine steps in between.
    const double frame_interval = 1.0 / 30.0;
    double last_frame = 0;
    bool dirty = true;
    bool machine_shown = false;
    while (!a->quit && !ui_terminal_stop_requested()) {
        double now = monotonic_seconds();
        if (serve_poll(a)) dirty = true; // a client came, went or sent a request
        double unused_gb_s, unused_gflop_s;
        if (!machine_shown && dashboard_machine_figures(&a->d, &unused_gb_s, &unused_gflop_s))
            machine_shown = dirty = true; // the background measurement just finished: show it
        if (dirty && now - last_frame >= frame_interval) {
            draw_lab(&screen, a);
            ui_screen_flush_curses(&screen);
            refresh();
            last_frame = now;
            dirty = false;
        }
        if (a->lesson_resume_pending && !dirty) { // its "running" frame is on the screen
            resume_lesson(a);
            dirty = true;
            continue;
        }
        // Wait for a key until the next step or frame is due.
        double wait = 0.1;
        if (a->v.running) {
            int speed = UI_SPEEDS[a->v.speed_index];
            if (speed == 0 || now >= a->next_step_at) wait = 0;
            else wait = a->next_step_at - now;
        }
        // Serving with nothing to do: poll for clients every 20 ms rather than spin.
        if (a->server && a->v.running && wait < 0.02 && !server_has_work(a->server)) wait = 0.02;
        if (dirty && wait > frame_interval) wait = frame_interval;
        timeout((int)(wait * 1000));
        int c = getch();
        if (c != ERR) {
            int key = translate_key(c);
            if (key == KEY_CODE_RESIZE) {
                ui_screen_resize(&screen, COLS, LINES);
                a->cols = COLS;
                a->rows = LINES;
            } else handle_key(a, key);
            track_run_time(a);
            dirty = true;
        }
        if (a->v.running && !a->quit && (!a->server || server_has_work(a->server))) {
            now = monotonic_seconds();
            int speed = UI_SPEEDS[a->v.speed_index];
            if (speed == 0 || now >= a->next_step_at) {
                do_step(a);
                a->next_step_at = (a->next_step_at > 0 && speed ? a->next_step_at : now) + (speed ? 1.0 / speed : 0);
                if (a->next_step_at < now - 1.0) a->next_step_at = now; // fell behind: do not burst
                track_run_time(a);
                dirty = true;
            }
        }
    }
    ui_screen_free(&screen);
    ui_terminal_close();
    report_run_rate(a, "terminal");
    return 0;
}

// --serve: the server on the dashboard's model, stepped by the lab.
static int start_server(lab_app* a, int port, const engine_config* config, error_info* err) {
    serve_config sc = serve_config_default();
    sc.port = port;
    sc.external_stepping = true;
    // Clients name the model by its file name without .bin, as `servelab serve` does.
    char name[sizeof a->d.source.model_label];
    const char* label = a->d.source.model_label;
    const char* base = strrchr(label, '/');
    snprintf(name, sizeof name, "%s", base ? base + 1 : label);
    char* dot = strstr(name, ".bin");
    if (dot) *dot = '\0';
    sc.model_name = name;
    snprintf(a->serve_model, sizeof a->serve_model, "%.255s", name);
    // A client that goes away mid-stream must not kill the lab (and leave the terminal raw).
    signal(SIGPIPE, SIG_IGN);
    if (server_start(&a->server, &a->d.source.model, a->d.source.tokenizer, config, &sc, err)) return -1;
    snprintf(a->d.serve_address, sizeof a->d.serve_address, "http://%s:%d", server_host(a->server),
             server_port(a->server));
    dashboard_follow_engine(&a->d, server_engine(a->server));
    fprintf(stderr, "servelab lab: serving %s (model \"%s\"); the lab steps it: space steps, r runs\n",
            a->d.serve_address, name);
    fflush(stderr);
    set_message(a, "serving: paused, so clients wait; space steps, r runs");
    return 0;
}

int command_lab(int argc, char** argv) {
    if (cli_answer_help(argc, argv, LAB_USAGE, CLI_ENGINE_DEFAULTS)) return 0;
    setlocale(LC_ALL, "");
    error_info err = {{0}};
    engine_config config = engine_config_default();
    model_request request = {NULL, NULL, MODEL_DTYPE_DEFAULT, SYNTH_DEFAULT_SEED, NULL};
    const char* keys = NULL;
    bool measure_machine = false;
    const char* lesson_path = NULL;
    float lesson_time_limit_s = 60.0f;
    uint64_t quiz_seed = 0;
    const char* dump_path = NULL;
    const char* prompts[16];
    const char* system_prompt = "Once upon a time, there was a little girl named Lily. She lived in a small house "
                                "with her mom, her dad and her dog Max.";
    int n_prompts = 0, cols = 160, rows = 50, max_tokens = 96, serve_port = -1;
    arg_cursor cursor = {argc, argv, 1, "servelab lab", NULL};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        if (engine_option_match(&cursor, &config, NULL, NULL, &failed, &err)) {
        } else if (arg_match(&cursor, "--model", true, &failed, &err)) {
            if (!failed) request.model_arg = cursor.value;
        } else if (arg_match(&cursor, "--tokenizer", true, &failed, &err)) {
            if (!failed) request.tokenizer_arg = cursor.value;
        } else if (arg_match(&cursor, "--quant", true, &failed, &err)) {
            if (!failed) request.quant = cursor.value;
        } else if (arg_match(&cursor, "--dtype", true, &failed, &err)) {
            if (!failed) {
                if (strcmp(cursor.value, "fp32") == 0) request.dtype = MODEL_DTYPE_FP32;
                else if (strcmp(cursor.value, "fp16") == 0) request.dtype = MODEL_DTYPE_FP16;
                else failed = error_set(&err, "--dtype: expected fp32 or fp16, found '%s'", cursor.value) != 0;
            }
        } else if (arg_match(&cursor, "--prompt", true, &failed, &err)) {
            if (!failed && n_prompts == 16) failed = error_set(&err, "--prompt: at most 16") != 0;
            else if (!failed) prompts[n_prompts++] = cursor.value;
        } else if (arg_match(&cursor, "--max-tokens", true, &failed, &err)) {
            if (!failed) failed = parse_int_arg("--max-tokens", cursor.value, 1, 1 << 20, &max_tokens, &err) != 0;
        } else if (arg_match(&cursor, "--system", true, &failed, &err)) {
            if (!failed) system_prompt = cursor.value;
        } else if (arg_match(&cursor, "--quiz-seed", true, &failed, &err)) {
            if (!failed) failed = parse_u64_arg("--quiz-seed", cursor.value, &quiz_seed, &err) != 0;
        } else if (arg_match(&cursor, "--measure-machine", false, &failed, &err)) {
            measure_machine = true;
        } else if (arg_match(&cursor, "--keys", true, &failed, &err)) {
            if (!failed) keys = cursor.value;
        } else if (arg_match(&cursor, "--dump-frame", true, &failed, &err)) {
            if (!failed) dump_path = cursor.value;
        } else if (arg_match(&cursor, "--size", true, &failed, &err)) {
            if (!failed) failed = parse_size(cursor.value, &cols, &rows, &err) != 0;
        } else if (arg_match(&cursor, "--serve", true, &failed, &err)) {
            if (!failed) failed = parse_int_arg("--serve", cursor.value, 0, 65535, &serve_port, &err) != 0;
        } else if (arg_match(&cursor, "--lesson", true, &failed, &err)) {
            if (!failed) lesson_path = cursor.value;
        } else if (arg_match(&cursor, "--time-limit", true, &failed, &err)) {
            if (!failed) failed = parse_float_arg("--time-limit", cursor.value, 0.01f, 86400.0f, &lesson_time_limit_s, &err) != 0;
        } else {
            arg_unknown(&cursor, &err);
            return cli_usage_error(&err);
        }
        if (failed) {
            fprintf(stderr, "servelab lab: %s\n", err.message);
            return 2;
        }
    }
    // The terminal lab draws on stdout and reads keys from stdin: without a
    // terminal on both, ncurses would write escape codes into a file, or
    // read EOF forever (100% CPU, q never arrives). Checked before the model
    // loads, so the refusal is instant.
    bool headless = keys || dump_path;
    if (!headless && (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO))) {
        bool in = isatty(STDIN_FILENO), out = isatty(STDOUT_FILENO);
        fprintf(stderr,
                "servelab lab: %s not a terminal; the dashboard needs one (for a headless run give --keys KEYS "
                "or --dump-frame FILE)\n",
                !in && !out ? "stdin and stdout are" : !in ? "stdin is" : "stdout is");
        return 2;
    }
    // Unless told otherwise, a pool of 128 blocks: small enough that every
    // block is a visible cell in the pool pane and that forks and new
    // requests make it fill up (the engine's 64 MiB default is 6553 blocks
    // of stories260K).
    if (config.num_blocks == 0 && config.kv_mem_bytes == engine_config_default().kv_mem_bytes) config.num_blocks = 128;
    if (serve_port >= 0 && lesson_path) {
        fprintf(stderr, "servelab lab: --serve and --lesson: a lesson drives its own engines; give one of them\n");
        return 2;
    }
    if (n_prompts == 0 && serve_port < 0) { // serving, the requests are the clients'
        prompts[n_prompts++] = "Once upon a time, there was a little girl named Lily.";
        prompts[n_prompts++] = "The dog ran";
    }
    lab_app* a = calloc(1, sizeof *a);
    if (!a) return 1;
    a->v.speed_index = 3; // 10 steps per second: slow enough to follow
    if (dashboard_init(&a->d, &request, &config, config.layout, &err)) {
        fprintf(stderr, "servelab lab: %s\n", err.message);
        free(a);
        return 1;
    }
    snprintf(a->d.system_prompt, sizeof a->d.system_prompt, "%s", system_prompt);
    a->d.max_new_tokens = max_tokens;
    // The requests keep going past EOS only if asked; greedy by default so runs repeat.
    for (int i = 0; i < n_prompts; i++)
        if (dashboard_add_prompt(&a->d, prompts[i], max_tokens, 1, 0.0f, &err)) {
            fprintf(stderr, "servelab lab: --prompt '%s': %s\n", prompts[i], err.message);
            dashboard_free(&a->d);
            free(a);
            return 2;
        }
    if (serve_port >= 0 && start_server(a, serve_port, &config, &err)) {
        fprintf(stderr, "servelab lab: --serve %d: %s\n", serve_port, err.message);
        dashboard_free(&a->d);
        free(a);
        return 1;
    }
    a->in_terminal = !headless;
    a->quiz_seed = quiz_seed;
    // Random weights write gibberish; the first screen says where real ones are.
    if (strncmp(a->d.source.model_label, "synthetic", 9) == 0 || strstr(a->d.source.model_label, ", synthetic"))
        set_message(a, "random weights: `make models` fetches stories260K (or --model PATH)");
    if (lesson_path) open_lesson(a, lesson_path, lesson_time_limit_s, &err); // a broken lesson shows in its pane; the lab runs on
    if (!headless || measure_machine) dashboard_measure_machine(&a->d, !headless);
    int status = headless ? run_headless(a, keys ? keys : "", dump_path ? dump_path : "-", cols, rows)
                                   : run_terminal(a);
    dashboard_follow_engine(&a->d, NULL); // the lesson's (or the server's) engines go with it
    server_stop(a->server);               // before dashboard_free: it serves the dashboard's model
    if (a->lesson) lesson_close(a->lesson);
    if (a->quiz_loaded) quiz_app_free(&a->quiz);
    dashboard_free(&a->d);
    free(a);
    return status;
}
