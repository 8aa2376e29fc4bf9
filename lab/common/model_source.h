// model_source: turns --model / --tokenizer / --dtype into a loaded model.
//
// --model is a checkpoint path (llama2.c, or a GGUF file, told apart by its
// magic: a GGUF brings its own tokenizer unless --tokenizer is given) or a synthetic preset name (tiny, small,
// medium, large). With no --model the default is stories260K with tok512
// when found in ./models or ../shared/models, else the `small` preset. A
// checkpoint's tokenizer is --tokenizer, else the file beside it that fits
// its vocabulary (tok512.bin for 512, tokenizer.bin for 32000), else none
// (the ids are still printed). A preset uses the byte-level tokenizer, or
// --tokenizer FILE with the vocabulary that file holds. With --quant the
// model is quantized right after loading (calibrated on lab/common/calibration.c's
// streams), and every engine path then runs the quantized kernels.
#ifndef SERVELAB_MODEL_SOURCE_H
#define SERVELAB_MODEL_SOURCE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/chat_template.h"
#include "base/error.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "lab/common/cli_args.h"

typedef struct model_request {
    const char* model_arg;     // path or preset; NULL = default
    const char* tokenizer_arg; // path; NULL = automatic
    model_dtype_choice dtype;
    uint64_t synth_seed;
    const char* quant;         // --quant SCHEME[:gG][:METHOD][:sym|asym], or NULL
} model_request;

typedef struct model_source {
    model model;
    tokenizer* tokenizer;    // NULL when no tokenizer was found for a checkpoint
    char model_label[512];   // for messages and stats: the path of a checkpoint; "synthetic (random
                             // weights, shapes of medium)" for a preset; both for synth output
    char tokenizer_label[512];
    chat_template_kind chat_template; // recognised from a GGUF's tokenizer.chat_template; NONE otherwise
} model_source;

int model_source_open(model_source* out, const model_request* request, error_info* err);

// Whether path is a file that starts with the GGUF magic.
bool model_source_is_gguf(const char* path);

// When argv[cursor->index] is one of --model, --tokenizer, --dtype,
// --quant, --synth-seed, applies it to request and returns true (*failed
// set, with err, on a bad value). Shared by every subcommand that loads a
// model, so the flags mean the same everywhere.
bool model_option_match(arg_cursor* cursor, model_request* request, bool* failed, error_info* err);
void model_source_close(model_source* source);

// Building a large preset (medium and up) and --quant show a progress line
// on stderr when it is a terminal; forced (a command's --progress) shows it
// anywhere, so a test can see it.
void model_source_force_progress(bool forced);

#endif
