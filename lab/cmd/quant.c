// servelab quant: quantize a model (and measure what it cost) or one tensor
// (and show its step size against its histogram).
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model_eval.h"
#include "engine/model_quant.h"
#include "engine/model_synth.h"
#include "engine/quant.h"
#include "lab/common/calibration.h"
#include "lab/common/cli_args.h"
#include "lab/cmd/cli.h"
#include "lab/cmd/commands.h"
#include "lab/common/model_source.h"
#include "lab/common/progress.h"
#include "lab/common/json_out.h"

static const char QUANT_USAGE[] =
    "usage: servelab quant --model M --scheme w8a16|w4a16|w8a8|w4a8 [--group G] [--method rtn|awq|gptq]\n"
    "                      [--sym|--asym] [--json] [--progress]\n"
    "       servelab quant --model M --tensor NAME --bits B [--granularity tensor|channel|group:G]\n"
    "                      [--sym|--asym] [--clip] [--set K]\n"
    "\n"
    "The first form quantizes every linear layer and reports, per layer, the mean\n"
    "step size, the MSE and largest error against the original weights and the\n"
    "clipped count; then, on an evaluation stream kept apart from calibration,\n"
    "the mean KL divergence of the next-token distributions against the\n"
    "unquantized model, top-1 agreement, the perplexity of both, and the weight\n"
    "bytes before and after. --group 0 means one scale per output channel.\n"
    "\n"
    "The second form quantizes one tensor (layers.L.wq|wk|wv|wo|w1|w2|w3,\n"
    "token_embedding) with b bits and prints its statistics and a histogram of\n"
    "one parameter set (--set K; default the set with the widest range) with\n"
    "the quantization levels marked.\n"
    "\n"
    "  --model PATH|PRESET   (default: as generate)   --tokenizer FILE   --dtype fp32|fp16\n"
    "  --progress            AWQ and GPTQ take a while: their progress line (parts done,\n"
    "                        elapsed time) shows on a terminal; this shows it elsewhere too\n";

typedef struct quant_args {
    model_request request;
    const char* scheme;
    int group; // -1: the scheme's default; 0: per channel
    const char* method;
    int symmetric; // -1 default, 0 asym, 1 sym
    bool json;
    bool progress_forced;
    const char* tensor;
    int bits;
    quant_scheme tensor_scheme;
    int set_index; // -1: widest
} quant_args;

static int parse_granularity(const char* text, quant_scheme* scheme, error_info* err) {
    if (strcmp(text, "tensor") == 0) scheme->granularity = QUANT_PER_TENSOR;
    else if (strcmp(text, "channel") == 0) scheme->granularity = QUANT_PER_CHANNEL;
    else if (strncmp(text, "group:", 6) == 0) {
        scheme->granularity = QUANT_PER_GROUP;
        return parse_int_arg("--granularity group:G", text + 6, 1, 1 << 20, &scheme->group_size, err);
    } else
        return error_set(err, "--granularity: expected tensor, channel or group:G, found '%s'", text);
    return 0;
}

