// servelab synth and servelab bench as a user runs them: a written preset
// loads back as the same weights through the legacy loader; the stories110m
// preset has the benchmark's exact shape; bench --quick --json has every key
// of the issue with positive values that agree with each other (bytes,
// FLOPs and ratios, never how fast this machine is); bad flags exit 2.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/model.h"
#include "engine/model_storage.h"
#include "engine/model_synth.h"
#include "engine/tokenizer.h"
#include "lab/bench/bench.h"
#include "lab/bench/targets.h"
#include "tests/test_support.h"

// ---- synth ---------------------------------------------------------------------

static void assert_same_matrix(const weight_matrix* a, const weight_matrix* b) {
    assert_int_equal(a->dtype, WEIGHT_F32);
    assert_int_equal(b->dtype, WEIGHT_F32);
    assert_int_equal(a->rows, b->rows);
    assert_int_equal(a->cols, b->cols);
    assert_memory_equal(a->values, b->values, (size_t)a->rows * (size_t)a->cols * sizeof(float));
}

static void test_synth_round_trip(void** state) {
    (void)state;
    char path[512], arguments[1024];
    snprintf(path, sizeof path, "%s/tiny7.bin", test_scratch_dir());
    snprintf(arguments, sizeof arguments, "synth tiny --out %s --seed 7", path);
    command_result r = run_servelab(arguments);
    assert_int_equal(r.exit_status, 0);
    assert_non_null(strstr(r.out, "preset tiny"));
    free_result(&r);

    error_info err = {{0}};
    model loaded, expected;
    assert_int_equal(model_load(&loaded, path, MODEL_DTYPE_FP32, &err), 0);
    assert_int_equal(model_synthesize(&expected, "tiny", TOK_MIN_VOCAB_SIZE, MODEL_DTYPE_FP32, 7, &err), 0);
    assert_int_equal(loaded.format, MODEL_FORMAT_LEGACY);
    const model_config *a = &loaded.config, *b = &expected.config;
    assert_int_equal(a->dim, b->dim);
    assert_int_equal(a->hidden_dim, b->hidden_dim);
    assert_int_equal(a->n_layers, b->n_layers);
    assert_int_equal(a->n_heads, b->n_heads);
    assert_int_equal(a->n_kv_heads, b->n_kv_heads);
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->max_seq_len, b->max_seq_len);
    assert_true(a->shared_classifier);
    assert_same_matrix(&loaded.token_embedding, &expected.token_embedding);
    for (int l = 0; l < a->n_layers; l++) {
        for (int k = 0; k < 7; k++)
            assert_same_matrix(model_storage_layer_matrix(&loaded.layers[l], k),
                               model_storage_layer_matrix(&expected.layers[l], k));
        assert_memory_equal(loaded.layers[l].rms_attention, expected.layers[l].rms_attention, (size_t)a->dim * 4);
        assert_memory_equal(loaded.layers[l].rms_ffn, expected.layers[l].rms_ffn, (size_t)a->dim * 4);
    }
    assert_memory_equal(loaded.rms_final, expected.rms_final, (size_t)a->dim * 4);
    model_free(&loaded);
    model_free(&expected);
    // Another seed, other weights: the seed really reaches the generator.
    snprintf(arguments, sizeof arguments, "synth tiny --out %s --seed 8", path);
    r = run_servelab(arguments);
    assert_int_equal(r.exit_status, 0);
    free_result(&r);
    assert_int_equal(model_load(&loaded, path, MODEL_DTYPE_FP32, &err), 0);
    assert_int_equal(model_synthesize(&expected, "tiny", TOK_MIN_VOCAB_SIZE, MODEL_DTYPE_FP32, 7, &err), 0);
    assert_memory_not_equal(loaded.layers[0].wq.values, expected.layers[0].wq.values,
                            (size_t)loaded.layers[0].wq.rows * (size_t)loaded.layers[0].wq.cols * sizeof(float));
    model_free(&loaded);
    model_free(&expected);
}

