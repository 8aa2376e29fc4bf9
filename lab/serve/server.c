// serve: the OpenAI-compatible server (libmicrohttpd for HTTP, Jansson for
// JSON, one engine thread).
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
#include "lab/serve/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lab/serve/api.h"

serve_config serve_config_default(void) {
    return (serve_config){
        .host = "127.0.0.1",
        .port = 8000,
        .model_name = "servelab",
        .max_queue = 256,
        .max_body_bytes = 1u << 20,
        .read_timeout_s = 10,
        .max_connections = 512,
        .max_header_count = 100,
        .max_header_bytes = 16u << 10,
    };
}

// ---- metrics ---------------------------------------------------------------------------

#define HISTOGRAM_BUCKETS 16
typedef struct histogram {
    const double* bounds;                   // (HISTOGRAM_BUCKETS) upper bounds, seconds
    uint64_t counts[HISTOGRAM_BUCKETS + 1]; // the last one is +Inf
    double sum;
    uint64_t count;
} histogram;

// vLLM's bucket bounds (its metrics.py), cut to 16 each.
static const double TTFT_BOUNDS[HISTOGRAM_BUCKETS] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                                      0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0};
static const double TPOT_BOUNDS[HISTOGRAM_BUCKETS] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                                      0.2,   0.3,   0.4,  0.5,   0.75, 1.0,   2.5, 5.0};
static const double E2E_BOUNDS[HISTOGRAM_BUCKETS] = {0.01, 0.05, 0.1, 0.3,  0.5,  0.8,  1.0,  1.5,
                                                     2.0,  2.5,  5.0, 10.0, 15.0, 20.0, 30.0, 60.0};

static void histogram_observe(histogram* h, double seconds) {
    int i = 0;
    while (i < HISTOGRAM_BUCKETS && seconds > h->bounds[i])
        i++;
    h->counts[i]++;
    h->sum += seconds;
    h->count++;
}

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
} serve_metrics;

// ---- jobs ------------------------------------------------------------------------------

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
    step_record queues_now; // the engine's queues as measure() last saw them (engine_snapshot; lock held)
    // The engine thread's own (no lock): logits of sequences whose request
    // asked for logprobs, copied by the logits observer during a step.
    bool* capture_wanted;           // (capture_capacity) by sequence id
    struct logit_capture* captures; // (capture_capacity) by sequence id
    int capture_capacity;
};

typedef struct logit_capture {
    int position; // the position of the token the logits follow, -1 when none
    float* row;   // (vocab) the logits (before temperature): the sampled token's is read from here
    double log_total;                          // log of the sum of exp(row): logprob = row[id] - log_total
    int32_t top_ids[SERVE_MAX_TOP_LOGPROBS];   // the likeliest ids, best first (ties: lower id first)
    int n_top;
} logit_capture;

static double monotonic_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void job_free(serve_job* job) {
    if (job->choices)
        for (int i = 0; i < job->params.n; i++) {
            free(job->choices[i].tokens);
            free(job->choices[i].text);
            free(job->choices[i].token_logprobs);
            free(job->choices[i].top_ids);
            free(job->choices[i].top_logprobs);
        }
    free(job->choices);
    serve_params_free(&job->params);
    free(job);
}

// Drops one reference (lock held). A connection dropping its reference
// before the job is done abandons it.
static void job_release(server* s, serve_job* job, bool connection) {
    if (connection && job->state != JOB_DONE && !job->abandoned) {
        job->abandoned = true;
        s->work_pending = true;
        pthread_cond_signal(&s->work);
    }
    if (--job->refs == 0) job_free(job);
}

// ---- the engine thread ----------------------------------------------------------------

// ---- logprobs (engine thread only) -------------------------------------------------------------

static bool capture_reserve(server* s, int32_t id) {
    if (id < s->capture_capacity) return true;
    int capacity = s->capture_capacity ? s->capture_capacity : 256;
    while (capacity <= id)
        capacity *= 2;
    bool* wanted = realloc(s->capture_wanted, (size_t)capacity * sizeof *wanted);
    if (wanted) s->capture_wanted = wanted;
    logit_capture* captures = realloc(s->captures, (size_t)capacity * sizeof *captures);
    if (captures) s->captures = captures;
    if (!wanted || !captures) return false;
    for (int i = s->capture_capacity; i < capacity; i++) {
        s->capture_wanted[i] = false;
        s->captures[i] = (logit_capture){.position = -1};
    }
    s->capture_capacity = capacity;
    return true;
}

static void capture_want(server* s, int32_t id, bool wanted) {
    if (wanted && !capture_reserve(s, id)) return;
    if (id >= s->capture_capacity) return;
    s->capture_wanted[id] = wanted;
    if (!wanted) {
        free(s->captures[id].row);
        s->captures[id] = (logit_capture){.position = -1};
    }
}

// The engine's logits observer: runs inside engine_step, on the engine
// thread, without the lock, so that the O(vocab) work of logprobs (the
// normaliser and the top 20) never holds up a connection. It once ran under
// the lock with k passes over the vocabulary each re-scanning the ids taken:
// O(k^2 vocab), 56.7 s for one request (vocab 32000, 128 tokens, top 20)
// while a 2-token request waited 88.9 s.
static void capture_logits(void* user, int32_t id, int position, const float* logits, int vocab_size) {
    server* s = user;
    if (id >= s->capture_capacity || !s->capture_wanted[id]) return;
    logit_capture* c = &s->captures[id];
    if (!c->row && !(c->row = malloc((size_t)vocab_size * sizeof *c->row))) return;
    memcpy(c->row, logits, (size_t)vocab_size * sizeof *c->row);
    c->position = position;
    float max = logits[0];
    for (int v = 1; v < vocab_size; v++)
        max = logits[v] > max ? logits[v] : max;
    double sum = 0.0;
    for (int v = 0; v < vocab_size; v++)
        sum += exp((double)(logits[v] - max));
    c->log_total = (double)max + log(sum);
    c->n_top = serve_top_k(logits, vocab_size, SERVE_MAX_TOP_LOGPROBS, c->top_ids);
}

// Fills the logprobs of generated token `index` of choice c (sequence q), from
// the logits that preceded it: its own, or its fork parent's for a fork's first token.
static void record_logprobs(server* s, serve_job* job, serve_choice* c, const step_sequence_status* q, int index) {
    int position = q->n_prompt + index - 1;
    const logit_capture* capture = NULL;
    if (q->id < s->capture_capacity && s->captures[q->id].position == position)
        capture = &s->captures[q->id];
    else if (q->fork_parent >= 0 && q->fork_parent < s->capture_capacity &&
             s->captures[q->fork_parent].position == position)
        capture = &s->captures[q->fork_parent];
    int k = job->params.logprobs;
    c->token_logprobs[index] = NAN;
    for (int j = 0; j < k; j++)
        c->top_ids[index * k + j] = -1;
    if (!capture || !capture->row) return;
    // O(k): capture_logits did the O(vocab) part outside the lock.
    c->token_logprobs[index] = (float)((double)capture->row[c->tokens[index]] - capture->log_total);
    for (int j = 0; j < k && j < capture->n_top; j++) {
        int32_t best = capture->top_ids[j];
        c->top_ids[index * k + j] = best;
        c->top_logprobs[index * k + j] = (float)((double)capture->row[best] - capture->log_total);
    }
}

