#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/block_manager.h"
#include "engine/fault.h"
#include "engine/forward_cuda.h"
#include "engine/stop_rule.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"

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
        .speculative = {.kind = SPEC_NONE, .k = SPEC_DEFAULT_K},
    };
}


static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// Room for n rows of logits.
static int ensure_logits(engine* e, int n) {
    if (n <= e->logits_rows) return 0;
    float* logits = realloc(e->logits, (size_t)n * (size_t)e->model->config.vocab_size * sizeof *logits);
    if (!logits) return -1;
    e->logits = logits;
    e->logits_rows = n;
    return 0;
}

// --block-size, --max-seqs and --max-batched-tokens.
static int check_batch_limits(engine_config* c, const model_config* mc, error_info* err) {
    if (c->block_size < 1 || c->block_size > 256)
        return error_set(err, "--block-size: expected 1..256 tokens, found %d", c->block_size);
    if (c->max_seqs < 1) return error_set(err, "--max-seqs: expected at least 1, found %d", c->max_seqs);
    if (c->max_batched_tokens < 1)
        return error_set(err, "--max-batched-tokens: expected at least 1, found %d", c->max_batched_tokens);
    if (!c->chunked_prefill && c->max_batched_tokens < mc->max_seq_len)
        c->max_batched_tokens = mc->max_seq_len; // a whole prompt must fit one step
    return 0;
}

// c->num_blocks: --num-blocks, or as many blocks as --kv-mem holds; and the
// watermark, 1% of them (at least 1) unless set.
static int size_kv_pool(engine_config* c, const model_config* mc, error_info* err) {
    uint64_t block_bytes = kv_memory_block_bytes(mc, c->kv_dtype, c->block_size);
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
    return 0;
}

// The KV memory in the configured layout, and the block manager that hands it out.
static int init_kv_memory(engine* e, block_manager* kv, error_info* err) {
    engine_config* c = &e->config;
    const model_config* mc = &e->model->config;
    if (c->layout == KV_LAYOUT_PAGED) {
        if (kv_pool_init(&e->pool, mc, c->kv_dtype, c->num_blocks, c->block_size, err)) return -1;
        if (block_manager_init_paged(kv, &e->pool, c->prefix_caching, err)) {
            engine_free(e);
            return -1;
        }
        return 0;
    }
    c->prefix_caching = false; // no sharing without blocks
    int64_t n_slots = (int64_t)c->num_blocks * c->block_size;
    if (n_slots > (1 << 30)) return error_set(err, "--kv-mem: too many slots");
    if (kv_contiguous_init(&e->contiguous, mc, c->kv_dtype, (int)n_slots, err)) return -1;
    block_manager_init_contiguous(kv, &e->contiguous, c->reserve, mc->max_seq_len, err);
    return 0;
}

static void init_scheduler(engine* e, const block_manager* kv, error_info* err) {
    const engine_config* c = &e->config;
    scheduler_config policy = {.batching = c->batching,
                               .max_seqs = c->max_seqs,
                               .max_batched_tokens = c->max_batched_tokens,
                               .chunked_prefill = c->chunked_prefill,
                               .watermark_blocks = c->watermark_blocks,
                               .max_seq_len = e->model->config.max_seq_len};
    scheduler_init(&e->scheduler, &policy, kv, err);
}

// The worker threads and the tensor-parallel shards they run. On failure the engine is freed.
static int start_workers(engine* e, error_info* err) {
    engine_config* c = &e->config;
    if (c->tp_shards < 1 || c->tp_shards > MAX_TP_SHARDS) {
        error_set(err, "--tp: expected 1..%d shards, found %d", MAX_TP_SHARDS, c->tp_shards); // before the free zeroes c
        engine_free(e);
        return -1;
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
        error_set(err, "--threads %d: cannot start the worker threads (error %d)", c->n_threads, pool_status);
        engine_free(e);
        return -1;
    }
    if (forward_state_set_pool(&e->forward, e->workers, err) ||
        forward_state_set_tensor_parallel(&e->forward, e->model, c->tp_shards,
                                          threads_per_shard > 1 ? threads_per_shard : 1, err)) {
        engine_free(e);
        return -1;
    }
    return 0;
}

