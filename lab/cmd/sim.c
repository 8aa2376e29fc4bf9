// servelab sim: a workload through the engine, paged against contiguous,
// continuous against static batching, measured side by side in one run.
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/model_synth.h"
#include "engine/output_file.h"
#include "lab/cmd/cli.h"
#include "lab/cmd/commands.h"
#include "lab/common/engine_options.h"
#include "lab/common/json_out.h"
#include "lab/common/model_source.h"
#include "lab/common/progress.h"
#include "lab/bench/workload.h"

static const char SIM_USAGE_HEAD[] =
    "usage: servelab sim [options]\n"
    "\n"
    "Runs a workload through the engine and reports throughput, time to first\n"
    "token (TTFT), time per output token (TPOT), peak running sequences, KV\n"
    "utilisation and waste, preemptions and prefix-cache hits. Every request\n"
    "generates exactly its output length (EOS is ignored). Times are the\n"
    "engine's own wall time per step; idle gaps between arrivals are skipped.\n"
    "\n"
    "The default run takes seconds: the medium preset (random weights), 16\n"
    "short requests all at once, paged against contiguous KV in a budget of 4\n"
    "full-length sequences: contiguous runs 4 at a time, paged all 16, and\n"
    "decodes faster because a step streams the weights once however many\n"
    "sequences it decodes. --full runs the same experiment at full size: 64\n"
    "longer requests (1.5 to 3 minutes on 2 cores, twice that with --batching\n"
    "both). Any flag below overrides either size.\n"
    "\n"
    "workload:\n"
    "  --requests N              number of requests (default 16; --full 64)\n"
    "  --prompt-len DIST         fixed:N | uniform:LOW:HIGH | lognormal:MEAN:SD\n"
    "                            (default uniform:16:64; --full uniform:32:512)\n"
    "  --output-len DIST         (default uniform:32:96; --full uniform:16:256)\n"
    "  --arrival-rate R          requests per second, 0 = all at once (default 0)\n"
    "  --shared-prefix N         every prompt starts with the same N tokens (default 0)\n"
    "  --seed N                  workload seed (default 1)\n"
    "  --workload FILE           JSON Lines: {\"prompt\"|\"prompt_ids\", \"max_tokens\", \"arrival\"}\n"
    "  --full                    the full-size run described above\n"
    "model:\n"
    "  --model PATH|PRESET       (default medium)   --tokenizer FILE   --dtype fp32|fp16\n"
    "  --quant SCHEME            w8a16|w4a16|w8a8|w4a8[:gG][:rtn|awq|gptq][:sym|asym]\n"
    "output:\n"
    "  --json                    one JSON object keyed by run (paged, contiguous, ...)\n"
    "  --trace FILE              step records as JSON Lines (FILE.<run> when several runs)\n"
    "  --kv both                 run paged and contiguous (the default)\n"
    "  --batching both           run continuous and static\n"
    "  --progress                the progress line on stderr even when it is not a terminal\n"
    "                            (shown on a terminal anyway; never on stdout)\n"
    "\n";

// The engine options' shared help (lab/common/engine_options.c) states the
// engine's defaults; sim's differ for --kv and the KV budget, so those
// lines are replaced here (each replacement starts with its flag).
static const char* const SIM_ENGINE_DEFAULTS[] = {
    "  --kv paged|contiguous|both  KV layout (default both: paged, then contiguous)\n",
    "  --kv-mem SIZE             KV memory budget, e.g. 64MiB, 1GiB (default: room for 4\n"
    "                            sequences of the model's full length: 9 MiB for small, 64 MiB\n"
    "                            for medium, in fp16; at most the memory available)\n",
    NULL,
};


