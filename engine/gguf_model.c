#include "engine/gguf_model.h"

#include <math.h>
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
#define QUANT_BLOCK 32 // Q8_0 and Q4_0 weights per block; Q4_K and Q5_K's sub-block
#define KQUANT_SUPER_BLOCK 256
#define KQUANT_Q6_SUB_BLOCK 16

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

// general.architecture (llama or qwen2), general.name and the tensor census.
static int read_architecture(const gguf_file* f, gguf_model_info* info, error_info* err) {
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
    return 0;
}

// The shapes: dimensions and head counts from the metadata, the vocabulary
// from token_embd.weight, checked by model_config_validate.
static int read_shapes(const gguf_file* f, gguf_model_info* info, error_info* err) {
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
    return model_config_validate(c, f->name, err);
}

// RoPE (rotary dimensions, base, pairing) and the RMSNorm epsilon; the
// key and value lengths must be head_dim, the only one the forward pass has.
static int read_rope_and_norm(const gguf_file* f, gguf_model_info* info, error_info* err) {
    model_config* c = &info->config;
    char key[96];
    info->rope_dimensions = c->head_dim;
    if (read_int_key(f, info, "rope.dimension_count", false, 1 << 17, &info->rope_dimensions, err)) return -1;
    info->rope_base = DEFAULT_ROPE_BASE;
    if (gguf_get_float(f, arch_key(info, "rope.freq_base", key, sizeof key), &info->rope_base, err) < 0) return -1;
    info->rms_epsilon = MODEL_RMS_EPS;
    if (gguf_get_float(f, arch_key(info, "attention.layer_norm_rms_epsilon", key, sizeof key), &info->rms_epsilon,
                       err) < 0)
        return -1;
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
    return 0;
}

