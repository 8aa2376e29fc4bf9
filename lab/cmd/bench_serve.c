// servelab bench-serve: load on an OpenAI-compatible server, measured the
// way the field measures it (lab/bench/serve_load.h); this file reads the
// options and writes the report, the sweep table and its chart.
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/terminal_text.h"
#include "engine/output_file.h"
#include "engine/tokenizer.h"
#include "lab/bench/serve_load.h"
#include "lab/common/cli_args.h"
#include "lab/cmd/cli.h"
#include "lab/cmd/commands.h"
#include "lab/common/json_out.h"
#include "lab/common/progress.h"
#include "lab/bench/workload.h"

static const char BENCH_SERVE_USAGE[] =
    "usage: servelab bench-serve --url URL [options]\n"
    "\n"
    "A load generator for any OpenAI-compatible server (servelab serve, llama.cpp's\n"
    "llama-server, vLLM). Every request streams from /v1/completions (stream: true,\n"
    "stream_options.include_usage) with its prompt as token ids, temperature 0,\n"
    "max_tokens its output length and ignore_eos, so the server sees exactly the\n"
    "lengths asked for. It reports:\n"
    "  TTFT    time to first token: request sent -> first chunk carrying a token\n"
    "  TPOT    time per output token: (end - first token) / (output tokens - 1)\n"
    "  ITL     inter-token latency: the gap between consecutive chunks with tokens\n"
    "  E2E     end-to-end latency: request sent -> end of the stream\n"
    "  (each as mean, p50, p90, p99 in ms), requests and output tokens per second,\n"
    "  goodput (requests per second within --slo-ttft-ms and --slo-tpot-ms), and\n"
    "  failed requests with their reasons. Output tokens are the server's `usage`;\n"
    "  the tokens seen in the chunks are counted beside them and a difference is\n"
    "  reported.\n"
    "\n"
    "server:\n"
    "  --url URL                 http://HOST:PORT (posts to /v1/completions), or the\n"
    "                            full endpoint URL\n"
    "  --model NAME              the `model` field (default: the first of GET /v1/models)\n"
    "  --no-ignore-eos           do not send ignore_eos (for servers that refuse it)\n"
    "  --no-token-ids            do not send return_token_ids (vLLM's and servelab's: the\n"
    "                            token ids in each chunk, for an exact count); without\n"
    "                            them a non-empty chunk counts as one token\n"
    "  --timeout S               a request longer than S seconds fails (default 600)\n"
    "  --idle-timeout S          a request with no byte for S seconds fails (default 120)\n"
    "  --connect-timeout S       (default 10)\n"
    "workload:\n"
    "  --requests N              number of requests (default 64; in a sweep, for each\n"
    "                            concurrency C, max(8, 2 x C) unless given)\n"
    "  --prompt-len DIST         prompt tokens, BOS included (default 128)\n"
    "  --output-len DIST         output tokens (default 128)\n"
    "                            DIST: N | fixed:N | uniform:LOW:HIGH (inclusive) |\n"
    "                            normal:MEAN:SD | lognormal:MEAN:SD (rounded, >= 1)\n"
    "  --shared-prefix N         every prompt starts with the same N tokens after BOS,\n"
    "                            like a shared system prompt (default 0)\n"
    "  --vocab N                 random prompt ids are drawn from 3..N-1 (default 512:\n"
    "                            inside every llama2.c vocabulary)\n"
    "  --workload FILE           `sim`'s JSON Lines instead: {\"prompt\"|\"prompt_ids\",\n"
    "                            \"max_tokens\", \"arrival\"}; arrivals are used unless --rate\n"
    "  --tokenizer FILE          llama2.c tokenizer.bin for the file's text prompts\n"
    "  --seed N                  workload and arrival seed (default 1)\n"
    "load:\n"
    "  --rate R|inf              Poisson arrivals, R requests per second (default inf:\n"
    "                            all at once)\n"
    "  --concurrency C           requests in flight at most (default: no limit)\n"
    "  --sweep-concurrency LIST  one run per concurrency, e.g. 1,2,4,8,16,32: one table\n"
    "                            and a throughput-latency chart\n"
    "  --svg FILE                the sweep's chart as an SVG picture too\n"
    "  --slo-ttft-ms X           goodput counts requests with TTFT <= X ms ...\n"
    "  --slo-tpot-ms X           ... and TPOT <= X ms\n"
    "output:\n"
    "  --server-metrics          read the server's /metrics before and after each run:\n"
    "                            output tokens per engine step (servelab) and, with\n"
    "                            speculative decoding, guesses drafted and accepted and\n"
    "                            tokens per target pass (vLLM's spec_decode counters).\n"
    "                            Counts every client of the server, not only this run\n"
    "  --json                    one JSON object on stdout instead of the report\n"
    "  --progress                the progress line on stderr even when it is not a\n"
    "                            terminal\n"
    "\n"
    "Exit status: 0 when every request completed, 1 when any failed (the report\n"
    "still lists them) or the server cannot be reached, 2 for a usage error.\n";

