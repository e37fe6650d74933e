/*
 * ctx.h — inference context: KV cache, planned scratch buffers, thread pool. Everything a
 * decode step touches is allocated at creation, so decoding allocates nothing.
 *
 * KV cache layout per layer (f16 by default, like llama.cpp's default cache type; or q8_0 / q4_0,
 * tern_ctx_params type_k / type_v, llama.cpp's --cache-type-k/-v):
 *   K, V: [n_ctx][n_head_kv * head_dim]      one row per position (head h at h*head_dim); a row
 *   (multi-head latent attention: K rows [n_ctx][kv_lora_rank + n_rot], the normed latent and
 *   the roped shared key of each position; no V rows: the values are the K rows' latent part)
 *                                            of type_k is k_rb bytes (ggml's blocks of 32 values
 *                                            for q8_0 / q4_0, so head_dim % 32 == 0 there)
 */
#ifndef TN_MODEL_CTX_H
#define TN_MODEL_CTX_H

#include <stdatomic.h>
#include <string.h>

#include "core/fp16.h"
#include "core/pool.h"
#include "kern/kern.h"
#include "model/model.h"

/* Paged KV cache: rows are grouped in blocks of TN_KV_BLOCK positions; a sequence's block table
 * maps its block j (positions j*B .. j*B+B-1) to a block of the cache. The single-sequence API
 * uses the identity table (a contiguous cache). */
#define TN_KV_BLOCK 16

/* Tail-chunk counters of one-token matmuls per layer (blocks.c): q, k, v, o, gate and up, down. */
#define TN_MM_PER_LAYER 6

/* A batch for continuous batching: token t belongs to sequence seq[t] at position pos[t]. */
typedef struct tn_batch {
    int32_t n;
    const tern_token *tok;
    const int32_t *seq;
    const int32_t *pos;
    const int8_t *logits; /* nonzero: compute logits for this token */
} tn_batch;

/* Where an activation observer is called: the matmuls reading one input. */
typedef enum tn_obs_site {
    TN_OBS_ATTN_IN,   /* wq, wk, wv   (x = normed residual, ne0 = n_embd)          */
    TN_OBS_ATTN_OUT,  /* wo           (x = attention output, ne0 = n_head * head_dim) */
    TN_OBS_FFN_IN,    /* w_gate, w_up (x = normed residual, ne0 = n_embd)          */
    TN_OBS_FFN_DOWN,  /* w_down       (x = silu(gate) * up, ne0 = n_ff)            */
    TN_OBS_OUTPUT,    /* output       (x = final normed rows wanting logits; il = n_layer) */
} tn_obs_site;

struct tern_ctx {
    const tern_model *model;
    tn_hparams hp;
    int32_t n_ctx, n_batch, n_threads;
    bool logits_all;
    tn_pool *pool;
    const tn_kern_table *kt;
    int32_t n_past;

