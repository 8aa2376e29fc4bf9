// fuzz_lesson_api: the lesson host and its `lab` API (lab/lesson*.c) as a
// lesson author reaches them: argument checking, models, engines, requests,
// tokenizer calls, checks, quantization, the formulas.
//
// The input is not Lua: it is read as a small program of choices that
// generates a Lua lesson which is always valid syntax: a declaration
// (lab.lesson{...}, usually with claims c1..c3), then statements that call
// the API with fields and values drawn from typical and hostile ones
// (wrong types, NaN, huge integers, long strings, raw bytes, tables of
// thousands of ids, callbacks that close the engine they are called from,
// collected handles, ...). Most statements run inside pcall, so one Lua
// error does not end the lesson. The lesson is written to a fresh folder
// under /dev/shm and run with lesson_open / lesson_resume / lesson_close
// with a 64 MiB memory cap and a 1 s CPU limit; its output folder is in
// that folder too, and the folder is removed after each run.
//
// Every Lua error, limit or FAILED lesson is fine; a crash, a leak, a hang
// past libFuzzer's -timeout or a sanitizer report is a bug. To see the
// Lua a crashing input makes:
//   FUZZ_LESSON_PRINT=1 build/fuzz/bin/fuzz_lesson_api build/fuzz/artifacts/crash-...
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lab/lesson/lesson.h"
#include "tests/fuzz/support.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

enum {
    MAX_STATEMENTS = 40,
    MAX_DEPTH = 2,           // loops, callbacks and tables inside statements
    PROGRAM_CAPACITY = 1 << 20,
    SLOTS = 3,               // M[1..3], E[1..3], I[1..3], T[1..3]
};

// ---- the choices ---------------------------------------------------------------------

typedef struct choices {
    const uint8_t* data;
    size_t size, at;
} choices;

// 0..n-1 from the next byte; 0 once the input is used up.
static unsigned pick(choices* c, unsigned n) {
    if (n <= 1 || c->at >= c->size) return 0;
    return c->data[c->at++] % n;
}

static bool chance(choices* c, unsigned in) { return pick(c, in) == 0; } // 1 in `in`

#define PICK(c, array) (array)[pick((c), (unsigned)(sizeof(array) / sizeof((array)[0])))]

// ---- the program text ----------------------------------------------------------------

typedef struct program {
    char* text;
    size_t length;
    bool full; // ran out of room: the program is not run
} program;

static void emit(program* p, const char* format, ...) __attribute__((format(printf, 2, 3)));
static void emit(program* p, const char* format, ...) {
    if (p->full) return;
    va_list args;
    va_start(args, format);
    int n = vsnprintf(p->text + p->length, PROGRAM_CAPACITY - p->length, format, args);
    va_end(args);
    if (n < 0 || (size_t)n >= PROGRAM_CAPACITY - p->length) {
        p->full = true;
        return;
    }
    p->length += (size_t)n;
}

// A Lua string literal of raw bytes (every byte not a letter, digit or
// space as a three-digit \ddd escape).
static void emit_bytes(program* p, const uint8_t* bytes, size_t length) {
    emit(p, "\"");
    for (size_t i = 0; i < length; i++) {
        unsigned char ch = bytes[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == ' ')
            emit(p, "%c", ch);
        else
            emit(p, "\\%03u", ch);
    }
    emit(p, "\"");
}

// ---- values --------------------------------------------------------------------------

static const char* const INTEGERS[] = {
    "0", "1", "2", "3", "-1", "4", "7", "8", "15", "16", "17", "31", "32", "33", "63", "64", "100", "127", "128",
    "255", "256", "257", "258", "259", "512", "1000", "1024", "4096", "65535", "65536", "1048576", "2147483647",
    "2147483648", "-2147483648", "4294967295", "4294967296", "9007199254740993", "math.maxinteger",
    "math.mininteger", "-2",
};
static const char* const FLOATS[] = {"0.5", "-0.0", "1e308", "-1e308", "1e-320", "(0/0)", "(1/0)", "(-1/0)",
                                     "3.7", "2^63", "-2^63", "2^31", "1e9", "0.999", "1.0", "16.0"};
