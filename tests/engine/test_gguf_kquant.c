// k-quants (Q4_K, Q5_K, Q6_K) through the GGUF loader (engine/gguf_model.c).
//
// The test packs super-blocks itself from chosen parameters (d, dmin, the
// 6-bit or int8 sub-block scales and mins, the codes), following ggml's
// block layouts (ggml-common.h), so the value each weight must have is
// known without reading the bytes back: d * sc * q - dmin * m (Q4_K, Q5_K)
// or d * sc * (q - 32) (Q6_K), computed in fp32 as ggml's dequantize_row_*
// does. A one-layer model of such matrices is written as a GGUF and loaded:
//   - with the fp32 choice, every weight equals that value exactly;
//   - by default (int8 groups of 32 asymmetric, or 16 symmetric), every
//     weight is within the conversion's bound: step / 2M, M = 16 for Q4_K
//     and 8 for Q5_K unless a large offset needs a smaller M to keep the
//     zero-point within 255, nothing for Q6_K, plus the fp16 rounding of the scale
//     (2^-11 relative, or 2^-25 absolute for a subnormal scale, times the
//     codes' range); sub-blocks made to miss the exact path (a zero step,
//     an offset beyond 255 steps) within half of one of 255 levels of their range;
//   - the forward pass on the int8 model stays close to the fp32 one.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/forward.h"
#include "engine/gguf.h"
#include "engine/gguf_model.h"
#include "engine/kv_memory.h"
#include "engine/model.h"
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/matmul.h"

enum { SUPER = 256, DIM = 256, HIDDEN = 256, VOCAB = 4, HEADS = 2 };

// ---- super-blocks from parameters -------------------------------------------------------------

// The parameters of one super-block and the value of each of its weights.
typedef struct block_params {
    gguf_tensor_type type;
    uint16_t d, dmin;    // fp16
    int scale[16];       // Q4_K/Q5_K: 8 six-bit scales; Q6_K: 16 int8 scales
    int min[8];          // Q4_K/Q5_K: 8 six-bit mins
    uint8_t q[SUPER];    // codes: 0..15, 0..31 or 0..63
    bool exact_path[16]; // false: a sub-block made to miss the exact conversion
} block_params;

static int sub_size(gguf_tensor_type type) { return type == GGUF_TENSOR_Q6_K ? 16 : 32; }

// ggml's fp32 dequantization from the parameters.
static float expected_value(const block_params* p, int e) {
    const float d = fp16_to_fp32(p->d);
    if (p->type == GGUF_TENSOR_Q6_K) return d * (float)p->scale[e / 16] * (float)(p->q[e] - 32);
    const int j = e / 32;
    return d * (float)p->scale[j] * (float)p->q[e] - fp16_to_fp32(p->dmin) * (float)p->min[j];
}

static float sub_step(const block_params* p, int k) { return fabsf(fp16_to_fp32(p->d) * (float)p->scale[k]); }

static size_t block_bytes(gguf_tensor_type type) {
    return type == GGUF_TENSOR_Q4_K ? 144 : type == GGUF_TENSOR_Q5_K ? 176 : 210;
}

static void put_u16(unsigned char* p, uint16_t v) {
    p[0] = (unsigned char)(v & 255);
    p[1] = (unsigned char)(v >> 8);
}

// Packs p into ggml's layout.
static void pack_block(const block_params* p, unsigned char* out) {
    memset(out, 0, block_bytes(p->type));
    if (p->type == GGUF_TENSOR_Q6_K) {
        unsigned char *low = out, *high = out + 128;
        for (int e = 0; e < SUPER; e++) {
            const int half = e / 128, quarter = e % 128 / 32, l = e % 32;
            unsigned char* low_byte = &low[64 * half + l + 32 * (quarter % 2)];
            *low_byte |= (unsigned char)(quarter < 2 ? p->q[e] & 15 : (p->q[e] & 15) << 4);
            high[32 * half + l] |= (unsigned char)((p->q[e] >> 4) << (2 * quarter));
        }
        for (int k = 0; k < 16; k++)
            out[192 + k] = (unsigned char)(int8_t)p->scale[k];
        put_u16(out + 208, p->d);
        return;
    }
    put_u16(out, p->d);
    put_u16(out + 2, p->dmin);
    unsigned char* scales = out + 4;
    for (int j = 0; j < 4; j++) {
        scales[j] = (unsigned char)(p->scale[j] | (p->scale[j + 4] >> 4) << 6);
        scales[j + 4] = (unsigned char)(p->min[j] | (p->min[j + 4] >> 4) << 6);
        scales[j + 8] = (unsigned char)((p->scale[j + 4] & 15) | (p->min[j + 4] & 15) << 4);
    }
    const bool five_bit = p->type == GGUF_TENSOR_Q5_K;
    unsigned char* nibbles = out + (five_bit ? 48 : 16);
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 32; l++) {
            const int q = p->q[32 * j + l];
            nibbles[32 * (j / 2) + l] |= (unsigned char)(j % 2 == 0 ? q & 15 : (q & 15) << 4);
            if (five_bit) out[16 + l] |= (unsigned char)(((q >> 4) & 1) << j);
        }
}

