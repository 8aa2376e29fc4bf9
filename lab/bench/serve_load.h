// bench_serve: a load generator for OpenAI-compatible servers (servelab
// serve, llama.cpp's llama-server, vLLM): the workload, the streaming HTTP
// client (libcurl's multi interface, one thread) and the statistics.
//
// Every request is POSTed to /v1/completions with stream: true and
// stream_options.include_usage, its prompt as token ids (so that the server
// sees exactly the intended length), temperature 0, max_tokens its output
// length and ignore_eos (so that it generates exactly that many). Times are
// taken when each Server-Sent Event arrives:
//   TTFT  first chunk with a token - request sent
//   TPOT  (end - first token) / (output tokens - 1)
//   ITL   gap between consecutive chunks with tokens (a chunk with k tokens
//         is one gap, as vLLM's benchmark counts it)
//   E2E   end of the stream - request sent
// Output tokens come from the server's `usage`; the tokens seen in the
// chunks (their token_ids when the server sends them, else one per
// non-empty chunk) are counted beside it and a difference is reported.
//
// A server that refuses the connection, answers an HTTP error, drops the
// connection mid-stream, goes silent, or sends malformed events or JSON
// makes that request fail with its reason; the run goes on.
#ifndef SERVELAB_BENCH_SERVE_H
#define SERVELAB_BENCH_SERVE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

// ---- lengths ---------------------------------------------------------------

typedef enum bench_length_kind {
    BENCH_LENGTH_FIXED,     // "128" or "fixed:128"
    BENCH_LENGTH_UNIFORM,   // "uniform:64:256", inclusive
    BENCH_LENGTH_NORMAL,    // "normal:128:32", mean and standard deviation, rounded, at least 1
    BENCH_LENGTH_LOGNORMAL, // "lognormal:128:32", mean and standard deviation of the lengths
} bench_length_kind;

typedef struct bench_length {
    bench_length_kind kind;
    double a; // fixed: the length; uniform: low; normal, lognormal: mean
    double b; // uniform: high; normal, lognormal: standard deviation
} bench_length;

// Parses a DIST; the message names `flag`, what was found and the forms.
int bench_length_parse(const char* flag, const char* text, bench_length* out, error_info* err);

// ---- the workload ----------------------------------------------------------

typedef struct bench_request {
    int32_t* prompt; // (n_prompt) token ids, BOS (1) first
    int n_prompt;
    int max_tokens;
    double arrival_s; // seconds after the start of the run
} bench_request;

typedef struct bench_workload {
    bench_request* requests; // (n_requests) in arrival order
    int n_requests;
} bench_workload;

typedef struct bench_workload_spec {
    int n_requests;
    bench_length prompt_length; // tokens, BOS included
    bench_length output_length;
    int shared_prefix; // tokens every prompt has after BOS (a shared system prompt)
    int vocab_size;    // random ids are drawn from 3 .. vocab_size - 1 (0..2: unk, BOS, EOS)
    uint64_t seed;
} bench_workload_spec;

int bench_workload_generate(bench_workload* out, const bench_workload_spec* spec, error_info* err);

// Arrival times: rate_per_s > 0 gives a Poisson process (exponential gaps
// drawn from seed); 0 sends everything at time 0. Requests keep their order.
void bench_workload_set_arrivals(bench_workload* w, double rate_per_s, uint64_t seed);

// Takes over the requests of `sim`'s workload reader (lab/bench/workload.h): the
// ids are moved, not copied, and the source is left empty.
struct workload;
int bench_workload_take(bench_workload* out, struct workload* source, error_info* err);

void bench_workload_free(bench_workload* w);

// ---- the client ------------------------------------------------------------

typedef struct bench_client_config {
    const char* completions_url; // e.g. http://127.0.0.1:8000/v1/completions
    const char* model;           // the `model` field
    int concurrency;             // requests in flight at most; 0 = no limit
    bool ignore_eos;             // send ignore_eos: true (vLLM, llama.cpp, servelab)
    bool token_ids;              // send return_token_ids: true (vLLM, servelab) to count chunk tokens exactly
    double connect_timeout_s;
    double idle_timeout_s;    // a request with no byte for this long fails
    double request_timeout_s; // a request longer than this fails
    // Called after each request ends (may be NULL).
    void (*on_progress)(void* user, int finished, int failed, int total);
    void* user;
} bench_client_config;

enum { BENCH_REASON_BYTES = 240 };

typedef struct bench_result {
    bool ok;
    char reason[BENCH_REASON_BYTES]; // why it failed ("" when ok)
    double sent_s;                   // when it was sent, seconds after the start of the run
    double ttft_s;                   // -1 when no token came
    double e2e_s;
    int requested_tokens; // max_tokens asked for
    int prompt_tokens;    // usage.prompt_tokens; -1 when the server sent no usage
    int output_tokens;    // usage.completion_tokens, else the tokens counted in chunks
    int chunk_tokens;     // tokens counted in the chunks
    bool usage_seen;
    double* itl_s; // (n_itl) gaps between chunks with tokens
    int n_itl;
    int itl_capacity;
} bench_result;

