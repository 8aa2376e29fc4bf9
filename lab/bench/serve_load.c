#include "lab/bench/serve_load.h"

#include <ctype.h>
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lab/common/seeded_random.h"
#include "lab/bench/workload.h"

// ---- lengths -------------------------------------------------------------------

// Lengths above this are refused: no served model here has a longer context,
// and a typo like 1e9 would otherwise allocate gigabytes of prompt.
enum { BENCH_MAX_LENGTH = 1 << 20 };

int bench_length_parse(const char* flag, const char* text, bench_length* out, error_info* err) {
    double a = 0, b = 0;
    char tail;
    bool ok = false;
    if (sscanf(text, "%lf%c", &a, &tail) == 1 && isdigit((unsigned char)text[0]) && a == floor(a) && a >= 1)
        *out = (bench_length){BENCH_LENGTH_FIXED, a, 0}, ok = true;
    else if (sscanf(text, "fixed:%lf%c", &a, &tail) == 1 && a == floor(a) && a >= 1)
        *out = (bench_length){BENCH_LENGTH_FIXED, a, 0}, ok = true;
    else if (sscanf(text, "uniform:%lf:%lf%c", &a, &b, &tail) == 2 && a >= 1 && b >= a)
        *out = (bench_length){BENCH_LENGTH_UNIFORM, a, b}, ok = true;
    else if (sscanf(text, "normal:%lf:%lf%c", &a, &b, &tail) == 2 && a >= 1 && b >= 0)
        *out = (bench_length){BENCH_LENGTH_NORMAL, a, b}, ok = true;
    else if (sscanf(text, "lognormal:%lf:%lf%c", &a, &b, &tail) == 2 && a >= 1 && b >= 0)
        *out = (bench_length){BENCH_LENGTH_LOGNORMAL, a, b}, ok = true;
    if (ok && isfinite(a) && isfinite(b) && a <= BENCH_MAX_LENGTH && b <= BENCH_MAX_LENGTH) return 0;
    return error_set(err,
                     "%s: expected N, uniform:LOW:HIGH, normal:MEAN:SD or lognormal:MEAN:SD (tokens, 1..%d), "
                     "found '%s'",
                     flag, BENCH_MAX_LENGTH, text);
}

static int draw_length(const bench_length* d, uint64_t* state) {
    double value = d->a;
    if (d->kind == BENCH_LENGTH_UNIFORM) {
        value = d->a + floor(seeded_unit(state) * (d->b - d->a + 1.0));
        if (value > d->b) value = d->b;
    } else if (d->kind == BENCH_LENGTH_NORMAL) {
        value = d->a + d->b * seeded_normal(state);
    } else if (d->kind == BENCH_LENGTH_LOGNORMAL) {
        // Lengths with mean m and standard deviation s: the underlying normal
        // has sigma^2 = ln(1 + s^2/m^2) and mu = ln(m) - sigma^2 / 2.
        double sigma2 = log(1.0 + (d->b * d->b) / (d->a * d->a));
        value = exp(log(d->a) - sigma2 / 2.0 + sqrt(sigma2) * seeded_normal(state));
    }
    if (value > BENCH_MAX_LENGTH) value = BENCH_MAX_LENGTH;
    int length = (int)llround(value);
    return length < 1 ? 1 : length;
}

// ---- the workload ----------------------------------------------------------------

void bench_workload_free(bench_workload* w) {
    for (int i = 0; i < w->n_requests; i++)
        free(w->requests[i].prompt);
    free(w->requests);
    memset(w, 0, sizeof *w);
}

