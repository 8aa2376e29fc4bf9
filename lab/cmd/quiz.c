// servelab quiz: the question bank and the numeric drills, with spaced
// repetition. Two front ends drive one pure session (lab/quiz/session.h):
// plain line-by-line prompts (--plain, or whenever stdin or stdout is not a
// terminal) and a full-screen view on the dashboard's screen layer.
#include <curses.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lab/common/cli_args.h"
#include "lab/cmd/cli.h"
#include "lab/cmd/commands.h"
#include "lab/quiz/app.h"
#include "lab/ui/terminal.h"

static const char QUIZ_USAGE[] =
    "usage: servelab quiz [options]\n"
    "\n"
    "Quiz yourself on LLM serving: the question bank (true/false, spot the error,\n"
    "why, edge cases, recall) and numeric drills with fresh numbers from real model\n"
    "shapes (KV size, blocks and tail waste, memory fit, quantization s/z/q/r_hat,\n"
    "step ratios, decode time bounds, weight bytes). Items come back on a Leitner\n"
    "schedule: wrong answers soon, right ones after 1, 3, 7 and 16 days.\n"
    "\n"
    "  --topic T         only this topic: kv-sizing paged batching roofline quantization\n"
    "                    awq-gptq parallelism (repeatable; default all)\n"
    "  --n N             questions in this session (default 10)\n"
    "  --seed S          the numbers and the order (default: from the clock; printed)\n"
    "  --plain           line-by-line prompts on stdin/stdout (the default when either\n"
    "                    is not a terminal); end of input ends the session\n"
    "  --stats           accuracy per topic and items due, then exit\n"
    "  --lang en|hi-en   English (default) or Hinglish for the bank's questions\n"
    "  --only bank|drills  leave out the drills or the bank\n"
    "  --quiz-dir DIR    the folder with bank.lua and models.lua (default: found\n"
    "                    beside the binary or in ./quiz; or $SERVELAB_QUIZ_DIR)\n"
    "\n"
    "Answers: numbers take units B KB KiB MB MiB GB GiB % x ms (a bare number is in\n"
    "the unit asked); t/f; a letter; y/n when asked whether yours matched. After an\n"
    "answer, p proves the claim with its lesson check. q quits.\n"
    "Progress: $XDG_DATA_HOME/servelab/progress (default ~/.local/share/servelab/progress).\n";

// ---- plain prompts --------------------------------------------------------------------

// One line from stdin without its newline; false at end of input.
static bool read_line(char** line, size_t* capacity) {
    ssize_t n = getline(line, capacity, stdin);
    if (n < 0) return false;
    while (n > 0 && ((*line)[n - 1] == '\n' || (*line)[n - 1] == '\r'))
        (*line)[--n] = '\0';
    return true;
}

static void prompt(const char* hint) {
    printf("%s> ", hint);
    fflush(stdout);
}

// Saves the progress (atomically); a failure is a warning on stderr.
// True when the file was written. (quiz_app_save reports but cannot say.)
static bool save_progress(quiz_app* run) {
    error_info err = {{0}};
    if (quiz_progress_save(run->progress_path, &run->progress, &err) == 0) return true;
    fprintf(stderr, "servelab quiz: warning: %s\n", err.message);
    return false;
}

// The end of the goodbye line: where the progress went, only when the last
// save wrote it; "saved" after a failed write or no write at all misleads.
static void print_save_outcome(bool answered, bool saved, const char* path) {
    if (saved)
        printf("Progress saved to %s\n", path);
    else if (!answered)
        printf("Nothing answered, so nothing saved; %s is unchanged.\n", path);
    else
        printf("Progress NOT saved to %s (see the warning above).\n", path);
}

