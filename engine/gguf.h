// gguf: reads the GGUF container (versions 2 and 3) that llama.cpp writes.
//
// Layout of a file (all little-endian):
//   "GGUF" magic, uint32 version, uint64 n_tensors, uint64 n_kv,
//   n_kv metadata pairs:  string key, uint32 value type, value
//   n_tensors tensor infos: string name, uint32 n_dims, uint64 ne[n_dims],
//                           uint32 ggml type, uint64 offset
//   padding to `alignment` (general.alignment, default 32), then the data
//   section; each tensor's offset is relative to its start.
// A string is a uint64 byte count and the bytes (no NUL). An array value
// is a uint32 element type, a uint64 count and the elements.
//
// The file is mapped read-only. gguf_open checks every count, length, type
// and offset against the bytes that are there before anything is sized by
// it, so a truncated, bit-flipped or hostile file gets one line naming the
// field, never a read past the end. Nothing here knows about models: the
// model loader (gguf_model.c) and the tokenizer loader (gguf_vocab.c) read
// what they need through the lookups below.
#ifndef SERVELAB_GGUF_H
#define SERVELAB_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
// Most tensor dimensions ggml has (GGML_MAX_DIMS).
#define GGUF_MAX_DIMS 4
// Longest tensor name ggml keeps (GGML_MAX_NAME is 64 with the NUL).
#define GGUF_MAX_TENSOR_NAME 63

typedef enum gguf_value_type {
    GGUF_VALUE_UINT8 = 0,
    GGUF_VALUE_INT8 = 1,
    GGUF_VALUE_UINT16 = 2,
    GGUF_VALUE_INT16 = 3,
    GGUF_VALUE_UINT32 = 4,
    GGUF_VALUE_INT32 = 5,
    GGUF_VALUE_FLOAT32 = 6,
    GGUF_VALUE_BOOL = 7,
    GGUF_VALUE_STRING = 8,
    GGUF_VALUE_ARRAY = 9,
    GGUF_VALUE_UINT64 = 10,
    GGUF_VALUE_INT64 = 11,
    GGUF_VALUE_FLOAT64 = 12,
    GGUF_VALUE_TYPE_COUNT = 13,
} gguf_value_type;

// ggml's tensor types (the numbers are the file's); the ones this reader
// knows the block size of. Any other number is refused by gguf_open.
typedef enum gguf_tensor_type {
    GGUF_TENSOR_F32 = 0,
    GGUF_TENSOR_F16 = 1,
    GGUF_TENSOR_Q4_0 = 2,
    GGUF_TENSOR_Q4_1 = 3,
    GGUF_TENSOR_Q5_0 = 6,
    GGUF_TENSOR_Q5_1 = 7,
    GGUF_TENSOR_Q8_0 = 8,
    GGUF_TENSOR_Q8_1 = 9,
    GGUF_TENSOR_Q2_K = 10,
    GGUF_TENSOR_Q3_K = 11,
    GGUF_TENSOR_Q4_K = 12,
    GGUF_TENSOR_Q5_K = 13,
    GGUF_TENSOR_Q6_K = 14,
    GGUF_TENSOR_Q8_K = 15,
    GGUF_TENSOR_I8 = 24,
    GGUF_TENSOR_I16 = 25,
    GGUF_TENSOR_I32 = 26,
    GGUF_TENSOR_I64 = 27,
    GGUF_TENSOR_F64 = 28,
    GGUF_TENSOR_BF16 = 30,
} gguf_tensor_type;

// Bytes that are not NUL-terminated: they point into the mapped file.
typedef struct gguf_string {
    const char* bytes;
    uint64_t length; // bytes
} gguf_string;

typedef struct gguf_kv {
    gguf_string key;
    gguf_value_type type;
    gguf_value_type array_type;  // element type when type is GGUF_VALUE_ARRAY
    uint64_t array_count;        // elements when type is GGUF_VALUE_ARRAY
    const unsigned char* value;  // the value's bytes (an array's first element) in the mapping
    uint64_t value_bytes;        // bytes of the value (an array's elements, not its header)
} gguf_kv;

