// lesson api_model: the lab module's models (lessons/README.md documents
// every function): loading a preset or a checkpoint against the memory
// cap, its shape, its tensors, and its tokenizer.
//
//   m = lab.model{model = "small", dtype = "fp16", quant = "w4a16:g32", tokenizer = PATH, seed = N, n_kv_heads = 6}
//   m:info(), m:tensor("layers.0.wq"), m:encode("Once"), m:decode{1, 403}
//   lab.reference_logits{model = m, tokens = ids, kv_dtype = "int8"}
//   lab.logits_difference(test, reference)  -- max |diff| / max |reference|
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/model_synth.h"
#include "engine/reference_forward.h"
#include "engine/tokenizer.h"
#include "lab/lesson/api.h"

// ---- the list of live models ---------------------------------------------------------

typedef struct model_box {
    lab_model* model; // NULL once released
} model_box;

void lab_model_unreference(lesson* l, lab_model* m) {
    lab_api_state* api = lesson_api_state(l);
    if (--m->references > 0) return;
    if (m->previous) m->previous->next = m->next;
    else api->models = m->next;
    if (m->next) m->next->previous = m->previous;
    model_source_close(&m->source);
    lesson_release_bytes(l, m->reserved_bytes);
    free(m);
}

void lab_free_models(lesson* l) {
    lab_api_state* api = lesson_api_state(l);
    while (api->models) {
        api->models->references = 1;
        lab_model_unreference(l, api->models);
    }
}

// ---- loading ----------------------------------------------------------------------------

// An upper bound of the bytes a model will take, before loading it: a
// preset from its shape, a file from its size (fp16 storage halves fp32,
// Q8_0 widened to fp32 takes 4x). Quantizing holds both copies a moment.
static uint64_t estimate_model_bytes(const model_request* request) {
    const char* name = request->model_arg ? request->model_arg : "small";
    double bytes = 0;
    const synth_preset* preset = synth_find_preset(name);
    struct stat st;
    if (preset && stat(name, &st) != 0) {
        const model_config* c = &preset->shape;
        double kv_dim = (double)c->n_kv_heads * c->dim / c->n_heads;
        double per_layer = 2.0 * c->dim * c->dim + 2.0 * kv_dim * c->dim + 3.0 * c->dim * c->hidden_dim + 2.0 * c->dim;
        double parameters = 512.0 * c->dim + c->n_layers * per_layer + c->dim;
        bytes = parameters * (request->dtype == MODEL_DTYPE_FP32 ? 4.0 : 2.0);
    } else if (stat(name, &st) == 0) {
        bytes = (double)st.st_size * 4.0;
    }
    if (request->quant) bytes *= 1.5;
    return (uint64_t)bytes + (1u << 20);
}

// The model fields of lab.model{} and lab.engine{}, as command-line flags.
static const lab_field_flag MODEL_FIELDS[] = {
    {"model", "--model", false},   {"tokenizer", "--tokenizer", false}, {"dtype", "--dtype", false},
    {"quant", "--quant", false},   {"seed", "--synth-seed", false},     {NULL, NULL, false},
};

static bool match_model_flag(arg_cursor* cursor, void* target, bool* failed, error_info* err) {
    return model_option_match(cursor, target, failed, err);
}

static int model_gc(lua_State* L);