    uint8_t *k_cache, *v_cache; /* per layer (at row kv_off[il]) [rows][kv_dim] each, rows of  */
    int32_t type_k, type_v;     /* TN_F16, TN_Q8_0, TN_Q4_0 or a tq<b>g32a id (TERN_KV_TQ(b))   */
    size_t k_rb, v_rb;          /* bytes of one K / V row (kv_dim values of type_k / type_v)   */
    bool rot_k, rot_v;          /* K (and Q) / V (and the attention output) rotated per head   */
    int32_t rot_blk;            /* the rotation's Hadamard block (a power of 2 dividing hd)    */
    float *rot_sign;            /* [head_dim] its random signs (+-1)                           */
    int32_t kc_bits;            /* > 0: K per channel (type_k TN_TQC<b>, quant/kc.h) of b bits; the
                                   keys of a group (16 positions) are quantized when it completes */
    int64_t kc_w;               /* rows of each layer's f16 window: position p at row p % kc_w  */
    int32_t kc_nseq;            /* windows: one per sequence (batch seq ids 0 .. kc_nseq - 1)    */
    uint16_t *kc_win;           /* [kc_nseq][n_layer][kc_w][kv_dim] K of the newest positions, f16 */
    float *kc_x;                /* [n_threads][TN_KV_BLOCK * kv_dim] a group's keys as floats    */
    int64_t kv_rows;            /* rows per layer = kv_blocks * TN_KV_BLOCK >= n_ctx         */
    int64_t kv_ring;            /* > 0: sliding-window layers keep kv_ring rows, position p
                                   at row p % kv_ring (window + batch; contiguous cache only) */
    int64_t *kv_off;            /* [n_layer] first row of each layer in k/v_cache            */
    int32_t kv_swa_blocks;      /* > 0: a paged cache (tern serve) whose sliding-window layers
                                   keep their own pool of kv_swa_blocks blocks, addressed by the
                                   swa_tables of tn_forward_batch (tn_ctx_create_paged)        */
    uint64_t kv_bytes;          /* of k_cache and v_cache together                           */
    int32_t kv_blocks;
    int32_t *b_seq, *b_pos, *out_rows; /* [n_batch] batch bookkeeping                         */
    int8_t *b_logits;

