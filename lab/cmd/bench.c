// servelab bench: the performance harness (lab/bench/bench.h measures,
// lab/bench/targets.h judges, this file parses the flags and prints a
// table or JSON).
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model_synth.h"
#include "lab/bench/bench.h"
#include "lab/bench/targets.h"
#include "lab/common/cli_args.h"
#include "lab/cmd/cli.h"
#include "lab/cmd/commands.h"
#include "lab/common/progress.h"
#include "lab/common/json_out.h"

static const char BENCH_USAGE[] =
    "usage: servelab bench [--json] [--model M|PRESET] [--threads N] [--repeats R] [--quick] [--progress]\n"
    "                      [--audit] [--peer-bench PATH --peer-models DIR|FILE,... [--peer-batched-bench PATH]\n"
    "                                 [--peer-rounds N] [--peer-only]]\n"
    "\n"
    "Measures, side by side in one run (each figure the median of R runs):\n"
    "  machine    streaming-read bandwidth (buffer 8x the L3) and peak fp32 FMA rate\n"
    "  decode     batch 1 through the engine: fp32, fp16, W8A16, W4A16 g128, W8A8;\n"
    "             tok/s, GB/s streamed and the fraction of the measured bandwidth\n"
    "  prefill    128 and 512 tokens: fp16, W4A16, W8A8; tok/s, GFLOP/s against peak\n"
    "  batch      fp16 decode at batch 1..64, where the roofline says it flattens,\n"
    "             and the most over batch 1 that the FMA peak allows\n"
    "  attention  paged (block 16, scattered) against contiguous KV, us per token\n"
    "             at contexts 512, 2048, 8192 (fp16 KV, one thread, every layer)\n"
    "  fixed cost stories260K decode, when found in ./models or ../shared/models\n"
    "  peer       against llama.cpp on the very same GGUF files, in interleaved rounds\n"
    "             (servelab, llama.cpp, servelab, ...): decode 128, prefill 128 and 512\n"
    "             per format (f32, f16, q8_0, q4_0), decode beside a one-core busy loop\n"
    "             (each engine's speed kept), and batch-16 decode against\n"
    "             llama-batched-bench at 16 parallel sequences; medians, ranges and\n"
    "             ratios taken round by round. Without a peer: not measured\n"
    "  targets    the project's CPU performance goals judged on this run: met, not\n"
    "             met, or not measured (a figure the run did not produce is never met)\n"
    "\n"
    "  --model M|PRESET  checkpoint or preset (default stories110m: dim 768, 12 layers)\n"
    "  --threads N       worker threads (default: one per online CPU)\n"
    "  --repeats R       runs per figure (default 3)\n"
    "  --quick           16 decode tokens, 4 batch steps, 64 MiB bandwidth buffer, 1 repeat\n"
    "                    unless --repeats, peer prefill of 128 only: a smoke test, not a measurement\n"
    "  --json            one JSON object on stdout instead of the table\n"
    "  --progress        the progress line even when stderr is not a terminal\n"
    "  --audit           check each engine step against independent counts (engine/audit.h;\n"
    "                    off by default: it adds its own time to the figures)\n"
    "  --peer-bench PATH          llama.cpp's llama-bench\n"
    "  --peer-models DIR|FILES    GGUF files of the same weights for both engines: a directory\n"
    "                             or paths separated by commas; the format is told by the name\n"
    "                             (f32, f16, q8_0, q4_0, as llama-quantize names them)\n"
    "  --peer-batched-bench PATH  llama.cpp's llama-batched-bench, for the batch-16 row\n"
    "  --peer-rounds N            interleaved rounds (default: --repeats)\n"
    "  --peer-only                the peer section alone\n"
    "\n"
    "Progress goes to stderr: on a terminal one line rewritten in place (parts of\n"
    "the run done, elapsed time, the latest figure), elsewhere a line per part.\n"
    "Every comparison with another engine is measured in the same run; none is\n"
    "taken from published figures.\n";

typedef struct bench_args {
    bench_options options;
    bool json;
    bool progress_forced;
} bench_args;

