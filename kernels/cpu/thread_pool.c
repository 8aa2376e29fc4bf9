#include "kernels/cpu/thread_pool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

// How long a quiet thread polls before it sleeps: about 2000 pause
// instructions, i.e. roughly 10-100 us depending on the CPU's pause
// latency. A decode step's runs come tens of microseconds apart (several a
// layer; a stories110m token takes 2.6 ms over 12 layers), and waking a
// sleeping thread costs about as much, so a worker that slept between runs
// would spend much of the step waking up.
#define SPIN_ROUNDS 2000

// The same poll on a contended core (about a microsecond): a thread that
// polls while another process waits for its core spends its own fair share
// of that core on nothing. Measured with a one-core busy loop beside a
// 2-thread q4_0 decode of stories110m, this and a full poll decoded at the
// same speed within the noise (0.43-0.46x of quiet); what keeps it above
// 0.29-0.32x is that run() waits for tasks, not for workers that took none.
#define CONTENDED_SPIN_ROUNDS 64

// Each thread reads its count of involuntary context switches (one
// getrusage call) once every this many runs. A rise since the last read
// means another runnable thread wanted this core: the next runs poll
// briefly. 64 runs are a few milliseconds of decode, about one time slice
// of the scheduler, so a busy neighbour is noticed within a slice or two.
#define CONTENTION_CHECK_RUNS 64

// The tasks one thread starts with, [front, back) of the numbers of one
// post, and the post's tag (its generation, modulo 2^24), packed in one
// word so that the owner taking from the front, a thief taking from the
// back and a thread still on an older post agree by one CAS: a claim whose
// tag is not the span's fails. Each span on its own cache line: the
// owner's CAS touches no other thread's line.
#define SPAN_INDEX_BITS 20
#define SPAN_TAG_BITS 24
#define SPAN_MAX_TASKS ((1 << SPAN_INDEX_BITS) - 1) // tasks per post; run() posts more when needed
#define SPAN_INDEX_MASK ((1ull << SPAN_INDEX_BITS) - 1)
#define SPAN_TAG_MASK ((1u << SPAN_TAG_BITS) - 1)

typedef struct task_span {
    _Alignas(64) _Atomic unsigned long long word; // front | back << 20 | tag << 40
} task_span;

struct thread_pool {
    int n_threads;      // threads per run, the caller included
    pthread_t* workers; // (n_threads - 1) worker threads
    int n_started;      // workers actually running (create may fail midway)

    pthread_mutex_t lock;       // guards the sleeping side of the handshakes
    pthread_cond_t work_posted; // workers sleep here between posts
    pthread_cond_t work_done;   // the caller sleeps here until the tasks are done
    bool stopping;              // under lock: free() asks workers to exit

    // The current post. The caller writes fn, ctx and first_task, then the
    // spans, then bumps `generation`. A worker reads them after it sees the
    // new generation; one that reads them late (descheduled in between)
    // may see the next post's values, but its claims carry the old tag and
    // fail, so it never calls them.
    _Atomic(thread_pool_task_fn) fn;
    _Atomic(void*) ctx;
    atomic_int first_task;  // task number of the post's task 0
    atomic_uint generation; // posts so far
    task_span* spans;       // (n_threads) the post's tasks, a contiguous span per thread

    // The caller waits for tasks, not for workers: a worker that was
    // descheduled before it took a task holds nothing up, the caller and
    // the other workers take its span. Only a task in progress is waited for.
    _Alignas(64) atomic_int tasks_done;       // tasks of the current post finished
    atomic_bool caller_sleeping;              // the caller is (about to be) asleep on work_done
    _Alignas(64) atomic_int workers_sleeping; // workers (about to be) asleep on work_posted
};

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// ---- contention: is another runnable thread waiting for this core? ---------------

typedef struct spin_policy {
    long involuntary_switches; // this thread's count at the last check
    int runs_until_check;
    int spin_rounds; // SPIN_ROUNDS, or CONTENDED_SPIN_ROUNDS after a rise
} spin_policy;

static long involuntary_switches(void) {
    struct rusage usage;
    return getrusage(RUSAGE_THREAD, &usage) == 0 ? usage.ru_nivcsw : 0;
}

static spin_policy spin_policy_start(void) {
    return (spin_policy){involuntary_switches(), CONTENTION_CHECK_RUNS, SPIN_ROUNDS};
}

// Called once per run: every CONTENTION_CHECK_RUNS runs, picks the poll
// length for the next ones.
static void spin_policy_update(spin_policy* policy) {
    if (--policy->runs_until_check > 0) return;
    policy->runs_until_check = CONTENTION_CHECK_RUNS;
    long now = involuntary_switches();
    policy->spin_rounds = now > policy->involuntary_switches ? CONTENDED_SPIN_ROUNDS : SPIN_ROUNDS;
    policy->involuntary_switches = now;
}

// ---- claiming tasks -------------------------------------------------------------

