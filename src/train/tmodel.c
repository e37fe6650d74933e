/*
 * tmodel.c — the training model: sizes tables, flat buffers, forward storing activations,
 * backward as the forward mirrored. See train.h.
 *
 * Shapes: N = B*T tokens, C = n_embd, Q = n_head*head_dim, KV = n_head_kv*head_dim, F = n_ff,
 * V = n_vocab, H = n_head.
 * Row-major activations [N][C]; a linear layer with weight W[m][k] (GGUF ne = [k, m]) is
 * out[N][m] = in[N][k] * W^T, so its backward is dW[m][k] += dout^T * in and din = dout * W.
 * Everything that is not a GEMM is split over the pool by rows (or by (b, kv head) for attention)
 * with fixed chunking; per-thread partial sums are added in thread order, so results depend on
 * the thread count but not on timing.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/trace.h"
#include "kern/kern.h"
#include "kern/matmul.h"
#include "model/ops.h"
#include "train/rng.h"
#include "train/train.h"

/* ---- families and sizes tables ------------------------------------------------------------ */

const tn_arch_desc *tn_train_arch(const tn_train_cfg *c) { return c->arch ? c->arch : tn_arch_find("llama", 5); }

/* The roles the training block has a forward and a backward for. */
static bool role_trainable(int r) {
    switch (r) { /* the roles the training block has a forward and a backward for */
    case TN_ROLE_ATTN_NORM: case TN_ROLE_ATTN_Q: case TN_ROLE_ATTN_K: case TN_ROLE_ATTN_V: case TN_ROLE_ATTN_OUT:
    case TN_ROLE_ATTN_Q_B: case TN_ROLE_ATTN_K_B: case TN_ROLE_ATTN_V_B: case TN_ROLE_ATTN_Q_NORM:
    case TN_ROLE_ATTN_K_NORM: case TN_ROLE_FFN_NORM: case TN_ROLE_FFN_GATE: case TN_ROLE_FFN_UP:
    case TN_ROLE_FFN_DOWN: case TN_ROLE_TOKEN_EMBD: case TN_ROLE_OUTPUT_NORM: case TN_ROLE_OUTPUT: return true;
    default: return false; /* post norms, rope factors, fused q|k|v, and any role added later */
    }
}

/* The need of role r in the family's dense model (no experts: the trainer has no MoE block; a
 * family that is always a mixture, need[FFN_GATE_INP] required, is not trainable). */
static tn_need dense_need(const tn_arch_desc *a, tn_role r) {
    tn_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.family = a;
    return tn_arch_need(&hp, r);
}

bool tn_train_arch_ok(const tn_arch_desc *a) {
    if (!a || a->ffn != TN_FFN_SWIGLU || a->nope_step > 0 || a->embd_scale || a->synth_swa || a->gate_up_fused) return false;
    if (a->need[TN_ROLE_FFN_GATE_INP] == TN_NEED_REQ) return false;
    for (int r = 0; r < TN_ROLE_COUNT; r++)
        if (dense_need(a, (tn_role)r) == TN_NEED_REQ && !role_trainable(r)) return false;
    return true;
}

void tn_train_arch_names(char *buf, size_t cap) {
    size_t n = 0;
    if (cap) buf[0] = 0;
    for (size_t i = 0; i < tn_arch_count() && n < cap; i++) {
        const tn_arch_desc *a = tn_arch_at(i);
        if (!tn_train_arch_ok(a)) continue;
        int k = snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", a->name);
        if (k < 0) break;
        n += (size_t)k;
    }
}

static int32_t cfg_head_dim(const tn_train_cfg *c) { return c->head_dim > 0 ? c->head_dim : c->n_embd / c->n_head; }

tern_status tn_train_cfg_check(const tn_train_cfg *c) {
#define CHK(cond, ...) do { if (!(cond)) return tn_err(TERN_ERR_INVALID_ARG, "train: " __VA_ARGS__); } while (0)
    const tn_arch_desc *a = tn_train_arch(c);
    char names[128];
    tn_train_arch_names(names, sizeof names);
    CHK(tn_train_arch_ok(a), "architecture %s cannot be trained (training runs %s)", a ? a->name : "?", names);
    CHK(c->n_vocab >= 4 && c->n_vocab <= (1 << 24), "n_vocab %d out of range", c->n_vocab);
    CHK(c->n_ctx >= 2 && c->n_ctx <= 65536, "ctx %d out of range [2, 65536]", c->n_ctx);
    CHK(c->n_embd >= 2 && c->n_embd <= 65536, "n_embd %d out of range", c->n_embd);
    CHK(c->n_layer >= 1 && c->n_layer <= 1024, "n_layer %d out of range", c->n_layer);
    CHK(c->head_dim >= 0 && c->head_dim <= 4096, "head_dim %d out of range [0 (n_embd/n_head), 4096]", c->head_dim);
    CHK(c->n_head >= 1 && (c->head_dim > 0 || c->n_embd % c->n_head == 0), "n_head %d must divide n_embd %d", c->n_head, c->n_embd);
    CHK(cfg_head_dim(c) % 2 == 0, "head_dim %d must be even for RoPE", cfg_head_dim(c));
    CHK((int64_t)c->n_head * cfg_head_dim(c) <= 65536, "n_head * head_dim %lld out of range", (long long)c->n_head * cfg_head_dim(c));
    CHK(c->n_head_kv >= 1 && c->n_head % c->n_head_kv == 0, "n_head_kv %d must divide n_head %d", c->n_head_kv, c->n_head);
    CHK(c->n_ff >= 1 && c->n_ff <= (1 << 20), "n_ff %d out of range", c->n_ff);
    CHK(c->rms_eps > 0 && c->rope_base > 0, "rms_eps and rope_base must be positive");
#undef CHK
    return TERN_OK;
}

tern_status tn_train_cfg_from(const tern_model *src, int32_t n_ctx, tn_train_cfg *c) {
    const tn_hparams *h = &src->hp;
    if (!tn_train_arch_ok(h->family)) {
        char names[128];
        tn_train_arch_names(names, sizeof names);
        return tn_err(TERN_ERR_UNSUPPORTED, "train: the model is of architecture %s, which training does not run (it "
                      "trains %s)", h->family ? h->family->name : "?", names);
    }
    memset(c, 0, sizeof *c);
    c->arch = h->family;
    c->head_dim = h->head_dim;
    c->n_vocab = h->n_vocab;
    c->n_embd = h->n_embd; c->n_layer = h->n_layer; c->n_head = h->n_head; c->n_head_kv = h->n_head_kv;
    c->n_ff = h->n_ff; c->rms_eps = h->rms_eps; c->rope_base = h->rope_freq_base;
    c->n_ctx = n_ctx > 0 && n_ctx <= h->n_ctx_train ? n_ctx : h->n_ctx_train;
    return TERN_OK;
}

static void fill_hparams(const tn_train_cfg *c, tn_hparams *hp) {
    const tn_arch_desc *a = tn_train_arch(c);
    memset(hp, 0, sizeof *hp);
    hp->arch = a->id;
    hp->family = a;
    hp->n_vocab = c->n_vocab;
    hp->n_ctx_train = c->n_ctx;
    hp->n_embd = c->n_embd;
    hp->n_layer = c->n_layer;
    hp->n_head = c->n_head;
    hp->n_head_kv = c->n_head_kv;
    hp->n_ff = c->n_ff;
    hp->head_dim = cfg_head_dim(c);
    hp->n_rot = hp->head_dim;
    hp->rms_eps = c->rms_eps;
    hp->rope_freq_base = c->rope_base;
    hp->rope_freq_scale = 1.0f;
    hp->rope_mode = a->rope;
    hp->ffn = a->ffn;
}

/* The per-layer roles of the training block: the family's required ones, in the registry's order
 * (llama: attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down). */
static int layer_roles(const tn_arch_desc *a, tn_role *out) {
    int n = 0;
    for (int r = 0; r < TN_ROLE_N_LAYER; r++)
        if (dense_need(a, (tn_role)r) == TN_NEED_REQ) out[n++] = (tn_role)r;
    return n;
}

/* The sizes table: token_embd, the layers' roles, output_norm, output (always untied); names and
 * shapes from the registry (model/arch/). Returns the number of tensors. */
static int build_table(const tn_train_cfg *c, tn_tparam *t, size_t *n_params) {
    tn_hparams hp;
    fill_hparams(c, &hp);
    tn_role lr[TN_ROLE_N_LAYER];
    const int nl = layer_roles(hp.family, lr);
    int i = 0;
    size_t off = 0;
    for (int l = -1; l <= c->n_layer; l++) {
        const int n = l < 0 ? 1 : l < c->n_layer ? nl : 2;
        for (int j = 0; j < n; j++, i++) {
            const tn_role r = l < 0 ? TN_ROLE_TOKEN_EMBD : l < c->n_layer ? lr[j] : j ? TN_ROLE_OUTPUT : TN_ROLE_OUTPUT_NORM;
            const tn_role_info *ri = &tn_roles[r];
            const int64_t k = tn_dim_value(&hp, ri->ne0), mrows = tn_dim_value(&hp, ri->ne1);
            if (t) {
                tn_role_tensor_name(r, l, t[i].name, sizeof t[i].name);
                t[i].role = r;
                t[i].n_dims = ri->ne1 == TN_DIM_1 ? 1 : 2;
                t[i].ne[0] = k, t[i].ne[1] = mrows, t[i].off = off;
                t[i].n = (size_t)k * (size_t)mrows;
                t[i].decay = ri->matrix; /* weight decay on matrices, not on norm weights or biases */
            }
            off += (size_t)k * (size_t)mrows;
            off = (off + 15) & ~(size_t)15; /* 64-byte aligned views */
        }
    }
    *n_params = off;
    return i;
}

/* Activation sizes table: per layer the buffers forward keeps (layer l at l * per_layer), then
 * the one copy of those backward recomputes (m->recompute), then the head, then backward scratch.
 * Q = n_head*head_dim. qn, kn (q, k before their per-head RMSNorm) and dqn, dkn exist only with
 * q/k norms. */
enum { AK_X_IN, AK_XN1, AK_QN, AK_KN, AK_Q, AK_K, AK_V, AK_ATT, AK_Y, AK_X_MID, AK_XN2, AK_G, AK_U, AK_H, AK_N };
typedef struct act_layout {
    size_t off[AK_N];    /* kept: layer 0's offset; recomputed: the shared copy's              */
    size_t len[AK_N];    /* floats, aligned                                                     */
    bool kept[AK_N];
    size_t per_layer;
    size_t x_fin, xf, logits;                                        /* after the layers               */
    size_t ce_rows;                                                  /* logits rows held (chunk)       */
    size_t dres, dxn, dq, dk, dv, dqn, dkn, dy, dh, dg, du, datt, dw; /* scratch                        */
    size_t head0, logits_end, total;                                 /* where the head starts, ends     */
} act_layout;

/* The plan's kind of each per-layer buffer. */
static const uint8_t ak_kind[AK_N] = {
    [AK_X_IN] = TN_MEM_SAVED_IN, [AK_XN1] = TN_MEM_SAVED_IN, [AK_QN] = TN_MEM_SAVED_IN, [AK_KN] = TN_MEM_SAVED_IN,
    [AK_Q] = TN_MEM_ATTN_QKV, [AK_K] = TN_MEM_ATTN_QKV, [AK_V] = TN_MEM_ATTN_QKV, [AK_ATT] = TN_MEM_ATTN_PROBS,
    [AK_Y] = TN_MEM_ATTN_QKV, [AK_X_MID] = TN_MEM_SAVED_IN, [AK_XN2] = TN_MEM_SAVED_IN, [AK_G] = TN_MEM_FFN,
    [AK_U] = TN_MEM_FFN, [AK_H] = TN_MEM_FFN,
};

