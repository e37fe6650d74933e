/*
 * dot_iq2.c (scalar) — reference dot products of the codebook i-quants (iq2_xxs, iq2_xs, iq2_s,
 * iq3_xxs, iq3_s, iq1_s, iq1_m) with q8_K activations: ggml's ggml_vec_dot_<t>_q8_K_generic
 * arithmetic. Per block an exact integer sum of (2 s + 1) times each half sub-block's integer dot
 * of signed grid values and activations (iq1: plus the 1/8 shifts, as (2 s + 1) * +-1 times the
 * activations' group sums), then the float scales in ggml's order:
 *   iq2_*:   s = 1/8 * sum_blocks (d_w d_x) * bsum        iq3_xxs: 1/4 * ...       iq3_s: 1 * ...
 *   iq1_*:   s = sum_blocks d_w d_x (sumi + 1/8 sumi1)
 * Blocks are read through tn_iq_sub_decode (quant/quant_iq2.c), the one description of the layouts
 * (the load-time iq2 *_p3 layouts included).
 */
#include "kern/scalar/kernels.h"
#include "quant/iq_grid.h"
#include "quant/quant.h"

static float dot_iq_q8_K(tn_dtype t, int64_t k, const void *w, const void *x) {
    const size_t bs = tn_dtype_get(t)->type_size;
    const uint8_t *wb = w;
    const block_q8_K *xb = x;
    const bool iq1 = t == TN_IQ1_S || t == TN_IQ1_M || t == TN_IQ1_S_P2 || t == TN_IQ1_M_P2;
    tn_iq_sub o;
    float sumf = 0;
    for (int64_t i = 0; i < k / QK_K; i++, wb += bs) {
        int32_t bsum = 0, dsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            tn_iq_sub_decode(t, wb, ib, &o);
            const int8_t *q8 = xb[i].qs + 32 * ib;
            for (int h = 0; h < 2; h++) {
                const int ls = 2 * o.s[h] + 1;
                int32_t sumi = 0, sumd = 0;
                for (int g = 0; g < 2; g++) {
                    int32_t s8 = 0;
                    for (int j = 0; j < 8; j++) {
                        const int e = 16 * h + 8 * g + j;
                        sumi += o.q[e] * q8[e];
                        s8 += q8[e];
                    }
                    sumd += o.delta[2 * h + g] * s8;
                }
                bsum += ls * sumi;
                dsum += ls * sumd;
            }
        }
        if (iq1) sumf += tn_iq_block_d(t, wb) * xb[i].d * (bsum + TN_IQ1_DELTA * dsum);
        else sumf += tn_iq_block_d(t, wb) * xb[i].d * bsum;
    }
    return t == TN_IQ3_XXS || t == TN_IQ3_XXS_P4 ? 0.25f * sumf : t == TN_IQ3_S || t == TN_IQ3_S_P4 || iq1 ? sumf : 0.125f * sumf;
}

#define TN_IQ_DOT(name, T)                                                                                             \
    void tn_k_vec_dot_##name##_q8_K__scalar(int64_t k, float *s, const void *w, const void *x) {                      \
        *s = dot_iq_q8_K(T, k, w, x);                                                                                  \
    }
TN_IQ_DOT(iq2_xxs, TN_IQ2_XXS)
TN_IQ_DOT(iq2_xs, TN_IQ2_XS)
TN_IQ_DOT(iq2_s, TN_IQ2_S)
TN_IQ_DOT(iq3_xxs, TN_IQ3_XXS)
TN_IQ_DOT(iq3_s, TN_IQ3_S)
TN_IQ_DOT(iq1_s, TN_IQ1_S)
TN_IQ_DOT(iq1_m, TN_IQ1_M)
/* the p3 layouts (quant/repack.h) through the same decoder: the reference their kernels are
 * tested against, itself tested against the file types' (tests/gemv/test_repack.c) */
TN_IQ_XP_TYPES(TN_IQ_DOT)
