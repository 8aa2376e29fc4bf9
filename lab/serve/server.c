// serve: the OpenAI-compatible server (libmicrohttpd for HTTP, Jansson for
// JSON, one engine thread): the engine loop, external stepping, start and
// stop. The other nouns have a file each; the locking invariant they share
// is in lab/serve/internal.h.
#include "lab/serve/server.h"

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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lab/serve/internal.h"

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

void server_measure(server* s) {
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

// One round of the engine loop, lock held (dropped during engine_step):
// admit and cancel, step when there is work, server_publish. *stepped tells
// whether a step ran. -1 when the step failed: the engine's state is then
// not to be trusted, so everything in flight has failed and the server is
// stopping (err says why).
static int serve_round(server* s, bool* stepped, error_info* err) {
    *stepped = false;
    s->work_pending = false;
    jobs_admit_and_cancel(s);
    server_measure(s);
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
    serve_metrics_count_speculation(&s->metrics, record);
    server_measure(s);
    server_publish(s);
    server_measure(s);
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
    serve_metrics_init(&s->metrics);
    s->metrics.speculative = engine_settings->speculative.kind != SPEC_NONE;
    s->metrics.spec_k = engine_settings->speculative.k;
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
    server_measure(s);

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
        flags, 0, NULL, NULL, serve_access_handler, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr*)&address,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)config->read_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned int)config->max_connections, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)(config->max_header_bytes * 2 + (48u << 10)), MHD_OPTION_NOTIFY_COMPLETED, serve_request_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, serve_connection_notified, s, MHD_OPTION_EXTERNAL_LOGGER, serve_log_mhd, s,
        MHD_OPTION_END); // no MHD_OPTION_LISTENING_ADDRESS_REUSE: that is SO_REUSEPORT on Linux, and a
                         // second server on the port then shared its clients with the first
    if (!s->daemon) {
        int port = config->port;
        server_stop(s);
        return error_set(err,
                         "cannot listen on %s port %d: the port is in use (another server?) or the address "
                         "is not this machine's",
                         config->host, port);
    }
    const union MHD_DaemonInfo* info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : config->port;
    *out = s;
    return 0;
}
