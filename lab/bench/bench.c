#include "lab/bench/bench.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "engine/kv_memory.h"
#include "engine/model_synth.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/machine_probe.h"
#include "lab/common/model_source.h"

// ---- what is measured ------------------------------------------------------------

// The weight formats of the issue, each with the sections it takes part in.
// Quantized variants start from fp16 weights (RTN: no calibration run).
typedef struct bench_variant {
    const char* label;
    model_dtype_choice dtype;
    const char* quant; // model_quant_spec text, or NULL
    bool prefill;      // "W4A16 helps decode, not prefill": fp16, W4A16, W8A8
    bool batch;        // batch scaling runs on fp16
} bench_variant;

static const bench_variant VARIANTS[BENCH_MAX_DECODE] = {
    {"fp32", MODEL_DTYPE_FP32, NULL, false, false},
    {"fp16", MODEL_DTYPE_FP16, NULL, true, true},
    {"w8a16", MODEL_DTYPE_FP16, "w8a16:rtn:sym", false, false},
    {"w4a16 g128", MODEL_DTYPE_FP16, "w4a16:g128:rtn:sym", true, false},
    {"w8a8", MODEL_DTYPE_FP16, "w8a8:rtn", true, false},
};

// The variant every other one's decode speed is compared with, run for run.
#define REFERENCE_VARIANT 1 // fp16

static const int PREFILL_TOKENS[2] = {128, 512};
static const int BATCH_SIZES[BENCH_MAX_BATCH] = {1, 2, 4, 8, 16, 32, 64};
static const int ATTENTION_CONTEXTS[3] = {512, 2048, 8192};

// Prompt tokens before decoding starts (decode runs), and decode steps per
// batch-scaling run.
#define DECODE_PROMPT_TOKENS 8
#define PAGED_BLOCK_SIZE 16

typedef struct bench_run_state {
    const bench_options* options;
    bench_report* report;
    bench_progress_fn progress;
    void* progress_user;
    int parts_done; // say() calls so far: each one ends a part of the run
} bench_run_state;

// The parts (say() calls) of a whole run, for the progress count: the
// machine line, the first probe and the fp16 weights; per weight format
// its preparation (fp16's is above), decode, prefill at 2 lengths, batch at
// BENCH_MAX_BATCH sizes, and a probe; the 3 attention contexts, the fixed
// cost line and the last probe. 35 with the formats of VARIANTS.
static int expected_parts(void) {
    int parts = 3;
    for (int i = 0; i < BENCH_MAX_DECODE; i++)
        parts += (i != REFERENCE_VARIANT) + 1 + (VARIANTS[i].prefill ? 2 : 0) +
                 (VARIANTS[i].batch ? BENCH_MAX_BATCH : 0) + 1;
    return parts + 3 + 1 + 1;
}

static void say(bench_run_state* run, const char* format, ...) __attribute__((format(printf, 2, 3)));

static void say(bench_run_state* run, const char* format, ...) {
    run->parts_done++;
    if (!run->progress) return;
    char line[256];
    va_list args;
    va_start(args, format);
    vsnprintf(line, sizeof line, format, args);
    va_end(args);
    run->progress(run->progress_user, line, run->parts_done, expected_parts());
}

// ---- running requests through the engine --------------------------------------

// What the measured steps of one run added up to.
typedef struct run_totals {
    uint64_t tokens; // tokens computed by the measured steps
    uint64_t ns;     // their wall time (step records' wall_ns)
    uint64_t bytes;  // weights + KV read + KV written
    uint64_t flops;  // matmul + attention
} run_totals;

// An engine for up to max_seqs sequences of tokens_per_sequence tokens each:
// exactly enough blocks (plus slack) that nothing is ever preempted, a step
// budget of step_tokens, no prefix caching (a repeated prompt must be
// computed again, not found in the cache).
static int bench_engine_init(engine* e, const model* m, int n_threads, int max_seqs, int tokens_per_sequence,
                             int step_tokens, error_info* err) {
    engine_config config = engine_config_default();
    config.n_threads = n_threads;
    config.max_seqs = max_seqs;
    config.max_batched_tokens = step_tokens > 512 ? step_tokens : 512;
    config.prefix_caching = false;
    int blocks_per_sequence = (tokens_per_sequence + PAGED_BLOCK_SIZE) / PAGED_BLOCK_SIZE + 1;
    config.block_size = PAGED_BLOCK_SIZE;
    config.num_blocks = max_seqs * blocks_per_sequence + max_seqs + 2;
    return engine_init(e, m, &config, err);
}

