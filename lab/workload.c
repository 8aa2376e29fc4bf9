#include "lab/workload.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- lengths -------------------------------------------------------------------

int length_distribution_parse(const char* flag, const char* text, length_distribution* out, error_info* err) {
    double a = 0, b = 0;
    char tail;
    if (sscanf(text, "fixed:%lf%c", &a, &tail) == 1 && a >= 1) {
        *out = (length_distribution){LENGTH_FIXED, a, 0};
        return 0;
    }
    if (sscanf(text, "uniform:%lf:%lf%c", &a, &b, &tail) == 2 && a >= 1 && b >= a) {
        *out = (length_distribution){LENGTH_UNIFORM, a, b};
        return 0;
    }
    if (sscanf(text, "lognormal:%lf:%lf%c", &a, &b, &tail) == 2 && a >= 1 && b >= 0) {
        *out = (length_distribution){LENGTH_LOGNORMAL, a, b};
        return 0;
    }
    return error_set(err, "%s: expected fixed:N, uniform:LOW:HIGH or lognormal:MEAN:SD with lengths >= 1, found '%s'",
                     flag, text);
}

// splitmix64: small, seedable, the same on every machine.
static uint64_t next_random(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double next_unit(uint64_t* state) { // (0, 1]
    return ((double)(next_random(state) >> 11) + 1.0) / 9007199254740992.0;
}

static int draw_length(const length_distribution* d, uint64_t* state) {
    double value = d->a;
    if (d->kind == LENGTH_UNIFORM) {
        value = d->a + floor(next_unit(state) * (d->b - d->a + 1.0));
        if (value > d->b) value = d->b;
    } else if (d->kind == LENGTH_LOGNORMAL) {
        // Lengths with mean m and standard deviation s: the underlying normal
        // has sigma^2 = ln(1 + s^2/m^2) and mu = ln(m) - sigma^2 / 2.
        double sigma2 = log(1.0 + (d->b * d->b) / (d->a * d->a));
        double mu = log(d->a) - sigma2 / 2.0;
        double normal = sqrt(-2.0 * log(next_unit(state))) * cos(6.283185307179586 * next_unit(state));
        value = exp(mu + sqrt(sigma2) * normal);
    }
    int length = (int)llround(value);
    return length < 1 ? 1 : length;
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
    for (int i = 0; i < spec->shared_prefix; i++) prefix[i] = 3 + (int32_t)(next_random(&state) % (uint64_t)id_range);
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
                                                       : 3 + (int32_t)(next_random(&state) % (uint64_t)id_range);
        q->n_prompt = prompt_length;
        q->max_tokens = output_length;
        if (spec->arrival_rate > 0) clock += -log(next_unit(&state)) / spec->arrival_rate;
        q->arrival_time = clock;
        out->n_requests++;
    }
    free(prefix);
    return 0;
}

// ---- JSON Lines ---------------------------------------------------------------------
// A small reader for the three keys above: enough JSON to read what a person
// or a script writes, with a message naming the line and what was wrong.

typedef struct json_cursor {
    const char* p;
    const char* path;
    int line;
    error_info* err;
} json_cursor;

static void skip_space(json_cursor* c) {
    while (*c->p && isspace((unsigned char)*c->p)) c->p++;
}

static int json_fail(json_cursor* c, const char* what) {
    return error_set(c->err, "%s:%d: %s (near '%.20s')", c->path, c->line, what, c->p);
}

