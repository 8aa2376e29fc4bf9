// servelab calc: KV-cache and memory-fit arithmetic for a model on a device,
// every formula printed with its numbers filled in.
//
// The weight arithmetic is the quiz drills' (lab/quiz/drills.c: quiz_weight_bytes,
// quiz_decode_weight_bytes); the KV bytes are written out here from the pool's
// layout (engine/kv_memory.h: int8 KV keeps one fp32 scale per token and
// KV head) and tests/lab/cmd/test_calc.c checks them against the quiz's
// quiz_model_kv_bytes_per_token and the bytes an engine's pool allocates.
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "engine/devices.h"
#include "engine/kv_memory.h"
#include "engine/model_synth.h"
#include "engine/tokenizer.h"
#include "lab/common/cli_args.h"
#include "lab/cmd/cli.h"
#include "lab/cmd/commands.h"
#include "lab/common/json_out.h"
#include "lab/common/model_source.h"
#include "lab/quiz/data.h"
#include "lab/quiz/drills.h"
#include "lab/quiz/models.h"

static const char CALC_USAGE[] =
    "usage: servelab calc [--model PRESET|FILE|NAME] [--device A100|H100|H200|L4|RTX4090|machine]\n"
    "                     [--seq S] [--batch B] [--kv-dtype fp16|int8] [--weights fp16|int8|int4[:gG]]\n"
    "                     [--acceptance A [--draft-tokens K] [--draft-cost C | --draft-weights W]] [--json]\n"
    "\n"
    "KV-cache and memory-fit arithmetic for a model on a device, each formula shown\n"
    "with its numbers filled in: KV bytes per token and for B sequences of S tokens,\n"
    "how many sequences of S tokens fit after the weights (fp16 and int8 KV), the\n"
    "weight bytes at fp16/int8/int4, the roofline's decode time per token at batch B,\n"
    "and the batch where decode stops being memory-bound (the ridge).\n"
    "  --model     a preset (tiny, small, medium, large, stories110m, small:kv6), a model\n"
    "              file (llama2.c checkpoint or .gguf), or a shape named in quiz/models.lua\n"
    "              (Llama-2-7B, Llama-3-8B, Mistral-7B, ...). Default Llama-2-7B\n"
    "  --device    a device model (engine/devices.h), or 'machine': this computer's available\n"
    "              memory (its bandwidth is unknown here: servelab bench measures it). Default H100\n"
    "  --seq S     tokens per sequence (default 4096)\n"
    "  --batch B   sequences decoded together (default 1)\n"
    "  --kv-dtype  fp16 (default) or int8 (1 byte per value + one fp32 scale per token and KV head)\n"
    "  --weights   fp16 (default), int8 or int4, with one fp16 scale per group of G weights\n"
    "              (default group 64, as --quant w4a16)\n"
    "  --acceptance A    speculative decoding: the chance (0 to 1) that the target accepts one\n"
    "              drafted token. Adds the tokens one target pass yields and the speedup over\n"
    "              plain decode, for one target pass plus K draft passes of C target passes each\n"
    "  --draft-tokens K  tokens drafted per target pass (default 4)\n"
    "  --draft-cost C    one draft pass in target passes (0 to 10); without it, C is the draft's\n"
    "              decode weight bytes over the target's\n"
    "  --draft-weights W the draft's format when C comes from bytes: the same model in int8 or\n"
    "              int4[:gG] (default int4:g32, as draft:w4a16:g32)\n"
    "  --json      the same numbers as JSON\n";

enum { CALC_DEFAULT_GROUP = 64, CALC_MAX_LINES = 24 };

// One formula: a name (the JSON key), the formula with its numbers, the value.
typedef struct calc_line {
    char name[40];
    char formula[400];
    double value;
    const char* unit; // "bytes", "s", "sequences", ...
} calc_line;

