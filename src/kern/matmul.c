/*
 * matmul.c — see matmul.h. Work split: output rows in contiguous, 32-aligned chunks per thread
 * (the interleaved load-time layouts have groups of 16 and 32 rows)
 * (each weight byte is read by exactly one thread: decode is bandwidth-bound); within a chunk,
 * blocks of TN_MM_RB rows × TN_MM_CB tokens keep the weight block in L2 while it is reused.
 */
#include "kern/matmul.h"

#define TN_MM_RB 64 /* weight rows per block  */
#define TN_MM_CB 64 /* tokens per block       */

size_t tn_matmul_xq_size(tn_dtype wt, int64_t k, int64_t n) {
    tn_dtype vt = tn_dtype_get(wt)->vec_dot_type;
    return tn_dtype_row_size(vt, k) * (size_t)n;
}

void tn_matmul_quantize_task(tn_pool *pool, int ith, int nth, const tn_kern_table *kt, tn_dtype wt, const float *x,
                             int64_t ldx, int64_t k, int64_t n, void *xq) {
    tn_dtype vt = tn_dtype_get(wt)->vec_dot_type;
    if (vt == TN_F32 && ldx == k && x == xq) return;
    size_t rb = tn_dtype_row_size(vt, k);
    tn_from_float_fn q = kt->slot[vt].from_float;
    int64_t r0, r1;
    tn_split(n, ith, nth, 1, &r0, &r1);
    for (int64_t j = r0; j < r1; j++) q(x + j * ldx, (uint8_t *)xq + (size_t)j * rb, k);
    tn_pool_barrier(pool);
}

void tn_matmul_rows(int64_t m, int ith, int nth, int64_t *r0, int64_t *r1) { tn_split(m, ith, nth, 32, r0, r1); }

void tn_matmul_range(const tn_kern_table *kt, tn_dtype wt, const void *w, int64_t k, const void *xq, int64_t n, float *y,
                     int64_t ldy, int64_t r0, int64_t r1) {
    if (r1 <= r0) return;
    const size_t w_rb = tn_dtype_row_size(wt, k), x_rb = tn_dtype_row_size(tn_dtype_get(wt)->vec_dot_type, k);
    kt->slot[wt].gemm(k, r1 - r0, n, (const uint8_t *)w + (size_t)r0 * w_rb, w_rb, xq, x_rb, y + r0, ldy);
}

/* Rows of a one-token matmul left for the claimed tail chunks: ~1/8, 32-aligned. */
static int64_t tn_share_tail(int64_t m) { return TN_MIN(m, (m / 8 + 31) / 32 * 32); }

void tn_matmul_share_head(int64_t m, int ith, int nth, int64_t *r0, int64_t *r1) {
    tn_split(m - tn_share_tail(m), ith, nth, 32, r0, r1);
}

bool tn_matmul_share(atomic_int *next, int64_t m, int ith, int nth, int *step, int64_t *r0, int64_t *r1) {
    const int64_t tail = tn_share_tail(m), head = m - tail;
    if (*step == 0) {
        *step = 1;
        tn_matmul_share_head(m, ith, nth, r0, r1);
        if (*r1 > *r0) return true;
    }
    const int64_t C = TN_MAX(32, (tail / (4 * (int64_t)nth) + 31) / 32 * 32); /* ~4 tail chunks per thread */
    const int64_t i = atomic_fetch_add_explicit(next, 1, memory_order_relaxed);
    if (i * C >= tail) return false;
    *r0 = head + i * C;
    *r1 = TN_MIN(m, *r0 + C);
    return true;
}

void tn_matmul_compute_task(int ith, int nth, const tn_kern_table *kt, tn_dtype wt, const void *w, int64_t m, int64_t k,
                            const void *xq, int64_t n, float *y, int64_t ldy) {
    tn_dtype vt = tn_dtype_get(wt)->vec_dot_type;
    size_t w_rb = tn_dtype_row_size(wt, k), x_rb = tn_dtype_row_size(vt, k);
    tn_gemm_fn gemm = kt->slot[wt].gemm;
    int64_t r0, r1;
    tn_matmul_rows(m, ith, nth, &r0, &r1);
    if (n == 1 || n <= kt->slot[wt].gemm_nrow) { /* decode, small batches: one pass over this thread's rows */
        tn_matmul_range(kt, wt, w, k, xq, n, y, ldy, r0, r1);
        return;
    }
    for (int64_t c0 = 0; c0 < n; c0 += TN_MM_CB) {
        int64_t nc = TN_MIN(TN_MM_CB, n - c0);
        for (int64_t i0 = r0; i0 < r1; i0 += TN_MM_RB) {
            int64_t nr = TN_MIN(TN_MM_RB, r1 - i0);
            gemm(k, nr, nc, (const uint8_t *)w + (size_t)i0 * w_rb, w_rb, (const uint8_t *)xq + (size_t)c0 * x_rb, x_rb,
                 y + c0 * ldy + i0, ldy);
        }
    }
}