static void test_stories110m_preset_shape(void** state) {
    (void)state;
    const synth_preset* p = synth_find_preset("stories110m");
    assert_non_null(p);
    model_config c = p->shape;
    assert_int_equal(c.dim, 768);
    assert_int_equal(c.hidden_dim, 2048);
    assert_int_equal(c.n_layers, 12);
    assert_int_equal(c.n_heads, 12);
    assert_int_equal(c.n_kv_heads, 12);
    assert_int_equal(c.vocab_size, 32000); // fixed by the preset, whatever the tokenizer
    c.shared_classifier = true;
    error_info err = {{0}};
    assert_int_equal(model_config_validate(&c, "stories110m", &err), 0);
    assert_int_equal(c.head_dim, 64);
    uint64_t d = 768, h = 2048;
    uint64_t params = 32000 * d + 12 * (4 * d * d + 3 * d * h + 2 * d) + d; // tied classifier
    assert_true(params > 109000000 && params < 110000000);
}

static void test_synth_bad_input(void** state) {
    (void)state;
    const char* usage_errors[] = {"synth",
                                  "synth tiny",
                                  "synth nosuchpreset --out x.bin",
                                  "synth tiny --out",
                                  "synth tiny --out x.bin --seed -1",
                                  "synth tiny --out x.bin --bogus"};
    for (size_t i = 0; i < sizeof usage_errors / sizeof usage_errors[0]; i++) {
        command_result r = run_servelab(usage_errors[i]);
        assert_int_equal(r.exit_status, 2);
        assert_true(strlen(r.err) > 0);
        free_result(&r);
    }
    command_result r = run_servelab("synth tiny --out /nonexistent-dir/x.bin");
    assert_int_equal(r.exit_status, 1);
    assert_non_null(strstr(r.err, "/nonexistent-dir/x.bin"));
    free_result(&r);
}

// ---- bench ---------------------------------------------------------------------

// The number after "key": at or after *cursor; moves the cursor past it.
static double next_number(const char** cursor, const char* key) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\": ", key);
    const char* at = strstr(*cursor, quoted);
    if (!at) fail_msg("key %s not found", key);
    char* end = NULL;
    double value = strtod(at + strlen(quoted), &end);
    if (end == at + strlen(quoted)) fail_msg("key %s has no number", key);
    *cursor = end;
    return value;
}

static const char* array_of(const char* json, const char* key) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\": [", key);
    const char* at = strstr(json, quoted);
    if (!at) fail_msg("array %s not found", key);
    return at;
}

// The numbers of the JSON array `key` into values (room for max); returns
// how many it holds (max + 1 when there are more).
static int number_array(const char* json, const char* key, double* values, int max) {
    const char* cursor = strchr(array_of(json, key), '[') + 1;
    int n = 0;
    while (*cursor != ']') {
        char* end;
        double v = strtod(cursor, &end);
        if (end == cursor) fail_msg("array %s: not a number at \"%.20s\"", key, cursor);
        if (n == max) return max + 1;
        values[n++] = v;
        cursor = end;
        while (*cursor == ',' || *cursor == ' ')
            cursor++;
    }
    return n;
}

static bool close_to(double a, double b, double relative) { return fabs(a - b) <= relative * fabs(b); }