static const char* const STRINGS[] = {
    "\"\"", "\"tiny\"", "\"Once upon a time\"", "\"paged\"", "\"contiguous\"", "\"fp16\"", "\"fp32\"", "\"int8\"",
    "\"w4a16:g32\"", "\"H100\"", "\"layers.0.wq\"", "\"token_embedding\"", "\"\\0\"", "\"\\255\\254\\253\"",
    "\"h\\195\\169llo\"", "\"%s%n%d\"", "\"../../etc/passwd\"", "\"c1\"", "\"x\"", "\"<0x41>\"",
};
static const char* const LOOP_ITEMS[] = {"i", "i % 259", "-i", "i * 0.5", "1e308", "(0/0)", "'x'", "i % 7 - 3",
                                         "i % 2 == 0", "{i}", "math.maxinteger - i"};
static const char* const LOOP_COUNTS[] = {"0", "1", "2", "7", "64", "255", "256", "1000", "5000", "70000"};
static const char* const SLOT_TABLES[] = {"M", "E", "I", "T"};

static void emit_value(program* p, choices* c, int depth);
static void emit_statement(program* p, choices* c, int depth);

static void emit_function(program* p, choices* c, int depth) {
    switch (pick(c, 4)) {
    case 0: emit(p, "function() error(\"boom\") end"); break;
    case 1:
        emit(p, "function(...) ");
        if (depth < MAX_DEPTH) emit_statement(p, c, depth + 1);
        emit(p, " return ");
        emit_value(p, c, MAX_DEPTH);
        emit(p, ", ");
        emit_value(p, c, MAX_DEPTH);
        emit(p, " end");
        break;
    case 2: emit(p, "function(r) return r ~= nil and (r.step or 0) > %s end", PICK(c, INTEGERS)); break;
    default: emit(p, "function(...) return %s, \"evidence\" end", chance(c, 2) ? "true" : "false"); break;
    }
}

static void emit_value(program* p, choices* c, int depth) {
    switch (pick(c, 13)) {
    case 0: emit(p, "%s", PICK(c, INTEGERS)); break;
    case 1: emit(p, "%s", PICK(c, FLOATS)); break;
    case 2: emit(p, "%s", PICK(c, STRINGS)); break;
    case 3: {
        size_t length = pick(c, 33);
        if (length > c->size - c->at) length = c->size - c->at;
        emit_bytes(p, c->data + c->at, length);
        c->at += length;
        break;
    }
    case 4: emit(p, chance(c, 2) ? "true" : "false"); break;
    case 5: emit(p, "nil"); break;
    case 6: {
        emit(p, "{");
        unsigned n = depth < MAX_DEPTH ? pick(c, 5) : 0;
        for (unsigned i = 0; i < n; i++) {
            if (i) emit(p, ", ");
            emit_value(p, c, depth + 1);
        }
        emit(p, "}");
        break;
    }
    case 7:
        emit(p, "(function() local t = {} for i = 1, %s do t[i] = %s end return t end)()", PICK(c, LOOP_COUNTS),
             PICK(c, LOOP_ITEMS));
        break;
    case 8: emit(p, "%s[%u]", PICK(c, SLOT_TABLES), pick(c, SLOTS) + 1); break;
    case 9:
        if (depth < MAX_DEPTH) emit_function(p, c, depth + 1);
        else emit(p, "print");
        break;
    case 10: emit(p, "string.rep(%s, %s)", PICK(c, STRINGS), PICK(c, LOOP_COUNTS)); break;
    case 11: {
        uint32_t v = 0;
        for (int i = 0; i < 4; i++) v = v << 8 | pick(c, 256);
        emit(p, "%d", (int32_t)v);
        break;
    }
    default: emit(p, "T[%u] and T[%u][%u]", pick(c, SLOTS) + 1, pick(c, SLOTS) + 1, pick(c, 4) + 1); break;
    }
}

// ---- fields: typical values for each kind of field, else any value ----------------------

typedef enum field_kind {
    F_COUNT,   // small whole numbers
    F_NUMBER,  // reals
    F_BOOL,
    F_CHOICE,  // one of the field's words, as a string
    F_RAW,     // one of the field's words, as Lua (numbers)
    F_MODEL,   // a model handle or a preset name
    F_IDS,     // token ids
    F_TEXT,
    F_FUNCTION,
    F_VALUES,  // numbers
    F_INPUTS,  // rows of numbers
    F_RANGE,   // {low, high}
    F_DEVICE,
} field_kind;

typedef struct field_spec {
    const char* name;
    field_kind kind;
    const char* words; // F_CHOICE: words separated by '|'
} field_spec;