// The CUDA backend, when asked for. On failure the engine is freed.
static int start_cuda(engine* e, int max_rows, error_info* err) {
    engine_config* c = &e->config;
    if (c->backend == BACKEND_CUDA && c->tp_shards > 1) {
        error_set(err, "--tp %d: tensor parallelism is simulated on the CPU backend only (drop --backend cuda)",
                  c->tp_shards);
        engine_free(e);
        return -1;
    }
    if (c->backend == BACKEND_CUDA &&
        forward_cuda_init(&e->cuda, e->model, block_manager_memory(&e->scheduler.kv), max_rows, err)) {
        engine_free(e);
        return -1;
    }
    return 0;
}

int engine_init(engine* e, const model* m, const engine_config* config, error_info* err) {
    memset(e, 0, sizeof *e);
    e->model = m;
    e->config = *config;
    engine_config* c = &e->config;
    // `make test` sets SERVELAB_AUDIT=1 so that every engine a test builds is
    // audited; a run with a deliberate fault is left as the fault makes it
    // (the fault tests and the lesson fault matrix watch what it breaks),
    // unless the audit was asked for explicitly (engine/audit.h).
    if (!c->audit && audit_requested_by_environment(fault_enabled_set != 0)) c->audit = true;
    if (check_batch_limits(c, &m->config, err) || size_kv_pool(c, &m->config, err)) return -1;
    block_manager kv;
    if (init_kv_memory(e, &kv, err)) return -1;
    init_scheduler(e, &kv, err);
    int max_rows = c->max_batched_tokens + c->max_seqs;
    if (forward_state_init(&e->forward, &m->config, max_rows, m->config.max_seq_len, err)) {
        engine_free(e);
        return -1;
    }
    if (start_workers(e, err) || start_cuda(e, max_rows, err)) return -1;
    if (c->speculative.kind != SPEC_NONE) {
        if (e->cuda) {
            engine_free(e);
            return error_set(err, "--speculative: runs on the CPU backend only (drop --backend cuda)");
        }
        if (speculative_init(&e->spec, &c->speculative, m, c->draft_model, c->kv_dtype, c->num_blocks, c->block_size,
                             max_rows, e->workers, err)) {
            engine_free(e);
            return -1;
        }
    }
    if (ensure_logits(e, 2 * c->max_seqs)) {
        engine_free(e);
        return error_set(err, "engine: out of memory");
    }
    return 0;
}

void engine_free(engine* e) {
    scheduler_free(&e->scheduler);
    step_batch_free(&e->batch);
    kv_pool_free(&e->pool); // the layout not in use is all zeros: freeing it is a no-op
    kv_contiguous_free(&e->contiguous);
    forward_state_free(&e->forward);
    forward_cuda_free(e->cuda);
    thread_pool_free(e->workers);
    free(e->logits);
    step_record_free(&e->record);
    audit_free(&e->audit);
    speculative_free(&e->spec);
    free(e->observed_logits);
    memset(e, 0, sizeof *e);
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
    const block_manager* kv = &e->scheduler.kv;
    int64_t need = block_manager_units_for_length(kv, longest), have = block_manager_capacity_units(kv);
    if (need > have)
        return error_set(err, "request: needs %lld %s for %d tokens but the whole pool has %lld; it could never run",
                         (long long)need, kv->ops->unit_name, longest, (long long)have);
    // Paged: one sequence now, the other samples fork off after its prefill
    // and share its blocks. Contiguous: every sample is its own sequence.
    const bool forks_share = kv->ops->shares_blocks;
    int n_now = forks_share ? 1 : p->n_samples;
    int32_t request_id = e->n_requests++;
    for (int k = 0; k < n_now; k++) {
        sequence* s = scheduler_new_sequence(&e->scheduler, err);
        if (!s) return -1;
        if (sequence_init(s, e->scheduler.next_id, request_id, p->prompt, p->n_prompt, p->max_new_tokens,
                          mc->max_seq_len, err))
            return -1;
        s->sample_index = k;
        s->seed = p->seed + (uint64_t)k;
        if (sampler_init(&s->sampler, mc->vocab_size, p->temperature, p->top_p, s->seed, err)) {
            sequence_free(s);
            return -1;
        }
        s->arrival_time = p->arrival_time > 0 ? p->arrival_time : e->clock_seconds;
        s->pending_forks = forks_share ? p->n_samples - 1 : 0;
        s->ignore_eos = p->ignore_eos;
        if (k == 0 && first_sequence_id) *first_sequence_id = s->id;
        scheduler_add_waiting(&e->scheduler);
    }
    return 0;
}

