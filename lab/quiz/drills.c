#include "lab/quiz/drills.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/devices.h"
#include "engine/quant.h"
#include "lab/quiz/bank.h"

// ---- random numbers ---------------------------------------------------------------------

void quiz_rng_seed(quiz_rng* rng, uint64_t seed) { rng->state = seed; }

uint64_t quiz_rng_next(quiz_rng* rng) {
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int quiz_rng_int(quiz_rng* rng, int low, int high) {
    if (high <= low) return low;
    return low + (int)(quiz_rng_next(rng) % (uint64_t)(high - low + 1));
}

double quiz_rng_unit(quiz_rng* rng) { return (double)(quiz_rng_next(rng) >> 11) * 0x1.0p-53; }

static int pick(quiz_rng* rng, const int* values, int n) { return values[quiz_rng_int(rng, 0, n - 1)]; }

// ---- the drill table ----------------------------------------------------------------------

static const struct {
    const char* id;
    unsigned topics;
} DRILLS[QUIZ_DRILL_COUNT] = {
    {"drill-kv-size", QUIZ_TOPIC_BIT(QUIZ_TOPIC_KV_SIZING)},
    {"drill-blocks-needed", QUIZ_TOPIC_BIT(QUIZ_TOPIC_PAGED)},
    {"drill-tail-waste", QUIZ_TOPIC_BIT(QUIZ_TOPIC_PAGED)},
    {"drill-sequences-fit", QUIZ_TOPIC_BIT(QUIZ_TOPIC_KV_SIZING) | QUIZ_TOPIC_BIT(QUIZ_TOPIC_BATCHING)},
    {"drill-quant-scale", QUIZ_TOPIC_BIT(QUIZ_TOPIC_QUANTIZATION)},
    {"drill-quant-zero-point", QUIZ_TOPIC_BIT(QUIZ_TOPIC_QUANTIZATION)},
    {"drill-quant-code", QUIZ_TOPIC_BIT(QUIZ_TOPIC_QUANTIZATION)},
    {"drill-quant-rhat", QUIZ_TOPIC_BIT(QUIZ_TOPIC_QUANTIZATION)},
    {"drill-step-ratio", QUIZ_TOPIC_BIT(QUIZ_TOPIC_QUANTIZATION)},
    {"drill-decode-time", QUIZ_TOPIC_BIT(QUIZ_TOPIC_ROOFLINE)},
    {"drill-weight-bytes", QUIZ_TOPIC_BIT(QUIZ_TOPIC_QUANTIZATION)},
    // Speculation pays because decode is memory-bound: a roofline question.
    {"drill-spec-tokens-per-pass", QUIZ_TOPIC_BIT(QUIZ_TOPIC_ROOFLINE)},
    {"drill-spec-speedup", QUIZ_TOPIC_BIT(QUIZ_TOPIC_ROOFLINE)},
};

const char* quiz_drill_id(quiz_drill_kind kind) { return kind >= 0 && kind < QUIZ_DRILL_COUNT ? DRILLS[kind].id : "?"; }

int quiz_drill_parse_id(const char* id) {
    for (int k = 0; k < QUIZ_DRILL_COUNT; k++)
        if (strcmp(id, DRILLS[k].id) == 0) return k;
    return -1;
}

unsigned quiz_drill_topics(quiz_drill_kind kind) {
    return kind >= 0 && kind < QUIZ_DRILL_COUNT ? DRILLS[kind].topics : 0;
}

double quiz_device_memory_gib(const device_model* device) { return device->capacity_bytes / 1073741824.0; }

double quiz_kv_bytes_per_token(const quiz_model* m, bool grouped_query, int bytes_per_value) {
    double values = (double)quiz_model_kv_bytes_per_token(m, grouped_query, bytes_per_value);
    if (bytes_per_value != 1) return values;
    double heads = grouped_query ? m->n_kv_heads : m->n_heads;
    return values + 2.0 * m->n_layers * heads * 4.0; // engine/kv_memory.h: an FP32 scale per token and KV head
}

double quiz_weight_bytes(uint64_t n_params, quiz_weight_format format, int group_size) {
    double n = (double)n_params;
    if (format == QUIZ_WEIGHTS_FP16) return 2.0 * n;
    int bits = format == QUIZ_WEIGHTS_INT8 ? 8 : 4;
    return n * bits / 8.0 + 2.0 * n / (double)group_size;
}

quiz_decode_weights quiz_decode_weight_bytes(const quiz_model* m, quiz_weight_format format, int group_size) {
    quiz_decode_weights w;
    uint64_t d = (uint64_t)m->d_model, table = (uint64_t)m->vocab_size * d;
    w.norm_weights = (2 * (uint64_t)m->n_layers + 1) * d;
    // quiz_model_params counts the table once (tied) or twice (embedding and
    // output matrix). Per token the output matrix is read whole, and the
    // embedding gives one row of d_model weights.
    uint64_t untied_params = quiz_model_params(m) + (m->tied_embeddings ? table : 0);
    w.matrix_weights = untied_params - table + d - w.norm_weights;
    w.total_bytes = quiz_weight_bytes(w.matrix_weights, format, group_size) + 4.0 * (double)w.norm_weights;
    return w;
}

static const char* format_name(quiz_weight_format format) {
    return format == QUIZ_WEIGHTS_FP16 ? "FP16" : format == QUIZ_WEIGHTS_INT8 ? "INT8" : "INT4";
}

// ---- shared wording -----------------------------------------------------------------------

static int describe_model(const quiz_model* m, char* out, int capacity) {
    return snprintf(out, (size_t)capacity,
                    "%s (L = %d layers, d_model = %d, %d query heads, %d KV heads, head_dim = %d)", m->name,
                    m->n_layers, m->d_model, m->n_heads, m->n_kv_heads, m->head_dim);
}

// A byte answer, in a unit that keeps the number readable: GiB or GB
// (either family, drawn), MiB/MB below one of those.
static void set_bytes_answer(quiz_drill* d, double bytes, quiz_rng* rng) {
    bool binary = quiz_rng_int(rng, 0, 1) == 1;
    const char* unit = binary ? (bytes >= 1073741824.0 ? "GiB" : "MiB") : (bytes >= 1e9 ? "GB" : "MB");
    d->answer.value = bytes;
    d->answer.dim = QUIZ_DIM_BYTES;
    snprintf(d->answer.unit, sizeof d->answer.unit, "%s", unit);
    d->answer.rel_tolerance = 0.01;
    d->answer.abs_tolerance = 0;
}

static void set_plain_answer(quiz_drill* d, double value, quiz_dimension dim, const char* unit, double rel_tolerance,
                             double abs_tolerance) {
    d->answer.value = value;
    d->answer.dim = dim;
    snprintf(d->answer.unit, sizeof d->answer.unit, "%s", unit);
    d->answer.rel_tolerance = rel_tolerance;
    d->answer.abs_tolerance = abs_tolerance;
}

static const quiz_model* pick_model(const quiz_model_list* models, quiz_rng* rng, quiz_drill* d) {
    d->in.model = quiz_rng_int(rng, 0, models->n_models - 1);
    return &models->models[d->in.model];
}

// ---- KV sizing ----------------------------------------------------------------------------

static int generate_kv_size(const quiz_model_list* models, quiz_rng* rng, quiz_drill* d) {
    static const int BATCHES[] = {1, 2, 4, 8, 16, 32, 64, 128};
    static const int BYTES[] = {2, 2, 2, 1, 4}; // FP16 most often, then INT8 (with its scales) and FP32
    const quiz_model* m = pick_model(models, rng, d);
    d->in.batch = pick(rng, BATCHES, 8);
    // S in steps of 64 up to 8192, and never past the model's context (Llama-2: 4096).
    int max_steps = m->context_tokens / 64 < 128 ? m->context_tokens / 64 : 128;
    d->in.seq_len = quiz_rng_int(rng, 1, max_steps) * 64;
    d->in.bytes_per_value = pick(rng, BYTES, 5);
    bool has_gqa = m->n_kv_heads < m->n_heads;
    d->in.grouped_query = has_gqa ? quiz_rng_int(rng, 0, 1) == 1 : true;
    int heads = d->in.grouped_query ? m->n_kv_heads : m->n_heads;
    const bool int8 = d->in.bytes_per_value == 1;
    double bytes = quiz_kv_bytes_per_token(m, d->in.grouped_query, d->in.bytes_per_value) * d->in.batch * d->in.seq_len;
    set_bytes_answer(d, bytes, rng);
    char model[256];
    describe_model(m, model, sizeof model);
    const char* which = !has_gqa ? "It has no grouped-query attention: every head stores its K and V."
                        : d->in.grouped_query
                            ? "Count the KV heads it really stores (grouped-query attention)."
                            : "Suppose it had no grouped-query attention: all query heads store K and V.";
    char precision[160];
    if (int8)
        snprintf(precision, sizeof precision,
                 "INT8: 1 byte per value, plus one FP32 scale (4 bytes) per token, layer, K/V and head");
    else
        snprintf(precision, sizeof precision, "p = %d bytes per value (%s)", d->in.bytes_per_value,
                 d->in.bytes_per_value == 2 ? "FP16" : "FP32");
    snprintf(d->prompt, sizeof d->prompt,
             "KV cache size of %s for B = %d sequence%s of S = %d tokens, %s. %s Answer in %s.", model, d->in.batch,
             d->in.batch == 1 ? "" : "s", d->in.seq_len, precision, which, d->answer.unit);
    char shown[128], work[320];
    quiz_format_numeric(&d->answer, shown, sizeof shown);
    const char* width = d->in.grouped_query ? "n_kv_heads" : "n_heads";
    if (int8)
        snprintf(work, sizeof work,
                 "2 (K and V) x B x S x L x %s x (head_dim x 1 + 4) = 2 x %d x %d x %d x %d x (%d + 4) = %.0f bytes "
                 "(the scales add 4 / %d = %.1f%%)",
                 width, d->in.batch, d->in.seq_len, m->n_layers, heads, m->head_dim, bytes, m->head_dim,
                 400.0 / m->head_dim);
    else
        snprintf(work, sizeof work,
                 "2 (K and V) x B x S x L x %s x head_dim x p = 2 x %d x %d x %d x %d x %d x %d = %.0f bytes", width,
                 d->in.batch, d->in.seq_len, m->n_layers, heads, m->head_dim, d->in.bytes_per_value, bytes);
    snprintf(d->explanation, sizeof d->explanation, "%s = %s.%s", work, shown,
             has_gqa ? (d->in.grouped_query ? " Without GQA it would be n_heads / n_kv_heads times larger."
                                            : " With GQA it is n_heads / n_kv_heads times smaller.")
                     : "");
    return 0;
}

// ---- paged blocks -------------------------------------------------------------------------

static void draw_lengths(quiz_rng* rng, quiz_drill* d) {
    static const int BLOCK_SIZES[] = {8, 16, 16, 32, 64, 128};
    d->in.block_size = pick(rng, BLOCK_SIZES, 6);
    d->in.n_lengths = quiz_rng_int(rng, 2, 4);
    for (int i = 0; i < d->in.n_lengths; i++) {
        // One in four is an exact multiple of the block size (the edge case with no waste).
        if (quiz_rng_int(rng, 0, 3) == 0)
            d->in.lengths[i] = d->in.block_size * quiz_rng_int(rng, 1, 40);
        else
            d->in.lengths[i] = quiz_rng_int(rng, 1, 2000);
    }
}

static int list_lengths(const quiz_drill* d, char* out, int capacity) {
    int used = 0;
    for (int i = 0; i < d->in.n_lengths && used < capacity; i++)
        used += snprintf(out + used, (size_t)(capacity - used), "%s%d", i ? ", " : "", d->in.lengths[i]);
    return used;
}

static int generate_blocks(quiz_rng* rng, quiz_drill* d, bool waste) {
    draw_lengths(rng, d);
    long blocks = 0, empty = 0;
    char lengths[128], steps[512];
    int used = 0;
    list_lengths(d, lengths, sizeof lengths);
    for (int i = 0; i < d->in.n_lengths; i++) {
        long n = (d->in.lengths[i] + d->in.block_size - 1) / d->in.block_size;
        blocks += n;
        empty += n * d->in.block_size - d->in.lengths[i];
        if (used < (int)sizeof steps)
            used += snprintf(steps + used, sizeof steps - (size_t)used, "%s%d: %ld block%s, %ld empty", i ? "; " : "",
                             d->in.lengths[i], n, n == 1 ? "" : "s", n * d->in.block_size - d->in.lengths[i]);
    }
    set_plain_answer(d, (double)(waste ? empty : blocks), QUIZ_DIM_NUMBER, "", 0, 0);
    snprintf(d->prompt, sizeof d->prompt, "Paged KV cache with block_size = %d tokens. Requests hold %s tokens. %s",
             d->in.block_size, lengths,
             waste ? "How many slots of their last (tail) blocks are empty, in total?"
                   : "How many blocks do they hold, in total?");
    snprintf(d->explanation, sizeof d->explanation,
             "Each request needs ceil(length / %d) blocks and leaves blocks x %d - length slots empty: %s. "
             "Total %ld blocks, %ld empty slot%s (never more than block_size - 1 = %d per request).",
             d->in.block_size, d->in.block_size, steps, blocks, empty, empty == 1 ? "" : "s", d->in.block_size - 1);
    return 0;
}

// ---- memory fit -----------------------------------------------------------------------------

static int generate_sequences_fit(const quiz_model_list* models, quiz_rng* rng, quiz_drill* d, error_info* err) {
    static const int LENGTHS[] = {512, 1024, 2048, 4096, 8192, 16384}; // ascending
    int n_devices = 0;
    const device_model* devices = device_models(&n_devices);
    for (int attempt = 0; attempt < 200; attempt++) {
        const quiz_model* m = pick_model(models, rng, d);
        d->in.device = quiz_rng_int(rng, 0, n_devices - 1);
        int n_lengths = 0; // the lengths within the model's context (models.c: at least 512)
        while (n_lengths < 6 && LENGTHS[n_lengths] <= m->context_tokens)
            n_lengths++;
        d->in.seq_len = pick(rng, LENGTHS, n_lengths);
        d->in.bytes_per_value = 2;
        d->in.grouped_query = true;
        const device_model* g = &devices[d->in.device];
        uint64_t params = quiz_model_params(m);
        double weights = 2.0 * (double)params, capacity = g->capacity_bytes;
        double per_sequence = (double)quiz_model_kv_bytes_per_token(m, true, 2) * d->in.seq_len;
        double free_bytes = capacity - weights;
        if (free_bytes < per_sequence) continue; // the model does not fit with even one sequence: draw again
        double fit = floor(free_bytes / per_sequence);
        set_plain_answer(d, fit, QUIZ_DIM_NUMBER, "", 0, 1); // +-1: rounding N to 4 digits can move the floor
        char model[256];
        describe_model(m, model, sizeof model);
        snprintf(d->prompt, sizeof d->prompt,
                 "GPU: %s, %.0f GiB of memory (%.0f x 2^30 bytes). Model: %s, N = %.4f billion parameters in FP16 (2 "
                 "bytes each). The KV cache is FP16 too. How many sequences of S = %d tokens fit in the memory left "
                 "after the weights? (Ignore activations and other overhead.)",
                 g->name, quiz_device_memory_gib(g), quiz_device_memory_gib(g), model, (double)params / 1e9,
                 d->in.seq_len);
        snprintf(
            d->explanation, sizeof d->explanation,
            "Free = %.0f x 2^30 - 2 x %.0f = %.0f - %.0f = %.0f bytes. One sequence: 2 x L x n_kv_heads x head_dim "
            "x 2 bytes x S = 2 x %d x %d x %d x 2 x %d = %.0f bytes. floor(%.0f / %.0f) = %.0f sequence%s. "
            "(Reading %.0f GiB as %.0f x 10^9 bytes leaves out %.0f bytes.)",
            quiz_device_memory_gib(g), (double)params, capacity, weights, free_bytes, m->n_layers, m->n_kv_heads,
            m->head_dim, d->in.seq_len, per_sequence, free_bytes, per_sequence, fit, fit == 1 ? "" : "s",
            quiz_device_memory_gib(g), quiz_device_memory_gib(g), capacity - quiz_device_memory_gib(g) * 1e9);
        return 0;
    }
    return error_set(err, "drill-sequences-fit: no model fits on any device");
}

// ---- quantization ---------------------------------------------------------------------------

// Distance from x to the nearest rounding tie (k + 0.5).
static double distance_to_tie(double x) { return fabs(x - floor(x) - 0.5); }

static float two_decimals(double x) { return (float)(round(x * 100.0) / 100.0); }

// Rounding ties closer than this (in code units) are drawn again: a hand
// computation that carries s to 4 significant figures moves r / s by about
// 1e-4 of itself, 0.03 at the largest 8-bit codes.
#define QUIZ_TIE_MARGIN 0.05

// q by hand: clamp(round(r / s) + z) with x = r / s.
static double code_by_hand(double x, double z, int code_min, int code_max) {
    return fmin(fmax(round(x) + z, (double)code_min), (double)code_max);
}

// Whether a rounding near a tie can change the code: the clamp hides it
// when both neighbours saturate to the same end code.
static bool tie_decides(double x, double z, int code_min, int code_max) {
    if (distance_to_tie(x) >= QUIZ_TIE_MARGIN) return false;
    return code_by_hand(floor(x), z, code_min, code_max) != code_by_hand(ceil(x), z, code_min, code_max);
}

// Draws bits, a range and a value, and quantizes them with engine/quant.h,
// which rounds s UP to FP16 and then computes z, q and r_hat with that
// FP16 s. The worked answer uses that same s for z, q and r_hat, so that
// its numbers follow from one another and from the engine's. Draws where
// the unrounded s would give another z or q, or where z or q is within
// QUIZ_TIE_MARGIN of a tie, are drawn again: a student who keeps the
// unrounded s still gets the engine's z and q, and an r_hat within 2^-11
// of it. A third of the drills (not the zero-point one: z is 0 there) are
// symmetric: s = max(|r_min|, |r_max|) / (2^(b-1) - 1), q = clamp(round(r / s)).
static int draw_quantization(quiz_rng* rng, quiz_drill* d, quant_params* p, int32_t* code, float* r_hat) {
    static const int BITS[] = {2, 3, 4, 4, 4, 8, 8, 8};
    for (int attempt = 0; attempt < 1000; attempt++) {
        d->in.bits = pick(rng, BITS, 8);
        d->in.symmetric = d->kind != QUIZ_DRILL_QUANT_ZERO_POINT && quiz_rng_int(rng, 0, 2) == 0;
        d->in.range_min = two_decimals(-(0.05 + 3.95 * quiz_rng_unit(rng)));
        d->in.range_max = two_decimals(0.05 + 3.95 * quiz_rng_unit(rng));
        double width = (double)d->in.range_max - (double)d->in.range_min;
        double r = (double)d->in.range_min + width * quiz_rng_unit(rng);
        if (quiz_rng_int(rng, 0, 4) == 0) // one in five lies outside the range, to be clipped
            r = quiz_rng_int(rng, 0, 1) ? (double)d->in.range_max + 0.1 + 2.0 * quiz_rng_unit(rng)
                                        : (double)d->in.range_min - 0.1 - 2.0 * quiz_rng_unit(rng);
        d->in.value = (float)(round(r * 1000.0) / 1000.0);
        *p = quant_params_for_range(d->in.range_min, d->in.range_max, d->in.bits, d->in.symmetric);
        const double s = (double)p->scale; // FP16, the s of every step below
        const double value = (double)d->in.value;
        int code_min = quant_code_min(d->in.bits, d->in.symmetric);
        int code_max = quant_code_max(d->in.bits, d->in.symmetric);
        double s_exact =
            d->in.symmetric ? fmax(-(double)d->in.range_min, (double)d->in.range_max) / code_max : width / code_max;
        double z_hand = 0, z_exact = 0;
        if (!d->in.symmetric) {
            double zero = -(double)d->in.range_min;
            if (distance_to_tie(zero / s) < QUIZ_TIE_MARGIN || distance_to_tie(zero / s_exact) < QUIZ_TIE_MARGIN)
                continue;
            z_hand = round(zero / s);
            z_exact = round(zero / s_exact);
            if (z_hand != z_exact) continue;
        }
        if (tie_decides(value / s, z_hand, code_min, code_max) ||
            tie_decides(value / s_exact, z_exact, code_min, code_max))
            continue;
        double q_hand = code_by_hand(value / s, z_hand, code_min, code_max);
        if (q_hand != code_by_hand(value / s_exact, z_exact, code_min, code_max)) continue;
        *code = quant_quantize(d->in.value, p, d->in.bits, d->in.symmetric, NULL);
        *r_hat = quant_dequantize(*code, p);
        if ((double)p->zero_point != z_hand || (double)*code != q_hand) continue;
        return 0;
    }
    return -1;
}

static int generate_quantization(quiz_rng* rng, quiz_drill* d, error_info* err) {
    quant_params p;
    int32_t code = 0;
    float r_hat = 0;
    if (draw_quantization(rng, d, &p, &code, &r_hat))
        return error_set(err, "%s: no draw agreed with the engine's quantizer", quiz_drill_id(d->kind));
    const bool sym = d->in.symmetric;
    int code_min = quant_code_min(d->in.bits, sym), code_max = quant_code_max(d->in.bits, sym);
    double magnitude = fmax(-(double)d->in.range_min, (double)d->in.range_max);
    double s_exact = sym ? magnitude / code_max : ((double)d->in.range_max - (double)d->in.range_min) / code_max;
    // Symmetric codes cover [-max|r|, max|r|], asymmetric ones [r_min, r_max].
    bool clipped =
        sym ? fabs((double)d->in.value) > magnitude : d->in.value < d->in.range_min || d->in.value > d->in.range_max;
    const char* asked = "";
    char code_note[96];
    if (clipped)
        snprintf(code_note, sizeof code_note, ", clamped to q = %d (r lies outside the range)", (int)code);
    else
        snprintf(code_note, sizeof code_note, ", so q = %d", (int)code);
    switch (d->kind) {
    case QUIZ_DRILL_QUANT_SCALE:
        set_plain_answer(d, (double)p.scale, QUIZ_DIM_NUMBER, "", 0.01, 0);
        asked = "the step size s";
        break;
    case QUIZ_DRILL_QUANT_ZERO_POINT:
        set_plain_answer(d, (double)p.zero_point, QUIZ_DIM_NUMBER, "", 0, 0);
        asked = "the zero-point z";
        break;
    case QUIZ_DRILL_QUANT_CODE:
        set_plain_answer(d, (double)code, QUIZ_DIM_NUMBER, "", 0, 0);
        asked = "the stored code q";
        break;
    default:
        // r_hat can be 0 (q = z); a fifth of a step absolute still tells a wrong code (a whole step away).
        set_plain_answer(d, (double)r_hat, QUIZ_DIM_NUMBER, "", 0.01, 0.2 * (double)p.scale);
        asked = "the recovered value r_hat";
        break;
    }
    snprintf(d->prompt, sizeof d->prompt,
             "%s %d-bit quantization (codes %d to %d%s) of the range [r_min, r_max] = [%.2f, %.2f]. For the "
             "real value r = %.3f, what is %s?",
             sym ? "Symmetric" : "Asymmetric", d->in.bits, code_min, code_max, sym ? ", z = 0" : "",
             (double)d->in.range_min, (double)d->in.range_max, (double)d->in.value, asked);
    // Every step below uses the FP16 s, as the engine does.
    const double s = (double)p.scale, value = (double)d->in.value;
    if (sym)
        snprintf(d->explanation, sizeof d->explanation,
                 "s = max(|r_min|, |r_max|) / (2^%d - 1) = %.4f / %d = %.6g; the engine stores s in FP16, rounded "
                 "up, so s = %.6g from here on. z = 0. q = clamp(round(r / s), %d, %d): round(%.4f) = %.0f%s. "
                 "r_hat = s q = %.6g x %d = %.6g. (With the unrounded s, q is the same.)",
                 d->in.bits - 1, magnitude, code_max, s_exact, s, code_min, code_max, value / s, round(value / s),
                 code_note, s, code, (double)r_hat);
    else
        snprintf(d->explanation, sizeof d->explanation,
                 "s = (r_max - r_min) / (2^%d - 1) = %.4f / %d = %.6g; the engine stores s in FP16, rounded up, so "
                 "s = %.6g from here on. z = round(-r_min / s) = round(%.4f) = %d. q = clamp(round(r / s) + z, 0, "
                 "%d): round(%.4f) + %d = %.0f%s. r_hat = s (q - z) = %.6g x %d = %.6g. (With the unrounded s, z "
                 "and q are the same.)",
                 d->in.bits, (double)d->in.range_max - (double)d->in.range_min, code_max, s_exact, s,
                 -(double)d->in.range_min / s, p.zero_point, code_max, value / s, p.zero_point,
                 round(value / s) + p.zero_point, code_note, s, code - p.zero_point, (double)r_hat);
    return 0;
}

static int generate_step_ratio(quiz_rng* rng, quiz_drill* d) {
    if (quiz_rng_int(rng, 0, 9) < 6) { // INT4 against INT8 most of the time: the pair the bank asks about
        d->in.low_bits = 4;
        d->in.bits = 8;
    } else {
        d->in.low_bits = quiz_rng_int(rng, 2, 7);
        d->in.bits = quiz_rng_int(rng, d->in.low_bits + 1, 8);
    }
    double high_levels = (double)((1 << d->in.bits) - 1), low_levels = (double)((1 << d->in.low_bits) - 1);
    set_plain_answer(d, high_levels / low_levels, QUIZ_DIM_RATIO, "x", 0.01, 0);
    snprintf(d->prompt, sizeof d->prompt,
             "The same range is quantized with %d bits and with %d bits (asymmetric, min/max range). How many times "
             "larger is the %d-bit step s than the %d-bit step? Answer as a ratio (x).",
             d->in.low_bits, d->in.bits, d->in.low_bits, d->in.bits);
    snprintf(d->explanation, sizeof d->explanation,
             "s = (r_max - r_min) / (2^b - 1), so the ratio is (2^%d - 1) / (2^%d - 1) = %.0f / %.0f = %.4gx: the "
             "number of gaps, not the number of bits, sets the step.",
             d->in.bits, d->in.low_bits, high_levels, low_levels, high_levels / low_levels);
    return 0;
}

// ---- weights and the roofline ---------------------------------------------------------------

static void draw_weight_format(quiz_rng* rng, quiz_drill* d) {
    static const int GROUPS[] = {32, 64, 128, 128};
    d->in.format = (quiz_weight_format)quiz_rng_int(rng, 0, 2);
    d->in.group_size = d->in.format == QUIZ_WEIGHTS_FP16 ? 0 : pick(rng, GROUPS, 4);
}

static int describe_weights(const quiz_drill* d, char* out, int capacity) {
    if (d->in.format == QUIZ_WEIGHTS_FP16) return snprintf(out, (size_t)capacity, "FP16 (2 bytes per weight)");
    return snprintf(out, (size_t)capacity, "%s with one FP16 scale (2 bytes) per group of %d weights",
                    format_name(d->in.format), d->in.group_size);
}

static int explain_weight_bytes(const quiz_drill* d, uint64_t params, double bytes, char* out, int capacity) {
    if (d->in.format == QUIZ_WEIGHTS_FP16)
        return snprintf(out, (size_t)capacity, "2 x %.0f = %.0f bytes", (double)params, bytes);
    return snprintf(out, (size_t)capacity, "%.0f x %d / 8 + 2 x %.0f / %d = %.0f bytes", (double)params,
                    d->in.format == QUIZ_WEIGHTS_INT8 ? 8 : 4, (double)params, d->in.group_size, bytes);
}

static int generate_weight_bytes(const quiz_model_list* models, quiz_rng* rng, quiz_drill* d) {
    const quiz_model* m = pick_model(models, rng, d);
    draw_weight_format(rng, d);
    uint64_t params = quiz_model_params(m);
    double bytes = quiz_weight_bytes(params, d->in.format, d->in.group_size);
    set_bytes_answer(d, bytes, rng);
    char weights[128], model[256], work[256], shown[128];
    describe_weights(d, weights, sizeof weights);
    describe_model(m, model, sizeof model);
    explain_weight_bytes(d, params, bytes, work, sizeof work);
    quiz_format_numeric(&d->answer, shown, sizeof shown);
    snprintf(d->prompt, sizeof d->prompt,
             "%s has N = %.4f billion parameters. How many bytes do its weights take in %s? Answer in %s.", model,
             (double)params / 1e9, weights, d->answer.unit);
    snprintf(d->explanation, sizeof d->explanation, "%s = %s.%s", work, shown,
             d->in.format == QUIZ_WEIGHTS_FP16 ? "" : " The scales add 2 / group_size bytes per weight.");
    return 0;
}

// The worked answer names each part the engine counts, so that a student
// who counted the whole embedding table sees where the difference is
// (Qwen2.5-7B: 152064 x 3584 = 545M weights, 7.7% of its INT4 bytes).
static int generate_decode_time(const quiz_model_list* models, quiz_rng* rng, quiz_drill* d, error_info* err) {
    int n_devices = 0;
    const device_model* devices = device_models(&n_devices);
    for (int attempt = 0; attempt < 200; attempt++) {
        const quiz_model* m = pick_model(models, rng, d);
        draw_weight_format(rng, d);
        d->in.device = quiz_rng_int(rng, 0, n_devices - 1);
        const device_model* g = &devices[d->in.device];
        uint64_t params = quiz_model_params(m);
        if (quiz_weight_bytes(params, d->in.format, d->in.group_size) > g->capacity_bytes)
            continue; // the weights do not fit on one device: draw again
        quiz_decode_weights read = quiz_decode_weight_bytes(m, d->in.format, d->in.group_size);
        double ms = read.total_bytes / g->bandwidth_bytes_per_s * 1e3;
        set_plain_answer(d, ms, QUIZ_DIM_TIME, "ms", 0.01, 0);
        char weights[128], rate[128];
        describe_weights(d, weights, sizeof weights);
        if (d->in.format == QUIZ_WEIGHTS_FP16)
            snprintf(rate, sizeof rate, "2 x %.0f", (double)read.matrix_weights);
        else
            snprintf(rate, sizeof rate, "%.0f x %d / 8 + 2 x %.0f / %d", (double)read.matrix_weights,
                     d->in.format == QUIZ_WEIGHTS_INT8 ? 8 : 4, (double)read.matrix_weights, d->in.group_size);
        // Prompt and worked answer together fit the quiz's 80x24 screen (15 rows of 76 columns).
        snprintf(d->prompt, sizeof d->prompt,
                 "Batch-1 decode of %s (N = %.4f billion parameters, d_model = %d, vocabulary %d, %s; weights in %s) "
                 "on one %s, %.0f GB/s. Count the weight bytes one token reads (the embedding is a lookup: how much of "
                 "it does a token touch?), not the KV cache or activations. Lower bound on the time per token, in ms?",
                 m->name, (double)params / 1e9, m->d_model, m->vocab_size,
                 m->tied_embeddings ? "output matrix tied to the embedding" : "untied output matrix", weights, g->name,
                 g->bandwidth_bytes_per_s / 1e9);
        char read_weights[160];
        if (m->tied_embeddings) // the output matrix is the table, read whole; the lookup reads one row again
            snprintf(read_weights, sizeof read_weights, "the tied output matrix whole, plus one looked-up row: N + %d",
                     m->d_model);
        else
            snprintf(read_weights, sizeof read_weights,
                     "every layer matrix and the output matrix, but one row of the %d x %d embedding: N - %d x %d + %d",
                     m->vocab_size, m->d_model, m->vocab_size, m->d_model, m->d_model);
        char whole_table[64] = "";
        if (!m->tied_embeddings) {
            double skipped_rows = (double)(m->vocab_size - 1) * m->d_model;
            snprintf(whole_table, sizeof whole_table, " The whole table would add %.1f%%.",
                     100.0 * quiz_weight_bytes((uint64_t)skipped_rows, d->in.format, d->in.group_size) /
                         read.total_bytes);
        }
        snprintf(d->explanation, sizeof d->explanation,
                 "Per token: %s = %.0f weights; (2 x %d + 1) x %d = %.0f are norm gains in FP32 (4 bytes), %.0f are "
                 "%s: %s + 4 x %.0f = %.0f bytes. / %.4g B/s = %.4g ms (%.0f tokens/s).%s",
                 read_weights, (double)(read.matrix_weights + read.norm_weights), m->n_layers, m->d_model,
                 (double)read.norm_weights, (double)read.matrix_weights, format_name(d->in.format), rate,
                 (double)read.norm_weights, read.total_bytes, g->bandwidth_bytes_per_s, ms, 1e3 / ms, whole_table);
        return 0;
    }
    return error_set(err, "drill-decode-time: no model fits on any device");
}

// ---- speculative decoding ------------------------------------------------------------------

double quiz_spec_tokens_per_target_pass(double acceptance, int draft_tokens) {
    if (acceptance >= 1.0) return draft_tokens + 1.0; // every draft accepted, plus the bonus token
    return (1.0 - pow(acceptance, draft_tokens + 1)) / (1.0 - acceptance);
}

double quiz_spec_speedup(double acceptance, int draft_tokens, double draft_cost_ratio) {
    return quiz_spec_tokens_per_target_pass(acceptance, draft_tokens) / (draft_tokens * draft_cost_ratio + 1.0);
}

// A speculative answer is graded within 1%; a draw where a usual mistake
// lands within 3% of the answer (so a student who rounds the mistake to
// three digits might pass) is drawn again. At k = 1 the linear mistake
// 1 + k a equals the true 1 + a, so k starts at 2.
enum { SPEC_MISTAKES = 5 };
static const double SPEC_TOLERANCE = 0.01, SPEC_MISTAKE_MARGIN = 0.03;

static void spec_mistakes(const quiz_drill* d, double out[SPEC_MISTAKES]) {
    const double a = d->in.acceptance, c = d->in.draft_cost_ratio;
    const int k = d->in.draft_tokens;
    const double tokens = quiz_spec_tokens_per_target_pass(a, k);
    if (d->kind == QUIZ_DRILL_SPEC_TOKENS) {
        out[0] = 1.0 + k * a;                   // drafts accepted independently: a rejection keeps the rest
        out[1] = (1.0 - pow(a, k)) / (1.0 - a); // the sum stopped at a^(k-1): no bonus after k acceptances
        out[2] = tokens - 1.0;                  // drafted tokens only, not the target's own token
        out[3] = k + 1.0;                       // every draft accepted
        out[4] = 1.0 / (1.0 - a);               // the infinite-k limit
    } else {
        out[0] = tokens;                        // the draft's cost left out
        out[1] = tokens / (k * c);              // the target's own pass left out
        out[2] = tokens / ((k + 1) * c + 1.0);  // k + 1 draft passes
        out[3] = (1.0 + k * a) / (k * c + 1.0); // the linear tokens per pass
        out[4] = tokens / (c + 1.0);            // one draft pass for all k tokens
    }
}

static int generate_speculative(quiz_rng* rng, quiz_drill* d, error_info* err) {
    static const int DRAFT_TOKENS[] = {2, 3, 4, 4, 5, 6, 8}; // vLLM and llama.cpp default to a few: 4 most often
    for (int attempt = 0; attempt < 1000; attempt++) {
        d->in.acceptance = quiz_rng_int(rng, 40, 95) / 100.0;
        d->in.draft_tokens = pick(rng, DRAFT_TOKENS, 7);
        // c: 0.02 (a draft model 50x smaller) to 0.60 (a draft that costs most of a target pass, where
        // speculation tends to lose); a W4A16 g32 copy of an FP16 target reads about 0.28 of its bytes.
        d->in.draft_cost_ratio = d->kind == QUIZ_DRILL_SPEC_SPEEDUP ? quiz_rng_int(rng, 2, 60) / 100.0 : 0;
        double answer = d->kind == QUIZ_DRILL_SPEC_TOKENS
                            ? quiz_spec_tokens_per_target_pass(d->in.acceptance, d->in.draft_tokens)
                            : quiz_spec_speedup(d->in.acceptance, d->in.draft_tokens, d->in.draft_cost_ratio);
        double mistakes[SPEC_MISTAKES];
        spec_mistakes(d, mistakes);
        bool close = false;
        for (int i = 0; i < SPEC_MISTAKES; i++)
            close = close || fabs(mistakes[i] - answer) <= SPEC_MISTAKE_MARGIN * answer;
        if (close) continue;
        if (d->kind == QUIZ_DRILL_SPEC_TOKENS)
            set_plain_answer(d, answer, QUIZ_DIM_NUMBER, "", SPEC_TOLERANCE, 0);
        else
            set_plain_answer(d, answer, QUIZ_DIM_RATIO, "x", SPEC_TOLERANCE, 0);
        const double a = d->in.acceptance, c = d->in.draft_cost_ratio;
        const int k = d->in.draft_tokens;
        const double tokens = quiz_spec_tokens_per_target_pass(a, k);
        char setting[512];
        snprintf(setting, sizeof setting,
                 "Speculative decoding: a draft proposes k = %d tokens and the target checks them all in one pass. "
                 "Each drafted token is accepted with chance a = %.2f, independently; the first rejection throws "
                 "away the drafts after it, and the target's pass always adds one token of its own (the correction, "
                 "or a bonus token when all k are accepted).",
                 k, a);
        char sum[256];
        snprintf(sum, sizeof sum,
                 "Token i of the draft counts only if drafts 1..i are all accepted (chance a^i), so a target pass "
                 "yields 1 + a + ... + a^%d = (1 - %.2f^%d) / (1 - %.2f) = %.4g tokens",
                 k, a, k + 1, a, tokens);
        if (d->kind == QUIZ_DRILL_SPEC_TOKENS) {
            snprintf(d->prompt, sizeof d->prompt, "%s How many tokens does one target pass yield, on average?",
                     setting);
            snprintf(d->explanation, sizeof d->explanation,
                     "%s. Not 1 + k a = %.4g: that would keep drafted tokens after a rejection.", sum, 1.0 + k * a);
        } else {
            double cost = k * c + 1.0;
            snprintf(d->prompt, sizeof d->prompt,
                     "%s One draft pass costs c = %.2f of a target pass, and each round is one target pass plus k "
                     "draft passes. How many times faster than plain decode (one token per target pass) is it? "
                     "Answer as a ratio (x); below 1 means slower.",
                     setting, c);
            snprintf(d->explanation, sizeof d->explanation,
                     "%s. A round costs k c + 1 = %d x %.2f + 1 = %.4g target passes, so the speedup is %.4g / %.4g "
                     "= %.4gx%s.",
                     sum, k, c, cost, tokens, cost, tokens / cost,
                     tokens / cost < 1 ? ": slower than plain decode, the draft costs more than it saves" : "");
        }
        return 0;
    }
    return error_set(err, "%s: every draw put a usual mistake within %.0f%% of the answer", quiz_drill_id(d->kind),
                     100 * SPEC_MISTAKE_MARGIN);
}

int quiz_drill_generate(quiz_drill_kind kind, const quiz_model_list* models, quiz_rng* rng, quiz_drill* out,
                        error_info* err) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->in.model = -1;
    out->in.device = -1;
    if (!models || models->n_models < 1) return error_set(err, "%s: no model shapes loaded", quiz_drill_id(kind));
    switch (kind) {
    case QUIZ_DRILL_KV_SIZE: return generate_kv_size(models, rng, out);
    case QUIZ_DRILL_BLOCKS_NEEDED: return generate_blocks(rng, out, false);
    case QUIZ_DRILL_TAIL_WASTE: return generate_blocks(rng, out, true);
    case QUIZ_DRILL_SEQUENCES_FIT: return generate_sequences_fit(models, rng, out, err);
    case QUIZ_DRILL_QUANT_SCALE:
    case QUIZ_DRILL_QUANT_ZERO_POINT:
    case QUIZ_DRILL_QUANT_CODE:
    case QUIZ_DRILL_QUANT_RHAT: return generate_quantization(rng, out, err);
    case QUIZ_DRILL_STEP_RATIO: return generate_step_ratio(rng, out);
    case QUIZ_DRILL_DECODE_TIME: return generate_decode_time(models, rng, out, err);
    case QUIZ_DRILL_WEIGHT_BYTES: return generate_weight_bytes(models, rng, out);
    case QUIZ_DRILL_SPEC_TOKENS:
    case QUIZ_DRILL_SPEC_SPEEDUP: return generate_speculative(rng, out, err);
    default: return error_set(err, "unknown drill kind %d", (int)kind);
    }
}
