/*
 * forward.c — the forward pass of the llama-style families (llama, qwen2, qwen3, smollm3, MoE ones:
 * model/arch/) for a batch of tokens (prefill or one-token decode), as a recipe of blocks
 * (blocks.h), in the manner of llama2.c's forward(). Every thread of the pool runs the recipe; the
 * blocks share the work and synchronize underneath. Optional steps follow the layer's tensors
 * (q/k/v biases, per-head q/k RMSNorm, a router: the MoE block instead of the gated FFN) and the
 * family (no RoPE on smollm3's NoPE layers); query rows are n_head * head_dim long.
 */
#include "cuda/cuda.h"
#include "model/blocks.h"

typedef struct {
    tern_ctx *c;
    const tn_batch *b;
    const int32_t *const *tables; /* per sequence block table, NULL = contiguous cache */
    int32_t n_out;                /* tokens that want logits                            */
    int32_t *out_rows;            /* their batch indices                                */
} tn_fwd;

static void tn_forward_task(void *vp, int ith, int nth) {
    const tn_fwd *f = vp;
    tern_ctx *c = f->c;
    const tern_model *m = c->model;
    const int32_t n_layer = c->hp.n_layer;
    tn_thr T;
    const int32_t l0 = tn_blk_begin(&T, c, f->b, f->tables, f->n_out, f->out_rows, ith, nth);

    tn_blk_embed(&T, l0); /* x = tok_embd[tok] (gemma: * sqrt(n_embd))    x [n][n_embd] */
    for (int32_t il = l0; il < n_layer; il++) {
        const tn_layer *L = &m->layers[il];
        const tn_tensor *w = L->w;
        /* attention: x += Wo attention(q, k, v) */
        tn_blk_norm(&T, &w[TN_ROLE_ATTN_NORM], il, TN_OBS_ATTN_IN); /* xb = rmsnorm(x) * attn_norm   */
        tn_blk_qkv(&T, L, il);                                      /* q, k, v = Wq xb, Wk xb, Wv xb  */
        tn_blk_attention(&T, L, il);                                /* att = softmax(q K^T / sqrt(hd)) V,
                                                                     * q, k: bias, q/k norm, rope    */
        const bool moe = tn_layer_moe(L);
        tn_blk_proj_add(&T, &w[TN_ROLE_ATTN_OUT], c->att, il, 3, TN_OBS_ATTN_OUT, &w[TN_ROLE_ATTN_POST_NORM],
                        &w[moe ? TN_ROLE_FFN_GATE_INP : TN_ROLE_FFN_GATE]); /* x += Wo att  (gemma: post-normed) */
        /* feed-forward: x += Wdown (act(Wgate xb) * Wup xb) */
        tn_blk_norm(&T, &w[TN_ROLE_FFN_NORM], il, TN_OBS_FFN_IN);   /* xb = rmsnorm(x) * ffn_norm    */
        if (moe) {                                                  /* x += sum over the top-k experts e
                                                                     * of weight_e * FFN_e(xb)       */
            tn_blk_moe(&T, L, il);
            tn_blk_layer_end(&T, il);
            continue;
        }
        tn_blk_glu(&T, L, il);                                      /* hb = act(Wgate xb) * Wup xb,
                                                                     * act: silu, gemma gelu_tanh    */
        const tn_tensor *next = il + 1 < n_layer ? &m->layers[il + 1].w[TN_ROLE_ATTN_Q] : &m->output;
        tn_blk_proj_add(&T, &w[TN_ROLE_FFN_DOWN], c->hb, il, 5, TN_OBS_FFN_DOWN, &w[TN_ROLE_FFN_POST_NORM],
                        next);                                      /* x += Wdown hb (gemma: post-normed) */
        tn_blk_layer_end(&T, il);
    }
    tn_blk_logits(&T); /* logits = output (rmsnorm(x) * output_norm)      [n_out][n_vocab] */
}

void tn_forward_batch_cpu(tern_ctx *c, const tn_batch *b, const int32_t *const *tables) {
    if (tables && c->kv_ring) { /* a paged cache needs every layer's rows: create it with swa_full */
        if (!c->dev_status)
            c->dev_status = tn_err(TERN_ERR_INTERNAL, "forward: a paged batch on a context whose sliding-window layers keep a ring");
        c->n_logits = 0;
        return;
    }
    tn_fwd f = {c, b, tables, 0, c->out_rows};
    for (int32_t t = 0; t < b->n; t++)
        if (b->logits[t]) c->out_rows[f.n_out++] = t;
    tn_pool_run(c->pool, tn_forward_task, &f);
    c->n_logits = f.n_out;
}

void tn_forward_batch(tern_ctx *c, const tn_batch *b, const int32_t *const *tables) {
    if (c->cuda) {
        tern_status s = tn_cuda_forward_batch(c, b, tables);
        if (s && !c->dev_status) c->dev_status = s;
        if (s) c->n_logits = 0;
        return;
    }
    tn_forward_batch_cpu(c, b, tables);
}

void tn_forward(tern_ctx *c, const tern_token *toks, int32_t n) {
    /* one sequence in a contiguous cache: positions n_past.., logits for all or the last token */
    for (int32_t t = 0; t < n; t++) {
        c->b_seq[t] = 0;
        c->b_pos[t] = c->n_past + t;
        c->b_logits[t] = (int8_t)(c->logits_all || t == n - 1);
    }
    tn_batch b = {n, toks, c->b_seq, c->b_pos, c->b_logits};
    tn_forward_batch(c, &b, NULL);
    c->n_past += n;
}