/* Rows of logits held at a time (train.h). */
int64_t tn_ce_rows(const tn_train_cfg *c, int B, int T, int ce_rows) {
    const int64_t N = (int64_t)B * T;
    int64_t r = ce_rows;
    if (r <= 0) { /* auto: TN_CE_ROWS, fewer for large vocabularies (a chunk <= 32 MiB), at least 32 */
        r = ((int64_t)(1 << 23) / TN_MAX((int64_t)c->n_vocab, (int64_t)1)) & ~(int64_t)15;
        r = TN_MIN(TN_MAX(r, (int64_t)32), (int64_t)TN_CE_ROWS);
    }
    return TN_MIN(r, N);
}

static void plan_acts(const tn_train_cfg *c, int B, int T, int nth, int rc, int ce_rows, act_layout *a) {
    tn_hparams hp;
    fill_hparams(c, &hp);
    const tn_arch_desc *ad = hp.family;
    const bool q_norm = ad->need[TN_ROLE_ATTN_Q_NORM] == TN_NEED_REQ, k_norm = ad->need[TN_ROLE_ATTN_K_NORM] == TN_NEED_REQ;
    const size_t N = (size_t)B * T, C = (size_t)c->n_embd, H = (size_t)c->n_head, hd = (size_t)hp.head_dim;
    const size_t Q = H * hd, KV = (size_t)c->n_head_kv * hd, F = (size_t)c->n_ff, V = (size_t)c->n_vocab;
    const size_t n[AK_N] = {[AK_X_IN] = N * C, [AK_XN1] = N * C, [AK_QN] = q_norm ? N * Q : 0, [AK_KN] = k_norm ? N * KV : 0,
                            [AK_Q] = N * Q, [AK_K] = N * KV, [AK_V] = N * KV, [AK_ATT] = (size_t)B * H * T * T,
                            [AK_Y] = N * Q, [AK_X_MID] = N * C, [AK_XN2] = N * C, [AK_G] = N * F, [AK_U] = N * F,
                            [AK_H] = N * F};
    size_t o = 0;
    for (int f = 0; f < AK_N; f++) {
        a->len[f] = ((size_t)n[f] + 15) & ~(size_t)15;
        a->kept[f] = f == AK_X_IN || (!c->forward_only && (rc == TN_RECOMPUTE_NONE || (rc == TN_RECOMPUTE_ATTN && f != AK_ATT)));
    }
    for (int f = 0; f < AK_N; f++)
        if (a->kept[f]) a->off[f] = o, o += a->len[f];
    a->per_layer = o;
    o = a->per_layer * (size_t)c->n_layer;
    for (int f = 0; f < AK_N; f++)
        if (!a->kept[f]) a->off[f] = o, o += a->len[f];
#define A(field, n) do { a->field = o; o += ((size_t)(n) + 15) & ~(size_t)15; } while (0)
    a->head0 = o;
    a->ce_rows = (size_t)tn_ce_rows(c, B, T, ce_rows);
    A(x_fin, N * C); A(xf, N * C); A(logits, a->ce_rows * V);
    a->logits_end = o;
    if (c->forward_only) { /* no backward: no scratch */
        a->total = o;
        return;
    }
    A(dres, N * C); A(dxn, N * C); A(dq, N * Q); A(dk, N * KV); A(dv, N * KV);
    A(dqn, q_norm ? N * Q : 0); A(dkn, k_norm ? N * KV : 0); A(dy, N * Q);
    A(dh, N * F); A(dg, N * F); A(du, N * F); A(datt, (size_t)nth * T); A(dw, (size_t)nth * (C > hd ? C : hd));
#undef A
    a->total = o;
}

/* Floats after the activations: RoPE cos/sin [T][n_rot], then tokens, targets, row losses [B*T]. */
static size_t caches_floats(const tn_train_cfg *c, int B, int T) { return (size_t)T * cfg_head_dim(c) + (size_t)B * T * 3; }

void tn_tmodel_mem(const tn_train_cfg *c, int B, int T, int n_threads, size_t *param_bytes, size_t *act_bytes) {
    size_t np;
    build_table(c, NULL, &np);
    act_layout a;
    plan_acts(c, B, T, n_threads, TN_RECOMPUTE_NONE, 0, &a);
    *param_bytes = np * 4 * sizeof(float);
    *act_bytes = (a.total + caches_floats(c, B, T)) * sizeof(float);
}

const char *tn_recompute_name(tn_recompute r) { return r == TN_RECOMPUTE_FULL ? "full" : r == TN_RECOMPUTE_ATTN ? "attn" : "none"; }

bool tn_recompute_parse(const char *s, tn_recompute *r) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, tn_recompute_name((tn_recompute)i))) return *r = (tn_recompute)i, true;
    return false;
}

/* LoRA scratch (tn_tmodel_plan): u, du [B*T][rank] and the dequantized tile [tile_rows][max k]. */
static int64_t lora_max_k(const tn_tmodel *m) {
    int64_t max_k = 1;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->t[i].base && m->t[i].ne[0] > max_k) max_k = m->t[i].ne[0];
    return max_k;
}
/* A frozen matrix the int8 forward takes: quantized, with a quantized activation format. */
static bool lora_int8_type(tn_dtype t) {
    const tn_dtype_traits *tr = tn_dtype_get(t);
    return tr && tr->is_quantized && tn_dtype_get(tr->vec_dot_type) && tn_dtype_get(tr->vec_dot_type)->is_quantized;
}
/* base_int8 scratch, floats: x quantized for the widest frozen matrix, and [B*T][n_embd] for the
 * products that are added to the residual (attn_output, ffn_down). */
static size_t lora_int8_floats(const tn_tmodel *m, int B, int T) {
    if (!m->base || !m->base_int8) return 0;
    size_t xq = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->t[i].base && lora_int8_type(m->t[i].base->type)) {
            const size_t b = tn_matmul_xq_size(m->t[i].base->type, m->t[i].ne[0], (int64_t)B * T);
            if (b > xq) xq = b;
        }
    return ((xq + 63) / 64) * 16 + (((size_t)B * T * (size_t)m->cfg.n_embd + 15) & ~(size_t)15);
}
static size_t lora_scratch_floats(const tn_tmodel *m, int B, int T) {
    if (!m->base) return 0;
    const size_t nu = ((size_t)B * T * (size_t)m->lora_rank + 15) & ~(size_t)15;
    return 2 * nu + (size_t)TN_MAX(m->tile_rows, (int64_t)1) * (size_t)lora_max_k(m) + lora_int8_floats(m, B, T);
}

void tn_tmodel_mem_plan(const tn_tmodel *m, int batch, int accum, int T, tn_recompute rc, tn_mem_plan *p) {
    memset(p, 0, sizeof *p);
    if (accum < 1) accum = 1;
    const int mb = batch / accum;
    act_layout a;
    plan_acts(&m->cfg, mb, T, m->n_threads, rc, m->ce_rows, &a);
    p->batch = batch, p->micro_batch = mb, p->accum = accum, p->T = T, p->recompute = rc;
    p->params = p->grads = m->n_params * sizeof(float);
    p->moments = 2 * p->params;
    if (m->cfg.forward_only) p->grads = p->moments = 0;
    p->frozen = m->base ? m->base->weight_bytes : 0;
    for (int f = 0; f < AK_N; f++) {
        if (a.kept[f]) p->kept[ak_kind[f]] += a.len[f] * (size_t)m->cfg.n_layer * sizeof(float);
        else if (m->cfg.forward_only) p->kept[ak_kind[f]] += a.len[f] * sizeof(float); /* one layer's, reused */
        else p->recomp[ak_kind[f]] += a.len[f] * sizeof(float);
    }
    p->head = (a.logits - a.head0) * sizeof(float);
    p->logits = (a.logits_end - a.logits) * sizeof(float);
    p->ce_rows = (int64_t)a.ce_rows;
    p->scratch = (a.total - a.logits_end + lora_scratch_floats(m, mb, T)) * sizeof(float);
    p->caches = caches_floats(&m->cfg, mb, T) * sizeof(float);
    p->acts = (a.total + caches_floats(&m->cfg, mb, T) + lora_scratch_floats(m, mb, T)) * sizeof(float);
    p->peak = p->params + p->grads + p->moments + p->frozen + p->acts;
}

static tern_status check_fits(size_t need, const char *what) {
    uint64_t avail = tn_mem_available();
    if (avail && need > avail)
        return tn_err(TERN_ERR_NOMEM, "train: %s need %.1f MiB but only %.1f MiB of memory is available "
                      "(reduce --batch, --ctx or the model size)", what, need / 1048576.0, avail / 1048576.0);
    return TERN_OK;
}

static tern_status lora_layout(tn_tmodel *m, const tern_model *base, const tn_lora_cfg *lc);
static void lora_init(tn_tmodel *m, uint64_t seed);

/* Full training (base NULL) or LoRA over base. */
static tern_status create_impl(const tn_train_cfg *c, int n_threads, const tern_model *base, const tn_lora_cfg *lc,
                               tn_tmodel **out) {
    *out = NULL;
    tern_status s = tn_train_cfg_check(c);
    if (s) return s;
    if (n_threads < 1) n_threads = 1;
    tn_tmodel *m = tn_calloc(1, sizeof *m);
    if (!m) return tn_err(TERN_ERR_NOMEM, "train: model struct");
    m->cfg = *c;
    fill_hparams(c, &m->hp);
    m->n_tensors = build_table(c, NULL, &m->n_params);
    /* LoRA: room for a lora_a and a lora_b per layer and target role */
    const size_t cap = (size_t)m->n_tensors + (base ? 2 * (size_t)c->n_layer * TN_ROLE_N_LAYER : 0);
    m->t = tn_calloc(cap, sizeof *m->t);
    if (!m->t) { s = tn_err(TERN_ERR_NOMEM, "train: sizes table"); goto fail; }
    build_table(c, m->t, &m->n_params);
    {
        tn_role lr[TN_ROLE_N_LAYER];
        m->per_layer = layer_roles(m->hp.family, lr);
        memset(m->slot, -1, sizeof m->slot);
        for (int j = 0; j < m->per_layer; j++) m->slot[lr[j]] = (int8_t)j;
    }
    if (base && (s = lora_layout(m, base, lc))) goto fail;
    const size_t views = c->forward_only ? 1 : 4, bytes = m->n_params * views * sizeof(float);
    if ((s = check_fits(bytes, c->forward_only ? "parameters" : base ? "adapter, norm weights, gradients and AdamW moments"
                                                                       : "parameters, gradients and AdamW moments")))
        goto fail;
    m->params = tn_malloc_aligned(bytes, 64);
    if (!m->params) {
        s = tn_err(TERN_ERR_NOMEM, "train: parameters, gradients and AdamW moments need %.1f MiB; allocation failed",
                   bytes / 1048576.0);
        goto fail;
    }
    memset(m->params, 0, bytes);
    if (views == 4) {
        m->grads = m->params + m->n_params;
        m->m = m->grads + m->n_params;
        m->v = m->m + m->n_params;
    }
    m->n_threads = n_threads;
    if ((s = tn_pool_create(n_threads, &m->pool))) goto fail;
    m->tr_il = -1;
    tn_pool_trace_join(m->pool, false); /* the op spans (tracing) time the whole pool: no nested join waits */
    openblas_set_num_threads(1); /* parallelism comes from the pool (gemm_fn) */
    if (base) lora_init(m, lc->seed);
    *out = m;
    return TERN_OK;
fail:
    tn_tmodel_free(m);
    return s;
}

