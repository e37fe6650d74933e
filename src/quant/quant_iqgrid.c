/*
 * quant_iqgrid.c — quantizers to the codebook i-quants iq2_xxs, iq2_xs, iq2_s, iq3_xxs and iq3_s:
 * what llama-quantize writes (ggml's quantize_iq2_xxs ... quantize_iq3_s, llama.cpp 3f545bec),
 * with importance weights or, for the types ggml allows it (iq2_s, iq3_xxs, iq3_s), without.
 * iq1_s / iq1_m are in quant_iq1.c; the decoders in quant_iq2.c.
 *
 * All five share one search per sub-block (16 or 32 elements): signs come off first (for the
 * 7-bit sign types, the least important element takes the parity), then for a range of inverse
 * scales each group of 8 (iq3: 4) magnitudes rounds to levels 0..n-1; a level pattern that is not
 * a grid entry becomes the nearest listed neighbour (iq_map.c) at that scale; the scale whose
 * patterns fit best (weighted least squares) wins, and groups are snapped once more at the fitted
 * scale. The sub-block scales then become 4-bit multiples of one fp16 scale.
 *
 * Invariant: bytes identical to ggml's. The per-type differences (search ranges, which groups
 * are snapped again, weights without an imatrix, the fudge factor on d, what an all-zero block
 * keeps) are data in `specs`, each one a difference ggml's five functions have; the float
 * operations and their order are ggml's.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "quant/iq_grid.h"
#include "quant/ksearch.h"
#include "quant/quant.h"

typedef enum refine {
    REFINE_OFF_GRID, /* snap again only the groups that were off the grid (iq2_xs, iq2_s, iq3_xxs) */
    REFINE_ALL_IF,   /* all groups, if any was off the grid (iq3_s)                                */
    REFINE_ALL,      /* all groups, always (iq2_xxs)                                                */
} refine;

typedef struct spec {
    tn_dtype t;
    int sub;          /* elements per sub-block scale: 32 or 16                          */
    int kmaxq;        /* levels per element: 3 (iq2) or 8 (iq3)                          */
    bool parity;      /* 7 stored sign bits per 8 elements, even parity                  */
    float sigma_mul;  /* sigma2 = sigma_mul * sum(x^2) / 256                              */
    int plain;        /* weights without importance: 0 none (refused), 1 x^2, 2 sigma2/4 + x^2 */
    float eps;        /* a sub-block with max |x| < eps is zero; 0: only max == 0         */
    bool qp_start;    /* start from make_qp_quants and search around its largest value    */
    int is_max;       /* inverse scales (2 kmaxq - 1 + is * is_step) / max, |is| <= is_max */
    float is_step;
    bool grid_init;   /* groups count as on the grid before the search                    */
    refine ref;
    float fudge;      /* d is stored as fp16(d * fudge)                                   */
    bool keep_idx;    /* a block whose every scale is 0 keeps its indices (else all zero) */
} spec;

static const spec specs[] = {
    {TN_IQ2_XXS, 32, 3, true, 1.f, 0, TN_GROUP_MAX_EPS, true, 6, 0.1f, true, REFINE_ALL, 1.f, false},
    {TN_IQ2_XS, 16, 3, true, 1.f, 0, TN_GROUP_MAX_EPS, false, 9, 0.1f, true, REFINE_OFF_GRID, 1.f, false},
    {TN_IQ2_S, 16, 3, false, 2.f, 2, 1e-8f, false, 9, 0.1f, true, REFINE_OFF_GRID, 0.9875f, true},
    {TN_IQ3_XXS, 32, 8, true, 2.f, 1, 1e-8f, false, 15, 0.2f, true, REFINE_OFF_GRID, 1.0125f, false},
    {TN_IQ3_S, 32, 8, false, 2.f, 1, 0.f, false, 9, 0.2f, false, REFINE_ALL_IF, 1.033f, true},
};

static const spec *spec_of(tn_dtype t) {
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        if (specs[i].t == t) return &specs[i];
    return NULL;
}

/* The listed neighbour (nb[0] entries) with the least weighted squared distance from xv at scale
 * `scale`; the first of equal ones. Writes its levels to L. ggml's iq2/iq3_find_best_neighbour. */
