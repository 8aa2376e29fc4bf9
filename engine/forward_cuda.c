#include "engine/forward_cuda.h"

#include <stdbool.h>
#include <stdlib.h>

#ifdef SERVELAB_CUDA

#include "kernels/cuda/cuda_backend.h"

typedef struct cuda_layer {
    float* rms_attention; // device (dim)
    float* rms_ffn;       // device (dim)
    cuda_weights wq, wk, wv, wo, w1, w2, w3;
} cuda_layer;

struct forward_cuda {
    cuda_context* gpu;
    model_config config;
    int max_rows;
    cuda_weights embedding;  // (vocab_size, dim)
    cuda_weights classifier; // (vocab_size, dim); a copy of embedding's pointers when shared
    int classifier_is_embedding;
    cuda_layer* layers; // (n_layers)
    float* rms_final;   // device (dim)
    // The KV pool: one allocation, regions for keys, values (and int8
    // scales) of every layer, each laid out as engine/kv_memory.h says.
    void* kv_pool;
    cuda_kv_layer* kv_layers; // (n_layers) views into kv_pool
    int kv_block_size, kv_n_blocks;
    kv_dtype kv_dtype;
    size_t kv_layer_bytes;       // one layer's keys (or values): n_blocks x block_size x kv_dim elements
    size_t kv_layer_scale_bytes; // KV_I8: one layer's key (or value) scales; else 0
    // Activations, device, row-major floats.
    float* x;         // (max_rows, dim) residual stream
    float* xb;        // (max_rows, dim) normalised input of a sublayer
    float* xb2;       // (max_rows, dim) sublayer output
    float* query;     // (max_rows, dim)
    float* key;       // (max_rows, kv_dim)
    float* value;     // (max_rows, kv_dim)
    float* attention; // (max_rows, dim)
    float* hidden;    // (max_rows, hidden_dim)
    float* hidden_up; // (max_rows, hidden_dim)
    float* logits;    // (max_rows, vocab_size)
    // The batch's metadata, staged on the host and uploaded in one copy:
    // slots int64 (n_rows), then int32 arrays: tokens, positions, context
    // lengths, table offsets (n_rows each), logit rows (<= n_rows), tables.
    void* metadata;           // device
    unsigned char* staging;   // host
    size_t metadata_capacity; // bytes of each
};

static int upload_floats(forward_cuda* fc, float** device, const float* host, int count, error_info* err) {
    if (cuda_device_alloc(fc->gpu, (void**)device, (size_t)count * sizeof(float), "norm weights", err)) return -1;
    return cuda_copy_to_device(fc->gpu, *device, host, (size_t)count * sizeof(float), err);
}

static int alloc_rows(forward_cuda* fc, float** device, int width, error_info* err) {
    return cuda_device_alloc(fc->gpu, (void**)device, (size_t)fc->max_rows * (size_t)width * sizeof(float),
                             "activations", err);
}

static size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

static int upload_model(forward_cuda* fc, const model* m, error_info* err) {
    const model_config* c = &m->config;
    if (cuda_weights_upload(fc->gpu, &fc->embedding, &m->token_embedding, err)) return -1;
    fc->classifier_is_embedding = m->classifier.values == m->token_embedding.values;
    if (fc->classifier_is_embedding)
        fc->classifier = fc->embedding;
    else if (cuda_weights_upload(fc->gpu, &fc->classifier, &m->classifier, err))
        return -1;
    if (upload_floats(fc, &fc->rms_final, m->rms_final, c->dim, err)) return -1;
    fc->layers = calloc((size_t)c->n_layers, sizeof *fc->layers);
    if (!fc->layers) return error_set(err, "forward_cuda: out of host memory");
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights* host = &m->layers[l];
        cuda_layer* layer = &fc->layers[l];
        if (upload_floats(fc, &layer->rms_attention, host->rms_attention, c->dim, err) ||
            upload_floats(fc, &layer->rms_ffn, host->rms_ffn, c->dim, err) ||
            cuda_weights_upload(fc->gpu, &layer->wq, &host->wq, err) ||
            cuda_weights_upload(fc->gpu, &layer->wk, &host->wk, err) ||
            cuda_weights_upload(fc->gpu, &layer->wv, &host->wv, err) ||
            cuda_weights_upload(fc->gpu, &layer->wo, &host->wo, err) ||
            cuda_weights_upload(fc->gpu, &layer->w1, &host->w1, err) ||
            cuda_weights_upload(fc->gpu, &layer->w2, &host->w2, err) ||
            cuda_weights_upload(fc->gpu, &layer->w3, &host->w3, err))
            return -1;
    }
    return 0;
}

