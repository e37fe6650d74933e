/*
 * quant_iq.c — ggml's lookup-table and ternary block formats: iq4_nl, iq4_xs (4-bit indices into
 * a 16-entry non-linear table), mxfp4 (e8m0 exponent + e2m1 codes) and tq1_0 / tq2_0 (ggml's
 * ternary types; not tern's tq<b>g<G>). Dequantizers bit-exact with ggml's dequantize_row_*,
 * quantizers byte-identical with what llama-quantize writes (ggml's quantize_<t>, with or without
 * importance weights), layouts in blocks.h.
 *
 * Invariant: the float arithmetic keeps ggml's operations and their order (each rounding moves a
 * search), so the bytes equal ggml's; the code around it is tern's. The two iq4 types share one
 * scale search (iq4_search) that runs per 32-element sub-block and, for iq4_xs, then fits the
 * 6-bit sub-block scales to one fp16 super-block scale.
 */
#include <math.h>
#include <string.h>

#include "quant/ksearch.h"
#include "quant/quant.h"

const int8_t tn_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int8_t tn_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ---- dequantization -------------------------------------------------------------------------- */

void tn_dequantize_row_iq4_nl(const block_iq4_nl *x, float *y, int64_t k) {
    for (int64_t i = 0; i < k / QK4_NL; i++, y += QK4_NL) {
        const float d = tn_fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK4_NL / 2; j++) {
            y[j] = d * tn_kvalues_iq4nl[x[i].qs[j] & 0xF];
            y[j + QK4_NL / 2] = d * tn_kvalues_iq4nl[x[i].qs[j] >> 4];
        }
    }
}

