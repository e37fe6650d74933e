/*
 * test_gemv.c — the avx512 decode kernels (src/kern/avx512/gemv.c) through the table's gemm slot
 * at n == 1, against the scalar table, for q4_0, q8_0, q4_K and q6_K; and the wrapper: n > 1 must
 * give exactly what the previous (tiled) avx512 gemm gives.
 *
 * Sizes: k = one block, a few blocks, a prime number of blocks, 4096 (and for the 32-blocks a
 * count that is not a multiple of the kernels' 16-block step plus one that is large enough to
 * use the heap scratch); m = 1, 7, 8, 9, 64, 257; padded, unaligned row strides; ldy > m with
 * a canary after the result.
 *
 * Tolerance, as in tests/kern/test_kern_parity.c: both sides sum the same exact integer block
 * sums times float scale products in a different order, so the difference is bounded by
 * 8 * sqrt(k + 16) * 2^-24 * S, S = sum over blocks of |block integer terms| * |scales|; we use
 * the sum of |w_l| |x_l| over the dequantized elements (with the min/offset part for q4_K),
 * which bounds every partial sum.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/test_rng.h"
#include "common/test_terms.h"
#include "core/fp16.h"
#include "kern/avx2/kernels.h"
#include "kern/avx512/kernels.h"
#include "kern/kern.h"
#include "quant/blocks.h"
#include "quant/quant.h"


/* Weight row: quantized random floats, or (raw) random bytes with small finite fp16 scales. */
static void make_row(tn_dtype t, int64_t k, uint8_t *row, int raw) {
    const tn_dtype_traits *tr = tn_dtype_get(t);
    if (!raw || t == TN_F16) { /* random bytes are no valid f16 row (NaN, Inf): always real values */
        float *f = malloc((size_t)k * sizeof(float));
        fill_floats(f, k);
        assert_true(tn_quantize_row_ref(t, f, row, k));
        free(f);
        return;
    }
    const size_t rb = tn_dtype_row_size(t, k);
    for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)rng_u64();
    int off[2] = {-1, -1};
    switch (t) {
    case TN_Q4_0: off[0] = offsetof(block_q4_0, d); break;
    case TN_Q8_0: off[0] = offsetof(block_q8_0, d); break;
    case TN_Q4_K: off[0] = offsetof(block_q4_K, d), off[1] = offsetof(block_q4_K, dmin); break;
    case TN_Q6_K: off[0] = offsetof(block_q6_K, d); break;
    default: break;
    }
    for (int64_t b = 0; b < k / tr->blck_size; b++)
        for (int f = 0; f < 2 && off[f] >= 0; f++) {
            const tn_fp16 h = tn_fp32_to_fp16(rng_uniform() * 0.05f);
            memcpy(row + (size_t)b * tr->type_size + off[f], &h, 2);
        }
}

static double tol_of(int64_t k, double S) { return 8.0 * sqrt((double)k + 16.0) * ldexp(1.0, -24) * S + 1e-30; }

static const tn_dtype types[] = {TN_Q4_0, TN_Q8_0, TN_Q4_K, TN_Q6_K, TN_F16};
/* the kernels (called directly: q8_0's is not installed in the table) */
#define TN_DECL_GEMV(name)                                                                                             \
    void name(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x, size_t x_rb, float *y,       \
              int64_t ldy);
TN_DECL_GEMV(tn_k_gemv_q4_0_q8_0__avx512)
TN_DECL_GEMV(tn_k_gemv_q8_0_q8_0__avx512)
TN_DECL_GEMV(tn_k_gemv_q4_K_q8_K__avx512)
TN_DECL_GEMV(tn_k_gemv_q6_K_q8_K__avx512)
TN_DECL_GEMV(tn_k_gemv_f16_f16__avx512)
static const tn_gemm_fn gemv[] = {tn_k_gemv_q4_0_q8_0__avx512, tn_k_gemv_q8_0_q8_0__avx512, tn_k_gemv_q4_K_q8_K__avx512,
                                  tn_k_gemv_q6_K_q8_K__avx512, tn_k_gemv_f16_f16__avx512};
/* types whose table slot is wrapped (n == 1 -> gemv) */
static const int wrapped[] = {1, 1, 1, 1, 1}; /* every type above uses its row kernel for n == 1 */
static const int64_t ms[] = {1, 7, 8, 9, 64, 257};

