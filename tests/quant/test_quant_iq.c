/*
 * test_quant_iq.c — the lookup-table and ternary types (iq4_nl, iq4_xs, mxfp4, tq1_0, tq2_0)
 * against their format specifications, written here a second time and independently of
 * src/quant/quant_iq.c:
 *   - dequantization of random blocks (every code pattern) equals a decoder written from the
 *     spec: the tables as ggml-common.h lists them (mxfp4 from the e2m1 definition: sign bit,
 *     2 exponent bits, 1 mantissa bit, scale 2^(e-127) via ldexp); tq1_0 by reading each byte
 *     as the base-3 number floor(b * 243 / 256) instead of ggml's multiply trick;
 *   - quantization: the block scale, the error bound of each format on gaussian data (what the
 *     format can represent, not what the code does), exact round trips of representable rows
 *     (ternary rows for tq1_0 / tq2_0, table-valued rows for iq4_nl / mxfp4);
 *   - importance weights change iq4 codes where they should (a heavy column is fit better).
 * ggml's own numbers (bit-exact files) are compared in tests/quantize/quantize_iq_peer.sh.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "quant/quant.h"
#include "quant_data.h"

/* ggml-common.h's kvalues_iq4nl, copied from the format definition */
static const int IQ4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* OCP MX e2m1: s eem -> (-1)^s * (m ? 1.5 : 1) * 2^(e-1) for e > 0, m * 0.5 for e == 0 */
static double e2m1(int c) {
    const int s = c >> 3, e = (c >> 1) & 3, m = c & 1;
    const double v = e ? (1.0 + 0.5 * m) * ldexp(1.0, e - 1) : 0.5 * m;
    return s ? -v : v;
}

static int nib(const uint8_t *qs, int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; }

/* spec decoders: element e of block b -> value (double) */
static double spec_iq4_nl(const uint8_t *b, int e) {
    const block_iq4_nl *x = (const block_iq4_nl *)b;
    return (double)tn_fp16_to_fp32(x->d) * IQ4[nib(x->qs, e)];
}
static double spec_iq4_xs(const uint8_t *b, int e) {
    const block_iq4_xs *x = (const block_iq4_xs *)b;
    const int ib = e / 32;
    const int lo = (x->scales_l[ib / 2] >> (ib % 2 ? 4 : 0)) & 15, hi = (x->scales_h >> (2 * ib)) & 3;
    /* the float product d * (ls - 32) is the format's sub-block scale */
    const float dl = tn_fp16_to_fp32(x->d) * (float)(lo + 16 * hi - 32);
    return (double)dl * IQ4[nib(x->qs + 16 * ib, e % 32)];
}
static double spec_mxfp4(const uint8_t *b, int e) {
    const block_mxfp4 *x = (const block_mxfp4 *)b;
    return e2m1(nib(x->qs, e)) * ldexp(1.0, x->e - 127);
}
static double spec_tq2_0(const uint8_t *b, int e) {
    const block_tq2_0 *x = (const block_tq2_0 *)b;
    const int g = e / 128, l = (e % 128) / 32, m = e % 32;
    return (double)(((x->qs[32 * g + m] >> (2 * l)) & 3) - 1) * tn_fp16_to_fp32(x->d);
}
/* digit n (0 = most significant of 5) of the base-3 number a byte stands for */
static int trit(uint8_t byte, int n) {
    int v = byte * 243 / 256;
    for (int i = 4; i > n; i--) v /= 3;
    return v % 3;
}
static double spec_tq1_0(const uint8_t *b, int e) {
    const block_tq1_0 *x = (const block_tq1_0 *)b;
    int t;
    if (e < 160) t = trit(x->qs[e % 32], e / 32);
    else if (e < 240) t = trit(x->qs[32 + (e - 160) % 16], (e - 160) / 16);
    else t = trit(x->qh[(e - 240) % 4], (e - 240) / 4);
    return (double)(t - 1) * tn_fp16_to_fp32(x->d);
}

typedef struct {
    tn_dtype t;
    double (*spec)(const uint8_t *, int);
    int fp16_off; /* offset of the fp16 scale (-1: mxfp4's e8m0) */
} iq_case;
static const iq_case cases[] = {
    {TN_IQ4_NL, spec_iq4_nl, offsetof(block_iq4_nl, d)}, {TN_IQ4_XS, spec_iq4_xs, offsetof(block_iq4_xs, d)},
    {TN_MXFP4, spec_mxfp4, -1},                          {TN_TQ1_0, spec_tq1_0, offsetof(block_tq1_0, d)},
    {TN_TQ2_0, spec_tq2_0, offsetof(block_tq2_0, d)},
};

