// Helpers shared by the libFuzzer harnesses of tests/fuzz (not a harness:
// only tests/fuzz/fuzz_*.c are). Nothing here keeps state between runs.
#ifndef SERVELAB_FUZZ_SUPPORT_H
#define SERVELAB_FUZZ_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

// The bytes as an anonymous in-memory file (memfd): returns its descriptor
// and writes a path that opens it ("/proc/self/fd/N") into path; -1 when it
// cannot be made. Close the descriptor when done.
int fuzz_memory_file(const uint8_t* data, size_t size, char* path, size_t path_capacity);

// A fresh private folder under /dev/shm (else $TMPDIR or /tmp) for one run;
// 0, or -1. fuzz_remove_tree removes it and everything in it.
int fuzz_make_temp_dir(char* path, size_t path_capacity, const char* tag);
void fuzz_remove_tree(const char* path);

// Writes the bytes to path (created or truncated); 0, or -1.
int fuzz_write_file(const char* path, const void* data, size_t size);

// Seeds are written at start-up (LLVMFuzzerInitialize), never committed:
// the corpus folder is the first argument that is not a flag, or NULL when
// there is none (a reproducer run). fuzz_write_seed writes folder/name unless
// it exists (an earlier run wrote it); NULL bytes are skipped.
const char* fuzz_seed_folder(int argc, char** argv);
void fuzz_write_seed(const char* folder, const char* name, const void* bytes, size_t size);

// A growing byte buffer for building seed files; aborts when out of memory.
typedef struct fuzz_buffer {
    uint8_t* bytes;
    size_t size, capacity;
} fuzz_buffer;
void fuzz_put(fuzz_buffer* b, const void* data, size_t n);

// A promise of the code under test that a harness checks: when it does not
// hold, the run stops like a crash (abort), after "fuzz check failed at
// FILE:LINE: CONDITION" on the sanitizers' report stream, which libFuzzer
// keeps when -close_fd_mask closes the program's stderr.
#define FUZZ_CHECK(condition)                                                    \
    do {                                                                         \
        if (!(condition)) fuzz_check_failed(__FILE__, __LINE__, #condition);     \
    } while (0)
_Noreturn void fuzz_check_failed(const char* file, int line, const char* condition);

#endif