static int have_avx512(void) {
    const tn_kern_table *t = tn_kern_at(TN_ISA_AVX512);
    const tn_cpu *c = tn_cpu_get();
    if (!t || !c->avx512vnni || !c->avx512vbmi) {
        printf("no avx512 vnni/vbmi: nothing to test\n");
        return 0;
    }
    return 1;
}

/* Row kernel (through the table for n up to the slot's gemm_nrow) vs the scalar gemm, n columns. */
static void check_one(size_t ti, int64_t k, int64_t m, int64_t n) {
    const tn_dtype wt = types[ti];
    const tn_kern_table *ref = tn_kern_at(TN_ISA_SCALAR), *opt = tn_kern_at(TN_ISA_AVX512);
    const tn_dtype at = tn_dtype_get(wt)->vec_dot_type;
    const size_t w_rb = tn_dtype_row_size(wt, k) + 64 + 4, x_rb = tn_dtype_row_size(at, k) + 4;
    const int64_t ldy = m + 3;
    uint8_t *w = calloc((size_t)m, w_rb), *x = calloc((size_t)n, x_rb);
    float *xf = malloc((size_t)k * sizeof(float));
    float *yr = malloc((size_t)(ldy * n) * sizeof(float)), *yo = malloc((size_t)(ldy * n) * sizeof(float));
    for (int64_t i = 0; i < m; i++) make_row(wt, k, w + (size_t)i * w_rb, (int)(i & 1));
    for (int64_t j = 0; j < n; j++) {
        fill_floats(xf, k);
        ref->slot[at].from_float(xf, x + (size_t)j * x_rb, k);
    }
    for (int64_t c = 0; c < ldy * n; c++) yr[c] = yo[c] = -12345.0f;
    ref->slot[wt].gemm(k, m, n, w, w_rb, x, x_rb, yr, ldy);
    (wrapped[ti] ? opt->slot[wt].gemm : gemv[ti])(k, m, n, w, w_rb, x, x_rb, yo, ldy);
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < ldy; i++) {
            const float o = yo[j * ldy + i], r = yr[j * ldy + i];
            if (i >= m) {
                if (o != -12345.0f)
                    fail_msg("%s k=%lld m=%lld n=%lld wrote outside at col %lld row %lld", tn_dtype_name(wt), (long long)k,
                             (long long)m, (long long)n, (long long)j, (long long)i);
                continue;
            }
            const double tol = tol_of(k, kq_abs_terms(wt, k, w + (size_t)i * w_rb, x + (size_t)j * x_rb));
            if (!(fabs((double)r - o) <= tol))
                fail_msg("gemv %s k=%lld m=%lld n=%lld col %lld row %lld: ref %.9g opt %.9g |diff| %.3g > tol %.3g",
                         tn_dtype_name(wt), (long long)k, (long long)m, (long long)n, (long long)j, (long long)i, r, o,
                         fabs((double)r - o), tol);
        }
    free(w), free(x), free(xf), free(yr), free(yo);
}

static void test_gemv_parity(void **state) {
    (void)state;
    if (!have_avx512()) return;
    int checks = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const tn_dtype wt = types[ti];
        const int64_t bs = tn_dtype_get(wt)->blck_size;
        /* 1, 3 blocks, 13 (prime), 16, 17, 37 (prime), k = 4096, and for 32-blocks 67 (prime)
         * and 1040 blocks (heap scratch) */
        int64_t ks[9] = {bs, 3 * bs, 13 * bs, 16 * bs, 17 * bs, 37 * bs, 4096, 0, 0};
        if (bs == 32) ks[7] = 67 * bs, ks[8] = 1040 * bs;
        for (int ki = 0; ki < 9 && ks[ki]; ki++)
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                if (ks[ki] > 4096 && ms[mi] > 9) continue;
                check_one(ti, ks[ki], ms[mi], 1);
                checks++;
            }
        /* small batches through the row kernel (q4_0, q8_0, q6_K, f16: every n up to the slot's gemm_nrow) */
        const int32_t nrow = tn_kern_at(TN_ISA_AVX512)->slot[wt].gemm_nrow;
        static const int64_t nsm[] = {2, 3, 4, 5, 7, 8, 9, 16, 17, 32};
        for (size_t ni = 0; ni < sizeof nsm / sizeof nsm[0] && nsm[ni] <= nrow; ni++)
            for (int ki = 0; ki < 9 && ks[ki]; ki++) {
                const int64_t n = nsm[ni];
                if (ks[ki] > 4096 && n > 3) continue;
                check_one(ti, ks[ki], n == 8 ? 257 : 9, n);
                checks++;
            }
    }
    printf("gemv parity checks: %d\n", checks);
}

