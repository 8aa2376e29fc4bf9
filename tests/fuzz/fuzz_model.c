// fuzz_model: the llama2.c checkpoint loader (engine/model.c, model_load).
//
// The input is the whole checkpoint file (legacy headerless fp32, or the
// "ak42" export header, version 1 fp32 or 2 Q8_0), handed to model_load as
// an in-memory file. Its size modulo 3 picks how the weights are stored
// (the checkpoint's own dtype, fp32 or fp16), so every conversion path is
// reached. A loaded model is looked through (every matrix by name, the
// bytes a decode streams) and freed. Errors are expected; a crash, a leak
// or a sanitizer report is a bug.
//
// Seeds: no checkpoint is committed (the project never commits model files).
// LLVMFuzzerInitialize writes them into the run's corpus folder (the first
// folder on the command line, build/fuzz/corpus/fuzz_model under `make
// fuzz`) when they are missing: a legacy checkpoint of dim 8, one layer, 2
// heads, 1 KV head, vocab 32, 4 positions (about 5 KB; the smallest preset
// `servelab synth` writes is 0.4 MB), the same model saved by
// model_write_checkpoint as export v1 and v2 (Q8_0, groups of 8), an
// unshared classifier, a truncated copy, a header alone and a NaN weight.
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/model.h"
#include "engine/model_write.h"
#include "tests/fuzz/support.h"

int LLVMFuzzerInitialize(int* argc, char*** argv);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

enum { SEED_DIM = 8, SEED_HIDDEN = 16, SEED_LAYERS = 1, SEED_HEADS = 2, SEED_KV_HEADS = 1, SEED_VOCAB = 32, SEED_SEQ = 4 };

// A legacy (headerless fp32) checkpoint: 7 int32 of config, then the
// tensors in llama2.c's order, with the two unused RoPE tables. Values are
// small and deterministic. vocab < 0 marks an unshared classifier. Returns
// the malloc'ed bytes and their count.
static uint8_t* legacy_seed(int32_t vocab, size_t* size) {
    const size_t dim = SEED_DIM, hidden = SEED_HIDDEN, layers = SEED_LAYERS, kv_dim = dim / SEED_HEADS * SEED_KV_HEADS,
                 head_dim = dim / SEED_HEADS, rows = (size_t)(vocab < 0 ? -vocab : vocab);
    size_t n_floats = rows * dim + layers * dim + layers * dim * dim * 2 + layers * kv_dim * dim * 2 + layers * dim +
                      layers * hidden * dim * 3 + dim + SEED_SEQ * head_dim + (vocab < 0 ? rows * dim : 0);
    *size = 7 * sizeof(int32_t) + n_floats * sizeof(float);
    uint8_t* bytes = malloc(*size);
    if (!bytes) return NULL;
    int32_t config[7] = {SEED_DIM, SEED_HIDDEN, SEED_LAYERS, SEED_HEADS, SEED_KV_HEADS, vocab, SEED_SEQ};
    memcpy(bytes, config, sizeof config);
    for (size_t i = 0; i < n_floats; i++) {
        float value = (float)((int)(i * 37 % 17) - 8) / 32.0f;
        memcpy(bytes + sizeof config + i * sizeof value, &value, sizeof value);
    }
    return bytes;
}

// The exports: load the legacy seed from a file, save it in format.
static void write_export_seed(const char* folder, const char* name, const char* legacy_path, model_format format,
                              int group_size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", folder, name);
    if (access(path, F_OK) == 0) return; // an earlier run wrote it
    model m;
    error_info err = {{0}};
    if (model_load(&m, legacy_path, MODEL_DTYPE_FP32, &err) != 0) return;
    model_write_checkpoint(&m, path, format, group_size, &err);
    model_free(&m);
}

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    const char* folder = fuzz_seed_folder(*argc, *argv);
    if (!folder) return 0; // a reproducer run: no seeds needed
    size_t size = 0;
    uint8_t* shared = legacy_seed(SEED_VOCAB, &size);
    if (!shared) return 0;
    fuzz_write_seed(folder, "seed-legacy-shared.bin", shared, size);
    fuzz_write_seed(folder, "seed-truncated.bin", shared, size / 2);
    fuzz_write_seed(folder, "seed-header-only.bin", shared, 7 * sizeof(int32_t));
    uint8_t* nan_copy = malloc(size);
    if (nan_copy) {
        memcpy(nan_copy, shared, size);
        float nan_value = NAN;
        memcpy(nan_copy + size - sizeof nan_value, &nan_value, sizeof nan_value);
        fuzz_write_seed(folder, "seed-nan.bin", nan_copy, size);
        free(nan_copy);
    }
    char legacy_path[1024];
    snprintf(legacy_path, sizeof legacy_path, "%s/seed-legacy-shared.bin", folder);
    write_export_seed(folder, "seed-export-v1.bin", legacy_path, MODEL_FORMAT_EXPORT_V1, 0);
    write_export_seed(folder, "seed-export-v2-q8.bin", legacy_path, MODEL_FORMAT_EXPORT_V2, 8);
    free(shared);
    uint8_t* unshared = legacy_seed(-SEED_VOCAB, &size);
    if (unshared) fuzz_write_seed(folder, "seed-legacy-unshared.bin", unshared, size);
    free(unshared);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    char path[64];
    int fd = fuzz_memory_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    static const model_dtype_choice choices[] = {MODEL_DTYPE_DEFAULT, MODEL_DTYPE_FP32, MODEL_DTYPE_FP16};
    model m;
    error_info err = {{0}};
    if (model_load(&m, path, choices[size % 3], &err) == 0) {
        volatile uint64_t bytes = model_decode_weight_bytes(&m);
        (void)bytes;
        char name[64];
        const char* kinds[] = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"};
        for (int l = 0; l < m.config.n_layers; l++)
            for (int k = 0; k < 7; k++) {
                snprintf(name, sizeof name, "layers.%d.%s", l, kinds[k]);
                FUZZ_CHECK(model_matrix_by_name(&m, name) != NULL);
            }
        FUZZ_CHECK(model_matrix_by_name(&m, "token_embedding") && model_matrix_by_name(&m, "classifier"));
        model_free(&m);
    } else {
        FUZZ_CHECK(err.message[0] != '\0'); // a failure says why
    }
    close(fd);
    return 0;
}
