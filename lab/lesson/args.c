// lesson args: reading the lab functions' named arguments, and pushing
// results, with errors that name the argument and the field.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lab/lesson/api.h"

int lab_error(lua_State* L, const char* format, ...) {
    char message[600];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    return luaL_error(L, "%s", message);
}

int lab_field_error(lua_State* L, int arg, const char* field, const char* format, ...) {
    char message[400];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    if (field) return luaL_argerror(L, arg, lua_pushfstring(L, "field '%s': %s", field, message));
    return luaL_argerror(L, arg, message);
}

// The keys of the table at `index` must all be in `allowed`; an unknown one
// names the closest allowed name. `prefix` ("device.") is put before a
// field's name when the table sits inside argument `arg`.
static void check_table_fields(lua_State* L, int index, int arg, const char* prefix, const char* const* allowed) {
    index = lua_absindex(L, index);
    lua_pushnil(L);
    while (lua_next(L, index) != 0) {
        lua_pop(L, 1); // the value; keep the key for lua_next
        if (lua_type(L, -1) != LUA_TSTRING) {
            luaL_argerror(L, arg, lua_pushfstring(L, "unexpected key of type %s%s (fields have names)",
                                                   luaL_typename(L, -1), prefix[0] ? " in a table field" : ""));
        }
        const char* key = lua_tostring(L, -1);
        bool known = false;
        int n_allowed = 0;
        for (const char* const* a = allowed; *a; a++, n_allowed++) known = known || strcmp(*a, key) == 0;
        if (!known) {
            luaL_Buffer b;
            luaL_buffinit(L, &b);
            for (const char* const* a = allowed; *a; a++) {
                if (a != allowed) luaL_addstring(&b, ", ");
                luaL_addstring(&b, *a);
            }
            luaL_pushresult(&b);
            int distance = 0;
            const char* closest = lab_closest_name(key, allowed, n_allowed, &distance);
            char field[96];
            snprintf(field, sizeof field, "%s%.64s", prefix, key);
            if (closest && lab_name_is_close(key, distance))
                lab_field_error(L, arg, field, "unknown field (did you mean '%s'? expected one of: %s)", closest,
                                lua_tostring(L, -1));
            lab_field_error(L, arg, field, "unknown field (the closest is '%s'; expected one of: %s)",
                            closest ? closest : "", lua_tostring(L, -1));
        }
    }
}

void lab_check_fields(lua_State* L, int arg, const char* const* allowed) {
    luaL_checktype(L, arg, LUA_TTABLE);
    check_table_fields(L, arg, arg, "", allowed);
}

void lab_check_nested_fields(lua_State* L, int index, int arg, const char* prefix, const char* const* allowed) {
    check_table_fields(L, index, arg, prefix, allowed);
}

// Raw: an __index proxy could hand back a value nothing else references
// (the next collection frees a string the host still reads), or run the
// lesson's code while the host holds an engine's pointer (it could close
// the engine); named arguments are plain tables.
int lab_get_field(lua_State* L, int arg, const char* field) {
    luaL_checktype(L, arg, LUA_TTABLE);
    arg = lua_absindex(L, arg);
    lua_pushstring(L, field);
    return lua_rawget(L, arg);
}

static int get_field(lua_State* L, int arg, const char* field) { return lab_get_field(L, arg, field); }

lua_Integer lab_opt_integer_field(lua_State* L, int arg, const char* field, lua_Integer fallback, lua_Integer min,
                                  lua_Integer max) {
    int type = get_field(L, arg, field);
    lua_Integer value = fallback;
    if (type != LUA_TNIL) {
        int is_integer = 0;
        value = lua_tointegerx(L, -1, &is_integer);
        if (!is_integer)
            lab_field_error(L, arg, field, "expected an integer, got %s", type == LUA_TNUMBER ? "a fraction" : luaL_typename(L, -1));
        if (value < min || value > max)
            lab_field_error(L, arg, field, "expected %lld..%lld, got %lld", (long long)min, (long long)max, (long long)value);
    }
    lua_pop(L, 1);
    return value;
}

double lab_opt_number_field(lua_State* L, int arg, const char* field, double fallback, double min, double max) {
    int type = get_field(L, arg, field);
    double value = fallback;
    if (type != LUA_TNIL) {
        if (type != LUA_TNUMBER) lab_field_error(L, arg, field, "expected a number, got %s", luaL_typename(L, -1));
        value = lua_tonumber(L, -1);
        if (!(value >= min && value <= max)) lab_field_error(L, arg, field, "expected %g..%g, got %g", min, max, value);
    }
    lua_pop(L, 1);
    return value;
}

bool lab_opt_boolean_field(lua_State* L, int arg, const char* field, bool fallback) {
    int type = get_field(L, arg, field);
    bool value = fallback;
    if (type != LUA_TNIL) {
        if (type != LUA_TBOOLEAN) lab_field_error(L, arg, field, "expected true or false, got %s", luaL_typename(L, -1));
        value = lua_toboolean(L, -1);
    }
    lua_pop(L, 1);
    return value;
}

const char* lab_opt_string_field(lua_State* L, int arg, const char* field, const char* fallback) {
    int type = get_field(L, arg, field);
    const char* value = fallback;
    if (type != LUA_TNIL) {
        if (type != LUA_TSTRING) lab_field_error(L, arg, field, "expected a string, got %s", luaL_typename(L, -1));
        value = lua_tostring(L, -1); // the string stays alive: it is referenced by the table
    }
    lua_pop(L, 1);
    return value;
}

