// The hostile-lesson suite: every file in tests/lessons/hostile/ is an
// attack a stranger's lesson could make, with the message the host must
// answer it with. Each runs as a user would run it (the servelab binary,
// `lesson run --headless --verbose --time-limit 1`, or `lesson check`; and
// again in the dashboard, see run_attack) in a fresh
// folder laid out like an unpacked lesson bundle, beside a folder
// `outside/` that stands for the rest of the user's files. A lesson passes
// when the host
//   - exits by itself within the lesson's max-seconds, with the expected
//     status (never a signal, never a sanitizer report),
//   - prints every expected text,
//   - prints no raw ESC byte (the lesson's text reaches the terminal inert),
//   - changed nothing outside the output folder (every file's type, size,
//     time and link target compared before and after).
// `make test` runs it against the release build and `make check` against
// the sanitizer build.
//
// Header lines of a hostile lesson (before its code):
//   -- hostile: what it tries
//   -- setup: mkdir DIR | symlink PATH TARGET | hardlink PATH EXISTING |
//             fifo PATH | copy-shared NAME   (paths relative to the lesson's folder)
//   -- command: run (default) | check
//   -- args: extra arguments for `lesson run`
//   -- expect: text that must appear in stdout + stderr (one per line)
//   -- expect-status: N (default 1)
//   -- max-seconds: N wall-clock seconds before the run counts as hung (default 60:
//      a busy 2-core machine gave one CPU second in 8 wall seconds)
//   -- time-limit: S the lesson's --time-limit (default 1)
//   -- max-cpu-seconds: N the CPU the run may use (default 3: the 1 s limit,
//      the watchdog's 0.5 s grace, and start-up; this is what shows the limit holds)
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/test_support.h"

#define HOSTILE_DIR "tests/lessons/hostile"

enum { MAX_LINES = 16 };

typedef struct hostile_spec {
    char setups[MAX_LINES][512];
    int n_setups;
    char expects[MAX_LINES][512];
    int n_expects;
    char command[16];
    char args[256];
    int expect_status;
    int max_seconds;
    double max_cpu_seconds;
    char time_limit[16];
} hostile_spec;

static void parse_spec(const char* text, hostile_spec* spec) {
    memset(spec, 0, sizeof *spec);
    snprintf(spec->command, sizeof spec->command, "run");
    spec->expect_status = 1;
    spec->max_seconds = 60;
    spec->max_cpu_seconds = 3;
    snprintf(spec->time_limit, sizeof spec->time_limit, "1");
    for (const char* line = text; *line;) {
        size_t length = strcspn(line, "\n");
        char value[512];
        const char* directives[] = {"-- setup: ",         "-- expect: ",      "-- command: ",        "-- args: ",
                                     "-- expect-status: ", "-- max-seconds: ", "-- max-cpu-seconds: ",
                                     "-- time-limit: "};
        for (int d = 0; d < 8; d++) {
            size_t n = strlen(directives[d]);
            if (length < n || strncmp(line, directives[d], n) != 0) continue;
            snprintf(value, sizeof value, "%.*s", (int)(length - n), line + n);
            if (d == 0 && spec->n_setups < MAX_LINES) snprintf(spec->setups[spec->n_setups++], 512, "%s", value);
            if (d == 1 && spec->n_expects < MAX_LINES) snprintf(spec->expects[spec->n_expects++], 512, "%s", value);
            if (d == 2) snprintf(spec->command, sizeof spec->command, "%.15s", value);
            if (d == 3) snprintf(spec->args, sizeof spec->args, "%.255s", value);
            if (d == 4) spec->expect_status = atoi(value);
            if (d == 5) spec->max_seconds = atoi(value);
            if (d == 6) spec->max_cpu_seconds = atof(value);
            if (d == 7) snprintf(spec->time_limit, sizeof spec->time_limit, "%.15s", value);
        }
        line += length + (line[length] == '\n');
    }
}

static bool copy_file(const char* from, const char* to) {
    size_t size = 0;
    unsigned char* bytes = test_read_file(from, &size);
    bool ok = bytes && test_write_file(to, bytes, size);
    free(bytes);
    return ok;
}

