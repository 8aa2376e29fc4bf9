// The --json output of bench, quant and sim, read back by a JSON parser
// (Jansson, strict RFC 8259): each parses, with the keys it always had, in
// the same order and nesting, numbers as numbers; and a model whose file
// name holds a quote, a backslash and a newline (a student's
// `my "best" \ model<newline>.bin`) still gives valid JSON whose "model"
// string is that path, byte for byte.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "tests/test_support.h"

// ---- helpers ---------------------------------------------------------------------

// `text` as one shell word: in single quotes, each ' written as '\''.
static void shell_quote(const char* text, char* out, size_t capacity) {
    size_t n = 0;
    out[n++] = '\'';
    for (const char* c = text; *c; c++) {
        if (n + 5 >= capacity) fail_msg("shell_quote: %s is too long", text);
        if (*c == '\'') {
            memcpy(out + n, "'\\''", 4);
            n += 4;
        } else {
            out[n++] = *c;
        }
    }
    out[n++] = '\'';
    out[n] = '\0';
}

// Runs servelab with `arguments`, expects exit 0 and stdout that is one JSON
// value and nothing else (a newline after it); returns the value.
static json_t* run_json(const char* arguments) {
    command_result r = run_servelab(arguments);
    if (r.exit_status != 0) fail_msg("servelab %s: exit %d: %s", arguments, r.exit_status, r.err);
    json_error_t error;
    json_t* value = json_loads(r.out, 0, &error);
    if (!value)
        fail_msg("servelab %s: stdout is not JSON (line %d, column %d: %s):\n%s", arguments, error.line, error.column,
                 error.text, r.out);
    size_t length = strlen(r.out);
    assert_true(length > 0 && r.out[length - 1] == '\n');
    free_result(&r);
    return value;
}

// The object's keys are exactly `keys`, in that order (NULL-terminated).
static void assert_keys(const json_t* object, const char* what, const char* const* keys) {
    if (!json_is_object(object)) fail_msg("%s: not an object", what);
    size_t n = 0;
    void* iter = json_object_iter((json_t*)object);
    for (; iter; iter = json_object_iter_next((json_t*)object, iter), n++) {
        const char* key = json_object_iter_key(iter);
        if (!keys[n]) fail_msg("%s: unexpected key '%s' after the last expected", what, key);
        if (strcmp(key, keys[n]) != 0) fail_msg("%s: key %zu is '%s', expected '%s'", what, n, key, keys[n]);
    }
    if (keys[n]) fail_msg("%s: key '%s' is missing", what, keys[n]);
}

// object[key] is a number (integer or real) / a whole number / a string.
static void assert_number(const json_t* object, const char* key) {
    if (!json_is_number(json_object_get(object, key))) fail_msg("'%s' is not a number", key);
}
static void assert_integer(const json_t* object, const char* key) {
    if (!json_is_integer(json_object_get(object, key))) fail_msg("'%s' is not an integer", key);
}
static void assert_string(const json_t* object, const char* key) {
    if (!json_is_string(json_object_get(object, key))) fail_msg("'%s' is not a string", key);
}

// Every key of `object` that is not in `except` (NULL-terminated) holds a number.
static void assert_numbers_except(const json_t* object, const char* const* except) {
    const char* key;
    json_t* value;
    json_object_foreach((json_t*)object, key, value) {
        bool skipped = false;
        for (const char* const* e = except; *e; e++)
            skipped = skipped || strcmp(*e, key) == 0;
        if (!skipped && !json_is_number(value)) fail_msg("'%s' is not a number", key);
    }
}

// A non-empty array, each element an object with exactly `keys`.
static void assert_array_of(const json_t* root, const char* key, const char* const* keys,
                            const char* const* not_numbers) {
    const json_t* array = json_object_get(root, key);
    if (!json_is_array(array) || json_array_size(array) == 0) fail_msg("'%s' is not a non-empty array", key);
    size_t i;
    const json_t* element;
    json_array_foreach(array, i, element) {
        char what[64];
        snprintf(what, sizeof what, "%s[%zu]", key, i);
        assert_keys(element, what, keys);
        assert_numbers_except(element, not_numbers);
    }
}

// ---- the three commands, as they are run ----------------------------------------

static const char* const BENCH_KEYS[] = {"model",
                                         "threads",
                                         "simd",
                                         "stream_buffer_bytes",
                                         "bandwidth_gb_s",
                                         "peak_gflop_s",
                                         "bandwidth_probes_gb_s",
                                         "peak_probes_gflop_s",
                                         "decode_tokens",
                                         "decode",
                                         "prefill",
                                         "batch_dtype",
                                         "roofline_flat_batch",
                                         "roofline_flops_per_token",
                                         "batch_peak_ceiling_x",
                                         "batch_scaling",
                                         "attention",
                                         "small_model",
                                         "targets",
                                         "peer",
                                         NULL};

