// forward: one transformer pass over a batch of rows.
//
// A row is one token of one sequence at one position. A batch may hold
// several sequences and several rows of the same sequence (a prompt's
// tokens, in position order): each weight matrix is applied to all rows at
// once, and each row attends over its own sequence's cached keys and values
// up to and including its position. Rows of a sequence must appear in
// increasing position order, and every earlier position of that sequence
// must already be in the cache or earlier in the batch.
#ifndef SERVELAB_FORWARD_H
#define SERVELAB_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/kv_memory.h"
#include "engine/model.h"
#include "engine/tensor_parallel.h"
#include "kernels/cpu/kernel_traffic.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

typedef struct batch_row {
    int32_t token;     // token id
    int32_t position;  // position in its sequence (tokens before it)
    int32_t sequence;  // index into forward_batch.block_tables
    bool wants_logits; // compute this row's logits (last prompt token, decode rows)
} batch_row;

typedef struct forward_batch {
    int n_rows;
    const batch_row* rows;              // (n_rows)
    int n_sequences;
    const int32_t* const* block_tables; // (n_sequences) each (blocks covering its positions); attention reads them
    const int32_t* slot_mapping;        // (n_rows) KV slot each row's key and value are written to
} forward_batch;

// The KV slot of each row's position, as its sequence's block table places
// it: table[position / block_size] * block_size + position % block_size.
// slot_mapping: (n_rows). A contiguous cache's table lists slots (block
// size 1).
void forward_batch_map_slots(int32_t* slot_mapping, const batch_row* rows, int n_rows,
                             const int32_t* const* block_tables, int block_size);

// Where the forward pass can show its intermediate activations (for
// quantization calibration): the input of each group of linear layers.
typedef enum capture_site {
    CAPTURE_ATTENTION_INPUT = 0, // RMSNorm'ed input of wq, wk, wv: (n_rows, dim)
    CAPTURE_ATTENTION_OUTPUT = 1, // attention output, the input of wo: (n_rows, dim)
    CAPTURE_FFN_INPUT = 2,        // RMSNorm'ed input of w1, w3: (n_rows, dim)
    CAPTURE_FFN_HIDDEN = 3,       // silu(w1 x) * w3 x, the input of w2: (n_rows, hidden_dim)
    CAPTURE_CLASSIFIER_INPUT = 4, // final-normed rows whose logits are computed: (n, dim); layer -1
} capture_site;

// rows: (n_rows, width) floats, valid only during the call.
typedef void (*forward_capture_fn)(void* user, int layer, capture_site site, const float* rows, int n_rows, int width);

// One tensor-parallel shard's activations and threads (engine/tensor_parallel.h).
// Without sharding, shard 0 is the whole model and its arrays are the
// state's own (query, key, ..., xb2 as the partial sums, scores, pool).
typedef struct forward_shard {
    int head_begin, n_heads;       // its query heads
    int kv_head_begin, n_kv_heads; // its KV heads
    int hidden_size;               // its hidden features
    float* query;      // (max_rows, n_heads * head_dim)
    float* key;        // (max_rows, n_kv_heads * head_dim)
    float* value;      // (max_rows, n_kv_heads * head_dim)
    float* attention;  // (max_rows, n_heads * head_dim) attention output of its heads
    float* hidden;     // (max_rows, hidden_size) gate, then SwiGLU output
    float* hidden_up;  // (max_rows, hidden_size)
    float* partial;    // (max_rows, dim) its partial sums of wo or w2 (before the all-reduce)
    float* scores;     // (n_thread_slots, max_context) attention weights of one head, per thread
    int n_thread_slots;
    thread_pool* pool; // its threads; NULL: the one thread that runs the shard
    kernel_traffic traffic; // what it read, wrote and computed in the last forward() call
} forward_shard;

// Scratch activations for up to max_rows rows and contexts up to
// max_context tokens. All (rows, width) arrays are row-major floats.
typedef struct forward_state {
    int max_rows;
    int max_context;
    float* x;          // (max_rows, dim) residual stream
    float* xb;         // (max_rows, dim) normalised input of a sublayer
    float* xb2;        // (max_rows, dim) sublayer output
    float* query;      // (max_rows, dim)
    float* key;        // (max_rows, kv_dim)
    float* value;      // (max_rows, kv_dim)
    float* attention;  // (max_rows, dim) attention output per row
    float* hidden;     // (max_rows, hidden_dim) gate, then SwiGLU output
    float* hidden_up;  // (max_rows, hidden_dim)
    float* rotations;  // (max_rows, head_dim) RoPE cos, sin of each row's position (ops.h)
    rope_config rope;  // the model's RoPE, set by each forward() call
    float* scores;     // (n_thread_slots, max_context) attention weights of one head, per thread
    int* attention_groups; // (max_rows + 1) first row of each group of rows attended together, then n_rows
    int n_attention_groups; // groups in the current forward() call
    int n_thread_slots;
    thread_pool* pool; // shared worker threads (not owned); NULL = the calling thread only
    forward_capture_fn capture; // NULL: no capture (only without sharding)
    void* capture_user;
    // Tensor parallelism (1 shard: off). With n_shards > 1 each shard runs
    // as one task on `pool`, on its own threads (shards[k].pool, owned).
    int n_shards;
    tp_plan tp;                          // the split; its weights (unused with 1 shard)
    forward_shard shards[MAX_TP_SHARDS]; // (n_shards)
    // Tallies of the last forward() call, besides its kernel_traffic:
    uint64_t allreduce_bytes; // bytes each shard sent in its ring all-reduces (engine/links.h)
    int n_allreduces;         // all-reduces run: 2 per layer when sharded, else 0
} forward_state;

int forward_state_init(forward_state* state, const model_config* config, int max_rows, int max_context,
                       error_info* err);
void forward_state_free(forward_state* state);

// Runs the matmuls and the per-row attention on `pool` (NULL: one thread).
// Results are bit-identical for any number of threads.
int forward_state_set_pool(forward_state* state, thread_pool* pool, error_info* err);

// Splits the model's layers into n_shards (engine/tensor_parallel.h) and
// gives each shard its activations and threads_per_shard threads (1: the
// one pool thread that runs it). Call after forward_state_set_pool: the
// shards run as tasks of that pool, one per shard. n_shards 1 turns
// sharding off. Returns -1 (with err) when the model does not split.
int forward_state_set_tensor_parallel(forward_state* state, const model* m, int n_shards, int threads_per_shard,
                                      error_info* err);

// Runs the batch, writing each row's key and value into kv at the slot
// batch->slot_mapping gives it (attention reads through the block tables),
// and the logits of the rows with wants_logits, in row order, into logits:
// (number of such rows, vocab_size). Adds the work done to traffic (every
// shard's work and the replicated parts); each shard's own share is also in
// state->shards[k].traffic, and the all-reduces in state->allreduce_bytes.
// Returns -1 (with err) when the batch does not fit the state or the model.
int forward(const model* m, forward_state* state, kv_memory* kv, const forward_batch* batch, float* logits,
            kernel_traffic* traffic, error_info* err);

#endif
