// lesson internal: the lesson's state, shared by the host's own files
// (host.c, limits.c, watchdog.c, sandbox.c, checks.c). Not for hosts (they
// use lab/lesson/lesson.h) and not for the lab module's parts (api_*.c use
// lab/lesson/api.h, which this header includes).
#ifndef SERVELAB_LESSON_INTERNAL_H
#define SERVELAB_LESSON_INTERNAL_H

#include <lauxlib.h>
#include <lua.h>
#include <setjmp.h>
#include <signal.h>
#include <time.h>

#include "lab/lesson/api.h"

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
    // the watchdog (watchdog.c)
    timer_t watchdog_timer;
    bool watchdog_running;
    sigjmp_buf hard_stop_jump; // set by lesson_resume; the handler jumps here
    volatile sig_atomic_t hard_stop_reason;
    volatile sig_atomic_t hook_tightened; // the watchdog has set the hook to every instruction
    volatile double stop_seen_s; // monotonic time the stop flag was first seen, 0 before
    // files (sandbox.c)
    int lesson_fd;            // the lesson's folder, -1 until first read
    int output_fd;            // the output folder, -1 until first write
    FILE* open_files[LESSON_MAX_OPEN_FILES];
    int n_open_files;
    uint64_t written_bytes;   // what file:write was given, against options.write_limit_bytes
    int files_created;        // files io.open created, against options.write_limit_files
    lesson_status status;
    bool started;
    char error[1024];
    lab_api_state api;        // the lab module's models, engines and measurements
    // checks
    lab_declared_claim declared[64];
    int n_declared;
    bool declaration_seen;
    bool declaring;           // lab.lesson{} is running: a call from inside it is an error
    char title[160];
    bool info_only;           // lesson_read_info: stop at the declaration
    int passed;
    int failed;
    int undecided; // checks whose timing could not decide (CHECK_UNDECIDED)
    bool finished;
};

// Makes the hook run at the lesson's next instruction (it then raises the
// time limit or the stop). The watchdog calls it from its signal handler
// (lua_sethook may be called there) the moment the limit is spent, so a
// lesson of long host calls (12 lab.model("small") in a row, 0.5 s each)
// stops after the call in progress instead of 10000 instructions later.
void lesson_tighten_hook(lesson* l);

// ---- the sandbox (sandbox.c) ---------------------------------------------------------

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

// ---- the watchdog (watchdog.c) -------------------------------------------------------

// True when the hard stop can work here (liblua is a shared library whose
// code the watchdog can tell apart).
bool lesson_watchdog_available(void);
// Arms the periodic tick for the calling thread; 0, or -1 when unavailable.
int lesson_watchdog_start(lesson* l);
void lesson_watchdog_stop(lesson* l);

// ---- narration and checks (host.c, checks.c) -----------------------------------------------

void lesson_say(lesson* l, const char* text);

// lab.lesson{title=, claims=}: the declaration (checks.c). In info mode it
// stops the lesson right after, with an error value that
// lesson_stopped_at_declaration recognizes on top of the stack.
int lab_declare_lesson(lua_State* L);
bool lesson_stopped_at_declaration(lua_State* L);

// lab.check{id=, claim=, ...}: one claim's verdict (checks.c).
int lab_check(lua_State* L);

// Reports each declared claim never checked as FAIL (checks.c).
void lesson_report_unchecked(lesson* l);

// ---- limits (limits.c) --------------------------------------------------------------------

// The Lua state's allocator: every block counted against the one cap and
// linked into the lesson's list; `user` is the lesson.
void* lesson_alloc(void* user, void* block, size_t old_size, size_t new_size);

// Frees every block of a Lua state that can no longer be closed.
void lesson_free_lua_blocks(lesson* l);

// Instructions between two looks at the clock: about 0.1 ms of Lua.
enum { LESSON_HOOK_INSTRUCTIONS = 10000 };

// Arms the time hook on the lesson's coroutine.
void lesson_install_time_hook(lesson* l);

#endif
