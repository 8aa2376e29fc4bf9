#include "engine/scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "engine/fault.h"

int scheduler_init(scheduler* s, const scheduler_config* config, const block_manager* kv, error_info* err) {
    (void)err;
    memset(s, 0, sizeof *s);
    s->config = *config;
    s->kv = *kv;
    return 0;
}

void scheduler_free(scheduler* s) {
    block_manager_free(&s->kv);
    for (int i = 0; i < s->n_sequences; i++) sequence_free(&s->sequences[i]);
    free(s->sequences);
    free(s->waiting);
    free(s->running);
    free(s->live_ids);
    free(s->reusable_ids);
    memset(s, 0, sizeof *s);
}

bool scheduler_has_work(const scheduler* s) { return s->n_waiting > 0 || s->n_running > 0; }

// ---- the queues ---------------------------------------------------------------------------

// Removes `id` from a queue of ids, keeping the order; no-op when absent.
static void remove_id(int32_t* queue, int* n, int32_t id) {
    for (int i = 0; i < *n; i++) {
        if (queue[i] != id) continue;
        memmove(queue + i, queue + i + 1, (size_t)(*n - i - 1) * sizeof *queue);
        (*n)--;
        return;
    }
}

static void push_waiting_front(scheduler* s, int32_t id) {
    memmove(s->waiting + 1, s->waiting, (size_t)s->n_waiting * sizeof *s->waiting);
    s->waiting[0] = id;
    s->n_waiting++;
}

static void pop_waiting_front(scheduler* s) {
    memmove(s->waiting, s->waiting + 1, (size_t)(s->n_waiting - 1) * sizeof *s->waiting);
    s->n_waiting--;
}

// ---- sequences ----------------------------------------------------------------------------

sequence* scheduler_new_sequence(scheduler* s, error_info* err) {
    if (s->n_reusable > 0) {
        s->next_id = s->reusable_ids[s->n_reusable - 1];
        return &s->sequences[s->next_id];
    }
    if (s->n_sequences == s->sequences_capacity) {
        int capacity = s->sequences_capacity ? 2 * s->sequences_capacity : 64;
        sequence* grown = realloc(s->sequences, (size_t)capacity * sizeof *grown);
        if (grown) s->sequences = grown;
        int32_t* waiting = realloc(s->waiting, (size_t)capacity * sizeof *waiting);
        if (waiting) s->waiting = waiting;
        int32_t* running = realloc(s->running, (size_t)capacity * sizeof *running);
        if (running) s->running = running;
        int32_t* live = realloc(s->live_ids, (size_t)capacity * sizeof *live);
        if (live) s->live_ids = live;
        int32_t* reusable = realloc(s->reusable_ids, (size_t)capacity * sizeof *reusable);
        if (reusable) s->reusable_ids = reusable;
        if (!grown || !waiting || !running || !live || !reusable) {
            error_set(err, "scheduler: out of memory for %d sequences", capacity);
            return NULL;
        }
        s->sequences_capacity = capacity;
    }
    s->next_id = s->n_sequences;
    return &s->sequences[s->n_sequences];
}

void scheduler_commit(scheduler* s) {
    int32_t id = s->next_id;
    int at = s->n_live; // live_ids stays ascending: a reused id goes in its place
    while (at > 0 && s->live_ids[at - 1] > id)
        at--;
    memmove(s->live_ids + at + 1, s->live_ids + at, (size_t)(s->n_live - at) * sizeof *s->live_ids);
    s->live_ids[at] = id;
    s->n_live++;
    if (id == s->n_sequences)
        s->n_sequences++;
    else
        s->n_reusable--; // it was the last reusable id (scheduler_new_sequence took it from there)
}

void scheduler_add_waiting(scheduler* s) {
    sequence* q = &s->sequences[s->next_id];
    q->state = SEQ_WAITING;
    s->waiting[s->n_waiting++] = q->id;
    scheduler_commit(s);
}