static uint64_t rng_state = 1;
static int random_below(int n) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (int)((rng_state >> 33) % (uint64_t)n);
}

// Typical parameters (llama.cpp-like magnitudes: steps near 1e-3, offsets
// a few steps), and in every 16th block one sub-block off the exact path.
static void random_block(block_params* p, gguf_tensor_type type, int index) {
    memset(p, 0, sizeof *p);
    p->type = type;
    const int max_q = type == GGUF_TENSOR_Q4_K ? 15 : type == GGUF_TENSOR_Q5_K ? 31 : 63;
    p->d = fp32_to_fp16(type == GGUF_TENSOR_Q6_K ? 2e-4f * (1 + random_below(8)) : 4e-5f * (1 + random_below(8)));
    p->dmin = fp32_to_fp16(3e-5f * (1 + random_below(8)));
    for (int k = 0; k < 16; k++) {
        p->scale[k] = type == GGUF_TENSOR_Q6_K ? random_below(255) - 127 : 1 + random_below(63);
        p->exact_path[k] = true;
    }
    for (int j = 0; j < 8; j++)
        p->min[j] = random_below(64);
    for (int e = 0; e < SUPER; e++)
        p->q[e] = (uint8_t)random_below(max_q + 1);
    if (index % 16 == 5) { // a zero step: the sub-block is the constant -offset
        p->scale[2] = 0;
        p->exact_path[2] = false;
        if (type == GGUF_TENSOR_Q6_K) p->exact_path[2] = true; // zero scale, zero codes' values: still exact
    }
    if (index % 16 == 9 && type != GGUF_TENSOR_Q6_K) { // offset 63 * dmin over a step of 1 * d: 63 * 40 steps
        p->dmin = fp32_to_fp16(40.0f * fp16_to_fp32(p->d));
        p->scale[6] = 1;
        p->min[6] = 63;
        p->exact_path[6] = false;
    }
}

// ---- the model file --------------------------------------------------------------------------

typedef struct kq_tensor {
    const char* name;
    int ne0, ne1;
    gguf_tensor_type type;
    block_params* blocks; // (ne0 * ne1 / 256) for k-quant types; NULL for F32 norms (all 1)
} kq_tensor;

static void put(unsigned char** buffer, size_t* size, const void* data, size_t n) {
    *buffer = realloc(*buffer, *size + n);
    assert_non_null(*buffer);
    memcpy(*buffer + *size, data, n);
    *size += n;
}
static void put_u32(unsigned char** b, size_t* n, uint32_t v) { put(b, n, &v, 4); }
static void put_u64(unsigned char** b, size_t* n, uint64_t v) { put(b, n, &v, 8); }
static void put_str(unsigned char** b, size_t* n, const char* s) {
    put_u64(b, n, strlen(s));
    put(b, n, s, strlen(s));
}
static void kv_u32(unsigned char** b, size_t* n, const char* key, uint32_t v) {
    put_str(b, n, key);
    put_u32(b, n, GGUF_VALUE_UINT32);
    put_u32(b, n, v);
}

enum { N_TENSORS = 12 };

