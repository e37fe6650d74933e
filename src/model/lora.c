/*
 * lora.c — loading a GGUF LoRA adapter against a base model (every mismatch an error naming the
 * tensor and the numbers), attaching adapters to a context (its sites and A x scratch, planned
 * here so a forward pass allocates nothing), the per-site arithmetic the blocks call, and the
 * merge tern export-lora writes. See lora.h for the format and the scale rule.
 */
#include <math.h>
#include <string.h>

#include "core/base.h"
#include "model/lora.h"
#include "quant/quant.h"

struct tern_lora {
    const tern_model *model; /* the base it was checked against          */
    char *path;
    float alpha;             /* adapter.lora.alpha (0: absent)            */
    int32_t n_pairs;
    tn_lora_pair *pairs;
    int32_t n_bufs;          /* A, B matrices and base names, owned       */
    void **bufs;
};

static const char *const tn_lora_suffix_a = ".lora_a", *const tn_lora_suffix_b = ".lora_b";

static void *tn_lora_own(tern_lora *a, void *p) {
    if (p) a->bufs[a->n_bufs++] = p;
    return p;
}

/* A 2-D adapter tensor as f32 rows [ne1][ne0]. */
static tern_status tn_lora_f32(tern_lora *a, const tn_gguf_tensor *t, float **out) {
    *out = NULL;
    const size_t rb = tn_dtype_row_size((tn_dtype)t->type, t->ne[0]);
    if (!tn_dtype_get(t->type) || !rb)
        return tn_err(TERN_ERR_UNSUPPORTED, "lora: %s: tensor '%s' has type %s with rows of %lld (not usable)", a->path, t->name,
                      tn_dtype_name(t->type), (long long)t->ne[0]);
    float *f = tn_lora_own(a, tn_malloc(sizeof(float) * (size_t)(t->ne[0] * t->ne[1])));
    if (!f) return tn_err(TERN_ERR_NOMEM, "lora: %s: no memory for tensor '%s'", a->path, t->name);
    for (int64_t r = 0; r < t->ne[1]; r++)
        if (!tn_dequantize_row((tn_dtype)t->type, t->data + (size_t)r * rb, f + r * t->ne[0], t->ne[0]))
            return tn_err(TERN_ERR_UNSUPPORTED, "lora: %s: tensor '%s' has type %s, which tern cannot convert", a->path, t->name,
                          tn_dtype_name(t->type));
    *out = f;
    return TERN_OK;
}

/* The sites a base tensor of role r in layer il feeds: up to 3 slices (slot, first row, rows).
 * Returns how many; 0 with the error recorded when the role cannot take an adapter. */
static int tn_lora_sites_of(const tern_model *m, const char *path, const char *name, int32_t il, tn_role r,
                            int slot[3], int64_t row0[3], int64_t rows[3]) {
    const tn_hparams *hp = &m->hp;
    const int64_t qd = tn_hp_q_dim(hp), kv = (int64_t)hp->n_head_kv * hp->head_dim;
    static const struct { tn_role role; int slot; } plain[] = {
        {TN_ROLE_ATTN_Q, TN_LORA_Q},       {TN_ROLE_ATTN_K, TN_LORA_K},   {TN_ROLE_ATTN_V, TN_LORA_V},
        {TN_ROLE_ATTN_OUT, TN_LORA_O},     {TN_ROLE_FFN_GATE, TN_LORA_GATE}, {TN_ROLE_FFN_DOWN, TN_LORA_DOWN},
    };
    for (size_t i = 0; i < TN_ARRAY_LEN(plain); i++)
        if (plain[i].role == r) return slot[0] = plain[i].slot, row0[0] = 0, rows[0] = -1, 1;
    if (r == TN_ROLE_FFN_UP && hp->family->gate_up_fused) {
        slot[0] = TN_LORA_GATE, row0[0] = 0, rows[0] = hp->n_ff;
        slot[1] = TN_LORA_UP, row0[1] = hp->n_ff, rows[1] = hp->n_ff;
        return 2;
    }
    if (r == TN_ROLE_FFN_UP) return slot[0] = TN_LORA_UP, row0[0] = 0, rows[0] = -1, 1;
    if (r == TN_ROLE_ATTN_QKV) {
        slot[0] = TN_LORA_Q, row0[0] = 0, rows[0] = qd;
        slot[1] = TN_LORA_K, row0[1] = qd, rows[1] = kv;
        slot[2] = TN_LORA_V, row0[2] = qd + kv, rows[2] = kv;
        return 3;
    }
    if (r == TN_ROLE_OUTPUT && il < 0) return slot[0] = 0, row0[0] = 0, rows[0] = -1, 1;
    const char *what = r == TN_ROLE_TOKEN_EMBD ? "token embeddings"
                       : TN_MOE_ROLE(r) || (r >= TN_ROLE_FFN_GATE_INP_SHEXP && r <= TN_ROLE_FFN_DOWN_SHEXP)
                           ? "mixture-of-experts routers, experts and shared experts"
                                               : "norms, biases and other vectors";
    tn_err(TERN_ERR_UNSUPPORTED,
           "lora: %s: tensor '%s': tern applies adapters to attn_q/k/v/qkv/output, ffn_gate/up/down and output, not to %s",
           path, name, what);
    return 0;
}

