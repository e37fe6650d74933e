/*
 * attn.c (avx2) — attention kernel (contract in kern.h; reference in scalar/attn.c). Vectorised
 * over the head dimension in blocks of 8 with F16C conversions; the rounding points are the
 * reference's (f16 accumulator rounded after each scale and each fused multiply-add), so only the
 * order of the q·k sum differs. Heads whose size is not a multiple of 8 use the reference.
 */
#include <immintrin.h>
#include <math.h>

#include "core/fp16.h"
#include "kern/kern.h"

void tn_k_attn1_f16__scalar(int64_t hd, int64_t T, const float *q, const uint16_t *K, const uint16_t *V, int64_t ldkv,
                            const int32_t *blocks, int64_t block_rows, float scale, bool acc16, float *out,
                            float *scratch);

#define W 8
#define LOADH(P) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P)))
#define STOREH(P, X) _mm_storeu_si128((__m128i *)(P), _mm256_cvtps_ph((X), _MM_FROUND_TO_NEAREST_INT))
static inline float tn_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void tn_k_attn1_f16__avx2(int64_t hd, int64_t T, const float *q, const uint16_t *K, const uint16_t *V,
                                 int64_t ldkv, const int32_t *blocks, int64_t block_rows, float scale, bool acc16,
                                 float *out, float *scratch) {
    if (hd % W || hd > 256) {
        tn_k_attn1_f16__scalar(hd, T, q, K, V, ldkv, blocks, block_rows, scale, acc16, out, scratch);
        return;
    }
    const int64_t nb = hd / W;
    __m256 qv[256 / W], acc[256 / W];
    uint16_t *acc16buf = (uint16_t *)scratch; /* f16 accumulator (acc16 mode) */
    for (int64_t b = 0; b < nb; b++) {
        qv[b] = _mm256_loadu_ps(q + b * W);
        if (acc16) {
            STOREH(acc16buf + b * W, qv[b]);
            qv[b] = LOADH(acc16buf + b * W); /* q rounded to f16 */
        }
        acc[b] = _mm256_setzero_ps();
    }
    if (acc16)
        for (int64_t b = 0; b < nb; b++) STOREH(acc16buf + b * W, acc[b]);
    float M = -INFINITY, S = 0.0f;
    for (int64_t t = 0; t < T; t++) {
        const int64_t row = tn_kv_row(blocks, block_rows, t);
        const uint16_t *k = K + row * ldkv, *v = V + row * ldkv;
        __m256 sv = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) sv = _mm256_fmadd_ps(LOADH(k + b * W), qv[b], sv);
        const float s = tn_hsum256(sv) * scale;
        float ms = 1.0f, vs = 1.0f;
        if (s > M) {
            const float Mold = M;
            M = s;
            ms = expf(Mold - M);
            const __m256 vms = _mm256_set1_ps(ms);
            for (int64_t b = 0; b < nb; b++) {
                if (acc16) STOREH(acc16buf + b * W, _mm256_mul_ps(LOADH(acc16buf + b * W), vms));
                else acc[b] = _mm256_mul_ps(acc[b], vms);
            }
        } else {
            vs = expf(s - M);
        }
        const __m256 vvs = _mm256_set1_ps(vs);
        for (int64_t b = 0; b < nb; b++) {
            if (acc16) STOREH(acc16buf + b * W, _mm256_fmadd_ps(LOADH(v + b * W), vvs, LOADH(acc16buf + b * W)));
            else acc[b] = _mm256_fmadd_ps(LOADH(v + b * W), vvs, acc[b]);
        }
        S = S * ms + vs;
    }
    const __m256 inv = _mm256_set1_ps(S == 0.0f ? 0.0f : 1.0f / S);
    for (int64_t b = 0; b < nb; b++) _mm256_storeu_ps(out + b * W, _mm256_mul_ps(acc16 ? LOADH(acc16buf + b * W) : acc[b], inv));
}

/* One head at a time. */
static void tn_k_attn_f16__avx2(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, const uint16_t *K,
                                const uint16_t *V, int64_t ldkv, const int32_t *blocks, int64_t block_rows, float scale,
                                bool acc16, float *out, float *scratch) {
    for (int64_t j = 0; j < nh; j++)
        tn_k_attn1_f16__avx2(hd, T, q + j * hd, K + (j / rep) * hd, V + (j / rep) * hd, ldkv, blocks, block_rows, scale,
                             acc16, out + j * hd, scratch + 2 * hd * j);
}

void tn_kern_register_attn_avx2(tn_kern_table *t) {
    t->attn = tn_k_attn_f16__avx2;
    t->attn_isa = TN_ISA_AVX2;
}
