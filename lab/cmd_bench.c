// servelab bench: the performance harness (lab/bench.h measures, this file
// parses the flags and prints a table or JSON).
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model_synth.h"
#include "lab/bench.h"
#include "lab/cli_args.h"
#include "lab/commands.h"
#include "lab/progress.h"
#include "lab/json_out.h"

static const char BENCH_USAGE[] =
    "usage: servelab bench [--json] [--model M|PRESET] [--threads N] [--repeats R] [--quick] [--progress]\n"
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
    "  targets    the project's CPU performance goals judged on this run: met, not\n"
    "             met, or not measured (a figure the run did not produce is never met)\n"
    "\n"
    "  --model M|PRESET  checkpoint or preset (default stories110m: dim 768, 12 layers)\n"
    "  --threads N       worker threads (default: one per online CPU)\n"
    "  --repeats R       runs per figure (default 3)\n"
    "  --quick           16 decode tokens, 4 batch steps, 64 MiB bandwidth buffer, 1 repeat\n"
    "                    unless --repeats: a smoke test, not a measurement\n"
    "  --json            one JSON object on stdout instead of the table\n"
    "  --progress        the progress line even when stderr is not a terminal\n"
    "\n"
    "Progress goes to stderr: on a terminal one line rewritten in place (parts of\n"
    "the run done, elapsed time, the latest figure), elsewhere a line per part.\n"
    "The reference columns are published figures for llama.cpp and llama2.c on a\n"
    "2-core AVX-512 EPYC, which the performance goals were set against; they were\n"
    "not measured here.\n";

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
        } else if (arg_match(&cursor, "--quick", false, &failed, err)) {
            args->options.quick = true;
        } else if (arg_match(&cursor, "--model", true, &failed, err)) {
            if (!failed) args->options.model_arg = cursor.value;
        } else if (arg_match(&cursor, "--threads", true, &failed, err)) {
            if (!failed && parse_int_arg("--threads", cursor.value, 1, 256, &args->options.n_threads, err)) return -1;
        } else if (arg_match(&cursor, "--repeats", true, &failed, err)) {
            if (!failed && parse_int_arg("--repeats", cursor.value, 1, 1000, &args->options.repeats, err)) return -1;
            repeats_given = true;
        } else {
            return error_set(err, "servelab bench: unknown option '%s' (see servelab bench --help)",
                             argv[cursor.index]);
        }
        if (failed) return -1;
    }
    if (!repeats_given) args->options.repeats = args->options.quick ? 1 : 3;
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

// ---- the published reference figures (not measured here) ---------------------

typedef struct reference_decode {
    const char* dtype;  // ours
    const char* engine; // theirs: "llama.cpp f16"
    double tok_s, frac_of_bw;
} reference_decode;

static const reference_decode REFERENCE_DECODE[] = {
    {"fp32", "llama2.c run.c fp32", 31, 0.35},
    {"fp16", "llama.cpp f16", 136, 0.78},
    {"w8a16", "llama.cpp q8_0", 169, 0.52},
    {"w4a16 g128", "llama.cpp q4_0", 282, 0.50},
};

static const reference_decode* reference_for(const char* dtype) {
    for (size_t i = 0; i < sizeof REFERENCE_DECODE / sizeof REFERENCE_DECODE[0]; i++)
        if (strcmp(REFERENCE_DECODE[i].dtype, dtype) == 0) return &REFERENCE_DECODE[i];
    return NULL;
}

// llama.cpp's prefill of 128 tokens: f16 1180 tok/s, q4_0 1510.
static double reference_prefill_tok_s(const bench_prefill* p) {
    if (p->tokens != 128) return 0.0;
    if (strcmp(p->dtype, "fp16") == 0) return 1180;
    if (strcmp(p->dtype, "w4a16 g128") == 0) return 1510;
    return 0.0;
}

// ---- output -------------------------------------------------------------------------

// a / b, or 0 where b was not measured.
static double ratio_or_zero(double a, double b) { return b > 0 ? a / b : 0.0; }

// A probe series for the machine lines: " 56.6 58.1 ... 62.5)\n".
static void print_probes(const double* values, int n) {
    for (int i = 0; i < n; i++) printf(" %.1f", values[i]);
    printf(")\n");
}