enum { MAX_SWEEP_POINTS = 32 };

typedef struct bench_serve_args {
    const char* url;
    const char* model;
    const char* workload_path;
    const char* tokenizer_path;
    const char* svg_path;
    int n_requests; // 0: the default
    bench_length prompt_length, output_length;
    int shared_prefix;
    int vocab_size;
    bool vocab_given;
    uint64_t seed;
    double rate; // 0 = inf
    bool rate_given;
    int concurrency;
    int sweep[MAX_SWEEP_POINTS];
    int n_sweep;
    double slo_ttft_ms, slo_tpot_ms;
    bool json, progress, ignore_eos, token_ids, server_metrics;
    double timeout_s, idle_timeout_s, connect_timeout_s;
} bench_serve_args;

static int parse_positive_double(const char* flag, const char* text, double low, double high, double* out,
                                 error_info* err) {
    char* end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (end == text || *end != '\0' || errno || !isfinite(value) || value < low || value > high)
        return error_set(err, "%s: expected a number %g..%g, found '%s'", flag, low, high, text);
    *out = value;
    return 0;
}

static int parse_sweep(const char* text, bench_serve_args* args, error_info* err) {
    const char* p = text;
    args->n_sweep = 0;
    while (*p) {
        char* end = NULL;
        errno = 0;
        long value = strtol(p, &end, 10);
        if (end == p || errno || value < 1 || value > 4096 || (*end != ',' && *end != '\0') ||
            args->n_sweep == MAX_SWEEP_POINTS)
            return error_set(err,
                             "--sweep-concurrency: expected up to %d comma-separated concurrencies 1..4096 (e.g. "
                             "1,2,4,8), found '%s'",
                             MAX_SWEEP_POINTS, text);
        args->sweep[args->n_sweep++] = (int)value;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && *p == '\0') return error_set(err, "--sweep-concurrency: a trailing comma in '%s'", text);
    }
    if (args->n_sweep == 0) return error_set(err, "--sweep-concurrency: expected a list such as 1,2,4,8");
    return 0;
}

// Each parse_*_option below looks at argv[c->index]: 1 when it was one of
// its options (the value stored in args), 0 when it was not, -1 on an error
// (in err).

// `flag` with its value (in c->value): 1; another argument: 0; the value missing: -1.
static int value_option(arg_cursor* c, const char* flag, error_info* err) {
    bool failed = false;
    if (!arg_match(c, flag, true, &failed, err)) return 0;
    return failed ? -1 : 1;
}

// The server's URL and model name, and paths, kept as given.
static int parse_text_option(arg_cursor* c, bench_serve_args* args, error_info* err) {
    const struct {
        const char* flag;
        const char** field;
    } TEXTS[] = {
        {"--url", &args->url},
        {"--workload", &args->workload_path},
        {"--tokenizer", &args->tokenizer_path},
        {"--svg", &args->svg_path},
    };
    for (size_t i = 0; i < sizeof TEXTS / sizeof TEXTS[0]; i++) {
        int matched = value_option(c, TEXTS[i].flag, err);
        if (matched > 0) *TEXTS[i].field = c->value;
        if (matched) return matched;
    }
    int matched = value_option(c, "--model", err);
    if (matched <= 0) return matched;
    if (!c->value[0] || strlen(c->value) > 200) return error_set(err, "--model: expected 1..200 characters");
    args->model = c->value;
    return 1;
}

// Whole numbers, each in its range, and the seed.
static int parse_count_option(arg_cursor* c, bench_serve_args* args, error_info* err) {
    const struct {
        const char* flag;
        long low, high;
        int* field;
        bool* given; // NULL, or set when the option is given
    } COUNTS[] = {
        {"--requests", 1, 1000000, &args->n_requests, NULL},
        {"--shared-prefix", 0, 1 << 20, &args->shared_prefix, NULL},
        {"--vocab", 4, 1 << 24, &args->vocab_size, &args->vocab_given},
        {"--concurrency", 1, 4096, &args->concurrency, NULL},
    };
    for (size_t i = 0; i < sizeof COUNTS / sizeof COUNTS[0]; i++) {
        int matched = value_option(c, COUNTS[i].flag, err);
        if (matched < 0) return -1;
        if (matched == 0) continue;
        if (parse_int_arg(COUNTS[i].flag, c->value, COUNTS[i].low, COUNTS[i].high, COUNTS[i].field, err)) return -1;
        if (COUNTS[i].given) *COUNTS[i].given = true;
        return 1;
    }
    int matched = value_option(c, "--seed", err);
    if (matched <= 0) return matched;
    if (parse_u64_arg("--seed", c->value, &args->seed, err)) return -1;
    return 1;
}

