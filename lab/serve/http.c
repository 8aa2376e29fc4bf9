// serve HTTP: libmicrohttpd's access handler, routing each request to
// its endpoint, with the header and body limits of serve_config.
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

typedef struct connection_state {
    char* body; // (body_capacity) the request body so far
    size_t body_bytes;
    size_t body_capacity;
    bool body_too_large;
    bool answered; // a response has been queued
} connection_state;

static int connection_socket(struct MHD_Connection* connection) {
    const union MHD_ConnectionInfo* info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info ? info->connect_fd : -1;
}

// Waits (s->lock held) until the engine has taken the job, or with `done`
// until it has finished. False when the client went away: the job is then
// released and the lock given up.
static bool wait_for_job(server* s, serve_job* job, int socket, bool done) {
    while (done ? job->state != JOB_DONE : job->state == JOB_SUBMITTED)
        if (!serve_wait_progress(s, socket)) {
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
    return serve_respond_error(s, connection, &failure);
}

static enum MHD_Result handle_generation(server* s, struct MHD_Connection* connection, serve_endpoint endpoint,
                                         connection_state* cs) {
    serve_params params;
    serve_error error;
    if (serve_parse_request(endpoint, cs->body ? cs->body : "", cs->body_bytes, &s->limits, s->tok, &params, &error)) {
        serve_params_free(&params);
        return serve_respond_error(s, connection, &error);
    }
    if (!params.seed_given) params.seed = (uint64_t)time(NULL) ^ ((uint64_t)serve_now_s() * 1000003u);
    serve_job* job = job_new(&params);
    serve_params_free(&params);
    if (!job) return serve_respond_fail(s, connection, 500, "server_error", NULL, "out of memory");
    int socket = connection_socket(connection);
    pthread_mutex_lock(&s->lock);
    int refused = job_submit(s, job, endpoint);
    if (refused) {
        int in_flight = s->n_in_flight;
        pthread_mutex_unlock(&s->lock);
        job_free(job);
        if (refused == 503)
            return serve_respond_fail(s, connection, 503, "server_error", NULL, "the server is shutting down");
        return serve_respond_fail(
            s, connection, 429, "rate_limit_error", NULL,
            "server busy: %d requests are queued or running, the limit (--max-queue); retry later", in_flight);
    }
    // The engine takes the job or refuses it (too big for the pool).
    if (!wait_for_job(s, job, socket, false)) return MHD_NO;
    if (job->failed) return respond_job_failure(s, connection, job);
    if (job->params.stream) {
        pthread_mutex_unlock(&s->lock);
        return serve_start_stream(s, connection, job, socket);
    }
    if (!wait_for_job(s, job, socket, true)) return MHD_NO;
    if (job->failed) return respond_job_failure(s, connection, job);
    json_t* body = serve_completion_json(s, job);
    job_release(s, job, true);
    pthread_mutex_unlock(&s->lock);
    return serve_respond_json(connection, 200, body);
}

static enum MHD_Result handle_models(server* s, struct MHD_Connection* connection) {
    json_t* entry =
        json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", s->model_name, "object", "model", "created",
                  (json_int_t)time(NULL), "owned_by", "servelab", "max_model_len", s->limits.context_tokens);
    return serve_respond_json(connection, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", entry));
}

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

enum MHD_Result serve_access_handler(void* cls, struct MHD_Connection* connection, const char* url, const char* method,
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
            return serve_respond_fail(s, connection, 431, "invalid_request_error", NULL,
                                      "headers: %d headers of %zu bytes, the limit is %d headers and %zu bytes",
                                      tally.count, tally.bytes, s->config.max_header_count, s->config.max_header_bytes);
        }
        const char* length = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (length && strtoull(length, NULL, 10) > s->config.max_body_bytes) {
            cs->answered = true;
            return serve_respond_fail(s, connection, 413, "invalid_request_error", NULL,
                                      "body: %s bytes, the limit is %zu bytes (--max-body)", length,
                                      s->config.max_body_bytes);
        }
        if (!generation || !is_post) {
            cs->answered = true;
            bool get = strcmp(method, "GET") == 0;
            if (strcmp(url, "/health") == 0 && get) return serve_handle_health(s, connection);
            if (strcmp(url, "/v1/models") == 0 && get) return handle_models(s, connection);
            if (strcmp(url, "/metrics") == 0 && get) return serve_handle_metrics(s, connection);
            if (generation || strcmp(url, "/health") == 0 || strcmp(url, "/v1/models") == 0 ||
                strcmp(url, "/metrics") == 0)
                return serve_respond_fail(s, connection, 405, "invalid_request_error", NULL,
                                          "%s: method %s not allowed (use %s)", url, method,
                                          generation ? "POST" : "GET");
            return serve_respond_fail(s, connection, 404, "invalid_request_error", NULL,
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
        return serve_respond_fail(s, connection, 413, "invalid_request_error", NULL,
                                  "body: more than %zu bytes, the limit (--max-body)", s->config.max_body_bytes);
    return handle_generation(s, connection, endpoint, cs);
}

void serve_request_completed(void* cls, struct MHD_Connection* connection, void** request_state,
                             enum MHD_RequestTerminationCode code) {
    (void)cls, (void)connection, (void)code;
    connection_state* cs = *request_state;
    if (!cs) return;
    free(cs->body);
    free(cs);
    *request_state = NULL;
}

void serve_connection_notified(void* cls, struct MHD_Connection* connection, void** socket_state,
                               enum MHD_ConnectionNotificationCode code) {
    (void)connection, (void)socket_state;
    server* s = cls;
    pthread_mutex_lock(&s->lock);
    s->connections += code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1;
    pthread_mutex_unlock(&s->lock);
}

void serve_log_mhd(void* cls, const char* format, va_list args) {
    (void)cls;
    // libmicrohttpd reports every client's misbehaviour (a closed socket, a
    // timeout); those are the client's problem, not the server's.
    (void)format, (void)args;
}
