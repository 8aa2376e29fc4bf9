// lesson_api_quant: the lab module's quantization functions.
//
//   q = lab.quantize{values = {...} | model = m, tensor = "layers.0.w1", bits = 4, symmetric = false,
//                    granularity = "tensor" | "channel" | "group", group_size = 32, clip = false,
//                    range = {r_min, r_max}, method = "rtn" | "awq" | "gptq", inputs = {{...}, ...}}
//   qm, report = lab.quantize_model(m, "w4a16:g32:awq")
//   c = lab.compare(reference, test)       -- KL, top-1 agreement, perplexities
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// The heap's bytes in use, from the allocator itself: glibc's counters, or
// AddressSanitizer's where it replaces malloc (make check).
#if defined(__SANITIZE_ADDRESS__)
#define HEAP_COUNTED_BY_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HEAP_COUNTED_BY_SANITIZER 1
#endif
#endif
#ifdef HEAP_COUNTED_BY_SANITIZER
// From libasan (declared here: gcc ships no sanitizer/allocator_interface.h).
size_t __sanitizer_get_current_allocated_bytes(void);
static uint64_t heap_bytes_in_use(void) { return (uint64_t)__sanitizer_get_current_allocated_bytes(); }
#else
#include <malloc.h>
static uint64_t heap_bytes_in_use(void) {
    struct mallinfo2 heap = mallinfo2(); // uordblks: in use in the arenas; hblkhd: in use in mmap'ed blocks
    return (uint64_t)heap.uordblks + (uint64_t)heap.hblkhd;
}
#endif

#include "engine/model_eval.h"
#include "engine/model_quant.h"
#include "engine/quant.h"
#include "lab/common/calibration.h"
#include "lab/lesson/api.h"

// Scratch memory that lives on the Lua stack (collected, counted by the cap).
static void* scratch(lua_State* L, size_t bytes) { return lua_newuserdatauv(L, bytes ? bytes : 1, 0); }

// The matrix to quantize: a model's tensor, or values with rows x cols.
static float* read_matrix(lua_State* L, int* rows, int* cols) {
    const char* tensor = lab_opt_string_field(L, 1, "tensor", NULL);
    int has_values = lab_get_field(L, 1, "values") != LUA_TNIL;
    lua_pop(L, 1);
    if ((tensor != NULL) == has_values)
        lab_field_error(L, 1, "values", "give exactly one of values (an array) and tensor (with model)");
    if (tensor) {
        if (lab_get_field(L, 1, "model") != LUA_TUSERDATA)
            lab_field_error(L, 1, "model", "tensor needs the model it belongs to (model = lab.model{...})");
        // The handle stays on the stack while the tensor is copied: the
        // scratch below may run a collection, which would free a model
        // nothing else holds and leave w dangling.
        int model_index = lua_gettop(L);
        lab_model* m = lab_check_model(L, model_index);
        const weight_matrix* w = model_matrix_by_name(&m->source.model, tensor);
        if (!w)
            lab_field_error(L, 1, "tensor", "no tensor '%s' (token_embedding, classifier, layers.0..%d.wq|wk|wv|wo|w1|w2|w3)",
                            tensor, m->source.model.config.n_layers - 1);
        float* values = scratch(L, (size_t)w->rows * (size_t)w->cols * sizeof *values);
        for (int r = 0; r < w->rows; r++) weight_row_to_f32(values + (size_t)r * (size_t)w->cols, w, r, NULL);
        *rows = w->rows;
        *cols = w->cols;
        lua_remove(L, model_index); // the copy is the lesson's scratch now
        return values;
    }
    if (lab_get_field(L, 1, "model") != LUA_TNIL) lab_field_error(L, 1, "model", "only used with tensor");
    lua_pop(L, 1);
    lab_get_field(L, 1, "values");
    size_t n = 0;
    float* values = lab_read_number_array(L, -1, 1, "values", &n);
    lua_remove(L, -2);
    lua_Integer r = lab_opt_integer_field(L, 1, "rows", 1, 1, (lua_Integer)n);
    if ((lua_Integer)n % r != 0) lab_field_error(L, 1, "rows", "%lld rows do not divide %zu values", (long long)r, n);
    *rows = (int)r;
    *cols = (int)((lua_Integer)n / r);
    return values;
}

