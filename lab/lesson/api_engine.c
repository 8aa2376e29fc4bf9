// lesson api_engine: the lab module's engines, requests and step records,
// and the KV formula (lessons/README.md documents every function).
//
//   e = lab.engine{model = m | "tiny", kv = "paged", block_size = 16, kv_mem = "8MiB", ...}
//   id = e:add{prompt = "Once", max_tokens = 16, n = 2, prefix = "System: ..."}
//   r = e:step();  e:run{stop_when = function(r) return r.running == 0 end}
//   e:record(), e:pool(), e:sequence(id), e:sequences(), e:queues(), e:totals(), e:logits(id)
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/tokenizer.h"
#include "lab/common/engine_options.h"
#include "lab/lesson/api.h"

// Sums over every step an engine ran in this lesson.
typedef struct lab_totals {
    uint64_t steps;
    uint64_t prefill_tokens;
    uint64_t decode_tokens;
    kernel_traffic traffic;
    double seconds;           // sum of step wall times
    uint64_t preemptions;
    uint64_t prefix_hit_tokens;
    uint64_t copies;          // copy-on-write block copies
    uint64_t copy_bytes;
    int peak_running;
    int64_t peak_slots_used;
    int64_t peak_slots_allocated;
    double waste_pct_sum;     // per step: (allocated - used) / allocated, %
    uint64_t waste_steps;
    double util_pct_sum;      // per step: used / pool slots, %
    // Speculative decoding, summed over the steps (the record's spec group):
    uint64_t spec_drafted, spec_accepted, spec_rejected, spec_bonus, spec_emitted, spec_verify_tokens;
    uint64_t spec_rollback_slots, spec_rollback_blocks, spec_draft_passes;
    kernel_traffic spec_draft_traffic; // the draft model's passes (the record's traffic is the target's alone)
} lab_totals;

typedef struct lab_engine {
    engine engine;
    lab_model* model;
    lab_model* draft;         // speculative "draft:...": the proposer, kept alive with the engine; else NULL
    lab_totals totals;
    bool stepped;             // a record exists
    float* last_logits;       // (logits_capacity, vocab) the logits each sequence last sampled from
    int* logits_position;     // (logits_capacity) the position they followed, -1 if none
    int logits_capacity;      // grown by e:add, before the sequences exist, and counted in reserved_bytes
    uint64_t reserved_bytes;  // the engine's estimate plus the kept logits, against the memory cap
    int busy;                 // calls into the lesson's code in progress (stop_when): close is refused
    int64_t samples_requested; // sum of e:add's n: every sequence id the engine hands out lies below it
    step_record now;          // its queues and sequences at the last sequences_now() (engine_snapshot)
    struct lab_engine* next;
    struct lab_engine* previous;
} lab_engine;

// ---- the list of live engines ---------------------------------------------------------

typedef struct engine_box {
    lab_engine* engine; // NULL once closed
} engine_box;

static void engine_release(lesson* l, lab_engine* e) {
    lab_api_state* api = lesson_api_state(l);
    if (api->focus == &e->engine) api->focus = NULL;
    if (e->previous) e->previous->next = e->next;
    else api->engines = e->next;
    if (e->next) e->next->previous = e->previous;
    engine_free(&e->engine);
    if (e->draft) lab_model_unreference(l, e->draft); // after the engine, which reads it
    step_record_free(&e->now);
    free(e->last_logits);
    free(e->logits_position);
    lesson_release_bytes(l, e->reserved_bytes);
    lab_model* m = e->model;
    free(e);
    if (m) lab_model_unreference(l, m);
}

void lab_free_engines(lesson* l) {
    lab_api_state* api = lesson_api_state(l);
    while (api->engines) engine_release(l, api->engines);
}

// The engine fields of lab.engine{}, as command-line flags.
static const lab_field_flag ENGINE_FIELDS[] = {
    {"kv", "--kv", false},
    {"block_size", "--block-size", false},
    {"kv_mem", "--kv-mem", false},
    {"num_blocks", "--num-blocks", false},
    {"kv_dtype", "--kv-dtype", false},
    {"reserve", "--reserve", false},
    {"batching", "--batching", false},
    {"max_seqs", "--max-seqs", false},
    {"max_batched_tokens", "--max-batched-tokens", false},
    {"threads", "--threads", false},
    {"tp", "--tp", false},
    {"tp_link", "--tp-link", false},
    {"chunked_prefill", "--no-chunked-prefill", true},
    {"prefix_caching", "--no-prefix-caching", true},
    {NULL, NULL, false},
};

// An integer member of the speculative table (stack `index`), or -1 when absent.
static lua_Integer speculative_integer(lua_State* L, int index, int arg, const char* member) {
    int type = lab_get_field(L, index, member);
    lua_Integer value = -1;
    if (type == LUA_TNUMBER && lua_isinteger(L, -1)) value = lua_tointeger(L, -1);
    else if (type != LUA_TNIL)
        lab_field_error(L, arg, member[0] == 'k' ? "speculative.k" : "speculative.lookup",
                        "expected a whole number, got %s", luaL_typename(L, -1));
    lua_pop(L, 1);
    return value;
}

// lab.engine{speculative = TEXT}: the --speculative flag's text ("none",
// "draft:w4a16:g32:k4", "draft:FILE:k2", "lookup:3:k8"), or the same as a
// table ({draft = "w4a16:g32", k = 4}, {lookup = 3}), parsed by the
// engine's one parser (engine/speculative.h) so the errors are the flag's.
static void read_speculative(lua_State* L, int arg, speculative_config* out) {
    int type = lab_get_field(L, arg, "speculative");
    if (type == LUA_TNIL) {
        lua_pop(L, 1);
        return;
    }
    char text[sizeof out->draft_path + 32];
    if (type == LUA_TSTRING) {
        snprintf(text, sizeof text, "%s", lua_tostring(L, -1));
    } else if (type == LUA_TTABLE) {
        int index = lua_gettop(L);
        static const char* const members[] = {"draft", "lookup", "k", NULL};
        lab_check_nested_fields(L, index, arg, "speculative.", members);
        lua_Integer lookup = speculative_integer(L, index, arg, "lookup");
        lua_Integer k = speculative_integer(L, index, arg, "k");
        int draft_type = lab_get_field(L, index, "draft");
        if ((draft_type == LUA_TNIL) == (lookup < 0))
            lab_field_error(L, arg, "speculative", "give exactly one of draft (a scheme such as \"w4a16:g32\", or a "
                            "model file) and lookup (the n-gram length)");
        if (draft_type != LUA_TNIL && draft_type != LUA_TSTRING)
            lab_field_error(L, arg, "speculative.draft", "expected a scheme or a file name, got %s",
                            luaL_typename(L, -1));
        int used = draft_type == LUA_TSTRING ? snprintf(text, sizeof text, "draft:%s", lua_tostring(L, -1))
                                             : snprintf(text, sizeof text, "lookup:%lld", (long long)lookup);
        if (k >= 0 && used > 0 && (size_t)used < sizeof text)
            snprintf(text + used, sizeof text - (size_t)used, ":k%lld", (long long)k);
        lua_pop(L, 1);
    } else {
        lab_field_error(L, arg, "speculative", "expected the flag's text (\"draft:w4a16:g32:k4\", \"lookup:3\") or "
                        "a table ({draft = \"w4a16:g32\", k = 4}), got %s", luaL_typename(L, -1));
    }
    lua_pop(L, 1);
    error_info err = {{0}};
    if (speculative_config_parse(text, out, &err)) lab_field_error(L, arg, "speculative", "%s", err.message);
}

