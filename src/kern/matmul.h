/*
 * matmul.h — the threaded matrix-product driver: Y[n][m] = X[n][k] · W^T for a weight matrix of
 * m rows of any supported type. It quantizes X into the weight type's vec_dot_type, then splits
 * W's rows across threads and calls the table's gemm tile kernel on blocks of rows × tokens.
 *
 * All functions named *_task are called by every thread of a pool task (ith of nth) and end with
 * a barrier where noted, so the caller's next step sees complete results.
 */
#ifndef TN_KERN_MATMUL_H
#define TN_KERN_MATMUL_H

#include <stdatomic.h>
#include <stdbool.h>

#include "core/pool.h"
#include "kern/kern.h"

/* Bytes of scratch needed to hold n rows of k activations in wt's vec_dot_type. */
size_t tn_matmul_xq_size(tn_dtype wt, int64_t k, int64_t n);

/* Quantizes X (n rows, stride ldx floats) into xq for weight type wt; ends with a barrier.
 * For f32 weights it is a no-op (the kernel reads X directly) — pass X as xq to compute. */
void tn_matmul_quantize_task(tn_pool *pool, int ith, int nth, const tn_kern_table *kt, tn_dtype wt, const float *x,
                             int64_t ldx, int64_t k, int64_t n, void *xq);

/* Y = Xq · W^T for W (m rows of k, type wt). Each thread computes rows [r0, r1) of the output for
 * all n tokens; no barrier at the end (the caller adds one when needed). If accumulate, adds into y
 * instead of storing (residual connections); tmp must then hold m*n floats. */
void tn_matmul_compute_task(int ith, int nth, const tn_kern_table *kt, tn_dtype wt, const void *w, int64_t m, int64_t k,
                            const void *xq, int64_t n, float *y, int64_t ldy);

/* Rows [r0, r1) of Y = Xq · W^T in one pass over those rows (the decode / small-batch path of
 * tn_matmul_compute_task), for callers that share rows out themselves; r0 a multiple of 32. */
void tn_matmul_range(const tn_kern_table *kt, tn_dtype wt, const void *w, int64_t k, const void *xq, int64_t n, float *y,
                     int64_t ldy, int64_t r0, int64_t r1);

/* Row sharing that adapts to threads running at different speeds (a shared machine's bandwidth
 * is not split evenly): call with *step = 0 until it returns false; each call gives the next
 * range [r0, r1) for thread ith. First the thread's static share of the first ~7/8 of the m
 * rows (one long sequential run for the kernel), then chunks of the rest claimed from the shared
 * counter *next (0 before any thread starts): a thread that is ahead takes more of them, so the
 * threads reach the next barrier together. Range starts are multiples of 32 when m is. */
bool tn_matmul_share(atomic_int *next, int64_t m, int ith, int nth, int *step, int64_t *r0, int64_t *r1);
/* The rows [r0, r1) of thread ith's static share (the first range tn_matmul_share hands it). */
void tn_matmul_share_head(int64_t m, int ith, int nth, int64_t *r0, int64_t *r1);

/* Rows [r0, r1) of the output that thread ith computes (for fused per-row epilogues). */
void tn_matmul_rows(int64_t m, int ith, int nth, int64_t *r0, int64_t *r1);

#endif
