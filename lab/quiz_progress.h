// quiz_progress: Leitner boxes per item, kept in a small text file.
//
// File ($XDG_DATA_HOME/servelab/progress, default ~/.local/share/servelab/progress):
//   servelab-quiz-progress 1
//   # id box correct wrong last_seen
//   tf1 2 3 1 1717171717
// one line per item (a bank id or a drill id), box 0..5, counts of right and
// wrong answers, last_seen in Unix seconds. The file is written whole to a
// temporary file in the same folder, flushed to disk (fsync) and renamed
// over the old one, so a crash leaves either the old or the new file, never
// a torn one. A file that does not parse is moved aside, not overwritten.
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

#include "engine/error.h"

enum { QUIZ_MAX_BOX = 5 };

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

// The file text <-> records. Parsing is strict: the first line must be the
// header, every other line a comment or a well-formed record; any other
// line is an error naming its line number. Duplicate ids are an error.
int quiz_progress_parse(const char* text, size_t length, quiz_progress* out, error_info* err);
int quiz_progress_write(const quiz_progress* p, int fd, error_info* err);

// $XDG_DATA_HOME/servelab/progress (when XDG_DATA_HOME is an absolute path),
// else $HOME/.local/share/servelab/progress. 0, or -1 with err.
int quiz_progress_default_path(char* out, int capacity, error_info* err);

// Reads `path`. A missing file gives empty progress. A file that does not
// parse (corrupt, or not a progress file) is renamed to
// <path>.corrupt-<YYYYmmdd-HHMMSS> and empty progress is returned, with
// `warning` saying which file, what was wrong and where it went. -1 with
// err only when the file exists but cannot be read or moved.
int quiz_progress_load(const char* path, quiz_progress* out, char* warning, int warning_capacity, error_info* err);

// Writes atomically (temporary file in the same folder, fsync, rename),
// creating the folder if needed. 0, or -1 with err (the old file is intact).
int quiz_progress_save(const char* path, const quiz_progress* p, error_info* err);

#endif
