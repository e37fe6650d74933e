/*
 * ops.h — the per-row math of the Llama block, shared by inference (forward.c) and training
 * (src/train/, which stores activations around these same calls and mirrors them backward).
 * f32 in/out; numerics follow ggml's CPU ops (sums of squares in double, expf-based SiLU).
 */
#ifndef TN_MODEL_OPS_H
#define TN_MODEL_OPS_H

#include "model/model.h"

/* y = x / sqrt(mean(x^2) + eps) * w   (one row of d; y may alias x). */
void tn_op_rmsnorm(const float *x, float *y, const float *w, int64_t d, float eps);
/* cos/sin pairs for position pos: cs[2i] = m cos(theta_i), cs[2i+1] = m sin(theta_i), i < n_rot/2,
 * theta_i = freq_scale * pos * base^(-2i/n_rot) / freq_factor_i, m = rope_attn_factor (1 when 0)
 * (ggml_rope_cache_init with its mscale). With YaRN (yarn_ext_factor > 0) theta_i mixes the
 * interpolated angle with the unscaled one, the mix ramping from 1 below YaRN's low correction dim to
 * 0 above its high one (times ext_factor), and m is multiplied by 1 + 0.1 ln(1 / freq_scale)
 * (ggml's rope_yarn). */
void tn_op_rope_cache(const tn_hparams *hp, const float *freq_factors, int64_t pos, float *cs);
/* gpt-oss's clamped SwiGLU in place (ggml_swiglu_oai, alpha 1.702, limit 7): x = min(g, 7),
 * y = clamp(u, -7, 7), g = x / (1 + exp(-1.702 x)) * (y + 1), i < n. */
void tn_op_swiglu_oai(float *g, const float *u, int64_t n);
/* PLM's ungated activation in place (ggml_relu then ggml_sqr): x = max(x, 0)^2, i < n. */
void tn_op_relu_sqr(float *x, int64_t n);
/* Rotates the first n_rot dims of each of n_heads heads (head_dim apart) in place; sign = +1
 * forward, -1 applies the inverse rotation (the backward pass of RoPE). */
void tn_op_rope(const tn_hparams *hp, float *v, int32_t n_heads, const float *cs, float sign);
/* log(sum_i exp(l[i])) of n logits, llama-perplexity's way (float max, double sum of expf), so
 * perplexity, KL divergence and logprobs agree with it; *imax (if not NULL) = the first argmax. */
double tn_op_logsumexp(const float *l, int64_t n, int64_t *imax);

#endif