int bench_workload_generate(bench_workload* out, const bench_workload_spec* spec, error_info* err) {
    memset(out, 0, sizeof *out);
    if (spec->n_requests < 1) return error_set(err, "--requests: expected at least 1, found %d", spec->n_requests);
    if (spec->vocab_size < 4) return error_set(err, "--vocab: expected at least 4, found %d", spec->vocab_size);
    if (spec->shared_prefix < 0 || spec->shared_prefix > BENCH_MAX_LENGTH)
        return error_set(err, "--shared-prefix: expected 0..%d tokens, found %d", BENCH_MAX_LENGTH,
                         spec->shared_prefix);
    out->requests = calloc((size_t)spec->n_requests, sizeof *out->requests);
    int32_t* prefix = malloc((size_t)(spec->shared_prefix + 1) * sizeof *prefix);
    if (!out->requests || !prefix) {
        free(prefix);
        free(out->requests);
        out->requests = NULL;
        return error_set(err, "workload: out of memory");
    }
    uint64_t state = spec->seed ^ 0xBE5CBE5CBE5Cull;
    const uint64_t id_range = (uint64_t)spec->vocab_size - 3; // ids 0..2 are <unk>, BOS, EOS
    for (int i = 0; i < spec->shared_prefix; i++)
        prefix[i] = 3 + (int32_t)(seeded_next(&state) % id_range);
    for (int r = 0; r < spec->n_requests; r++) {
        bench_request* q = &out->requests[r];
        int prompt_length = draw_length(&spec->prompt_length, &state);
        q->max_tokens = draw_length(&spec->output_length, &state);
        if (prompt_length < spec->shared_prefix + 2) prompt_length = spec->shared_prefix + 2; // BOS, prefix, 1 own
        q->prompt = malloc((size_t)prompt_length * sizeof *q->prompt);
        if (!q->prompt) {
            free(prefix);
            bench_workload_free(out);
            return error_set(err, "workload: out of memory");
        }
        q->prompt[0] = 1; // BOS
        for (int t = 1; t < prompt_length; t++)
            q->prompt[t] = t - 1 < spec->shared_prefix ? prefix[t - 1] : 3 + (int32_t)(seeded_next(&state) % id_range);
        q->n_prompt = prompt_length;
        out->n_requests++;
    }
    free(prefix);
    return 0;
}

void bench_workload_set_arrivals(bench_workload* w, double rate_per_s, uint64_t seed) {
    uint64_t state = seed ^ 0xA77A77A77A77ull;
    double clock = 0.0;
    for (int i = 0; i < w->n_requests; i++) {
        if (rate_per_s > 0 && i > 0) clock += -log(seeded_unit(&state)) / rate_per_s;
        w->requests[i].arrival_s = clock;
    }
}

int bench_workload_take(bench_workload* out, struct workload* source, error_info* err) {
    memset(out, 0, sizeof *out);
    out->requests = calloc((size_t)source->n_requests, sizeof *out->requests);
    if (!out->requests) return error_set(err, "workload: out of memory");
    for (int i = 0; i < source->n_requests; i++) {
        workload_request* q = &source->requests[i];
        out->requests[i] = (bench_request){q->prompt, q->n_prompt, q->max_tokens, q->arrival_time};
        q->prompt = NULL;
    }
    out->n_requests = source->n_requests;
    return 0;
}

// ---- URLs ----------------------------------------------------------------------------

