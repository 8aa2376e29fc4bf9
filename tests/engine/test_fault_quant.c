// The quantization faults (engine/fault.h): each one, switched on, changes
// the engine's numbers in exactly the way its name says, and switched off
// again gives back the exact numbers of no fault. The values are worked by
// hand on ranges whose step is a power of two (exact in fp16 and float).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "engine/fault.h"
#include "engine/model_quant.h"
#include "engine/model_synth.h"
#include "engine/quant.h"

// Each test leaves the process with no fault, whatever it asserted.
static int no_fault(void** state) {
    (void)state;
    fault_install(0);
    return 0;
}

// [-1, 2.75] at 4 bits: s = 3.75 / 15 = 0.25, z = round(1 / 0.25) = 4.
static quant_params asymmetric_quarter_step(void) { return quant_params_for_range(-1.0f, 2.75f, 4, false); }

static void test_round_floor_rounds_down(void** state) {
    (void)state;
    quant_params p = asymmetric_quarter_step();
    // 0.2 / 0.25 = 0.8: nearest is 1 (+ z = 5), down is 0 (+ z = 4).
    assert_int_equal(quant_quantize(0.2f, &p, 4, false, NULL), 5);
    fault_install(1u << FAULT_ROUND_FLOOR);
    assert_int_equal(quant_quantize(0.2f, &p, 4, false, NULL), 4);
    assert_int_equal(quant_quantize(-0.2f, &p, 4, false, NULL), 3); // floor(-0.8) = -1, not 0
    // z = floor(-r_min / s): [-1, 3] has s = 4/15 rounded up to fp16, -r_min/s = 3.7475.
    assert_int_equal(quant_params_for_range(-1.0f, 3.0f, 4, false).zero_point, 3);
    fault_install(0);
    assert_int_equal(quant_params_for_range(-1.0f, 3.0f, 4, false).zero_point, 4);
    assert_int_equal(quant_quantize(-0.2f, &p, 4, false, NULL), 3); // round(-0.8) = -1 as well
    assert_int_equal(quant_quantize(0.2f, &p, 4, false, NULL), 5);
}

static void test_zero_point_plus_takes_the_wrong_sign(void** state) {
    (void)state;
    assert_int_equal(asymmetric_quarter_step().zero_point, 4);
    fault_install(1u << FAULT_ZERO_POINT_PLUS);
    quant_params p = asymmetric_quarter_step();
    assert_true(p.scale == 0.25f);
    assert_int_equal(p.zero_point, 0); // round(-1 / 0.25) = -4, clamped into the codes [0, 15]
    assert_true(quant_dequantize(quant_quantize(-1.0f, &p, 4, false, NULL), &p) == 0.0f); // r_min is lost
    fault_install(0);
    assert_int_equal(asymmetric_quarter_step().zero_point, 4);
}

static void test_sym_scale_full_range_doubles_a_centred_step(void** state) {
    (void)state;
    // [-1.75, 1.75] at 4 bits symmetric: s = 1.75 / 7 = 0.25; with the fault 3.5 / 7 = 0.5.
    assert_true(quant_params_for_range(-1.75f, 1.75f, 4, true).scale == 0.25f);
    fault_install(1u << FAULT_SYM_SCALE_FULL_RANGE);
    assert_true(quant_params_for_range(-1.75f, 1.75f, 4, true).scale == 0.5f);
    assert_true(quant_params_for_range(0.0f, 1.75f, 4, true).scale == 0.25f);   // one-sided: the width is max|r|
    assert_true(quant_params_for_range(-1.0f, 2.75f, 4, false).scale == 0.25f); // asymmetric untouched
    fault_install(0);
    assert_true(quant_params_for_range(-1.75f, 1.75f, 4, true).scale == 0.25f);
}

