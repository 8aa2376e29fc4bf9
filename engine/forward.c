#include "engine/forward.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/fault.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

// ---- state ----------------------------------------------------------------------------------

// Without sharding, shard 0 is the whole model working in the state's own arrays.
static void alias_single_shard(forward_state* s, const model_config* c) {
    s->shards[0] = (forward_shard){.n_heads = c->n_heads,
                                   .n_kv_heads = c->n_kv_heads,
                                   .hidden_size = c->hidden_dim,
                                   .query = s->query,
                                   .key = s->key,
                                   .value = s->value,
                                   .attention = s->attention,
                                   .hidden = s->hidden,
                                   .hidden_up = s->hidden_up,
                                   .partial = s->xb2,
                                   .scores = s->scores,
                                   .n_thread_slots = s->n_thread_slots,
                                   .pool = s->pool};
}

// Zeroed activations of `count` floats, 64-byte aligned: the kernels read
// rows with 64-byte vector loads, and every row here is a multiple of 16
// floats long in the models that matter, so aligned rows never split a
// load over two cache lines (malloc aligns to 16 bytes only). Freed with free().
static float* activations_alloc(size_t count) {
    if (count > (SIZE_MAX - 64) / sizeof(float)) return NULL;
    size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    float* memory = aligned_alloc(64, bytes > 0 ? bytes : 64);
    if (memory) memset(memory, 0, bytes);
    return memory;
}

int forward_state_init(forward_state* s, const model_config* c, int max_rows, int max_context, error_info* err) {
    memset(s, 0, sizeof *s);
    if (max_rows <= 0 || max_context <= 0)
        return error_set(err, "forward: expected positive max rows and context, found %d and %d", max_rows,
                         max_context);
    s->max_rows = max_rows;
    s->max_context = max_context;
    size_t rows = (size_t)max_rows;
    s->x = activations_alloc(rows * (size_t)c->dim);
    s->xb = activations_alloc(rows * (size_t)c->dim);
    s->xb2 = activations_alloc(rows * (size_t)c->dim);
    s->query = activations_alloc(rows * (size_t)c->dim);
    s->key = activations_alloc(rows * (size_t)c->kv_dim);
    s->value = activations_alloc(rows * (size_t)c->kv_dim);
    s->attention = activations_alloc(rows * (size_t)c->dim);
    s->hidden = activations_alloc(rows * (size_t)c->hidden_dim);
    s->hidden_up = activations_alloc(rows * (size_t)c->hidden_dim);
    s->rotations = activations_alloc(rows * (size_t)c->head_dim);
    s->scores = calloc((size_t)max_context, sizeof(float));
    s->attention_groups = calloc(rows + 1, sizeof(int));
    s->n_thread_slots = 1;
    s->n_shards = 1;
    if (!s->x || !s->xb || !s->xb2 || !s->query || !s->key || !s->value || !s->attention || !s->hidden ||
        !s->hidden_up || !s->rotations || !s->scores || !s->attention_groups) {
        forward_state_free(s);
        return error_set(err, "forward: out of memory for %d rows", max_rows);
    }
    alias_single_shard(s, c);
    return 0;
}

static void free_shards(forward_state* s) {
    if (s->n_shards > 1)
        for (int k = 0; k < s->n_shards; k++) {
            forward_shard* shard = &s->shards[k];
            free(shard->query);
            free(shard->key);
            free(shard->value);
            free(shard->attention);
            free(shard->hidden);
            free(shard->hidden_up);
            free(shard->partial);
            free(shard->scores);
            thread_pool_free(shard->pool);
        }
    memset(s->shards, 0, sizeof s->shards);
    tp_plan_free(&s->tp);
    s->n_shards = 1;
}

void forward_state_free(forward_state* s) {
    free_shards(s);
    free(s->x);
    free(s->xb);
    free(s->xb2);
    free(s->query);
    free(s->key);
    free(s->value);
    free(s->attention);
    free(s->hidden);
    free(s->hidden_up);
    free(s->rotations);
    free(s->scores);
    free(s->attention_groups);
    memset(s, 0, sizeof *s);
}

