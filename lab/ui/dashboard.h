// dashboard: the lab's data side. Owns a paged engine and a contiguous
// engine that shadows the same requests in lockstep, the history ring
// buffers and the step-size pane's quantization; the panes (ui_panes.c)
// only read it. Nothing here draws.
#ifndef SERVELAB_DASHBOARD_H
#define SERVELAB_DASHBOARD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/quant.h"
#include "lab/common/model_source.h"

enum { HISTORY_STEPS = 256 };

// The last HISTORY_STEPS steps, oldest first from `start`.
typedef struct step_history {
    uint64_t bytes[HISTORY_STEPS]; // (HISTORY_STEPS) bytes moved per step
    int tokens[HISTORY_STEPS];     // (HISTORY_STEPS) tokens computed per step
    bool prefill[HISTORY_STEPS];   // (HISTORY_STEPS) the step computed prefill tokens
    int start, count;
} step_history;

// What the student did, in order, so that a restart (a new block size)
// replays the same requests in the same state: ids come back the same
// because requests and forks are replayed in the order they were made.
typedef struct saved_request {
    int32_t* prompt; // (n_prompt) token ids
    int n_prompt;
    int max_new_tokens;
    int n_samples;
    float temperature;
    uint64_t seed;
    int32_t fork_of;  // a fork (f): the paged id of the sequence it forked, else -1
    int32_t sequence; // the paged id of its (first) sequence
    bool cancelled;   // x cancelled it: replayed, then cancelled again
} saved_request;

// The step-size pane: one tensor, one scheme, its RTN quantization.
typedef struct step_size_view {
    int layer;  // 0..n_layers-1
    int tensor; // index into STEP_SIZE_TENSORS (wq wk wv wo w1 w2 w3)
    quant_scheme scheme;
    int set_index; // the parameter set shown (0 = first row / group)
    int rows, cols;
    float* weights;       // (rows, cols) the tensor in fp32
    int32_t* codes;       // (rows, cols)
    quant_params* params; // (quant_param_count)
    int n_params;
    quant_stats set_stats;    // of set_index
    quant_stats matrix_stats; // of the whole matrix
    float set_min, set_max;   // the set's value range
    char name[64];
    char error[512]; // non-empty when the scheme does not apply
} step_size_view;

extern const char* const STEP_SIZE_TENSORS[7];

// This machine's streaming-read bandwidth and peak fp32 FMA rate
// (kernels/cpu/machine_probe.h), measured once in the background so that
// the lab opens at once; the traffic pane compares each step against them.
// Shared by the dashboard and the measuring thread (a detached thread, so
// that quitting never waits for it); the last of the two to let go frees it.
typedef struct machine_figures {
    atomic_int owners;     // the dashboard and, while it runs, the measuring thread
    atomic_bool measured;  // set (release) after the two figures are written
    double bandwidth_gb_s; // GB/s, 1e9 bytes
    double peak_gflop_s;   // fp32 FMA GFLOP/s
    int n_threads;         // threads to measure with (0: one per online CPU)
} machine_figures;

// What a lesson said and checked, for the lesson pane: the last
// LESSON_LOG_LINES entries, oldest first from `start`.
enum { LESSON_LOG_LINES = 64, LESSON_LOG_WIDTH = 320 };
typedef enum lesson_log_kind {
    LOG_NARRATION = 0,
    LOG_PASS = 1,
    LOG_DISAGREE = 2,
    LOG_FAIL = 3,
    LOG_STATUS = 4,
} lesson_log_kind;
typedef struct lesson_log {
    char lines[LESSON_LOG_LINES][LESSON_LOG_WIDTH]; // (LESSON_LOG_LINES) UTF-8 text
    lesson_log_kind kinds[LESSON_LOG_LINES];        // (LESSON_LOG_LINES)
    int start, count;
    uint64_t appended; // lines ever logged (the pane counts new ones while scrolled back)
    char file[160];    // the lesson's file, "" when none runs
    char title[160];   // its lab.lesson{title = ...}, "" if it could not declare one
    char state[96];    // "paused: space continues", "done: 3 passed, 0 failed", ...
} lesson_log;

