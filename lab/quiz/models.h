// quiz_models: real model shapes (quiz/models.lua) for the numeric drills.
#ifndef SERVELAB_QUIZ_MODELS_H
#define SERVELAB_QUIZ_MODELS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

// The shortest sequence the drills ask about (drill-sequences-fit's 512),
// so a model's context must hold at least that.
enum { QUIZ_MIN_CONTEXT_TOKENS = 512 };

typedef struct quiz_model {
    char name[48];
    int n_layers;   // L
    int d_model;    // hidden size
    int n_heads;    // query heads
    int n_kv_heads; // key/value heads (< n_heads: grouped-query attention)
    int head_dim;   // n_heads * head_dim = d_model
    int vocab_size;
    int intermediate_size; // feed-forward width
    bool tied_embeddings;  // the output matrix is the embedding matrix
    int context_tokens;    // max_position_embeddings: the longest sequence a drill asks about (0: no limit)
} quiz_model;

typedef struct quiz_model_list {
    quiz_model* models; // (n_models)
    int n_models;
} quiz_model_list;

// Loads and checks models.lua (every field present and positive,
// n_kv_heads divides n_heads, n_heads * head_dim = d_model; the context,
// max_position_embeddings, at least 512 tokens: the shortest S a drill asks about).
int quiz_models_load(const char* path, quiz_model_list* list, error_info* err);
void quiz_models_free(quiz_model_list* list);

// Parameters of a Llama-style decoder: embedding (vocab x d_model), per
// layer q and o (d_model x n_heads*head_dim), k and v (d_model x
// n_kv_heads*head_dim), gate, up and down (d_model x intermediate) and two
// norm vectors, then the final norm and the output matrix (unless tied).
// Biases (Qwen2.5 has q/k/v biases, 0.002% of its weights) are left out.
uint64_t quiz_model_params(const quiz_model* m);

// KV bytes one token adds: 2 (K and V) x layers x kv_heads x head_dim x bytes_per_value.
uint64_t quiz_model_kv_bytes_per_token(const quiz_model* m, bool grouped_query, int bytes_per_value);

#endif
