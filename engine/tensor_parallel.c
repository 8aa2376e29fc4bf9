#include "engine/tensor_parallel.h"

#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "engine/fault.h"
#include "engine/links.h"
#include "engine/model_storage.h"
#include "engine/streamed_memory.h"
#include "kernels/cpu/ops.h"

// Bytes of one stored row of w's codes or values.
static size_t row_bytes(const weight_matrix* w) {
    switch (w->dtype) {
    case WEIGHT_F32: return (size_t)w->cols * sizeof(float);
    case WEIGHT_F16: return (size_t)w->cols * sizeof(uint16_t);
    case WEIGHT_I4: return ((size_t)w->cols + 1) / 2;
    case WEIGHT_Q8_0:
    case WEIGHT_I8: break;
    }
    return (size_t)w->cols;
}

static int groups_per_row(const weight_matrix* w) { return w->cols / w->group_size; }

// ---- column-parallel: a slice of output rows is a view ------------------------------------

static int view_rows(weight_matrix* out, const weight_matrix* w, int row_begin, int row_end, const char* name,
                     int layer, int n_shards, error_info* err) {
    *out = *w;
    out->rows = row_end - row_begin;
    // A shard's rows keep their tiles where it starts a group (4 rows of
    // fp16, 16 of fp32: matmul.h); elsewhere the kernels read the values.
    out->f16_tiles = matmul_f16_tiles_from_row(w, row_begin);
    out->f32_tiles = matmul_f32_tiles_from_row(w, row_begin);
    if (w->dtype == WEIGHT_Q8_0) {
        // Groups run over the flattened matrix: the slice must start and end
        // on a group boundary.
        size_t flat_begin = (size_t)row_begin * (size_t)w->cols, flat_end = (size_t)row_end * (size_t)w->cols;
        if (flat_begin % (size_t)w->group_size || flat_end % (size_t)w->group_size)
            return error_set(err,
                             "--tp %d: layers.%d.%s is Q8_0 with groups of %d values, and the shard of rows %d..%d "
                             "would cut a group",
                             n_shards, layer, name, w->group_size, row_begin, row_end - 1);
        out->values = (const int8_t*)w->values + flat_begin;
        out->scales = w->scales + flat_begin / (size_t)w->group_size;
        return 0;
    }
    out->values = (const char*)w->values + (size_t)row_begin * row_bytes(w);
    if (w->dtype == WEIGHT_I8 || w->dtype == WEIGHT_I4) {
        size_t first_group = (size_t)row_begin * (size_t)groups_per_row(w);
        out->scales_f16 = w->scales_f16 + first_group;
        if (w->zero_points) out->zero_points = w->zero_points + first_group;
    }
    return 0;
}

// ---- row-parallel: a slice of input columns is copied -------------------------------------

static int check_column_slice(const weight_matrix* w, int col_begin, int col_end, const char* name, int layer,
                              int n_shards, error_info* err) {
    if (w->dtype == WEIGHT_F32 || w->dtype == WEIGHT_F16) return 0;
    bool whole_groups = col_begin % w->group_size == 0 && col_end % w->group_size == 0;
    if (w->dtype == WEIGHT_Q8_0) whole_groups = whole_groups && w->cols % w->group_size == 0;
    if (whole_groups) return 0;
    return error_set(err,
                     "--tp %d: layers.%d.%s is %s with groups of %d columns, and the shard of columns %d..%d "
                     "would cut a group (each shard must hold whole groups)",
                     n_shards, layer, name, weight_dtype_name(w->dtype), w->group_size, col_begin, col_end - 1);
}

