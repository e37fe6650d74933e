/*
 * vq.c — vq2 reference decode and the quantizer (codebook fit + per-row assignment).
 *
 * The objective is VPTQ's second-order one reduced to the Hessian's diagonal: minimise
 *   sum over weights  h_col * sqrt(sigma^2 + w^2) * (w - S_group * c)^2
 * with h_col the importance matrix's per-column value (the diagonal of the layer's X^T X; 1
 * without an imatrix) and ggml's sqrt(sigma^2 + w^2) emphasis of a block's large weights. The
 * codebook is fitted once per tensor by weighted k-means on vectors normalised by their group's
 * weighted RMS (weights * rms^2, so the fit minimises the same error in weight units); each row
 * is then quantized alone: per group, 5 trial scales each assigned and refitted, the best
 * reassigned; the scales quantized to 4 bits under an fp16 block scale; a final assignment; d
 * refitted.
 * No GPTQ-style error feedback across columns (the full Hessian is not used).
 */
#include <math.h>
#include <string.h>

#include "core/base.h"
#include "quant/vq.h"

void tn_vq2_dequantize_row(const void *row, float *y, int64_t k) {
    const int8_t *cb = tn_vq_codebook(row);
    const block_vq2 *b = (const block_vq2 *)((const uint8_t *)row + TN_VQ_HDR);
    for (int64_t i = 0; i < k / TN_VQ_QK; i++, y += TN_VQ_QK) {
        const float d = tn_fp16_to_fp32(b[i].d);
        for (int j = 0; j < TN_VQ_NV; j++) {
            const float s = d * (float)tn_vq_scale(&b[i], j / TN_VQ_GROUP);
            for (int p = 0; p < TN_VQ_DIM; p++) y[64 * p + j] = s * (float)cb[p * TN_VQ_K + b[i].qs[j]];
        }
    }
}

/* ---- codebook fit ------------------------------------------------------------------------ */

