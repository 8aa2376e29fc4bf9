#include "lab/quiz/app.h"

#include <curses.h>
#include <stdlib.h>
#include <string.h>

#include "lab/lesson/lesson.h"
#include "lab/quiz/view.h"
#include "lab/ui/terminal.h"

_Static_assert(QUIZ_KEY_UP == KEY_UP && QUIZ_KEY_DOWN == KEY_DOWN && QUIZ_KEY_PGUP == KEY_PPAGE &&
                   QUIZ_KEY_PGDN == KEY_NPAGE && QUIZ_KEY_HOME == KEY_HOME && QUIZ_KEY_END == KEY_END,
               "QUIZ_KEY_* are curses's key codes");

static int prove_with_lessons(const char* lessons_dir, const char* claim_id, FILE* out, error_info* err) {
    fprintf(out, "running the lesson check for %s in %s (headless)...\n", claim_id, lessons_dir);
    fflush(out);
    // The terminal's stop flag: Ctrl-C, SIGTERM or SIGHUP during a check (up
    // to its 300 s CPU limit) ends the lesson within a second, then the key
    // loop sees the same flag and gives the terminal back. Without a
    // terminal (--plain) no handler is installed and the signal ends the
    // process at once; progress is saved after every answer.
    int status = lesson_prove_claim(lessons_dir, claim_id, ui_terminal_stop_flag(), out, err);
    return status < 0 ? -1 : 0; // a DISAGREE or FAIL line is the answer, not an error
}

int quiz_app_load(quiz_app* app, const char* quiz_dir, char* warning, size_t capacity, error_info* err) {
    memset(app, 0, sizeof *app);
    app->prove = prove_with_lessons;
    char dir[1024], path[1200];
    if (quiz_dir)
        snprintf(dir, sizeof dir, "%s", quiz_dir);
    else if (quiz_find_dir(dir, sizeof dir, err))
        return -1;
    snprintf(app->lessons_dir, sizeof app->lessons_dir, "%.1000s/../lessons", dir);
    snprintf(path, sizeof path, "%s/bank.lua", dir);
    if (quiz_bank_load(path, &app->bank, err)) return -1;
    snprintf(path, sizeof path, "%s/models.lua", dir);
    if (quiz_models_load(path, &app->models, err)) {
        quiz_bank_free(&app->bank);
        return -1;
    }
    if (quiz_progress_default_path(app->progress_path, sizeof app->progress_path, err) ||
        quiz_progress_load(app->progress_path, &app->progress, warning, capacity, err)) {
        quiz_models_free(&app->models);
        quiz_bank_free(&app->bank);
        return -1;
    }
    app->drawn = calloc(1, sizeof *app->drawn);
    if (!app->drawn) {
        quiz_progress_free(&app->progress);
        quiz_models_free(&app->models);
        quiz_bank_free(&app->bank);
        return error_set(err, "quiz: out of memory");
    }
    return 0;
}

int quiz_app_start(quiz_app* app, const quiz_session_options* options, error_info* err) {
    if (app->session_started) quiz_session_free(&app->session);
    app->session_started = false;
    app->input[0] = '\0';
    free(app->notice);
    app->notice = NULL;
    app->feedback_top = 0;
    if (quiz_session_start(&app->session, options, &app->bank, &app->models, &app->progress, err)) return -1;
    app->session_started = true;
    return 0;
}

int quiz_app_save(quiz_app* app, FILE* warnings) {
    error_info err = {{0}};
    app->save_error[0] = '\0';
    if (quiz_progress_save(app->progress_path, &app->progress, &err) == 0) return 0;
    snprintf(app->save_error, sizeof app->save_error, "%s", err.message[0] ? err.message : "cannot write the file");
    if (warnings) fprintf(warnings, "servelab quiz: warning: %s\n", app->save_error);
    return -1;
}

// Runs the prove hook into a string for the feedback area (malloc'ed).
static char* prove_to_text(quiz_app* app) {
    char* text = NULL;
    size_t size = 0;
    FILE* out = open_memstream(&text, &size);
    if (!out) return NULL;
    error_info err = {{0}};
    if (app->prove(app->lessons_dir, quiz_session_claim(&app->session), out, &err)) fprintf(out, "%s\n", err.message);
    fclose(out);
    return text;
}

