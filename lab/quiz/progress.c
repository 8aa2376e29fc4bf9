#include "lab/quiz/progress.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/output_file.h"

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
    int64_t interval = quiz_box_interval_seconds(r->box);
    // A record built in memory may hold any last_seen; near INT64_MAX the
    // sum would wrap to the past and make the item due. It is not due.
    if (r->last_seen > INT64_MAX - interval) return false;
    return now >= r->last_seen + interval;
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
    // The counts stop at INT_MAX rather than wrap (a file may hold INT_MAX).
    if (correct) {
        if (r->n_correct < INT_MAX) r->n_correct++;
        r->box = r->box == 0 ? 2 : (r->box < QUIZ_MAX_BOX ? r->box + 1 : QUIZ_MAX_BOX);
    } else {
        if (r->n_wrong < INT_MAX) r->n_wrong++;
        r->box = 1;
    }
    r->last_seen = now;
    return 0;
}

// ---- text ------------------------------------------------------------------------------

// One number field of a record: an optional '-' and digits (what the
// writer writes), in min..max. strtoll reports a value beyond long long as
// ERANGE; sscanf("%d") would wrap it silently. 0, or -1 with `problem`.
static int parse_number_field(const char* name, const char* word, long long min, long long max, const char* max_note,
                              long long* value, char* problem, size_t problem_capacity) {
    const char* digits = word[0] == '-' ? word + 1 : word;
    bool all_digits = digits[0] != '\0';
    for (const char* c = digits; *c; c++)
        if (!isdigit((unsigned char)*c)) all_digits = false;
    if (!all_digits) {
        snprintf(problem, problem_capacity, "%s '%.40s' is not a whole number", name, word);
        return -1;
    }
    errno = 0;
    long long parsed = strtoll(word, NULL, 10);
    if (errno == ERANGE || parsed < min || parsed > max) {
        snprintf(problem, problem_capacity, "%s '%.40s' is out of range (%lld..%lld%s)", name, word, min, max,
                 max_note);
        return -1;
    }
    *value = parsed;
    return 0;
}

// One record line (NUL-terminated, no newline; split in place) into r.
// 0, or -1 with `problem` naming the field and what was wrong with it.
static int parse_record_line(char* line, quiz_record* r, char* problem, size_t problem_capacity) {
    char original[256];
    snprintf(original, sizeof original, "%s", line);
    char* words[5];
    int n_words = 0;
    char* save = NULL;
    // Blanks of any kind separate the fields; a '\r' of a CRLF file is one.
    for (char* word = strtok_r(line, " \t\r\v\f", &save); word; word = strtok_r(NULL, " \t\r\v\f", &save)) {
        if (n_words < 5) words[n_words] = word;
        n_words++;
    }
    if (n_words != 5) {
        snprintf(problem, problem_capacity, "expected 5 fields 'id box correct wrong last_seen', found %d in '%.200s'",
                 n_words, original);
        return -1;
    }
    if (!valid_id(words[0])) {
        snprintf(problem, problem_capacity,
                 "id '%.40s' is not an item id (1-%zu letters, digits, '-', '_' or '.')", words[0],
                 sizeof r->id - 1);
        return -1;
    }
    long long box, n_correct, n_wrong, last_seen;
    if (parse_number_field("box", words[1], 0, QUIZ_MAX_BOX, "", &box, problem, problem_capacity) ||
        parse_number_field("correct", words[2], 0, INT_MAX, "", &n_correct, problem, problem_capacity) ||
        parse_number_field("wrong", words[3], 0, INT_MAX, "", &n_wrong, problem, problem_capacity) ||
        parse_number_field("last_seen", words[4], 0, QUIZ_LAST_SEEN_MAX, ", the end of year 9999", &last_seen,
                           problem, problem_capacity))
        return -1;
    memset(r, 0, sizeof *r);
    snprintf(r->id, sizeof r->id, "%s", words[0]);
    r->box = (int)box;
    r->n_correct = (int)n_correct;
    r->n_wrong = (int)n_wrong;
    r->last_seen = (int64_t)last_seen;
    return 0;
}

