// Corrupt checkpoints: each is rejected with one line naming the file, the
// field and what was expected; nothing crashes and nothing leaks (the
// sanitizer build runs this too).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "engine/model.h"
#include "engine/model_write.h"
#include "tests/test_support.h"

typedef struct loader_fixture {
    unsigned char* legacy; // stories260K.bin as shipped
    size_t legacy_size;
    unsigned char* v1; // the same weights in export version 1
    size_t v1_size;
    unsigned char* v2; // and in version 2 (Q8_0, group 64)
    size_t v2_size;
} loader_fixture;

static int setup(void** state) {
    loader_fixture* f = calloc(1, sizeof *f);
    *state = f;
    char path[512];
    if (!shared_model_path(path, sizeof path, "stories260K.bin")) return 0; // each test skips or fails
    f->legacy = test_read_file(path, &f->legacy_size);
    model m;
    error_info err = {{0}};
    if (model_load(&m, path, MODEL_DTYPE_DEFAULT, &err)) return -1;
    char v1_path[512], v2_path[512];
    snprintf(v1_path, sizeof v1_path, "%s/loader.v1.bin", test_scratch_dir());
    snprintf(v2_path, sizeof v2_path, "%s/loader.v2.bin", test_scratch_dir());
    int status = model_write_checkpoint(&m, v1_path, MODEL_FORMAT_EXPORT_V1, 0, &err) ||
                 model_write_checkpoint(&m, v2_path, MODEL_FORMAT_EXPORT_V2, 64, &err);
    model_free(&m);
    if (status) return -1;
    f->v1 = test_read_file(v1_path, &f->v1_size);
    f->v2 = test_read_file(v2_path, &f->v2_size);
    return 0;
}

static int teardown(void** state) {
    loader_fixture* f = *state;
    free(f->legacy);
    free(f->v1);
    free(f->v2);
    free(f);
    return 0;
}

static void require_fixture(const loader_fixture* f) {
    char path[512];
    REQUIRE_SHARED_MODEL(path, "stories260K.bin");
    assert_non_null(f->legacy);
}

static void put_int32(unsigned char* bytes, size_t offset, int32_t value) { memcpy(bytes + offset, &value, 4); }

// Writes bytes as build/test-tmp/<pid>/stories.bin, loads it, expects failure
// with every fragment of `expected` (separated by '|') in the message.
static void expect_rejected(const unsigned char* bytes, size_t size, const char* expected) {
    char path[512];
    snprintf(path, sizeof path, "%s/stories.bin", test_scratch_dir());
    assert_true(test_write_file(path, bytes, size));
    model m;
    memset(&m, 0xab, sizeof m); // the loader must reset it
    error_info err = {{0}};
    int status = model_load(&m, path, MODEL_DTYPE_DEFAULT, &err);
    if (status == 0) {
        model_free(&m);
        fail_msg("a corrupt file was accepted (expected '%s')", expected);
    }
    assert_null(m.storage);
    assert_null(m.layers);
    assert_non_null(strstr(err.message, "stories.bin: "));
    assert_null(strchr(err.message, '\n'));
    char fragments[512];
    snprintf(fragments, sizeof fragments, "%s", expected);
    for (char* fragment = strtok(fragments, "|"); fragment; fragment = strtok(NULL, "|"))
        if (!strstr(err.message, fragment)) fail_msg("message '%s' lacks '%s'", err.message, fragment);
}

static unsigned char* copy_of(const unsigned char* bytes, size_t size) {
    unsigned char* copy = malloc(size);
    memcpy(copy, bytes, size);
    return copy;
}

static void test_truncated_at_many_offsets(void** state) {
    loader_fixture* f = *state;
    require_fixture(f);
    expect_rejected(f->legacy, 0, "empty file");
    expect_rejected(f->legacy, 10, "truncated: expected a 28-byte header, found 10 bytes");
    expect_rejected(f->legacy, 1000, "stories.bin: truncated: expected 1056540 bytes, found 1000");
    expect_rejected(f->legacy, 500000, "truncated: expected 1056540 bytes, found 500000");
    expect_rejected(f->legacy, f->legacy_size - 1, "truncated: expected 1056540 bytes, found 1056539");
    expect_rejected(f->v1, 100, "truncated: expected a 256-byte header, found 100 bytes");
    expect_rejected(f->v1, f->v1_size / 2, "truncated");
    expect_rejected(f->v2, f->v2_size - 3, "truncated");
}

static void test_trailing_bytes(void** state) {
    loader_fixture* f = *state;
    require_fixture(f);
    unsigned char* longer = malloc(f->legacy_size + 1);
    memcpy(longer, f->legacy, f->legacy_size);
    longer[f->legacy_size] = 0;
    expect_rejected(longer, f->legacy_size + 1, "size mismatch: expected 1056540 bytes, found 1056541");
    free(longer);
}

