// gguf_vocab: the tokenizer a GGUF file carries in its tokenizer.ggml.* keys.
//
// tokenizer.ggml.model "llama" (SentencePiece with scores and byte
// fallback) becomes a tokenizer.h SentencePiece tokenizer: tokens, scores,
// token_type, bos/eos/unknown_token_id, add_bos_token (default true) and
// add_space_prefix (default true), as llama.cpp reads them. "gpt2"
// (byte-level BPE) becomes a BPE tokenizer from tokenizer.ggml.merges, with
// the pre-tokenizer tokenizer.ggml.pre names: GPT-2's when it is absent,
// "default" or "gpt-2"; Llama 3's for "llama-bpe" (or llama3, llama-v3);
// Qwen2's for "qwen2" (or deepseek-r1-qwen); SmolLM's for "smollm"
// (tokenizer.h tok_pretokenizer). Any other pre-tokenizer, and other
// models, are refused by name.
#ifndef SERVELAB_GGUF_VOCAB_H
#define SERVELAB_GGUF_VOCAB_H

#include "base/error.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"

int tok_from_gguf(tokenizer** out, const gguf_file* f, error_info* err);

// The tokens that end a generation, as llama.cpp's end-of-generation set:
// tokenizer.ggml.eos_token_id, eot_token_id and eom_token_id when present,
// and every token spelled <|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>,
// <|endoftext|>, <|eom_id|> or <EOT> (Qwen's <|endoftext|> beside its EOS
// <|im_end|>, Llama 3's <|eot_id|> beside <|end_of_text|>). Each id once, in
// that order, at most `capacity` (the rest dropped). A file without
// tokenizer.ggml.tokens gives 0 ids. Ids outside the vocabulary are skipped.
int gguf_vocab_stop_tokens(const gguf_file* f, int32_t* stop_tokens, int capacity, int* n_stop_tokens, error_info* err);

// Opens path (mapped, then unmapped again) and reads its tokenizer.
int tok_load_gguf(tokenizer** out, const char* path, error_info* err);

#endif