static const char* const COUNTS[] = {"0", "1", "1", "2", "3", "4", "8", "16", "32", "64", "128", "256", "257", "-1",
                                     "1048576", "1.5"};
static const char* const NUMBERS[] = {"0", "0.5", "1", "2", "100", "-1", "1e9", "(0/0)", "1e-9", "0.999"};
// Not "small": it fits the cap, but synthesizing its 14M parameters takes
// seconds under the sanitizers and cannot be stopped by the time limit.
// "medium" and "large" are over the cap and refused before anything is made.
static const char* const MODEL_SPECS[] = {"\"tiny\"", "\"tiny\"", "\"tiny\"", "\"medium\"", "\"nope\"",
                                          "\"models/none.bin\"", "\"../x.bin\"", "\"/dev/zero\""};
static const char* const TEXTS[] = {"\"Once upon a time\"", "\"\"", "\"hi\"", "\"h\\195\\169llo \\226\\130\\172\"",
                                    "\"\\0x\"", "\"<s></s>\"", "\"\\255\""};

static void emit_ids(program* p, choices* c) {
    switch (pick(c, 4)) {
    case 0: emit(p, "{1, 75, 104, 111, 111, 114}"); break;
    case 1: emit(p, "{%s, %s, %s}", PICK(c, INTEGERS), PICK(c, INTEGERS), PICK(c, INTEGERS)); break;
    case 2:
        emit(p, "(function() local t = {} for i = 1, %s do t[i] = %s end return t end)()", PICK(c, LOOP_COUNTS),
             PICK(c, LOOP_ITEMS));
        break;
    default: emit(p, "T[%u] or {}", pick(c, SLOTS) + 1); break;
    }
}

// One of the words separated by '|' (quoted: a Lua string), or, one time in
// count + 1, a word that is not among them.
static void emit_word(program* p, choices* c, const char* words, bool quoted) {
    unsigned count = 1;
    for (const char* w = words; *w; w++) count += *w == '|';
    unsigned which = pick(c, count + 1);
    if (which == count) {
        emit(p, "%s", quoted ? (chance(c, 2) ? "\"sideways\"" : "\"\"") : "-3");
        return;
    }
    const char* start = words;
    for (unsigned i = 0; i < which; i++) start = strchr(start, '|') + 1;
    const char* end = strchr(start, '|');
    int length = (int)(end ? end - start : (ptrdiff_t)strlen(start));
    emit(p, quoted ? "\"%.*s\"" : "%.*s", length, start);
}

static void emit_choice(program* p, choices* c, const char* words) { emit_word(p, c, words, true); }

static void emit_field_value(program* p, choices* c, const field_spec* f, int depth) {
    if (chance(c, 10)) {
        emit_value(p, c, depth);
        return;
    }
    switch (f->kind) {
    case F_COUNT: emit(p, "%s", PICK(c, COUNTS)); break;
    case F_NUMBER: emit(p, "%s", PICK(c, NUMBERS)); break;
    case F_BOOL: emit(p, chance(c, 2) ? "true" : "false"); break;
    case F_CHOICE: emit_choice(p, c, f->words); break;
    case F_RAW: emit_word(p, c, f->words, false); break;
    case F_MODEL:
        if (chance(c, 2)) emit(p, "M[%u]", pick(c, SLOTS) + 1);
        else emit(p, "%s", PICK(c, MODEL_SPECS));
        break;
    case F_IDS: emit_ids(p, c); break;
    case F_TEXT: emit(p, "%s", PICK(c, TEXTS)); break;
    case F_FUNCTION:
        if (depth < MAX_DEPTH) emit_function(p, c, depth + 1);
        else emit(p, "function() return true, \"e\" end");
        break;
    case F_VALUES:
        if (chance(c, 2)) emit(p, "{-1, 0, 3, 100, 0.25, -7.5, 2, 9}");
        else emit(p, "(function() local t = {} for i = 1, %s do t[i] = %s end return t end)()", PICK(c, LOOP_COUNTS),
                  PICK(c, LOOP_ITEMS));
        break;
    case F_INPUTS:
        emit(p, "(function() local t = {} for r = 1, %s do local row = {} for i = 1, %s do row[i] = (r * i) %% 5 - 2 "
                "end t[r] = row end return t end)()",
             PICK(c, COUNTS), PICK(c, COUNTS));
        break;
    case F_RANGE: emit(p, "{%s, %s}", PICK(c, NUMBERS), PICK(c, NUMBERS)); break;
    case F_DEVICE:
        switch (pick(c, 4)) {
        case 0: emit(p, "{bandwidth = %s, peak_flops = %s}", PICK(c, NUMBERS), PICK(c, NUMBERS)); break;
        case 1: emit(p, "\"nowhere\""); break;
        default: emit_choice(p, c, "H100|A100|H200|L4|4090|rtx"); break;
        }
        break;
    }
}

