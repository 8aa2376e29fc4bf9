#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/block_manager.h"
#include "engine/fault.h"
#include "engine/forward_cuda.h"
#include "engine/generate.h"
#include "engine/scheduler.h"
#include "engine/tokenizer.h"

engine_config engine_config_default(void) {
    return (engine_config){
        .layout = KV_LAYOUT_PAGED,
        .kv_dtype = KV_F16,
        .block_size = 16,
        .num_blocks = 0,
        .kv_mem_bytes = 64ull << 20,
        .reserve = RESERVE_MAX,
        .batching = BATCHING_CONTINUOUS,
        .max_seqs = 128,
        .max_batched_tokens = 512,
        .chunked_prefill = true,
        .prefix_caching = true,
        .watermark_blocks = -1, // -1: 1% of the pool, at least 1
        .n_threads = 0,
        .tp_shards = 1,
        .tp_link = LINK_NVLINK,
    };
}

static int ensure_step_capacity(engine* e, int n);

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int engine_init(engine* e, const model* m, const engine_config* config, error_info* err) {
    memset(e, 0, sizeof *e);
    e->model = m;
    e->config = *config;
    engine_config* c = &e->config;
    if (c->block_size < 1 || c->block_size > 256)
        return error_set(err, "--block-size: expected 1..256 tokens, found %d", c->block_size);
    if (c->max_seqs < 1) return error_set(err, "--max-seqs: expected at least 1, found %d", c->max_seqs);
    if (c->max_batched_tokens < 1)
        return error_set(err, "--max-batched-tokens: expected at least 1, found %d", c->max_batched_tokens);
    if (!c->chunked_prefill && c->max_batched_tokens < m->config.max_seq_len)
        c->max_batched_tokens = m->config.max_seq_len; // a whole prompt must fit one step
    uint64_t block_bytes = kv_memory_block_bytes(&m->config, c->kv_dtype, c->block_size);
    int n_blocks = c->num_blocks;
    if (n_blocks <= 0) {
        uint64_t blocks = c->kv_mem_bytes / block_bytes;
        if (blocks < 1)
            return error_set(err, "--kv-mem: %llu bytes hold no block of %llu bytes",
                             (unsigned long long)c->kv_mem_bytes, (unsigned long long)block_bytes);
        if (blocks > (1u << 30)) return error_set(err, "--kv-mem: %llu bytes is too large", (unsigned long long)c->kv_mem_bytes);
        n_blocks = (int)blocks;
    }
    // Refused before anything is allocated when it cannot fit: the pool is
    // mapped lazily, so an oversized one would otherwise be found out only
    // when the workload fills it (or the OOM killer does).
    char what[64];
    if (c->num_blocks > 0) snprintf(what, sizeof what, "--num-blocks %d", c->num_blocks);
    else snprintf(what, sizeof what, "--kv-mem");
    if (kv_memory_check_fits(what, (uint64_t)n_blocks * block_bytes, err)) return -1;
    c->num_blocks = n_blocks;
    if (c->watermark_blocks < 0) c->watermark_blocks = n_blocks / 100 > 1 ? n_blocks / 100 : 1;
    int64_t n_slots = (int64_t)n_blocks * c->block_size;
    if (c->layout == KV_LAYOUT_PAGED) {
        if (kv_pool_init(&e->pool, &m->config, c->kv_dtype, n_blocks, c->block_size, err)) return -1;
    } else {
        c->prefix_caching = false; // no sharing without blocks
        if (n_slots > (1 << 30)) return error_set(err, "--kv-mem: too many slots");
        if (kv_contiguous_init(&e->contiguous, &m->config, c->kv_dtype, (int)n_slots, err)) return -1;
    }
    int max_rows = c->max_batched_tokens + c->max_seqs;
    if (forward_state_init(&e->forward, &m->config, max_rows, m->config.max_seq_len, err)) {
        engine_free(e);
        return -1;
    }
    if (c->tp_shards < 1 || c->tp_shards > MAX_TP_SHARDS) {
        engine_free(e);
        return error_set(err, "--tp: expected 1..%d shards, found %d", MAX_TP_SHARDS, c->tp_shards);
    }
    int pool_status = thread_pool_create(c->n_threads, &e->workers);
    int n_threads = thread_pool_size(e->workers), threads_per_shard = n_threads / c->tp_shards;
    if (pool_status == 0 && c->tp_shards > 1 && n_threads > c->tp_shards) {
        // Sharded: the pool runs one task per shard; the rest of the threads
        // go to the shards' own pools (forward_state_set_tensor_parallel).
        thread_pool_free(e->workers);
        pool_status = thread_pool_create(c->tp_shards, &e->workers);
    }
    if (pool_status != 0) {
        engine_free(e);
        return error_set(err, "--threads %d: cannot start the worker threads (error %d)", c->n_threads, pool_status);
    }
    if (forward_state_set_pool(&e->forward, e->workers, err) ||
        forward_state_set_tensor_parallel(&e->forward, m, c->tp_shards,
                                          threads_per_shard > 1 ? threads_per_shard : 1, err)) {
        engine_free(e);
        return -1;
    }
    if (c->backend == BACKEND_CUDA && c->tp_shards > 1) {
        engine_free(e);
        return error_set(err, "--tp %d: tensor parallelism is simulated on the CPU backend only (drop --backend cuda)",
                         c->tp_shards);
    }
    if (c->backend == BACKEND_CUDA &&
        forward_cuda_init(&e->cuda, m, c->layout == KV_LAYOUT_PAGED ? &e->pool.memory : &e->contiguous.memory,
                          max_rows, err)) {
        engine_free(e);
        return -1;
    }
    e->rows = malloc((size_t)max_rows * sizeof *e->rows);
    e->mark = calloc((size_t)(c->layout == KV_LAYOUT_PAGED ? n_blocks : 1), sizeof *e->mark);
    if (!e->rows || !e->mark || ensure_step_capacity(e, 2 * c->max_seqs)) {
        engine_free(e);
        return error_set(err, "engine: out of memory");
    }
    return 0;
}

