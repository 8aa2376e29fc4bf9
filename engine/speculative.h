// speculative: speculative decoding, a cheap proposer and the target model
// checking its guesses.
//
// Decode reads every weight to make one token per sequence. Speculation
// spends that read on more than one token: a proposer guesses up to k next
// tokens of a decoding sequence, and the target runs the sequence's last
// token and the k guesses as k + 1 rows of the step's one batched forward
// pass (next to the other sequences' decodes and prefill chunks, inside the
// step's token budget). Each row's logits judge the next guess:
//
//   temperature 0   keep guesses while each equals the target's argmax;
//                   the first one that does not is replaced by the argmax;
//                   when all k are kept, the last row gives a bonus token.
//   temperature > 0 keep guess x with probability min(1, p(x) / q(x)) (p the
//                   target's, q the proposer's distribution, both after the
//                   same temperature and top-p); at the first refusal draw
//                   from max(0, p - q) renormalised; all kept: a bonus from
//                   p. The output is distributed exactly as the target's
//                   (Leviathan et al. 2023, Chen et al. 2023).
//
// The rejected guesses' KV slots were written by the verify pass; they are
// rolled back: the sequence's length is the kept tokens, blocks past it go
// back to the pool, and the prefix cache only ever hashes kept tokens.
//
// Proposers:
//   draft:SCHEME   a quantized copy of the loaded model ("w4a16:g32": the
//                  project's quantizer, engine/model_quant.h), with its own
//                  paged KV pool; its blocks are in the step record.
//   draft:FILE     a separate, smaller model with the same vocabulary.
//   lookup:N       prompt lookup: the last N tokens (prompt and output so
//                  far) are looked for earlier in the sequence; the tokens
//                  that followed the latest earlier match are the guesses.
//                  No match: a plain one-row decode. Its q is one-hot.
#ifndef SERVELAB_SPECULATIVE_H
#define SERVELAB_SPECULATIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/forward.h"
#include "engine/kv_blocks.h"
#include "engine/model.h"

// Guesses per sequence per step: 1..SPEC_MAX_K. At 16 and an acceptance of
// 0.8 a step yields at most (1 - 0.8^17) / 0.2 = 4.9 tokens on average, so
// more guesses buy nothing but verify rows.
#define SPEC_MAX_K 16
#define SPEC_DEFAULT_K 4
// Longest n-gram lookup matches; 1..SPEC_MAX_LOOKUP_N.
#define SPEC_MAX_LOOKUP_N 16

typedef enum speculative_kind {
    SPEC_NONE = 0,   // plain decoding: one token per sequence per step
    SPEC_DRAFT = 1,  // a draft model proposes (a quantized copy, or a file)
    SPEC_LOOKUP = 2, // n-gram prompt lookup proposes
} speculative_kind;

typedef struct speculative_config {
    speculative_kind kind;
    int k;                 // guesses per sequence per step, 1..SPEC_MAX_K (default SPEC_DEFAULT_K)
    char draft_scheme[64]; // SPEC_DRAFT of the loaded model: its quantization ("w4a16:g32"); "" for a file
    char draft_path[512];  // SPEC_DRAFT from a model file with the same vocabulary; "" for a scheme
    int lookup_n;          // SPEC_LOOKUP: tokens matched, 1..SPEC_MAX_LOOKUP_N
} speculative_config;

// No speculation (kind SPEC_NONE, k SPEC_DEFAULT_K).
speculative_config speculative_config_default(void);

// The --speculative flag's text:
//   "none"
//   "draft:SCHEME[:kK]"  e.g. "draft:w4a16:g32", "draft:w4a16:g32:k8" (any
//                        scheme model_quant_spec_parse takes)
//   "draft:FILE[:kK]"    e.g. "draft:../shared/models/stories260K.bin:k2";
//                        a text that is not a scheme (w4a16, w8a16, w8a8,
//                        w4a8 first) is taken as a file name
//   "lookup:N[:kK]"      e.g. "lookup:3", "lookup:2:k8"
// Errors name the flag, the text and what was wrong ("draft:" has no
// draft, "lookup:0", "lookup:3:k0", "draft:w9a3", "k99").
int speculative_config_parse(const char* text, speculative_config* out, error_info* err);

