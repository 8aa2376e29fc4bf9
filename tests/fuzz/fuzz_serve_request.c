// fuzz_serve_request: a request's way through `servelab serve` with the
// engine stubbed: the JSON body (serve_parse_request), the job it becomes
// (job_new), the tokens a made-up engine produces for each choice
// (choice_publish: text, stop strings, finish), the server-sent events a
// stream gets (stream_collect) and the final JSON (serve_completion_json).
//
// Input: byte 0 picks the endpoint (bit 0: chat); the body runs to the
// first NUL; the bytes after it are the engine's script, two bytes a step:
// the choice that moves and what it does (a token, or the engine ending it).
//
// Promises checked: a refused body has a 4xx status and a message; an
// accepted one is within the limits; a choice's text never holds a stop
// string once it has stopped, and never shows more than it has; every
// stream is well framed and ends with exactly one "data: [DONE]"; the
// final JSON exists. Bugs of this kind it would have found: strstr on a
// NULL text (a stop string before any text), and a stream that never
// ended when a stop string cut the newest token's text.
//
// Seeds: written at start-up into the run's corpus folder (none committed).
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "lab/serve/internal.h"
#include "tests/fuzz/support.h"

int LLVMFuzzerInitialize(int* argc, char*** argv);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

enum { CONTEXT_TOKENS = 96, POOL_TOKENS = 64, MAX_N = 4, MAX_STEPS = 2048 };
enum { STREAM_CAPACITY = 1 << 20 }; // SSE bytes kept for the framing check; more are only counted

static const char* const SEEDS[] = {
    "{\"model\":\"fuzz\",\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"stream\":true,\"stop\":[\",\"]}",
    "{\"model\":\"fuzz\",\"prompt\":\"Hi\",\"max_tokens\":30,\"n\":3,\"stream\":true,\"stop\":[\"ab\",\"b\",\"zzz\"],"
    "\"logprobs\":2,\"return_token_ids\":true,\"stream_options\":{\"include_usage\":true}}",
    "{\"model\":\"fuzz\",\"prompt\":[1,70,71],\"max_tokens\":8,\"echo\":true,\"logprobs\":5}",
    "{\"model\":\"fuzz\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
    "\"content\":\"Tell me\"}],\"stream\":true,\"logprobs\":true,\"top_logprobs\":20,\"stop\":\"\\n\"}",
    "{\"model\":\"fuzz\",\"prompt\":\"x\",\"temperature\":1e-46,\"top_p\":1e-46,\"max_tokens\":95}",
};

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    const char* folder = fuzz_seed_folder(*argc, *argv);
    if (!folder) return 0;
    for (size_t i = 0; i < sizeof SEEDS / sizeof SEEDS[0]; i++) {
        fuzz_buffer b = {NULL, 0, 0};
        uint8_t endpoint = strstr(SEEDS[i], "\"messages\"") ? 1 : 0;
        fuzz_put(&b, &endpoint, 1);
        fuzz_put(&b, SEEDS[i], strlen(SEEDS[i]) + 1); // with its NUL: the script follows
        static const uint8_t SCRIPT[] = {0, 'O' + 3, 1, 'n' + 3, 0, ',' + 3, 2, 'a' + 3, 2, 'b' + 3, 1, ',' + 3,
                                         0, 'x' + 3, 0xc0, 0, 1, '\n' + 3, 2, 0xff};
        fuzz_put(&b, SCRIPT, sizeof SCRIPT);
        char name[32];
        snprintf(name, sizeof name, "seed-%zu.bin", i);
        fuzz_write_seed(folder, name, b.bytes, b.size);
        free(b.bytes);
    }
    return 0;
}

