/*
 * forward.c — the forward pass of the llama-style families (llama, qwen2, qwen3, smollm3, MoE ones:
 * model/arch/) for a batch of tokens (prefill or one-token decode), as a recipe of blocks
 * (blocks.h), in the manner of llama2.c's forward(). Every thread of the pool runs the recipe; the
 * blocks share the work and synchronize underneath. Optional steps follow the layer's tensors
 * (q/k/v biases, per-head q/k RMSNorm, a router: the MoE block instead of the gated FFN) and the
 * family (no RoPE on smollm3's NoPE layers); query rows are n_head * head_dim long.
 */
#include "core/trace.h"
#include "cuda/cuda.h"
#include "model/blocks.h"

typedef struct {
    tern_ctx *c;
    const tn_batch *b;
    const int32_t *const *tables; /* per sequence block table, NULL = contiguous cache */
    const int32_t *const *swa_tables; /* sliding-window layers' (c->kv_swa_blocks), else NULL */
    int32_t n_out;                /* tokens that want logits                            */
    int32_t *out_rows;            /* their batch indices                                */
} tn_fwd;

static void tn_forward_task(void *vp, int ith, int nth) {
    const tn_fwd *f = vp;
    tern_ctx *c = f->c;
    const tern_model *m = c->model;
    const int32_t n_layer = c->hp.n_layer;
    tn_thr T;
    /* trace: forward > embed, layer 0, 1, ..., output, back to back (each ends where the next begins) */
    TN_SPAN_B(TN_TK_FORWARD, "forward", -1, f->b->n, f->n_out, 0, 0);
    TN_SPAN_B(TN_TK_EMBED, "embed", -1, 0, 0, 0, 0);
    const int32_t l0 = tn_blk_begin(&T, c, f->b, f->tables, f->swa_tables, f->n_out, f->out_rows, ith, nth);

    tn_blk_embed(&T, l0); /* x = tok_embd[tok] (gemma: * sqrt(n_embd))    x [n][n_embd] */
    for (int32_t il = l0; il < n_layer; il++) {
        if (il == l0) TN_SPAN_NEXT(TN_TK_EMBED, "embed", -1, TN_TK_LAYER, "layer", il);
        else TN_SPAN_NEXT(TN_TK_LAYER, "layer", il - 1, TN_TK_LAYER, "layer", il);
        const tn_layer *L = &m->layers[il];
        const tn_tensor *w = L->w;
        /* attention: x += Wo attention(q, k, v) */
        tn_blk_norm(&T, &w[TN_ROLE_ATTN_NORM], il, TN_OBS_ATTN_IN); /* xb = rmsnorm(x) * attn_norm   */
        if (c->hp.family->mla) {
            tn_blk_mla(&T, L, il);                                  /* latent attention, att [n][n_head v_head] */
        } else {
            tn_blk_qkv(&T, L, il);                                  /* q, k, v = Wq xb, Wk xb, Wv xb  */
            tn_blk_attention(&T, L, il);                            /* att = softmax(q K^T / sqrt(hd)) V,
                                                                     * q, k: bias, q/k norm, rope    */
        }
        const bool moe = tn_layer_moe(L), ungated = c->hp.ffn == TN_FFN_RELU_SQR;
        tn_blk_proj_add(&T, &w[TN_ROLE_ATTN_OUT], c->att, il, 3, TN_OBS_ATTN_OUT, &w[TN_ROLE_ATTN_POST_NORM],
                        &w[moe ? TN_ROLE_FFN_GATE_INP : ungated ? TN_ROLE_FFN_UP : TN_ROLE_FFN_GATE]); /* x += Wo att  (gemma: post-normed) */
        if (w[TN_ROLE_ATTN_OUT_B].data) tn_blk_bias_add(&T, w[TN_ROLE_ATTN_OUT_B].data); /* gpt-oss: x += bo */
        /* feed-forward: x += Wdown (act(Wgate xb) * Wup xb) */
        tn_blk_norm(&T, &w[TN_ROLE_FFN_NORM], il, TN_OBS_FFN_IN);   /* xb = rmsnorm(x) * ffn_norm    */
        if (moe) {                                                  /* x += sum over the top-k experts e
                                                                     * of weight_e * FFN_e(xb)       */
            tn_blk_moe(&T, L, il);
            if (tn_layer_shexp(L))                                  /* x += g * shared expert(xb)     */
                tn_blk_shexp(&T, L, il, il + 1 < n_layer ? &m->layers[il + 1].w[TN_ROLE_ATTN_Q] : &m->output);
            tn_blk_layer_end(&T, il);
            continue;
        }
        if (ungated) tn_blk_up_relu_sqr(&T, L, il);                 /* PLM: hb = relu(Wup xb)^2      */
        else tn_blk_glu(&T, L, il);                                 /* hb = act(Wgate xb) * Wup xb,
                                                                     * act: silu, gemma gelu_tanh    */
        const tn_tensor *next = il + 1 < n_layer ? &m->layers[il + 1].w[TN_ROLE_ATTN_Q] : &m->output;
        tn_blk_proj_add(&T, &w[TN_ROLE_FFN_DOWN], c->hb, il, 5, TN_OBS_FFN_DOWN, &w[TN_ROLE_FFN_POST_NORM],
                        next);                                      /* x += Wdown hb (gemma: post-normed) */
        tn_blk_layer_end(&T, il);
    }
    if (n_layer > l0) TN_SPAN_NEXT(TN_TK_LAYER, "layer", n_layer - 1, TN_TK_OUTPUT, "output", -1);
    else TN_SPAN_NEXT(TN_TK_EMBED, "embed", -1, TN_TK_OUTPUT, "output", -1);
    tn_blk_logits(&T); /* logits = output (rmsnorm(x) * output_norm)      [n_out][n_vocab] */
    TN_SPAN_E(TN_TK_OUTPUT, "output", -1, 0, 0);
    TN_SPAN_E(TN_TK_FORWARD, "forward", -1, 0, 0);
}

