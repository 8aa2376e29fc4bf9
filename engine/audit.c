#include "engine/audit.h"

#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/step_record.h"

bool audit_requested_by_environment(bool faults_installed) {
    const char* value = getenv("SERVELAB_AUDIT");
    if (!value) return false;
    return strcmp(value, "all") == 0 || (strcmp(value, "1") == 0 && !faults_installed);
}

void audit_free(engine_audit* a) {
    free(a->holders);
    free(a->evictable_since);
    free(a->slot_marks);
    free(a->last_preemptions);
    free(a->last_request);
    free(a->admitted_order);
    memset(a, 0, sizeof *a);
}

// Room for n blocks of holder counts and n ids of remembered counters.
static int audit_reserve(engine_audit* a, int n_blocks, int n_ids, error_info* err) {
    if (n_blocks > a->n_blocks) {
        int32_t* grown = realloc(a->holders, 2 * (size_t)n_blocks * sizeof *grown); // holders, ran_holders
        if (!grown) return error_set(err, "audit: out of memory for %d blocks", n_blocks);
        a->holders = grown;
        uint64_t* since = realloc(a->evictable_since, (size_t)n_blocks * sizeof *since);
        if (!since) return error_set(err, "audit: out of memory for %d blocks", n_blocks);
        for (int b = a->n_blocks; b < n_blocks; b++) since[b] = 0;
        a->evictable_since = since;
        a->n_blocks = n_blocks;
    }
    if (n_ids > a->n_ids) {
        int32_t* counts = realloc(a->last_preemptions, (size_t)n_ids * sizeof *counts);
        if (counts) a->last_preemptions = counts;
        int32_t* requests = counts ? realloc(a->last_request, (size_t)n_ids * sizeof *requests) : NULL;
        if (!requests) return error_set(err, "audit: out of memory for %d sequences", n_ids);
        a->last_request = requests;
        uint64_t* orders = realloc(a->admitted_order, (size_t)n_ids * sizeof *orders);
        if (!orders) return error_set(err, "audit: out of memory for %d sequences", n_ids);
        a->admitted_order = orders;
        for (int i = a->n_ids; i < n_ids; i++)
            a->last_preemptions[i] = 0, a->last_request[i] = -1, orders[i] = 0;
        a->n_ids = n_ids;
    }
    return 0;
}

// Bytes one token's keys (or values) take in one layer, from the model's
// shapes: elements, plus a 4-byte scale per KV head for int8.
static uint64_t slot_bytes_from_shapes(const model_config* c, kv_dtype dtype) {
    uint64_t element = dtype == KV_F16 ? 2 : dtype == KV_I8 ? 1 : 4;
    uint64_t bytes = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim * element;
    if (dtype == KV_I8) bytes += 4ull * (uint64_t)c->n_kv_heads;
    return bytes;
}

// ---- the pool -------------------------------------------------------------------------------

