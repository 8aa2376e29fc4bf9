// output_file: writing a file so that nobody ever sees it half-written.
//
// A regular file (or a new one) is written to a temporary beside it and
// renamed over it on commit: a reader, or a crash mid-write, sees the old
// file or the new one, never a truncated mix. Anything else that already
// exists at the path (a device such as /dev/null or /dev/stdout, a FIFO) is
// written directly and never replaced: renaming over /dev/null would turn it
// into a regular file for every program on the machine.
#ifndef SERVELAB_OUTPUT_FILE_H
#define SERVELAB_OUTPUT_FILE_H

#include <stdbool.h>
#include <stdio.h>

#include "base/error.h"

typedef struct output_file {
    FILE* stream;          // write here between open and commit/abort
    bool direct;           // writing straight into a non-regular file
    char path[4096];       // the destination
    char temporary[4160];  // path.tmp.<pid> while writing a regular file
} output_file;

// Opens `path` for writing in binary mode. -1 with err naming the path.
int output_file_open(output_file* f, const char* path, error_info* err);

// Flushes, syncs and closes the stream, then renames the temporary into
// place. On any failure the temporary is removed, the destination is left
// as it was, and err says what failed. `failed` lets the caller report an
// earlier write error so that commit only cleans up.
int output_file_commit(output_file* f, bool failed, error_info* err);

// Closes and removes the temporary; the destination is untouched.
void output_file_abort(output_file* f);

#endif