// Lays out one setup line inside the lesson's folder.
static void apply_setup(const char* lesson_dir, const char* line) {
    char verb[32] = "", a[256] = "", b[256] = "", path[1024], other[1024];
    sscanf(line, "%31s %255s %255s", verb, a, b);
    snprintf(path, sizeof path, "%s/%s", lesson_dir, a);
    if (strcmp(verb, "mkdir") == 0) {
        assert_int_equal(mkdir(path, 0755), 0);
    } else if (strcmp(verb, "symlink") == 0) {
        assert_int_equal(symlink(b, path), 0);
    } else if (strcmp(verb, "hardlink") == 0) {
        snprintf(other, sizeof other, "%s/%s", lesson_dir, b);
        assert_int_equal(link(other, path), 0);
    } else if (strcmp(verb, "fifo") == 0) {
        assert_int_equal(mkfifo(path, 0644), 0);
    } else if (strcmp(verb, "copy-shared") == 0) {
        char shared[1024];
        REQUIRE_SHARED_MODEL(shared, a);
        assert_true(copy_file(shared, path));
    } else {
        fail_msg("unknown setup line '%s'", line);
    }
}

// ---- a listing of a folder tree, to compare before and after ------------------------------

static char* listing;
static size_t listing_length, listing_capacity;
static const char* listing_root;
static const char* listing_skip; // the output folder: the one place writes may go

static void listing_add(const char* text) {
    size_t n = strlen(text);
    if (listing_length + n + 1 > listing_capacity) {
        listing_capacity = (listing_length + n + 1) * 2;
        listing = realloc(listing, listing_capacity);
        assert_non_null(listing);
    }
    memcpy(listing + listing_length, text, n + 1);
    listing_length += n;
}

static int list_entry(const char* path, const struct stat* st, int type, struct FTW* walk) {
    (void)walk;
    size_t skip = strlen(listing_skip);
    if (strncmp(path, listing_skip, skip) == 0 && (path[skip] == '/' || path[skip] == '\0')) return 0;
    char target[PATH_MAX] = "";
    if (type == FTW_SL) {
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
    }
    char line[2 * PATH_MAX + 128];
    // A folder's own size and time change when the output folder is made in
    // it; what it holds is listed entry by entry.
    bool folder = S_ISDIR(st->st_mode);
    snprintf(line, sizeof line, "%s mode=%o size=%lld mtime=%lld.%09ld -> %s\n", path + strlen(listing_root),
             (unsigned)st->st_mode, folder ? 0LL : (long long)st->st_size, folder ? 0LL : (long long)st->st_mtim.tv_sec,
             folder ? 0L : st->st_mtim.tv_nsec, target);
    listing_add(line);
    return 0;
}

// Every entry under root except the output folder, one line each, in walk order.
static char* list_tree(const char* root, const char* skip) {
    listing = NULL;
    listing_length = listing_capacity = 0;
    listing_root = root;
    listing_skip = skip;
    listing_add("");
    nftw(root, list_entry, 16, FTW_PHYS);
    return listing;
}

static int remove_entry(const char* path, const struct stat* st, int type, struct FTW* walk) {
    (void)st;
    (void)type;
    (void)walk;
    remove(path);
    return 0;
}

// ---- one attack ------------------------------------------------------------------------------

