/*
 * attn_q.c (avx512) — attention over a quantized KV cache (contract: kern.h tn_attn_q_fn; reference:
 * scalar/attn.c tn_k_attn_q__scalar), built as the f16 kernel (attn.c) is: the query heads that
 * share a kv head go through the keys together, 16 keys at a time, their H x hd / 16 accumulators
 * of 16 floats in registers while V is added:
 *   - scores, quantized K: each 32-value block of a key is widened to int16 once (q8_0 sign-
 *     extended; q4_0 nibbles minus 8; tq<b>g32a's codes unpacked from their bit planes) and
 *     multiplied into every head's q8_0 query block by VPMADDWD; the 16 (key, head) vectors of a
 *     block are summed exactly by one integer transposing tree, then the block sums go through the
 *     reference's float arithmetic in its order (q8_0: sumi * (d_K d_q), q4_0: (sumi d_K) d_q, tq:
 *     d_q (d_K sumi + m_K sum(q)); blocks added from the first): the reference's scores bit for bit. An f16 K is converted once per key and dotted with the (acc16: f16-rounded)
 *     query in floats, 16 dot products summed by vmath.h's tree (order differs from the reference);
 *   - softmax, per chunk of 16 keys (flash attention's update): a chunk whose maximum exceeds the
 *     running one rescales the accumulators and the sum once, by exp(Mold - M); each key weighs
 *     exp(s - M) through one vector exp (tn_exp512); the sum is kept in 16 lanes. The reference
 *     rescales at every new maximum and calls expf per key;
 *   - V: per key, each 16 values dequantized once (value * d, tq: d * code + m, the dequantizers'
 *     arithmetic; an f16 V converted) and added into every head with one fused multiply-add; the accumulator is f32
 *     for a quantized V, and f16-rounded after every update for an f16 V with acc16.
 * A cache row holds every kv head, so one kv head's K / V slices are a strided read: the rows two
 * chunks ahead are prefetched in software. Parity with the reference: tests/attn/test_attn_q.c
 * (the f16 kernel's tolerances). Speed per cache type: bench_kern --attn; docs/kv-cache.md.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kern/avx512/vmath.h"
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

#define W 16
#define TN_AQ_AHEAD 2 /* chunks of W keys prefetched ahead */
#define LOADH(P) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(P)))
#define R16(X) _mm512_cvtph_ps(_mm512_cvtps_ph((X), _MM_FROUND_TO_NEAREST_INT)) /* round to f16 and back */


/* The 32 values of a K block as int16: q8_0 sign-extended; q4_0 nibbles minus 8 (the low nibbles
 * are values 0..15, the high ones 16..31). */
static inline __m512i tn_aq_k8(const block_q8_0 *b) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)b->qs)); }
/* A q4_0 block's values minus 8 as int8: *lo values 0..15 (low nibbles), *hi 16..31. */
static inline void tn_aq_q4(const block_q4_0 *b, __m128i *lo, __m128i *hi) {
    const __m128i x = _mm_loadu_si128((const __m128i *)b->qs), m4 = _mm_set1_epi8(0x0F), e8 = _mm_set1_epi8(8);
    *lo = _mm_sub_epi8(_mm_and_si128(x, m4), e8), *hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), m4), e8);
}
static inline __m512i tn_aq_k4(const block_q4_0 *b) {
    __m128i lo, hi;
    tn_aq_q4(b, &lo, &hi);
    return _mm512_cvtepi8_epi16(_mm256_set_m128i(hi, lo));
}

/* The 32 codes of a tq<b>g32 block (pl: its first plane, after the header) as bytes in element
 * order: the planes (widest first, low bits first) unpacked with shifts and masks (quant/tq.h). */
