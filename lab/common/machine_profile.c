// machine_profile: measured once, cached, re-measured when stale
// (lab/common/machine_profile.h says what makes it stale).
#include "lab/common/machine_profile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/sampler.h"
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

// ---- the key ------------------------------------------------------------------------------

// The first "model name" of /proc/cpuinfo, trimmed; "unknown" without one.
static void read_cpu_model(char* out, size_t capacity) {
    snprintf(out, capacity, "unknown");
    FILE* f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char* colon = strchr(line, ':');
        if (!colon) continue;
        const char* start = colon + 1;
        while (*start == ' ' || *start == '\t')
            start++;
        size_t n = strcspn(start, "\r\n");
        while (n > 0 && (start[n - 1] == ' ' || start[n - 1] == '\t'))
            n--;
        if (n == 0) continue;
        snprintf(out, capacity, "%.*s", (int)n, start);
        break;
    }
    fclose(f);
}

static int online_cores(void) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? (int)online : 1;
}

// thread_pool_create(0)'s count: one thread per online core, capped.
static int resolved_threads(int threads) {
    if (threads > 0) return threads;
    int cores = online_cores();
    return cores < THREAD_POOL_MAX_THREADS ? cores : THREAD_POOL_MAX_THREADS;
}

void machine_profile_current_key(machine_profile* key, int threads) {
    memset(key, 0, sizeof *key);
    key->format = MACHINE_PROFILE_FORMAT;
    read_cpu_model(key->cpu_model, sizeof key->cpu_model);
    key->cores = online_cores();
    key->threads = resolved_threads(threads);
}

// ---- measuring ------------------------------------------------------------------------------

static double wall_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

static int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

static measured_spread spread_of(double* samples, int n) {
    qsort(samples, (size_t)n, sizeof *samples, compare_doubles);
    double median = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
    // 101 samples: the 91st and 76th smallest (indices 90 and 75).
    return (measured_spread){samples[(9 * (n - 1)) / 10], samples[(3 * (n - 1)) / 4], median, samples[0],
                             samples[n - 1]};
}

typedef struct read_job {
    const uint64_t* data; // (n_words)
    size_t n_words;
    int n_tasks;
    uint64_t sums[THREAD_POOL_MAX_THREADS];
} read_job;

static void read_task(void* ctx, int task, int thread) {
    read_job* job = ctx;
    size_t chunk = job->n_words / (size_t)job->n_tasks;
    const uint64_t* p = job->data + (size_t)task * chunk;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= chunk; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        d += p[i + 3];
    }
    job->sums[thread] += a ^ b ^ c ^ d; // keeps the reads from being optimised away
}

// 64 MiB: twice a 32 MiB L3, so the stream comes from memory. 1024 x 1024
// fp16 weights times 128 rows: 128 FLOP per weight byte, far above any
// CPU's ridge, so the matmul measures arithmetic.
enum { STREAM_BYTES = 64 << 20, PEAK_ROWS = 1024, PEAK_COLS = 1024, PEAK_BATCH = 128 };

static measured_spread measure_bandwidth(uint64_t* data, thread_pool* pool) {
    for (size_t i = 0; i < STREAM_BYTES / 8; i++)
        data[i] = i;
    read_job job = {data, STREAM_BYTES / 8, (pool ? thread_pool_size(pool) : 1) * 4, {0}};
    double samples[MACHINE_PROFILE_REPEATS];
    for (int r = 0; r < MACHINE_PROFILE_REPEATS; r++) {
        double start = wall_seconds();
        if (pool)
            thread_pool_run(pool, job.n_tasks, read_task, &job);
        else
            for (int t = 0; t < job.n_tasks; t++)
                read_task(&job, t, 0);
        samples[r] = (double)STREAM_BYTES / (wall_seconds() - start);
    }
    return spread_of(samples, MACHINE_PROFILE_REPEATS);
}

