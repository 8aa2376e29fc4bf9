#include "lab/bench/peer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/model_synth.h"
#include "kernels/cpu/machine_probe.h"
#include "lab/bench/bench.h"
#include "lab/common/model_source.h"

extern char** environ;

// The formats of the comparison, in the table's order, by llama-quantize's names.
#define N_FORMATS 4
static const char* const FORMATS[N_FORMATS] = {"f32", "f16", "q8_0", "q4_0"};

// Decode runs from BOS alone, as llama-bench's tg test does (positions 0..n-1).
#define DECODE_TOKENS 128
#define QUICK_DECODE_TOKENS 16
static const int PREFILL_TOKENS[2] = {128, 512};
// Batch-16 rows: 16 sequences, each an 8-token prompt, then the decode.
#define BATCH_SEQUENCES 16
#define BATCH_PROMPT_TOKENS 8

typedef struct peer_file {
    char path[1024];
    bool found;
} peer_file;

// ---- which file is which format ----------------------------------------------------

// The format named in the file's base name (the last of f32, f16, q8_0, q4_0
// in it), or -1.
static int format_of_name(const char* path) {
    const char* base = strrchr(path, '/');
    base = base ? base + 1 : path;
    int found = -1;
    size_t at_found = 0;
    for (int f = 0; f < N_FORMATS; f++)
        for (const char* at = base; (at = strcasestr(at, FORMATS[f])) != NULL; at++)
            if (found < 0 || (size_t)(at - base) >= at_found) {
                found = f;
                at_found = (size_t)(at - base);
            }
    return found;
}

static bool ends_with_gguf(const char* name) {
    size_t n = strlen(name);
    return n > 5 && strcasecmp(name + n - 5, ".gguf") == 0;
}

