#include "lab/ui/dashboard.h"

#include <float.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "lab/common/engine_options.h"
#include "kernels/cpu/machine_probe.h"
#include "kernels/cpu/matmul.h"

const char* const STEP_SIZE_TENSORS[7] = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"};

static int start_engines(dashboard* d, error_info* err) {
    engine_config paged = d->config, contiguous = d->config;
    paged.layout = KV_LAYOUT_PAGED;
    contiguous.layout = KV_LAYOUT_CONTIGUOUS;
    if (engine_init(&d->paged, &d->source.model, &paged, err)) return -1;
    if (engine_init(&d->contiguous, &d->source.model, &contiguous, err)) {
        engine_free(&d->paged);
        return -1;
    }
    d->have_engines = true;
    d->paged_record = d->contiguous_record = NULL;
    d->history.start = d->history.count = 0;
    d->steps = 0;
    d->step_seconds_total = 0;
    d->selected = 0;
    return 0;
}

static void stop_engines(dashboard* d) {
    if (!d->have_engines) return;
    engine_free(&d->paged);
    engine_free(&d->contiguous);
    d->have_engines = false;
    d->paged_record = d->contiguous_record = NULL;
}

int dashboard_init(dashboard* d, const model_request* request, const engine_config* config, kv_layout primary,
                   error_info* err) {
    memset(d, 0, sizeof *d);
    d->config = *config;
    d->primary = primary;
    if (model_source_open(&d->source, request, err)) return -1;
    if (engine_options_open_draft(&d->config, request, &d->draft, err)) {
        model_source_close(&d->source);
        return -1;
    }
    if (start_engines(d, err)) {
        model_source_close(&d->draft);
        model_source_close(&d->source);
        return -1;
    }
    // The engine resolved the pool (--num-blocks, or what --kv-mem holds):
    // its slots are what every later block size shares out.
    d->kv_slots = engine_pool_slots(&d->paged);
    // The step-size pane starts on layers.0.wq, 4-bit asymmetric per tensor:
    // few enough levels (16) to see each one over the histogram.
    d->step_size.scheme = (quant_scheme){4, false, QUANT_PER_TENSOR, 32, false};
    dashboard_update_step_size(d);
    return 0;
}

static void release_machine(machine_figures* m) {
    if (m && atomic_fetch_sub(&m->owners, 1) == 1) free(m);
}

// Three repeats: a median that ignores one disturbed run, in about a
// second on an idle machine.
static void* measure_machine(void* arg) {
    machine_figures* m = arg;
    thread_pool* pool = NULL;
    if (thread_pool_create(m->n_threads, &pool) != 0) pool = NULL;
    // 512 MiB: 16x the 32 MiB L3 of the machines the lab targets, enough that
    // the cache hardly helps, and small enough to measure in the background
    // of an interactive tool (the bench uses 8x whatever L3 the OS reports).
    m->bandwidth_gb_s = machine_stream_read_gb_s(pool, (size_t)512 << 20, 3);
    m->peak_gflop_s = machine_peak_fma_gflop_s(pool, 3);
    thread_pool_free(pool);
    atomic_store_explicit(&m->measured, true, memory_order_release);
    release_machine(m);
    return NULL;
}

void dashboard_measure_machine(dashboard* d, bool in_background) {
    if (d->machine) return;
    machine_figures* m = calloc(1, sizeof *m);
    if (!m) return; // the pane then says the machine was not measured
    atomic_init(&m->owners, 2);
    atomic_init(&m->measured, false);
    m->n_threads = d->config.n_threads > 0 ? d->config.n_threads : 0;
    d->machine = m;
    pthread_attr_t attributes;
    pthread_t thread;
    bool started = false;
    if (in_background && pthread_attr_init(&attributes) == 0) {
        pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
        started = pthread_create(&thread, &attributes, measure_machine, m) == 0;
        pthread_attr_destroy(&attributes);
    }
    if (!started) measure_machine(m);
}

