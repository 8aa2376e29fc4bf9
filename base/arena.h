// arena: many arrays in one allocation, laid out in two passes. The first
// pass runs with base NULL and only measures (arena_take returns NULL and
// counts the bytes); the caller then allocates arena_total() bytes aligned
// to ARENA_ALIGNMENT and runs the same pass again with base set, getting
// the same offsets. Every array starts on its own cache line.
#ifndef SERVELAB_ARENA_H
#define SERVELAB_ARENA_H

#include <stddef.h>

#define ARENA_ALIGNMENT 64

typedef struct arena_cursor {
    unsigned char* base; // NULL while only measuring
    size_t used;         // bytes handed out so far
} arena_cursor;

static inline void* arena_take(arena_cursor* cursor, size_t bytes) {
    size_t start = (cursor->used + ARENA_ALIGNMENT - 1) / ARENA_ALIGNMENT * ARENA_ALIGNMENT;
    cursor->used = start + bytes;
    return cursor->base ? cursor->base + start : NULL;
}

// Bytes to allocate for what a measuring pass took: a whole number of
// alignment units, at least one (aligned_alloc needs a positive multiple).
static inline size_t arena_total(const arena_cursor* measured) {
    size_t total = (measured->used + ARENA_ALIGNMENT - 1) / ARENA_ALIGNMENT * ARENA_ALIGNMENT;
    return total > 0 ? total : ARENA_ALIGNMENT;
}

#endif