int forward_state_set_pool(forward_state* s, thread_pool* pool, error_info* err) {
    int n_threads = thread_pool_size(pool);
    float* scores = calloc((size_t)n_threads * (size_t)s->max_context, sizeof(float));
    if (!scores) return error_set(err, "forward: out of memory for %d threads", n_threads);
    free(s->scores);
    s->scores = scores;
    s->n_thread_slots = n_threads;
    s->pool = pool;
    if (s->n_shards == 1) {
        s->shards[0].scores = scores;
        s->shards[0].n_thread_slots = n_threads;
        s->shards[0].pool = pool;
    }
    return 0;
}

static int init_shard(forward_shard* shard, const tp_shard* geometry, const model_config* c, int max_rows,
                      int max_context, int n_threads) {
    const size_t rows = (size_t)max_rows, query_width = (size_t)geometry->n_heads * (size_t)c->head_dim,
                 kv_width = (size_t)geometry->n_kv_heads * (size_t)c->head_dim;
    *shard = (forward_shard){.head_begin = geometry->head_begin,
                             .n_heads = geometry->n_heads,
                             .kv_head_begin = geometry->kv_head_begin,
                             .n_kv_heads = geometry->n_kv_heads,
                             .hidden_size = geometry->hidden_size};
    shard->query = activations_alloc(rows * query_width);
    shard->key = activations_alloc(rows * kv_width);
    shard->value = activations_alloc(rows * kv_width);
    shard->attention = activations_alloc(rows * query_width);
    shard->hidden = activations_alloc(rows * (size_t)geometry->hidden_size);
    shard->hidden_up = activations_alloc(rows * (size_t)geometry->hidden_size);
    shard->partial = activations_alloc(rows * (size_t)c->dim);
    if (n_threads > 1 && thread_pool_create(n_threads, &shard->pool) != 0) return -1;
    shard->n_thread_slots = thread_pool_size(shard->pool);
    shard->scores = calloc((size_t)shard->n_thread_slots * (size_t)max_context, sizeof(float));
    return shard->query && shard->key && shard->value && shard->attention && shard->hidden && shard->hidden_up &&
                   shard->partial && shard->scores
               ? 0
               : -1;
}

int forward_state_set_tensor_parallel(forward_state* s, const model* m, int n_shards, int threads_per_shard,
                                      error_info* err) {
    free_shards(s);
    alias_single_shard(s, &m->config);
    if (n_shards == 1) return 0;
    if (s->capture) return error_set(err, "--tp %d: activation capture runs without sharding only", n_shards);
    if (tp_plan_build(&s->tp, m, n_shards, err)) return -1;
    s->n_shards = n_shards;
    for (int k = 0; k < n_shards; k++)
        if (init_shard(&s->shards[k], &s->tp.shards[k], &m->config, s->max_rows, s->max_context, threads_per_shard)) {
            free_shards(s);
            alias_single_shard(s, &m->config);
            return error_set(err, "--tp %d: out of memory or threads for shard %d", n_shards, k);
        }
    return 0;
}

// ---- batch checks and how work is shared out ---------------------------------------------------

static int check_batch(const model* m, const forward_state* s, const kv_memory* kv, const forward_batch* b,
                       error_info* err) {
    if (b->n_rows <= 0 || b->n_rows > s->max_rows)
        return error_set(err, "forward: batch of %d rows, expected 1..%d", b->n_rows, s->max_rows);
    if (!b->slot_mapping) return error_set(err, "forward: the batch has no slot mapping");
    for (int r = 0; r < b->n_rows; r++) {
        const batch_row* row = &b->rows[r];
        if (row->token < 0 || row->token >= m->config.vocab_size)
            return error_set(err, "forward: row %d: token %d outside the vocabulary (0..%d)", r, row->token,
                             m->config.vocab_size - 1);
        if (row->position < 0 || row->position >= m->config.max_seq_len || row->position >= s->max_context)
            return error_set(err, "forward: row %d: position %d outside 0..%d", r, row->position,
                             (m->config.max_seq_len < s->max_context ? m->config.max_seq_len : s->max_context) - 1);
        if (row->sequence < 0 || row->sequence >= b->n_sequences)
            return error_set(err, "forward: row %d: sequence %d outside 0..%d", r, row->sequence, b->n_sequences - 1);
        int block = b->block_tables[row->sequence][row->position / kv->block_size];
        if (block < 0 || block >= kv->n_blocks)
            return error_set(err, "forward: row %d: block %d outside the pool of %d", r, block, kv->n_blocks);
        const int64_t n_slots = (int64_t)kv->n_blocks * kv->block_size;
        if (b->slot_mapping[r] < 0 || b->slot_mapping[r] >= n_slots)
            return error_set(err, "forward: row %d: slot %d outside the pool's %lld slots", r, (int)b->slot_mapping[r],
                             (long long)n_slots);
    }
    return 0;
}

