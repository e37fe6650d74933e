/*
 * spec.h — speculative decoding: drafts (n-grams of the text so far, or a small draft model with
 * the same vocabulary) verified by the target in one batched pass.
 *
 * Verification is exact-match: the target's sampler is called on the logits of each drafted
 * position in order — the very calls, with the same history and random stream, that decoding one
 * token at a time would make — and a draft token is kept while the sampler picks it. The first
 * pick that differs is emitted instead and ends the step. So the output is the one tern gives
 * without speculation, greedy or sampled, for the same seed (up to the batched pass's rounding,
 * which the tests bound); for a deterministic drafter (n-grams, a greedy draft model) it accepts
 * a draft token with probability p(token), what rejection sampling would.
 */
#ifndef TN_MODEL_SPEC_H
#define TN_MODEL_SPEC_H

#include "model/ctx.h"

/* N-gram (prompt lookup) draft: the longest suffix of hist[0..n) of length nmax down to nmin that
 * occurred earlier in hist, at its most recent earlier place, proposes the tokens that followed it
 * there (up to kmax, and never past hist's end). Returns how many it wrote to out (0: none). */
int32_t tn_spec_ngram(const tern_token *hist, int32_t n, int32_t nmin, int32_t nmax, int32_t kmax, tern_token *out);

/* One verification step on c, whose cache holds the tokens before cur: runs [cur, draft[0..k)]
 * as one batch (logits for each), samples with smp position by position while the picks equal the
 * drafts, and writes the emitted tokens to out (the accepted drafts, then the sampler's own pick
 * at the first mismatch or after the last draft): *n_out in 1 .. k + 1. The cache then holds cur
 * and the accepted drafts (the last emitted token is the next cur). k + 1 <= c's logit rows and
 * n_past + k + 1 <= n_ctx are checked. */
tern_status tn_spec_verify(tern_ctx *c, tern_sampler *smp, tern_token cur, const tern_token *draft, int32_t k,
                           tern_token *out, int32_t *n_out);

/* A draft model's context kept in step with the text: feeds the tokens of hist it has not seen
 * (hist[0..n), whose last is the current token), then drafts up to k tokens greedily, stopping
 * before the first whose probability under the draft model is below p_min (0: never). Returns the
 * number drafted (or -1 on an error, tern_last_error says which). After the target's step, the
 * caller tells it how many of its drafts were accepted (tn_spec_draft_accept). */
typedef struct tn_spec_draft {
    tern_ctx *c;
    int32_t n_fed;    /* tokens of hist in its cache                                  */
    int32_t n_extra;  /* of its own drafts in its cache after the last step           */
    float p_min;      /* drafting stops before a token the draft gives less than this */
} tn_spec_draft;
/* softmax(l)[t] over n logits, in double. */
double tn_spec_prob(const float *l, int32_t n, int32_t t);
/* The first index of the largest logit (a greedy draft's pick). */
int32_t tn_spec_argmax(const float *l, int32_t n);
/* TERN_OK when draft has target's vocabulary (each token's text compared), else TERN_ERR_FORMAT
 * saying where they differ. */
tern_status tn_spec_vocab_check(const tern_model *target, const tern_model *draft);
int32_t tn_spec_draft_model(tn_spec_draft *d, const tern_token *hist, int32_t n, int32_t k, tern_token *out);
void tn_spec_draft_accept(tn_spec_draft *d, int32_t n_accepted);

#endif