int bench_url_parse(const char* url, char* base, size_t base_capacity, char* completions, size_t completions_capacity,
                    error_info* err) {
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
        return error_set(err, "--url: expected http://HOST[:PORT][/PATH] or https://..., found '%.200s'", url);
    CURLU* handle = curl_url();
    if (!handle) return error_set(err, "--url: out of memory");
    char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL;
    int status = 0;
    CURLUcode code = curl_url_set(handle, CURLUPART_URL, url, 0);
    if (code != CURLUE_OK)
        status = error_set(err, "--url: '%.200s' is not a URL: %s", url, curl_url_strerror(code));
    else if (curl_url_get(handle, CURLUPART_HOST, &host, 0) != CURLUE_OK || !host || !host[0])
        status = error_set(err, "--url: '%.200s' has no host", url);
    else if (curl_url_get(handle, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK)
        status = error_set(err, "--url: '%.200s' has no scheme", url);
    if (status == 0) {
        curl_url_get(handle, CURLUPART_PORT, &port, 0);
        curl_url_get(handle, CURLUPART_PATH, &path, 0);
        int n = snprintf(base, base_capacity, "%s://%s%s%s", scheme, host, port ? ":" : "", port ? port : "");
        bool has_path = path && strcmp(path, "/") != 0 && path[0];
        int m = has_path ? snprintf(completions, completions_capacity, "%s", url)
                         : snprintf(completions, completions_capacity, "%s/v1/completions", base);
        if (n < 0 || (size_t)n >= base_capacity || m < 0 || (size_t)m >= completions_capacity)
            status = error_set(err, "--url: longer than %zu characters", base_capacity - 1);
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_url_cleanup(handle);
    return status;
}

// ---- one request's transfer --------------------------------------------------------

// One Server-Sent Events line longer than this is malformed: a chunk of a
// few tokens is a few hundred bytes, so 1 MiB is far beyond any real one.
enum { BENCH_MAX_LINE_BYTES = 1 << 20 };
// The body of an HTTP error kept for its message.
enum { BENCH_ERROR_BODY_BYTES = 4096 };

typedef struct transfer {
    CURL* easy;
    int index; // into the workload and the results
    bench_result* result;
    struct curl_slist* headers;
    char* body;
    double start_abs_s, last_token_abs_s;
    double run_start_abs_s;
    char* line; // (line_bytes) the event line so far
    size_t line_bytes, line_capacity;
    long http_status;
    bool failed_here; // the write callback stopped it; result->reason says why
    bool done;        // "data: [DONE]" seen
    int events;
    char curl_error[CURL_ERROR_SIZE];
} transfer;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// Copies text into reason as printable ASCII (anything else as '?'), cut at
// the end of reason.
static void set_reason(bench_result* r, const char* format, ...) __attribute__((format(printf, 2, 3)));
static void set_reason(bench_result* r, const char* format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(r->reason, sizeof r->reason, format, args);
    va_end(args);
    for (char* c = r->reason; *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7F) *c = '?';
    r->ok = false;
}

static void printable_copy(char* out, size_t capacity, const char* text, size_t length) {
    size_t n = 0;
    for (size_t i = 0; i < length && n + 1 < capacity; i++)
        out[n++] = (unsigned char)text[i] >= 0x20 && (unsigned char)text[i] < 0x7F ? text[i] : ' ';
    out[n] = '\0';
}

static int push_itl(bench_result* r, double gap_s) {
    if (r->n_itl == r->itl_capacity) {
        int capacity = r->itl_capacity ? 2 * r->itl_capacity : 64;
        double* grown = realloc(r->itl_s, (size_t)capacity * sizeof *grown);
        if (!grown) return -1;
        r->itl_s = grown;
        r->itl_capacity = capacity;
    }
    r->itl_s[r->n_itl++] = gap_s;
    return 0;
}

// One "data: ..." payload. Returns -1 (with the reason set) to stop the transfer.
static int handle_event(transfer* t, const char* payload, size_t bytes, double at_abs_s) {
    bench_result* r = t->result;
    t->events++;
    if (bytes == 6 && memcmp(payload, "[DONE]", 6) == 0) {
        t->done = true;
        return 0;
    }
    if (t->done) {
        set_reason(r, "event %d came after data: [DONE]", t->events);
        return -1;
    }
    json_error_t parse_error;
    json_t* event = json_loadb(payload, bytes, 0, &parse_error);
    if (!event) {
        char quoted[48];
        printable_copy(quoted, sizeof quoted, payload, bytes < 40 ? bytes : 40);
        set_reason(r, "malformed JSON in event %d: %s ('%s')", t->events, parse_error.text, quoted);
        return -1;
    }
    int status = 0;
    json_t* error = json_object_get(event, "error");
    json_t* choices = json_object_get(event, "choices");
    json_t* usage = json_object_get(event, "usage");
    if (!json_is_object(event)) {
        set_reason(r, "event %d is not a JSON object", t->events);
        status = -1;
    } else if (error && !json_is_null(error)) {
        json_t* message = json_is_object(error) ? json_object_get(error, "message") : error;
        set_reason(r, "error event from the server: %s",
                   json_is_string(message) ? json_string_value(message) : "(no message)");
        status = -1;
    } else if (choices && !json_is_array(choices)) {
        set_reason(r, "event %d: 'choices' is not an array", t->events);
        status = -1;
    }
    if (status == 0 && json_array_size(choices) > 0) {
        json_t* choice = json_array_get(choices, 0);
        json_t* text = json_object_get(choice, "text");
        if (!text) text = json_object_get(json_object_get(choice, "delta"), "content");
        json_t* ids = json_object_get(choice, "token_ids");
        int tokens = json_is_array(ids)                                 ? (int)json_array_size(ids)
                     : json_is_string(text) && json_string_length(text) ? 1
                                                                        : 0;
        if (tokens > 0) {
            if (r->chunk_tokens == 0)
                r->ttft_s = at_abs_s - t->start_abs_s;
            else if (push_itl(r, at_abs_s - t->last_token_abs_s)) {
                set_reason(r, "out of memory");
                status = -1;
            }
            t->last_token_abs_s = at_abs_s;
            r->chunk_tokens += tokens;
        }
    }
    if (status == 0 && json_is_object(usage)) {
        json_t* completion = json_object_get(usage, "completion_tokens");
        json_t* prompt = json_object_get(usage, "prompt_tokens");
        if (!json_is_integer(completion) || json_integer_value(completion) < 0 ||
            json_integer_value(completion) > BENCH_MAX_LENGTH) {
            set_reason(r, "event %d: usage.completion_tokens is not a count", t->events);
            status = -1;
        } else {
            r->usage_seen = true;
            r->output_tokens = (int)json_integer_value(completion);
            r->prompt_tokens = json_is_integer(prompt) ? (int)json_integer_value(prompt) : -1;
        }
    }
    json_decref(event);
    return status;
}

static int handle_line(transfer* t, const char* line, size_t bytes, double at_abs_s) {
    if (bytes > 0 && line[bytes - 1] == '\r') bytes--;
    if (bytes < 5 || memcmp(line, "data:", 5) != 0) return 0; // blank, comment, event:, id:, retry:
    line += 5, bytes -= 5;
    if (bytes > 0 && line[0] == ' ') line++, bytes--;
    return handle_event(t, line, bytes, at_abs_s);
}

static size_t on_body(char* data, size_t size, size_t count, void* user) {
    transfer* t = user;
    size_t bytes = size * count;
    double at = now_s();
    if (t->http_status == 0) curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->http_status);
    if (t->http_status != 200) { // keep the start of the error body for its message
        size_t room = t->line_bytes < BENCH_ERROR_BODY_BYTES ? BENCH_ERROR_BODY_BYTES - t->line_bytes : 0;
        size_t keep = bytes < room ? bytes : room;
        if (t->line_bytes + keep + 1 > t->line_capacity) {
            char* grown = realloc(t->line, BENCH_ERROR_BODY_BYTES + 1);
            if (!grown) return 0;
            t->line = grown;
            t->line_capacity = BENCH_ERROR_BODY_BYTES + 1;
        }
        memcpy(t->line + t->line_bytes, data, keep);
        t->line_bytes += keep;
        t->line[t->line_bytes] = '\0';
        return bytes;
    }
    for (size_t i = 0; i < bytes; i++) {
        if (data[i] == '\n') {
            if (handle_line(t, t->line ? t->line : "", t->line_bytes, at)) {
                t->failed_here = true;
                return 0; // stops the transfer: CURLE_WRITE_ERROR
            }
            t->line_bytes = 0;
            continue;
        }
        if (t->line_bytes + 1 >= t->line_capacity) {
            if (t->line_capacity >= BENCH_MAX_LINE_BYTES) {
                set_reason(t->result, "an event line longer than %d bytes", BENCH_MAX_LINE_BYTES);
                t->failed_here = true;
                return 0;
            }
            size_t capacity = t->line_capacity ? 2 * t->line_capacity : 1024;
            char* grown = realloc(t->line, capacity);
            if (!grown) {
                set_reason(t->result, "out of memory");
                t->failed_here = true;
                return 0;
            }
            t->line = grown;
            t->line_capacity = capacity;
        }
        t->line[t->line_bytes++] = data[i];
    }
    return bytes;
}

static char* request_body(const bench_client_config* config, const bench_request* q) {
    json_t* ids = json_array();
    for (int i = 0; i < q->n_prompt; i++)
        json_array_append_new(ids, json_integer(q->prompt[i]));
    json_t* body = json_pack("{s:s, s:o, s:i, s:f, s:b, s:{s:b}}", "model", config->model, "prompt", ids, "max_tokens",
                             q->max_tokens, "temperature", 0.0, "stream", 1, "stream_options", "include_usage", 1);
    if (!body) return NULL;
    if (config->ignore_eos) json_object_set_new(body, "ignore_eos", json_true());
    if (config->token_ids) json_object_set_new(body, "return_token_ids", json_true());
    char* text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    return text;
}

static int transfer_start(CURLM* multi, transfer* t, const bench_client_config* config, const bench_request* q,
                          double run_start_abs_s) {
    t->body = request_body(config, q);
    t->easy = curl_easy_init();
    t->headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (!t->body || !t->easy || !t->headers) return -1;
    curl_easy_setopt(t->easy, CURLOPT_URL, config->completions_url);
    curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, t->headers);
    curl_easy_setopt(t->easy, CURLOPT_POSTFIELDS, t->body);
    curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(t->easy, CURLOPT_PRIVATE, t);
    curl_easy_setopt(t->easy, CURLOPT_ERRORBUFFER, t->curl_error);
    curl_easy_setopt(t->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(t->easy, CURLOPT_CONNECTTIMEOUT_MS, (long)(config->connect_timeout_s * 1000));
    curl_easy_setopt(t->easy, CURLOPT_TIMEOUT_MS, (long)(config->request_timeout_s * 1000));
    // Less than 1 byte a second for idle_timeout_s seconds: the server went silent.
    curl_easy_setopt(t->easy, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(t->easy, CURLOPT_LOW_SPEED_TIME, (long)ceil(config->idle_timeout_s));
    t->run_start_abs_s = run_start_abs_s;
    t->start_abs_s = now_s();
    t->result->sent_s = t->start_abs_s - run_start_abs_s;
    return curl_multi_add_handle(multi, t->easy) == CURLM_OK ? 0 : -1;
}

// The reason an HTTP error gives: its JSON error.message, else the body's start.
static void http_error_reason(transfer* t) {
    char message[160] = "";
    json_t* body = t->line ? json_loadb(t->line, t->line_bytes, 0, NULL) : NULL;
    json_t* error = json_object_get(body, "error");
    json_t* text = json_is_object(error) ? json_object_get(error, "message") : error;
    if (json_is_string(text))
        printable_copy(message, sizeof message, json_string_value(text), json_string_length(text));
    else if (t->line)
        printable_copy(message, sizeof message, t->line, t->line_bytes);
    json_decref(body);
    set_reason(t->result, "HTTP %ld: %s", t->http_status, message[0] ? message : "(empty body)");
}

static void transfer_finish(transfer* t, CURLcode code) {
    bench_result* r = t->result;
    double end = now_s();
    r->e2e_s = end - t->start_abs_s;
    long status = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    if (t->http_status == 0) t->http_status = status;
    if (t->failed_here) return; // the reason is set
    if (code != CURLE_OK) {
        const char* detail = t->curl_error[0] ? t->curl_error : curl_easy_strerror(code);
        if (code == CURLE_OPERATION_TIMEDOUT)
            set_reason(r, "timed out: %s", detail);
        else if (r->chunk_tokens > 0 || t->events > 0)
            set_reason(r, "connection dropped mid-stream after %d tokens: %s", r->chunk_tokens, detail);
        else if (code == CURLE_PARTIAL_FILE || code == CURLE_RECV_ERROR || code == CURLE_GOT_NOTHING)
            // The time tells a server's own idle limit apart (a queued request cut at 10.0 s).
            set_reason(r, "the server closed the connection before the first event, %.0f s after sending: %s", r->e2e_s,
                       detail);
        else
            set_reason(r, "%s", detail);
        return;
    }
    if (t->http_status != 200) {
        http_error_reason(t);
        return;
    }
    if (t->line_bytes > 0 && handle_line(t, t->line, t->line_bytes, end)) return; // a last line without '\n'
    if (t->events == 0) {
        set_reason(r, "no Server-Sent Events in the answer (did the server ignore stream: true?)");
        return;
    }
    if (!t->done) {
        set_reason(r, "the stream ended without data: [DONE] after %d tokens", r->chunk_tokens);
        return;
    }
    r->ok = true;
    r->reason[0] = '\0';
    if (!r->usage_seen) r->output_tokens = r->chunk_tokens;
}

static void transfer_free(CURLM* multi, transfer* t) {
    if (t->easy) {
        curl_multi_remove_handle(multi, t->easy);
        curl_easy_cleanup(t->easy);
    }
    curl_slist_free_all(t->headers);
    free(t->body);
    free(t->line);
    free(t);
}

// ---- the run -----------------------------------------------------------------------

void bench_run_free(bench_run* run) {
    for (int i = 0; i < run->n_results; i++)
        free(run->results[i].itl_s);
    free(run->results);
    memset(run, 0, sizeof *run);
}

int bench_run_workload(const bench_client_config* config, const bench_workload* w, bench_run* out, error_info* err) {
    memset(out, 0, sizeof *out);
    out->results = calloc((size_t)w->n_requests, sizeof *out->results);
    if (!out->results) return error_set(err, "bench-serve: out of memory");
    out->n_results = w->n_requests;
    for (int i = 0; i < w->n_requests; i++) {
        out->results[i].ttft_s = -1;
        out->results[i].prompt_tokens = -1;
        out->results[i].requested_tokens = w->requests[i].max_tokens;
        snprintf(out->results[i].reason, sizeof out->results[i].reason, "not sent");
    }
    transfer** active = calloc((size_t)w->n_requests, sizeof *active); // (n_requests) in flight, else NULL
    CURLM* multi = curl_multi_init();
    if (!multi || !active) {
        free(active);
        if (multi) curl_multi_cleanup(multi);
        return error_set(err, "bench-serve: libcurl could not start (curl_multi_init) or out of memory");
    }
    const double start = now_s();
    int next = 0, in_flight = 0, finished = 0, failed = 0, status = 0;
    double last_end = start;
    while (finished < w->n_requests) {
        double clock = now_s() - start;
        while (next < w->n_requests && (config->concurrency <= 0 || in_flight < config->concurrency) &&
               w->requests[next].arrival_s <= clock) {
            transfer* t = calloc(1, sizeof *t);
            if (t) t->result = &out->results[next], t->index = next;
            if (!t || transfer_start(multi, t, config, &w->requests[next], start)) {
                if (t) transfer_free(multi, t);
                status = error_set(err, "bench-serve: out of memory starting request %d", next + 1);
                goto stop;
            }
            active[next] = t;
            next++;
            in_flight++;
        }
        int running = 0;
        curl_multi_perform(multi, &running);
        CURLMsg* message;
        int left = 0;
        while ((message = curl_multi_info_read(multi, &left))) {
            if (message->msg != CURLMSG_DONE) continue;
            transfer* t = NULL;
            curl_easy_getinfo(message->easy_handle, CURLINFO_PRIVATE, (char**)&t);
            transfer_finish(t, message->data.result);
            failed += !t->result->ok;
            active[t->index] = NULL;
            transfer_free(multi, t);
            last_end = now_s();
            in_flight--;
            finished++;
            if (config->on_progress) config->on_progress(config->user, finished, failed, w->n_requests);
        }
        // Sleep until a socket is ready, the next arrival is due, or 100 ms
        // pass (so the progress line and arrivals stay on time).
        int wait_ms = 100;
        if (next < w->n_requests && (config->concurrency <= 0 || in_flight < config->concurrency)) {
            double until = w->requests[next].arrival_s - (now_s() - start);
            int due_ms = until <= 0 ? 0 : (int)ceil(until * 1000);
            if (due_ms < wait_ms) wait_ms = due_ms;
        }
        if (wait_ms > 0 && finished < w->n_requests) curl_multi_poll(multi, NULL, 0, wait_ms, NULL);
    }
stop:
    out->duration_s = last_end - start;
    for (int i = 0; i < w->n_requests; i++)
        if (active[i]) transfer_free(multi, active[i]);
    free(active);
    curl_multi_cleanup(multi);
    return status;
}

// ---- GET /v1/models ------------------------------------------------------------------

typedef struct grow_buffer {
    char* bytes;
    size_t n, capacity, limit;
} grow_buffer;

static size_t on_models_body(char* data, size_t size, size_t count, void* user) {
    grow_buffer* b = user;
    size_t bytes = size * count;
    if (b->n + bytes + 1 > b->limit) return 0;
    if (b->n + bytes + 1 > b->capacity) {
        size_t capacity = (b->n + bytes + 1) * 2;
        char* grown = realloc(b->bytes, capacity);
        if (!grown) return 0;
        b->bytes = grown;
        b->capacity = capacity;
    }
    memcpy(b->bytes + b->n, data, bytes);
    b->n += bytes;
    b->bytes[b->n] = '\0';
    return bytes;
}

int bench_fetch_model_name(const char* base_url, double timeout_s, char* out, size_t capacity, error_info* err) {
    char url[1100];
    snprintf(url, sizeof url, "%s/v1/models", base_url);
    CURL* easy = curl_easy_init();
    if (!easy) return error_set(err, "bench-serve: libcurl could not start (curl_easy_init)");
    grow_buffer body = {NULL, 0, 0, 1 << 20}; // a model list is a few hundred bytes
    char curl_error[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_models_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, curl_error);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    CURLcode code = curl_easy_perform(easy);
    long http_status = 0;
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &http_status);
    curl_easy_cleanup(easy);
    int status = 0;
    if (code != CURLE_OK) {
        status = error_set(err, "%s: cannot reach the server: %s", url,
                           curl_error[0] ? curl_error : curl_easy_strerror(code));
    } else if (http_status != 200) {
        status = error_set(err, "%s: HTTP %ld (give the model with --model)", url, http_status);
    } else {
        json_t* root = body.bytes ? json_loadb(body.bytes, body.n, 0, NULL) : NULL;
        json_t* id = json_object_get(json_array_get(json_object_get(root, "data"), 0), "id");
        if (!json_is_string(id) || json_string_length(id) == 0 || json_string_length(id) >= capacity)
            status = error_set(err, "%s: no model id in the answer (give the model with --model)", url);
        else
            snprintf(out, capacity, "%s", json_string_value(id));
        json_decref(root);
    }
    free(body.bytes);
    return status;
}

// ---- the server's own counters ------------------------------------------------------------

void bench_counters_parse(const char* text, bench_server_counters* out) {
    static const struct {
        const char* name;
        size_t offset;
    } NAMES[] = {
        {"servelab:engine_steps_total", offsetof(bench_server_counters, engine_steps)},
        {"vllm:generation_tokens_total", offsetof(bench_server_counters, generation_tokens)},
        {"vllm:spec_decode_num_drafts_total", offsetof(bench_server_counters, spec_drafts)},
        {"vllm:spec_decode_num_draft_tokens_total", offsetof(bench_server_counters, spec_draft_tokens)},
        {"vllm:spec_decode_num_accepted_tokens_total", offsetof(bench_server_counters, spec_accepted_tokens)},
        {"servelab:spec_decode_num_emitted_tokens_total", offsetof(bench_server_counters, spec_emitted_tokens)},
    };
    enum { N_NAMES = sizeof NAMES / sizeof NAMES[0] };
    for (size_t i = 0; i < N_NAMES; i++)
        *(double*)((char*)out + NAMES[i].offset) = -1;
    for (const char* line = text; line && *line;) {
        const char* end = strchr(line, '\n');
        size_t length = end ? (size_t)(end - line) : strlen(line);
        for (size_t i = 0; i < N_NAMES && line[0] != '#'; i++) {
            size_t n = strlen(NAMES[i].name);
            // The name, then its labels or the value: "vllm:x_total" must not match "vllm:x_total_more".
            if (length <= n || strncmp(line, NAMES[i].name, n) != 0 || (line[n] != '{' && line[n] != ' ')) continue;
            const char* value = line + n;
            if (*value == '{') {
                value = memchr(value, '}', length - n);
                if (!value) break;
                value++;
            }
            char* parsed_end = NULL;
            double v = strtod(value, &parsed_end);
            if (parsed_end == value || !isfinite(v) || v < 0) break;
            double* field = (double*)((char*)out + NAMES[i].offset);
            *field = (*field < 0 ? 0 : *field) + v;
            break;
        }
        line = end ? end + 1 : NULL;
    }
}

int bench_fetch_counters(const char* base_url, double timeout_s, bench_server_counters* out, error_info* err) {
    char url[1100];
    snprintf(url, sizeof url, "%s/metrics", base_url);
    CURL* easy = curl_easy_init();
    if (!easy) return error_set(err, "bench-serve: libcurl could not start (curl_easy_init)");
    grow_buffer body = {NULL, 0, 0, 16 << 20}; // servelab's page is about 10 kB; vLLM's with histograms, more
    char curl_error[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_models_body); // any body, up to its cap
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, curl_error);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    CURLcode code = curl_easy_perform(easy);
    long http_status = 0;
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &http_status);
    curl_easy_cleanup(easy);
    int status = 0;
    if (code != CURLE_OK)
        status = error_set(err, "%s: cannot read the server's metrics: %s", url,
                           curl_error[0] ? curl_error : curl_easy_strerror(code));
    else if (http_status != 200)
        status = error_set(err, "%s: HTTP %ld (llama-server needs --metrics)", url, http_status);
    else
        bench_counters_parse(body.bytes ? body.bytes : "", out);
    free(body.bytes);
    return status;
}

