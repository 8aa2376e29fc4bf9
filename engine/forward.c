#include "engine/forward.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

int forward_state_init(forward_state* s, const model_config* c, int max_rows, int max_context, error_info* err) {
    memset(s, 0, sizeof *s);
    if (max_rows <= 0 || max_context <= 0)
        return error_set(err, "forward: expected positive max rows and context, found %d and %d", max_rows,
                         max_context);
    s->max_rows = max_rows;
    s->max_context = max_context;
    size_t rows = (size_t)max_rows;
    s->x = calloc(rows * (size_t)c->dim, sizeof(float));
    s->xb = calloc(rows * (size_t)c->dim, sizeof(float));
    s->xb2 = calloc(rows * (size_t)c->dim, sizeof(float));
    s->query = calloc(rows * (size_t)c->dim, sizeof(float));
    s->key = calloc(rows * (size_t)c->kv_dim, sizeof(float));
    s->value = calloc(rows * (size_t)c->kv_dim, sizeof(float));
    s->attention = calloc(rows * (size_t)c->dim, sizeof(float));
    s->hidden = calloc(rows * (size_t)c->hidden_dim, sizeof(float));
    s->hidden_up = calloc(rows * (size_t)c->hidden_dim, sizeof(float));
    s->scores = calloc((size_t)max_context, sizeof(float));
    s->n_thread_slots = 1;
    if (!s->x || !s->xb || !s->xb2 || !s->query || !s->key || !s->value || !s->attention || !s->hidden ||
        !s->hidden_up || !s->scores) {
        forward_state_free(s);
        return error_set(err, "forward: out of memory for %d rows", max_rows);
    }
    return 0;
}

void forward_state_free(forward_state* s) {
    free(s->x);
    free(s->xb);
    free(s->xb2);
    free(s->query);
    free(s->key);
    free(s->value);
    free(s->attention);
    free(s->hidden);
    free(s->hidden_up);
    free(s->scores);
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
    return 0;
}

// Attention of one row, run as a thread-pool task: rows are independent
// (their keys and values were all written before), and each thread has its
// own score scratch and traffic tally.
typedef struct attention_job {
    const model_config* config;
    forward_state* state;
    const forward_batch* batch;
    kv_dtype dtype;
    const void* layer_keys;
    const void* layer_values;
    int block_size;
    const float* key_scales;            // KV_I8: (n_slots, n_kv_heads); else NULL
    const float* value_scales;
    kernel_traffic* per_thread_traffic; // (n_thread_slots)
} attention_job;

static void attention_task(void* context, int row_index, int thread) {
    const attention_job* job = context;
    const model_config* c = job->config;
    const batch_row* row = &job->batch->rows[row_index];
    kv_layer_view view = {job->dtype,      job->layer_keys,  job->layer_values, job->batch->block_tables[row->sequence],
                          job->block_size, job->key_scales, job->value_scales};
    attention_row(job->state->attention + (size_t)row_index * (size_t)c->dim,
                  job->state->query + (size_t)row_index * (size_t)c->dim, &view, row->position + 1, c->n_heads,
                  c->n_kv_heads, c->head_dim, job->state->scores + (size_t)thread * (size_t)job->state->max_context,
                  &job->per_thread_traffic[thread]);
}

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
    return 0;
}

