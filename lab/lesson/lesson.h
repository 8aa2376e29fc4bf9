// lesson: the host of a Lua lesson (an embedded Lua 5.4 state with the
// `lab` module, a sandbox and limits), driven one pause at a time.
//
// A lesson file runs as the body of a Lua coroutine. lab.pause() yields
// that coroutine when the host is interactive (the dashboard, a terminal)
// and does nothing headless, so a host drives a lesson like this:
//
//   lesson* l;
//   lesson_options o = lesson_options_default();
//   o.interactive = true; o.on_say = show_text; o.on_check = show_check; o.user = ui;
//   if (lesson_open(&l, "lessons/02-paged-attention.lua", &o, &err)) { show(err.message); return; }
//   for (;;) {
//       lesson_status s = lesson_resume(l);     // runs until lab.pause(), the end, or an error
//       draw(lesson_focus_engine(l));           // the engine the lesson last created or stepped
//       if (s != LESSON_PAUSED) break;          // DONE or FAILED (lesson_error(l): "FILE:LINE: message")
//       wait_for_key();
//   }
//   lesson_close(l);                            // frees every engine and model the lesson made
//
// The lesson's checks arrive through on_check as they happen; claims the
// lesson declared (lab.lesson{claims = {...}}) but never checked are
// reported as FAIL through on_check when it ends (lesson_resume calls
// lesson_finish on DONE and FAILED). A failing lesson never takes its host
// down: Lua errors, the time limit and the memory cap all come back as
// LESSON_FAILED with a message, and lesson_close frees everything.
//
// Sandbox (lessons are shared between people): the base library without
// dofile/loadfile/load of binary chunks, string, table, math, utf8,
// coroutine, os.time/clock/date only, io.open/io.lines restricted to
// reading inside the lesson's folder and writing inside the output
// folder, and require() of .lua files from the lesson's folder only. An
// instruction-count hook stops the lesson after time_limit_s seconds of
// process CPU time, and a watchdog stops what the hook cannot reach (one
// long call into Lua's library, code running with hooks off) half a second
// later, abandoning the Lua state; the Lua allocator and the engines' own
// memory (model weights, KV pool, scratch, the logits e:logits keeps) share
// one cap, memory_limit_bytes; what it writes has a quota of
// write_limit_bytes and write_limit_files. Links are never followed, only regular files open,
// and control characters in what a lesson prints are made visible.
#ifndef SERVELAB_LESSON_H
#define SERVELAB_LESSON_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/engine.h"
#include "base/error.h"
#include "engine/fault.h"

typedef enum lesson_status {
    LESSON_PAUSED = 0, // lab.pause() in an interactive host: call lesson_resume again
    LESSON_DONE = 1,   // the lesson ran to its end
    LESSON_FAILED = 2, // a Lua error, the time limit or the memory cap: see lesson_error
} lesson_status;

typedef enum check_outcome {
    CHECK_PASS = 0,      // the measured verdict equals the bank's answer (or the lesson's expected)
    CHECK_DISAGREE = 1,  // the measurement contradicts the bank's answer
    CHECK_FAIL = 2,      // the check itself erred (bad arguments, or never reached)
    CHECK_UNDECIDED = 3, // a timing whose interval straddles the threshold (verdict lab.UNDECIDED):
                         // neither a pass nor a failure; the evidence says how noisy the machine was
} check_outcome;

typedef struct lesson_check_result {
    const char* id;       // "tf1", "se3", ...
    const char* claim;    // the statement checked, in words
    bool bank_answer;     // what the question bank says of the claim (beyond_bank: what the lesson expects)
    bool verdict;         // what the measurement says (meaningless for CHECK_FAIL)
    const char* evidence; // the numbers behind the verdict, or the error for CHECK_FAIL
    check_outcome outcome;
    fault_set breaks_with; // the faults that must turn this verdict (lab.check's breaks_with)
    const char* note;      // "" or where the measured cause differs from the bank's reason
    fault_set running;     // the faults the engine ran with when this was measured (0 normally)
    bool beyond_bank;      // a claim the question bank does not make (lab.check's expected): the lesson's own
} lesson_check_result;

// ---- the question bank's claims (lab/lesson/bank_claims.c) --------------------------

