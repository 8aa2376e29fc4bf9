// lesson_faults: the fault matrix (lab/lesson/lesson.h). A lesson's claim is only
// checked if its verdict turns when the engine has the bug the claim is
// about. Every lab.check declares those bugs (breaks_with); this runs the
// lesson once with none, where every claim must PASS, then once per
// declared fault, where every claim declaring it must turn.
//
// Turned means detected: the claim measured the bug and said DISAGREE, with
// its evidence. A FAIL is not a detection: a guard inside the measurement
// (an error() on numbers that fit neither answer), a Lua error that ended
// the lesson before the check, or a crash stopped it, and nothing shows
// the verdict itself would have turned. Such a pair is listed as stopped,
// not counted as turned, and a claim that none of its faults turns with a
// DISAGREE is a problem.
//
// Each run is a child process: a fault is a real bug, and a bug that
// crashed the engine must be reported as such, not take the runner down.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lab/lesson/lesson.h"

enum { MATRIX_MAX_CLAIMS = 64, MATRIX_EVIDENCE_BYTES = 400 };

typedef struct matrix_claim {
    char id[16];
    check_outcome outcome;
    fault_set breaks_with;
    char evidence[MATRIX_EVIDENCE_BYTES]; // the start of the evidence (the full line is in `lesson run`)
} matrix_claim;

typedef struct matrix_run {
    matrix_claim claims[MATRIX_MAX_CLAIMS]; // (n_claims) in the order checked
    int n_claims;
    char problem[300]; // "" or why the run itself broke (a crash, a signal)
} matrix_run;

// ---- the child: run the lesson, one record per check down a pipe ---------------------

typedef struct child_sink {
    FILE* pipe;
} child_sink;

// One line per check: outcome, id, breaks_with (hex), evidence; tabs and
// line breaks in the evidence become spaces.
static void write_record(void* user, const lesson_check_result* r) {
    child_sink* sink = user;
    fprintf(sink->pipe, "%d\t%s\t%x\t", (int)r->outcome, r->id, (unsigned)r->breaks_with);
    for (const char* c = r->evidence; *c; c++) fputc(*c == '\t' || *c == '\n' || *c == '\r' ? ' ' : *c, sink->pipe);
    fputc('\n', sink->pipe);
    fflush(sink->pipe);
}

static void ignore_text(void* user, const char* text) {
    (void)user;
    (void)text;
}

static void run_child(const char* path, const lesson_options* base, fault_set faults, int fd) {
    child_sink sink = {fdopen(fd, "w")};
    if (!sink.pipe) _exit(3);
    lesson_options options = *base;
    options.interactive = false;
    options.faults = faults;
    options.on_say = ignore_text;
    options.on_check = write_record;
    options.user = &sink;
    lesson* l = NULL;
    error_info err = {{0}};
    if (lesson_open(&l, path, &options, &err)) {
        fprintf(stderr, "%s\n", err.message);
        _exit(4);
    }
    while (lesson_resume(l) == LESSON_PAUSED) {
    }
    lesson_close(l);
    fclose(sink.pipe);
    _exit(0);
}

// ---- the parent ---------------------------------------------------------------------

static void parse_record(char* line, matrix_run* run) {
    if (run->n_claims >= MATRIX_MAX_CLAIMS) return;
    matrix_claim* c = &run->claims[run->n_claims];
    char* fields[4] = {line, NULL, NULL, NULL};
    for (int i = 1; i < 4; i++) {
        char* tab = fields[i - 1] ? strchr(fields[i - 1], '\t') : NULL;
        if (!tab) return;
        *tab = '\0';
        fields[i] = tab + 1;
    }
    fields[3][strcspn(fields[3], "\n")] = '\0';
    int outcome = atoi(fields[0]);
    c->outcome = outcome == CHECK_PASS        ? CHECK_PASS
                 : outcome == CHECK_DISAGREE   ? CHECK_DISAGREE
                 : outcome == CHECK_UNDECIDED ? CHECK_UNDECIDED
                                               : CHECK_FAIL;
    snprintf(c->id, sizeof c->id, "%s", fields[1]);
    c->breaks_with = (fault_set)strtoul(fields[2], NULL, 16);
    snprintf(c->evidence, sizeof c->evidence, "%s", fields[3]);
    run->n_claims++;
}