static int parse_quant_args(int argc, char** argv, quant_args* a, error_info* err) {
    memset(a, 0, sizeof *a);
    a->request.synth_seed = SYNTH_DEFAULT_SEED;
    a->group = -1;
    a->symmetric = -1;
    a->set_index = -1;
    a->tensor_scheme = (quant_scheme){0, true, QUANT_PER_CHANNEL, 0, false};
    arg_cursor cursor = {argc, argv, 1, "servelab quant", NULL};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        if (model_option_match(&cursor, &a->request, &failed, err)) {
        } else if (arg_match(&cursor, "--scheme", true, &failed, err)) {
            if (!failed) a->scheme = cursor.value;
        } else if (arg_match(&cursor, "--group", true, &failed, err)) {
            if (!failed && parse_int_arg("--group", cursor.value, 0, 1 << 20, &a->group, err)) return -1;
        } else if (arg_match(&cursor, "--method", true, &failed, err)) {
            if (!failed) a->method = cursor.value;
        } else if (arg_match(&cursor, "--sym", false, &failed, err)) {
            a->symmetric = 1;
        } else if (arg_match(&cursor, "--asym", false, &failed, err)) {
            a->symmetric = 0;
        } else if (arg_match(&cursor, "--json", false, &failed, err)) {
            a->json = true;
        } else if (arg_match(&cursor, "--progress", false, &failed, err)) {
            a->progress_forced = true;
        } else if (arg_match(&cursor, "--tensor", true, &failed, err)) {
            if (!failed) a->tensor = cursor.value;
        } else if (arg_match(&cursor, "--bits", true, &failed, err)) {
            if (!failed && parse_int_arg("--bits", cursor.value, 2, 8, &a->tensor_scheme.bits, err)) return -1;
        } else if (arg_match(&cursor, "--granularity", true, &failed, err)) {
            if (!failed && parse_granularity(cursor.value, &a->tensor_scheme, err)) return -1;
        } else if (arg_match(&cursor, "--clip", false, &failed, err)) {
            a->tensor_scheme.clip_search = true;
        } else if (arg_match(&cursor, "--set", true, &failed, err)) {
            if (!failed && parse_int_arg("--set", cursor.value, 0, 1 << 30, &a->set_index, err)) return -1;
        } else {
            return arg_unknown(&cursor, err);
        }
        if (failed) return -1;
    }
    if (!a->tensor && !a->scheme)
        return error_set(err, "servelab quant: give --scheme (a whole model) or --tensor NAME --bits B (one tensor)");
    if (a->tensor && a->tensor_scheme.bits == 0) return error_set(err, "servelab quant: --tensor needs --bits B (2..8)");
    if (a->symmetric >= 0) a->tensor_scheme.symmetric = a->symmetric == 1;
    return 0;
}

// ---- one tensor ------------------------------------------------------------------------

static void print_histogram(const float* values, size_t n, const quant_params* p, int bits, bool symmetric) {
    enum { BINS = 48, WIDTH = 50 };
    float low = values[0], high = values[0];
    for (size_t i = 1; i < n; i++) {
        if (values[i] < low) low = values[i];
        if (values[i] > high) high = values[i];
    }
    // Show the quantization range too, whichever is wider.
    float range_low = quant_dequantize(quant_code_min(bits, symmetric), p);
    float range_high = quant_dequantize(quant_code_max(bits, symmetric), p);
    if (range_low < low) low = range_low;
    if (range_high > high) high = range_high;
    if (high <= low) high = low + 1e-6f;
    int counts[BINS] = {0}, levels[BINS] = {0}, max_count = 1;
    for (size_t i = 0; i < n; i++) {
        int bin = (int)((values[i] - low) / (high - low) * BINS);
        bin = bin < 0 ? 0 : bin >= BINS ? BINS - 1 : bin;
        if (++counts[bin] > max_count) max_count = counts[bin];
    }
    for (int32_t q = quant_code_min(bits, symmetric); q <= quant_code_max(bits, symmetric); q++) {
        int bin = (int)((quant_dequantize(q, p) - low) / (high - low) * BINS);
        levels[bin < 0 ? 0 : bin >= BINS ? BINS - 1 : bin]++;
    }
    printf("histogram (each row a bin; '|' marks bins holding quantization levels, with their count):\n");
    for (int b = 0; b < BINS; b++) {
        float from = low + (high - low) * b / BINS;
        int bar = (int)((long)counts[b] * WIDTH / max_count);
        printf("%+11.5f %c %6d ", from, levels[b] ? '|' : ' ', counts[b]);
        for (int k = 0; k < bar; k++) putchar('#');
        if (levels[b] > 1) printf("  (%d levels)", levels[b]);
        putchar('\n');
    }
}

