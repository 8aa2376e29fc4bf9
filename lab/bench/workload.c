#include "lab/bench/workload.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "lab/common/seeded_random.h"

// ---- lengths -------------------------------------------------------------------

int length_distribution_parse(const char* flag, const char* text, length_distribution* out, error_info* err) {
    double a = 0, b = 0;
    char tail;
    bool parsed = false;
    if (sscanf(text, "fixed:%lf%c", &a, &tail) == 1 && a >= 1) {
        *out = (length_distribution){LENGTH_FIXED, a, 0};
        parsed = true;
    } else if (sscanf(text, "uniform:%lf:%lf%c", &a, &b, &tail) == 2 && a >= 1 && b >= a) {
        *out = (length_distribution){LENGTH_UNIFORM, a, b};
        parsed = true;
    } else if (sscanf(text, "lognormal:%lf:%lf%c", &a, &b, &tail) == 2 && a >= 1 && b >= 0) {
        *out = (length_distribution){LENGTH_LOGNORMAL, a, b};
        parsed = true;
    }
    if (!parsed)
        return error_set(err,
                         "%s: expected fixed:N, uniform:LOW:HIGH or lognormal:MEAN:SD with lengths >= 1, found '%s'",
                         flag, text);
    // fixed:2147483647 once became an int prompt + output that overflowed;
    // inf passed "a >= 1" and reached llround. Every number stays <= the limit.
    if (!(a <= LENGTH_MAX_TOKENS) || !(b <= LENGTH_MAX_TOKENS))
        return error_set(err, "%s: lengths above %d tokens are not supported, found '%s'", flag, LENGTH_MAX_TOKENS,
                         text);
    return 0;
}

static int draw_length(const length_distribution* d, uint64_t* state) {
    double value = d->a;
    if (d->kind == LENGTH_UNIFORM) {
        value = d->a + floor(seeded_unit(state) * (d->b - d->a + 1.0));
        if (value > d->b) value = d->b;
    } else if (d->kind == LENGTH_LOGNORMAL) {
        // Lengths with mean m and standard deviation s: the underlying normal
        // has sigma^2 = ln(1 + s^2/m^2) and mu = ln(m) - sigma^2 / 2.
        double sigma2 = log(1.0 + (d->b * d->b) / (d->a * d->a));
        double mu = log(d->a) - sigma2 / 2.0;
        double normal = seeded_normal(state);
        value = exp(mu + sqrt(sigma2) * normal);
    }
    // A lognormal tail can reach any size; clamp before converting to int.
    if (!(value >= 1.0)) return 1;
    if (value > LENGTH_MAX_TOKENS) return LENGTH_MAX_TOKENS;
    return (int)llround(value);
}

// ---- generated workloads ----------------------------------------------------------

int workload_generate(workload* out, const workload_spec* spec, error_info* err) {
    memset(out, 0, sizeof *out);
    if (spec->n_requests < 1) return error_set(err, "--requests: expected at least 1, found %d", spec->n_requests);
    if (spec->shared_prefix < 0 || spec->shared_prefix + 2 > spec->max_seq_len)
        return error_set(err, "--shared-prefix: expected 0..%d tokens, found %d", spec->max_seq_len - 2,
                         spec->shared_prefix);
    out->requests = calloc((size_t)spec->n_requests, sizeof *out->requests);
    if (!out->requests) return error_set(err, "workload: out of memory");
    uint64_t state = spec->seed ^ 0x5EED5EED5EEDull;
    int32_t* prefix = malloc((size_t)(spec->shared_prefix + 1) * sizeof *prefix); // (shared_prefix) ids
    if (!prefix) return error_set(err, "workload: out of memory");
    const int id_range = spec->vocab_size - 3; // ids 0..2 are <unk>, BOS, EOS
    for (int i = 0; i < spec->shared_prefix; i++) prefix[i] = 3 + (int32_t)(seeded_next(&state) % (uint64_t)id_range);
    double clock = 0.0;
    for (int r = 0; r < spec->n_requests; r++) {
        workload_request* q = &out->requests[r];
        int prompt_length = draw_length(&spec->prompt_length, &state);
        int output_length = draw_length(&spec->output_length, &state);
        if (prompt_length < spec->shared_prefix + 1) prompt_length = spec->shared_prefix + 1;
        if (prompt_length > spec->max_seq_len - 1) prompt_length = spec->max_seq_len - 1;
        if (prompt_length + output_length > spec->max_seq_len) output_length = spec->max_seq_len - prompt_length;
        q->prompt = malloc((size_t)prompt_length * sizeof *q->prompt);
        if (!q->prompt) {
            free(prefix);
            workload_free(out);
            return error_set(err, "workload: out of memory");
        }
        q->prompt[0] = TOK_BOS_ID;
        for (int t = 1; t < prompt_length; t++)
            q->prompt[t] = t - 1 < spec->shared_prefix ? prefix[t - 1]
                                                       : 3 + (int32_t)(seeded_next(&state) % (uint64_t)id_range);
        q->n_prompt = prompt_length;
        q->max_tokens = output_length;
        if (spec->arrival_rate > 0) clock += -log(seeded_unit(&state)) / spec->arrival_rate;
        q->arrival_time = clock;
        out->n_requests++;
    }
    free(prefix);
    return 0;
}

