// cli: what every subcommand does with its command line before its own
// work: answer --help, and turn a bad argument into exit status 2.
#ifndef SERVELAB_CLI_H
#define SERVELAB_CLI_H

#include <stdbool.h>

#include "base/error.h"
#include "lab/common/cli_args.h"

// Give as engine_defaults to print the engine options' help unchanged.
extern const char* const CLI_ENGINE_DEFAULTS[];

// When any argument after the command's name is --help or -h, prints the
// command's help on stdout and returns true. Help wins over every other
// argument, so `servelab sim --bogus -h` shows the usage, not an error.
// The help is `usage`, then, for a command that runs an engine
// (engine_defaults not NULL), the engine options with the lines that
// engine_defaults replaces (engine_options_print_usage).
bool cli_answer_help(int argc, char** argv, const char* usage, const char* const* engine_defaults);

// Prints err's message on stderr as "servelab CMD: message" (the message
// as it is when it already starts with "servelab") and returns 2, the exit
// status of a usage error (lab/cmd/commands.h).
int cli_usage_error(const error_info* err);

#endif
