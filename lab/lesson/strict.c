// lesson strict: the tables the lab hands a lesson (step records, pools,
// sequences, totals, ...) read strictly. A name the table does not have is
// an error that names it and the closest name it does have, instead of a
// nil that surfaces lines later as "attempt to perform arithmetic on a nil
// value" (a lesson written from the guide read the step record's
// `tail_waste` after it became `tail_waste_slots`). A name the API used to
// have keeps working, with one warning per lesson.
//
// A strict table is a plain Lua table whose metatable's __index raises.
// The host never reads through it: every host read is raw (lab_get_field,
// lua_rawget), so no lesson code and no error can run in the middle of a
// host function. The metatable hides behind __metatable, so the sandbox's
// setmetatable and getmetatable cannot swap or reach it (the sandbox has no
// debug library, and rawget/rawset only ever see the lesson's own copy).
#include <stdio.h>
#include <string.h>

#include "lab/lesson/api.h"

// Fields that a table of this kind may lack (read as nil, not an error):
// each is set only when it means something.
typedef struct optional_field {
    const char* kind;
    const char* name;
} optional_field;

static const optional_field OPTIONAL_FIELDS[] = {
    {"step record", "device_ns"},     // the CUDA backend's own time, only when it ran there
    {"sequence", "ttft"},             // once its first token is sampled
    {"sequence", "tpot"},             // once finished with 2+ generated tokens
    {"sequence", "latency"},          // once finished
    {"sequence", "tail_waste_slots"}, // paged engines only
    {"e:pool()", "blocks_total"},     // paged engines only, as the rest of this kind
    {"e:pool()", "blocks_free"},
    {"e:pool()", "blocks_evictable"},
    {"e:pool()", "blocks_cached"},
    {"e:pool()", "copies"},
    {"e:pool()", "evictions"},
    {"e:pool()", "ref_counts"},
    {"e:pool()", "filled"},
    {"lab.quantize()", "packed_bytes"},             // 4 and 8 bits only
    {"lab.quantize()", "output_mse"},               // with calibration inputs
    {"lab.quantize()", "alpha"},                    // AWQ only
    {"lab.quantize()", "channel_scales"},           // AWQ only
    {"lab.quantize_model().layers[]", "awq_alpha"}, // AWQ only
};

// Renames since the first lesson API (lessons/README.md's changelog). The
// old name reads the new field times `scale` (the step record's `seconds`
// became `wall_ns`, in nanoseconds).
typedef struct renamed_field {
    const char* kind;
    const char* old_name;
    const char* new_name;
    double scale;
    int api_version; // the version that renamed it
} renamed_field;

static const renamed_field RENAMED_FIELDS[] = {
    {"step record", "tail_waste", "tail_waste_slots", 1, 2},
    {"step record", "reserved_unused", "reserved_unused_slots", 1, 2},
    {"step record", "external_fragmentation", "external_fragmentation_slots", 1, 2},
    {"step record", "clock", "clock_s", 1, 2},
    {"step record", "seconds", "wall_ns", 1e-9, 2},
    {"step record.tp", "allreduce_seconds", "allreduce_s", 1, 2},
    {"sequence", "tail_waste", "tail_waste_slots", 1, 2},
};

#define N_OPTIONAL (sizeof OPTIONAL_FIELDS / sizeof OPTIONAL_FIELDS[0])
#define N_RENAMED (sizeof RENAMED_FIELDS / sizeof RENAMED_FIELDS[0])

// Keys longer than this get no suggestion (and are cut in the message):
// the longest field name is 28 bytes, and a megabyte-long key must not
// cost a megabyte-squared distance.
enum { MAX_COMPARED_NAME = 64 };

// Optimal string alignment distance (edits: insert, delete, substitute,
// swap two neighbours).
static int edit_distance(const char* a, const char* b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > MAX_COMPARED_NAME || m > MAX_COMPARED_NAME) return 1000;
    int d[MAX_COMPARED_NAME + 1][MAX_COMPARED_NAME + 1];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        for (size_t j = 1; j <= m; j++) {
            int cost = a[i - 1] != b[j - 1];
            int best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < best) best = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[n][m];
}