// Removes a done job from the list (lock held) and drops the engine's reference.
// Its sequences leave the engine's memory: publish() has copied every token
// the client gets, and a server that kept them grew 4.3 KB a request on
// stories260K (39 -> 48 -> 57 MB RSS per 2,000 requests).
static void job_retire(server* s, serve_job* job, finish_kind outcome) {
    if (job->state == JOB_RUNNING)
        for (int i = 0; i < job->params.n; i++) {
            int32_t id = job->choices[i].sequence_id;
            if (id < 0) continue;
            if (job->params.logprobs >= 0) capture_want(s, id, false);
            // Cancel first: shutdown and failures retire jobs whose sequences still
            // run (a finished one is a no-op), and only a finished one can be released.
            error_info err = {{0}};
            if (engine_cancel_sequence(&s->engine, id, &err) || engine_release_sequence(&s->engine, id, &err))
                fprintf(stderr, "servelab serve: %s\n", err.message);
        }
    job->state = JOB_DONE;
    double now = monotonic_s();
    if (outcome == FINISH_ABORT)
        s->metrics.finished_abort++;
    else if (job->failed)
        s->metrics.finished_error++;
    else {
        histogram_observe(&s->metrics.e2e, now - job->submit_s);
        bool any_length = false;
        for (int i = 0; i < job->params.n; i++)
            any_length |= job->choices[i].finish == FINISH_LENGTH;
        if (any_length)
            s->metrics.finished_length++;
        else
            s->metrics.finished_stop++;
    }
    for (serve_job** link = &s->jobs; *link; link = &(*link)->next)
        if (*link == job) {
            *link = job->next;
            break;
        }
    s->n_in_flight--;
    job_release(s, job, false);
}

static void job_fail(server* s, serve_job* job, int http_status, const char* type, const char* message) {
    job->failed = true;
    serve_fail(&job->error, http_status, type, NULL, "%s", message);
    job_retire(s, job, FINISH_NONE);
}

static void measure(server* s) {
    serve_metrics* m = &s->metrics;
    // Out of memory for the snapshot: the figures stay as last measured.
    if (engine_snapshot(&s->engine, &s->queues_now) == 0) {
        const step_record* now = &s->queues_now;
        m->blocks_total = now->blocks_total; // zeros for the contiguous layout
        m->blocks_free = now->blocks_free;
        m->blocks_cached = now->blocks_cached;
        m->blocks_used = now->blocks_used;
        m->sequences_running = now->n_running;
        m->sequences_waiting = now->n_waiting;
        m->sequences_live = now->n_live_sequences;
        m->preemptions = now->total_preemptions;
        m->prefix_hit_tokens = now->total_prefix_hit_tokens;
    }
}

// Cancels every sequence of a job that has one (lock held).
static void cancel_job_sequences(server* s, serve_job* job) {
    for (int i = 0; i < job->params.n; i++) {
        serve_choice* c = &job->choices[i];
        error_info err = {{0}};
        if (c->sequence_id >= 0) engine_cancel_sequence(&s->engine, c->sequence_id, &err);
    }
}

// Adds submitted jobs to the engine and cancels abandoned ones (lock held).
static void admit_and_cancel(server* s) {
    serve_job* next;
    for (serve_job* job = s->jobs; job; job = next) {
        next = job->next;
        if (job->abandoned) {
            if (job->state == JOB_RUNNING) cancel_job_sequences(s, job);
            job_retire(s, job, FINISH_ABORT);
            continue;
        }
        if (job->state != JOB_SUBMITTED) continue;
        const serve_params* p = &job->params;
        request_params request = {p->prompt, p->n_prompt, p->max_tokens, p->n, p->temperature,
                                  p->top_p,  p->seed,     0.0,           p->ignore_eos};
        error_info err = {{0}};
        int32_t first = -1;
        if (engine_add_request(&s->engine, &request, &first, &err)) {
            job_fail(s, job, 400, "invalid_request_error", err.message);
            continue;
        }
        // Known now, so that a cancel before the next publish finds them:
        // sample 0 (paged: the others fork off it later, and publish()
        // finds them by request id), or all n (contiguous: consecutive ids).
        step_sequence_status q;
        engine_sequence_status(&s->engine, first, &q); // just added: it is there
        job->request_id = q.request_id;
        for (int k = 0; k < p->n; k++) // false past the ids handed out
            if (engine_sequence_status(&s->engine, first + k, &q) && q.request_id == job->request_id) {
                job->choices[q.sample_index].sequence_id = q.id;
                if (p->logprobs >= 0) capture_want(s, q.id, true);
            }
        job->state = JOB_RUNNING;
        s->metrics.prompt_tokens += (uint64_t)p->n_prompt;
    }
}

static serve_job* job_of_request(server* s, int32_t request_id) {
    for (serve_job* job = s->jobs; job; job = job->next)
        if (job->state == JOB_RUNNING && job->request_id == request_id) return job;
    return NULL;
}

static int choice_append(serve_choice* c, const char* piece) {
    size_t bytes = strlen(piece);
    if (c->text_bytes + bytes + 1 > c->text_capacity) {
        size_t capacity = (c->text_capacity + bytes + 1) * 2;
        char* text = realloc(c->text, capacity);
        if (!text) return -1;
        c->text = text;
        c->text_capacity = capacity;
    }
    memcpy(c->text + c->text_bytes, piece, bytes);
    c->text_bytes += bytes;
    c->text[c->text_bytes] = '\0';
    return 0;
}

// After new text: cuts it at the first stop string (true when found) and
// sets text_ready.
static bool choice_check_stops(serve_choice* c, const serve_params* p, size_t searched_from) {
    if (!c->text || c->text_bytes == 0) { // no text yet: queued, in prefill, or only control tokens
        c->text_ready = 0;
        return false;
    }
    size_t longest = 0;
    for (int k = 0; k < p->n_stops; k++)
        if (strlen(p->stops[k]) > longest) longest = strlen(p->stops[k]);
    size_t from = searched_from > longest ? searched_from - longest : 0;
    char* earliest = NULL;
    for (int k = 0; k < p->n_stops; k++) {
        char* found = strstr(c->text + from, p->stops[k]);
        if (found && (!earliest || found < earliest)) earliest = found;
    }
    if (earliest) {
        c->text_bytes = (size_t)(earliest - c->text);
        c->text[c->text_bytes] = '\0';
        c->text_ready = c->text_bytes;
        return true;
    }
    // Hold back the longest tail that could still grow into a stop string.
    size_t hold = 0;
    for (int k = 0; k < p->n_stops; k++) {
        size_t stop_bytes = strlen(p->stops[k]);
        for (size_t l = stop_bytes - 1 < c->text_bytes ? stop_bytes - 1 : c->text_bytes; l > hold; l--)
            if (memcmp(c->text + c->text_bytes - l, p->stops[k], l) == 0) {
                hold = l;
                break;
            }
    }
    c->text_ready = serve_utf8_complete_prefix(c->text, c->text_bytes - hold);
    return false;
}