static const field_spec ENGINE_FIELDS[20];

// {field = value, ...}: usually `lead` first (the field a call cannot do
// without: a model, a prompt), then a few of the fields, sometimes one
// twice or one that does not exist.
static void emit_fields(program* p, choices* c, const field_spec* lead, const field_spec* fields, size_t n_fields,
                        int depth) {
    emit(p, "{");
    bool first = true;
    if (lead && !chance(c, 4)) {
        emit(p, "%s = ", lead->name);
        emit_field_value(p, c, lead, depth);
        first = false;
    }
    // An engine's default KV pool (67 MiB for tiny) is over the lesson's
    // 64 MiB cap: usually ask for a small one, so that engines get made.
    if (fields == ENGINE_FIELDS && !chance(c, 4)) {
        static const char* const pools[] = {"kv_mem = \"256KiB\"", "kv_mem = \"1MiB\"", "kv_mem = \"4MiB\"",
                                            "num_blocks = 16", "num_blocks = 2"};
        emit(p, "%s%s", first ? "" : ", ", PICK(c, pools));
        first = false;
    }
    unsigned n = pick(c, 7);
    for (unsigned i = 0; i < n; i++) {
        if (!first) emit(p, ", ");
        first = false;
        if (chance(c, 24)) {
            emit(p, "nonsense = 1");
            continue;
        }
        const field_spec* f = &fields[pick(c, (unsigned)n_fields)];
        emit(p, "%s = ", f->name);
        emit_field_value(p, c, f, depth);
    }
    emit(p, "}");
}

#define EMIT_FIELDS(p, c, array, depth) \
    emit_fields((p), (c), &(array)[0], (array), sizeof(array) / sizeof((array)[0]), (depth))

