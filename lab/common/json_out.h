// json_out: what the commands' --json writers share (bench, quant, sim).
// Every JSON the project writes goes through Jansson; these helpers keep
// the hand-written JSON's figures and put user text in safely.
#ifndef SERVELAB_JSON_OUT_H
#define SERVELAB_JSON_OUT_H

#include <jansson.h>

// Text from the user (a model path, a tensor name) as a JSON string: an
// invalid UTF-8 sequence (a non-UTF-8 file name, a path cut short) becomes
// U+FFFD. NULL when out of memory.
json_t* json_out_text(const char* text);

// value as the number printf's "%.*g" (digits > 0) or "%.*f" (decimals)
// writes: the same figures the hand-written JSON had, printed by Jansson in
// their shortest form (JSON_OUT_FLAGS). A value that is not finite, which
// JSON cannot hold, is null.
json_t* json_out_rounded(double value, int decimals, int digits);

// A whole count held in a double (bytes per token) as a JSON integer.
json_t* json_out_whole(double value);

// Appends value (taken) to *array; on failure frees the array and leaves NULL,
// so a failure anywhere leaves one NULL at the top (json_pack and
// json_array_append_new take the references they are given even when they fail).
void json_out_append(json_t** array, json_t* value);

// Prints root (taken; NULL means out of memory) and a newline to stdout with
// Jansson's `flags` | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15). 0, or 1
// after "servelab COMMAND: ..." on stderr (out of memory, or stdout failed).
int json_out_print(json_t* root, size_t flags, const char* command);

#endif
