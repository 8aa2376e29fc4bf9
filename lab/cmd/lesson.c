// servelab lesson run|list|new|check: Lua lessons that drive the engine
// and check the question bank's claims against its measurements.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/fault.h"
#include "engine/output_file.h"
#include "lab/common/cli_args.h"
#include "lab/cmd/commands.h"
#include "lab/common/engine_options.h"
#include "lab/lesson/lesson.h"
#include "lab/common/progress.h"

static const char LESSON_USAGE[] =
    "usage: servelab lesson run FILE [--headless] [--full] [--only ID] [--time-limit S]\n"
    "                           [--memory-limit SIZE] [--write-limit SIZE] [--write-files N]\n"
    "                           [--output DIR] [--verbose] [--progress]\n"
    "                           [--fault NAME[,NAME]] [--audit]\n"
    "       servelab lesson list [DIR]        title and claims of each lesson (default: the lessons\n"
    "                                         beside the binary, in share/servelab, or ./lessons)\n"
    "       servelab lesson new NAME          write a commented skeleton NAME.lua\n"
    "       servelab lesson check FILE...     syntax and declaration, without running\n"
    "       servelab lesson faults [--matrix] [--undeclared] [--time-limit S] [--output DIR] FILE...\n"
    "                                         the claim -> faults table (breaks_with), or with\n"
    "                                         --matrix: each lesson run clean (every claim must\n"
    "                                         PASS), then once per declared fault (each claim that\n"
    "                                         declares it must turn); --undeclared also runs the\n"
    "                                         other faults and lists the claims they turn\n"
    "\n"
    "run: the lesson's title, then narration and checks in the terminal (lab.pause()\n"
    "waits for Enter when stdin is a terminal); a lesson that stops on an error prints\n"
    "it as FILE:LINE: message. --headless prints one line per check: a word for tools,\n"
    "the claim, then in words what the claim is and who says so:\n"
    "  PASS tf3 \"<claim>\": FALSE, as the bank says -- measured: <evidence>\n"
    "      the engine measured what the bank says (here: the claim is false)\n"
    "  DISAGREE tf9 \"<claim>\": TRUE here, but the bank says FALSE -- measured: <evidence>\n"
    "      this engine measured the other answer: worth reading, never hidden\n"
    "  FAIL tf3 \"<claim>\": not judged, the check itself failed (...) -- <error>\n"
    "  UNDECIDED why5 \"<claim>\": not decided, too noisy to tell (...) -- measured: <evidence>\n"
    "A claim of the lesson's own (lab.check's expected, beyond the bank) reads \"as the\n"
    "lesson expects\". Then 'N passed, M failed'; the exit status is 0 only when every\n"
    "check passed (UNDECIDED is neither).\n"
    "\n"
    "  --full               the full-size scenarios (lab.full = true; make lessons); they\n"
    "                       take minutes, so a progress line (checks done, elapsed) shows\n"
    "                       on stderr when it is a terminal\n"
    "  --progress           --full: the progress line even when stderr is not a terminal\n"
    "  --only ID            report only claim ID's check\n"
    "  --audit              every engine the lesson builds checks each step against\n"
    "                       independent counts (engine/audit.h), faults or not\n"
    "  --time-limit S       CPU seconds before the lesson is stopped (default 60)\n"
    "  --memory-limit SIZE  Lua heap + engines + models (default 512MiB)\n"
    "  --write-limit SIZE   bytes a lesson may write in all (default 64MiB)\n"
    "  --write-files N      files a lesson may create in the output folder (default 256)\n"
    "  --output DIR         the one folder lessons may write to (default lesson-output)\n"
    "  --verbose            headless: print the narration too, as '# ' lines\n"
    "  --fault NAME[,NAME]  run the engine with deliberate bugs (servelab info --faults): each\n"
    "                       line then says whether the bug turned its claim, and whether the\n"
    "                       claim declares it (breaks_with)\n"
    "\n"
    "Writing lessons: lessons/README.md.\n";