static int run_plain(quiz_app* run) {
    quiz_session* s = &run->session;
    char* line = NULL;
    size_t capacity = 0;
    bool input_open = true;
    bool answered = false, saved = false; // saved: the last save wrote the file
    char question[4096];
    while (input_open && s->stage != QUIZ_STAGE_DONE) {
        quiz_session_format_question(s, question, sizeof question);
        printf("\n%s", question);
        // Until graded: the answer, then y/n when the session asks for it.
        while (s->stage == QUIZ_STAGE_ASK || s->stage == QUIZ_STAGE_SELF_GRADE) {
            prompt(quiz_session_input_hint(s));
            if (!(input_open = read_line(&line, &capacity))) break;
            error_info err = {{0}};
            quiz_input_result result = quiz_session_input(s, line, &err);
            if (result == QUIZ_INPUT_QUIT) break;
            printf("%s\n", s->feedback);
            if (result == QUIZ_INPUT_GRADED) {
                answered = true;
                saved = save_progress(run);
            }
        }
        if (!input_open || s->stage == QUIZ_STAGE_DONE) break;
        // Graded: p proves the claim (as often as asked), anything else moves on.
        while (quiz_session_claim(s)) {
            prompt(quiz_session_input_hint(s));
            if (!(input_open = read_line(&line, &capacity))) break;
            if (strcmp(line, "q") == 0) s->stage = QUIZ_STAGE_DONE;
            if (strcmp(line, "p") != 0) break;
            error_info err = {{0}};
            fflush(stdout);
            if (run->prove(run->lessons_dir, quiz_session_claim(s), stdout, &err)) printf("%s\n", err.message);
        }
        quiz_session_next(s);
    }
    free(line);
    printf("\nSession over: %d right, %d wrong%s. ", s->n_correct, s->n_wrong, input_open ? "" : " (end of input)");
    print_save_outcome(answered, saved, run->progress_path);
    return 0;
}

// ---- the terminal view ------------------------------------------------------------------

static int run_terminal(quiz_app* run) {
    bool utf8 = false, color = false;
    if (ui_terminal_open(&utf8, &color)) {
        fprintf(stderr, "servelab quiz: cannot open the terminal (use --plain)\n");
        return 1;
    }
    ui_screen screen;
    if (ui_screen_init(&screen, COLS, LINES, utf8, color)) {
        ui_terminal_close();
        fprintf(stderr, "servelab quiz: out of memory\n");
        return 1;
    }
    bool running = true, dirty = true;
    while (running && !ui_terminal_stop_requested() && run->session.stage != QUIZ_STAGE_DONE) {
        if (dirty) {
            quiz_app_draw(&screen, run);
            ui_screen_flush_curses(&screen);
            refresh();
            dirty = false;
        }
        timeout(100); // wake up to notice a signal
        int key = getch();
        if (key == ERR) continue;
        dirty = true;
        if (key == KEY_RESIZE)
            ui_screen_resize(&screen, COLS, LINES);
        else
            running = quiz_app_key(run, key == KEY_ENTER ? '\n' : key == KEY_BACKSPACE ? 127 : key);
    }
    ui_screen_free(&screen);
    ui_terminal_close();
    // Saved on the way out even with nothing answered (the progress as
    // loaded is written again), so here only a failed write is not "saved".
    bool saved = save_progress(run);
    printf("servelab quiz: %d right, %d wrong. ", run->session.n_correct, run->session.n_wrong);
    print_save_outcome(true, saved, run->progress_path);
    return 0;
}

// ---- the command ---------------------------------------------------------------------------

typedef struct quiz_flags {
    unsigned topics;
    int n_questions;
    uint64_t seed;
    bool seed_given, plain, stats;
    quiz_lang lang;
    bool bank_only, drills_only;
    const char* quiz_dir;
} quiz_flags;