static void test_wrap_not_clip_keeps_the_low_bits(void** state) {
    (void)state;
    quant_params p = asymmetric_quarter_step();
    bool clipped = false;
    assert_int_equal(quant_quantize(1000.0f, &p, 4, false, &clipped), 15);
    assert_true(clipped);
    assert_int_equal(quant_quantize(-1000.0f, &p, 4, false, NULL), 0);
    fault_install(1u << FAULT_WRAP_NOT_CLIP);
    // 1000 / 0.25 + 4 = 4004 = 250 * 16 + 4; -1000 / 0.25 + 4 = -3996 = -250 * 16 + 4.
    assert_int_equal(quant_quantize(1000.0f, &p, 4, false, &clipped), 4);
    assert_true(clipped); // still counted as outside the range
    assert_int_equal(quant_quantize(-1000.0f, &p, 4, false, NULL), 4);
    assert_int_equal(quant_quantize(4.1f, &p, 4, false, NULL), 4);   // code 20 -> 4
    assert_int_equal(quant_quantize(2.75f, &p, 4, false, NULL), 15); // in range: as before
    // Symmetric codes stay inside [-7, 7] (15 levels): 8 wraps to -7.
    quant_params sym = quant_params_for_range(-1.75f, 1.75f, 4, true);
    assert_int_equal(quant_quantize(2.0f, &sym, 4, true, NULL), -7);
    assert_int_equal(quant_quantize(1e30f, &sym, 4, true, NULL) >= -7, 1);
    assert_int_equal(quant_quantize(1e30f, &sym, 4, true, NULL) <= 7, 1);
    fault_install(0);
    assert_int_equal(quant_quantize(2.0f, &sym, 4, true, NULL), 7);
    assert_int_equal(quant_quantize(1000.0f, &p, 4, false, NULL), 15);
}

// (2, 8) with the left group small and the right group 100x larger.
static const float two_groups[16] = {0.01f, -0.02f, 0.03f, 0.0f,  1.0f, -2.0f, 3.0f, 0.5f,
                                     0.02f, -0.01f, 0.0f,  0.04f, 2.0f, -1.0f, 0.5f, 4.0f};

static void test_group_tensor_max_gives_every_group_the_tensor_range(void** state) {
    (void)state;
    quant_scheme scheme = {4, false, QUANT_PER_GROUP, 4, false};
    int32_t codes[16];
    quant_params params[4];
    error_info err = {{0}};
    assert_int_equal(quant_matrix_rtn(two_groups, 2, 8, &scheme, codes, params, &err), 0);
    assert_true(params[0].scale < params[1].scale / 50); // the small group gets a small step
    fault_install(1u << FAULT_GROUP_TENSOR_MAX);
    assert_int_equal(quant_matrix_rtn(two_groups, 2, 8, &scheme, codes, params, &err), 0);
    quant_params tensor = quant_params_for_values(two_groups, 16, 4, false, false);
    for (int k = 0; k < 4; k++) {
        assert_true(params[k].scale == tensor.scale);
        assert_int_equal(params[k].zero_point, tensor.zero_point);
    }
    // Per channel is not a group: untouched.
    quant_scheme channel = {4, false, QUANT_PER_CHANNEL, 0, false};
    quant_params rows[2];
    assert_int_equal(quant_matrix_rtn(two_groups, 2, 8, &channel, codes, rows, &err), 0);
    assert_true(rows[0].scale == quant_params_for_values(two_groups, 8, 4, false, false).scale);
    fault_install(0);
    assert_int_equal(quant_matrix_rtn(two_groups, 2, 8, &scheme, codes, params, &err), 0);
    assert_true(params[0].scale < params[1].scale / 50);
}

// A layer of 16 outputs and 32 inputs, and 64 calibration rows whose inputs
// 3 and 17 are 30x larger: the case AWQ and GPTQ are for.
enum { ROWS = 16, COLS = 32, SAMPLES = 64 };

