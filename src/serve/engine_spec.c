/*
 * engine_spec.c — speculative decoding in the serving engine (engine.c's policy item 7): each
 * step's n-gram drafts or the draft model's (--draft) greedy drafts, one batched pass per draft
 * over every sequence that verifies some, and the length each sequence verifies (tn_sched_spec).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "core/trace.h"
#include "model/ctx.h"
#include "serve/engine_impl.h"
#include "model/blocks.h"

/* One pass of the draft model over rows b_* [0, n) (its logits land in dctx). */
static void draft_forward(tn_engine *e, int32_t n) {
    for (int i = 0; i < e->np; i++) e->tables[i] = e->seqs[i].table;
    tn_batch b = {n, e->b_tok, e->b_seq, e->b_pos, e->b_logits};
    tn_forward_batch(e->dctx, &b, e->tables, NULL);
}

/* The drafts of this step's plan: every decoding sequence verifying spec > 0 drafts gets them
 * from the draft model, greedily, one batched pass per draft (all such sequences together). The
 * first pass also feeds the positions the draft model has not seen ([dn, n_done], ending with
 * the current token). A failed pass leaves the sequence without drafts. */
static void draft_run(tn_engine *e, int n_plan) {
    const double t0 = tn_srv_now();
    int32_t kmax = 0;
    for (int j = 0; j < n_plan; j++) {
        tn_seq *s = &e->seqs[e->plan_seq[j]];
        if (s->spec > 0 && !tn_eng_ensure_blocks(e, s, s->n_done + s->spec)) s->spec = 0;
        if (s->spec > kmax) kmax = s->spec;
    }
    for (int32_t pass = 0; pass < kmax; pass++) {
        int32_t n = 0, nl = 0;
        for (int j = 0; j < n_plan; j++) {
            const int i = e->plan_seq[j];
            tn_seq *s = &e->seqs[i];
            if (s->spec <= pass) continue;
            const int32_t from = pass ? s->n_done + pass : s->dn;
            if (n + (s->n_done + pass - from + 1) > e->dctx->n_batch || nl >= e->dctx->n_logits_cap) {
                s->spec = pass; /* no room in this pass: fewer drafts */
                continue;
            }
            for (int32_t pos = from; pos <= s->n_done + pass; pos++) {
                e->b_tok[n] = pass ? s->draft[pass - 1] : s->toks[pos];
                e->b_seq[n] = i;
                e->b_pos[n] = pos;
                e->b_logits[n++] = pos == s->n_done + pass;
            }
            e->b_owner[nl++] = i;
        }
        if (!n) break;
        draft_forward(e, n);
        if (e->dctx->dev_status || e->dctx->n_logits != nl) { /* no drafts this step */
            e->dctx->dev_status = TERN_OK;
            for (int j = 0; j < n_plan; j++) e->seqs[e->plan_seq[j]].spec = 0;
            break;
        }
        for (int k = 0; k < nl; k++) {
            tn_seq *s = &e->seqs[e->b_owner[k]];
            const float *l = e->dctx->logits + (size_t)k * e->n_vocab;
            s->draft[pass] = tn_spec_argmax(l, e->n_vocab);
            if (pass == 0) s->dn = s->n_done + 1;
            if (e->cfg.draft_p_min > 0 && tn_spec_prob(l, e->n_vocab, s->draft[pass]) < e->cfg.draft_p_min)
                s->spec = pass; /* unsure: the drafts before this one only (none at the first) */
        }
    }
    for (int j = 0; j < n_plan; j++) {
        tn_seq *s = &e->seqs[e->plan_seq[j]];
        s->n_draft = s->spec;
    }
    e->d_time += tn_srv_now() - t0;
}

/* After a step: the draft model catches up on the positions it has not seen (prompt chunks,
 * sequences that did not draft, an accepted last draft), so its cache covers [0, n_done) of every
 * sequence before the next step or a prefix-cache hit on its blocks. */
void tn_eng_draft_catch_up(tn_engine *e) {
    const double t0 = tn_srv_now();
    int32_t n = 0;
    for (int i = 0; i < e->np; i++) {
        tn_seq *s = &e->seqs[i];
        for (; s->active && s->dn < s->n_done; s->dn++) {
            if (n == e->dctx->n_batch) {
                draft_forward(e, n);
                n = 0;
            }
            e->b_tok[n] = s->toks[s->dn];
            e->b_seq[n] = i;
            e->b_pos[n] = s->dn;
            e->b_logits[n++] = 0;
        }
    }
    if (n) draft_forward(e, n);
    e->dctx->dev_status = TERN_OK; /* a failed pass costs only draft quality: the target verifies */
    e->d_time += tn_srv_now() - t0;
}

/* Speculative decoding: n-gram drafts for the decoding sequences of the plan and the length each
 * verifies (tn_sched_spec); sets seqs[].spec. A sequence drafts at most what it may still emit
 * minus one (its max_tokens and context), so its rows never pass the KV blocks reserved for
 * prompt + max_tokens. */
void tn_eng_plan_spec(tn_engine *e, int n_plan, tn_shape *shape) {
    for (int j = 0; j < n_plan; j++) {
        tn_seq *s = &e->seqs[e->plan_seq[j]];
        s->n_draft = s->spec = s->spec_acc = 0;
        s->spec_stop = false;
        const tn_sseq *q = &e->plan[j];
        tn_spec_seq *sp = &e->plan_spec[j];
        sp->drafts = 0;
        sp->acc = s->acc;
        if (q->chunk != 1 || s->n_done < s->n_prompt || s->n_toks - s->n_done != 1) continue;
        int32_t room = s->r->p.max_tokens - s->n_gen - 1, ctx = e->n_ctx_seq - s->n_toks - 1;
        if (room > ctx) room = ctx;
        if (room > e->spec.kmax) room = e->spec.kmax;
        if (room <= 0) continue;
        /* a draft model drafts once the lengths are chosen (below): its drafts cost passes */
        s->n_draft = e->dctx ? 0 : tn_spec_ngram(s->toks, s->n_toks, 1, e->cfg.spec_ngram_n, room, s->draft);
        sp->drafts = e->dctx ? room : s->n_draft;
    }
    e->spec.backlog = e->qn > 0 ? e->np : 0; /* waiting requests: drafts compete with their rows */
    tn_sched_spec(&e->sch, e->plan, e->plan_spec, n_plan, &e->spec, shape);
    for (int j = 0; j < n_plan; j++) e->seqs[e->plan_seq[j]].spec = e->plan_spec[j].k;
    if (e->dctx) draft_run(e, n_plan); /* may draft fewer */
    lock_met(e);
    for (int j = 0; j < n_plan; j++) {
        tn_seq *s = &e->seqs[e->plan_seq[j]];
        if (e->plan[j].chunk == 1 && s->n_done >= s->n_prompt) tn_metrics_spec_len(e->met, s->spec);
        e->met->spec_drafted += (uint64_t)s->spec;
    }
    unlock_met(e);
}