// inputs = {{x_1 ... x_cols}, ...}: calibration activations (n_samples, cols).
static float* read_inputs(lua_State* L, int cols, int* n_samples) {
    if (lab_get_field(L, 1, "inputs") != LUA_TTABLE)
        lab_field_error(L, 1, "inputs", "awq and gptq need calibration inputs: an array of rows of %d numbers", cols);
    int table = lua_gettop(L);
    lua_Integer n = (lua_Integer)lua_rawlen(L, table);
    if (n < 1 || n > 65536) lab_field_error(L, 1, "inputs", "expected 1..65536 rows, got %lld", (long long)n);
    float* x = scratch(L, (size_t)n * (size_t)cols * sizeof *x);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, table, i);
        size_t length = 0;
        char field[32];
        snprintf(field, sizeof field, "inputs[%lld]", (long long)i);
        float* row = lab_read_number_array(L, -1, 1, field, &length);
        if ((int)length != cols) lab_field_error(L, 1, field, "expected %d numbers (the matrix's columns), got %zu", cols, length);
        memcpy(x + (size_t)(i - 1) * (size_t)cols, row, (size_t)cols * sizeof *x);
        lua_pop(L, 2);
    }
    lua_remove(L, table);
    *n_samples = (int)n;
    return x;
}

// Mean over samples and outputs of (x w^T - x w_hat^T)^2.
static double output_mse(const float* w, const float* w_hat, int rows, int cols, const float* x, int n_samples) {
    double sum = 0;
    for (int s = 0; s < n_samples; s++)
        for (int r = 0; r < rows; r++) {
            double exact = 0, approx = 0;
            for (int c = 0; c < cols; c++) {
                exact += (double)x[(size_t)s * cols + c] * w[(size_t)r * cols + c];
                approx += (double)x[(size_t)s * cols + c] * w_hat[(size_t)r * cols + c];
            }
            sum += (exact - approx) * (exact - approx);
        }
    return sum / ((double)n_samples * rows);
}

// lab.quantize{}'s scheme and method, from its fields.
static quant_scheme read_scheme(lua_State* L, int* method) {
    static const char* const granularities[] = {"tensor", "channel", "group", NULL};
    static const char* const methods[] = {"rtn", "awq", "gptq", NULL};
    quant_scheme scheme = {0};
    scheme.bits = (int)lab_opt_integer_field(L, 1, "bits", 8, 2, 8);
    scheme.symmetric = lab_opt_boolean_field(L, 1, "symmetric", false);
    scheme.granularity = (quant_granularity)lab_opt_choice_field(L, 1, "granularity", granularities, QUANT_PER_TENSOR);
    scheme.group_size = (int)lab_opt_integer_field(L, 1, "group_size", 0, 0, 1 << 20);
    scheme.clip_search = lab_opt_boolean_field(L, 1, "clip", false);
    *method = lab_opt_choice_field(L, 1, "method", methods, QUANT_RTN);
    if (scheme.granularity == QUANT_PER_GROUP && scheme.group_size == 0)
        lab_field_error(L, 1, "group_size", "granularity \"group\" needs group_size");
    if (scheme.granularity != QUANT_PER_GROUP && scheme.group_size != 0)
        lab_field_error(L, 1, "group_size", "only used with granularity \"group\"");
    return scheme;
}