/* 6-bit scale code of sub-block ib (0..7) of an iq4_xs block; its scale is d * (code - 32). */
static inline int iq4_xs_scale(const block_iq4_xs *b, int ib) {
    return ((b->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((b->scales_h >> 2 * ib) & 3) << 4);
}

void tn_dequantize_row_iq4_xs(const block_iq4_xs *x, float *y, int64_t k) {
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = tn_fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++, y += 32) {
            const float dl = d * (iq4_xs_scale(&x[i], ib) - 32);
            const uint8_t *qs = x[i].qs + 16 * ib;
            for (int j = 0; j < 16; j++) {
                y[j] = dl * tn_kvalues_iq4nl[qs[j] & 0xF];
                y[j + 16] = dl * tn_kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

void tn_dequantize_row_mxfp4(const block_mxfp4 *x, float *y, int64_t k) {
    for (int64_t i = 0; i < k / QK_MXFP4; i++, y += QK_MXFP4) {
        const float d = tn_e8m0_to_fp32_half(x[i].e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            y[j] = tn_kvalues_mxfp4[x[i].qs[j] & 0xF] * d;
            y[j + QK_MXFP4 / 2] = tn_kvalues_mxfp4[x[i].qs[j] >> 4] * d;
        }
    }
}

/* Trit n (0 = most significant) of a tq1_0 byte: the byte is a base-3 fraction of 256, so
 * multiplying by 3^n (mod 256) shifts trit n to the top, and * 3 >> 8 reads it. */
static inline int tq1_trit(uint8_t byte, int n) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const uint8_t q = (uint8_t)(byte * pow3[n]);
    return (int)(((uint16_t)q * 3) >> 8);
}

/* The 256 trits (0, 1, 2 = value -1, 0, +1) of a tq1_0 block in element order: qs[0..160) holds
 * elements 32-wide (byte m of group j: elements 160 j/32 + 32 n + m), qs[160..192) 16-wide,
 * qh the last 16 elements 4 per byte. */
static void tq1_trits(const block_tq1_0 *b, uint8_t t[QK_K]) {
    const int n32 = (int)sizeof b->qs - (int)sizeof b->qs % 32;
    int e = 0;
    for (int j = 0; j < n32; j += 32)
        for (int n = 0; n < 5; n++)
            for (int m = 0; m < 32; m++) t[e++] = (uint8_t)tq1_trit(b->qs[j + m], n);
    for (int j = n32; j < (int)sizeof b->qs; j += 16)
        for (int n = 0; n < 5; n++)
            for (int m = 0; m < 16; m++) t[e++] = (uint8_t)tq1_trit(b->qs[j + m], n);
    for (int n = 0; n < 4; n++)
        for (int j = 0; j < (int)sizeof b->qh; j++) t[e++] = (uint8_t)tq1_trit(b->qh[j], n);
}

void tn_tq1_0_trits(const block_tq1_0 *b, uint8_t t[QK_K]) { tq1_trits(b, t); }

void tn_dequantize_row_tq1_0(const block_tq1_0 *x, float *y, int64_t k) {
    uint8_t t[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = tn_fp16_to_fp32(x[i].d);
        tq1_trits(&x[i], t);
        for (int j = 0; j < QK_K; j++) y[j] = (float)(t[j] - 1) * d;
    }
}

void tn_dequantize_row_tq2_0(const block_tq2_0 *x, float *y, int64_t k) {
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = tn_fp16_to_fp32(x[i].d);
        for (int j = 0; j < (int)sizeof x->qs; j += 32)
            for (int l = 0; l < 4; l++)
                for (int m = 0; m < 32; m++) *y++ = (float)(((x[i].qs[j + m] >> (2 * l)) & 3) - 1) * d;
    }
}

/* ---- iq4_nl / iq4_xs ------------------------------------------------------------------------- */

/* Index of the table value nearest to v (ties to the upper one only when strictly nearer), by
 * bisection over the sorted table: ggml's best_index_int8. */
static int nearest_level(const int8_t *val, float v) {
    if (v <= val[0]) return 0;
    if (v >= val[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < val[mid]) hi = mid;
        else lo = mid;
    }
    return v - val[hi - 1] < val[hi] - v ? hi - 1 : hi;
}

/* Weighted fit of the levels nearest to id * x: returns sum w q x and sets *sumq2 = sum w q^2
 * (and L, when not NULL). */
static float iq4_fit(const float *x, const float *w, int n, float id, float *sumq2, uint8_t *L) {
    float sqx = 0, sq2 = 0;
    for (int j = 0; j < n; j++) {
        const int l = nearest_level(tn_kvalues_iq4nl, id * x[j]);
        if (L) L[j] = (uint8_t)l;
        const float q = tn_kvalues_iq4nl[l];
        sqx += w[j] * q * x[j];
        sq2 += w[j] * q * q;
    }
    *sumq2 = sq2;
    return sqx;
}

/*
 * One super-block of sb elements (32 for iq4_nl, 256 for iq4_xs) in 32-element sub-blocks:
 * ggml's quantize_row_iq4_nl_impl. Per sub-block, the scale that puts the largest-magnitude
 * element on the table's end, refined by least squares and by 2*ntry+1 nearby inverse scales
 * (ntry 7 in files, -1 = none for the activation-style reference); weights are the importance
 * qw * sqrt(sigma2 + x^2) (sigma2 = twice the mean square) or x^2 without qw. For iq4_xs the
 * sub-block scales then become 6-bit multiples of one fp16 scale and the levels are chosen again.
 * L persists between calls (ggml's stack array does): an all-zero iq4_nl block without the
 * ntry pass keeps the previous block's levels, which its scale 0 makes irrelevant.
 */
static void iq4_search(int sb, const float *x, tn_fp16 *dh, uint8_t *q4, uint16_t *scales_h, uint8_t *scales_l,
                       const float *qw, int ntry, uint8_t L[QK_K]) {
    const int8_t *val = tn_kvalues_iq4nl;
    const int nsub = sb / 32;
    float scales[QK_K / 32], weight[32];
    float sigma2 = 0;
    for (int j = 0; j < sb; j++) sigma2 += x[j] * x[j];
    sigma2 *= 2.f / sb;
    memset(q4, 0, (size_t)sb / 2);
    *dh = tn_fp32_to_fp16(0.f);

    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < nsub; ib++) {
        const float *xb = x + 32 * ib;
        uint8_t *Lb = L + 32 * ib;
        for (int j = 0; j < 32; j++) weight[j] = qw ? qw[32 * ib + j] * sqrtf(sigma2 + xb[j] * xb[j]) : xb[j] * xb[j];
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(xb[j]) > amax) amax = fabsf(xb[j]), max = xb[j];
        if (amax < TN_GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float d = ntry > 0 ? -max / val[0] : max / val[0];
        float sumq2;
        float sumqx = iq4_fit(xb, weight, 32, 1 / d, &sumq2, Lb);
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; itry++) {
            sumqx = iq4_fit(xb, weight, 32, (itry + val[0]) / max, &sumq2, NULL);
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if (fabsf(d) > amax_scale) amax_scale = fabsf(d), max_scale = d;
    }

    if (nsub > 1) {
        *scales_h = 0;
        const float d = -max_scale / 32;
        *dh = tn_fp32_to_fp16(d);
        const float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < nsub; ib++) {
            const int l = tn_clampi(tn_nearest_int(id * scales[ib]), -32, 31);
            const float dl = d * l;
            const float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++) L[32 * ib + j] = (uint8_t)nearest_level(val, idl * x[32 * ib + j]);
            const int code = l + 32;
            if (ib % 2 == 0) scales_l[ib / 2] = (uint8_t)(code & 0xF);
            else scales_l[ib / 2] |= (uint8_t)((code & 0xF) << 4);
            *scales_h |= (uint16_t)((code >> 4) << 2 * ib);
        }
    } else {
        *dh = tn_fp32_to_fp16(scales[0]);
        if (ntry > 0) {
            const float id = scales[0] ? 1 / scales[0] : 0;
            for (int j = 0; j < sb; j++) L[j] = (uint8_t)nearest_level(val, id * x[j]);
        }
    }
    for (int i = 0; i < sb / 32; i++)
        for (int j = 0; j < 16; j++) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

