/*
 * test_iq_gemm.c — the batched (prefill) kernels of the codebook i-quants (iq2_xxs, iq2_xs,
 * iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m; src/kern/avx2/iq2_gemm.inc) against two references:
 *
 *   1. the scalar vec_dot (kern/scalar/dot_iq2.c, ggml's generic arithmetic) cell by cell: within
 *      the parity bound of test_kern_parity (8 sqrt(k + 16) 2^-24 S, S = sum |w_l x_l| with the
 *      iq1 shift counted apart), and bit-equal where the build does not contract to FMA (gcc,
 *      -std=c11: both sides form the same exact integer sums and the same float expression);
 *   2. an independent double-precision dot of the dequantized rows (tn_dequantize_row, bit-exact
 *      with ggml's dequantize_row_<t>): within (8 sqrt(k + 16) + 8) 2^-24 S (the dequantized
 *      weights carry one more float rounding each).
 *
 * For every ISA level the CPU runs, every type, k = 1 and 3 blocks, m = 1 and 5 weight rows and
 * n = 1..33 and 70 activation rows (the kernel's groups of 4 and tiles of 64, with every tail),
 * padded strides, ldy > m (cells outside the m x n result must keep their canary). Weights are
 * random blocks (every grid index and sign; finite scales), activations the q8_K quantizer's
 * output of random floats, and for one pass raw random bytes (-128 included, which the
 * quantizer never makes).
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

#include "core/fp16.h"
#include "kern/kern.h"
#include "quant/blocks.h"
#include "quant/iq_grid.h"
#include "quant/quant.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rng_uniform(void) { return (float)((rng_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

static const tn_dtype iq_types[] = {TN_IQ2_XXS, TN_IQ2_XS, TN_IQ2_S, TN_IQ3_XXS, TN_IQ3_S, TN_IQ1_S, TN_IQ1_M};

/* One weight row of random blocks with a finite fp16 scale in (-0.05, 0.05). */
static void make_weights(tn_dtype t, int64_t k, uint8_t *row) {
    const size_t bs = tn_dtype_get(t)->type_size;
    for (size_t i = 0; i < tn_dtype_row_size(t, k); i++) row[i] = (uint8_t)rng_u64();
    for (int64_t b = 0; b < k / QK_K; b++) {
        uint8_t *blk = row + (size_t)b * bs;
        const tn_fp16 h = tn_fp32_to_fp16(rng_uniform() * 0.05f);
        if (t == TN_IQ1_M) { /* the scale lives in the top nibbles of the four scale words */
            uint8_t *sc = blk + offsetof(block_iq1_m, scales);
            for (int w = 0; w < 4; w++) sc[2 * w + 1] = (uint8_t)((sc[2 * w + 1] & 15) | ((h >> 4 * w) & 15) << 4);
        } else {
            memcpy(blk, &h, 2); /* d is the first field of the other six */
        }
    }
}

/* One q8_K activation row: the scalar quantizer on random floats, or raw random codes. */
static void make_acts(const tn_kern_table *ref, int64_t k, uint8_t *row, int raw) {
    if (!raw) {
        float *f = malloc((size_t)k * sizeof(float));
        for (int64_t i = 0; i < k; i++) f[i] = rng_uniform() * ldexpf(1.0f, (int)(rng_u64() % 9) - 4);
        ref->slot[TN_Q8_K].from_float(f, row, k);
        free(f);
        return;
    }
    block_q8_K *b = (block_q8_K *)row;
    for (int64_t i = 0; i < k / QK_K; i++) {
        b[i].d = rng_uniform() * 0.02f;
        for (int e = 0; e < QK_K; e++) b[i].qs[e] = (int8_t)(rng_u64() & 255);
        if (i == 0) b[i].qs[7] = -128;
        for (int g = 0; g < QK_K / 16; g++) b[i].bsums[g] = (int16_t)(rng_u64() & 0x7fff); /* unused by these kernels */
    }
}

/* S = sum over elements of |d_w d_x| (2 s + 1) |x| (|g| + |iq1 shift|) times the type's final
 * scale: bounds every partial sum either side forms. */
static double abs_terms(tn_dtype t, int64_t k, const uint8_t *w, const uint8_t *x) {
    const size_t bs = tn_dtype_get(t)->type_size;
    const block_q8_K *xb = (const block_q8_K *)x;
    const double fs = t == TN_IQ3_XXS ? 0.25 : t == TN_IQ3_S || t == TN_IQ1_S || t == TN_IQ1_M ? 1.0 : 0.125;
    const double sh = t == TN_IQ1_S || t == TN_IQ1_M ? TN_IQ1_DELTA : 0.0;
    double s = 0;
    for (int64_t b = 0; b < k / QK_K; b++) {
        double sb = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            tn_iq_sub o;
            tn_iq_sub_decode(t, w + (size_t)b * bs, ib, &o);
            for (int e = 0; e < 32; e++)
                sb += (2.0 * o.s[e / 16] + 1) * fabs((double)xb[b].qs[32 * ib + e]) * (fabs((double)o.q[e]) + sh);
        }
        s += fabs((double)tn_iq_block_d(t, w + (size_t)b * bs) * xb[b].d) * sb;
    }
    return fs * s;
}

