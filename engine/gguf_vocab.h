// gguf_vocab: the tokenizer a GGUF file carries in its tokenizer.ggml.* keys.
//
// tokenizer.ggml.model "llama" (SentencePiece with scores and byte
// fallback) becomes a tokenizer.h SentencePiece tokenizer: tokens, scores,
// token_type, bos/eos/unknown_token_id, add_bos_token (default true) and
// add_space_prefix (default true), as llama.cpp reads them. "gpt2"
// (byte-level BPE) becomes a BPE tokenizer from tokenizer.ggml.merges, with
// GPT-2's pre-tokenizer when tokenizer.ggml.pre is absent, "default" or
// "gpt-2"; other pre-tokenizers (llama-bpe, qwen2, smollm, ...) and other
// models are refused by name.
#ifndef SERVELAB_GGUF_VOCAB_H
#define SERVELAB_GGUF_VOCAB_H

#include "engine/error.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"

int tok_from_gguf(tokenizer** out, const gguf_file* f, error_info* err);

// Opens path (mapped, then unmapped again) and reads its tokenizer.
int tok_load_gguf(tokenizer** out, const char* path, error_info* err);

#endif