lab_model* lab_push_model(lua_State* L, const model_request* request) {
    lesson_check_time(L); // loading takes up to seconds of C the hook does not see
    lesson* l = lesson_of(L);
    lab_api_state* api = lesson_api_state(l);
    uint64_t estimate = estimate_model_bytes(request);
    model_box* box = lua_newuserdatauv(L, sizeof *box, 0);
    box->model = NULL;
    luaL_setmetatable(L, LAB_MODEL_TYPE);
    lesson_reserve_bytes(L, estimate, "this model");
    lab_model* m = calloc(1, sizeof *m);
    if (!m) {
        lesson_release_bytes(l, estimate);
        lab_error(L, "lab.model: out of memory");
    }
    error_info err = {{0}};
    if (model_source_open(&m->source, request, &err)) {
        free(m);
        lesson_release_bytes(l, estimate);
        lab_error(L, "lab.model: %s", err.message);
    }
    lesson_release_bytes(l, estimate);
    m->reserved_bytes = m->source.model.weight_bytes;
    lesson_count_bytes(l, m->reserved_bytes); // the real size, now known
    m->references = 1;
    m->request = *request;
    snprintf(m->model_arg, sizeof m->model_arg, "%s", request->model_arg);
    m->request.model_arg = m->model_arg;
    if (request->tokenizer_arg) snprintf(m->tokenizer_arg, sizeof m->tokenizer_arg, "%s", request->tokenizer_arg);
    m->request.tokenizer_arg = request->tokenizer_arg ? m->tokenizer_arg : NULL;
    m->request.quant = NULL; // what the model was before quantization
    snprintf(m->label, sizeof m->label, "%.80s%s%.60s", request->model_arg, request->quant ? " " : "",
             request->quant ? request->quant : "");
    m->next = api->models;
    if (api->models) api->models->previous = m;
    api->models = m;
    box->model = m;
    return m;
}

// A model or tokenizer file a lesson may read: inside the lesson's folder,
// or in the model folders servelab itself looks in (./models,
// ../shared/models). Relative paths are tried from the lesson's folder
// first, then from the working directory. Writes the resolved path.
static void check_model_file(lua_State* L, int arg, const char* field, const char* path, char* out, size_t capacity) {
    const char* folder = lesson_folder(lesson_of(L));
    char joined[PATH_MAX + 1200], resolved[PATH_MAX];
    snprintf(joined, sizeof joined, "%s/%s", folder, path);
    bool found = path[0] != '/' && realpath(joined, resolved);
    if (!found && !realpath(path, resolved))
        lab_field_error(L, arg, field, "'%s' is neither a preset (tiny, small, medium, large) nor a file", path);
    const char* roots[] = {"models", "../shared/models"};
    bool allowed = lesson_path_inside(resolved, folder);
    for (size_t i = 0; i < sizeof roots / sizeof roots[0] && !allowed; i++) {
        char root[PATH_MAX];
        allowed = realpath(roots[i], root) && lesson_path_inside(resolved, root);
    }
    if (!allowed)
        lab_field_error(L, arg, field, "'%s' is outside the lesson's folder and the model folders (models, ../shared/models)", path);
    snprintf(out, capacity, "%s", resolved);
}

// The draft model of lab.engine{speculative = "draft:..."}: a quantized
// copy of the target (its request loaded again with the scheme, so a preset
// works as well as a file, and the copy counts against the memory cap), or
// a file checked like every model file a lesson names. The engine's own
// speculative_load_draft opens any path it is given: a lesson's
// "draft:/etc/passwd" must never reach it. Pushes the draft's handle.
lab_model* lab_push_draft_model(lua_State* L, int arg, const lab_model* target, const speculative_config* spec) {
    model_request request = target->request; // as it was loaded, before any quantization
    char path[PATH_MAX];
    if (spec->draft_scheme[0]) {
        request.quant = spec->draft_scheme;
    } else {
        check_model_file(L, arg, "speculative", spec->draft_path, path, sizeof path);
        request = (model_request){.model_arg = path, .dtype = target->request.dtype};
    }
    lab_model* draft = lab_push_model(L, &request);
    int draft_vocab = draft->source.model.config.vocab_size, vocab = target->source.model.config.vocab_size;
    if (draft_vocab != vocab)
        lab_field_error(L, arg, "speculative", "the draft '%s' has a vocabulary of %d tokens, the target's has %d "
                        "(a draft must share the target's tokens)", spec->draft_path, draft_vocab, vocab);
    return draft;
}

