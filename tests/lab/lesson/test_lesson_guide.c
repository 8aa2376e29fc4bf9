// Every ```lua example of the instructor's guide (lessons/README.md) runs
// in the lesson sandbox, so an example cannot drift from the API it
// documents: a renamed field, a changed default or a typo in the guide
// fails here (a lesson written from the guide alone once failed on
// `tail_waste`, renamed two weeks before).
//
// A comment line right before a block says how to run it:
//   (none)                            a fragment: run after the preamble below, to the end
//   <!-- example: lesson -->          a whole lesson, run as it is; no check may FAIL
//   <!-- example: continues -->       appended to the block before it (the tutorial's steps)
//   <!-- example: declaration -->     a lab.lesson{} line: read as a lesson's declaration
//   <!-- example: fails "TEXT" -->    a fragment that must stop with an error holding TEXT
//   <!-- example: warns "TEXT" -->    a fragment that must run and warn with TEXT
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "lab/lesson/lesson.h"
#include "tests/test_support.h"

#define GUIDE_PATH "lessons/README.md"

typedef enum example_kind {
    EXAMPLE_FRAGMENT,
    EXAMPLE_LESSON,
    EXAMPLE_CONTINUES,
    EXAMPLE_DECLARATION,
    EXAMPLE_FAILS,
    EXAMPLE_WARNS,
} example_kind;

typedef struct example {
    example_kind kind;
    char expected[400]; // fails/warns: the text the error or warning must hold
    int line;           // of the ```lua line in the guide
    char* code;         // (malloc'ed) the block's lines
} example;

enum { MAX_EXAMPLES = 128 };

typedef struct guide {
    example examples[MAX_EXAMPLES];
    int n;
} guide;

// What a program's lesson did.
typedef struct outcome {
    int checks, failed_checks;
    char failed[600]; // the first FAIL line's id and evidence
    char warnings[1000];
} outcome;

// Names every variable the guide's fragments use without defining: one
// engine that has run two steps (so it has a record, logits and blocks),
// the tiny model, a system prompt, calibration inputs (tiny's dim is 64)
// and timings for lab.median and lab.ratio_interval.
static const char PREAMBLE[] =
    "local model = lab.model('tiny')\n"
    "local e = lab.engine{model = model, block_size = 16, num_blocks = 64}\n"
    "local system_prompt = 'You are a storyteller. '\n"
    "local id = e:add{prefix = system_prompt, prompt = 'Once upon a time', max_tokens = 8}\n"
    "e:step() e:step()\n"
    "local r = e:record()\n"
    "local my_inputs = {}\n"
    "for i = 1, 8 do local x = {} for j = 1, 64 do x[j] = math.sin(i * j) end my_inputs[i] = x end\n"
    "local step_times = {0.012, 0.010, 0.011}\n"
    "local int4_times = {0.80, 0.82, 0.79, 0.81, 0.80}\n"
    "local fp16_times = {1.00, 1.01, 0.99, 1.02, 1.00}\n";

static void on_check(void* user, const lesson_check_result* r) {
    outcome* o = user;
    // The placeholder claim of a fragment that checks nothing is reported
    // unchecked at the end; that says nothing about the example.
    if (strcmp(r->id, "example") == 0) return;
    o->checks++;
    if (r->outcome == CHECK_FAIL) {
        if (o->failed_checks == 0) snprintf(o->failed, sizeof o->failed, "FAIL %s: %s", r->id, r->evidence);
        o->failed_checks++;
    }
}

static void on_warning(void* user, const char* text) {
    outcome* o = user;
    size_t used = strlen(o->warnings);
    snprintf(o->warnings + used, sizeof o->warnings - used, "%s\n", text);
}