/* Checks one lora_a / lora_b pair against the base tensor and adds its pairs. */
static tern_status tn_lora_add_pair(tern_lora *a, const tn_gguf_tensor *ta, const tn_gguf_tensor *tb, const char *base) {
    const tern_model *m = a->model;
    const tn_gguf_tensor *w = tn_gguf_find_tensor(m->gguf, base);
    if (!w)
        return tn_err(TERN_ERR_FORMAT, "lora: %s: tensor '%s' adapts '%s', which the base model does not have (an adapter for another model?)",
                      a->path, ta->name, base);
    int32_t il;
    tn_role role;
    if (!tn_role_parse(base, &il, &role))
        return tn_err(TERN_ERR_UNSUPPORTED, "lora: %s: tensor '%s': base tensor '%s' has no role tern knows", a->path, ta->name, base);
    int slot[3];
    int64_t row0[3], rows[3];
    const int ns = tn_lora_sites_of(m, a->path, base, il, role, slot, row0, rows);
    if (!ns) return TERN_ERR_UNSUPPORTED;
    if (w->ne[2] != 1 || w->ne[3] != 1)
        return tn_err(TERN_ERR_UNSUPPORTED, "lora: %s: base tensor '%s' is not a 2-D matrix", a->path, base);
    for (const tn_gguf_tensor *t = ta; t; t = t == ta ? tb : NULL)
        if (t->ne[2] != 1 || t->ne[3] != 1 || t->ne[0] < 1 || t->ne[1] < 1)
            return tn_err(TERN_ERR_FORMAT, "lora: %s: tensor '%s' is not a 2-D matrix", a->path, t->name);
    if (ta->ne[0] != w->ne[0])
        return tn_err(TERN_ERR_FORMAT, "lora: %s: '%s' has n_in %lld, but base '%s' has rows of %lld (an adapter for another model?)",
                      a->path, ta->name, (long long)ta->ne[0], base, (long long)w->ne[0]);
    if (tb->ne[1] != w->ne[1])
        return tn_err(TERN_ERR_FORMAT, "lora: %s: '%s' has n_out %lld, but base '%s' has %lld rows (an adapter for another model?)",
                      a->path, tb->name, (long long)tb->ne[1], base, (long long)w->ne[1]);
    if (ta->ne[1] != tb->ne[0])
        return tn_err(TERN_ERR_FORMAT, "lora: %s: rank mismatch for '%s': lora_a has rank %lld (ne[1]), lora_b %lld (ne[0])",
                      a->path, base, (long long)ta->ne[1], (long long)tb->ne[0]);
    if (ta->ne[1] > 65536)
        return tn_err(TERN_ERR_FORMAT, "lora: %s: '%s' has rank %lld (more than 65536)", a->path, ta->name, (long long)ta->ne[1]);
    float *A, *B;
    tern_status s;
    if ((s = tn_lora_f32(a, ta, &A)) || (s = tn_lora_f32(a, tb, &B))) return s;
    char *bn = tn_lora_own(a, tn_strdup(base));
    if (!bn) return tn_err(TERN_ERR_NOMEM, "lora: no memory");
    const int32_t r = (int32_t)ta->ne[1];
    for (int i = 0; i < ns; i++) {
        tn_lora_pair *p = &a->pairs[a->n_pairs++];
        p->a = A, p->b = B + row0[i] * r, p->r = r, p->k = w->ne[0], p->m = rows[i] < 0 ? w->ne[1] : rows[i];
        p->site = (il < 0 ? m->hp.n_layer : il) * TN_LORA_PER_LAYER + slot[i];
        p->ar = a->alpha != 0.0f ? a->alpha / (float)r : 1.0f;
        p->base = bn, p->row0 = row0[i];
    }
    return TERN_OK;
}