// One claim of the question bank as the lessons state it, and what the
// bank says of that sentence.
typedef struct lesson_bank_claim {
    const char* id;        // "tf3"
    bool bank_answer;      // true or false: what lab.check's bank_answer must be
    const char* statement; // "the KV cache grows quadratically with sequence length"
} lesson_bank_claim;

// The claim with this id, or NULL when the bank does not make it.
const lesson_bank_claim* lesson_bank_claim_find(const char* id);
// All of them (33: the seed's items), in the bank's order.
const lesson_bank_claim* lesson_bank_claims(int* count);
// `lesson check`'s reading of SOURCE (the lesson file PATH) without running
// it: every lab.check{...} whose id and bank_answer are literals is held to
// the bank (a wrong answer, or bank_answer on an id the bank lacks). One
// "PATH:LINE: ..." line per problem goes into PROBLEMS; returns how many.
// A computed id or answer is left to the run, which checks every one.
int lesson_lint_bank_answers(const char* source, const char* path, char* problems, size_t size);

typedef struct lesson_options {
    bool interactive;            // lab.pause() yields (false: it is a no-op)
    bool full;                   // lab.full: run the full-size scenarios (make lessons)
    double time_limit_s;         // process CPU seconds (default 60)
    uint64_t memory_limit_bytes; // Lua heap + engines + models (default 512 MiB)
    const char* output_dir;      // where io.open may write (default "lesson-output"); created on demand
    uint64_t write_limit_bytes;  // bytes the lesson may write in all (default LESSON_WRITE_LIMIT_BYTES)
    int write_limit_files;       // files it may create in output_dir (default LESSON_WRITE_LIMIT_FILES)
    fault_set faults;            // deliberate bugs installed for the run (engine/fault.h); 0 normally
    const char* only_claim;      // when set, on_check sees only this claim's result (others still run);
                                 // a lesson that does not declare it fails at its declaration
    // When set, the lesson stops once *stop_flag is non-zero (a signal
    // handler's flag: Ctrl-C in the dashboard), even inside a long call.
    const volatile sig_atomic_t* stop_flag;
    // Callbacks (may be NULL); strings are valid during the call only.
    void (*on_say)(void* user, const char* text);
    void (*on_check)(void* user, const lesson_check_result* result);
    void* user;
    // Warnings for the lesson's author (a field read by a name the API
    // renamed): to on_warning with warning_user when set, else to on_say
    // (the dashboard narrates them). lesson_run_file sends them to its
    // error stream when neither is set.
    void (*on_warning)(void* user, const char* text);
    void* warning_user;
} lesson_options;

// The write quota's defaults: a lesson's results are a few tables and
// traces (the shipped lessons write under 1 MiB in under 10 files), while
// a hostile one wrote 512 MiB in 2000 files in 2.7 s before it existed.
#define LESSON_WRITE_LIMIT_BYTES (64ull << 20)
#define LESSON_WRITE_LIMIT_FILES 256

lesson_options lesson_options_default(void);

typedef struct lesson lesson;

// Creates the sandboxed state and loads the file (a syntax error fails
// here, with "FILE:LINE: message" in err). Runs nothing yet.
int lesson_open(lesson** out, const char* path, const lesson_options* options, error_info* err);

// Runs the lesson until its next pause, its end, or an error. After DONE or
// FAILED, further calls return the same status.
lesson_status lesson_resume(lesson* l);

// "FILE:LINE: message" of a failed lesson; "" otherwise.
const char* lesson_error(const lesson* l);

// The engine the lesson most recently created or stepped, or NULL. Valid
// until the next lesson_resume or lesson_close.
const engine* lesson_focus_engine(const lesson* l);

// Counts so far (DISAGREE and FAIL count as failed).
void lesson_counts(const lesson* l, int* passed, int* failed);

// Checks that read UNDECIDED so far (counted neither as passed nor failed).
int lesson_undecided(const lesson* l);

// Reports every declared claim that was not checked as FAIL (once).
// lesson_resume calls it when the lesson ends; a host that abandons a
// paused lesson and wants its remaining claims reported may call it.
void lesson_finish(lesson* l);

// Closes the Lua state and frees every engine and model it made.
void lesson_close(lesson* l);

// ---- metadata, without running the lesson ------------------------------------------

typedef struct lesson_info {
    char title[160];
    char claims[64][16]; // (n_claims) claim ids declared by lab.lesson{}
    int n_claims;
} lesson_info;