// ref-count, pool-balance, pool-whole (paged only).
static int audit_pool(engine_audit* a, const engine* e, const step_record* r, error_info* err) {
    const scheduler* sched = &e->scheduler;
    const kv_pool* pool = sched->kv.pool;
    const unsigned long long step = (unsigned long long)r->step;
    memset(a->holders, 0, (size_t)pool->n_blocks * sizeof *a->holders);
    for (int i = 0; i < sched->n_live; i++) {
        const sequence* s = &sched->sequences[sched->live_ids[i]];
        for (int k = 0; k < s->n_table; k++) {
            int32_t block = s->block_table[k];
            if (block < 0 || block >= pool->n_blocks)
                return error_set(err, "audit: sequence %d table entry %d is block %d, outside 0..%d at step %llu",
                                 s->id, k, block, pool->n_blocks - 1, step);
            a->holders[block]++;
        }
    }
    const bool idle = sched->n_running == 0 && sched->n_waiting == 0;
    int n_free = 0, n_used = 0, n_cached_only = 0;
    for (int b = 0; b < pool->n_blocks; b++) {
        const kv_block* block = &pool->blocks[b];
        int tables = a->holders[b], holders = tables + (block->cached ? 1 : 0);
        if (idle && tables > 0)
            return error_set(err, "audit: pool not whole at step %llu: nothing runs, yet block %d is in %d table(s)",
                             step, b, tables);
        if (idle && block->ref_count != (block->cached ? 1 : 0))
            return error_set(err,
                             "audit: pool not whole at step %llu: nothing runs, yet block %d has ref count %d "
                             "(expected %d: %s)",
                             step, b, block->ref_count, block->cached ? 1 : 0,
                             block->cached ? "the prefix cache alone" : "free");
        a->n_checks++;
        if (block->ref_count != holders)
            return error_set(err, "audit: block %d ref count %d, but %d holders (%d tables%s) at step %llu", b,
                             block->ref_count, holders, tables, block->cached ? " + cache" : "", step);
        a->n_checks++;
        if (tables > 0)
            n_used++;
        else if (block->cached)
            n_cached_only++;
        else
            n_free++;
    }
    if (n_free + n_used + n_cached_only != pool->n_blocks)
        return error_set(err, "audit: free %d + used %d + cached %d = %d blocks, but the pool has %d at step %llu",
                         n_free, n_used, n_cached_only, n_free + n_used + n_cached_only, pool->n_blocks, step);
    if (r->blocks_free != n_free || r->blocks_used != n_used || r->blocks_cached != n_cached_only ||
        r->blocks_total != pool->n_blocks)
        return error_set(err,
                         "audit: record says free %d + used %d + cached %d of %d blocks, the tables and cache give "
                         "free %d + used %d + cached %d of %d at step %llu",
                         r->blocks_free, r->blocks_used, r->blocks_cached, r->blocks_total, n_free, n_used,
                         n_cached_only, pool->n_blocks, step);
    a->n_checks += 2;
    return 0;
}

// write-shared: no block a sequence wrote this step is in the table of
// another sequence that ran this step (the forks spawned after the forward
// pass share the written tail, and copy it before their own first write).
// copy-bytes: each copy-on-write copied the slots before the copier's write
// position, position mod block_size of them.
static int audit_writes(engine_audit* a, const engine* e, const step_record* r, error_info* err) {
    const scheduler* sched = &e->scheduler;
    const kv_pool* pool = sched->kv.pool;
    const int bs = pool->block_size;
    const unsigned long long step = (unsigned long long)r->step;
    int32_t* ran_holders = a->holders + pool->n_blocks; // (n_blocks) tables of the sequences that ran
    memset(ran_holders, 0, (size_t)pool->n_blocks * sizeof *ran_holders);
    for (int i = 0; i < r->n_sequences; i++) {
        const sequence* s = &sched->sequences[r->sequences[i].id];
        for (int k = 0; k < s->n_table; k++)
            ran_holders[s->block_table[k]]++;
    }
    for (int i = 0; i < r->n_sequences; i++) {
        const step_sequence* q = &r->sequences[i];
        const sequence* s = &sched->sequences[q->id];
        const int first = step_sequence_first_row(q);
        for (int position = first; position < first + q->n_tokens; position++) {
            if (position / bs >= s->n_table) break; // finished this step: its table went back
            int32_t block = s->block_table[position / bs];
            if (ran_holders[block] != 1)
                return error_set(err,
                                 "audit: sequence %d wrote position %d into block %d, which %d tables of this "
                                 "step's sequences hold at step %llu",
                                 q->id, position, block, ran_holders[block], step);
        }
        a->n_checks++;
    }
    const uint64_t per_slot =
        2ull * (uint64_t)e->model->config.n_layers * slot_bytes_from_shapes(&e->model->config, e->config.kv_dtype);
    uint64_t expected = 0;
    for (int k = 0; k < r->n_events; k++) {
        if (r->events[k].kind != BLOCK_COPY) continue;
        for (int i = 0; i < r->n_sequences; i++)
            if (r->sequences[i].id == r->events[k].sequence)
                expected += (uint64_t)(step_sequence_first_row(&r->sequences[i]) % bs) * per_slot;
    }
    if (r->copy_bytes != expected)
        return error_set(
            err, "audit: copy-on-write copied %llu bytes, but the copiers' write positions give %llu at step %llu",
            (unsigned long long)r->copy_bytes, (unsigned long long)expected, step);
    a->n_checks++;
    return 0;
}