static double counter_delta(double before, double after) { return before < 0 || after < 0 ? -1 : after - before; }

static double ratio_or_missing(double numerator, double denominator) {
    return numerator < 0 || denominator <= 0 ? -1 : numerator / denominator;
}

void bench_server_steps_between(const bench_server_counters* before, const bench_server_counters* after,
                                bench_server_steps* out) {
    memset(out, 0, sizeof *out);
    out->measured = true;
    out->engine_steps = counter_delta(before->engine_steps, after->engine_steps);
    out->generation_tokens = counter_delta(before->generation_tokens, after->generation_tokens);
    out->tokens_per_step = ratio_or_missing(out->generation_tokens, out->engine_steps);
    out->spec_drafts = counter_delta(before->spec_drafts, after->spec_drafts);
    out->spec_draft_tokens = counter_delta(before->spec_draft_tokens, after->spec_draft_tokens);
    out->spec_accepted_tokens = counter_delta(before->spec_accepted_tokens, after->spec_accepted_tokens);
    out->acceptance_rate = ratio_or_missing(out->spec_accepted_tokens, out->spec_draft_tokens);
    double emitted = counter_delta(before->spec_emitted_tokens, after->spec_emitted_tokens);
    // vLLM has no emitted count: each verifying pass adds its kept guesses and one token of its own.
    if (emitted < 0 && out->spec_accepted_tokens >= 0 && out->spec_drafts >= 0)
        emitted = out->spec_accepted_tokens + out->spec_drafts;
    out->tokens_per_target_pass = ratio_or_missing(emitted, out->spec_drafts);
}

