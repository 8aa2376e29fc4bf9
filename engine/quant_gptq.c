// GPTQ (Frantar et al. 2022): quantize a weight matrix one input column at
// a time and push each column's rounding error onto the columns not yet
// quantized, weighted by how the calibration inputs correlate them, so that
// the layer's OUTPUT error ||X W^T - X Q^T||^2 stays small even though each
// weight may move more than half a step. The correlation is the Hessian of
// that error, H = 2 X^T X; the update uses the upper Cholesky factor U of
// H^-1 (H^-1 = U^T U): quantizing column i with error e = (w_i - q_i) / U_ii
// subtracts e U_ij from every later column j. Follows the reference
// implementation (gptq.py, fasterquant) without act-order.
#include "engine/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/fault.h"

// ---- dense Cholesky helpers (n x n, row-major, double) --------------------------------

// In place: a (n, n) symmetric -> its lower factor L (a = L L^T); the upper
// triangle is zeroed. -1 when a pivot is not positive and finite.
static int cholesky_lower(double* a, int n) {
    for (int j = 0; j < n; j++) {
        double* row_j = a + (size_t)j * (size_t)n;
        double pivot = row_j[j];
        for (int k = 0; k < j; k++)
            pivot -= row_j[k] * row_j[k];
        if (!(pivot > 0.0) || !isfinite(pivot)) return -1;
        double diagonal = sqrt(pivot);
        row_j[j] = diagonal;
        for (int i = j + 1; i < n; i++) {
            double* row_i = a + (size_t)i * (size_t)n;
            double sum = row_i[j];
            for (int k = 0; k < j; k++)
                sum -= row_i[k] * row_j[k];
            row_i[j] = sum / diagonal;
        }
        for (int k = j + 1; k < n; k++)
            row_j[k] = 0.0;
    }
    return 0;
}

// h (n, n) positive definite -> u (n, n) upper with H^-1 = U^T U, as the
// reference's cholesky -> cholesky_inverse -> cholesky(upper=True).
// scratch: (n, n). h is overwritten. -1 when a factorisation fails.
static int inverse_cholesky_upper(double* h, double* u, double* scratch, int n) {
    size_t nn = (size_t)n;
    if (cholesky_lower(h, n)) return -1; // h = L
    // scratch = L^-1 (lower), by forward substitution column by column.
    memset(scratch, 0, nn * nn * sizeof *scratch);
    for (int j = 0; j < n; j++) {
        scratch[(size_t)j * nn + (size_t)j] = 1.0 / h[(size_t)j * nn + (size_t)j];
        for (int i = j + 1; i < n; i++) {
            double sum = 0.0;
            for (int k = j; k < i; k++)
                sum += h[(size_t)i * nn + (size_t)k] * scratch[(size_t)k * nn + (size_t)j];
            scratch[(size_t)i * nn + (size_t)j] = -sum / h[(size_t)i * nn + (size_t)i];
        }
    }
    // u = H^-1 = L^-T L^-1: (i, j) = sum_{k >= max(i, j)} Linv_ki Linv_kj.
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) {
            double sum = 0.0;
            for (int k = i; k < n; k++)
                sum += scratch[(size_t)k * nn + (size_t)i] * scratch[(size_t)k * nn + (size_t)j];
            u[(size_t)i * nn + (size_t)j] = sum;
            u[(size_t)j * nn + (size_t)i] = sum;
        }
    // H^-1 = L2 L2^T with L2 lower, so U = L2^T is its upper factor.
    if (cholesky_lower(u, n)) return -1;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            u[(size_t)i * nn + (size_t)j] = u[(size_t)j * nn + (size_t)i];
            u[(size_t)j * nn + (size_t)i] = 0.0;
        }
    return 0;
}

// ---- GPTQ ------------------------------------------------------------------------------

// When the factorisation fails (rounding makes a nearly singular H lose
// positive definiteness) the damping is raised tenfold, a few times, before
// giving up; 1e-4 is where a damp of 0 restarts.
#define GPTQ_DAMP_ATTEMPTS 5
#define GPTQ_DAMP_FLOOR 1e-4

