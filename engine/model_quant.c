#include "engine/model_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "engine/fault.h"
#include "engine/forward.h"
#include "engine/kv_memory.h"
#include "engine/model_storage.h"
#include "engine/streamed_memory.h"
#include "kernels/cpu/fp16.h"

#define CALIBRATION_MAX_SAMPLES 512 // rows kept per layer input: enough for H and AWQ statistics
#define GPTQ_DAMP 0.01f
#define GPTQ_BLOCK 128

// ---- the spec -----------------------------------------------------------------

int model_quant_spec_parse(const char* text, model_quant_spec* out, error_info* err) {
    char copy[128];
    if (snprintf(copy, sizeof copy, "%s", text) >= (int)sizeof copy)
        return error_set(err, "--quant: '%s' is too long", text);
    char* save = NULL;
    char* part = strtok_r(copy, ":", &save);
    if (!part) return error_set(err, "--quant: expected w8a16, w4a16 or w8a8 (or w4a8), found ''");
    if (strcmp(part, "w8a16") == 0) *out = (model_quant_spec){.scheme = QUANT_W8A16, .group_size = 0, .method = QUANT_RTN, .symmetric = false};
    else if (strcmp(part, "w4a16") == 0) *out = (model_quant_spec){.scheme = QUANT_W4A16, .group_size = 64, .method = QUANT_RTN, .symmetric = false};
    else if (strcmp(part, "w8a8") == 0) *out = (model_quant_spec){.scheme = QUANT_W8A8, .group_size = 0, .method = QUANT_RTN, .symmetric = true};
    else if (strcmp(part, "w4a8") == 0) *out = (model_quant_spec){.scheme = QUANT_W4A8, .group_size = 32, .method = QUANT_RTN, .symmetric = true};
    else return error_set(err, "--quant: expected w8a16, w4a16 or w8a8 (or w4a8), found '%s'", part);
    while ((part = strtok_r(NULL, ":", &save)) != NULL) {
        char* end = NULL;
        if (strcmp(part, "channel") == 0) out->group_size = 0;
        else if (strcmp(part, "rtn") == 0) out->method = QUANT_RTN;
        else if (strcmp(part, "awq") == 0) out->method = QUANT_AWQ;
        else if (strcmp(part, "gptq") == 0) out->method = QUANT_GPTQ;
        else if (strcmp(part, "sym") == 0) out->symmetric = true;
        else if (strcmp(part, "asym") == 0) out->symmetric = false;
        else if (strcmp(part, "token") == 0) out->per_token_activations = true;
        else if (part[0] == 'g' && part[1] != '\0') {
            long group = strtol(part + 1, &end, 10);
            if (*end != '\0' || group < 1 || group > 65536)
                return error_set(err, "--quant: group '%s': expected gN with N >= 1 (e.g. g64)", part);
            out->group_size = (int)group;
        } else
            return error_set(err, "--quant: '%s' is not a group (g64), a method (rtn, awq, gptq), sym/asym or token", part);
    }
    if (out->scheme == QUANT_W8A8 && !out->symmetric)
        return error_set(err, "--quant: w8a8 multiplies int8 by int8 and needs symmetric weights (drop asym)");
    if (out->scheme == QUANT_W4A8 && !out->symmetric)
        return error_set(err, "--quant: w4a8 multiplies int4 by int8 and needs symmetric weights (drop asym)");
    if (out->per_token_activations && out->scheme != QUANT_W8A8)
        return error_set(err, "--quant: token (one activation scale per row) is a w8a8 choice");
    return 0;
}

void model_quant_spec_describe(const model_quant_spec* spec, char* out, size_t capacity) {
    const char* schemes[] = {"w8a16", "w4a16", "w8a8", "w4a8"};
    const char* methods[] = {"rtn", "awq", "gptq"};
    char group[16];
    if (spec->group_size > 0) snprintf(group, sizeof group, "g%d", spec->group_size);
    else snprintf(group, sizeof group, "per-channel");
    snprintf(out, capacity, "%s %s %s %s%s", schemes[spec->scheme], group, methods[spec->method],
             spec->symmetric ? "sym" : "asym", spec->per_token_activations ? " token" : "");
}

void model_quant_report_free(model_quant_report* report) {
    if (!report) return;
    free(report->layers);
    memset(report, 0, sizeof *report);
}

// ---- calibration: the inputs of every linear layer --------------------------------