// ---- JSON Lines ---------------------------------------------------------------------
// Jansson parses each line (strict RFC 8259, with the line's column in its
// errors); this part checks the four fields and builds the request. Every
// message names the file, the line and the field.

typedef struct line_context {
    const char* name; // the file, as messages call it
    int line;
    error_info* err;
} line_context;

// Bytes of user text in messages: printable ASCII as is, anything else as
// '?', cut after `limit` bytes with "...".
static void quote_text(char* out, size_t capacity, const char* text, size_t length, size_t limit) {
    size_t n = 0;
    for (size_t i = 0; i < length && i < limit && n + 1 < capacity; i++)
        out[n++] = text[i] >= 0x20 && text[i] < 0x7f ? text[i] : '?';
    if (length > limit && n + 4 < capacity) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
}

// What a value is, for "got ...": the number itself, a string's start, or its kind.
static const char* describe_value(const json_t* value, char* out, size_t capacity) {
    switch (json_typeof(value)) {
    case JSON_INTEGER: snprintf(out, capacity, "%lld", (long long)json_integer_value(value)); break;
    case JSON_REAL: snprintf(out, capacity, "%g", json_real_value(value)); break;
    case JSON_STRING: {
        char text[48];
        quote_text(text, sizeof text, json_string_value(value), json_string_length(value), 24);
        snprintf(out, capacity, "the string \"%s\"", text);
        break;
    }
    case JSON_OBJECT: snprintf(out, capacity, "%s", json_object_size(value) ? "an object" : "{}"); break;
    case JSON_ARRAY: snprintf(out, capacity, "%s", json_array_size(value) ? "an array" : "[]"); break;
    case JSON_TRUE: snprintf(out, capacity, "true"); break;
    case JSON_FALSE: snprintf(out, capacity, "false"); break;
    default: snprintf(out, capacity, "null"); break;
    }
    return out;
}

// "NAME:LINE: expected WHAT for field 'FIELD', got VALUE".
static int field_error(const line_context* c, const char* field, const char* what, const json_t* value) {
    char got[96];
    return error_set(c->err, "%s:%d: expected %s for field '%s', got %s", c->name, c->line, what, field,
                     describe_value(value, got, sizeof got));
}

// A JSON number that is a whole number in [low, high] (integers, and reals
// such as 16.0 or 1e2 that are whole).
static bool whole_number_in(const json_t* value, long long low, long long high, long long* out) {
    if (json_is_integer(value)) {
        long long v = (long long)json_integer_value(value);
        if (v < low || v > high) return false;
        *out = v;
        return true;
    }
    if (!json_is_real(value)) return false;
    double v = json_real_value(value);
    if (!(v >= (double)low && v <= (double)high) || v != floor(v)) return false;
    *out = (long long)v;
    return true;
}

