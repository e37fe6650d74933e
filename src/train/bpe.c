/*
 * bpe.c — BPE vocabulary learning and the SPM encoder used for training data. See bpe.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"
#include "train/bpe.h"

/* ---- a string → int32 map whose keys live in its own byte pool ----------------------------- */
typedef struct strmap {
    uint64_t *h;      /* 0 = empty slot */
    uint32_t *kofs, *klen;
    int32_t *val;
    size_t cap, n;
    char *pool;
    size_t pool_n, pool_cap;
} strmap;

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = UINT64_C(1469598103934665603);
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * UINT64_C(1099511628211);
    return h | 1; /* never 0 */
}

static void strmap_free(strmap *m) {
    tn_free(m->h); tn_free(m->kofs); tn_free(m->klen); tn_free(m->val); tn_free(m->pool);
    memset(m, 0, sizeof *m);
}

static bool strmap_grow(strmap *m) {
    size_t nc = m->cap ? m->cap * 2 : 1024;
    strmap o = *m;
    m->h = tn_calloc(nc, sizeof *m->h);
    m->kofs = tn_malloc(nc * sizeof *m->kofs);
    m->klen = tn_malloc(nc * sizeof *m->klen);
    m->val = tn_malloc(nc * sizeof *m->val);
    if (!m->h || !m->kofs || !m->klen || !m->val) {
        tn_free(m->h); tn_free(m->kofs); tn_free(m->klen); tn_free(m->val);
        m->h = o.h; m->kofs = o.kofs; m->klen = o.klen; m->val = o.val;
        return false;
    }
    m->cap = nc;
    for (size_t i = 0; i < o.cap; i++) {
        if (!o.h[i]) continue;
        size_t j = o.h[i] & (nc - 1);
        while (m->h[j]) j = (j + 1) & (nc - 1);
        m->h[j] = o.h[i]; m->kofs[j] = o.kofs[i]; m->klen[j] = o.klen[i]; m->val[j] = o.val[i];
    }
    tn_free(o.h); tn_free(o.kofs); tn_free(o.klen); tn_free(o.val);
    return true;
}

/* Slot of key, or of the empty slot where it would go (*found says which). */
static size_t strmap_slot(const strmap *m, const char *k, size_t n, uint64_t h, bool *found) {
    size_t j = h & (m->cap - 1);
    while (m->h[j]) {
        if (m->h[j] == h && m->klen[j] == n && !memcmp(m->pool + m->kofs[j], k, n)) { *found = true; return j; }
        j = (j + 1) & (m->cap - 1);
    }
    *found = false;
    return j;
}

static int32_t strmap_get(const strmap *m, const char *k, size_t n) {
    if (!m->cap) return -1;
    bool f;
    size_t j = strmap_slot(m, k, n, fnv(k, n), &f);
    return f ? m->val[j] : -1;
}

/* Inserts (or finds) key; returns a pointer to its value (new keys get `init`), NULL on OOM. */
static int32_t *strmap_put(strmap *m, const char *k, size_t n, int32_t init) {
    if ((m->n + 1) * 2 > m->cap && !strmap_grow(m)) return NULL;
    uint64_t h = fnv(k, n);
    bool f;
    size_t j = strmap_slot(m, k, n, h, &f);
    if (f) return &m->val[j];
    if (m->pool_n + n > UINT32_MAX) return NULL;
    if (m->pool_n + n > m->pool_cap) {
        size_t nc = (m->pool_cap ? m->pool_cap * 2 : 4096);
        while (nc < m->pool_n + n) nc *= 2;
        char *p = tn_realloc(m->pool, nc);
        if (!p) return NULL;
        m->pool = p;
        m->pool_cap = nc;
    }
    memcpy(m->pool + m->pool_n, k, n);
    m->h[j] = h; m->kofs[j] = (uint32_t)m->pool_n; m->klen[j] = (uint32_t)n; m->val[j] = init;
    m->pool_n += n;
    m->n++;
    return &m->val[j];
}

