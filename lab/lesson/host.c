// lesson host: the Lua state and the coroutine that runs the lesson, the
// lab table (narration here; checks.c, api_*.c add the rest), and the host
// API of lab/lesson/lesson.h. The sandbox (sandbox.c) and the limits
// (limits.c, watchdog.c) guard it.
#include "lab/lesson/lesson.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <lualib.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lab/lesson/internal.h"

lesson_options lesson_options_default(void) {
    return (lesson_options){
        .interactive = false,
        .full = false,
        .time_limit_s = 60.0,
        .memory_limit_bytes = 512ull << 20,
        .output_dir = "lesson-output",
        .write_limit_bytes = LESSON_WRITE_LIMIT_BYTES,
        .write_limit_files = LESSON_WRITE_LIMIT_FILES,
    };
}

lesson* lesson_of(lua_State* L) {
    void* user = NULL;
    lua_getallocf(L, &user);
    return user;
}

lab_api_state* lesson_api_state(lesson* l) { return &l->api; }

const char* lesson_folder(const lesson* l) { return l->lesson_dir; }

// ---- narration and checks -----------------------------------------------------------------

void lesson_say(lesson* l, const char* text) {
    if (!l->options.on_say || l->info_only) return;
    char* clean = lesson_clean_copy(text, true);
    if (clean) l->options.on_say(l->options.user, clean);
    free(clean);
}

void lesson_warn(lesson* l, const char* text) {
    if (l->info_only) return;
    char* clean = lesson_clean_copy(text, true);
    if (!clean) return;
    if (l->options.on_warning) l->options.on_warning(l->options.warning_user, clean);
    else if (l->options.on_say) l->options.on_say(l->options.user, clean);
    free(clean);
}

void lesson_note(lesson* l, const char* text) {
    if (l->info_only || !l->options.on_warning) return;
    char* clean = lesson_clean_copy(text, true);
    if (!clean) return;
    l->options.on_warning(l->options.warning_user, clean);
    free(clean);
}

static int lab_say(lua_State* L) {
    lesson_say(lesson_of(L), luaL_checkstring(L, 1));
    return 0;
}

static int lab_pause(lua_State* L) {
    lesson* l = lesson_of(L);
    // Headless, or inside a call that cannot yield (a sort comparator, an
    // until-function of e:run): a pause is a no-op.
    if (!l->options.interactive || !lua_isyieldable(L)) return 0;
    return lua_yield(L, 0);
}

// In info mode every other lab function stops the lesson with this message.
static int lab_info_index(lua_State* L) {
    const char* key = lua_tostring(L, 2);
    return lab_error(L, "lab.%s used before lab.lesson{title=..., claims=...} (declare the lesson first)",
                      key ? key : "?");
}

static int open_lab(lua_State* L) {
    lesson* l = lesson_of(L);
    lua_newtable(L);
    lab_set_boolean(L, "full", l->options.full);
    lab_set_boolean(L, "interactive", l->options.interactive);
    // A verdict for lab.check when a timing's interval straddles the
    // threshold: the machine was too noisy to decide (CHECK_UNDECIDED).
    lab_set_string(L, "UNDECIDED", LESSON_UNDECIDED_VERDICT);
    // A lesson may check it (`assert(lab.api_version >= 3)`); the changelog
    // in lessons/README.md says what each version renamed.
    lab_set_integer(L, "api_version", LAB_API_VERSION);
    lab_set_string(L, "lesson_dir", l->lesson_dir);
    lab_set_string(L, "output_dir", l->output_dir);
    lua_pushcfunction(L, lab_declare_lesson);
    lua_setfield(L, -2, "lesson");
    if (l->info_only) {
        lua_newtable(L);
        lua_pushcfunction(L, lab_info_index);
        lua_setfield(L, -2, "__index");
        lua_setmetatable(L, -2);
        return 1;
    }
    static const luaL_Reg functions[] = {{"say", lab_say}, {"pause", lab_pause}, {"check", lab_check}, {NULL, NULL}};
    luaL_setfuncs(L, functions, 0);
    lab_open_model_api(L);
    lab_open_engine_api(L);
    lab_open_quant_api(L);
    lab_open_perf_api(L);
    // lab.ful is an error naming lab.full, not a nil that fails later as
    // "attempt to call a nil value".
    lab_make_strict(L, -1, "lab");
    return 1;
}

// Runs in protected mode: libraries, sandbox, lab module, and the chunk.
static int setup_state(lua_State* L) {
    lesson* l = lesson_of(L);
    lesson_install_sandbox(L);
    luaL_requiref(L, "lab", open_lab, 1);
    lua_pop(L, 1);
    if (luaL_loadfilex(L, l->path, "t") != LUA_OK) return lua_error(L);
    return 1;
}

// ---- the host API -------------------------------------------------------------------------

