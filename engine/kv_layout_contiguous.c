// The contiguous layout: one run of slots per request, reserved whole at
// admission (engine/kv_layout.h). Its block table lists one slot per entry.
#include <stdint.h>

#include "engine/block_manager.h"
#include "engine/fault.h"

static int64_t units_for_length(const block_manager* bm, int length) {
    return bm->reserve == RESERVE_MAX ? bm->max_seq_len : length;
}
static int64_t capacity_units(const block_manager* bm) { return bm->contiguous->n_slots; }
// No count to check against: whether a hole fits is decided by
// kv_contiguous_reserve at admission.
static int64_t available_units(const block_manager* bm) {
    (void)bm;
    return INT64_MAX;
}
static int64_t slots(const block_manager* bm) { return bm->contiguous->n_slots; }
static kv_memory* memory(block_manager* bm) { return &bm->contiguous->memory; }

// Reservation length for a sequence.
static int reservation_length(const block_manager* bm, const sequence* s) {
    int max_len = bm->max_seq_len;
    // The bug (reserve-request-length): "max" reserves only the request.
    if (bm->reserve == RESERVE_MAX && !fault_on(FAULT_RESERVE_REQUEST_LENGTH)) return max_len;
    return s->capacity < max_len ? s->capacity : max_len;
}

static int admission_cost(const block_manager* bm, const sequence* s, running_view running, int* hit_blocks,
                          bool* pending) {
    (void)running; // nothing is shared, so nothing is worth waiting for
    *hit_blocks = 0;
    *pending = false;
    return reservation_length(bm, s);
}

static int admit(block_manager* bm, sequence* s, int* prefix_hit_tokens) {
    *prefix_hit_tokens = 0;
    s->n_table = 0;
    int length = reservation_length(bm, s);
    int32_t start = kv_contiguous_reserve(bm->contiguous, s->id, length);
    if (start < 0 || sequence_reserve_table(s, length)) {
        if (start >= 0) kv_contiguous_release(bm->contiguous, s->id);
        return -1;
    }
    for (int i = 0; i < length; i++) s->block_table[i] = start + i;
    s->n_table = length;
    s->reservation_start = start;
    s->n_computed = 0;
    return 0;
}

static int prepare_decode(block_manager* bm, sequence* s) {
    (void)bm; // reserved at admission
    (void)s;
    return 0;
}

static void release(block_manager* bm, sequence* s) {
    if (s->reservation_start >= 0) kv_contiguous_release(bm->contiguous, s->id);
    s->reservation_start = -1;
    s->n_table = 0;
    s->n_hashed_blocks = 0;
    s->last_block_hash = 0;
}

static void after_compute(block_manager* bm, sequence* s, int from, int to) {
    (void)bm; // no fill counts, no prefix cache
    (void)s;
    (void)from;
    (void)to;
}

static int32_t tail_waste(const block_manager* bm, const sequence* s) {
    (void)bm; // a reservation's unused slots are reserved_unused_slots, not tail waste
    (void)s;
    return 0;
}

static kv_usage measure(block_manager* bm, running_view running) {
    kv_usage u = {0};
    u.slots_total = slots(bm);
    kv_contiguous_usage usage = kv_contiguous_measure(bm->contiguous);
    for (int i = 0; i < running.n_running; i++) u.slots_used += running.sequences[running.running[i]].n_computed;
    u.slots_allocated = usage.reserved_slots;
    u.reserved_unused_slots = usage.reserved_slots - u.slots_used;
    u.external_fragmentation_slots = usage.free_slots - usage.largest_hole;
    return u;
}

const kv_layout_ops kv_layout_contiguous_ops = {
    .unit_name = "slots",
    .shares_blocks = false,
    .units_for_length = units_for_length,
    .capacity_units = capacity_units,
    .available_units = available_units,
    .slots = slots,
    .memory = memory,
    .admission_cost = admission_cost,
    .admit = admit,
    .prepare_decode = prepare_decode,
    .release = release,
    .fork = NULL,
    .after_compute = after_compute,
    .tail_waste = tail_waste,
    .measure = measure,
};

int block_manager_init_contiguous(block_manager* bm, kv_contiguous* contiguous, reserve_policy reserve,
                                  int max_seq_len, error_info* err) {
    (void)err;
    *bm = (block_manager){.layout = KV_LAYOUT_CONTIGUOUS,
                          .ops = &kv_layout_contiguous_ops,
                          .block_size = 1,
                          .reserve = reserve,
                          .max_seq_len = max_seq_len,
                          .contiguous = contiguous};
    return 0;
}
