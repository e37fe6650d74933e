/*
 * blocks.c — the blocks of a forward pass with their threading (see blocks.h): every thread of the
 * pool runs each block; a block splits its work by (ith, nth) and ends with a barrier, like a ggml
 * graph computed in order. Numerics follow llama.cpp's CPU path (flash attention, its default) so
 * greedy outputs agree: activations are quantized to the weight's vec_dot_type, RMSNorm sums in
 * double, K and V are cached in f16, attention is an online softmax (kern.h tn_attn_fn) with f16
 * accumulation for small batches.
 *
 * One token (decode) on several threads: each thread norms and quantizes the token itself (no
 * barrier between a norm and its matmuls), takes a static share of each matmul's rows and then
 * tail chunks claimed from a counter (tn_matmul_share), and prefetches the start of its share of
 * the next matmul while it waits at a barrier or attends.
 */
#include <math.h>
#include <string.h>

#include "core/trace.h"
#include "kern/matmul.h"
#include "model/blocks.h"
#include "model/lora.h"
#include "model/ops.h"
#include "quant/kc.h"
#include "quant/quant.h"
#include "quant/tq.h"

/* y = x / rms(x) * w  for rows [r0, r1) */
static void tn_rmsnorm_rows(const float *x, float *y, const float *w, int64_t d, float eps, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) tn_op_rmsnorm(x + r * d, y + r * d, w, d, eps);
}

/* Attention of a token at position pos of a sequence (block table blocks) for query heads
 * h0 .. h0 + nh - 1: nh == 1, or a multiple of the heads per kv head starting on a kv head. On a
 * sliding-window layer only the last n_swa positions: of a contiguous cache in place (of its ring
 * unless the window wraps), else gathered first into the thread's window buffer. */
/* gpt-oss's attention sinks: head h's softmax has one more logit, sinks[h], in its denominator,
 * which scales the head's output by S / (S + exp(sinks[h] - M)) = 1 / (1 + exp(sinks[h] - L)) with
 * L = log sum_t exp(s_t) (ggml_soft_max's sinks, its flash attention's S). L is recomputed here
 * from the same scores (a second pass over the heads' K rows, in double), so every attention
 * kernel serves sink layers unchanged. */
static void tn_attend_sinks(const tern_ctx *c, int32_t hd, int64_t T, int32_t nh, int32_t h0, int32_t rep, const float *q,
                            const uint8_t *K, size_t k_rb, const int32_t *blocks, float scale, const float *sinks, float *out,
                            float *kr) {
    const tn_dtype_traits *tk = tn_dtype_get((uint32_t)c->type_k); /* kr: one K head as floats (any cache type) */
    for (int32_t j = 0; j < nh; j++) {
        const float *qj = q + (int64_t)j * hd;
        const size_t kh = (size_t)((h0 + j) / rep) * (size_t)hd / (size_t)tk->blck_size * tk->type_size;
        double mx = -INFINITY, sum = 0; /* an online log-sum-exp */
        for (int64_t t = 0; t < T; t++) {
            c->kt->slot[c->type_k].to_float(K + (size_t)tn_kv_row(blocks, TN_KV_BLOCK, t) * k_rb + kh, kr, hd);
            double dot = 0;
            for (int32_t i = 0; i < hd; i++) dot += (double)qj[i] * kr[i];
            const double sc = dot * scale;
            if (sc > mx) sum = sum * exp(mx - sc) + 1.0, mx = sc;
            else sum += exp(sc - mx);
        }
        const double f = 1.0 / (1.0 + exp((double)sinks[h0 + j] - (mx + log(sum))));
        for (int32_t i = 0; i < hd; i++) out[(int64_t)j * hd + i] *= (float)f;
    }
}

/* The per-head rotation of a quantized cache: R = H D, D the context's random signs and H the
 * normalized Walsh-Hadamard matrix in blocks of rot_blk (block diagonal where the head size is
 * not a power of 2). R is orthogonal, so q . k = Rq . Rk and sum w (R v) = R (sum w v): queries and
 * keys rotated alike leave the scores, and the output rotated back (R^T = D H) the result,
 * unchanged up to rounding, while each head's values are spread over all its channels — a few
 * large channels no longer set every block's scale. */
static void tn_kv_rot(const tern_ctx *c, float *x, int64_t nh, bool inverse) {
    const int32_t hd = c->hp.head_dim, B = c->rot_blk;
    const float s = 1.0f / sqrtf((float)B), *sg = c->rot_sign;
    for (int64_t h = 0; h < nh; h++, x += hd) {
        if (!inverse)
            for (int32_t i = 0; i < hd; i++) x[i] *= sg[i];
        for (int32_t b0 = 0; b0 < hd; b0 += B) {
            float *v = x + b0;
            for (int32_t len = 1; len < B; len <<= 1)
                for (int32_t i = 0; i < B; i += 2 * len)
                    for (int32_t j = i; j < i + len; j++) {
                        const float a = v[j], d = v[j + len];
                        v[j] = a + d, v[j + len] = a - d;
                    }
            for (int32_t i = 0; i < B; i++) v[i] *= s;
        }
        if (inverse)
            for (int32_t i = 0; i < hd; i++) x[i] *= sg[i];
    }
}

