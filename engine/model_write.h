// model_write: saves a model as a llama2.c checkpoint.
//
// Legacy (headerless fp32), export version 1 (fp32) or version 2 (Q8_0:
// int8 values with one fp32 scale per group of group_size values, the scale
// being max|w| / 127 of its group, as llama2.c's export.py computes it).
// The file is written to a temporary name and renamed into place, so a
// failure never leaves a half-written checkpoint behind.
#ifndef SERVELAB_MODEL_WRITE_H
#define SERVELAB_MODEL_WRITE_H

#include "base/error.h"
#include "engine/model.h"

int model_write_checkpoint(const model* m, const char* path, model_format format, int group_size, error_info* err);

#endif
