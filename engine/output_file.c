#include "engine/output_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Tries this many names for the temporary before giving up: each is taken
// only when nothing (not even a dangling link) has that name already.
#define OUTPUT_FILE_TEMPORARY_TRIES 100

int output_file_open(output_file* f, const char* path, error_info* err) {
    memset(f, 0, sizeof *f);
    if (snprintf(f->path, sizeof f->path, "%s", path) >= (int)sizeof f->path)
        return error_set(err, "%s: path too long", path);
    struct stat existing, link;
    const bool exists = stat(path, &existing) == 0;
    const bool is_link = lstat(path, &link) == 0 && S_ISLNK(link.st_mode);
    f->direct = exists && !S_ISREG(existing.st_mode);
    if (f->direct) {
        if (S_ISDIR(existing.st_mode)) return error_set(err, "%s: is a directory", path);
        f->stream = fopen(path, "wb");
        if (!f->stream) return error_set(err, "%s: cannot open for writing: %s", path, strerror(errno));
        return 0;
    }
    if (is_link)
        return error_set(err, "%s: is a symbolic link; not written through it (remove it, or name the file it points "
                              "to)",
                         path);
    int fd = -1;
    for (int attempt = 0; attempt < OUTPUT_FILE_TEMPORARY_TRIES && fd < 0; attempt++) {
        if (attempt == 0) snprintf(f->temporary, sizeof f->temporary, "%s.tmp.%ld", path, (long)getpid());
        else snprintf(f->temporary, sizeof f->temporary, "%s.tmp.%ld.%d", path, (long)getpid(), attempt);
        fd = open(f->temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        int saved = errno;
        f->temporary[0] = '\0'; // not ours: abort must not remove it
        return error_set(err, "%s: cannot create a temporary beside it: %s", path, strerror(saved));
    }
    f->stream = fdopen(fd, "wb");
    if (!f->stream) {
        int saved = errno;
        close(fd);
        remove(f->temporary);
        f->temporary[0] = '\0';
        return error_set(err, "%s: cannot create: %s", path, strerror(saved));
    }
    return 0;
}

// Makes a rename durable: fsync the folder that holds path (best effort).
static void sync_parent_folder(const char* path) {
    char folder[4096];
    snprintf(folder, sizeof folder, "%s", path);
    char* slash = strrchr(folder, '/');
    if (slash) *slash = '\0';
    int fd = open(slash ? (folder[0] ? folder : "/") : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

int output_file_commit(output_file* f, bool failed, error_info* err) {
    if (!f->stream) return error_set(err, "%s: not open", f->path);
    int saved = 0;
    if (!failed && fflush(f->stream) != 0) saved = errno, failed = true;
    if (!failed && !f->direct && fsync(fileno(f->stream)) != 0) saved = errno, failed = true;
    if (fclose(f->stream) != 0 && !failed) saved = errno, failed = true;
    f->stream = NULL;
    if (failed) {
        if (!f->direct) remove(f->temporary);
        return error_set(err, "%s: write failed%s%s", f->path, saved ? ": " : "", saved ? strerror(saved) : "");
    }
    if (!f->direct && rename(f->temporary, f->path) != 0) {
        saved = errno;
        remove(f->temporary);
        return error_set(err, "%s: cannot rename into place: %s", f->path, strerror(saved));
    }
    if (!f->direct) sync_parent_folder(f->path);
    return 0;
}

void output_file_abort(output_file* f) {
    if (f->stream) fclose(f->stream);
    f->stream = NULL;
    if (!f->direct && f->temporary[0]) remove(f->temporary);
}
