// lesson: the Lua state, its sandbox and limits, the coroutine that runs
// the lesson, narration and checks (lab/lesson/lesson.h).
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

// Instructions between two looks at the clock: about 0.1 ms of Lua.
enum { HOOK_INSTRUCTIONS = 10000 };

lesson_options lesson_options_default(void) {
    return (lesson_options){
        .interactive = false,
        .full = false,
        .time_limit_s = 60.0,
        .memory_limit_bytes = 512ull << 20,
        .output_dir = "lesson-output",
    };
}

double lesson_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// ---- memory: one cap for the Lua heap and the engines ------------------------------------

static void link_block(lesson* l, lua_block_header* h) {
    h->previous = &l->lua_blocks;
    h->next = l->lua_blocks.next;
    l->lua_blocks.next->previous = h;
    l->lua_blocks.next = h;
}

static void unlink_block(lua_block_header* h) {
    h->previous->next = h->next;
    h->next->previous = h->previous;
}

static void* lesson_alloc(void* user, void* block, size_t old_size, size_t new_size) {
    lesson* l = user;
    if (!block) old_size = 0; // old_size then encodes the object's type
    lua_block_header* header = block ? (lua_block_header*)block - 1 : NULL;
    if (new_size == 0) {
        if (header) {
            unlink_block(header);
            free(header);
        }
        l->lua_bytes -= old_size;
        return NULL;
    }
    if (new_size > old_size &&
        l->lua_bytes + l->external_bytes + (new_size - old_size) > l->options.memory_limit_bytes)
        return NULL; // Lua raises a memory error (the cap also keeps new_size + header from wrapping)
    if (header) unlink_block(header);
    lua_block_header* grown = realloc(header, sizeof *grown + new_size);
    if (!grown) {
        if (header) link_block(l, header);
        return NULL;
    }
    link_block(l, grown);
    l->lua_bytes = l->lua_bytes - old_size + new_size;
    return grown + 1;
}

// Frees every block of a Lua state that can no longer be closed.
static void free_lua_blocks(lesson* l) {
    while (l->lua_blocks.next != &l->lua_blocks) {
        lua_block_header* h = l->lua_blocks.next;
        unlink_block(h);
        free(h);
    }
    l->lua_bytes = 0;
}

lesson* lesson_of(lua_State* L) {
    void* user = NULL;
    lua_getallocf(L, &user);
    return user;
}

void lesson_reserve_bytes(lua_State* L, uint64_t bytes, const char* what) {
    lesson* l = lesson_of(L);
    uint64_t cap = l->options.memory_limit_bytes;
    if (l->lua_bytes + l->external_bytes + bytes > cap) lua_gc(L, LUA_GCCOLLECT); // engines nobody holds
    if (l->lua_bytes + l->external_bytes + bytes > cap)
        lab_error(L, "memory limit of %d MiB: %s needs %.1f MiB, and %.1f MiB are in use (Lua %.1f, engines and models %.1f)",
                   (int)(cap >> 20), what, (double)bytes / 1048576.0,
                   (double)(l->lua_bytes + l->external_bytes) / 1048576.0, (double)l->lua_bytes / 1048576.0,
                   (double)l->external_bytes / 1048576.0);
    l->external_bytes += bytes;
}

void lesson_release_bytes(lesson* l, uint64_t bytes) {
    l->external_bytes = bytes > l->external_bytes ? 0 : l->external_bytes - bytes;
}

// ---- time: an instruction-count hook, and checks from C loops ------------------------------

static void raise_time_limit(lua_State* L) {
    lesson* l = lesson_of(L);
    l->time_exceeded = true;
    lab_error(L, "time limit of %g s CPU exceeded (--time-limit)", l->options.time_limit_s);
}

static bool stop_requested(const lesson* l) { return l->options.stop_flag && *l->options.stop_flag; }

static void time_hook(lua_State* L, lua_Debug* ar) {
    (void)ar;
    lesson* l = lesson_of(L);
    if (l->time_exceeded || lesson_cpu_seconds() - l->cpu_start_s > l->options.time_limit_s) {
        // From now on every instruction raises: a pcall that catches the
        // error cannot keep the lesson alive.
        lua_sethook(L, time_hook, LUA_MASKCOUNT, 1);
        raise_time_limit(L);
    }
    if (stop_requested(l)) {
        l->stop_raised = true;
        lua_sethook(L, time_hook, LUA_MASKCOUNT, 1);
        lab_error(L, "stopped: the lesson was interrupted (Ctrl-C or a signal)");
    }
}

bool lesson_keep_going(void* user) {
    const lesson* l = user;
    return !l->time_exceeded && lesson_cpu_seconds() - l->cpu_start_s <= l->options.time_limit_s && !stop_requested(l);
}

