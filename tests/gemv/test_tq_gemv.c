/*
 * test_tq_gemv.c — tern any-bit (tq) matrix kernels of the avx512 table (decode n == 1 in
 * src/kern/avx512/tq_gemv.c, prefill n > 1 in tq_gemm.c) against the scalar reference table, for
 * every b = 1..8, G = 32/64/128/256, symmetric and asymmetric.
 *
 * Two kinds of data:
 *   exact — random code bytes, d a power of two, m a small multiple of one, activations with
 *           |q| <= 2 and a power-of-two scale: every product and partial sum on both sides is
 *           exactly representable, so the results must be bit-identical (any wrong code, lane
 *           or scale shows, whatever k is);
 *   real  — rows quantized from random floats, activations from random floats: the two sides
 *           add the same exact per-chunk integer terms times float scales in a different order,
 *           so |diff| <= 8 sqrt(chunks + 16) 2^-24 S, S = sum over codes of the magnitudes of
 *           the terms a lane can hold (|d dx q x| + |m dx x|; sym |w x|).
 * Sizes: k = 1, 2, 3, 5, 8, 13, 16, 17, 37 blocks (whole steps, partial steps, primes), 4096
 * and 24576 (heap scratch); m = 1, 7, 16, 17, 37 rows; n = 1 (decode) and 2, 3, 5, 8, 13
 * (prefill tiles and their remainders); padded row strides, ldy > m with canaries.
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

#include "common/test_tq.h"
#include "core/fp16.h"
#include "kern/kern.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/repack.h"
#include "quant/tq.h"

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rng_uniform(void) { return (float)((rng_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

static int have_avx512(void) {
    const tn_cpu *c = tn_cpu_get();
    if (!tn_kern_at(TN_ISA_AVX512) || !c->avx512vnni || !c->avx512vbmi) {
        printf("no avx512 vnni/vbmi: nothing to test\n");
        return 0;
    }
    return 1;
}

/* One weight row of k codes. exact: raw code bytes, d in {2^-3, 2^-4}, m = i * 2^-3, |i| <= 8. */
static void make_row(const tn_tq_params *p, int64_t k, uint8_t *row, int exact) {
    const size_t bb = tn_tq_block_bytes(p);
    if (exact) {
        for (size_t i = 0; i < (size_t)(k / p->group) * bb; i++) row[i] = (uint8_t)rng_u64();
        for (int64_t b = 0; b < k / p->group; b++) {
            const uint16_t d = tn_fp32_to_fp16(rng_u64() & 1 ? 0.125f : 0.0625f);
            memcpy(row + b * bb, &d, 2);
            if (p->asym) {
                const uint16_t m = tn_fp32_to_fp16((float)((int)(rng_u64() % 17) - 8) * 0.125f);
                memcpy(row + b * bb + 2, &m, 2);
            }
        }
        return;
    }
    float *f = malloc((size_t)k * sizeof(float));
    float scale = 1.0f;
    for (int64_t i = 0; i < k; i++) {
        if (i % 32 == 0) scale = ldexpf(1.0f, (int)(rng_u64() % 7) - 3);
        f[i] = rng_uniform() * scale + (p->asym ? 0.3f * scale : 0.0f);
    }
    tn_tq_quantize_row(p, f, row, k, NULL);
    free(f);
}

/* One q8_0 activation row. exact: |q| <= 2, d = 1/4. */
static void make_x(int64_t k, block_q8_0 *x, int exact) {
    if (exact) {
        for (int64_t b = 0; b < k / 32; b++) {
            x[b].d = tn_fp32_to_fp16(0.25f);
            for (int j = 0; j < 32; j++) x[b].qs[j] = (int8_t)((int)(rng_u64() % 5) - 2);
        }
        return;
    }
    float *f = malloc((size_t)k * sizeof(float));
    for (int64_t i = 0; i < k; i++) f[i] = rng_uniform() * (rng_u64() % 50 == 0 ? 8.0f : 1.0f);
    tn_quantize_row_q8_0_ref(f, x, k);
    free(f);
}


static int checks, exact_checks;

