// lesson limits: the memory cap and the time limit. One cap counts the
// Lua heap (this allocator) and what engines and models allocate
// (lesson_reserve_bytes). An instruction-count hook looks at the CPU clock;
// C loops look themselves (lesson_check_time); watchdog.c stops what
// neither reaches.
#include <stdlib.h>
#include <time.h>

#include "lab/lesson/internal.h"

double lesson_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// ---- memory: one cap for the Lua heap and the engines ------------------------------------

static void link_block(lesson* l, lua_block_header* h) {
    h->previous = &l->lua_blocks;
    h->next = l->lua_blocks.next;
    l->lua_blocks.next->previous = h;
    l->lua_blocks.next = h;
}

static void unlink_block(lua_block_header* h) {
    h->previous->next = h->next;
    h->next->previous = h->previous;
}

void* lesson_alloc(void* user, void* block, size_t old_size, size_t new_size) {
    lesson* l = user;
    if (!block) old_size = 0; // old_size then encodes the object's type
    lua_block_header* header = block ? (lua_block_header*)block - 1 : NULL;
    if (new_size == 0) {
        if (header) {
            unlink_block(header);
            free(header);
        }
        l->lua_bytes -= old_size;
        return NULL;
    }
    if (new_size > old_size &&
        l->lua_bytes + l->external_bytes + (new_size - old_size) > l->options.memory_limit_bytes)
        return NULL; // Lua raises a memory error (the cap also keeps new_size + header from wrapping)
    if (header) unlink_block(header);
    lua_block_header* grown = realloc(header, sizeof *grown + new_size);
    if (!grown) {
        if (header) link_block(l, header);
        return NULL;
    }
    link_block(l, grown);
    l->lua_bytes = l->lua_bytes - old_size + new_size;
    return grown + 1;
}

void lesson_free_lua_blocks(lesson* l) {
    while (l->lua_blocks.next != &l->lua_blocks) {
        lua_block_header* h = l->lua_blocks.next;
        unlink_block(h);
        free(h);
    }
    l->lua_bytes = 0;
}

void lesson_reserve_bytes(lua_State* L, uint64_t bytes, const char* what) {
    lesson* l = lesson_of(L);
    uint64_t cap = l->options.memory_limit_bytes;
    if (l->lua_bytes + l->external_bytes + bytes > cap) lua_gc(L, LUA_GCCOLLECT); // engines nobody holds
    if (l->lua_bytes + l->external_bytes + bytes > cap)
        lab_error(L, "memory limit of %d MiB: %s needs %.1f MiB, and %.1f MiB are in use (Lua %.1f, engines and models %.1f)",
                   (int)(cap >> 20), what, (double)bytes / 1048576.0,
                   (double)(l->lua_bytes + l->external_bytes) / 1048576.0, (double)l->lua_bytes / 1048576.0,
                   (double)l->external_bytes / 1048576.0);
    l->external_bytes += bytes;
}

void lesson_release_bytes(lesson* l, uint64_t bytes) {
    l->external_bytes = bytes > l->external_bytes ? 0 : l->external_bytes - bytes;
}

void lesson_count_bytes(lesson* l, uint64_t bytes) { l->external_bytes += bytes; }

// ---- time: an instruction-count hook, and checks from C loops ------------------------------

static void raise_time_limit(lua_State* L) {
    lesson* l = lesson_of(L);
    l->time_exceeded = true;
    lab_error(L, "time limit of %g s CPU exceeded (--time-limit)", l->options.time_limit_s);
}

static bool stop_requested(const lesson* l) { return l->options.stop_flag && *l->options.stop_flag; }

static void time_hook(lua_State* L, lua_Debug* ar) {
    (void)ar;
    lesson* l = lesson_of(L);
    if (l->time_exceeded || lesson_cpu_seconds() - l->cpu_start_s > l->options.time_limit_s) {
        // From now on every instruction raises: a pcall that catches the
        // error cannot keep the lesson alive.
        lua_sethook(L, time_hook, LUA_MASKCOUNT, 1);
        raise_time_limit(L);
    }
    if (stop_requested(l)) {
        l->stop_raised = true;
        lua_sethook(L, time_hook, LUA_MASKCOUNT, 1);
        lab_error(L, "stopped: the lesson was interrupted (Ctrl-C or a signal)");
    }
}

bool lesson_keep_going(void* user) {
    const lesson* l = user;
    return !l->time_exceeded && lesson_cpu_seconds() - l->cpu_start_s <= l->options.time_limit_s && !stop_requested(l);
}

void lesson_tighten_hook(lesson* l) {
    if (l->thread) lua_sethook(l->thread, time_hook, LUA_MASKCOUNT, 1);
}

void lesson_install_time_hook(lesson* l) {
    lua_sethook(l->thread, time_hook, LUA_MASKCOUNT, LESSON_HOOK_INSTRUCTIONS);
}

void lesson_check_time(lua_State* L) {
    lesson* l = lesson_of(L);
    if (l->time_exceeded || lesson_cpu_seconds() - l->cpu_start_s > l->options.time_limit_s) raise_time_limit(L);
    if (stop_requested(l)) lab_error(L, "stopped: the lesson was interrupted (Ctrl-C or a signal)");
}
