#include "engine/step_record.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/array_grow.h"
#include "engine/engine.h"
#include "engine/scheduler.h"

const char* block_event_name(block_event_kind kind) {
    switch (kind) {
    case BLOCK_ALLOCATE: return "allocate";
    case BLOCK_FREE: return "free";
    case BLOCK_SHARE: return "share";
    case BLOCK_COPY: return "copy";
    case BLOCK_EVICT: return "evict";
    case BLOCK_CACHE: return "cache";
    }
    return "?";
}

// ---- the field table ---------------------------------------------------------------------

#define FIELD(group, name, kind, member) {group, name, kind, offsetof(step_record, member), 0, 0}
#define SECONDS(group, name, member, decimals) \
    {group, name, STEP_FIELD_DOUBLE, offsetof(step_record, member), decimals, 0}

// In the order the JSON trace has always written them; a group's fields
// stay together (the writer opens and closes its object around them).
const step_record_field step_record_fields[] = {
    FIELD(NULL, "step", STEP_FIELD_U64, step),
    SECONDS(NULL, "clock_s", clock_seconds, 6),
    FIELD(NULL, "wall_ns", STEP_FIELD_U64, wall_ns),
    FIELD(NULL, "prefill_tokens", STEP_FIELD_INT, prefill_tokens),
    FIELD(NULL, "decode_tokens", STEP_FIELD_INT, decode_tokens),
    {NULL, "device_ns", STEP_FIELD_U64, offsetof(step_record, device_ns), 0, 1},
    FIELD(NULL, "traffic", STEP_FIELD_TRAFFIC, traffic),
    FIELD("tp", "shards", STEP_FIELD_INT, tp_shards),
    FIELD("tp", "link", STEP_FIELD_STRING, tp_link),
    FIELD("tp", "allreduces", STEP_FIELD_INT, n_allreduces),
    FIELD("tp", "allreduce_bytes", STEP_FIELD_U64, allreduce_bytes),
    SECONDS("tp", "allreduce_s", allreduce_seconds, 9),
    FIELD("tp", "shard_traffic", STEP_FIELD_SHARD_TRAFFIC, shard_traffic),
    FIELD("pool", "blocks_total", STEP_FIELD_INT, blocks_total),
    FIELD("pool", "blocks_free", STEP_FIELD_INT, blocks_free),
    FIELD("pool", "blocks_used", STEP_FIELD_INT, blocks_used),
    FIELD("pool", "blocks_cached", STEP_FIELD_INT, blocks_cached),
    FIELD("pool", "slots_total", STEP_FIELD_I64, slots_total),
    FIELD("pool", "slots_used", STEP_FIELD_I64, slots_used),
    FIELD("pool", "slots_allocated", STEP_FIELD_I64, slots_allocated),
    FIELD("pool", "tail_waste_slots", STEP_FIELD_I64, tail_waste_slots),
    FIELD("pool", "reserved_unused_slots", STEP_FIELD_I64, reserved_unused_slots),
    FIELD("pool", "external_fragmentation_slots", STEP_FIELD_I64, external_fragmentation_slots),
    FIELD("queues", "waiting", STEP_FIELD_INT, n_waiting),
    FIELD("queues", "running", STEP_FIELD_INT, n_running),
    FIELD("queues", "finished", STEP_FIELD_INT, n_finished),
    FIELD(NULL, "preempted", STEP_FIELD_INT, n_preempted),
    FIELD(NULL, "prefix_hit_tokens", STEP_FIELD_INT, prefix_hit_tokens),
    FIELD(NULL, "copy_bytes", STEP_FIELD_U64, copy_bytes),
    // Speculative decoding: written only when it is on (spec_k > 0).
    FIELD("spec", "kind", STEP_FIELD_STRING, spec_kind),
    FIELD("spec", "k", STEP_FIELD_INT, spec_k),
    FIELD("spec", "verify_tokens", STEP_FIELD_INT, spec_verify_tokens),
    FIELD("spec", "drafted", STEP_FIELD_INT, spec_drafted),
    FIELD("spec", "accepted", STEP_FIELD_INT, spec_accepted),
    FIELD("spec", "rejected", STEP_FIELD_INT, spec_rejected),
    FIELD("spec", "bonus", STEP_FIELD_INT, spec_bonus),
    FIELD("spec", "emitted", STEP_FIELD_INT, spec_emitted),
    FIELD("spec", "rollback_slots", STEP_FIELD_INT, spec_rollback_slots),
    FIELD("spec", "rollback_blocks", STEP_FIELD_INT, spec_rollback_blocks),
    FIELD("spec", "draft_passes", STEP_FIELD_INT, spec_draft_passes),
    FIELD("spec", "draft_weight_bytes", STEP_FIELD_U64, spec_draft_weight_bytes),
    FIELD("spec", "target_weight_bytes", STEP_FIELD_U64, spec_target_weight_bytes),
    FIELD("spec", "draft_kv_bytes", STEP_FIELD_U64, spec_draft_kv_bytes),
    FIELD("spec", "draft_blocks_total", STEP_FIELD_INT, spec_draft_blocks_total),
    FIELD("spec", "draft_blocks_used", STEP_FIELD_INT, spec_draft_blocks_used),
    FIELD("spec", "total_drafted", STEP_FIELD_U64, spec_total_drafted),
    FIELD("spec", "total_accepted", STEP_FIELD_U64, spec_total_accepted),
    FIELD("spec", "total_emitted", STEP_FIELD_U64, spec_total_emitted),
    FIELD("spec", "total_target_passes", STEP_FIELD_U64, spec_total_target_passes),
};
const int step_record_field_count = (int)(sizeof step_record_fields / sizeof step_record_fields[0]);

