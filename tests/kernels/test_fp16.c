// fp16 conversion: exact widening of every half value, IEEE rounding when
// narrowing (ties to even, overflow to inf, subnormals, NaN), checked against
// the CPU's own F16C converter where the machine has one. bf16 rounding:
// known values, and the AVX512_BF16 converter's bits where the CPU has one.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fp16.h"
#include "tests/test_support.h"

static float float_of(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static void test_known_values(void** state) {
    (void)state;
    assert_int_equal(fp32_to_fp16(1.0f), 0x3c00);
    assert_int_equal(fp32_to_fp16(-2.0f), 0xc000);
    assert_int_equal(fp32_to_fp16(0.5f), 0x3800);
    assert_int_equal(fp32_to_fp16(65504.0f), 0x7bff);         // largest finite half
    assert_int_equal(fp32_to_fp16(0.0f), 0x0000);
    assert_int_equal(fp32_to_fp16(-0.0f), 0x8000);
    assert_int_equal(fp32_to_fp16(ldexpf(1.0f, -14)), 0x0400); // smallest normal
    assert_int_equal(fp32_to_fp16(ldexpf(1.0f, -24)), 0x0001); // smallest subnormal
    assert_int_equal(fp32_to_fp16(ldexpf(1023.0f, -24)), 0x03ff); // largest subnormal
    assert_true(fp16_to_fp32(0x3c00) == 1.0f);
    assert_true(fp16_to_fp32(0x0001) == ldexpf(1.0f, -24));
    assert_true(fp16_to_fp32(0x7bff) == 65504.0f);
    assert_true(fp16_to_fp32(0x8000) == 0.0f && signbit(fp16_to_fp32(0x8000)));
}

static void test_rounding_ties_to_even(void** state) {
    (void)state;
    // 1 + 2^-11 lies exactly between 1 and 1 + 2^-10: ties go to the even 1.
    assert_int_equal(fp32_to_fp16(1.0f + ldexpf(1.0f, -11)), 0x3c00);
    // 1 + 3 * 2^-11 lies between 1 + 2^-10 (odd) and 1 + 2^-9 (even): up.
    assert_int_equal(fp32_to_fp16(1.0f + 3.0f * ldexpf(1.0f, -11)), 0x3c02);
    // Just above the tie rounds up.
    assert_int_equal(fp32_to_fp16(nextafterf(1.0f + ldexpf(1.0f, -11), 2.0f)), 0x3c01);
    // 65520 is the tie between 65504 and 65536 (= inf): even wins, so inf.
    assert_int_equal(fp32_to_fp16(65520.0f), 0x7c00);
    assert_int_equal(fp32_to_fp16(65519.0f), 0x7bff);
    // Subnormal ties: 2^-25 is half the smallest subnormal, rounds to 0;
    // 3 * 2^-25 is between 1 and 2 subnormal steps, ties to even 2.
    assert_int_equal(fp32_to_fp16(ldexpf(1.0f, -25)), 0x0000);
    assert_int_equal(fp32_to_fp16(nextafterf(ldexpf(1.0f, -25), 1.0f)), 0x0001);
    assert_int_equal(fp32_to_fp16(3.0f * ldexpf(1.0f, -25)), 0x0002);
    // The largest subnormal plus half a step rounds up into the normals.
    assert_int_equal(fp32_to_fp16(ldexpf(1023.5f, -24)), 0x0400);
}

static void test_inf_and_nan(void** state) {
    (void)state;
    assert_int_equal(fp32_to_fp16(INFINITY), 0x7c00);
    assert_int_equal(fp32_to_fp16(-INFINITY), 0xfc00);
    assert_int_equal(fp32_to_fp16(1e10f), 0x7c00);
    assert_int_equal(fp32_to_fp16(-1e10f), 0xfc00);
    uint16_t nan_half = fp32_to_fp16(NAN);
    assert_int_equal(nan_half & 0x7c00, 0x7c00);
    assert_true((nan_half & 0x03ff) != 0);
    assert_true(isnan(fp16_to_fp32(nan_half)));
    assert_true(isinf(fp16_to_fp32(0x7c00)) && fp16_to_fp32(0x7c00) > 0);
    // A NaN whose payload sits only in the low mantissa bits stays NaN.
    assert_true(isnan(fp16_to_fp32(fp32_to_fp16(float_of(0x7f800001u)))));
}

// Every one of the 65536 halves widens exactly and narrows back to itself.
static void test_every_half_round_trips(void** state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float wide = fp16_to_fp32((uint16_t)h);
        bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (is_nan) {
            assert_true(isnan(wide));
            continue;
        }
        assert_int_equal(fp32_to_fp16(wide), h);
    }
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("f16c"))) static uint16_t hardware_to_half(float value) {
    return (uint16_t)_cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT);
}
#endif