/* ntry -1: ggml's quantize_row_iq4_nl_ref (the from_float path); files use tn_quantize_iq4_nl. */
void tn_quantize_row_iq4_nl_ref(const float *x, block_iq4_nl *y, int64_t k) {
    uint8_t L[QK_K] = {0};
    for (int64_t i = 0; i < k / QK4_NL; i++) iq4_search(QK4_NL, x + QK4_NL * i, &y[i].d, y[i].qs, NULL, NULL, NULL, -1, L);
}

void tn_quantize_iq4_nl(const float *x, block_iq4_nl *y, int64_t k, const float *qw) {
    uint8_t L[QK_K] = {0};
    for (int64_t i = 0; i < k / QK4_NL; i++)
        iq4_search(QK4_NL, x + QK4_NL * i, &y[i].d, y[i].qs, NULL, NULL, qw ? qw + QK4_NL * i : NULL, 7, L);
}

void tn_quantize_iq4_xs(const float *x, block_iq4_xs *y, int64_t k, const float *qw) {
    uint8_t L[QK_K] = {0};
    for (int64_t i = 0; i < k / QK_K; i++)
        iq4_search(QK_K, x + QK_K * i, &y[i].d, y[i].qs, &y[i].scales_h, y[i].scales_l, qw ? qw + QK_K * i : NULL, 7, L);
}

void tn_quantize_row_iq4_xs_ref(const float *x, block_iq4_xs *y, int64_t k) { tn_quantize_iq4_xs(x, y, k, NULL); }

/* ---- mxfp4 ----------------------------------------------------------------------------------- */

/* First table index with the smallest |val * e - v| (index 0 for zero, not 8). */
static int mxfp4_index(float v, float e) {
    int best = 0;
    float best_err = fabsf(tn_kvalues_mxfp4[0] * e - v);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf(tn_kvalues_mxfp4[i] * e - v);
        if (err < best_err) best = i, best_err = err;
    }
    return best;
}

void tn_quantize_row_mxfp4_ref(const float *x, block_mxfp4 *y, int64_t k) {
    for (int64_t i = 0; i < k / QK_MXFP4; i++, x += QK_MXFP4) {
        float amax = 0;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        /* scale d = 2^(floor(log2 amax) - 3): amax lies in [8 d, 16 d), values above the table's
         * 12 d clip to it (ggml's choice) */
        const uint8_t e = amax > 0.0f ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = tn_e8m0_to_fp32_half(e);
        y[i].e = e;
        for (int j = 0; j < QK_MXFP4 / 2; j++)
            y[i].qs[j] = (uint8_t)(mxfp4_index(x[j], d) | mxfp4_index(x[j + QK_MXFP4 / 2], d) << 4);
    }
}

/* ---- tq1_0 / tq2_0 --------------------------------------------------------------------------- */

/* The block's scale amax and its inverse; d is stored as fp16, the trits use the float. */
static float ternary_scale(const float *x, tn_fp16 *d) {
    float amax = 0;
    for (int j = 0; j < QK_K; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
    *d = tn_fp32_to_fp16(amax);
    return amax ? 1.0f / amax : 0.0f;
}

uint8_t tn_tq1_0_pack(const uint8_t *t, int stride, int n) {
    unsigned q = 0;
    for (int i = 0; i < n; i++) q = q * 3 + t[i * stride];
    for (int i = n; i < 5; i++) q *= 3;
    return (uint8_t)((q * 256 + 242) / 243);
}

/* The trits of n values x[t * stride] (scaled by id, rounded: -1, 0, 1 -> 0, 1, 2) packed. */
static uint8_t tq1_pack(const float *x, int stride, int n, float id) {
    uint8_t t[5];
    for (int i = 0; i < n; i++) t[i] = (uint8_t)(lroundf(x[i * stride] * id) + 1);
    return tn_tq1_0_pack(t, 1, n);
}

void tn_quantize_row_tq1_0_ref(const float *x, block_tq1_0 *y, int64_t k) {
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float id = ternary_scale(x, &y[i].d);
        const int n32 = (int)sizeof y->qs - (int)sizeof y->qs % 32;
        for (int j = 0; j < n32; j += 32, x += 5 * 32)
            for (int m = 0; m < 32; m++) y[i].qs[j + m] = tq1_pack(x + m, 32, 5, id);
        for (int j = n32; j < (int)sizeof y->qs; j += 16, x += 5 * 16)
            for (int m = 0; m < 16; m++) y[i].qs[j + m] = tq1_pack(x + m, 16, 5, id);
        for (int j = 0; j < (int)sizeof y->qh; j++) y[i].qh[j] = tq1_pack(x + j, (int)sizeof y->qh, 4, id);
        x += 4 * sizeof y->qh;
    }
}

void tn_quantize_row_tq2_0_ref(const float *x, block_tq2_0 *y, int64_t k) {
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float id = ternary_scale(x, &y[i].d);
        for (int j = 0; j < (int)sizeof y->qs; j += 32, x += 4 * 32)
            for (int m = 0; m < 32; m++) {
                unsigned q = 0;
                for (int n = 0; n < 4; n++) q += (unsigned)((lroundf(x[m + 32 * n] * id) + 1) & 3) << (2 * n);
                y[i].qs[j + m] = (uint8_t)q;
            }
    }
}
