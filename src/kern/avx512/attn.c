/*
 * attn.c (avx512) — attention kernel (contract in kern.h; reference in scalar/attn.c) and SwiGLU.
 * Vectorised over the head dimension in blocks of 16 with F16C conversions, several query heads
 * per pass (8 of size 32, 4 of size 64, 2 of size 128; a group's K / V rows converted once when the heads share
 * a kv head), so the heads' serial accumulations overlap. The rounding points are the
 * reference's (f16 accumulator rounded after each scale and each fused multiply-add, in the
 * register), so only the order of the q·k sum and the exponential differ: per 16 keys the scores
 * are computed first (16 dot products summed by one transposing tree), their exponents (the
 * reference's, from the running maximum) go through one vector exp (tn_exp512, within a few ulp
 * of libm's expf; the reference calls expf per key), then the keys are accumulated in order.
 * Heads whose size is not a multiple of 16 use the reference. The soft-capped variant (gemma2)
 * is the same kernel with cap * tanh applied to each 16 scores (tn_tanh512).
 * One core, 16 heads of 64 over 256 keys, f16 accumulator: 18.5 -> 7.8 ns per key and head.
 */
#include <immintrin.h>
#include <math.h>

#include "core/fp16.h"
#include "kern/kern.h"
#include "kern/avx512/vmath.h"

void tn_k_attn1_f16__scalar(int64_t hd, int64_t T, const float *q, const uint16_t *K, const uint16_t *V, int64_t ldkv,
                            const int32_t *blocks, int64_t block_rows, float scale, bool acc16, float *out,
                            float *scratch);
void tn_k_attn_softcap_f16__scalar(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, const uint16_t *K,
                                   const uint16_t *V, int64_t ldkv, const int32_t *blocks, int64_t block_rows,
                                   float scale, float cap, bool acc16, float *out, float *scratch);

#define W 16
#define LOADH(P) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(P)))
#define R16(X) _mm512_cvtph_ps(_mm512_cvtps_ph((X), _MM_FROUND_TO_NEAREST_INT)) /* round to f16 and back */

/* H heads (H * NB <= 16 accumulators of 16 floats stay in registers), head j reading K[j] / V[j]
 * (shared: all the same kv head, its rows converted once for the H heads). Per chunk of 16 keys:
 * the scores of every head, then per head the reference's exponents (from the running maximum:
 * a new maximum rescales by exp(Mold - M), else the key weighs exp(s - M)) through one vector
 * exp, then the keys accumulated in order; with acc16 every update is rounded to f16 in the
 * register, the reference's rounding points. cap > 0: the scores soft-capped, cap * tanh(s) (scale
 * already divided by cap, as the reference does); the plain kernel passes 0 and pays nothing. */