static void make_layer(float* w, float* x) {
    for (int o = 0; o < ROWS; o++)
        for (int i = 0; i < COLS; i++)
            w[o * COLS + i] = (float)sin(o * 1.7 + i * 0.37) * 0.1f;
    for (int s = 0; s < SAMPLES; s++)
        for (int i = 0; i < COLS; i++) {
            float v = (float)sin(s * 12.9898 + i * 78.233) * 2.0f;
            x[s * COLS + i] = i == 3 || i == 17 ? 30.0f * v : v;
        }
}

static void test_awq_no_scaling_hands_on_unit_scales(void** state) {
    (void)state;
    float w[ROWS * COLS], x[SAMPLES * COLS], scales[COLS], scales_fault[COLS];
    make_layer(w, x);
    quant_scheme scheme = {4, false, QUANT_PER_GROUP, 8, false};
    const float* matrices[1] = {w};
    int rows[1] = {ROWS};
    float alpha = -1, alpha_fault = -1;
    error_info err = {{0}};
    assert_int_equal(quant_awq_search(matrices, rows, 1, COLS, x, SAMPLES, &scheme, scales, &alpha, &err), 0);
    assert_true(alpha > 0.0f);
    assert_true(scales[3] > 2.0f * scales[0]); // the outlier channel is scaled up
    fault_install(1u << FAULT_AWQ_NO_SCALING);
    assert_int_equal(quant_awq_search(matrices, rows, 1, COLS, x, SAMPLES, &scheme, scales_fault, &alpha_fault, &err),
                     0);
    assert_true(alpha_fault == alpha); // the search ran as before
    for (int i = 0; i < COLS; i++)
        assert_true(scales_fault[i] == 1.0f);
    fault_install(0);
    assert_int_equal(quant_awq_search(matrices, rows, 1, COLS, x, SAMPLES, &scheme, scales_fault, &alpha_fault, &err),
                     0);
    assert_memory_equal(scales, scales_fault, sizeof scales);
}

static void test_gptq_no_feedback_is_rtn(void** state) {
    (void)state;
    float w[ROWS * COLS], x[SAMPLES * COLS];
    make_layer(w, x);
    quant_scheme scheme = {4, false, QUANT_PER_CHANNEL, 0, false};
    int32_t rtn[ROWS * COLS], gptq[ROWS * COLS], again[ROWS * COLS];
    quant_params rtn_params[ROWS], gptq_params[ROWS];
    error_info err = {{0}};
    assert_int_equal(quant_matrix_rtn(w, ROWS, COLS, &scheme, rtn, rtn_params, &err), 0);
    assert_int_equal(quant_gptq(w, ROWS, COLS, x, SAMPLES, &scheme, 0.01f, 8, gptq, gptq_params, &err), 0);
    int differ = 0;
    for (int k = 0; k < ROWS * COLS; k++)
        differ += gptq[k] != rtn[k];
    assert_true(differ > 10); // the error feedback moves codes off their nearest level
    fault_install(1u << FAULT_GPTQ_NO_FEEDBACK);
    assert_int_equal(quant_gptq(w, ROWS, COLS, x, SAMPLES, &scheme, 0.01f, 8, again, gptq_params, &err), 0);
    assert_memory_equal(again, rtn, sizeof rtn);
    fault_install(0);
    assert_int_equal(quant_gptq(w, ROWS, COLS, x, SAMPLES, &scheme, 0.01f, 8, again, gptq_params, &err), 0);
    assert_memory_equal(again, gptq, sizeof gptq);
}

static void test_w8a8_float_activations_drops_the_activation_bits(void** state) {
    (void)state;
    model_quant_spec spec;
    error_info err = {{0}};
    assert_int_equal(model_quant_spec_parse("w8a8", &spec, &err), 0);
    for (int faulty = 0; faulty <= 1; faulty++) {
        model m;
        assert_int_equal(model_synthesize(&m, "tiny", 259, MODEL_DTYPE_DEFAULT, 7, &err), 0);
        fault_install(faulty ? 1u << FAULT_W8A8_FLOAT_ACTIVATIONS : 0);
        assert_int_equal(model_quantize(&m, &spec, NULL, NULL, 0, NULL, NULL, &err), 0);
        fault_install(0);
        assert_int_equal(m.layers[0].wq.dtype, WEIGHT_I8);
        assert_int_equal(m.layers[1].w2.activation_bits, faulty ? 0 : 8);
        model_free(&m);
    }
}