void forward_batch_map_slots(int32_t* slot_mapping, const batch_row* rows, int n_rows,
                             const int32_t* const* block_tables, int block_size) {
    for (int r = 0; r < n_rows; r++)
        slot_mapping[r] = (int32_t)kv_slot_of_position(block_tables[rows[r].sequence], block_size, rows[r].position);
}

// Splits the batch into the groups of rows attention runs together: runs
// of rows of one sequence at consecutive positions (a prompt, or a chunk of
// one), at most ATTENTION_ROWS_MAX long. groups: (n_rows + 1); returns the
// group count.
static int group_attention_rows(int* groups, const forward_batch* b) {
    int n_groups = 0;
    for (int r = 0; r < b->n_rows;) {
        int size = 1;
        while (size < ATTENTION_ROWS_MAX && r + size < b->n_rows && b->rows[r + size].sequence == b->rows[r].sequence &&
               b->rows[r + size].position == b->rows[r].position + size)
            size++;
        groups[n_groups++] = r;
        r += size;
    }
    groups[n_groups] = b->n_rows;
    return n_groups;
}

// Rows per task when per-row work (norms, RoPE, KV writes) is shared out
// between `n_threads`: a prompt's hundreds of rows would otherwise run on
// the calling thread alone while the others wait. A decode step's few rows
// stay on the caller (one task), where waking the pool costs more than
// they do.
static int rows_per_task(int n_rows, int n_threads) {
    if (n_threads <= 1 || n_rows < 4 * n_threads) return n_rows > 0 ? n_rows : 1;
    return (n_rows + 4 * n_threads - 1) / (4 * n_threads);
}

// Slices of the KV heads per attention group: with fewer single-row groups
// than threads (decode of a small batch), each row's heads are shared out
// so that no thread idles; otherwise the groups themselves keep every
// thread busy.
static int attention_head_slices(const forward_state* s, const forward_shard* shard, int n_rows) {
    const int n_groups = s->n_attention_groups;
    if (n_groups != n_rows || n_groups >= shard->n_thread_slots) return 1;
    int slices = (shard->n_thread_slots + n_groups - 1) / n_groups;
    return slices < shard->n_kv_heads ? slices : shard->n_kv_heads;
}

// Runs n_tasks tasks of `task` on pool. Each task adds its kernels' work to
// its own thread's tally (per_thread_traffic, zeroed here, one per thread
// slot), so no two threads add to one counter; the tallies go into
// *traffic once the pool is done.
static void run_tallied(thread_pool* pool, int n_tasks, thread_pool_task_fn task, void* job,
                        kernel_traffic* per_thread_traffic, int n_thread_slots, kernel_traffic* traffic) {
    memset(per_thread_traffic, 0, (size_t)n_thread_slots * sizeof *per_thread_traffic);
    thread_pool_run(pool, n_tasks, task, job);
    for (int t = 0; t < n_thread_slots; t++)
        traffic_add(traffic, &per_thread_traffic[t]);
}

// ---- the steps of a layer on one shard ------------------------------------------------------------
//
// A shard computes the heads and hidden features it owns
// (engine/tensor_parallel.h). On one device the shard is the whole model:
// every head, every hidden feature, the model's own weights and KV cache.

