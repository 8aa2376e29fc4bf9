// model_eval: how much a changed model (quantized, say) differs from a
// reference, on token sequences read teacher-forced (each position sees
// the true tokens before it).
//
// For every position t with a next token: the KL divergence
// KL(p_ref || p_test) of the two next-token distributions, whether their
// most likely tokens agree (top-1 agreement), and the log-likelihood each
// model gives the true next token (perplexity = exp(mean negative
// log-likelihood)).
#ifndef SERVELAB_MODEL_EVAL_H
#define SERVELAB_MODEL_EVAL_H

#include <stdint.h>

#include "base/error.h"
#include "engine/model.h"
#include "kernels/cpu/thread_pool.h"

typedef struct model_comparison {
    double kl_mean;        // nats, mean over positions
    double top1_agreement; // fraction of positions whose argmax tokens agree
    double ppl_reference;
    double ppl_test;
    int n_positions;
} model_comparison;

int model_compare(const model* reference, const model* test, const int32_t* const* sequences, const int* lengths,
                  int n_sequences, thread_pool* pool, model_comparison* out, error_info* err);

#endif
