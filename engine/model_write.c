#include "engine/model_write.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model_storage.h"
#include "engine/output_file.h"

typedef struct checkpoint_writer {
    FILE* file;
    bool failed;
    float* row; // (widest matrix row) scratch for widening one row to fp32
} checkpoint_writer;

static void write_bytes(checkpoint_writer* w, const void* bytes, size_t size) {
    if (!w->failed && size > 0 && fwrite(bytes, 1, size, w->file) != size) w->failed = true;
}

static void write_int32(checkpoint_writer* w, int32_t value) { write_bytes(w, &value, sizeof value); }

static void write_fp32_matrix(checkpoint_writer* w, const weight_matrix* m) {
    for (int r = 0; r < m->rows; r++) {
        weight_row_to_f32(w->row, m, r, NULL);
        write_bytes(w, w->row, (size_t)m->cols * sizeof(float));
    }
}

// Q8_0 over the flattened matrix: all int8 values, then all group scales.
static int write_q8_matrix(checkpoint_writer* w, const weight_matrix* m, int group_size) {
    size_t count = (size_t)m->rows * (size_t)m->cols;
    float* values = malloc(count * sizeof(float));                // (rows * cols)
    int8_t* quantized = malloc(count);                            // (rows * cols)
    float* scales = malloc(count / (size_t)group_size * sizeof(float)); // (groups)
    if (!values || !quantized || !scales) {
        free(values);
        free(quantized);
        free(scales);
        return -1;
    }
    for (int r = 0; r < m->rows; r++) weight_row_to_f32(values + (size_t)r * (size_t)m->cols, m, r, NULL);
    for (size_t g = 0; g < count / (size_t)group_size; g++) {
        const float* group = values + g * (size_t)group_size;
        float max_abs = 0.0f;
        for (int i = 0; i < group_size; i++) max_abs = fmaxf(max_abs, fabsf(group[i]));
        float scale = max_abs > 0.0f ? max_abs / 127.0f : 1.0f;
        scales[g] = scale;
        for (int i = 0; i < group_size; i++) {
            float q = nearbyintf(group[i] / scale);
            quantized[g * (size_t)group_size + (size_t)i] = (int8_t)fmaxf(-127.0f, fminf(127.0f, q));
        }
    }
    write_bytes(w, quantized, count);
    write_bytes(w, scales, count / (size_t)group_size * sizeof(float));
    free(values);
    free(quantized);
    free(scales);
    return 0;
}

static int write_matrix(checkpoint_writer* w, const weight_matrix* m, model_format format, int group_size) {
    if (format == MODEL_FORMAT_EXPORT_V2) return write_q8_matrix(w, m, group_size);
    write_fp32_matrix(w, m);
    return 0;
}

static void write_norm(checkpoint_writer* w, const float* gains, int dim) {
    write_bytes(w, gains, (size_t)dim * sizeof(float));
}

static int write_body(checkpoint_writer* w, const model* m, model_format format, int group_size) {
    const model_config* c = &m->config;
    const int L = c->n_layers;
    int32_t header[7] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                         c->shared_classifier || format != MODEL_FORMAT_LEGACY ? c->vocab_size : -c->vocab_size,
                         c->max_seq_len};
    if (format == MODEL_FORMAT_LEGACY) {
        for (int i = 0; i < 7; i++) write_int32(w, header[i]);
        write_fp32_matrix(w, &m->token_embedding);
        for (int l = 0; l < L; l++) write_norm(w, m->layers[l].rms_attention, c->dim);
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < L; l++) write_fp32_matrix(w, model_storage_layer_matrix(&m->layers[l], k));
        for (int l = 0; l < L; l++) write_norm(w, m->layers[l].rms_ffn, c->dim);
        for (int k = 4; k < 7; k++)
            for (int l = 0; l < L; l++) write_fp32_matrix(w, model_storage_layer_matrix(&m->layers[l], k));
        write_norm(w, m->rms_final, c->dim);
        // The two RoPE tables llama2.c once stored (cos, then sin); readers skip them.
        for (int table = 0; table < 2; table++)
            for (int p = 0; p < c->max_seq_len; p++)
                for (int i = 0; i < c->head_dim / 2; i++) {
                    float angle = (float)p / powf(10000.0f, (float)(2 * i) / (float)c->head_dim);
                    float value = table == 0 ? cosf(angle) : sinf(angle);
                    write_bytes(w, &value, sizeof value);
                }
        if (!c->shared_classifier) write_fp32_matrix(w, &m->classifier);
        return 0;
    }
    unsigned char header_bytes[MODEL_EXPORT_HEADER_BYTES] = {0};
    uint32_t magic = MODEL_EXPORT_MAGIC;
    int32_t version = format == MODEL_FORMAT_EXPORT_V1 ? 1 : 2;
    memcpy(header_bytes, &magic, 4);
    memcpy(header_bytes + 4, &version, 4);
    memcpy(header_bytes + 8, header, sizeof header);
    header_bytes[36] = c->shared_classifier ? 1 : 0;
    if (format == MODEL_FORMAT_EXPORT_V2) memcpy(header_bytes + 37, &group_size, 4);
    write_bytes(w, header_bytes, sizeof header_bytes);
    for (int l = 0; l < L; l++) write_norm(w, m->layers[l].rms_attention, c->dim);
    for (int l = 0; l < L; l++) write_norm(w, m->layers[l].rms_ffn, c->dim);
    write_norm(w, m->rms_final, c->dim);
    if (write_matrix(w, &m->token_embedding, format, group_size)) return -1;
    for (int k = 0; k < 7; k++)
        for (int l = 0; l < L; l++)
            if (write_matrix(w, model_storage_layer_matrix(&m->layers[l], k), format, group_size)) return -1;
    if (!c->shared_classifier && write_matrix(w, &m->classifier, format, group_size)) return -1;
    return 0;
}

int model_write_checkpoint(const model* m, const char* path, model_format format, int group_size, error_info* err) {
    const model_config* c = &m->config;
    if (format == MODEL_FORMAT_SYNTHETIC) return error_set(err, "%s: cannot write a synthetic format", path);
    if (format == MODEL_FORMAT_EXPORT_V2 && (group_size <= 0 || c->dim % group_size != 0))
        return error_set(err, "%s: group_size: expected a positive divisor of dim %d, found %d", path, c->dim,
                         group_size);
    output_file out;
    if (output_file_open(&out, path, err)) return -1;
    checkpoint_writer w = {out.stream, false, NULL};
    int widest = c->hidden_dim > c->dim ? c->hidden_dim : c->dim;
    w.row = malloc((size_t)widest * sizeof(float));
    int status = w.row ? write_body(&w, m, format, group_size) : -1;
    free(w.row);
    if (output_file_commit(&out, status != 0 || w.failed, err)) return -1;
    return 0;
}