int quiz_progress_parse(const char* text, size_t length, quiz_progress* out, quiz_progress_skipped* skipped,
                        error_info* err) {
    memset(out, 0, sizeof *out);
    if (skipped) memset(skipped, 0, sizeof *skipped);
    if (memchr(text, '\0', length)) return error_set(err, "contains a NUL byte (not a text file)");
    size_t header_length = strlen(HEADER);
    if (length < header_length || memcmp(text, HEADER, header_length) != 0 ||
        (length > header_length && text[header_length] != '\n'))
        return error_set(err, "not a servelab progress file (the first line is not '%s')", HEADER);
    // No final newline: a writer died mid-line, and the numbers before the
    // tear may be cut short too ("17" of "1700000000"), so no line is trusted.
    if (length == 0 || text[length - 1] != '\n') return error_set(err, "truncated (the last line has no newline)");
    int line_number = 2; // the header is line 1
    for (size_t at = header_length + 1; at < length; line_number++) {
        const char* line = text + at;
        const char* end = memchr(line, '\n', length - at);
        size_t line_length = (size_t)(end - line);
        at += line_length + 1;
        if (line_length == 0 || line[0] == '#') continue;
        char copy[256], problem[320];
        quiz_record parsed;
        if (line_length >= sizeof copy) {
            snprintf(problem, sizeof problem, "too long (%zu characters; a record is under %zu)", line_length,
                     sizeof copy);
        } else {
            memcpy(copy, line, line_length);
            copy[line_length] = '\0';
            if (parse_record_line(copy, &parsed, problem, sizeof problem) == 0) {
                if (!quiz_progress_find(out, parsed.id)) {
                    quiz_record* r = append_record(out, parsed.id);
                    if (!r) {
                        quiz_progress_free(out);
                        return error_set(err, "out of memory");
                    }
                    *r = parsed;
                    continue;
                }
                snprintf(problem, sizeof problem, "item '%s' appears twice", parsed.id);
            }
        }
        if (!skipped) {
            quiz_progress_free(out);
            return error_set(err, "line %d: %s", line_number, problem);
        }
        if (skipped->n_lines++ == 0) {
            skipped->first_line = line_number;
            snprintf(skipped->first_problem, sizeof skipped->first_problem, "%s", problem);
        }
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

// The whole file (malloc'ed, *length bytes), or NULL: with *missing when
// there is no such file (a first run), else with err saying why not.
static char* read_whole_file(const char* path, size_t* length, bool* missing, error_info* err) {
    *missing = false;
    *length = 0;
    // O_NONBLOCK: a FIFO at the path must not hang the quiz waiting for a writer.
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        *missing = errno == ENOENT;
        error_set(err, "%s: cannot read: %s", path, strerror(errno));
        return NULL;
    }
    struct stat info;
    if (fstat(fd, &info) != 0) {
        error_set(err, "%s: cannot read: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    // A folder opens fine and fails only at read() with EISDIR, which came
    // out as "Input/output error"; say what is there instead.
    if (!S_ISREG(info.st_mode)) {
        error_set(err, S_ISDIR(info.st_mode) ? "%s is a directory" : "%s is not a regular file", path);
        close(fd);
        return NULL;
    }
    size_t capacity = (size_t)info.st_size + 4096, used = 0;
    char* text = malloc(capacity);
    for (;;) {
        if (!text) {
            error_set(err, "%s: cannot read: out of memory", path);
            break;
        }
        ssize_t got = read(fd, text + used, capacity - used);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            error_set(err, "%s: cannot read: %s", path, strerror(errno));
            free(text);
            text = NULL;
            break;
        }
        if (got == 0) break;
        used += (size_t)got;
        if (used < capacity) continue;
        char* grown = realloc(text, capacity * 2); // the file grew since fstat
        if (!grown) free(text);
        text = grown;
        capacity *= 2;
    }
    close(fd);
    *length = used;
    return text;
}

// <path>.corrupt-<YYYYmmdd-HHMMSS>, with -2, -3 ... when that name is taken:
// where a bad file (or a copy of one) is kept for a look.
static void aside_name(const char* path, char* out, size_t capacity) {
    char stamp[32];
    time_t now = time(NULL);
    struct tm local;
    localtime_r(&now, &local);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
    snprintf(out, capacity, "%s.corrupt-%s", path, stamp);
    for (int k = 2; access(out, F_OK) == 0 && k < 1000; k++)
        snprintf(out, capacity, "%s.corrupt-%s-%d", path, stamp, k);
}

// A new file `path` holding `text` (never over an existing one). 0, or -1 with errno.
static int write_new_file(const char* path, const char* text, size_t length) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    if (write_all(fd, text, length) != 0) {
        int write_errno = errno;
        close(fd);
        unlink(path);
        errno = write_errno;
        return -1;
    }
    return close(fd);
}

int quiz_progress_load(const char* path, quiz_progress* out, char* warning, int warning_capacity, error_info* err) {
    memset(out, 0, sizeof *out);
    if (warning_capacity > 0) warning[0] = '\0';
    size_t length = 0;
    bool missing = false;
    error_info read_problem = {{0}};
    char* text = read_whole_file(path, &length, &missing, &read_problem);
    if (!text) {
        if (missing) return 0; // first run
        return error_set(err, "%s", read_problem.message);
    }
    error_info problem = {{0}};
    quiz_progress_skipped skipped;
    int status = quiz_progress_parse(text, length, out, &skipped, &problem);
    char aside[1200];
    if (status != 0 || skipped.n_lines > 0) aside_name(path, aside, sizeof aside);
    if (status == 0 && skipped.n_lines > 0) {
        // The next save rewrites the file without the skipped lines; keep
        // the file as it was, so that a hand edit gone wrong can be mended.
        char kept[1300];
        if (write_new_file(aside, text, length) == 0)
            snprintf(kept, sizeof kept, "the file as it was is copied to %s", aside);
        else
            snprintf(kept, sizeof kept, "could not copy the file as it was to %s: %s", aside, strerror(errno));
        char more[64] = "";
        int n_more = skipped.n_lines - 1;
        if (n_more > 0) snprintf(more, sizeof more, " (and %d more bad line%s)", n_more, n_more == 1 ? "" : "s");
        snprintf(warning, (size_t)warning_capacity, "%s:%d: %s; skipped that line%s, kept %d good record%s; %s", path,
                 skipped.first_line, skipped.first_problem, more, out->n_records, out->n_records == 1 ? "" : "s",
                 kept);
    }
    free(text);
    if (status == 0) return 0;
    // Keep the bad file for a look, under a name that says when it was set aside.
    if (rename(path, aside) != 0)
        return error_set(err, "%s: %s, and it cannot be moved aside: %s", path, problem.message, strerror(errno));
    snprintf(warning, (size_t)warning_capacity, "%s: %s; moved it to %s and started fresh progress", path,
             problem.message, aside);
    return 0;
}

int quiz_progress_save(const char* path, const quiz_progress* p, error_info* err) {
    if (make_parent_dirs(path, err)) return -1;
    // output_file: a new temporary (never a link planted at its name), fsync,
    // rename; a link at the path itself is refused, not written through.
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return error_set(err, "%s is a directory", path);
    output_file out;
    if (output_file_open(&out, path, err)) return -1;
    // The records go straight to the descriptor; nothing is buffered in the stream.
    int status = quiz_progress_write(p, fileno(out.stream), err);
    if (status) {
        output_file_abort(&out);
        return -1;
    }
    return output_file_commit(&out, false, err);
}