typedef struct run_args {
    const char* path;
    bool headless;
    bool verbose;
    bool progress_forced;
    lesson_options options;
} run_args;

static int parse_run_args(int argc, char** argv, run_args* a, error_info* err) {
    a->options = lesson_options_default();
    arg_cursor cursor = {argc, argv, 2, "servelab lesson run", NULL};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        if (arg_match(&cursor, "--headless", false, &failed, err)) a->headless = true;
        else if (arg_match(&cursor, "--verbose", false, &failed, err)) a->verbose = true;
        else if (arg_match(&cursor, "--full", false, &failed, err)) a->options.full = true;
        else if (arg_match(&cursor, "--progress", false, &failed, err)) a->progress_forced = true;
        else if (arg_match(&cursor, "--audit", false, &failed, err)) setenv("SERVELAB_AUDIT", "all", 1); // engine/audit.h
        else if (arg_match(&cursor, "--only", true, &failed, err)) {
            if (!failed) a->options.only_claim = cursor.value;
        } else if (arg_match(&cursor, "--fault", true, &failed, err)) {
            fault_set set = 0;
            if (!failed && fault_set_parse(cursor.value, &set, err)) return -1;
            a->options.faults |= set;
        } else if (arg_match(&cursor, "--output", true, &failed, err)) {
            if (!failed) a->options.output_dir = cursor.value;
        } else if (arg_match(&cursor, "--time-limit", true, &failed, err)) {
            float seconds = 0;
            if (!failed && parse_float_arg("--time-limit", cursor.value, 0.01, 86400, &seconds, err)) return -1;
            a->options.time_limit_s = seconds;
        } else if (arg_match(&cursor, "--memory-limit", true, &failed, err)) {
            if (!failed && parse_size_arg("--memory-limit", cursor.value, &a->options.memory_limit_bytes, err)) return -1;
            if (a->options.memory_limit_bytes < (4u << 20))
                return error_set(err, "--memory-limit: expected at least 4MiB, found '%s'", cursor.value);
        } else if (arg_match(&cursor, "--write-limit", true, &failed, err)) {
            if (!failed && parse_size_arg("--write-limit", cursor.value, &a->options.write_limit_bytes, err)) return -1;
            if (a->options.write_limit_bytes == 0)
                return error_set(err, "--write-limit: expected at least 1 byte, found '%s'", cursor.value);
        } else if (arg_match(&cursor, "--write-files", true, &failed, err)) {
            char* end = NULL;
            long files = failed ? 0 : strtol(cursor.value, &end, 10);
            if (!failed && (end == cursor.value || *end || files < 1 || files > 1000000))
                return error_set(err, "--write-files: expected 1..1000000 files, found '%s'", cursor.value);
            a->options.write_limit_files = (int)files;
        } else if (argv[cursor.index][0] == '-') {
            return arg_unknown(&cursor, err);
        } else if (!a->path) {
            a->path = argv[cursor.index];
        } else {
            return error_set(err, "servelab lesson run: one lesson file at a time ('%s' and '%s')", a->path,
                             argv[cursor.index]);
        }
        if (failed) return -1;
    }
    if (!a->path) return error_set(err, "servelab lesson run: which lesson? (servelab lesson run lessons/01-kv-sizing.lua)");
    struct stat st;
    if (stat(a->path, &st) != 0 || !S_ISREG(st.st_mode))
        return error_set(err, "servelab lesson run: %s: no such file (servelab lesson list shows the lessons)",
                         a->path);
    return 0;
}

static void say_to_terminal(void* user, const char* text) {
    (void)user;
    printf("%s\n", text);
    fflush(stdout);
}

static void say_as_comment(void* user, const char* text) {
    (void)user;
    // Every line of the narration becomes a '# ' line (the check lines stay parseable).
    for (const char* line = text; *line;) {
        size_t length = strcspn(line, "\n");
        printf("# %.*s\n", (int)length, line);
        line += length + (line[length] == '\n');
    }
    fflush(stdout);
}

