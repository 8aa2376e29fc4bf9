#include "lab/quiz_progress.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char HEADER[] = "servelab-quiz-progress 1";

// Box 0 and 1 are due at once; then 1, 3, 7, 16 days.
static const int64_t BOX_INTERVALS[QUIZ_MAX_BOX + 1] = {0, 0, 86400, 3 * 86400, 7 * 86400, 16 * 86400};

void quiz_progress_free(quiz_progress* p) {
    free(p->records);
    memset(p, 0, sizeof *p);
}

int64_t quiz_box_interval_seconds(int box) {
    if (box < 0) box = 0;
    if (box > QUIZ_MAX_BOX) box = QUIZ_MAX_BOX;
    return BOX_INTERVALS[box];
}

bool quiz_record_due(const quiz_record* r, int64_t now) {
    if (!r || r->box == 0) return true;
    return now >= r->last_seen + quiz_box_interval_seconds(r->box);
}

const quiz_record* quiz_progress_find(const quiz_progress* p, const char* id) {
    for (int i = 0; i < p->n_records; i++)
        if (strcmp(p->records[i].id, id) == 0) return &p->records[i];
    return NULL;
}

// Ids are written unquoted, one word: letters, digits, '-', '_', '.'.
static bool valid_id(const char* id) {
    size_t n = strlen(id);
    if (n == 0 || n >= sizeof((quiz_record*)0)->id) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)id[i]) && id[i] != '-' && id[i] != '_' && id[i] != '.') return false;
    return true;
}

static quiz_record* append_record(quiz_progress* p, const char* id) {
    if (p->n_records == p->capacity) {
        int capacity = p->capacity ? 2 * p->capacity : 64;
        quiz_record* grown = realloc(p->records, (size_t)capacity * sizeof *grown);
        if (!grown) return NULL;
        p->records = grown;
        p->capacity = capacity;
    }
    quiz_record* r = &p->records[p->n_records++];
    memset(r, 0, sizeof *r);
    snprintf(r->id, sizeof r->id, "%s", id);
    return r;
}

int quiz_progress_record(quiz_progress* p, const char* id, bool correct, int64_t now, error_info* err) {
    if (!valid_id(id)) return error_set(err, "progress: '%s' is not a valid item id", id);
    quiz_record* r = (quiz_record*)quiz_progress_find(p, id);
    if (!r && !(r = append_record(p, id))) return error_set(err, "progress: out of memory");
    if (correct) {
        r->n_correct++;
        r->box = r->box == 0 ? 2 : (r->box < QUIZ_MAX_BOX ? r->box + 1 : QUIZ_MAX_BOX);
    } else {
        r->n_wrong++;
        r->box = 1;
    }
    r->last_seen = now;
    return 0;
}

// ---- text ------------------------------------------------------------------------------

int quiz_progress_parse(const char* text, size_t length, quiz_progress* out, error_info* err) {
    memset(out, 0, sizeof *out);
    if (memchr(text, '\0', length)) return error_set(err, "contains a NUL byte (not a text file)");
    size_t header_length = strlen(HEADER);
    if (length < header_length || memcmp(text, HEADER, header_length) != 0 ||
        (length > header_length && text[header_length] != '\n'))
        return error_set(err, "not a servelab progress file (the first line is not '%s')", HEADER);
    if (length == 0 || text[length - 1] != '\n') return error_set(err, "truncated (the last line has no newline)");
    int line_number = 1;
    for (size_t at = header_length + 1; at < length; line_number++) {
        const char* line = text + at;
        const char* end = memchr(line, '\n', length - at);
        size_t line_length = (size_t)(end - line);
        at += line_length + 1;
        if (line_length == 0 || line[0] == '#') continue;
        char copy[256], id[64], tail;
        if (line_length >= sizeof copy) {
            quiz_progress_free(out);
            return error_set(err, "line %d: too long", line_number + 1);
        }
        memcpy(copy, line, line_length);
        copy[line_length] = '\0';
        int box, n_correct, n_wrong;
        int64_t last_seen;
        if (sscanf(copy, "%63s %d %d %d %" SCNd64 " %c", id, &box, &n_correct, &n_wrong, &last_seen, &tail) != 5 ||
            !valid_id(id) || box < 0 || box > QUIZ_MAX_BOX || n_correct < 0 || n_wrong < 0 || last_seen < 0) {
            quiz_progress_free(out);
            return error_set(err, "line %d: expected 'id box(0-%d) correct wrong last_seen', found '%s'",
                             line_number + 1, QUIZ_MAX_BOX, copy);
        }
        if (quiz_progress_find(out, id)) {
            quiz_progress_free(out);
            return error_set(err, "line %d: item '%s' appears twice", line_number + 1, id);
        }
        quiz_record* r = append_record(out, id);
        if (!r) {
            quiz_progress_free(out);
            return error_set(err, "out of memory");
        }
        r->box = box;
        r->n_correct = n_correct;
        r->n_wrong = n_wrong;
        r->last_seen = last_seen;
    }
    return 0;
}

