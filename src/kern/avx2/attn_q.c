/*
 * attn_q.c (avx2) — attention over a quantized KV cache (contract: kern.h tn_attn_q_fn; reference:
 * scalar/attn.c tn_k_attn_q__scalar) for CPUs without AVX-512: one query head at a time, the
 * reference's online softmax step by step (expf per key, a rescale at every new maximum), vectorised
 * over the head dimension:
 *   - a quantized K: each 32-value block's integer dot with the head's q8_0 query block by VPMADDWD
 *     on sign-extended values (exact), then the reference's float arithmetic in its order (q8_0:
 *     sumi * (d_K d_q); q4_0: (sumi d_K) d_q), so the scores are the reference's bits; an f16 K is
 *     dotted in floats 8 lanes at a time (the sum's order differs from the reference);
 *   - V dequantized 8 values at a time (value * d, the dequantizers' arithmetic) and added with one
 *     fused multiply-add per value, the accumulator f32, or f16-rounded after every update for an
 *     f16 V with acc16 — the reference's operations, so with a quantized K the output is the
 *     reference's bits.
 * Per-channel K (tn_attn_kc_fn) through the same head loop: a complete group's 16 scores as
 * q' . codes + q . m (q' = q d from the group's (d, m) pairs), the open group's keys from the f16
 * window as an f16 K.
 * Parity: tests/attn/test_attn_q.c and test_attn_kc.c (every ISA against the reference). Speed: bench_kern --attn
 * --isa avx2.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kern/avx2/simd.h"
#include "kern/kern.h"
#include "quant/kc.h"
#include "quant/quant.h"
#include "quant/tq.h"

void tn_k_attn_q__scalar(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, int32_t tk, const void *K,
                         size_t k_rb, int32_t tv, const void *V, size_t v_rb, const int32_t *blocks, int64_t block_rows,
                         float scale, float cap, bool acc16, float *out, float *scratch);
void tn_k_attn_kc__scalar(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, int kbits, const void *K,
                          size_t k_rb, const uint16_t *Kw, int64_t ldw, int64_t W, int32_t tv, const void *V, size_t v_rb,
                          const int32_t *blocks, float scale, float cap, bool acc16, float *out, float *scratch);

#define LOADH(P) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P)))
#define R16(X) _mm256_cvtph_ps(_mm256_cvtps_ph((X), _MM_FROUND_TO_NEAREST_INT)) /* round to f16 and back */
#define TN_AQ2_CHUNK 16 /* positions whose rows are looked up at once (one division) */

static inline int tn_hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

static inline float tn_hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 int8 x int8 products of one block, summed (exact): a and b as two halves of 16. */
static inline int tn_aq2_isum(__m128i a0, __m128i a1, __m128i b0, __m128i b1) {
    const __m256i p0 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(a0), _mm256_cvtepi8_epi16(b0));
    const __m256i p1 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(a1), _mm256_cvtepi8_epi16(b1));
    return tn_hsum_epi32(_mm256_add_epi32(p0, p1));
}

/* q . k for one key row k of type tk: quantized K against the q8_0 query qb (nq blocks), f16 K
 * against the floats qf (hd values). */
static inline float tn_aq2_score(int32_t tk, const uint8_t *k, const block_q8_0 *qb, const float *qf, int64_t hd) {
    float sumf = 0.0f;
    if (tk == TN_Q8_0) {
        const block_q8_0 *kb = (const block_q8_0 *)k;
        for (int64_t j = 0; j < hd / 32; j++) {
            const int sumi = tn_aq2_isum(_mm_loadu_si128((const __m128i *)kb[j].qs), _mm_loadu_si128((const __m128i *)(kb[j].qs + 16)),
                                         _mm_loadu_si128((const __m128i *)qb[j].qs), _mm_loadu_si128((const __m128i *)(qb[j].qs + 16)));
            sumf += (float)sumi * (_cvtsh_ss(kb[j].d) * _cvtsh_ss(qb[j].d));
        }
    } else if (tk == TN_Q4_0) {
        const block_q4_0 *kb = (const block_q4_0 *)k;
        const __m128i m4 = _mm_set1_epi8(0x0F), e8 = _mm_set1_epi8(8);
        for (int64_t j = 0; j < hd / 32; j++) {
            const __m128i x = _mm_loadu_si128((const __m128i *)kb[j].qs);
            const __m128i lo = _mm_sub_epi8(_mm_and_si128(x, m4), e8), hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), m4), e8);
            const int sumi = tn_aq2_isum(lo, hi, _mm_loadu_si128((const __m128i *)qb[j].qs),
                                         _mm_loadu_si128((const __m128i *)(qb[j].qs + 16)));
            sumf += ((float)sumi * _cvtsh_ss(kb[j].d)) * _cvtsh_ss(qb[j].d);
        }
    } else {
        __m256 a = _mm256_setzero_ps();
        for (int64_t i = 0; i < hd; i += 8) a = _mm256_fmadd_ps(LOADH((const uint16_t *)k + i), _mm256_loadu_ps(qf + i), a);
        sumf = tn_hsum_ps(a);
    }
    return sumf;
}