static void test_bench_quick_json(void** state) {
    (void)state;
    command_result r = run_servelab("bench --quick --json --model tiny --threads 2");
    assert_int_equal(r.exit_status, 0);
    const char* json = r.out;
    const char* cursor = json;
    double bandwidth = next_number(&cursor, "bandwidth_gb_s");
    double peak = next_number(&cursor, "peak_gflop_s");
    assert_true(bandwidth > 0 && peak > 0);
    // The machine is probed before the sections, after each of the five
    // weight formats' sections and at the end; every fraction is of the
    // highest probe.
    double bandwidth_probes[8], peak_probes[8];
    assert_int_equal(number_array(json, "bandwidth_probes_gb_s", bandwidth_probes, 8), 7);
    assert_int_equal(number_array(json, "peak_probes_gflop_s", peak_probes, 8), 7);
    double highest_bandwidth = 0, highest_peak = 0;
    for (int i = 0; i < 7; i++) {
        assert_true(bandwidth_probes[i] > 0 && peak_probes[i] > 0);
        highest_bandwidth = fmax(highest_bandwidth, bandwidth_probes[i]);
        highest_peak = fmax(highest_peak, peak_probes[i]);
    }
    assert_true(close_to(bandwidth, highest_bandwidth, 1e-3));
    assert_true(close_to(peak, highest_peak, 1e-3));

    const char* dtypes[5] = {"fp32", "fp16", "w8a16", "w4a16 g128", "w8a8"};
    double bytes_per_token[5];
    cursor = array_of(json, "decode");
    for (int i = 0; i < 5; i++) {
        char expected[64];
        snprintf(expected, sizeof expected, "{\"dtype\": \"%s\"", dtypes[i]);
        cursor = strstr(cursor, expected);
        assert_non_null(cursor);
        double tok_s = next_number(&cursor, "tok_s"), gb_s = next_number(&cursor, "gb_s");
        double frac = next_number(&cursor, "frac_of_bw");
        bytes_per_token[i] = next_number(&cursor, "bytes_per_token");
        double x_fp16 = next_number(&cursor, "x_fp16"); // measured beside fp16, run for run
        assert_true(tok_s > 0 && gb_s > 0 && frac > 0 && x_fp16 > 0);
        if (i == 1) assert_true(x_fp16 == 1.0);
        assert_true(close_to(gb_s, tok_s * bytes_per_token[i] * 1e-9, 0.01)); // GB/s = bytes/token x tok/s
        // Printed with 6 significant digits: exact to 1e-4 even where the
        // fraction is tiny (a sanitizer build's W4A16 on tiny ran at 0.002).
        assert_true(close_to(frac, gb_s / bandwidth, 1e-4));
    }
    // The bytes the kernels count shrink with the weight format.
    assert_true(bytes_per_token[0] > 1.9 * bytes_per_token[1] - 1e5);
    assert_true(bytes_per_token[1] > bytes_per_token[2]);
    assert_true(bytes_per_token[2] > bytes_per_token[3]);

    cursor = array_of(json, "prefill");
    double flops_per_token[6];
    for (int i = 0; i < 6; i++) {
        double tokens = next_number(&cursor, "tokens"), tok_s = next_number(&cursor, "tok_s");
        double gflop_s = next_number(&cursor, "gflop_s");
        assert_true(tokens >= 128 && tok_s > 0 && gflop_s > 0);
        assert_true(close_to(next_number(&cursor, "frac_of_peak"), gflop_s / peak, 1e-4)); // 6 significant digits
        flops_per_token[i] = gflop_s * 1e9 / tok_s;
    }
    // The same prompt costs the same FLOPs in every weight format: fp16, W4A16, W8A8.
    assert_true(close_to(flops_per_token[2], flops_per_token[0], 0.01));
    assert_true(close_to(flops_per_token[4], flops_per_token[0], 0.01));

    cursor = array_of(json, "batch_scaling");
    const int batches[7] = {1, 2, 4, 8, 16, 32, 64};
    for (int i = 0; i < 7; i++) {
        assert_int_equal((int)next_number(&cursor, "batch"), batches[i]);
        assert_true(next_number(&cursor, "tok_s") > 0);
        double x_batch1 = next_number(&cursor, "x_batch1"); // over batch 1, repeat by repeat
        assert_true(i == 0 ? x_batch1 == 1.0 : x_batch1 > 0);
    }
    cursor = json;
    assert_true(next_number(&cursor, "roofline_flat_batch") > 0);
    // The FMA peak's ceiling on any batch's speed-up: peak / (FLOPs per
    // token x batch-1 tok/s), from the run's own figures.
    double flops_per_decode_token = next_number(&cursor, "roofline_flops_per_token");
    double ceiling = next_number(&cursor, "batch_peak_ceiling_x");
    double batch1_tok_s = next_number(&cursor, "tok_s"); // batch_scaling's first entry: batch 1
    assert_true(flops_per_decode_token > 0 && ceiling > 0);
    assert_true(close_to(ceiling, peak * 1e9 / flops_per_decode_token / batch1_tok_s, 1e-3));

    cursor = array_of(json, "attention");
    const int contexts[3] = {512, 2048, 8192};
    for (int i = 0; i < 6; i++) {
        assert_non_null(strstr(cursor, i % 2 ? "\"layout\": \"contiguous\"" : "\"layout\": \"paged\""));
        assert_int_equal((int)next_number(&cursor, "context"), contexts[i / 2]);
        assert_true(next_number(&cursor, "us_per_token") > 0);
        assert_true(next_number(&cursor, "read_us_per_token") > 0); // the same bytes read alone
        assert_true(next_number(&cursor, "read_prefetched_us_per_token") > 0);
    }
    // The targets, judged on this run's figures (met or not is the
    // machine's business; which ones the run measured is not): tiny's
    // prompts stop at 254 tokens, so its 512-token prefill target is "not
    // measured", never met.
    cursor = array_of(json, "targets");
    // Without a peer, batch 16 (judged against llama-batched-bench) is not measured either.
    const bool measured[6] = {true, true, true, false, false, true};
    for (int i = 0; i < 6; i++) {
        cursor = strstr(cursor, "{\"target\": ");
        assert_non_null(cursor);
        cursor = strstr(cursor, "\"was_measured\": ");
        assert_non_null(cursor);
        cursor += strlen("\"was_measured\": ");
        assert_true(strncmp(cursor, measured[i] ? "true" : "false", measured[i] ? 4 : 5) == 0);
        if (!measured[i]) assert_true(strncmp(strstr(cursor, "\"met\": "), "\"met\": false", 12) == 0);
    }
    // No peer given: the comparison is not measured, and says why.
    assert_non_null(strstr(json, "\"peer\": {\"measured\": false, \"not_measured\": \"no peer given"));
    free_result(&r);
}

