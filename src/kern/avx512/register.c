/*
 * register.c (avx512) — fills the kernel-table entries implemented for avx512. The registry
 * calls it when the CPU has AVX512 F/BW/VL/DQ (after the avx2 filler). This folder is compiled
 * with VNNI, VBMI and BF16 as well, so the integer kernels are registered only when the CPU has
 * AVX512-VNNI and AVX512-VBMI, and the bf16 kernels only with AVX512-BF16; otherwise the avx2
 * entries stay.
 */
#include "kern/avx512/kernels.h"

#define TN_SET_DOT(T, wt, at)                                                                                          \
    do {                                                                                                               \
        t->slot[T].vec_dot = tn_k_vec_dot_##wt##_##at##__avx512;                                                       \
        t->slot[T].gemm = tn_k_gemm_##wt##_##at##__avx512;                                                             \
        t->slot[T].vec_dot_isa = t->slot[T].gemm_isa = TN_ISA_AVX512;                                                  \
    } while (0)

void tn_kern_register_avx512(tn_kern_table *t) {
    const tn_cpu *c = tn_cpu_get();
    if (!c->avx512vnni || !c->avx512vbmi) return;
    TN_SET_DOT(TN_F32, f32, f32);
    /* f16 keeps the avx2 kernel (see dot_f.c) */
    TN_SET_DOT(TN_Q4_0, q4_0, q8_0);
    TN_SET_DOT(TN_Q5_0, q5_0, q8_0);
    TN_SET_DOT(TN_Q8_0, q8_0, q8_0);
    TN_SET_DOT(TN_Q4_1, q4_1, q8_1);
    TN_SET_DOT(TN_Q5_1, q5_1, q8_1);
    TN_SET_DOT(TN_Q2_K, q2_K, q8_K);
    TN_SET_DOT(TN_Q3_K, q3_K, q8_K);
    TN_SET_DOT(TN_Q4_K, q4_K, q8_K);
    TN_SET_DOT(TN_Q5_K, q5_K, q8_K);
    TN_SET_DOT(TN_Q6_K, q6_K, q8_K);
    TN_SET_DOT(TN_IQ4_NL, iq4_nl, q8_0);
    TN_SET_DOT(TN_IQ4_XS, iq4_xs, q8_K);
    TN_SET_DOT(TN_MXFP4, mxfp4, q8_0);
    TN_SET_DOT(TN_TQ1_0, tq1_0, q8_K);
    TN_SET_DOT(TN_TQ2_0, tq2_0, q8_K);
    if (c->avx512bf16) TN_SET_DOT(TN_BF16, bf16, bf16);
    tn_kern_register_iq_avx512(t); /* codebook i-quants: batched gemm (gemm_iq2.c) */
}
