// quiz_drills: numeric questions with fresh numbers every time, drawn from
// real model shapes (quiz/models.lua) and the device models (engine/devices.h).
//
// Each drill records every input it drew (quiz_drill_inputs), so that a
// test can recompute the answer on its own, and a worked solution.
#ifndef SERVELAB_QUIZ_DRILLS_H
#define SERVELAB_QUIZ_DRILLS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/devices.h"
#include "lab/quiz/models.h"
#include "lab/quiz/units.h"

// ---- random numbers (splitmix64: tiny, and the same sequence everywhere) ------------------

typedef struct quiz_rng {
    uint64_t state;
} quiz_rng;

void quiz_rng_seed(quiz_rng* rng, uint64_t seed);
uint64_t quiz_rng_next(quiz_rng* rng);
// A whole number in [low, high].
int quiz_rng_int(quiz_rng* rng, int low, int high);
// A real number in [0, 1).
double quiz_rng_unit(quiz_rng* rng);

// ---- drills --------------------------------------------------------------------------------

typedef enum quiz_drill_kind {
    QUIZ_DRILL_KV_SIZE = 0,      // 2 B S L (n_kv_heads or n_heads) head_dim p
    QUIZ_DRILL_BLOCKS_NEEDED,    // sum of ceil(length / block_size)
    QUIZ_DRILL_TAIL_WASTE,       // empty slots in the last blocks
    QUIZ_DRILL_SEQUENCES_FIT,    // floor((capacity - weights) / KV per sequence)
    QUIZ_DRILL_QUANT_SCALE,      // s
    QUIZ_DRILL_QUANT_ZERO_POINT, // z
    QUIZ_DRILL_QUANT_CODE,       // q
    QUIZ_DRILL_QUANT_RHAT,       // r_hat
    QUIZ_DRILL_STEP_RATIO,       // (2^high - 1) / (2^low - 1)
    QUIZ_DRILL_DECODE_TIME,      // weight bytes one token reads (quiz_decode_weight_bytes) / bandwidth
    QUIZ_DRILL_WEIGHT_BYTES,     // N bits / 8 + (N / group) 2 bytes of scale
    QUIZ_DRILL_SPEC_TOKENS,      // speculative decoding: tokens per target pass, (1 - a^(k+1)) / (1 - a)
    QUIZ_DRILL_SPEC_SPEEDUP,     // speculative decoding: that / (k c + 1), against plain decode
    QUIZ_DRILL_COUNT
} quiz_drill_kind;

typedef enum quiz_weight_format { QUIZ_WEIGHTS_FP16 = 0, QUIZ_WEIGHTS_INT8, QUIZ_WEIGHTS_INT4 } quiz_weight_format;

enum { QUIZ_DRILL_MAX_LENGTHS = 6 };

// What a drill drew. Fields a drill does not use stay 0 (model, device -1).
typedef struct quiz_drill_inputs {
    int model;           // index into the model list
    int device;          // index into device_models()
    int batch;           // B, sequences
    int seq_len;         // S, tokens
    int bytes_per_value; // p
    bool grouped_query;  // KV width n_kv_heads * head_dim (else n_heads * head_dim = d_model)
    int block_size;      // tokens per block
    int n_lengths;
    int lengths[QUIZ_DRILL_MAX_LENGTHS]; // (n_lengths) tokens per request
    int bits;                            // quantization bits; for the step ratio, the higher bit width
    int low_bits;                        // step ratio: the lower bit width
    float range_min, range_max;          // [r_min, r_max]
    float value;                         // r
    bool symmetric;                      // quantization: codes -(2^(b-1)-1) .. 2^(b-1)-1 and z = 0
    quiz_weight_format format;           // decode time, weight bytes
    int group_size;                      // weights per FP16 scale (INT8, INT4)
    double acceptance;                   // speculative: a, the chance the target accepts one drafted token
    int draft_tokens;                    // speculative: k, tokens the draft proposes per target pass
    double draft_cost_ratio;             // speculative: c, one draft pass's cost in target passes
} quiz_drill_inputs;

typedef struct quiz_drill {
    quiz_drill_kind kind;
    quiz_drill_inputs in;
    quiz_numeric answer;
    char prompt[1024];
    char explanation[1024]; // the worked solution
} quiz_drill;

// "drill-kv-size", ...: the id progress is kept under (one Leitner box per kind).
const char* quiz_drill_id(quiz_drill_kind kind);
// The kind whose id is `id`, or -1.
int quiz_drill_parse_id(const char* id);
// Topic mask (QUIZ_TOPIC_BIT) of a drill kind.
unsigned quiz_drill_topics(quiz_drill_kind kind);

// Draws a fresh drill of `kind`. 0, or -1 with err (no model fits, for example).
int quiz_drill_generate(quiz_drill_kind kind, const quiz_model_list* models, quiz_rng* rng, quiz_drill* out,
                        error_info* err);

// A device's memory in GiB (80 for an H100: engine/devices.c holds 80 x 2^30
// bytes, 7.4% more than 80e9, enough for 33 sequences of Llama-2-7B at
// S = 4096 rather than 30).
double quiz_device_memory_gib(const device_model* device);

// KV bytes one token adds at `bytes_per_value` (1: INT8, 2: FP16, 4: FP32),
// as the engine's pool stores them: 2 (K and V) x L x heads x head_dim x
// bytes, plus for INT8 one FP32 scale per token, layer, K/V and head (2 x L x
// heads x 4 bytes: +3.1% at head_dim 128). heads: n_kv_heads, or n_heads
// without grouped-query attention.
double quiz_kv_bytes_per_token(const quiz_model* m, bool grouped_query, int bytes_per_value);

// Bytes of N weights in `format`: 2 N (FP16); N bits / 8 + 2 N / group_size
// (INT8, INT4: one 2-byte FP16 scale per group of group_size weights).
double quiz_weight_bytes(uint64_t n_params, quiz_weight_format format, int group_size);

// The weight bytes one decode token streams, counted as the engine counts
// them (model_decode_weight_bytes in engine/model.c, which is what the
// kernels tally per decode step): every layer matrix and the output matrix
// once, ONE row of the embedding table (a token looks up its own row; the
// other vocab_size - 1 rows are not read), and the RMSNorm gains, which
// the engine keeps in FP32 whatever the matrices' format. Tied or not, the
// count is the same: a tied output matrix is the table, read whole.
typedef struct quiz_decode_weights {
    uint64_t matrix_weights; // layer matrices + output matrix + one embedding row, in `format`
    uint64_t norm_weights;   // (2 L + 1) d_model RMSNorm gains, 4 bytes each
    double total_bytes;
} quiz_decode_weights;

quiz_decode_weights quiz_decode_weight_bytes(const quiz_model* m, quiz_weight_format format, int group_size);

// ---- speculative decoding (Leviathan et al. 2023, section 3) --------------------------------
//
// The model: each drafted token is accepted with the same chance a,
// independently, and the first rejection ends the run. One target pass
// verifies k drafted tokens and always yields one token of its own (the
// correction at the first rejection, or a bonus token after k acceptances),
// so it yields 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens
// (k + 1 at a = 1). A round costs one target pass plus k draft passes of
// c target passes each, so against plain decode (one token per target
// pass) it is (1 - a^(k+1)) / ((1 - a) (k c + 1)) times faster; below 1 it
// is slower.
double quiz_spec_tokens_per_target_pass(double acceptance, int draft_tokens);
double quiz_spec_speedup(double acceptance, int draft_tokens, double draft_cost_ratio);

#endif
