/*
 * dot_iq2.c (avx512) — decode (vec_dot) kernels of the codebook i-quants with 256- and 512-entry
 * grids and more: iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s x q8_K. Two 32-element sub-blocks per
 * step in one 512-bit register:
 *   grid entries: eight 8-byte entries (sixteen 4-byte iq3 entries) loaded one by one into the
 *     register (plus iq2_s / iq3_s's high index bits): the grids (2-8 KiB) are too large for vpermb
 *     tables, and scalar loads beat VPGATHERQQ / VPGATHERDD (Zen 4, one thread, in cache: iq2_xs
 *     1.58x, iq2_s 1.5x, iq2_xxs 1.36x, iq3_xxs 1.18x the gathers' speed; iq3_s keeps its
 *     VPGATHERDD, which its scalar loads did not beat);
 *   scales: iq2_xs / iq2_s's 16 odd scales 2 s + 1 widened once per block, each step's four
 *     picked by one VPERMW;
 *   signs: the 64 sign bits of the two sub-blocks are one 64-bit mask (bit e for element e), so
 *     one masked subtract negates them; the 7-bit stored fields (iq2_xxs, iq2_xs, iq3_xxs) get
 *     their parity bit from one VPERMI2B lookup in a 128-entry table, eight fields at a time;
 *   products: iq2_xs / iq2_s (a scale per 16 weights, the span of a q8_K bsum): g + 64 (unsigned,
 *     21..107) against the activations q in maddubs (pairs at most 2 * 107 * 128 < 2^15), then
 *     VNNI vpdpwssd with the halves' odd scales 2 s + 1; the 64 q part is 64 * sum_h l_h bsum_h,
 *     one madd per block. The others: u = q ^ 0x80 = q + 128 against the signed grid values,
 *     and the 128 g part, the same sum at q = 0, subtracted (avx2/iq2_gemm.inc explains why this
 *     is exact for any activations). Either way the block's integer sum is exact.
 * The block's integer sum then takes the float scales in the scalar reference's order
 * (kern/scalar/dot_iq2.c). iq1_s / iq1_m keep the avx2 vec_dot (their 2048-entry grid and the
 * shift sums were not moved here).
 * Below them, the vec_dots of the load-time expanded layouts (quant/repack.h *_p3, *_p4, *_p2),
 * which decode 64 weights with one byte shuffle and share the products (xp_block).
 */
#include "core/fp16.h"
#include "kern/avx2/simd.h"
#include "kern/avx512/kernels.h"
#include "quant/iq_grid.h"
#include "quant/quant.h"

/* tn_iq_signs7(f) for f = 0..127 (the field plus its even-parity bit 7), as two 64-byte halves of a
 * VPERMI2B table: eight fields' sign bytes in one instruction. */
static const uint8_t tn_signs7_tab[128] __attribute__((aligned(64))) = {
    0x00, 0x81, 0x82, 0x03, 0x84, 0x05, 0x06, 0x87, 0x88, 0x09, 0x0a, 0x8b, 0x0c, 0x8d, 0x8e, 0x0f,
    0x90, 0x11, 0x12, 0x93, 0x14, 0x95, 0x96, 0x17, 0x18, 0x99, 0x9a, 0x1b, 0x9c, 0x1d, 0x1e, 0x9f,
    0xa0, 0x21, 0x22, 0xa3, 0x24, 0xa5, 0xa6, 0x27, 0x28, 0xa9, 0xaa, 0x2b, 0xac, 0x2d, 0x2e, 0xaf,
    0x30, 0xb1, 0xb2, 0x33, 0xb4, 0x35, 0x36, 0xb7, 0xb8, 0x39, 0x3a, 0xbb, 0x3c, 0xbd, 0xbe, 0x3f,
    0xc0, 0x41, 0x42, 0xc3, 0x44, 0xc5, 0xc6, 0x47, 0x48, 0xc9, 0xca, 0x4b, 0xcc, 0x4d, 0x4e, 0xcf,
    0x50, 0xd1, 0xd2, 0x53, 0xd4, 0x55, 0x56, 0xd7, 0xd8, 0x59, 0x5a, 0xdb, 0x5c, 0xdd, 0xde, 0x5f,
    0x60, 0xe1, 0xe2, 0x63, 0xe4, 0x65, 0x66, 0xe7, 0xe8, 0x69, 0x6a, 0xeb, 0x6c, 0xed, 0xee, 0x6f,
    0xf0, 0x71, 0x72, 0xf3, 0x74, 0xf5, 0xf6, 0x77, 0x78, 0xf9, 0xfa, 0x7b, 0xfc, 0x7d, 0x7e, 0xff};