/* ---- UTF-8 --------------------------------------------------------------------------------- */
/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static int utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!len || (size_t)len > n) return 0;
    for (int i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    uint32_t cp = len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < len; i++) cp = (cp << 6) | (s[i] & 0x3F);
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

tern_status tn_utf8_check(const char *text, size_t len, const char *what) {
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        int l = utf8_len(s + i, len - i);
        if (!l)
            return tn_err(TERN_ERR_FORMAT, "%s: invalid UTF-8 (byte 0x%02X) at byte offset %zu; training text must be UTF-8",
                          what, s[i], i);
        if (s[i] == 0) return tn_err(TERN_ERR_FORMAT, "%s: NUL byte at byte offset %zu; training text must be text", what, i);
        i += (size_t)l;
    }
    return TERN_OK;
}

/* ---- pre-tokenization: "▁word" runs and newlines --------------------------------------------- */
static const char SP[] = "\xE2\x96\x81"; /* U+2581 */

/* Normalises text (spaces → ▁, a ▁ prefix) into *buf. */
static char *normalize(const char *text, size_t len, size_t *out_len) {
    size_t n = 3;
    for (size_t i = 0; i < len; i++) n += text[i] == ' ' ? 3 : 1;
    char *b = tn_malloc(n + 1);
    if (!b) return NULL;
    size_t o = 0;
    memcpy(b, SP, 3); o = 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(b + o, SP, 3); o += 3; }
        else b[o++] = text[i];
    }
    b[o] = 0;
    *out_len = o;
    return b;
}

/* Next pre-token of s[*pos..n): returns its length (0 at end). */
static size_t next_word(const char *s, size_t n, size_t *pos) {
    size_t i = *pos;
    if (i >= n) return 0;
    size_t j = i;
    if (s[j] == '\n') j++;
    else {
        if (n - j >= 3 && !memcmp(s + j, SP, 3)) j += 3;
        while (j < n && s[j] != '\n' && !(n - j >= 3 && !memcmp(s + j, SP, 3))) j++;
    }
    *pos = j;
    return j - i;
}

/* ---- vocab data ------------------------------------------------------------------------------ */
void tn_vocab_data_free(tn_vocab_data *v) {
    if (!v) return;
    if (v->text)
        for (int32_t i = 0; i < v->n; i++) tn_free(v->text[i]);
    tn_free(v->text); tn_free(v->score); tn_free(v->type);
    tn_free(v);
}

static tn_vocab_data *vocab_alloc(int32_t n) {
    tn_vocab_data *v = tn_calloc(1, sizeof *v);
    if (!v) return NULL;
    v->text = tn_calloc((size_t)n, sizeof *v->text);
    v->score = tn_calloc((size_t)n, sizeof *v->score);
    v->type = tn_calloc((size_t)n, sizeof *v->type);
    v->bos = 1; v->eos = 2; v->unk = 0;
    if (!v->text || !v->score || !v->type) { tn_vocab_data_free(v); return NULL; }
    return v;
}

uint64_t tn_vocab_data_hash(const tn_vocab_data *v) {
    uint64_t h = UINT64_C(1469598103934665603);
    for (int32_t i = 0; i < v->n; i++) {
        const char *t = v->text[i];
        size_t n = strlen(t) + 1;
        for (size_t j = 0; j < n; j++) h = (h ^ (unsigned char)t[j]) * UINT64_C(1099511628211);
        h = (h ^ (uint64_t)(uint32_t)v->type[i]) * UINT64_C(1099511628211);
    }
    return h;
}