// The engine's fp16 layout: the tiled copy beside the rows where the
// kernels read it (AVX-512), as model_storage.c gives every fp16 matrix.
static measured_spread measure_peak(const weight_matrix* w, const float* in, float* out, thread_pool* pool) {
    double samples[MACHINE_PROFILE_REPEATS];
    for (int r = 0; r < MACHINE_PROFILE_REPEATS; r++) {
        double start = wall_seconds();
        matmul_parallel(out, in, PEAK_BATCH, w, pool, NULL);
        samples[r] = 2.0 * PEAK_BATCH * PEAK_ROWS * PEAK_COLS / (wall_seconds() - start);
    }
    return spread_of(samples, MACHINE_PROFILE_REPEATS);
}

// W4A8 as model_quant.c packs it: symmetric 4-bit codes (nibble q + 8, q in
// [-7, 7]), one fp16 scale per 32 columns, int8 activations per 32 columns.
enum { W4A8_GROUP = 32 };

static int measure_peaks(machine_profile* out, float* in, float* result, thread_pool* pool) {
    uint16_t* weights = malloc((size_t)PEAK_ROWS * PEAK_COLS * sizeof *weights);
    uint16_t* tiles = malloc(matmul_f16_tile_halves(PEAK_ROWS, PEAK_COLS) * sizeof *tiles);
    uint8_t* nibbles = malloc((size_t)PEAK_ROWS * PEAK_COLS / 2);
    uint16_t* scales = malloc((size_t)PEAK_ROWS * (PEAK_COLS / W4A8_GROUP) * sizeof *scales);
    int status = weights && tiles && nibbles && scales ? 0 : -1;
    if (status == 0) {
        uint64_t rng = 7;
        for (size_t i = 0; i < (size_t)PEAK_ROWS * PEAK_COLS; i++)
            weights[i] = fp32_to_fp16(sampler_random_unit(&rng) - 0.5f);
        for (size_t i = 0; i < (size_t)PEAK_BATCH * PEAK_COLS; i++)
            in[i] = (float)((i % 17) * 0.01);
        weight_matrix f16 = {.dtype = WEIGHT_F16, .rows = PEAK_ROWS, .cols = PEAK_COLS, .values = weights};
        if (matmul_f16_tiles_used()) {
            matmul_f16_fill_tiles(tiles, &f16);
            f16.f16_tiles = tiles;
        }
        out->peak_flops = measure_peak(&f16, in, result, pool);
        for (size_t i = 0; i < (size_t)PEAK_ROWS * PEAK_COLS / 2; i++) {
            uint8_t low = (uint8_t)(1 + (int)(sampler_random_unit(&rng) * 14.99f));
            uint8_t high = (uint8_t)(1 + (int)(sampler_random_unit(&rng) * 14.99f));
            nibbles[i] = (uint8_t)(low | (high << 4));
        }
        for (size_t i = 0; i < (size_t)PEAK_ROWS * (PEAK_COLS / W4A8_GROUP); i++)
            scales[i] = fp32_to_fp16(0.01f);
        weight_matrix w4a8 = {.dtype = WEIGHT_I4,
                              .rows = PEAK_ROWS,
                              .cols = PEAK_COLS,
                              .group_size = W4A8_GROUP,
                              .values = nibbles,
                              .scales_f16 = scales,
                              .activation_bits = 8,
                              .activation_block = W4A8_GROUP};
        out->peak_w4a8_flops = measure_peak(&w4a8, in, result, pool);
    }
    free(weights);
    free(tiles);
    free(nibbles);
    free(scales);
    return status;
}

int machine_profile_measure(machine_profile* out, int threads, error_info* err) {
    machine_profile_current_key(out, threads);
    uint64_t* stream = malloc(STREAM_BYTES);
    float* in = malloc((size_t)PEAK_BATCH * PEAK_COLS * sizeof *in);
    float* result = malloc((size_t)PEAK_BATCH * PEAK_ROWS * sizeof *result);
    thread_pool* pool = NULL;
    int status = 0;
    if (!stream || !in || !result) {
        status = error_set(err, "machine profile: out of memory for the %d MiB stream buffer", STREAM_BYTES >> 20);
    } else if (thread_pool_create(out->threads, &pool)) {
        status = error_set(err, "machine profile: could not start %d threads", out->threads);
    } else {
        out->measured_at_s = (int64_t)time(NULL);
        out->repeats = MACHINE_PROFILE_REPEATS;
        out->bandwidth_bytes_per_s = measure_bandwidth(stream, pool);
        if (measure_peaks(out, in, result, pool))
            status = error_set(err, "machine profile: out of memory for the matmul's weights");
    }
    thread_pool_free(pool);
    free(stream);
    free(in);
    free(result);
    return status;
}

