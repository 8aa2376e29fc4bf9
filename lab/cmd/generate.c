// servelab generate: plain text generation with statistics.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/terminal_text.h"
#include "engine/engine.h"
#include "engine/model_synth.h"
#include "engine/output_file.h"
#include "engine/tokenizer.h"
#include "lab/common/cli_args.h"
#include "lab/cmd/cli.h"
#include "lab/cmd/commands.h"
#include "lab/common/engine_options.h"
#include "lab/common/model_source.h"

static const char GENERATE_USAGE[] =
    "usage: servelab generate [options]\n"
    "\n"
    "Generates text from a model, one sequence, and prints a stats line on stderr.\n"
    "\n"
    "  --model PATH|PRESET   llama2.c checkpoint, or a synthetic preset: tiny, small,\n"
    "                        medium, large (default: stories260K when found in ./models\n"
    "                        or ../shared/models, else small)\n"
    "  --tokenizer FILE      llama2.c tokenizer.bin (default: beside the checkpoint;\n"
    "                        byte-level for presets)\n"
    "  --prompt TEXT         prompt text (needs a tokenizer)\n"
    "  --prompt-ids \"IDS\"    prompt token ids after BOS, space-separated\n"
    "  -n N                  new tokens to generate (default 256)\n"
    "  --temperature T       0 = greedy, the default (deterministic); try 0.8; below\n"
    "                        0.001 samples greedily too (dividing by less overflows)\n"
    "  --top-p P             nucleus threshold when sampling, 0 or 1 = off (default 0.9);\n"
    "                        below 1e-6 counts as 1e-6 (only the likeliest token)\n"
    "  --seed N              sampler seed (default 42)\n"
    "  --synth-seed N        seed of a synthetic preset's weights\n"
    "  --dtype fp32|fp16     how weights are stored (default: the file's; fp16 for presets)\n"
    "  --quant SCHEME        quantize after loading: w8a16|w4a16|w8a8|w4a8[:gG][:rtn|awq|gptq][:sym|asym]\n"
    "  --ids                 print the generated ids on one line instead of text\n"
    "  --progress            the progress line (building a large preset, --quant) on stderr even when it is\n"
    "                        not a terminal\n"
    "  --chat                the prompt is a user message, written in the model's chat\n"
    "                        template (a GGUF's tokenizer.chat_template: Llama 3, ChatML,\n"
    "                        Llama 2 [INST], Zephyr); --system TEXT adds a system message\n"
    "  --trace FILE          write each engine step's record as JSON Lines\n"
    "\n"
    "The request runs through the serving engine; its engine options apply, with\n"
    "generate's own defaults for the KV type, budget and sequences:\n";

// The engine options' shared help (lab/common/engine_options.c) states the
// engine's defaults, which generate changes for one sequence: fp32 KV (so
// that fp32 weights give llama2.c's output exactly), a pool of one
// max-length sequence, one sequence at a time. Those lines are replaced
// here (each replacement starts with its flag).
static const char* const GENERATE_ENGINE_DEFAULTS[] = {
    "  --kv-mem SIZE             KV memory budget, e.g. 64MiB, 1GiB (default: one sequence of\n"
    "                            the model's full length; at most the memory available)\n",
    "  --kv-dtype fp32|fp16|int8 KV element type (default fp32; int8 has a scale per token and head)\n",
    "  --max-seqs N              sequences running at once (default 1)\n",
    NULL,
};


// The sampling flags of one generation.
typedef struct generate_options {
    int max_new_tokens; // -n: tokens to generate at most
    float temperature;  // 0 = greedy
    float top_p;        // nucleus threshold; 0 or 1 = off
    uint64_t seed;      // sampler seed
} generate_options;

typedef struct generate_args {
    model_request request;
    engine_config engine;
    const char* trace_path;
    const char* prompt_text;
    const char* prompt_ids_text;
    generate_options options; // n, temperature, top-p, seed
    bool print_ids;
    bool chat;                // --chat: wrap the prompt in the model's chat template
    const char* system_text;  // --system TEXT with --chat
    bool progress_forced;     // --progress: the model-building line even when stderr is not a terminal
} generate_args;