static int make_kv_pool(forward_cuda* fc, const kv_memory* kv, error_info* err) {
    const model_config* c = &fc->config;
    fc->kv_block_size = kv->block_size;
    fc->kv_n_blocks = kv->n_blocks;
    fc->kv_dtype = kv->dtype;
    const size_t n_slots = (size_t)kv->n_blocks * (size_t)kv->block_size;
    fc->kv_layer_bytes = n_slots * (size_t)c->kv_dim * (size_t)kv_dtype_bytes(kv->dtype);
    fc->kv_layer_scale_bytes = kv->dtype == KV_I8 ? n_slots * (size_t)c->n_kv_heads * sizeof(float) : 0;
    const size_t region = round_up_256(fc->kv_layer_bytes * (size_t)c->n_layers);
    const size_t scale_region = round_up_256(fc->kv_layer_scale_bytes * (size_t)c->n_layers);
    if (cuda_device_alloc(fc->gpu, &fc->kv_pool, 2 * region + 2 * scale_region, "KV pool", err)) return -1;
    // Zeroed, as the host pool is: never-written slots hold 0, not NaN.
    if (cuda_memset_device(fc->gpu, fc->kv_pool, 0, 2 * region + 2 * scale_region, err)) return -1;
    fc->kv_layers = calloc((size_t)c->n_layers, sizeof *fc->kv_layers);
    if (!fc->kv_layers) return error_set(err, "forward_cuda: out of host memory");
    unsigned char* base = fc->kv_pool;
    for (int l = 0; l < c->n_layers; l++) {
        cuda_kv_layer* layer = &fc->kv_layers[l];
        layer->dtype = kv->dtype;
        layer->keys = base + (size_t)l * fc->kv_layer_bytes;
        layer->values = base + region + (size_t)l * fc->kv_layer_bytes;
        if (kv->dtype == KV_I8) {
            layer->key_scales = (float*)(base + 2 * region + (size_t)l * fc->kv_layer_scale_bytes);
            layer->value_scales = (float*)(base + 2 * region + scale_region + (size_t)l * fc->kv_layer_scale_bytes);
        }
        layer->n_kv_heads = c->n_kv_heads;
        layer->head_dim = c->head_dim;
        layer->block_size = kv->block_size;
    }
    return 0;
}

// The CUDA kernels (kernels/cuda/cuda_ops.cu) do llama2.c's math only:
// RoPE base 10000 on adjacent pairs over the whole head, RMSNorm epsilon
// 1e-5, no biases. A model asking for anything else (a GGUF qwen2, a
// Llama 3 with base 500000) is refused rather than run with other numbers.
static int check_cuda_math(const model* m, error_info* err) {
    const model_config* c = &m->config;
    if (m->layers && m->layers[0].bq)
        return error_set(err, "--backend cuda: %s has q/k/v biases, which the CUDA path does not add (use the CPU)",
                         m->name);
    if (c->rope_neox)
        return error_set(err, "--backend cuda: %s uses NEOX RoPE pairs, the CUDA path adjacent ones only (use the CPU)",
                         m->name);
    if (model_rope_base(c) != MODEL_ROPE_BASE || model_rope_dims(c) != c->head_dim)
        return error_set(err,
                         "--backend cuda: %s uses RoPE base %g over %d of %d dims, the CUDA path base %g over "
                         "the whole head (use the CPU)",
                         m->name, (double)model_rope_base(c), model_rope_dims(c), c->head_dim, (double)MODEL_ROPE_BASE);
    if (model_rms_epsilon(c) != MODEL_RMS_EPS)
        return error_set(err, "--backend cuda: %s uses RMSNorm epsilon %g, the CUDA path %g (use the CPU)", m->name,
                         (double)model_rms_epsilon(c), (double)MODEL_RMS_EPS);
    // Group-wise int8 activations (W4A8, W8A8 gN, GGUF Q8_0/Q4_0) have no
    // CUDA kernel: run there they would silently become W4A16 or per-token W8A8.
    if (m->layers && m->layers[0].wq.activation_bits == 8 && m->layers[0].wq.activation_block > 0)
        return error_set(err, "--backend cuda: %s multiplies int8 activations in blocks of %d (W4A8/W8A8 gN), which "
                         "the CUDA kernels do not (use the CPU, or w4a16 / w8a8 per token)",
                         m->name, m->layers[0].wq.activation_block);
    return 0;
}

