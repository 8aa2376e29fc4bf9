// servelab lab: the dashboard's flags, and opening and closing the app;
// lab/cmd/lab_app.h lists the files that run it. The data side is
// lab/ui/dashboard.c, the drawing lab/ui/panes.c.
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/model_synth.h"
#include "lab/cmd/cli.h"
#include "lab/cmd/commands.h"
#include "lab/cmd/lab_app.h"
#include "lab/common/engine_options.h"
#include "lab/common/model_source.h"

static const char LAB_USAGE[] =
    "usage: servelab [lab] [options]\n"
    "\n"
    "The dashboard: a paged engine and a contiguous one run the same requests\n"
    "in lockstep; step them one at a time or run them, and watch block tables,\n"
    "the block pool, fragmentation, memory traffic and quantization step sizes.\n"
    "Keys are listed in the help overlay (? or F1).\n"
    "\n"
    "  --model PATH|PRESET       (default: stories260K when found, else small)\n"
    "  --tokenizer FILE   --dtype fp32|fp16   --quant SCHEME\n"
    "  --prompt TEXT             a starting request (repeatable; default two prompts)\n"
    "  --max-tokens N            new tokens per request (default 96)\n"
    "  --system TEXT             the system prompt that p requests share\n"
    "  --kv paged|contiguous     which engine the requests and traffic panes follow\n"
    "  --lesson FILE             run a Lua lesson: space continues it at each pause, the\n"
    "                            panes draw its engine and the Lesson pane its checks\n"
    "  --time-limit S            the lesson's CPU seconds (default 60); Ctrl-C also stops it\n"
    "  --serve PORT              run the OpenAI-compatible server (servelab serve) inside the\n"
    "                            lab on 127.0.0.1:PORT (0: any free port; the address goes to\n"
    "                            stderr): clients' requests are the sequences in the panes, and\n"
    "                            the lab steps the server's engine, so while it is paused the\n"
    "                            clients wait (space steps, r runs)\n"
    "headless:\n"
    "  --keys KEYS               replay keys: plain characters and <space> <tab> <enter>\n"
    "                            <esc> <f1> <up> <down> <left> <right> <pgup> <pgdn>\n"
    "                            <wait:MS>, <resize:COLSxROWS> (the terminal resized) and\n"
    "                            <frame> (draw a frame now, as the terminal would)\n"
    "  --dump-frame FILE         write the final screen as UTF-8 text (- = stdout)\n"
    "  --size COLSxROWS          the virtual screen (default 160x50)\n"
    "  --quiz-seed N             the questions of the quiz page (z), for repeatable runs\n"
    "  --measure-machine         measure this CPU's bandwidth and peak FMA rate first\n"
    "                            (the terminal lab always measures, in the background)\n"
    "With --serve, <wait:MS> waits MS real milliseconds (clients are real), stepping\n"
    "in run mode whenever a request waits.\n"
    "Without --keys or --dump-frame, stdin and stdout must be a terminal (exit 2 otherwise).\n"
    "\n";

// --serve: the server on the dashboard's model, stepped by the lab.
static int start_server(lab_app* a, int port, const engine_config* config, error_info* err) {
    serve_config sc = serve_config_default();
    sc.port = port;
    sc.external_stepping = true;
    // Clients name the model by its file name without .bin, as `servelab serve` does.
    char name[sizeof a->d.source.model_label];
    const char* label = a->d.source.model_label;
    const char* base = strrchr(label, '/');
    snprintf(name, sizeof name, "%s", base ? base + 1 : label);
    char* dot = strstr(name, ".bin");
    if (dot) *dot = '\0';
    sc.model_name = name;
    snprintf(a->serve_model, sizeof a->serve_model, "%.255s", name);
    // A client that goes away mid-stream must not kill the lab (and leave the terminal raw).
    signal(SIGPIPE, SIG_IGN);
    if (server_start(&a->server, &a->d.source.model, a->d.source.tokenizer, config, &sc, err)) return -1;
    snprintf(a->d.serve_address, sizeof a->d.serve_address, "http://%s:%d", server_host(a->server),
             server_port(a->server));
    dashboard_follow_engine(&a->d, server_engine(a->server));
    fprintf(stderr, "servelab lab: serving %s (model \"%s\"); the lab steps it: space steps, r runs\n",
            a->d.serve_address, name);
    fflush(stderr);
    lab_set_message(a, "serving: paused, so clients wait; space steps, r runs");
    return 0;
}

#define LAB_MAX_PROMPTS 16

typedef struct lab_args {
    engine_config config;
    model_request request;
    const char* keys;        // --keys: the headless replay, or NULL
    const char* dump_path;   // --dump-frame, or NULL
    bool measure_machine;
    const char* lesson_path;
    float lesson_time_limit_s;
    uint64_t quiz_seed;
    const char* prompts[LAB_MAX_PROMPTS];
    int n_prompts;
    const char* system_prompt;
    int cols, rows;          // --size: the headless screen
    int max_tokens;
    int serve_port;          // -1: no server
} lab_args;