bool dashboard_machine_figures(const dashboard* d, double* gb_s, double* gflop_s) {
    if (!d->machine || !atomic_load_explicit(&d->machine->measured, memory_order_acquire)) return false;
    *gb_s = d->machine->bandwidth_gb_s;
    *gflop_s = d->machine->peak_gflop_s;
    return *gb_s > 0 && *gflop_s > 0;
}

void dashboard_free(dashboard* d) {
    release_machine(d->machine);
    stop_engines(d);
    for (int i = 0; i < d->n_requests; i++)
        free(d->requests[i].prompt);
    free(d->requests);
    free(d->step_size.weights);
    free(d->step_size.codes);
    free(d->step_size.params);
    model_source_close(&d->draft);
    model_source_close(&d->source);
    memset(d, 0, sizeof *d);
}

const engine* dashboard_view_engine(const dashboard* d, kv_layout layout) {
    if (d->lesson_engine) return d->lesson_engine->config.layout == layout ? d->lesson_engine : NULL;
    return layout == KV_LAYOUT_PAGED ? &d->paged : &d->contiguous;
}

const step_record* dashboard_view_record(const dashboard* d, kv_layout layout) {
    if (d->lesson_engine) {
        const engine* e = dashboard_view_engine(d, layout);
        return e && e->record.step > 0 ? &e->record : NULL;
    }
    return layout == KV_LAYOUT_PAGED ? d->paged_record : d->contiguous_record;
}

const engine* dashboard_primary(const dashboard* d) {
    return d->lesson_engine ? d->lesson_engine : dashboard_view_engine(d, d->primary);
}

const step_record* dashboard_primary_record(const dashboard* d) {
    return dashboard_view_record(d, d->lesson_engine ? d->lesson_engine->config.layout : d->primary);
}

static void remember(step_history* h, const step_record* r);

void dashboard_follow_engine(dashboard* d, const engine* e) {
    if (e != d->lesson_engine) {
        d->history.start = d->history.count = 0; // another engine: its own history
        d->lesson_engine_step = 0;
        d->selected = 0;
    }
    d->lesson_engine = e;
    if (e && e->record.step > d->lesson_engine_step) {
        remember(&d->history, &e->record);
        d->lesson_engine_step = e->record.step;
    }
}

void dashboard_lesson_log(dashboard* d, lesson_log_kind kind, const char* text) {
    lesson_log* log = &d->lesson;
    int slot = (log->start + log->count) % LESSON_LOG_LINES;
    if (log->count == LESSON_LOG_LINES)
        log->start = (log->start + 1) % LESSON_LOG_LINES;
    else
        log->count++;
    snprintf(log->lines[slot], sizeof log->lines[slot], "%s", text);
    log->kinds[slot] = kind;
    log->appended++;
}

static int find_mirror(const dashboard* d, const step_sequence_status* s, int32_t* twin, error_info* err);

// Puts a request (or a fork) into both engines; q->sequence gets the paged id.
static int submit(dashboard* d, saved_request* q, error_info* err) {
    if (q->fork_of >= 0) {
        step_sequence_status parent;
        if (!engine_sequence_status(&d->paged, q->fork_of, &parent))
            return error_set(err, "replay: fork of sequence %d, which is not there", q->fork_of);
        int32_t twin = -1, twin_child = -1;
        if (find_mirror(d, &parent, &twin, err)) return -1;
        if (engine_fork_sequence(&d->paged, q->fork_of, q->temperature, q->seed, &q->sequence, err)) return -1;
        if (twin >= 0 && engine_fork_sequence(&d->contiguous, twin, q->temperature, q->seed, &twin_child, err))
            return -1;
        return 0;
    }
    request_params p = {q->prompt, q->n_prompt, q->max_new_tokens, q->n_samples, q->temperature, 0.9f, q->seed,
                        0.0,       false};
    int32_t first;
    if (engine_add_request(&d->paged, &p, &q->sequence, err)) return -1;
    return engine_add_request(&d->contiguous, &p, &first, err);
}

static int remember_request(dashboard* d, const saved_request* q, const int32_t* prompt, error_info* err);