static int parse_bench_args(int argc, char** argv, bench_args* args, error_info* err) {
    memset(args, 0, sizeof *args);
    args->options.synth_seed = SYNTH_DEFAULT_SEED;
    bool repeats_given = false;
    arg_cursor cursor = {argc, argv, 1, "servelab bench", NULL};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        if (arg_match(&cursor, "--json", false, &failed, err)) {
            args->json = true;
        } else if (arg_match(&cursor, "--progress", false, &failed, err)) {
            args->progress_forced = true;
        } else if (arg_match(&cursor, "--audit", false, &failed, err)) {
            setenv("SERVELAB_AUDIT", "all", 1); // every engine the bench builds (engine/audit.h)
        } else if (arg_match(&cursor, "--quick", false, &failed, err)) {
            args->options.quick = true;
        } else if (arg_match(&cursor, "--model", true, &failed, err)) {
            if (!failed) args->options.model_arg = cursor.value;
        } else if (arg_match(&cursor, "--threads", true, &failed, err)) {
            if (!failed && parse_int_arg("--threads", cursor.value, 1, 256, &args->options.n_threads, err)) return -1;
        } else if (arg_match(&cursor, "--peer-bench", true, &failed, err)) {
            if (!failed) args->options.peer.bench_path = cursor.value;
        } else if (arg_match(&cursor, "--peer-batched-bench", true, &failed, err)) {
            if (!failed) args->options.peer.batched_bench_path = cursor.value;
        } else if (arg_match(&cursor, "--peer-models", true, &failed, err)) {
            if (!failed) args->options.peer.models = cursor.value;
        } else if (arg_match(&cursor, "--peer-rounds", true, &failed, err)) {
            if (!failed && parse_int_arg("--peer-rounds", cursor.value, 1, 1000, &args->options.peer.rounds, err))
                return -1;
        } else if (arg_match(&cursor, "--peer-only", false, &failed, err)) {
            args->options.peer_only = true;
        } else if (arg_match(&cursor, "--repeats", true, &failed, err)) {
            if (!failed && parse_int_arg("--repeats", cursor.value, 1, 1000, &args->options.repeats, err)) return -1;
            repeats_given = true;
        } else {
            return arg_unknown(&cursor, err);
        }
        if (failed) return -1;
    }
    if (!repeats_given) args->options.repeats = args->options.quick ? 1 : 3;
    args->options.peer.busy = true;
    const bench_peer_options* peer = &args->options.peer;
    if ((peer->models || peer->batched_bench_path || args->options.peer_only) && !peer->bench_path)
        return error_set(err,
                         "servelab bench: --peer-models, --peer-batched-bench and --peer-only need --peer-bench PATH");
    if (peer->bench_path && !peer->models)
        return error_set(err, "servelab bench: --peer-bench needs --peer-models DIR or FILE,FILE,...");
    return 0;
}

// On a terminal (or with --progress) each part rewrites the progress line;
// elsewhere (a log) it is a line of its own, as it always was: the log then
// keeps every figure with the time it was printed.
static void print_progress(void* user, const char* text, int parts_done, int parts_total) {
    progress* line = user;
    if (line) {
        progress_set(line, text, parts_done, parts_total, "parts");
        return;
    }
    fprintf(stderr, "bench: %s\n", text);
    fflush(stderr);
}

// ---- output -------------------------------------------------------------------------

// a / b, or 0 where b was not measured.
static double ratio_or_zero(double a, double b) { return b > 0 ? a / b : 0.0; }

// A probe series for the machine lines: " 56.6 58.1 ... 62.5)\n".
static void print_probes(const double* values, int n) {
    for (int i = 0; i < n; i++)
        printf(" %.1f", values[i]);
    printf(")\n");
}

// "312.4 [298.1-320.5]": the median and the range over the rounds.
static void print_spread(const bench_peer_spread* s, const char* format, int width) {
    char text[64];
    snprintf(text, sizeof text, format, s->median, s->min, s->max);
    printf(" %-*s", width, text);
}