static inline __m256i tn_aq_tq_codes(const uint8_t *pl, int bits) {
    static const int wd[9][3] = {{0}, {1}, {2}, {2, 1}, {4}, {4, 1}, {4, 2}, {4, 2, 1}, {8}}; /* tn_tq_planes */
    const int *w = wd[bits];
    __m256i q = _mm256_setzero_si256();
    for (int i = 0, sh = 0; i < 3 && w[i]; sh += w[i], i++) {
        __m256i v;
        if (w[i] == 8) {
            v = _mm256_loadu_si256((const __m256i *)pl), pl += 32;
        } else if (w[i] == 4) {
            const __m128i x = _mm_loadu_si128((const __m128i *)pl), m = _mm_set1_epi8(0x0F);
            v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m)), pl += 16;
        } else if (w[i] == 2) {
            const __m128i x = _mm_loadl_epi64((const __m128i *)pl), m = _mm_set1_epi8(3);
            const __m128i s0 = _mm_and_si128(x, m), s1 = _mm_and_si128(_mm_srli_epi16(x, 2), m);
            const __m128i s2 = _mm_and_si128(_mm_srli_epi16(x, 4), m), s3 = _mm_and_si128(_mm_srli_epi16(x, 6), m);
            v = _mm256_set_m128i(_mm_unpacklo_epi64(s2, s3), _mm_unpacklo_epi64(s0, s1)), pl += 8;
        } else {
            uint32_t u;
            memcpy(&u, pl, 4);
            v = _mm256_maskz_set1_epi8((__mmask32)u, 1), pl += 4;
        }
        q = _mm256_or_si256(q, _mm256_slli_epi16(v, sh)); /* codes < 256: no bit crosses a byte */
    }
    return q;
}

/* Lane i = the sum of the 16 int32 lanes of v[i]: vmath.h's tn_sum16 in integers (exact). */
static inline __m512i tn_isum16(const __m512i *v) {
    __m512i t[8], u[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        const __m512 a = _mm512_castsi512_ps(t[2 * i]), b = _mm512_castsi512_ps(t[2 * i + 1]);
        u[i] = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x44)), _mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xEE)));
    }
    const __m512i w0 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x88), _mm512_shuffle_i32x4(u[0], u[1], 0xDD));
    const __m512i w1 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2], u[3], 0x88), _mm512_shuffle_i32x4(u[2], u[3], 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(w0, w1, 0x88), _mm512_shuffle_i32x4(w0, w1, 0xDD));
}

/* The query of H heads as the dot products use it: quantized K: each head's q8_0 blocks widened to
 * int16 (qw) and their scales, laid out as the score lanes (dql); f16 K: the floats, f16-rounded with acc16 (qf). */
typedef struct {
    _Alignas(64) int16_t qw[8][8][32]; /* [head][block][value]  */
    _Alignas(64) float dql[8][W];      /* [block][lane u H + h] = head h's scale of that block */
    _Alignas(64) float qsl[8][W];      /* [block][lane u H + h] = the sum of its values (a tq K)  */
    _Alignas(64) float qf[8][256];     /* [head][value]         */
    _Alignas(64) float qr[8][256];     /* [head][value] q as it is (per-channel K's complete groups) */
} tn_aq_query;

/* Per-channel K (quant/kc.h): the scores of one complete group (16 keys, rows kr[u]) for H heads
 * into sc[h][u]: per 32-channel chunk the group's (d, m) pairs are gathered from its 16 rows (8
 * bytes a row, together the chunk's 32 pairs in channel order), each head's query scaled by d
 * (q' = q d) and q . m summed; each key's codes are widened to floats once and dotted with every
 * head's q', 16 keys summed by vmath.h's tree, then + q . m. The reference sums
 * q_c (d_c c + m_c) in channel order: the same value up to float reordering. */