static int compare_names(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

// Fills files (N_FORMATS) from a directory (its *.gguf, the first by name
// of each format) or from paths separated by commas.
static int find_files(const char* models, peer_file* files, error_info* err) {
    memset(files, 0, N_FORMATS * sizeof *files);
    DIR* dir = opendir(models);
    if (dir) {
        char* names[256];
        int n = 0;
        for (struct dirent* entry; (entry = readdir(dir)) != NULL && n < 256;)
            if (ends_with_gguf(entry->d_name) && format_of_name(entry->d_name) >= 0) names[n++] = strdup(entry->d_name);
        closedir(dir);
        qsort(names, (size_t)n, sizeof names[0], compare_names);
        for (int i = 0; i < n; i++) {
            int f = names[i] ? format_of_name(names[i]) : -1;
            if (f >= 0 && !files[f].found) {
                snprintf(files[f].path, sizeof files[f].path, "%s/%s", models, names[i]);
                files[f].found = true;
            }
            free(names[i]);
        }
    } else {
        const char* at = models;
        while (*at) {
            size_t length = strcspn(at, ",");
            char path[1024];
            snprintf(path, sizeof path, "%.*s", (int)length, at);
            int f = format_of_name(path);
            if (f < 0)
                return error_set(err, "--peer-models: %s: expected f32, f16, q8_0 or q4_0 in the file name", path);
            snprintf(files[f].path, sizeof files[f].path, "%s", path);
            files[f].found = true;
            at += length + (at[length] == ',');
        }
    }
    for (int f = 0; f < N_FORMATS; f++)
        if (files[f].found) return 0;
    return error_set(err, "--peer-models %s: no GGUF file named for f32, f16, q8_0 or q4_0", models);
}

// ---- running the peer ----------------------------------------------------------------

// Runs argv (argv[0] a path), its stderr to /dev/null, and returns its
// stdout in *out (malloc'd, NUL-terminated). -1 with err when it cannot
// start or does not exit with 0.
static int run_capture(char* const* argv, char** out, error_info* err) {
    *out = NULL;
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return error_set(err, "%s: cannot make a pipe: %s", argv[0], strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
    pid_t pid;
    int status = posix_spawn(&pid, argv[0], &actions, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(pipe_fds[1]);
    if (status != 0) {
        close(pipe_fds[0]);
        return error_set(err, "%s: cannot run it: %s", argv[0], strerror(status));
    }
    size_t size = 0, capacity = 1 << 16;
    char* text = malloc(capacity);
    for (ssize_t got = 1; text && got > 0;) {
        if (size + 1 == capacity) {
            char* bigger = realloc(text, capacity * 2);
            if (!bigger) {
                free(text);
                text = NULL;
                break;
            }
            text = bigger;
            capacity *= 2;
        }
        got = read(pipe_fds[0], text + size, capacity - 1 - size);
        if (got > 0) size += (size_t)got;
        if (got < 0 && errno == EINTR) got = 1;
    }
    close(pipe_fds[0]);
    int wait_status = 0;
    while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    if (!text) return error_set(err, "%s: out of memory for its output", argv[0]);
    text[size] = '\0';
    if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
        free(text);
        return error_set(err, "%s failed (%s %d)", argv[0], WIFEXITED(wait_status) ? "exit status" : "signal",
                         WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : WTERMSIG(wait_status));
    }
    *out = text;
    return 0;
}

// llama-bench's tok/s for the file: decode of n_gen tokens (tg) and, when
// n_prompts > 0, prefill of PREFILL_TOKENS[0 .. n_prompts-1] (pp), one
// repetition each. tok_s: [decode, prefill 128, prefill 512].
static int llama_bench(const char* bench, const char* file, int n_threads, int n_gen, int n_prompts, double* tok_s,
                       error_info* err) {
    char threads[16], gen[16], prompts[32];
    snprintf(threads, sizeof threads, "%d", n_threads);
    snprintf(gen, sizeof gen, "%d", n_gen);
    if (n_prompts == 2)
        snprintf(prompts, sizeof prompts, "%d,%d", PREFILL_TOKENS[0], PREFILL_TOKENS[1]);
    else
        snprintf(prompts, sizeof prompts, "%d", n_prompts == 1 ? PREFILL_TOKENS[0] : 0);
    char* argv[] = {(char*)bench, "-m", (char*)file, "-t", threads, "-p",   prompts,
                    "-n",         gen,  "-r",        "1",  "-o",    "json", NULL};
    char* out;
    if (run_capture(argv, &out, err)) return -1;
    json_error_t parse_error;
    json_t* root = json_loads(out, 0, &parse_error);
    free(out);
    if (!json_is_array(root)) {
        json_decref(root);
        return error_set(err, "%s: expected a JSON array from -o json (%s)", bench, parse_error.text);
    }
    for (int k = 0; k <= n_prompts; k++)
        tok_s[k] = 0.0;
    size_t i;
    json_t* test;
    json_array_foreach(root, i, test) {
        json_int_t n_prompt = json_integer_value(json_object_get(test, "n_prompt"));
        json_int_t generated = json_integer_value(json_object_get(test, "n_gen"));
        double rate = json_number_value(json_object_get(test, "avg_ts"));
        if (generated == n_gen && n_prompt == 0) tok_s[0] = rate;
        for (int k = 0; k < n_prompts; k++)
            if (generated == 0 && n_prompt == PREFILL_TOKENS[k]) tok_s[1 + k] = rate;
    }
    json_decref(root);
    for (int k = 0; k <= n_prompts; k++)
        if (!(tok_s[k] > 0)) return error_set(err, "%s: no avg_ts for one of its tests in -o json", bench);
    return 0;
}

// llama-batched-bench's text-generation throughput (speed_tg: tokens of all
// sequences per second) at BATCH_SEQUENCES parallel sequences.
static int llama_batched_bench(const char* bench, const char* file, int n_threads, int n_gen, double* tok_s,
                               error_info* err) {
    char threads[16], gen[16], context[16], prompt[16], parallel[16];
    snprintf(threads, sizeof threads, "%d", n_threads);
    snprintf(gen, sizeof gen, "%d", n_gen);
    snprintf(context, sizeof context, "%d", BATCH_SEQUENCES * (BATCH_PROMPT_TOKENS + n_gen + 1));
    snprintf(prompt, sizeof prompt, "%d", BATCH_PROMPT_TOKENS);
    snprintf(parallel, sizeof parallel, "%d", BATCH_SEQUENCES);
    char* argv[] = {(char*)bench, "-m",   (char*)file, "-c", context, "-b",     "2048", "-ub",   "512",
                    "-npp",       prompt, "-ntg",      gen,  "-npl",  parallel, "-t",   threads, "--output-format",
                    "jsonl",      NULL};
    char* out;
    if (run_capture(argv, &out, err)) return -1;
    *tok_s = 0.0;
    for (char* line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        json_t* row = json_loads(line, 0, NULL);
        if (json_is_object(row) && json_integer_value(json_object_get(row, "pl")) == BATCH_SEQUENCES)
            *tok_s = json_number_value(json_object_get(row, "speed_tg"));
        json_decref(row);
    }
    free(out);
    if (!(*tok_s > 0))
        return error_set(err, "%s: no speed_tg at %d sequences in --output-format jsonl", bench, BATCH_SEQUENCES);
    return 0;
}

// ---- a one-core busy loop ------------------------------------------------------------

// A child process that only spins, as `sh -c 'while :; do :; done'` does:
// one more runnable thread than the machine's cores beside a 2-thread run.
// It dies with the bench (PR_SET_PDEATHSIG), so an interrupted bench
// leaves no spinning process behind.
static pid_t busy_start(void) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(0); // the bench ended before prctl
        for (volatile unsigned long spins = 0;; spins++) {
        }
    }
    return pid;
}

