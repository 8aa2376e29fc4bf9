#include "lab/common/progress.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

// 4 draws a second: the clock visibly moves, and a terminal over a slow
// link (ssh) is not flooded by a run of thousands of short steps.
#define TICK_NS 250000000L

struct progress {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t ticker;
    bool stop;
    bool held;
    double start_s;
    int drawn_length; // characters on the terminal now, 0 when erased
    char what[64];
    char detail[96];
    char unit[32];
    long done, total;
};

static double monotonic_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool progress_wanted(bool forced) { return forced || isatty(STDERR_FILENO); }

// One line at a time: a second ticker would rewrite the first one's line
// (a command's own line while it builds a preset, say).
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static bool line_live;

static bool claim_line(void) {
    pthread_mutex_lock(&live_lock);
    bool claimed = !line_live;
    line_live = true;
    pthread_mutex_unlock(&live_lock);
    return claimed;
}

static void release_line(void) {
    pthread_mutex_lock(&live_lock);
    line_live = false;
    pthread_mutex_unlock(&live_lock);
}

// A line wider than the terminal wraps, and \r then rewrites only its last
// row: the line is cut to the width (80 when stderr is not a terminal).
static int line_width(void) {
    struct winsize size;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 1) return size.ws_col - 1;
    return 79;
}

static void erase_locked(progress* p) {
    if (p->drawn_length == 0) return;
    fprintf(stderr, "\r%*s\r", p->drawn_length, "");
    fflush(stderr);
    p->drawn_length = 0;
}

static void draw_locked(progress* p) {
    char count[64] = "";
    if (p->total > 0) snprintf(count, sizeof count, "%ld/%ld %s", p->done, p->total, p->unit);
    else if (p->unit[0]) snprintf(count, sizeof count, "%ld %s", p->done, p->unit);
    double elapsed = monotonic_seconds() - p->start_s;
    char clock[32];
    if (elapsed < 60) snprintf(clock, sizeof clock, "%.1f s", elapsed);
    else snprintf(clock, sizeof clock, "%dm%02ds", (int)(elapsed / 60), (int)elapsed % 60);
    // The detail last: a line cut to the terminal's width loses the end of
    // the detail, never the count or the clock.
    char line[320];
    int length = snprintf(line, sizeof line, "%s: %s%s%s%s%s", p->what, count, count[0] ? ", " : "", clock,
                          p->detail[0] ? ": " : "", p->detail);
    int width = line_width();
    if (length > (int)sizeof line - 1) length = (int)sizeof line - 1;
    if (length > width) length = width;
    // Spaces over what is left of a longer previous line.
    int padding = p->drawn_length > length ? p->drawn_length - length : 0;
    fprintf(stderr, "\r%.*s%*s", length, line, padding, "");
    fflush(stderr);
    p->drawn_length = length + padding;
}

static void* tick(void* argument) {
    progress* p = argument;
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_nsec += TICK_NS;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
        while (!p->stop && pthread_cond_timedwait(&p->wake, &p->lock, &deadline) == 0) {
        }
        if (!p->stop && !p->held) draw_locked(p);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

progress* progress_start(const char* what, bool forced) {
    if (!progress_wanted(forced) || !claim_line()) return NULL;
    progress* p = calloc(1, sizeof *p);
    if (!p) {
        release_line();
        return NULL;
    }
    snprintf(p->what, sizeof p->what, "%s", what);
    p->start_s = monotonic_seconds();
    pthread_condattr_t attributes;
    pthread_condattr_init(&attributes);
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, &attributes);
    pthread_condattr_destroy(&attributes);
    if (pthread_create(&p->ticker, NULL, tick, p) != 0) {
        pthread_cond_destroy(&p->wake);
        pthread_mutex_destroy(&p->lock);
        free(p);
        release_line();
        return NULL;
    }
    return p;
}

void progress_set(progress* p, const char* detail, long done, long total, const char* unit) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    snprintf(p->detail, sizeof p->detail, "%s", detail ? detail : "");
    snprintf(p->unit, sizeof p->unit, "%s", unit ? unit : "");
    p->done = done;
    p->total = total;
    pthread_mutex_unlock(&p->lock);
}

void progress_hold(progress* p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->held = true;
    erase_locked(p);
    pthread_mutex_unlock(&p->lock);
}

void progress_resume(progress* p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->held = false;
    pthread_mutex_unlock(&p->lock);
}

void progress_finish(progress* p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    draw_locked(p);
    erase_locked(p);
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->ticker, NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p);
    release_line();
}
