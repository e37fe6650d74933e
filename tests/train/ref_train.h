/*
 * ref_train.h — an independent double-precision forward + cross-entropy of the training model,
 * written straight from the math (no tern ops, no registry roles), for gradient checks by central
 * differences. Parameters are read from a float buffer laid out as tn_tmodel's sizes table and
 * found by their llama.cpp tensor names; `over` (optional) replaces parameter `over_i` by the
 * double value `over_v`.
 *
 * The block, per family (written here from llama.cpp's src/models/{llama,qwen2,qwen3}.cpp, not
 * from tern's descriptors): x += Wo attn(rope(norm_qk(Wq xn + bq)), rope(norm_qk(Wk xn + bk)),
 * Wv xn + bv) with xn = rmsnorm(x) * attn_norm, then x += Wdown (silu(Wgate xn2) * Wup xn2).
 * Biases and the per-head q/k RMSNorm apply where the model has those tensors; RoPE rotates
 * adjacent pairs (llama: the converter permutes q/k rows) or halves (qwen2, qwen3: "neox").
 * head_dim is the config's (n_embd / n_head when 0); query rows are n_head * head_dim.
 * The loss is the mean over the targets that are not -1 (masked).
 */
#ifndef TN_TESTS_REF_TRAIN_H
#define TN_TESTS_REF_TRAIN_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

typedef struct ref_ctx {
    const tn_tmodel *m;
    const float *P;
    size_t over_i;
    double over_v;
    bool use_over;
    /* optional: added to element j of tensor t (a LoRA test adds scale * (B A)[j] in double) */
    double (*extra)(const struct ref_ctx *r, int t, size_t j);
    void *user;
} ref_ctx;

static inline double ref_p(const ref_ctx *r, int t, size_t j) {
    size_t i = r->m->t[t].off + j;
    const double e = r->extra ? r->extra(r, t, j) : 0.0;
    if (r->use_over && i == r->over_i) return r->over_v + e;
    return (double)r->P[i] + e;
}

/* Index of the tensor named by fmt (layer l), or -1 when the model has none. */
static int ref_find(const ref_ctx *r, const char *fmt, int l) {
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    for (int i = 0; i < r->m->n_tensors; i++)
        if (!strcmp(r->m->t[i].name, name)) return i;
    return -1;
}

/* Whether the family rotates halves (neox) rather than adjacent pairs. */
static bool ref_rope_halves(const tn_tmodel *m) {
    const char *fam = m->cfg.arch ? m->cfg.arch->name : "llama";
    return !strcmp(fam, "qwen2") || !strcmp(fam, "qwen3");
}

static void ref_rmsnorm(const ref_ctx *r, const double *x, double *y, int wt, int C, double eps) {
    double ss = 0;
    for (int i = 0; i < C; i++) ss += x[i] * x[i];
    double sc = 1.0 / sqrt(ss / C + eps);
    for (int i = 0; i < C; i++) y[i] = x[i] * sc * ref_p(r, wt, (size_t)i);
}

/* y[N][mr] = x[N][k] W^T (+ bias b when b >= 0) */
static void ref_lin(const ref_ctx *r, const double *x, double *y, int wt, int b, int N, int k, int mr) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < mr; o++) {
            double s = b >= 0 ? ref_p(r, b, (size_t)o) : 0.0;
            for (int i = 0; i < k; i++) s += x[(size_t)n * k + i] * ref_p(r, wt, (size_t)o * k + i);
            y[(size_t)n * mr + o] = s;
        }
}

/* Rotation of pair j (frequency base^(-2j/hd)) of each head: elements (2j, 2j+1), or (j, j+hd/2). */
static void ref_rope(double *v, int n_heads, int hd, int pos, double base, bool halves) {
    for (int h = 0; h < n_heads; h++)
        for (int j = 0; j < hd / 2; j++) {
            const int ia = halves ? j : 2 * j, ib = halves ? j + hd / 2 : 2 * j + 1;
            double th = pos * pow(base, -2.0 * j / hd);
            double c = cos(th), s = sin(th), a = v[h * hd + ia], b = v[h * hd + ib];
            v[h * hd + ia] = a * c - b * s;
            v[h * hd + ib] = a * s + b * c;
        }
}