static void busy_stop(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
}

// ---- the rows ------------------------------------------------------------------------

// Per row, the rounds' figures: servelab, llama.cpp (for PEER_BUSY, busy
// over quiet of each).
typedef struct row_samples {
    double* servelab; // (rounds)
    double* peer;     // (rounds)
} row_samples;

static bench_peer_spread spread_of(const double* values, int n, double* scratch) {
    bench_peer_spread s = {0, 0, 0};
    if (n <= 0) return s;
    memcpy(scratch, values, (size_t)n * sizeof *scratch);
    s.median = probe_median(scratch, n);
    s.min = s.max = values[0];
    for (int i = 1; i < n; i++) {
        if (values[i] < s.min) s.min = values[i];
        if (values[i] > s.max) s.max = values[i];
    }
    return s;
}

static bench_peer_row* add_row(bench_peer_report* r, bench_peer_kind kind, int format, int tokens) {
    if (r->n_rows == BENCH_PEER_MAX_ROWS) return NULL;
    bench_peer_row* row = &r->rows[r->n_rows++];
    memset(row, 0, sizeof *row);
    row->kind = kind;
    snprintf(row->format, sizeof row->format, "%s", FORMATS[format]);
    row->tokens = tokens;
    return row;
}

void bench_peer_row_name(const bench_peer_row* row, char* out, int out_size) {
    switch (row->kind) {
    case PEER_DECODE: snprintf(out, (size_t)out_size, "%s decode %d", row->format, row->tokens); break;
    case PEER_PREFILL: snprintf(out, (size_t)out_size, "%s prefill %d", row->format, row->tokens); break;
    case PEER_BATCH:
        snprintf(out, (size_t)out_size, "%s batch %d decode %d", row->format, BATCH_SEQUENCES, row->tokens);
        break;
    case PEER_BUSY: snprintf(out, (size_t)out_size, "%s decode, 1 core busy", row->format); break;
    }
}

const bench_peer_row* bench_peer_find(const bench_peer_report* r, bench_peer_kind kind, const char* format,
                                      int tokens) {
    for (int i = 0; i < r->n_rows; i++)
        if (r->rows[i].kind == kind && strcmp(r->rows[i].format, format) == 0 &&
            (tokens == 0 || r->rows[i].tokens == tokens))
            return &r->rows[i];
    return NULL;
}

static void tell(bench_peer_progress_fn progress, void* user, const char* format, ...)
    __attribute__((format(printf, 3, 4)));

static void tell(bench_peer_progress_fn progress, void* user, const char* format, ...) {
    if (!progress) return;
    char line[256];
    va_list args;
    va_start(args, format);
    vsnprintf(line, sizeof line, format, args);
    va_end(args);
    progress(user, line);
}