// Queues `batch` requests of prompt_tokens tokens (BOS, then ids drawn from
// `seed`) that each generate max_new tokens, runs the engine until all are
// done, and sums the steps that are pure prefill (prefill = true) or that
// decode every one of the batch's sequences and nothing else.
static int run_requests(engine* e, int batch, int prompt_tokens, int max_new, bool prefill, uint64_t seed,
                        run_totals* totals, error_info* err) {
    const int vocab = e->model->config.vocab_size;
    int32_t* prompt = malloc((size_t)prompt_tokens * sizeof *prompt); // (prompt_tokens) ids
    if (!prompt) return error_set(err, "bench: out of memory");
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int r = 0; r < batch; r++) {
        prompt[0] = TOK_BOS_ID;
        for (int i = 1; i < prompt_tokens; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            prompt[i] = TOK_BYTE_OFFSET + (int32_t)((state >> 33) % (uint64_t)(vocab - TOK_BYTE_OFFSET));
        }
        request_params params = {prompt, prompt_tokens, max_new, 1, 0.0f, 1.0f, seed, 0.0, true};
        if (engine_add_request(e, &params, NULL, err)) {
            free(prompt);
            return -1;
        }
    }
    free(prompt);
    *totals = (run_totals){0, 0, 0, 0};
    while (engine_has_work(e)) {
        const step_record* r;
        if (engine_step(e, &r, err)) return -1;
        bool measured = prefill ? r->prefill_tokens > 0 && r->decode_tokens == 0
                                : r->prefill_tokens == 0 && r->decode_tokens == batch;
        if (!measured) continue;
        const kernel_traffic* t = &r->traffic;
        totals->tokens += (uint64_t)(r->prefill_tokens + r->decode_tokens);
        totals->ns += r->wall_ns;
        totals->bytes += t->weight_bytes_read + t->kv_bytes_read + t->kv_bytes_written;
        totals->flops += t->matmul_flops + t->attention_flops;
    }
    return 0;
}

int bench_engine_rate(const model* m, int n_threads, int batch, int prompt_tokens, int max_new, bool prefill,
                      uint64_t seed, double* tok_s, error_info* err) {
    engine e;
    if (bench_engine_init(&e, m, n_threads, batch, prompt_tokens + max_new + 1,
                          prefill ? prompt_tokens : batch * prompt_tokens, err))
        return -1;
    run_totals totals;
    int status = run_requests(&e, batch, prompt_tokens, max_new, prefill, seed, &totals, err);
    engine_free(&e);
    if (status == 0 && totals.tokens == 0)
        status = error_set(err, "bench: no step of the run was %s", prefill ? "a prefill" : "a full decode");
    if (status == 0) *tok_s = totals.ns > 0 ? (double)totals.tokens / ((double)totals.ns * 1e-9) : 0.0;
    return status;
}

// amount (tokens, bytes, FLOPs) per second of the run's measured steps.
static double rate_of(const run_totals* t, uint64_t amount) {
    return t->ns > 0 ? (double)amount / ((double)t->ns * 1e-9) : 0.0;
}

// The run (of n) whose token rate is closest to the median rate; rates:
// scratch of n.
static int median_run(const run_totals* runs, double* rates, int n) {
    for (int k = 0; k < n; k++)
        rates[k] = rate_of(&runs[k], runs[k].tokens);
    double median = probe_median(rates, n); // sorts rates
    int chosen = 0;
    for (int k = 1; k < n; k++)
        if (fabs(rate_of(&runs[k], runs[k].tokens) - median) <
            fabs(rate_of(&runs[chosen], runs[chosen].tokens) - median))
            chosen = k;
    return chosen;
}

// One workload of a measurement: `batch` requests on a model, with an
// engine of its own that lives through every repeat.
typedef struct bench_series {
    const model* model;
    int batch;
    run_totals chosen; // the run with the median rate
    double ratio;      // median over repeats of rate / series 0's rate in the same repeat
} bench_series;