static void check_to_terminal(void* user, const lesson_check_result* result) {
    (void)user;
    lesson_print_check(stdout, result);
}

static void wait_for_enter(void* user) {
    (void)user;
    printf("-- press Enter to continue --");
    fflush(stdout);
    int c;
    while ((c = getchar()) != '\n' && c != EOF) {
    }
}

// The title first, as the dashboard shows it: a student who ran the file
// sees which lesson this is before its narration. A file whose declaration
// cannot be read prints nothing here; the run then reports the error.
static void print_title(const char* path) {
    lesson_info info;
    error_info ignored = {{0}};
    if (lesson_read_info(path, &info, &ignored) == 0) printf("== %s (%s) ==\n", info.title, path);
}

static int run_in_terminal(const run_args* a) {
    print_title(a->path);
    lesson_options options = a->options;
    options.interactive = isatty(STDIN_FILENO);
    options.on_say = say_to_terminal;
    options.on_check = check_to_terminal;
    return lesson_run_file(a->path, &options, wait_for_enter, NULL, stdout, stderr, true);
}

// ---- --full: the same run, with a progress line ------------------------------------

// The full-size scenarios run for minutes between check lines. The progress
// line counts the checks against the claims the lesson declares; it is
// erased while the lesson prints (narration, a check, the Enter prompt),
// and finished before the errors and the summary, so no text lands on it.
typedef struct full_run_progress {
    progress* line;
    const char* path;
    int checks_done, checks_total;
    void (*say)(void* user, const char* text);
    void (*check)(void* user, const lesson_check_result* result);
} full_run_progress;

static void say_around_progress(void* user, const char* text) {
    full_run_progress* f = user;
    if (!f->say) return;
    progress_hold(f->line);
    f->say(NULL, text);
    progress_resume(f->line);
}

static void check_around_progress(void* user, const lesson_check_result* result) {
    full_run_progress* f = user;
    progress_hold(f->line);
    f->check(NULL, result);
    f->checks_done++;
    progress_set(f->line, f->path, f->checks_done, f->checks_total, "checks");
    progress_resume(f->line);
}