// The targets judged on a report made up here: each threshold is
// met exactly at its value and missed just past it, a figure the run did
// not produce is "not measured" (never met), and the worst attention
// context decides.
static bench_report target_report(void) {
    bench_report r;
    memset(&r, 0, sizeof r);
    const char* dtypes[3] = {"fp16", "w8a16", "w4a16 g128"};
    const double tok_s[3] = {100, 180, 300}, fractions[3] = {0.85, 0.75, 0.70}, x_fp16[3] = {1.0, 1.8, 3.0};
    for (int i = 0; i < 3; i++) {
        snprintf(r.decode[i].dtype, sizeof r.decode[i].dtype, "%s", dtypes[i]);
        r.decode[i].tok_s = tok_s[i];
        r.decode[i].frac_of_bw = fractions[i];
        r.decode[i].x_fp16 = x_fp16[i];
    }
    r.n_decode = 3;
    snprintf(r.prefill[0].dtype, sizeof r.prefill[0].dtype, "fp16");
    r.prefill[0].tokens = 512;
    r.prefill[0].frac_of_peak = 0.60;
    r.n_prefill = 1;
    r.batch[0] = (bench_batch){1, 100, 1.0};
    r.batch[1] = (bench_batch){16, 800, 8.0};
    r.n_batch = 2;
    const double paged[3] = {110, 105, 102}, contiguous[3] = {100, 100, 100};
    for (int i = 0; i < 3; i++) {
        r.attention[2 * i] = (bench_attention){"paged", 512 << (2 * i), paged[i], 0, 0};
        r.attention[2 * i + 1] = (bench_attention){"contiguous", 512 << (2 * i), contiguous[i], 0, 0};
    }
    r.n_attention = 6;
    // Side by side with llama.cpp: every ratio exactly 1, and the busy rows
    // of two formats (each engine keeping the same share of its speed).
    bench_peer_report* p = &r.peer;
    p->measured = true;
    p->rounds = 3;
    const bench_peer_row rows[] = {
        {PEER_DECODE, "f32", 128, 3, {50, 49, 51}, {50, 49, 51}, {1, 1, 1}},
        {PEER_DECODE, "f16", 128, 3, {120, 119, 121}, {120, 119, 121}, {1, 1, 1}},
        {PEER_DECODE, "q8_0", 128, 3, {200, 199, 201}, {200, 199, 201}, {1, 1, 1}},
        {PEER_DECODE, "q4_0", 128, 3, {300, 299, 301}, {300, 299, 301}, {1, 1, 1}},
        {PEER_PREFILL, "q8_0", 128, 3, {900, 899, 901}, {900, 899, 901}, {1, 1, 1}},
        {PEER_PREFILL, "q8_0", 512, 3, {800, 799, 801}, {800, 799, 801}, {1, 1, 1}},
        {PEER_PREFILL, "q4_0", 128, 3, {900, 899, 901}, {900, 899, 901}, {1, 1, 1}},
        {PEER_PREFILL, "q4_0", 512, 3, {800, 799, 801}, {800, 799, 801}, {1, 1, 1}},
        {PEER_BUSY, "f16", 128, 3, {0.6, 0.5, 0.7}, {0.5, 0.4, 0.6}, {1.2, 1.1, 1.3}},
        {PEER_BUSY, "q4_0", 128, 3, {0.5, 0.4, 0.6}, {0.5, 0.4, 0.6}, {1, 1, 1}},
        {PEER_BATCH, "f16", 128, 3, {1000, 990, 1010}, {1000, 990, 1010}, {1, 1, 1}},
    };
    p->n_rows = (int)(sizeof rows / sizeof rows[0]);
    memcpy(p->rows, rows, sizeof rows);
    return r;
}