// One line for reports and stats: "none", "draft w4a16:g32 k4",
// "draft stories260K.bin k2", "lookup 3 k4".
void speculative_config_describe(const speculative_config* config, char* out, size_t capacity);

// "none", "draft", "lookup" (the step record's spec.kind).
const char* speculative_kind_name(speculative_kind kind);

// The draft model a SPEC_DRAFT config asks for, into *draft (the caller
// frees it with model_free): draft_scheme quantizes a fresh load of
// target_path (RTN, no calibration data needed); draft_path loads that
// file. A draft whose vocabulary size differs from the target's is refused
// ("draft model x.bin: vocabulary of 32000 tokens, the target's has 512").
// Any other kind: -1 with a message.
int speculative_load_draft(const speculative_config* config, const model* target, const char* target_path, model* draft,
                           error_info* err);

// Expected tokens a step yields per verifying sequence when each of k
// guesses is kept independently with probability `acceptance`:
// (1 - a^(k+1)) / (1 - a), and k + 1 at a = 1.
double speculative_expected_tokens(double acceptance, int k);

// ---- for the engine -------------------------------------------------------------------------

struct engine;
struct sequence;
struct step_batch;

// What speculative decoding keeps in an engine.
typedef struct speculative_state {
    speculative_config config;
    const model* draft;          // SPEC_DRAFT: the proposer (not owned), else NULL
    kv_pool draft_pool;          // SPEC_DRAFT: the draft's own KV blocks (no prefix cache)
    forward_state draft_forward; // SPEC_DRAFT: its activations
    int max_rows;                // rows one draft forward call takes
    float* draft_logits;         // (max_rows, vocab)
    batch_row* rows;             // (max_rows) the draft call being gathered
    int32_t* slot_mapping;       // (max_rows)
    int* row_job;                // (max_rows) which drafting sequence each row belongs to
    int n_rows;
    struct sequence** jobs;     // (jobs_capacity) the sequences drafting this step
    const int32_t** job_tables; // (jobs_capacity) their draft block tables
    int* job_guesses;           // (jobs_capacity) the most guesses each may make
    int n_jobs, jobs_capacity;
    float* residual; // (vocab) scratch: max(0, p - q)
    // This step:
    kernel_traffic draft_traffic; // the draft model's passes
    int draft_passes;
    // Since the engine started:
    uint64_t total_drafted, total_accepted, total_emitted, total_target_passes;
} speculative_state;

// Checks the config against the engine's (draft vocabulary, CPU backend)
// and builds the draft's pool and activations. `pool` runs the draft's
// kernels (may be NULL).
int speculative_init(speculative_state* st, const speculative_config* config, const model* target, const model* draft,
                     kv_dtype dtype, int num_blocks, int block_size, int max_rows, thread_pool* pool, error_info* err);
void speculative_free(speculative_state* st);

// Before the step is scheduled: the guesses of every decoding sequence
// (q->n_spec_guesses, at most k, and never so many that the step could
// emit past max_new_tokens or the sequence's capacity).
int speculative_propose(struct engine* e, error_info* err);

// Verifies a sequence's n_spec_guesses guesses against its 1 + n rows of
// target logits (overwritten): writes the tokens it emits to `tokens`
// (kept guesses, then the correction or the bonus), *accepted the kept
// guesses; returns how many tokens it wrote (*accepted + 1).
int speculative_verify(speculative_state* st, struct sequence* q, float* logits, int vocab_size, int32_t* tokens,
                       int* accepted);

// After the step: each draft cache cut back to the tokens the target kept
// (its blocks past them freed); a sequence that no longer runs (preempted,
// finished, cancelled) gives back all of its draft blocks; the counts of
// the step's verifying sequences added to the totals.
void speculative_after_step(struct engine* e, const struct step_batch* b);

// Gives back every draft block of q (a cancel between steps).
void speculative_drop_draft(speculative_state* st, struct sequence* q);

// Up to max_guesses guesses for a sequence of n_tokens tokens by n-gram
// lookup: the latest earlier occurrence of its last n tokens, and the tokens
// that followed it (never reaching past the end). Returns the number
// written to guesses (0 when nothing matches).
int speculative_lookup(const int32_t* tokens, int n_tokens, int n, int max_guesses, int32_t* guesses);

#endif