// One round of one format: servelab's decode and prefills, then
// llama-bench's on the same file; then, with busy, both decodes again
// beside the busy loop. samples: this format's rows, from `first`.
static int measure_format_round(const bench_peer_options* o, const model* m, const char* file, int n_prefills,
                                int decode_tokens, int round, row_samples* samples, error_info* err) {
    double mine[3] = {0, 0, 0}, theirs[3];
    const uint64_t seed = (uint64_t)round + 1;
    // max_new = decode_tokens + 1: the 1-token prefill step samples the first token.
    if (bench_engine_rate(m, o->n_threads, 1, 1, decode_tokens + 1, false, seed, &mine[0], err)) return -1;
    for (int k = 0; k < n_prefills; k++)
        if (bench_engine_rate(m, o->n_threads, 1, PREFILL_TOKENS[k], 2, true, seed, &mine[1 + k], err)) return -1;
    if (llama_bench(o->bench_path, file, o->n_threads, decode_tokens, n_prefills, theirs, err)) return -1;
    for (int k = 0; k <= n_prefills; k++) {
        samples[k].servelab[round] = mine[k];
        samples[k].peer[round] = theirs[k];
    }
    if (!o->busy) return 0;
    double mine_busy = 0, theirs_busy[1];
    pid_t busy = busy_start();
    if (busy < 0) return error_set(err, "bench: cannot start the busy loop: %s", strerror(errno));
    int status = bench_engine_rate(m, o->n_threads, 1, 1, decode_tokens + 1, false, seed, &mine_busy, err);
    if (status == 0) status = llama_bench(o->bench_path, file, o->n_threads, decode_tokens, 0, theirs_busy, err);
    busy_stop(busy);
    if (status) return -1;
    samples[n_prefills + 1].servelab[round] = mine_busy / mine[0];
    samples[n_prefills + 1].peer[round] = theirs_busy[0] / theirs[0];
    return 0;
}

// The formats opened for a run and the report's rows each one fills:
// decode, the prefills, busy (from first_row); then the batch row.
typedef struct peer_plan {
    peer_file files[N_FORMATS];
    model_source sources[N_FORMATS];
    bool open[N_FORMATS];
    int first_row[N_FORMATS], n_prefills[N_FORMATS];
    int batch_format, batch_row; // -1 when there is no batch row
    int decode_tokens;
} peer_plan;

// Opens each format found and adds its rows to the report, then the batch
// row: batch 16 on f16 (else the first format found), the weights the
// batch-scaling goals were set on.
static int plan_rows(const bench_peer_options* options, peer_plan* plan, bench_peer_report* report,
                     bench_peer_progress_fn progress, void* progress_user, error_info* err) {
    for (int f = 0; f < N_FORMATS; f++) {
        if (!plan->files[f].found) continue;
        model_request request = {plan->files[f].path, NULL, MODEL_DTYPE_DEFAULT, SYNTH_DEFAULT_SEED, NULL};
        tell(progress, progress_user, "peer: loading %s", plan->files[f].path);
        if (model_source_open(&plan->sources[f], &request, err)) return -1;
        plan->open[f] = true;
        const model_config* c = &plan->sources[f].model.config;
        // A prompt must leave room for the token after it.
        const int room = c->max_seq_len - 2;
        int n_prefills = options->quick ? 1 : 2;
        while (n_prefills > 0 && PREFILL_TOKENS[n_prefills - 1] > room)
            n_prefills--;
        plan->n_prefills[f] = n_prefills;
        if (plan->decode_tokens + 2 > c->max_seq_len)
            return error_set(err, "%s: context %d is shorter than %d decode tokens", plan->files[f].path,
                             c->max_seq_len, plan->decode_tokens);
        plan->first_row[f] = report->n_rows;
        add_row(report, PEER_DECODE, f, plan->decode_tokens);
        for (int k = 0; k < n_prefills; k++)
            add_row(report, PEER_PREFILL, f, PREFILL_TOKENS[k]);
        if (options->busy) add_row(report, PEER_BUSY, f, plan->decode_tokens);
    }
    plan->batch_format = plan->files[1].found ? 1 : -1;
    for (int f = 0; plan->batch_format < 0 && f < N_FORMATS; f++)
        if (plan->files[f].found) plan->batch_format = f;
    plan->batch_row = -1;
    if (options->batched_bench_path && plan->batch_format >= 0) {
        plan->batch_row = report->n_rows;
        add_row(report, PEER_BATCH, plan->batch_format, plan->decode_tokens);
    }
    return 0;
}