// Runs every series once per repeat, one after the other, `repeats` times:
// a slow moment of a shared machine then hits the series side by side
// rather than one of them, and the ratio of two series is taken repeat by
// repeat before its median (in one run here fp16 decoded 153 tok/s in its
// own section and 179 to 257 tok/s beside the other formats). Each series'
// figure is its run with the median rate.
static int measure_interleaved(bench_series* series, int n_series, const bench_options* options, int prompt_tokens,
                               int max_new, bool prefill, error_info* err) {
    const int repeats = options->repeats;
    engine* engines = calloc((size_t)n_series, sizeof *engines);                 // (n_series)
    bool* started = calloc((size_t)n_series, sizeof *started);                   // (n_series)
    run_totals* runs = calloc((size_t)n_series * (size_t)repeats, sizeof *runs); // (n_series, repeats)
    double* scratch = calloc((size_t)repeats, sizeof *scratch);                  // (repeats)
    int status = 0;
    if (!engines || !started || !runs || !scratch) status = error_set(err, "bench: out of memory");
    for (int i = 0; status == 0 && i < n_series; i++) {
        const int batch = series[i].batch;
        status = bench_engine_init(&engines[i], series[i].model, options->n_threads, batch, prompt_tokens + max_new + 1,
                                   prefill ? prompt_tokens : batch * prompt_tokens, err);
        started[i] = status == 0;
    }
    for (int k = 0; status == 0 && k < repeats; k++)
        for (int i = 0; status == 0 && i < n_series; i++)
            status = run_requests(&engines[i], series[i].batch, prompt_tokens, max_new, prefill, (uint64_t)k + 1,
                                  &runs[(size_t)i * (size_t)repeats + (size_t)k], err);
    for (int i = 0; status == 0 && i < n_series; i++) {
        const run_totals* own = &runs[(size_t)i * (size_t)repeats];
        series[i].chosen = own[median_run(own, scratch, repeats)];
        if (series[i].chosen.tokens == 0) {
            status = error_set(err, "bench: no step of the run was %s", prefill ? "a prefill" : "a full decode");
            break;
        }
        for (int k = 0; k < repeats; k++) {
            double base = rate_of(&runs[k], runs[k].tokens);
            scratch[k] = base > 0 ? rate_of(&own[k], own[k].tokens) / base : 0.0;
        }
        series[i].ratio = probe_median(scratch, repeats);
    }
    for (int i = 0; i < n_series && engines; i++)
        if (started[i]) engine_free(&engines[i]);
    free(engines);
    free(started);
    free(runs);
    free(scratch);
    return status;
}

// Runs the same requests `repeats` times on a fresh engine and keeps the
// run with the median rate (tokens / second); *median_totals is that run.
static int measure_runs(const model* m, const bench_options* options, int batch, int prompt_tokens, int max_new,
                        bool prefill, run_totals* median_totals, error_info* err) {
    bench_series one = {m, batch, {0, 0, 0, 0}, 0.0};
    if (measure_interleaved(&one, 1, options, prompt_tokens, max_new, prefill, err)) return -1;
    *median_totals = one.chosen;
    return 0;
}

// ---- the sections ---------------------------------------------------------------------

static int decode_tokens_for(const model* m, const bench_options* options) {
    int wanted = options->quick ? 16 : 128;
    int room = m->config.max_seq_len - DECODE_PROMPT_TOKENS - 2;
    return wanted < room ? wanted : room;
}

// The machine figures are the highest of the probes made so far: a run of
// minutes on a shared VM sees its speed drift, and a slow moment during a
// probe would otherwise make every fraction look better than it is. Every
// fraction and the roofline's batch are (re)computed from them.
static void apply_machine_figures(bench_report* r) {
    r->bandwidth_gb_s = 0.0;
    r->peak_gflop_s = 0.0;
    for (int i = 0; i < r->n_probes; i++) {
        r->bandwidth_gb_s = fmax(r->bandwidth_gb_s, r->probe_bandwidth_gb_s[i]);
        r->peak_gflop_s = fmax(r->peak_gflop_s, r->probe_peak_gflop_s[i]);
    }
    for (int i = 0; i < r->n_decode; i++)
        r->decode[i].frac_of_bw = r->decode[i].gb_s / r->bandwidth_gb_s;
    for (int i = 0; i < r->n_prefill; i++)
        r->prefill[i].frac_of_peak = r->prefill[i].gflop_s / r->peak_gflop_s;
    if (r->roofline_bytes_per_token > 0 && r->roofline_flops_per_token > 0)
        r->roofline_flat_batch = (r->roofline_bytes_per_token / (r->bandwidth_gb_s * 1e9)) /
                                 (r->roofline_flops_per_token / (r->peak_gflop_s * 1e9));
    const bench_batch* one = r->n_batch > 0 && r->batch[0].batch == 1 ? &r->batch[0] : NULL;
    if (one && one->tok_s > 0 && r->roofline_flops_per_token > 0)
        r->batch_peak_ceiling_x = r->peak_gflop_s * 1e9 / r->roofline_flops_per_token / one->tok_s;
}

