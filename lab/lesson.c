// lesson: the Lua state, its sandbox and limits, the coroutine that runs
// the lesson, narration and checks (lab/lesson.h).
#include "lab/lesson.h"

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

#include "lab/lesson_internal.h"

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

static void* lesson_alloc(void* user, void* block, size_t old_size, size_t new_size) {
    lesson* l = user;
    if (!block) old_size = 0; // old_size then encodes the object's type
    if (new_size == 0) {
        free(block);
        l->lua_bytes -= old_size;
        return NULL;
    }
    if (new_size > old_size &&
        l->lua_bytes + l->external_bytes + (new_size - old_size) > l->options.memory_limit_bytes)
        return NULL; // Lua raises a memory error
    void* grown = realloc(block, new_size);
    if (grown) l->lua_bytes = l->lua_bytes - old_size + new_size;
    return grown;
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

static void time_hook(lua_State* L, lua_Debug* ar) {
    (void)ar;
    lesson* l = lesson_of(L);
    if (l->time_exceeded || lesson_cpu_seconds() - l->cpu_start_s > l->options.time_limit_s) {
        // From now on every instruction raises: a pcall that catches the
        // error cannot keep the lesson alive.
        lua_sethook(L, time_hook, LUA_MASKCOUNT, 1);
        raise_time_limit(L);
    }
}

void lesson_check_time(lua_State* L) {
    lesson* l = lesson_of(L);
    if (l->time_exceeded || lesson_cpu_seconds() - l->cpu_start_s > l->options.time_limit_s) raise_time_limit(L);
}

// ---- the sandbox ----------------------------------------------------------------------------

// Copies text into a fixed buffer, cut to fit.
static void copy_text(char* out, size_t capacity, const char* text) {
    size_t n = strlen(text);
    if (n >= capacity) n = capacity - 1;
    memcpy(out, text, n);
    out[n] = '\0';
}

bool lesson_path_inside(const char* path, const char* dir) {
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

static int make_output_dir(lesson* l) {
    if (mkdir(l->output_dir, 0755) != 0 && errno != EEXIST) return -1;
    char resolved[PATH_MAX];
    if (!realpath(l->output_dir, resolved)) return -1;
    copy_text(l->output_dir, sizeof l->output_dir, resolved);
    return 0;
}

// Resolves a lesson's file name: reads relative to the lesson's folder,
// writes relative to the output folder; the result must stay inside it.
static const char* sandbox_path(lua_State* L, const char* name, bool write, char* out, size_t capacity) {
    lesson* l = lesson_of(L);
    const char* base = write ? l->output_dir : l->lesson_dir;
    if (write && make_output_dir(l) != 0)
        lab_error(L, "io.open: cannot create the output folder '%s': %s", l->output_dir, strerror(errno));
    base = write ? l->output_dir : l->lesson_dir;
    char joined[PATH_MAX * 2];
    if (name[0] == '/') snprintf(joined, sizeof joined, "%s", name);
    else snprintf(joined, sizeof joined, "%s/%s", base, name);
    // The folder part must exist and resolve inside base; the file itself
    // may not exist yet (a write). A resolved link pointing out is refused.
    char resolved[PATH_MAX];
    const char* slash = strrchr(joined, '/');
    char dir[PATH_MAX * 2];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - joined), joined);
    if (!realpath(dir[0] ? dir : "/", resolved))
        lab_error(L, "io.open: '%s': no such folder", name);
    snprintf(out, capacity, "%s/%s", resolved, slash + 1);
    char file_resolved[PATH_MAX];
    if (realpath(out, file_resolved)) snprintf(out, capacity, "%s", file_resolved);
    if (!lesson_path_inside(out, base) || strcmp(slash + 1, "..") == 0 || strcmp(slash + 1, ".") == 0)
        lab_error(L, "io.open: '%s' is outside the %s ('%s'); lessons may read only inside their own folder "
                      "and write only inside the output folder",
                   name, write ? "output folder" : "lesson's folder", base);
    return out;
}

// io.open(name [, mode]) restricted to the two folders.
static int sandbox_io_open(lua_State* L) {
    const char* name = luaL_checkstring(L, 1);
    const char* mode = luaL_optstring(L, 2, "r");
    bool write = strpbrk(mode, "wa+") != NULL;
    char path[PATH_MAX * 2];
    sandbox_path(L, name, write, path, sizeof path);
    lua_pushvalue(L, lua_upvalueindex(1)); // the real io.open
    lua_pushstring(L, path);
    lua_pushstring(L, mode);
    lua_call(L, 2, 3);
    return 3;
}

