#include "engine/model_synth.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "engine/model_storage.h"
#include "kernels/cpu/fp16.h"

// Parameter counts below are for the byte-level vocabulary (259 tokens).
static const synth_preset PRESETS[] = {
    {"tiny", "~0.1M parameters (2 layers, dim 64): fits in L2, for fast tests",
     {.dim = 64, .hidden_dim = 176, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .max_seq_len = 256}},
    {"small", "~14M parameters (9 layers, dim 384), about stories15M: ~27 MiB in fp16, fits in a 32 MiB L3",
     {.dim = 384, .hidden_dim = 1024, .n_layers = 9, .n_heads = 6, .n_kv_heads = 2, .max_seq_len = 512}},
    {"medium", "~100M parameters (16 layers, dim 768): ~192 MiB in fp16, decode is memory-bound",
     {.dim = 768, .hidden_dim = 2048, .n_layers = 16, .n_heads = 12, .n_kv_heads = 4, .max_seq_len = 1024}},
    {"large", "~1B parameters (22 layers, dim 2048, TinyLlama's shape): ~1.8 GiB in fp16",
     {.dim = 2048, .hidden_dim = 5632, .n_layers = 22, .n_heads = 32, .n_kv_heads = 4, .max_seq_len = 2048}},
    // The benchmark shape: llama2.c's stories110M (the model llama.cpp's and
    // llama2.c's CPU figures are quoted for), with its 32000-token vocabulary
    // so that the classifier streams the same bytes per token.
    {"stories110m", "~110M parameters (12 layers, dim 768, 12 heads, vocab 32000): stories110M's shape, the benchmark model",
     {.dim = 768, .hidden_dim = 2048, .n_layers = 12, .n_heads = 12, .n_kv_heads = 12, .vocab_size = 32000,
      .max_seq_len = 1024}},
    {NULL, NULL, {0}},
};

const synth_preset* synth_presets(void) { return PRESETS; }

// ---- variants with another number of KV heads ---------------------------------

// "small:kv6" is small with 6 KV heads: its multi-head twin (n_kv_heads =
// n_heads), where the KV cache is 2 x L x d_model wide per token, beside
// the grouped-query preset's 2 x L x n_kv_heads x head_dim. Every divisor
// of a preset's query heads is a variant; all are made once, up front, so
// that the returned pointers stay valid and no caller ever writes them.
#define SYNTH_MAX_VARIANTS 64 // the presets' head counts (4, 6, 12, 32, 12) have 27 divisors in all

static synth_preset variants[SYNTH_MAX_VARIANTS];
static char variant_names[SYNTH_MAX_VARIANTS][32];
static char variant_summaries[SYNTH_MAX_VARIANTS][64];
static int n_variants;
static pthread_once_t variants_made = PTHREAD_ONCE_INIT;

static void make_variants(void) {
    for (const synth_preset* p = PRESETS; p->name; p++)
        for (int kv_heads = 1; kv_heads <= p->shape.n_heads && n_variants < SYNTH_MAX_VARIANTS; kv_heads++) {
            if (p->shape.n_heads % kv_heads != 0) continue;
            synth_preset* v = &variants[n_variants];
            snprintf(variant_names[n_variants], sizeof variant_names[n_variants], "%s:kv%d", p->name, kv_heads);
            snprintf(variant_summaries[n_variants], sizeof variant_summaries[n_variants],
                     "%s with %d KV heads for its %d query heads", p->name, kv_heads, p->shape.n_heads);
            *v = *p;
            v->name = variant_names[n_variants];
            v->summary = variant_summaries[n_variants];
            v->shape.n_kv_heads = kv_heads;
            n_variants++;
        }
}

const synth_preset* synth_find_preset(const char* name) {
    for (const synth_preset* p = PRESETS; p->name; p++)
        if (strcmp(p->name, name) == 0) return p;
    if (!strstr(name, ":kv")) return NULL;
    pthread_once(&variants_made, make_variants);
    for (int i = 0; i < n_variants; i++)
        if (strcmp(variants[i].name, name) == 0) return &variants[i];
    return NULL;
}

// ---- a deterministic normal generator per tensor ---------------------------

typedef struct normal_stream {
    uint64_t state;     // splitmix64 state
    bool has_spare;
    float spare;        // second value of the last Box-Muller pair
} normal_stream;