static inline __attribute__((always_inline)) void tn_aq_kc_group(const int NB, const int H, int bits,
                                                                 const uint8_t *const *kr, const tn_aq_query *Q,
                                                                 float sc[8][W]) {
    const size_t cb = (size_t)(4 * bits + 8);
    __m512 qd[8][16], cm[8];
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    for (int h = 0; h < H; h++) cm[h] = _mm512_setzero_ps();
    for (int j = 0; j < NB / 2; j++) {
        _Alignas(64) uint64_t st[16];
        for (int r = 0; r < 16; r++) memcpy(&st[r], kr[r] + (size_t)j * cb, 8);
        const __m512 a = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)st)); /* d0 m0 .. d7 m7 */
        const __m512 b = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)st + 1));
        const __m512 c = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)st + 2));
        const __m512 e = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)st + 3));
        const __m512 d0 = _mm512_permutex2var_ps(a, ev, b), m0 = _mm512_permutex2var_ps(a, od, b); /* channels 0..15 */
        const __m512 d1 = _mm512_permutex2var_ps(c, ev, e), m1 = _mm512_permutex2var_ps(c, od, e); /* 16..31 */
        for (int h = 0; h < H; h++) {
            const __m512 q0 = _mm512_load_ps(Q->qr[h] + 32 * j), q1 = _mm512_load_ps(Q->qr[h] + 32 * j + 16);
            qd[h][2 * j] = _mm512_mul_ps(q0, d0), qd[h][2 * j + 1] = _mm512_mul_ps(q1, d1);
            cm[h] = _mm512_fmadd_ps(q0, m0, _mm512_fmadd_ps(q1, m1, cm[h]));
        }
    }
    __m512 dv[8][W];
    for (int u = 0; u < W; u++) {
        __m512 cf[16];
        for (int j = 0; j < NB / 2; j++) {
            const __m256i c = tn_aq_tq_codes(kr[u] + (size_t)j * cb + 8, bits);
            cf[2 * j] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(c)));
            cf[2 * j + 1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(c, 1)));
        }
        for (int h = 0; h < H; h++) {
            __m512 sv = _mm512_mul_ps(cf[0], qd[h][0]);
            for (int b = 1; b < NB; b++) sv = _mm512_fmadd_ps(cf[b], qd[h][b], sv);
            dv[h][u] = sv;
        }
    }
    for (int h = 0; h < H; h++) _mm512_store_ps(sc[h], _mm512_add_ps(tn_sum16(dv[h]), _mm512_set1_ps(_mm512_reduce_add_ps(cm[h]))));
}

/* dv[h] = 16 floats whose sum is head h's q . k for the f16 K row k (converted once for the H heads). */
static inline __attribute__((always_inline)) void tn_aq_dots(const int NB, const int H, const uint8_t *k,
                                                             const tn_aq_query *Q, __m512 *dv) {
    __m512 kb[16];
    for (int b = 0; b < NB; b++) kb[b] = LOADH((const uint16_t *)k + b * W);
    for (int h = 0; h < H; h++) {
        __m512 sv = _mm512_mul_ps(kb[0], _mm512_load_ps(Q->qf[h]));
        for (int b = 1; b < NB; b++) sv = _mm512_fmadd_ps(kb[b], _mm512_load_ps(Q->qf[h] + b * W), sv);
        dv[h] = sv;
    }
}

/* Scores of a quantized K for KU = 16 / H keys (rows kr[u], u < n live) x H heads, lane u H + h:
 * per block, 16 VPMADDWD vectors summed exactly by one integer tree, then the reference's float
 * arithmetic on the block sums in its order (q8_0: sumi * (d_K d_q); q4_0: (sumi d_K) d_q; blocks
 * added in order from 0) — the reference's bits. */
static inline __attribute__((always_inline)) __m512 tn_aq_qdots(const int NB, const int H, int32_t tk,
                                                                const uint8_t *const *kr, int n, const tn_aq_query *Q) {
    const int NQ = NB / 2, KU = W / H;
    const __m512i lane_key = _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               H == 8 ? 3 : H == 4 ? 2 : H == 2 ? 1 : 0);
    const bool tq = tn_tq_is((uint32_t)tk);
    tn_tq_params tp = {0};
    if (tq) tn_tq_params_of((uint32_t)tk, &tp);
    const int bits = tp.bits;
    const size_t bb = tq ? tn_tq_block_bytes(&tp) : 0; /* a tq<b>g32a block */
    __m512 s = _mm512_setzero_ps();
    for (int j = 0; j < NQ; j++) {
        __m512i p[W];
        _Alignas(32) uint16_t dh[W] = {0}, mh[W] = {0};
        for (int u = 0; u < KU; u++) {
            if (u < n) {
                __m512i kw;
                if (tk == TN_Q8_0) kw = tn_aq_k8((const block_q8_0 *)kr[u] + j), dh[u] = ((const block_q8_0 *)kr[u])[j].d;
                else if (tk == TN_Q4_0) kw = tn_aq_k4((const block_q4_0 *)kr[u] + j), dh[u] = ((const block_q4_0 *)kr[u])[j].d;
                else {
                    const uint8_t *blk = kr[u] + (size_t)j * bb;
                    kw = _mm512_cvtepu8_epi16(tn_aq_tq_codes(blk + 4, bits));
                    memcpy(&dh[u], blk, 2), memcpy(&mh[u], blk + 2, 2);
                }
                for (int h = 0; h < H; h++) p[u * H + h] = _mm512_madd_epi16(kw, _mm512_load_si512((const void *)Q->qw[h][j]));
            } else {
                for (int h = 0; h < H; h++) p[u * H + h] = _mm512_setzero_si512();
            }
        }
        const __m512 isum = _mm512_cvtepi32_ps(tn_isum16(p));
        const __m512 dk = _mm512_permutexvar_ps(lane_key, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)dh)));
        const __m512 dq = _mm512_load_ps(Q->dql[j]);
        if (tq) { /* tn_tq_vec_dot_ref's order: d_q (d_K sum(c q) + m_K sum(q)) */
            const __m512 mk = _mm512_permutexvar_ps(lane_key, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)mh)));
            const __m512 t = _mm512_add_ps(_mm512_mul_ps(dk, isum), _mm512_mul_ps(mk, _mm512_load_ps(Q->qsl[j])));
            s = _mm512_add_ps(s, _mm512_mul_ps(dq, t));
        } else {
            s = _mm512_add_ps(s, tk == TN_Q8_0 ? _mm512_mul_ps(isum, _mm512_mul_ps(dk, dq)) : _mm512_mul_ps(_mm512_mul_ps(isum, dk), dq));
        }
    }
    return s;
}

