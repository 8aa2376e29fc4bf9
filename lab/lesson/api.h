// lesson api: what the lab module's parts (api_model.c, api_engine.c,
// api_quant.c, api_perf.c) may use from the lesson host. They see the
// lesson only through these functions, never its struct (internal.h), so
// the arrows point one way: host.c registers the parts, the parts call
// down into the limits and the argument readers.
#ifndef SERVELAB_LESSON_API_H
#define SERVELAB_LESSON_API_H

#include <lauxlib.h>
#include <lua.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "lab/common/cli_args.h"
#include "lab/common/machine_profile.h"
#include "lab/common/model_source.h"
#include "lab/lesson/lesson.h"

#define LAB_MODEL_TYPE "servelab.model"
#define LAB_ENGINE_TYPE "servelab.engine"

// A model a lesson loaded. Engines hold a reference, so a model lives as
// long as its Lua handle or any engine that runs it.
typedef struct lab_model {
    model_source source;
    int references;           // the Lua handle (while alive) + engines running it
    uint64_t reserved_bytes;  // counted against the memory cap
    char label[160];          // "small", "small w4a16 g64 rtn asym", a path
    model_request request;    // how it was loaded (quant NULL), to load it again
    char model_arg[512];      // request.model_arg points here
    char tokenizer_arg[512];  // request.tokenizer_arg points here (when given)
    struct lab_model* next;   // the lesson's list of live models
    struct lab_model* previous;
} lab_model;

struct lab_engine; // api_engine.c

// What the lab module keeps for one lesson. The host holds one per lesson
// and frees what is left in it when the lesson closes.
typedef struct lab_api_state {
    lab_model* models;            // live models (api_model.c)
    struct lab_engine* engines;   // live engines (api_engine.c)
    const engine* focus;          // the engine the lesson last created or stepped: the one the dashboard draws
    engine* timing_engine;        // lab.time's engine while it exists (its userdata's finalizer frees it)
    // the machine profile, read from its cache (or measured) on first use (lab.machine)
    bool machine_known;
    machine_profile machine;
    machine_profile_origin machine_origin;
} lab_api_state;

// ---- the lesson, as the parts see it (host.c) ---------------------------------------------

// The lesson that owns a Lua state (stored as the allocator's user data).
lesson* lesson_of(lua_State* L);

// The lab module's state of that lesson.
lab_api_state* lesson_api_state(lesson* l);

// The lesson's folder, absolute: reads and require stay beneath it.
const char* lesson_folder(const lesson* l);

// ---- limits (limits.c) --------------------------------------------------------------------

// Counts bytes against the memory cap before an engine or model allocates
// them (collecting garbage first when the cap would be exceeded). Raises a
// Lua error naming `what` when they do not fit.
void lesson_reserve_bytes(lua_State* L, uint64_t bytes, const char* what);
void lesson_release_bytes(lesson* l, uint64_t bytes);
// Counts bytes already allocated (a loaded model's real size, once known)
// without checking the cap: the estimate reserved before held the place.
void lesson_count_bytes(lesson* l, uint64_t bytes);

// CPU seconds the whole process has used (every thread).
double lesson_cpu_seconds(void);

// Raises "time limit of N s CPU exceeded" once the limit is spent (for C
// loops that run many engine steps between Lua instructions).
void lesson_check_time(lua_State* L);

// False once the time limit is spent or a stop was asked for: for long C
// work that can stop between its parts (model_quant_spec.keep_going);
// `user` is the lesson. The caller then raises with lesson_check_time.
bool lesson_keep_going(void* user);

// ---- paths (sandbox.c) --------------------------------------------------------------------

// True when `path` (resolved) is `dir` or inside it.
bool lesson_path_inside(const char* path, const char* dir);

// ---- reading a table of named arguments (args.c) ------------------------------------------
// Every field a function accepts is listed; an unknown one (a typo) is an
// error naming it. Errors read "bad argument #N to 'F' (field 'x': ...)".

// luaL_error with printf's formats (%g, %.1f, %lld, %zu, which
// lua_pushfstring lacks); the position of the calling Lua line comes first.
int lab_error(lua_State* L, const char* format, ...) __attribute__((format(printf, 2, 3)));

