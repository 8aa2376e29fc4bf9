// machine_probe: the bandwidth and peak-FMA probes give positive, finite
// figures inside what any CPU can physically do, with or without a pool,
// at every SIMD level the CPU has. Sanity, not speed: the machine running
// the tests may be busy, so nothing here depends on how fast it is.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/cpu/machine_probe.h"
#include "tests/test_support.h"

// No CPU core streams more than ~1 TB/s even from its own L2, nor issues
// more than 2 x 16-lane FMAs per cycle at 6 GHz (384 GFLOP/s).
#define MAX_GB_S_PER_THREAD 1000.0
#define MAX_GFLOP_S_PER_THREAD_AVX512 (2.0 * 16 * 2 * 6.0)
#define MAX_GFLOP_S_PER_THREAD_AVX2 (2.0 * 8 * 2 * 6.0)
#define MAX_GFLOP_S_PER_THREAD_SCALAR (4.0 * 2 * 6.0)

static void test_default_buffer_is_far_larger_than_l3(void** state) {
    (void)state;
    size_t l3 = machine_l3_cache_bytes();
    size_t bytes = machine_stream_default_bytes();
    assert_true(l3 > 0);
    assert_true(bytes >= (size_t)256 << 20);
    assert_true(bytes >= 8 * l3 || bytes == (size_t)4096 << 20); // 8 x L3 unless capped at 4 GiB
}

static void check_bandwidth(thread_pool* pool, size_t bytes) {
    double gb_s = machine_stream_read_gb_s(pool, bytes, 3);
    assert_true(isfinite(gb_s));
    assert_true(gb_s > 0.05); // even a slow, shared machine reads 50 MB/s
    assert_true(gb_s < MAX_GB_S_PER_THREAD * thread_pool_size(pool));
}

static void test_stream_read_is_plausible(void** state) {
    (void)state;
    thread_pool* pool = NULL;
    assert_int_equal(thread_pool_create(2, &pool), 0);
    check_bandwidth(NULL, (size_t)64 << 20);       // the caller alone
    check_bandwidth(pool, (size_t)64 << 20);       // every thread
    check_bandwidth(pool, ((size_t)3 << 20) + 13); // a size that is no multiple of the kernel's step
    thread_pool_free(pool);
}

// A gather read reads its chunks and nothing past them: each chunk here
// ends where an inaccessible page begins, and the sizes are no multiple of
// the kernel's step (a tail) or are exactly one page, with and without the
// software prefetch (which may run past the end, but only as prefetches,
// which never fault).
static void test_gather_read_stays_inside_its_chunks(void** state) {
    (void)state;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const int n_regions = 3;
    unsigned char* mapping = mmap(NULL, 2 * page * (size_t)n_regions, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(mapping != MAP_FAILED);
    const size_t sizes[3] = {64, 320, page}; // bytes of each chunk
    probe_chunk chunks[3];
    for (int i = 0; i < n_regions; i++) {
        unsigned char* region = mapping + 2 * page * (size_t)i; // a readable page, then a guard page
        assert_int_equal(mprotect(region + page, page, PROT_NONE), 0);
        memset(region, 1, page);
        chunks[i] = (probe_chunk){region + page - sizes[i], sizes[i]};
    }
    for (size_t ahead = 0; ahead <= 2 * page; ahead += page) {
        double seconds = machine_gather_read_seconds(chunks, n_regions, ahead);
        assert_true(isfinite(seconds) && seconds >= 0 && seconds < 10.0);
        seconds = machine_gather_read_seconds(chunks + 2, 1, ahead); // one chunk, the prefetch past its end
        assert_true(isfinite(seconds) && seconds >= 0 && seconds < 10.0);
    }
    assert_true(machine_gather_read_seconds(chunks, 0, page) >= 0); // nothing to read
    munmap(mapping, 2 * page * (size_t)n_regions);
}

static void check_peak(thread_pool* pool, cpu_simd_level level, double max_per_thread) {
    double gflop_s = machine_peak_fma_gflop_s_at_level(pool, level, 3);
    assert_true(isfinite(gflop_s));
    assert_true(gflop_s > 0.1);
    assert_true(gflop_s < max_per_thread * thread_pool_size(pool));
}

static void test_peak_fma_is_plausible_at_every_level(void** state) {
    (void)state;
    thread_pool* pool = NULL;
    assert_int_equal(thread_pool_create(2, &pool), 0);
    check_peak(NULL, CPU_SIMD_SCALAR, MAX_GFLOP_S_PER_THREAD_SCALAR);
    check_peak(pool, CPU_SIMD_SCALAR, MAX_GFLOP_S_PER_THREAD_SCALAR);
    if (test_simd_level_available(CPU_SIMD_AVX2)) check_peak(pool, CPU_SIMD_AVX2, MAX_GFLOP_S_PER_THREAD_AVX2);
    if (test_simd_level_available(CPU_SIMD_AVX512)) check_peak(pool, CPU_SIMD_AVX512, MAX_GFLOP_S_PER_THREAD_AVX512);
    double selected = machine_peak_fma_gflop_s(pool, 1);
    assert_true(isfinite(selected) && selected > 0.1);
    thread_pool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_buffer_is_far_larger_than_l3),
        cmocka_unit_test(test_stream_read_is_plausible),
        cmocka_unit_test(test_gather_read_stays_inside_its_chunks),
        cmocka_unit_test(test_peak_fma_is_plausible_at_every_level),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