static inline __attribute__((always_inline)) void tn_attn_heads(const int NB, const int H, const bool shared, int64_t T,
                                                                const float *qr, const uint16_t *const *Kh,
                                                                const uint16_t *const *Vh, int64_t ldkv,
                                                                const int32_t *blocks, int64_t block_rows, float scale,
                                                                float cap, bool acc16, float *out) {
    __m512 acc[16];
    float M[8], S[8];
    for (int i = 0; i < H * NB; i++) acc[i] = _mm512_setzero_ps();
    for (int h = 0; h < H; h++) M[h] = -INFINITY, S[h] = 0.0f;
    for (int64_t t0 = 0; t0 < T; t0 += W) {
        const int nt = T - t0 < W ? (int)(T - t0) : W;
        int64_t rows[W];
        _Alignas(64) float sc[8][W];
        for (int i0 = 0; i0 < nt; i0 += W / H) { /* W / H keys x H heads: 16 dot products, summed at once */
            __m512 dv[W];
            for (int u = 0; u < W / H; u++) {
                const int i = i0 + u;
                if (i >= nt) {
                    for (int h = 0; h < H; h++) dv[u * H + h] = _mm512_setzero_ps();
                    continue;
                }
                rows[i] = tn_kv_row(blocks, block_rows, t0 + i) * ldkv;
                __m512 kb[16];
                if (shared)
                    for (int b = 0; b < NB; b++) kb[b] = LOADH(Kh[0] + rows[i] + b * W);
                for (int h = 0; h < H; h++) {
                    __m512 sv = _mm512_setzero_ps();
                    for (int b = 0; b < NB; b++)
                        sv = _mm512_fmadd_ps(shared ? kb[b] : LOADH(Kh[h] + rows[i] + b * W), _mm512_load_ps(qr + (h * NB + b) * W), sv);
                    dv[u * H + h] = sv;
                }
            }
            _Alignas(64) float r[W];
            __m512 sv = _mm512_mul_ps(tn_sum16(dv), _mm512_set1_ps(scale));
            if (cap > 0) sv = _mm512_mul_ps(_mm512_set1_ps(cap), tn_tanh512(sv));
            _mm512_store_ps(r, sv);
            for (int u = 0; u < W / H && i0 + u < nt; u++)
                for (int h = 0; h < H; h++) sc[h][i0 + u] = r[u * H + h];
        }
        _Alignas(64) float e[8][W];
        uint32_t up[8] = {0}; /* bit i: key i is a new maximum of head h */
        for (int h = 0; h < H; h++) {
            _Alignas(64) float arg[W];
            float Mr = M[h];
            for (int i = 0; i < nt; i++) {
                const float s = sc[h][i];
                if (s > Mr) {
                    arg[i] = Mr - s, Mr = s;
                    up[h] |= 1u << i;
                } else {
                    arg[i] = s - Mr;
                }
            }
            for (int i = nt; i < W; i++) arg[i] = 0.0f;
            M[h] = Mr;
            _mm512_store_ps(e[h], tn_exp512(_mm512_load_ps(arg)));
        }
        for (int i = 0; i < nt; i++) {
            __m512 vb[16];
            if (shared)
                for (int b = 0; b < NB; b++) vb[b] = LOADH(Vh[0] + rows[i] + b * W);
            for (int h = 0; h < H; h++) {
                float ms = 1.0f, vs = e[h][i];
                if (up[h] >> i & 1) {
                    ms = vs, vs = 1.0f;
                    const __m512 vms = _mm512_set1_ps(ms);
                    for (int b = 0; b < NB; b++) {
                        acc[h * NB + b] = _mm512_mul_ps(acc[h * NB + b], vms);
                        if (acc16) acc[h * NB + b] = R16(acc[h * NB + b]);
                    }
                }
                const __m512 vvs = _mm512_set1_ps(vs);
                for (int b = 0; b < NB; b++) {
                    acc[h * NB + b] = _mm512_fmadd_ps(shared ? vb[b] : LOADH(Vh[h] + rows[i] + b * W), vvs, acc[h * NB + b]);
                    if (acc16) acc[h * NB + b] = R16(acc[h * NB + b]);
                }
                S[h] = S[h] * ms + vs;
            }
        }
    }
    for (int h = 0; h < H; h++) {
        const __m512 inv = _mm512_set1_ps(S[h] == 0.0f ? 0.0f : 1.0f / S[h]);
        for (int b = 0; b < NB; b++) _mm512_storeu_ps(out + (h * NB + b) * W, _mm512_mul_ps(acc[h * NB + b], inv));
    }
}

/* Heads in groups of as many as keep their accumulators in 16 registers, at most 8 (8 of size 16
 * or 32, 4 of 48 or 64, 2 of 80 .. 128); sizes that are not a multiple of 16 one at a time (the
 * reference). cap > 0: soft-capped scores. */
