// reference_forward: the model's forward pass written again from the math,
// to check the engine against something that does not share its bugs.
//
// One sequence, a contiguous fp32 KV cache, scalar C, one token at a time,
// no batching, no threads, no block tables and no call into kernels/ for
// the arithmetic: RMSNorm, RoPE, grouped-query attention, the SwiGLU
// feed-forward and the classifier are each a loop here, in the order of
// llama2.c's run.c. The only code shared with engine/forward.c is the
// loader (engine/model*.c, engine/gguf_model.c) and, for matrices that are
// not fp32, weight_row_to_f32 (the widening the engine's embedding lookup
// uses) to make the fp32 weight view.
//
// On stories260K it gives llama2.c's BOS logits to 1e-5 relative and its
// greedy ids exactly (tests/engine/test_reference_forward.c).
#ifndef SERVELAB_REFERENCE_FORWARD_H
#define SERVELAB_REFERENCE_FORWARD_H

#include <stdint.h>

#include "base/error.h"
#include "engine/model.h"

// One layer's weights in fp32, row-major [out][in].
typedef struct reference_layer {
    const float* rms_attention; // (dim)
    const float* wq;            // (dim, dim)
    const float* wk;            // (kv_dim, dim)
    const float* wv;            // (kv_dim, dim)
    const float* wo;            // (dim, dim)
    const float* rms_ffn;       // (dim)
    const float* w1;            // (hidden_dim, dim) gate
    const float* w2;            // (dim, hidden_dim) down
    const float* w3;            // (hidden_dim, dim) up
    const float* bq;            // (dim) or NULL
    const float* bk;            // (kv_dim) or NULL
    const float* bv;            // (kv_dim) or NULL
} reference_layer;

// The fp32 weight view of a model: fp32 matrices are borrowed from the
// model, every other dtype (fp16, Q8_0, int8, int4) is dequantized into
// `owned`, so a quantized model is checked against the reference on the
// very values its codes stand for.
typedef struct reference_weights {
    model_config config;
    const float* token_embedding; // (vocab_size, dim)
    reference_layer* layers;      // (n_layers)
    const float* rms_final;       // (dim)
    const float* classifier;      // (vocab_size, dim)
    float* owned;                 // the dequantized matrices, or NULL when all were fp32
    uint64_t owned_bytes;         // its size
} reference_weights;

// The bytes reference_weights_from_model would allocate for m (0 for an
// all-fp32 model): a caller with a memory cap asks before building.
uint64_t reference_weights_bytes(const model* m);

// Builds the view. The model must outlive it.
int reference_weights_from_model(reference_weights* out, const model* m, error_info* err);
void reference_weights_free(reference_weights* w);

// What the cache keeps of each K and V element. fp32 by default, as run.c;
// the other two round the way a serving cache stores them, so the engine's
// fp16 and int8 KV can be checked against the same stored values:
//   REFERENCE_KV_F16: the nearest fp16 (11 significant bits, ties to even);
//   REFERENCE_KV_I8:  per position and KV head, s = max|x| / 127 and
//                     x -> s * round(x / s) (ties to even; 0 for a zero head).
typedef enum reference_kv_storage {
    REFERENCE_KV_F32 = 0,
    REFERENCE_KV_F16 = 1,
    REFERENCE_KV_I8 = 2
} reference_kv_storage;

// One sequence being decoded: the KV cache of its positions so far.
typedef struct reference_run {
    const reference_weights* weights;
    reference_kv_storage kv_storage; // set after reference_run_init; REFERENCE_KV_F32 there
    int capacity;                    // positions the cache holds
    int n_positions;                 // tokens consumed so far
    float* key_cache;                // (n_layers, capacity, kv_dim)
    float* value_cache;              // (n_layers, capacity, kv_dim)
    float* scratch;                  // the activations: x, xb, xb2, q, hb, hb2, attention scores
} reference_run;

// The bytes a run of `capacity` positions allocates (for a memory cap).
uint64_t reference_run_bytes(const model_config* c, int capacity);

// capacity: 1..max_seq_len.
int reference_run_init(reference_run* run, const reference_weights* w, int capacity, error_info* err);
void reference_run_free(reference_run* run);

// Feeds the next token (at position run->n_positions). logits: (vocab_size)
// floats, the next token's logits, or NULL to skip the classifier.
// Refuses a token outside the vocabulary or a full cache.
int reference_run_token(reference_run* run, int32_t token, float* logits, error_info* err);

// The logits that follow tokens[0 .. n_tokens): tokens fed one by one from
// position 0, `logits` (vocab_size) floats from the last one.
int reference_last_logits(const reference_weights* w, const int32_t* tokens, int n_tokens, float* logits,
                          error_info* err);

#endif
