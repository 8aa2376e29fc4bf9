// lesson_internal: what lesson.c and the lab module's files (lesson_api_*.c)
// share. Not for hosts: they use lab/lesson/lesson.h.
#ifndef SERVELAB_LESSON_INTERNAL_H
#define SERVELAB_LESSON_INTERNAL_H

#include <lauxlib.h>
#include <lua.h>
#include <setjmp.h>
#include <signal.h>
#include <time.h>

#include "engine/engine.h"
#include "lab/lesson/lesson.h"
#include "lab/common/model_source.h"

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
} lab_totals;

typedef struct lab_engine {
    engine engine;
    lab_model* model;
    lab_totals totals;
    bool stepped;             // a record exists
    float* last_logits;       // (logits_capacity, vocab) the logits each sequence last sampled from
    int* logits_position;     // (logits_capacity) the position they followed, -1 if none
    int logits_capacity;
    uint64_t reserved_bytes;
    struct lab_engine* next;
    struct lab_engine* previous;
} lab_engine;

typedef struct lab_declared_claim {
    char id[16];
    bool checked;
} lab_declared_claim;

// Every block the Lua state allocates starts with this header, linked into
// the lesson's list, so that a state abandoned mid-instruction (the
// watchdog's hard stop) can still be freed block by block. 16 bytes keep
// the payload at malloc's 16-byte alignment.
typedef struct lua_block_header {
    struct lua_block_header* previous;
    struct lua_block_header* next;
} lua_block_header;

// Why the watchdog stopped a lesson from outside the interpreter.
typedef enum hard_stop_reason { HARD_STOP_NONE = 0, HARD_STOP_TIME, HARD_STOP_REQUESTED } hard_stop_reason;

// The longest claim lab.check accepts, in bytes (the bank's longest is ~300).
enum { LESSON_MAX_CLAIM_BYTES = 1000 };

// Files a lesson may hold open at once (each is a descriptor of the host's).
enum { LESSON_MAX_OPEN_FILES = 32 };

struct lesson {
    lua_State* L;             // the main state (owns everything); NULL once abandoned
    lua_State* thread;        // the coroutine running the lesson's body
    int thread_reference;     // keeps the coroutine alive in the registry
    lesson_options options;
    char path[1024];
    char lesson_dir[1024];    // absolute folder of the lesson (reads, require)
    char output_dir[1024];    // where writes go (absolute once created)
    uint64_t lua_bytes;       // the Lua heap now
    lua_block_header lua_blocks; // the list of the heap's blocks (a ring through this head)
    uint64_t external_bytes;  // engines and models now
    double cpu_start_s;
    bool time_exceeded;
    bool stop_raised;         // the hook has raised the stop request once
    // the watchdog (lesson_watchdog.c)
    timer_t watchdog_timer;
    bool watchdog_running;
    sigjmp_buf hard_stop_jump; // set by lesson_resume; the handler jumps here
    volatile sig_atomic_t hard_stop_reason;
    volatile sig_atomic_t hook_tightened; // the watchdog has set the hook to every instruction
    volatile double stop_seen_s; // monotonic time the stop flag was first seen, 0 before
    // files (lesson_sandbox.c)
    int lesson_fd;            // the lesson's folder, -1 until first read
    int output_fd;            // the output folder, -1 until first write
    FILE* open_files[LESSON_MAX_OPEN_FILES];
    int n_open_files;
    lesson_status status;
    bool started;
    char error[1024];
    const engine* focus;
    engine* timing_engine;    // lab.time's engine while it exists (its userdata's finalizer frees it)
    lab_model* models;
    lab_engine* engines;
    // checks
    lab_declared_claim declared[64];
    int n_declared;
    bool declaration_seen;
    char title[160];
    bool info_only;           // lesson_read_info: stop at the declaration
    int passed;
    int failed;
    bool finished;
    // the machine, measured once per lesson on first use (lab.machine)
    bool machine_measured;
    double machine_bandwidth_bytes_per_s;
    double machine_peak_flops;
};

// The lesson that owns a Lua state (stored as the allocator's user data).
lesson* lesson_of(lua_State* L);

