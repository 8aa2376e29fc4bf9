// model: a Llama-style transformer's configuration and weights.
//
// Sources: llama2.c checkpoints (legacy headerless format, export version 1
// fp32 and version 2 Q8_0), llama.cpp GGUF files (engine/gguf_model.c) and synthetic presets
// generated from a seed (engine/model_synth.c). All loaders validate every field before trusting
// it and report one line naming the file, the field and what was expected.
#ifndef SERVELAB_MODEL_H
#define SERVELAB_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/cpu/matmul.h"

#define MODEL_EXPORT_MAGIC 0x616b3432u // "ak42" in llama2.c's export header
#define MODEL_EXPORT_HEADER_BYTES 256
#define MODEL_RMS_EPS 1e-5f
#define MODEL_MAX_STOP_TOKENS 8

typedef struct model_config {
    int dim;               // residual stream width (d_model)
    int hidden_dim;        // feed-forward inner width
    int n_layers;          // transformer blocks
    int n_heads;           // query heads
    int n_kv_heads;        // key/value heads (< n_heads: grouped-query attention)
    int vocab_size;        // tokens
    int max_seq_len;       // longest sequence the model supports (tokens)
    int head_dim;          // dim / n_heads
    int kv_dim;            // n_kv_heads * head_dim
    bool shared_classifier; // the classifier reuses the token embedding
    // Per-model hyper-parameters (GGUF metadata). Zero means llama2.c's
    // value, so every config built before these existed keeps its math:
    float rope_base;   // RoPE frequency base theta; 0: 10000 (MODEL_ROPE_BASE)
    int rope_dims;     // leading dimensions of each head that RoPE rotates (even); 0: head_dim
    bool rope_neox;    // pairs (i, i + rope_dims / 2) (GPT-NeoX; qwen2) instead of (2i, 2i + 1)
    float rms_epsilon; // RMSNorm epsilon; 0: 1e-5 (MODEL_RMS_EPS)
} model_config;

#define MODEL_ROPE_BASE 10000.0f

// The values the forward pass uses (the zero defaults resolved).
static inline float model_rms_epsilon(const model_config* c) {
    return c->rms_epsilon > 0.0f ? c->rms_epsilon : MODEL_RMS_EPS;
}
static inline float model_rope_base(const model_config* c) {
    return c->rope_base > 0.0f ? c->rope_base : MODEL_ROPE_BASE;
}
static inline int model_rope_dims(const model_config* c) { return c->rope_dims > 0 ? c->rope_dims : c->head_dim; }

typedef enum model_format {
    MODEL_FORMAT_SYNTHETIC = 0,
    MODEL_FORMAT_LEGACY = 1,     // llama2.c headerless fp32 (version 0)
    MODEL_FORMAT_EXPORT_V1 = 2,  // "ak42" version 1, fp32
    MODEL_FORMAT_EXPORT_V2 = 3,  // "ak42" version 2, Q8_0 groups
    MODEL_FORMAT_GGUF = 4,       // llama.cpp's GGUF, v2 or v3 (engine/gguf_model.h)
} model_format;

typedef struct layer_weights {
    const float* rms_attention; // (dim) RMSNorm gain before attention
    weight_matrix wq;           // (dim, dim)
    weight_matrix wk;           // (kv_dim, dim)
    weight_matrix wv;           // (kv_dim, dim)
    weight_matrix wo;           // (dim, dim)
    const float* rms_ffn;       // (dim) RMSNorm gain before the feed-forward
    weight_matrix w1;           // (hidden_dim, dim) gate
    weight_matrix w2;           // (dim, hidden_dim) down
    weight_matrix w3;           // (hidden_dim, dim) up
    // Biases added after wq, wk, wv (qwen2); NULL when the model has none (llama).
    const float* bq; // (dim)
    const float* bk; // (kv_dim)
    const float* bv; // (kv_dim)
} layer_weights;

typedef struct model {
    char name[128];               // file name or preset name, for messages
    model_format format;
    model_config config;
    weight_dtype dtype;           // how the matrices are stored
    weight_matrix token_embedding; // (vocab_size, dim)
    layer_weights* layers;        // (n_layers)
    const float* rms_final;       // (dim)
    weight_matrix classifier;     // (vocab_size, dim); the embedding when shared
    uint64_t weight_bytes;        // every weight byte held (norms + matrices + scales)
    uint64_t n_parameters;        // number of weight values
    void* storage;                // one allocation holding every tensor
    void* tile_storage;           // the fp16 or fp32 matrices again in the kernel's tile layout, or NULL
    uint64_t tile_bytes;          // its size (held, never streamed twice: the kernel reads one copy)
    uint64_t nonfinite_values;    // NaN/Inf weights found by model_load (0 for a sound checkpoint)
    // A GGUF's read-only mapping of the whole file: the F32 and F16
    // matrices point straight into it (the bytes streamed are the file's),
    // and model_free unmaps it. NULL for every other source.
    const void* file_mapping;
    uint64_t file_mapping_bytes;
    // The q/k/v biases of every layer in fp32, a block of its own (model_quantize
    // replaces `storage`, and biases stay fp32 whatever the matrices become); NULL without biases.
    float* bias_storage;
    // Tokens that end a generation (a GGUF's EOS, EOT, ...: engine/gguf_vocab.h).
    // n_stop_tokens 0: llama2.c's convention, EOS 2 and BOS 1 (a new story).
    int32_t stop_tokens[MODEL_MAX_STOP_TOKENS];
    int n_stop_tokens;
} model;

typedef enum model_dtype_choice {
    MODEL_DTYPE_DEFAULT = 0, // fp32 for fp32 checkpoints, fp16 for synthetic, Q8_0 for v2
    MODEL_DTYPE_FP32 = 1,
    MODEL_DTYPE_FP16 = 2,
} model_dtype_choice;

// Checks a config: every dimension positive, dim divisible by n_heads,
// n_heads divisible by n_kv_heads, even head size, sizes below limits that
// keep every product inside 64 bits. `source` names the file in messages.
int model_config_validate(model_config* config, const char* source, error_info* err);

// Loads a llama2.c checkpoint (format detected from the header). A GGUF
// file is refused here with a message: gguf_model_load (engine/gguf_model.h)
// reads it, and lab/common/model_source.c picks the loader by the file's magic. dtype
// chooses how fp32 tensors are stored (fp32 or fp16); a v2 file keeps its
// Q8_0 matrices unless fp32/fp16 is asked, in which case they are widened.
// A file whose weights hold NaN or Inf still loads, with one warning line
// on stderr naming the first such tensor (and m->nonfinite_values set): the
// one place the engine prints, since its callers cannot see the weights.
int model_load(model* out, const char* path, model_dtype_choice dtype, error_info* err);

// Frees what a loader or synthesizer allocated; safe on a zeroed model.
void model_free(model* m);

// The weight bytes streamed per decoded token: every matrix and norm once,
// the embedding row of the token, and the classifier.
uint64_t model_decode_weight_bytes(const model* m);

const char* weight_dtype_name(weight_dtype dtype);

// A matrix by name: "token_embedding", "classifier", or "layers.L.KIND" with
// KIND one of wq wk wv wo w1 w2 w3. NULL when there is no such matrix.
const weight_matrix* model_matrix_by_name(const model* m, const char* name);

#endif