// Copies what the last step (`record`) produced into the jobs (lock held).
static void publish(server* s) {
    engine* e = &s->engine;
    // Forks appear once their parent's prompt is computed; they are found
    // among the live sequences (measure() has just read them), by request.
    // Not by scanning new ids: ids are reused once released.
    for (int i = 0; i < s->queues_now.n_live_sequences; i++) {
        const step_sequence_status* q = &s->queues_now.live_sequences[i];
        serve_job* job = job_of_request(s, q->request_id);
        if (job && q->sample_index >= 0 && q->sample_index < job->params.n &&
            job->choices[q->sample_index].sequence_id < 0) {
            job->choices[q->sample_index].sequence_id = q->id;
            if (job->params.logprobs >= 0) capture_want(s, q->id, true);
        }
    }
    double now = monotonic_s();
    serve_job* next;
    for (serve_job* job = s->jobs; job; job = next) {
        next = job->next;
        if (job->state != JOB_RUNNING) continue;
        bool produced = false;
        for (int i = 0; i < job->params.n; i++) {
            serve_choice* c = &job->choices[i];
            if (c->finish != FINISH_NONE || c->sequence_id < 0) continue;
            step_sequence_status q;
            engine_sequence_status(e, c->sequence_id, &q); // held until the job retires
            size_t text_before = c->text_bytes;
            bool out_of_memory = false;
            int generated = q.n_tokens - q.n_prompt;
            for (; c->n_tokens < generated && c->n_tokens < job->params.max_tokens; c->n_tokens++) {
                int32_t token = q.tokens[q.n_prompt + c->n_tokens];
                int32_t previous = q.tokens[q.n_prompt + c->n_tokens - 1];
                c->tokens[c->n_tokens] = token;
                if (job->params.logprobs >= 0) record_logprobs(s, job, c, &q, c->n_tokens);
                produced = true;
                s->metrics.generation_tokens++;
                if (s->tok) {
                    const char* piece = tok_decode_piece(s->tok, previous, token);
                    if (tok_piece_is_printable(piece) && choice_append(c, piece)) out_of_memory = true;
                }
            }
            if (out_of_memory) {
                cancel_job_sequences(s, job);
                job_fail(s, job, 500, "server_error", "out of memory while decoding the completion");
                goto next_job;
            }
            if (choice_check_stops(c, &job->params, text_before)) {
                error_info err = {{0}};
                engine_cancel_sequence(e, c->sequence_id, &err);
                c->finish = FINISH_STOP;
            } else if (q.state == SEQ_FINISHED) {
                c->finish = q.stop == STOP_EOS || q.stop == STOP_BOS ? FINISH_STOP : FINISH_LENGTH;
            }
            if (c->finish != FINISH_NONE) {
                c->text_ready = c->text_bytes;
                job->n_finished++;
            }
        }
        if (produced) {
            if (job->first_token_s == 0)
                histogram_observe(&s->metrics.ttft, now - job->submit_s);
            else
                histogram_observe(&s->metrics.tpot, now - job->last_token_s);
            if (job->first_token_s == 0) job->first_token_s = now;
            job->last_token_s = now;
        }
        if (job->n_finished == job->params.n) job_retire(s, job, FINISH_NONE);
    next_job:;
    }
}

// One round of the engine loop, lock held (dropped during engine_step):
// admit and cancel, step when there is work, publish. *stepped tells
// whether a step ran. -1 when the step failed: the engine's state is then
// not to be trusted, so everything in flight has failed and the server is
// stopping (err says why).
static int serve_round(server* s, bool* stepped, error_info* err) {
    *stepped = false;
    s->work_pending = false;
    admit_and_cancel(s);
    measure(s);
    pthread_cond_broadcast(&s->progress);
    if (!engine_has_work(&s->engine)) return 0;
    pthread_mutex_unlock(&s->lock);
    const step_record* record = NULL;
    int status = engine_step(&s->engine, &record, err);
    pthread_mutex_lock(&s->lock);
    s->metrics.steps++;
    if (status) {
        fprintf(stderr, "servelab serve: engine step failed: %s\n", err->message);
        while (s->jobs)
            job_fail(s, s->jobs, 500, "server_error", err->message);
        s->stopping = true;
        pthread_cond_broadcast(&s->progress);
        return -1;
    }
    *stepped = true;
    (void)record;
    measure(s);
    publish(s);
    measure(s);
    pthread_cond_broadcast(&s->progress);
    return 0;
}

// Stopping: whatever is in flight ends with an error (lock held).
static void fail_in_flight(server* s) {
    while (s->jobs)
        job_fail(s, s->jobs, 503, "server_error", "the server is shutting down");
    pthread_cond_broadcast(&s->progress);
}