// Real numbers, each in its range (the SLOs and timeouts), and --rate: R or inf.
static int parse_real_option(arg_cursor* c, bench_serve_args* args, error_info* err) {
    const struct {
        const char* flag;
        double low, high;
        double* field;
    } REALS[] = {
        {"--slo-ttft-ms", 1e-3, 1e9, &args->slo_ttft_ms},
        {"--slo-tpot-ms", 1e-3, 1e9, &args->slo_tpot_ms},
        {"--timeout", 0.1, 86400, &args->timeout_s},
        {"--idle-timeout", 1, 86400, &args->idle_timeout_s},
        {"--connect-timeout", 0.1, 3600, &args->connect_timeout_s},
    };
    for (size_t i = 0; i < sizeof REALS / sizeof REALS[0]; i++) {
        int matched = value_option(c, REALS[i].flag, err);
        if (matched < 0) return -1;
        if (matched == 0) continue;
        if (parse_positive_double(REALS[i].flag, c->value, REALS[i].low, REALS[i].high, REALS[i].field, err)) return -1;
        return 1;
    }
    int matched = value_option(c, "--rate", err);
    if (matched <= 0) return matched;
    args->rate_given = true;
    if (strcmp(c->value, "inf") == 0)
        args->rate = 0;
    else if (parse_positive_double("--rate", c->value, 1e-6, 1e6, &args->rate, err))
        return error_set(err, "--rate: expected requests per second (> 0, at most 1e6) or inf, found '%s'", c->value);
    return 1;
}

// The length distributions and the sweep's list of concurrencies.
static int parse_shape_option(arg_cursor* c, bench_serve_args* args, error_info* err) {
    int matched = value_option(c, "--prompt-len", err);
    if (matched > 0 && bench_length_parse("--prompt-len", c->value, &args->prompt_length, err)) return -1;
    if (matched) return matched;
    matched = value_option(c, "--output-len", err);
    if (matched > 0 && bench_length_parse("--output-len", c->value, &args->output_length, err)) return -1;
    if (matched) return matched;
    matched = value_option(c, "--sweep-concurrency", err);
    if (matched > 0 && parse_sweep(c->value, args, err)) return -1;
    return matched;
}

// The options without a value.
static int parse_switch_option(arg_cursor* c, bench_serve_args* args, error_info* err) {
    const struct {
        const char* flag;
        bool* field;
        bool value;
    } SWITCHES[] = {
        {"--json", &args->json, true},
        {"--progress", &args->progress, true},
        {"--no-ignore-eos", &args->ignore_eos, false},
        {"--no-token-ids", &args->token_ids, false},
        {"--server-metrics", &args->server_metrics, true},
    };
    bool failed = false; // never set: a switch takes no value
    for (size_t i = 0; i < sizeof SWITCHES / sizeof SWITCHES[0]; i++)
        if (arg_match(c, SWITCHES[i].flag, false, &failed, err)) {
            *SWITCHES[i].field = SWITCHES[i].value;
            return 1;
        }
    return 0;
}

// One option (with its value); -1 on an error or an unknown option.
static int parse_option(arg_cursor* c, bench_serve_args* args, error_info* err) {
    int (*const PARSERS[])(arg_cursor*, bench_serve_args*, error_info*) = {
        parse_text_option, parse_count_option, parse_real_option, parse_shape_option, parse_switch_option,
    };
    for (size_t i = 0; i < sizeof PARSERS / sizeof PARSERS[0]; i++) {
        int matched = PARSERS[i](c, args, err);
        if (matched) return matched < 0 ? -1 : 0;
    }
    return arg_unknown(c, err);
}

static int parse_args(int argc, char** argv, bench_serve_args* args, error_info* err) {
    memset(args, 0, sizeof *args);
    args->prompt_length = (bench_length){BENCH_LENGTH_FIXED, 128, 0};
    args->output_length = (bench_length){BENCH_LENGTH_FIXED, 128, 0};
    args->vocab_size = 512;
    args->seed = 1;
    args->ignore_eos = args->token_ids = true;
    args->timeout_s = 600, args->idle_timeout_s = 120, args->connect_timeout_s = 10;
    arg_cursor cursor = {argc, argv, 1, "servelab bench-serve", NULL};
    for (; cursor.index < argc; cursor.index++)
        if (parse_option(&cursor, args, err)) return -1;
    if (!args->url) return error_set(err, "servelab bench-serve: --url is required (e.g. --url http://127.0.0.1:8000)");
    if (args->n_sweep && args->concurrency)
        return error_set(err, "servelab bench-serve: give --concurrency or --sweep-concurrency, not both");
    if (args->svg_path && !args->n_sweep)
        return error_set(err, "--svg: draws the sweep's chart; give --sweep-concurrency too");
    if (args->tokenizer_path && !args->workload_path)
        return error_set(err, "--tokenizer: only encodes the text prompts of a --workload file");
    return 0;
}

// ---- the workload -------------------------------------------------------------