// lru-eviction: each block evicted this step was the least recently used of
// those only the cache held. Compared with the blocks that were evictable at
// the last audit and still are, untouched (their pool clock is what it was):
// one of them older than the victim should have gone first. A victim that
// became evictable during this step is younger than all of those.
static int audit_eviction(const engine_audit* a, const engine* e, const step_record* r, error_info* err) {
    const kv_pool* pool = e->scheduler.kv.pool;
    for (int k = 0; k < r->n_events; k++) {
        if (r->events[k].kind != BLOCK_EVICT) continue;
        const int32_t victim = r->events[k].block;
        const uint64_t victim_used = a->evictable_since[victim] ? a->evictable_since[victim] : UINT64_MAX;
        for (int b = 0; b < pool->n_blocks; b++) {
            const kv_block* block = &pool->blocks[b];
            bool untouched = a->evictable_since[b] != 0 && block->cached && block->ref_count == 1 &&
                             block->last_used == a->evictable_since[b];
            if (b != victim && untouched && block->last_used < victim_used)
                return error_set(err,
                                 "audit: eviction took block %d (last used at clock %llu%s), but block %d, used "
                                 "at clock %llu, was older and stayed evictable at step %llu",
                                 victim, (unsigned long long)(victim_used == UINT64_MAX ? 0 : victim_used),
                                 victim_used == UINT64_MAX ? ": evictable only since this step" : "", b,
                                 (unsigned long long)block->last_used, (unsigned long long)r->step);
        }
    }
    return 0;
}

// slots-used: each running sequence's computed positions 0 .. n_computed - 1
// mapped through its table to cache slots (a contiguous table lists slots:
// block size 1), each slot counted once however many tables share it.
static int audit_slots_used(engine_audit* a, const engine* e, const step_record* r, error_info* err) {
    const scheduler* sched = &e->scheduler;
    const int bs = sched->kv.pool ? sched->kv.pool->block_size : 1;
    const int64_t n_slots = block_manager_slots(&sched->kv);
    if (n_slots > a->n_slot_marks) {
        uint32_t* marks = realloc(a->slot_marks, (size_t)n_slots * sizeof *marks);
        if (!marks) return error_set(err, "audit: out of memory for %lld slots", (long long)n_slots);
        memset(marks + a->n_slot_marks, 0, (size_t)(n_slots - a->n_slot_marks) * sizeof *marks);
        a->slot_marks = marks;
        a->n_slot_marks = n_slots;
    }
    if (++a->slot_epoch == 0) { // wrapped: no mark may look current
        memset(a->slot_marks, 0, (size_t)a->n_slot_marks * sizeof *a->slot_marks);
        a->slot_epoch = 1;
    }
    int64_t used = 0;
    for (int i = 0; i < sched->n_running; i++) {
        const sequence* s = &sched->sequences[sched->running[i]];
        for (int position = 0; position < s->n_computed; position++) {
            if (position / bs >= s->n_table)
                return error_set(err,
                                 "audit: sequence %d has computed %d tokens but its table covers %d at step %llu",
                                 s->id, s->n_computed, s->n_table * bs, (unsigned long long)r->step);
            int64_t slot = (int64_t)s->block_table[position / bs] * bs + position % bs;
            if (slot < 0 || slot >= n_slots)
                return error_set(err, "audit: sequence %d position %d maps to slot %lld, outside 0..%lld at step %llu",
                                 s->id, position, (long long)slot, (long long)(n_slots - 1),
                                 (unsigned long long)r->step);
            if (a->slot_marks[slot] == a->slot_epoch) continue;
            a->slot_marks[slot] = a->slot_epoch;
            used++;
        }
    }
    if (r->slots_used != used)
        return error_set(err,
                         "audit: record says %lld slots used, but the running sequences' computed positions fill "
                         "%lld at step %llu",
                         (long long)r->slots_used, (long long)used, (unsigned long long)r->step);
    a->n_checks++;
    return 0;
}

