/*
 * simd.h (avx2) — small AVX2/FMA/F16C helpers shared by the kernels of this folder and by the
 * avx512 folder (which compiles the same templates with VNNI). Include only from files compiled
 * with at least -mavx2 -mfma -mf16c (src/kern/avx2/, src/kern/avx512/).
 *
 * Nothing here allocates or touches global state; everything is inlined.
 */
#ifndef TN_KERN_AVX2_SIMD_H
#define TN_KERN_AVX2_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quant/blocks.h"

#define TN_INLINE static inline __attribute__((always_inline))
#define TN_NOINLINE static __attribute__((noinline))

/* Kernel name for the current ISA folder: TN_KNAME(vec_dot_q4_0_q8_0) -> tn_k_vec_dot_q4_0_q8_0__avx2 */
#define TN_KNAME_(op, isa) tn_k_##op##__##isa
#define TN_KNAME_X(op, isa) TN_KNAME_(op, isa)
#define TN_KNAME(op) TN_KNAME_X(op, TN_ISA)

TN_INLINE float tn_hsum_ps128(__m128 v) {
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
}

TN_INLINE float tn_hsum_ps256(__m256 v) {
    return tn_hsum_ps128(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

/* [hsum(a), hsum(b), hsum(c), hsum(d)]: four tile results in one 128-bit store. */
TN_INLINE __m128 tn_hsum4_ps256(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 ab = _mm256_hadd_ps(a, b);
    const __m256 cd = _mm256_hadd_ps(c, d);
    const __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

TN_INLINE uint16_t tn_ld16(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* An fp16 scalar from memory, converted exactly (F16C) and broadcast to 8 lanes. */
TN_INLINE __m256 tn_bcast_h(const void *p) { return _mm256_cvtph_ps(_mm_set1_epi16((short)tn_ld16(p))); }

/* An fp16 scalar from memory, converted exactly (F16C). */
TN_INLINE float tn_h2f(const void *p) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(tn_ld16(p)))); }

/* 16 packed nibble bytes -> 32 bytes in ggml block order: low nibbles of qs[0..15] become
 * elements 0..15, high nibbles elements 16..31. */
TN_INLINE __m256i tn_nib32(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes, byte j = 0xFF if bit j is set (ggml qh order: bit j is element j). */
TN_INLINE __m256i tn_bits32_to_bytes(uint32_t bits) {
    const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                                            0x0303030303030303);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}

/* 32 code bytes -> 4 x 8 floats (element order), minus an integer offset; exact. */
TN_INLINE void tn_codes_f32(__m256i u, int is_signed, int off, __m256 f[4]) {
    const __m128i lo = _mm256_castsi256_si128(u), hi = _mm256_extracti128_si256(u, 1);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int r = 0; r < 4; r++) {
        const __m256i v = is_signed ? _mm256_cvtepi8_epi32(part[r]) : _mm256_cvtepu8_epi32(part[r]);
        f[r] = _mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_set1_epi32(off)));
    }
}

#endif
