// lesson_api_perf: timing, the analytic formulas, device models and this
// machine's measured bandwidth and FLOP rate.
//
//   t = lab.time{model = m, phase = "prefill" | "decode", tokens = N, batch = B, repeats = 5, context = 16}
//     (bytes, weight_bytes, kv_bytes, flops, matmul_flops, attention_flops: summed over the timed steps of one round)
//   lab.kv_bytes{model = m, batch = B, seq = S, bytes_per_element = 2}
//   lab.roofline{bytes = b, flops = f, device = "H100" | "machine"}
//   lab.devices(), lab.machine() (the cached machine profile), lab.median{...}
//   lab.ratio_interval(a, b) -> {median, low, high, confidence, n}: paired timings a[i] / b[i]
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "engine/devices.h"
#include "engine/sampler.h"
#include "kernels/cpu/matmul.h"
#include "lab/lesson/api.h"

static int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

static double median_of(double* values, int n) {
    qsort(values, (size_t)n, sizeof *values, compare_doubles);
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// lab.median{...} -> the median of an array of numbers
static int lab_median(lua_State* L) {
    size_t n = 0;
    float* values = lab_read_number_array(L, 1, 1, NULL, &n);
    double* sorted = lua_newuserdatauv(L, n * sizeof *sorted, 0);
    for (size_t i = 0; i < n; i++) sorted[i] = values[i];
    lua_pushnumber(L, median_of(sorted, (int)n));
    return 1;
}

// lab.ratio_interval(a, b): a and b are paired timings (round i timed a[i]
// and b[i] back to back, interleaved); returns the median of the ratios
// a[i] / b[i] and a distribution-free interval for it: the k-th smallest
// and k-th largest ratio, with k the largest for which the interval holds
// the true median with probability >= 0.9 (binomial, p = 1/2): 5 rounds
// give the extremes at 0.94, 9 rounds the 2nd from each end at 0.96. A
// neighbour that slows one round moves one ratio, not the interval's ends.
// A verdict is true when the whole interval is on one side of its
// threshold, false when on the other, and lab.UNDECIDED when it straddles.
static int lab_ratio_interval(lua_State* L) {
    size_t n = 0, n_b = 0;
    float* a = lab_read_number_array(L, 1, 1, NULL, &n);
    float* b = lab_read_number_array(L, 2, 2, NULL, &n_b);
    if (n != n_b) return lab_error(L, "lab.ratio_interval: %zu timings against %zu: they must be paired", n, n_b);
    if (n < 3 || n > 1000) return lab_error(L, "lab.ratio_interval: %zu pairs; expected 3 to 1000", n);
    double* ratios = lua_newuserdatauv(L, n * sizeof *ratios, 0);
    for (size_t i = 0; i < n; i++) {
        if (!(a[i] > 0.0f) || !(b[i] > 0.0f) || !isfinite(a[i]) || !isfinite(b[i]))
            return lab_error(L, "lab.ratio_interval: pair %zu (%g, %g): timings must be positive", i + 1,
                             (double)a[i], (double)b[i]);
        ratios[i] = (double)a[i] / (double)b[i];
    }
    double median = median_of(ratios, (int)n); // sorts them
    // P(Binomial(n, 1/2) <= j), summed term by term: C(n, j) / 2^n.
    int k = 1;
    double below = 0.0, term = pow(0.5, (double)n), confidence = 1.0 - 2.0 * term;
    for (int j = 0; j + 1 < (int)n / 2; j++) {
        below += term;                                    // P(X <= j)
        term = term * (double)((int)n - j) / (double)(j + 1); // C(n, j + 1) / 2^n
        double wider = 1.0 - 2.0 * (below + term);       // interval from the (j + 2)-th
        if (wider < 0.9) break;
        k = j + 2;
        confidence = wider;
    }
    lua_createtable(L, 0, 5);
    lua_pushnumber(L, median);
    lua_setfield(L, -2, "median");
    lua_pushnumber(L, ratios[k - 1]);
    lua_setfield(L, -2, "low");
    lua_pushnumber(L, ratios[n - (size_t)k]);
    lua_setfield(L, -2, "high");
    lua_pushnumber(L, confidence);
    lua_setfield(L, -2, "confidence");
    lua_pushinteger(L, (lua_Integer)n);
    lua_setfield(L, -2, "n");
    lab_make_strict(L, -1, "lab.ratio_interval()");
    return 1;
}

// ---- timing prefill and decode ------------------------------------------------------------

typedef struct timing_engine {
    engine engine;
    bool initialised;
    uint64_t reserved;
} timing_engine;

static int timing_engine_gc(lua_State* L) {
    timing_engine* t = lua_touserdata(L, 1);
    if (t->initialised) engine_free(&t->engine);
    t->initialised = false;
    lesson_api_state(lesson_of(L))->timing_engine = NULL;
    lesson_release_bytes(lesson_of(L), t->reserved);
    t->reserved = 0;
    return 0;
}

// Adds `batch` requests of `prompt_length` random tokens (BOS first):
// reproducible (the sampler's generator, seeded) and distinct, so that no
// prompt shares a block with another (prefix caching is off anyway).
static void add_batch(lua_State* L, engine* e, int batch, int prompt_length, int max_new_tokens, uint64_t* rng) {
    int vocab = e->model->config.vocab_size;
    int32_t* prompt = lua_newuserdatauv(L, (size_t)prompt_length * sizeof *prompt, 0);
    for (int b = 0; b < batch; b++) {
        prompt[0] = 1;
        for (int i = 1; i < prompt_length; i++)
            prompt[i] = 3 + (int32_t)(sampler_random_unit(rng) * (float)(vocab - 3));
        request_params p = {prompt, prompt_length, max_new_tokens, 1, 0.0f, 0.0f, 1, 0.0, true};
        error_info err = {{0}};
        if (engine_add_request(e, &p, NULL, &err)) lab_error(L, "lab.time: %s", err.message);
    }
    lua_pop(L, 1);
}

// What lab.time{} was asked to time.
typedef struct timing_request {
    int phase;          // 0 prefill, 1 decode
    int tokens;         // prefill: prompt length; decode: tokens decoded
    int batch;          // sequences at once
    int repeats;        // timed rounds (one untimed round runs first)
    int context;        // decode: the prompt prefilled before the timed steps
    int threads;        // 0: the engine's default
    int prompt_length;  // tokens of each prompt: `tokens` for prefill, `context` for decode
} timing_request;

static const char* const TIMING_PHASES[] = {"prefill", "decode", NULL};

static timing_request read_timing_request(lua_State* L, const model_config* mc) {
    timing_request q;
    q.phase = lab_opt_choice_field(L, 1, "phase", TIMING_PHASES, -1);
    if (q.phase < 0) lab_field_error(L, 1, "phase", "expected \"prefill\" or \"decode\"");
    q.tokens = (int)lab_opt_integer_field(L, 1, "tokens", 0, 1, mc->max_seq_len - 1);
    if (q.tokens == 0) lab_field_error(L, 1, "tokens", "expected the number of tokens to time");
    q.batch = (int)lab_opt_integer_field(L, 1, "batch", 1, 1, 1024);
    q.repeats = (int)lab_opt_integer_field(L, 1, "repeats", 5, 1, 101);
    q.context = (int)lab_opt_integer_field(L, 1, "context", 16, 1, mc->max_seq_len - 2);
    q.threads = (int)lab_opt_integer_field(L, 1, "threads", 0, 0, 256);
    if (q.phase == 1 && q.context + q.tokens + 1 > mc->max_seq_len)
        lab_field_error(L, 1, "tokens", "context %d + %d decode tokens exceed the model's max length %d", q.context,
                        q.tokens, mc->max_seq_len);
    q.prompt_length = q.phase == 0 ? q.tokens : q.context;
    return q;
}

// Makes the engine that times the request, held by a userdata left on the
// stack whose finalizer frees it (and counted against the memory cap).
// Prefill: batch prompts of `tokens` tokens in one step. Decode: batch
// prompts of `context` tokens, prefilled untimed, then `tokens` decode steps.
static timing_engine* push_timing_engine(lua_State* L, const lab_model* m, const timing_request* q) {
    int longest = q->prompt_length + (q->phase == 0 ? 1 : q->tokens + 1);
    engine_config config = engine_config_default();
    config.block_size = 16;
    config.num_blocks = q->batch * ((longest + 15) / 16 + 1) + 4;
    config.max_seqs = q->batch;
    config.max_batched_tokens = q->batch * q->prompt_length;
    config.prefix_caching = false;
    config.n_threads = q->threads;
    config.watermark_blocks = 0;
    timing_engine* t = lua_newuserdatauv(L, sizeof *t, 0);
    memset(t, 0, sizeof *t);
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, timing_engine_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    uint64_t estimate = lab_engine_bytes_estimate(&m->source.model.config, &config);
    lesson_reserve_bytes(L, estimate, "lab.time's engine");
    t->reserved = estimate;
    error_info err = {{0}};
    if (engine_init(&t->engine, &m->source.model, &config, &err)) lab_error(L, "lab.time: %s", err.message);
    lesson_api_state(lesson_of(L))->timing_engine = &t->engine; // freed by the watchdog's abandon if no finalizer runs
    t->initialised = true;
    return t;
}

// One round: adds the batch, runs it to the end, and returns the wall and
// CPU seconds and the traffic of the timed steps (the prefill step, or the
// decode steps that decoded the whole batch). The time limit and the stop
// flag are looked at before every step: one decode round of 1000 tokens ran
// 11.9 s of CPU under --time-limit 2 when only rounds looked. The check
// costs one clock read (~50 ns) against a step's 0.1 ms or more.
static void time_one_round(lua_State* L, engine* e, const timing_request* q, uint64_t* rng, double* seconds,
                           double* cpu_seconds, kernel_traffic* traffic) {
    add_batch(L, e, q->batch, q->prompt_length, q->phase == 0 ? 1 : q->tokens + 1, rng);
    const step_record* r = NULL;
    error_info err = {{0}};
    uint64_t elapsed = 0;
    double elapsed_cpu = 0;
    *traffic = (kernel_traffic){0};
    if (q->phase == 0) {
        lesson_check_time(L);
        double cpu_start = lesson_cpu_seconds();
        if (engine_step(e, &r, &err)) lab_error(L, "lab.time: %s", err.message);
        elapsed_cpu = lesson_cpu_seconds() - cpu_start;
        if (r->prefill_tokens != q->batch * q->tokens)
            lab_error(L, "lab.time: the prefill step computed %d tokens, expected %d", r->prefill_tokens,
                      q->batch * q->tokens);
        elapsed = r->wall_ns;
        *traffic = r->traffic;
    } else {
        while (engine_has_work(e)) { // the prefill step is not timed
            lesson_check_time(L);
            double cpu_start = lesson_cpu_seconds();
            if (engine_step(e, &r, &err)) lab_error(L, "lab.time: %s", err.message);
            if (r->prefill_tokens == 0 && r->decode_tokens == q->batch) {
                elapsed_cpu += lesson_cpu_seconds() - cpu_start;
                elapsed += r->wall_ns;
                traffic_add(traffic, &r->traffic);
            }
        }
    }
    while (engine_has_work(e)) {
        lesson_check_time(L);
        if (engine_step(e, &r, &err)) lab_error(L, "lab.time: %s", err.message);
    }
    *seconds = (double)elapsed * 1e-9;
    *cpu_seconds = elapsed_cpu;
}

// Pushes lab.time's result: the samples, the medians, and the last round's traffic.
static void push_timing(lua_State* L, const timing_request* q, double* seconds, double* cpu,
                        const kernel_traffic* traffic) {
    lua_createtable(L, q->repeats, 0);
    for (int i = 0; i < q->repeats; i++) {
        lua_pushnumber(L, seconds[i]);
        lua_rawseti(L, -2, i + 1);
    }
    double median = median_of(seconds, q->repeats);
    double median_cpu = median_of(cpu, q->repeats);
    double tokens = (double)q->tokens * q->batch;
    lua_createtable(L, 0, 16);
    lua_insert(L, -2);
    lua_setfield(L, -2, "samples");
    lab_set_string(L, "phase", TIMING_PHASES[q->phase]);
    lab_set_integer(L, "tokens", q->tokens);
    lab_set_integer(L, "batch", q->batch);
    lab_set_number(L, "seconds", median);
    lab_set_number(L, "tokens_per_s", median > 0 ? tokens / median : 0.0);
    // CPU time of the whole process over the timed steps: with threads = 1 it
    // is the work itself, unaffected by other programs taking the cores.
    lab_set_number(L, "cpu_seconds", median_cpu);
    lab_set_number(L, "cpu_tokens_per_s", median_cpu > 0 ? tokens / median_cpu : 0.0);
    lab_set_number(L, "seconds_per_step", q->phase == 0 ? median : median / q->tokens);
    uint64_t bytes = traffic->weight_bytes_read + traffic->kv_bytes_read + traffic->kv_bytes_written + traffic->activation_bytes;
    uint64_t flops = traffic->matmul_flops + traffic->attention_flops;
    lab_set_integer(L, "bytes", (lua_Integer)bytes);
    lab_set_integer(L, "weight_bytes", (lua_Integer)traffic->weight_bytes_read);
    lab_set_integer(L, "flops", (lua_Integer)flops);
    // The two kinds of work apart: a matmul's FLOPs scale with the weights
    // it streams, attention's with the context (lessons check each against
    // the model's shapes).
    lab_set_integer(L, "matmul_flops", (lua_Integer)traffic->matmul_flops);
    lab_set_integer(L, "attention_flops", (lua_Integer)traffic->attention_flops);
    lab_set_integer(L, "kv_bytes", (lua_Integer)(traffic->kv_bytes_read + traffic->kv_bytes_written));
    lab_set_number(L, "intensity", bytes ? (double)flops / (double)bytes : 0.0);
}

// lab.time{model=, phase=, tokens=, batch=, repeats=, context=, threads=} -> timing table
static int lab_time(lua_State* L) {
    static const char* const fields[] = {"model", "phase", "tokens", "batch", "repeats", "context", "threads", NULL};
    lab_check_fields(L, 1, fields);
    if (lab_get_field(L, 1, "model") != LUA_TUSERDATA)
        lab_field_error(L, 1, "model", "expected a model from lab.model{}");
    lab_model* m = lab_check_model(L, lua_gettop(L));
    timing_request q = read_timing_request(L, &m->source.model.config);
    timing_engine* t = push_timing_engine(L, m, &q);
    int holder = lua_gettop(L);

    double* seconds = lua_newuserdatauv(L, (size_t)(q.repeats + 1) * sizeof *seconds, 0);
    double* cpu = lua_newuserdatauv(L, (size_t)(q.repeats + 1) * sizeof *cpu, 0);
    kernel_traffic traffic = {0};
    uint64_t rng = 0x5EED0000u + (uint64_t)q.tokens * 131u + (uint64_t)q.batch;
    // One untimed round first: caches, page faults and thread start-up.
    for (int round = 0; round <= q.repeats; round++) {
        lesson_check_time(L);
        double round_seconds = 0, round_cpu = 0;
        kernel_traffic round_traffic;
        time_one_round(L, &t->engine, &q, &rng, &round_seconds, &round_cpu, &round_traffic);
        if (round > 0) {
            seconds[round - 1] = round_seconds;
            cpu[round - 1] = round_cpu;
            traffic = round_traffic;
        }
    }
    push_timing(L, &q, seconds, cpu, &traffic);
    lab_make_strict(L, -1, "lab.time()");
    // Free the engine now rather than at the next collection (the
    // finalizer then finds nothing left to do).
    lua_pushcfunction(L, timing_engine_gc);
    lua_pushvalue(L, holder);
    lua_call(L, 1, 0);
    return 1;
}

// ---- the formulas ---------------------------------------------------------------------------

// The bandwidth and peak of `device` (a name from lab.devices(), "machine",
// or {bandwidth =, peak_flops =}) at field index `arg`.
static void read_device(lua_State* L, int arg, bool int8, double* bandwidth, double* peak, const char** name);

static int lab_machine(lua_State* L);

// lab.roofline{bytes =, flops =, device = "H100", int8 = false}
static int lab_roofline(lua_State* L) {
    static const char* const fields[] = {"bytes", "flops", "device", "int8", NULL};
    lab_check_fields(L, 1, fields);
    double bytes = lab_opt_number_field(L, 1, "bytes", -1, 0, 1e20);
    double flops = lab_opt_number_field(L, 1, "flops", -1, 0, 1e24);
    if (bytes < 0) lab_field_error(L, 1, "bytes", "expected the bytes moved");
    if (flops < 0) lab_field_error(L, 1, "flops", "expected the FLOPs computed");
    bool int8 = lab_opt_boolean_field(L, 1, "int8", false);
    double bandwidth = 0, peak = 0;
    const char* name = NULL;
    read_device(L, 1, int8, &bandwidth, &peak, &name);
    double memory_s = bytes / bandwidth, compute_s = flops / peak;
    lua_createtable(L, 0, 8);
    lab_set_string(L, "device", name);
    lab_set_number(L, "memory_seconds", memory_s);
    lab_set_number(L, "compute_seconds", compute_s);
    lab_set_number(L, "seconds", memory_s > compute_s ? memory_s : compute_s);
    lab_set_string(L, "bound", memory_s >= compute_s ? "memory" : "compute");
    lab_set_number(L, "intensity", bytes > 0 ? flops / bytes : 0.0);
    lab_set_number(L, "ridge", peak / bandwidth);
    lab_make_strict(L, -1, "lab.roofline()");
    return 1;
}

static void push_device(lua_State* L, const device_model* d) {
    lua_createtable(L, 0, 6);
    lab_set_string(L, "name", d->name);
    lab_set_number(L, "bandwidth", d->bandwidth_bytes_per_s);
    lab_set_number(L, "capacity", d->capacity_bytes);
    lab_set_number(L, "peak_flops", d->peak_fp16_flops);
    lab_set_number(L, "peak_int8", d->peak_int8_ops);
    lab_set_number(L, "ridge", device_ridge_point(d, 0));
}

static int lab_devices(lua_State* L) {
    int count = 0;
    const device_model* devices = device_models(&count);
    lua_createtable(L, count, 0);
    for (int i = 0; i < count; i++) {
        push_device(L, &devices[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lab_make_strict(L, -1, "lab.devices()");
    return 1;
}

static void read_device(lua_State* L, int arg, bool int8, double* bandwidth, double* peak, const char** name) {
    int type = lab_get_field(L, arg, "device");
    if (type == LUA_TTABLE) {
        int table = lua_gettop(L);
        // A device of lab.devices() may be passed whole: its other fields are accepted.
        static const char* const device_fields[] = {"bandwidth", "peak_flops", "peak_int8", "name", "capacity", "ridge", NULL};
        lab_check_nested_fields(L, table, arg, "device.", device_fields);
        *bandwidth = lab_opt_number_field(L, table, "bandwidth", 0, 1, 1e18);
        *peak = lab_opt_number_field(L, table, "peak_flops", 0, 1, 1e20);
        if (*bandwidth <= 0 || *peak <= 0) lab_field_error(L, arg, "device", "a device table needs bandwidth and peak_flops");
        *name = "custom";
    } else if (type == LUA_TSTRING && strcmp(lua_tostring(L, -1), "machine") == 0) {
        lua_pushcfunction(L, lab_machine);
        lua_call(L, 0, 1);
        lua_pushliteral(L, "bandwidth"); // raw, as every host read (the table is strict)
        lua_rawget(L, -2);
        lua_pushliteral(L, "peak_flops");
        lua_rawget(L, -3);
        *bandwidth = lua_tonumber(L, -2);
        *peak = lua_tonumber(L, -1);
        lua_pop(L, 3);
        *name = "this machine";
    } else if (type == LUA_TSTRING) {
        const char* wanted = lua_tostring(L, -1);
        int count = 0;
        const device_model* devices = device_models(&count);
        const device_model* found = NULL;
        for (int i = 0; i < count && !found; i++)
            if (strcasestr(devices[i].name, wanted)) found = &devices[i];
        if (!found) lab_field_error(L, arg, "device", "no device '%s' (A100, H100, H200, L4, 4090, or \"machine\")", wanted);
        *bandwidth = found->bandwidth_bytes_per_s;
        *peak = int8 ? found->peak_int8_ops : found->peak_fp16_flops;
        *name = found->name;
    } else {
        lab_field_error(L, arg, "device", "expected a device name (\"H100\"), \"machine\" or {bandwidth=, peak_flops=}");
    }
    lua_pop(L, 1);
}

// ---- this machine ------------------------------------------------------------------------------

// lab.machine() -> the machine profile (lab/common/machine_profile.h): read
// from its cache once per lesson, or measured and cached when the cache is
// missing, stale or corrupt (the lesson is told why, in one line). Every
// lesson of a run, and every child of the fault matrix, judges against the
// same numbers: measured afresh per lesson, the ridge moved from 1.8 to 10.3
// FLOP/B within one run on a shared 2-core machine.
static int lab_machine(lua_State* L) {
    lab_api_state* l = lesson_api_state(lesson_of(L));
    if (!l->machine_known) {
        char note[1400];
        error_info err = {{0}};
        if (machine_profile_obtain(false, 0, &l->machine, &l->machine_origin, note, sizeof note, &err))
            return lab_error(L, "lab.machine: %s", err.message);
        if (note[0]) {
            char line[1500];
            snprintf(line, sizeof line, "note: %s", note);
            lesson_note(lesson_of(L), line);
        }
        l->machine_known = true;
    }
    const machine_profile* p = &l->machine;
    int64_t age_s = (int64_t)time(NULL) - p->measured_at_s;
    lua_createtable(L, 0, 24);
    lab_set_string(L, "name", "this machine (64 MiB stream read, fp16 matmul; 90th percentile of 101)");
    lab_set_string(L, "cpu_model", p->cpu_model);
    lab_set_integer(L, "threads", p->threads);
    lab_set_integer(L, "repeats", p->repeats);
    // The fast end of the samples is the hardware's figure (other programs
    // only ever slow a sample); the rest is the noise the measurement saw.
    lab_set_number(L, "bandwidth", p->bandwidth_bytes_per_s.percentile_90);
    lab_set_number(L, "bandwidth_p75", p->bandwidth_bytes_per_s.percentile_75);
    lab_set_number(L, "bandwidth_median", p->bandwidth_bytes_per_s.median);
    lab_set_number(L, "bandwidth_min", p->bandwidth_bytes_per_s.min);
    lab_set_number(L, "bandwidth_max", p->bandwidth_bytes_per_s.max);
    lab_set_number(L, "peak_flops", p->peak_flops.percentile_90);
    lab_set_number(L, "peak_flops_p75", p->peak_flops.percentile_75);
    lab_set_number(L, "peak_flops_median", p->peak_flops.median);
    lab_set_number(L, "peak_flops_min", p->peak_flops.min);
    lab_set_number(L, "peak_flops_max", p->peak_flops.max);
    lab_set_number(L, "peak_w4a8_flops", p->peak_w4a8_flops.percentile_90);
    lab_set_number(L, "peak_w4a8_flops_p75", p->peak_w4a8_flops.percentile_75);
    lab_set_number(L, "ridge", machine_profile_ridge(p));
    lab_set_number(L, "ridge_low", machine_profile_ridge_low(p));
    lab_set_number(L, "ridge_high", machine_profile_ridge_high(p));
    lab_set_integer(L, "age_s", (lua_Integer)(age_s > 0 ? age_s : 0));
    lab_set_string(L, "source", l->machine_origin == MACHINE_PROFILE_FROM_CACHE ? "cache" : "measured");
    lab_make_strict(L, -1, "lab.machine()");
    return 1;
}

void lab_open_perf_api(lua_State* L) {
    static const luaL_Reg functions[] = {{"time", lab_time},
                                         {"roofline", lab_roofline}, {"devices", lab_devices},
                                         {"machine", lab_machine},   {"median", lab_median},
                                         {"ratio_interval", lab_ratio_interval},
                                         {NULL, NULL}};
    luaL_setfuncs(L, functions, 0);
}