tern_status tn_vocab_data_write(const tn_vocab_data *v, tn_gguf_writer *w) {
    tern_status s;
    if ((s = tn_gguf_set_str(w, "tokenizer.ggml.model", "llama"))) return s;
    if ((s = tn_gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->text, (uint64_t)v->n))) return s;
    if ((s = tn_gguf_set_arr(w, "tokenizer.ggml.scores", TN_GGUF_F32, v->score, (uint64_t)v->n))) return s;
    if ((s = tn_gguf_set_arr(w, "tokenizer.ggml.token_type", TN_GGUF_I32, v->type, (uint64_t)v->n))) return s;
    if ((s = tn_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos))) return s;
    if ((s = tn_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos))) return s;
    if ((s = tn_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)v->unk))) return s;
    if ((s = tn_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", true))) return s;
    if ((s = tn_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", false))) return s;
    return TERN_OK;
}

tern_status tn_vocab_data_from_gguf(const tn_gguf *g, tn_vocab_data **out) {
    *out = NULL;
    tn_gguf_str model;
    tern_status s = tn_gguf_get_str(g, "tokenizer.ggml.model", true, &model);
    if (s) return s;
    if (!tn_gguf_str_eq(model, "llama"))
        return tn_err(TERN_ERR_UNSUPPORTED, "train: tokenizer model '%.*s' not supported for training (only 'llama'/SPM)",
                      (int)TN_MIN(model.len, 32), model.data);
    const tn_gguf_kv *tok, *sc, *ty = NULL;
    if ((s = tn_gguf_get_arr(g, "tokenizer.ggml.tokens", true, TN_GGUF_STRING, &tok))) return s;
    if ((s = tn_gguf_get_arr(g, "tokenizer.ggml.scores", true, TN_GGUF_F32, &sc))) return s;
    if ((s = tn_gguf_get_arr(g, "tokenizer.ggml.token_type", false, TN_GGUF_I32, &ty))) return s;
    if (tok->arr_n < 4 || tok->arr_n > (1u << 24) || sc->arr_n != tok->arr_n || (ty && ty->arr_n != tok->arr_n))
        return tn_err(TERN_ERR_FORMAT, "train: tokenizer arrays have inconsistent lengths");
    tn_vocab_data *v = vocab_alloc((int32_t)tok->arr_n);
    if (!v) return tn_err(TERN_ERR_NOMEM, "train: vocabulary");
    v->n = (int32_t)tok->arr_n;
    for (int32_t i = 0; i < v->n; i++) {
        v->text[i] = tn_gguf_str_dup(tok->arr_strs[i]);
        if (!v->text[i]) { tn_vocab_data_free(v); return tn_err(TERN_ERR_NOMEM, "train: vocabulary"); }
        memcpy(&v->score[i], sc->arr_data + 4 * (size_t)i, 4);
        int32_t t = TN_TOKEN_TYPE_NORMAL;
        if (ty) memcpy(&t, ty->arr_data + 4 * (size_t)i, 4);
        v->type[i] = t;
    }
    int64_t id = 1;
    v->bos = 1; v->eos = 2; v->unk = 0;
    if (!tn_gguf_get_i64(g, "tokenizer.ggml.bos_token_id", false, &id) && id >= 0 && id < v->n) v->bos = (int32_t)id;
    id = 2;
    if (!tn_gguf_get_i64(g, "tokenizer.ggml.eos_token_id", false, &id) && id >= 0 && id < v->n) v->eos = (int32_t)id;
    id = 0;
    if (!tn_gguf_get_i64(g, "tokenizer.ggml.unknown_token_id", false, &id) && id >= 0 && id < v->n) v->unk = (int32_t)id;
    tn_err_clear();
    *out = v;
    return TERN_OK;
}

/* ---- training ---------------------------------------------------------------------------- */
typedef struct word {
    int32_t *sym;
    int32_t n;
    int64_t count;
} word;

typedef struct pairtab {
    uint64_t *key; /* (a << 32 | b) + 1; 0 empty */
    int64_t *cnt;
    size_t cap;
    size_t *used;
    size_t n_used;
} pairtab;

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33; x *= UINT64_C(0xff51afd7ed558ccd); x ^= x >> 33;
    return x;
}

static bool pairtab_add(pairtab *p, uint64_t k, int64_t c) {
    if ((p->n_used + 1) * 2 > p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 1 << 16;
        uint64_t *nk = tn_calloc(nc, sizeof *nk);
        int64_t *ncnt = tn_malloc(nc * sizeof *ncnt);
        size_t *nu = tn_malloc(nc * sizeof *nu);
        if (!nk || !ncnt || !nu) { tn_free(nk); tn_free(ncnt); tn_free(nu); return false; }
        size_t nn = 0;
        for (size_t i = 0; i < p->n_used; i++) {
            size_t s = p->used[i];
            size_t j = mix64(p->key[s]) & (nc - 1);
            while (nk[j]) j = (j + 1) & (nc - 1);
            nk[j] = p->key[s]; ncnt[j] = p->cnt[s]; nu[nn++] = j;
        }
        tn_free(p->key); tn_free(p->cnt); tn_free(p->used);
        p->key = nk; p->cnt = ncnt; p->used = nu; p->cap = nc;
    }
    k += 1;
    size_t j = mix64(k) & (p->cap - 1);
    while (p->key[j] && p->key[j] != k) j = (j + 1) & (p->cap - 1);
    if (!p->key[j]) { p->key[j] = k; p->cnt[j] = 0; p->used[p->n_used++] = j; }
    p->cnt[j] += c;
    return true;
}

static void pairtab_clear(pairtab *p) {
    for (size_t i = 0; i < p->n_used; i++) p->key[p->used[i]] = 0;
    p->n_used = 0;
}

typedef struct chr { int32_t idx; int64_t count; } chr;
static int chr_cmp(const void *a, const void *b) {
    const chr *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return x->idx - y->idx;
}

tern_status tn_bpe_train(const char *const *texts, const size_t *lens, int n_texts, int32_t vocab_size,
                         tn_vocab_data **out) {
    *out = NULL;
    const int32_t first_char = TN_BPE_FIRST_BYTE + 256;
    if (vocab_size < first_char + 1 || vocab_size > (1 << 20))
        return tn_err(TERN_ERR_INVALID_ARG, "bpe: --vocab %d out of range [%d, %d] (3 special + 256 byte "
                      "tokens + at least one character)", vocab_size, first_char + 1, 1 << 20);
    tern_status s = TERN_OK;
    strmap words = {0}, chars = {0}, toks = {0};
    word *wv = NULL;
    size_t nw = 0, wcap = 0;
    chr *cs = NULL;
    pairtab pt = {0};
    uint64_t *banned = NULL;
    size_t n_banned = 0;
    tn_vocab_data *v = NULL;
    int64_t total_bytes = 0;
    /* 1. word counts */
    for (int t = 0; t < n_texts; t++) {
        size_t nl;
        char *nb = normalize(texts[t], lens[t], &nl);
        if (!nb) { s = tn_err(TERN_ERR_NOMEM, "bpe: normalising text"); goto done; }
        size_t pos = 0, wl;
        total_bytes += (int64_t)lens[t];
        while ((wl = next_word(nb, nl, &pos))) {
            const char *w = nb + pos - wl;
            int32_t *c = strmap_put(&words, w, wl, -1);
            if (!c) { tn_free(nb); s = tn_err(TERN_ERR_NOMEM, "bpe: word table"); goto done; }
            if (*c < 0) {
                if (nw == wcap) {
                    wcap = wcap ? wcap * 2 : 4096;
                    word *nv = tn_realloc(wv, wcap * sizeof *wv);
                    if (!nv) { tn_free(nb); s = tn_err(TERN_ERR_NOMEM, "bpe: words"); goto done; }
                    wv = nv;
                }
                memset(&wv[nw], 0, sizeof wv[nw]);
                *c = (int32_t)nw++;
            }
            wv[*c].count++;
        }
        tn_free(nb);
    }
    if (!total_bytes || !nw) { s = tn_err(TERN_ERR_FORMAT, "bpe: the corpus is empty"); goto done; }
    /* 2. characters by frequency */
    for (size_t i = 0; i < words.cap; i++) {
        if (!words.h[i]) continue;
        const unsigned char *w = (const unsigned char *)words.pool + words.kofs[i];
        size_t n = words.klen[i];
        const word *wd = &wv[words.val[i]];
        for (size_t j = 0; j < n;) {
            int l = utf8_len(w + j, n - j);
            if (!l) l = 1;
            int32_t *c = strmap_put(&chars, (const char *)w + j, (size_t)l, 0);
            if (!c) { s = tn_err(TERN_ERR_NOMEM, "bpe: characters"); goto done; }
            (void)wd;
            j += (size_t)l;
        }
    }
    cs = tn_calloc(chars.n, sizeof *cs);
    if (!cs) { s = tn_err(TERN_ERR_NOMEM, "bpe: characters"); goto done; }
    {
        size_t k = 0;
        for (size_t i = 0; i < chars.cap; i++)
            if (chars.h[i]) { chars.val[i] = (int32_t)k; cs[k].idx = (int32_t)i; cs[k].count = 0; k++; }
    }
    for (size_t i = 0; i < words.cap; i++) {
        if (!words.h[i]) continue;
        const unsigned char *w = (const unsigned char *)words.pool + words.kofs[i];
        size_t n = words.klen[i];
        for (size_t j = 0; j < n;) {
            int l = utf8_len(w + j, n - j);
            if (!l) l = 1;
            cs[strmap_get(&chars, (const char *)w + j, (size_t)l)].count += wv[words.val[i]].count;
            j += (size_t)l;
        }
    }
    for (size_t k = 0; k < chars.n; k++) cs[k].idx = (int32_t)(cs[k].idx); /* slot index */
    {
        /* sort by count desc, ties by text (slot order is hash order: sort by bytes for stability) */
        qsort(cs, chars.n, sizeof *cs, chr_cmp);
    }
    v = vocab_alloc(vocab_size);
    if (!v) { s = tn_err(TERN_ERR_NOMEM, "bpe: vocabulary"); goto done; }
    v->text[0] = tn_strdup("<unk>"); v->type[0] = TN_TOKEN_TYPE_UNKNOWN;
    v->text[1] = tn_strdup("<s>"); v->type[1] = TN_TOKEN_TYPE_CONTROL;
    v->text[2] = tn_strdup("</s>"); v->type[2] = TN_TOKEN_TYPE_CONTROL;
    for (int b = 0; b < 256; b++) {
        char t[8];
        snprintf(t, sizeof t, "<0x%02X>", b);
        v->text[TN_BPE_FIRST_BYTE + b] = tn_strdup(t);
        v->type[TN_BPE_FIRST_BYTE + b] = TN_TOKEN_TYPE_BYTE;
    }
    v->n = first_char;
    for (int32_t i = 0; i < v->n; i++)
        if (!v->text[i] || !strmap_put(&toks, v->text[i], strlen(v->text[i]), i)) {
            s = tn_err(TERN_ERR_NOMEM, "bpe: vocabulary"); goto done;
        }
    /* alphabet: the most frequent characters, leaving at least a quarter of the room to merges
     * (characters beyond it fall back to byte tokens) */
    int32_t room = vocab_size - first_char;
    int32_t n_alpha = (int32_t)TN_MIN((size_t)room, chars.n);
    if (n_alpha > 1 && chars.n > (size_t)(room - room / 4)) n_alpha = TN_MAX(1, room - room / 4);
    strmap alpha_id = {0};
    for (int32_t k = 0; k < n_alpha; k++) {
        const char *ct = chars.pool + chars.kofs[cs[k].idx];
        size_t cl = chars.klen[cs[k].idx];
        int32_t id = v->n++;
        v->text[id] = tn_strndup(ct, cl);
        v->type[id] = TN_TOKEN_TYPE_NORMAL;
        v->score[id] = -1e6f - (float)k;
        if (!v->text[id] || !strmap_put(&toks, v->text[id], cl, id) || !strmap_put(&alpha_id, ct, cl, id)) {
            strmap_free(&alpha_id);
            s = tn_err(TERN_ERR_NOMEM, "bpe: vocabulary"); goto done;
        }
    }
    /* 3. words as symbol sequences (-1 = a character outside the alphabet: a barrier) */
    for (size_t i = 0; i < words.cap; i++) {
        if (!words.h[i]) continue;
        word *wd = &wv[words.val[i]];
        const unsigned char *w = (const unsigned char *)words.pool + words.kofs[i];
        size_t n = words.klen[i];
        wd->sym = tn_malloc(n * sizeof *wd->sym);
        if (!wd->sym) { strmap_free(&alpha_id); s = tn_err(TERN_ERR_NOMEM, "bpe: words"); goto done; }
        for (size_t j = 0; j < n;) {
            int l = utf8_len(w + j, n - j);
            if (!l) l = 1;
            wd->sym[wd->n++] = strmap_get(&alpha_id, (const char *)w + j, (size_t)l);
            j += (size_t)l;
        }
    }
    strmap_free(&alpha_id);
    /* 4. merges */
    int32_t rank = 0;
    while (v->n < vocab_size) {
        pairtab_clear(&pt);
        for (size_t i = 0; i < nw; i++) {
            const word *wd = &wv[i];
            for (int32_t j = 0; j + 1 < wd->n; j++) {
                if (wd->sym[j] < 0 || wd->sym[j + 1] < 0) continue;
                if (!pairtab_add(&pt, (uint64_t)wd->sym[j] << 32 | (uint32_t)wd->sym[j + 1], wd->count)) {
                    s = tn_err(TERN_ERR_NOMEM, "bpe: pair table"); goto done;
                }
            }
        }
        uint64_t best = 0;
        int64_t bc = 0;
        for (size_t i = 0; i < pt.n_used; i++) {
            size_t sl = pt.used[i];
            uint64_t k = pt.key[sl] - 1;
            bool ban = false;
            for (size_t b = 0; b < n_banned; b++) ban |= banned[b] == k;
            if (ban) continue;
            if (pt.cnt[sl] > bc || (pt.cnt[sl] == bc && k < best)) { bc = pt.cnt[sl]; best = k; }
        }
        if (bc == 0) {
            s = tn_err(TERN_ERR_INVALID_ARG, "bpe: the corpus supports at most %d tokens (no pair left to "
                       "merge); use --vocab %d or less, or more text", v->n, v->n);
            goto done;
        }
        const int32_t a = (int32_t)(best >> 32), b = (int32_t)(best & 0xFFFFFFFFu);
        size_t la = strlen(v->text[a]), lb = strlen(v->text[b]);
        char *mt = tn_malloc(la + lb + 1);
        if (!mt) { s = tn_err(TERN_ERR_NOMEM, "bpe: merge"); goto done; }
        memcpy(mt, v->text[a], la); memcpy(mt + la, v->text[b], lb); mt[la + lb] = 0;
        int32_t id = strmap_get(&toks, mt, la + lb);
        if (id >= 0 && id < first_char) { /* would collide with a special/byte token text */
            tn_free(mt);
            uint64_t *nb = tn_realloc(banned, (n_banned + 1) * sizeof *nb);
            if (!nb) { s = tn_err(TERN_ERR_NOMEM, "bpe: merge"); goto done; }
            banned = nb;
            banned[n_banned++] = best;
            continue;
        }
        if (id < 0) {
            id = v->n++;
            v->text[id] = mt;
            v->type[id] = TN_TOKEN_TYPE_NORMAL;
            v->score[id] = -(float)rank++;
            if (!strmap_put(&toks, mt, la + lb, id)) { s = tn_err(TERN_ERR_NOMEM, "bpe: merge"); goto done; }
        } else {
            tn_free(mt);
        }
        for (size_t i = 0; i < nw; i++) {
            word *wd = &wv[i];
            int32_t o = 0;
            for (int32_t j = 0; j < wd->n; j++) {
                if (j + 1 < wd->n && wd->sym[j] == a && wd->sym[j + 1] == b) { wd->sym[o++] = id; j++; }
                else wd->sym[o++] = wd->sym[j];
            }
            wd->n = o;
        }
    }
    *out = v;
    v = NULL;
done:
    tn_vocab_data_free(v);
    for (size_t i = 0; i < nw; i++) tn_free(wv[i].sym);
    tn_free(wv);
    tn_free(cs);
    tn_free(banned);
    tn_free(pt.key); tn_free(pt.cnt); tn_free(pt.used);
    strmap_free(&words); strmap_free(&chars); strmap_free(&toks);
    return s;
}

/* ---- SPM encoder ------------------------------------------------------------------------- */
struct tn_spm_enc {
    const tn_vocab_data *v;
    strmap tok;       /* text → id */
    strmap cache;     /* word → index into ent */
    int32_t *ctok;    /* cached token ids */
    size_t n_ctok, cap_ctok;
    struct { uint32_t off, n; } *ent;
    size_t n_ent, cap_ent;
    int32_t byte_tok[256];
};

void tn_spm_enc_free(tn_spm_enc *e) {
    if (!e) return;
    strmap_free(&e->tok);
    strmap_free(&e->cache);
    tn_free(e->ctok);
    tn_free(e->ent);
    tn_free(e);
}

tern_status tn_spm_enc_create(const tn_vocab_data *v, tn_spm_enc **out) {
    *out = NULL;
    tn_spm_enc *e = tn_calloc(1, sizeof *e);
    if (!e) return tn_err(TERN_ERR_NOMEM, "train: encoder");
    e->v = v;
    for (int b = 0; b < 256; b++) e->byte_tok[b] = -1;
    for (int32_t i = 0; i < v->n; i++) {
        if (v->type[i] == TN_TOKEN_TYPE_BYTE) {
            unsigned b;
            if (sscanf(v->text[i], "<0x%02X>", &b) == 1 && b < 256) e->byte_tok[b] = i;
            continue;
        }
        if (v->type[i] == TN_TOKEN_TYPE_CONTROL || v->type[i] == TN_TOKEN_TYPE_UNKNOWN) continue;
        int32_t *p = strmap_put(&e->tok, v->text[i], strlen(v->text[i]), i);
        if (!p) { tn_spm_enc_free(e); return tn_err(TERN_ERR_NOMEM, "train: encoder"); }
    }
    *out = e;
    return TERN_OK;
}

typedef struct sym { int32_t prev, next; uint32_t off, n; } sym;
typedef struct bigram { int32_t left, right; float score; uint32_t size; } bigram;

static bool bg_less(const bigram *x, const bigram *y) { /* x has lower priority than y */
    return x->score < y->score || (x->score == y->score && x->left > y->left);
}
static void heap_push(bigram *h, size_t *n, bigram b) {
    size_t i = (*n)++;
    h[i] = b;
    while (i && bg_less(&h[(i - 1) / 2], &h[i])) {
        bigram t = h[i]; h[i] = h[(i - 1) / 2]; h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}
static bigram heap_pop(bigram *h, size_t *n) {
    bigram top = h[0];
    h[0] = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && bg_less(&h[m], &h[l])) m = l;
        if (r < *n && bg_less(&h[m], &h[r])) m = r;
        if (m == i) break;
        bigram t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
    return top;
}

static bool push_tok(int32_t **toks, size_t *n, size_t *cap, int32_t t) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 1024;
        int32_t *p = tn_realloc(*toks, nc * sizeof *p);
        if (!p) return false;
        *toks = p;
        *cap = nc;
    }
    (*toks)[(*n)++] = t;
    return true;
}

