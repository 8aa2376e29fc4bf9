#include "lab/quiz/data.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// A data file is a table constructor: a few thousand instructions at most.
// Ten million means the file is not data (an endless loop, say).
#define DATA_INSTRUCTION_LIMIT 10000000

// The most memory a data file's Lua state may take. bank.lua (42 KB of
// text, 60 items) takes about 0.5 MiB; without a cap, a file doubling one
// string 31 times took 2.7 GB before the instruction limit could notice.
#define DATA_MEMORY_LIMIT_BYTES (64u << 20)

// The state's allocator: lua_Alloc with a count against the cap (the
// lesson host's lesson_alloc does the same, and also links every block so
// an abandoned state can be freed; a data file's state is always closed).
static void* capped_alloc(void* user, void* block, size_t old_size, size_t new_size) {
    quiz_data_memory* memory = user;
    if (!block) old_size = 0; // old_size then encodes the object's type
    if (new_size == 0) {
        free(block);
        memory->used_bytes -= old_size;
        return NULL;
    }
    if (new_size > old_size && memory->used_bytes + (new_size - old_size) > memory->limit_bytes) {
        memory->limit_reached = true;
        return NULL; // Lua raises a memory error
    }
    void* grown = realloc(block, new_size);
    if (grown) memory->used_bytes = memory->used_bytes - old_size + new_size;
    return grown;
}

static void stop_runaway(lua_State* L, lua_Debug* ar) {
    (void)ar;
    luaL_error(L, "the data file ran for more than %d instructions (a loop instead of a table?)",
               DATA_INSTRUCTION_LIMIT);
}

int quiz_data_open(quiz_data_file* f, const char* path, error_info* err) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    f->memory = calloc(1, sizeof *f->memory); // the allocator's user data: fixed while f may move
    if (!f->memory) return error_set(err, "%s: out of memory", path);
    f->memory->limit_bytes = DATA_MEMORY_LIMIT_BYTES;
    f->L = lua_newstate(capped_alloc, f->memory);
    if (!f->L) {
        quiz_data_close(f);
        return error_set(err, "%s: out of memory", path);
    }
    lua_State* L = f->L;
    // Text only (no precompiled chunks), and an empty table as _ENV: the
    // chunk sees no globals at all.
    int status = luaL_loadfilex(L, path, "t");
    if (status != LUA_OK) {
        error_set(err, "%s", lua_tostring(L, -1));
        quiz_data_close(f);
        return -1;
    }
    lua_newtable(L);
    lua_setupvalue(L, -2, 1);
    lua_sethook(L, stop_runaway, LUA_MASKCOUNT, DATA_INSTRUCTION_LIMIT);
    status = lua_pcall(L, 0, 1, 0);
    lua_sethook(L, NULL, 0, 0);
    if (status != LUA_OK) {
        if (f->memory->limit_reached)
            error_set(err, "%s: the data file took more than its memory limit of %u MiB (%s)", path,
                      DATA_MEMORY_LIMIT_BYTES >> 20, lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "");
        else
            error_set(err, "%s: %s", path, lua_tostring(L, -1));
        quiz_data_close(f);
        return -1;
    }
    if (!lua_istable(L, -1)) {
        error_set(err, "%s: expected the file to return a table, found a %s", path, luaL_typename(L, -1));
        quiz_data_close(f);
        return -1;
    }
    return 0;
}

void quiz_data_close(quiz_data_file* f) {
    if (f->L) lua_close(f->L);
    f->L = NULL;
    free(f->memory);
    f->memory = NULL;
}

int quiz_data_count(quiz_data_file* f) { return (int)luaL_len(f->L, -1); }

int quiz_data_enter_entry(quiz_data_file* f, int index, error_info* err) {
    snprintf(f->where, sizeof f->where, "entry %d", index);
    if (lua_geti(f->L, -1, index) != LUA_TTABLE) {
        const char* type = luaL_typename(f->L, -1);
        lua_pop(f->L, 1);
        return error_set(err, "%s: entry %d: expected a table, found a %s", f->path, index, type);
    }
    return 0;
}

int quiz_data_enter_table(quiz_data_file* f, const char* field, error_info* err) {
    int type = lua_getfield(f->L, -1, field);
    if (type == LUA_TTABLE) return 1;
    lua_pop(f->L, 1);
    if (type == LUA_TNIL) return 0;
    return error_set(err, "%s: %s: field '%s': expected a table, found a %s", f->path, f->where, field,
                     lua_typename(f->L, type));
}

void quiz_data_leave(quiz_data_file* f) { lua_pop(f->L, 1); }

const char* quiz_data_type(quiz_data_file* f, const char* field) {
    int type = lua_getfield(f->L, -1, field);
    lua_pop(f->L, 1);
    return lua_typename(f->L, type);
}

// Pushes `field`; returns 1 when it is present, 0 when absent and not
// required (nothing pushed), -1 with err when absent and required.
static int push_field(quiz_data_file* f, const char* field, bool required, error_info* err) {
    if (lua_getfield(f->L, -1, field) != LUA_TNIL) return 1;
    lua_pop(f->L, 1);
    if (!required) return 0;
    return error_set(err, "%s: %s: field '%s' is missing", f->path, f->where, field);
}