// ---- traffic --------------------------------------------------------------------------------

// Bytes of a (rows, cols) matrix stored as `dtype`, from its shape; 0 for
// the packed formats, whose group scales this audit does not model.
static uint64_t dense_matrix_bytes(weight_dtype dtype, int rows, int cols) {
    uint64_t element = dtype == WEIGHT_F32 ? 4 : dtype == WEIGHT_F16 ? 2 : 0;
    return element * (uint64_t)rows * (uint64_t)cols;
}

// weight-bytes (fp32 and fp16 models on the CPU backend): every matrix once
// per step (the embedding one row per token), the RMSNorm gains of each norm
// applied (2 per layer, one more when any row wants logits) and the biases.
// 0 when it does not apply (a packed format; CUDA).
static uint64_t expected_weight_bytes(const engine* e, uint64_t rows, int logit_rows, bool* applies) {
    const model* m = e->model;
    const model_config* c = &m->config;
    const int q_dim = c->n_heads * c->head_dim;
    *applies = e->cuda == NULL;
    if (rows == 0) return 0;
    uint64_t embedding_row = dense_matrix_bytes(m->token_embedding.dtype, 1, c->dim);
    uint64_t bytes = rows * embedding_row;
    *applies = *applies && embedding_row > 0;
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights* w = &m->layers[l];
        const weight_matrix* matrices[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w1, &w->w2, &w->w3};
        const int shapes[][2] = {{q_dim, c->dim},        {c->kv_dim, c->dim},     {c->kv_dim, c->dim},
                                 {c->dim, q_dim},        {c->hidden_dim, c->dim}, {c->dim, c->hidden_dim},
                                 {c->hidden_dim, c->dim}};
        for (int k = 0; k < 7; k++) {
            uint64_t matrix = dense_matrix_bytes(matrices[k]->dtype, shapes[k][0], shapes[k][1]);
            *applies = *applies && matrix > 0;
            bytes += matrix;
        }
        if (w->bq) bytes += 4ull * (uint64_t)(q_dim + 2 * c->kv_dim);
    }
    bytes += (2ull * (uint64_t)c->n_layers + (logit_rows > 0 ? 1 : 0)) * (uint64_t)c->dim * 4ull;
    if (logit_rows > 0) {
        uint64_t classifier = dense_matrix_bytes(m->classifier.dtype, c->vocab_size, c->dim);
        *applies = *applies && classifier > 0;
        bytes += classifier;
    }
    return bytes;
}