/* llama.cpp llm_tokenizer_spm over one word. */
static tern_status encode_word(tn_spm_enc *e, const char *w, size_t n, int32_t **toks, size_t *nt, size_t *cap) {
    sym *sy = tn_malloc((n + 1) * sizeof *sy);
    bigram *hp = tn_malloc((2 * n + 2) * sizeof *hp);
    tern_status s = TERN_OK;
    if (!sy || !hp) { s = tn_err(TERN_ERR_NOMEM, "train: encoding"); goto done; }
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        int l = utf8_len((const unsigned char *)w + i, n - i);
        if (!l) l = 1;
        sy[ns] = (sym){ns - 1, ns + 1, (uint32_t)i, (uint32_t)l};
        ns++;
        i += (size_t)l;
    }
    if (ns) sy[ns - 1].next = -1;
    size_t nh = 0;
#define TRY_BIGRAM(L, R)                                                                       \
    do {                                                                                       \
        if ((L) >= 0 && (R) >= 0) {                                                            \
            int32_t id_ = strmap_get(&e->tok, w + sy[L].off, sy[L].n + sy[R].n);               \
            if (id_ >= 0) heap_push(hp, &nh, (bigram){L, R, e->v->score[id_], sy[L].n + sy[R].n}); \
        }                                                                                      \
    } while (0)
    for (int32_t i = 1; i < ns; i++) TRY_BIGRAM(i - 1, i);
    while (nh) {
        bigram b = heap_pop(hp, &nh);
        sym *L = &sy[b.left], *R = &sy[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue;
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) sy[R->next].prev = b.left;
        TRY_BIGRAM(L->prev, b.left);
        TRY_BIGRAM(b.left, L->next);
    }
