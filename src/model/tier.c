/*
 * tier.c — hot experts in fast memory (FreqTier). See model.h (tn_tier).
 *
 * A mixture-of-experts model reads only the experts its tokens are routed to, and routing is
 * skewed: some experts take many more tokens than others. The expert matrices stay in the file
 * mapping (4 KiB page-cache pages the kernel may evict when the model does not fit in RAM); the
 * experts a context's counters show to be used most are copied, whole (every expert matrix of the
 * layer: gate, up, down, ...), into one buffer of 2 MiB pages of a size the user gives, and their
 * views point there from then on. Promotion only adds (a copy is never freed or overwritten while
 * the model lives), so a reader holding either pointer reads valid, identical bytes: no lock on
 * the forward path, one acquire load per expert matmul.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/ctx.h"

/* The layer's expert matrices: the roles with an expert dimension it has. */
static int tn_tier_roles(const tn_layer *L, int32_t ne, int roles[TN_ROLE_N_LAYER]) {
    int n = 0;
    for (int r = 0; r < TN_ROLE_N_LAYER; r++)
        if (tn_roles[r].matrix && tn_roles[r].ne2 != TN_DIM_1 && L->w[r].data && L->w[r].ne[2] == ne) roles[n++] = r;
    return n;
}

/* Bytes of one expert of layer L (its slices of every expert matrix, each 64-byte aligned). */
static size_t tn_tier_expert_bytes(const tn_layer *L, int32_t ne) {
    int roles[TN_ROLE_N_LAYER];
    const int nr = tn_tier_roles(L, ne, roles);
    size_t b = 0;
    for (int j = 0; j < nr; j++) b += TN_PAD(L->w[roles[j]].nbytes / (size_t)ne, 64);
    return b;
}

tern_status tn_tier_init(tern_model *m, uint64_t budget) {
    const tn_hparams *hp = &m->hp;
    if (!budget || hp->n_expert <= 1) return TERN_OK; /* dense models: nothing to place */
    tn_tier *t = tn_calloc(1, sizeof *t);
    if (!t) return tn_err(TERN_ERR_NOMEM, "model: out of memory for the hot-expert table");
    const size_t nl = (size_t)hp->n_layer, ne = (size_t)hp->n_expert;
    t->ptr = tn_calloc(nl * TN_ROLE_N_LAYER * ne, sizeof *t->ptr);
    t->hot = tn_calloc(nl * ne, 1);
    if (!t->ptr || !t->hot || pthread_mutex_init(&t->mu, NULL)) {
        tn_free((void *)t->ptr), tn_free(t->hot), tn_free(t);
        return tn_err(TERN_ERR_NOMEM, "model: out of memory for the hot-expert table");
    }
    size_t total = 0; /* every expert's bytes: the budget needs no more than that */
    for (size_t il = 0; il < nl; il++) {
        tn_layer *L = &m->layers[il];
        int roles[TN_ROLE_N_LAYER];
        const int nr = tn_tier_roles(L, (int32_t)ne, roles);
        for (int j = 0; j < nr; j++) L->w[roles[j]].hot = &t->ptr[(il * TN_ROLE_N_LAYER + (size_t)roles[j]) * ne];
        total += tn_tier_expert_bytes(L, (int32_t)ne) * ne;
    }
    t->cap = (size_t)TN_MIN((uint64_t)total, budget);
    m->tier = t;
    return TERN_OK;
}

void tn_tier_free(tn_tier *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    tn_free_aligned(t->buf);
    tn_free((void *)t->ptr);
    tn_free(t->hot);
    tn_free(t);
}

typedef struct {
    uint64_t count;
    int32_t il, e;
} tn_tier_cand;

static int tn_tier_cand_cmp(const void *a, const void *b) { /* most used first; ties: layer, expert */
    const tn_tier_cand *x = a, *y = b;
    if (x->count != y->count) return x->count < y->count ? 1 : -1;
    if (x->il != y->il) return x->il < y->il ? -1 : 1;
    return (x->e > y->e) - (x->e < y->e);
}

