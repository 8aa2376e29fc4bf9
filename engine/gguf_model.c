#include "engine/gguf_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/gguf_vocab.h"
#include "engine/model_storage.h"
#include "engine/streamed_memory.h"
#include "kernels/cpu/fp16.h"

// llama.cpp's defaults when the metadata leaves the key out.
#define DEFAULT_ROPE_BASE 10000.0
#define QUANT_BLOCK 32 // Q8_0 and Q4_0 weights per block

// ---- metadata -------------------------------------------------------------------------------

// ARCH.suffix as one key.
static const char* arch_key(const gguf_model_info* info, const char* suffix, char* out, size_t capacity) {
    snprintf(out, capacity, "%s.%s", info->architecture, suffix);
    return out;
}

static int read_int_key(const gguf_file* f, const gguf_model_info* info, const char* suffix, bool required,
                        int max_value, int* out, error_info* err) {
    char key[96];
    uint64_t value;
    int found = gguf_get_uint(f, arch_key(info, suffix, key, sizeof key), (uint64_t)max_value, &value, err);
    if (found < 0) return -1;
    if (!found) return required ? error_set(err, "%s: metadata '%s' is missing", f->name, key) : 0;
    if (value == 0) return error_set(err, "%s: metadata '%s': expected a positive value, found 0", f->name, key);
    *out = (int)value;
    return 0;
}

