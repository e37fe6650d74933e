/*
 * tokenizer_bpe.c — byte-level BPE ("gpt2" vocabularies), as llama.cpp's
 * llm_tokenizer_bpe_session does it.
 *
 * The pre-tokenizer (tokenizer_pre.c) splits the text into words; each word's bytes are mapped
 * to GPT-2's printable code points (tn_byte_to_cp) and cut into characters. Adjacent pairs that
 * are merges go into a min-heap keyed by merge rank (ties: leftmost first); the best is merged
 * and its new neighbours are offered. A final symbol that is not a token is emitted byte by byte
 * as the one-byte tokens that exist (llama.cpp drops the others silently, and so do we). With
 * ignore_merges (llama3 and friends) a word that is itself a token is emitted whole.
 *
 * Does not: split special tokens (tokenizer.c did).
 */
#include "model/tokenizer_impl.h"

typedef struct bpe_sym {
    int32_t prev, next;
    const char *text;
    size_t n;
} bpe_sym;

typedef struct bpe_bigram {
    int32_t left, right;
    int32_t rank;
    uint32_t size;
} bpe_bigram;

static inline bool bpe_before(const bpe_bigram *a, const bpe_bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

typedef struct bpe_work {
    bpe_sym *syms;
    size_t syms_cap;
    bpe_bigram *heap;
    size_t hn, hcap;
} bpe_work;

static tern_status bpe_push(bpe_work *w, bpe_bigram x) {
    if (w->hn == w->hcap) {
        size_t cap = w->hcap ? w->hcap * 2 : 64;
        bpe_bigram *np = tn_realloc(w->heap, cap * sizeof *np);
        if (!np) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
        w->heap = np;
        w->hcap = cap;
    }
    size_t i = w->hn++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!bpe_before(&x, &w->heap[up])) break;
        w->heap[i] = w->heap[up];
        i = up;
    }
    w->heap[i] = x;
    return TERN_OK;
}

static bpe_bigram bpe_pop(bpe_work *w) {
    bpe_bigram top = w->heap[0], last = w->heap[--w->hn];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= w->hn) break;
        if (c + 1 < w->hn && bpe_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!bpe_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (w->hn) w->heap[i] = last;
    return top;
}

static tern_status bpe_try_add(const tn_vocab *v, bpe_work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return TERN_OK;
    const bpe_sym *l = &w->syms[left], *r = &w->syms[right];
    int32_t rank = tn_vocab_merge_rank(v, l->text, l->n, r->text, r->n);
    if (rank < 0) return TERN_OK;
    bpe_bigram b = {left, right, rank, (uint32_t)(l->n + r->n)};
    return bpe_push(w, b);
}

/* Tokenizes one byte-encoded word. */
static tern_status bpe_word(const tn_vocab *v, bpe_work *w, const char *word, size_t n, tn_ivec *out) {
    tern_status s;
    if (n == 0) return TERN_OK;
    if (v->ignore_merges) {
        int32_t id = tn_vocab_find(v, word, n);
        if (id >= 0) return tn_ivec_push(out, id);
    }
    if (n > (size_t)INT32_MAX) return tn_err(TERN_ERR_INVALID_ARG, "tokenizer: word of %zu bytes is too long", n);
    if (w->syms_cap < n) {
        bpe_sym *np = tn_realloc(w->syms, n * sizeof *np);
        if (!np) return tn_err(TERN_ERR_NOMEM, "tokenizer: out of memory");
        w->syms = np;
        w->syms_cap = n;
    }
    int32_t ns = 0;
    for (size_t off = 0; off < n;) {
        size_t len = TN_MIN(tn_utf8_len((unsigned char)word[off]), n - off);
        w->syms[ns].text = word + off;
        w->syms[ns].n = len;
        off += len;
        w->syms[ns].prev = ns - 1;
        w->syms[ns].next = off == n ? -1 : ns + 1;
        ns++;
    }
    w->hn = 0;
    for (int32_t i = 1; i < ns; i++)
        if ((s = bpe_try_add(v, w, i - 1, i))) return s;

    while (w->hn) {
        bpe_bigram b = bpe_pop(w);
        bpe_sym *l = &w->syms[b.left], *r = &w->syms[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* outdated */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->syms[r->next].prev = b.left;
        if ((s = bpe_try_add(v, w, l->prev, b.left))) return s;
        if ((s = bpe_try_add(v, w, b.left, l->next))) return s;
    }

    for (int32_t i = 0; i != -1; i = w->syms[i].next) {
        const bpe_sym *sym = &w->syms[i];
        int32_t id = tn_vocab_find(v, sym->text, sym->n);
        if (id >= 0) {
            if ((s = tn_ivec_push(out, id))) return s;
            continue;
        }
        for (size_t j = 0; j < sym->n; j++) {
            int32_t bt = tn_vocab_find(v, sym->text + j, 1);
            if (bt >= 0 && (s = tn_ivec_push(out, bt))) return s;
        }
    }
    return TERN_OK;
}

tern_status tn_bpe_tokenize(const tn_vocab *v, const char *text, size_t n, tn_ivec *out) {
    tn_bbuf words = {0}, enc = {0};
    tn_zvec lens = {0};
    bpe_work w = {0};
    tern_status s = tn_pretok_split(v->pretok, text, n, &words, &lens);
    size_t start = 0;
    for (size_t k = 0; !s && k < lens.n; k++) {
        enc.n = 0;
        for (size_t i = start; !s && i < start + lens.p[k]; i++) {
            char u[4];
            size_t m = tn_utf8_encode(tn_byte_to_cp((uint8_t)words.p[i]), u);
            s = tn_bbuf_put(&enc, u, m);
        }
        if (!s) s = bpe_word(v, &w, enc.p, enc.n, out);
        start += lens.p[k];
    }
    tn_free(words.p);
    tn_free(enc.p);
    tn_free(lens.p);
    tn_free(w.syms);
    tn_free(w.heap);
    return s;
}