static bool match_engine_flag(arg_cursor* cursor, void* target, bool* failed, error_info* err) {
    return engine_option_match(cursor, target, NULL, NULL, failed, err);
}

// ---- engines -------------------------------------------------------------------------------

static lab_engine* check_engine(lua_State* L, int arg) {
    engine_box* box = luaL_checkudata(L, arg, LAB_ENGINE_TYPE);
    if (!box->engine) luaL_argerror(L, arg, "the engine was closed");
    return box->engine;
}

// Called inside engine_step, where no Lua error may be raised: the room
// was made (and counted) by e:add, so a sequence beyond it is never kept.
static void observe_logits(void* user, int32_t sequence_id, int position, const float* logits, int vocab) {
    lab_engine* e = user;
    if (sequence_id < 0 || sequence_id >= e->logits_capacity) return;
    memcpy(e->last_logits + (size_t)sequence_id * (size_t)vocab, logits, (size_t)vocab * sizeof *logits);
    e->logits_position[sequence_id] = position;
}

// Room in the kept logits for sequence ids 0..n_ids-1, counted against the
// memory cap before it is allocated: each sequence keeps vocab floats (128
// KiB for a 32000-token vocabulary), and 4096-sample requests kept 1.49 GB
// under a 256 MiB --memory-limit while they went uncounted.
static void reserve_logits_room(lua_State* L, lab_engine* e, int64_t n_ids) {
    if (n_ids <= e->logits_capacity) return;
    if (n_ids > INT_MAX / 2)
        lab_error(L, "engine: %lld sequences are more than the lab keeps logits for", (long long)n_ids);
    int capacity = e->logits_capacity ? e->logits_capacity : 16;
    while (capacity < n_ids) capacity *= 2;
    size_t vocab = (size_t)e->engine.model->config.vocab_size;
    uint64_t row_bytes = vocab * sizeof *e->last_logits + sizeof *e->logits_position;
    uint64_t more_bytes = (uint64_t)(capacity - e->logits_capacity) * row_bytes;
    char what[160];
    snprintf(what, sizeof what, "the logits kept for e:logits (%d sequences x %zu floats)", capacity, vocab);
    lesson_reserve_bytes(L, more_bytes, what);
    lesson* l = lesson_of(L);
    float* grown = realloc(e->last_logits, (size_t)capacity * vocab * sizeof *grown);
    if (grown) e->last_logits = grown;
    int* positions = grown ? realloc(e->logits_position, (size_t)capacity * sizeof *positions) : NULL;
    if (!positions) {
        lesson_release_bytes(l, more_bytes);
        lab_error(L, "engine: out of memory for the logits of %d sequences", capacity);
    }
    for (int i = e->logits_capacity; i < capacity; i++) positions[i] = -1;
    e->logits_position = positions;
    e->logits_capacity = capacity;
    e->reserved_bytes += more_bytes;
}

// The KV pool a model of shape c gets under config: num_blocks of its
// blocks, or the kv_mem budget.
static uint64_t kv_pool_bytes(const model_config* c, const engine_config* config) {
    uint64_t block_bytes = kv_memory_block_bytes(c, config->kv_dtype, config->block_size);
    return config->num_blocks > 0 ? (uint64_t)config->num_blocks * block_bytes : config->kv_mem_bytes;
}

uint64_t lab_engine_bytes_estimate(const model_config* c, const engine_config* config) {
    uint64_t kv = kv_pool_bytes(c, config);
    uint64_t rows = (uint64_t)config->max_batched_tokens + (uint64_t)config->max_seqs;
    if (!config->chunked_prefill && (uint64_t)c->max_seq_len > (uint64_t)config->max_batched_tokens)
        rows = (uint64_t)c->max_seq_len + (uint64_t)config->max_seqs;
    uint64_t activations = rows * (5ull * (uint64_t)c->dim + 2ull * (uint64_t)c->kv_dim + 2ull * (uint64_t)c->hidden_dim) * 4;
    uint64_t scores = 64ull * (uint64_t)c->max_seq_len * 4;
    uint64_t logits = 2ull * (uint64_t)config->max_seqs * (uint64_t)c->vocab_size * 4;
    // With a draft model each sequence keeps the draft's q for its guesses:
    // k x vocab floats (64 KiB at k 4 and 4096 tokens). The draft's own KV
    // pool is counted by lab.engine, from the draft's shapes.
    if (config->speculative.kind == SPEC_DRAFT)
        kv += (uint64_t)config->max_seqs * (uint64_t)config->speculative.k * (uint64_t)c->vocab_size * 4;
    return kv + activations + scores + logits + (1u << 20);
}

static int engine_gc(lua_State* L) {
    engine_box* box = luaL_checkudata(L, 1, LAB_ENGINE_TYPE);
    if (box->engine) engine_release(lesson_of(L), box->engine);
    box->engine = NULL;
    return 0;
}

