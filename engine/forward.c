#include "engine/forward.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/fault.h"
#include "engine/links.h"
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
    free(s->shard_slots);
    free(s->shard_slot_offsets);
    s->shard_slots = NULL;
    s->shard_slot_offsets = NULL;
    s->shard_slots_capacity = s->shard_offsets_capacity = 0;
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

// ---- batch checks and the shards' slot tables -------------------------------------------------

static int check_batch(const model* m, const forward_state* s, const kv_memory* kv, const forward_batch* b,
                       error_info* err) {
    if (b->n_rows <= 0 || b->n_rows > s->max_rows)
        return error_set(err, "forward: batch of %d rows, expected 1..%d", b->n_rows, s->max_rows);
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
    }
    if (s->n_shards > 1 && (int64_t)kv->n_blocks * kv->block_size * s->n_shards > INT32_MAX)
        return error_set(err, "--tp %d: a pool of %d blocks of %d slots is too large to shard", s->n_shards,
                         kv->n_blocks, kv->block_size);
    return 0;
}

// A shard sees the KV cache of its own heads only. Its keys of slot t are
// kv_dim / n_shards elements at t x kv_dim + (its first KV head) x head_dim
// of the layer's array, so viewing that array as (n_slots x n_shards) rows
// of its width, slot t is row t x n_shards. The attention kernel then runs
// unchanged on block tables of one slot per block holding t x n_shards for
// every position of each batch sequence (built once per forward() call).
static int build_shard_slots(forward_state* s, const kv_memory* kv, const forward_batch* b, error_info* err) {
    if (b->n_sequences + 1 > s->shard_offsets_capacity) {
        int64_t* offsets = realloc(s->shard_slot_offsets, (size_t)(b->n_sequences + 1) * sizeof *offsets);
        if (!offsets) return error_set(err, "forward: out of memory for %d sequences", b->n_sequences);
        s->shard_slot_offsets = offsets;
        s->shard_offsets_capacity = b->n_sequences + 1;
    }
    int64_t* offsets = s->shard_slot_offsets; // first the length each sequence needs, then where it starts
    memset(offsets, 0, (size_t)(b->n_sequences + 1) * sizeof *offsets);
    for (int r = 0; r < b->n_rows; r++)
        if (b->rows[r].position + 1 > offsets[b->rows[r].sequence + 1])
            offsets[b->rows[r].sequence + 1] = b->rows[r].position + 1;
    for (int q = 0; q < b->n_sequences; q++) offsets[q + 1] += offsets[q];
    int64_t total = offsets[b->n_sequences];
    if (total > s->shard_slots_capacity) {
        if (total > INT32_MAX) return error_set(err, "forward: too many positions in one batch");
        int32_t* slots = realloc(s->shard_slots, (size_t)total * sizeof *slots);
        if (!slots) return error_set(err, "forward: out of memory for %lld slots", (long long)total);
        s->shard_slots = slots;
        s->shard_slots_capacity = (int)total;
    }
    for (int q = 0; q < b->n_sequences; q++)
        for (int64_t p = 0; p < offsets[q + 1] - offsets[q]; p++)
            s->shard_slots[offsets[q] + p] =
                (int32_t)(kv_slot_of_position(b->block_tables[q], kv->block_size, (int)p) * s->n_shards);
    return 0;
}

// ---- the sublayers of one shard ----------------------------------------------------------------

typedef struct layer_run {
    const model* m;
    forward_state* state;
    kv_memory* kv;
    const forward_batch* batch;
    int layer;
} layer_run;

// One shard's view of a layer's KV cache (see build_shard_slots).
typedef struct shard_kv {
    kv_dtype dtype;
    void* keys;          // its first element of slot 0
    void* values;
    float* key_scales;   // KV_I8: its first scale of slot 0; else NULL
    float* value_scales;
    int block_size;      // slots per block of the tables below
    const forward_batch* batch;
    const forward_state* state;
} shard_kv;