static void* engine_thread_main(void* arg) {
    server* s = arg;
    pthread_mutex_lock(&s->lock);
    while (!s->stopping) {
        if (!s->work_pending && !engine_has_work(&s->engine)) {
            pthread_cond_wait(&s->work, &s->lock);
            continue;
        }
        bool stepped = false;
        error_info err = {{0}};
        if (serve_round(s, &stepped, &err)) break;
    }
    fail_in_flight(s);
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

// ---- external stepping (servelab lab --serve) ----------------------------------------------------
//
// No engine thread: the caller's thread is the engine thread of the
// invariant above. It alone calls server_step (and so engine_step) and
// reads server_engine(); connections still only touch jobs, under the lock.

int server_step(server* s, bool* stepped, error_info* err) {
    *stepped = false;
    if (!s->config.external_stepping)
        return error_set(err, "serve: server_step needs external_stepping (the engine thread steps this server)");
    pthread_mutex_lock(&s->lock);
    int status = s->stopping ? error_set(err, "serve: the server has stopped") : serve_round(s, stepped, err);
    pthread_mutex_unlock(&s->lock);
    return status;
}

bool server_has_work(server* s) {
    pthread_mutex_lock(&s->lock);
    bool work = s->jobs != NULL || engine_has_work(&s->engine);
    pthread_mutex_unlock(&s->lock);
    return work;
}

const engine* server_engine(const server* s) { return &s->engine; }

server_activity server_activity_now(server* s) {
    pthread_mutex_lock(&s->lock);
    server_activity a = {s->connections, s->n_in_flight, 0};
    for (const serve_job* job = s->jobs; job; job = job->next)
        a.submitted += job->state == JOB_SUBMITTED;
    pthread_mutex_unlock(&s->lock);
    return a;
}

const char* server_host(const server* s) { return s->host; }

// ---- responses ---------------------------------------------------------------------------

static enum MHD_Result respond_text(struct MHD_Connection* connection, int status, const char* content_type,
                                    const char* body) {
    struct MHD_Response* response = MHD_create_response_from_buffer(strlen(body), (void*)body, MHD_RESPMEM_MUST_COPY);
    if (!response) return MHD_NO;
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    enum MHD_Result result = MHD_queue_response(connection, (unsigned int)status, response);
    MHD_destroy_response(response);
    return result;
}

static enum MHD_Result respond_json(struct MHD_Connection* connection, int status, json_t* body) {
    char* text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text)
        return respond_text(connection, 500, "application/json",
                            "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
    enum MHD_Result result = respond_text(connection, status, "application/json", text);
    free(text);
    return result;
}

static enum MHD_Result respond_error(server* s, struct MHD_Connection* connection, const serve_error* error) {
    pthread_mutex_lock(&s->lock);
    s->metrics.rejected++;
    pthread_mutex_unlock(&s->lock);
    char* text = serve_error_json(error);
    enum MHD_Result result = respond_text(connection, error->http_status, "application/json", text);
    free(text);
    return result;
}

static enum MHD_Result respond_fail(server* s, struct MHD_Connection* connection, int status, const char* type,
                                    const char* param, const char* format, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result respond_fail(server* s, struct MHD_Connection* connection, int status, const char* type,
                                    const char* param, const char* format, ...) {
    serve_error error;
    char message[sizeof error.message];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    serve_fail(&error, status, type, param, "%s", message);
    return respond_error(s, connection, &error);
}

static json_t* text_json(const char* text, size_t bytes) {
    char* clean = serve_utf8_sanitize(text, bytes);
    json_t* value = clean ? json_string(clean) : NULL;
    free(clean);
    return value ? value : json_string("");
}

static json_t* token_ids_json(const int32_t* ids, int n) {
    json_t* array = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(array, json_integer(ids[i]));
    return array;
}

// The text of token id after `previous` ("" for a control token, as in the text).
static const char* piece_of(server* s, int32_t previous, int32_t id) {
    if (!s->tok) return "";
    const char* piece = tok_decode_piece(s->tok, previous, id);
    return tok_piece_is_printable(piece) ? piece : "";
}

static json_t* bytes_json(const char* piece) {
    json_t* array = json_array();
    for (const unsigned char* b = (const unsigned char*)piece; *b; b++)
        json_array_append_new(array, json_integer(*b));
    return array;
}

static json_t* logprob_number(float value) { return isfinite(value) ? json_real(value) : json_null(); }

// The logprobs of generated tokens [from, to) of choice c: completions'
// {tokens, token_logprobs, top_logprobs, text_offset} or chat's {content}.
static json_t* logprobs_json(server* s, const serve_job* job, const serve_choice* c, int from, int to) {
    if (job->params.logprobs < 0) return json_null();
    int k = job->params.logprobs;
    const int32_t* prompt = job->params.prompt;
    bool chat = job->params.endpoint == SERVE_CHAT;
    json_t* tokens = json_array();
    json_t* token_logprobs = json_array();
    json_t* top = json_array();
    json_t* offsets = json_array();
    json_t* content = json_array();
    size_t offset = 0;
    for (int i = 0; i < from; i++)
        offset += strlen(piece_of(s, i ? c->tokens[i - 1] : prompt[job->params.n_prompt - 1], c->tokens[i]));
    for (int i = from; i < to; i++) {
        int32_t previous = i ? c->tokens[i - 1] : prompt[job->params.n_prompt - 1];
        const char* piece = piece_of(s, previous, c->tokens[i]);
        json_t* alternatives = chat ? json_array() : json_object();
        for (int j = 0; j < k; j++) {
            int32_t id = c->top_ids[i * k + j];
            if (id < 0) continue;
            const char* alternative = piece_of(s, previous, id);
            if (chat)
                json_array_append_new(alternatives,
                                      json_pack("{s:o, s:o, s:o}", "token", text_json(alternative, strlen(alternative)),
                                                "logprob", logprob_number(c->top_logprobs[i * k + j]), "bytes",
                                                bytes_json(alternative)));
            else {
                char* key = serve_utf8_sanitize(alternative, strlen(alternative));
                if (key && !json_object_get(alternatives, key)) // two ids may print alike: keep the likelier
                    json_object_set_new(alternatives, key, logprob_number(c->top_logprobs[i * k + j]));
                free(key);
            }
        }
        if (chat)
            json_array_append_new(content, json_pack("{s:o, s:o, s:o, s:o}", "token", text_json(piece, strlen(piece)),
                                                     "logprob", logprob_number(c->token_logprobs[i]), "bytes",
                                                     bytes_json(piece), "top_logprobs", alternatives));
        else {
            json_array_append_new(tokens, text_json(piece, strlen(piece)));
            json_array_append_new(token_logprobs, logprob_number(c->token_logprobs[i]));
            json_array_append_new(top, alternatives);
            json_array_append_new(offsets, json_integer((json_int_t)offset));
        }
        offset += strlen(piece);
    }
    if (chat) {
        json_decref(tokens), json_decref(token_logprobs), json_decref(top), json_decref(offsets);
        return json_pack("{s:o, s:n}", "content", content, "refusal");
    }
    json_decref(content);
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", token_logprobs, "top_logprobs", top,
                     "text_offset", offsets);
}

// Completions with echo: the prompt's text (after BOS), malloc'ed.
static char* prompt_text(server* s, const serve_job* job) {
    if (!s->tok || job->params.n_prompt < 2) return strdup("");
    size_t bytes =
        tok_decode_text(s->tok, job->params.prompt[0], job->params.prompt + 1, job->params.n_prompt - 1, NULL, 0);
    char* text = malloc(bytes + 1);
    if (text)
        tok_decode_text(s->tok, job->params.prompt[0], job->params.prompt + 1, job->params.n_prompt - 1, text,
                        bytes + 1);
    return text;
}

static const char* finish_name(finish_kind finish) {
    return finish == FINISH_STOP     ? "stop"
           : finish == FINISH_LENGTH ? "length"
           : finish == FINISH_ABORT  ? "abort"
                                     : NULL;
}

static json_t* usage_json(const serve_job* job) {
    int completion = 0;
    for (int i = 0; i < job->params.n; i++)
        completion += job->choices[i].n_tokens;
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", job->params.n_prompt, "completion_tokens", completion,
                     "total_tokens", job->params.n_prompt + completion);
}

// The whole answer of a finished job (lock held).
static json_t* completion_json(server* s, const serve_job* job) {
    bool chat = job->params.endpoint == SERVE_CHAT;
    json_t* choices = json_array();
    char* echo = job->params.echo ? prompt_text(s, job) : NULL;
    for (int i = 0; i < job->params.n; i++) {
        const serve_choice* c = &job->choices[i];
        json_t* choice = json_pack("{s:i, s:o, s:s}", "index", i, "logprobs", logprobs_json(s, job, c, 0, c->n_tokens),
                                   "finish_reason", finish_name(c->finish));
        if (chat)
            json_object_set_new(
                choice, "message",
                json_pack("{s:s, s:o}", "role", "assistant", "content", text_json(c->text, c->text_bytes)));
        else if (echo) {
            size_t echo_bytes = strlen(echo);
            char* joined = malloc(echo_bytes + c->text_bytes + 1);
            if (joined) {
                memcpy(joined, echo, echo_bytes);
                memcpy(joined + echo_bytes, c->text ? c->text : "", c->text_bytes);
                json_object_set_new(choice, "text", text_json(joined, echo_bytes + c->text_bytes));
            }
            free(joined);
        } else
            json_object_set_new(choice, "text", text_json(c->text, c->text_bytes));
        if (job->params.return_token_ids)
            json_object_set_new(choice, "token_ids", token_ids_json(c->tokens, c->n_tokens));
        json_array_append_new(choices, choice);
    }
    free(echo);
    json_t* body = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", job->id, "object",
                             chat ? "chat.completion" : "text_completion", "created", (json_int_t)job->created, "model",
                             s->model_name, "choices", choices, "usage", usage_json(job));
    if (body && job->params.return_token_ids)
        json_object_set_new(body, "prompt_token_ids", token_ids_json(job->params.prompt, job->params.n_prompt));
    return body;
}