static int parse_generate_args(int argc, char** argv, generate_args* args, error_info* err) {
    memset(args, 0, sizeof *args);
    args->options = (generate_options){.max_new_tokens = 256, .temperature = 0.0f, .top_p = 0.9f, .seed = 42};
    args->request.synth_seed = SYNTH_DEFAULT_SEED;
    args->engine = engine_config_default();
    args->engine.kv_dtype = KV_F32;
    args->engine.max_seqs = 1;
    args->engine.kv_mem_bytes = 0; // 0: size the pool for one sequence of the model's max length
    arg_cursor cursor = {argc, argv, 1, "servelab generate", NULL};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        if (engine_option_match(&cursor, &args->engine, NULL, NULL, &failed, err)) {
        } else if (arg_match(&cursor, "--trace", true, &failed, err)) {
            if (!failed) args->trace_path = cursor.value;
        } else if (model_option_match(&cursor, &args->request, &failed, err)) {
        } else if (arg_match(&cursor, "--prompt", true, &failed, err)) {
            if (!failed) args->prompt_text = cursor.value;
        } else if (arg_match(&cursor, "--prompt-ids", true, &failed, err)) {
            if (!failed) args->prompt_ids_text = cursor.value;
        } else if (arg_match(&cursor, "-n", true, &failed, err)) {
            if (!failed && parse_int_arg("-n", cursor.value, 0, 1 << 22, &args->options.max_new_tokens, err)) return -1;
        } else if (arg_match(&cursor, "--temperature", true, &failed, err)) {
            if (!failed && parse_float_arg("--temperature", cursor.value, 0.0, 100.0, &args->options.temperature, err))
                return -1;
        } else if (arg_match(&cursor, "--top-p", true, &failed, err)) {
            if (!failed && parse_float_arg("--top-p", cursor.value, 0.0, 1.0, &args->options.top_p, err)) return -1;
        } else if (arg_match(&cursor, "--seed", true, &failed, err)) {
            if (!failed && parse_u64_arg("--seed", cursor.value, &args->options.seed, err)) return -1;
        } else if (arg_match(&cursor, "--progress", false, &failed, err)) {
            args->progress_forced = true;
        } else if (arg_match(&cursor, "--ids", false, &failed, err)) {
            args->print_ids = true;
        } else if (arg_match(&cursor, "--chat", false, &failed, err)) {
            args->chat = true;
        } else if (arg_match(&cursor, "--system", true, &failed, err)) {
            if (!failed) args->system_text = cursor.value;
        } else {
            return arg_unknown(&cursor, err);
        }
        if (failed) return -1;
    }
    if ((args->chat || args->system_text) && !args->prompt_text)
        return error_set(err, "servelab generate: --chat and --system need --prompt (the user's message)");
    if (args->system_text && !args->chat) return error_set(err, "servelab generate: --system goes with --chat");
    if (args->prompt_text && args->prompt_ids_text)
        return error_set(err, "servelab generate: give --prompt or --prompt-ids, not both");
    return 0;
}

// Parses "300 400 100" into ids after BOS; checks each against the vocabulary.
static int parse_prompt_ids(const char* text, int vocab_size, int32_t* ids, int capacity, int* n, error_info* err) {
    const char* cursor = text;
    *n = 0;
    for (;;) {
        while (*cursor == ' ' || *cursor == '\t' || *cursor == ',') cursor++;
        if (*cursor == '\0') return 0;
        char* end = NULL;
        long id = strtol(cursor, &end, 10);
        if (end == cursor || (*end != '\0' && *end != ' ' && *end != '\t' && *end != ','))
            return error_set(err, "--prompt-ids: expected space-separated token ids, found '%s'", cursor);
        if (id < 0 || id >= vocab_size)
            return error_set(err, "--prompt-ids: id %ld is outside the vocabulary 0..%d", id, vocab_size - 1);
        if (*n >= capacity) return error_set(err, "--prompt-ids: more than %d ids", capacity);
        ids[(*n)++] = (int32_t)id;
        cursor = end;
    }
}

// The vocabulary's pieces are the model author's text, not the user's: a
// piece holding ESC ] 0 ; ... BEL or U+009B would set the terminal's title or
// clear the screen. Controls print as '?' except '\n' and '\t' (a "<0x0A>"
// byte token still breaks the line); a character spelled one byte-token at a
// time waits in `text` until it is whole.
typedef struct piece_printer {
    const tokenizer* tok;
    terminal_text text;
} piece_printer;

static void print_piece(piece_printer* printer, int32_t previous, int32_t token) {
    const char* piece = tok_decode_piece(printer->tok, previous, token);
    if (tok_piece_is_printable(piece)) terminal_text_write(&printer->text, piece, stdout);
}

static void print_generated_piece(piece_printer* printer, int32_t previous, int32_t token) {
    print_piece(printer, previous, token);
    fflush(stdout); // the student sees each token as it is decoded
}