enum { N_SITES = 4 }; // attention input, attention output, FFN input, FFN hidden

typedef struct site_samples {
    float* rows; // (capacity, width) calibration inputs
    int n_rows;
    int width;
} site_samples;

// What calibration captured: the first CALIBRATION_MAX_SAMPLES input rows
// of each linear layer's input site, per layer.
typedef struct layer_inputs {
    site_samples* sites; // (n_layers, N_SITES)
    int n_layers;
    bool out_of_memory;
} layer_inputs;

static void capture_rows(void* user, int layer, capture_site site, const float* rows, int n_rows, int width) {
    layer_inputs* captured = user;
    if (layer < 0 || (int)site >= N_SITES) return;
    site_samples* s = &captured->sites[layer * N_SITES + (int)site];
    if (!s->rows) {
        s->rows = malloc((size_t)CALIBRATION_MAX_SAMPLES * (size_t)width * sizeof(float));
        s->width = width;
        if (!s->rows) {
            captured->out_of_memory = true;
            return;
        }
    }
    int take = n_rows < CALIBRATION_MAX_SAMPLES - s->n_rows ? n_rows : CALIBRATION_MAX_SAMPLES - s->n_rows;
    if (take <= 0) return;
    memcpy(s->rows + (size_t)s->n_rows * (size_t)width, rows, (size_t)take * (size_t)width * sizeof(float));
    s->n_rows += take;
}

static void layer_inputs_free(layer_inputs* captured) {
    if (captured->sites)
        for (int i = 0; i < captured->n_layers * N_SITES; i++) free(captured->sites[i].rows);
    free(captured->sites);
    memset(captured, 0, sizeof *captured);
}

static int collect_layer_inputs(const model* m, const int32_t* const* sequences, const int* lengths, int n_sequences,
                                thread_pool* pool, layer_inputs* captured, int* n_tokens, error_info* err) {
    const model_config* c = &m->config;
    memset(captured, 0, sizeof *captured);
    captured->n_layers = c->n_layers;
    captured->sites = calloc((size_t)c->n_layers * N_SITES, sizeof *captured->sites);
    if (!captured->sites) return error_set(err, "quantize: out of memory");
    *n_tokens = 0;
    const int block_size = 16;
    int n_blocks = (c->max_seq_len + block_size - 1) / block_size;
    kv_memory kv;
    forward_state state;
    if (kv_memory_init(&kv, c, KV_F32, n_blocks, block_size, err)) return -1;
    if (forward_state_init(&state, c, c->max_seq_len, c->max_seq_len, err) || forward_state_set_pool(&state, pool, err)) {
        kv_memory_free(&kv);
        forward_state_free(&state);
        return -1;
    }
    state.capture = capture_rows;
    state.capture_user = captured;
    int32_t* table = malloc((size_t)n_blocks * sizeof *table);         // (n_blocks) identity table
    batch_row* rows = malloc((size_t)c->max_seq_len * sizeof *rows);    // (max_seq_len)
    int32_t* slots = malloc((size_t)c->max_seq_len * sizeof *slots);    // (max_seq_len) KV slot of each row
    float* logits = malloc((size_t)c->vocab_size * sizeof *logits);     // (vocab) unused output
    int status = (!table || !rows || !slots || !logits) ? error_set(err, "quantize: out of memory") : 0;
    for (int b = 0; status == 0 && b < n_blocks; b++) table[b] = b;
    const int32_t* tables[1] = {table};
    for (int q = 0; status == 0 && q < n_sequences; q++) {
        int n = lengths[q] < c->max_seq_len ? lengths[q] : c->max_seq_len;
        if (n < 1) continue;
        for (int i = 0; i < n; i++) rows[i] = (batch_row){sequences[q][i], i, 0, i == n - 1};
        forward_batch_map_slots(slots, rows, n, tables, block_size);
        forward_batch batch = {n, rows, 1, tables, slots};
        status = forward(m, &state, &kv, &batch, logits, NULL, err);
        *n_tokens += n;
    }
    if (status == 0 && captured->out_of_memory) status = error_set(err, "quantize: out of memory for calibration data");
    free(table);
    free(rows);
    free(slots);
    free(logits);
    forward_state_free(&state);
    kv_memory_free(&kv);
    return status;
}

// ---- the packed format of each matrix ------------------------------------------------

