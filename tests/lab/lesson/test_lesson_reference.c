// lab.reference_logits (lab/lesson/api_model.c): the reference forward
// pass seen from a lesson. Its logits equal the engine's e:logits for the
// same tokens (fp32 KV: to 1e-4; int8 KV against a reference that rounds
// its cache the same way), a quantized handle is run on its dequantized
// weights, bad arguments raise errors naming the field, and its memory
// counts against the lesson's cap.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lab/lesson/lesson.h"
#include "tests/test_support.h"

typedef struct captured {
    char said[32][600];
    int n_said;
    char error[1200];
} captured;

static void on_say(void* user, const char* text) {
    captured* c = user;
    if (c->n_said < 32) snprintf(c->said[c->n_said++], sizeof c->said[0], "%s", text);
}

// Writes `source` as NAME.lua in the scratch folder and runs it to the end.
static lesson_status run_source(const char* name, const char* source, lesson_options* options, captured* c) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.lua", test_scratch_dir(), name);
    assert_true(test_write_file(path, source, strlen(source)));
    memset(c, 0, sizeof *c);
    lesson_options o = options ? *options : lesson_options_default();
    o.on_say = on_say;
    o.user = c;
    lesson* l = NULL;
    error_info err = {{0}};
    if (lesson_open(&l, path, &o, &err)) {
        snprintf(c->error, sizeof c->error, "%s", err.message);
        return LESSON_FAILED;
    }
    lesson_status status;
    while ((status = lesson_resume(l)) == LESSON_PAUSED) {
    }
    snprintf(c->error, sizeof c->error, "%s", lesson_error(l));
    lesson_close(l);
    return status;
}

// Lua: the largest |a - b| over the largest |b|, and the lengths.
#define LUA_RELATIVE                                                                                                   \
    "local function relative(a, b)\n"                                                                                  \
    "  assert(#a == #b, 'lengths ' .. #a .. ' and ' .. #b)\n"                                                          \
    "  local diff, largest = 0, 0\n"                                                                                   \
    "  for i = 1, #b do diff = math.max(diff, math.abs(a[i] - b[i])); largest = math.max(largest, math.abs(b[i])) "    \
    "end\n"                                                                                                            \
    "  return diff / largest\n"                                                                                        \
    "end\n"                                                                                                            \
    "local function engine_logits(m, ids, kv_dtype)\n"                                                                 \
    "  local e = lab.engine{model = m, kv_dtype = kv_dtype, num_blocks = 64}\n"                                        \
    "  local id = e:add{ids = ids, max_tokens = 1}\n"                                                                  \
    "  e:run()\n"                                                                                                      \
    "  local logits = e:logits(id)\n"                                                                                  \
    "  e:close()\n"                                                                                                    \
    "  return logits\n"                                                                                                \
    "end\n"

static double said_number(const captured* c, int index, const char* label) {
    assert_true(index < c->n_said);
    size_t n = strlen(label);
    if (strncmp(c->said[index], label, n) != 0)
        fail_msg("said[%d] is \"%s\", expected \"%s ...\"", index, c->said[index], label);
    return strtod(c->said[index] + n, NULL);
}

