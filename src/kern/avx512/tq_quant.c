/*
 * tq_quant.c (avx512) — tern's any-bit weight quantizer, sixteen groups at a time: lane j of every
 * register belongs to group j, so each group's search runs exactly the reference's float and
 * double operations in the reference's order (src/quant/tq.c quantize_group) and the bytes come
 * out identical to tn_tq_quantize_row — no reassociation, no FMA, the same rounding (VCVTPS2DQ
 * under the default rounding mode is lrintf's round-to-nearest-even), the same min / max
 * semantics (glibc's fminf / fmaxf of non-NaN values keep the running value when equal, which
 * decides the sign of a zero: MINPS / MAXPS with the new value first).
 *
 * Per batch of 16 groups the row (and importance) slice is transposed to [i][lane]; the grid of
 * scales (asymmetric: 31 stretched ranges refit by weighted least squares; symmetric: 41 scales
 * refit) and up to four refinement steps run with per-lane masks standing in for the reference's
 * `continue` / `break`; each group is then finished by tn_tq_finish_group (fp16 rounding, codes,
 * packing), the reference's own last step. A batch holding any non-finite input goes to the
 * reference. Lanes past the row's last group repeat its first group and are dropped.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kern/avx512/kernels.h"
#include "quant/tq.h"

#define NL 16 /* groups per batch: one per float lane */

typedef struct {
    __m512d lo, hi;
} dvec; /* 16 doubles, lane order of a __m512 */

static inline dvec dv_zero(void) { return (dvec){_mm512_setzero_pd(), _mm512_setzero_pd()}; }
/* a += (double)f, lane by lane */
static inline dvec dv_acc(dvec a, __m512 f) {
    a.lo = _mm512_add_pd(a.lo, _mm512_cvtps_pd(_mm512_castps512_ps256(f)));
    a.hi = _mm512_add_pd(a.hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1))));
    return a;
}
static inline dvec dv_mul(dvec a, dvec b) { return (dvec){_mm512_mul_pd(a.lo, b.lo), _mm512_mul_pd(a.hi, b.hi)}; }
static inline dvec dv_sub(dvec a, dvec b) { return (dvec){_mm512_sub_pd(a.lo, b.lo), _mm512_sub_pd(a.hi, b.hi)}; }
static inline dvec dv_div(dvec a, dvec b) { return (dvec){_mm512_div_pd(a.lo, b.lo), _mm512_div_pd(a.hi, b.hi)}; }
/* (float) of each double (round to nearest, as the C cast under the default mode) */
static inline __m512 dv_to_ps(dvec a) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(a.lo)), _mm512_cvtpd_ps(a.hi), 1);
}
static inline __mmask16 dv_gt0(dvec a) {
    const __mmask8 l = _mm512_cmp_pd_mask(a.lo, _mm512_setzero_pd(), _CMP_GT_OQ);
    const __mmask8 h = _mm512_cmp_pd_mask(a.hi, _mm512_setzero_pd(), _CMP_GT_OQ);
    return (__mmask16)(l | (h << 8));
}

/* clampi((int)lrintf(f), 0, nmax) per lane. lrintf gives a 64-bit integer that (int) truncates
 * to its low 32 bits; VCVTPS2DQ agrees wherever |f| < 2^31 and answers 0x80000000 elsewhere (and
 * for NaN), which sends such vectors through the 64-bit conversion. */
static inline __m512i code_of(__m512 f, __m512i vmax) {
    __m512i v = _mm512_cvtps_epi32(f);
    if (__builtin_expect(_mm512_cmpeq_epi32_mask(v, _mm512_set1_epi32(INT32_MIN)) != 0, 0)) {
        const __m512i lo = _mm512_cvtps_epi64(_mm512_castps512_ps256(f));
        const __m512i hi = _mm512_cvtps_epi64(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
        v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(lo)), _mm512_cvtepi64_epi32(hi), 1);
    }
    return _mm512_min_epi32(_mm512_max_epi32(v, _mm512_setzero_si512()), vmax);
}

/* The reference's fit_err per lane: weighted squared error of x ~ d*q + m with q by nearest
 * rounding. id = 1/d where d != 0, else 0. */