// The kept copy lives in the model's one block, after the packed matrices
// (so model_free frees it), and holds the fp16 weights; the packed weights
// and model->weight_bytes (what the kernels stream) are the same as without.
static void test_quant_keeps_fp16_keeps_the_fp16_weights(void** state) {
    (void)state;
    model_quant_spec spec;
    error_info err = {{0}};
    assert_int_equal(model_quant_spec_parse("w4a16", &spec, &err), 0);
    model original, plain, kept;
    assert_int_equal(model_synthesize(&original, "tiny", 259, MODEL_DTYPE_DEFAULT, 7, &err), 0);
    assert_int_equal(model_synthesize(&plain, "tiny", 259, MODEL_DTYPE_DEFAULT, 7, &err), 0);
    assert_int_equal(model_synthesize(&kept, "tiny", 259, MODEL_DTYPE_DEFAULT, 7, &err), 0);
    assert_int_equal(original.token_embedding.dtype, WEIGHT_F16);
    assert_true(original.config.shared_classifier); // the last packed matrix is then the last layer's w3
    assert_int_equal(model_quantize(&plain, &spec, NULL, NULL, 0, NULL, NULL, &err), 0);
    fault_install(1u << FAULT_QUANT_KEEPS_FP16);
    assert_int_equal(model_quantize(&kept, &spec, NULL, NULL, 0, NULL, NULL, &err), 0);
    fault_install(0);
    assert_true(plain.weight_bytes == kept.weight_bytes);
    const weight_matrix* a = &plain.layers[1].w2;
    const weight_matrix* b = &kept.layers[1].w2;
    assert_memory_equal(a->values, b->values, (size_t)a->rows * (size_t)(a->cols / 2));
    // Where the copy starts: the 64-byte boundary after the last packed
    // matrix (its fp16 scales open its region). Tiny's 64 inputs are one
    // group of 64, which model_quant packs per channel.
    const weight_matrix* last = &kept.layers[kept.config.n_layers - 1].w3;
    quant_scheme per_channel = {4, false, QUANT_PER_CHANNEL, 0, false};
    size_t last_start = (size_t)((const unsigned char*)last->scales_f16 - (const unsigned char*)kept.storage);
    size_t copy_start = (last_start + (size_t)quant_packed_bytes(last->rows, last->cols, &per_channel) + 63) / 64 * 64;
    // Its first matrix is the embedding, row after row, in fp16: the original's bytes.
    size_t embedding_bytes = (size_t)original.token_embedding.rows * (size_t)original.token_embedding.cols * 2;
    assert_memory_equal((const unsigned char*)kept.storage + copy_start, original.token_embedding.values,
                        embedding_bytes);
    model_free(&original);
    model_free(&plain);
    model_free(&kept);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_round_floor_rounds_down, no_fault),
        cmocka_unit_test_teardown(test_zero_point_plus_takes_the_wrong_sign, no_fault),
        cmocka_unit_test_teardown(test_sym_scale_full_range_doubles_a_centred_step, no_fault),
        cmocka_unit_test_teardown(test_wrap_not_clip_keeps_the_low_bits, no_fault),
        cmocka_unit_test_teardown(test_group_tensor_max_gives_every_group_the_tensor_range, no_fault),
        cmocka_unit_test_teardown(test_awq_no_scaling_hands_on_unit_scales, no_fault),
        cmocka_unit_test_teardown(test_gptq_no_feedback_is_rtn, no_fault),
        cmocka_unit_test_teardown(test_w8a8_float_activations_drops_the_activation_bits, no_fault),
        cmocka_unit_test_teardown(test_quant_keeps_fp16_keeps_the_fp16_weights, no_fault),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