// What every step of layer `layer` reads.
typedef struct layer_step {
    const model* m;
    forward_state* state;
    const kv_memory* kv;
    const forward_batch* batch;
    int layer;
} layer_step;

// Shows the rows to the calibration hook (forward_state.capture), when one is set.
static void capture(const layer_step* step, capture_site site, const float* rows, int width) {
    const forward_state* s = step->state;
    if (s->capture) s->capture(s->capture_user, step->layer, site, rows, step->batch->n_rows, width);
}

// The layer's KV cache as a shard sees it: its KV heads of every slot.
// Slots keep the whole cache's stride, so the batch's block tables hold
// for every shard.
typedef struct shard_cache {
    kv_dtype dtype;
    char* keys;        // its first KV head of slot 0, in the layer's (n_slots, kv_dim) keys
    char* values;      // likewise in the values
    float* key_scales; // KV_I8: its first head's scale of slot 0 in (n_slots, n_kv_heads); else NULL
    float* value_scales;
    int slot_kv_heads; // KV heads in one slot: the model's n_kv_heads
    int block_size;    // slots per block
} shard_cache;

static shard_cache shard_cache_of(const kv_memory* kv, int layer, const forward_shard* shard) {
    const size_t first_head_bytes =
        (size_t)shard->kv_head_begin * (size_t)kv->head_dim * (size_t)kv_dtype_bytes(kv->dtype);
    float* key_scales = kv_memory_layer_key_scales(kv, layer);
    float* value_scales = kv_memory_layer_value_scales(kv, layer);
    return (shard_cache){kv->dtype,
                         (char*)kv_memory_layer_keys(kv, layer) + first_head_bytes,
                         (char*)kv_memory_layer_values(kv, layer) + first_head_bytes,
                         key_scales ? key_scales + shard->kv_head_begin : NULL,
                         value_scales ? value_scales + shard->kv_head_begin : NULL,
                         kv->n_kv_heads,
                         kv->block_size};
}

// q = wq xb, k = wk xb, v = wv xb (+ bq, bk, bv where the model has them),
// for the shard's heads.
static void qkv_matmuls(const layer_step* step, forward_shard* shard, const layer_weights* w) {
    const forward_state* s = step->state;
    const int n = step->batch->n_rows, head_dim = step->m->config.head_dim;
    const matmul_output qkv[3] = {{shard->query, &w->wq}, {shard->key, &w->wk}, {shard->value, &w->wv}};
    matmul_set_parallel(qkv, 3, s->xb, n, shard->pool, &shard->traffic);
    const layer_weights* full = &step->m->layers[step->layer]; // biases are sliced here, not by tp_plan
    if (!full->bq) return;
    const size_t kv_offset = (size_t)shard->kv_head_begin * (size_t)head_dim;
    const int kv_width = shard->n_kv_heads * head_dim;
    bias_add(shard->query, full->bq + (size_t)shard->head_begin * (size_t)head_dim, n, shard->n_heads * head_dim,
             &shard->traffic);
    bias_add(shard->key, full->bk + kv_offset, n, kv_width, &shard->traffic);
    bias_add(shard->value, full->bv + kv_offset, n, kv_width, &shard->traffic);
}

typedef struct rope_and_write_job {
    const layer_step* step;
    forward_shard* shard;
    const shard_cache* cache;
    int rows_per_task;
    kernel_traffic* per_thread_traffic; // (shard->n_thread_slots)
} rope_and_write_job;