tern_status tn_tmodel_create(const tn_train_cfg *c, int n_threads, tn_tmodel **out) {
    return create_impl(c, n_threads, NULL, NULL, out);
}

tern_status tn_tmodel_create_lora(const tn_train_cfg *c, const tern_model *base, const tn_lora_cfg *lc, int n_threads,
                                  tn_tmodel **out) {
    *out = NULL;
    if (!base || !lc) return tn_err(TERN_ERR_INVALID_ARG, "train: LoRA needs a base model and a LoRA config");
    return create_impl(c, n_threads, base, lc, out);
}

void tn_tmodel_free(tn_tmodel *m) {
    if (!m) return;
    if (m->pool) tn_pool_free(m->pool);
    tn_free_aligned(m->params);
    tn_free_aligned(m->acts);
    tn_free_aligned(m->wtile);
    tn_free(m->t);
    tn_free(m);
}

void tn_tmodel_init_random(tn_tmodel *m, uint64_t seed) {
    uint64_t rng = seed ^ UINT64_C(0x7465726E2D696E69); /* "tern-ini" */
    const float std = 0.02f, std_res = 0.02f / sqrtf(2.0f * (float)m->cfg.n_layer);
    for (int i = 0; i < m->n_tensors; i++) {
        float *p = tn_tp(m, m->params, i);
        const tn_tparam *t = &m->t[i];
        if (t->n_dims == 1) { /* norm weights 1, biases 0 */
            const bool bias = t->role == TN_ROLE_ATTN_Q_B || t->role == TN_ROLE_ATTN_K_B || t->role == TN_ROLE_ATTN_V_B;
            for (size_t j = 0; j < t->n; j++) p[j] = bias ? 0.0f : 1.0f;
            continue;
        }
        float sd = (strstr(t->name, "attn_output") || strstr(t->name, "ffn_down")) ? std_res : std;
        for (size_t j = 0; j < t->n; j++) p[j] = (float)(tn_rng_normal(&rng) * sd);
    }
}

/* The source model's tensor for table entry i (output is tok_embd's view when tied). */
static const tn_tensor *source_tensor(const tn_tmodel *m, const tern_model *src, int i) {
    const int head = tn_tp_head(m);
    return i == 0 ? &src->tok_embd : i == head ? &src->output_norm : i == head + 1 ? &src->output
                  : &src->layers[(i - 1) / m->per_layer].w[m->t[i].role];
}

/* Whether src has m's family, shape and RoPE and no tensor the training block lacks; what names
 * src in messages ("--init model", "base model"). */
static tern_status check_source(const tn_tmodel *m, const tern_model *src, const char *what) {
    const tn_hparams *h = &src->hp;
    const tn_arch_desc *a = m->hp.family;
    if (h->family != a)
        return tn_err(TERN_ERR_UNSUPPORTED, "train: %s is of architecture %s; this training model is %s", what,
                      h->family ? h->family->name : "?", a->name);
    if (h->n_embd != m->cfg.n_embd || h->n_layer != m->cfg.n_layer || h->n_head != m->cfg.n_head ||
        h->n_head_kv != m->cfg.n_head_kv || h->n_ff != m->cfg.n_ff || h->n_vocab != m->cfg.n_vocab ||
        h->head_dim != m->hp.head_dim || h->n_rot != h->head_dim)
        return tn_err(TERN_ERR_UNSUPPORTED, "train: %s does not match the training shape (%s, n_embd %d, "
                      "%d layers, %d/%d heads of %d, n_ff %d, vocab %d, full RoPE)", what, a->name, m->cfg.n_embd, m->cfg.n_layer,
                      m->cfg.n_head, m->cfg.n_head_kv, m->hp.head_dim, m->cfg.n_ff, m->cfg.n_vocab);
    if (h->rope_mode != a->rope || h->rope_freq_scale != 1.0f || src->rope_freqs.data)
        return tn_err(TERN_ERR_UNSUPPORTED, "train: %s uses RoPE scaling, which training does not support", what);
    if (h->n_swa > 0 || h->logit_softcap > 0 || h->embd_scale > 0 || h->nope_step > 0)
        return tn_err(TERN_ERR_UNSUPPORTED, "train: %s uses sliding-window attention, soft-capping, embedding "
                      "scaling or NoPE layers, which training does not support", what);
    for (int l = 0; l < h->n_layer; l++)
        for (int r = 0; r < TN_ROLE_N_LAYER; r++) /* the training block: the family's required roles */
            if (src->layers[l].w[r].data && m->slot[r] < 0)
                return tn_err(TERN_ERR_UNSUPPORTED, "train: %s has tensor '%s', which training of %s does not "
                              "support (it trains the family's required tensors)", what, src->layers[l].w[r].name, a->name);
    const int head = tn_tp_head(m);
    for (int i = 0; i < head + 2; i++) {
        const tn_tparam *t = &m->t[i];
        const tn_tensor *st = source_tensor(m, src, i);
        if (!st->data || st->ne[0] != t->ne[0] || (t->n_dims == 2 && st->ne[1] != t->ne[1]))
            return tn_err(TERN_ERR_FORMAT, "train: %s tensor for '%s' has shape [%lld, %lld], expected [%lld, %lld]", what,
                          t->name, (long long)st->ne[0], (long long)st->ne[1], (long long)t->ne[0],
                          (long long)(t->n_dims == 1 ? 1 : t->ne[1]));
    }
    return TERN_OK;
}

/* ---- LoRA layout ---------------------------------------------------------------------------- */

static const struct { const char *name; tn_role role; } lora_targets[] = {
    {"q", TN_ROLE_ATTN_Q}, {"k", TN_ROLE_ATTN_K}, {"v", TN_ROLE_ATTN_V}, {"o", TN_ROLE_ATTN_OUT},
    {"gate", TN_ROLE_FFN_GATE}, {"up", TN_ROLE_FFN_UP}, {"down", TN_ROLE_FFN_DOWN},
};
#define N_LORA_TARGETS (sizeof lora_targets / sizeof lora_targets[0])

static uint32_t lora_default_targets(void) {
    uint32_t b = 0;
    for (size_t i = 0; i < N_LORA_TARGETS; i++) b |= 1u << lora_targets[i].role;
    return b;
}

bool tn_lora_parse_targets(const char *s, uint32_t *bits, char *bad, size_t cap) {
    *bits = 0;
    while (*s) {
        size_t n = strcspn(s, ",");
        size_t i = 0;
        while (i < N_LORA_TARGETS && (strlen(lora_targets[i].name) != n || strncmp(s, lora_targets[i].name, n))) i++;
        if (i == N_LORA_TARGETS) {
            if (cap) snprintf(bad, cap, "%.*s", (int)(n < 64 ? n : 64), s);
            return false;
        }
        *bits |= 1u << lora_targets[i].role;
        s += n;
        if (*s == ',') s++;
    }
    if (!*bits && cap) snprintf(bad, cap, "(empty)");
    return *bits != 0;
}

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Rewrites the sizes table for LoRA over base: matrices frozen in the base (no storage), norm
 * weights and biases kept (frozen), then lora_a, lora_b per adapted matrix (trained). */
static tern_status lora_layout(tn_tmodel *m, const tern_model *base, const tn_lora_cfg *lc) {
    tern_status s = check_source(m, base, "base model");
    if (s) return s;
    const uint32_t targets = lc->targets ? lc->targets : lora_default_targets();
    if (targets & ~lora_default_targets())
        return tn_err(TERN_ERR_INVALID_ARG, "train: LoRA targets must be among q, k, v, o, gate, up, down");
    if (lc->rank < 1 || lc->rank > 65536) return tn_err(TERN_ERR_INVALID_ARG, "train: LoRA rank %d out of range [1, 65536]", lc->rank);
    if (!(lc->alpha >= 0.0f) || !isfinite(lc->alpha)) return tn_err(TERN_ERR_INVALID_ARG, "train: LoRA alpha %g must be >= 0", (double)lc->alpha);
    const int64_t r = lc->rank;
    const int nb = m->n_tensors, head = tn_tp_head(m);
    int n = nb;
    size_t off = 0;
    int64_t max_k = 0;
    for (int i = 0; i < nb; i++) {
        tn_tparam *t = &m->t[i];
        t->frozen = true;
        if (t->n_dims == 1) { /* norm weights, biases: small, copied as f32 */
            t->off = off;
            off += align16(t->n);
            continue;
        }
        t->base = source_tensor(m, base, i);
        t->n = 0;
        t->off = 0;
        if (t->ne[0] > max_k) max_k = t->ne[0];
        if (i == 0 || i >= head || !(targets & (1u << t->role))) continue;
        if (r > t->ne[0] || r > t->ne[1])
            return tn_err(TERN_ERR_INVALID_ARG, "train: LoRA rank %d exceeds %s's dimensions [%lld, %lld]", lc->rank, t->name,
                          (long long)t->ne[0], (long long)t->ne[1]);
        t->lora = n;
        char bn[sizeof t->name];
        memcpy(bn, t->name, sizeof bn);
        for (int j = 0; j < 2; j++, n++) {
            tn_tparam *a = &m->t[n];
            if (snprintf(a->name, sizeof a->name, "%s.lora_%c", bn, j ? 'b' : 'a') >= (int)sizeof a->name)
                return tn_err(TERN_ERR_INTERNAL, "train: tensor name %s too long", t->name);
            a->role = t->role;
            a->n_dims = 2;
            a->ne[0] = j ? r : t->ne[0]; /* lora_a [rank][k], lora_b [m][rank] */
            a->ne[1] = j ? t->ne[1] : r;
            a->n = (size_t)(a->ne[0] * a->ne[1]);
            a->off = off;
            off += align16(a->n);
        }
        m->n_lora++;
    }
    if (!m->n_lora) return tn_err(TERN_ERR_INVALID_ARG, "train: no matrix of the model is a LoRA target");
    m->n_tensors = n;
    m->n_params = off;
    m->base = base;
    m->lora_rank = lc->rank;
    m->lora_alpha = lc->alpha > 0 ? lc->alpha : (float)lc->rank;
    m->lora_scale = m->lora_alpha / (float)lc->rank;
    m->base_int8 = lc->base_int8;
    /* a tile of about 4 MiB of dequantized rows */
    m->tile_rows = TN_MAX((int64_t)16, ((int64_t)1 << 20) / TN_MAX(max_k, (int64_t)1));
    return TERN_OK;
}

/* Norm weights and biases from the base; lora_a ~ U(-1/sqrt(k), 1/sqrt(k)) (kaiming-uniform with
 * a = sqrt(5), as PEFT), lora_b = 0, so the adapted model starts as the base. */
static void lora_init(tn_tmodel *m, uint64_t seed) {
    uint64_t rng = seed ^ UINT64_C(0x6C6F72612D696E69); /* "lora-ini" */
    for (int i = 0; i < m->n_tensors; i++) {
        const tn_tparam *t = &m->t[i];
        float *p = tn_tp(m, m->params, i);
        if (t->base && t->lora) { /* its lora_a */
            float *a = tn_tp(m, m->params, t->lora);
            const double bound = 1.0 / sqrt((double)t->ne[0]);
            for (size_t j = 0; j < m->t[t->lora].n; j++) a[j] = (float)((2.0 * tn_rng_unif(&rng) - 1.0) * bound);
        } else if (t->frozen && t->n_dims == 1) {
            tn_tensor_get_row(source_tensor(m, m->base, i), 0, p);
        }
    }
}