/* signs7_mask by table: bytes 0..7 of f (fields < 128) through VPERMI2B (VBMI). */
TN_INLINE __mmask64 signs7_mask_lut(__m128i f, __m512i t0, __m512i t1) {
    const __m512i r = _mm512_permutex2var_epi8(t0, _mm512_castsi128_si512(f), t1);
    return _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(_mm512_castsi512_si128(r)));
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
/* The 16 halves' odd scales 2 s + 1 of an iq2_xs / iq2_s block (4-bit fields, low nibble first),
 * as int16 lanes 0..15, once per block. */
TN_INLINE __m512i scales16(const uint8_t *sc) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)sc), m = _mm_set1_epi8(15);
    const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    const __m256i w = _mm256_cvtepu8_epi16(nib);
    return _mm512_castsi256_si512(_mm256_add_epi16(_mm256_add_epi16(w, w), _mm256_set1_epi16(1)));
}

/* Halves 4c .. 4c + 3 of scales16, one per 128-bit lane. */
TN_INLINE __m512i ls_of(__m512i s16, int c) {
    const __m512i lane = _mm512_setr_epi64(0, 0, 0x0001000100010001LL, 0x0001000100010001LL, 0x0002000200020002LL,
                                           0x0002000200020002LL, 0x0003000300030003LL, 0x0003000300030003LL);
    return _mm512_permutexvar_epi16(_mm512_add_epi16(lane, _mm512_set1_epi16((short)(4 * c))), s16);
}