static void test_dequantize_spec(void **state) {
    (void)state;
    uint64_t s = 7;
    for (size_t c = 0; c < TN_ARRAY_LEN(cases); c++) {
        const tn_dtype_traits *tr = tn_dtype_get(cases[c].t);
        const int64_t nb = 40, k = nb * tr->blck_size;
        uint8_t *q = malloc((size_t)nb * tr->type_size);
        float *y = malloc((size_t)k * sizeof(float));
        for (size_t i = 0; i < (size_t)nb * tr->type_size; i++) q[i] = (uint8_t)tq_next(&s);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = q + b * tr->type_size;
            if (cases[c].fp16_off >= 0) {
                const tn_fp16 h = tn_fp32_to_fp16(tq_sym(&s) * tq_pow2((int)(b % 9) - 6));
                memcpy(blk + cases[c].fp16_off, &h, 2);
            } else {
                blk[0] = b < 2 ? (uint8_t)b : (uint8_t)(100 + tq_next(&s) % 50); /* denormal scales too */
            }
        }
        assert_true(tn_dequantize_row(cases[c].t, q, y, k));
        for (int64_t i = 0; i < k; i++) {
            const double want = cases[c].spec(q + (i / tr->blck_size) * tr->type_size, (int)(i % tr->blck_size));
            if ((double)y[i] != want)
                fail_msg("%s element %lld: dequantized %.9g, spec %.9g", tn_dtype_name(cases[c].t), (long long)i, y[i], want);
        }
        free(q), free(y);
    }
}

/* Quantize gaussian rows; the relative RMS error stays within what each format can do: 16 levels
 * over 32 elements (iq4: ~0.07 with the table matched to gaussians; 0.1 allowed), e2m1 with a
 * power-of-two scale (0.2), ternary with amax as scale: a 256-sample gaussian block has amax
 * ~2.9 sigma, so |x| < 1.45 sigma (85%) become 0 and the rest +-2.9 sigma, relative RMS ~0.77
 * (0.85 allowed). tq1_0 and tq2_0 round the same way, so they must dequantize identically. */
static void test_quantize_error(void **state) {
    (void)state;
    const struct { tn_dtype t; double max_rel; } q[] = {
        {TN_IQ4_NL, 0.10}, {TN_IQ4_XS, 0.10}, {TN_MXFP4, 0.20}, {TN_TQ1_0, 0.85}, {TN_TQ2_0, 0.85}};
    const int64_t k = 4096;
    float *x = malloc(k * sizeof(float)), *y = malloc(k * sizeof(float));
    void *b = malloc(tn_dtype_row_size(TN_IQ4_NL, k));
    for (size_t i = 0; i < TN_ARRAY_LEN(q); i++) {
        tq_fill(0, 3, x, k);
        assert_true(tn_quantize_row_ref(q[i].t, x, b, k));
        assert_true(tn_dequantize_row(q[i].t, b, y, k));
        double e = 0, n = 0;
        for (int64_t j = 0; j < k; j++) e += (double)(x[j] - y[j]) * (x[j] - y[j]), n += (double)x[j] * x[j];
        const double rel = sqrt(e / n);
        if (!(rel <= q[i].max_rel)) fail_msg("%s: relative RMS error %.4f > %.2f", tn_dtype_name(q[i].t), rel, q[i].max_rel);
        /* the file quantizer (more scale trials) is at least as good for the iq4 types */
        if (q[i].t == TN_IQ4_NL || q[i].t == TN_IQ4_XS) {
            assert_true(tn_quantize_row_imat(q[i].t, x, b, k, NULL));
            assert_true(tn_dequantize_row(q[i].t, b, y, k));
            double e2 = 0;
            for (int64_t j = 0; j < k; j++) e2 += (double)(x[j] - y[j]) * (x[j] - y[j]);
            if (!(sqrt(e2 / n) <= rel * 1.001)) fail_msg("%s: file quantizer error %.4f above the reference's %.4f", tn_dtype_name(q[i].t), sqrt(e2 / n), rel);
        }
    }
    float *y2 = malloc(k * sizeof(float));
    assert_true(tn_quantize_row_ref(TN_TQ1_0, x, b, k) && tn_dequantize_row(TN_TQ1_0, b, y, k));
    assert_true(tn_quantize_row_ref(TN_TQ2_0, x, b, k) && tn_dequantize_row(TN_TQ2_0, b, y2, k));
    assert_memory_equal(y, y2, k * sizeof(float));
    free(x), free(y), free(y2), free(b);
}

/* Rows the format represents exactly come back exactly: ternary rows with amax a power of two
 * (fp16-exact) for tq1_0 / tq2_0; table values times a power of two for iq4_nl and mxfp4
 * (whose block maximum sets the scale). Requantizing the dequantized row gives the same bytes. */
