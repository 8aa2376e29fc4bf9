// serve jobs: one request each, from its parsing to its last reference;
// admission into the engine, publishing what each step produced, retiring.
// Locking: lab/serve/internal.h.
#include "lab/serve/internal.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double serve_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void job_free(serve_job* job) {
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
void job_release(server* s, serve_job* job, bool connection) {
    if (connection && job->state != JOB_DONE && !job->abandoned) {
        job->abandoned = true;
        s->work_pending = true;
        pthread_cond_signal(&s->work);
    }
    if (--job->refs == 0) job_free(job);
}

// Removes a done job from the list (lock held) and drops the engine's reference.
// Its sequences leave the engine's memory: server_publish() has copied every token
// the client gets, and a server that kept them grew 4.3 KB a request on
// stories260K (39 -> 48 -> 57 MB RSS per 2,000 requests).
void job_retire(server* s, serve_job* job, finish_kind outcome) {
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
    double now = serve_now_s();
    if (outcome == FINISH_ABORT)
        s->metrics.finished_abort++;
    else if (job->failed)
        s->metrics.finished_error++;
    else {
        serve_histogram_observe(&s->metrics.e2e, now - job->submit_s);
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

void job_fail(server* s, serve_job* job, int http_status, const char* type, const char* message) {
    job->failed = true;
    serve_fail(&job->error, http_status, type, NULL, "%s", message);
    job_retire(s, job, FINISH_NONE);
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
void jobs_admit_and_cancel(server* s) {
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
        request_params request = {p->prompt, p->n_prompt, p->max_tokens, p->n,         p->temperature,
                                  p->top_p,  p->seed,     0.0,           p->ignore_eos};
        error_info err = {{0}};
        int32_t first = -1;
        if (engine_add_request(&s->engine, &request, &first, &err)) {
            job_fail(s, job, 400, "invalid_request_error", err.message);
            continue;
        }
        // Known now, so that a cancel before the next server_publish finds them:
        // sample 0 (paged: the others fork off it later, and server_publish()
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

// Copies what the last step produced into the jobs (lock held).
void server_publish(server* s) {
    engine* e = &s->engine;
    // Forks appear once their parent's prompt is computed; they are found
    // among the live sequences (server_measure() has just read them), by request.
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
    double now = serve_now_s();
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
            int tokens_before = c->n_tokens;
            int published = choice_publish(s, job, c, &q);
            if (published < 0) {
                cancel_job_sequences(s, job);
                job_fail(s, job, 500, "server_error", "out of memory while decoding the completion");
                goto next_job;
            }
            produced |= c->n_tokens > tokens_before;
            if (published == 1) { // a stop string ended it
                error_info err = {{0}};
                engine_cancel_sequence(e, c->sequence_id, &err);
            }
        }
        if (produced) {
            if (job->first_token_s == 0)
                serve_histogram_observe(&s->metrics.ttft, now - job->submit_s);
            else
                serve_histogram_observe(&s->metrics.tpot, now - job->last_token_s);
            if (job->first_token_s == 0) job->first_token_s = now;
            job->last_token_s = now;
        }
        if (job->n_finished == job->params.n) job_retire(s, job, FINISH_NONE);
    next_job:;
    }
}

// True when the client closed its end (or the socket failed).
static bool client_gone(int socket) {
    if (socket < 0) return false;
    struct pollfd p = {.fd = socket, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

// Waits up to 50 ms for progress (lock held); false when the client is gone.
bool serve_wait_progress(server* s, int socket) {
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

serve_job* job_new(serve_params* params) {
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
        if (!c->tokens || !c->text ||
            (job->params.logprobs >= 0 && (!c->token_logprobs || !c->top_ids || !c->top_logprobs))) {
            job_free(job);
            return NULL;
        }
    }
    job->created = (long long)time(NULL);
    job->submit_s = serve_now_s();
    return job;
}

// Puts job on the engine thread's queue (s->lock held): 0, or the HTTP
// status that refuses it (503 while shutting down, 429 with the queue full).
int job_submit(server* s, serve_job* job, serve_endpoint endpoint) {
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
