#include "engine/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/terminal_text.h"

// ---- types ------------------------------------------------------------------------------

typedef struct tensor_type_info {
    gguf_tensor_type type;
    const char* name;
    uint64_t block_elements; // elements per block (1 for plain types)
    uint64_t block_bytes;    // bytes per block
} tensor_type_info;

// Block sizes as ggml lays them out: a k-quant block is 256 elements with
// its super-block scales (Q4_K: 2 + 2 fp16, 12 bytes of 6-bit scales, 128
// bytes of nibbles = 144).
static const tensor_type_info TENSOR_TYPES[] = {
    {GGUF_TENSOR_F32, "F32", 1, 4},       {GGUF_TENSOR_F16, "F16", 1, 2},       {GGUF_TENSOR_Q4_0, "Q4_0", 32, 18},
    {GGUF_TENSOR_Q4_1, "Q4_1", 32, 20},   {GGUF_TENSOR_Q5_0, "Q5_0", 32, 22},   {GGUF_TENSOR_Q5_1, "Q5_1", 32, 24},
    {GGUF_TENSOR_Q8_0, "Q8_0", 32, 34},   {GGUF_TENSOR_Q8_1, "Q8_1", 32, 36},   {GGUF_TENSOR_Q2_K, "Q2_K", 256, 84},
    {GGUF_TENSOR_Q3_K, "Q3_K", 256, 110}, {GGUF_TENSOR_Q4_K, "Q4_K", 256, 144}, {GGUF_TENSOR_Q5_K, "Q5_K", 256, 176},
    {GGUF_TENSOR_Q6_K, "Q6_K", 256, 210}, {GGUF_TENSOR_Q8_K, "Q8_K", 256, 292}, {GGUF_TENSOR_I8, "I8", 1, 1},
    {GGUF_TENSOR_I16, "I16", 1, 2},       {GGUF_TENSOR_I32, "I32", 1, 4},       {GGUF_TENSOR_I64, "I64", 1, 8},
    {GGUF_TENSOR_F64, "F64", 1, 8},       {GGUF_TENSOR_BF16, "BF16", 1, 2},
};

static const tensor_type_info* find_type(uint32_t type) {
    for (size_t i = 0; i < sizeof TENSOR_TYPES / sizeof TENSOR_TYPES[0]; i++)
        if ((uint32_t)TENSOR_TYPES[i].type == type) return &TENSOR_TYPES[i];
    return NULL;
}

const char* gguf_tensor_type_name(gguf_tensor_type type) {
    const tensor_type_info* info = find_type((uint32_t)type);
    return info ? info->name : "?";
}

uint64_t gguf_tensor_block_elements(gguf_tensor_type type) {
    const tensor_type_info* info = find_type((uint32_t)type);
    return info ? info->block_elements : 0;
}

uint64_t gguf_tensor_block_bytes(gguf_tensor_type type) {
    const tensor_type_info* info = find_type((uint32_t)type);
    return info ? info->block_bytes : 0;
}

static const char* const VALUE_TYPE_NAMES[GGUF_VALUE_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64",
    "float64"};

const char* gguf_value_type_name(gguf_value_type type) {
    return (unsigned)type < GGUF_VALUE_TYPE_COUNT ? VALUE_TYPE_NAMES[type] : "?";
}

// Bytes of one value of a fixed-size type; 0 for string and array.
static uint64_t value_type_bytes(gguf_value_type type) {
    switch (type) {
    case GGUF_VALUE_UINT8:
    case GGUF_VALUE_INT8:
    case GGUF_VALUE_BOOL: return 1;
    case GGUF_VALUE_UINT16:
    case GGUF_VALUE_INT16: return 2;
    case GGUF_VALUE_UINT32:
    case GGUF_VALUE_INT32:
    case GGUF_VALUE_FLOAT32: return 4;
    case GGUF_VALUE_UINT64:
    case GGUF_VALUE_INT64:
    case GGUF_VALUE_FLOAT64: return 8;
    default: return 0;
    }
}