// --chat: [system,] user in the model's template, then the assistant's header,
// encoded with the template's special tokens as tokens.
static int encode_chat(const model_source* source, const generate_args* args, int32_t* ids, int capacity, int* n_ids,
                       error_info* err) {
    if (source->chat_template == CHAT_TEMPLATE_NONE)
        return error_set(err, "%s has no chat template servelab recognises (Llama 3, ChatML, Llama 2 [INST], Zephyr)",
                         source->model_label);
    chat_message messages[2];
    int n = 0;
    if (args->system_text) messages[n++] = (chat_message){"system", args->system_text};
    messages[n++] = (chat_message){"user", args->prompt_text};
    size_t needed = 0;
    chat_template_apply(source->chat_template, messages, n, true, NULL, 0, &needed, NULL);
    char* text = malloc(needed + 1);
    if (!text) return error_set(err, "out of memory");
    int status = chat_template_apply(source->chat_template, messages, n, true, text, needed + 1, &needed, err);
    if (status == 0)
        status = tok_encode_special(source->tokenizer, text, tok_adds_bos(source->tokenizer), false, ids, capacity,
                                    n_ids, err);
    free(text);
    return status;
}

// The prompt's ids into prompt (capacity max_seq_len): --prompt (plain or
// --chat) through the tokenizer, else BOS and --prompt-ids. Returns 0, or
// the exit status with the message printed.
static int build_prompt(const model_source* source, const generate_args* args, int32_t* prompt, int* n_prompt) {
    error_info err = {{0}};
    const model_config* c = &source->model.config;
    if (!args->prompt_text) {
        prompt[0] = TOK_BOS_ID;
        int n_ids = 0;
        if (args->prompt_ids_text &&
            parse_prompt_ids(args->prompt_ids_text, c->vocab_size, prompt + 1, c->max_seq_len - 1, &n_ids, &err)) {
            fprintf(stderr, "servelab generate: %s\n", err.message);
            return 2;
        }
        *n_prompt = 1 + n_ids;
        return 0;
    }
    if (!source->tokenizer) {
        fprintf(stderr, "servelab generate: --prompt needs a tokenizer for %s (give --tokenizer FILE)\n",
                source->model_label);
        return 2;
    }
    if (args->chat) {
        if (encode_chat(source, args, prompt, c->max_seq_len, n_prompt, &err)) {
            fprintf(stderr, "servelab generate: --chat: %s\n", err.message);
            return 2;
        }
    } else if (tok_encode(source->tokenizer, args->prompt_text, tok_adds_bos(source->tokenizer), false, prompt,
                          c->max_seq_len, n_prompt, &err)) {
        fprintf(stderr, "servelab generate: --prompt: %s; the model's context (max_seq_len) is %d tokens\n",
                err.message, c->max_seq_len);
        return 2;
    }
    return 0;
}

// What the engine's step records say about one generation.
typedef struct generation_stats {
    uint64_t prefill_ns, decode_ns;
    uint64_t decode_weight_bytes;    // summed over the decode steps
    kernel_traffic decode_shard0;    // --tp: shard 0's work over the decode steps
    uint64_t decode_allreduce_bytes;
    double decode_allreduce_seconds;
    stop_reason stop;
    int decode_tokens;               // tokens appended by the decode steps (more than one a step with --speculative)
    uint64_t spec_drafted, spec_accepted, spec_emitted, spec_target_passes;
    uint64_t spec_draft_weight_bytes; // the draft model's, over the decode steps
} generation_stats;

static void add_step(generation_stats* stats, const step_record* r) {
    stats->spec_drafted = r->spec_total_drafted;
    stats->spec_accepted = r->spec_total_accepted;
    stats->spec_emitted = r->spec_total_emitted;
    stats->spec_target_passes = r->spec_total_target_passes;
    if (r->prefill_tokens > 0) {
        stats->prefill_ns += r->wall_ns;
        return;
    }
    stats->decode_ns += r->wall_ns;
    stats->spec_draft_weight_bytes += r->spec_draft_weight_bytes;
    stats->decode_weight_bytes += r->traffic.weight_bytes_read;
    traffic_add(&stats->decode_shard0, &r->shard_traffic[0]);
    stats->decode_allreduce_bytes += r->allreduce_bytes;
    stats->decode_allreduce_seconds += r->allreduce_seconds;
}