/* V values 8 j .. 8 j + 7 of the row v (type tv) as floats: value * d as the dequantizers do. */
static inline __m256 tn_aq2_v8(int32_t tv, const uint8_t *v, int64_t j) {
    if (tv == TN_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)v + j / 4;
        const __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * (j & 3)))));
        return _mm256_mul_ps(x, _mm256_set1_ps(_cvtsh_ss(b->d)));
    }
    if (tv == TN_Q4_0) { /* values 0..15 are the low nibbles of qs[0..15], 16..31 the high ones */
        const block_q4_0 *b = (const block_q4_0 *)v + j / 4;
        __m128i n = _mm_loadl_epi64((const __m128i *)(b->qs + 8 * (j & 1)));
        if (j & 2) n = _mm_srli_epi16(n, 4);
        n = _mm_sub_epi8(_mm_and_si128(n, _mm_set1_epi8(0x0F)), _mm_set1_epi8(8));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(n)), _mm256_set1_ps(_cvtsh_ss(b->d)));
    }
    return LOADH((const uint16_t *)v + 8 * j);
}

/* The 32 codes of tq planes (b = 2, 3, 4: planes 2 | 2 + 1 | 4, quant/tq.h) at pl, in element order. */
static inline __m256i tn_aq2_codes(const uint8_t *pl, int bits) {
    if (bits == 4) {
        const __m128i x = _mm_loadu_si128((const __m128i *)pl), m = _mm_set1_epi8(0x0F);
        return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
    }
    const __m128i x = _mm_loadl_epi64((const __m128i *)pl), m = _mm_set1_epi8(3);
    const __m128i s0 = _mm_and_si128(x, m), s1 = _mm_and_si128(_mm_srli_epi16(x, 2), m);
    const __m128i s2 = _mm_and_si128(_mm_srli_epi16(x, 4), m), s3 = _mm_and_si128(_mm_srli_epi16(x, 6), m);
    __m256i q = _mm256_set_m128i(_mm_unpacklo_epi64(s2, s3), _mm_unpacklo_epi64(s0, s1));
    if (bits == 3) { /* the 1-bit plane: bit n of the u32 after the 2-bit plane is code n's bit 2 */
        uint32_t u;
        memcpy(&u, pl + 8, 4);
        q = _mm256_or_si256(q, _mm256_and_si256(tn_bits32_to_bytes(u), _mm256_set1_epi8(4)));
    }
    return q;
}

/* Per-channel K: one complete group's scores (16 rows kr) for the query q: q' = q d and q . m from
 * the group's (d, m) pairs, then q' . codes + q . m per key (quant/kc.h). */
