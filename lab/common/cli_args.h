// cli_args: strict parsing of command-line values.
//
// Every value is checked whole ("12x" is not 12) and against its range; a
// bad one gives a message naming the flag, what was found and what was
// expected. Flags take their value as the next argument or after '='.
#ifndef SERVELAB_CLI_ARGS_H
#define SERVELAB_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

typedef struct arg_cursor {
    int argc;
    char** argv;
    int index;           // the argument being looked at
    const char* command; // "servelab generate", for messages
    const char* value;   // the value of the last matched flag
} arg_cursor;

// The subcommand running ("generate"), set once by main before it
// dispatches, so that a message made below the command's own code (a bad
// value, a progress line) can name it. NULL until set.
void arg_set_command_name(const char* name);
const char* arg_command_name(void);

// Levenshtein distance (insert, delete, substitute); words are cut to 31
// characters, longer than any command, flag or preset name.
int arg_edit_distance(const char* a, const char* b);

// What `word` was most likely meant to be among the n candidates: the
// nearest within max_edits edits (a typo or two), else, for a word of 2 or
// more characters, the first candidate it is the start of ("gen" for
// "generate"); NULL when none is near.
const char* arg_nearest(const char* word, const char* const* candidates, int n, int max_edits);

// True when argv[index] is `flag` (or `flag=...`); for a flag that takes a
// value (takes_value), cursor->value is set and the cursor moves past it.
// Every flag asked about for the argument is remembered (in one static
// list, for the argument last looked at: command lines are parsed on one
// thread), so that arg_unknown can say which one was meant.
// A missing value is an error (returns true and sets *failed).
bool arg_match(arg_cursor* cursor, const char* flag, bool takes_value, bool* failed, error_info* err);

// True when arg asks for a command's help: --help or -h.
bool arg_is_help(const char* arg);

// The error for an argument no flag of the command matched: "servelab sim:
// unknown option '--x' (see servelab sim --help)", with "; did you mean
// '--temperature'?" when a flag the command tried is within 2 edits. The help named is the
// top command's (the first two words of cursor->command), since `servelab
// lesson --help` also covers `servelab lesson run`. Returns -1.
int arg_unknown(const arg_cursor* cursor, error_info* err);

int parse_int_arg(const char* flag, const char* text, long min_value, long max_value, int* out, error_info* err);
int parse_u64_arg(const char* flag, const char* text, uint64_t* out, error_info* err);
int parse_float_arg(const char* flag, const char* text, double min_value, double max_value, float* out,
                    error_info* err);

#endif
