/*
 * pool.h — tern's thread pool: a fixed set of workers that run one task function at a time, each
 * thread seeing (ith, nth). The calling thread is ith 0, so a pool of n threads starts n-1
 * workers. Work is split by the task itself (ith/nth), never by a queue, so runs are
 * deterministic. Workers spin briefly between tasks (decode dispatches ~100 tasks per token) and
 * then sleep on a condition variable.
 *
 * Not re-entrant: one tn_pool_run at a time per pool (the owner context serialises calls).
 */
#ifndef TN_CORE_POOL_H
#define TN_CORE_POOL_H

#include <stddef.h>
#include "core/base.h"

typedef struct tn_pool tn_pool;
typedef void (*tn_task_fn)(void *arg, int ith, int nth);

tern_status tn_pool_create(int n_threads, tn_pool **out);
/* Drops a reference (tn_pool_create's or tn_pool_retain's); the last one stops the workers. */
void tn_pool_free(tn_pool *p);
/* Another reference to p, for a second owner that runs tasks on it in turn with the first. */
tn_pool *tn_pool_retain(tn_pool *p);
int tn_pool_n(const tn_pool *p);
/* Runs fn(arg, ith, nth) on every thread and returns when all have finished. */
void tn_pool_run(tn_pool *p, tn_task_fn fn, void *arg);
/* Whether tn_pool_run records the caller's wait for the workers as a "pool_join" barrier span
 * (default on). Training turns it off: its op spans already time the whole pool (train/tmodel.c). */
void tn_pool_trace_join(tn_pool *p, bool on);
/* Waits until all nth threads of the current task arrive. Only valid inside a task. */
void tn_pool_barrier(tn_pool *p);
/* The same, and while this thread waits it prefetches [pf, pf + n) into its L2, a few cache lines
 * per spin, in order, until the others arrive (no prefetch if it arrives last): a thread that
 * finished its share early warms the start of its next one, so memory is not idle while it
 * waits. pf may be NULL (n ignored). */
void tn_pool_barrier_pf(tn_pool *p, const void *pf, size_t n);

/* The [start, end) slice of n items for thread ith of nth (contiguous, sizes differ by <= 1
 * after rounding to multiples of `align`). */
static inline void tn_split(int64_t n, int ith, int nth, int64_t align, int64_t *start, int64_t *end) {
    int64_t blocks = (n + align - 1) / align;
    int64_t per = blocks / nth, rem = blocks % nth;
    int64_t b0 = ith * per + (ith < rem ? ith : rem);
    int64_t b1 = b0 + per + (ith < rem ? 1 : 0);
    *start = TN_MIN(b0 * align, n);
    *end = TN_MIN(b1 * align, n);
}

#endif