// Batch-1 decode of m. `reference` (fp16; NULL when m is fp16 itself)
// decodes beside it, run for run, for the speed-up over fp16.
static int bench_decode_section(bench_run_state* run, const model* m, const model* reference, const bench_variant* v,
                                run_totals* totals, error_info* err) {
    bench_report* report = run->report;
    int n_tokens = decode_tokens_for(m, run->options);
    report->decode_tokens = n_tokens;
    bench_decode* d = &report->decode[report->n_decode];
    // max_new = n_tokens + 1: the prefill step samples the first token.
    if (reference) {
        bench_series pair[2] = {{reference, 1, {0, 0, 0, 0}, 0.0}, {m, 1, {0, 0, 0, 0}, 0.0}};
        if (measure_interleaved(pair, 2, run->options, DECODE_PROMPT_TOKENS, n_tokens + 1, false, err)) return -1;
        *totals = pair[1].chosen;
        d->x_fp16 = pair[1].ratio;
    } else {
        if (measure_runs(m, run->options, 1, DECODE_PROMPT_TOKENS, n_tokens + 1, false, totals, err)) return -1;
        d->x_fp16 = 1.0;
    }
    report->n_decode++;
    snprintf(d->dtype, sizeof d->dtype, "%s", v->label);
    d->tok_s = rate_of(totals, totals->tokens);
    d->gb_s = rate_of(totals, totals->bytes) * 1e-9;
    d->frac_of_bw = report->bandwidth_gb_s > 0 ? d->gb_s / report->bandwidth_gb_s : 0.0;
    d->bytes_per_token = (double)totals->bytes / (double)totals->tokens;
    say(run, "decode %-10s %8.1f tok/s  %6.1f GB/s  %3.0f%% of bandwidth  %.2fx fp16", d->dtype, d->tok_s, d->gb_s,
        100.0 * d->frac_of_bw, d->x_fp16);
    return 0;
}

static int bench_prefill_section(bench_run_state* run, const model* m, const bench_variant* v, error_info* err) {
    bench_report* report = run->report;
    for (int i = 0; i < 2; i++) {
        int room = m->config.max_seq_len - 2; // the prompt and the one token after it
        int tokens = PREFILL_TOKENS[i] < room ? PREFILL_TOKENS[i] : room;
        run_totals totals;
        // max_new 2 and room for it: the request outlives its prefill step
        // (engine.c's record_sequences() passes a NULL table to memcpy when
        // every sequence of a step has already released its blocks).
        if (measure_runs(m, run->options, 1, tokens, 2, true, &totals, err)) return -1;
        bench_prefill* p = &report->prefill[report->n_prefill++];
        snprintf(p->dtype, sizeof p->dtype, "%s", v->label);
        p->tokens = tokens;
        p->tok_s = rate_of(&totals, totals.tokens);
        p->gflop_s = rate_of(&totals, totals.flops) * 1e-9;
        p->frac_of_peak = report->peak_gflop_s > 0 ? p->gflop_s / report->peak_gflop_s : 0.0;
        say(run, "prefill %-10s %4d tokens %8.1f tok/s  %6.1f GFLOP/s  %3.0f%% of peak", p->dtype, tokens, p->tok_s,
            p->gflop_s, 100.0 * p->frac_of_peak);
    }
    return 0;
}

