// quiz_data: reads the quiz's data files (quiz/*.lua) into C structs.
//
// The files are Lua table constructors (`return { ... }`), evaluated in an
// empty environment: no library function is reachable, so a data file can
// describe values but cannot do anything. An instruction hook stops a file
// that loops instead of returning, and a 64 MiB cap one that grows. Accessors name the file, the entry and
// the field in their error messages ("quiz/bank.lua: item 3 (tf3): field
// 'answer': expected a boolean").
#ifndef SERVELAB_QUIZ_DATA_H
#define SERVELAB_QUIZ_DATA_H

#include <stdbool.h>

#include "base/error.h"

typedef struct lua_State lua_State;

// What a data file's Lua state has allocated, against its cap.
typedef struct quiz_data_memory {
    size_t used_bytes;
    size_t limit_bytes;
    bool limit_reached;
} quiz_data_memory;

typedef struct quiz_data_file {
    lua_State* L;
    quiz_data_memory* memory; // the allocator's count (heap: f may be copied)
    char path[512];
    char where[96]; // the entry being read, for messages: "item 3 (tf3)"
} quiz_data_file;

// Loads and runs `path`; the returned table becomes the current list.
// 0, or -1 with err (missing file, syntax error, not a table).
int quiz_data_open(quiz_data_file* f, const char* path, error_info* err);
void quiz_data_close(quiz_data_file* f);

// Entries of the returned list: the count, and entering / leaving entry
// `index` (1-based). Field readers below read from the entered entry (or
// from a sub-table entered with quiz_data_enter_table).
int quiz_data_count(quiz_data_file* f);
int quiz_data_enter_entry(quiz_data_file* f, int index, error_info* err);
// Enters the sub-table `field` of the current table: 1 when entered, 0 when
// the field is absent (nil), -1 with err when it is something else.
int quiz_data_enter_table(quiz_data_file* f, const char* field, error_info* err);
void quiz_data_leave(quiz_data_file* f);

// Readers. `required` false: an absent field leaves *out as it was and
// returns 0. Strings are malloc'ed copies (caller frees).
int quiz_data_string(quiz_data_file* f, const char* field, bool required, char** out, error_info* err);
int quiz_data_int(quiz_data_file* f, const char* field, bool required, long min_value, long max_value, int* out,
                  error_info* err);
int quiz_data_bool(quiz_data_file* f, const char* field, bool required, bool* out, error_info* err);
// The Lua type name of `field` in the current table ("nil", "string", ...).
const char* quiz_data_type(quiz_data_file* f, const char* field);
// The strings of the list field `field`: *n set, out[k] malloc'ed (at most capacity).
int quiz_data_string_list(quiz_data_file* f, const char* field, char** out, int capacity, int* n, error_info* err);

// Finds the quiz/ folder: $SERVELAB_QUIZ_DIR, ./quiz, then beside the
// binary (<bin>/../quiz, <bin>/../../../quiz for build/<kind>/bin, and
// <bin>/../share/servelab/quiz after `make install`). The folder must hold
// bank.lua and models.lua. 0, or -1 with err listing where it looked.
int quiz_find_dir(char* out, int capacity, error_info* err);

#endif