int forward(const model* m, forward_state* s, kv_memory* kv, const forward_batch* b, float* logits,
            kernel_traffic* traffic, error_info* err) {
    if (check_batch(m, s, kv, b, err)) return -1;
    const model_config* c = &m->config;
    const int n = b->n_rows, dim = c->dim, kv_dim = c->kv_dim, hidden = c->hidden_dim;

    // Token embeddings into the residual stream.
    for (int r = 0; r < n; r++) weight_row_to_f32(s->x + (size_t)r * dim, &m->token_embedding, b->rows[r].token, traffic);

    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights* layer = &m->layers[l];
        void* layer_keys = kv_memory_layer_keys(kv, l);
        void* layer_values = kv_memory_layer_values(kv, l);
        float* layer_key_scales = kv_memory_layer_key_scales(kv, l);
        float* layer_value_scales = kv_memory_layer_value_scales(kv, l);

        // ---- attention: x += wo . attention(rope(wq xb), rope(wk xb), wv xb)
        rmsnorm(s->xb, s->x, layer->rms_attention, n, dim, MODEL_RMS_EPS, traffic);
        if (s->capture) s->capture(s->capture_user, l, CAPTURE_ATTENTION_INPUT, s->xb, n, dim);
        matmul_parallel(s->query, s->xb, n, &layer->wq, s->pool, traffic);
        matmul_parallel(s->key, s->xb, n, &layer->wk, s->pool, traffic);
        matmul_parallel(s->value, s->xb, n, &layer->wv, s->pool, traffic);
        // Keys and values of every row are stored first, so that a row of a
        // prompt can attend to the rows before it in the same batch.
        for (int r = 0; r < n; r++) {
            const batch_row* row = &b->rows[r];
            float* key = s->key + (size_t)r * kv_dim;
            rope(s->query + (size_t)r * dim, key, row->position, c->n_heads, c->n_kv_heads, c->head_dim, traffic);
            int64_t slot = kv_slot_of_position(b->block_tables[row->sequence], kv->block_size, row->position);
            kv_write_row(layer_keys, layer_values, layer_key_scales, layer_value_scales, kv->dtype, slot, key,
                         s->value + (size_t)r * kv_dim, c->n_kv_heads, c->head_dim, traffic);
        }
        kernel_traffic per_thread_traffic[THREAD_POOL_MAX_THREADS];
        memset(per_thread_traffic, 0, (size_t)s->n_thread_slots * sizeof *per_thread_traffic);
        attention_job job = {c,         s, b, kv->dtype, layer_keys, layer_values, kv->block_size, layer_key_scales,
                             layer_value_scales, per_thread_traffic};
        thread_pool_run(s->pool, n, attention_task, &job);
        if (traffic)
            for (int t = 0; t < s->n_thread_slots; t++) traffic_add(traffic, &per_thread_traffic[t]);
        if (s->capture) s->capture(s->capture_user, l, CAPTURE_ATTENTION_OUTPUT, s->attention, n, dim);
        matmul_parallel(s->xb2, s->attention, n, &layer->wo, s->pool, traffic);
        for (int r = 0; r < n; r++) residual_add(s->x + (size_t)r * dim, s->xb2 + (size_t)r * dim, dim, traffic);

        // ---- feed-forward: x += w2 . (silu(w1 xb) * (w3 xb))
        rmsnorm(s->xb, s->x, layer->rms_ffn, n, dim, MODEL_RMS_EPS, traffic);
        if (s->capture) s->capture(s->capture_user, l, CAPTURE_FFN_INPUT, s->xb, n, dim);
        matmul_parallel(s->hidden, s->xb, n, &layer->w1, s->pool, traffic);
        matmul_parallel(s->hidden_up, s->xb, n, &layer->w3, s->pool, traffic);
        for (int r = 0; r < n; r++)
            swiglu(s->hidden + (size_t)r * hidden, s->hidden_up + (size_t)r * hidden, hidden, traffic);
        if (s->capture) s->capture(s->capture_user, l, CAPTURE_FFN_HIDDEN, s->hidden, n, hidden);
        matmul_parallel(s->xb2, s->hidden, n, &layer->w2, s->pool, traffic);
        for (int r = 0; r < n; r++) residual_add(s->x + (size_t)r * dim, s->xb2 + (size_t)r * dim, dim, traffic);
    }

    // Final norm and classifier, only for the rows whose logits are wanted
    // (gathered into xb so that the classifier streams once for all of them).
    int n_logit_rows = 0;
    for (int r = 0; r < n; r++) {
        if (!b->rows[r].wants_logits) continue;
        memcpy(s->xb2 + (size_t)n_logit_rows * dim, s->x + (size_t)r * dim, (size_t)dim * sizeof(float));
        n_logit_rows++;
    }
    if (n_logit_rows > 0) {
        rmsnorm(s->xb, s->xb2, m->rms_final, n_logit_rows, dim, MODEL_RMS_EPS, traffic);
        if (s->capture) s->capture(s->capture_user, -1, CAPTURE_CLASSIFIER_INPUT, s->xb, n_logit_rows, dim);
        matmul_parallel(logits, s->xb, n_logit_rows, &m->classifier, s->pool, traffic);
    }
    return 0;
}
