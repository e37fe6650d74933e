/*
 * vmath.h (avx512) — vector helpers shared by the attention kernels (attn.c, attn_q.c): exp and tanh
 * of 16 lanes, and the transposing sum of 16 vectors.
 */
#ifndef TN_KERN_AVX512_VMATH_H
#define TN_KERN_AVX512_VMATH_H

#include <immintrin.h>

/* exp(x) for 16 lanes: x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts), e^r by its Taylor
 * polynomial to degree 7 (truncation < 6e-9 relative), times 2^n by VSCALEFPS. Inputs are
 * clamped to [-87.3, 88.7]: the result stays finite and normal (SwiGLU divides by 1 + e^x). */
static inline __m512 tn_exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  /* ln2 high part (exact n * it) */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);       /* ln2 low part                */
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* tanh(x) for 16 lanes, within a few 1e-7 relative: |x| >= 0.2: (1 - e) / (1 + e) with e =
 * exp(-2 |x|) (tn_exp512; 1 - e >= 0.33, so no cancellation), sign restored; below: its odd
 * Taylor series to x^9 (the next term is < 1e-9 relative there). The reference calls tanhf. */
static inline __m512 tn_tanh512(__m512 x) {
    const __m512 ax = _mm512_abs_ps(x), x2 = _mm512_mul_ps(x, x);
    const __m512 e = tn_exp512(_mm512_mul_ps(ax, _mm512_set1_ps(-2.0f)));
    __m512 t = _mm512_div_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), e), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    t = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), _mm512_and_si512(_mm512_castps_si512(x),
                                                                                      _mm512_set1_epi32((int)0x80000000))));
    __m512 p = _mm512_set1_ps(62.0f / 2835.0f); /* x (1 - x^2/3 + 2x^4/15 - 17x^6/315 + 62x^8/2835) */
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-17.0f / 315.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.0f / 15.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.0f / 3.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(1.0f));
    const __mmask16 small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.2f), _CMP_LT_OQ);
    return _mm512_mask_mul_ps(t, small, p, x);
}

/* Lane i = the sum of the 16 lanes of v[i]: a transposing tree of 15 adds (a horizontal sum per
 * vector costs about four times as much on Zen 4). */
static inline __m512 tn_sum16(const __m512 *v) {
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++) /* per 128-bit lane: a0+a2, b0+b2, a1+a3, b1+b3 */
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* per 128-bit lane: the lane's sums of v[4i .. 4i + 3] */
        u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44), _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
    const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
    const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
}

#endif
