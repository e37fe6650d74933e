/*
 * kv.c — paged KV block manager and prefix cache (see kv.h for the invariants).
 */
#include "serve/kv.h"

#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "model/pcache.h"

static void lru_unlink(tn_kv *kv, int32_t id) {
    tn_kvb_meta *m = &kv->b[id];
    if (m->lru_prev >= 0) kv->b[m->lru_prev].lru_next = m->lru_next;
    else kv->lru_head = m->lru_next;
    if (m->lru_next >= 0) kv->b[m->lru_next].lru_prev = m->lru_prev;
    else kv->lru_tail = m->lru_prev;
    m->lru_prev = m->lru_next = -1;
    kv->n_cached--;
}

static void lru_push(tn_kv *kv, int32_t id) { /* newest at the tail */
    tn_kvb_meta *m = &kv->b[id];
    m->lru_next = -1;
    m->lru_prev = kv->lru_tail;
    if (kv->lru_tail >= 0) kv->b[kv->lru_tail].lru_next = id;
    else kv->lru_head = id;
    kv->lru_tail = id;
    kv->n_cached++;
}

static void hash_unlink(tn_kv *kv, int32_t id) {
    tn_kvb_meta *m = &kv->b[id];
    int32_t *p = &kv->buckets[m->hash & (kv->n_buckets - 1)];
    while (*p >= 0 && *p != id) p = &kv->b[*p].hnext;
    if (*p == id) *p = m->hnext;
    m->hnext = -1;
    m->hashed = false;
}

tern_status tn_kv_init(tn_kv *kv, int32_t n_blocks) {
    memset(kv, 0, sizeof *kv);
    if (n_blocks <= 0) return tn_err(TERN_ERR_INVALID_ARG, "serve/kv: %d blocks", n_blocks);
    uint32_t nb = 16;
    while (nb < (uint32_t)n_blocks * 2u) nb <<= 1;
    kv->b = tn_calloc((size_t)n_blocks, sizeof *kv->b);
    kv->buckets = tn_malloc(nb * sizeof *kv->buckets);
    if (!kv->b || !kv->buckets) {
        tn_kv_free(kv);
        return tn_err(TERN_ERR_NOMEM, "serve/kv: %d block descriptors", n_blocks);
    }
    kv->n_blocks = n_blocks;
    kv->n_buckets = nb;
    for (uint32_t i = 0; i < nb; i++) kv->buckets[i] = -1;
    kv->lru_head = kv->lru_tail = -1;
    kv->free_head = -1;
    for (int32_t i = n_blocks - 1; i >= 0; i--) {
        tn_kvb_meta *m = &kv->b[i];
        m->parent = m->hnext = m->lru_prev = m->lru_next = -1;
        m->fnext = kv->free_head;
        kv->free_head = i;
    }
    kv->n_free = n_blocks;
    return TERN_OK;
}

void tn_kv_free(tn_kv *kv) {
    tn_free(kv->b);
    tn_free(kv->buckets);
    memset(kv, 0, sizeof *kv);
}

int32_t tn_kv_available(const tn_kv *kv) { return kv->n_free + kv->n_cached - kv->n_reserved; }
int32_t tn_kv_used(const tn_kv *kv) { return kv->n_blocks - kv->n_free - kv->n_cached; }

bool tn_kv_reserve(tn_kv *kv, int32_t n) {
    if (n < 0 || n > tn_kv_available(kv)) return false;
    kv->n_reserved += n;
    return true;
}

void tn_kv_unreserve(tn_kv *kv, int32_t n) {
    kv->n_reserved -= n;
    if (kv->n_reserved < 0) kv->n_reserved = 0;
}

int32_t tn_kv_alloc(tn_kv *kv, bool reserved) {
    if (!reserved && tn_kv_available(kv) <= 0) return -1;
    int32_t id;
    if (kv->free_head >= 0) {
        id = kv->free_head;
        kv->free_head = kv->b[id].fnext;
        kv->n_free--;
    } else if (kv->lru_head >= 0) { /* evict the least recently used cached prefix block */
        id = kv->lru_head;
        lru_unlink(kv, id);
        hash_unlink(kv, id);
    } else {
        return -1;
    }
    if (reserved && kv->n_reserved > 0) kv->n_reserved--;
    tn_kvb_meta *m = &kv->b[id];
    m->ref = 1;
    m->hashed = false;
    m->parent = -1;
    m->fnext = -1;
    return id;
}

void tn_kv_release(tn_kv *kv, int32_t id) {
    if (id < 0 || id >= kv->n_blocks) return;
    tn_kvb_meta *m = &kv->b[id];
    if (m->ref <= 0) return;
    if (--m->ref > 0) return;
    if (m->hashed) {
        lru_push(kv, id);
    } else {
        m->fnext = kv->free_head;
        kv->free_head = id;
        kv->n_free++;
    }
}

uint64_t tn_kv_hash(uint64_t parent_hash, const tern_token *toks) { return tn_tok_hash(0, parent_hash, toks); }

int32_t tn_kv_find(const tn_kv *kv, int32_t parent, uint64_t parent_hash, const tern_token *toks) {
    uint64_t h = tn_kv_hash(parent_hash, toks);
    for (int32_t id = kv->buckets[h & (kv->n_buckets - 1)]; id >= 0; id = kv->b[id].hnext) {
        const tn_kvb_meta *m = &kv->b[id];
        if (m->hash == h && m->parent == parent && !memcmp(m->toks, toks, sizeof m->toks)) return id;
    }
    return -1;
}

int32_t tn_kv_lookup(tn_kv *kv, int32_t parent, uint64_t parent_hash, const tern_token *toks) {
    kv->lookups++;
    const int32_t id = tn_kv_find(kv, parent, parent_hash, toks);
    if (id < 0) return -1;
    tn_kvb_meta *m = &kv->b[id];
    if (m->ref == 0) {
        /* reviving a cached block takes it from the pool; never at the cost of a reservation */
        if (tn_kv_available(kv) <= 0) return -1;
        lru_unlink(kv, id);
    }
    m->ref++;
    kv->hits++;
    return id;
}

bool tn_kv_forget(tn_kv *kv, int32_t id) {
    if (id < 0 || id >= kv->n_blocks) return false;
    tn_kvb_meta *m = &kv->b[id];
    if (m->ref != 0 || !m->hashed) return false;
    lru_unlink(kv, id);
    hash_unlink(kv, id);
    m->parent = -1;
    m->fnext = kv->free_head;
    kv->free_head = id;
    kv->n_free++;
    return true;
}

void tn_kv_publish(tn_kv *kv, int32_t id, int32_t parent, uint64_t parent_hash, const tern_token *toks) {
    if (id < 0 || id >= kv->n_blocks || kv->b[id].hashed) return;
    uint64_t h = tn_kv_hash(parent_hash, toks);
    uint32_t bk = (uint32_t)(h & (kv->n_buckets - 1));
    for (int32_t o = kv->buckets[bk]; o >= 0; o = kv->b[o].hnext) {
        tn_kvb_meta *m = &kv->b[o];
        if (m->hash == h && m->parent == parent && !memcmp(m->toks, toks, sizeof m->toks)) return;
    }
    tn_kvb_meta *m = &kv->b[id];
    m->hash = h;
    m->parent = parent;
    memcpy(m->toks, toks, sizeof m->toks);
    m->hashed = true;
    m->hnext = kv->buckets[bk];
    kv->buckets[bk] = id;
}
