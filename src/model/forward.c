/*
 * forward.c — the forward pass of the llama-style families (llama, qwen2, qwen3: model/arch/) for a
 * batch of tokens (prefill or one-token decode). Optional steps follow the layer's tensors: q/k/v
 * biases, per-head q/k RMSNorm; query rows are n_head * head_dim long.
 *
 * Every thread of the pool runs tn_forward_task; each step splits its work by (ith, nth) and is
 * followed by a barrier, like a ggml graph computed in order. Numerics follow llama.cpp's CPU
 * path (flash attention, its default) so greedy outputs agree: activations are quantized to the
 * weight's vec_dot_type, RMSNorm sums in double, K and V are cached in f16, attention is an
 * online softmax (kern.h tn_attn_fn) with f16 accumulation for small batches.
 */
#include <math.h>
#include <string.h>

#include "cuda/cuda.h"
#include "kern/matmul.h"
#include "model/ctx.h"
#include "model/ops.h"

typedef struct {
    tern_ctx *c;
    const tn_batch *b;
    const int32_t *const *tables; /* per sequence block table, NULL = contiguous cache */
    int32_t n_out;                /* tokens that want logits                            */
    int32_t *out_rows;            /* their batch indices                                */
} tn_fwd;

/* y = x / rms(x) * w  for rows [r0, r1) */
static void tn_rmsnorm_rows(const float *x, float *y, const float *w, int64_t d, float eps, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) tn_op_rmsnorm(x + r * d, y + r * d, w, d, eps);
}

/* Attention of a token at position pos of a sequence (block table blocks) for query heads
 * h0 .. h0 + nh - 1: nh == 1, or a multiple of the heads per kv head starting on a kv head. */
static void tn_attend(tern_ctx *c, int ith, int32_t il, const int32_t *blocks, int32_t pos, const float *q, int32_t h0,
                      int32_t nh, bool acc16, float *out) {
    const tn_hparams *hp = &c->hp;
    const int32_t hd = hp->head_dim, kv_dim = hp->n_head_kv * hd, rep = hp->n_head / hp->n_head_kv;
    const size_t layer = (size_t)il * c->kv_rows * kv_dim + (size_t)(h0 / rep) * hd;
    c->kt->attn(hd, pos + 1, nh, nh == 1 ? 1 : rep, q, c->k_cache + layer, c->v_cache + layer, kv_dim, blocks,
                TN_KV_BLOCK, 1.0f / sqrtf((float)hd), acc16, out, c->scores + (size_t)ith * c->scores_stride);
}

/* Query heads per attention call: whole kv groups, up to 4 heads (or one group), as long as every
 * thread still gets two calls; else single heads. */
static int32_t tn_attn_unit(const tn_hparams *hp, int32_t n, int nth) {
    const int32_t rep = hp->n_head / hp->n_head_kv;
    int32_t g = 1;
    for (int32_t v = 1; v <= hp->n_head_kv; v++)
        if (hp->n_head_kv % v == 0 && rep * v <= 4) g = v;
    const int32_t G = rep * g;
    return (int64_t)n * (hp->n_head / G) >= 2 * (int64_t)nth ? G : 1;
}

#define TN_PF_MAX (384 << 10) /* bytes of the next matmul prefetched during attention: within L2 */

/* One token (own): the start of thread ith's static share of w (m rows of k;
 * tn_matmul_share_head), at most TN_PF_MAX bytes — what the thread prefetches while it waits at
 * the barrier before that matmul (tn_pool_barrier_pf) or attends before Wo. Batches: nothing. */
typedef struct {
    const uint8_t *p;
    size_t n;
} tn_span;
static tn_span tn_share_span(bool own, const tn_tensor *w, int64_t m, int64_t k, int ith, int nth) {
    if (!own) return (tn_span){NULL, 0};
    int64_t w0, w1;
    tn_matmul_share_head(m, ith, nth, &w0, &w1);
    const size_t rb = tn_dtype_row_size(w->type, k);
    return (tn_span){(const uint8_t *)w->data + (size_t)w0 * rb, TN_MIN((size_t)(w1 - w0) * rb, (size_t)TN_PF_MAX)};
}

static void tn_add_bias_range(float *v, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) v[i] += b[i];
}

/* y[rows r0..r1 of each token] += tmp (the thread's own output rows: no barrier needed before). */
static void tn_residual_add(float *x, const float *tmp, int64_t d, int32_t n, int64_t r0, int64_t r1) {
    for (int32_t j = 0; j < n; j++)
        for (int64_t i = r0; i < r1; i++) x[(int64_t)j * d + i] += tmp[(int64_t)j * d + i];
}

