// fuzz_quiz_progress: the quiz progress file reader (lab/quiz/progress.c).
//
// The input is the whole progress file, written into a fresh folder under
// /dev/shm and read with quiz_progress_load (which parses it, and moves a
// bad file aside or copies one with skipped lines). Whatever it returns must
// hold in range records with distinct ids, and survive a round trip: saved
// with quiz_progress_save and loaded again it must give the same records
// and no warning. The folder is removed after each run. Errors and warnings
// are expected; a crash, a leak, a failed round trip or a sanitizer report
// is a bug.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "lab/quiz/progress.h"
#include "tests/fuzz/support.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static void check_records(const quiz_progress* p) {
    for (int i = 0; i < p->n_records; i++) {
        const quiz_record* r = &p->records[i];
        FUZZ_CHECK(memchr(r->id, '\0', sizeof r->id) && r->id[0] != '\0');
        FUZZ_CHECK(r->box >= 0 && r->box <= QUIZ_MAX_BOX && r->n_correct >= 0 && r->n_wrong >= 0 && r->last_seen >= 0);
        FUZZ_CHECK(quiz_progress_find(p, r->id) == r); // ids are distinct
        (void)quiz_record_due(r, r->last_seen);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    char dir[256], path[320], copy[320];
    if (fuzz_make_temp_dir(dir, sizeof dir, "fuzz-progress") != 0) return 0;
    snprintf(path, sizeof path, "%s/progress", dir);
    snprintf(copy, sizeof copy, "%s/saved/progress", dir);
    if (fuzz_write_file(path, data, size) == 0) {
        quiz_progress p;
        char warning[2048];
        error_info err = {{0}};
        if (quiz_progress_load(path, &p, warning, sizeof warning, &err) == 0) {
            check_records(&p);
            FUZZ_CHECK(quiz_progress_save(copy, &p, &err) == 0);
            quiz_progress again;
            FUZZ_CHECK(quiz_progress_load(copy, &again, warning, sizeof warning, &err) == 0);
            FUZZ_CHECK(warning[0] == '\0' && again.n_records == p.n_records);
            for (int i = 0; i < p.n_records; i++) {
                const quiz_record *a = &p.records[i], *b = &again.records[i];
                FUZZ_CHECK(strcmp(a->id, b->id) == 0 && a->box == b->box && a->n_correct == b->n_correct &&
                           a->n_wrong == b->n_wrong && a->last_seen == b->last_seen);
            }
            quiz_progress_free(&again);
            quiz_progress_free(&p);
        } else {
            FUZZ_CHECK(err.message[0] != '\0'); // a failure says why
        }
    }
    fuzz_remove_tree(dir);
    return 0;
}