lab_model* lab_push_model_from_fields(lua_State* L, int arg) {
    model_request request = {0};
    request.synth_seed = SYNTH_DEFAULT_SEED;
    lab_apply_flag_fields(L, arg, MODEL_FIELDS, match_model_flag, &request);
    if (!request.model_arg) lab_field_error(L, arg, "model", "expected a preset (tiny, small, medium, large) or a checkpoint path");
    char model_path[PATH_MAX], tokenizer_path[PATH_MAX];
    struct stat st;
    // n_kv_heads = N: the preset's variant "PRESET:kvN" (engine/model_synth.h),
    // e.g. the multi-head twin of a grouped-query preset.
    char variant[64];
    if (lab_get_field(L, arg, "n_kv_heads") != LUA_TNIL) {
        const synth_preset* preset = synth_find_preset(request.model_arg);
        if (!preset || stat(request.model_arg, &st) == 0 || strchr(request.model_arg, ':'))
            lab_field_error(L, arg, "n_kv_heads", "applies to a preset (tiny, small, medium, large, stories110m), not '%s'",
                            request.model_arg);
        lua_Integer heads = lab_opt_integer_field(L, arg, "n_kv_heads", 0, 1, preset->shape.n_heads);
        snprintf(variant, sizeof variant, "%s:kv%d", preset->name, (int)heads);
        if (!synth_find_preset(variant))
            lab_field_error(L, arg, "n_kv_heads", "expected a divisor of %s's %d query heads, got %d", preset->name,
                            preset->shape.n_heads, (int)heads);
        request.model_arg = variant;
    }
    lua_pop(L, 1);
    if (!synth_find_preset(request.model_arg) || stat(request.model_arg, &st) == 0) {
        check_model_file(L, arg, "model", request.model_arg, model_path, sizeof model_path);
        request.model_arg = model_path;
    }
    if (request.tokenizer_arg) {
        check_model_file(L, arg, "tokenizer", request.tokenizer_arg, tokenizer_path, sizeof tokenizer_path);
        request.tokenizer_arg = tokenizer_path;
    }
    return lab_push_model(L, &request);
}

lab_model* lab_check_model(lua_State* L, int arg) {
    model_box* box = luaL_checkudata(L, arg, LAB_MODEL_TYPE);
    if (!box->model) luaL_argerror(L, arg, "the model was released");
    return box->model;
}

// lab.model{model=..., ...} or lab.model("small").
static int lab_model_new(lua_State* L) {
    if (lua_type(L, 1) == LUA_TSTRING) {
        lua_createtable(L, 0, 1);
        lua_pushvalue(L, 1);
        lua_setfield(L, -2, "model");
        lua_replace(L, 1);
    }
    static const char* const fields[] = {"model", "tokenizer", "dtype", "quant", "seed", "n_kv_heads", NULL};
    lab_check_fields(L, 1, fields);
    lab_push_model_from_fields(L, 1);
    return 1;
}

static int model_gc(lua_State* L) {
    model_box* box = luaL_checkudata(L, 1, LAB_MODEL_TYPE);
    if (box->model) lab_model_unreference(lesson_of(L), box->model);
    box->model = NULL;
    return 0;
}

static void push_model_info(lua_State* L, const lab_model* m) {
    const model* mo = &m->source.model;
    const model_config* c = &mo->config;
    lua_createtable(L, 0, 16);
    lab_set_string(L, "name", m->label);
    lab_set_integer(L, "dim", c->dim);
    lab_set_integer(L, "hidden_dim", c->hidden_dim);
    lab_set_integer(L, "n_layers", c->n_layers);
    lab_set_integer(L, "n_heads", c->n_heads);
    lab_set_integer(L, "n_kv_heads", c->n_kv_heads);
    lab_set_integer(L, "head_dim", c->head_dim);
    lab_set_integer(L, "kv_dim", c->kv_dim);
    lab_set_integer(L, "vocab_size", c->vocab_size);
    lab_set_integer(L, "max_seq_len", c->max_seq_len);
    lab_set_integer(L, "weight_bytes", (lua_Integer)mo->weight_bytes);
    lab_set_integer(L, "decode_weight_bytes", (lua_Integer)model_decode_weight_bytes(mo));
    lab_set_integer(L, "n_parameters", (lua_Integer)mo->n_parameters);
    lab_set_string(L, "dtype", weight_dtype_name(mo->layers[0].wq.dtype));
    lab_set_integer(L, "activation_bits", mo->layers[0].wq.activation_bits);
    lab_set_string(L, "activations", matmul_activation_format(&mo->layers[0].wq));
    lab_make_strict(L, -1, "m:info()");
}