sequence* scheduler_clone(scheduler* s, int32_t parent_id, int32_t sample_index, uint64_t seed, error_info* err) {
    sequence* child = scheduler_new_sequence(s, err);
    if (!child) return NULL;
    const sequence* parent = &s->sequences[parent_id]; // new_sequence may have moved the array
    if (sequence_init(child, s->next_id, parent->request_id, parent->tokens, parent->n_tokens,
                      parent->max_new_tokens, s->config.max_seq_len, err))
        return NULL;
    if (sequence_reserve_table(child, parent->n_table)) {
        sequence_free(child);
        error_set(err, "scheduler: out of memory for a block table");
        return NULL;
    }
    child->n_prompt = parent->n_prompt;
    child->sample_index = sample_index;
    child->seed = seed;
    child->fork_parent = parent->id;
    child->ignore_eos = parent->ignore_eos;
    child->arrival_time = parent->arrival_time;
    scheduler_commit(s);
    return child;
}

// The child shares every block the parent holds and runs from the next step.
static void share_running(scheduler* s, int32_t parent_id, sequence* child) {
    const sequence* parent = &s->sequences[parent_id];
    child->n_computed = parent->n_computed;
    child->state = parent->state;
    child->admit_order = ++s->admit_counter;
    block_manager_fork(&s->kv, parent, child);
    s->running[s->n_running++] = child->id;
}

void scheduler_place_fork(scheduler* s, int32_t parent_id, int32_t child_id) {
    const sequence* parent = &s->sequences[parent_id];
    sequence* child = &s->sequences[child_id];
    bool holds_kv = parent->state == SEQ_PREFILL || parent->state == SEQ_DECODE;
    if (holds_kv && s->kv.ops->shares_blocks) share_running(s, parent_id, child);
    else { // nothing to share (contiguous memory is private, or the parent holds none): compute it again
        child->state = SEQ_WAITING;
        s->waiting[s->n_waiting++] = child->id;
    }
}

void scheduler_cancel(scheduler* s, int32_t id, double clock_seconds) {
    sequence* q = &s->sequences[id];
    if (q->state == SEQ_FINISHED) return;
    remove_id(s->waiting, &s->n_waiting, id);
    block_manager_release(&s->kv, q); // a waiting or preempted sequence holds nothing: no-op
    remove_id(s->running, &s->n_running, id);
    q->pending_forks = 0;
    q->state = SEQ_FINISHED;
    q->stop = STOP_CANCELLED;
    q->finish_time = clock_seconds;
    s->n_finished++;
    s->n_cancelled++;
}

void scheduler_release(scheduler* s, int32_t id) {
    sequence* q = &s->sequences[id];
    // Finished sequences hold no blocks (finish() and cancel release them);
    // the table array itself is what is left to free.
    free(q->tokens);
    free(q->block_table);
    free(q->draft_block_table); // its blocks went back when it finished (speculative_after_step)
    free(q->spec_draft_probabilities);
    sampler_free(&q->sampler);
    q->tokens = NULL;
    q->block_table = NULL;
    q->draft_block_table = NULL;
    q->spec_draft_probabilities = NULL;
    q->n_draft_table = q->draft_table_capacity = 0;
    // Zero counts, so that a reader walking the sequences directly sees an
    // empty sequence rather than a count over a NULL array.
    q->n_tokens = q->n_prompt = q->n_computed = q->capacity = 0;
    q->n_table = q->table_capacity = 0;
    s->n_released++;
    remove_id(s->live_ids, &s->n_live, id);
    s->reusable_ids[s->n_reusable++] = id;
}

// ---- schedule -----------------------------------------------------------------------------