static void tn_aq2_kc_group(int64_t hd, int bits, const uint8_t *const *kr, const float *q, float *sc) {
    const size_t cb = (size_t)(4 * bits + 8);
    _Alignas(32) float qd[256];
    __m256 cm = _mm256_setzero_ps();
    for (int64_t j = 0; j < hd / 32; j++) {
        _Alignas(32) uint16_t st[64]; /* d0 m0 d1 m1 .. d31 m31 */
        for (int r = 0; r < 16; r++) memcpy(st + 4 * r, kr[r] + (size_t)j * cb, 8);
        for (int i = 0; i < 64; i += 16) { /* 8 (d, m) pairs: even lanes d, odd m */
            const __m256 a = LOADH(st + i), b = LOADH(st + i + 8); /* d m d m .. of channels i/2 .. i/2 + 3, + 4 .. + 7 */
            const __m256i ev = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6), od = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
            const __m256 d = _mm256_blend_ps(_mm256_permutevar8x32_ps(a, ev), _mm256_permutevar8x32_ps(b, ev), 0xF0);
            const __m256 mm = _mm256_blend_ps(_mm256_permutevar8x32_ps(a, od), _mm256_permutevar8x32_ps(b, od), 0xF0);
            const __m256 qv = _mm256_loadu_ps(q + 32 * j + i / 2);
            _mm256_store_ps(qd + 32 * j + i / 2, _mm256_mul_ps(qv, d));
            cm = _mm256_fmadd_ps(qv, mm, cm);
        }
    }
    const float c0 = tn_hsum_ps(cm);
    for (int r = 0; r < 16; r++) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t j = 0; j < hd / 32; j++) {
            const __m256i c = tn_aq2_codes(kr[r] + (size_t)j * cb + 8, bits);
            const __m128i lo = _mm256_castsi256_si128(c), hi = _mm256_extracti128_si256(c, 1);
            a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), _mm256_load_ps(qd + 32 * j), a);
            a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), _mm256_load_ps(qd + 32 * j + 8), a);
            a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), _mm256_load_ps(qd + 32 * j + 16), a);
            a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), _mm256_load_ps(qd + 32 * j + 24), a);
        }
        sc[r] = tn_hsum_ps(a) + c0;
    }
}

/* One query head over its kv head's rows (K, V at the kv head's first block of row 0); kc_bits > 0:
 * a per-channel K (complete groups from K, the keys from Qk on from the window Kw: position t's
 * row at Kw + (t % Wn) * ldw, the kv head's first value). */
static void tn_aq2_head(int64_t hd, int64_t T, const float *q, int32_t tk, const uint8_t *K, size_t k_rb, int32_t tv,
                        const uint8_t *V, size_t v_rb, const int32_t *blocks, int64_t block_rows, float scale, float cap,
                        bool acc16, float *out, int kc_bits, const uint16_t *Kw, int64_t ldw, int64_t Wn) {
    const bool vacc16 = acc16 && tv == TN_F16;
    const int64_t nb = hd / 8;
    _Alignas(32) float qf[256], acc[256];
    block_q8_0 qb[8];
    const int64_t Qk = kc_bits ? T - T % TN_AQ2_CHUNK : 0;
    if (tk == TN_F16 || kc_bits)
        for (int64_t i = 0; i < hd; i += 8) {
            const __m256 x = _mm256_loadu_ps(q + i);
            _mm256_store_ps(qf + i, acc16 ? R16(x) : x);
        }
    else
        tn_quantize_row_q8_0_act(q, qb, hd); /* the reference's query quantizer */
    for (int64_t i = 0; i < hd; i += 8) _mm256_store_ps(acc + i, _mm256_setzero_ps());
    float M = -INFINITY, S = 0.0f;
    int64_t rows[TN_AQ2_CHUNK];
    for (int64_t t0 = 0; t0 < T; t0 += TN_AQ2_CHUNK) {
        const int nt = T - t0 < TN_AQ2_CHUNK ? (int)(T - t0) : TN_AQ2_CHUNK;
        tn_kv_rows(blocks, block_rows, t0, nt, rows);
        float gs[TN_AQ2_CHUNK];
        const bool group = kc_bits && t0 < Qk; /* a complete per-channel group: its 16 scores first */
        if (group) {
            const uint8_t *kr[TN_AQ2_CHUNK];
            for (int i = 0; i < TN_AQ2_CHUNK; i++) kr[i] = K + (size_t)rows[i] * k_rb;
            tn_aq2_kc_group(hd, kc_bits, kr, q, gs);
        }
        for (int i = 0; i < nt; i++) {
            const uint8_t *k = kc_bits ? (const uint8_t *)(Kw + (size_t)((t0 + i) % Wn) * (size_t)ldw) : K + (size_t)rows[i] * k_rb;
            const uint8_t *v = V + (size_t)rows[i] * v_rb;
            float s = (group ? gs[i] : tn_aq2_score(kc_bits ? TN_F16 : tk, k, qb, qf, hd)) * scale;
            if (cap > 0) s = cap * tanhf(s);
            float ms = 1.0f, vs = 1.0f;
            if (s > M) { /* new maximum: rescale what was accumulated */
                const float Mold = M;
                M = s;
                ms = expf(Mold - M);
                const __m256 vms = _mm256_set1_ps(ms);
                for (int64_t j = 0; j < nb; j++) {
                    __m256 a = _mm256_mul_ps(_mm256_load_ps(acc + 8 * j), vms);
                    _mm256_store_ps(acc + 8 * j, vacc16 ? R16(a) : a);
                }
            } else {
                vs = expf(s - M);
            }
            const __m256 vvs = _mm256_set1_ps(vs);
            for (int64_t j = 0; j < nb; j++) {
                __m256 a = _mm256_fmadd_ps(tn_aq2_v8(tv, v, j), vvs, _mm256_load_ps(acc + 8 * j));
                _mm256_store_ps(acc + 8 * j, vacc16 ? R16(a) : a);
            }
            S = S * ms + vs;
        }
    }
    const __m256 inv = _mm256_set1_ps(S == 0.0f ? 0.0f : 1.0f / S);
    for (int64_t i = 0; i < hd; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_load_ps(acc + i), inv));
}