// A task's rows: each rotates its own query and key and writes them to the
// slot the batch's slot mapping gives it.
static void rope_and_write_task(void* context, int task, int thread) {
    const rope_and_write_job* job = context;
    const forward_state* s = job->step->state;
    const forward_batch* b = job->step->batch;
    const forward_shard* shard = job->shard;
    const shard_cache* cache = job->cache;
    const int head_dim = job->step->m->config.head_dim;
    const size_t query_width = (size_t)shard->n_heads * (size_t)head_dim,
                 kv_width = (size_t)shard->n_kv_heads * (size_t)head_dim;
    // kv_write_row strides slots by the heads it is given: counted in the
    // shard's heads, slot t of the cache starts at t x slot_stride.
    const int64_t slot_stride = cache->slot_kv_heads / shard->n_kv_heads;
    const int first = task * job->rows_per_task;
    const int end = b->n_rows - first < job->rows_per_task ? b->n_rows : first + job->rows_per_task;
    kernel_traffic* traffic = &job->per_thread_traffic[thread];
    for (int r = first; r < end; r++) {
        float* query = shard->query + (size_t)r * query_width;
        float* key = shard->key + (size_t)r * kv_width;
        rope_rotate_for(query, key, s->rotations + (size_t)r * (size_t)head_dim, shard->n_heads, shard->n_kv_heads,
                        head_dim, &s->rope, traffic);
        kv_write_row(cache->keys, cache->values, cache->key_scales, cache->value_scales, cache->dtype,
                     (int64_t)b->slot_mapping[r] * slot_stride, key, shard->value + (size_t)r * kv_width,
                     shard->n_kv_heads, head_dim, traffic);
    }
}

// q, k = rope(q, k) at each row's position; then each row's k and v go to
// its slot of the cache. Every row's keys and values are stored before any
// row attends, so that a row of a prompt attends to the rows before it in
// the same batch.
static void rope_and_write_kv(const layer_step* step, forward_shard* shard, const shard_cache* cache) {
    kernel_traffic per_thread_traffic[THREAD_POOL_MAX_THREADS];
    const int n = step->batch->n_rows;
    rope_and_write_job job = {step, shard, cache, rows_per_task(n, shard->n_thread_slots), per_thread_traffic};
    run_tallied(shard->pool, (n + job.rows_per_task - 1) / job.rows_per_task, rope_and_write_task, &job,
                per_thread_traffic, shard->n_thread_slots, &shard->traffic);
}

typedef struct attention_job {
    const layer_step* step;
    const forward_shard* shard;
    const shard_cache* cache;
    int head_slices;                    // tasks per group, each a slice of its KV heads (1: whole)
    bool skip_last_block;               // fault skip-last-block (engine/fault.h); false in a normal run
    kernel_traffic* per_thread_traffic; // (shard->n_thread_slots)
} attention_job;

// Task = one slice of the KV heads (with their query heads) of one group
// of rows (forward_state.attention_groups): a decode row alone, or up to
// ATTENTION_ROWS_MAX consecutive rows of one prompt, which attention_rows
// runs together (each row's bits are those of the row alone). Heads are
// independent, so a slice's heads get the bits of the whole row; each
// thread has its own score scratch.
static void attention_task(void* context, int task, int thread) {
    const attention_job* job = context;
    const forward_state* s = job->step->state;
    const forward_batch* b = job->step->batch;
    const forward_shard* shard = job->shard;
    const shard_cache* cache = job->cache;
    const int head_dim = job->step->m->config.head_dim;
    const int group = task / job->head_slices, slice = task % job->head_slices;
    const int kv_begin = shard->n_kv_heads * slice / job->head_slices,
              kv_end = shard->n_kv_heads * (slice + 1) / job->head_slices;
    const int queries_per_kv_head = shard->n_heads / shard->n_kv_heads;
    const size_t width = (size_t)shard->n_heads * (size_t)head_dim;
    const size_t query_offset = (size_t)kv_begin * (size_t)queries_per_kv_head * (size_t)head_dim;
    const size_t kv_byte_offset = (size_t)kv_begin * (size_t)head_dim * (size_t)kv_dtype_bytes(cache->dtype);
    const int first = s->attention_groups[group], n_rows = s->attention_groups[group + 1] - first;
    int n_context = b->rows[first].position + 1;
    if (job->skip_last_block && cache->block_size > 1) {
        // The bug: the block loop stops before the context's last block.
        // (A context inside its first block keeps it: nothing would be left.)
        const int tail = (n_context - 1) % cache->block_size + 1;
        if (n_context > tail) n_context -= tail;
    }
    kv_layer_view layer = {cache->dtype,
                           cache->keys + kv_byte_offset,
                           cache->values + kv_byte_offset,
                           b->block_tables[b->rows[first].sequence],
                           cache->block_size,
                           cache->key_scales ? cache->key_scales + kv_begin : NULL,
                           cache->value_scales ? cache->value_scales + kv_begin : NULL,
                           cache->slot_kv_heads};
    // A slice of a multi-row group would need the rows' stride: groups of
    // several rows are only sliced whole (head_slices is 1 when any is).
    attention_rows(shard->attention + (size_t)first * width + query_offset,
                   shard->query + (size_t)first * width + query_offset, &layer, n_context, n_rows,
                   (kv_end - kv_begin) * queries_per_kv_head, kv_end - kv_begin, head_dim,
                   shard->scores + (size_t)thread * (size_t)s->max_context, &job->per_thread_traffic[thread]);
}