static const field_spec MODEL_FIELDS[] = {
    {"model", F_MODEL, NULL}, {"dtype", F_CHOICE, "fp32|fp16"}, {"seed", F_COUNT, NULL},
    {"quant", F_CHOICE, "w8a16|w4a16|w8a8|w4a16:g32|w4a16:g32:awq|w8a8:gptq:sym|w4a16:g16:rtn:asym|w4a16:g7"},
    {"tokenizer", F_TEXT, NULL},
};
static const field_spec ENGINE_FIELDS[20] = {
    {"model", F_MODEL, NULL},
    {"model", F_MODEL, NULL},
    {"kv", F_CHOICE, "paged|contiguous"},
    {"block_size", F_COUNT, NULL},
    {"num_blocks", F_COUNT, NULL},
    {"kv_mem", F_CHOICE, "64KiB|1MiB|8MiB|1GiB|lots|0"},
    {"kv_dtype", F_CHOICE, "fp16|fp32|int8"},
    {"reserve", F_CHOICE, "max|request"},
    {"batching", F_CHOICE, "continuous|static"},
    {"max_seqs", F_COUNT, NULL},
    {"max_batched_tokens", F_COUNT, NULL},
    {"threads", F_RAW, "1|1|2"},
    {"chunked_prefill", F_BOOL, NULL},
    {"prefix_caching", F_BOOL, NULL},
    {"watermark_blocks", F_COUNT, NULL},
    {"tp", F_COUNT, NULL},
    {"tp_link", F_CHOICE, "nvlink|pcie"},
    {"dtype", F_CHOICE, "fp32|fp16"},
    {"quant", F_CHOICE, "w8a16|w4a16:g32|w8a8"},
    {"seed", F_COUNT, NULL},
};
static const field_spec ADD_FIELDS[] = {
    {"prompt", F_TEXT, NULL},     {"prompt", F_TEXT, NULL},    {"ids", F_IDS, NULL},
    {"prefix", F_TEXT, NULL},     {"prefix", F_IDS, NULL},     {"max_tokens", F_COUNT, NULL},
    {"max_tokens", F_COUNT, NULL}, {"n", F_COUNT, NULL},       {"temperature", F_NUMBER, NULL},
    {"top_p", F_NUMBER, NULL},    {"seed", F_COUNT, NULL},     {"stop_at_eos", F_BOOL, NULL},
    {"arrival", F_NUMBER, NULL},
};
static const field_spec CHECK_FIELDS[] = {
    {"id", F_CHOICE, "c1|c2|c3|zz"}, {"id", F_CHOICE, "c1|c2|c3"},  {"claim", F_TEXT, NULL},
    {"expected", F_BOOL, NULL},      {"verdict", F_BOOL, NULL},     {"evidence", F_TEXT, NULL},
    {"measure", F_FUNCTION, NULL},   {"measure", F_FUNCTION, NULL},
};
static const field_spec QUANTIZE_FIELDS[] = {
    {"values", F_VALUES, NULL},   {"values", F_VALUES, NULL},
    {"rows", F_COUNT, NULL},      {"tensor", F_CHOICE, "layers.0.wq|layers.1.w2|token_embedding|classifier|layers.9.wq"},
    {"model", F_MODEL, NULL},     {"bits", F_COUNT, NULL},
    {"symmetric", F_BOOL, NULL},  {"granularity", F_CHOICE, "tensor|channel|group"},
    {"group_size", F_COUNT, NULL}, {"clip", F_BOOL, NULL},
    {"range", F_RANGE, NULL},     {"method", F_CHOICE, "rtn|awq|gptq"},
    {"inputs", F_INPUTS, NULL},
};
static const field_spec KV_BYTES_FIELDS[] = {
    {"model", F_MODEL, NULL}, {"n_layers", F_COUNT, NULL}, {"kv_dim", F_COUNT, NULL},
    {"batch", F_COUNT, NULL}, {"seq", F_COUNT, NULL},      {"bytes_per_element", F_COUNT, NULL},
};
static const field_spec ROOFLINE_FIELDS[] = {
    {"bytes", F_NUMBER, NULL}, {"flops", F_NUMBER, NULL}, {"device", F_DEVICE, NULL}, {"int8", F_BOOL, NULL},
};
static const field_spec TIME_FIELDS[] = {
    {"model", F_MODEL, NULL},  {"phase", F_CHOICE, "prefill|decode"}, {"tokens", F_RAW, "1|2|4|0"},
    {"batch", F_RAW, "1|2"},   {"repeats", F_RAW, "1|2"},             {"context", F_RAW, "1|4|100000"},
    {"threads", F_RAW, "1"},
};
static const char* const ENGINE_METHODS[] = {"sequence", "sequences", "pool",   "queues",   "totals",  "logits",
                                             "config",   "record",    "has_work", "cancel", "model",   "step"};
static const char* const MODEL_TENSORS[] = {"\"layers.0.wq\"", "\"layers.1.w3\"", "\"token_embedding\"",
                                            "\"classifier\"",  "\"layers.-1.wq\"", "\"layers.99.w1\"",
                                            "\"layers.0.\"",   "\"\""};

// ---- statements ----------------------------------------------------------------------------