// One attack in one host: the headless runner (every check above), or the
// dashboard (`servelab lab --lesson ... --keys <space>`, headless frames),
// which must survive it: exit 0, inert text in its frame, nothing written
// outside, the CPU bound.
static void run_attack(const char* name, bool in_dashboard) {
    char source[PATH_MAX];
    snprintf(source, sizeof source, "%s/%s", HOSTILE_DIR, name);
    char* text = test_read_text(source);
    hostile_spec spec;
    parse_spec(text, &spec);
    assert_true(spec.n_expects > 0);
    if (in_dashboard) {
        spec.expect_status = 0;
        spec.n_expects = 0;
        spec.max_cpu_seconds += 1.5; // the lab's own model and first frames
    }

    char binary[PATH_MAX];
    assert_non_null(realpath(test_servelab_binary(), binary));
    char resolved[PATH_MAX], scratch[512], root[600], lesson_dir[700], outside[700], output_dir[800];
    assert_non_null(realpath(test_scratch_dir(), resolved));
    assert_true(strlen(resolved) < sizeof scratch);
    memcpy(scratch, resolved, strlen(resolved) + 1);
    snprintf(root, sizeof root, "%s/hostile-XXXXXX", scratch);
    assert_non_null(mkdtemp(root));
    snprintf(lesson_dir, sizeof lesson_dir, "%s/lesson", root);
    snprintf(outside, sizeof outside, "%s/outside", root);
    snprintf(output_dir, sizeof output_dir, "%s/lesson-output", lesson_dir);
    assert_int_equal(mkdir(lesson_dir, 0755), 0);
    assert_int_equal(mkdir(outside, 0755), 0);
    char path[800];
    snprintf(path, sizeof path, "%s/sentinel", outside);
    assert_true(test_write_file(path, "sentinel\n", 9));
    snprintf(path, sizeof path, "%s/attack.lua", lesson_dir);
    assert_true(test_write_file(path, text, strlen(text)));
    for (int i = 0; i < spec.n_setups; i++) apply_setup(lesson_dir, spec.setups[i]);
    char* before = list_tree(root, output_dir);

    // The run, with its output in a file and a deadline.
    char output_path[700], frame_path[700];
    snprintf(output_path, sizeof output_path, "%s.output.txt", root); // beside the tree, not in it
    snprintf(frame_path, sizeof frame_path, "%s.frame.txt", root);
    char* argv[24];
    int argc = 0;
    argv[argc++] = binary;
    if (in_dashboard) {
        char* dashboard_words[] = {"lab", "--lesson", "attack.lua", "--time-limit", spec.time_limit, "--model", "tiny", "--keys",
                                   "<space><wait:50>", "--size", "200x60", "--dump-frame", frame_path};
        for (size_t i = 0; i < sizeof dashboard_words / sizeof dashboard_words[0]; i++) argv[argc++] = dashboard_words[i];
        spec.args[0] = '\0';
    } else {
        argv[argc++] = "lesson";
        argv[argc++] = spec.command;
        argv[argc++] = "attack.lua";
    }
    if (!in_dashboard && strcmp(spec.command, "run") == 0) {
        argv[argc++] = "--headless";
        argv[argc++] = "--verbose"; // the narration too: it must reach the output inert
        argv[argc++] = "--time-limit";
        argv[argc++] = spec.time_limit;
    }
    char args[256];
    snprintf(args, sizeof args, "%s", spec.args);
    for (char* word = strtok(args, " "); word && argc < 20; word = strtok(NULL, " ")) argv[argc++] = word;
    argv[argc] = NULL;
    fflush(NULL);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        if (chdir(lesson_dir) != 0) _exit(126);
        FILE* out = freopen(output_path, "w", stdout);
        if (!out || dup2(fileno(out), STDERR_FILENO) < 0 || !freopen("/dev/null", "r", stdin)) _exit(126);
        execv(binary, argv);
        _exit(127);
    }
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int raw = 0;
    bool hung = false;
    struct rusage usage;
    memset(&usage, 0, sizeof usage);
    for (;;) {
        pid_t done = wait4(child, &raw, WNOHANG, &usage);
        if (done == child) break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) * 1e-9 > spec.max_seconds) {
            kill(child, SIGKILL);
            waitpid(child, &raw, 0);
            hung = true;
            break;
        }
        usleep(10000);
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    double seconds = (double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) * 1e-9;
    double cpu_seconds = (double)usage.ru_utime.tv_sec + (double)usage.ru_utime.tv_usec * 1e-6 +
                         (double)usage.ru_stime.tv_sec + (double)usage.ru_stime.tv_usec * 1e-6;
    size_t output_size = 0;
    unsigned char* bytes = test_read_file(output_path, &output_size);
    if (in_dashboard && bytes) { // what a user sees is the frame; the output must be clean too
        size_t frame_size = 0;
        unsigned char* frame = test_read_file(frame_path, &frame_size);
        if (frame) {
            unsigned char* both = realloc(bytes, output_size + frame_size);
            assert_non_null(both);
            memcpy(both + output_size, frame, frame_size);
            bytes = both;
            output_size += frame_size;
            free(frame);
        }
    }
    char* output = calloc(output_size + 1, 1);
    if (bytes) memcpy(output, bytes, output_size);
    free(bytes);
    char* after = list_tree(root, output_dir);

    // A short view of the output for the log (the megabyte-narration lesson prints 2 MB).
    print_message("%s: %.2f s (%.2f s CPU), status %d%s\n%.1500s%s\n", name, seconds, cpu_seconds,
                  WIFEXITED(raw) ? WEXITSTATUS(raw) : -1,
                  hung ? " (killed: it hung)" : "", output, output_size > 1500 ? "\n[... output shortened for the log]" : "");
    bool ok = true;
    if (hung) {
        print_message("FAILED %s: still running after %d s\n", name, spec.max_seconds);
        ok = false;
    } else if (!WIFEXITED(raw)) {
        print_message("FAILED %s: the host died of signal %d\n", name, WTERMSIG(raw));
        ok = false;
    } else if (cpu_seconds > spec.max_cpu_seconds) {
        print_message("FAILED %s: used %.2f s of CPU, more than %.1f\n", name, cpu_seconds, spec.max_cpu_seconds);
        ok = false;
    } else if (WEXITSTATUS(raw) != spec.expect_status) {
        print_message("FAILED %s: exit status %d, expected %d\n", name, WEXITSTATUS(raw), spec.expect_status);
        ok = false;
    }
    for (int i = 0; i < spec.n_expects; i++)
        if (!strstr(output, spec.expects[i])) {
            print_message("FAILED %s: the output lacks '%s'\n", name, spec.expects[i]);
            ok = false;
        }
    if (memchr(output, 0x1b, output_size)) {
        print_message("FAILED %s: a raw ESC byte reached the output\n", name);
        ok = false;
    }
    static const char* const sanitizer_words[] = {"AddressSanitizer", "LeakSanitizer", "runtime error:", NULL};
    for (const char* const* word = sanitizer_words; *word; word++)
        if (strstr(output, *word)) {
            print_message("FAILED %s: sanitizer report ('%s')\n", name, *word);
            ok = false;
        }
    if (strcmp(before, after) != 0) {
        print_message("FAILED %s: files outside the output folder changed.\nbefore:\n%s\nafter:\n%s\n", name, before, after);
        ok = false;
    }
    free(before);
    free(after);
    free(output);
    free(text);
    if (ok) { // kept for a look when it failed
        nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        remove(output_path);
        remove(frame_path);
    }
    assert_true(ok);
}