// The edit distance, except that a key of 3+ characters that starts a
// longer name counts 1: `tail_wast` is one edit from `tail_waste` but six
// from `tail_waste_slots`, which it means.
static int name_distance(const char* key, const char* name, int edits) {
    size_t n = strlen(key);
    if (n >= 3 && n < strlen(name) && strncmp(key, name, n) == 0 && edits > 1) return 1;
    return edits;
}

// Close enough to say "did you mean": up to a third of the name's length,
// at least 2 (`blok_size` and `kvread` are typos; `foo` for `step` is not).
static bool close_enough(const char* key, int distance) {
    int allowed = (int)strlen(key) / 3;
    return distance <= (allowed > 2 ? allowed : 2);
}

const char* lab_closest_name(const char* key, const char* const* names, int n_names, int* distance_out) {
    const char* best = NULL;
    int best_distance = 1 << 30, best_edits = 1 << 30;
    for (int i = 0; i < n_names; i++) {
        int edits = edit_distance(key, names[i]);
        int distance = name_distance(key, names[i], edits);
        // Ties go to fewer plain edits (`scale` means `scales` before
        // `scale_mean`), then to the alphabetically first name, so the
        // message is the same whatever order a table's keys come in.
        bool better =
            distance < best_distance ||
            (distance == best_distance && (edits < best_edits || (edits == best_edits && strcmp(names[i], best) < 0)));
        if (better) {
            best = names[i];
            best_distance = distance;
            best_edits = edits;
        }
    }
    if (distance_out) *distance_out = best_distance;
    return best;
}

bool lab_name_is_close(const char* key, int distance) { return close_enough(key, distance); }

static bool same_kind(const char* a, const char* b) { return strcmp(a, b) == 0; }

static bool is_optional(const char* kind, const char* key) {
    for (size_t i = 0; i < N_OPTIONAL; i++)
        if (same_kind(OPTIONAL_FIELDS[i].kind, kind) && strcmp(OPTIONAL_FIELDS[i].name, key) == 0) return true;
    return false;
}

static const renamed_field* find_rename(const char* kind, const char* key) {
    for (size_t i = 0; i < N_RENAMED; i++)
        if (same_kind(RENAMED_FIELDS[i].kind, kind) && strcmp(RENAMED_FIELDS[i].old_name, key) == 0)
            return &RENAMED_FIELDS[i];
    return NULL;
}

void lab_warn_once(lua_State* L, const char* key, const char* message) {
    lua_getfield(L, LUA_REGISTRYINDEX, "servelab.warned");
    if (lua_type(L, -1) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, "servelab.warned");
    }
    bool warned = lua_getfield(L, -1, key) != LUA_TNIL; // a plain table of the host's: no metamethods
    lua_pop(L, 1);
    if (warned) {
        lua_pop(L, 1);
        return;
    }
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, key);
    lua_pop(L, 1);
    luaL_where(L, 1); // the lesson's line
    lua_pushfstring(L, "%swarning: %s", lua_tostring(L, -1), message);
    lesson_warn(lesson_of(L), lua_tostring(L, -1));
    lua_pop(L, 2);
}

// One warning per old name and lesson.
static void warn_renamed_once(lua_State* L, const char* kind, const renamed_field* r) {
    char key[128], message[400];
    snprintf(key, sizeof key, "rename %s.%s", kind, r->old_name);
    snprintf(message, sizeof message,
             "%s field '%s' was renamed '%s' in lab API %d (this is API %d); the old name still works%s, but read "
             "'%s' (lessons/README.md, \"Changelog\")",
             kind, r->old_name, r->new_name, r->api_version, LAB_API_VERSION,
             r->scale != 1 ? " (converted to its old unit)" : "", r->new_name);
    lab_warn_once(L, key, message);
}