// The row of the report's peer section: kind, format, tokens (0: any).
static bench_peer_row* peer_row(bench_report* r, bench_peer_kind kind, const char* format, int tokens) {
    return (bench_peer_row*)bench_peer_find(&r->peer, kind, format, tokens);
}

static void test_bench_targets(void** state) {
    (void)state;
    bench_report r = target_report();
    bench_target t[BENCH_MAX_TARGETS];
    assert_int_equal(bench_targets(&r, t), 14);
    for (int i = 0; i < 14; i++) { // every threshold reached exactly
        if (i == 6) continue;
        assert_true(t[i].was_measured);
        if (!t[i].met) fail_msg("%s: %s against %s, expected met", t[i].what, t[i].measured, t[i].wanted);
    }
    assert_false(t[6].was_measured); // no stories260K in the report
    assert_false(t[6].met);
    assert_string_equal(t[6].measured, "not measured");
    assert_string_equal(t[1].measured, "75.0%, 1.80x");
    // Batch 16 is judged against llama-batched-bench, not against batch 1.
    assert_string_equal(t[4].what, "batch-16 decode, x llama-batched-bench");
    assert_string_equal(t[4].measured, "1.00x");
    assert_string_equal(t[11].measured, "1.00x / 1.00x");
    // The busy target: the worst format's ratio decides, shown with both
    // engines' kept speed.
    assert_string_equal(t[13].measured, "1.00x (0.50 / 0.50 q4_0)");

    // Just past each threshold.
    r.decode[0].frac_of_bw = 0.849;
    r.decode[1].x_fp16 = 1.79; // the speed-up measured run for run, not tok_s over tok_s
    r.decode[2].frac_of_bw = 0.699;
    r.prefill[0].frac_of_peak = 0.599;
    r.attention[2].us_per_token = 111; // the 2048 context is now the worst: 1.11
    r.small_model.measured = true;
    r.small_model.tok_s = 9900; // the target is strictly faster than llama2.c
    const char* formats[4] = {"f32", "f16", "q8_0", "q4_0"};
    for (int f = 0; f < 4; f++)
        peer_row(&r, PEER_DECODE, formats[f], 0)->ratio.median = 0.99;
    peer_row(&r, PEER_PREFILL, "q8_0", 512)->ratio.median = 0.99; // one of the two lengths short is enough
    peer_row(&r, PEER_PREFILL, "q4_0", 128)->ratio.median = 0.99;
    peer_row(&r, PEER_BUSY, "q4_0", 0)->ratio.median = 0.99;
    peer_row(&r, PEER_BATCH, "f16", 0)->ratio.median = 0.99;
    assert_int_equal(bench_targets(&r, t), 14);
    for (int i = 0; i < 14; i++) {
        assert_true(t[i].was_measured);
        if (t[i].met) fail_msg("%s: %s against %s, expected not met", t[i].what, t[i].measured, t[i].wanted);
    }
    assert_string_equal(t[5].measured, "1.110");
    // One decimal: a figure just short of its threshold never reads as the threshold.
    assert_string_equal(t[0].measured, "84.9%");
    assert_string_equal(t[3].measured, "59.9%");
    // With the same bytes read alone in the report, the worst context's
    // read ratio stands beside the kernel's (shown, never judged).
    r.attention[2].read_prefetched_us_per_token = 130; // 2048 paged
    r.attention[3].read_prefetched_us_per_token = 100; // 2048 contiguous
    r.attention[0].read_prefetched_us_per_token = 190; // 512 is not the worst context: not shown
    r.attention[1].read_prefetched_us_per_token = 100;
    bench_targets(&r, t);
    assert_string_equal(t[5].measured, "1.110 (read 1.30)");
    assert_false(t[5].met);

    // A run without the figures: nothing is measured, nothing is met.
    bench_report empty;
    memset(&empty, 0, sizeof empty);
    assert_int_equal(bench_targets(&empty, t), 14);
    for (int i = 0; i < 14; i++)
        assert_false(t[i].was_measured || t[i].met);
    // Rows of a peer run that did not finish are never judged.
    r.peer.measured = false;
    bench_targets(&r, t);
    for (int i = 7; i < 14; i++)
        assert_false(t[i].was_measured);
    assert_false(t[4].was_measured);
}

