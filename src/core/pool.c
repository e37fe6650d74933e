/*
 * pool.c — see pool.h. A generation counter announces each task; workers spin on it for a while,
 * then sleep. Completion is a countdown the caller spins on. The barrier is sense-reversing.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "core/pool.h"
#include "core/trace.h"

#if defined(__x86_64__) || defined(__i386__)
#define TN_PAUSE() __builtin_ia32_pause()
#else
#define TN_PAUSE() ((void)0)
#endif

/* Waits spin briefly (a barrier on an idle machine completes in microseconds), then yield the
 * core: on an oversubscribed machine the thread being waited for may not be running, and
 * spinning for milliseconds would only steal its time slice. Idle workers then sleep. */
#define TN_SPIN_ITERS 4096
#define TN_YIELD_ITERS 2000

typedef struct tn_worker {
    tn_pool *pool;
    int ith;
    pthread_t thread;
} tn_worker;

struct tn_pool {
    int n;
    tn_worker *workers;
    _Alignas(64) atomic_uint gen;     /* bumped once per task                   */
    _Alignas(64) atomic_int pending;  /* workers still running the current task */
    _Alignas(64) atomic_int barrier_count;
    atomic_uint barrier_sense;
    atomic_bool stop;
    atomic_int sleepers;
    atomic_int refs; /* owners (tn_pool_retain); the last tn_pool_free stops the workers */
    bool quiet_join; /* no pool_join spans (tn_pool_trace_join) */
    tn_task_fn fn;
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *tn_worker_main(void *vp) {
    tn_worker *w = vp;
    tn_pool *p = w->pool;
    unsigned seen = 0; /* gen starts at 0; a task announced before this thread ran is still seen */
    tn_trace_thread_name("pool %d", w->ith);
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < TN_SPIN_ITERS) { TN_PAUSE(); continue; }
            if (spins < TN_SPIN_ITERS + TN_YIELD_ITERS) { sched_yield(); continue; }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        p->fn(p->arg, w->ith, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

static void tn_pool_announce(tn_pool *p) {
    atomic_fetch_add(&p->gen, 1); /* seq_cst: ordered before the sleepers check */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

tern_status tn_pool_create(int n_threads, tn_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) return tn_err(TERN_ERR_INVALID_ARG, "pool: thread count %d outside 1..1024", n_threads);
    tn_pool *p = tn_calloc(1, sizeof *p);
    if (!p) return tn_err(TERN_ERR_NOMEM, "pool: out of memory");
    p->n = n_threads;
    atomic_init(&p->refs, 1);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->workers = tn_calloc((size_t)n_threads, sizeof *p->workers);
        if (!p->workers) {
            tn_pool_free(p);
            return tn_err(TERN_ERR_NOMEM, "pool: out of memory");
        }
        for (int i = 1; i < n_threads; i++) {
            p->workers[i].pool = p;
            p->workers[i].ith = i;
            if (pthread_create(&p->workers[i].thread, NULL, tn_worker_main, &p->workers[i]) != 0) {
                p->n = i; /* join the ones started */
                tn_pool_free(p);
                return tn_err(TERN_ERR_NOMEM, "pool: could not start thread %d of %d", i, n_threads);
            }
        }
    }
    *out = p;
    return TERN_OK;
}

tn_pool *tn_pool_retain(tn_pool *p) {
    if (p) atomic_fetch_add(&p->refs, 1);
    return p;
}

void tn_pool_free(tn_pool *p) {
    if (!p || atomic_fetch_sub(&p->refs, 1) > 1) return;
    if (p->workers) {
        atomic_store(&p->stop, true);
        tn_pool_announce(p);
        for (int i = 1; i < p->n; i++) pthread_join(p->workers[i].thread, NULL);
        tn_free(p->workers);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    tn_free(p);
}

int tn_pool_n(const tn_pool *p) { return p ? p->n : 1; }

void tn_pool_run(tn_pool *p, tn_task_fn fn, void *arg) {
    if (!p || p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->pending, p->n - 1);
    tn_pool_announce(p);
    fn(arg, 0, p->n);
    const bool traced = TN_TRACE_ON() && !p->quiet_join;
    if (traced) tn_trace_rec(TN_PH_BEGIN, TN_TK_BARRIER, "pool_join", -1, 0, 0, 0, 0, 0); /* the caller waits for the workers */
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        if (++spins < TN_SPIN_ITERS) TN_PAUSE();
        else sched_yield();
    }
    if (traced) tn_trace_rec(TN_PH_END, TN_TK_BARRIER, "pool_join", -1, 0, 0, 0, 0, 0);
}

void tn_pool_trace_join(tn_pool *p, bool on) {
    if (p) p->quiet_join = !on;
}

void tn_pool_barrier_pf(tn_pool *p, const void *pf, size_t n) {
    if (!p || p->n == 1) return;
    TN_SPAN_B(TN_TK_BARRIER, "barrier", -1, 0, 0, 0, 0); /* idle time, visible per thread */
    unsigned sense = atomic_load(&p->barrier_sense);
    if (atomic_fetch_add(&p->barrier_count, 1) == p->n - 1) {
        atomic_store(&p->barrier_count, 0);
        atomic_store_explicit(&p->barrier_sense, sense + 1, memory_order_release);
        TN_SPAN_E(TN_TK_BARRIER, "barrier", -1, 0, 0);
        return;
    }
    const char *b = pf;
    size_t o = 0;
    if (!b) n = 0;
    int spins = 0;
    while (atomic_load_explicit(&p->barrier_sense, memory_order_acquire) == sense) {
        if (o < n) { /* two lines per check: prefetcht1 (L2); blocks only while the misses queue */
            __builtin_prefetch(b + o, 0, 2);
            __builtin_prefetch(b + o + 64, 0, 2);
            o += 128;
        } else if (++spins < TN_SPIN_ITERS) {
            TN_PAUSE();
        } else {
            sched_yield();
        }
    }
    TN_SPAN_E(TN_TK_BARRIER, "barrier", -1, 0, 0);
}

void tn_pool_barrier(tn_pool *p) { tn_pool_barrier_pf(p, NULL, 0); }
