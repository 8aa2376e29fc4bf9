// serve metrics: latency histograms, GET /health and GET /metrics
// (Prometheus text with vLLM's metric names).
#include "lab/serve/internal.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// vLLM's bucket bounds (its metrics.py), cut to 16 each.
static const double TTFT_BOUNDS[HISTOGRAM_BUCKETS] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                                      0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0};

static const double TPOT_BOUNDS[HISTOGRAM_BUCKETS] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                                      0.2,   0.3,   0.4,  0.5,   0.75, 1.0,   2.5, 5.0};

static const double E2E_BOUNDS[HISTOGRAM_BUCKETS] = {0.01, 0.05, 0.1, 0.3,  0.5,  0.8,  1.0,  1.5,
                                                     2.0,  2.5,  5.0, 10.0, 15.0, 20.0, 30.0, 60.0};

void serve_metrics_init(serve_metrics* m) {
    memset(m, 0, sizeof *m);
    m->ttft.bounds = TTFT_BOUNDS;
    m->tpot.bounds = TPOT_BOUNDS;
    m->e2e.bounds = E2E_BOUNDS;
}

void serve_metrics_count_speculation(serve_metrics* m, const step_record* record) {
    for (int i = 0; i < record->n_sequences; i++) {
        const step_sequence* seq = &record->sequences[i];
        if (seq->spec_drafted <= 0) continue; // a prefill chunk, or a lookup that found nothing: a plain step
        m->spec_drafts++;
        m->spec_draft_tokens += (uint64_t)seq->spec_drafted;
        m->spec_accepted_tokens += (uint64_t)seq->spec_accepted;
        m->spec_emitted_tokens += (uint64_t)seq->spec_emitted;
        // The kept guesses are a prefix of the run: positions 0 .. accepted - 1.
        for (int p = 0; p < seq->spec_accepted && p < SPEC_MAX_K; p++)
            m->spec_accepted_per_position[p]++;
    }
}

void serve_histogram_observe(histogram* h, double seconds) {
    int i = 0;
    while (i < HISTOGRAM_BUCKETS && seconds > h->bounds[i])
        i++;
    h->counts[i]++;
    h->sum += seconds;
    h->count++;
}

enum MHD_Result serve_handle_health(server* s, struct MHD_Connection* connection) {
    pthread_mutex_lock(&s->lock);
    const serve_metrics* m = &s->metrics;
    json_t* body =
        json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "status", s->stopping ? "stopping" : "ok",
                  "model", s->model_name, "kv_blocks_total", m->blocks_total, "kv_blocks_free", m->blocks_free,
                  "kv_blocks_cached", m->blocks_cached, "kv_blocks_used", m->blocks_used, "sequences_running",
                  m->sequences_running, "sequences_waiting", m->sequences_waiting, "sequences_live", m->sequences_live,
                  "requests_in_flight", s->n_in_flight, "connections", s->connections);
    pthread_mutex_unlock(&s->lock);
    return serve_respond_json(connection, 200, body);
}

typedef struct text_buffer {
    char* text;
    size_t bytes, capacity;
} text_buffer;

static void tb_printf(text_buffer* b, const char* format, ...) __attribute__((format(printf, 2, 3)));

static void tb_printf(text_buffer* b, const char* format, ...) {
    for (;;) {
        va_list args;
        va_start(args, format);
        int n = vsnprintf(b->text ? b->text + b->bytes : NULL, b->text ? b->capacity - b->bytes : 0, format, args);
        va_end(args);
        if (n < 0) return;
        if (b->text && b->bytes + (size_t)n < b->capacity) {
            b->bytes += (size_t)n;
            return;
        }
        size_t capacity = (b->capacity + (size_t)n + 1) * 2;
        char* text = realloc(b->text, capacity);
        if (!text) return;
        b->text = text;
        b->capacity = capacity;
    }
}

