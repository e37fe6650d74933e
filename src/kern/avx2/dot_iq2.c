/*
 * dot_iq2.c (avx2) — vec_dot and gemm of the codebook i-quants (iq2_xxs, iq2_xs, iq2_s, iq3_xxs,
 * iq3_s, iq1_s, iq1_m) with q8_K. Per 32-element sub-block: the four (iq3: eight) grid entries are
 * loaded by index into one register (8 bytes each: one group of 8; iq3: 4 bytes, a group of 4),
 * the sign bytes (7 stored bits + computed parity, or stored whole) are expanded to a byte mask
 * by broadcast + shuffle + bit test and applied to the magnitudes (|grid| <= 62, so negation is
 * exact); then the signed grid values times the half sub-block's odd scale 2 s + 1 (|.| <= 1922,
 * int16) meet the activations in madd_epi16 — exact int32 sums, whatever the activations (-128
 * included). iq1 adds the 1/8 shifts as a second exact sum of (2 s + 1) * +-1 times the
 * activations. The block's integer sums then take the float scales in the scalar reference's
 * order (kern/scalar/dot_iq2.c), so results equal it up to the compiler's FMA contraction.
 * gemm with two or more activation rows is the batched kernel of iq2_gemm.inc (each weight block
 * decoded once per tile of up to 64 rows, maddubs + madd against four rows at a time).
 */
#include "core/fp16.h"
#include "kern/avx2/kernels.h"
#include "kern/avx2/simd.h"
#include "quant/iq_grid.h"
#include "quant/quant.h"

#include "kern/avx2/iq2_sub.inc"

TN_INLINE int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

TN_INLINE float dot_iq(tn_dtype t, int64_t k, const void *w, const void *x) {
    const size_t bs = tn_dtype_get(t)->type_size;
    const uint8_t *wb = w;
    const block_q8_K *xb = x;
    const bool iq1 = t == TN_IQ1_S || t == TN_IQ1_M;
    float sumf = 0;
    for (int64_t i = 0; i < k / QK_K; i++, wb += bs) {
        __m256i accb = _mm256_setzero_si256(), accd = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int ls[2], dl[4];
            const __m256i g = sub_decode(t, wb, ib, ls, dl);
            const __m256i q = _mm256_loadu_si256((const __m256i *)(xb[i].qs + 32 * ib));
            const __m256i q0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)), q1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
            const __m256i g0 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(g)), _mm256_set1_epi16((short)ls[0]));
            const __m256i g1 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(g, 1)), _mm256_set1_epi16((short)ls[1]));
            accb = _mm256_add_epi32(accb, _mm256_add_epi32(_mm256_madd_epi16(g0, q0), _mm256_madd_epi16(g1, q1)));
            if (iq1) {
                const __m256i d0 = _mm256_set_m128i(_mm_set1_epi16((short)(ls[0] * dl[1])), _mm_set1_epi16((short)(ls[0] * dl[0])));
                const __m256i d1 = _mm256_set_m128i(_mm_set1_epi16((short)(ls[1] * dl[3])), _mm_set1_epi16((short)(ls[1] * dl[2])));
                accd = _mm256_add_epi32(accd, _mm256_add_epi32(_mm256_madd_epi16(d0, q0), _mm256_madd_epi16(d1, q1)));
            }
        }
        const int32_t bsum = hsum_i32(accb);
        /* tn_iq_block_d inline (a call here costs a vzeroupper and every constant reloaded) */
        const float dw = t == TN_IQ1_M ? tn_iq_block_d(t, wb) : tn_fp16_to_fp32(tn_iq_rd16(wb));
        if (iq1) sumf += dw * xb[i].d * (bsum + TN_IQ1_DELTA * hsum_i32(accd));
        else sumf += dw * xb[i].d * bsum;
    }
    return t == TN_IQ3_XXS ? 0.25f * sumf : t == TN_IQ3_S || iq1 ? sumf : 0.125f * sumf;
}

#define TN_IQ_ZMM 0
#include "kern/avx2/iq2_gemm.inc"

/* gemm: one activation row goes through vec_dot (decode), more through the batched kernel */
#define TN_IQ_AVX2(name, T)                                                                                            \
    void tn_k_vec_dot_##name##_q8_K__avx2(int64_t k, float *s, const void *w, const void *x) { *s = dot_iq(T, k, w, x); } \
    void tn_k_gemm_##name##_q8_K__avx2(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,      \
                                       size_t x_rb, float *y, int64_t ldy) {                                           \
        if (n == 1) tn_gemm_by_vec_dot(tn_k_vec_dot_##name##_q8_K__avx2, k, m, n, w, w_rb, x, x_rb, y, ldy);           \
        else iq_gemm(T, k, m, n, w, w_rb, x, x_rb, y, ldy);                                                            \
    }
TN_IQ_GRID_TYPES(TN_IQ_AVX2)
