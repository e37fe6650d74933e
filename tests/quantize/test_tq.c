/*
 * test_tq.c — tern any-bit (tq) types: format, reference quantizer, and ISA parity.
 *   - names parse and print, dtype ids and block sizes agree with dtype.c;
 *   - pack/unpack round trip of every code for every width and group;
 *   - quantize -> dequantize error shrinks with bits (rmse per bit width);
 *   - the scalar fused dot equals dequantize-then-dot (to rounding);
 *   - every ISA kernel (vec_dot and gemm) matches the scalar slot at k = G, 2G, 7G, 37G (prime
 *     block counts) for every bits x group x asym;
 *   - every ISA's weight quantizer (table tq_quantize) writes the reference's bytes, with and
 *     without an importance matrix, for rows of 1..37 groups holding plain, constant, zero, signed
 *     zero, outlier, tiny, huge and non-finite groups.
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

/* Fills group g of a row (G values) with one of the shapes the quantizer treats specially. */
static void fill_group(float *x, int G, int shape) {
    switch (shape) {
    case 0: for (int i = 0; i < G; i++) x[i] = grand() * 0.02f; break;          /* plain */
    case 1: for (int i = 0; i < G; i++) x[i] = 0.0f; break;                      /* all zero */
    case 2: for (int i = 0; i < G; i++) x[i] = 0.125f; break;                    /* constant */
    case 3: for (int i = 0; i < G; i++) x[i] = (i % 3 == 0) ? -0.0f : (i % 3 == 1) ? 0.0f : 0.01f * (float)(i % 5);
        break;                                                                   /* signed zeros, few levels */
    case 4: for (int i = 0; i < G; i++) x[i] = grand() * 0.001f; x[G / 3] = 4.0f; break; /* one outlier */
    case 5: for (int i = 0; i < G; i++) x[i] = grand() * 1e-30f; break;          /* tiny (fp16 scale flushes) */
    case 6: for (int i = 0; i < G; i++) x[i] = grand() * 1e30f; break;           /* huge (fp16 scale overflows) */
    case 7: for (int i = 0; i < G; i++) x[i] = -0.0f; x[1] = -0.5f; break;       /* negative zeros and one value */
    case 8: for (int i = 0; i < G; i++) x[i] = grand(); x[G - 1] = NAN; break;   /* non-finite */
    case 9: for (int i = 0; i < G; i++) x[i] = grand(); x[0] = -INFINITY; break;
    case 10: for (int i = 0; i < G; i++) x[i] = (i % 2) ? -0.0f : 0.0f; break;  /* zeros of both signs: the */
    case 11: for (int i = 0; i < G; i++) x[i] = (i % 2) ? 0.0f : -0.0f; break;  /* stored offset's sign */
    default: for (int i = 0; i < G; i++) x[i] = (float)(i % 2) * 0.3f - 0.1f; break; /* two levels */
    }
}

static void test_quantize_isa_parity(void **st) {
    (void)st;
    const int ngs[] = {1, 15, 16, 17, 37};
    int checked = 0;
    for (int isa = TN_ISA_AVX2; isa < TN_ISA_COUNT; isa++) {
        const tn_kern_table *kt = tn_kern_at((tn_isa)isa);
        if (!kt || kt->tq_quantize_isa != (tn_isa)isa) continue;
        for (int asym = 0; asym <= 1; asym++)
            for (int G = 32; G <= 256; G *= 2)
                for (int b = 1; b <= 8; b++)
                    for (size_t ni = 0; ni < sizeof ngs / sizeof ngs[0]; ni++)
                        for (int imat = 0; imat <= 1; imat++) {
                            const tn_tq_params p = {b, G, asym};
                            const int64_t ng = ngs[ni], k = ng * G;
                            const size_t rb = tn_dtype_row_size((tn_dtype)tn_tq_dtype(&p), k);
                            float *x = malloc(sizeof(float) * k), *im = malloc(sizeof(float) * k);
                            uint8_t *yr = malloc(rb), *yo = malloc(rb);
                            for (int64_t g = 0; g < ng; g++)
                                fill_group(x + g * G, G, ng == 37 ? (int)(g % 13) : (int)((g + b + ni) % 8 == 0 ? g % 13 : 0));
                            for (int64_t i = 0; i < k; i++) im[i] = (i % 7 == 3) ? 0.0f : fabsf(grand()) * 5;
                            memset(yr, 0xA5, rb), memset(yo, 0x5A, rb);
                            tn_tq_quantize_row(&p, x, yr, k, imat ? im : NULL);
                            kt->tq_quantize(&p, x, yo, k, imat ? im : NULL);
                            if (memcmp(yr, yo, rb) != 0) {
                                size_t at = 0;
                                while (yr[at] == yo[at]) at++;
                                fail_msg("%s tq_quantize b=%d G=%d asym=%d groups=%lld imatrix=%d: byte %zu (group %zu) "
                                         "0x%02x vs reference 0x%02x",
                                         tn_isa_name((tn_isa)isa), b, G, asym, (long long)ng, imat, at,
                                         at / tn_tq_block_bytes(&p), yo[at], yr[at]);
                            }
                            checked++;
                            free(x), free(im), free(yr), free(yo);
                        }
    }
    fprintf(stderr, "  %d quantizer parity cases checked\n", checked);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_roundtrip_and_error),
        cmocka_unit_test(test_dot_vs_dequant),
        cmocka_unit_test(test_isa_parity),
        cmocka_unit_test(test_quantize_isa_parity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