static inline __m512 fit_err16(const float *xt, const float *wt, int n, __m512i vmax, __m512 d, __m512 m) {
    const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ), _mm512_set1_ps(1.0f), d);
    __m512 err = _mm512_setzero_ps();
    for (int i = 0; i < n; i++) {
        const __m512 x = _mm512_load_ps(xt + i * NL), w = _mm512_load_ps(wt + i * NL);
        const __m512 v = _mm512_cvtepi32_ps(code_of(_mm512_mul_ps(_mm512_sub_ps(x, m), id), vmax));
        const __m512 e = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(d, v), m), x);
        err = _mm512_add_ps(err, _mm512_mul_ps(_mm512_mul_ps(w, e), e));
    }
    return err;
}

/* Lanes in ok whose fit (d, m) has a smaller error than their best so far take it (the
 * reference's `if (e < best)`); returns those lanes. bm may be NULL (symmetric: no offset kept). */
static inline __mmask16 take_better(const float *xt, const float *wt, int n, __m512i vmax, __mmask16 ok, __m512 d,
                                    __m512 m, __m512 *best, __m512 *bd, __m512 *bm) {
    const __m512 e = fit_err16(xt, wt, n, vmax, d, m);
    ok &= _mm512_cmp_ps_mask(e, *best, _CMP_LT_OQ);
    *best = _mm512_mask_mov_ps(*best, ok, e);
    *bd = _mm512_mask_mov_ps(*bd, ok, d);
    if (bm) *bm = _mm512_mask_mov_ps(*bm, ok, m);
    return ok;
}

/* Weighted least-squares fit of x ~ d*v + m on codes v (asymmetric): the sums of the reference. */
typedef struct {
    dvec sw, sq, sqq, sx, sqx;
} lsq;
/* The sums over the group for codes v = round((x - a) * b) (a candidate: a = mn, b = its inverse
 * scale; a refit: a = m, b = 1/d of the best fit so far). sw and sx do not depend on the codes:
 * base holds them, summed once per group in the same order (so the same doubles). */
static inline lsq asym_sums(const float *xt, const float *wt, int n, __m512i vmax, const lsq *base, __m512 a, __m512 b) {
    lsq s = {base->sw, dv_zero(), dv_zero(), base->sx, dv_zero()};
    for (int i = 0; i < n; i++) {
        const __m512 x = _mm512_load_ps(xt + i * NL), w = _mm512_load_ps(wt + i * NL);
        const __m512 v = _mm512_cvtepi32_ps(code_of(_mm512_mul_ps(_mm512_sub_ps(x, a), b), vmax));
        const __m512 wv = _mm512_mul_ps(w, v);
        s.sq = dv_acc(s.sq, wv);
        s.sqq = dv_acc(s.sqq, _mm512_mul_ps(wv, v));
        s.sqx = dv_acc(s.sqx, _mm512_mul_ps(wv, x));
    }
    return s;
}
/* det > 0 and d > 0 as in the reference; d, m out. */
static inline __mmask16 lsq_solve(const lsq *s, __m512 *d, __m512 *m) {
    const dvec det = dv_sub(dv_mul(s->sw, s->sqq), dv_mul(s->sq, s->sq));
    *d = dv_to_ps(dv_div(dv_sub(dv_mul(s->sw, s->sqx), dv_mul(s->sq, s->sx)), det));
    *m = dv_to_ps(dv_div(dv_sub(dv_mul(s->sqq, s->sx), dv_mul(s->sq, s->sqx)), det));
    return dv_gt0(det) & _mm512_cmp_ps_mask(*d, _mm512_setzero_ps(), _CMP_GT_OQ);
}

/* Symmetric fit of x ~ d*y, y = code - c: the reference's sums sxy, syy, with the codes of a
 * candidate scale (refine = 0: round(x / a + c)) or of the best fit so far (refine = 1:
 * round((x - a) * b), a = -d*c, b = 1/d). */