// Counts bytes against the memory cap before an engine or model allocates
// them (collecting garbage first when the cap would be exceeded). Raises a
// Lua error naming `what` when they do not fit.
void lesson_reserve_bytes(lua_State* L, uint64_t bytes, const char* what);
void lesson_release_bytes(lesson* l, uint64_t bytes);

// CPU seconds the whole process has used (every thread).
double lesson_cpu_seconds(void);

// Raises "time limit of N s CPU exceeded" once the limit is spent (for C
// loops that run many engine steps between Lua instructions).
void lesson_check_time(lua_State* L);

// Makes the hook run at the lesson's next instruction (it then raises the
// time limit or the stop). The watchdog calls it from its signal handler
// (lua_sethook may be called there) the moment the limit is spent, so a
// lesson of long host calls (12 lab.model("small") in a row, 0.5 s each)
// stops after the call in progress instead of 10000 instructions later.
void lesson_tighten_hook(lesson* l);

// False once the time limit is spent or a stop was asked for: for long C
// work that can stop between its parts (model_quant_spec.keep_going);
// `user` is the lesson. The caller then raises with lesson_check_time.
bool lesson_keep_going(void* user);

// True when `path` (resolved) is `dir` or inside it (lesson.c).
bool lesson_path_inside(const char* path, const char* dir);

// ---- the sandbox (lesson_sandbox.c) ---------------------------------------------------------

// Opens the allowed libraries and installs the restricted io, os, require,
// load and setmetatable (lab/lesson/lesson.h lists what lessons may reach).
void lesson_install_sandbox(lua_State* L);

// Closes the files and folders the lesson still holds.
void lesson_close_files(lesson* l);

// Copies text with its control characters made visible (ESC as "^[", C1
// controls as '?'), keeping newlines and tabs when multiline. Returns the
// length written (cut to capacity - 1).
size_t lesson_clean_text(const char* text, char* out, size_t capacity, bool multiline);
// The same into a malloc'ed copy (NULL when out of memory).
char* lesson_clean_copy(const char* text, bool multiline);

// ---- the watchdog (lesson_watchdog.c) -------------------------------------------------------

// True when the hard stop can work here (liblua is a shared library whose
// code the watchdog can tell apart).
bool lesson_watchdog_available(void);
// Arms the periodic tick for the calling thread; 0, or -1 when unavailable.
int lesson_watchdog_start(lesson* l);
void lesson_watchdog_stop(lesson* l);

// Narration and checks (lesson.c).
void lesson_say(lesson* l, const char* text);

// ---- reading a table of named arguments ------------------------------------------------
// Every field a function accepts is listed; an unknown one (a typo) is an
// error naming it. Errors read "bad argument #N to 'F' (field 'x': ...)".

// luaL_error with printf's formats (%g, %.1f, %lld, %zu, which
// lua_pushfstring lacks); the position of the calling Lua line comes first.
int lab_error(lua_State* L, const char* format, ...) __attribute__((format(printf, 2, 3)));

// Raises an argument error for `field` of argument `arg`.
int lab_field_error(lua_State* L, int arg, const char* field, const char* format, ...)
    __attribute__((format(printf, 4, 5)));

// Checks that argument `arg` is a table whose keys are all in `allowed`
// (NULL-terminated).
void lab_check_fields(lua_State* L, int arg, const char* const* allowed);

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

// ---- the lab module's parts, each adding its functions to the table on top ---------------
void lab_open_engine_api(lua_State* L);  // lesson_api_engine.c: models, engines, requests, records
void lab_open_quant_api(lua_State* L);   // lesson_api_quant.c: quantizing tensors, arrays, models
void lab_open_perf_api(lua_State* L);    // lesson_api_perf.c: timing, formulas, devices, the machine

// Frees what lua_close left (nothing when every __gc ran). lesson_api_engine.c.
void lab_free_objects(lesson* l);

// The lab_model behind argument `arg` (a model userdata), raising otherwise.
lab_model* lab_check_model(lua_State* L, int arg);

// Loads a model (counted against the cap), registers it with the lesson and
// pushes its handle. Raises a Lua error on failure.
lab_model* lab_push_model(lua_State* L, const model_request* request);

// Bytes an engine allocates besides its model: the KV pool, the forward
// pass's activations and the per-step logits.
uint64_t lab_engine_bytes_estimate(const model_config* model, const engine_config* config);

#endif