// write() until done (it may write less than asked).
static int write_all(int fd, const char* bytes, size_t n) {
    while (n > 0) {
        ssize_t written = write(fd, bytes, n);
        if (written < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        bytes += written;
        n -= (size_t)written;
    }
    return 0;
}

int quiz_progress_write(const quiz_progress* p, int fd, error_info* err) {
    char line[160];
    int n = snprintf(line, sizeof line, "%s\n# id box correct wrong last_seen\n", HEADER);
    if (write_all(fd, line, (size_t)n)) return error_set(err, "progress: write failed: %s", strerror(errno));
    for (int i = 0; i < p->n_records; i++) {
        const quiz_record* r = &p->records[i];
        n = snprintf(line, sizeof line, "%s %d %d %d %" PRId64 "\n", r->id, r->box, r->n_correct, r->n_wrong,
                     r->last_seen);
        if (write_all(fd, line, (size_t)n)) return error_set(err, "progress: write failed: %s", strerror(errno));
    }
    return 0;
}

// ---- files -----------------------------------------------------------------------------

int quiz_progress_default_path(char* out, int capacity, error_info* err) {
    const char* data_home = getenv("XDG_DATA_HOME");
    // The XDG spec says a relative XDG_DATA_HOME is invalid and must be ignored.
    if (data_home && data_home[0] == '/') {
        snprintf(out, (size_t)capacity, "%s/servelab/progress", data_home);
        return 0;
    }
    const char* home = getenv("HOME");
    if (!home || home[0] == '\0')
        return error_set(err, "cannot place the progress file: neither XDG_DATA_HOME nor HOME is set");
    snprintf(out, (size_t)capacity, "%s/.local/share/servelab/progress", home);
    return 0;
}

// mkdir -p of the folder that holds `path`.
static int make_parent_dirs(const char* path, error_info* err) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char* slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = '\0';
    for (char* p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return error_set(err, "%s: cannot create: %s", dir, strerror(errno));
        *p = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return error_set(err, "%s: cannot create: %s", dir, strerror(errno));
    return 0;
}

static char* read_whole_file(const char* path, size_t* length, int* error_number) {
    FILE* f = fopen(path, "rb");
    if (!f) {
        *error_number = errno;
        return NULL;
    }
    size_t capacity = 4096, used = 0;
    char* text = malloc(capacity);
    while (text) {
        used += fread(text + used, 1, capacity - used, f);
        if (used < capacity) break;
        char* grown = realloc(text, capacity * 2);
        if (!grown) {
            free(text);
            text = NULL;
            break;
        }
        text = grown;
        capacity *= 2;
    }
    *error_number = text ? (ferror(f) ? EIO : 0) : ENOMEM;
    fclose(f);
    if (text && *error_number) {
        free(text);
        text = NULL;
    }
    *length = used;
    return text;
}

int quiz_progress_load(const char* path, quiz_progress* out, char* warning, int warning_capacity, error_info* err) {
    memset(out, 0, sizeof *out);
    if (warning_capacity > 0) warning[0] = '\0';
    size_t length = 0;
    int error_number = 0;
    char* text = read_whole_file(path, &length, &error_number);
    if (!text) {
        if (error_number == ENOENT) return 0; // first run
        return error_set(err, "%s: cannot read: %s", path, strerror(error_number));
    }
    error_info problem = {{0}};
    int status = quiz_progress_parse(text, length, out, &problem);
    free(text);
    if (status == 0) return 0;
    // Keep the bad file for a look, under a name that says when it was set aside.
    char aside[1200], stamp[32];
    time_t now = time(NULL);
    struct tm local;
    localtime_r(&now, &local);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
    snprintf(aside, sizeof aside, "%s.corrupt-%s", path, stamp);
    for (int k = 2; access(aside, F_OK) == 0 && k < 1000; k++)
        snprintf(aside, sizeof aside, "%s.corrupt-%s-%d", path, stamp, k);
    if (rename(path, aside) != 0)
        return error_set(err, "%s: %s, and it cannot be moved aside: %s", path, problem.message, strerror(errno));
    snprintf(warning, (size_t)warning_capacity, "%s: %s; moved it to %s and started fresh progress", path,
             problem.message, aside);
    return 0;
}

int quiz_progress_save(const char* path, const quiz_progress* p, error_info* err) {
    if (make_parent_dirs(path, err)) return -1;
    char temp[1200];
    snprintf(temp, sizeof temp, "%s.tmp-%ld", path, (long)getpid());
    int fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return error_set(err, "%s: cannot create: %s", temp, strerror(errno));
    int status = quiz_progress_write(p, fd, err);
    if (status == 0 && fsync(fd) != 0) status = error_set(err, "%s: fsync failed: %s", temp, strerror(errno));
    if (close(fd) != 0 && status == 0) status = error_set(err, "%s: close failed: %s", temp, strerror(errno));
    if (status == 0 && rename(temp, path) != 0)
        status = error_set(err, "%s: cannot replace with %s: %s", path, temp, strerror(errno));
    if (status) {
        unlink(temp);
        return -1;
    }
    // Make the rename itself durable: fsync the folder (best effort).
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char* slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    int dir_fd = open(slash ? (dir[0] ? dir : "/") : ".", O_RDONLY | O_DIRECTORY);
    if (dir_fd >= 0) {
        fsync(dir_fd);
        close(dir_fd);
    }
    return 0;
}