// Preemption by recompute: the victim's blocks go back to the pool, its
// tokens (prompt and generated) stay, and it waits at the front of the
// queue to compute them all again.
static void preempt(scheduler* s, sequence* victim) {
    block_manager_release(&s->kv, victim);
    victim->n_computed = 0;
    // The recompute-duplicates-token fault: the last sampled token goes in
    // twice, so the recomputed context holds a token the model never chose.
    if (fault_on(FAULT_RECOMPUTE_EXTRA_TOKEN) && victim->n_tokens > victim->n_prompt &&
        victim->n_tokens < victim->capacity) {
        victim->tokens[victim->n_tokens] = victim->tokens[victim->n_tokens - 1];
        victim->n_tokens++;
    }
    victim->state = SEQ_PREEMPTED;
    victim->n_preemptions++;
    remove_id(s->running, &s->n_running, victim->id);
    push_waiting_front(s, victim->id);
    s->total_preemptions++;
}

// The running sequence admitted last (the preemption victim); under the
// preempt-oldest fault, the one admitted first.
static sequence* latest_admitted(scheduler* s) {
    sequence* latest = NULL;
    const bool oldest = fault_on(FAULT_PREEMPT_OLDEST);
    for (int i = 0; i < s->n_running; i++) {
        sequence* q = &s->sequences[s->running[i]];
        if (!latest || (oldest ? q->admit_order < latest->admit_order : q->admit_order > latest->admit_order)) latest = q;
    }
    return latest;
}

static bool already_scheduled(const step_batch* b, int32_t id) {
    for (int i = 0; i < b->n_items; i++)
        if (b->items[i].id == id) return true;
    return false;
}

static int chunk_for(const scheduler* s, const sequence* q, int budget) {
    int pending = sequence_pending_tokens(q);
    if (!s->config.chunked_prefill) return pending <= budget || budget == s->config.max_batched_tokens ? pending : 0;
    // The chunk-ignores-budget fault sizes the chunk by the whole budget,
    // so the step carries the decodes on top of it. The step's rows so far
    // are max_batched_tokens - budget and the batch holds max_batched_tokens
    // + max_seqs rows: a chunk of at most budget + max_seqs still fits.
    if (fault_on(FAULT_CHUNK_IGNORES_BUDGET) && budget > 0) {
        int whole = budget + s->config.max_seqs < s->config.max_batched_tokens ? budget + s->config.max_seqs
                                                                               : s->config.max_batched_tokens;
        return pending < whole ? pending : whole;
    }
    return pending < budget ? pending : budget;
}

// 1. Running sequences, oldest first: a decode token each (preempting the
// latest admitted when the pool is out of blocks), or their next prefill chunk.
static void schedule_running(scheduler* s, step_batch* b, int* budget) {
    for (int i = 0; i < s->n_running && *budget > 0; i++) {
        sequence* q = &s->sequences[s->running[i]];
        if (q->state == SEQ_DECODE) {
            bool preempted_self = false;
            while (block_manager_prepare_decode(&s->kv, q) != 0) {
                sequence* victim = latest_admitted(s);
                bool is_self = victim == q;
                // A victim already in this step's batch is removed from it.
                for (int k = 0; k < b->n_items; k++)
                    if (b->items[k].id == victim->id) {
                        *budget += b->items[k].n_tokens;
                        memmove(b->items + k, b->items + k + 1, (size_t)(b->n_items - k - 1) * sizeof *b->items);
                        b->n_items--;
                        break;
                    }
                preempt(s, victim);
                b->n_preempted++;
                if (is_self) {
                    preempted_self = true;
                    break;
                }
                // The running list shifted; re-find q's index.
                for (int k = 0; k < s->n_running; k++)
                    if (s->running[k] == q->id) i = k;
            }
            if (preempted_self) {
                i--; // the list shifted under us
                continue;
            }
            b->items[b->n_items++] =
                (scheduled_sequence){.id = q->id, .n_tokens = 1, .phase = PHASE_DECODE, .rollback_first_position = -1};
            *budget -= 1;
        } else if (q->state == SEQ_PREFILL && !already_scheduled(b, q->id)) {
            int chunk = chunk_for(s, q, *budget);
            if (chunk == 0) continue;
            b->items[b->n_items++] =
                (scheduled_sequence){.id = q->id, .n_tokens = chunk, .phase = PHASE_PREFILL, .rollback_first_position = -1};
            *budget -= chunk;
        }
    }
}

