/*
 * peak.c (avx512) — the loops of the machine-peak probes (kern/peak.h): 512-bit streaming loads,
 * 16 independent FMA chains, 16 independent VPDPBUSD chains (needs AVX512-VNNI; the caller
 * checks). Sixteen chains cover the latency (4-5 cycles) of two pipes.
 */
#include <immintrin.h>

#include "kern/peak.h"

uint64_t tn_peak_read__avx512(const void *p, size_t bytes) {
    const uint8_t *b = p;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 256 <= bytes; i += 256) {
        s0 = _mm512_xor_si512(s0, _mm512_load_si512(b + i));
        s1 = _mm512_xor_si512(s1, _mm512_load_si512(b + i + 64));
        s2 = _mm512_xor_si512(s2, _mm512_load_si512(b + i + 128));
        s3 = _mm512_xor_si512(s3, _mm512_load_si512(b + i + 192));
    }
    const __m512i s = _mm512_xor_si512(_mm512_xor_si512(s0, s1), _mm512_xor_si512(s2, s3));
    return (uint64_t)_mm512_reduce_add_epi64(s);
}

float tn_peak_fma__avx512(int64_t iters) {
    __m512 a[16];
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int j = 0; j < 16; j++) a[j] = _mm512_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 16; j++) a[j] = _mm512_fmadd_ps(a[j], m, c);
    __m512 s = a[0];
    for (int j = 1; j < 16; j++) s = _mm512_add_ps(s, a[j]);
    return _mm512_reduce_add_ps(s);
}

int32_t tn_peak_dot__avx512(int64_t iters) {
    __m512i a[16];
    const __m512i u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(-5);
    for (int j = 0; j < 16; j++) a[j] = _mm512_set1_epi32(j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 16; j++) a[j] = _mm512_dpbusd_epi32(a[j], u, v);
    __m512i s = a[0];
    for (int j = 1; j < 16; j++) s = _mm512_add_epi32(s, a[j]);
    return _mm512_reduce_add_epi32(s);
}