void engine_free(engine* e) {
    for (int i = 0; i < e->n_sequences; i++) sequence_free(&e->sequences[i]);
    free(e->sequences);
    free(e->waiting);
    free(e->running);
    free(e->live_ids);
    if (e->config.layout == KV_LAYOUT_PAGED) kv_pool_free(&e->pool);
    else kv_contiguous_free(&e->contiguous);
    forward_state_free(&e->forward);
    forward_cuda_free(e->cuda);
    thread_pool_free(e->workers);
    free(e->logits);
    free(e->rows);
    free(e->tables);
    free(e->plan_items);
    free(e->mark);
    step_record_free(&e->record);
    memset(e, 0, sizeof *e);
}

static sequence* new_sequence(engine* e, error_info* err) {
    if (e->n_sequences == e->sequences_capacity) {
        int capacity = e->sequences_capacity ? 2 * e->sequences_capacity : 64;
        sequence* grown = realloc(e->sequences, (size_t)capacity * sizeof *grown);
        int32_t* waiting = realloc(e->waiting, (size_t)capacity * sizeof *waiting);
        if (waiting) e->waiting = waiting;
        int32_t* running = realloc(e->running, (size_t)capacity * sizeof *running);
        if (running) e->running = running;
        int32_t* live = realloc(e->live_ids, (size_t)capacity * sizeof *live);
        if (live) e->live_ids = live;
        if (!grown || !waiting || !running || !live) {
            if (grown) e->sequences = grown;
            error_set(err, "engine: out of memory for %d sequences", capacity);
            return NULL;
        }
        e->sequences = grown;
        e->sequences_capacity = capacity;
    }
    return &e->sequences[e->n_sequences];
}

// The sequence new_sequence() handed out, initialised, takes its id.
static void commit_sequence(engine* e) {
    e->live_ids[e->n_live++] = e->n_sequences;
    e->n_sequences++;
}