// 1b. Speculative decoding (engine/speculative.h): each decode's guesses
// become rows of its own, after every running sequence has its one token,
// so that guesses never take a block or a budget slot a plain decode needed
// (and never preempt); they come before admissions, as in vLLM.
static void schedule_guesses(scheduler* s, step_batch* b, int* budget) {
    for (int i = 0; i < b->n_items; i++) {
        scheduled_sequence* item = &b->items[i];
        sequence* q = &s->sequences[item->id];
        if (item->phase != PHASE_DECODE || q->n_spec_guesses == 0) continue;
        int guesses = q->n_spec_guesses < *budget ? q->n_spec_guesses : *budget;
        if (guesses > 0) guesses = block_manager_prepare_ahead(&s->kv, q, guesses);
        q->n_spec_guesses = guesses;
        item->n_guesses = guesses;
        item->n_tokens += guesses;
        *budget -= guesses;
    }
}

// 2. Waiting requests, first come first served. Static batching admits
// only into an empty batch; so does "continuous" batching under the
// static-batching fault (engine/fault.h), the bug where the admission
// test is the static one.
static void admit_waiting(scheduler* s, step_batch* b, int* budget) {
    bool admits_only_when_empty = s->config.batching == BATCHING_STATIC || fault_on(FAULT_STATIC_BATCHING);
    bool may_admit = !admits_only_when_empty || s->n_running == 0;
    // Static batching admits the whole batch at once, whatever this step's
    // token budget: the members prefill over the following steps.
    bool ignore_budget = s->config.batching == BATCHING_STATIC;
    while (may_admit && s->n_waiting > 0 && s->n_running < s->config.max_seqs && (*budget > 0 || ignore_budget)) {
        sequence* q = &s->sequences[s->waiting[0]];
        int hit_blocks;
        bool pending;
        running_view running = {s->sequences, s->running, s->n_running};
        int cost = block_manager_admission_cost(&s->kv, q, running, &hit_blocks, &pending);
        if (pending) break; // its prefix is being computed right now: share it next step
        int headroom = s->n_running > 0 ? s->config.watermark_blocks : 0;
        if (cost + headroom > block_manager_available(&s->kv)) break;
        int hit_tokens = 0;
        if (block_manager_admit(&s->kv, q, &hit_tokens) != 0) break; // contiguous: no hole fits
        pop_waiting_front(s);
        q->state = SEQ_PREFILL;
        q->admit_order = ++s->admit_counter;
        s->running[s->n_running++] = q->id;
        b->prefix_hit_tokens += hit_tokens;
        int chunk = chunk_for(s, q, *budget);
        if (chunk > 0) {
            b->items[b->n_items++] =
                (scheduled_sequence){.id = q->id, .n_tokens = chunk, .phase = PHASE_PREFILL, .rollback_first_position = -1};
            *budget -= chunk;
        }
    }
}

// The paged-wrong-slot fault (engine/fault.h): the newest token's slot is
// mapped one short inside its tail block, so its K and V land on the
// previous token's slot and attention reads the wrong slot for both. A
// token in its block's first slot keeps its slot (so does every token of a
// contiguous cache: block size 1).
static void map_newest_slots_one_short(step_batch* b, int n_rows, int block_size) {
    for (int r = 0; r < n_rows; r++)
        if (b->rows[r].wants_logits && b->rows[r].position % block_size != 0) b->slot_mapping[r]--;
}