// kv-written, kv-read, attention-flops, weight-bytes, allreduce-bytes. The kernels count KV per row: a row
// at position p attends to p + 1 slots and writes one, in every layer.
static int audit_traffic(engine_audit* a, const engine* e, const step_record* r, error_info* err) {
    const model_config* c = &e->model->config;
    const unsigned long long step = (unsigned long long)r->step;
    const uint64_t per_slot = 2ull * (uint64_t)c->n_layers * slot_bytes_from_shapes(c, e->config.kv_dtype);
    uint64_t written = 0, read = 0, rows = 0;
    for (int i = 0; i < r->n_sequences; i++) {
        const step_sequence* q = &r->sequences[i];
        uint64_t n = (uint64_t)q->n_tokens, before = (uint64_t)step_sequence_first_row(q);
        if (step_sequence_first_row(q) < 0)
            return error_set(err, "audit: sequence %d ran %d tokens but holds a context of %d at step %llu", q->id,
                             q->n_tokens, q->context_length, step);
        rows += n;
        written += n * per_slot;
        read += (n * before + n * (n + 1) / 2) * per_slot; // contexts before + 1 .. before + n
    }
    if (r->traffic.kv_bytes_written != written)
        return error_set(
            err,
            "audit: kv bytes written %llu, but %llu tokens x %llu bytes (2 x %d layers x slot) = %llu at step %llu",
            (unsigned long long)r->traffic.kv_bytes_written, (unsigned long long)rows, (unsigned long long)per_slot,
            c->n_layers, (unsigned long long)written, step);
    if (r->traffic.kv_bytes_read != read)
        return error_set(err, "audit: kv bytes read %llu, but the contexts of the step's rows give %llu at step %llu",
                         (unsigned long long)r->traffic.kv_bytes_read, (unsigned long long)read, step);
    // attention-flops: q.k and p.v, 2 FLOPs per multiply-add, over each row's
    // context (not the slots allocated), in every head and layer.
    uint64_t attention =
        4ull * (uint64_t)c->n_heads * (uint64_t)c->head_dim * (uint64_t)c->n_layers * (read / per_slot);
    if (r->traffic.attention_flops != attention)
        return error_set(
            err,
            "audit: attention flops %llu, but 4 x %d heads x %d x %d layers x the rows' contexts = %llu at step %llu",
            (unsigned long long)r->traffic.attention_flops, c->n_heads, c->head_dim, c->n_layers,
            (unsigned long long)attention, step);
    a->n_checks += 3;
    bool applies;
    uint64_t weights = expected_weight_bytes(e, rows, e->batch.n_logit_rows, &applies);
    if (applies && r->traffic.weight_bytes_read != weights)
        return error_set(err,
                         "audit: weight bytes read %llu, but the tensors' sizes for %llu rows (%d wanting logits) "
                         "give %llu at step %llu",
                         (unsigned long long)r->traffic.weight_bytes_read, (unsigned long long)rows,
                         e->batch.n_logit_rows, (unsigned long long)weights, step);
    a->n_checks += applies;
    const uint64_t n_shards = (uint64_t)r->tp_shards;
    if (n_shards > 1) {
        // Two all-reduces of (rows, dim) fp32 per layer; a ring sends 2 (N - 1) / N of each.
        uint64_t message = rows * (uint64_t)c->dim * 4ull;
        uint64_t expected = 2ull * (uint64_t)c->n_layers * (2ull * (n_shards - 1) * message / n_shards);
        if (rows == 0) expected = 0;
        const int expected_count = rows > 0 ? 2 * c->n_layers : 0;
        if (r->n_allreduces != expected_count)
            return error_set(err, "audit: %d all-reduces, but 2 x %d layers = %d for %llu rows at step %llu",
                             r->n_allreduces, c->n_layers, expected_count, (unsigned long long)rows, step);
        if (r->allreduce_bytes != expected)
            return error_set(
                err, "audit: all-reduce bytes %llu, but 2 x %d layers x 2(%d-1)/%d x %llu bytes = %llu at step %llu",
                (unsigned long long)r->allreduce_bytes, c->n_layers, (int)n_shards, (int)n_shards,
                (unsigned long long)message, (unsigned long long)expected, step);
        a->n_checks++;
    }
    return 0;
}

// ---- sequences ------------------------------------------------------------------------------