// ---- connections -------------------------------------------------------------------------

typedef struct connection_state {
    char* body; // (body_capacity) the request body so far
    size_t body_bytes;
    size_t body_capacity;
    bool body_too_large;
    bool answered; // a response has been queued
} connection_state;

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

// True when the client closed its end (or the socket failed).
static bool client_gone(int socket) {
    if (socket < 0) return false;
    struct pollfd p = {.fd = socket, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static int connection_socket(struct MHD_Connection* connection) {
    const union MHD_ConnectionInfo* info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info ? info->connect_fd : -1;
}

// Waits up to 50 ms for progress (lock held); false when the client is gone.
static bool wait_progress(server* s, int socket) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 50 * 1000 * 1000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    int status = pthread_cond_timedwait(&s->progress, &s->lock, &until);
    return !(status == ETIMEDOUT && client_gone(socket));
}

static int out_append(stream_state* st, const char* text) {
    size_t bytes = strlen(text);
    if (st->out_bytes + bytes > st->out_capacity) {
        size_t capacity = (st->out_bytes + bytes) * 2;
        char* out = realloc(st->out, capacity);
        if (!out) return -1;
        st->out = out;
        st->out_capacity = capacity;
    }
    memcpy(st->out + st->out_bytes, text, bytes);
    st->out_bytes += bytes;
    return 0;
}

// Appends "data: {json}\n\n" (takes the reference to chunk).
static int out_event(stream_state* st, json_t* chunk) {
    char* text = chunk ? json_dumps(chunk, JSON_COMPACT) : NULL;
    json_decref(chunk);
    if (!text) return -1;
    int status = out_append(st, "data: ") || out_append(st, text) || out_append(st, "\n\n") ? -1 : 0;
    free(text);
    return status;
}

static json_t* chunk_json(server* s, const serve_job* job, json_t* choices) {
    bool chat = job->params.endpoint == SERVE_CHAT;
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", job->id, "object",
                     chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)job->created, "model",
                     s->model_name, "choices", choices);
}

// One choice's chunk: text (may be empty) and finish_reason (NULL: null).
static json_t* choice_chunk(const serve_job* job, int index, const char* text, size_t bytes, const char* role,
                            const char* finish, const int32_t* ids, int n_ids, json_t* logprobs) {
    json_t* choice = json_pack("{s:i, s:o}", "index", index, "logprobs", logprobs ? logprobs : json_null());
    if (job->params.endpoint == SERVE_CHAT) {
        json_t* delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string(role));
        if (text) json_object_set_new(delta, "content", text_json(text, bytes));
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", text_json(text ? text : "", text ? bytes : 0));
    }
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    if (job->params.return_token_ids && ids) json_object_set_new(choice, "token_ids", token_ids_json(ids, n_ids));
    return choice;
}

// Turns whatever the job has that the client has not seen into SSE events
// (lock held). Returns -1 when out of memory.
static int stream_collect(stream_state* st) {
    server* s = st->server;
    serve_job* job = st->job;
    for (int i = 0; i < job->params.n; i++) {
        serve_choice* c = &job->choices[i];
        json_t* choices = json_array();
        if (job->params.endpoint == SERVE_CHAT && !c->role_sent) {
            json_array_append_new(choices, choice_chunk(job, i, "", 0, "assistant", NULL, NULL, 0, NULL));
            c->role_sent = true;
        }
        if (job->params.echo && !c->role_sent) {
            char* echo = prompt_text(s, job);
            if (echo)
                json_array_append_new(choices, choice_chunk(job, i, echo, strlen(echo), NULL, NULL, NULL, 0, NULL));
            free(echo);
            c->role_sent = true;
        }
        bool new_text = c->text_ready > c->text_sent;
        bool new_tokens = c->n_tokens > c->tokens_sent;
        bool per_token = job->params.return_token_ids || job->params.logprobs >= 0;
        if (new_text || (new_tokens && per_token)) {
            json_array_append_new(choices,
                                  choice_chunk(job, i, c->text + c->text_sent, c->text_ready - c->text_sent, NULL, NULL,
                                               c->tokens + c->tokens_sent, c->n_tokens - c->tokens_sent,
                                               logprobs_json(s, job, c, c->tokens_sent, c->n_tokens)));
            c->text_sent = c->text_ready;
            c->tokens_sent = c->n_tokens;
        }
        // Without ids or logprobs a token whose text a stop string cut away
        // sends nothing, and the finish chunk must not wait for it (it did,
        // and such a stream never ended: stop [","] on "Once upon a time").
        if (!per_token) c->tokens_sent = c->n_tokens;
        if (c->finish != FINISH_NONE && c->text_sent == c->text_bytes && c->tokens_sent == c->n_tokens &&
            !c->final_sent) {
            json_array_append_new(choices,
                                  job->params.endpoint == SERVE_CHAT
                                      ? choice_chunk(job, i, NULL, 0, NULL, finish_name(c->finish), NULL, 0, NULL)
                                      : choice_chunk(job, i, "", 0, NULL, finish_name(c->finish), NULL, 0, NULL));
            c->final_sent = true;
        }
        // One event per chunk, as OpenAI sends them.
        for (size_t k = 0; k < json_array_size(choices); k++) {
            json_t* one = json_array();
            json_array_append(one, json_array_get(choices, k));
            if (out_event(st, chunk_json(s, job, one))) {
                json_decref(choices);
                return -1;
            }
        }
        json_decref(choices);
    }
    if (job->state == JOB_DONE && !st->done) {
        bool all_final = true;
        for (int i = 0; i < job->params.n; i++)
            all_final &= job->choices[i].final_sent;
        if (job->failed) {
            char* text = serve_error_json(&job->error);
            int status = out_append(st, "data: ") || out_append(st, text) || out_append(st, "\n\n");
            free(text);
            if (status) return -1;
        } else if (!all_final) {
            return 0;
        } else if (job->params.include_usage) {
            json_t* chunk = chunk_json(s, job, json_array());
            json_object_set_new(chunk, "usage", usage_json(job));
            if (out_event(st, chunk)) return -1;
        }
        if (out_append(st, "data: [DONE]\n\n")) return -1;
        st->done = true;
    }
    return 0;
}