// Every name a strict table of this kind can be read by: its own keys, the
// optional ones, and the old names (which stand for their new names).
// Pushes nothing; fills names[] with strings kept alive by the table or
// by the static lists.
static int known_names(lua_State* L, int table, const char* kind, const char** names, const char** meaning,
                       int capacity) {
    int n = 0;
    int room = capacity - 32; // room kept for the optional and old names
    lua_pushnil(L);
    while (lua_next(L, table) != 0) {
        lua_pop(L, 1);
        if (lua_type(L, -1) == LUA_TSTRING) {
            names[n] = lua_tostring(L, -1); // the key is held by the table
            meaning[n] = names[n];
            n++;
        }
        if (n == room) { // a table a lesson filled with thousands of keys: suggest from the first 64 it yields
            lua_pop(L, 1);
            break;
        }
    }
    for (size_t i = 0; i < N_OPTIONAL && n < capacity; i++)
        if (same_kind(OPTIONAL_FIELDS[i].kind, kind)) {
            names[n] = meaning[n] = OPTIONAL_FIELDS[i].name;
            n++;
        }
    for (size_t i = 0; i < N_RENAMED && n < capacity; i++)
        if (same_kind(RENAMED_FIELDS[i].kind, kind)) {
            names[n] = RENAMED_FIELDS[i].old_name;
            meaning[n] = RENAMED_FIELDS[i].new_name;
            n++;
        }
    return n;
}

// __index(t, key) of a strict table; upvalue 1 is its kind ("step record").
static int strict_index(lua_State* L) {
    if (lua_type(L, 2) != LUA_TSTRING) { // t[i] past an array's end: nil, so ipairs and # work
        lua_pushnil(L);
        return 1;
    }
    const char* kind = lua_tostring(L, lua_upvalueindex(1));
    const char* key = lua_tostring(L, 2);
    if (is_optional(kind, key)) {
        lua_pushnil(L);
        return 1;
    }
    const renamed_field* renamed = find_rename(kind, key);
    if (renamed) {
        warn_renamed_once(L, kind, renamed);
        lua_pushstring(L, renamed->new_name);
        int type = lua_rawget(L, 1);
        if (type == LUA_TNUMBER && renamed->scale != 1) {
            double value = lua_tonumber(L, -1) * renamed->scale;
            lua_pop(L, 1);
            lua_pushnumber(L, value);
        }
        return 1;
    }
    enum { MAX_NAMES = 96 };
    const char* names[MAX_NAMES];
    const char* meaning[MAX_NAMES];
    int n = known_names(L, 1, kind, names, meaning, MAX_NAMES);
    char shown_key[MAX_COMPARED_NAME + 8];
    snprintf(shown_key, sizeof shown_key, "%.*s%s", MAX_COMPARED_NAME, key,
             strlen(key) > MAX_COMPARED_NAME ? "..." : "");
    bool is_array = lua_rawlen(L, 1) > 0 || n == 0;
    if (is_array)
        return luaL_error(L, "%s is an array: it has no field '%s' (index it 1..#t; # gives its length)", kind,
                          shown_key);
    int distance = 0;
    const char* closest = lab_closest_name(key, names, n, &distance);
    const char* meant = closest;
    for (int i = 0; i < n; i++)
        if (names[i] == closest) meant = meaning[i];
    if (close_enough(key, distance))
        return luaL_error(L, "%s has no field '%s' (did you mean '%s'?)", kind, shown_key, meant);
    // Nothing close: the closest, and every current name, sorted (old names left out).
    int n_current = 0;
    for (int i = 0; i < n; i++)
        if (names[i] == meaning[i]) names[n_current++] = names[i];
    n = n_current;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            const char* swap = names[j];
            names[j] = names[j - 1];
            names[j - 1] = swap;
        }
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 0; i < n; i++) {
        if (i) luaL_addstring(&b, ", ");
        luaL_addstring(&b, names[i]);
    }
    luaL_pushresult(&b);
    return luaL_error(L, "%s has no field '%s' (the closest name is '%s'; it has: %s)", kind, shown_key, meant,
                      lua_tostring(L, -1));
}

