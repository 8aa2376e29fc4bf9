// serve internals: the state the files of lab/serve/ share, one noun a file
// (server.c the engine loop, job.c, choice.c, logprobs.c, stream.c,
// responses.c, metrics.c, http.c). Not for use outside lab/serve/ (and the
// fuzz harness of request handling).
//
// ---- the locking invariant ----
//
// One mutex, `lock`, and two condition variables.
//
//   - The engine belongs to the engine thread. Only it calls engine_*; it
//     calls engine_step WITHOUT the lock (a step takes milliseconds, and
//     connections must not wait on it) and everything else (add, cancel,
//     reading sequences, measuring the pool) WITH the lock held.
//   - Every field of a job, the job list, the counters and the metrics are
//     read and written only with the lock held, by any thread.
//   - Connection threads never touch the engine: they put a job on the
//     list (signal `work`), then wait on `progress` for the engine thread to
//     publish tokens, a finish or an error. A connection that gives up
//     (the client went away) sets job->abandoned and signals `work`; the
//     engine thread cancels the job's sequences before its next step, so
//     their blocks are free within one step.
//   - A job is freed by whoever drops its last reference (the engine
//     thread's, the connection's, the stream's), under the lock.
//
// Waits on `progress` are timed (50 ms) so that a connection also notices
// a client that closed its socket while no token was coming (queued, or a
// long prefill).
#ifndef SERVELAB_SERVE_INTERNAL_H
#define SERVELAB_SERVE_INTERNAL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/step_record.h"
#include "lab/serve/api.h"
#include "lab/serve/server.h"

#define HISTOGRAM_BUCKETS 16

typedef struct histogram {
    const double* bounds;                   // (HISTOGRAM_BUCKETS) upper bounds, seconds
    uint64_t counts[HISTOGRAM_BUCKETS + 1]; // the last one is +Inf
    double sum;
    uint64_t count;
} histogram;

typedef struct serve_metrics {
    uint64_t prompt_tokens;     // prompt tokens of requests the engine accepted
    uint64_t generation_tokens; // tokens generated and published
    uint64_t finished_stop, finished_length, finished_abort, finished_error;
    uint64_t rejected; // 4xx/5xx before reaching the engine
    histogram ttft, tpot, e2e;
    // Measured by the engine thread after each step or cancel:
    int blocks_total, blocks_free, blocks_cached, blocks_used;
    int sequences_running, sequences_waiting;
    int sequences_live; // held in the engine's memory: added and not yet released
    uint64_t preemptions, prefix_hit_tokens;
    uint64_t steps;
    // Speculative decoding, added up from each step's sequences (engine/speculative.h);
    // written to /metrics only when the engine speculates.
    bool speculative;
    int spec_k;                    // guesses per sequence per step (the per-position lines)
    uint64_t spec_drafts;          // sequence-steps that verified at least one guess (vLLM's num_drafts)
    uint64_t spec_draft_tokens;    // guesses proposed
    uint64_t spec_accepted_tokens; // guesses the target kept
    uint64_t spec_emitted_tokens;  // tokens those sequence-steps appended: kept guesses + correction or bonus
    uint64_t spec_accepted_per_position[SPEC_MAX_K]; // (SPEC_MAX_K) guesses kept at position p of their run
} serve_metrics;

typedef enum job_state { JOB_SUBMITTED = 0, JOB_RUNNING = 1, JOB_DONE = 2 } job_state;

typedef enum finish_kind { FINISH_NONE = 0, FINISH_STOP = 1, FINISH_LENGTH = 2, FINISH_ABORT = 3 } finish_kind;

typedef struct serve_choice {
    int32_t sequence_id; // -1 until the engine has it (forks appear after the prompt is computed)
    int32_t* tokens;     // (max_tokens) generated ids, published by the engine thread
    int n_tokens;
    char* text; // (text_capacity) the decoded text, cut before a stop string
    size_t text_bytes;
    size_t text_capacity;
    size_t text_ready; // bytes a stream may send now: held back are a possible stop-string
                       // start and an incomplete UTF-8 character
    finish_kind finish;
    float* token_logprobs; // (max_tokens) logprobs wanted: the sampled token's log-probability (NAN: unknown)
    int32_t* top_ids;      // (max_tokens, params.logprobs) the likeliest tokens at each position
    float* top_logprobs;   // (max_tokens, params.logprobs) and their log-probabilities
    // The stream's own progress (connection side):
    size_t text_sent;
    int tokens_sent;
    bool role_sent; // chat: the role chunk; completions with echo: the prompt's text
    bool final_sent;
} serve_choice;

typedef struct serve_job {
    struct serve_job* next; // the engine thread's list
    int refs;
    serve_params params;
    char id[48];
    long long created; // Unix seconds
    job_state state;
    bool failed; // error set; state is JOB_DONE
    serve_error error;
    bool abandoned;        // its client went away: the engine thread cancels it
    int32_t request_id;    // engine request id once running
    serve_choice* choices; // (params.n)
    int n_finished;
    double submit_s, first_token_s, last_token_s; // monotonic seconds
} serve_job;