static shard_kv shard_kv_of(const layer_run* run, const forward_shard* shard) {
    const kv_memory* kv = run->kv;
    const size_t byte_offset =
        (size_t)shard->kv_head_begin * (size_t)kv->head_dim * (size_t)kv_dtype_bytes(kv->dtype);
    float* key_scales = kv_memory_layer_key_scales(kv, run->layer);
    float* value_scales = kv_memory_layer_value_scales(kv, run->layer);
    return (shard_kv){kv->dtype,
                      (char*)kv_memory_layer_keys(kv, run->layer) + byte_offset,
                      (char*)kv_memory_layer_values(kv, run->layer) + byte_offset,
                      key_scales ? key_scales + shard->kv_head_begin : NULL,
                      value_scales ? value_scales + shard->kv_head_begin : NULL,
                      run->state->n_shards > 1 ? 1 : kv->block_size,
                      run->batch,
                      run->state};
}

// The block table of batch row r in the shard's view.
static const int32_t* shard_table(const shard_kv* view, int r) {
    int sequence = view->batch->rows[r].sequence;
    if (view->state->n_shards == 1) return view->batch->block_tables[sequence];
    return view->state->shard_slots + view->state->shard_slot_offsets[sequence];
}

// Attention of one row of one shard, run as a task of the shard's threads:
// rows are independent (their keys and values were all written before),
// and each thread has its own score scratch and traffic tally.
typedef struct attention_job {
    const shard_kv* view;
    const forward_shard* shard;
    int head_dim;
    int max_context;
    const int* groups;                  // (n_groups + 1) forward_state.attention_groups
    int head_slices;                    // tasks per group, each a slice of its KV heads (1: whole)
    bool skip_last_block;               // fault skip-last-block (engine/fault.h); false in a normal run
    kernel_traffic* per_thread_traffic; // (shard->n_thread_slots)
} attention_job;

// Task = one slice of the KV heads (with their query heads) of one group
// of rows (forward_state.attention_groups): a decode row alone, or up to
// ATTENTION_ROWS_MAX consecutive rows of one prompt, which attention_rows
// runs together (each row's bits are those of the row alone). Heads are
// independent, so a slice's heads get the bits of the whole row.
static void attention_task(void* context, int task, int thread) {
    const attention_job* job = context;
    const shard_kv* view = job->view;
    const forward_shard* shard = job->shard;
    const int group = task / job->head_slices, slice = task % job->head_slices;
    const int kv_begin = shard->n_kv_heads * slice / job->head_slices,
              kv_end = shard->n_kv_heads * (slice + 1) / job->head_slices;
    const int queries_per_kv_head = shard->n_heads / shard->n_kv_heads;
    const size_t width = (size_t)shard->n_heads * (size_t)job->head_dim;
    const size_t query_offset = (size_t)kv_begin * (size_t)queries_per_kv_head * (size_t)job->head_dim;
    const size_t kv_byte_offset = (size_t)kv_begin * (size_t)job->head_dim * (size_t)kv_dtype_bytes(view->dtype);
    const int first = job->groups[group], n_rows = job->groups[group + 1] - first;
    int n_context = view->batch->rows[first].position + 1;
    if (job->skip_last_block && view->block_size > 1) {
        // The bug: the block loop stops before the context's last block.
        // (A context inside its first block keeps it: nothing would be left.)
        const int tail = (n_context - 1) % view->block_size + 1;
        if (n_context > tail) n_context -= tail;
    }
    kv_layer_view layer = {view->dtype,
                           (const char*)view->keys + kv_byte_offset,
                           (const char*)view->values + kv_byte_offset,
                           shard_table(view, first),
                           view->block_size,
                           view->key_scales ? view->key_scales + kv_begin : NULL,
                           view->value_scales ? view->value_scales + kv_begin : NULL,
                           shard->n_kv_heads};
    // A slice of a multi-row group would need the rows' stride: groups of
    // several rows are only sliced whole (head_slices is 1 when any is).
    attention_rows(shard->attention + (size_t)first * width + query_offset,
                   shard->query + (size_t)first * width + query_offset, &layer, n_context, n_rows,
                   (kv_end - kv_begin) * queries_per_kv_head, kv_end - kv_begin, job->head_dim,
                   shard->scores + (size_t)thread * (size_t)job->max_context, &job->per_thread_traffic[thread]);
}

