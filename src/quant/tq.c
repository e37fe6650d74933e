/*
 * tq.c — scalar reference of tern's any-bit group quantization (format in tq.h and
 * docs/formats.md): names, quantizer (weighted least-squares scale search), dequantizer, packing
 * and the fused dequant-dot every optimized kernel is tested against.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "quant/tq.h"

bool tn_tq_from_name(const char *name, tn_tq_params *out) {
    if (tolower((unsigned char)name[0]) != 't' || tolower((unsigned char)name[1]) != 'q') return false;
    const char *s = name + 2;
    if (*s < '1' || *s > '8') return false;
    tn_tq_params p = {*s - '0', 64, true};
    s++;
    if (tolower((unsigned char)*s) == 'g') {
        char *end;
        long g = strtol(s + 1, &end, 10);
        if (g != 32 && g != 64 && g != 128 && g != 256) return false;
        p.group = (int)g;
        p.asym = false;
        s = end;
    }
    if (tolower((unsigned char)*s) == 'a') p.asym = true, s++;
    else if (tolower((unsigned char)*s) == 's') p.asym = false, s++;
    if (*s) return false;
    *out = p;
    return true;
}

void tn_tq_name(const tn_tq_params *p, char *buf, size_t cap) {
    snprintf(buf, cap, "tq%dg%d%s", p->bits, p->group, p->asym ? "a" : "");
}

void tn_tq_planes(int bits, int w[4]) {
    static const int tab[9][4] = {{0}, {1}, {2}, {2, 1}, {4}, {4, 1}, {4, 2}, {4, 2, 1}, {8}};
    memcpy(w, tab[bits], sizeof tab[0]);
}

/* ---- packing -------------------------------------------------------------------------------- */

static void pack_chunk(int w, const uint8_t *v, uint8_t *out) {
    switch (w) {
    case 8: memcpy(out, v, 32); break;
    case 4:
        for (int j = 0; j < 16; j++) out[j] = (uint8_t)(v[j] | v[j + 16] << 4);
        break;
    case 2:
        for (int j = 0; j < 8; j++) out[j] = (uint8_t)(v[j] | v[j + 8] << 2 | v[j + 16] << 4 | v[j + 24] << 6);
        break;
    case 1:
        memset(out, 0, 4);
        for (int n = 0; n < 32; n++) out[n / 8] |= (uint8_t)(v[n] << (n % 8));
        break;
    }
}

static void unpack_chunk(int w, const uint8_t *in, uint8_t *v) {
    switch (w) {
    case 8: memcpy(v, in, 32); break;
    case 4:
        for (int j = 0; j < 16; j++) v[j] = in[j] & 15, v[j + 16] = in[j] >> 4;
        break;
    case 2:
        for (int j = 0; j < 8; j++)
            v[j] = in[j] & 3, v[j + 8] = (in[j] >> 2) & 3, v[j + 16] = (in[j] >> 4) & 3, v[j + 24] = in[j] >> 6;
        break;
    case 1:
        for (int n = 0; n < 32; n++) v[n] = (in[n / 8] >> (n % 8)) & 1;
        break;
    }
}

void tn_tq_pack_block(const tn_tq_params *p, const uint8_t *q, uint16_t d, uint16_t m, uint8_t *blk) {
    memcpy(blk, &d, 2);
    uint8_t *o = blk + 2;
    if (p->asym) memcpy(o, &m, 2), o += 2;
    int w[4];
    tn_tq_planes(p->bits, w);
    int shift = 0;
    for (int pl = 0; w[pl]; pl++) {
        const uint8_t mask = (uint8_t)((1 << w[pl]) - 1);
        for (int c = 0; c < p->group / 32; c++) {
            uint8_t v[32];
            for (int j = 0; j < 32; j++) v[j] = (q[c * 32 + j] >> shift) & mask;
            pack_chunk(w[pl], v, o);
            o += 4 * w[pl];
        }
        shift += w[pl];
    }
}

void tn_tq_unpack_block(const tn_tq_params *p, const uint8_t *blk, uint8_t *q, float *d, float *m) {
    uint16_t dh, mh;
    memcpy(&dh, blk, 2);
    const uint8_t *in = blk + 2;
    *d = tn_fp16_to_fp32(dh);
    if (p->asym) {
        memcpy(&mh, in, 2);
        in += 2;
        *m = tn_fp16_to_fp32(mh);
    } else {
        *m = -*d * (float)((1 << p->bits) - 1) * 0.5f;
    }
    memset(q, 0, (size_t)p->group);
    int w[4];
    tn_tq_planes(p->bits, w);
    int shift = 0;
    for (int pl = 0; w[pl]; pl++) {
        for (int c = 0; c < p->group / 32; c++) {
            uint8_t v[32];
            unpack_chunk(w[pl], in, v);
            in += 4 * w[pl];
            for (int j = 0; j < 32; j++) q[c * 32 + j] |= (uint8_t)(v[j] << shift);
        }
        shift += w[pl];
    }
}