/* The AVX-512 kernel against the scalar reference on given rows w and columns x (exact: the
 * bit-exact data of make_row / make_x, no tolerance). */
/* When opt_w is set, the optimized side computes type opt_type on those bytes (same stride) with
 * opt_table (default: the avx512 table) instead of type t on w: a load-time layout of the rows. */
static const tn_kern_table *opt_table;
static uint32_t opt_type;
static const uint8_t *opt_w;

static void compare(uint32_t t, int64_t k, int64_t m, int64_t n, int exact, const uint8_t *w, size_t w_rb,
                    const uint8_t *x, size_t x_rb) {
    tn_tq_params p;
    tn_tq_params_of(t, &p);
    const tn_kern_table *ref = tn_kern_at(TN_ISA_SCALAR), *opt = opt_table ? opt_table : tn_kern_at(TN_ISA_AVX512);
    const int64_t ldy = m + 3;
    float *yr = malloc((size_t)(ldy * n) * sizeof(float)), *yo = malloc((size_t)(ldy * n) * sizeof(float));
    for (int64_t i = 0; i < ldy * n; i++) yr[i] = yo[i] = -12345.0f;
    ref->slot[t].gemm(k, m, n, w, w_rb, x, x_rb, yr, ldy);
    if (opt_w) opt->slot[opt_type].gemm(k, m, n, opt_w, w_rb, x, x_rb, yo, ldy);
    else opt->slot[t].gemm(k, m, n, w, w_rb, x, x_rb, yo, ldy);
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < ldy; i++) {
            const float r = yr[j * ldy + i], o = yo[j * ldy + i];
            if (i >= m) {
                if (o != -12345.0f)
                    fail_msg("%s k=%lld m=%lld n=%lld: wrote outside the output at row %lld", tn_dtype_name(t),
                             (long long)k, (long long)m, (long long)n, (long long)i);
                continue;
            }
            const double S = exact ? 0 : tq_abs_terms(&p, k, w + (size_t)i * w_rb, (const block_q8_0 *)(x + (size_t)j * x_rb));
            const double tol = exact ? 0 : 8.0 * sqrt((double)(k / 32) + 16.0) * ldexp(1.0, -24) * S + 1e-30;
            if (!(fabs((double)r - o) <= tol))
                fail_msg("%s %s k=%lld m=%lld n=%lld [%lld,%lld]: ref %.9g opt %.9g |diff| %.3g > tol %.3g",
                         exact ? "exact" : "real", tn_dtype_name(t), (long long)k, (long long)m, (long long)n,
                         (long long)i, (long long)j, r, o, fabs((double)r - o), tol);
        }
    checks++;
    exact_checks += exact;
    free(yr), free(yo);
}

static int c16_mode; /* check(): through the c16 layout (b >= 2) */