struct server {
    const model* model;
    const tokenizer* tok;
    serve_config config;
    serve_limits limits;
    char model_name[256];
    char host[256];
    engine engine;
    bool engine_ready;
    struct MHD_Daemon* daemon;
    int port;
    pthread_t engine_thread;
    bool engine_thread_started;
    pthread_mutex_t lock;
    pthread_cond_t work;     // engine thread: a job arrived or was abandoned, or stop
    pthread_cond_t progress; // connections: tokens published, a job finished
    serve_job* jobs;         // jobs the engine thread holds (submitted or running)
    int n_in_flight;
    bool work_pending;
    bool stopping;
    int connections;
    uint64_t id_counter;
    uint64_t id_salt;
    serve_metrics metrics;
    step_record queues_now; // the engine's queues as server_measure() last saw them (engine_snapshot; lock held)
    // The engine thread's own (no lock): logits of sequences whose request
    // asked for logprobs, copied by the logits observer during a step.
    bool* capture_wanted;           // (capture_capacity) by sequence id
    struct logit_capture* captures; // (capture_capacity) by sequence id
    int capture_capacity;
};

typedef struct logit_capture {
    int position;     // the position of the token the logits follow, -1 when none
    float* row;       // (vocab) the logits (before temperature): the sampled token's is read from here
    double log_total; // log of the sum of exp(row): logprob = row[id] - log_total
    int32_t top_ids[SERVE_MAX_TOP_LOGPROBS]; // the likeliest ids, best first (ties: lower id first)
    int n_top;
} logit_capture;

typedef struct stream_state {
    server* server;
    serve_job* job;
    int socket; // the client's socket, to notice it closing while no token comes
    char* out;  // (out_capacity) SSE bytes not yet handed to MHD
    size_t out_bytes;
    size_t out_sent;
    size_t out_capacity;
    bool done; // "data: [DONE]" is in out
} stream_state;

// ---- jobs (job.c)

void job_fail(server* s, serve_job* job, int http_status, const char* type, const char* message);
void job_free(serve_job* job);
serve_job* job_new(serve_params* params);
void job_release(server* s, serve_job* job, bool connection);
void job_retire(server* s, serve_job* job, finish_kind outcome);
int job_submit(server* s, serve_job* job, serve_endpoint endpoint);
void jobs_admit_and_cancel(server* s);
// Monotonic seconds.
double serve_now_s(void);
// Waits up to 50 ms for progress (lock held); false when the client is gone.
bool serve_wait_progress(server* s, int socket);
void server_publish(server* s);

// ---- choice text and stop strings (choice.c)

int choice_append(serve_choice* c, const char* piece);
bool choice_check_stops(serve_choice* c, const serve_params* p, size_t searched_from);

// Copies sequence q's tokens past those c has into c (lock held): ids,
// logprobs, decoded text; then cuts at a stop string, or finishes as the
// engine did. 1 when a stop string ended it (the caller cancels its
// sequence in the engine), 0, or -1 when out of memory. The engine is only
// read through q, so the fuzz harness drives it with made-up sequences.
int choice_publish(server* s, serve_job* job, serve_choice* c, const step_sequence_status* q);

// ---- logprobs (logprobs.c)

void capture_logits(void* user, int32_t id, int position, const float* logits, int vocab_size);
void capture_want(server* s, int32_t id, bool wanted);
void choice_record_logprobs(server* s, serve_job* job, serve_choice* c, const step_sequence_status* q, int index);
json_t* logprobs_json(server* s, const serve_job* job, const serve_choice* c, int from, int to);

// ---- responses (responses.c)

json_t* serve_completion_json(server* s, const serve_job* job);
const char* serve_finish_name(finish_kind finish);
const char* serve_piece_of(server* s, int32_t previous, int32_t id);
char* serve_prompt_text(server* s, const serve_job* job);
enum MHD_Result serve_respond_error(server* s, struct MHD_Connection* connection, const serve_error* error);
enum MHD_Result serve_respond_fail(server* s, struct MHD_Connection* connection, int status, const char* type,
                                   const char* param, const char* format, ...) __attribute__((format(printf, 6, 7)));
enum MHD_Result serve_respond_json(struct MHD_Connection* connection, int status, json_t* body);
enum MHD_Result serve_respond_text(struct MHD_Connection* connection, int status, const char* content_type,
                                   const char* body);
json_t* serve_text_json(const char* text, size_t bytes);
json_t* serve_token_ids_json(const int32_t* ids, int n);
json_t* serve_usage_json(const serve_job* job);

// ---- streams (stream.c)

enum MHD_Result serve_start_stream(server* s, struct MHD_Connection* connection, serve_job* job, int socket);
// Turns what the job has that the client has not seen into SSE events in
// st->out (lock held). -1 when out of memory.
int stream_collect(stream_state* st);

// ---- metrics (metrics.c)

enum MHD_Result serve_handle_health(server* s, struct MHD_Connection* connection);
enum MHD_Result serve_handle_metrics(server* s, struct MHD_Connection* connection);
void serve_histogram_observe(histogram* h, double seconds);
void serve_metrics_init(serve_metrics* m);
// Adds a step's speculative counts (its sequences' drafted, accepted, emitted) to m.
void serve_metrics_count_speculation(serve_metrics* m, const step_record* record);

// ---- HTTP (http.c)

enum MHD_Result serve_access_handler(void* cls, struct MHD_Connection* connection, const char* url, const char* method,
                                     const char* version, const char* upload_data, size_t* upload_data_size,
                                     void** request_state);
void serve_connection_notified(void* cls, struct MHD_Connection* connection, void** socket_state,
                               enum MHD_ConnectionNotificationCode code);
void serve_log_mhd(void* cls, const char* format, va_list args);
void serve_request_completed(void* cls, struct MHD_Connection* connection, void** request_state,
                             enum MHD_RequestTerminationCode code);

// ---- the engine loop (server.c)

// Reads the engine's pool and queues into the metrics (engine_snapshot; lock held).
void server_measure(server* s);

#endif
