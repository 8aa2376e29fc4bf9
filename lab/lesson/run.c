// lesson_run: running a lesson headless (the check lines and the summary),
// and the quiz's "prove it" (the lesson that declares a claim, run for it).
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "lab/lesson/lesson.h"

void lesson_print_check(FILE* out, const lesson_check_result* r) {
    static const char* const words[] = {"PASS", "DISAGREE", "FAIL", "UNDECIDED"};
    // The leading word is for tools; the words after the claim are for the
    // student. "PASS tf3 (bank: false) ..." read to newcomers and reviewers
    // alike as if a false claim had passed, so the line now says what the
    // claim is: "FALSE, as the bank says".
    const char* expected = r->bank_answer ? "TRUE" : "FALSE";
    const char* measured = r->verdict ? "TRUE" : "FALSE";
    const char* whose = r->beyond_bank ? "the lesson expects" : "the bank says";
    const char* beyond = r->beyond_bank ? " (a claim beyond the bank: the lesson's own)" : "";
    fprintf(out, "%s %s \"%s\": ", words[r->outcome], r->id, r->claim);
    if (r->outcome == CHECK_PASS)
        fprintf(out, "%s, as %s%s -- measured: %s", expected, whose, beyond, r->evidence);
    else if (r->outcome == CHECK_DISAGREE)
        fprintf(out, "%s here, but %s %s%s -- measured: %s", measured, whose, expected, beyond, r->evidence);
    else if (r->outcome == CHECK_UNDECIDED)
        fprintf(out,
                "not decided, too noisy to tell (%s %s; neither a pass nor a failure: run it again on a quieter "
                "machine) -- measured: %s",
                whose, expected, r->evidence);
    else if (r->beyond_bank)
        fprintf(out, "not judged, the check itself failed -- %s", r->evidence);
    else
        fprintf(out, "not judged, the check itself failed (the bank says %s) -- %s", expected, r->evidence);
    if (r->note && r->note[0]) fprintf(out, " -- note: %s", r->note);
    if (r->running) {
        char running[512], declared[512];
        fault_set_describe(r->running, running, sizeof running);
        fault_set_describe(r->running & r->breaks_with, declared, sizeof declared);
        if (r->outcome == CHECK_UNDECIDED)
            fprintf(out, " [undecided under %s: not turned, not failed]", running);
        else if (r->outcome == CHECK_FAIL) // a guard, an error or a crash: no verdict, so no detection
            fprintf(out, " [stopped under %s, not detected: only a DISAGREE counts as turned]", running);
        else if (r->outcome != CHECK_PASS && declared[0])
            fprintf(out, " [turned by %s, as its breaks_with declares]", declared);
        else if (r->outcome != CHECK_PASS)
            fprintf(out, " [turned under %s, which its breaks_with does not declare]", running);
        else if (declared[0])
            fprintf(out, " [STILL PASS under %s, which its breaks_with declares: this check cannot see that bug]",
                    declared);
        else
            fprintf(out, " [unchanged under %s]", running);
    }
    fputc('\n', out);
    fflush(out);
}

void lesson_print_summary(FILE* out, int passed, int failed, int undecided) {
    if (undecided > 0)
        fprintf(out, "%d passed, %d failed, %d undecided (too noisy to decide: not failures)\n", passed, failed,
                undecided);
    else
        fprintf(out, "%d passed, %d failed\n", passed, failed);
}

static void print_check(void* user, const lesson_check_result* result) { lesson_print_check(user, result); }

static void print_warning(void* user, const char* text) {
    fprintf(user, "%s\n", text);
    fflush(user);
}

int lesson_run_file(const char* path, const lesson_options* options, void (*on_pause)(void* user), void* pause_user,
                    FILE* out, FILE* errors, bool summary) {
    lesson_options with_warnings = options ? *options : lesson_options_default();
    if (!with_warnings.on_warning) {
        with_warnings.on_warning = print_warning; // headless: the author still sees a renamed field
        with_warnings.warning_user = errors;
    }
    options = &with_warnings;
    lesson* l = NULL;
    error_info err = {{0}};
    if (lesson_open(&l, path, options, &err)) {
        fprintf(errors, "%s\n", err.message);
        if (summary) fprintf(out, "0 passed, 1 failed\n");
        return 1;
    }
    lesson_status status;
    while ((status = lesson_resume(l)) == LESSON_PAUSED)
        if (on_pause) on_pause(pause_user);
    if (status == LESSON_FAILED) fprintf(errors, "%s\n", lesson_error(l));
    int passed = 0, failed = 0;
    lesson_counts(l, &passed, &failed);
    int undecided = lesson_undecided(l);
    lesson_close(l);
    if (status == LESSON_FAILED && passed + failed + undecided == 0) failed = 1; // failed before any check
    if (summary) lesson_print_summary(out, passed, failed, undecided);
    return failed == 0 && status == LESSON_DONE ? 0 : 1;
}

static int run_headless(const char* path, const lesson_options* given, FILE* out, FILE* errors, bool summary) {
    lesson_options options = *given;
    options.interactive = false; // lab.pause() is a no-op
    options.on_check = print_check;
    options.user = out;
    return lesson_run_file(path, &options, NULL, NULL, out, errors, summary);
}

int lesson_run_headless(const char* path, const lesson_options* options, FILE* out, FILE* errors) {
    return run_headless(path, options, out, errors, true);
}

static int compare_names(const void* a, const void* b) { return strcmp((const char*)a, (const char*)b); }

int lesson_list_folder(const char* folder, lesson_file_name* names, int capacity) {
    DIR* dir = opendir(folder);
    if (!dir) return -1;
    int n = 0;
    struct dirent* entry;
    while ((entry = readdir(dir)) != NULL && n < capacity) {
        size_t length = strlen(entry->d_name);
        if (length > 4 && length < sizeof names[0] && strcmp(entry->d_name + length - 4, ".lua") == 0)
            snprintf(names[n++], sizeof names[0], "%s", entry->d_name);
    }
    closedir(dir);
    qsort(names, (size_t)n, sizeof names[0], compare_names);
    return n;
}

int lesson_prove_claim(const char* lessons_dir, const char* claim_id, const volatile sig_atomic_t* stop_flag, FILE* out,
                       error_info* err) {
    static lesson_file_name names[LESSON_MAX_FILES];
    int n = lesson_list_folder(lessons_dir, names, LESSON_MAX_FILES);
    if (n < 0) return error_set(err, "%s: cannot open the lessons folder", lessons_dir);
    char found[1400] = "";
    for (int i = 0; i < n && !found[0]; i++) {
        char path[1400];
        snprintf(path, sizeof path, "%.1000s/%.255s", lessons_dir, names[i]);
        lesson_info info;
        error_info ignored = {{0}};
        if (lesson_read_info(path, &info, &ignored)) continue;
        for (int k = 0; k < info.n_claims; k++)
            if (strcmp(info.claims[k], claim_id) == 0) snprintf(found, sizeof found, "%s", path);
    }
    if (!found[0]) return error_set(err, "no lesson in %s declares claim '%s'", lessons_dir, claim_id);
    lesson_options options = lesson_options_default();
    options.only_claim = claim_id;
    // The whole lesson runs for its one claim: lesson 06 needs about 5 s of
    // CPU, and over 60 s under the sanitizers.
    options.time_limit_s = 300.0;
    options.stop_flag = stop_flag;
    return run_headless(found, &options, out, stderr, false);
}
