/*
 * quant_iq1.c — quantizers to iq1_s and iq1_m, byte-identical with ggml's quantize_iq1_s /
 * quantize_iq1_m (llama.cpp 3f545bec). Decoders in quant_iq2.c, grid maps in iq_map.c.
 *
 * Each element is -1, 0 or +1 plus a shared shift of +-1/8 per sub-block (iq1_s: 32 elements)
 * or per group of 8 (iq1_m: two shift signs per 16 elements). With three values the best
 * split can be searched exactly: sort the sub-block, and for every pair of boundaries (i1, i2)
 * the least-squares scale of "below i1 -> -1, up to i2 -> 0, the rest -> +1" follows from
 * running sums. The winning levels are then snapped to the 2048-entry grid per group of 8 (a
 * pattern that is not an entry takes its best listed neighbour) and the scale refitted.
 *
 * Invariant: ggml's float operations in ggml's order; the sort is the C library's qsort over the
 * same 8-byte (value, index) records with the same comparison, so equal values end up in the
 * same order as in llama-quantize on the same machine.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/iq_grid.h"
#include "quant/ksearch.h"
#include "quant/quant.h"

#define EPS_IQ1_S 1e-12f
#define EPS_IQ1_M 1e-7f

static const float x_p[3] = {-1 + TN_IQ1_DELTA, TN_IQ1_DELTA, 1 + TN_IQ1_DELTA};
static const float x_m[3] = {-1 - TN_IQ1_DELTA, -TN_IQ1_DELTA, 1 - TN_IQ1_DELTA};

typedef struct pair {
    float x;
    int32_t i;
} pair;

static int pair_cmp(const void *a, const void *b) {
    const float l = ((const pair *)a)->x, r = ((const pair *)b)->x;
    return l < r ? -1 : l > r ? 1 : 0;
}

/* The n elements of xb in ascending order (qsort, as ggml). */
static void sort_block(const float *xb, int n, pair *p) {
    for (int j = 0; j < n; j++) p[j].x = xb[j], p[j].i = j;
    qsort(p, (size_t)n, sizeof *p, pair_cmp);
}

/* Group of 8 with levels L (0..2, values xx[l]) onto the grid: its entry, or the listed neighbour
 * with the least weighted squared error at `scale` (ggml's iq1_find_best_neighbour2). *on is
 * cleared when the pattern was not an entry. */