// Pushes the metatable of this kind, made once per lesson and kept in the registry.
static void push_strict_metatable(lua_State* L, const char* kind) {
    lua_getfield(L, LUA_REGISTRYINDEX, "servelab.strict");
    if (lua_type(L, -1) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, "servelab.strict");
    }
    if (lua_getfield(L, -1, kind) == LUA_TTABLE) {
        lua_remove(L, -2);
        return;
    }
    lua_pop(L, 1);
    lua_createtable(L, 0, 4);
    lua_pushstring(L, kind);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "__kind");
    lua_pushcclosure(L, strict_index, 1);
    lua_setfield(L, -2, "__index");
    lua_newtable(L); // the metatables of its nested tables, by field ("[]" for an array's elements)
    lua_setfield(L, -2, "__nested");
    // getmetatable(t) returns this string and setmetatable(t, ...) raises
    // "cannot change a protected metatable"; so the lesson never reaches
    // __nested either.
    lua_pushliteral(L, "a lab table (read-only layout: see lessons/README.md)");
    lua_setfield(L, -2, "__metatable");
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, kind);
    lua_remove(L, -2);
}

// Pushes the metatable for field `key` of a table whose metatable is at
// `parent` (kind "KIND.key", or "KIND[]" for key "[]"), remembered there:
// a record of 64 running sequences has ~200 nested tables, and naming each
// one's kind again made e:record() 82 us instead of 74 (49 us with no
// strict tables: the walk itself is the rest).
static void push_nested_metatable(lua_State* L, int parent, const char* key) {
    lua_getfield(L, parent, "__nested");
    if (lua_getfield(L, -1, key) == LUA_TTABLE) {
        lua_remove(L, -2);
        return;
    }
    lua_pop(L, 1);
    lua_getfield(L, parent, "__kind");
    if (strcmp(key, "[]") == 0)
        lua_pushfstring(L, "%s[]", lua_tostring(L, -1));
    else
        lua_pushfstring(L, "%s.%s", lua_tostring(L, -1), key);
    push_strict_metatable(L, lua_tostring(L, -1));
    lua_replace(L, -3); // over the kind
    lua_pop(L, 1);      // the kind's name
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, key);
    lua_remove(L, -2); // __nested
}

// Gives the table at `index` the metatable at `metatable`, and its nested
// tables theirs; a table that already has one keeps it.
static void make_strict_with(lua_State* L, int index, int metatable) {
    if (lua_getmetatable(L, index)) { // already strict (an element made strict under its own kind)
        lua_pop(L, 1);
        return;
    }
    luaL_checkstack(L, 8, "strict tables nested too deep");
    size_t length = lua_rawlen(L, index);
    if (length > 0) {
        // An array: its elements share one kind ("step record.sequences[]").
        // Arrays of numbers (a tensor's million values) are not walked.
        if (lua_rawgeti(L, index, 1) == LUA_TTABLE) {
            lua_pop(L, 1);
            push_nested_metatable(L, metatable, "[]");
            int element_metatable = lua_gettop(L);
            for (size_t i = 1; i <= length; i++) {
                if (lua_rawgeti(L, index, (lua_Integer)i) == LUA_TTABLE)
                    make_strict_with(L, lua_gettop(L), element_metatable);
                lua_pop(L, 1);
            }
            lua_pop(L, 1);
        } else {
            lua_pop(L, 1);
        }
    } else {
        lua_pushnil(L);
        while (lua_next(L, index) != 0) {
            if (lua_type(L, -1) == LUA_TTABLE && lua_type(L, -2) == LUA_TSTRING) {
                push_nested_metatable(L, metatable, lua_tostring(L, -2));
                make_strict_with(L, lua_gettop(L) - 1, lua_gettop(L));
                lua_pop(L, 1);
            }
            lua_pop(L, 1);
        }
    }
    lua_pushvalue(L, metatable);
    lua_setmetatable(L, index);
}

void lab_make_strict(lua_State* L, int index, const char* kind) {
    index = lua_absindex(L, index);
    if (lua_type(L, index) != LUA_TTABLE) return;
    push_strict_metatable(L, kind);
    make_strict_with(L, index, lua_gettop(L));
    lua_pop(L, 1);
}
