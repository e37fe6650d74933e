/*
 * attn.c (scalar) — the reference attention kernel (contract in kern.h) and SwiGLU: one query head at a time, online
 * softmax, ggml's flash-attention arithmetic step by step (expf, fmaf, f16 rounding points); the same with
 * soft-capped scores (gemma2), the reference of avx512/attn.c's soft-capped kernel.
 */
#include <math.h>

#include "core/fp16.h"
#include "kern/kern.h"

/* One head; cap > 0: scores soft-capped as ggml does (scale divided by cap, then cap * tanh). */
static inline void tn_attn1(int64_t hd, int64_t T, const float *q, const uint16_t *K, const uint16_t *V, int64_t ldkv,
                            const int32_t *blocks, int64_t block_rows, float scale, float cap, bool acc16, float *out,
                            float *scratch) {
    float *qv = scratch;       /* q as used in the dot products (f16-rounded with acc16) */
    float *acc = scratch + hd; /* V accumulator (values kept f16-representable with acc16) */
    for (int64_t i = 0; i < hd; i++) {
        qv[i] = acc16 ? tn_fp16_to_fp32(tn_fp32_to_fp16(q[i])) : q[i];
        acc[i] = 0.0f;
    }
    float M = -INFINITY, S = 0.0f;
    for (int64_t t = 0; t < T; t++) {
        const int64_t row = tn_kv_row(blocks, block_rows, t);
        const uint16_t *k = K + row * ldkv, *v = V + row * ldkv;
        float s = 0.0f;
        for (int64_t i = 0; i < hd; i++) s += tn_fp16_to_fp32(k[i]) * qv[i];
        s *= scale;
        if (cap > 0) s = cap * tanhf(s);
        float ms = 1.0f, vs = 1.0f;
        if (s > M) { /* new maximum: rescale what was accumulated */
            const float Mold = M;
            M = s;
            ms = expf(Mold - M);
            for (int64_t i = 0; i < hd; i++) {
                acc[i] *= ms;
                if (acc16) acc[i] = tn_fp16_to_fp32(tn_fp32_to_fp16(acc[i]));
            }
        } else {
            vs = expf(s - M);
        }
        for (int64_t i = 0; i < hd; i++) {
            acc[i] = fmaf(tn_fp16_to_fp32(v[i]), vs, acc[i]);
            if (acc16) acc[i] = tn_fp16_to_fp32(tn_fp32_to_fp16(acc[i]));
        }
        S = S * ms + vs;
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int64_t i = 0; i < hd; i++) out[i] = acc[i] * inv;
}

void tn_k_attn1_f16__scalar(int64_t hd, int64_t T, const float *q, const uint16_t *K, const uint16_t *V, int64_t ldkv,
                            const int32_t *blocks, int64_t block_rows, float scale, bool acc16, float *out,
                            float *scratch) {
    tn_attn1(hd, T, q, K, V, ldkv, blocks, block_rows, scale, 0.0f, acc16, out, scratch);
}

void tn_k_attn_f16__scalar(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, const uint16_t *K,
                           const uint16_t *V, int64_t ldkv, const int32_t *blocks, int64_t block_rows, float scale,
                           bool acc16, float *out, float *scratch) {
    for (int64_t j = 0; j < nh; j++)
        tn_attn1(hd, T, q + j * hd, K + (j / rep) * hd, V + (j / rep) * hd, ldkv, blocks, block_rows, scale, 0.0f, acc16,
                 out + j * hd, scratch + 2 * hd * j);
}

void tn_k_attn_softcap_f16__scalar(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, const uint16_t *K,
                                   const uint16_t *V, int64_t ldkv, const int32_t *blocks, int64_t block_rows,
                                   float scale, float cap, bool acc16, float *out, float *scratch) {
    for (int64_t j = 0; j < nh; j++)
        tn_attn1(hd, T, q + j * hd, K + (j / rep) * hd, V + (j / rep) * hd, ldkv, blocks, block_rows, scale / cap, cap,
                 acc16, out + j * hd, scratch + 2 * hd * j);
}

void tn_k_swiglu__scalar(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}

void tn_k_geglu__scalar(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x))) * u[i];
    }
}

void tn_kern_register_attn_scalar(tn_kern_table *t) {
    t->attn = tn_k_attn_f16__scalar;
    t->attn_isa = TN_ISA_SCALAR;
    t->attn_softcap = tn_k_attn_softcap_f16__scalar;
    t->swiglu = tn_k_swiglu__scalar;
    t->swiglu_isa = TN_ISA_SCALAR;
    t->geglu = tn_k_geglu__scalar;
    t->geglu_isa = TN_ISA_SCALAR;
}