// Raises an argument error for `field` of argument `arg`.
int lab_field_error(lua_State* L, int arg, const char* field, const char* format, ...)
    __attribute__((format(printf, 4, 5)));

// One rule for every table a lesson hands the host: it is read raw
// (lab_get_field, lua_rawlen, lua_rawgeti), never through lua_getfield,
// lua_geti or luaL_len, whose __index and __len would run the lesson's code
// in the middle of a host function, while it holds C pointers (an engine
// closed there, a model collected there, was a use after free). Where the
// host does call the lesson's code (e:run's stop_when, lab.check's
// measure), it keeps what it uses referenced on the Lua stack, marks the
// engine busy (lab_engine_close refuses then) and looks again after.

// Pushes t[field] of the table at `arg`, read raw; returns its type.
int lab_get_field(lua_State* L, int arg, const char* field);

// Checks that argument `arg` is a table whose keys are all in `allowed`
// (NULL-terminated); an unknown key's error names the closest allowed one
// ("field 'block_sise': unknown field (did you mean 'block_size'? ...)").
void lab_check_fields(lua_State* L, int arg, const char* const* allowed);
// The same for a table inside argument `arg` (at stack `index`), its
// fields named "prefix.field" in errors (prefix "device.").
void lab_check_nested_fields(lua_State* L, int index, int arg, const char* prefix, const char* const* allowed);

// Optional fields: the default when absent (nil); an error when the type or range is wrong.
lua_Integer lab_opt_integer_field(lua_State* L, int arg, const char* field, lua_Integer fallback, lua_Integer min,
                                  lua_Integer max);
double lab_opt_number_field(lua_State* L, int arg, const char* field, double fallback, double min, double max);
bool lab_opt_boolean_field(lua_State* L, int arg, const char* field, bool fallback);
// Returns a string valid while the table is on the stack, or fallback.
const char* lab_opt_string_field(lua_State* L, int arg, const char* field, const char* fallback);
// The index of `field`'s choice among `choices` (NULL-terminated), or fallback when absent.
int lab_opt_choice_field(lua_State* L, int arg, const char* field, const char* const* choices, int fallback);

// Reads a Lua array of numbers at stack index `index` (argument `arg`, field
// `field` for messages) into a malloc'ed float array; *n gets its length.
float* lab_read_number_array(lua_State* L, int index, int arg, const char* field, size_t* n);

// Sets t[name] = value on the table at the top of the stack.
void lab_set_number(lua_State* L, const char* name, double value);
void lab_set_integer(lua_State* L, const char* name, lua_Integer value);
void lab_set_string(lua_State* L, const char* name, const char* value);
void lab_set_boolean(lua_State* L, const char* name, bool value);

// Pushes a Lua array of n numbers.
void lab_push_float_array(lua_State* L, const float* values, size_t n);
void lab_push_int32_array(lua_State* L, const int32_t* values, size_t n);

// A lab field that stands for a command-line flag, so that a lesson's
// engine means exactly what `servelab sim` means.
typedef struct lab_field_flag {
    const char* field;
    const char* flag;
    bool is_switch; // a boolean: false adds `flag`, true adds nothing
} lab_field_flag;

// The command line's parser for one flag (model_option_match, engine_option_match).
typedef bool (*lab_flag_matcher)(arg_cursor* cursor, void* target, bool* failed, error_info* err);

// Applies the fields of table `arg` in `fields` (ended by a NULL field)
// through `match`, one flag at a time; an error names the field.
void lab_apply_flag_fields(lua_State* L, int arg, const lab_field_flag* fields, lab_flag_matcher match, void* target);

// A metatable `name` whose __index holds `methods`, with __gc and __tostring,
// out of the lesson's reach. The methods are also listed as package
// `shown_as`, so a bad argument reads "bad argument #2 to 'engine.add'".
void lab_register_userdata_type(lua_State* L, const char* name, const char* shown_as, const luaL_Reg* methods,
                                lua_CFunction gc, lua_CFunction tostring);

// ---- strict tables (strict.c) ------------------------------------------------------------

// The lesson API's version, lab.api_version: raised whenever a name a
// lesson reads changes (lessons/README.md's changelog lists each change).
#define LAB_API_VERSION 4