static void test_bad_dimensions(void** state) {
    loader_fixture* f = *state;
    require_fixture(f);
    struct {
        size_t offset; // in the legacy header
        int32_t value;
        const char* expected;
    } cases[] = {
        {0, 0, "dim: expected a positive value, found 0"},
        {0, -64, "dim: expected a positive value, found -64"},
        {4, 0, "hidden_dim: expected a positive value, found 0"},
        {8, -3, "n_layers: expected a positive value, found -3"},
        {12, 7, "n_heads: expected a divisor of dim 64, found 7"},
        {16, 3, "n_kv_heads: expected a divisor of n_heads 8, found 3"},
        {16, 0, "n_kv_heads: expected a positive value, found 0"},
        {12, 64, "head size: expected an even dim / n_heads"},
        {24, 0, "max_seq_len: expected a positive value, found 0"},
        {20, INT32_MIN, "vocab_size: expected a positive value"},
        {0, 1 << 30, "dim: expected at most"},
        {8, 1 << 30, "n_layers: expected at most"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char* bytes = copy_of(f->legacy, f->legacy_size);
        put_int32(bytes, cases[i].offset, cases[i].value);
        if (cases[i].offset == 12 && cases[i].value == 64) put_int32(bytes, 16, 64); // keep kv heads dividing
        expect_rejected(bytes, f->legacy_size, cases[i].expected);
        free(bytes);
    }
}

// Sizes that would overflow 32 bits (and are near the limits for 64) are
// caught by the size check before any allocation.
static void test_absurd_sizes_do_not_overflow(void** state) {
    loader_fixture* f = *state;
    require_fixture(f);
    unsigned char* bytes = copy_of(f->legacy, 64);
    int32_t header[7] = {131072, 524288, 4096, 4096, 4096, 4194304, 4194304};
    memcpy(bytes, header, sizeof header);
    expect_rejected(bytes, 64, "truncated: expected|bytes, found 64");
    // vocab 2^22 with dim 2^17 alone is 2^39 floats: far past 32 bits.
    int32_t header2[7] = {131072, 8, 1, 2, 2, 4194304, 2};
    memcpy(bytes, header2, sizeof header2);
    expect_rejected(bytes, 64, "truncated: expected|bytes, found 64");
    free(bytes);
}

static void test_export_header_fields(void** state) {
    loader_fixture* f = *state;
    require_fixture(f);
    unsigned char* bytes = copy_of(f->v1, f->v1_size);
    put_int32(bytes, 4, 3);
    expect_rejected(bytes, f->v1_size, "version: expected 1 (fp32) or 2 (Q8_0), found 3");
    put_int32(bytes, 4, 1);
    bytes[36] = 7;
    expect_rejected(bytes, f->v1_size, "shared_classifier: expected 0 or 1, found 7");
    bytes[36] = 1;
    put_int32(bytes, 8 + 12, 5); // n_heads
    expect_rejected(bytes, f->v1_size, "n_heads: expected a divisor of dim 64, found 5");
    free(bytes);

    bytes = copy_of(f->v2, f->v2_size);
    put_int32(bytes, 37, 0);
    expect_rejected(bytes, f->v2_size, "group_size: expected a positive divisor of dim 64, found 0");
    put_int32(bytes, 37, 48);
    expect_rejected(bytes, f->v2_size, "group_size: expected a positive divisor of dim 64, found 48");
    put_int32(bytes, 37, 32); // a valid group size, but the file was written with 64
    expect_rejected(bytes, f->v2_size, "expected");
    free(bytes);
}

static void test_foreign_files(void** state) {
    (void)state;
    unsigned char gguf[64] = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    expect_rejected(gguf, sizeof gguf, "magic: GGUF files are not supported");
    // Text that is not a checkpoint at all.
    const char* text = "this is a README, not a model, and it is long enough to have a header\n";
    expect_rejected((const unsigned char*)text, strlen(text), "not a llama2.c checkpoint");

    model m;
    error_info err = {{0}};
    assert_int_equal(model_load(&m, "build/no/such/model.bin", MODEL_DTYPE_DEFAULT, &err), -1);
    assert_non_null(strstr(err.message, "build/no/such/model.bin: cannot open"));
    assert_int_equal(model_load(&m, "engine", MODEL_DTYPE_DEFAULT, &err), -1);
    assert_non_null(strstr(err.message, "engine: not a regular file"));
}

static void test_valid_files_still_load(void** state) {
    loader_fixture* f = *state;
    require_fixture(f);
    const unsigned char* files[3] = {f->legacy, f->v1, f->v2};
    size_t sizes[3] = {f->legacy_size, f->v1_size, f->v2_size};
    model_format formats[3] = {MODEL_FORMAT_LEGACY, MODEL_FORMAT_EXPORT_V1, MODEL_FORMAT_EXPORT_V2};
    for (int i = 0; i < 3; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/valid.bin", test_scratch_dir());
        assert_true(test_write_file(path, files[i], sizes[i]));
        model m;
        error_info err = {{0}};
        if (model_load(&m, path, MODEL_DTYPE_DEFAULT, &err)) fail_msg("%s", err.message);
        assert_int_equal(m.format, formats[i]);
        assert_int_equal(m.config.dim, 64);
        assert_int_equal(m.config.hidden_dim, 172);
        assert_int_equal(m.config.n_layers, 5);
        assert_int_equal(m.config.n_heads, 8);
        assert_int_equal(m.config.n_kv_heads, 4);
        assert_int_equal(m.config.vocab_size, 512);
        assert_int_equal(m.config.max_seq_len, 512);
        assert_true(m.config.shared_classifier);
        model_free(&m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncated_at_many_offsets),
        cmocka_unit_test(test_trailing_bytes),
        cmocka_unit_test(test_bad_dimensions),
        cmocka_unit_test(test_absurd_sizes_do_not_overflow),
        cmocka_unit_test(test_export_header_fields),
        cmocka_unit_test(test_foreign_files),
        cmocka_unit_test(test_valid_files_still_load),
    };
    return cmocka_run_group_tests_name("engine/model_loader", tests, setup, teardown);
}
