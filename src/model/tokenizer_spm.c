/*
 * tokenizer_spm.c — SentencePiece-style tokenization ("llama" vocabularies), as llama.cpp's
 * llm_tokenizer_spm_session does it.
 *
 * The text (already prefixed and with spaces escaped to U+2581 by the caller) is cut into UTF-8
 * characters (a lead byte's length, clipped at the end; invalid bytes are one-byte symbols).
 * Every adjacent pair whose concatenation is a token goes into a max-heap keyed by that token's
 * score (ties: leftmost first); the best pair is merged and its new neighbours are offered,
 * until no pair is left. Stale heap entries are recognised by their byte size. Symbols that are
 * not tokens are emitted byte by byte as <0xXX> tokens (or the raw one-byte token), else unk.
 *
 * When no token has U+2581 after other bytes (true of real SPM vocabularies), the text is merged
 * word by word — provably the same result, with a small heap.
 *
 * Does not: split special tokens (tokenizer.c did) or allocate per merge (one heap array).
 */
#include "model/tokenizer_impl.h"

typedef struct spm_sym {
    int32_t prev, next;
    const char *text;
    size_t n;
} spm_sym;

typedef struct spm_bigram { /* 16 bytes: the heap is the hot memory */
    int32_t left, right;
    float score;
    uint32_t size;
} spm_bigram;

/* a comes out of the heap before b */
static inline bool spm_before(const spm_bigram *a, const spm_bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct spm_heap {
    spm_bigram *p;
    size_t n, cap;
} spm_heap;

static tern_status spm_push(spm_heap *h, spm_bigram x) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        spm_bigram *np = tn_realloc(h->p, cap * sizeof *np);
        if (!np) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
        h->p = np;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!spm_before(&x, &h->p[up])) break;
        h->p[i] = h->p[up];
        i = up;
    }
    h->p[i] = x;
    return TERN_OK;
}

static spm_bigram spm_pop(spm_heap *h) {
    spm_bigram top = h->p[0], last = h->p[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && spm_before(&h->p[c + 1], &h->p[c])) c++;
        if (!spm_before(&h->p[c], &last)) break;
        h->p[i] = h->p[c];
        i = c;
    }
    if (h->n) h->p[i] = last;
    return top;
}

static tern_status spm_try_add(const tn_vocab *v, const spm_sym *syms, spm_heap *h, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return TERN_OK;
    size_t size = syms[left].n + syms[right].n; /* adjacent symbols are contiguous in the text */
    int32_t id = tn_vocab_find(v, syms[left].text, size);
    if (id < 0) return TERN_OK;
    spm_bigram b = {left, right, v->score[id], (uint32_t)size};
    return spm_push(h, b);
}

/* Merges symbols [s0, s1) (a closed chain) and appends their ids. */
static tern_status spm_segment(const tn_vocab *v, spm_sym *syms, int32_t s0, int32_t s1, spm_heap *h, tn_ivec *out) {
    tern_status s = TERN_OK;
    syms[s0].prev = -1;
    syms[s1 - 1].next = -1;
    h->n = 0;
    for (int32_t i = s0 + 1; i < s1 && !s; i++) s = spm_try_add(v, syms, h, i - 1, i);

    while (!s && h->n) {
        spm_bigram b = spm_pop(h);
        spm_sym *l = &syms[b.left], *r = &syms[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) syms[r->next].prev = b.left;
        s = spm_try_add(v, syms, h, l->prev, b.left);
        if (!s) s = spm_try_add(v, syms, h, b.left, l->next);
    }

    for (int32_t i = s0; !s && i != -1; i = syms[i].next) {
        const spm_sym *sym = &syms[i];
        int32_t id = tn_vocab_find(v, sym->text, sym->n);
        if (id >= 0) {
            s = tn_ivec_push(out, id);
            continue;
        }
        /* merged symbols are always tokens, so this is one character: byte fallback */
        for (size_t j = 0; j < sym->n && !s; j++) {
            int32_t bt = v->byte_tok[(unsigned char)sym->text[j]];
            if (bt < 0) bt = v->unk; /* llama.cpp throws here; unk is the graceful answer */
            if (bt >= 0) s = tn_ivec_push(out, bt);
        }
    }
    return s;
}

static bool spm_is_ws(const char *p) { return memcmp(p, TN_SPM_SPACE, 3) == 0; }

tern_status tn_spm_tokenize(const tn_vocab *v, const char *text, size_t n, tn_ivec *out) {
    if (n == 0) return TERN_OK;
    if (n > (size_t)INT32_MAX) return tn_err(TERN_ERR_INVALID_ARG, "tokenizer: text fragment of %zu bytes is too long", n);
    spm_sym *syms = tn_malloc(n * sizeof *syms);
    spm_heap h = {0};
    tern_status s = TERN_OK;
    if (!syms) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");

    int32_t ns = 0;
    for (size_t off = 0; off < n;) {
        size_t len = TN_MIN(tn_utf8_len((unsigned char)text[off]), n - off);
        syms[ns].text = text + off;
        syms[ns].n = len;
        off += len;
        syms[ns].prev = ns - 1;
        syms[ns].next = off == n ? -1 : ns + 1;
        ns++;
    }
    /* With spm_split, no merge crosses a symbol U+2581 whose preceding bytes are not U+2581
     * (such a token would hold U+2581 after other bytes), so those words merge independently
     * and the result equals one global merge; the heap stays small. */
    int32_t s0 = 0;
    for (int32_t i = 1; i < ns && !s; i++) {
        size_t at = (size_t)(syms[i].text - text);
        if (v->spm_split && syms[i].n == 3 && spm_is_ws(syms[i].text) && (at < 3 || !spm_is_ws(syms[i].text - 3))) {
            s = spm_segment(v, syms, s0, i, &h, out);
            s0 = i;
        }
    }
    if (!s) s = spm_segment(v, syms, s0, ns, &h, out);
    tn_free(h.p);
    tn_free(syms);
    return s;
}