static int snap8(const tn_iq_map *m, int8_t *L, const float *xb, const float *w, float scale, const float *xx, bool *on) {
    int key = 0;
    for (int j = 0; j < 8; j++) key |= L[j] << 2 * j;
    if (m->map[key] >= 0) return m->map[key];
    *on = false;
    const uint16_t *nb = m->neighbours - m->map[key] - 1;
    float best = FLT_MAX;
    int gi = nb[1];
    for (int j = 1; j <= nb[0]; j++) {
        const int8_t *pg = m->grid + 8 * (size_t)nb[j];
        float d2 = 0;
        for (int i = 0; i < 8; i++) {
            const float q = xx[(pg[i] - 1) / 2];
            const float diff = scale * q - xb[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best) best = d2, gi = nb[j];
    }
    for (int i = 0; i < 8; i++) L[i] = (int8_t)((m->grid[8 * (size_t)gi + i] - 1) / 2);
    return gi;
}

/* Weighted least-squares sums of groups gi[0..ng) (values xx_k[l]) against xb, accumulated. */
static void fit_groups(const tn_iq_map *m, int ng, const int *gi, const float *const *xx, const float *xb, const float *w,
                       float mul, float *sumqx, float *sumq2) {
    for (int k = 0; k < ng; k++) {
        const int8_t *pg = m->grid + 8 * (size_t)gi[k];
        for (int j = 0; j < 8; j++) {
            const float wj = w[8 * k + j];
            const float q = mul == 1 ? xx[k][(pg[j] - 1) / 2] : xx[k][(pg[j] - 1) / 2] * mul;
            *sumqx += wj * q * xb[8 * k + j];
            *sumq2 += wj * q * q;
        }
    }
}

/* 2 mean(x^2) of a super-block: the sigma2 of the importance weights qw * sqrt(sigma2 + x^2) */
static float sigma2_of(const float *xbl) {
    float sumx2 = 0;
    for (int i = 0; i < QK_K; i++) sumx2 += xbl[i] * xbl[i];
    return 2 * sumx2 / QK_K;
}

static float amax_of(const float *xb, int n) {
    float max = fabsf(xb[0]);
    for (int i = 1; i < n; i++) max = max > fabsf(xb[i]) ? max : fabsf(xb[i]);
    return max;
}

static void iq1_s_block(const tn_iq_map *m, const float *xbl, const float *qwb, block_iq1_s *y) {
    enum { BS = 32 };
    float scales[QK_K / BS], weight[BS], sumx[BS + 1], sumw[BS + 1];
    int8_t L[BS], shifts[QK_K / BS];
    pair p[BS];
    memset(y, 0, sizeof *y);
    const float sigma2 = sigma2_of(xbl);
    float max_scale = 0;
    for (int ib = 0; ib < QK_K / BS; ib++) {
        const float *xb = xbl + BS * ib;
        const float *qw = qwb + BS * ib;
        for (int i = 0; i < BS; i++) weight[i] = qw[i] * sqrtf(sigma2 + xb[i] * xb[i]);
        const float max = amax_of(xb, BS);
        scales[ib] = 0, shifts[ib] = 1;
        if (max < EPS_IQ1_S) continue;
        sort_block(xb, BS, p);
        sumx[0] = sumw[0] = 0;
        for (int j = 0; j < BS; j++) {
            const int i = p[j].i;
            sumx[j + 1] = sumx[j] + weight[i] * xb[i];
            sumw[j + 1] = sumw[j] + weight[i];
        }
        float best_score = -FLT_MAX, scale = max;
        int besti1 = -1, besti2 = -1, best_shift = 0;
        for (int i1 = 0; i1 <= BS; i1++) {
            for (int i2 = i1; i2 <= BS; i2++) {
                for (int sh = 1; sh >= -1; sh -= 2) {
                    const float *v = sh == 1 ? x_p : x_m;
                    const float sumqx = (sumx[i1] - sumx[0]) * v[0] + (sumx[i2] - sumx[i1]) * v[1] + (sumx[BS] - sumx[i2]) * v[2];
                    const float sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0] + (sumw[i2] - sumw[i1]) * v[1] * v[1] +
                                        (sumw[BS] - sumw[i2]) * v[2] * v[2];
                    if (sumq2 > 0 && sumqx * sumqx > best_score * sumq2) {
                        scale = sumqx / sumq2;
                        best_score = scale * sumqx;
                        besti1 = i1, besti2 = i2, best_shift = sh;
                    }
                }
            }
        }
        if (besti1 < 0 || besti2 < 0 || best_shift == 0) continue;
        for (int j = 0; j < BS; j++) L[p[j].i] = (int8_t)(j < besti1 ? 0 : j < besti2 ? 1 : 2);
        if (scale < 0) {
            for (int j = 0; j < BS; j++) L[j] = (int8_t)(2 - L[j]);
            scale = -scale;
            best_shift = -best_shift;
        }
        const float *xx = best_shift == 1 ? x_p : x_m;
        const float *xxs[4] = {xx, xx, xx, xx};
        bool on = true;
        int gi[BS / 8];
        for (int k = 0; k < BS / 8; k++) gi[k] = snap8(m, L + 8 * k, xb + 8 * k, weight + 8 * k, scale, xx, &on);
        if (!on) {
            float sumqx = 0, sumq2 = 0;
            fit_groups(m, BS / 8, gi, xxs, xb, weight, 1, &sumqx, &sumq2);
            if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
        }
        uint16_t h = 0;
        for (int k = 0; k < BS / 8; k++) {
            y->qs[(BS / 8) * ib + k] = (uint8_t)(gi[k] & 255);
            h |= (uint16_t)((gi[k] >> 8) << 3 * k);
        }
        y->qh[ib] = h;
        scales[ib] = scale;
        shifts[ib] = (int8_t)best_shift;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) return;
    const float d = max_scale / 15;
    y->d = tn_fp32_to_fp16(d * 1.125f);
    const float id = 1 / d;
    for (int ib = 0; ib < QK_K / BS; ib++) {
        int l = tn_clampi(tn_nearest_int(0.5f * (id * scales[ib] - 1)), 0, 7);
        if (shifts[ib] == -1) l |= 8;
        y->qh[ib] |= (uint16_t)(l << 12);
    }
}

/* iq1_m: the shift signs of a 16-element sub-block's two groups of 8; k = 2 * (first < 0) + (second < 0). */
static const float *shift_of(int k, int g) { return (g == 0 ? k < 2 : k % 2 == 0) ? x_p : x_m; }