/* general.type / adapter.type / general.architecture must read want. */
static tern_status tn_lora_key(const tn_gguf *g, const char *path, const char *key, const char *want, const char *hint) {
    tn_gguf_str v;
    memset(&v, 0, sizeof v);
    const tn_gguf_kv *kv = tn_gguf_find(g, key);
    if (!kv) return tn_err(TERN_ERR_FORMAT, "lora: %s: %s is missing (%s)", path, key, hint);
    if (kv->type != TN_GGUF_STRING) return tn_err(TERN_ERR_FORMAT, "lora: %s: %s is not a string (%s)", path, key, hint);
    v = kv->v.str;
    if (!tn_gguf_str_eq(v, want))
        return tn_err(TERN_ERR_FORMAT, "lora: %s: %s is '%.*s', expected '%s' (%s)", path, key, (int)TN_MIN(v.len, 64), v.data, want,
                      hint);
    return TERN_OK;
}

static tern_status tn_lora_read(tern_lora *a, const tn_gguf *g) {
    const char *path = a->path;
    tern_status s;
    if ((s = tn_lora_key(g, path, "general.type", "adapter", "not a LoRA adapter file")) ||
        (s = tn_lora_key(g, path, "adapter.type", "lora", "tern reads LoRA adapters only")) ||
        (s = tn_lora_key(g, path, "general.architecture", a->model->hp.family->name, "an adapter for another model family")))
        return s;
    const tn_gguf_kv *al = tn_gguf_find(g, "adapter.lora.alpha");
    if (al) {
        if (al->type != TN_GGUF_F32 && al->type != TN_GGUF_F64)
            return tn_err(TERN_ERR_FORMAT, "lora: %s: adapter.lora.alpha has type %s, expected f32", path, tn_gguf_type_name(al->type));
        a->alpha = (float)al->v.f64;
        if (!isfinite(a->alpha)) return tn_err(TERN_ERR_FORMAT, "lora: %s: adapter.lora.alpha is not finite", path);
    }
    const size_t nt = (size_t)g->n_tensors;
    a->pairs = tn_calloc(nt * 3 + 1, sizeof *a->pairs);
    a->bufs = tn_calloc(nt * 2 + 1, sizeof *a->bufs);
    if (!a->pairs || !a->bufs) return tn_err(TERN_ERR_NOMEM, "lora: no memory");
    char base[TN_GGUF_MAX_NAME + 8];
    for (size_t i = 0; i < nt; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        const bool is_a = tn_str_ends_with(t->name, tn_lora_suffix_a), is_b = tn_str_ends_with(t->name, tn_lora_suffix_b);
        if (!is_a && !is_b) {
            if (tn_str_ends_with(t->name, "_norm.weight")) continue; /* llama.cpp skips adapted norms too */
            return tn_err(TERN_ERR_FORMAT, "lora: %s: tensor '%s' is neither a .lora_a nor a .lora_b tensor", path, t->name);
        }
        const size_t bl = strlen(t->name) - strlen(tn_lora_suffix_a);
        memcpy(base, t->name, bl);
        base[bl] = 0;
        char other[sizeof base + 8];
        snprintf(other, sizeof other, "%s%s", base, is_a ? tn_lora_suffix_b : tn_lora_suffix_a);
        const tn_gguf_tensor *o = tn_gguf_find_tensor(g, other);
        if (!o) return tn_err(TERN_ERR_FORMAT, "lora: %s: '%s' has no partner '%s'", path, t->name, other);
        if (is_b) continue; /* the pair is added from its lora_a */
        if ((s = tn_lora_add_pair(a, t, o, base))) return s;
    }
    if (!a->n_pairs) return tn_err(TERN_ERR_FORMAT, "lora: %s: the adapter has no lora_a / lora_b tensors", path);
    return TERN_OK;
}

