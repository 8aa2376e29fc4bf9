#include "engine/block_manager.h"

#include <stdlib.h>
#include <string.h>

// Each call goes to the layout's own function (engine/kv_layout_paged.c,
// engine/kv_layout_contiguous.c).

void block_manager_free(block_manager* bm) {
    free(bm->mark);
    memset(bm, 0, sizeof *bm);
}

int block_manager_admission_cost(const block_manager* bm, const sequence* s, running_view running, int* hit_blocks,
                                 bool* pending) {
    return bm->ops->admission_cost(bm, s, running, hit_blocks, pending);
}

int64_t block_manager_available(const block_manager* bm) { return bm->ops->available_units(bm); }

int block_manager_admit(block_manager* bm, sequence* s, int* prefix_hit_tokens) {
    return bm->ops->admit(bm, s, prefix_hit_tokens);
}

int block_manager_prepare_decode(block_manager* bm, sequence* s) { return bm->ops->prepare_decode(bm, s); }

void block_manager_release(block_manager* bm, sequence* s) { bm->ops->release(bm, s); }

int block_manager_prepare_ahead(block_manager* bm, sequence* s, int n_ahead) {
    // prepare_decode readies the slot of position n_computed; each guess's
    // position is readied the same way, one past the other.
    const int next = s->n_computed;
    int prepared = 0;
    while (prepared < n_ahead) {
        s->n_computed = next + 1 + prepared;
        if (bm->ops->prepare_decode(bm, s) != 0) break;
        prepared++;
    }
    s->n_computed = next;
    return prepared;
}

int block_manager_truncate(block_manager* bm, sequence* s, int n_tokens) {
    if (bm->layout != KV_LAYOUT_PAGED) return 0;
    int keep = (n_tokens + bm->block_size - 1) / bm->block_size, given_back = 0;
    while (s->n_table > keep) {
        kv_pool_release(bm->pool, s->block_table[--s->n_table], s->id);
        given_back++;
    }
    return given_back;
}

void block_manager_fork(block_manager* bm, const sequence* parent, sequence* child) {
    bm->ops->fork(bm, parent, child);
}

void block_manager_after_compute(block_manager* bm, sequence* s, int from, int to) {
    bm->ops->after_compute(bm, s, from, to);
}

int64_t block_manager_units_for_length(const block_manager* bm, int length) {
    return bm->ops->units_for_length(bm, length);
}

int64_t block_manager_capacity_units(const block_manager* bm) { return bm->ops->capacity_units(bm); }

int64_t block_manager_slots(const block_manager* bm) { return bm->ops->slots(bm); }

kv_memory* block_manager_memory(block_manager* bm) { return bm->ops->memory(bm); }

int32_t block_manager_tail_waste(const block_manager* bm, const sequence* s) { return bm->ops->tail_waste(bm, s); }

kv_usage block_manager_measure(block_manager* bm, running_view running) { return bm->ops->measure(bm, running); }
