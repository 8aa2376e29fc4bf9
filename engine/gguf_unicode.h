// gguf_unicode: Unicode properties for the byte-level BPE pre-tokenizer of
// GGUF "gpt2" tokenizers (\p{L}, \p{N}, \s in its split pattern).
#ifndef SERVELAB_GGUF_UNICODE_H
#define SERVELAB_GGUF_UNICODE_H

#include <stdbool.h>
#include <stdint.h>

bool unicode_is_letter(uint32_t codepoint);     // general category L*
bool unicode_is_number(uint32_t codepoint);     // general category N*
bool unicode_is_whitespace(uint32_t codepoint); // the White_Space property
#endif
