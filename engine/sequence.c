#include "engine/sequence.h"

#include <stdlib.h>
#include <string.h>

int sequence_init(sequence* s, int32_t id, int32_t request_id, const int32_t* prompt, int n_prompt,
                  int max_new_tokens, int max_seq_len, error_info* err) {
    memset(s, 0, sizeof *s);
    s->id = id;
    s->request_id = request_id;
    s->capacity = n_prompt + max_new_tokens < max_seq_len ? n_prompt + max_new_tokens : max_seq_len;
    s->tokens = malloc((size_t)s->capacity * sizeof *s->tokens);
    if (!s->tokens) return error_set(err, "sequence %d: out of memory", id);
    memcpy(s->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    s->n_tokens = s->n_prompt = n_prompt;
    s->max_new_tokens = max_new_tokens;
    s->reservation_start = -1;
    s->first_token_time = s->finish_time = -1.0;
    s->fork_parent = -1;
    return 0;
}

void sequence_free(sequence* s) {
    free(s->tokens);
    free(s->block_table);
    free(s->spec_draft_probabilities);
    free(s->draft_block_table);
    sampler_free(&s->sampler);
    memset(s, 0, sizeof *s);
}

int sequence_reserve_table(sequence* s, int n_entries) {
    if (s->n_table + n_entries <= s->table_capacity) return 0;
    int capacity = s->table_capacity ? s->table_capacity : 8;
    while (capacity < s->n_table + n_entries) capacity *= 2;
    int32_t* grown = realloc(s->block_table, (size_t)capacity * sizeof *grown);
    if (!grown) return -1;
    s->block_table = grown;
    s->table_capacity = capacity;
    return 0;
}

const char* sequence_state_name(sequence_state state) {
    switch (state) {
    case SEQ_WAITING: return "waiting";
    case SEQ_PREFILL: return "prefill";
    case SEQ_DECODE: return "decode";
    case SEQ_PREEMPTED: return "preempted";
    case SEQ_FINISHED: return "finished";
    }
    return "?";
}