// One request through the serving engine (so --trace shows its steps),
// printing each token's text as it comes through printer (NULL: ids only). The generated ids
// go to generated (capacity max_new_tokens + 1). Returns 0 when the request
// ran to its end and the trace was written, else the exit status.
static int run_request(const model_source* source, generate_args* args, const int32_t* prompt, int n_prompt,
                       piece_printer* printer, int32_t* generated, int* n_generated, generation_stats* stats) {
    error_info err = {{0}};
    const model_config* c = &source->model.config;
    // The KV cache is fp32 unless asked otherwise: with fp32 weights the
    // output then equals llama2.c's exactly.
    if (args->engine.num_blocks == 0 && args->engine.kv_mem_bytes == 0)
        args->engine.num_blocks = (c->max_seq_len + args->engine.block_size - 1) / args->engine.block_size;
    model_source draft; // --speculative draft:...: the proposer, freed after the engine
    if (engine_options_open_draft(&args->engine, &args->request, &draft, &err)) {
        fprintf(stderr, "servelab generate: %s\n", err.message);
        return 2;
    }
    engine e;
    if (engine_init(&e, &source->model, &args->engine, &err)) {
        fprintf(stderr, "servelab generate: %s\n", err.message);
        model_source_close(&draft);
        return 2;
    }
    // The trace through output_file: never written through a planted link,
    // and renamed into place only once complete.
    output_file trace_file;
    FILE* trace = NULL;
    if (args->trace_path) {
        if (output_file_open(&trace_file, args->trace_path, &err)) {
            fprintf(stderr, "servelab generate: %s (the trace file)\n", err.message);
            engine_free(&e);
            model_source_close(&draft);
            return 1;
        }
        trace = trace_file.stream;
    }
    engine_set_trace(&e, trace);
    request_params params = {prompt, n_prompt, args->options.max_new_tokens, 1, args->options.temperature,
                             args->options.top_p, args->options.seed, 0.0, false};
    int32_t id = 0;
    if (args->options.max_new_tokens > 0 && engine_add_request(&e, &params, &id, &err)) {
        fprintf(stderr, "servelab generate: %s\n", err.message);
        engine_free(&e);
        model_source_close(&draft);
        if (trace) output_file_abort(&trace_file);
        return 2;
    }
    int printed = n_prompt; // tokens of the sequence already printed
    while (engine_has_work(&e)) {
        const step_record* r;
        if (engine_step(&e, &r, &err)) {
            fprintf(stderr, "servelab generate: %s\n", err.message);
            break;
        }
        add_step(stats, r);
        step_sequence_status s;
        engine_sequence_status(&e, id, &s); // never released here
        if (r->prefill_tokens == 0 && s.n_tokens > printed) stats->decode_tokens += s.n_tokens - printed;
        for (; printed < s.n_tokens; printed++) {
            generated[(*n_generated)++] = s.tokens[printed];
            if (printer) print_generated_piece(printer, s.tokens[printed - 1], s.tokens[printed]);
        }
    }
    step_sequence_status s;
    bool added = args->options.max_new_tokens > 0 && engine_sequence_status(&e, id, &s);
    bool complete = !engine_has_work(&e);
    stats->stop = added ? s.stop : STOP_LENGTH;
    engine_free(&e);
    model_source_close(&draft);
    if (trace && output_file_commit(&trace_file, false, &err)) {
        fprintf(stderr, "servelab generate: %s: the trace could not be written: %s\n", args->trace_path, err.message);
        complete = false;
    }
    return complete ? 0 : 1;
}