// lesson_run_file and lesson_run_headless (lesson_run.c), step by step, so
// that the line is finished before the error and the summary are printed.
static int run_full_with_progress(const run_args* a) {
    lesson_options options = a->options;
    full_run_progress f = {NULL, a->path, 0, 0, a->headless ? NULL : say_to_terminal, check_to_terminal};
    if (a->headless && a->verbose) f.say = say_as_comment;
    if (!a->headless) print_title(a->path);
    lesson_info info;
    error_info ignored = {{0}};
    if (a->options.only_claim) f.checks_total = 1;
    else if (lesson_read_info(a->path, &info, &ignored) == 0) f.checks_total = info.n_claims;
    options.interactive = !a->headless && isatty(STDIN_FILENO);
    options.on_say = say_around_progress;
    options.on_check = check_around_progress;
    options.user = &f;
    f.line = progress_start("servelab lesson", a->progress_forced);
    progress_set(f.line, a->path, 0, f.checks_total, "checks");
    lesson* l = NULL;
    error_info err = {{0}};
    if (lesson_open(&l, a->path, &options, &err)) {
        progress_finish(f.line);
        fprintf(stderr, "%s\n", err.message);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    lesson_status status;
    while ((status = lesson_resume(l)) == LESSON_PAUSED) {
        progress_hold(f.line);
        wait_for_enter(NULL);
        progress_resume(f.line);
    }
    progress_finish(f.line);
    if (status == LESSON_FAILED) fprintf(stderr, "%s\n", lesson_error(l));
    int passed = 0, failed = 0;
    lesson_counts(l, &passed, &failed);
    int undecided = lesson_undecided(l);
    lesson_close(l);
    if (status == LESSON_FAILED && passed + failed + undecided == 0) failed = 1; // failed before any check
    lesson_print_summary(stdout, passed, failed, undecided);
    return failed == 0 && status == LESSON_DONE ? 0 : 1;
}

// SIGINT, SIGTERM and SIGHUP stop the lesson (within half a second, even
// inside a long call); the run then reports what it checked, and the exit
// status is 128 + the signal, as shells expect.
static volatile sig_atomic_t stop_signal = 0;
static void on_stop_signal(int signal_number) { stop_signal = signal_number; }

static void catch_stop_signals(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    static const int STOP_SIGNALS[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof STOP_SIGNALS / sizeof STOP_SIGNALS[0]; i++) sigaction(STOP_SIGNALS[i], &action, NULL);
}

static int command_run(int argc, char** argv) {
    run_args a = {0};
    error_info err = {{0}};
    if (parse_run_args(argc, argv, &a, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 2;
    }
    catch_stop_signals();
    a.options.stop_flag = &stop_signal;
    int status;
    if (a.options.full && progress_wanted(a.progress_forced)) {
        status = run_full_with_progress(&a);
    } else if (!a.headless) {
        status = run_in_terminal(&a);
    } else {
        if (a.verbose) a.options.on_say = say_as_comment;
        status = lesson_run_headless(a.path, &a.options, stdout, stderr);
    }
    if (stop_signal) {
        fprintf(stderr, "servelab lesson run: stopped by %s\n", strsignal(stop_signal));
        return 128 + stop_signal;
    }
    return status;
}

// The lessons that came with this binary, found the way the quiz finds
// quiz/ (lab/quiz/data.c), so `lesson list` works from any folder: beside
// the binary (bin/../lessons, and build/<name>/bin/../../../lessons in a
// clone), the install prefix's share/servelab/lessons, then ./lessons.
// The first folder with a .lua file in it wins. names: (LESSON_MAX_FILES)
// room for listing a folder.
static int find_lessons_folder(char* out, size_t capacity, lesson_file_name* names) {
    char exe[512];
    ssize_t length = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[length > 0 ? length : 0] = '\0';
    char* slash = strrchr(exe, '/');
    if (slash) *slash = '\0'; // the binary's folder
    static const char* const BESIDE_BINARY[] = {"%s/../lessons", "%s/../../../lessons", "%s/../share/servelab/lessons"};
    for (size_t i = 0; length > 0 && i < sizeof BESIDE_BINARY / sizeof BESIDE_BINARY[0]; i++) {
        snprintf(out, capacity, BESIDE_BINARY[i], exe);
        if (lesson_list_folder(out, names, LESSON_MAX_FILES) > 0) return 0;
    }
    snprintf(out, capacity, "lessons");
    if (lesson_list_folder(out, names, LESSON_MAX_FILES) > 0) return 0;
    fprintf(stderr,
            "servelab lesson list: cannot find the lessons: looked in %s/../lessons, %s/../share/servelab/lessons "
            "and ./lessons; name the folder (servelab lesson list DIR)\n",
            exe, exe);
    return -1;
}


static int command_list(int argc, char** argv) {
    if (argc > 3) {
        fprintf(stderr, "servelab lesson list: expected at most one folder\n");
        return 2;
    }
    lesson_file_name* names = calloc(LESSON_MAX_FILES, sizeof *names); // (LESSON_MAX_FILES) names, 64 KiB
    if (!names) {
        fprintf(stderr, "servelab lesson list: out of memory\n");
        return 1;
    }
    char found[600];
    if (argc < 3 && find_lessons_folder(found, sizeof found, names)) {
        free(names);
        return 1;
    }
    const char* folder = argc == 3 ? argv[2] : found;
    int n = lesson_list_folder(folder, names, LESSON_MAX_FILES);
    if (n < 0) {
        fprintf(stderr, "servelab lesson list: %s: no such folder\n", folder);
        free(names);
        return 1;
    }
    int status = 0;
    for (int i = 0; i < n; i++) {
        char path[1400];
        snprintf(path, sizeof path, "%.1000s/%.255s", folder, names[i]);
        lesson_info info;
        error_info err = {{0}};
        if (lesson_read_info(path, &info, &err)) {
            fprintf(stderr, "%s\n", err.message);
            status = 1;
        } else {
            printf("%-28s %s\n%28s claims:", names[i], info.title, "");
            for (int k = 0; k < info.n_claims; k++) printf(" %s", info.claims[k]);
            printf("\n");
        }
    }
    free(names);
    return status;
}

// The lesson's text, NUL-ended, or NULL (lesson_read_info has read it by
// then and named any problem). A lesson is a few KiB; 4 MiB is plenty.
static char* read_lesson_source(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    size_t capacity = 4u << 20;
    char* text = malloc(capacity + 1);
    size_t n = text ? fread(text, 1, capacity, f) : 0;
    fclose(f);
    if (text) text[n] = '\0';
    return text;
}

static int command_check(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "servelab lesson check: which lesson files?\n");
        return 2;
    }
    int status = 0;
    for (int i = 2; i < argc; i++) {
        lesson_info info;
        error_info err = {{0}};
        if (lesson_read_info(argv[i], &info, &err)) {
            fprintf(stderr, "%s\n", err.message);
            status = 1;
            continue;
        }
        char* source = read_lesson_source(argv[i]);
        char problems[4096];
        int n_problems = source ? lesson_lint_bank_answers(source, argv[i], problems, sizeof problems) : 0;
        free(source);
        if (n_problems) {
            fputs(problems, stderr);
            status = 1;
            continue;
        }
        printf("%s: ok: \"%s\", %d claims:", argv[i], info.title, info.n_claims);
        for (int k = 0; k < info.n_claims; k++) printf(" %s", info.claims[k]);
        printf("\n");
    }
    return status;
}

