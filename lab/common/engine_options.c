#include "lab/common/engine_options.h"

#include "engine/fault.h"
#include "engine/kv_memory.h"
#include "engine/model_quant.h"
#include "kernels/cuda/cuda_info.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char ENGINE_OPTIONS_USAGE[] =
    "engine:\n"
    "  --kv paged|contiguous     KV layout (default paged)\n"
    "  --block-size N            tokens per KV block, 1..256 (default 16)\n"
    "  --kv-mem SIZE             KV memory budget, e.g. 64MiB, 1GiB (default 64MiB; at most\n"
    "                            the memory available)\n"
    "  --num-blocks N            number of KV blocks (overrides --kv-mem)\n"
    "  --kv-dtype fp16|fp32|int8 KV element type (default fp16; int8 has a scale per token and head)\n"
    "  --reserve max|request     contiguous: reserve the model's max length, or\n"
    "                            prompt + max_tokens (default max)\n"
    "  --batching continuous|static  (default continuous)\n"
    "  --max-seqs N              sequences running at once (default 128)\n"
    "  --max-batched-tokens N    tokens per step (default 512)\n"
    "  --no-chunked-prefill      compute each prompt in one step\n"
    "  --no-prefix-caching       never share cached prompt blocks\n"
    "  --threads N               worker threads for the kernels (default: one per CPU)\n"
    "  --tp N                    simulated tensor parallelism: split each layer into N shards\n"
    "                            (N divides the query and KV heads; default 1 = off)\n"
    "  --tp-link nvlink|pcie     link model timing the all-reduces (default nvlink)\n"
    "  --backend cpu|cuda        where the forward pass runs (default cpu)\n"
    "  --fault NAME[,NAME]       run with a deliberate bug, to see which lesson claims turn\n"
    "                            (servelab info --faults lists them)\n"
    "  --audit                   check every step's blocks, counters and bytes against\n"
    "                            independent counts; stop at the first broken invariant\n"
    "  --speculative SPEC        speculative decoding: draft:SCHEME[:kK] (a quantized copy of\n"
    "                            the model, e.g. draft:w4a16:g32:k4), draft:FILE[:kK] (a model\n"
    "                            with the same vocabulary) or lookup:N[:kK] (n-gram prompt\n"
    "                            lookup); k guesses per step, 1..16 (default 4; default none)\n";

int parse_size_arg(const char* flag, const char* text, uint64_t* out, error_info* err) {
    char* end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    static const struct {
        const char* suffix;
        double factor;
    } units[] = {{"", 1},     {"B", 1},    {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30}, {"TiB", 0x1p40},
                 {"PiB", 0x1p50}, {"KB", 1e3}, {"MB", 1e6},    {"GB", 1e9},    {"TB", 1e12},   {"PB", 1e15},
                 {"K", 0x1p10},   {"M", 0x1p20}, {"G", 0x1p30}, {"T", 0x1p40},  {"P", 0x1p50}};
    // Below 2^63: every size the machines this runs on could have, and
    // exactly representable in a uint64_t. Whether it fits is the caller's
    // check (--kv-mem against the memory available).
    if (errno == 0 && end != text && value > 0)
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (strcasecmp(end, units[i].suffix) == 0 && value * units[i].factor < 0x1p63) {
                *out = (uint64_t)(value * units[i].factor);
                if (*out == 0) break;
                return 0;
            }
    return error_set(err, "%s: expected a size such as 64MiB, 1GiB or 4096 (bytes), found '%s'", flag, text);
}

// --backend: cpu, or cuda when this build has the CUDA backend and a
// device is there; otherwise one line says which of the two is missing.
static int backend_option(const char* value, engine_config* c, error_info* err) {
    if (strcmp(value, "cpu") == 0) {
        c->backend = BACKEND_CPU;
        return 0;
    }
    if (strcmp(value, "cuda") != 0) return error_set(err, "--backend: expected cpu or cuda, found '%s'", value);
    char message[256];
    if (!cuda_backend_built())
        return error_set(err, "--backend cuda: this servelab was built without CUDA (nvcc was not found; rebuild "
                              "with CUDA=1); use --backend cpu");
    if (cuda_device_count(message, sizeof message) == 0)
        return error_set(err, "--backend cuda: no CUDA device found (%s); use --backend cpu", message);
    c->backend = BACKEND_CUDA;
    return 0;
}