static void tn_k_attn_q__avx2(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, int32_t tk, const void *K,
                              size_t k_rb, int32_t tv, const void *V, size_t v_rb, const int32_t *blocks,
                              int64_t block_rows, float scale, float cap, bool acc16, float *out, float *scratch) {
    /* only an f16 pair can have heads that are not whole blocks; tern's tq<b>g32a rows have no AVX2
     * kernel yet: the reference */
    if (hd % 32 || hd > 256 || tn_tq_is((uint32_t)tk) || tn_tq_is((uint32_t)tv)) {
        tn_k_attn_q__scalar(hd, T, nh, rep, q, tk, K, k_rb, tv, V, v_rb, blocks, block_rows, scale, cap, acc16, out, scratch);
        return;
    }
    const float sc = cap > 0 ? scale / cap : scale;
    for (int64_t j = 0; j < nh; j++)
        tn_aq2_head(hd, T, q + j * hd, tk, (const uint8_t *)K + tn_kv_head_off(tk, hd, j / rep), k_rb, tv,
                    (const uint8_t *)V + tn_kv_head_off(tv, hd, j / rep), v_rb, blocks, block_rows, sc, cap, acc16,
                    out + j * hd, 0, NULL, 0, 0);
}

/* Per-channel K (kern.h tn_attn_kc_fn): tn_aq2_head with tn_aq2_kc_group's group scores. */
static void tn_k_attn_kc__avx2(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, int kbits, const void *K,
                               size_t k_rb, const uint16_t *Kw, int64_t ldw, int64_t Wn, int32_t tv, const void *V,
                               size_t v_rb, const int32_t *blocks, float scale, float cap, bool acc16, float *out,
                               float *scratch) {
    if (hd % 32 || hd > 256 || tn_tq_is((uint32_t)tv)) { /* a tq V has no AVX2 kernel: the reference */
        tn_k_attn_kc__scalar(hd, T, nh, rep, q, kbits, K, k_rb, Kw, ldw, Wn, tv, V, v_rb, blocks, scale, cap, acc16, out, scratch);
        return;
    }
    const float sc = cap > 0 ? scale / cap : scale;
    const int32_t tk = tn_kc_dtype(kbits);
    for (int64_t j = 0; j < nh; j++)
        tn_aq2_head(hd, T, q + j * hd, tk, (const uint8_t *)K + tn_kc_row_bytes(kbits, (j / rep) * hd), k_rb, tv,
                    (const uint8_t *)V + tn_kv_head_off(tv, hd, j / rep), v_rb, blocks, TN_KC_ROWS, sc, cap, acc16,
                    out + j * hd, kbits, Kw + (j / rep) * hd, ldw, Wn);
}

void tn_kern_register_attn_q_avx2(tn_kern_table *t) {
    t->attn_kc = tn_k_attn_kc__avx2;
    t->attn_q = tn_k_attn_q__avx2;
    t->attn_q_isa = TN_ISA_AVX2;
}
