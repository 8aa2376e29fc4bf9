// serve_api: OpenAI request bodies read and checked with Jansson.
#include "lab/serve/api.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

int serve_fail(serve_error* error, int http_status, const char* type, const char* param, const char* format, ...) {
    error->http_status = http_status;
    error->type = type;
    snprintf(error->param, sizeof error->param, "%s", param ? param : "");
    va_list args;
    va_start(args, format);
    vsnprintf(error->message, sizeof error->message, format, args);
    va_end(args);
    return -1;
}

char* serve_error_json(const serve_error* error) {
    char* message = serve_utf8_sanitize(error->message, strlen(error->message));
    json_t* body = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", message ? message : "error", "type",
                             error->type ? error->type : "invalid_request_error", "param",
                             error->param[0] ? json_string(error->param) : json_null(), "code",
                             error->http_status == 404 ? json_string("model_not_found") : json_null());
    free(message);
    char* text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    return text ? text : strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
}

void serve_params_free(serve_params* params) {
    free(params->prompt);
    for (int i = 0; i < params->n_stops; i++)
        free(params->stops[i]);
    memset(params, 0, sizeof *params);
}

// ---- UTF-8 -------------------------------------------------------------------------------

// Length of the valid UTF-8 sequence at text[0..available), 0 when invalid,
// -1 when it is a valid start cut short by the end.
static int utf8_sequence_length(const unsigned char* text, size_t available) {
    unsigned char lead = text[0];
    int length;
    uint32_t min_value;
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF)
        length = 2, min_value = 0x80;
    else if (lead >= 0xE0 && lead <= 0xEF)
        length = 3, min_value = 0x800;
    else if (lead >= 0xF0 && lead <= 0xF4)
        length = 4, min_value = 0x10000;
    else
        return 0;
    uint32_t value = lead & (0x3F >> (length - 1));
    for (int i = 1; i < length; i++) {
        if ((size_t)i >= available) return -1;
        if ((text[i] & 0xC0) != 0x80) return 0;
        value = (value << 6) | (text[i] & 0x3F);
    }
    if (value < min_value || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return 0;
    return length;
}

