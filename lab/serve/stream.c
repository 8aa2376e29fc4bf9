// serve streams: server-sent events as the engine makes tokens.
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
        if (text) json_object_set_new(delta, "content", serve_text_json(text, bytes));
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", serve_text_json(text ? text : "", text ? bytes : 0));
    }
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    if (job->params.return_token_ids && ids) json_object_set_new(choice, "token_ids", serve_token_ids_json(ids, n_ids));
    return choice;
}

// Turns whatever the job has that the client has not seen into SSE events
// (lock held). Returns -1 when out of memory.
int stream_collect(stream_state* st) {
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
            char* echo = serve_prompt_text(s, job);
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
                                      ? choice_chunk(job, i, NULL, 0, NULL, serve_finish_name(c->finish), NULL, 0, NULL)
                                      : choice_chunk(job, i, "", 0, NULL, serve_finish_name(c->finish), NULL, 0, NULL));
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
            json_object_set_new(chunk, "usage", serve_usage_json(job));
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
        // libmicrohttpd closes a connection that sent nothing for the read
        // timeout, counting the time this callback waits: a stream queued,
        // or paused by `lab --serve`, for 2.5 s with a 1 s timeout was cut
        // without [DONE]. An SSE comment (which clients ignore) at half the
        // timeout keeps it open; a client that stops reading still times out.
        double keep_alive_s = s->config.read_timeout_s > 0 ? 0.5 * s->config.read_timeout_s : 0.0;
        double waiting_since = serve_now_s();
        pthread_mutex_lock(&s->lock);
        for (;;) {
            if (stream_collect(st)) {
                pthread_mutex_unlock(&s->lock);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            if (st->out_bytes > 0) break;
            if (keep_alive_s > 0 && serve_now_s() - waiting_since >= keep_alive_s) {
                if (out_append(st, ": keep-alive\n\n")) {
                    pthread_mutex_unlock(&s->lock);
                    return MHD_CONTENT_READER_END_WITH_ERROR;
                }
                break;
            }
            if (!serve_wait_progress(s, st->socket)) {
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

// stream: true. The events go out as the engine makes them (stream_read);
// the connection's reference to the job passes to the stream.
enum MHD_Result serve_start_stream(server* s, struct MHD_Connection* connection, serve_job* job, int socket) {
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
