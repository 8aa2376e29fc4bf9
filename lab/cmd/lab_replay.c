// lab_replay: the headless lab (--keys, --dump-frame) that tests and docs
// use. <wait:MS> advances a virtual clock, so a replay is deterministic
// (with --serve it waits real time: the clients are real).
#include "lab/cmd/lab_app.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/output_file.h"
#include "lab/common/cli_args.h"

int lab_parse_size(const char* text, int* cols, int* rows, error_info* err) {
    char tail = 0;
    if (sscanf(text, "%dx%d%c", cols, rows, &tail) != 2 || *cols < 1 || *rows < 1 || *cols > 1000 || *rows > 1000)
        return error_set(err, "--size: expected COLSxROWS such as 120x40, found '%s'", text);
    return 0;
}

// Parses the --keys escape syntax into key codes; -1 with err on a bad escape.
static int parse_keys(const char* text, int* keys, int capacity, int* n, error_info* err) {
    static const struct {
        const char* name;
        int key;
    } NAMES[] = {
        {"space", ' '},
        {"tab", KEY_CODE_TAB},
        {"enter", KEY_CODE_ENTER},
        {"esc", KEY_CODE_ESC},
        {"f1", KEY_CODE_F1},
        {"up", KEY_CODE_UP},
        {"down", KEY_CODE_DOWN},
        {"left", KEY_CODE_LEFT},
        {"right", KEY_CODE_RIGHT},
        {"backspace", KEY_CODE_BACKSPACE},
        {"lt", '<'},
        {"pgup", KEY_CODE_PGUP},
        {"pgdn", KEY_CODE_PGDN},
        {"frame", KEY_CODE_FRAME},
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
            if (lab_parse_size(name + 7, &cols, &rows, err)) return -1;
            key = KEY_CODE_RESIZE_BASE + cols * 1024 + rows;
        }
        if (key < 0)
            return error_set(err,
                             "--keys: unknown key <%s> (expected space tab enter esc f1 up down left right "
                             "pgup pgdn backspace lt frame wait:MS resize:COLSxROWS)",
                             name);
        keys[(*n)++] = key;
        p = end + 1;
    }
    return 0;
}

// --serve, headless: <wait:MS> is real time, since the clients are real:
// in run mode the server steps whenever a request waits, at most at the
// lab's speed; paused, the clients' requests wait.
static void serve_wait(lab_app* a, int ms) {
    double deadline = lab_monotonic_seconds() + ms / 1000.0;
    for (double now = lab_monotonic_seconds(); now < deadline; now = lab_monotonic_seconds()) {
        int speed = UI_SPEEDS[a->v.speed_index];
        if (a->v.running && now >= a->next_step_at && server_has_work(a->server)) {
            lab_step(a);
            a->next_step_at = speed ? now + 1.0 / speed : 0;
            continue;
        }
        lab_serve_poll(a);
        double pause = a->v.running && a->next_step_at > now ? a->next_step_at - now : 0.005;
        if (pause > 0.005) pause = 0.005; // 5 ms: a new request starts within one
        if (pause > deadline - now) pause = deadline - now;
        struct timespec t = {0, (long)(pause * 1e9)};
        nanosleep(&t, NULL);
    }
    lab_serve_poll(a);
}

// One replayed key: a resize, a wait, a <frame> (written to frames_out when
// it opened) or a key as the terminal would give it.
static void replay_key(lab_app* a, ui_screen* screen, FILE* frames_out, int key) {
    if (key >= KEY_CODE_RESIZE_BASE) {
        int code = key - KEY_CODE_RESIZE_BASE;
        if (ui_screen_resize(screen, code / 1024, code % 1024) == 0) {
            a->cols = screen->cols;
            a->rows = screen->rows;
        }
    } else if (key >= KEY_CODE_WAIT_BASE && a->server) {
        serve_wait(a, key - KEY_CODE_WAIT_BASE);
    } else if (key >= KEY_CODE_WAIT_BASE) {
        // Run mode takes the steps the speed allows in that time (speed
        // "max" counts as 1000/s); paused, the clock advances and nothing else.
        if (!a->v.running) return;
        int speed = UI_SPEEDS[a->v.speed_index] ? UI_SPEEDS[a->v.speed_index] : 1000;
        long steps = (long)(key - KEY_CODE_WAIT_BASE) * speed / 1000;
        for (long k = 0; k < steps && a->v.running; k++)
            lab_step(a);
    } else if (key == KEY_CODE_FRAME) {
        lab_serve_poll(a);
        lab_draw(screen, a);
        if (frames_out) ui_screen_dump(screen, frames_out);
    } else
        lab_handle_key(a, key);
    lab_track_run_time(a);
}

// Writes the <frame> screens, then the final one, to dump_path ("-":
// stdout; a file is written whole or not at all). Returns the exit status.
static int write_dump(const ui_screen* screen, const char* frames, size_t frames_bytes, bool frames_failed,
                      const char* dump_path) {
    error_info err = {{0}};
    if (strcmp(dump_path, "-") == 0) {
        if (frames_failed || fwrite(frames, 1, frames_bytes, stdout) != frames_bytes ||
            ui_screen_dump(screen, stdout) || fflush(stdout) != 0)
            return 1;
        return 0;
    }
    output_file out;
    if (output_file_open(&out, dump_path, &err) ||
        output_file_commit(&out,
                           frames_failed || fwrite(frames, 1, frames_bytes, out.stream) != frames_bytes ||
                               ui_screen_dump(screen, out.stream) != 0,
                           &err)) {
        fprintf(stderr, "servelab lab: --dump-frame: %s\n", err.message);
        return 1;
    }
    return 0;
}

int lab_run_headless(lab_app* a, const char* keys_text, const char* dump_path, int cols, int rows) {
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
    ui_screen_set_cut_hook(&screen, a->cut_hook, a->cut_hook_user);
    a->cols = cols;
    a->rows = rows;
    // <frame>: the screen then, kept in memory and written before the final
    // frame, so that one replay shows several states (and the dump is still
    // written whole or not at all).
    char* frames = NULL;
    size_t frames_bytes = 0;
    FILE* frames_out = open_memstream(&frames, &frames_bytes);
    for (int i = 0; i < n && !a->quit; i++)
        replay_key(a, &screen, frames_out, keys[i]);
    free(keys);
    lab_report_run_rate(a, "headless");
    lab_serve_poll(a);
    lab_draw(&screen, a);
    bool frames_failed = !frames_out || fclose(frames_out) != 0;
    if (frames_failed) fprintf(stderr, "servelab lab: out of memory for the <frame> frames\n");
    int status = dump_path ? write_dump(&screen, frames, frames_bytes, frames_failed, dump_path) : 0;
    free(frames);
    ui_screen_free(&screen);
    return status;
}