static inline void sym_sums(const float *xt, const float *wt, int n, __m512i vmax, __m512 c, int refine, __m512 a,
                            __m512 b, dvec *sxy, dvec *syy) {
    dvec sa = dv_zero(), sb = dv_zero();
    for (int i = 0; i < n; i++) {
        const __m512 x = _mm512_load_ps(xt + i * NL), w = _mm512_load_ps(wt + i * NL);
        const __m512 f = refine ? _mm512_mul_ps(_mm512_sub_ps(x, a), b) : _mm512_add_ps(_mm512_div_ps(x, a), c);
        const __m512 y = _mm512_sub_ps(_mm512_cvtepi32_ps(code_of(f, vmax)), c);
        sa = dv_acc(sa, _mm512_mul_ps(_mm512_mul_ps(w, x), y));
        sb = dv_acc(sb, _mm512_mul_ps(_mm512_mul_ps(w, y), y));
    }
    *sxy = sa, *syy = sb;
}

/* The search of quantize_group for 16 transposed groups xt[i][lane] with weights wt; d, m out. */
static void search16(const tn_tq_params *p, const float *xt, const float *it, float *wt, float *bd, float *bm) {
    const int n = p->group, nmax = (1 << p->bits) - 1;
    const __m512i vmax = _mm512_set1_epi32(nmax);
    const __m512 zero = _mm512_setzero_ps(), inf = _mm512_set1_ps(INFINITY);
    __m512 s2 = zero;
    for (int i = 0; i < n; i++) {
        const __m512 x = _mm512_load_ps(xt + i * NL);
        s2 = _mm512_add_ps(s2, _mm512_mul_ps(x, x));
    }
    const __m512 sigma2 = _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(2.0f), s2), _mm512_set1_ps((float)n));
    __m512 mn = _mm512_load_ps(xt), mx = mn, amax = zero;
    for (int i = 0; i < n; i++) {
        const __m512 x = _mm512_load_ps(xt + i * NL);
        const __m512 t = _mm512_add_ps(sigma2, _mm512_mul_ps(x, x));
        _mm512_store_ps(wt + i * NL, it ? _mm512_mul_ps(_mm512_load_ps(it + i * NL), _mm512_sqrt_ps(t)) : t);
        mn = _mm512_min_ps(x, mn); /* glibc's fminf(mn, x) keeps mn when equal (-0 vs +0) */
        mx = _mm512_max_ps(x, mx);
        amax = _mm512_max_ps(_mm512_abs_ps(x), amax);
    }
    __m512 best = inf, best_d = zero, best_m = p->asym ? mn : zero;
    __mmask16 live = _mm512_cmp_ps_mask(amax, zero, _CMP_NEQ_UQ);
    if (p->asym) {
        live &= _mm512_cmp_ps_mask(mx, mn, _CMP_NEQ_UQ);
        const __m512 range = _mm512_sub_ps(mx, mn);
        lsq base = {dv_zero(), dv_zero(), dv_zero(), dv_zero(), dv_zero()};
        for (int i = 0; i < n; i++) {
            const __m512 x = _mm512_load_ps(xt + i * NL), w = _mm512_load_ps(wt + i * NL);
            base.sw = dv_acc(base.sw, w);
            base.sx = dv_acc(base.sx, _mm512_mul_ps(w, x));
        }
        for (int is = -10; is <= 20 && live; is++) {
            const __m512 iscale = _mm512_div_ps(_mm512_set1_ps(nmax + 0.1f * is), range);
            const lsq s = asym_sums(xt, wt, n, vmax, &base, mn, iscale); /* iscale * (x - mn): a product commutes */
            __m512 d, m;
            __mmask16 ok = live & _mm512_cmp_ps_mask(iscale, zero, _CMP_GT_OQ) & lsq_solve(&s, &d, &m);
            if (ok) take_better(xt, wt, n, vmax, ok, d, m, &best, &best_d, &best_m);
        }
        const __mmask16 none = live & _mm512_cmp_ps_mask(best, inf, _CMP_EQ_OQ);
        best_d = _mm512_mask_div_ps(best_d, none, range, _mm512_set1_ps((float)nmax));
        best_m = _mm512_mask_mov_ps(best_m, none, mn);
        /* refinement: codes of the best (d, m), exact refit, while the error drops */
        __mmask16 act = live & ~none;
        for (int itr = 0; itr < 4 && act; itr++) {
            const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(best_d, zero, _CMP_NEQ_UQ), _mm512_set1_ps(1.0f), best_d);
            const lsq s = asym_sums(xt, wt, n, vmax, &base, best_m, id);
            __m512 d, m;
            act &= lsq_solve(&s, &d, &m);
            if (act) act = take_better(xt, wt, n, vmax, act, d, m, &best, &best_d, &best_m);
        }
    } else {
        const float cs = nmax * 0.5f;
        const __m512 c = _mm512_set1_ps(cs), sign = _mm512_set1_ps(-0.0f);
        const __m512 a_c = _mm512_div_ps(amax, c);
        for (int is = 0; is <= 40 && live; is++) {
            const __m512 d0 = _mm512_mul_ps(a_c, _mm512_set1_ps(0.5f + 0.0175f * is));
            dvec sxy, syy;
            sym_sums(xt, wt, n, vmax, c, 0, d0, zero, &sxy, &syy);
            __mmask16 ok = live & dv_gt0(syy) & dv_gt0(sxy);
            if (!ok) continue;
            const __m512 d = dv_to_ps(dv_div(sxy, syy));
            take_better(xt, wt, n, vmax, ok, d, _mm512_mul_ps(_mm512_xor_ps(d, sign), c), &best, &best_d, NULL);
        }
        const __mmask16 none = live & _mm512_cmp_ps_mask(best, inf, _CMP_EQ_OQ);
        best_d = _mm512_mask_mov_ps(best_d, none, a_c);
        __mmask16 act = live & ~none;
        for (int itr = 0; itr < 4 && act; itr++) {
            const __m512 m0 = _mm512_mul_ps(_mm512_xor_ps(best_d, sign), c);
            const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(best_d, zero, _CMP_NEQ_UQ), _mm512_set1_ps(1.0f), best_d);
            dvec sxy, syy;
            sym_sums(xt, wt, n, vmax, c, 1, m0, id, &sxy, &syy);
            act &= dv_gt0(syy) & dv_gt0(sxy);
            if (!act) break;
            const __m512 d = dv_to_ps(dv_div(sxy, syy));
            act = take_better(xt, wt, n, vmax, act, d, _mm512_mul_ps(_mm512_xor_ps(d, sign), c), &best, &best_d, NULL);
        }
    }
    _mm512_storeu_ps(bd, best_d);
    _mm512_storeu_ps(bm, best_m);
}