static int run_lesson(const char* path, const lesson_options* base, fault_set faults, matrix_run* run) {
    memset(run, 0, sizeof *run);
    int fds[2];
    if (pipe(fds) != 0) return snprintf(run->problem, sizeof run->problem, "pipe: %s", strerror(errno)), -1;
    fflush(NULL);
    pid_t child = fork();
    if (child < 0) {
        close(fds[0]);
        close(fds[1]);
        snprintf(run->problem, sizeof run->problem, "fork: %s", strerror(errno));
        return -1;
    }
    if (child == 0) {
        close(fds[0]);
        run_child(path, base, faults, fds[1]);
    }
    close(fds[1]);
    FILE* in = fdopen(fds[0], "r");
    char* line = NULL;
    size_t capacity = 0;
    while (in && getline(&line, &capacity, in) > 0) parse_record(line, run);
    free(line);
    if (in) fclose(in);
    else close(fds[0]);
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(status))
        snprintf(run->problem, sizeof run->problem, "the lesson's process died of %s", strsignal(WTERMSIG(status)));
    else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        snprintf(run->problem, sizeof run->problem, "the lesson could not be opened (exit %d)", WEXITSTATUS(status));
    return run->problem[0] ? -1 : 0;
}

static const char* outcome_word(check_outcome outcome) {
    return outcome == CHECK_PASS       ? "PASS"
           : outcome == CHECK_DISAGREE  ? "DISAGREE"
           : outcome == CHECK_UNDECIDED ? "UNDECIDED"
                                        : "FAIL";
}

// Why a declared pair that came out FAIL was stopped: by the crash of the
// lesson's process, by an error that ended the lesson before the check
// (lesson_report_unchecked's "never checked: ..."), or by a guard inside
// the check (measure raised an error, or its arguments were wrong).
static const char* stopped_by(bool crashed, const char* evidence) {
    if (crashed) return "stopped by a crash, not detected";
    if (strncmp(evidence, "never checked:", 14) == 0 || strcmp(evidence, "never reported") == 0)
        return "stopped by an error before its check, not detected";
    return "stopped by a guard, not detected";
}

static const matrix_claim* find_claim(const matrix_run* run, const char* id) {
    for (int i = 0; i < run->n_claims; i++)
        if (strcmp(run->claims[i].id, id) == 0) return &run->claims[i];
    return NULL;
}

int lesson_fault_table(const char* const* paths, int n_paths, const lesson_options* options, FILE* out, FILE* errors) {
    int status = 0;
    fprintf(out, "| claim | lesson | faults that must turn it (`breaks_with`) |\n|---|---|---|\n");
    for (int p = 0; p < n_paths; p++) {
        matrix_run clean;
        if (run_lesson(paths[p], options, 0, &clean)) {
            fprintf(errors, "%s: %s\n", paths[p], clean.problem);
            status = 1;
        }
        const char* base = strrchr(paths[p], '/') ? strrchr(paths[p], '/') + 1 : paths[p];
        for (int i = 0; i < clean.n_claims; i++) {
            if (clean.claims[i].outcome == CHECK_FAIL && !clean.claims[i].breaks_with) {
                // Never reached its lab.check: its declaration is unknown, not empty.
                fprintf(errors, "%s: %s: %s\n", paths[p], clean.claims[i].id, clean.claims[i].evidence);
                status = 1;
            }
            char faults[512];
            fault_set_describe(clean.claims[i].breaks_with, faults, sizeof faults);
            for (char* comma = strchr(faults, ','); comma; comma = strchr(comma + 1, ',')) *comma = ' ';
            fprintf(out, "| %s | %s | %s |\n", clean.claims[i].id, base, faults[0] ? faults : "(none declared)");
        }
    }
    return status;
}

