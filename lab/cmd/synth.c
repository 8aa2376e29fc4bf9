// servelab synth: writes a synthetic preset as a llama2.c checkpoint.
//
// The legacy (headerless fp32) format is the one every llama2.c tool reads,
// so the very weights servelab benchmarks can be run by llama2.c's run.c or
// converted for llama.cpp and compared on the same machine.
#include <stdio.h>
#include <string.h>

#include "engine/model_synth.h"
#include "engine/model_write.h"
#include "engine/tokenizer.h"
#include "lab/common/cli_args.h"
#include "lab/cmd/cli.h"
#include "lab/cmd/commands.h"

static const char SYNTH_USAGE[] = "usage: servelab synth PRESET --out FILE [--seed S]\n"
                                  "\n"
                                  "Writes synthetic preset PRESET (see servelab info) as a llama2.c legacy\n"
                                  "checkpoint (fp32, headerless), atomically: a temporary file renamed into place.\n"
                                  "\n"
                                  "  --out FILE   the checkpoint to write\n"
                                  "  --seed S     seed of the weights (default: the presets' default seed)\n"
                                  "\n"
                                  "The vocabulary is the preset's (stories110m: 32000), else the byte-level\n"
                                  "tokenizer's 259 tokens.\n";

typedef struct synth_args {
    const char* preset;
    const char* out_path;
    uint64_t seed;
} synth_args;

static int parse_synth_args(int argc, char** argv, synth_args* args, error_info* err) {
    *args = (synth_args){NULL, NULL, SYNTH_DEFAULT_SEED};
    arg_cursor cursor = {argc, argv, 1, "servelab synth", NULL};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        if (arg_match(&cursor, "--out", true, &failed, err)) {
            if (!failed) args->out_path = cursor.value;
        } else if (arg_match(&cursor, "--seed", true, &failed, err)) {
            if (!failed && parse_u64_arg("--seed", cursor.value, &args->seed, err)) return -1;
        } else if (argv[cursor.index][0] != '-' && !args->preset) {
            args->preset = argv[cursor.index];
        } else {
            return error_set(err, "servelab synth: unexpected argument '%s' (see servelab synth --help)",
                             argv[cursor.index]);
        }
        if (failed) return -1;
    }
    if (!args->preset) return error_set(err, "servelab synth: which preset? (see servelab synth --help)");
    if (!synth_find_preset(args->preset))
        return error_set(err, "servelab synth: '%s' is not a preset (see servelab info)", args->preset);
    if (!args->out_path) return error_set(err, "servelab synth: --out FILE is required");
    return 0;
}

int command_synth(int argc, char** argv) {
    if (cli_answer_help(argc, argv, SYNTH_USAGE, NULL)) return 0;
    error_info err = {{0}};
    synth_args args;
    if (parse_synth_args(argc, argv, &args, &err)) return cli_usage_error(&err);
    // fp32, so the checkpoint holds the generator's values unrounded.
    model m;
    if (model_synthesize(&m, args.preset, TOK_MIN_VOCAB_SIZE, MODEL_DTYPE_FP32, args.seed, &err) ||
        model_write_checkpoint(&m, args.out_path, MODEL_FORMAT_LEGACY, 0, &err)) {
        fprintf(stderr, "servelab synth: %s\n", err.message);
        model_free(&m);
        return 1;
    }
    const model_config* c = &m.config;
    printf("%s: preset %s, seed %llu: dim %d, hidden %d, %d layers, %d heads, %d KV heads, vocab %d, "
           "max_seq_len %d; %.1fM parameters (llama2.c legacy fp32)\n",
           args.out_path, args.preset, (unsigned long long)args.seed, c->dim, c->hidden_dim, c->n_layers, c->n_heads,
           c->n_kv_heads, c->vocab_size, c->max_seq_len, (double)m.n_parameters / 1e6);
    model_free(&m);
    return 0;
}