// lab.engine{model = m | "preset" | PATH, <model fields>, <engine fields>}
static int lab_engine_new(lua_State* L) {
    static const char* const fields[] = {"model", "tokenizer", "dtype", "quant", "seed", "kv", "block_size",
                                         "kv_mem", "num_blocks", "kv_dtype", "reserve", "batching", "max_seqs",
                                         "max_batched_tokens", "threads", "chunked_prefill", "prefix_caching",
                                         "watermark_blocks", "tp", "tp_link", "audit", "speculative", NULL};
    lab_check_fields(L, 1, fields);
    lesson_check_time(L);
    lesson* l = lesson_of(L);
    lab_api_state* api = lesson_api_state(l);
    engine_config config = engine_config_default();
    lab_apply_flag_fields(L, 1, ENGINE_FIELDS, match_engine_flag, &config);
    config.watermark_blocks = (int)lab_opt_integer_field(L, 1, "watermark_blocks", -1, -1, 1 << 24);
    config.audit = lab_opt_boolean_field(L, 1, "audit", config.audit);
    read_speculative(L, 1, &config.speculative);

    // The model: a handle, or loaded here from the model fields.
    lab_model* m = NULL;
    int model_index;
    if (lab_get_field(L, 1, "model") == LUA_TUSERDATA) {
        m = lab_check_model(L, -1);
        static const char* const model_only[] = {"tokenizer", "dtype", "quant", "seed", NULL};
        for (const char* const* f = model_only; *f; f++)
            if (lab_get_field(L, 1, *f) != LUA_TNIL)
                lab_field_error(L, 1, *f, "set it in lab.model{}, not with a loaded model");
            else lua_pop(L, 1);
    } else {
        lua_pop(L, 1);
        m = lab_push_model_from_fields(L, 1);
    }
    model_index = lua_gettop(L); // the model handle, kept by the engine's user value
    // The draft model (speculative "draft:..."), loaded by the lab: its
    // bytes count against the cap and a file is held to the lesson's folders.
    lab_model* draft = NULL;
    if (config.speculative.kind == SPEC_DRAFT) {
        draft = lab_push_draft_model(L, 1, m, &config.speculative);
        config.draft_model = &draft->source.model;
    } else {
        lua_pushnil(L);
    }
    int draft_index = lua_gettop(L);
    engine_box* box = lua_newuserdatauv(L, sizeof *box, 2);
    box->engine = NULL;
    luaL_setmetatable(L, LAB_ENGINE_TYPE);
    lua_pushvalue(L, model_index);
    lua_setiuservalue(L, -2, 1);
    lua_pushvalue(L, draft_index); // the draft's handle, kept with the engine (nil without one)
    lua_setiuservalue(L, -2, 2);

    uint64_t estimate = lab_engine_bytes_estimate(&m->source.model.config, &config);
    if (draft) estimate += kv_pool_bytes(&draft->source.model.config, &config); // its own KV pool
    lesson_reserve_bytes(L, estimate, "this engine (KV pool and activations; lower kv_mem or num_blocks)");
    lab_engine* e = calloc(1, sizeof *e);
    if (!e) {
        lesson_release_bytes(l, estimate);
        return lab_error(L, "lab.engine: out of memory");
    }
    error_info err = {{0}};
    if (engine_init(&e->engine, &m->source.model, &config, &err)) {
        free(e);
        lesson_release_bytes(l, estimate);
        return lab_error(L, "lab.engine: %s", err.message);
    }
    e->reserved_bytes = estimate;
    e->model = m;
    m->references++;
    e->draft = draft;
    if (draft) draft->references++;
    engine_set_logits_observer(&e->engine, observe_logits, e);
    e->next = api->engines;
    if (api->engines) api->engines->previous = e;
    api->engines = e;
    box->engine = e;
    api->focus = &e->engine;
    return 1;
}

// e:close() frees the engine now, unless a host function that uses it is
// running the lesson's code (e:close() inside e:run's stop_when): freeing
// it there was a use after free in e:run, so it is an error instead.
static int engine_close(lua_State* L) {
    lab_engine* e = check_engine(L, 1);
    if (e->busy) return lab_error(L, "engine closed during stop_when: close it after e:run returns");
    return engine_gc(L);
}

static int engine_model(lua_State* L) {
    check_engine(L, 1);
    lua_getiuservalue(L, 1, 1);
    return 1;
}

// Reads the prompt of e:add (prefix, then prompt text or ids) into a
// userdata buffer left on the stack.
static int32_t* read_prompt(lua_State* L, const lab_engine* e, int* n_out) {
    const tokenizer* t = e->model->source.tokenizer;
    int vocab_size = e->model->source.model.config.vocab_size;
    int prompt_type = lab_get_field(L, 2, "prompt");
    int ids_type = lab_get_field(L, 2, "ids");
    lua_pop(L, 2);
    if ((prompt_type == LUA_TNIL) == (ids_type == LUA_TNIL))
        lab_field_error(L, 2, "prompt", "give exactly one of prompt (text) and ids (token ids)");
    int n_prefix = 0, n_body = 0;
    int32_t* prefix = NULL;
    int type = lab_get_field(L, 2, "prefix");
    if (type == LUA_TSTRING) prefix = lab_encode_text(L, t, lua_tostring(L, -1), true, &n_prefix, 2, "prefix");
    else if (type == LUA_TTABLE) prefix = lab_read_token_ids(L, -1, 2, "prefix", vocab_size, false, &n_prefix);
    else if (type == LUA_TNIL) lua_pushnil(L);
    else lab_field_error(L, 2, "prefix", "expected text or an array of token ids, got %s", luaL_typename(L, -1));
    int32_t* body = NULL;
    if (prompt_type != LUA_TNIL) {
        if (lab_get_field(L, 2, "prompt") != LUA_TSTRING)
            lab_field_error(L, 2, "prompt", "expected text, got %s", luaL_typename(L, -1));
        body = lab_encode_text(L, t, lua_tostring(L, -1), prefix == NULL, &n_body, 2, "prompt");
    } else {
        lab_get_field(L, 2, "ids");
        body = lab_read_token_ids(L, -1, 2, "ids", vocab_size, false, &n_body);
    }
    int32_t* all = lua_newuserdatauv(L, (size_t)(n_prefix + n_body) * sizeof *all, 0);
    if (n_prefix) memcpy(all, prefix, (size_t)n_prefix * sizeof *all);
    memcpy(all + n_prefix, body, (size_t)n_body * sizeof *all);
    *n_out = n_prefix + n_body;
    return all; // the scratch below it stays on the stack until the function returns
}

// e:add{prompt = "text" | ids = {...}, prefix = "text" | {...}, max_tokens = 16, n = 1,
//       temperature = 0, top_p = 0, seed = 1, stop_at_eos = false, arrival = 0} -> first sequence id
static int engine_add(lua_State* L) {
    lab_engine* e = check_engine(L, 1);
    static const char* const fields[] = {"prompt", "ids", "prefix", "max_tokens", "n", "temperature", "top_p",
                                         "seed", "stop_at_eos", "arrival", NULL};
    lab_check_fields(L, 2, fields);
    request_params p = {0};
    p.max_new_tokens = (int)lab_opt_integer_field(L, 2, "max_tokens", 16, 1, 1 << 20);
    p.n_samples = (int)lab_opt_integer_field(L, 2, "n", 1, 1, 4096);
    p.temperature = (float)lab_opt_number_field(L, 2, "temperature", 0.0, 0.0, 100.0);
    p.top_p = (float)lab_opt_number_field(L, 2, "top_p", 0.0, 0.0, 1.0);
    p.seed = (uint64_t)lab_opt_integer_field(L, 2, "seed", 1, 0, INT64_MAX);
    p.ignore_eos = !lab_opt_boolean_field(L, 2, "stop_at_eos", false);
    p.arrival_time = lab_opt_number_field(L, 2, "arrival", 0.0, 0.0, 1e9);
    int n = 0;
    p.prompt = read_prompt(L, e, &n);
    p.n_prompt = n;
    // Room for its sequences' logits first. Forks take their ids when the
    // prompt is computed, so the bound is every sample asked for so far.
    reserve_logits_room(L, e, e->samples_requested + p.n_samples);
    int32_t id = -1;
    error_info err = {{0}};
    if (engine_add_request(&e->engine, &p, &id, &err)) return luaL_argerror(L, 2, err.message);
    e->samples_requested += p.n_samples;
    lua_pushinteger(L, id);
    return 1;
}