// Slices per group: with fewer single-row groups than threads (decode of a
// small batch), each row's heads are shared out so that no thread idles;
// otherwise the groups themselves keep every thread busy.
static int attention_head_slices(const forward_state* s, const forward_shard* shard, int n_rows) {
    const int n_groups = s->n_attention_groups;
    if (n_groups != n_rows || n_groups >= shard->n_thread_slots) return 1;
    int slices = (shard->n_thread_slots + n_groups - 1) / n_groups;
    return slices < shard->n_kv_heads ? slices : shard->n_kv_heads;
}

// Splits the batch into attention_task's groups: runs of rows of one
// sequence at consecutive positions (a prompt, or a chunk of one), at most
// ATTENTION_ROWS_MAX long. groups: (n_rows + 1); returns the group count.
static int group_attention_rows(int* groups, const forward_batch* b) {
    int n_groups = 0;
    for (int r = 0; r < b->n_rows;) {
        int size = 1;
        while (size < ATTENTION_ROWS_MAX && r + size < b->n_rows &&
               b->rows[r + size].sequence == b->rows[r].sequence &&
               b->rows[r + size].position == b->rows[r].position + size)
            size++;
        groups[n_groups++] = r;
        r += size;
    }
    groups[n_groups] = b->n_rows;
    return n_groups;
}

