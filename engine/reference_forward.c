// The reference forward pass: llama2.c's run.c forward(), one token at a
// time, with the per-model options servelab's loaders read (RoPE base,
// partial and NeoX rotary, RMSNorm epsilon, q/k/v biases). See
// reference_forward.h for why it shares nothing with engine/forward.c.
#include "engine/reference_forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- the fp32 weight view

// The floats a matrix needs in the view: 0 when it is fp32 already (borrowed).
static uint64_t owned_floats_of(const weight_matrix* w) {
    return w->dtype == WEIGHT_F32 ? 0 : (uint64_t)w->rows * (uint64_t)w->cols;
}

static uint64_t owned_floats(const model* m) {
    uint64_t n = owned_floats_of(&m->token_embedding);
    if (m->classifier.values != m->token_embedding.values) n += owned_floats_of(&m->classifier);
    for (int l = 0; l < m->config.n_layers; l++) {
        const layer_weights* L = &m->layers[l];
        const weight_matrix* all[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w2, &L->w3};
        for (int i = 0; i < 7; i++)
            n += owned_floats_of(all[i]);
    }
    return n;
}

uint64_t reference_weights_bytes(const model* m) { return owned_floats(m) * sizeof(float); }

// Points *view at w's fp32 values, widening them into *cursor first when
// w is stored in another dtype. Checks the shape the config implies.
static int view_matrix(const float** view, const weight_matrix* w, int rows, int cols, float** cursor, const char* what,
                       int layer, const model* m, error_info* err) {
    if (w->rows != rows || w->cols != cols || !w->values) {
        char name[48];
        if (layer >= 0)
            snprintf(name, sizeof name, "layers.%d.%s", layer, what);
        else
            snprintf(name, sizeof name, "%s", what);
        return error_set(err, "%s: %s: expected a (%d, %d) matrix, found (%d, %d)%s", m->name, name, rows, cols,
                         w->rows, w->cols, w->values ? "" : " without values");
    }
    if (w->dtype == WEIGHT_F32) {
        *view = w->values;
        return 0;
    }
    for (int r = 0; r < rows; r++)
        weight_row_to_f32(*cursor + (size_t)r * (size_t)cols, w, r, NULL);
    *view = *cursor;
    *cursor += (size_t)rows * (size_t)cols;
    return 0;
}

int reference_weights_from_model(reference_weights* out, const model* m, error_info* err) {
    memset(out, 0, sizeof *out);
    const model_config* c = &m->config;
    out->config = *c;
    uint64_t n_owned = owned_floats(m);
    if (n_owned > 0) {
        out->owned = malloc((size_t)n_owned * sizeof(float));
        if (!out->owned) return error_set(err, "%s: out of memory for the reference weights", m->name);
        out->owned_bytes = n_owned * sizeof(float);
    }
    out->layers = calloc((size_t)c->n_layers, sizeof *out->layers);
    if (!out->layers) {
        reference_weights_free(out);
        return error_set(err, "%s: out of memory for the reference layers", m->name);
    }
    float* cursor = out->owned;
    int failed = view_matrix(&out->token_embedding, &m->token_embedding, c->vocab_size, c->dim, &cursor,
                             "token_embedding", -1, m, err);
    if (!failed && m->classifier.values == m->token_embedding.values)
        out->classifier = out->token_embedding;
    else if (!failed)
        failed =
            view_matrix(&out->classifier, &m->classifier, c->vocab_size, c->dim, &cursor, "classifier", -1, m, err);
    for (int l = 0; l < c->n_layers && !failed; l++) {
        const layer_weights* L = &m->layers[l];
        reference_layer* R = &out->layers[l];
        R->rms_attention = L->rms_attention, R->rms_ffn = L->rms_ffn;
        R->bq = L->bq, R->bk = L->bk, R->bv = L->bv;
        failed = view_matrix(&R->wq, &L->wq, c->dim, c->dim, &cursor, "wq", l, m, err) ||
                 view_matrix(&R->wk, &L->wk, c->kv_dim, c->dim, &cursor, "wk", l, m, err) ||
                 view_matrix(&R->wv, &L->wv, c->kv_dim, c->dim, &cursor, "wv", l, m, err) ||
                 view_matrix(&R->wo, &L->wo, c->dim, c->dim, &cursor, "wo", l, m, err) ||
                 view_matrix(&R->w1, &L->w1, c->hidden_dim, c->dim, &cursor, "w1", l, m, err) ||
                 view_matrix(&R->w2, &L->w2, c->dim, c->hidden_dim, &cursor, "w2", l, m, err) ||
                 view_matrix(&R->w3, &L->w3, c->hidden_dim, c->dim, &cursor, "w3", l, m, err);
    }
    out->rms_final = m->rms_final;
    if (failed) reference_weights_free(out);
    return failed ? -1 : 0;
}

