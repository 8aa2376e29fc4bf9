// gguf_model: a llama.cpp GGUF file as a servelab model.
//
// Architectures `llama` (Llama 2/3, TinyLlama, SmolLM, Mistral in the GGUF
// naming) and `qwen2`. The metadata gives the shapes and the per-model math,
// which the forward pass (engine/forward.c) follows through model_config:
// RoPE base (ARCH.rope.freq_base, default 10000), rotary dimensions
// (ARCH.rope.dimension_count, default head_dim: fewer is partial rotary),
// RMSNorm epsilon (ARCH.attention.layer_norm_rms_epsilon), the RoPE
// pairing (llama.cpp's llama_model_rope_type: adjacent pairs for llama,
// NEOX halves for qwen2), q/k/v biases (blk.N.attn_{q,k,v}.bias: required
// by qwen2, optional for llama, all three or none) and a tied or separate
// output matrix. (README of ../shared/gguf, §5: the converters have already
// permuted Hugging Face's q/k rows of a llama into the adjacent layout:
// nothing is un-permuted here.) RoPE scaling, experts and any tensor the
// forward pass would not use are refused by name.
//
// What each tensor type becomes (dtype MODEL_DTYPE_DEFAULT):
//   F32  -> WEIGHT_F32, pointing into the read-only mapping (no copy)
//   F16  -> WEIGHT_F16, pointing into the mapping (no copy)
//   BF16 -> WEIGHT_F32 at load (exact: bf16 is fp32's upper half)
//   Q8_0 -> WEIGHT_I8 symmetric, group 32, the block's fp16 scale: the same
//           int8 codes and scale bits, moved out of the file's interleaved
//           34-byte blocks into the kernel's codes-then-scales layout
//   Q4_0 -> WEIGHT_I4 symmetric, group 32: the same nibbles (q - 8 is the
//           kernel's symmetric zero-point 8) and scale bits, reordered from
//           the block's (j, j + 16) nibble pairs to the kernel's (2j, 2j + 1)
// Both moves are lossless and keep the byte count (34 and 18 bytes per 32
// weights). The k-quants have no kernel of their own and are converted:
//   Q4_K -> WEIGHT_I8 asymmetric, group 32 (a Q4_K sub-block): codes 16q,
//           fp16 scale d*sc/16, zero-point round(16 * dmin*m / (d*sc)): each
//           weight within 1/32 of a Q4_K step (+ the scale's fp16 rounding);
//           4.5 -> 8.75 bits per weight
//   Q5_K -> the same with codes 8q: within 1/16 of a step; 5.5 -> 8.75 bits
//   Q6_K -> WEIGHT_I8 symmetric, group 16: codes q - 32, fp16 scale d*sc
//           (only the scale rounds); 6.5625 -> 9 bits
// (a smaller multiple where a large offset needs room, and a fresh 8-bit
// min/max quantization of a sub-block that fits neither: gguf_model.c).
// The loader says what it converted, to what, and the bytes per token it
// adds, in one stderr line. MODEL_DTYPE_FP32 or MODEL_DTYPE_FP16 widens (or
// rounds) every matrix to that type instead (k-quants dequantized as ggml's
// dequantize_row_* does). Other types (Q2_K, Q3_K, Q4_1, ...) are refused,
// naming the tensor and type.
#ifndef SERVELAB_GGUF_MODEL_H
#define SERVELAB_GGUF_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/gguf.h"
#include "engine/model.h"

typedef struct gguf_model_options {
    model_dtype_choice dtype;
    // 0: the file's `ARCH.context_length`; else this many positions. (The
    // llama2.c converter writes 128 whatever the checkpoint was trained on,
    // ../shared/gguf README §11; llama.cpp's n_ctx overrides it the same way,
    // without RoPE scaling.)
    int context_length;
    // false: no stderr line about conversions (tests, fuzzing).
    bool report_conversions;
} gguf_model_options;

// What the metadata says, for `servelab info` and for the loader's checks.
typedef struct gguf_model_info {
    char architecture[32];
    char model_name[96];         // general.name, or ""
    model_config config;         // shapes (vocab from token_embd.weight)
    int file_context_length;     // ARCH.context_length as written
    int rope_dimensions;         // ARCH.rope.dimension_count (head_dim when absent)
    double rope_base;            // ARCH.rope.freq_base (10000 when absent)
    double rms_epsilon;          // ARCH.attention.layer_norm_rms_epsilon
    bool has_output_matrix;      // output.weight present (else tied to token_embd)
    int tensor_type_counts[32];  // tensors of each gguf_tensor_type (index = type number, < 32)
    uint64_t tensor_data_bytes;  // bytes of every tensor's data in the file
} gguf_model_info;

// Reads the architecture and shapes from f, checking them the way the loader does.
int gguf_model_read_info(const gguf_file* f, gguf_model_info* info, error_info* err);

// Loads path as a model. On failure *out is zeroed and err names the field.
int gguf_model_load(model* out, const char* path, const gguf_model_options* options, error_info* err);

// The same from a parsed file; on success the model takes the file's
// mapping (gguf_close afterwards frees only the tables).
int gguf_model_from_file(model* out, gguf_file* f, const gguf_model_options* options, error_info* err);

#endif