static int add_ids(dashboard* d, int32_t* ids, int n, int max_new_tokens, int n_samples, float temperature,
                   error_info* err) {
    saved_request q = {ids, n, max_new_tokens, n_samples, temperature, (uint64_t)d->n_requests + 1, -1, -1, false};
    if (submit(d, &q, err)) return -1;
    return remember_request(d, &q, ids, err);
}

int dashboard_add_prompt(dashboard* d, const char* text, int max_new_tokens, int n_samples, float temperature,
                         error_info* err) {
    int capacity = (int)strlen(text) + 8, n = 0;
    int32_t* ids = malloc((size_t)capacity * sizeof *ids); // (capacity) token ids
    if (!ids) return error_set(err, "lab: out of memory");
    const tokenizer* t = d->source.tokenizer;
    int status = 0;
    if (t)
        status = tok_encode(t, text, true, false, ids, capacity, &n, err);
    else { // no tokenizer: BOS then one id per byte, folded into the vocabulary
        ids[n++] = TOK_BOS_ID;
        for (const unsigned char* c = (const unsigned char*)text; *c; c++)
            ids[n++] = (int32_t)((*c + TOK_BYTE_OFFSET) % d->source.model.config.vocab_size);
    }
    if (status == 0) status = add_ids(d, ids, n, max_new_tokens, n_samples, temperature, err);
    free(ids);
    return status;
}

bool dashboard_has_work(const dashboard* d) { return engine_has_work(&d->paged) || engine_has_work(&d->contiguous); }

static void remember(step_history* h, const step_record* r) {
    const kernel_traffic* t = &r->traffic;
    int slot = (h->start + h->count) % HISTORY_STEPS;
    if (h->count == HISTORY_STEPS)
        h->start = (h->start + 1) % HISTORY_STEPS;
    else
        h->count++;
    h->bytes[slot] = t->weight_bytes_read + t->kv_bytes_read + t->kv_bytes_written + t->activation_bytes;
    h->tokens[slot] = r->prefill_tokens + r->decode_tokens;
    h->prefill[slot] = r->prefill_tokens > 0;
}

int dashboard_step(dashboard* d, error_info* err) {
    bool stepped = false;
    if (engine_has_work(&d->paged)) {
        if (engine_step(&d->paged, &d->paged_record, err)) return -1;
        d->step_seconds_total += (double)d->paged_record->wall_ns * 1e-9;
        stepped = true;
    } else
        d->paged_record = NULL;
    if (engine_has_work(&d->contiguous)) {
        if (engine_step(&d->contiguous, &d->contiguous_record, err)) return -1;
        d->step_seconds_total += (double)d->contiguous_record->wall_ns * 1e-9;
        stepped = true;
    } else
        d->contiguous_record = NULL;
    const step_record* r = dashboard_primary_record(d);
    if (r) remember(&d->history, r);
    if (stepped) d->steps++;
    return 0;
}

// The contiguous engine's sequence that mirrors paged sequence `s` (same
// request, same sample) into *twin, or -1 there when it has none (a fork
// the contiguous engine could not make). -1 when out of memory.
static int find_mirror(const dashboard* d, const step_sequence_status* s, int32_t* twin, error_info* err) {
    step_record contiguous = {0};
    int status = engine_snapshot(&d->contiguous, &contiguous) ? error_set(err, "lab: out of memory") : 0;
    *twin = -1;
    for (int i = 0; i < contiguous.n_live_sequences && *twin < 0; i++) {
        const step_sequence_status* c = &contiguous.live_sequences[i];
        if (c->request_id == s->request_id && c->sample_index == s->sample_index) *twin = c->id;
    }
    step_record_free(&contiguous);
    return status;
}

int dashboard_cancel_selected(dashboard* d, error_info* err) {
    step_sequence_status s;
    if (!engine_sequence_status(&d->paged, d->selected, &s) || s.state == SEQ_FINISHED) return 0;
    int32_t twin = -1;
    if (find_mirror(d, &s, &twin, err)) return -1;
    if (engine_cancel_sequence(&d->paged, s.id, err)) return -1;
    if (twin >= 0 && engine_cancel_sequence(&d->contiguous, twin, err)) return -1;
    for (int i = 0; i < d->n_requests; i++) // remembered for a replay (n_samples is 1 in the lab)
        if (d->requests[i].sequence == s.id) d->requests[i].cancelled = true;
    return 0;
}