/* The activations of a matmul with weight type wt, quantized. Batches: every thread quantizes its
 * share of the rows into c->xq, then a barrier. One token (own = true): this thread quantizes the
 * whole row into its own buffer xq_own, no barrier (the row is small; every thread would wait
 * for it anyway). */
static const void *tn_act(tern_ctx *c, int ith, int nth, bool own, void *xq_own, tn_dtype wt, const float *x,
                          int64_t ldx, int64_t k, int64_t n) {
    if (!own) {
        tn_matmul_quantize_task(c->pool, ith, nth, c->kt, wt, x, ldx, k, n, c->xq);
        return c->xq;
    }
    c->kt->slot[tn_dtype_get(wt)->vec_dot_type].from_float(x, xq_own, k);
    return xq_own;
}

/* y = W xq (m rows of k) and, if res, res += y on the same rows. Batches: the static split of
 * tn_matmul_compute_task. One token (own): tn_matmul_share's ranges (a static share, then tail
 * chunks claimed from *next), so a thread that is ahead takes more. */
static void tn_mm(tern_ctx *c, int ith, int nth, bool own, atomic_int *next, tn_dtype wt, const void *w, int64_t m,
                  int64_t k, const void *xq, int64_t n, float *y, int64_t ldy, float *res) {
    int64_t r0, r1;
    if (!own) {
        tn_matmul_compute_task(ith, nth, c->kt, wt, w, m, k, xq, n, y, ldy);
        tn_matmul_rows(m, ith, nth, &r0, &r1);
        if (res) tn_residual_add(res, y, m, (int32_t)n, r0, r1);
        return;
    }
    int step = 0;
    while (tn_matmul_share(next, m, ith, nth, &step, &r0, &r1)) {
        tn_matmul_range(c->kt, wt, w, k, xq, 1, y, ldy, r0, r1);
        if (res) tn_residual_add(res, y, m, 1, r0, r1);
    }
}

/* Token t's query heads h0 .. h0 + nh - 1 and kv heads k0 .. k0 + nk - 1: biases, per-head q/k
 * RMSNorm (qwen3), RoPE, and the k, v rows appended to the cache. */
static void tn_prepare_qkv(tern_ctx *c, const tn_layer *L, const tn_fwd *f, int64_t t, int32_t h0, int32_t nh, int32_t k0,
                           int32_t nk, tn_fp16 *Kc, tn_fp16 *Vc) {
    const tn_hparams *hp = &c->hp;
    const tn_batch *b = f->b;
    const int32_t hd = hp->head_dim, kv_dim = hp->n_head_kv * hd;
    const int64_t qd = tn_hp_q_dim(hp);
    float *qt = c->q + t * qd + (int64_t)h0 * hd, *kt_ = c->kv + t * 2 * kv_dim + (int64_t)k0 * hd, *vt = kt_ + kv_dim;
    const int64_t qn = (int64_t)nh * hd, kn = (int64_t)nk * hd;
    const tn_tensor *w = L->w;
    if (w[TN_ROLE_ATTN_Q_B].data) tn_add_bias_range(qt, (const float *)w[TN_ROLE_ATTN_Q_B].data + (int64_t)h0 * hd, qn);
    if (w[TN_ROLE_ATTN_K_B].data) tn_add_bias_range(kt_, (const float *)w[TN_ROLE_ATTN_K_B].data + (int64_t)k0 * hd, kn);
    if (w[TN_ROLE_ATTN_V_B].data) tn_add_bias_range(vt, (const float *)w[TN_ROLE_ATTN_V_B].data + (int64_t)k0 * hd, kn);
    if (w[TN_ROLE_ATTN_Q_NORM].data) tn_rmsnorm_rows(qt, qt, w[TN_ROLE_ATTN_Q_NORM].data, hd, hp->rms_eps, 0, nh);
    if (w[TN_ROLE_ATTN_K_NORM].data) tn_rmsnorm_rows(kt_, kt_, w[TN_ROLE_ATTN_K_NORM].data, hd, hp->rms_eps, 0, nk);
    const float *cs = c->rope_cs + t * hp->n_rot;
    tn_op_rope(hp, qt, nh, cs, 1.0f);
    tn_op_rope(hp, kt_, nk, cs, 1.0f);
    const int64_t row = tn_kv_row(f->tables ? f->tables[b->seq[t]] : NULL, TN_KV_BLOCK, b->pos[t]);
    c->kt->slot[TN_F16].from_float(kt_, Kc + row * kv_dim + (int64_t)k0 * hd, kn);
    c->kt->slot[TN_F16].from_float(vt, Vc + row * kv_dim + (int64_t)k0 * hd, kn);
}

