// servelab serve: the OpenAI-compatible HTTP server (lab/serve/server.h).
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/model_synth.h"
#include "lab/common/cli_args.h"
#include "lab/cmd/cli.h"
#include "lab/cmd/commands.h"
#include "lab/common/engine_options.h"
#include "lab/common/model_source.h"
#include "lab/serve/server.h"

static const char SERVE_USAGE[] =
    "usage: servelab serve [options]\n"
    "\n"
    "An OpenAI-compatible HTTP server on the paged engine: every client's requests\n"
    "share each engine step (continuous batching). Stop it with Ctrl-C.\n"
    "\n"
    "  POST /v1/completions       prompt (a string, or token ids: BOS is put first\n"
    "                             unless they start with 1), max_tokens (default 16),\n"
    "                             temperature (0..2, default 1; 0 and anything\n"
    "                             below 0.001 = greedy), top_p ((0, 1]; below 1e-6\n"
    "                             counts as 1e-6: only the likeliest token),\n"
    "                             seed, n, stop (up to 4 strings), stream,\n"
    "                             stream_options.include_usage, logprobs (0..5: the\n"
    "                             sampled token's and the likeliest), echo,\n"
    "                             return_token_ids (vLLM's: token ids beside the text),\n"
    "                             ignore_eos (vLLM's: max_tokens whatever the model says)\n"
    "  POST /v1/chat/completions  messages, the same fields (max_tokens defaults to\n"
    "                             the rest of the context, as far as the KV pool\n"
    "                             holds it; logprobs true with\n"
    "                             top_logprobs 0..20). The models here are base\n"
    "                             models with no chat template; messages are written\n"
    "                             as plain text, each \"System: ...\", \"User: ...\" or\n"
    "                             \"Assistant: ...\" followed by a blank line, and then\n"
    "                             \"Assistant:\" for the model to continue.\n"
    "  GET  /v1/models            the model served\n"
    "  GET  /health               status and the KV pool (blocks free, used, cached)\n"
    "  GET  /metrics              Prometheus text with vLLM's metric names\n"
    "\n"
    "  --host ADDR               numeric address to listen on (default 127.0.0.1)\n"
    "  --port N                  port (default 8000; 0 = any free port, printed)\n"
    "  --served-model-name NAME  the `model` clients give (default: the file's name,\n"
    "                            e.g. stories260K)\n"
    "  --max-queue N             requests queued or running at most; more get 429\n"
    "                            (default 256)\n"
    "  --max-body SIZE           request body limit, e.g. 1MiB (default); more get 413\n"
    "  --read-timeout S          close a connection silent for S seconds (default 10)\n"
    "  --max-connections N       open connections at most (default 512)\n"
    "  --model PATH|PRESET       llama2.c checkpoint or a synthetic preset (default:\n"
    "                            stories260K when found in ./models or ../shared/models)\n"
    "  --tokenizer FILE          llama2.c tokenizer.bin (default: beside the checkpoint)\n"
    "  --dtype fp32|fp16         how weights are stored (default: the file's)\n"
    "  --quant SCHEME            quantize after loading (see servelab generate --help)\n"
    "  --synth-seed N            seed of a synthetic preset's weights\n"
    "\n"
    "Engine options (the engine's defaults):\n";

typedef struct serve_args {
    model_request request;
    engine_config engine;
    serve_config serve;
} serve_args;