static void print_peer(const bench_peer_report* p) {
    if (!p->measured) {
        printf("against a peer: not measured (%s)\n", p->not_measured);
        return;
    }
    printf("against a peer: llama.cpp (%s), the same GGUF files, %d threads each\n"
           "  %d interleaved rounds (servelab, llama.cpp, servelab, ...); median [min-max] over the rounds; the\n"
           "  ratio is taken round by round. Busy rows: decode beside a one-core busy loop over quiet decode of the\n"
           "  same round, each engine its own\n",
           p->peer, p->n_threads, p->rounds);
    printf("  %-26s %-24s %-24s %s\n", "row", "servelab", "llama.cpp", "servelab / llama.cpp");
    for (int i = 0; i < p->n_rows; i++) {
        const bench_peer_row* row = &p->rows[i];
        char name[64];
        bench_peer_row_name(row, name, sizeof name);
        printf("  %-26s", name);
        const char* format = row->kind == PEER_BUSY ? "%.2fx [%.2f-%.2f]" : "%.1f [%.1f-%.1f]";
        print_spread(&row->servelab, format, 24);
        print_spread(&row->peer, format, 24);
        print_spread(&row->ratio, "%.2fx [%.2f-%.2f]", 0);
        printf("\n");
    }
    printf("  (tok/s; batch 16: output tokens of all 16 sequences per second)\n");
}

static void print_targets(const bench_report* r) {
    bench_target targets[BENCH_MAX_TARGETS];
    int n_targets = bench_targets(r, targets);
    printf("\ntargets (the project's performance goals, for the stories110m shape)\n  %-44s %-26s %-16s %s\n", "target",
           "this run", "wanted", "met");
    for (int i = 0; i < n_targets; i++)
        printf("  %-44s %-26s %-16s %s\n", targets[i].what, targets[i].measured, targets[i].wanted,
               !targets[i].was_measured ? "-"
               : targets[i].met         ? "yes"
                                        : "no");
}

static void print_table(const bench_report* r) {
    printf("servelab bench: model %s, %d threads, SIMD %s\n\n", r->model, r->n_threads, r->simd_level);
    if (r->peer_only) {
        print_peer(&r->peer);
        print_targets(r);
        return;
    }
    printf("machine\n");
    printf("  streaming read   %8.1f GB/s     (buffer %zu MiB; probes over the run", r->bandwidth_gb_s,
           r->stream_buffer_bytes >> 20);
    print_probes(r->probe_bandwidth_gb_s, r->n_probes);
    printf("  fp32 FMA peak    %8.1f GFLOP/s  (probes over the run", r->peak_gflop_s);
    print_probes(r->probe_peak_gflop_s, r->n_probes);
    printf("  (probes before the sections, after each weight format's sections and at the end; fractions below are\n"
           "  of the highest)\n\n");

    printf("decode, batch 1, %d tokens\n", r->decode_tokens);
    printf("  %-11s %9s %8s %7s %6s %8s\n", "dtype", "tok/s", "GB/s", "of bw", "x fp16", "MB/tok");
    for (int i = 0; i < r->n_decode; i++) {
        const bench_decode* d = &r->decode[i];
        printf("  %-11s %9.1f %8.1f %6.0f%% %6.2f %8.1f\n", d->dtype, d->tok_s, d->gb_s, 100.0 * d->frac_of_bw,
               d->x_fp16, d->bytes_per_token / 1e6);
    }
    printf("\nprefill\n  %-11s %6s %9s %9s %7s\n", "dtype", "tokens", "tok/s", "GFLOP/s", "of peak");
    for (int i = 0; i < r->n_prefill; i++) {
        const bench_prefill* p = &r->prefill[i];
        printf("  %-11s %6d %9.1f %9.1f %6.0f%%\n", p->dtype, p->tokens, p->tok_s, p->gflop_s, 100.0 * p->frac_of_peak);
    }
    printf("\nbatch scaling, %s decode (roofline: flattens near batch %.1f; with every FLOP at the FMA peak, at\n"
           "most %.2fx batch 1)\n  %5s %9s %8s\n",
           r->batch_dtype, r->roofline_flat_batch, r->batch_peak_ceiling_x, "batch", "tok/s", "x b=1");
    for (int i = 0; i < r->n_batch; i++)
        printf("  %5d %9.1f %8.2f\n", r->batch[i].batch, r->batch[i].tok_s, r->batch[i].x_batch1);
    printf("\nattention, fp16 KV, one query through every layer, one thread | the same bytes read alone, paged/c\n"
           "  %7s %12s %12s %8s | %13s %13s\n",
           "context", "paged us", "contig. us", "paged/c", "hardware pf", "+ software pf");
    for (int i = 0; i + 1 < r->n_attention; i += 2) {
        const bench_attention* paged = &r->attention[i];
        const bench_attention* contiguous = &r->attention[i + 1];
        printf("  %7d %12.1f %12.1f %8.3f | %13.3f %13.3f\n", paged->context, paged->us_per_token,
               contiguous->us_per_token, ratio_or_zero(paged->us_per_token, contiguous->us_per_token),
               ratio_or_zero(paged->read_us_per_token, contiguous->read_us_per_token),
               ratio_or_zero(paged->read_prefetched_us_per_token, contiguous->read_prefetched_us_per_token));
    }
    printf("  (reading 16-slot blocks scattered over the pool costs the memory system itself this much more than\n"
           "  one run of the same bytes: the hardware prefetcher starts over at every block)\n");
    printf("\nfixed cost per token\n");
    if (r->small_model.measured)
        printf("  %s decode: %.0f tok/s (%.1f us per token)\n", r->small_model.path, r->small_model.tok_s,
               r->small_model.us_per_token);
    else
        printf("  stories260K not found: not measured\n");
    printf("\n");
    print_peer(&r->peer);
    print_targets(r);
}