static int parse_flags(int argc, char** argv, quiz_flags* flags, error_info* err) {
    arg_cursor cursor = {argc, argv, 1, "servelab quiz", NULL};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        const char* arg = argv[cursor.index];
        if (arg_match(&cursor, "--topic", true, &failed, err)) {
            if (failed) return -1;
            int topic = quiz_topic_parse(cursor.value);
            if (topic < 0)
                return error_set(err,
                                 "--topic: unknown topic '%s' (expected kv-sizing, paged, batching, roofline, "
                                 "quantization, awq-gptq or parallelism)",
                                 cursor.value);
            flags->topics |= QUIZ_TOPIC_BIT(topic);
        } else if (arg_match(&cursor, "--n", true, &failed, err)) {
            if (failed || parse_int_arg("--n", cursor.value, 1, 1000, &flags->n_questions, err)) return -1;
        } else if (arg_match(&cursor, "--seed", true, &failed, err)) {
            if (failed || parse_u64_arg("--seed", cursor.value, &flags->seed, err)) return -1;
            flags->seed_given = true;
        } else if (arg_match(&cursor, "--lang", true, &failed, err)) {
            if (failed) return -1;
            if (strcmp(cursor.value, "en") == 0)
                flags->lang = QUIZ_LANG_EN;
            else if (strcmp(cursor.value, "hi-en") == 0)
                flags->lang = QUIZ_LANG_HI_EN;
            else
                return error_set(err, "--lang: expected en or hi-en, found '%s'", cursor.value);
        } else if (arg_match(&cursor, "--only", true, &failed, err)) {
            if (failed) return -1;
            if (strcmp(cursor.value, "bank") == 0)
                flags->bank_only = true;
            else if (strcmp(cursor.value, "drills") == 0)
                flags->drills_only = true;
            else
                return error_set(err, "--only: expected bank or drills, found '%s'", cursor.value);
        } else if (arg_match(&cursor, "--quiz-dir", true, &failed, err)) {
            if (failed) return -1;
            flags->quiz_dir = cursor.value;
        } else if (arg_match(&cursor, "--plain", false, &failed, err)) {
            flags->plain = true;
        } else if (arg_match(&cursor, "--stats", false, &failed, err)) {
            flags->stats = true;
        } else {
            return error_set(err, "unknown option '%s' (see servelab quiz --help)", arg);
        }
    }
    return 0;
}

int command_quiz(int argc, char** argv) {
    if (cli_answer_help(argc, argv, QUIZ_USAGE, NULL)) return 0;
    setlocale(LC_ALL, "");
    error_info err = {{0}};
    quiz_flags flags = {0, 10, 0, false, false, false, QUIZ_LANG_EN, false, false, NULL};
    if (parse_flags(argc, argv, &flags, &err)) {
        fprintf(stderr, "servelab quiz: %s\n", err.message);
        return 2;
    }
    if (flags.bank_only && flags.drills_only) {
        fprintf(stderr, "servelab quiz: --only: give bank or drills, not both\n");
        return 2;
    }
    quiz_app run;
    char warning[2048] = "";
    int status = 0;
    if (quiz_app_load(&run, flags.quiz_dir, warning, sizeof warning, &err)) {
        fprintf(stderr, "servelab quiz: %s\n", err.message);
        return 1;
    }
    if (warning[0]) fprintf(stderr, "servelab quiz: warning: %s\n", warning);
    int64_t now = (int64_t)time(NULL);
    if (status == 0 && flags.stats) {
        printf("progress: %s\n", run.progress_path);
        quiz_stats_print(stdout, &run.bank, &run.progress, now);
    } else if (status == 0) {
        if (!flags.seed_given) flags.seed = (uint64_t)now * 2654435761u ^ (uint64_t)getpid();
        quiz_session_options options = {flags.topics ? flags.topics : QUIZ_ALL_TOPICS,
                                        flags.n_questions,
                                        flags.seed,
                                        flags.lang,
                                        now,
                                        flags.bank_only,
                                        flags.drills_only};
        if (quiz_app_start(&run, &options, &err)) {
            fprintf(stderr, "servelab quiz: %s\n", err.message);
            status = 1;
        } else if (flags.plain || !isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
            printf("servelab quiz: %d question%s, seed %llu (--seed %llu repeats them). Type q to stop.\n",
                   run.session.n_questions, run.session.n_questions == 1 ? "" : "s", (unsigned long long)flags.seed, (unsigned long long)flags.seed);
            status = run_plain(&run);
        } else {
            status = run_terminal(&run);
        }
    }
    quiz_app_free(&run);
    return status;
}