static ssize_t stream_read(void* cls, uint64_t position, char* buffer, size_t max) {
    (void)position;
    stream_state* st = cls;
    server* s = st->server;
    if (st->out_sent == st->out_bytes) {
        st->out_sent = st->out_bytes = 0;
        if (st->done) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&s->lock);
        for (;;) {
            if (stream_collect(st)) {
                pthread_mutex_unlock(&s->lock);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            if (st->out_bytes > 0) break;
            if (!wait_progress(s, st->socket)) {
                job_release(s, st->job, true); // abandons it: the engine thread cancels it
                st->job = NULL;
                pthread_mutex_unlock(&s->lock);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
        pthread_mutex_unlock(&s->lock);
    }
    size_t bytes = st->out_bytes - st->out_sent < max ? st->out_bytes - st->out_sent : max;
    memcpy(buffer, st->out + st->out_sent, bytes);
    st->out_sent += bytes;
    return (ssize_t)bytes;
}

static void stream_free(void* cls) {
    stream_state* st = cls;
    pthread_mutex_lock(&st->server->lock);
    if (st->job) job_release(st->server, st->job, true);
    pthread_mutex_unlock(&st->server->lock);
    free(st->out);
    free(st);
}

static serve_job* job_new(serve_params* params) {
    serve_job* job = calloc(1, sizeof *job);
    if (!job) return NULL;
    job->params = *params;
    memset(params, 0, sizeof *params); // the job owns them now
    job->choices = calloc((size_t)job->params.n, sizeof *job->choices);
    if (!job->choices) {
        job_free(job);
        return NULL;
    }
    for (int i = 0; i < job->params.n; i++) {
        job->choices[i].sequence_id = -1;
        serve_choice* c = &job->choices[i];
        size_t n = (size_t)job->params.max_tokens;
        size_t k = job->params.logprobs > 0 ? (size_t)job->params.logprobs : 1;
        c->tokens = malloc(n * sizeof *c->tokens);
        // The text exists from the start, empty: a stop-string check or a
        // stream may look at it before any token has printed.
        c->text_capacity = 64;
        c->text = calloc(c->text_capacity, 1);
        if (job->params.logprobs >= 0) {
            c->token_logprobs = malloc(n * sizeof *c->token_logprobs);
            c->top_ids = malloc(n * k * sizeof *c->top_ids);
            c->top_logprobs = malloc(n * k * sizeof *c->top_logprobs);
        }
        if (!c->tokens || !c->text || (job->params.logprobs >= 0 && (!c->token_logprobs || !c->top_ids || !c->top_logprobs))) {
            job_free(job);
            return NULL;
        }
    }
    job->created = (long long)time(NULL);
    job->submit_s = monotonic_s();
    return job;
}

// Puts job on the engine thread's queue (s->lock held): 0, or the HTTP
// status that refuses it (503 while shutting down, 429 with the queue full).
static int submit_job(server* s, serve_job* job, serve_endpoint endpoint) {
    if (s->stopping) return 503;
    if (s->n_in_flight >= s->config.max_queue) return 429;
    snprintf(job->id, sizeof job->id, "%s-%016llx%08llx", endpoint == SERVE_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)s->id_salt, (unsigned long long)++s->id_counter);
    job->refs = 2; // the engine thread's and this connection's
    job->next = s->jobs;
    s->jobs = job;
    s->n_in_flight++;
    s->work_pending = true;
    pthread_cond_signal(&s->work);
    return 0;
}

// Waits (s->lock held) until the engine has taken the job, or with `done`
// until it has finished. False when the client went away: the job is then
// released and the lock given up.
static bool wait_for_job(server* s, serve_job* job, int socket, bool done) {
    while (done ? job->state != JOB_DONE : job->state == JOB_SUBMITTED)
        if (!wait_progress(s, socket)) {
            job_release(s, job, true);
            pthread_mutex_unlock(&s->lock);
            return false;
        }
    return true;
}

// The response of a job that failed (s->lock held; released here).
static enum MHD_Result respond_job_failure(server* s, struct MHD_Connection* connection, serve_job* job) {
    serve_error failure = job->error;
    job_release(s, job, true);
    pthread_mutex_unlock(&s->lock);
    return respond_error(s, connection, &failure);
}

// stream: true. The events go out as the engine makes them (stream_read);
// the connection's reference to the job passes to the stream.
static enum MHD_Result start_stream(server* s, struct MHD_Connection* connection, serve_job* job, int socket) {
    stream_state* st = calloc(1, sizeof *st);
    struct MHD_Response* response =
        st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free) : NULL;
    if (!response) {
        free(st);
        pthread_mutex_lock(&s->lock);
        job_release(s, job, true);
        pthread_mutex_unlock(&s->lock);
        return MHD_NO;
    }
    st->server = s;
    st->job = job;
    st->socket = socket;
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result result = MHD_queue_response(connection, MHD_HTTP_OK, response);
    MHD_destroy_response(response); // stream_free runs when MHD is done with it
    return result;
}

static enum MHD_Result handle_generation(server* s, struct MHD_Connection* connection, serve_endpoint endpoint,
                                         connection_state* cs) {
    serve_params params;
    serve_error error;
    if (serve_parse_request(endpoint, cs->body ? cs->body : "", cs->body_bytes, &s->limits, s->tok, &params, &error)) {
        serve_params_free(&params);
        return respond_error(s, connection, &error);
    }
    if (!params.seed_given) params.seed = (uint64_t)time(NULL) ^ ((uint64_t)monotonic_s() * 1000003u);
    serve_job* job = job_new(&params);
    serve_params_free(&params);
    if (!job) return respond_fail(s, connection, 500, "server_error", NULL, "out of memory");
    int socket = connection_socket(connection);
    pthread_mutex_lock(&s->lock);
    int refused = submit_job(s, job, endpoint);
    if (refused) {
        int in_flight = s->n_in_flight;
        pthread_mutex_unlock(&s->lock);
        job_free(job);
        if (refused == 503) return respond_fail(s, connection, 503, "server_error", NULL, "the server is shutting down");
        return respond_fail(s, connection, 429, "rate_limit_error", NULL,
                            "server busy: %d requests are queued or running, the limit (--max-queue); retry later",
                            in_flight);
    }
    // The engine takes the job or refuses it (too big for the pool).
    if (!wait_for_job(s, job, socket, false)) return MHD_NO;
    if (job->failed) return respond_job_failure(s, connection, job);
    if (job->params.stream) {
        pthread_mutex_unlock(&s->lock);
        return start_stream(s, connection, job, socket);
    }
    if (!wait_for_job(s, job, socket, true)) return MHD_NO;
    if (job->failed) return respond_job_failure(s, connection, job);
    json_t* body = completion_json(s, job);
    job_release(s, job, true);
    pthread_mutex_unlock(&s->lock);
    return respond_json(connection, 200, body);
}

static enum MHD_Result handle_models(server* s, struct MHD_Connection* connection) {
    json_t* entry =
        json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", s->model_name, "object", "model", "created",
                  (json_int_t)time(NULL), "owned_by", "servelab", "max_model_len", s->limits.context_tokens);
    return respond_json(connection, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", entry));
}

static enum MHD_Result handle_health(server* s, struct MHD_Connection* connection) {
    pthread_mutex_lock(&s->lock);
    const serve_metrics* m = &s->metrics;
    json_t* body =
        json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "status", s->stopping ? "stopping" : "ok",
                  "model", s->model_name, "kv_blocks_total", m->blocks_total, "kv_blocks_free", m->blocks_free,
                  "kv_blocks_cached", m->blocks_cached, "kv_blocks_used", m->blocks_used, "sequences_running",
                  m->sequences_running, "sequences_waiting", m->sequences_waiting, "sequences_live", m->sequences_live,
                  "requests_in_flight", s->n_in_flight, "connections", s->connections);
    pthread_mutex_unlock(&s->lock);
    return respond_json(connection, 200, body);
}

// ---- /metrics: Prometheus text, vLLM's names ----------------------------------------------

typedef struct text_buffer {
    char* text;
    size_t bytes, capacity;
} text_buffer;