// attention = softmax(q . K / sqrt(head_dim)) . V per head, each row over
// its own sequence's cached positions up to its own.
static void attend(const layer_step* step, forward_shard* shard, const shard_cache* cache) {
    kernel_traffic per_thread_traffic[THREAD_POOL_MAX_THREADS];
    const forward_state* s = step->state;
    const int head_slices = attention_head_slices(s, shard, step->batch->n_rows);
    attention_job job = {step, shard, cache, head_slices, fault_on(FAULT_SKIP_LAST_BLOCK), per_thread_traffic};
    run_tallied(shard->pool, s->n_attention_groups * head_slices, attention_task, &job, per_thread_traffic,
                shard->n_thread_slots, &shard->traffic);
}

// ---- one layer ----------------------------------------------------------------------------------
//
// llama2.c's layer, one line per equation. Each half runs on every shard
// at once (tp_run_on_shards); the residual add between them sums the
// shards' partial outputs (the all-reduce).

// The attention half of layer step->layer on shard k: its heads' share of
// wo . attention(rope(wq xb), rope(wk xb), wv xb).
static void attention_on_shard(void* context, int k, int thread) {
    (void)thread; // a shard's result depends only on its number
    const layer_step* step = context;
    forward_shard* shard = &step->state->shards[k];
    const layer_weights* w = tp_shard_layer(&step->state->tp, step->m, k, step->layer);
    const shard_cache cache = shard_cache_of(step->kv, step->layer, shard);
    const int n = step->batch->n_rows, dim = step->m->config.dim, head_dim = step->m->config.head_dim;
    kernel_traffic* traffic = &shard->traffic;
    // xb = rmsnorm(x) with rms_attention: the residual add before this made it
    capture(step, CAPTURE_ATTENTION_INPUT, step->state->xb, dim);
    qkv_matmuls(step, shard, w);            // q = wq xb, k = wk xb, v = wv xb
    rope_and_write_kv(step, shard, &cache); // q, k = rope(q, k); K[slot] = k, V[slot] = v
    attend(step, shard, &cache);            // attention = softmax(q . K / sqrt(head_dim)) . V
    capture(step, CAPTURE_ATTENTION_OUTPUT, shard->attention, shard->n_heads * head_dim);
    matmul_parallel(shard->partial, shard->attention, n, &w->wo, shard->pool, traffic); // partial = wo . attention
}

// The feed-forward half on shard k: its hidden features' share of
// w2 . (silu(w1 xb) * (w3 xb)).
static void ffn_on_shard(void* context, int k, int thread) {
    (void)thread;
    const layer_step* step = context;
    forward_shard* shard = &step->state->shards[k];
    const layer_weights* w = tp_shard_layer(&step->state->tp, step->m, k, step->layer);
    const int n = step->batch->n_rows;
    const float* xb = step->state->xb;
    kernel_traffic* traffic = &shard->traffic;
    // xb = rmsnorm(x) with rms_ffn: the residual add before this made it
    capture(step, CAPTURE_FFN_INPUT, xb, step->m->config.dim);
    // hidden = silu(w1 xb) * (w3 xb), one pass (matmul.h)
    matmul_swiglu_parallel(shard->hidden, shard->hidden_up, xb, n, &w->w1, &w->w3, shard->pool, traffic);
    capture(step, CAPTURE_FFN_HIDDEN, shard->hidden, shard->hidden_size);
    matmul_parallel(shard->partial, shard->hidden, n, &w->w2, shard->pool, traffic); // partial = w2 . hidden
}

