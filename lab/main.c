// servelab: a teaching lab for LLM serving. This file only dispatches to
// the subcommands (lab/cmd_*.c); it is the one place that exits.
#include <stdio.h>
#include <string.h>

#include "lab/cmd/commands.h"
#include "lab/common/cli_args.h"
#include "lab/ui/terminal.h"

static const char USAGE[] =
    "usage: servelab <command> [options]\n"
    "\n"
    "commands:\n"
    "  lab        the dashboard (also what plain 'servelab' opens)\n"
    "  generate   generate text from a model (checkpoint or synthetic preset)\n"
    "  serve      an OpenAI-compatible HTTP server on the engine (curl, the openai client)\n"
    "  bench-serve  load on any OpenAI-compatible server: TTFT, TPOT, ITL, throughput\n"
    "  sim        a workload through the engine: paged vs contiguous, continuous vs static\n"
    "  quant      quantize a model (RTN, AWQ, GPTQ) or one tensor and measure the error\n"
    "  quiz       quiz yourself: question bank, numeric drills, spaced repetition\n"
    "  lesson     Lua lessons: run, list, new, check (lessons/README.md)\n"
    "  info       what this build supports (CUDA, presets); info FILE.gguf describes a model file\n"
    "  tokenize   the token ids (and pieces) a model's tokenizer gives a text\n"
    "  synth      write a synthetic preset as a llama2.c checkpoint\n"
    "  bench      performance: bandwidth, decode, prefill, batch scaling, attention\n"
    "  calc       KV-cache, memory-fit and roofline arithmetic for a model on a device\n"
    "  machine    this machine's bandwidth, peak FLOP/s and ridge, as lessons use them (cached)\n"
    "  help       this message\n"
    "\n"
    "Each command takes --help.\n";

typedef struct command_entry {
    const char* name;
    int (*run)(int argc, char** argv);
} command_entry;

static const command_entry COMMANDS[] = {
    {"lab", command_lab},
    {"generate", command_generate},
    {"sim", command_sim},
    {"serve", command_serve},
    {"bench-serve", command_bench_serve},
    {"quant", command_quant},
    {"quiz", command_quiz},
    {"lesson", command_lesson},
    {"info", command_info},
    {"tokenize", command_tokenize},
    {"synth", command_synth},
    {"bench", command_bench},
    {"calc", command_calc},
    {"machine", command_machine},
};

// A full-screen command stopped by SIGINT, SIGTERM, SIGHUP or SIGQUIT has
// given the terminal back and returned; the exit status still says it was
// stopped by that signal (128 + its number, as a shell reports it).
static int exit_status(int command_status) {
    int signal_number = ui_terminal_stop_signal();
    return signal_number ? 128 + signal_number : command_status;
}

// The command `word` was most likely meant to be: the nearest within 2
// edits ("generat", "smi"), else the one it is the start of ("gen"), else
// NULL. 2 edits: a typo or two; 3 would turn "lab" into "sim".
static const char* nearest_command(const char* word) {
    const char* names[sizeof COMMANDS / sizeof COMMANDS[0]];
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        names[i] = COMMANDS[i].name;
    return arg_nearest(word, names, (int)(sizeof names / sizeof names[0]), 2);
}

int main(int argc, char** argv) {
    if (argc < 2) { // plain `servelab` opens the dashboard
        arg_set_command_name("lab");
        return exit_status(command_lab(argc, argv));
    }
    if (strcmp(argv[1], "help") == 0 || arg_is_help(argv[1])) {
        fputs(USAGE, stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (strcmp(argv[1], COMMANDS[i].name) == 0) {
            arg_set_command_name(COMMANDS[i].name);
            return exit_status(COMMANDS[i].run(argc - 1, argv + 1));
        }
    const char* suggestion = nearest_command(argv[1]);
    if (suggestion)
        fprintf(stderr, "servelab: unknown command '%s'; did you mean '%s'? (see servelab help)\n", argv[1], suggestion);
    else
        fprintf(stderr, "servelab: unknown command '%s' (see servelab help)\n", argv[1]);
    return 2;
}