// ---- the cache file ------------------------------------------------------------------------

static const char PROFILE_FILE[] = "machine-profile.txt";
static const char PROFILE_MAGIC[] = "servelab-machine-profile";

int machine_profile_cache_path(char* path, size_t capacity, error_info* err) {
    const char* dir = getenv("SERVELAB_CACHE_DIR");
    int n;
    if (dir && dir[0])
        n = snprintf(path, capacity, "%s/%s", dir, PROFILE_FILE);
    else if ((dir = getenv("XDG_CACHE_HOME")) && dir[0])
        n = snprintf(path, capacity, "%s/servelab/%s", dir, PROFILE_FILE);
    else if ((dir = getenv("HOME")) && dir[0])
        n = snprintf(path, capacity, "%s/.cache/servelab/%s", dir, PROFILE_FILE);
    else
        return error_set(err, "no cache folder: none of SERVELAB_CACHE_DIR, XDG_CACHE_HOME and HOME is set");
    if (n < 0 || (size_t)n >= capacity) return error_set(err, "cache path too long (%d characters)", n);
    return 0;
}

static int write_profile(FILE* f, const machine_profile* p) {
    int n = fprintf(f,
                    "%s %d\ncpu_model %s\ncores %d\nthreads %d\nmeasured_at_s %lld\nrepeats %d\n"
                    "bandwidth_bytes_per_s %.17g %.17g %.17g %.17g %.17g\n"
                    "peak_flops %.17g %.17g %.17g %.17g %.17g\n"
                    "peak_w4a8_flops %.17g %.17g %.17g %.17g %.17g\nend\n",
                    PROFILE_MAGIC, p->format, p->cpu_model, p->cores, p->threads, (long long)p->measured_at_s,
                    p->repeats, p->bandwidth_bytes_per_s.percentile_90, p->bandwidth_bytes_per_s.percentile_75,
                    p->bandwidth_bytes_per_s.median, p->bandwidth_bytes_per_s.min, p->bandwidth_bytes_per_s.max,
                    p->peak_flops.percentile_90, p->peak_flops.percentile_75, p->peak_flops.median, p->peak_flops.min,
                    p->peak_flops.max, p->peak_w4a8_flops.percentile_90, p->peak_w4a8_flops.percentile_75,
                    p->peak_w4a8_flops.median, p->peak_w4a8_flops.min, p->peak_w4a8_flops.max);
    return n < 0 ? -1 : 0;
}

// mkdir -p of the folder that holds `path` (0700: it is one user's cache).
static int make_parent_folders(const char* path, error_info* err) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char* slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = '\0';
    for (char* p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(dir, 0700) && errno != EEXIST) return error_set(err, "%s: cannot create: %s", dir, strerror(errno));
        *p = '/';
    }
    if (mkdir(dir, 0700) && errno != EEXIST) return error_set(err, "%s: cannot create: %s", dir, strerror(errno));
    return 0;
}

int machine_profile_save(const char* path, const machine_profile* p, error_info* err) {
    if (make_parent_folders(path, err)) return -1;
    char temporary[1100];
    int n = snprintf(temporary, sizeof temporary, "%s.XXXXXX", path);
    if (n < 0 || (size_t)n >= sizeof temporary) return error_set(err, "%s: path too long", path);
    int fd = mkstemp(temporary);
    if (fd < 0) return error_set(err, "%s: cannot create a temporary file: %s", temporary, strerror(errno));
    FILE* f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(temporary);
        return error_set(err, "%s: %s", temporary, strerror(errno));
    }
    int failed = write_profile(f, p);
    failed |= fflush(f) != 0;
    failed |= fsync(fileno(f)) != 0;
    failed |= fclose(f) != 0;
    if (failed) {
        unlink(temporary);
        return error_set(err, "%s: write failed: %s", temporary, strerror(errno));
    }
    if (rename(temporary, path)) {
        int saved = errno;
        unlink(temporary);
        return error_set(err, "%s: cannot rename into place: %s", path, strerror(saved));
    }
    return 0;
}