#define TRAFFIC(name, member) {NULL, name, STEP_FIELD_U64, offsetof(kernel_traffic, member), 0, 0}

const step_record_field step_traffic_fields[] = {
    TRAFFIC("weight_bytes", weight_bytes_read),     TRAFFIC("kv_bytes_read", kv_bytes_read),
    TRAFFIC("kv_bytes_written", kv_bytes_written), TRAFFIC("activation_bytes", activation_bytes),
    TRAFFIC("matmul_flops", matmul_flops),         TRAFFIC("attention_flops", attention_flops),
};
const int step_traffic_field_count = (int)(sizeof step_traffic_fields / sizeof step_traffic_fields[0]);

// ---- JSON ------------------------------------------------------------------------------------

// Writes one member `"name":value`, after a comma unless it opens its object.
static void write_member(const step_record_field* f, const void* base, bool* first, FILE* out);

static void write_traffic(const kernel_traffic* t, bool* first, FILE* out) {
    for (int i = 0; i < step_traffic_field_count; i++) write_member(&step_traffic_fields[i], t, first, out);
}

static void write_member(const step_record_field* f, const void* base, bool* first, FILE* out) {
    const char* at = (const char*)base + f->offset;
    if (f->kind == STEP_FIELD_TRAFFIC) { // its members sit inline
        write_traffic((const kernel_traffic*)(const void*)at, first, out);
        return;
    }
    if (f->omit_when_zero && f->kind == STEP_FIELD_U64 && *(const uint64_t*)(const void*)at == 0) return;
    fprintf(out, "%s\"%s\":", *first ? "" : ",", f->name);
    *first = false;
    switch (f->kind) {
    case STEP_FIELD_INT: fprintf(out, "%d", *(const int*)(const void*)at); break;
    case STEP_FIELD_U64: fprintf(out, "%" PRIu64, *(const uint64_t*)(const void*)at); break;
    case STEP_FIELD_I64: fprintf(out, "%" PRId64, *(const int64_t*)(const void*)at); break;
    case STEP_FIELD_DOUBLE: fprintf(out, "%.*f", f->decimals, *(const double*)(const void*)at); break;
    case STEP_FIELD_STRING: {
        const char* text = *(const char* const*)(const void*)at;
        fprintf(out, "\"%s\"", text ? text : "");
        break;
    }
    case STEP_FIELD_SHARD_TRAFFIC: {
        const step_record* r = base;
        fputc('[', out);
        for (int k = 0; k < r->tp_shards && k < MAX_TP_SHARDS; k++) {
            bool first_in_shard = true;
            fputs(k ? ",{" : "{", out);
            write_traffic(&r->shard_traffic[k], &first_in_shard, out);
            fputc('}', out);
        }
        fputc(']', out);
        break;
    }
    case STEP_FIELD_TRAFFIC: break; // handled above
    }
}

