// thread_pool's contract: every task runs exactly once per run, whatever
// the pool size and task count (past one post's 2^20 tasks too), with the
// thread numbers in range; and a run never waits for a worker that holds no
// task: with a worker stopped between runs (as a descheduled thread is),
// the caller does every task itself and returns.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/thread_pool.h"

typedef struct count_job {
    atomic_int* runs;    // (n_tasks) how often each task ran
    atomic_int* threads; // (pool size) tasks per thread
    int n_threads;
    atomic_int bad_thread; // a thread number out of range was seen
} count_job;

static void count_task(void* ctx, int task, int thread) {
    count_job* job = ctx;
    atomic_fetch_add_explicit(&job->runs[task], 1, memory_order_relaxed);
    if (thread < 0 || thread >= job->n_threads)
        atomic_store(&job->bad_thread, 1);
    else
        atomic_fetch_add_explicit(&job->threads[thread], 1, memory_order_relaxed);
}

// Runs n_tasks on pool and checks each ran exactly once; returns the tasks
// thread 0 (the caller) ran.
static int run_and_check(thread_pool* pool, int n_tasks) {
    count_job job = {calloc((size_t)n_tasks, sizeof(atomic_int)), calloc(THREAD_POOL_MAX_THREADS, sizeof(atomic_int)),
                     thread_pool_size(pool), 0};
    assert_non_null(job.runs);
    assert_non_null(job.threads);
    thread_pool_run(pool, n_tasks, count_task, &job);
    for (int t = 0; t < n_tasks; t++)
        if (atomic_load(&job.runs[t]) != 1)
            fail_msg("%d threads, %d tasks: task %d ran %d times", thread_pool_size(pool), n_tasks, t,
                     atomic_load(&job.runs[t]));
    assert_int_equal(atomic_load(&job.bad_thread), 0);
    int by_caller = atomic_load(&job.threads[0]);
    free(job.runs);
    free(job.threads);
    return by_caller;
}

static void test_every_task_once(void** state) {
    (void)state;
    const int sizes[] = {1, 2, 3, 8}; // 8 threads on a 2-core machine: more threads than cores
    const int task_counts[] = {1, 2, 3, 7, 64, 1000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        thread_pool* pool;
        assert_int_equal(thread_pool_create(sizes[s], &pool), 0);
        assert_int_equal(thread_pool_size(pool), sizes[s]);
        // Many runs back to back: a worker still finishing one run's
        // search for tasks while the next is posted must take none of it twice.
        for (int repeat = 0; repeat < 300; repeat++)
            for (size_t k = 0; k < sizeof task_counts / sizeof task_counts[0]; k++)
                run_and_check(pool, task_counts[k]);
        thread_pool_free(pool);
    }
    assert_int_equal(run_and_check(NULL, 5), 5); // no pool: the caller runs everything
}

static void test_more_tasks_than_one_post(void** state) {
    (void)state;
    thread_pool* pool;
    assert_int_equal(thread_pool_create(2, &pool), 0);
    run_and_check(pool, (1 << 20) + 5); // one post holds 2^20 - 1 tasks
    thread_pool_free(pool);
    assert_int_equal(thread_pool_create(THREAD_POOL_MAX_THREADS + 1, &pool), EINVAL);
    assert_null(pool);
}

// ---- a worker stopped between runs ------------------------------------------------

static sem_t worker_stopped, worker_release;

// Runs in the worker that takes the signal: it stays here, outside any
// task, until the test releases it.
static void hold_worker(int signal_number) {
    (void)signal_number;
    sem_post(&worker_stopped);
    while (sem_wait(&worker_release) != 0 && errno == EINTR) {
    }
}

typedef struct caller_run {
    thread_pool* pool;
    int by_caller; // tasks thread 0 ran
    sem_t finished;
} caller_run;

static void* call_run(void* arg) {
    caller_run* run = arg;
    run->by_caller = run_and_check(run->pool, 200);
    sem_post(&run->finished);
    return NULL;
}

static void test_run_does_not_wait_for_a_stopped_worker(void** state) {
    (void)state;
    assert_int_equal(sem_init(&worker_stopped, 0, 0), 0);
    assert_int_equal(sem_init(&worker_release, 0, 0), 0);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = hold_worker;
    sigemptyset(&action.sa_mask);
    assert_int_equal(sigaction(SIGUSR1, &action, NULL), 0);

    // The worker is started with SIGUSR1 open; then this thread (and the
    // caller thread it starts, which inherits the mask) blocks it, so the
    // process-directed signal can only land in the worker.
    thread_pool* pool;
    assert_int_equal(thread_pool_create(2, &pool), 0);
    run_and_check(pool, 64); // the worker has run and is now between runs
    sigset_t usr1, previous;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    assert_int_equal(pthread_sigmask(SIG_BLOCK, &usr1, &previous), 0);
    assert_int_equal(kill(getpid(), SIGUSR1), 0);
    while (sem_wait(&worker_stopped) != 0 && errno == EINTR) {
    }

    caller_run run = {pool, 0, {{0}}};
    assert_int_equal(sem_init(&run.finished, 0, 0), 0);
    pthread_t caller;
    assert_int_equal(pthread_create(&caller, NULL, call_run, &run), 0);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 10; // the 200 tasks take microseconds
    int waited = sem_timedwait(&run.finished, &deadline);
    sem_post(&worker_release); // let the worker go either way, so the test can end
    assert_int_equal(pthread_join(caller, NULL), 0);
    if (waited != 0) fail_msg("the run waited for a stopped worker that held no task");
    assert_int_equal(run.by_caller, 200); // the caller took the stopped worker's span too
    run_and_check(pool, 64);              // and the released worker rejoins later runs
    thread_pool_free(pool);
    assert_int_equal(pthread_sigmask(SIG_SETMASK, &previous, NULL), 0);
    sem_destroy(&run.finished);
    sem_destroy(&worker_stopped);
    sem_destroy(&worker_release);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_task_once),
        cmocka_unit_test(test_more_tasks_than_one_post),
        cmocka_unit_test(test_run_does_not_wait_for_a_stopped_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
