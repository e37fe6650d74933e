/*
 * test_quant_vec_dot.c — the scalar kernel table (tn_kern_at(TN_ISA_SCALAR)):
 *   - every weight type has vec_dot, gemm, from_float and to_float; every activation type a
 *     from_float; all marked scalar;
 *   - vec_dot(w, quantize_act(x)) equals a double-precision dot of dequantize(w) and
 *     dequantize(quantize_act(x)) (tn_dequantize_row, not the table) within 1e-4 of sum |w_i x_i|
 *     -- the same math, only float rounding apart -- at one block, several blocks and a prime
 *     number of blocks. q4_1/q5_1 x q8_1 use the activation block's fp16 s = d * sum(q) instead
 *     of the quants for the min term, so their tolerance adds the derived |m| * |s - d sum(q)|;
 *   - gemm equals the vec_dot loop bit for bit, honours the row strides and ldy, and writes
 *     nothing else.
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
#include "quant_data.h"

static const tn_dtype weight_types[] = {TN_F32,  TN_F16,  TN_BF16, TN_Q4_0, TN_Q4_1, TN_Q5_0, TN_Q5_1,
                                        TN_Q8_0, TN_Q2_K, TN_Q3_K, TN_Q4_K, TN_Q5_K, TN_Q6_K,
                                        TN_IQ4_NL, TN_IQ4_XS, TN_MXFP4, TN_TQ1_0, TN_TQ2_0};
static const tn_dtype act_types[] = {TN_F32, TN_F16, TN_BF16, TN_Q8_0, TN_Q8_1, TN_Q8_K};

static const tn_kern_table *scalar_table(void) {
    const tn_kern_table *t = tn_kern_at(TN_ISA_SCALAR);
    assert_non_null(t);
    return t;
}

static void test_table_filled(void **state) {
    (void)state;
    const tn_kern_table *kt = scalar_table();
    for (size_t i = 0; i < TN_ARRAY_LEN(weight_types); i++) {
        const tn_kern_slot *s = &kt->slot[weight_types[i]];
        if (!s->vec_dot || !s->gemm || !s->from_float || !s->to_float)
            fail_msg("%s: incomplete scalar slot", tn_dtype_name(weight_types[i]));
        assert_int_equal(s->vec_dot_isa, TN_ISA_SCALAR);
        assert_int_equal(s->gemm_isa, TN_ISA_SCALAR);
        assert_int_equal(s->from_float_isa, TN_ISA_SCALAR);
        assert_int_equal(s->to_float_isa, TN_ISA_SCALAR);
        /* Its activation type can be produced. */
        assert_non_null(kt->slot[tn_dtype_get(weight_types[i])->vec_dot_type].from_float);
    }
    for (size_t i = 0; i < TN_ARRAY_LEN(act_types); i++) {
        const tn_kern_slot *s = &kt->slot[act_types[i]];
        assert_non_null(s->from_float);
        assert_non_null(s->to_float);
        assert_int_equal(s->from_float_isa, TN_ISA_SCALAR);
    }
}

/* The extra tolerance of the q8_1 min term (see the file comment). */
static double q8_1_sum_slack(tn_dtype w, const void *qw, const block_q8_1 *qa, int64_t nb) {
    double slack = 0;
    for (int64_t b = 0; b < nb; b++) {
        const tn_fp16 m = w == TN_Q4_1 ? ((const block_q4_1 *)qw)[b].m : ((const block_q5_1 *)qw)[b].m;
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) sum += qa[b].qs[j];
        const double d = tn_fp16_to_fp32(qa[b].d);
        slack += fabs(tn_fp16_to_fp32(m)) * fabs(tn_fp16_to_fp32(qa[b].s) - d * sum);
    }
    return slack;
}