int engine_cancel_sequence(engine* e, int32_t id, error_info* err) {
    if (id < 0 || id >= e->scheduler.n_sequences)
        return error_set(err, "cancel: no sequence %d (0..%d)", id, e->scheduler.n_sequences - 1);
    scheduler_cancel(&e->scheduler, id, e->clock_seconds);
    speculative_drop_draft(&e->spec, &e->scheduler.sequences[id]);
    return 0;
}

// A released sequence is the only one without tokens: sequence_init always
// allocates at least one (the prompt has 1..max_seq_len - 1).
static bool is_released(const sequence* s) { return s->tokens == NULL; }

int engine_release_sequence(engine* e, int32_t id, error_info* err) {
    if (id < 0 || id >= e->scheduler.n_sequences)
        return error_set(err, "release: no sequence %d (ids 0..%d)", id, e->scheduler.n_sequences - 1);
    const sequence* s = &e->scheduler.sequences[id];
    if (is_released(s)) return error_set(err, "release: sequence %d was already released", id);
    if (s->state != SEQ_FINISHED)
        return error_set(err, "release: sequence %d is %s; only a finished or cancelled one can be released (cancel it first)",
                         id, sequence_state_name(s->state));
    scheduler_release(&e->scheduler, id);
    return 0;
}

int engine_snapshot(const engine* e, step_record* view) { return step_record_fill_queues(view, e); }

int engine_live_sequences(const engine* e) { return e->scheduler.n_live; }

bool engine_has_work(const engine* e) { return scheduler_has_work(&e->scheduler); }

void engine_advance_clock(engine* e, double seconds) {
    if (seconds > 0) e->clock_seconds += seconds;
}

void engine_set_trace(engine* e, FILE* trace) { e->trace = trace; }

void engine_set_logits_observer(engine* e, logits_observer observer, void* user) {
    e->observer = observer;
    e->observer_user = user;
}

bool engine_sequence_status(const engine* e, int32_t id, step_sequence_status* out) {
    const scheduler* s = &e->scheduler;
    if (id < 0 || id >= s->n_sequences || is_released(&s->sequences[id])) return false;
    step_sequence_status_fill(out, s, &s->sequences[id]);
    return true;
}

int64_t engine_pool_slots(const engine* e) { return block_manager_slots(&e->scheduler.kv); }

int engine_fork_sequence(engine* e, int32_t id, float temperature, uint64_t seed, int32_t* child_id,
                         error_info* err) {
    scheduler* s = &e->scheduler;
    if (id < 0 || id >= s->n_sequences) return error_set(err, "fork: no sequence %d (0..%d)", id, s->n_sequences - 1);
    const sequence* parent = &s->sequences[id];
    if (parent->state == SEQ_FINISHED) return error_set(err, "fork: sequence %d has finished", id);
    if (parent->pending_forks > 0)
        return error_set(err, "fork: sequence %d is still computing its prompt for its own samples", id);
    int32_t sample_index = 0; // one past the request's highest, so (request, sample) stays unique
    for (int i = 0; i < s->n_sequences; i++)
        if (s->sequences[i].request_id == parent->request_id && s->sequences[i].sample_index >= sample_index)
            sample_index = s->sequences[i].sample_index + 1;
    // The sampler comes first: once cloned, the child is registered, and a
    // sampler failing after that (a bad temperature, out of memory) would
    // leave it live in no queue.
    sampler child_sampler;
    if (sampler_init(&child_sampler, e->model->config.vocab_size, temperature, parent->sampler.top_p, seed, err))
        return -1;
    sequence* child = scheduler_clone(s, id, sample_index, seed, err);
    if (!child) {
        sampler_free(&child_sampler);
        return -1;
    }
    child->sampler = child_sampler;
    scheduler_place_fork(s, id, child->id);
    if (child_id) *child_id = child->id;
    return 0;
}

