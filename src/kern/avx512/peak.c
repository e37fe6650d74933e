/*
 * peak.c (avx512) — the loops of the machine-peak probes (kern/peak.h): 512-bit loads of four
 * prefetched streams,
 * 16 independent FMA chains, 16 independent VPDPBUSD chains (needs AVX512-VNNI; the caller
 * checks). Sixteen chains cover the latency (4-5 cycles) of two pipes.
 */
#include <immintrin.h>

#include "kern/peak.h"

uint64_t tn_peak_read__avx512(const void *p, size_t bytes) {
    /* four sequential streams (the quarters of the buffer), each prefetched TN_PEAK_PF bytes
     * ahead into L2: a single stream left to the hardware prefetchers reads ~25-45% slower
     * (one and two threads on the development machine) than the decode kernels that do this */
    const uint8_t *b = p;
    const size_t q = bytes / 4 / 128 * 128;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < q; i += 128)
        for (int j = 0; j < 4; j++) {
            const uint8_t *x = b + (size_t)j * q + i;
            _mm_prefetch((const char *)x + TN_PEAK_PF, _MM_HINT_T2);
            _mm_prefetch((const char *)x + TN_PEAK_PF + 64, _MM_HINT_T2);
            s0 = _mm512_xor_si512(s0, _mm512_load_si512(x));
            s1 = _mm512_xor_si512(s1, _mm512_load_si512(x + 64));
        }
    for (size_t i = 4 * q; i + 64 <= bytes; i += 64) s2 = _mm512_xor_si512(s2, _mm512_loadu_si512(b + i));
    const __m512i s = _mm512_xor_si512(_mm512_xor_si512(s0, s1), _mm512_xor_si512(s2, s3));
    uint64_t lane[8], r = 0; /* the lanes folded by xor, as the AVX2 loop (no signed sum to overflow) */
    _mm512_storeu_si512(lane, s);
    for (int j = 0; j < 8; j++) r ^= lane[j];
    return r;
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

uint32_t tn_peak_dot__avx512(int64_t iters) {
    __m512i a[16];
    const __m512i u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(-5);
    for (int j = 0; j < 16; j++) a[j] = _mm512_set1_epi32(j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 16; j++) a[j] = _mm512_dpbusd_epi32(a[j], u, v);
    __m512i s = a[0];
    for (int j = 1; j < 16; j++) s = _mm512_add_epi32(s, a[j]);
    /* the lanes summed as unsigned: the chains pass INT32_MIN on long runs (they wrap in the vector
     * registers), and _mm512_reduce_add_epi32 adds them as int, which overflows there */
    uint32_t lane[16], r = 0;
    _mm512_storeu_si512(lane, s);
    for (int j = 0; j < 16; j++) r += lane[j];
    return r;
}
