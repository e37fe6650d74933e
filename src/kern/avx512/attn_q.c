/*
 * attn_q.c (avx512) — attention over a quantized KV cache (contract: kern.h tn_attn_q_fn; reference:
 * scalar/attn.c tn_k_attn_q__scalar). The query heads that share a kv head go through the keys
 * together: each K row's q8_0 / q4_0 blocks are widened once per head's integer dot (32 int8 x int8
 * products by VPMADDWD, summed exactly), each V block is dequantized once into two vectors and
 * accumulated into every head of the group. The arithmetic is the reference's step by step (the
 * integer block sums are exact, the per-block float products and their sum in the same order, the
 * softmax with expf / tanhf per key, V dequantized as value * d, then one fused multiply-add), so a
 * quantized K gives the reference's bits; an f16 K's dot product is summed 16 lanes at a time
 * (order differs: parity-tested with a tolerance).
 */
#include <immintrin.h>
#include <math.h>

#include "core/fp16.h"
#include "kern/kern.h"
#include "quant/quant.h"

#define TN_AQ_MAXH 8 /* query heads of one kv group per pass */

/* Byte offset of kv head g (hd values of type t) in a row. */
static inline size_t tn_aq_head_off(int32_t t, int64_t hd, int64_t g) {
    return t == TN_Q8_0 ? (size_t)(g * hd / 32) * sizeof(block_q8_0)
         : t == TN_Q4_0 ? (size_t)(g * hd / 32) * sizeof(block_q4_0) : (size_t)(g * hd) * 2;
}

/* 32 int8 x int8 products of one block, summed (exact). */
static inline int tn_aq_isum(__m256i a8, __m256i b8) {
    return _mm512_reduce_add_epi32(_mm512_madd_epi16(_mm512_cvtepi8_epi16(a8), _mm512_cvtepi8_epi16(b8)));
}

static inline float tn_aq_dot_q8(const block_q8_0 *k, const block_q8_0 *x, int64_t nb) {
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++) {
        const int sumi = tn_aq_isum(_mm256_loadu_si256((const __m256i *)k[i].qs), _mm256_loadu_si256((const __m256i *)x[i].qs));
        const float d = tn_fp16_to_fp32(k[i].d) * tn_fp16_to_fp32(x[i].d);
        sumf += (float)sumi * d;
    }
    return sumf;
}

static inline float tn_aq_dot_q4(const block_q4_0 *k, const block_q8_0 *x, int64_t nb) {
    float sumf = 0;
    const __m128i m4 = _mm_set1_epi8(0x0F), e8 = _mm_set1_epi8(8);
    for (int64_t i = 0; i < nb; i++) {
        const __m128i b = _mm_loadu_si128((const __m128i *)k[i].qs);
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(b, m4), e8), hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), m4), e8);
        const int sumi = tn_aq_isum(_mm256_set_m128i(hi, lo), _mm256_loadu_si256((const __m256i *)x[i].qs));
        const float dk = (float)sumi * tn_fp16_to_fp32(k[i].d);
        sumf += dk * tn_fp16_to_fp32(x[i].d);
    }
    return sumf;
}

static inline float tn_aq_dot_f16(const uint16_t *k, const float *q, int64_t hd) {
    __m512 a = _mm512_setzero_ps();
    for (int64_t i = 0; i < hd; i += 16)
        a = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + i))), _mm512_loadu_ps(q + i), a);
    return _mm512_reduce_add_ps(a);
}

/* V values 16 * j .. 16 * j + 15 of the row v (type tv) as floats: value * d as the dequantizers do. */
static inline __m512 tn_aq_v16(int32_t tv, const uint8_t *v, int64_t j) {
    if (tv == TN_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)v + j / 2;
        const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16 * (j & 1)))));
        return _mm512_mul_ps(x, _mm512_set1_ps(tn_fp16_to_fp32(b->d)));
    }
    if (tv == TN_Q4_0) {
        const block_q4_0 *b = (const block_q4_0 *)v + j / 2;
        __m128i n = _mm_loadu_si128((const __m128i *)b->qs);
        if (j & 1) n = _mm_srli_epi16(n, 4);
        n = _mm_sub_epi8(_mm_and_si128(n, _mm_set1_epi8(0x0F)), _mm_set1_epi8(8));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(n)), _mm512_set1_ps(tn_fp16_to_fp32(b->d)));
    }
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)v + 16 * j)));
}

