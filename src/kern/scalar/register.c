/*
 * register.c (scalar) — fills the kernel table with the scalar references: for every weight type
 * its vec_dot (against its vec_dot_type), a gemm built on that vec_dot, to_float (dequantize) and,
 * where a reference quantizer exists, from_float; for the activation types (q8_0, q8_1, q8_K, f16,
 * bf16, f32) from_float is the activation quantizer/converter that matmuls run on their inputs.
 *
 * The table's function types take void pointers, so each typed row function gets a small static
 * wrapper here (calling through a cast function pointer would be undefined behaviour).
 */

#include "kern/kern.h"
#include "kern/scalar/kernels.h"
#include "quant/quant.h"

/* gemm wrappers: tn_gemm_by_vec_dot with this type's dot, tn_k_gemm_<w>_<a>__scalar. */
#define TN_SCALAR_GEMM(pair)                                                                                      \
    static void tn_k_gemm_##pair##__scalar(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,           \
                                           const void *x, size_t x_rb, float *y, int64_t ldy) {                   \
        tn_gemm_by_vec_dot(tn_k_vec_dot_##pair##__scalar, k, m, n, w, w_rb, x, x_rb, y, ldy);                    \
    }

TN_SCALAR_GEMM(q4_0_q8_0)
TN_SCALAR_GEMM(q4_1_q8_1)
TN_SCALAR_GEMM(q5_0_q8_0)
TN_SCALAR_GEMM(q5_1_q8_1)
TN_SCALAR_GEMM(q8_0_q8_0)
TN_SCALAR_GEMM(q2_K_q8_K)
TN_SCALAR_GEMM(q3_K_q8_K)
TN_SCALAR_GEMM(q4_K_q8_K)
TN_SCALAR_GEMM(q5_K_q8_K)
TN_SCALAR_GEMM(q6_K_q8_K)
TN_SCALAR_GEMM(iq4_nl_q8_0)
TN_SCALAR_GEMM(mxfp4_q8_0)
TN_SCALAR_GEMM(iq4_xs_q8_K)
TN_SCALAR_GEMM(tq1_0_q8_K)
TN_SCALAR_GEMM(tq2_0_q8_K)
#define TN_IQ_GEMM(name, T) TN_SCALAR_GEMM(name##_q8_K)
TN_IQ_GRID_TYPES(TN_IQ_GEMM)
TN_IQ_XP_TYPES(TN_IQ_GEMM)
#undef TN_IQ_GEMM
TN_SCALAR_GEMM(f16_f16)
TN_SCALAR_GEMM(bf16_bf16)
TN_SCALAR_GEMM(f32_f32)

/* Row converters through the type-generic entry points of quant.h (which cover every type
 * registered below, so the returned bool is always true here). */
#define TN_SCALAR_ROW(name, type)                                                                                 \
    static void tn_k_from_float_##name##__scalar(const float *x, void *y, int64_t k) {                          \
        (void)tn_quantize_row_ref(type, x, y, k);                                                                 \
    }                                                                                                             \
    static void tn_k_to_float_##name##__scalar(const void *x, float *y, int64_t k) {                            \
        (void)tn_dequantize_row(type, x, y, k);                                                                   \
    }