static int read_prompt_text(const line_context* c, const json_t* value, workload_request* q, const tokenizer* tok,
                            int max_seq_len) {
    if (!json_is_string(value)) return field_error(c, "prompt", "a string", value);
    if (!tok)
        return error_set(c->err, "%s:%d: field 'prompt': text needs a tokenizer; use \"prompt_ids\"", c->name,
                         c->line);
    q->prompt = malloc((size_t)max_seq_len * sizeof *q->prompt);
    if (!q->prompt) return error_set(c->err, "%s:%d: field 'prompt': out of memory", c->name, c->line);
    // The tokenizer's own message goes into a local error_info: formatting
    // it into c->err while reading from it would overlap.
    error_info tok_err = {{0}};
    int needed = 0;
    if (tok_encode(tok, json_string_value(value), true, false, q->prompt, max_seq_len, &needed, &tok_err) == 0) {
        q->n_prompt = needed;
        return 0;
    }
    if (needed > max_seq_len)
        return error_set(c->err, "%s:%d: field 'prompt': the text is %d tokens (BOS included), more than the model's %d",
                         c->name, c->line, needed, max_seq_len);
    return error_set(c->err, "%s:%d: field 'prompt': %s", c->name, c->line, tok_err.message);
}

static int read_prompt_ids(const line_context* c, const json_t* value, workload_request* q, int vocab_size,
                           int max_seq_len) {
    if (!json_is_array(value)) return field_error(c, "prompt_ids", "an array of token ids", value);
    size_t count = json_array_size(value);
    if (count == 0) return field_error(c, "prompt_ids", "at least one token id", value);
    // BOS is put first when the ids do not start with it; at least one
    // position must stay for the output.
    const size_t room = (size_t)max_seq_len - 1;
    q->prompt = malloc((room + 1) * sizeof *q->prompt);
    if (!q->prompt) return error_set(c->err, "%s:%d: field 'prompt_ids': out of memory", c->name, c->line);
    q->prompt[0] = TOK_BOS_ID;
    q->n_prompt = 1;
    bool starts_with_bos = false;
    for (size_t i = 0; i < count; i++) {
        const json_t* item = json_array_get(value, i);
        long long id = 0;
        char what[96], got[96];
        if (!json_is_number(item))
            return error_set(c->err, "%s:%d: expected a number for field 'prompt_ids' item %zu (a token id 0..%d), got %s",
                             c->name, c->line, i + 1, vocab_size - 1, describe_value(item, got, sizeof got));
        if (!whole_number_in(item, 0, vocab_size - 1, &id)) {
            snprintf(what, sizeof what, "a token id 0..%d", vocab_size - 1);
            return error_set(c->err, "%s:%d: expected %s for field 'prompt_ids' item %zu, got %s", c->name, c->line,
                             what, i + 1, describe_value(item, got, sizeof got));
        }
        if (i == 0 && id == TOK_BOS_ID) { // already there
            starts_with_bos = true;
            continue;
        }
        if ((size_t)q->n_prompt >= room)
            return error_set(c->err,
                             "%s:%d: expected at most %zu ids (BOS included) for field 'prompt_ids', got %zu: the "
                             "model's %d positions need one for the output",
                             c->name, c->line, room, count + !starts_with_bos, max_seq_len);
        q->prompt[q->n_prompt++] = (int32_t)id;
    }
    return 0;
}

static const char* const REQUEST_KEYS = "prompt, prompt_ids, max_tokens, arrival";

