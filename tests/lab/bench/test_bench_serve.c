// `servelab bench-serve` (issue 32): against `servelab serve` on stories260K
// every request completes, the token counts from `usage` match the chunks
// and the percentiles are ordered; against fake servers in this process (a
// thread with a listening socket) that drop the connection mid-stream,
// answer 500, send malformed JSON or end without [DONE], each request is a
// failed request with its reason, the exit status is 1 and nothing crashes.
// No timing is asserted: measured numbers belong to the benchmark.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lab/bench/serve_load.h"
#include "tests/test_support.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// ---- servelab serve on stories260K -------------------------------------------------------

typedef struct served {
    pid_t pid;
    int port;
} served;

// Starts `servelab serve --port 0 --model stories260K EXTRA`; the port is
// read from its first line.
static void serve_start_with(served* s, const char* extra) {
    char model[512];
    REQUIRE_SHARED_MODEL(model, "stories260K.bin");
    char command[2048];
    snprintf(command, sizeof command, "exec %s serve --port 0 --model %s %s 2>%s/serve.err", test_servelab_binary(),
             model, extra, test_scratch_dir());
    char line[1024];
    int pid = 0;
    s->port = test_spawn_until_port(command, 60.0, &pid, NULL, line, sizeof line);
    s->pid = pid;
    if (s->port <= 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fail_msg("serve did not print its port; stdout: '%s'", line);
    }
}

static void serve_start(served* s) { serve_start_with(s, ""); }

static void serve_stop(served* s) {
    kill(s->pid, SIGTERM);
    waitpid(s->pid, NULL, 0);
}

static json_t* parse_json_or_fail(const char* text) {
    json_error_t error;
    json_t* root = json_loads(text, 0, &error);
    if (!root) fail_msg("--json output is not JSON (%s): %.400s", error.text, text);
    return root;
}

static long long integer_field(json_t* object, const char* name) {
    json_t* value = json_object_get(object, name);
    if (!json_is_integer(value)) fail_msg("field '%s' is missing or not an integer", name);
    return json_integer_value(value);
}

static void assert_percentiles_ordered(json_t* run, const char* name, int expected_n) {
    json_t* stat = json_object_get(run, name);
    assert_non_null(stat);
    assert_int_equal(integer_field(stat, "n"), expected_n);
    double p50 = json_number_value(json_object_get(stat, "p50"));
    double p90 = json_number_value(json_object_get(stat, "p90"));
    double p99 = json_number_value(json_object_get(stat, "p99"));
    if (!(p50 > 0 && p50 <= p90 && p90 <= p99))
        fail_msg("%s: p50 %g, p90 %g, p99 %g are not ordered", name, p50, p90, p99);
}