static int command_faults(int argc, char** argv) {
    lesson_options options = lesson_options_default();
    bool matrix = false, undeclared = false;
    const char** paths = calloc((size_t)argc, sizeof *paths);
    int n_paths = 0;
    arg_cursor cursor = {argc, argv, 2, "servelab lesson faults", NULL};
    error_info err = {{0}};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        if (arg_match(&cursor, "--matrix", false, &failed, &err)) matrix = true;
        else if (arg_match(&cursor, "--undeclared", false, &failed, &err)) undeclared = true;
        else if (arg_match(&cursor, "--output", true, &failed, &err)) {
            if (!failed) options.output_dir = cursor.value;
        } else if (arg_match(&cursor, "--time-limit", true, &failed, &err)) {
            float seconds = 0;
            if (!failed) failed = parse_float_arg("--time-limit", cursor.value, 0.01, 86400, &seconds, &err) != 0;
            options.time_limit_s = seconds;
        } else if (argv[cursor.index][0] == '-') {
            failed = arg_unknown(&cursor, &err) != 0;
        } else {
            paths[n_paths++] = argv[cursor.index];
        }
        if (failed) {
            fprintf(stderr, "%s\n", err.message);
            free(paths);
            return 2;
        }
    }
    if (n_paths == 0) {
        fprintf(stderr, "servelab lesson faults: which lesson files? (servelab lesson faults lessons/*.lua)\n");
        free(paths);
        return 2;
    }
    int status = matrix || undeclared ? lesson_fault_matrix(paths, n_paths, &options, undeclared, stdout, stderr)
                                      : lesson_fault_table(paths, n_paths, &options, stdout, stderr);
    free(paths);
    return status;
}