static bool scheme_is_int4(quant_weight_scheme scheme) { return scheme == QUANT_W4A16 || scheme == QUANT_W4A8; }

// The activation block of a packed matrix (weight_matrix.activation_block):
// 32 when it divides the group (the row, per channel), else the group;
// W8A8 per channel or ":token": 0, one scale per row.
static int activation_block_for(const model_quant_spec* spec, const weight_matrix* packed) {
    if (spec->scheme != QUANT_W8A8 && spec->scheme != QUANT_W4A8) return 0;
    if (spec->scheme == QUANT_W8A8 && (spec->per_token_activations || packed->group_size == packed->cols)) return 0;
    return packed->group_size % 32 == 0 ? 32 : packed->group_size;
}

// The scheme a matrix of `cols` inputs is packed with: the spec's group when
// it divides cols, else one scale per output channel.
static quant_scheme scheme_for(const model_quant_spec* spec, int cols) {
    quant_scheme s = {scheme_is_int4(spec->scheme) ? 4 : 8, spec->symmetric, QUANT_PER_CHANNEL, 0, false};
    if (spec->group_size > 0 && cols % spec->group_size == 0 && spec->group_size < cols) {
        s.granularity = QUANT_PER_GROUP;
        s.group_size = spec->group_size;
    }
    return s;
}

// ---- one matrix ----------------------------------------------------------------------------

typedef struct matrix_job {
    const char* name;
    const weight_matrix* source; // the original (dtype F32/F16/Q8_0)
    float* values;               // (rows, cols) working fp32 copy (AWQ scales folded in)
    const float* awq_scales;     // (cols) scales multiplied into the columns, or NULL
    float awq_alpha;
    const site_samples* inputs;  // calibration inputs (GPTQ), or NULL
    weight_matrix packed;        // the result
    const float* row_divisors;   // (rows) AWQ scales of the next layer divided into these rows, or NULL
} matrix_job;

static float* widen_matrix(const weight_matrix* w) {
    float* values = malloc((size_t)w->rows * (size_t)w->cols * sizeof(float)); // (rows, cols)
    if (values)
        for (int r = 0; r < w->rows; r++) weight_row_to_f32(values + (size_t)r * (size_t)w->cols, w, r, NULL);
    return values;
}

static int quantize_one(matrix_job* job, const model_quant_spec* spec, quant_method method, void* storage,
                        quant_layer_report* report, error_info* err) {
    const int rows = job->source->rows, cols = job->source->cols;
    quant_scheme scheme = scheme_for(spec, cols);
    int32_t* codes = malloc((size_t)rows * (size_t)cols * sizeof *codes);                        // (rows, cols)
    quant_params* params = malloc((size_t)quant_param_count(rows, cols, &scheme) * sizeof *params); // (sets)
    float* dequantized = malloc((size_t)rows * (size_t)cols * sizeof *dequantized);               // (rows, cols)
    int status = (!codes || !params || !dequantized) ? error_set(err, "quantize: out of memory") : 0;
    if (status == 0) {
        if (method == QUANT_GPTQ && job->inputs && job->inputs->n_rows > 0)
            status = quant_gptq(job->values, rows, cols, job->inputs->rows, job->inputs->n_rows, &scheme, GPTQ_DAMP,
                                GPTQ_BLOCK, codes, params, err);
        else
            status = quant_matrix_rtn(job->values, rows, cols, &scheme, codes, params, err);
    }
    if (status == 0) status = quant_pack(codes, params, rows, cols, &scheme, storage, &job->packed, err);
    if (status == 0) {
        job->packed.activation_bits = spec->scheme == QUANT_W8A8 || spec->scheme == QUANT_W4A8 ? 8 : 0;
        job->packed.activation_block = activation_block_for(spec, &job->packed);
        if (fault_on(FAULT_W8A8_FLOAT_ACTIVATIONS)) job->packed.activation_bits = 0; // int8 weights, float inputs
        quant_stats total = quant_matrix_stats(job->values, codes, params, rows, cols, &scheme, -1);
        // Error against the original weights: undo AWQ's column scaling.
        quant_matrix_dequantize(codes, params, rows, cols, &scheme, dequantized);
        float* original = widen_matrix(job->source);
        if (!original) status = error_set(err, "quantize: out of memory");
        double sum = 0, max_error = 0;
        for (int r = 0; original && r < rows; r++)
            for (int i = 0; i < cols; i++) {
                size_t k = (size_t)r * (size_t)cols + (size_t)i;
                double w_hat = job->awq_scales ? dequantized[k] / job->awq_scales[i] : dequantized[k];
                // Rows divided on purpose (folded AWQ scales) are compared
                // with the equally divided original.
                double w = job->row_divisors ? original[k] / job->row_divisors[r] : original[k];
                double error = fabs(w - w_hat);
                sum += error * error;
                if (error > max_error) max_error = error;
            }
        free(original);
        snprintf(report->name, sizeof report->name, "%s", job->name);
        report->scale_mean = total.scale;
        report->mse = sum / ((double)rows * cols);
        report->max_error = max_error;
        report->clipped = total.n_clipped;
        report->awq_alpha = job->awq_scales ? job->awq_alpha : -1.0f;
    }
    free(codes);
    free(params);
    free(dequantized);
    return status;
}

