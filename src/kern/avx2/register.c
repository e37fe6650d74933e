/*
 * register.c (avx2) — fills the kernel-table entries implemented for avx2 (needs AVX2 + FMA +
 * F16C, which the registry checks before calling). Entries not set here keep the scalar
 * reference.
 */
#include "kern/avx2/kernels.h"

#define TN_SET_DOT(T, wt, at)                                                                                          \
    do {                                                                                                               \
        t->slot[T].vec_dot = tn_k_vec_dot_##wt##_##at##__avx2;                                                         \
        t->slot[T].gemm = tn_k_gemm_##wt##_##at##__avx2;                                                               \
        t->slot[T].vec_dot_isa = t->slot[T].gemm_isa = TN_ISA_AVX2;                                                    \
    } while (0)
#define TN_SET_FROM(T, name)                                                                                           \
    do {                                                                                                               \
        t->slot[T].from_float = tn_k_from_float_##name##__avx2;                                                        \
        t->slot[T].from_float_isa = TN_ISA_AVX2;                                                                       \
    } while (0)
#define TN_SET_TO(T, name)                                                                                             \
    do {                                                                                                               \
        t->slot[T].to_float = tn_k_to_float_##name##__avx2;                                                            \
        t->slot[T].to_float_isa = TN_ISA_AVX2;                                                                         \
    } while (0)

void tn_kern_register_avx2(tn_kern_table *t) {
    TN_SET_DOT(TN_F32, f32, f32);
    TN_SET_DOT(TN_F16, f16, f16);
    TN_SET_DOT(TN_BF16, bf16, bf16);
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
    /* codebook i-quants (dot_iq2.c); the avx512 tables keep these */
#define TN_SET_IQ(name, T) TN_SET_DOT(T, name, q8_K);
    TN_IQ_GRID_TYPES(TN_SET_IQ)
#undef TN_SET_IQ

    TN_SET_FROM(TN_Q8_0, q8_0);
    TN_SET_FROM(TN_Q8_1, q8_1);
    TN_SET_FROM(TN_Q8_K, q8_K);
    TN_SET_FROM(TN_F16, f16);
    TN_SET_FROM(TN_BF16, bf16);
    TN_SET_TO(TN_F16, f16);
    TN_SET_TO(TN_BF16, bf16);
    TN_SET_TO(TN_Q4_0, q4_0);
    TN_SET_TO(TN_Q5_0, q5_0);
    TN_SET_TO(TN_Q8_0, q8_0);
    TN_SET_TO(TN_Q4_1, q4_1);
    TN_SET_TO(TN_Q5_1, q5_1);
    TN_SET_TO(TN_Q2_K, q2_K);
    TN_SET_TO(TN_Q3_K, q3_K);
    TN_SET_TO(TN_Q4_K, q4_K);
    TN_SET_TO(TN_Q5_K, q5_K);
    TN_SET_TO(TN_Q6_K, q6_K);
    TN_SET_TO(TN_Q8_K, q8_K);
    TN_SET_TO(TN_IQ4_NL, iq4_nl);
}