static void iq1_m_weights(const float *xb, const float *qw, float sigma2, float *weight) {
    for (int i = 0; i < 16; i++) weight[i] = qw ? qw[i] * sqrtf(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
}

static void iq1_m_block(const tn_iq_map *m, const float *xbl, const float *qwb, block_iq1_m *y) {
    enum { BS = 16 };
    static const uint8_t masks[4] = {0x00, 0x80, 0x08, 0x88};
    float scales[QK_K / BS], weight[BS];
    int8_t L[BS], shifts[QK_K / BS];
    pair p[BS];
    memset(y, 0, sizeof *y);
    const float sigma2 = sigma2_of(xbl);
    float max_scale = 0;
    for (int ib = 0; ib < QK_K / BS; ib++) {
        const float *xb = xbl + BS * ib;
        iq1_m_weights(xb, qwb ? qwb + BS * ib : NULL, sigma2, weight);
        const float max = amax_of(xb, BS);
        scales[ib] = 0, shifts[ib] = 0;
        if (max < EPS_IQ1_M) continue;
        sort_block(xb, BS, p);
        float best_score = -FLT_MAX, scale = max;
        int besti1 = -1, besti2 = -1, best_k = -1;
        for (int i1 = 0; i1 <= BS; i1++) {
            for (int i2 = i1; i2 <= BS; i2++) {
                /* k: shifts of (first 8, second 8) = (+,+), (+,-), (-,+), (-,-) */
                float sumqx[4] = {0}, sumq2[4] = {0};
                for (int j = 0; j < BS; j++) {
                    const int i = p[j].i, lv = j < i1 ? 0 : j < i2 ? 1 : 2;
                    for (int k = 0; k < 4; k++) {
                        const float v = shift_of(k, i >= BS / 2)[lv];
                        sumqx[k] += weight[i] * v * xb[i];
                        sumq2[k] += weight[i] * v * v;
                    }
                }
                for (int k = 0; k < 4; k++) {
                    if (sumq2[k] > 0 && sumqx[k] * sumqx[k] > best_score * sumq2[k]) {
                        scale = sumqx[k] / sumq2[k];
                        best_score = scale * sumqx[k];
                        besti1 = i1, besti2 = i2, best_k = k;
                    }
                }
            }
        }
        if (besti1 < 0 || besti2 < 0 || best_k < 0) continue;
        for (int j = 0; j < BS; j++) L[p[j].i] = (int8_t)(j < besti1 ? 0 : j < besti2 ? 1 : 2);
        if (scale < 0) {
            for (int j = 0; j < BS; j++) L[j] = (int8_t)(2 - L[j]);
            scale = -scale;
            best_k = 3 - best_k;
        }
        const float *xxs[2] = {shift_of(best_k, 0), shift_of(best_k, 1)};
        bool on = true;
        int gi[2];
        for (int k = 0; k < 2; k++) gi[k] = snap8(m, L + 8 * k, xb + 8 * k, weight + 8 * k, scale, xxs[k], &on);
        if (!on) {
            float sumqx = 0, sumq2 = 0;
            fit_groups(m, 2, gi, xxs, xb, weight, 1, &sumqx, &sumq2);
            if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
        }
        y->qs[2 * ib] = (uint8_t)(gi[0] & 255);
        y->qs[2 * ib + 1] = (uint8_t)(gi[1] & 255);
        y->qh[ib] = (uint8_t)((gi[0] >> 8) | ((gi[1] >> 8) << 4));
        scales[ib] = scale;
        shifts[ib] = (int8_t)best_k;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) return;
    uint16_t sc[4] = {0};
    float d = max_scale / 15;
    const float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int ib = 0; ib < QK_K / BS; ib++) {
        const int l = tn_clampi(tn_nearest_int(0.5f * (id * scales[ib] - 1)), 0, 7);
        sc[ib / 4] |= (uint16_t)(l << 3 * (ib % 4));
        y->qh[ib] |= masks[shifts[ib]];
        const float *xb = xbl + BS * ib;
        iq1_m_weights(xb, qwb ? qwb + BS * ib : NULL, sigma2, weight);
        const int gi[2] = {y->qs[2 * ib] | (y->qh[ib] & 7) << 8, y->qs[2 * ib + 1] | (y->qh[ib] >> 4 & 7) << 8};
        const float *xxs[2] = {shift_of(shifts[ib], 0), shift_of(shifts[ib], 1)};
        fit_groups(m, 2, gi, xxs, xb, weight, (float)(2 * l + 1), &sumqx, &sumq2);
    }
    if (sumq2 > 0) d = sumqx / sumq2;
    const tn_fp16 h = tn_fp32_to_fp16(d * 1.1125f);
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    sc[0] |= (uint16_t)((u & 0x000f) << 12);
    sc[1] |= (uint16_t)((u & 0x00f0) << 8);
    sc[2] |= (uint16_t)((u & 0x0f00) << 4);
    sc[3] |= (uint16_t)(u & 0xf000);
    memcpy(y->scales, sc, sizeof sc);
}

bool tn_quantize_iq1(tn_dtype t, const float *x, void *y, int64_t k, const float *qw) {
    if ((t != TN_IQ1_S && t != TN_IQ1_M) || k % QK_K != 0 || (t == TN_IQ1_S && !qw)) return false;
    const tn_iq_map *m = tn_iq_map_get(t);
    if (!m) return false;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float *q = qw ? qw + QK_K * i : NULL;
        if (t == TN_IQ1_S) iq1_s_block(m, x + QK_K * i, q, (block_iq1_s *)y + i);
        else iq1_m_block(m, x + QK_K * i, q, (block_iq1_m *)y + i);
    }
    return true;
}
