/*
 * engine_cost.c — the serving engine's start-up cost model (engine.c's policy item 1): real
 * forward passes of 1, 2, 4 .. 128 rows, logit rows and a long context, fastest of 3, summarised
 * as sched.h's tn_cost.
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

static double timed_forward(tn_engine *e, tern_ctx *ctx, int32_t n) {
    tn_batch b = {n, e->b_tok, e->b_seq, e->b_pos, e->b_logits};
    double t0 = tn_srv_now();
    tn_forward_batch(ctx, &b, e->tables, ctx == e->ctx ? e->swa_tables : NULL);
    return tn_srv_now() - t0;
}

/* A prefill-like batch: n rows of sequence 0 at positions pos.., logits for the last row only
 * or for all; the fastest of the timings so far is kept in *best. */
static void time_rows(tn_engine *e, tern_ctx *ctx, int32_t n, int32_t pos, bool all_logits, double *best) {
    for (int32_t k = 0; k < n; k++) {
        e->b_tok[k] = (k * 7 + 1) % e->n_vocab;
        e->b_seq[k] = 0;
        e->b_pos[k] = pos + k;
        e->b_logits[k] = all_logits || k == n - 1;
    }
    double t = timed_forward(e, ctx, n);
    if (t < *best) *best = t;
}

/* The step cost model (sched.h) of ctx's model (the served one, or the draft model: it is paged
 * on the same blocks) from real forward passes, fastest of 3: batches of 1, 2, 4 .. 128 rows (one
 * logit row, short context), L rows each wanting logits, and K rows after D positions of context. */
void tn_eng_measure_cost(tn_engine *e, tern_ctx *ctx, tn_cost *c, const char *what) {
    int32_t P = e->n_batch < 128 ? e->n_batch : 128;
    if (P > e->n_ctx_seq - 1) P = e->n_ctx_seq - 1;
    int32_t L = e->np >= 2 ? e->np : 8, K = 32;
    if (L > P) L = P;
    if (L > ctx->n_logits_cap) L = ctx->n_logits_cap;
    if (K > P) K = P;
    int32_t D = e->n_ctx_seq - K - 1;
    if (D > 2048) D = 2048;
    if (P < 2 || L < 2 || D < K || blocks_for(D + K + 1) > e->kv.n_blocks) { /* a token guess; the load factor corrects it */
        *c = (tn_cost){2, {1, 128}, {1e-3, 1e-3 + 127e-4}, 1e-4, 0};
        return;
    }
    e->seqs[0].n_table = 0;
    tn_eng_ensure_blocks(e, &e->seqs[0], D + K);
    e->tables[0] = e->seqs[0].table;
    /* window blocks: any rows of the pool will do for timing (nothing else runs yet, a batch's
     * rows stay apart: its blocks are fewer than the pool's) */
    for (int32_t j = 0; e->kv_swa.n_blocks && j < e->seqs[0].n_table; j++) e->seqs[0].swa_table[j] = j % e->kv_swa.n_blocks;
    int n = 0;
    double pts[TN_COST_NPTS], t_l1 = 1e30, t_ll = 1e30, t_k = 1e30;
    for (int32_t r = 1; r <= P && n < TN_COST_NPTS; r *= 2) c->rows[n] = r, pts[n++] = 1e30;
    if (c->rows[n - 1] < P && n < TN_COST_NPTS) c->rows[n] = P, pts[n++] = 1e30;
    time_rows(e, ctx, 1, 0, false, &t_k); /* warm-up */
    t_k = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        for (int i = 0; i < n; i++) time_rows(e, ctx, c->rows[i], 0, false, &pts[i]);
        time_rows(e, ctx, L, 0, false, &t_l1);
        time_rows(e, ctx, L, 0, true, &t_ll);
        time_rows(e, ctx, K, D, false, &t_k);
    }
    for (int32_t j = 0; j < e->seqs[0].n_table; j++) tn_kv_release(&e->kv, e->seqs[0].table[j]);
    e->seqs[0].n_table = 0;
    c->n_pts = n;
    c->logit = (t_ll - t_l1) / (L - 1);
    if (c->logit < 0) c->logit = 0;
    /* the K rows at position 0: interpolated between the measured points */
    tn_cost raw = *c;
    memcpy(raw.t, pts, sizeof pts);
    c->key = (t_k - tn_cost_rows(&raw, K)) / ((double)K * D);
    if (c->key < 0) c->key = 0;
    for (int i = 0; i < n; i++) { /* the points without their own attention, non-decreasing */
        c->t[i] = pts[i] - c->key * (double)tn_chunk_keys(0, c->rows[i]);
        if (i && c->t[i] < c->t[i - 1]) c->t[i] = c->t[i - 1];
    }
    if (!e->cfg.quiet) {
        char buf[256];
        int k = 0;
        for (int i = 0; i < n && k < (int)sizeof buf - 32; i++)
            k += snprintf(buf + k, sizeof buf - (size_t)k, "%s%d:%.3g", i ? " " : "", c->rows[i], c->t[i] * 1e3);
        double t1 = tn_cost_rows(c, 1), tn = tn_cost_rows(c, e->np) + c->logit * (e->np - 1);
        fprintf(stderr,
                "tern serve: %s: step ms by rows %s; + %.2f ms per logit row, + %.3f ms per 1k attention keys "
                "(decode: batch 1 %.1f tok/s, batch %d %.1f tok/s)\n",
                what, buf, c->logit * 1e3, c->key * 1e6, 1.0 / t1, e->np, e->np / tn);
    }
}