TN_SCALAR_ROW(f32, TN_F32)
TN_SCALAR_ROW(f16, TN_F16)
TN_SCALAR_ROW(bf16, TN_BF16)
TN_SCALAR_ROW(q4_0, TN_Q4_0)
TN_SCALAR_ROW(q4_1, TN_Q4_1)
TN_SCALAR_ROW(q5_0, TN_Q5_0)
TN_SCALAR_ROW(q5_1, TN_Q5_1)
/* q8_0/q8_1 from_float quantize activations the way ggml's x86 path does (quant_act.c). */
static void tn_k_from_float_q8_0__scalar(const float *x, void *y, int64_t k) { tn_quantize_row_q8_0_act(x, y, k); }
static void tn_k_to_float_q8_0__scalar(const void *x, float *y, int64_t k) { (void)tn_dequantize_row(TN_Q8_0, x, y, k); }
static void tn_k_from_float_q8_1__scalar(const float *x, void *y, int64_t k) { tn_quantize_row_q8_1_act(x, y, k); }
static void tn_k_to_float_q8_1__scalar(const void *x, float *y, int64_t k) { (void)tn_dequantize_row(TN_Q8_1, x, y, k); }
TN_SCALAR_ROW(q2_K, TN_Q2_K)
TN_SCALAR_ROW(q3_K, TN_Q3_K)
TN_SCALAR_ROW(q4_K, TN_Q4_K)
TN_SCALAR_ROW(q5_K, TN_Q5_K)
TN_SCALAR_ROW(q6_K, TN_Q6_K)
TN_SCALAR_ROW(q8_K, TN_Q8_K)
TN_SCALAR_ROW(iq4_nl, TN_IQ4_NL)
TN_SCALAR_ROW(iq4_xs, TN_IQ4_XS)
TN_SCALAR_ROW(mxfp4, TN_MXFP4)
TN_SCALAR_ROW(tq1_0, TN_TQ1_0)
TN_SCALAR_ROW(tq2_0, TN_TQ2_0)

/* Codebook i-quants: dequantization only (ggml has no reference quantizer for them either). */
#define TN_IQ_TO(name, T)                                                                                         \
    static void tn_k_to_float_##name##__scalar(const void *x, float *y, int64_t k) { tn_dequantize_row_iq(T, x, y, k); }
TN_IQ_GRID_TYPES(TN_IQ_TO)
TN_IQ_XP_TYPES(TN_IQ_TO)
#undef TN_IQ_TO

/* One slot, all four entries marked scalar; vec_dot/gemm may be NULL (activation-only types). */
static void tn_set(tn_kern_table *t, tn_dtype type, tn_vec_dot_fn dot, tn_gemm_fn gemm, tn_from_float_fn from,
                   tn_to_float_fn to) {
    tn_kern_slot *s = &t->slot[type];
    s->vec_dot = dot;
    s->gemm = gemm;
    s->from_float = from;
    s->to_float = to;
    s->vec_dot_isa = s->gemm_isa = s->from_float_isa = s->to_float_isa = TN_ISA_SCALAR;
}

