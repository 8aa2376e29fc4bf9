// Checks shared by test_matmul.c and test_matmul_int.c: the set and gated
// entry points (matmul_set_parallel, matmul_swiglu_parallel) against the
// calls they stand for, bit for bit, traffic included. Include after
// <cmocka.h> and kernels/cpu/matmul.h.
#ifndef SERVELAB_TESTS_MATMUL_SET_CHECK_H
#define SERVELAB_TESTS_MATMUL_SET_CHECK_H

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"

// (n, cols) floats; every byte 0xff (a NaN), so an unwritten output fails.
static float* set_check_outputs(int n_rows, int rows) {
    size_t bytes = (size_t)n_rows * (size_t)rows * sizeof(float);
    float* out = malloc(bytes + 1);
    assert_non_null(out);
    memset(out, 0xff, bytes);
    return out;
}

// w[0..n_matrices): matrices of the same cols, x: (n_rows, cols). For pools
// of 1 to 3 threads: the set's outputs equal one matmul_parallel each; when
// w[0] and w[1] have the same shape, the gated pair equals w[0] and w[1]
// then, per row, swiglu() (fp32 weights) or swiglu_vector(). Traffic adds
// up to the same figures.
static void check_set_matches_separate_calls(const weight_matrix* const* w, int n_matrices, const float* x,
                                             int n_rows, const char* what) {
    for (int threads = 1; threads <= 3; threads++) {
        thread_pool* pool;
        assert_int_equal(thread_pool_create(threads, &pool), 0);
        matmul_output outputs[MATMUL_SET_MAX + 2];
        float* expected[MATMUL_SET_MAX + 2];
        kernel_traffic expected_traffic = {0}, got_traffic = {0};
        for (int k = 0; k < n_matrices; k++) {
            expected[k] = set_check_outputs(n_rows, w[k]->rows);
            outputs[k] = (matmul_output){set_check_outputs(n_rows, w[k]->rows), w[k]};
            matmul_parallel(expected[k], x, n_rows, w[k], pool, &expected_traffic);
        }
        matmul_set_parallel(outputs, n_matrices, x, n_rows, pool, &got_traffic);
        for (int k = 0; k < n_matrices; k++)
            if (memcmp(outputs[k].out, expected[k], (size_t)n_rows * (size_t)w[k]->rows * sizeof(float)) != 0)
                fail_msg("%s, %d threads, %d rows: matrix %d of the set differs from matmul_parallel", what, threads,
                         n_rows, k);
        assert_memory_equal(&got_traffic, &expected_traffic, sizeof got_traffic);

        if (n_matrices >= 2 && w[0]->rows == w[1]->rows) {
            const int hidden = w[0]->rows;
            const size_t bytes = (size_t)n_rows * (size_t)hidden * sizeof(float);
            kernel_traffic separate = {0}, gated = {0};
            float* gate = set_check_outputs(n_rows, hidden);
            float* up = set_check_outputs(n_rows, hidden);
            matmul_parallel(gate, x, n_rows, w[0], pool, &separate);
            matmul_parallel(up, x, n_rows, w[1], pool, &separate);
            for (int r = 0; r < n_rows; r++) {
                float* gate_row = gate + (size_t)r * (size_t)hidden;
                const float* up_row = up + (size_t)r * (size_t)hidden;
                if (w[0]->dtype == WEIGHT_F32) swiglu(gate_row, up_row, hidden, &separate);
                else swiglu_vector(gate_row, up_row, hidden, &separate);
            }
            memcpy(expected[0], gate, bytes);
            memcpy(expected[1], up, bytes);
            memset(gate, 0xff, bytes);
            memset(up, 0xff, bytes);
            matmul_swiglu_parallel(gate, up, x, n_rows, w[0], w[1], pool, &gated);
            if (memcmp(gate, expected[0], bytes) != 0 || memcmp(up, expected[1], bytes) != 0)
                fail_msg("%s, %d threads, %d rows: the gated pair differs from two matmuls and swiglu", what, threads,
                         n_rows);
            assert_memory_equal(&gated, &separate, sizeof gated);
            free(gate);
            free(up);
        }
        for (int k = 0; k < n_matrices; k++) {
            free(expected[k]);
            free(outputs[k].out);
        }
        thread_pool_free(pool);
    }
}

#endif