static int run_tensor(const model* m, const quant_args* a) {
    error_info err = {{0}};
    const weight_matrix* w = model_matrix_by_name(m, a->tensor);
    if (!w) {
        fprintf(stderr, "servelab quant: --tensor: no tensor '%s' (token_embedding, classifier, layers.0..%d.wq|wk|wv|wo|w1|w2|w3)\n",
                a->tensor, m->config.n_layers - 1);
        return 2;
    }
    quant_scheme scheme = a->tensor_scheme;
    if (quant_scheme_validate(&scheme, w->cols, &err)) {
        fprintf(stderr, "servelab quant: %s: %s\n", a->tensor, err.message);
        return 2;
    }
    size_t n = (size_t)w->rows * (size_t)w->cols;
    float* values = malloc(n * sizeof *values);      // (rows, cols)
    int32_t* codes = malloc(n * sizeof *codes);      // (rows, cols)
    int n_sets = quant_param_count(w->rows, w->cols, &scheme);
    quant_params* params = malloc((size_t)n_sets * sizeof *params);
    float* set_values = malloc(n * sizeof *set_values); // one set's values
    int status = 1;
    if (!values || !codes || !params || !set_values) {
        fprintf(stderr, "servelab quant: out of memory\n");
        goto done;
    }
    for (int r = 0; r < w->rows; r++) weight_row_to_f32(values + (size_t)r * (size_t)w->cols, w, r, NULL);
    if (quant_matrix_rtn(values, w->rows, w->cols, &scheme, codes, params, &err)) {
        fprintf(stderr, "servelab quant: %s\n", err.message);
        goto done;
    }
    quant_stats total = quant_matrix_stats(values, codes, params, w->rows, w->cols, &scheme, -1);
    int set = a->set_index;
    if (set >= n_sets) {
        fprintf(stderr, "servelab quant: --set %d: the tensor has %d parameter sets (0..%d)\n", set, n_sets, n_sets - 1);
        status = 2;
        goto done;
    }
    if (set < 0) { // the widest range: where the step size hurts most
        set = 0;
        for (int k = 1; k < n_sets; k++)
            if (params[k].scale > params[set].scale) set = k;
    }
    quant_stats one = quant_matrix_stats(values, codes, params, w->rows, w->cols, &scheme, set);
    size_t n_set = 0;
    for (int r = 0; r < w->rows; r++)
        for (int i = 0; i < w->cols; i++)
            if (quant_param_index(r, i, w->rows, w->cols, &scheme) == set)
                set_values[n_set++] = values[(size_t)r * (size_t)w->cols + (size_t)i];
    const char* granularity = scheme.granularity == QUANT_PER_TENSOR    ? "per tensor"
                              : scheme.granularity == QUANT_PER_CHANNEL ? "per channel"
                                                                        : "per group";
    printf("%s: (%d, %d), %d-bit %s, %s%s", a->tensor, w->rows, w->cols, scheme.bits,
           scheme.symmetric ? "symmetric" : "asymmetric", granularity, scheme.clip_search ? ", clipping search" : "");
    if (scheme.granularity == QUANT_PER_GROUP) printf(" of %d", scheme.group_size);
    printf(", %d parameter sets\n", n_sets);
    printf("whole tensor: mean s %.6g, MSE %.6g, max |r - r_hat| %.6g, clipped %lld, every in-range error <= s/2: %s\n",
           (double)total.scale, total.mse, (double)total.max_abs_error, (long long)total.n_clipped,
           total.within_half_step ? "yes" : "no");
    printf("set %d (%zu values): s %.6g, z %d, range [%.6g, %.6g], MSE %.6g, max error %.6g (s/2 = %.6g), clipped %lld\n",
           set, n_set, (double)params[set].scale, params[set].zero_point, (double)params[set].range_min,
           (double)params[set].range_max, one.mse, (double)one.max_abs_error, (double)params[set].scale / 2,
           (long long)one.n_clipped);
    print_histogram(set_values, n_set, &params[set], scheme.bits, scheme.symmetric);
    status = 0;
done:
    free(values);
    free(codes);
    free(params);
    free(set_values);
    return status;
}

// ---- a whole model -------------------------------------------------------------------------