int forward_cuda_init(forward_cuda** out, const model* m, const kv_memory* kv, int max_rows, error_info* err) {
    *out = NULL;
    if (check_cuda_math(m, err)) return -1;
    forward_cuda* fc = calloc(1, sizeof *fc);
    if (!fc) return error_set(err, "forward_cuda: out of host memory");
    fc->config = m->config;
    fc->max_rows = max_rows;
    const model_config* c = &m->config;
    int failed = cuda_context_create(&fc->gpu, err);
    if (!failed) failed = upload_model(fc, m, err);
    if (!failed) failed = make_kv_pool(fc, kv, err);
    if (!failed)
        failed = alloc_rows(fc, &fc->x, c->dim, err) || alloc_rows(fc, &fc->xb, c->dim, err) ||
                 alloc_rows(fc, &fc->xb2, c->dim, err) || alloc_rows(fc, &fc->query, c->dim, err) ||
                 alloc_rows(fc, &fc->key, c->kv_dim, err) || alloc_rows(fc, &fc->value, c->kv_dim, err) ||
                 alloc_rows(fc, &fc->attention, c->dim, err) || alloc_rows(fc, &fc->hidden, c->hidden_dim, err) ||
                 alloc_rows(fc, &fc->hidden_up, c->hidden_dim, err) || alloc_rows(fc, &fc->logits, c->vocab_size, err);
    if (failed) {
        forward_cuda_free(fc);
        return -1;
    }
    *out = fc;
    return 0;
}

void forward_cuda_free(forward_cuda* fc) {
    if (!fc) return;
    if (fc->gpu) cuda_synchronize(fc->gpu, NULL);
    if (fc->layers) {
        for (int l = 0; l < fc->config.n_layers; l++) {
            cuda_layer* layer = &fc->layers[l];
            cuda_device_free(layer->rms_attention);
            cuda_device_free(layer->rms_ffn);
            cuda_weights* all[] = {&layer->wq, &layer->wk, &layer->wv, &layer->wo, &layer->w1, &layer->w2, &layer->w3};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                cuda_weights_free(all[i]);
        }
        free(fc->layers);
    }
    if (!fc->classifier_is_embedding) cuda_weights_free(&fc->classifier);
    cuda_weights_free(&fc->embedding);
    cuda_device_free(fc->rms_final);
    cuda_device_free(fc->kv_pool);
    free(fc->kv_layers);
    float* activations[] = {fc->x,     fc->xb,        fc->xb2,    fc->query,     fc->key,
                            fc->value, fc->attention, fc->hidden, fc->hidden_up, fc->logits};
    for (size_t i = 0; i < sizeof activations / sizeof activations[0]; i++)
        cuda_device_free(activations[i]);
    cuda_device_free(fc->metadata);
    free(fc->staging);
    cuda_context_destroy(fc->gpu);
    free(fc);
}

// ---- one step -----------------------------------------------------------------

