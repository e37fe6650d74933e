/*
 * lora.h — LoRA adapters at inference: llama.cpp's GGUF adapter files (general.type "adapter",
 * adapter.type "lora", adapter.lora.alpha; tensors "<base tensor>.lora_a" ne [n_in, r] and
 * "<base tensor>.lora_b" ne [r, n_out]) loaded against a base model, and their sites in a context.
 *
 * A matmul y = W x of a base tensor with pairs (A, B) becomes y = W x + sum s * B (A x), with
 * s = scale * alpha / r (scale alone when alpha is 0 or absent: llama.cpp's get_scale). The blocks
 * (blocks.c) add the terms after the base matmul; a context without adapters (c->lora_sites NULL)
 * pays one NULL check per matmul. A and B are kept as f32 (converted from the file's type at load).
 *
 * Sites: per layer the seven matmuls q, k, v, o, gate, up, down; then the output. A fused base
 * tensor (phi3's attn_qkv, a gate|up ffn_up) gives one pair per slice (B's rows split likewise).
 * Not adapted (refused at load, naming the tensor): token embeddings, routers, experts, norms.
 */
#ifndef TN_MODEL_LORA_H
#define TN_MODEL_LORA_H

#include "model/ctx.h"

enum { TN_LORA_Q = 0, TN_LORA_K, TN_LORA_V, TN_LORA_O, TN_LORA_GATE, TN_LORA_UP, TN_LORA_DOWN, TN_LORA_PER_LAYER };

/* One adapted matmul of one adapter: A [r][k], B [m][r] (row-major f32; B may point into a fused
 * tensor's rows, owned by the adapter). */
typedef struct tn_lora_pair {
    const float *a, *b;
    int32_t r;
    int64_t k, m;
    int32_t site;     /* il * TN_LORA_PER_LAYER + TN_LORA_*, or n_layer * TN_LORA_PER_LAYER: output */
    float ar;         /* alpha / r, or 1 without alpha                                              */
    const char *base; /* the base tensor's file name (owned by the adapter)                         */
    int64_t row0;     /* the slice's first row in it (fused tensors; else 0)                        */
} tn_lora_pair;

/* An adapter's pair as a context uses it: s = user scale * ar. */
typedef struct tn_lora_use {
    const tn_lora_pair *p;
    float s;
} tn_lora_use;

/* The pairs on one site: uses[off .. off + n), their A x values r_sum per token (in use order). */
typedef struct tn_lora_site {
    int32_t off, n, r_sum;
} tn_lora_site;

/* Where the adapters of a matmul get their A x rows: site, rows t (row j at t + j * ld). */
typedef struct tn_lora_op {
    const tn_lora_site *site;
    const float *t;
    int64_t ld;
} tn_lora_op;

/* The site of slot (TN_LORA_*) in layer il (il = n_layer: the output) of context c, or NULL when it
 * has no pairs. */
static inline const tn_lora_site *tn_lora_at(const tern_ctx *c, int32_t il, int slot) {
    if (!c->lora_sites) return NULL;
    const tn_lora_site *s = &c->lora_sites[(int64_t)il * TN_LORA_PER_LAYER + slot];
    return s->n ? s : NULL;
}

/* t[j][...] = A x_j of every pair of the site, j < n (x row j at x + j * ldx). */
void tn_lora_ax(const tern_ctx *c, const tn_lora_site *s, const float *x, int64_t ldx, int64_t j0, int64_t j1,
                float *t, int64_t ldt);
/* y[j][r0 .. r1) += s * B[r0 .. r1) t_j for j < n (y row j at y + j * ldy). */
void tn_lora_add(const tern_ctx *c, const tn_lora_op *op, float *y, int64_t ldy, int64_t n, int64_t r0, int64_t r1);
/* Frees the context's adapter sites and scratch (tern_ctx_free). */
void tn_lora_ctx_clear(tern_ctx *c);

/* Adds s * B A (f64 sums, then f32) to W's rows [m][k] (f32) for every pair of the adapter on the
 * base tensor named name; returns the number of pairs applied (tern export-lora). */
int tn_lora_merge(const tern_lora *a, float scale, const char *name, float *w, int64_t k, int64_t m);

/* Whether the adapter has a pair on the base tensor named name. */
bool tn_lora_adapts(const tern_lora *a, const char *name);

#endif