// One matrix quantized: its codes and parameter sets, and what the codes
// encode. All arrays are scratch on the Lua stack.
typedef struct quantized_matrix {
    const float* w;          // (rows, cols) the values given
    int rows, cols;
    int32_t* codes;          // (rows, cols)
    quant_params* params;    // (n_sets)
    int n_sets;
    const float* encoded;    // (rows, cols) what the codes encode: w, or w with AWQ's channel scales applied
    float* channel_scales;   // (cols) AWQ's per-input-channel scales, NULL for other methods
    float alpha;             // AWQ's exponent, -1 for other methods
    float* x;                // (n_samples, cols) calibration inputs, NULL when none were given
    int n_samples;
} quantized_matrix;

// range = {r_min, r_max}: one fixed parameter set instead of the observed range.
static void quantize_to_fixed_range(lua_State* L, const quant_scheme* scheme, int method, quantized_matrix* q) {
    if (scheme->granularity != QUANT_PER_TENSOR || scheme->clip_search || method != QUANT_RTN)
        lab_field_error(L, 1, "range", "a fixed range needs granularity \"tensor\", no clip and method \"rtn\"");
    lab_get_field(L, 1, "range");
    size_t two = 0;
    float* range = lab_read_number_array(L, -1, 1, "range", &two);
    if (two != 2 || !(range[0] < range[1])) lab_field_error(L, 1, "range", "expected {r_min, r_max} with r_min < r_max");
    q->params[0] = quant_params_for_range(range[0], range[1], scheme->bits, scheme->symmetric);
    size_t n = (size_t)q->rows * (size_t)q->cols;
    for (size_t i = 0; i < n; i++) q->codes[i] = quant_quantize(q->w[i], &q->params[0], scheme->bits, scheme->symmetric, NULL);
    lua_pop(L, 2);
}

// AWQ: searches the channel scales, then rounds w scaled by them to the nearest levels.
static void quantize_awq(lua_State* L, const quant_scheme* scheme, quantized_matrix* q) {
    error_info err = {{0}};
    size_t n = (size_t)q->rows * (size_t)q->cols;
    q->channel_scales = scratch(L, (size_t)q->cols * sizeof *q->channel_scales);
    const float* matrices[1] = {q->w};
    if (quant_awq_search(matrices, &q->rows, 1, q->cols, q->x, q->n_samples, scheme, q->channel_scales, &q->alpha, &err))
        lab_error(L, "lab.quantize: %s", err.message);
    float* scaled = scratch(L, n * sizeof *scaled);
    for (size_t i = 0; i < n; i++) scaled[i] = q->w[i] * q->channel_scales[i % (size_t)q->cols];
    if (quant_matrix_rtn(scaled, q->rows, q->cols, scheme, q->codes, q->params, &err))
        lab_error(L, "lab.quantize: %s", err.message);
    q->encoded = scaled;
}

// Fills q's codes and parameters by the fixed range, RTN, AWQ or GPTQ;
// reads the calibration inputs that AWQ and GPTQ need (and RTN may take,
// for output_mse).
static void quantize_matrix(lua_State* L, const quant_scheme* scheme, int method, bool has_range, quantized_matrix* q) {
    error_info err = {{0}};
    if (has_range) quantize_to_fixed_range(L, scheme, method, q);
    else if (method == QUANT_RTN && quant_matrix_rtn(q->w, q->rows, q->cols, scheme, q->codes, q->params, &err))
        lab_error(L, "lab.quantize: %s", err.message);
    if (method != QUANT_RTN || lab_get_field(L, 1, "inputs") != LUA_TNIL) {
        if (method == QUANT_RTN) lua_pop(L, 1);
        q->x = read_inputs(L, q->cols, &q->n_samples);
    } else {
        lua_pop(L, 1);
    }
    if (method == QUANT_AWQ) quantize_awq(L, scheme, q);
    else if (method == QUANT_GPTQ &&
             quant_gptq(q->w, q->rows, q->cols, q->x, q->n_samples, scheme, 0.01f, 128, q->codes, q->params, &err))
        lab_error(L, "lab.quantize: %s", err.message);
}