// The block manager's copy-on-write copies of this step, on the device
// pool: whole blocks (the slots past the copied fill are overwritten
// before they are read, as on the host).
static int replay_block_copies(forward_cuda* fc, const block_event* events, int n_events, error_info* err) {
    const size_t block_slots = (size_t)fc->kv_block_size;
    const size_t block_bytes = block_slots * (size_t)fc->config.kv_dim * (size_t)kv_dtype_bytes(fc->kv_dtype);
    const size_t block_scale_bytes = block_slots * (size_t)fc->config.n_kv_heads * sizeof(float);
    for (int i = 0; i < n_events; i++) {
        if (events[i].kind != BLOCK_COPY) continue;
        const int source = events[i].block, destination = events[i].other_block;
        if (source < 0 || source >= fc->kv_n_blocks || destination < 0 || destination >= fc->kv_n_blocks)
            return error_set(err, "forward_cuda: copy-on-write of block %d to %d outside the pool of %d", source,
                             destination, fc->kv_n_blocks);
        for (int l = 0; l < fc->config.n_layers; l++) {
            const cuda_kv_layer* layer = &fc->kv_layers[l];
            unsigned char* keys = layer->keys;
            unsigned char* values = layer->values;
            if (cuda_copy_on_device(fc->gpu, keys + (size_t)destination * block_bytes,
                                    keys + (size_t)source * block_bytes, block_bytes, err) ||
                cuda_copy_on_device(fc->gpu, values + (size_t)destination * block_bytes,
                                    values + (size_t)source * block_bytes, block_bytes, err))
                return -1;
            if (fc->kv_dtype == KV_I8) {
                unsigned char* key_scales = (unsigned char*)layer->key_scales;
                unsigned char* value_scales = (unsigned char*)layer->value_scales;
                if (cuda_copy_on_device(fc->gpu, key_scales + (size_t)destination * block_scale_bytes,
                                        key_scales + (size_t)source * block_scale_bytes, block_scale_bytes, err) ||
                    cuda_copy_on_device(fc->gpu, value_scales + (size_t)destination * block_scale_bytes,
                                        value_scales + (size_t)source * block_scale_bytes, block_scale_bytes, err))
                    return -1;
            }
        }
    }
    return 0;
}

// Where each metadata array lives inside the staging / device buffers.
typedef struct batch_metadata {
    int64_t* slots;           // (n_rows) KV slot each row writes
    int32_t* tokens;          // (n_rows)
    int32_t* positions;       // (n_rows)
    int32_t* context_lengths; // (n_rows) position + 1
    int32_t* table_offsets;   // (n_rows) where the row's sequence table starts in tables
    int32_t* logit_rows;      // (n_logit_rows) rows whose logits are wanted
    int32_t* tables;          // the sequences' block tables, concatenated
} batch_metadata;

static batch_metadata metadata_at(unsigned char* base, int n_rows, int n_logit_rows) {
    batch_metadata at;
    at.slots = (int64_t*)base;
    at.tokens = (int32_t*)(base + (size_t)n_rows * sizeof(int64_t));
    at.positions = at.tokens + n_rows;
    at.context_lengths = at.positions + n_rows;
    at.table_offsets = at.context_lengths + n_rows;
    at.logit_rows = at.table_offsets + n_rows;
    at.tables = at.logit_rows + n_logit_rows;
    return at;
}

// error_set for stage_batch, which returns 0 bytes on failure.
#define staging_failed(...) (error_set(__VA_ARGS__), (size_t)0)