static int bench_batch_section(bench_run_state* run, const model* m, const bench_variant* v,
                               const run_totals* batch1_decode, error_info* err) {
    bench_report* report = run->report;
    snprintf(report->batch_dtype, sizeof report->batch_dtype, "%s", v->label);
    int steps = run->options->quick ? 4 : 16;
    // Every batch size once per repeat, batch 1 first: the speed-ups are
    // taken repeat by repeat (measure_interleaved).
    bench_series series[BENCH_MAX_BATCH];
    for (int i = 0; i < BENCH_MAX_BATCH; i++)
        series[i] = (bench_series){m, BATCH_SIZES[i], {0, 0, 0, 0}, 0.0};
    if (measure_interleaved(series, BENCH_MAX_BATCH, run->options, DECODE_PROMPT_TOKENS, steps + 1, false, err))
        return -1;
    for (int i = 0; i < BENCH_MAX_BATCH; i++) {
        bench_batch* b = &report->batch[report->n_batch++];
        b->batch = BATCH_SIZES[i];
        b->tok_s = rate_of(&series[i].chosen, series[i].chosen.tokens);
        b->x_batch1 = series[i].ratio;
        say(run, "batch %3d %-10s %8.1f tok/s  %.2fx batch 1", b->batch, v->label, b->tok_s, b->x_batch1);
    }
    // The roofline: a step streams the weights once (bytes/token at batch 1)
    // and computes B tokens' FLOPs; throughput stops growing where the
    // compute time catches up with the streaming time.
    report->roofline_bytes_per_token = (double)batch1_decode->bytes / (double)batch1_decode->tokens;
    report->roofline_flops_per_token = (double)batch1_decode->flops / (double)batch1_decode->tokens;
    apply_machine_figures(report);
    return 0;
}

static model_request variant_request(const bench_options* options, const bench_variant* v) {
    return (model_request){options->model_arg, NULL, v->dtype, options->synth_seed, v->quant};
}

// A variant's sections. `reference` holds the fp16 weights, open for the
// whole run: the fp16 variant runs on them, the others decode beside them.
static int bench_variant_sections(bench_run_state* run, const bench_variant* v, const model* reference,
                                  model_config* shape, error_info* err) {
    const bool is_reference = v == &VARIANTS[REFERENCE_VARIANT];
    model_source source;
    const model* m = reference;
    if (!is_reference) {
        model_request request = variant_request(run->options, v);
        say(run, "preparing %s weights of %s", v->label, run->options->model_arg);
        if (model_source_open(&source, &request, err)) return -1;
        m = &source.model;
    }
    *shape = m->config;
    run_totals decode_totals;
    int status = bench_decode_section(run, m, is_reference ? NULL : reference, v, &decode_totals, err);
    if (status == 0 && v->prefill) status = bench_prefill_section(run, m, v, err);
    if (status == 0 && v->batch) status = bench_batch_section(run, m, v, &decode_totals, err);
    if (!is_reference) model_source_close(&source);
    return status;
}

// ---- attention: paged against contiguous ----------------------------------------------

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// One decode token's attention through every layer at `context`, reading
// the fp16 keys and values of `kv` through `table`, on one thread: the
// kernel's own time, which both layouts are judged by (the engine shares one
// decode row's heads out among its threads, each reading its heads' part of
// every slot, the same blocks in the same order). Returns seconds.
static double time_attention(const model_config* c, const kv_memory* kv, const int32_t* table, int block_size,
                             int context, const float* query, float* out, float* scores) {
    double start = seconds_now();
    for (int l = 0; l < c->n_layers; l++) {
        kv_layer_view view = {
            KV_F16, kv_memory_layer_keys(kv, l), kv_memory_layer_values(kv, l), table, block_size, NULL, NULL, 0};
        attention_row(out, query, &view, context, c->n_heads, c->n_kv_heads, c->head_dim, scores, NULL);
    }
    return seconds_now() - start;
}

// The stretches of memory one token's attention reads through `table`, in
// the kernel's order: each layer's keys at positions 0 .. context-1, then
// its values. Slots next to each other in memory make one stretch, and
// each stretch is widened to whole 64-byte lines (the lines the kernel
// touches). chunks: room for 2 x n_layers x context. Returns how many.
static int attention_chunks(probe_chunk* chunks, const model_config* c, const kv_memory* kv, const int32_t* table,
                            int block_size, int context) {
    const size_t slot_bytes = (size_t)c->kv_dim * sizeof(uint16_t);
    int n = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int side = 0; side < 2; side++) {
            const unsigned char* base = side == 0 ? kv_memory_layer_keys(kv, l) : kv_memory_layer_values(kv, l);
            const int first = n;
            for (int t = 0; t < context; t++) {
                const unsigned char* slot = base + (size_t)kv_slot_of_position(table, block_size, t) * slot_bytes;
                if (n > first && (const unsigned char*)chunks[n - 1].start + chunks[n - 1].bytes == slot)
                    chunks[n - 1].bytes += slot_bytes;
                else
                    chunks[n++] = (probe_chunk){slot, slot_bytes};
            }
            for (int i = first; i < n; i++) { // to whole lines
                uintptr_t start = (uintptr_t)chunks[i].start, end = start + chunks[i].bytes;
                start &= ~(uintptr_t)63;
                end = (end + 63) & ~(uintptr_t)63;
                chunks[i] = (probe_chunk){(const void*)start, end - start};
            }
        }
    return n;
}