static void emit_statement(program* p, choices* c, int depth) {
    unsigned k = pick(c, SLOTS) + 1, j = pick(c, SLOTS) + 1;
    switch (pick(c, 24)) {
    case 0:
        emit(p, "M[%u] = lab.model(", k);
        if (chance(c, 2)) emit(p, "\"tiny\"");
        else if (chance(c, 2)) EMIT_FIELDS(p, c, MODEL_FIELDS, depth);
        else emit_value(p, c, depth);
        emit(p, ")");
        break;
    case 1:
    case 2:
        emit(p, "E[%u] = lab.engine", k);
        EMIT_FIELDS(p, c, ENGINE_FIELDS, depth);
        break;
    case 3:
    case 4:
        emit(p, "I[%u] = E[%u]:add", k, j);
        EMIT_FIELDS(p, c, ADD_FIELDS, depth);
        break;
    case 5: emit(p, "T[%u] = E[%u]:step()", k, j); break;
    case 6:
        emit(p, "T[%u] = E[%u]:run(", k, j);
        switch (pick(c, 3)) {
        case 0: break;
        case 1: emit(p, "{max_steps = %s}", PICK(c, COUNTS)); break;
        default:
            emit(p, "{max_steps = %s, stop_when = ", PICK(c, COUNTS));
            if (chance(c, 3)) emit(p, "function(r) E[%u]:close() return false end", j); // closes itself
            else if (depth < MAX_DEPTH) emit_function(p, c, depth + 1);
            else emit(p, "function() return true end");
            emit(p, "}");
            break;
        }
        emit(p, ")");
        break;
    case 7:
        emit(p, "T[%u] = M[%u]:encode(", k, j);
        if (chance(c, 3)) emit_value(p, c, depth);
        else emit(p, "%s", PICK(c, TEXTS));
        emit(p, ")");
        break;
    case 8:
        emit(p, "T[%u] = M[%u]:decode(", k, j);
        emit_ids(p, c);
        emit(p, ")");
        break;
    case 9:
        if (chance(c, 2)) { // well formed, so that the measurement runs
            emit(p, "lab.check{id = \"c%u\", claim = \"a claim\", expected = %s, ", pick(c, 4) + 1,
                 chance(c, 2) ? "true" : "false");
            if (chance(c, 2)) {
                emit(p, "measure = ");
                emit_field_value(p, c, &CHECK_FIELDS[6], depth);
            } else {
                emit(p, "verdict = %s, evidence = ", chance(c, 2) ? "true" : "false");
                emit_value(p, c, depth);
            }
            emit(p, "}");
        } else {
            emit(p, "lab.check");
            EMIT_FIELDS(p, c, CHECK_FIELDS, depth);
        }
        break;
    case 10:
        emit(p, "T[%u] = lab.quantize", k);
        EMIT_FIELDS(p, c, QUANTIZE_FIELDS, depth);
        break;
    case 11:
        emit(p, "M[%u] = lab.quantize_model(M[%u], ", k, j);
        emit_choice(p, c, "w8a16|w4a16|w8a8|w4a16:g32|w4a16:g32:awq|w4a16:g64:gptq|w8a8:sym");
        emit(p, ")");
        break;
    case 12: emit(p, "T[%u] = lab.compare(M[%u], M[%u])", k, j, pick(c, SLOTS) + 1); break;
    case 13:
        emit(p, "T[%u] = lab.kv_bytes", k);
        EMIT_FIELDS(p, c, KV_BYTES_FIELDS, depth);
        break;
    case 14:
        emit(p, "T[%u] = lab.roofline", k);
        EMIT_FIELDS(p, c, ROOFLINE_FIELDS, depth);
        break;
    case 15:
        if (chance(c, 2)) {
            emit(p, "T[%u] = lab.median(", k);
            if (chance(c, 2)) emit_value(p, c, depth);
            else emit(p, "{3, 1, 2}");
            emit(p, ")");
        } else {
            emit(p, "T[%u] = lab.devices()", k);
        }
        break;
    case 16: {
        const char* method = PICK(c, ENGINE_METHODS);
        emit(p, "T[%u] = E[%u]:%s(", k, j, method);
        if (chance(c, 2)) emit(p, "I[%u]", pick(c, SLOTS) + 1);
        else if (chance(c, 2)) emit_value(p, c, depth);
        emit(p, ")");
        break;
    }
    case 17: emit(p, "E[%u]:close()", j); break;
    case 18:
        if (chance(c, 2)) emit(p, "T[%u] = M[%u]:info()", k, j);
        else emit(p, "T[%u] = M[%u]:tensor(%s)", k, j, PICK(c, MODEL_TENSORS));
        break;
    case 19:
        emit(p, "T[%u] = lab.time", k);
        EMIT_FIELDS(p, c, TIME_FIELDS, depth);
        break;
    case 20:
        switch (pick(c, 3)) {
        case 0:
            emit(p, "lab.say(");
            emit_value(p, c, depth);
            emit(p, ")");
            break;
        case 1:
            emit(p, "print(");
            emit_value(p, c, depth);
            emit(p, ", ");
            emit_value(p, c, depth);
            emit(p, ")");
            break;
        default: emit(p, "lab.pause()"); break;
        }
        break;
    case 21:
        // Drop a handle (maybe the one an engine uses) and collect.
        emit(p, "%s[%u] = nil collectgarbage()", chance(c, 2) ? "M" : "E", k);
        break;
    case 22:
        if (depth < MAX_DEPTH) {
            static const char* const repeats[] = {"0", "1", "2", "3", "8", "64", "-1", "1.5"};
            emit(p, "for _ = 1, %s do ", PICK(c, repeats));
            emit_statement(p, c, depth + 1);
            emit(p, " end");
        } else {
            emit(p, "T[%u] = tostring(E[%u]) .. tostring(M[%u])", k, j, j);
        }
        break;
    default:
        switch (pick(c, 3)) {
        case 0: emit(p, "E[%u] = E[%u]", k, j); break;
        case 1: emit(p, "M[%u] = E[%u]:model()", k, j); break;
        default: emit(p, "T[%u] = {lab.full, lab.interactive, lab.lesson_dir, lab.output_dir}", k); break;
        }
        break;
    }
}