// Checks each row's token, position, sequence and slot; records in needed
// (n_sequences) the blocks each sequence needs, up to its last row's position.
static int check_rows(const forward_cuda* fc, const forward_batch* b, int* needed, int* n_logit_rows,
                      int* max_context, error_info* err) {
    const model_config* c = &fc->config;
    int n_logits = 0, longest = 0;
    for (int r = 0; r < b->n_rows; r++) {
        const batch_row* row = &b->rows[r];
        if (row->token < 0 || row->token >= c->vocab_size || row->position < 0 || row->position >= c->max_seq_len ||
            row->sequence < 0 || row->sequence >= b->n_sequences)
            return error_set(err, "forward_cuda: row %d: token %d, position %d or sequence %d out of range", r,
                             row->token, row->position, row->sequence);
        if (b->slot_mapping[r] < 0 || b->slot_mapping[r] >= (int64_t)fc->kv_n_blocks * fc->kv_block_size)
            return error_set(err, "forward_cuda: row %d: slot %d outside the pool", r, (int)b->slot_mapping[r]);
        int blocks = row->position / fc->kv_block_size + 1;
        if (blocks > needed[row->sequence]) needed[row->sequence] = blocks;
        if (row->position + 1 > longest) longest = row->position + 1;
        n_logits += row->wants_logits;
    }
    *n_logit_rows = n_logits;
    *max_context = longest;
    return 0;
}

// Bytes of the metadata: the slots, four int32 per row, the logit rows and
// the block tables (needed[s] entries for each sequence s).
static size_t metadata_bytes(const forward_batch* b, int n_logit_rows, const int* needed) {
    int table_entries = 0;
    for (int s = 0; s < b->n_sequences; s++)
        table_entries += needed[s];
    return (size_t)b->n_rows * sizeof(int64_t) +
           ((size_t)4 * (size_t)b->n_rows + (size_t)n_logit_rows + (size_t)table_entries) * sizeof(int32_t);
}

// Grows the host staging and device metadata buffers to twice the bytes
// asked for, so that slowly growing batches do not reallocate every step.
static int reserve_metadata(forward_cuda* fc, size_t bytes, error_info* err) {
    if (bytes <= fc->metadata_capacity) return 0;
    size_t capacity = bytes * 2;
    unsigned char* staging = realloc(fc->staging, capacity);
    if (!staging) return error_set(err, "forward_cuda: out of host memory");
    fc->staging = staging;
    cuda_device_free(fc->metadata);
    fc->metadata = NULL;
    fc->metadata_capacity = 0;
    if (cuda_device_alloc(fc->gpu, &fc->metadata, capacity, "batch metadata", err)) return -1;
    fc->metadata_capacity = capacity;
    return 0;
}

// Concatenates the sequences' block tables (needed[s] entries of each) into
// at->tables and records in offsets (n_sequences) where each one starts.
static int stage_block_tables(const forward_cuda* fc, const forward_batch* b, const int* needed, int* offsets,
                              const batch_metadata* at, error_info* err) {
    for (int s = 0, used = 0; s < b->n_sequences; s++) {
        offsets[s] = used;
        for (int k = 0; k < needed[s]; k++) {
            int32_t block = b->block_tables[s][k];
            if (block < 0 || block >= fc->kv_n_blocks)
                return error_set(err, "forward_cuda: sequence %d: block %d outside the pool of %d", s, block,
                                 fc->kv_n_blocks);
            at->tables[used + k] = block;
        }
        used += needed[s];
    }
    return 0;
}

static void stage_rows(const forward_batch* b, const int* offsets, const batch_metadata* at) {
    for (int r = 0, logit = 0; r < b->n_rows; r++) {
        const batch_row* row = &b->rows[r];
        at->slots[r] = b->slot_mapping[r];
        at->tokens[r] = row->token;
        at->positions[r] = row->position;
        at->context_lengths[r] = row->position + 1;
        at->table_offsets[r] = offsets[row->sequence];
        if (row->wants_logits) at->logit_rows[logit++] = r;
    }
}