tern_status tn_tmodel_init_from(tn_tmodel *m, const tern_model *src) {
    tern_status s = check_source(m, src, "--init model");
    if (s) return s;
    for (int i = 0; i < tn_tp_head(m) + 2; i++) {
        const tn_tparam *t = &m->t[i];
        float *p = tn_tp(m, m->params, i);
        const int64_t rows = t->n_dims == 1 ? 1 : t->ne[1];
        for (int64_t r = 0; r < rows; r++) tn_tensor_get_row(source_tensor(m, src, i), r, p + r * t->ne[0]);
    }
    return TERN_OK;
}

tern_status tn_tmodel_plan(tn_tmodel *m, int B, int T) {
    if (m->acts) return tn_err(TERN_ERR_STATE, "train: activations already planned");
    if (B < 1 || T < 1 || T > m->cfg.n_ctx)
        return tn_err(TERN_ERR_INVALID_ARG, "train: batch %d x %d invalid (ctx %d)", B, T, m->cfg.n_ctx);
    if (m->recompute < TN_RECOMPUTE_NONE || m->recompute > TN_RECOMPUTE_FULL)
        return tn_err(TERN_ERR_INVALID_ARG, "train: recompute mode %d invalid", m->recompute);
    act_layout a;
    plan_acts(&m->cfg, B, T, m->n_threads, m->recompute, m->ce_rows, &a);
    const size_t extra = caches_floats(&m->cfg, B, T), lora = lora_scratch_floats(m, B, T);
    size_t bytes = (a.total + extra) * sizeof(float);
    tern_status s = check_fits(bytes + lora * sizeof(float), "activations");
    if (s) return s;
    m->acts = tn_malloc_aligned(bytes, 64);
    if (!m->acts)
        return tn_err(TERN_ERR_NOMEM, "train: activations for batch %d x %d need %.1f MiB; allocation failed", B, T,
                      bytes / 1048576.0);
    memset(m->acts, 0, bytes);
    m->acts_floats = a.total;
    m->B = B;
    m->T = T;
    m->rope_cs = m->acts + a.total;
    m->tokens = (int32_t *)(m->rope_cs + (size_t)T * m->hp.n_rot);
    m->targets = m->tokens + (size_t)B * T;
    m->row_loss = (float *)(m->targets + (size_t)B * T);
    for (int t = 0; t < T; t++) tn_op_rope_cache(&m->hp, NULL, t, m->rope_cs + (size_t)t * m->hp.n_rot);
    if (m->base) { /* LoRA scratch: the dequantized tile [tile_rows][max k], u, du [B*T][rank] */
        if (m->tile_rows < 1) m->tile_rows = 1;
        bytes = lora * sizeof(float);
        m->wtile = tn_malloc_aligned(bytes, 64);
        if (!m->wtile) return tn_err(TERN_ERR_NOMEM, "train: LoRA scratch needs %.1f MiB; allocation failed", bytes / 1048576.0);
        memset(m->wtile, 0, bytes);
        m->lora_u = m->wtile + (size_t)m->tile_rows * (size_t)lora_max_k(m);
        m->lora_du = m->lora_u + (((size_t)B * T * (size_t)m->lora_rank + 15) & ~(size_t)15);
        if (m->base_int8) { /* after du: x in the activation format, then the residual products */
            m->lora_tmp = m->lora_du + (((size_t)B * T * (size_t)m->lora_rank + 15) & ~(size_t)15);
            m->lora_xq = m->lora_tmp + (((size_t)B * T * (size_t)m->cfg.n_embd + 15) & ~(size_t)15);
        }
    }
    return TERN_OK;
}

/* ---- helpers -------------------------------------------------------------------------------- */

/* GEMMs: OpenBLAS runs single-threaded (openblas_set_num_threads(1)) inside tern's pool; each
 * thread takes a fixed slice of output rows, so the work split never oversubscribes the cores
 * and the reduction dimension is never split (results do not depend on timing). */
typedef struct gemm_task {
    int kind;           /* 0: out = in W^T, 1: dW += dout^T in, 2: din = dout W */
    const float *a, *b;
    float *c;
    int64_t N, k, mr;
    float beta;
} gemm_task;

static void gemm_fn(void *arg, int ith, int nth) {
    const gemm_task *g = arg;
    int64_t r0, r1;
    switch (g->kind) {
    case 0: /* out[N][mr] = in[N][k] W[mr][k]^T: rows of out */
        tn_split(g->N, ith, nth, 4, &r0, &r1);
        if (r1 > r0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), (int)g->mr, (int)g->k, 1.0f, g->a + r0 * g->k,
                        (int)g->k, g->b, (int)g->k, g->beta, g->c + r0 * g->mr, (int)g->mr);
        break;
    case 1: /* dW[mr][k] += dout[N][mr]^T in[N][k]: rows of dW */
        tn_split(g->mr, ith, nth, 4, &r0, &r1);
        if (r1 > r0)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(r1 - r0), (int)g->k, (int)g->N, 1.0f, g->a + r0,
                        (int)g->mr, g->b, (int)g->k, 1.0f, g->c + r0 * g->k, (int)g->k);
        break;
    case 2: /* din[N][k] = dout[N][mr] W[mr][k]: rows of din */
        tn_split(g->N, ith, nth, 4, &r0, &r1);
        if (r1 > r0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(r1 - r0), (int)g->k, (int)g->mr, 1.0f,
                        g->a + r0 * g->mr, (int)g->mr, g->b, (int)g->k, g->beta, g->c + r0 * g->k, (int)g->k);
        break;
    }
}

/* out[N][mr] (= or +=) in[N][k] * W[mr][k]^T */
static void lin_fwd_p(tn_pool *p, const float *in, const float *W, float *out, int64_t N, int64_t k, int64_t mr, float beta) {
    gemm_task g = {0, in, W, out, N, k, mr, beta};
    tn_pool_run(p, gemm_fn, &g);
}
/* dW[mr][k] += dout[N][mr]^T * in[N][k];  din[N][k] (= or +=) dout * W */
static void lin_bwd_p(tn_pool *p, const float *in, const float *W, const float *dout, float *dW, float *din, int64_t N,
                      int64_t k, int64_t mr, float beta_in) {
    gemm_task g = {1, dout, in, dW, N, k, mr, 1.0f};
    tn_pool_run(p, gemm_fn, &g);
    if (din) {
        gemm_task h = {2, dout, W, din, N, k, mr, beta_in};
        tn_pool_run(p, gemm_fn, &h);
    }
}

/* ---- LoRA: frozen base matrices, dequantized a tile of rows at a time ---------------------- */

typedef struct tile_task {
    const tn_tensor *w;  /* deq: rows r0 .. r0+tr of w into tile */
    float *tile;
    int kind;            /* 0: deq, 1: out[:, r0:r0+tr] = in tile^T (+beta), 2: din (+)= dout[:, r0:r0+tr] tile */
    const float *a;
    float *c;
    int64_t N, k, mr, r0, tr;
    float beta;
} tile_task;

static void tile_fn(void *arg, int ith, int nth) {
    const tile_task *g = arg;
    int64_t i0, i1;
    if (g->kind == 0) {
        tn_split(g->tr, ith, nth, 1, &i0, &i1);
        for (int64_t i = i0; i < i1; i++) tn_tensor_get_row(g->w, g->r0 + i, g->tile + i * g->k);
        return;
    }
    tn_split(g->N, ith, nth, 4, &i0, &i1);
    if (i1 <= i0) return;
    if (g->kind == 1)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(i1 - i0), (int)g->tr, (int)g->k, 1.0f, g->a + i0 * g->k,
                    (int)g->k, g->tile, (int)g->k, g->beta, g->c + i0 * g->mr + g->r0, (int)g->mr);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(i1 - i0), (int)g->k, (int)g->tr, 1.0f,
                    g->a + i0 * g->mr + g->r0, (int)g->mr, g->tile, (int)g->k, g->beta, g->c + i0 * g->k, (int)g->k);
}

/* base_int8: out[N][mr] (= or +=) in[N][k] W^T through inference's matmul driver: in quantized
 * into the activation format, the kernel table's products (int8 dot products), then for beta != 0
 * each thread adds its own output rows from tmp. */
typedef struct q8mm_task {
    tn_pool *pool;
    const tn_tensor *w;
    const float *in;
    float *out, *tmp;
    void *xq;
    int64_t N, k, mr;
    float beta;
} q8mm_task;

static void q8mm_fn(void *arg, int ith, int nth) {
    const q8mm_task *g = arg;
    const tn_kern_table *kt = tn_kern();
    tn_matmul_quantize_task(g->pool, ith, nth, kt, g->w->type, g->in, g->k, g->k, g->N, g->xq);
    float *y = g->beta != 0.0f ? g->tmp : g->out;
    tn_matmul_compute_task(ith, nth, kt, g->w->type, g->w->data, g->mr, g->k, g->xq, g->N, y, g->mr);
    if (g->beta == 0.0f) return;
    int64_t r0, r1;
    tn_matmul_rows(g->mr, ith, nth, &r0, &r1);
    for (int64_t t = 0; t < g->N; t++) {
        float *o = g->out + t * g->mr;
        const float *a = y + t * g->mr;
        for (int64_t r = r0; r < r1; r++) o[r] = g->beta * o[r] + a[r];
    }
}

/* out[N][mr] (= or +=) in[N][k] W^T, or (transposed) din[N][k] (= or +=) dout[N][mr] W, W frozen
 * in its file type: per tile of rows, the threads dequantize it, then each multiplies its rows;
 * with base_int8 the forward of a quantized W goes through q8mm_fn instead. */
static void frozen_mul(tn_tmodel *m, const tn_tensor *w, bool transposed, const float *in, float *out, int64_t N, int64_t k,
                       int64_t mr, float beta) {
    if (!transposed && m->base_int8 && m->lora_xq && lora_int8_type(w->type) &&
        N <= (int64_t)m->B * m->T && (beta == 0.0f || mr <= m->cfg.n_embd)) {
        q8mm_task g = {m->pool, w, in, out, m->lora_tmp, m->lora_xq, N, k, mr, beta};
        tn_pool_run(m->pool, q8mm_fn, &g);
        return;
    }
    for (int64_t r0 = 0; r0 < mr; r0 += m->tile_rows) {
        const int64_t tr = TN_MIN(m->tile_rows, mr - r0);
        tile_task d = {.w = w, .tile = m->wtile, .kind = 0, .k = k, .r0 = r0, .tr = tr};
        tn_pool_run(m->pool, tile_fn, &d);
        tile_task g = {.tile = m->wtile, .kind = transposed ? 2 : 1, .a = in, .c = out, .N = N, .k = k, .mr = mr,
                       .r0 = r0, .tr = tr, .beta = transposed && r0 > 0 ? 1.0f : beta};
        tn_pool_run(m->pool, tile_fn, &g);
    }
}