// The lab's flags into args; -1 with err (the message to print) on a bad one.
static int parse_lab_args(int argc, char** argv, lab_args* args, error_info* err) {
    *args = (lab_args){
        .config = engine_config_default(),
        .request = {NULL, NULL, MODEL_DTYPE_DEFAULT, SYNTH_DEFAULT_SEED, NULL},
        .lesson_time_limit_s = 60.0f,
        .system_prompt = "Once upon a time, there was a little girl named Lily. She lived in a small house "
                         "with her mom, her dad and her dog Max.",
        .cols = 160,
        .rows = 50,
        .max_tokens = 96,
        .serve_port = -1,
    };
    arg_cursor cursor = {argc, argv, 1, "servelab lab", NULL};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        if (engine_option_match(&cursor, &args->config, NULL, NULL, &failed, err)) {
        } else if (arg_match(&cursor, "--model", true, &failed, err)) {
            if (!failed) args->request.model_arg = cursor.value;
        } else if (arg_match(&cursor, "--tokenizer", true, &failed, err)) {
            if (!failed) args->request.tokenizer_arg = cursor.value;
        } else if (arg_match(&cursor, "--quant", true, &failed, err)) {
            if (!failed) args->request.quant = cursor.value;
        } else if (arg_match(&cursor, "--dtype", true, &failed, err)) {
            if (!failed) {
                if (strcmp(cursor.value, "fp32") == 0) args->request.dtype = MODEL_DTYPE_FP32;
                else if (strcmp(cursor.value, "fp16") == 0) args->request.dtype = MODEL_DTYPE_FP16;
                else failed = error_set(err, "--dtype: expected fp32 or fp16, found '%s'", cursor.value) != 0;
            }
        } else if (arg_match(&cursor, "--prompt", true, &failed, err)) {
            if (!failed && args->n_prompts == LAB_MAX_PROMPTS) failed = error_set(err, "--prompt: at most 16") != 0;
            else if (!failed) args->prompts[args->n_prompts++] = cursor.value;
        } else if (arg_match(&cursor, "--max-tokens", true, &failed, err)) {
            if (!failed) failed = parse_int_arg("--max-tokens", cursor.value, 1, 1 << 20, &args->max_tokens, err) != 0;
        } else if (arg_match(&cursor, "--system", true, &failed, err)) {
            if (!failed) args->system_prompt = cursor.value;
        } else if (arg_match(&cursor, "--quiz-seed", true, &failed, err)) {
            if (!failed) failed = parse_u64_arg("--quiz-seed", cursor.value, &args->quiz_seed, err) != 0;
        } else if (arg_match(&cursor, "--measure-machine", false, &failed, err)) {
            args->measure_machine = true;
        } else if (arg_match(&cursor, "--keys", true, &failed, err)) {
            if (!failed) args->keys = cursor.value;
        } else if (arg_match(&cursor, "--dump-frame", true, &failed, err)) {
            if (!failed) args->dump_path = cursor.value;
        } else if (arg_match(&cursor, "--size", true, &failed, err)) {
            if (!failed) failed = lab_parse_size(cursor.value, &args->cols, &args->rows, err) != 0;
        } else if (arg_match(&cursor, "--serve", true, &failed, err)) {
            if (!failed) failed = parse_int_arg("--serve", cursor.value, 0, 65535, &args->serve_port, err) != 0;
        } else if (arg_match(&cursor, "--lesson", true, &failed, err)) {
            if (!failed) args->lesson_path = cursor.value;
        } else if (arg_match(&cursor, "--time-limit", true, &failed, err)) {
            if (!failed)
                failed = parse_float_arg("--time-limit", cursor.value, 0.01f, 86400.0f, &args->lesson_time_limit_s,
                                         err) != 0;
        } else {
            return arg_unknown(&cursor, err);
        }
        if (failed) {
            error_info flag_err = *err;
            return error_set(err, "servelab lab: %s", flag_err.message);
        }
    }
    return 0;
}

// The terminal lab draws on stdout and reads keys from stdin: without a
// terminal on both, ncurses would write escape codes into a file, or read
// EOF forever (100% CPU, q never arrives). Checked before the model loads,
// so the refusal is instant. Returns 2 (with the message printed) or 0.
static int refuse_without_terminal(void) {
    bool in = isatty(STDIN_FILENO), out = isatty(STDOUT_FILENO);
    if (in && out) return 0;
    fprintf(stderr,
            "servelab lab: %s not a terminal; the dashboard needs one (for a headless run give --keys KEYS "
            "or --dump-frame FILE)\n",
            !in && !out ? "stdin and stdout are" : !in ? "stdin is" : "stdout is");
    return 2;
}