// ---- reading it back, strictly -------------------------------------------------------------

typedef struct line_reader {
    FILE* f;
    int number;
    char text[512];
} line_reader;

// The next line, without its newline; -1 at the end or on a line too long.
static int next_line(line_reader* r) {
    if (!fgets(r->text, sizeof r->text, r->f)) return -1;
    r->number++;
    size_t n = strlen(r->text);
    if (n == 0 || r->text[n - 1] != '\n') return -1; // cut short, or longer than any line we write
    r->text[n - 1] = '\0';
    return 0;
}

// The rest of the line after "KEY ", or NULL.
static const char* value_of(const line_reader* r, const char* key) {
    size_t n = strlen(key);
    return strncmp(r->text, key, n) == 0 && r->text[n] == ' ' ? r->text + n + 1 : NULL;
}

static bool parse_whole_integer(const char* text, long long min_value, long long max_value, long long* out) {
    if (!text || !*text) return false;
    char* end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || *end != '\0' || v < min_value || v > max_value) return false;
    *out = v;
    return true;
}

// "P90 P75 MEDIAN MIN MAX", each positive and finite, with
// min <= median <= p75 <= p90 <= max.
static bool parse_spread(const char* text, measured_spread* out) {
    if (!text) return false;
    char* end = NULL;
    double v[5];
    const char* p = text;
    for (int i = 0; i < 5; i++) {
        errno = 0;
        v[i] = strtod(p, &end);
        if (errno || end == p || !isfinite(v[i]) || !(v[i] > 0.0)) return false;
        if (i < 4 && *end != ' ') return false;
        p = end;
    }
    if (*end != '\0' || !(v[3] <= v[2] && v[2] <= v[1] && v[1] <= v[0] && v[0] <= v[4])) return false;
    *out = (measured_spread){v[0], v[1], v[2], v[3], v[4]};
    return true;
}

static int parse_profile(FILE* f, machine_profile* p, error_info* why) {
    memset(p, 0, sizeof *p);
    line_reader r = {f, 0, {0}};
    long long v = 0;
#define EXPECT_LINE(what)                                                                                              \
    do {                                                                                                               \
        if (next_line(&r)) return error_set(why, "corrupt: line %d: expected %s, found the end", r.number + 1, what);  \
    } while (0)
    EXPECT_LINE("the header");
    if (!parse_whole_integer(value_of(&r, PROFILE_MAGIC), 0, 1000000, &v))
        return error_set(why, "corrupt: line 1: expected '%s VERSION'", PROFILE_MAGIC);
    p->format = (int)v;
    if (p->format != MACHINE_PROFILE_FORMAT)
        return error_set(why, "format %d, this build reads %d", p->format, MACHINE_PROFILE_FORMAT);
    EXPECT_LINE("'cpu_model NAME'");
    const char* model = value_of(&r, "cpu_model");
    if (!model || !*model || strlen(model) >= sizeof p->cpu_model)
        return error_set(why, "corrupt: line %d: expected 'cpu_model NAME'", r.number);
    snprintf(p->cpu_model, sizeof p->cpu_model, "%s", model);
    static const char* const integer_keys[] = {"cores", "threads", "measured_at_s", "repeats"};
    for (int k = 0; k < 4; k++) {
        EXPECT_LINE(integer_keys[k]);
        if (!parse_whole_integer(value_of(&r, integer_keys[k]), k == 2 ? 0 : 1, k == 2 ? INT64_MAX : 1000000, &v))
            return error_set(why, "corrupt: line %d: expected '%s N'", r.number, integer_keys[k]);
        if (k == 0) p->cores = (int)v;
        if (k == 1) p->threads = (int)v;
        if (k == 2) p->measured_at_s = (int64_t)v;
        if (k == 3) p->repeats = (int)v;
    }
    EXPECT_LINE("bandwidth_bytes_per_s");
    if (!parse_spread(value_of(&r, "bandwidth_bytes_per_s"), &p->bandwidth_bytes_per_s))
        return error_set(why,
                         "corrupt: line %d: expected 'bandwidth_bytes_per_s P90 P75 MEDIAN MIN MAX', positive, "
                         "in order",
                         r.number);
    EXPECT_LINE("peak_flops");
    if (!parse_spread(value_of(&r, "peak_flops"), &p->peak_flops))
        return error_set(why, "corrupt: line %d: expected 'peak_flops P90 P75 MEDIAN MIN MAX', positive, in order",
                         r.number);
    EXPECT_LINE("peak_w4a8_flops");
    if (!parse_spread(value_of(&r, "peak_w4a8_flops"), &p->peak_w4a8_flops))
        return error_set(why, "corrupt: line %d: expected 'peak_w4a8_flops P90 P75 MEDIAN MIN MAX', positive, in order",
                         r.number);
    EXPECT_LINE("'end'");
    if (strcmp(r.text, "end") != 0) return error_set(why, "corrupt: line %d: expected 'end'", r.number);
    if (fgetc(f) != EOF) return error_set(why, "corrupt: text after 'end' (line %d)", r.number + 1);
#undef EXPECT_LINE
    return 0;
}

