/*
 * test_tq.c — tern any-bit (tq) types: format, reference quantizer, and ISA parity.
 *   - names parse and print, dtype ids and block sizes agree with dtype.c;
 *   - pack/unpack round trip of every code for every width and group;
 *   - quantize -> dequantize error shrinks with bits (rmse per bit width);
 *   - the scalar fused dot equals dequantize-then-dot (to rounding);
 *   - every ISA kernel (vec_dot and gemm) matches the scalar slot at k = G, 2G, 7G, 37G (prime
 *     block counts) for every bits x group x asym.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kern/kern.h"
#include "quant/quant.h"
#include "quant/tq.h"

static uint64_t g_rng = 12345;
static float frand(void) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((g_rng >> 40) & 0xFFFFFF) / 16777216.0f * 2 - 1;
}
static float grand(void) { return (frand() + frand() + frand() + frand()) * 0.5f; }

static void test_names(void **st) {
    (void)st;
    tn_tq_params p;
    assert_true(tn_tq_from_name("tq3", &p));
    assert_int_equal(p.bits, 3), assert_int_equal(p.group, 64), assert_true(p.asym);
    assert_true(tn_tq_from_name("TQ4G128", &p));
    assert_int_equal(p.bits, 4), assert_int_equal(p.group, 128), assert_false(p.asym);
    assert_true(tn_tq_from_name("tq2g32a", &p));
    assert_true(p.asym);
    assert_false(tn_tq_from_name("tq9", &p));
    assert_false(tn_tq_from_name("tq3g48", &p));
    assert_false(tn_tq_from_name("tq3x", &p));
    for (uint32_t t = TN_DTYPE_TERN_BASE; t < TN_DTYPE_TERN_BASE + TN_TQ_COUNT; t++) {
        tn_tq_params_of(t, &p);
        assert_int_equal(tn_tq_dtype(&p), t);
        const tn_dtype_traits *tr = tn_dtype_get(t);
        assert_non_null(tr);
        assert_int_equal(tr->blck_size, p.group);
        assert_int_equal(tr->type_size, tn_tq_block_bytes(&p));
        char nm[32];
        tn_tq_name(&p, nm, sizeof nm);
        assert_string_equal(nm, tr->name);
        tn_dtype d;
        assert_true(tn_dtype_from_name(nm, &d));
        assert_int_equal(d, t);
    }
}

static void test_roundtrip_and_error(void **st) {
    (void)st;
    const int64_t k = 1024;
    float *x = malloc(sizeof(float) * k), *y = malloc(sizeof(float) * k);
    uint8_t *buf = malloc(8 * k);
    for (int64_t i = 0; i < k; i++) x[i] = grand() * 0.02f;
    for (int asym = 0; asym <= 1; asym++)
        for (int g = 32; g <= 256; g *= 2) {
            double prev = 1e30;
            for (int b = 1; b <= 8; b++) {
                tn_tq_params p = {b, g, asym};
                tn_tq_quantize_row(&p, x, buf, k, NULL);
                tn_tq_dequantize_row(&p, buf, y, k);
                double e = 0;
                for (int64_t i = 0; i < k; i++) e += (x[i] - y[i]) * (double)(x[i] - y[i]);
                e = sqrt(e / k);
                if (b > 1) assert_true(e < prev * 0.75); /* each bit must help */
                prev = e;
                /* unpack -> codes -> re-dequantize agrees */
                uint8_t q[256];
                float d, m;
                tn_tq_unpack_block(&p, buf, q, &d, &m);
                for (int j = 0; j < g; j++) {
                    assert_true(q[j] < (1 << b));
                    assert_true(fabsf(d * q[j] + m - y[j]) <= 1e-6f * (1 + fabsf(y[j])));
                }
            }
        }
    free(x), free(y), free(buf);
}