/* vb[b] = V values 16 b .. 16 b + 15 of the row v as floats: value * d as the dequantizers do. */
static inline __attribute__((always_inline)) void tn_aq_vrow(const int NB, int32_t tv, const uint8_t *v, __m512 *vb) {
    if (tv == TN_Q8_0) {
        for (int j = 0; j < NB / 2; j++) {
            const block_q8_0 *b = (const block_q8_0 *)v + j;
            const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
            vb[2 * j] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->qs))), d);
            vb[2 * j + 1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16)))), d);
        }
    } else if (tv == TN_Q4_0) {
        for (int j = 0; j < NB / 2; j++) {
            const block_q4_0 *b = (const block_q4_0 *)v + j;
            const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
            __m128i lo, hi;
            tn_aq_q4(b, &lo, &hi);
            vb[2 * j] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d);
            vb[2 * j + 1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d);
        }
    } else if (tv == TN_F16) {
        for (int b = 0; b < NB; b++) vb[b] = LOADH((const uint16_t *)v + 16 * b);
    } else { /* tq<b>g32a: d * c + m, the dequantizer's arithmetic */
        tn_tq_params tp;
        tn_tq_params_of((uint32_t)tv, &tp);
        for (int j = 0; j < NB / 2; j++) {
            const uint8_t *blk = v + (size_t)j * tn_tq_block_bytes(&tp);
            const __m256i c = tn_aq_tq_codes(blk + 4, tp.bits);
            uint16_t dh, mh;
            memcpy(&dh, blk, 2), memcpy(&mh, blk + 2, 2);
            const __m512 d = _mm512_set1_ps(_cvtsh_ss(dh)), m = _mm512_set1_ps(_cvtsh_ss(mh));
            vb[2 * j] = _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(c)))), m);
            vb[2 * j + 1] = _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(c, 1)))), m);
        }
    }
}