// The inputs both layouts attend over: a cache of values in [-1, 1)
// (realistic, finite softmax inputs), one query, the contiguous slot table
// (max_context slots in order) and the paged block table (max_context / 16
// blocks, shuffled as a pool's are after some churn).
static void fill_attention_inputs(const model_config* c, kv_memory* kv, int max_context, float* query,
                                  int32_t* contiguous, int32_t* paged) {
    const size_t slots = (size_t)max_context;
    uint64_t state = 12345;
    for (int l = 0; l < c->n_layers; l++) {
        uint16_t* keys = kv_memory_layer_keys(kv, l);     // (slots, kv_dim) fp16
        uint16_t* values = kv_memory_layer_values(kv, l); // (slots, kv_dim) fp16
        for (size_t i = 0; i < slots * (size_t)c->kv_dim; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            keys[i] = fp32_to_fp16((float)(state >> 40) / 8388608.0f - 1.0f);
            values[i] = fp32_to_fp16((float)((state >> 16) & 0xffffff) / 8388608.0f - 1.0f);
        }
    }
    for (int i = 0; i < c->dim; i++)
        query[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    for (size_t i = 0; i < slots; i++)
        contiguous[i] = (int32_t)i;
    int n_blocks = max_context / PAGED_BLOCK_SIZE;
    for (int b = 0; b < n_blocks; b++)
        paged[b] = b;
    for (int b = n_blocks - 1; b > 0; b--) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        int other = (int)((state >> 33) % (uint64_t)(b + 1));
        int32_t swap = paged[b];
        paged[b] = paged[other];
        paged[other] = swap;
    }
}