// A parsed request stays within what the server allows.
static void check_params(const serve_params* p, int vocab_size) {
    FUZZ_CHECK(p->n >= 1 && p->n <= MAX_N);
    FUZZ_CHECK(p->n_prompt >= 1 && p->max_tokens >= 1 && p->n_prompt + p->max_tokens <= CONTEXT_TOKENS);
    for (int i = 0; i < p->n_prompt; i++)
        FUZZ_CHECK(p->prompt[i] >= 0 && p->prompt[i] < vocab_size);
    FUZZ_CHECK(p->temperature >= 0.0f && p->temperature <= 2.0f);
    FUZZ_CHECK(p->top_p > 0.0f && p->top_p <= 1.0f); // 1e-46 must not become 0 (= off)
    FUZZ_CHECK(p->n_stops >= 0 && p->n_stops <= SERVE_MAX_STOPS);
    for (int k = 0; k < p->n_stops; k++)
        FUZZ_CHECK(strlen(p->stops[k]) >= 1 && strlen(p->stops[k]) <= SERVE_MAX_STOP_BYTES);
    FUZZ_CHECK(p->logprobs >= -1 && p->logprobs <= SERVE_MAX_TOP_LOGPROBS);
}

// A choice's text after a step: NUL-terminated, the ready part within it,
// the sent part within that, and no stop string once a stop string ended it.
static void check_choice(const serve_choice* c, const serve_params* p, bool stopped_by_string) {
    FUZZ_CHECK(c->text != NULL && strlen(c->text) <= c->text_bytes && c->text[c->text_bytes] == '\0');
    FUZZ_CHECK(c->text_ready <= c->text_bytes && c->text_sent <= c->text_ready);
    FUZZ_CHECK(c->tokens_sent <= c->n_tokens && c->n_tokens <= p->max_tokens);
    if (stopped_by_string)
        for (int k = 0; k < p->n_stops; k++)
            FUZZ_CHECK(memmem(c->text, c->text_bytes, p->stops[k], strlen(p->stops[k])) == NULL);
}

// What a stream sent so far: kept (up to STREAM_CAPACITY) to check its framing.
typedef struct stream_log {
    char* bytes; // (STREAM_CAPACITY)
    size_t size;
    int n_done; // "data: [DONE]" events seen
} stream_log;

// Takes what stream_collect put in st->out, as stream_read would hand it to a client.
static void drain(stream_state* st, stream_log* log) {
    for (const char* at = st->out; at && at < st->out + st->out_bytes;) {
        const char* end = memmem(at, (size_t)(st->out + st->out_bytes - at), "\n\n", 2);
        FUZZ_CHECK(end != NULL);                 // every event ends with a blank line
        FUZZ_CHECK(strncmp(at, "data: ", 6) == 0); // and is a data event
        FUZZ_CHECK(log->n_done == 0);            // nothing after [DONE]
        if ((size_t)(end - at) == strlen("data: [DONE]") && strncmp(at, "data: [DONE]", 12) == 0) log->n_done++;
        at = end + 2;
    }
    size_t keep = st->out_bytes < STREAM_CAPACITY - log->size ? st->out_bytes : STREAM_CAPACITY - log->size;
    if (keep) memcpy(log->bytes + log->size, st->out, keep);
    log->size += keep;
    st->out_bytes = st->out_sent = 0;
}

// One step of the made-up engine for choice `index`: a new token (id from
// `arg`), or, with the top bits of `what` set, the engine ending it (EOS).
// Returns -1 when the choice cannot move (finished, or out of room).
static int engine_step_choice(server* s, serve_job* job, int index, uint8_t what, uint8_t arg, int32_t* tokens,
                              int* n_generated, bool* stopped_by_string) {
    serve_choice* c = &job->choices[index];
    if (c->finish != FINISH_NONE) return 0;
    const serve_params* p = &job->params;
    bool eos = (what & 0xc0) == 0xc0;
    if (!eos) tokens[p->n_prompt + (*n_generated)++] = (int32_t)(arg % tok_vocab_size(s->tok));
    bool full = *n_generated >= p->max_tokens;
    step_sequence_status q = {
        .id = index,
        .request_id = 0,
        .sample_index = index,
        .state = eos || full ? SEQ_FINISHED : SEQ_DECODE,
        .stop = eos ? STOP_EOS : STOP_LENGTH,
        .tokens = tokens,
        .n_tokens = p->n_prompt + *n_generated,
        .n_prompt = p->n_prompt,
        .fork_parent = -1,
    };
    int published = choice_publish(s, job, c, &q);
    if (published < 0) return -1;
    *stopped_by_string |= published == 1;
    check_choice(c, p, *stopped_by_string);
    return 0;
}

