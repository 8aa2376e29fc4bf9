// serve logprobs: the logits observer's capture (engine thread, no lock),
// each token's logprob and top k from it, and their JSON.
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

void capture_want(server* s, int32_t id, bool wanted) {
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
void capture_logits(void* user, int32_t id, int position, const float* logits, int vocab_size) {
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
void choice_record_logprobs(server* s, serve_job* job, serve_choice* c, const step_sequence_status* q, int index) {
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

static json_t* bytes_json(const char* piece) {
    json_t* array = json_array();
    for (const unsigned char* b = (const unsigned char*)piece; *b; b++)
        json_array_append_new(array, json_integer(*b));
    return array;
}

static json_t* logprob_number(float value) { return isfinite(value) ? json_real(value) : json_null(); }

// The logprobs of generated tokens [from, to) of choice c: completions'
// {tokens, token_logprobs, top_logprobs, text_offset} or chat's {content}.
json_t* logprobs_json(server* s, const serve_job* job, const serve_choice* c, int from, int to) {
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
        offset += strlen(serve_piece_of(s, i ? c->tokens[i - 1] : prompt[job->params.n_prompt - 1], c->tokens[i]));
    for (int i = from; i < to; i++) {
        int32_t previous = i ? c->tokens[i - 1] : prompt[job->params.n_prompt - 1];
        const char* piece = serve_piece_of(s, previous, c->tokens[i]);
        json_t* alternatives = chat ? json_array() : json_object();
        for (int j = 0; j < k; j++) {
            int32_t id = c->top_ids[i * k + j];
            if (id < 0) continue;
            const char* alternative = serve_piece_of(s, previous, id);
            if (chat)
                json_array_append_new(alternatives, json_pack("{s:o, s:o, s:o}", "token",
                                                              serve_text_json(alternative, strlen(alternative)),
                                                              "logprob", logprob_number(c->top_logprobs[i * k + j]),
                                                              "bytes", bytes_json(alternative)));
            else {
                char* key = serve_utf8_sanitize(alternative, strlen(alternative));
                if (key && !json_object_get(alternatives, key)) // two ids may print alike: keep the likelier
                    json_object_set_new(alternatives, key, logprob_number(c->top_logprobs[i * k + j]));
                free(key);
            }
        }
        if (chat)
            json_array_append_new(content,
                                  json_pack("{s:o, s:o, s:o, s:o}", "token", serve_text_json(piece, strlen(piece)),
                                            "logprob", logprob_number(c->token_logprobs[i]), "bytes", bytes_json(piece),
                                            "top_logprobs", alternatives));
        else {
            json_array_append_new(tokens, serve_text_json(piece, strlen(piece)));
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