int machine_profile_load(const char* path, const machine_profile* key, int64_t now_s, machine_profile* out,
                         error_info* why) {
    FILE* f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) return error_set(why, "no cached profile");
        return error_set(why, "cannot read it: %s", strerror(errno));
    }
    int status = parse_profile(f, out, why);
    fclose(f);
    if (status) return -1;
    if (strcmp(out->cpu_model, key->cpu_model) != 0)
        return error_set(why, "measured on CPU '%s', this is '%s'", out->cpu_model, key->cpu_model);
    if (out->cores != key->cores)
        return error_set(why, "measured with %d cores online, now %d", out->cores, key->cores);
    if (out->threads != key->threads)
        return error_set(why, "measured on %d threads, this asks for %d", out->threads, key->threads);
    if (out->repeats != MACHINE_PROFILE_REPEATS)
        return error_set(why, "%d repeats, this build measures %d", out->repeats, MACHINE_PROFILE_REPEATS);
    // A day of clock skew is allowed; a date beyond it is not this machine's.
    if (out->measured_at_s > now_s + 24 * 3600) return error_set(why, "measured in the future (clock changed?)");
    int64_t age_s = now_s - out->measured_at_s;
    if (age_s > MACHINE_PROFILE_MAX_AGE_S)
        return error_set(why, "measured %lld days ago (kept %d)", (long long)(age_s / 86400),
                         MACHINE_PROFILE_MAX_AGE_S / 86400);
    return 0;
}

int machine_profile_obtain(bool remeasure, int threads, machine_profile* out, machine_profile_origin* origin,
                           char* note, size_t note_capacity, error_info* err) {
    char path[1024];
    error_info path_err = {{0}}, why = {{0}};
    bool have_path = machine_profile_cache_path(path, sizeof path, &path_err) == 0;
    if (note_capacity) note[0] = '\0';
    machine_profile key;
    machine_profile_current_key(&key, threads);
    if (!remeasure && have_path && machine_profile_load(path, &key, (int64_t)time(NULL), out, &why) == 0) {
        *origin = MACHINE_PROFILE_FROM_CACHE;
        return 0;
    }
    if (machine_profile_measure(out, threads, err)) return -1;
    *origin = MACHINE_PROFILE_MEASURED;
    error_info save_err = {{0}};
    const char* reason = remeasure ? "asked to measure again" : have_path ? why.message : path_err.message;
    if (!have_path)
        snprintf(note, note_capacity, "machine profile measured (%s); not cached", reason);
    else if (machine_profile_save(path, out, &save_err))
        snprintf(note, note_capacity, "machine profile measured (%s); not cached: %s", reason, save_err.message);
    else
        snprintf(note, note_capacity, "machine profile measured (%s: %s); cached", path, reason);
    return 0;
}

double machine_profile_ridge(const machine_profile* p) {
    return p->peak_flops.percentile_90 / p->bandwidth_bytes_per_s.percentile_90;
}

double machine_profile_ridge_low(const machine_profile* p) {
    return p->peak_flops.percentile_75 / p->bandwidth_bytes_per_s.percentile_90;
}

double machine_profile_ridge_high(const machine_profile* p) {
    return p->peak_flops.percentile_90 / p->bandwidth_bytes_per_s.percentile_75;
}