static void check(uint32_t t, int64_t k, int64_t m, int64_t n, int exact) {
    tn_tq_params p;
    tn_tq_params_of(t, &p);
    const size_t w_rb = tn_dtype_row_size((tn_dtype)t, k) + 5, x_rb = tn_dtype_row_size(TN_Q8_0, k) + 2;
    uint8_t *w = calloc((size_t)m, w_rb), *x = calloc((size_t)n, x_rb);
    for (int64_t i = 0; i < m; i++) make_row(&p, k, w + (size_t)i * w_rb, exact);
    for (int64_t j = 0; j < n; j++) make_x(k, (block_q8_0 *)(x + (size_t)j * x_rb), exact);
    const tn_dtype ct = c16_mode ? tn_c16_type_of((tn_dtype)t) : (tn_dtype)0;
    if (ct) { /* the rows in the c16 layout: back to the same bytes, then avx512 and scalar c16 kernels */
        uint8_t *wc = calloc((size_t)m, w_rb), *back = malloc(w_rb), *slow = malloc(w_rb);
        const int ti = (int)(t - TN_DTYPE_TERN_BASE);
        for (int64_t i = 0; i < m; i++) {
            tn_repack_c16((tn_dtype)t, w + (size_t)i * w_rb, wc + (size_t)i * w_rb, 1, k);
            /* the portable loop gives the same bytes as the installed fast path */
            const tn_c16_put_fn fast = tn_c16_put_fast[ti];
            tn_c16_put_fast[ti] = NULL;
            tn_repack_c16((tn_dtype)t, w + (size_t)i * w_rb, slow, 1, k);
            tn_c16_put_fast[ti] = fast;
            if (!fast || memcmp(slow, wc + (size_t)i * w_rb, w_rb - 5))
                fail_msg("%s k=%lld: the fast c16 repack %s", tn_dtype_name(t), (long long)k, fast ? "differs from the portable one" : "is not installed");
            tn_unpack_row_c16(ct, wc + (size_t)i * w_rb, k, back);
            if (memcmp(back, w + (size_t)i * w_rb, w_rb - 5))
                fail_msg("%s k=%lld: row %lld does not come back from the c16 layout", tn_dtype_name(t), (long long)k, (long long)i);
            if (k >= 512 && !memcmp(wc + (size_t)i * w_rb, w + (size_t)i * w_rb, 64))
                fail_msg("%s k=%lld: the c16 layout left the first super-step as it was", tn_dtype_name(t), (long long)k);
        }
        opt_type = ct, opt_w = wc;
        compare(t, k, m, n, exact, w, w_rb, x, x_rb);
        opt_table = tn_kern_at(TN_ISA_SCALAR);
        compare(t, k, m, n, exact, w, w_rb, x, x_rb);
        opt_table = NULL, opt_w = NULL;
        free(wc), free(back), free(slow);
    } else {
        compare(t, k, m, n, exact, w, w_rb, x, x_rb);
    }
    free(w), free(x);
}

static void run_sizes(int64_t n) {
    static const int64_t nblk[] = {1, 2, 3, 5, 8, 13, 16, 17, 37};
    static const int64_t ms[] = {1, 7, 16, 17, 37};
    for (uint32_t t = TN_DTYPE_TERN_BASE; t < TN_DTYPE_TERN_BASE + TN_TQ_COUNT; t++) {
        tn_tq_params p;
        tn_tq_params_of(t, &p);
        for (size_t bi = 0; bi < sizeof nblk / sizeof nblk[0]; bi++)
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                if ((mi + bi) % 2) continue; /* a diagonal sample of (k, m): every k and every m, both kinds */
                check(t, nblk[bi] * p.group, ms[mi], n, (int)(mi % 2 == 0 ? bi % 3 != 0 : bi % 3 == 0));
            }
        check(t, 4096, 16, n, 1);
        check(t, 4096, 9, n, 0);
        if (n == 1) check(t, 24576, 3, n, 1), check(t, 24576, 2, n, 0);
    }
}

static void test_decode_parity(void **state) {
    (void)state;
    if (!have_avx512()) return;
    checks = exact_checks = 0;
    run_sizes(1);
    printf("tq decode parity: %d checks (%d bit-exact)\n", checks, exact_checks);
}

static void test_prefill_parity(void **state) {
    (void)state;
    if (!have_avx512()) return;
    checks = exact_checks = 0;
    static const int64_t ns[] = {2, 3, 5, 8, 13};
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        const int64_t n = ns[ni];
        for (uint32_t t = TN_DTYPE_TERN_BASE; t < TN_DTYPE_TERN_BASE + TN_TQ_COUNT; t++) {
            tn_tq_params p;
            tn_tq_params_of(t, &p);
            const int64_t kb[] = {1, 3, 16, 17};
            for (int i = 0; i < 4; i++) check(t, kb[i] * p.group, (int64_t)(1 + (i * 7 + ni * 5) % 19), n, i % 2);
        }
    }
    printf("tq prefill parity: %d checks (%d bit-exact)\n", checks, exact_checks);
}

/* The load-time c16 layout (quant/repack.h) of every b >= 2 type: each row repacked must come back
 * byte for byte, and the avx512 c16 kernels (decode: one lane per chunk; prefill: the c16 row
 * unpacking) and the scalar c16 reference on the repacked rows must match the file type's scalar
 * reference on the original rows — bit for bit on exact data — at every size of the decode and
 * prefill tests. */