int engine_add_request(engine* e, const request_params* p, int32_t* first_sequence_id, error_info* err) {
    const model_config* mc = &e->model->config;
    if (p->n_prompt < 1 || p->n_prompt >= mc->max_seq_len)
        return error_set(err, "request: prompt of %d tokens, expected 1..%d (the model's max length %d leaves room for one new token)",
                         p->n_prompt, mc->max_seq_len - 1, mc->max_seq_len);
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= mc->vocab_size)
            return error_set(err, "request: token %d at %d is outside the vocabulary 0..%d", p->prompt[i], i,
                             mc->vocab_size - 1);
    if (p->max_new_tokens < 1) return error_set(err, "request: max_tokens must be at least 1, found %d", p->max_new_tokens);
    if (p->n_samples < 1 || p->n_samples > e->config.max_seqs)
        return error_set(err, "request: n must be 1..%d (max-seqs), found %d", e->config.max_seqs, p->n_samples);
    int longest = p->n_prompt + p->max_new_tokens < mc->max_seq_len ? p->n_prompt + p->max_new_tokens : mc->max_seq_len;
    int64_t need = e->config.layout == KV_LAYOUT_PAGED
                       ? block_manager_blocks_for_length(e, longest)
                       : (e->config.reserve == RESERVE_MAX ? mc->max_seq_len : longest);
    int64_t have = e->config.layout == KV_LAYOUT_PAGED ? e->pool.n_blocks : e->contiguous.n_slots;
    if (need > have)
        return error_set(err, "request: needs %lld %s for %d tokens but the whole pool has %lld; it could never run",
                         (long long)need, e->config.layout == KV_LAYOUT_PAGED ? "blocks" : "slots", longest,
                         (long long)have);
    // Paged: one sequence now, the other samples fork off after its prefill.
    // Contiguous: no sharing, so every sample is its own sequence.
    int n_now = e->config.layout == KV_LAYOUT_PAGED ? 1 : p->n_samples;
    int32_t request_id = e->n_requests++;
    for (int k = 0; k < n_now; k++) {
        sequence* s = new_sequence(e, err);
        if (!s) return -1;
        if (sequence_init(s, e->n_sequences, request_id, p->prompt, p->n_prompt, p->max_new_tokens, mc->max_seq_len,
                          err))
            return -1;
        s->sample_index = k;
        s->seed = p->seed + (uint64_t)k;
        if (sampler_init(&s->sampler, mc->vocab_size, p->temperature, p->top_p, s->seed, err)) {
            sequence_free(s);
            return -1;
        }
        s->arrival_time = p->arrival_time > 0 ? p->arrival_time : e->clock_seconds;
        s->pending_forks = e->config.layout == KV_LAYOUT_PAGED ? p->n_samples - 1 : 0;
        s->ignore_eos = p->ignore_eos;
        s->state = SEQ_WAITING;
        if (k == 0 && first_sequence_id) *first_sequence_id = s->id;
        e->waiting[e->n_waiting++] = s->id;
        commit_sequence(e);
    }
    return 0;
}

int engine_cancel_sequence(engine* e, int32_t id, error_info* err) {
    if (id < 0 || id >= e->n_sequences) return error_set(err, "cancel: no sequence %d (0..%d)", id, e->n_sequences - 1);
    sequence* s = &e->sequences[id];
    if (s->state == SEQ_FINISHED) return 0;
    for (int i = 0; i < e->n_waiting; i++) {
        if (e->waiting[i] != id) continue;
        memmove(e->waiting + i, e->waiting + i + 1, (size_t)(e->n_waiting - i - 1) * sizeof *e->waiting);
        e->n_waiting--;
        break;
    }
    block_manager_release(e, s); // a waiting or preempted sequence holds nothing: no-op
    scheduler_remove_running(e, id);
    s->pending_forks = 0;
    s->state = SEQ_FINISHED;
    s->stop = STOP_CANCELLED;
    s->finish_time = e->clock_seconds;
    e->n_finished++;
    e->n_cancelled++;
    return 0;
}