// table-length and tail-waste for every live sequence, and the record's total.
static int audit_tails(engine_audit* a, const engine* e, const step_record* r, error_info* err) {
    const scheduler* sched = &e->scheduler;
    const bool paged = sched->kv.pool != NULL;
    const int bs = e->config.block_size;
    const unsigned long long step = (unsigned long long)r->step;
    int64_t running_waste = 0;
    for (int i = 0; i < r->n_live_sequences; i++) {
        const step_sequence_status* q = &r->live_sequences[i];
        const bool holds_kv = q->state == SEQ_PREFILL || q->state == SEQ_DECODE;
        int32_t expected = 0;
        if (paged && holds_kv) {
            // A decoding sequence's newest token was just sampled: its keys
            // are written by the next step, so it fills no slot yet (the
            // tail-waste definition in lessons/README.md). A prefilling one
            // holds blocks for its whole prompt, chunks still to come included.
            int holding = q->state == SEQ_DECODE ? q->n_tokens - 1 : q->n_tokens;
            int whole = (q->n_tokens + bs - 1) / bs, before_sampled = (holding + bs - 1) / bs;
            if (q->n_table != whole && q->n_table != before_sampled)
                return error_set(
                    err, "audit: sequence %d holds %d blocks, but %d tokens need %d (block size %d) at step %llu",
                    q->id, q->n_table, q->n_tokens, whole, bs, step);
            expected = q->n_table * bs - holding;
        } else if (!paged && holds_kv) {
            // reservation-length: what the policy reserves, from the request's
            // own length (prompt + max_tokens) or the model's maximum.
            const block_manager* bm = &sched->kv;
            const int capacity = sched->sequences[q->id].capacity;
            const bool whole = bm->reserve == RESERVE_MAX;
            const int reserved = whole ? bm->max_seq_len : capacity < bm->max_seq_len ? capacity : bm->max_seq_len;
            if (q->n_table != reserved)
                return error_set(err,
                                 "audit: sequence %d reserves %d slots, but %s gives %d at step %llu", q->id,
                                 q->n_table, whole ? "the model's maximum length" : "its prompt + max_tokens",
                                 reserved, step);
        } else if (paged && q->n_table != 0) {
            return error_set(err, "audit: sequence %d is %s but holds %d blocks at step %llu", q->id,
                             sequence_state_name(q->state), q->n_table, step);
        }
        if (q->tail_waste_slots != expected)
            return error_set(
                err, "audit: sequence %d tail waste %d slots, but %d tokens (%s) in %d blocks of %d leave %d at step %llu",
                q->id, q->tail_waste_slots, q->n_tokens,
                q->state == SEQ_DECODE ? "the newest not yet written" : "all due a slot", q->n_table, bs, expected,
                step);
        if (holds_kv) running_waste += expected;
        a->n_checks += 2;
    }
    if (r->tail_waste_slots != running_waste)
        return error_set(err, "audit: record tail waste %lld slots, but the running sequences leave %lld at step %llu",
                         (long long)r->tail_waste_slots, (long long)running_waste, step);
    for (int i = 0; i < r->n_sequences; i++) { // the step's own copy of each ran sequence
        const step_sequence* q = &r->sequences[i];
        step_sequence_status now;
        if (!engine_sequence_status(e, q->id, &now)) continue;
        if (q->tail_waste_slots != now.tail_waste_slots && (now.state == SEQ_PREFILL || now.state == SEQ_DECODE))
            return error_set(err,
                             "audit: sequence %d tail waste %d slots in the step, %d in the live list at step %llu",
                             q->id, q->tail_waste_slots, now.tail_waste_slots, step);
    }
    a->n_checks++;
    return 0;
}

// prefix-chain: every cached block a table lists holds that sequence's
// token ids at that position, and its parent is the block before it.
static int audit_prefix_chain(engine_audit* a, const engine* e, const step_record* r, error_info* err) {
    const scheduler* sched = &e->scheduler;
    const kv_pool* pool = sched->kv.pool;
    const int bs = pool->block_size;
    for (int i = 0; i < sched->n_running; i++) {
        const sequence* s = &sched->sequences[sched->running[i]];
        for (int k = 0; k < s->n_table; k++) {
            const kv_block* block = &pool->blocks[s->block_table[k]];
            if (!block->cached || (k + 1) * bs > s->n_tokens) continue;
            const int32_t* held = pool->block_tokens + (size_t)s->block_table[k] * (size_t)bs;
            for (int t = 0; t < bs; t++)
                if (held[t] != s->tokens[k * bs + t])
                    return error_set(err,
                                     "audit: prefix block %d at table entry %d of sequence %d holds token %d at "
                                     "position %d, but the sequence has %d at step %llu",
                                     s->block_table[k], k, s->id, held[t], k * bs + t, s->tokens[k * bs + t],
                                     (unsigned long long)r->step);
            // Its parent: none for the first block; the hash of the block
            // before it when that one is cached (an uncached duplicate has none).
            const kv_block* parent = k > 0 ? &pool->blocks[s->block_table[k - 1]] : NULL;
            if (k == 0 && block->parent_hash != 0)
                return error_set(err,
                                 "audit: prefix block %d is the first block of sequence %d, but was cached under "
                                 "parent %016llx (a first block has none) at step %llu",
                                 s->block_table[k], s->id, (unsigned long long)block->parent_hash,
                                 (unsigned long long)r->step);
            if (k > 0 && parent->cached && parent->hash != block->parent_hash)
                return error_set(err,
                                 "audit: prefix block %d at table entry %d of sequence %d was cached under parent "
                                 "%016llx, but the block before it (%d) is %016llx at step %llu",
                                 s->block_table[k], k, s->id, (unsigned long long)block->parent_hash,
                                 s->block_table[k - 1], (unsigned long long)parent->hash, (unsigned long long)r->step);
            a->n_checks++;
        }
    }
    return 0;
}