// Codes that are not the nearest level of what they encode (GPTQ's error
// feedback moves some; RTN and AWQ round to the nearest).
static int64_t count_not_nearest(const quantized_matrix* q, const quant_scheme* scheme, bool has_range) {
    int64_t not_nearest = 0;
    size_t n = (size_t)q->rows * (size_t)q->cols;
    for (size_t i = 0; i < n; i++) {
        int set = has_range ? 0 : quant_param_index((int)(i / (size_t)q->cols), (int)(i % (size_t)q->cols), q->rows, q->cols, scheme);
        not_nearest += quant_quantize(q->encoded[i], &q->params[set], scheme->bits, scheme->symmetric, NULL) != q->codes[i];
    }
    return not_nearest;
}

// Pushes the parameter sets' scales and zero-points as two fields.
static void push_params(lua_State* L, const quant_params* params, int n_sets) {
    lua_createtable(L, n_sets, 0);
    for (int k = 0; k < n_sets; k++) {
        lua_pushnumber(L, params[k].scale);
        lua_rawseti(L, -2, k + 1);
    }
    lua_setfield(L, -2, "scales");
    lua_createtable(L, n_sets, 0);
    for (int k = 0; k < n_sets; k++) {
        lua_pushinteger(L, params[k].zero_point);
        lua_rawseti(L, -2, k + 1);
    }
    lua_setfield(L, -2, "zero_points");
}

static int lab_quantize(lua_State* L) {
    static const char* const fields[] = {"values", "rows", "tensor", "model", "bits", "symmetric", "granularity",
                                         "group_size", "clip", "range", "method", "inputs", NULL};
    lab_check_fields(L, 1, fields);
    int method = QUANT_RTN;
    quant_scheme scheme = read_scheme(L, &method);
    quantized_matrix q = {.alpha = -1.0f};
    float* w = read_matrix(L, &q.rows, &q.cols);
    q.w = q.encoded = w;
    error_info err = {{0}};
    if (quant_scheme_validate(&scheme, q.cols, &err)) lab_field_error(L, 1, "group_size", "%s", err.message);
    int rows = q.rows, cols = q.cols;
    size_t n = (size_t)rows * (size_t)cols;
    q.n_sets = quant_param_count(rows, cols, &scheme);
    q.codes = scratch(L, n * sizeof *q.codes);
    q.params = scratch(L, (size_t)q.n_sets * sizeof *q.params);
    float* r_hat = scratch(L, n * sizeof *r_hat);
    bool has_range = lab_get_field(L, 1, "range") != LUA_TNIL;
    lua_pop(L, 1);
    quantize_matrix(L, &scheme, method, has_range, &q);
    quant_matrix_dequantize(q.codes, q.params, rows, cols, &scheme, r_hat);

    // The engine's statistics of the codes against what they encode: clipped
    // values, the half-step bound, the mean scale; and the error, which is
    // the error against the values given unless AWQ scaled them.
    quant_stats stats = quant_matrix_stats(q.encoded, q.codes, q.params, rows, cols, &scheme, -1);
    double mse = stats.mse, max_error = stats.max_abs_error;
    if (q.channel_scales) {
        // AWQ's codes encode w x s: undo the scales, and measure against w
        // itself (the engine's statistics would measure against w x s).
        double squared = 0;
        max_error = 0;
        for (size_t i = 0; i < n; i++) {
            r_hat[i] /= q.channel_scales[i % (size_t)cols];
            double e = fabs((double)w[i] - (double)r_hat[i]);
            squared += e * e;
            if (e > max_error) max_error = e;
        }
        mse = squared / (double)n;
    }

    lua_createtable(L, 0, 20);
    lab_set_integer(L, "rows", rows);
    lab_set_integer(L, "cols", cols);
    lab_set_integer(L, "bits", scheme.bits);
    lab_set_integer(L, "levels", (lua_Integer)quant_code_max(scheme.bits, scheme.symmetric) -
                                     quant_code_min(scheme.bits, scheme.symmetric) + 1);
    lab_set_integer(L, "q_min", quant_code_min(scheme.bits, scheme.symmetric));
    lab_set_integer(L, "q_max", quant_code_max(scheme.bits, scheme.symmetric));
    lab_set_integer(L, "sets", q.n_sets);
    lab_set_number(L, "s", q.params[0].scale);
    lab_set_integer(L, "z", q.params[0].zero_point);
    lab_set_number(L, "r_min", q.params[0].range_min);
    lab_set_number(L, "r_max", q.params[0].range_max);
    lab_set_number(L, "scale_mean", stats.scale);
    lab_set_number(L, "mse", mse);
    lab_set_number(L, "max_error", max_error);
    lab_set_integer(L, "clipped", stats.n_clipped);
    lab_set_boolean(L, "within_half_step", stats.within_half_step);
    lab_set_integer(L, "not_nearest", count_not_nearest(&q, &scheme, has_range));
    // Bytes of the packed format (codes + fp16 scales + zero-points) for 8 and 4 bits.
    if (scheme.bits == 8 || scheme.bits == 4) lab_set_integer(L, "packed_bytes", (lua_Integer)quant_packed_bytes(rows, cols, &scheme));
    push_params(L, q.params, q.n_sets);
    lab_push_int32_array(L, q.codes, n);
    lua_setfield(L, -2, "q");
    lab_push_float_array(L, r_hat, n);
    lua_setfield(L, -2, "r_hat");
    if (q.x) lab_set_number(L, "output_mse", output_mse(w, r_hat, rows, cols, q.x, q.n_samples));
    if (method == QUANT_AWQ) {
        lab_set_number(L, "alpha", q.alpha);
        lab_push_float_array(L, q.channel_scales, (size_t)cols);
        lua_setfield(L, -2, "channel_scales");
    }
    lab_make_strict(L, -1, "lab.quantize()");
    return 1;
}