// ---- one step ------------------------------------------------------------------------------

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
static int forward_row_by_row(engine* e, kv_memory* memory, const forward_batch* whole, step_record* r,
                              error_info* err) {
    forward_state* f = &e->forward;
    const size_t vocab = (size_t)e->model->config.vocab_size;
    kernel_traffic shard_traffic[MAX_TP_SHARDS]; // (n_shards) summed over the calls
    memset(shard_traffic, 0, sizeof shard_traffic);
    uint64_t allreduce_bytes = 0;
    int n_allreduces = 0, n_logit_rows = 0;
    for (int row = 0; row < whole->n_rows; row++) {
        batch_row alone_row = whole->rows[row];
        alone_row.sequence = 0; // the only sequence of its call
        forward_batch alone = {1, &alone_row, 1, whole->block_tables + whole->rows[row].sequence,
                               whole->slot_mapping + row};
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


// Runs the batch's rows through the model: logits for the rows that want
// them, in row order; the kernels' traffic into the record.
static int run_batch(engine* e, const step_batch* b, step_record* r, error_info* err) {
    if (b->forward.n_rows == 0) return 0;
    if (ensure_logits(e, b->n_logit_rows)) return error_set(err, "engine: out of memory");
    // --backend cuda: the same batch on the GPU, after this step's copy-on-write
    // copies (the pool's events; a contiguous engine's empty pool has none).
    if (e->cuda)
        return forward_cuda_run(e->cuda, e->model, &b->forward, e->pool.events, e->pool.n_events, e->logits,
                                &r->traffic, &r->device_ns, err);
    kv_memory* memory = block_manager_memory(&e->scheduler.kv);
    int status = fault_on(FAULT_UNBATCHED_DECODE)
                     ? forward_row_by_row(e, memory, &b->forward, r, err)
                     : forward(e->model, &e->forward, memory, &b->forward, e->logits, &r->traffic, err);
    if (status == 0) record_tensor_parallel(e, r);
    return status;
}

// The model's judgement on a sampled token: does the sequence end there?
static sampled_token judge(const engine* e, const sequence* s, int32_t token) {
    sampled_token out = {token, false, STOP_EOS};
    if (!s->ignore_eos) out.stops = token_ends_sequence(e->model, token, &out.reason);
    return out;
}

// A verifying decode (engine/speculative.h): its 1 + n_guesses rows of
// logits judge the guesses; the tokens it emits go to sampled[] from its
// first row, each judged by the stop rules.
static int verify_guesses(engine* e, step_batch* b, scheduled_sequence* item, sequence* q, float* logits,
                          int first_row, error_info* err) {
    const int vocab = e->model->config.vocab_size, n_rows = 1 + item->n_guesses;
    if (e->observer) { // verifying overwrites the rows; the observer sees the rows sampled from
        if (!e->observed_logits &&
            !(e->observed_logits = malloc((size_t)(SPEC_MAX_K + 1) * (size_t)vocab * sizeof *e->observed_logits)))
            return error_set(err, "engine: out of memory");
        memcpy(e->observed_logits, logits, (size_t)n_rows * (size_t)vocab * sizeof *logits);
    }
    int32_t tokens[SPEC_MAX_K + 1];
    int accepted = 0;
    int n = speculative_verify(&e->spec, q, logits, vocab, tokens, &accepted);
    if (e->observer)
        for (int j = 0; j < n; j++)
            e->observer(e->observer_user, q->id, q->n_tokens - 1 + j, e->observed_logits + (size_t)j * (size_t)vocab,
                        vocab);
    item->n_accepted = accepted;
    item->n_emitted = n;
    item->bonus = accepted == item->n_guesses;
    for (int j = 0; j < n; j++) b->sampled[first_row + j] = judge(e, q, tokens[j]);
    return 0;
}

// One token for every sequence that reached its last token, from its row of
// logits; a sequence with pending forks first draws each fork's sampler and
// first token from a copy of the same logits (sampling overwrites them).
static int sample_batch(engine* e, step_batch* b, error_info* err) {
    const scheduler* s = &e->scheduler;
    const int vocab = e->model->config.vocab_size;
    int n_forks = 0;
    for (int i = 0; i < b->n_items; i++) {
        const sequence* q = &s->sequences[b->items[i].id];
        if (q->n_computed + b->items[i].n_tokens >= q->n_tokens) n_forks += q->pending_forks;
    }
    float* row = NULL; // fork scratch
    if (n_forks > 0 && (step_batch_reserve_forks(b, n_forks) || !(row = malloc((size_t)vocab * sizeof *row))))
        return error_set(err, "engine: out of memory");
    int logit_row = 0;
    for (int i = 0; i < b->n_items; i++) {
        sequence* q = &e->scheduler.sequences[b->items[i].id];
        if (q->n_computed + b->items[i].n_tokens < q->n_tokens) continue; // more prompt to go
        float* logits = e->logits + (size_t)logit_row * (size_t)vocab;
        if (b->items[i].n_guesses > 0) {
            if (verify_guesses(e, b, &b->items[i], q, logits, logit_row, err)) {
                free(row);
                return -1;
            }
            logit_row += 1 + b->items[i].n_guesses;
            continue;
        }
        if (e->observer) e->observer(e->observer_user, q->id, q->n_tokens - 1, logits, vocab);
        for (int k = 1; k <= q->pending_forks; k++) {
            sampler* fork = &b->fork_samplers[b->n_forks];
            if (sampler_init(fork, vocab, q->sampler.temperature, q->sampler.top_p, q->seed + (uint64_t)k, err)) {
                free(row);
                return -1;
            }
            memcpy(row, logits, (size_t)vocab * sizeof *row);
            b->fork_tokens[b->n_forks++] = judge(e, q, sampler_sample(fork, row));
        }
        b->sampled[logit_row++] = judge(e, q, sampler_sample(&q->sampler, logits));
    }
    free(row);
    return 0;
}

const step_record* engine_view(engine* e) { return step_record_fill_state(&e->record, e) ? NULL : &e->record; }

int engine_step(engine* e, const step_record** record_out, error_info* err) {
    uint64_t start = now_ns();
    step_record* r = &e->record;
    step_batch* b = &e->batch;
    step_record_clear(r);
    r->step = ++e->step_counter;
    kv_pool_clear_events(&e->pool);

    if (e->spec.config.kind != SPEC_NONE && speculative_propose(e, err)) return -1; // 0. the guesses
    if (scheduler_schedule(&e->scheduler, b, err)) return -1; // 1. which sequences, how many tokens
    if (run_batch(e, b, r, err)) return -1;                   // 2. the forward pass
    uint64_t forward_end = now_ns();
    e->clock_seconds += (double)(forward_end - start) * 1e-9;
    if (sample_batch(e, b, err)) return -1;                   // 3. one token per finished prompt
    if (scheduler_postprocess(&e->scheduler, b, e->clock_seconds, err)) return -1; // 4. append, fork, finish
    if (e->spec.config.kind != SPEC_NONE) speculative_after_step(e, b); // the draft caches rolled back too

    e->total_prefix_hit_tokens += (uint64_t)b->prefix_hit_tokens; // 5. the record
    if (step_record_fill(r, e, b)) return error_set(err, "engine: out of memory");
    uint64_t end = now_ns();
    e->clock_seconds += (double)(end - forward_end) * 1e-9;
    r->wall_ns = end - start;
    r->clock_seconds = e->clock_seconds;
    if (e->trace) step_record_write_json(r, e->trace);
    if (e->config.audit && audit_step(&e->audit, e, r, err)) return -1; // the one branch when it is off
    *record_out = r;
    return 0;
}