typedef struct calc_report {
    calc_line lines[CALC_MAX_LINES];
    int n_lines;
} calc_report;

static void add_line(calc_report* r, const char* name, double value, const char* unit, const char* format, ...)
    __attribute__((format(printf, 5, 6)));

static void add_line(calc_report* r, const char* name, double value, const char* unit, const char* format, ...) {
    if (r->n_lines >= CALC_MAX_LINES) return;
    calc_line* line = &r->lines[r->n_lines++];
    snprintf(line->name, sizeof line->name, "%s", name);
    va_list args;
    va_start(args, format);
    vsnprintf(line->formula, sizeof line->formula, format, args);
    va_end(args);
    line->value = value;
    line->unit = unit;
}

// ---- finding the model ------------------------------------------------------------------

static bool is_file(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static void shape_from_config(const model_config* c, const char* name, quiz_model* m) {
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%.47s", name);
    m->n_layers = c->n_layers;
    m->d_model = c->dim;
    m->n_heads = c->n_heads;
    m->n_kv_heads = c->n_kv_heads;
    m->head_dim = c->head_dim > 0 ? c->head_dim : c->dim / c->n_heads;
    m->vocab_size = c->vocab_size;
    m->intermediate_size = c->hidden_dim;
    m->tied_embeddings = c->shared_classifier;
}

// A file (checkpoint or GGUF, loaded), a preset (its shape, with the
// byte-level tokenizer's vocabulary as the engine builds it), or a name in
// quiz/models.lua (case-insensitive). 0, 1 (could not load), 2 (unknown name).
static int find_model(const char* name, quiz_model* out, char* label, size_t label_capacity, error_info* err) {
    if (is_file(name)) {
        model_request request = {name, NULL, MODEL_DTYPE_DEFAULT, SYNTH_DEFAULT_SEED, NULL};
        model_source source;
        if (model_source_open(&source, &request, err)) return 1;
        shape_from_config(&source.model.config, name, out);
        snprintf(label, label_capacity, "%s", source.model_label);
        model_source_close(&source);
        return 0;
    }
    const synth_preset* preset = synth_find_preset(name);
    if (preset) {
        model_config c = preset->shape;
        if (c.vocab_size == 0) c.vocab_size = TOK_MIN_VOCAB_SIZE;
        c.head_dim = c.dim / c.n_heads;
        c.shared_classifier = true; // a synthetic model's classifier shares the embedding
        shape_from_config(&c, name, out);
        snprintf(label, label_capacity, "preset %s (vocabulary %d, byte-level tokenizer)", name, c.vocab_size);
        return 0;
    }
    char dir[1024], path[1100];
    error_info find_err = {{0}};
    if (quiz_find_dir(dir, sizeof dir, &find_err)) {
        error_set(err, "--model: unknown model '%s': not a file, not a preset, and quiz/models.lua was not found (%s)",
                  name, find_err.message);
        return 2;
    }
    snprintf(path, sizeof path, "%s/models.lua", dir);
    quiz_model_list list;
    if (quiz_models_load(path, &list, err)) return 1;
    char known[300] = "";
    int used = 0;
    for (int i = 0; i < list.n_models; i++) {
        if (strcasecmp(list.models[i].name, name) == 0) {
            *out = list.models[i];
            snprintf(label, label_capacity, "%s (quiz/models.lua)", list.models[i].name);
            quiz_models_free(&list);
            return 0;
        }
        if (used < (int)sizeof known)
            used += snprintf(known + used, sizeof known - (size_t)used, "%s%s", i ? ", " : "", list.models[i].name);
    }
    quiz_models_free(&list);
    error_set(err,
              "--model: unknown model '%s' (not a file; presets: tiny, small, medium, large, stories110m; "
              "quiz/models.lua: %s)",
              name, known);
    return 2;
}

// ---- parsing -------------------------------------------------------------------------------

typedef struct calc_device {
    char name[64];
    double capacity_bytes;
    double bandwidth_bytes_per_s; // 0: unknown (this machine)
    double peak_fp16_flops;       // 0: unknown
} calc_device;

static int parse_device(const char* text, calc_device* out, error_info* err) {
    static const char* const KEYS[] = {"A100", "H100", "H200", "L4", "RTX4090"};
    memset(out, 0, sizeof *out);
    if (strcasecmp(text, "machine") == 0) {
        uint64_t available = kv_memory_available_bytes();
        snprintf(out->name, sizeof out->name, "this machine (available memory)");
        out->capacity_bytes = available == UINT64_MAX ? 0 : (double)available;
        return 0;
    }
    char compact[32];
    int n = 0;
    for (const char* p = text; *p && n < (int)sizeof compact - 1; p++)
        if (*p != ' ' && *p != '-' && *p != '_') compact[n++] = (char)toupper((unsigned char)*p);
    compact[n] = '\0';
    int count = 0;
    const device_model* devices = device_models(&count);
    for (int i = 0; i < count && i < (int)(sizeof KEYS / sizeof KEYS[0]); i++) {
        if (strcmp(compact, KEYS[i]) != 0) continue;
        snprintf(out->name, sizeof out->name, "%s", devices[i].name);
        out->capacity_bytes = devices[i].capacity_bytes; // N GiB (engine/devices.c)
        out->bandwidth_bytes_per_s = devices[i].bandwidth_bytes_per_s;
        out->peak_fp16_flops = devices[i].peak_fp16_flops;
        return 0;
    }
    return error_set(err, "--device: unknown device '%s' (expected A100, H100, H200, L4, RTX4090 or machine)", text);
}

static int parse_weights(const char* text, quiz_weight_format* format, int* group_size, error_info* err) {
    const char* colon = strchr(text, ':');
    size_t length = colon ? (size_t)(colon - text) : strlen(text);
    if (length == 4 && strncmp(text, "fp16", 4) == 0)
        *format = QUIZ_WEIGHTS_FP16;
    else if (length == 4 && strncmp(text, "int8", 4) == 0)
        *format = QUIZ_WEIGHTS_INT8;
    else if (length == 4 && strncmp(text, "int4", 4) == 0)
        *format = QUIZ_WEIGHTS_INT4;
    else
        return error_set(err, "--weights: expected fp16, int8 or int4[:gG], found '%s'", text);
    *group_size = CALC_DEFAULT_GROUP;
    if (!colon) return 0;
    if (*format == QUIZ_WEIGHTS_FP16) return error_set(err, "--weights: fp16 has no group size, found '%s'", text);
    if (colon[1] != 'g') return error_set(err, "--weights: expected :gG (a group size, e.g. :g64), found '%s'", text);
    return parse_int_arg("--weights group", colon + 2, 1, 1 << 20, group_size, err);
}

// A double as typed: parse_float_arg checks the range and says what was wrong;
// the value is read again at full precision (0.8 as a float is 0.800000012).
static int parse_fraction_arg(const char* flag, const char* text, double min_value, double max_value, double* out,
                              error_info* err) {
    float checked = 0;
    if (parse_float_arg(flag, text, min_value, max_value, &checked, err)) return -1;
    *out = strtod(text, NULL);
    return 0;
}

// ---- the arithmetic --------------------------------------------------------------------------

static const char* weights_name(quiz_weight_format f) {
    return f == QUIZ_WEIGHTS_FP16 ? "fp16" : f == QUIZ_WEIGHTS_INT8 ? "int8" : "int4";
}

static void weight_formula(char* out, size_t capacity, uint64_t n, quiz_weight_format f, int group) {
    if (f == QUIZ_WEIGHTS_FP16)
        snprintf(out, capacity, "2 x %llu", (unsigned long long)n);
    else
        snprintf(out, capacity, "%llu x %d / 8 + 2 x %llu / %d", (unsigned long long)n, f == QUIZ_WEIGHTS_INT8 ? 8 : 4,
                 (unsigned long long)n, group);
}

typedef struct calc_inputs {
    quiz_model model;
    calc_device device;
    int seq_len, batch;
    kv_dtype kv;
    quiz_weight_format weights;
    int group_size;
    double acceptance; // speculative decoding: a, or -1 for no speculative lines
    int draft_tokens;  // k
    double draft_cost; // c, or -1: from the draft's bytes
    quiz_weight_format draft_weights;
    int draft_group_size;
} calc_inputs;

static void fit_line(calc_report* r, const char* name, const calc_inputs* in, double weights, double kv_per_token,
                     const char* kv_label) {
    double per_sequence = kv_per_token * in->seq_len, free_bytes = in->device.capacity_bytes - weights;
    double fit = free_bytes > 0 ? floor(free_bytes / per_sequence) : 0;
    add_line(r, name, fit, "sequences",
             "floor((capacity - weights) / (KV per token (%s) x S)) = floor((%.0f - %.0f) / "
             "(%.0f x %d)) = floor(%.0f / %.0f)%s",
             kv_label, in->device.capacity_bytes, weights, kv_per_token, in->seq_len, free_bytes, per_sequence,
             free_bytes > 0 ? "" : ": the weights alone do not fit");
}

// Written as the sum the formula comes from, term by term, rather than the
// quiz's closed form (1 - a^(k+1)) / (1 - a): test_quiz_drills compares the
// two, so a slip in either shows.
static void speculative_lines(const calc_inputs* in, calc_report* r, double target_decode_bytes) {
    const double a = in->acceptance;
    const int k = in->draft_tokens;
    double tokens = 0, chance_all_accepted = 1; // a^i: drafts 1..i all accepted
    for (int i = 0; i <= k; i++) {
        tokens += chance_all_accepted;
        chance_all_accepted *= a;
    }
    add_line(r, "spec_tokens_per_target_pass", tokens, "tokens",
             "1 + a + a^2 + ... + a^k (token i needs drafts 1..i accepted; the target adds one) with a = %.4g, "
             "k = %d",
             a, k);
    double c = in->draft_cost;
    if (c < 0) {
        quiz_decode_weights draft = quiz_decode_weight_bytes(&in->model, in->draft_weights, in->draft_group_size);
        quiz_decode_weights target = quiz_decode_weight_bytes(&in->model, in->weights, in->group_size);
        c = draft.total_bytes / target.total_bytes;
        add_line(r, "spec_draft_cost_ratio", c, "target passes",
                 "draft decode weight bytes (%s) / target's (%s) = %.0f / %.0f (batch 1: weight bytes decide)",
                 weights_name(in->draft_weights), weights_name(in->weights), draft.total_bytes, target.total_bytes);
    } else {
        add_line(r, "spec_draft_cost_ratio", c, "target passes", "given (--draft-cost)");
    }
    double cost = 1.0;
    for (int i = 0; i < k; i++)
        cost += c; // one target pass, then k draft passes
    add_line(r, "spec_speedup", tokens / cost, "x",
             "tokens per target pass / (1 target pass + k draft passes of c) = %.6g / (1 + %d x %.4g)%s", tokens, k, c,
             tokens / cost < 1 ? ": slower than plain decode" : "");
    add_line(r, "spec_decode_weight_bytes_per_token", target_decode_bytes * cost / tokens, "bytes",
             "target decode weight bytes x cost of a round / tokens per round = %.0f x %.6g / %.6g",
             target_decode_bytes, cost, tokens);
}

static void calculate(const calc_inputs* in, calc_report* r) {
    const quiz_model* m = &in->model;
    const double L = m->n_layers, kv_dim = (double)m->n_kv_heads * m->head_dim;
    // ---- KV cache
    double kv_fp16 = 2.0 * L * kv_dim * 2;
    add_line(r, "kv_bytes_per_token_fp16", kv_fp16, "bytes",
             "2 (K and V) x L x kv_dim x 2 bytes = 2 x %d x %.0f (%d KV heads x %d) x 2", m->n_layers, kv_dim,
             m->n_kv_heads, m->head_dim);
    double kv_int8 = 2.0 * L * kv_dim * 1 + 2.0 * L * m->n_kv_heads * 4;
    add_line(r, "kv_bytes_per_token_int8", kv_int8, "bytes",
             "2 x L x kv_dim x 1 byte + 2 x L x n_kv_heads x 4 (fp32 scale per token and head) = 2 x %d x %.0f + "
             "2 x %d x %d x 4",
             m->n_layers, kv_dim, m->n_layers, m->n_kv_heads);
    double kv_token = in->kv == KV_I8 ? kv_int8 : kv_fp16;
    double kv_batch = kv_token * in->batch * in->seq_len;
    add_line(r, "kv_bytes_batch", kv_batch, "bytes", "KV per token (%s) x B x S = %.0f x %d x %d",
             kv_dtype_name(in->kv), kv_token, in->batch, in->seq_len);
    // ---- weights
    uint64_t params = quiz_model_params(m);
    add_line(r, "parameters", (double)params, "weights",
             "vocab x d (x2 untied) + L x (2 d q_width + 2 d kv_width + 3 d ffn + 2 d) + d = %d x %d x %d + %d x "
             "(2 x %d x %d + 2 x %d x %.0f + 3 x %d x %d + 2 x %d) + %d",
             m->vocab_size, m->d_model, m->tied_embeddings ? 1 : 2, m->n_layers, m->d_model, m->n_heads * m->head_dim,
             m->d_model, kv_dim, m->d_model, m->intermediate_size, m->d_model, m->d_model);
    static const char* const NAMES[] = {"weight_bytes_fp16", "weight_bytes_int8", "weight_bytes_int4"};
    double weights_selected = 0;
    for (int f = 0; f < 3; f++) {
        int group = f == QUIZ_WEIGHTS_FP16 ? 0 : in->group_size;
        double bytes = quiz_weight_bytes(params, (quiz_weight_format)f, group);
        char work[160];
        weight_formula(work, sizeof work, params, (quiz_weight_format)f, group);
        add_line(r, NAMES[f], bytes, "bytes", "%s", work);
        if (f == (int)in->weights) weights_selected = bytes;
    }
    // ---- memory fit
    if (in->device.capacity_bytes > 0) {
        fit_line(r, "sequences_fit_fp16_kv", in, weights_selected, kv_fp16, "fp16");
        fit_line(r, "sequences_fit_int8_kv", in, weights_selected, kv_int8, "int8");
    }
    // ---- decode on the roofline
    quiz_decode_weights read = quiz_decode_weight_bytes(m, in->weights, in->group_size);
    char work[160];
    weight_formula(work, sizeof work, read.matrix_weights, in->weights, in->group_size);
    add_line(r, "decode_weight_bytes", read.total_bytes, "bytes",
             "matrices + output + one embedding row in %s, norms (2 L + 1) d in fp32: %s + 4 x %llu",
             weights_name(in->weights), work, (unsigned long long)read.norm_weights);
    if (in->acceptance >= 0) speculative_lines(in, r, read.total_bytes);
    const double bw = in->device.bandwidth_bytes_per_s, peak = in->device.peak_fp16_flops;
    if (bw <= 0 || peak <= 0) return; // this machine: no bandwidth model
    add_line(r, "decode_s_per_token_batch1_weights", read.total_bytes / bw, "s",
             "decode weight bytes / bandwidth = %.0f / %.4g", read.total_bytes, bw);
    double matmul_weights = (double)read.matrix_weights - m->d_model; // the embedding row is a lookup, no FLOPs
    double step_bytes = read.total_bytes + kv_batch, step_flops = 2.0 * matmul_weights * in->batch;
    double memory_s = step_bytes / bw, compute_s = step_flops / peak;
    double step_s = memory_s > compute_s ? memory_s : compute_s;
    add_line(r, "decode_step_s", step_s, "s",
             "max((weights + B x S x KV per token) / bandwidth, 2 x matmul weights x B / peak fp16) = max((%.0f + "
             "%.0f) / %.4g, 2 x %.0f x %d / %.4g) = max(%.4g, %.4g) (%s-bound)",
             read.total_bytes, kv_batch, bw, matmul_weights, in->batch, peak, memory_s, compute_s,
             memory_s >= compute_s ? "memory" : "compute");
    add_line(r, "decode_s_per_token", step_s / in->batch, "s", "step time / B = %.4g / %d", step_s, in->batch);
    add_line(r, "decode_tokens_per_s", in->batch / step_s, "tokens/s", "B / step time = %d / %.4g", in->batch, step_s);
    double ridge = peak / bw;
    add_line(r, "ridge_flops_per_byte", ridge, "FLOP/byte", "peak fp16 / bandwidth = %.4g / %.4g", peak, bw);
    add_line(r, "ridge_batch", ridge * read.total_bytes / (2.0 * matmul_weights), "sequences",
             "B where 2 x matmul weights x B / weight bytes = ridge (KV reads left out: attention stays "
             "memory-bound) = %.4g x %.0f / (2 x %.0f)",
             ridge, read.total_bytes, matmul_weights);
}

// ---- printing --------------------------------------------------------------------------------

static int print_json(const calc_inputs* in, const char* label, const calc_report* r) {
    json_t* results = json_object();
    json_t* formulas = json_array();
    for (int i = 0; i < r->n_lines && results && formulas; i++) {
        const calc_line* line = &r->lines[i];
        bool whole = strcmp(line->unit, "bytes") == 0 || strcmp(line->unit, "sequences") == 0 ||
                     strcmp(line->unit, "weights") == 0;
        whole = whole && strcmp(line->name, "ridge_batch") != 0 && line->value == floor(line->value);
        if (json_object_set_new(results, line->name,
                                whole ? json_out_whole(line->value) : json_out_rounded(line->value, 0, 12))) {
            json_decref(results);
            results = NULL;
            break;
        }
        json_out_append(&formulas,
                        json_pack("{s:s, s:o, s:o, s:s}", "name", line->name, "formula", json_out_text(line->formula),
                                  "value", whole ? json_out_whole(line->value) : json_out_rounded(line->value, 0, 12),
                                  "unit", line->unit));
    }
    const quiz_model* m = &in->model;
    json_t* shape = json_pack("{s:o, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b}", "name", json_out_text(label), "n_layers",
                              m->n_layers, "d_model", m->d_model, "n_heads", m->n_heads, "n_kv_heads", m->n_kv_heads,
                              "head_dim", m->head_dim, "vocab_size", m->vocab_size, "intermediate_size",
                              m->intermediate_size, "tied_embeddings", m->tied_embeddings);
    json_t* device = json_pack(
        "{s:s, s:o, s:o, s:o}", "name", in->device.name, "capacity_bytes", json_out_whole(in->device.capacity_bytes),
        "bandwidth_bytes_per_s",
        in->device.bandwidth_bytes_per_s > 0 ? json_out_whole(in->device.bandwidth_bytes_per_s) : json_null(),
        "peak_fp16_flops", in->device.peak_fp16_flops > 0 ? json_out_whole(in->device.peak_fp16_flops) : json_null());
    json_t* root = NULL;
    if (results && formulas && shape && device)
        root = json_pack("{s:o, s:o, s:i, s:i, s:s, s:s, s:i, s:o, s:o}", "model", shape, "device", device, "seq_len",
                         in->seq_len, "batch", in->batch, "kv_dtype", kv_dtype_name(in->kv), "weights",
                         weights_name(in->weights), "group_size", in->weights == QUIZ_WEIGHTS_FP16 ? 0 : in->group_size,
                         "results", results, "formulas", formulas);
    else {
        json_decref(results);
        json_decref(formulas);
        json_decref(shape);
        json_decref(device);
    }
    return json_out_print(root, JSON_INDENT(2), "calc");
}

static void print_value(const calc_line* line) {
    if (strcmp(line->unit, "bytes") == 0) {
        char shown[32];
        kv_memory_format_bytes((uint64_t)line->value, shown, sizeof shown);
        printf("%.0f bytes (%s)", line->value, shown);
    } else if (strcmp(line->unit, "s") == 0) {
        printf("%.4g ms", line->value * 1e3);
    } else if (line->value == floor(line->value) && fabs(line->value) < 1e15) {
        printf("%.0f %s", line->value, line->unit);
    } else {
        printf("%.4g %s", line->value, line->unit);
    }
}

static void print_text(const calc_inputs* in, const char* label, const calc_report* r) {
    const quiz_model* m = &in->model;
    printf("model:  %s: L = %d, d = %d, %d query heads, %d KV heads, head_dim = %d, vocab %d, ffn %d, %s\n", label,
           m->n_layers, m->d_model, m->n_heads, m->n_kv_heads, m->head_dim, m->vocab_size, m->intermediate_size,
           m->tied_embeddings ? "tied output" : "untied output");
    printf("device: %s", in->device.name);
    if (in->device.capacity_bytes > 0) printf(", %.4g GiB", in->device.capacity_bytes / 1073741824.0);
    if (in->device.bandwidth_bytes_per_s > 0)
        printf(", %.4g GB/s, %.4g TFLOP/s fp16", in->device.bandwidth_bytes_per_s / 1e9,
               in->device.peak_fp16_flops / 1e12);
    printf("\ninputs: S = %d tokens, B = %d, KV %s, weights %s", in->seq_len, in->batch, kv_dtype_name(in->kv),
           weights_name(in->weights));
    if (in->weights != QUIZ_WEIGHTS_FP16) printf(" (group %d)", in->group_size);
    printf("\n\n");
    for (int i = 0; i < r->n_lines; i++) {
        const calc_line* line = &r->lines[i];
        printf("%s\n  %s\n  = ", line->name, line->formula);
        print_value(line);
        printf("\n");
    }
    const char* fit_name = in->kv == KV_I8 ? "sequences_fit_int8_kv" : "sequences_fit_fp16_kv";
    for (int i = 0; i < r->n_lines; i++)
        if (strcmp(r->lines[i].name, fit_name) == 0 && r->lines[i].value < in->batch)
            printf("\nnote: B = %d sequences of %d tokens do not fit on the %s (%.0f do, %s KV)\n", in->batch,
                   in->seq_len, in->device.name, r->lines[i].value, kv_dtype_name(in->kv));
    if (in->device.bandwidth_bytes_per_s <= 0)
        printf("\n(no decode times: this machine's bandwidth is not modelled; servelab bench bandwidth measures it)\n");
}

// ---- the command -----------------------------------------------------------------------------

int command_calc(int argc, char** argv) {
    const char* model_name = "Llama-2-7B";
    const char* device_name = "H100";
    calc_inputs in;
    memset(&in, 0, sizeof in);
    in.seq_len = 4096;
    in.batch = 1;
    in.kv = KV_F16;
    in.weights = QUIZ_WEIGHTS_FP16;
    in.group_size = CALC_DEFAULT_GROUP;
    in.acceptance = -1;
    in.draft_tokens = 4;
    in.draft_cost = -1;
    in.draft_weights = QUIZ_WEIGHTS_INT4;
    in.draft_group_size = 32;
    bool draft_options = false;
    bool json = false;
    error_info err = {{0}};
    arg_cursor cursor = {argc, argv, 1, "servelab calc", NULL};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        const char* word = argv[cursor.index];
        if (arg_is_help(word)) { // in order: `--model -h` names a model
            fputs(CALC_USAGE, stdout);
            return 0;
        } else if (arg_match(&cursor, "--model", true, &failed, &err)) {
            if (!failed) model_name = cursor.value;
        } else if (arg_match(&cursor, "--device", true, &failed, &err)) {
            if (!failed) device_name = cursor.value;
        } else if (arg_match(&cursor, "--seq", true, &failed, &err)) {
            if (!failed) failed = parse_int_arg("--seq", cursor.value, 1, 1 << 24, &in.seq_len, &err) != 0;
        } else if (arg_match(&cursor, "--batch", true, &failed, &err)) {
            if (!failed) failed = parse_int_arg("--batch", cursor.value, 1, 1 << 20, &in.batch, &err) != 0;
        } else if (arg_match(&cursor, "--kv-dtype", true, &failed, &err)) {
            if (failed) {
            } else if (strcmp(cursor.value, "fp16") == 0) {
                in.kv = KV_F16;
            } else if (strcmp(cursor.value, "int8") == 0) {
                in.kv = KV_I8;
            } else {
                failed = error_set(&err, "--kv-dtype: expected fp16 or int8, found '%s'", cursor.value) != 0;
            }
        } else if (arg_match(&cursor, "--weights", true, &failed, &err)) {
            if (!failed) failed = parse_weights(cursor.value, &in.weights, &in.group_size, &err) != 0;
        } else if (arg_match(&cursor, "--acceptance", true, &failed, &err)) {
            if (!failed) failed = parse_fraction_arg("--acceptance", cursor.value, 0.0, 1.0, &in.acceptance, &err) != 0;
        } else if (arg_match(&cursor, "--draft-tokens", true, &failed, &err)) {
            if (!failed) failed = parse_int_arg("--draft-tokens", cursor.value, 1, 64, &in.draft_tokens, &err) != 0;
            draft_options = true;
        } else if (arg_match(&cursor, "--draft-cost", true, &failed, &err)) {
            if (!failed)
                failed = parse_fraction_arg("--draft-cost", cursor.value, 0.0, 10.0, &in.draft_cost, &err) != 0;
            draft_options = true;
        } else if (arg_match(&cursor, "--draft-weights", true, &failed, &err)) {
            if (!failed)
                failed = parse_weights(cursor.value, &in.draft_weights, &in.draft_group_size, &err) != 0 ||
                         (in.draft_weights == QUIZ_WEIGHTS_FP16 &&
                          error_set(&err,
                                    "--draft-weights: expected int8 or int4[:gG] (an fp16 draft of an fp16 "
                                    "model costs what the target does), found '%s'",
                                    cursor.value) != 0);
            draft_options = true;
        } else if (arg_match(&cursor, "--json", false, &failed, &err)) {
            json = true;
        } else {
            arg_unknown(&cursor, &err);
            return cli_usage_error(&err);
        }
        if (failed) {
            fprintf(stderr, "servelab calc: %s\n", err.message);
            return 2;
        }
    }
    if (draft_options && in.acceptance < 0) {
        fprintf(stderr, "servelab calc: --draft-tokens, --draft-cost and --draft-weights need --acceptance A\n");
        return 2;
    }
    if (parse_device(device_name, &in.device, &err)) {
        fprintf(stderr, "servelab calc: %s\n", err.message);
        return 2;
    }
    char label[600];
    int status = find_model(model_name, &in.model, label, sizeof label, &err);
    if (status) {
        fprintf(stderr, "servelab calc: %s\n", err.message);
        return status;
    }
    calc_report report;
    memset(&report, 0, sizeof report);
    calculate(&in, &report);
    if (json) return print_json(&in, label, &report);
    print_text(&in, label, &report);
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}