static int wrong_type(quiz_data_file* f, const char* field, const char* expected, error_info* err) {
    const char* found = luaL_typename(f->L, -1);
    error_set(err, "%s: %s: field '%s': expected %s, found a %s", f->path, f->where, field, expected, found);
    lua_pop(f->L, 1);
    return -1;
}

int quiz_data_string(quiz_data_file* f, const char* field, bool required, char** out, error_info* err) {
    int present = push_field(f, field, required, err);
    if (present <= 0) return present;
    if (lua_type(f->L, -1) != LUA_TSTRING) return wrong_type(f, field, "a string", err);
    const char* text = lua_tostring(f->L, -1);
    if (text[0] == '\0') {
        lua_pop(f->L, 1);
        return error_set(err, "%s: %s: field '%s' is empty", f->path, f->where, field);
    }
    free(*out);
    *out = strdup(text);
    lua_pop(f->L, 1);
    return *out ? 0 : error_set(err, "%s: out of memory", f->path);
}

int quiz_data_int(quiz_data_file* f, const char* field, bool required, long min_value, long max_value, int* out,
                  error_info* err) {
    int present = push_field(f, field, required, err);
    if (present <= 0) return present;
    if (!lua_isinteger(f->L, -1)) return wrong_type(f, field, "a whole number", err);
    lua_Integer value = lua_tointeger(f->L, -1);
    lua_pop(f->L, 1);
    if (value < min_value || value > max_value)
        return error_set(err, "%s: %s: field '%s': expected %ld to %ld, found %lld", f->path, f->where, field,
                         min_value, max_value, (long long)value);
    *out = (int)value;
    return 0;
}

int quiz_data_bool(quiz_data_file* f, const char* field, bool required, bool* out, error_info* err) {
    int present = push_field(f, field, required, err);
    if (present <= 0) return present;
    if (!lua_isboolean(f->L, -1)) return wrong_type(f, field, "true or false", err);
    *out = lua_toboolean(f->L, -1);
    lua_pop(f->L, 1);
    return 0;
}

int quiz_data_string_list(quiz_data_file* f, const char* field, char** out, int capacity, int* n, error_info* err) {
    *n = 0;
    int present = push_field(f, field, true, err);
    if (present <= 0) return -1;
    if (!lua_istable(f->L, -1)) return wrong_type(f, field, "a list of strings", err);
    int length = (int)luaL_len(f->L, -1);
    if (length < 1 || length > capacity) {
        lua_pop(f->L, 1);
        return error_set(err, "%s: %s: field '%s': expected 1 to %d entries, found %d", f->path, f->where, field,
                         capacity, length);
    }
    for (int k = 1; k <= length; k++) {
        if (lua_geti(f->L, -1, k) != LUA_TSTRING) {
            const char* type = luaL_typename(f->L, -1);
            lua_pop(f->L, 2);
            return error_set(err, "%s: %s: field '%s' entry %d: expected a string, found a %s", f->path, f->where,
                             field, k, type);
        }
        out[k - 1] = strdup(lua_tostring(f->L, -1));
        lua_pop(f->L, 1);
        if (!out[k - 1]) {
            lua_pop(f->L, 1);
            return error_set(err, "%s: out of memory", f->path);
        }
        *n = k;
    }
    lua_pop(f->L, 1);
    return 0;
}

// ---- where the data lives --------------------------------------------------------------

static bool quiz_dir_complete(const char* dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/bank.lua", dir);
    if (access(path, R_OK) != 0) return false;
    snprintf(path, sizeof path, "%s/models.lua", dir);
    return access(path, R_OK) == 0;
}

int quiz_find_dir(char* out, int capacity, error_info* err) {
    const char* from_env = getenv("SERVELAB_QUIZ_DIR");
    if (from_env && from_env[0]) {
        if (!quiz_dir_complete(from_env))
            return error_set(err, "SERVELAB_QUIZ_DIR=%s: expected a folder with bank.lua and models.lua", from_env);
        snprintf(out, (size_t)capacity, "%s", from_env);
        return 0;
    }
    char exe[512];
    ssize_t length = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[length > 0 ? length : 0] = '\0';
    char* slash = strrchr(exe, '/');
    if (slash) *slash = '\0'; // the binary's folder
    char candidates[4][1024];
    snprintf(candidates[0], sizeof candidates[0], "quiz");
    snprintf(candidates[1], sizeof candidates[1], "%s/../quiz", exe);
    snprintf(candidates[2], sizeof candidates[2], "%s/../../../quiz", exe);
    snprintf(candidates[3], sizeof candidates[3], "%s/../share/servelab/quiz", exe);
    for (int i = 0; i < 4; i++)
        if (length > 0 || i == 0)
            if (quiz_dir_complete(candidates[i])) {
                snprintf(out, (size_t)capacity, "%s", candidates[i]);
                return 0;
            }
    return error_set(err,
                     "cannot find the quiz data (bank.lua, models.lua): looked in ./quiz, %s/../quiz and "
                     "%s/../share/servelab/quiz; set SERVELAB_QUIZ_DIR or use --quiz-dir",
                     exe, exe);
}