typedef struct sim_result {
    char label[24];
    int completed;
    int n_requests;
    uint64_t generated_tokens;
    double seconds;          // engine clock at the end
    double throughput_tok_s; // generated tokens / seconds
    double ttft_ms_mean, ttft_ms_p50, ttft_ms_p99;
    double tpot_ms_mean, tpot_ms_p50, tpot_ms_p99;
    int peak_running;
    double kv_util_pct;      // mean over steps: slots holding a token / slots in the pool
    double kv_waste_pct;     // mean over steps: allocated-but-empty / allocated
    double external_fragmentation_pct; // contiguous: mean free slots outside the largest hole / pool
    uint64_t preemptions;
    uint64_t prefix_hit_tokens;
    uint64_t copies;
    int steps;
    bool speculative;        // --speculative: the two figures below
    double spec_acceptance_pct;   // guesses kept / guesses made
    double spec_tokens_per_pass;  // tokens decoding sequences appended / their target passes
} sim_result;

static int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

// Percentile by linear interpolation between closest ranks; values sorted.
static double percentile(const double* sorted, int n, double fraction) {
    if (n == 0) return 0.0;
    double rank = fraction * (n - 1);
    int low = (int)floor(rank);
    int high = low + 1 < n ? low + 1 : low;
    return sorted[low] + (sorted[high] - sorted[low]) * (rank - low);
}

static void summarize(const double* values, int n, double* mean, double* p50, double* p99) {
    double* sorted = malloc((size_t)(n > 0 ? n : 1) * sizeof *sorted);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += sorted[i] = values[i];
    qsort(sorted, (size_t)n, sizeof *sorted, compare_doubles);
    *mean = n ? sum / n : 0;
    *p50 = percentile(sorted, n, 0.50);
    *p99 = percentile(sorted, n, 0.99);
    free(sorted);
}

// `line` (NULL when not shown) counts the finished requests of this run;
// `run_name` says which run of how many ("paged, run 1 of 2").
static int run_simulation(const model* m, const engine_config* config, const workload* w, const char* label,
                          FILE* trace, progress* line, const char* run_name, sim_result* out, error_info* err) {
    memset(out, 0, sizeof *out);
    snprintf(out->label, sizeof out->label, "%.23s", label);
    out->n_requests = w->n_requests;
    engine e;
    if (engine_init(&e, m, config, err)) return -1;
    engine_set_trace(&e, trace);
    int32_t* first_ids = malloc((size_t)w->n_requests * sizeof *first_ids); // (n_requests) sequence ids
    if (!first_ids) {
        engine_free(&e);
        return error_set(err, "sim: out of memory");
    }
    int next = 0, util_steps = 0, waste_steps = 0;
    double util_sum = 0, waste_sum = 0, fragmentation_sum = 0;
    int status = 0;
    while (status == 0 && (next < w->n_requests || engine_has_work(&e))) {
        while (next < w->n_requests && w->requests[next].arrival_time <= e.clock_seconds) {
            const workload_request* q = &w->requests[next];
            request_params p = {q->prompt, q->n_prompt, q->max_tokens, 1, 0.0f, 0.0f, 1, q->arrival_time, true};
            if (engine_add_request(&e, &p, &first_ids[next], err)) {
                status = -1;
                break;
            }
            next++;
        }
        if (status) break;
        if (!engine_has_work(&e)) { // idle until the next arrival
            engine_advance_clock(&e, w->requests[next].arrival_time - e.clock_seconds);
            continue;
        }
        const step_record* r;
        if (engine_step(&e, &r, err)) {
            status = -1;
            break;
        }
        out->steps++;
        progress_set(line, run_name, r->n_finished, w->n_requests, "requests finished");
        if (r->n_running > out->peak_running) out->peak_running = r->n_running;
        util_sum += 100.0 * (double)r->slots_used / (double)r->slots_total;
        fragmentation_sum += 100.0 * (double)r->external_fragmentation_slots / (double)r->slots_total;
        util_steps++;
        if (r->slots_allocated > 0) {
            waste_sum += 100.0 * (double)(r->slots_allocated - r->slots_used) / (double)r->slots_allocated;
            waste_steps++;
        }
    }
    if (status == 0) {
        double* ttft = malloc((size_t)w->n_requests * sizeof *ttft);
        double* tpot = malloc((size_t)w->n_requests * sizeof *tpot);
        int n_tpot = 0;
        for (int i = 0; i < w->n_requests && ttft && tpot; i++) {
            step_sequence_status s;
            engine_sequence_status(&e, first_ids[i], &s); // never released here
            if (s.state != SEQ_FINISHED) continue;
            int generated = s.n_tokens - s.n_prompt;
            ttft[out->completed++] = 1000.0 * (s.first_token_time - s.arrival_time);
            out->generated_tokens += (uint64_t)generated;
            if (generated > 1) tpot[n_tpot++] = 1000.0 * (s.finish_time - s.first_token_time) / (generated - 1);
        }
        if (!ttft || !tpot) status = error_set(err, "sim: out of memory");
        else {
            summarize(ttft, out->completed, &out->ttft_ms_mean, &out->ttft_ms_p50, &out->ttft_ms_p99);
            summarize(tpot, n_tpot, &out->tpot_ms_mean, &out->tpot_ms_p50, &out->tpot_ms_p99);
        }
        free(ttft);
        free(tpot);
        out->seconds = e.clock_seconds;
        out->throughput_tok_s = out->seconds > 0 ? (double)out->generated_tokens / out->seconds : 0;
        out->kv_util_pct = util_steps ? util_sum / util_steps : 0;
        out->kv_waste_pct = waste_steps ? waste_sum / waste_steps : 0;
        out->external_fragmentation_pct = util_steps ? fragmentation_sum / util_steps : 0;
        out->preemptions = e.record.total_preemptions; // preemptions happen only inside steps
        out->prefix_hit_tokens = e.total_prefix_hit_tokens;
        const step_record* last = engine_view(&e); // NULL only when out of memory
        out->copies = config->layout == KV_LAYOUT_PAGED && last ? last->total_copies : 0;
        out->speculative = config->speculative.kind != SPEC_NONE;
        if (out->speculative && last) {
            out->spec_acceptance_pct =
                last->spec_total_drafted ? 100.0 * (double)last->spec_total_accepted / (double)last->spec_total_drafted : 0;
            out->spec_tokens_per_pass = last->spec_total_target_passes ? (double)last->spec_total_emitted /
                                                                             (double)last->spec_total_target_passes
                                                                       : 0;
        }
    }
    free(first_ids);
    engine_free(&e);
    return status;
}