static void check_dot(tn_dtype w, int64_t nblocks) {
    const tn_kern_table *kt = scalar_table();
    const tn_dtype_traits *tr = tn_dtype_get(w);
    const tn_dtype a = tr->vec_dot_type;
    /* Float formats have 1-element "blocks": use 16x more elements so the sizes stay interesting. */
    const int64_t k = nblocks * (tr->blck_size == 1 ? 16 : tr->blck_size);
    float *xw = malloc((size_t)k * sizeof(float)), *xa = malloc((size_t)k * sizeof(float));
    float *dw = malloc((size_t)k * sizeof(float)), *da = malloc((size_t)k * sizeof(float));
    void *qw = malloc(tn_dtype_row_size(w, k)), *qa = malloc(tn_dtype_row_size(a, k));
    assert_true(xw && xa && dw && da && qw && qa);
    for (int p = 0; p < TQ_N_PATTERNS; p++) {
        for (int ap = 0; ap < 2; ap++) {
            /* Weights from pattern p, activations gaussian (ap 0) or with mixed scales (ap 1). */
            tq_fill(p, 11, xw, k);
            tq_fill(ap == 0 ? 0 : 1, 12, xa, k);
            kt->slot[w].from_float(xw, qw, k);
            kt->slot[a].from_float(xa, qa, k);
            float got = NAN;
            kt->slot[w].vec_dot(k, &got, qw, qa);
            /* Reference: the dequantized rows, multiplied and summed in double. */
            assert_true(tn_dequantize_row(w, qw, dw, k));
            assert_true(tn_dequantize_row(a, qa, da, k));
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < k; i++) {
                ref += (double)dw[i] * da[i];
                mag += fabs((double)dw[i] * da[i]);
            }
            double tol = 1e-4 * mag + 1e-30;
            if (a == TN_Q8_1) tol += q8_1_sum_slack(w, qw, qa, k / QK8_1);
            if (!(fabs(got - ref) <= tol))
                fail_msg("%s x %s, k %lld, pattern %d/%d: vec_dot %.9g, reference %.9g (tol %.3g)", tn_dtype_name(w),
                         tn_dtype_name(a), (long long)k, p, ap, got, ref, tol);
        }
    }
    free(xw), free(xa), free(dw), free(da), free(qw), free(qa);
}

static void test_vec_dot_vs_dequantized(void **state) {
    (void)state;
    /* One block, several, and a prime number of blocks. */
    static const int64_t nblocks[] = {1, 4, 13, 37};
    for (size_t i = 0; i < TN_ARRAY_LEN(weight_types); i++)
        for (size_t j = 0; j < TN_ARRAY_LEN(nblocks); j++) check_dot(weight_types[i], nblocks[j]);
}

/* gemm on a 5 x 3 tile with padded strides equals the vec_dot loop exactly. */
static void test_gemm_vs_vec_dot(void **state) {
    (void)state;
    const tn_kern_table *kt = scalar_table();
    enum { M = 5, NN = 3, LDY = 7 };
    for (size_t i = 0; i < TN_ARRAY_LEN(weight_types); i++) {
        const tn_dtype w = weight_types[i], a = tn_dtype_get(w)->vec_dot_type;
        const int64_t k = 2 * (tn_dtype_get(w)->blck_size == 1 ? 32 : tn_dtype_get(w)->blck_size) + 
                          (tn_dtype_get(w)->blck_size == 1 ? 3 : 0);
        const size_t w_rb = tn_dtype_row_size(w, k) + 16, x_rb = tn_dtype_row_size(a, k) + 8;
        uint8_t *W = calloc(M, w_rb), *X = calloc(NN, x_rb);
        float *row = malloc((size_t)k * sizeof(float));
        assert_true(W && X && row);
        for (int r = 0; r < M; r++) {
            tq_fill(r % TQ_N_PATTERNS, 20 + (uint64_t)r, row, k);
            kt->slot[w].from_float(row, W + (size_t)r * w_rb, k);
        }
        for (int c = 0; c < NN; c++) {
            tq_fill(0, 30 + (uint64_t)c, row, k);
            kt->slot[a].from_float(row, X + (size_t)c * x_rb, k);
        }
        float y[NN * LDY];
        for (int j = 0; j < NN * LDY; j++) y[j] = -12345.0f; /* sentinel */
        kt->slot[w].gemm(k, M, NN, W, w_rb, X, x_rb, y, LDY);
        for (int c = 0; c < NN; c++) {
            for (int r = 0; r < LDY; r++) {
                if (r >= M) {
                    assert_true(y[c * LDY + r] == -12345.0f);
                    continue;
                }
                float s;
                kt->slot[w].vec_dot(k, &s, W + (size_t)r * w_rb, X + (size_t)c * x_rb);
                if (memcmp(&s, &y[c * LDY + r], sizeof s) != 0)
                    fail_msg("%s gemm (%d,%d): %.9g, vec_dot %.9g", tn_dtype_name(w), r, c, y[c * LDY + r], s);
            }
        }
        free(W), free(X), free(row);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_filled),
        cmocka_unit_test(test_vec_dot_vs_dequantized),
        cmocka_unit_test(test_gemm_vs_vec_dot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
