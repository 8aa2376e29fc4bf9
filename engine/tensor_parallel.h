// tensor_parallel: how a model's layers split into N shards, Megatron style,
// for the simulated tensor parallelism of `--tp N`.
//
// Per layer, with N shards (N divides n_heads and n_kv_heads):
//   column-parallel  wq, wk, wv: shard s owns the output rows of its heads
//                    (n_heads / N query heads, n_kv_heads / N KV heads);
//                    w1, w3: shard s owns a slice of the hidden features
//   row-parallel     wo: shard s owns the input columns of its heads;
//                    w2: the input columns of its hidden slice
// so a shard computes q, k, v, RoPE, the KV cache writes and attention of
// its own heads, and the SwiGLU of its own hidden features, without seeing
// the other shards; wo and w2 give partial sums of the full output, and an
// all-reduce (sum over shards) completes each: two all-reduces per layer.
// The embedding, the RMSNorms, the residual stream and the classifier stay
// replicated (every GPU would hold and compute them; they are counted once).
//
// The all-reduce sums fp32 partials (4 bytes per value: rows x dim x 4 per
// message; a bf16 deployment would send half) in shard order 0, 1, ...,
// fused with the residual add (kernels/cpu/ops.h residual_rmsnorm), so the
// results differ from the unsharded run only by fp32 rounding: the
// column-parallel outputs are bit-identical, the row-parallel sums are
// associated differently. Two formats are exceptions. W8A8: each shard
// quantizes its own slice of wo's / w2's input with its own scale, as a
// real deployment would, so its results differ by that quantization too.
// W4A16: its activations are rounded to bf16 (kernels/cpu/matmul_int.c), so
// where an fp32 rounding difference moves a value across a bf16 rounding
// boundary the two runs' inputs differ by one bf16 step (2^-8 relative):
// they agree to bf16 rounding, not fp32 rounding.
// Threads: the shards run as tasks of the engine's pool, one per shard,
// each with its own pool of n_threads / N threads (engine_config).
//
// Weights: a column-parallel slice is a view into the model's matrix (its
// rows are contiguous); a row-parallel slice is copied into the plan's own
// storage (its columns are not), as each GPU would hold its own shard.
// Quantized slices keep whole groups: INT8 / INT4 groups run along a row,
// so a wo / w2 column slice must start and end on a group boundary, and a
// Q8_0 group (counted over the flattened matrix) must not span two shards.
// Heads are split evenly, and a bad split is an error naming the matrix; the
// hidden features are split in whole groups, as evenly as the groups allow
// (any split works for fp32 and fp16).
#ifndef SERVELAB_TENSOR_PARALLEL_H
#define SERVELAB_TENSOR_PARALLEL_H

#include "base/error.h"
#include "engine/model.h"
#include "kernels/cpu/kernel_traffic.h"
#include "kernels/cpu/thread_pool.h"

#define MAX_TP_SHARDS 16

typedef struct tp_shard {
    int head_begin, n_heads;       // query heads [head_begin, head_begin + n_heads)
    int kv_head_begin, n_kv_heads; // KV heads
    int hidden_begin, hidden_size; // hidden features [hidden_begin, hidden_begin + hidden_size)
    layer_weights* layers;         // (n_layers) this shard's slices (the model's own layers when n_shards is 1)
} tp_shard;

typedef struct tp_plan {
    int n_shards;                     // 1: no sharding
    tp_shard shards[MAX_TP_SHARDS];   // (n_shards)
    uint64_t sharded_weight_bytes;    // bytes of every layer's wq..w3 (what the shards split)
    void* storage;                    // the copied row-parallel slices (NULL for one shard)
} tp_plan;

// Splits m into n_shards (1..MAX_TP_SHARDS). Returns -1 with a message
// naming what does not divide (heads, a group of a quantized matrix).
int tp_plan_build(tp_plan* plan, const model* m, int n_shards, error_info* err);
void tp_plan_free(tp_plan* plan);

// The weights shard k multiplies in layer l: its slices, or the model's
// own layer when nothing is split (a plan of 0 or 1 shards).
const layer_weights* tp_shard_layer(const tp_plan* plan, const model* m, int k, int l);

// ---- running the shards (engine/forward.c) ---------------------------------

// The fan-out: on_shard(context, k, 0) for every shard k. One shard runs on
// the calling thread; several run as tasks of `pool`, one per shard, side
// by side, each on its own threads.
void tp_run_on_shards(thread_pool* pool, int n_shards, thread_pool_task_fn on_shard, void* context);

// The all-reduce of the shards' row-parallel outputs (wo's or w2's partial
// sums), done where the residual stream adds them anyway, then the RMSNorm
// of what follows (kernels/cpu/ops.h residual_rmsnorm):
//   x += partials[0] + ... + partials[n_shards - 1]   (in shard order)
//   out = rmsnorm(x) with norm_weight                  (NULL: no norm)
// x, out: (n_rows, dim) floats; partials: (n_shards) arrays of (n_rows, dim).
// Rows are independent: each task of `pool` takes rows_per_task of them.
// Returns the bytes each shard sends in the ring all-reduce
// (engine/links.h): 0 for one shard, whose "all-reduce" is the residual add.
uint64_t tp_all_reduce_residual_rmsnorm(float* out, float* x, const float* const* partials, int n_shards,
                                        const float* norm_weight, int n_rows, int dim, float eps, thread_pool* pool,
                                        int rows_per_task, kernel_traffic* traffic);

#endif
