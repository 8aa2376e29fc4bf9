// commands: the subcommands of the servelab binary, one function each.
// Each returns the process exit status: 0 success, 1 a failure while
// running (bad file, out of memory), 2 a usage error (bad flag or value).
#ifndef SERVELAB_COMMANDS_H
#define SERVELAB_COMMANDS_H

#include "lab/ui/screen.h"

int command_generate(int argc, char** argv);
int command_info(int argc, char** argv);
int command_tokenize(int argc, char** argv);
int command_sim(int argc, char** argv);
int command_quant(int argc, char** argv);
int command_lab(int argc, char** argv);
// command_lab with the headless replay's screen watched by cut_hook, so that
// a test sees every text a frame cut (tests/lab/ui/test_dashboard_fit.c);
// command_lab is this with NULL.
int command_lab_watching_cuts(int argc, char** argv, ui_cut_hook cut_hook, void* cut_hook_user);
int command_quiz(int argc, char** argv);
int command_synth(int argc, char** argv);
int command_bench(int argc, char** argv);
int command_lesson(int argc, char** argv);
int command_serve(int argc, char** argv);
int command_calc(int argc, char** argv);
int command_bench_serve(int argc, char** argv);
int command_machine(int argc, char** argv);

#endif