    /* scratch for one batch of up to n_batch tokens                                         */
    float *x;       /* [n_batch][n_embd]   residual stream                                   */
    float *xb;      /* [n_batch][n_embd]   normed input of a sub-layer                      */
    float *q;       /* [n_batch][n_head * head_dim]  queries                                 */
    float *kv;      /* [n_batch][2 * kv_dim]  k then v per token                              */
    float *att;     /* [n_batch][n_head * head_dim]  attention output                        */
    /* multi-head latent attention (NULL elsewhere); L = kv_lora_rank + n_rot, a cache row     */
    float *mla_q;   /* [n_batch][n_head][L] q_nope absorbed into latent space | roped q_pe     */
    float *mla_o;   /* [n_batch][n_head][L] attention over the cached rows (first kv_lora_rank) */
    float *mla_a;   /* [n_batch][max(q_lora_rank, L)] q's low-rank rows; the token's [c | k_pe] */
    float *hb;      /* [n_batch][n_ff]     gate (MoE: [n_batch * n_expert_used][n_ff_exp])       */
    float *hb2;     /* [n_batch][n_ff]     up   (likewise)                                        */
    /* mixture of experts (NULL in a dense model): the routing of a batch and its rows grouped by
     * expert (blocks.c tn_blk_moe); a "routed row" is one (token, slot) pair, n * n_expert_used
     * of them                                                                                   */
    float *moe_logits;   /* [n_batch][n_expert]   router logits, then softmax probabilities       */
    int32_t *moe_sel;    /* [n_batch][n_expert_used] chosen experts, best first                   */
    float *moe_w;        /* [n_batch][n_expert_used] their weights                                */
    int32_t *moe_off;    /* [n_expert + 1] first grouped row of each expert                       */
    int32_t *moe_tok;    /* [n_batch * n_expert_used] token of grouped row r                      */
    int32_t *moe_row;    /* [n_batch][n_expert_used] grouped row of (token, slot)                  */
    float *moe_x;        /* [n_batch * n_expert_used][n_embd] gathered inputs, then expert outputs */
    /* expert usage since the context was created (tern bench; NULL in a dense model): counted by
     * thread 0 while it groups a batch's routed rows (tn_blk_moe, between its existing barriers:
     * no atomics), on the CPU path only. A reader zeroes or snapshots them between passes. */
    uint64_t *moe_count;   /* [n_layer][n_expert] routed rows each expert received           */
    uint64_t *moe_touched; /* [n_layer] distinct experts run per pass, summed over passes     */
    uint64_t *moe_passes;  /* [n_layer] passes through the layer's experts                    */
    uint64_t *moe_tokens;  /* [n_layer] tokens routed through the layer                       */
    uint64_t moe_rows, moe_rows_hot; /* routed rows, and those whose expert was hot (tier.c)       */
    uint64_t tier_last;    /* hot experts: the first MoE layer's moe_tokens at the last promotion  */
    int32_t tier_rounds;   /* promotions tried by this context                                       */
    float *tmp;     /* [n_batch][max(n_embd, ...)] sub-layer output before the residual add  */
    const float *rope_ff; /* RoPE frequency factors of this context (tn_model_rope_factors), or NULL */
    float *rope_cs; /* [n_batch][n_rot]    cos, sin pairs per token                          */
    float *rope_cs_swa; /* [n_batch][n_rot] the same for sliding-window layers (NULL: none) */
    uint8_t *swa_kv;    /* [n_threads] n_swa K rows then n_swa V rows: a paged window gathered (NULL: none) */
    void *xq;       /* activations quantized for the widest matmul                           */
    /* one-token batches: threads 1..n_threads-1 norm and quantize the token for themselves (no
     * barrier between a norm, its quantization and the matmul; thread 0 uses xb and xq) */
    float *pxb;     /* [n_threads - 1][n_embd]                                                 */
    void *pxq;      /* [n_threads - 1][pxq_stride]                                             */
    size_t pxq_stride;
    atomic_int *mm_next; /* [TN_MM_PER_LAYER n_layer + 1] one-token matmuls: next tail chunk (tn_matmul_share) */
    float *scores;  /* [n_threads][scores_stride] per-thread attention scratch               */
    int64_t scores_stride;
    float *logits;  /* [n_logits][n_vocab]                                                     */
    int32_t n_logits_cap, n_logits;
    uint64_t bytes;  /* total bytes allocated (reported by tern info/bench)                  */
    /* Partial forward (tern quantize's sensitivity probes): when start_layer > 0 the pass skips
     * the embedding and layers 0 .. start_layer - 1 and takes the residual stream entering layer
     * start_layer from start_x[n][n_embd] (batch order; start_layer = n_layer: straight to the
     * final norm). Layers below it write no KV. 0 (the default): the whole pass. */
    int32_t start_layer;
    const float *start_x;
    /* Test hook: called by thread 0 after each layer with the residual stream x[n][n_embd]
     * (il = n_layer for the final normed rows). Must not modify anything. */
    void (*debug_layer)(void *user, int32_t il, const float *x, int32_t n, int32_t n_embd);
    void *debug_user;
    /* Activation observer (tern imatrix): when set, thread 0 calls it with the f32 input rows
     * x[n][ne0] of each group of matmuls that share an input, after the barrier that completes
     * them and before the matmuls run (other threads may be reading x meanwhile; the observer
     * must only read). NULL (the default) costs one predictable branch per group. */
    void (*observe)(void *user, int32_t il, tn_obs_site site, const float *x, int32_t n, int32_t ne0);
    void *observe_user;
    /* The same for the experts of a MoE layer (tn_blk_moe, thread 0): per expert e with routed
     * rows, its n input rows x[rows[i]][ne0] (rows NULL: x[0..n)) — TN_OBS_FFN_IN: the normed
     * tokens routed to e (gate and up), TN_OBS_FFN_DOWN: e's silu(gate) * up rows. */
    void (*observe_moe)(void *user, int32_t il, tn_obs_site site, int32_t e, const float *x, const int32_t *rows,
                        int32_t n, int32_t ne0);
    /* device = TERN_DEVICE_CUDA: the GPU side (src/cuda/cuda.h), which runs tn_forward_batch;
     * dev_status: the first error a forward pass on it met (tern_decode returns it) */
    struct tn_cuda_ctx *cuda;
    tern_status dev_status;
    /* LoRA adapters (model/lora.h; tern_ctx_set_lora), CPU only: the pairs of each matmul site
     * [(n_layer + 1) * TN_LORA_PER_LAYER] (NULL: no adapters, the blocks skip them), and the A x
     * rows: [slots][n_batch][lora_r_max] shared, then from lora_own_off per thread [slots][r_max] */
    struct tn_lora_site *lora_sites;
    struct tn_lora_use *lora_uses;
    float *lora_t;
    int64_t lora_r_max, lora_own_off;
};

