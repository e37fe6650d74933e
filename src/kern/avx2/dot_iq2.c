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
 */
#include "kern/avx2/kernels.h"
#include "kern/avx2/simd.h"
#include "quant/iq_grid.h"
#include "quant/quant.h"


/* 0xFF in byte e where bit e % 8 of sign byte e / 8 (of the four in s) is set. */
TN_INLINE __m256i sign_mask(uint32_t s) {
    const __m256i sel = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)s), sel), bit);
    return _mm256_cmpeq_epi8(b, bit);
}

/* Sub-block ib of a block of type t: 32 signed grid values (int8), the odd scales 2 s + 1 of its
 * halves and (iq1) the shift sign of each group of 8. */
TN_INLINE __m256i sub_decode(tn_dtype t, const uint8_t *blk, int ib, int ls[2], int dl[4]) {
    __m256i g;
    uint32_t sg = 0;
    dl[0] = dl[1] = dl[2] = dl[3] = 1;
    switch (t) {
    case TN_IQ2_XXS: {
        const block_iq2_xxs *b = (const block_iq2_xxs *)blk;
        const uint32_t idx = tn_iq_rd32(b->qs + 4 * ib), a = tn_iq_rd32(b->qs + 4 * ib + 2);
        g = _mm256_set_epi64x((long long)tn_iq2xxs_grid[idx >> 24], (long long)tn_iq2xxs_grid[idx >> 16 & 255],
                              (long long)tn_iq2xxs_grid[idx >> 8 & 255], (long long)tn_iq2xxs_grid[idx & 255]);
        for (int l = 0; l < 4; l++) sg |= (uint32_t)tn_iq_signs7(a >> 7 * l) << 8 * l;
        ls[0] = ls[1] = 2 * (int)(a >> 28) + 1;
        break;
    }
    case TN_IQ2_XS: {
        const uint16_t *q = ((const block_iq2_xs *)blk)->qs + 4 * ib;
        g = _mm256_set_epi64x((long long)tn_iq2xs_grid[q[3] & 511], (long long)tn_iq2xs_grid[q[2] & 511],
                              (long long)tn_iq2xs_grid[q[1] & 511], (long long)tn_iq2xs_grid[q[0] & 511]);
        for (int l = 0; l < 4; l++) sg |= (uint32_t)tn_iq_signs7(q[l] >> 9) << 8 * l;
        const uint8_t sc = ((const block_iq2_xs *)blk)->scales[ib];
        ls[0] = 2 * (sc & 15) + 1, ls[1] = 2 * (sc >> 4) + 1;
        break;
    }
    case TN_IQ2_S: {
        const block_iq2_s *b = (const block_iq2_s *)blk;
        const uint8_t *q = b->qs + 4 * ib;
        const unsigned h = b->qh[ib];
        g = _mm256_set_epi64x((long long)tn_iq2s_grid[q[3] | (h >> 6 & 3) << 8], (long long)tn_iq2s_grid[q[2] | (h >> 4 & 3) << 8],
                              (long long)tn_iq2s_grid[q[1] | (h >> 2 & 3) << 8], (long long)tn_iq2s_grid[q[0] | (h & 3) << 8]);
        sg = tn_iq_rd32(b->qs + QK_K / 8 + 4 * ib);
        ls[0] = 2 * (b->scales[ib] & 15) + 1, ls[1] = 2 * (b->scales[ib] >> 4) + 1;
        break;
    }
    case TN_IQ3_XXS: {
        const uint8_t *q = ((const block_iq3_xxs *)blk)->qs;
        const uint8_t *i8 = q + 8 * ib;
        const uint32_t a = tn_iq_rd32(q + QK_K / 4 + 4 * ib);
        g = _mm256_set_epi32((int)tn_iq3xxs_grid[i8[7]], (int)tn_iq3xxs_grid[i8[6]], (int)tn_iq3xxs_grid[i8[5]],
                             (int)tn_iq3xxs_grid[i8[4]], (int)tn_iq3xxs_grid[i8[3]], (int)tn_iq3xxs_grid[i8[2]],
                             (int)tn_iq3xxs_grid[i8[1]], (int)tn_iq3xxs_grid[i8[0]]);
        for (int l = 0; l < 4; l++) sg |= (uint32_t)tn_iq_signs7(a >> 7 * l) << 8 * l;
        ls[0] = ls[1] = 2 * (int)(a >> 28) + 1;
        break;
    }
    case TN_IQ3_S: {
        const block_iq3_s *b = (const block_iq3_s *)blk;
        const uint8_t *i8 = b->qs + 8 * ib;
        const unsigned h = b->qh[ib];
#define TN_G3(n) (int)tn_iq3s_grid[i8[n] | (h >> (n) & 1) << 8]
        g = _mm256_set_epi32(TN_G3(7), TN_G3(6), TN_G3(5), TN_G3(4), TN_G3(3), TN_G3(2), TN_G3(1), TN_G3(0));
#undef TN_G3
        sg = tn_iq_rd32(b->signs + 4 * ib);
        ls[0] = ls[1] = 2 * (b->scales[ib / 2] >> 4 * (ib % 2) & 15) + 1;
        break;
    }
    case TN_IQ1_S: {
        const block_iq1_s *b = (const block_iq1_s *)blk;
        const uint8_t *q = b->qs + 4 * ib;
        const unsigned h = b->qh[ib];
        g = _mm256_set_epi64x((long long)tn_iq1s_grid[q[3] | (h >> 9 & 7) << 8], (long long)tn_iq1s_grid[q[2] | (h >> 6 & 7) << 8],
                              (long long)tn_iq1s_grid[q[1] | (h >> 3 & 7) << 8], (long long)tn_iq1s_grid[q[0] | (h & 7) << 8]);
        ls[0] = ls[1] = 2 * (int)(h >> 12 & 7) + 1;
        dl[0] = dl[1] = dl[2] = dl[3] = h & 0x8000 ? -1 : 1;
        return g;
    }
    case TN_IQ1_M: {
        const block_iq1_m *b = (const block_iq1_m *)blk;
        const uint8_t *q = b->qs + 4 * ib;
        const unsigned h0 = b->qh[2 * ib], h1 = b->qh[2 * ib + 1], sc = tn_iq_rd16(b->scales + 2 * (ib / 2)) >> 6 * (ib % 2);
        g = _mm256_set_epi64x((long long)tn_iq1s_grid[q[3] | (h1 >> 4 & 7) << 8], (long long)tn_iq1s_grid[q[2] | (h1 & 7) << 8],
                              (long long)tn_iq1s_grid[q[1] | (h0 >> 4 & 7) << 8], (long long)tn_iq1s_grid[q[0] | (h0 & 7) << 8]);
        ls[0] = 2 * (int)(sc & 7) + 1, ls[1] = 2 * (int)(sc >> 3 & 7) + 1;
        dl[0] = h0 & 8 ? -1 : 1, dl[1] = h0 & 0x80 ? -1 : 1, dl[2] = h1 & 8 ? -1 : 1, dl[3] = h1 & 0x80 ? -1 : 1;
        return g;
    }
    default: return _mm256_setzero_si256();
    }
    const __m256i m = sign_mask(sg);
    return _mm256_sub_epi8(_mm256_xor_si256(g, m), m);
}

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
        if (iq1) sumf += tn_iq_block_d(t, wb) * xb[i].d * (bsum + TN_IQ1_DELTA * hsum_i32(accd));
        else sumf += tn_iq_block_d(t, wb) * xb[i].d * bsum;
    }
    return t == TN_IQ3_XXS ? 0.25f * sumf : t == TN_IQ3_S || iq1 ? sumf : 0.125f * sumf;
}

#define TN_IQ_AVX2(name, T)                                                                                            \
    void tn_k_vec_dot_##name##_q8_K__avx2(int64_t k, float *s, const void *w, const void *x) { *s = dot_iq(T, k, w, x); } \
    void tn_k_gemm_##name##_q8_K__avx2(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,      \
                                       size_t x_rb, float *y, int64_t ldy) {                                           \
        tn_gemm_by_vec_dot(tn_k_vec_dot_##name##_q8_K__avx2, k, m, n, w, w_rb, x, x_rb, y, ldy);                       \
    }
TN_IQ_GRID_TYPES(TN_IQ_AVX2)
