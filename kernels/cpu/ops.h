// ops: the element-wise and per-row pieces of a transformer layer.
//
// Each follows the equation in its comment, in fp32, with reductions in
// index order (the same order as llama2.c's run.c, so that greedy decoding
// of a real checkpoint reproduces its tokens exactly).
//
// Fused forms (residual_rmsnorm, rope_rotate with precomputed rotations)
// do the same arithmetic in the same order as the separate steps, so they
// give the same bits; they only save passes over memory or repeated
// transcendental calls.
#ifndef SERVELAB_OPS_H
#define SERVELAB_OPS_H

#include <stdbool.h>

#include "kernels/cpu/kernel_traffic.h"

// For each of n_rows rows: out[i] = weight[i] * x[i] / sqrt(mean(x^2) + eps).
// out, x: (n_rows, size) floats, out may equal x; weight: (size) floats,
// counted as weight bytes once per call.
void rmsnorm(float* out, const float* x, const float* weight, int n_rows, int size, float eps,
             kernel_traffic* traffic);

// Residual connection fused with the sum of partial results and the next
// RMSNorm, in one pass over x instead of three:
//   x[r][i] += (deltas[0][r][i] + deltas[1][r][i] + ...)   (k in order)
//   out[r] = rmsnorm(x[r]) with `weight`                   (skipped when weight is NULL)
// With one delta this is residual_add then rmsnorm, bit for bit; with n
// deltas it is the reduction of n tensor-parallel partial sums (an
// all-reduce) done where the residual is added anyway.
// x, out: (n_rows, size) floats; deltas: (n_deltas) arrays of (n_rows, size).
void residual_rmsnorm(float* out, float* x, const float* const* deltas, int n_deltas, const float* weight, int n_rows,
                      int size, float eps, kernel_traffic* traffic);

// In-place softmax over x: (size) floats.
void softmax(float* x, int size);

// Rotary position embedding on one row's query and key vectors, in place:
// pairs (2i, 2i+1) inside each head rotate by angle position * 10000^(-2i/head_dim).
// query: (n_heads * head_dim) floats; key: (n_kv_heads * head_dim) floats.
void rope(float* query, float* key, int position, int n_heads, int n_kv_heads, int head_dim, kernel_traffic* traffic);

// The rotations of one position, computed once and reused by every layer:
// rotations: (head_dim) floats, cos then sin of pair p at [2p], [2p + 1].
void rope_rotations(float* rotations, int position, int head_dim);

// rope() with the rotations of rope_rotations(): the same bits, without a
// powf and a sincosf per pair, head and layer.
void rope_rotate(float* query, float* key, const float* rotations, int n_heads, int n_kv_heads, int head_dim,
                 kernel_traffic* traffic);

// RoPE as a model configures it (GGUF metadata): the base, how many
// leading dimensions of each head rotate (the rest pass unchanged: partial
// rotary), and which elements pair up. Pair p (p < rotary_dims / 2) turns by
// position * base^(-2p / rotary_dims), as llama.cpp's ggml_rope computes it;
// with base 10000, rotary_dims = head_dim and adjacent pairs this is rope().
typedef struct rope_config {
    float base;      // frequency base theta (llama2.c: 10000)
    int rotary_dims; // even, <= head_dim
    bool neox_pairs; // pairs (p, p + rotary_dims / 2) (GPT-NeoX, qwen2), else (2p, 2p + 1) (llama)
} rope_config;

// The rotations of one position under config: rotations (rotary_dims)
// floats, cos then sin of pair p at [2p], [2p + 1]. With llama2.c's config,
// the bits of rope_rotations().
void rope_rotations_for(float* rotations, int position, const rope_config* config);

// rope_rotate() under config, with rotations from rope_rotations_for().
void rope_rotate_for(float* query, float* key, const float* rotations, int n_heads, int n_kv_heads, int head_dim,
                     const rope_config* config, kernel_traffic* traffic);

// SwiGLU gate: gate[i] = silu(gate[i]) * up[i], silu(v) = v / (1 + e^-v),
// one pass over both. gate, up: (size) floats.
void swiglu(float* gate, const float* up, int size, kernel_traffic* traffic);

// swiglu() with a vector exp (within 2 ulp of expf; the same exp the fp16
// attention's softmax uses) where the CPU has AVX2, else swiglu() itself.
// Each element's result depends only on its inputs and the SIMD level.
// The feed-forward of every non-fp32 model uses it; fp32 models keep
// swiglu(), llama2.c's bits (matmul_swiglu_parallel).
void swiglu_vector(float* gate, const float* up, int size, kernel_traffic* traffic);

// Residual connection: x[i] += delta[i]; x, delta: (size) floats.
void residual_add(float* x, const float* delta, int size, kernel_traffic* traffic);

// Bias: x[r][i] += bias[i] for n_rows rows; x: (n_rows, size) floats,
// bias: (size) floats, counted as weight bytes once per call.
void bias_add(float* x, const float* bias, int n_rows, int size, kernel_traffic* traffic);

#endif