static unsigned long long pack_span(unsigned front, unsigned back, unsigned tag) {
    return (unsigned long long)front | (unsigned long long)back << SPAN_INDEX_BITS |
           (unsigned long long)(tag & SPAN_TAG_MASK) << (2 * SPAN_INDEX_BITS);
}

// Takes the next task of `span` for the post tagged `tag`: its front
// (owner) or its back (thief). Returns -1 when the span is empty or holds
// another post.
static int take_task(task_span* span, unsigned tag, bool from_back) {
    unsigned long long now = atomic_load(&span->word);
    for (;;) {
        unsigned front = (unsigned)(now & SPAN_INDEX_MASK);
        unsigned back = (unsigned)(now >> SPAN_INDEX_BITS & SPAN_INDEX_MASK);
        if ((unsigned)(now >> (2 * SPAN_INDEX_BITS)) != (tag & SPAN_TAG_MASK) || front >= back) return -1;
        unsigned long long next = from_back ? pack_span(front, back - 1, tag) : pack_span(front + 1, back, tag);
        if (atomic_compare_exchange_weak(&span->word, &now, next)) return from_back ? (int)back - 1 : (int)front;
    }
}

// One task finished: counted, and the caller woken if it sleeps. The
// caller sets caller_sleeping before its last look at tasks_done, and this
// reads it after the count (both sequentially consistent), so either the
// caller sees the count or this sees the flag: no lost wake-up.
static void finish_task(thread_pool* pool) {
    atomic_fetch_add(&pool->tasks_done, 1);
    if (atomic_load(&pool->caller_sleeping)) {
        pthread_mutex_lock(&pool->lock);
        pthread_cond_signal(&pool->work_done);
        pthread_mutex_unlock(&pool->lock);
    }
}

// Runs the thread's own span front to back (a kernel's chunks in memory
// order: one long stream for the hardware prefetcher), then takes tasks
// from the back of the other spans until none are left: a thread that
// finishes early, or runs while another is descheduled, does the rest.
static void run_tasks(thread_pool* pool, int thread, unsigned generation) {
    thread_pool_task_fn fn = atomic_load_explicit(&pool->fn, memory_order_relaxed);
    void* ctx = atomic_load_explicit(&pool->ctx, memory_order_relaxed);
    int first_task = atomic_load_explicit(&pool->first_task, memory_order_relaxed);
    for (int task; (task = take_task(&pool->spans[thread], generation, false)) >= 0;) {
        fn(ctx, first_task + task, thread);
        finish_task(pool);
    }
    for (int k = 1; k < pool->n_threads; k++) {
        task_span* other = &pool->spans[(thread + k) % pool->n_threads];
        for (int task; (task = take_task(other, generation, true)) >= 0;) {
            fn(ctx, first_task + task, thread);
            finish_task(pool);
        }
    }
}

// ---- the workers -------------------------------------------------------------------

typedef struct worker_start {
    thread_pool* pool;
    int thread; // 1 .. n_threads-1
} worker_start;

// Waits for a post newer than `seen`: polls, then sleeps. Returns the new
// generation, or `seen` when the pool is stopping.
static unsigned wait_for_post(thread_pool* pool, unsigned seen, const spin_policy* policy) {
    unsigned now = atomic_load(&pool->generation);
    for (int spin = 0; now == seen && spin < policy->spin_rounds; spin++) {
        cpu_relax();
        now = atomic_load(&pool->generation);
    }
    if (now != seen) return now;
    pthread_mutex_lock(&pool->lock);
    // Counted before the last look at `generation`; the caller bumps it
    // before it reads the count (both sequentially consistent), so either
    // this sees the post or the caller sees a sleeper and broadcasts.
    atomic_fetch_add(&pool->workers_sleeping, 1);
    while ((now = atomic_load(&pool->generation)) == seen && !pool->stopping)
        pthread_cond_wait(&pool->work_posted, &pool->lock);
    atomic_fetch_sub(&pool->workers_sleeping, 1);
    pthread_mutex_unlock(&pool->lock);
    return now;
}

static void* worker_main(void* arg) {
    worker_start start = *(worker_start*)arg;
    free(arg);
    thread_pool* pool = start.pool;
    spin_policy policy = spin_policy_start();
    for (unsigned seen = 0;;) {
        unsigned now = wait_for_post(pool, seen, &policy);
        if (now == seen) return NULL; // stopping
        seen = now;
        run_tasks(pool, start.thread, now);
        spin_policy_update(&policy);
    }
}

// ---- the pool ----------------------------------------------------------------------