// io.lines(name, ...) for reading inside the lesson's folder.
static int sandbox_io_lines(lua_State* L) {
    const char* name = luaL_checkstring(L, 1);
    char path[PATH_MAX * 2];
    sandbox_path(L, name, false, path, sizeof path);
    int n = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1)); // the real io.lines
    lua_pushstring(L, path);
    for (int i = 2; i <= n; i++) lua_pushvalue(L, i);
    lua_call(L, n, 4);
    return 4;
}

// load(chunk [, name [, mode [, env]]]): text chunks only.
static int sandbox_load(lua_State* L) {
    int n = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1)); // the real load
    lua_pushvalue(L, 1);
    if (n >= 2) lua_pushvalue(L, 2);
    else lua_pushnil(L);
    lua_pushliteral(L, "t");
    if (n >= 4) lua_pushvalue(L, 4);
    lua_call(L, n >= 4 ? 4 : 3, 2);
    return 2;
}

// require(name): a .lua file in the lesson's folder, run once.
static int sandbox_require(lua_State* L) {
    const char* name = luaL_checkstring(L, 1);
    for (const char* c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
              *c == '-' || *c == '.'))
            luaL_argerror(L, 1, "module names use letters, digits, '_', '-' and '.' only");
    if (name[0] == '.' || strstr(name, "..")) luaL_argerror(L, 1, "module names cannot start with '.' or hold '..'");
    lua_getfield(L, LUA_REGISTRYINDEX, "servelab.loaded");
    if (lua_getfield(L, -1, name) != LUA_TNIL) return 1;
    lua_pop(L, 1);
    lesson* l = lesson_of(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addstring(&b, l->lesson_dir);
    luaL_addchar(&b, '/');
    for (const char* c = name; *c; c++) luaL_addchar(&b, *c == '.' ? '/' : *c);
    luaL_addstring(&b, ".lua");
    luaL_pushresult(&b);
    const char* path = lua_tostring(L, -1);
    if (luaL_loadfilex(L, path, "t") != LUA_OK)
        lab_error(L, "require '%s': %s (modules are .lua files in the lesson's folder)", name, lua_tostring(L, -1));
    lua_pushstring(L, name);
    lua_call(L, 1, 1);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 1);
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, -4, name); // servelab.loaded[name]
    return 1;
}

// print(...) is narration.
static int sandbox_print(lua_State* L) {
    int n = lua_gettop(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        if (i > 1) luaL_addchar(&b, '\t');
        luaL_tolstring(L, i, NULL);
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
    lesson_say(lesson_of(L), lua_tostring(L, -1));
    return 0;
}

// __index of the sandboxed io, os and package tables: names what is missing.
static int sandbox_missing(lua_State* L) {
    const char* library = lua_tostring(L, lua_upvalueindex(1));
    const char* allowed = lua_tostring(L, lua_upvalueindex(2));
    const char* key = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : "?";
    return luaL_error(L, "%s.%s is not available to lessons (the sandbox allows %s)", library, key, allowed);
}

// Gives the table on top of the stack a metatable whose __index raises sandbox_missing.
static void forbid_missing(lua_State* L, const char* library, const char* allowed) {
    lua_newtable(L);
    lua_pushstring(L, library);
    lua_pushstring(L, allowed);
    lua_pushcclosure(L, sandbox_missing, 2);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
}

// Opens library `name` into a table that is not a global, left on the stack.
static void open_hidden(lua_State* L, const char* name, lua_CFunction open) {
    luaL_requiref(L, name, open, 0);
}

static void install_sandbox(lua_State* L) {
    luaL_requiref(L, LUA_GNAME, luaopen_base, 1);
    lua_pop(L, 1);
    static const struct {
        const char* name;
        lua_CFunction open;
    } safe[] = {{LUA_TABLIBNAME, luaopen_table},
                {LUA_STRLIBNAME, luaopen_string},
                {LUA_MATHLIBNAME, luaopen_math},
                {LUA_UTF8LIBNAME, luaopen_utf8},
                {LUA_COLIBNAME, luaopen_coroutine}};
    for (size_t i = 0; i < sizeof safe / sizeof safe[0]; i++) {
        luaL_requiref(L, safe[i].name, safe[i].open, 1);
        lua_pop(L, 1);
    }
    // Remove what reaches the file system or loads bytecode.
    static const char* const removed_globals[] = {"dofile", "loadfile", NULL};
    for (const char* const* g = removed_globals; *g; g++) {
        lua_pushnil(L);
        lua_setglobal(L, *g);
    }
    lua_getglobal(L, "string");
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    lua_pop(L, 1);
    lua_getglobal(L, "load");
    lua_pushcclosure(L, sandbox_load, 1);
    lua_setglobal(L, "load");
    lua_pushcfunction(L, sandbox_print);
    lua_setglobal(L, "print");
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, "servelab.loaded");
    lua_pushcfunction(L, sandbox_require);
    lua_setglobal(L, "require");

    // io: open and lines, restricted; no popen, no stdin/stdout handles.
    open_hidden(L, LUA_IOLIBNAME, luaopen_io);
    lua_newtable(L);
    lua_getfield(L, -2, "open");
    lua_pushcclosure(L, sandbox_io_open, 1);
    lua_setfield(L, -2, "open");
    lua_getfield(L, -2, "lines");
    lua_pushcclosure(L, sandbox_io_lines, 1);
    lua_setfield(L, -2, "lines");
    forbid_missing(L, "io", "io.open and io.lines inside the lesson's folder, writes inside the output folder");
    lua_setglobal(L, "io");
    lua_pop(L, 1);

    // os: the clock and the date only.
    open_hidden(L, LUA_OSLIBNAME, luaopen_os);
    lua_newtable(L);
    static const char* const os_kept[] = {"time", "clock", "date", "difftime", NULL};
    for (const char* const* f = os_kept; *f; f++) {
        lua_getfield(L, -2, *f);
        lua_setfield(L, -2, *f);
    }
    forbid_missing(L, "os", "os.time, os.clock, os.date and os.difftime");
    lua_setglobal(L, "os");
    lua_newtable(L); // no package library: require() is the lesson's own
    forbid_missing(L, "package", "require of .lua files from the lesson's folder");
    lua_setglobal(L, "package");
    lua_pop(L, 1);
    // Forget the hidden libraries' registry entries, so nothing reaches them.
    lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    lua_pushnil(L);
    lua_setfield(L, -2, LUA_IOLIBNAME);
    lua_pushnil(L);
    lua_setfield(L, -2, LUA_OSLIBNAME);
    lua_pop(L, 1);
}

