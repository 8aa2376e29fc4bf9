#include "engine/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "engine/model_storage.h"
#include "kernels/cpu/fp16.h"

// Limits far above any real model (Llama-3-405B: dim 16384, 126 layers,
// vocab 128256) and low enough that every size product fits in 64 bits.
#define MODEL_MAX_DIM (1 << 17)
#define MODEL_MAX_LAYERS 4096
#define MODEL_MAX_HEADS 4096
#define MODEL_MAX_VOCAB (1 << 22)
#define MODEL_MAX_SEQ_LEN (1 << 22)

// Legacy checkpoints start with 7 int32 fields: dim, hidden_dim, n_layers,
// n_heads, n_kv_heads, vocab_size (negative: classifier not shared), seq_len.
#define LEGACY_HEADER_BYTES (7 * 4)

// A layer's matrices in model_storage_layer_matrix order, as messages and
// model_matrix_by_name spell them.
static const char* const LAYER_MATRIX_NAMES[7] = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"};

static const char* base_name(const char* path) {
    const char* slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static int check_range(const char* source, const char* field, int value, int max_value, error_info* err) {
    if (value <= 0) return error_set(err, "%s: %s: expected a positive value, found %d", source, field, value);
    if (value > max_value)
        return error_set(err, "%s: %s: expected at most %d, found %d (not a llama2.c checkpoint?)", source, field,
                         max_value, value);
    return 0;
}

int model_config_validate(model_config* c, const char* source, error_info* err) {
    if (check_range(source, "dim", c->dim, MODEL_MAX_DIM, err) ||
        check_range(source, "hidden_dim", c->hidden_dim, 4 * MODEL_MAX_DIM, err) ||
        check_range(source, "n_layers", c->n_layers, MODEL_MAX_LAYERS, err) ||
        check_range(source, "n_heads", c->n_heads, MODEL_MAX_HEADS, err) ||
        check_range(source, "n_kv_heads", c->n_kv_heads, MODEL_MAX_HEADS, err) ||
        check_range(source, "vocab_size", c->vocab_size, MODEL_MAX_VOCAB, err) ||
        check_range(source, "max_seq_len", c->max_seq_len, MODEL_MAX_SEQ_LEN, err))
        return -1;
    // A request needs one prompt token (at least BOS) and room for one new one.
    if (c->max_seq_len < 2)
        return error_set(err, "%s: max_seq_len: the model's context is %d token: no room for a prompt and an answer "
                              "(expected at least 2)",
                         source, c->max_seq_len);
    if (c->dim % c->n_heads != 0)
        return error_set(err, "%s: n_heads: expected a divisor of dim %d, found %d", source, c->dim, c->n_heads);
    if (c->n_heads % c->n_kv_heads != 0)
        return error_set(err, "%s: n_kv_heads: expected a divisor of n_heads %d, found %d", source, c->n_heads,
                         c->n_kv_heads);
    c->head_dim = c->dim / c->n_heads;
    if (c->head_dim % 2 != 0)
        return error_set(err, "%s: head size: expected an even dim / n_heads for rotary pairs, found %d / %d = %d",
                         source, c->dim, c->n_heads, c->head_dim);
    c->kv_dim = c->n_kv_heads * c->head_dim;
    if (c->rope_dims < 0 || c->rope_dims % 2 != 0 || c->rope_dims > c->head_dim)
        return error_set(err, "%s: rope dimensions: expected an even count of at most head_dim %d, found %d", source,
                         c->head_dim, c->rope_dims);
    if (!(c->rope_base >= 0.0f) || !(c->rms_epsilon >= 0.0f) || c->rope_base > 1e30f || c->rms_epsilon > 1.0f)
        return error_set(err, "%s: rope base %g / rms epsilon %g: expected a finite base and an epsilon in [0, 1]",
                         source, (double)c->rope_base, (double)c->rms_epsilon);
    return 0;
}

// ---- the file's tensor stream ---------------------------------------------

typedef struct tensor_reader {
    const unsigned char* bytes; // the whole file
    size_t offset;              // next unread byte
    // Non-finite fp32 values (NaN, +-Inf) seen in the tensors read so far:
    // how many in all, in how many tensors, and the first such tensor.
    uint64_t nonfinite_values;
    int nonfinite_tensors;
    char first_nonfinite[48];
    uint64_t first_nonfinite_count;
} tensor_reader;

// fp32 values in the file whose exponent bits are all ones: NaN or +-Inf.
// Bit tests over bytes already in memory, so the compiler vectorises it: a
// second pass over what was just read, cheap next to reading the file.
static uint64_t count_nonfinite_fp32(const unsigned char* src, size_t count) {
    uint64_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, src + i * sizeof bits, sizeof bits);
        bad += (bits & 0x7f800000u) == 0x7f800000u;
    }
    return bad;
}