// Loads the file and runs it only up to its lab.lesson{title=..., claims=...}
// declaration (which must come before any other lab call), checking the
// syntax and the declaration. "FILE:LINE: message" in err on failure.
int lesson_read_info(const char* path, lesson_info* out, error_info* err);

// The .lua files of a folder, sorted by name (lessons are numbered in
// teaching order). Returns how many (at most capacity), or -1 when the
// folder cannot be read.
enum { LESSON_MAX_FILES = 256 };
typedef char lesson_file_name[256];
int lesson_list_folder(const char* folder, lesson_file_name* names, int capacity);

// ---- headless running ----------------------------------------------------------------

// Prints one check as the headless runner does: a leading word for tools,
// the id and the claim, then in words what the claim is and what says so:
//   PASS tf3 "<claim>": FALSE, as the bank says -- measured: <evidence>[ -- note: <note>]
//   DISAGREE tf9 "<claim>": TRUE here, but the bank says FALSE -- measured: <evidence>
//   FAIL tf3 "<claim>": not judged, the check itself failed (the bank says FALSE) -- <error>
//   UNDECIDED why5 "<claim>": not decided, too noisy to tell (the bank says TRUE; ...) -- measured: <evidence>
// A claim beyond the bank reads "as the lesson expects" / "but the lesson
// expects" with "(a claim beyond the bank: the lesson's own)".
// Under --fault, a bracketed tail says whether the fault turned the claim
// and whether the claim declares it (breaks_with).
void lesson_print_check(FILE* out, const lesson_check_result* result);

// "N passed, M failed", and ", K undecided (...)" when K > 0.
void lesson_print_summary(FILE* out, int passed, int failed, int undecided);

// What lab.UNDECIDED holds: a verdict that is neither true nor false.
#define LESSON_UNDECIDED_VERDICT "undecided (too noisy to decide)"

// Runs a lesson to its end with `options` as given (callbacks included),
// calling on_pause (may be NULL) at every pause; prints errors to `errors`
// and, when summary is set, "N passed, M failed" to `out`. Returns 0 when
// every reported check passed and the lesson did not fail, 1 otherwise.
int lesson_run_file(const char* path, const lesson_options* options, void (*on_pause)(void* user), void* pause_user,
                    FILE* out, FILE* errors, bool summary);

// Runs a lesson headless, printing its check lines (only claim only_claim's
// when set) and, unless only_claim is set, the summary "N passed, M failed".
// Errors go to `errors` as "FILE:LINE: message". Returns 0 when every
// printed check passed and the lesson did not fail, 1 otherwise.
int lesson_run_headless(const char* path, const lesson_options* options, FILE* out, FILE* errors);

// ---- the fault matrix (lab/lesson/faults.c) -------------------------------------------

// Runs each lesson once with no fault and prints a markdown table of its
// claims and the faults each declares (breaks_with). Returns 0 when every
// lesson ran.
int lesson_fault_table(const char* const* paths, int n_paths, const lesson_options* options, FILE* out, FILE* errors);

// Runs each lesson with no fault (every claim must PASS and declare a
// fault), then once per fault its claims declare (each claim declaring it
// must turn to DISAGREE: a FAIL, where a guard, an error or a crash stopped
// the check, is listed as "stopped", is not counted as turned, and a claim
// no fault turns to DISAGREE is a problem); with `undeclared`, under every
// other fault too, reporting the claims they also turn. Each run is a
// child process. One line per (claim, fault) pair and a summary; returns 0
// when nothing is wrong.
int lesson_fault_matrix(const char* const* paths, int n_paths, const lesson_options* options, bool undeclared,
                        FILE* out, FILE* errors);

// The quiz's "prove it": finds the lesson in lessons_dir that declares
// claim_id, runs it headless and prints that check's line to out. Returns
// 0 when it passed, 1 when it did not (DISAGREE, FAIL or a failed lesson),
// -1 with err when no lesson declares the claim. stop_flag (or NULL): the
// lesson stops once it is non-zero (the quiz passes its signal flag, so
// Ctrl-C, SIGTERM or SIGHUP end a long check within a second).
int lesson_prove_claim(const char* lessons_dir, const char* claim_id, const volatile sig_atomic_t* stop_flag, FILE* out,
                       error_info* err);

#endif
