#include "engine/kv_contiguous.h"

#include <stdlib.h>
#include <string.h>

int kv_contiguous_init(kv_contiguous* c, const model_config* config, kv_dtype dtype, int n_slots, error_info* err) {
    memset(c, 0, sizeof *c);
    if (n_slots < 1) return error_set(err, "contiguous kv: expected at least one slot, found %d", n_slots);
    if (kv_memory_init(&c->memory, config, dtype, n_slots, 1, err)) return -1;
    c->n_slots = n_slots;
    return 0;
}

void kv_contiguous_free(kv_contiguous* c) {
    kv_memory_free(&c->memory);
    free(c->reservations);
    memset(c, 0, sizeof *c);
}

int32_t kv_contiguous_reserve(kv_contiguous* c, int32_t sequence, int length) {
    if (length < 1 || length > c->n_slots) return -1;
    if (c->n_reservations == c->reservations_capacity) {
        int capacity = c->reservations_capacity ? 2 * c->reservations_capacity : 64;
        kv_reservation* grown = realloc(c->reservations, (size_t)capacity * sizeof *grown);
        if (!grown) return -1;
        c->reservations = grown;
        c->reservations_capacity = capacity;
    }
    // First fit: walk the holes in address order (before each reservation,
    // then after the last one).
    int32_t hole_start = 0;
    for (int i = 0; i <= c->n_reservations; i++) {
        int32_t hole_end = i < c->n_reservations ? c->reservations[i].start : c->n_slots;
        if (hole_end - hole_start >= length) {
            memmove(c->reservations + i + 1, c->reservations + i,
                    (size_t)(c->n_reservations - i) * sizeof *c->reservations);
            c->reservations[i] = (kv_reservation){sequence, hole_start, length};
            c->n_reservations++;
            return hole_start;
        }
        if (i < c->n_reservations) hole_start = c->reservations[i].start + c->reservations[i].length;
    }
    return -1;
}

void kv_contiguous_release(kv_contiguous* c, int32_t sequence) {
    for (int i = 0; i < c->n_reservations; i++) {
        if (c->reservations[i].sequence != sequence) continue;
        memmove(c->reservations + i, c->reservations + i + 1,
                (size_t)(c->n_reservations - i - 1) * sizeof *c->reservations);
        c->n_reservations--;
        return;
    }
}

kv_contiguous_usage kv_contiguous_measure(const kv_contiguous* c) {
    kv_contiguous_usage usage = {0, 0, 0, 0};
    int32_t hole_start = 0;
    for (int i = 0; i <= c->n_reservations; i++) {
        int32_t hole_end = i < c->n_reservations ? c->reservations[i].start : c->n_slots;
        int64_t hole = hole_end - hole_start;
        if (hole > 0) {
            usage.free_slots += hole;
            usage.n_holes++;
            if (hole > usage.largest_hole) usage.largest_hole = hole;
        }
        if (i < c->n_reservations) {
            usage.reserved_slots += c->reservations[i].length;
            hole_start = c->reservations[i].start + c->reservations[i].length;
        }
    }
    return usage;
}
