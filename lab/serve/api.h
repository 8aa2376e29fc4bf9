// serve_api: the OpenAI request bodies that `servelab serve` accepts, read
// and checked with Jansson, and the error objects it answers with.
//
// Everything here is pure (no sockets, no engine): a body goes in, either
// checked parameters or one error naming the field and the limit come out.
#ifndef SERVELAB_SERVE_API_H
#define SERVELAB_SERVE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/tokenizer.h"

#define SERVE_MAX_STOPS 4                // OpenAI's limit on `stop` sequences
#define SERVE_MAX_STOP_BYTES 128         // each stop string; longer ones are refused
#define SERVE_MAX_MESSAGES 256           // chat messages per request
#define SERVE_MAX_LOGPROBS_COMPLETIONS 5 // OpenAI's limit on completions' `logprobs`
#define SERVE_MAX_TOP_LOGPROBS 20        // OpenAI's limit on chat's `top_logprobs`

typedef enum serve_endpoint { SERVE_COMPLETIONS = 0, SERVE_CHAT = 1 } serve_endpoint;

// What the server is and allows, for checking a body.
typedef struct serve_limits {
    const char* model_name; // the one model served (`model` must name it)
    int vocab_size;
    int context_tokens; // the model's max_seq_len: prompt + max_tokens at most this
    int pool_tokens;    // tokens one sequence can hold in the whole KV pool (0: not known); a chat's
                        // default max_tokens stays within it, where the rest of the context may not fit
    int max_n;          // samples per request at most (the engine's --max-seqs)
} serve_limits;

// A checked request.
typedef struct serve_params {
    serve_endpoint endpoint;
    int32_t* prompt; // (n_prompt) token ids, BOS first (malloc'ed; serve_params_free)
    int n_prompt;
    int max_tokens;
    int n;
    float temperature; // 0 = greedy
    float top_p;       // 1 = off
    uint64_t seed;
    bool seed_given;
    bool stream;
    bool include_usage;           // stream_options.include_usage
    bool return_token_ids;        // vLLM's extension: token ids beside the text
    bool ignore_eos;              // vLLM's and llama.cpp's: generate max_tokens whatever the model says (benchmarks)
    int logprobs;                 // -1: none; else the sampled token's logprob and this many alternatives
    bool echo;                    // completions: the prompt's text before the completion
    char* stops[SERVE_MAX_STOPS]; // (n_stops) malloc'ed
    int n_stops;
} serve_params;

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}}.
typedef struct serve_error {
    int http_status;  // 400, 404, 413, 429, ...
    const char* type; // "invalid_request_error", "rate_limit_error", ...
    char param[64];   // the field at fault, "" when none
    char message[512];
} serve_error;

// Fills *error and returns -1 (for `return serve_fail(...)`).
int serve_fail(serve_error* error, int http_status, const char* type, const char* param, const char* format, ...)
    __attribute__((format(printf, 5, 6)));

// The error as a JSON body (malloc'ed, NUL-terminated).
char* serve_error_json(const serve_error* error);

// Reads and checks a body of `endpoint`. A string prompt (or chat messages)
// is encoded with `tok` (NULL: only token-id prompts are accepted). Returns
// 0, or -1 with *error set; params need serve_params_free either way.
int serve_parse_request(serve_endpoint endpoint, const char* body, size_t body_bytes, const serve_limits* limits,
                        const tokenizer* tok, serve_params* params, serve_error* error);
void serve_params_free(serve_params* params);

// The plain chat template for base models (documented in `serve --help`):
// each message as "Role: content\n\n" (System, User, Assistant), then
// "Assistant:" for the model to continue. Writes the text (malloc'ed).
char* serve_chat_prompt_text(const char* const* roles, const char* const* contents, int n_messages);

// Copies `length` bytes of text, each invalid UTF-8 sequence replaced by
// U+FFFD, so that JSON encoders accept it (malloc'ed, NUL-terminated).
char* serve_utf8_sanitize(const char* text, size_t length);

// Bytes of text[0..length) that end on a whole UTF-8 character: an
// incomplete sequence at the end (a character whose other bytes are still
// to be generated) is left out.
size_t serve_utf8_complete_prefix(const char* text, size_t length);

// The k largest of values[0..n) as ids, best first; equal values: the
// lower id first (as an argmax takes the first maximum). One pass with a
// k-entry heap: O(n log k). ids_out: (k). Returns min(k, n).
int serve_top_k(const float* values, int n, int k, int32_t* ids_out);

#endif
