// serve responses: HTTP answers, errors, and the JSON of a finished job.
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

enum MHD_Result serve_respond_text(struct MHD_Connection* connection, int status, const char* content_type,
                                   const char* body) {
    struct MHD_Response* response = MHD_create_response_from_buffer(strlen(body), (void*)body, MHD_RESPMEM_MUST_COPY);
    if (!response) return MHD_NO;
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    enum MHD_Result result = MHD_queue_response(connection, (unsigned int)status, response);
    MHD_destroy_response(response);
    return result;
}

enum MHD_Result serve_respond_json(struct MHD_Connection* connection, int status, json_t* body) {
    char* text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text)
        return serve_respond_text(connection, 500, "application/json",
                                  "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
    enum MHD_Result result = serve_respond_text(connection, status, "application/json", text);
    free(text);
    return result;
}

enum MHD_Result serve_respond_error(server* s, struct MHD_Connection* connection, const serve_error* error) {
    pthread_mutex_lock(&s->lock);
    s->metrics.rejected++;
    pthread_mutex_unlock(&s->lock);
    char* text = serve_error_json(error);
    enum MHD_Result result = serve_respond_text(connection, error->http_status, "application/json", text);
    free(text);
    return result;
}

enum MHD_Result serve_respond_fail(server* s, struct MHD_Connection* connection, int status, const char* type,
                                   const char* param, const char* format, ...) __attribute__((format(printf, 6, 7)));

enum MHD_Result serve_respond_fail(server* s, struct MHD_Connection* connection, int status, const char* type,
                                   const char* param, const char* format, ...) {
    serve_error error;
    char message[sizeof error.message];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    serve_fail(&error, status, type, param, "%s", message);
    return serve_respond_error(s, connection, &error);
}

json_t* serve_text_json(const char* text, size_t bytes) {
    char* clean = serve_utf8_sanitize(text, bytes);
    json_t* value = clean ? json_string(clean) : NULL;
    free(clean);
    return value ? value : json_string("");
}

json_t* serve_token_ids_json(const int32_t* ids, int n) {
    json_t* array = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(array, json_integer(ids[i]));
    return array;
}

// The text of token id after `previous` ("" for a control token, as in the text).
const char* serve_piece_of(server* s, int32_t previous, int32_t id) {
    if (!s->tok) return "";
    const char* piece = tok_decode_piece(s->tok, previous, id);
    return tok_piece_is_printable(piece) ? piece : "";
}

// Completions with echo: the prompt's text (after BOS), malloc'ed.
char* serve_prompt_text(server* s, const serve_job* job) {
    if (!s->tok || job->params.n_prompt < 2) return strdup("");
    size_t bytes =
        tok_decode_text(s->tok, job->params.prompt[0], job->params.prompt + 1, job->params.n_prompt - 1, NULL, 0);
    char* text = malloc(bytes + 1);
    if (text)
        tok_decode_text(s->tok, job->params.prompt[0], job->params.prompt + 1, job->params.n_prompt - 1, text,
                        bytes + 1);
    return text;
}

const char* serve_finish_name(finish_kind finish) {
    return finish == FINISH_STOP     ? "stop"
           : finish == FINISH_LENGTH ? "length"
           : finish == FINISH_ABORT  ? "abort"
                                     : NULL;
}

json_t* serve_usage_json(const serve_job* job) {
    int completion = 0;
    for (int i = 0; i < job->params.n; i++)
        completion += job->choices[i].n_tokens;
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", job->params.n_prompt, "completion_tokens", completion,
                     "total_tokens", job->params.n_prompt + completion);
}

// The whole answer of a finished job (lock held).
json_t* serve_completion_json(server* s, const serve_job* job) {
    bool chat = job->params.endpoint == SERVE_CHAT;
    json_t* choices = json_array();
    char* echo = job->params.echo ? serve_prompt_text(s, job) : NULL;
    for (int i = 0; i < job->params.n; i++) {
        const serve_choice* c = &job->choices[i];
        json_t* choice = json_pack("{s:i, s:o, s:s}", "index", i, "logprobs", logprobs_json(s, job, c, 0, c->n_tokens),
                                   "finish_reason", serve_finish_name(c->finish));
        if (chat)
            json_object_set_new(
                choice, "message",
                json_pack("{s:s, s:o}", "role", "assistant", "content", serve_text_json(c->text, c->text_bytes)));
        else if (echo) {
            size_t echo_bytes = strlen(echo);
            char* joined = malloc(echo_bytes + c->text_bytes + 1);
            if (joined) {
                memcpy(joined, echo, echo_bytes);
                memcpy(joined + echo_bytes, c->text ? c->text : "", c->text_bytes);
                json_object_set_new(choice, "text", serve_text_json(joined, echo_bytes + c->text_bytes));
            }
            free(joined);
        } else
            json_object_set_new(choice, "text", serve_text_json(c->text, c->text_bytes));
        if (job->params.return_token_ids)
            json_object_set_new(choice, "token_ids", serve_token_ids_json(c->tokens, c->n_tokens));
        json_array_append_new(choices, choice);
    }
    free(echo);
    json_t* body = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", job->id, "object",
                             chat ? "chat.completion" : "text_completion", "created", (json_int_t)job->created, "model",
                             s->model_name, "choices", choices, "usage", serve_usage_json(job));
    if (body && job->params.return_token_ids)
        json_object_set_new(body, "prompt_token_ids", serve_token_ids_json(job->params.prompt, job->params.n_prompt));
    return body;
}