static void scale_rows(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* out[N][mr] (= or +=) in[N][k] W^T for table entry i: a dense parameter, or a frozen base
 * matrix plus its adapter: out += (s in A^T) B^T. */
static void lin_fwd_w_(tn_tmodel *m, int i, const float *in, float *out, int64_t N, int64_t k, int64_t mr, float beta) {
    const tn_tparam *t = &m->t[i];
    if (!t->base) { lin_fwd_p(m->pool, in, m->params + t->off, out, N, k, mr, beta); return; }
    frozen_mul(m, t->base, false, in, out, N, k, mr, beta);
    if (!t->lora) return;
    const int64_t r = m->lora_rank;
    const float *A = m->params + m->t[t->lora].off, *B = m->params + m->t[t->lora + 1].off;
    lin_fwd_p(m->pool, in, A, m->lora_u, N, k, r, 0.0f);        /* u = in A^T      [N][r] */
    scale_rows(m->lora_u, (size_t)(N * r), m->lora_scale);
    lin_fwd_p(m->pool, m->lora_u, B, out, N, r, mr, 1.0f);      /* out += (s u) B^T      */
}

/* Backward of lin_fwd_w: dW (dense) or dA, dB (adapter; the base gets none) and din (= or +=). */
static void lin_bwd_w_(tn_tmodel *m, int i, const float *in, const float *dout, float *din, int64_t N, int64_t k, int64_t mr,
                       float beta_in) {
    const tn_tparam *t = &m->t[i];
    if (!t->base) {
        lin_bwd_p(m->pool, in, m->params + t->off, dout, m->grads + t->off, din, N, k, mr, beta_in);
        return;
    }
    frozen_mul(m, t->base, true, dout, din, N, k, mr, beta_in);
    if (!t->lora) return;
    const int64_t r = m->lora_rank;
    const tn_tparam *ta = &m->t[t->lora], *tb = &m->t[t->lora + 1];
    float *u = m->lora_u, *du = m->lora_du;
    lin_fwd_p(m->pool, in, m->params + ta->off, u, N, k, r, 0.0f); /* u = in A^T, recomputed */
    scale_rows(u, (size_t)(N * r), m->lora_scale);
    /* dB += dout^T (s u); du = dout B */
    lin_bwd_p(m->pool, u, m->params + tb->off, dout, m->grads + tb->off, du, N, r, mr, 0.0f);
    scale_rows(du, (size_t)(N * r), m->lora_scale);
    /* dA += (s du)^T in; din += (s du) A */
    lin_bwd_p(m->pool, in, m->params + ta->off, du, m->grads + ta->off, din, N, k, r, 1.0f);
}

/* ---- tracing (core/trace.h) ----------------------------------------------------------------
 * Op spans are recorded on the thread that drives the pool (tn_pool_run returns when every thread
 * is done), so each op's span is its wall time; the caller's wait for the other threads nests in
 * it as a pool_join barrier. m->tr_il is the layer being run (-1 outside the layers). */
static const char *mm_trace_name(tn_role r, bool bwd) {
    switch (r) {
    case TN_ROLE_ATTN_Q: return bwd ? "attn_q_bwd" : "attn_q";
    case TN_ROLE_ATTN_K: return bwd ? "attn_k_bwd" : "attn_k";
    case TN_ROLE_ATTN_V: return bwd ? "attn_v_bwd" : "attn_v";
    case TN_ROLE_ATTN_OUT: return bwd ? "attn_out_bwd" : "attn_out";
    case TN_ROLE_FFN_GATE: return bwd ? "ffn_gate_bwd" : "ffn_gate";
    case TN_ROLE_FFN_UP: return bwd ? "ffn_up_bwd" : "ffn_up";
    case TN_ROLE_FFN_DOWN: return bwd ? "ffn_down_bwd" : "ffn_down";
    default: return bwd ? "output_bwd" : "output"; /* the only other matrix the trainer multiplies by */
    }
}

/* A traced matmul of table entry i: B carries the weight type and shape (m = mr out features, k,
 * n = N rows), E the flops of every GEMM it ran, the bytes of weights (and gradients) they read
 * or wrote, the pool's threads and the pass (1 forward, 2 backward). */
static void mm_trace(const tn_tmodel *m, int i, int64_t N, int64_t k, int64_t mr, bool bwd, bool begin) {
    const tn_tparam *t = &m->t[i];
    const char *name = mm_trace_name(t->role, bwd);
    const int il = i == tn_tp_head(m) + 1 ? -1 : m->tr_il;
    if (begin) {
        tn_trace_rec(TN_PH_BEGIN, TN_TK_MATMUL, name, il, 0, t->base ? (int64_t)t->base->type : (int64_t)TN_F32, mr, k, N);
        return;
    }
    const double r = t->lora ? (double)m->lora_rank : 0.0, lb = 4.0 * r * (double)(k + mr); /* adapter A, B bytes */
    double fl, by;
    if (!t->base) { /* dense f32: forward out = in W^T; backward dW += and din = */
        fl = (bwd ? 4.0 : 2.0) * (double)N * (double)k * (double)mr;
        by = (bwd ? 3.0 : 1.0) * 4.0 * (double)k * (double)mr;
    } else { /* frozen base (din only) plus the adapter: forward u, out +=; backward u, dB, du, dA, din */
        fl = 2.0 * (double)N * (double)k * (double)mr + (bwd ? 2.0 * (double)N * (3.0 * (double)k * r + 2.0 * r * (double)mr)
                                                             : 2.0 * (double)N * ((double)k * r + r * (double)mr));
        by = (double)tn_dtype_row_size(t->base->type, k) * (double)mr + (bwd ? 3.0 : 1.0) * lb;
    }
    tn_trace_rec(TN_PH_END, TN_TK_MATMUL, name, il, 0, (int64_t)fl, (int64_t)by, m->n_threads, bwd ? 2 : 1);
}

static void lin_fwd_w(tn_tmodel *m, int i, const float *in, float *out, int64_t N, int64_t k, int64_t mr, float beta) {
    if (!TN_TRACE_ON()) {
        lin_fwd_w_(m, i, in, out, N, k, mr, beta);
        return;
    }
    mm_trace(m, i, N, k, mr, false, true);
    lin_fwd_w_(m, i, in, out, N, k, mr, beta);
    mm_trace(m, i, N, k, mr, false, false);
}

static void lin_bwd_w(tn_tmodel *m, int i, const float *in, const float *dout, float *din, int64_t N, int64_t k, int64_t mr,
                      float beta_in) {
    if (!TN_TRACE_ON()) {
        lin_bwd_w_(m, i, in, dout, din, N, k, mr, beta_in);
        return;
    }
    mm_trace(m, i, N, k, mr, true, true);
    lin_bwd_w_(m, i, in, dout, din, N, k, mr, beta_in);
    mm_trace(m, i, N, k, mr, true, false);
}

/* 8 independent partial sums so the compiler vectorizes (order fixed: deterministic). */
static inline float dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
static inline void axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

typedef struct task {
    tn_tmodel *m;
    int op;
    const float *x, *w;
    float *y, *y2, *y3, *dw;
    const float *x2, *x3;
    int64_t n, d;
    const int32_t *targets;
    bool grad;
} task;

enum { OP_RMSNORM, OP_RMSNORM_BWD, OP_ROPE, OP_ROPE_BWD, OP_SWIGLU, OP_SWIGLU_BWD, OP_ATTN, OP_CE, OP_BIAS, OP_BIAS_BWD };

static void attn_fwd_one(tn_tmodel *m, const task *tk, int64_t b, int64_t kvh) {
    const int64_t T = m->T, H = m->cfg.n_head, hd = m->hp.head_dim, C = H * hd; /* C: q and y rows */
    const int64_t KV = m->cfg.n_head_kv * hd, grp = H / m->cfg.n_head_kv;
    const float *q = tk->x, *k = tk->x2, *v = tk->x3;
    float *att = tk->y2, *y = tk->y;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t h = kvh * grp; h < (kvh + 1) * grp; h++) {
        for (int64_t t = 0; t < T; t++) {
            const float *qr = q + (b * T + t) * C + h * hd;
            float *a = att + ((b * H + h) * T + t) * T;
            float mx = -INFINITY;
            for (int64_t s = 0; s <= t; s++) {
                a[s] = dot(qr, k + (b * T + s) * KV + kvh * hd, hd) * scale;
                if (a[s] > mx) mx = a[s];
            }
            float sum = 0.0f;
            for (int64_t s = 0; s <= t; s++) {
                a[s] = expf(a[s] - mx);
                sum += a[s];
            }
            const float inv = 1.0f / sum;
            float *yr = y + (b * T + t) * C + h * hd;
            memset(yr, 0, (size_t)hd * sizeof(float));
            for (int64_t s = 0; s <= t; s++) {
                a[s] *= inv;
                axpy(yr, a[s], v + (b * T + s) * KV + kvh * hd, hd);
            }
            for (int64_t s = t + 1; s < T; s++) a[s] = 0.0f;
        }
    }
}

/* x=q x2=k x3=v x(w)=att, y=dy in, outputs y2=dq y3=dk dw=dv */
static void attn_bwd_one(tn_tmodel *m, const task *tk, int64_t b, int64_t kvh, float *datt) {
    const int64_t T = m->T, H = m->cfg.n_head, hd = m->hp.head_dim, C = H * hd; /* C: q and y rows */
    const int64_t KV = m->cfg.n_head_kv * hd, grp = H / m->cfg.n_head_kv;
    const float *q = tk->x, *k = tk->x2, *v = tk->x3, *att = tk->w, *dy = tk->y;
    float *dq = tk->y2, *dk = tk->y3, *dv = tk->dw;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t t = 0; t < T; t++) {
        memset(dk + (b * T + t) * KV + kvh * hd, 0, (size_t)hd * sizeof(float));
        memset(dv + (b * T + t) * KV + kvh * hd, 0, (size_t)hd * sizeof(float));
    }
    for (int64_t h = kvh * grp; h < (kvh + 1) * grp; h++) {
        for (int64_t t = 0; t < T; t++) {
            const float *a = att + ((b * H + h) * T + t) * T;
            const float *dyr = dy + (b * T + t) * C + h * hd;
            const float *qr = q + (b * T + t) * C + h * hd;
            float dsum = 0.0f;
            for (int64_t s = 0; s <= t; s++) {
                datt[s] = dot(dyr, v + (b * T + s) * KV + kvh * hd, hd);
                axpy(dv + (b * T + s) * KV + kvh * hd, a[s], dyr, hd);
                dsum += a[s] * datt[s];
            }
            float *dqr = dq + (b * T + t) * C + h * hd;
            memset(dqr, 0, (size_t)hd * sizeof(float));
            for (int64_t s = 0; s <= t; s++) {
                const float ds = a[s] * (datt[s] - dsum) * scale;
                axpy(dqr, ds, k + (b * T + s) * KV + kvh * hd, hd);
                axpy(dk + (b * T + s) * KV + kvh * hd, ds, qr, hd);
            }
        }
    }
}

static void rmsnorm_bwd_row(const float *x, const float *w, const float *dy, float *dx, float *dw, int64_t d, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < d; i++) ss += (double)(x[i] * x[i]);
    const float r = 1.0f / sqrtf((float)(ss / (double)d) + eps);
    float dot_ = 0.0f;
    for (int64_t i = 0; i < d; i++) {
        dot_ += dy[i] * w[i] * x[i];
        dw[i] += dy[i] * x[i] * r;
    }
    const float c = dot_ * r * r * r / (float)d;
    for (int64_t i = 0; i < d; i++) dx[i] += r * w[i] * dy[i] - c * x[i];
}

