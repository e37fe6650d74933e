/*
 * kernels.h (avx2) — declarations of the kernels in src/kern/avx2/ (contracts: kern/kern.h).
 * Included by the definitions and by register.c, so the two cannot drift apart.
 */
#ifndef TN_KERN_AVX2_KERNELS_H
#define TN_KERN_AVX2_KERNELS_H

#include "kern/kern.h"
#include "kern/scalar/kernels.h" /* TN_IQ_GRID_TYPES */

#define TN_DECL_VEC_DOT(name) void name(int64_t k, float *s, const void *w, const void *x);
#define TN_DECL_GEMM(name)                                                                                             \
    void name(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x, size_t x_rb, float *y,       \
              int64_t ldy);
#define TN_DECL_FROM(name) void name(const float *x, void *y, int64_t k);
#define TN_DECL_TO(name) void name(const void *x, float *y, int64_t k);

/* weight x activation pairs: (wtype, atype) */
#define TN_AVX2_DOT_PAIRS(X)                                                                                           \
    X(f32, f32) X(f16, f16) X(bf16, bf16) X(q4_0, q8_0) X(q5_0, q8_0) X(q8_0, q8_0) X(q4_1, q8_1) X(q5_1, q8_1)       \
        X(q2_K, q8_K) X(q3_K, q8_K) X(q4_K, q8_K) X(q5_K, q8_K) X(q6_K, q8_K) X(iq4_nl, q8_0)      \
        X(iq4_xs, q8_K) X(mxfp4, q8_0) X(tq1_0, q8_K) X(tq2_0, q8_K) X(iq2_xxs, q8_K) X(iq2_xs, q8_K) X(iq2_s, q8_K) \
        X(iq3_xxs, q8_K) X(iq3_s, q8_K) X(iq1_s, q8_K) X(iq1_m, q8_K)

#define TN_DECL_PAIR_AVX2(wt, at) TN_DECL_VEC_DOT(tn_k_vec_dot_##wt##_##at##__avx2) TN_DECL_GEMM(tn_k_gemm_##wt##_##at##__avx2)
TN_AVX2_DOT_PAIRS(TN_DECL_PAIR_AVX2)

TN_DECL_FROM(tn_k_from_float_q8_0__avx2)
TN_DECL_FROM(tn_k_from_float_q8_1__avx2)
TN_DECL_FROM(tn_k_from_float_q8_K__avx2)
TN_DECL_FROM(tn_k_from_float_f16__avx2)
TN_DECL_FROM(tn_k_from_float_bf16__avx2)
TN_DECL_TO(tn_k_to_float_f16__avx2)
TN_DECL_TO(tn_k_to_float_bf16__avx2)
#define TN_AVX2_DEQUANT(X) X(q4_0) X(q5_0) X(q8_0) X(q4_1) X(q5_1) X(q2_K) X(q3_K) X(q4_K) X(q5_K) X(q6_K) X(q8_K) X(iq4_nl)
#define TN_DECL_DEQUANT_AVX2(t) TN_DECL_TO(tn_k_to_float_##t##__avx2)
TN_AVX2_DEQUANT(TN_DECL_DEQUANT_AVX2)

#endif
