// AWQ (activation-aware weight quantization, Lin et al. 2023): a few input
// channels carry much larger activations than the rest, and the weights
// that multiply them matter most. Scaling those weight columns up by s_c
// before rounding gives them relatively finer steps; dividing the input by
// s_c (folded into the preceding RMSNorm gain) keeps the product unchanged:
//   x W^T = (x / s) (W diag(s))^T  ~  (x / s) RTN(W diag(s))^T
// s_c = mean|x_c|^alpha, with alpha chosen on a grid by the output error on
// calibration inputs. No Hessian: only the activation magnitudes.
#include "engine/quant.h"

#include <math.h>
#include <stdlib.h>

#include "engine/fault.h"

// alpha = 0, 0.05, ..., 1.0, as the AWQ reference's grid of 20 steps.
#define AWQ_GRID_STEPS 20

// The AWQ reference clamps s at 1e-4 so that a silent channel (mean|x| = 0)
// does not get an infinite 1/s.
#define AWQ_MIN_SCALE 1e-4

// s_c = max(mean|x_c|^alpha, 1e-4) / sqrt(max_c s_c * min_c s_c): dividing by
// the geometric middle of the extremes centres the scales around 1 (their
// largest and smallest are reciprocal), so W diag(s) keeps its magnitude
// and neither W s nor x / s drifts towards fp16 overflow or underflow.
// alpha = 0 gives s = 1 exactly: plain RTN is always one of the candidates.
static void awq_scales_for_alpha(const double* mean_abs, int cols, double alpha, float* scales) {
    double largest = 0.0, smallest = INFINITY;
    for (int c = 0; c < cols; c++) {
        double s = pow(mean_abs[c], alpha);
        if (!(s >= AWQ_MIN_SCALE)) s = AWQ_MIN_SCALE;
        scales[c] = (float)s;
        if ((double)scales[c] > largest) largest = (double)scales[c];
        if ((double)scales[c] < smallest) smallest = (double)scales[c];
    }
    double centre = sqrt(largest * smallest);
    for (int c = 0; c < cols; c++)
        scales[c] = (float)((double)scales[c] / centre);
}

static int awq_check_arguments(const float* const* matrices, const int* rows, int n_matrices, int cols,
                               const float* x, int n_samples, const quant_scheme* scheme,
                               const float* channel_scales, const float* alpha, error_info* err) {
    if (quant_scheme_validate(scheme, cols, err)) return -1;
    if (n_matrices < 1 || !matrices || !rows)
        return error_set(err, "awq: n_matrices = %d: expected at least 1 matrix with its rows", n_matrices);
    if (n_samples < 1 || !x) return error_set(err, "awq: n_samples = %d: expected calibration inputs", n_samples);
    if (!channel_scales || !alpha) return error_set(err, "awq: channel_scales and alpha must not be NULL");
    for (int m = 0; m < n_matrices; m++)
        if (rows[m] < 1 || !matrices[m])
            return error_set(err, "awq: matrix %d: rows = %d: expected at least 1 and values", m, rows[m]);
    return 0;
}

// The buffers one search needs, sized for the largest matrix.
typedef struct {
    double* mean_abs;        // (cols) mean |x_c|
    double* reference;       // (n_samples, total_rows) x W^T
    float* scales;           // (cols) candidate s
    float* scaled_input;     // (n_samples, cols) x / s
    float* scaled_weights;   // (max_rows, cols) W diag(s)
    float* rounded;          // (max_rows, cols) RTN(W diag(s))
    int32_t* codes;          // (max_rows, cols)
    quant_params* params;    // quant_param_count(max_rows, cols)
    size_t total_rows;       // rows summed over the matrices
} awq_workspace;

static void awq_workspace_free(awq_workspace* ws) {
    free(ws->mean_abs);
    free(ws->reference);
    free(ws->scales);
    free(ws->scaled_input);
    free(ws->scaled_weights);
    free(ws->rounded);
    free(ws->codes);
    free(ws->params);
}

// Returns false when any buffer is missing; the caller frees what was got.
static bool awq_workspace_alloc(awq_workspace* ws, const int* rows, int n_matrices, int cols, int n_samples,
                                const quant_scheme* scheme) {
    int max_rows = 0;
    ws->total_rows = 0;
    for (int m = 0; m < n_matrices; m++) {
        if (rows[m] > max_rows) max_rows = rows[m];
        ws->total_rows += (size_t)rows[m];
    }
    size_t matrix_size = (size_t)max_rows * (size_t)cols;
    size_t input_size = (size_t)n_samples * (size_t)cols;
    ws->mean_abs = calloc((size_t)cols, sizeof *ws->mean_abs);
    ws->reference = malloc((size_t)n_samples * ws->total_rows * sizeof *ws->reference);
    ws->scales = malloc((size_t)cols * sizeof *ws->scales);
    ws->scaled_input = malloc(input_size * sizeof *ws->scaled_input);
    ws->scaled_weights = malloc(matrix_size * sizeof *ws->scaled_weights);
    ws->rounded = malloc(matrix_size * sizeof *ws->rounded);
    ws->codes = malloc(matrix_size * sizeof *ws->codes);
    ws->params = malloc((size_t)quant_param_count(max_rows, cols, scheme) * sizeof *ws->params);
    return ws->mean_abs && ws->reference && ws->scales && ws->scaled_input && ws->scaled_weights && ws->rounded &&
           ws->codes && ws->params;
}

