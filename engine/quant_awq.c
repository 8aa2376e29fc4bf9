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

int quant_awq_search(const float* const* matrices, const int* rows, int n_matrices, int cols, const float* x,
                     int n_samples, const quant_scheme* scheme, float* channel_scales, float* alpha, error_info* err) {
    if (quant_scheme_validate(scheme, cols, err)) return -1;
    if (n_matrices < 1 || !matrices || !rows)
        return error_set(err, "awq: n_matrices = %d: expected at least 1 matrix with its rows", n_matrices);
    if (n_samples < 1 || !x) return error_set(err, "awq: n_samples = %d: expected calibration inputs", n_samples);
    if (!channel_scales || !alpha) return error_set(err, "awq: channel_scales and alpha must not be NULL");
    int max_rows = 0;
    size_t total_rows = 0;
    for (int m = 0; m < n_matrices; m++) {
        if (rows[m] < 1 || !matrices[m])
            return error_set(err, "awq: matrix %d: rows = %d: expected at least 1 and values", m, rows[m]);
        if (rows[m] > max_rows) max_rows = rows[m];
        total_rows += (size_t)rows[m];
    }

    size_t matrix_size = (size_t)max_rows * (size_t)cols;
    size_t input_size = (size_t)n_samples * (size_t)cols;
    double* mean_abs = calloc((size_t)cols, sizeof *mean_abs);                      // (cols) mean |x_c|
    double* reference = malloc((size_t)n_samples * total_rows * sizeof *reference); // (n_samples, total_rows) x W^T
    float* scales = malloc((size_t)cols * sizeof *scales);                          // (cols) candidate s
    float* scaled_input = malloc(input_size * sizeof *scaled_input);                // (n_samples, cols) x / s
    float* scaled_weights = malloc(matrix_size * sizeof *scaled_weights);           // (rows, cols) W diag(s)
    float* rounded = malloc(matrix_size * sizeof *rounded);                         // (rows, cols) RTN(W diag(s))
    int32_t* codes = malloc(matrix_size * sizeof *codes);                           // (rows, cols)
    quant_params* params = malloc((size_t)quant_param_count(max_rows, cols, scheme) * sizeof *params);
    int status = 0;
    if (!mean_abs || !reference || !scales || !scaled_input || !scaled_weights || !rounded || !codes || !params) {
        status = error_set(err, "awq: out of memory for %d samples x %d inputs", n_samples, cols);
        goto done;
    }

    // The statistic AWQ scales by: mean |x_c| over the calibration tokens.
    for (int n = 0; n < n_samples; n++)
        for (int c = 0; c < cols; c++)
            mean_abs[c] += fabs((double)x[(size_t)n * (size_t)cols + (size_t)c]);
    for (int c = 0; c < cols; c++)
        mean_abs[c] /= (double)n_samples;

    // The unquantized outputs, once (dot products in double, fixed order).
    size_t out_offset = 0;
    for (int m = 0; m < n_matrices; m++) {
        for (int n = 0; n < n_samples; n++)
            for (int o = 0; o < rows[m]; o++) {
                const float* xr = x + (size_t)n * (size_t)cols;
                const float* wr = matrices[m] + (size_t)o * (size_t)cols;
                double sum = 0.0;
                for (int c = 0; c < cols; c++)
                    sum += (double)xr[c] * (double)wr[c];
                reference[(size_t)n * total_rows + out_offset + (size_t)o] = sum;
            }
        out_offset += (size_t)rows[m];
    }

    double best_error = INFINITY;
    for (int step = 0; step <= AWQ_GRID_STEPS; step++) {
        double candidate_alpha = (double)step / AWQ_GRID_STEPS;
        awq_scales_for_alpha(mean_abs, cols, candidate_alpha, scales);
        for (size_t k = 0; k < input_size; k++)
            scaled_input[k] = x[k] / scales[k % (size_t)cols];

        // || x W^T - (x / s) RTN(W diag(s))^T ||^2, summed over the matrices.
        double error = 0.0;
        out_offset = 0;
        for (int m = 0; m < n_matrices; m++) {
            size_t size = (size_t)rows[m] * (size_t)cols;
            for (size_t k = 0; k < size; k++)
                scaled_weights[k] = matrices[m][k] * scales[k % (size_t)cols];
            if (quant_matrix_rtn(scaled_weights, rows[m], cols, scheme, codes, params, err)) {
                status = -1;
                goto done;
            }
            quant_matrix_dequantize(codes, params, rows[m], cols, scheme, rounded);
            for (int n = 0; n < n_samples; n++)
                for (int o = 0; o < rows[m]; o++) {
                    const float* xr = scaled_input + (size_t)n * (size_t)cols;
                    const float* wr = rounded + (size_t)o * (size_t)cols;
                    double sum = 0.0;
                    for (int c = 0; c < cols; c++)
                        sum += (double)xr[c] * (double)wr[c];
                    double e = reference[(size_t)n * total_rows + out_offset + (size_t)o] - sum;
                    error += e * e;
                }
            out_offset += (size_t)rows[m];
        }
        // Strictly better only: ties keep the smaller alpha (alpha = 0 is RTN),
        // so AWQ is never worse than RTN on the calibration inputs.
        if (step == 0 || error < best_error) {
            best_error = error;
            *alpha = (float)candidate_alpha;
            for (int c = 0; c < cols; c++)
                channel_scales[c] = scales[c];
        }
    }

    // FAULT_AWQ_NO_SCALING: the search ran and *alpha says what it chose, but
    // the scales handed on are 1, so the caller quantizes (and divides the
    // input by) nothing: the weights go to RTN unscaled.
    if (status == 0 && fault_on(FAULT_AWQ_NO_SCALING))
        for (int c = 0; c < cols; c++)
            channel_scales[c] = 1.0f;

done:
    free(mean_abs);
    free(reference);
    free(scales);
    free(scaled_input);
    free(scaled_weights);
    free(rounded);
    free(codes);
    free(params);
    return status;
}