static int parse_request(const line_context* c, json_t* root, workload_request* q, const tokenizer* tok,
                         int vocab_size, int max_seq_len) {
    char got[96];
    if (!json_is_object(root))
        return error_set(c->err, "%s:%d: expected an object {\"prompt\": ..., \"max_tokens\": ...}, got %s", c->name,
                         c->line, describe_value(root, got, sizeof got));
    const char* key;
    json_t* value;
    json_object_foreach(root, key, value) {
        if (strcmp(key, "prompt") && strcmp(key, "prompt_ids") && strcmp(key, "max_tokens") && strcmp(key, "arrival")) {
            char quoted[48];
            quote_text(quoted, sizeof quoted, key, strlen(key), 24);
            return error_set(c->err, "%s:%d: unknown key \"%s\" (expected %s)", c->name, c->line, quoted, REQUEST_KEYS);
        }
    }
    const json_t* text = json_object_get(root, "prompt");
    const json_t* ids = json_object_get(root, "prompt_ids");
    const json_t* max_tokens = json_object_get(root, "max_tokens");
    const json_t* arrival = json_object_get(root, "arrival");
    if (text && ids)
        return error_set(c->err, "%s:%d: both \"prompt\" and \"prompt_ids\": give one of them", c->name, c->line);
    if (!text && !ids) return error_set(c->err, "%s:%d: no \"prompt\" or \"prompt_ids\"", c->name, c->line);
    if (!max_tokens) return error_set(c->err, "%s:%d: missing \"max_tokens\"", c->name, c->line);

    long long n_out = 0;
    if (!whole_number_in(max_tokens, 1, max_seq_len, &n_out)) {
        char what[64];
        snprintf(what, sizeof what, "a whole number 1..%d", max_seq_len);
        return field_error(c, "max_tokens", what, max_tokens);
    }
    q->max_tokens = (int)n_out;
    if (arrival) {
        // Jansson refuses NaN, infinities and out-of-range reals, so a number is finite.
        if (!json_is_number(arrival) || json_number_value(arrival) < 0)
            return field_error(c, "arrival", "seconds >= 0", arrival);
        q->arrival_time = json_number_value(arrival);
    }
    if (text ? read_prompt_text(c, text, q, tok, max_seq_len) : read_prompt_ids(c, ids, q, vocab_size, max_seq_len))
        return -1;
    if (q->prompt[0] != TOK_BOS_ID) { // a tokenizer without BOS: prompts always start with it, as in generate
        if (q->n_prompt >= max_seq_len - 1)
            return error_set(c->err, "%s:%d: field 'prompt': too long for the model's %d tokens", c->name, c->line,
                             max_seq_len);
        memmove(q->prompt + 1, q->prompt, (size_t)q->n_prompt * sizeof *q->prompt);
        q->prompt[0] = TOK_BOS_ID;
        q->n_prompt++;
    }
    if (q->n_prompt + q->max_tokens > max_seq_len)
        return error_set(c->err, "%s:%d: prompt (%d tokens) + max_tokens (%d) exceed the model's %d", c->name, c->line,
                         q->n_prompt, q->max_tokens, max_seq_len);
    return 0;
}

// One line: NUL bytes, then Jansson, then the fields.
static int parse_line(const line_context* c, const char* line, size_t length, workload_request* q,
                      const tokenizer* tok, int vocab_size, int max_seq_len) {
    memset(q, 0, sizeof *q);
    const char* nul = memchr(line, '\0', length);
    if (nul)
        return error_set(c->err, "%s:%d:%zu: a NUL byte; JSON Lines are text (is this a binary file?)", c->name,
                         c->line, (size_t)(nul - line) + 1);
    json_error_t json_err;
    // JSON_DECODE_ANY: a line that is a number or a string gets "expected an
    // object" below rather than Jansson's "'[' or '{' expected".
    json_t* root = json_loadb(line, length, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &json_err);
    if (!root) {
        const char* reason = json_err.text;
        char rewritten[sizeof json_err.text + 64];
        if (json_error_code(&json_err) == json_error_stack_overflow) {
            snprintf(rewritten, sizeof rewritten, "nested deeper than %d levels", JSON_PARSER_MAX_DEPTH);
            reason = rewritten;
        } else if (json_error_code(&json_err) == json_error_null_character) {
            reason = "\\u0000 in a string (a prompt is text without NUL)";
        } else if (json_error_code(&json_err) == json_error_end_of_input_expected) {
            // Jansson says "end of file expected"; here the input is one line.
            const char* near = strstr(json_err.text, " near ");
            snprintf(rewritten, sizeof rewritten, "extra text after the object%s", near ? near : "");
            reason = rewritten;
        }
        return error_set(c->err, "%s:%d:%d: invalid JSON: %s", c->name, c->line, json_err.column, reason);
    }
    int status = parse_request(c, root, q, tok, vocab_size, max_seq_len);
    json_decref(root);
    return status;
}

// One line without its '\n' into *buffer (NUL-terminated). Returns its
// length, -1 at the end of the input, -2 when the line is longer than
// WORKLOAD_MAX_LINE_BYTES (nothing more is read), -3 when out of memory.
static long read_line(FILE* file, char** buffer, size_t* capacity) {
    size_t length = 0;
    int ch;
    while ((ch = getc_unlocked(file)) != EOF && ch != '\n') {
        if (length == WORKLOAD_MAX_LINE_BYTES) return -2;
        if (length + 1 >= *capacity) {
            size_t grown_capacity = *capacity ? 2 * *capacity : 256;
            if (grown_capacity > (size_t)WORKLOAD_MAX_LINE_BYTES + 1) grown_capacity = (size_t)WORKLOAD_MAX_LINE_BYTES + 1;
            char* grown = realloc(*buffer, grown_capacity);
            if (!grown) return -3;
            *buffer = grown;
            *capacity = grown_capacity;
        }
        (*buffer)[length++] = (char)ch;
    }
    if (ch == EOF && length == 0) return -1;
    if (!*buffer) { // an empty line before anything was read
        *buffer = malloc(1);
        if (!*buffer) return -3;
        *capacity = 1;
    }
    (*buffer)[length] = '\0';
    return (long)length;
}

