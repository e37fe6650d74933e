/*
 * tq.c (AVX2) — fused dequant-dot for tern's any-bit types (body in kern/avx2/tq_dot.inc).
 * maddubs saturates at +-32767, so 8-bit codes (q <= 255) are split q = (q & 127) + (q & 128)
 * into two exact products; <= 7-bit codes use one.
 */
#include <immintrin.h>
#include <string.h>

#include "core/fp16.h"
#include "kern/avx2/simd.h"
#include "kern/kern.h"
#include "kern/tq_list.inc"
#include "quant/tq.h"

static inline __m256i tq_dot_u8s8_avx2(__m256i q, __m256i a) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i lo = _mm256_and_si256(q, _mm256_set1_epi8(127));
    const __m256i hi = _mm256_and_si256(q, _mm256_set1_epi8((char)128));
    /* hi bytes are 0 or 128: 128*a summed in pairs fits in i16 (|.| <= 32768 -> use madd on a) */
    __m256i r = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a), ones);
    const __m256i hsel = _mm256_cmpeq_epi8(hi, _mm256_set1_epi8((char)128));
    const __m256i ah = _mm256_and_si256(a, hsel); /* a where q >= 128 */
    const __m256i sh = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), ah), ones);
    return _mm256_add_epi32(r, _mm256_slli_epi32(sh, 7));
}

static inline __m256i tq_dot_u7s8_avx2(__m256i q, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), _mm256_set1_epi16(1));
}

static inline __m256i tq_sum_s8_avx2(__m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), a), _mm256_set1_epi16(1));
}

#define TQ_EXPAND1(u) _mm256_and_si256(tn_bits32_to_bytes(u), _mm256_set1_epi8(1))
#define TQ_DOT_U8S8(q, a) (bits == 8 ? tq_dot_u8s8_avx2(q, a) : tq_dot_u7s8_avx2(q, a))
#define TQ_SUM_S8(a) tq_sum_s8_avx2(a)
#include "kern/avx2/tq_dot.inc"

void tn_kern_register_tq_avx2(tn_kern_table *t) { tq_register(t, TN_ISA_AVX2); }