int gguf_model_read_info(const gguf_file* f, gguf_model_info* info, error_info* err) {
    memset(info, 0, sizeof *info);
    int found = gguf_get_string(f, "general.architecture", info->architecture, sizeof info->architecture, err);
    if (found < 0) return -1;
    if (!found) return error_set(err, "%s: metadata 'general.architecture' is missing", f->name);
    if (gguf_get_string(f, "general.name", info->model_name, sizeof info->model_name, err) < 0) return -1;
    for (int i = 0; i < f->n_tensors; i++) {
        if ((unsigned)f->tensors[i].type < 32) info->tensor_type_counts[f->tensors[i].type]++;
        info->tensor_data_bytes += f->tensors[i].bytes;
    }
    if (strcmp(info->architecture, "llama") != 0 && strcmp(info->architecture, "qwen2") != 0)
        return error_set(err, "%s: unsupported architecture %.31s (supported: llama, qwen2)", f->name,
                         info->architecture);

    model_config* c = &info->config;
    // The limits are model_config_validate's, which runs last.
    if (read_int_key(f, info, "embedding_length", true, 1 << 17, &c->dim, err) ||
        read_int_key(f, info, "feed_forward_length", true, 1 << 19, &c->hidden_dim, err) ||
        read_int_key(f, info, "block_count", true, 4096, &c->n_layers, err) ||
        read_int_key(f, info, "attention.head_count", true, 4096, &c->n_heads, err) ||
        read_int_key(f, info, "context_length", true, 1 << 22, &info->file_context_length, err))
        return -1;
    c->n_kv_heads = c->n_heads;
    if (read_int_key(f, info, "attention.head_count_kv", false, 4096, &c->n_kv_heads, err)) return -1;
    c->max_seq_len = info->file_context_length;
    const gguf_tensor* embedding = gguf_find_tensor(f, "token_embd.weight");
    if (!embedding) return error_set(err, "%s: tensor 'token_embd.weight' is missing", f->name);
    if (embedding->ne[1] > (1 << 22))
        return error_set(err, "%s: tensor 'token_embd.weight': vocabulary of %llu tokens, expected at most %d",
                         f->name, (unsigned long long)embedding->ne[1], 1 << 22);
    c->vocab_size = (int)embedding->ne[1];
    info->has_output_matrix = gguf_find_tensor(f, "output.weight") != NULL;
    c->shared_classifier = !info->has_output_matrix;
    if (model_config_validate(c, f->name, err)) return -1;

    char key[96];
    info->rope_dimensions = c->head_dim;
    if (read_int_key(f, info, "rope.dimension_count", false, 1 << 17, &info->rope_dimensions, err)) return -1;
    info->rope_base = DEFAULT_ROPE_BASE;
    if (gguf_get_float(f, arch_key(info, "rope.freq_base", key, sizeof key), &info->rope_base, err) < 0) return -1;
    info->rms_epsilon = MODEL_RMS_EPS;
    found = gguf_get_float(f, arch_key(info, "attention.layer_norm_rms_epsilon", key, sizeof key),
                           &info->rms_epsilon, err);
    if (found < 0) return -1;
    int key_length = c->head_dim, value_length = c->head_dim;
    if (read_int_key(f, info, "attention.key_length", false, 1 << 17, &key_length, err) ||
        read_int_key(f, info, "attention.value_length", false, 1 << 17, &value_length, err))
        return -1;
    if (key_length != c->head_dim || value_length != c->head_dim)
        return error_set(err, "%s: attention.key_length/value_length %d/%d: the forward pass needs head_dim = "
                              "embedding_length / head_count = %d",
                         f->name, key_length, value_length, c->head_dim);
    if (info->rope_dimensions % 2 != 0 || info->rope_dimensions > c->head_dim)
        return error_set(err, "%s: %s.rope.dimension_count: %d, expected an even count of at most head_dim %d", f->name,
                         info->architecture, info->rope_dimensions, c->head_dim);
    if (!(info->rope_base > 1.0 && info->rope_base <= 1e30))
        return error_set(err, "%s: %s.rope.freq_base: %g, expected a finite base above 1", f->name, info->architecture,
                         info->rope_base);
    // Written as an f32 (llama: 1e-5, qwen2: 1e-6), and used as one.
    if (!((float)info->rms_epsilon > 0.0f && info->rms_epsilon <= 1.0))
        return error_set(err, "%s: %s.attention.layer_norm_rms_epsilon: %g, expected a value in (0, 1]", f->name,
                         info->architecture, info->rms_epsilon);
    c->rope_base = (float)info->rope_base;
    c->rope_dims = info->rope_dimensions;
    // llama.cpp's llama_model_rope_type: LLAMA_ROPE_TYPE_NORM (adjacent
    // pairs) for llama, LLAMA_ROPE_TYPE_NEOX (halves) for qwen2.
    c->rope_neox = strcmp(info->architecture, "qwen2") == 0;
    c->rms_epsilon = (float)info->rms_epsilon;
    uint64_t experts = 0;
    if (gguf_get_uint(f, arch_key(info, "expert_count", key, sizeof key), UINT32_MAX, &experts, err) < 0) return -1;
    if (experts > 0)
        return error_set(err, "%s: %s.expert_count: %llu experts (mixture of experts) is not supported", f->name,
                         info->architecture, (unsigned long long)experts);
    char scaling[32] = "";
    if (gguf_get_string(f, arch_key(info, "rope.scaling.type", key, sizeof key), scaling, sizeof scaling, err) < 0)
        return -1;
    if (scaling[0] && strcmp(scaling, "none") != 0)
        return error_set(err, "%s: %s.rope.scaling.type: '%s' RoPE scaling is not supported", f->name,
                         info->architecture, scaling);
    return 0;
}

// ---- tensors --------------------------------------------------------------------------------

// The tensors one llama layer uses, with their matrix index
// (model_storage_layer_matrix order) or -1 (attention norm), -2 (FFN norm).
typedef struct layer_tensor {
    const char* suffix;
    int matrix; // 0 wq .. 6 w3; -1 attn norm; -2 ffn norm
} layer_tensor;

static const layer_tensor LAYER_TENSORS[9] = {
    {"attn_q.weight", 0},      {"attn_k.weight", 1},   {"attn_v.weight", 2}, {"attn_output.weight", 3},
    {"ffn_gate.weight", 4},    {"ffn_down.weight", 5}, {"ffn_up.weight", 6}, {"attn_norm.weight", -1},
    {"ffn_norm.weight", -2},
};

