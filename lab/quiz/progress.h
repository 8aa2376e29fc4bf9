// quiz_progress: Leitner boxes per item, kept in a small text file.
//
// File ($XDG_DATA_HOME/servelab/progress, default ~/.local/share/servelab/progress):
//   servelab-quiz-progress 1
//   # id box correct wrong last_seen
//   tf1 2 3 1 1717171717
// one line per item (a bank id or a drill id), box 0..5, counts of right and
// wrong answers (each 0..INT_MAX), last_seen in Unix seconds (0 to the end
// of year 9999). The file is written whole to a temporary file in the same
// folder, flushed to disk (fsync) and renamed over the old one, so a crash
// leaves either the old or the new file, never a torn one. A file that is
// not a progress file at all (or is torn) is moved aside, not overwritten;
// a bad record line is skipped and reported, and the good records kept.
//
// Leitner: an item never answered is in box 0 and due now. A right answer
// moves it up one box (to 5 at most), a wrong one back to box 1. Box k is
// due again QUIZ_BOX_INTERVALS[k] after it was last seen: box 1 at once,
// then 1, 3, 7 and 16 days.
#ifndef SERVELAB_QUIZ_PROGRESS_H
#define SERVELAB_QUIZ_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

enum { QUIZ_MAX_BOX = 5 };

// The latest last_seen a file may hold: 9999-12-31 23:59:59 UTC. Anything
// later is a corrupt number, and bounding it keeps last_seen + an interval
// far from overflow.
#define QUIZ_LAST_SEEN_MAX INT64_C(253402300799)

typedef struct quiz_record {
    char id[32];
    int box; // 0 (never answered) .. QUIZ_MAX_BOX
    int n_correct;
    int n_wrong;
    int64_t last_seen; // Unix seconds of the last answer
} quiz_record;

typedef struct quiz_progress {
    quiz_record* records; // (n_records), in first-answered order
    int n_records;
    int capacity;
} quiz_progress;

void quiz_progress_free(quiz_progress* p);

// Seconds after last_seen when box `box` is due again.
int64_t quiz_box_interval_seconds(int box);
// True when the item (NULL: never answered) is due at `now`.
bool quiz_record_due(const quiz_record* r, int64_t now);

const quiz_record* quiz_progress_find(const quiz_progress* p, const char* id);
// Records one answer: counts, box, last_seen = now. 0, or -1 with err (out of memory, bad id).
int quiz_progress_record(quiz_progress* p, const char* id, bool correct, int64_t now, error_info* err);

// The record lines a lenient parse skipped: how many, and the first of
// them (its line number in the file and what was wrong, naming the field),
// so that one warning can point at it.
typedef struct quiz_progress_skipped {
    int n_lines;
    int first_line;          // 1-based (the header is line 1); 0 when none was skipped
    char first_problem[320]; // e.g. "correct '99999999999' is out of range (0..2147483647)"
} quiz_progress_skipped;

// The file text <-> records. The first line must be the header, the text
// must end with a newline (else it is torn) and hold no NUL byte; otherwise
// it is an error and nothing is parsed. Every other line must be blank, a
// comment or a well-formed record: 5 fields, every number in range (box
// 0..QUIZ_MAX_BOX, counts 0..INT_MAX, last_seen 0..QUIZ_LAST_SEEN_MAX), an
// id not seen before. With `skipped` NULL the parse is strict and the first
// bad line is an error naming its line number and field; otherwise bad
// lines are skipped, counted in `skipped`, and the good records kept.
int quiz_progress_parse(const char* text, size_t length, quiz_progress* out, quiz_progress_skipped* skipped,
                        error_info* err);
int quiz_progress_write(const quiz_progress* p, int fd, error_info* err);

// $XDG_DATA_HOME/servelab/progress (when XDG_DATA_HOME is an absolute path),
// else $HOME/.local/share/servelab/progress. 0, or -1 with err.
int quiz_progress_default_path(char* out, int capacity, error_info* err);

// Reads `path`. A missing file gives empty progress. A file that does not
// parse at all (torn, or not a progress file) is renamed to
// <path>.corrupt-<YYYYmmdd-HHMMSS> and empty progress is returned, with
// `warning` saying which file, what was wrong and where it went. Bad record
// lines are skipped and the good records returned; a copy of the file as it
// was is written to <path>.corrupt-<...> (the next save drops those lines)
// and `warning` is one line: "<path>:<line>: <field and problem>; ...".
// -1 with err only when the file exists but cannot be read or moved (a
// folder at `path` says "<path> is a directory").
int quiz_progress_load(const char* path, quiz_progress* out, char* warning, int warning_capacity, error_info* err);

// Writes atomically (temporary file in the same folder, fsync, rename),
// creating the folder if needed. 0, or -1 with err (the old file is intact).
int quiz_progress_save(const char* path, const quiz_progress* p, error_info* err);

#endif