// Checks the batch as forward() does and fills the staging buffer; sets
// the counts and the longest context. Returns bytes to upload, or 0 on error.
static size_t stage_batch(forward_cuda* fc, const forward_batch* b, int* n_logit_rows, int* max_context,
                          error_info* err) {
    if (b->n_rows <= 0 || b->n_rows > fc->max_rows)
        return staging_failed(err, "forward_cuda: batch of %d rows, expected 1..%d", b->n_rows, fc->max_rows);
    if (!b->slot_mapping) return staging_failed(err, "forward_cuda: the batch has no slot mapping");
    size_t n_sequence_slots = (size_t)(b->n_sequences > 0 ? b->n_sequences : 1);
    int* needed = calloc(n_sequence_slots, sizeof *needed); // (n_sequences) blocks each sequence needs
    int* offsets = NULL;                            // (n_sequences) where its table starts
    if (!needed) return staging_failed(err, "forward_cuda: out of host memory");
    size_t bytes = 0, staged_bytes;
    int n_logits = 0, longest = 0;
    batch_metadata at;
    if (check_rows(fc, b, needed, &n_logits, &longest, err)) goto done;
    staged_bytes = metadata_bytes(b, n_logits, needed);
    if (reserve_metadata(fc, staged_bytes, err)) goto done;
    at = metadata_at(fc->staging, b->n_rows, n_logits);
    offsets = calloc(n_sequence_slots, sizeof *offsets);
    if (!offsets) {
        error_set(err, "forward_cuda: out of host memory");
        goto done;
    }
    if (stage_block_tables(fc, b, needed, offsets, &at, err)) goto done;
    stage_rows(b, offsets, &at);
    *n_logit_rows = n_logits;
    *max_context = longest;
    bytes = staged_bytes;
done:
    free(needed);
    free(offsets);
    return bytes;
}

// The layers, in engine/forward.c's order and with its fusions, so that
// the traffic figures are the CPU's: the residual add after each sublayer
// is fused with the RMSNorm that follows it (after the last layer: the
// final norm when every row wants logits, else no norm).
static int run_layers(forward_cuda* fc, int n, const batch_metadata* device, const batch_metadata* host,
                      int max_context, bool every_row_logits, kernel_traffic* traffic, error_info* err) {
    const model_config* c = &fc->config;
    cuda_context* gpu = fc->gpu;
    const int dim = c->dim;
    if (cuda_embed_rows(gpu, fc->x, device->tokens, n, &fc->embedding, traffic, err) ||
        cuda_rmsnorm(gpu, fc->xb, fc->x, fc->layers[0].rms_attention, n, dim, MODEL_RMS_EPS, traffic, err))
        return -1;
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer* layer = &fc->layers[l];
        // ---- attention: x += wo . attention(rope(wq xb), rope(wk xb), wv xb); xb = rmsnorm(x)
        if (cuda_matmul(gpu, fc->query, fc->xb, n, &layer->wq, traffic, err) ||
            cuda_matmul(gpu, fc->key, fc->xb, n, &layer->wk, traffic, err) ||
            cuda_matmul(gpu, fc->value, fc->xb, n, &layer->wv, traffic, err) ||
            cuda_rope(gpu, fc->query, fc->key, device->positions, n, c->n_heads, c->n_kv_heads, c->head_dim, dim,
                      c->kv_dim, traffic, err) ||
            cuda_kv_write(gpu, &fc->kv_layers[l], fc->key, fc->value, c->kv_dim, device->slots, n, traffic, err) ||
            cuda_paged_attention(gpu, fc->attention, fc->query, dim, &fc->kv_layers[l], device->tables,
                                 device->table_offsets, device->context_lengths, n, max_context, c->n_heads,
                                 host->context_lengths, traffic, err) ||
            cuda_matmul(gpu, fc->xb2, fc->attention, n, &layer->wo, traffic, err) ||
            cuda_residual_rmsnorm(gpu, fc->xb, fc->x, fc->xb2, layer->rms_ffn, n, dim, MODEL_RMS_EPS, traffic, err))
            return -1;
        // ---- feed-forward: x += w2 . (silu(w1 xb) * (w3 xb)); xb = rmsnorm(x) for what follows
        if (cuda_matmul(gpu, fc->hidden, fc->xb, n, &layer->w1, traffic, err) ||
            cuda_matmul(gpu, fc->hidden_up, fc->xb, n, &layer->w3, traffic, err) ||
            cuda_swiglu(gpu, fc->hidden, fc->hidden_up, (int64_t)n * c->hidden_dim, traffic, err) ||
            cuda_matmul(gpu, fc->xb2, fc->hidden, n, &layer->w2, traffic, err))
            return -1;
        const float* next_norm = l + 1 < c->n_layers ? fc->layers[l + 1].rms_attention
                                 : every_row_logits  ? fc->rms_final
                                                     : NULL;
        if (next_norm
                ? cuda_residual_rmsnorm(gpu, fc->xb, fc->x, fc->xb2, next_norm, n, dim, MODEL_RMS_EPS, traffic, err)
                : cuda_residual_add(gpu, fc->x, fc->xb2, (int64_t)n * dim, traffic, err))
            return -1;
    }
    return 0;
}