/* fused dot == dot of the dequantized row with the dequantized activations */
static void test_dot_vs_dequant(void **st) {
    (void)st;
    const int64_t k = 512;
    float *x = malloc(sizeof(float) * k), *a = malloc(sizeof(float) * k), *wd = malloc(sizeof(float) * k),
          *ad = malloc(sizeof(float) * k);
    uint8_t *w = malloc(4 * k);
    block_q8_0 *aq = malloc(sizeof(block_q8_0) * (k / 32));
    for (int64_t i = 0; i < k; i++) x[i] = grand(), a[i] = grand();
    tn_quantize_row_q8_0_ref(a, aq, k);
    tn_dequantize_row_q8_0(aq, ad, k);
    for (uint32_t t = TN_DTYPE_TERN_BASE; t < TN_DTYPE_TERN_BASE + TN_TQ_COUNT; t++) {
        tn_tq_params p;
        tn_tq_params_of(t, &p);
        tn_tq_quantize_row(&p, x, w, k, NULL);
        tn_tq_dequantize_row(&p, w, wd, k);
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < k; i++) ref += (double)wd[i] * ad[i], mag += fabs((double)wd[i] * ad[i]);
        const float got = tn_tq_vec_dot_ref(&p, k, w, aq);
        assert_true(fabs(got - ref) <= 1e-4 * mag + 1e-6);
    }
    free(x), free(a), free(wd), free(ad), free(w), free(aq);
}

static void test_isa_parity(void **st) {
    (void)st;
    const tn_kern_table *ref = tn_kern_at(TN_ISA_SCALAR);
    const int64_t nblk[] = {1, 2, 7, 37};
    int checked = 0;
    for (int isa = TN_ISA_AVX2; isa < TN_ISA_COUNT; isa++) {
        const tn_kern_table *kt = tn_kern_at((tn_isa)isa);
        if (!kt) {
            fprintf(stderr, "  %s: not available on this CPU (skipped)\n", tn_isa_name((tn_isa)isa));
            continue;
        }
        for (uint32_t t = TN_DTYPE_TERN_BASE; t < TN_DTYPE_TERN_BASE + TN_TQ_COUNT; t++) {
            tn_tq_params p;
            tn_tq_params_of(t, &p);
            assert_non_null(kt->slot[t].vec_dot);
            assert_non_null(kt->slot[t].gemm);
            if (kt->slot[t].vec_dot_isa != (tn_isa)isa) continue;
            for (size_t ni = 0; ni < sizeof nblk / sizeof nblk[0]; ni++) {
                const int64_t k = nblk[ni] * p.group, rows = 3, cols = 2;
                const size_t wrb = tn_dtype_row_size((tn_dtype)t, k), xrb = tn_dtype_row_size(TN_Q8_0, k);
                float *x = malloc(sizeof(float) * k * rows);
                uint8_t *w = malloc(wrb * rows), *xa = malloc(xrb * cols);
                for (int64_t i = 0; i < k * rows; i++) x[i] = grand();
                for (int r = 0; r < rows; r++) tn_tq_quantize_row(&p, x + r * k, w + r * wrb, k, NULL);
                for (int c = 0; c < cols; c++) {
                    for (int64_t i = 0; i < k; i++) x[i] = grand();
                    tn_quantize_row_q8_0_ref(x, (block_q8_0 *)(xa + c * xrb), k);
                }
                float yr[6], yo[6], s0, s1;
                ref->slot[t].gemm(k, rows, cols, w, wrb, xa, xrb, yr, rows);
                kt->slot[t].gemm(k, rows, cols, w, wrb, xa, xrb, yo, rows);
                ref->slot[t].vec_dot(k, &s0, w, xa);
                kt->slot[t].vec_dot(k, &s1, w, xa);
                for (int i = 0; i < rows * cols; i++) {
                    if (fabsf(yr[i] - yo[i]) > 1e-4f * (1 + fabsf(yr[i])))
                        fail_msg("%s %s k=%lld: gemm[%d] %g vs scalar %g", tn_isa_name((tn_isa)isa), tn_dtype_name(t),
                                 (long long)k, i, yo[i], yr[i]);
                }
                assert_true(fabsf(s0 - s1) <= 1e-4f * (1 + fabsf(s0)));
                assert_true(fabsf(s0 - yr[0]) <= 1e-4f * (1 + fabsf(s0)));
                checked++;
                free(x), free(w), free(xa);
            }
        }
    }
    fprintf(stderr, "  %d ISA parity cases checked\n", checked);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_roundtrip_and_error),
        cmocka_unit_test(test_dot_vs_dequant),
        cmocka_unit_test(test_isa_parity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
