/*
 * dot_iq2.c (avx512) — decode (vec_dot) kernels of the codebook i-quants with 256- and 512-entry
 * grids and more: iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s x q8_K. Two 32-element sub-blocks per
 * step in one 512-bit register:
 *   grid entries: the indices are widened in a vector (plus iq2_s / iq3_s's high bits, shifted in
 *     with variable shifts) and gathered (vpgatherqq of eight 8-byte entries, or vpgatherdd of
 *     sixteen 4-byte iq3 entries): the grids (2-8 KiB) are too large for vpermb tables;
 *   signs: the 64 sign bits of the two sub-blocks are one 64-bit mask (bit e for element e), so
 *     one masked subtract negates them; the 7-bit stored fields (iq2_xxs, iq2_xs, iq3_xxs) get
 *     their parity bit from two 16-entry pshufb lookups, eight fields at a time;
 *   products: u = q ^ 0x80 = q + 128 against the signed grid values in maddubs, then VNNI
 *     vpdpwssd with the halves' odd scales 2 s + 1; the 128 g part is the same sum at q = 0 and
 *     is subtracted (avx2/iq2_gemm.inc explains why this is exact for any activations).
 * The block's integer sum then takes the float scales in the scalar reference's order
 * (kern/scalar/dot_iq2.c). iq1_s / iq1_m keep the avx2 vec_dot (their 2048-entry grid and the
 * shift sums were not moved here).
 */
#include "kern/avx2/simd.h"
#include "kern/avx512/kernels.h"
#include "quant/iq_grid.h"
#include "quant/quant.h"

/* Sign bytes of eight 7-bit fields (bytes 0..7 of f, values < 128): the field plus its parity
 * bit 7 (even parity, tn_iq_signs7), as one 64-bit mask. */
TN_INLINE __mmask64 signs7_mask(__m128i f) {
    const __m128i par = _mm_setr_epi8(0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0), lo = _mm_set1_epi8(15);
    const __m128i p = _mm_xor_si128(_mm_shuffle_epi8(par, _mm_and_si128(f, lo)),
                                    _mm_shuffle_epi8(par, _mm_and_si128(_mm_srli_epi16(f, 4), lo)));
    return _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(_mm_or_si128(f, _mm_slli_epi16(p, 7))));
}

/* The four 7-bit fields of two sign words a0 (dword 1 of v) and a1 (dword 3), as eight bytes. */
TN_INLINE __m128i fields7(__m128i v) {
    const __m256i a = _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(v), _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
    const __m256i f = _mm256_srlv_epi32(a, _mm256_setr_epi32(0, 7, 14, 21, 0, 7, 14, 21));
    return _mm256_cvtepi32_epi8(_mm256_and_si256(f, _mm256_set1_epi32(127)));
}