// "<!-- example: WORD "TEXT" -->" -> kind and TEXT; false for another line.
static bool read_marker(const char* line, size_t length, example* ex) {
    static const char open[] = "<!-- example: ";
    if (length < sizeof open || strncmp(line, open, sizeof open - 1) != 0) return false;
    char text[600];
    snprintf(text, sizeof text, "%.*s", (int)(length - (sizeof open - 1)), line + sizeof open - 1);
    static const struct {
        const char* word;
        example_kind kind;
    } words[] = {{"lesson", EXAMPLE_LESSON},
                 {"continues", EXAMPLE_CONTINUES},
                 {"declaration", EXAMPLE_DECLARATION},
                 {"fails", EXAMPLE_FAILS},
                 {"warns", EXAMPLE_WARNS}};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t n = strlen(words[i].word);
        if (strncmp(text, words[i].word, n) != 0 || (text[n] != ' ' && text[n] != '\0')) continue;
        ex->kind = words[i].kind;
        if (ex->kind == EXAMPLE_FAILS || ex->kind == EXAMPLE_WARNS) {
            const char* first = strchr(text + n, '"');
            const char* last = strrchr(text + n, '"');
            if (!first || last == first) fail_msg("%s: marker `%s` needs \"TEXT\"", GUIDE_PATH, text);
            snprintf(ex->expected, sizeof ex->expected, "%.*s", (int)(last - first - 1), first + 1);
        }
        return true;
    }
    fail_msg("%s: unknown marker `%.*s` (lesson, continues, declaration, fails \"TEXT\" or warns \"TEXT\")", GUIDE_PATH,
             (int)length, line);
    return false;
}

// Splits the guide into its lua blocks, each with the marker above it.
static void read_guide(const char* text, guide* g) {
    g->n = 0;
    const char* line = text;
    const char* previous = NULL; // the last non-blank line before this one
    size_t previous_length = 0;
    int number = 1;
    while (*line) {
        size_t length = strcspn(line, "\n");
        const char* next = line + length + (line[length] == '\n');
        if (length == 6 && strncmp(line, "```lua", 6) == 0) {
            assert_true(g->n < MAX_EXAMPLES);
            example* ex = &g->examples[g->n++];
            memset(ex, 0, sizeof *ex);
            ex->kind = EXAMPLE_FRAGMENT;
            ex->line = number;
            if (previous) read_marker(previous, previous_length, ex);
            const char* body = next;
            const char* end = body;
            int lines = 0;
            while (*end && strncmp(end, "```", 3) != 0) {
                end += strcspn(end, "\n");
                end += *end == '\n';
                lines++;
            }
            if (!*end) fail_msg("%s:%d: the ```lua block never closes", GUIDE_PATH, number);
            ex->code = strndup(body, (size_t)(end - body));
            assert_non_null(ex->code);
            number += lines + 1;
            line = end;
            previous = NULL;
            continue;
        }
        if (length > 0) {
            previous = line;
            previous_length = length;
        }
        line = next;
        number++;
    }
}

// The claim ids a fragment checks (`id = "x"` in it), as a Lua list.
static void claims_of(const char* code, char* out, size_t capacity) {
    size_t used = 0;
    out[0] = '\0';
    for (const char* at = strstr(code, "id = \""); at; at = strstr(at + 1, "id = \"")) {
        if (at > code && (at[-1] == '_' || (at[-1] >= 'a' && at[-1] <= 'z'))) continue; // request_id = ...
        const char* start = at + 6;
        size_t n = strcspn(start, "\"");
        used += (size_t)snprintf(out + used, capacity - used, "%s'%.*s'", used ? ", " : "", (int)n, start);
    }
    if (!used) snprintf(out, capacity, "'example'");
}

