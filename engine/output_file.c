#include "engine/output_file.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int output_file_open(output_file* f, const char* path, error_info* err) {
    memset(f, 0, sizeof *f);
    if (snprintf(f->path, sizeof f->path, "%s", path) >= (int)sizeof f->path)
        return error_set(err, "%s: path too long", path);
    struct stat existing;
    f->direct = stat(path, &existing) == 0 && !S_ISREG(existing.st_mode);
    if (f->direct) {
        if (S_ISDIR(existing.st_mode)) return error_set(err, "%s: is a directory", path);
        f->stream = fopen(path, "wb");
        if (!f->stream) return error_set(err, "%s: cannot open for writing: %s", path, strerror(errno));
        return 0;
    }
    snprintf(f->temporary, sizeof f->temporary, "%s.tmp.%ld", path, (long)getpid());
    f->stream = fopen(f->temporary, "wb");
    if (!f->stream) return error_set(err, "%s: cannot create: %s", f->temporary, strerror(errno));
    return 0;
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
    return 0;
}

void output_file_abort(output_file* f) {
    if (f->stream) fclose(f->stream);
    f->stream = NULL;
    if (!f->direct && f->temporary[0]) remove(f->temporary);
}