// --kv paged|contiguous, or both where the caller runs both (kv_both not NULL).
static int kv_layout_option(const char* value, engine_config* c, bool* kv_both, error_info* err) {
    if (strcmp(value, "paged") == 0) c->layout = KV_LAYOUT_PAGED;
    else if (strcmp(value, "contiguous") == 0) c->layout = KV_LAYOUT_CONTIGUOUS;
    else if (kv_both && strcmp(value, "both") == 0) *kv_both = true;
    else return error_set(err, "--kv: expected paged, contiguous%s, found '%s'", kv_both ? " or both" : "", value);
    return 0;
}

// --kv-mem SIZE. On the command line ("servelab ..."), a size beyond the
// memory available is refused now, before a model is loaded. A lesson
// (lab.engine{kv_mem = ...}) checks its own, smaller memory cap first and
// names it; engine_init refuses a pool beyond the machine's memory for
// every caller in any case.
static int kv_mem_option(const arg_cursor* cursor, engine_config* c, error_info* err) {
    if (parse_size_arg("--kv-mem", cursor->value, &c->kv_mem_bytes, err)) return -1;
    bool command_line = cursor->command && strncmp(cursor->command, "servelab ", 9) == 0;
    if (command_line) {
        char what[96];
        snprintf(what, sizeof what, "--kv-mem %s", cursor->value);
        if (kv_memory_check_fits(what, c->kv_mem_bytes, err)) return -1;
    }
    c->num_blocks = 0;
    return 0;
}

static int kv_dtype_option(const char* value, engine_config* c, error_info* err) {
    if (strcmp(value, "fp16") == 0) c->kv_dtype = KV_F16;
    else if (strcmp(value, "fp32") == 0) c->kv_dtype = KV_F32;
    else if (strcmp(value, "int8") == 0) c->kv_dtype = KV_I8;
    else return error_set(err, "--kv-dtype: expected fp16, fp32 or int8, found '%s'", value);
    return 0;
}

// --batching continuous|static, or both where the caller runs both.
static int batching_option(const char* value, engine_config* c, bool* batching_both, error_info* err) {
    if (strcmp(value, "continuous") == 0) c->batching = BATCHING_CONTINUOUS;
    else if (strcmp(value, "static") == 0) c->batching = BATCHING_STATIC;
    else if (batching_both && strcmp(value, "both") == 0) *batching_both = true;
    else
        return error_set(err, "--batching: expected continuous, static%s, found '%s'", batching_both ? " or both" : "",
                         value);
    return 0;
}