// preemption: the victims were admitted after every sequence that survived
// the step, by the audit's own count of admissions (the order in which it
// first saw each sequence running, not the scheduler's admit_order, which
// is what picks the victim), and the three counters moved together.
static int audit_preemption(engine_audit* a, const engine* e, const step_record* r, error_info* err) {
    const scheduler* sched = &e->scheduler;
    const unsigned long long step = (unsigned long long)r->step;
    uint64_t moved_total = sched->total_preemptions - a->last_total_preemptions;
    int64_t moved_sequences = 0;
    uint64_t youngest_survivor = 0, oldest_victim = UINT64_MAX;
    int32_t survivor_id = -1, victim_id = -1;
    for (int i = 0; i < sched->n_live; i++) {
        const sequence* s = &sched->sequences[sched->live_ids[i]];
        bool known = a->last_request[s->id] == s->request_id;
        int32_t moved = s->n_preemptions - (known ? a->last_preemptions[s->id] : 0);
        moved_sequences += moved;
        uint64_t order = known ? a->admitted_order[s->id] : 0; // 0: not running at the last audit
        if (order == 0) continue;
        if (moved > 0 && order < oldest_victim) oldest_victim = order, victim_id = s->id;
        bool running = s->state == SEQ_PREFILL || s->state == SEQ_DECODE;
        if (moved == 0 && running && order > youngest_survivor) youngest_survivor = order, survivor_id = s->id;
    }
    if ((uint64_t)r->n_preempted != moved_total || moved_sequences != (int64_t)moved_total)
        return error_set(err,
                         "audit: preemptions this step: record %d, scheduler total moved %llu, sequences' counts "
                         "moved %lld at step %llu",
                         r->n_preempted, (unsigned long long)moved_total, (long long)moved_sequences, step);
    if (victim_id >= 0 && survivor_id >= 0 && youngest_survivor > oldest_victim)
        return error_set(err,
                         "audit: sequence %d was preempted (admission %llu) while sequence %d, admitted later "
                         "(admission %llu), kept running at step %llu",
                         victim_id, (unsigned long long)oldest_victim, survivor_id,
                         (unsigned long long)youngest_survivor, step);
    a->n_checks += 2;
    return 0;
}

// length-stop: a sequence stops the step its generated tokens reach
// max_tokens, so every one still live has generated fewer.
static int audit_length_stop(engine_audit* a, const engine* e, const step_record* r, error_info* err) {
    const scheduler* sched = &e->scheduler;
    for (int i = 0; i < sched->n_live; i++) {
        const sequence* s = &sched->sequences[sched->live_ids[i]];
        if (s->state == SEQ_FINISHED || !s->tokens) continue;
        int generated = s->n_tokens - s->n_prompt;
        if (generated >= s->max_new_tokens)
            return error_set(err,
                             "audit: sequence %d has generated %d tokens of its max_tokens %d and is still %s at "
                             "step %llu",
                             s->id, generated, s->max_new_tokens, sequence_state_name(s->state),
                             (unsigned long long)r->step);
    }
    // One that finished this step with max_tokens generated stopped for its
    // length, not for the context (prompt + max_tokens fills its capacity
    // exactly then, so a missed length test still stops it, for the wrong reason).
    for (int i = 0; i < r->n_finished_now; i++) {
        const sequence* s = &sched->sequences[r->finished_ids[i]];
        if (!s->tokens || s->stop != STOP_CONTEXT) continue;
        int generated = s->n_tokens - s->n_prompt;
        if (generated >= s->max_new_tokens)
            return error_set(err,
                             "audit: sequence %d stopped for the context after generating %d tokens, its max_tokens "
                             "%d (a length stop) at step %llu",
                             s->id, generated, s->max_new_tokens, (unsigned long long)r->step);
    }
    a->n_checks++;
    return 0;
}