static kq_tensor* make_tensors(void) {
    static const struct {
        const char* name;
        int ne0, ne1;
        gguf_tensor_type type;
    } layout[N_TENSORS] = {
        {"token_embd.weight", DIM, VOCAB, GGUF_TENSOR_Q4_K},
        {"output.weight", DIM, VOCAB, GGUF_TENSOR_Q6_K},
        {"output_norm.weight", DIM, 1, GGUF_TENSOR_F32},
        {"blk.0.attn_norm.weight", DIM, 1, GGUF_TENSOR_F32},
        {"blk.0.ffn_norm.weight", DIM, 1, GGUF_TENSOR_F32},
        {"blk.0.attn_q.weight", DIM, DIM, GGUF_TENSOR_Q4_K},
        {"blk.0.attn_k.weight", DIM, DIM, GGUF_TENSOR_Q5_K},
        {"blk.0.attn_v.weight", DIM, DIM, GGUF_TENSOR_Q6_K},
        {"blk.0.attn_output.weight", DIM, DIM, GGUF_TENSOR_Q5_K},
        {"blk.0.ffn_gate.weight", DIM, HIDDEN, GGUF_TENSOR_Q4_K},
        {"blk.0.ffn_up.weight", DIM, HIDDEN, GGUF_TENSOR_Q6_K},
        {"blk.0.ffn_down.weight", HIDDEN, DIM, GGUF_TENSOR_Q5_K},
    };
    kq_tensor* tensors = calloc(N_TENSORS, sizeof *tensors);
    assert_non_null(tensors);
    rng_state = 1;
    for (int i = 0; i < N_TENSORS; i++) {
        tensors[i] = (kq_tensor){layout[i].name, layout[i].ne0, layout[i].ne1, layout[i].type, NULL};
        if (layout[i].type == GGUF_TENSOR_F32) continue;
        const int n_blocks = layout[i].ne0 * layout[i].ne1 / SUPER;
        tensors[i].blocks = calloc((size_t)n_blocks, sizeof *tensors[i].blocks);
        assert_non_null(tensors[i].blocks);
        for (int b = 0; b < n_blocks; b++)
            random_block(&tensors[i].blocks[b], layout[i].type, b);
    }
    return tensors;
}

static void free_tensors(kq_tensor* tensors) {
    for (int i = 0; i < N_TENSORS; i++)
        free(tensors[i].blocks);
    free(tensors);
}

static unsigned char* write_file(const kq_tensor* tensors, size_t* size) {
    unsigned char* b = NULL;
    size_t n = 0;
    put(&b, &n, "GGUF", 4);
    put_u32(&b, &n, 3);
    put_u64(&b, &n, N_TENSORS);
    put_u64(&b, &n, 7);
    put_str(&b, &n, "general.architecture");
    put_u32(&b, &n, GGUF_VALUE_STRING);
    put_str(&b, &n, "llama");
    kv_u32(&b, &n, "llama.context_length", 16);
    kv_u32(&b, &n, "llama.embedding_length", DIM);
    kv_u32(&b, &n, "llama.feed_forward_length", HIDDEN);
    kv_u32(&b, &n, "llama.block_count", 1);
    kv_u32(&b, &n, "llama.attention.head_count", HEADS);
    kv_u32(&b, &n, "llama.attention.head_count_kv", HEADS);
    uint64_t offset = 0;
    size_t data_bytes[N_TENSORS];
    for (int i = 0; i < N_TENSORS; i++) {
        const kq_tensor* t = &tensors[i];
        data_bytes[i] = t->blocks ? (size_t)(t->ne0 * t->ne1 / SUPER) * block_bytes(t->type) : (size_t)t->ne0 * 4;
        put_str(&b, &n, t->name);
        put_u32(&b, &n, t->ne1 > 1 ? 2 : 1);
        put_u64(&b, &n, (uint64_t)t->ne0);
        if (t->ne1 > 1) put_u64(&b, &n, (uint64_t)t->ne1);
        put_u32(&b, &n, t->type);
        put_u64(&b, &n, offset);
        offset += (data_bytes[i] + 31) / 32 * 32;
    }
    static const unsigned char zeros[32] = {0};
    unsigned char packed[210];
    for (int i = 0; i < N_TENSORS; i++) {
        const kq_tensor* t = &tensors[i];
        put(&b, &n, zeros, (32 - n % 32) % 32);
        if (!t->blocks) {
            for (int j = 0; j < t->ne0; j++)
                put(&b, &n, &(float){1.0f}, 4);
            continue;
        }
        for (int k = 0; k < t->ne0 * t->ne1 / SUPER; k++) {
            pack_block(&t->blocks[k], packed);
            put(&b, &n, packed, block_bytes(t->type));
        }
    }
    *size = n;
    return b;
}

