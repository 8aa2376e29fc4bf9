// lab_app: the lab's actions on its state (lab/cmd/lab_app.h).
#include "lab/cmd/lab_app.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lab/ui/terminal.h"

double lab_monotonic_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void lab_set_message(lab_app* a, const char* text) { snprintf(a->v.message, sizeof a->v.message, "%s", text); }

// Adds the time since running started when the lab is paused; call after
// anything that may start or stop run mode.
void lab_track_run_time(lab_app* a) {
    double now = lab_monotonic_seconds();
    if (a->v.running && a->run_since == 0)
        a->run_since = now;
    else if (!a->v.running && a->run_since > 0) {
        a->run_seconds += now - a->run_since;
        a->run_since = 0;
    }
}

void lab_report_run_rate(lab_app* a, const char* mode) {
    a->v.running = false;
    lab_track_run_time(a);
    if (a->run_steps == 0 || a->run_seconds <= 0) return;
    fprintf(stderr, "servelab lab: run mode (%s): %llu steps in %.2f s of wall time = %.1f steps/s\n", mode,
            (unsigned long long)a->run_steps, a->run_seconds, (double)a->run_steps / a->run_seconds);
}

static void lesson_said(void* user, const char* text) { dashboard_lesson_log(user, LOG_NARRATION, text); }

static void lesson_checked(void* user, const lesson_check_result* result) {
    char* line = NULL;
    size_t size = 0;
    FILE* out = open_memstream(&line, &size);
    if (!out) return;
    lesson_print_check(out, result); // the same line as the headless runner prints
    fclose(out);
    if (size && line[size - 1] == '\n') line[size - 1] = '\0';
    static const lesson_log_kind KINDS[] = {LOG_PASS, LOG_DISAGREE, LOG_FAIL, LOG_STATUS}; // UNDECIDED: neutral
    dashboard_lesson_log(user, KINDS[result->outcome], line);
    free(line);
}

bool lab_lesson_active(const lab_app* a) { return a->lesson && a->lesson_state == LESSON_PAUSED; }

// Runs the lesson to its next pause, its end or an error; the dashboard keeps
// running whatever happens in the lesson.
void lab_resume_lesson(lab_app* a) {
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

int lab_open_lesson(lab_app* a, const char* path, double time_limit_s, error_info* err) {
    lesson_options options = lesson_options_default();
    options.interactive = true; // lab.pause() waits for space
    options.time_limit_s = time_limit_s;
    // Ctrl-C, SIGTERM, SIGHUP, SIGQUIT: the lesson stops even inside a long
    // call, so the key loop gets back to restoring the terminal at once.
    options.stop_flag = ui_terminal_stop_flag();
    options.on_say = lesson_said;
    options.on_check = lesson_checked;
    options.user = &a->d;
    // The pane is headed by the lesson's own title (its declaration runs in
    // microseconds), then the file; a lesson that cannot declare one shows
    // the file alone and says why below.
    lesson_info info;
    error_info no_title = {{0}};
    snprintf(a->d.lesson.file, sizeof a->d.lesson.file, "%s", path);
    a->d.lesson.title[0] = '\0';
    if (lesson_read_info(path, &info, &no_title) == 0)
        snprintf(a->d.lesson.title, sizeof a->d.lesson.title, "%s", info.title);
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
bool lab_serve_poll(lab_app* a) {
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
        lab_set_message(a, err.message);
        a->v.running = false;
    }
    dashboard_follow_engine(&a->d, server_engine(a->server)); // its newest step joins the history
    lab_serve_poll(a);
}

void lab_step(lab_app* a) {
    error_info err = {{0}};
    if (a->server) {
        serve_step(a);
        return;
    }
    if (lab_lesson_active(a)) { // space belongs to the lesson until it ends
        if (a->in_terminal) {   // show that it runs before it blocks the loop
            a->lesson_resume_pending = true;
            snprintf(a->d.lesson.state, sizeof a->d.lesson.state, "running the lesson...");
        } else
            lab_resume_lesson(a);
        return;
    }
    if (a->d.lesson_engine) { // the lesson ended: back to the lab's own engines
        dashboard_follow_engine(&a->d, NULL);
        lab_set_message(a, "back to the lab's engines");
        return;
    }
    if (a->v.running) a->run_steps++;
    if (!dashboard_has_work(&a->d)) {
        lab_set_message(a, "no work: add a request with a");
        a->v.running = false;
        return;
    }
    if (dashboard_step(&a->d, &err)) {
        lab_set_message(a, err.message);
        a->v.running = false;
    }
}

void lab_open_quiz(lab_app* a) {
    error_info err = {{0}};
    char warning[1024] = "";
    if (!a->quiz_loaded && quiz_app_load(&a->quiz, NULL, warning, sizeof warning, &err)) {
        lab_set_message(a, err.message);
        return;
    }
    a->quiz_loaded = true;
    int64_t now = (int64_t)time(NULL);
    quiz_session_options options = {
        QUIZ_ALL_TOPICS, 10, a->quiz_seed ? a->quiz_seed : (uint64_t)now, QUIZ_LANG_EN, now, false, false};
    if (quiz_app_start(&a->quiz, &options, &err)) {
        lab_set_message(a, err.message);
        return;
    }
    a->v.running = false;
    a->quiz_open = true;
    if (warning[0]) lab_set_message(a, warning);
}

void lab_quiz_key(lab_app* a, int key) {
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
    lab_set_message(a, text);
}

void lab_draw(ui_screen* screen, const lab_app* a) {
    if (a->quiz_open)
        quiz_app_draw(screen, &a->quiz);
    else
        ui_draw(screen, &a->d, &a->v);
}
