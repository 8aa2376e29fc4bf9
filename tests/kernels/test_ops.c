// The fused element-wise ops give the same bits as the separate steps they
// replace (residual add then RMSNorm; RoPE from precomputed rotations), and
// count the memory they save.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "tests/test_support.h"

#define ROWS 3
#define SIZE 67 // odd, so no vector width divides it

// Deterministic values in about [-scale, scale].
static void fill(float* x, int n, unsigned seed, float scale) {
    unsigned state = seed * 2654435761u + 1u;
    for (int i = 0; i < n; i++) {
        state = state * 1664525u + 1013904223u;
        x[i] = scale * ((float)(state >> 8) / (float)(1u << 24) * 2.0f - 1.0f);
    }
}

static void test_residual_rmsnorm_equals_separate_steps(void** state) {
    (void)state;
    float x[ROWS * SIZE], delta[ROWS * SIZE], weight[SIZE];
    fill(x, ROWS * SIZE, 1, 3.0f);
    fill(delta, ROWS * SIZE, 2, 0.7f);
    fill(weight, SIZE, 3, 1.5f);
    float separate_x[ROWS * SIZE], separate_out[ROWS * SIZE], fused_x[ROWS * SIZE], fused_out[ROWS * SIZE];
    memcpy(separate_x, x, sizeof x);
    memcpy(fused_x, x, sizeof x);
    kernel_traffic separate = {0}, fused = {0};
    for (int r = 0; r < ROWS; r++) residual_add(separate_x + r * SIZE, delta + r * SIZE, SIZE, &separate);
    rmsnorm(separate_out, separate_x, weight, ROWS, SIZE, 1e-5f, &separate);
    const float* deltas[1] = {delta};
    residual_rmsnorm(fused_out, fused_x, deltas, 1, weight, ROWS, SIZE, 1e-5f, &fused);
    assert_memory_equal(fused_x, separate_x, sizeof x);
    assert_memory_equal(fused_out, separate_out, sizeof x);
    // One pass fewer: read x, read delta, write x, write out (4) instead of 3 + 2.
    assert_int_equal(separate.activation_bytes, 5ull * ROWS * SIZE * 4);
    assert_int_equal(fused.activation_bytes, 4ull * ROWS * SIZE * 4);
    assert_int_equal(fused.weight_bytes_read, SIZE * 4);
    assert_int_equal(separate.weight_bytes_read, SIZE * 4);
}

// Several deltas (tensor-parallel partial sums) are reduced in order, then added.
static void test_residual_rmsnorm_reduces_partials_in_order(void** state) {
    (void)state;
    float x[ROWS * SIZE], parts[3][ROWS * SIZE], expected[ROWS * SIZE];
    fill(x, ROWS * SIZE, 4, 2.0f);
    for (int k = 0; k < 3; k++) fill(parts[k], ROWS * SIZE, 5 + (unsigned)k, 1.0f);
    for (int i = 0; i < ROWS * SIZE; i++) {
        float sum = parts[0][i] + parts[1][i];
        sum += parts[2][i];
        expected[i] = x[i] + sum;
    }
    const float* deltas[3] = {parts[0], parts[1], parts[2]};
    kernel_traffic traffic = {0};
    residual_rmsnorm(NULL, x, deltas, 3, NULL, ROWS, SIZE, 1e-5f, &traffic); // no norm: the residual alone
    assert_memory_equal(x, expected, sizeof x);
    assert_int_equal(traffic.activation_bytes, 5ull * ROWS * SIZE * 4); // x read + 3 deltas + x written
    assert_int_equal(traffic.weight_bytes_read, 0);
}

static void test_rope_rotate_equals_rope(void** state) {
    (void)state;
    enum { HEADS = 8, KV_HEADS = 2, HEAD_DIM = 16 };
    float query[HEADS * HEAD_DIM], key[KV_HEADS * HEAD_DIM];
    float rotations[HEAD_DIM];
    for (int position = 0; position < 300; position += 37) {
        fill(query, HEADS * HEAD_DIM, 10 + (unsigned)position, 1.0f);
        fill(key, KV_HEADS * HEAD_DIM, 20 + (unsigned)position, 1.0f);
        float query_ref[HEADS * HEAD_DIM], key_ref[KV_HEADS * HEAD_DIM], query_before[HEADS * HEAD_DIM];
        memcpy(query_before, query, sizeof query);
        memcpy(query_ref, query, sizeof query);
        memcpy(key_ref, key, sizeof key);
        kernel_traffic reference = {0}, fused = {0};
        rope(query_ref, key_ref, position, HEADS, KV_HEADS, HEAD_DIM, &reference);
        rope_rotations(rotations, position, HEAD_DIM);
        rope_rotate(query, key, rotations, HEADS, KV_HEADS, HEAD_DIM, &fused);
        assert_memory_equal(query, query_ref, sizeof query);
        assert_memory_equal(key, key_ref, sizeof key);
        assert_int_equal(fused.activation_bytes, reference.activation_bytes);
        // Position 0 is the identity; any other position really rotates.
        assert_true((memcmp(query, query_before, sizeof query) != 0) == (position > 0));
    }
}

// swiglu_vector against libm's swiglu(): close (its exp is within 2 ulp of
// expf, then a division and two products) over the range a feed-forward
// sees and past it, signed zeros and tiny values included; and each
// element's bits do not depend on where a call's span starts or ends (the
// gated matmul applies it chunk by chunk).
static void test_swiglu_vector_close_to_libm_and_split_invariant(void** state) {
    (void)state;
    enum { N = 2003 };
    float gate[N], up[N], vector_out[N], libm_out[N], pieces[N];
    for (int i = 0; i < N; i++) {
        gate[i] = -100.0f + 200.0f * (float)i / (float)(N - 1); // -100 .. 100
        up[i] = 0.5f + (float)(i % 7) * 0.25f;
    }
    const float specials[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 88.0f, -88.0f, 90.0f, -90.0f, 1.0f, -1.0f};
    for (int k = 0; k < 10; k++) gate[k * 97] = specials[k];
    memcpy(vector_out, gate, sizeof gate);
    memcpy(libm_out, gate, sizeof gate);
    kernel_traffic traffic = {0};
    swiglu_vector(vector_out, up, N, &traffic);
    swiglu(libm_out, up, N, NULL);
    assert_int_equal(traffic.activation_bytes, 3ull * N * sizeof(float));
    for (int i = 0; i < N; i++) {
        float expected = libm_out[i], got = vector_out[i];
        // Past -87 libm's e^-x overflows to inf and gives -0; exp8 clamps and gives a
        // product below 1e-36: the same nothing, a different float.
        if (!(fabsf(got - expected) <= 4e-7f * fabsf(expected) + 1e-35f))
            fail_msg("swiglu_vector(%.9g) * %.3g = %.9g, libm gives %.9g", (double)gate[i], (double)up[i],
                     (double)got, (double)expected);
    }
    // The same array in spans of 1 to 11 elements, each span a call of its own.
    memcpy(pieces, gate, sizeof gate);
    for (int begin = 0, span = 1; begin < N; begin += span, span = span % 11 + 1) {
        int size = N - begin < span ? N - begin : span;
        swiglu_vector(pieces + begin, up + begin, size, NULL);
    }
    assert_memory_equal(pieces, vector_out, sizeof pieces);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_residual_rmsnorm_equals_separate_steps),
        cmocka_unit_test(test_residual_rmsnorm_reduces_partials_in_order),
        cmocka_unit_test(test_rope_rotate_equals_rope),
        cmocka_unit_test(test_swiglu_vector_close_to_libm_and_split_invariant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
