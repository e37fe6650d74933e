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

/* Index of the first smallest of the 256 values e: 16 independent running minima (one per
 * k % 16, which the compiler can keep in a vector) instead of one dependent chain of compares,
 * then the smallest of those with the lowest index — the same index as the plain loop. */
static inline int vq_argmin(const float *e) {
    float best[16];
    int bi[16];
    for (int l = 0; l < 16; l++) best[l] = e[l], bi[l] = l;
    for (int k = 16; k < TN_VQ_K; k += 16)
        for (int l = 0; l < 16; l++) {
            const bool lt = e[k + l] < best[l];
            best[l] = lt ? e[k + l] : best[l];
            bi[l] = lt ? k + l : bi[l];
        }
    int r = 0;
    for (int l = 1; l < 16; l++)
        if (best[l] < best[r] || (best[l] == best[r] && bi[l] < bi[r])) r = l;
    return bi[r];
}

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
    float dist[TN_VQ_K];
    for (int k = 0; k < TN_VQ_K; k++) {
        float s = 0;
        for (int p = 0; p < TN_VQ_DIM; p++) {
            const float e = u[p] - C[p][k];
            s += a[p] * e * e;
        }
        dist[k] = s;
    }
    const int bi = vq_argmin(dist);
    if (dmin) *dmin = dist[bi];
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
    /* The codebook is sign-symmetric: entry KH + k = -entry k (k < KH), so kernels can look up
     * half the table and negate (kern/avx512/vq.c). Fitted as k-means over the samples and their
     * negations: KH free centroids, each sample assigned to the nearest of all 256 entries and
     * counted, sign-corrected, toward that entry's base centroid. */
    enum { KH = TN_VQ_K / 2 };
    static _Thread_local float C[TN_VQ_DIM][TN_VQ_K];
    /* k-means++ seeding of the base centroids: each drawn with probability ~ the weighted squared
     * distance to the nearest entry (both signs) so far */
    int64_t first = (int64_t)(vq_rng(&rs) % (uint64_t)ns);
    for (int p = 0; p < TN_VQ_DIM; p++) C[p][0] = U[first * TN_VQ_DIM + p], C[p][KH] = -C[p][0];
    for (int64_t i = 0; i < ns; i++) D[i] = INFINITY;
    for (int k = 1; k < KH; k++) {
        double tot = 0;
        for (int64_t i = 0; i < ns; i++) {
            float s = 0, t = 0;
            for (int p = 0; p < TN_VQ_DIM; p++) {
                const float u = U[i * TN_VQ_DIM + p], a = A[i * TN_VQ_DIM + p];
                s += a * (u - C[p][k - 1]) * (u - C[p][k - 1]);
                t += a * (u + C[p][k - 1]) * (u + C[p][k - 1]);
            }
            D[i] = fminf(D[i], fminf(s, t));
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
        for (int p = 0; p < TN_VQ_DIM; p++) C[p][k] = U[pick * TN_VQ_DIM + p], C[p][KH + k] = -C[p][k];
    }
    /* Lloyd iterations: per-component weighted means of the (sign-corrected) members */
    for (int it = 0; it < VQ_ITERS; it++) {
        double num[TN_VQ_DIM][KH], den[TN_VQ_DIM][KH];
        memset(num, 0, sizeof num);
        memset(den, 0, sizeof den);
        for (int64_t i = 0; i < ns; i++) {
            asg[i] = vq_nearest((const float (*)[TN_VQ_K])C, U + i * TN_VQ_DIM, A + i * TN_VQ_DIM, &D[i]);
            const int k = asg[i] % KH;
            const double sg = asg[i] < KH ? 1.0 : -1.0;
            for (int p = 0; p < TN_VQ_DIM; p++) {
                num[p][k] += sg * A[i * TN_VQ_DIM + p] * U[i * TN_VQ_DIM + p];
                den[p][k] += A[i * TN_VQ_DIM + p];
            }
        }
        for (int k = 0; k < KH; k++) {
            double dk = 0;
            for (int p = 0; p < TN_VQ_DIM; p++) dk += den[p][k];
            if (dk > 0) {
                for (int p = 0; p < TN_VQ_DIM; p++)
                    if (den[p][k] > 0) C[p][k] = (float)(num[p][k] / den[p][k]), C[p][KH + k] = -C[p][k];
                continue;
            }
            /* empty (both signs): move it onto the worst-served sample (then no longer the worst) */
            int64_t w = 0;
            for (int64_t i = 1; i < ns; i++)
                if (D[i] > D[w]) w = i;
            for (int p = 0; p < TN_VQ_DIM; p++) C[p][k] = U[w * TN_VQ_DIM + p], C[p][KH + k] = -C[p][k];
            D[w] = 0;
        }
    }
    tn_free(U);
    float amax = 0;
    for (int p = 0; p < TN_VQ_DIM; p++)
        for (int k = 0; k < TN_VQ_K; k++) amax = fmaxf(amax, fabsf(C[p][k]));
    const float is = amax > 0 ? 127.0f / amax : 0.0f;
    for (int p = 0; p < TN_VQ_DIM; p++)
        for (int k = 0; k < KH; k++) {
            cb[p * TN_VQ_K + k] = (int8_t)lrintf(C[p][k] * is);
            cb[p * TN_VQ_K + KH + k] = (int8_t)-cb[p * TN_VQ_K + k];
        }
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
    return vq_argmin(e);
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

/* Picks block b's scales for the weights xb (error weights wb, importance hb or NULL): per group,
 * 5 trial scales around its RMS-derived guess, each assigned and refitted, the best kept; then
 * d = fp16(max / 31) and the 4-bit multipliers 2 s + 1 nearest to each group's scale. Writes
 * b->d and b->sc (indices: b->qs is scratch) and returns d as a float (0: an all-zero block, whose
 * indices are zeroed). */
static float vq_block_scales(const vq_tables *t, const float *xb, const float *hb, const float *wb, block_vq2 *b) {
    float S[TN_VQ_NV / TN_VQ_GROUP], smax = 0;
    for (int g = 0; g < TN_VQ_NV / TN_VQ_GROUP; g++) {
        const float s0 = t->rms > 0 ? vq_group_rms(xb, hb, g) / t->rms : 0.0f;
        double best = INFINITY;
        S[g] = 0;
        for (size_t tr = 0; s0 > 0 && tr < sizeof vq_tries / sizeof vq_tries[0]; tr++) {
            const float s1 = vq_group_pass(t, xb, wb, g, s0 * vq_tries[tr], b->qs);
            const double e = vq_group_err(t, xb, wb, g, s1, b->qs);
            if (e < best) best = e, S[g] = s1;
        }
        if (S[g] > 0) S[g] = vq_group_pass(t, xb, wb, g, S[g], b->qs);
        smax = fmaxf(smax, S[g]);
    }
    const float d = tn_fp16_to_fp32(tn_fp32_to_fp16(smax / 31.0f));
    memset(b->sc, 0, sizeof b->sc);
    if (!(d > 0)) {
        b->d = tn_fp32_to_fp16(0.0f);
        memset(b->qs, 0, sizeof b->qs);
        return 0.0f;
    }
    b->d = tn_fp32_to_fp16(d);
    for (int g = 0; g < TN_VQ_NV / TN_VQ_GROUP; g++) {
        long s = lrintf((S[g] / d - 1.0f) * 0.5f);
        s = s < 0 ? 0 : s > 15 ? 15 : s;
        b->sc[g / 2] |= (uint8_t)(s << (4 * (g % 2)));
    }
    return d;
}

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
        float wb[TN_VQ_QK];
        vq_block_weights(xb, hb, wb);
        const float d = vq_block_scales(&T, xb, hb, wb, &b[bi]);
        if (!(d > 0)) continue;
        for (int g = 0; g < TN_VQ_NV / TN_VQ_GROUP; g++)
            (void)vq_group_pass(&T, xb, wb, g, d * (float)tn_vq_scale(&b[bi], g), b[bi].qs);
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

/* ---- error feedback with the layer's Hessian ------------------------------------------------ */

/* LAPACK (in OpenBLAS): Cholesky factorization and inverse from it, column-major. */
extern void dpotrf_(const char *uplo, const int *n, double *a, const int *lda, int *info);
extern void dpotri_(const char *uplo, const int *n, double *a, const int *lda, int *info);

#define VQ_TILE 16 /* rows updated together (one pass over U serves them all) */

struct tn_vq_gptq {
    int64_t n;
    float *U;    /* [n][n] upper: H^-1 = U^T U, in processing order                       */
    float *hd;   /* [n] diag H, file order                                                */
    float *Li;   /* [n / 4][4][4] inverse of U_vv^T (lower) for vector v's 4 x 4 block    */
    float *B;    /* [n / 4][4][256] Li c_k: the codebook entries seen through that block  */
    float *b2;   /* [n / 4][256] |Li c_k|^2                                               */
    uint8_t *dead; /* [n] file order: a column no input ever reached                        */
    vq_tables T;
};

/* Column of the processing order -> column of the file: in block b, position 4 j + p is
 * weight 64 p + j (vector j's four components side by side). */
static inline int64_t vq_col(int64_t c) {
    const int64_t r = c % TN_VQ_QK;
    return c - r + 64 * (r % 4) + r / 4;
}

void tn_vq_gptq_free(tn_vq_gptq *g) {
    if (!g) return;
    tn_free(g->U);
    tn_free(g->hd);
    tn_free(g->Li);
    tn_free(g->B);
    tn_free(g->b2);
    tn_free(g->dead);
    tn_free(g);
}

const float *tn_vq_gptq_diag(const tn_vq_gptq *g) { return g->hd; }

tern_status tn_vq_gptq_create(const float *H, int64_t ne0, float damp, tn_vq_gptq **out) {
    *out = NULL;
    if (ne0 <= 0 || ne0 % TN_VQ_QK || ne0 > 1 << 16)
        return tn_err(TERN_ERR_INVALID_ARG, "vq: Hessian of %lld columns (a multiple of 256 up to 65536)", (long long)ne0);
    const int64_t n = ne0, nv = n / TN_VQ_DIM;
    tn_vq_gptq *g = tn_calloc(1, sizeof *g);
    double *A = tn_malloc((size_t)n * (size_t)n * sizeof(double));
    if (g) {
        g->n = n;
        g->U = tn_malloc((size_t)n * (size_t)n * sizeof(float));
        g->hd = tn_malloc((size_t)n * sizeof(float));
        g->Li = tn_malloc((size_t)nv * 16 * sizeof(float));
        g->B = tn_malloc((size_t)nv * TN_VQ_CB_BYTES * sizeof(float));
        g->b2 = tn_malloc((size_t)nv * TN_VQ_K * sizeof(float));
        g->dead = tn_calloc((size_t)n, 1);
    }
    if (!g || !A || !g->U || !g->hd || !g->Li || !g->B || !g->b2 || !g->dead) {
        tn_free(A);
        tn_vq_gptq_free(g);
        return tn_err(TERN_ERR_NOMEM, "vq: out of memory for a %lld x %lld Hessian", (long long)n, (long long)n);
    }
    double mean = 0;
    for (int64_t i = 0; i < n; i++) {
        const float h = H[i * n + i];
        if (!isfinite(h) || h < 0) {
            tn_free(A);
            tn_vq_gptq_free(g);
            return tn_err(TERN_ERR_FORMAT, "vq: the Hessian's diagonal is %g at column %lld", (double)h, (long long)i);
        }
        g->hd[i] = h;
        g->dead[i] = h == 0;
        mean += h;
    }
    mean /= (double)n;
    if (!(mean > 0)) mean = 1;
    int info = 1;
    const int in = (int)n;
    for (int attempt = 0; attempt < 4 && info; attempt++, damp *= 10) {
        /* A = H in processing order (symmetric: row-major and column-major agree), dampened */
        for (int64_t i = 0; i < n; i++) {
            const int64_t fi = vq_col(i);
            for (int64_t j = 0; j < n; j++) {
                const int64_t fj = vq_col(j);
                A[i * n + j] = fi <= fj ? H[fi * n + fj] : H[fj * n + fi];
            }
            A[i * n + i] = g->dead[fi] ? 1.0 : A[i * n + i] + damp * mean;
            for (int64_t j = 0; j < n && g->dead[fi]; j++)
                if (j != i) A[i * n + j] = A[j * n + i] = 0;
        }
        dpotrf_("L", &in, A, &in, &info);        /* H = L L^T                       */
        if (!info) dpotri_("L", &in, A, &in, &info); /* H^-1, lower triangle           */
        if (info) continue;
        for (int64_t j = 0; j < n; j++) /* column-major lower -> full symmetric         */
            for (int64_t i = j + 1; i < n; i++) A[i * n + j] = A[j * n + i];
        dpotrf_("U", &in, A, &in, &info); /* H^-1 = U^T U, U in the upper triangle      */
    }
    if (info) {
        tn_free(A);
        tn_vq_gptq_free(g);
        return tn_err(TERN_ERR_FORMAT, "vq: the Hessian is not positive definite even dampened (LAPACK info %d)", info);
    }
    /* column-major upper U(i, j), i <= j, sits at A[i + j n] */
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) g->U[i * n + j] = j >= i ? (float)A[i + j * n] : 0.0f;
    tn_free(A);
    /* Li = (U_vv^T)^-1 for each vector's diagonal block: forward substitution on the identity */
    for (int64_t v = 0; v < nv; v++) {
        double L[4][4], X[4][4];
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++) L[a][b] = b <= a ? g->U[(4 * v + b) * n + 4 * v + a] : 0.0;
        for (int col = 0; col < 4; col++)
            for (int a = 0; a < 4; a++) {
                double s = a == col ? 1.0 : 0.0;
                for (int b = 0; b < a; b++) s -= L[a][b] * X[b][col];
                X[a][col] = s / L[a][a];
            }
        for (int a = 0; a < 16; a++) g->Li[v * 16 + a] = (float)X[a / 4][a % 4];
    }
    *out = g;
    return TERN_OK;
}