TN_INLINE __m512i sub2_decode(tn_dtype t, const uint8_t *blk, int c, __m512i s16, __m512i st0, __m512i st1, __m512i *ls) {
    __m512i g;
    __mmask64 sg;
    switch (t) {
    case TN_IQ2_XXS: { /* per sub-block: 4 index bytes, then a sign/scale word */
        const uint8_t *p = (const uint8_t *)((const block_iq2_xxs *)blk)->qs + 16 * c;
        const __m128i v = _mm_loadu_si128((const __m128i *)p);
        const uint64_t *gr = (const uint64_t *)tn_iq2xxs_grid;
        g = _mm512_set_epi64((long long)gr[p[11]], (long long)gr[p[10]], (long long)gr[p[9]], (long long)gr[p[8]],
                             (long long)gr[p[3]], (long long)gr[p[2]], (long long)gr[p[1]], (long long)gr[p[0]]);
        sg = signs7_mask_lut(fields7(v), st0, st1);
        const int l0 = 2 * (int)(tn_iq_rd32(p + 4) >> 28) + 1, l1 = 2 * (int)(tn_iq_rd32(p + 12) >> 28) + 1;
        *ls = ls4(l0, l0, l1, l1);
        break;
    }
    case TN_IQ2_XS: { /* 9-bit index + 7 sign bits per u16 */
        const block_iq2_xs *b = (const block_iq2_xs *)blk;
        const __m128i v = _mm_loadu_si128((const __m128i *)(b->qs + 8 * c));
        const uint16_t *qi = b->qs + 8 * c; /* scalar loads: on Zen 4 faster than VPGATHERQQ */
        const uint64_t *gr = (const uint64_t *)tn_iq2xs_grid;
        g = _mm512_set_epi64((long long)gr[qi[7] & 511], (long long)gr[qi[6] & 511], (long long)gr[qi[5] & 511],
                             (long long)gr[qi[4] & 511], (long long)gr[qi[3] & 511], (long long)gr[qi[2] & 511],
                             (long long)gr[qi[1] & 511], (long long)gr[qi[0] & 511]);
        sg = signs7_mask_lut(_mm_cvtepi16_epi8(_mm_srli_epi16(v, 9)), st0, st1);
        *ls = ls_of(s16, c);
        break;
    }
    case TN_IQ2_S: { /* 8 low index bits, 2 high bits per index in qh, whole sign bytes */
        const block_iq2_s *b = (const block_iq2_s *)blk;
        const uint8_t *ql = b->qs + 8 * c;
        const unsigned qh = b->qh[2 * c] | (unsigned)b->qh[2 * c + 1] << 8;
        const uint64_t *gr = (const uint64_t *)tn_iq2s_grid;
#define TN_IQ2S_G(e) (long long)gr[ql[e] | (qh >> (2 * (e)) & 3) << 8]
        g = _mm512_set_epi64(TN_IQ2S_G(7), TN_IQ2S_G(6), TN_IQ2S_G(5), TN_IQ2S_G(4), TN_IQ2S_G(3), TN_IQ2S_G(2),
                             TN_IQ2S_G(1), TN_IQ2S_G(0));
#undef TN_IQ2S_G
        uint64_t s;
        memcpy(&s, b->qs + QK_K / 8 + 8 * c, 8);
        sg = _cvtu64_mask64(s);
        *ls = ls_of(s16, c);
        break;
    }
    case TN_IQ3_XXS: { /* 8 index bytes per sub-block (groups of 4), sign/scale words after all indices */
        const uint8_t *q = ((const block_iq3_xxs *)blk)->qs;
        const uint8_t *ix = q + 16 * c;
        const uint32_t *gr = tn_iq3xxs_grid;
        g = _mm512_setr_epi32((int)gr[ix[0]], (int)gr[ix[1]], (int)gr[ix[2]], (int)gr[ix[3]], (int)gr[ix[4]],
                              (int)gr[ix[5]], (int)gr[ix[6]], (int)gr[ix[7]], (int)gr[ix[8]], (int)gr[ix[9]],
                              (int)gr[ix[10]], (int)gr[ix[11]], (int)gr[ix[12]], (int)gr[ix[13]], (int)gr[ix[14]],
                              (int)gr[ix[15]]);
        const __m128i a = _mm_loadl_epi64((const __m128i *)(q + QK_K / 4 + 8 * c)); /* a0, a1 in dwords 0, 1 */
        sg = signs7_mask_lut(fields7(_mm_unpacklo_epi32(a, a)), st0, st1);          /* -> dwords 1, 3 */
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
        g = _mm512_i32gather_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 8)), (const void *)tn_iq3s_grid, 4); /* VPGATHERDD: here scalar loads were slower (0.95x) */
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
    const __m512i off = _mm512_set1_epi8((char)0x80), g64 = _mm512_set1_epi8(64);
    const __m512i st0 = _mm512_load_si512((const void *)tn_signs7_tab), st1 = _mm512_load_si512((const void *)(tn_signs7_tab + 64));
    /* iq2_xs / iq2_s (a scale per 16 weights, as q8_K's bsums): g + 64 (21..107, unsigned) against
     * the activations in maddubs, and 64 * sum_h l_h bsum_h taken off once per block */
    const bool BS = t == TN_IQ2_XS || t == TN_IQ2_S;
    float sumf = 0;
    for (int64_t i = 0; i < k / QK_K; i++, wb += bs) {
        __m512i acc = _mm512_setzero_si512(), z = _mm512_setzero_si512(), s16 = _mm512_setzero_si512();
        if (t == TN_IQ2_XS) s16 = scales16(((const block_iq2_xs *)wb)->scales);
        if (t == TN_IQ2_S) s16 = scales16(((const block_iq2_s *)wb)->scales);
        for (int c = 0; c < QK_K / 64; c++) {
            __m512i l;
            const __m512i g = sub2_decode(t, wb, c, s16, st0, st1, &l);
            if (BS) {
                const __m512i q = _mm512_loadu_si512((const void *)(xb[i].qs + 64 * c));
                acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(_mm512_add_epi8(g, g64), q), l);
            } else {
                const __m512i u = _mm512_xor_si512(_mm512_loadu_si512((const void *)(xb[i].qs + 64 * c)), off);
                acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u, g), l);
                z = _mm512_dpwssd_epi32(z, _mm512_maddubs_epi16(off, g), l);
            }
        }
        if (BS) { /* z = 64 * sum over the 16 halves of l_h * bsum_h */
            const __m256i lb = _mm256_madd_epi16(_mm512_castsi512_si256(s16), _mm256_loadu_si256((const __m256i *)xb[i].bsums));
            z = _mm512_zextsi256_si512(_mm256_slli_epi32(lb, 6));
        }
        const int32_t bsum = _mm512_reduce_add_epi32(_mm512_sub_epi32(acc, z));
        sumf += _cvtsh_ss(tn_iq_rd16(wb)) * xb[i].d * bsum; /* tn_iq_block_d (F16C), inline: d leads every block here */
    }
    return t == TN_IQ3_XXS ? 0.25f * sumf : t == TN_IQ3_S ? sumf : 0.125f * sumf;
}