static const char* phase_name(step_phase phase) { return phase == PHASE_PREFILL ? "prefill" : "decode"; }

static void push_traffic(lua_State* L, const kernel_traffic* t) {
    uint64_t bytes = t->weight_bytes_read + t->kv_bytes_read + t->kv_bytes_written + t->activation_bytes;
    uint64_t flops = t->matmul_flops + t->attention_flops;
    lua_createtable(L, 0, 5);
    lab_set_integer(L, "weights", (lua_Integer)t->weight_bytes_read);
    lab_set_integer(L, "kv_read", (lua_Integer)t->kv_bytes_read);
    lab_set_integer(L, "kv_written", (lua_Integer)t->kv_bytes_written);
    lab_set_integer(L, "activations", (lua_Integer)t->activation_bytes);
    lab_set_integer(L, "total", (lua_Integer)bytes);
    lua_setfield(L, -2, "bytes");
    lua_createtable(L, 0, 3);
    lab_set_integer(L, "matmul", (lua_Integer)t->matmul_flops);
    lab_set_integer(L, "attention", (lua_Integer)t->attention_flops);
    lab_set_integer(L, "total", (lua_Integer)flops);
    lua_setfield(L, -2, "flops");
    lab_set_number(L, "intensity", bytes ? (double)flops / (double)bytes : 0.0);
}

// Sets one field of the record's table of fields (engine/step_record.h) on
// the table on top, by the name the JSON trace gives it. Traffic keeps the
// lab's own shape (bytes, flops, intensity); each shard's under "shard".
static void set_record_field(lua_State* L, const step_record_field* f, const step_record* r) {
    const void* at = (const char*)r + f->offset;
    switch (f->kind) {
    case STEP_FIELD_INT: lab_set_integer(L, f->name, *(const int*)at); break;
    case STEP_FIELD_U64:
        if (f->omit_when_zero && *(const uint64_t*)at == 0) break;
        lab_set_integer(L, f->name, (lua_Integer)*(const uint64_t*)at);
        break;
    case STEP_FIELD_I64: lab_set_integer(L, f->name, (lua_Integer)*(const int64_t*)at); break;
    case STEP_FIELD_DOUBLE: lab_set_number(L, f->name, *(const double*)at); break;
    case STEP_FIELD_STRING: lab_set_string(L, f->name, *(const char* const*)at ? *(const char* const*)at : ""); break;
    case STEP_FIELD_TRAFFIC: push_traffic(L, (const kernel_traffic*)at); break;
    case STEP_FIELD_SHARD_TRAFFIC: {
        int n_shards = r->tp_shards > 1 ? r->tp_shards : 0;
        lua_createtable(L, n_shards, 0);
        for (int i = 0; i < n_shards; i++) {
            lua_createtable(L, 0, 3);
            push_traffic(L, &r->shard_traffic[i]);
            lua_rawseti(L, -2, i + 1);
        }
        lua_setfield(L, -2, "shard");
        break;
    }
    }
}

static void push_events(lua_State* L, const step_record* r) {
    int copies = 0;
    lua_createtable(L, r->n_events, 0);
    for (int i = 0; i < r->n_events; i++) {
        const block_event* ev = &r->events[i];
        copies += ev->kind == BLOCK_COPY;
        lua_createtable(L, 0, 4);
        lab_set_string(L, "kind", block_event_name(ev->kind));
        lab_set_integer(L, "block", ev->block);
        lab_set_integer(L, "sequence", ev->sequence);
        lab_set_integer(L, "other_block", ev->other_block);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "events");
    lab_set_integer(L, "copies", copies);
}

static void push_ran_sequences(lua_State* L, const step_record* r) {
    lua_createtable(L, r->n_sequences, 0);
    for (int i = 0; i < r->n_sequences; i++) {
        const step_sequence* s = &r->sequences[i];
        lua_createtable(L, 0, 9);
        lab_set_integer(L, "id", s->id);
        lab_set_integer(L, "request_id", s->request_id);
        lab_set_string(L, "phase", phase_name(s->phase));
        lab_set_integer(L, "tokens", s->n_tokens);
        lab_set_integer(L, "context", s->context_length);
        lab_set_integer(L, "tail_fill", s->tail_fill);
        lab_set_integer(L, "tail_waste_slots", s->tail_waste_slots);
        lab_push_int32_array(L, r->block_ids + s->table_offset, (size_t)s->n_table);
        lua_setfield(L, -2, "block_table");
        // Speculative decoding this step, named as in the trace's "spec" of each sequence (zeros without it).
        lua_createtable(L, 0, 8);
        lab_set_integer(L, "drafted", s->spec_drafted);
        lab_set_integer(L, "accepted", s->spec_accepted);
        lab_set_integer(L, "rejected", s->spec_rejected);
        lab_set_integer(L, "bonus", s->spec_bonus);
        lab_set_integer(L, "emitted", s->spec_emitted);
        lab_set_integer(L, "rollback_first_position", s->spec_rollback_first_position);
        lab_set_integer(L, "rollback_slots", s->spec_rollback_slots);
        lab_set_integer(L, "rollback_blocks", s->spec_rollback_blocks);
        lua_setfield(L, -2, "spec");
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "sequences");
}