/* H query heads (q, out, scratch consecutive per head) over one kv head's rows. hd % 16 == 0. */
static void tn_aq_group(int64_t hd, int64_t T, int64_t H, const float *q, int32_t tk, const uint8_t *K, size_t k_rb,
                        int32_t tv, const uint8_t *V, size_t v_rb, const int32_t *blocks, int64_t block_rows,
                        float scale, float cap, bool acc16, float *out, float *scratch) {
    const bool vacc16 = acc16 && tv == TN_F16;
    float M[TN_AQ_MAXH], S[TN_AQ_MAXH], ms[TN_AQ_MAXH], vs[TN_AQ_MAXH];
    for (int64_t h = 0; h < H; h++) {
        float *qv = scratch + 2 * hd * h, *acc = qv + hd;
        if (tk == TN_F16)
            for (int64_t i = 0; i < hd; i++) qv[i] = acc16 ? tn_fp16_to_fp32(tn_fp32_to_fp16(q[h * hd + i])) : q[h * hd + i];
        else
            tn_quantize_row_q8_0_act(q + h * hd, (block_q8_0 *)qv, hd);
        for (int64_t i = 0; i < hd; i++) acc[i] = 0.0f;
        M[h] = -INFINITY, S[h] = 0.0f;
    }
    for (int64_t t = 0; t < T; t++) {
        const int64_t row = tn_kv_row(blocks, block_rows, t);
        const uint8_t *k = K + (size_t)row * k_rb, *v = V + (size_t)row * v_rb;
        if (t + 1 < T) { /* the next rows: their first lines */
            const int64_t nx = tn_kv_row(blocks, block_rows, t + 1);
            __builtin_prefetch(K + (size_t)nx * k_rb, 0, 3);
            __builtin_prefetch(V + (size_t)nx * v_rb, 0, 3);
        }
        for (int64_t h = 0; h < H; h++) {
            float *qv = scratch + 2 * hd * h, *acc = qv + hd;
            float s = tk == TN_Q8_0 ? tn_aq_dot_q8((const block_q8_0 *)k, (const block_q8_0 *)qv, hd / 32)
                    : tk == TN_Q4_0 ? tn_aq_dot_q4((const block_q4_0 *)k, (const block_q8_0 *)qv, hd / 32)
                                    : tn_aq_dot_f16((const uint16_t *)k, qv, hd);
            s *= scale;
            if (cap > 0) s = cap * tanhf(s);
            ms[h] = 1.0f, vs[h] = 1.0f;
            if (s > M[h]) { /* new maximum: rescale what was accumulated */
                const float Mold = M[h];
                M[h] = s;
                ms[h] = expf(Mold - s);
                const __m512 m = _mm512_set1_ps(ms[h]);
                for (int64_t i = 0; i < hd; i += 16) {
                    __m512 a = _mm512_mul_ps(_mm512_loadu_ps(acc + i), m);
                    if (vacc16) a = _mm512_cvtph_ps(_mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
                    _mm512_storeu_ps(acc + i, a);
                }
            } else {
                vs[h] = expf(s - M[h]);
            }
            S[h] = S[h] * ms[h] + vs[h];
        }
        for (int64_t j = 0; j < hd / 16; j++) {
            const __m512 x = tn_aq_v16(tv, v, j);
            for (int64_t h = 0; h < H; h++) {
                float *acc = scratch + 2 * hd * h + hd + 16 * j;
                __m512 a = _mm512_fmadd_ps(x, _mm512_set1_ps(vs[h]), _mm512_loadu_ps(acc));
                if (vacc16) a = _mm512_cvtph_ps(_mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
                _mm512_storeu_ps(acc, a);
            }
        }
    }
    for (int64_t h = 0; h < H; h++) {
        const float *acc = scratch + 2 * hd * h + hd;
        const float inv = S[h] == 0.0f ? 0.0f : 1.0f / S[h];
        for (int64_t i = 0; i < hd; i++) out[h * hd + i] = acc[i] * inv;
    }
}

void tn_k_attn_q__scalar(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, int32_t tk, const void *K,
                         size_t k_rb, int32_t tv, const void *V, size_t v_rb, const int32_t *blocks, int64_t block_rows,
                         float scale, float cap, bool acc16, float *out, float *scratch);

static void tn_k_attn_q__avx512(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, int32_t tk, const void *K,
                                size_t k_rb, int32_t tv, const void *V, size_t v_rb, const int32_t *blocks,
                                int64_t block_rows, float scale, float cap, bool acc16, float *out, float *scratch) {
    if (hd % 16) { /* only an f16 pair can have such heads; the reference takes them */
        tn_k_attn_q__scalar(hd, T, nh, rep, q, tk, K, k_rb, tv, V, v_rb, blocks, block_rows, scale, cap, acc16, out, scratch);
        return;
    }
    const float sc = cap > 0 ? scale / cap : scale;
    for (int64_t j0 = 0; j0 < nh;) { /* heads j0 .. j1 - 1 share kv head j0 / rep */
        const int64_t g = j0 / rep;
        int64_t j1 = (g + 1) * rep;
        if (j1 > nh) j1 = nh;
        if (j1 - j0 > TN_AQ_MAXH) j1 = j0 + TN_AQ_MAXH;
        tn_aq_group(hd, T, j1 - j0, q + j0 * hd, tk, (const uint8_t *)K + tn_aq_head_off(tk, hd, g), k_rb, tv,
                    (const uint8_t *)V + tn_aq_head_off(tv, hd, g), v_rb, blocks, block_rows, sc, cap, acc16,
                    out + j0 * hd, scratch + 2 * hd * j0);
        j0 = j1;
    }
}

void tn_kern_register_attn_q_avx512(tn_kern_table *t) {
    t->attn_q = tn_k_attn_q__avx512;
    t->attn_q_isa = TN_ISA_AVX512;
}