tern_status tern_lora_load(const tern_model *m, const char *path, tern_lora **out) {
    *out = NULL;
    if (!m || !path) return tn_err(TERN_ERR_INVALID_ARG, "lora: model and path are required");
    tern_lora *a = tn_calloc(1, sizeof *a);
    if (!a || !(a->path = tn_strdup(path))) {
        tn_free(a);
        return tn_err(TERN_ERR_NOMEM, "lora: no memory");
    }
    a->model = m;
    tn_gguf *g = NULL;
    tern_status s = tn_gguf_open(path, true, &g);
    if (!s) s = tn_lora_read(a, g);
    tn_gguf_free(g);
    if (s) {
        tern_lora_free(a);
        return s;
    }
    *out = a;
    return TERN_OK;
}

void tern_lora_free(tern_lora *a) {
    if (!a) return;
    for (int32_t i = 0; i < a->n_bufs; i++) tn_free(a->bufs[i]);
    tn_free(a->bufs);
    tn_free(a->pairs);
    tn_free(a->path);
    tn_free(a);
}

int32_t tern_lora_n_tensors(const tern_lora *a) { return a ? a->n_pairs : 0; }
float tern_lora_alpha(const tern_lora *a) { return a ? a->alpha : 0.0f; }

void tn_lora_ctx_clear(tern_ctx *c) {
    tn_free(c->lora_sites);
    tn_free(c->lora_uses);
    tn_free_aligned(c->lora_t);
    c->lora_sites = NULL, c->lora_uses = NULL, c->lora_t = NULL;
    c->lora_r_max = c->lora_own_off = 0;
}

tern_status tern_ctx_set_lora(tern_ctx *c, tern_lora *const *ad, const float *scales, int32_t n) {
    if (!c || n < 0 || (n > 0 && (!ad || !scales))) return tn_err(TERN_ERR_INVALID_ARG, "lora: bad arguments");
    for (int32_t i = 0; i < n; i++) {
        if (!ad[i] || ad[i]->model != c->model)
            return tn_err(TERN_ERR_INVALID_ARG, "lora: adapter %d was loaded for another model than this context's", (int)i);
        if (!isfinite(scales[i])) return tn_err(TERN_ERR_INVALID_ARG, "lora: scale of '%s' is not finite", ad[i]->path);
    }
    if (n > 0 && c->hp.family && c->hp.family->mla) /* tn_blk_mla applies no adapter terms */
        return tn_err(TERN_ERR_UNSUPPORTED, "lora: adapters on %s (latent attention) are not applied at run time yet",
                      c->hp.family->name);
    if (n > 0 && c->cuda)
        return tn_err(TERN_ERR_UNSUPPORTED, "lora: the CUDA backend does not apply LoRA adapters (run with --device cpu, or merge "
                                            "the adapter with tern export-lora)");
    const int64_t ns = ((int64_t)c->hp.n_layer + 1) * TN_LORA_PER_LAYER;
    int64_t nu = 0;
    for (int32_t i = 0; i < n; i++) nu += ad[i]->n_pairs;
    tn_lora_site *sites = n ? tn_calloc((size_t)ns, sizeof *sites) : NULL;
    tn_lora_use *uses = n ? tn_calloc((size_t)nu + 1, sizeof *uses) : NULL;
    if (n && (!sites || !uses)) {
        tn_free(sites), tn_free(uses);
        return tn_err(TERN_ERR_NOMEM, "lora: no memory");
    }
    /* uses grouped by site (counting sort), adapters in the order given within a site */
    for (int32_t i = 0; i < n; i++)
        for (int32_t j = 0; j < ad[i]->n_pairs; j++) sites[ad[i]->pairs[j].site].n++;
    int32_t off = 0, r_max = 0;
    for (int64_t s = 0; s < ns && n; s++) sites[s].off = off, off += sites[s].n, sites[s].n = 0;
    for (int32_t i = 0; i < n; i++)
        for (int32_t j = 0; j < ad[i]->n_pairs; j++) {
            const tn_lora_pair *p = &ad[i]->pairs[j];
            tn_lora_site *st = &sites[p->site];
            uses[st->off + st->n++] = (tn_lora_use){p, scales[i] * p->ar};
            st->r_sum += p->r;
            r_max = TN_MAX(r_max, st->r_sum);
        }
    /* A x rows: shared [slots][n_batch][r_max], then per thread [n_threads][slots][r_max] */
    const int64_t own_off = (int64_t)TN_LORA_PER_LAYER * c->n_batch * r_max;
    float *t = NULL;
    if (n) {
        t = tn_malloc_aligned(sizeof(float) * (size_t)(own_off + (int64_t)c->n_threads * TN_LORA_PER_LAYER * r_max + 1), 64);
        if (!t) {
            tn_free(sites), tn_free(uses);
            return tn_err(TERN_ERR_NOMEM, "lora: no memory for the A x scratch");
        }
    }
    tn_lora_ctx_clear(c);
    c->lora_sites = sites, c->lora_uses = uses, c->lora_t = t, c->lora_r_max = r_max, c->lora_own_off = own_off;
    return TERN_OK;
}

