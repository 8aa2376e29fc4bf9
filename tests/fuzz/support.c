#include "tests/fuzz/support.h"

#include <dirent.h>
#include <fcntl.h>
#include <sanitizer/common_interface_defs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int write_all(int fd, const void* data, size_t size) {
    const char* p = data;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n <= 0) return -1;
        p += n;
        size -= (size_t)n;
    }
    return 0;
}

int fuzz_memory_file(const uint8_t* data, size_t size, char* path, size_t path_capacity) {
    int fd = memfd_create("servelab-fuzz", MFD_CLOEXEC);
    if (fd < 0) return -1;
    if (write_all(fd, data, size) != 0) {
        close(fd);
        return -1;
    }
    snprintf(path, path_capacity, "/proc/self/fd/%d", fd);
    return fd;
}

int fuzz_make_temp_dir(char* path, size_t path_capacity, const char* tag) {
    struct stat st;
    const char* base = "/dev/shm";
    if (stat(base, &st) != 0 || !S_ISDIR(st.st_mode) || access(base, W_OK) != 0) {
        base = getenv("TMPDIR");
        if (!base || base[0] != '/') base = "/tmp";
    }
    if (snprintf(path, path_capacity, "%s/servelab-%s-XXXXXX", base, tag) >= (int)path_capacity) return -1;
    return mkdtemp(path) ? 0 : -1;
}

void fuzz_remove_tree(const char* path) {
    DIR* dir = opendir(path);
    if (dir) {
        struct dirent* entry;
        while ((entry = readdir(dir)) != NULL) {
            if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
            char child[4096];
            if (snprintf(child, sizeof child, "%s/%s", path, entry->d_name) >= (int)sizeof child) continue;
            struct stat st;
            if (lstat(child, &st) == 0 && S_ISDIR(st.st_mode)) fuzz_remove_tree(child);
            else unlink(child);
        }
        closedir(dir);
    }
    rmdir(path);
}

int fuzz_write_file(const char* path, const void* data, size_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    int status = write_all(fd, data, size);
    if (close(fd) != 0) status = -1;
    return status;
}

const char* fuzz_seed_folder(int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') continue;
        struct stat st;
        return stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode) ? argv[i] : NULL;
    }
    return NULL;
}

void fuzz_write_seed(const char* folder, const char* name, const void* bytes, size_t size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", folder, name);
    struct stat st;
    if (bytes && stat(path, &st) != 0) fuzz_write_file(path, bytes, size);
}

void fuzz_put(fuzz_buffer* b, const void* data, size_t n) {
    if (b->size + n > b->capacity) {
        size_t capacity = (b->size + n) * 2;
        uint8_t* grown = realloc(b->bytes, capacity);
        if (!grown) abort();
        b->bytes = grown;
        b->capacity = capacity;
    }
    memcpy(b->bytes + b->size, data, n);
    b->size += n;
}

void fuzz_check_failed(const char* file, int line, const char* condition) {
    char summary[512];
    snprintf(summary, sizeof summary, "fuzz check failed at %s:%d: %s", file, line, condition);
    __sanitizer_report_error_summary(summary);
    abort();
}
