// calibration: token streams for quantization and its evaluation.
//
// Models with a real tokenizer get short TinyStories-like texts; synthetic
// models get streams sampled from the unquantized model itself. The
// calibration and evaluation sets are disjoint, so an error measured on the
// evaluation set was not fitted on it.
#ifndef SERVELAB_CALIBRATION_H
#define SERVELAB_CALIBRATION_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

typedef enum calibration_purpose {
    CALIBRATION_FOR_QUANTIZATION = 0,
    CALIBRATION_FOR_EVALUATION = 1,
} calibration_purpose;

typedef struct calibration_set {
    int32_t** sequences; // (n_sequences) token ids, BOS first
    int* lengths;        // (n_sequences) tokens
    int n_sequences;
    bool from_text;      // true: built-in stories; false: sampled from the model
} calibration_set;

int calibration_build(const model* m, const tokenizer* tok, calibration_purpose purpose, calibration_set* out,
                      error_info* err);
void calibration_free(calibration_set* set);

#endif