// ---- JSON (Jansson) -----------------------------------------------------------------
// Every JSON builder below returns NULL when out of memory (Jansson's
// json_pack and json_array_append_new take the references they are given
// even when they fail, so a failure anywhere leaves one NULL at the top).

static json_t* json_decimals(double value, int decimals) { return json_out_rounded(value, decimals, 0); }
// Ratios and fractions go out with 6 significant digits, not a fixed number
// of decimals: on a slow run (a sanitizer build, a tiny model) a fraction
// of the bandwidth can be 0.002, which 4 decimals would round by 3%.
static json_t* json_digits(double value, int digits) { return json_out_rounded(value, 0, digits); }

static json_t* probes_json(const double* values, int n) {
    json_t* array = json_array();
    for (int i = 0; i < n && array; i++)
        json_out_append(&array, json_decimals(values[i], 3));
    return array;
}

static json_t* decode_json(const bench_report* r) {
    json_t* array = json_array();
    for (int i = 0; i < r->n_decode && array; i++) {
        const bench_decode* d = &r->decode[i];
        json_out_append(&array, json_pack("{s:s, s:o, s:o, s:o, s:o, s:o}", "dtype", d->dtype, "tok_s",
                                          json_decimals(d->tok_s, 3), "gb_s", json_digits(d->gb_s, 6), "frac_of_bw",
                                          json_digits(d->frac_of_bw, 6), "bytes_per_token",
                                          json_out_whole(d->bytes_per_token), "x_fp16", json_digits(d->x_fp16, 6)));
    }
    return array;
}

static json_t* prefill_json(const bench_report* r) {
    json_t* array = json_array();
    for (int i = 0; i < r->n_prefill && array; i++) {
        const bench_prefill* p = &r->prefill[i];
        json_out_append(&array, json_pack("{s:s, s:i, s:o, s:o, s:o}", "dtype", p->dtype, "tokens", p->tokens, "tok_s",
                                          json_decimals(p->tok_s, 3), "gflop_s", json_digits(p->gflop_s, 6),
                                          "frac_of_peak", json_digits(p->frac_of_peak, 6)));
    }
    return array;
}

static json_t* batch_json(const bench_report* r) {
    json_t* array = json_array();
    for (int i = 0; i < r->n_batch && array; i++)
        json_out_append(&array, json_pack("{s:i, s:o, s:o}", "batch", r->batch[i].batch, "tok_s",
                                          json_decimals(r->batch[i].tok_s, 3), "x_batch1",
                                          json_digits(r->batch[i].x_batch1, 6)));
    return array;
}

static json_t* attention_json(const bench_report* r) {
    json_t* array = json_array();
    for (int i = 0; i < r->n_attention && array; i++) {
        const bench_attention* a = &r->attention[i];
        json_out_append(&array, json_pack("{s:s, s:i, s:o, s:o, s:o}", "layout", a->layout, "context", a->context,
                                          "us_per_token", json_decimals(a->us_per_token, 3), "read_us_per_token",
                                          json_decimals(a->read_us_per_token, 3), "read_prefetched_us_per_token",
                                          json_decimals(a->read_prefetched_us_per_token, 3)));
    }
    return array;
}

static json_t* small_model_json(const bench_small_model* s) {
    if (!s->measured) return json_null();
    return json_pack("{s:o, s:o, s:o}", "path", json_out_text(s->path), "tok_s", json_decimals(s->tok_s, 3),
                     "us_per_token", json_decimals(s->us_per_token, 3));
}