void lesson_tighten_hook(lesson* l) {
    if (l->thread) lua_sethook(l->thread, time_hook, LUA_MASKCOUNT, 1);
}

void lesson_check_time(lua_State* L) {
    lesson* l = lesson_of(L);
    if (l->time_exceeded || lesson_cpu_seconds() - l->cpu_start_s > l->options.time_limit_s) raise_time_limit(L);
    if (stop_requested(l)) lab_error(L, "stopped: the lesson was interrupted (Ctrl-C or a signal)");
}

// ---- the sandbox ----------------------------------------------------------------------------

bool lesson_path_inside(const char* path, const char* dir) {
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

// ---- narration and checks -----------------------------------------------------------------

void lesson_say(lesson* l, const char* text) {
    if (!l->options.on_say || l->info_only) return;
    char* clean = lesson_clean_copy(text, true);
    if (clean) l->options.on_say(l->options.user, clean);
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

static lab_declared_claim* find_declared(lesson* l, const char* id) {
    for (int i = 0; i < l->n_declared; i++)
        if (strcmp(l->declared[i].id, id) == 0) return &l->declared[i];
    return NULL;
}

static void report_check(lesson* l, const lesson_check_result* result) {
    bool counted = !l->options.only_claim || strcmp(l->options.only_claim, result->id) == 0;
    if (!counted) return;
    if (result->outcome == CHECK_PASS) l->passed++;
    else l->failed++;
    if (!l->options.on_check) return;
    // The claim and the evidence are the lesson's text: shown inert.
    lesson_check_result shown = *result;
    shown.running = fault_enabled_set;
    char* claim = lesson_clean_copy(result->claim, false);
    char* evidence = lesson_clean_copy(result->evidence, false);
    char* note = lesson_clean_copy(result->note ? result->note : "", false);
    if (claim) shown.claim = claim;
    if (evidence) shown.evidence = evidence;
    if (note) shown.note = note;
    if (claim && evidence && note) l->options.on_check(l->options.user, &shown);
    free(claim);
    free(evidence);
    free(note);
}

static bool valid_claim_id(const char* id) {
    size_t n = strlen(id);
    if (n == 0 || n >= sizeof ((lab_declared_claim*)0)->id) return false;
    for (const char* c = id; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '_')) return false;
    return true;
}

// lab.check{id=, claim=, bank_answer=, verdict=, evidence=} or with
// measure=function() return verdict, evidence end instead of verdict and
// evidence (an error inside measure is a FAIL line, not a failed lesson).
// A claim the question bank does not make (the lab's own, beyond the bank)
// gives beyond_bank = true and answer = what the lesson expects instead of
// bank_answer.
// breaks_with = {"no-cow", ...}: the faults (engine/fault.h) under which the
// verdict must turn; "" in problem when the list is well formed.
static fault_set read_breaks_with(lua_State* L, char* problem, size_t capacity) {
    fault_set set = 0;
    int type = lua_getfield(L, 1, "breaks_with");
    if (type == LUA_TNIL) {
        lua_pop(L, 1);
        return 0;
    }
    if (type != LUA_TTABLE) {
        snprintf(problem, capacity, "field 'breaks_with': expected an array of fault names, got %s", luaL_typename(L, -1));
    } else {
        lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
        for (lua_Integer i = 1; i <= n && !problem[0]; i++) {
            const char* name = lua_rawgeti(L, -1, i) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
            int id = name ? fault_lookup(name) : -1;
            if (id < 0)
                snprintf(problem, capacity, "field 'breaks_with': item %lld is not a fault name%s%.40s%s "
                         "(servelab info --faults lists them)", (long long)i, name ? " ('" : "", name ? name : "",
                         name ? "')" : "");
            else set |= (fault_set)1 << id;
            lua_pop(L, 1);
        }
        if (!problem[0] && n == 0) snprintf(problem, capacity, "field 'breaks_with': expected at least one fault name");
    }
    lua_pop(L, 1);
    return set;
}

static int lab_check(lua_State* L) {
    static const char* const fields[] = {"id", "claim", "bank_answer", "beyond_bank", "answer", "verdict",
                                         "evidence", "measure", "breaks_with", "note", NULL};
    lab_check_fields(L, 1, fields);
    lesson* l = lesson_of(L);
    // Copies: measure() below runs the lesson's code, which may empty the
    // table and collect its strings.
    char id[sizeof l->declared[0].id];
    char claim[LESSON_MAX_CLAIM_BYTES + 1];
    const char* given_id = lab_opt_string_field(L, 1, "id", NULL);
    if (!given_id) lab_field_error(L, 1, "id", "expected the claim id as a string (\"tf1\", \"se3\", ...)");
    if (!valid_claim_id(given_id))
        lab_field_error(L, 1, "id", "'%s' is not a claim id (lowercase letters, digits, '-', '_'; at most 15)", given_id);
    snprintf(id, sizeof id, "%s", given_id);
    const char* given_claim = lab_opt_string_field(L, 1, "claim", NULL);
    if (!given_claim) lab_field_error(L, 1, "claim", "expected the claim in words");
    if (strlen(given_claim) > LESSON_MAX_CLAIM_BYTES)
        lab_field_error(L, 1, "claim", "%zu bytes is too long (at most %d)", strlen(given_claim), LESSON_MAX_CLAIM_BYTES);
    snprintf(claim, sizeof claim, "%s", given_claim);
    int beyond_type = lua_getfield(L, 1, "beyond_bank");
    bool beyond_bank = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (beyond_type != LUA_TNIL && beyond_type != LUA_TBOOLEAN)
        lab_field_error(L, 1, "beyond_bank", "expected true (a claim the question bank does not make), got %s",
                        luaL_typename(L, beyond_type));
    const char* answer_field = beyond_bank ? "answer" : "bank_answer";
    const char* other_field = beyond_bank ? "bank_answer" : "answer";
    if (lua_getfield(L, 1, other_field) != LUA_TNIL)
        lab_field_error(L, 1, other_field, beyond_bank ? "a claim beyond the bank has no bank_answer; give answer"
                                                       : "answer goes with beyond_bank = true; a bank claim gives bank_answer");
    lua_pop(L, 1);
    if (lua_getfield(L, 1, answer_field) != LUA_TBOOLEAN)
        lab_field_error(L, 1, answer_field, beyond_bank ? "expected true or false (what the lesson expects), got %s"
                                                        : "expected true or false (what the question bank says), got %s",
                        luaL_typename(L, -1));
    bool bank_answer = lua_toboolean(L, -1);
    lua_pop(L, 1);

    char note[LESSON_MAX_CLAIM_BYTES + 1] = "";
    const char* given_note = lab_opt_string_field(L, 1, "note", "");
    if (strlen(given_note) > LESSON_MAX_CLAIM_BYTES)
        lab_field_error(L, 1, "note", "%zu bytes is too long (at most %d)", strlen(given_note), LESSON_MAX_CLAIM_BYTES);
    snprintf(note, sizeof note, "%s", given_note);

    lesson_check_result result = {id, claim, bank_answer, false, "", CHECK_FAIL, 0, note, 0, beyond_bank};
    char problem[600] = "";
    result.breaks_with = read_breaks_with(L, problem, sizeof problem);
    lab_declared_claim* declared = find_declared(l, id);
    if (!problem[0] && l->declaration_seen && !declared)
        snprintf(problem, sizeof problem, "claim '%s' is not declared in lab.lesson{claims = {...}}", id);
    else if (!problem[0] && declared && declared->checked)
        snprintf(problem, sizeof problem, "claim '%s' was already checked in this lesson", id);
    if (declared) declared->checked = true;

    int measure_type = lua_getfield(L, 1, "measure");
    int base = lua_gettop(L);
    if (!problem[0] && measure_type != LUA_TNIL) {
        if (measure_type != LUA_TFUNCTION) {
            snprintf(problem, sizeof problem, "field 'measure': expected a function, got %s", luaL_typename(L, -1));
        } else {
            lua_pushvalue(L, -1);
            if (lua_pcall(L, 0, 2, 0) != LUA_OK) {
                if (l->time_exceeded) lua_error(L); // the time limit is not a check's failure
                snprintf(problem, sizeof problem, "measure failed: %s",
                         lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "(error object is not a string)");
            }
        }
    } else if (!problem[0]) {
        lua_getfield(L, 1, "verdict");
        lua_getfield(L, 1, "evidence");
    }
    if (!problem[0]) {
        // Stack: ..., verdict, evidence.
        if (lua_type(L, -2) != LUA_TBOOLEAN)
            snprintf(problem, sizeof problem, "verdict: expected a boolean computed from measurements, got %s",
                     luaL_typename(L, -2));
        else if (lua_type(L, -1) != LUA_TSTRING)
            snprintf(problem, sizeof problem, "evidence: expected a string with the measured numbers, got %s",
                     luaL_typename(L, -1));
        else {
            result.verdict = lua_toboolean(L, -2);
            result.evidence = lua_tostring(L, -1);
            result.outcome = result.verdict == bank_answer ? CHECK_PASS : CHECK_DISAGREE;
        }
    }
    if (result.outcome == CHECK_FAIL) result.evidence = problem;
    report_check(l, &result);
    lua_settop(L, base);
    return 0;
}

// A unique address: the error value that stops a lesson right after its
// declaration when only its metadata is wanted.
static const char DECLARATION_ONLY = 0;

// lab.lesson{title = "...", claims = {"tf1", ...}}: the lesson's declaration.
static int lab_lesson(lua_State* L) {
    static const char* const fields[] = {"title", "claims", NULL};
    lab_check_fields(L, 1, fields);
    lesson* l = lesson_of(L);
    if (l->declaration_seen) lab_error(L, "lab.lesson{} may be called once");
    const char* title = lab_opt_string_field(L, 1, "title", NULL);
    if (!title) lab_field_error(L, 1, "title", "expected the lesson's title");
    lesson_clean_text(title, l->title, sizeof l->title, false);
    if (lua_getfield(L, 1, "claims") != LUA_TTABLE) lab_field_error(L, 1, "claims", "expected an array of claim ids");
    lua_Integer n = luaL_len(L, -1);
    if (n < 1 || n > (lua_Integer)(sizeof l->declared / sizeof l->declared[0]))
        lab_field_error(L, 1, "claims", "expected 1..%d claim ids, got %lld", (int)(sizeof l->declared / sizeof l->declared[0]),
                        (long long)n);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, -1, i);
        const char* id = lua_tostring(L, -1);
        if (lua_type(L, -1) != LUA_TSTRING || !valid_claim_id(id))
            lab_field_error(L, 1, "claims", "element %lld: expected a claim id such as \"tf1\"", (long long)i);
        if (find_declared(l, id)) lab_field_error(L, 1, "claims", "'%s' is declared twice", id);
        snprintf(l->declared[l->n_declared].id, sizeof l->declared[0].id, "%s", id);
        l->declared[l->n_declared++].checked = false;
        lua_pop(L, 1);
    }
    l->declaration_seen = true;
    if (l->options.only_claim && !find_declared(l, l->options.only_claim)) {
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        for (int i = 0; i < l->n_declared; i++) {
            if (i) luaL_addstring(&b, ", ");
            luaL_addstring(&b, l->declared[i].id);
        }
        luaL_pushresult(&b);
        lab_error(L, "--only %s: this lesson does not declare that claim (it declares: %s)", l->options.only_claim,
                  lua_tostring(L, -1));
    }
    if (l->info_only) {
        lua_pushlightuserdata(L, (void*)&DECLARATION_ONLY);
        return lua_error(L);
    }
    return 0;
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
    lab_set_string(L, "lesson_dir", l->lesson_dir);
    lab_set_string(L, "output_dir", l->output_dir);
    lua_pushcfunction(L, lab_lesson);
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
    lab_open_engine_api(L);
    lab_open_quant_api(L);
    lab_open_perf_api(L);
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
    lua_sethook(l->thread, time_hook, LUA_MASKCOUNT, HOOK_INSTRUCTIONS);
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