// A released sequence is the only one without tokens: sequence_init always
// allocates at least one (the prompt has 1..max_seq_len - 1).
static bool is_released(const sequence* s) { return s->tokens == NULL; }

int engine_release_sequence(engine* e, int32_t id, error_info* err) {
    if (id < 0 || id >= e->n_sequences)
        return error_set(err, "release: no sequence %d (ids 0..%d)", id, e->n_sequences - 1);
    sequence* s = &e->sequences[id];
    if (is_released(s)) return error_set(err, "release: sequence %d was already released", id);
    if (s->state != SEQ_FINISHED)
        return error_set(err, "release: sequence %d is %s; only a finished or cancelled one can be released (cancel it first)",
                         id, sequence_state_name(s->state));
    // Finished sequences hold no blocks (finish() and cancel release them);
    // the table array itself is what is left to free.
    free(s->tokens);
    free(s->block_table);
    sampler_free(&s->sampler);
    s->tokens = NULL;
    s->block_table = NULL;
    // Zero counts, so that a reader walking e->sequences directly sees an
    // empty sequence rather than a count over a NULL array.
    s->n_tokens = s->n_prompt = s->n_computed = s->capacity = 0;
    s->n_table = s->table_capacity = 0;
    e->n_released++;
    for (int i = 0; i < e->n_live; i++) {
        if (e->live_ids[i] != id) continue;
        memmove(e->live_ids + i, e->live_ids + i + 1, (size_t)(e->n_live - i - 1) * sizeof *e->live_ids);
        e->n_live--;
        break;
    }
    return 0;
}

int engine_live_sequences(const engine* e) { return e->n_sequences - e->n_released; }

bool engine_has_work(const engine* e) { return e->n_waiting > 0 || e->n_running > 0; }

void engine_advance_clock(engine* e, double seconds) {
    if (seconds > 0) e->clock_seconds += seconds;
}

void engine_set_trace(engine* e, FILE* trace) { e->trace = trace; }

void engine_set_logits_observer(engine* e, logits_observer observer, void* user) {
    e->observer = observer;
    e->observer_user = user;
}

const sequence* engine_sequence(const engine* e, int32_t id) {
    return id >= 0 && id < e->n_sequences && !is_released(&e->sequences[id]) ? &e->sequences[id] : NULL;
}

int64_t engine_pool_slots(const engine* e) {
    return e->config.layout == KV_LAYOUT_PAGED ? (int64_t)e->pool.n_blocks * e->pool.block_size
                                               : e->contiguous.n_slots;
}

// ---- postprocess --------------------------------------------------------------------

static void finish(engine* e, sequence* s, stop_reason reason) {
    s->state = SEQ_FINISHED;
    s->stop = reason;
    s->finish_time = e->clock_seconds;
    block_manager_release(e, s);
    scheduler_remove_running(e, s->id);
    e->n_finished++;
    e->record.finished_ids[e->record.n_finished_now++] = s->id;
}

// Appends the sampled token, or finishes the sequence on EOS/BOS/length.
static void accept_token(engine* e, sequence* s, int32_t token) {
    if (s->first_token_time < 0) s->first_token_time = e->clock_seconds;
    stop_reason reason;
    if (!s->ignore_eos && generate_stops_at(e->model, token, &reason)) {
        finish(e, s, reason);
        return;
    }
    s->tokens[s->n_tokens++] = token;
    s->state = SEQ_DECODE;
    if (s->n_tokens - s->n_prompt >= s->max_new_tokens) finish(e, s, STOP_LENGTH);
    else if (s->n_tokens >= s->capacity) finish(e, s, STOP_CONTEXT);
}