static bool blank(const char* line, size_t length) {
    for (size_t i = 0; i < length; i++)
        if (!isspace((unsigned char)line[i])) return false;
    return true;
}

// Stable insertion sort by arrival time: equal times keep file order.
static void sort_by_arrival(workload* w) {
    for (int i = 1; i < w->n_requests; i++) {
        workload_request item = w->requests[i];
        int j = i;
        for (; j > 0 && w->requests[j - 1].arrival_time > item.arrival_time; j--) w->requests[j] = w->requests[j - 1];
        w->requests[j] = item;
    }
}

int workload_read_stream(workload* out, FILE* file, const char* name, const tokenizer* tok, int vocab_size,
                         int max_seq_len, error_info* err) {
    memset(out, 0, sizeof *out);
    if (vocab_size < 1 || max_seq_len < 2)
        return error_set(err, "%s: the model's vocab_size %d and max_seq_len %d leave no room for a request", name,
                         vocab_size, max_seq_len);
    char* line = NULL;
    size_t line_capacity = 0;
    int capacity = 0, line_number = 0, status = 0;
    for (;;) {
        long length = read_line(file, &line, &line_capacity);
        if (length == -1) break;
        line_number++;
        if (length == -2) {
            status = error_set(err, "%s:%d: line longer than %d bytes (one request per line)", name, line_number,
                               WORKLOAD_MAX_LINE_BYTES);
            break;
        }
        if (length == -3) {
            status = error_set(err, "%s:%d: out of memory", name, line_number);
            break;
        }
        if (blank(line, (size_t)length)) continue;
        if (out->n_requests == capacity) {
            workload_request* grown = NULL;
            if (capacity <= INT32_MAX / 2) {
                capacity = capacity ? 2 * capacity : 64;
                grown = realloc(out->requests, (size_t)capacity * sizeof *grown);
            }
            if (!grown) {
                status = error_set(err, "%s:%d: out of memory", name, line_number);
                break;
            }
            out->requests = grown;
        }
        line_context c = {name, line_number, err};
        workload_request* q = &out->requests[out->n_requests];
        if (parse_line(&c, line, (size_t)length, q, tok, vocab_size, max_seq_len)) {
            free(q->prompt);
            status = -1;
            break;
        }
        out->n_requests++;
    }
    free(line);
    if (status == 0 && ferror(file)) status = error_set(err, "%s: read error", name);
    if (status == 0 && out->n_requests == 0) status = error_set(err, "%s: no requests in the file", name);
    if (status) {
        workload_free(out);
        return -1;
    }
    sort_by_arrival(out);
    return 0;
}

int workload_read(workload* out, const char* path, const tokenizer* tok, int vocab_size, int max_seq_len,
                  error_info* err) {
    memset(out, 0, sizeof *out);
    FILE* file = fopen(path, "r");
    if (!file) return error_set(err, "%s: cannot open: %s", path, strerror(errno));
    int status = workload_read_stream(out, file, path, tok, vocab_size, max_seq_len, err);
    fclose(file);
    return status;
}

void workload_free(workload* w) {
    for (int i = 0; i < w->n_requests; i++) free(w->requests[i].prompt);
    free(w->requests);
    memset(w, 0, sizeof *w);
}

double workload_mean_prompt(const workload* w) {
    double sum = 0;
    for (int i = 0; i < w->n_requests; i++) sum += w->requests[i].n_prompt;
    return w->n_requests ? sum / w->n_requests : 0;
}

double workload_mean_output(const workload* w) {
    double sum = 0;
    for (int i = 0; i < w->n_requests; i++) sum += w->requests[i].max_tokens;
    return w->n_requests ? sum / w->n_requests : 0;
}
