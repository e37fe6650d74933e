/*
 * vec_dot.c (scalar) — reference dot products of a weight row with an activation row in the
 * weight type's vec_dot_type (kern/kern.h contract; declarations in kernels.h).
 *
 * Each kernel computes what ggml's generic (non-SIMD) ggml_vec_dot_<w>_<a> computes at llama.cpp
 * 34af94cd9: exact integer sums per block, then the block scales in float, with ggml's float
 * operations in ggml's order, so results are bit-identical to ggml's generic path. The k-quant
 * kernels keep ggml's eight lane accumulators (element e feeds lane e % 8): the integer lane sums
 * are exact, but the float lane totals are rounded per block and added in lane order at the end,
 * and that order is part of the result.
 *
 * Float formats: f32 x f32 multiplies in float and accumulates in double, as ggml's scalar
 * ggml_vec_dot_f32. f16 x f16 and bf16 x bf16 multiply the widened values in float and
 * ACCUMULATE IN FLOAT (ggml's generic path uses double there; tern's SIMD kernels accumulate in
 * float lanes, so a float reference is the useful one to test them against).
 */
#include <string.h>

#include "kern/scalar/kernels.h"
#include "quant/quant.h"

/* ---- 32-element blocks ---------------------------------------------------------------------- */

void tn_k_vec_dot_q4_0_q8_0__scalar(int64_t k, float *s, const void *w, const void *x) {
    const block_q4_0 *wb = w;
    const block_q8_0 *xb = x;
    const int64_t nb = k / QK8_0;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++) {
        /* Integer dot of the levels (q - 8) with the int8 activations. */
        int sumi = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            sumi += ((wb[i].qs[j] & 0x0F) - 8) * xb[i].qs[j];
            sumi += ((wb[i].qs[j] >> 4) - 8) * xb[i].qs[j + QK4_0 / 2];
        }
        /* ggml's order: (sumi * dw) * dx. */
        sumf += sumi * tn_fp16_to_fp32(wb[i].d) * tn_fp16_to_fp32(xb[i].d);
    }
    *s = sumf;
}

void tn_k_vec_dot_q4_1_q8_1__scalar(int64_t k, float *s, const void *w, const void *x) {
    const block_q4_1 *wb = w;
    const block_q8_1 *xb = x;
    const int64_t nb = k / QK8_1;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < QK4_1 / 2; j++) {
            sumi += (wb[i].qs[j] & 0x0F) * xb[i].qs[j];
            sumi += (wb[i].qs[j] >> 4) * xb[i].qs[j + QK4_1 / 2];
        }
        /* sum((q d + m) * a) = d dx sum(q a) + m * (dx sum(a)), the last factor being x's s. */
        sumf += (tn_fp16_to_fp32(wb[i].d) * tn_fp16_to_fp32(xb[i].d)) * sumi +
                tn_fp16_to_fp32(wb[i].m) * tn_fp16_to_fp32(xb[i].s);
    }
    *s = sumf;
}

void tn_k_vec_dot_q5_0_q8_0__scalar(int64_t k, float *s, const void *w, const void *x) {
    const block_q5_0 *wb = w;
    const block_q8_0 *xb = x;
    const int64_t nb = k / QK8_0;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++) {
        uint32_t qh;
        memcpy(&qh, wb[i].qh, sizeof qh);
        int sumi = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int lo = ((wb[i].qs[j] & 0x0F) | (int)(((qh >> j) & 1) << 4)) - 16;
            const int hi = ((wb[i].qs[j] >> 4) | (int)(((qh >> (j + QK5_0 / 2)) & 1) << 4)) - 16;
            sumi += lo * xb[i].qs[j] + hi * xb[i].qs[j + QK5_0 / 2];
        }
        sumf += (tn_fp16_to_fp32(wb[i].d) * tn_fp16_to_fp32(xb[i].d)) * sumi;
    }
    *s = sumf;
}

void tn_k_vec_dot_q5_1_q8_1__scalar(int64_t k, float *s, const void *w, const void *x) {
    const block_q5_1 *wb = w;
    const block_q8_1 *xb = x;
    const int64_t nb = k / QK8_1;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++) {
        uint32_t qh;
        memcpy(&qh, wb[i].qh, sizeof qh);
        int sumi = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int lo = (wb[i].qs[j] & 0x0F) | (int)(((qh >> j) & 1) << 4);
            const int hi = (wb[i].qs[j] >> 4) | (int)(((qh >> (j + QK5_1 / 2)) & 1) << 4);
            sumi += lo * xb[i].qs[j] + hi * xb[i].qs[j + QK5_1 / 2];
        }
        sumf += (tn_fp16_to_fp32(wb[i].d) * tn_fp16_to_fp32(xb[i].d)) * sumi +
                tn_fp16_to_fp32(wb[i].m) * tn_fp16_to_fp32(xb[i].s);
    }
    *s = sumf;
}