// ---- against a peer ----------------------------------------------------------------

// Stand-ins for llama.cpp's tools: llama-bench's -o json for the -p and -n
// it is given (prefill 1000 tok/s, decode 100 tok/s), and
// llama-batched-bench's jsonl line at 16 sequences (400 tok/s).
static const char FAKE_LLAMA_BENCH[] =
    "#!/bin/sh\n"
    "p=0; n=0\n"
    "while [ $# -gt 0 ]; do case \"$1\" in -p) p=$2; shift;; -n) n=$2; shift;; esac; shift; done\n"
    "echo '['; sep=''\n"
    "for x in $(echo $p | tr ',' ' '); do [ \"$x\" = 0 ] && continue\n"
    "  echo \"$sep{\\\"n_prompt\\\": $x, \\\"n_gen\\\": 0, \\\"avg_ts\\\": 1000.0}\"; sep=','; done\n"
    "[ \"$n\" != 0 ] && echo \"$sep{\\\"n_prompt\\\": 0, \\\"n_gen\\\": $n, \\\"avg_ts\\\": 100.0}\"\n"
    "echo ']'\n";
static const char FAKE_BATCHED_BENCH[] = "#!/bin/sh\necho '{\"pl\": 16, \"speed_tg\": 400.0}'\n";

static void write_script(const char* path, const char* text) {
    assert_true(test_write_file(path, text, strlen(text)));
    assert_int_equal(chmod(path, 0755), 0);
}

// The median, min and max of "key": {...} at or after *cursor.
static void next_spread(const char** cursor, const char* key, double* spread) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\": {", key);
    const char* at = strstr(*cursor, quoted);
    if (!at) fail_msg("%s not found", key);
    *cursor = at;
    spread[0] = next_number(cursor, "median");
    spread[1] = next_number(cursor, "min");
    spread[2] = next_number(cursor, "max");
}

