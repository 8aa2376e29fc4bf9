// commands: the subcommands of the servelab binary, one function each.
// Each returns the process exit status: 0 success, 1 a failure while
// running (bad file, out of memory), 2 a usage error (bad flag or value).
#ifndef SERVELAB_COMMANDS_H
#define SERVELAB_COMMANDS_H

int command_generate(int argc, char** argv);
int command_info(int argc, char** argv);
int command_tokenize(int argc, char** argv);
int command_sim(int argc, char** argv);
int command_quant(int argc, char** argv);
int command_lab(int argc, char** argv);
int command_quiz(int argc, char** argv);
int command_synth(int argc, char** argv);
int command_bench(int argc, char** argv);
int command_lesson(int argc, char** argv);
int command_serve(int argc, char** argv);
int command_calc(int argc, char** argv);
int command_bench_serve(int argc, char** argv);

#endif
