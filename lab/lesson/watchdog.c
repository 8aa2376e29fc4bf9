// lesson watchdog: the hard stop behind a lesson's time limit.
//
// The instruction-count hook (limits.c) stops an ordinary lesson, but some
// code never reaches it: one long C call of Lua's own library (a
// backtracking string.find pattern ran 8 s past a 3 s limit), or Lua code
// that runs with hooks off (an xpcall message handler entered from the
// hook's own error). So while lesson_resume runs, a timer interrupts the
// lesson's thread every WATCHDOG_PERIOD_MS. Once the lesson is
// HARD_STOP_GRACE_S past its limit (or past a stop request such as
// Ctrl-C), and the interrupted instruction lies inside the Lua library,
// the handler jumps back to lesson_resume, which abandons the Lua state
// and frees it block by block (limits.c keeps every block in a list).
//
// Why "inside the Lua library" makes the jump safe: liblua keeps no global
// state, so leaving it mid-instruction corrupts only the lua_State that is
// thrown away. The lab's own C functions also enter liblua (to push a
// result, say), but any such call can already raise a Lua error (out of
// memory), so they never hold anything across it that the lesson's lists
// do not reach (engines, models, files, lab.time's engine). Anywhere else
// (the allocator, libc holding a lock, an engine mid-step) the handler
// returns and tries again on the next tick; those places return quickly or
// check the time themselves. Where liblua is linked statically its code
// cannot be told apart, and only the hook's stop applies.
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "lab/lesson/internal.h"

enum { WATCHDOG_PERIOD_MS = 20 };
// Past the limit, the hook has had 0.5 s (about 5000 chances) to stop the
// lesson; what is still running then cannot be reached by it.
static const double HARD_STOP_GRACE_S = 0.5;

// The address range of liblua's code, found once.
static uintptr_t lua_code_start, lua_code_end;
static pthread_once_t lua_code_once = PTHREAD_ONCE_INIT;

// The executable segment that holds `probe`, from the program's headers.
typedef struct segment_search {
    uintptr_t probe;
    uintptr_t start, end;
} segment_search;

static int find_code_segment(struct dl_phdr_info* info, size_t size, void* user) {
    (void)size;
    segment_search* search = user;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr)* segment = &info->dlpi_phdr[i];
        if (segment->p_type != PT_LOAD || !(segment->p_flags & PF_X)) continue;
        uintptr_t start = info->dlpi_addr + segment->p_vaddr;
        if (search->probe >= start && search->probe < start + segment->p_memsz) {
            search->start = start;
            search->end = start + segment->p_memsz;
            return 1;
        }
    }
    return 0;
}

static void locate_lua_code(void) {
    segment_search lua = {(uintptr_t)lua_newstate, 0, 0};
    dl_iterate_phdr(find_code_segment, &lua);
    uintptr_t own = (uintptr_t)lesson_watchdog_available;
    if (lua.end == 0 || (own >= lua.start && own < lua.end)) return; // liblua linked into the program
    lua_code_start = lua.start;
    lua_code_end = lua.end;
}

bool lesson_watchdog_available(void) {
    pthread_once(&lua_code_once, locate_lua_code);
    return lua_code_end > lua_code_start;
}

static uintptr_t interrupted_address(const void* context) {
    const ucontext_t* uc = context;
#if defined(__x86_64__)
    return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    return (uintptr_t)uc->uc_mcontext.pc;
#else
    (void)uc;
    return 0;
#endif
}

// The lesson inside lesson_resume on this thread (the handler's target).
static _Thread_local lesson* volatile watched_lesson;

static double monotonic_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void on_watchdog_tick(int signal_number, siginfo_t* info, void* context) {
    (void)signal_number;
    (void)info;
    lesson* l = watched_lesson;
    if (!l) return;
    int saved_errno = errno;
    double now = monotonic_seconds();
    if (l->options.stop_flag && *l->options.stop_flag && l->stop_seen_s == 0) l->stop_seen_s = now;
    double used_s = lesson_cpu_seconds() - l->cpu_start_s;
    if (!l->hook_tightened && (used_s > l->options.time_limit_s || l->stop_seen_s > 0)) {
        l->hook_tightened = 1;
        lesson_tighten_hook(l);
    }
    bool over_time = used_s > l->options.time_limit_s + HARD_STOP_GRACE_S;
    bool stop_ignored = l->stop_seen_s > 0 && now - l->stop_seen_s > HARD_STOP_GRACE_S;
    uintptr_t address = interrupted_address(context);
    if ((over_time || stop_ignored) && address >= lua_code_start && address < lua_code_end) {
        watched_lesson = NULL;
        l->hard_stop_reason = over_time ? HARD_STOP_TIME : HARD_STOP_REQUESTED;
        siglongjmp(l->hard_stop_jump, 1);
    }
    errno = saved_errno;
}

static int watchdog_signal(void) { return SIGRTMIN + 4; }

static void install_handler(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_watchdog_tick;
    // SA_RESTART: a tick must not fail the engine's or stdio's system calls.
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(watchdog_signal(), &action, NULL);
}

int lesson_watchdog_start(lesson* l) {
    if (!lesson_watchdog_available()) return -1;
    static pthread_once_t handler_once = PTHREAD_ONCE_INIT;
    pthread_once(&handler_once, install_handler);
    struct sigevent event;
    memset(&event, 0, sizeof event);
    event.sigev_notify = SIGEV_THREAD_ID;
    event.sigev_signo = watchdog_signal();
    event._sigev_un._tid = (pid_t)syscall(SYS_gettid);
    if (timer_create(CLOCK_MONOTONIC, &event, &l->watchdog_timer) != 0) return -1;
    struct itimerspec period = {{0, WATCHDOG_PERIOD_MS * 1000000L}, {0, WATCHDOG_PERIOD_MS * 1000000L}};
    watched_lesson = l;
    if (timer_settime(l->watchdog_timer, 0, &period, NULL) != 0) {
        watched_lesson = NULL;
        timer_delete(l->watchdog_timer);
        return -1;
    }
    l->watchdog_running = true;
    return 0;
}

void lesson_watchdog_stop(lesson* l) {
    watched_lesson = NULL;
    if (!l->watchdog_running) return;
    timer_delete(l->watchdog_timer); // a tick already queued finds no lesson and returns
    l->watchdog_running = false;
}

