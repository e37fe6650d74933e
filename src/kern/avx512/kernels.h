/*
 * kernels.h (avx512) — declarations of the kernels in src/kern/avx512/ (contracts: kern/kern.h).
 * Included by the definitions and by register.c, so the two cannot drift apart.
 */
#ifndef TN_KERN_AVX512_KERNELS_H
#define TN_KERN_AVX512_KERNELS_H

#include "kern/kern.h"
#include "kern/scalar/kernels.h" /* TN_IQ_GRID_TYPES */

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

/* Batched tile products of the codebook i-quants x q8_K (gemm_iq2.c; one activation row goes
 * through the vec_dot), the avx512 vec_dot of five of them (dot_iq2.c); iq1_s / iq1_m keep avx2's. */
#define TN_DECL_IQ_GEMM_AVX512(name, T)                                                                                \
    TN_DECL_GEMM(tn_k_gemm_##name##_q8_K__avx512) TN_DECL_VEC_DOT(tn_k_vec_dot_##name##_q8_K__avx2)
TN_IQ_GRID_TYPES(TN_DECL_IQ_GEMM_AVX512)
#undef TN_DECL_IQ_GEMM_AVX512
#define TN_IQ_DOT512_TYPES(X) X(iq2_xxs, TN_IQ2_XXS) X(iq2_xs, TN_IQ2_XS) X(iq2_s, TN_IQ2_S) X(iq3_xxs, TN_IQ3_XXS) X(iq3_s, TN_IQ3_S)
#define TN_DECL_IQ_DOT512(name, T) TN_DECL_VEC_DOT(tn_k_vec_dot_##name##_q8_K__avx512)
TN_IQ_DOT512_TYPES(TN_DECL_IQ_DOT512)
TN_IQ_XP_TYPES(TN_DECL_IQ_DOT512)
#undef TN_DECL_IQ_DOT512
#define TN_DECL_IQ_P3_GEMM(name, T) TN_DECL_GEMM(tn_k_gemm_##name##_q8_K__avx512)
TN_IQ_XP_TYPES(TN_DECL_IQ_P3_GEMM)
#undef TN_DECL_IQ_P3_GEMM
void tn_kern_register_iq_avx512(tn_kern_table *t);

/* tern any-bit weight quantizer, 16 groups per pass (tq_quant.c; kern.h tn_tq_quantize_fn) */
void tn_k_tq_quantize__avx512(const tn_tq_params *p, const float *x, void *y, int64_t k, const float *imatrix);

#endif