void step_record_write_json(const step_record* r, FILE* out) {
    fputc('{', out);
    bool first = true, first_in_group = true;
    const char* group = NULL;
    for (int i = 0; i < step_record_field_count; i++) {
        const step_record_field* f = &step_record_fields[i];
        if (r->spec_k == 0 && f->group && strcmp(f->group, "spec") == 0) continue; // off: the trace is as before
        bool same_group = f->group == group || (f->group && group && strcmp(f->group, group) == 0);
        if (!same_group) {
            if (group) fputc('}', out);
            group = f->group;
            if (group) {
                fprintf(out, "%s\"%s\":{", first ? "" : ",", group);
                first = false;
                first_in_group = true;
            }
        }
        write_member(f, r, group ? &first_in_group : &first, out);
    }
    if (group) fputc('}', out);
    fputs(",\"sequences\":[", out);
    for (int i = 0; i < r->n_sequences; i++) {
        const step_sequence* s = &r->sequences[i];
        fprintf(out, "%s{\"id\":%d,\"request\":%d,\"phase\":\"%s\",\"tokens\":%d,\"context\":%d,\"tail_fill\":%d,\"blocks\":[",
                i ? "," : "", s->id, s->request_id, s->phase == PHASE_PREFILL ? "prefill" : "decode", s->n_tokens,
                s->context_length, s->tail_fill);
        for (int b = 0; b < s->n_table; b++) fprintf(out, "%s%d", b ? "," : "", r->block_ids[s->table_offset + b]);
        fputc(']', out);
        if (r->spec_k > 0)
            fprintf(out,
                    ",\"spec\":{\"drafted\":%d,\"accepted\":%d,\"rejected\":%d,\"bonus\":%d,\"emitted\":%d,"
                    "\"rollback_first_position\":%d,\"rollback_slots\":%d,\"rollback_blocks\":%d}",
                    s->spec_drafted, s->spec_accepted, s->spec_rejected, s->spec_bonus, s->spec_emitted,
                    s->spec_rollback_first_position, s->spec_rollback_slots, s->spec_rollback_blocks);
        fputc('}', out);
    }
    fputs("],\"events\":[", out);
    for (int i = 0; i < r->n_events; i++) {
        const block_event* e = &r->events[i];
        fprintf(out, "%s{\"kind\":\"%s\",\"block\":%d,\"sequence\":%d", i ? "," : "", block_event_name(e->kind),
                e->block, e->sequence);
        if (e->kind == BLOCK_COPY) fprintf(out, ",\"copy\":%d", e->other_block);
        fputc('}', out);
    }
    fputs("],\"finished\":[", out);
    for (int i = 0; i < r->n_finished_now; i++) fprintf(out, "%s%d", i ? "," : "", r->finished_ids[i]);
    fputs("]}\n", out);
}

// ---- the record's arrays ---------------------------------------------------------------------

void step_record_free(step_record* r) {
    free(r->sequences);
    free(r->block_ids);
    free(r->finished_ids);
    free(r->waiting_ids);
    free(r->running_ids);
    free(r->live_sequences);
    free(r->blocks);
    memset(r, 0, sizeof *r);
}

void step_record_clear(step_record* r) {
    step_record kept = *r;
    memset(r, 0, sizeof *r);
    r->sequences = kept.sequences;
    r->block_ids = kept.block_ids;
    r->finished_ids = kept.finished_ids;
    r->waiting_ids = kept.waiting_ids;
    r->running_ids = kept.running_ids;
    r->live_sequences = kept.live_sequences;
    r->blocks = kept.blocks;
    r->sequences_capacity = kept.sequences_capacity;
    r->block_ids_capacity = kept.block_ids_capacity;
    r->finished_capacity = kept.finished_capacity;
    r->waiting_capacity = kept.waiting_capacity;
    r->running_capacity = kept.running_capacity;
    r->live_capacity = kept.live_capacity;
}


// ---- filling it from the engine ----------------------------------------------------------------

// Occupancy and waste of the memory, over the running sequences.
static void measure_pool(scheduler* s, step_record* r) {
    running_view running = {s->sequences, s->running, s->n_running};
    kv_usage u = block_manager_measure(&s->kv, running);
    r->blocks_total = u.blocks_total;
    r->blocks_free = u.blocks_free;
    r->blocks_used = u.blocks_used;
    r->blocks_cached = u.blocks_cached;
    r->slots_total = u.slots_total;
    r->slots_used = u.slots_used;
    r->slots_allocated = u.slots_allocated;
    r->tail_waste_slots = u.tail_waste_slots;
    r->reserved_unused_slots = u.reserved_unused_slots;
    r->external_fragmentation_slots = u.external_fragmentation_slots;
}