// ---- a bounded cursor over the file ------------------------------------------------------

typedef struct reader {
    const unsigned char* bytes;
    size_t size;
    size_t offset;
} reader;

static uint64_t load_le(const unsigned char* p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static bool take(reader* r, uint64_t n, const unsigned char** out) {
    if (n > r->size - r->offset) return false;
    *out = r->bytes + r->offset;
    r->offset += (size_t)n;
    return true;
}

static bool read_u32(reader* r, uint32_t* v) {
    const unsigned char* p;
    if (!take(r, 4, &p)) return false;
    *v = (uint32_t)load_le(p, 4);
    return true;
}

static bool read_u64(reader* r, uint64_t* v) {
    const unsigned char* p;
    if (!take(r, 8, &p)) return false;
    *v = load_le(p, 8);
    return true;
}

static bool read_string(reader* r, gguf_string* s) {
    uint64_t length;
    const unsigned char* p;
    if (!read_u64(r, &length) || !take(r, length, &p)) return false;
    s->bytes = (const char*)p;
    s->length = length;
    return true;
}

// A key or name for a message: printable ASCII only, cut to 48 bytes.
static const char* printable(gguf_string s, char* out, size_t capacity) {
    size_t n = 0;
    for (uint64_t i = 0; i < s.length && n + 1 < capacity && n < 48; i++) {
        unsigned char c = (unsigned char)s.bytes[i];
        out[n++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    out[n] = '\0';
    return out;
}

bool gguf_string_equals(gguf_string s, const char* text) {
    size_t length = strlen(text);
    return s.length == length && memcmp(s.bytes, text, length) == 0;
}

bool gguf_has_magic(const unsigned char* bytes, size_t size) { return size >= 4 && memcmp(bytes, GGUF_MAGIC, 4) == 0; }

// ---- parsing ------------------------------------------------------------------------------

// Reads one value of `type` (not an array) and checks it fits the file.
// Strings are walked, so an array of them is known to be whole.
static bool skip_value(reader* r, gguf_value_type type) {
    if (type == GGUF_VALUE_STRING) {
        gguf_string s;
        return read_string(r, &s);
    }
    const unsigned char* p;
    return take(r, value_type_bytes(type), &p);
}

static int parse_kv(gguf_file* f, reader* r, int index, gguf_kv* kv, error_info* err) {
    const char* name = f->name;
    size_t start = r->offset;
    if (!read_string(r, &kv->key))
        return error_set(err, "%s: metadata %d: key truncated at offset %zu (file is %zu bytes)", name, index, start,
                         r->size);
    char key[64];
    printable(kv->key, key, sizeof key);
    if (kv->key.length == 0 || kv->key.length > GGUF_MAX_KEY_BYTES)
        return error_set(err, "%s: metadata %d: key length %llu, expected 1..%d", name, index,
                         (unsigned long long)kv->key.length, GGUF_MAX_KEY_BYTES);
    uint32_t type;
    if (!read_u32(r, &type)) return error_set(err, "%s: metadata '%s': value type truncated", name, key);
    if (type >= GGUF_VALUE_TYPE_COUNT)
        return error_set(err, "%s: metadata '%s': value type %u, expected 0..%d", name, key, type,
                         GGUF_VALUE_TYPE_COUNT - 1);
    kv->type = (gguf_value_type)type;
    if (kv->type != GGUF_VALUE_ARRAY) {
        kv->value = r->bytes + r->offset;
        if (!skip_value(r, kv->type))
            return error_set(err, "%s: metadata '%s': %s value truncated at offset %zu (file is %zu bytes)", name, key,
                             gguf_value_type_name(kv->type), r->offset, r->size);
        kv->value_bytes = (uint64_t)(r->bytes + r->offset - kv->value);
        return 0;
    }
    uint32_t element_type;
    uint64_t count;
    if (!read_u32(r, &element_type) || !read_u64(r, &count))
        return error_set(err, "%s: metadata '%s': array header truncated", name, key);
    // Nested arrays exist in the format but no model file uses them.
    if (element_type >= GGUF_VALUE_TYPE_COUNT || element_type == GGUF_VALUE_ARRAY)
        return error_set(err, "%s: metadata '%s': array element type %u, expected a number, bool or string", name, key,
                         element_type);
    kv->array_type = (gguf_value_type)element_type;
    kv->array_count = count;
    kv->value = r->bytes + r->offset;
    uint64_t element_bytes = value_type_bytes(kv->array_type);
    // Every element takes at least one byte (a string 8): a count beyond
    // what is left is refused before the walk.
    uint64_t least = kv->array_type == GGUF_VALUE_STRING ? 8 : element_bytes;
    if (count > (r->size - r->offset) / least)
        return error_set(err, "%s: metadata '%s': truncated: array of %llu %s needs at least %llu bytes, %zu are left", name, key,
                         (unsigned long long)count, gguf_value_type_name(kv->array_type),
                         (unsigned long long)(count > UINT64_MAX / least ? UINT64_MAX : count * least),
                         r->size - r->offset);
    if (kv->array_type == GGUF_VALUE_STRING) {
        for (uint64_t i = 0; i < count; i++) {
            gguf_string s;
            if (!read_string(r, &s))
                return error_set(err, "%s: metadata '%s': string %llu of %llu truncated at offset %zu", name, key,
                                 (unsigned long long)i, (unsigned long long)count, r->offset);
        }
    } else {
        const unsigned char* p;
        take(r, count * element_bytes, &p); // fits: checked above
    }
    kv->value_bytes = (uint64_t)(r->bytes + r->offset - kv->value);
    return 0;
}

static int parse_tensor(gguf_file* f, reader* r, int index, gguf_tensor* t, error_info* err) {
    const char* name = f->name;
    gguf_string tensor_name;
    if (!read_string(r, &tensor_name))
        return error_set(err, "%s: tensor %d: name truncated (file is %zu bytes)", name, index, r->size);
    char shown[64];
    printable(tensor_name, shown, sizeof shown);
    if (tensor_name.length == 0 || tensor_name.length > GGUF_MAX_TENSOR_NAME)
        return error_set(err, "%s: tensor %d: name of %llu bytes, expected 1..%d", name, index,
                         (unsigned long long)tensor_name.length, GGUF_MAX_TENSOR_NAME);
    // Names are ASCII identifiers ("blk.0.attn_q.weight"); a control byte
    // or NUL would end up in messages and lookups, so it is refused here.
    for (uint64_t i = 0; i < tensor_name.length; i++) {
        unsigned char c = (unsigned char)tensor_name.bytes[i];
        if (c < 0x20 || c == 0x7f)
            return error_set(err, "%s: tensor %d ('%s'): name byte %llu is 0x%02x, expected printable text", name,
                             index, shown, (unsigned long long)i, c);
    }
    memcpy(t->name, tensor_name.bytes, (size_t)tensor_name.length);
    t->name[tensor_name.length] = '\0';
    uint32_t n_dims;
    if (!read_u32(r, &n_dims)) return error_set(err, "%s: tensor '%s': n_dims truncated", name, t->name);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return error_set(err, "%s: tensor '%s': n_dims %u, expected 1..%d", name, t->name, n_dims, GGUF_MAX_DIMS);
    t->n_dims = (int)n_dims;
    uint64_t elements = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (int d = 0; d < t->n_dims; d++) {
        if (!read_u64(r, &t->ne[d])) return error_set(err, "%s: tensor '%s': ne[%d] truncated", name, t->name, d);
        // ne of 0 is legal in ggml but no weight is empty; a dimension past
        // 2^31 is no model's (the engine's sizes are int).
        if (t->ne[d] == 0 || t->ne[d] > INT32_MAX)
            return error_set(err, "%s: tensor '%s': ne[%d] = %llu, expected 1..%d", name, t->name, d,
                             (unsigned long long)t->ne[d], INT32_MAX);
        if (__builtin_mul_overflow(elements, t->ne[d], &elements))
            return error_set(err, "%s: tensor '%s': element count overflows 64 bits", name, t->name);
    }
    uint32_t type;
    if (!read_u32(r, &type)) return error_set(err, "%s: tensor '%s': type truncated", name, t->name);
    const tensor_type_info* info = find_type(type);
    if (!info)
        return error_set(err, "%s: tensor '%s': type %u is not a ggml type this reader knows (F32, F16, BF16, Q4_0, "
                              "Q8_0, k-quants, ...)",
                         name, t->name, type);
    t->type = info->type;
    if (t->ne[0] % info->block_elements != 0)
        return error_set(err, "%s: tensor '%s': ne[0] = %llu is not a multiple of %s's block of %llu", name, t->name,
                         (unsigned long long)t->ne[0], info->name, (unsigned long long)info->block_elements);
    uint64_t blocks = elements / info->block_elements;
    if (__builtin_mul_overflow(blocks, info->block_bytes, &t->bytes))
        return error_set(err, "%s: tensor '%s': byte count overflows 64 bits", name, t->name);
    if (!read_u64(r, &t->offset)) return error_set(err, "%s: tensor '%s': offset truncated", name, t->name);
    return 0;
}

static int compare_offsets(const void* a, const void* b) {
    const gguf_tensor* const* x = a;
    const gguf_tensor* const* y = b;
    return ((*x)->offset > (*y)->offset) - ((*x)->offset < (*y)->offset);
}

// Data offsets: aligned, inside the file, and no two tensors overlapping.
static int check_tensor_data(gguf_file* f, error_info* err) {
    uint64_t data_bytes = f->size - f->data_offset;
    for (int i = 0; i < f->n_tensors; i++) {
        gguf_tensor* t = &f->tensors[i];
        if (t->offset % f->alignment != 0)
            return error_set(err, "%s: tensor '%s': offset %llu is not a multiple of the alignment %llu", f->name,
                             t->name, (unsigned long long)t->offset, (unsigned long long)f->alignment);
        if (t->offset > data_bytes || t->bytes > data_bytes - t->offset)
            return error_set(err, "%s: tensor '%s': data at offset %llu + %llu bytes ends past the file's %llu data "
                                  "bytes (truncated?)",
                             f->name, t->name, (unsigned long long)t->offset, (unsigned long long)t->bytes,
                             (unsigned long long)data_bytes);
        t->data = f->bytes + f->data_offset + t->offset;
    }
    if (f->n_tensors < 2) return 0;
    const gguf_tensor** order = malloc((size_t)f->n_tensors * sizeof *order);
    if (!order) return error_set(err, "%s: out of memory for %d tensors", f->name, f->n_tensors);
    for (int i = 0; i < f->n_tensors; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n_tensors, sizeof *order, compare_offsets);
    int status = 0;
    for (int i = 1; i < f->n_tensors && status == 0; i++)
        if (order[i - 1]->offset + order[i - 1]->bytes > order[i]->offset)
            status = error_set(err, "%s: tensor '%s': data at offset %llu overlaps tensor '%s'", f->name,
                               order[i]->name, (unsigned long long)order[i]->offset, order[i - 1]->name);
    free(order);
    return status;
}

static int parse_all(gguf_file* f, error_info* err) {
    reader r = {f->bytes, f->size, 0};
    const char* name = f->name;
    if (f->size < 4) return error_set(err, "%s: truncated: %zu bytes, expected a GGUF header", name, f->size);
    if (!gguf_has_magic(f->bytes, f->size))
        return error_set(err, "%s: magic: expected \"GGUF\", found %02x %02x %02x %02x", name, f->bytes[0],
                         f->bytes[1], f->bytes[2], f->bytes[3]);
    r.offset = 4;
    uint64_t n_tensors, n_kv;
    if (!read_u32(&r, &f->version)) return error_set(err, "%s: version: truncated", name);
    // Version 1 used 32-bit counts and lengths; llama.cpp has refused it since 2023.
    if (f->version != 2 && f->version != 3)
        return error_set(err, "%s: version: expected 2 or 3, found %u", name, f->version);
    if (!read_u64(&r, &n_tensors) || !read_u64(&r, &n_kv))
        return error_set(err, "%s: header truncated: tensor and metadata counts missing", name);
    if (n_tensors > GGUF_MAX_TENSORS)
        return error_set(err, "%s: n_tensors: %llu, expected at most %d", name, (unsigned long long)n_tensors,
                         GGUF_MAX_TENSORS);
    if (n_kv > GGUF_MAX_KV)
        return error_set(err, "%s: n_kv: %llu, expected at most %d", name, (unsigned long long)n_kv, GGUF_MAX_KV);
    // Each metadata pair takes at least 13 bytes (key length, 1-byte key,
    // type) and each tensor info 25: counts that cannot fit are refused
    // before the tables are allocated.
    if (n_kv * 13 + n_tensors * 25 > f->size - r.offset)
        return error_set(err, "%s: counts: %llu metadata pairs and %llu tensors cannot fit in %zu bytes", name,
                         (unsigned long long)n_kv, (unsigned long long)n_tensors, f->size);
    f->n_kv = (int)n_kv;
    f->n_tensors = (int)n_tensors;
    f->kvs = calloc(n_kv > 0 ? (size_t)n_kv : 1, sizeof *f->kvs);
    f->tensors = calloc(n_tensors > 0 ? (size_t)n_tensors : 1, sizeof *f->tensors);
    if (!f->kvs || !f->tensors) return error_set(err, "%s: out of memory for the header tables", name);
    for (int i = 0; i < f->n_kv; i++) {
        if (parse_kv(f, &r, i, &f->kvs[i], err)) return -1;
        for (int j = 0; j < i; j++)
            if (f->kvs[j].key.length == f->kvs[i].key.length &&
                memcmp(f->kvs[j].key.bytes, f->kvs[i].key.bytes, (size_t)f->kvs[i].key.length) == 0) {
                char key[64];
                return error_set(err, "%s: metadata '%s': key appears twice (pairs %d and %d)", name,
                                 printable(f->kvs[i].key, key, sizeof key), j, i);
            }
    }
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    uint64_t alignment;
    int found = gguf_get_uint(f, "general.alignment", UINT32_MAX, &alignment, err);
    if (found < 0) return -1;
    // A power of two (ggml requires it); 1 MiB is above any writer's choice.
    if (found && (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > (1u << 20)))
        return error_set(err, "%s: general.alignment: %llu, expected a power of two up to 1048576", name,
                         (unsigned long long)alignment);
    if (found) f->alignment = alignment;
    for (int i = 0; i < f->n_tensors; i++) {
        if (parse_tensor(f, &r, i, &f->tensors[i], err)) return -1;
        for (int j = 0; j < i; j++)
            if (strcmp(f->tensors[j].name, f->tensors[i].name) == 0)
                return error_set(err, "%s: tensor '%s': name appears twice (tensors %d and %d)", name,
                                 f->tensors[i].name, j, i);
    }
    uint64_t data_offset = (r.offset + f->alignment - 1) / f->alignment * f->alignment;
    if (f->n_tensors > 0 && data_offset > f->size)
        return error_set(err, "%s: data section: starts at %llu, past the end of the %zu-byte file", name,
                         (unsigned long long)data_offset, f->size);
    f->data_offset = data_offset > f->size ? f->size : data_offset;
    return check_tensor_data(f, err);
}

static void set_name(gguf_file* f, const char* path) {
    const char* slash = strrchr(path, '/');
    snprintf(f->name, sizeof f->name, "%s", slash ? slash + 1 : path);
}

int gguf_parse(gguf_file* out, const unsigned char* bytes, size_t size, const char* name, error_info* err) {
    memset(out, 0, sizeof *out);
    set_name(out, name ? name : "gguf");
    out->bytes = bytes;
    out->size = size;
    if (parse_all(out, err)) {
        gguf_close(out);
        return -1;
    }
    return 0;
}

int gguf_open(gguf_file* out, const char* path, error_info* err) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return error_set(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return error_set(err, "%s: not a regular file", path);
    }
    if (st.st_size < 4) {
        close(fd);
        return error_set(err, "%s: truncated: %lld bytes, expected a GGUF header", path, (long long)st.st_size);
    }
    size_t size = (size_t)st.st_size;
    // Read-only and private: the weights are the file's bytes, never written.
    void* bytes = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (bytes == MAP_FAILED) return error_set(err, "%s: cannot map %zu bytes: %s", path, size, strerror(errno));
    if (gguf_parse(out, bytes, size, path, err)) {
        munmap(bytes, size);
        return -1;
    }
    out->mapped = true;
    return 0;
}

void gguf_release_mapping(gguf_file* f, void** bytes, size_t* size) {
    *bytes = f->mapped ? (void*)f->bytes : NULL;
    *size = f->mapped ? f->size : 0;
    f->mapped = false;
}

void gguf_close(gguf_file* f) {
    if (!f) return;
    if (f->mapped) munmap((void*)f->bytes, f->size);
    free(f->kvs);
    free(f->tensors);
    memset(f, 0, sizeof *f);
}

// ---- lookups -----------------------------------------------------------------------------

const gguf_kv* gguf_find_kv(const gguf_file* f, const char* key) {
    for (int i = 0; i < f->n_kv; i++)
        if (gguf_string_equals(f->kvs[i].key, key)) return &f->kvs[i];
    return NULL;
}

const gguf_tensor* gguf_find_tensor(const gguf_file* f, const char* name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static int wrong_type(const gguf_file* f, const char* key, const gguf_kv* kv, const char* expected,
                      error_info* err) {
    return error_set(err, "%s: metadata '%s': expected %s, found %s", f->name, key, expected,
                     gguf_value_type_name(kv->type));
}

int gguf_get_uint(const gguf_file* f, const char* key, uint64_t max_value, uint64_t* out, error_info* err) {
    const gguf_kv* kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    uint64_t bytes = value_type_bytes(kv->type);
    bool is_signed = kv->type == GGUF_VALUE_INT8 || kv->type == GGUF_VALUE_INT16 || kv->type == GGUF_VALUE_INT32 ||
                     kv->type == GGUF_VALUE_INT64;
    bool is_integer = kv->type <= GGUF_VALUE_INT32 || kv->type == GGUF_VALUE_UINT64 || kv->type == GGUF_VALUE_INT64;
    if (!is_integer || kv->type == GGUF_VALUE_FLOAT32) return wrong_type(f, key, kv, "an integer", err);
    uint64_t value = load_le(kv->value, (int)bytes);
    if (is_signed && bytes < 8 && (value >> (bytes * 8 - 1)) & 1)
        return error_set(err, "%s: metadata '%s': expected a non-negative integer, found a negative one", f->name, key);
    if (is_signed && bytes == 8 && (int64_t)value < 0)
        return error_set(err, "%s: metadata '%s': expected a non-negative integer, found %lld", f->name, key,
                         (long long)(int64_t)value);
    if (value > max_value)
        return error_set(err, "%s: metadata '%s': %llu, expected at most %llu", f->name, key,
                         (unsigned long long)value, (unsigned long long)max_value);
    *out = value;
    return 1;
}

int gguf_get_float(const gguf_file* f, const char* key, double* out, error_info* err) {
    const gguf_kv* kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->type == GGUF_VALUE_FLOAT32) {
        uint32_t bits = (uint32_t)load_le(kv->value, 4);
        float value;
        memcpy(&value, &bits, sizeof value);
        *out = value;
    } else if (kv->type == GGUF_VALUE_FLOAT64) {
        uint64_t bits = load_le(kv->value, 8);
        memcpy(out, &bits, sizeof *out);
    } else {
        uint64_t integer;
        int found = gguf_get_uint(f, key, UINT64_MAX, &integer, err);
        if (found <= 0) return wrong_type(f, key, kv, "a number", err);
        *out = (double)integer;
    }
    if (!(*out == *out) || *out > 1e300 || *out < -1e300)
        return error_set(err, "%s: metadata '%s': expected a finite number", f->name, key);
    return 1;
}

int gguf_get_bool(const gguf_file* f, const char* key, bool* out, error_info* err) {
    const gguf_kv* kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->type != GGUF_VALUE_BOOL) return wrong_type(f, key, kv, "a bool", err);
    if (kv->value[0] > 1)
        return error_set(err, "%s: metadata '%s': bool byte %u, expected 0 or 1", f->name, key, kv->value[0]);
    *out = kv->value[0] == 1;
    return 1;
}

int gguf_get_string(const gguf_file* f, const char* key, char* out, size_t capacity, error_info* err) {
    const gguf_kv* kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->type != GGUF_VALUE_STRING) return wrong_type(f, key, kv, "a string", err);
    uint64_t length = load_le(kv->value, 8);
    size_t n = length < capacity - 1 ? (size_t)length : capacity - 1;
    memcpy(out, kv->value + 8, n);
    out[n] = '\0';
    // These strings are names (an architecture, a tokenizer model,
    // general.name) that messages quote and `info` prints: a control (a
    // newline would split a one-line error; ESC or U+009B CSI would drive
    // the terminal) becomes '?', which no real name holds.
    terminal_text state = {0};
    size_t kept = terminal_text_filter(&state, out, n, out);
    kept += terminal_text_finish(&state, out + kept);
    out[kept] = '\0';
    return 1;
}