/* ---- quantizer ------------------------------------------------------------------------------ */

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The code of x for offset m and inverse scale id: nearest, clamped to 0 .. nmax. */
static inline int code_at(float x, float m, float id, int nmax) { return clampi((int)lrintf((x - m) * id), 0, nmax); }

/* Weighted squared error of x ~ d*q + m for the codes q chosen by nearest rounding. */
static float fit_err(const float *x, const float *wt, int n, int nmax, float d, float m, uint8_t *q) {
    float err = 0;
    const float id = d != 0 ? 1.0f / d : 0;
    for (int i = 0; i < n; i++) {
        int v = code_at(x[i], m, id, nmax);
        if (q) q[i] = (uint8_t)v;
        float e = d * v + m - x[i];
        err += wt[i] * e * e;
    }
    return err;
}

static void quantize_group(const tn_tq_params *p, const float *x, const float *imat, uint8_t *blk) {
    const int n = p->group, nmax = (1 << p->bits) - 1;
    float wt[256];
    uint8_t q[256];
    float sum_x2 = 0;
    for (int i = 0; i < n; i++) sum_x2 += x[i] * x[i];
    const float sigma2 = 2 * sum_x2 / n;
    for (int i = 0; i < n; i++)
        wt[i] = imat ? imat[i] * sqrtf(sigma2 + x[i] * x[i]) : sigma2 + x[i] * x[i];
    float mn = x[0], mx = x[0], amax = 0;
    for (int i = 0; i < n; i++) {
        mn = fminf(mn, x[i]);
        mx = fmaxf(mx, x[i]);
        amax = fmaxf(amax, fabsf(x[i]));
    }
    float best_d = 0, best_m = p->asym ? mn : 0, best = INFINITY;
    if (amax == 0 || (p->asym && mx == mn)) {
        best_d = 0;
    } else if (p->asym) {
        for (int is = -10; is <= 20; is++) {
            /* candidate grid: stretch/shrink the range, then refit d, m by least squares */
            const float iscale = (nmax + 0.1f * is) / (mx - mn);
            if (iscale <= 0) continue;
            double sw = 0, sq = 0, sqq = 0, sx = 0, sqx = 0;
            for (int i = 0; i < n; i++) {
                int v = clampi((int)lrintf(iscale * (x[i] - mn)), 0, nmax);
                sw += wt[i], sq += wt[i] * v, sqq += wt[i] * v * v, sx += wt[i] * x[i], sqx += wt[i] * v * x[i];
            }
            double det = sw * sqq - sq * sq;
            if (det <= 0) continue;
            float d = (float)((sw * sqx - sq * sx) / det), m = (float)((sqq * sx - sq * sqx) / det);
            if (d <= 0) continue;
            float e = fit_err(x, wt, n, nmax, d, m, NULL);
            if (e < best) best = e, best_d = d, best_m = m;
        }
        if (best == INFINITY) best_d = (mx - mn) / nmax, best_m = mn;
        /* refine: codes for the best (d, m), exact weighted refit of (d, m) on them, repeat while
         * the error drops (a few Lloyd steps from the best grid) */
        for (int it = 0; it < 4 && best < INFINITY; it++) {
            fit_err(x, wt, n, nmax, best_d, best_m, q);
            double sw = 0, sq = 0, sqq = 0, sx = 0, sqx = 0;
            for (int i = 0; i < n; i++) {
                const int v = q[i];
                sw += wt[i], sq += wt[i] * v, sqq += wt[i] * v * v, sx += wt[i] * x[i], sqx += wt[i] * v * x[i];
            }
            const double det = sw * sqq - sq * sq;
            if (det <= 0) break;
            const float d = (float)((sw * sqx - sq * sx) / det), m = (float)((sqq * sx - sq * sqx) / det);
            if (d <= 0) break;
            const float e = fit_err(x, wt, n, nmax, d, m, NULL);
            if (!(e < best)) break;
            best = e, best_d = d, best_m = m;
        }
    } else {
        const float c = nmax * 0.5f;
        for (int is = 0; is <= 40; is++) {
            const float d0 = amax / c * (0.5f + 0.0175f * is);
            double sxy = 0, syy = 0;
            for (int i = 0; i < n; i++) {
                int v = clampi((int)lrintf(x[i] / d0 + c), 0, nmax);
                float y = v - c;
                sxy += wt[i] * x[i] * y, syy += wt[i] * y * y;
            }
            if (syy <= 0 || sxy <= 0) continue;
            float d = (float)(sxy / syy);
            float e = fit_err(x, wt, n, nmax, d, -d * c, NULL);
            if (e < best) best = e, best_d = d;
        }
        if (best == INFINITY) best_d = amax / c;
        for (int it = 0; it < 4 && best < INFINITY; it++) {
            fit_err(x, wt, n, nmax, best_d, -best_d * c, q);
            double sxy = 0, syy = 0;
            for (int i = 0; i < n; i++) {
                const float y = q[i] - c;
                sxy += wt[i] * x[i] * y, syy += wt[i] * y * y;
            }
            if (syy <= 0 || sxy <= 0) break;
            const float d = (float)(sxy / syy);
            const float e = fit_err(x, wt, n, nmax, d, -d * c, NULL);
            if (!(e < best)) break;
            best = e, best_d = d;
        }
    }
    tn_tq_finish_group(p, x, best_d, best_m, blk);
}