/* H heads (H * NB <= 16 accumulators of 16 floats in registers; NB = hd / 16) over one kv head's
 * rows: K, V point at the kv head's first block in row 0. The type branches sit outside the
 * unrolled loops (one predictable branch per key), so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tn_aq_heads(const int NB, const int H, int32_t tk, int32_t tv,
                                                              int64_t T, const tn_aq_query *Q, const uint8_t *K,
                                                              size_t k_rb, const uint8_t *V, size_t v_rb,
                                                              const int32_t *blocks, int64_t block_rows, float scale,
                                                              float cap, bool acc16, float *out, int kc_bits,
                                                              const uint16_t *Kw, int64_t ldw, int64_t Wn) {
    const int KU = W / H; /* keys per tree of 16 dot products */
    const int64_t Qk = kc_bits ? T - T % W : 0; /* per-channel K: keys below Qk in complete groups, the rest in Kw */
    const bool vacc16 = acc16 && tv == TN_F16;
    const size_t kb_last = tn_kv_head_off(tk, NB * W, 1) - 1, vb_last = tn_kv_head_off(tv, NB * W, 1) - 1; /* a head's last byte */
    _Alignas(64) float accm[16][W]; /* the accumulators between chunks: in registers only for the V
                                      * updates (the scores' 16 vectors and their tree need the rest) */
    float M[8];
    __m512 Sv[8]; /* per head: the softmax denominator, 16 partial sums */
    for (int i = 0; i < H * NB; i++) _mm512_store_ps(accm[i], _mm512_setzero_ps());
    for (int h = 0; h < H; h++) M[h] = -INFINITY, Sv[h] = _mm512_setzero_ps();
    for (int64_t t0 = 0; t0 < T; t0 += W) {
        const int nt = T - t0 < W ? (int)(T - t0) : W;
        int64_t rows[W];
        tn_kv_rows(blocks, block_rows, t0, nt, rows);
        /* the rows TN_AQ_AHEAD chunks ahead, every line of the kv head's K and V (a row holds every
         * kv head: one head's slice is a strided read the hardware prefetchers do not follow) */
        if (t0 + TN_AQ_AHEAD * W < T) {
            int64_t ahead[W];
            const int na = T - (t0 + TN_AQ_AHEAD * W) < W ? (int)(T - (t0 + TN_AQ_AHEAD * W)) : W;
            tn_kv_rows(blocks, block_rows, t0 + TN_AQ_AHEAD * W, na, ahead);
            for (int i = 0; i < na; i++) {
                const uint8_t *pk = K + (size_t)ahead[i] * k_rb, *pv = V + (size_t)ahead[i] * v_rb;
                __builtin_prefetch(pk, 0, 3), __builtin_prefetch(pk + kb_last, 0, 3);
                __builtin_prefetch(pv, 0, 3), __builtin_prefetch(pv + vb_last, 0, 3);
            }
        }
        _Alignas(64) float sc[8][W];
        if (kc_bits && t0 < Qk) { /* a complete per-channel group: its own scores, then scaled as below */
            const uint8_t *kr[W];
            for (int u = 0; u < W; u++) kr[u] = K + (size_t)rows[u] * k_rb;
            tn_aq_kc_group(NB, H, kc_bits, kr, Q, sc);
            for (int h = 0; h < H; h++) {
                __m512 sv = _mm512_mul_ps(_mm512_load_ps(sc[h]), _mm512_set1_ps(scale));
                if (cap > 0) sv = _mm512_mul_ps(_mm512_set1_ps(cap), tn_tanh512(sv));
                _mm512_store_ps(sc[h], sv);
            }
        }
        for (int i0 = 0; i0 < nt && !(kc_bits && t0 < Qk); i0 += KU) { /* KU keys x H heads: 16 dot products, summed at once */
            __m512 sv;
            if (tk == TN_F16 || kc_bits) { /* per-channel K: the open group's f16 keys from the window */
                __m512 dv[W];
                for (int u = 0; u < KU; u++) {
                    if (i0 + u < nt)
                        tn_aq_dots(NB, H, kc_bits ? (const uint8_t *)(Kw + (size_t)((t0 + i0 + u) % Wn) * (size_t)ldw) : K + (size_t)rows[i0 + u] * k_rb, Q,
                                   dv + u * H);
                    else
                        for (int h = 0; h < H; h++) dv[u * H + h] = _mm512_setzero_ps();
                }
                sv = tn_sum16(dv);
            } else {
                const uint8_t *kr[W];
                for (int u = 0; u < KU; u++) kr[u] = K + (size_t)rows[i0 + u < nt ? i0 + u : i0] * k_rb;
                sv = tn_aq_qdots(NB, H, tk, kr, nt - i0, Q);
            }
            _Alignas(64) float r[W];
            sv = _mm512_mul_ps(sv, _mm512_set1_ps(scale));
            if (cap > 0) sv = _mm512_mul_ps(_mm512_set1_ps(cap), tn_tanh512(sv));
            _mm512_store_ps(r, sv);
            for (int u = 0; u < KU; u++)
                for (int h = 0; h < H; h++) sc[h][i0 + u] = r[u * H + h];
        }
        /* softmax, per chunk (flash attention's update): a chunk whose maximum exceeds the running
         * one rescales the accumulators and the sum once, by exp(Mold - M); each key weighs
         * exp(s - M); the keys past the end weigh 0 */
        _Alignas(64) float e[8][W];
        const __mmask16 live = (__mmask16)(nt == W ? 0xFFFF : (1u << nt) - 1);
        for (int h = 0; h < H; h++) {
            const __m512 s = _mm512_mask_load_ps(_mm512_set1_ps(-INFINITY), live, sc[h]);
            const float m = _mm512_reduce_max_ps(s);
            if (m > M[h]) {
                const __m512 vms = _mm512_set1_ps(expf(M[h] - m));
                M[h] = m;
                Sv[h] = _mm512_mul_ps(Sv[h], vms);
                for (int b = 0; b < NB; b++) {
                    __m512 a = _mm512_mul_ps(_mm512_load_ps(accm[h * NB + b]), vms);
                    if (vacc16) a = R16(a);
                    _mm512_store_ps(accm[h * NB + b], a);
                }
            }
            const __m512 ev = _mm512_maskz_mov_ps(live, tn_exp512(_mm512_sub_ps(s, _mm512_set1_ps(M[h]))));
            Sv[h] = _mm512_add_ps(Sv[h], ev);
            _mm512_store_ps(e[h], ev);
        }
        __m512 acc[16];
        for (int i = 0; i < H * NB; i++) acc[i] = _mm512_load_ps(accm[i]);
        for (int i = 0; i < nt; i++) {
            __m512 vb[16];
            tn_aq_vrow(NB, tv, V + (size_t)rows[i] * v_rb, vb);
            if (vacc16) {
                for (int h = 0; h < H; h++)
                    for (int b = 0; b < NB; b++) acc[h * NB + b] = R16(_mm512_fmadd_ps(vb[b], _mm512_set1_ps(e[h][i]), acc[h * NB + b]));
            } else {
                for (int h = 0; h < H; h++)
                    for (int b = 0; b < NB; b++) acc[h * NB + b] = _mm512_fmadd_ps(vb[b], _mm512_set1_ps(e[h][i]), acc[h * NB + b]);
            }
        }
        for (int i = 0; i < H * NB; i++) _mm512_store_ps(accm[i], acc[i]);
    }
    for (int h = 0; h < H; h++) {
        const float S = _mm512_reduce_add_ps(Sv[h]);
        const __m512 inv = _mm512_set1_ps(S == 0.0f ? 0.0f : 1.0f / S);
        for (int b = 0; b < NB; b++) _mm512_storeu_ps(out + (h * NB + b) * W, _mm512_mul_ps(_mm512_load_ps(accm[h * NB + b]), inv));
    }
}