static void set_failure(lesson* l, const char* message) {
    lesson_clean_text(message, l->error, sizeof l->error, false); // the lesson's text, shown inert
    l->status = LESSON_FAILED;
}

static int open_lesson(lesson** out, const char* path, const lesson_options* options, bool info_only,
                       error_info* err) {
    *out = NULL;
    lesson* l = calloc(1, sizeof *l);
    if (!l) return error_set(err, "%s: out of memory", path);
    l->info_only = info_only;
    l->options = options ? *options : lesson_options_default();
    if (l->options.time_limit_s <= 0) l->options.time_limit_s = 60.0;
    if (l->options.memory_limit_bytes == 0) l->options.memory_limit_bytes = 512ull << 20;
    if (l->options.write_limit_bytes == 0) l->options.write_limit_bytes = LESSON_WRITE_LIMIT_BYTES;
    if (l->options.write_limit_files <= 0) l->options.write_limit_files = LESSON_WRITE_LIMIT_FILES;
    snprintf(l->path, sizeof l->path, "%s", path);
    snprintf(l->output_dir, sizeof l->output_dir, "%s", l->options.output_dir ? l->options.output_dir : "lesson-output");
    char resolved[PATH_MAX];
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || !realpath(path, resolved)) {
        free(l);
        return error_set(err, "%s: no such lesson file", path);
    }
    char* slash = strrchr(resolved, '/');
    snprintf(l->lesson_dir, sizeof l->lesson_dir, "%.*s", (int)(slash - resolved), resolved);
    if (!l->lesson_dir[0]) snprintf(l->lesson_dir, sizeof l->lesson_dir, "/");
    l->status = LESSON_PAUSED;
    l->lua_blocks.next = l->lua_blocks.previous = &l->lua_blocks;
    l->lesson_fd = l->output_fd = -1;
    l->L = lua_newstate(lesson_alloc, l);
    if (!l->L) {
        free(l);
        return error_set(err, "%s: cannot create a Lua state", path);
    }
    lua_State* L = l->L;
    lua_pushcfunction(L, setup_state);
    if (lua_pcall(L, 0, 1, 0) != LUA_OK) {
        error_set(err, "%s", lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "cannot load the lesson");
        lesson_close(l);
        return -1;
    }
    l->thread = lua_newthread(L);
    lua_insert(L, -2);
    lua_xmove(L, l->thread, 1); // the chunk becomes the coroutine's body
    l->thread_reference = luaL_ref(L, LUA_REGISTRYINDEX);
    lesson_install_time_hook(l);
    *out = l;
    return 0;
}

int lesson_open(lesson** out, const char* path, const lesson_options* options, error_info* err) {
    return open_lesson(out, path, options, false, err);
}

// True when a message starts with "SOURCE:LINE: " (Lua added a position).
static bool has_position(const char* message) {
    const char* colon = strchr(message, ':');
    if (!colon || colon == message || colon[1] < '0' || colon[1] > '9') return false;
    const char* c = colon + 1;
    while (*c >= '0' && *c <= '9') c++;
    return *c == ':';
}

// Where the lesson was when it failed: the innermost Lua line on the
// coroutine's stack (kept after an error), for messages without one.
static void failure_location(lua_State* thread, char* out, size_t capacity) {
    lua_Debug ar;
    out[0] = '\0';
    for (int level = 0; lua_getstack(thread, level, &ar); level++) {
        if (!lua_getinfo(thread, "Sl", &ar) || ar.currentline <= 0) continue;
        snprintf(out, capacity, "%s:%d: ", ar.short_src, ar.currentline);
        return;
    }
}

// What the lab module's parts left: engines first (each holds its model),
// then models, then lab.time's engine, whose finalizer did not run when
// the state was abandoned.
static void free_api_objects(lesson* l) {
    lab_free_engines(l);
    lab_free_models(l);
    if (l->api.timing_engine) engine_free(l->api.timing_engine);
    l->api.timing_engine = NULL;
}

// After the watchdog's hard stop: the Lua state was left mid-instruction
// and cannot be closed (its finalizers would run on broken structures).
// Everything it owned is freed without it: the engines and models (none
// was mid-step: the stop lands only inside liblua), the files, and every
// heap block.
static void abandon_state(lesson* l) {
    l->L = NULL;
    l->thread = NULL;
    l->api.focus = NULL;
    free_api_objects(l);
    lesson_close_files(l);
    lesson_free_lua_blocks(l);
}

static void fail_after_hard_stop(lesson* l) {
    char message[1400];
    if (l->hard_stop_reason == HARD_STOP_TIME)
        snprintf(message, sizeof message,
                 "%s: time limit of %g s CPU exceeded (--time-limit) inside a call the time check cannot "
                 "enter (a long library call such as a string pattern, or code running with hooks off); "
                 "the lesson was stopped and its state discarded",
                 l->path, l->options.time_limit_s);
    else
        snprintf(message, sizeof message,
                 "%s: stopped: the lesson was interrupted (Ctrl-C or a signal) inside a long call; its state "
                 "was discarded",
                 l->path);
    set_failure(l, message);
}

