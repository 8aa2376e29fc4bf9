// output_file: writing a file so that nobody ever sees it half-written, and
// so that a symbolic link planted beside it is never written through.
//
// A regular file (or a new one) is written to a temporary beside it and
// renamed over it on commit: a reader, or a crash mid-write, sees the old
// file or the new one, never a truncated mix. The temporary is created new
// (O_CREAT | O_EXCL | O_NOFOLLOW): a file or link someone placed at its name
// is never opened, and another name is tried. A destination that is a
// symbolic link to a regular file (or to nothing) is refused, since the
// write would land wherever it points; if a link appears there between the
// check and the commit, rename replaces the link itself, never its target.
// Anything else that already exists at the path (a device such as /dev/null,
// /dev/stdout - itself a link to /proc/self/fd/1 - or a FIFO) is written
// directly and never replaced: renaming over /dev/null would turn it into a
// regular file for every program on the machine.
#ifndef SERVELAB_OUTPUT_FILE_H
#define SERVELAB_OUTPUT_FILE_H

#include <stdbool.h>
#include <stdio.h>

#include "base/error.h"

typedef struct output_file {
    FILE* stream;          // write here between open and commit/abort
    bool direct;           // writing straight into a non-regular file
    char path[4096];       // the destination
    char temporary[4160];  // path.tmp.<pid>[.<try>] while writing a regular file
} output_file;

// Opens `path` for writing in binary mode (a new file gets mode 0666 less
// the umask, as fopen gives). -1 with err naming the path.
int output_file_open(output_file* f, const char* path, error_info* err);

// Flushes, syncs and closes the stream, then renames the temporary into
// place and syncs the folder (best effort). On any failure the temporary
// is removed, the destination is left as it was, and err says what failed.
// `failed` lets the caller report an earlier write error so that commit
// only cleans up.
int output_file_commit(output_file* f, bool failed, error_info* err);

// Closes and removes the temporary; the destination is untouched.
void output_file_abort(output_file* f);

#endif