void tn_k_vec_dot_q8_0_q8_0__scalar(int64_t k, float *s, const void *w, const void *x) {
    const block_q8_0 *wb = w;
    const block_q8_0 *xb = x;
    const int64_t nb = k / QK8_0;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += wb[i].qs[j] * xb[i].qs[j];
        /* ggml's order: sumi * (dw * dx). */
        sumf += sumi * (tn_fp16_to_fp32(wb[i].d) * tn_fp16_to_fp32(xb[i].d));
    }
    *s = sumf;
}

/* ---- 256-element super-blocks against q8_K ---------------------------------------------------- */

/* ggml's eight integer lanes for one super-block: lane[e % 8] += scale16[e / 16] * a[e] * q8[e],
 * where a holds the signed weight levels and scale16 the integer scale of each 16 elements. */
static void tn_lane_sums(const int8_t a[QK_K], const int8_t q8[QK_K], const int scale16[QK_K / 16], int32_t lane[8]) {
    memset(lane, 0, 8 * sizeof lane[0]);
    for (int e = 0; e < QK_K; e++) lane[e % 8] += scale16[e / 16] * (a[e] * q8[e]);
}

/* 2-bit field of element e in the q2_K/q3_K layout (see quant_k.c). */
static inline int tn_2bit(const uint8_t *qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

void tn_k_vec_dot_q2_K_q8_K__scalar(int64_t k, float *s, const void *w, const void *x) {
    const block_q2_K *wb = w;
    const block_q8_K *xb = x;
    const int64_t nb = k / QK_K;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *sc = wb[i].scales;
        /* Min term: sum over groups of min_g * (sum of the group's activations) = bsums. */
        int summs = 0;
        for (int j = 0; j < QK_K / 16; j++) summs += xb[i].bsums[j] * (sc[j] >> 4);
        /* Scale term: sum over groups of scale_g * dot(levels, activations), all integer. */
        int isum = 0;
        for (int g = 0; g < QK_K / 16; g++) {
            int isuml = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) isuml += xb[i].qs[e] * tn_2bit(wb[i].qs, e);
            isum += (sc[g] & 0xF) * isuml;
        }
        const float dall = xb[i].d * tn_fp16_to_fp32(wb[i].d);
        const float dmin = xb[i].d * tn_fp16_to_fp32(wb[i].dmin);
        sumf += dall * isum - dmin * summs;
    }
    *s = sumf;
}