static const char SKELETON[] =
    "-- %s: a servelab lesson (see lessons/README.md for the whole lab API).\n"
    "--\n"
    "-- Run it:   servelab lesson run %s --headless\n"
    "-- Check it: servelab lesson check %s\n"
    "\n"
    "-- 1. Declare the lesson first: its title and every claim id it checks.\n"
    "lab.lesson{\n"
    "    title = \"My lesson\",\n"
    "    claims = {\"mine1\"},\n"
    "}\n"
    "\n"
    "-- 2. Build a scenario. Presets run without files: tiny, small, medium, large.\n"
    "local model = lab.model(\"tiny\")\n"
    "local e = lab.engine{model = model, block_size = 16, num_blocks = 64}\n"
    "local id = e:add{prompt = \"Hello\", max_tokens = 8}\n"
    "lab.say(\"One request of \" .. e:sequence(id).n_prompt .. \" prompt tokens.\")\n"
    "lab.pause() -- waits for a key in the dashboard; does nothing headless\n"
    "\n"
    "-- 3. Measure. Every step returns its record: tokens, bytes, FLOPs, pool figures.\n"
    "local written = {}\n"
    "e:run{stop_when = function(r)\n"
    "    if r.decode_tokens > 0 then written[#written + 1] = r.bytes.kv_written end\n"
    "    return false\n"
    "end}\n"
    "\n"
    "-- 4. Check the claim with a verdict computed from the measurement against an\n"
    "--    independent reference (here the formula from the model's shapes), and\n"
    "--    evidence that carries the numbers. Never write the verdict by hand.\n"
    "--    mine1 is your own claim, so `expected` says what you expect; a claim of\n"
    "--    the question bank (tf3, se1, ...) gives `bank_answer`, which must be\n"
    "--    what the bank says. breaks_with names the engine bugs that must turn\n"
    "--    the verdict (servelab info --faults; servelab lesson faults --matrix).\n"
    "local one_token_bytes = lab.kv_bytes{model = model, seq = 1} -- 2 x L x kv_dim x p\n"
    "local all_equal = #written > 0\n"
    "for step = 1, #written do all_equal = all_equal and written[step] == one_token_bytes end\n"
    "lab.check{\n"
    "    id = \"mine1\",\n"
    "    claim = \"every decode step writes one token's keys and values\",\n"
    "    expected = true,\n"
    "    verdict = all_equal,\n"
    "    evidence = string.format(\"%%d decode steps wrote %%d bytes each; 2*L*kv_dim*p = %%d\", #written,\n"
    "                             written[1] or 0, one_token_bytes),\n"
    "    breaks_with = {\"kv-count-dropped\", \"kv-count-doubled\"},\n"
    "}\n";

static int command_new(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "servelab lesson new: expected one NAME (writes NAME.lua)\n");
        return 2;
    }
    char path[1024];
    size_t length = strlen(argv[2]);
    bool has_suffix = length > 4 && strcmp(argv[2] + length - 4, ".lua") == 0;
    snprintf(path, sizeof path, "%s%s", argv[2], has_suffix ? "" : ".lua");
    struct stat st;
    if (lstat(path, &st) == 0) { // a link (even a dangling one) counts: it is not followed
        fprintf(stderr, "servelab lesson new: %s already exists (not overwritten)\n", path);
        return 1;
    }
    output_file out;
    error_info err = {{0}};
    if (output_file_open(&out, path, &err)) {
        fprintf(stderr, "servelab lesson new: %s\n", err.message);
        return 1;
    }
    bool failed = fprintf(out.stream, SKELETON, path, path, path) < 0;
    if (output_file_commit(&out, failed, &err)) {
        fprintf(stderr, "servelab lesson new: %s\n", err.message);
        return 1;
    }
    printf("wrote %s\n", path);
    return 0;
}

int command_lesson(int argc, char** argv) {
    if (argc < 2 || arg_is_help(argv[1]) || (argc > 2 && arg_is_help(argv[2]))) {
        fputs(LESSON_USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "run") == 0) return command_run(argc, argv);
    if (strcmp(argv[1], "list") == 0) return command_list(argc, argv);
    if (strcmp(argv[1], "new") == 0) return command_new(argc, argv);
    if (strcmp(argv[1], "check") == 0) return command_check(argc, argv);
    if (strcmp(argv[1], "faults") == 0) return command_faults(argc, argv);
    fprintf(stderr, "servelab lesson: unknown subcommand '%s' (run, list, new, check, faults)\n", argv[1]);
    return 2;
}