static void emit_declaration(program* p, choices* c) {
    switch (pick(c, 8)) {
    case 5:
        emit(p, "lab.lesson{title = \"fuzz\", claims = (function() local t = {} for i = 1, %s do t[i] = \"c\" .. i end "
                "return t end)()}\n",
             PICK(c, COUNTS));
        break;
    case 6:
        emit(p, "lab.lesson{title = ");
        emit_value(p, c, 1);
        emit(p, ", claims = ");
        emit_value(p, c, 1);
        emit(p, "}\n");
        break;
    case 7: break; // no declaration
    default: emit(p, "lab.lesson{title = \"fuzz\", claims = {\"c1\", \"c2\", \"c3\"}}\n"); break;
    }
}

static void generate_lesson(program* p, choices* c) {
    emit_declaration(p, c);
    emit(p, "local M, E, I, T = {}, {}, {}, {}\n");
    for (int n = 0; n < MAX_STATEMENTS && c->at < c->size && !p->full; n++) {
        bool protect = !chance(c, 8);
        if (protect) emit(p, "pcall(function() ");
        emit_statement(p, c, 0);
        emit(p, protect ? " end)\n" : "\n");
    }
}

// ---- running it ----------------------------------------------------------------------------

static void on_say(void* user, const char* text) {
    (void)user;
    volatile size_t n = strlen(text); // the text must be valid for the call
    (void)n;
}

static void on_check(void* user, const lesson_check_result* r) {
    (void)user;
    volatile size_t n = (r->id ? strlen(r->id) : 0) + (r->claim ? strlen(r->claim) : 0) +
                        (r->evidence ? strlen(r->evidence) : 0);
    (void)n;
    FUZZ_CHECK((unsigned)r->outcome <= CHECK_FAIL);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    bool print = getenv("FUZZ_LESSON_PRINT") != NULL;
    choices c = {data, size, 0};
    program p = {malloc(PROGRAM_CAPACITY), 0, false};
    if (!p.text) return 0;
    p.text[0] = '\0';
    bool interactive = pick(&c, 2) == 1;
    generate_lesson(&p, &c);
    if (print) fprintf(stderr, "---- lesson (%zu bytes, interactive %d)%s\n%s----\n", p.length, interactive,
                       p.full ? " not run: too long" : "", p.text);
    char dir[256], path[320], output[320];
    if (p.full || fuzz_make_temp_dir(dir, sizeof dir, "fuzz-lesson") != 0) {
        free(p.text);
        return 0;
    }
    snprintf(path, sizeof path, "%s/fuzz.lua", dir);
    snprintf(output, sizeof output, "%s/output", dir);
    if (fuzz_write_file(path, p.text, p.length) == 0) {
        lesson_options options = lesson_options_default();
        options.interactive = interactive;
        options.time_limit_s = 1.0;
        options.memory_limit_bytes = 64ull << 20;
        options.output_dir = output;
        options.on_say = on_say;
        options.on_check = on_check;
        lesson* l = NULL;
        error_info err = {{0}};
        if (lesson_open(&l, path, &options, &err) == 0) {
            lesson_status status = LESSON_PAUSED;
            for (int pauses = 0; pauses < 10000 && status == LESSON_PAUSED; pauses++) status = lesson_resume(l);
            int passed = 0, failed = 0;
            lesson_counts(l, &passed, &failed);
            if (print)
                fprintf(stderr, "status %d, %d passed, %d failed, error: %s\n", (int)status, passed, failed,
                        lesson_error(l));
            lesson_close(l);
        } else if (print) {
            fprintf(stderr, "lesson_open: %s\n", err.message);
        }
    }
    fuzz_remove_tree(dir);
    free(p.text);
    return 0;
}