/* The iq2 p3 layouts (quant/repack.h; blocks.h block_iq2_p3): the 3-bit codes of element 64 c + j
 * sit in byte j of hi (c = 0, 1 and the low bits of 2) and of the widened lo nibbles (the high bit
 * of c = 2, and c = 3), so one VPERMB per 64 elements — it reads only bits 0..5 of each index byte,
 * and each table below ignores the other fields there — gives g + 64 directly: 64 + {8, 25, 43}
 * for codes 0..2, 64 - {8, 25, 43} for 4..6; c = 2 first merges its bits with one VPTERNLOG. Then
 * the iq2_xs products above: maddubs with the activations, vpdpwssd with the halves' odd scales,
 * 64 * sum_h l_h bsum_h taken off once per block. The same integer sums as the file types'
 * kernels, in the scalar reference's float order. */
/* index i (6 bits) -> g + 64 of code i & 7 (c = 0, 2), (i >> 3) & 7 (c = 1), (i >> 1) & 7 (c = 3) */
static const uint8_t tn_p3_tabs[3][64] __attribute__((aligned(64))) = {
    {
      72,  89, 107,  64,  56,  39,  21,  64,  72,  89, 107,  64,  56,  39,  21,  64,
      72,  89, 107,  64,  56,  39,  21,  64,  72,  89, 107,  64,  56,  39,  21,  64,
      72,  89, 107,  64,  56,  39,  21,  64,  72,  89, 107,  64,  56,  39,  21,  64,
      72,  89, 107,  64,  56,  39,  21,  64,  72,  89, 107,  64,  56,  39,  21,  64},
    {
      72,  72,  72,  72,  72,  72,  72,  72,  89,  89,  89,  89,  89,  89,  89,  89,
     107, 107, 107, 107, 107, 107, 107, 107,  64,  64,  64,  64,  64,  64,  64,  64,
      56,  56,  56,  56,  56,  56,  56,  56,  39,  39,  39,  39,  39,  39,  39,  39,
      21,  21,  21,  21,  21,  21,  21,  21,  64,  64,  64,  64,  64,  64,  64,  64},
    {
      72,  72,  89,  89, 107, 107,  64,  64,  56,  56,  39,  39,  21,  21,  64,  64,
      72,  72,  89,  89, 107, 107,  64,  64,  56,  56,  39,  39,  21,  21,  64,  64,
      72,  72,  89,  89, 107, 107,  64,  64,  56,  56,  39,  39,  21,  21,  64,  64,
      72,  72,  89,  89, 107, 107,  64,  64,  56,  56,  39,  39,  21,  21,  64,  64},
};

/* One expanded block's products: g + 64 of its four 64-element registers against the q8_K block's
 * activations (maddubs), the halves' odd scales (vpdpwssd), 64 * sum_h l_h bsum_h taken off, and
 * the exact integer sums times d_w d_x added to accf. */