// x += partial (with shards: the sum of their partials, the all-reduce),
// then xb = rmsnorm(x) with next_norm, the norm of whatever reads x next:
// the FFN's, the next layer's attention's, or the final norm (NULL: none).
// Fused because the norm reads the x the add has just written: 4 passes
// over the (n_rows, dim) activations instead of 5 (add: read x and
// partial, write x; norm: read x, write xb), and N + 3 instead of N + 6
// with N shards whose all-reduce would first sum into a buffer of its own.
static void residual_add_then_next_rmsnorm(forward_state* s, const model_config* c, int n_rows, const float* next_norm,
                                           kernel_traffic* traffic) {
    const float* partials[MAX_TP_SHARDS];
    for (int k = 0; k < s->n_shards; k++)
        partials[k] = s->shards[k].partial;
    const int per_task = rows_per_task(n_rows, thread_pool_size(s->pool));
    const uint64_t sent_bytes =
        tp_all_reduce_residual_rmsnorm(s->xb, s->x, partials, s->n_shards, next_norm, n_rows, c->dim,
                                       model_rms_epsilon(c), s->pool, per_task, traffic);
    if (s->n_shards > 1) {
        s->allreduce_bytes += sent_bytes;
        s->n_allreduces++;
    }
}

// The norm after layer l: the next layer's attention norm; after the last
// layer the final norm, when every row wants logits (else the classifier's
// rows are gathered and normed apart, forward()).
static const float* norm_after_layer(const model* m, int l, bool every_row_logits) {
    if (l + 1 < m->config.n_layers) return m->layers[l + 1].rms_attention;
    return every_row_logits ? m->rms_final : NULL;
}

// ---- the counting faults (engine/fault.h) ------------------------------------------------------

// Slots past each row's context up to the end of the block holding its last
// position: what attention counted over allocated slots adds to the
// context (flops-allocated). A contiguous cache is viewed one slot per
// block, so it adds nothing there.
static uint64_t unfilled_tail_slots(const forward_batch* b, int block_size) {
    uint64_t slots = 0;
    for (int r = 0; r < b->n_rows; r++) {
        const int context = b->rows[r].position + 1;
        slots += (uint64_t)((block_size - context % block_size) % block_size);
    }
    return slots;
}

// Miscounts one tally the way an enabled counting fault does; with no fault
// enabled, five not-taken tests per tally per forward() call.
// extra_attention_flops: what flops-allocated adds to this tally.
static void miscount_traffic(kernel_traffic* t, uint64_t extra_attention_flops, kv_dtype dtype, int head_dim) {
    if (fault_on(FAULT_KV_INT8_SCALES_UNCOUNTED) && dtype == KV_I8) {
        // Each int8 head stores head_dim bytes and its fp32 scale: counting
        // only the values keeps head_dim of every head_dim + 4 bytes (64 of 68).
        const uint64_t head_bytes = (uint64_t)head_dim + sizeof(float);
        t->kv_bytes_written = t->kv_bytes_written / head_bytes * (uint64_t)head_dim;
        t->kv_bytes_read = t->kv_bytes_read / head_bytes * (uint64_t)head_dim;
    }
    if (fault_on(FAULT_KV_COUNT_DROPPED)) t->kv_bytes_written = 0;
    if (fault_on(FAULT_KV_COUNT_DOUBLED)) {
        t->kv_bytes_written *= 2;
        t->kv_bytes_read *= 2;
    }
    if (fault_on(FAULT_WEIGHT_COUNT_DOUBLED)) t->weight_bytes_read *= 2;
    if (fault_on(FAULT_FLOPS_ALLOCATED)) t->attention_flops += extra_attention_flops;
}

// ---- the forward pass ------------------------------------------------------------------------