char* serve_utf8_sanitize(const char* text, size_t length) {
    char* out = malloc(length * 3 + 1); // each bad byte becomes 3 bytes at most
    if (!out) return NULL;
    size_t n = 0;
    const unsigned char* bytes = (const unsigned char*)text;
    for (size_t i = 0; i < length;) {
        int step = utf8_sequence_length(bytes + i, length - i);
        if (step > 0) {
            memcpy(out + n, bytes + i, (size_t)step);
            n += (size_t)step;
            i += (size_t)step;
        } else {
            memcpy(out + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i++;
        }
    }
    out[n] = '\0';
    return out;
}

size_t serve_utf8_complete_prefix(const char* text, size_t length) {
    const unsigned char* bytes = (const unsigned char*)text;
    for (size_t i = 0; i < length;) {
        int step = utf8_sequence_length(bytes + i, length - i);
        if (step < 0) return i;
        i += step > 0 ? (size_t)step : 1;
    }
    return length;
}

// ---- the chat template --------------------------------------------------------------------

char* serve_chat_prompt_text(const char* const* roles, const char* const* contents, int n_messages) {
    size_t bytes = sizeof "Assistant:";
    for (int i = 0; i < n_messages; i++)
        bytes += strlen("Assistant: \n\n") + strlen(contents[i]);
    char* text = malloc(bytes);
    if (!text) return NULL;
    size_t n = 0;
    for (int i = 0; i < n_messages; i++) {
        const char* label = strcmp(roles[i], "system") == 0 ? "System"
                            : strcmp(roles[i], "user") == 0 ? "User"
                                                            : "Assistant";
        n += (size_t)sprintf(text + n, "%s: %s\n\n", label, contents[i]);
    }
    memcpy(text + n, "Assistant:", sizeof "Assistant:");
    return text;
}

// ---- reading fields ------------------------------------------------------------------------

static const char* json_type_word(const json_t* value) {
    switch (json_typeof(value)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

// An integer field in [min_value, max_value]; absent or null keeps *out.
static int read_int(json_t* body, const char* field, long long min_value, long long max_value, const char* limit_note,
                    long long* out, serve_error* error) {
    json_t* value = json_object_get(body, field);
    if (!value || json_is_null(value)) return 0;
    if (!json_is_integer(value))
        return serve_fail(error, 400, "invalid_request_error", field, "%s: expected an integer, found %s", field,
                          json_type_word(value));
    long long v = json_integer_value(value);
    if (v < min_value || v > max_value)
        return serve_fail(error, 400, "invalid_request_error", field, "%s: %lld is outside %lld..%lld%s", field, v,
                          min_value, max_value, limit_note ? limit_note : "");
    *out = v;
    return 0;
}

static int read_number(json_t* body, const char* field, double min_value, double max_value, double* out,
                       serve_error* error) {
    json_t* value = json_object_get(body, field);
    if (!value || json_is_null(value)) return 0;
    if (!json_is_number(value))
        return serve_fail(error, 400, "invalid_request_error", field, "%s: expected a number, found %s", field,
                          json_type_word(value));
    double v = json_number_value(value);
    if (!isfinite(v) || v < min_value || v > max_value)
        return serve_fail(error, 400, "invalid_request_error", field, "%s: %g is outside %g..%g", field, v, min_value,
                          max_value);
    *out = v;
    return 0;
}

static int read_bool(json_t* body, const char* field, bool* out, serve_error* error) {
    json_t* value = json_object_get(body, field);
    if (!value || json_is_null(value)) return 0;
    if (!json_is_boolean(value))
        return serve_fail(error, 400, "invalid_request_error", field, "%s: expected a boolean, found %s", field,
                          json_type_word(value));
    *out = json_is_true(value);
    return 0;
}

// The fields each endpoint knows. Fields OpenAI has but servelab does not
// implement are accepted only with their neutral value (checked below);
// any other name is refused, as OpenAI refuses it.
static const char* const COMPLETION_FIELDS[] = {"model",
                                                "prompt",
                                                "max_tokens",
                                                "temperature",
                                                "top_p",
                                                "seed",
                                                "n",
                                                "stop",
                                                "stream",
                                                "stream_options",
                                                "user",
                                                "echo",
                                                "logprobs",
                                                "best_of",
                                                "presence_penalty",
                                                "frequency_penalty",
                                                "logit_bias",
                                                "suffix",
                                                "return_token_ids",
                                                "ignore_eos",
                                                NULL};
static const char* const CHAT_FIELDS[] = {"model",
                                          "messages",
                                          "max_tokens",
                                          "max_completion_tokens",
                                          "temperature",
                                          "top_p",
                                          "seed",
                                          "n",
                                          "stop",
                                          "stream",
                                          "stream_options",
                                          "user",
                                          "logprobs",
                                          "top_logprobs",
                                          "presence_penalty",
                                          "frequency_penalty",
                                          "logit_bias",
                                          "return_token_ids",
                                          "ignore_eos",
                                          NULL};

static bool known_field(const char* const* fields, const char* name) {
    for (int i = 0; fields[i]; i++)
        if (strcmp(fields[i], name) == 0) return true;
    return false;
}

// Fields accepted only at their neutral value.
static int check_unsupported(json_t* body, serve_error* error) {
    json_t* value;
    if ((value = json_object_get(body, "suffix")) && !json_is_null(value))
        return serve_fail(error, 400, "invalid_request_error", "suffix", "suffix: not supported by servelab");
    if ((value = json_object_get(body, "best_of")) && !json_is_null(value) &&
        !(json_is_integer(value) && json_integer_value(value) == 1))
        return serve_fail(error, 400, "invalid_request_error", "best_of", "best_of: only 1 is supported by servelab");
    if ((value = json_object_get(body, "logit_bias")) && !json_is_null(value) &&
        !(json_is_object(value) && json_object_size(value) == 0))
        return serve_fail(error, 400, "invalid_request_error", "logit_bias", "logit_bias: not supported by servelab");
    static const char* const PENALTIES[] = {"presence_penalty", "frequency_penalty"};
    for (int i = 0; i < 2; i++)
        if ((value = json_object_get(body, PENALTIES[i])) && !json_is_null(value) &&
            !(json_is_number(value) && json_number_value(value) == 0.0))
            return serve_fail(error, 400, "invalid_request_error", PENALTIES[i], "%s: only 0 is supported by servelab",
                              PENALTIES[i]);
    if ((value = json_object_get(body, "user")) && !json_is_null(value) && !json_is_string(value))
        return serve_fail(error, 400, "invalid_request_error", "user", "user: expected a string, found %s",
                          json_type_word(value));
    return 0;
}

// Completions: logprobs = k (0..5) alternatives; echo (not with logprobs:
// servelab does not score the prompt). Chat: logprobs true, top_logprobs k (0..20).
static int read_logprobs(json_t* body, serve_params* params, serve_error* error) {
    params->logprobs = -1;
    if (params->endpoint == SERVE_COMPLETIONS) {
        long long k = -1;
        if (read_int(body, "logprobs", 0, SERVE_MAX_LOGPROBS_COMPLETIONS, NULL, &k, error)) return -1;
        params->logprobs = (int)k;
        if (read_bool(body, "echo", &params->echo, error)) return -1;
        if (params->echo && params->logprobs >= 0)
            return serve_fail(error, 400, "invalid_request_error", "echo",
                              "echo: not supported together with logprobs (servelab does not score the prompt)");
        return 0;
    }
    bool wanted = false;
    if (read_bool(body, "logprobs", &wanted, error)) return -1;
    long long k = 0;
    json_t* top = json_object_get(body, "top_logprobs");
    if (top && !json_is_null(top)) {
        if (!wanted)
            return serve_fail(error, 400, "invalid_request_error", "top_logprobs",
                              "top_logprobs: only allowed when logprobs is true");
        if (read_int(body, "top_logprobs", 0, SERVE_MAX_TOP_LOGPROBS, NULL, &k, error)) return -1;
    }
    params->logprobs = wanted ? (int)k : -1;
    return 0;
}

static int read_stops(json_t* body, serve_params* params, serve_error* error) {
    json_t* value = json_object_get(body, "stop");
    if (!value || json_is_null(value)) return 0;
    json_t* single = json_is_string(value) ? value : NULL;
    if (!single && !json_is_array(value))
        return serve_fail(error, 400, "invalid_request_error", "stop",
                          "stop: expected a string or an array of up to %d strings, found %s", SERVE_MAX_STOPS,
                          json_type_word(value));
    size_t count = single ? 1 : json_array_size(value);
    if (count > SERVE_MAX_STOPS)
        return serve_fail(error, 400, "invalid_request_error", "stop", "stop: %zu sequences, at most %d", count,
                          SERVE_MAX_STOPS);
    for (size_t i = 0; i < count; i++) {
        json_t* item = single ? single : json_array_get(value, i);
        if (!json_is_string(item))
            return serve_fail(error, 400, "invalid_request_error", "stop", "stop[%zu]: expected a string, found %s", i,
                              json_type_word(item));
        size_t bytes = json_string_length(item);
        if (bytes < 1 || bytes > SERVE_MAX_STOP_BYTES)
            return serve_fail(error, 400, "invalid_request_error", "stop", "stop[%zu]: %zu bytes, expected 1..%d", i,
                              bytes, SERVE_MAX_STOP_BYTES);
        if (memchr(json_string_value(item), '\0', bytes))
            return serve_fail(error, 400, "invalid_request_error", "stop", "stop[%zu]: contains a NUL character", i);
        params->stops[params->n_stops] = strdup(json_string_value(item));
        if (!params->stops[params->n_stops]) return serve_fail(error, 500, "server_error", NULL, "out of memory");
        params->n_stops++;
    }
    return 0;
}

// Encodes text (BOS first) into params->prompt.
static int encode_prompt(const char* field, const char* text, size_t bytes, const serve_limits* limits,
                         const tokenizer* tok, serve_params* params, serve_error* error) {
    if (!tok)
        return serve_fail(error, 400, "invalid_request_error", field,
                          "%s: this model has no tokenizer; give the prompt as token ids", field);
    if (memchr(text, '\0', bytes))
        return serve_fail(error, 400, "invalid_request_error", field, "%s: contains a NUL character", field);
    int capacity = limits->context_tokens;
    params->prompt = malloc((size_t)capacity * sizeof *params->prompt);
    if (!params->prompt) return serve_fail(error, 500, "server_error", NULL, "out of memory");
    error_info err = {{0}};
    int n = 0;
    if (tok_encode(tok, text, tok_adds_bos(tok), false, params->prompt, capacity, &n, &err))
        return serve_fail(error, 400, "invalid_request_error", field,
                          "%s: %d tokens or more, but the model's context is %d tokens (one must be left for the "
                          "completion)",
                          field, n, limits->context_tokens);
    params->n_prompt = n;
    return 0;
}

// prompt: a string, an array of one string, or an array of token ids
// (BOS is put first unless the ids start with it).
static int read_prompt(json_t* body, const serve_limits* limits, const tokenizer* tok, serve_params* params,
                       serve_error* error) {
    json_t* value = json_object_get(body, "prompt");
    if (!value || json_is_null(value))
        return serve_fail(error, 400, "invalid_request_error", "prompt", "prompt: required (a string or token ids)");
    if (json_is_array(value) && json_array_size(value) == 1 && json_is_string(json_array_get(value, 0)))
        value = json_array_get(value, 0);
    if (json_is_string(value))
        return encode_prompt("prompt", json_string_value(value), json_string_length(value), limits, tok, params, error);
    if (!json_is_array(value))
        return serve_fail(error, 400, "invalid_request_error", "prompt",
                          "prompt: expected a string or an array of token ids, found %s", json_type_word(value));
    size_t count = json_array_size(value);
    if (count == 0) return serve_fail(error, 400, "invalid_request_error", "prompt", "prompt: the array is empty");
    if (json_is_string(json_array_get(value, 0)) || json_is_array(json_array_get(value, 0)))
        return serve_fail(error, 400, "invalid_request_error", "prompt",
                          "prompt: several prompts in one request are not supported by servelab (send one "
                          "request per prompt, or use n)");
    bool has_bos =
        json_is_integer(json_array_get(value, 0)) && json_integer_value(json_array_get(value, 0)) == TOK_BOS_ID;
    size_t n_total = count + (has_bos ? 0 : 1);
    if (n_total >= (size_t)limits->context_tokens)
        return serve_fail(error, 400, "invalid_request_error", "prompt",
                          "prompt: %zu tokens (with BOS), but the model's context is %d tokens and one must be "
                          "left for the completion",
                          n_total, limits->context_tokens);
    params->prompt = malloc(n_total * sizeof *params->prompt);
    if (!params->prompt) return serve_fail(error, 500, "server_error", NULL, "out of memory");
    int n = 0;
    if (!has_bos) params->prompt[n++] = TOK_BOS_ID;
    for (size_t i = 0; i < count; i++) {
        json_t* item = json_array_get(value, i);
        if (!json_is_integer(item))
            return serve_fail(error, 400, "invalid_request_error", "prompt",
                              "prompt[%zu]: expected a token id, found %s", i, json_type_word(item));
        long long id = json_integer_value(item);
        if (id < 0 || id >= limits->vocab_size)
            return serve_fail(error, 400, "invalid_request_error", "prompt",
                              "prompt[%zu]: token id %lld is outside the vocabulary 0..%d", i, id,
                              limits->vocab_size - 1);
        params->prompt[n++] = (int32_t)id;
    }
    params->n_prompt = n;
    return 0;
}

// messages[i].content: a string, or an array of text parts joined into
// *joined (malloc'ed); *text points at the content either way.
static int read_content(json_t* content, size_t i, const char** text, char** joined, serve_error* error) {
    if (json_is_string(content)) {
        *text = json_string_value(content);
        if (memchr(*text, '\0', json_string_length(content)))
            return serve_fail(error, 400, "invalid_request_error", "messages",
                              "messages[%zu].content: contains a NUL character", i);
        return 0;
    }
    if (!json_is_array(content))
        return serve_fail(error, 400, "invalid_request_error", "messages",
                          "messages[%zu].content: expected a string or an array of text parts, found %s", i,
                          content ? json_type_word(content) : "nothing");
    size_t bytes = 1;
    for (size_t k = 0; k < json_array_size(content); k++) {
        json_t* part = json_array_get(content, k);
        json_t* part_text = json_object_get(part, "text");
        json_t* type = json_object_get(part, "type");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
            !json_is_string(part_text))
            return serve_fail(error, 400, "invalid_request_error", "messages",
                              "messages[%zu].content[%zu]: expected {\"type\": \"text\", \"text\": ...}", i, k);
        bytes += json_string_length(part_text);
    }
    *joined = calloc(bytes, 1);
    if (!*joined) return serve_fail(error, 500, "server_error", NULL, "out of memory");
    for (size_t k = 0; k < json_array_size(content); k++)
        strcat(*joined, json_string_value(json_object_get(json_array_get(content, k), "text")));
    *text = *joined;
    return 0;
}

static int read_messages(json_t* body, const serve_limits* limits, const tokenizer* tok, serve_params* params,
                         serve_error* error) {
    json_t* messages = json_object_get(body, "messages");
    if (!messages || json_is_null(messages))
        return serve_fail(error, 400, "invalid_request_error", "messages", "messages: required (an array of messages)");
    if (!json_is_array(messages))
        return serve_fail(error, 400, "invalid_request_error", "messages", "messages: expected an array, found %s",
                          json_type_word(messages));
    size_t count = json_array_size(messages);
    if (count < 1 || count > SERVE_MAX_MESSAGES)
        return serve_fail(error, 400, "invalid_request_error", "messages", "messages: %zu messages, expected 1..%d",
                          count, SERVE_MAX_MESSAGES);
    const char* roles[SERVE_MAX_MESSAGES];
    const char* contents[SERVE_MAX_MESSAGES];
    char* joined[SERVE_MAX_MESSAGES] = {0}; // content given as an array of text parts
    int status = 0;
    for (size_t i = 0; i < count && status == 0; i++) {
        json_t* message = json_array_get(messages, i);
        if (!json_is_object(message)) {
            status = serve_fail(error, 400, "invalid_request_error", "messages",
                                "messages[%zu]: expected an object, found %s", i, json_type_word(message));
            break;
        }
        json_t* role = json_object_get(message, "role");
        const char* r = json_is_string(role) ? json_string_value(role) : NULL;
        if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer"))) {
            status = serve_fail(error, 400, "invalid_request_error", "messages",
                                "messages[%zu].role: expected \"system\", \"developer\", \"user\" or \"assistant\"", i);
            break;
        }
        roles[i] = strcmp(r, "developer") == 0 ? "system" : r;
        status = read_content(json_object_get(message, "content"), i, &contents[i], &joined[i], error);
    }
    if (status == 0) {
        char* text = serve_chat_prompt_text(roles, contents, (int)count);
        if (!text)
            status = serve_fail(error, 500, "server_error", NULL, "out of memory");
        else {
            status = encode_prompt("messages", text, strlen(text), limits, tok, params, error);
            free(text);
        }
    }
    for (size_t i = 0; i < count; i++)
        free(joined[i]);
    return status;
}

// The body is an object of fields this endpoint knows, naming this server's model.
static int check_body(serve_endpoint endpoint, json_t* body, const serve_limits* limits, serve_error* error) {
    const char* key;
    json_t* value;
    if (!json_is_object(body))
        return serve_fail(error, 400, "invalid_request_error", NULL, "the body must be a JSON object, found %s",
                          json_type_word(body));
    const char* const* fields = endpoint == SERVE_CHAT ? CHAT_FIELDS : COMPLETION_FIELDS;
    json_object_foreach(body, key, value) {
        if (!known_field(fields, key))
            return serve_fail(error, 400, "invalid_request_error", key, "Unrecognized request argument supplied: %s",
                              key);
    }
    json_t* model = json_object_get(body, "model");
    if (!json_is_string(model))
        return serve_fail(error, 400, "invalid_request_error", "model",
                          "model: required, a string (this server has \"%s\")", limits->model_name);
    if (strcmp(json_string_value(model), limits->model_name) != 0) {
        char* name = serve_utf8_sanitize(json_string_value(model), strnlen(json_string_value(model), 100));
        serve_fail(error, 404, "invalid_request_error", "model",
                   "The model `%s` does not exist; this server has \"%s\"", name ? name : "?", limits->model_name);
        free(name);
        return -1;
    }
    return 0;
}

// max_tokens (or max_completion_tokens), n, temperature, top_p and seed;
// the prompt is read first, since the room it leaves bounds max_tokens.
static int read_sampling(serve_endpoint endpoint, json_t* body, const serve_limits* limits, serve_params* params,
                         serve_error* error) {
    int room = limits->context_tokens - params->n_prompt; // new tokens that still fit the context
    // OpenAI's default is 16 for completions; a chat may use the rest of the
    // context, as far as the KV pool holds it (a model whose context is
    // larger than the pool had every default chat refused as "could never run").
    int room_in_pool = limits->pool_tokens > 0 ? limits->pool_tokens - params->n_prompt : room;
    int chat_default = room_in_pool < room ? room_in_pool : room;
    if (chat_default < 1) chat_default = 1;
    long long max_tokens = endpoint == SERVE_CHAT ? chat_default : (room < 16 ? room : 16);
    char limit_note[160];
    snprintf(limit_note, sizeof limit_note, " (the model's context is %d tokens and the prompt has %d)",
             limits->context_tokens, params->n_prompt);
    const char* max_field = endpoint == SERVE_CHAT && json_object_get(body, "max_completion_tokens") &&
                                    !json_is_null(json_object_get(body, "max_completion_tokens"))
                                ? "max_completion_tokens"
                                : "max_tokens";
    if (read_int(body, max_field, 1, room, limit_note, &max_tokens, error)) return -1;
    params->max_tokens = (int)max_tokens;
    long long n = 1;
    if (read_int(body, "n", 1, limits->max_n, " (the server's --max-seqs)", &n, error)) return -1;
    params->n = (int)n;
    double temperature = 1.0, top_p = 1.0;
    if (read_number(body, "temperature", 0.0, 2.0, &temperature, error)) return -1;
    if (read_number(body, "top_p", 0.0, 1.0, &top_p, error)) return -1;
    if (top_p <= 0.0)
        return serve_fail(error, 400, "invalid_request_error", "top_p", "top_p: must be greater than 0 and at most 1");
    params->temperature = (float)temperature;
    params->top_p = sampler_top_p_from_double(top_p);
    json_t* seed = json_object_get(body, "seed");
    if (seed && !json_is_null(seed)) {
        long long s = 0;
        if (read_int(body, "seed", 0, INT64_MAX, NULL, &s, error)) return -1;
        params->seed = (uint64_t)s;
        params->seed_given = true;
    }
    return 0;
}

// stream, return_token_ids, ignore_eos, and stream_options (only with stream).
static int read_streaming(json_t* body, serve_params* params, serve_error* error) {
    const char* key;
    json_t* value;
    if (read_bool(body, "stream", &params->stream, error)) return -1;
    if (read_bool(body, "return_token_ids", &params->return_token_ids, error)) return -1;
    if (read_bool(body, "ignore_eos", &params->ignore_eos, error)) return -1;
    json_t* options = json_object_get(body, "stream_options");
    if (!options || json_is_null(options)) return 0;
    if (!params->stream)
        return serve_fail(error, 400, "invalid_request_error", "stream_options",
                          "stream_options: only allowed when stream is true");
    if (!json_is_object(options))
        return serve_fail(error, 400, "invalid_request_error", "stream_options",
                          "stream_options: expected an object, found %s", json_type_word(options));
    json_object_foreach(options, key, value) {
        if (strcmp(key, "include_usage") != 0 && strcmp(key, "continuous_usage_stats") != 0)
            return serve_fail(error, 400, "invalid_request_error", "stream_options",
                              "stream_options: unrecognized field %s (servelab knows include_usage)", key);
    }
    return read_bool(options, "include_usage", &params->include_usage, error);
}

int serve_parse_request(serve_endpoint endpoint, const char* body_text, size_t body_bytes, const serve_limits* limits,
                        const tokenizer* tok, serve_params* params, serve_error* error) {
    memset(params, 0, sizeof *params);
    params->endpoint = endpoint;
    json_error_t parse_error;
    json_t* body = json_loadb(body_text, body_bytes, JSON_REJECT_DUPLICATES, &parse_error);
    if (!body)
        return serve_fail(error, 400, "invalid_request_error", NULL,
                          "the body is not valid JSON: %s (line %d, column %d)", parse_error.text, parse_error.line,
                          parse_error.column);
    // The fields in the order their errors are reported.
    int status = check_body(endpoint, body, limits, error);
    if (status == 0) status = check_unsupported(body, error);
    if (status == 0)
        status = endpoint == SERVE_CHAT ? read_messages(body, limits, tok, params, error)
                                        : read_prompt(body, limits, tok, params, error);
    if (status == 0) status = read_sampling(endpoint, body, limits, params, error);
    if (status == 0) status = read_streaming(body, params, error);
    if (status == 0) status = read_stops(body, params, error);
    if (status == 0) status = read_logprobs(body, params, error);
    json_decref(body);
    return status ? -1 : 0;
}

// ---- top k -------------------------------------------------------------------------------

// Whether id a ranks above id b: the larger value, or the lower id on a tie.
static bool ranks_above(const float* values, int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
}

// heap[0..n): a min-heap under ranks_above (the root ranks lowest); restores it from `at` down.
static void sift_down(const float* values, int32_t* heap, int n, int at) {
    for (;;) {
        int lowest = at, left = 2 * at + 1, right = left + 1;
        if (left < n && ranks_above(values, heap[lowest], heap[left])) lowest = left;
        if (right < n && ranks_above(values, heap[lowest], heap[right])) lowest = right;
        if (lowest == at) return;
        int32_t swap = heap[at];
        heap[at] = heap[lowest];
        heap[lowest] = swap;
        at = lowest;
    }
}

int serve_top_k(const float* values, int n, int k, int32_t* ids_out) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    for (int32_t id = 0; id < k; id++)
        ids_out[id] = id;
    for (int at = k / 2 - 1; at >= 0; at--)
        sift_down(values, ids_out, k, at);
    for (int32_t id = k; id < n; id++)
        if (ranks_above(values, id, ids_out[0])) {
            ids_out[0] = id;
            sift_down(values, ids_out, k, 0);
        }
    // Heap order to best first: take the lowest-ranked root to the end each time.
    for (int size = k - 1; size > 0; size--) {
        int32_t lowest = ids_out[0];
        ids_out[0] = ids_out[size];
        ids_out[size] = lowest;
        sift_down(values, ids_out, size, 0);
    }
    return k;
}
