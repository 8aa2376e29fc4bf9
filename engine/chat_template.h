// chat_template: the prompt formats of the chat models a GGUF file may hold.
//
// No Jinja engine: a file's tokenizer.chat_template is recognised by the
// markers each family's template writes, and the conversation is then
// written out by hand in that family's format:
//   Llama 3   <|start_header_id|>ROLE<|end_header_id|>\n\nTEXT<|eot_id|>
//   ChatML    <|im_start|>ROLE\nTEXT<|im_end|>\n        (Qwen, SmolLM)
//   Llama 2   [INST] <<SYS>>\nSYSTEM\n<</SYS>>\n\nUSER [/INST] ANSWER </s><s>[INST] ...
//   Zephyr    <|ROLE|>\nTEXT</s>\n                      (TinyLlama chat)
// BOS is not written: the tokenizer adds it where the vocabulary asks.
// The text holds special tokens (<|im_start|>, </s>, ...), so it must be
// encoded with tok_encode_special.
#ifndef SERVELAB_CHAT_TEMPLATE_H
#define SERVELAB_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/error.h"

typedef enum chat_template_kind {
    CHAT_TEMPLATE_NONE = 0, // no template, or one not recognised
    CHAT_TEMPLATE_LLAMA3 = 1,
    CHAT_TEMPLATE_CHATML = 2,
    CHAT_TEMPLATE_LLAMA2 = 3,
    CHAT_TEMPLATE_ZEPHYR = 4,
} chat_template_kind;

typedef struct chat_message {
    const char* role;    // "system", "user" or "assistant"
    const char* content; // UTF-8
} chat_message;

// The family a Jinja template text belongs to; NONE when NULL or unknown.
chat_template_kind chat_template_recognise(const char* template_text);

// "llama3", "chatml", "llama2", "zephyr", "none".
const char* chat_template_name(chat_template_kind kind);

// Writes the conversation in the family's format, then (when
// add_generation_prompt) the header that asks the model to answer. out
// holds capacity bytes, NUL-terminated; *needed gets the whole length
// (like snprintf), and it fails when that does not fit, or for NONE, or
// for a role the family has no place for.
int chat_template_apply(chat_template_kind kind, const chat_message* messages, int n_messages,
                        bool add_generation_prompt, char* out, size_t capacity, size_t* needed, error_info* err);

#endif