static int parse_serve_args(int argc, char** argv, serve_args* args, error_info* err) {
    memset(args, 0, sizeof *args);
    args->request.synth_seed = SYNTH_DEFAULT_SEED;
    args->engine = engine_config_default();
    args->serve = serve_config_default();
    args->serve.model_name = NULL;
    arg_cursor cursor = {argc, argv, 1, "servelab serve", NULL};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        int value = 0;
        if (engine_option_match(&cursor, &args->engine, NULL, NULL, &failed, err)) {
        } else if (model_option_match(&cursor, &args->request, &failed, err)) {
        } else if (arg_match(&cursor, "--host", true, &failed, err)) {
            if (!failed) args->serve.host = cursor.value;
        } else if (arg_match(&cursor, "--port", true, &failed, err)) {
            if (!failed && parse_int_arg("--port", cursor.value, 0, 65535, &args->serve.port, err)) return -1;
        } else if (arg_match(&cursor, "--served-model-name", true, &failed, err)) {
            if (!failed) {
                if (cursor.value[0] == '\0' || strlen(cursor.value) > 200 || strpbrk(cursor.value, "\"\\\n"))
                    return error_set(err, "--served-model-name: expected 1..200 characters without quotes, "
                                          "backslashes or newlines");
                args->serve.model_name = cursor.value;
            }
        } else if (arg_match(&cursor, "--max-queue", true, &failed, err)) {
            if (!failed && parse_int_arg("--max-queue", cursor.value, 1, 1 << 20, &args->serve.max_queue, err))
                return -1;
        } else if (arg_match(&cursor, "--max-body", true, &failed, err)) {
            uint64_t bytes = 0;
            if (!failed && parse_size_arg("--max-body", cursor.value, &bytes, err)) return -1;
            if (!failed && (bytes < 1024 || bytes > (256u << 20)))
                return error_set(err, "--max-body: %s, expected 1KiB..256MiB", cursor.value);
            args->serve.max_body_bytes = (size_t)bytes;
        } else if (arg_match(&cursor, "--read-timeout", true, &failed, err)) {
            if (!failed && parse_int_arg("--read-timeout", cursor.value, 1, 3600, &args->serve.read_timeout_s, err))
                return -1;
        } else if (arg_match(&cursor, "--max-connections", true, &failed, err)) {
            if (!failed && parse_int_arg("--max-connections", cursor.value, 1, 65536, &value, err)) return -1;
            if (!failed) args->serve.max_connections = value;
        } else {
            return arg_unknown(&cursor, err);
        }
        if (failed) return -1;
    }
    return 0;
}

// The name clients give as `model`: the checkpoint's file name without
// ".bin" (stories260K), the preset's name, else "servelab".
static void default_model_name(const model_request* request, const model_source* source, char* out, size_t capacity) {
    const char* label = source->model_label;
    if (request->model_arg && !strchr(request->model_arg, '/') && !strstr(request->model_arg, ".bin"))
        label = request->model_arg; // a preset
    if (strchr(label, ' ')) label = "servelab";
    const char* base = strrchr(label, '/');
    base = base ? base + 1 : label;
    size_t n = strnlen(base, capacity - 1);
    memcpy(out, base, n);
    out[n] = '\0';
    if (n > 4 && strcmp(out + n - 4, ".bin") == 0) out[n - 4] = '\0';
    if (out[0] == '\0' || strpbrk(out, "\"\\\n")) snprintf(out, capacity, "servelab");
}

int command_serve(int argc, char** argv) {
    if (cli_answer_help(argc, argv, SERVE_USAGE, CLI_ENGINE_DEFAULTS)) return 0; // the engine's own defaults
    error_info err = {{0}};
    serve_args args;
    if (parse_serve_args(argc, argv, &args, &err)) return cli_usage_error(&err);
    model_source source;
    if (model_source_open(&source, &args.request, &err)) {
        fprintf(stderr, "servelab serve: %s\n", err.message);
        return 1;
    }
    char model_name[256];
    if (args.serve.model_name)
        snprintf(model_name, sizeof model_name, "%s", args.serve.model_name);
    else
        default_model_name(&args.request, &source, model_name, sizeof model_name);
    args.serve.model_name = model_name;

    // The server's threads inherit this mask: only the main thread takes
    // SIGINT and SIGTERM (in sigwait). A client that goes away must not
    // kill the server with SIGPIPE.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    // --speculative draft:...: the proposer, opened once and shared by every request.
    model_source draft;
    if (engine_options_open_draft(&args.engine, &args.request, &draft, &err)) {
        fprintf(stderr, "servelab serve: %s\n", err.message);
        model_source_close(&source);
        return 1;
    }

    server* s = NULL;
    if (server_start(&s, &source.model, source.tokenizer, &args.engine, &args.serve, &err)) {
        fprintf(stderr, "servelab serve: %s\n", err.message);
        model_source_close(&draft);
        model_source_close(&source);
        return 1;
    }
    printf("servelab serve: listening on http://%s%s%s:%d (model \"%s\": %s, context %d tokens%s)\n",
           strchr(args.serve.host, ':') ? "[" : "", args.serve.host, strchr(args.serve.host, ':') ? "]" : "",
           server_port(s), model_name, source.model_label, source.model.config.max_seq_len,
           source.tokenizer ? "" : ", no tokenizer: token-id prompts only");
    fflush(stdout);
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    fprintf(stderr, "servelab serve: stopping (signal %d)\n", signal_number);
    server_stop(s);
    model_source_close(&draft);
    model_source_close(&source);
    return 0;
}