/* Zeroes the expert usage counters (no-op in a dense model). */
static inline void tn_ctx_moe_usage_reset(tern_ctx *c) {
    if (!c->moe_count) return;
    const size_t nl = (size_t)c->hp.n_layer;
    memset(c->moe_count, 0, nl * (size_t)c->hp.n_expert * sizeof(uint64_t));
    memset(c->moe_touched, 0, nl * sizeof(uint64_t));
    memset(c->moe_passes, 0, nl * sizeof(uint64_t));
    memset(c->moe_tokens, 0, nl * sizeof(uint64_t));
    c->moe_rows = c->moe_rows_hot = 0;
}

/* Hot experts: promotes the most used ones when this context's counters have grown enough since
 * the last promotion (tier.c); nothing without a budget. After each CPU forward pass (every path:
 * tern_decode, speculative verification, serve's engine steps). */
void tn_tier_update(tern_ctx *c);

/* One forward pass over n tokens at positions n_past..; writes KV and logits (last token, or
 * every token if logits_all). n <= n_batch and n_past + n <= n_ctx are the caller's duty. */
void tn_forward(tern_ctx *c, const tern_token *toks, int32_t n);

/* A forward pass over a batch mixing sequences (continuous batching). Every token's (seq, pos)
 * must have a block in tables[seq] (each table covers positions 0..pos); K/V of each token go to
 * its row. Logits of the flagged tokens land in c->logits rows in batch order (c->n_logits).
 * Caller's duty: n <= n_batch, flagged tokens <= n_logits_cap, tokens in vocabulary, and no two
 * tokens writing the same row. tables == NULL means one contiguous sequence. On a context with
 * kv_swa_blocks, the sliding-window layers read and write through swa_tables[seq] instead (blocks
 * of their own pool; each table must cover the window n_swa - 1 positions before a token up to
 * it: blocks further back may be gone); else swa_tables is ignored (NULL). */
void tn_forward_batch(tern_ctx *c, const tn_batch *b, const int32_t *const *tables, const int32_t *const *swa_tables);
/* The same pass on the CPU alone, whatever the context's device (the CUDA backend runs the layers
 * it does not hold through it). */
void tn_forward_batch_cpu(tern_ctx *c, const tn_batch *b, const int32_t *const *tables, const int32_t *const *swa_tables);

/* tern_ctx_create for a paged cache (tern serve) on a model with sliding-window layers: those
 * layers get a pool of swa_blocks blocks of their own (their windows, not whole sequences), the
 * global layers kv_blocks as usual. swa_blocks <= 0, or not smaller than kv_blocks, or a model
 * without sliding-window layers: the same as tern_ctx_create with swa_full. */
tern_status tn_ctx_create_paged(const tern_model *m, const tern_ctx_params *p, int32_t swa_blocks, tern_ctx **out);
/* The same with n_seq sequences (batch seq ids 0 .. n_seq - 1): a per-channel K cache (tqc) keeps
 * an f16 window per sequence; other types ignore n_seq. */
tern_status tn_ctx_create_paged_seqs(const tern_model *m, const tern_ctx_params *p, int32_t swa_blocks, int32_t n_seq,
                                     tern_ctx **out);

/* The f16 window rows of sequence seq, layer il (per-channel K; position p at row p % kc_w). */
static inline uint16_t *tn_kc_win(const tern_ctx *c, int32_t seq, int32_t il) {
    return c->kc_win + ((size_t)seq * (size_t)c->hp.n_layer + (size_t)il) * (size_t)c->kc_w * (size_t)c->hp.n_head_kv *
                           (size_t)c->hp.head_dim;
}

#endif