/* The wrapper: n <= gemm_nrow is the row kernel's result, larger n the previous avx512 gemm's, bit
 * for bit; q4_0 and q8_0 take every batch (gemm_nrow, 8 columns per pass), q6_K up to 32 columns
 * (8 per pass over each row), f16 up to 8 (one pass), q4_K decode only. */
static void test_gemv_wrapper_n_gt_1(void **state) {
    (void)state;
    if (!have_avx512()) return;
    const tn_kern_table *opt = tn_kern_at(TN_ISA_AVX512);
    /* f16: the avx512 level keeps the avx2 tile kernel for n > 1 */
    const tn_gemm_fn prev[] = {tn_k_gemm_q4_0_q8_0__avx512, tn_k_gemm_q8_0_q8_0__avx512, tn_k_gemm_q4_K_q8_K__avx512,
                               tn_k_gemm_q6_K_q8_K__avx512, tn_k_gemm_f16_f16__avx2};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const tn_dtype wt = types[ti], at = tn_dtype_get(wt)->vec_dot_type;
        if (!wrapped[ti]) {
            assert_true(opt->slot[wt].gemm == prev[ti]);
            continue;
        }
        assert_true(opt->slot[wt].gemm != prev[ti]); /* wrapped */
        assert_int_equal(opt->slot[wt].gemm_nrow,
                         (wt == TN_Q4_0 || wt == TN_Q8_0) ? (1 << 30) : wt == TN_Q6_K ? 32 : wt == TN_F16 ? 8 : 1);
        /* n <= gemm_nrow: the row kernel itself; beyond: the previous gemm */
        const int64_t k = 512, m = 37, ns[] = {2, 5, 9, 33};
        const size_t w_rb = tn_dtype_row_size(wt, k) + 4, x_rb = tn_dtype_row_size(at, k) + 4;
        for (size_t ni = 0; ni < 4; ni++) {
            const int64_t n = ns[ni], ldy = m + 1;
            uint8_t *w = calloc((size_t)m, w_rb), *x = calloc((size_t)n, x_rb);
            float *xf = malloc((size_t)k * sizeof(float));
            float *ya = malloc((size_t)(n * ldy) * sizeof(float)), *yb = malloc((size_t)(n * ldy) * sizeof(float));
            for (int64_t i = 0; i < m; i++) make_row(wt, k, w + (size_t)i * w_rb, (int)(i & 1));
            for (int64_t j = 0; j < n; j++) {
                fill_floats(xf, k);
                opt->slot[at].from_float(xf, x + (size_t)j * x_rb, k);
            }
            for (int64_t c = 0; c < n * ldy; c++) ya[c] = yb[c] = -1.0f;
            opt->slot[wt].gemm(k, m, n, w, w_rb, x, x_rb, ya, ldy);
            if (n <= opt->slot[wt].gemm_nrow) /* the row kernel, 8 columns per pass */
                for (int64_t j0 = 0; j0 < n; j0 += 8)
                    gemv[ti](k, m, n - j0 < 8 ? n - j0 : 8, w, w_rb, x + (size_t)j0 * x_rb, x_rb, yb + j0 * ldy, ldy);
            else
                prev[ti](k, m, n, w, w_rb, x, x_rb, yb, ldy);
            assert_memory_equal(ya, yb, (size_t)(n * ldy) * sizeof(float));
            free(w), free(x), free(xf), free(ya), free(yb);
        }
    }
}

int main(void) {
    /* the row-kernel wrapper alone: from 5 columns (12 for q6_K) the kernel table hands q4_K/q5_K/
     * q6_K batches to the on-the-fly interleaved gemm (gemm_ktile.c), which test_kern_parity checks
     * against the scalar reference */
    setenv("TERN_KTILE", "0", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemv_parity),
        cmocka_unit_test(test_gemv_wrapper_n_gt_1),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