// Appends a request to the replay list without submitting it (a fork: it
// exists in the engines already and is replayed as its own request after a
// restart, recomputing what it shared). The list keeps its own copy of
// `prompt` (q->n_prompt ids; q->prompt is not read).
static int remember_request(dashboard* d, const saved_request* q, const int32_t* prompt, error_info* err) {
    if (d->n_requests == d->requests_capacity) {
        int capacity = d->requests_capacity ? 2 * d->requests_capacity : 16;
        saved_request* grown = realloc(d->requests, (size_t)capacity * sizeof *grown);
        if (!grown) return error_set(err, "lab: out of memory");
        d->requests = grown;
        d->requests_capacity = capacity;
    }
    saved_request copy = *q;
    copy.prompt = malloc((size_t)q->n_prompt * sizeof *copy.prompt);
    if (!copy.prompt) return error_set(err, "lab: out of memory");
    memcpy(copy.prompt, prompt, (size_t)q->n_prompt * sizeof *copy.prompt);
    d->requests[d->n_requests++] = copy;
    return 0;
}

int dashboard_fork_selected(dashboard* d, error_info* err) {
    step_sequence_status s;
    if (!engine_sequence_status(&d->paged, d->selected, &s) || s.state == SEQ_FINISHED)
        return error_set(err, "fork: select a request that is still running");
    if (s.n_tokens >= d->source.model.config.max_seq_len - 1)
        return error_set(err, "fork: the sequence is at the model's max length");
    // Sampled at temperature 0.8 so that the child diverges from its parent.
    const float temperature = 0.8f;
    step_record paged = {0}; // the seed follows the ids handed out so far
    int status = engine_snapshot(&d->paged, &paged);
    uint64_t seed = 1000u + (uint64_t)paged.n_sequence_ids;
    step_record_free(&paged);
    if (status) return error_set(err, "lab: out of memory");
    int32_t twin = -1, child = -1, twin_child = -1, parent = s.id;
    if (find_mirror(d, &s, &twin, err)) return -1;
    if (engine_fork_sequence(&d->paged, parent, temperature, seed, &child, err)) return -1;
    if (twin >= 0 && engine_fork_sequence(&d->contiguous, twin, temperature, seed, &twin_child, err)) return -1;
    // Replayed as a fork of the same parent (its prompt is kept for the record).
    engine_sequence_status(&d->paged, parent, &s); // the fork may have moved the engine's sequences
    saved_request replay = {NULL, s.n_tokens, s.max_new_tokens, 1, temperature, seed, parent, child, false};
    if (remember_request(d, &replay, s.tokens, err)) return -1;
    d->selected = child;
    return 0;
}

int dashboard_add_shared_prompt(dashboard* d, error_info* err) {
    // Different questions after one system prompt: the prompts share the
    // system prompt's full blocks through the prefix cache.
    static const char* const FOLLOW_UPS[] = {" One day,",     " She liked to", " Her friend said",
                                             " Then the dog", " At night,",    " The sun was"};
    const int n_follow_ups = (int)(sizeof FOLLOW_UPS / sizeof FOLLOW_UPS[0]);
    char text[sizeof d->system_prompt + 32];
    snprintf(text, sizeof text, "%s%s", d->system_prompt, FOLLOW_UPS[d->n_shared_prompts % n_follow_ups]);
    if (dashboard_add_prompt(d, text, d->max_new_tokens, 1, 0.0f, err)) return -1;
    d->n_shared_prompts++;
    return 0;
}

int dashboard_blocks_for(const dashboard* d, int block_size) {
    int64_t blocks = block_size > 0 ? d->kv_slots / block_size : 0;
    return blocks > (1 << 30) ? 1 << 30 : (int)blocks;
}