static void print_table(const bench_report* r) {
    printf("servelab bench: model %s, %d threads, SIMD %s\n\n", r->model, r->n_threads, r->simd_level);
    printf("machine\n");
    printf("  streaming read   %8.1f GB/s     (buffer %zu MiB; probes over the run", r->bandwidth_gb_s,
           r->stream_buffer_bytes >> 20);
    print_probes(r->probe_bandwidth_gb_s, r->n_probes);
    printf("  fp32 FMA peak    %8.1f GFLOP/s  (probes over the run", r->peak_gflop_s);
    print_probes(r->probe_peak_gflop_s, r->n_probes);
    printf("  (probes before the sections, after each weight format's sections and at the end; fractions below are\n"
           "  of the highest)\n\n");

    printf("decode, batch 1, %d tokens            | reference (published, not measured here)\n", r->decode_tokens);
    printf("  %-11s %9s %8s %7s %6s %8s | %-20s %7s %6s\n", "dtype", "tok/s", "GB/s", "of bw", "x fp16", "MB/tok",
           "engine", "tok/s", "of bw");
    for (int i = 0; i < r->n_decode; i++) {
        const bench_decode* d = &r->decode[i];
        const reference_decode* ref = reference_for(d->dtype);
        printf("  %-11s %9.1f %8.1f %6.0f%% %6.2f %8.1f |", d->dtype, d->tok_s, d->gb_s, 100.0 * d->frac_of_bw,
               d->x_fp16, d->bytes_per_token / 1e6);
        if (ref)
            printf(" %-20s %7.0f %5.0f%%\n", ref->engine, ref->tok_s, 100.0 * ref->frac_of_bw);
        else
            printf(" %-20s %7s %6s\n", "-", "-", "-");
    }
    printf("\nprefill\n  %-11s %6s %9s %9s %7s | reference tok/s (llama.cpp, published)\n", "dtype", "tokens", "tok/s",
           "GFLOP/s", "of peak");
    for (int i = 0; i < r->n_prefill; i++) {
        const bench_prefill* p = &r->prefill[i];
        double ref = reference_prefill_tok_s(p);
        printf("  %-11s %6d %9.1f %9.1f %6.0f%% |", p->dtype, p->tokens, p->tok_s, p->gflop_s, 100.0 * p->frac_of_peak);
        if (ref > 0)
            printf(" %.0f\n", ref);
        else
            printf(" -\n");
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
        printf("  %s decode: %.0f tok/s (%.1f us per token) | reference: llama2.c run.c ~9900 tok/s (published)\n",
               r->small_model.path, r->small_model.tok_s, r->small_model.us_per_token);
    else
        printf("  stories260K not found: not measured\n");
    bench_target targets[BENCH_MAX_TARGETS];
    int n_targets = bench_targets(r, targets);
    printf("\ntargets (the project's performance goals, for the stories110m shape)\n  %-44s %-18s %-16s %s\n", "target",
           "this run", "wanted", "met");
    for (int i = 0; i < n_targets; i++)
        printf("  %-44s %-18s %-16s %s\n", targets[i].what, targets[i].measured, targets[i].wanted,
               !targets[i].was_measured ? "-" : targets[i].met ? "yes" : "no");
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
        json_out_append(&array,
               json_pack("{s:s, s:o, s:o, s:o, s:o, s:o}", "dtype", d->dtype, "tok_s", json_decimals(d->tok_s, 3),
                         "gb_s", json_digits(d->gb_s, 6), "frac_of_bw", json_digits(d->frac_of_bw, 6),
                         "bytes_per_token", json_out_whole(d->bytes_per_token), "x_fp16", json_digits(d->x_fp16, 6)));
    }
    return array;
}

static json_t* prefill_json(const bench_report* r) {
    json_t* array = json_array();
    for (int i = 0; i < r->n_prefill && array; i++) {
        const bench_prefill* p = &r->prefill[i];
        json_out_append(&array, json_pack("{s:s, s:i, s:o, s:o, s:o}", "dtype", p->dtype, "tokens", p->tokens, "tok_s",
                                 json_decimals(p->tok_s, 3), "gflop_s", json_digits(p->gflop_s, 6), "frac_of_peak",
                                 json_digits(p->frac_of_peak, 6)));
    }
    return array;
}

static json_t* batch_json(const bench_report* r) {
    json_t* array = json_array();
    for (int i = 0; i < r->n_batch && array; i++)
        json_out_append(&array,
               json_pack("{s:i, s:o, s:o}", "batch", r->batch[i].batch, "tok_s", json_decimals(r->batch[i].tok_s, 3),
                         "x_batch1", json_digits(r->batch[i].x_batch1, 6)));
    return array;
}

static json_t* attention_json(const bench_report* r) {
    json_t* array = json_array();
    for (int i = 0; i < r->n_attention && array; i++) {
        const bench_attention* a = &r->attention[i];
        json_out_append(&array,
               json_pack("{s:s, s:i, s:o, s:o, s:o}", "layout", a->layout, "context", a->context, "us_per_token",
                         json_decimals(a->us_per_token, 3), "read_us_per_token", json_decimals(a->read_us_per_token, 3),
                         "read_prefetched_us_per_token", json_decimals(a->read_prefetched_us_per_token, 3)));
    }
    return array;
}

static json_t* small_model_json(const bench_small_model* s) {
    if (!s->measured) return json_null();
    return json_pack("{s:o, s:o, s:o}", "path", json_out_text(s->path), "tok_s", json_decimals(s->tok_s, 3), "us_per_token",
                     json_decimals(s->us_per_token, 3));
}

static json_t* targets_json(const bench_report* r) {
    bench_target targets[BENCH_MAX_TARGETS];
    int n_targets = bench_targets(r, targets);
    json_t* array = json_array();
    for (int i = 0; i < n_targets && array; i++)
        json_out_append(&array,
               json_pack("{s:s, s:s, s:s, s:b, s:b}", "target", targets[i].what, "measured", targets[i].measured,
                         "wanted", targets[i].wanted, "was_measured", targets[i].was_measured, "met", targets[i].met));
    return array;
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
    return json_out_print(root, 0, "bench");
}

int command_bench(int argc, char** argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(BENCH_USAGE, stdout);
            return 0;
        }
    error_info err = {{0}};
    bench_args args;
    if (parse_bench_args(argc, argv, &args, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 2;
    }
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