typedef struct bench_run {
    bench_result* results; // (n_results) in the workload's order
    int n_results;
    double duration_s; // first request sent to the last one finished
} bench_run;

// Sends every request of w as the config says and waits for all of them.
// Returns -1 only when the client itself cannot run (out of memory, libcurl
// refuses to start); a failed request is a result with ok false.
int bench_run_workload(const bench_client_config* config, const bench_workload* w, bench_run* out, error_info* err);
void bench_run_free(bench_run* run);

// GET base_url/v1/models: the first model's id into out. -1 with a message
// naming the URL and what went wrong (unreachable, HTTP error, no model).
int bench_fetch_model_name(const char* base_url, double timeout_s, char* out, size_t capacity, error_info* err);

// ---- URLs ------------------------------------------------------------------

// Checks URL (http:// or https://, a host) and writes the base (scheme,
// host, port) into base and the completions endpoint into completions: the
// URL as given when it has a path other than "/", else base + /v1/completions.
int bench_url_parse(const char* url, char* base, size_t base_capacity, char* completions, size_t completions_capacity,
                    error_info* err);

// ---- the server's own counters (GET /metrics) -------------------------------

// Counters from a Prometheus /metrics page, each summed over its label sets,
// and -1 where the page has no such metric (llama-server without --metrics;
// vLLM has no engine steps; speculation off). The speculative ones are
// vLLM's names, which servelab serve writes too.
typedef struct bench_server_counters {
    double engine_steps;         // servelab:engine_steps_total
    double generation_tokens;    // vllm:generation_tokens_total
    double spec_drafts;          // vllm:spec_decode_num_drafts_total: sequence-steps that verified guesses
    double spec_draft_tokens;    // vllm:spec_decode_num_draft_tokens_total
    double spec_accepted_tokens; // vllm:spec_decode_num_accepted_tokens_total
    double spec_emitted_tokens;  // servelab:spec_decode_num_emitted_tokens_total (servelab only)
} bench_server_counters;

// Reads the counters out of a /metrics page's text. Lines it does not know are skipped.
void bench_counters_parse(const char* text, bench_server_counters* out);
// GET base_url/metrics and parse it. 0, or -1 with err (unreachable, not HTTP 200).
int bench_fetch_counters(const char* base_url, double timeout_s, bench_server_counters* out, error_info* err);

// What the server did during one run: `after` minus `before`, and the ratios
// the report shows; -1 where a counter is missing or its divisor is 0.
typedef struct bench_server_steps {
    bool measured;            // both pages were read
    double engine_steps;      // steps the server ran
    double generation_tokens; // tokens it generated (every client's, not only this run's)
    double tokens_per_step;   // generation_tokens / engine_steps: tokens per engine step, whole batch
    double spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    double acceptance_rate;        // accepted / drafted guesses
    double tokens_per_target_pass; // per verifying sequence: emitted / drafts (servelab), else 1 + accepted / drafts
} bench_server_steps;

void bench_server_steps_between(const bench_server_counters* before, const bench_server_counters* after,
                                bench_server_steps* out);

// ---- statistics ------------------------------------------------------------

typedef struct bench_stat {
    int n;
    double mean, p50, p90, p99; // milliseconds; 0 when n is 0
} bench_stat;

// The p-th percentile (0..100) of sorted[0..n) with linear interpolation
// between the nearest ranks (numpy's default), so p50 <= p90 <= p99.
double bench_percentile(const double* sorted, int n, double p);

enum { BENCH_MAX_REASONS = 8 };

typedef struct bench_summary {
    int n_requests, completed, failed;
    double duration_s;
    long long prompt_tokens, output_tokens;
    double request_throughput;     // completed requests per second
    double output_throughput;      // output tokens per second
    double total_token_throughput; // prompt + output tokens per second
    bench_stat ttft_ms, tpot_ms, itl_ms, e2e_ms;
    double slo_ttft_ms, slo_tpot_ms; // 0 = no objective
    int good_requests;               // completed within both objectives
    double goodput;                  // good requests per second
    int token_mismatches;            // usage and chunk counts differ
    int usage_missing;               // completed without `usage`
    int short_outputs;               // fewer output tokens than asked for
    char first_mismatch[BENCH_REASON_BYTES];
    int n_reasons; // distinct failure reasons, most frequent first
    char reasons[BENCH_MAX_REASONS][BENCH_REASON_BYTES];
    int reason_counts[BENCH_MAX_REASONS];
    int other_reasons; // failures whose reason did not fit the list
} bench_summary;

int bench_summarize(const bench_run* run, double slo_ttft_ms, double slo_tpot_ms, bench_summary* out, error_info* err);

#endif
