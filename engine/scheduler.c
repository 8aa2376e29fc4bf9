#include "engine/scheduler.h"

#include <string.h>

#include "engine/block_manager.h"
#include "engine/fault.h"

void scheduler_remove_running(engine* e, int32_t id) {
    for (int i = 0; i < e->n_running; i++) {
        if (e->running[i] != id) continue;
        memmove(e->running + i, e->running + i + 1, (size_t)(e->n_running - i - 1) * sizeof *e->running);
        e->n_running--;
        return;
    }
}

static void push_waiting_front(engine* e, int32_t id) {
    memmove(e->waiting + 1, e->waiting, (size_t)e->n_waiting * sizeof *e->waiting);
    e->waiting[0] = id;
    e->n_waiting++;
}

static void pop_waiting_front(engine* e) {
    memmove(e->waiting, e->waiting + 1, (size_t)(e->n_waiting - 1) * sizeof *e->waiting);
    e->n_waiting--;
}

// Preemption by recompute: the victim's blocks go back to the pool, its
// tokens (prompt and generated) stay, and it waits at the front of the
// queue to compute them all again.
static void preempt(engine* e, sequence* victim) {
    block_manager_release(e, victim);
    victim->n_computed = 0;
    victim->state = SEQ_PREEMPTED;
    victim->n_preemptions++;
    scheduler_remove_running(e, victim->id);
    push_waiting_front(e, victim->id);
    e->total_preemptions++;
}

// The running sequence admitted last (the preemption victim).
static sequence* latest_admitted(engine* e) {
    sequence* latest = NULL;
    for (int i = 0; i < e->n_running; i++) {
        sequence* s = &e->sequences[e->running[i]];
        if (!latest || s->admit_order > latest->admit_order) latest = s;
    }
    return latest;
}

static bool already_scheduled(const schedule_result* out, int32_t id) {
    for (int i = 0; i < out->n_items; i++)
        if (out->items[i].id == id) return true;
    return false;
}

static int chunk_for(const engine* e, const sequence* s, int budget) {
    int pending = sequence_pending_tokens(s);
    if (!e->config.chunked_prefill) return pending <= budget || budget == e->config.max_batched_tokens ? pending : 0;
    return pending < budget ? pending : budget;
}

int scheduler_schedule(engine* e, schedule_result* out, error_info* err) {
    (void)err;
    out->n_items = out->n_preempted = out->prefix_hit_tokens = 0;
    int budget = e->config.max_batched_tokens;

    // 1. Running sequences, oldest first.
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        sequence* s = &e->sequences[e->running[i]];
        if (s->state == SEQ_DECODE) {
            bool preempted_self = false;
            while (block_manager_prepare_decode(e, s) != 0) {
                sequence* victim = latest_admitted(e);
                bool is_self = victim == s;
                // A victim already in this step's batch is removed from it.
                for (int k = 0; k < out->n_items; k++)
                    if (out->items[k].id == victim->id) {
                        budget += out->items[k].n_tokens;
                        memmove(out->items + k, out->items + k + 1, (size_t)(out->n_items - k - 1) * sizeof *out->items);
                        out->n_items--;
                        break;
                    }
                preempt(e, victim);
                out->n_preempted++;
                if (is_self) {
                    preempted_self = true;
                    break;
                }
                // The running list shifted; re-find s's index.
                for (int k = 0; k < e->n_running; k++)
                    if (e->running[k] == s->id) i = k;
            }
            if (preempted_self) {
                i--; // the list shifted under us
                continue;
            }
            out->items[out->n_items++] = (scheduled_sequence){s->id, 1, PHASE_DECODE};
            budget -= 1;
        } else if (s->state == SEQ_PREFILL && !already_scheduled(out, s->id)) {
            int chunk = chunk_for(e, s, budget);
            if (chunk == 0) continue;
            out->items[out->n_items++] = (scheduled_sequence){s->id, chunk, PHASE_PREFILL};
            budget -= chunk;
        }
    }

    // 2. Waiting requests, first come first served. Static batching admits
    // only into an empty batch; so does "continuous" batching under the
    // static-batching fault (engine/fault.h), the bug where the admission
    // test is the static one.
    bool admits_only_when_empty = e->config.batching == BATCHING_STATIC || fault_on(FAULT_STATIC_BATCHING);
    bool may_admit = !admits_only_when_empty || e->n_running == 0;
    // Static batching admits the whole batch at once, whatever this step's
    // token budget: the members prefill over the following steps.
    bool ignore_budget = e->config.batching == BATCHING_STATIC;
    while (may_admit && e->n_waiting > 0 && e->n_running < e->config.max_seqs && (budget > 0 || ignore_budget)) {
        sequence* s = &e->sequences[e->waiting[0]];
        int hit_blocks;
        bool pending;
        int cost = block_manager_admission_cost(e, s, &hit_blocks, &pending);
        if (pending) break; // its prefix is being computed right now: share it next step
        if (e->config.layout == KV_LAYOUT_PAGED) {
            int headroom = e->n_running > 0 ? e->config.watermark_blocks : 0;
            if (cost + headroom > kv_pool_available(&e->pool)) break;
        }
        int hit_tokens = 0;
        if (block_manager_admit(e, s, &hit_tokens) != 0) break; // contiguous: no hole fits
        pop_waiting_front(e);
        s->state = SEQ_PREFILL;
        s->admit_order = ++e->admit_counter;
        e->running[e->n_running++] = s->id;
        out->prefix_hit_tokens += hit_tokens;
        int chunk = chunk_for(e, s, budget);
        if (chunk > 0) {
            out->items[out->n_items++] = (scheduled_sequence){s->id, chunk, PHASE_PREFILL};
            budget -= chunk;
        }
    }
    return 0;
}