// ---- statistics ----------------------------------------------------------------------

double bench_percentile(const double* sorted, int n, double p) {
    if (n <= 0) return 0.0;
    double rank = p / 100.0 * (n - 1);
    int low = (int)floor(rank);
    if (low >= n - 1) return sorted[n - 1];
    double fraction = rank - low;
    return sorted[low] + (sorted[low + 1] - sorted[low]) * fraction;
}

static int compare_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

// Sorts values (seconds) and fills the statistic in milliseconds.
static void describe(double* values, int n, bench_stat* out) {
    memset(out, 0, sizeof *out);
    out->n = n;
    if (n == 0) return;
    qsort(values, (size_t)n, sizeof *values, compare_double);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += values[i];
    out->mean = sum / n * 1000.0;
    out->p50 = bench_percentile(values, n, 50) * 1000.0;
    out->p90 = bench_percentile(values, n, 90) * 1000.0;
    out->p99 = bench_percentile(values, n, 99) * 1000.0;
}

static void count_reason(bench_summary* s, const char* reason) {
    for (int i = 0; i < s->n_reasons; i++)
        if (strcmp(s->reasons[i], reason) == 0) {
            s->reason_counts[i]++;
            return;
        }
    if (s->n_reasons == BENCH_MAX_REASONS) {
        s->other_reasons++;
        return;
    }
    snprintf(s->reasons[s->n_reasons], sizeof s->reasons[0], "%s", reason);
    s->reason_counts[s->n_reasons++] = 1;
}

