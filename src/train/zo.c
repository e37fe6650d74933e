/*
 * zo.c — zeroth-order (SPSA) steps. See zo.h.
 */
#include <math.h>

#include "train/rng.h"
#include "train/zo.h"

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

tern_status tn_zo_step(tn_tmodel *m, tn_dist *d, const tn_zo_opts *o, uint64_t seed, int64_t step, const int32_t *tok,
                       const int32_t *tgt, float lr, double *loss) {
    enum { MAXS = 64 };
    if (o->samples < 1 || o->samples > MAXS) return tn_err(TERN_ERR_INVALID_ARG, "train: --zo-samples must be in [1, %d]", MAXS);
    float g[MAXS + 1];
    double lsum = 0.0;
    tern_status s;
    for (int k = 0; k < o->samples; k++) {
        const uint64_t zs = z_seed(seed, step, k);
        double lp, lm;
        add_z(m, zs, o->eps);
        if ((s = tn_tmodel_forward(m, tok, tgt, &lp))) return s;
        add_z(m, zs, -2.0f * o->eps);
        if ((s = tn_tmodel_forward(m, tok, tgt, &lm))) return s;
        add_z(m, zs, o->eps);
        g[k] = (float)((lp - lm) / (2.0 * (double)o->eps));
        lsum += 0.5 * (lp + lm);
    }
    g[o->samples] = (float)(lsum / o->samples);
    if ((s = tn_dist_allreduce_mean(d, g, o->samples + 1))) return s;
    *loss = g[o->samples];
    if (!isfinite(*loss)) return TERN_OK; /* the caller reports divergence */
    for (int k = 0; k < o->samples; k++) add_z(m, z_seed(seed, step, k), -lr * g[k] / (float)o->samples);
    return TERN_OK;
}
