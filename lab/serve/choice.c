// serve choices' text: appending decoded pieces and cutting at the first
// stop string, holding back what could still become one. Pure (no engine,
// no lock of its own): the fuzz harness drives it directly.
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

int choice_append(serve_choice* c, const char* piece) {
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
bool choice_check_stops(serve_choice* c, const serve_params* p, size_t searched_from) {
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

int choice_publish(server* s, serve_job* job, serve_choice* c, const step_sequence_status* q) {
    size_t text_before = c->text_bytes;
    int generated = q->n_tokens - q->n_prompt;
    for (; c->n_tokens < generated && c->n_tokens < job->params.max_tokens; c->n_tokens++) {
        int32_t token = q->tokens[q->n_prompt + c->n_tokens];
        int32_t previous = q->tokens[q->n_prompt + c->n_tokens - 1];
        c->tokens[c->n_tokens] = token;
        if (job->params.logprobs >= 0) choice_record_logprobs(s, job, c, q, c->n_tokens);
        s->metrics.generation_tokens++;
        if (s->tok) {
            const char* piece = tok_decode_piece(s->tok, previous, token);
            if (tok_piece_is_printable(piece) && choice_append(c, piece)) return -1;
        }
    }
    int stopped = 0;
    if (choice_check_stops(c, &job->params, text_before)) {
        c->finish = FINISH_STOP;
        stopped = 1;
    } else if (q->state == SEQ_FINISHED) {
        c->finish = q->stop == STOP_EOS || q->stop == STOP_BOS ? FINISH_STOP : FINISH_LENGTH;
    }
    if (c->finish != FINISH_NONE) {
        c->text_ready = c->text_bytes;
        job->n_finished++;
    }
    return stopped;
}
