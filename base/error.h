// error: how library code reports failure.
//
// Library functions never exit() or print. They return 0 on success and -1
// on failure, after filling an error_info with one line that names the file
// or value, the field and what was expected, for example
//   "stories.bin: truncated: expected 1056540 bytes, found 1000".
// Only lab/main.c decides to print it and exit.
#ifndef SERVELAB_ERROR_H
#define SERVELAB_ERROR_H

#include <stddef.h>

typedef struct error_info {
    char message[512];
} error_info;

// Formats the message into err (when err is not NULL) and returns -1, so
// that a failing path reads `return error_set(err, "...", ...);`.
int error_set(error_info* err, const char* format, ...) __attribute__((format(printf, 2, 3)));

// Clears the message (a fresh error_info holds "").
void error_clear(error_info* err);

#endif