static void tb_printf(text_buffer* b, const char* format, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(text_buffer* b, const char* format, ...) {
    for (;;) {
        va_list args;
        va_start(args, format);
        int n = vsnprintf(b->text ? b->text + b->bytes : NULL, b->text ? b->capacity - b->bytes : 0, format, args);
        va_end(args);
        if (n < 0) return;
        if (b->text && b->bytes + (size_t)n < b->capacity) {
            b->bytes += (size_t)n;
            return;
        }
        size_t capacity = (b->capacity + (size_t)n + 1) * 2;
        char* text = realloc(b->text, capacity);
        if (!text) return;
        b->text = text;
        b->capacity = capacity;
    }
}

static void metric_header(text_buffer* b, const char* name, const char* type, const char* help) {
    tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metric_value(text_buffer* b, const char* name, const char* type, const char* help, const char* labels,
                         double value) {
    metric_header(b, name, type, help);
    tb_printf(b, "%s{%s} %.17g\n", name, labels, value);
}

static void metric_histogram(text_buffer* b, const char* name, const char* help, const char* labels,
                             const histogram* h) {
    metric_header(b, name, "histogram", help);
    uint64_t cumulative = 0;
    for (int i = 0; i < HISTOGRAM_BUCKETS; i++) {
        cumulative += h->counts[i];
        tb_printf(b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, labels, h->bounds[i], (unsigned long long)cumulative);
    }
    tb_printf(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, labels, (unsigned long long)h->count);
    tb_printf(b, "%s_sum{%s} %.17g\n%s_count{%s} %llu\n", name, labels, h->sum, name, labels,
              (unsigned long long)h->count);
}

static enum MHD_Result handle_metrics(server* s, struct MHD_Connection* connection) {
    text_buffer b = {0};
    char labels[300];
    snprintf(labels, sizeof labels, "model_name=\"%s\"", s->model_name);
    pthread_mutex_lock(&s->lock);
    serve_metrics m = s->metrics;
    int connections = s->connections;
    pthread_mutex_unlock(&s->lock);
    double usage = m.blocks_total ? (double)m.blocks_used / m.blocks_total : 0.0;
    metric_value(&b, "vllm:num_requests_running", "gauge", "Sequences in the running batch.", labels,
                 m.sequences_running);
    metric_value(&b, "vllm:num_requests_waiting", "gauge", "Sequences waiting (queued or preempted).", labels,
                 m.sequences_waiting);
    metric_value(&b, "vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage: blocks held by sequences / all (1 = full).",
                 labels, usage);
    metric_value(&b, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage: blocks held by sequences / all (1 = full).",
                 labels, usage);
    metric_value(&b, "vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
                 labels, (double)m.prompt_tokens);
    metric_value(&b, "vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", labels,
                 (double)m.prefix_hit_tokens);
    metric_value(&b, "vllm:num_preemptions_total", "counter", "Preemptions (recompute) since the start.", labels,
                 (double)m.preemptions);
    metric_value(&b, "vllm:prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", labels,
                 (double)m.prompt_tokens);
    metric_value(&b, "vllm:generation_tokens_total", "counter", "Tokens generated.", labels,
                 (double)m.generation_tokens);
    metric_header(&b, "vllm:request_success_total", "counter", "Requests finished, by reason.");
    tb_printf(&b, "vllm:request_success_total{%s,finished_reason=\"stop\"} %llu\n", labels,
              (unsigned long long)m.finished_stop);
    tb_printf(&b, "vllm:request_success_total{%s,finished_reason=\"length\"} %llu\n", labels,
              (unsigned long long)m.finished_length);
    tb_printf(&b, "vllm:request_success_total{%s,finished_reason=\"abort\"} %llu\n", labels,
              (unsigned long long)m.finished_abort);
    metric_histogram(&b, "vllm:time_to_first_token_seconds", "Time to first token (arrival to first token).", labels,
                     &m.ttft);
    metric_histogram(&b, "vllm:time_per_output_token_seconds", "Time between a request's tokens.", labels, &m.tpot);
    metric_histogram(&b, "vllm:e2e_request_latency_seconds", "Arrival to last token.", labels, &m.e2e);
    metric_value(&b, "servelab:kv_blocks_total", "gauge", "Blocks in the KV pool.", labels, m.blocks_total);
    metric_value(&b, "servelab:kv_blocks_free", "gauge", "Free blocks (no owner, not cached).", labels, m.blocks_free);
    metric_value(&b, "servelab:kv_blocks_cached", "gauge", "Blocks only the prefix cache holds (evictable).", labels,
                 m.blocks_cached);
    metric_value(&b, "servelab:kv_blocks_used", "gauge", "Blocks held by sequences.", labels, m.blocks_used);
    metric_value(&b, "servelab:requests_failed_total", "counter", "Requests that ended in a server error.", labels,
                 (double)m.finished_error);
    metric_value(&b, "servelab:requests_rejected_total", "counter", "Requests answered 4xx/5xx before the engine.",
                 labels, (double)m.rejected);
    metric_value(&b, "servelab:engine_steps_total", "counter", "Engine steps.", labels, (double)m.steps);
    metric_value(&b, "servelab:http_connections", "gauge", "Open HTTP connections.", labels, connections);
    enum MHD_Result result = b.text ? respond_text(connection, 200, "text/plain; version=0.0.4; charset=utf-8", b.text)
                                    : respond_text(connection, 500, "text/plain", "out of memory\n");
    free(b.text);
    return result;
}

// ---- the access handler --------------------------------------------------------------------

typedef struct header_tally {
    int count;
    size_t bytes;
} header_tally;

static enum MHD_Result tally_header(void* cls, enum MHD_ValueKind kind, const char* key, const char* value) {
    (void)kind;
    header_tally* t = cls;
    t->count++;
    t->bytes += strlen(key) + (value ? strlen(value) : 0);
    return MHD_YES;
}

static enum MHD_Result access_handler(void* cls, struct MHD_Connection* connection, const char* url, const char* method,
                                      const char* version, const char* upload_data, size_t* upload_data_size,
                                      void** request_state) {
    (void)version;
    server* s = cls;
    connection_state* cs = *request_state;
    bool is_post = strcmp(method, "POST") == 0;
    serve_endpoint endpoint = SERVE_COMPLETIONS;
    bool generation = false;
    if (strcmp(url, "/v1/completions") == 0)
        generation = true;
    else if (strcmp(url, "/v1/chat/completions") == 0)
        generation = true, endpoint = SERVE_CHAT;
    if (!cs) { // the first call: headers only
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        *request_state = cs;
        header_tally tally = {0};
        MHD_get_connection_values(connection, MHD_HEADER_KIND, tally_header, &tally);
        if (tally.count > s->config.max_header_count || tally.bytes > s->config.max_header_bytes) {
            cs->answered = true;
            return respond_fail(s, connection, 431, "invalid_request_error", NULL,
                                "headers: %d headers of %zu bytes, the limit is %d headers and %zu bytes", tally.count,
                                tally.bytes, s->config.max_header_count, s->config.max_header_bytes);
        }
        const char* length = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (length && strtoull(length, NULL, 10) > s->config.max_body_bytes) {
            cs->answered = true;
            return respond_fail(s, connection, 413, "invalid_request_error", NULL,
                                "body: %s bytes, the limit is %zu bytes (--max-body)", length,
                                s->config.max_body_bytes);
        }
        if (!generation || !is_post) {
            cs->answered = true;
            bool get = strcmp(method, "GET") == 0;
            if (strcmp(url, "/health") == 0 && get) return handle_health(s, connection);
            if (strcmp(url, "/v1/models") == 0 && get) return handle_models(s, connection);
            if (strcmp(url, "/metrics") == 0 && get) return handle_metrics(s, connection);
            if (generation || strcmp(url, "/health") == 0 || strcmp(url, "/v1/models") == 0 ||
                strcmp(url, "/metrics") == 0)
                return respond_fail(s, connection, 405, "invalid_request_error", NULL,
                                    "%s: method %s not allowed (use %s)", url, method, generation ? "POST" : "GET");
            return respond_fail(s, connection, 404, "invalid_request_error", NULL,
                                "%s %s: no such endpoint (POST /v1/completions, POST /v1/chat/completions, GET "
                                "/v1/models, GET /health, GET /metrics)",
                                method, url);
        }
        return MHD_YES;
    }
    if (*upload_data_size > 0) { // a piece of the body
        if (!cs->body_too_large && cs->body_bytes + *upload_data_size > s->config.max_body_bytes)
            cs->body_too_large = true; // a chunked body: read to its end, then answer 413
        if (!cs->body_too_large) {
            if (cs->body_bytes + *upload_data_size + 1 > cs->body_capacity) {
                size_t capacity = (cs->body_bytes + *upload_data_size + 1) * 2;
                if (capacity > s->config.max_body_bytes + 1) capacity = s->config.max_body_bytes + 1;
                char* body = realloc(cs->body, capacity);
                if (!body) return MHD_NO;
                cs->body = body;
                cs->body_capacity = capacity;
            }
            memcpy(cs->body + cs->body_bytes, upload_data, *upload_data_size);
            cs->body_bytes += *upload_data_size;
            cs->body[cs->body_bytes] = '\0';
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (cs->answered) return MHD_YES;
    cs->answered = true;
    if (cs->body_too_large)
        return respond_fail(s, connection, 413, "invalid_request_error", NULL,
                            "body: more than %zu bytes, the limit (--max-body)", s->config.max_body_bytes);
    return handle_generation(s, connection, endpoint, cs);
}

static void request_completed(void* cls, struct MHD_Connection* connection, void** request_state,
                              enum MHD_RequestTerminationCode code) {
    (void)cls, (void)connection, (void)code;
    connection_state* cs = *request_state;
    if (!cs) return;
    free(cs->body);
    free(cs);
    *request_state = NULL;
}

static void connection_notified(void* cls, struct MHD_Connection* connection, void** socket_state,
                                enum MHD_ConnectionNotificationCode code) {
    (void)connection, (void)socket_state;
    server* s = cls;
    pthread_mutex_lock(&s->lock);
    s->connections += code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1;
    pthread_mutex_unlock(&s->lock);
}

static void log_mhd(void* cls, const char* format, va_list args) {
    (void)cls;
    // libmicrohttpd reports every client's misbehaviour (a closed socket, a
    // timeout); those are the client's problem, not the server's.
    (void)format, (void)args;
}

// ---- start and stop ---------------------------------------------------------------------

int server_port(const server* s) { return s->port; }

void server_stop(server* s) {
    if (!s) return;
    if (s->config.external_stepping && s->engine_ready) { // no engine thread to fail what is in flight
        pthread_mutex_lock(&s->lock);
        s->stopping = true;
        fail_in_flight(s);
        pthread_mutex_unlock(&s->lock);
    }
    if (s->engine_thread_started) {
        pthread_mutex_lock(&s->lock);
        s->stopping = true;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->engine_thread, NULL);
    }
    if (s->daemon) MHD_stop_daemon(s->daemon);
    if (s->engine_ready) engine_free(&s->engine);
    step_record_free(&s->queues_now);
    for (int i = 0; i < s->capture_capacity; i++)
        free(s->captures[i].row);
    free(s->captures);
    free(s->capture_wanted);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->progress);
    free(s);
}

int server_start(server** out, const model* m, const tokenizer* tok, const engine_config* engine_settings,
                 const serve_config* config, error_info* err) {
    *out = NULL;
    server* s = calloc(1, sizeof *s);
    if (!s) return error_set(err, "out of memory");
    s->model = m;
    s->tok = tok;
    s->config = *config;
    snprintf(s->model_name, sizeof s->model_name, "%s", config->model_name ? config->model_name : "servelab");
    snprintf(s->host, sizeof s->host, "%s", config->host ? config->host : "127.0.0.1");
    s->limits = (serve_limits){.model_name = s->model_name,
                               .vocab_size = m->config.vocab_size,
                               .context_tokens = m->config.max_seq_len,
                               .max_n = engine_settings->max_seqs}; // pool_tokens: once the engine exists
    s->metrics.ttft.bounds = TTFT_BOUNDS;
    s->metrics.tpot.bounds = TPOT_BOUNDS;
    s->metrics.e2e.bounds = E2E_BOUNDS;
    s->id_salt = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->progress, NULL);
    if (engine_init(&s->engine, m, engine_settings, err)) {
        server_stop(s);
        return -1;
    }
    s->engine_ready = true;
    int64_t pool_slots = engine_pool_slots(&s->engine);
    s->limits.pool_tokens = pool_slots > INT_MAX ? INT_MAX : (int)pool_slots;
    engine_set_logits_observer(&s->engine, capture_logits, s);
    measure(s);

    struct sockaddr_storage address;
    memset(&address, 0, sizeof address);
    struct sockaddr_in* v4 = (struct sockaddr_in*)&address;
    struct sockaddr_in6* v6 = (struct sockaddr_in6*)&address;
    unsigned int flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (inet_pton(AF_INET, s->host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)config->port);
    } else if (inet_pton(AF_INET6, s->host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)config->port);
        flags |= MHD_USE_IPv6;
    } else {
        error_set(err, "--host %s: expected a numeric IPv4 or IPv6 address (e.g. 127.0.0.1)", s->host);
        server_stop(s); // after the message: it names s->host
        return -1;
    }
    if (!config->external_stepping) {
        if (pthread_create(&s->engine_thread, NULL, engine_thread_main, s)) {
            server_stop(s);
            return error_set(err, "cannot start the engine thread");
        }
        s->engine_thread_started = true;
    }
    // The connection memory holds the request line, the headers and body
    // pieces: 64 KiB lets our own limits (max_header_bytes) speak first with
    // a JSON error; a flood past 64 KiB gets libmicrohttpd's 431.
    s->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, access_handler, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr*)&address,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)config->read_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned int)config->max_connections, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)(config->max_header_bytes * 2 + (48u << 10)), MHD_OPTION_NOTIFY_COMPLETED, request_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, connection_notified, s, MHD_OPTION_EXTERNAL_LOGGER, log_mhd, s,
        MHD_OPTION_END); // no MHD_OPTION_LISTENING_ADDRESS_REUSE: that is SO_REUSEPORT on Linux, and a
                         // second server on the port then shared its clients with the first
    if (!s->daemon) {
        int port = config->port;
        server_stop(s);
        return error_set(err, "cannot listen on %s port %d: the port is in use (another server?) or the address "
                         "is not this machine's", config->host, port);
    }
    const union MHD_DaemonInfo* info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : config->port;
    *out = s;
    return 0;
}