void tn_tq_finish_group(const tn_tq_params *p, const float *x, float best_d, float best_m, uint8_t *blk) {
    const int n = p->group, nmax = (1 << p->bits) - 1;
    uint8_t q[256];
    /* final codes against the stored (fp16-rounded) parameters */
    const uint16_t dh = tn_fp32_to_fp16(best_d);
    const uint16_t mh = tn_fp32_to_fp16(best_m);
    const float d = tn_fp16_to_fp32(dh);
    const float m = p->asym ? tn_fp16_to_fp32(mh) : -d * nmax * 0.5f;
    if (d == 0) {
        /* constant group: all codes 0, value m (asym) or 0 (sym) */
        memset(q, 0, (size_t)n);
    } else {
        const float id = 1.0f / d;
        for (int i = 0; i < n; i++) q[i] = (uint8_t)code_at(x[i], m, id, nmax);
    }
    tn_tq_pack_block(p, q, dh, mh, blk);
}

void tn_tq_quantize_row(const tn_tq_params *p, const float *x, void *y, int64_t k, const float *imatrix) {
    const size_t bb = tn_tq_block_bytes(p);
    for (int64_t i = 0; i < k / p->group; i++)
        quantize_group(p, x + i * p->group, imatrix ? imatrix + i * p->group : NULL, (uint8_t *)y + (size_t)i * bb);
}

void tn_tq_quantize_row_rtn(const tn_tq_params *p, const float *x, void *y, int64_t k) {
    const size_t bb = tn_tq_block_bytes(p);
    const int nmax = (1 << p->bits) - 1;
    for (int64_t i = 0; i < k / p->group; i++) {
        const float *g = x + i * p->group;
        float mn = g[0], mx = g[0], amax = 0;
        for (int j = 0; j < p->group; j++) mn = fminf(mn, g[j]), mx = fmaxf(mx, g[j]), amax = fmaxf(amax, fabsf(g[j]));
        if (p->asym) tn_tq_finish_group(p, g, (mx - mn) / (float)nmax, mn, (uint8_t *)y + (size_t)i * bb);
        else tn_tq_finish_group(p, g, 2.0f * amax / (float)nmax, 0.0f, (uint8_t *)y + (size_t)i * bb);
    }
}

void tn_tq_dequantize_row(const tn_tq_params *p, const void *x, float *y, int64_t k) {
    const size_t bb = tn_tq_block_bytes(p);
    uint8_t q[256];
    for (int64_t i = 0; i < k / p->group; i++) {
        float d, m;
        tn_tq_unpack_block(p, (const uint8_t *)x + (size_t)i * bb, q, &d, &m);
        for (int j = 0; j < p->group; j++) y[i * p->group + j] = d * q[j] + m;
    }
}

float tn_tq_vec_dot_ref(const tn_tq_params *p, int64_t k, const void *w, const block_q8_0 *a) {
    const size_t bb = tn_tq_block_bytes(p);
    const int nmax = (1 << p->bits) - 1;
    uint8_t q[256];
    float sum = 0;
    for (int64_t i = 0; i < k / p->group; i++) {
        float d, m;
        tn_tq_unpack_block(p, (const uint8_t *)w + (size_t)i * bb, q, &d, &m);
        for (int c = 0; c < p->group / 32; c++, a++) {
            int32_t sqa = 0, sa = 0;
            for (int j = 0; j < 32; j++) sqa += q[c * 32 + j] * a->qs[j], sa += a->qs[j];
            const float da = tn_fp16_to_fp32(a->d);
            if (p->asym) sum += da * (d * (float)sqa + m * (float)sa);
            else sum += da * d * (float)(2 * sqa - nmax * sa) * 0.5f;
        }
    }
    return sum;
}