// The forward pass's rows: one per new token, in batch order; the last
// token of a sequence wants logits. Each row's KV slot follows from its
// block table (a contiguous table lists slots: block size 1).
static void build_rows(scheduler* s, step_batch* b) {
    int n_rows = 0;
    for (int i = 0; i < b->n_items; i++) {
        const sequence* q = &s->sequences[b->items[i].id];
        b->block_tables[i] = q->block_table;
        for (int t = 0; t < b->items[i].n_tokens; t++) {
            int position = q->n_computed + t;
            // A verifying decode's rows past its last token are its guesses,
            // and every one of its rows wants logits (engine/speculative.h).
            bool guess = position >= q->n_tokens;
            bool wants_logits = position >= q->n_tokens - 1;
            int32_t token = guess ? q->spec_guesses[position - q->n_tokens] : q->tokens[position];
            b->rows[n_rows++] = (batch_row){token, position, i, wants_logits};
            b->n_logit_rows += wants_logits;
        }
        if (b->items[i].phase == PHASE_PREFILL) b->prefill_tokens += b->items[i].n_tokens;
        else b->decode_tokens += b->items[i].n_tokens;
    }
    forward_batch_map_slots(b->slot_mapping, b->rows, n_rows, b->block_tables, s->kv.block_size);
    if (fault_on(FAULT_PAGED_WRONG_SLOT)) map_newest_slots_one_short(b, n_rows, s->kv.block_size);
    b->forward = (forward_batch){n_rows, b->rows, b->n_items, b->block_tables, b->slot_mapping};
}

int scheduler_schedule(scheduler* s, step_batch* b, error_info* err) {
    // A step runs at most every running sequence plus the newly admitted
    // ones (forks can push running past max_seqs). Room for every sequence
    // that could finish: those running or admitted now (at most n_running +
    // n_waiting) and the forks they spawn; bounded by the live queues, not
    // by n_sequences, which counts every id ever handed out and would grow
    // this array 4 bytes per request forever.
    int max_items = s->n_running + s->config.max_seqs;
    int finished_needed = s->n_running + s->n_waiting + 1;
    for (int i = 0; i < s->n_running; i++) finished_needed += s->sequences[s->running[i]].pending_forks;
    for (int i = 0; i < s->n_waiting; i++) finished_needed += s->sequences[s->waiting[i]].pending_forks;
    if (step_batch_reserve(b, max_items, s->config.max_batched_tokens + s->config.max_seqs, finished_needed))
        return error_set(err, "scheduler: out of memory");
    b->n_items = b->n_preempted = b->prefix_hit_tokens = 0;
    b->n_logit_rows = b->prefill_tokens = b->decode_tokens = 0;
    b->n_forks = b->n_finished = 0;
    int budget = s->config.max_batched_tokens;
    schedule_running(s, b, &budget);
    schedule_guesses(s, b, &budget);
    admit_waiting(s, b, &budget);
    build_rows(s, b);
    return 0;
}

// ---- postprocess --------------------------------------------------------------------------

static void finish(scheduler* s, step_batch* b, sequence* q, stop_reason reason, double clock_seconds) {
    q->state = SEQ_FINISHED;
    q->stop = reason;
    q->finish_time = clock_seconds;
    block_manager_release(&s->kv, q);
    remove_id(s->running, &s->n_running, q->id);
    s->n_finished++;
    b->finished_ids[b->n_finished++] = q->id;
}

// Appends the sampled token, or finishes the sequence on an end token or its length.
static void accept_token(scheduler* s, step_batch* b, sequence* q, sampled_token token, double clock_seconds) {
    if (q->first_token_time < 0) q->first_token_time = clock_seconds;
    if (token.stops) {
        finish(s, b, q, token.reason, clock_seconds);
        return;
    }
    q->tokens[q->n_tokens++] = token.token;
    q->state = SEQ_DECODE;
    if (q->n_tokens - q->n_prompt >= q->max_new_tokens) finish(s, b, q, STOP_LENGTH, clock_seconds);
    else if (q->n_tokens >= q->capacity) finish(s, b, q, STOP_CONTEXT, clock_seconds);
}

