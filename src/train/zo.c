/*
 * zo.c — zeroth-order (SPSA) steps. See zo.h.
 */
#include <math.h>
#include <string.h>

#include "train/rng.h"
#include "train/zo.h"

enum { MAXS = 64, MAXQ = 127 };

static uint64_t z_seed(uint64_t seed, int64_t step, int k) {
    uint64_t s = seed ^ UINT64_C(0x5A0E5A0E5A0E5A0E);
    s ^= tn_rng_next(&s) + (uint64_t)step * UINT64_C(0x9E3779B97F4A7C15);
    s ^= tn_rng_next(&s) + (uint64_t)(k + 1) * UINT64_C(0xD1B54A32D192ED03);
    return s;
}

/* params += a * z (z regenerated from s) */
static void add_z(tn_tmodel *m, uint64_t s, float a) {
    for (size_t i = 0; i < m->n_params; i++) m->params[i] += a * (float)tn_rng_normal(&s);
}

int8_t tn_zo_q8(float g, float c, float u) {
    if (!isfinite(g) || !(c > 0.0f)) return (int8_t)TN_ZO_NONFINITE;
    const float v = floorf(g / c * (float)MAXQ + u);
    return (int8_t)(v > (float)MAXQ ? MAXQ : v < -(float)MAXQ ? -MAXQ : v);
}

float tn_zo_clip_next(float c, const int8_t *q, int n) {
    double sq = 0.0;
    for (int i = 0; i < n; i++) {
        if (q[i] == TN_ZO_NONFINITE) return c; /* the step fails anyway */
        if (q[i] == MAXQ || q[i] == -MAXQ) return fminf(2.0f * c, 1e30f);
        sq += (double)q[i] * (double)q[i];
    }
    const float rms = n ? (float)(sqrt(sq / n) * (double)c / MAXQ) : 0.0f;
    return fmaxf(0.9f * c + 0.1f * fmaxf(4.0f * rms, c / 8.0f), 1e-20f);
}

/* int8 exchange: this rank's bytes for g[0..n), every rank's into all[size][n]; g becomes the
 * mean of the dequantized values and zs->clip moves on (zo.h). */
static tern_status exchange_q8(tn_dist *d, tn_zo_state *zs, uint64_t seed, int64_t step, float *g, int n, double *loss) {
    int8_t mine[MAXS], stack[4 * MAXS];
    const int N = tn_dist_size(d);
    int8_t *all = (size_t)N * (size_t)n <= sizeof stack ? stack : tn_malloc((size_t)N * (size_t)n);
    if (!all) return tn_err(TERN_ERR_NOMEM, "train: --zo exchange of %d x %d bytes", N, n);
    if (!(zs->clip > 0.0f)) zs->clip = TN_ZO_CLIP0;
    uint64_t r = seed ^ UINT64_C(0x6F6E652D62797465) ^ ((uint64_t)step * UINT64_C(0x9E3779B97F4A7C15)) ^
                 ((uint64_t)tn_dist_rank(d) << 40); /* "one-byte" */
    for (int k = 0; k < n; k++) {
        const float u = (float)(tn_rng_next(&r) >> 40) * 0x1.0p-24f;
        mine[k] = isfinite(*loss) ? tn_zo_q8(g[k], zs->clip, u) : (int8_t)TN_ZO_NONFINITE;
    }
    tern_status s = tn_dist_allgather(d, mine, n, all);
    if (!s) {
        const float unit = zs->clip / (float)MAXQ;
        for (int k = 0; k < n; k++) {
            long sum = 0;
            for (int rr = 0; rr < N; rr++) {
                const int8_t q = all[(size_t)rr * (size_t)n + (size_t)k];
                if (q == TN_ZO_NONFINITE) *loss = NAN;
                sum += q;
            }
            g[k] = (float)sum * unit / (float)N;
        }
        zs->clip = tn_zo_clip_next(zs->clip, all, N * n);
    }
    if (all != stack) tn_free(all);
    return s;
}

tern_status tn_zo_step(tn_tmodel *m, tn_dist *d, const tn_zo_opts *o, tn_zo_state *zs, uint64_t seed, int64_t step,
                       const int32_t *tok, const int32_t *tgt, float lr, double *loss) {
    if (o->samples < 1 || o->samples > MAXS) return tn_err(TERN_ERR_INVALID_ARG, "train: --zo-samples must be in [1, %d]", MAXS);
    float g[MAXS + 1];
    double lsum = 0.0;
    tern_status s;
    for (int k = 0; k < o->samples; k++) {
        const uint64_t zs_k = z_seed(seed, step, k);
        double lp, lm;
        add_z(m, zs_k, o->eps);
        if ((s = tn_tmodel_forward(m, tok, tgt, &lp))) return s;
        add_z(m, zs_k, -2.0f * o->eps);
        if ((s = tn_tmodel_forward(m, tok, tgt, &lm))) return s;
        add_z(m, zs_k, o->eps);
        g[k] = (float)((lp - lm) / (2.0 * (double)o->eps));
        lsum += 0.5 * (lp + lm);
    }
    if (o->int8) {
        *loss = lsum / o->samples;
        if ((s = exchange_q8(d, zs, seed, step, g, o->samples, loss))) return s;
    } else {
        g[o->samples] = (float)(lsum / o->samples);
        if ((s = tn_dist_allreduce_mean(d, g, o->samples + 1))) return s;
        *loss = g[o->samples];
    }
    if (!isfinite(*loss)) return TERN_OK; /* the caller reports divergence */
    for (int k = 0; k < o->samples; k++) add_z(m, z_seed(seed, step, k), -lr * g[k] / (float)o->samples);
    return TERN_OK;
}