void reference_weights_free(reference_weights* w) {
    free(w->owned);
    free(w->layers);
    memset(w, 0, sizeof *w);
}

// ---- the run: a contiguous KV cache and the activations

// x, xb, xb2, q (dim each), hb, hb2 (hidden_dim each), scores (capacity).
static uint64_t scratch_floats(const model_config* c, int capacity) {
    return 4 * (uint64_t)c->dim + 2 * (uint64_t)c->hidden_dim + (uint64_t)capacity;
}

uint64_t reference_run_bytes(const model_config* c, int capacity) {
    uint64_t cache = 2 * (uint64_t)c->n_layers * (uint64_t)capacity * (uint64_t)c->kv_dim;
    return (cache + scratch_floats(c, capacity)) * sizeof(float);
}

int reference_run_init(reference_run* run, const reference_weights* w, int capacity, error_info* err) {
    memset(run, 0, sizeof *run);
    const model_config* c = &w->config;
    if (capacity < 1 || capacity > c->max_seq_len)
        return error_set(err, "reference: %d positions asked, the model holds 1 to %d", capacity, c->max_seq_len);
    size_t cache = (size_t)c->n_layers * (size_t)capacity * (size_t)c->kv_dim;
    run->weights = w;
    run->capacity = capacity;
    run->key_cache = calloc(cache, sizeof(float));
    run->value_cache = calloc(cache, sizeof(float));
    run->scratch = calloc((size_t)scratch_floats(c, capacity), sizeof(float));
    if (!run->key_cache || !run->value_cache || !run->scratch) {
        reference_run_free(run);
        return error_set(err, "reference: out of memory for a %d-position KV cache", capacity);
    }
    return 0;
}

void reference_run_free(reference_run* run) {
    free(run->key_cache);
    free(run->value_cache);
    free(run->scratch);
    memset(run, 0, sizeof *run);
}

// ---- the operations, one loop each

// out = weight * x / sqrt(mean(x^2) + epsilon)
static void rmsnorm_ref(float* out, const float* x, const float* weight, int size, float epsilon) {
    float sum_squares = 0.0f;
    for (int i = 0; i < size; i++)
        sum_squares += x[i] * x[i];
    float inverse_rms = 1.0f / sqrtf(sum_squares / (float)size + epsilon);
    for (int i = 0; i < size; i++)
        out[i] = weight[i] * (inverse_rms * x[i]);
}

// out[o] = sum_i w[o][i] * x[i]   (w: (rows, cols) row-major)
static void matvec_ref(float* out, const float* x, const float* w, int rows, int cols) {
    for (int o = 0; o < rows; o++) {
        const float* row = w + (size_t)o * (size_t)cols;
        float sum = 0.0f;
        for (int i = 0; i < cols; i++)
            sum += row[i] * x[i];
        out[o] = sum;
    }
}

static void add_ref(float* x, const float* y, int size) {
    for (int i = 0; i < size; i++)
        x[i] += y[i];
}

