#include "lab/cmd/cli.h"

#include <stdio.h>
#include <string.h>

#include "lab/common/engine_options.h"

const char* const CLI_ENGINE_DEFAULTS[] = {NULL};

bool cli_answer_help(int argc, char** argv, const char* usage, const char* const* engine_defaults) {
    for (int i = 1; i < argc; i++)
        if (arg_is_help(argv[i])) {
            fputs(usage, stdout);
            if (engine_defaults) engine_options_print_usage(stdout, engine_defaults);
            return true;
        }
    return false;
}

int cli_usage_error(const error_info* err) {
    // One format for every usage error: "servelab generate: -n: expected ...".
    // Messages from the shared value parsers name only the flag.
    const char* command = arg_command_name();
    if (strncmp(err->message, "servelab", strlen("servelab")) == 0 || !command)
        fprintf(stderr, "%s\n", err->message);
    else
        fprintf(stderr, "servelab %s: %s\n", command, err->message);
    return 2;
}