static void run_in_runner(void** state) { run_attack(*state, false); }
static void run_in_dashboard(void** state) { run_attack(*state, true); }

static int compare_names(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

int main(void) {
    DIR* dir = opendir(HOSTILE_DIR);
    if (!dir) {
        fprintf(stderr, "test_hostile_lessons: %s: cannot open (run from the repository root)\n", HOSTILE_DIR);
        return 1;
    }
    char* names[256];
    int n = 0;
    struct dirent* entry;
    while ((entry = readdir(dir)) != NULL && n < 256) {
        size_t length = strlen(entry->d_name);
        if (length > 4 && strcmp(entry->d_name + length - 4, ".lua") == 0) names[n++] = strdup(entry->d_name);
    }
    closedir(dir);
    qsort(names, (size_t)n, sizeof names[0], compare_names);
    // Each attack in the runner; those that `lesson run` takes (not `lesson
    // check`) in the dashboard as well.
    struct CMUnitTest* tests = calloc(2 * (size_t)n, sizeof *tests);
    char** dashboard_names = calloc((size_t)n, sizeof *dashboard_names);
    size_t n_tests = 0;
    for (int i = 0; i < n; i++) {
        tests[n_tests++] = (struct CMUnitTest){names[i], run_in_runner, NULL, NULL, names[i]};
    }
    for (int i = 0; i < n; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%.500s", HOSTILE_DIR, names[i]);
        char* text = test_read_text(path);
        hostile_spec spec;
        parse_spec(text, &spec);
        free(text);
        if (strcmp(spec.command, "run") != 0) continue;
        size_t length = strlen(names[i]) + 16;
        dashboard_names[i] = malloc(length);
        snprintf(dashboard_names[i], length, "%s (dashboard)", names[i]);
        tests[n_tests++] = (struct CMUnitTest){dashboard_names[i], run_in_dashboard, NULL, NULL, names[i]};
    }
    int failed = _cmocka_run_group_tests("hostile_lessons", tests, n_tests, NULL, NULL);
    for (int i = 0; i < n; i++) {
        free(names[i]);
        free(dashboard_names[i]);
    }
    free(dashboard_names);
    free(tests);
    return failed;
}