// ../shared/gguf/<name> (SERVELAB_SHARED moves ../shared): llama.cpp's
// own files. Skips without them; fails under CI, which always has them.
#define REQUIRE_SHARED_GGUF(buffer, name)                                                                              \
    do {                                                                                                               \
        const char* shared = getenv("SERVELAB_SHARED");                                                                \
        snprintf((buffer), sizeof(buffer), "%s/gguf/%s", shared ? shared : "../shared", (name));                       \
        struct stat st;                                                                                                \
        if (stat((buffer), &st) != 0) {                                                                                \
            if (getenv("CI")) fail_msg("%s is missing and CI is set", (buffer));                                       \
            print_message("skipping: %s is missing (llama.cpp reference files)\n", (buffer));                          \
            skip();                                                                                                    \
        }                                                                                                              \
    } while (0)

static void test_bench_peer(void** state) {
    (void)state;
    char f32[512], f16[512], q8[512], q4[512];
    REQUIRE_SHARED_GGUF(f32, "stories260K-f32.gguf");
    REQUIRE_SHARED_GGUF(f16, "synth-gqa-f16.gguf");
    REQUIRE_SHARED_GGUF(q8, "synth-gqa-q8_0.gguf");
    REQUIRE_SHARED_GGUF(q4, "synth-gqa-q4_0.gguf");
    char bench[512], batched[512], arguments[4096];
    snprintf(bench, sizeof bench, "%s/fake-llama-bench", test_scratch_dir());
    snprintf(batched, sizeof batched, "%s/fake-llama-batched-bench", test_scratch_dir());
    write_script(bench, FAKE_LLAMA_BENCH);
    write_script(batched, FAKE_BATCHED_BENCH);
    snprintf(arguments, sizeof arguments,
             "bench --quick --json --threads 2 --peer-only --peer-rounds 2 --peer-bench %s --peer-batched-bench %s "
             "--peer-models %s,%s,%s,%s",
             bench, batched, q4, f32, q8, f16);
    command_result r = run_servelab(arguments);
    if (r.exit_status != 0) fail_msg("exit %d: %s", r.exit_status, r.err);
    const char* cursor = strstr(r.out, "\"peer\": {\"measured\": true");
    assert_non_null(cursor);
    assert_int_equal((int)next_number(&cursor, "rounds"), 2);
    // In the table's order whatever the order given; the contexts of 128
    // leave no room for a 128-token prompt, so no prefill rows.
    const char* rows[9] = {"f32 decode 16",           "f32 decode, 1 core busy",  "f16 decode 16",
                           "f16 decode, 1 core busy", "q8_0 decode 16",           "q8_0 decode, 1 core busy",
                           "q4_0 decode 16",          "q4_0 decode, 1 core busy", "f16 batch 16 decode 16"};
    const double peer_figure[9] = {100, 1, 100, 1, 100, 1, 100, 1, 400};
    for (int i = 0; i < 9; i++) {
        char expected[96];
        snprintf(expected, sizeof expected, "{\"row\": \"%s\"", rows[i]);
        const char* row = strstr(cursor, expected);
        if (!row) fail_msg("row %s missing or out of order", rows[i]);
        cursor = row;
        assert_int_equal((int)next_number(&cursor, "rounds"), 2);
        double servelab[3], peer[3], ratio[3];
        next_spread(&cursor, "servelab", servelab);
        next_spread(&cursor, "llama_cpp", peer);
        next_spread(&cursor, "ratio", ratio);
        assert_true(servelab[1] > 0 && servelab[1] <= servelab[0] && servelab[0] <= servelab[2]);
        assert_true(close_to(peer[0], peer_figure[i], 1e-6)); // what the stand-in printed, read back
        // The ratio is taken round by round against a constant peer: its
        // median (of 2 rounds, their mean) is servelab's median over it.
        assert_true(close_to(ratio[0], servelab[0] / peer_figure[i], 1e-4));
        assert_true(close_to(ratio[1], servelab[1] / peer_figure[i], 1e-4));
    }
    assert_null(strstr(r.out, "{\"row\": \"f16 prefill"));
    cursor = strstr(r.out, "\"target\": \"batch-16 decode, x llama-batched-bench\"");
    assert_non_null(cursor);
    assert_non_null(strstr(cursor, "\"was_measured\": true"));
    cursor = strstr(r.out, "\"target\": \"1 core busy: speed kept, x llama.cpp's\"");
    assert_non_null(cursor);
    free_result(&r);

    // A peer that fails or prints what is not llama-bench's JSON stops the run.
    snprintf(arguments, sizeof arguments, "bench --quick --peer-only --peer-bench /bin/false --peer-models %s", f16);
    r = run_servelab(arguments);
    assert_int_equal(r.exit_status, 1);
    assert_non_null(strstr(r.err, "/bin/false failed"));
    free_result(&r);
    snprintf(arguments, sizeof arguments, "bench --quick --peer-only --peer-bench %s --peer-models %s", batched, f16);
    r = run_servelab(arguments);
    assert_int_equal(r.exit_status, 1);
    assert_non_null(strstr(r.err, "expected a JSON array"));
    free_result(&r);
    // A file whose name tells no format.
    snprintf(arguments, sizeof arguments, "bench --quick --peer-only --peer-bench %s --peer-models /tmp/model.gguf",
             bench);
    r = run_servelab(arguments);
    assert_int_equal(r.exit_status, 1);
    assert_non_null(strstr(r.err, "expected f32, f16, q8_0 or q4_0 in the file name"));
    free_result(&r);
}