static int bench_attention_section(bench_run_state* run, const model_config* c, error_info* err) {
    bench_report* report = run->report;
    const int max_context = ATTENTION_CONTEXTS[2];
    const size_t slots = (size_t)max_context;
    // The cache is the engine's own storage (kv_memory: on huge pages where
    // the kernel gives them), so both layouts read memory as a run does.
    kv_memory kv;
    if (kv_memory_init(&kv, c, KV_F16, max_context / PAGED_BLOCK_SIZE, PAGED_BLOCK_SIZE, err)) return -1;
    int32_t* contiguous = malloc(slots * sizeof *contiguous);          // (max_context) slot ids, block size 1
    int32_t* paged = malloc(slots / PAGED_BLOCK_SIZE * sizeof *paged); // (max_context / 16) block ids
    float* query = malloc((size_t)c->dim * sizeof *query);             // (n_heads * head_dim)
    float* out = malloc((size_t)c->dim * sizeof *out);                 // (n_heads * head_dim)
    float* scores = malloc(slots * sizeof *scores);                    // (max_context)
    const int repeats = run->options->repeats;
    // (6, repeats) seconds: the kernel, the read alone and the prefetched
    // read, each for the contiguous and the paged layout
    double* seconds = calloc(6 * (size_t)repeats, sizeof(double));
    const size_t max_chunks = 2 * (size_t)c->n_layers * slots;
    probe_chunk* contiguous_chunks = malloc(max_chunks * sizeof *contiguous_chunks); // (max_chunks)
    probe_chunk* paged_chunks = malloc(max_chunks * sizeof *paged_chunks);           // (max_chunks)
    int status = 0;
    if (!contiguous || !paged || !query || !out || !scores || !seconds || !contiguous_chunks || !paged_chunks) {
        status = error_set(err, "bench: out of memory for %d tokens of KV", max_context);
        goto done;
    }
    fill_attention_inputs(c, &kv, max_context, query, contiguous, paged);
    for (int i = 0; i < 3; i++) {
        int context = ATTENTION_CONTEXTS[i];
        const int n_contiguous = attention_chunks(contiguous_chunks, c, &kv, contiguous, 1, context);
        const int n_paged = attention_chunks(paged_chunks, c, &kv, paged, PAGED_BLOCK_SIZE, context);
        // The kernel asks for one block ahead (a run of 16 positions).
        const size_t ahead = (size_t)PAGED_BLOCK_SIZE * (size_t)c->kv_dim * sizeof(uint16_t);
        // Both layouts alternate within each repeat, so a noisy moment hits both.
        for (int k = 0; k < repeats; k++) {
            seconds[0 * repeats + k] = time_attention(c, &kv, contiguous, 1, context, query, out, scores);
            seconds[1 * repeats + k] = time_attention(c, &kv, paged, PAGED_BLOCK_SIZE, context, query, out, scores);
            seconds[2 * repeats + k] = machine_gather_read_seconds(contiguous_chunks, n_contiguous, 0);
            seconds[3 * repeats + k] = machine_gather_read_seconds(paged_chunks, n_paged, 0);
            seconds[4 * repeats + k] = machine_gather_read_seconds(contiguous_chunks, n_contiguous, ahead);
            seconds[5 * repeats + k] = machine_gather_read_seconds(paged_chunks, n_paged, ahead);
        }
        double median_us[6];
        for (int m = 0; m < 6; m++)
            median_us[m] = probe_median(seconds + (size_t)m * (size_t)repeats, repeats) * 1e6;
        bench_attention* a = &report->attention[report->n_attention++];
        *a = (bench_attention){"paged", context, median_us[1], median_us[3], median_us[5]};
        bench_attention* b = &report->attention[report->n_attention++];
        *b = (bench_attention){"contiguous", context, median_us[0], median_us[2], median_us[4]};
        say(run, "attention %5d tokens: paged %.1f us, contiguous %.1f us per token (read alone %.1f / %.1f us)",
            context, a->us_per_token, b->us_per_token, a->read_prefetched_us_per_token,
            b->read_prefetched_us_per_token);
    }
done:
    kv_memory_free(&kv);
    free(contiguous);
    free(paged);
    free(query);
    free(out);
    free(scores);
    free(seconds);
    free(contiguous_chunks);
    free(paged_chunks);
    return status;
}

// ---- per-token fixed costs: the tiny stories260K checkpoint ------------------------------

// Decodes with the default model when it is stories260K (found in ./models
// or ../shared/models): at 260K parameters a token is a few microseconds of
// arithmetic, so what it measures is the engine's fixed cost per step.
static int bench_small_model_section(bench_run_state* run, error_info* err) {
    bench_small_model* small = &run->report->small_model;
    model_request request = {NULL, NULL, MODEL_DTYPE_DEFAULT, run->options->synth_seed, NULL};
    model_source source;
    if (model_source_open(&source, &request, err)) return -1;
    if (!strstr(source.model_label, "stories260K")) {
        model_source_close(&source);
        say(run, "stories260K not found in ./models or ../shared/models: skipping the fixed-cost line");
        return 0;
    }
    snprintf(small->path, sizeof small->path, "%s", source.model_label);
    int n_tokens = 256 < source.model.config.max_seq_len - DECODE_PROMPT_TOKENS - 2
                       ? 256
                       : source.model.config.max_seq_len - DECODE_PROMPT_TOKENS - 2;
    run_totals totals;
    int status = measure_runs(&source.model, run->options, 1, DECODE_PROMPT_TOKENS, n_tokens + 1, false, &totals, err);
    if (status == 0) {
        small->measured = true;
        small->tok_s = rate_of(&totals, totals.tokens);
        small->us_per_token = small->tok_s > 0 ? 1e6 / small->tok_s : 0.0;
        say(run, "stories260K decode %.0f tok/s (%.1f us per token)", small->tok_s, small->us_per_token);
    }
    model_source_close(&source);
    return status;
}

// ---- against a peer: llama.cpp on the same GGUF files (lab/bench/peer.c) -------------------

static void tell_peer_progress(void* user, const char* line) {
    bench_run_state* run = user;
    if (run->progress) run->progress(run->progress_user, line, run->parts_done, expected_parts());
}