static uint64_t vq_rng(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double vq_unif(uint64_t *s) { return (double)(vq_rng(s) >> 11) * 0x1p-53; }

/* Weighted RMS of group g (vectors 8g..8g+7) of the block at x (256 floats), columns' importance
 * h (256 floats, or NULL). */
static float vq_group_rms(const float *x, const float *h, int g) {
    double num = 0, den = 0;
    for (int p = 0; p < TN_VQ_DIM; p++)
        for (int j = g * TN_VQ_GROUP; j < (g + 1) * TN_VQ_GROUP; j++) {
            const double w = h ? h[64 * p + j] : 1.0;
            num += w * x[64 * p + j] * x[64 * p + j];
            den += w;
        }
    return den > 0 ? (float)sqrt(num / den) : 0.0f;
}

/* Per-weight error weights of a block (ggml's scheme for its low-bit quantizers): the column's
 * importance (1 without one) * sqrt(sigma^2 + x^2), sigma^2 = 2 mean(x^2) over the block, so the
 * large weights of a block are kept closer. */
static void vq_block_weights(const float *xb, const float *hb, float *wb) {
    double s2 = 0;
    for (int i = 0; i < TN_VQ_QK; i++) s2 += (double)xb[i] * xb[i];
    const float sigma2 = (float)(2 * s2 / TN_VQ_QK);
    for (int i = 0; i < TN_VQ_QK; i++) wb[i] = (hb ? hb[i] : 1.0f) * sqrtf(sigma2 + xb[i] * xb[i]);
}

#define VQ_SAMPLE 32768
#define VQ_ITERS 16

/* Index of the centroid (SoA C[p][k]) nearest to u under per-component weights a. */
static int vq_nearest(const float (*C)[TN_VQ_K], const float *u, const float *a, float *dmin) {
    float best = INFINITY;
    int bi = 0;
    float dist[TN_VQ_K];
    for (int k = 0; k < TN_VQ_K; k++) {
        float s = 0;
        for (int p = 0; p < TN_VQ_DIM; p++) {
            const float e = u[p] - C[p][k];
            s += a[p] * e * e;
        }
        dist[k] = s;
    }
    for (int k = 0; k < TN_VQ_K; k++)
        if (dist[k] < best) best = dist[k], bi = k;
    if (dmin) *dmin = best;
    return bi;
}

tern_status tn_vq_fit_codebook(const float *x, int64_t rows, int64_t ne0, const float *imp, uint64_t seed,
                               int8_t cb[TN_VQ_CB_BYTES]) {
    const int64_t nv = rows * (ne0 / TN_VQ_DIM);
    const int64_t ns = nv < VQ_SAMPLE ? nv : VQ_SAMPLE;
    float *U = tn_malloc((size_t)ns * 2 * TN_VQ_DIM * sizeof(float) + (size_t)ns * (sizeof(float) + sizeof(int)));
    if (!U) return tn_err(TERN_ERR_NOMEM, "vq: out of memory for %lld sample vectors", (long long)ns);
    float *A = U + ns * TN_VQ_DIM, *D = A + ns * TN_VQ_DIM;
    int *asg = (int *)(D + ns);
    uint64_t rs = seed ^ 0x7651A2B3C4D5E6F7ull;
    /* sample: every vector when there are few, else ns drawn at random (with replacement) */
    for (int64_t i = 0; i < ns; i++) {
        const int64_t v = ns == nv ? i : (int64_t)(vq_rng(&rs) % (uint64_t)nv);
        const int64_t r = v / (ne0 / TN_VQ_DIM), vi = v % (ne0 / TN_VQ_DIM);
        const int64_t blk = vi / TN_VQ_NV;
        const int j = (int)(vi % TN_VQ_NV);
        const float *xb = x + r * ne0 + blk * TN_VQ_QK, *hb = imp ? imp + blk * TN_VQ_QK : NULL;
        const float rms = vq_group_rms(xb, hb, j / TN_VQ_GROUP);
        float wb[TN_VQ_QK];
        vq_block_weights(xb, hb, wb);
        for (int p = 0; p < TN_VQ_DIM; p++) {
            U[i * TN_VQ_DIM + p] = rms > 0 ? xb[64 * p + j] / rms : 0.0f;
            A[i * TN_VQ_DIM + p] = rms > 0 ? wb[64 * p + j] * rms * rms : 0.0f;
        }
    }
    static _Thread_local float C[TN_VQ_DIM][TN_VQ_K];
    /* k-means++ seeding: each next centroid drawn with probability ~ weighted squared distance */
    int64_t first = (int64_t)(vq_rng(&rs) % (uint64_t)ns);
    for (int p = 0; p < TN_VQ_DIM; p++) C[p][0] = U[first * TN_VQ_DIM + p];
    for (int64_t i = 0; i < ns; i++) D[i] = INFINITY;
    for (int k = 1; k < TN_VQ_K; k++) {
        double tot = 0;
        for (int64_t i = 0; i < ns; i++) {
            float s = 0;
            for (int p = 0; p < TN_VQ_DIM; p++) {
                const float e = U[i * TN_VQ_DIM + p] - C[p][k - 1];
                s += A[i * TN_VQ_DIM + p] * e * e;
            }
            if (s < D[i]) D[i] = s;
            tot += D[i];
        }
        int64_t pick = (int64_t)(vq_rng(&rs) % (uint64_t)ns);
        if (tot > 0) {
            double t = vq_unif(&rs) * tot;
            for (int64_t i = 0; i < ns; i++)
                if ((t -= D[i]) <= 0 || i == ns - 1) {
                    pick = i;
                    break;
                }
        }
        for (int p = 0; p < TN_VQ_DIM; p++) C[p][k] = U[pick * TN_VQ_DIM + p];
    }
    /* Lloyd iterations: per-component weighted means */
    for (int it = 0; it < VQ_ITERS; it++) {
        double num[TN_VQ_DIM][TN_VQ_K], den[TN_VQ_DIM][TN_VQ_K];
        memset(num, 0, sizeof num);
        memset(den, 0, sizeof den);
        for (int64_t i = 0; i < ns; i++) {
            asg[i] = vq_nearest((const float (*)[TN_VQ_K])C, U + i * TN_VQ_DIM, A + i * TN_VQ_DIM, &D[i]);
            for (int p = 0; p < TN_VQ_DIM; p++) {
                num[p][asg[i]] += (double)A[i * TN_VQ_DIM + p] * U[i * TN_VQ_DIM + p];
                den[p][asg[i]] += A[i * TN_VQ_DIM + p];
            }
        }
        for (int k = 0; k < TN_VQ_K; k++) {
            double dk = 0;
            for (int p = 0; p < TN_VQ_DIM; p++) dk += den[p][k];
            if (dk > 0) {
                for (int p = 0; p < TN_VQ_DIM; p++)
                    if (den[p][k] > 0) C[p][k] = (float)(num[p][k] / den[p][k]);
                continue;
            }
            /* empty cluster: move it onto the worst-served sample (then no longer the worst) */
            int64_t w = 0;
            for (int64_t i = 1; i < ns; i++)
                if (D[i] > D[w]) w = i;
            for (int p = 0; p < TN_VQ_DIM; p++) C[p][k] = U[w * TN_VQ_DIM + p];
            D[w] = 0;
        }
    }
    tn_free(U);
    float amax = 0;
    for (int p = 0; p < TN_VQ_DIM; p++)
        for (int k = 0; k < TN_VQ_K; k++) amax = fmaxf(amax, fabsf(C[p][k]));
    const float is = amax > 0 ? 127.0f / amax : 0.0f;
    for (int p = 0; p < TN_VQ_DIM; p++)
        for (int k = 0; k < TN_VQ_K; k++) cb[p * TN_VQ_K + k] = (int8_t)lrintf(C[p][k] * is);
    return TERN_OK;
}

/* ---- per-row quantization ---------------------------------------------------------------- */

typedef struct vq_tables {
    float c[TN_VQ_DIM][TN_VQ_K];  /* codebook as floats  */
    float c2[TN_VQ_DIM][TN_VQ_K]; /* its squares         */
    float rms;                    /* RMS of its entries  */
} vq_tables;

static void vq_tables_init(vq_tables *t, const int8_t *cb) {
    double s = 0;
    for (int p = 0; p < TN_VQ_DIM; p++)
        for (int k = 0; k < TN_VQ_K; k++) {
            t->c[p][k] = cb[p * TN_VQ_K + k];
            t->c2[p][k] = t->c[p][k] * t->c[p][k];
            s += t->c2[p][k];
        }
    t->rms = (float)sqrt(s / TN_VQ_CB_BYTES);
}

/* Entry minimising sum_p h_p (w_p - S c_p)^2 (= -2S h.w.c + S^2 h.c^2 + const). */
static int vq_assign(const vq_tables *t, const float *w, const float *h, float S) {
    float hw[TN_VQ_DIM], hs[TN_VQ_DIM], e[TN_VQ_K];
    for (int p = 0; p < TN_VQ_DIM; p++) hw[p] = -2.0f * S * h[p] * w[p], hs[p] = S * S * h[p];
    for (int k = 0; k < TN_VQ_K; k++)
        e[k] = hw[0] * t->c[0][k] + hw[1] * t->c[1][k] + hw[2] * t->c[2][k] + hw[3] * t->c[3][k] +
               hs[0] * t->c2[0][k] + hs[1] * t->c2[1][k] + hs[2] * t->c2[2][k] + hs[3] * t->c2[3][k];
    int bi = 0;
    for (int k = 1; k < TN_VQ_K; k++)
        if (e[k] < e[bi]) bi = k;
    return bi;
}

/* Assigns group g's vectors with scale S under per-weight error weights wb; returns the
 * least-squares scale for that assignment. */
static float vq_group_pass(const vq_tables *t, const float *xb, const float *wb, int g, float S, uint8_t *qs) {
    double num = 0, den = 0;
    for (int j = g * TN_VQ_GROUP; j < (g + 1) * TN_VQ_GROUP; j++) {
        float w[TN_VQ_DIM], h[TN_VQ_DIM];
        for (int p = 0; p < TN_VQ_DIM; p++) w[p] = xb[64 * p + j], h[p] = wb[64 * p + j];
        qs[j] = (uint8_t)vq_assign(t, w, h, S);
        for (int p = 0; p < TN_VQ_DIM; p++) {
            const double c = t->c[p][qs[j]];
            num += (double)h[p] * w[p] * c;
            den += (double)h[p] * c * c;
        }
    }
    return den > 0 && num > 0 ? (float)(num / den) : 0.0f;
}

/* Weighted error of group g with indices qs at scale S. */
static double vq_group_err(const vq_tables *t, const float *xb, const float *wb, int g, float S, const uint8_t *qs) {
    double e = 0;
    for (int j = g * TN_VQ_GROUP; j < (g + 1) * TN_VQ_GROUP; j++)
        for (int p = 0; p < TN_VQ_DIM; p++) {
            const double r = xb[64 * p + j] - (double)S * t->c[p][qs[j]];
            e += wb[64 * p + j] * r * r;
        }
    return e;
}

/* Scales tried for a group, times its RMS-derived guess (each then refitted and reassigned). */
static const float vq_tries[] = {0.7f, 0.85f, 1.0f, 1.2f, 1.45f};

void tn_vq_quantize_row(const int8_t cb[TN_VQ_CB_BYTES], const float *x, void *y, int64_t ne0, int64_t r, int64_t rows,
                        const float *imp) {
    static _Thread_local vq_tables T;
    static _Thread_local int8_t last[TN_VQ_CB_BYTES];
    static _Thread_local bool have;
    if (!have || memcmp(last, cb, sizeof last)) {
        vq_tables_init(&T, cb);
        memcpy(last, cb, sizeof last);
        have = true;
    }
    const size_t rb = tn_dtype_row_size(TN_VQ2, ne0);
    const uint64_t hdr = (uint64_t)(rows - r) * rb;
    uint8_t *o = y;
    for (int i = 0; i < 4; i++) o[i] = (uint8_t)(hdr >> (8 * i));
    block_vq2 *b = (block_vq2 *)(o + TN_VQ_HDR);
    for (int64_t bi = 0; bi < ne0 / TN_VQ_QK; bi++) {
        const float *xb = x + bi * TN_VQ_QK, *hb = imp ? imp + bi * TN_VQ_QK : NULL;
        float S[TN_VQ_NV / TN_VQ_GROUP], smax = 0, wb[TN_VQ_QK];
        vq_block_weights(xb, hb, wb);
        for (int g = 0; g < TN_VQ_NV / TN_VQ_GROUP; g++) {
            const float s0 = T.rms > 0 ? vq_group_rms(xb, hb, g) / T.rms : 0.0f;
            double best = INFINITY;
            S[g] = 0;
            for (size_t tr = 0; s0 > 0 && tr < sizeof vq_tries / sizeof vq_tries[0]; tr++) {
                const float s1 = vq_group_pass(&T, xb, wb, g, s0 * vq_tries[tr], b[bi].qs);
                const double e = vq_group_err(&T, xb, wb, g, s1, b[bi].qs);
                if (e < best) best = e, S[g] = s1;
            }
            if (S[g] > 0) S[g] = vq_group_pass(&T, xb, wb, g, S[g], b[bi].qs);
            smax = fmaxf(smax, S[g]);
        }
        float d = tn_fp16_to_fp32(tn_fp32_to_fp16(smax / 31.0f));
        memset(b[bi].sc, 0, sizeof b[bi].sc);
        if (!(d > 0)) {
            b[bi].d = tn_fp32_to_fp16(0.0f);
            memset(b[bi].qs, 0, sizeof b[bi].qs);
            continue;
        }
        for (int g = 0; g < TN_VQ_NV / TN_VQ_GROUP; g++) {
            long s = lrintf((S[g] / d - 1.0f) * 0.5f);
            s = s < 0 ? 0 : s > 15 ? 15 : s;
            b[bi].sc[g / 2] |= (uint8_t)(s << (4 * (g % 2)));
            (void)vq_group_pass(&T, xb, wb, g, d * (float)(2 * s + 1), b[bi].qs);
        }
        /* refit d given the indices and the 4-bit scales */
        double num = 0, den = 0;
        for (int j = 0; j < TN_VQ_NV; j++) {
            const int m = tn_vq_scale(&b[bi], j / TN_VQ_GROUP);
            for (int p = 0; p < TN_VQ_DIM; p++) {
                const double h = wb[64 * p + j], c = (double)m * T.c[p][b[bi].qs[j]];
                num += h * xb[64 * p + j] * c;
                den += h * c * c;
            }
        }
        b[bi].d = tn_fp32_to_fp16(den > 0 && num > 0 ? (float)(num / den) : d);
    }
}