// Multiplies the columns of each matrix by the AWQ scales found for their
// shared input; returns the scales ((cols) floats, caller frees) or NULL.
static float* apply_awq(matrix_job* jobs, int n_jobs, const site_samples* inputs, const model_quant_spec* spec,
                        int* status, error_info* err) {
    const int cols = jobs[0].source->cols;
    if (!inputs || inputs->n_rows == 0) return NULL;
    quant_scheme scheme = scheme_for(spec, cols);
    const float* matrices[4];
    int rows[4];
    for (int j = 0; j < n_jobs; j++) {
        matrices[j] = jobs[j].values;
        rows[j] = jobs[j].source->rows;
    }
    float* scales = malloc((size_t)cols * sizeof *scales); // (cols)
    float alpha = 0;
    if (!scales) {
        *status = error_set(err, "quantize: out of memory");
        return NULL;
    }
    if (quant_awq_search(matrices, rows, n_jobs, cols, inputs->rows, inputs->n_rows, &scheme, scales, &alpha, err)) {
        free(scales);
        *status = -1;
        return NULL;
    }
    for (int j = 0; j < n_jobs; j++) {
        for (int r = 0; r < jobs[j].source->rows; r++)
            for (int i = 0; i < cols; i++) jobs[j].values[(size_t)r * (size_t)cols + (size_t)i] *= scales[i];
        jobs[j].awq_scales = scales;
        jobs[j].awq_alpha = alpha;
    }
    return scales;
}

// ---- the packed storage of the whole model ----------------------------------------------------

// The quantized model while it is built: one allocation holds the norm
// gains and every packed matrix, so that swapping it in frees every fp copy
// at once.
typedef struct packed_model {
    const weight_matrix** sources; // (n_matrices) the originals: embedding, wq..w3 of each layer,
                                   // then the classifier unless it is the embedding
    int n_matrices;
    unsigned char* storage;        // the one allocation (streamed memory)
    arena_cursor cursor;           // where the next packed matrix goes in storage
    float* norms;                  // (2 n_layers + 1, dim) attention gains, FFN gains, final gain; in storage
    size_t norm_floats;
    weight_matrix* packed;         // (n_matrices) the results, in the order of sources
    quant_layer_report* reports;   // (n_matrices)
} packed_model;

static void packed_model_free(packed_model* built) {
    free(built->sources);
    free(built->storage);
    free(built->packed);
    free(built->reports);
    memset(built, 0, sizeof *built);
}

static size_t packed_bytes_for(const model_quant_spec* spec, const weight_matrix* source) {
    quant_scheme s = scheme_for(spec, source->cols);
    return (size_t)quant_packed_bytes(source->rows, source->cols, &s);
}

// FAULT_QUANT_KEEPS_FP16: an fp16 copy of every matrix, written after the
// packed weights into the same allocation (so model_free frees it); the
// kernels never read it. kept_copy: (sum over the matrices of rows * cols).
static int keep_fp16_copy(const packed_model* built, uint16_t* kept_copy, error_info* err) {
    int widest = 0;
    for (int i = 0; i < built->n_matrices; i++)
        widest = built->sources[i]->cols > widest ? built->sources[i]->cols : widest;
    float* row = malloc((size_t)widest * sizeof *row); // (widest cols) one source row in fp32
    if (!row) return error_set(err, "quantize: out of memory");
    size_t at = 0;
    for (int i = 0; i < built->n_matrices; i++)
        for (int r = 0; r < built->sources[i]->rows; r++) {
            weight_row_to_f32(row, built->sources[i], r, NULL);
            for (int col = 0; col < built->sources[i]->cols; col++) kept_copy[at++] = fp32_to_fp16(row[col]);
        }
    free(row);
    return 0;
}