void tn_forward_batch_cpu(tern_ctx *c, const tn_batch *b, const int32_t *const *tables, const int32_t *const *swa_tables) {
    /* a ring is for one contiguous sequence; a pool of window blocks needs their tables */
    if ((tables && c->kv_ring) || (c->kv_swa_blocks && (!tables || !swa_tables))) {
        if (!c->dev_status)
            c->dev_status = tn_err(TERN_ERR_INTERNAL, "forward: %s", c->kv_ring ? "a paged batch on a context whose sliding-window layers keep a ring"
                                                                                  : "a paged sliding-window cache without its block tables");
        c->n_logits = 0;
        return;
    }
    tn_fwd f = {c, b, tables, swa_tables, 0, c->out_rows};
    for (int32_t t = 0; t < b->n; t++)
        if (b->logits[t]) c->out_rows[f.n_out++] = t;
    TN_TRACE_COUNTER("batch_rows", b->n);
    tn_pool_run(c->pool, tn_forward_task, &f);
    c->n_logits = f.n_out;
    if (c->model->tier) tn_tier_update(c); /* between passes: no worker reads a view now */
}

void tn_forward_batch(tern_ctx *c, const tn_batch *b, const int32_t *const *tables, const int32_t *const *swa_tables) {
    if (c->cuda) {
        tern_status s = tn_cuda_forward_batch(c, b, tables, swa_tables);
        if (s && !c->dev_status) c->dev_status = s;
        if (s) c->n_logits = 0;
        return;
    }
    tn_forward_batch_cpu(c, b, tables, swa_tables);
}

void tn_forward(tern_ctx *c, const tern_token *toks, int32_t n) {
    /* one sequence in a contiguous cache: positions n_past.., logits for all or the last token */
    for (int32_t t = 0; t < n; t++) {
        c->b_seq[t] = 0;
        c->b_pos[t] = c->n_past + t;
        c->b_logits[t] = (int8_t)(c->logits_all || t == n - 1);
    }
    tn_batch b = {n, toks, c->b_seq, c->b_pos, c->b_logits};
    tn_forward_batch(c, &b, NULL, NULL);
    c->n_past += n;
}