// A new sequence continuing `parent_id`: the same request and tokens, its
// own sample index, seed and sampling settings. It holds no KV yet and is
// in no queue; the caller shares blocks or queues it.
static sequence* clone_sequence(engine* e, int32_t parent_id, int32_t sample_index, uint64_t seed,
                                float temperature, float top_p, error_info* err) {
    sequence* child = new_sequence(e, err);
    if (!child) return NULL;
    const sequence* parent = &e->sequences[parent_id]; // new_sequence may have moved the array
    if (sequence_init(child, e->n_sequences, parent->request_id, parent->tokens, parent->n_tokens,
                      parent->max_new_tokens, e->model->config.max_seq_len, err))
        return NULL;
    if (sequence_reserve_table(child, parent->n_table)) {
        sequence_free(child);
        error_set(err, "engine: out of memory for a block table");
        return NULL;
    }
    child->n_prompt = parent->n_prompt;
    child->sample_index = sample_index;
    child->seed = seed;
    child->fork_parent = parent->id;
    child->ignore_eos = parent->ignore_eos;
    child->arrival_time = parent->arrival_time;
    if (sampler_init(&child->sampler, e->model->config.vocab_size, temperature, top_p, seed, err)) {
        sequence_free(child);
        return NULL;
    }
    commit_sequence(e);
    return child;
}

// The child shares every block the parent holds and runs from the next step.
static void share_running(engine* e, int32_t parent_id, sequence* child) {
    const sequence* parent = &e->sequences[parent_id];
    child->n_computed = parent->n_computed;
    child->state = parent->state;
    child->admit_order = ++e->admit_counter;
    block_manager_fork(e, parent, child);
    e->running[e->n_running++] = child->id;
}

// The other samples of a request start as copies of sample 0 right after
// its prompt is computed, sharing every block; each then samples its own
// first token from the same logits.
static int fork_samples(engine* e, int32_t parent_id, const float* logits, error_info* err) {
    const int vocab = e->model->config.vocab_size;
    float* row = malloc((size_t)vocab * sizeof *row); // sampler scratch: it overwrites logits
    if (!row) return error_set(err, "engine: out of memory");
    int n_forks = e->sequences[parent_id].pending_forks;
    e->sequences[parent_id].pending_forks = 0;
    for (int k = 1; k <= n_forks; k++) {
        const sampler* ps = &e->sequences[parent_id].sampler;
        sequence* child = clone_sequence(e, parent_id, k, e->sequences[parent_id].seed + (uint64_t)k, ps->temperature,
                                         ps->top_p, err);
        if (!child) {
            free(row);
            return -1;
        }
        share_running(e, parent_id, child);
        memcpy(row, logits, (size_t)vocab * sizeof *row);
        accept_token(e, child, sampler_sample(&child->sampler, row));
    }
    free(row);
    return 0;
}

int engine_fork_sequence(engine* e, int32_t id, float temperature, uint64_t seed, int32_t* child_id,
                         error_info* err) {
    if (id < 0 || id >= e->n_sequences) return error_set(err, "fork: no sequence %d (0..%d)", id, e->n_sequences - 1);
    const sequence* parent = &e->sequences[id];
    if (parent->state == SEQ_FINISHED) return error_set(err, "fork: sequence %d has finished", id);
    if (parent->pending_forks > 0)
        return error_set(err, "fork: sequence %d is still computing its prompt for its own samples", id);
    int32_t sample_index = 0; // one past the request's highest, so (request, sample) stays unique
    for (int i = 0; i < e->n_sequences; i++)
        if (e->sequences[i].request_id == parent->request_id && e->sequences[i].sample_index >= sample_index)
            sample_index = e->sequences[i].sample_index + 1;
    bool holds_kv = parent->state == SEQ_PREFILL || parent->state == SEQ_DECODE;
    sequence* child = clone_sequence(e, id, sample_index, seed, temperature, parent->sampler.top_p, err);
    if (!child) return -1;
    if (holds_kv && e->config.layout == KV_LAYOUT_PAGED) share_running(e, id, child);
    else { // nothing to share (contiguous memory is private, or the parent holds none): compute it again
        child->state = SEQ_WAITING;
        e->waiting[e->n_waiting++] = child->id;
    }
    if (child_id) *child_id = child->id;
    return 0;
}

