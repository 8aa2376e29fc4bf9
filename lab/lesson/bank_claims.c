// lesson_bank_claims: what the question bank (shared/seed/question-bank.txt,
// rewritten in quiz/bank.lua) says of each claim a lesson may check.
//
// A lesson states each claim as one sentence, and lab.check's bank_answer
// must equal the bank's answer to it: a lesson once declared tf10 with
// bank_answer = true, measured nothing, and printed a PASS. The answer
// follows the item's kind in the bank: a true/false item has its own
// answer; a spot-the-error item is stated as the mistaken sentence, so
// false; a why, edge-case or recall item is stated as the bank's model
// answer, so true. tests/lab/quiz/test_quiz_bank.c holds this list to
// quiz/bank.lua (the same 33 ids, each true/false answer equal).
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "lab/lesson/lesson.h"

static const lesson_bank_claim BANK_CLAIMS[] = {
    // true or false: the bank's own answer
    {"tf1", false, "PagedAttention makes the attention math use fewer FLOPs"},
    {"tf2", false, "weight-only INT4 always speeds up prefill"},
    {"tf3", false, "the KV cache grows quadratically with sequence length"},
    {"tf4", false, "continuous batching and PagedAttention are one mechanism"},
    {"tf5", false, "symmetric quantization is strictly worse than asymmetric"},
    {"tf6", false, "the largest block size is best (least bookkeeping)"},
    {"tf7", false, "INT4 has exactly twice the error of INT8"},
    {"tf8", true, "a quantized model need not keep an FP16 copy of its weights"},
    {"tf9", false, "with spare memory a bigger batch always raises tokens/s"},
    {"tf10", false, "two requests sharing a system prompt must each store its KV"},
    // spot the error: the mistaken sentence
    {"se1", false, "KV cache size = B x S x L x d x p (no factor 2)"},
    {"se2", false, "the whole-cache formula uses d_head because attention works per head"},
    {"se3", false, "AWQ minimises the layer's output error with a Hessian"},
    {"se4", false, "W8A8 quantizes only the weights (like W4A16, at 8 bits)"},
    {"se5", false, "the zero-point is z = round(r_min / s)"},
    {"se6", false, "per-tensor quantization is finer-grained than per-channel"},
    {"se7", false, "PagedAttention removes all KV memory waste"},
    {"se8", false, "a naive (contiguous) cache fragments memory because attention costs O(t^2)"},
    // why, edge cases, recall: the model answer
    {"why1", true, "decode is memory-bound and prefill compute-bound (intensity against the ridge point)"},
    {"why2", true, "INT4 weights speed up decode although the math runs in higher precision"},
    {"why3", true, "quantization needs both rounding (error <= s/2 in range) and clipping (saturate outliers)"},
    {"why4", true, "4-bit quantization needs group scales and outlier handling"},
    {"why5", true,
     "PagedAttention raises throughput by fitting more requests, but leaves one request's latency unchanged"},
    {"why6", true, "tensor parallelism leaves decode memory-bound"},
    {"edge1", true, "a sequence whose length is an exact multiple of block_size has no tail waste"},
    {"edge2", true, "a weight exactly halfway between two levels has the largest rounding error, s/2"},
    {"edge3", true, "a value far above r_max saturates at the top code 2^b - 1 and decodes to r_max"},
    {"edge4", true, "a value far below r_min saturates at code 0 and decodes to s(0 - z) = r_min"},
    {"edge5", true, "with batch 1 and a short prompt PagedAttention gains little"},
    {"edge6", true, "when two sharers write into a shared block, copy-on-write gives each its own copy"},
    {"edge7", true, "block_size = 1 gives no tail waste, the largest block tables and the slowest kernel"},
    {"edge8", true, "at S = 1 the cache holds one token per sequence: 2 x B x L x d x p"},
    {"recall1", true, "quantization wins on decode (fewer bytes) and risks prefill (extra dequantization work)"},
};

const lesson_bank_claim* lesson_bank_claim_find(const char* id) {
    for (size_t i = 0; i < sizeof BANK_CLAIMS / sizeof BANK_CLAIMS[0]; i++)
        if (strcmp(BANK_CLAIMS[i].id, id) == 0) return &BANK_CLAIMS[i];
    return NULL;
}

const lesson_bank_claim* lesson_bank_claims(int* count) {
    *count = (int)(sizeof BANK_CLAIMS / sizeof BANK_CLAIMS[0]);
    return BANK_CLAIMS;
}

// ---- lesson check: literal bank answers, read from the source -----------------------------

// A token of Lua source: a name, a string literal's contents, or one
// punctuation character; `line` is where it starts.
typedef struct source_token {
    enum { TOKEN_NAME, TOKEN_STRING, TOKEN_PUNCT, TOKEN_END } kind;
    const char* start; // names and strings: the text (strings without quotes)
    size_t length;
    int line;
} source_token;

typedef struct source_cursor {
    const char* p;
    int line;
} source_cursor;

// The level of a long bracket at p ("[[" 0, "[=[" 1, ...), -1 if none.
static int long_bracket_level(const char* p) {
    if (*p != '[') return -1;
    int level = 0;
    while (p[1 + level] == '=') level++;
    return p[1 + level] == '[' ? level : -1;
}

