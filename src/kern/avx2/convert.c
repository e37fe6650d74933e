/*
 * convert.c (avx2) — activation quantizers (from_float: q8_0, q8_1, q8_K, f16, bf16) and
 * to_float for f16 and bf16.
 *
 * Invariant: every from_float here writes the same bytes as its scalar reference in src/quant/
 * for finite inputs (tests/kern checks it bit for bit). So each step is the reference's float
 * operation on 8 lanes in the same order: no FMA contraction, roundf emulated exactly (half away
 * from zero), ggml's nearest_int as the round-to-nearest-even conversion, the per-block scale
 * math in scalar code. NaN inputs are not part of the contract (payloads may differ).
 */
#include "kern/avx2/kernels.h"
#include "kern/avx2/simd.h"

/* 32 int32 lanes (already in int8 range) -> 32 int8 in order. */
TN_INLINE __m256i tn_pack32(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    const __m256i q = _mm256_packs_epi16(ab, cd); /* lane-interleaved: fix with a dword permute */
    return _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

TN_INLINE int tn_hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

TN_INLINE float tn_hmax_ps256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* One 32-block of q8_0/q8_1: writes *d16 and qs, returns the float scale and sum(qs). */
TN_INLINE float tn_q8_block(const float *x, tn_fp16 *d16, int8_t *qs, int *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    for (int r = 0; r < 4; r++) v[r] = _mm256_loadu_ps(x + 8 * r);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    /* ggml's x86 activation quantizer (src/quant/quant_act.c): 127/amax, round half to even */
    const float amax = tn_hmax_ps256(m);
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    *d16 = tn_fp32_to_fp16(d);
    __m256i q[4];
    for (int r = 0; r < 4; r++)
        q[r] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[r], _mm256_set1_ps(id)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm256_storeu_si256((__m256i *)qs, tn_pack32(q[0], q[1], q[2], q[3]));
    *sum = tn_hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    return d;
}

void tn_k_from_float_q8_0__avx2(const float *x, void *vy, int64_t k) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < k / QK8_0; i++) {
        int sum;
        (void)tn_q8_block(x + i * QK8_0, &y[i].d, y[i].qs, &sum);
    }
}

void tn_k_from_float_q8_1__avx2(const float *x, void *vy, int64_t k) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < k / QK8_1; i++) {
        int sum;
        const float d = tn_q8_block(x + i * QK8_1, &y[i].d, y[i].qs, &sum);
        y[i].s = tn_fp32_to_fp16(sum * d);
    }
}

void tn_k_from_float_q8_K__avx2(const float *x, void *vy, int64_t k) {
    block_q8_K *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int r = 0; r < QK_K / 8; r++) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * r)));
        const float amax = tn_hmax_ps256(m);
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* The reference keeps the first element of largest magnitude, with its sign. */
        float max = 0.0f;
        for (int j = 0; j < QK_K; j++) {
            if (x[j] == amax || x[j] == -amax) {
                max = x[j];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int g = 0; g < QK_K / 32; g++) {
            __m256i q[4];
            for (int r = 0; r < 4; r++) {
                /* cvtps rounds to nearest even, as the reference's 1.5 * 2^23 trick does */
                q[r] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * g + 8 * r), vs));
                q[r] = _mm256_min_epi32(q[r], _mm256_set1_epi32(127));
            }
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * g), tn_pack32(q[0], q[1], q[2], q[3]));
            y[i].bsums[2 * g] = (int16_t)tn_hsum_epi32(_mm256_add_epi32(q[0], q[1]));
            y[i].bsums[2 * g + 1] = (int16_t)tn_hsum_epi32(_mm256_add_epi32(q[2], q[3]));
        }
        y[i].d = 1 / iscale;
    }
}

void tn_k_from_float_f16__avx2(const float *x, void *vy, int64_t k) {
    tn_fp16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < k; i++) y[i] = tn_fp32_to_fp16(x[i]);
}

void tn_k_from_float_bf16__avx2(const float *x, void *vy, int64_t k) {
    tn_bf16 *y = vy;
    int64_t i = 0;
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    for (; i + 16 <= k; i += 16) {
        __m256i r[2];
        for (int h = 0; h < 2; h++) {
            const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i + 8 * h));
            /* round to nearest even: u + 0x7fff + bit 16, then the top half; NaN -> quiet */
            const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
            const __m256i rnd = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
            const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
            const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
            r[h] = _mm256_blendv_epi8(rnd, qnan, nan);
        }
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256((__m256i *)(y + i), p);
    }
    for (; i < k; i++) y[i] = tn_fp32_to_bf16(x[i]);
}

void tn_k_to_float_f16__avx2(const void *vx, float *y, int64_t k) {
    const tn_fp16 *x = vx;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < k; i++) y[i] = tn_fp16_to_fp32(x[i]);
}

void tn_k_to_float_bf16__avx2(const void *vx, float *y, int64_t k) {
    const tn_bf16 *x = vx;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
    }
    for (; i < k; i++) y[i] = tn_bf16_to_fp32(x[i]);
}