static const layer_weights* shard_weights(const layer_run* run, int k) {
    const forward_state* s = run->state;
    return s->n_shards == 1 ? &run->m->layers[run->layer] : &s->tp.shards[k].layers[run->layer];
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

// RoPE and the KV cache writes of a task's rows: each row rotates its own
// query and key and writes its own slot.
typedef struct rope_store_job {
    const shard_kv* view;
    forward_shard* shard;
    const float* rotations; // (n_rows, head_dim) forward_state.rotations
    const rope_config* rope;
    int head_dim, n_rows, rows_per_task;
    bool tail_slot_one_off; // fault paged-wrong-slot (engine/fault.h); false in a normal run
    kernel_traffic* per_thread_traffic; // (shard->n_thread_slots)
} rope_store_job;

static void rope_store_task(void* context, int task, int thread) {
    const rope_store_job* job = context;
    const forward_shard* shard = job->shard;
    const shard_kv* view = job->view;
    const size_t query_width = (size_t)shard->n_heads * (size_t)job->head_dim,
                 kv_width = (size_t)shard->n_kv_heads * (size_t)job->head_dim;
    const int first = task * job->rows_per_task;
    const int end = job->n_rows - first < job->rows_per_task ? job->n_rows : first + job->rows_per_task;
    kernel_traffic* traffic = &job->per_thread_traffic[thread];
    for (int r = first; r < end; r++) {
        float* query = shard->query + (size_t)r * query_width;
        float* key = shard->key + (size_t)r * kv_width;
        rope_rotate_for(query, key, job->rotations + (size_t)r * (size_t)job->head_dim, shard->n_heads,
                        shard->n_kv_heads, job->head_dim, job->rope, traffic);
        const batch_row* row = &view->batch->rows[r];
        int64_t slot = kv_slot_of_position(shard_table(view, r), view->block_size, row->position);
        // The bug: the newest token's slot is computed one short inside its
        // tail block, so its K and V land on the previous token's slot and
        // attention reads the wrong slot for both.
        if (job->tail_slot_one_off && row->wants_logits && row->position % view->block_size != 0) slot--;
        kv_write_row(view->keys, view->values, view->key_scales, view->value_scales, view->dtype, slot, key,
                     shard->value + (size_t)r * kv_width, shard->n_kv_heads, job->head_dim, traffic);
    }
}

// q, k, v of the shard's heads, RoPE, the KV cache writes, attention, and
// its partial sums of wo: partial = wo[:, its columns] . attention.
static void attention_sublayer(void* context, int k, int thread) {
    (void)thread; // a shard's result depends only on its number
    const layer_run* run = context;
    forward_state* s = run->state;
    forward_shard* shard = &s->shards[k];
    const layer_weights* w = shard_weights(run, k);
    const int n = run->batch->n_rows, head_dim = run->m->config.head_dim;
    const size_t query_width = (size_t)shard->n_heads * (size_t)head_dim;
    kernel_traffic* traffic = &shard->traffic;
    const matmul_output qkv[3] = {{shard->query, &w->wq}, {shard->key, &w->wk}, {shard->value, &w->wv}};
    matmul_set_parallel(qkv, 3, s->xb, n, shard->pool, traffic);
    const layer_weights* full = &run->m->layers[run->layer]; // biases are sliced here, not by tp_plan
    if (full->bq) {
        const size_t kv_offset = (size_t)shard->kv_head_begin * (size_t)head_dim;
        const int kv_width = shard->n_kv_heads * head_dim;
        bias_add(shard->query, full->bq + (size_t)shard->head_begin * (size_t)head_dim, n, (int)query_width, traffic);
        bias_add(shard->key, full->bk + kv_offset, n, kv_width, traffic);
        bias_add(shard->value, full->bv + kv_offset, n, kv_width, traffic);
    }
    // Keys and values of every row are stored first, so that a row of a
    // prompt can attend to the rows before it in the same batch.
    shard_kv view = shard_kv_of(run, shard);
    kernel_traffic per_thread_traffic[THREAD_POOL_MAX_THREADS];
    memset(per_thread_traffic, 0, (size_t)shard->n_thread_slots * sizeof *per_thread_traffic);
    rope_store_job store = {.view = &view,
                            .shard = shard,
                            .rotations = s->rotations,
                            .rope = &s->rope,
                            .head_dim = head_dim,
                            .n_rows = n,
                            .rows_per_task = rows_per_task(n, shard->n_thread_slots),
                            .tail_slot_one_off = fault_on(FAULT_PAGED_WRONG_SLOT),
                            .per_thread_traffic = per_thread_traffic};
    thread_pool_run(shard->pool, (n + store.rows_per_task - 1) / store.rows_per_task, rope_store_task, &store);
    const int head_slices = attention_head_slices(s, shard, n);
    attention_job job = {&view,       shard,       head_dim, s->max_context, s->attention_groups,
                         head_slices, fault_on(FAULT_SKIP_LAST_BLOCK), per_thread_traffic};
    thread_pool_run(shard->pool, s->n_attention_groups * head_slices, attention_task, &job);
    for (int t = 0; t < shard->n_thread_slots; t++) traffic_add(traffic, &per_thread_traffic[t]);
    if (s->capture)
        s->capture(s->capture_user, run->layer, CAPTURE_ATTENTION_OUTPUT, shard->attention, n, (int)query_width);
    matmul_parallel(shard->partial, shard->attention, n, &w->wo, shard->pool, traffic);
}

// The SwiGLU of the shard's hidden features and its partial sums of w2.
static void ffn_sublayer(void* context, int k, int thread) {
    (void)thread;
    const layer_run* run = context;
    forward_state* s = run->state;
    forward_shard* shard = &s->shards[k];
    const layer_weights* w = shard_weights(run, k);
    const int n = run->batch->n_rows, hidden = shard->hidden_size;
    kernel_traffic* traffic = &shard->traffic;
    matmul_swiglu_parallel(shard->hidden, shard->hidden_up, s->xb, n, &w->w1, &w->w3, shard->pool, traffic);
    if (s->capture) s->capture(s->capture_user, run->layer, CAPTURE_FFN_HIDDEN, shard->hidden, n, hidden);
    matmul_parallel(shard->partial, shard->hidden, n, &w->w2, shard->pool, traffic);
}

// Runs a sublayer on every shard: each shard is one task of the state's
// pool, so shards run side by side, each on its own threads.
static void run_shards(forward_state* s, layer_run* run, thread_pool_task_fn sublayer) {
    if (s->n_shards == 1) sublayer(run, 0, 0);
    else thread_pool_run(s->pool, s->n_shards, sublayer, run);
}

typedef struct residual_job {
    forward_state* state;
    const float* const* partials; // (n_shards) arrays of (n_rows, dim)
    const float* norm_weight;
    float rms_epsilon;
    int n_rows, dim, rows_per_task;
    kernel_traffic* per_thread_traffic; // (thread_pool_size(state->pool))
} residual_job;

// residual_rmsnorm of one task's rows: each row depends only on itself.
static void residual_task(void* context, int task, int thread) {
    const residual_job* job = context;
    forward_state* s = job->state;
    const int first = task * job->rows_per_task;
    const int n = job->n_rows - first < job->rows_per_task ? job->n_rows - first : job->rows_per_task;
    const size_t offset = (size_t)first * (size_t)job->dim;
    const float* partials[MAX_TP_SHARDS];
    for (int k = 0; k < s->n_shards; k++) partials[k] = job->partials[k] + offset;
    residual_rmsnorm(s->xb + offset, s->x + offset, partials, s->n_shards, job->norm_weight, n, job->dim,
                     job->rms_epsilon, &job->per_thread_traffic[thread]);
}

// The all-reduce of the shards' partial sums, fused with the residual add
// and the RMSNorm that follows it (norm_weight NULL: no norm).
static void all_reduce_residual(forward_state* s, int n_rows, const model_config* c, const float* norm_weight,
                                kernel_traffic* traffic) {
    const float* partials[MAX_TP_SHARDS];
    for (int k = 0; k < s->n_shards; k++) partials[k] = s->shards[k].partial;
    const int n_threads = thread_pool_size(s->pool), per_task = rows_per_task(n_rows, n_threads);
    kernel_traffic per_thread_traffic[THREAD_POOL_MAX_THREADS];
    memset(per_thread_traffic, 0, (size_t)n_threads * sizeof *per_thread_traffic);
    residual_job job = {s, partials, norm_weight, model_rms_epsilon(c), n_rows, c->dim, per_task, per_thread_traffic};
    thread_pool_run(s->pool, (n_rows + per_task - 1) / per_task, residual_task, &job);
    for (int t = 0; t < n_threads; t++) traffic_add(traffic, &per_thread_traffic[t]);
    if (s->n_shards > 1) {
        uint64_t message_bytes = (uint64_t)n_rows * (uint64_t)c->dim * sizeof(float); // fp32 partial sums
        s->allreduce_bytes += link_ring_allreduce_bytes(s->n_shards, message_bytes);
        s->n_allreduces++;
    }
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
// enabled, four not-taken tests per tally per forward() call.
// extra_attention_flops: what flops-allocated adds to this tally.
static void miscount_traffic(kernel_traffic* t, uint64_t extra_attention_flops) {
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
    if (s->n_shards > 1 && s->capture)
        return error_set(err, "forward: activation capture runs without sharding only");
    if (s->n_shards > 1 && build_shard_slots(s, kv, b, err)) return -1;
    s->n_attention_groups = group_attention_rows(s->attention_groups, b);
    const model_config* c = &m->config;
    const int n = b->n_rows, dim = c->dim;
    for (int k = 0; k < s->n_shards; k++) memset(&s->shards[k].traffic, 0, sizeof s->shards[k].traffic);
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
    for (int r = 0; r < n; r++) n_logit_rows += b->rows[r].wants_logits;
    bool every_row_logits = n_logit_rows == n;
    for (int l = 0; l < c->n_layers; l++) {
        layer_run run = {m, s, kv, b, l};
        // ---- attention: x += wo . attention(rope(wq xb), rope(wk xb), wv xb); xb = rmsnorm(x)
        if (s->capture) s->capture(s->capture_user, l, CAPTURE_ATTENTION_INPUT, s->xb, n, dim);
        run_shards(s, &run, attention_sublayer);
        all_reduce_residual(s, n, c, m->layers[l].rms_ffn, &replicated);

        // ---- feed-forward: x += w2 . (silu(w1 xb) * (w3 xb)); xb = rmsnorm(x) for what follows
        if (s->capture) s->capture(s->capture_user, l, CAPTURE_FFN_INPUT, s->xb, n, dim);
        run_shards(s, &run, ffn_sublayer);
        const float* next_norm = l + 1 < c->n_layers ? m->layers[l + 1].rms_attention
                                 : every_row_logits  ? m->rms_final
                                                     : NULL;
        all_reduce_residual(s, n, c, next_norm, &replicated);
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
    miscount_traffic(&replicated, 0);
    for (int k = 0; k < s->n_shards; k++)
        miscount_traffic(&s->shards[k].traffic, 4ull * (uint64_t)s->shards[k].n_heads * (uint64_t)c->head_dim *
                                                    (uint64_t)c->n_layers * unfilled_slots);
    if (traffic) {
        traffic_add(traffic, &replicated);
        for (int k = 0; k < s->n_shards; k++) traffic_add(traffic, &s->shards[k].traffic);
    }
    return 0;
}