// Parses a JSON string into a malloc'ed UTF-8 buffer (escapes \" \\ \/ \n \t \r \uXXXX for ASCII/BMP).
static int json_string(json_cursor* c, char** out) {
    if (*c->p != '"') return json_fail(c, "expected a string");
    c->p++;
    size_t capacity = 64, length = 0;
    char* text = malloc(capacity);
    if (!text) return json_fail(c, "out of memory");
    while (*c->p && *c->p != '"') {
        unsigned int codepoint = (unsigned char)*c->p++;
        if (codepoint == '\\') {
            char escape = *c->p++;
            switch (escape) {
            case 'n': codepoint = '\n'; break;
            case 't': codepoint = '\t'; break;
            case 'r': codepoint = '\r'; break;
            case '"': case '\\': case '/': codepoint = (unsigned char)escape; break;
            case 'u':
                if (sscanf(c->p, "%4x", &codepoint) != 1) {
                    free(text);
                    return json_fail(c, "bad \\u escape");
                }
                c->p += 4;
                break;
            default: free(text); return json_fail(c, "unknown escape in a string");
            }
        }
        if (length + 4 >= capacity) {
            capacity *= 2;
            char* grown = realloc(text, capacity);
            if (!grown) {
                free(text);
                return json_fail(c, "out of memory");
            }
            text = grown;
        }
        if (codepoint < 0x80) text[length++] = (char)codepoint;
        else if (codepoint < 0x800) {
            text[length++] = (char)(0xC0 | (codepoint >> 6));
            text[length++] = (char)(0x80 | (codepoint & 0x3F));
        } else {
            text[length++] = (char)(0xE0 | (codepoint >> 12));
            text[length++] = (char)(0x80 | ((codepoint >> 6) & 0x3F));
            text[length++] = (char)(0x80 | (codepoint & 0x3F));
        }
    }
    if (*c->p != '"') {
        free(text);
        return json_fail(c, "unterminated string");
    }
    c->p++;
    text[length] = '\0';
    *out = text;
    return 0;
}

static int json_number(json_cursor* c, double* out) {
    char* end;
    errno = 0;
    double value = strtod(c->p, &end);
    if (end == c->p || errno != 0 || !isfinite(value)) return json_fail(c, "expected a number");
    c->p = end;
    *out = value;
    return 0;
}