// Against the CPU's converter: 4 million float bit patterns spread over
// the whole range (NaNs compared as NaN only: payload rules differ).
static void test_matches_hardware_converter(void** state) {
    (void)state;
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("f16c")) {
        if (getenv("CI")) fail_msg("CI is set but this CPU has no F16C to compare against");
        print_message("skipping: this CPU has no F16C converter to compare against\n");
        skip();
    }
    uint64_t rng = 0x1234567;
    for (int i = 0; i < 4000000; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        uint32_t bits = (uint32_t)rng;
        float value = float_of(bits);
        uint16_t mine = fp32_to_fp16(value), theirs = hardware_to_half(value);
        if (isnan(value)) {
            assert_true((mine & 0x7c00) == 0x7c00 && (mine & 0x3ff));
            continue;
        }
        if (mine != theirs) fail_msg("float bits 0x%08x: fp32_to_fp16 0x%04x, F16C 0x%04x", bits, mine, theirs);
    }
#else
    skip();
#endif
}

// ---- bf16 ------------------------------------------------------------------

static void check_bf16(uint32_t float_bits, uint16_t expected) {
    uint16_t got = fp32_to_bf16(float_of(float_bits));
    if (got != expected) fail_msg("float bits 0x%08x: fp32_to_bf16 0x%04x, expected 0x%04x", float_bits, got, expected);
    float rounded = fp32_round_to_bf16(float_of(float_bits)), widened = bf16_to_fp32(expected);
    if (memcmp(&rounded, &widened, sizeof rounded) != 0)
        fail_msg("float bits 0x%08x: fp32_round_to_bf16 is not bf16_to_fp32(0x%04x)", float_bits, expected);
}

static void test_bf16_known_values(void** state) {
    (void)state;
    check_bf16(0x3f800000, 0x3f80); // 1: exact
    check_bf16(0xc0490fdb, 0xc049); // -pi: the part cut off is below half
    check_bf16(0x3f80c000, 0x3f81); // above half: up
    check_bf16(0x3f808000, 0x3f80); // a tie, the kept bit even: stays
    check_bf16(0x3f818000, 0x3f82); // a tie, the kept bit odd: up to even
    check_bf16(0x3f808001, 0x3f81); // just above the tie
    check_bf16(0x3fff8000, 0x4000); // a carry into the exponent
    check_bf16(0x7f7fffff, 0x7f80); // FLT_MAX: past the largest bf16, to +inf
    check_bf16(0xff7f7fff, 0xff7f); // -largest bf16 plus less than half: stays
    check_bf16(0x7f800000, 0x7f80); // +inf
    check_bf16(0xff800000, 0xff80); // -inf
    check_bf16(0x00800000, 0x0080); // the smallest normal
    check_bf16(0x007fffff, 0x0000); // a subnormal: +0, as the converters read it
    check_bf16(0x80000001, 0x8000); // a negative subnormal: -0
    check_bf16(0x80000000, 0x8000); // -0
    check_bf16(0x7f800001, 0x7fc0); // a signalling NaN: made quiet, payload cut
    check_bf16(0xffc12345, 0xffc1); // a quiet NaN keeps its sign and top payload
    for (int k = -126; k <= 127; k++) { // every power of two is exact
        float p = ldexpf(1.0f, k);
        assert_true(fp32_round_to_bf16(p) == p);
    }
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bf16"))) static uint16_t hardware_to_bf16(float value) {
    __m256bh words = _mm512_cvtneps_pbh(_mm512_set1_ps(value)); // 16 words
    uint16_t out[16];
    memcpy(out, &words, sizeof out);
    return out[0];
}
#endif

// Against the CPU's converter (VCVTNEPS2BF16, which the W4A16 kernel's
// results rest on): 4 million float bit patterns, NaNs included.
static void test_bf16_matches_hardware_converter(void** state) {
    (void)state;
#if defined(__x86_64__)
    if (!cpu_features_get()->avx512bf16) {
        if (getenv("CI")) fail_msg("CI is set but this CPU has no AVX512_BF16 converter to compare against");
        print_message("skipping: this CPU has no AVX512_BF16 converter to compare against\n");
        skip();
    }
    uint64_t rng = 0x9e3779b9;
    for (int i = 0; i < 4000000; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        uint32_t bits = (uint32_t)rng;
        uint16_t mine = fp32_to_bf16(float_of(bits)), theirs = hardware_to_bf16(float_of(bits));
        if (mine != theirs)
            fail_msg("float bits 0x%08x: fp32_to_bf16 0x%04x, VCVTNEPS2BF16 0x%04x", bits, mine, theirs);
    }
#else
    skip();
#endif
}

#if defined(__x86_64__)
#include "kernels/cpu/simd_x86.h"

// The kernels' vector roundings (8 and 16 lanes) against fp32_to_bf16 on
// `count` float bit patterns: out8, out16 (count) the rounded floats' bits.
static AVX512_TARGET void vector_bf16_roundings(uint32_t* out8, uint32_t* out16, const uint32_t* bits, size_t count) {
    for (size_t i = 0; i + 16 <= count; i += 16) {
        __m512 x = _mm512_loadu_ps((const float*)(bits + i));
        _mm512_storeu_ps((float*)(out16 + i), round_to_bf16_16(x));
        _mm256_storeu_ps((float*)(out8 + i), round_to_bf16_8(_mm256_loadu_ps((const float*)(bits + i))));
        _mm256_storeu_ps((float*)(out8 + i + 8), round_to_bf16_8(_mm256_loadu_ps((const float*)(bits + i + 8))));
    }
}
#endif