static json_t* targets_json(const bench_report* r) {
    bench_target targets[BENCH_MAX_TARGETS];
    int n_targets = bench_targets(r, targets);
    json_t* array = json_array();
    for (int i = 0; i < n_targets && array; i++)
        json_out_append(&array, json_pack("{s:s, s:s, s:s, s:b, s:b}", "target", targets[i].what, "measured",
                                          targets[i].measured, "wanted", targets[i].wanted, "was_measured",
                                          targets[i].was_measured, "met", targets[i].met));
    return array;
}

static json_t* spread_json(const bench_peer_spread* s) {
    return json_pack("{s:o, s:o, s:o}", "median", json_digits(s->median, 6), "min", json_digits(s->min, 6), "max",
                     json_digits(s->max, 6));
}

static const char* const PEER_KIND_NAMES[] = {"decode", "prefill", "batch16_decode", "busy_decode_kept"};

// The peer section: {"measured": false, "not_measured": why} or the rows.
static json_t* peer_json(const bench_peer_report* p) {
    if (!p->measured) return json_pack("{s:b, s:s}", "measured", 0, "not_measured", p->not_measured);
    json_t* rows = json_array();
    for (int i = 0; i < p->n_rows && rows; i++) {
        const bench_peer_row* row = &p->rows[i];
        char name[64];
        bench_peer_row_name(row, name, sizeof name);
        json_out_append(&rows, json_pack("{s:s, s:s, s:s, s:i, s:i, s:o, s:o, s:o}", "row", name, "kind",
                                         PEER_KIND_NAMES[row->kind], "format", row->format, "tokens", row->tokens,
                                         "rounds", row->rounds, "servelab", spread_json(&row->servelab), "llama_cpp",
                                         spread_json(&row->peer), "ratio", spread_json(&row->ratio)));
    }
    return json_pack("{s:b, s:o, s:i, s:i, s:o}", "measured", 1, "peer", json_out_text(p->peer), "rounds", p->rounds,
                     "threads", p->n_threads, "rows", rows);
}

// One JSON object on stdout, keys in the order they are added, ", " and ": "
// between items and no newlines (what the hand-written JSON printed). 0, or
// 1 with the reason on stderr.
static int print_json(const bench_report* r) {
    json_t* root = json_pack(
        "{s:o, s:i, s:s, s:I, s:o, s:o, s:o, s:o, s:i, s:o, s:o, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "model",
        json_out_text(r->model), "threads", r->n_threads, "simd", r->simd_level, "stream_buffer_bytes",
        (json_int_t)r->stream_buffer_bytes, "bandwidth_gb_s", json_decimals(r->bandwidth_gb_s, 3), "peak_gflop_s",
        json_decimals(r->peak_gflop_s, 3), "bandwidth_probes_gb_s", probes_json(r->probe_bandwidth_gb_s, r->n_probes),
        "peak_probes_gflop_s", probes_json(r->probe_peak_gflop_s, r->n_probes), "decode_tokens", r->decode_tokens,
        "decode", decode_json(r), "prefill", prefill_json(r), "batch_dtype", r->batch_dtype, "roofline_flat_batch",
        json_decimals(r->roofline_flat_batch, 3), "roofline_flops_per_token",
        json_digits(r->roofline_flops_per_token, 6), "batch_peak_ceiling_x", json_digits(r->batch_peak_ceiling_x, 6),
        "batch_scaling", batch_json(r), "attention", attention_json(r), "small_model",
        small_model_json(&r->small_model), "targets", targets_json(r));
    if (root && json_object_set_new(root, "peer", peer_json(&r->peer)) != 0) {
        json_decref(root);
        root = NULL;
    }
    return json_out_print(root, 0, "bench");
}

int command_bench(int argc, char** argv) {
    if (cli_answer_help(argc, argv, BENCH_USAGE, NULL)) return 0;
    error_info err = {{0}};
    bench_args args;
    if (parse_bench_args(argc, argv, &args, &err)) return cli_usage_error(&err);
    bench_report report;
    progress* line = progress_start("servelab bench", args.progress_forced);
    int status = bench_run(&args.options, &report, print_progress, line, &err);
    progress_finish(line);
    if (status) {
        fprintf(stderr, "servelab bench: %s\n", err.message);
        return 1;
    }
    if (args.json) return print_json(&report);
    print_table(&report);
    return 0;
}
