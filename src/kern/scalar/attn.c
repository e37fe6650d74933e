/*
 * attn.c (scalar) — the reference attention kernel (contract in kern.h) and SwiGLU: one query head at a time, online
 * softmax, ggml's flash-attention arithmetic step by step (expf, fmaf, f16 rounding points); the same with
 * soft-capped scores (gemma2), the reference of avx512/attn.c's soft-capped kernel; and over a quantized KV cache
 * (q8_0 / q4_0 / tq<b>g32a rows read in place), the reference of the attn_q kernels.
 */
#include <math.h>

#include "core/fp16.h"
#include "kern/kern.h"
#include "quant/kc.h"
#include "quant/quant.h"
#include "quant/tq.h"

void tn_k_vec_dot_q4_0_q8_0__scalar(int64_t k, float *s, const void *w, const void *x);
void tn_k_vec_dot_q8_0_q8_0__scalar(int64_t k, float *s, const void *w, const void *x);

static void tn_attn1_q(int64_t hd, int64_t T, const float *q, int32_t tk, const uint8_t *K, size_t k_rb, int32_t tv,
                       const uint8_t *V, size_t v_rb, const int32_t *blocks, int64_t block_rows, float scale, float cap,
                       bool acc16, float *out, float *scratch);

/* One head of an f16 cache (rows ldkv halves apart); cap > 0: scores soft-capped as ggml does. */
static inline void tn_attn1(int64_t hd, int64_t T, const float *q, const uint16_t *K, const uint16_t *V, int64_t ldkv,
                            const int32_t *blocks, int64_t block_rows, float scale, float cap, bool acc16, float *out,
                            float *scratch) {
    tn_attn1_q(hd, T, q, TN_F16, (const uint8_t *)K, (size_t)ldkv * 2, TN_F16, (const uint8_t *)V, (size_t)ldkv * 2, blocks,
               block_rows, scale, cap, acc16, out, scratch);
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

/* Dequantizes the hd values of a K / V row of type t starting at p (whole blocks). */
static void tn_kv_row_to_f32(int32_t t, const void *p, float *y, int64_t hd) {
    if (t == TN_Q8_0) tn_dequantize_row_q8_0(p, y, hd);
    else if (t == TN_Q4_0) tn_dequantize_row_q4_0(p, y, hd);
    else if (tn_tq_is((uint32_t)t)) {
        tn_tq_params tp;
        tn_tq_params_of((uint32_t)t, &tp);
        tn_tq_dequantize_row(&tp, p, y, hd);
    } else
        for (int64_t i = 0; i < hd; i++) y[i] = tn_fp16_to_fp32(((const uint16_t *)p)[i]);
}

/* One key of the online softmax: its raw score s (q . K_t) scaled (and soft-capped), the running
 * maximum M and sum S updated, acc rescaled and V_t (hd values of type tv at v) added; with vacc16
 * the accumulator is rounded to f16 after every scale and update. */
static inline void tn_attn_step(int64_t hd, float s, float scale, float cap, int32_t tv, const uint8_t *v, bool vacc16,
                                float *acc, float *M, float *S) {
    s *= scale;
    if (cap > 0) s = cap * tanhf(s);
    float ms = 1.0f, vs = 1.0f;
    if (s > *M) { /* new maximum: rescale what was accumulated */
        const float Mold = *M;
        *M = s;
        ms = expf(Mold - *M);
        for (int64_t i = 0; i < hd; i++) {
            acc[i] *= ms;
            if (vacc16) acc[i] = tn_fp16_to_fp32(tn_fp32_to_fp16(acc[i]));
        }
    } else {
        vs = expf(s - *M);
    }
    for (int64_t i0 = 0; i0 < hd; i0 += 32) {
        float vb[32];
        const size_t off = tv == TN_F16 ? (size_t)i0 * 2 : tn_kv_head_off(tv, 32, i0 / 32); /* whole blocks of 32 */
        const int64_t n = hd - i0 < 32 ? hd - i0 : 32; /* f16 V may have a tail */
        tn_kv_row_to_f32(tv, v + off, vb, n);
        for (int64_t i = 0; i < n; i++) {
            acc[i0 + i] = fmaf(vb[i], vs, acc[i0 + i]);
            if (vacc16) acc[i0 + i] = tn_fp16_to_fp32(tn_fp32_to_fp16(acc[i0 + i]));
        }
    }
    *S = *S * ms + vs;
}

/* One head (contract: kern.h tn_attn_q_fn; f16 K and V: tn_attn_fn's arithmetic step by step: the dot
 * product summed in order, the f16 accumulator rounded after every scale and update). scratch: 2 * hd
 * floats; the V row is converted 32 values at a time on the stack. */
static void tn_attn1_q(int64_t hd, int64_t T, const float *q, int32_t tk, const uint8_t *K, size_t k_rb, int32_t tv,
                       const uint8_t *V, size_t v_rb, const int32_t *blocks, int64_t block_rows, float scale, float cap,
                       bool acc16, float *out, float *scratch) {
    float *qv = scratch;       /* K f16: q as used in the dot products; K quantized: q as q8_0 blocks */
    float *acc = scratch + hd; /* V accumulator (f16-representable with acc16 and f16 V) */
    const bool vacc16 = acc16 && tv == TN_F16;
    if (tk == TN_F16)
        for (int64_t i = 0; i < hd; i++) qv[i] = acc16 ? tn_fp16_to_fp32(tn_fp32_to_fp16(q[i])) : q[i];
    else
        tn_quantize_row_q8_0_act(q, (block_q8_0 *)qv, hd); /* hd / 32 * 34 bytes <= hd floats */
    for (int64_t i = 0; i < hd; i++) acc[i] = 0.0f;
    float M = -INFINITY, S = 0.0f;
    for (int64_t t = 0; t < T; t++) {
        const int64_t row = tn_kv_row(blocks, block_rows, t);
        const uint8_t *k = K + (size_t)row * k_rb, *v = V + (size_t)row * v_rb;
        float s = 0.0f;
        if (tk == TN_Q8_0) tn_k_vec_dot_q8_0_q8_0__scalar(hd, &s, k, qv);
        else if (tk == TN_Q4_0) tn_k_vec_dot_q4_0_q8_0__scalar(hd, &s, k, qv);
        else if (tn_tq_is((uint32_t)tk)) { /* per 32: d_q (d_K sum(c q) + m_K sum(q)), in order */
            tn_tq_params tp;
            tn_tq_params_of((uint32_t)tk, &tp);
            s = tn_tq_vec_dot_ref(&tp, hd, k, (const block_q8_0 *)qv);
        } else
            for (int64_t i = 0; i < hd; i++) s += tn_fp16_to_fp32(((const uint16_t *)k)[i]) * qv[i];
        tn_attn_step(hd, s, scale, cap, tv, v, vacc16, acc, &M, &S);
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int64_t i = 0; i < hd; i++) out[i] = acc[i] * inv;
}


void tn_k_attn_q__scalar(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, int32_t tk, const void *K,
                         size_t k_rb, int32_t tv, const void *V, size_t v_rb, const int32_t *blocks, int64_t block_rows,
                         float scale, float cap, bool acc16, float *out, float *scratch) {
    for (int64_t j = 0; j < nh; j++)
        tn_attn1_q(hd, T, q + j * hd, tk, (const uint8_t *)K + tn_kv_head_off(tk, hd, j / rep), k_rb, tv,
                   (const uint8_t *)V + tn_kv_head_off(tv, hd, j / rep), v_rb, blocks, block_rows,
                   cap > 0 ? scale / cap : scale, cap, acc16, out + j * hd, scratch + 2 * hd * j);
}

/* One head of a per-channel K cache (contract: kern.h tn_attn_kc_fn): keys of complete groups
 * dequantized (d_c q_tc + m_c, quant/kc.h) and dotted with q in f32, in channel order; the open
 * group's keys from the f16 window as tn_attn1_q's f16 K (q rounded to f16 with acc16); V and the
 * softmax as tn_attn1_q. scratch: 2 * hd floats. */
static void tn_attn1_kc(int64_t hd, int64_t T, const float *q, int kbits, const uint8_t *K, size_t k_rb,
                        const uint16_t *Kw, int64_t ldw, int64_t W, int32_t tv, const uint8_t *V, size_t v_rb,
                        const int32_t *blocks, float scale, float cap, bool acc16, float *out, float *scratch) {
    float *qv = scratch, *acc = scratch + hd;
    const bool vacc16 = acc16 && tv == TN_F16;
    const int64_t Q = T - T % TN_KC_ROWS; /* keys below Q: complete groups */
    for (int64_t i = 0; i < hd; i++) qv[i] = acc16 ? tn_fp16_to_fp32(tn_fp32_to_fp16(q[i])) : q[i], acc[i] = 0.0f;
    float M = -INFINITY, S = 0.0f;
    for (int64_t g = 0; g < Q; g += TN_KC_ROWS) {
        const uint8_t *rows[TN_KC_ROWS];
        for (int r = 0; r < TN_KC_ROWS; r++) rows[r] = K + (size_t)tn_kv_row(blocks, TN_KC_ROWS, g + r) * k_rb;
        float d[TN_KC_MAX_HD], m[TN_KC_MAX_HD];
        for (int64_t j = 0; j < hd / 32; j++) tn_kc_chunk_stats(rows, kbits, j, d + 32 * j, m + 32 * j);
        for (int r = 0; r < TN_KC_ROWS; r++) {
            float s = 0.0f;
            for (int64_t j = 0; j < hd / 32; j++) {
                uint8_t c[32];
                tn_kc_chunk_codes(rows[r], kbits, j, c);
                for (int i = 0; i < 32; i++) s += q[32 * j + i] * (d[32 * j + i] * (float)c[i] + m[32 * j + i]);
            }
            tn_attn_step(hd, s, scale, cap, tv, V + (size_t)tn_kv_row(blocks, TN_KC_ROWS, g + r) * v_rb, vacc16, acc, &M, &S);
        }
    }
    for (int64_t t = Q; t < T; t++) {
        const uint16_t *k = Kw + (size_t)(t % W) * (size_t)ldw;
        float s = 0.0f;
        for (int64_t i = 0; i < hd; i++) s += tn_fp16_to_fp32(k[i]) * qv[i];
        tn_attn_step(hd, s, scale, cap, tv, V + (size_t)tn_kv_row(blocks, TN_KC_ROWS, t) * v_rb, vacc16, acc, &M, &S);
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int64_t i = 0; i < hd; i++) out[i] = acc[i] * inv;
}

void tn_k_attn_kc__scalar(int64_t hd, int64_t T, int64_t nh, int64_t rep, const float *q, int kbits, const void *K,
                          size_t k_rb, const uint16_t *Kw, int64_t ldw, int64_t W, int32_t tv, const void *V, size_t v_rb,
                          const int32_t *blocks, float scale, float cap, bool acc16, float *out, float *scratch) {
    for (int64_t j = 0; j < nh; j++)
        tn_attn1_kc(hd, T, q + j * hd, kbits, (const uint8_t *)K + tn_kc_row_bytes(kbits, (j / rep) * hd), k_rb,
                    Kw + (j / rep) * hd, ldw, W, tv, (const uint8_t *)V + tn_kv_head_off(tv, hd, j / rep), v_rb, blocks,
                    cap > 0 ? scale / cap : scale, cap, acc16, out + j * hd, scratch + 2 * hd * j);
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
    t->attn_q = tn_k_attn_q__scalar;
    t->attn_q_isa = TN_ISA_SCALAR;
    t->attn_kc = tn_k_attn_kc__scalar;
    t->swiglu = tn_k_swiglu__scalar;
    t->swiglu_isa = TN_ISA_SCALAR;
    t->geglu = tn_k_geglu__scalar;
    t->geglu_isa = TN_ISA_SCALAR;
}
