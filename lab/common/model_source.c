#include "lab/common/model_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/gguf_model.h"
#include "engine/gguf_vocab.h"
#include "engine/model_quant.h"
#include "engine/model_synth.h"
#include "lab/common/calibration.h"
#include "lab/common/progress.h"

static bool is_file(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool model_source_is_gguf(const char* path) {
    FILE* file = fopen(path, "rb");
    if (!file) return false;
    unsigned char magic[4];
    bool is_gguf = fread(magic, 1, sizeof magic, file) == sizeof magic && gguf_has_magic(magic, sizeof magic);
    fclose(file);
    return is_gguf;
}

// A GGUF file: the model and, unless --tokenizer names another, the
// tokenizer its metadata carries (one mapping of the file for both).
static int open_gguf(model_source* out, const model_request* request, const char* path, error_info* err) {
    gguf_file file;
    if (gguf_open(&file, path, err)) return -1;
    gguf_string template_text = gguf_kv_string(gguf_find_kv(&file, "tokenizer.chat_template"));
    char* template_copy = template_text.length > 0 ? strndup(template_text.bytes, (size_t)template_text.length) : NULL;
    out->chat_template = chat_template_recognise(template_copy);
    free(template_copy);
    // The tokenizer first: it reads the metadata, which the model's mapping keeps alive.
    if (!request->tokenizer_arg && tok_from_gguf(&out->tokenizer, &file, err)) {
        gguf_close(&file);
        return -1;
    }
    // The file's context length. (A --context option needs a field in
    // model_request, which bench.c and cmd_lab.c initialise positionally.)
    gguf_model_options options = {request->dtype, 0, true};
    int status = gguf_model_from_file(&out->model, &file, &options, err);
    gguf_close(&file);
    if (status) {
        model_source_close(out);
        return -1;
    }
    if (request->tokenizer_arg) {
        if (tok_load(&out->tokenizer, request->tokenizer_arg, out->model.config.vocab_size, err)) {
            model_source_close(out);
            return -1;
        }
        snprintf(out->tokenizer_label, sizeof out->tokenizer_label, "%s", request->tokenizer_arg);
    } else {
        snprintf(out->tokenizer_label, sizeof out->tokenizer_label, "%.400s (its own, %d tokens)", path,
                 tok_vocab_size(out->tokenizer));
    }
    if (out->tokenizer && tok_vocab_size(out->tokenizer) != out->model.config.vocab_size) {
        error_set(err, "%s: the tokenizer has %d tokens, the model's embedding %d rows", path,
                  tok_vocab_size(out->tokenizer), out->model.config.vocab_size);
        model_source_close(out);
        return -1;
    }
    return 0;
}

// Finds stories260K.bin and tok512.bin together in ./models or ../shared/models.
static bool find_default_checkpoint(char* model_path, size_t model_capacity, char* tok_path, size_t tok_capacity) {
    const char* dirs[] = {"models", "../shared/models"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        snprintf(model_path, model_capacity, "%s/stories260K.bin", dirs[i]);
        snprintf(tok_path, tok_capacity, "%s/tok512.bin", dirs[i]);
        if (is_file(model_path) && is_file(tok_path)) return true;
    }
    return false;
}

// The tokenizer beside a checkpoint that fits its vocabulary, if any.
static bool find_tokenizer_beside(const char* model_path, int vocab_size, char* out, size_t capacity) {
    const char* name = vocab_size == 512 ? "tok512.bin" : vocab_size == 32000 ? "tokenizer.bin" : NULL;
    if (!name) return false;
    const char* slash = strrchr(model_path, '/');
    int dir_length = slash ? (int)(slash - model_path) : 1;
    snprintf(out, capacity, "%.*s/%s", dir_length, slash ? model_path : ".", name);
    return is_file(out);
}

static bool progress_forced;

void model_source_force_progress(bool forced) { progress_forced = forced; }

// The progress line of a long load: "servelab generate: 3.1 s: building
// the medium preset". NULL (no line) when stderr is not a terminal and
// --progress was not given, or when the command's own line is live.
static progress* start_progress(const char* detail) {
    char what[64];
    snprintf(what, sizeof what, "servelab %s", arg_command_name() ? arg_command_name() : "model");
    progress* line = progress_start(what, progress_forced);
    progress_set(line, detail, 0, 0, NULL);
    return line;
}

// Quantizes the loaded model in place when --quant was given. AWQ and
// GPTQ calibrate first (2.8 s for stories260K w4a16:g32:awq, minutes for
// the small preset on two busy cores), so a progress line says it runs.
static int apply_quant(model_source* source, const char* spec_text, error_info* err) {
    model_quant_spec spec;
    if (model_quant_spec_parse(spec_text, &spec, err)) return -1;
    char described[64], detail[96];
    model_quant_spec_describe(&spec, described, sizeof described);
    snprintf(detail, sizeof detail, "quantizing to %s%s", described, spec.method != QUANT_RTN ? " (calibrating)" : "");
    progress* line = start_progress(detail);
    calibration_set calibration = {0};
    if (spec.method != QUANT_RTN &&
        calibration_build(&source->model, source->tokenizer, CALIBRATION_FOR_QUANTIZATION, &calibration, err)) {
        progress_finish(line);
        return -1;
    }
    snprintf(detail, sizeof detail, "quantizing to %s", described);
    progress_set(line, detail, 0, 0, NULL);
    thread_pool* pool = NULL;
    thread_pool_create(0, &pool); // a failure leaves pool NULL: one thread
    int status = model_quantize(&source->model, &spec, (const int32_t* const*)calibration.sequences,
                                calibration.lengths, calibration.n_sequences, pool, NULL, err);
    thread_pool_free(pool);
    calibration_free(&calibration);
    progress_finish(line);
    return status;
}

// Why --model names nothing loadable, with what the user most likely
// meant: a preset one or two edits away ("mediun"), else the default model
// and `make models` (a README command written for models/stories260K.bin).
static int missing_model(const char* model_arg, error_info* err) {
    const char* names[32];
    int n = 0;
    for (const synth_preset* p = synth_presets(); p->name && n < 32; p++)
        names[n++] = p->name;
    const char* preset = strchr(model_arg, '/') ? NULL : arg_nearest(model_arg, names, n, 2);
    if (preset)
        return error_set(err,
                         "%s: not a file and not a preset; did you mean '%s'? (presets: tiny, small, medium, "
                         "large, stories110m)",
                         model_arg, preset);
    return error_set(err,
                     "%s: no such file; leave out --model for the default model (stories260K when `make models` "
                     "has fetched it, else the small preset), or name a preset (tiny, small, medium, large, "
                     "stories110m)",
                     model_arg);
}

static int open_unquantized(model_source* out, const model_request* request, error_info* err);

// A newcomer reads "medium" as a model that knows language; its weights are
// random and only its shapes are medium's, which the label says wherever a
// model is named (the dashboard header, generate's stats line, sim, info).
static void label_synthetic(model_source* out, const char* preset) {
    snprintf(out->model_label, sizeof out->model_label, "synthetic (random weights, shapes of %.64s)", preset);
}

// `servelab synth` output is a plain llama2.c checkpoint: no header says
// where it came from. A preset's exact shape with the byte-level
// vocabulary (259 tokens, which no trained llama2.c model has) is taken as
// one. (stories110m's preset has the real stories110M's vocabulary and
// shape, so its synth output cannot be told from the trained model.)
static const synth_preset* synthetic_checkpoint_preset(const model_config* c) {
    if (c->vocab_size != TOK_MIN_VOCAB_SIZE) return NULL;
    for (const synth_preset* p = synth_presets(); p->name; p++) {
        const model_config* shape = &p->shape;
        if (shape->dim == c->dim && shape->hidden_dim == c->hidden_dim && shape->n_layers == c->n_layers &&
            shape->n_heads == c->n_heads && shape->n_kv_heads == c->n_kv_heads && shape->max_seq_len == c->max_seq_len)
            return p;
    }
    return NULL;
}

int model_source_open(model_source* out, const model_request* request, error_info* err) {
    if (open_unquantized(out, request, err)) return -1;
    if (request->quant && apply_quant(out, request->quant, err)) {
        model_source_close(out);
        return -1;
    }
    return 0;
}

static int open_unquantized(model_source* out, const model_request* request, error_info* err) {
    memset(out, 0, sizeof *out);
    char model_path[512], tok_path[512];
    const char* model_arg = request->model_arg;
    const char* tokenizer_arg = request->tokenizer_arg;
    if (!model_arg) {
        if (find_default_checkpoint(model_path, sizeof model_path, tok_path, sizeof tok_path)) {
            model_arg = model_path;
            if (!tokenizer_arg) tokenizer_arg = tok_path;
        } else {
            model_arg = "small";
        }
    }
    snprintf(out->model_label, sizeof out->model_label, "%s", model_arg);

    if (synth_find_preset(model_arg) && !is_file(model_arg)) {
        int vocab_size = 0;
        if (tokenizer_arg) {
            if (tok_file_vocab_size(tokenizer_arg, &vocab_size, err) ||
                tok_load(&out->tokenizer, tokenizer_arg, vocab_size, err))
                return -1;
            snprintf(out->tokenizer_label, sizeof out->tokenizer_label, "%s", tokenizer_arg);
        } else {
            if (tok_byte_level(&out->tokenizer, err)) return -1;
            snprintf(out->tokenizer_label, sizeof out->tokenizer_label, "byte-level");
        }
        vocab_size = tok_vocab_size(out->tokenizer);
        // Presets past small take seconds to generate (medium, 100M
        // parameters: 7-11 s), which a progress line says.
        const model_config* shape = &synth_find_preset(model_arg)->shape;
        char detail[96];
        snprintf(detail, sizeof detail, "building the %.40s preset (random weights)", model_arg);
        progress* line = (long)shape->dim * shape->dim * shape->n_layers > 4000000L ? start_progress(detail) : NULL;
        int status = model_synthesize(&out->model, model_arg, vocab_size, request->dtype, request->synth_seed, err);
        progress_finish(line);
        if (status) {
            model_source_close(out);
            return -1;
        }
        label_synthetic(out, model_arg);
        return 0;
    }

    if (access(model_arg, F_OK) != 0) return missing_model(model_arg, err);
    if (model_source_is_gguf(model_arg)) return open_gguf(out, request, model_arg, err);
    if (model_load(&out->model, model_arg, request->dtype, err)) return -1;
    const synth_preset* written_preset = synthetic_checkpoint_preset(&out->model.config);
    if (written_preset)
        snprintf(out->model_label, sizeof out->model_label, "%.300s, synthetic (random weights, shapes of %s)",
                 model_arg, written_preset->name);
    if (!tokenizer_arg &&
        find_tokenizer_beside(model_arg, out->model.config.vocab_size, tok_path, sizeof tok_path))
        tokenizer_arg = tok_path;
    if (tokenizer_arg) {
        if (tok_load(&out->tokenizer, tokenizer_arg, out->model.config.vocab_size, err)) {
            model_source_close(out);
            return -1;
        }
        snprintf(out->tokenizer_label, sizeof out->tokenizer_label, "%s", tokenizer_arg);
    }
    return 0;
}

void model_source_close(model_source* source) {
    model_free(&source->model);
    tok_free(source->tokenizer);
    source->tokenizer = NULL;
}

bool model_option_match(arg_cursor* cursor, model_request* request, bool* failed, error_info* err) {
    if (arg_match(cursor, "--model", true, failed, err)) {
        if (!*failed) request->model_arg = cursor->value;
    } else if (arg_match(cursor, "--tokenizer", true, failed, err)) {
        if (!*failed) request->tokenizer_arg = cursor->value;
    } else if (arg_match(cursor, "--quant", true, failed, err)) {
        if (!*failed) request->quant = cursor->value;
    } else if (arg_match(cursor, "--synth-seed", true, failed, err)) {
        if (!*failed) *failed = parse_u64_arg("--synth-seed", cursor->value, &request->synth_seed, err) != 0;
    } else if (arg_match(cursor, "--dtype", true, failed, err)) {
        if (*failed) return true;
        if (strcmp(cursor->value, "fp32") == 0) request->dtype = MODEL_DTYPE_FP32;
        else if (strcmp(cursor->value, "fp16") == 0) request->dtype = MODEL_DTYPE_FP16;
        else *failed = error_set(err, "--dtype: expected fp32 or fp16, found '%s'", cursor->value) != 0;
    } else {
        return false;
    }
    return true;
}