// round_to_bf16_8 / _16 (the W4A16 kernels' activations) give the bits of
// fp32_to_bf16 on every kind of value: random patterns (NaNs, subnormals,
// infinities among them) and the special ones of test_bf16_known_values.
static void test_bf16_vector_rounding_matches_scalar(void** state) {
    (void)state;
#if defined(__x86_64__)
    if (cpu_features_get()->best < CPU_SIMD_AVX512) {
        if (getenv("CI")) fail_msg("CI is set but this CPU lacks AVX-512");
        print_message("skipping: no AVX-512 here to run both vector roundings\n");
        skip();
    }
    enum { COUNT = 1 << 20 };
    uint32_t* bits = malloc(COUNT * sizeof(uint32_t));
    uint32_t* out8 = malloc(COUNT * sizeof(uint32_t));
    uint32_t* out16 = malloc(COUNT * sizeof(uint32_t));
    assert_true(bits && out8 && out16);
    const uint32_t special[] = {0x3f808000, 0x3f818000, 0x7f7fffff, 0x007fffff, 0x80000001, 0x7f800001,
                                0xffc12345, 0x7f800000, 0x00800000, 0x80000000, 0x3fff8000, 0xff7f7fff};
    uint64_t rng = 0x51ed270b;
    for (size_t i = 0; i < COUNT; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        bits[i] = i < sizeof special / sizeof special[0] ? special[i] : (uint32_t)rng;
    }
    vector_bf16_roundings(out8, out16, bits, COUNT);
    for (size_t i = 0; i < COUNT; i++) {
        uint32_t want = (uint32_t)fp32_to_bf16(float_of(bits[i])) << 16;
        if (out8[i] != want || out16[i] != want)
            fail_msg("float bits 0x%08x: 8 lanes 0x%08x, 16 lanes 0x%08x, fp32_to_bf16 0x%08x", bits[i], out8[i],
                     out16[i], want);
    }
    free(out16);
    free(out8);
    free(bits);
#else
    skip();
#endif
}

// The array conversions (F16C, 8 at a time, where the selected level has
// it) give the same bits as the scalar ones, tails included: every count
// from 0 to 40 over random bit patterns, then every half value.
static void test_arrays_match_scalar(void** state) {
    (void)state;
    enum { MAX_COUNT = 40 };
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    float in[MAX_COUNT];
    uint16_t halves[MAX_COUNT + 1];
    for (int round = 0; round < 2000; round++) {
        int count = round % (MAX_COUNT + 1);
        for (int i = 0; i < count; i++) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            in[i] = float_of((uint32_t)rng);
        }
        halves[count] = 0xbeef; // must not be written
        fp16_from_fp32_array(halves, in, (size_t)count);
        assert_int_equal(halves[count], 0xbeef);
        for (int i = 0; i < count; i++) {
            uint16_t expected = fp32_to_fp16(in[i]);
            if (isnan(in[i])) {
                assert_true((halves[i] & 0x7c00) == 0x7c00 && (halves[i] & 0x3ff));
                continue;
            }
            if (halves[i] != expected)
                fail_msg("count %d, value %d (bits of %a): array 0x%04x, scalar 0x%04x", count, i, (double)in[i],
                         halves[i], expected);
        }
    }
    uint16_t* every = malloc(65536 * sizeof *every);
    float* widened = malloc(65536 * sizeof *widened);
    assert_non_null(every);
    assert_non_null(widened);
    for (int h = 0; h < 65536; h++) every[h] = (uint16_t)h;
    fp16_to_fp32_array(widened, every, 65535); // odd count: a tail of 7
    for (int h = 0; h < 65535; h++) {
        float expected = fp16_to_fp32((uint16_t)h);
        if (isnan(expected)) {
            assert_true(isnan(widened[h]));
            continue;
        }
        if (memcmp(&widened[h], &expected, sizeof expected) != 0)
            fail_msg("half 0x%04x: array %a, scalar %a", h, (double)widened[h], (double)expected);
    }
    free(widened);
    free(every);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_values),
        cmocka_unit_test(test_rounding_ties_to_even),
        cmocka_unit_test(test_inf_and_nan),
        cmocka_unit_test(test_every_half_round_trips),
        cmocka_unit_test(test_matches_hardware_converter),
        cmocka_unit_test(test_arrays_match_scalar),
        cmocka_unit_test(test_bf16_known_values),
        cmocka_unit_test(test_bf16_matches_hardware_converter),
        cmocka_unit_test(test_bf16_vector_rounding_matches_scalar),
    };
    return cmocka_run_group_tests_name("kernels/fp16", tests, NULL, NULL);
}