static void task_fn(void *arg, int ith, int nth) {
    task *tk = arg;
    tn_tmodel *m = tk->m;
    int64_t r0, r1;
    const int64_t T = m->T;
    switch (tk->op) {
    case OP_RMSNORM:
        tn_split(tk->n, ith, nth, 1, &r0, &r1);
        for (int64_t i = r0; i < r1; i++) tn_op_rmsnorm(tk->x + i * tk->d, tk->y + i * tk->d, tk->w, tk->d, m->hp.rms_eps);
        break;
    case OP_RMSNORM_BWD: { /* x2 = dy, y = dx (+=), dw partial per thread */
        float *dw = tk->dw + (size_t)ith * tk->d;
        memset(dw, 0, (size_t)tk->d * sizeof(float));
        tn_split(tk->n, ith, nth, 1, &r0, &r1);
        for (int64_t i = r0; i < r1; i++)
            rmsnorm_bwd_row(tk->x + i * tk->d, tk->w, tk->x2 + i * tk->d, tk->y + i * tk->d, dw, tk->d, m->hp.rms_eps);
        break;
    }
    case OP_ROPE:
    case OP_ROPE_BWD: { /* y = q rows [n][Q], y2 = k rows [n][KV]; the backward rotates back */
        const float sign = tk->op == OP_ROPE ? 1.0f : -1.0f;
        const int64_t KV = (int64_t)m->cfg.n_head_kv * m->hp.head_dim, Q = tn_hp_q_dim(&m->hp);
        tn_split(tk->n, ith, nth, 1, &r0, &r1);
        for (int64_t i = r0; i < r1; i++) {
            const float *cs = m->rope_cs + (i % T) * m->hp.n_rot;
            tn_op_rope(&m->hp, tk->y + i * Q, m->cfg.n_head, cs, sign);
            tn_op_rope(&m->hp, tk->y2 + i * KV, m->cfg.n_head_kv, cs, sign);
        }
        break;
    }
    case OP_SWIGLU: { /* x = g, x2 = u, y = h; the scalar reference (libm expf, as the backward) */
        const tn_swiglu_fn swiglu = tn_kern_at(TN_ISA_SCALAR)->swiglu;
        tn_split(tk->n, ith, nth, 1, &r0, &r1);
        for (int64_t i = r0; i < r1; i++) {
            memcpy(tk->y + i * tk->d, tk->x + i * tk->d, (size_t)tk->d * sizeof(float));
            swiglu(tk->y + i * tk->d, tk->x2 + i * tk->d, tk->d);
        }
        break;
    }
    case OP_SWIGLU_BWD: { /* x = g, x2 = u, x3 = dh, y = dg, y2 = du */
        tn_split(tk->n * tk->d, ith, nth, 64, &r0, &r1);
        for (int64_t i = r0; i < r1; i++) {
            const float g = tk->x[i], s = 1.0f / (1.0f + expf(-g)), dh = tk->x3[i];
            tk->y2[i] = dh * g * s;
            tk->y[i] = dh * tk->x2[i] * s * (1.0f + g * (1.0f - s));
        }
        break;
    }
    case OP_ATTN: {
        const int64_t nkv = m->cfg.n_head_kv;
        tn_split((int64_t)m->B * nkv, ith, nth, 1, &r0, &r1);
        for (int64_t p = r0; p < r1; p++) attn_fwd_one(m, tk, p / nkv, p % nkv);
        break;
    }
    case OP_CE: { /* y = logits [n][V] → probs / dlogits; dw = row losses [n]; d = targets not masked (-1) */
        const int64_t V = m->cfg.n_vocab;
        const float inv_n = 1.0f / (float)(tk->d > 0 ? tk->d : 1);
        tn_split(tk->n, ith, nth, 1, &r0, &r1);
        for (int64_t i = r0; i < r1; i++) {
            float *l = tk->y + i * V;
            float mx = -INFINITY;
            for (int64_t j = 0; j < V; j++) mx = l[j] > mx ? l[j] : mx;
            double sum = 0.0;
            for (int64_t j = 0; j < V; j++) sum += (double)expf(l[j] - mx);
            const int32_t tg = tk->targets[i];
            if (tg < 0) { /* masked: no loss, no gradient */
                tk->dw[i] = 0.0f;
                if (tk->grad) memset(l, 0, (size_t)V * sizeof(float));
                continue;
            }
            tk->dw[i] = (float)(log(sum) + (double)mx - (double)l[tg]);
            if (tk->grad) {
                const float inv = (float)(1.0 / sum);
                for (int64_t j = 0; j < V; j++) l[j] = expf(l[j] - mx) * inv * inv_n;
                l[tg] -= inv_n;
            }
        }
        break;
    }
    case OP_BIAS: /* y [n][d] += w per row */
        tn_split(tk->n, ith, nth, 1, &r0, &r1);
        for (int64_t i = r0; i < r1; i++)
            for (int64_t j = 0; j < tk->d; j++) tk->y[i * tk->d + j] += tk->w[j];
        break;
    case OP_BIAS_BWD: /* dw[j] += sum over rows of x[i][j]: columns split, rows in order (any thread count) */
        tn_split(tk->d, ith, nth, 16, &r0, &r1);
        for (int64_t i = 0; i < tk->n; i++)
            for (int64_t j = r0; j < r1; j++) tk->dw[j] += tk->x[i * tk->d + j];
        break;
    }
}

static void run(tn_tmodel *m, task *tk) {
    tk->m = m;
    if (!TN_TRACE_ON()) {
        tn_pool_run(m->pool, task_fn, tk);
        return;
    }
    static const struct { uint8_t kind; const char *name; } ops[] = {
        [OP_RMSNORM] = {TN_TK_NORM, "rmsnorm"},        [OP_RMSNORM_BWD] = {TN_TK_NORM, "rmsnorm_bwd"},
        [OP_ROPE] = {TN_TK_ROPE, "rope"},              [OP_ROPE_BWD] = {TN_TK_ROPE, "rope_bwd"},
        [OP_SWIGLU] = {TN_TK_ACTIVATION, "swiglu"},    [OP_SWIGLU_BWD] = {TN_TK_ACTIVATION, "swiglu_bwd"},
        [OP_ATTN] = {TN_TK_ATTENTION, "attention"},    [OP_CE] = {TN_TK_LOSS, "cross_entropy"},
        [OP_BIAS] = {TN_TK_ACTIVATION, "bias"},        [OP_BIAS_BWD] = {TN_TK_ACTIVATION, "bias_bwd"},
    };
    const uint8_t kind = ops[tk->op].kind;
    int64_t a0 = tk->n, a1 = tk->d; /* norm, activation, loss: rows, row length */
    if (kind == TN_TK_ATTENTION) a0 = (int64_t)m->B * m->cfg.n_head_kv, a1 = m->cfg.n_head / m->cfg.n_head_kv;
    if (kind == TN_TK_ROPE) a0 = m->cfg.n_head, a1 = m->cfg.n_head_kv;
    tn_trace_rec(TN_PH_BEGIN, kind, ops[tk->op].name, m->tr_il, 0, a0, a1, 0, 0);
    tn_pool_run(m->pool, task_fn, tk);
    tn_trace_rec(TN_PH_END, ops[tk->op].kind, ops[tk->op].name, m->tr_il, 0, 0, 0, 0, 0);
}

/* attention backward needs a per-thread [T] scratch: run it through a dedicated task. */
typedef struct attn_bwd_task {
    task tk;
    float *datt;
} attn_bwd_task;
static void attn_bwd_fn(void *arg, int ith, int nth) {
    attn_bwd_task *a = arg;
    tn_tmodel *m = a->tk.m;
    const int64_t nkv = m->cfg.n_head_kv;
    int64_t r0, r1;
    tn_split((int64_t)m->B * nkv, ith, nth, 1, &r0, &r1);
    for (int64_t p = r0; p < r1; p++) attn_bwd_one(m, &a->tk, p / nkv, p % nkv, a->datt + (size_t)ith * m->T);
}

/* ---- forward -------------------------------------------------------------------------------- */

static act_layout layout_of(const tn_tmodel *m) {
    act_layout a;
    plan_acts(&m->cfg, m->B, m->T, m->n_threads, m->recompute, m->ce_rows, &a);
    return a;
}

/* Layer l's buffer f: kept per layer, or the one copy backward recomputes into. */
static float *lbuf(const tn_tmodel *m, const act_layout *a, int f, int l) {
    return m->acts + a->off[f] + (a->kept[f] ? a->per_layer * (size_t)l : 0);
}

/* Layer l's forward from its kept input x_in. recompute: backward's rerun into the buffers it
 * does not keep, the same ops in the same order (bit-identical values), without the last
 * projection (x_out, the next layer's input, is kept). */
static void layer_fwd(tn_tmodel *m, const act_layout *ap, int l, bool recompute) {
    const act_layout a = *ap;
    const int64_t N = (int64_t)m->B * m->T, C = m->cfg.n_embd, F = m->cfg.n_ff;
    const int64_t hd = m->hp.head_dim, Q = tn_hp_q_dim(&m->hp), KV = (int64_t)m->cfg.n_head_kv * hd;
    float *P = m->params;
    /* the block's optional steps (the family's roles): q/k/v biases, per-head q/k RMSNorm */
    const bool qb = m->slot[TN_ROLE_ATTN_Q_B] >= 0, kb = m->slot[TN_ROLE_ATTN_K_B] >= 0, vb = m->slot[TN_ROLE_ATTN_V_B] >= 0;
    const bool qn = m->slot[TN_ROLE_ATTN_Q_NORM] >= 0, kn = m->slot[TN_ROLE_ATTN_K_NORM] >= 0;
#define LB(f) lbuf(m, &a, f, l)
    float *x_in = LB(AK_X_IN), *xn1 = LB(AK_XN1), *q = LB(AK_Q), *k = LB(AK_K), *v = LB(AK_V), *att = LB(AK_ATT);
    float *y = LB(AK_Y), *x_mid = LB(AK_X_MID), *xn2 = LB(AK_XN2), *g = LB(AK_G), *u = LB(AK_U), *h = LB(AK_H);
    float *q0 = qn ? LB(AK_QN) : q, *k0 = kn ? LB(AK_KN) : k; /* the projections, before a q/k norm */
#undef LB
    float *x_out = l + 1 < m->cfg.n_layer ? lbuf(m, &a, AK_X_IN, l + 1) : m->acts + a.x_fin;
#define PW(r) tn_tp(m, P, tn_tp_role(m, l, r))
#define LIN(r, ...) lin_fwd_w(m, tn_tp_role(m, l, r), __VA_ARGS__)
    /* xn1 = rmsnorm(x_in) * attn_norm                        [N][C] */
    run(m, &(task){.op = OP_RMSNORM, .x = x_in, .y = xn1, .w = PW(TN_ROLE_ATTN_NORM), .n = N, .d = C});
    /* q0 [N][Q], k0, v [N][KV] (+ biases)                                                 */
    LIN(TN_ROLE_ATTN_Q, xn1, q0, N, C, Q, 0.0f);
    LIN(TN_ROLE_ATTN_K, xn1, k0, N, C, KV, 0.0f);
    LIN(TN_ROLE_ATTN_V, xn1, v, N, C, KV, 0.0f);
    if (qb) run(m, &(task){.op = OP_BIAS, .y = q0, .w = PW(TN_ROLE_ATTN_Q_B), .n = N, .d = Q});
    if (kb) run(m, &(task){.op = OP_BIAS, .y = k0, .w = PW(TN_ROLE_ATTN_K_B), .n = N, .d = KV});
    if (vb) run(m, &(task){.op = OP_BIAS, .y = v, .w = PW(TN_ROLE_ATTN_V_B), .n = N, .d = KV});
    /* q = rmsnorm(q0 per head) * attn_q_norm, k likewise     [N*H][hd] rows              */
    if (qn) run(m, &(task){.op = OP_RMSNORM, .x = q0, .y = q, .w = PW(TN_ROLE_ATTN_Q_NORM), .n = N * m->cfg.n_head, .d = hd});
    if (kn) run(m, &(task){.op = OP_RMSNORM, .x = k0, .y = k, .w = PW(TN_ROLE_ATTN_K_NORM), .n = N * m->cfg.n_head_kv, .d = hd});
    /* RoPE on q, k (the family's mode: adjacent pairs or halves)                          */
    run(m, &(task){.op = OP_ROPE, .y = q, .y2 = k, .n = N});
    /* causal GQA attention: att [B][H][T][T] probabilities, y [N][Q]                    */
    run(m, &(task){.op = OP_ATTN, .x = q, .x2 = k, .x3 = v, .y = y, .y2 = att});
    /* x_mid = x_in + y * Wo^T                                                            */
    memcpy(x_mid, x_in, (size_t)(N * C) * sizeof(float));
    LIN(TN_ROLE_ATTN_OUT, y, x_mid, N, Q, C, 1.0f);
    /* xn2 = rmsnorm(x_mid) * ffn_norm; g, u [N][F]; h = silu(g) * u; x_out = x_mid + h Wd^T */
    run(m, &(task){.op = OP_RMSNORM, .x = x_mid, .y = xn2, .w = PW(TN_ROLE_FFN_NORM), .n = N, .d = C});
    LIN(TN_ROLE_FFN_GATE, xn2, g, N, C, F, 0.0f);
    LIN(TN_ROLE_FFN_UP, xn2, u, N, C, F, 0.0f);
    run(m, &(task){.op = OP_SWIGLU, .x = g, .x2 = u, .y = h, .n = N, .d = F});
    if (!recompute) {
        memcpy(x_out, x_mid, (size_t)(N * C) * sizeof(float));
        LIN(TN_ROLE_FFN_DOWN, h, x_out, N, F, C, 1.0f);
    }
#undef PW
#undef LIN
}