// The record as a Lua table. Its scalar fields come from the record's
// field table, so a lesson reads the names a --trace file has; the "pool"
// and "queues" groups sit flat in the table, "tp" in its own table
// (simulated tensor parallelism: each shard's traffic and the all-reduces)
// and "spec" in its own (speculative decoding: the trace's spec group, and
// the draft model's traffic as `draft`, since `bytes` and `flops` are the
// target's pass alone).
static void push_record(lua_State* L, const step_record* r) {
    lua_createtable(L, 0, 34);
    int record = lua_gettop(L);
    lua_createtable(L, 0, 6);
    int tp = lua_gettop(L);
    lua_createtable(L, 0, 24);
    int spec = lua_gettop(L);
    for (int i = 0; i < step_record_field_count; i++) {
        const step_record_field* f = &step_record_fields[i];
        bool in_tp = f->group && strcmp(f->group, "tp") == 0, in_spec = f->group && strcmp(f->group, "spec") == 0;
        lua_pushvalue(L, in_tp ? tp : in_spec ? spec : record);
        set_record_field(L, f, r);
        lua_pop(L, 1);
    }
    if (!r->spec_kind) lab_set_string(L, "kind", speculative_kind_name(SPEC_NONE)); // a record of no step yet
    lua_createtable(L, 0, 3);
    push_traffic(L, &r->spec_draft_traffic);
    lua_setfield(L, spec, "draft");
    lua_setfield(L, record, "spec");
    lua_setfield(L, record, "tp");
    push_events(L, r);
    push_ran_sequences(L, r);
    lab_push_int32_array(L, r->finished_ids, (size_t)r->n_finished_now);
    lua_setfield(L, -2, "finished_ids");
    lab_make_strict(L, record, "step record");
}

static void accumulate(lab_totals* t, const step_record* r) {
    t->steps++;
    t->prefill_tokens += (uint64_t)r->prefill_tokens;
    t->decode_tokens += (uint64_t)r->decode_tokens;
    traffic_add(&t->traffic, &r->traffic);
    t->seconds += (double)r->wall_ns * 1e-9;
    t->preemptions += (uint64_t)r->n_preempted;
    t->prefix_hit_tokens += (uint64_t)r->prefix_hit_tokens;
    for (int i = 0; i < r->n_events; i++) t->copies += r->events[i].kind == BLOCK_COPY;
    t->copy_bytes += r->copy_bytes;
    if (r->n_running > t->peak_running) t->peak_running = r->n_running;
    if (r->slots_used > t->peak_slots_used) t->peak_slots_used = r->slots_used;
    if (r->slots_allocated > t->peak_slots_allocated) t->peak_slots_allocated = r->slots_allocated;
    if (r->slots_allocated > 0) {
        t->waste_pct_sum += 100.0 * (double)(r->slots_allocated - r->slots_used) / (double)r->slots_allocated;
        t->waste_steps++;
    }
    if (r->slots_total > 0) t->util_pct_sum += 100.0 * (double)r->slots_used / (double)r->slots_total;
    t->spec_drafted += (uint64_t)r->spec_drafted;
    t->spec_accepted += (uint64_t)r->spec_accepted;
    t->spec_rejected += (uint64_t)r->spec_rejected;
    t->spec_bonus += (uint64_t)r->spec_bonus;
    t->spec_emitted += (uint64_t)r->spec_emitted;
    t->spec_verify_tokens += (uint64_t)r->spec_verify_tokens;
    t->spec_rollback_slots += (uint64_t)r->spec_rollback_slots;
    t->spec_rollback_blocks += (uint64_t)r->spec_rollback_blocks;
    t->spec_draft_passes += (uint64_t)r->spec_draft_passes;
    traffic_add(&t->spec_draft_traffic, &r->spec_draft_traffic);
}

static const step_record* step_once(lua_State* L, lab_engine* e) {
    const step_record* r = NULL;
    error_info err = {{0}};
    if (engine_step(&e->engine, &r, &err)) lab_error(L, "engine step: %s", err.message);
    e->stepped = true;
    accumulate(&e->totals, r);
    lesson_api_state(lesson_of(L))->focus = &e->engine;
    return r;
}

static int engine_step_lua(lua_State* L) {
    lab_engine* e = check_engine(L, 1);
    push_record(L, step_once(L, e));
    return 1;
}

// e:run{stop_when = function(record) -> boolean, max_steps = N} -> steps, last record
static int engine_run(lua_State* L) {
    lab_engine* e = check_engine(L, 1);
    lua_Integer max_steps = 1000000;
    bool has_condition = false;
    if (!lua_isnoneornil(L, 2)) {
        static const char* const fields[] = {"stop_when", "max_steps", NULL};
        lab_check_fields(L, 2, fields);
        max_steps = lab_opt_integer_field(L, 2, "max_steps", max_steps, 1, INT32_MAX);
        int type = lab_get_field(L, 2, "stop_when");
        if (type != LUA_TNIL && type != LUA_TFUNCTION)
            lab_field_error(L, 2, "stop_when", "expected a function(record) returning true to stop, got %s",
                            luaL_typename(L, -1));
        has_condition = type == LUA_TFUNCTION;
    } else {
        lua_pushnil(L);
    }
    int condition = lua_gettop(L);
    lua_Integer steps = 0;
    const step_record* r = NULL;
    while (steps < max_steps && engine_has_work(&e->engine)) {
        lesson_check_time(L); // the time limit and the stop flag, before every step
        r = step_once(L, e);
        steps++;
        if (has_condition) {
            // The lesson's code runs here: the engine stays on the stack
            // (argument 1) and busy, so e:close() inside is refused; the
            // busy mark is taken off on an error too (protected call).
            lua_pushvalue(L, condition);
            push_record(L, r);
            e->busy++;
            int status = lua_pcall(L, 1, 1, 0);
            e->busy--;
            if (status != LUA_OK) return lua_error(L);
            bool stop = lua_toboolean(L, -1);
            lua_pop(L, 1);
            e = check_engine(L, 1);
            r = &e->engine.record; // the condition may have stepped the engine itself
            if (stop) break;
        }
    }
    lua_pushinteger(L, steps);
    if (r) push_record(L, r);
    else lua_pushnil(L);
    return 2;
}

static int engine_record(lua_State* L) {
    lab_engine* e = check_engine(L, 1);
    if (!e->stepped) lua_pushnil(L);
    else push_record(L, &e->engine.record);
    return 1;
}

static int engine_has_work_lua(lua_State* L) {
    lua_pushboolean(L, engine_has_work(&check_engine(L, 1)->engine));
    return 1;
}

static int engine_cancel(lua_State* L) {
    lab_engine* e = check_engine(L, 1);
    lua_Integer id = luaL_checkinteger(L, 2);
    error_info err = {{0}};
    if (id < 0 || id > INT32_MAX || engine_cancel_sequence(&e->engine, (int32_t)id, &err))
        return luaL_argerror(L, 2, err.message[0] ? err.message : "no such sequence");
    return 0;
}

