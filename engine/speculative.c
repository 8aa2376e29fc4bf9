// speculative: the --speculative flag, the draft model, and n-gram lookup
// (engine/speculative.h). The drafting and verifying themselves run inside
// engine_step (engine/engine.c).
#include "engine/speculative.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model_quant.h"

speculative_config speculative_config_default(void) {
    return (speculative_config){.kind = SPEC_NONE, .k = SPEC_DEFAULT_K};
}

const char* speculative_kind_name(speculative_kind kind) {
    switch (kind) {
    case SPEC_NONE: return "none";
    case SPEC_DRAFT: return "draft";
    case SPEC_LOOKUP: return "lookup";
    }
    return "?";
}

// A whole decimal number in [1, 1e6], else -1.
static long parse_count(const char* text, size_t length) {
    if (length == 0 || length > 7) return -1;
    long value = 0;
    for (size_t i = 0; i < length; i++) {
        if (!isdigit((unsigned char)text[i])) return -1;
        value = value * 10 + (text[i] - '0');
    }
    return value;
}

// True when `text` starts like a quantization scheme: w, digits, a, digits.
static bool looks_like_scheme(const char* text) {
    const char* p = text;
    if (*p != 'w' && *p != 'W') return false;
    p++;
    if (!isdigit((unsigned char)*p)) return false;
    while (isdigit((unsigned char)*p))
        p++;
    if (*p != 'a' && *p != 'A') return false;
    p++;
    return isdigit((unsigned char)*p);
}

#define FLAG_USAGE "expected draft:SCHEME[:kK], draft:FILE[:kK] or lookup:N[:kK] (e.g. draft:w4a16:g32:k4, lookup:3)"

int speculative_config_parse(const char* text, speculative_config* out, error_info* err) {
    speculative_config c = speculative_config_default();
    if (!text || !*text) return error_set(err, "--speculative: empty; " FLAG_USAGE);
    if (strcmp(text, "none") == 0) {
        *out = c;
        return 0;
    }
    char body[sizeof c.draft_path];
    if (strlen(text) >= sizeof body) return error_set(err, "--speculative: %zu characters is too long", strlen(text));
    // A trailing ":kK" is the number of guesses.
    strcpy(body, text);
    char* last_colon = strrchr(body, ':');
    if (last_colon && (last_colon[1] == 'k' || last_colon[1] == 'K') && last_colon[2] != '\0' &&
        strspn(last_colon + 2, "-+0123456789") == strlen(last_colon + 2)) {
        long k = parse_count(last_colon + 2, strlen(last_colon + 2));
        if (k < 1 || k > SPEC_MAX_K)
            return error_set(err, "--speculative %s: k must be 1..%d guesses per step, found '%s'", text, SPEC_MAX_K,
                             last_colon + 2);
        c.k = (int)k;
        *last_colon = '\0';
    }
    if (strncmp(body, "lookup:", 7) == 0 || strcmp(body, "lookup") == 0) {
        const char* n_text = body[6] == ':' ? body + 7 : "";
        long n = parse_count(n_text, strlen(n_text));
        if (*n_text == '\0')
            return error_set(err, "--speculative %s: lookup needs N, the n-gram length (lookup:3)", text);
        if (n < 1 || n > SPEC_MAX_LOOKUP_N)
            return error_set(err, "--speculative %s: lookup's N must be 1..%d tokens, found '%s'", text,
                             SPEC_MAX_LOOKUP_N, n_text);
        c.kind = SPEC_LOOKUP;
        c.lookup_n = (int)n;
        *out = c;
        return 0;
    }
    if (strncmp(body, "draft:", 6) == 0 || strcmp(body, "draft") == 0) {
        const char* what = body[5] == ':' ? body + 6 : "";
        if (*what == '\0')
            return error_set(
                err, "--speculative %s: draft needs a quantization scheme or a model file (draft:w4a16:g32)", text);
        c.kind = SPEC_DRAFT;
        if (looks_like_scheme(what)) {
            model_quant_spec spec;
            error_info scheme_err = {0};
            if (model_quant_spec_parse(what, &spec, &scheme_err)) {
                const char* why = scheme_err.message; // the quantizer's message names its own flag
                if (strncmp(why, "--quant: ", 9) == 0) why += 9;
                return error_set(err, "--speculative %s: draft scheme '%s': %s", text, what, why);
            }
            if (strlen(what) >= sizeof c.draft_scheme)
                return error_set(err, "--speculative %s: draft scheme '%s' is too long", text, what);
            strcpy(c.draft_scheme, what);
        } else {
            strcpy(c.draft_path, what);
        }
        *out = c;
        return 0;
    }
    return error_set(err, "--speculative %s: unknown proposer; " FLAG_USAGE, text);
}