int quant_gptq(const float* w, int rows, int cols, const float* x, int n_samples, const quant_scheme* scheme,
               float damp, int block_size, int32_t* codes, quant_params* params, error_info* err) {
    if (quant_scheme_validate(scheme, cols, err)) return -1;
    if (rows < 1) return error_set(err, "gptq: rows = %d: expected at least 1", rows);
    if (n_samples < 1 || !x) return error_set(err, "gptq: n_samples = %d: expected calibration inputs", n_samples);
    if (!(damp >= 0.0f) || !isfinite(damp)) return error_set(err, "gptq: damp = %g: expected >= 0", (double)damp);
    if (block_size < 1) return error_set(err, "gptq: block_size = %d: expected at least 1", block_size);
    if (!w || !codes || !params) return error_set(err, "gptq: weights, codes and params must not be NULL");

    size_t n = (size_t)cols;
    size_t weight_count = (size_t)rows * n;
    int bits = scheme->bits;
    bool symmetric = scheme->symmetric;
    int group_size = scheme->granularity == QUANT_PER_GROUP ? scheme->group_size : cols;
    double* hessian = malloc(n * n * sizeof *hessian);  // (cols, cols) 2 X^T X / n_samples
    double* damped = malloc(n * n * sizeof *damped);    // (cols, cols) H + damping
    double* upper = malloc(n * n * sizeof *upper);      // (cols, cols) U, H^-1 = U^T U
    double* scratch = malloc(n * n * sizeof *scratch);  // (cols, cols) L^-1
    double* work = malloc(weight_count * sizeof *work); // (rows, cols) W as it is updated
    double* block_error = malloc((size_t)rows * (size_t)block_size * sizeof *block_error); // (rows, block_size)
    float* group_values = malloc((size_t)(group_size > cols ? cols : group_size) * sizeof *group_values);
    float* row_values = malloc(n * sizeof *row_values); // (cols) one row, for params
    int status = 0;
    if (!hessian || !damped || !upper || !scratch || !work || !block_error || !group_values || !row_values) {
        status = error_set(err, "gptq: out of memory for %d x %d weights", rows, cols);
        goto done;
    }

    // H = 2 X^T X / n_samples. The 1/n_samples (as the reference averages)
    // only rescales H; GPTQ's updates e U_ij / U_ii and the relative damping
    // do not change with it.
    for (size_t i = 0; i < n; i++)
        for (size_t j = i; j < n; j++) {
            double sum = 0.0;
            for (int s = 0; s < n_samples; s++) {
                const float* xr = x + (size_t)s * n;
                sum += (double)xr[i] * (double)xr[j];
            }
            hessian[i * n + j] = hessian[j * n + i] = 2.0 * sum / (double)n_samples;
        }
    for (size_t k = 0; k < weight_count; k++)
        work[k] = (double)w[k];
    // A dead input (always 0 in the calibration data) gives H a zero row: set
    // H_ii = 1 and the weight column to 0, as the reference does; the column
    // never affects the output, and its codes then decode to exactly 0.
    double diagonal_sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (hessian[i * n + i] == 0.0) {
            hessian[i * n + i] = 1.0;
            for (int o = 0; o < rows; o++)
                work[(size_t)o * n + i] = 0.0;
        }
        diagonal_sum += hessian[i * n + i];
    }
    double diagonal_mean = diagonal_sum / (double)n;

    // Damping adds damp * mean(diag H) to the diagonal: X^T X is singular when
    // there are fewer samples than inputs, and the damping makes it invertible.
    double damp_now = (double)damp;
    int factorised = -1;
    for (int attempt = 0; attempt < GPTQ_DAMP_ATTEMPTS && factorised != 0; attempt++) {
        if (attempt > 0) damp_now = damp_now > 0.0 ? damp_now * 10.0 : GPTQ_DAMP_FLOOR;
        memcpy(damped, hessian, n * n * sizeof *damped);
        for (size_t i = 0; i < n; i++)
            damped[i * n + i] += damp_now * diagonal_mean;
        factorised = inverse_cholesky_upper(damped, upper, scratch, cols);
    }
    if (factorised != 0) {
        status = error_set(err,
                           "gptq: the Hessian 2 X^T X is not positive definite even with damp = %g "
                           "(are the calibration inputs finite?)",
                           damp_now);
        goto done;
    }

    // Per tensor and per channel take their (s, z) once, from the weights
    // GPTQ will quantize (dead columns already 0); groups take theirs below.
    if (scheme->granularity == QUANT_PER_TENSOR) {
        float* all = malloc(weight_count * sizeof *all);
        if (!all) {
            status = error_set(err, "gptq: out of memory for %d x %d weights", rows, cols);
            goto done;
        }
        for (size_t k = 0; k < weight_count; k++)
            all[k] = (float)work[k];
        params[0] = quant_params_for_values(all, weight_count, bits, symmetric, scheme->clip_search);
        free(all);
    } else if (scheme->granularity == QUANT_PER_CHANNEL) {
        for (int o = 0; o < rows; o++) {
            for (size_t i = 0; i < n; i++)
                row_values[i] = (float)work[(size_t)o * n + i];
            params[o] = quant_params_for_values(row_values, n, bits, symmetric, scheme->clip_search);
        }
    }

    // FAULT_GPTQ_NO_FEEDBACK: each column is rounded, but its error is never
    // pushed onto the later columns (GPTQ becomes RTN with GPTQ's groups).
    const bool feedback = !fault_on(FAULT_GPTQ_NO_FEEDBACK);
    // FAULT_GROUP_TENSOR_MAX: every group takes the whole matrix's (s, z).
    const bool groups_from_tensor = scheme->granularity == QUANT_PER_GROUP && fault_on(FAULT_GROUP_TENSOR_MAX);
    quant_params tensor_params = {0};
    if (groups_from_tensor) {
        float* all = malloc(weight_count * sizeof *all);
        if (!all) {
            status = error_set(err, "gptq: out of memory for %d x %d weights", rows, cols);
            goto done;
        }
        for (size_t k = 0; k < weight_count; k++)
            all[k] = (float)work[k];
        tensor_params = quant_params_for_values(all, weight_count, bits, symmetric, scheme->clip_search);
        free(all);
    }

    for (int block_start = 0; block_start < cols; block_start += block_size) {
        int block_end = block_start + block_size < cols ? block_start + block_size : cols;
        for (int i = block_start; i < block_end; i++) {
            if (scheme->granularity == QUANT_PER_GROUP && i % group_size == 0) {
                // The group's (s, z) come from its columns as they are now:
                // those inside this block already carry the updates from the
                // block's earlier columns; those beyond it still wait for the
                // block's lazy update, so add it here for them.
                int group_index = i / group_size;
                for (int o = 0; o < rows; o++) {
                    for (int j = i; j < i + group_size; j++) {
                        double value = work[(size_t)o * n + (size_t)j];
                        if (j >= block_end)
                            for (int k = block_start; k < i; k++)
                                value -= block_error[(size_t)o * (size_t)block_size + (size_t)(k - block_start)] *
                                         upper[(size_t)k * n + (size_t)j];
                        group_values[j - i] = (float)value;
                    }
                    params[o * (cols / group_size) + group_index] =
                        groups_from_tensor ? tensor_params
                                           : quant_params_for_values(group_values, (size_t)group_size, bits, symmetric,
                                                                     scheme->clip_search);
                }
            }
            // Quantize column i and spread its error over the rest of the block.
            double d = upper[(size_t)i * n + (size_t)i];
            for (int o = 0; o < rows; o++) {
                double* row = work + (size_t)o * n;
                const quant_params* p = &params[quant_param_index(o, i, rows, cols, scheme)];
                int32_t q = quant_quantize((float)row[i], p, bits, symmetric, NULL);
                codes[(size_t)o * n + (size_t)i] = q;
                double e = feedback ? (row[i] - (double)quant_dequantize(q, p)) / d : 0.0;
                block_error[(size_t)o * (size_t)block_size + (size_t)(i - block_start)] = e;
                const double* u_row = upper + (size_t)i * n;
                for (int j = i + 1; j < block_end; j++)
                    row[j] -= e * u_row[j];
            }
        }
        // The lazy batched update: the block's errors reach the later columns
        // in one pass, W[:, end:] -= E U[block, end:].
        for (int o = 0; o < rows; o++) {
            double* row = work + (size_t)o * n;
            for (int k = block_start; k < block_end; k++) {
                double e = block_error[(size_t)o * (size_t)block_size + (size_t)(k - block_start)];
                const double* u_row = upper + (size_t)k * n;
                for (int j = block_end; j < cols; j++)
                    row[j] -= e * u_row[j];
            }
        }
    }

done:
    free(hessian);
    free(damped);
    free(upper);
    free(scratch);
    free(work);
    free(block_error);
    free(group_values);
    free(row_values);
    return status;
}