static void test_c16_parity(void **state) {
    (void)state;
    if (!have_avx512()) return;
    if (!__builtin_cpu_supports("gfni")) {
        printf("no gfni: c16 kernels not installed\n");
        return;
    }
    c16_mode = 1;
    checks = exact_checks = 0;
    run_sizes(1);
    static const int64_t ns[] = {2, 5};
    for (size_t ni = 0; ni < 2; ni++)
        for (uint32_t t = TN_DTYPE_TERN_BASE + 8; t < TN_DTYPE_TERN_BASE + TN_TQ_COUNT; t++) {
            tn_tq_params p;
            tn_tq_params_of(t, &p);
            check(t, 17 * p.group, 7, ns[ni], 1);
            check(t, 2048 + 3 * p.group, 5, ns[ni], (int)ni);
        }
    c16_mode = 0;
    printf("tq c16 parity: %d checks (%d bit-exact)\n", checks, exact_checks);
}

/* One column: the kernel keeps each thread's last prepared column (colcache.h) and reuses it for
 * the same type, k and column bytes. The same column against other rows, then one code changed,
 * one scale changed, a new column, the same column under another type of the same k, and the
 * same bytes at a shorter k: each must match the reference, so a stale prepared column shows. */
static void test_decode_column_cache(void **state) {
    (void)state;
    if (!have_avx512()) return;
    const uint32_t types[] = {TN_DTYPE_TERN_BASE + 0, TN_DTYPE_TERN_BASE + 9, TN_DTYPE_TERN_BASE + 22,
                              TN_DTYPE_TERN_BASE + TN_TQ_COUNT - 1};
    const int64_t k = 2048, m = 40;
    const size_t x_rb = tn_dtype_row_size(TN_Q8_0, k);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t t = types[ti], t2 = types[(ti + 1) % (sizeof types / sizeof types[0])];
        tn_tq_params p, p2;
        tn_tq_params_of(t, &p);
        tn_tq_params_of(t2, &p2);
        const size_t w_rb = tn_dtype_row_size((tn_dtype)t, k), w2_rb = tn_dtype_row_size((tn_dtype)t2, k);
        uint8_t *w1 = malloc((size_t)m * w_rb), *w2 = malloc((size_t)m * w_rb), *w3 = malloc((size_t)m * w2_rb);
        uint8_t *x = malloc(x_rb);
        for (int64_t i = 0; i < m; i++) {
            make_row(&p, k, w1 + (size_t)i * w_rb, 0);
            make_row(&p, k, w2 + (size_t)i * w_rb, 0);
            make_row(&p2, k, w3 + (size_t)i * w2_rb, 0);
        }
        block_q8_0 *xb = (block_q8_0 *)x;
        make_x(k, xb, 0);
        compare(t, k, m, 1, 0, w1, w_rb, x, x_rb);
        compare(t, k, m, 1, 0, w2, w_rb, x, x_rb);
        xb[5].qs[7] = (int8_t)(xb[5].qs[7] == 127 ? 126 : xb[5].qs[7] + 1);
        compare(t, k, m, 1, 0, w1, w_rb, x, x_rb);
        xb[40].d = tn_fp32_to_fp16(tn_fp16_to_fp32(xb[40].d) * 1.5f + 0.01f);
        compare(t, k, m, 1, 0, w2, w_rb, x, x_rb);
        compare(t2, k, m, 1, 0, w3, w2_rb, x, x_rb);
        compare(t, k, m, 1, 0, w1, w_rb, x, x_rb);
        compare(t, k / 2, m, 1, 0, w1, w_rb, x, x_rb); /* the first half of each row and of x */
        make_x(k, xb, 0);
        compare(t, k, m, 1, 0, w1, w_rb, x, x_rb);
        free(w1), free(w2), free(w3), free(x);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_parity),
        cmocka_unit_test(test_prefill_parity),
        cmocka_unit_test(test_decode_column_cache),
        cmocka_unit_test(test_c16_parity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
