// workload: the requests a simulation sends, generated or read from a file.
//
// Generated: --requests N --prompt-len DIST --output-len DIST --arrival-rate R
// [--shared-prefix N] --seed S, with DIST one of fixed:N, uniform:A:B
// (inclusive) or lognormal:MEAN:SD (the mean and standard deviation of the
// lengths themselves, in tokens). Arrival rate 0 sends everything at time 0;
// otherwise arrivals form a Poisson process of R requests per second.
// From a file: JSON Lines, one request per line:
//   {"prompt": "text", "max_tokens": 64, "arrival": 0.5}
//   {"prompt_ids": [1, 300, 400], "max_tokens": 16}
// Each line is parsed by Jansson, a strict RFC 8259 parser: UTF-8 only, no
// comments, trailing commas, NaN or \u0000, no duplicate keys, nesting at
// most JSON_PARSER_MAX_DEPTH. A line longer than WORKLOAD_MAX_LINE_BYTES or
// holding a NUL byte is an error; blank lines are skipped. Every message
// names the file, the line and the field, for example
//   "requests.jsonl:3: expected a whole number 1..512 for field 'max_tokens', got -5".
#ifndef SERVELAB_WORKLOAD_H
#define SERVELAB_WORKLOAD_H

#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "engine/tokenizer.h"

typedef enum length_kind { LENGTH_FIXED, LENGTH_UNIFORM, LENGTH_LOGNORMAL } length_kind;

typedef struct length_distribution {
    length_kind kind;
    double a; // fixed: the length; uniform: low; lognormal: mean
    double b; // uniform: high; lognormal: standard deviation
} length_distribution;

// The longest length a distribution may give, in tokens: 1 Mi, beyond any
// model's context here, and small enough that prompt + output fits an int.
#define LENGTH_MAX_TOKENS (1 << 20)

// Reads fixed:N, uniform:LOW:HIGH or lognormal:MEAN:SD (every number in
// 1..LENGTH_MAX_TOKENS, SD from 0); -1 with err naming `flag` otherwise.
int length_distribution_parse(const char* flag, const char* text, length_distribution* out, error_info* err);

typedef struct workload_request {
    int32_t* prompt;      // (n_prompt) ids, BOS first
    int n_prompt;
    int max_tokens;
    double arrival_time;  // seconds after the start
} workload_request;

typedef struct workload {
    workload_request* requests; // (n_requests) in arrival order
    int n_requests;
} workload;

typedef struct workload_spec {
    int n_requests;
    length_distribution prompt_length;
    length_distribution output_length;
    double arrival_rate;    // requests per second; 0 = all at once
    int shared_prefix;      // tokens every prompt starts with (after BOS)
    uint64_t seed;
    int vocab_size;         // prompt ids are drawn from 3 .. vocab_size - 1
    int max_seq_len;        // prompt + output is clamped to this
} workload_spec;

int workload_generate(workload* out, const workload_spec* spec, error_info* err);

enum { WORKLOAD_MAX_LINE_BYTES = 1 << 20 }; // one request per line: 1 MiB is far more than any prompt

// Reads JSON Lines; text prompts need a tokenizer (tok may be NULL when every
// line gives "prompt_ids"). Lengths are checked against max_seq_len and ids
// against vocab_size. Requests come back sorted by arrival (a stable sort:
// equal times keep file order).
int workload_read(workload* out, const char* path, const tokenizer* tok, int vocab_size, int max_seq_len,
                  error_info* err);

// The same from an open stream (read to its end, not closed); `name` is what
// messages call it.
int workload_read_stream(workload* out, FILE* file, const char* name, const tokenizer* tok, int vocab_size,
                         int max_seq_len, error_info* err);

void workload_free(workload* w);

// Mean of the prompt and output lengths, for the report.
double workload_mean_prompt(const workload* w);
double workload_mean_output(const workload* w);

#endif
