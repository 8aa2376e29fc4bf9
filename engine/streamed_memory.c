#include "engine/streamed_memory.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine/arena.h"

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
