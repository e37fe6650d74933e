/*
 * attn.c (avx512) — attention kernel (contract in kern.h; reference in scalar/attn.c) and SwiGLU. Vectorised
 * over the head dimension in blocks of 16 with F16C conversions; the rounding points are the
 * reference's (f16 accumulator rounded after each scale and each fused multiply-add), so only the
 * order of the q·k sum differs. Heads whose size is not a multiple of 16 use the reference.
 */
#include <immintrin.h>
#include <math.h>

#include "core/fp16.h"
#include "kern/kern.h"

void tn_k_attn_f16__scalar(int64_t hd, int64_t T, const float *q, const uint16_t *K, const uint16_t *V, int64_t ldkv,
                           const int32_t *blocks, int64_t block_rows, float scale, bool acc16, float *out,
                           float *scratch);

#define W 16
#define LOADH(P) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(P)))
#define STOREH(P, X) _mm256_storeu_si256((__m256i *)(P), _mm512_cvtps_ph((X), _MM_FROUND_TO_NEAREST_INT))

void tn_k_attn_f16__avx512(int64_t hd, int64_t T, const float *q, const uint16_t *K, const uint16_t *V, int64_t ldkv,
                           const int32_t *blocks, int64_t block_rows, float scale, bool acc16, float *out,
                           float *scratch) {
    if (hd % W || hd > 256) {
        tn_k_attn_f16__scalar(hd, T, q, K, V, ldkv, blocks, block_rows, scale, acc16, out, scratch);
        return;
    }
    const int64_t nb = hd / W;
    __m512 qv[256 / W], acc[256 / W];
    uint16_t *acc16buf = (uint16_t *)scratch; /* f16 accumulator (acc16 mode) */
    for (int64_t b = 0; b < nb; b++) {
        qv[b] = _mm512_loadu_ps(q + b * W);
        if (acc16) {
            STOREH(acc16buf + b * W, qv[b]);
            qv[b] = LOADH(acc16buf + b * W); /* q rounded to f16 */
        }
        acc[b] = _mm512_setzero_ps();
    }
    if (acc16)
        for (int64_t b = 0; b < nb; b++) STOREH(acc16buf + b * W, acc[b]);
    float M = -INFINITY, S = 0.0f;
    for (int64_t t = 0; t < T; t++) {
        const int64_t row = tn_kv_row(blocks, block_rows, t);
        const uint16_t *k = K + row * ldkv, *v = V + row * ldkv;
        __m512 sv = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) sv = _mm512_fmadd_ps(LOADH(k + b * W), qv[b], sv);
        const float s = _mm512_reduce_add_ps(sv) * scale;
        float ms = 1.0f, vs = 1.0f;
        if (s > M) {
            const float Mold = M;
            M = s;
            ms = expf(Mold - M);
            const __m512 vms = _mm512_set1_ps(ms);
            for (int64_t b = 0; b < nb; b++) {
                if (acc16) STOREH(acc16buf + b * W, _mm512_mul_ps(LOADH(acc16buf + b * W), vms));
                else acc[b] = _mm512_mul_ps(acc[b], vms);
            }
        } else {
            vs = expf(s - M);
        }
        const __m512 vvs = _mm512_set1_ps(vs);
        for (int64_t b = 0; b < nb; b++) {
            if (acc16) STOREH(acc16buf + b * W, _mm512_fmadd_ps(LOADH(v + b * W), vvs, LOADH(acc16buf + b * W)));
            else acc[b] = _mm512_fmadd_ps(LOADH(v + b * W), vvs, acc[b]);
        }
        S = S * ms + vs;
    }
    const __m512 inv = _mm512_set1_ps(S == 0.0f ? 0.0f : 1.0f / S);
    for (int64_t b = 0; b < nb; b++) _mm512_storeu_ps(out + b * W, _mm512_mul_ps(acc16 ? LOADH(acc16buf + b * W) : acc[b], inv));
}

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

void tn_kern_register_attn_avx512(tn_kern_table *t) {
    t->attn = tn_k_attn_f16__avx512;
    t->attn_isa = TN_ISA_AVX512;
    t->swiglu = tn_k_swiglu__avx512;
    t->swiglu_isa = TN_ISA_AVX512;
}