bool engine_option_match(arg_cursor* cursor, engine_config* c, bool* kv_both, bool* batching_both, bool* failed,
                         error_info* err) {
    int value;
    if (arg_match(cursor, "--kv", true, failed, err)) {
        if (!*failed) *failed = kv_layout_option(cursor->value, c, kv_both, err) != 0;
        return true;
    }
    if (arg_match(cursor, "--block-size", true, failed, err)) {
        if (!*failed) *failed = parse_int_arg("--block-size", cursor->value, 1, 256, &c->block_size, err) != 0;
        return true;
    }
    if (arg_match(cursor, "--kv-mem", true, failed, err)) {
        if (!*failed) *failed = kv_mem_option(cursor, c, err) != 0;
        return true;
    }
    if (arg_match(cursor, "--num-blocks", true, failed, err)) {
        if (!*failed) *failed = parse_int_arg("--num-blocks", cursor->value, 1, 1 << 24, &c->num_blocks, err) != 0;
        return true;
    }
    if (arg_match(cursor, "--kv-dtype", true, failed, err)) {
        if (!*failed) *failed = kv_dtype_option(cursor->value, c, err) != 0;
        return true;
    }
    if (arg_match(cursor, "--reserve", true, failed, err)) {
        if (*failed) return true;
        if (strcmp(cursor->value, "max") == 0) c->reserve = RESERVE_MAX;
        else if (strcmp(cursor->value, "request") == 0) c->reserve = RESERVE_REQUEST;
        else *failed = error_set(err, "--reserve: expected max or request, found '%s'", cursor->value) != 0;
        return true;
    }
    if (arg_match(cursor, "--batching", true, failed, err)) {
        if (!*failed) *failed = batching_option(cursor->value, c, batching_both, err) != 0;
        return true;
    }
    if (arg_match(cursor, "--max-seqs", true, failed, err)) {
        if (!*failed) *failed = parse_int_arg("--max-seqs", cursor->value, 1, 4096, &c->max_seqs, err) != 0;
        return true;
    }
    if (arg_match(cursor, "--max-batched-tokens", true, failed, err)) {
        if (!*failed) {
            *failed = parse_int_arg("--max-batched-tokens", cursor->value, 1, 1 << 16, &value, err) != 0;
            if (!*failed) c->max_batched_tokens = value;
        }
        return true;
    }
    if (arg_match(cursor, "--threads", true, failed, err)) {
        if (!*failed) *failed = parse_int_arg("--threads", cursor->value, 0, 256, &c->n_threads, err) != 0;
        return true;
    }
    if (arg_match(cursor, "--tp", true, failed, err)) {
        if (!*failed) *failed = parse_int_arg("--tp", cursor->value, 1, MAX_TP_SHARDS, &c->tp_shards, err) != 0;
        return true;
    }
    if (arg_match(cursor, "--tp-link", true, failed, err)) {
        if (!*failed && link_kind_parse(cursor->value, &c->tp_link) != 0)
            *failed = error_set(err, "--tp-link: expected nvlink or pcie, found '%s'", cursor->value) != 0;
        return true;
    }
    if (arg_match(cursor, "--backend", true, failed, err)) {
        if (!*failed) *failed = backend_option(cursor->value, c, err) != 0;
        return true;
    }
    if (arg_match(cursor, "--fault", true, failed, err)) {
        // Process-wide, installed before anything is built (engine/fault.h);
        // repeated flags add up.
        fault_set set = 0;
        if (!*failed) *failed = fault_set_parse(cursor->value, &set, err) != 0;
        if (!*failed) fault_install(fault_enabled_set | set);
        return true;
    }
    if (arg_match(cursor, "--speculative", true, failed, err)) {
        if (!*failed) *failed = speculative_config_parse(cursor->value, &c->speculative, err) != 0;
        return true;
    }
    if (arg_match(cursor, "--audit", false, failed, err)) {
        c->audit = true;
        return true;
    }
    if (arg_match(cursor, "--no-chunked-prefill", false, failed, err)) {
        c->chunked_prefill = false;
        return true;
    }
    if (arg_match(cursor, "--no-prefix-caching", false, failed, err)) {
        c->prefix_caching = false;
        return true;
    }
    return false;
}

void engine_options_print_usage(FILE* out, const char* const* replacements) {
    bool skipping = false;
    for (const char* text = ENGINE_OPTIONS_USAGE; *text;) {
        size_t length = strcspn(text, "\n");
        length += text[length] == '\n';
        if (strncmp(text, "  --", 4) == 0) {
            const char* flag = text + 2;
            size_t flag_length = strcspn(flag, " \n");
            skipping = false;
            for (const char* const* r = replacements; *r; r++)
                if (strncmp(*r + 2, flag, flag_length) == 0 && (*r)[2 + flag_length] == ' ') {
                    fputs(*r, out);
                    skipping = true;
                }
        } else if (strncmp(text, "    ", 4) != 0) {
            skipping = false; // a blank or heading line ends an option's continuation
        }
        if (!skipping) fwrite(text, 1, length, out);
        text += length;
    }
}

int engine_options_open_draft(engine_config* config, const model_request* target_request, model_source* draft,
                              error_info* err) {
    memset(draft, 0, sizeof *draft);
    const speculative_config* spec = &config->speculative;
    if (spec->kind != SPEC_DRAFT) return 0;
    model_request request = *target_request;
    request.quant = NULL;
    request.dtype = MODEL_DTYPE_FP32; // the draft's own bytes are its scheme's; the rest stays exact
    if (spec->draft_path[0]) request.model_arg = spec->draft_path;
    error_info open_err = {{0}};
    if (model_source_open(draft, &request, &open_err))
        return error_set(err, "--speculative draft:%s: %s", spec->draft_path[0] ? spec->draft_path : spec->draft_scheme,
                         open_err.message);
    if (spec->draft_scheme[0]) {
        model_quant_spec scheme;
        if (model_quant_spec_parse(spec->draft_scheme, &scheme, err) ||
            model_quantize(&draft->model, &scheme, NULL, NULL, 0, NULL, NULL, err)) {
            model_source_close(draft);
            return -1;
        }
    }
    config->draft_model = &draft->model;
    return 0;
}