// The file's text prompts are encoded up to this many tokens each.
enum { FILE_MAX_PROMPT_TOKENS = 16384 };

static int load_workload(const bench_serve_args* args, int n_requests, bench_workload* out, error_info* err) {
    if (!args->workload_path) {
        bench_workload_spec spec = {n_requests,          args->prompt_length, args->output_length,
                                    args->shared_prefix, args->vocab_size,    args->seed};
        if (bench_workload_generate(out, &spec, err)) return -1;
        bench_workload_set_arrivals(out, args->rate, args->seed);
        return 0;
    }
    tokenizer* tok = NULL;
    if (args->tokenizer_path && tok_load(&tok, args->tokenizer_path, 0, err)) return -1;
    workload file;
    // Without --vocab, ids are checked only against 2^24: the server checks them against its model.
    int status = workload_read(&file, args->workload_path, tok, args->vocab_given ? args->vocab_size : 1 << 24,
                               FILE_MAX_PROMPT_TOKENS, err);
    if (status == 0) {
        status = bench_workload_take(out, &file, err);
        workload_free(&file);
    }
    tok_free(tok);
    if (status == 0 && args->rate_given) bench_workload_set_arrivals(out, args->rate, args->seed);
    return status;
}

// ---- the progress line ----------------------------------------------------------

typedef struct progress_context {
    progress* line;
    char detail[96];
} progress_context;

static void on_progress(void* user, int finished, int failed, int total) {
    progress_context* c = user;
    char detail[160];
    snprintf(detail, sizeof detail, "%s%s%d failed", c->detail, c->detail[0] ? ", " : "", failed);
    progress_set(c->line, detail, finished, total, "requests finished");
}

// ---- the report -------------------------------------------------------------------

static void print_stat_row(const char* name, const bench_stat* s) {
    printf("  %-6s %10.2f %10.2f %10.2f %10.2f\n", name, s->mean, s->p50, s->p90, s->p99);
}

static void print_failures(const bench_summary* s) {
    if (s->failed == 0) return;
    printf("failed requests, by reason:\n");
    for (int i = 0; i < s->n_reasons; i++)
        printf("  %4d  %s\n", s->reason_counts[i], s->reasons[i]);
    if (s->other_reasons) printf("  %4d  (other reasons)\n", s->other_reasons);
}

static void print_token_check(const bench_summary* s) {
    if (s->completed == 0) return;
    if (s->token_mismatches)
        printf("token check: %d of %d requests differ between usage and chunks (%s)\n", s->token_mismatches,
               s->completed, s->first_mismatch);
    else if (s->usage_missing == s->completed)
        printf("token check: the server sent no usage; output tokens counted from the chunks\n");
    else
        printf("token check: usage matches the tokens in the chunks in every request%s\n",
               s->usage_missing ? " that had usage" : "");
    if (s->short_outputs)
        printf("note: %d requests ended before max_tokens (the server stopped at EOS or a limit)\n", s->short_outputs);
}

// The server's steps during the run (--server-metrics): what it counted, or
// why a figure is missing.
static void print_server_steps(const bench_server_steps* t) {
    if (!t->measured) {
        printf("server        its /metrics could not be read (see the warning above)\n");
        return;
    }
    if (t->tokens_per_step >= 0)
        printf("server        %.0f engine steps, %.0f tokens generated: %.3f tokens per step\n", t->engine_steps,
               t->generation_tokens, t->tokens_per_step);
    else
        printf("server        no engine step count in its /metrics (servelab:engine_steps_total)\n");
    if (t->spec_drafts > 0)
        printf("speculation   %.0f target passes verified %.0f guesses, %.0f kept (%.1f%%): %.3f tokens per target "
               "pass\n",
               t->spec_drafts, t->spec_draft_tokens, t->spec_accepted_tokens, 100.0 * t->acceptance_rate,
               t->tokens_per_target_pass);
    else if (t->spec_drafts == 0)
        printf("speculation   on, but no guesses were verified during the run\n");
    else
        printf("speculation   off (no vllm:spec_decode counters)\n");
}