// Runs one program (a block and the blocks that continue it) and says
// what went wrong, or leaves problem empty.
static void run_program(const guide* g, int first, int last, char* problem, size_t capacity) {
    const example* head = &g->examples[first];
    problem[0] = '\0';
    size_t size = sizeof PREAMBLE + 4096;
    for (int i = first; i <= last; i++)
        size += strlen(g->examples[i].code) + 1;
    char* source = malloc(size);
    assert_non_null(source);
    size_t used = 0;
    if (head->kind != EXAMPLE_LESSON && head->kind != EXAMPLE_DECLARATION) {
        char claims[512];
        claims_of(head->code, claims, sizeof claims);
        used += (size_t)snprintf(source, size, "lab.lesson{title = 'guide example, line %d', claims = {%s}}\n%s",
                                 head->line, claims, PREAMBLE);
    }
    for (int i = first; i <= last; i++)
        used += (size_t)snprintf(source + used, size - used, "%s", g->examples[i].code);
    char path[512];
    snprintf(path, sizeof path, "%s/guide_line_%d.lua", test_scratch_dir(), head->line);
    assert_true(test_write_file(path, source, used));
    free(source);

    if (head->kind == EXAMPLE_DECLARATION) {
        lesson_info info;
        error_info err = {{0}};
        if (lesson_read_info(path, &info, &err))
            snprintf(problem, capacity, "not a declaration: %s", err.message);
        else if (info.n_claims == 0)
            snprintf(problem, capacity, "declares no claim");
        return;
    }
    outcome o;
    memset(&o, 0, sizeof o);
    lesson_options options = lesson_options_default();
    options.on_check = on_check;
    options.user = &o;
    options.on_warning = on_warning;
    options.warning_user = &o;
    lesson* l = NULL;
    error_info err = {{0}};
    if (lesson_open(&l, path, &options, &err)) {
        snprintf(problem, capacity, "does not load: %s", err.message);
        return;
    }
    lesson_status status;
    while ((status = lesson_resume(l)) == LESSON_PAUSED) {
    }
    char error[1000];
    snprintf(error, sizeof error, "%s", lesson_error(l));
    lesson_close(l);

    if (head->kind == EXAMPLE_FAILS) {
        if (status != LESSON_FAILED)
            snprintf(problem, capacity, "ran to its end, but the guide says it fails with \"%s\"", head->expected);
        else if (!strstr(error, head->expected))
            snprintf(problem, capacity, "failed with \"%s\", but the guide says \"%s\"", error, head->expected);
        return;
    }
    if (status != LESSON_DONE)
        snprintf(problem, capacity, "stopped: %s", error);
    else if (o.failed_checks)
        snprintf(problem, capacity, "%s", o.failed);
    else if (head->kind == EXAMPLE_LESSON && o.checks == 0)
        snprintf(problem, capacity, "a whole lesson that checks nothing");
    else if (head->kind == EXAMPLE_WARNS && !strstr(o.warnings, head->expected))
        snprintf(problem, capacity, "no warning \"%s\" (warned: \"%s\")", head->expected, o.warnings);
    else if (head->kind != EXAMPLE_WARNS && o.warnings[0])
        snprintf(problem, capacity, "warned: %s", o.warnings);
}

static void free_guide(guide* g) {
    for (int i = 0; i < g->n; i++)
        free(g->examples[i].code);
}

static void test_every_guide_example_runs(void** state) {
    (void)state;
    char* text = test_read_text(GUIDE_PATH);
    assert_true(strlen(text) > 1000); // the guide is there (run from the repository root)
    guide* g = calloc(1, sizeof *g);
    assert_non_null(g);
    read_guide(text, g);
    free(text);
    // The guide has an example for every function: fewer than 30 blocks
    // means the reader lost them, not that the guide shrank.
    if (g->n < 30) fail_msg("%s: found only %d ```lua blocks", GUIDE_PATH, g->n);
    int counts[6] = {0};
    for (int i = 0; i < g->n; i++)
        counts[g->examples[i].kind]++;
    // Each kind of marker is used, so each branch of this test is exercised.
    for (int k = 0; k < 6; k++)
        if (counts[k] == 0) fail_msg("%s: no example of marker kind %d", GUIDE_PATH, k);

    int programs = 0, problems = 0;
    for (int first = 0; first < g->n;) {
        if (g->examples[first].kind == EXAMPLE_CONTINUES)
            fail_msg("%s:%d: 'continues' with no block before it to continue", GUIDE_PATH, g->examples[first].line);
        int last = first;
        while (last + 1 < g->n && g->examples[last + 1].kind == EXAMPLE_CONTINUES)
            last++;
        // The guide's checkpoint example names ../shared/models (the
        // reference files beside the clone), as the other tests do.
        bool needs_stories = false;
        for (int i = first; i <= last; i++)
            needs_stories = needs_stories || strstr(g->examples[i].code, "stories260K");
        struct stat st;
        if (needs_stories && stat("../shared/models/stories260K.bin", &st) != 0) {
            test_report_missing_shared("stories260K.bin");
        } else {
            char problem[1600];
            run_program(g, first, last, problem, sizeof problem);
            programs++;
            if (problem[0]) {
                problems++;
                print_error("%s:%d: the example %s\n", GUIDE_PATH, g->examples[first].line, problem);
            }
        }
        first = last + 1;
    }
    print_message("%d examples in %d programs; %d broken\n", g->n, programs, problems);
    free_guide(g);
    free(g);
    assert_int_equal(problems, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_guide_example_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