// Runs the coroutine until it yields, ends or fails; with the watchdog
// armed around it. Returns lua_resume's status, or -1 after a hard stop.
static int resume_guarded(lesson* l, int* n_results) {
    l->hard_stop_reason = HARD_STOP_NONE;
    if (sigsetjmp(l->hard_stop_jump, 1) != 0) {
        lesson_watchdog_stop(l);
        return -1;
    }
    bool guarded = lesson_watchdog_start(l) == 0;
    int status = lua_resume(l->thread, l->L, 0, n_results);
    if (guarded) lesson_watchdog_stop(l);
    return status;
}

lesson_status lesson_resume(lesson* l) {
    if (l->status != LESSON_PAUSED) return l->status;
    if (!l->started) {
        l->started = true;
        l->cpu_start_s = lesson_cpu_seconds();
    }
    int n_results = 0;
    // The lesson's faults hold while its code runs (engine/fault.h: set
    // before anything is built, never while an engine steps elsewhere).
    fault_set outer_faults = fault_install(fault_enabled_set | l->options.faults);
    int status = resume_guarded(l, &n_results);
    fault_install(outer_faults);
    if (status == -1) {
        abandon_state(l);
        fail_after_hard_stop(l);
    } else if (status == LUA_YIELD) {
        lua_pop(l->thread, n_results);
        return LESSON_PAUSED;
    } else if (status == LUA_OK) {
        l->status = LESSON_DONE;
    } else if (lesson_stopped_at_declaration(l->thread)) {
        l->status = LESSON_DONE; // lesson_read_info: stopped at the declaration
    } else {
        char where[1200], message[1024];
        failure_location(l->thread, where, sizeof where);
        // A memory error caught by a host's protected call (e:run's
        // stop_when) and raised again arrives as a runtime error holding
        // Lua's own message.
        bool memory_error = status == LUA_ERRMEM || (lua_type(l->thread, -1) == LUA_TSTRING &&
                                                     strcmp(lua_tostring(l->thread, -1), "not enough memory") == 0);
        if (memory_error)
            snprintf(message, sizeof message, "memory limit of %d MiB reached (--memory-limit)",
                     (int)(l->options.memory_limit_bytes >> 20));
        else if (lua_type(l->thread, -1) == LUA_TSTRING)
            snprintf(message, sizeof message, "%s", lua_tostring(l->thread, -1));
        else
            snprintf(message, sizeof message, "error object is a %s, not a message", luaL_typename(l->thread, -1));
        char full[2300];
        snprintf(full, sizeof full, "%s%s", has_position(message) ? "" : where, message);
        set_failure(l, full);
    }
    if (!l->info_only) lesson_finish(l);
    return l->status;
}

const char* lesson_error(const lesson* l) { return l->error; }

const engine* lesson_focus_engine(const lesson* l) { return l->api.focus; }

int lesson_undecided(const lesson* l) { return l->undecided; }

void lesson_counts(const lesson* l, int* passed, int* failed) {
    *passed = l->passed;
    *failed = l->failed;
}

void lesson_finish(lesson* l) {
    if (l->finished) return;
    l->finished = true;
    lesson_report_unchecked(l);
}

void lesson_close(lesson* l) {
    if (!l) return;
    if (l->L) lua_close(l->L); // runs every __gc: engines, models and files are freed
    free_api_objects(l);
    lesson_close_files(l);
    lesson_free_lua_blocks(l); // nothing is left after lua_close; an abandoned state's blocks
    free(l);
}

// ---- metadata ----------------------------------------------------------------------------

int lesson_read_info(const char* path, lesson_info* out, error_info* err) {
    memset(out, 0, sizeof *out);
    lesson_options options = lesson_options_default();
    options.time_limit_s = 5.0; // a declaration takes microseconds
    lesson* l = NULL;
    if (open_lesson(&l, path, &options, true, err)) return -1;
    lesson_status status = lesson_resume(l);
    int result = 0;
    if (status == LESSON_FAILED) result = error_set(err, "%s", l->error);
    else if (!l->declaration_seen)
        result = error_set(err, "%s: no lab.lesson{title = ..., claims = {...}} declaration at the top", path);
    else {
        snprintf(out->title, sizeof out->title, "%s", l->title);
        for (int i = 0; i < l->n_declared; i++) snprintf(out->claims[i], sizeof out->claims[i], "%s", l->declared[i].id);
        out->n_claims = l->n_declared;
    }
    lesson_close(l);
    return result;
}