static void metric_header(text_buffer* b, const char* name, const char* type, const char* help) {
    tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metric_value(text_buffer* b, const char* name, const char* type, const char* help, const char* labels,
                         double value) {
    metric_header(b, name, type, help);
    tb_printf(b, "%s{%s} %.17g\n", name, labels, value);
}

static void metric_histogram(text_buffer* b, const char* name, const char* help, const char* labels,
                             const histogram* h) {
    metric_header(b, name, "histogram", help);
    uint64_t cumulative = 0;
    for (int i = 0; i < HISTOGRAM_BUCKETS; i++) {
        cumulative += h->counts[i];
        tb_printf(b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, labels, h->bounds[i], (unsigned long long)cumulative);
    }
    tb_printf(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, labels, (unsigned long long)h->count);
    tb_printf(b, "%s_sum{%s} %.17g\n%s_count{%s} %llu\n", name, labels, h->sum, name, labels,
              (unsigned long long)h->count);
}

enum MHD_Result serve_handle_metrics(server* s, struct MHD_Connection* connection) {
    text_buffer b = {0};
    char labels[300];
    snprintf(labels, sizeof labels, "model_name=\"%s\"", s->model_name);
    pthread_mutex_lock(&s->lock);
    serve_metrics m = s->metrics;
    int connections = s->connections;
    pthread_mutex_unlock(&s->lock);
    double usage = m.blocks_total ? (double)m.blocks_used / m.blocks_total : 0.0;
    metric_value(&b, "vllm:num_requests_running", "gauge", "Sequences in the running batch.", labels,
                 m.sequences_running);
    metric_value(&b, "vllm:num_requests_waiting", "gauge", "Sequences waiting (queued or preempted).", labels,
                 m.sequences_waiting);
    metric_value(&b, "vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage: blocks held by sequences / all (1 = full).",
                 labels, usage);
    metric_value(&b, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage: blocks held by sequences / all (1 = full).",
                 labels, usage);
    metric_value(&b, "vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
                 labels, (double)m.prompt_tokens);
    metric_value(&b, "vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", labels,
                 (double)m.prefix_hit_tokens);
    metric_value(&b, "vllm:num_preemptions_total", "counter", "Preemptions (recompute) since the start.", labels,
                 (double)m.preemptions);
    metric_value(&b, "vllm:prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", labels,
                 (double)m.prompt_tokens);
    metric_value(&b, "vllm:generation_tokens_total", "counter", "Tokens generated.", labels,
                 (double)m.generation_tokens);
    metric_header(&b, "vllm:request_success_total", "counter", "Requests finished, by reason.");
    tb_printf(&b, "vllm:request_success_total{%s,finished_reason=\"stop\"} %llu\n", labels,
              (unsigned long long)m.finished_stop);
    tb_printf(&b, "vllm:request_success_total{%s,finished_reason=\"length\"} %llu\n", labels,
              (unsigned long long)m.finished_length);
    tb_printf(&b, "vllm:request_success_total{%s,finished_reason=\"abort\"} %llu\n", labels,
              (unsigned long long)m.finished_abort);
    metric_histogram(&b, "vllm:time_to_first_token_seconds", "Time to first token (arrival to first token).", labels,
                     &m.ttft);
    metric_histogram(&b, "vllm:time_per_output_token_seconds", "Time between a request's tokens.", labels, &m.tpot);
    metric_histogram(&b, "vllm:e2e_request_latency_seconds", "Arrival to last token.", labels, &m.e2e);
    if (m.speculative) {
        // vLLM's spec-decode counters (its v1 metrics), and the tokens they yielded.
        metric_value(&b, "vllm:spec_decode_num_drafts_total", "counter",
                     "Sequence-steps whose guesses the target verified.", labels, (double)m.spec_drafts);
        metric_value(&b, "vllm:spec_decode_num_draft_tokens_total", "counter", "Guessed tokens proposed.", labels,
                     (double)m.spec_draft_tokens);
        metric_value(&b, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Guessed tokens the target kept.",
                     labels, (double)m.spec_accepted_tokens);
        metric_header(&b, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                      "Guesses kept at each position of a run (0 = the first guess).");
        int k = m.spec_k > 0 && m.spec_k <= SPEC_MAX_K ? m.spec_k : SPEC_MAX_K;
        for (int p = 0; p < k; p++)
            tb_printf(&b, "vllm:spec_decode_num_accepted_tokens_per_pos_total{%s,position=\"%d\"} %llu\n", labels, p,
                      (unsigned long long)m.spec_accepted_per_position[p]);
        metric_value(&b, "servelab:spec_decode_num_emitted_tokens_total", "counter",
                     "Tokens the verified sequence-steps appended (kept guesses plus the target's own); divided by "
                     "num_drafts: tokens per target pass.",
                     labels, (double)m.spec_emitted_tokens);
    }
    metric_value(&b, "servelab:kv_blocks_total", "gauge", "Blocks in the KV pool.", labels, m.blocks_total);
    metric_value(&b, "servelab:kv_blocks_free", "gauge", "Free blocks (no owner, not cached).", labels, m.blocks_free);
    metric_value(&b, "servelab:kv_blocks_cached", "gauge", "Blocks only the prefix cache holds (evictable).", labels,
                 m.blocks_cached);
    metric_value(&b, "servelab:kv_blocks_used", "gauge", "Blocks held by sequences.", labels, m.blocks_used);
    metric_value(&b, "servelab:requests_failed_total", "counter", "Requests that ended in a server error.", labels,
                 (double)m.finished_error);
    metric_value(&b, "servelab:requests_rejected_total", "counter", "Requests answered 4xx/5xx before the engine.",
                 labels, (double)m.rejected);
    metric_value(&b, "servelab:engine_steps_total", "counter", "Engine steps.", labels, (double)m.steps);
    metric_value(&b, "servelab:http_connections", "gauge", "Open HTTP connections.", labels, connections);
    enum MHD_Result result =
        b.text ? serve_respond_text(connection, 200, "text/plain; version=0.0.4; charset=utf-8", b.text)
               : serve_respond_text(connection, 500, "text/plain", "out of memory\n");
    free(b.text);
    return result;
}