static void test_reference_logits_equal_the_engines(void** state) {
    (void)state;
    const char* source =
        "lab.lesson{title = 'reference', claims = {'r1'}}\n" LUA_RELATIVE
        "local m = lab.model{model = 'tiny', dtype = 'fp32'}\n"
        "local ids = m:encode('Once upon a time there was')\n"
        "local ref = lab.reference_logits{model = m, tokens = ids}\n"
        "lab.say('count ' .. #ref .. ' of ' .. m:info().vocab_size)\n"
        "lab.say('fp32 ' .. relative(engine_logits(m, ids, 'fp32'), ref))\n"
        "local int8 = engine_logits(m, ids, 'int8')\n"
        "lab.say('int8 ' .. relative(int8, lab.reference_logits{model = m, tokens = ids, kv_dtype = 'int8'}))\n"
        "lab.say('int8-vs-fp32 ' .. relative(int8, ref))\n"
        "local shorter = {table.unpack(ids, 1, #ids - 1)}\n"
        "lab.say('other-tokens ' .. relative(engine_logits(m, shorter, 'fp32'), ref))\n"
        "local q = lab.model{model = 'tiny', dtype = 'fp32', quant = 'w8a16'}\n"
        "lab.say('w8a16 ' .. relative(engine_logits(q, ids, 'fp32'), lab.reference_logits{model = q, tokens = ids}))\n";
    captured* c = calloc(1, sizeof *c);
    lesson_status status = run_source("reference", source, NULL, c);
    if (status != LESSON_DONE) fail_msg("status %d: %s", (int)status, c->error);
    assert_int_equal(c->n_said, 6);
    assert_string_equal(c->said[0], "count 259 of 259");
    double fp32 = said_number(c, 1, "fp32 "), int8 = said_number(c, 2, "int8 ");
    double int8_vs_fp32 = said_number(c, 3, "int8-vs-fp32 "), other = said_number(c, 4, "other-tokens ");
    double w8a16 = said_number(c, 5, "w8a16 ");
    print_message("lab.reference_logits against e:logits: fp32 KV %.3g, int8 KV %.3g (against fp32 KV %.3g), "
                  "one token fewer %.3g, w8a16 %.3g\n",
                  fp32, int8, int8_vs_fp32, other, w8a16);
    assert_true(fp32 <= 1e-4);      // the same math in fp32 (test_reference_forward.c: 0 measured)
    assert_true(int8 <= 1.0 / 127); // one int8 step (test_reference_forward.c)
    assert_true(int8_vs_fp32 > 1.0 / 127);
    assert_true(other > 1e-2); // a different context is told apart
    assert_true(w8a16 <= 1e-4);
    free(c);
}

static void test_reference_logits_bad_arguments(void** state) {
    (void)state;
    static const struct {
        const char* body;
        const char* expected;
    } cases[] = {
        {"lab.reference_logits{tokens = {1}}", "field 'model': expected a model"},
        {"lab.reference_logits{model = 'tiny', tokens = {1}}",
         "field 'model': expected a model (model = lab.model{...}), got string"},
        {"lab.reference_logits{model = M}", "field 'tokens': expected an array of token ids, got nil"},
        {"lab.reference_logits{model = M, tokens = {}}", "field 'tokens'"},
        {"lab.reference_logits{model = M, tokens = {1, 99999}}", "token id 99999 is outside the vocabulary 0..258"},
        {"lab.reference_logits{model = M, tokens = {1, 'a'}}",
         "element 2: expected a token id (an integer), got string"},
        {"lab.reference_logits{model = M, tokens = {1}, kv_dtype = 'fp8'}", "field 'kv_dtype'"},
        {"lab.reference_logits{model = M, tokens = {1}, kv = 'int8'}", "field 'kv': unknown field"},
        {"lab.reference_logits{model = M, tokens = LONG}",
         "field 'tokens': 257 tokens are more than the model's 256 positions"},
        {"lab.reference_logits(M, {1})", "bad argument #1 to 'reference_logits'"},
    };
    size_t n = sizeof cases / sizeof cases[0];
    char source[8192];
    size_t used = (size_t)snprintf(source, sizeof source,
                                   "lab.lesson{title = 'bad', claims = {'b1'}}\n"
                                   "M = lab.model('tiny')\n"
                                   "LONG = {}\n"
                                   "for i = 1, 257 do LONG[i] = 5 end\n"
                                   "local function try(f)\n"
                                   "  local ok, message = pcall(f)\n"
                                   "  lab.say(ok and 'NO ERROR' or tostring(message))\n"
                                   "end\n");
    for (size_t i = 0; i < n; i++)
        used += (size_t)snprintf(source + used, sizeof source - used, "try(function() %s end)\n", cases[i].body);
    assert_true(used < sizeof source);
    captured* c = calloc(1, sizeof *c);
    lesson_status status = run_source("reference_bad", source, NULL, c);
    if (status != LESSON_DONE) fail_msg("status %d: %s", (int)status, c->error);
    assert_int_equal(c->n_said, (int)n);
    for (size_t i = 0; i < n; i++)
        if (!strstr(c->said[i], cases[i].expected))
            fail_msg("case %zu `%s`: expected an error holding \"%s\", got \"%s\"", i, cases[i].body, cases[i].expected,
                     c->said[i]);
    free(c);
}