static void tn_attend(tern_ctx *c, int ith, int32_t il, const int32_t *blocks, int32_t seq, int32_t pos, const float *q,
                      int32_t h0, int32_t nh, bool acc16, float *out) {
    const tn_hparams *hp = &c->hp;
    const int32_t hd = hp->head_dim, rep = hp->n_head / hp->n_head_kv;
    const size_t k_rb = c->k_rb, v_rb = c->v_rb;
    /* byte offset of the first kv head in a row: its first value's block (head_dim % block == 0) */
    const tn_dtype_traits *tk = tn_dtype_get((uint32_t)c->type_k), *tv = tn_dtype_get((uint32_t)c->type_v);
    const size_t kh = (size_t)((h0 / rep) * hd / tk->blck_size) * tk->type_size;
    const size_t vh = (size_t)((h0 / rep) * hd / tv->blck_size) * tv->type_size;
    const uint8_t *K = c->k_cache + (size_t)c->kv_off[il] * k_rb, *V = c->v_cache + (size_t)c->kv_off[il] * v_rb;
    int64_t T = (int64_t)pos + 1;
    if (tn_hp_layer_swa(hp, il) && T > hp->n_swa) {
        const int64_t start = T - hp->n_swa, ring = c->kv_ring;
        T = hp->n_swa;
        if (!blocks && (!ring || start % ring + T <= ring)) { /* in place (a ring: not wrapped) */
            K += (size_t)(ring ? start % ring : start) * k_rb, V += (size_t)(ring ? start % ring : start) * v_rb;
        } else {
            uint8_t *Kw = c->swa_kv + (size_t)ith * (size_t)T * (k_rb + v_rb), *Vw = Kw + (size_t)T * k_rb;
            for (int64_t t = 0; t < T; t++) {
                const int64_t row = blocks ? tn_kv_row(blocks, TN_KV_BLOCK, start + t) : (start + t) % ring;
                memcpy(Kw + (size_t)t * k_rb, K + (size_t)row * k_rb, k_rb);
                memcpy(Vw + (size_t)t * v_rb, V + (size_t)row * v_rb, v_rb);
            }
            K = Kw, V = Vw, blocks = NULL;
        }
    }
    const float scale = hp->attn_scale > 0 ? hp->attn_scale : 1.0f / sqrtf((float)hd);
    float *scratch = c->scores + (size_t)ith * c->scores_stride;
    const int64_t r = nh == 1 ? 1 : rep;
    if (c->kc_bits) /* per-channel K: complete groups from the cache, the open one from the window */
        c->kt->attn_kc(hd, T, nh, r, q, c->kc_bits, K + kh, k_rb,
                       tn_kc_win(c, seq, il) + (size_t)(h0 / rep) * (size_t)hd,
                       (int64_t)hp->n_head_kv * hd, c->kc_w, c->type_v, V + vh, v_rb, blocks, scale, hp->attn_softcap, acc16, out,
                       scratch);
    else if (c->type_k != TN_F16 || c->type_v != TN_F16) /* a quantized cache: its kernel, soft cap included */
        c->kt->attn_q(hd, T, nh, r, q, c->type_k, K + kh, k_rb, c->type_v, V + vh, v_rb, blocks, TN_KV_BLOCK, scale,
                      hp->attn_softcap, acc16, out, scratch);
    else if (hp->attn_softcap > 0) /* gemma2: scores soft-capped before the softmax */
        c->kt->attn_softcap(hd, T, nh, r, q, (const uint16_t *)(K + kh), (const uint16_t *)(V + vh), k_rb / 2, blocks,
                            TN_KV_BLOCK, scale, hp->attn_softcap, acc16, out, scratch);
    else
        c->kt->attn(hd, T, nh, r, q, (const uint16_t *)(K + kh), (const uint16_t *)(V + vh), k_rb / 2, blocks, TN_KV_BLOCK,
                    scale, acc16, out, scratch);
    const float *sinks = c->model->layers[il].w[TN_ROLE_ATTN_SINKS].data;
    if (sinks) tn_attend_sinks(c, hd, T, nh, h0, rep, q, K, k_rb, blocks, scale, sinks, out, scratch); /* the kernel's
                                                                                   * scratch: 2 hd nh floats, free now */
    if (c->rot_v) tn_kv_rot(c, out, nh, true);
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

/* First attention unit of thread i of nth when a batch's n tokens x nu units per token are split by
 * cost: a unit of the token at position pos attends pos + 1 keys, so an equal split of a prompt
 * gives its last thread about three times the first's work (measured: 1B llama, pp512, 2 threads:
 * the first thread waited 47% of its attention time). Each thread's contiguous range sums to the
 * same cost (pos + 1 + TN_ATTN_UNIT_COST per unit) up to one unit; all in integers, so every
 * thread computes the same boundaries. */
static inline int64_t tn_attn_cost(int32_t pos) { return (int64_t)TN_MAX(pos, 0) + 1 + TN_ATTN_UNIT_COST; }

static int64_t tn_attn_unit_start(const tn_batch *b, int64_t nu, int64_t tot, int i, int nth) {
    if (i <= 0) return 0;
    if (i >= nth) return (int64_t)b->n * nu;
    const int64_t target = tot * i; /* costs are compared times nth */
    int64_t acc = 0;
    for (int32_t t = 0; t < b->n; t++) {
        const int64_t w = tn_attn_cost(b->pos[t]) * nth;
        if (acc + w * nu >= target) return (int64_t)t * nu + (target - acc + w - 1) / w;
        acc += w * nu;
    }
    return (int64_t)b->n * nu;
}

void tn_attn_split(const tn_batch *b, int64_t nu, int ith, int nth, int64_t *p0, int64_t *p1) {
    int64_t tot = 0;
    for (int32_t t = 0; t < b->n; t++) tot += tn_attn_cost(b->pos[t]) * nu;
    *p0 = tn_attn_unit_start(b, nu, tot, ith, nth);
    *p1 = tn_attn_unit_start(b, nu, tot, ith + 1, nth);
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
    TN_SPAN_B(TN_TK_QUANT, "quantize", -1, wt, k, n, 0);
    if (!own) {
        tn_matmul_quantize_task(c->pool, ith, nth, c->kt, wt, x, ldx, k, n, c->xq);
        TN_SPAN_E(TN_TK_QUANT, "quantize", -1, 0, 0);
        return c->xq;
    }
    c->kt->slot[tn_dtype_get(wt)->vec_dot_type].from_float(x, xq_own, k);
    TN_SPAN_E(TN_TK_QUANT, "quantize", -1, 0, 0);
    return xq_own;
}

/* The trace's name of the matmul whose tail counter is next (its slot in c->mm_next). */
static const char *tn_mm_name(const tern_ctx *c, const atomic_int *next) {
    static const char *const names[TN_MM_PER_LAYER] = {"attn_q", "attn_k", "attn_v", "attn_out", "ffn_gate_up", "ffn_down"};
    const int64_t i = next - c->mm_next;
    return i >= (int64_t)TN_MM_PER_LAYER * c->hp.n_layer ? "output" : names[i % TN_MM_PER_LAYER];
}
static int32_t tn_mm_layer(const tern_ctx *c, const atomic_int *next) { /* -1: the output */
    const int64_t i = next - c->mm_next;
    return i >= (int64_t)TN_MM_PER_LAYER * c->hp.n_layer ? -1 : (int32_t)(i / TN_MM_PER_LAYER);
}

/* y = W xq (m rows of k), plus the adapters' terms on those rows when lo has a site, and, if res,
 * res += y on the same rows. Batches: the static split of tn_matmul_compute_task. One token
 * (own): tn_matmul_share's ranges (a static share, then tail chunks claimed from *next), so a
 * thread that is ahead takes more. */
static void tn_mm(tern_ctx *c, int ith, int nth, bool own, atomic_int *next, tn_dtype wt, const void *w, int64_t m,
                  int64_t k, const void *xq, int64_t n, float *y, int64_t ldy, float *res, const tn_lora_op *lo) {
    int64_t r0, r1, rows = 0; /* rows: this thread's, for the trace */
    TN_SPAN_B(TN_TK_MATMUL, tn_mm_name(c, next), tn_mm_layer(c, next), wt, m, k, n);
    if (!own) {
        tn_matmul_compute_task(ith, nth, c->kt, wt, w, m, k, xq, n, y, ldy);
        tn_matmul_rows(m, ith, nth, &r0, &r1);
        if (lo && lo->site) tn_lora_add(c, lo, y, ldy, n, r0, r1);
        if (res) tn_residual_add(res, y, m, (int32_t)n, r0, r1);
        TN_SPAN_E(TN_TK_MATMUL, tn_mm_name(c, next), tn_mm_layer(c, next), r1 - r0, (r1 - r0) * (int64_t)tn_dtype_row_size(wt, k));
        return;
    }
    int step = 0;
    while (tn_matmul_share(next, m, ith, nth, &step, &r0, &r1)) {
        tn_matmul_range(c->kt, wt, w, k, xq, 1, y, ldy, r0, r1);
        if (lo && lo->site) tn_lora_add(c, lo, y, ldy, 1, r0, r1);
        if (res) tn_residual_add(res, y, m, 1, r0, r1);
        rows += r1 - r0;
    }
    TN_SPAN_E(TN_TK_MATMUL, tn_mm_name(c, next), tn_mm_layer(c, next), rows, rows * (int64_t)tn_dtype_row_size(wt, k));
}

/* The adapters of sites slots[0 .. ns) of layer il (n_layer: the output) on input x [n][ldx]:
 * their A x rows into ops[i] (site NULL: no pairs there). own (every thread holds the input, one
 * token): each thread computes all of them into its own rows, no barrier; else each thread its
 * share of the tokens, then a barrier. Called only when the context has adapters. */
static void tn_lora_pre(const tn_thr *T, int32_t il, const int *slots, int ns, const float *x, int64_t ldx, int32_t n,
                        bool own, tn_lora_op *ops) {
    tern_ctx *c = T->c;
    const int64_t rm = c->lora_r_max;
    bool any = false;
    for (int i = 0; i < ns; i++) {
        ops[i].site = tn_lora_at(c, il, slots[i]);
        ops[i].t = own ? c->lora_t + c->lora_own_off + ((int64_t)T->ith * TN_LORA_PER_LAYER + slots[i]) * rm
                       : c->lora_t + (int64_t)slots[i] * c->n_batch * rm;
        ops[i].ld = rm;
        any |= ops[i].site != NULL;
    }
    if (!any) return;
    int64_t j0 = 0, j1 = n;
    if (!own) tn_split(n, T->ith, T->nth, 1, &j0, &j1);
    for (int i = 0; i < ns; i++)
        if (ops[i].site) tn_lora_ax(c, ops[i].site, x, ldx, j0, j1, (float *)ops[i].t, rm);
    if (!own) tn_pool_barrier(c->pool);
}

/* Token t's query heads h0 .. h0 + nh - 1 and kv heads k0 .. k0 + nk - 1: biases, per-head q/k
 * RMSNorm (qwen3), RoPE, and the k, v rows appended to the cache. */
/* Stores n values x as elements e0 .. e0 + n - 1 of a cache row of the given type (e0 and n whole
 * blocks: head_dim % 32 == 0 for the quantized types): f16 through the table's converter, q8_0 /
 * q4_0 with the reference quantizers (ggml's quantize_row_*_ref bytes), tq<b>g32a by rounding to
 * nearest between each group's minimum and maximum (tn_tq_quantize_row_rtn). */
static void tn_kv_store(int32_t type, const float *x, uint8_t *row, int64_t e0, int64_t n, const tn_kern_table *kt) {
    if (type == TN_Q8_0) tn_quantize_row_q8_0_ref(x, (block_q8_0 *)row + e0 / QK8_0, n);
    else if (type == TN_Q4_0) tn_quantize_row_q4_0_ref(x, (block_q4_0 *)row + e0 / QK4_0, n);
    else if (tn_tq_is((uint32_t)type)) {
        tn_tq_params p;
        tn_tq_params_of((uint32_t)type, &p);
        tn_tq_quantize_row_rtn(&p, x, row + (size_t)(e0 / p.group) * tn_tq_block_bytes(&p), n);
    } else kt->slot[TN_F16].from_float(x, (tn_fp16 *)row + e0, n);
}

void tn_kv_row_to_f32(const tern_ctx *c, int kv, const uint8_t *row, float *x) {
    const int32_t type = kv ? c->type_v : c->type_k;
    const int64_t nk = c->hp.n_head_kv, n = nk * c->hp.head_dim;
    c->kt->slot[type].to_float(row, x, n);
    if (kv ? c->rot_v : c->rot_k) tn_kv_rot(c, x, nk, true);
}

void tn_kv_row_from_f32(const tern_ctx *c, int kv, float *x, uint8_t *row) {
    const int64_t nk = c->hp.n_head_kv;
    if (kv ? c->rot_v : c->rot_k) tn_kv_rot(c, x, nk, false);
    tn_kv_store(kv ? c->type_v : c->type_k, x, row, 0, nk * c->hp.head_dim, c->kt);
}

void tn_kv_block_to_f32(const tern_ctx *c, int kv, const uint8_t *rows, float *x) {
    const size_t rb = kv ? c->v_rb : c->k_rb;
    const int64_t nk = c->hp.n_head_kv, n = nk * c->hp.head_dim;
    if (!kv && c->kc_bits) { /* per-channel K: a block is one group */
        const uint8_t *r[TN_KC_ROWS];
        for (int t = 0; t < TN_KC_ROWS; t++) r[t] = rows + (size_t)t * rb;
        tn_kc_dequantize_group(c->kc_bits, r, n, x, n);
        for (int t = 0; c->rot_k && t < TN_KC_ROWS; t++) tn_kv_rot(c, x + t * n, nk, true);
        return;
    }
    for (int t = 0; t < TN_KV_BLOCK; t++) tn_kv_row_to_f32(c, kv, rows + (size_t)t * rb, x + t * n);
}

void tn_kv_block_from_f32(const tern_ctx *c, int kv, float *x, uint8_t *rows) {
    const size_t rb = kv ? c->v_rb : c->k_rb;
    const int64_t nk = c->hp.n_head_kv, n = nk * c->hp.head_dim;
    if (!kv && c->kc_bits) {
        uint8_t *r[TN_KC_ROWS];
        for (int t = 0; t < TN_KC_ROWS; t++) {
            if (c->rot_k) tn_kv_rot(c, x + t * n, nk, false);
            r[t] = rows + (size_t)t * rb;
        }
        tn_kc_quantize_group(c->kc_bits, x, n, n, r);
        return;
    }
    for (int t = 0; t < TN_KV_BLOCK; t++) tn_kv_row_from_f32(c, kv, x + t * n, rows + (size_t)t * rb);
}

static void tn_prepare_qkv(tern_ctx *c, const tn_layer *L, const float *rope_cs, const tn_thr *f,
                           const int32_t *const *tables, int64_t t, int32_t h0, int32_t nh, int32_t k0, int32_t nk,
                           uint8_t *Kc, uint8_t *Vc, int64_t ring, int32_t il) {
    const tn_hparams *hp = &c->hp;
    const tn_batch *b = f->b;
    const int32_t hd = hp->head_dim, kv_dim = hp->n_head_kv * hd;
    const int64_t qd = tn_hp_q_dim(hp);
    float *qt = c->q + t * qd + (int64_t)h0 * hd, *kt_ = c->kv + t * 2 * kv_dim + (int64_t)k0 * hd, *vt = kt_ + kv_dim;
    const int64_t qn = (int64_t)nh * hd, kn = (int64_t)nk * hd;
    const tn_tensor *w = L->w;
    TN_SPAN_B(TN_TK_ROPE, "rope_kv_store", -1, nh, nk, 0, 0);
    if (w[TN_ROLE_ATTN_Q_B].data) tn_add_bias_range(qt, (const float *)w[TN_ROLE_ATTN_Q_B].data + (int64_t)h0 * hd, qn);
    if (w[TN_ROLE_ATTN_K_B].data) tn_add_bias_range(kt_, (const float *)w[TN_ROLE_ATTN_K_B].data + (int64_t)k0 * hd, kn);
    if (w[TN_ROLE_ATTN_V_B].data) tn_add_bias_range(vt, (const float *)w[TN_ROLE_ATTN_V_B].data + (int64_t)k0 * hd, kn);
    /* per head (qwen3), or over the whole q and k rows (olmoe: called with every head) */
    const int64_t qnl = hp->family->qk_norm_full ? qn : hd, knl = hp->family->qk_norm_full ? kn : hd;
    if (w[TN_ROLE_ATTN_Q_NORM].data) tn_rmsnorm_rows(qt, qt, w[TN_ROLE_ATTN_Q_NORM].data, qnl, hp->rms_eps, 0, qn / qnl);
    if (w[TN_ROLE_ATTN_K_NORM].data) tn_rmsnorm_rows(kt_, kt_, w[TN_ROLE_ATTN_K_NORM].data, knl, hp->rms_eps, 0, kn / knl);
    if (rope_cs) { /* the layer's table (local layers: their own base); none on NoPE layers */
        const float *cs = rope_cs + t * hp->n_rot;
        tn_op_rope(hp, qt, nh, cs, 1.0f);
        tn_op_rope(hp, kt_, nk, cs, 1.0f);
    }
    if (c->rot_k) tn_kv_rot(c, qt, nh, false), tn_kv_rot(c, kt_, nk, false);
    if (c->rot_v) tn_kv_rot(c, vt, nk, false);
    const int64_t row = ring ? b->pos[t] % ring : tn_kv_row(tables ? tables[b->seq[t]] : NULL, TN_KV_BLOCK, b->pos[t]);
    if (c->kc_bits) /* per-channel K: into its sequence's window; its group is quantized when complete (tn_kc_close) */
        tn_kv_store(TN_F16, kt_, (uint8_t *)(tn_kc_win(c, b->seq[t], il) + (size_t)(b->pos[t] % c->kc_w) * (size_t)kv_dim),
                    (int64_t)k0 * hd, kn, c->kt);
    else tn_kv_store(c->type_k, kt_, Kc + (size_t)row * c->k_rb, (int64_t)k0 * hd, kn, c->kt);
    tn_kv_store(c->type_v, vt, Vc + (size_t)row * c->v_rb, (int64_t)k0 * hd, kn, c->kt);
    TN_SPAN_E(TN_TK_ROPE, "rope_kv_store", -1, 0, 0);
}

/* Per-channel K: the group ending at position last (complete now) quantized from the sequence's
 * window (sequence seq, layer il) into its cache rows (the block of table, or contiguous rows), kv
 * heads k0 .. k0 + nk - 1 (whole 32-value chunks, so heads are quantized independently). */
static void tn_kc_close(tern_ctx *c, int ith, uint8_t *Kc, int32_t seq, int32_t il, const int32_t *table, int64_t last,
                        int32_t k0, int32_t nk) {
    const uint16_t *Kw = tn_kc_win(c, seq, il);
    const int64_t hd = c->hp.head_dim, kv_dim = (int64_t)c->hp.n_head_kv * hd, n = (int64_t)nk * hd;
    float *x = c->kc_x + (size_t)ith * (size_t)(TN_KV_BLOCK * kv_dim);
    uint8_t *rows[TN_KC_ROWS];
    for (int r = 0; r < TN_KC_ROWS; r++) {
        const int64_t p = last - (TN_KC_ROWS - 1) + r;
        const uint16_t *w = Kw + (size_t)(p % c->kc_w) * (size_t)kv_dim + (size_t)k0 * (size_t)hd;
        for (int64_t i = 0; i < n; i++) x[r * n + i] = tn_fp16_to_fp32(w[i]);
        rows[r] = Kc + (size_t)tn_kv_row(table, TN_KV_BLOCK, p) * c->k_rb + tn_kc_row_bytes(c->kc_bits, (int64_t)k0 * hd);
    }
    tn_kc_quantize_group(c->kc_bits, x, n, n, rows);
}

/* The prefetch span of the pass's next matmul W for this thread (none for NULL, or for the output
 * when it is not the only row of logits wanted). */
static tn_span tn_next_span(const tn_thr *T, const tn_tensor *W) {
    if (!W || (W == &T->c->model->output && T->n_out != 1)) return (tn_span){NULL, 0};
    return tn_share_span(T->own, W, W->ne[1], W->ne[0], T->ith, T->nth);
}

int32_t tn_blk_begin(tn_thr *T, tern_ctx *c, const tn_batch *b, const int32_t *const *tables,
                     const int32_t *const *swa_tables, int32_t n_out, const int32_t *out_rows, int ith, int nth) {
    const tn_hparams *hp = &c->hp;
    const int32_t d = hp->n_embd;
    memset(T, 0, sizeof *T);
    T->c = c, T->b = b, T->tables = tables, T->n_out = n_out, T->out_rows = out_rows, T->ith = ith, T->nth = nth;
    T->swa_tables = c->kv_swa_blocks ? swa_tables : NULL;
    T->n = b->n;
    tn_split(T->n, ith, nth, 1, &T->t0, &T->t1);
    T->own = T->n == 1 && nth > 1;
    T->xb_own = ith ? c->pxb + (size_t)(ith - 1) * (size_t)d : c->xb;
    T->xq_own = ith ? (uint8_t *)c->pxq + (size_t)(ith - 1) * c->pxq_stride : c->xq;
    T->xb = T->own ? T->xb_own : c->xb;
    T->n0 = T->own ? 0 : T->t0, T->n1 = T->own ? 1 : T->t1;
    /* attention: units of G query heads (tn_attn_unit), this thread's units p0 .. p1 - 1; like
     * llama.cpp, batches of >= 64 tokens with head sizes a multiple of 16 use f32 accumulation,
     * everything else the f16 path */
    T->acc16 = T->n < TN_ATTN_F32_ROWS || hp->head_dim % 16 != 0;
    T->G = tn_attn_unit(hp, T->n, nth);
    if (T->own || T->n == 1) tn_split((int64_t)T->n * (hp->n_head / T->G), ith, nth, 1, &T->p0, &T->p1);
    else tn_attn_split(b, hp->n_head / T->G, ith, nth, &T->p0, &T->p1); /* by cost: causal rows grow */
    if (T->own && ith == 0) /* the tail counters of tn_matmul_share, before the first barrier */
        for (int32_t i = 0; i < TN_MM_PER_LAYER * hp->n_layer + 1; i++)
            atomic_store_explicit(&c->mm_next[i], 0, memory_order_relaxed);
    return c->start_layer > 0 && c->start_layer <= hp->n_layer ? c->start_layer : 0;
}

void tn_blk_embed(tn_thr *T, int32_t l0) {
    tern_ctx *c = T->c;
    const tern_model *m = c->model;
    const tn_hparams *hp = &c->hp;
    const int32_t d = hp->n_embd;
    for (int64_t t = T->t0; t < T->t1; t++) {
        if (l0) memcpy(c->x + t * d, c->start_x + t * d, sizeof(float) * (size_t)d);
        else tn_tensor_get_row(&m->tok_embd, T->b->tok[t], c->x + t * d);
        if (!l0 && hp->embd_scale > 0) /* gemma: x * sqrt(n_embd) */
            for (int32_t i = 0; i < d; i++) c->x[t * d + i] *= hp->embd_scale;
    }
    for (int64_t t = T->t0; t < T->t1; t++) tn_op_rope_cache(hp, c->rope_ff, T->b->pos[t], c->rope_cs + t * hp->n_rot);
    if (c->rope_cs_swa) { /* sliding-window layers: their own base and scale */
        tn_hparams hs = *hp;
        hs.rope_freq_base = hp->rope_base_swa, hs.rope_freq_scale = hp->rope_scale_swa;
        for (int64_t t = T->t0; t < T->t1; t++)
            tn_op_rope_cache(&hs, c->rope_ff, T->b->pos[t], c->rope_cs_swa + t * hp->n_rot);
    }
    const tn_span wq_pf = l0 < hp->n_layer ? tn_next_span(T, &m->layers[l0].w[TN_ROLE_ATTN_Q]) : (tn_span){NULL, 0};
    tn_pool_barrier_pf(c->pool, wq_pf.p, wq_pf.n);
}

void tn_blk_norm(tn_thr *T, const tn_tensor *w, int32_t il, tn_obs_site site) {
    tern_ctx *c = T->c;
    const int32_t d = c->hp.n_embd;
    TN_SPAN_B(TN_TK_NORM, site == TN_OBS_FFN_IN ? "ffn_norm" : "attn_norm", il, T->n1 - T->n0, d, 0, 0);
    tn_rmsnorm_rows(c->x, T->xb, w->data, d, c->hp.rms_eps, T->n0, T->n1);
    if (!T->own) tn_pool_barrier(c->pool);
    if (c->observe && T->ith == 0) c->observe(c->observe_user, il, site, c->xb, T->n, d);
    TN_SPAN_E(TN_TK_NORM, site == TN_OBS_FFN_IN ? "ffn_norm" : "attn_norm", il, 0, 0);
}

void tn_blk_qkv(tn_thr *T, const tn_layer *L, int32_t il) {
    tern_ctx *c = T->c;
    tn_pool *pool = c->pool;
    const int ith = T->ith, nth = T->nth, n = T->n;
    const bool own = T->own;
    const int32_t d = c->hp.n_embd, kv_dim = c->hp.n_head_kv * c->hp.head_dim, qd = (int32_t)tn_hp_q_dim(&c->hp);
    const tn_tensor *const Wq = &L->w[TN_ROLE_ATTN_Q], *const Wk = &L->w[TN_ROLE_ATTN_K], *const Wv = &L->w[TN_ROLE_ATTN_V];
    float *xb = T->xb;
    void *xq_own = T->xq_own;
    tn_lora_op lo[3] = {{0}};
    if (c->lora_sites) tn_lora_pre(T, il, (const int[]){TN_LORA_Q, TN_LORA_K, TN_LORA_V}, 3, xb, d, n, own, lo);
    /* xb quantized once when the types agree */
    const void *xq = tn_act(c, ith, nth, own, xq_own, Wq->type, xb, d, d, n);
    atomic_int *next = c->mm_next + TN_MM_PER_LAYER * il;
    tn_mm(c, ith, nth, own, next, Wq->type, Wq->data, qd, d, xq, n, c->q, qd, NULL, &lo[0]);
    if (tn_dtype_get(Wk->type)->vec_dot_type != tn_dtype_get(Wq->type)->vec_dot_type) {
        if (!own) tn_pool_barrier(pool);
        xq = tn_act(c, ith, nth, own, xq_own, Wk->type, xb, d, d, n);
    }
    tn_mm(c, ith, nth, own, next + 1, Wk->type, Wk->data, kv_dim, d, xq, n, c->kv, 2 * kv_dim, NULL, &lo[1]);
    if (tn_dtype_get(Wv->type)->vec_dot_type != tn_dtype_get(Wk->type)->vec_dot_type) {
        if (!own) tn_pool_barrier(pool);
        xq = tn_act(c, ith, nth, own, xq_own, Wv->type, xb, d, d, n);
    }
    tn_mm(c, ith, nth, own, next + 2, Wv->type, Wv->data, kv_dim, d, xq, n, c->kv + kv_dim, 2 * kv_dim, NULL, &lo[2]);
    /* one token: the start of this thread's share of Wo, prefetched while it waits here and
     * (the rest) while it attends — attention reads little memory */
    const tn_span wo_pf = tn_next_span(T, &L->w[TN_ROLE_ATTN_OUT]);
    tn_pool_barrier_pf(pool, wo_pf.p, wo_pf.n);
}

void tn_blk_attention(tn_thr *T, const tn_layer *L, int32_t il) {
    tern_ctx *c = T->c;
    const tn_hparams *hp = &c->hp;
    const tn_batch *b = T->b;
    const int32_t hd = hp->head_dim, qd = (int32_t)tn_hp_q_dim(hp);
    const int32_t G = T->G, nu = hp->n_head / G, rep = hp->n_head / hp->n_head_kv;
    const int64_t p0 = T->p0, p1 = T->p1;
    uint8_t *Kc = c->k_cache + (size_t)c->kv_off[il] * c->k_rb;
    uint8_t *Vc = c->v_cache + (size_t)c->kv_off[il] * c->v_rb;
    const int64_t ring = tn_hp_layer_swa(hp, il) ? c->kv_ring : 0; /* > 0: K/V row = position % ring */
    /* a paged cache: the sliding-window layers' rows are in blocks of their own pool */
    const int32_t *const *tables = T->swa_tables && tn_hp_layer_swa(hp, il) ? T->swa_tables : T->tables;
    const tn_span wo_pf = tn_next_span(T, &L->w[TN_ROLE_ATTN_OUT]);
    const float *rope_cs = !tn_hp_layer_rope(hp, il) ? NULL : tn_hp_layer_swa(hp, il) ? c->rope_cs_swa : c->rope_cs;
    TN_SPAN_B(TN_TK_ATTENTION, "attention", il, p1 - p0, G, 0, 0);
    /* one token in whole kv groups: a thread's units need only its own heads' RoPE and cache
     * rows, so it prepares them itself and no barrier separates that from the attention */
    if (T->own && G > 1 && !hp->family->qk_norm_full) {
        for (int64_t p = p0; p < p1; p++) {
            const int32_t h0 = (int32_t)(p % nu) * G, k0 = h0 / rep, nk = G / rep;
            tn_prepare_qkv(c, L, rope_cs, T, tables, 0, h0, G, k0, nk, Kc, Vc, ring, il);
            if (c->kc_bits && (b->pos[0] + 1) % TN_KV_BLOCK == 0) /* its own heads */
                tn_kc_close(c, T->ith, Kc, b->seq[0], il, tables ? tables[b->seq[0]] : NULL, b->pos[0], k0, nk);
        }
    } else {
        for (int64_t t = T->t0; t < T->t1; t++)
            tn_prepare_qkv(c, L, rope_cs, T, tables, t, 0, hp->n_head, 0, hp->n_head_kv, Kc, Vc, ring, il);
        tn_pool_barrier(c->pool);
        if (c->kc_bits) { /* the groups this batch completes, (group, kv head) pairs spread over the threads */
            int64_t k = 0;
            for (int32_t t = 0; t < b->n; t++)
                if ((b->pos[t] + 1) % TN_KV_BLOCK == 0)
                    for (int32_t g = 0; g < hp->n_head_kv; g++, k++)
                        if (k % T->nth == T->ith)
                            tn_kc_close(c, T->ith, Kc, b->seq[t], il, tables ? tables[b->seq[t]] : NULL, b->pos[t], g, 1);
            if (k) tn_pool_barrier(c->pool);
        }
    }
    /* attention over (token, query-head group) units; one token: attention reads little memory,
     * so meanwhile the start of the thread's static share of Wo (wo_pf) is prefetched into its L2,
     * a slice per unit (lines the barrier wait already fetched hit L2); the matmul then begins
     * from cache instead of a cold stream */
    const uint8_t *pf = p1 > p0 ? wo_pf.p : NULL;
    const size_t pf_n = wo_pf.n;
    for (int64_t p = p0; p < p1; p++) {
        const int32_t t = (int32_t)(p / nu), h0 = (int32_t)(p % nu) * G;
        if (pf) {
            const size_t a = pf_n * (size_t)(p - p0) / (size_t)(p1 - p0), e = pf_n * (size_t)(p + 1 - p0) / (size_t)(p1 - p0);
            for (size_t o = a & ~(size_t)63; o < e; o += 64) __builtin_prefetch(pf + o, 0, 2); /* prefetcht1: into L2 */
        }
        tn_attend(c, T->ith, il, tables ? tables[b->seq[t]] : NULL, b->seq[t], b->pos[t], c->q + (int64_t)t * qd + (int64_t)h0 * hd,
                  h0, G, T->acc16, c->att + (int64_t)t * qd + (int64_t)h0 * hd);
    }
    tn_pool_barrier_pf(c->pool, pf ? NULL : wo_pf.p, wo_pf.n); /* unless attending prefetched it */
    TN_SPAN_E(TN_TK_ATTENTION, "attention", il, 0, 0);
}

/* Rows x[(t, h)] = src + t * lds + h * ldh (k floats) of n tokens and nh heads, head-major
 * ((h * n + t) rows of wt's vec_dot_type in c->xq), each thread a share; then a barrier. */
static void tn_mla_act_heads(tn_thr *T, tn_dtype wt, const float *src, int64_t lds, int64_t ldh, int64_t k, int32_t nh) {
    tern_ctx *c = T->c;
    const tn_dtype vt = tn_dtype_get(wt)->vec_dot_type;
    const size_t rs = tn_dtype_row_size(vt, k);
    int64_t r0, r1;
    tn_split((int64_t)nh * T->n, T->ith, T->nth, 1, &r0, &r1);
    for (int64_t r = r0; r < r1; r++)
        c->kt->slot[vt].from_float(src + (r % T->n) * lds + (r / T->n) * ldh, (uint8_t *)c->xq + (size_t)r * rs, k);
    tn_pool_barrier(c->pool);
}

/* Per head h: y[t] (row stride ldy, at h * ldh) = W_h x[(t, h)] for the 3-D matrix W of one
 * [ne0, ne1] slice per head, over the head-major rows tn_mla_act_heads left in c->xq; then a
 * barrier. */
static void tn_mla_mm_heads(tn_thr *T, const tn_tensor *W, float *y, int64_t ldy, int64_t ldh) {
    tern_ctx *c = T->c;
    const int64_t k = W->ne[0], m = W->ne[1];
    const size_t rs = tn_dtype_row_size(tn_dtype_get(W->type)->vec_dot_type, k);
    for (int64_t h = 0; h < W->ne[2]; h++) {
        const tn_tensor w = tn_expert_view(W, h);
        tn_matmul_compute_task(T->ith, T->nth, c->kt, W->type, w.data, m, k, (const uint8_t *)c->xq + (size_t)(h * T->n) * rs,
                               T->n, y + h * ldh, ldy);
    }
    tn_pool_barrier(c->pool);
}

/* y [n][m] = W x for x [n][ldx] (k = W->ne[0] values a row): quantize, multiply, barrier. */
static void tn_mla_mm(tn_thr *T, const tn_tensor *W, const float *x, int64_t ldx, float *y) {
    tern_ctx *c = T->c;
    const void *xq = tn_act(c, T->ith, T->nth, false, NULL, W->type, x, ldx, W->ne[0], T->n);
    tn_matmul_compute_task(T->ith, T->nth, c->kt, W->type, W->data, W->ne[1], W->ne[0], xq, T->n, y, W->ne[1]);
    tn_pool_barrier(c->pool);
}

void tn_blk_mla(tn_thr *T, const tn_layer *L, int32_t il) {
    tern_ctx *c = T->c;
    const tn_hparams *hp = &c->hp;
    const tn_batch *b = T->b;
    const tn_tensor *w = L->w;
    const int32_t H = hp->n_head, hd = hp->head_dim, nr = hp->n_rot, np = hd - nr, R = hp->n_lora_kv, vh = hp->v_head;
    const int64_t Lk = tn_hp_mla_kv(hp), qd = (int64_t)H * hd;
    TN_SPAN_B(TN_TK_ATTENTION, "mla", il, T->n, H, 0, 0);
    /* one token: every thread normed it for itself; from here on all read thread 0's row (xb) */
    if (T->own) tn_pool_barrier(c->pool);
    const int32_t d = hp->n_embd;
    /* q = Wq xb, or Wq_b rmsnorm(Wq_a xb) */
    if (hp->n_lora_q > 0) {
        tn_mla_mm(T, &w[TN_ROLE_ATTN_Q_A], c->xb, d, c->mla_a);
        for (int64_t t = T->t0; t < T->t1; t++)
            tn_op_rmsnorm(c->mla_a + t * hp->n_lora_q, c->mla_a + t * hp->n_lora_q, w[TN_ROLE_ATTN_Q_A_NORM].data,
                          hp->n_lora_q, hp->rms_eps);
        tn_pool_barrier(c->pool);
        tn_mla_mm(T, &w[TN_ROLE_ATTN_Q_LB], c->mla_a, hp->n_lora_q, c->q);
    } else {
        tn_mla_mm(T, &w[TN_ROLE_ATTN_Q], c->xb, d, c->q);
    }
    /* [c | k_pe] = Wkv_a xb, per token: c normed, k_pe and every head's q_pe rotated, the row
     * cached; q_pe copied after the head's latent-space query */
    tn_mla_mm(T, &w[TN_ROLE_ATTN_KV_A_MQA], c->xb, d, c->kv);
    uint8_t *Kc = c->k_cache + (size_t)c->kv_off[il] * c->k_rb;
    tn_hparams hq = *hp;
    hq.head_dim = hd; /* q_pe of head h at h * hd + np */
    for (int64_t t = T->t0; t < T->t1; t++) {
        float *kv = c->kv + t * Lk, *q = c->q + t * qd;
        const float *cs = c->rope_cs + t * nr;
        tn_op_rmsnorm(kv, kv, w[TN_ROLE_ATTN_KV_A_NORM].data, R, hp->rms_eps);
        tn_op_rope(&hq, kv + R, 1, cs, 1.0f);
        tn_op_rope(&hq, q + np, H, cs, 1.0f);
        for (int32_t h = 0; h < H; h++) memcpy(c->mla_q + (t * H + h) * Lk + R, q + (int64_t)h * hd + np, sizeof(float) * (size_t)nr);
        const int64_t row = tn_kv_row(T->tables ? T->tables[b->seq[t]] : NULL, TN_KV_BLOCK, b->pos[t]);
        tn_kv_store(c->type_k, kv, Kc + (size_t)row * c->k_rb, 0, Lk, c->kt);
    }
    /* absorbed queries: q_nope,h W_kb,h (kv_lora_rank values) into each head's latent part */
    const tn_tensor *Wkb = &w[TN_ROLE_ATTN_K_B_MLA];
    tn_mla_act_heads(T, Wkb->type, c->q, qd, hd, np, H);
    tn_mla_mm_heads(T, Wkb, c->mla_q, (int64_t)H * Lk, Lk);
    /* attention of every (token, head) over the cached rows: keys [c | k_pe], values the same
     * rows (of which the first kv_lora_rank outputs are used: the latent) */
    const float scale = hp->attn_scale;
    float *scratch = c->scores + (size_t)T->ith * c->scores_stride;
    int64_t u0, u1;
    tn_split((int64_t)T->n * H, T->ith, T->nth, 1, &u0, &u1);
    for (int64_t u = u0; u < u1; u++) {
        const int64_t t = u / H, npos = (int64_t)b->pos[t] + 1;
        const int32_t *blocks = T->tables ? T->tables[b->seq[t]] : NULL;
        const float *q = c->mla_q + u * Lk;
        float *out = c->mla_o + u * Lk;
        if (c->type_k != TN_F16)
            c->kt->attn_q(Lk, npos, 1, 1, q, c->type_k, Kc, c->k_rb, c->type_k, Kc, c->k_rb, blocks, TN_KV_BLOCK, scale, 0.0f,
                          T->acc16, out, scratch);
        else
            c->kt->attn(Lk, npos, 1, 1, q, (const uint16_t *)Kc, (const uint16_t *)Kc, (int64_t)(c->k_rb / 2), blocks, TN_KV_BLOCK,
                        scale, T->acc16, out, scratch);
    }
    tn_pool_barrier(c->pool);
    /* att[t][h * v_head ..] = W_vb,h (latent attention of head h) */
    const tn_tensor *Wvb = &w[TN_ROLE_ATTN_V_B_MLA];
    tn_mla_act_heads(T, Wvb->type, c->mla_o, (int64_t)H * Lk, Lk, R, H);
    tn_mla_mm_heads(T, Wvb, c->att, (int64_t)H * vh, vh);
    TN_SPAN_E(TN_TK_ATTENTION, "mla", il, 0, 0);
}

/* hb = act(Wg xb) * (Wu xb) over n_ff rows; prefetches the start of this thread's share of down
 * (the next matmul) at the closing barrier. */
static void tn_glu(tn_thr *T, const tn_tensor *Wg, const tn_tensor *Wu, int32_t n_ff, const tn_tensor *down, int32_t il) {
    tern_ctx *c = T->c;
    const tn_kern_table *kt = c->kt;
    const int ith = T->ith, nth = T->nth, n = T->n;
    const bool own = T->own;
    const int32_t d = c->hp.n_embd;
    int64_t r0, r1, rows = 0; /* rows: this thread's, for the trace */
    TN_SPAN_B(TN_TK_MATMUL, "ffn_gate_up", il, Wg->type, 2 * (int64_t)n_ff, d, n);
    tn_lora_op lo[2] = {{0}};
    if (c->lora_sites) tn_lora_pre(T, il, (const int[]){TN_LORA_GATE, TN_LORA_UP}, 2, T->xb, d, n, own, lo);
    const void *xq = tn_act(c, ith, nth, own, T->xq_own, Wg->type, T->xb, d, d, n);
    const bool same_vt = tn_dtype_get(Wu->type)->vec_dot_type == tn_dtype_get(Wg->type)->vec_dot_type;
    const bool geglu = c->hp.ffn == TN_FFN_GEGLU;
    if (own && same_vt) { /* one token: gate, up and SwiGLU per shared range of rows */
        int step = 0;
        while (tn_matmul_share(c->mm_next + TN_MM_PER_LAYER * il + 4, n_ff, ith, nth, &step, &r0, &r1)) {
            tn_matmul_range(kt, Wg->type, Wg->data, d, xq, 1, c->hb, n_ff, r0, r1);
            tn_matmul_range(kt, Wu->type, Wu->data, d, xq, 1, c->hb2, n_ff, r0, r1);
            if (lo[0].site) tn_lora_add(c, &lo[0], c->hb, n_ff, 1, r0, r1);
            if (lo[1].site) tn_lora_add(c, &lo[1], c->hb2, n_ff, 1, r0, r1);
            if (geglu) kt->geglu(c->hb + r0, c->hb2 + r0, r1 - r0);
            else kt->swiglu(c->hb + r0, c->hb2 + r0, r1 - r0);
            rows += r1 - r0;
        }
    } else {
        tn_matmul_compute_task(ith, nth, kt, Wg->type, Wg->data, n_ff, d, xq, n, c->hb, n_ff);
        if (!same_vt) {
            if (!own) tn_pool_barrier(c->pool);
            xq = tn_act(c, ith, nth, own, T->xq_own, Wu->type, T->xb, d, d, n);
        }
        tn_matmul_compute_task(ith, nth, kt, Wu->type, Wu->data, n_ff, d, xq, n, c->hb2, n_ff);
        /* SwiGLU on this thread's rows (the rows it just computed for both matrices) */
        tn_matmul_rows(n_ff, ith, nth, &r0, &r1);
        rows = r1 - r0;
        if (lo[0].site) tn_lora_add(c, &lo[0], c->hb, n_ff, n, r0, r1);
        if (lo[1].site) tn_lora_add(c, &lo[1], c->hb2, n_ff, n, r0, r1);
        for (int32_t j = 0; j < n; j++) {
            if (geglu) kt->geglu(c->hb + (int64_t)j * n_ff + r0, c->hb2 + (int64_t)j * n_ff + r0, r1 - r0);
            else kt->swiglu(c->hb + (int64_t)j * n_ff + r0, c->hb2 + (int64_t)j * n_ff + r0, r1 - r0);
        }
    }
    const tn_span down_pf = tn_next_span(T, down);
    tn_pool_barrier_pf(c->pool, down_pf.p, down_pf.n);
    TN_SPAN_E(TN_TK_MATMUL, "ffn_gate_up", il, 2 * rows,
              rows * (int64_t)(tn_dtype_row_size(Wg->type, d) + tn_dtype_row_size(Wu->type, d)));
}

void tn_blk_glu(tn_thr *T, const tn_layer *L, int32_t il) {
    tn_glu(T, &L->w[TN_ROLE_FFN_GATE], &L->w[TN_ROLE_FFN_UP], T->c->hp.n_ff, &L->w[TN_ROLE_FFN_DOWN], il);
}

void tn_blk_up_relu_sqr(tn_thr *T, const tn_layer *L, int32_t il) {
    tern_ctx *c = T->c;
    const tn_kern_table *kt = c->kt;
    const int ith = T->ith, nth = T->nth, n = T->n;
    const int32_t d = c->hp.n_embd, n_ff = c->hp.n_ff;
    const tn_tensor *Wu = &L->w[TN_ROLE_FFN_UP];
    int64_t r0, r1, rows = 0; /* rows: this thread's, for the trace */
    TN_SPAN_B(TN_TK_MATMUL, "ffn_up", il, Wu->type, n_ff, d, n);
    const void *xq = tn_act(c, ith, nth, T->own, T->xq_own, Wu->type, T->xb, d, d, n);
    if (T->own) { /* one token: up and the activation per shared range of rows */
        int step = 0;
        while (tn_matmul_share(c->mm_next + TN_MM_PER_LAYER * il + 4, n_ff, ith, nth, &step, &r0, &r1)) {
            tn_matmul_range(kt, Wu->type, Wu->data, d, xq, 1, c->hb, n_ff, r0, r1);
            tn_op_relu_sqr(c->hb + r0, r1 - r0);
            rows += r1 - r0;
        }
    } else { /* the activation on the rows this thread just computed */
        tn_matmul_compute_task(ith, nth, kt, Wu->type, Wu->data, n_ff, d, xq, n, c->hb, n_ff);
        tn_matmul_rows(n_ff, ith, nth, &r0, &r1);
        rows = r1 - r0;
        for (int32_t j = 0; j < n; j++) tn_op_relu_sqr(c->hb + (int64_t)j * n_ff + r0, r1 - r0);
    }
    const tn_span down_pf = tn_next_span(T, &L->w[TN_ROLE_FFN_DOWN]);
    tn_pool_barrier_pf(c->pool, down_pf.p, down_pf.n);
    TN_SPAN_E(TN_TK_MATMUL, "ffn_up", il, rows, rows * (int64_t)tn_dtype_row_size(Wu->type, d));
}

void tn_blk_shexp(tn_thr *T, const tn_layer *L, int32_t il, const tn_tensor *next) {
    tern_ctx *c = T->c;
    const int32_t d = c->hp.n_embd, ff = c->hp.n_ff_shexp;
    const tn_tensor *Wd = &L->w[TN_ROLE_FFN_DOWN_SHEXP], *gate = &L->w[TN_ROLE_FFN_GATE_INP_SHEXP];
    /* hb = silu(Wgate_sh xb) * (Wup_sh xb): the dense block's path (the routed experts left xb,
     * and in one-token mode every thread's own normed row, as they were) */
    tn_glu(T, &L->w[TN_ROLE_FFN_GATE_SHEXP], &L->w[TN_ROLE_FFN_UP_SHEXP], ff, Wd, il);
    if (c->observe && T->ith == 0) c->observe(c->observe_user, il, TN_OBS_FFN_DOWN, c->hb, T->n, ff);
    const void *xq = tn_act(c, T->ith, T->nth, T->own, T->xq_own, Wd->type, c->hb, ff, ff, T->n);
    tn_mm(c, T->ith, T->nth, T->own, c->mm_next + TN_MM_PER_LAYER * il + 5, Wd->type, Wd->data, d, ff, xq, T->n, c->tmp, d,
          NULL, NULL); /* no adapter targets a shared expert (tn_lora refuses its tensors) */
    tn_pool_barrier(c->pool);
    /* x += sigmoid(gate . xb) * out (llama.cpp multiplies the expert's output, not its input,
     * by the gate); no gate vector: x += out */
    for (int64_t t = T->t0; t < T->t1; t++) {
        float g = 1.0f;
        if (gate->data) {
            const float *gw = gate->data, *xb = c->xb + t * d;
            double dot = 0;
            for (int32_t i = 0; i < d; i++) dot += (double)gw[i] * xb[i];
            g = (float)(1.0 / (1.0 + exp(-dot)));
        }
        for (int32_t i = 0; i < d; i++) c->x[t * d + i] += g * c->tmp[t * d + i];
    }
    const tn_span pf = tn_next_span(T, next);
    tn_pool_barrier_pf(c->pool, pf.p, pf.n);
}

static void tn_moe_renorm(float *w, int32_t k);

/* The indices of the k largest of p[ne] into sel, best first; equal values: the lower index first. */
static void tn_moe_topk(const float *p, int32_t ne, int32_t k, int32_t *sel) {
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < ne; e++) {
            bool taken = false;
            for (int32_t i = 0; i < j && !taken; i++) taken = sel[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[j] = best;
    }
}

/* One token's routing from its router logits p[n_expert] (overwritten with the softmax, as
 * ggml_soft_max computes it: exp(l - max) summed in double, times 1 / sum): the k most probable
 * experts into sel (best first; equal probabilities: the lower index first, as llama.cpp's
 * argsort orders up to 16 experts) and their weights into w (divided by their sum, clamped below
 * at 2^-14 as llama.cpp does, when renorm). */
/* p[ne] = softmax(p) as ggml_soft_max computes it (exp(l - max) summed in double, times 1 / sum). */
static void tn_moe_softmax(float *p, int32_t ne) {
    float mx = -INFINITY;
    for (int32_t e = 0; e < ne; e++) mx = p[e] > mx ? p[e] : mx;
    double sum = 0;
    for (int32_t e = 0; e < ne; e++) sum += (double)(p[e] = expf(p[e] - mx));
    const float inv = (float)(1.0 / sum);
    for (int32_t e = 0; e < ne; e++) p[e] *= inv;
}

static void tn_moe_route(float *p, int32_t ne, int32_t k, bool renorm, int32_t *sel, float *w) {
    tn_moe_softmax(p, ne);
    tn_moe_topk(p, ne, k, sel);
    for (int32_t j = 0; j < k; j++) w[j] = p[sel[j]];
    if (renorm) tn_moe_renorm(w, k);
}

/* The k largest logits p[ne] into sel (best first; equal ones: the lower index first) and the
 * softmax of just those into w (llama.cpp's SOFTMAX_WEIGHT gating: gpt-oss). */
static void tn_moe_route_topk_softmax(const float *p, int32_t ne, int32_t k, bool renorm, int32_t *sel, float *w) {
    tn_moe_topk(p, ne, k, sel);
    const float mx = p[sel[0]];
    double sum = 0;
    for (int32_t j = 0; j < k; j++) sum += (double)(w[j] = expf(p[sel[j]] - mx));
    const float inv = (float)(1.0 / sum);
    for (int32_t j = 0; j < k; j++) w[j] *= inv;
    if (renorm) tn_moe_renorm(w, k);
}

/* w[k] divided by its sum, clamped below at 2^-14 as llama.cpp does (norm_w). */
static void tn_moe_renorm(float *w, int32_t k) {
    double ws = 0;
    for (int32_t j = 0; j < k; j++) ws += (double)w[j];
    const float s = TN_MAX((float)ws, 6.103515625e-5f);
    for (int32_t j = 0; j < k; j++) w[j] /= s;
}

/* DeepSeek's routing (llama.cpp's build_moe_ffn): probabilities p = softmax or sigmoid of the
 * logits (overwritten); selection scores s = p + exp_probs_b (bias NULL: p); with expert groups,
 * each group scored by the sum of its two best s and only the n_group_used best groups eligible
 * (equal scores: the lower index first); the k best eligible s into sel; weights p of those,
 * divided by their sum (clamped at 2^-14) when moe_norm, times moe_scale unless 0 or 1. */
static void tn_moe_route_ds(const tn_hparams *hp, float *p, const float *bias, int32_t *sel, float *w) {
    const int32_t ne = hp->n_expert, k = hp->n_expert_used;
    float s[512], gs[512];
    int32_t gsel[512];
    if (hp->moe_sigmoid) {
        for (int32_t e = 0; e < ne; e++) p[e] = 1.0f / (1.0f + expf(-p[e]));
    } else {
        tn_moe_softmax(p, ne);
    }
    for (int32_t e = 0; e < ne; e++) s[e] = bias ? p[e] + bias[e] : p[e];
    if (hp->n_expert_groups > 1) {
        const int32_t G = hp->n_expert_groups, per = ne / G;
        for (int32_t g = 0; g < G; g++) {
            int32_t two[2];
            tn_moe_topk(s + g * per, per, 2, two);
            gs[g] = s[g * per + two[0]] + s[g * per + two[1]];
        }
        tn_moe_topk(gs, G, hp->n_group_used, gsel);
        for (int32_t g = 0; g < G; g++) {
            bool used = false;
            for (int32_t j = 0; j < hp->n_group_used; j++) used |= gsel[j] == g;
            if (!used)
                for (int32_t e = 0; e < per; e++) s[g * per + e] = -INFINITY;
        }
    }
    tn_moe_topk(s, ne, k, sel);
    for (int32_t j = 0; j < k; j++) w[j] = p[sel[j]];
    if (hp->moe_norm) tn_moe_renorm(w, k);
    if (hp->moe_scale != 0.0f && hp->moe_scale != 1.0f)
        for (int32_t j = 0; j < k; j++) w[j] *= hp->moe_scale;
}

void tn_moe_route_token(const tn_hparams *hp, const tn_layer *L, float *lg, int32_t *sel, float *w) {
    const int32_t ne = hp->n_expert, k = hp->n_expert_used;
    const float *rb = L->w[TN_ROLE_FFN_GATE_INP_B].data; /* gpt-oss: the router's bias */
    if (rb)
        for (int32_t e = 0; e < ne; e++) lg[e] += rb[e];
    if (hp->family->mla) tn_moe_route_ds(hp, lg, L->w[TN_ROLE_FFN_EXP_PROBS_B].data, sel, w);
    else if (hp->family->moe_gating == TN_MOE_SOFTMAX_WEIGHT) tn_moe_route_topk_softmax(lg, ne, k, hp->family->moe_renorm, sel, w);
    else tn_moe_route(lg, ne, k, hp->family->moe_renorm, sel, w);
}

void tn_moe_group(tern_ctx *c, const tn_layer *L, int32_t il, int32_t n) {
    const int32_t ne = c->hp.n_expert, k = c->hp.n_expert_used;
    const int64_t R = (int64_t)n * k;
    const tn_tensor *Wg = &L->w[TN_ROLE_FFN_GATE_EXPS];
    int32_t *off = c->moe_off;
    memset(off, 0, sizeof(int32_t) * (size_t)(ne + 1));
    for (int64_t r = 0; r < R; r++) off[c->moe_sel[r] + 1]++;
    for (int32_t e = 0; e < ne; e++) off[e + 1] += off[e];
    for (int64_t r = 0; r < R; r++) { /* moe_row as the cursor of each expert, then the row */
        const int32_t e = c->moe_sel[r], g = off[e]++;
        c->moe_tok[g] = (int32_t)(r / k), c->moe_row[r] = g;
    }
    for (int32_t e = ne; e > 0; e--) off[e] = off[e - 1]; /* the cursors ended at the next start */
    off[0] = 0;
    if (c->moe_count) { /* usage (tern bench): this batch's rows per expert, experts run */
        uint64_t *cnt = c->moe_count + (int64_t)il * ne;
        int32_t used = 0;
        for (int32_t e = 0; e < ne; e++) cnt[e] += (uint64_t)(off[e + 1] - off[e]), used += off[e + 1] > off[e];
        c->moe_rows += (uint64_t)R;
        if (Wg->hot) /* rows whose expert is in fast memory (tier.c) */
            for (int32_t e = 0; e < ne; e++)
                if (off[e + 1] > off[e] && atomic_load_explicit(&Wg->hot[e], memory_order_relaxed))
                    c->moe_rows_hot += (uint64_t)(off[e + 1] - off[e]);
        c->moe_touched[il] += (uint64_t)used, c->moe_passes[il]++, c->moe_tokens[il] += (uint64_t)n;
    }
}

void tn_blk_moe(tn_thr *T, const tn_layer *L, int32_t il) {
    tern_ctx *c = T->c;
    const tn_kern_table *kt = c->kt;
    const tn_hparams *hp = &c->hp;
    tn_pool *pool = c->pool;
    const int ith = T->ith, nth = T->nth;
    const int32_t n = T->n, d = hp->n_embd, ne = hp->n_expert, k = hp->n_expert_used, ff = hp->n_ff_exp;
    const int64_t R = (int64_t)n * k; /* routed rows */
    const tn_tensor *Wr = &L->w[TN_ROLE_FFN_GATE_INP], *Wg = &L->w[TN_ROLE_FFN_GATE_EXPS];
    const tn_tensor *Wu = &L->w[TN_ROLE_FFN_UP_EXPS], *Wd = &L->w[TN_ROLE_FFN_DOWN_EXPS];
    /* one token: every thread normed it for itself; from here on all read thread 0's row in xb */
    if (T->own) tn_pool_barrier(pool);
    /* router logits [n][n_expert] = Wr xb, then each token's routing (its thread's tokens) */
    const void *xq = tn_act(c, ith, nth, false, NULL, Wr->type, c->xb, d, d, n);
    int64_t r0, r1;
    TN_SPAN_B(TN_TK_MATMUL, "ffn_gate_inp", il, Wr->type, ne, d, n);
    tn_matmul_compute_task(ith, nth, kt, Wr->type, Wr->data, ne, d, xq, n, c->moe_logits, ne);
    tn_matmul_rows(ne, ith, nth, &r0, &r1);
    TN_SPAN_E(TN_TK_MATMUL, "ffn_gate_inp", il, r1 - r0, (r1 - r0) * (int64_t)tn_dtype_row_size(Wr->type, d));
    tn_pool_barrier(pool);
    TN_SPAN_B(TN_TK_ROUTE, "moe_route", il, n, ne, k, 0);
    for (int64_t t = T->t0; t < T->t1; t++) tn_moe_route_token(hp, L, c->moe_logits + t * ne, c->moe_sel + t * k, c->moe_w + t * k);
    tn_pool_barrier(pool);
    if (ith == 0) tn_moe_group(c, L, il, n);
    tn_pool_barrier(pool);
    TN_SPAN_E(TN_TK_ROUTE, "moe_route", il, 0, 0);
    const int32_t *off = c->moe_off;
    if (c->observe_moe && ith == 0)
        for (int32_t e = 0; e < ne; e++)
            if (off[e + 1] > off[e])
                c->observe_moe(c->observe_user, il, TN_OBS_FFN_IN, e, c->xb, c->moe_tok + off[e], off[e + 1] - off[e], d);
    /* each routed row's normed input, gathered and quantized for the gate experts' type */
    const tn_dtype gvt = tn_dtype_get(Wg->type)->vec_dot_type, uvt = tn_dtype_get(Wu->type)->vec_dot_type;
    const size_t xrb_g = tn_dtype_row_size(gvt, d), xrb_u = tn_dtype_row_size(uvt, d);
    TN_SPAN_B(TN_TK_QUANT, "quantize", -1, Wg->type, d, R, 0);
    tn_split(R, ith, nth, 1, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) kt->slot[gvt].from_float(c->xb + (int64_t)c->moe_tok[r] * d, (uint8_t *)c->xq + (size_t)r * xrb_g, d);
    tn_pool_barrier(pool);
    TN_SPAN_E(TN_TK_QUANT, "quantize", -1, 0, 0);
    /* hb = Wgate_e x, hb2 = Wup_e x over each expert's rows; each thread its share of the rows.
     * The trace's shapes: n tokens, each through k experts, so a thread's ff rows count k times
     * (flops = 2 rows k n), and it reads its rows of every expert the batch routes to (bytes). */
    int32_t used = 0;
    for (int32_t e = 0; e < ne; e++) used += off[e + 1] > off[e];
    TN_SPAN_B(TN_TK_MATMUL, "ffn_gate_up_exps", il, Wg->type, 2 * (int64_t)ff, d, n);
    for (int32_t e = 0; e < ne; e++) {
        if (off[e + 1] == off[e]) continue;
        const tn_tensor g = tn_expert_view(Wg, e);
        tn_matmul_compute_task(ith, nth, kt, Wg->type, g.data, ff, d, (const uint8_t *)c->xq + (size_t)off[e] * xrb_g,
                               off[e + 1] - off[e], c->hb + (int64_t)off[e] * ff, ff);
    }
    if (uvt != gvt) { /* the up experts read another activation type: quantize again */
        tn_pool_barrier(pool);
        for (int64_t r = r0; r < r1; r++)
            kt->slot[uvt].from_float(c->xb + (int64_t)c->moe_tok[r] * d, (uint8_t *)c->xq + (size_t)r * xrb_u, d);
        tn_pool_barrier(pool);
    }
    for (int32_t e = 0; e < ne; e++) {
        if (off[e + 1] == off[e]) continue;
        const tn_tensor u = tn_expert_view(Wu, e);
        tn_matmul_compute_task(ith, nth, kt, Wu->type, u.data, ff, d, (const uint8_t *)c->xq + (size_t)off[e] * xrb_u,
                               off[e + 1] - off[e], c->hb2 + (int64_t)off[e] * ff, ff);
    }
    /* SwiGLU on the rows this thread computed (the same rows of every expert); gpt-oss: the
     * experts' gate and up biases first, then its clamped SwiGLU */
    int64_t f0, f1;
    tn_matmul_rows(ff, ith, nth, &f0, &f1);
    const float *gb = L->w[TN_ROLE_FFN_GATE_EXPS_B].data, *ub = L->w[TN_ROLE_FFN_UP_EXPS_B].data;
    const bool oai = hp->ffn == TN_FFN_SWIGLU_OAI;
    for (int32_t e = 0; e < ne && f1 > f0; e++)
      for (int64_t r = off[e]; r < off[e + 1]; r++) { /* expert e's rows */
        float *g = c->hb + r * ff, *u = c->hb2 + r * ff;
        if (gb)
            for (int64_t i = f0; i < f1; i++) g[i] += gb[e * ff + i];
        if (ub)
            for (int64_t i = f0; i < f1; i++) u[i] += ub[e * ff + i];
        if (oai) tn_op_swiglu_oai(g + f0, u + f0, f1 - f0);
        else kt->swiglu(g + f0, u + f0, f1 - f0);
      }
    tn_pool_barrier(pool);
    TN_SPAN_E(TN_TK_MATMUL, "ffn_gate_up_exps", il, 2 * (f1 - f0) * k,
              used * (f1 - f0) * (int64_t)(tn_dtype_row_size(Wg->type, d) + tn_dtype_row_size(Wu->type, d)));
    /* moe_x = Wdown_e hb per expert */
    if (c->observe_moe && ith == 0)
        for (int32_t e = 0; e < ne; e++)
            if (off[e + 1] > off[e])
                c->observe_moe(c->observe_user, il, TN_OBS_FFN_DOWN, e, c->hb + (int64_t)off[e] * ff, NULL, off[e + 1] - off[e], ff);
    xq = tn_act(c, ith, nth, false, NULL, Wd->type, c->hb, ff, ff, R);
    const size_t xrb_d = tn_dtype_row_size(tn_dtype_get(Wd->type)->vec_dot_type, ff);
    TN_SPAN_B(TN_TK_MATMUL, "ffn_down_exps", il, Wd->type, d, ff, n);
    for (int32_t e = 0; e < ne; e++) {
        if (off[e + 1] == off[e]) continue;
        const tn_tensor dn = tn_expert_view(Wd, e);
        tn_matmul_compute_task(ith, nth, kt, Wd->type, dn.data, d, ff, (const uint8_t *)xq + (size_t)off[e] * xrb_d,
                               off[e + 1] - off[e], c->moe_x + (int64_t)off[e] * d, d);
    }
    tn_matmul_rows(d, ith, nth, &r0, &r1);
    TN_SPAN_E(TN_TK_MATMUL, "ffn_down_exps", il, (r1 - r0) * k, used * (r1 - r0) * (int64_t)tn_dtype_row_size(Wd->type, ff));
    tn_pool_barrier(pool);
    TN_SPAN_B(TN_TK_ROUTE, "moe_combine", il, n, ne, k, 0);
    /* x[t] += sum_j w[t][j] * (out[row(t, j)] + down bias of its expert): the slots in order,
     * whatever the grouping */
    const float *db = L->w[TN_ROLE_FFN_DOWN_EXPS_B].data;
    for (int64_t t = T->t0; t < T->t1; t++) {
        const int32_t *row = c->moe_row + t * k, *sel = c->moe_sel + t * k;
        const float *w = c->moe_w + t * k;
        float *xt = c->x + t * d;
        if (db) { /* the bias added to each expert's output before it is weighted, as ggml_add_id */
            for (int32_t j = 0; j < k; j++) {
                float *o = c->moe_x + (int64_t)row[j] * d;
                for (int32_t i = 0; i < d; i++) o[i] += db[(int64_t)sel[j] * d + i];
            }
        }
        for (int32_t i = 0; i < d; i++) {
            float acc = w[0] * c->moe_x[(int64_t)row[0] * d + i];
            for (int32_t j = 1; j < k; j++) acc += w[j] * c->moe_x[(int64_t)row[j] * d + i];
            xt[i] += acc;
        }
    }
    TN_SPAN_E(TN_TK_ROUTE, "moe_combine", il, 0, 0);
    tn_pool_barrier(pool);
}

void tn_blk_proj_add(tn_thr *T, const tn_tensor *W, const float *in, int32_t il, int slot, tn_obs_site site,
                     const tn_tensor *post, const tn_tensor *next) {
    tern_ctx *c = T->c;
    const int64_t k = W->ne[0], m = W->ne[1], d = c->hp.n_embd;
    if (c->observe && T->ith == 0) c->observe(c->observe_user, il, site, in, T->n, (int32_t)k);
    tn_lora_op lo = {0};
    if (c->lora_sites) tn_lora_pre(T, il, (const int[]){slot == 3 ? TN_LORA_O : TN_LORA_DOWN}, 1, in, k, T->n, T->own, &lo);
    const void *xq = tn_act(c, T->ith, T->nth, T->own, T->xq_own, W->type, in, k, k, T->n);
    /* without a post norm each thread adds its own rows of W in to x as it computes them */
    tn_mm(c, T->ith, T->nth, T->own, c->mm_next + TN_MM_PER_LAYER * il + slot, W->type, W->data, m, k, xq, T->n, c->tmp, d,
          post && post->data ? NULL : c->x, &lo);
    if (post && post->data) { /* x += rmsnorm(W in) * post: whole rows, after every thread's share */
        tn_pool_barrier(c->pool);
        for (int64_t t = T->t0; t < T->t1; t++) {
            tn_op_rmsnorm(c->tmp + t * d, c->tmp + t * d, post->data, d, c->hp.rms_eps);
            for (int64_t i = 0; i < d; i++) c->x[t * d + i] += c->tmp[t * d + i];
        }
    }
    const tn_span pf = tn_next_span(T, next);
    tn_pool_barrier_pf(c->pool, pf.p, pf.n);
}

void tn_blk_bias_add(tn_thr *T, const float *b) {
    tern_ctx *c = T->c;
    const int32_t d = c->hp.n_embd;
    for (int64_t t = T->t0; t < T->t1; t++)
        for (int32_t i = 0; i < d; i++) c->x[t * d + i] += b[i];
    tn_pool_barrier(c->pool);
}

void tn_blk_layer_end(tn_thr *T, int32_t il) {
    tern_ctx *c = T->c;
    if (c->debug_layer && T->ith == 0) c->debug_layer(c->debug_user, il, c->x, T->n, c->hp.n_embd);
}

void tn_blk_logits(tn_thr *T) {
    tern_ctx *c = T->c;
    const tern_model *m = c->model;
    const tn_hparams *hp = &c->hp;
    const int ith = T->ith, nth = T->nth;
    const int32_t d = hp->n_embd;
    /* the tokens that asked for logits (rows gathered in order); one such token: every thread
     * norms and quantizes it for itself, as in the layers */
    const int32_t nl = T->n_out;
    const bool own_out = nl == 1 && nth > 1;
    if (own_out) {
        tn_op_rmsnorm(c->x + (int64_t)T->out_rows[0] * d, T->xb_own, m->output_norm.data, d, hp->rms_eps);
    } else {
        int64_t l0, l1;
        tn_split(nl, ith, nth, 1, &l0, &l1);
        for (int64_t j = l0; j < l1; j++)
            tn_op_rmsnorm(c->x + (int64_t)T->out_rows[j] * d, c->xb + j * d, m->output_norm.data, d, hp->rms_eps);
        tn_pool_barrier(c->pool);
    }
    if (c->debug_layer && ith == 0) c->debug_layer(c->debug_user, hp->n_layer, c->xb, nl, d);
    if (nl == 0) return;
    if (c->observe && ith == 0) c->observe(c->observe_user, hp->n_layer, TN_OBS_OUTPUT, c->xb, nl, d);
    tn_lora_op lo = {0};
    if (c->lora_sites) tn_lora_pre(T, hp->n_layer, (const int[]){0}, 1, own_out ? T->xb_own : c->xb, d, nl, own_out, &lo);
    const void *xq = tn_act(c, ith, nth, own_out, T->xq_own, m->output.type, own_out ? T->xb_own : c->xb, d, d, nl);
    tn_mm(c, ith, nth, own_out && T->own, c->mm_next + TN_MM_PER_LAYER * hp->n_layer, m->output.type, m->output.data,
          hp->n_vocab, d, xq, nl, c->logits, hp->n_vocab, NULL, &lo);
    if (hp->logit_softcap > 0) { /* logits = cap * tanh(logits / cap), on this thread's rows */
        tn_pool_barrier(c->pool);
        const float cap = hp->logit_softcap;
        int64_t l0, l1;
        tn_split(nl, ith, nth, 1, &l0, &l1);
        for (int64_t j = l0; j < l1; j++)
            for (int64_t v = 0; v < hp->n_vocab; v++) {
                float *l = c->logits + j * hp->n_vocab + v;
                *l = tanhf(*l * (1.0f / cap)) * cap;
            }
    }
}