/* Copies expert e of layer il into the buffer at off and points its views there. */
static void tn_tier_place(tern_model *m, tn_tier *t, int32_t il, int32_t e, size_t off) {
    tn_layer *L = &m->layers[il];
    const int32_t ne = m->hp.n_expert;
    int roles[TN_ROLE_N_LAYER];
    const int nr = tn_tier_roles(L, ne, roles);
    const long pg = sysconf(_SC_PAGESIZE);
    for (int j = 0; j < nr; j++) {
        const tn_tensor *w = &L->w[roles[j]];
        const size_t b = w->nbytes / (size_t)ne;
        const uint8_t *src = (const uint8_t *)w->data + (size_t)e * b;
        memcpy(t->buf + off, src, b);
        if (pg > 0 && (!m->gguf || m->gguf->map.mapped)) { /* the file's pages of this slice are not read again */
            const uintptr_t a = ((uintptr_t)src + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
            const uintptr_t z = ((uintptr_t)src + b) & ~((uintptr_t)pg - 1);
            if (z > a) (void)madvise((void *)a, z - a, MADV_DONTNEED);
        }
        atomic_store_explicit(&w->hot[e], (const void *)(t->buf + off), memory_order_release);
        off += TN_PAD(b, 64);
    }
}

tern_status tn_tier_promote(const tern_model *cm, const uint64_t *counts) {
    tern_model *m = (tern_model *)(uintptr_t)cm; /* the views' hot pointers: set once, read lock-free */
    tn_tier *t = m->tier;
    if (!t) return TERN_OK;
    const int32_t nl = m->hp.n_layer, ne = m->hp.n_expert;
    pthread_mutex_lock(&t->mu);
    tern_status s = TERN_OK;
    tn_tier_cand *cand = NULL;
    if (t->full) goto done;
    if (!t->buf) {
        t->buf = tn_malloc_huge(t->cap);
        if (!t->buf) {
            t->full = true; /* out of memory: stay with the mapping, say so once */
            s = tn_err(TERN_ERR_NOMEM, "model: out of memory for %.0f MiB of hot experts", (double)t->cap / 1048576.0);
            goto done;
        }
    }
    cand = tn_malloc((size_t)nl * (size_t)ne * sizeof *cand);
    if (!cand) {
        s = tn_err(TERN_ERR_NOMEM, "model: out of memory ranking the experts");
        goto done;
    }
    /* candidates: experts not yet hot that took at least their layer's mean share of rows */
    size_t nc = 0;
    for (int32_t il = 0; il < nl; il++) {
        const uint64_t *cnt = counts + (int64_t)il * ne;
        uint64_t sum = 0;
        for (int32_t e = 0; e < ne; e++) sum += cnt[e];
        for (int32_t e = 0; e < ne; e++)
            if (cnt[e] && cnt[e] * (uint64_t)ne >= sum && !t->hot[(int64_t)il * ne + e])
                cand[nc++] = (tn_tier_cand){cnt[e], il, e};
    }
    qsort(cand, nc, sizeof *cand, tn_tier_cand_cmp);
    size_t smallest = SIZE_MAX;
    for (size_t i = 0; i < nc; i++) {
        const size_t b = tn_tier_expert_bytes(&m->layers[cand[i].il], ne);
        smallest = TN_MIN(smallest, b);
        if (t->used + b > t->cap) continue;
        tn_tier_place(m, t, cand[i].il, cand[i].e, t->used);
        t->hot[(int64_t)cand[i].il * ne + cand[i].e] = 1;
        t->used += b;
        t->n_hot++;
    }
    if (nc && t->used + smallest > t->cap) t->full = true;
done:
    tn_free(cand);
    pthread_mutex_unlock(&t->mu);
    return s;
}

void tn_tier_update(tern_ctx *c) {
    const tn_tier *t = c->model->tier;
    if (!t || t->full || !c->moe_count) return;
    int32_t il0 = 0; /* the first layer with experts: its routed tokens */
    while (il0 < c->hp.n_layer && !tn_layer_moe(&c->model->layers[il0])) il0++;
    if (il0 == c->hp.n_layer) return;
    const uint64_t tok = c->moe_tokens[il0];
    if (tok < c->tier_last) c->tier_last = 0; /* the counters were reset (tern bench) */
    /* a promotion once every expert of a layer could have had two rows since the last one, then
     * at doubling intervals: later promotions rank on more evidence */
    const uint64_t k = (uint64_t)TN_MAX(c->hp.n_expert_used, 1);
    const uint64_t step = TN_MAX((uint64_t)2 * (uint64_t)c->hp.n_expert / k, 1) << TN_MIN(c->tier_rounds, 16);
    if (tok - c->tier_last < step) return;
    c->tier_last = tok, c->tier_rounds++;
    if (tn_tier_promote(c->model, c->moe_count)) tn_log(TERN_LOG_WARN, "%s (experts stay in the file mapping)", tern_last_error());
}

void tern_ctx_hot_experts(const tern_ctx *c, tern_hot_experts *out) {
    memset(out, 0, sizeof *out);
    tn_tier *t = c ? c->model->tier : NULL;
    if (!t) return;
    out->rows = c->moe_rows, out->rows_hot = c->moe_rows_hot;
    for (int32_t il = 0; il < c->hp.n_layer; il++) out->n_experts += tn_layer_moe(&c->model->layers[il]) ? c->hp.n_expert : 0;
    pthread_mutex_lock(&t->mu);
    out->budget_bytes = t->cap, out->used_bytes = t->used, out->n_hot = t->n_hot;
    pthread_mutex_unlock(&t->mu);
}