typedef struct dashboard {
    model_source source;
    model_source draft;   // --speculative draft:...: the proposer both engines share (engine_options_open_draft)
    engine_config config; // layout ignored: both engines run
    // Slots of KV memory each engine gets, kept when the block size changes:
    // a block's bytes are block_size x the bytes of one slot, so the same
    // slots are the same bytes (2048 = 128 blocks of 16 = 64 of 32).
    int64_t kv_slots;
    engine paged;
    engine contiguous;
    bool have_engines;
    const step_record* paged_record; // the last step, or NULL
    const step_record* contiguous_record;
    kv_layout primary;       // the layout the requests and traffic panes follow (--kv)
    saved_request* requests; // (n_requests) everything added, to replay after a restart
    int n_requests, requests_capacity;
    step_history history;
    step_size_view step_size;
    int selected; // sequence id (paged engine) of the selected request row
    uint64_t steps;
    double step_seconds_total;   // engine time of all steps (both engines)
    char system_prompt[512];     // what `p` requests start with (shared through the prefix cache)
    int n_shared_prompts;        // requests added with `p` so far
    int max_new_tokens;          // new tokens per request added from the lab
    machine_figures* machine;    // NULL until dashboard_measure_machine
    const engine* lesson_engine; // while a lesson runs: the engine it works on (panes draw it), else NULL
    uint64_t lesson_engine_step; // its last step put into the history
    lesson_log lesson;
    // servelab lab --serve: the panes follow the server's engine (as a
    // lesson's, through lesson_engine) and the header shows these.
    char serve_address[96]; // "http://127.0.0.1:8000", "" when not serving
    int serve_clients;      // open client connections
    int serve_in_flight;    // requests queued or running
    int serve_submitted;    // of those, not yet admitted (waiting for the lab to step)
} dashboard;

int dashboard_init(dashboard* d, const model_request* request, const engine_config* config, kv_layout primary,
                   error_info* err);
void dashboard_free(dashboard* d);

// Adds a request to both engines. temperature 0 = greedy.
int dashboard_add_prompt(dashboard* d, const char* text, int max_new_tokens, int n_samples, float temperature,
                         error_info* err);
// One lockstep step of both engines (a no-op for one that has no work).
int dashboard_step(dashboard* d, error_info* err);
bool dashboard_has_work(const dashboard* d);
// Forks the selected sequence in both engines (engine_fork_sequence): in
// the paged engine the child shares every block and samples at temperature
// 0.8, so it diverges. Whichever of the two writes first into a shared,
// partly filled tail block copies it (kv_layout_paged.c prepare_decode):
// the scheduler runs the parent first (the child is queued after it), so
// the parent takes the copy and the child keeps the original block. The
// contiguous engine recomputes the child in its own reservation.
int dashboard_fork_selected(dashboard* d, error_info* err);
// Adds a request made of the system prompt and a short follow-up, so that
// requests share the system prompt's full blocks (prefix cache).
int dashboard_add_shared_prompt(dashboard* d, error_info* err);
int dashboard_cancel_selected(dashboard* d, error_info* err);
// Rebuilds both engines with a new block size and replays every request
// from its prompt, in the state the student left it: a fork is forked again
// from its parent (at once: the parent starts over, so the child shares its
// prompt and recomputes), a cancelled request is cancelled again. The KV
// memory stays d->kv_slots: the pool gets dashboard_blocks_for(d, block_size)
// blocks, so a comparison of block sizes is not also one of pool sizes.
int dashboard_set_block_size(dashboard* d, int block_size, error_info* err);
// Blocks of `block_size` slots in the KV memory (kv_slots / block_size,
// rounded down; bytes / block bytes alike): 128 blocks of 16 are 64 of 32.
int dashboard_blocks_for(const dashboard* d, int block_size);
// Recomputes the step-size view after a change of tensor or scheme.
void dashboard_update_step_size(dashboard* d);

// Measures this machine's bandwidth and peak FMA rate: in a background
// thread (the terminal lab) or before returning (headless replays that ask
// for it).
void dashboard_measure_machine(dashboard* d, bool in_background);
// True once the machine's figures are there; *gb_s and *gflop_s get them.
bool dashboard_machine_figures(const dashboard* d, double* gb_s, double* gflop_s);

// Panes draw the lesson's engine while a lesson works on one: `e` (NULL:
// back to the lab's own engines); its newest step joins the history.
void dashboard_follow_engine(dashboard* d, const engine* e);
// The engine of a layout the panes draw (the lab's own, or the lesson's when
// it has that layout), or NULL; and its last step record, NULL before one.
const engine* dashboard_view_engine(const dashboard* d, kv_layout layout);
const step_record* dashboard_view_record(const dashboard* d, kv_layout layout);
// Appends a line to the lesson pane's log.
void dashboard_lesson_log(dashboard* d, lesson_log_kind kind, const char* text);

const engine* dashboard_primary(const dashboard* d);
const step_record* dashboard_primary_record(const dashboard* d);

#endif