/* Both kernels: kc_bits > 0 is a per-channel K (tk its dtype; Kw, ldw, Wn its window). */
static void tn_aq_run(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, int32_t tk, const void *K, size_t k_rb,
                      int32_t tv, const void *V, size_t v_rb, const int32_t *blocks, int64_t block_rows, float scale,
                      float cap, bool acc16, float *out, int kc_bits, const uint16_t *Kw, int64_t ldw, int64_t Wn) {
    const float sc = cap > 0 ? scale / cap : scale;
    const int nb = (int)(hd / W), hmax = 16 / nb < 8 ? 16 / nb : 8;
    for (int64_t j0 = 0; j0 < nh;) { /* heads j0 .. j0 + H - 1 share kv head j0 / rep */
        const int64_t g = j0 / rep;
        int64_t left = (g + 1) * rep < nh ? (g + 1) * rep - j0 : nh - j0; /* heads left in this kv group */
        int H = hmax;
        while (H > 1 && H > left) H /= 2;
        _Alignas(64) tn_aq_query Q;
        for (int h = 0; h < H; h++) {
            const float *qh = q + (j0 + h) * hd;
            if (tk == TN_F16 || kc_bits) {
                for (int64_t i = 0; i < hd; i += W) {
                    const __m512 v = _mm512_loadu_ps(qh + i);
                    _mm512_store_ps(Q.qf[h] + i, acc16 ? R16(v) : v);
                    _mm512_store_ps(Q.qr[h] + i, v);
                }
            } else {
                block_q8_0 qb[8];
                tn_quantize_row_q8_0_act(qh, qb, hd);
                for (int j = 0; j < nb / 2; j++) {
                    _mm512_store_si512((void *)Q.qw[h][j], _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)qb[j].qs)));
                    int32_t sum = 0;
                    for (int i = 0; i < 32; i++) sum += qb[j].qs[i];
                    for (int l = h; l < W; l += H) Q.dql[j][l] = _cvtsh_ss(qb[j].d), Q.qsl[j][l] = (float)sum;
                }
            }
        }
        const uint8_t *Kg = (const uint8_t *)K + tn_kv_head_off(tk, hd, g), *Vg = (const uint8_t *)V + tn_kv_head_off(tv, hd, g);
        const uint16_t *Kwg = kc_bits ? Kw + g * hd : NULL;
        float *o = out + j0 * hd;