TN_INLINE __m512 xp_block(__m512i g0, __m512i g1, __m512i g2, __m512i g3, __m512i s16, const block_q8_K *xb, float d,
                          __m512 accf) {
    const int8_t *q = xb->qs;
    __m512i acc = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(g0, _mm512_loadu_si512((const void *)q)), ls_of(s16, 0));
    acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(g1, _mm512_loadu_si512((const void *)(q + 64))), ls_of(s16, 1));
    acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(g2, _mm512_loadu_si512((const void *)(q + 128))), ls_of(s16, 2));
    acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(g3, _mm512_loadu_si512((const void *)(q + 192))), ls_of(s16, 3));
    const __m256i lb = _mm256_madd_epi16(_mm512_castsi512_si256(s16), _mm256_loadu_si256((const __m256i *)xb->bsums));
    const __m512i z = _mm512_zextsi256_si512(_mm256_slli_epi32(lb, 6));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, z)), _mm512_set1_ps(d * xb->d), accf);
}

#ifndef TN_P3_PF
#define TN_P3_PF 1024
#endif
TN_INLINE float dot_p3_512(int64_t k, const void *w, const void *x) {
    const block_iq2_p3 *b = w;
    const block_q8_K *xb = x;
    const __m512i t0 = _mm512_load_si512((const void *)tn_p3_tabs[0]), t1 = _mm512_load_si512((const void *)tn_p3_tabs[1]);
    const __m512i t3 = _mm512_load_si512((const void *)tn_p3_tabs[2]), m3 = _mm512_set1_epi8(3);
    __m512 accf = _mm512_setzero_ps();
    for (int64_t i = 0; i < k / QK_K; i++) {
        _mm_prefetch((const char *)(b + i) + TN_P3_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)(b + i) + TN_P3_PF + 64, _MM_HINT_T0);
        const __m512i h = _mm512_loadu_si512((const void *)b[i].hi);
        const __m256i l = _mm256_loadu_si256((const __m256i *)b[i].lo);
        const __m512i n = _mm512_inserti64x4(_mm512_castsi256_si512(l), _mm256_srli_epi16(l, 4), 1); /* nib(j) in bits 0..3 */
        const __m512i i2 = _mm512_ternarylogic_epi32(m3, _mm512_srli_epi16(h, 6), _mm512_slli_epi16(n, 2), 0xCA);
        const __m512i s16 = scales16(b[i].scales);
        const __m512i g0 = _mm512_permutexvar_epi8(h, t0), g1 = _mm512_permutexvar_epi8(h, t1);
        const __m512i g2 = _mm512_permutexvar_epi8(i2, t0), g3 = _mm512_permutexvar_epi8(n, t3);
        accf = xp_block(g0, g1, g2, g3, s16, &xb[i], _cvtsh_ss(b[i].d), accf);
    }
    return 0.125f * _mm512_reduce_add_ps(accf);
}

/* The iq3 p4 layouts (blocks.h block_iq3_p4): a 4-bit code per element, so one VPSHUFB per 64
 * elements from a 16-entry table gives g + 64 (1..126; maddubs pairs at most 2 * 126 * 128 <
 * 2^15), then as above: odd scales by vpdpwssd, 64 * sum_h l_h bsum_h off, the blocks' exact
 * integer sums accumulated in a float vector; times 1/4 (iq3_xxs) or 1 (iq3_s). */
TN_INLINE float dot_p4_512(tn_dtype t, int64_t k, const void *w, const void *x) {
    const block_iq3_p4 *b = w;
    const block_q8_K *xb = x;
    const __m512i tab = t == TN_IQ3_XXS_P4 ? _mm512_broadcast_i32x4(_mm_setr_epi8(68, 76, 84, 92, 100, 108, 116, 126, 60, 52, 44, 36, 28, 20, 12, 2))
                                           : _mm512_broadcast_i32x4(_mm_setr_epi8(65, 67, 69, 71, 73, 75, 77, 79, 63, 61, 59, 57, 55, 53, 51, 49));
    const __m512i m4 = _mm512_set1_epi8(15);
    __m512 accf = _mm512_setzero_ps();
    for (int64_t i = 0; i < k / QK_K; i++) {
        _mm_prefetch((const char *)(b + i) + TN_P3_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)(b + i) + TN_P3_PF + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)(b + i) + TN_P3_PF + 128, _MM_HINT_T0);
        const __m512i v0 = _mm512_loadu_si512((const void *)b[i].qs), v1 = _mm512_loadu_si512((const void *)(b[i].qs + 64));
        const __m512i s16 = scales16(b[i].scales);
        const __m512i g0 = _mm512_shuffle_epi8(tab, _mm512_and_si512(v0, m4));
        const __m512i g1 = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4));
        const __m512i g2 = _mm512_shuffle_epi8(tab, _mm512_and_si512(v1, m4));
        const __m512i g3 = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4));
        accf = xp_block(g0, g1, g2, g3, s16, &xb[i], _cvtsh_ss(b[i].d), accf);
    }
    return (t == TN_IQ3_XXS_P4 ? 0.25f : 1.0f) * _mm512_reduce_add_ps(accf);
}