// The scheme, group, symmetry and method of the flags as one spec; 0, or 2
// (a usage error, printed) before any model is loaded.
static int model_spec_from_args(const quant_args* a, model_quant_spec* out) {
    error_info err = {{0}};
    char spec_text[128];
    snprintf(spec_text, sizeof spec_text, "%s", a->scheme);
    model_quant_spec spec;
    if (model_quant_spec_parse(spec_text, &spec, &err)) {
        // The parser speaks of --quant (generate's flag); here the flag is --scheme.
        const char* message = strncmp(err.message, "--quant: ", 9) == 0 ? err.message + 9 : err.message;
        fprintf(stderr, "servelab quant: --scheme: %s\n", message);
        return 2;
    }
    if (a->group >= 0) spec.group_size = a->group;
    if (a->symmetric >= 0) spec.symmetric = a->symmetric == 1;
    if (a->method) {
        if (strcmp(a->method, "rtn") == 0) spec.method = QUANT_RTN;
        else if (strcmp(a->method, "awq") == 0) spec.method = QUANT_AWQ;
        else if (strcmp(a->method, "gptq") == 0) spec.method = QUANT_GPTQ;
        else {
            fprintf(stderr, "servelab quant: --method: expected rtn, awq or gptq, found '%s'\n", a->method);
            return 2;
        }
    }
    if (spec.scheme == QUANT_W8A8 && !spec.symmetric) {
        fprintf(stderr, "servelab quant: w8a8 needs symmetric weights (drop --asym)\n");
        return 2;
    }
    *out = spec;
    return 0;
}

// ---- JSON (Jansson) -------------------------------------------------------------------------
// The builders return NULL when out of memory (json_pack and
// json_array_append_new take the references they are given even when they
// fail, so a failure anywhere leaves one NULL at the top).

static json_t* layer_json(const quant_layer_report* l) {
    json_t* object = json_pack("{s:o, s:o, s:o, s:o, s:I}", "name", json_out_text(l->name), "scale_mean",
                               json_out_rounded(l->scale_mean, 0, 6), "mse", json_out_rounded(l->mse, 0, 6), "max_err",
                               json_out_rounded(l->max_error, 0, 6), "clipped", (json_int_t)l->clipped);
    if (object && l->awq_alpha >= 0 &&
        json_object_set_new(object, "awq_alpha", json_out_rounded((double)l->awq_alpha, 3, 0)) != 0) {
        json_decref(object);
        return NULL;
    }
    return object;
}

// One compact JSON object on stdout, keys in the order they are added (as
// the hand-written JSON printed it). 0, or 1 with the reason on stderr.
static int print_json(const char* model_label, const char* description, const model_quant_report* report,
                      const model_comparison* comparison) {
    json_t* layers = json_array();
    for (int i = 0; i < report->n_layers && layers; i++) json_out_append(&layers, layer_json(&report->layers[i]));
    json_t* root = json_pack(
        "{s:o, s:s, s:I, s:I, s:o, s:o, s:o, s:o, s:i, s:i, s:o}", "model", json_out_text(model_label), "scheme",
        description, "weight_bytes", (json_int_t)report->weight_bytes_after, "weight_bytes_ref",
        (json_int_t)report->weight_bytes_before, "kl_mean", json_out_rounded(comparison->kl_mean, 0, 6), "top1_agreement",
        json_out_rounded(comparison->top1_agreement, 6, 0), "ppl", json_out_rounded(comparison->ppl_test, 0, 6), "ppl_ref",
        json_out_rounded(comparison->ppl_reference, 0, 6), "eval_positions", comparison->n_positions, "calibration_tokens",
        report->n_calibration_tokens, "layers", layers);
    return json_out_print(root, JSON_COMPACT, "quant");
}

// AWQ and GPTQ run the model over the calibration stream and solve per
// layer (GPTQ W4A16 on small: 33 s on 2 cores); RTN is one pass over the weights. The
// parts are engine calls with no hook inside, so the count moves 5 times
// and the clock between: loading, the copy, the streams, quantizing and
// the evaluation.
enum { QUANT_PARTS = 5 };