static void print_report(const bench_summary* s, const char* url, const char* model, const bench_serve_args* args,
                         int concurrency, const bench_server_steps* steps) {
    char rate[32], limit[32];
    snprintf(rate, sizeof rate, args->rate > 0 ? "%g/s" : "inf", args->rate);
    snprintf(limit, sizeof limit, concurrency > 0 ? "%d" : "no limit", concurrency);
    printf("servelab bench-serve: %s (model %s)\n", url, model);
    printf("load: %d requests, rate %s, concurrency %s\n\n", s->n_requests, rate, limit);
    printf("requests      %d completed, %d failed, in %.2f s\n", s->completed, s->failed, s->duration_s);
    printf("tokens        %lld prompt, %lld output\n", s->prompt_tokens, s->output_tokens);
    printf("throughput    %.2f requests/s, %.1f output tokens/s, %.1f total tokens/s\n", s->request_throughput,
           s->output_throughput, s->total_token_throughput);
    if (s->slo_ttft_ms > 0 || s->slo_tpot_ms > 0)
        printf("goodput       %.2f requests/s (%d of %d within TTFT <= %g ms, TPOT <= %g ms; 0 = no limit)\n",
               s->goodput, s->good_requests, s->n_requests, s->slo_ttft_ms, s->slo_tpot_ms);
    printf("\n  %-6s %10s %10s %10s %10s  (ms)\n", "", "mean", "p50", "p90", "p99");
    print_stat_row("TTFT", &s->ttft_ms);
    print_stat_row("TPOT", &s->tpot_ms);
    print_stat_row("ITL", &s->itl_ms);
    print_stat_row("E2E", &s->e2e_ms);
    printf("\n");
    if (args->server_metrics) {
        print_server_steps(steps);
        printf("\n");
    }
    print_token_check(s);
    print_failures(s);
}

// The sweep as a markdown table (ready to paste).
static void print_sweep_table(const bench_summary* points, const int* concurrency, int n) {
    printf("| concurrency | requests | failed | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | "
           "TPOT p99 ms | ITL p99 ms | E2E p50 ms |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const bench_summary* s = &points[i];
        printf("| %d | %d | %d | %.2f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.1f |\n", concurrency[i],
               s->n_requests, s->failed, s->request_throughput, s->output_throughput, s->ttft_ms.p50, s->ttft_ms.p99,
               s->tpot_ms.p50, s->tpot_ms.p99, s->itl_ms.p99, s->e2e_ms.p50);
    }
}

// ---- the chart: output tokens/s (x) against TPOT p50 (y) ----------------------------

enum { CHART_WIDTH = 60, CHART_HEIGHT = 16 };

// The axis' top: a round number (1, 2 or 5 times a power of ten) at or above value.
static double nice_ceiling(double value) {
    if (!(value > 0)) return 1.0;
    double power = pow(10.0, floor(log10(value)));
    for (int k = 0; k < 3; k++) {
        static const double STEPS[] = {1, 2, 5};
        if (STEPS[k] * power >= value) return STEPS[k] * power;
    }
    return 10.0 * power;
}

// The chart's axis ends: output tokens/s (x) and TPOT p50 in ms (y), 5%
// above the largest point, rounded up to a round number.
static void chart_axes(const bench_summary* points, int n, double* x_max, double* y_max) {
    *x_max = 0;
    *y_max = 0;
    for (int i = 0; i < n; i++) {
        if (points[i].output_throughput > *x_max) *x_max = points[i].output_throughput;
        if (points[i].tpot_ms.p50 > *y_max) *y_max = points[i].tpot_ms.p50;
    }
    *x_max = nice_ceiling(*x_max * 1.05);
    *y_max = nice_ceiling(*y_max * 1.05);
}

static void print_chart(const bench_summary* points, const int* concurrency, int n) {
    double x_max, y_max;
    chart_axes(points, n, &x_max, &y_max);
    char grid[CHART_HEIGHT][CHART_WIDTH + 1];
    for (int r = 0; r < CHART_HEIGHT; r++) {
        memset(grid[r], ' ', CHART_WIDTH);
        grid[r][CHART_WIDTH] = '\0';
    }
    for (int i = 0; i < n; i++) {
        int column = (int)lround(points[i].output_throughput / x_max * (CHART_WIDTH - 1));
        int row = CHART_HEIGHT - 1 - (int)lround(points[i].tpot_ms.p50 / y_max * (CHART_HEIGHT - 1));
        if (column < 0 || column >= CHART_WIDTH || row < 0 || row >= CHART_HEIGHT) continue;
        char label[16];
        int length = snprintf(label, sizeof label, "*%d", concurrency[i]);
        if (column + length > CHART_WIDTH) column = CHART_WIDTH - length;
        memcpy(&grid[row][column], label, (size_t)length);
    }
    printf("\nTPOT p50 (ms) against output tokens/s; each point is *concurrency\n");
    for (int r = 0; r < CHART_HEIGHT; r++) {
        double y = y_max * (CHART_HEIGHT - 1 - r) / (CHART_HEIGHT - 1);
        if (r % 5 == 0 || r == CHART_HEIGHT - 1)
            printf("%9.4g |%s\n", y, grid[r]);
        else
            printf("%9s |%s\n", "", grid[r]);
    }
    printf("%9s +", "");
    for (int c = 0; c < CHART_WIDTH; c++)
        putchar(c % 15 == 0 ? '+' : '-');
    printf("\n%9s ", "");
    for (int c = 0; c < CHART_WIDTH; c += 15) // whole tokens/s from 100 up: "10169", not "1.017e+04"
        printf(x_max >= 100 ? "%-15.0f" : "%-15.4g", x_max * c / (CHART_WIDTH - 1));
    printf("\n%9s %*s\n", "", CHART_WIDTH, "output tokens/s");
}