// Experts and RoPE scaling change the math the forward pass does: refused by name.
static int refuse_unsupported_features(const gguf_file* f, const gguf_model_info* info, error_info* err) {
    char key[96];
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

int gguf_model_read_info(const gguf_file* f, gguf_model_info* info, error_info* err) {
    memset(info, 0, sizeof *info);
    if (read_architecture(f, info, err) || read_shapes(f, info, err) || read_rope_and_norm(f, info, err) ||
        refuse_unsupported_features(f, info, err))
        return -1;
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
static bool is_kquant(gguf_tensor_type type) {
    return type == GGUF_TENSOR_Q4_K || type == GGUF_TENSOR_Q5_K || type == GGUF_TENSOR_Q6_K;
}

static bool loadable_type(gguf_tensor_type type) {
    return type == GGUF_TENSOR_F32 || type == GGUF_TENSOR_F16 || type == GGUF_TENSOR_BF16 || type == GGUF_TENSOR_Q8_0 ||
           type == GGUF_TENSOR_Q4_0 || is_kquant(type);
}

static int check_shape(const gguf_file* f, const gguf_tensor* t, uint64_t ne0, uint64_t ne1, error_info* err) {
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
        return error_set(err,
                         "%s: tensor '%s': shape %llux%llux%llux%llu, expected %llux%llu", f->name, t->name,
                         (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                         (unsigned long long)t->ne[3], (unsigned long long)ne0, (unsigned long long)ne1);
    if (!loadable_type(t->type))
        return error_set(
            err, "%s: tensor '%s': type %s is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K)",
            f->name, t->name, gguf_tensor_type_name(t->type));
    return 0;
}

// What converting one k-quant type to int8 costs (the stderr line).
typedef struct kquant_cost {
    uint64_t weights;
    double extra_bytes_per_token; // int8 bytes minus the file's, as a decode step streams them
} kquant_cost;

// Where one matrix comes from and what it becomes.
typedef struct matrix_plan {
    const gguf_tensor* tensor;
    weight_matrix* target;
    weight_dtype dtype;   // what the kernels will read
    int group_size;       // WEIGHT_I8/I4: weights per scale along a row
    bool asymmetric;      // WEIGHT_I8/I4: with per-group zero-points
    bool mapped;          // points into the file (no copy)
    uint64_t bytes;       // bytes in storage when not mapped
} matrix_plan;

static weight_dtype dtype_for(gguf_tensor_type type, model_dtype_choice choice, bool* mapped, int* group_size,
                              bool* asymmetric) {
    *mapped = false;
    *group_size = QUANT_BLOCK;
    *asymmetric = type == GGUF_TENSOR_Q4_K || type == GGUF_TENSOR_Q5_K;
    if (type == GGUF_TENSOR_Q6_K) *group_size = KQUANT_Q6_SUB_BLOCK;
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
    case GGUF_TENSOR_Q4_K:
    case GGUF_TENSOR_Q5_K:
    case GGUF_TENSOR_Q6_K: return WEIGHT_I8;
    default: return WEIGHT_F32; // BF16
    }
}

// True when an F32/F16 tensor's data may be read in place as float/uint16_t.
// A file with general.alignment 1 (a power of two, so allowed) can put a
// tensor at an odd address, and a misaligned float load is undefined
// behaviour (UBSan: kernels/cpu/matmul.c); such a tensor is copied instead.
// Element alignment is all the kernels need: their SIMD loads are unaligned.
static bool aligned_for_type(const gguf_tensor* t) {
    uintptr_t address = (uintptr_t)t->data;
    if (t->type == GGUF_TENSOR_F32) return address % _Alignof(float) == 0;
    if (t->type == GGUF_TENSOR_F16) return address % _Alignof(uint16_t) == 0;
    return true;
}

// Norms are read as fp32 in place only when they are F32 at an aligned address.
static bool norm_needs_copy(const gguf_tensor* norm) {
    return norm->type != GGUF_TENSOR_F32 || !aligned_for_type(norm);
}

static uint64_t storage_bytes(const matrix_plan* p) {
    uint64_t n = p->tensor->ne[1] * p->tensor->ne[0];                                       // both below 2^31: fits
    uint64_t groups = n / (uint64_t)p->group_size, per_group = 2 + (p->asymmetric ? 1 : 0); // fp16 scale, zero-point
    switch (p->dtype) {
    case WEIGHT_F32: return n * 4;
    case WEIGHT_F16: return n * 2;
    case WEIGHT_I8: return n + groups * per_group;
    case WEIGHT_I4: return n / 2 + groups * per_group;
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

// ---- k-quants: 256-weight super-blocks of sub-blocks --------------------------------------------
//
// ggml's layouts (ggml-common.h; dequantize_row_q4_K/q5_K/q6_K in ggml-quants.c):
//   Q4_K, 144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles.
//     Sub-block j (32 weights) = d * sc_j * q - dmin * m_j, q in 0..15; the 32 bytes of chunk
//     j / 2 hold sub-block j in their low nibbles when j is even, high nibbles when odd.
//   Q5_K, 176 bytes: d, dmin, 12 scale bytes, 32 bytes of high bits, 128 of nibbles: as Q4_K
//     with q + 16 * bit j of high-bit byte l (l = the weight's place in its sub-block), q in 0..31.
//   Q6_K, 210 bytes: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, fp16 d.
//     Sub-block k (16 weights) = d * sc_k * (q - 32), q in 0..63.

// One super-block unpacked: weight e = step[e / sub_size] * (q[e] - center)
// - offset[e / sub_size] (Q4_K/Q5_K: center 0; Q6_K: center 32, offset 0).
typedef struct kquant_block {
    uint8_t q[KQUANT_SUPER_BLOCK];
    float step[16];   // (n_sub) d * sc, exact in fp32 (11 x 8 significant bits)
    float offset[16]; // (n_sub) dmin * m
    int n_sub, sub_size, max_q, center;
} kquant_block;

// Q4_K/Q5_K's packed 6-bit scale and min of sub-block j (of 8).
static void kquant_scale_min(const unsigned char* scales, int j, int* scale, int* min) {
    if (j < 4) {
        *scale = scales[j] & 63;
        *min = scales[j + 4] & 63;
    } else {
        *scale = (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4;
        *min = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4;
    }
}

static void kquant_unpack(gguf_tensor_type type, const unsigned char* block, kquant_block* out) {
    if (type == GGUF_TENSOR_Q6_K) {
        const unsigned char *low = block, *high = block + 128;
        const int8_t* scales = (const int8_t*)(block + 192);
        const float d = fp16_to_fp32(u16_at(block + 208));
        *out = (kquant_block){.n_sub = 16, .sub_size = KQUANT_Q6_SUB_BLOCK, .max_q = 63, .center = 32};
        for (int e = 0; e < KQUANT_SUPER_BLOCK; e++) {
            const int half = e / 128, quarter = e % 128 / 32, l = e % 32; // quarter picks nibble and bit pair
            const unsigned char low_byte = low[64 * half + l + (quarter % 2) * 32];
            const int nibble = quarter < 2 ? low_byte & 15 : low_byte >> 4;
            out->q[e] = (uint8_t)(nibble | ((high[32 * half + l] >> (2 * quarter)) & 3) << 4);
        }
        for (int k = 0; k < 16; k++)
            out->step[k] = d * (float)scales[k];
        return;
    }
    const bool five_bit = type == GGUF_TENSOR_Q5_K;
    const float d = fp16_to_fp32(u16_at(block)), dmin = fp16_to_fp32(u16_at(block + 2));
    const unsigned char* scales = block + 4;
    const unsigned char* high = block + 16; // Q5_K only
    const unsigned char* nibbles = block + (five_bit ? 48 : 16);
    *out = (kquant_block){.n_sub = 8, .sub_size = QUANT_BLOCK, .max_q = five_bit ? 31 : 15, .center = 0};
    for (int j = 0; j < 8; j++) {
        int scale, min;
        kquant_scale_min(scales, j, &scale, &min);
        out->step[j] = d * (float)scale;
        out->offset[j] = dmin * (float)min;
        for (int l = 0; l < 32; l++) {
            const unsigned char byte = nibbles[32 * (j / 2) + l];
            int q = j % 2 == 0 ? byte & 15 : byte >> 4;
            if (five_bit) q += ((high[l] >> j) & 1) * 16;
            out->q[32 * j + l] = (uint8_t)q;
        }
    }
}

// Weight e of an unpacked super-block, as ggml's dequantize_row_* rounds it.
static float kquant_value(const kquant_block* b, int e) {
    const int k = e / b->sub_size;
    return b->step[k] * (float)(b->q[e] - b->center) - b->offset[k];
}

#define FP16_MAX 65504.0f

// Q8_0 and Q4_0 run as llama.cpp runs them: each activation row is
// quantized to int8 once per matmul with one scale per block of 32, and
// every block is an integer dot product (W8A8 / W4A8 group 32,
// kernels/cpu/matmul_a8.c). With float activations the same weights agree
// with llama.cpp's greedy ids less often (q8_0 88 of 192, q4_0 149 of 192).
static void gguf_use_int8_activations(weight_matrix* w) {
    w->activation_bits = 8;
    w->activation_block = QUANT_BLOCK;
}

// One sub-block as WEIGHT_I8 codes, fp16 scale and zero-point (zero_point NULL:
// symmetric). Exactly where the file's grid fits the kernel's:
//   symmetric (Q6_K): codes q - 32, scale fp16(step); only the scale rounds (2^-12 relative).
//   asymmetric (Q4_K, Q5_K): codes M * q + k, scale fp16(step / M), zero-point
//     round(M * offset / step) + k (k >= 0 lifts a negative zero-point), for the
//     M in 16, 8, 4, 2, 1 with M * max_q + k <= 255 whose weights come out
//     closest (the largest, unless step / M is so small that fp16 rounds it
//     coarsely). With M = 16 the offset moves by at most step / 32 (Q4_K), with
//     M = 8 by step / 16 (Q5_K, whose 31 * 16 > 255).
// Where neither fits (a zero step, an offset beyond 255 steps: no real file,
// llama.cpp's quantizer keeps offset <= 63 * dmin), the sub-block's values are
// quantized afresh by min/max to 8 bits: error <= range / 510 and the scale's rounding.
static void kquant_sub_to_i8(const kquant_block* b, int k, uint8_t* codes, uint16_t* scale, uint8_t* zero_point) {
    const int n = b->sub_size, first = k * n;
    const float step = b->step[k];
    if (!zero_point && step != 0.0f && fabsf(step) <= FP16_MAX) {
        *scale = fp32_to_fp16(step);
        for (int i = 0; i < n; i++)
            codes[i] = (uint8_t)(int8_t)(b->q[first + i] - b->center);
        return;
    }
    int best_multiple = 0;
    double best_error = INFINITY, best_lift = 0, best_zero = 0;
    for (int multiple = 16; zero_point && step > 0.0f && step <= FP16_MAX && multiple >= 1; multiple /= 2) {
        const double zero = nearbyint((double)multiple * (double)b->offset[k] / (double)step);
        const double lift = zero < 0 ? -zero : 0;
        const float rounded_scale = fp16_to_fp32(fp32_to_fp16(step / (float)multiple));
        if (multiple * b->max_q + lift > 255 || zero + lift > 255 || !(rounded_scale > 0.0f)) continue;
        double error = 0;
        for (int i = 0; i < n; i++)
            error = fmax(error, fabs((double)rounded_scale * (double)(multiple * b->q[first + i] - zero) -
                                     (double)kquant_value(b, first + i)));
        if (error < best_error) best_multiple = multiple, best_error = error, best_lift = lift, best_zero = zero;
    }
    if (best_multiple > 0) {
        *scale = fp32_to_fp16(step / (float)best_multiple);
        *zero_point = (uint8_t)(best_zero + best_lift);
        for (int i = 0; i < n; i++)
            codes[i] = (uint8_t)(best_multiple * b->q[first + i] + (int)best_lift);
        return;
    }
    float lo = 0.0f, hi = 0.0f; // the range, with 0 inside so that a zero-point exists
    for (int i = 0; i < n; i++) {
        const float v = kquant_value(b, first + i);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    if (!zero_point) hi = fmaxf(hi, -lo), lo = -hi;
    const float levels = zero_point ? 255.0f : 254.0f;
    float s = fminf((hi - lo) / levels, FP16_MAX);
    *scale = fp32_to_fp16(s);
    s = fp16_to_fp32(*scale);
    const float zero = zero_point ? nearbyintf(-lo / (s > 0 ? s : 1.0f)) : 0.0f;
    if (zero_point) *zero_point = (uint8_t)fminf(fmaxf(zero, 0.0f), 255.0f);
    for (int i = 0; i < n; i++) {
        float c = s > 0 ? nearbyintf(kquant_value(b, first + i) / s) + zero : zero;
        c = fminf(fmaxf(c, zero_point ? 0.0f : -127.0f), zero_point ? 255.0f : 127.0f);
        codes[i] = zero_point ? (uint8_t)c : (uint8_t)(int8_t)c;
    }
}

// Element i of a tensor as fp32 (F32, F16, BF16, Q8_0, Q4_0, and k-quants).
static float element_f32(const gguf_tensor* t, uint64_t i) {
    const unsigned char* p = t->data;
    if (is_kquant(t->type)) {
        kquant_block b;
        kquant_unpack(t->type, p + i / KQUANT_SUPER_BLOCK * gguf_tensor_block_bytes(t->type), &b);
        return kquant_value(&b, (int)(i % KQUANT_SUPER_BLOCK));
    }
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

// A k-quant matrix unpacked one super-block at a time: to fp32/fp16 values
// (dequantized as ggml does), or to WEIGHT_I8 sub-blocks (kquant_sub_to_i8).
static void convert_kquant_matrix(const matrix_plan* plan, unsigned char* destination) {
    const gguf_tensor* t = plan->tensor;
    weight_matrix* w = plan->target;
    const uint64_t n = t->ne[1] * t->ne[0];
    const uint64_t block_bytes = gguf_tensor_block_bytes(t->type), n_blocks = n / KQUANT_SUPER_BLOCK;
    const uint64_t n_groups = n / (uint64_t)plan->group_size;
    uint8_t* codes = destination;
    uint16_t* scales = (uint16_t*)(destination + n);
    uint8_t* zero_points = plan->asymmetric ? destination + n + n_groups * 2 : NULL;
    kquant_block b;
    for (uint64_t block = 0; block < n_blocks; block++) {
        kquant_unpack(t->type, t->data + block * block_bytes, &b);
        const uint64_t first = block * KQUANT_SUPER_BLOCK;
        if (plan->dtype == WEIGHT_F32 || plan->dtype == WEIGHT_F16) {
            for (int e = 0; e < KQUANT_SUPER_BLOCK; e++) {
                float value = kquant_value(&b, e);
                if (plan->dtype == WEIGHT_F32)
                    ((float*)destination)[first + (uint64_t)e] = value;
                else
                    ((uint16_t*)destination)[first + (uint64_t)e] = fp32_to_fp16(value);
            }
            continue;
        }
        for (int k = 0; k < b.n_sub; k++) {
            const uint64_t group = first / (uint64_t)b.sub_size + (uint64_t)k;
            kquant_sub_to_i8(&b, k, codes + first + (uint64_t)k * (uint64_t)b.sub_size, &scales[group],
                             zero_points ? &zero_points[group] : NULL);
        }
    }
    if (plan->dtype == WEIGHT_I8) {
        w->group_size = plan->group_size;
        w->scales_f16 = scales;
        w->zero_points = zero_points;
    }
}

// Q8_0 as WEIGHT_I8 group 32. Block b of the file (row-major, so block b is
// row b / G, group b % G): fp16 d, then 32 int8 codes. Codes go to values, d to scales_f16.
static void regroup_q8_0(const gguf_tensor* t, weight_matrix* w, unsigned char* destination, uint64_t n) {
    int8_t* codes = (int8_t*)destination;
    uint16_t* scales = (uint16_t*)(destination + n);
    const uint64_t groups = n / QUANT_BLOCK;
    for (uint64_t b = 0; b < groups; b++) {
        const unsigned char* block = t->data + b * 34;
        scales[b] = u16_at(block);
        memcpy(codes + b * QUANT_BLOCK, block + 2, QUANT_BLOCK);
    }
    w->group_size = QUANT_BLOCK;
    w->scales_f16 = scales;
    gguf_use_int8_activations(w);
}

// Q4_0 as WEIGHT_I4 group 32. The file's block holds element j in the low
// nibble of byte j and element j + 16 in the high one; the kernel wants
// columns 2k and 2k + 1 in the low and high nibbles of byte k.
static void reorder_q4_0(const gguf_tensor* t, weight_matrix* w, unsigned char* destination, uint64_t n) {
    uint8_t* packed = destination;
    uint16_t* scales = (uint16_t*)(destination + n / 2);
    const uint64_t groups = n / QUANT_BLOCK;
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
    gguf_use_int8_activations(w);
}

// Fills a matrix of storage from its tensor; the target's pointers are set here.
static void convert_matrix(const matrix_plan* plan, unsigned char* destination) {
    const gguf_tensor* t = plan->tensor;
    weight_matrix* w = plan->target;
    const uint64_t rows = t->ne[1], cols = t->ne[0], n = rows * cols;
    w->dtype = plan->dtype;
    w->rows = (int)rows;
    w->cols = (int)cols;
    if (plan->mapped) {
        w->values = t->data;
        return;
    }
    w->values = destination;
    if (is_kquant(t->type)) {
        convert_kquant_matrix(plan, destination);
    } else if (plan->dtype == WEIGHT_F32) {
        float* out = (float*)destination;
        for (uint64_t i = 0; i < n; i++) out[i] = element_f32(t, i);
    } else if (plan->dtype == WEIGHT_F16) {
        uint16_t* out = (uint16_t*)destination;
        for (uint64_t i = 0; i < n; i++) out[i] = fp32_to_fp16(element_f32(t, i));
    } else if (plan->dtype == WEIGHT_I8) {
        regroup_q8_0(t, w, destination, n);
    } else { // WEIGHT_I4
        reorder_q4_0(t, w, destination, n);
    }
}

// ---- the whole model -------------------------------------------------------------------------

static uint64_t physical_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    return pages > 0 && page_size > 0 ? (uint64_t)pages * (uint64_t)page_size : UINT64_MAX;
}

// Every tensor the model uses, found and checked before anything large is
// allocated, and where each one goes.
typedef struct load_plan {
    int n_layers;
    int n_matrices;             // 7 * n_layers + 2
    matrix_plan* matrices;      // (n_matrices) token embedding, classifier, then wq .. w3 of each layer
    const gguf_tensor** norms;  // (2 n_layers + 1) attention and FFN norm of each layer, then the final norm
    const gguf_tensor** biases; // (3 n_layers) q, k, v of each layer; NULL: none
    const gguf_tensor* output;  // output.weight, or NULL: the classifier is tied to the embedding
    layer_weights* layers;      // (n_layers) handed to the model
    bool* used;                 // (n_tensors + 1: never a 0-byte calloc) whether the model reads tensor i
    float* bias_storage;        // (n_layers, dim + 2 kv_dim) q, k, v biases of each layer in fp32, or NULL
    unsigned char* storage;     // (storage_bytes) converted matrices, then widened norms
    uint64_t storage_bytes;     // each tensor's share rounded up to 64
} load_plan;

// What the load converts, for the stderr line.
typedef struct conversion_tally {
    uint64_t from_q8_bytes, from_q4_bytes, widened_bytes;
    uint64_t realigned_bytes;    // F32/F16 copied unchanged: in place they sat at misaligned addresses
    kquant_cost kquant_costs[3]; // Q4_K, Q5_K, Q6_K converted to int8
} conversion_tally;

static int load_plan_alloc(load_plan* p, const gguf_file* f, int n_layers, error_info* err) {
    const int L = n_layers;
    *p = (load_plan){.n_layers = L, .n_matrices = 7 * L + 2};
    p->matrices = calloc((size_t)p->n_matrices, sizeof *p->matrices);
    p->norms = calloc((size_t)(2 * L + 1), sizeof *p->norms);
    p->biases = calloc((size_t)(3 * L), sizeof *p->biases);
    p->layers = calloc((size_t)L, sizeof *p->layers);
    p->used = calloc((size_t)f->n_tensors + 1, sizeof *p->used);
    if (!p->matrices || !p->norms || !p->biases || !p->layers || !p->used) {
        free(p->matrices), free(p->norms), free(p->biases), free(p->layers), free(p->used);
        return error_set(err, "%s: out of memory for %d layers", f->name, L);
    }
    return 0;
}

// Frees what a failed load allocated; returns -1 for the caller to pass on.
static int load_plan_abandon(load_plan* p) {
    free(p->matrices), free(p->norms), free(p->biases), free(p->layers), free(p->used), free(p->bias_storage);
    return -1;
}

// Token embedding, classifier and final norm: the tensors outside the layers.
static int plan_model_tensors(load_plan* p, model* out, const gguf_file* f, const model_config* c,
                              error_info* err) {
    const uint64_t dim = (uint64_t)c->dim, vocab = (uint64_t)c->vocab_size;
    const gguf_tensor* embedding = gguf_find_tensor(f, "token_embd.weight"); // found by gguf_model_read_info
    p->matrices[0] = (matrix_plan){.tensor = embedding, .target = &out->token_embedding};
    p->output = gguf_find_tensor(f, "output.weight");
    p->matrices[1] = (matrix_plan){.tensor = p->output, .target = &out->classifier};
    if (check_shape(f, embedding, dim, vocab, err)) return -1;
    if (p->output && check_shape(f, p->output, dim, vocab, err)) return -1;
    const gguf_tensor* final_norm = gguf_find_tensor(f, "output_norm.weight");
    if (!final_norm) return error_set(err, "%s: tensor 'output_norm.weight' is missing", f->name);
    if (check_shape(f, final_norm, dim, 1, err)) return -1;
    p->norms[2 * p->n_layers] = final_norm;
    return 0;
}

// Layer l's seven matrices and two norms (LAYER_TENSORS).
static int plan_layer_tensors(load_plan* p, const gguf_file* f, const model_config* c, int l, error_info* err) {
    const uint64_t dim = (uint64_t)c->dim, kv_dim = (uint64_t)c->kv_dim, hidden = (uint64_t)c->hidden_dim;
    const uint64_t shapes[7][2] = {{dim, dim},    {dim, kv_dim},  {dim, kv_dim}, {dim, dim},
                                   {dim, hidden}, {hidden, dim}, {dim, hidden}};
    char name[96];
    for (int k = 0; k < 9; k++) {
        snprintf(name, sizeof name, "blk.%d.%s", l, LAYER_TENSORS[k].suffix);
        const gguf_tensor* t = gguf_find_tensor(f, name);
        if (!t) return error_set(err, "%s: tensor '%s' is missing", f->name, name);
        int m = LAYER_TENSORS[k].matrix;
        if (m >= 0) {
            p->matrices[2 + 7 * l + m] =
                (matrix_plan){.tensor = t, .target = (weight_matrix*)model_storage_layer_matrix(&p->layers[l], m)};
            if (check_shape(f, t, shapes[m][0], shapes[m][1], err)) return -1;
        } else {
            p->norms[m == -1 ? 2 * l : 2 * l + 1] = t;
            if (check_shape(f, t, dim, 1, err)) return -1;
        }
    }
    return 0;
}

// Layer l's q/k/v biases: qwen2 has all three (llama.cpp requires them),
// llama files may (optional there); either all three or none, in every layer alike.
static int plan_layer_biases(load_plan* p, const gguf_file* f, const model_config* c, int l, error_info* err) {
    static const char* const bias_names[3] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
    const uint64_t bias_sizes[3] = {(uint64_t)c->dim, (uint64_t)c->kv_dim, (uint64_t)c->kv_dim};
    const gguf_tensor** layer_biases = &p->biases[3 * l];
    char name[96];
    int n_found = 0;
    for (int k = 0; k < 3; k++) {
        snprintf(name, sizeof name, "blk.%d.%s", l, bias_names[k]);
        layer_biases[k] = gguf_find_tensor(f, name);
        if (!layer_biases[k]) continue;
        n_found++;
        if (check_shape(f, layer_biases[k], bias_sizes[k], 1, err)) return -1;
    }
    if (n_found != 0 && n_found != 3)
        return error_set(err, "%s: layer %d has %d of the 3 biases attn_q/k/v.bias: expected all or none", f->name, l,
                         n_found);
    if (n_found == 0 && c->rope_neox)
        return error_set(err, "%s: tensor 'blk.%d.attn_q.bias' is missing (qwen2 has q/k/v biases)", f->name, l);
    if (l > 0 && (n_found != 0) != (p->biases[0] != NULL))
        return error_set(err, "%s: layer %d %s q/k/v biases and layer 0 %s: expected every layer alike", f->name, l,
                         n_found ? "has" : "lacks", p->biases[0] ? "has them" : "does not");
    return 0;
}

// A tensor the model does not use (a bias, rope_freqs, ...) would change
// what the model computes: refused by name, as llama.cpp refuses a file
// whose tensor count does not match.
static int refuse_unused_tensors(load_plan* p, const gguf_file* f, error_info* err) {
    const int L = p->n_layers;
    for (int i = 0; i < p->n_matrices; i++)
        if (p->matrices[i].tensor) p->used[p->matrices[i].tensor - f->tensors] = true;
    for (int i = 0; i < 2 * L + 1; i++) p->used[p->norms[i] - f->tensors] = true;
    for (int i = 0; i < 3 * L; i++)
        if (p->biases[i]) p->used[p->biases[i] - f->tensors] = true;
    for (int i = 0; i < f->n_tensors; i++)
        if (!p->used[i])
            return error_set(err,
                             "%s: tensor '%s' is not one a llama model uses (biases, rope_freqs and the "
                             "like, other than q/k/v biases, are not supported)",
                             f->name, f->tensors[i].name);
    return 0;
}

static int plan_tensors(load_plan* p, model* out, const gguf_file* f, const model_config* c, error_info* err) {
    if (plan_model_tensors(p, out, f, c, err)) return -1;
    for (int l = 0; l < p->n_layers; l++)
        if (plan_layer_tensors(p, f, c, l, err) || plan_layer_biases(p, f, c, l, err)) return -1;
    int status = refuse_unused_tensors(p, f, err);
    free(p->used);
    p->used = NULL;
    return status;
}

static int allocate_biases(load_plan* p, const gguf_file* f, const model_config* c, error_info* err) {
    if (!p->biases[0]) return 0;
    p->bias_storage = malloc((size_t)p->n_layers * (size_t)(c->dim + 2 * c->kv_dim) * sizeof *p->bias_storage);
    if (!p->bias_storage) return error_set(err, "%s: out of memory for the biases", f->name);
    return 0;
}

// Each matrix's dtype and bytes in storage, and what converting them costs.
// Norms are fp32 in the kernels: a norm stored as F16/BF16 is widened.
static conversion_tally plan_conversions(load_plan* p, model_dtype_choice choice, const model_config* c) {
    conversion_tally tally = {0};
    for (int i = 0; i < p->n_matrices; i++) {
        matrix_plan* m = &p->matrices[i];
        if (!m->tensor) continue;
        m->dtype = dtype_for(m->tensor->type, choice, &m->mapped, &m->group_size, &m->asymmetric);
        const bool realigned = m->mapped && !aligned_for_type(m->tensor);
        if (realigned) {
            m->mapped = false;
            tally.realigned_bytes += m->tensor->bytes;
        }
        m->bytes = m->mapped ? 0 : round_up_64(storage_bytes(m));
        p->storage_bytes += m->bytes;
        if (m->dtype == WEIGHT_I8 && is_kquant(m->tensor->type)) {
            kquant_cost* cost = &tally.kquant_costs[m->tensor->type - GGUF_TENSOR_Q4_K];
            // A decode step streams each matrix once, but one row of the embedding
            // (the whole of it again when it is also the classifier).
            const double per_token = i == 0 ? 1.0 / (double)c->vocab_size + (p->output ? 0.0 : 1.0) : 1.0;
            cost->weights += m->tensor->ne[0] * m->tensor->ne[1];
            cost->extra_bytes_per_token += per_token * ((double)storage_bytes(m) - (double)m->tensor->bytes);
        } else if (m->dtype == WEIGHT_I8)
            tally.from_q8_bytes += m->tensor->bytes;
        else if (m->dtype == WEIGHT_I4) tally.from_q4_bytes += m->tensor->bytes;
        else if (!m->mapped && !realigned)
            tally.widened_bytes += m->tensor->bytes;
    }
    for (int i = 0; i < 2 * p->n_layers + 1; i++)
        if (norm_needs_copy(p->norms[i])) p->storage_bytes += round_up_64((uint64_t)c->dim * 4);
    return tally;
}

// Fails before allocating: the copies and the mapped file must fit in RAM.
static int allocate_storage(load_plan* p, const gguf_file* f, error_info* err) {
    const uint64_t total = p->storage_bytes, ram = physical_memory_bytes();
    if (total > ram || f->size > ram - total)
        return error_set(err, "%s: needs %llu bytes of converted weights plus the %zu-byte file, this machine has "
                              "%llu bytes of RAM",
                         f->name, (unsigned long long)total, f->size, (unsigned long long)ram);
    if (total > 0 && !(p->storage = streamed_memory_alloc((size_t)total)))
        return error_set(err, "%s: out of memory: %llu bytes for the converted weights", f->name,
                         (unsigned long long)total);
    return 0;
}

// Converts every matrix into storage (or points it into the file), then
// points each norm at the file or at its widened fp32 copy.
static void convert_weights(const load_plan* p, model* out, uint64_t dim) {
    const int L = p->n_layers;
    uint64_t offset = 0;
    for (int i = 0; i < p->n_matrices; i++) {
        if (!p->matrices[i].tensor) continue;
        convert_matrix(&p->matrices[i], p->storage ? p->storage + offset : NULL);
        offset += p->matrices[i].bytes;
    }
    for (int i = 0; i < 2 * L + 1; i++) {
        const gguf_tensor* norm = p->norms[i];
        const float* gain = (const float*)norm->data;
        if (norm_needs_copy(norm)) {
            float* widened = (float*)(p->storage + offset);
            for (uint64_t j = 0; j < dim; j++) widened[j] = element_f32(norm, j);
            gain = widened;
            offset += round_up_64(dim * 4);
        }
        if (i == 2 * L) out->rms_final = gain;
        else if (i % 2 == 0) p->layers[i / 2].rms_attention = gain;
        else p->layers[i / 2].rms_ffn = gain;
    }
}

// Each layer's q, k, v biases, widened to fp32 one after another in bias_storage.
static void convert_biases(const load_plan* p) {
    float* at = p->bias_storage;
    for (int l = 0; l < p->n_layers; l++) {
        float* targets[3];
        for (int k = 0; k < 3; k++) {
            const gguf_tensor* bias = p->biases[3 * l + k];
            targets[k] = at;
            for (uint64_t j = 0; j < bias->ne[0]; j++)
                at[j] = element_f32(bias, j);
            at += bias->ne[0];
        }
        p->layers[l].bq = targets[0];
        p->layers[l].bk = targets[1];
        p->layers[l].bv = targets[2];
    }
}

// weight_bytes and n_parameters: every matrix, norm and bias the model holds.
static void count_weights(model* out, bool has_output_matrix) {
    const model_config* c = &out->config;
    const int L = c->n_layers;
    const uint64_t dim = (uint64_t)c->dim, kv_dim = (uint64_t)c->kv_dim, vocab = (uint64_t)c->vocab_size;
    uint64_t norm_values = (uint64_t)(2 * L + 1) * dim, bytes = weight_matrix_bytes(&out->token_embedding),
             params = vocab * dim + norm_values;
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 7; k++) {
            const weight_matrix* w = model_storage_layer_matrix(&out->layers[l], k);
            bytes += weight_matrix_bytes(w);
            params += (uint64_t)w->rows * (uint64_t)w->cols;
        }
    if (has_output_matrix) {
        bytes += weight_matrix_bytes(&out->classifier);
        params += vocab * dim;
    }
    const uint64_t bias_values = out->bias_storage ? (uint64_t)L * (dim + 2 * kv_dim) : 0;
    out->weight_bytes = bytes + (norm_values + bias_values) * 4;
    out->n_parameters = params + bias_values;
}

// The k-quant part of the stderr line: one clause per type converted to int8.
static size_t describe_kquant_conversions(const conversion_tally* tally, char* line, size_t capacity) {
    static const char* const how[3] = {
        "int8 g32 asym (W8A16): codes M*q, fp16 scales d*sc/M, zero-points within d*sc/2M (M = 16 "
        "unless the offset needs a smaller one)",
        "int8 g32 asym (W8A16): codes M*q, fp16 scales d*sc/M, zero-points within d*sc/2M (M = 8 unless "
        "the offset needs a smaller one)",
        "int8 g16 sym (W8A16): codes q-32, fp16 scales d*sc"};
    static const double int8_bits[3] = {8.0 + 24.0 / 32, 8.0 + 24.0 / 32, 8.0 + 16.0 / 16}; // + scale, zero
    size_t used_chars = 0;
    for (int k = 0; k < 3; k++) {
        if (!tally->kquant_costs[k].weights || used_chars >= capacity) continue;
        const gguf_tensor_type type = (gguf_tensor_type)(GGUF_TENSOR_Q4_K + k);
        const double file_bits = 8.0 * (double)gguf_tensor_block_bytes(type) / KQUANT_SUPER_BLOCK;
        const double extra = tally->kquant_costs[k].extra_bytes_per_token;
        used_chars += (size_t)snprintf(line + used_chars, capacity - used_chars,
                                       "; %s -> %s: %.2f -> %.2f bits per weight, +%.1f %s per token",
                                       gguf_tensor_type_name(type), how[k], file_bits, int8_bits[k],
                                       extra >= 1e5 ? extra / 1e6 : extra / 1e3, extra >= 1e5 ? "MB" : "KB");
    }
    return used_chars;
}

// One stderr line saying what was converted, to what, and what it costs per token.
static void report_conversions(const gguf_file* f, model_dtype_choice choice, weight_dtype dtype,
                               const conversion_tally* tally) {
    const bool any_kquant = tally->kquant_costs[0].weights || tally->kquant_costs[1].weights ||
                            tally->kquant_costs[2].weights;
    if (!(tally->from_q8_bytes || tally->from_q4_bytes || tally->widened_bytes || tally->realigned_bytes || any_kquant))
        return;
    char line[1024] = "";
    size_t used_chars = describe_kquant_conversions(tally, line, sizeof line);
    if (tally->from_q8_bytes && used_chars < sizeof line)
        used_chars += (size_t)snprintf(line + used_chars, sizeof line - used_chars,
                                       "; Q8_0 -> int8 g32 (W8A8, int8 activations per 32): %llu bytes regrouped, "
                                       "codes and fp16 scales unchanged, same bytes per token",
                                       (unsigned long long)tally->from_q8_bytes);
    if (tally->from_q4_bytes && used_chars < sizeof line)
        used_chars += (size_t)snprintf(line + used_chars, sizeof line - used_chars,
                                       "; Q4_0 -> int4 g32 (W4A8, int8 activations per 32): %llu bytes, nibbles "
                                       "reordered, scales unchanged, same bytes per token",
                                       (unsigned long long)tally->from_q4_bytes);
    if (tally->realigned_bytes && used_chars < sizeof line)
        used_chars += (size_t)snprintf(line + used_chars, sizeof line - used_chars,
                                       "; %llu bytes of tensors copied to aligned memory (general.alignment %llu "
                                       "left them misaligned)",
                                       (unsigned long long)tally->realigned_bytes, (unsigned long long)f->alignment);
    if (tally->widened_bytes && used_chars < sizeof line)
        snprintf(line + used_chars, sizeof line - used_chars, "; %llu bytes of tensors %s to %s",
                 (unsigned long long)tally->widened_bytes,
                 choice == MODEL_DTYPE_FP16 ? "rounded or widened" : "widened (exact)", weight_dtype_name(dtype));
    fprintf(stderr, "%s: converted at load%s\n", f->name, line);
}

// The model's shapes: the file's, with the context length the options ask for.
static int read_config(const gguf_file* f, const gguf_model_options* options, model_config* config,
                       error_info* err) {
    gguf_model_info info;
    if (gguf_model_read_info(f, &info, err)) return -1;
    *config = info.config;
    if (options->context_length > 0) {
        config->max_seq_len = options->context_length;
        if (model_config_validate(config, f->name, err)) return -1;
    }
    return 0;
}

// Hands the plan's layers, storage and biases, and the file's mapping, to the model.
static void take_ownership(model* out, load_plan* p, gguf_file* f, const model_config* config) {
    snprintf(out->name, sizeof out->name, "%s", f->name);
    out->format = MODEL_FORMAT_GGUF;
    out->config = *config;
    out->layers = p->layers;
    out->storage = p->storage;
    out->bias_storage = p->bias_storage;
    void* mapping;
    size_t mapping_bytes;
    gguf_release_mapping(f, &mapping, &mapping_bytes);
    out->file_mapping = mapping;
    out->file_mapping_bytes = mapping_bytes;
    free(p->matrices);
    free(p->norms);
    free(p->biases);
}

int gguf_model_from_file(model* out, gguf_file* f, const gguf_model_options* options, error_info* err) {
    memset(out, 0, sizeof *out);
    gguf_model_options defaults = {MODEL_DTYPE_DEFAULT, 0, false};
    if (!options) options = &defaults;
    model_config config;
    if (read_config(f, options, &config, err)) return -1;

    load_plan plan;
    if (load_plan_alloc(&plan, f, config.n_layers, err)) return -1;
    if (plan_tensors(&plan, out, f, &config, err) || allocate_biases(&plan, f, &config, err))
        return load_plan_abandon(&plan);
    const conversion_tally tally = plan_conversions(&plan, options->dtype, &config);
    if (allocate_storage(&plan, f, err)) return load_plan_abandon(&plan);

    convert_weights(&plan, out, (uint64_t)config.dim);
    if (plan.bias_storage) convert_biases(&plan);
    // output.weight absent: the classifier is the embedding (tied). The
    // llama2c converter writes it anyway as a second copy; it stays a
    // separate matrix, as llama.cpp computes the logits from it.
    if (!plan.output) out->classifier = out->token_embedding;
    const bool has_output_matrix = plan.output != NULL;
    take_ownership(out, &plan, f, &config);
    out->dtype = out->layers[0].wq.dtype;
    count_weights(out, has_output_matrix);
    if (options->report_conversions) report_conversions(f, options->dtype, out->dtype, &tally);
    model_storage_build_tiles(out);
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