// One round: every format's decode and prefills beside llama-bench's, then
// the batch row beside llama-batched-bench's.
static int measure_round(const bench_peer_options* options, const peer_plan* plan, int round, int rounds,
                         row_samples* samples, bench_peer_progress_fn progress, void* progress_user,
                         error_info* err) {
    for (int f = 0; f < N_FORMATS; f++) {
        if (!plan->open[f]) continue;
        const row_samples* decode = &samples[plan->first_row[f]];
        if (measure_format_round(options, &plan->sources[f].model, plan->files[f].path, plan->n_prefills[f],
                                 plan->decode_tokens, round, &samples[plan->first_row[f]], err))
            return -1;
        tell(progress, progress_user, "peer round %d/%d %s: decode servelab %.1f, llama.cpp %.1f tok/s", round + 1,
             rounds, FORMATS[f], decode->servelab[round], decode->peer[round]);
    }
    if (plan->batch_row < 0) return 0;
    row_samples* batch = &samples[plan->batch_row];
    const model* m = &plan->sources[plan->batch_format].model;
    if (bench_engine_rate(m, options->n_threads, BATCH_SEQUENCES, BATCH_PROMPT_TOKENS, plan->decode_tokens + 1, false,
                          (uint64_t)round + 1, &batch->servelab[round], err) ||
        llama_batched_bench(options->batched_bench_path, plan->files[plan->batch_format].path, options->n_threads,
                            plan->decode_tokens, &batch->peer[round], err))
        return -1;
    tell(progress, progress_user, "peer round %d/%d batch %d: servelab %.1f, llama.cpp %.1f tok/s", round + 1, rounds,
         BATCH_SEQUENCES, batch->servelab[round], batch->peer[round]);
    return 0;
}

// Each row's spread over the rounds: servelab's, the peer's, and the
// ratio's, taken round by round. ratios: (rounds) scratch.
static int summarize_rows(bench_peer_report* report, const row_samples* samples, double* ratios, error_info* err) {
    const int rounds = report->rounds;
    double* scratch = malloc((size_t)rounds * sizeof *scratch); // (rounds)
    if (!scratch) return error_set(err, "bench: out of memory");
    for (int i = 0; i < report->n_rows; i++) {
        bench_peer_row* row = &report->rows[i];
        row->rounds = rounds;
        row->servelab = spread_of(samples[i].servelab, rounds, scratch);
        row->peer = spread_of(samples[i].peer, rounds, scratch);
        for (int k = 0; k < rounds; k++)
            ratios[k] = samples[i].peer[k] > 0 ? samples[i].servelab[k] / samples[i].peer[k] : 0.0;
        row->ratio = spread_of(ratios, rounds, scratch);
    }
    free(scratch);
    report->measured = true;
    return 0;
}

int bench_peer_run(const bench_peer_options* options, bench_peer_report* report, bench_peer_progress_fn progress,
                   void* progress_user, error_info* err) {
    memset(report, 0, sizeof *report);
    report->rounds = options->rounds > 0 ? options->rounds : 1;
    report->n_threads = options->n_threads;
    if (!options->bench_path) {
        snprintf(report->not_measured, sizeof report->not_measured,
                 "no peer given (--peer-bench PATH/llama-bench --peer-models DIR)");
        return 0;
    }
    if (!options->models) return error_set(err, "--peer-bench needs --peer-models DIR or FILE,FILE,...");
    snprintf(report->peer, sizeof report->peer, "%s", options->bench_path);
    peer_plan* plan = calloc(1, sizeof *plan);
    if (!plan) return error_set(err, "bench: out of memory");
    if (find_files(options->models, plan->files, err)) {
        free(plan);
        return -1;
    }
    const int rounds = report->rounds;
    plan->decode_tokens = options->quick ? QUICK_DECODE_TOKENS : DECODE_TOKENS;
    // (rows, 2, rounds) samples, servelab's then the peer's; then (rounds) ratios.
    double* values = calloc((size_t)BENCH_PEER_MAX_ROWS * 2 * (size_t)rounds + (size_t)rounds, sizeof *values);
    row_samples samples[BENCH_PEER_MAX_ROWS];
    int status = values ? 0 : error_set(err, "bench: out of memory");
    for (int i = 0; values && i < BENCH_PEER_MAX_ROWS; i++)
        samples[i] =
            (row_samples){values + (size_t)(2 * i) * (size_t)rounds, values + (size_t)(2 * i + 1) * (size_t)rounds};
    if (status == 0) status = plan_rows(options, plan, report, progress, progress_user, err);
    for (int round = 0; status == 0 && round < rounds; round++)
        status = measure_round(options, plan, round, rounds, samples, progress, progress_user, err);
    if (status == 0)
        status = summarize_rows(report, samples, values + (size_t)BENCH_PEER_MAX_ROWS * 2 * (size_t)rounds, err);
    for (int f = 0; f < N_FORMATS; f++)
        if (plan->open[f]) model_source_close(&plan->sources[f]);
    free(values);
    free(plan);
    return status;
}
