#include "engine/model_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward.h"
#include "engine/kv_memory.h"
#include "engine/sampler.h"

// Every position's logits of one sequence: out (n, vocab).
static int sequence_logits(const model* m, const int32_t* tokens, int n, thread_pool* pool, float* out,
                           error_info* err) {
    const model_config* c = &m->config;
    int block_size = 16, n_blocks = (n + block_size - 1) / block_size;
    kv_memory kv;
    forward_state state;
    if (kv_memory_init(&kv, c, KV_F32, n_blocks, block_size, err)) return -1;
    if (forward_state_init(&state, c, n, n, err) || forward_state_set_pool(&state, pool, err)) {
        forward_state_free(&state);
        kv_memory_free(&kv);
        return -1;
    }
    int32_t* table = malloc((size_t)n_blocks * sizeof *table); // (n_blocks) identity
    batch_row* rows = malloc((size_t)n * sizeof *rows);        // (n)
    int32_t* slots = malloc((size_t)n * sizeof *slots);        // (n) KV slot of each row
    int status = (!table || !rows || !slots) ? error_set(err, "evaluate: out of memory") : 0;
    if (status == 0) {
        for (int b = 0; b < n_blocks; b++) table[b] = b;
        for (int i = 0; i < n; i++) rows[i] = (batch_row){tokens[i], i, 0, true};
        const int32_t* tables[1] = {table};
        forward_batch_map_slots(slots, rows, n, tables, block_size);
        forward_batch batch = {n, rows, 1, tables, slots};
        status = forward(m, &state, &kv, &batch, out, NULL, err);
    }
    free(table);
    free(rows);
    free(slots);
    forward_state_free(&state);
    kv_memory_free(&kv);
    return status;
}

// log-softmax of logits into log_probabilities, in double: (vocab).
static void log_softmax(const float* logits, int vocab, double* log_probabilities) {
    double max_value = logits[0];
    for (int i = 1; i < vocab; i++)
        if (logits[i] > max_value) max_value = logits[i];
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - max_value);
    double log_sum = log(sum) + max_value;
    for (int i = 0; i < vocab; i++) log_probabilities[i] = (double)logits[i] - log_sum;
}

int model_compare(const model* reference, const model* test, const int32_t* const* sequences, const int* lengths,
                  int n_sequences, thread_pool* pool, model_comparison* out, error_info* err) {
    memset(out, 0, sizeof *out);
    const int vocab = reference->config.vocab_size;
    if (test->config.vocab_size != vocab || test->config.max_seq_len != reference->config.max_seq_len)
        return error_set(err, "evaluate: the two models have different shapes");
    double kl_sum = 0, nll_reference = 0, nll_test = 0;
    int agree = 0, positions = 0, status = 0;
    double* log_p = malloc((size_t)vocab * sizeof *log_p); // (vocab)
    double* log_q = malloc((size_t)vocab * sizeof *log_q); // (vocab)
    if (!log_p || !log_q) status = error_set(err, "evaluate: out of memory");
    for (int s = 0; status == 0 && s < n_sequences; s++) {
        int n = lengths[s] < reference->config.max_seq_len ? lengths[s] : reference->config.max_seq_len;
        if (n < 2) continue;
        float* logits_p = malloc((size_t)n * (size_t)vocab * sizeof(float)); // (n, vocab)
        float* logits_q = malloc((size_t)n * (size_t)vocab * sizeof(float)); // (n, vocab)
        if (!logits_p || !logits_q) status = error_set(err, "evaluate: out of memory");
        if (status == 0) status = sequence_logits(reference, sequences[s], n, pool, logits_p, err);
        if (status == 0) status = sequence_logits(test, sequences[s], n, pool, logits_q, err);
        for (int t = 0; status == 0 && t < n - 1; t++) {
            const float* p_row = logits_p + (size_t)t * (size_t)vocab;
            const float* q_row = logits_q + (size_t)t * (size_t)vocab;
            log_softmax(p_row, vocab, log_p);
            log_softmax(q_row, vocab, log_q);
            double kl = 0;
            for (int i = 0; i < vocab; i++) kl += exp(log_p[i]) * (log_p[i] - log_q[i]);
            kl_sum += kl;
            agree += sampler_argmax(p_row, vocab) == sampler_argmax(q_row, vocab);
            int32_t next = sequences[s][t + 1];
            nll_reference -= log_p[next];
            nll_test -= log_q[next];
            positions++;
        }
        free(logits_p);
        free(logits_q);
    }
    free(log_p);
    free(log_q);
    if (status) return -1;
    if (positions == 0) return error_set(err, "evaluate: no positions to compare (sequences shorter than 2 tokens)");
    out->n_positions = positions;
    out->kl_mean = kl_sum / positions;
    out->top1_agreement = (double)agree / positions;
    out->ppl_reference = exp(nll_reference / positions);
    out->ppl_test = exp(nll_test / positions);
    return 0;
}
