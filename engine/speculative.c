// speculative: the --speculative flag, the draft model, and n-gram lookup
// (engine/speculative.h). The drafting and verifying themselves run inside
// engine_step (engine/engine.c).
#include "engine/speculative.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model_quant.h"

speculative_config speculative_config_default(void) {
    return (speculative_config){.kind = SPEC_NONE, .k = SPEC_DEFAULT_K};
}

const char* speculative_kind_name(speculative_kind kind) {
    switch (kind) {
    case SPEC_NONE: return "none";
    case SPEC_DRAFT: return "draft";
    case SPEC_LOOKUP: return "lookup";
    }
    return "?";
}

// A whole decimal number in [1, 1e6], else -1.
static long parse_count(const char* text, size_t length) {
    if (length == 0 || length > 7) return -1;
    long value = 0;
    for (size_t i = 0; i < length; i++) {
        if (!isdigit((unsigned char)text[i])) return -1;
        value = value * 10 + (text[i] - '0');
    }
    return value;
}

// True when `text` starts like a quantization scheme: w, digits, a, digits.
static bool looks_like_scheme(const char* text) {
    const char* p = text;
    if (*p != 'w' && *p != 'W') return false;
    p++;
    if (!isdigit((unsigned char)*p)) return false;
    while (isdigit((unsigned char)*p)) p++;
    if (*p != 'a' && *p != 'A') return false;
    p++;
    return isdigit((unsigned char)*p);
}

#define FLAG_USAGE "expected draft:SCHEME[:kK], draft:FILE[:kK] or lookup:N[:kK] (e.g. draft:w4a16:g32:k4, lookup:3)"

int speculative_config_parse(const char* text, speculative_config* out, error_info* err) {
    speculative_config c = speculative_config_default();
    if (!text || !*text) return error_set(err, "--speculative: empty; " FLAG_USAGE);
    if (strcmp(text, "none") == 0) {
        *out = c;
        return 0;
    }
    char body[sizeof c.draft_path];
    if (strlen(text) >= sizeof body) return error_set(err, "--speculative: %zu characters is too long", strlen(text));
    // A trailing ":kK" is the number of guesses.
    strcpy(body, text);
    char* last_colon = strrchr(body, ':');
    if (last_colon && (last_colon[1] == 'k' || last_colon[1] == 'K') && last_colon[2] != '\0' &&
        strspn(last_colon + 2, "-+0123456789") == strlen(last_colon + 2)) {
        long k = parse_count(last_colon + 2, strlen(last_colon + 2));
        if (k < 1 || k > SPEC_MAX_K)
            return error_set(err, "--speculative %s: k must be 1..%d guesses per step, found '%s'", text, SPEC_MAX_K,
                             last_colon + 2);
        c.k = (int)k;
        *last_colon = '\0';
    }
    if (strncmp(body, "lookup:", 7) == 0 || strcmp(body, "lookup") == 0) {
        const char* n_text = body[6] == ':' ? body + 7 : "";
        long n = parse_count(n_text, strlen(n_text));
        if (*n_text == '\0') return error_set(err, "--speculative %s: lookup needs N, the n-gram length (lookup:3)", text);
        if (n < 1 || n > SPEC_MAX_LOOKUP_N)
            return error_set(err, "--speculative %s: lookup's N must be 1..%d tokens, found '%s'", text, SPEC_MAX_LOOKUP_N,
                             n_text);
        c.kind = SPEC_LOOKUP;
        c.lookup_n = (int)n;
        *out = c;
        return 0;
    }
    if (strncmp(body, "draft:", 6) == 0 || strcmp(body, "draft") == 0) {
        const char* what = body[5] == ':' ? body + 6 : "";
        if (*what == '\0')
            return error_set(err, "--speculative %s: draft needs a quantization scheme or a model file (draft:w4a16:g32)",
                             text);
        c.kind = SPEC_DRAFT;
        if (looks_like_scheme(what)) {
            model_quant_spec spec;
            error_info scheme_err = {0};
            if (model_quant_spec_parse(what, &spec, &scheme_err)) {
                const char* why = scheme_err.message; // the quantizer's message names its own flag
                if (strncmp(why, "--quant: ", 9) == 0) why += 9;
                return error_set(err, "--speculative %s: draft scheme '%s': %s", text, what, why);
            }
            if (strlen(what) >= sizeof c.draft_scheme)
                return error_set(err, "--speculative %s: draft scheme '%s' is too long", text, what);
            strcpy(c.draft_scheme, what);
        } else {
            strcpy(c.draft_path, what);
        }
        *out = c;
        return 0;
    }
    return error_set(err, "--speculative %s: unknown proposer; " FLAG_USAGE, text);
}

void speculative_config_describe(const speculative_config* c, char* out, size_t capacity) {
    switch (c->kind) {
    case SPEC_NONE: snprintf(out, capacity, "none"); return;
    case SPEC_LOOKUP: snprintf(out, capacity, "lookup %d k%d", c->lookup_n, c->k); return;
    case SPEC_DRAFT: {
        const char* name = c->draft_scheme[0] ? c->draft_scheme : c->draft_path;
        const char* slash = strrchr(name, '/');
        snprintf(out, capacity, "draft %s k%d", slash && !c->draft_scheme[0] ? slash + 1 : name, c->k);
        return;
    }
    }
    snprintf(out, capacity, "?");
}

int speculative_load_draft(const speculative_config* c, const model* target, const char* target_path, model* draft,
                           error_info* err) {
    memset(draft, 0, sizeof *draft);
    if (c->kind != SPEC_DRAFT) return error_set(err, "speculative: %s has no draft model", speculative_kind_name(c->kind));
    const char* path = c->draft_scheme[0] ? target_path : c->draft_path;
    if (!path || !*path) return error_set(err, "--speculative: the draft needs the target model's file to quantize");
    if (model_load(draft, path, MODEL_DTYPE_FP32, err)) return -1;
    if (draft->config.vocab_size != target->config.vocab_size) {
        int draft_vocab = draft->config.vocab_size;
        model_free(draft);
        return error_set(err, "draft model %s: vocabulary of %d tokens, the target's has %d (the draft must share it)",
                         path, draft_vocab, target->config.vocab_size);
    }
    if (c->draft_scheme[0]) {
        model_quant_spec spec;
        if (model_quant_spec_parse(c->draft_scheme, &spec, err) ||
            model_quantize(draft, &spec, NULL, NULL, 0, NULL, NULL, err)) {
            model_free(draft);
            return -1;
        }
    }
    return 0;
}

double speculative_expected_tokens(double a, int k) {
    if (a >= 1.0) return k + 1.0;
    return (1.0 - pow(a, k + 1)) / (1.0 - a);
}

int speculative_lookup(const int32_t* tokens, int n_tokens, int n, int max_guesses, int32_t* guesses) {
    if (n < 1 || n_tokens <= n || max_guesses < 1) return 0;
    const int32_t* tail = tokens + n_tokens - n;
    // The latest earlier occurrence: the nearest context is the likeliest to repeat.
    for (int start = n_tokens - n - 1; start >= 0; start--) {
        if (memcmp(tokens + start, tail, (size_t)n * sizeof *tokens) != 0) continue;
        int next = start + n, count = 0;
        while (count < max_guesses && next + count < n_tokens) {
            guesses[count] = tokens[next + count];
            count++;
        }
        return count;
    }
    return 0;
}
