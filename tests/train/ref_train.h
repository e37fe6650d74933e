/*
 * ref_train.h — an independent double-precision forward + cross-entropy of the training model,
 * written straight from the math (no tern ops), for gradient checks by central differences.
 * Parameters are read from a float buffer laid out as tn_tmodel's sizes table; `over`
 * (optional) replaces parameter `over_i` by the double value `over_v`.
 */
#ifndef TN_TESTS_REF_TRAIN_H
#define TN_TESTS_REF_TRAIN_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

typedef struct ref_ctx {
    const tn_tmodel *m;
    const float *P;
    size_t over_i;
    double over_v;
    bool use_over;
} ref_ctx;

static inline double ref_p(const ref_ctx *r, int t, size_t j) {
    size_t i = r->m->t[t].off + j;
    if (r->use_over && i == r->over_i) return r->over_v;
    return (double)r->P[i];
}

static void ref_rmsnorm(const ref_ctx *r, const double *x, double *y, int wt, int C, double eps) {
    double ss = 0;
    for (int i = 0; i < C; i++) ss += x[i] * x[i];
    double sc = 1.0 / sqrt(ss / C + eps);
    for (int i = 0; i < C; i++) y[i] = x[i] * sc * ref_p(r, wt, (size_t)i);
}

/* y[N][mr] = x[N][k] W^T */
static void ref_lin(const ref_ctx *r, const double *x, double *y, int wt, int N, int k, int mr) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < mr; o++) {
            double s = 0;
            for (int i = 0; i < k; i++) s += x[(size_t)n * k + i] * ref_p(r, wt, (size_t)o * k + i);
            y[(size_t)n * mr + o] = s;
        }
}

static void ref_rope(double *v, int n_heads, int hd, int pos, double base) {
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < hd; i += 2) {
            double th = pos * pow(base, -(double)i / hd);
            double c = cos(th), s = sin(th), a = v[h * hd + i], b = v[h * hd + i + 1];
            v[h * hd + i] = a * c - b * s;
            v[h * hd + i + 1] = a * s + b * c;
        }
}

/* Mean cross-entropy over B*T positions. */
static double ref_loss(const ref_ctx *r, const int32_t *tok, const int32_t *tgt, int B, int T) {
    const tn_train_cfg *c = &r->m->cfg;
    const int C = c->n_embd, H = c->n_head, HK = c->n_head_kv, hd = C / H, KV = HK * hd, F = c->n_ff, V = c->n_vocab;
    const int N = B * T;
    double *x = calloc((size_t)N * C, 8), *xn = calloc((size_t)N * C, 8), *q = calloc((size_t)N * C, 8);
    double *k = calloc((size_t)N * KV, 8), *v = calloc((size_t)N * KV, 8), *y = calloc((size_t)N * C, 8);
    double *o = calloc((size_t)N * C, 8), *g = calloc((size_t)N * F, 8), *u = calloc((size_t)N * F, 8);
    double *lg = calloc((size_t)N * V, 8), *att = calloc((size_t)T, 8);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) x[(size_t)n * C + i] = ref_p(r, 0, (size_t)tok[n] * C + i);
    for (int l = 0; l < c->n_layer; l++) {
        for (int n = 0; n < N; n++) ref_rmsnorm(r, x + (size_t)n * C, xn + (size_t)n * C, tn_tp_layer(l, TN_TP_ATTN_NORM), C, c->rms_eps);
        ref_lin(r, xn, q, tn_tp_layer(l, TN_TP_WQ), N, C, C);
        ref_lin(r, xn, k, tn_tp_layer(l, TN_TP_WK), N, C, KV);
        ref_lin(r, xn, v, tn_tp_layer(l, TN_TP_WV), N, C, KV);
        for (int n = 0; n < N; n++) {
            ref_rope(q + (size_t)n * C, H, hd, n % T, c->rope_base);
            ref_rope(k + (size_t)n * KV, HK, hd, n % T, c->rope_base);
        }
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                int kh = h / (H / HK);
                for (int t = 0; t < T; t++) {
                    double mx = -1e300, sum = 0;
                    for (int s = 0; s <= t; s++) {
                        double d = 0;
                        for (int i = 0; i < hd; i++)
                            d += q[(size_t)(b * T + t) * C + h * hd + i] * k[(size_t)(b * T + s) * KV + kh * hd + i];
                        att[s] = d / sqrt((double)hd);
                        if (att[s] > mx) mx = att[s];
                    }
                    for (int s = 0; s <= t; s++) sum += (att[s] = exp(att[s] - mx));
                    for (int i = 0; i < hd; i++) {
                        double acc = 0;
                        for (int s = 0; s <= t; s++) acc += att[s] / sum * v[(size_t)(b * T + s) * KV + kh * hd + i];
                        y[(size_t)(b * T + t) * C + h * hd + i] = acc;
                    }
                }
            }
        ref_lin(r, y, o, tn_tp_layer(l, TN_TP_WO), N, C, C);
        for (size_t i = 0; i < (size_t)N * C; i++) x[i] += o[i];
        for (int n = 0; n < N; n++) ref_rmsnorm(r, x + (size_t)n * C, xn + (size_t)n * C, tn_tp_layer(l, TN_TP_FFN_NORM), C, c->rms_eps);
        ref_lin(r, xn, g, tn_tp_layer(l, TN_TP_GATE), N, C, F);
        ref_lin(r, xn, u, tn_tp_layer(l, TN_TP_UP), N, C, F);
        for (size_t i = 0; i < (size_t)N * F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        ref_lin(r, g, o, tn_tp_layer(l, TN_TP_DOWN), N, F, C);
        for (size_t i = 0; i < (size_t)N * C; i++) x[i] += o[i];
    }
    const int on = tn_tp_layer(c->n_layer, 0);
    for (int n = 0; n < N; n++) ref_rmsnorm(r, x + (size_t)n * C, xn + (size_t)n * C, on, C, c->rms_eps);
    ref_lin(r, xn, lg, on + 1, N, C, V);
    double loss = 0;
    for (int n = 0; n < N; n++) {
        double mx = -1e300, sum = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, lg[(size_t)n * V + j]);
        for (int j = 0; j < V; j++) sum += exp(lg[(size_t)n * V + j] - mx);
        loss += log(sum) + mx - lg[(size_t)n * V + tgt[n]];
    }
    free(x); free(xn); free(q); free(k); free(v); free(y); free(o); free(g); free(u); free(lg); free(att);
    return loss / N;
}

#endif