static int write_svg(const char* path, const bench_summary* points, const int* concurrency, int n, const char* title,
                     error_info* err) {
    // output_file: a new temporary beside path (path.tmp was a fixed name,
    // opened through any link planted there), then rename.
    output_file out;
    error_info file_err = {{0}};
    if (output_file_open(&out, path, &file_err)) return error_set(err, "--svg: %s", file_err.message);
    FILE* f = out.stream;
    const double width = 640, height = 420, left = 70, right = 20, top = 40, bottom = 60;
    double x_max, y_max;
    chart_axes(points, n, &x_max, &y_max);
    double plot_w = width - left - right, plot_h = height - top - bottom;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" font-family=\"sans-serif\" "
            "font-size=\"12\">\n",
            width, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%g\" y=\"22\" font-size=\"14\">", left);
    for (const char* c = title; *c; c++) { // escaped: the URL is user text
        if (*c == '<')
            fputs("&lt;", f);
        else if (*c == '>')
            fputs("&gt;", f);
        else if (*c == '&')
            fputs("&amp;", f);
        else if ((unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7F)
            fputc(*c, f);
    }
    fprintf(f, "</text>\n");
    for (int k = 0; k <= 5; k++) {
        double x = left + plot_w * k / 5, y = top + plot_h * (5 - k) / 5;
        fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#ddd\"/>\n", left, y, left + plot_w, y);
        fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#ddd\"/>\n", x, top, x, top + plot_h);
        fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%.4g</text>\n", left - 6, y + 4, y_max * k / 5);
        fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%.4g</text>\n", x, top + plot_h + 18, x_max * k / 5);
    }
    fprintf(f, "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"black\"/>\n", left, top,
            plot_w, plot_h);
    fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">output tokens/s</text>\n", left + plot_w / 2,
            height - 16);
    fprintf(f, "<text transform=\"translate(18 %g) rotate(-90)\" text-anchor=\"middle\">TPOT p50 (ms)</text>\n",
            top + plot_h / 2);
    fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"");
    for (int i = 0; i < n; i++)
        fprintf(f, "%.1f,%.1f ", left + plot_w * points[i].output_throughput / x_max,
                top + plot_h * (1 - points[i].tpot_ms.p50 / y_max));
    fprintf(f, "\"/>\n");
    for (int i = 0; i < n; i++) {
        double x = left + plot_w * points[i].output_throughput / x_max;
        double y = top + plot_h * (1 - points[i].tpot_ms.p50 / y_max);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#1f77b4\"/>\n", x, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">c=%d</text>\n", x + 6, y - 6, concurrency[i]);
    }
    fprintf(f, "</svg>\n");
    if (output_file_commit(&out, ferror(f) != 0, &file_err)) return error_set(err, "--svg: %s", file_err.message);
    return 0;
}

// ---- JSON ---------------------------------------------------------------------------

static json_t* stat_json(const bench_stat* s) {
    return json_pack("{s:i, s:o, s:o, s:o, s:o}", "n", s->n, "mean", json_out_rounded(s->mean, 3, 0), "p50",
                     json_out_rounded(s->p50, 3, 0), "p90", json_out_rounded(s->p90, 3, 0), "p99",
                     json_out_rounded(s->p99, 3, 0));
}

// A ratio or count of --server-metrics, or null where it is missing (-1).
static json_t* steps_number(double value, int digits) {
    return value < 0 ? json_null() : json_out_rounded(value, digits, 0);
}

static json_t* server_steps_json(const bench_server_steps* t) {
    if (!t->measured) return json_null();
    return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "engine_steps", steps_number(t->engine_steps, 0),
                     "generation_tokens", steps_number(t->generation_tokens, 0), "tokens_per_step",
                     steps_number(t->tokens_per_step, 4), "spec_drafts", steps_number(t->spec_drafts, 0),
                     "spec_draft_tokens", steps_number(t->spec_draft_tokens, 0), "spec_accepted_tokens",
                     steps_number(t->spec_accepted_tokens, 0), "acceptance_rate", steps_number(t->acceptance_rate, 4),
                     "tokens_per_target_pass", steps_number(t->tokens_per_target_pass, 4));
}