static int parse_request_line(json_cursor* c, workload_request* q, const tokenizer* tok, int vocab_size,
                              int max_seq_len) {
    memset(q, 0, sizeof *q);
    q->max_tokens = -1;
    skip_space(c);
    if (*c->p != '{') return json_fail(c, "expected an object {...}");
    c->p++;
    int status = 0;
    for (;;) {
        skip_space(c);
        if (*c->p == '}') {
            c->p++;
            break;
        }
        char* key = NULL;
        if (json_string(c, &key)) return -1;
        skip_space(c);
        if (*c->p != ':') {
            free(key);
            return json_fail(c, "expected ':' after a key");
        }
        c->p++;
        skip_space(c);
        if (strcmp(key, "prompt") == 0) {
            char* text = NULL;
            if (json_string(c, &text)) status = -1;
            else if (!tok) status = error_set(c->err, "%s:%d: \"prompt\" text needs a tokenizer; use \"prompt_ids\"", c->path, c->line);
            else {
                free(q->prompt);
                q->prompt = malloc((size_t)max_seq_len * sizeof *q->prompt);
                if (!q->prompt || tok_encode(tok, text, true, false, q->prompt, max_seq_len, &q->n_prompt, c->err))
                    status = error_set(c->err, "%s:%d: prompt: %s", c->path, c->line,
                                       q->prompt ? c->err->message : "out of memory");
            }
            free(text);
        } else if (strcmp(key, "prompt_ids") == 0) {
            free(q->prompt);
            q->prompt = malloc((size_t)max_seq_len * sizeof *q->prompt);
            q->n_prompt = 0;
            if (!q->prompt || *c->p != '[') status = json_fail(c, "\"prompt_ids\": expected an array of ids");
            else c->p++;
            while (status == 0) {
                skip_space(c);
                if (*c->p == ']') {
                    c->p++;
                    break;
                }
                double id;
                if (json_number(c, &id)) status = -1;
                else if (id != floor(id) || id < 0 || id >= vocab_size)
                    status = error_set(c->err, "%s:%d: prompt_ids: %g is not a token id in 0..%d", c->path, c->line, id,
                                       vocab_size - 1);
                else if (q->n_prompt >= max_seq_len - 1)
                    status = error_set(c->err, "%s:%d: prompt_ids: longer than the model's %d tokens", c->path, c->line,
                                       max_seq_len - 1);
                else q->prompt[q->n_prompt++] = (int32_t)id;
                skip_space(c);
                if (status == 0 && *c->p == ',') c->p++;
            }
        } else if (strcmp(key, "max_tokens") == 0 || strcmp(key, "arrival") == 0) {
            double value;
            if (json_number(c, &value)) status = -1;
            else if (key[0] == 'm') {
                if (value < 1 || value != floor(value) || value > max_seq_len)
                    status = error_set(c->err, "%s:%d: max_tokens: expected a whole number 1..%d, found %g", c->path,
                                       c->line, max_seq_len, value);
                else q->max_tokens = (int)value;
            } else if (value < 0) {
                status = error_set(c->err, "%s:%d: arrival: expected seconds >= 0, found %g", c->path, c->line, value);
            } else q->arrival_time = value;
        } else {
            status = error_set(c->err, "%s:%d: unknown key \"%s\" (expected prompt, prompt_ids, max_tokens, arrival)",
                               c->path, c->line, key);
        }
        free(key);
        if (status) return -1;
        skip_space(c);
        if (*c->p == ',') c->p++;
        else if (*c->p != '}') return json_fail(c, "expected ',' or '}'");
    }
    skip_space(c);
    if (*c->p != '\0') return json_fail(c, "extra text after the object");
    if (!q->prompt || q->n_prompt < 1) return error_set(c->err, "%s:%d: no \"prompt\" or \"prompt_ids\"", c->path, c->line);
    if (q->prompt[0] != TOK_BOS_ID) { // prompts always start with BOS, as in generate
        if (q->n_prompt >= max_seq_len - 1)
            return error_set(c->err, "%s:%d: prompt too long", c->path, c->line);
        memmove(q->prompt + 1, q->prompt, (size_t)q->n_prompt * sizeof *q->prompt);
        q->prompt[0] = TOK_BOS_ID;
        q->n_prompt++;
    }
    if (q->max_tokens < 0) return error_set(c->err, "%s:%d: missing \"max_tokens\"", c->path, c->line);
    if (q->n_prompt + q->max_tokens > max_seq_len)
        return error_set(c->err, "%s:%d: prompt (%d tokens) + max_tokens (%d) exceed the model's %d", c->path, c->line,
                         q->n_prompt, q->max_tokens, max_seq_len);
    return 0;
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

int workload_read(workload* out, const char* path, const tokenizer* tok, int vocab_size, int max_seq_len,
                  error_info* err) {
    memset(out, 0, sizeof *out);
    FILE* file = fopen(path, "r");
    if (!file) return error_set(err, "%s: cannot open: %s", path, strerror(errno));
    char* line = NULL;
    size_t line_capacity = 0;
    int capacity = 0, line_number = 0, status = 0;
    while (status == 0 && getline(&line, &line_capacity, file) >= 0) {
        line_number++;
        json_cursor c = {line, path, line_number, err};
        skip_space(&c);
        if (*c.p == '\0') continue; // blank line
        if (out->n_requests == capacity) {
            capacity = capacity ? 2 * capacity : 64;
            workload_request* grown = realloc(out->requests, (size_t)capacity * sizeof *grown);
            if (!grown) {
                status = error_set(err, "%s: out of memory", path);
                break;
            }
            out->requests = grown;
        }
        workload_request* q = &out->requests[out->n_requests];
        if (parse_request_line(&c, q, tok, vocab_size, max_seq_len)) {
            free(q->prompt);
            status = -1;
        } else {
            out->n_requests++;
        }
    }
    free(line);
    fclose(file);
    if (status == 0 && out->n_requests == 0) status = error_set(err, "%s: no requests in the file", path);
    if (status) {
        workload_free(out);
        return -1;
    }
    sort_by_arrival(out);
    return 0;
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