int dashboard_set_block_size(dashboard* d, int block_size, error_info* err) {
    int n_blocks = dashboard_blocks_for(d, block_size);
    if (n_blocks < 1)
        return error_set(err, "block size %d: the pool's %lld slots of KV memory hold no block of that size",
                         block_size, (long long)d->kv_slots);
    engine_config saved = d->config;
    stop_engines(d);
    d->config.block_size = block_size;
    d->config.num_blocks = n_blocks; // the same bytes, not the same count
    if (start_engines(d, err)) {
        d->config = saved;
        if (start_engines(d, err)) return -1;
    }
    // Everything in the order it was made (so the ids come back the same),
    // then the cancellations: a fork's parent may have been cancelled after it.
    for (int i = 0; i < d->n_requests; i++)
        if (submit(d, &d->requests[i], err)) return -1;
    for (int i = 0; i < d->n_requests; i++) {
        step_sequence_status s;
        if (!d->requests[i].cancelled || !engine_sequence_status(&d->paged, d->requests[i].sequence, &s)) continue;
        int32_t twin = -1;
        if (find_mirror(d, &s, &twin, err)) return -1;
        if (engine_cancel_sequence(&d->paged, s.id, err)) return -1;
        if (twin >= 0 && engine_cancel_sequence(&d->contiguous, twin, err)) return -1;
    }
    return 0;
}

void dashboard_update_step_size(dashboard* d) {
    step_size_view* v = &d->step_size;
    const model* m = &d->source.model;
    if (v->layer < 0) v->layer = m->config.n_layers - 1;
    if (v->layer >= m->config.n_layers) v->layer = 0;
    if (v->tensor < 0) v->tensor = 6;
    if (v->tensor > 6) v->tensor = 0;
    snprintf(v->name, sizeof v->name, "layers.%d.%s", v->layer, STEP_SIZE_TENSORS[v->tensor]);
    v->error[0] = '\0';
    const weight_matrix* w = model_matrix_by_name(m, v->name);
    free(v->weights);
    free(v->codes);
    free(v->params);
    v->weights = NULL;
    v->codes = NULL;
    v->params = NULL;
    v->n_params = 0;
    if (!w) {
        snprintf(v->error, sizeof v->error, "%s: not in this model", v->name);
        return;
    }
    v->rows = w->rows;
    v->cols = w->cols;
    error_info err = {{0}};
    if (quant_scheme_validate(&v->scheme, w->cols, &err)) {
        snprintf(v->error, sizeof v->error, "%s", err.message);
        return;
    }
    size_t count = (size_t)w->rows * (size_t)w->cols;
    v->n_params = quant_param_count(w->rows, w->cols, &v->scheme);
    v->weights = malloc(count * sizeof *v->weights);
    v->codes = malloc(count * sizeof *v->codes);
    v->params = malloc((size_t)v->n_params * sizeof *v->params);
    if (!v->weights || !v->codes || !v->params) {
        snprintf(v->error, sizeof v->error, "out of memory");
        v->n_params = 0;
        return;
    }
    for (int r = 0; r < w->rows; r++)
        weight_row_to_f32(v->weights + (size_t)r * (size_t)w->cols, w, r, NULL);
    if (quant_matrix_rtn(v->weights, w->rows, w->cols, &v->scheme, v->codes, v->params, &err)) {
        snprintf(v->error, sizeof v->error, "%s", err.message);
        v->n_params = 0;
        return;
    }
    if (v->set_index >= v->n_params) v->set_index = 0;
    if (v->set_index < 0) v->set_index = v->n_params - 1;
    v->set_stats = quant_matrix_stats(v->weights, v->codes, v->params, w->rows, w->cols, &v->scheme, v->set_index);
    v->matrix_stats = quant_matrix_stats(v->weights, v->codes, v->params, w->rows, w->cols, &v->scheme, -1);
    v->set_min = FLT_MAX;
    v->set_max = -FLT_MAX;
    for (int r = 0; r < w->rows; r++)
        for (int c = 0; c < w->cols; c++) {
            if (quant_param_index(r, c, w->rows, w->cols, &v->scheme) != v->set_index) continue;
            float x = v->weights[(size_t)r * (size_t)w->cols + (size_t)c];
            if (x < v->set_min) v->set_min = x;
            if (x > v->set_max) v->set_max = x;
        }
}