void tn_vq_gptq_set_codebook(tn_vq_gptq *g, const int8_t cb[TN_VQ_CB_BYTES]) {
    vq_tables_init(&g->T, cb);
    for (int64_t v = 0; v < g->n / TN_VQ_DIM; v++) {
        const float *Li = g->Li + v * 16;
        float *B = g->B + v * TN_VQ_CB_BYTES, *b2 = g->b2 + v * TN_VQ_K;
        for (int k = 0; k < TN_VQ_K; k++) {
            float s = 0;
            for (int a = 0; a < 4; a++) {
                float z = 0;
                for (int b = 0; b <= a; b++) z += Li[a * 4 + b] * g->T.c[b][k];
                B[a * TN_VQ_K + k] = z;
                s += z * z;
            }
            b2[k] = s;
        }
    }
}

/* Entry k minimising |a - S B_k|^2 = S^2 |B_k|^2 - 2 S a.B_k + |a|^2, for vector v. */
static int vq_gptq_assign(const tn_vq_gptq *g, int64_t v, const float a[4], float S) {
    const float *B = g->B + v * TN_VQ_CB_BYTES, *b2 = g->b2 + v * TN_VQ_K;
    const float s2 = S * S, m0 = -2 * S * a[0], m1 = -2 * S * a[1], m2 = -2 * S * a[2], m3 = -2 * S * a[3];
    float e[TN_VQ_K];
    for (int k = 0; k < TN_VQ_K; k++)
        e[k] = s2 * b2[k] + m0 * B[k] + m1 * B[TN_VQ_K + k] + m2 * B[2 * TN_VQ_K + k] + m3 * B[3 * TN_VQ_K + k];
    return vq_argmin(e);
}