tern_status tn_tmodel_forward(tn_tmodel *m, const int32_t *tokens, const int32_t *targets, double *loss) {
    if (!m->acts) return tn_err(TERN_ERR_STATE, "train: forward before tn_tmodel_plan");
    const act_layout a = layout_of(m);
    const int64_t N = (int64_t)m->B * m->T, C = m->cfg.n_embd, V = m->cfg.n_vocab;
    for (int64_t i = 0; i < N; i++) {
        if (tokens[i] < 0 || tokens[i] >= V || (targets && (targets[i] < -1 || targets[i] >= V)))
            return tn_err(TERN_ERR_INVALID_ARG, "train: token id out of range [0, %lld) at %lld (targets: -1 = masked)",
                          (long long)V, (long long)i);
        m->tokens[i] = tokens[i];
        if (targets) m->targets[i] = targets[i];
    }
    float *P = m->params;
    /* trace: forward > embed, layer 0, 1, ..., output (norm, logits, loss), back to back */
    m->tr_il = -1;
    TN_SPAN_B(TN_TK_PHASE, "forward", -1, N, 0, 0, 0);
    TN_SPAN_B(TN_TK_EMBED, "embed", -1, 0, 0, 0, 0);
    /* x = token_embd[tokens]                                   [N][C] */
    float *x = lbuf(m, &a, AK_X_IN, 0);
    if (m->t[0].base) {
        for (int64_t i = 0; i < N; i++) tn_tensor_get_row(m->t[0].base, m->tokens[i], x + i * C);
    } else {
        const float *emb = tn_tp(m, P, 0);
        for (int64_t i = 0; i < N; i++) memcpy(x + i * C, emb + (int64_t)m->tokens[i] * C, (size_t)C * sizeof(float));
    }
    for (int l = 0; l < m->cfg.n_layer; l++) {
        if (l == 0) TN_SPAN_NEXT(TN_TK_EMBED, "embed", -1, TN_TK_LAYER, "layer", 0);
        else TN_SPAN_NEXT(TN_TK_LAYER, "layer", l - 1, TN_TK_LAYER, "layer", l);
        m->tr_il = l;
        layer_fwd(m, &a, l, false);
    }
    if (m->cfg.n_layer > 0) TN_SPAN_NEXT(TN_TK_LAYER, "layer", m->cfg.n_layer - 1, TN_TK_OUTPUT, "output", -1);
    else TN_SPAN_NEXT(TN_TK_EMBED, "embed", -1, TN_TK_OUTPUT, "output", -1);
    m->tr_il = -1;
    /* xf = rmsnorm(x_fin) * output_norm                            [N][C] */
    float *xf = m->acts + a.xf;
    const int on = tn_tp_head(m);
    run(m, &(task){.op = OP_RMSNORM, .x = m->acts + a.x_fin, .y = xf, .w = tn_tp(m, P, on), .n = N, .d = C});
    int64_t n_valid = 0;
    if (targets)
        for (int64_t i = 0; i < N; i++) n_valid += m->targets[i] >= 0;
    /* the denominator of the loss gradient: the valid targets (gradient accumulation: the whole
     * batch's, m->ce_denom); backward of a chunked head reuses it */
    m->ce_d = m->ce_denom > 0 ? m->ce_denom : n_valid;
    if ((int64_t)a.ce_rows >= N) {
        /* one chunk: logits = xf output^T [N][V]; with targets, cross-entropy fused with softmax
         * turns them into dlogits = (p - onehot) / d in place for backward */
        lin_fwd_w(m, on + 1, xf, m->acts + a.logits, N, C, V, 0.0f);
        if (targets) run(m, &(task){.op = OP_CE, .y = m->acts + a.logits, .dw = m->row_loss, .targets = m->targets, .n = N,
                                    .d = m->ce_d, .grad = true});
    } else {
        /* chunks of ce_rows rows: logits [ce_rows][V] and the loss only; backward recomputes each
         * chunk's logits (tn_tmodel_backward). The last chunk's logits stay. */
        for (int64_t r0 = 0; r0 < N; r0 += (int64_t)a.ce_rows) {
            const int64_t rows = TN_MIN((int64_t)a.ce_rows, N - r0);
            lin_fwd_w(m, on + 1, xf + r0 * C, m->acts + a.logits, rows, C, V, 0.0f);
            if (targets) run(m, &(task){.op = OP_CE, .y = m->acts + a.logits, .dw = m->row_loss + r0, .targets = m->targets + r0,
                                        .n = rows, .d = m->ce_d, .grad = false});
        }
    }
    if (targets) {
        double sum = 0.0;
        for (int64_t i = 0; i < N; i++) sum += (double)m->row_loss[i];
        if (loss) *loss = n_valid ? sum / (double)n_valid : 0.0;
    }
    TN_SPAN_E(TN_TK_OUTPUT, "output", -1, 0, 0);
    TN_SPAN_E(TN_TK_PHASE, "forward", -1, 0, 0);
    return TERN_OK;
}

const float *tn_tmodel_logits(const tn_tmodel *m, int64_t i) {
    const act_layout a = layout_of(m);
    const int64_t N = (int64_t)m->B * m->T, rows = (int64_t)a.ce_rows, last = (N - 1) / rows * rows;
    if (i < 0 || i >= N || (rows < N && i < last)) return NULL; /* chunked: the last chunk's rows only */
    return m->acts + a.logits + (i - (rows < N ? last : 0)) * m->cfg.n_vocab;
}

void tn_tmodel_zero_grad(tn_tmodel *m) { memset(m->grads, 0, m->n_params * sizeof(float)); }

/* Sums the per-thread dw partials of an RMSNorm backward into the gradient (thread order). */
static void reduce_dw(tn_tmodel *m, const float *parts, float *grad, int64_t d) {
    for (int t = 0; t < m->n_threads; t++)
        for (int64_t i = 0; i < d; i++) grad[i] += parts[(size_t)t * d + i];
}