// Prints one line per (claim, fault) pair and a summary; returns 0 when
// every claim passed clean, declares a fault, and turned (DISAGREE) under
// each. UNDECIDED (a timing too noisy to decide) is neither: clean, its
// pairs are not judged this run; under a fault, the pair is not turned and
// not a problem. Both are counted in the summary, so a check that only
// ever says UNDECIDED shows. A pair stopped by a guard, an error or a
// crash (FAIL) is not turned either: it is a problem when no fault of the
// claim turns it to DISAGREE, and is counted at the summary's end.
int lesson_fault_matrix(const char* const* paths, int n_paths, const lesson_options* options, bool undeclared,
                        FILE* out, FILE* errors) {
    int n_claims = 0, n_pairs = 0, n_turned = 0, n_problems = 0, n_extra = 0, n_undecided = 0, n_stopped = 0;
    for (int p = 0; p < n_paths; p++) {
        matrix_run clean;
        if (run_lesson(paths[p], options, 0, &clean)) {
            fprintf(errors, "%s: no fault: %s\n", paths[p], clean.problem);
            n_problems++;
        }
        fault_set declared = 0;
        for (int i = 0; i < clean.n_claims; i++) {
            const matrix_claim* c = &clean.claims[i];
            n_claims++;
            declared |= c->breaks_with;
            if (c->outcome == CHECK_UNDECIDED) {
                fprintf(out, "%s: %s is UNDECIDED with no fault (its faults are not judged this run): %s\n", paths[p],
                        c->id, c->evidence);
                n_undecided++;
            } else if (c->outcome != CHECK_PASS) {
                fprintf(out, "%s: %s is %s with no fault: %s\n", paths[p], c->id, outcome_word(c->outcome), c->evidence);
                n_problems++;
            }
            if (!c->breaks_with) {
                fprintf(out, "%s: %s declares no fault (breaks_with): nothing shows its check can fail\n", paths[p], c->id);
                n_problems++;
            }
        }
        fflush(out);
        // Per claim of this lesson: pairs detected (DISAGREE), stopped (FAIL), undecided.
        int detected[MATRIX_MAX_CLAIMS] = {0}, stopped[MATRIX_MAX_CLAIMS] = {0}, unjudged[MATRIX_MAX_CLAIMS] = {0};
        for (int f = 0; f < FAULT_COUNT; f++) {
            fault_set fault = (fault_set)1 << f;
            if (!(declared & fault) && !undeclared) continue;
            matrix_run faulty;
            bool broke = run_lesson(paths[p], options, fault, &faulty) != 0;
            for (int i = 0; i < clean.n_claims; i++) {
                const matrix_claim* c = &clean.claims[i];
                const matrix_claim* under = find_claim(&faulty, c->id);
                check_outcome outcome = under ? under->outcome : CHECK_FAIL;
                const char* evidence = under ? under->evidence : "never reported";
                if ((c->breaks_with & fault) && (c->outcome == CHECK_UNDECIDED || outcome == CHECK_UNDECIDED)) {
                    n_undecided++;
                    unjudged[i]++;
                    fprintf(out, "%-8s %-18s %-24s %s -- %s\n", "undecid.", c->id, fault_name(f), outcome_word(outcome),
                            evidence);
                } else if ((c->breaks_with & fault) && outcome == CHECK_FAIL) {
                    // Not a detection: the check never gave a verdict.
                    n_pairs++;
                    n_stopped++;
                    stopped[i]++;
                    fprintf(out, "%-8s %-18s %-24s %s -- %s: %s%s%s\n", "stopped", c->id, fault_name(f),
                            outcome_word(outcome), stopped_by(broke, evidence), evidence, broke ? " -- " : "",
                            broke ? faulty.problem : "");
                } else if (c->breaks_with & fault) {
                    n_pairs++;
                    bool turned = outcome == CHECK_DISAGREE;
                    n_turned += turned;
                    detected[i] += turned;
                    fprintf(out, "%-8s %-18s %-24s %s -- %s%s%s\n", turned ? "turned" : "STILL", c->id, fault_name(f),
                            outcome_word(outcome), evidence, broke ? " -- " : "", broke ? faulty.problem : "");
                    if (!turned) n_problems++;
                } else if (outcome != CHECK_PASS && outcome != CHECK_UNDECIDED && c->outcome == CHECK_PASS) {
                    n_extra++;
                    fprintf(out, "also     %-18s %-24s %s (not declared) -- %s\n", c->id, fault_name(f), outcome_word(outcome),
                            evidence);
                }
            }
            if (broke) {
                // A fault is a wrong answer, never a crash: that is a defect of the fault.
                fprintf(errors, "%s: under %s: %s\n", paths[p], fault_name(f), faulty.problem);
                n_problems++;
            }
            fflush(out);
        }
        for (int i = 0; i < clean.n_claims; i++) {
            if (!stopped[i] || detected[i] || unjudged[i]) continue;
            fprintf(out, "%s: %s is detected by none of its faults: %d of them stopped it by a guard, an error or a "
                         "crash (FAIL), none turned it to DISAGREE with evidence\n",
                    paths[p], clean.claims[i].id, stopped[i]);
            n_problems++;
        }
        fflush(out);
    }
    fprintf(out, "fault matrix: %d claims in %d lessons; %d of %d declared (claim, fault) pairs turned; %d undeclared turns; "
                 "%d problems; %d undecided (noisy timings: not turned, not failed); %d stopped by a guard, an error or "
                 "a crash (not detected)\n",
            n_claims, n_paths, n_turned, n_pairs, n_extra, n_problems, n_undecided, n_stopped);
    return n_problems == 0 && n_claims > 0 ? 0 : 1;
}