static double dequant_dot(tn_dtype t, int64_t k, const uint8_t *w, const uint8_t *x) {
    float *wf = malloc((size_t)k * sizeof(float)), *xf = malloc((size_t)k * sizeof(float));
    assert_true(tn_dequantize_row(t, w, wf, k));
    assert_true(tn_dequantize_row(TN_Q8_K, x, xf, k));
    double s = 0;
    for (int64_t l = 0; l < k; l++) s += (double)wf[l] * xf[l];
    free(wf), free(xf);
    return s;
}

static long cells, exact, independent;

static void check_tile(tn_isa isa, tn_dtype t, int64_t k, int64_t m, int64_t n, int raw) {
    const tn_kern_table *ref = tn_kern_at(TN_ISA_SCALAR), *opt = tn_kern_at(isa);
    const size_t w_rb = tn_dtype_row_size(t, k) + 36, x_rb = tn_dtype_row_size(TN_Q8_K, k) + 20;
    const int64_t ldy = m + 3;
    uint8_t *w = calloc((size_t)m, w_rb), *x = calloc((size_t)n, x_rb);
    float *y = malloc((size_t)(n * ldy) * sizeof(float));
    for (int64_t i = 0; i < m; i++) make_weights(t, k, w + i * w_rb);
    for (int64_t j = 0; j < n; j++) make_acts(ref, k, x + j * x_rb, raw);
    for (int64_t c = 0; c < n * ldy; c++) y[c] = -12345.0f;
    opt->slot[t].gemm(k, m, n, w, w_rb, x, x_rb, y, ldy);
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < ldy; i++) {
            const float o = y[j * ldy + i];
            if (i >= m) {
                if (o != -12345.0f)
                    fail_msg("%s %s gemm k=%lld m=%lld n=%lld wrote outside the result at (%lld, %lld)",
                             tn_isa_name(isa), tn_dtype_name(t), (long long)k, (long long)m, (long long)n,
                             (long long)i, (long long)j);
                continue;
            }
            float r = 0;
            ref->slot[t].vec_dot(k, &r, w + i * w_rb, x + j * x_rb);
            const double S = abs_terms(t, k, w + i * w_rb, x + j * x_rb);
            const double tol = 8.0 * sqrt((double)k + 16.0) * 0x1p-24 * S + 1e-30;
            if (!(fabs((double)r - o) <= tol))
                fail_msg("%s %s gemm k=%lld m=%lld n=%lld raw=%d at (%lld, %lld): scalar vec_dot %.9g gemm %.9g "
                         "|diff| %.3g > %.3g", tn_isa_name(isa), tn_dtype_name(t), (long long)k, (long long)m,
                         (long long)n, raw, (long long)i, (long long)j, r, o, fabs((double)r - o), tol);
#if defined(__GNUC__) && !defined(__clang__)
            if (memcmp(&r, &o, sizeof r) != 0)
                fail_msg("%s %s gemm k=%lld m=%lld n=%lld raw=%d at (%lld, %lld): %.9g is not bit-equal to the "
                         "scalar vec_dot's %.9g (gcc, no FMA contraction)", tn_isa_name(isa), tn_dtype_name(t),
                         (long long)k, (long long)m, (long long)n, raw, (long long)i, (long long)j, o, r);
#endif
            exact += memcmp(&r, &o, sizeof r) == 0;
            cells++;
            if (j % 7 == 0 || n == 70) { /* the double-precision check on a sample of the cells */
                const double dd = dequant_dot(t, k, w + i * w_rb, x + j * x_rb);
                const double tol2 = (8.0 * sqrt((double)k + 16.0) + 8.0) * 0x1p-24 * S + 1e-30;
                if (!(fabs(dd - o) <= tol2))
                    fail_msg("%s %s gemm k=%lld m=%lld n=%lld raw=%d at (%lld, %lld): dequantized dot %.9g gemm %.9g "
                             "|diff| %.3g > %.3g", tn_isa_name(isa), tn_dtype_name(t), (long long)k, (long long)m,
                             (long long)n, raw, (long long)i, (long long)j, dd, o, fabs(dd - o), tol2);
                independent++;
            }
        }
    free(w), free(x), free(y);
}

static void test_iq_gemm(void **state) {
    (void)state;
    static const tn_isa isas[] = {TN_ISA_AVX2, TN_ISA_AVX512};
    int levels = 0;
    for (size_t a = 0; a < sizeof isas / sizeof isas[0]; a++) {
        const tn_kern_table *opt = tn_kern_at(isas[a]), *ref = tn_kern_at(TN_ISA_SCALAR);
        if (!opt) continue;
        for (size_t ti = 0; ti < sizeof iq_types / sizeof iq_types[0]; ti++) {
            const tn_dtype t = iq_types[ti];
            if (opt->slot[t].gemm == ref->slot[t].gemm) continue;
            levels++;
            for (int64_t nbk = 1; nbk <= 3; nbk += 2)
                for (int64_t m = 1; m <= 5; m += 4) {
                    for (int64_t n = 1; n <= 33; n++) check_tile(isas[a], t, nbk * QK_K, m, n, (int)(n % 5 == 2));
                    check_tile(isas[a], t, nbk * QK_K, m, 70, 0);
                    check_tile(isas[a], t, nbk * QK_K, m, 70, 1);
                }
        }
    }
    printf("iq gemm: %ld cells (%ld bit-equal to the scalar vec_dot), %ld against the dequantized double dot, "
           "%d (isa, type) kernels\n", cells, exact, independent, levels);
    if (!levels) {
        printf("SKIP: this CPU has no ISA level above scalar, so there is no batched i-quant kernel to test\n");
        exit(77);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_iq_gemm)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
