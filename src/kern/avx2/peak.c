/*
 * peak.c (avx2) — the loops of the machine-peak probes (kern/peak.h) with 256-bit vectors:
 * loads of four prefetched streams, 16 FMA chains, 12 chains of VPMADDUBSW + VPMADDWD (the AVX2 int8 dot).
 */
#include <immintrin.h>

#include "kern/peak.h"

uint64_t tn_peak_read__avx2(const void *p, size_t bytes) {
    /* four prefetched streams, as the AVX-512 loop */
    const uint8_t *b = p;
    const size_t q = bytes / 4 / 128 * 128;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < q; i += 128)
        for (int j = 0; j < 4; j++) {
            const uint8_t *x = b + (size_t)j * q + i;
            _mm_prefetch((const char *)x + TN_PEAK_PF, _MM_HINT_T2);
            _mm_prefetch((const char *)x + TN_PEAK_PF + 64, _MM_HINT_T2);
            s0 = _mm256_xor_si256(s0, _mm256_load_si256((const __m256i *)x));
            s1 = _mm256_xor_si256(s1, _mm256_load_si256((const __m256i *)(x + 32)));
            s2 = _mm256_xor_si256(s2, _mm256_load_si256((const __m256i *)(x + 64)));
            s3 = _mm256_xor_si256(s3, _mm256_load_si256((const __m256i *)(x + 96)));
        }
    for (size_t i = 4 * q; i + 32 <= bytes; i += 32) s0 = _mm256_xor_si256(s0, _mm256_loadu_si256((const __m256i *)(b + i)));
    const __m256i s = _mm256_xor_si256(_mm256_xor_si256(s0, s1), _mm256_xor_si256(s2, s3));
    return (uint64_t)_mm256_extract_epi64(s, 0) ^ (uint64_t)_mm256_extract_epi64(s, 1) ^
           (uint64_t)_mm256_extract_epi64(s, 2) ^ (uint64_t)_mm256_extract_epi64(s, 3);
}

float tn_peak_fma__avx2(int64_t iters) {
    __m256 a[16];
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int j = 0; j < 16; j++) a[j] = _mm256_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 16; j++) a[j] = _mm256_fmadd_ps(a[j], m, c);
    __m256 s = a[0];
    for (int j = 1; j < 16; j++) s = _mm256_add_ps(s, a[j]);
    float f[8];
    _mm256_storeu_ps(f, s);
    return f[0] + f[7];
}

/* Each chain feeds its own accumulator back as the u8 operand, so nothing is loop-invariant;
 * 12 chains cover the ~11-cycle maddubs + madd + add latency (16 ymm registers in AVX2). */
uint32_t tn_peak_dot__avx2(int64_t iters) {
    __m256i a[12];
    const __m256i v = _mm256_set1_epi8(-5), one = _mm256_set1_epi16(1);
    for (int j = 0; j < 12; j++) a[j] = _mm256_set1_epi32(j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 12; j++) a[j] = _mm256_add_epi32(a[j], _mm256_madd_epi16(_mm256_maddubs_epi16(a[j], v), one));
    __m256i s = a[0];
    for (int j = 1; j < 12; j++) s = _mm256_add_epi32(s, a[j]);
    return (uint32_t)_mm256_extract_epi32(s, 0) + (uint32_t)_mm256_extract_epi32(s, 7); /* (wraps: no int overflow) */
}
