#include "engine/model_storage.h"

#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "engine/streamed_memory.h"

static size_t dtype_bytes(weight_dtype dtype) { return dtype == WEIGHT_F32 ? 4 : dtype == WEIGHT_F16 ? 2 : 1; }

static void bind_matrix(arena_cursor* cursor, weight_matrix* w, weight_dtype dtype, int rows, int cols,
                        int group_size) {
    size_t count = (size_t)rows * (size_t)cols;
    w->dtype = dtype;
    w->rows = rows;
    w->cols = cols;
    w->group_size = dtype == WEIGHT_Q8_0 ? group_size : 0;
    w->values = arena_take(cursor, count * dtype_bytes(dtype));
    w->scales = dtype == WEIGHT_Q8_0 ? arena_take(cursor, count / (size_t)group_size * sizeof(float)) : NULL;
}

// Points every tensor of m into cursor's block (or only measures it).
static void bind_all(arena_cursor* cursor, model* m, weight_dtype dtype, int group_size) {
    const model_config* c = &m->config;
    bind_matrix(cursor, &m->token_embedding, dtype, c->vocab_size, c->dim, group_size);
    for (int l = 0; l < c->n_layers; l++) {
        layer_weights* layer = &m->layers[l];
        layer->rms_attention = arena_take(cursor, (size_t)c->dim * sizeof(float));
        layer->rms_ffn = arena_take(cursor, (size_t)c->dim * sizeof(float));
        bind_matrix(cursor, &layer->wq, dtype, c->dim, c->dim, group_size);
        bind_matrix(cursor, &layer->wk, dtype, c->kv_dim, c->dim, group_size);
        bind_matrix(cursor, &layer->wv, dtype, c->kv_dim, c->dim, group_size);
        bind_matrix(cursor, &layer->wo, dtype, c->dim, c->dim, group_size);
        bind_matrix(cursor, &layer->w1, dtype, c->hidden_dim, c->dim, group_size);
        bind_matrix(cursor, &layer->w2, dtype, c->dim, c->hidden_dim, group_size);
        bind_matrix(cursor, &layer->w3, dtype, c->hidden_dim, c->dim, group_size);
    }
    m->rms_final = arena_take(cursor, (size_t)c->dim * sizeof(float));
    if (c->shared_classifier)
        m->classifier = m->token_embedding;
    else
        bind_matrix(cursor, &m->classifier, dtype, c->vocab_size, c->dim, group_size);
}

int model_storage_allocate(model* out, const model_config* config, weight_dtype dtype, int group_size,
                           error_info* err) {
    memset(out, 0, sizeof *out);
    out->config = *config;
    out->dtype = dtype;
    out->layers = calloc((size_t)config->n_layers, sizeof *out->layers);
    if (!out->layers) return error_set(err, "out of memory for %d layers", config->n_layers);

    arena_cursor measure = {NULL, 0};
    bind_all(&measure, out, dtype, group_size);
    size_t total = arena_total(&measure);
    out->storage = streamed_memory_alloc(total); // every tensor starts on its own cache line
    if (!out->storage) {
        free(out->layers);
        out->layers = NULL;
        return error_set(err, "out of memory: the weights need %zu bytes", total);
    }
    arena_cursor cursor = {out->storage, 0};
    bind_all(&cursor, out, dtype, group_size);

    // Exact accounting: every matrix once (a shared classifier is the
    // embedding, not a second copy) plus the fp32 norm gains.
    const model_config* c = config;
    uint64_t norms = (uint64_t)(2 * c->n_layers + 1) * (uint64_t)c->dim;
    uint64_t bytes = weight_matrix_bytes(&out->token_embedding) + norms * sizeof(float);
    uint64_t params = (uint64_t)c->vocab_size * (uint64_t)c->dim + norms;
    for (int l = 0; l < c->n_layers; l++) {
        for (int i = 0; i < 7; i++) {
            const weight_matrix* w = model_storage_layer_matrix(&out->layers[l], i);
            bytes += weight_matrix_bytes(w);
            params += (uint64_t)w->rows * (uint64_t)w->cols;
        }
    }
    if (!c->shared_classifier) {
        bytes += weight_matrix_bytes(&out->classifier);
        params += (uint64_t)c->vocab_size * (uint64_t)c->dim;
    }
    out->weight_bytes = bytes;
    out->n_parameters = params;
    return 0;
}

// The matrices a forward pass multiplies with: n_layers * 7 + 1 (the classifier last).
static weight_matrix* multiplied_matrix(model* m, int index) {
    if (index == 7 * m->config.n_layers) return &m->classifier;
    return (weight_matrix*)model_storage_layer_matrix(&m->layers[index / 7], index % 7);
}

// fp16: 4 rows x 16 columns per step; fp32: 16 rows per column (matmul.h).
static size_t tile_bytes_of(const weight_matrix* w) {
    return w->dtype == WEIGHT_F16 ? matmul_f16_tile_halves(w->rows, w->cols) * sizeof(uint16_t)
                                  : matmul_f32_tile_floats(w->rows, w->cols) * sizeof(float);
}

void model_storage_build_tiles(model* m) {
    const bool f16 = m->dtype == WEIGHT_F16 && matmul_f16_tiles_used();
    const bool f32 = m->dtype == WEIGHT_F32 && matmul_f32_tiles_used();
    if ((!f16 && !f32) || m->tile_storage) return;
    const int n_matrices = 7 * m->config.n_layers + 1;
    // Each matrix's tiles are a multiple of 64 bytes (fp16: 4 rows x 16
    // halves a step; fp32: 16 floats a column), so each starts aligned.
    size_t total = 0;
    for (int k = 0; k < n_matrices; k++) {
        const weight_matrix* w = multiplied_matrix(m, k);
        if (w->dtype == m->dtype) total += tile_bytes_of(w);
    }
    unsigned char* tiles = streamed_memory_alloc(total);
    if (!tiles) return; // the row-major kernels then: slower, same bits
    size_t offset = 0;
    for (int k = 0; k < n_matrices; k++) {
        weight_matrix* w = multiplied_matrix(m, k);
        if (w->dtype != m->dtype) continue; // a GGUF may mix types (an F16 file's norms aside, Q8_0 + F16)
        if (f16) {
            matmul_f16_fill_tiles((uint16_t*)(tiles + offset), w);
            w->f16_tiles = (const uint16_t*)(tiles + offset);
        } else {
            matmul_f32_fill_tiles((float*)(tiles + offset), w);
            w->f32_tiles = (const float*)(tiles + offset);
        }
        offset += tile_bytes_of(w);
    }
    m->tile_storage = tiles;
    m->tile_bytes = (uint64_t)total;
}

const weight_matrix* model_storage_layer_matrix(const layer_weights* layer, int index) {
    const weight_matrix* matrices[7] = {&layer->wq, &layer->wk, &layer->wv, &layer->wo,
                                        &layer->w1, &layer->w2, &layer->w3};
    return matrices[index];
}