// After the watchdog's hard stop: the Lua state was left mid-instruction
// and cannot be closed (its finalizers would run on broken structures).
// Everything it owned is freed without it: the engines and models (none
// was mid-step: the stop lands only inside liblua), the files, and every
// heap block.
static void abandon_state(lesson* l) {
    l->L = NULL;
    l->thread = NULL;
    l->focus = NULL;
    lab_free_objects(l);
    if (l->timing_engine) engine_free(l->timing_engine);
    l->timing_engine = NULL;
    lesson_close_files(l);
    free_lua_blocks(l);
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
    } else if (lua_touserdata(l->thread, -1) == (void*)&DECLARATION_ONLY) {
        l->status = LESSON_DONE; // lesson_read_info: stopped at the declaration
    } else {
        char where[1200], message[1024];
        failure_location(l->thread, where, sizeof where);
        if (status == LUA_ERRMEM)
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

const engine* lesson_focus_engine(const lesson* l) { return l->focus; }

void lesson_counts(const lesson* l, int* passed, int* failed) {
    *passed = l->passed;
    *failed = l->failed;
}

void lesson_finish(lesson* l) {
    if (l->finished) return;
    l->finished = true;
    for (int i = 0; i < l->n_declared; i++) {
        if (l->declared[i].checked) continue;
        char evidence[1200];
        snprintf(evidence, sizeof evidence, "never checked: %s",
                 l->status == LESSON_FAILED ? l->error : "the lesson ended before lab.check for it");
        lesson_check_result result = {l->declared[i].id, "(declared in lab.lesson)", false, false, evidence, CHECK_FAIL, 0, "", 0, false};
        report_check(l, &result);
    }
}

void lesson_close(lesson* l) {
    if (!l) return;
    if (l->L) lua_close(l->L); // runs every __gc: engines, models and files are freed
    lab_free_objects(l);
    lesson_close_files(l);
    free_lua_blocks(l); // nothing is left after lua_close; an abandoned state's blocks
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
