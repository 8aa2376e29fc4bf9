#include "engine/streamed_memory.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/arena.h"

void* streamed_memory_alloc(size_t bytes) {
    const size_t huge_page = (size_t)2 << 20;
    if (bytes < 2 * huge_page) return aligned_alloc(ARENA_ALIGNMENT, bytes); // too small to be worth a huge page
    size_t rounded = (bytes + huge_page - 1) / huge_page * huge_page;
    void* memory = aligned_alloc(huge_page, rounded);
#ifdef MADV_HUGEPAGE
    // Before the first touch, so that the pages are faulted in huge; a
    // hint, whose failure (no THP support) changes nothing else.
    if (memory) (void)madvise(memory, rounded, MADV_HUGEPAGE);
#endif
    return memory;
}

void* streamed_memory_calloc(size_t bytes) {
    size_t rounded = (bytes + ARENA_ALIGNMENT - 1) / ARENA_ALIGNMENT * ARENA_ALIGNMENT;
    if (rounded == 0) rounded = ARENA_ALIGNMENT;
    void* memory = streamed_memory_alloc(rounded);
    // The first touch, which faults the (huge) pages in.
    if (memory) memset(memory, 0, rounded);
    return memory;
}

// Pages of the mapping for `bytes`: whole huge pages where the block is
// large enough to use them, else whole small pages.
static size_t mapped_bytes(size_t bytes, size_t huge_page) {
    const size_t page = 4096;
    if (bytes == 0) bytes = 1;
    if (bytes >= 2 * huge_page) return (bytes + huge_page - 1) / huge_page * huge_page;
    return (bytes + page - 1) / page * page;
}

void* streamed_memory_map_zeroed(size_t bytes) {
    const size_t huge_page = (size_t)2 << 20;
    size_t length = mapped_bytes(bytes, huge_page);
    if (length < 2 * huge_page) {
        void* small = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return small == MAP_FAILED ? NULL : small;
    }
    if (length > SIZE_MAX - huge_page) return NULL;
    // Map one huge page more than needed and cut the ends off, so that the
    // block starts on a 2 MiB boundary. Nothing is touched: the kernel hands
    // out zero pages as they are first written.
    void* mapped = mmap(NULL, length + huge_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    if (mapped == MAP_FAILED) return NULL;
    uintptr_t start = ((uintptr_t)mapped + huge_page - 1) / huge_page * huge_page;
    size_t head = start - (uintptr_t)mapped, tail = huge_page - head;
    if (head > 0) munmap(mapped, head);
    if (tail > 0) munmap((char*)start + length, tail);
#ifdef MADV_HUGEPAGE
    (void)madvise((void*)start, length, MADV_HUGEPAGE);
#endif
    return (void*)start;
}

void streamed_memory_unmap(void* memory, size_t bytes) {
    if (!memory) return;
    munmap(memory, mapped_bytes(bytes, (size_t)2 << 20));
}