int lab_opt_choice_field(lua_State* L, int arg, const char* field, const char* const* choices, int fallback) {
    const char* text = lab_opt_string_field(L, arg, field, NULL);
    if (!text) return fallback;
    for (int i = 0; choices[i]; i++)
        if (strcmp(choices[i], text) == 0) return i;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 0; choices[i]; i++) {
        if (i) luaL_addstring(&b, choices[i + 1] ? ", " : " or ");
        luaL_addstring(&b, choices[i]);
    }
    luaL_pushresult(&b);
    return lab_field_error(L, arg, field, "expected %s, got '%s'", lua_tostring(L, -1), text);
}

float* lab_read_number_array(lua_State* L, int index, int arg, const char* field, size_t* n) {
    index = lua_absindex(L, index);
    if (lua_type(L, index) != LUA_TTABLE)
        lab_field_error(L, arg, field, "expected an array of numbers, got %s", luaL_typename(L, index));
    size_t length = lua_rawlen(L, index); // raw, as every read of a lesson's table (lab_get_field)
    if (length == 0) lab_field_error(L, arg, field, "expected a non-empty array of numbers");
    if (length > ((size_t)1 << 26)) lab_field_error(L, arg, field, "array of %zu values is too long", length);
    // Counted against the cap through a Lua userdata, so that a failure
    // never leaks: the buffer is collected with the stack.
    float* values = lua_newuserdatauv(L, length * sizeof *values, 0);
    for (size_t i = 0; i < length; i++) {
        int type = lua_rawgeti(L, index, (lua_Integer)i + 1);
        if (type != LUA_TNUMBER)
            lab_field_error(L, arg, field, "element %zu: expected a number, got %s", i + 1, luaL_typename(L, -1));
        double value = lua_tonumber(L, -1);
        if (!isfinite(value)) lab_field_error(L, arg, field, "element %zu is not finite", i + 1);
        values[i] = (float)value;
        lua_pop(L, 1);
    }
    *n = length;
    return values; // stays on the stack (the caller's scratch)
}

void lab_set_number(lua_State* L, const char* name, double value) {
    lua_pushnumber(L, value);
    lua_setfield(L, -2, name);
}

void lab_set_integer(lua_State* L, const char* name, lua_Integer value) {
    lua_pushinteger(L, value);
    lua_setfield(L, -2, name);
}

void lab_set_string(lua_State* L, const char* name, const char* value) {
    lua_pushstring(L, value);
    lua_setfield(L, -2, name);
}

void lab_set_boolean(lua_State* L, const char* name, bool value) {
    lua_pushboolean(L, value);
    lua_setfield(L, -2, name);
}

void lab_push_float_array(lua_State* L, const float* values, size_t n) {
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushnumber(L, values[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

void lab_push_int32_array(lua_State* L, const int32_t* values, size_t n) {
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushinteger(L, values[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

// Each given field goes through the command line's own option parser. The
// parsed request may keep pointers to the texts (a model path, a tokenizer
// path), so every text stays on the Lua stack until the calling C function
// returns: read raw from the table (no __index proxy can hand back a string
// nothing else holds), and a number's text pushed as a Lua string rather
// than formatted into a local buffer (fuzzing found `tokenizer = 5` left
// the request pointing at a dead stack slot).
void lab_apply_flag_fields(lua_State* L, int arg, const lab_field_flag* fields, lab_flag_matcher match, void* target) {
    arg = lua_absindex(L, arg);
    for (const lab_field_flag* f = fields; f->field; f++) {
        lua_pushstring(L, f->field);
        int type = lua_rawget(L, arg);
        if (type == LUA_TNIL || (f->is_switch && type == LUA_TBOOLEAN && lua_toboolean(L, -1))) {
            lua_pop(L, 1);
            continue;
        }
        if (f->is_switch) {
            if (type != LUA_TBOOLEAN) lab_field_error(L, arg, f->field, "expected true or false, got %s", luaL_typename(L, -1));
        } else if (type == LUA_TNUMBER) {
            if (!lua_isinteger(L, -1)) lab_field_error(L, arg, f->field, "expected an integer, got %g", lua_tonumber(L, -1));
            lua_pushfstring(L, "%I", (LUAI_UACINT)lua_tointeger(L, -1));
            lua_remove(L, -2);
        } else if (type != LUA_TSTRING) {
            lab_field_error(L, arg, f->field, "expected a string or a number, got %s", luaL_typename(L, -1));
        }
        const char* text = lua_tostring(L, -1); // a switch's boolean gives NULL: the flag takes no value
        char* argv[3] = {(char*)"lab", (char*)f->flag, (char*)text};
        arg_cursor cursor = {f->is_switch ? 2 : 3, argv, 1, "lab", NULL};
        bool failed = false;
        error_info err = {{0}};
        if (!match(&cursor, target, &failed, &err) || failed)
            lab_field_error(L, arg, f->field, "%s", err.message[0] ? err.message : "not accepted here");
        luaL_checkstack(L, 2, "too many fields");
        // The text stays (see above).
    }
}

// The methods are listed as package `shown_as` in the registry's loaded
// table because that is where Lua looks for a function's name when it
// reports a bad argument (to 'engine.add', not to '?', when the method was
// called through pcall).
void lab_register_userdata_type(lua_State* L, const char* name, const char* shown_as, const luaL_Reg* methods,
                                   lua_CFunction gc, lua_CFunction tostring) {
    luaL_newmetatable(L, name);
    lua_newtable(L); // luaL_newlib needs the array itself, not a pointer to it
    luaL_setfuncs(L, methods, 0);
    lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    lua_pushvalue(L, -2);
    lua_setfield(L, -2, shown_as);
    lua_pop(L, 1);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, tostring);
    lua_setfield(L, -2, "__tostring");
    // Out of the lesson's reach: a replaced __gc would run the lesson's
    // code with hooks off, and skip freeing the engine or model.
    lua_pushstring(L, name);
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 1);
}