// The other samples of a request start as copies of sample 0 right after
// its prompt is computed, sharing every block; each takes the sampler and
// first token the engine drew for it from the same logits.
static int spawn_forks(scheduler* s, step_batch* b, int32_t parent_id, int first_fork, double clock_seconds,
                       error_info* err) {
    int n_forks = s->sequences[parent_id].pending_forks;
    s->sequences[parent_id].pending_forks = 0;
    for (int k = 1; k <= n_forks; k++) {
        sequence* child = scheduler_clone(s, parent_id, k, s->sequences[parent_id].seed + (uint64_t)k, err);
        if (!child) return -1;
        sampler* prepared = &b->fork_samplers[first_fork + k - 1];
        child->sampler = *prepared;
        memset(prepared, 0, sizeof *prepared); // handed over: step_batch_free must not free it
        share_running(s, parent_id, child);
        accept_token(s, b, child, b->fork_tokens[first_fork + k - 1], clock_seconds);
    }
    return 0;
}

// A verifying decode: its last token and the kept guesses stay in the
// cache, the refused guesses' slots are rolled back (blocks past the kept
// tokens go back to the pool), then the emitted tokens are appended one by
// one, each under the stop rules.
static void accept_verified(scheduler* s, step_batch* b, scheduled_sequence* item, int first_row,
                            double clock_seconds) {
    sequence* q = &s->sequences[item->id];
    const int from = q->n_computed, kept = 1 + item->n_accepted, n_tokens_before = q->n_tokens;
    // The kept guesses go where accept_token will append them first, so
    // that the prefix cache hashes a full block of real tokens.
    for (int j = 0; j < item->n_accepted; j++) q->tokens[q->n_tokens + j] = q->spec_guesses[j];
    q->n_computed = from + kept;
    block_manager_after_compute(&s->kv, q, from, q->n_computed);
    item->rollback_slots = item->n_tokens - kept;
    item->rollback_first_position = item->rollback_slots > 0 ? q->n_computed : -1;
    if (!fault_on(FAULT_SPEC_NO_ROLLBACK)) item->rollback_blocks = block_manager_truncate(&s->kv, q, q->n_computed);
    int appended = 0;
    for (int j = 0; j < item->n_emitted && q->state != SEQ_FINISHED; j++) {
        accept_token(s, b, q, b->sampled[first_row + j], clock_seconds);
        appended = q->n_tokens - n_tokens_before;
    }
    q->spec_total_drafted += (uint64_t)item->n_guesses;
    q->spec_total_accepted += (uint64_t)item->n_accepted;
    item->n_emitted = appended + (q->state == SEQ_FINISHED && q->stop != STOP_LENGTH && q->stop != STOP_CONTEXT);
}

int scheduler_postprocess(scheduler* s, step_batch* b, double clock_seconds, error_info* err) {
    int logit_row = 0, fork = 0;
    int status = 0;
    for (int i = 0; i < b->n_items; i++) {
        int32_t id = b->items[i].id;
        sequence* q = &s->sequences[id];
        if (b->items[i].n_guesses > 0) {
            accept_verified(s, b, &b->items[i], logit_row, clock_seconds);
            logit_row += b->items[i].n_tokens;
            continue;
        }
        int from = q->n_computed;
        q->n_computed += b->items[i].n_tokens;
        block_manager_after_compute(&s->kv, q, from, q->n_computed);
        if (q->n_computed < q->n_tokens) continue; // more prompt to go
        int n_forks = q->pending_forks;
        if (n_forks > 0 && spawn_forks(s, b, id, fork, clock_seconds, err)) {
            status = -1;
            break;
        }
        fork += n_forks;
        accept_token(s, b, &s->sequences[id], b->sampled[logit_row++], clock_seconds); // forks may have moved the array
        if (b->items[i].phase == PHASE_DECODE) b->items[i].n_emitted = 1;
    }
    for (int k = 0; k < b->n_forks; k++) sampler_free(&b->fork_samplers[k]); // any not handed over (an error)
    b->n_forks = 0;
    return status;
}