static json_t* summary_json(const bench_summary* s, int concurrency, const bench_server_steps* steps) {
    json_t* failures = json_array();
    for (int i = 0; i < s->n_reasons; i++)
        json_out_append(&failures,
                        json_pack("{s:o, s:i}", "reason", json_out_text(s->reasons[i]), "count", s->reason_counts[i]));
    if (s->other_reasons)
        json_out_append(&failures, json_pack("{s:s, s:i}", "reason", "(other reasons)", "count", s->other_reasons));
    json_t* run =
        json_pack("{s:i, s:i, s:i, s:i, s:o, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "concurrency", concurrency,
                  "requests", s->n_requests, "completed", s->completed, "failed", s->failed, "duration_s",
                  json_out_rounded(s->duration_s, 4, 0), "prompt_tokens", (json_int_t)s->prompt_tokens, "output_tokens",
                  (json_int_t)s->output_tokens, "request_throughput", json_out_rounded(s->request_throughput, 4, 0),
                  "output_throughput", json_out_rounded(s->output_throughput, 3, 0), "total_token_throughput",
                  json_out_rounded(s->total_token_throughput, 3, 0), "ttft_ms", stat_json(&s->ttft_ms), "tpot_ms",
                  stat_json(&s->tpot_ms), "itl_ms", stat_json(&s->itl_ms), "e2e_ms", stat_json(&s->e2e_ms));
    if (!run || !failures) {
        json_decref(run);
        json_decref(failures);
        return NULL;
    }
    json_object_set_new(run, "goodput",
                        json_pack("{s:o, s:o, s:i, s:o}", "slo_ttft_ms", json_out_rounded(s->slo_ttft_ms, 3, 0),
                                  "slo_tpot_ms", json_out_rounded(s->slo_tpot_ms, 3, 0), "good_requests",
                                  s->good_requests, "requests_per_s", json_out_rounded(s->goodput, 4, 0)));
    json_object_set_new(run, "token_check",
                        json_pack("{s:i, s:i, s:i, s:o}", "mismatches", s->token_mismatches, "usage_missing",
                                  s->usage_missing, "short_outputs", s->short_outputs, "first_mismatch",
                                  s->token_mismatches ? json_out_text(s->first_mismatch) : json_null()));
    json_object_set_new(run, "failures", failures);
    if (steps) json_object_set_new(run, "server_metrics", server_steps_json(steps));
    return run;
}

// ---- the command ----------------------------------------------------------------------

// The requests one point sends when --requests is not given: 64, or in a
// sweep twice the concurrency (at least 8): about two for each client.
static int requests_for(const bench_serve_args* args, int concurrency) {
    if (args->n_requests) return args->n_requests;
    if (!args->n_sweep) return 64;
    return 2 * concurrency > 8 ? 2 * concurrency : 8;
}

// One point of the run (one concurrency) into *point. Returns 0, or the exit
// status with the message printed (2: the workload is bad; 1: the run failed).
static int run_point(const bench_serve_args* args, const char* base, const char* completions, const char* model,
                     int concurrency, progress_context* context, bench_summary* point, bench_server_steps* steps) {
    error_info err = {{0}};
    bench_server_counters before, after;
    bool counted = args->server_metrics;
    memset(steps, 0, sizeof *steps);
    if (counted && bench_fetch_counters(base, args->connect_timeout_s, &before, &err)) {
        fprintf(stderr, "servelab bench-serve: warning: %s\n", err.message);
        counted = false;
    }
    bench_workload w;
    if (load_workload(args, requests_for(args, concurrency), &w, &err)) {
        progress_finish(context->line);
        context->line = NULL;
        fprintf(stderr, "servelab bench-serve: %s\n", err.message);
        return 2;
    }
    on_progress(context, 0, 0, w.n_requests);
    bench_client_config config = {
        completions,          model,           concurrency, args->ignore_eos, args->token_ids, args->connect_timeout_s,
        args->idle_timeout_s, args->timeout_s, on_progress, context};
    bench_run run;
    int status = bench_run_workload(&config, &w, &run, &err);
    if (status == 0) status = bench_summarize(&run, args->slo_ttft_ms, args->slo_tpot_ms, point, &err);
    if (status == 0 && counted) {
        error_info metrics_err = {{0}};
        if (bench_fetch_counters(base, args->connect_timeout_s, &after, &metrics_err))
            fprintf(stderr, "servelab bench-serve: warning: %s\n", metrics_err.message);
        else
            bench_server_steps_between(&before, &after, steps);
    }
    bench_run_free(&run);
    bench_workload_free(&w);
    if (status) {
        progress_finish(context->line);
        context->line = NULL;
        fprintf(stderr, "servelab bench-serve: %s\n", err.message);
        return 1;
    }
    return 0;
}