// Skips a long bracket's body from its opening at c->p; c->p ends past it.
static void skip_long_bracket(source_cursor* c, int level) {
    c->p += level + 2;
    while (*c->p) {
        if (*c->p == '\n') c->line++;
        if (*c->p == ']') {
            int k = 0;
            while (c->p[1 + k] == '=') k++;
            if (k == level && c->p[1 + k] == ']') {
                c->p += level + 2;
                return;
            }
        }
        c->p++;
    }
}

static source_token next_token(source_cursor* c) {
    for (;;) {
        while (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n') {
            if (*c->p == '\n') c->line++;
            c->p++;
        }
        if (c->p[0] == '-' && c->p[1] == '-') { // a comment, short or long
            c->p += 2;
            int level = long_bracket_level(c->p);
            if (level >= 0) skip_long_bracket(c, level);
            else
                while (*c->p && *c->p != '\n') c->p++;
            continue;
        }
        break;
    }
    source_token t = {TOKEN_END, c->p, 0, c->line};
    if (!*c->p) return t;
    if (isalpha((unsigned char)*c->p) || *c->p == '_') {
        t.kind = TOKEN_NAME;
        while (isalnum((unsigned char)*c->p) || *c->p == '_') c->p++;
        t.length = (size_t)(c->p - t.start);
    } else if (*c->p == '"' || *c->p == '\'') {
        char quote = *c->p++;
        t.kind = TOKEN_STRING;
        t.start = c->p;
        while (*c->p && *c->p != quote && *c->p != '\n') c->p += c->p[0] == '\\' && c->p[1] ? 2 : 1;
        t.length = (size_t)(c->p - t.start);
        if (*c->p == quote) c->p++;
    } else if (long_bracket_level(c->p) >= 0) {
        int level = long_bracket_level(c->p);
        t.kind = TOKEN_STRING;
        t.start = c->p + level + 2;
        skip_long_bracket(c, level);
        t.length = (size_t)(c->p - level - 2 - t.start);
    } else {
        t.kind = TOKEN_PUNCT;
        t.length = 1;
        c->p++;
    }
    return t;
}

static bool token_is(const source_token* t, const char* text) {
    return (t->kind == TOKEN_NAME || t->kind == TOKEN_PUNCT) && t->length == strlen(text) &&
           memcmp(t->start, text, t->length) == 0;
}

// Reads one lab.check{...} constructor from just past its '{': the literal
// id and bank_answer at its top level, if it has them.
static void read_check_fields(source_cursor* c, char* id, size_t id_size, int* answer, int* answer_line) {
    int depth = 1;
    source_token previous[2] = {{TOKEN_END, "", 0, 0}, {TOKEN_END, "", 0, 0}};
    while (depth > 0) {
        source_token t = next_token(c);
        if (t.kind == TOKEN_END) return;
        if (token_is(&t, "{") || token_is(&t, "(") || token_is(&t, "[")) depth++;
        else if (token_is(&t, "}") || token_is(&t, ")") || token_is(&t, "]")) depth--;
        // At the constructor's own level, `name = value`: previous[0] is the
        // name, previous[1] the '='.
        else if (depth == 1 && token_is(&previous[1], "=") && previous[0].kind == TOKEN_NAME) {
            if (token_is(&previous[0], "id") && t.kind == TOKEN_STRING && t.length < id_size) {
                memcpy(id, t.start, t.length);
                id[t.length] = '\0';
            } else if (token_is(&previous[0], "bank_answer") && (token_is(&t, "true") || token_is(&t, "false"))) {
                *answer = token_is(&t, "true");
                *answer_line = t.line;
            }
        }
        previous[0] = previous[1];
        previous[1] = t;
    }
}

int lesson_lint_bank_answers(const char* source, const char* path, char* problems, size_t size) {
    int n_problems = 0;
    size_t used = 0;
    problems[0] = '\0';
    source_cursor c = {source, 1};
    source_token window[3] = {{TOKEN_END, "", 0, 0}, {TOKEN_END, "", 0, 0}, {TOKEN_END, "", 0, 0}};
    for (;;) {
        source_token t = next_token(&c);
        if (t.kind == TOKEN_END) break;
        bool opens_check = token_is(&window[0], "lab") && token_is(&window[1], ".") && token_is(&window[2], "check") &&
                           token_is(&t, "{");
        window[0] = window[1];
        window[1] = window[2];
        window[2] = t;
        if (!opens_check) continue;
        char id[64] = "";
        int answer = -1, answer_line = t.line;
        read_check_fields(&c, id, sizeof id, &answer, &answer_line);
        if (!id[0] || answer < 0) continue; // computed at run time: the run checks it
        const lesson_bank_claim* claim = lesson_bank_claim_find(id);
        int written = 0;
        if (!claim)
            written = snprintf(problems + used, size - used,
                               "%s:%d: lab.check{id = '%s'}: bank_answer is for the question bank's claims, and the "
                               "bank has no '%s' (a claim of the lesson's own gives expected = true or false)\n",
                               path, answer_line, id, id);
        else if (claim->bank_answer != (answer == 1))
            written = snprintf(problems + used, size - used,
                               "%s:%d: lab.check{id = '%s'}: bank_answer = %s, but the question bank says '%s' is %s "
                               "(\"%s\")\n",
                               path, answer_line, id, answer ? "true" : "false", id,
                               claim->bank_answer ? "true" : "false", claim->statement);
        else
            continue;
        n_problems++;
        if (written > 0 && (size_t)written < size - used) used += (size_t)written;
    }
    return n_problems;
}