// Rotates each head of vec (n_heads heads of head_dim) by position: pair p
// (p < rotary_dims / 2) turns by position * base^(-2p / rotary_dims); the
// pair is (2p, 2p + 1) (llama) or (p, p + rotary_dims / 2) (NeoX).
static void rope_ref(float* vec, int n_heads, int head_dim, int position, const model_config* c) {
    const float base = model_rope_base(c);
    const int rotary_dims = model_rope_dims(c);
    for (int h = 0; h < n_heads; h++) {
        float* head = vec + (size_t)h * (size_t)head_dim;
        for (int p = 0; p < rotary_dims / 2; p++) {
            float frequency = 1.0f / powf(base, (float)(2 * p) / (float)rotary_dims);
            float angle = (float)position * frequency;
            float cos_a = cosf(angle), sin_a = sinf(angle);
            int a = c->rope_neox ? p : 2 * p;
            int b = c->rope_neox ? p + rotary_dims / 2 : 2 * p + 1;
            float v0 = head[a], v1 = head[b];
            head[a] = v0 * cos_a - v1 * sin_a;
            head[b] = v0 * sin_a + v1 * cos_a;
        }
    }
}

// The nearest fp16 value of x, from the format's definition: 11
// significant bits for |x| >= 2^-14, a fixed step of 2^-24 below that
// (subnormals), infinity beyond the largest finite half, 65504.
static float round_to_fp16_ref(float x) {
    if (!isfinite(x) || x == 0.0f) return x;
    int exponent;
    float mantissa = frexpf(x, &exponent); // x = mantissa * 2^exponent, |mantissa| in [0.5, 1)
    float rounded =
        exponent - 1 >= -14 ? ldexpf(rintf(ldexpf(mantissa, 11)), exponent - 11) : ldexpf(rintf(ldexpf(x, 24)), -24);
    return fabsf(rounded) > 65504.0f ? copysignf(INFINITY, x) : rounded;
}

// Rounds one position's K or V (n_kv_heads heads of head_dim) as the
// cache stores it.
static void round_kv_ref(float* x, int n_kv_heads, int head_dim, reference_kv_storage storage) {
    if (storage == REFERENCE_KV_F16) {
        for (int i = 0; i < n_kv_heads * head_dim; i++)
            x[i] = round_to_fp16_ref(x[i]);
    } else if (storage == REFERENCE_KV_I8) {
        for (int h = 0; h < n_kv_heads; h++) {
            float* head = x + (size_t)h * (size_t)head_dim;
            float max_abs = 0.0f;
            for (int i = 0; i < head_dim; i++)
                max_abs = fmaxf(max_abs, fabsf(head[i]));
            float step = max_abs / 127.0f;
            for (int i = 0; i < head_dim; i++)
                head[i] = step > 0.0f ? rintf(head[i] / step) * step : 0.0f;
        }
    }
}

static void softmax_ref(float* x, int size) {
    float max = x[0];
    for (int i = 1; i < size; i++)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < size; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (int i = 0; i < size; i++)
        x[i] /= sum;
}

// ---- the forward pass