static int model_info(lua_State* L) {
    push_model_info(L, lab_check_model(L, 1));
    return 1;
}

// m:tensor(name) -> values (row-major array), rows, cols
static int model_tensor(lua_State* L) {
    lab_model* m = lab_check_model(L, 1);
    const char* name = luaL_checkstring(L, 2);
    const weight_matrix* w = model_matrix_by_name(&m->source.model, name);
    if (!w)
        return luaL_argerror(L, 2, lua_pushfstring(L, "no tensor '%s' (token_embedding, classifier, layers.0..%d.wq|wk|wv|wo|w1|w2|w3)",
                                                   name, m->source.model.config.n_layers - 1));
    float* row = lua_newuserdatauv(L, (size_t)w->cols * sizeof *row, 0); // scratch, collected
    lua_createtable(L, w->rows * w->cols, 0);
    for (int r = 0; r < w->rows; r++) {
        weight_row_to_f32(row, w, r, NULL);
        for (int i = 0; i < w->cols; i++) {
            lua_pushnumber(L, row[i]);
            lua_rawseti(L, -2, (lua_Integer)r * w->cols + i + 1);
        }
    }
    lab_make_strict(L, -1, "m:tensor()");
    lua_pushinteger(L, w->rows);
    lua_pushinteger(L, w->cols);
    return 3;
}

int32_t* lab_encode_text(lua_State* L, const tokenizer* t, const char* text, bool add_bos, int* n, int arg,
                            const char* field) {
    if (!t) lab_field_error(L, arg, field, "this model has no tokenizer: give token ids instead");
    error_info err = {{0}};
    int needed = 0;
    tok_encode(t, text, add_bos, false, NULL, 0, &needed, &err);
    int32_t* ids = lua_newuserdatauv(L, (size_t)(needed > 0 ? needed : 1) * sizeof *ids, 0);
    if (tok_encode(t, text, add_bos, false, ids, needed, n, &err))
        lab_field_error(L, arg, field, "cannot encode: %s", err.message);
    return ids;
}

// The most token ids one array may hold: 2^20, past the longest context of
// any model the lab loads, and 4 MiB of ids.
enum { LAB_MAX_TOKEN_IDS = 1 << 20 };

// Token ids from an array at `index` into a userdata buffer left on the
// stack. Read raw (no __len or __index of the lesson's runs here: e:add
// holds its engine's pointer), the length bounded before anything is
// allocated, and every id an integer of the vocabulary 0..vocab_size-1.
int32_t* lab_read_token_ids(lua_State* L, int index, int arg, const char* field, int vocab_size, bool allow_empty,
                            int* n) {
    index = lua_absindex(L, index);
    if (lua_type(L, index) != LUA_TTABLE)
        lab_field_error(L, arg, field, "expected an array of token ids, got %s", luaL_typename(L, index));
    lua_Integer length = (lua_Integer)lua_rawlen(L, index);
    if (length < (allow_empty ? 0 : 1) || length > LAB_MAX_TOKEN_IDS)
        lab_field_error(L, arg, field, "expected %d..%d token ids, got %lld", allow_empty ? 0 : 1, LAB_MAX_TOKEN_IDS,
                        (long long)length);
    int32_t* ids = lua_newuserdatauv(L, (size_t)(length ? length : 1) * sizeof *ids, 0);
    for (lua_Integer i = 0; i < length; i++) {
        lua_rawgeti(L, index, i + 1);
        int is_integer = 0;
        lua_Integer id = lua_tointegerx(L, -1, &is_integer);
        if (!is_integer) {
            if (lua_type(L, -1) == LUA_TNUMBER)
                lab_field_error(L, arg, field, "element %lld: expected a token id (an integer), got %g", (long long)i + 1,
                                lua_tonumber(L, -1));
            lab_field_error(L, arg, field, "element %lld: expected a token id (an integer), got %s", (long long)i + 1,
                            luaL_typename(L, -1));
        }
        if (id < 0 || id >= vocab_size)
            lab_field_error(L, arg, field, "element %lld: token id %lld is outside the vocabulary 0..%d", (long long)i + 1,
                            (long long)id, vocab_size - 1);
        ids[i] = (int32_t)id;
        lua_pop(L, 1);
    }
    *n = (int)length;
    return ids;
}