// The report: JSON (taking runs), one run's text, or the sweep's table and
// chart. The JSON names the model exactly; the text shows model_shown, its
// terminal-safe form. Returns 1 when the JSON could not be printed, else 0.
static int print_results(const bench_serve_args* args, const bench_summary* points, const int* concurrency,
                         const bench_server_steps* steps, int n_points, const char* completions, const char* model,
                         const char* model_shown, json_t* runs) {
    if (args->json) {
        json_t* root = json_pack("{s:o, s:o, s:o}", "url", json_out_text(completions), "model", json_out_text(model),
                                 "runs", runs);
        // ENSURE_ASCII: the exact model id, with U+009B (CSI) written as \u009b
        // rather than bytes a terminal would obey; Jansson escapes C0 already.
        return json_out_print(root, JSON_INDENT(2) | JSON_ENSURE_ASCII, "bench-serve") ? 1 : 0;
    }
    json_decref(runs);
    if (!args->n_sweep) {
        print_report(&points[0], completions, model_shown, args, concurrency[0], &steps[0]);
        return 0;
    }
    printf("servelab bench-serve: %s (model %s)\n\n", completions, model_shown);
    print_sweep_table(points, concurrency, n_points);
    print_chart(points, concurrency, n_points);
    for (int p = 0; p < n_points && args->server_metrics; p++) {
        printf("\nconcurrency %d:\n", concurrency[p]);
        print_server_steps(&steps[p]);
    }
    for (int p = 0; p < n_points; p++)
        if (points[p].failed || points[p].token_mismatches) {
            printf("\nconcurrency %d:\n", concurrency[p]);
            print_token_check(&points[p]);
            print_failures(&points[p]);
        }
    return 0;
}

// One line on stderr when requests failed: all of them, or how many.
static void report_failed_requests(const bench_summary* points, int n_points) {
    int completed = 0, requested = 0;
    for (int p = 0; p < n_points; p++) {
        completed += points[p].completed;
        requested += points[p].n_requests;
    }
    if (completed == 0)
        fprintf(stderr, "servelab bench-serve: every request failed (%s)\n",
                points[0].n_reasons ? points[0].reasons[0] : "no reason");
    else if (completed < requested)
        fprintf(stderr, "servelab bench-serve: %d of %d requests failed\n", requested - completed, requested);
}

int command_bench_serve(int argc, char** argv) {
    if (cli_answer_help(argc, argv, BENCH_SERVE_USAGE, NULL)) return 0;
    error_info err = {{0}};
    bench_serve_args args;
    if (parse_args(argc, argv, &args, &err)) return cli_usage_error(&err);
    char base[1100], completions[1100];
    if (bench_url_parse(args.url, base, sizeof base, completions, sizeof completions, &err)) {
        fprintf(stderr, "servelab bench-serve: %s\n", err.message);
        return 2;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "servelab bench-serve: libcurl could not start (curl_global_init)\n");
        return 1;
    }
    int exit_status = 0;
    char model[256];
    if (args.model)
        snprintf(model, sizeof model, "%s", args.model);
    else if (bench_fetch_model_name(base, args.connect_timeout_s + 20, model, sizeof model, &err)) {
        fprintf(stderr, "servelab bench-serve: %s\n", err.message);
        curl_global_cleanup();
        return 1;
    }
    // The server chose this name: ESC or U+009B in it would drive the
    // terminal. Requests still send it exactly as the server gave it.
    char model_shown[sizeof model];
    snprintf(model_shown, sizeof model_shown, "%s", model);
    terminal_text_clean(model_shown);
    int n_points = args.n_sweep ? args.n_sweep : 1;
    int concurrency[MAX_SWEEP_POINTS];
    bench_summary* points = calloc((size_t)n_points, sizeof *points);
    bench_server_steps steps[MAX_SWEEP_POINTS];
    json_t* runs = json_array();
    if (!points || !runs) {
        fprintf(stderr, "servelab bench-serve: out of memory\n");
        free(points);
        json_decref(runs);
        curl_global_cleanup();
        return 1;
    }
    progress_context context = {progress_start("servelab bench-serve", args.progress), ""};
    for (int p = 0; p < n_points; p++) {
        concurrency[p] = args.n_sweep ? args.sweep[p] : args.concurrency;
        if (args.n_sweep)
            snprintf(context.detail, sizeof context.detail, "concurrency %d (%d of %d)", concurrency[p], p + 1,
                     n_points);
        int status = run_point(&args, base, completions, model, concurrency[p], &context, &points[p], &steps[p]);
        if (status) {
            exit_status = status;
            break;
        }
        if (points[p].failed) exit_status = 1; // failed requests: the sweep goes on, the status says so
        json_out_append(&runs, summary_json(&points[p], concurrency[p], args.server_metrics ? &steps[p] : NULL));
    }
    progress_finish(context.line);
    if (exit_status == 2 || (exit_status == 1 && !runs)) {
        free(points);
        json_decref(runs);
        curl_global_cleanup();
        return exit_status;
    }
    if (print_results(&args, points, concurrency, steps, n_points, completions, model, model_shown, runs))
        exit_status = 1;
    if (args.svg_path) {
        char title[1400];
        snprintf(title, sizeof title, "servelab bench-serve: %s (%s)", completions, model);
        if (write_svg(args.svg_path, points, concurrency, n_points, title, &err)) {
            fprintf(stderr, "servelab bench-serve: %s\n", err.message);
            exit_status = 1;
        }
    }
    report_failed_requests(points, n_points);
    free(points);
    curl_global_cleanup();
    return exit_status;
}