gguf_string gguf_kv_string(const gguf_kv* kv) {
    gguf_string s = {"", 0};
    if (!kv || kv->type != GGUF_VALUE_STRING || kv->value_bytes < 8) return s;
    s.length = load_le(kv->value, 8);
    if (s.length > kv->value_bytes - 8) s.length = 0; // cannot happen after parse_kv
    s.bytes = (const char*)kv->value + 8;
    return s;
}

gguf_string gguf_array_string_next(const gguf_kv* kv, uint64_t* cursor) {
    gguf_string s = {"", 0};
    if (kv->type != GGUF_VALUE_ARRAY || kv->array_type != GGUF_VALUE_STRING || *cursor + 8 > kv->value_bytes) return s;
    uint64_t length = load_le(kv->value + *cursor, 8);
    if (length > kv->value_bytes - *cursor - 8) return s; // cannot happen after parse_kv's walk
    s.bytes = (const char*)kv->value + *cursor + 8;
    s.length = length;
    *cursor += 8 + length;
    return s;
}

double gguf_array_number(const gguf_kv* kv, uint64_t i) {
    uint64_t bytes = value_type_bytes(kv->array_type);
    if (kv->type != GGUF_VALUE_ARRAY || bytes == 0 || i >= kv->array_count) return 0.0;
    uint64_t bits = load_le(kv->value + i * bytes, (int)bytes);
    switch (kv->array_type) {
    case GGUF_VALUE_INT8: return (double)(int8_t)bits;
    case GGUF_VALUE_INT16: return (double)(int16_t)bits;
    case GGUF_VALUE_INT32: return (double)(int32_t)bits;
    case GGUF_VALUE_INT64: return (double)(int64_t)bits;
    case GGUF_VALUE_FLOAT32: {
        uint32_t b32 = (uint32_t)bits;
        float value;
        memcpy(&value, &b32, sizeof value);
        return value;
    }
    case GGUF_VALUE_FLOAT64: {
        double value;
        memcpy(&value, &bits, sizeof value);
        return value;
    }
    default: return (double)bits;
    }
}