void tn_lora_ax(const tern_ctx *c, const tn_lora_site *s, const float *x, int64_t ldx, int64_t j0, int64_t j1, float *t,
                int64_t ldt) {
    const tn_vec_dot_fn dot = c->kt->slot[TN_F32].vec_dot;
    for (int64_t j = j0; j < j1; j++) {
        float *tj = t + j * ldt;
        for (int32_t u = 0; u < s->n; u++) {
            const tn_lora_pair *p = c->lora_uses[s->off + u].p;
            for (int32_t q = 0; q < p->r; q++) dot(p->k, tj++, p->a + (int64_t)q * p->k, x + j * ldx);
        }
    }
}

void tn_lora_add(const tern_ctx *c, const tn_lora_op *op, float *y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
    const tn_lora_site *s = op->site;
    for (int64_t j = 0; j < n; j++) {
        const float *tj = op->t + j * op->ld;
        float *yj = y + j * ldy;
        for (int32_t u = 0; u < s->n; u++) {
            const tn_lora_use *us = &c->lora_uses[s->off + u];
            const int32_t r = us->p->r;
            for (int64_t i = r0; i < r1; i++) {
                const float *b = us->p->b + i * r;
                float acc = 0.0f;
                for (int32_t q = 0; q < r; q++) acc += b[q] * tj[q];
                yj[i] += us->s * acc;
            }
            tj += r;
        }
    }
}

int tn_lora_merge(const tern_lora *a, float scale, const char *name, float *w, int64_t k, int64_t m) {
    int applied = 0;
    for (int32_t i = 0; i < a->n_pairs; i++) {
        const tn_lora_pair *p = &a->pairs[i];
        if (strcmp(p->base, name) || p->k != k || p->row0 + p->m > m) continue;
        const double s = (double)scale * (double)p->ar;
        for (int64_t row = 0; row < p->m; row++) {
            const float *b = p->b + row * p->r;
            float *wr = w + (p->row0 + row) * k;
            for (int64_t col = 0; col < k; col++) {
                double acc = 0;
                for (int32_t q = 0; q < p->r; q++) acc += (double)b[q] * (double)p->a[(int64_t)q * k + col];
                wr[col] = (float)((double)wr[col] + s * acc);
            }
        }
        applied++;
    }
    return applied;
}

bool tn_lora_adapts(const tern_lora *a, const char *name) {
    for (int32_t i = 0; i < a->n_pairs; i++)
        if (!strcmp(a->pairs[i].base, name)) return true;
    return false;
}