static void test_exact_roundtrip(void **state) {
    (void)state;
    uint64_t s = 11;
    const tn_dtype ts[] = {TN_TQ1_0, TN_TQ2_0, TN_MXFP4, TN_IQ4_NL};
    const int64_t k = 1024;
    float *x = malloc(k * sizeof(float)), *y = malloc(k * sizeof(float));
    uint8_t *b = malloc(tn_dtype_row_size(TN_IQ4_NL, k)), *b2 = malloc(tn_dtype_row_size(TN_IQ4_NL, k));
    for (size_t i = 0; i < TN_ARRAY_LEN(ts); i++) {
        const tn_dtype t = ts[i];
        for (int64_t j = 0; j < k; j++) {
            const float sc = tq_pow2((int)((j / 256) % 5) - 2);
            if (t == TN_TQ1_0 || t == TN_TQ2_0) x[j] = sc * (float)((int)(tq_next(&s) % 3) - 1);
            else if (t == TN_MXFP4) x[j] = sc * (float)e2m1((int)(tq_next(&s) % 16));
            else x[j] = sc * (float)IQ4[tq_next(&s) % 16];
        }
        /* each block holds its largest-magnitude value: +-1 (tq), 6 (mxfp4), -127 (iq4_nl) */
        const int64_t bl = tn_dtype_get(t)->blck_size;
        for (int64_t j = 0; j < k; j += bl) {
            const float sc = tq_pow2((int)((j / 256) % 5) - 2);
            x[j] = t == TN_MXFP4 ? 6.0f * sc : t == TN_IQ4_NL ? -127.0f * sc : sc;
        }
        assert_true(tn_quantize_row_ref(t, x, b, k));
        assert_true(tn_dequantize_row(t, b, y, k));
        for (int64_t j = 0; j < k; j++)
            if (x[j] != y[j]) fail_msg("%s element %lld: %.9g came back as %.9g", tn_dtype_name(t), (long long)j, x[j], y[j]);
        assert_true(tn_quantize_row_ref(t, y, b2, k));
        assert_memory_equal(b, b2, tn_dtype_row_size(t, k));
    }
    free(x), free(y), free(b), free(b2);
}

/* Importance weights: one column with a much larger weight is reproduced more closely than
 * without weights (summed over many rows), for both iq4 types. */
static void test_imatrix_effect(void **state) {
    (void)state;
    const int64_t k = 256, rows = 64;
    float x[256], y[256], imat[256];
    uint8_t b[256];
    for (int64_t j = 0; j < k; j++) imat[j] = j % 32 == 5 ? 1000.0f : 1.0f;
    const tn_dtype ts[] = {TN_IQ4_NL, TN_IQ4_XS};
    for (size_t i = 0; i < TN_ARRAY_LEN(ts); i++) {
        double e_plain = 0, e_w = 0;
        for (int64_t r = 0; r < rows; r++) {
            tq_fill(0, 100 + (uint64_t)r, x, k);
            assert_true(tn_quantize_row_imat(ts[i], x, b, k, NULL));
            assert_true(tn_dequantize_row(ts[i], b, y, k));
            for (int64_t j = 5; j < k; j += 32) e_plain += (double)(x[j] - y[j]) * (x[j] - y[j]);
            assert_true(tn_quantize_row_imat(ts[i], x, b, k, imat));
            assert_true(tn_dequantize_row(ts[i], b, y, k));
            for (int64_t j = 5; j < k; j += 32) e_w += (double)(x[j] - y[j]) * (x[j] - y[j]);
        }
        if (!(e_w < 0.5 * e_plain))
            fail_msg("%s: weighted column error %.4g not below half the plain %.4g", tn_dtype_name(ts[i]), e_w, e_plain);
    }
}

/* Names: ggml's tq1_0 / tq2_0 are not tern's tq1 / tq2 families. */
static void test_names(void **state) {
    (void)state;
    tn_dtype t;
    assert_true(tn_dtype_from_name("tq1_0", &t));
    assert_int_equal(t, TN_TQ1_0);
    assert_true(tn_dtype_from_name("TQ2_0", &t));
    assert_int_equal(t, TN_TQ2_0);
    assert_true(tn_dtype_from_name("iq4_xs", &t));
    assert_int_equal(t, 23);
    assert_true(tn_dtype_from_name("mxfp4", &t));
    assert_int_equal(t, 39);
    assert_true(tn_dtype_get(TN_TQ1_0)->supported && tn_dtype_get(TN_MXFP4)->supported);
    assert_int_equal(tn_dtype_row_size(TN_TQ1_0, 256), 54);
    assert_int_equal(tn_dtype_row_size(TN_IQ4_XS, 512), 272);
    assert_int_equal(tn_dtype_row_size(TN_IQ4_XS, 32), 0); /* not whole super-blocks */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequantize_spec), cmocka_unit_test(test_quantize_error),
        cmocka_unit_test(test_exact_roundtrip), cmocka_unit_test(test_imatrix_effect), cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