/* Odd scales of the four 16-element halves of two sub-blocks, one per 128-bit lane (int16). */
TN_INLINE __m512i ls4(int l0, int l1, int l2, int l3) {
    const __m256i a = _mm256_set_m128i(_mm_set1_epi16((short)l1), _mm_set1_epi16((short)l0));
    const __m256i b = _mm256_set_m128i(_mm_set1_epi16((short)l3), _mm_set1_epi16((short)l2));
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

/* Sub-blocks 2c and 2c + 1 of a block of type t: 64 signed grid values and the halves' odd scales. */
TN_INLINE __m512i sub2_decode(tn_dtype t, const uint8_t *blk, int c, __m512i *ls) {
    __m512i g;
    __mmask64 sg;
    switch (t) {
    case TN_IQ2_XXS: { /* per sub-block: 4 index bytes, then a sign/scale word */
        const uint8_t *p = (const uint8_t *)((const block_iq2_xxs *)blk)->qs + 16 * c;
        const __m128i v = _mm_loadu_si128((const __m128i *)p);
        const __m128i ix = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1));
        g = _mm512_i64gather_epi64(_mm512_cvtepu8_epi64(ix), (const void *)tn_iq2xxs_grid, 8);
        sg = signs7_mask(fields7(v));
        const int l0 = 2 * (int)(tn_iq_rd32(p + 4) >> 28) + 1, l1 = 2 * (int)(tn_iq_rd32(p + 12) >> 28) + 1;
        *ls = ls4(l0, l0, l1, l1);
        break;
    }
    case TN_IQ2_XS: { /* 9-bit index + 7 sign bits per u16 */
        const block_iq2_xs *b = (const block_iq2_xs *)blk;
        const __m128i v = _mm_loadu_si128((const __m128i *)(b->qs + 8 * c));
        g = _mm512_i64gather_epi64(_mm512_cvtepu16_epi64(_mm_and_si128(v, _mm_set1_epi16(511))),
                                   (const void *)tn_iq2xs_grid, 8);
        sg = signs7_mask(_mm_cvtepi16_epi8(_mm_srli_epi16(v, 9)));
        const unsigned s0 = b->scales[2 * c], s1 = b->scales[2 * c + 1];
        *ls = ls4(2 * (int)(s0 & 15) + 1, 2 * (int)(s0 >> 4) + 1, 2 * (int)(s1 & 15) + 1, 2 * (int)(s1 >> 4) + 1);
        break;
    }
    case TN_IQ2_S: { /* 8 low index bits, 2 high bits per index in qh, whole sign bytes */
        const block_iq2_s *b = (const block_iq2_s *)blk;
        const __m512i lo = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * c)));
        const __m512i h = _mm512_set1_epi64((long long)(b->qh[2 * c] | (unsigned)b->qh[2 * c + 1] << 8));
        const __m512i hi = _mm512_and_si512(_mm512_srlv_epi64(h, _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14)), _mm512_set1_epi64(3));
        g = _mm512_i64gather_epi64(_mm512_or_si512(lo, _mm512_slli_epi64(hi, 8)), (const void *)tn_iq2s_grid, 8);
        uint64_t s;
        memcpy(&s, b->qs + QK_K / 8 + 8 * c, 8);
        sg = _cvtu64_mask64(s);
        const unsigned s0 = b->scales[2 * c], s1 = b->scales[2 * c + 1];
        *ls = ls4(2 * (int)(s0 & 15) + 1, 2 * (int)(s0 >> 4) + 1, 2 * (int)(s1 & 15) + 1, 2 * (int)(s1 >> 4) + 1);
        break;
    }
    case TN_IQ3_XXS: { /* 8 index bytes per sub-block (groups of 4), sign/scale words after all indices */
        const uint8_t *q = ((const block_iq3_xxs *)blk)->qs;
        g = _mm512_i32gather_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * c))),
                                   (const void *)tn_iq3xxs_grid, 4);
        const __m128i a = _mm_loadl_epi64((const __m128i *)(q + QK_K / 4 + 8 * c)); /* a0, a1 in dwords 0, 1 */
        sg = signs7_mask(fields7(_mm_unpacklo_epi32(a, a)));                        /* -> dwords 1, 3 */
        const int l0 = 2 * (int)(tn_iq_rd32(q + QK_K / 4 + 8 * c) >> 28) + 1;
        const int l1 = 2 * (int)(tn_iq_rd32(q + QK_K / 4 + 8 * c + 4) >> 28) + 1;
        *ls = ls4(l0, l0, l1, l1);
        break;
    }
    case TN_IQ3_S: { /* 8 low index bits, 1 high bit per index in qh, whole sign bytes */
        const block_iq3_s *b = (const block_iq3_s *)blk;
        const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16 * c)));
        const __m512i h = _mm512_set1_epi32((int)(b->qh[2 * c] | (unsigned)b->qh[2 * c + 1] << 8));
        const __m512i hi = _mm512_and_si512(
            _mm512_srlv_epi32(h, _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)), _mm512_set1_epi32(1));
        g = _mm512_i32gather_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 8)), (const void *)tn_iq3s_grid, 4);
        uint64_t s;
        memcpy(&s, b->signs + 8 * c, 8);
        sg = _cvtu64_mask64(s);
        const int l0 = 2 * (int)(b->scales[c] & 15) + 1, l1 = 2 * (int)(b->scales[c] >> 4) + 1;
        *ls = ls4(l0, l0, l1, l1);
        break;
    }
    default: *ls = _mm512_setzero_si512(); return _mm512_setzero_si512();
    }
    return _mm512_mask_sub_epi8(g, sg, _mm512_setzero_si512(), g);
}

TN_INLINE float dot_iq512(tn_dtype t, int64_t k, const void *w, const void *x) {
    const size_t bs = tn_dtype_get(t)->type_size;
    const uint8_t *wb = w;
    const block_q8_K *xb = x;
    const __m512i off = _mm512_set1_epi8((char)0x80);
    float sumf = 0;
    for (int64_t i = 0; i < k / QK_K; i++, wb += bs) {
        __m512i acc = _mm512_setzero_si512(), z = _mm512_setzero_si512();
        for (int c = 0; c < QK_K / 64; c++) {
            __m512i l;
            const __m512i g = sub2_decode(t, wb, c, &l);
            const __m512i u = _mm512_xor_si512(_mm512_loadu_si512((const void *)(xb[i].qs + 64 * c)), off);
            acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u, g), l);
            z = _mm512_dpwssd_epi32(z, _mm512_maddubs_epi16(off, g), l);
        }
        const int32_t bsum = _mm512_reduce_add_epi32(_mm512_sub_epi32(acc, z));
        sumf += tn_iq_block_d(t, wb) * xb[i].d * bsum;
    }
    return t == TN_IQ3_XXS ? 0.25f * sumf : t == TN_IQ3_S ? sumf : 0.125f * sumf;
}

#define TN_IQ_DOT512(name, T)                                                                                          \
    void tn_k_vec_dot_##name##_q8_K__avx512(int64_t k, float *s, const void *w, const void *x) {                      \
        *s = dot_iq512(T, k, w, x);                                                                                    \
    }
TN_IQ_DOT512_TYPES(TN_IQ_DOT512)