// The whole shape of bench --json; returns nothing, fails on a difference.
static void check_bench_json(const json_t* root) {
    assert_keys(root, "bench", BENCH_KEYS);
    assert_string(root, "model");
    assert_integer(root, "threads");
    assert_string(root, "simd");
    assert_integer(root, "stream_buffer_bytes");
    assert_number(root, "bandwidth_gb_s");
    assert_number(root, "peak_gflop_s");
    assert_integer(root, "decode_tokens");
    assert_string(root, "batch_dtype");
    assert_number(root, "roofline_flat_batch");
    assert_number(root, "roofline_flops_per_token");
    assert_number(root, "batch_peak_ceiling_x");
    const char* probes[] = {"bandwidth_probes_gb_s", "peak_probes_gflop_s"};
    for (int p = 0; p < 2; p++) {
        const json_t* array = json_object_get(root, probes[p]);
        assert_true(json_is_array(array) && json_array_size(array) > 0);
        for (size_t i = 0; i < json_array_size(array); i++)
            assert_true(json_is_number(json_array_get(array, i)));
    }
    const char* const decode[] = {"dtype", "tok_s", "gb_s", "frac_of_bw", "bytes_per_token", "x_fp16", NULL};
    const char* const prefill[] = {"dtype", "tokens", "tok_s", "gflop_s", "frac_of_peak", NULL};
    const char* const batch[] = {"batch", "tok_s", "x_batch1", NULL};
    const char* const attention[] = {
        "layout", "context", "us_per_token", "read_us_per_token", "read_prefetched_us_per_token", NULL};
    const char* const targets[] = {"target", "measured", "wanted", "was_measured", "met", NULL};
    const char* const dtype[] = {"dtype", NULL};
    const char* const layout[] = {"layout", NULL};
    const char* const texts[] = {"target", "measured", "wanted", "was_measured", "met", NULL};
    assert_array_of(root, "decode", decode, dtype);
    assert_array_of(root, "prefill", prefill, dtype);
    assert_array_of(root, "batch_scaling", batch, (const char* const[]){NULL});
    assert_array_of(root, "attention", attention, layout);
    assert_array_of(root, "targets", targets, texts);
    const json_t* target = json_array_get(json_object_get(root, "targets"), 0);
    assert_string(target, "target");
    assert_true(json_is_boolean(json_object_get(target, "was_measured")));
    assert_true(json_is_boolean(json_object_get(target, "met")));
    // Without --peer-bench the peer section says it was not measured, and why.
    const json_t* peer = json_object_get(root, "peer");
    assert_true(json_is_false(json_object_get(peer, "measured")));
    assert_string(peer, "not_measured");
    const json_t* small = json_object_get(root, "small_model");
    if (!json_is_null(small)) {
        const char* const keys[] = {"path", "tok_s", "us_per_token", NULL};
        assert_keys(small, "small_model", keys);
        assert_string(small, "path");
        assert_number(small, "tok_s");
    }
}

static void test_bench_json_parses(void** state) {
    (void)state;
    json_t* root = run_json("bench --quick --json --model tiny --threads 2");
    check_bench_json(root);
    assert_string_equal(json_string_value(json_object_get(root, "model")), "tiny");
    json_decref(root);
}

static const char* const QUANT_KEYS[] = {
    "model", "scheme",  "weight_bytes",   "weight_bytes_ref",   "kl_mean", "top1_agreement",
    "ppl",   "ppl_ref", "eval_positions", "calibration_tokens", "layers",  NULL};

static void check_quant_json(const json_t* root, bool awq) {
    assert_keys(root, "quant", QUANT_KEYS);
    assert_string(root, "model");
    assert_string(root, "scheme");
    const char* const not_numbers[] = {"model", "scheme", "layers", NULL};
    assert_numbers_except(root, not_numbers);
    assert_integer(root, "weight_bytes");
    assert_integer(root, "weight_bytes_ref");
    assert_integer(root, "eval_positions");
    assert_integer(root, "calibration_tokens");
    const json_t* layers = json_object_get(root, "layers");
    assert_true(json_is_array(layers) && json_array_size(layers) > 0);
    const char* const plain[] = {"name", "scale_mean", "mse", "max_err", "clipped", NULL};
    const char* const with_alpha[] = {"name", "scale_mean", "mse", "max_err", "clipped", "awq_alpha", NULL};
    const char* const name[] = {"name", NULL};
    bool any_alpha = false;
    for (size_t i = 0; i < json_array_size(layers); i++) {
        const json_t* layer = json_array_get(layers, i);
        bool alpha = json_object_get(layer, "awq_alpha") != NULL;
        any_alpha = any_alpha || alpha;
        char what[32];
        snprintf(what, sizeof what, "layers[%zu]", i);
        assert_keys(layer, what, alpha ? with_alpha : plain);
        assert_string(layer, "name");
        assert_integer(layer, "clipped");
        assert_numbers_except(layer, name);
    }
    assert_true(any_alpha == awq);
    assert_string_equal(json_string_value(json_object_get(json_array_get(layers, 0), "name")), "token_embedding");
}