static void tn_forward_task(void *vp, int ith, int nth) {
    tn_fwd *f = vp;
    tern_ctx *c = f->c;
    const tern_model *m = c->model;
    const tn_hparams *hp = &c->hp;
    const tn_kern_table *kt = c->kt;
    tn_pool *pool = c->pool;
    const tn_batch *b = f->b;
    const int32_t n = b->n, d = hp->n_embd, hd = hp->head_dim;
    const int32_t kv_dim = hp->n_head_kv * hd, n_ff = hp->n_ff;
    const int32_t qd = (int32_t)tn_hp_q_dim(hp); /* query / attention-output row: n_head * head_dim */
    int64_t t0, t1, r0, r1;
    tn_split(n, ith, nth, 1, &t0, &t1);
    /* one token: every thread norms and quantizes it for itself (thread 0 into xb / xq, which the
     * observe hooks read), so a sub-layer's norm, quantization and matmuls need no barrier */
    const bool own = n == 1 && nth > 1;
    float *const xb_own = ith ? c->pxb + (size_t)(ith - 1) * (size_t)d : c->xb;
    void *const xq_own = ith ? (uint8_t *)c->pxq + (size_t)(ith - 1) * c->pxq_stride : c->xq;
    float *xb = own ? xb_own : c->xb;
    const int64_t n0 = own ? 0 : t0, n1 = own ? 1 : t1; /* tokens this thread norms */

    /* attention: units of G query heads (tn_attn_unit), this thread's units p0 .. p1 - 1; like
     * llama.cpp, batches of >= 64 tokens with head sizes a multiple of 16 use f32 accumulation,
     * everything else the f16 path */
    const bool acc16 = n < 64 || hd % 16 != 0;
    const int32_t G = tn_attn_unit(hp, n, nth), nu = hp->n_head / G, rep = hp->n_head / hp->n_head_kv;
    int64_t p0, p1;
    tn_split((int64_t)n * nu, ith, nth, 1, &p0, &p1);

    if (own && ith == 0) /* the tail counters of tn_matmul_share, before the first barrier */
        for (int32_t i = 0; i < 6 * hp->n_layer + 1; i++) atomic_store_explicit(&c->mm_next[i], 0, memory_order_relaxed);

    /* embeddings: x[t] = tok_embd[toks[t]] (or, from a later layer, its given input); rope table */
    const int32_t l0 = c->start_layer > 0 && c->start_layer <= hp->n_layer ? c->start_layer : 0;
    for (int64_t t = t0; t < t1; t++) {
        if (l0) memcpy(c->x + t * d, c->start_x + t * d, sizeof(float) * (size_t)d);
        else tn_tensor_get_row(&m->tok_embd, b->tok[t], c->x + t * d);
    }
    for (int64_t t = t0; t < t1; t++) tn_op_rope_cache(hp, m->rope_freqs.data, b->pos[t], c->rope_cs + t * hp->n_rot);
    const tn_span wq_pf = l0 < hp->n_layer ? tn_share_span(own, &m->layers[l0].w[TN_ROLE_ATTN_Q], qd, d, ith, nth)
                                           : (tn_span){NULL, 0};
    tn_pool_barrier_pf(pool, wq_pf.p, wq_pf.n);

    for (int32_t il = l0; il < hp->n_layer; il++) {
        const tn_layer *L = &m->layers[il];
        const tn_tensor *const Wq = &L->w[TN_ROLE_ATTN_Q], *const Wk = &L->w[TN_ROLE_ATTN_K], *const Wv = &L->w[TN_ROLE_ATTN_V];
        const tn_tensor *const Wo = &L->w[TN_ROLE_ATTN_OUT], *const Wg = &L->w[TN_ROLE_FFN_GATE];
        const tn_tensor *const Wu = &L->w[TN_ROLE_FFN_UP], *const Wd = &L->w[TN_ROLE_FFN_DOWN];
        tn_fp16 *Kc = c->k_cache + (size_t)il * c->kv_rows * kv_dim;
        tn_fp16 *Vc = c->v_cache + (size_t)il * c->kv_rows * kv_dim;

        /* ---- attention block ---- */
        tn_rmsnorm_rows(c->x, xb, L->w[TN_ROLE_ATTN_NORM].data, d, hp->rms_eps, n0, n1);
        if (!own) tn_pool_barrier(pool);
        if (c->observe && ith == 0) c->observe(c->observe_user, il, TN_OBS_ATTN_IN, c->xb, n, d);
        /* q = Wq xb ; k,v = Wk xb, Wv xb   (xb quantized once when the types agree) */
        const void *xq = tn_act(c, ith, nth, own, xq_own, Wq->type, xb, d, d, n);
        atomic_int *next = c->mm_next + 6 * il; /* q, k, v, o, gate and up, down */
        tn_mm(c, ith, nth, own, next, Wq->type, Wq->data, qd, d, xq, n, c->q, qd, NULL);
        if (tn_dtype_get(Wk->type)->vec_dot_type != tn_dtype_get(Wq->type)->vec_dot_type) {
            if (!own) tn_pool_barrier(pool);
            xq = tn_act(c, ith, nth, own, xq_own, Wk->type, xb, d, d, n);
        }
        tn_mm(c, ith, nth, own, next + 1, Wk->type, Wk->data, kv_dim, d, xq, n, c->kv, 2 * kv_dim, NULL);
        if (tn_dtype_get(Wv->type)->vec_dot_type != tn_dtype_get(Wk->type)->vec_dot_type) {
            if (!own) tn_pool_barrier(pool);
            xq = tn_act(c, ith, nth, own, xq_own, Wv->type, xb, d, d, n);
        }
        tn_mm(c, ith, nth, own, next + 2, Wv->type, Wv->data, kv_dim, d, xq, n, c->kv + kv_dim, 2 * kv_dim, NULL);
        /* one token: the start of this thread's share of Wo, prefetched while it waits here and
         * (the rest) while it attends — attention reads little memory */
        const tn_span wo_pf = tn_share_span(own, Wo, d, qd, ith, nth);
        tn_pool_barrier_pf(pool, wo_pf.p, wo_pf.n);

        /* attention over (token, query-head group) units */
        /* one token in whole kv groups: a thread's units need only its own heads' RoPE and cache
         * rows, so it prepares them itself and no barrier separates that from the attention */
        const bool own_rope = own && G > 1;
        if (own_rope) {
            for (int64_t p = p0; p < p1; p++) {
                const int32_t h0 = (int32_t)(p % nu) * G, k0 = h0 / rep, nk = G / rep;
                tn_prepare_qkv(c, L, f, 0, h0, G, k0, nk, Kc, Vc);
            }
        } else {
            for (int64_t t = t0; t < t1; t++) tn_prepare_qkv(c, L, f, t, 0, hp->n_head, 0, hp->n_head_kv, Kc, Vc);
            tn_pool_barrier(pool);
        }
        /* one token: attention reads little memory, so meanwhile the start of the thread's static
         * share of Wo (wo_pf) is prefetched into its L2, a slice per unit (lines the barrier wait
         * already fetched hit L2); the matmul then begins from cache instead of a cold stream */
        const uint8_t *pf = p1 > p0 ? wo_pf.p : NULL;
        const size_t pf_n = wo_pf.n;
        for (int64_t p = p0; p < p1; p++) {
            const int32_t t = (int32_t)(p / nu), h0 = (int32_t)(p % nu) * G;
            if (pf) {
                const size_t a = pf_n * (size_t)(p - p0) / (size_t)(p1 - p0), e = pf_n * (size_t)(p + 1 - p0) / (size_t)(p1 - p0);
                for (size_t o = a & ~(size_t)63; o < e; o += 64) __builtin_prefetch(pf + o, 0, 2); /* prefetcht1: into L2 */
            }
            tn_attend(c, ith, il, f->tables ? f->tables[b->seq[t]] : NULL, b->pos[t], c->q + (int64_t)t * qd + (int64_t)h0 * hd,
                      h0, G, acc16, c->att + (int64_t)t * qd + (int64_t)h0 * hd);
        }
        tn_pool_barrier_pf(pool, pf ? NULL : wo_pf.p, wo_pf.n); /* unless attending prefetched it */

        /* x += Wo att */
        if (c->observe && ith == 0) c->observe(c->observe_user, il, TN_OBS_ATTN_OUT, c->att, n, qd);
        xq = tn_act(c, ith, nth, own, xq_own, Wo->type, c->att, qd, qd, n);
        tn_mm(c, ith, nth, own, next + 3, Wo->type, Wo->data, d, qd, xq, n, c->tmp, d, c->x);
        const tn_span gate_pf = tn_share_span(own, Wg, n_ff, d, ith, nth);
        tn_pool_barrier_pf(pool, gate_pf.p, gate_pf.n);

        /* ---- feed-forward block: x += Wdown (silu(Wgate xb) * Wup xb) ---- */
        tn_rmsnorm_rows(c->x, xb, L->w[TN_ROLE_FFN_NORM].data, d, hp->rms_eps, n0, n1);
        if (!own) tn_pool_barrier(pool);
        if (c->observe && ith == 0) c->observe(c->observe_user, il, TN_OBS_FFN_IN, c->xb, n, d);
        xq = tn_act(c, ith, nth, own, xq_own, Wg->type, xb, d, d, n);
        const bool same_vt = tn_dtype_get(Wu->type)->vec_dot_type == tn_dtype_get(Wg->type)->vec_dot_type;
        if (own && same_vt) { /* one token: gate, up and SwiGLU per shared range of rows */
            int step = 0;
            while (tn_matmul_share(next + 4, n_ff, ith, nth, &step, &r0, &r1)) {
                tn_matmul_range(kt, Wg->type, Wg->data, d, xq, 1, c->hb, n_ff, r0, r1);
                tn_matmul_range(kt, Wu->type, Wu->data, d, xq, 1, c->hb2, n_ff, r0, r1);
                kt->swiglu(c->hb + r0, c->hb2 + r0, r1 - r0);
            }
        } else {
            tn_matmul_compute_task(ith, nth, kt, Wg->type, Wg->data, n_ff, d, xq, n, c->hb, n_ff);
            if (!same_vt) {
                if (!own) tn_pool_barrier(pool);
                xq = tn_act(c, ith, nth, own, xq_own, Wu->type, xb, d, d, n);
            }
            tn_matmul_compute_task(ith, nth, kt, Wu->type, Wu->data, n_ff, d, xq, n, c->hb2, n_ff);
            /* SwiGLU on this thread's rows (the rows it just computed for both matrices) */
            tn_matmul_rows(n_ff, ith, nth, &r0, &r1);
            for (int32_t j = 0; j < n; j++)
                kt->swiglu(c->hb + (int64_t)j * n_ff + r0, c->hb2 + (int64_t)j * n_ff + r0, r1 - r0);
        }
        const tn_span down_pf = tn_share_span(own, Wd, d, n_ff, ith, nth);
        tn_pool_barrier_pf(pool, down_pf.p, down_pf.n);
        if (c->observe && ith == 0) c->observe(c->observe_user, il, TN_OBS_FFN_DOWN, c->hb, n, n_ff);
        xq = tn_act(c, ith, nth, own, xq_own, Wd->type, c->hb, n_ff, n_ff, n);
        tn_mm(c, ith, nth, own, next + 5, Wd->type, Wd->data, d, n_ff, xq, n, c->tmp, d, c->x);
        /* the next matmul: the next layer's Wq, or the output projection (if a logit is wanted) */
        const tn_span next_pf = il + 1 < hp->n_layer ? tn_share_span(own, &m->layers[il + 1].w[TN_ROLE_ATTN_Q], qd, d, ith, nth)
                                : f->n_out == 1        ? tn_share_span(own, &m->output, hp->n_vocab, d, ith, nth)
                                                       : (tn_span){NULL, 0};
        tn_pool_barrier_pf(pool, next_pf.p, next_pf.n);
        if (c->debug_layer && ith == 0) c->debug_layer(c->debug_user, il, c->x, n, d);
    }

    /* final norm and logits of the tokens that asked for them (rows gathered in order); one such
     * token: every thread norms and quantizes it for itself, as above */
    const int32_t nl = f->n_out;
    const bool own_out = nl == 1 && nth > 1;
    if (own_out) {
        tn_op_rmsnorm(c->x + (int64_t)f->out_rows[0] * d, xb_own, m->output_norm.data, d, hp->rms_eps);
    } else {
        int64_t l0, l1;
        tn_split(nl, ith, nth, 1, &l0, &l1);
        for (int64_t j = l0; j < l1; j++)
            tn_op_rmsnorm(c->x + (int64_t)f->out_rows[j] * d, c->xb + j * d, m->output_norm.data, d, hp->rms_eps);
        tn_pool_barrier(pool);
    }
    if (c->debug_layer && ith == 0) c->debug_layer(c->debug_user, hp->n_layer, c->xb, nl, d);
    if (nl == 0) return;
    if (c->observe && ith == 0) c->observe(c->observe_user, hp->n_layer, TN_OBS_OUTPUT, c->xb, nl, d);
    const void *xq = tn_act(c, ith, nth, own_out, xq_own, m->output.type, own_out ? xb_own : c->xb, d, d, nl);
    tn_mm(c, ith, nth, own_out && own, c->mm_next + 6 * hp->n_layer, m->output.type, m->output.data, hp->n_vocab, d, xq,
          nl, c->logits, hp->n_vocab, NULL);
}

void tn_forward_batch_cpu(tern_ctx *c, const tn_batch *b, const int32_t *const *tables) {
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