static int model_encode(lua_State* L) {
    lab_model* m = lab_check_model(L, 1);
    const char* text = luaL_checkstring(L, 2);
    int n = 0;
    int32_t* ids = lab_encode_text(L, m->source.tokenizer, text, true, &n, 2, NULL);
    lab_push_int32_array(L, ids, (size_t)n);
    lab_make_strict(L, -1, "m:encode()");
    return 1;
}

void lab_push_decoded(lua_State* L, const tokenizer* t, int32_t previous, const int32_t* ids, int n) {
    if (!t) {
        lua_pushliteral(L, "");
        return;
    }
    size_t length = tok_decode_text(t, previous, ids, n, NULL, 0);
    char* text = lua_newuserdatauv(L, length + 1, 0); // scratch, collected
    tok_decode_text(t, previous, ids, n, text, length + 1);
    lua_pushlstring(L, text, length);
    lua_remove(L, -2);
}

static int model_decode(lua_State* L) {
    lab_model* m = lab_check_model(L, 1);
    int n = 0;
    int32_t* ids = lab_read_token_ids(L, 2, 2, NULL, m->source.model.config.vocab_size, true, &n);
    lab_push_decoded(L, m->source.tokenizer, TOK_BOS_ID, ids, n);
    return 1;
}

// ---- the reference forward pass ------------------------------------------------------

// lab.reference_logits{model = M, tokens = IDS, kv_dtype = "fp32"|"fp16"|"int8"}
// -> the vocab_size logits that follow the tokens, from
// engine/reference_forward.c (written apart from the engine's forward pass)
// on the model's weights as the handle holds them (dequantized when
// quantized). kv_dtype rounds the reference's cache as the engine's would.
// The dequantized copy and the KV cache count against the memory cap while
// it runs; the time limit is looked at between tokens.
static int lab_reference_logits(lua_State* L) {
    static const char* const fields[] = {"model", "tokens", "kv_dtype", NULL};
    static const char* const kv_choices[] = {"fp32", "fp16", "int8", NULL};
    static const reference_kv_storage kv_storage_of[] = {REFERENCE_KV_F32, REFERENCE_KV_F16, REFERENCE_KV_I8};
    lab_check_fields(L, 1, fields);
    if (lab_get_field(L, 1, "model") != LUA_TUSERDATA)
        lab_field_error(L, 1, "model", "expected a model (model = lab.model{...}), got %s", luaL_typename(L, -1));
    lab_model* handle = lab_check_model(L, lua_gettop(L)); // stays on the stack: nothing collects it meanwhile
    const model* m = &handle->source.model;
    int kv = lab_opt_choice_field(L, 1, "kv_dtype", kv_choices, 0);
    if (lab_get_field(L, 1, "tokens") != LUA_TTABLE)
        lab_field_error(L, 1, "tokens", "expected an array of token ids, got %s", luaL_typename(L, -1));
    int n = 0;
    int32_t* ids = lab_read_token_ids(L, lua_gettop(L), 1, "tokens", m->config.vocab_size, false, &n);
    if (n > m->config.max_seq_len)
        lab_field_error(L, 1, "tokens", "%d tokens are more than the model's %d positions", n, m->config.max_seq_len);
    float* logits = lua_newuserdatauv(L, (size_t)m->config.vocab_size * sizeof(float), 0); // scratch, collected
    lesson* l = lesson_of(L);
    uint64_t bytes = reference_weights_bytes(m) + reference_run_bytes(&m->config, n);
    char what[128];
    snprintf(what, sizeof what, "the reference forward pass (dequantized weights and a %d-position KV cache)", n);
    lesson_reserve_bytes(L, bytes, what);
    reference_weights weights;
    reference_run run;
    error_info err = {{0}};
    if (reference_weights_from_model(&weights, m, &err)) {
        lesson_release_bytes(l, bytes);
        return lab_error(L, "lab.reference_logits: %s", err.message);
    }
    if (reference_run_init(&run, &weights, n, &err)) {
        reference_weights_free(&weights);
        lesson_release_bytes(l, bytes);
        return lab_error(L, "lab.reference_logits: %s", err.message);
    }
    run.kv_storage = kv_storage_of[kv];
    int failed = 0;
    bool stopped = false;
    for (int i = 0; i < n && !failed && !stopped; i++) {
        failed = reference_run_token(&run, ids[i], i == n - 1 ? logits : NULL, &err);
        stopped = !lesson_keep_going(l);
    }
    reference_run_free(&run);
    reference_weights_free(&weights);
    lesson_release_bytes(l, bytes);
    if (stopped) lesson_check_time(L); // raises: the time limit, or a stop asked for
    if (failed) return lab_error(L, "lab.reference_logits: %s", err.message);
    lab_push_float_array(L, logits, (size_t)m->config.vocab_size);
    return 1;
}