// Lists the matrices, measures and makes the one allocation, and copies the
// norm gains into it (fold_awq_scales divides them there).
static int packed_model_allocate(packed_model* built, const model* m, const model_quant_spec* spec, error_info* err) {
    const model_config* c = &m->config;
    memset(built, 0, sizeof *built);
    built->n_matrices = 7 * c->n_layers + 1 + (c->shared_classifier ? 0 : 1);
    built->sources = malloc((size_t)built->n_matrices * sizeof *built->sources);
    built->reports = calloc((size_t)built->n_matrices, sizeof *built->reports);
    built->packed = calloc((size_t)built->n_matrices, sizeof *built->packed);
    if (!built->sources || !built->reports || !built->packed) {
        packed_model_free(built);
        return error_set(err, "quantize: out of memory");
    }
    int k = 0;
    built->sources[k++] = &m->token_embedding;
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < 7; i++) built->sources[k++] = model_storage_layer_matrix(&m->layers[l], i);
    if (!c->shared_classifier) built->sources[k++] = &m->classifier;

    // Sizes first (a measuring pass), then one allocation.
    arena_cursor measure = {NULL, 0};
    built->norm_floats = (size_t)(2 * c->n_layers + 1) * (size_t)c->dim;
    arena_take(&measure, built->norm_floats * sizeof(float));
    for (int i = 0; i < built->n_matrices; i++) arena_take(&measure, packed_bytes_for(spec, built->sources[i]));
    size_t kept_copy_offset = 0, kept_copy_halves = 0;
    if (fault_on(FAULT_QUANT_KEEPS_FP16)) {
        for (int i = 0; i < built->n_matrices; i++)
            kept_copy_halves += (size_t)built->sources[i]->rows * (size_t)built->sources[i]->cols;
        arena_take(&measure, 0);
        kept_copy_offset = measure.used;
        arena_take(&measure, kept_copy_halves * sizeof(uint16_t));
    }
    built->storage = streamed_memory_alloc(arena_total(&measure));
    if (!built->storage) {
        packed_model_free(built);
        return error_set(err, "quantize: out of memory for the packed weights");
    }
    built->cursor = (arena_cursor){built->storage, 0};
    built->norms = arena_take(&built->cursor, built->norm_floats * sizeof(float));
    for (int l = 0; l < c->n_layers; l++) {
        memcpy(built->norms + (size_t)l * (size_t)c->dim, m->layers[l].rms_attention, (size_t)c->dim * sizeof(float));
        memcpy(built->norms + (size_t)(c->n_layers + l) * (size_t)c->dim, m->layers[l].rms_ffn,
               (size_t)c->dim * sizeof(float));
    }
    memcpy(built->norms + (size_t)(2 * c->n_layers) * (size_t)c->dim, m->rms_final, (size_t)c->dim * sizeof(float));
    if (kept_copy_halves > 0 && keep_fp16_copy(built, (uint16_t*)(built->storage + kept_copy_offset), err)) {
        packed_model_free(built);
        return -1;
    }
    return 0;
}

// Quantizes the job's matrix into the next bytes of the storage.
static int pack_next(packed_model* built, matrix_job* job, int index, const model_quant_spec* spec,
                     quant_method method, error_info* err) {
    void* where = arena_take(&built->cursor, packed_bytes_for(spec, job->source));
    int status = quantize_one(job, spec, method, where, &built->reports[index], err);
    built->packed[index] = job->packed;
    return status;
}

// ---- one layer ------------------------------------------------------------------------------------

