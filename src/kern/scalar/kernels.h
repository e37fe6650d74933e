/*
 * kernels.h (scalar) — declarations of the scalar reference dot products (vec_dot.c), under the
 * tn_vec_dot_fn contract of kern/kern.h: *s = dot(w[0..k), x[0..k)), w in the weight type, x in
 * its vec_dot_type, k a multiple of the block length. Included by the definitions, by register.c
 * and by parity tests that call a reference by name. Stateless and thread-safe.
 */
#ifndef TN_KERN_SCALAR_KERNELS_H
#define TN_KERN_SCALAR_KERNELS_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "kern/kern.h"
#include "tensor/dtype.h"

void tn_k_vec_dot_q4_0_q8_0__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_q4_1_q8_1__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_q5_0_q8_0__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_q5_1_q8_1__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_q8_0_q8_0__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_q2_K_q8_K__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_q3_K_q8_K__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_q4_K_q8_K__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_q5_K_q8_K__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_q6_K_q8_K__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_iq4_nl_q8_0__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_mxfp4_q8_0__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_iq4_xs_q8_K__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_vq2_q8_K__scalar(int64_t k, float *s, const void *w, const void *x); /* vq.c */
void tn_k_vec_dot_tq1_0_q8_K__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_tq2_0_q8_K__scalar(int64_t k, float *s, const void *w, const void *x);
#define TN_IQ_GRID_TYPES(X) X(iq2_xxs, TN_IQ2_XXS) X(iq2_xs, TN_IQ2_XS) X(iq2_s, TN_IQ2_S) X(iq3_xxs, TN_IQ3_XXS) \
    X(iq3_s, TN_IQ3_S) X(iq1_s, TN_IQ1_S) X(iq1_m, TN_IQ1_M)
/* the load-time i-quant layouts with expanded grid entries (quant/repack.h *_p3, *_p4) */
#define TN_IQ_XP_TYPES(X) X(iq2_xxs_p3, TN_IQ2_XXS_P3) X(iq2_xs_p3, TN_IQ2_XS_P3) X(iq2_s_p3, TN_IQ2_S_P3) \
    X(iq3_xxs_p4, TN_IQ3_XXS_P4) X(iq3_s_p4, TN_IQ3_S_P4) X(iq1_s_p2, TN_IQ1_S_P2) X(iq1_m_p2, TN_IQ1_M_P2)
#define TN_DECL_IQ_DOT(name, T) void tn_k_vec_dot_##name##_q8_K__scalar(int64_t k, float *s, const void *w, const void *x);
TN_IQ_GRID_TYPES(TN_DECL_IQ_DOT)
TN_IQ_XP_TYPES(TN_DECL_IQ_DOT)
#undef TN_DECL_IQ_DOT
void tn_k_vec_dot_f16_f16__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_bf16_bf16__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_f32_f32__scalar(int64_t k, float *s, const void *w, const void *x);

/* Tile products (kern.h tn_gemm_fn) for the *_r16 layouts (quant/repack.h); m % 16 == 0, w at a
 * 16-row boundary, w_rb the file type's row size. */
#define TN_DECL_R16_REF(name)                                                                                          \
    void tn_k_gemm_##name##_q8_0__scalar(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,  \
                                         size_t x_rb, float *y, int64_t ldy);
TN_DECL_R16_REF(q4_0_r16)
TN_DECL_R16_REF(tq4g32_r16)
TN_DECL_R16_REF(tq4g64_r16)
TN_DECL_R16_REF(tq4g128_r16)
TN_DECL_R16_REF(tq4g256_r16)
TN_DECL_R16_REF(q8_0_r16)
TN_DECL_R16_REF(iq4_nl_r16)
/* q4_K / q5_K / q6_K *_r16 (activations in q8_K): each row unpacked, the file type's reference dot. */
void tn_k_gemm_q4_K_r16_q8_K__scalar(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                     size_t x_rb, float *y, int64_t ldy);
void tn_k_gemm_q5_K_r16_q8_K__scalar(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                     size_t x_rb, float *y, int64_t ldy);
void tn_k_gemm_tq2_0_r16_q8_K__scalar(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                      size_t x_rb, float *y, int64_t ldy);
void tn_k_gemm_tq1_0_r16_q8_K__scalar(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                      size_t x_rb, float *y, int64_t ldy);
void tn_k_gemm_iq4_xs_r16_q8_K__scalar(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                       size_t x_rb, float *y, int64_t ldy);
void tn_k_gemm_q6_K_r16_q8_K__scalar(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                     size_t x_rb, float *y, int64_t ldy);
/* Tile product for the tq1 *_l32 layouts (quant/repack.h; m % 32 == 0): each row unpacked to the
 * file type's bytes and dotted by the file type's reference (tn_tq_vec_dot_ref). */
void tn_k_gemm_tq1_l32_q8_0__scalar(tn_dtype it, int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,
                                    const void *x, size_t x_rb, float *y, int64_t ldy);
#define TN_DECL_L32_REF(name) TN_DECL_R16_REF(name)
TN_DECL_L32_REF(tq1g32_l32)
TN_DECL_L32_REF(tq1g32a_l32)
TN_DECL_L32_REF(tq1g64_l32)
TN_DECL_L32_REF(tq1g64a_l32)
TN_DECL_L32_REF(tq1g128_l32)
TN_DECL_L32_REF(tq1g128a_l32)
TN_DECL_L32_REF(tq1g256_l32)
TN_DECL_L32_REF(tq1g256a_l32)
/* Tile product for the tq *_c16 layouts (quant/repack.h): each row back in its file type's bytes,
 * then tn_tq_vec_dot_ref — equal to the file type's reference on the original rows bit for bit. */
void tn_k_gemm_tq_c16_q8_0__scalar(tn_dtype it, int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,
                                   const void *x, size_t x_rb, float *y, int64_t ldy);
/* The tile product of c16 type it (per-type entry points; NULL for the b = 1 ids). */
tn_gemm_fn tn_k_gemm_c16__scalar(tn_dtype it);

#endif
