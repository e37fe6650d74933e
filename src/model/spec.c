/*
 * spec.c — speculative decoding (spec.h): n-gram drafts, a draft model's greedy drafts, and the
 * exact-match verification of a drafted run in one batched forward pass.
 */
#include <math.h>
#include <string.h>

#include "model/spec.h"

int32_t tn_spec_ngram(const tern_token *hist, int32_t n, int32_t nmin, int32_t nmax, int32_t kmax, tern_token *out) {
    if (nmin < 1) nmin = 1;
    for (int32_t g = nmax; g >= nmin; g--) {
        if (g >= n) continue;
        const tern_token *key = hist + n - g;
        /* the most recent earlier place j with hist[j .. j+g) == key and a token after it */
        for (int32_t j = n - g - 1; j >= 0; j--) {
            if (memcmp(hist + j, key, sizeof *key * (size_t)g) != 0) continue;
            int32_t k = 0;
            while (k < kmax && j + g + k < n) {
                out[k] = hist[j + g + k];
                k++;
            }
            return k;
        }
    }
    return 0;
}

tern_status tn_spec_verify(tern_ctx *c, tern_sampler *smp, tern_token cur, const tern_token *draft, int32_t k,
                           tern_token *out, int32_t *n_out) {
    *n_out = 0;
    enum { KMAX = 64 };
    const int32_t n = k + 1, base = c->n_past;
    if (k < 0 || n > c->n_logits_cap || n > c->n_batch || n > KMAX)
        return tn_err(TERN_ERR_INVALID_ARG, "speculative step: %d drafted tokens; the context verifies at most %d", k,
                      TN_MIN(TN_MIN(c->n_logits_cap, c->n_batch), KMAX) - 1);
    if ((int64_t)base + n > c->n_ctx)
        return tn_err(TERN_ERR_FULL, "context full: %d tokens in cache + %d new > n_ctx %d", base, n, c->n_ctx);
    tern_token toks[KMAX];
    toks[0] = cur;
    if (k) memcpy(toks + 1, draft, sizeof *draft * (size_t)k);
    for (int32_t i = 0; i < n; i++) {
        if (toks[i] < 0 || toks[i] >= c->hp.n_vocab)
            return tn_err(TERN_ERR_INVALID_ARG, "speculative step: token %d outside vocabulary 0..%d", toks[i], c->hp.n_vocab - 1);
        c->b_seq[i] = 0;
        c->b_pos[i] = base + i;
        c->b_logits[i] = 1;
    }
    tn_batch b = {n, toks, c->b_seq, c->b_pos, c->b_logits};
    tn_forward_batch(c, &b, NULL, NULL);
    if (c->dev_status) {
        tern_status s = c->dev_status;
        c->dev_status = TERN_OK;
        c->n_logits = 0;
        return s;
    }
    /* the sampler at each position in order, as one-token decoding would call it */
    int32_t e = 0;
    for (int32_t i = 0; i <= k; i++) {
        const tern_token t = tern_sampler_sample(smp, c->logits + (size_t)i * (size_t)c->hp.n_vocab);
        out[e++] = t;
        if (i == k || t != draft[i]) break;
    }
    *n_out = e;
    c->n_past = base + e; /* cur and the accepted drafts; the rejected rows are dropped */
    c->n_logits = 0;
    return TERN_OK;
}

double tn_spec_prob(const float *l, int32_t n, int32_t t) {
    float mx = l[0];
    for (int32_t i = 1; i < n; i++) mx = l[i] > mx ? l[i] : mx;
    double z = 0;
    for (int32_t i = 0; i < n; i++) z += exp((double)l[i] - (double)mx);
    return exp((double)l[t] - (double)mx) / z;
}

int32_t tn_spec_argmax(const float *l, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

tern_status tn_spec_vocab_check(const tern_model *target, const tern_model *draft) {
    const int32_t nv = tern_model_n_vocab(target);
    if (tern_model_n_vocab(draft) != nv)
        return tn_err(TERN_ERR_FORMAT, "its vocabulary has %d tokens, the model's %d", tern_model_n_vocab(draft), nv);
    char a[256], b[256];
    for (tern_token t = 0; t < nv; t++) {
        const int32_t la = tern_token_to_piece(target, t, a, sizeof a, true);
        const int32_t lb = tern_token_to_piece(draft, t, b, sizeof b, true);
        if (la != lb || (la > 0 && memcmp(a, b, (size_t)la) != 0))
            return tn_err(TERN_ERR_FORMAT, "token %d is '%.*s' there and '%.*s' in the model: not the same vocabulary", (int)t,
                          lb > 0 ? (int)lb : 0, b, la > 0 ? (int)la : 0, a);
    }
    return TERN_OK;
}

int32_t tn_spec_draft_model(tn_spec_draft *d, const tern_token *hist, int32_t n, int32_t k, tern_token *out) {
    tern_ctx *c = d->c;
    if (n < 1 || k < 1) return 0;
    if (d->n_fed >= n) { /* nothing new: step back one token to get its logits again */
        tern_ctx_truncate(c, n - 1);
        d->n_fed = tern_ctx_n_past(c); /* less if a sliding-window ring had to be cleared */
    }
    const int32_t room = c->n_ctx - n; /* drafts fed: k - 1 after the n tokens */
    if (k > room) k = room;
    if (k < 1) return 0;
    if (tern_decode(c, hist + d->n_fed, n - d->n_fed)) return -1;
    d->n_fed = n;
    d->n_extra = 0;
    int32_t j = 0;
    while (j < k) {
        const float *l = tern_get_logits(c, -1);
        const tern_token t = tn_spec_argmax(l, c->hp.n_vocab);
        if (d->p_min > 0 && tn_spec_prob(l, c->hp.n_vocab, t) < d->p_min) break; /* unsure: stop here */
        out[j++] = t;
        if (j == k) break;
        if (tern_decode(c, &t, 1)) return -1;
        d->n_extra++; /* fed: its logits propose the next draft */
    }
    return j;
}

void tn_spec_draft_accept(tn_spec_draft *d, int32_t n_accepted) {
    /* its cache: the text it was fed, then its own first n_extra drafts; the accepted ones are
     * the text's next tokens, the rest go */
    const int32_t keep = TN_MIN(n_accepted, d->n_extra);
    d->n_extra = 0;
    tern_ctx_truncate(d->c, d->n_fed + keep);
    d->n_fed = tern_ctx_n_past(d->c); /* less if a sliding-window ring had to be cleared */
}
