/*
 * quant_iw.c — importance-weighted quantizers of the ggml block formats: what llama-quantize
 * --imatrix runs (ggml's quantize_row_<t>_impl with quant_weights, llama.cpp 34af94cd9), for
 * q2_K, q3_K, q4_K, q5_K, q6_K, q4_0, q4_1, q5_0 and q5_1. Each weight's importance is the
 * imatrix entry of its column (mean squared activation), usually multiplied by
 * sqrt(sigma2 + x^2) with sigma2 the mean square of the super-block (k-quants) or of the whole
 * row (legacy types) — so the legacy quantizers must see one whole row per call.
 *
 * Invariant: bytes identical to ggml's for the same inputs. As in quant_k.c the arithmetic keeps
 * ggml's operations and their order (every float rounding moves the searches); only the layout
 * of the code differs. Types without an importance-weighted variant (q8_0, f16, ...) are
 * quantized by the references, as ggml does. ggml's make_qkx3_quants with weights is
 * make_qkx2_quants (shared with quant_k.c through ksearch.h).
 */
#include <math.h>
#include <string.h>

#include "core/fp16.h"
#include "quant/ksearch.h"
#include "quant/quant.h"

/* Non-negative values (group scales or mins) to levels 0..nmax with a weighted search over 9
 * grids, then up to 5 passes moving single levels to the least-squares optimum (ggml
 * make_qp_quants). Returns the scale. */