// Counts the non-finite values of one tensor's fp32 data in the file.
// kind: "wq", "rms_attention", ... with its layer, or a model-level tensor
// ("token_embedding", "rms_final", "classifier") when layer < 0.
static void check_finite(tensor_reader* reader, const unsigned char* src, size_t count, const char* kind, int layer) {
    uint64_t bad = count_nonfinite_fp32(src, count);
    if (bad == 0) return;
    if (reader->nonfinite_tensors++ == 0) {
        if (layer >= 0) snprintf(reader->first_nonfinite, sizeof reader->first_nonfinite, "layers.%d.%s", layer, kind);
        else snprintf(reader->first_nonfinite, sizeof reader->first_nonfinite, "%s", kind);
        reader->first_nonfinite_count = bad;
    }
    reader->nonfinite_values += bad;
}

// Fills dst (a matrix in the model's dtype) from n fp32 values in the file.
static void read_fp32_matrix(tensor_reader* reader, const weight_matrix* dst, const char* kind, int layer) {
    size_t count = (size_t)dst->rows * (size_t)dst->cols;
    const unsigned char* src = reader->bytes + reader->offset;
    check_finite(reader, src, count, kind, layer);
    if (dst->dtype == WEIGHT_F32) {
        memcpy((void*)dst->values, src, count * sizeof(float));
    } else { // WEIGHT_F16
        uint16_t* out = (uint16_t*)dst->values;
        for (size_t i = 0; i < count; i++) {
            float value;
            memcpy(&value, src + i * sizeof(float), sizeof value);
            out[i] = fp32_to_fp16(value);
        }
    }
    reader->offset += count * sizeof(float);
}

// Fills dst from a Q8_0 tensor in the file: int8 values, then fp32 scales.
static void read_q8_matrix(tensor_reader* reader, const weight_matrix* dst, int group_size, const char* kind,
                           int layer) {
    size_t count = (size_t)dst->rows * (size_t)dst->cols;
    const int8_t* values = (const int8_t*)(reader->bytes + reader->offset);
    const unsigned char* scale_bytes = reader->bytes + reader->offset + count;
    check_finite(reader, scale_bytes, count / (size_t)group_size, kind, layer); // int8 values are always finite
    if (dst->dtype == WEIGHT_Q8_0) {
        memcpy((void*)dst->values, values, count);
        memcpy((void*)dst->scales, scale_bytes, count / (size_t)group_size * sizeof(float));
    } else { // widened on request (--dtype fp32|fp16)
        for (size_t i = 0; i < count; i++) {
            float scale;
            memcpy(&scale, scale_bytes + i / (size_t)group_size * sizeof(float), sizeof scale);
            float value = (float)values[i] * scale;
            if (dst->dtype == WEIGHT_F32)
                ((float*)dst->values)[i] = value;
            else
                ((uint16_t*)dst->values)[i] = fp32_to_fp16(value);
        }
    }
    reader->offset += count + count / (size_t)group_size * sizeof(float);
}

static void read_fp32_vector(tensor_reader* reader, const float* dst, size_t count, const char* kind, int layer) {
    check_finite(reader, reader->bytes + reader->offset, count, kind, layer);
    memcpy((void*)dst, reader->bytes + reader->offset, count * sizeof(float));
    reader->offset += count * sizeof(float);
}