void speculative_config_describe(const speculative_config* c, char* out, size_t capacity) {
    switch (c->kind) {
    case SPEC_NONE: snprintf(out, capacity, "none"); return;
    case SPEC_LOOKUP: snprintf(out, capacity, "lookup %d k%d", c->lookup_n, c->k); return;
    case SPEC_DRAFT: {
        const char* name = c->draft_scheme[0] ? c->draft_scheme : c->draft_path;
        const char* slash = strrchr(name, '/');
        snprintf(out, capacity, "draft %s k%d", slash && !c->draft_scheme[0] ? slash + 1 : name, c->k);
        return;
    }
    }
    snprintf(out, capacity, "?");
}

int speculative_load_draft(const speculative_config* c, const model* target, const char* target_path, model* draft,
                           error_info* err) {
    memset(draft, 0, sizeof *draft);
    if (c->kind != SPEC_DRAFT)
        return error_set(err, "speculative: %s has no draft model", speculative_kind_name(c->kind));
    const char* path = c->draft_scheme[0] ? target_path : c->draft_path;
    if (!path || !*path) return error_set(err, "--speculative: the draft needs the target model's file to quantize");
    if (model_load(draft, path, MODEL_DTYPE_FP32, err)) return -1;
    if (draft->config.vocab_size != target->config.vocab_size) {
        int draft_vocab = draft->config.vocab_size;
        model_free(draft);
        return error_set(err, "draft model %s: vocabulary of %d tokens, the target's has %d (the draft must share it)",
                         path, draft_vocab, target->config.vocab_size);
    }
    if (c->draft_scheme[0]) {
        model_quant_spec spec;
        if (model_quant_spec_parse(c->draft_scheme, &spec, err) ||
            model_quantize(draft, &spec, NULL, NULL, 0, NULL, NULL, err)) {
            model_free(draft);
            return -1;
        }
    }
    return 0;
}

double speculative_expected_tokens(double a, int k) {
    if (a >= 1.0) return k + 1.0;
    return (1.0 - pow(a, k + 1)) / (1.0 - a);
}

int speculative_lookup(const int32_t* tokens, int n_tokens, int n, int max_guesses, int32_t* guesses) {
    if (n < 1 || n_tokens <= n || max_guesses < 1) return 0;
    const int32_t* tail = tokens + n_tokens - n;
    // The latest earlier occurrence: the nearest context is the likeliest to repeat.
    for (int start = n_tokens - n - 1; start >= 0; start--) {
        if (memcmp(tokens + start, tail, (size_t)n * sizeof *tokens) != 0) continue;
        int next = start + n, count = 0;
        while (count < max_guesses && next + count < n_tokens) {
            guesses[count] = tokens[next + count];
            count++;
        }
        return count;
    }
    return 0;
}

// ---- the engine's side ----------------------------------------------------------------------

#include "engine/engine.h"
#include "engine/fault.h"