int forward(const model* m, forward_state* s, kv_memory* kv, const forward_batch* b, float* logits,
            kernel_traffic* traffic, error_info* err) {
    if (check_batch(m, s, kv, b, err)) return -1;
    if (s->n_shards > 1 && s->capture) return error_set(err, "forward: activation capture runs without sharding only");
    s->n_attention_groups = group_attention_rows(s->attention_groups, b);
    const model_config* c = &m->config;
    const int n = b->n_rows, dim = c->dim;
    for (int k = 0; k < s->n_shards; k++)
        memset(&s->shards[k].traffic, 0, sizeof s->shards[k].traffic);
    s->allreduce_bytes = 0;
    s->n_allreduces = 0;
    kernel_traffic replicated = {0}; // embedding, norms, residual stream, classifier

    // Token embeddings into the residual stream, and each row's RoPE angles
    // (the same in every layer).
    s->rope = (rope_config){model_rope_base(c), model_rope_dims(c), c->rope_neox};
    const float rms_epsilon = model_rms_epsilon(c);
    for (int r = 0; r < n; r++) {
        weight_row_to_f32(s->x + (size_t)r * dim, &m->token_embedding, b->rows[r].token, &replicated);
        rope_rotations_for(s->rotations + (size_t)r * (size_t)c->head_dim, b->rows[r].position, &s->rope);
    }
    rmsnorm(s->xb, s->x, m->layers[0].rms_attention, n, dim, rms_epsilon, &replicated);

    int n_logit_rows = 0;
    for (int r = 0; r < n; r++)
        n_logit_rows += b->rows[r].wants_logits;
    const bool every_row_logits = n_logit_rows == n;
    for (int l = 0; l < c->n_layers; l++) {
        layer_step step = {m, s, kv, b, l};
        tp_run_on_shards(s->pool, s->n_shards, attention_on_shard, &step);          // partial = wo . attention(...)
        residual_add_then_next_rmsnorm(s, c, n, m->layers[l].rms_ffn, &replicated); // x += partial; xb = rmsnorm(x)
        tp_run_on_shards(s->pool, s->n_shards, ffn_on_shard, &step);                // partial = w2 . swiglu(...)
        residual_add_then_next_rmsnorm(s, c, n, norm_after_layer(m, l, every_row_logits), &replicated);
    }

    // Final norm and classifier, only for the rows whose logits are wanted
    // (gathered so that the classifier streams once for all of them). When
    // every row wants them, the last residual add already normed them all.
    if (n_logit_rows > 0 && !every_row_logits) {
        int gathered = 0;
        for (int r = 0; r < n; r++) {
            if (!b->rows[r].wants_logits) continue;
            memcpy(s->xb2 + (size_t)gathered * dim, s->x + (size_t)r * dim, (size_t)dim * sizeof(float));
            gathered++;
        }
        rmsnorm(s->xb, s->xb2, m->rms_final, n_logit_rows, dim, rms_epsilon, &replicated);
    }
    if (n_logit_rows > 0) {
        if (s->capture) s->capture(s->capture_user, -1, CAPTURE_CLASSIFIER_INPUT, s->xb, n_logit_rows, dim);
        matmul_parallel(logits, s->xb, n_logit_rows, &m->classifier, s->pool, &replicated);
    }
    // Each shard's attention over one slot: q.k and p.v, 2 FLOPs per multiply-add, in every layer.
    const uint64_t unfilled_slots = fault_on(FAULT_FLOPS_ALLOCATED) ? unfilled_tail_slots(b, kv->block_size) : 0;
    miscount_traffic(&replicated, 0, kv->dtype, c->head_dim);
    for (int k = 0; k < s->n_shards; k++)
        miscount_traffic(&s->shards[k].traffic,
                         4ull * (uint64_t)s->shards[k].n_heads * (uint64_t)c->head_dim * (uint64_t)c->n_layers *
                             unfilled_slots,
                         kv->dtype, c->head_dim);
    if (traffic) {
        traffic_add(traffic, &replicated);
        for (int k = 0; k < s->n_shards; k++)
            traffic_add(traffic, &s->shards[k].traffic);
    }
    return 0;
}