static int best_neighbour(const tn_iq_map *m, const uint16_t *nb, const float *xv, const float *w, float scale, int8_t *L) {
    float best = FLT_MAX;
    int gi = nb[1]; /* ggml asserts that one is found; only nan / inf distances miss */
    for (int j = 1; j <= nb[0]; j++) {
        const int8_t *pg = m->grid + (size_t)nb[j] * (size_t)m->dim;
        float d2 = 0;
        for (int i = 0; i < m->dim; i++) {
            const float q = pg[i];
            const float diff = scale * q - xv[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best) best = d2, gi = nb[j];
    }
    const int8_t *pg = m->grid + (size_t)gi * (size_t)m->dim;
    for (int i = 0; i < m->dim; i++) L[i] = (int8_t)((pg[i] - 1) / 2);
    return gi;
}

/* One group's levels at inverse scale id (clamped to 0..kmaxq-1) into L; a pattern that is not a
 * grid entry is replaced by its best neighbour at scale `scale`. True if it was an entry. */
static bool snap(const tn_iq_map *m, int kmaxq, const float *xv, const float *waux, float id, float scale, int8_t *L) {
    int key = 0;
    for (int i = 0; i < m->dim; i++) {
        const int l = tn_clampi(tn_nearest_int(0.5f * (id * xv[i] - 1)), 0, kmaxq - 1);
        L[i] = (int8_t)l;
        key |= l << (m->bits * i);
    }
    if (m->map[key] >= 0) return true;
    best_neighbour(m, m->neighbours - m->map[key] - 1, xv, waux, scale, L);
    return false;
}

/* Weighted least-squares numerator and denominator of levels L (values 2 l + 1) against xval. */
static void fit(int n, const float *xval, const float *weight, const int8_t *L, float *sumqx, float *sumq2) {
    float sqx = 0, sq2 = 0;
    for (int i = 0; i < n; i++) {
        const float w = weight[i];
        const float q = 2 * L[i] + 1;
        sqx += w * xval[i] * q;
        sq2 += w * q * q;
    }
    *sumqx = sqx, *sumq2 = sq2;
}

/* The scale search of one sub-block of magnitudes xval (largest: max); L gets the grid levels.
 * Returns the scale, or 0 with *zero set when the sub-block stores nothing. */
static float sub_search(const spec *sp, const tn_iq_map *m, const float *xval, const float *weight, const float *waux,
                        float max, int8_t *L, bool *zero) {
    const int n = sp->sub, ng = n / m->dim, kq = sp->kmaxq;
    int8_t Laux[32];
    bool on[8], on_aux[8];
    float scale, best = 0, ref_max = max;
    *zero = false;
    if (sp->qp_start) {
        scale = tn_make_qp_quants(n, kq + 1, xval, (uint8_t *)L, weight);
        ref_max = scale * kq;
        if (ref_max <= 0) {
            *zero = true;
            return 0;
        }
    } else {
        memset(L, 0, (size_t)n);
        scale = max / (2 * kq - 1);
    }
    for (int k = 0; k < ng; k++) on[k] = sp->grid_init;
    for (int is = -sp->is_max; is <= sp->is_max; is++) {
        const float id = (2 * kq - 1 + is * sp->is_step) / ref_max;
        const float this_scale = 1 / id;
        for (int k = 0; k < ng; k++)
            on_aux[k] = snap(m, kq, xval + m->dim * k, waux + m->dim * k, id, this_scale, Laux + m->dim * k);
        float sumqx, sumq2;
        fit(n, xval, weight, Laux, &sumqx, &sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            memcpy(L, Laux, (size_t)n);
            memcpy(on, on_aux, (size_t)ng * sizeof on[0]);
        }
    }
    int n_off = 0;
    for (int k = 0; k < ng; k++) n_off += !on[k];
    if ((sp->ref == REFINE_ALL || n_off > 0) && scale > 0) {
        const float id = 1 / scale;
        for (int k = 0; k < ng; k++) {
            if (sp->ref == REFINE_OFF_GRID && on[k]) continue;
            snap(m, kq, xval + m->dim * k, waux + m->dim * k, id, scale, L + m->dim * k);
        }
        float sumqx, sumq2;
        fit(n, xval, weight, L, &sumqx, &sumq2);
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    return scale;
}

/* Stores sub-block ib's grid indices gi[] and sign bytes sg[] into block b. iq3_s puts its
 * indices and signs in slot `slot`: ggml advances those pointers only past the sub-blocks it
 * stores, so after an all-zero sub-block the later ones sit one slot early (the format as
 * llama-quantize writes it; the 9th index bits stay at ib). */
static void put_sub(tn_dtype t, void *b, int ib, int slot, const int *gi, const uint8_t *sg) {
    switch (t) {
    case TN_IQ2_XXS: {
        uint8_t *qs = (uint8_t *)((block_iq2_xxs *)b)->qs + 8 * ib;
        const uint32_t idx = (uint32_t)gi[0] | (uint32_t)gi[1] << 8 | (uint32_t)gi[2] << 16 | (uint32_t)gi[3] << 24;
        const uint32_t s = (uint32_t)sg[0] | (uint32_t)sg[1] << 7 | (uint32_t)sg[2] << 14 | (uint32_t)sg[3] << 21;
        memcpy(qs, &idx, 4);
        memcpy(qs + 4, &s, 4);
        break;
    }
    case TN_IQ2_XS:
        for (int k = 0; k < 2; k++) ((block_iq2_xs *)b)->qs[2 * ib + k] = (uint16_t)(gi[k] | sg[k] << 9);
        break;
    case TN_IQ2_S: {
        block_iq2_s *y = b;
        for (int k = 0; k < 2; k++) {
            const int i8 = 2 * ib + k;
            y->qs[i8] = (uint8_t)(gi[k] & 255);
            y->qh[i8 / 4] |= (uint8_t)((gi[k] >> 8) << 2 * (i8 % 4));
            y->qs[QK_K / 8 + i8] = sg[k];
        }
        break;
    }
    case TN_IQ3_XXS: {
        block_iq3_xxs *y = b;
        for (int k = 0; k < 8; k++) y->qs[8 * ib + k] = (uint8_t)gi[k];
        const uint32_t s = (uint32_t)sg[0] | (uint32_t)sg[1] << 7 | (uint32_t)sg[2] << 14 | (uint32_t)sg[3] << 21;
        memcpy(y->qs + QK_K / 4 + 4 * ib, &s, 4);
        break;
    }
    default: { /* iq3_s */
        block_iq3_s *y = b;
        for (int k = 0; k < 8; k++) {
            y->qs[8 * slot + k] = (uint8_t)(gi[k] & 255);
            y->qh[ib] |= (uint8_t)((gi[k] >> 8) << k);
        }
        memcpy(y->signs + 4 * slot, sg, 4);
        break;
    }
    }
}

/* Stores the 4-bit scale code l of sub-block ib. */
static void put_scale(tn_dtype t, void *b, int ib, int l) {
    switch (t) {
    case TN_IQ2_XXS:
    case TN_IQ3_XXS: {
        uint8_t *p = t == TN_IQ2_XXS ? (uint8_t *)((block_iq2_xxs *)b)->qs + 8 * ib + 4
                                     : ((block_iq3_xxs *)b)->qs + QK_K / 4 + 4 * ib;
        p[3] |= (uint8_t)(l << 4);
        break;
    }
    case TN_IQ2_XS: ((block_iq2_xs *)b)->scales[ib / 2] |= (uint8_t)(l << 4 * (ib % 2)); break;
    case TN_IQ2_S: ((block_iq2_s *)b)->scales[ib / 2] |= (uint8_t)(l << 4 * (ib % 2)); break;
    default: ((block_iq3_s *)b)->scales[ib / 2] |= (uint8_t)(l << 4 * (ib % 2)); break;
    }
}

static void quantize_block(const spec *sp, const tn_iq_map *m, const float *xbl, const float *qw, uint8_t *blk, size_t bsize) {
    const int nsub = QK_K / sp->sub, n = sp->sub;
    float scales[QK_K / 16], weight[32], waux[32], xval[32];
    int8_t L[32];
    memset(blk, 0, bsize);
    float sumx2 = 0;
    for (int i = 0; i < QK_K; i++) sumx2 += xbl[i] * xbl[i];
    const float sigma2 = sp->sigma_mul * sumx2 / QK_K;
    float max_scale = 0;
    int slot = 0; /* sub-blocks stored so far */
    for (int ib = 0; ib < nsub; ib++) {
        const float *xb = xbl + n * ib;
        for (int i = 0; i < n; i++) {
            if (qw) weight[i] = qw[n * ib + i] * sqrtf(sigma2 + xb[i] * xb[i]);
            else if (sp->plain == 1) weight[i] = xb[i] * xb[i];
            else weight[i] = 0.25f * sigma2 + xb[i] * xb[i];
        }
        for (int i = 0; i < n; i++) waux[i] = sqrtf(weight[i]);
        uint8_t sg[4];
        for (int k = 0; k < n / 8; k++) {
            int nflip = 0;
            uint8_t s = 0;
            for (int i = 0; i < 8; i++) {
                if (xb[8 * k + i] >= 0) {
                    xval[8 * k + i] = xb[8 * k + i];
                } else {
                    xval[8 * k + i] = -xb[8 * k + i];
                    nflip++;
                    s |= (uint8_t)(1 << i);
                }
            }
            if (sp->parity && nflip % 2) {
                /* an odd count: the element that costs least flips its sign */
                int imin = 0;
                float min = weight[8 * k] * xb[8 * k] * xb[8 * k];
                for (int i = 1; i < 8; i++) {
                    const float ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                    if (ax < min) min = ax, imin = i;
                }
                xval[8 * k + imin] = -xval[8 * k + imin];
                s ^= (uint8_t)(1 << imin);
            }
            sg[k] = sp->parity ? s & 127 : s;
        }
        float max = xval[0];
        for (int i = 1; i < n; i++) max = max > xval[i] ? max : xval[i];
        scales[ib] = 0;
        if (sp->eps > 0 ? max < sp->eps : !max) continue;
        bool zero;
        float scale = sub_search(sp, m, xval, weight, waux, max, L, &zero);
        if (zero) continue;
        if (scale < 0) { /* ggml: "should never happen"; the scale is stored unsigned */
            scale = -scale;
            for (int k = 0; k < n / 8; k++) sg[k] = sp->parity ? (uint8_t)(~sg[k] & 127) : (uint8_t)~sg[k];
        }
        int gi[8];
        for (int k = 0; k < n / m->dim; k++) {
            int key = 0;
            for (int i = 0; i < m->dim; i++) key |= L[m->dim * k + i] << (m->bits * i);
            gi[k] = m->map[key] >= 0 ? m->map[key] : 0; /* snapped levels are always an entry */
        }
        put_sub(sp->t, blk, ib, slot++, gi, sg);
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) {
        if (!sp->keep_idx) memset(blk, 0, bsize); /* d and the scales are 0 already */
        return;
    }
    const float d = max_scale / 31;
    const tn_fp16 dh = tn_fp32_to_fp16(d * sp->fudge);
    memcpy(blk, &dh, sizeof dh);
    const float id = 1 / d;
    for (int ib = 0; ib < nsub; ib++) put_scale(sp->t, blk, ib, tn_clampi(tn_nearest_int(0.5f * (id * scales[ib] - 1)), 0, 15));
}

bool tn_quantize_iq_grid(tn_dtype t, const float *x, void *y, int64_t k, const float *qw) {
    if (t == TN_IQ1_S || t == TN_IQ1_M) return tn_quantize_iq1(t, x, y, k, qw);
    const spec *sp = spec_of(t);
    if (!sp || k % QK_K != 0 || (!qw && !sp->plain)) return false;
    const tn_iq_map *m = tn_iq_map_get(t);
    if (!m) return false;
    const size_t bs = tn_dtype_get(t)->type_size;
    for (int64_t i = 0; i < k / QK_K; i++)
        quantize_block(sp, m, x + QK_K * i, qw ? qw + QK_K * i : NULL, (uint8_t *)y + (size_t)i * bs, bs);
    return true;
}
