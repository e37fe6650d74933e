/*
 * blocks.h — the blocks a forward pass is built of (norm, q/k/v projections, attention, gated
 * FFN, output projection with residual add, logits), each run by every thread of the pool with
 * the threading underneath: row sharing of matmuls, barriers between steps, prefetch of the next
 * matmul's weights while a thread waits or attends, per-thread norming of a single token. A
 * recipe (forward.c) calls them in order on every thread; every block returns when its results
 * are visible to all threads (it ends with a barrier), except where noted.
 *
 * A context with LoRA adapters (model/lora.h) adds each adapted matmul's s * B (A x) to its output
 * rows before anything reads them (residual add, SwiGLU, post norm); without, one NULL check.
 *
 * Buffers (ctx.h): x [n][n_embd] residual stream, xb [n][n_embd] normed input, q [n][q_dim],
 * kv [n][2 kv_dim], att [n][q_dim], hb / hb2 [n][n_ff]; q_dim = n_head * head_dim.
 */
#ifndef TN_MODEL_BLOCKS_H
#define TN_MODEL_BLOCKS_H

#include "model/ctx.h"

/* One thread's view of one pass: the batch, its share of the tokens, and the one-token mode. */
/* Batches of at least this many rows accumulate attention in f32 (head sizes a multiple of 16),
 * smaller ones in f16: a row's result depends on which side of it its batch is (tern serve keeps
 * speculative rows from taking a step across it). */
#define TN_ATTN_F32_ROWS 64

/* Thread ith's attention units p0 .. p1 - 1 of a batch of b->n tokens x nu units each (token t's
 * units t * nu .. t * nu + nu - 1), contiguous, split so that every thread's summed cost
 * (b->pos[t] + 1 keys + TN_ATTN_UNIT_COST per unit) is equal up to one unit's: causal rows grow
 * with their position, and an equal count split left the last thread of a prompt ~3x the work. */
#define TN_ATTN_UNIT_COST 16
void tn_attn_split(const tn_batch *b, int64_t nu, int ith, int nth, int64_t *p0, int64_t *p1);

typedef struct tn_thr {
    tern_ctx *c;
    const tn_batch *b;
    const int32_t *const *tables; /* per sequence block table, NULL = contiguous cache            */
    const int32_t *const *swa_tables; /* sliding-window layers' own (c->kv_swa_blocks), else NULL  */
    int32_t n_out;                /* tokens that want logits, at batch rows out_rows[]            */
    const int32_t *out_rows;
    int ith, nth;
    int32_t n;                    /* tokens in the batch                                          */
    int64_t t0, t1;               /* this thread's tokens (embedding, rope table, per-token steps) */
    /* one token, several threads: every thread norms and quantizes the token for itself (thread
     * 0 into xb / xq, which the observe hooks read), so a norm, its quantization and the matmuls
     * need no barrier between them */
    bool own;
    float *xb;                    /* where this thread's normed rows go (c->xb or its own row)     */
    float *xb_own;                /* its own row (thread 0: c->xb)                                 */
    void *xq_own;                 /* its quantized activations in one-token mode                   */
    int64_t n0, n1;               /* rows this thread norms                                        */
    /* attention in units of G query heads; this thread's units p0 .. p1 - 1 */
    int32_t G;
    int64_t p0, p1;
    bool acc16;                   /* f16 accumulation (batches under TN_ATTN_F32_ROWS, as llama.cpp) */
} tn_thr;

/* One cache row of a context (all kv heads of one position) as f32: the K (kv 0) or V (kv 1)
 * half's type converted (tn_kern_slot to_float) and un-rotated where that half is stored rotated
 * (--kv-rotate), i.e. the values the forward pass computed up to the type's rounding. */
void tn_kv_row_to_f32(const tern_ctx *c, int kv, const uint8_t *row, float *x);
/* The inverse: x (n_head_kv * head_dim values; clobbered: rotated where the half is) written as a
 * row of the half's type exactly as the forward pass writes a new position's K or V. */
void tn_kv_row_from_f32(const tern_ctx *c, int kv, float *x, uint8_t *row);
/* The same for a whole block of TN_KV_BLOCK rows (rb apart; x: [TN_KV_BLOCK][n_head_kv * head_dim]):
 * a per-channel K (tqc) block is one group, dequantized / quantized together; other types row by row. */
void tn_kv_block_to_f32(const tern_ctx *c, int kv, const uint8_t *rows, float *x);
void tn_kv_block_from_f32(const tern_ctx *c, int kv, float *x, uint8_t *rows);
/* Sets up thread ith's view; returns the first layer to run (c->start_layer, or 0). */
int32_t tn_blk_begin(tn_thr *T, tern_ctx *c, const tn_batch *b, const int32_t *const *tables,
                     const int32_t *const *swa_tables, int32_t n_out, const int32_t *out_rows, int ith, int nth);