static void test_quant_json_parses(void** state) {
    (void)state;
    json_t* root = run_json("quant --model tiny --scheme w4a16 --group 32 --method awq --json");
    check_quant_json(root, true);
    assert_string_equal(json_string_value(json_object_get(root, "scheme")), "w4a16 g32 awq asym");
    json_decref(root);
}

static void check_sim_json(const json_t* root, const char* const* runs) {
    assert_keys(root, "sim", runs);
    const char* const keys[] = {
        "completed",    "requests",          "generated_tokens", "seconds",      "throughput_tok_s",
        "ttft_ms_mean", "ttft_ms_p50",       "ttft_ms_p99",      "tpot_ms_mean", "tpot_ms_p50",
        "tpot_ms_p99",  "peak_running",      "kv_util_pct",      "kv_waste_pct", "external_fragmentation_pct",
        "preemptions",  "prefix_hit_tokens", "cow_copies",       "steps",        NULL};
    const char* const integers[] = {"completed",   "requests",          "generated_tokens", "peak_running",
                                    "preemptions", "prefix_hit_tokens", "cow_copies",       "steps"};
    for (const char* const* run = runs; *run; run++) {
        const json_t* result = json_object_get(root, *run);
        assert_keys(result, *run, keys);
        assert_numbers_except(result, (const char* const[]){NULL});
        for (size_t k = 0; k < sizeof integers / sizeof integers[0]; k++)
            assert_integer(result, integers[k]);
    }
}

static void test_sim_json_parses(void** state) {
    (void)state;
    json_t* root = run_json("sim --model tiny --requests 6 --prompt-len fixed:8 --output-len fixed:4 --json");
    check_sim_json(root, (const char* const[]){"paged", "contiguous", NULL});
    assert_int_equal(json_integer_value(json_object_get(json_object_get(root, "paged"), "generated_tokens")), 24);
    json_decref(root);
    root = run_json("sim --model tiny --requests 4 --prompt-len fixed:8 --output-len fixed:4 --kv paged "
                    "--batching both --json");
    check_sim_json(root, (const char* const[]){"paged", "paged_static", NULL});
    json_decref(root);
}

// ---- a model path that needs escaping ---------------------------------------------

// The tiny preset written to a scratch path holding ", \, a newline and a '
// (once per test binary); path is the file name, quoted its shell word.
static void hostile_model(char* path, size_t path_capacity, char* quoted, size_t quoted_capacity) {
    static bool written = false;
    snprintf(path, path_capacity, "%s/my \"best\" \\ model\n's.bin", test_scratch_dir());
    shell_quote(path, quoted, quoted_capacity);
    if (written) return;
    char arguments[2048];
    snprintf(arguments, sizeof arguments, "synth tiny --out %s", quoted);
    command_result r = run_servelab(arguments);
    if (r.exit_status != 0) fail_msg("synth: %s", r.err);
    free_result(&r);
    written = true;
}

static void test_hostile_path_bench(void** state) {
    (void)state;
    char path[512], quoted[1200], arguments[2048];
    hostile_model(path, sizeof path, quoted, sizeof quoted);
    snprintf(arguments, sizeof arguments, "bench --quick --json --threads 2 --model %s", quoted);
    json_t* root = run_json(arguments);
    check_bench_json(root);
    assert_string_equal(json_string_value(json_object_get(root, "model")), path);
    json_decref(root);
}

static void test_hostile_path_quant(void** state) {
    (void)state;
    char path[512], quoted[1200], arguments[2048];
    hostile_model(path, sizeof path, quoted, sizeof quoted);
    snprintf(arguments, sizeof arguments, "quant --scheme w8a16 --json --model %s", quoted);
    json_t* root = run_json(arguments);
    check_quant_json(root, false);
    // quant's "model" is the checkpoint's label: the path, then what it is
    // (", synthetic (random weights, shapes of tiny)" for this file).
    const char* model = json_string_value(json_object_get(root, "model"));
    size_t length = strlen(path);
    if (strncmp(model, path, length) != 0 || (model[length] != '\0' && model[length] != ','))
        fail_msg("quant's model '%s' does not start with the path '%s'", model, path);
    json_decref(root);
}

static void test_hostile_path_sim(void** state) {
    (void)state;
    char path[512], quoted[1200], arguments[2048];
    hostile_model(path, sizeof path, quoted, sizeof quoted);
    snprintf(arguments, sizeof arguments,
             "sim --requests 4 --prompt-len fixed:8 --output-len fixed:4 --json --model %s", quoted);
    json_t* root = run_json(arguments);
    check_sim_json(root, (const char* const[]){"paged", "contiguous", NULL});
    json_decref(root);
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bench_json_parses),  cmocka_unit_test(test_quant_json_parses),
        cmocka_unit_test(test_sim_json_parses),    cmocka_unit_test(test_hostile_path_bench),
        cmocka_unit_test(test_hostile_path_quant),
        cmocka_unit_test(test_hostile_path_sim), // last: removes the file
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