static void test_bench_table_and_bad_flags(void** state) {
    (void)state;
    command_result r = run_servelab("bench --quick --model tiny");
    assert_int_equal(r.exit_status, 0);
    assert_non_null(strstr(r.out, "streaming read"));
    // No published figure stands beside a measured one: without a peer the
    // comparison is "not measured".
    assert_null(strstr(r.out, "published"));
    assert_non_null(strstr(r.out, "against a peer: not measured"));
    assert_non_null(strstr(r.out, "targets (the project's performance goals"));
    assert_non_null(strstr(r.out, "batch-16 decode, x llama-batched-bench"));
    assert_null(strstr(r.out, "batch 16 / batch 1 decode"));
    // A user never saw the issue the goals came from: the table speaks of
    // the project's goals and published figures, never of "the issue".
    assert_null(strstr(r.out, "issue"));
    // stderr is not a terminal here: one line per part, no progress line.
    assert_non_null(strstr(r.err, "bench: decode fp16"));
    assert_null(strchr(r.err, '\r'));
    free_result(&r);
    r = run_servelab("bench --help");
    assert_int_equal(r.exit_status, 0);
    assert_null(strstr(r.out, "issue"));
    assert_non_null(strstr(r.out, "--progress"));
    free_result(&r);
    const char* usage_errors[] = {"bench --threads 0",
                                  "bench --repeats x",
                                  "bench --bogus",
                                  "bench --model",
                                  "bench --peer-models /tmp",
                                  "bench --peer-only",
                                  "bench --peer-bench /bin/true",
                                  "bench --peer-bench /bin/true --peer-models /tmp --peer-rounds 0"};
    for (size_t i = 0; i < sizeof usage_errors / sizeof usage_errors[0]; i++) {
        r = run_servelab(usage_errors[i]);
        assert_int_equal(r.exit_status, 2);
        free_result(&r);
    }
    r = run_servelab("bench --quick --model /nonexistent.bin");
    assert_int_equal(r.exit_status, 1);
    assert_non_null(strstr(r.err, "/nonexistent.bin"));
    free_result(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synth_round_trip),
        cmocka_unit_test(test_stories110m_preset_shape),
        cmocka_unit_test(test_synth_bad_input),
        cmocka_unit_test(test_bench_quick_json),
        cmocka_unit_test(test_bench_targets),
        cmocka_unit_test(test_bench_peer),
        cmocka_unit_test(test_bench_table_and_bad_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