static int bench_peer_section(bench_run_state* run, error_info* err) {
    bench_peer_options peer = run->options->peer;
    peer.n_threads = run->report->n_threads;
    if (peer.rounds < 1) peer.rounds = run->options->repeats;
    peer.quick = run->options->quick;
    return bench_peer_run(&peer, &run->report->peer, tell_peer_progress, run, err);
}

// ---- the whole run ------------------------------------------------------------------------

// One more probe of the machine's streaming-read bandwidth and FMA peak;
// `when` says where in the run it is, for the progress line.
static int probe_machine(bench_run_state* run, thread_pool* pool, const char* when, error_info* err) {
    bench_report* report = run->report;
    if (report->n_probes == BENCH_MAX_PROBES) return 0; // cannot happen: one per slot of the run
    const int repeats = run->options->repeats + 2;
    const int k = report->n_probes;
    report->probe_bandwidth_gb_s[k] = machine_stream_read_gb_s(pool, report->stream_buffer_bytes, repeats);
    report->probe_peak_gflop_s[k] = machine_peak_fma_gflop_s(pool, repeats);
    if (report->probe_bandwidth_gb_s[k] <= 0 || report->probe_peak_gflop_s[k] <= 0)
        return error_set(err, "bench: the machine probes failed (out of memory for %zu bytes?)",
                         report->stream_buffer_bytes);
    report->n_probes++;
    say(run, "machine (%s): %.1f GB/s streaming read, %.1f GFLOP/s fp32 FMA peak (%s)", when,
        report->probe_bandwidth_gb_s[k], report->probe_peak_gflop_s[k], report->simd_level);
    apply_machine_figures(report);
    return 0;
}

int bench_run(const bench_options* options, bench_report* report, bench_progress_fn progress, void* progress_user,
              error_info* err) {
    memset(report, 0, sizeof *report);
    bench_options effective = *options;
    if (!effective.model_arg) effective.model_arg = "stories110m";
    if (effective.repeats < 1) effective.repeats = 1;
    bench_run_state run = {&effective, report, progress, progress_user, 0};
    snprintf(report->model, sizeof report->model, "%s", effective.model_arg);

    thread_pool* pool = NULL;
    int pool_status = thread_pool_create(effective.n_threads, &pool);
    if (pool_status != 0)
        return error_set(err, "--threads %d: cannot start the threads (error %d)", effective.n_threads, pool_status);
    report->n_threads = thread_pool_size(pool);
    effective.n_threads = report->n_threads;
    report->simd_level = cpu_simd_level_name(cpu_simd_level_selected());
    report->peer_only = effective.peer_only;
    if (effective.peer_only) {
        thread_pool_free(pool);
        return bench_peer_section(&run, err);
    }
    // A smoke test reads 64 MiB (mostly cache on a large-L3 machine): the
    // number is then only a placeholder, and labelled by its buffer size.
    report->stream_buffer_bytes = effective.quick ? (size_t)64 << 20 : machine_stream_default_bytes();
    say(&run, "machine: streaming read over %zu MiB, %d threads", report->stream_buffer_bytes >> 20, report->n_threads);
    int status = probe_machine(&run, pool, "before", err);
    model_config shape = {0};
    model_source reference;
    bool reference_open = false;
    if (status == 0) {
        model_request request = variant_request(&effective, &VARIANTS[REFERENCE_VARIANT]);
        say(&run, "preparing %s weights of %s", VARIANTS[REFERENCE_VARIANT].label, effective.model_arg);
        status = model_source_open(&reference, &request, err);
        reference_open = status == 0;
    }
    for (int i = 0; status == 0 && i < BENCH_MAX_DECODE; i++) {
        status = bench_variant_sections(&run, &VARIANTS[i], &reference.model, &shape, err);
        char when[48];
        snprintf(when, sizeof when, "after %s", VARIANTS[i].label);
        if (status == 0) status = probe_machine(&run, pool, when, err);
    }
    if (reference_open) model_source_close(&reference);
    if (status == 0) status = bench_attention_section(&run, &shape, err);
    if (status == 0) status = bench_small_model_section(&run, err);
    // The last probe; every fraction is recomputed against the highest.
    if (status == 0) status = probe_machine(&run, pool, "after", err);
    thread_pool_free(pool);
    if (status == 0) status = bench_peer_section(&run, err);
    return status;
}