// AWQ: scales each matrix's input columns and divides the producer of that
// input by the same scales, so that the layer computes the same function.
// awq_scales gets the four sets of scales it makes (caller frees).
static int fold_awq_scales(matrix_job jobs[7], const model_config* c, const model_quant_spec* spec,
                           float* gains_attention, float* gains_ffn, float* awq_scales[4], error_info* err) {
    int status = 0;
    // w2 reads silu(w1 x) * (w3 x): dividing w3's rows by s divides that input by s.
    awq_scales[0] = apply_awq(&jobs[5], 1, jobs[5].inputs, spec, &status, err);
    for (int r = 0; awq_scales[0] && r < c->hidden_dim; r++)
        for (int i = 0; i < c->dim; i++) jobs[6].values[(size_t)r * (size_t)c->dim + (size_t)i] /= awq_scales[0][r];
    jobs[6].row_divisors = awq_scales[0];
    // wo reads the attention output, a mix of wv's rows (one per channel
    // only when no query heads share a KV head).
    if (status == 0 && c->n_heads == c->n_kv_heads) {
        awq_scales[1] = apply_awq(&jobs[3], 1, jobs[3].inputs, spec, &status, err);
        for (int r = 0; awq_scales[1] && r < c->kv_dim; r++)
            for (int i = 0; i < c->dim; i++) jobs[2].values[(size_t)r * (size_t)c->dim + (size_t)i] /= awq_scales[1][r];
        jobs[2].row_divisors = awq_scales[1];
    }
    // wq, wk, wv share the attention RMSNorm output; w1, w3 the FFN one.
    if (status == 0) awq_scales[2] = apply_awq(&jobs[0], 3, jobs[0].inputs, spec, &status, err);
    for (int i = 0; awq_scales[2] && i < c->dim; i++) gains_attention[i] /= awq_scales[2][i];
    matrix_job ffn_pair[2] = {jobs[4], jobs[6]};
    if (status == 0) awq_scales[3] = apply_awq(ffn_pair, 2, jobs[4].inputs, spec, &status, err);
    jobs[4].awq_scales = ffn_pair[0].awq_scales;
    jobs[4].awq_alpha = ffn_pair[0].awq_alpha;
    jobs[6].awq_scales = ffn_pair[1].awq_scales;
    jobs[6].awq_alpha = ffn_pair[1].awq_alpha;
    for (int i = 0; awq_scales[3] && i < c->dim; i++) gains_ffn[i] /= awq_scales[3][i];
    return status;
}

// Quantizes layer l's seven matrices with the spec's method; `sites` holds
// its captured inputs (N_SITES of them), or NULL for RTN.
static int quantize_layer(packed_model* built, const model_config* c, int l, const model_quant_spec* spec,
                          const site_samples* sites, error_info* err) {
    static const char* const kind_names[7] = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"};
    int status = 0;
    matrix_job jobs[7];
    char names[7][32];
    for (int i = 0; i < 7; i++) {
        snprintf(names[i], sizeof names[i], "layers.%d.%s", l, kind_names[i]);
        const weight_matrix* source = built->sources[1 + 7 * l + i];
        jobs[i] = (matrix_job){names[i], source, widen_matrix(source), NULL, -1, NULL, {0}, NULL};
        if (!jobs[i].values) status = error_set(err, "quantize: out of memory");
    }
    if (sites) {
        jobs[0].inputs = jobs[1].inputs = jobs[2].inputs = &sites[CAPTURE_ATTENTION_INPUT];
        jobs[3].inputs = &sites[CAPTURE_ATTENTION_OUTPUT];
        jobs[4].inputs = jobs[6].inputs = &sites[CAPTURE_FFN_INPUT];
        jobs[5].inputs = &sites[CAPTURE_FFN_HIDDEN];
    }
    float* awq_scales[4] = {NULL, NULL, NULL, NULL};
    if (status == 0 && spec->method == QUANT_AWQ)
        status = fold_awq_scales(jobs, c, spec, built->norms + (size_t)l * (size_t)c->dim,
                                 built->norms + (size_t)(c->n_layers + l) * (size_t)c->dim, awq_scales, err);
    for (int i = 0; status == 0 && i < 7; i++)
        status = pack_next(built, &jobs[i], 1 + 7 * l + i, spec, spec->method, err);
    for (int i = 0; i < 7; i++) free(jobs[i].values);
    for (int i = 0; i < 4; i++) free(awq_scales[i]);
    return status;
}

// ---- the whole model -------------------------------------------------------------------------

