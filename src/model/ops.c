/*
 * ops.c — see ops.h.
 */
#include <math.h>

#include "model/ops.h"

void tn_op_rmsnorm(const float *x, float *y, const float *w, int64_t d, float eps) {
    /* the sum of the float squares in double, as llama.cpp; eight partial sums so that the adds
     * do not wait on one another (the order of double additions: a difference far below the
     * float result's rounding) */
    double s8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i0 = 0;
    for (; i0 + 8 <= d; i0 += 8)
        for (int j = 0; j < 8; j++) s8[j] += (double)(x[i0 + j] * x[i0 + j]);
    double ss = ((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7]));
    for (; i0 < d; i0++) ss += (double)(x[i0] * x[i0]);
    const float scale = 1.0f / sqrtf((float)(ss / (double)d) + eps);
    for (int64_t i = 0; i < d; i++) y[i] = (x[i] * scale) * w[i];
}

/* YaRN's dimension where a frequency completes n_rot rotations over the original context
 * (ggml_rope_yarn_corr_dim). */
static float tn_yarn_corr_dim(int32_t n_dims, int32_t n_ctx_orig, float n_rot, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2 * 3.14159265358979323846f)) / (2 * logf(base));
}

void tn_op_rope_cache(const tn_hparams *hp, const float *ff, int64_t pos, float *cs) {
    const float theta_scale = powf(hp->rope_freq_base, -2.0f / (float)hp->n_rot);
    float ms = hp->rope_attn_factor > 0 ? hp->rope_attn_factor : 1.0f; /* ggml's mscale */
    const float ext = hp->yarn_ext_factor, fs = hp->rope_freq_scale;
    float lo = 0, hi = 0; /* YaRN: dims below lo extrapolate, above hi interpolate, a ramp between */
    if (ext != 0.0f) {
        lo = TN_MAX(0.0f, floorf(tn_yarn_corr_dim(hp->n_rot, hp->n_ctx_orig, hp->yarn_beta_fast, hp->rope_freq_base)));
        hi = TN_MIN((float)(hp->n_rot - 1), ceilf(tn_yarn_corr_dim(hp->n_rot, hp->n_ctx_orig, hp->yarn_beta_slow, hp->rope_freq_base)));
        ms *= 1.0f + 0.1f * logf(1.0f / fs);
    }
    float theta = (float)pos;
    for (int32_t i0 = 0; i0 < hp->n_rot; i0 += 2) {
        const float f = ff ? ff[i0 / 2] : 1.0f;
        const float extrap = theta / f;
        float th = fs * extrap;
        if (ext != 0.0f) {
            const float y = (float)(i0 / 2 - lo) / TN_MAX(0.001f, hi - lo);
            const float mix = (1 - TN_MIN(1.0f, TN_MAX(0.0f, y))) * ext;
            th = th * (1 - mix) + extrap * mix;
        }
        cs[i0] = cosf(th) * ms;
        cs[i0 + 1] = sinf(th) * ms;
        theta *= theta_scale;
    }
}

void tn_op_swiglu_oai(float *g, const float *u, int64_t n) {
    const float alpha = 1.702f, limit = 7.0f;
    for (int64_t i = 0; i < n; i++) {
        const float x = TN_MIN(g[i], limit), y = TN_MAX(-limit, TN_MIN(u[i], limit));
        g[i] = x / (1.0f + expf(alpha * (-x))) * (y + 1.0f);
    }
}

void tn_op_relu_sqr(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float r = x[i] > 0.0f ? x[i] : 0.0f;
        x[i] = r * r;
    }
}

void tn_op_rope(const tn_hparams *hp, float *v, int32_t n_heads, const float *cs, float sign) {
    const int32_t nr = hp->n_rot, hd = hp->head_dim;
    for (int32_t h = 0; h < n_heads; h++) {
        float *x = v + (int64_t)h * hd;
        for (int32_t i0 = 0; i0 < nr; i0 += 2) {
            const float co = cs[i0], si = sign * cs[i0 + 1];
            int32_t a, b;
            if (hp->rope_mode == TN_ROPE_NORM) { a = i0; b = i0 + 1; }       /* adjacent pairs */
            else { a = i0 / 2; b = i0 / 2 + nr / 2; }                        /* half split     */
            const float x0 = x[a], x1 = x[b];
            x[a] = x0 * co - x1 * si;
            x[b] = x0 * si + x1 * co;
        }
    }
}

double tn_op_logsumexp(const float *l, int64_t n, int64_t *imax) {
    float mx = l[0];
    int64_t im = 0;
    for (int64_t i = 1; i < n; i++)
        if (l[i] > mx) mx = l[i], im = i;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += expf(l[i] - mx);
    if (imax) *imax = im;
    return mx + log(s);
}