// The app with its engines, starting requests, server and lesson; NULL (the
// message printed, *status the exit status) when it cannot open.
static lab_app* open_lab(const lab_args* args, bool headless, int* status) {
    error_info err = {{0}};
    lab_app* a = calloc(1, sizeof *a);
    *status = 1;
    if (!a) return NULL;
    a->v.speed_index = 3; // 10 steps per second: slow enough to follow
    if (dashboard_init(&a->d, &args->request, &args->config, args->config.layout, &err)) {
        fprintf(stderr, "servelab lab: %s\n", err.message);
        free(a);
        return NULL;
    }
    snprintf(a->d.system_prompt, sizeof a->d.system_prompt, "%s", args->system_prompt);
    a->d.max_new_tokens = args->max_tokens;
    // Serving, the requests are the clients'; otherwise two to start with.
    static const char* const DEFAULT_PROMPTS[] = {"Once upon a time, there was a little girl named Lily.",
                                                  "The dog ran"};
    bool use_defaults = args->n_prompts == 0 && args->serve_port < 0;
    int n_prompts = use_defaults ? 2 : args->n_prompts;
    // The requests keep going past EOS only if asked; greedy by default so runs repeat.
    for (int i = 0; i < n_prompts; i++) {
        const char* prompt = use_defaults ? DEFAULT_PROMPTS[i] : args->prompts[i];
        if (dashboard_add_prompt(&a->d, prompt, args->max_tokens, 1, 0.0f, &err)) {
            fprintf(stderr, "servelab lab: --prompt '%s': %s\n", prompt, err.message);
            dashboard_free(&a->d);
            free(a);
            *status = 2;
            return NULL;
        }
    }
    if (args->serve_port >= 0 && start_server(a, args->serve_port, &args->config, &err)) {
        fprintf(stderr, "servelab lab: --serve %d: %s\n", args->serve_port, err.message);
        dashboard_free(&a->d);
        free(a);
        return NULL;
    }
    a->in_terminal = !headless;
    a->quiz_seed = args->quiz_seed;
    // Random weights write gibberish; the first screen says where real ones are.
    if (strncmp(a->d.source.model_label, "synthetic", 9) == 0 || strstr(a->d.source.model_label, ", synthetic"))
        lab_set_message(a, "random weights: `make models` fetches stories260K (or --model PATH)");
    if (args->lesson_path) // a broken lesson shows in its pane; the lab runs on
        lab_open_lesson(a, args->lesson_path, args->lesson_time_limit_s, &err);
    if (!headless || args->measure_machine) dashboard_measure_machine(&a->d, !headless);
    return a;
}

static void close_lab(lab_app* a) {
    dashboard_follow_engine(&a->d, NULL); // the lesson's (or the server's) engines go with it
    server_stop(a->server);               // before dashboard_free: it serves the dashboard's model
    if (a->lesson) lesson_close(a->lesson);
    if (a->quiz_loaded) quiz_app_free(&a->quiz);
    dashboard_free(&a->d);
    free(a);
}

int command_lab(int argc, char** argv) { return command_lab_watching_cuts(argc, argv, NULL, NULL); }

int command_lab_watching_cuts(int argc, char** argv, ui_cut_hook cut_hook, void* cut_hook_user) {
    if (cli_answer_help(argc, argv, LAB_USAGE, CLI_ENGINE_DEFAULTS)) return 0;
    setlocale(LC_ALL, "");
    error_info err = {{0}};
    lab_args args;
    if (parse_lab_args(argc, argv, &args, &err)) return cli_usage_error(&err);
    bool headless = args.keys || args.dump_path;
    if (!headless && refuse_without_terminal()) return 2;
    // Unless told otherwise, a pool of 128 blocks: small enough that every
    // block is a visible cell in the pool pane and that forks and new
    // requests make it fill up (the engine's 64 MiB default is 6553 blocks
    // of stories260K).
    if (args.config.num_blocks == 0 && args.config.kv_mem_bytes == engine_config_default().kv_mem_bytes)
        args.config.num_blocks = 128;
    if (args.serve_port >= 0 && args.lesson_path) {
        fprintf(stderr, "servelab lab: --serve and --lesson: a lesson drives its own engines; give one of them\n");
        return 2;
    }
    int status = 0;
    lab_app* a = open_lab(&args, headless, &status);
    if (!a) return status;
    a->cut_hook = cut_hook;
    a->cut_hook_user = cut_hook_user;
    status = headless ? lab_run_headless(a, args.keys ? args.keys : "", args.dump_path ? args.dump_path : "-",
                                         args.cols, args.rows)
                      : lab_run_terminal(a);
    close_lab(a);
    return status;
}
