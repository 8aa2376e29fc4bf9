// engine_options: the command-line flags that configure an engine, shared
// by every subcommand that runs one (sim, generate, lab, lesson).
//
//   --kv paged|contiguous   --block-size N        --kv-mem SIZE (64MiB, 1GiB, 4096)
//   --num-blocks N          --kv-dtype fp16|fp32  --reserve max|request
//   --batching continuous|static                  --max-seqs N
//   --max-batched-tokens N  --no-chunked-prefill  --no-prefix-caching
//   --threads N             --tp N                --tp-link nvlink|pcie
//   --backend cpu|cuda      --fault NAME[,NAME]
#ifndef SERVELAB_ENGINE_OPTIONS_H
#define SERVELAB_ENGINE_OPTIONS_H

#include <stdio.h>
#include <stdbool.h>

#include "engine/engine.h"
#include "lab/common/cli_args.h"
#include "lab/common/model_source.h"

// The usage lines for these flags (for --help texts).
extern const char ENGINE_OPTIONS_USAGE[];

// When argv[cursor->index] is an engine flag, applies it and returns true
// (*failed set with err on a bad value). "--kv both" and "--batching both"
// are accepted when the caller passes the both-flags. From the command line
// (cursor->command "servelab ...") a --kv-mem beyond the memory available
// (kv_memory_available_bytes) is a bad value, refused before anything is
// loaded; engine_init checks the final pool for every caller.
bool engine_option_match(arg_cursor* cursor, engine_config* config, bool* kv_both, bool* batching_both,
                         bool* failed, error_info* err);

// The draft model that --speculative draft:... asks for, opened into
// *draft (close it with model_source_close after the engine is freed) and
// pointed at by config->draft_model: draft:SCHEME opens the target's own
// --model again (a checkpoint, a GGUF or a preset), without its --quant,
// and quantizes it with SCHEME (RTN: no calibration data needed);
// draft:FILE opens FILE. The vocabulary check is engine_init's. Any other
// kind: nothing to do (returns 0, *draft zeroed).
int engine_options_open_draft(engine_config* config, const model_request* target_request, model_source* draft,
                              error_info* err);

// Parses "64MiB", "1GiB", "512KiB", "100MB", "4096" into bytes.
int parse_size_arg(const char* flag, const char* text, uint64_t* out, error_info* err);

// Prints ENGINE_OPTIONS_USAGE to out, with each option that `replacements`
// (NULL-terminated; each text starts "  --flag ") names printed as given
// instead, its continuation lines dropped: a command whose defaults differ
// from the engine's (generate runs one fp32 sequence) says its own.
void engine_options_print_usage(FILE* out, const char* const* replacements);

#endif
