/*
 * kernels.h (avx512) — declarations of the kernels in src/kern/avx512/ (contracts: kern/kern.h).
 * Included by the definitions and by register.c, so the two cannot drift apart.
 */
#ifndef TN_KERN_AVX512_KERNELS_H
#define TN_KERN_AVX512_KERNELS_H

#include "kern/kern.h"

#define TN_DECL_VEC_DOT(name) void name(int64_t k, float *s, const void *w, const void *x);
#define TN_DECL_GEMM(name)                                                                                             \
    void name(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x, size_t x_rb, float *y,       \
              int64_t ldy);
#define TN_DECL_FROM(name) void name(const float *x, void *y, int64_t k);
#define TN_DECL_TO(name) void name(const void *x, float *y, int64_t k);

/* weight x activation pairs: (wtype, atype) */
#define TN_AVX512_DOT_PAIRS(X)                                                                                           \
    X(f32, f32) X(bf16, bf16) X(q4_0, q8_0) X(q5_0, q8_0) X(q8_0, q8_0) X(q4_1, q8_1) X(q5_1, q8_1)       \
        X(q2_K, q8_K) X(q3_K, q8_K) X(q4_K, q8_K) X(q5_K, q8_K) X(q6_K, q8_K) X(iq4_nl, q8_0)      \
        X(iq4_xs, q8_K) X(mxfp4, q8_0) X(tq1_0, q8_K) X(tq2_0, q8_K)

#define TN_DECL_PAIR_AVX512(wt, at) TN_DECL_VEC_DOT(tn_k_vec_dot_##wt##_##at##__avx512) TN_DECL_GEMM(tn_k_gemm_##wt##_##at##__avx512)
TN_AVX512_DOT_PAIRS(TN_DECL_PAIR_AVX512)

/* tern any-bit weight quantizer, 16 groups per pass (tq_quant.c; kern.h tn_tq_quantize_fn) */
void tn_k_tq_quantize__avx512(const tn_tq_params *p, const float *x, void *y, int64_t k, const float *imatrix);

#endif