// Calibration streams for a model (its tokenizer's stories or its own samples).
static void build_calibration(lua_State* L, const lab_model* m, calibration_purpose purpose, calibration_set* out) {
    error_info err = {{0}};
    if (calibration_build(&m->source.model, m->source.tokenizer, purpose, out, &err))
        lab_error(L, "calibration: %s", err.message);
}

// lab.quantize_model(m, "w4a16:g32:awq") -> a new quantized model, report
static int lab_quantize_model(lua_State* L) {
    lab_model* source = lab_check_model(L, 1);
    const char* spec_text = luaL_checkstring(L, 2);
    model_quant_spec spec;
    error_info err = {{0}};
    if (model_quant_spec_parse(spec_text, &spec, &err)) return luaL_argerror(L, 2, err.message);
    if (source->source.model.layers[0].wq.dtype == WEIGHT_I8 || source->source.model.layers[0].wq.dtype == WEIGHT_I4)
        return luaL_argerror(L, 1, "the model is already quantized: start from the unquantized one");
    // The copy is loaded as the source was (same preset and seed, or file),
    // then quantized in place; calibration comes after anything that may raise.
    // The heap is read around both, so that the report says what the model
    // really holds before and after (no Lua code runs in between).
    uint64_t heap_at_start = heap_bytes_in_use();
    lab_model* m = lab_push_model(L, &source->request);
    uint64_t heap_with_copy = heap_bytes_in_use();
    calibration_set calibration = {0};
    if (spec.method != QUANT_RTN) build_calibration(L, source, CALIBRATION_FOR_QUANTIZATION, &calibration);
    model_quant_report report = {0};
    lesson* l = lesson_of(L);
    spec.keep_going = lesson_keep_going; // AWQ/GPTQ stop between layers once the time is spent
    spec.keep_going_user = l;
    uint64_t before = m->source.model.weight_bytes;
    int status = model_quantize(&m->source.model, &spec, (const int32_t* const*)calibration.sequences,
                                calibration.lengths, calibration.n_sequences, NULL, &report, &err);
    calibration_free(&calibration);
    uint64_t heap_quantized = heap_bytes_in_use();
    if (status) {
        model_quant_report_free(&report);
        lesson_check_time(L); // stopped by keep_going: say why
        return lab_error(L, "lab.quantize_model: %s", err.message);
    }
    // The model now holds the packed weights only.
    lesson_release_bytes(l, before);
    m->reserved_bytes = m->source.model.weight_bytes;
    lesson_count_bytes(l, m->reserved_bytes);
    char description[96];
    model_quant_spec_describe(&spec, description, sizeof description);
    snprintf(m->label, sizeof m->label, "%.60s %.90s", source->model_arg, description);
    lua_createtable(L, 0, 6);
    lab_set_string(L, "scheme", description);
    lab_set_integer(L, "weight_bytes_before", (lua_Integer)report.weight_bytes_before);
    lab_set_integer(L, "weight_bytes_after", (lua_Integer)report.weight_bytes_after);
    lab_set_integer(L, "calibration_tokens", report.n_calibration_tokens);
    // Heap bytes the model took: loaded unquantized, then after quantizing in
    // place (what stays allocated, whatever weight_bytes says).
    lab_set_integer(L, "heap_bytes_before", (lua_Integer)((int64_t)heap_with_copy - (int64_t)heap_at_start));
    lab_set_integer(L, "heap_bytes_after", (lua_Integer)((int64_t)heap_quantized - (int64_t)heap_at_start));
    lua_createtable(L, report.n_layers, 0);
    for (int i = 0; i < report.n_layers; i++) {
        const quant_layer_report* layer = &report.layers[i];
        lua_createtable(L, 0, 6);
        lab_set_string(L, "name", layer->name);
        lab_set_number(L, "scale_mean", layer->scale_mean);
        lab_set_number(L, "mse", layer->mse);
        lab_set_number(L, "max_error", layer->max_error);
        lab_set_integer(L, "clipped", layer->clipped);
        if (layer->awq_alpha >= 0) lab_set_number(L, "awq_alpha", layer->awq_alpha);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "layers");
    lab_make_strict(L, -1, "lab.quantize_model()");
    model_quant_report_free(&report);
    return 2;
}