// Swaps the packed weights into m; the old storage (every fp copy) goes.
// Returns the model's new weight bytes.
static uint64_t install_packed(model* m, packed_model* built, const model_quant_spec* spec) {
    const model_config* c = &m->config;
    free(m->storage);
    m->storage = built->storage;
    built->storage = NULL;
    free(m->tile_storage); // no fp16 or fp32 matrix is left to read them
    m->tile_storage = NULL;
    m->tile_bytes = 0;
    m->dtype = scheme_is_int4(spec->scheme) ? WEIGHT_I4 : WEIGHT_I8;
    m->token_embedding = built->packed[0];
    uint64_t bytes = built->norm_floats * sizeof(float) + weight_matrix_bytes(&built->packed[0]);
    for (int l = 0; l < c->n_layers; l++) {
        layer_weights* layer = &m->layers[l];
        layer->rms_attention = built->norms + (size_t)l * (size_t)c->dim;
        layer->rms_ffn = built->norms + (size_t)(c->n_layers + l) * (size_t)c->dim;
        weight_matrix* targets[7] = {&layer->wq, &layer->wk, &layer->wv, &layer->wo, &layer->w1, &layer->w2, &layer->w3};
        for (int i = 0; i < 7; i++) {
            *targets[i] = built->packed[1 + 7 * l + i];
            bytes += weight_matrix_bytes(targets[i]);
        }
    }
    m->rms_final = built->norms + (size_t)(2 * c->n_layers) * (size_t)c->dim;
    if (c->shared_classifier) m->classifier = m->token_embedding;
    else {
        m->classifier = built->packed[built->n_matrices - 1];
        bytes += weight_matrix_bytes(&m->classifier);
    }
    m->weight_bytes = bytes;
    return bytes;
}

int model_quantize(model* m, const model_quant_spec* spec, const int32_t* const* sequences, const int* lengths,
                   int n_sequences, thread_pool* pool, model_quant_report* report, error_info* err) {
    const model_config* c = &m->config;
    if (m->dtype == WEIGHT_I8 || m->dtype == WEIGHT_I4) return error_set(err, "quantize: %s is already quantized", m->name);
    if ((spec->scheme == QUANT_W8A8 || spec->scheme == QUANT_W4A8) && !spec->symmetric)
        return error_set(err, "quantize: %s needs symmetric weights", spec->scheme == QUANT_W8A8 ? "w8a8" : "w4a8");
    bool needs_calibration = spec->method != QUANT_RTN;
    if (needs_calibration && n_sequences < 1)
        return error_set(err, "quantize: %s needs calibration sequences", spec->method == QUANT_AWQ ? "awq" : "gptq");

    // 1. Calibration (AWQ, GPTQ): run the sequences and keep every layer's inputs.
    layer_inputs captured = {0};
    int n_calibration_tokens = 0;
    if (needs_calibration &&
        collect_layer_inputs(m, sequences, lengths, n_sequences, pool, &captured, &n_calibration_tokens, err)) {
        layer_inputs_free(&captured);
        return -1;
    }
    // 2. The new storage, with the norm gains copied in.
    packed_model built;
    if (packed_model_allocate(&built, m, spec, err)) {
        layer_inputs_free(&captured);
        return -1;
    }
    // 3. The embedding (and a separate classifier): always RTN.
    int status = 0;
    for (int i = 0; status == 0 && i < built.n_matrices; i++) {
        if (i >= 1 && i <= 7 * c->n_layers) continue; // layer matrices below
        const weight_matrix* source = built.sources[i];
        const char* name = i == 0 ? "token_embedding" : "classifier";
        matrix_job job = {name, source, widen_matrix(source), NULL, -1, NULL, {0}, NULL};
        status = job.values ? pack_next(&built, &job, i, spec, QUANT_RTN, err)
                            : error_set(err, "quantize: out of memory");
        free(job.values);
    }
    // 4. Layer by layer, with the spec's method.
    for (int l = 0; status == 0 && l < c->n_layers; l++) {
        if (spec->keep_going && !spec->keep_going(spec->keep_going_user)) {
            status = error_set(err, "quantize: stopped by the caller before layer %d", l);
            break;
        }
        status = quantize_layer(&built, c, l, spec, captured.sites ? &captured.sites[l * N_SITES] : NULL, err);
    }
    layer_inputs_free(&captured);
    if (status != 0) {
        packed_model_free(&built);
        return -1;
    }
    // 5. Swap the packed weights in.
    uint64_t before = m->weight_bytes;
    uint64_t after = install_packed(m, &built, spec);
    if (report) {
        report->layers = built.reports;
        built.reports = NULL;
        report->n_layers = built.n_matrices;
        report->weight_bytes_before = before;
        report->weight_bytes_after = after;
        report->n_calibration_tokens = n_calibration_tokens;
    }
    packed_model_free(&built);
    return 0;
}