// Moves the feedback box's text for a scroll key; false for any other key.
// Before the first draw there is nothing on the screen to scroll.
static bool scroll_key(quiz_app* app, int key) {
    if (key != QUIZ_KEY_UP && key != QUIZ_KEY_DOWN && key != QUIZ_KEY_PGUP && key != QUIZ_KEY_PGDN &&
        key != QUIZ_KEY_HOME && key != QUIZ_KEY_END)
        return false;
    if (!app->drawn || app->drawn->cols <= 0) return true;
    quiz_view_scroll v =
        quiz_view_scroll_for(&app->session, app->notice, app->drawn->cols, app->drawn->rows, app->feedback_top);
    int page_step = v.page > 1 ? v.page - 1 : 1; // one row of overlap keeps the reader's place
    int top = v.top;
    if (key == QUIZ_KEY_UP) top -= 1;
    if (key == QUIZ_KEY_DOWN) top += 1;
    if (key == QUIZ_KEY_PGUP) top -= page_step;
    if (key == QUIZ_KEY_PGDN) top += page_step;
    if (key == QUIZ_KEY_HOME) top = 0;
    if (key == QUIZ_KEY_END) top = v.last_top;
    app->feedback_top = top < 0 ? 0 : top > v.last_top ? v.last_top : top;
    return true;
}

static bool stage_key(quiz_app* app, int key) {
    quiz_session* s = &app->session;
    size_t length = strlen(app->input);
    error_info err = {{0}};
    if (key == 27) return false; // Esc
    if (s->stage == QUIZ_STAGE_FEEDBACK) {
        if (key == 'q') return false;
        if (key == 'p' && quiz_session_claim(s)) {
            free(app->notice);
            app->notice = prove_to_text(app);
        } else if (key == '\n' || key == '\r' || key == ' ' || key == 'n') {
            free(app->notice);
            app->notice = NULL;
            quiz_session_next(s);
            app->input[0] = '\0';
        }
        return s->stage != QUIZ_STAGE_DONE;
    }
    if (s->stage == QUIZ_STAGE_SELF_GRADE) {
        if (key == 'q') return false;
        if (key != 'y' && key != 'n') return true;
        char answer[2] = {(char)key, '\0'};
        if (quiz_session_input(s, answer, &err) == QUIZ_INPUT_GRADED) quiz_app_save(app, stderr);
        return true;
    }
    if (key == '\n' || key == '\r') {
        quiz_input_result result = quiz_session_input(s, app->input, &err);
        if (result == QUIZ_INPUT_QUIT) return false;
        if (result == QUIZ_INPUT_GRADED) quiz_app_save(app, stderr);
        if (result == QUIZ_INPUT_RETRY) app->input[0] = '\0';
    } else if (key == 127 || key == 8) {
        if (length) app->input[length - 1] = '\0';
    } else if (key >= 0x20 && key < 0x7f && length + 1 < sizeof app->input) {
        app->input[length] = (char)key;
        app->input[length + 1] = '\0';
    }
    return true;
}

bool quiz_app_key(quiz_app* app, int key) {
    if (scroll_key(app, key)) return true;
    // A key that may put new text in the feedback box: it starts at its top.
    quiz_stage stage = app->session.stage;
    int current = app->session.current;
    bool running = stage_key(app, key);
    if (key == 'p' || key == '\n' || key == '\r' || app->session.stage != stage || app->session.current != current)
        app->feedback_top = 0;
    return running;
}

bool quiz_app_too_small(const quiz_app* app, int cols, int rows) {
    if (!app->session_started) return false;
    int need_cols, need_rows;
    return !quiz_view_fits(&app->session, app->notice, cols, rows, &need_cols, &need_rows);
}

void quiz_app_draw(ui_screen* screen, const quiz_app* app) {
    if (app->drawn) *app->drawn = (quiz_app_drawn){screen->cols, screen->rows};
    quiz_view_draw(screen, &app->session, app->input, app->notice, app->feedback_top);
}

void quiz_app_free(quiz_app* app) {
    free(app->notice);
    free(app->drawn);
    if (app->session_started) quiz_session_free(&app->session);
    quiz_progress_free(&app->progress);
    quiz_models_free(&app->models);
    quiz_bank_free(&app->bank);
    memset(app, 0, sizeof *app);
}
