// lesson_bank_claims: what the question bank (shared/seed/question-bank.txt,
// rewritten in quiz/bank.lua) says of each claim a lesson may check.
//
// A lesson states each claim as one sentence, and lab.check's bank_answer
// must equal the bank's answer to it: a lesson once declared tf10 with
// bank_answer = true, measured nothing, and printed a PASS. The answer
// follows the item's kind in the bank: a true/false item has its own
// answer; a spot-the-error item is stated as the mistaken sentence, so
// false; a why, edge-case or recall item is stated as the bank's model
// answer, so true. tests/lab/quiz/test_quiz_bank.c holds this list to
// quiz/bank.lua (the same 33 ids, each true/false answer equal).
#include <string.h>

#include "lab/lesson/lesson.h"

static const lesson_bank_claim BANK_CLAIMS[] = {
    // true or false: the bank's own answer
    {"tf1", false, "PagedAttention makes the attention math use fewer FLOPs"},
    {"tf2", false, "weight-only INT4 always speeds up prefill"},
    {"tf3", false, "the KV cache grows quadratically with sequence length"},
    {"tf4", false, "continuous batching and PagedAttention are one mechanism"},
    {"tf5", false, "symmetric quantization is strictly worse than asymmetric"},
    {"tf6", false, "the largest block size is best (least bookkeeping)"},
    {"tf7", false, "INT4 has exactly twice the error of INT8"},
    {"tf8", true, "a quantized model need not keep an FP16 copy of its weights"},
    {"tf9", false, "with spare memory a bigger batch always raises tokens/s"},
    {"tf10", false, "two requests sharing a system prompt must each store its KV"},
    // spot the error: the mistaken sentence
    {"se1", false, "KV cache size = B x S x L x d x p (no factor 2)"},
    {"se2", false, "the whole-cache formula uses d_head because attention works per head"},
    {"se3", false, "AWQ minimises the layer's output error with a Hessian"},
    {"se4", false, "W8A8 quantizes only the weights (like W4A16, at 8 bits)"},
    {"se5", false, "the zero-point is z = round(r_min / s)"},
    {"se6", false, "per-tensor quantization is finer-grained than per-channel"},
    {"se7", false, "PagedAttention removes all KV memory waste"},
    {"se8", false, "a naive (contiguous) cache fragments memory because attention costs O(t^2)"},
    // why, edge cases, recall: the model answer
    {"why1", true, "decode is memory-bound and prefill compute-bound (intensity against the ridge point)"},
    {"why2", true, "INT4 weights speed up decode although the math runs in higher precision"},
    {"why3", true, "quantization needs both rounding (error <= s/2 in range) and clipping (saturate outliers)"},
    {"why4", true, "4-bit quantization needs group scales and outlier handling"},
    {"why5", true,
     "PagedAttention raises throughput by fitting more requests, but leaves one request's latency unchanged"},
    {"why6", true, "tensor parallelism leaves decode memory-bound"},
    {"edge1", true, "a sequence whose length is an exact multiple of block_size has no tail waste"},
    {"edge2", true, "a weight exactly halfway between two levels has the largest rounding error, s/2"},
    {"edge3", true, "a value far above r_max saturates at the top code 2^b - 1 and decodes to r_max"},
    {"edge4", true, "a value far below r_min saturates at code 0 and decodes to s(0 - z) = r_min"},
    {"edge5", true, "with batch 1 and a short prompt PagedAttention gains little"},
    {"edge6", true, "when two sharers write into a shared block, copy-on-write gives each its own copy"},
    {"edge7", true, "block_size = 1 gives no tail waste, the largest block tables and the slowest kernel"},
    {"edge8", true, "at S = 1 the cache holds one token per sequence: 2 x B x L x d x p"},
    {"recall1", true, "quantization wins on decode (fewer bytes) and risks prefill (extra dequantization work)"},
};

const lesson_bank_claim* lesson_bank_claim_find(const char* id) {
    for (size_t i = 0; i < sizeof BANK_CLAIMS / sizeof BANK_CLAIMS[0]; i++)
        if (strcmp(BANK_CLAIMS[i].id, id) == 0) return &BANK_CLAIMS[i];
    return NULL;
}

const lesson_bank_claim* lesson_bank_claims(int* count) {
    *count = (int)(sizeof BANK_CLAIMS / sizeof BANK_CLAIMS[0]);
    return BANK_CLAIMS;
}