void tn_k_tq_quantize__avx512(const tn_tq_params *p, const float *x, void *y, int64_t k, const float *imatrix) {
    const int G = p->group;
    const int64_t ng = k / G;
    const size_t bb = tn_tq_block_bytes(p);
    _Alignas(64) float xt[256 * NL], it[256 * NL], wt[256 * NL];
    float bd[NL], bm[NL];
    for (int64_t g0 = 0; g0 < ng; g0 += NL) {
        const int cnt = ng - g0 < NL ? (int)(ng - g0) : NL;
        __m512 fin = _mm512_setzero_ps(); /* 0 * v: NaN for any non-finite v */
        for (int j = 0; j < NL; j++) {
            const int64_t g = g0 + (j < cnt ? j : 0);
            const float *xg = x + g * G, *ig = imatrix ? imatrix + g * G : NULL;
            for (int i = 0; i < G; i++) {
                xt[i * NL + j] = xg[i];
                if (ig) it[i * NL + j] = ig[i];
            }
        }
        for (int i = 0; i < G; i++) {
            fin = _mm512_add_ps(fin, _mm512_mul_ps(_mm512_load_ps(xt + i * NL), _mm512_setzero_ps()));
            if (imatrix) fin = _mm512_add_ps(fin, _mm512_mul_ps(_mm512_load_ps(it + i * NL), _mm512_setzero_ps()));
        }
        uint8_t *yb = (uint8_t *)y + (size_t)g0 * bb;
        if (_mm512_cmp_ps_mask(fin, fin, _CMP_UNORD_Q)) {
            tn_tq_quantize_row(p, x + g0 * G, yb, (int64_t)cnt * G, imatrix ? imatrix + g0 * G : NULL);
            continue;
        }
        search16(p, xt, imatrix ? it : NULL, wt, bd, bm);
        for (int j = 0; j < cnt; j++) tn_tq_finish_group(p, x + (g0 + j) * G, bd[j], bm[j], yb + (size_t)j * bb);
    }
}