static void load(model* m, const unsigned char* bytes, size_t size, model_dtype_choice dtype) {
    gguf_file f;
    error_info err = {{0}};
    if (gguf_parse(&f, bytes, size, "kquant.gguf", &err)) fail_msg("gguf_parse: %s", err.message);
    gguf_model_options options = {dtype, 0, false};
    if (gguf_model_from_file(m, &f, &options, &err)) fail_msg("gguf_model_from_file: %s", err.message);
    gguf_close(&f);
}

static const char* matrix_name(const char* tensor) {
    if (strcmp(tensor, "token_embd.weight") == 0) return "token_embedding";
    if (strcmp(tensor, "output.weight") == 0) return "classifier";
    static const char* const pairs[7][2] = {{"attn_q", "wq"},      {"attn_k", "wk"},   {"attn_v", "wv"},
                                            {"attn_output", "wo"}, {"ffn_gate", "w1"}, {"ffn_up", "w3"},
                                            {"ffn_down", "w2"}};
    static char name[32];
    for (int i = 0; i < 7; i++) {
        char gguf_name[48];
        snprintf(gguf_name, sizeof gguf_name, "blk.0.%s.weight", pairs[i][0]);
        if (strcmp(tensor, gguf_name) == 0) {
            snprintf(name, sizeof name, "layers.0.%s", pairs[i][1]);
            return name;
        }
    }
    return NULL;
}

// ---- the tests --------------------------------------------------------------------------------

// A Q4_K, a Q5_K and a Q6_K block whose weights were worked out by hand.
static void test_hand_built_blocks(void** state) {
    (void)state;
    block_params q4 = {.type = GGUF_TENSOR_Q4_K, .d = fp32_to_fp16(0.5f), .dmin = fp32_to_fp16(0.25f)};
    q4.scale[0] = 3, q4.min[0] = 5, q4.q[0] = 7;             // 0.5 * 3 * 7 - 0.25 * 5 = 9.25
    q4.scale[5] = 33, q4.min[5] = 60, q4.q[5 * 32 + 1] = 15; // 0.5 * 33 * 15 - 0.25 * 60 = 232.5
    assert_float_equal(expected_value(&q4, 0), 9.25f, 0.0f);
    assert_float_equal(expected_value(&q4, 161), 232.5f, 0.0f);
    block_params q5 = q4;
    q5.type = GGUF_TENSOR_Q5_K;
    q5.q[3 * 32 + 31] = 31, q5.scale[3] = 2, q5.min[3] = 1; // 0.5 * 2 * 31 - 0.25 = 30.75
    assert_float_equal(expected_value(&q5, 127), 30.75f, 0.0f);
    block_params q6 = {.type = GGUF_TENSOR_Q6_K, .d = fp32_to_fp16(0.125f)};
    q6.scale[9] = -4, q6.q[9 * 16 + 2] = 63; // 0.125 * -4 * 31 = -15.5
    q6.scale[15] = 100, q6.q[255] = 0;       // 0.125 * 100 * -32 = -400
    assert_float_equal(expected_value(&q6, 146), -15.5f, 0.0f);
    assert_float_equal(expected_value(&q6, 255), -400.0f, 0.0f);

    // Those blocks as a model's matrices: the fp32 load gives those very values.
    kq_tensor* tensors = make_tensors();
    tensors[0].blocks[0] = q4; // token_embd, row 0
    tensors[1].blocks[0] = q6; // output, row 0
    tensors[6].blocks[0] = q5; // attn_k, row 0
    size_t size = 0;
    unsigned char* bytes = write_file(tensors, &size);
    model m;
    load(&m, bytes, size, MODEL_DTYPE_FP32);
    float row[DIM];
    weight_row_to_f32(row, model_matrix_by_name(&m, "token_embedding"), 0, NULL);
    assert_float_equal(row[0], 9.25f, 0.0f);
    assert_float_equal(row[161], 232.5f, 0.0f);
    weight_row_to_f32(row, model_matrix_by_name(&m, "classifier"), 0, NULL);
    assert_float_equal(row[146], -15.5f, 0.0f);
    assert_float_equal(row[255], -400.0f, 0.0f);
    weight_row_to_f32(row, model_matrix_by_name(&m, "layers.0.wk"), 0, NULL);
    assert_float_equal(row[127], 30.75f, 0.0f);
    model_free(&m);
    free(bytes);
    free_tensors(tensors);
}