// preempted-first: a preempted sequence waits at the front of the queue, so
// it is admitted again before any request that has not yet run.
static int audit_waiting_order(engine_audit* a, const engine* e, const step_record* r, error_info* err) {
    const scheduler* sched = &e->scheduler;
    int32_t first_new = -1;
    for (int i = 0; i < sched->n_waiting; i++) {
        const sequence* s = &sched->sequences[sched->waiting[i]];
        if (s->state == SEQ_WAITING && first_new < 0) first_new = s->id;
        if (s->state == SEQ_PREEMPTED && first_new >= 0)
            return error_set(err,
                             "audit: preempted sequence %d waits at place %d of %d, behind sequence %d, which "
                             "has not run yet, at step %llu",
                             s->id, i + 1, sched->n_waiting, first_new, (unsigned long long)r->step);
    }
    a->n_checks++;
    return 0;
}

// Remembers what the next step's preemption check starts from: each live
// sequence's count, and the admission order of those running (a sequence
// newly running, or preempted and admitted again, is the latest admitted).
static void remember(engine_audit* a, const engine* e) {
    const scheduler* sched = &e->scheduler;
    a->last_total_preemptions = sched->total_preemptions;
    const kv_pool* pool = sched->kv.pool;
    for (int b = 0; pool && b < pool->n_blocks; b++) { // the blocks only the cache holds, and when they were used
        const kv_block* block = &pool->blocks[b];
        a->evictable_since[b] = block->cached && block->ref_count == 1 ? block->last_used : 0;
    }
    for (int id = 0; id < a->n_ids; id++) {
        const sequence* s = &sched->sequences[id];
        bool running = id < sched->n_sequences && (s->state == SEQ_PREFILL || s->state == SEQ_DECODE) && s->tokens;
        bool same = running && a->last_request[id] == s->request_id && a->last_preemptions[id] == s->n_preemptions;
        if (!same) a->admitted_order[id] = 0;
    }
    for (int i = 0; i < sched->n_running; i++) { // in admission order
        int32_t id = sched->running[i];
        if (a->admitted_order[id] == 0) a->admitted_order[id] = ++a->admissions;
    }
    for (int i = 0; i < a->n_ids; i++)
        a->last_request[i] = -1; // released ids are forgotten (ids are reused)
    for (int i = 0; i < sched->n_live; i++) {
        const sequence* s = &sched->sequences[sched->live_ids[i]];
        a->last_preemptions[s->id] = s->n_preemptions;
        a->last_request[s->id] = s->request_id;
    }
}

int audit_step(engine_audit* a, const engine* e, const step_record* r, error_info* err) {
    const kv_pool* pool = e->scheduler.kv.pool;
    if (audit_reserve(a, pool ? pool->n_blocks : 0, e->scheduler.n_sequences, err)) return -1;
    if (pool && (audit_pool(a, e, r, err) || audit_writes(a, e, r, err) || audit_prefix_chain(a, e, r, err) ||
                 audit_eviction(a, e, r, err)))
        return -1;
    if (audit_traffic(a, e, r, err) || audit_tails(a, e, r, err) || audit_slots_used(a, e, r, err) ||
        audit_length_stop(a, e, r, err) || audit_waiting_order(a, e, r, err) ||
        audit_preemption(a, e, r, err))
        return -1;
    remember(a, e);
    return 0;
}