// Copies columns [col_begin, col_end) of w into storage taken from cursor
// (measuring only when cursor->base is NULL). The caller checked the slice.
// Copied columns outside [keep_begin, keep_end) (counted from col_begin)
// are made to multiply as 0: fp32 / fp16 values set to +0.0, the scales of
// quantized groups set to 0 (the caller checked that those run in whole
// groups). A normal slice keeps all of its columns.
static void copy_columns(weight_matrix* out, const weight_matrix* w, int col_begin, int col_end, int keep_begin,
                         int keep_end, arena_cursor* cursor) {
    *out = *w;
    out->f16_tiles = NULL; // the copied columns are row-major only
    out->f32_tiles = NULL;
    const int width = col_end - col_begin;
    out->cols = width;
    const size_t rows = (size_t)w->rows, source_row = row_bytes(w), target_row = row_bytes(out);
    unsigned char* values = arena_take(cursor, rows * target_row);
    out->values = values;
    size_t n_groups = 0, first_group = 0, source_groups = 0;
    if (w->dtype != WEIGHT_F32 && w->dtype != WEIGHT_F16) {
        n_groups = (size_t)width / (size_t)w->group_size;
        first_group = (size_t)col_begin / (size_t)w->group_size;
        source_groups = (size_t)w->cols / (size_t)w->group_size;
    }
    float* q8_scales = w->dtype == WEIGHT_Q8_0 ? arena_take(cursor, rows * n_groups * sizeof(float)) : NULL;
    bool packed = w->dtype == WEIGHT_I8 || w->dtype == WEIGHT_I4;
    uint16_t* scales_f16 = packed ? arena_take(cursor, rows * n_groups * sizeof(uint16_t)) : NULL;
    uint8_t* zero_points = packed && w->zero_points ? arena_take(cursor, rows * n_groups) : NULL;
    if (w->dtype == WEIGHT_Q8_0) out->scales = q8_scales;
    if (packed) {
        out->scales_f16 = scales_f16;
        out->zero_points = zero_points;
    }
    if (!cursor->base) return;
    const unsigned char* source = w->values;
    for (size_t r = 0; r < rows; r++) {
        const unsigned char* source_values = source + r * source_row;
        unsigned char* target = values + r * target_row;
        if (w->dtype == WEIGHT_I4) { // nibble by nibble: the slice may start at an odd column
            memset(target, 0, target_row);
            for (int j = 0; j < width; j++) {
                int col = col_begin + j;
                int nibble = (source_values[col >> 1] >> (4 * (col & 1))) & 0x0f;
                target[j >> 1] |= (unsigned char)(nibble << (4 * (j & 1)));
            }
        } else {
            size_t element = source_row / (size_t)w->cols;
            memcpy(target, source_values + (size_t)col_begin * element, target_row);
        }
        size_t from = r * source_groups + first_group, to = r * n_groups;
        if (q8_scales) memcpy(q8_scales + to, w->scales + from, n_groups * sizeof(float));
        if (scales_f16) memcpy(scales_f16 + to, w->scales_f16 + from, n_groups * sizeof(uint16_t));
        if (zero_points) memcpy(zero_points + to, w->zero_points + from, n_groups);
        for (int j = 0; j < width; j++) {
            if (j >= keep_begin && j < keep_end) continue;
            if (w->dtype == WEIGHT_F32) ((float*)target)[j] = 0.0f;
            else if (w->dtype == WEIGHT_F16) ((uint16_t*)target)[j] = 0; // +0.0 in fp16
            else if (q8_scales) q8_scales[to + (size_t)j / (size_t)w->group_size] = 0.0f;
            else if (scales_f16) scales_f16[to + (size_t)j / (size_t)w->group_size] = 0; // +0.0 in fp16
        }
    }
}

// ---- the split ------------------------------------------------------------------------------