void tn_k_vec_dot_q3_K_q8_K__scalar(int64_t k, float *s, const void *w, const void *x) {
    const block_q3_K *wb = w;
    const block_q8_K *xb = x;
    const int64_t nb = k / QK_K;
    float sums[8] = {0};
    for (int64_t i = 0; i < nb; i++) {
        /* Signed levels: low 2 bits, minus 4 when the hmask bit is clear. */
        int8_t a[QK_K];
        for (int e = 0; e < QK_K; e++) a[e] = (int8_t)(tn_2bit(wb[i].qs, e) - (((wb[i].hmask[e % 32] >> (e / 32)) & 1) ? 0 : 4));
        /* The sixteen 6-bit scales, unbiased (layout in quant_k.c). */
        int scale16[QK_K / 16];
        for (int j = 0; j < QK_K / 16; j++) {
            const int lo = j < 8 ? wb[i].scales[j] & 0xF : wb[i].scales[j - 8] >> 4;
            const int hi = (wb[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3;
            scale16[j] = (lo | (hi << 4)) - 32;
        }
        int32_t lane[8];
        tn_lane_sums(a, xb[i].qs, scale16, lane);
        const float d = tn_fp16_to_fp32(wb[i].d) * xb[i].d;
        for (int l = 0; l < 8; l++) sums[l] += d * lane[l];
    }
    float sumf = 0;
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

/* Levels of a q4_K/q5_K super-block: group g (32 elements) is the low (g even) or high (g odd)
 * nibble of qs[32 (g/2) + e%32], plus 16 when bit g of qh[e % 32] is set (q5_K; qh NULL for q4_K). */
static void tn_k4_levels(const uint8_t *qs, const uint8_t *qh, int8_t a[QK_K]) {
    for (int e = 0; e < QK_K; e++) {
        const int g = e / 32;
        int q = (qs[32 * (g / 2) + e % 32] >> (4 * (g % 2))) & 0xF;
        if (qh && ((qh[e % 32] >> g) & 1)) q += 16;
        a[e] = (int8_t)q;
    }
}

/* One q4_K/q5_K super-block: scale terms go to ggml's float lanes, the min term (6-bit min per
 * group times the group's activation sums) is subtracted from sumf right away. */
static void tn_k4_block(const int8_t a[QK_K], const uint8_t scales[K_SCALE_SIZE], tn_fp16 d_w, tn_fp16 dmin_w,
                        const block_q8_K *xb, float sums[8], float *sumf) {
    int scale16[QK_K / 16];
    int sumi = 0;
    for (int g = 0; g < QK_K / 32; g++) {
        uint8_t sc, m;
        tn_get_scale_min_k4(g, scales, &sc, &m);
        scale16[2 * g] = scale16[2 * g + 1] = sc;
        sumi += (xb->bsums[2 * g] + xb->bsums[2 * g + 1]) * m;
    }
    int32_t lane[8];
    tn_lane_sums(a, xb->qs, scale16, lane);
    const float d = tn_fp16_to_fp32(d_w) * xb->d;
    for (int l = 0; l < 8; l++) sums[l] += d * lane[l];
    const float dmin = tn_fp16_to_fp32(dmin_w) * xb->d;
    *sumf -= dmin * sumi;
}

void tn_k_vec_dot_q4_K_q8_K__scalar(int64_t k, float *s, const void *w, const void *x) {
    const block_q4_K *wb = w;
    const block_q8_K *xb = x;
    float sums[8] = {0}, sumf = 0;
    for (int64_t i = 0; i < k / QK_K; i++) {
        int8_t a[QK_K];
        tn_k4_levels(wb[i].qs, NULL, a);
        tn_k4_block(a, wb[i].scales, wb[i].d, wb[i].dmin, &xb[i], sums, &sumf);
    }
    /* The lanes are added last, after all min terms (ggml's order). */
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

void tn_k_vec_dot_q5_K_q8_K__scalar(int64_t k, float *s, const void *w, const void *x) {
    const block_q5_K *wb = w;
    const block_q8_K *xb = x;
    float sums[8] = {0}, sumf = 0;
    for (int64_t i = 0; i < k / QK_K; i++) {
        int8_t a[QK_K];
        tn_k4_levels(wb[i].qs, wb[i].qh, a);
        tn_k4_block(a, wb[i].scales, wb[i].d, wb[i].dmin, &xb[i], sums, &sumf);
    }
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

void tn_k_vec_dot_q6_K_q8_K__scalar(int64_t k, float *s, const void *w, const void *x) {
    const block_q6_K *wb = w;
    const block_q8_K *xb = x;
    const int64_t nb = k / QK_K;
    float sums[8] = {0};
    for (int64_t i = 0; i < nb; i++) {
        /* Signed levels -32..31 (layout in quant_k.c). */
        int8_t a[QK_K];
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, r = (e % 128) / 32, l = e % 32;
            const int lo = (wb[i].ql[64 * h + l + 32 * (r % 2)] >> (4 * (r / 2))) & 0xF;
            const int hi = (wb[i].qh[32 * h + l] >> (2 * r)) & 3;
            a[e] = (int8_t)((lo | (hi << 4)) - 32);
        }
        int scale16[QK_K / 16];
        for (int j = 0; j < QK_K / 16; j++) scale16[j] = wb[i].scales[j];
        int32_t lane[8];
        tn_lane_sums(a, xb[i].qs, scale16, lane);
        const float d = tn_fp16_to_fp32(wb[i].d) * xb[i].d;
        for (int l = 0; l < 8; l++) sums[l] += d * lane[l];
    }
    float sumf = 0;
    for (int l = 0; l < 8; l++) sumf += sums[l];
    *s = sumf;
}

/* ---- plain float formats ----------------------------------------------------------------------- */

void tn_k_vec_dot_f16_f16__scalar(int64_t k, float *s, const void *w, const void *x) {
    const tn_fp16 *a = w, *b = x;
    float sumf = 0; /* float accumulation: see the file comment */
    for (int64_t i = 0; i < k; i++) sumf += tn_fp16_to_fp32(a[i]) * tn_fp16_to_fp32(b[i]);
    *s = sumf;
}

void tn_k_vec_dot_bf16_bf16__scalar(int64_t k, float *s, const void *w, const void *x) {
    const tn_bf16 *a = w, *b = x;
    float sumf = 0; /* float accumulation: see the file comment */
    for (int64_t i = 0; i < k; i++) sumf += tn_bf16_to_fp32(a[i]) * tn_bf16_to_fp32(b[i]);
    *s = sumf;
}

void tn_k_vec_dot_f32_f32__scalar(int64_t k, float *s, const void *w, const void *x) {
    const float *a = w, *b = x;
    double sumf = 0; /* ggml's scalar path: float products, double sum */
    for (int64_t i = 0; i < k; i++) sumf += (double)(a[i] * b[i]);
    *s = (float)sumf;
}