// Whether the kernels can hold a tensor of this type after loading.
static bool loadable_type(gguf_tensor_type type) {
    return type == GGUF_TENSOR_F32 || type == GGUF_TENSOR_F16 || type == GGUF_TENSOR_BF16 ||
           type == GGUF_TENSOR_Q8_0 || type == GGUF_TENSOR_Q4_0;
}

static int check_shape(const gguf_file* f, const gguf_tensor* t, uint64_t ne0, uint64_t ne1, error_info* err) {
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
        return error_set(err,
                         "%s: tensor '%s': shape %llux%llux%llux%llu, expected %llux%llu", f->name, t->name,
                         (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                         (unsigned long long)t->ne[3], (unsigned long long)ne0, (unsigned long long)ne1);
    if (!loadable_type(t->type))
        return error_set(err, "%s: tensor '%s': type %s is not supported (supported: F32, F16, BF16, Q8_0, Q4_0)",
                         f->name, t->name, gguf_tensor_type_name(t->type));
    return 0;
}

// Where one matrix comes from and what it becomes.
typedef struct matrix_plan {
    const gguf_tensor* tensor;
    weight_matrix* target;
    weight_dtype dtype;   // what the kernels will read
    bool mapped;          // points into the file (no copy)
    uint64_t bytes;       // bytes in storage when not mapped
} matrix_plan;

static weight_dtype dtype_for(gguf_tensor_type type, model_dtype_choice choice, bool* mapped) {
    *mapped = false;
    if (choice == MODEL_DTYPE_FP32) {
        *mapped = type == GGUF_TENSOR_F32;
        return WEIGHT_F32;
    }
    if (choice == MODEL_DTYPE_FP16) {
        *mapped = type == GGUF_TENSOR_F16;
        return WEIGHT_F16;
    }
    switch (type) {
    case GGUF_TENSOR_F32: *mapped = true; return WEIGHT_F32;
    case GGUF_TENSOR_F16: *mapped = true; return WEIGHT_F16;
    case GGUF_TENSOR_Q8_0: return WEIGHT_I8;
    case GGUF_TENSOR_Q4_0: return WEIGHT_I4;
    default: return WEIGHT_F32; // BF16
    }
}

static uint64_t storage_bytes(weight_dtype dtype, uint64_t rows, uint64_t cols) {
    uint64_t n = rows * cols; // both below 2^31: fits
    switch (dtype) {
    case WEIGHT_F32: return n * 4;
    case WEIGHT_F16: return n * 2;
    case WEIGHT_I8: return n + n / QUANT_BLOCK * 2;
    case WEIGHT_I4: return n / 2 + n / QUANT_BLOCK * 2;
    default: return 0;
    }
}

static uint64_t round_up_64(uint64_t bytes) { return (bytes + 63) / 64 * 64; }

// ---- conversions (each exact, except rounding to fp16 when asked) ------------------------------

static float f32_at(const unsigned char* p, uint64_t i) {
    float value;
    memcpy(&value, p + i * 4, sizeof value);
    return value;
}

static uint16_t u16_at(const unsigned char* p) { return (uint16_t)(p[0] | p[1] << 8); }

// Element i of a tensor as fp32 (F32, F16, BF16, Q8_0, Q4_0).
static float element_f32(const gguf_tensor* t, uint64_t i) {
    const unsigned char* p = t->data;
    switch (t->type) {
    case GGUF_TENSOR_F32: return f32_at(p, i);
    case GGUF_TENSOR_F16: return fp16_to_fp32(u16_at(p + i * 2));
    case GGUF_TENSOR_BF16: return bf16_to_fp32(u16_at(p + i * 2));
    case GGUF_TENSOR_Q8_0: {
        const unsigned char* block = p + i / QUANT_BLOCK * 34;
        return fp16_to_fp32(u16_at(block)) * (float)(int8_t)block[2 + i % QUANT_BLOCK];
    }
    case GGUF_TENSOR_Q4_0: {
        const unsigned char* block = p + i / QUANT_BLOCK * 18;
        uint64_t j = i % QUANT_BLOCK;
        int nibble = j < 16 ? block[2 + j] & 15 : block[2 + j - 16] >> 4;
        return fp16_to_fp32(u16_at(block)) * (float)(nibble - 8);
    }
    default: return 0.0f;
    }
}

// Fills a matrix of storage from its tensor; the target's pointers are set here.
static void convert_matrix(const matrix_plan* plan, unsigned char* destination) {
    const gguf_tensor* t = plan->tensor;
    weight_matrix* w = plan->target;
    const uint64_t rows = t->ne[1], cols = t->ne[0], n = rows * cols;
    const uint64_t groups = n / QUANT_BLOCK;
    w->dtype = plan->dtype;
    w->rows = (int)rows;
    w->cols = (int)cols;
    if (plan->mapped) {
        w->values = t->data;
        return;
    }
    w->values = destination;
    if (plan->dtype == WEIGHT_F32) {
        float* out = (float*)destination;
        for (uint64_t i = 0; i < n; i++) out[i] = element_f32(t, i);
    } else if (plan->dtype == WEIGHT_F16) {
        uint16_t* out = (uint16_t*)destination;
        for (uint64_t i = 0; i < n; i++) out[i] = fp32_to_fp16(element_f32(t, i));
    } else if (plan->dtype == WEIGHT_I8) {
        // Block b of the file (row-major, so block b is row b / G, group b % G):
        // fp16 d, then 32 int8 codes. Codes go to values, d to scales_f16.
        int8_t* codes = (int8_t*)destination;
        uint16_t* scales = (uint16_t*)(destination + n);
        for (uint64_t b = 0; b < groups; b++) {
            const unsigned char* block = t->data + b * 34;
            scales[b] = u16_at(block);
            memcpy(codes + b * QUANT_BLOCK, block + 2, QUANT_BLOCK);
        }
        w->group_size = QUANT_BLOCK;
        w->scales_f16 = scales;
    } else { // WEIGHT_I4
        // The file's block holds element j in the low nibble of byte j and
        // element j + 16 in the high one; the kernel wants columns 2k and
        // 2k + 1 in the low and high nibbles of byte k.
        uint8_t* packed = destination;
        uint16_t* scales = (uint16_t*)(destination + n / 2);
        for (uint64_t b = 0; b < groups; b++) {
            const unsigned char* block = t->data + b * 18;
            scales[b] = u16_at(block);
            uint8_t* out = packed + b * (QUANT_BLOCK / 2);
            for (int k = 0; k < QUANT_BLOCK / 2; k++) {
                int low_element = 2 * k, high_element = 2 * k + 1;
                int low = low_element < 16 ? block[2 + low_element] & 15 : block[2 + low_element - 16] >> 4;
                int high = high_element < 16 ? block[2 + high_element] & 15 : block[2 + high_element - 16] >> 4;
                out[k] = (uint8_t)(low | high << 4);
            }
        }
        w->group_size = QUANT_BLOCK;
        w->scales_f16 = scales;
    }
}

// ---- the whole model -------------------------------------------------------------------------

static uint64_t physical_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    return pages > 0 && page_size > 0 ? (uint64_t)pages * (uint64_t)page_size : UINT64_MAX;
}