/* Mean cross-entropy over B*T positions. */
static double ref_loss(const ref_ctx *r, const int32_t *tok, const int32_t *tgt, int B, int T) {
    const tn_train_cfg *c = &r->m->cfg;
    const int C = c->n_embd, H = c->n_head, HK = c->n_head_kv, hd = c->head_dim ? c->head_dim : C / H;
    const int Q = H * hd, KV = HK * hd, F = c->n_ff, V = c->n_vocab;
    const int N = B * T;
    const bool halves = ref_rope_halves(r->m);
    double *x = calloc((size_t)N * C, 8), *xn = calloc((size_t)N * C, 8), *q = calloc((size_t)N * Q, 8);
    double *k = calloc((size_t)N * KV, 8), *v = calloc((size_t)N * KV, 8), *y = calloc((size_t)N * Q, 8);
    double *o = calloc((size_t)N * C, 8), *g = calloc((size_t)N * F, 8), *u = calloc((size_t)N * F, 8);
    double *lg = calloc((size_t)N * V, 8), *att = calloc((size_t)T, 8), *hv = calloc((size_t)hd, 8);
    const int emb = ref_find(r, "token_embd.weight", 0);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) x[(size_t)n * C + i] = ref_p(r, emb, (size_t)tok[n] * C + i);
    for (int l = 0; l < c->n_layer; l++) {
        const int qnw = ref_find(r, "blk.%d.attn_q_norm.weight", l), knw = ref_find(r, "blk.%d.attn_k_norm.weight", l);
        for (int n = 0; n < N; n++)
            ref_rmsnorm(r, x + (size_t)n * C, xn + (size_t)n * C, ref_find(r, "blk.%d.attn_norm.weight", l), C, c->rms_eps);
        ref_lin(r, xn, q, ref_find(r, "blk.%d.attn_q.weight", l), ref_find(r, "blk.%d.attn_q.bias", l), N, C, Q);
        ref_lin(r, xn, k, ref_find(r, "blk.%d.attn_k.weight", l), ref_find(r, "blk.%d.attn_k.bias", l), N, C, KV);
        ref_lin(r, xn, v, ref_find(r, "blk.%d.attn_v.weight", l), ref_find(r, "blk.%d.attn_v.bias", l), N, C, KV);
        for (int n = 0; n < N; n++) {
            /* per-head RMSNorm of q and k (qwen3), then RoPE */
            for (int h = 0; qnw >= 0 && h < H; h++) {
                ref_rmsnorm(r, q + (size_t)n * Q + h * hd, hv, qnw, hd, c->rms_eps);
                memcpy(q + (size_t)n * Q + h * hd, hv, (size_t)hd * 8);
            }
            for (int h = 0; knw >= 0 && h < HK; h++) {
                ref_rmsnorm(r, k + (size_t)n * KV + h * hd, hv, knw, hd, c->rms_eps);
                memcpy(k + (size_t)n * KV + h * hd, hv, (size_t)hd * 8);
            }
            ref_rope(q + (size_t)n * Q, H, hd, n % T, c->rope_base, halves);
            ref_rope(k + (size_t)n * KV, HK, hd, n % T, c->rope_base, halves);
        }
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                int kh = h / (H / HK);
                for (int t = 0; t < T; t++) {
                    double mx = -1e300, sum = 0;
                    for (int s = 0; s <= t; s++) {
                        double d = 0;
                        for (int i = 0; i < hd; i++)
                            d += q[(size_t)(b * T + t) * Q + h * hd + i] * k[(size_t)(b * T + s) * KV + kh * hd + i];
                        att[s] = d / sqrt((double)hd);
                        if (att[s] > mx) mx = att[s];
                    }
                    for (int s = 0; s <= t; s++) sum += (att[s] = exp(att[s] - mx));
                    for (int i = 0; i < hd; i++) {
                        double acc = 0;
                        for (int s = 0; s <= t; s++) acc += att[s] / sum * v[(size_t)(b * T + s) * KV + kh * hd + i];
                        y[(size_t)(b * T + t) * Q + h * hd + i] = acc;
                    }
                }
            }
        ref_lin(r, y, o, ref_find(r, "blk.%d.attn_output.weight", l), -1, N, Q, C);
        for (size_t i = 0; i < (size_t)N * C; i++) x[i] += o[i];
        for (int n = 0; n < N; n++)
            ref_rmsnorm(r, x + (size_t)n * C, xn + (size_t)n * C, ref_find(r, "blk.%d.ffn_norm.weight", l), C, c->rms_eps);
        ref_lin(r, xn, g, ref_find(r, "blk.%d.ffn_gate.weight", l), -1, N, C, F);
        ref_lin(r, xn, u, ref_find(r, "blk.%d.ffn_up.weight", l), -1, N, C, F);
        for (size_t i = 0; i < (size_t)N * F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        ref_lin(r, g, o, ref_find(r, "blk.%d.ffn_down.weight", l), -1, N, F, C);
        for (size_t i = 0; i < (size_t)N * C; i++) x[i] += o[i];
    }
    for (int n = 0; n < N; n++) ref_rmsnorm(r, x + (size_t)n * C, xn + (size_t)n * C, ref_find(r, "output_norm.weight", 0), C, c->rms_eps);
    ref_lin(r, xn, lg, ref_find(r, "output.weight", 0), -1, N, C, V);
    double loss = 0;
    int n_valid = 0; /* targets of -1 are masked: no loss, not counted */
    for (int n = 0; n < N; n++) {
        if (tgt[n] < 0) continue;
        n_valid++;
        double mx = -1e300, sum = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, lg[(size_t)n * V + j]);
        for (int j = 0; j < V; j++) sum += exp(lg[(size_t)n * V + j] - mx);
        loss += log(sum) + mx - lg[(size_t)n * V + tgt[n]];
    }
    free(x); free(xn); free(q); free(k); free(v); free(y); free(o); free(g); free(u); free(lg); free(att); free(hv);
    return n_valid ? loss / n_valid : 0.0;
}

#endif