// lab.logits_difference(test, reference) -> max |test - reference| over
// max |reference|: one number for "how far are these logits", relative to
// the reference's scale (an fp16 KV step is 2^-11 of it). Both arrays are
// read raw and must have the same length.
static int lab_logits_difference(lua_State* L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_Integer n = (lua_Integer)lua_rawlen(L, 1);
    if (n == 0 || n != (lua_Integer)lua_rawlen(L, 2))
        return luaL_error(L, "lab.logits_difference: the two arrays hold %I and %I numbers (the same count, at "
                             "least one, is needed)", n, (lua_Integer)lua_rawlen(L, 2));
    double difference = 0, largest = 0;
    for (lua_Integer v = 1; v <= n; v++) {
        lua_rawgeti(L, 1, v);
        lua_rawgeti(L, 2, v);
        if (!lua_isnumber(L, -2) || !lua_isnumber(L, -1))
            return luaL_error(L, "lab.logits_difference: item %I is not a number in both arrays", v);
        double test = lua_tonumber(L, -2), reference = lua_tonumber(L, -1);
        lua_pop(L, 2);
        difference = fmax(difference, fabs(test - reference));
        largest = fmax(largest, fabs(reference));
        if ((v & 4095) == 0) lesson_check_time(L);
    }
    lua_pushnumber(L, largest > 0 ? difference / largest : difference);
    return 1;
}

static int model_tostring(lua_State* L) {
    model_box* box = luaL_checkudata(L, 1, LAB_MODEL_TYPE);
    lua_pushfstring(L, "model (%s)", box->model ? box->model->label : "released");
    return 1;
}

void lab_open_model_api(lua_State* L) {
    static const luaL_Reg model_methods[] = {{"info", model_info},     {"tensor", model_tensor},
                                             {"encode", model_encode}, {"decode", model_decode},
                                             {NULL, NULL}};
    lab_register_userdata_type(L, LAB_MODEL_TYPE, "model", model_methods, model_gc, model_tostring);
    lua_pushcfunction(L, lab_model_new);
    lua_setfield(L, -2, "model");
    lua_pushcfunction(L, lab_reference_logits);
    lua_setfield(L, -2, "reference_logits");
    lua_pushcfunction(L, lab_logits_difference);
    lua_setfield(L, -2, "logits_difference");
}
