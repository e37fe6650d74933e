/*
 * gemm_iq2.c (avx512) — the batched tile product of the codebook i-quants (iq2_xxs, iq2_xs,
 * iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m) x q8_K with 512-bit registers: the template
 * avx2/iq2_gemm.inc (each weight block decoded once per tile of up to 64 activation rows), its
 * per-row sums two sub-blocks per instruction: maddubs then VNNI vpdpwssd with the pairs' odd
 * scales (one instruction for madd + add); the same for the load-time iq2 *_p3 layouts (quant/
 * repack.h). One activation row (decode) goes through the vec_dot:
 * avx512/dot_iq2.c's for iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, avx2's for iq1_s, iq1_m.
 */
#include "kern/avx2/simd.h"
#include "kern/avx512/kernels.h"
#include "quant/iq_grid.h"
#include "quant/quant.h"

#include "kern/avx2/iq2_sub.inc"
#define TN_IQ_ZMM 1
#include "kern/avx2/iq2_gemm.inc"

#define TN_IQ_GEMM512(name, T, dot)                                                                                    \
    void tn_k_gemm_##name##_q8_K__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,    \
                                         size_t x_rb, float *y, int64_t ldy) {                                         \
        if (n == 1) tn_gemm_by_vec_dot(dot, k, m, n, w, w_rb, x, x_rb, y, ldy);                                        \
        else iq_gemm(T, k, m, n, w, w_rb, x, x_rb, y, ldy);                                                            \
    }
#define TN_IQ_GEMM512_D(name, T) TN_IQ_GEMM512(name, T, tn_k_vec_dot_##name##_q8_K__avx512)
TN_IQ_DOT512_TYPES(TN_IQ_GEMM512_D)
TN_IQ_XP_TYPES(TN_IQ_GEMM512_D) /* the iq2 p3 layouts: iq2_sub.inc's p3 decode, dot_iq2.c's vec_dot */
TN_IQ_GEMM512(iq1_s, TN_IQ1_S, tn_k_vec_dot_iq1_s_q8_K__avx2)
TN_IQ_GEMM512(iq1_m, TN_IQ1_M, tn_k_vec_dot_iq1_m_q8_K__avx2)

void tn_kern_register_iq_avx512(tn_kern_table *t) {
#define TN_SET_IQ_GEMM(name, T)                                                                                        \
    t->slot[T].gemm = tn_k_gemm_##name##_q8_K__avx512;                                                                 \
    t->slot[T].gemm_isa = TN_ISA_AVX512;
#define TN_SET_IQ_DOT(name, T)                                                                                         \
    t->slot[T].vec_dot = tn_k_vec_dot_##name##_q8_K__avx512;                                                           \
    t->slot[T].vec_dot_isa = TN_ISA_AVX512;
    TN_IQ_GRID_TYPES(TN_SET_IQ_GEMM)
    TN_IQ_DOT512_TYPES(TN_SET_IQ_DOT)
    TN_IQ_XP_TYPES(TN_SET_IQ_GEMM)
    TN_IQ_XP_TYPES(TN_SET_IQ_DOT)
#undef TN_SET_IQ_GEMM
#undef TN_SET_IQ_DOT
}