// e:pool(): the pool as the last step's record measured it (blocks are
// taken and shared only inside a step; before the first every block is free).
static int engine_pool(lua_State* L) {
    lab_engine* le = check_engine(L, 1);
    const engine* e = &le->engine;
    const model_config* c = &e->model->config;
    const step_record* r = le->stepped ? &e->record : NULL;
    bool paged = e->config.layout == KV_LAYOUT_PAGED;
    uint64_t slot_bytes = kv_memory_block_bytes(c, e->config.kv_dtype, 1);
    lua_createtable(L, 0, 12);
    lab_set_string(L, "layout", paged ? "paged" : "contiguous");
    lab_set_integer(L, "block_size", e->config.block_size);
    lab_set_integer(L, "bytes_per_slot", (lua_Integer)slot_bytes);
    lab_set_integer(L, "block_bytes", (lua_Integer)kv_memory_block_bytes(c, e->config.kv_dtype, e->config.block_size));
    lab_set_integer(L, "slots_total", engine_pool_slots(e));
    lab_set_integer(L, "bytes_total", (lua_Integer)((uint64_t)engine_pool_slots(e) * slot_bytes));
    if (paged) {
        int n_blocks = (int)(engine_pool_slots(e) / e->config.block_size);
        lab_set_integer(L, "blocks_total", n_blocks);
        lab_set_integer(L, "blocks_free", r ? r->blocks_free : n_blocks);
        lab_set_integer(L, "blocks_evictable", r ? r->blocks_cached : 0);
        lab_set_integer(L, "blocks_cached", r ? r->blocks_in_prefix_cache : 0);
        lab_set_integer(L, "copies", r ? (lua_Integer)r->total_copies : 0);
        lab_set_integer(L, "evictions", r ? (lua_Integer)r->total_evictions : 0);
        lua_createtable(L, n_blocks, 0);
        for (int b = 0; b < n_blocks; b++) {
            lua_pushinteger(L, r ? r->blocks[b].ref_count : 0);
            lua_rawseti(L, -2, b + 1);
        }
        lua_setfield(L, -2, "ref_counts");
        lua_createtable(L, n_blocks, 0);
        for (int b = 0; b < n_blocks; b++) {
            lua_pushinteger(L, r ? r->blocks[b].n_filled : 0);
            lua_rawseti(L, -2, b + 1);
        }
        lua_setfield(L, -2, "filled");
    }
    lab_make_strict(L, -1, "e:pool()");
    return 1;
}

// The engine's queues and sequences as they are now, adds and cancels
// since the last step included. Valid until the next call on the engine.
// Lessons never release a sequence: its live sequences are every one it made.
static const step_record* sequences_now(lua_State* L, lab_engine* e) {
    if (engine_snapshot(&e->engine, &e->now)) lab_error(L, "engine: out of memory");
    return &e->now;
}

// The live sequence with this id (the list is in id order), or NULL.
static const step_sequence_status* find_sequence(const step_record* now, lua_Integer id) {
    int low = 0, high = now->n_live_sequences;
    while (low < high) {
        int middle = low + (high - low) / 2;
        if (now->live_sequences[middle].id < id) low = middle + 1;
        else high = middle;
    }
    return low < now->n_live_sequences && now->live_sequences[low].id == id ? &now->live_sequences[low] : NULL;
}

static const step_sequence_status* check_sequence(lua_State* L, lab_engine* e, int arg) {
    lua_Integer id = luaL_checkinteger(L, arg);
    const step_record* now = sequences_now(L, e);
    const step_sequence_status* s = find_sequence(now, id);
    const int n_sequences = now->n_sequence_ids;
    if (!s && n_sequences == 0)
        luaL_argerror(L, arg, lua_pushfstring(L, "no sequence %I (this engine has none yet: e:add makes them)",
                                              (LUAI_UACINT)id));
    if (!s)
        luaL_argerror(L, arg, lua_pushfstring(L, "no sequence %I (this engine has %d: ids 0..%d)", (LUAI_UACINT)id,
                                              n_sequences, n_sequences - 1));
    return s;
}

// The sequence's tail waste as the last step's record measured it. A
// sequence's blocks change only inside a step, or when it is cancelled
// (it then holds none): so one added since the last step, or finished, has 0.
static int32_t recorded_tail_waste(const lab_engine* e, const step_sequence_status* s) {
    if (!e->stepped || s->state == SEQ_FINISHED) return 0;
    const step_record* r = &e->engine.record;
    for (int i = 0; i < r->n_live_sequences; i++)
        if (r->live_sequences[i].id == s->id) return r->live_sequences[i].tail_waste_slots;
    return 0;
}

static void push_sequence(lua_State* L, const lab_engine* e, const step_sequence_status* s) {
    lua_createtable(L, 0, 20);
    lab_set_integer(L, "id", s->id);
    lab_set_integer(L, "request_id", s->request_id);
    lab_set_integer(L, "sample", s->sample_index);
    lab_set_string(L, "state", sequence_state_name(s->state));
    lab_set_integer(L, "n_prompt", s->n_prompt);
    lab_set_integer(L, "n_tokens", s->n_tokens);
    lab_set_integer(L, "n_computed", s->n_computed);
    lab_set_integer(L, "generated", s->n_tokens - s->n_prompt);
    lab_set_integer(L, "fork_parent", s->fork_parent);
    lab_set_integer(L, "preemptions", s->n_preemptions);
    lab_set_string(L, "stop", s->state == SEQ_FINISHED ? stop_reason_name(s->stop) : "");
    lab_set_number(L, "arrival", s->arrival_time);
    if (s->first_token_time >= 0) lab_set_number(L, "ttft", s->first_token_time - s->arrival_time);
    int generated = s->n_tokens - s->n_prompt;
    if (s->finish_time >= 0 && s->first_token_time >= 0 && generated > 1)
        lab_set_number(L, "tpot", (s->finish_time - s->first_token_time) / (generated - 1));
    if (s->finish_time >= 0) lab_set_number(L, "latency", s->finish_time - s->arrival_time);
    lab_push_int32_array(L, s->tokens, (size_t)s->n_tokens);
    lua_setfield(L, -2, "tokens");
    lab_push_int32_array(L, s->block_table, (size_t)s->n_table);
    lua_setfield(L, -2, "block_table");
    if (e->engine.config.layout == KV_LAYOUT_PAGED) lab_set_integer(L, "tail_waste_slots", recorded_tail_waste(e, s));
    lab_push_decoded(L, e->model->source.tokenizer, s->tokens[s->n_prompt - 1], s->tokens + s->n_prompt, generated);
    lua_setfield(L, -2, "text");
    // Its speculative guesses so far (the record's spec_total_* of a sequence): acceptance = accepted / drafted.
    lua_createtable(L, 0, 2);
    lab_set_integer(L, "total_drafted", (lua_Integer)s->spec_total_drafted);
    lab_set_integer(L, "total_accepted", (lua_Integer)s->spec_total_accepted);
    lua_setfield(L, -2, "spec");
    lab_make_strict(L, -1, "sequence");
}