/* The iq1 p2 layouts (blocks.h block_iq1_p2): the grid value and the group's 1/8 shift make one
 * integer 8 g +- 1 (g = -1, 0, 1), so the block sum 8 bsum + dsum (the reference's bsum + dsum / 8,
 * times 8: exact) comes from the same products as above, times 1/8 at the end. Per 64 elements:
 * the 2-bit codes by shift and AND, one VPSHUFB to 64 + 8 (code - 1) + 1, and the groups whose
 * shift is negative (one delta byte: a VPTESTMB of it against each byte's group bit) take 2 off. */
TN_INLINE float dot_p2_512(int64_t k, const void *w, const void *x) {
    const block_iq1_p2 *b = w;
    const block_q8_K *xb = x;
    const __m512i tab = _mm512_broadcast_i32x4(_mm_setr_epi8(57, 65, 73, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64));
    const __m512i m3 = _mm512_set1_epi8(3), two = _mm512_set1_epi8(2);
    const __m512i gbit = _mm512_set_epi64(0x8080808080808080LL, 0x4040404040404040LL, 0x2020202020202020LL, 0x1010101010101010LL,
                                          0x0808080808080808LL, 0x0404040404040404LL, 0x0202020202020202LL, 0x0101010101010101LL);
    __m512 accf = _mm512_setzero_ps();
    for (int64_t i = 0; i < k / QK_K; i++) {
        _mm_prefetch((const char *)(b + i) + TN_P3_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)(b + i) + TN_P3_PF + 64, _MM_HINT_T0);
        const __m512i mg = _mm512_loadu_si512((const void *)b[i].codes);
        const __m512i s16 = scales16(b[i].scales);
        __m512i g[4];
        for (int c = 0; c < 4; c++) {
            const __m512i mc = _mm512_and_si512(_mm512_srl_epi16(mg, _mm_cvtsi32_si128(2 * c)), m3);
            const __m512i base = _mm512_shuffle_epi8(tab, mc);
            const __mmask64 neg = _mm512_test_epi8_mask(_mm512_set1_epi8((char)b[i].delta[c]), gbit);
            g[c] = _mm512_mask_sub_epi8(base, neg, base, two);
        }
        accf = xp_block(g[0], g[1], g[2], g[3], s16, &xb[i], _cvtsh_ss(b[i].d), accf);
    }
    return 0.125f * _mm512_reduce_add_ps(accf);
}

#define TN_IQ_XP_DOT512(name, T)                                                                                       \
    void tn_k_vec_dot_##name##_q8_K__avx512(int64_t k, float *s, const void *w, const void *x) {                      \
        *s = T == TN_IQ3_XXS_P4 || T == TN_IQ3_S_P4 ? dot_p4_512(T, k, w, x)                                          \
             : T == TN_IQ1_S_P2 || T == TN_IQ1_M_P2 ? dot_p2_512(k, w, x)                                             \
                                                    : dot_p3_512(k, w, x);                                            \
    }
TN_IQ_XP_TYPES(TN_IQ_XP_DOT512)

#define TN_IQ_DOT512(name, T)                                                                                          \
    void tn_k_vec_dot_##name##_q8_K__avx512(int64_t k, float *s, const void *w, const void *x) {                      \
        *s = dot_iq512(T, k, w, x);                                                                                    \
    }
TN_IQ_DOT512_TYPES(TN_IQ_DOT512)