// ---- expected sizes, with overflow checks ----------------------------------

typedef struct size_sum {
    uint64_t bytes;
    bool overflow;
} size_sum;

static void add_product(size_sum* sum, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc) ||
        __builtin_add_overflow(sum->bytes, abc, &sum->bytes))
        sum->overflow = true;
}

// Bytes the tensors take in the file: fp32 (legacy, v1) or Q8_0 (v2).
static size_sum expected_payload_bytes(const model_config* c, model_format format, int group_size) {
    size_sum sum = {0, false};
    uint64_t L = (uint64_t)c->n_layers, dim = (uint64_t)c->dim, kv = (uint64_t)c->kv_dim,
             hidden = (uint64_t)c->hidden_dim, vocab = (uint64_t)c->vocab_size;
    add_product(&sum, 2 * L + 1, dim, 4); // the RMSNorm gains, always fp32
    // Matrix values: embedding, wq, wk, wv, wo, w1, w2, w3, and the classifier.
    uint64_t matrix_values[5] = {vocab * dim, L * dim * dim * 2, L * kv * dim * 2, L * hidden * dim * 3,
                                 c->shared_classifier ? 0 : vocab * dim};
    for (int i = 0; i < 5; i++) {
        if (format == MODEL_FORMAT_EXPORT_V2)
            add_product(&sum, matrix_values[i], 1, 1); // int8 values; scales counted below
        else
            add_product(&sum, matrix_values[i], 4, 1);
    }
    if (format == MODEL_FORMAT_EXPORT_V2) {
        uint64_t groups = (vocab * dim + L * dim * dim * 2 + L * kv * dim * 2 + L * hidden * dim * 3 +
                           (c->shared_classifier ? 0 : vocab * dim)) /
                          (uint64_t)group_size;
        add_product(&sum, groups, 4, 1);
    }
    if (format == MODEL_FORMAT_LEGACY) // two unused RoPE tables of seq_len * head_dim / 2 floats
        add_product(&sum, (uint64_t)c->max_seq_len, (uint64_t)c->head_dim, 4);
    if (format != MODEL_FORMAT_LEGACY) add_product(&sum, 1, 1, MODEL_EXPORT_HEADER_BYTES);
    else add_product(&sum, 1, 1, LEGACY_HEADER_BYTES);
    return sum;
}

static int32_t read_int32_le(const unsigned char* p) {
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t out;
    memcpy(&out, &v, sizeof out);
    return out;
}

static void config_from_ints(model_config* c, const unsigned char* p) {
    c->dim = read_int32_le(p);
    c->hidden_dim = read_int32_le(p + 4);
    c->n_layers = read_int32_le(p + 8);
    c->n_heads = read_int32_le(p + 12);
    c->n_kv_heads = read_int32_le(p + 16);
    c->vocab_size = read_int32_le(p + 20);
    c->max_seq_len = read_int32_le(p + 24);
}