static int gcd(int a, int b) {
    while (b) {
        int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int lcm(int a, int b) { return a / gcd(a, b) * b; }

// The smallest run of hidden features a shard boundary may fall on, so
// that no quantization group of w1, w3 (rows) or w2 (columns) spans shards.
static int hidden_unit(const model* m) {
    int unit = 1;
    const int dim = m->config.dim;
    for (int l = 0; l < m->config.n_layers; l++) {
        const layer_weights* layer = &m->layers[l];
        const weight_matrix* up[2] = {&layer->w1, &layer->w3};
        for (int k = 0; k < 2; k++)
            if (up[k]->dtype == WEIGHT_Q8_0) unit = lcm(unit, up[k]->group_size / gcd(up[k]->group_size, dim));
        if (layer->w2.dtype != WEIGHT_F32 && layer->w2.dtype != WEIGHT_F16) unit = lcm(unit, layer->w2.group_size);
    }
    return unit;
}

static int split_shapes(tp_plan* plan, const model* m, int n_shards, error_info* err) {
    const model_config* c = &m->config;
    if (n_shards < 1 || n_shards > MAX_TP_SHARDS)
        return error_set(err, "--tp: expected 1..%d shards, found %d", MAX_TP_SHARDS, n_shards);
    if (c->n_heads % n_shards || c->n_kv_heads % n_shards)
        return error_set(err,
                         "--tp %d: %s has %d query heads and %d KV heads; the shard count must divide both "
                         "(each shard owns whole heads)",
                         n_shards, m->name, c->n_heads, c->n_kv_heads);
    int unit = hidden_unit(m);
    int n_units = c->hidden_dim % unit == 0 ? c->hidden_dim / unit : 0;
    if (n_units < n_shards)
        return error_set(err,
                         "--tp %d: the %d hidden features of %s split into whole quantization groups of %d give %d "
                         "pieces, fewer than the shards",
                         n_shards, c->hidden_dim, m->name, unit, n_units);
    for (int s = 0; s < n_shards; s++) {
        tp_shard* shard = &plan->shards[s];
        shard->n_heads = c->n_heads / n_shards;
        shard->head_begin = s * shard->n_heads;
        shard->n_kv_heads = c->n_kv_heads / n_shards;
        shard->kv_head_begin = s * shard->n_kv_heads;
        // As even as the units allow: shard s gets units [s n / N, (s + 1) n / N).
        int unit_begin = (int)((long long)s * n_units / n_shards);
        int unit_end = (int)((long long)(s + 1) * n_units / n_shards);
        shard->hidden_begin = unit_begin * unit;
        shard->hidden_size = (unit_end - unit_begin) * unit;
    }
    return 0;
}

// Fills every shard's layers (storage NULL: measures the copies only).
//
// Under the tp-full-weights fault (engine/fault.h) each shard is handed the
// whole feed-forward block instead of its slice: all of w1 and w3, and a
// full-width w2 whose columns outside its slice multiply as 0. The sum over
// the shards is still the right one (the same greedy ids for fp32, fp16,
// INT8 and INT4; W8A8 quantizes its w2 input over the whole hidden row, so
// its codes differ), but every shard streams and computes
// the full w1, w3, w2 (3/4 of a layer's weight bytes in small and medium:
// 3 x dim x hidden against 2 x dim x (dim + kv_dim) for attention), the bug
// of a checkpoint loaded whole on every GPU and masked rather than split.
// The attention matrices stay split: a shard's KV heads set where its KV
// slots are, so a shard with every head would write over its neighbours'.
static int split_layers(tp_plan* plan, const model* m, arena_cursor* cursor, error_info* err) {
    const int n = plan->n_shards, head_dim = m->config.head_dim, hidden_dim = m->config.hidden_dim;
    const bool full_ffn = fault_on(FAULT_TP_FULL_WEIGHTS);
    for (int s = 0; s < n; s++) {
        const tp_shard* shard = &plan->shards[s];
        const int q_begin = shard->head_begin * head_dim, q_end = q_begin + shard->n_heads * head_dim;
        const int kv_begin = shard->kv_head_begin * head_dim, kv_end = kv_begin + shard->n_kv_heads * head_dim;
        const int h_begin = shard->hidden_begin, h_end = h_begin + shard->hidden_size;
        const int ffn_begin = full_ffn ? 0 : h_begin, ffn_end = full_ffn ? hidden_dim : h_end;
        for (int l = 0; l < m->config.n_layers; l++) {
            const layer_weights* full = &m->layers[l];
            layer_weights* part = &shard->layers[l];
            part->rms_attention = full->rms_attention;
            part->rms_ffn = full->rms_ffn;
            if (view_rows(&part->wq, &full->wq, q_begin, q_end, "wq", l, n, err) ||
                view_rows(&part->wk, &full->wk, kv_begin, kv_end, "wk", l, n, err) ||
                view_rows(&part->wv, &full->wv, kv_begin, kv_end, "wv", l, n, err) ||
                view_rows(&part->w1, &full->w1, ffn_begin, ffn_end, "w1", l, n, err) ||
                view_rows(&part->w3, &full->w3, ffn_begin, ffn_end, "w3", l, n, err) ||
                check_column_slice(&full->wo, q_begin, q_end, "wo", l, n, err) ||
                check_column_slice(&full->w2, h_begin, h_end, "w2", l, n, err))
                return -1;
            copy_columns(&part->wo, &full->wo, q_begin, q_end, 0, q_end - q_begin, cursor);
            copy_columns(&part->w2, &full->w2, ffn_begin, ffn_end, h_begin - ffn_begin, h_end - ffn_begin, cursor);
        }
    }
    return 0;
}

int tp_plan_build(tp_plan* plan, const model* m, int n_shards, error_info* err) {
    memset(plan, 0, sizeof *plan);
    if (split_shapes(plan, m, n_shards, err)) return -1;
    plan->n_shards = n_shards;
    for (int l = 0; l < m->config.n_layers; l++)
        for (int i = 0; i < 7; i++)
            plan->sharded_weight_bytes += weight_matrix_bytes(model_storage_layer_matrix(&m->layers[l], i));
    if (n_shards == 1) { // the model's own layers: nothing to copy
        plan->shards[0].layers = m->layers;
        return 0;
    }
    for (int s = 0; s < n_shards; s++) {
        plan->shards[s].layers = calloc((size_t)m->config.n_layers, sizeof(layer_weights));
        if (!plan->shards[s].layers) {
            tp_plan_free(plan);
            return error_set(err, "--tp %d: out of memory", n_shards);
        }
    }
    arena_cursor measure = {NULL, 0};
    if (split_layers(plan, m, &measure, err)) {
        tp_plan_free(plan);
        return -1;
    }
    // Each copied slice starts on a cache line, as the model's tensors do.
    size_t total = arena_total(&measure);
    plan->storage = streamed_memory_alloc(total);
    if (!plan->storage) {
        tp_plan_free(plan);
        return error_set(err, "--tp %d: out of memory for %zu bytes of row-parallel weight slices", n_shards, total);
    }
    arena_cursor cursor = {plan->storage, 0};
    split_layers(plan, m, &cursor, err); // the same checks passed while measuring
    if (fault_on(FAULT_TP_FULL_WEIGHTS)) // every shard now computes every hidden feature (split_layers)
        for (int s = 0; s < n_shards; s++) {
            plan->shards[s].hidden_begin = 0;
            plan->shards[s].hidden_size = m->config.hidden_dim;
        }
    return 0;
}

void tp_plan_free(tp_plan* plan) {
    if (plan->n_shards > 1)
        for (int s = 0; s < plan->n_shards; s++) free(plan->shards[s].layers);
    free(plan->storage);
    memset(plan, 0, sizeof *plan);
}

const layer_weights* tp_shard_layer(const tp_plan* plan, const model* m, int k, int l) {
    return plan->n_shards > 1 ? &plan->shards[k].layers[l] : &m->layers[l];
}

// ---- running the shards ---------------------------------------------------------------------

void tp_run_on_shards(thread_pool* pool, int n_shards, thread_pool_task_fn on_shard, void* context) {
    if (n_shards == 1)
        on_shard(context, 0, 0);
    else
        thread_pool_run(pool, n_shards, on_shard, context);
}

typedef struct all_reduce_job {
    float* out;
    float* x;
    const float* const* partials; // (n_shards) arrays of (n_rows, dim)
    int n_shards;
    const float* norm_weight;
    float eps;
    int n_rows, dim, rows_per_task;
    kernel_traffic* per_thread_traffic; // (thread_pool_size(pool))
} all_reduce_job;

static void all_reduce_task(void* context, int task, int thread) {
    const all_reduce_job* job = context;
    const int first = task * job->rows_per_task;
    const int n = job->n_rows - first < job->rows_per_task ? job->n_rows - first : job->rows_per_task;
    const size_t offset = (size_t)first * (size_t)job->dim;
    const float* partials[MAX_TP_SHARDS];
    for (int k = 0; k < job->n_shards; k++)
        partials[k] = job->partials[k] + offset;
    residual_rmsnorm(job->out + offset, job->x + offset, partials, job->n_shards, job->norm_weight, n, job->dim,
                     job->eps, &job->per_thread_traffic[thread]);
}

uint64_t tp_all_reduce_residual_rmsnorm(float* out, float* x, const float* const* partials, int n_shards,
                                        const float* norm_weight, int n_rows, int dim, float eps, thread_pool* pool,
                                        int rows_per_task, kernel_traffic* traffic) {
    const int n_threads = thread_pool_size(pool);
    kernel_traffic per_thread_traffic[THREAD_POOL_MAX_THREADS];
    memset(per_thread_traffic, 0, (size_t)n_threads * sizeof *per_thread_traffic);
    all_reduce_job job = {out, x, partials, n_shards, norm_weight, eps, n_rows, dim, rows_per_task, per_thread_traffic};
    thread_pool_run(pool, (n_rows + rows_per_task - 1) / rows_per_task, all_reduce_task, &job);
    if (traffic) {
        kernel_traffic summed = {0};
        for (int t = 0; t < n_threads; t++) traffic_add(&summed, &per_thread_traffic[t]);
        // Every task reads the norm's gain, but one operand counts once per
        // call: summed per task, weight bytes moved with the thread count (the
        // engine audit found a 70-row step on stories260K's shape counting
        // 8,448 bytes, 33 gains of 256 bytes, more than its tensors hold).
        summed.weight_bytes_read = norm_weight && n_rows > 0 ? (uint64_t)dim * sizeof(float) : 0;
        traffic_add(traffic, &summed);
    }
    const uint64_t message_bytes = (uint64_t)n_rows * (uint64_t)dim * sizeof(float); // fp32 partial sums
    // A ring all-reduce is a reduce-scatter then an all-gather, each sending
    // (N-1)/N of the message; the tp-allreduce-one-way fault counts the first.
    if (fault_on(FAULT_TP_ALLREDUCE_ONE_WAY)) return link_ring_allreduce_bytes(n_shards, message_bytes) / 2;
    return link_ring_allreduce_bytes(n_shards, message_bytes);
}