void tn_tmodel_backward(tn_tmodel *m) {
    const act_layout a = layout_of(m);
    const int64_t N = (int64_t)m->B * m->T, C = m->cfg.n_embd, F = m->cfg.n_ff, V = m->cfg.n_vocab;
    const int64_t hd = m->hp.head_dim, Q = tn_hp_q_dim(&m->hp), KV = (int64_t)m->cfg.n_head_kv * hd;
    float *P = m->params, *G = m->grads, *S = m->acts;
    float *dres = S + a.dres, *dxn = S + a.dxn, *dq = S + a.dq, *dk = S + a.dk, *dv = S + a.dv, *dy = S + a.dy;
    float *dh = S + a.dh, *dg = S + a.dg, *du = S + a.du, *dwp = S + a.dw;
    const bool qb = m->slot[TN_ROLE_ATTN_Q_B] >= 0, kb = m->slot[TN_ROLE_ATTN_K_B] >= 0, vb = m->slot[TN_ROLE_ATTN_V_B] >= 0;
    const bool qn = m->slot[TN_ROLE_ATTN_Q_NORM] >= 0, kn = m->slot[TN_ROLE_ATTN_K_NORM] >= 0;
    float *dq0 = qn ? S + a.dqn : dq, *dk0 = kn ? S + a.dkn : dk; /* gradients of the projections */
    /* trace: backward > output, layer n-1, ..., 0, embed, back to back */
    m->tr_il = -1;
    TN_SPAN_B(TN_TK_PHASE, "backward", -1, N, 0, 0, 0);
    TN_SPAN_B(TN_TK_OUTPUT, "output", -1, 0, 0, 0, 0);
    /* head: dlogits (in logits) → d output, dxf → output_norm → dres */
    const int on = tn_tp_head(m);
    if ((int64_t)a.ce_rows >= N) lin_bwd_w(m, on + 1, S + a.xf, S + a.logits, dxn, N, C, V, 0.0f);
    else /* chunked: per chunk the logits again, their gradient, d output += and dxf rows */
        for (int64_t r0 = 0; r0 < N; r0 += (int64_t)a.ce_rows) {
            const int64_t rows = TN_MIN((int64_t)a.ce_rows, N - r0);
            lin_fwd_w(m, on + 1, S + a.xf + r0 * C, S + a.logits, rows, C, V, 0.0f);
            run(m, &(task){.op = OP_CE, .y = S + a.logits, .dw = m->row_loss + r0, .targets = m->targets + r0, .n = rows,
                           .d = m->ce_d, .grad = true});
            lin_bwd_w(m, on + 1, S + a.xf + r0 * C, S + a.logits, dxn + r0 * C, rows, C, V, 0.0f);
        }
    memset(dres, 0, (size_t)(N * C) * sizeof(float));
    run(m, &(task){.op = OP_RMSNORM_BWD, .x = S + a.x_fin, .w = tn_tp(m, P, on), .x2 = dxn, .y = dres, .dw = dwp, .n = N, .d = C});
    reduce_dw(m, dwp, tn_tp(m, G, on), C);
    for (int l = m->cfg.n_layer - 1; l >= 0; l--) {
        if (l == m->cfg.n_layer - 1) TN_SPAN_NEXT(TN_TK_OUTPUT, "output", -1, TN_TK_LAYER, "layer", l);
        else TN_SPAN_NEXT(TN_TK_LAYER, "layer", l + 1, TN_TK_LAYER, "layer", l);
        m->tr_il = l;
        /* what forward did not keep: rerun the layer (full) or its attention core (attn); the last
         * layer's are still in the shared buffers from the forward */
        if (l == m->cfg.n_layer - 1) {
        } else if (m->recompute == TN_RECOMPUTE_FULL) layer_fwd(m, &a, l, true);
        else if (m->recompute == TN_RECOMPUTE_ATTN)
            run(m, &(task){.op = OP_ATTN, .x = lbuf(m, &a, AK_Q, l), .x2 = lbuf(m, &a, AK_K, l), .x3 = lbuf(m, &a, AK_V, l),
                           .y = lbuf(m, &a, AK_Y, l), .y2 = lbuf(m, &a, AK_ATT, l)});
#define L(f) lbuf(m, &a, f, l)
#define PW(r) tn_tp(m, P, tn_tp_role(m, l, r))
#define GW(r) tn_tp(m, G, tn_tp_role(m, l, r))
#define LINB(r, in, dout, din, ...) lin_bwd_w(m, tn_tp_role(m, l, r), in, dout, din, __VA_ARGS__)
        /* FFN: x_out = x_mid + h Wd^T */
        LINB(TN_ROLE_FFN_DOWN, L(AK_H), dres, dh, N, F, C, 0.0f);
        run(m, &(task){.op = OP_SWIGLU_BWD, .x = L(AK_G), .x2 = L(AK_U), .x3 = dh, .y = dg, .y2 = du, .n = N, .d = F});
        LINB(TN_ROLE_FFN_GATE, L(AK_XN2), dg, dxn, N, C, F, 0.0f);
        LINB(TN_ROLE_FFN_UP, L(AK_XN2), du, dxn, N, C, F, 1.0f);
        run(m, &(task){.op = OP_RMSNORM_BWD, .x = L(AK_X_MID), .w = PW(TN_ROLE_FFN_NORM), .x2 = dxn, .y = dres, .dw = dwp, .n = N, .d = C});
        reduce_dw(m, dwp, GW(TN_ROLE_FFN_NORM), C);
        /* attention: x_mid = x_in + y Wo^T */
        LINB(TN_ROLE_ATTN_OUT, L(AK_Y), dres, dy, N, Q, C, 0.0f);
        attn_bwd_task at = {.tk = {.m = m, .x = L(AK_Q), .x2 = L(AK_K), .x3 = L(AK_V), .w = L(AK_ATT), .y = dy,
                                   .y2 = dq, .y3 = dk, .dw = dv},
                            .datt = S + a.datt};
        TN_SPAN_B(TN_TK_ATTENTION, "attention_bwd", l, (int64_t)m->B * m->cfg.n_head_kv, m->cfg.n_head / m->cfg.n_head_kv, 0, 0);
        tn_pool_run(m->pool, attn_bwd_fn, &at);
        TN_SPAN_E(TN_TK_ATTENTION, "attention_bwd", l, 0, 0);
        run(m, &(task){.op = OP_ROPE_BWD, .y = dq, .y2 = dk, .n = N});
        /* per-head q/k RMSNorm: dq0 = d(q0), weight gradients */
        if (qn) {
            memset(dq0, 0, (size_t)(N * Q) * sizeof(float));
            run(m, &(task){.op = OP_RMSNORM_BWD, .x = L(AK_QN), .w = PW(TN_ROLE_ATTN_Q_NORM), .x2 = dq, .y = dq0, .dw = dwp,
                           .n = N * m->cfg.n_head, .d = hd});
            reduce_dw(m, dwp, GW(TN_ROLE_ATTN_Q_NORM), hd);
        }
        if (kn) {
            memset(dk0, 0, (size_t)(N * KV) * sizeof(float));
            run(m, &(task){.op = OP_RMSNORM_BWD, .x = L(AK_KN), .w = PW(TN_ROLE_ATTN_K_NORM), .x2 = dk, .y = dk0, .dw = dwp,
                           .n = N * m->cfg.n_head_kv, .d = hd});
            reduce_dw(m, dwp, GW(TN_ROLE_ATTN_K_NORM), hd);
        }
        if (qb) run(m, &(task){.op = OP_BIAS_BWD, .x = dq0, .dw = GW(TN_ROLE_ATTN_Q_B), .n = N, .d = Q});
        if (kb) run(m, &(task){.op = OP_BIAS_BWD, .x = dk0, .dw = GW(TN_ROLE_ATTN_K_B), .n = N, .d = KV});
        if (vb) run(m, &(task){.op = OP_BIAS_BWD, .x = dv, .dw = GW(TN_ROLE_ATTN_V_B), .n = N, .d = KV});
        LINB(TN_ROLE_ATTN_Q, L(AK_XN1), dq0, dxn, N, C, Q, 0.0f);
        LINB(TN_ROLE_ATTN_K, L(AK_XN1), dk0, dxn, N, C, KV, 1.0f);
        LINB(TN_ROLE_ATTN_V, L(AK_XN1), dv, dxn, N, C, KV, 1.0f);
        run(m, &(task){.op = OP_RMSNORM_BWD, .x = L(AK_X_IN), .w = PW(TN_ROLE_ATTN_NORM), .x2 = dxn, .y = dres, .dw = dwp, .n = N, .d = C});
        reduce_dw(m, dwp, GW(TN_ROLE_ATTN_NORM), C);
#undef L
#undef PW
#undef GW
#undef LINB
        if (m->grads_ready) m->grads_ready(m->grads_ready_user, l);
    }
    if (m->cfg.n_layer > 0) TN_SPAN_NEXT(TN_TK_LAYER, "layer", 0, TN_TK_EMBED, "embed", -1);
    else TN_SPAN_NEXT(TN_TK_OUTPUT, "output", -1, TN_TK_EMBED, "embed", -1);
    m->tr_il = -1;
    /* embedding: scatter-add rows in token order (sequential: deterministic) */
    if (!m->t[0].frozen) {
        float *de = tn_tp(m, G, 0);
        for (int64_t i = 0; i < N; i++) axpy(de + (int64_t)m->tokens[i] * C, 1.0f, dres + i * C, C);
    }
    TN_SPAN_E(TN_TK_EMBED, "embed", -1, 0, 0);
    TN_SPAN_E(TN_TK_PHASE, "backward", -1, 0, 0);
    if (m->grads_ready) m->grads_ready(m->grads_ready_user, -1);
}

tern_status tn_tmodel_grads(tn_tmodel *m, const int32_t *tokens, const int32_t *targets, int n_micro, double *loss) {
    if (!m->acts) return tn_err(TERN_ERR_STATE, "train: gradients before tn_tmodel_plan");
    if (!m->grads) return tn_err(TERN_ERR_STATE, "train: gradients of a forward-only (zeroth-order) model");
    if (n_micro < 1) return tn_err(TERN_ERR_INVALID_ARG, "train: %d micro-batches", n_micro);
    const size_t n = (size_t)m->B * m->T;
    int64_t n_valid = 0;
    for (size_t i = 0; i < n * (size_t)n_micro; i++) n_valid += targets[i] >= 0;
    /* every micro-batch's dlogits carry 1 / (the batch's valid targets); backward adds up */
    m->ce_denom = n_micro > 1 ? TN_MAX(n_valid, (int64_t)1) : 0;
    double sum = 0.0;
    tern_status s = TERN_OK;
    for (int j = 0; j < n_micro; j++) {
        double l;
        int64_t nv = 0;
        for (size_t i = 0; i < n; i++) nv += targets[j * n + i] >= 0;
        if ((s = tn_tmodel_forward(m, tokens + j * n, targets + j * n, &l))) break;
        sum += n_micro > 1 ? l * (double)nv : l;
        if (j == 0) { /* trace: forward, zero_grad, backward[, forward, backward ...] */
            TN_SPAN_B(TN_TK_OPTIMIZER, "zero_grad", -1, 0, 0, 0, 0);
            tn_tmodel_zero_grad(m);
            TN_SPAN_E(TN_TK_OPTIMIZER, "zero_grad", -1, 0, 0);
        }
        /* the backward hook (data-parallel buckets) sees only the last micro-batch's backward:
         * before it the gradients are not final */
        void (*hook)(void *, int) = m->grads_ready;
        if (j < n_micro - 1) m->grads_ready = NULL;
        tn_tmodel_backward(m);
        m->grads_ready = hook;
    }
    m->ce_denom = 0;
    if (loss) *loss = n_micro > 1 ? (n_valid ? sum / (double)n_valid : 0.0) : sum;
    return s;
}

/* ---- optimizer ---------------------------------------------------------------------------- */

void tn_adamw_default(tn_adamw *o) {
    o->lr = 1e-3f;
    o->beta1 = 0.9f;
    o->beta2 = 0.95f;
    o->eps = 1e-8f;
    o->weight_decay = 0.1f;
    o->grad_clip = 1.0f;
}

double tn_grad_norm(const tn_tmodel *m) {
    double s = 0.0;
    if (!m->base) {
        for (size_t i = 0; i < m->n_params; i++) s += (double)m->grads[i] * (double)m->grads[i];
        return sqrt(s);
    }
    for (int ti = 0; ti < m->n_tensors; ti++) /* LoRA: the trained tensors only */
        for (size_t i = 0; !m->t[ti].frozen && i < m->t[ti].n; i++) {
            const double g = m->grads[m->t[ti].off + i];
            s += g * g;
        }
    return sqrt(s);
}

float tn_lr_at(int64_t step, int64_t warmup, int64_t total, float lr, float min_frac) {
    if (step < warmup) return lr * (float)(step + 1) / (float)warmup;
    if (total <= warmup) return lr;
    double p = (double)(step - warmup) / (double)(total - warmup);
    if (p > 1.0) p = 1.0;
    double c = 0.5 * (1.0 + cos(3.141592653589793 * p));
    return (float)(lr * (min_frac + (1.0 - min_frac) * c));
}

typedef struct adam_task {
    tn_tmodel *m;
    const tn_adamw *o;
    float lr, clip, bc1, bc2;
} adam_task;

static void adam_fn(void *arg, int ith, int nth) {
    adam_task *a = arg;
    tn_tmodel *m = a->m;
    const tn_adamw *o = a->o;
    for (int ti = 0; ti < m->n_tensors; ti++) {
        const tn_tparam *t = &m->t[ti];
        if (t->frozen) continue;
        int64_t r0, r1;
        tn_split((int64_t)t->n, ith, nth, 16, &r0, &r1);
        const float wd = t->decay ? o->weight_decay : 0.0f;
        float *p = m->params + t->off, *g = m->grads + t->off, *mm = m->m + t->off, *vv = m->v + t->off;
        for (int64_t i = r0; i < r1; i++) {
            const float gi = g[i] * a->clip;
            mm[i] = o->beta1 * mm[i] + (1.0f - o->beta1) * gi;
            vv[i] = o->beta2 * vv[i] + (1.0f - o->beta2) * gi * gi;
            const float mh = mm[i] / a->bc1, vh = vv[i] / a->bc2;
            /* decoupled weight decay as torch.optim.AdamW: p *= 1 - lr*wd, then the Adam update */
            p[i] -= a->lr * wd * p[i];
            p[i] -= a->lr * (mh / (sqrtf(vh) + o->eps));
        }
    }
}

void tn_adamw_step(tn_tmodel *m, const tn_adamw *o, float lr, int64_t t, float clip_scale) {
    adam_task a = {m, o, lr, clip_scale, (float)(1.0 - pow(o->beta1, (double)t)), (float)(1.0 - pow(o->beta2, (double)t))};
    tn_pool_run(m->pool, adam_fn, &a);
}