// lab.compare(reference, test) -> {kl, top1, ppl_reference, ppl_test, positions}
static int lab_compare(lua_State* L) {
    lab_model* reference = lab_check_model(L, 1);
    lab_model* test = lab_check_model(L, 2);
    if (reference->source.model.config.vocab_size != test->source.model.config.vocab_size)
        return luaL_argerror(L, 2, "the models have different vocabularies");
    calibration_set evaluation = {0};
    build_calibration(L, reference, CALIBRATION_FOR_EVALUATION, &evaluation);
    model_comparison c = {0};
    error_info err = {{0}};
    int status = model_compare(&reference->source.model, &test->source.model, (const int32_t* const*)evaluation.sequences,
                               evaluation.lengths, evaluation.n_sequences, NULL, &c, &err);
    calibration_free(&evaluation);
    if (status) return lab_error(L, "lab.compare: %s", err.message);
    lua_createtable(L, 0, 5);
    lab_set_number(L, "kl", c.kl_mean);
    lab_set_number(L, "top1", c.top1_agreement);
    lab_set_number(L, "ppl_reference", c.ppl_reference);
    lab_set_number(L, "ppl_test", c.ppl_test);
    lab_set_integer(L, "positions", c.n_positions);
    lab_make_strict(L, -1, "lab.compare()");
    return 1;
}

void lab_open_quant_api(lua_State* L) {
    static const luaL_Reg functions[] = {
        {"quantize", lab_quantize}, {"quantize_model", lab_quantize_model}, {"compare", lab_compare}, {NULL, NULL}};
    luaL_setfuncs(L, functions, 0);
}
