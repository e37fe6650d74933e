/*
 * ctx.h — inference context: KV cache, planned scratch buffers, thread pool. Everything a
 * decode step touches is allocated at creation, so decoding allocates nothing.
 *
 * KV cache layout per layer (f16, like llama.cpp's default cache type):
 *   K, V: [n_ctx][n_head_kv * head_dim]      one row per position (head h at h*head_dim)
 */
#ifndef TN_MODEL_CTX_H
#define TN_MODEL_CTX_H

#include "core/fp16.h"
#include "core/pool.h"
#include "kern/kern.h"
#include "model/model.h"

struct tern_ctx {
    const tern_model *model;
    tn_hparams hp;
    int32_t n_ctx, n_batch, n_threads;
    bool logits_all;
    tn_pool *pool;
    const tn_kern_table *kt;
    int32_t n_past;

    tn_fp16 *k_cache, *v_cache; /* n_layer * n_ctx * kv_dim each                            */

    /* scratch for one batch of up to n_batch tokens                                         */
    float *x;       /* [n_batch][n_embd]   residual stream                                   */
    float *xb;      /* [n_batch][n_embd]   normed input of a sub-layer                      */
    float *q;       /* [n_batch][n_embd]                                                     */
    float *kv;      /* [n_batch][2 * kv_dim]  k then v per token                              */
    float *att;     /* [n_batch][n_embd]   attention output                                  */
    float *hb;      /* [n_batch][n_ff]     gate                                               */
    float *hb2;     /* [n_batch][n_ff]     up                                                 */
    float *tmp;     /* [n_batch][max(n_embd, ...)] sub-layer output before the residual add  */
    float *rope_cs; /* [n_batch][n_rot]    cos, sin pairs per token                          */
    void *xq;       /* activations quantized for the widest matmul                           */
    float *scores;  /* [n_threads][scores_stride] per-thread attention scratch               */
    int64_t scores_stride;
    float *logits;  /* [n_logits][n_vocab]                                                     */
    int32_t n_logits_cap, n_logits;
    uint64_t bytes;  /* total bytes allocated (reported by tern info/bench)                  */
    /* Test hook: called by thread 0 after each layer with the residual stream x[n][n_embd]
     * (il = n_layer for the final normed rows). Must not modify anything. */
    void (*debug_layer)(void *user, int32_t il, const float *x, int32_t n, int32_t n_embd);
    void *debug_user;
};

/* One forward pass over n tokens at positions n_past..; writes KV and logits (last token, or
 * every token if logits_all). n <= n_batch and n_past + n <= n_ctx are the caller's duty. */
void tn_forward(tern_ctx *c, const tern_token *toks, int32_t n);

#endif