/* x[t] = tok_embd[tok[t]] (gemma: times sqrt(n_embd); or the given stream entering layer l0),
 * and each token's RoPE tables (global, and sliding-window layers' own). */
void tn_blk_embed(tn_thr *T, int32_t l0);
/* xb = rmsnorm(x) * w; then the activation observer for site (il) sees xb. */
void tn_blk_norm(tn_thr *T, const tn_tensor *w, int32_t il, tn_obs_site site);
/* q = Wq xb, k = Wk xb, v = Wv xb. */
void tn_blk_qkv(tn_thr *T, const tn_layer *L, int32_t il);
/* Per head: biases, q/k RMSNorm (if the layer has them), RoPE (unless a NoPE layer); k, v into the cache; then
 * att = softmax(q K^T / sqrt(head_dim)) V over the sequence's cached positions. */
void tn_blk_attention(tn_thr *T, const tn_layer *L, int32_t il);
/* Multi-head latent attention (deepseek2) in place of tn_blk_qkv + tn_blk_attention: q (direct
 * or low-rank), the latent and shared rope key from attn_kv_a_mqa (normed, roped, cached as one
 * row of kv_lora_rank + n_rot values), q_nope absorbed through attn_k_b per head, attention over
 * the cached rows, attn_v_b per head into att [n][n_head * v_head]. */
void tn_blk_mla(tn_thr *T, const tn_layer *L, int32_t il);
/* hb = silu(Wgate xb) * (Wup xb)  (gemma: gelu_tanh(Wgate xb) * (Wup xb)). */
void tn_blk_glu(tn_thr *T, const tn_layer *L, int32_t il);
/* Not gated (PLM, TN_FFN_RELU_SQR): hb = relu(Wup xb)^2 (no ffn_gate). */
void tn_blk_up_relu_sqr(tn_thr *T, const tn_layer *L, int32_t il);
/* Mixture of experts (the layer has a router): per token, softmax of the router logits, the
 * n_expert_used most probable experts (ties: the lower expert index first), their probabilities
 * as weights (divided by their sum where the family renormalises); then dropless grouped
 * execution: the batch's routed rows grouped by expert, each chosen expert's gate, up and down
 * (2-D slices of the 3-D matrices) multiplied once over its rows by the dense kernels, and per
 * token x += sum over its slots, in slot order, of weight * expert output. A token's arithmetic
 * does not depend on the rest of the batch. */
void tn_blk_moe(tn_thr *T, const tn_layer *L, int32_t il);
/* One token's routing, as tn_blk_moe routes it: its router logits lg[n_expert] (the router's bias
 * added, then overwritten with the probabilities) into the chosen experts sel[n_expert_used] (best
 * first) and their weights w[n_expert_used], by the family's rule (softmax and top-k, weights
 * renormalised where the family does; gpt-oss's softmax over the top-k logits; DeepSeek's groups,
 * sigmoid and bias). The CUDA backend routes with it too. */
void tn_moe_route_token(const tn_hparams *hp, const tn_layer *L, float *lg, int32_t *sel, float *w);
/* The n tokens' routed rows (c->moe_sel) grouped by expert, a counting sort keeping batch order
 * within an expert: expert e's rows moe_off[e] .. moe_off[e + 1] - 1, moe_tok[row] its token,
 * moe_row[t * k + j] the row of token t's slot j; usage counted for tern bench (c->moe_count). */
void tn_moe_group(tern_ctx *c, const tn_layer *L, int32_t il, int32_t n);
/* A layer's shared expert (tn_layer_shexp): hb = silu(Wgate_sh xb) * (Wup_sh xb), then per token
 * x += g * Wdown_sh hb with g = sigmoid(ffn_gate_inp_shexp . xb) (1 without the gate vector).
 * Reads xb as tn_blk_moe left it. At the closing barrier this thread's share of next is prefetched. */
void tn_blk_shexp(tn_thr *T, const tn_layer *L, int32_t il, const tn_tensor *next);
/* x += W in, or x += rmsnorm(W in) * post when post has data (gemma's post norms); in:
 * [n][W->ne[0]], the observer sees it as site; slot numbers the matmul within the layer
 * (tail-chunk counters). At the closing barrier the start of this thread's share of next (the
 * pass's next matmul; NULL: none) is prefetched. */
void tn_blk_proj_add(tn_thr *T, const tn_tensor *W, const float *in, int32_t il, int slot, tn_obs_site site,
                     const tn_tensor *post, const tn_tensor *next);
/* x[t] += b (n_embd floats) for every token (gpt-oss: the attention output's bias). */
void tn_blk_bias_add(tn_thr *T, const float *b);
/* End of layer il: the test hook (c->debug_layer) sees x. */
void tn_blk_layer_end(tn_thr *T, int32_t il);
/* logits of the tokens that asked for them = output(rmsnorm(x) * output_norm), soft-capped if the
 * model says so. */
void tn_blk_logits(tn_thr *T);

#endif