// Every pool block's owners and fill (paged).
static void record_blocks(const kv_pool* pool, step_record* r) {
    for (int b = 0; b < pool->n_blocks; b++) {
        const kv_block* k = &pool->blocks[b];
        int owners = k->ref_count - (k->cached ? 1 : 0); // block tables holding it
        block_state state = k->ref_count == 0 ? BLOCK_STATE_FREE
                            : owners == 0     ? BLOCK_STATE_CACHED
                            : owners > 1      ? BLOCK_STATE_SHARED
                                              : BLOCK_STATE_USED;
        r->blocks[b] = (step_block){k->ref_count, k->n_filled, state};
    }
    r->blocks_in_prefix_cache = pool->n_cached;
    r->total_copies = pool->total_copies;
    r->total_evictions = pool->total_evictions;
}

// The sequences that ran, with a copy of their block tables.
static int record_ran(const scheduler* sched, const step_batch* plan, step_record* r) {
    int total = 0;
    for (int i = 0; i < plan->n_items; i++) total += sched->sequences[plan->items[i].id].n_table;
    if (array_grow(&r->block_ids, &r->block_ids_capacity, total, sizeof *r->block_ids) ||
        array_grow(&r->sequences, &r->sequences_capacity, plan->n_items, sizeof *r->sequences) ||
        array_grow(&r->finished_ids, &r->finished_capacity, plan->n_finished, sizeof *r->finished_ids))
        return -1;
    r->prefill_tokens = plan->prefill_tokens;
    r->decode_tokens = plan->decode_tokens;
    r->n_preempted = plan->n_preempted;
    r->prefix_hit_tokens = plan->prefix_hit_tokens;
    r->n_finished_now = plan->n_finished;
    if (plan->n_finished > 0)
        memcpy(r->finished_ids, plan->finished_ids, (size_t)plan->n_finished * sizeof *r->finished_ids);
    r->n_sequences = plan->n_items;
    int offset = 0;
    for (int i = 0; i < plan->n_items; i++) {
        const sequence* s = &sched->sequences[plan->items[i].id];
        step_sequence* out = &r->sequences[i];
        out->id = s->id;
        out->request_id = s->request_id;
        out->phase = plan->items[i].phase;
        out->n_tokens = plan->items[i].n_tokens;
        out->context_length = s->n_computed;
        out->table_offset = offset;
        out->n_table = s->n_table;
        out->tail_fill = sched->kv.pool && s->n_computed > 0
                             ? (s->n_computed - 1) % sched->kv.block_size + 1
                             : 0;
        out->tail_waste_slots = block_manager_tail_waste(&sched->kv, s);
        const scheduled_sequence* item = &plan->items[i];
        out->spec_drafted = item->n_guesses;
        out->spec_accepted = item->n_accepted;
        out->spec_rejected = item->n_guesses - item->n_accepted;
        out->spec_bonus = item->n_guesses > 0 ? item->bonus : 0;
        out->spec_emitted = item->n_emitted;
        out->spec_rollback_first_position = item->rollback_first_position;
        out->spec_rollback_slots = item->rollback_slots;
        out->spec_rollback_blocks = item->rollback_blocks;
        // A sequence that finished this step has released its table (n_table 0,
        // and block_ids may still be NULL): memcpy must not see NULL even for 0 bytes.
        if (s->n_table > 0) memcpy(r->block_ids + offset, s->block_table, (size_t)s->n_table * sizeof(int32_t));
        offset += s->n_table;
    }
    return 0;
}

void step_sequence_status_fill(step_sequence_status* out, const scheduler* sched, const sequence* s) {
    *out = (step_sequence_status){
        .id = s->id,
        .request_id = s->request_id,
        .sample_index = s->sample_index,
        .state = s->state,
        .stop = s->stop,
        .n_prompt = s->n_prompt,
        .n_tokens = s->n_tokens,
        .max_new_tokens = s->max_new_tokens,
        .n_computed = s->n_computed,
        .fork_parent = s->fork_parent,
        .n_preemptions = s->n_preemptions,
        .tail_waste_slots = block_manager_tail_waste(&sched->kv, s),
        .arrival_time = s->arrival_time,
        .first_token_time = s->first_token_time,
        .finish_time = s->finish_time,
        .spec_total_drafted = s->spec_total_drafted,
        .spec_total_accepted = s->spec_total_accepted,
        .tokens = s->tokens,
        .block_table = s->block_table,
        .n_table = s->n_table,
    };
}