static uint64_t splitmix64(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static normal_stream stream_for_tensor(uint64_t seed, uint64_t tensor_index) {
    normal_stream stream = {seed ^ (tensor_index * 0xD1B54A32D192ED03ull), false, 0.0f};
    splitmix64(&stream.state); // decorrelate neighbouring tensor indices
    return stream;
}

// Uniform in (0, 1]: 53 random bits, never 0 so that log() is finite.
static double uniform_open(normal_stream* stream) {
    return ((double)(splitmix64(&stream->state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static float next_normal(normal_stream* stream) {
    if (stream->has_spare) {
        stream->has_spare = false;
        return stream->spare;
    }
    double radius = sqrt(-2.0 * log(uniform_open(stream)));
    double angle = 6.283185307179586 * uniform_open(stream);
    stream->spare = (float)(radius * sin(angle));
    stream->has_spare = true;
    return (float)(radius * cos(angle));
}

// ---- filling tensors -------------------------------------------------------

static void store_value(const weight_matrix* w, size_t index, float value) {
    if (w->dtype == WEIGHT_F32)
        ((float*)w->values)[index] = value;
    else
        ((uint16_t*)w->values)[index] = fp32_to_fp16(value);
}

// scratch: (rows + cols) floats for the per-channel gains.
static void fill_matrix(const weight_matrix* w, uint64_t seed, uint64_t tensor_index, float* scratch) {
    normal_stream stream = stream_for_tensor(seed, tensor_index);
    float* row_gain = scratch;          // (rows)
    float* column_gain = scratch + w->rows; // (cols)
    for (int o = 0; o < w->rows; o++) row_gain[o] = expf(0.25f * next_normal(&stream));
    for (int i = 0; i < w->cols; i++) column_gain[i] = expf(0.25f * next_normal(&stream));
    int n_outliers = w->cols / 200 > 0 ? w->cols / 200 : 1; // 0.5% of input channels
    for (int k = 0; k < n_outliers; k++) {
        int channel = (int)(splitmix64(&stream.state) % (uint64_t)w->cols);
        column_gain[channel] *= 10.0f + 10.0f * (float)uniform_open(&stream);
    }
    float sigma = 1.0f / sqrtf((float)w->cols);
    for (int o = 0; o < w->rows; o++)
        for (int i = 0; i < w->cols; i++)
            store_value(w, (size_t)o * (size_t)w->cols + (size_t)i,
                        next_normal(&stream) * sigma * row_gain[o] * column_gain[i]);
}

static void fill_norm(const float* gains, int size, uint64_t seed, uint64_t tensor_index) {
    normal_stream stream = stream_for_tensor(seed, tensor_index);
    for (int i = 0; i < size; i++) ((float*)gains)[i] = fabsf(1.0f + 0.1f * next_normal(&stream));
}

int model_synthesize(model* out, const char* name, int vocab_size, model_dtype_choice dtype_choice, uint64_t seed,
                     error_info* err) {
    memset(out, 0, sizeof *out);
    const synth_preset* preset = synth_find_preset(name);
    if (!preset)
        return error_set(err, "%s: not a file and not a preset (tiny, small, medium, large, stories110m)", name);
    model_config config = preset->shape;
    if (config.vocab_size == 0) config.vocab_size = vocab_size; // else the preset fixes it
    config.shared_classifier = true;
    if (model_config_validate(&config, name, err)) return -1;
    weight_dtype dtype = dtype_choice == MODEL_DTYPE_FP32 ? WEIGHT_F32 : WEIGHT_F16;
    if (model_storage_allocate(out, &config, dtype, 0, err)) return -1;
    snprintf(out->name, sizeof out->name, "%s", name);
    out->format = MODEL_FORMAT_SYNTHETIC;

    // Per-channel gains of the largest layer matrix: rows + cols floats.
    int widest = config.hidden_dim > config.dim ? config.hidden_dim : config.dim;
    float* scratch = malloc(sizeof(float) * 2 * (size_t)widest);
    if (!scratch) {
        model_free(out);
        return error_set(err, "%s: out of memory", name);
    }
    // The embedding: plain normals with a modest scale (no channel structure).
    normal_stream stream = stream_for_tensor(seed, 0);
    float embedding_scale = 2.0f / sqrtf((float)config.dim);
    for (int token = 0; token < config.vocab_size; token++) {
        // Special tokens (<unk>, BOS, EOS) and the byte tokens of control and
        // non-ASCII bytes get rows 10x smaller: their logits stay near 0, so
        // an untrained model neither ends its text at once nor prints
        // invalid UTF-8; what it prints is readable (if random) ASCII.
        int byte = token - 3;
        bool quiet = token < 3 || (byte < 256 && (byte < 0x20 || byte >= 0x7f) && byte != '\n');
        float scale = quiet ? 0.1f * embedding_scale : embedding_scale;
        for (int i = 0; i < config.dim; i++)
            store_value(&out->token_embedding, (size_t)token * (size_t)config.dim + (size_t)i,
                        next_normal(&stream) * scale);
    }
    uint64_t tensor_index = 1;
    for (int l = 0; l < config.n_layers; l++) {
        fill_norm(out->layers[l].rms_attention, config.dim, seed, tensor_index++);
        fill_norm(out->layers[l].rms_ffn, config.dim, seed, tensor_index++);
        for (int i = 0; i < 7; i++)
            fill_matrix(model_storage_layer_matrix(&out->layers[l], i), seed, tensor_index++, scratch);
    }
    fill_norm(out->rms_final, config.dim, seed, tensor_index++);
    free(scratch);
    model_storage_build_tiles(out);
    return 0;
}