int reference_run_token(reference_run* run, int32_t token, float* logits, error_info* err) {
    const reference_weights* w = run->weights;
    const model_config* c = &w->config;
    if (token < 0 || token >= c->vocab_size)
        return error_set(err, "reference: token %d is outside the vocabulary (0 to %d)", (int)token, c->vocab_size - 1);
    if (run->n_positions >= run->capacity)
        return error_set(err, "reference: the KV cache is full (%d positions)", run->capacity);
    const int dim = c->dim, kv_dim = c->kv_dim, hidden_dim = c->hidden_dim, head_dim = c->head_dim;
    const int position = run->n_positions;
    const int queries_per_kv_head = c->n_heads / c->n_kv_heads;
    const float epsilon = model_rms_epsilon(c);
    float* x = run->scratch;          // (dim) the residual stream
    float* xb = x + dim;              // (dim) normed input, then the attention output
    float* xb2 = xb + dim;            // (dim) a block's output before the residual add
    float* q = xb2 + dim;             // (dim) queries
    float* hb = q + dim;              // (hidden_dim) gate
    float* hb2 = hb + hidden_dim;     // (hidden_dim) up
    float* scores = hb2 + hidden_dim; // (capacity) attention weights of one head

    memcpy(x, w->token_embedding + (size_t)token * (size_t)dim, (size_t)dim * sizeof(float));
    for (int l = 0; l < c->n_layers; l++) {
        const reference_layer* L = &w->layers[l];
        // ---- attention: x += wo . attention(rope(wq xb), rope(wk xb), wv xb)
        rmsnorm_ref(xb, x, L->rms_attention, dim, epsilon);
        float* key = run->key_cache + ((size_t)l * (size_t)run->capacity + (size_t)position) * (size_t)kv_dim;
        float* value = run->value_cache + ((size_t)l * (size_t)run->capacity + (size_t)position) * (size_t)kv_dim;
        matvec_ref(q, xb, L->wq, dim, dim);
        matvec_ref(key, xb, L->wk, kv_dim, dim);
        matvec_ref(value, xb, L->wv, kv_dim, dim);
        if (L->bq) add_ref(q, L->bq, dim);
        if (L->bk) add_ref(key, L->bk, kv_dim);
        if (L->bv) add_ref(value, L->bv, kv_dim);
        rope_ref(q, c->n_heads, head_dim, position, c);
        rope_ref(key, c->n_kv_heads, head_dim, position, c);
        round_kv_ref(key, c->n_kv_heads, head_dim, run->kv_storage);
        round_kv_ref(value, c->n_kv_heads, head_dim, run->kv_storage);
        for (int h = 0; h < c->n_heads; h++) {
            const float* query = q + (size_t)h * (size_t)head_dim;
            const size_t kv_offset = (size_t)(h / queries_per_kv_head) * (size_t)head_dim;
            for (int t = 0; t <= position; t++) {
                const float* k_t =
                    run->key_cache + ((size_t)l * (size_t)run->capacity + (size_t)t) * (size_t)kv_dim + kv_offset;
                float dot = 0.0f;
                for (int i = 0; i < head_dim; i++)
                    dot += query[i] * k_t[i];
                scores[t] = dot / sqrtf((float)head_dim);
            }
            softmax_ref(scores, position + 1);
            float* out = xb + (size_t)h * (size_t)head_dim;
            memset(out, 0, (size_t)head_dim * sizeof(float));
            for (int t = 0; t <= position; t++) {
                const float* v_t =
                    run->value_cache + ((size_t)l * (size_t)run->capacity + (size_t)t) * (size_t)kv_dim + kv_offset;
                for (int i = 0; i < head_dim; i++)
                    out[i] += scores[t] * v_t[i];
            }
        }
        matvec_ref(xb2, xb, L->wo, dim, dim);
        add_ref(x, xb2, dim);
        // ---- feed-forward: x += w2 . (silu(w1 xb) * (w3 xb))
        rmsnorm_ref(xb, x, L->rms_ffn, dim, epsilon);
        matvec_ref(hb, xb, L->w1, hidden_dim, dim);
        matvec_ref(hb2, xb, L->w3, hidden_dim, dim);
        for (int i = 0; i < hidden_dim; i++)
            hb[i] = hb[i] * (1.0f / (1.0f + expf(-hb[i]))) * hb2[i];
        matvec_ref(xb2, hb, L->w2, dim, hidden_dim);
        add_ref(x, xb2, dim);
    }
    run->n_positions++;
    // ---- the classifier: logits = wcls . rmsnorm(x)
    if (logits) {
        rmsnorm_ref(xb, x, w->rms_final, dim, epsilon);
        matvec_ref(logits, xb, w->classifier, c->vocab_size, dim);
    }
    return 0;
}

int reference_last_logits(const reference_weights* w, const int32_t* tokens, int n_tokens, float* logits,
                          error_info* err) {
    if (n_tokens < 1) return error_set(err, "reference: no tokens to run");
    reference_run run;
    if (reference_run_init(&run, w, n_tokens, err)) return -1;
    int failed = 0;
    for (int i = 0; i < n_tokens && !failed; i++)
        failed = reference_run_token(&run, tokens[i], i == n_tokens - 1 ? logits : NULL, err);
    reference_run_free(&run);
    return failed ? -1 : 0;
}
