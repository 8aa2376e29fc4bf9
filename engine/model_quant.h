// model_quant: quantizes a loaded model's linear layers in place.
//
// Schemes: W8A16 and W4A16 (weight-only: packed int8 / int4 weights, fp32
// activations), and W8A8 and W4A8 (symmetric int8 / int4 weights times int8
// activations quantized at run time, integer dot products: llama.cpp's
// q8_0 / q4_0 CPU path). The activations of W8A8 and W4A8 get one scale per
// block of 32 columns when the weight group is a multiple of 32, else one
// per weight group; W8A8 with per-channel weights (its default) or with
// ":token" gets one scale per row (per token) instead; W4A8 with
// per-channel weights takes blocks of 32 (or the whole row when 32 does
// not divide it).
// Methods: RTN, AWQ, GPTQ (engine/quant.h), calibrated on token sequences
// run through the unquantized model while the inputs of every linear layer
// are collected. After quantization the model holds only the packed codes
// and their scales (plus the fp32 RMSNorm gains): no fp16 or fp32 copy of
// a quantized matrix survives.
//
// AWQ's per-channel scales are folded into the operation before each
// matrix group: the attention and FFN RMSNorm gains (for wq/wk/wv and
// w1/w3), the rows of w3 (for w2, whose input is silu(w1 x) * w3 x), and
// the rows of wv (for wo) when every query head has its own KV head; with
// grouped-query attention wo's input channels cannot be scaled through wv,
// so wo falls back to RTN. The embedding (and the classifier it is shared
// with) is always RTN: its columns cannot be rescaled without changing
// the embedding lookup.
#ifndef SERVELAB_MODEL_QUANT_H
#define SERVELAB_MODEL_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/model.h"
#include "engine/quant.h"
#include "kernels/cpu/thread_pool.h"

typedef enum quant_weight_scheme { QUANT_W8A16 = 0, QUANT_W4A16 = 1, QUANT_W8A8 = 2, QUANT_W4A8 = 3 } quant_weight_scheme;
typedef enum quant_method { QUANT_RTN = 0, QUANT_AWQ = 1, QUANT_GPTQ = 2 } quant_method;

typedef struct model_quant_spec {
    quant_weight_scheme scheme;
    int group_size;     // inputs per scale; 0 = per output channel
    quant_method method;
    bool symmetric;     // W8A8 and W4A8 are always symmetric
    bool per_token_activations; // W8A8: one activation scale per row even with grouped weights (":token")
    // Asked before each layer (may be NULL): when it returns false, the
    // quantization stops with an error and the model is unchanged. AWQ or
    // GPTQ of a model is seconds of C; the lesson host stops it this way
    // when a lesson's time limit is spent.
    bool (*keep_going)(void* user);
    void* keep_going_user;
} model_quant_spec;

// "w4a16", "w4a16:g32", "w4a16:g32:awq", "w8a8:gptq", "w8a16:g64:rtn:asym",
// "w4a8:g32:sym", "w8a8:g32", "w8a8:g32:token".
// Default group: 64 for w4a16, 32 for w4a8, per channel for w8a16 and
// w8a8; default method rtn; asymmetric (a zero-point per group) except
// w8a8 and w4a8, whose integer products need symmetric weights.
int model_quant_spec_parse(const char* text, model_quant_spec* out, error_info* err);

// One line for reports: "w4a16 g64 awq asym", "w8a8 g32 rtn sym token".
void model_quant_spec_describe(const model_quant_spec* spec, char* out, size_t capacity);

typedef struct quant_layer_report {
    char name[32];       // "layers.3.w2", "token_embedding"
    double scale_mean;   // mean step size over the matrix's groups
    double mse;          // mean (w - w_hat)^2 against the original weights
    double max_error;    // max |w - w_hat|
    int64_t clipped;     // values saturated by clipping
    float awq_alpha;     // AWQ's chosen exponent (-1 when not AWQ)
} quant_layer_report;

typedef struct model_quant_report {
    quant_layer_report* layers; // (n_layers) one per quantized matrix
    int n_layers;
    uint64_t weight_bytes_before;
    uint64_t weight_bytes_after;
    int n_calibration_tokens;
} model_quant_report;

// Calibration: n_sequences token sequences (BOS first) of lengths[i] tokens.
// pool may be NULL. report may be NULL. On failure the model is unchanged.
int model_quantize(model* m, const model_quant_spec* spec, const int32_t* const* sequences, const int* lengths,
                   int n_sequences, thread_pool* pool, model_quant_report* report, error_info* err);

void model_quant_report_free(model_quant_report* report);

#endif