typedef struct gguf_tensor {
    char name[GGUF_MAX_TENSOR_NAME + 1];
    int n_dims;
    uint64_t ne[GGUF_MAX_DIMS];  // elements along each dimension; ne[0] is contiguous, unused ones 1
    gguf_tensor_type type;
    uint64_t offset;             // bytes from the start of the data section
    uint64_t bytes;              // bytes of data
    const unsigned char* data;   // in the mapping
} gguf_tensor;

typedef struct gguf_file {
    char name[128];               // the file's base name, for messages
    const unsigned char* bytes;   // (size) the mapped file
    size_t size;                  // bytes
    bool mapped;                  // bytes come from mmap (else the caller's buffer)
    uint32_t version;             // 2 or 3
    uint64_t alignment;           // bytes
    uint64_t data_offset;         // bytes from the file start to the data section
    int n_kv;
    gguf_kv* kvs;                 // (n_kv)
    int n_tensors;
    gguf_tensor* tensors;         // (n_tensors)
} gguf_file;

// Limits far above real files (Llama-3-405B: 1138 tensors, ~40 keys; a
// 256K-token vocabulary is one array of 256K strings) that keep the
// reader's own tables small when a header lies.
#define GGUF_MAX_TENSORS 65536
#define GGUF_MAX_KV 65536
#define GGUF_MAX_KEY_BYTES 65535

// True when the first bytes of `bytes` are the GGUF magic.
bool gguf_has_magic(const unsigned char* bytes, size_t size);

// Maps path read-only and parses it. On failure *out is zeroed and err names the field.
int gguf_open(gguf_file* out, const char* path, error_info* err);

// Parses a file already in memory (kept by the caller, never written): for tests and fuzzing.
int gguf_parse(gguf_file* out, const unsigned char* bytes, size_t size, const char* name, error_info* err);

// Unmaps (when mapped) and frees the tables; safe on a zeroed gguf_file.
void gguf_close(gguf_file* f);

// Hands the mapping to the caller, who must munmap(*bytes, *size) once done
// with it; gguf_close then frees only the tables. NULL when not mapped.
void gguf_release_mapping(gguf_file* f, void** bytes, size_t* size);

const gguf_kv* gguf_find_kv(const gguf_file* f, const char* key);
const gguf_tensor* gguf_find_tensor(const gguf_file* f, const char* name);

// Typed reads of a key. Each returns 1 when found with a fitting type,
// 0 when absent (out untouched), -1 with err naming the key when present
// with another type or a value out of range.
int gguf_get_uint(const gguf_file* f, const char* key, uint64_t max_value, uint64_t* out, error_info* err);
int gguf_get_float(const gguf_file* f, const char* key, double* out, error_info* err);
int gguf_get_bool(const gguf_file* f, const char* key, bool* out, error_info* err);
// Copies the string (cut to capacity - 1 bytes, always NUL-terminated;
// controls, NUL included, and invalid UTF-8 become '?' (base/terminal_text.h):
// these are names quoted in messages and printed by `info`).
int gguf_get_string(const gguf_file* f, const char* key, char* out, size_t capacity, error_info* err);

// The string value of a key of type string ({"", 0} for any other type).
gguf_string gguf_kv_string(const gguf_kv* kv);

// The elements of an array of strings, in order: set *cursor to 0 first;
// each call gives the next string. Never reads outside kv (gguf_open
// already walked every string of every array).
gguf_string gguf_array_string_next(const gguf_kv* kv, uint64_t* cursor);

// Element i of an array of a fixed-size numeric type, widened.
double gguf_array_number(const gguf_kv* kv, uint64_t i);

const char* gguf_tensor_type_name(gguf_tensor_type type);
const char* gguf_value_type_name(gguf_value_type type);
// Elements per block and bytes per block of a tensor type; 0 for unknown.
uint64_t gguf_tensor_block_elements(gguf_tensor_type type);
uint64_t gguf_tensor_block_bytes(gguf_tensor_type type);

// Whether a GGUF string equals a C string.
bool gguf_string_equals(gguf_string s, const char* text);

#endif
