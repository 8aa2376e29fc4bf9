#include "engine/batch.h"

#include <stdlib.h>
#include <string.h>

#include "base/array_grow.h"

int step_batch_reserve(step_batch* b, int n_items, int n_rows, int n_finished) {
    if (n_items > b->items_capacity) {
        int capacity = b->items_capacity;
        if (array_grow(&b->items, &capacity, n_items, sizeof *b->items)) return -1;
        capacity = b->items_capacity;
        if (array_grow(&b->block_tables, &capacity, n_items, sizeof *b->block_tables)) return -1;
        b->items_capacity = capacity;
    }
    if (n_rows > b->rows_capacity) {
        int capacity = b->rows_capacity;
        if (array_grow(&b->rows, &capacity, n_rows, sizeof *b->rows)) return -1;
        capacity = b->rows_capacity;
        if (array_grow(&b->slot_mapping, &capacity, n_rows, sizeof *b->slot_mapping)) return -1;
        capacity = b->rows_capacity; // a verifying sequence samples from each of its rows (engine/speculative.h)
        if (array_grow(&b->sampled, &capacity, n_rows, sizeof *b->sampled)) return -1;
        b->rows_capacity = capacity;
    }
    return array_grow(&b->finished_ids, &b->finished_capacity, n_finished, sizeof *b->finished_ids);
}

int step_batch_reserve_forks(step_batch* b, int n_forks) {
    if (n_forks <= b->forks_capacity) return 0;
    int capacity = b->forks_capacity;
    if (array_grow(&b->fork_samplers, &capacity, n_forks, sizeof *b->fork_samplers)) return -1;
    capacity = b->forks_capacity;
    if (array_grow(&b->fork_tokens, &capacity, n_forks, sizeof *b->fork_tokens)) return -1;
    b->forks_capacity = capacity;
    return 0;
}

void step_batch_free(step_batch* b) {
    for (int i = 0; i < b->n_forks; i++) sampler_free(&b->fork_samplers[i]); // those not handed over
    free(b->items);
    free(b->block_tables);
    free(b->sampled);
    free(b->rows);
    free(b->slot_mapping);
    free(b->fork_samplers);
    free(b->fork_tokens);
    free(b->finished_ids);
    memset(b, 0, sizeof *b);
}