// The queues and every sequence still held, for the request lists.
static int record_sequences(const scheduler* e, step_record* r) {
    if (array_grow(&r->waiting_ids, &r->waiting_capacity, e->n_waiting, sizeof *r->waiting_ids) ||
        array_grow(&r->running_ids, &r->running_capacity, e->n_running, sizeof *r->running_ids) ||
        array_grow(&r->live_sequences, &r->live_capacity, e->n_live, sizeof *r->live_sequences))
        return -1;
    r->n_waiting = e->n_waiting;
    r->n_running = e->n_running;
    if (e->n_waiting > 0) memcpy(r->waiting_ids, e->waiting, (size_t)e->n_waiting * sizeof *e->waiting);
    if (e->n_running > 0) memcpy(r->running_ids, e->running, (size_t)e->n_running * sizeof *e->running);
    r->n_finished = e->n_finished;
    r->n_cancelled = e->n_cancelled;
    r->n_sequence_ids = e->n_sequences;
    r->total_preemptions = e->total_preemptions;
    r->n_live_sequences = e->n_live;
    for (int i = 0; i < e->n_live; i++)
        step_sequence_status_fill(&r->live_sequences[i], e, &e->sequences[e->live_ids[i]]);
    return 0;
}

// Speculative decoding's figures: the step's verifying sequences summed,
// the draft's traffic and pool, the totals.
static void record_speculation(const engine* e, const step_batch* b, step_record* r) {
    const speculative_state* st = &e->spec;
    r->spec_kind = speculative_kind_name(st->config.kind);
    if (st->config.kind == SPEC_NONE) return;
    r->spec_k = st->config.k;
    for (int i = 0; i < b->n_items; i++) {
        const scheduled_sequence* item = &b->items[i];
        if (item->n_guesses == 0) continue;
        r->spec_verify_tokens += item->n_tokens;
        r->spec_drafted += item->n_guesses;
        r->spec_accepted += item->n_accepted;
        r->spec_rejected += item->n_guesses - item->n_accepted;
        r->spec_bonus += item->bonus;
        r->spec_emitted += item->n_emitted;
        r->spec_rollback_slots += item->rollback_slots;
        r->spec_rollback_blocks += item->rollback_blocks;
    }
    r->spec_draft_passes = st->draft_passes;
    r->spec_draft_traffic = st->draft_traffic;
    r->spec_draft_weight_bytes = st->draft_traffic.weight_bytes_read;
    r->spec_target_weight_bytes = r->traffic.weight_bytes_read;
    r->spec_draft_kv_bytes = st->draft_traffic.kv_bytes_read + st->draft_traffic.kv_bytes_written;
    if (st->draft) {
        r->spec_draft_blocks_total = st->draft_pool.n_blocks;
        r->spec_draft_blocks_used = st->draft_pool.n_blocks - st->draft_pool.n_free;
    }
    r->spec_total_drafted = st->total_drafted;
    r->spec_total_accepted = st->total_accepted;
    r->spec_total_emitted = st->total_emitted;
    r->spec_total_target_passes = st->total_target_passes;
}

int step_record_fill(step_record* r, engine* e, const step_batch* b) {
    if (record_ran(&e->scheduler, b, r)) return -1;
    record_speculation(e, b, r);
    const kv_pool* pool = e->scheduler.kv.pool; // paged only
    if (pool) {
        r->events = pool->events;
        r->n_events = pool->n_events;
        r->copy_bytes = pool->copy_bytes;
    }
    return step_record_fill_state(r, e);
}

int step_record_fill_queues(step_record* r, const engine* e) {
    r->layout = e->scheduler.kv.layout;
    r->block_size = e->config.block_size;
    r->tp_shards = e->config.tp_shards;
    r->tp_link = link_model_get(e->config.tp_link)->name;
    r->n_requests = e->n_requests;
    r->total_prefix_hit_tokens = e->total_prefix_hit_tokens;
    const kv_pool* pool = e->scheduler.kv.pool; // paged only: the block counts, O(1)
    if (pool) {
        r->blocks_total = pool->n_blocks;
        r->blocks_free = pool->n_free;
        r->blocks_cached = pool->n_evictable;
        r->blocks_used = pool->n_blocks - pool->n_free - pool->n_evictable;
        r->total_copies = pool->total_copies;
        r->total_evictions = pool->total_evictions;
    }
    return record_sequences(&e->scheduler, r);
}

int step_record_fill_state(step_record* r, engine* e) {
    scheduler* s = &e->scheduler;
    if (step_record_fill_queues(r, e)) return -1;
    measure_pool(s, r);
    const kv_pool* pool = s->kv.pool; // paged only
    if (pool) {
        if (!r->blocks && !(r->blocks = malloc((size_t)pool->n_blocks * sizeof *r->blocks))) return -1;
        record_blocks(pool, r);
    }
    return 0;
}