int thread_pool_create(int n_threads, thread_pool** out) {
    *out = NULL;
    if (n_threads <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = online > 0 ? (int)(online < THREAD_POOL_MAX_THREADS ? online : THREAD_POOL_MAX_THREADS) : 1;
    }
    if (n_threads > THREAD_POOL_MAX_THREADS) return EINVAL;
    thread_pool* pool = aligned_alloc(_Alignof(thread_pool), sizeof(thread_pool)); // a multiple of 64 bytes
    if (!pool) return ENOMEM;
    memset(pool, 0, sizeof *pool);
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->work_posted, NULL);
    pthread_cond_init(&pool->work_done, NULL);
    atomic_init(&pool->fn, NULL);
    atomic_init(&pool->ctx, NULL);
    atomic_init(&pool->first_task, 0);
    atomic_init(&pool->generation, 0u);
    atomic_init(&pool->tasks_done, 0);
    atomic_init(&pool->caller_sleeping, false);
    atomic_init(&pool->workers_sleeping, 0);
    pool->spans = aligned_alloc(_Alignof(task_span), (size_t)n_threads * sizeof *pool->spans);
    if (!pool->spans) {
        thread_pool_free(pool);
        return ENOMEM;
    }
    for (int t = 0; t < n_threads; t++)
        atomic_init(&pool->spans[t].word, 0ull);
    if (n_threads > 1) {
        pool->workers = calloc((size_t)(n_threads - 1), sizeof *pool->workers);
        if (!pool->workers) {
            thread_pool_free(pool);
            return ENOMEM;
        }
    }
    for (int t = 1; t < n_threads; t++) {
        worker_start* start = malloc(sizeof *start);
        if (!start) {
            thread_pool_free(pool);
            return ENOMEM;
        }
        start->pool = pool;
        start->thread = t;
        int status = pthread_create(&pool->workers[t - 1], NULL, worker_main, start);
        if (status != 0) {
            free(start);
            thread_pool_free(pool);
            return status;
        }
        pool->n_started++;
    }
    *out = pool;
    return 0;
}

void thread_pool_free(thread_pool* pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->lock);
    pool->stopping = true;
    pthread_cond_broadcast(&pool->work_posted);
    pthread_mutex_unlock(&pool->lock);
    for (int t = 0; t < pool->n_started; t++)
        pthread_join(pool->workers[t], NULL);
    pthread_cond_destroy(&pool->work_done);
    pthread_cond_destroy(&pool->work_posted);
    pthread_mutex_destroy(&pool->lock);
    free(pool->workers);
    free(pool->spans);
    free(pool);
}

int thread_pool_size(const thread_pool* pool) { return pool ? pool->n_threads : 1; }

// The caller's poll policy lives with the pool's one caller at a time;
// kept per calling thread so that two pools used by one thread share it.
static _Thread_local spin_policy caller_policy;
static _Thread_local bool caller_policy_started;

// Posts tasks [first_task, first_task + n_tasks) and runs them with the workers.
static void run_post(thread_pool* pool, int first_task, int n_tasks, thread_pool_task_fn fn, void* ctx) {
    if (!caller_policy_started) {
        caller_policy = spin_policy_start();
        caller_policy_started = true;
    }
    unsigned generation = atomic_load_explicit(&pool->generation, memory_order_relaxed) + 1u;
    atomic_store_explicit(&pool->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&pool->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&pool->first_task, first_task, memory_order_relaxed);
    atomic_store_explicit(&pool->tasks_done, 0, memory_order_relaxed);
    // Thread t starts with tasks [t * n / T, (t + 1) * n / T).
    for (int t = 0; t < pool->n_threads; t++)
        atomic_store_explicit(&pool->spans[t].word,
                              pack_span((unsigned)((long long)n_tasks * t / pool->n_threads),
                                        (unsigned)((long long)n_tasks * (t + 1) / pool->n_threads), generation),
                              memory_order_relaxed);
    atomic_store(&pool->generation, generation); // publishes everything above
    if (atomic_load(&pool->workers_sleeping) > 0) {
        pthread_mutex_lock(&pool->lock);
        pthread_cond_broadcast(&pool->work_posted);
        pthread_mutex_unlock(&pool->lock);
    }

    run_tasks(pool, 0, generation);

    // Only tasks still in progress are waited for.
    for (int spin = 0; atomic_load(&pool->tasks_done) < n_tasks && spin < caller_policy.spin_rounds; spin++)
        cpu_relax();
    if (atomic_load(&pool->tasks_done) < n_tasks) {
        pthread_mutex_lock(&pool->lock);
        atomic_store(&pool->caller_sleeping, true);
        while (atomic_load(&pool->tasks_done) < n_tasks)
            pthread_cond_wait(&pool->work_done, &pool->lock);
        atomic_store(&pool->caller_sleeping, false);
        pthread_mutex_unlock(&pool->lock);
    }
    spin_policy_update(&caller_policy);
}

void thread_pool_run(thread_pool* pool, int n_tasks, thread_pool_task_fn fn, void* ctx) {
    if (n_tasks <= 0) return;
    if (!pool || pool->n_threads == 1 || n_tasks == 1) { // nothing to share: no handshake
        for (int task = 0; task < n_tasks; task++)
            fn(ctx, task, 0);
        return;
    }
    for (int first = 0; first < n_tasks; first += SPAN_MAX_TASKS)
        run_post(pool, first, n_tasks - first < SPAN_MAX_TASKS ? n_tasks - first : SPAN_MAX_TASKS, fn, ctx);
}
