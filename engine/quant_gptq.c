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

// ---- the Hessian and its factor --------------------------------------------------------

// When the factorisation fails (rounding makes a nearly singular H lose
// positive definiteness) the damping is raised tenfold, a few times, before
// giving up; 1e-4 is where a damp of 0 restarts.
#define GPTQ_DAMP_ATTEMPTS 5
#define GPTQ_DAMP_FLOOR 1e-4

// hessian (n, n) = 2 X^T X / n_samples, x: (n_samples, n). The 1/n_samples
// (as the reference averages) only rescales H; GPTQ's updates e U_ij / U_ii
// and the relative damping do not change with it.
static void hessian_of_inputs(const float* x, int n_samples, size_t n, double* hessian) {
    for (size_t i = 0; i < n; i++)
        for (size_t j = i; j < n; j++) {
            double sum = 0.0;
            for (int s = 0; s < n_samples; s++) {
                const float* xr = x + (size_t)s * n;
                sum += (double)xr[i] * (double)xr[j];
            }
            hessian[i * n + j] = hessian[j * n + i] = 2.0 * sum / (double)n_samples;
        }
}

// A dead input (always 0 in the calibration data) gives H a zero row: set
// H_ii = 1 and the weight column to 0, as the reference does; the column
// never affects the output, and its codes then decode to exactly 0.
// work: (rows, n). Returns the mean of H's diagonal afterwards.
static double drop_dead_inputs(double* hessian, double* work, int rows, size_t n) {
    double diagonal_sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (hessian[i * n + i] == 0.0) {
            hessian[i * n + i] = 1.0;
            for (int o = 0; o < rows; o++)
                work[(size_t)o * n + i] = 0.0;
        }
        diagonal_sum += hessian[i * n + i];
    }
    return diagonal_sum / (double)n;
}

// upper (n, n) = U of (H + damping)^-1 = U^T U. Damping adds damp * mean(diag
// H) to the diagonal: X^T X is singular when there are fewer samples than
// inputs, and the damping makes it invertible. damped and scratch: (n, n).
// *damp_used gets the last damping tried; -1 when every attempt failed.
static int factorise_damped_inverse(const double* hessian, double diagonal_mean, double damp, int cols,
                                    double* damped, double* upper, double* scratch, double* damp_used) {
    size_t n = (size_t)cols;
    int factorised = -1;
    for (int attempt = 0; attempt < GPTQ_DAMP_ATTEMPTS && factorised != 0; attempt++) {
        if (attempt > 0) damp = damp > 0.0 ? damp * 10.0 : GPTQ_DAMP_FLOOR;
        memcpy(damped, hessian, n * n * sizeof *damped);
        for (size_t i = 0; i < n; i++)
            damped[i * n + i] += damp * diagonal_mean;
        factorised = inverse_cholesky_upper(damped, upper, scratch, cols);
    }
    *damp_used = damp;
    return factorised;
}

// ---- the columns, one at a time -------------------------------------------------------

// What quantizing the columns reads and writes.
typedef struct gptq_columns {
    int rows, cols;
    const quant_scheme* scheme;
    int group_size;             // columns per (s, z): the scheme's group, else cols
    int block_size;             // columns between lazy updates
    double* work;               // (rows, cols) W as it is updated
    const double* upper;        // (cols, cols) U, H^-1 = U^T U
    double* block_error;        // (rows, block_size) scaled errors of the current block's columns
    float* group_values;        // (group_size) one row of a group, for its (s, z)
    int32_t* codes;             // (rows, cols) the result
    quant_params* params;       // the scheme's parameter sets (quant_param_count)
    bool feedback;              // false under FAULT_GPTQ_NO_FEEDBACK: errors are not pushed on
    bool groups_from_tensor;    // true under FAULT_GROUP_TENSOR_MAX: every group takes tensor_params
    quant_params tensor_params; // the whole matrix's (s, z), under that fault only
} gptq_columns;

// The (s, z) of the whole of work (rows * cols values), as fp32 like the
// other quantizers see weights. -1 when out of memory.
static int params_of_whole_matrix(const gptq_columns* g, quant_params* out) {
    size_t weight_count = (size_t)g->rows * (size_t)g->cols;
    float* all = malloc(weight_count * sizeof *all);
    if (!all) return -1;
    for (size_t k = 0; k < weight_count; k++)
        all[k] = (float)g->work[k];
    *out = quant_params_for_values(all, weight_count, g->scheme->bits, g->scheme->symmetric, g->scheme->clip_search);
    free(all);
    return 0;
}

// Per tensor and per channel take their (s, z) once, from the weights GPTQ
// will quantize (dead columns already 0); groups take theirs as they come.
// row_values: (cols). -1 when out of memory.
static int params_before_the_columns(gptq_columns* g, float* row_values) {
    const quant_scheme* scheme = g->scheme;
    size_t n = (size_t)g->cols;
    if (scheme->granularity == QUANT_PER_TENSOR) return params_of_whole_matrix(g, &g->params[0]);
    if (scheme->granularity == QUANT_PER_CHANNEL)
        for (int o = 0; o < g->rows; o++) {
            for (size_t i = 0; i < n; i++)
                row_values[i] = (float)g->work[(size_t)o * n + i];
            g->params[o] = quant_params_for_values(row_values, n, scheme->bits, scheme->symmetric, scheme->clip_search);
        }
    return 0;
}

