// progress: one line on stderr that says a long command is alive.
//
// "servelab sim: 12/16 requests finished, 3.1 s: paged (run 1 of 2)" —
// steps done out of steps expected, the wall time so far and what runs, rewritten in place with \r by a
// ticker thread 4 times a second (so the clock moves even inside one long
// step), and erased when the command finishes, before it prints its result.
//
// It is shown only when stderr is a terminal, or when the command was given
// --progress (so a test can check it): a log or a pipe gets nothing from it.
// Every function accepts NULL, which is what progress_start returns when
// the line is not shown, so callers never branch on it.
#ifndef SERVELAB_PROGRESS_H
#define SERVELAB_PROGRESS_H

#include <stdbool.h>

typedef struct progress progress;

// The line is shown when `forced` (--progress) or stderr is a terminal.
bool progress_wanted(bool forced);

// Starts the line: "<what>: ..." (what: "servelab sim"). Returns NULL when
// the line is not wanted, when another line is live (one line at a time:
// the command's own line wins over a model build's inside it), or when the
// ticker cannot start: no line, no harm.
progress* progress_start(const char* what, bool forced);

// What the line says now: `done` of `total` `unit` (total <= 0: unknown,
// then only done is shown), and `detail` ("paged (run 1 of 2)"; may be
// NULL) after the clock. Cheap: the ticker draws it at its next tick.
void progress_set(progress* p, const char* detail, long done, long total, const char* unit);

// Erases the line and holds the ticker, so the caller can print to the
// terminal (stdout or stderr) without the line in the middle of its text;
// progress_resume lets the ticker draw again.
void progress_hold(progress* p);
void progress_resume(progress* p);

// Draws the final state once (so a forced line always appears, even for a
// run shorter than one tick), erases it, stops the ticker and frees p.
void progress_finish(progress* p);

#endif