// Reads the header (up to 256 bytes) and decides the format and config.
static int parse_header(const char* name, const unsigned char* header, size_t file_size, model_config* c,
                        model_format* format, int* group_size, error_info* err) {
    memset(c, 0, sizeof *c);
    *group_size = 0;
    if (file_size == 0) return error_set(err, "%s: empty file: expected a llama2.c checkpoint", name);
    if (file_size >= 4 && memcmp(header, "GGUF", 4) == 0)
        return error_set(err, "%s: magic: GGUF files are not supported; expected a llama2.c checkpoint", name);
    if (file_size >= 4 && (uint32_t)read_int32_le(header) == MODEL_EXPORT_MAGIC) {
        if (file_size < MODEL_EXPORT_HEADER_BYTES)
            return error_set(err, "%s: truncated: expected a %d-byte header, found %zu bytes", name,
                             MODEL_EXPORT_HEADER_BYTES, file_size);
        int version = read_int32_le(header + 4);
        if (version != 1 && version != 2)
            return error_set(err, "%s: version: expected 1 (fp32) or 2 (Q8_0), found %d", name, version);
        config_from_ints(c, header + 8);
        if (header[36] > 1)
            return error_set(err, "%s: shared_classifier: expected 0 or 1, found %d", name, header[36]);
        c->shared_classifier = header[36] == 1;
        *format = version == 1 ? MODEL_FORMAT_EXPORT_V1 : MODEL_FORMAT_EXPORT_V2;
        if (model_config_validate(c, name, err)) return -1;
        if (version == 2) {
            *group_size = read_int32_le(header + 37);
            // Divides dim, so every matrix (whose element count is a multiple
            // of dim) holds whole groups, as llama2.c's exporter ensures.
            if (*group_size <= 0 || c->dim % *group_size != 0)
                return error_set(err, "%s: group_size: expected a positive divisor of dim %d, found %d", name, c->dim,
                                 *group_size);
        }
        return 0;
    }
    if (file_size < LEGACY_HEADER_BYTES)
        return error_set(err, "%s: truncated: expected a %d-byte header, found %zu bytes", name, LEGACY_HEADER_BYTES,
                         file_size);
    config_from_ints(c, header);
    *format = MODEL_FORMAT_LEGACY;
    // A negative vocab_size marks an unshared classifier (llama2.c's convention).
    c->shared_classifier = c->vocab_size > 0;
    if (c->vocab_size < 0 && c->vocab_size != INT32_MIN) c->vocab_size = -c->vocab_size;
    return model_config_validate(c, name, err);
}