// The (s, z) of the group starting at column i, in every row, from its
// columns as they are now: those inside this block already carry the
// updates from the block's earlier columns; those beyond it still wait for
// the block's lazy update, so add it here for them.
static void group_params(gptq_columns* g, int i, int block_start, int block_end) {
    size_t n = (size_t)g->cols;
    int group_index = i / g->group_size;
    for (int o = 0; o < g->rows; o++) {
        for (int j = i; j < i + g->group_size; j++) {
            double value = g->work[(size_t)o * n + (size_t)j];
            if (j >= block_end)
                for (int k = block_start; k < i; k++)
                    value -= g->block_error[(size_t)o * (size_t)g->block_size + (size_t)(k - block_start)] *
                             g->upper[(size_t)k * n + (size_t)j];
            g->group_values[j - i] = (float)value;
        }
        g->params[o * (g->cols / g->group_size) + group_index] =
            g->groups_from_tensor ? g->tensor_params
                                  : quant_params_for_values(g->group_values, (size_t)g->group_size, g->scheme->bits,
                                                            g->scheme->symmetric, g->scheme->clip_search);
    }
}

// Quantizes column i and spreads its error over the rest of the block.
static void quantize_column(gptq_columns* g, int i, int block_start, int block_end) {
    size_t n = (size_t)g->cols;
    double d = g->upper[(size_t)i * n + (size_t)i];
    for (int o = 0; o < g->rows; o++) {
        double* row = g->work + (size_t)o * n;
        const quant_params* p = &g->params[quant_param_index(o, i, g->rows, g->cols, g->scheme)];
        int32_t q = quant_quantize((float)row[i], p, g->scheme->bits, g->scheme->symmetric, NULL);
        g->codes[(size_t)o * n + (size_t)i] = q;
        double e = g->feedback ? (row[i] - (double)quant_dequantize(q, p)) / d : 0.0;
        g->block_error[(size_t)o * (size_t)g->block_size + (size_t)(i - block_start)] = e;
        const double* u_row = g->upper + (size_t)i * n;
        for (int j = i + 1; j < block_end; j++)
            row[j] -= e * u_row[j];
    }
}

// The lazy batched update: the block's errors reach the later columns in
// one pass, W[:, end:] -= E U[block, end:].
static void update_later_columns(gptq_columns* g, int block_start, int block_end) {
    size_t n = (size_t)g->cols;
    for (int o = 0; o < g->rows; o++) {
        double* row = g->work + (size_t)o * n;
        for (int k = block_start; k < block_end; k++) {
            double e = g->block_error[(size_t)o * (size_t)g->block_size + (size_t)(k - block_start)];
            const double* u_row = g->upper + (size_t)k * n;
            for (int j = block_end; j < g->cols; j++)
                row[j] -= e * u_row[j];
        }
    }
}

// ---- GPTQ ------------------------------------------------------------------------------

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

    // 1. H from the inputs; W in double, dead input columns zeroed.
    hessian_of_inputs(x, n_samples, n, hessian);
    for (size_t k = 0; k < weight_count; k++)
        work[k] = (double)w[k];
    double diagonal_mean = drop_dead_inputs(hessian, work, rows, n);

    // 2. U, the upper Cholesky factor of the damped H^-1.
    double damp_used = 0.0;
    if (factorise_damped_inverse(hessian, diagonal_mean, (double)damp, cols, damped, upper, scratch, &damp_used)) {
        status = error_set(err,
                           "gptq: the Hessian 2 X^T X is not positive definite even with damp = %g "
                           "(are the calibration inputs finite?)",
                           damp_used);
        goto done;
    }

    // 3. The (s, z) known before the first column.
    gptq_columns g = {.rows = rows, .cols = cols, .scheme = scheme, .group_size = group_size, .block_size = block_size,
                      .work = work, .upper = upper, .block_error = block_error, .group_values = group_values,
                      .codes = codes, .params = params};
    // FAULT_GPTQ_NO_FEEDBACK: each column is rounded, but its error is never
    // pushed onto the later columns (GPTQ becomes RTN with GPTQ's groups).
    g.feedback = !fault_on(FAULT_GPTQ_NO_FEEDBACK);
    // FAULT_GROUP_TENSOR_MAX: every group takes the whole matrix's (s, z).
    g.groups_from_tensor = scheme->granularity == QUANT_PER_GROUP && fault_on(FAULT_GROUP_TENSOR_MAX);
    if (params_before_the_columns(&g, row_values) ||
        (g.groups_from_tensor && params_of_whole_matrix(&g, &g.tensor_params))) {
        status = error_set(err, "gptq: out of memory for %d x %d weights", rows, cols);
        goto done;
    }

    // 4. Column by column, in blocks of block_size between lazy updates.
    for (int block_start = 0; block_start < cols; block_start += block_size) {
        int block_end = block_start + block_size < cols ? block_start + block_size : cols;
        for (int i = block_start; i < block_end; i++) {
            if (scheme->granularity == QUANT_PER_GROUP && i % group_size == 0)
                group_params(&g, i, block_start, block_end);
            quantize_column(&g, i, block_start, block_end);
        }
        update_later_columns(&g, block_start, block_end);
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