static inline __attribute__((always_inline)) void tn_attn_drive(int64_t hd, int64_t T, int64_t nh, int64_t rep,
                                                                const float *q, const uint16_t *K, const uint16_t *V,
                                                                int64_t ldkv, const int32_t *blocks, int64_t block_rows,
                                                                float scale, float cap, bool acc16, float *out,
                                                                float *scratch) {
    if ((hd % W || hd > 256) && cap > 0) {
        tn_k_attn_softcap_f16__scalar(hd, T, nh, rep, q, K, V, ldkv, blocks, block_rows, scale, cap, acc16, out, scratch);
        return;
    }
    if (cap > 0) scale /= cap;
    if (hd % W || hd > 256) {
        for (int64_t j = 0; j < nh; j++)
            tn_k_attn1_f16__scalar(hd, T, q + j * hd, K + (j / rep) * hd, V + (j / rep) * hd, ldkv, blocks, block_rows,
                                   scale, acc16, out + j * hd, scratch);
        return;
    }
    const int nb = (int)(hd / W);
    int hmax = 8; /* the most heads whose accumulators fit 16 registers (a power of 2: W / H keys a pass) */
    while (hmax * nb > 16) hmax /= 2;
    for (int64_t j0 = 0; j0 < nh;) {
        int H = hmax;
        while (H > 1 && j0 + H > nh) H /= 2;
        _Alignas(64) float qr[256]; /* q as used in the dot products (f16-rounded with acc16) */
        const uint16_t *Kh[8] = {0}, *Vh[8] = {0};
        for (int h = 0; h < H; h++) {
            Kh[h] = K + ((j0 + h) / rep) * hd, Vh[h] = V + ((j0 + h) / rep) * hd;
            for (int b = 0; b < nb; b++) {
                const __m512 v = _mm512_loadu_ps(q + (j0 + h) * hd + b * W);
                _mm512_store_ps(qr + (h * nb + b) * W, acc16 ? R16(v) : v);
            }
        }
        const bool shared = Kh[0] == Kh[H - 1];
        float *o = out + j0 * hd;
#define TN_ATTN_CALL(NB_, H_, SH_) tn_attn_heads(NB_, H_, SH_, T, qr, Kh, Vh, ldkv, blocks, block_rows, scale, cap, acc16, o)
#define TN_ATTN_H(NB_, H_)                                                                                            \
    do {                                                                                                               \
        if (shared) TN_ATTN_CALL(NB_, H_, true);                                                                       \
        else TN_ATTN_CALL(NB_, H_, false);                                                                             \
    } while (0)
        /* small heads (16, 32: 1 or 2 accumulators each) need many heads at once to hide the f16
         * accumulator's latency (a key's update is a dependent chain per register) */
        if (nb == 1 && H == 8) TN_ATTN_H(1, 8);
        else if (nb == 1 && H == 4) TN_ATTN_H(1, 4);
        else if (nb == 1 && H == 2) TN_ATTN_H(1, 2);
        else if (nb == 2 && H == 8) TN_ATTN_H(2, 8);
        else if (nb == 2 && H == 4) TN_ATTN_H(2, 4);
        else if (nb == 2 && H == 2) TN_ATTN_H(2, 2);
        else if (nb == 2) TN_ATTN_CALL(2, 1, true);
        else if (nb == 4 && H == 4) TN_ATTN_H(4, 4);
        else if (nb == 4 && H == 2) TN_ATTN_H(4, 2);
        else if (nb == 4) TN_ATTN_CALL(4, 1, true);
        else if (nb == 8 && H == 2) TN_ATTN_H(8, 2);
        else if (nb == 8) TN_ATTN_CALL(8, 1, true);
        else if (H == 4) TN_ATTN_H(nb, 4); /* 48-wide heads */
        else if (H == 2) TN_ATTN_H(nb, 2);
        else TN_ATTN_CALL(nb, 1, true);
#undef TN_ATTN_H
#undef TN_ATTN_CALL
        j0 += H;
    }
}

static void tn_k_attn_f16__avx512(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, const uint16_t *K,
                                  const uint16_t *V, int64_t ldkv, const int32_t *blocks, int64_t block_rows, float scale,
                                  bool acc16, float *out, float *scratch) {
    tn_attn_drive(hd, T, nh, rep, q, K, V, ldkv, blocks, block_rows, scale, 0.0f, acc16, out, scratch);
}

static void tn_k_attn_softcap_f16__avx512(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q,
                                          const uint16_t *K, const uint16_t *V, int64_t ldkv, const int32_t *blocks,
                                          int64_t block_rows, float scale, float cap, bool acc16, float *out,
                                          float *scratch) {
    tn_attn_drive(hd, T, nh, rep, q, K, V, ldkv, blocks, block_rows, scale, cap, acc16, out, scratch);
}

/* SwiGLU (kern.h tn_swiglu_fn): the reference's operations in its order, with tn_exp512. */
static void tn_k_swiglu__avx512(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 e = tn_exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
    }
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        const __m512 x = _mm512_maskz_loadu_ps(k, g + i);
        const __m512 e = tn_exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_mask_storeu_ps(g + i, k, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(k, u + i)));
    }
}

/* GeGLU (kern.h tn_geglu_fn): g u / (1 + exp(-2y)), y = sqrt(2/pi) (g + 0.044715 g^3) — the
 * reference's 0.5 g (1 + tanh(y)) u without its cancellation where tanh(y) nears -1. */
static inline __m512 tn_geglu16(__m512 x, __m512 u) {
    const __m512 x2 = _mm512_mul_ps(x, x);
    const __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f), x),
                                   _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x2, _mm512_set1_ps(1.0f)));
    const __m512 e = tn_exp512(_mm512_mul_ps(_mm512_set1_ps(-2.0f), y));
    return _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}
static void tn_k_geglu__avx512(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(g + i, tn_geglu16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(g + i, k, tn_geglu16(_mm512_maskz_loadu_ps(k, g + i), _mm512_maskz_loadu_ps(k, u + i)));
    }
}

void tn_kern_register_attn_avx512(tn_kern_table *t) {
    t->attn = tn_k_attn_f16__avx512;
    t->attn_isa = TN_ISA_AVX512;
    t->attn_softcap = tn_k_attn_softcap_f16__avx512;
    t->swiglu = tn_k_swiglu__avx512;
    t->swiglu_isa = TN_ISA_AVX512;
    t->geglu = tn_k_geglu__avx512;
    t->geglu_isa = TN_ISA_AVX512;
}