static json_t* json_decimals(double value, int decimals) { return json_out_rounded(value, decimals, 0); }

// One run's figures; NULL when out of memory (json_pack takes the references
// it is given even when it fails).
static json_t* result_json(const sim_result* r) {
    json_t* o = json_pack("{s:i, s:i, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:i, s:o, s:o, s:o, s:I, s:I, s:I, s:i}",
                     "completed", r->completed, "requests", r->n_requests, "generated_tokens",
                     (json_int_t)r->generated_tokens, "seconds", json_decimals(r->seconds, 4), "throughput_tok_s",
                     json_decimals(r->throughput_tok_s, 3), "ttft_ms_mean", json_decimals(r->ttft_ms_mean, 3),
                     "ttft_ms_p50", json_decimals(r->ttft_ms_p50, 3), "ttft_ms_p99", json_decimals(r->ttft_ms_p99, 3),
                     "tpot_ms_mean", json_decimals(r->tpot_ms_mean, 3), "tpot_ms_p50", json_decimals(r->tpot_ms_p50, 3),
                     "tpot_ms_p99", json_decimals(r->tpot_ms_p99, 3), "peak_running", r->peak_running, "kv_util_pct",
                     json_decimals(r->kv_util_pct, 3), "kv_waste_pct", json_decimals(r->kv_waste_pct, 3),
                     "external_fragmentation_pct", json_decimals(r->external_fragmentation_pct, 3), "preemptions",
                     (json_int_t)r->preemptions, "prefix_hit_tokens", (json_int_t)r->prefix_hit_tokens, "cow_copies",
                     (json_int_t)r->copies, "steps", r->steps);
    if (o && r->speculative &&
        (json_object_set_new(o, "spec_acceptance_pct", json_decimals(r->spec_acceptance_pct, 3)) ||
         json_object_set_new(o, "spec_tokens_per_target_pass", json_decimals(r->spec_tokens_per_pass, 3)))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

// One compact JSON object keyed by run label, in the order the runs ran (as
// the hand-written JSON printed it). 0, or -1 with the reason on stderr.
static int print_json(const sim_result* results, int n) {
    json_t* root = json_object();
    for (int i = 0; i < n && root; i++)
        if (json_object_set_new(root, results[i].label, result_json(&results[i])) != 0) {
            json_decref(root);
            root = NULL;
        }
    return json_out_print(root, JSON_COMPACT, "sim") ? -1 : 0;
}

static void print_table(const sim_result* results, int n) {
    printf("%-24s", "");
    for (int i = 0; i < n; i++) printf("%20s", results[i].label);
    printf("\n");
#define ROW(name, format, field)                                                                                       \
    do {                                                                                                               \
        printf("%-24s", name);                                                                                         \
        for (int i = 0; i < n; i++) printf(format, results[i].field);                                                 \
        printf("\n");                                                                                                  \
    } while (0)
    ROW("completed", "%20d", completed);
    ROW("throughput (tok/s)", "%20.1f", throughput_tok_s);
    ROW("TTFT p50 (ms)", "%20.1f", ttft_ms_p50);
    ROW("TTFT p99 (ms)", "%20.1f", ttft_ms_p99);
    ROW("TPOT p50 (ms)", "%20.2f", tpot_ms_p50);
    ROW("TPOT p99 (ms)", "%20.2f", tpot_ms_p99);
    ROW("peak running", "%20d", peak_running);
    ROW("KV utilisation (%)", "%20.1f", kv_util_pct);
    ROW("KV waste (%)", "%20.1f", kv_waste_pct);
    ROW("external frag. (%)", "%20.1f", external_fragmentation_pct);
    ROW("preemptions", "%20" PRIu64, preemptions);
    ROW("prefix hit tokens", "%20" PRIu64, prefix_hit_tokens);
    ROW("copy-on-write copies", "%20" PRIu64, copies);
    ROW("steps", "%20d", steps);
    ROW("elapsed (s)", "%20.2f", seconds);
    if (results[0].speculative) {
        ROW("spec. acceptance (%)", "%20.1f", spec_acceptance_pct);
        ROW("tokens / target pass", "%20.2f", spec_tokens_per_pass);
    }
#undef ROW
    // Ratios against the first run, measured in this run.
    for (int i = 1; i < n; i++)
        printf("%s / %s: throughput %.2fx, peak running %.2fx\n", results[0].label, results[i].label,
               results[i].throughput_tok_s > 0 ? results[0].throughput_tok_s / results[i].throughput_tok_s : 0.0,
               results[i].peak_running > 0 ? (double)results[0].peak_running / results[i].peak_running : 0.0);
}

// Two sizes of the same experiment, on the medium preset: its 192 MiB of
// fp16 weights stream from memory once per decode step, so a step that
// decodes more sequences costs little more, and the layout that fits more
// sequences in the same KV memory decodes faster. The contiguous layout
// reserves a whole max-length sequence per request, so a budget of
// SIM_BUDGET_SEQUENCES of them runs 4 requests at once; paged blocks hold
// only what each request uses.
//   default: 16 requests of 16..64 prompt + 32..96 output tokens, all of
//            them at once when paged: 4x the sequences, 1.3-1.9x the
//            throughput; 7-20 s on a shared 2-core machine (load 2 to 4.5)
//   --full:  64 requests of 32..512 + 16..256 tokens (the default before):
//            4.25x the sequences, 1.0-1.7x the throughput; 93-163 s there
typedef struct sim_scale {
    int n_requests;
    length_distribution prompt_length, output_length;
} sim_scale;

static const sim_scale SIM_DEFAULT = {16, {LENGTH_UNIFORM, 16, 64}, {LENGTH_UNIFORM, 32, 96}};
static const sim_scale SIM_FULL = {64, {LENGTH_UNIFORM, 32, 512}, {LENGTH_UNIFORM, 16, 256}};

// The KV budget when neither --kv-mem nor --num-blocks is given: room for
// 4 sequences of the model's full length (64 MiB of fp16 KV for medium, as
// before; 9 MiB for small), so contiguous runs 4 at once whatever the model.
#define SIM_BUDGET_SEQUENCES 4

static bool flag_given(const char* arg, const char* flag) {
    size_t length = strlen(flag);
    return strncmp(arg, flag, length) == 0 && (arg[length] == '\0' || arg[length] == '=');
}

typedef struct sim_args {
    engine_config config;
    model_request request;
    workload_spec spec;
    const char* workload_path; // --workload FILE, or NULL: spec generates one
    const char* trace_path;
    bool json, progress_forced;
    bool kv_both, batching_both; // run both layouts / both batching policies
    bool budget_given;           // --kv-mem or --num-blocks
} sim_args;

// The flags into args, with what was not given from the chosen size (a flag
// always wins); -1 with err (the message to print) on a bad one.
static int parse_sim_args(int argc, char** argv, sim_args* args, error_info* err) {
    *args = (sim_args){
        .config = engine_config_default(),
        .request = {"medium", NULL, MODEL_DTYPE_DEFAULT, SYNTH_DEFAULT_SEED, NULL},
        .spec = {0, {LENGTH_UNIFORM, 0, 0}, {LENGTH_UNIFORM, 0, 0}, 0.0, 0, 1, 0, 0},
    };
    workload_spec* spec = &args->spec;
    bool kv_given = false, full = false, requests_given = false, prompt_given = false, output_given = false;
    arg_cursor cursor = {argc, argv, 1, "servelab sim", NULL};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        const char* arg = argv[cursor.index];
        if (flag_given(arg, "--kv")) kv_given = true;
        if (flag_given(arg, "--kv-mem") || flag_given(arg, "--num-blocks")) args->budget_given = true;
        if (engine_option_match(&cursor, &args->config, &args->kv_both, &args->batching_both, &failed, err)) {
        } else if (model_option_match(&cursor, &args->request, &failed, err)) {
        } else if (arg_match(&cursor, "--requests", true, &failed, err)) {
            if (!failed) failed = parse_int_arg("--requests", cursor.value, 1, 1000000, &spec->n_requests, err) != 0;
            requests_given = true;
        } else if (arg_match(&cursor, "--prompt-len", true, &failed, err)) {
            if (!failed)
                failed = length_distribution_parse("--prompt-len", cursor.value, &spec->prompt_length, err) != 0;
            prompt_given = true;
        } else if (arg_match(&cursor, "--output-len", true, &failed, err)) {
            if (!failed)
                failed = length_distribution_parse("--output-len", cursor.value, &spec->output_length, err) != 0;
            output_given = true;
        } else if (arg_match(&cursor, "--arrival-rate", true, &failed, err)) {
            float rate = 0;
            if (!failed) failed = parse_float_arg("--arrival-rate", cursor.value, 0.0, 1e9, &rate, err) != 0;
            spec->arrival_rate = rate;
        } else if (arg_match(&cursor, "--shared-prefix", true, &failed, err)) {
            if (!failed)
                failed = parse_int_arg("--shared-prefix", cursor.value, 0, 1 << 22, &spec->shared_prefix, err) != 0;
        } else if (arg_match(&cursor, "--seed", true, &failed, err)) {
            if (!failed) failed = parse_u64_arg("--seed", cursor.value, &spec->seed, err) != 0;
        } else if (arg_match(&cursor, "--workload", true, &failed, err)) {
            if (!failed) args->workload_path = cursor.value;
        } else if (arg_match(&cursor, "--trace", true, &failed, err)) {
            if (!failed) args->trace_path = cursor.value;
        } else if (arg_match(&cursor, "--json", false, &failed, err)) {
            args->json = true;
        } else if (arg_match(&cursor, "--full", false, &failed, err)) {
            full = true;
        } else if (arg_match(&cursor, "--progress", false, &failed, err)) {
            args->progress_forced = true;
        } else {
            return arg_unknown(&cursor, err);
        }
        if (failed) {
            error_info flag_err = *err;
            return error_set(err, "servelab sim: %s", flag_err.message);
        }
    }
    if (!kv_given) args->kv_both = true; // paged against contiguous unless told otherwise
    const sim_scale* scale = full ? &SIM_FULL : &SIM_DEFAULT;
    if (!requests_given) spec->n_requests = scale->n_requests;
    if (!prompt_given) spec->prompt_length = scale->prompt_length;
    if (!output_given) spec->output_length = scale->output_length;
    return 0;
}

// The runs: layouts x batching policies, paged and continuous first; at most 4.
static int plan_runs(const sim_args* args, engine_config runs[4], char labels[4][24]) {
    int n_runs = 0;
    for (int b = 0; b < (args->batching_both ? 2 : 1); b++)
        for (int k = 0; k < (args->kv_both ? 2 : 1); k++) {
            engine_config c = args->config;
            if (args->kv_both) c.layout = k == 0 ? KV_LAYOUT_PAGED : KV_LAYOUT_CONTIGUOUS;
            if (args->batching_both) c.batching = b == 0 ? BATCHING_CONTINUOUS : BATCHING_STATIC;
            snprintf(labels[n_runs], sizeof labels[n_runs], "%s%s",
                     c.layout == KV_LAYOUT_PAGED ? "paged" : "contiguous",
                     c.batching == BATCHING_STATIC ? "_static" : "");
            runs[n_runs++] = c;
        }
    return n_runs;
}

// The line that says what runs: the workload, the model and the KV budget.
static void print_workload(const sim_args* args, const workload* w, const model_source* source) {
    const engine_config* config = &args->config;
    uint64_t block_bytes = kv_memory_block_bytes(&source->model.config, config->kv_dtype, config->block_size);
    uint64_t budget = config->num_blocks > 0 ? (uint64_t)config->num_blocks * block_bytes : config->kv_mem_bytes;
    const char* arrivals = args->spec.arrival_rate > 0 && !args->workload_path
                               ? "Poisson arrivals"
                               : (args->workload_path ? "from file" : "all at once");
    printf("workload: %d requests, mean prompt %.0f and output %.0f tokens, %s; model %s (%s); KV budget %.1f MiB "
           "%s = %llu token slots; block size %d; reserve %s\n",
           w->n_requests, workload_mean_prompt(w), workload_mean_output(w), arrivals, source->model_label,
           weight_dtype_name(source->model.dtype), (double)budget / 1048576.0, kv_dtype_name(config->kv_dtype),
           (unsigned long long)(budget / block_bytes * (uint64_t)config->block_size), config->block_size,
           config->reserve == RESERVE_MAX ? "max" : "request");
}

// What the runs left: the results of those that finished, in run order, and
// a line for each failure (at most two a run: a trace path or a label, then why).
typedef struct sim_outcome {
    sim_result finished[4];
    int n_finished;
    char failures[2 * 4][4096 + sizeof(((error_info*)0)->message) + 64];
    int n_failures;
} sim_outcome;

// Every run is tried: one that fails (the contiguous layout out of memory,
// say) does not throw away the others.
static void run_all(const sim_args* args, const model* m, const workload* w, const engine_config* runs,
                    char labels[][24], int n_runs, progress* line, sim_outcome* out) {
    error_info err = {{0}};
    out->n_finished = out->n_failures = 0;
    for (int i = 0; i < n_runs; i++) {
        char run_name[128];
        snprintf(run_name, sizeof run_name, "%s (run %d of %d)", labels[i], i + 1, n_runs);
        progress_set(line, run_name, 0, w->n_requests, "requests finished");
        // Each trace through output_file: never written through a planted
        // link, renamed into place once complete.
        output_file trace_file;
        FILE* trace = NULL;
        if (args->trace_path) {
            char path[4096];
            if (n_runs > 1) snprintf(path, sizeof path, "%s.%s", args->trace_path, labels[i]);
            else snprintf(path, sizeof path, "%s", args->trace_path);
            if (output_file_open(&trace_file, path, &err)) {
                snprintf(out->failures[out->n_failures++], sizeof out->failures[0],
                         "cannot create the trace file: %s", err.message);
                continue;
            }
            trace = trace_file.stream;
        }
        sim_result result;
        bool ok = true;
        if (run_simulation(m, &runs[i], w, labels[i], trace, line, run_name, &result, &err)) {
            snprintf(out->failures[out->n_failures++], sizeof out->failures[0], "%s: %s", labels[i], err.message);
            ok = false;
        }
        if (trace && output_file_commit(&trace_file, false, &err)) { // a failed run keeps its trace so far
            snprintf(out->failures[out->n_failures++], sizeof out->failures[0],
                     "%s: the trace file could not be written: %s", labels[i], err.message);
            ok = false;
        }
        if (!ok) continue;
        out->finished[out->n_finished++] = result;
        if (!args->json) {
            progress_hold(line);
            fprintf(stderr, "servelab sim: %s done in %.1f s\n", labels[i], result.seconds);
            progress_resume(line);
        }
    }
}

int command_sim(int argc, char** argv) {
    if (cli_answer_help(argc, argv, SIM_USAGE_HEAD, SIM_ENGINE_DEFAULTS)) return 0;
    error_info err = {{0}};
    sim_args args;
    if (parse_sim_args(argc, argv, &args, &err)) return cli_usage_error(&err);
    // The line starts before the model: building medium's random weights
    // alone takes 4 s on 2 cores.
    progress* line = progress_start("servelab sim", args.progress_forced);
    progress_set(line, "building the model", 0, 0, NULL);
    model_source source;
    if (model_source_open(&source, &args.request, &err)) {
        progress_finish(line);
        fprintf(stderr, "servelab sim: %s\n", err.message);
        return 1;
    }
    model_source draft; // --speculative draft:...: the proposer, shared by every run
    if (engine_options_open_draft(&args.config, &args.request, &draft, &err)) {
        progress_finish(line);
        fprintf(stderr, "servelab sim: %s\n", err.message);
        model_source_close(&source);
        return 1;
    }
    const model_config* mc = &source.model.config;
    if (!args.budget_given)
        args.config.num_blocks =
            SIM_BUDGET_SEQUENCES * ((mc->max_seq_len + args.config.block_size - 1) / args.config.block_size);
    workload w;
    args.spec.vocab_size = mc->vocab_size;
    args.spec.max_seq_len = mc->max_seq_len;
    int status = args.workload_path ? workload_read(&w, args.workload_path, source.tokenizer, mc->vocab_size,
                                                    mc->max_seq_len, &err)
                                    : workload_generate(&w, &args.spec, &err);
    if (status) {
        progress_finish(line);
        fprintf(stderr, "servelab sim: %s\n", err.message);
        model_source_close(&draft);
        model_source_close(&source);
        return 2;
    }
    engine_config runs[4];
    char labels[4][24];
    int n_runs = plan_runs(&args, runs, labels);
    progress_hold(line); // stdout may be the same terminal
    if (!args.json) print_workload(&args, &w, &source);
    fflush(stdout);
    progress_resume(line);
    sim_outcome outcome;
    run_all(&args, &source.model, &w, runs, labels, n_runs, line, &outcome);
    progress_finish(line);
    if (outcome.n_finished > 0) {
        if (!args.json) print_table(outcome.finished, outcome.n_finished);
        else if (print_json(outcome.finished, outcome.n_finished)) status = 1;
    }
    fflush(stdout); // what finished first, then what failed
    for (int i = 0; i < outcome.n_failures; i++) fprintf(stderr, "servelab sim: %s\n", outcome.failures[i]);
    if (outcome.n_failures > 0) status = 1;
    workload_free(&w);
    model_source_close(&draft);
    model_source_close(&source);
    return status;
}
