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
// Seeds (tests/fuzz/corpus/fuzz_model): hand-made checkpoints of dim 8, one
// layer, 2 heads, 1 KV head, vocab 32, 4 positions (under 5 KB each; the
// smallest preset `servelab synth` writes is 0.4 MB) in each format, plus
// a truncated one, a header alone, a NaN weight and a GGUF magic.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "engine/model.h"
#include "tests/fuzz/support.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

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