float tn_make_qp_quants(int n, int nmax, const float *x, uint8_t *L, const float *quant_weights) {
    float max = 0;
    for (int i = 0; i < n; i++) max = max > x[i] ? max : x[i];
    if (max < TN_GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = nmax / max;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)tn_nearest_int(iscale * x[i]);
    const float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; i++) {
        const float diff = x[i] - scale * L[i];
        best_mse += quant_weights[i] * diff * diff;
    }
    for (int is = -4; is <= 4; is++) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * is + nmax) / max;
        const float scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; i++) {
            int l = tn_nearest_int(iscale_is * x[i]);
            l = l < nmax ? l : nmax;
            const float diff = x[i] - scale_is * l;
            mse += quant_weights[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = tn_nearest_int(iscale * x[i]);
        l = l < nmax ? l : nmax;
        L[i] = (uint8_t)l;
        const float w = quant_weights[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = quant_weights[i];
            float slx = sumlx - w * x[i] * L[i];
            float sl2 = suml2 - w * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                int new_l = tn_nearest_int(x[i] * sl2 / slx);
                new_l = new_l < nmax ? new_l : nmax;
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* 2-bit levels of 256 elements into 64 bytes (q2_K, q3_K). */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

/* weight[l] = qw[l] * sqrt(sigma2 + x[l]^2) for n elements */
static void iw_weights(const float *qw, const float *x, float sigma2, int n, float *weight) {
    for (int l = 0; l < n; l++) weight[l] = qw[l] * sqrtf(sigma2 + x[l] * x[l]);
}

static float sum_sq(const float *x, int64_t n) {
    float s = 0;
    for (int64_t j = 0; j < n; j++) s += x[j] * x[j];
    return s;
}

static void q2_K_iw(const float *x, block_q2_K *y, int64_t k, const float *quant_weights) {
    const int64_t nb = k / QK_K;
    uint8_t L[QK_K], Laux[16], Ls[QK_K / 16], Lm[QK_K / 16];
    float mins[QK_K / 16], scales[QK_K / 16], sw[QK_K / 16], weight[16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        memset(sw, 0, sizeof sw);
        const float sigma2 = sum_sq(x, QK_K) / QK_K;
        for (int j = 0; j < QK_K / 16; j++) {
            iw_weights(quant_weights + QK_K * i + 16 * j, x + 16 * j, sigma2, 16, weight);
            for (int l = 0; l < QK_K / 16; l++) sw[j] += weight[l];
            scales[j] = tn_make_qkx2_quants(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false);
        }
        float dm = tn_make_qp_quants(QK_K / 16, 15, scales, Ls, sw);
        float mm = tn_make_qp_quants(QK_K / 16, 15, mins, Lm, sw);
        y[i].d = tn_fp32_to_fp16(dm);
        y[i].dmin = tn_fp32_to_fp16(mm);
        dm = tn_fp16_to_fp32(y[i].d);
        mm = tn_fp16_to_fp32(y[i].dmin);
        for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = dm * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float m = mm * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++) L[16 * j + ii] = (uint8_t)tn_clampi(tn_nearest_int((x[16 * j + ii] + m) / d), 0, 3);
        }
        pack_2bit(L, y[i].qs);
    }
}

static void q3_K_iw(const float *x, block_q3_K *y, int64_t k, const float *quant_weights) {
    const int64_t nb = k / QK_K;
    int8_t L[QK_K], Ls[QK_K / 16];
    float scales[QK_K / 16], weight[16], sw[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        const float sigma2 = 2 * sum_sq(x, QK_K) / QK_K;
        for (int j = 0; j < QK_K / 16; j++) {
            iw_weights(quant_weights + QK_K * i + 16 * j, x + 16 * j, sigma2, 16, weight);
            float sumw = 0;
            for (int l = 0; l < 16; l++) sumw += weight[l];
            sw[j] = sumw;
            scales[j] = tn_make_qx_quants(16, 4, x + 16 * j, L + 16 * j, 1, weight);
        }
        memset(y[i].scales, 0, 12);
        const float d_block = tn_make_qx_quants(QK_K / 16, 32, scales, Ls, 1, sw);
        for (int j = 0; j < QK_K / 16; j++) {
            int l = Ls[j];
            if (j < 8) y[i].scales[j] = (uint8_t)(l & 0xF);
            else y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
            l >>= 4;
            y[i].scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
        }
        y[i].d = tn_fp32_to_fp16(d_block);
        for (int j = 0; j < QK_K / 16; j++) {
            int8_t sc = (int8_t)(j < 8 ? y[i].scales[j] & 0xF : y[i].scales[j - 8] >> 4);
            sc = (int8_t)((sc | (((y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
            const float d = tn_fp16_to_fp32(y[i].d) * sc;
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) L[16 * j + ii] = (int8_t)(tn_clampi(tn_nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
        }
        memset(y[i].hmask, 0, QK_K / 8);
        int m = 0;
        uint8_t hm = 1;
        for (int j = 0; j < QK_K; j++) {
            if (L[j] > 3) {
                y[i].hmask[m] |= hm;
                L[j] -= 4;
            }
            if (++m == QK_K / 8) m = 0, hm <<= 1;
        }
        pack_2bit((const uint8_t *)L, y[i].qs);
    }
}

/* q4_K (nmax 15) and q5_K (nmax 31): group fits, 6-bit scales/mins by make_qp_quants, packing of
 * the 12 scale bytes, requantization against the stored values into L. */
static void k4_groups_iw(const float *x, const float *qw_row, int64_t i, int nmax, tn_fp16 *d_out, tn_fp16 *dmin_out,
                         uint8_t *sc_out, uint8_t L[QK_K]) {
    uint8_t Laux[32], Ls[QK_K / 32], Lm[QK_K / 32];
    float weights[32], sw[QK_K / 32], mins[QK_K / 32], scales[QK_K / 32];
    const float sigma2 = 2 * sum_sq(x, QK_K) / QK_K;
    for (int j = 0; j < QK_K / 32; j++) {
        iw_weights(qw_row + QK_K * i + 32 * j, x + 32 * j, sigma2, 32, weights);
        float sumw = 0;
        for (int l = 0; l < 32; l++) sumw += weights[l];
        sw[j] = sumw;
        scales[j] = tn_make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false);
    }
    const float d_block = tn_make_qp_quants(QK_K / 32, 63, scales, Ls, sw);
    const float m_block = tn_make_qp_quants(QK_K / 32, 63, mins, Lm, sw);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = Ls[j], lm = Lm[j];
        if (nmax == 31) ls = ls < 63 ? ls : 63, lm = lm < 63 ? lm : 63; /* ggml clamps for q5_K only */
        if (j < 4) {
            sc_out[j] = ls;
            sc_out[j + 4] = lm;
        } else {
            sc_out[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            sc_out[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc_out[j - 0] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = tn_fp32_to_fp16(d_block);
    *dmin_out = tn_fp32_to_fp16(m_block);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        tn_get_scale_min_k4(j, sc_out, &sc, &m);
        const float d = tn_fp16_to_fp32(*d_out) * sc;
        if (!d) continue;
        const float dm = tn_fp16_to_fp32(*dmin_out) * m;
        for (int ii = 0; ii < 32; ii++) L[32 * j + ii] = (uint8_t)tn_clampi(tn_nearest_int((x[32 * j + ii] + dm) / d), 0, nmax);
    }
}

static void q4_K_iw(const float *x, block_q4_K *y, int64_t k, const float *qw) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        /* ggml writes the scale bytes with |= on whatever the block held: start from zero */
        memset(y[i].scales, 0, K_SCALE_SIZE);
        k4_groups_iw(x, qw, i, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

static void q5_K_iw(const float *x, block_q5_K *y, int64_t k, const float *qw) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        memset(y[i].scales, 0, K_SCALE_SIZE);
        k4_groups_iw(x, qw, i, 31, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < QK_K; n += 64, ql += 32) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) l1 -= 16, qh[j] |= m1;
                if (l2 > 15) l2 -= 16, qh[j] |= m2;
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 <<= 2, m2 <<= 2;
        }
    }
}

/* Legacy types: sigma2 is the mean square of the whole row (k = n_per_row). */
static void q4_0_iw(const float *x, block_q4_0 *y, int64_t k, const float *qw) {
    float weight[QK4_0];
    int8_t L[QK4_0];
    const float sigma2 = sum_sq(x, k) / k;
    for (int64_t ib = 0; ib < k / QK4_0; ib++) {
        const float *xb = x + QK4_0 * ib;
        iw_weights(qw + QK4_0 * ib, xb, sigma2, QK4_0, weight);
        y[ib].d = tn_fp32_to_fp16(tn_make_qx_quants(QK4_0, 8, xb, L, 1, weight));
        for (int j = 0; j < 16; j++) y[ib].qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
    }
}

static void q4_1_iw(const float *x, block_q4_1 *y, int64_t k, const float *qw) {
    float weight[QK4_1], min;
    uint8_t L[QK4_1], Laux[QK4_1];
    const float sigma2 = sum_sq(x, k) / k;
    for (int64_t ib = 0; ib < k / QK4_1; ib++) {
        const float *xb = x + QK4_1 * ib;
        iw_weights(qw + QK4_1 * ib, xb, sigma2, QK4_1, weight);
        const float d = tn_make_qkx2_quants(QK4_1, 15, xb, weight, L, &min, Laux, -0.9f, 0.05f, 36, false);
        y[ib].d = tn_fp32_to_fp16(d);
        y[ib].m = tn_fp32_to_fp16(-min);
        for (int j = 0; j < 16; j++) y[ib].qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
    }
}

/* low nibbles into qs, 5th bits into the u32 qh (q5_0 / q5_1) */
static void pack_q5(const uint8_t *L, uint8_t *qs, uint8_t *qh_out) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        const uint8_t xi0 = L[j], xi1 = L[j + 16];
        qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
        qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
    }
    memcpy(qh_out, &qh, sizeof qh);
}

static void q5_0_iw(const float *x, block_q5_0 *y, int64_t k, const float *qw) {
    float weight[QK5_0];
    int8_t L[QK5_0];
    const float sigma2 = sum_sq(x, k) / k;
    for (int64_t ib = 0; ib < k / QK5_0; ib++) {
        const float *xb = x + QK5_0 * ib;
        iw_weights(qw + QK5_0 * ib, xb, sigma2, QK5_0, weight);
        y[ib].d = tn_fp32_to_fp16(tn_make_qx_quants(QK5_0, 16, xb, L, 1, weight));
        pack_q5((const uint8_t *)L, y[ib].qs, y[ib].qh);
    }
}

static void q5_1_iw(const float *x, block_q5_1 *y, int64_t k, const float *qw) {
    float weight[QK5_1], min;
    uint8_t L[QK5_1], Laux[QK5_1];
    const float sigma2 = sum_sq(x, k) / k;
    for (int64_t ib = 0; ib < k / QK5_1; ib++) {
        const float *xb = x + QK5_1 * ib;
        iw_weights(qw + QK5_1 * ib, xb, sigma2, QK5_1, weight);
        const float d = tn_make_qkx2_quants(QK5_1, 31, xb, weight, L, &min, Laux, -0.9f, 0.05f, 36, false);
        y[ib].d = tn_fp32_to_fp16(d);
        y[ib].m = tn_fp32_to_fp16(-min);
        pack_q5(L, y[ib].qs, y[ib].qh);
    }
}

bool tn_quantize_row_imat(tn_dtype t, const float *x, void *y, int64_t k, const float *imat) {
    /* llama-quantize writes the iq4 types with ggml's file quantizer, importance or not */
    if (t == TN_IQ4_NL && k % QK4_NL == 0) return tn_quantize_iq4_nl(x, y, k, imat), true;
    if (t == TN_IQ4_XS && k % QK_K == 0) return tn_quantize_iq4_xs(x, y, k, imat), true;
    if (tn_dtype_is_iq_grid(t)) return tn_quantize_iq_grid(t, x, y, k, imat);
    if (!imat) return tn_quantize_row_ref(t, x, y, k);
    const int64_t bs = tn_dtype_get(t) ? tn_dtype_get(t)->blck_size : 0;
    if (bs <= 0 || k % bs) return false;
    switch (t) {
    case TN_Q2_K: q2_K_iw(x, y, k, imat); return true;
    case TN_Q3_K: q3_K_iw(x, y, k, imat); return true;
    case TN_Q4_K: q4_K_iw(x, y, k, imat); return true;
    case TN_Q5_K: q5_K_iw(x, y, k, imat); return true;
    case TN_Q6_K: tn_quantize_row_q6_K_w(x, y, k, imat); return true; /* quant_k.c */
    case TN_Q4_0: q4_0_iw(x, y, k, imat); return true;
    case TN_Q4_1: q4_1_iw(x, y, k, imat); return true;
    case TN_Q5_0: q5_0_iw(x, y, k, imat); return true;
    case TN_Q5_1: q5_1_iw(x, y, k, imat); return true;
    default: return tn_quantize_row_ref(t, x, y, k);
    }
}