// The statistic AWQ scales by: mean |x_c| over the calibration tokens.
// mean_abs arrives zeroed (calloc).
static void awq_mean_abs(const float* x, int n_samples, int cols, double* mean_abs) {
    for (int n = 0; n < n_samples; n++)
        for (int c = 0; c < cols; c++)
            mean_abs[c] += fabs((double)x[(size_t)n * (size_t)cols + (size_t)c]);
    for (int c = 0; c < cols; c++)
        mean_abs[c] /= (double)n_samples;
}

// Dot product in double, in a fixed order, so that reference and candidate
// outputs are summed the same way.
static double awq_dot(const float* a, const float* b, int cols) {
    double sum = 0.0;
    for (int c = 0; c < cols; c++)
        sum += (double)a[c] * (double)b[c];
    return sum;
}

// The unquantized outputs x W^T of every matrix, once.
static void awq_reference_outputs(const float* const* matrices, const int* rows, int n_matrices, int cols,
                                  const float* x, int n_samples, awq_workspace* ws) {
    size_t out_offset = 0;
    for (int m = 0; m < n_matrices; m++) {
        for (int n = 0; n < n_samples; n++)
            for (int o = 0; o < rows[m]; o++)
                ws->reference[(size_t)n * ws->total_rows + out_offset + (size_t)o] =
                    awq_dot(x + (size_t)n * (size_t)cols, matrices[m] + (size_t)o * (size_t)cols, cols);
        out_offset += (size_t)rows[m];
    }
}

// || x W^T - (x / s) RTN(W diag(s))^T ||^2, summed over the matrices, for the
// scales in ws->scales. Returns -1 when rounding fails (err says why).
static int awq_candidate_error(const float* const* matrices, const int* rows, int n_matrices, int cols,
                               const float* x, int n_samples, const quant_scheme* scheme, awq_workspace* ws,
                               double* error, error_info* err) {
    size_t input_size = (size_t)n_samples * (size_t)cols;
    for (size_t k = 0; k < input_size; k++)
        ws->scaled_input[k] = x[k] / ws->scales[k % (size_t)cols];
    *error = 0.0;
    size_t out_offset = 0;
    for (int m = 0; m < n_matrices; m++) {
        size_t size = (size_t)rows[m] * (size_t)cols;
        for (size_t k = 0; k < size; k++)
            ws->scaled_weights[k] = matrices[m][k] * ws->scales[k % (size_t)cols];
        if (quant_matrix_rtn(ws->scaled_weights, rows[m], cols, scheme, ws->codes, ws->params, err)) return -1;
        quant_matrix_dequantize(ws->codes, ws->params, rows[m], cols, scheme, ws->rounded);
        for (int n = 0; n < n_samples; n++)
            for (int o = 0; o < rows[m]; o++) {
                double sum = awq_dot(ws->scaled_input + (size_t)n * (size_t)cols,
                                     ws->rounded + (size_t)o * (size_t)cols, cols);
                double e = ws->reference[(size_t)n * ws->total_rows + out_offset + (size_t)o] - sum;
                *error += e * e;
            }
        out_offset += (size_t)rows[m];
    }
    return 0;
}

// Tries alpha on the grid and keeps the scales with the least output error.
static int awq_grid_search(const float* const* matrices, const int* rows, int n_matrices, int cols,
                           const float* x, int n_samples, const quant_scheme* scheme, awq_workspace* ws,
                           float* channel_scales, float* alpha, error_info* err) {
    double best_error = INFINITY;
    for (int step = 0; step <= AWQ_GRID_STEPS; step++) {
        double candidate_alpha = (double)step / AWQ_GRID_STEPS;
        awq_scales_for_alpha(ws->mean_abs, cols, candidate_alpha, ws->scales);
        double error;
        if (awq_candidate_error(matrices, rows, n_matrices, cols, x, n_samples, scheme, ws, &error, err))
            return -1;
        // Strictly better only: ties keep the smaller alpha (alpha = 0 is RTN),
        // so AWQ is never worse than RTN on the calibration inputs.
        if (step == 0 || error < best_error) {
            best_error = error;
            *alpha = (float)candidate_alpha;
            for (int c = 0; c < cols; c++)
                channel_scales[c] = ws->scales[c];
        }
    }
    return 0;
}

int quant_awq_search(const float* const* matrices, const int* rows, int n_matrices, int cols, const float* x,
                     int n_samples, const quant_scheme* scheme, float* channel_scales, float* alpha, error_info* err) {
    if (awq_check_arguments(matrices, rows, n_matrices, cols, x, n_samples, scheme, channel_scales, alpha, err))
        return -1;
    awq_workspace ws = {0};
    int status = 0;
    if (!awq_workspace_alloc(&ws, rows, n_matrices, cols, n_samples, scheme)) {
        status = error_set(err, "awq: out of memory for %d samples x %d inputs", n_samples, cols);
        goto done;
    }
    awq_mean_abs(x, n_samples, cols, ws.mean_abs);
    awq_reference_outputs(matrices, rows, n_matrices, cols, x, n_samples, &ws);
    status = awq_grid_search(matrices, rows, n_matrices, cols, x, n_samples, scheme, &ws, channel_scales, alpha, err);

    // FAULT_AWQ_NO_SCALING: the search ran and *alpha says what it chose, but
    // the scales handed on are 1, so the caller quantizes (and divides the
    // input by) nothing: the weights go to RTN unscaled.
    if (status == 0 && fault_on(FAULT_AWQ_NO_SCALING))
        for (int c = 0; c < cols; c++)
            channel_scales[c] = 1.0f;

done:
    awq_workspace_free(&ws);
    return status;
}