// The stats line on stderr (and, with --tp, shard 0's share of the work).
static void print_stats(const model_source* source, const generate_args* args, int n_prompt, int n_generated,
                        const generation_stats* stats) {
    // Per decode token, not per step: with --speculative a step appends up to k + 1 tokens.
    double decode_rate = stats->decode_ns > 0 ? stats->decode_tokens / (stats->decode_ns * 1e-9) : 0.0;
    double prefill_rate = stats->prefill_ns > 0 ? n_prompt / (stats->prefill_ns * 1e-9) : 0.0;
    int decode_tokens = stats->decode_tokens;
    // fp16 / fp32 weights held twice where the AVX-512 kernel reads them tiled (matmul.h).
    char tile_copy[96] = "";
    if (source->model.tile_bytes)
        snprintf(tile_copy, sizeof tile_copy, ", + %llu bytes tiled for the kernel",
                 (unsigned long long)source->model.tile_bytes);
    fprintf(stderr,
            "servelab: %s (%s, %.2fM params, %llu weight bytes%s); prefill %d tok at %.0f tok/s; "
            "decode %d tok at %.1f tok/s; %llu weight bytes read per token; stop: %s\n",
            source->model_label, weight_dtype_name(source->model.dtype), (double)source->model.n_parameters / 1e6,
            (unsigned long long)source->model.weight_bytes, tile_copy, n_prompt, prefill_rate, n_generated,
            decode_rate,
            decode_tokens ? (unsigned long long)(stats->decode_weight_bytes / (uint64_t)decode_tokens) : 0ull,
            stop_reason_name(stats->stop));
    if (args->engine.speculative.kind != SPEC_NONE) {
        char what[600];
        speculative_config_describe(&args->engine.speculative, what, sizeof what);
        fprintf(stderr,
                "servelab: --speculative %s: %llu of %llu guesses kept (acceptance %.1f%%); %llu tokens in %llu target "
                "passes, %.2f tokens per target pass; the draft read %llu weight bytes per decode token\n",
                what, (unsigned long long)stats->spec_accepted, (unsigned long long)stats->spec_drafted,
                stats->spec_drafted ? 100.0 * (double)stats->spec_accepted / (double)stats->spec_drafted : 0.0,
                (unsigned long long)stats->spec_emitted, (unsigned long long)stats->spec_target_passes,
                stats->spec_target_passes ? (double)stats->spec_emitted / (double)stats->spec_target_passes : 0.0,
                decode_tokens ? (unsigned long long)(stats->spec_draft_weight_bytes / (uint64_t)decode_tokens) : 0ull);
    }
    if (args->engine.tp_shards <= 1 || decode_tokens == 0) return;
    uint64_t shard_bytes = stats->decode_shard0.weight_bytes_read / (uint64_t)decode_tokens;
    uint64_t shard_flops =
        (stats->decode_shard0.matmul_flops + stats->decode_shard0.attention_flops) / (uint64_t)decode_tokens;
    fprintf(stderr,
            "servelab: --tp %d over %s: per decode token shard 0 read %llu weight bytes and did %llu FLOPs "
            "(%.2f FLOP/byte); each shard sent %llu all-reduce bytes, %.1f us on the link\n",
            args->engine.tp_shards, link_model_get(args->engine.tp_link)->name, (unsigned long long)shard_bytes,
            (unsigned long long)shard_flops, shard_bytes ? (double)shard_flops / (double)shard_bytes : 0.0,
            (unsigned long long)(stats->decode_allreduce_bytes / (uint64_t)decode_tokens),
            stats->decode_allreduce_seconds / decode_tokens * 1e6);
}

int command_generate(int argc, char** argv) {
    if (cli_answer_help(argc, argv, GENERATE_USAGE, GENERATE_ENGINE_DEFAULTS)) return 0;
    error_info err = {{0}};
    generate_args args;
    if (parse_generate_args(argc, argv, &args, &err)) return cli_usage_error(&err);
    model_source_force_progress(args.progress_forced);
    model_source source;
    if (model_source_open(&source, &args.request, &err)) {
        fprintf(stderr, "servelab generate: %s\n", err.message);
        return 1;
    }
    const model_config* c = &source.model.config;
    int status = 1;
    int32_t* prompt = malloc((size_t)c->max_seq_len * sizeof *prompt);           // (max_seq_len) ids
    int32_t* generated = malloc(((size_t)args.options.max_new_tokens + 1) * sizeof *generated); // (n) ids
    int n_prompt = 0, n_generated = 0;
    generation_stats stats = {0};
    if (!prompt || !generated) {
        fprintf(stderr, "servelab generate: out of memory\n");
        goto done;
    }
    if ((status = build_prompt(&source, &args, prompt, &n_prompt)) != 0) goto done;
    bool print_text = !args.print_ids && source.tokenizer;
    if (!args.print_ids && !source.tokenizer)
        fprintf(stderr, "servelab generate: no tokenizer for vocab %d beside %s: printing ids (give --tokenizer)\n",
                c->vocab_size, source.model_label);
    piece_printer printer = {source.tokenizer, {.keep_line_breaks = true}};
    if (print_text)
        for (int i = 1; i < n_prompt; i++) print_piece(&printer, prompt[i - 1], prompt[i]);
    status = run_request(&source, &args, prompt, n_prompt, print_text ? &printer : NULL, generated, &n_generated,
                         &stats);
    if (print_text) terminal_text_flush(&printer.text, stdout);
    if (status != 0) goto done;
    if (!print_text)
        for (int i = 0; i < n_generated; i++) printf(i ? " %d" : "%d", generated[i]);
    putchar('\n');
    fflush(stdout);
    print_stats(&source, &args, n_prompt, n_generated, &stats);
done:
    free(prompt);
    free(generated);
    model_source_close(&source);
    return status;
}