#define TN_AQ_CALL(NB_, H_)                                                                                        \
    tn_aq_heads(NB_, H_, tk, tv, T, &Q, Kg, k_rb, Vg, v_rb, blocks, block_rows, sc, cap, acc16, o, kc_bits, Kwg, ldw, Wn)
        if (nb == 2) {
            if (H == 8) TN_AQ_CALL(2, 8);
            else if (H == 4) TN_AQ_CALL(2, 4);
            else if (H == 2) TN_AQ_CALL(2, 2);
            else TN_AQ_CALL(2, 1);
        } else if (nb == 4) {
            if (H == 4) TN_AQ_CALL(4, 4);
            else if (H == 2) TN_AQ_CALL(4, 2);
            else TN_AQ_CALL(4, 1);
        } else if (nb == 8) {
            if (H == 2) TN_AQ_CALL(8, 2);
            else TN_AQ_CALL(8, 1);
        } else if (nb == 16) {
            TN_AQ_CALL(16, 1);
        } else { /* hd 96, 160, ...: 6 / 10 / 12 / 14 vectors a head */
            if (nb == 6 && H == 2) TN_AQ_CALL(6, 2);
            else if (nb == 6) TN_AQ_CALL(6, 1);
            else if (nb == 10) TN_AQ_CALL(10, 1);
            else if (nb == 12) TN_AQ_CALL(12, 1);
            else TN_AQ_CALL(14, 1);
        }
#undef TN_AQ_CALL
        j0 += H;
    }
}

static void tn_k_attn_q__avx512(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, int32_t tk, const void *K,
                                size_t k_rb, int32_t tv, const void *V, size_t v_rb, const int32_t *blocks,
                                int64_t block_rows, float scale, float cap, bool acc16, float *out, float *scratch) {
    if (hd % 32 || hd > 256) { /* only an f16 pair can have heads that are not whole blocks; the reference */
        tn_k_attn_q__scalar(hd, T, nh, rep, q, tk, K, k_rb, tv, V, v_rb, blocks, block_rows, scale, cap, acc16, out, scratch);
        return;
    }
    /* the query and accumulators live on the stack */
    tn_aq_run(hd, T, nh, rep, q, tk, K, k_rb, tv, V, v_rb, blocks, block_rows, scale, cap, acc16, out, 0, NULL, 0, 0);
}

/* Per-channel K (kern.h tn_attn_kc_fn): tn_aq_heads with its complete groups scored by
 * tn_aq_kc_group and the open group's keys read from the window as an f16 K's. */
static void tn_k_attn_kc__avx512(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, int kbits, const void *K,
                                 size_t k_rb, const uint16_t *Kw, int64_t ldw, int64_t Wn, int32_t tv, const void *V,
                                 size_t v_rb, const int32_t *blocks, float scale, float cap, bool acc16, float *out,
                                 float *scratch) {
    if (hd % 32 || hd > 256) {
        tn_k_attn_kc__scalar(hd, T, nh, rep, q, kbits, K, k_rb, Kw, ldw, Wn, tv, V, v_rb, blocks, scale, cap, acc16, out, scratch);
        return;
    }
    tn_aq_run(hd, T, nh, rep, q, tn_kc_dtype(kbits), K, k_rb, tv, V, v_rb, blocks, TN_KC_ROWS, scale, cap, acc16,
              out, kbits, Kw, ldw, Wn);
}

void tn_kern_register_attn_q_avx512(tn_kern_table *t) {
    t->attn_kc = tn_k_attn_kc__avx512;
    t->attn_q = tn_k_attn_q__avx512;
    t->attn_q_isa = TN_ISA_AVX512;
}
