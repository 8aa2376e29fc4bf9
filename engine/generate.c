#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/forward.h"
#include "engine/kv_memory.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

#define GENERATE_BLOCK_SIZE 16 // tokens per KV block; any size gives the same numbers

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char* stop_reason_name(stop_reason reason) {
    switch (reason) {
    case STOP_LENGTH: return "length";
    case STOP_EOS: return "eos";
    case STOP_BOS: return "bos";
    case STOP_CONTEXT: return "context";
    case STOP_CANCELLED: return "cancelled";
    }
    return "?";
}

bool generate_stops_at(const model* m, int32_t token, stop_reason* reason) {
    if (m->n_stop_tokens == 0) {
        if (token != TOK_EOS_ID && token != TOK_BOS_ID) return false;
        *reason = token == TOK_EOS_ID ? STOP_EOS : STOP_BOS;
        return true;
    }
    for (int i = 0; i < m->n_stop_tokens; i++)
        if (token == m->stop_tokens[i]) {
            *reason = STOP_EOS;
            return true;
        }
    return false;
}

int generate(const model* m, const int32_t* prompt_ids, int n_prompt, const generate_options* options,
             int32_t* out_ids, int* n_out, token_callback on_token, void* user, generate_stats* stats,
             error_info* err) {
    const model_config* c = &m->config;
    *n_out = 0;
    memset(stats, 0, sizeof *stats);
    if (n_prompt <= 0) return error_set(err, "generate: the prompt must hold at least BOS");
    if (n_prompt > c->max_seq_len)
        return error_set(err, "prompt: %d tokens, but the model's max_seq_len is %d", n_prompt, c->max_seq_len);
    if (options->max_new_tokens < 0)
        return error_set(err, "-n: expected a count >= 0, found %d", options->max_new_tokens);

    // One sequence owning consecutive blocks 0, 1, ... of a private fp32
    // cache (fp32 keeps the output identical to llama2.c's).
    int n_blocks = (c->max_seq_len + GENERATE_BLOCK_SIZE - 1) / GENERATE_BLOCK_SIZE;
    int32_t* block_table = malloc((size_t)n_blocks * sizeof *block_table); // (n_blocks) block ids
    float* logits = malloc((size_t)c->vocab_size * sizeof(float));         // (vocab_size)
    batch_row* rows = malloc((size_t)n_prompt * sizeof *rows);             // (n_prompt)
    kv_memory kv = {0};
    forward_state state = {0};
    sampler sampler_state = {0};
    int status = -1;
    if (!block_table || !logits || !rows) {
        error_set(err, "generate: out of memory");
        goto done;
    }
    for (int b = 0; b < n_blocks; b++) block_table[b] = b;
    if (kv_memory_init(&kv, c, KV_F32, n_blocks, GENERATE_BLOCK_SIZE, err) ||
        forward_state_init(&state, c, n_prompt, c->max_seq_len, err) ||
        sampler_init(&sampler_state, c->vocab_size, options->temperature, options->top_p, options->seed, err))
        goto done;

    const int32_t* tables[1] = {block_table};
    for (int i = 0; i < n_prompt; i++) rows[i] = (batch_row){prompt_ids[i], i, 0, i == n_prompt - 1};
    forward_batch batch = {n_prompt, rows, 1, tables};
    stats->n_prompt_tokens = n_prompt;

    double start = now_seconds();
    if (forward(m, &state, &kv, &batch, logits, &stats->prefill_traffic, err)) goto done;
    stats->prefill_seconds = now_seconds() - start;

    int32_t previous = prompt_ids[n_prompt - 1];
    int position = n_prompt;
    stats->stop = STOP_LENGTH;
    start = now_seconds();
    while (*n_out < options->max_new_tokens) {
        int32_t token = sampler_sample(&sampler_state, logits);
        if (generate_stops_at(m, token, &stats->stop)) break;
        out_ids[(*n_out)++] = token;
        if (on_token) on_token(user, previous, token);
        previous = token;
        if (*n_out == options->max_new_tokens) break;
        if (position >= c->max_seq_len) {
            stats->stop = STOP_CONTEXT;
            break;
        }
        batch_row row = {token, position, 0, true};
        forward_batch step = {1, &row, 1, tables};
        if (forward(m, &state, &kv, &step, logits, &stats->decode_traffic, err)) goto done;
        stats->n_decode_steps++;
        position++;
    }
    stats->decode_seconds = now_seconds() - start;
    stats->n_generated = *n_out;
    status = 0;
done:
    sampler_free(&sampler_state);
    forward_state_free(&state);
    kv_memory_free(&kv);
    free(rows);
    free(logits);
    free(block_table);
    return status;
}
