#include "kernels/cpu/thread_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

// How long a thread polls before it sleeps: about 2000 pause instructions,
// i.e. roughly 10-100 us depending on the CPU's pause latency. Long enough to
// catch the next matmul of the same decode step, short enough that an idle
// pool sleeps almost at once.
#define SPIN_ROUNDS 2000

// The tasks one thread starts with: [front, back) of the task numbers,
// packed in one word (front in the low 32 bits) so that the owner taking
// from the front and a thief taking from the back agree by one CAS. Each
// span on its own cache line: the owner's CAS touches no other thread's line.
typedef struct task_span {
    _Alignas(64) _Atomic unsigned long long front_back;
} task_span;

struct thread_pool {
    int n_threads;      // threads per run, the caller included
    pthread_t* workers; // (n_threads - 1) worker threads
    int n_started;      // workers actually running (create may fail midway)

    pthread_mutex_t lock;       // guards the sleeping side of the handshakes
    pthread_cond_t work_posted; // workers sleep here between runs
    pthread_cond_t work_done;   // the caller sleeps here until workers finish
    bool stopping;              // under lock: free() asks workers to exit

    // The current run. Written by the caller before `generation` is bumped
    // and read by workers after they see the new generation, so the atomic
    // bump orders them (and the mutex does the same for sleepers).
    thread_pool_task_fn fn;
    void* ctx;
    atomic_uint generation;    // runs posted so far
    atomic_int workers_active; // workers not yet finished with this run
    task_span* spans;          // (n_threads) the run's tasks, a contiguous span per thread
};

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static unsigned long long pack_span(unsigned front, unsigned back) {
    return (unsigned long long)front | (unsigned long long)back << 32;
}

// Takes the next task of `span`: its front (owner) or its back (thief).
// Returns -1 when the span is empty.
static int take_task(task_span* span, bool from_back) {
    unsigned long long now = atomic_load(&span->front_back);
    for (;;) {
        unsigned front = (unsigned)now, back = (unsigned)(now >> 32);
        if (front >= back) return -1;
        unsigned long long next = from_back ? pack_span(front, back - 1) : pack_span(front + 1, back);
        if (atomic_compare_exchange_weak(&span->front_back, &now, next)) return from_back ? (int)back - 1 : (int)front;
    }
}

// Runs the thread's own span front to back (a kernel's chunks in memory
// order: one long stream for the hardware prefetcher), then takes tasks
// from the back of the other spans until none are left: a thread that
// finishes early shares the rest instead of waiting.
static void run_tasks(thread_pool* pool, int thread) {
    for (int task; (task = take_task(&pool->spans[thread], false)) >= 0;)
        pool->fn(pool->ctx, task, thread);
    for (int k = 1; k < pool->n_threads; k++) {
        task_span* other = &pool->spans[(thread + k) % pool->n_threads];
        for (int task; (task = take_task(other, true)) >= 0;)
            pool->fn(pool->ctx, task, thread);
    }
}

typedef struct worker_start {
    thread_pool* pool;
    int thread; // 1 .. n_threads-1
} worker_start;

static void* worker_main(void* arg) {
    worker_start start = *(worker_start*)arg;
    free(arg);
    thread_pool* pool = start.pool;
    unsigned seen = 0; // generations this worker has run
    for (;;) {
        // Wait for generation != seen: spin a little, then sleep.
        unsigned now = atomic_load(&pool->generation);
        for (int spin = 0; now == seen && spin < SPIN_ROUNDS; spin++) {
            cpu_relax();
            now = atomic_load(&pool->generation);
        }
        if (now == seen) {
            pthread_mutex_lock(&pool->lock);
            while ((now = atomic_load(&pool->generation)) == seen && !pool->stopping)
                pthread_cond_wait(&pool->work_posted, &pool->lock);
            bool stop = pool->stopping && now == seen;
            pthread_mutex_unlock(&pool->lock);
            if (stop) return NULL;
        }
        seen = now;
        run_tasks(pool, start.thread);
        // The last worker out wakes the caller. Signalling under the lock
        // means the caller either saw workers_active == 0 before sleeping or
        // is already asleep when the signal comes: no lost wake-up.
        if (atomic_fetch_sub(&pool->workers_active, 1) == 1) {
            pthread_mutex_lock(&pool->lock);
            pthread_cond_signal(&pool->work_done);
            pthread_mutex_unlock(&pool->lock);
        }
    }
}

int thread_pool_create(int n_threads, thread_pool** out) {
    *out = NULL;
    if (n_threads <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = online > 0 ? (int)(online < THREAD_POOL_MAX_THREADS ? online : THREAD_POOL_MAX_THREADS) : 1;
    }
    if (n_threads > THREAD_POOL_MAX_THREADS) return EINVAL;
    thread_pool* pool = calloc(1, sizeof *pool);
    if (!pool) return ENOMEM;
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->work_posted, NULL);
    pthread_cond_init(&pool->work_done, NULL);
    atomic_init(&pool->generation, 0u);
    atomic_init(&pool->workers_active, 0);
    pool->spans = aligned_alloc(_Alignof(task_span), (size_t)n_threads * sizeof *pool->spans);
    if (!pool->spans) {
        thread_pool_free(pool);
        return ENOMEM;
    }
    for (int t = 0; t < n_threads; t++) atomic_init(&pool->spans[t].front_back, 0ull);
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

void thread_pool_run(thread_pool* pool, int n_tasks, thread_pool_task_fn fn, void* ctx) {
    if (n_tasks <= 0) return;
    if (!pool || pool->n_threads == 1 || n_tasks == 1) { // nothing to share: no handshake
        for (int task = 0; task < n_tasks; task++)
            fn(ctx, task, 0);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    // Thread t starts with tasks [t * n / T, (t + 1) * n / T).
    for (int t = 0; t < pool->n_threads; t++)
        atomic_store(&pool->spans[t].front_back,
                     pack_span((unsigned)((long long)n_tasks * t / pool->n_threads),
                               (unsigned)((long long)n_tasks * (t + 1) / pool->n_threads)));
    atomic_store(&pool->workers_active, pool->n_threads - 1);
    pthread_mutex_lock(&pool->lock); // post the run (sleeping workers hold no lock)
    atomic_fetch_add(&pool->generation, 1u);
    pthread_cond_broadcast(&pool->work_posted);
    pthread_mutex_unlock(&pool->lock);

    run_tasks(pool, 0);

    // Wait for the workers: they may still be inside their last task.
    for (int spin = 0; atomic_load(&pool->workers_active) > 0 && spin < SPIN_ROUNDS; spin++)
        cpu_relax();
    if (atomic_load(&pool->workers_active) > 0) {
        pthread_mutex_lock(&pool->lock);
        while (atomic_load(&pool->workers_active) > 0)
            pthread_cond_wait(&pool->work_done, &pool->lock);
        pthread_mutex_unlock(&pool->lock);
    }
}