// The dequantized copy of a quantized model is counted: small with w4a16
// holds ~8 MB, its fp32 view is 14.7 M parameters x 4 bytes = 59 MB, over a
// 48 MiB cap, so the call is refused before anything is allocated.
static void test_reference_logits_count_against_the_cap(void** state) {
    (void)state;
    lesson_options o = lesson_options_default();
    o.memory_limit_bytes = 48u << 20;
    const char* source = "lab.lesson{title = 'cap', claims = {'m1'}}\n"
                         "local q = lab.model{model = 'small', quant = 'w4a16'}\n"
                         "lab.say('loaded')\n"
                         "lab.reference_logits{model = q, tokens = {1, 5}}\n"
                         "lab.say('ran')\n";
    captured* c = calloc(1, sizeof *c);
    assert_int_equal(run_source("reference_cap", source, &o, c), LESSON_FAILED);
    assert_int_equal(c->n_said, 1);
    if (!strstr(c->error, "reference_cap.lua:4: memory limit of 48 MiB: the reference forward pass"))
        fail_msg("error: %s", c->error);
    free(c);
}

static double process_cpu_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

// The time limit is looked at between tokens: 400 tokens of small (14.7 M
// parameters, 2 multiply-adds each per token in scalar fp32: about 3.5 s of
// CPU in a release build, many times that under sanitizers) stop soon after
// the limit instead of at the end. Loading small takes 0.5 s here and 3 s
// under ASan, so the limit is what loading took plus 1.5 s.
static void test_reference_logits_stop_at_the_time_limit(void** state) {
    (void)state;
    captured* c = calloc(1, sizeof *c);
    const char* load = "lab.lesson{title = 'load', claims = {'t1'}}\n"
                       "local m = lab.model('small')\n";
    double start = process_cpu_seconds();
    assert_int_equal(run_source("reference_load", load, NULL, c), LESSON_DONE);
    double load_s = process_cpu_seconds() - start;
    lesson_options o = lesson_options_default();
    o.time_limit_s = load_s + 1.5;
    const char* source = "lab.lesson{title = 'slow', claims = {'t1'}}\n"
                         "local m = lab.model('small')\n"
                         "local ids = {1}\n"
                         "for i = 2, 400 do ids[i] = 3 + i % 200 end\n"
                         "lab.reference_logits{model = m, tokens = ids}\n"
                         "lab.say('ran to the end')\n";
    start = process_cpu_seconds();
    lesson_status status = run_source("reference_slow", source, &o, c);
    double cpu_s = process_cpu_seconds() - start;
    print_message("reference on 400 tokens of small under a %.2f s limit (loading took %.2f s): stopped after %.2f s "
                  "of CPU\n",
                  o.time_limit_s, load_s, cpu_s);
    assert_int_equal(status, LESSON_FAILED);
    assert_int_equal(c->n_said, 0);
    if (!strstr(c->error, "reference_slow.lua:5: time limit of") || !strstr(c->error, "s CPU exceeded"))
        fail_msg("error: %s", c->error);
    if (cpu_s > o.time_limit_s + 1.5) fail_msg("ran %.2f s of CPU under a %.2f s limit", cpu_s, o.time_limit_s);
    free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_logits_equal_the_engines),
        cmocka_unit_test(test_reference_logits_bad_arguments),
        cmocka_unit_test(test_reference_logits_count_against_the_cap),
        cmocka_unit_test(test_reference_logits_stop_at_the_time_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