// Every weight of every k-quant matrix: exact in fp32, within the bound in int8.
static void test_conversion_error_bound(void** state) {
    (void)state;
    kq_tensor* tensors = make_tensors();
    size_t size = 0;
    unsigned char* bytes = write_file(tensors, &size);
    model wide, narrow;
    load(&wide, bytes, size, MODEL_DTYPE_FP32);
    load(&narrow, bytes, size, MODEL_DTYPE_DEFAULT);
    float wide_row[DIM], narrow_row[DIM];
    // Q4_K, Q5_K, Q6_K: max |error| / step on the exact path, scaled to M = 16
    double worst_in_steps[3] = {0, 0, 0};
    int fallbacks = 0;
    for (int i = 0; i < N_TENSORS; i++) {
        const kq_tensor* t = &tensors[i];
        if (!t->blocks) continue;
        const weight_matrix* w = model_matrix_by_name(&narrow, matrix_name(t->name));
        assert_non_null(w);
        assert_int_equal(w->dtype, WEIGHT_I8);
        assert_int_equal(w->group_size, sub_size(t->type));
        assert_true((w->zero_points != NULL) == (t->type != GGUF_TENSOR_Q6_K));
        const int k_type = t->type - GGUF_TENSOR_Q4_K;
        const int max_q[3] = {15, 31, 63};
        for (int r = 0; r < t->ne1; r++) {
            weight_row_to_f32(wide_row, model_matrix_by_name(&wide, matrix_name(t->name)), r, NULL);
            weight_row_to_f32(narrow_row, w, r, NULL);
            for (int c = 0; c < t->ne0; c++) {
                const block_params* p = &t->blocks[(r * t->ne0 + c) / SUPER];
                const int e = (r * t->ne0 + c) % SUPER, k = e / sub_size(t->type);
                const float expected = expected_value(p, e);
                if (wide_row[c] != expected)
                    fail_msg("%s[%d][%d]: fp32 load %.9g, ggml's value %.9g", t->name, r, c, wide_row[c], expected);
                const double error = fabs((double)narrow_row[c] - expected), step = sub_step(p, k);
                double bound;
                // An offset beyond 255 steps has no zero-point even at M = 1.
                const bool offset_fits =
                    t->type == GGUF_TENSOR_Q6_K || step == 0 || fp16_to_fp32(p->dmin) * p->min[k] / step <= 254.5;
                if (p->exact_path[k] && offset_fits) {
                    // + the scale's fp16 rounding: 2^-11 relative, or half a subnormal
                    // ulp (2^-25) times the codes' range (255) below 2^-14.
                    // The offset moves by at most step / 2M, M the largest of 16, 8, 4,
                    // 2, 1 that leaves the codes M * q and the zero-point M * offset / step
                    // inside 0..255 (Q6_K: no offset).
                    double offset_error = 0;
                    if (t->type != GGUF_TENSOR_Q6_K && step > 0) {
                        const double ratio = fp16_to_fp32(p->dmin) * p->min[k] / step;
                        int multiple = 16;
                        while (multiple > 1 && (multiple * max_q[k_type] > 255 || multiple * ratio > 254.5))
                            multiple /= 2;
                        offset_error = step / (2 * multiple);
                        worst_in_steps[k_type] = fmax(worst_in_steps[k_type], error / step * multiple / 16);
                    } else if (step > 0) {
                        worst_in_steps[k_type] = fmax(worst_in_steps[k_type], error / step);
                    }
                    // The converter picks the M of least error over the sub-block, so
                    // a weight may carry a share of the sub-block's largest rounding.
                    double largest = 0;
                    for (int i2 = 0; i2 < sub_size(t->type); i2++)
                        largest = fmax(largest, fabs(expected_value(p, k * sub_size(t->type) + i2)));
                    bound = offset_error + 0x1p-11 * (largest + step) + 255 * 0x1p-25;
                } else {
                    double lo = 0, hi = 0; // the sub-block's range, with 0
                    for (int i2 = 0; i2 < sub_size(t->type); i2++) {
                        double v = expected_value(p, k * sub_size(t->type) + i2);
                        lo = fmin(lo, v), hi = fmax(hi, v);
                    }
                    bound = (hi - lo) / 510 + 0x1p-11 * (hi - lo) + 255 * 0x1p-25; // half a level, the scale's rounding
                    fallbacks += c % sub_size(t->type) == 0;
                }
                if (error > bound)
                    fail_msg("%s[%d][%d]: int8 %.9g, expected %.9g: error %.3g above the bound %.3g (step %.3g, offset "
                             "%.9g, q %d)",
                             t->name, r, c, narrow_row[c], expected, error, bound, step,
                             t->type == GGUF_TENSOR_Q6_K ? 0.0 : (double)(fp16_to_fp32(p->dmin) * (float)p->min[k]),
                             p->q[e]);
            }
        }
    }
    print_message("max error / step on the exact path (at M = 16): Q4_K %.4f, Q5_K %.4f, Q6_K %.5f; %d sub-blocks "
                  "off it\n",
                  worst_in_steps[0], worst_in_steps[1], worst_in_steps[2], fallbacks);
    assert_true(fallbacks > 0);
    assert_true(worst_in_steps[0] <= 1.0 / 32 + 0x1p-11 * 17);

    // The forward pass on the int8 model stays near the fp32 one: logits of
    // 3 tokens within 1% of their spread.
    kv_memory kv[2];
    forward_state fs[2];
    float logits[2][3 * VOCAB];
    const model* models[2] = {&wide, &narrow};
    error_info err = {{0}};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(kv_memory_init(&kv[i], &models[i]->config, KV_F32, 1, 16, &err), 0);
        assert_int_equal(forward_state_init(&fs[i], &models[i]->config, 3, 16, &err), 0);
        const int32_t table[1] = {0};
        const int32_t* tables[1] = {table};
        batch_row rows[3] = {{1, 0, 0, true}, {3, 1, 0, true}, {2, 2, 0, true}};
        int32_t slots[3];
        forward_batch_map_slots(slots, rows, 3, tables, 16);
        forward_batch batch = {3, rows, 1, tables, slots};
        if (forward(models[i], &fs[i], &kv[i], &batch, logits[i], NULL, &err)) fail_msg("forward: %s", err.message);
        forward_state_free(&fs[i]);
        kv_memory_free(&kv[i]);
    }
    double spread = 0, difference = 0;
    for (int i = 0; i < 3 * VOCAB; i++) {
        spread = fmax(spread, fabs(logits[0][i]));
        difference = fmax(difference, fabs(logits[0][i] - logits[1][i]));
    }
    print_message("logits: max |fp32 - int8| %.3g of max |logit| %.3g\n", difference, spread);
    assert_true(spread > 0);
    assert_true(difference < 0.01 * spread);
    model_free(&wide);
    model_free(&narrow);
    free(bytes);
    free_tensors(tensors);
}

// The int8 copy's bytes: 8.75 bits per weight for Q4_K/Q5_K (code, fp16
// scale and zero-point per 32), 9 for Q6_K (code, fp16 scale per 16).
static void test_converted_bytes(void** state) {
    (void)state;
    kq_tensor* tensors = make_tensors();
    size_t size = 0;
    unsigned char* bytes = write_file(tensors, &size);
    model m;
    load(&m, bytes, size, MODEL_DTYPE_DEFAULT);
    const uint64_t square = (uint64_t)DIM * DIM;
    assert_int_equal(weight_matrix_bytes(model_matrix_by_name(&m, "layers.0.wq")), square * 875 / 800); // Q4_K
    assert_int_equal(weight_matrix_bytes(model_matrix_by_name(&m, "layers.0.wk")), square * 875 / 800); // Q5_K
    assert_int_equal(weight_matrix_bytes(model_matrix_by_name(&m, "layers.0.wv")), square * 9 / 8);     // Q6_K
    model_free(&m);
    free(bytes);
    free_tensors(tensors);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_built_blocks),
        cmocka_unit_test(test_conversion_error_bound),
        cmocka_unit_test(test_converted_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