// ---- narration and checks -----------------------------------------------------------------

void lesson_say(lesson* l, const char* text) {
    if (l->options.on_say && !l->info_only) l->options.on_say(l->options.user, text);
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
    if (l->options.on_check) l->options.on_check(l->options.user, result);
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
static int lab_check(lua_State* L) {
    static const char* const fields[] = {"id", "claim", "bank_answer", "verdict", "evidence", "measure", NULL};
    lab_check_fields(L, 1, fields);
    lesson* l = lesson_of(L);
    const char* id = lab_opt_string_field(L, 1, "id", NULL);
    if (!id) lab_field_error(L, 1, "id", "expected the claim id as a string (\"tf1\", \"se3\", ...)");
    if (!valid_claim_id(id)) lab_field_error(L, 1, "id", "'%s' is not a claim id (lowercase letters, digits, '-', '_'; at most 15)", id);
    const char* claim = lab_opt_string_field(L, 1, "claim", NULL);
    if (!claim) lab_field_error(L, 1, "claim", "expected the claim in words");
    if (lua_getfield(L, 1, "bank_answer") != LUA_TBOOLEAN)
        lab_field_error(L, 1, "bank_answer", "expected true or false (what the question bank says), got %s",
                        luaL_typename(L, -1));
    bool bank_answer = lua_toboolean(L, -1);
    lua_pop(L, 1);

    lesson_check_result result = {id, claim, bank_answer, false, "", CHECK_FAIL};
    char problem[600] = "";
    lab_declared_claim* declared = find_declared(l, id);
    if (l->declaration_seen && !declared)
        snprintf(problem, sizeof problem, "claim '%s' is not declared in lab.lesson{claims = {...}}", id);
    else if (declared && declared->checked)
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
    snprintf(l->title, sizeof l->title, "%s", title);
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
    install_sandbox(L);
    luaL_requiref(L, "lab", open_lab, 1);
    lua_pop(L, 1);
    if (luaL_loadfilex(L, l->path, "t") != LUA_OK) return lua_error(L);
    return 1;
}

// ---- the host API -------------------------------------------------------------------------

static void set_failure(lesson* l, const char* message) {
    copy_text(l->error, sizeof l->error, message);
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

lesson_status lesson_resume(lesson* l) {
    if (l->status != LESSON_PAUSED) return l->status;
    if (!l->started) {
        l->started = true;
        l->cpu_start_s = lesson_cpu_seconds();
    }
    int n_results = 0;
    int status = lua_resume(l->thread, l->L, 0, &n_results);
    if (status == LUA_YIELD) {
        lua_pop(l->thread, n_results);
        return LESSON_PAUSED;
    }
    if (status == LUA_OK) {
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
        lesson_check_result result = {l->declared[i].id, "(declared in lab.lesson)", false, false, evidence, CHECK_FAIL};
        report_check(l, &result);
    }
}

void lesson_close(lesson* l) {
    if (!l) return;
    if (l->L) lua_close(l->L); // runs every __gc: engines and models are freed
    lab_free_objects(l);
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