// Makes the table at `index`, and every table inside it, strict: reading a
// name it lacks raises "KIND has no field 'x' (did you mean 'y'?)"; a name
// renamed since API 1 reads the new field, with one warning per lesson.
// `kind` names it in messages ("step record", "e:pool()"); nested tables
// are "KIND.field" and array elements "KIND[]". A table that already has
// a metatable (an element made strict under its own kind) is left as is.
void lab_make_strict(lua_State* L, int index, const char* kind);
// Gives "FILE:LINE: warning: MESSAGE" (the lesson's line) through the
// lesson's on_warning, the first time this lesson asks with KEY only.
void lab_warn_once(lua_State* L, const char* key, const char* message);

// The name among `names` closest to `key` (edit distance, where a key that
// starts a longer name counts 1), and that distance; NULL when n_names is 0.
const char* lab_closest_name(const char* key, const char* const* names, int n_names, int* distance);
// True when that distance is small enough to say "did you mean".
bool lab_name_is_close(const char* key, int distance);

// A warning for the lesson's author (a renamed field read by its old
// name): to the host's on_warning, else narrated as "warning: ...".
void lesson_warn(lesson* l, const char* text);
// A note for the person running the lesson (the machine profile was
// measured, and why): to the host's on_warning when it has one (headless:
// stderr), else dropped, so that it never becomes one of the lesson's lines.
void lesson_note(lesson* l, const char* text);

// ---- the parts, each adding its functions to the lab table on top -------------------------
void lab_open_model_api(lua_State* L);   // api_model.c: loading models, their shapes, tensors, tokenizer
void lab_open_engine_api(lua_State* L);  // api_engine.c: engines, requests, steps and records, the KV formula
void lab_open_quant_api(lua_State* L);   // api_quant.c: quantizing tensors, arrays, models
void lab_open_perf_api(lua_State* L);    // api_perf.c: timing, formulas, devices, the machine

// Free what lua_close left (nothing when every __gc ran): engines first,
// since each holds a reference to its model.
void lab_free_engines(lesson* l);  // api_engine.c
void lab_free_models(lesson* l);   // api_model.c

// ---- models (api_model.c), for the other parts -------------------------------------------

// The lab_model behind argument `arg` (a model userdata), raising otherwise.
lab_model* lab_check_model(lua_State* L, int arg);

// Loads a model (counted against the cap), registers it with the lesson and
// pushes its handle. Raises a Lua error on failure.
lab_model* lab_push_model(lua_State* L, const model_request* request);

// Loads the model that the model fields of table `arg` describe (model,
// tokenizer, dtype, quant, seed, n_kv_heads) and pushes its handle.
lab_model* lab_push_model_from_fields(lua_State* L, int arg);

// Loads the draft model a speculative config asks for (SPEC_DRAFT): the
// target quantized with the config's scheme, or the config's file (inside
// the folders a lesson may read, same vocabulary as the target); errors name
// field 'speculative' of table `arg`. Pushes its handle.
lab_model* lab_push_draft_model(lua_State* L, int arg, const lab_model* target, const speculative_config* spec);

// Drops one reference; the last frees the model and its bytes.
void lab_model_unreference(lesson* l, lab_model* m);

// Encodes text (BOS first when add_bos) into a userdata buffer left on the
// stack (collected with it, so an error cannot leak it); *n gets the count.
int32_t* lab_encode_text(lua_State* L, const tokenizer* t, const char* text, bool add_bos, int* n, int arg,
                         const char* field);

// Token ids from an array at `index` into a userdata buffer left on the
// stack; every id must lie in 0..vocab_size-1.
int32_t* lab_read_token_ids(lua_State* L, int index, int arg, const char* field, int vocab_size, bool allow_empty,
                            int* n);

// Pushes the text of `ids` (following token `previous`); "" without a tokenizer.
void lab_push_decoded(lua_State* L, const tokenizer* t, int32_t previous, const int32_t* ids, int n);

// Bytes an engine allocates besides its model: the KV pool, the forward
// pass's activations and the per-step logits (api_engine.c).
uint64_t lab_engine_bytes_estimate(const model_config* model, const engine_config* config);

#endif