// 12 requests, 4 at a time, uniform prompts, 24 output tokens each: every
// one completes with exactly 24 tokens (ignore_eos), usage matches the
// chunks' token ids, and the percentiles are ordered.
static void test_against_servelab_serve(void** state) {
    (void)state;
    served s;
    serve_start(&s);
    char arguments[512];
    snprintf(arguments, sizeof arguments,
             "bench-serve --url http://127.0.0.1:%d --requests 12 --prompt-len uniform:8:40 --output-len 24 "
             "--concurrency 4 --seed 7 --json",
             s.port);
    command_result r = run_servelab(arguments);
    if (r.exit_status != 0) {
        serve_stop(&s);
        fail_msg("exit %d; stderr: %s", r.exit_status, r.err);
    }
    json_t* root = parse_json_or_fail(r.out);
    assert_string_equal(json_string_value(json_object_get(root, "model")), "stories260K");
    json_t* run = json_array_get(json_object_get(root, "runs"), 0);
    assert_non_null(run);
    assert_int_equal(integer_field(run, "completed"), 12);
    assert_int_equal(integer_field(run, "failed"), 0);
    assert_int_equal(integer_field(run, "output_tokens"), 12 * 24);
    json_t* check = json_object_get(run, "token_check");
    assert_int_equal(integer_field(check, "mismatches"), 0);
    assert_int_equal(integer_field(check, "usage_missing"), 0);
    assert_int_equal(integer_field(check, "short_outputs"), 0);
    assert_percentiles_ordered(run, "ttft_ms", 12);
    assert_percentiles_ordered(run, "tpot_ms", 12);
    assert_percentiles_ordered(run, "e2e_ms", 12);
    assert_percentiles_ordered(run, "itl_ms", (int)integer_field(json_object_get(run, "itl_ms"), "n"));
    assert_true(integer_field(json_object_get(run, "itl_ms"), "n") >= 1);
    json_decref(root);
    free_result(&r);

    // A sweep: one run per concurrency, the table and the chart in text.
    snprintf(arguments, sizeof arguments,
             "bench-serve --url http://127.0.0.1:%d --prompt-len 16 --output-len 8 --sweep-concurrency 1,3 "
             "--svg %s/sweep.svg",
             s.port, test_scratch_dir());
    r = run_servelab(arguments);
    serve_stop(&s);
    if (r.exit_status != 0) fail_msg("sweep: exit %d; stderr: %s", r.exit_status, r.err);
    assert_non_null(strstr(r.out, "| concurrency | requests |"));
    assert_non_null(strstr(r.out, "| 1 | 8 | 0 |"));
    assert_non_null(strstr(r.out, "| 3 | 8 | 0 |"));
    assert_non_null(strstr(r.out, "*3"));
    char path[600];
    snprintf(path, sizeof path, "%s/sweep.svg", test_scratch_dir());
    char* svg = test_read_text(path);
    assert_non_null(strstr(svg, "<svg"));
    assert_non_null(strstr(svg, "c=3"));
    free(svg);
    free_result(&r);
}

// ---- fake servers -----------------------------------------------------------------------

typedef enum fake_behaviour {
    FAKE_DROP_MID_STREAM, // headers and one token, then the connection closes
    FAKE_HTTP_500,        // an OpenAI-style error body
    FAKE_MALFORMED_JSON,  // an event whose data is not JSON
    FAKE_NO_DONE,         // a complete chunked body that never says [DONE]
    FAKE_HOSTILE_MODEL,   // GET /v1/models names a model with terminal escapes; streams then complete
} fake_behaviour;

typedef struct fake_server {
    fake_behaviour behaviour;
    int listener;
    int port;
    volatile int stop;
    int connections;
    pthread_t thread;
} fake_server;

static void write_all(int fd, const char* text) {
    size_t n = strlen(text), sent = 0;
    while (sent < n) {
        ssize_t w = send(fd, text + sent, n - sent, MSG_NOSIGNAL);
        if (w <= 0) return;
        sent += (size_t)w;
    }
}

// Reads the request's headers and its Content-Length body (up to 5 s).
static void read_request(int fd) {
    char buffer[65536];
    size_t n = 0;
    double deadline = now_s() + 5.0;
    long body = -1;
    char* end = NULL;
    while (n + 1 < sizeof buffer && now_s() < deadline) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t got = recv(fd, buffer + n, sizeof buffer - 1 - n, 0);
        if (got <= 0) return;
        n += (size_t)got;
        buffer[n] = '\0';
        if (!end && (end = strstr(buffer, "\r\n\r\n"))) {
            char* length = strcasestr(buffer, "Content-Length:");
            body = length ? atol(length + strlen("Content-Length:")) : 0;
        }
        if (end && (long)(n - (size_t)(end + 4 - buffer)) >= body) return;
    }
}

// One chunk of a chunked body holding `text`.
static void write_chunk(int fd, const char* text) {
    char size[32];
    snprintf(size, sizeof size, "%zx\r\n", strlen(text));
    write_all(fd, size);
    write_all(fd, text);
    write_all(fd, "\r\n");
}