int forward_cuda_run(forward_cuda* fc, const model* m, const forward_batch* batch, const block_event* events,
                     int n_events, float* logits, kernel_traffic* traffic, uint64_t* device_ns, error_info* err) {
    if (m->config.dim != fc->config.dim || m->config.n_layers != fc->config.n_layers)
        return error_set(err, "forward_cuda: the model differs from the one uploaded");
    int n_logit_rows = 0, max_context = 0;
    const size_t bytes = stage_batch(fc, batch, &n_logit_rows, &max_context, err);
    if (bytes == 0) return -1;
    if (replay_block_copies(fc, events, n_events, err)) return -1;
    if (cuda_copy_to_device(fc->gpu, fc->metadata, fc->staging, bytes, err)) return -1;
    const batch_metadata host = metadata_at(fc->staging, batch->n_rows, n_logit_rows);
    const batch_metadata device = metadata_at(fc->metadata, batch->n_rows, n_logit_rows);
    const model_config* c = &fc->config;
    double elapsed_ms = 0.0;
    const bool every_row_logits = n_logit_rows == batch->n_rows;
    if (cuda_timer_start(fc->gpu, err) ||
        run_layers(fc, batch->n_rows, &device, &host, max_context, every_row_logits, traffic, err))
        return -1;
    // Final norm (unless the last residual add did it for every row) and
    // the classifier for the rows whose logits are wanted, gathered first
    // so that the classifier streams once for all of them.
    if (n_logit_rows > 0 && !every_row_logits &&
        (cuda_gather_rows(fc->gpu, fc->xb2, fc->x, device.logit_rows, n_logit_rows, c->dim, err) ||
         cuda_rmsnorm(fc->gpu, fc->xb, fc->xb2, fc->rms_final, n_logit_rows, c->dim, MODEL_RMS_EPS, traffic, err)))
        return -1;
    if (n_logit_rows > 0 && cuda_matmul(fc->gpu, fc->logits, fc->xb, n_logit_rows, &fc->classifier, traffic, err))
        return -1;
    if (cuda_timer_stop(fc->gpu, &elapsed_ms, err)) return -1;
    if (device_ns) *device_ns = (uint64_t)(elapsed_ms * 1e6);
    return cuda_copy_to_host(fc->gpu, logits, fc->logits, (size_t)n_logit_rows * (size_t)c->vocab_size * sizeof(float),
                             err);
}

#else // built without CUDA: every entry point says so

int forward_cuda_init(forward_cuda** out, const model* m, const kv_memory* kv, int max_rows, error_info* err) {
    (void)m, (void)kv, (void)max_rows;
    *out = NULL;
    return error_set(err, "--backend cuda: built without CUDA (nvcc was not found; rebuild with CUDA=1)");
}

void forward_cuda_free(forward_cuda* fc) { (void)fc; }

int forward_cuda_run(forward_cuda* fc, const model* m, const forward_batch* batch, const block_event* events,
                     int n_events, float* logits, kernel_traffic* traffic, uint64_t* device_ns, error_info* err) {
    (void)fc, (void)m, (void)batch, (void)events, (void)n_events, (void)logits, (void)traffic, (void)device_ns;
    return error_set(err, "--backend cuda: built without CUDA");
}

#endif