// Grows the per-step arrays to hold n sequences.
static int ensure_step_capacity(engine* e, int n) {
    if (n <= e->step_capacity) return 0;
    const int32_t** tables = realloc(e->tables, (size_t)n * sizeof *tables);
    if (tables) e->tables = tables;
    scheduled_sequence* plan_items = realloc(e->plan_items, (size_t)n * sizeof *plan_items);
    if (plan_items) e->plan_items = plan_items;
    float* logits = realloc(e->logits, (size_t)n * (size_t)e->model->config.vocab_size * sizeof *logits);
    if (logits) e->logits = logits;
    if (!tables || !plan_items || !logits || step_record_reserve(&e->record, n, 0)) return -1;
    e->step_capacity = n;
    return 0;
}

// Each shard's traffic and the all-reduces of the forward pass just run.
static void record_tensor_parallel(const engine* e, step_record* r) {
    const forward_state* f = &e->forward;
    for (int k = 0; k < f->n_shards; k++) r->shard_traffic[k] = f->shards[k].traffic;
    r->n_allreduces = f->n_allreduces;
    r->allreduce_bytes = f->allreduce_bytes;
    r->allreduce_seconds =
        link_allreduce_seconds(link_model_get(e->config.tp_link), f->n_allreduces, f->allreduce_bytes);
}

// The unbatched-decode fault (engine/fault.h): the step's batch is run one
// row per forward() call, the bug of an engine whose "batch" is a loop over
// tokens (llama2.c's run.c feeds even a prompt one token at a time). Each
// call streams every weight matrix again, so a step of n rows reads n times
// the weights of the batched call (the kernels count one operand per call),
// and a prompt's tokens no longer share a weight read. Rows run in batch
// order, so every earlier position of a sequence is cached before a row
// attends to it, and the logits come out in the batched call's order.
// CPU backend only: --backend cuda runs its batch whole under every fault.
static int forward_row_by_row(engine* e, kv_memory* memory, const forward_batch* batch, step_record* r,
                              error_info* err) {
    forward_state* f = &e->forward;
    const size_t vocab = (size_t)e->model->config.vocab_size;
    kernel_traffic shard_traffic[MAX_TP_SHARDS]; // (n_shards) summed over the calls
    memset(shard_traffic, 0, sizeof shard_traffic);
    uint64_t allreduce_bytes = 0;
    int n_allreduces = 0, n_logit_rows = 0;
    for (int row = 0; row < batch->n_rows; row++) {
        batch_row alone_row = e->rows[row];
        alone_row.sequence = 0; // the only sequence of its call
        forward_batch alone = {1, &alone_row, 1, batch->block_tables + e->rows[row].sequence};
        if (forward(e->model, f, memory, &alone, e->logits + (size_t)n_logit_rows * vocab, &r->traffic, err)) return -1;
        n_logit_rows += alone_row.wants_logits;
        for (int k = 0; k < f->n_shards; k++) traffic_add(&shard_traffic[k], &f->shards[k].traffic);
        allreduce_bytes += f->allreduce_bytes;
        n_allreduces += f->n_allreduces;
    }
    for (int k = 0; k < f->n_shards; k++) f->shards[k].traffic = shard_traffic[k];
    f->allreduce_bytes = allreduce_bytes;
    f->n_allreduces = n_allreduces;
    return 0;
}

// ---- one step ------------------------------------------------------------------------------