#define TN_WEIGHT(T, name, pair)                                                                                  \
    tn_set(t, T, tn_k_vec_dot_##pair##__scalar, tn_k_gemm_##pair##__scalar, tn_k_from_float_##name##__scalar,    \
           tn_k_to_float_##name##__scalar)
#define TN_ACT_ONLY(T, name) tn_set(t, T, NULL, NULL, tn_k_from_float_##name##__scalar, tn_k_to_float_##name##__scalar)

void tn_kern_register_scalar(tn_kern_table *t) {
    /* Float formats: weights and their own activation type. */
    TN_WEIGHT(TN_F32, f32, f32_f32);
    TN_WEIGHT(TN_F16, f16, f16_f16);
    TN_WEIGHT(TN_BF16, bf16, bf16_bf16);
    /* 32-element blocks: q4_0/q5_0/q8_0 x q8_0, q4_1/q5_1 x q8_1. */
    TN_WEIGHT(TN_Q4_0, q4_0, q4_0_q8_0);
    TN_WEIGHT(TN_Q4_1, q4_1, q4_1_q8_1);
    TN_WEIGHT(TN_Q5_0, q5_0, q5_0_q8_0);
    TN_WEIGHT(TN_Q5_1, q5_1, q5_1_q8_1);
    TN_WEIGHT(TN_Q8_0, q8_0, q8_0_q8_0);
    TN_ACT_ONLY(TN_Q8_1, q8_1);
    /* k-quants x q8_K. */
    TN_WEIGHT(TN_Q2_K, q2_K, q2_K_q8_K);
    TN_WEIGHT(TN_Q3_K, q3_K, q3_K_q8_K);
    TN_WEIGHT(TN_Q4_K, q4_K, q4_K_q8_K);
    TN_WEIGHT(TN_Q5_K, q5_K, q5_K_q8_K);
    TN_WEIGHT(TN_Q6_K, q6_K, q6_K_q8_K);
    TN_ACT_ONLY(TN_Q8_K, q8_K);
    /* 16-entry lookup tables (iq4_nl, mxfp4 x q8_0; iq4_xs x q8_K) and ggml's ternary types. */
    TN_WEIGHT(TN_IQ4_NL, iq4_nl, iq4_nl_q8_0);
    TN_WEIGHT(TN_MXFP4, mxfp4, mxfp4_q8_0);
    TN_WEIGHT(TN_IQ4_XS, iq4_xs, iq4_xs_q8_K);
    TN_WEIGHT(TN_TQ1_0, tq1_0, tq1_0_q8_K);
    TN_WEIGHT(TN_TQ2_0, tq2_0, tq2_0_q8_K);
    /* Codebook i-quants x q8_K: no from_float (their quantizers need the whole row's search). */
#define TN_IQ_SET(name, T) tn_set(t, T, tn_k_vec_dot_##name##_q8_K__scalar, tn_k_gemm_##name##_q8_K__scalar, NULL, tn_k_to_float_##name##__scalar);
    TN_IQ_GRID_TYPES(TN_IQ_SET)
    TN_IQ_XP_TYPES(TN_IQ_SET) /* load-time layouts of iq2_xxs / iq2_xs / iq2_s (quant/repack.h) */
#undef TN_IQ_SET
    /* Load-time layouts (quant/repack.h): a tile product only. */
    tn_set(t, TN_Q4_0_R16, NULL, tn_k_gemm_q4_0_r16_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_TQ4G32_R16, NULL, tn_k_gemm_tq4g32_r16_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_TQ4G64_R16, NULL, tn_k_gemm_tq4g64_r16_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_TQ4G128_R16, NULL, tn_k_gemm_tq4g128_r16_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_TQ4G256_R16, NULL, tn_k_gemm_tq4g256_r16_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_Q8_0_R16, NULL, tn_k_gemm_q8_0_r16_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_IQ4_NL_R16, NULL, tn_k_gemm_iq4_nl_r16_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_Q4_K_R16, NULL, tn_k_gemm_q4_K_r16_q8_K__scalar, NULL, NULL);
    tn_set(t, TN_Q5_K_R16, NULL, tn_k_gemm_q5_K_r16_q8_K__scalar, NULL, NULL);
    tn_set(t, TN_Q6_K_R16, NULL, tn_k_gemm_q6_K_r16_q8_K__scalar, NULL, NULL);
    tn_set(t, TN_IQ4_XS_R16, NULL, tn_k_gemm_iq4_xs_r16_q8_K__scalar, NULL, NULL);
    tn_set(t, TN_TQ2_0_R16, NULL, tn_k_gemm_tq2_0_r16_q8_K__scalar, NULL, NULL);
    tn_set(t, TN_TQ1_0_R16, NULL, tn_k_gemm_tq1_0_r16_q8_K__scalar, NULL, NULL);
    tn_set(t, TN_TQ1G32_L32, NULL, tn_k_gemm_tq1g32_l32_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_TQ1G32A_L32, NULL, tn_k_gemm_tq1g32a_l32_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_TQ1G64_L32, NULL, tn_k_gemm_tq1g64_l32_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_TQ1G64A_L32, NULL, tn_k_gemm_tq1g64a_l32_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_TQ1G128_L32, NULL, tn_k_gemm_tq1g128_l32_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_TQ1G128A_L32, NULL, tn_k_gemm_tq1g128a_l32_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_TQ1G256_L32, NULL, tn_k_gemm_tq1g256_l32_q8_0__scalar, NULL, NULL);
    tn_set(t, TN_TQ1G256A_L32, NULL, tn_k_gemm_tq1g256a_l32_q8_0__scalar, NULL, NULL);
    for (int i = 0; i < TN_DTYPE_TQ_COUNT; i++)
        if (tn_k_gemm_c16__scalar((tn_dtype)(TN_DTYPE_C16_BASE + i)))
            tn_set(t, (tn_dtype)(TN_DTYPE_C16_BASE + i), NULL, tn_k_gemm_c16__scalar((tn_dtype)(TN_DTYPE_C16_BASE + i)), NULL, NULL);
}