int gguf_model_from_file(model* out, gguf_file* f, const gguf_model_options* options, error_info* err) {
    memset(out, 0, sizeof *out);
    gguf_model_options defaults = {MODEL_DTYPE_DEFAULT, 0, false};
    if (!options) options = &defaults;
    gguf_model_info info;
    if (gguf_model_read_info(f, &info, err)) return -1;
    model_config config = info.config;
    if (options->context_length > 0) {
        config.max_seq_len = options->context_length;
        if (model_config_validate(&config, f->name, err)) return -1;
    }
    const int L = config.n_layers;
    const uint64_t dim = (uint64_t)config.dim, kv_dim = (uint64_t)config.kv_dim, hidden = (uint64_t)config.hidden_dim,
                   vocab = (uint64_t)config.vocab_size;

    // Every tensor the model uses, checked, before anything is allocated.
    int n_plans = 7 * L + 2;
    matrix_plan* plans = calloc((size_t)n_plans, sizeof *plans);
    const gguf_tensor** norms = calloc((size_t)(2 * L + 1), sizeof *norms); // (2L + 1) attn, ffn per layer, final
    const gguf_tensor** biases = calloc((size_t)(3 * L), sizeof *biases);   // (3L) q, k, v per layer; NULL: none
    layer_weights* layers = calloc((size_t)L, sizeof *layers);
    bool* used = calloc((size_t)f->n_tensors + 1, sizeof *used);
    if (!plans || !norms || !biases || !layers || !used) {
        free(plans), free(norms), free(biases), free(layers), free(used);
        return error_set(err, "%s: out of memory for %d layers", f->name, L);
    }
    int status = 0;
    char name[96];
    const gguf_tensor* t = gguf_find_tensor(f, "token_embd.weight");
    status = check_shape(f, t, dim, vocab, err);
    plans[0] = (matrix_plan){t, &out->token_embedding, WEIGHT_F32, false, 0};
    const gguf_tensor* output = gguf_find_tensor(f, "output.weight");
    if (status == 0 && output) status = check_shape(f, output, dim, vocab, err);
    plans[1] = (matrix_plan){output, &out->classifier, WEIGHT_F32, false, 0};
    const gguf_tensor* final_norm = gguf_find_tensor(f, "output_norm.weight");
    if (status == 0 && !final_norm) status = error_set(err, "%s: tensor 'output_norm.weight' is missing", f->name);
    if (status == 0) status = check_shape(f, final_norm, dim, 1, err);
    norms[2 * L] = final_norm;
    for (int l = 0; l < L && status == 0; l++) {
        const uint64_t shapes[7][2] = {{dim, dim}, {dim, kv_dim}, {dim, kv_dim}, {dim, dim},
                                       {dim, hidden}, {hidden, dim}, {dim, hidden}};
        for (int k = 0; k < 9 && status == 0; k++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, LAYER_TENSORS[k].suffix);
            t = gguf_find_tensor(f, name);
            if (!t) {
                status = error_set(err, "%s: tensor '%s' is missing", f->name, name);
                break;
            }
            int m = LAYER_TENSORS[k].matrix;
            if (m >= 0) {
                status = check_shape(f, t, shapes[m][0], shapes[m][1], err);
                plans[2 + 7 * l + m] = (matrix_plan){t, (weight_matrix*)model_storage_layer_matrix(&layers[l], m),
                                                     WEIGHT_F32, false, 0};
            } else {
                status = check_shape(f, t, dim, 1, err);
                norms[m == -1 ? 2 * l : 2 * l + 1] = t;
            }
        }
        // q/k/v biases: qwen2 has all three (llama.cpp requires them), llama
        // files may (optional there); either all three or none.
        static const char* const bias_names[3] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
        const uint64_t bias_sizes[3] = {dim, kv_dim, kv_dim};
        int n_found = 0;
        for (int k = 0; k < 3 && status == 0; k++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, bias_names[k]);
            biases[3 * l + k] = gguf_find_tensor(f, name);
            if (!biases[3 * l + k]) continue;
            n_found++;
            status = check_shape(f, biases[3 * l + k], bias_sizes[k], 1, err);
        }
        if (status == 0 && n_found != 0 && n_found != 3)
            status = error_set(err, "%s: layer %d has %d of the 3 biases attn_q/k/v.bias: expected all or none",
                               f->name, l, n_found);
        if (status == 0 && n_found == 0 && info.config.rope_neox)
            status = error_set(err, "%s: tensor 'blk.%d.attn_q.bias' is missing (qwen2 has q/k/v biases)", f->name, l);
        if (status == 0 && l > 0 && (n_found != 0) != (biases[0] != NULL))
            status = error_set(err, "%s: layer %d %s q/k/v biases and layer 0 %s: expected every layer alike", f->name,
                               l, n_found ? "has" : "lacks", biases[0] ? "has them" : "does not");
    }
    // A tensor the model does not use (a bias, rope_freqs, ...) would change
    // what the model computes: refused by name, as llama.cpp refuses a file
    // whose tensor count does not match.
    for (int i = 0; i < n_plans && status == 0; i++)
        if (plans[i].tensor) used[plans[i].tensor - f->tensors] = true;
    for (int i = 0; i < 2 * L + 1 && status == 0; i++) used[norms[i] - f->tensors] = true;
    for (int i = 0; i < 3 * L && status == 0; i++)
        if (biases[i]) used[biases[i] - f->tensors] = true;
    for (int i = 0; i < f->n_tensors && status == 0; i++)
        if (!used[i])
            status = error_set(err,
                               "%s: tensor '%s' is not one a llama model uses (biases, rope_freqs and the "
                               "like, other than q/k/v biases, are not supported)",
                               f->name, f->tensors[i].name);
    free(used);
    float* bias_storage = NULL; // (L, dim + 2 kv_dim) q, k, v biases of each layer in fp32
    if (status == 0 && biases[0]) {
        bias_storage = malloc((size_t)L * (size_t)(dim + 2 * kv_dim) * sizeof *bias_storage);
        if (!bias_storage) status = error_set(err, "%s: out of memory for the biases", f->name);
    }
    if (status) {
        free(plans), free(norms), free(biases), free(layers);
        return -1;
    }

    // Sizes of what is converted (norms are fp32 in the kernels: a norm
    // stored as F16/BF16 is widened).
    uint64_t total = 0, converted_from_q8 = 0, converted_from_q4 = 0, widened_bytes = 0;
    for (int i = 0; i < n_plans; i++) {
        matrix_plan* p = &plans[i];
        if (!p->tensor) continue;
        p->dtype = dtype_for(p->tensor->type, options->dtype, &p->mapped);
        p->bytes = p->mapped ? 0 : round_up_64(storage_bytes(p->dtype, p->tensor->ne[1], p->tensor->ne[0]));
        total += p->bytes;
        if (p->dtype == WEIGHT_I8) converted_from_q8 += p->tensor->bytes;
        else if (p->dtype == WEIGHT_I4) converted_from_q4 += p->tensor->bytes;
        else if (!p->mapped) widened_bytes += p->tensor->bytes;
    }
    for (int i = 0; i < 2 * L + 1; i++)
        if (norms[i]->type != GGUF_TENSOR_F32) total += round_up_64(dim * 4);
    // Fail before allocating: the copies and the mapped file must fit in RAM.
    uint64_t ram = physical_memory_bytes();
    if (total > ram || f->size > ram - total)
        status = error_set(err, "%s: needs %llu bytes of converted weights plus the %zu-byte file, this machine has "
                                "%llu bytes of RAM",
                           f->name, (unsigned long long)total, f->size, (unsigned long long)ram);
    unsigned char* storage = NULL;
    if (status == 0 && total > 0 && !(storage = streamed_memory_alloc((size_t)total)))
        status = error_set(err, "%s: out of memory: %llu bytes for the converted weights", f->name,
                           (unsigned long long)total);
    if (status) {
        free(plans), free(norms), free(biases), free(layers), free(bias_storage);
        return -1;
    }

    snprintf(out->name, sizeof out->name, "%s", f->name);
    out->format = MODEL_FORMAT_GGUF;
    out->config = config;
    out->layers = layers;
    out->storage = storage;
    uint64_t offset = 0;
    for (int i = 0; i < n_plans; i++) {
        if (!plans[i].tensor) continue;
        convert_matrix(&plans[i], storage ? storage + offset : NULL);
        offset += plans[i].bytes;
    }
    for (int i = 0; i < 2 * L + 1; i++) {
        const float* gain = (const float*)norms[i]->data;
        if (norms[i]->type != GGUF_TENSOR_F32) {
            float* widened = (float*)(storage + offset);
            for (uint64_t j = 0; j < dim; j++) widened[j] = element_f32(norms[i], j);
            gain = widened;
            offset += round_up_64(dim * 4);
        }
        if (i == 2 * L) out->rms_final = gain;
        else if (i % 2 == 0) layers[i / 2].rms_attention = gain;
        else layers[i / 2].rms_ffn = gain;
    }
    if (bias_storage) {
        out->bias_storage = bias_storage;
        float* at = bias_storage;
        for (int l = 0; l < L; l++) {
            float* targets[3];
            for (int k = 0; k < 3; k++) {
                const gguf_tensor* bias = biases[3 * l + k];
                targets[k] = at;
                for (uint64_t j = 0; j < bias->ne[0]; j++)
                    at[j] = element_f32(bias, j);
                at += bias->ne[0];
            }
            layers[l].bq = targets[0];
            layers[l].bk = targets[1];
            layers[l].bv = targets[2];
        }
    }
    // output.weight absent: the classifier is the embedding (tied). The
    // llama2c converter writes it anyway as a second copy; it stays a
    // separate matrix, as llama.cpp computes the logits from it.
    if (!output) out->classifier = out->token_embedding;
    out->dtype = layers[0].wq.dtype;

    uint64_t norm_values = (uint64_t)(2 * L + 1) * dim, bytes = weight_matrix_bytes(&out->token_embedding),
             params = vocab * dim + norm_values;
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 7; k++) {
            const weight_matrix* w = model_storage_layer_matrix(&layers[l], k);
            bytes += weight_matrix_bytes(w);
            params += (uint64_t)w->rows * (uint64_t)w->cols;
        }
    if (output) {
        bytes += weight_matrix_bytes(&out->classifier);
        params += vocab * dim;
    }
    const uint64_t bias_values = bias_storage ? (uint64_t)L * (dim + 2 * kv_dim) : 0;
    out->weight_bytes = bytes + (norm_values + bias_values) * 4;
    out->n_parameters = params + bias_values;
    void* mapping;
    size_t mapping_bytes;
    gguf_release_mapping(f, &mapping, &mapping_bytes);
    out->file_mapping = mapping;
    out->file_mapping_bytes = mapping_bytes;
    free(plans);
    free(norms);
    free(biases);

    if (options->report_conversions && (converted_from_q8 || converted_from_q4 || widened_bytes)) {
        char line[400] = "";
        size_t used_chars = 0;
        if (converted_from_q8)
            used_chars += (size_t)snprintf(line + used_chars, sizeof line - used_chars,
                                           "; Q8_0 -> int8 g32 (W8A16): %llu bytes regrouped, codes and fp16 scales "
                                           "unchanged, same bytes per token",
                                           (unsigned long long)converted_from_q8);
        if (converted_from_q4 && used_chars < sizeof line)
            used_chars += (size_t)snprintf(line + used_chars, sizeof line - used_chars,
                                           "; Q4_0 -> int4 g32 (W4A16): %llu bytes, nibbles reordered, scales "
                                           "unchanged, same bytes per token",
                                           (unsigned long long)converted_from_q4);
        if (widened_bytes && used_chars < sizeof line)
            snprintf(line + used_chars, sizeof line - used_chars, "; %llu bytes of tensors %s to %s", (unsigned long long)widened_bytes,
                     options->dtype == MODEL_DTYPE_FP16 ? "rounded or widened" : "widened (exact)",
                     weight_dtype_name(out->dtype));
        fprintf(stderr, "%s: converted at load%s\n", f->name, line);
    }
    model_storage_build_f16_tiles(out);
    // No end-of-generation token (no tokenizer in the file, or a bad id key,
    // which tok_from_gguf refuses by name): llama2.c's EOS 2 / BOS 1.
    error_info ignored = {{0}};
    if (gguf_vocab_stop_tokens(f, out->stop_tokens, MODEL_MAX_STOP_TOKENS, &out->n_stop_tokens, &ignored))
        out->n_stop_tokens = 0;
    return 0;
}

int gguf_model_load(model* out, const char* path, const gguf_model_options* options, error_info* err) {
    memset(out, 0, sizeof *out);
    gguf_file f;
    if (gguf_open(&f, path, err)) return -1;
    int status = gguf_model_from_file(out, &f, options, err);
    gguf_close(&f);
    return status;
}