static int engine_sequence_lua(lua_State* L) {
    lab_engine* e = check_engine(L, 1);
    push_sequence(L, e, check_sequence(L, e, 2));
    return 1;
}

static int engine_sequences(lua_State* L) {
    lab_engine* e = check_engine(L, 1);
    const step_record* now = sequences_now(L, e);
    lua_createtable(L, now->n_live_sequences, 0);
    for (int i = 0; i < now->n_live_sequences; i++) {
        push_sequence(L, e, &now->live_sequences[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lab_make_strict(L, -1, "e:sequences()");
    return 1;
}

static int engine_queues_lua(lua_State* L) {
    const step_record* now = sequences_now(L, check_engine(L, 1));
    lua_createtable(L, 0, 3);
    lab_push_int32_array(L, now->waiting_ids, (size_t)now->n_waiting);
    lua_setfield(L, -2, "waiting");
    lab_push_int32_array(L, now->running_ids, (size_t)now->n_running);
    lua_setfield(L, -2, "running");
    lab_set_integer(L, "finished", now->n_finished);
    lab_make_strict(L, -1, "e:queues()");
    return 1;
}

static int engine_totals(lua_State* L) {
    lab_engine* le = check_engine(L, 1);
    const lab_totals* t = &le->totals;
    const step_record* now = sequences_now(L, le);
    uint64_t generated = 0;
    for (int i = 0; i < now->n_live_sequences; i++)
        generated += (uint64_t)(now->live_sequences[i].n_tokens - now->live_sequences[i].n_prompt);
    lua_createtable(L, 0, 24);
    lab_set_integer(L, "steps", (lua_Integer)t->steps);
    lab_set_integer(L, "prefill_tokens", (lua_Integer)t->prefill_tokens);
    lab_set_integer(L, "decode_tokens", (lua_Integer)t->decode_tokens);
    lab_set_integer(L, "generated_tokens", (lua_Integer)generated);
    push_traffic(L, &t->traffic);
    lab_set_number(L, "seconds", t->seconds);
    lab_set_number(L, "clock", le->engine.clock_seconds);
    lab_set_number(L, "tokens_per_s", t->seconds > 0 ? (double)generated / t->seconds : 0.0);
    lab_set_integer(L, "preemptions", (lua_Integer)t->preemptions);
    lab_set_integer(L, "prefix_hit_tokens", (lua_Integer)t->prefix_hit_tokens);
    lab_set_integer(L, "copies", (lua_Integer)t->copies);
    lab_set_integer(L, "copy_bytes", (lua_Integer)t->copy_bytes);
    lab_set_integer(L, "peak_running", t->peak_running);
    lab_set_integer(L, "peak_slots_used", t->peak_slots_used);
    lab_set_integer(L, "peak_slots_allocated", t->peak_slots_allocated);
    lab_set_number(L, "waste_pct", t->waste_steps ? t->waste_pct_sum / (double)t->waste_steps : 0.0);
    lab_set_number(L, "util_pct", t->steps ? t->util_pct_sum / (double)t->steps : 0.0);
    lab_set_integer(L, "requests", le->engine.n_requests);
    lab_set_integer(L, "finished", now->n_finished);
    lua_createtable(L, 0, 12); // speculative decoding, summed (zeros without it)
    lab_set_integer(L, "verify_tokens", (lua_Integer)t->spec_verify_tokens);
    lab_set_integer(L, "drafted", (lua_Integer)t->spec_drafted);
    lab_set_integer(L, "accepted", (lua_Integer)t->spec_accepted);
    lab_set_integer(L, "rejected", (lua_Integer)t->spec_rejected);
    lab_set_integer(L, "bonus", (lua_Integer)t->spec_bonus);
    lab_set_integer(L, "emitted", (lua_Integer)t->spec_emitted);
    lab_set_integer(L, "rollback_slots", (lua_Integer)t->spec_rollback_slots);
    lab_set_integer(L, "rollback_blocks", (lua_Integer)t->spec_rollback_blocks);
    lab_set_integer(L, "draft_passes", (lua_Integer)t->spec_draft_passes);
    lua_createtable(L, 0, 3);
    push_traffic(L, &t->spec_draft_traffic);
    lua_setfield(L, -2, "draft");
    lua_setfield(L, -2, "spec");
    lab_make_strict(L, -1, "e:totals()");
    return 1;
}

// e:logits(id) -> array of vocab_size logits the sequence last sampled from, position
static int engine_logits(lua_State* L) {
    lab_engine* e = check_engine(L, 1);
    const step_sequence_status* s = check_sequence(L, e, 2);
    if (s->id >= e->logits_capacity || e->logits_position[s->id] < 0)
        return luaL_argerror(L, 2, lua_pushfstring(L, "sequence %d has not sampled a token yet", s->id));
    int vocab = e->engine.model->config.vocab_size;
    lab_push_float_array(L, e->last_logits + (size_t)s->id * (size_t)vocab, (size_t)vocab);
    lab_make_strict(L, -1, "e:logits()");
    lua_pushinteger(L, e->logits_position[s->id]);
    return 2;
}

static int engine_config_lua(lua_State* L) {
    const engine_config* c = &check_engine(L, 1)->engine.config;
    lua_createtable(L, 0, 14);
    lab_set_string(L, "kv", c->layout == KV_LAYOUT_PAGED ? "paged" : "contiguous");
    lab_set_string(L, "kv_dtype", c->kv_dtype == KV_F32 ? "fp32" : c->kv_dtype == KV_F16 ? "fp16" : "int8");
    lab_set_integer(L, "block_size", c->block_size);
    lab_set_integer(L, "num_blocks", c->num_blocks);
    lab_set_string(L, "reserve", c->reserve == RESERVE_MAX ? "max" : "request");
    lab_set_string(L, "batching", c->batching == BATCHING_CONTINUOUS ? "continuous" : "static");
    lab_set_integer(L, "max_seqs", c->max_seqs);
    lab_set_integer(L, "max_batched_tokens", c->max_batched_tokens);
    lab_set_boolean(L, "chunked_prefill", c->chunked_prefill);
    lab_set_boolean(L, "prefix_caching", c->prefix_caching);
    lab_set_integer(L, "watermark_blocks", c->watermark_blocks);
    lab_set_integer(L, "threads", c->n_threads);
    lab_set_integer(L, "tp", c->tp_shards);
    lab_set_string(L, "tp_link", link_model_get(c->tp_link)->name);
    // The --speculative text that makes this engine again ("none", "draft:w4a16:g32:k4", "lookup:3:k4").
    char speculative[sizeof c->speculative.draft_path + 32];
    const speculative_config* spec = &c->speculative;
    if (spec->kind == SPEC_DRAFT)
        snprintf(speculative, sizeof speculative, "draft:%s:k%d", spec->draft_scheme[0] ? spec->draft_scheme : spec->draft_path,
                 spec->k);
    else if (spec->kind == SPEC_LOOKUP) snprintf(speculative, sizeof speculative, "lookup:%d:k%d", spec->lookup_n, spec->k);
    else snprintf(speculative, sizeof speculative, "none");
    lab_set_string(L, "speculative", speculative);
    lab_make_strict(L, -1, "e:config()");
    return 1;
}

// ---- the KV formula, in the cache's own layout --------------------------------------------

// lab.kv_bytes{model = m | n_layers = L, kv_dim = D | n_kv_heads = H, head_dim = d,
//              batch = 1, seq = S, bytes_per_element = 2 | kv_dtype = "fp16" | "fp32" | "int8"}
//   = 2 x batch x seq x n_layers x (bytes of one token's keys, or values, in one layer)
// One token's keys in one layer take kv_dim x bytes_per_element; with
// kv_dtype = "int8" they take kv_dim bytes + one fp32 scale per KV head
// (kv_dim + 4 x n_kv_heads: engine/kv_memory.h's layout, where each head's
// scale is max|x| / 127 over its head_dim values). The result is an integer
// whenever it is whole (every dtype of the cache; bytes_per_element = 0.5
// gives one only for an even count), else a float.
static int lab_kv_bytes_layout(lua_State* L) {
    static const char* const fields[] = {"model", "n_layers", "kv_dim",   "n_kv_heads",        "head_dim",
                                         "batch", "seq",      "kv_dtype", "bytes_per_element", NULL};
    lab_check_fields(L, 1, fields);
    lua_Integer n_layers = 0, n_kv_heads = 0, head_dim = 0, kv_dim = 0;
    if (lab_get_field(L, 1, "model") != LUA_TNIL) {
        const model_config* c = &lab_check_model(L, lua_gettop(L))->source.model.config;
        n_layers = c->n_layers;
        n_kv_heads = c->n_kv_heads;
        head_dim = c->head_dim;
        kv_dim = c->kv_dim;
    }
    lua_pop(L, 1);
    n_layers = lab_opt_integer_field(L, 1, "n_layers", n_layers, 1, 1 << 20);
    n_kv_heads = lab_opt_integer_field(L, 1, "n_kv_heads", n_kv_heads, 1, 1 << 16);
    head_dim = lab_opt_integer_field(L, 1, "head_dim", head_dim, 1, 1 << 16);
    if (n_kv_heads > 0 && head_dim > 0) kv_dim = n_kv_heads * head_dim;
    kv_dim = lab_opt_integer_field(L, 1, "kv_dim", kv_dim, 1, 1 << 24);
    if (n_layers == 0) lab_field_error(L, 1, "n_layers", "give model or n_layers");
    if (kv_dim == 0) lab_field_error(L, 1, "kv_dim", "give model, kv_dim, or n_kv_heads and head_dim");
    lua_Integer batch = lab_opt_integer_field(L, 1, "batch", 1, 1, 1 << 24);
    lua_Integer seq = lab_opt_integer_field(L, 1, "seq", -1, 0, 1 << 30);
    if (seq < 0) lab_field_error(L, 1, "seq", "expected the sequence length S in tokens");
    const char* dtype = lab_opt_string_field(L, 1, "kv_dtype", NULL);
    double token_layer_bytes; // one token's keys (or values) in one layer
    if (dtype) {
        lab_get_field(L, 1, "bytes_per_element");
        if (!lua_isnil(L, -1)) lab_field_error(L, 1, "bytes_per_element", "give kv_dtype or bytes_per_element, not both");
        lua_pop(L, 1);
        if (strcmp(dtype, "int8") == 0) {
            if (n_kv_heads == 0)
                lab_field_error(L, 1, "n_kv_heads", "int8 KV keeps one fp32 scale per KV head: give model or n_kv_heads");
            if (kv_dim % n_kv_heads != 0)
                lab_field_error(L, 1, "kv_dim", "%d is not a multiple of n_kv_heads %d", (int)kv_dim, (int)n_kv_heads);
            token_layer_bytes = (double)kv_slot_bytes(KV_I8, (int)n_kv_heads, (int)(kv_dim / n_kv_heads));
        } else if (strcmp(dtype, "fp16") == 0 || strcmp(dtype, "fp32") == 0) {
            token_layer_bytes = (double)kv_dim * (dtype[2] == '1' ? 2.0 : 4.0);
        } else {
            return lab_field_error(L, 1, "kv_dtype", "expected fp16, fp32 or int8, got '%s'", dtype);
        }
    } else {
        token_layer_bytes = (double)kv_dim * lab_opt_number_field(L, 1, "bytes_per_element", 2.0, 0.125, 16.0);
    }
    double bytes = 2.0 * (double)batch * (double)seq * (double)n_layers * token_layer_bytes;
    if (bytes == floor(bytes) && bytes < 9007199254740992.0) lua_pushinteger(L, (lua_Integer)bytes); // < 2^53: exact
    else lua_pushnumber(L, bytes);
    return 1;
}

static int engine_tostring(lua_State* L) {
    engine_box* box = luaL_checkudata(L, 1, LAB_ENGINE_TYPE);
    if (!box->engine) lua_pushliteral(L, "engine (closed)");
    else
        lua_pushfstring(L, "engine (%s, %s, block size %d)", box->engine->model->label,
                        box->engine->engine.config.layout == KV_LAYOUT_PAGED ? "paged" : "contiguous",
                        box->engine->engine.config.block_size);
    return 1;
}

void lab_open_engine_api(lua_State* L) {
    static const luaL_Reg engine_methods[] = {
        {"add", engine_add},         {"step", engine_step_lua},         {"run", engine_run},
        {"record", engine_record},   {"has_work", engine_has_work_lua}, {"cancel", engine_cancel},
        {"pool", engine_pool},       {"sequence", engine_sequence_lua}, {"sequences", engine_sequences},
        {"queues", engine_queues_lua},   {"totals", engine_totals},         {"logits", engine_logits},
        {"config", engine_config_lua}, {"model", engine_model},         {"close", engine_close},
        {NULL, NULL}};
    lab_register_userdata_type(L, LAB_ENGINE_TYPE, "engine", engine_methods, engine_gc, engine_tostring);
    lua_pushcfunction(L, lab_engine_new);
    lua_setfield(L, -2, "engine");
    lua_pushcfunction(L, lab_kv_bytes_layout);
    lua_setfield(L, -2, "kv_bytes");
}