static const char STREAM_HEADERS[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                     "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
static const char ONE_TOKEN[] = "data: {\"choices\":[{\"index\":0,\"text\":\"Once\",\"finish_reason\":null}]}\n\n";

static void answer(fake_server* f, int fd) {
    read_request(fd);
    switch (f->behaviour) {
    case FAKE_DROP_MID_STREAM:
        write_all(fd, STREAM_HEADERS);
        write_chunk(fd, ONE_TOKEN);
        break; // closed without the last chunk: the stream is cut
    case FAKE_HTTP_500: {
        const char* body = "{\"error\":{\"message\":\"engine exploded\",\"type\":\"server_error\"}}";
        char head[256];
        snprintf(head, sizeof head,
                 "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                 "Connection: close\r\n\r\n",
                 strlen(body));
        write_all(fd, head);
        write_all(fd, body);
        break;
    }
    case FAKE_MALFORMED_JSON:
        write_all(fd, STREAM_HEADERS);
        write_chunk(fd, ONE_TOKEN);
        write_chunk(fd, "data: {\"choices\": [{\"text\": \"a\"\n\n");
        write_chunk(fd, "data: [DONE]\n\n");
        write_all(fd, "0\r\n\r\n");
        break;
    case FAKE_NO_DONE:
        write_all(fd, STREAM_HEADERS);
        write_chunk(fd, ONE_TOKEN);
        write_all(fd, "0\r\n\r\n");
        break;
    case FAKE_HOSTILE_MODEL:
        if (f->connections == 1) { // the model list comes first
            // ESC ] 0 ; title BEL, ESC [ 2 J, and U+009B (CSI) 2 J.
            const char* body = "{\"data\":[{\"id\":\"m\\u001b]0;pwned\\u0007\\u001b[2J\\u009b2J\"}]}";
            char head[256];
            snprintf(head, sizeof head,
                     "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     strlen(body));
            write_all(fd, head);
            write_all(fd, body);
            break;
        }
        write_all(fd, STREAM_HEADERS);
        write_chunk(fd, ONE_TOKEN);
        write_chunk(fd, "data: [DONE]\n\n");
        write_all(fd, "0\r\n\r\n");
        break;
    }
    shutdown(fd, SHUT_RDWR);
    close(fd);
}

static void* fake_server_main(void* arg) {
    fake_server* f = arg;
    while (!f->stop) {
        struct pollfd p = {.fd = f->listener, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        int fd = accept(f->listener, NULL, NULL);
        if (fd < 0) continue;
        f->connections++;
        answer(f, fd);
    }
    return NULL;
}

static void fake_start(fake_server* f, fake_behaviour behaviour) {
    memset(f, 0, sizeof *f);
    f->behaviour = behaviour;
    f->listener = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(f->listener >= 0);
    int one = 1;
    setsockopt(f->listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = 0};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(f->listener, (struct sockaddr*)&address, sizeof address), 0);
    assert_int_equal(listen(f->listener, 16), 0);
    socklen_t length = sizeof address;
    assert_int_equal(getsockname(f->listener, (struct sockaddr*)&address, &length), 0);
    f->port = ntohs(address.sin_port);
    assert_int_equal(pthread_create(&f->thread, NULL, fake_server_main, f), 0);
}

static void fake_stop(fake_server* f) {
    f->stop = 1;
    pthread_join(f->thread, NULL);
    close(f->listener);
}

// Runs 3 requests against a fake server and checks they all failed with
// `reason` in their reason, the exit status is 1, and the report says so.
static void expect_failed_requests(fake_behaviour behaviour, const char* reason) {
    fake_server f;
    fake_start(&f, behaviour);
    char arguments[512];
    snprintf(arguments, sizeof arguments,
             "bench-serve --url http://127.0.0.1:%d --model fake --requests 3 --concurrency 1 --prompt-len 8 "
             "--output-len 4 --idle-timeout 5 --timeout 20 --json",
             f.port);
    command_result r = run_servelab(arguments);
    fake_stop(&f);
    if (r.exit_status != 1) fail_msg("expected exit status 1, got %d; stderr: %s", r.exit_status, r.err);
    assert_int_equal(f.connections, 3);
    json_t* root = parse_json_or_fail(r.out);
    json_t* run = json_array_get(json_object_get(root, "runs"), 0);
    assert_int_equal(integer_field(run, "completed"), 0);
    assert_int_equal(integer_field(run, "failed"), 3);
    json_t* failure = json_array_get(json_object_get(run, "failures"), 0);
    const char* text = json_string_value(json_object_get(failure, "reason"));
    if (!text || !strstr(text, reason)) fail_msg("reason '%s' does not say '%s'", text ? text : "(none)", reason);
    assert_int_equal(integer_field(failure, "count"), 3);
    assert_non_null(strstr(r.err, "every request failed"));
    json_decref(root);
    free_result(&r);
}

// Issue 46 item 10: the model id is the server's text; its escapes must not
// reach the terminal (the report shows '?' for each control).
static void test_server_model_id_is_printed_safely(void** state) {
    (void)state;
    fake_server f;
    fake_start(&f, FAKE_HOSTILE_MODEL);
    char arguments[512];
    snprintf(arguments, sizeof arguments,
             "bench-serve --url http://127.0.0.1:%d --requests 1 --concurrency 1 --prompt-len 8 --output-len 1 "
             "--idle-timeout 5 --timeout 20",
             f.port);
    command_result r = run_servelab(arguments);
    fake_stop(&f);
    if (strchr(r.out, '\x1b') || strchr(r.out, '\a') || strstr(r.out, "\xc2\x9b"))
        fail_msg("a control from the model id reached stdout:\n%s", r.out);
    if (!strstr(r.out, "(model m?]0;pwned??[2J?2J)"))
        fail_msg("expected the model id with '?' for controls:\n%s", r.out);
    free_result(&r);
    // --json keeps the exact id, escaped: \u001b and \u009b, never the raw bytes.
    fake_start(&f, FAKE_HOSTILE_MODEL);
    snprintf(arguments, sizeof arguments,
             "bench-serve --url http://127.0.0.1:%d --requests 1 --concurrency 1 --prompt-len 8 --output-len 1 "
             "--idle-timeout 5 --timeout 20 --json",
             f.port);
    r = run_servelab(arguments);
    fake_stop(&f);
    if (strchr(r.out, '\x1b') || strchr(r.out, '\a') || strstr(r.out, "\xc2\x9b"))
        fail_msg("a control from the model id reached stdout in --json:\n%s", r.out);
    json_t* root = parse_json_or_fail(r.out);
    assert_string_equal(json_string_value(json_object_get(root, "model")), "m\x1b]0;pwned\a\x1b[2J\xc2\x9b"
                                                                           "2J");
    json_decref(root);
    free_result(&r);
}

// Issue 46 item 9: --svg wrote PATH.tmp (a fixed name) with fopen("w")
// through any link planted there; a link at PATH itself is refused.
static void test_svg_is_not_written_through_links(void** state) {
    (void)state;
    char victim[512], svg[512], temporary[600], arguments[1200];
    snprintf(victim, sizeof victim, "%s/svg-victim", test_scratch_dir());
    snprintf(svg, sizeof svg, "%s/chart.svg", test_scratch_dir());
    snprintf(temporary, sizeof temporary, "%s.tmp", svg);
    for (int at_target = 0; at_target < 2; at_target++) {
        assert_true(test_write_file(victim, "victim\n", 7));
        unlink(svg);
        unlink(temporary);
        assert_int_equal(
            symlink(/* relative to the link's folder, which holds it */ "svg-victim", at_target ? svg : temporary), 0);
        fake_server f;
        fake_start(&f, FAKE_HOSTILE_MODEL);
        snprintf(arguments, sizeof arguments,
                 "bench-serve --url http://127.0.0.1:%d --requests 1 --sweep-concurrency 1 --prompt-len 8 "
                 "--output-len 1 --idle-timeout 5 --timeout 20 --svg %s",
                 f.port, svg);
        command_result r = run_servelab(arguments);
        fake_stop(&f);
        char* text = test_read_text(victim);
        if (strcmp(text, "victim\n") != 0)
            fail_msg("the link at %s was written through (exit %d)", at_target ? "the target" : "PATH.tmp",
                     r.exit_status);
        free(text);
        if (at_target) {
            assert_int_equal(r.exit_status, 1);
            if (!strstr(r.err, "chart.svg: is a symbolic link")) fail_msg("expected the link named:\n%s", r.err);
        } else {
            if (r.exit_status != 0) fail_msg("exit %d: %s", r.exit_status, r.err);
            char* chart = test_read_text(svg);
            assert_non_null(strstr(chart, "<svg"));
            free(chart);
        }
        free_result(&r);
        unlink(svg);
        unlink(temporary);
    }
}

static void test_connection_dropped_mid_stream(void** state) {
    (void)state;
    expect_failed_requests(FAKE_DROP_MID_STREAM, "connection dropped mid-stream after 1 tokens");
}

static void test_http_500(void** state) {
    (void)state;
    expect_failed_requests(FAKE_HTTP_500, "HTTP 500: engine exploded");
}

static void test_malformed_json_event(void** state) {
    (void)state;
    expect_failed_requests(FAKE_MALFORMED_JSON, "malformed JSON in event 2");
}

static void test_stream_without_done(void** state) {
    (void)state;
    expect_failed_requests(FAKE_NO_DONE, "ended without data: [DONE] after 1 tokens");
}

// ---- hostile options and the pure parts ----------------------------------------------------

static void test_bad_options_are_named(void** state) {
    (void)state;
    struct {
        const char* arguments;
        int status;
        const char* message;
    } cases[] = {
        {"bench-serve", 2, "--url is required"},
        {"bench-serve --url ftp://example.com", 2, "--url: expected http://"},
        {"bench-serve --url http://", 2, "is not a URL"},
        {"bench-serve --url http://127.0.0.1:1 --prompt-len normal:abc", 2, "--prompt-len: expected N, uniform"},
        {"bench-serve --url http://127.0.0.1:1 --output-len 0", 2, "--output-len: expected"},
        {"bench-serve --url http://127.0.0.1:1 --rate fast", 2, "--rate: expected requests per second"},
        {"bench-serve --url http://127.0.0.1:1 --sweep-concurrency 1,,4", 2, "--sweep-concurrency: expected"},
        {"bench-serve --url http://127.0.0.1:1 --svg x.svg", 2, "--svg: draws the sweep's chart"},
        // Port 1 on loopback: nothing listens, so the connection is refused at once.
        {"bench-serve --url http://127.0.0.1:1", 1, "cannot reach the server"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        command_result r = run_servelab(cases[i].arguments);
        if (r.exit_status != cases[i].status || !strstr(r.err, cases[i].message))
            fail_msg("'%s': exit %d (expected %d), stderr '%s' (expected '%s')", cases[i].arguments, r.exit_status,
                     cases[i].status, r.err, cases[i].message);
        free_result(&r);
    }
}

// ---- the server's counters (--server-metrics) -----------------------------------------------

static double number_field(json_t* object, const char* name) {
    json_t* value = json_object_get(object, name);
    if (!json_is_number(value)) fail_msg("field '%s' is missing or not a number", name);
    return json_number_value(value);
}

// A page as vLLM writes it (two engines' label sets add up; no emitted count,
// so a target pass yields its kept guesses plus one) and as servelab writes it.
static void test_counters_parse_and_ratios(void** state) {
    (void)state;
    const char* vllm_page = "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n"
                            "# TYPE vllm:spec_decode_num_drafts_total counter\n"
                            "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\"} 100.0\n"
                            "vllm:spec_decode_num_drafts_total{engine=\"1\",model_name=\"m\"} 20.0\n"
                            "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m\"} 480.0\n"
                            "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"m\"} 300.0\n"
                            "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",position=\"0\"} 99.0\n"
                            "vllm:generation_tokens_total_extra{model_name=\"m\"} 5\n"
                            "vllm:generation_tokens_total{model_name=\"m\"} 900\n";
    bench_server_counters before, after;
    bench_counters_parse("", &before);
    assert_true(before.spec_drafts == -1 && before.engine_steps == -1 && before.generation_tokens == -1);
    bench_counters_parse(vllm_page, &after);
    assert_true(after.spec_drafts == 120.0);
    assert_true(after.spec_draft_tokens == 480.0);
    assert_true(after.spec_accepted_tokens == 300.0);
    assert_true(after.generation_tokens == 900.0); // not 905: the _extra line is another metric
    assert_true(after.engine_steps == -1 && after.spec_emitted_tokens == -1);
    const char* vllm_before = "vllm:spec_decode_num_drafts_total{engine=\"0\"} 20\n"
                              "vllm:spec_decode_num_draft_tokens_total{engine=\"0\"} 80\n"
                              "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\"} 60\n"
                              "vllm:generation_tokens_total{model_name=\"m\"} 100\n";
    bench_counters_parse(vllm_before, &before);
    bench_server_steps t;
    bench_server_steps_between(&before, &after, &t);
    // 100 drafts, 400 guesses, 240 kept: 60%, and (240 + 100) / 100 = 3.4 tokens per target pass.
    assert_true(t.spec_drafts == 100.0 && t.spec_draft_tokens == 400.0 && t.spec_accepted_tokens == 240.0);
    assert_float_equal(t.acceptance_rate, 0.6, 1e-12);
    assert_float_equal(t.tokens_per_target_pass, 3.4, 1e-12);
    assert_true(t.engine_steps == -1 && t.tokens_per_step == -1); // vLLM counts no steps

    // servelab's page: steps, and the emitted count instead of accepted + drafts
    // (fewer when a stop rule cut a pass: 3 + 1 + 2 + 1 = 7, not 8, here).
    const char* servelab_page = "servelab:engine_steps_total{model_name=\"s\"} 40\n"
                                "vllm:generation_tokens_total{model_name=\"s\"} 90\n"
                                "vllm:spec_decode_num_drafts_total{model_name=\"s\"} 2\n"
                                "vllm:spec_decode_num_draft_tokens_total{model_name=\"s\"} 8\n"
                                "vllm:spec_decode_num_accepted_tokens_total{model_name=\"s\"} 6\n"
                                "servelab:spec_decode_num_emitted_tokens_total{model_name=\"s\"} 7\n";
    bench_counters_parse("servelab:engine_steps_total{model_name=\"s\"} 10\n"
                         "vllm:generation_tokens_total{model_name=\"s\"} 30\n"
                         "vllm:spec_decode_num_drafts_total{model_name=\"s\"} 0\n"
                         "vllm:spec_decode_num_draft_tokens_total{model_name=\"s\"} 0\n"
                         "vllm:spec_decode_num_accepted_tokens_total{model_name=\"s\"} 0\n"
                         "servelab:spec_decode_num_emitted_tokens_total{model_name=\"s\"} 0\n",
                         &before);
    bench_counters_parse(servelab_page, &after);
    bench_server_steps_between(&before, &after, &t);
    assert_float_equal(t.tokens_per_step, 60.0 / 30.0, 1e-12);
    assert_float_equal(t.tokens_per_target_pass, 3.5, 1e-12);
    assert_float_equal(t.acceptance_rate, 0.75, 1e-12);
}

// Against servelab serve: the server's generated tokens during the run are
// the run's own output tokens (the only client), and without speculation a
// step adds at most one token per sequence: tokens per step <= concurrency 3.
static void test_tokens_per_step_against_servelab_serve(void** state) {
    (void)state;
    served s;
    serve_start(&s);
    char arguments[512];
    snprintf(arguments, sizeof arguments,
             "bench-serve --url http://127.0.0.1:%d --requests 6 --prompt-len 12 --output-len 16 --concurrency 3 "
             "--server-metrics --json",
             s.port);
    command_result r = run_servelab(arguments);
    serve_stop(&s);
    if (r.exit_status != 0) fail_msg("exit %d; stderr: %s", r.exit_status, r.err);
    json_t* root = parse_json_or_fail(r.out);
    json_t* run = json_array_get(json_object_get(root, "runs"), 0);
    json_t* server = json_object_get(run, "server_metrics");
    if (!json_is_object(server)) fail_msg("no server_metrics object: %s", r.out);
    assert_true(number_field(server, "generation_tokens") == (double)integer_field(run, "output_tokens"));
    double steps = number_field(server, "engine_steps"), per_step = number_field(server, "tokens_per_step");
    assert_true(steps >= 16 * 2); // two waves of 3 requests, 16 tokens each: at least 32 steps
    assert_float_equal(per_step, 96.0 / steps, 1e-3);
    assert_true(per_step > 1.0 && per_step <= 3.0);
    assert_true(json_is_null(json_object_get(server, "tokens_per_target_pass"))); // speculation off
    json_decref(root);
    free_result(&r);

    // With a W4A16 draft guessing 4: a target pass yields between 1 and k + 1 = 5 tokens,
    // a step up to 3 x 5, and the text report says so.
    serve_start_with(&s, "--speculative draft:w4a16:g32:k4");
    snprintf(arguments, sizeof arguments,
             "bench-serve --url http://127.0.0.1:%d --requests 6 --prompt-len 12 --output-len 32 --concurrency 3 "
             "--server-metrics --json",
             s.port);
    r = run_servelab(arguments);
    snprintf(arguments + strlen(arguments) - strlen(" --json"), 8, "%s", "");
    command_result text = run_servelab(arguments);
    serve_stop(&s);
    if (r.exit_status != 0 || text.exit_status != 0) fail_msg("exit %d; stderr: %s", r.exit_status, r.err);
    root = parse_json_or_fail(r.out);
    run = json_array_get(json_object_get(root, "runs"), 0);
    server = json_object_get(run, "server_metrics");
    double drafts = number_field(server, "spec_drafts"), drafted = number_field(server, "spec_draft_tokens");
    double kept = number_field(server, "spec_accepted_tokens"),
           per_pass = number_field(server, "tokens_per_target_pass");
    print_message("draft k4: %.0f passes, %.0f of %.0f guesses kept, %.3f tokens per target pass, %.3f per step\n",
                  drafts, kept, drafted, per_pass, number_field(server, "tokens_per_step"));
    assert_true(drafts > 0 && drafted <= 4 * drafts && kept <= drafted);
    assert_float_equal(number_field(server, "acceptance_rate"), kept / drafted, 1e-3);
    assert_true(per_pass > 1.0 && per_pass <= 5.0 && per_pass <= 1.0 + kept / drafts + 1e-3); // the JSON has 4 decimals
    assert_true(number_field(server, "tokens_per_step") <= 15.0);
    assert_true(number_field(server, "generation_tokens") == (double)integer_field(run, "output_tokens"));
    if (!strstr(text.out, "tokens per target pass")) fail_msg("the report has no speculation line:\n%s", text.out);
    json_decref(root);
    free_result(&r);
    free_result(&text);
}

static void test_percentile_interpolates_between_ranks(void** state) {
    (void)state;
    const double values[] = {10, 20, 30, 40, 50};
    assert_float_equal(bench_percentile(values, 5, 50), 30.0, 1e-12);
    assert_float_equal(bench_percentile(values, 5, 90), 46.0, 1e-12); // rank 3.6: 40 + 0.6 x 10
    assert_float_equal(bench_percentile(values, 5, 99), 49.6, 1e-12);
    assert_float_equal(bench_percentile(values, 5, 100), 50.0, 1e-12);
    assert_float_equal(bench_percentile(values, 1, 99), 10.0, 1e-12);
}

static void test_lengths_and_urls(void** state) {
    (void)state;
    bench_length d;
    error_info err = {{0}};
    assert_int_equal(bench_length_parse("--prompt-len", "128", &d, &err), 0);
    assert_int_equal(d.kind, BENCH_LENGTH_FIXED);
    assert_int_equal(bench_length_parse("--prompt-len", "normal:128:32", &d, &err), 0);
    assert_int_equal(d.kind, BENCH_LENGTH_NORMAL);
    assert_int_equal(bench_length_parse("--prompt-len", "uniform:64:256", &d, &err), 0);
    assert_int_equal(d.kind, BENCH_LENGTH_UNIFORM);
    assert_int_equal(bench_length_parse("--prompt-len", "uniform:9:3", &d, &err), -1);
    assert_int_equal(bench_length_parse("--prompt-len", "12x", &d, &err), -1);
    assert_int_equal(bench_length_parse("--prompt-len", "-5", &d, &err), -1);
    char base[256], completions[256];
    assert_int_equal(bench_url_parse("http://127.0.0.1:8000", base, sizeof base, completions, sizeof completions, &err),
                     0);
    assert_string_equal(base, "http://127.0.0.1:8000");
    assert_string_equal(completions, "http://127.0.0.1:8000/v1/completions");
    assert_int_equal(
        bench_url_parse("http://h:1/v1/completions", base, sizeof base, completions, sizeof completions, &err), 0);
    assert_string_equal(completions, "http://h:1/v1/completions");

    // A generated workload: BOS first, the shared prefix in every prompt, fixed lengths.
    bench_workload w;
    bench_workload_spec spec = {4, {BENCH_LENGTH_FIXED, 20, 0}, {BENCH_LENGTH_FIXED, 5, 0}, 6, 512, 3};
    assert_int_equal(bench_workload_generate(&w, &spec, &err), 0);
    assert_int_equal(w.n_requests, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(w.requests[i].n_prompt, 20);
        assert_int_equal(w.requests[i].max_tokens, 5);
        assert_int_equal(w.requests[i].prompt[0], 1);
        assert_memory_equal(w.requests[i].prompt + 1, w.requests[0].prompt + 1, 6 * sizeof(int32_t));
    }
    assert_true(memcmp(w.requests[1].prompt + 7, w.requests[0].prompt + 7, 13 * sizeof(int32_t)) != 0);
    bench_workload_set_arrivals(&w, 10.0, 3);
    for (int i = 1; i < 4; i++)
        assert_true(w.requests[i].arrival_s > w.requests[i - 1].arrival_s);
    bench_workload_free(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_percentile_interpolates_between_ranks),
        cmocka_unit_test(test_lengths_and_urls),
        cmocka_unit_test(test_bad_options_are_named),
        cmocka_unit_test(test_server_model_id_is_printed_safely),
        cmocka_unit_test(test_svg_is_not_written_through_links),
        cmocka_unit_test(test_connection_dropped_mid_stream),
        cmocka_unit_test(test_http_500),
        cmocka_unit_test(test_malformed_json_event),
        cmocka_unit_test(test_stream_without_done),
        cmocka_unit_test(test_against_servelab_serve),
        cmocka_unit_test(test_counters_parse_and_ratios),
        cmocka_unit_test(test_tokens_per_step_against_servelab_serve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
