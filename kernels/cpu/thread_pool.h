// thread_pool: a fixed set of worker threads that run numbered tasks.
//
// thread_pool_run(pool, n_tasks, fn, ctx) calls fn(ctx, task, thread) once
// for every task in 0 .. n_tasks-1 and returns when all have finished. The
// calling thread works too (it is thread 0; workers are 1 .. n_threads-1),
// so a pool of one thread is the caller alone and runs every task inline.
// Each thread starts with a contiguous span of the task numbers (thread t:
// [t * n / T, (t + 1) * n / T)) and runs it in order; a thread whose span
// is done takes tasks from the back of the others' spans. So which thread
// runs a task varies from run to run: a task's result must depend only on
// its number, never on `thread` (use `thread` for scratch space).
//
// run() returns when every task has finished; it never waits for a worker
// that took no task (one descheduled by another process, say): the others
// take its span. Idle threads poll for a few tens of microseconds (a decode
// step's runs come about that far apart, and waking a sleeping thread costs
// about as much), and about a microsecond once the thread has been
// preempted lately (another process wants the core), then sleep on a
// condition variable, so an idle pool burns no CPU.
//
// One run at a time per pool: run() must not be called from two threads at
// once, nor from inside a task. Kernels report no errors of their own, so
// create() returns an errno value for the caller to describe.
#ifndef SERVELAB_THREAD_POOL_H
#define SERVELAB_THREAD_POOL_H

typedef struct thread_pool thread_pool;

// task: 0 .. n_tasks-1; thread: 0 (the caller) .. thread_pool_size()-1.
typedef void (*thread_pool_task_fn)(void* ctx, int task, int thread);

// Largest pool create() accepts.
#define THREAD_POOL_MAX_THREADS 256

// Starts n_threads - 1 workers (n_threads <= 0: one per online CPU) and
// stores the pool in *out. Returns 0, or EINVAL (n_threads above the
// maximum), ENOMEM, or pthread_create's error (e.g. EAGAIN); then *out is NULL.
int thread_pool_create(int n_threads, thread_pool** out);

// Stops and joins the workers; NULL is allowed.
void thread_pool_free(thread_pool* pool);

// Threads taking part in a run, the caller included (1 for a NULL pool).
int thread_pool_size(const thread_pool* pool);

// Runs fn(ctx, task, thread) for every task and waits for all of them.
// pool may be NULL (runs inline); n_tasks <= 0 does nothing.
void thread_pool_run(thread_pool* pool, int n_tasks, thread_pool_task_fn fn, void* ctx);

#endif