int engine_step(engine* e, const step_record** record_out, error_info* err) {
    uint64_t start = now_ns();
    step_record* r = &e->record;
    step_record_clear(r);
    r->step = ++e->step_counter;
    if (e->config.layout == KV_LAYOUT_PAGED) kv_pool_clear_events(&e->pool);
    // Room for every sequence that could finish this step: those running or
    // admitted now (at most n_running + n_waiting) and the forks they spawn.
    // Bounded by the live queues, not by n_sequences, which counts every id
    // ever handed out and would grow this array 4 bytes per request forever.
    int finished_needed = e->n_running + e->n_waiting + 1;
    for (int i = 0; i < e->n_running; i++) finished_needed += e->sequences[e->running[i]].pending_forks;
    for (int i = 0; i < e->n_waiting; i++) finished_needed += e->sequences[e->waiting[i]].pending_forks;
    if (step_record_reserve(r, 0, finished_needed)) return error_set(err, "engine: out of memory");
    uint64_t preemptions_before = e->total_preemptions;

    // A step runs at most every running sequence plus the newly admitted
    // ones (forks can push running past max_seqs).
    int max_items = e->n_running + e->config.max_seqs;
    if (ensure_step_capacity(e, max_items)) return error_set(err, "engine: out of memory");
    schedule_result plan = {e->plan_items, 0, 0, 0};
    if (scheduler_schedule(e, &plan, err)) return -1;

    // ---- run: one forward pass over every scheduled row
    int n_rows = 0;
    for (int i = 0; i < plan.n_items; i++) {
        sequence* s = &e->sequences[plan.items[i].id];
        e->tables[i] = s->block_table;
        for (int t = 0; t < plan.items[i].n_tokens; t++) {
            int position = s->n_computed + t;
            bool last = position == s->n_tokens - 1;
            e->rows[n_rows++] = (batch_row){s->tokens[position], position, i, last};
        }
        if (plan.items[i].phase == PHASE_PREFILL) r->prefill_tokens += plan.items[i].n_tokens;
        else r->decode_tokens += plan.items[i].n_tokens;
    }
    if (n_rows > 0) {
        kv_memory* memory = e->config.layout == KV_LAYOUT_PAGED ? &e->pool.memory : &e->contiguous.memory;
        forward_batch batch = {n_rows, e->rows, plan.n_items, e->tables};
        // --backend cuda: the same batch on the GPU, after this step's copy-on-write copies.
        if (e->cuda) {
            const bool paged = e->config.layout == KV_LAYOUT_PAGED;
            if (forward_cuda_run(e->cuda, e->model, &batch, paged ? e->pool.events : NULL, paged ? e->pool.n_events : 0,
                                 e->logits, &r->traffic, &r->device_ns, err))
                return -1;
        } else {
            if (fault_on(FAULT_UNBATCHED_DECODE)) {
                if (forward_row_by_row(e, memory, &batch, r, err)) return -1;
            } else if (forward(e->model, &e->forward, memory, &batch, e->logits, &r->traffic, err)) {
                return -1;
            }
            record_tensor_parallel(e, r);
        }
    }

    // ---- postprocess: advance, sample, fork, retire
    uint64_t forward_end = now_ns();
    e->clock_seconds += (double)(forward_end - start) * 1e-9;
    int logit_row = 0;
    const int vocab = e->model->config.vocab_size;
    for (int i = 0; i < plan.n_items; i++) {
        int32_t id = plan.items[i].id;
        sequence* s = &e->sequences[id];
        int from = s->n_computed;
        s->n_computed += plan.items[i].n_tokens;
        block_manager_after_compute(e, s, from, s->n_computed);
        if (s->n_computed < s->n_tokens) continue; // more prompt to go
        float* logits = e->logits + (size_t)(logit_row++) * (size_t)vocab;
        if (e->observer) e->observer(e->observer_user, id, s->n_tokens - 1, logits, vocab);
        if (s->pending_forks > 0 && fork_samples(e, id, logits, err)) return -1;
        s = &e->sequences[id]; // forking may have moved the array
        accept_token(e, s, sampler_sample(&s->sampler, logits));
    }

    // ---- record
    e->total_prefix_hit_tokens += (uint64_t)plan.prefix_hit_tokens;
    r->n_preempted = (int)(e->total_preemptions - preemptions_before);
    if (step_record_fill(r, e, &plan)) return error_set(err, "engine: out of memory");
    uint64_t end = now_ns();
    e->clock_seconds += (double)(end - forward_end) * 1e-9;
    r->wall_ns = end - start;
    r->clock_seconds = e->clock_seconds;
    if (e->trace) step_record_write_json(r, e->trace);
    *record_out = r;
    return 0;
}