int bench_summarize(const bench_run* run, double slo_ttft_ms, double slo_tpot_ms, bench_summary* s, error_info* err) {
    memset(s, 0, sizeof *s);
    s->n_requests = run->n_results;
    s->duration_s = run->duration_s;
    s->slo_ttft_ms = slo_ttft_ms;
    s->slo_tpot_ms = slo_tpot_ms;
    int n_itl = 0;
    for (int i = 0; i < run->n_results; i++)
        n_itl += run->results[i].n_itl;
    int n = run->n_results;
    double* ttft = malloc(((size_t)n + 1) * sizeof *ttft);
    double* tpot = malloc(((size_t)n + 1) * sizeof *tpot);
    double* e2e = malloc(((size_t)n + 1) * sizeof *e2e);
    double* itl = malloc(((size_t)n_itl + 1) * sizeof *itl);
    if (!ttft || !tpot || !e2e || !itl) {
        free(ttft), free(tpot), free(e2e), free(itl);
        return error_set(err, "bench-serve: out of memory");
    }
    int n_ttft = 0, n_tpot = 0, n_e2e = 0;
    n_itl = 0;
    for (int i = 0; i < n; i++) {
        const bench_result* r = &run->results[i];
        if (!r->ok) {
            s->failed++;
            count_reason(s, r->reason);
            continue;
        }
        s->completed++;
        s->output_tokens += r->output_tokens;
        if (r->prompt_tokens > 0) s->prompt_tokens += r->prompt_tokens;
        if (!r->usage_seen) s->usage_missing++;
        if (r->usage_seen && r->chunk_tokens != r->output_tokens) {
            if (s->token_mismatches == 0)
                snprintf(s->first_mismatch, sizeof s->first_mismatch,
                         "request %d: usage says %d output tokens, the chunks carried %d", i + 1, r->output_tokens,
                         r->chunk_tokens);
            s->token_mismatches++;
        }
        if (r->output_tokens < r->requested_tokens) s->short_outputs++;
        e2e[n_e2e++] = r->e2e_s;
        double request_tpot_s = -1;
        if (r->ttft_s >= 0) ttft[n_ttft++] = r->ttft_s;
        if (r->ttft_s >= 0 && r->output_tokens > 1) {
            request_tpot_s = (r->e2e_s - r->ttft_s) / (r->output_tokens - 1);
            tpot[n_tpot++] = request_tpot_s;
        }
        for (int k = 0; k < r->n_itl; k++)
            itl[n_itl++] = r->itl_s[k];
        bool good = (slo_ttft_ms <= 0 || (r->ttft_s >= 0 && r->ttft_s * 1000.0 <= slo_ttft_ms)) &&
                    (slo_tpot_ms <= 0 || request_tpot_s < 0 || request_tpot_s * 1000.0 <= slo_tpot_ms);
        s->good_requests += good;
    }
    describe(ttft, n_ttft, &s->ttft_ms);
    describe(tpot, n_tpot, &s->tpot_ms);
    describe(itl, n_itl, &s->itl_ms);
    describe(e2e, n_e2e, &s->e2e_ms);
    free(ttft), free(tpot), free(e2e), free(itl);
    // Most frequent reason first (a handful of entries: insertion sort).
    for (int i = 1; i < s->n_reasons; i++)
        for (int j = i; j > 0 && s->reason_counts[j] > s->reason_counts[j - 1]; j--) {
            char held[BENCH_REASON_BYTES];
            memcpy(held, s->reasons[j], sizeof held);
            memcpy(s->reasons[j], s->reasons[j - 1], sizeof held);
            memcpy(s->reasons[j - 1], held, sizeof held);
            int count = s->reason_counts[j];
            s->reason_counts[j] = s->reason_counts[j - 1];
            s->reason_counts[j - 1] = count;
        }
    if (s->duration_s > 0) {
        s->request_throughput = s->completed / s->duration_s;
        s->output_throughput = (double)s->output_tokens / s->duration_s;
        s->total_token_throughput = (double)(s->output_tokens + s->prompt_tokens) / s->duration_s;
        s->goodput = s->good_requests / s->duration_s;
    }
    return 0;
}