// `line` (NULL when not shown) is finished here.
static int run_model(model_source* reference, const quant_args* a, model_quant_spec spec, progress* line) {
    error_info err = {{0}};
    progress_set(line, "copying the model to quantize", 1, QUANT_PARTS, "parts");
    model_request request = a->request;
    model_source test;
    if (model_source_open(&test, &request, &err)) {
        progress_finish(line);
        fprintf(stderr, "servelab quant: %s\n", err.message);
        return 1;
    }
    calibration_set calibration = {0}, evaluation = {0};
    model_quant_report report = {0};
    model_comparison comparison = {0};
    thread_pool* pool = NULL;
    thread_pool_create(0, &pool);
    int status = 1;
    char quantizing[64];
    snprintf(quantizing, sizeof quantizing, "quantizing (%s)", spec.method == QUANT_GPTQ ? "GPTQ" : "AWQ");
    progress_set(line, "calibration and evaluation streams", 2, QUANT_PARTS, "parts");
    bool failed =
        calibration_build(&reference->model, reference->tokenizer, CALIBRATION_FOR_QUANTIZATION, &calibration, &err) ||
        calibration_build(&reference->model, reference->tokenizer, CALIBRATION_FOR_EVALUATION, &evaluation, &err);
    if (!failed) {
        progress_set(line, quantizing, 3, QUANT_PARTS, "parts");
        failed = model_quantize(&test.model, &spec, (const int32_t* const*)calibration.sequences, calibration.lengths,
                                calibration.n_sequences, pool, &report, &err) != 0;
    }
    if (!failed) {
        progress_set(line, "evaluating against the original", 4, QUANT_PARTS, "parts");
        failed = model_compare(&reference->model, &test.model, (const int32_t* const*)evaluation.sequences,
                               evaluation.lengths, evaluation.n_sequences, pool, &comparison, &err) != 0;
    }
    progress_set(line, "done", QUANT_PARTS, QUANT_PARTS, "parts");
    progress_finish(line);
    if (failed) {
        fprintf(stderr, "servelab quant: %s\n", err.message);
        goto done;
    }
    char description[96];
    model_quant_spec_describe(&spec, description, sizeof description);
    if (a->json) {
        if (print_json(reference->model_label, description, &report, &comparison)) goto done;
    } else {
        printf("%s quantized %s (%d calibration tokens, %s)\n", reference->model_label, description,
               report.n_calibration_tokens, calibration.from_text ? "built-in stories" : "sampled from the model");
        printf("%-22s %12s %12s %12s %9s\n", "layer", "mean step s", "MSE", "max error", "clipped");
        for (int i = 0; i < report.n_layers; i++) {
            const quant_layer_report* l = &report.layers[i];
            printf("%-22s %12.4g %12.4g %12.4g %9lld", l->name, l->scale_mean, l->mse, l->max_error, (long long)l->clipped);
            if (l->awq_alpha >= 0) printf("  awq alpha %.2f", (double)l->awq_alpha);
            printf("\n");
        }
        printf("weight bytes: %llu -> %llu (%.2fx smaller)\n", (unsigned long long)report.weight_bytes_before,
               (unsigned long long)report.weight_bytes_after,
               (double)report.weight_bytes_before / (double)report.weight_bytes_after);
        printf("evaluation (%d positions, %s): KL(ref || quant) %.5f nats, top-1 agreement %.2f%%, perplexity %.3f "
               "(reference %.3f)\n",
               comparison.n_positions, evaluation.from_text ? "built-in stories" : "sampled from the model",
               comparison.kl_mean, 100.0 * comparison.top1_agreement, comparison.ppl_test, comparison.ppl_reference);
    }
    status = 0;
done:
    thread_pool_free(pool);
    model_quant_report_free(&report);
    calibration_free(&calibration);
    calibration_free(&evaluation);
    model_source_close(&test);
    return status;
}

int command_quant(int argc, char** argv) {
    if (cli_answer_help(argc, argv, QUANT_USAGE, NULL)) return 0;
    error_info err = {{0}};
    quant_args a;
    if (parse_quant_args(argc, argv, &a, &err)) return cli_usage_error(&err);
    model_quant_spec spec = {0};
    if (!a.tensor && model_spec_from_args(&a, &spec)) return 2;
    progress* line = a.tensor || spec.method == QUANT_RTN ? NULL : progress_start("servelab quant", a.progress_forced);
    progress_set(line, "loading the model", 0, QUANT_PARTS, "parts");
    model_source reference;
    if (model_source_open(&reference, &a.request, &err)) {
        progress_finish(line);
        fprintf(stderr, "servelab quant: %s\n", err.message);
        return 1;
    }
    int status = a.tensor ? run_tensor(&reference.model, &a) : run_model(&reference, &a, spec, line);
    model_source_close(&reference);
    return status;
}