static void run_job(server* s, serve_job* job, const uint8_t* script, size_t script_size) {
    const serve_params* p = &job->params;
    job->state = JOB_RUNNING;
    job->refs = 1;
    int32_t* tokens[MAX_N] = {0}; // (n_prompt + max_tokens) each: prompt, then what the engine made
    int n_generated[MAX_N] = {0};
    bool stopped_by_string[MAX_N] = {false};
    stream_state st = {.server = s, .job = job, .socket = -1};
    stream_log log = {malloc(STREAM_CAPACITY), 0, 0};
    bool ok = log.bytes != NULL;
    for (int i = 0; ok && i < p->n; i++) {
        tokens[i] = malloc((size_t)(p->n_prompt + p->max_tokens) * sizeof *tokens[i]);
        if (tokens[i]) memcpy(tokens[i], p->prompt, (size_t)p->n_prompt * sizeof *tokens[i]);
        ok = tokens[i] != NULL;
    }
    for (size_t at = 0; ok && at + 1 < script_size && at / 2 < MAX_STEPS; at += 2) {
        int index = script[at] % p->n;
        ok = engine_step_choice(s, job, index, script[at], script[at + 1], tokens[index], &n_generated[index],
                                &stopped_by_string[index]) == 0;
        if (job->n_finished == p->n) job->state = JOB_DONE;
        if (ok && p->stream) {
            ok = stream_collect(&st) == 0;
            if (ok) drain(&st, &log);
        }
    }
    // The engine runs every choice to its end (max_tokens at most).
    for (int i = 0; ok && i < p->n; i++)
        while (ok && job->choices[i].finish == FINISH_NONE)
            ok = engine_step_choice(s, job, i, 0, 'a', tokens[i], &n_generated[i], &stopped_by_string[i]) == 0;
    if (ok) {
        FUZZ_CHECK(job->n_finished == p->n);
        job->state = JOB_DONE;
        if (p->stream && stream_collect(&st) == 0) {
            drain(&st, &log);
            FUZZ_CHECK(st.done && log.n_done == 1); // every stream ends, once
        }
        json_t* body = serve_completion_json(s, job);
        char* text = body ? json_dumps(body, JSON_COMPACT) : NULL;
        FUZZ_CHECK(body == NULL || text != NULL);
        free(text);
        json_decref(body);
    }
    for (int i = 0; i < MAX_N; i++)
        free(tokens[i]);
    free(st.out);
    free(log.bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static tokenizer* tok; // read-only after the first run: the byte-level vocabulary
    error_info err = {{0}};
    if (!tok && tok_byte_level(&tok, &err)) return 0;
    if (size < 1) return 0;
    serve_endpoint endpoint = data[0] & 1 ? SERVE_CHAT : SERVE_COMPLETIONS;
    const uint8_t* body = data + 1;
    const uint8_t* nul = memchr(body, 0, size - 1);
    size_t body_size = nul ? (size_t)(nul - body) : size - 1;
    char* body_text = malloc(body_size + 1);
    if (!body_text) return 0;
    memcpy(body_text, body, body_size);
    body_text[body_size] = '\0';
    const uint8_t* script = nul ? nul + 1 : data + size;
    size_t script_size = (size_t)(data + size - script);

    serve_limits limits = {.model_name = "fuzz",
                           .vocab_size = tok_vocab_size(tok),
                           .context_tokens = CONTEXT_TOKENS,
                           .pool_tokens = POOL_TOKENS,
                           .max_n = MAX_N};
    serve_params params;
    serve_error error;
    if (serve_parse_request(endpoint, body_text, body_size, &limits, tok, &params, &error) != 0) {
        FUZZ_CHECK(error.http_status >= 400 && error.http_status < 500 && error.message[0] != '\0');
        char* json = serve_error_json(&error);
        FUZZ_CHECK(json != NULL);
        free(json);
        serve_params_free(&params);
        free(body_text);
        return 0;
    }
    free(body_text);
    check_params(&params, limits.vocab_size);
    serve_job* job = job_new(&params);
    serve_params_free(&params);
    server* s = calloc(1, sizeof *s);
    if (job && s) {
        s->tok = tok;
        snprintf(s->model_name, sizeof s->model_name, "fuzz");
        s->limits = limits;
        serve_metrics_init(&s->metrics);
        run_job(s, job, script, script_size);
    }
    if (job) job_free(job);
    free(s);
    return 0;
}