void tn_vq_gptq_quantize_rows(const tn_vq_gptq *g, const float *x, void *y, int64_t r0, int64_t r1, int64_t rows) {
    const int64_t n = g->n;
    const size_t rb = tn_dtype_row_size(TN_VQ2, n);
    float *W = tn_malloc(sizeof(float) * (size_t)(VQ_TILE * n + VQ_TILE * TN_VQ_QK));
    if (!W) { /* no room for the tile: each row alone without feedback (still a valid file) */
        for (int64_t r = r0; r < r1; r++) {
            int8_t cb[TN_VQ_CB_BYTES];
            for (int p = 0; p < TN_VQ_DIM; p++)
                for (int k = 0; k < TN_VQ_K; k++) cb[p * TN_VQ_K + k] = (int8_t)g->T.c[p][k];
            tn_vq_quantize_row(cb, x + r * n, (uint8_t *)y + (size_t)r * rb, n, r, rows, g->hd);
        }
        return;
    }
    float *E = W + VQ_TILE * n; /* [tile][256] the current block's errors, processing order */
    for (int64_t t0 = r0; t0 < r1; t0 += VQ_TILE) {
        const int nt = (int)(r1 - t0 < VQ_TILE ? r1 - t0 : VQ_TILE);
        for (int r = 0; r < nt; r++) { /* the rows in processing order, dead columns zeroed */
            uint8_t *o = (uint8_t *)y + (size_t)(t0 + r) * rb;
            const uint64_t hdr = (uint64_t)(rows - t0 - r) * rb;
            for (int i = 0; i < 4; i++) o[i] = (uint8_t)(hdr >> (8 * i));
            for (int64_t c = 0; c < n; c++) {
                const int64_t fc = vq_col(c);
                W[r * n + c] = g->dead[fc] ? 0.0f : x[(t0 + r) * n + fc];
            }
        }
        for (int64_t bi = 0; bi < n / TN_VQ_QK; bi++) {
            const int64_t c0 = bi * TN_VQ_QK, c1 = c0 + TN_VQ_QK;
            for (int r = 0; r < nt; r++) {
                block_vq2 *b = (block_vq2 *)((uint8_t *)y + (size_t)(t0 + r) * rb + TN_VQ_HDR) + bi;
                float xb[TN_VQ_QK], wb[TN_VQ_QK];
                for (int i = 0; i < TN_VQ_QK; i++) xb[vq_col(i)] = W[r * n + c0 + i];
                const float *hb = g->hd + c0;
                vq_block_weights(xb, hb, wb);
                const float d = vq_block_scales(&g->T, xb, hb, wb, b);
                float *er = E + r * TN_VQ_QK;
                for (int j = 0; j < TN_VQ_NV; j++) {
                    const int64_t c = c0 + 4 * j, v = c / TN_VQ_DIM;
                    float *w = W + r * n + c, a[4], z[4];
                    const float *Li = g->Li + v * 16;
                    for (int p = 0; p < 4; p++) {
                        a[p] = 0;
                        for (int q = 0; q <= p; q++) a[p] += Li[p * 4 + q] * w[q];
                    }
                    const float S = d * (float)tn_vq_scale(b, j / TN_VQ_GROUP);
                    const int k = d > 0 ? vq_gptq_assign(g, v, a, S) : 0;
                    b->qs[j] = (uint8_t)k;
                    for (int p = 0; p < 4; p++) z[p] = a[p] - S * g->B[v * TN_VQ_CB_BYTES + p * TN_VQ_K + k];
                    for (int p = 0; p < 4; p++) er[4 * j + p] = z[p];
                    /* the rest of this block now; later blocks after it, all at once */
                    for (int p = 0; p < 4; p++) {
                        const float *u = g->U + (c + p) * n;
                        for (int64_t cc = c + 4; cc < c1; cc++) w[cc - c] -= z[p] * u[cc];
                    }
                }
            }
            if (c1 < n)
                for (int i = 0; i < TN_VQ_QK; i++) {
                    const float *u = g->U + (c0 + i) * n;
                    for (int r = 0; r < nt; r++) {
                        const float e = E[r * TN_VQ_QK + i];
                        float *w = W + r * n;
                        for (int64_t cc = c1; cc < n; cc++) w[cc] -= e * u[cc];
                    }
                }
        }
    }
    tn_free(W);
}