static int blocks_for(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

int speculative_init(speculative_state* st, const speculative_config* config, const model* target, const model* draft,
                     kv_dtype dtype, int num_blocks, int block_size, int max_rows, thread_pool* pool, error_info* err) {
    memset(st, 0, sizeof *st);
    st->config = *config;
    if (config->kind == SPEC_NONE) return 0;
    if (config->k < 1 || config->k > SPEC_MAX_K)
        return error_set(err, "--speculative: k must be 1..%d guesses per step, found %d", SPEC_MAX_K, config->k);
    if (config->kind == SPEC_LOOKUP && (config->lookup_n < 1 || config->lookup_n > SPEC_MAX_LOOKUP_N))
        return error_set(err, "--speculative: lookup's N must be 1..%d tokens, found %d", SPEC_MAX_LOOKUP_N,
                         config->lookup_n);
    st->residual = malloc((size_t)target->config.vocab_size * sizeof *st->residual);
    if (!st->residual) return error_set(err, "speculative: out of memory");
    if (config->kind != SPEC_DRAFT) return 0;
    if (!draft)
        return error_set(err, "--speculative draft:%s: no draft model was given to the engine (generate and sim load "
                              "one; a program that does not must call speculative_load_draft or engine_options_open_draft)",
                         config->draft_scheme[0] ? config->draft_scheme : config->draft_path);
    if (draft->config.vocab_size != target->config.vocab_size)
        return error_set(err, "draft model %s: vocabulary of %d tokens, the target's has %d (the draft must share it)",
                         draft->name, draft->config.vocab_size, target->config.vocab_size);
    st->draft = draft;
    st->max_rows = max_rows;
    if (kv_pool_init(&st->draft_pool, &draft->config, dtype, num_blocks, block_size, err) ||
        forward_state_init(&st->draft_forward, &draft->config, max_rows, draft->config.max_seq_len, err) ||
        forward_state_set_pool(&st->draft_forward, pool, err))
        return -1;
    st->rows = malloc((size_t)max_rows * sizeof *st->rows);
    st->slot_mapping = malloc((size_t)max_rows * sizeof *st->slot_mapping);
    st->row_job = malloc((size_t)max_rows * sizeof *st->row_job);
    if (!st->rows || !st->slot_mapping || !st->row_job)
        return error_set(err, "speculative: out of memory for %d draft rows", max_rows);
    return 0;
}

void speculative_free(speculative_state* st) {
    kv_pool_free(&st->draft_pool);
    forward_state_free(&st->draft_forward);
    free(st->draft_logits);
    free(st->rows);
    free(st->slot_mapping);
    free(st->row_job);
    free(st->jobs);
    free(st->job_tables);
    free(st->job_guesses);
    free(st->residual);
    memset(st, 0, sizeof *st);
}

void speculative_drop_draft(speculative_state* st, sequence* q) {
    for (int i = q->n_draft_table - 1; i >= 0; i--)
        kv_pool_release(&st->draft_pool, q->draft_block_table[i], q->id);
    q->n_draft_table = 0;
    q->draft_n_computed = 0;
}

// Draft blocks for the first n_tokens positions of q; returns the tokens
// its blocks now cover (fewer when the draft pool ran out).
static int reserve_draft_slots(speculative_state* st, sequence* q, int n_tokens) {
    const int bs = st->draft_pool.block_size;
    int needed = blocks_for(n_tokens, bs);
    if (needed > q->draft_table_capacity) {
        int capacity = q->draft_table_capacity ? q->draft_table_capacity : 8;
        while (capacity < needed)
            capacity *= 2;
        int32_t* grown = realloc(q->draft_block_table, (size_t)capacity * sizeof *grown);
        if (!grown) return q->n_draft_table * bs;
        q->draft_block_table = grown;
        q->draft_table_capacity = capacity;
    }
    while (q->n_draft_table < needed) {
        int32_t block = kv_pool_allocate(&st->draft_pool, q->id);
        if (block < 0) break;
        q->draft_block_table[q->n_draft_table++] = block;
    }
    return q->n_draft_table * bs;
}

// The guess a draft row's logits give: the argmax at temperature 0, else a
// draw from q (the sequence's temperature and top-p), kept for verifying.
static int32_t draft_guess(sequence* q, float* logits, int vocab, int round) {
    if (q->sampler.temperature < SAMPLER_MIN_TEMPERATURE) return sampler_argmax(logits, vocab);
    float* dist = q->spec_draft_probabilities + (size_t)round * (size_t)vocab;
    memcpy(dist, logits, (size_t)vocab * sizeof *dist);
    sampler_distribution(&q->sampler, dist);
    return sampler_draw(&q->sampler, dist);
}

// Runs the gathered draft rows; each row that wants logits gives its
// sequence's next guess (round = its position past the last token).
static int flush_draft_rows(speculative_state* st, error_info* err) {
    if (st->n_rows == 0) return 0;
    const model* d = st->draft;
    const int vocab = d->config.vocab_size;
    forward_batch_map_slots(st->slot_mapping, st->rows, st->n_rows, st->job_tables, st->draft_pool.block_size);
    forward_batch batch = {st->n_rows, st->rows, st->n_jobs, st->job_tables, st->slot_mapping};
    if (forward(d, &st->draft_forward, &st->draft_pool.memory, &batch, st->draft_logits, &st->draft_traffic, err))
        return -1;
    st->draft_passes++;
    int logit_row = 0;
    for (int r = 0; r < st->n_rows; r++) {
        sequence* q = st->jobs[st->row_job[r]];
        if (st->rows[r].position + 1 > q->draft_n_computed) q->draft_n_computed = st->rows[r].position + 1;
        if (!st->rows[r].wants_logits) continue;
        int round = st->rows[r].position - (q->n_tokens - 1);
        q->spec_guesses[round] = draft_guess(q, st->draft_logits + (size_t)logit_row * (size_t)vocab, vocab, round);
        logit_row++;
    }
    st->n_rows = 0;
    return 0;
}

static int add_draft_row(speculative_state* st, int job, int32_t token, int position, bool wants_logits,
                         error_info* err) {
    if (st->n_rows == st->max_rows && flush_draft_rows(st, err)) return -1;
    st->rows[st->n_rows] = (batch_row){token, position, job, wants_logits};
    st->row_job[st->n_rows++] = job;
    return 0;
}

// The most guesses q may take this step: k, and no more than leave room
// for the one token the target adds, under max_new_tokens and capacity.
static int guess_limit(const speculative_config* c, const sequence* q) {
    int limit = c->k;
    int left = q->max_new_tokens - (q->n_tokens - q->n_prompt) - 1;
    if (left < limit) limit = left;
    if (q->capacity - q->n_tokens - 1 < limit) limit = q->capacity - q->n_tokens - 1;
    return limit > 0 ? limit : 0;
}

static int draft_propose(engine* e, error_info* err) {
    speculative_state* st = &e->spec;
    scheduler* s = &e->scheduler;
    const int vocab = st->draft->config.vocab_size;
    if (s->n_running > st->jobs_capacity) {
        // A draft call has at most one row wanting logits per drafting
        // sequence, so its logits grow with the jobs, not with max_rows
        // (which at 32,000 ids and 640 rows would hold 82 MB).
        int capacity = s->n_running * 2;
        float* logits = realloc(st->draft_logits, (size_t)capacity * (size_t)vocab * sizeof *logits);
        if (logits) st->draft_logits = logits;
        sequence** jobs = realloc(st->jobs, (size_t)capacity * sizeof *jobs);
        if (jobs) st->jobs = jobs;
        const int32_t** tables = realloc(st->job_tables, (size_t)capacity * sizeof *tables);
        if (tables) st->job_tables = tables;
        int* guesses = realloc(st->job_guesses, (size_t)capacity * sizeof *guesses);
        if (guesses) st->job_guesses = guesses;
        if (!logits || !jobs || !tables || !guesses) return error_set(err, "speculative: out of memory");
        st->jobs_capacity = capacity;
    }
    st->n_jobs = 0;
    int most_guesses = 0;
    for (int i = 0; i < s->n_running; i++) {
        sequence* q = &s->sequences[s->running[i]];
        if (q->state != SEQ_DECODE || q->n_computed != q->n_tokens - 1) continue;
        int limit = guess_limit(&st->config, q);
        // Guess j sits at position n_tokens - 1 + j; the draft writes KV up to guess limit - 1.
        if (st->draft->config.max_seq_len - q->n_tokens + 1 < limit)
            limit = st->draft->config.max_seq_len - q->n_tokens + 1;
        if (limit <= 0) continue;
        int covered = reserve_draft_slots(st, q, q->n_tokens + limit - 1);
        if (covered < q->n_tokens) continue; // the draft pool is full: a plain decode this step
        if (covered - q->n_tokens + 1 < limit) limit = covered - q->n_tokens + 1;
        if (q->sampler.temperature >= SAMPLER_MIN_TEMPERATURE && !q->spec_draft_probabilities &&
            !(q->spec_draft_probabilities = malloc((size_t)st->config.k * (size_t)vocab * sizeof(float))))
            return error_set(err, "speculative: out of memory for draft probabilities");
        st->jobs[st->n_jobs] = q;
        st->job_tables[st->n_jobs] = q->draft_block_table;
        st->job_guesses[st->n_jobs++] = limit;
        if (limit > most_guesses) most_guesses = limit;
    }
    // Round 0: each draft catches up on the tokens it has not seen (the
    // whole prompt after a prefill, 1 + the kept guesses after a verify);
    // its last row gives guess 0. Rounds 1..: one row per sequence.
    for (int j = 0; j < st->n_jobs; j++) {
        sequence* q = st->jobs[j];
        for (int position = q->draft_n_computed; position < q->n_tokens; position++)
            if (add_draft_row(st, j, q->tokens[position], position, position == q->n_tokens - 1, err)) return -1;
    }
    if (flush_draft_rows(st, err)) return -1;
    for (int round = 1; round < most_guesses; round++) {
        for (int j = 0; j < st->n_jobs; j++) {
            sequence* q = st->jobs[j];
            if (round >= st->job_guesses[j]) continue;
            if (add_draft_row(st, j, q->spec_guesses[round - 1], q->n_tokens - 1 + round, true, err)) return -1;
        }
        if (flush_draft_rows(st, err)) return -1;
    }
    for (int j = 0; j < st->n_jobs; j++)
        st->jobs[j]->n_spec_guesses = st->job_guesses[j];
    return 0;
}

int speculative_propose(engine* e, error_info* err) {
    speculative_state* st = &e->spec;
    memset(&st->draft_traffic, 0, sizeof st->draft_traffic);
    st->draft_passes = 0;
    scheduler* s = &e->scheduler;
    for (int i = 0; i < s->n_running; i++)
        s->sequences[s->running[i]].n_spec_guesses = 0;
    if (st->config.kind == SPEC_DRAFT) return draft_propose(e, err);
    if (st->config.kind != SPEC_LOOKUP) return 0;
    for (int i = 0; i < s->n_running; i++) {
        sequence* q = &s->sequences[s->running[i]];
        if (q->state != SEQ_DECODE || q->n_computed != q->n_tokens - 1) continue;
        q->n_spec_guesses = speculative_lookup(q->tokens, q->n_tokens, st->config.lookup_n, guess_limit(&st->config, q),
                                               q->spec_guesses);
    }
    return 0;
}

int speculative_verify(speculative_state* st, sequence* q, float* logits, int vocab, int32_t* tokens, int* accepted) {
    sampler* smp = &q->sampler;
    const bool greedy = smp->temperature < SAMPLER_MIN_TEMPERATURE;
    const int g = q->n_spec_guesses;
    for (int j = 0; j < g; j++) {
        float* p = logits + (size_t)j * (size_t)vocab;
        int32_t x = q->spec_guesses[j];
        if (greedy) {
            int32_t best = sampler_argmax(p, vocab);
            tokens[j] = best;
            if (best == x) continue;
            *accepted = j;
            return j + 1;
        }
        sampler_distribution(smp, p);
        // The draft's q (a draw from its distribution), or one-hot for lookup.
        const float* qrow =
            st->config.kind == SPEC_DRAFT ? q->spec_draft_probabilities + (size_t)j * (size_t)vocab : NULL;
        float qx = qrow ? qrow[x] : 1.0f;
        float coin = sampler_random_unit(&smp->rng_state);
        if (coin * qx < p[x]) { // kept with probability min(1, p(x) / q(x))
            tokens[j] = x;
            continue;
        }
        *accepted = j;
        if (fault_on(FAULT_SPEC_NO_RESIDUAL)) {
            tokens[j] = sampler_draw(smp, p);
            return j + 1;
        }
        double total = 0.0;
        for (int t = 0; t < vocab; t++) {
            float qt = qrow ? qrow[t] : (t == x ? 1.0f : 0.0f);
            st->residual[t] = p[t] > qt ? p[t] - qt : 0.0f;
            total += st->residual[t];
        }
        if (total <= 0.0) { // p == q to the last bit: nothing to correct
            tokens[j] = sampler_draw(smp, p);
            return j + 1;
        }
        for (int t = 0; t < vocab; t++)
            st->residual[t] = (float)(st->residual[t] / total);
        tokens[j] = sampler_draw(smp, st->residual);
        return j + 1;
    }
    // Every guess kept: the last row gives one more token.
    float* last = logits + (size_t)g * (size_t)vocab;
    tokens[g] = sampler_sample(smp, last);
    *accepted = g;
    return g + 1;
}

void speculative_after_step(engine* e, const step_batch* b) {
    speculative_state* st = &e->spec;
    scheduler* s = &e->scheduler;
    for (int i = 0; i < b->n_items; i++) {
        const scheduled_sequence* item = &b->items[i];
        if (item->phase != PHASE_DECODE) continue;
        st->total_target_passes++;
        st->total_drafted += (uint64_t)item->n_guesses;
        st->total_accepted += (uint64_t)item->n_accepted;
        st->total_emitted += (uint64_t)item->n_emitted;
    }
    if (st->config.kind != SPEC_DRAFT) return;
    const int bs = st->draft_pool.block_size;
    for (int i = 0; i < s->n_live; i++) {
        sequence* q = &s->sequences[s->live_ids[i]];
        if (q->n_draft_table == 0) continue;
        if (q->state != SEQ_DECODE && q->state != SEQ_PREFILL) {
            speculative_drop_draft(st, q);
            continue;
        }
        // Rolled back with the target: the draft saw the last token and the
        // guesses; only those the target kept are its tokens now.
        if (q->draft_n_computed > q->n_computed) q->draft_n_computed = q->n_computed;
        while (q->n_draft_table > blocks_for(q->draft_n_computed, bs))
            kv_pool_release(&st->draft_pool, q->draft_block_table[--q->n_draft_table], q->id);
    }
}