#undef TRY_BIGRAM
    for (int32_t i = 0; ns && i != -1; i = sy[i].next) {
        int32_t id = strmap_get(&e->tok, w + sy[i].off, sy[i].n);
        if (id >= 0) {
            if (!push_tok(toks, nt, cap, id)) { s = tn_err(TERN_ERR_NOMEM, "train: encoding"); goto done; }
        } else {
            for (uint32_t j = 0; j < sy[i].n; j++) {
                int32_t bt = e->byte_tok[(unsigned char)w[sy[i].off + j]];
                if (bt < 0) bt = e->v->unk;
                if (!push_tok(toks, nt, cap, bt)) { s = tn_err(TERN_ERR_NOMEM, "train: encoding"); goto done; }
            }
        }
    }
done:
    tn_free(sy);
    tn_free(hp);
    return s;
}

tern_status tn_spm_encode(tn_spm_enc *e, const char *text, size_t len, int32_t **toks, size_t *n, size_t *cap) {
    if (len == 0) return TERN_OK; /* as llama.cpp: no space prefix for empty text */
    size_t nl;
    char *nb = normalize(text, len, &nl);
    if (!nb) return tn_err(TERN_ERR_NOMEM, "train: encoding");
    size_t pos = 0, wl;
    tern_status s = TERN_OK;
    while ((wl = next_word(nb, nl, &pos))) {
        const char *w = nb + pos - wl;
        int32_t ci = strmap_get(&e->cache, w, wl);
        if (ci < 0) {
            size_t before = *n;
            if ((s = encode_word(e, w, wl, toks, n, cap))) break;
            if (e->n_ent == e->cap_ent) {
                size_t nc = e->cap_ent ? e->cap_ent * 2 : 1024;
                void *p = tn_realloc(e->ent, nc * sizeof *e->ent);
                if (!p) { s = tn_err(TERN_ERR_NOMEM, "train: encoding"); break; }
                e->ent = p;
                e->cap_ent = nc;
            }
            e->ent[e->n_ent].off = (uint32_t)e->n_ctok;
            e->ent[e->n_ent].n = (uint32_t)(*n - before);
            for (size_t i = before; i < *n; i++)
                if (!push_tok(&e->ctok, &e->n_ctok, &e->cap_ctok, (*toks)[i])) { s = tn_err(TERN_ERR_NOMEM, "train: encoding"); goto done; }
            if (!strmap_put(&e->cache, w, wl, (int32_t)e->n_ent)) { s = tn_err(TERN_ERR_NOMEM, "train: encoding"); goto done; }
            e->n_ent++;
        } else {
            for (uint32_t i = 0; i < e->ent[ci].n; i++)
                if (!push_tok(toks, n, cap, e->ctok[e->ent[ci].off + i])) { s = tn_err(TERN_ERR_NOMEM, "train: encoding"); goto done; }
        }
    }
done:
    tn_free(nb);
    return s;
}