static int read_whole_file(const char* path, const char* name, unsigned char** out, size_t* out_size,
                           error_info* err) {
    FILE* file = fopen(path, "rb");
    if (!file) return error_set(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(file), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(file);
        return error_set(err, "%s: not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    unsigned char* bytes = malloc(size > 0 ? size : 1);
    if (!bytes) {
        fclose(file);
        return error_set(err, "%s: out of memory reading %zu bytes", name, size);
    }
    if (size > 0 && fread(bytes, 1, size, file) != size) {
        free(bytes);
        fclose(file);
        return error_set(err, "%s: read error", name);
    }
    fclose(file);
    *out = bytes;
    *out_size = size;
    return 0;
}

// A checkpoint read whole into memory, with what its header says.
typedef struct checkpoint_file {
    unsigned char* bytes; // (size) the whole file
    size_t size;          // bytes
    model_config config;
    model_format format;
    int group_size; // export v2: weights per Q8_0 scale; else 0
} checkpoint_file;

// The file's size must be exactly what the header's shapes imply.
static int check_file_size(const char* name, const checkpoint_file* file, error_info* err) {
    const model_config* c = &file->config;
    size_sum expected = expected_payload_bytes(c, file->format, file->group_size);
    if (expected.overflow || expected.bytes > (uint64_t)SIZE_MAX / 2)
        return error_set(err, "%s: size: the header's dimensions imply more than 2^63 bytes (dim %d, layers %d, vocab %d)",
                         name, c->dim, c->n_layers, c->vocab_size);
    if (expected.bytes != (uint64_t)file->size)
        return error_set(err, "%s: %s: expected %llu bytes, found %zu", name,
                         (uint64_t)file->size < expected.bytes ? "truncated" : "size mismatch",
                         (unsigned long long)expected.bytes, file->size);
    return 0;
}

// Reads path whole, parses its header and checks its size; on failure nothing stays allocated.
static int read_checkpoint(const char* path, const char* name, checkpoint_file* file, error_info* err) {
    *file = (checkpoint_file){.format = MODEL_FORMAT_LEGACY};
    if (read_whole_file(path, name, &file->bytes, &file->size, err)) return -1;
    if (parse_header(name, file->bytes, file->size, &file->config, &file->format, &file->group_size, err) ||
        check_file_size(name, file, err)) {
        free(file->bytes);
        return -1;
    }
    return 0;
}

// Legacy order: embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3,
// rms_final, two RoPE tables, classifier when not shared.
static void read_legacy_tensors(tensor_reader* reader, model* out, const model_config* c) {
    const int L = c->n_layers;
    read_fp32_matrix(reader, &out->token_embedding, "token_embedding", -1);
    for (int l = 0; l < L; l++)
        read_fp32_vector(reader, out->layers[l].rms_attention, (size_t)c->dim, "rms_attention", l);
    for (int kind = 0; kind < 4; kind++) // wq wk wv wo
        for (int l = 0; l < L; l++)
            read_fp32_matrix(reader, model_storage_layer_matrix(&out->layers[l], kind), LAYER_MATRIX_NAMES[kind], l);
    for (int l = 0; l < L; l++) read_fp32_vector(reader, out->layers[l].rms_ffn, (size_t)c->dim, "rms_ffn", l);
    for (int kind = 4; kind < 7; kind++) // w1 w2 w3
        for (int l = 0; l < L; l++)
            read_fp32_matrix(reader, model_storage_layer_matrix(&out->layers[l], kind), LAYER_MATRIX_NAMES[kind], l);
    read_fp32_vector(reader, out->rms_final, (size_t)c->dim, "rms_final", -1);
    reader->offset += (size_t)c->max_seq_len * (size_t)c->head_dim * sizeof(float);
    if (!c->shared_classifier) read_fp32_matrix(reader, &out->classifier, "classifier", -1);
}

// Export v1 and v2: the norms first (fp32), then the matrices in the
// order embedding, wq, wk, wv, wo, w1, w2, w3, classifier if unshared.
static void read_export_tensors(tensor_reader* reader, model* out, const model_config* c, model_format format,
                                int group_size) {
    const int L = c->n_layers;
    for (int l = 0; l < L; l++)
        read_fp32_vector(reader, out->layers[l].rms_attention, (size_t)c->dim, "rms_attention", l);
    for (int l = 0; l < L; l++) read_fp32_vector(reader, out->layers[l].rms_ffn, (size_t)c->dim, "rms_ffn", l);
    read_fp32_vector(reader, out->rms_final, (size_t)c->dim, "rms_final", -1);
    for (int kind = 0; kind < 9; kind++) {
        int count = kind == 0 || kind == 8 ? 1 : L;
        if (kind == 8 && c->shared_classifier) break;
        for (int l = 0; l < count; l++) {
            const weight_matrix* w = kind == 0 ? &out->token_embedding
                                   : kind == 8 ? &out->classifier
                                               : model_storage_layer_matrix(&out->layers[l], kind - 1);
            const char* tensor = kind == 0   ? "token_embedding"
                                 : kind == 8 ? "classifier"
                                             : LAYER_MATRIX_NAMES[kind - 1];
            int layer = kind == 0 || kind == 8 ? -1 : l;
            if (format == MODEL_FORMAT_EXPORT_V2)
                read_q8_matrix(reader, w, group_size, tensor, layer);
            else
                read_fp32_matrix(reader, w, tensor, layer);
        }
    }
}

// Loaded all the same (the file is what it says it is), with one line:
// a NaN weight turns every activation it touches into NaN, and sampling
// from NaN logits gives token 0 (<unk>) forever.
static void warn_nonfinite(const char* name, const tensor_reader* reader) {
    if (reader->nonfinite_tensors == 0) return;
    char more[64] = "";
    if (reader->nonfinite_tensors > 1)
        snprintf(more, sizeof more, " (and %d more tensors, %llu values in all)", reader->nonfinite_tensors - 1,
                 (unsigned long long)reader->nonfinite_values);
    fprintf(stderr,
            "warning: %s: tensor '%s' has %llu non-finite values (NaN/Inf)%s; the model's outputs will be "
            "meaningless\n",
            name, reader->first_nonfinite, (unsigned long long)reader->first_nonfinite_count, more);
}

int model_load(model* out, const char* path, model_dtype_choice dtype_choice, error_info* err) {
    memset(out, 0, sizeof *out);
    const char* name = base_name(path);
    checkpoint_file file;
    if (read_checkpoint(path, name, &file, err)) return -1;

    weight_dtype dtype = file.format == MODEL_FORMAT_EXPORT_V2 ? WEIGHT_Q8_0 : WEIGHT_F32;
    if (dtype_choice == MODEL_DTYPE_FP32) dtype = WEIGHT_F32;
    if (dtype_choice == MODEL_DTYPE_FP16) dtype = WEIGHT_F16;
    if (model_storage_allocate(out, &file.config, dtype, file.group_size, err)) {
        free(file.bytes);
        return -1;
    }
    snprintf(out->name, sizeof out->name, "%s", name);
    out->format = file.format;

    tensor_reader reader = {
        .bytes = file.bytes,
        .offset = file.format == MODEL_FORMAT_LEGACY ? LEGACY_HEADER_BYTES : MODEL_EXPORT_HEADER_BYTES};
    if (file.format == MODEL_FORMAT_LEGACY) read_legacy_tensors(&reader, out, &file.config);
    else read_export_tensors(&reader, out, &file.config, file.format, file.group_size);
    free(file.bytes);
    if (reader.offset != file.size) { // cannot happen after the size check; kept as a tripwire
        model_free(out);
        return error_set(err, "%s: internal: read %zu of %zu bytes", name, reader.offset, file.size);
    }
    out->nonfinite_values = reader.nonfinite_values;
    warn_nonfinite(name, &reader);
    model_storage_build_tiles(out);
    return 0;
}

void model_free(model* m) {
    if (!m) return;
    free(m->layers);
    free(m->storage);
    free(m->tile_storage);
    free(m->bias_storage);
    if (m->file_mapping) munmap((void*)m->file_mapping, (size_t)m->file_mapping_bytes);
    memset(m, 0, sizeof *m);
}

uint64_t model_decode_weight_bytes(const model* m) {
    const model_config* c = &m->config;
    uint64_t bytes = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights* layer = &m->layers[l];
        bytes += weight_matrix_bytes(&layer->wq) + weight_matrix_bytes(&layer->wk) + weight_matrix_bytes(&layer->wv) +
                 weight_matrix_bytes(&layer->wo) + weight_matrix_bytes(&layer->w1) + weight_matrix_bytes(&layer->w2) +
                 weight_matrix_bytes(&layer->w3);
    }
    bytes += (uint64_t)(2 * c->n_layers + 1) * (uint64_t)c->dim * sizeof(float); // norms
    if (m->bias_storage) bytes += (uint64_t)c->n_layers * (uint64_t)(c->dim + 2 * c->kv_dim) * sizeof(float);
    bytes += weight_matrix_bytes(&m->classifier);
    // One embedding row (its scales included) per token.
    bytes += weight_matrix_bytes(&m->token_embedding) / (uint64_t)c->vocab_size;
    return bytes;
}

const weight_matrix* model_matrix_by_name(const model* m, const char* name) {
    if (strcmp(name, "token_embedding") == 0) return &m->token_embedding;
    if (strcmp(name, "classifier") == 0) return &m->classifier;
    int layer = -1, consumed = 0;
    char kind[8];
    if (sscanf(name, "layers.%d.%7s%n", &layer, kind, &consumed) != 2 || name[consumed] != '\0') return NULL;
    if (layer < 0 || layer >= m->config.n_layers) return NULL;
    for (int i = 0; i < 7; i++)
        if (strcmp(kind, LAYER_MATRIX_NAMES[i]) == 0) return model_storage_layer_matrix(&m->layers[layer], i);
    return NULL;
}

const char* weight_dtype_name(weight_dtype dtype) {
    switch (dtype) {
    case WEIGHT_F32: return "fp32";
    case WEIGHT_F16: return "fp16";
    case WEIGHT_Q8_0: return "q8_0";
    case WEIGHT_I8: return "int8";
    case WEIGHT_I4: return "int4";
    }
    return "?";
}
