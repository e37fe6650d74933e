/*
 * engine.c — the continuous-batching engine: one thread owns the tern_ctx (paged KV cache), the
 * block manager (kv.c) and up to n_parallel sequences. Each step builds ONE batch: one token for
 * every decoding sequence plus chunks of pending prefills, runs tn_forward_batch once, samples
 * the sequences whose logits came out, and pushes text to their requests.
 *
 * Scheduling policy (SLO-aware, after DistServe: a request counts toward goodput only if it meets
 * both its TTFT and its TPOT objective; the pure functions are in sched.c, tested in
 * tests/serve/test_serve_sched.c):
 *
 *   1. Cost model. At start-up real forward passes time steps of 1, 2, 4 .. 128 rows, one step
 *      with every row wanting logits and one over a long context; a step is predicted as
 *      t(rows) (interpolated: one row streams the weights, many rows are compute-bound) + a cost
 *      per extra logit row (output matmul, sampling) + a cost per (query, key) pair of attention.
 *   2. Load correction. After every step the ratio actual / predicted feeds an exponentially
 *      weighted mean and variance (alpha 0.25, so a 2-3x slowdown from other jobs on the cores
 *      shows within 2-3 steps). Steps are planned with mean + 1 sd of the ratio: the margin is
 *      wide while step times jump around and narrow when they are steady. Durations (for TTFT
 *      prediction) use the mean.
 *   3. TPOT. The client's TPOT is the mean gap between its tokens, (last - first) / (n - 1). A
 *      decoding sequence that has n tokens and is `bank` seconds ahead of the schedule
 *      first + (n - 1) * tpot may take a step of up to tpot + bank and still be on schedule; a
 *      sequence kept on schedule at every token meets the objective. So each step may last
 *      min over decoding sequences of tpot + min(bank, bank_cap) (bank_cap = 2 tpot bounds the
 *      pause any one step adds to a stream), and prefill chunks get the most tokens for which
 *      the planned time fits (none when the decodes alone fill it: no "minimum progress" chunk
 *      that breaks the objective). The bank is measured, not predicted: a step that ran long
 *      shrinks the next steps' room until the sequences are back on schedule.
 *   4. Prefill order and admission. Prefills run oldest first. A queued request gets a
 *      sequence slot (and its KV blocks) only when a slot is free and this step's plan gives
 *      its prompt tokens, so requests that cannot start yet wait in the queue, where they can
 *      still be refused. The queue is served least-slack-first (TTFT deadline minus predicted
 *      prefill time), FCFS without --ttft-slo.
 *   5. TTFT. With --ttft-slo, the predictor runs this very policy forward (tn_sched_simulate:
 *      running sequences decode their remaining max_tokens, queued requests start in order,
 *      steps last mean x prediction). An arriving request is refused at once (429 with
 *      Retry-After) when its predicted first token misses the objective or when it would push a
 *      queued request past its deadline; and before every step the queue is re-checked: a
 *      request that can no longer make its deadline (the machine slowed down, others ran long)
 *      leaves with 429 instead of being served late and delaying the rest. Its HTTP status is
 *      still open: streams send their headers only once the request starts.
 *   6. KV: a request is admitted only when the blocks for prompt + max_tokens (minus blocks
 *      found in the prefix cache) can be reserved, so running sequences never run out of blocks.
 *      Sliding-window layers (Gemma 2/3) hold only each sequence's window, in blocks of a pool of
 *      their own (kv_swa; swa_* functions), committed per sequence at admission.
 *   7. Speculation (--spec ngram). After the plan, each decoding sequence with n-gram drafts may
 *      add k draft rows after its current token (tn_sched_spec: expected tokens per predicted
 *      second, its live acceptance rate, the step's caps and TPOT limit). All its rows want
 *      logits and are sampled in order through the one per-token path (on_token); a draft is kept
 *      while the pick equals it, the first differing pick ends its step. n_done advances by the
 *      current token at once and by the kept drafts after sampling, so rejected positions (K/V
 *      written, not counted) are overwritten later and never published. k <= what the sequence
 *      may still emit - 1, so rows stay inside the blocks reserved for prompt + max_tokens.
 * TERN_SERVE_TRACE=FILE writes one line per step (shape, predicted and actual time, load
 * factor) and one per finished sequence (its mean gap in decode-only and in mixed steps).
 * Files: the engine's state is in engine_impl.h; item 1 is engine_cost.c, item 7 engine_spec.c, and
 * llama-server's /slots actions engine_slot.c.
 * Invariant: a sequence's tokens [0, n_done) have K/V in the blocks of its table; blocks below
 * n_pub are published in the prefix cache (shared, read-only from then on).
 */
#define _GNU_SOURCE 1 /* memmem */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base.h"
#include "core/trace.h"
#include "cuda/cuda.h"
#include "model/blocks.h"
#include "model/ctx.h"
#include "model/ops.h"
#include "model/pcache.h"
#include "model/spec.h"
#include "serve/kv.h"
#include "serve/sched.h"
#include "serve/serve.h"
#include "serve/slot.h"

double tn_srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- requests ---------------------------------------------------------------------------------- */
tn_sreq *tn_sreq_new(void) {
    tn_sreq *r = tn_calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->cancelled, 0);
    r->refs = 1;
    return r;
}

bool tn_sreq_choices(tn_sreq *r) {
    r->ch = tn_calloc((size_t)(r->p.n > 0 ? r->p.n : 1), sizeof *r->ch);
    if (r->p.echo && r->p.logprobs) /* prompt logprobs */
        r->plp = tn_calloc((size_t)r->p.n_prompt * (1 + (size_t)r->p.top_logprobs), sizeof *r->plp);
    return r->ch != NULL && (r->plp || !(r->p.echo && r->p.logprobs));
}

int32_t tn_sreq_n_gen(const tn_sreq *r) {
    int32_t n = 0;
    for (int i = 0; r->ch && i < r->p.n; i++) n += r->ch[i].n_gen;
    return n;
}

void tn_sreq_release(tn_sreq *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    for (int i = 0; r->ch && i < r->p.n; i++) {
        tn_free(r->ch[i].out);
        tn_free(r->ch[i].lp);
        tn_free(r->ch[i].lp_off);
    }
    tn_free(r->ch);
    tn_free(r->plp);
    tn_req_params_free(&r->p);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    tn_free(r);
}

size_t tn_utf8_copy(char *dst, size_t *dlen, const char *src, size_t n, bool final) {
    /* Unicode "maximal subpart" replacement (as Python's errors='replace' and WHATWG do) */
    const unsigned char *s = (const unsigned char *)src;
    size_t i = 0, o = *dlen;
    while (i < n) {
        unsigned c = s[i];
        int need = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (need == 1) {
            dst[o++] = (char)c;
            i++;
            continue;
        }
        int k = 1; /* bytes of a valid prefix */
        if (need) {
            unsigned lo = 0x80, hi = 0xBF;
            if (c == 0xE0) lo = 0xA0;
            else if (c == 0xED) hi = 0x9F;
            else if (c == 0xF0) lo = 0x90;
            else if (c == 0xF4) hi = 0x8F;
            while (k < need && i + (size_t)k < n) {
                unsigned d = s[i + (size_t)k];
                if (d < lo || d > hi) break;
                lo = 0x80, hi = 0xBF;
                k++;
            }
            if (k == need) {
                memcpy(dst + o, s + i, (size_t)need);
                o += (size_t)need;
                i += (size_t)need;
                continue;
            }
            if (i + (size_t)k == n && !final) break; /* wait for the rest of the sequence */
        }
        memcpy(dst + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += (size_t)k;
    }
    dst[o] = 0;
    *dlen = o;
    return i;
}

/* Appends valid UTF-8 from s[0..n) to a choice's text (caller holds the request's mu); *used
 * gets the bytes of s consumed. false when out of memory. */
static bool out_append_utf8(tn_choice *c, const char *s, size_t n, bool final, size_t *used) {
    if (c->out_len + 3 * n + 1 > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 256;
        while (cap < c->out_len + 3 * n + 1) cap *= 2;
        char *q = tn_realloc(c->out, cap);
        if (!q) return false;
        c->out = q;
        c->out_cap = cap;
    }
    *used = tn_utf8_copy(c->out, &c->out_len, s, n, final);
    return true;
}

#include "serve/engine_impl.h"

int32_t tn_engine_n_ctx_seq(const tn_engine *e) { return e->n_ctx_seq; }

/* After a request's first block loaded from disk: was it slower per token than computing it (the
 * scheduler's cost per prefill token in a batch, or the configured speed)? Then the rest of the
 * prompt is recomputed, as tern generate's cost model decides. */
static bool pc_load_slower(const tn_engine *e) {
    double per_tok;
    if (e->cfg.prompt_cache_prefill_tok_s > 0) per_tok = 1.0 / e->cfg.prompt_cache_prefill_tok_s;
    else {
        double cost[3];
        tn_engine_cost(e, cost);
        per_tok = cost[2];
    }
    return per_tok > 0 && tn_pcache_last_load_s(e->pc) / TN_KVB > per_tok;
}
bool tn_engine_pcache_stats(const tn_engine *e, tn_pcache_stats *out) {
    if (!e->pc) return false;
    tn_pcache_stats_copy(e->pc, out);
    return true;
}
void tn_engine_cost(const tn_engine *e, double out[3]) { /* the linear summary behind the tern_cost_* gauges */
    const tn_cost *c = &e->sch.cost;
    int32_t np = e->np > 1 ? e->np : 2;
    out[1] = (tn_cost_rows(c, np) - tn_cost_rows(c, 1)) / (np - 1) + c->logit;
    out[0] = tn_cost_rows(c, 1) - out[1];
    if (out[0] < 0) out[0] = 0;
    out[2] = (tn_cost_rows(c, 128) - tn_cost_rows(c, 64)) / 64;
}


/* The request is over (no choice running, none left to admit): wake its connection, count it. */
static void req_done(tn_engine *e, tn_sreq *r) {
    double now = tn_srv_now();
    TN_TRACE_ASYNC(TN_PH_ASYNC_END, "request", r); /* the profile closes its open queue/prefill/decode */
    pthread_mutex_lock(&r->mu);
    r->t_done = now;
    r->state = TN_SREQ_DONE;
    bool refused = r->err.status == 429; /* left the queue: counted as rejected */
    bool failed = r->err.status != 0 && !refused, all = true;
    for (int i = 0; i < r->p.n; i++) all &= r->ch[i].finish != NULL;
    const char *reason = r->ch[0].finish;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);

    tn_metrics *m = e->met;
    lock_met(e);
    if (refused) {
    } else if (failed) {
        m->finished_error++;
    } else if (!all) {
        m->cancelled++;
    } else {
        if (!strcmp(reason, "stop")) m->finished_stop++;
        else m->finished_length++;
        tn_hist_add(&m->e2e, now - r->t_arrival);
        m->slo_total++;
        double ttft = r->t_first > 0 ? r->t_first - r->t_arrival : now - r->t_arrival;
        double tpot = r->max_gen > 1 ? (r->t_last - r->t_first) / (r->max_gen - 1) : 0;
        bool ok = (e->cfg.ttft_slo_ms <= 0 || ttft * 1e3 <= e->cfg.ttft_slo_ms) &&
                  (e->cfg.tpot_slo_ms <= 0 || tpot * 1e3 <= e->cfg.tpot_slo_ms);
        if (ok) m->slo_met++;
    }
    unlock_met(e);
}

/* Records a server error on the request (the first one wins); its other choices stop at the
 * next step. Caller holds r->mu. */
static void req_fail_locked(tn_sreq *r, int status, const char *msg) {
    if (!r->err.status) tn_http_err_set(&r->err, status, "server_error", NULL, "%s", msg);
}

/* Ends one choice: reason "stop"/"length", or NULL when cancelled or failed (err_status set). */
/* ---- sliding-window layers' blocks (e->kv_swa) ------------------------------------------------- */
/* The first block a query at position pos reads on a sliding-window layer. */
static int32_t swa_first_block(const tn_engine *e, int32_t pos) {
    const int32_t p = pos - e->n_swa + 1;
    return p > 0 ? p / TN_KVB : 0;
}

/* Gives back the sequence's window blocks below block j_end. */
static void swa_release(tn_engine *e, tn_seq *s, int32_t j_end) {
    for (; s->swa_lo < j_end && s->swa_lo < s->swa_hi; s->swa_lo++) {
        tn_kv_release(&e->kv_swa, s->swa_table[s->swa_lo]);
        s->swa_table[s->swa_lo] = -1;
    }
}

/* Window blocks up to position last_pos (the committed swa_need guarantees them). */
static bool swa_ensure(tn_engine *e, tn_seq *s, int32_t last_pos) {
    if (!e->kv_swa.n_blocks) return true;
    while (s->swa_hi * TN_KVB <= last_pos) {
        if (s->swa_hi >= e->max_blocks_seq) return false;
        const int32_t id = tn_kv_alloc(&e->kv_swa, false);
        if (id < 0) return false;
        s->swa_table[s->swa_hi++] = id;
    }
    return true;
}

/* A prefix hit of *hits blocks (s->table, chained hashes e->hbuf) needs, on the sliding-window
 * layers, the window before its end: those blocks from kv_swa. A missing one shortens the hit to
 * end at it (the global blocks past it are given back) and the window is looked up again. */
static void swa_lookup_window(tn_engine *e, tn_seq *s, const tern_token *prompt, int32_t *hits) {
    int32_t J = *hits;
    s->swa_lo = s->swa_hi = 0;
    while (J > 0) {
        const int32_t lo = swa_first_block(e, J * TN_KVB);
        int32_t j = lo;
        for (; j < J; j++) {
            const int32_t id = tn_kv_lookup(&e->kv_swa, s->table[j], e->hbuf[j], prompt + j * TN_KVB);
            if (id < 0) break;
            s->swa_table[j] = id;
        }
        if (j == J) {
            s->swa_lo = lo, s->swa_hi = J;
            break;
        }
        for (int32_t i = lo; i < j; i++) tn_kv_release(&e->kv_swa, s->swa_table[i]);
        while (J > j) tn_kv_release(&e->kv, s->table[--J]);
    }
    *hits = J;
}

static void seq_finish(tn_engine *e, tn_seq *s, const char *reason, int err_status, const char *err_msg) {
    tn_sreq *r = s->r;
    tn_choice *c = &r->ch[s->ci];
    pthread_mutex_lock(&r->mu);
    size_t rest = s->gen_len - s->emitted, used;
    if (rest && reason && !err_status && !out_append_utf8(c, s->gen + s->emitted, rest, true, &used)) {
        err_status = 500, err_msg = "out of memory for generated text";
    }
    s->emitted = s->gen_len;
    c->n_gen = s->n_gen;
    c->lp_sum = s->lp_sum;
    c->n_lp_sum = s->n_lp_sum;
    if (err_status) req_fail_locked(r, err_status, err_msg);
    else c->finish = reason;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);

    lock_met(e);
    e->met->gen_tokens += (uint64_t)s->n_gen;
    unlock_met(e);
    if (e->trace && s->tr_n[0] + s->tr_n[1] > 0)
        fprintf(e->trace, "# seq %s prompt %d gen %d tpot %.1f dec-only %d x %.1f mixed %d x %.1f ms\n", r->id, s->n_prompt,
                s->n_gen, (s->tr_gap[0] + s->tr_gap[1]) * 1e3 / (s->tr_n[0] + s->tr_n[1]), s->tr_n[0],
                s->tr_n[0] ? s->tr_gap[0] * 1e3 / s->tr_n[0] : 0, s->tr_n[1], s->tr_n[1] ? s->tr_gap[1] * 1e3 / s->tr_n[1] : 0);
    s->tr_gap[0] = s->tr_gap[1] = 0, s->tr_n[0] = s->tr_n[1] = 0;

    /* give back KV: shared/published blocks go to the prefix cache when their last user leaves */
    for (int32_t j = 0; j < s->n_table; j++) tn_kv_release(&e->kv, s->table[j]);
    tn_kv_unreserve(&e->kv, s->n_resv);
    s->n_table = s->n_resv = 0;
    swa_release(e, s, s->swa_hi);
    e->swa_commit -= s->swa_need;
    s->swa_lo = s->swa_hi = s->swa_need = 0;
    tern_sampler_free(s->smp);
    s->smp = NULL;
    s->n_held = s->n_done; /* the slot keeps its tokens (their blocks: in the prefix cache) */
    s->active = false;
    s->r = NULL;
    e->n_active--;
    if (--r->n_live == 0 && !r->in_queue) req_done(e, r);
    tn_sreq_release(r);
}

/* Emits generated text that can no longer be part of a stop string. false when out of memory. */
static bool emit_safe(tn_seq *s) {
    size_t hold = 0;
    const tn_req_params *p = &s->r->p;
    for (int i = 0; i < p->n_stop; i++) {
        size_t L = strlen(p->stop[i]);
        for (size_t k = L - 1; k > hold; k--)
            if (k <= s->gen_len - s->emitted && !memcmp(s->gen + s->gen_len - k, p->stop[i], k)) {
                hold = k;
                break;
            }
    }
    size_t end = s->gen_len - hold, used = 0;
    if (end <= s->emitted) return true;
    tn_sreq *r = s->r;
    pthread_mutex_lock(&r->mu);
    bool ok = out_append_utf8(&r->ch[s->ci], s->gen + s->emitted, end - s->emitted, false, &used);
    s->emitted += used;
    r->ch[s->ci].n_gen = s->n_gen;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return ok;
}

/* Stores one token's log-probabilities (lp[0] sampled, then the top ones) in the choice. */
static bool record_logprobs(tn_seq *s, const tn_lp *lp) {
    tn_sreq *r = s->r;
    tn_choice *c = &r->ch[s->ci];
    size_t w = 1 + (size_t)r->p.top_logprobs;
    bool ok = true;
    pthread_mutex_lock(&r->mu);
    if (c->n_lp == c->lp_cap) {
        int32_t cap = c->lp_cap ? 2 * c->lp_cap : 16;
        tn_lp *q = tn_realloc(c->lp, (size_t)cap * w * sizeof *q);
        if (q) c->lp = q;
        int32_t *o = q ? tn_realloc(c->lp_off, (size_t)cap * sizeof *o) : NULL;
        if (o) c->lp_off = o, c->lp_cap = cap;
        ok = o != NULL;
    }
    if (ok) {
        memcpy(c->lp + (size_t)c->n_lp * w, lp, w * sizeof *lp);
        c->lp_off[c->n_lp++] = s->n_chars;
    }
    pthread_mutex_unlock(&r->mu);
    return ok;
}

/* Handles one sampled token (lp: its log-probabilities, or NULL); may finish the sequence. */
static void on_token(tn_engine *e, tn_seq *s, tern_token t, const tn_lp *lp, double now) {
    tn_sreq *r = s->r;
    lock_met(e);
    if (r->t_first == 0) tn_hist_add(&e->met->ttft, now - r->t_arrival);
    if (r->t_first == 0 && e->trace)
        fprintf(e->trace, "# first %s ttft_ms %.0f predicted_ms %.0f\n", r->id, (now - r->t_arrival) * 1e3, r->ttft_pred * 1e3);
    else if (s->t_last > 0) tn_hist_add(&e->met->itl, now - s->t_last);
    unlock_met(e);
    if (r->t_first == 0) { /* trace: the request's prefill ends, its decode begins */
        TN_TRACE_ASYNC(TN_PH_ASYNC_END, "prefill", r);
        TN_TRACE_ASYNC(TN_PH_ASYNC_BEGIN, "decode", r);
        r->t_first = now;
    }
    if (s->t_first == 0) s->t_first = now;
    if (s->t_last > 0) {
        int k = e->last_shape.rows > e->last_dec;
        s->tr_gap[k] += now - s->t_last;
        s->tr_n[k]++;
    }
    s->t_last = now;
    r->t_last = now;
    if (lp) s->lp_sum += lp->lp, s->n_lp_sum++;
    if (!r->p.ignore_eos && tern_token_is_eog(e->m, t)) {
        seq_finish(e, s, "stop", 0, NULL);
        return;
    }
    s->toks[s->n_toks++] = t;
    s->n_gen++;
    if (s->n_gen > r->max_gen) r->max_gen = s->n_gen;
    if (lp && r->p.logprobs && !record_logprobs(s, lp)) {
        seq_finish(e, s, NULL, 500, "out of memory for logprobs");
        return;
    }
    char piece[256];
    int32_t k = tern_token_to_piece(e->m, t, piece, (int32_t)sizeof piece, false);
    if (k > 0) {
        if (s->gen_len + (size_t)k > s->gen_cap) {
            size_t cap = s->gen_cap ? s->gen_cap * 2 : 1024;
            while (cap < s->gen_len + (size_t)k) cap *= 2;
            char *q = tn_realloc(s->gen, cap);
            if (!q) {
                seq_finish(e, s, NULL, 500, "out of memory for generated text");
                return;
            }
            s->gen = q;
            s->gen_cap = cap;
        }
        memcpy(s->gen + s->gen_len, piece, (size_t)k);
        s->gen_len += (size_t)k;
        for (int32_t i = 0; i < k; i++) s->n_chars += ((unsigned char)piece[i] & 0xC0) != 0x80;
        for (int i = 0; i < r->p.n_stop; i++) {
            const char *st = r->p.stop[i];
            size_t L = strlen(st);
            if (s->gen_len - s->emitted < L) continue;
            const char *hit = memmem(s->gen + s->emitted, s->gen_len - s->emitted, st, L);
            if (hit) {
                s->gen_len = (size_t)(hit - s->gen);
                seq_finish(e, s, "stop", 0, NULL);
                return;
            }
        }
    }
    if (s->n_gen >= r->p.max_tokens || s->n_toks >= e->n_ctx_seq) {
        seq_finish(e, s, "length", 0, NULL);
        return;
    }
    if (!emit_safe(s)) seq_finish(e, s, NULL, 500, "out of memory for generated text");
}

/* Least slack first with a TTFT objective: its deadline minus the predicted time of its prefill
 * alone. Further choices of a request already started go first (they share its prompt). */
static double slack_of(const tn_engine *e, const tn_sreq *r, double now) {
    if (r->n_admitted > 0) return -1e300;
    return r->t_arrival + e->cfg.ttft_slo_ms * 1e-3 - now - e->load.mean * tn_cost_rows(&e->sch.cost, r->p.n_prompt);
}

/* Index of the next request to admit (FCFS, or least slack with a TTFT objective). */
static int pick_next(tn_engine *e, double now) {
    if (e->cfg.ttft_slo_ms <= 0 || e->qn <= 1) return 0;
    int best = 0;
    double best_slack = 1e300;
    for (int i = 0; i < e->qn; i++) {
        double slack = slack_of(e, e->q[i], now);
        if (slack < best_slack) best_slack = slack, best = i;
    }
    return best;
}

/* echo with logprobs: the first choice computes every prompt row's logits (prompt logprobs). */
static bool wants_plp(const tn_seq *s) { return s->ci == 0 && s->r->plp != NULL; }

/* The running sequences as the policy sees them (sched.h): decoding ones, then prefilling ones
 * oldest first; idx gets their indices in seqs. Returns the count. */
static int running_state(const tn_engine *e, double now, tn_sseq *out, int *idx) {
    int n = 0;
    double tpot = e->sch.tpot;
    for (int i = 0; i < e->np; i++) {
        const tn_seq *s = &e->seqs[i];
        if (!s->active || s->n_done < s->n_prompt) continue;
        double bank = s->t_first > 0 ? (s->n_gen - 1) * tpot - (now - s->t_first) : 0;
        out[n] = (tn_sseq){s->n_done, s->n_prompt, s->r->p.max_tokens - s->n_gen, bank, 0, false};
        idx[n++] = i;
    }
    int first_pf = n;
    for (int i = 0; i < e->np; i++) {
        const tn_seq *s = &e->seqs[i];
        if (!s->active || s->n_done >= s->n_prompt) continue;
        int j = n++; /* insertion by admission time */
        while (j > first_pf && e->seqs[idx[j - 1]].r->t_admit > s->r->t_admit) {
            out[j] = out[j - 1];
            idx[j] = idx[j - 1];
            j--;
        }
        out[j] = (tn_sseq){s->n_done, s->n_prompt, s->r->p.max_tokens - s->n_gen, 0, 0, wants_plp(s)};
        idx[j] = i;
    }
    return n;
}

/* The queue (and x, not queued, unless NULL) as the policy sees it, in service order (the order
 * pick_next takes): e->qord[k] is the k-th (an index in q, or qn for x), e->qsim[k] its shape.
 * Caller holds mu. Returns the count. */
static int queue_state(tn_engine *e, double now, const tn_sreq *x) {
    int k = 0;
    for (int i = 0; i <= e->qn; i++) { /* insertion sort by slack */
        const tn_sreq *r = i < e->qn ? e->q[i] : x;
        if (!r) continue;
        double sl = slack_of(e, r, now);
        int j = k++;
        for (; j > 0; j--) {
            int o = e->qord[j - 1];
            if (slack_of(e, o < e->qn ? e->q[o] : x, now) <= sl) break;
            e->qord[j] = o;
        }
        e->qord[j] = i;
    }
    for (int j = 0; j < k; j++) {
        const tn_sreq *r = e->qord[j] < e->qn ? e->q[e->qord[j]] : x;
        bool started = r->n_admitted > 0; /* its other choices: a slot each, little prefill */
        e->qsim[j] = (tn_sreq_sim){started ? 1 : r->p.n_prompt, r->p.max_tokens, r->p.n - r->n_admitted,
                                   now - r->t_arrival, started};
    }
    return k;
}

/* Would request r start in the coming step (engine thread, a slot is free)? */
static bool starts_now(tn_engine *e, double now, const tn_sreq *r) {
    int n = running_state(e, now, e->plan, e->plan_seq);
    tn_sreq_sim c = {r->p.n_prompt, r->p.max_tokens, r->p.n, now - r->t_arrival, false};
    return tn_sched_starts(&e->sch, e->plan, n, &c);
}

/* Takes request i off the queue and drops the queue's reference; a request with no choice
 * running is over then. */
static void q_remove(tn_engine *e, int i) {
    tn_sreq *r = e->q[i];
    memmove(e->q + i, e->q + i + 1, (size_t)(e->qn - i - 1) * sizeof *e->q);
    e->qn--;
    r->in_queue = false;
    if (r->n_live == 0) req_done(e, r);
    tn_sreq_release(r);
}

/* Seed of choice i: the request's seed for choice 0 (so n = 1 and choice 0 of n > 1 agree),
 * a splitmix64 derivation for the others; never TERN_SEED_RANDOM. */
static uint64_t choice_seed(uint64_t base, int i) {
    if (i == 0) return base;
    uint64_t z = base + (uint64_t)i * UINT64_C(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return (z ^ (z >> 31)) & UINT64_C(0xFFFFFFFE);
}

/* Refuses (429) a queued request that has not started: predicted time to first token ttft
 * (seconds from its arrival) misses the objective. */
static void refuse_queued(tn_engine *e, int qi, double ttft) {
    tn_sreq *r = e->q[qi];
    pthread_mutex_lock(&r->mu);
    r->retry_after_s = (int)ceil(isfinite(ttft) && ttft > 1 ? ttft : 1);
    if (isfinite(ttft))
        tn_http_err_set(&r->err, 429, "rate_limit_error", NULL,
                        "predicted time to first token %.0f ms exceeds the %.0f ms objective; retry later", ttft * 1e3,
                        e->cfg.ttft_slo_ms);
    else
        tn_http_err_set(&r->err, 429, "rate_limit_error", NULL,
                        "the time-to-first-token objective (%.0f ms) can no longer be met; retry later", e->cfg.ttft_slo_ms);
    pthread_mutex_unlock(&r->mu);
    if (e->trace) fprintf(e->trace, "# deadline %s waited_ms %.0f predicted_ttft_ms %.0f refused\n", r->id,
                          (tn_srv_now() - r->t_arrival) * 1e3, ttft * 1e3);
    lock_met(e);
    e->met->rejected_deadline++;
    unlock_met(e);
    q_remove(e, qi);
}

/* Re-checks the queue against the TTFT deadlines (caller holds mu): the first request in
 * service order predicted to miss its deadline leaves with 429, and the rest are predicted
 * again without it (a few per step; the others at the next step). */
static void recheck_deadlines(tn_engine *e, double now) {
    double slo = e->cfg.ttft_slo_ms * 1e-3;
    int n_run = running_state(e, now, e->plan, e->plan_seq);
    for (int iter = 0; iter < 4 && e->qn > 0; iter++) {
        int k = queue_state(e, now, NULL);
        int late = tn_sched_first_late(&e->sch, e->plan, n_run, e->np, e->qsim, k, slo, e->qttft);
        if (late < 0) return;
        refuse_queued(e, e->qord[late], e->qsim[late].waited + e->qttft[late]);
    }
}

/* Moves queued requests' choices into free sequences while KV blocks can be reserved (caller
 * holds mu). Choices after the first wait until the first has computed the prompt, then share
 * its full blocks through the prefix cache. */
static void admit(tn_engine *e) {
    double now = tn_srv_now();
    for (int i = 0; i < e->qn;) { /* cancelled or failed requests leave the queue at once */
        tn_sreq *r = e->q[i];
        if (atomic_load(&r->cancelled) || r->err.status) q_remove(e, i);
        else i++;
    }
    if (e->cfg.ttft_slo_ms > 0) recheck_deadlines(e, now);
    while (e->qn > 0 && e->n_active < e->np) {
        int qi = pick_next(e, now);
        tn_sreq *r = e->q[qi];
        const tn_req_params *p = &r->p;
        if (r->n_admitted > 0 && !r->prompt_ready && p->n_prompt - 1 >= TN_KVB) break;
        if (r->n_admitted == 0 && !starts_now(e, now, r)) break; /* waits in the queue: can still be refused */
        tn_seq *s = NULL;
        for (int i = 0; i < e->np; i++)
            if (!e->seqs[i].active) {
                s = &e->seqs[i];
                break;
            }
        /* prefix cache: reuse full blocks of the prompt, keeping >= 1 token to compute (all of
         * them when the prompt's logprobs are wanted) */
        int32_t hits = 0;
        uint64_t h = 0;
        while ((hits + 1) * TN_KVB <= p->n_prompt - 1 && !(r->plp && r->n_admitted == 0)) {
            int32_t id = tn_kv_lookup(&e->kv, hits ? s->table[hits - 1] : -1, h, p->prompt + hits * TN_KVB);
            if (id < 0) break;
            s->table[hits++] = id;
            h = tn_kv_hash(h, p->prompt + (hits - 1) * TN_KVB);
            e->hbuf[hits] = h;
        }
        const int32_t mem_hits = hits;
        tn_pc_chain chain = {0, 0};
        /* the disk cache: further blocks into fresh blocks of the cache. The files hold the target's
         * KV only: a draft model computes its own for them when it catches up (dn below; a draft
         * prefill costs a fraction of the target's), before any other request can hit them */
        if (e->pc) {
            for (int32_t j = 0; j < hits; j++) tn_pc_chain_next(&chain, p->prompt + j * TN_KVB);
            const tn_pc_chain mem_chain = chain;
            const int32_t disk0 = hits;
            while ((hits + 1) * TN_KVB <= p->n_prompt - 1 && !(r->plp && r->n_admitted == 0) && tn_kv_available(&e->kv) > 0) {
                tn_pc_chain next = chain;
                tn_pc_chain_next(&next, p->prompt + hits * TN_KVB);
                const int32_t id = tn_kv_alloc(&e->kv, false);
                if (id < 0) break;
                if (tn_pcache_load_block(e->pc, e->ctx, hits, next, p->prompt + hits * TN_KVB, id)) {
                    tn_kv_release(&e->kv, id); /* unhashed: back to the free list */
                    break;
                }
                s->table[hits++] = id;
                h = tn_kv_hash(h, p->prompt + (hits - 1) * TN_KVB);
                e->hbuf[hits] = h;
                chain = next;
                if (hits == disk0 + 1 && pc_load_slower(e)) { /* CacheGen's controller: recompute the rest */
                    lock_met(e);
                    e->met->pc_declined++;
                    unlock_met(e);
                    break;
                }
            }
            chain = mem_chain; /* publishing (memory and disk) restarts after the memory hits */
        }
        if (e->kv_swa.n_blocks) { /* the window before the hit's end, on the sliding-window layers */
            swa_lookup_window(e, s, p->prompt, &hits);
            h = e->hbuf[hits];
        }
        int32_t total = p->n_prompt + p->max_tokens;
        if (total > e->n_ctx_seq) total = e->n_ctx_seq;
        int32_t need = blocks_for(total) - hits;
        if (need < 0) need = 0;
        const int32_t swa_need = e->kv_swa.n_blocks ? TN_MIN(e->swa_w, blocks_for(total)) : 0;
        if (e->swa_commit + swa_need > e->kv_swa.n_blocks || !tn_kv_reserve(&e->kv, need)) {
            for (int32_t j = 0; j < hits; j++) tn_kv_release(&e->kv, s->table[j]);
            swa_release(e, s, s->swa_hi);
            break; /* wait for blocks */
        }
        e->swa_commit += swa_need;
        s->swa_need = swa_need;
        tern_sampler_params sp = p->sp;
        if (r->n_admitted > 0) sp.seed = choice_seed(r->base_seed, r->n_admitted);
        tern_status st = tern_sampler_create(e->m, &sp, &s->smp);
        if (st) {
            for (int32_t j = 0; j < hits; j++) tn_kv_release(&e->kv, s->table[j]);
            tn_kv_unreserve(&e->kv, need);
            swa_release(e, s, s->swa_hi);
            e->swa_commit -= swa_need;
            s->swa_lo = s->swa_hi = s->swa_need = 0;
            pthread_mutex_lock(&r->mu);
            if (st == TERN_ERR_NOMEM) req_fail_locked(r, 500, "out of memory for the sampler");
            else tn_http_err_set(&r->err, 400, "invalid_request_error", NULL, "sampler: %s", tern_last_error());
            pthread_mutex_unlock(&r->mu);
            q_remove(e, qi);
            continue;
        }
        if (r->n_admitted == 0) r->base_seed = tern_sampler_seed(s->smp);
        for (int32_t i = 0; i < p->n_prompt; i++) tern_sampler_accept(s->smp, p->prompt[i]);
        memcpy(s->toks, p->prompt, (size_t)p->n_prompt * sizeof *s->toks);
        s->r = r;
        s->ci = r->n_admitted;
        s->active = true;
        s->n_toks = s->n_prompt = p->n_prompt;
        s->n_done = hits * TN_KVB;
        s->dn = TN_MIN(mem_hits, hits) * TN_KVB; /* the draft model's KV: the blocks hit in memory only */
        s->n_gen = 0;
        s->n_table = hits;
        s->n_resv = need;
        s->n_pub = mem_hits; /* blocks loaded from disk are published in memory as they are passed */
        s->pub_hash = mem_hits ? e->hbuf[mem_hits] : 0;
        s->pc_chain = chain;
        s->gen_len = s->emitted = 0;
        s->n_chars = 0;
        s->lp_sum = 0;
        s->n_lp_sum = 0;
        s->t_first = s->t_last = 0;
        s->acc = TN_SPEC_ACC_START;
        s->n_draft = s->spec = 0;
        e->n_active++;
        bool first = r->n_admitted == 0;
        r->n_admitted++;
        r->n_live++;
        pthread_mutex_lock(&r->mu);
        r->refs++; /* the sequence's */
        if (first) {
            TN_TRACE_ASYNC(TN_PH_ASYNC_END, "queue", r);
            TN_TRACE_ASYNC(TN_PH_ASYNC_BEGIN, "prefill", r);
            r->t_admit = now;
            r->state = TN_SREQ_RUNNING;
            r->n_cached = hits * TN_KVB;
        }
        pthread_mutex_unlock(&r->mu);
        lock_met(e);
        if (first) tn_hist_add(&e->met->queue, now - r->t_arrival);
        e->met->prompt_tokens += (uint64_t)p->n_prompt;
        e->met->cached_tokens += (uint64_t)(hits * TN_KVB);
        unlock_met(e);
        if (r->n_admitted == p->n) q_remove(e, qi);
    }
}

/* Folds the last step's measured / predicted time into the load factors (caller holds mu). */
static void fold_load(tn_engine *e) {
    if (e->last_pred > 0 && e->last_actual > 0) tn_load_observe(&e->load, e->last_pred, e->last_actual);
    e->last_pred = e->last_actual = 0;
    e->sch.f_plan = tn_load_plan(&e->load);
    e->sch.f_expect = e->load.mean;
}

/* Refreshes the predictor snapshot and gauges (caller holds mu). */
static void snapshot(tn_engine *e) {
    fold_load(e);
    e->snap_t = tn_srv_now();
    e->n_snap = running_state(e, e->snap_t, e->snap, e->snap_idx);
    lock_met(e);
    e->met->running = e->n_active;
    e->met->waiting = e->qn;
    e->met->kv_usage = (double)tn_kv_used(&e->kv) / e->kv.n_blocks;
    e->met->kv_used = tn_kv_used(&e->kv);
    e->met->kv_reserved = e->kv.n_reserved;
    e->met->kv_swa_used = e->kv_swa.n_blocks ? tn_kv_used(&e->kv_swa) : 0;
    e->met->load_mean = e->load.mean;
    e->met->load_sd = tn_load_sd(&e->load);
    unlock_met(e);
}

bool tn_eng_ensure_blocks(tn_engine *e, tn_seq *s, int32_t last_pos) {
    while (s->n_table * TN_KVB <= last_pos) {
        if (s->n_table >= e->max_blocks_seq) return false;
        int32_t id = tn_kv_alloc(&e->kv, s->n_resv > 0);
        if (id < 0) return false;
        if (s->n_resv > 0) s->n_resv--;
        s->table[s->n_table++] = id;
    }
    return true;
}

/* Publishes the sequence's full blocks below n_done in the prefix cache (only computed, kept
 * positions: never a rejected draft). */
static void publish_blocks(tn_engine *e, tn_seq *s) {
    while ((s->n_pub + 1) * TN_KVB <= s->n_done) {
        int32_t j = s->n_pub;
        tn_kv_publish(&e->kv, s->table[j], j ? s->table[j - 1] : -1, s->pub_hash, s->toks + j * TN_KVB);
        if (j >= s->swa_lo && j < s->swa_hi) /* its window block: under the global block's id and hash */
            tn_kv_publish(&e->kv_swa, s->swa_table[j], s->table[j], s->pub_hash, s->toks + j * TN_KVB);
        s->pub_hash = tn_kv_hash(s->pub_hash, s->toks + j * TN_KVB);
        if (e->pc) { /* a prompt block: to disk too (a file already there is not rewritten) */
            tn_pc_chain_next(&s->pc_chain, s->toks + j * TN_KVB);
            if ((j + 1) * TN_KVB <= s->n_prompt) tn_pcache_store_block(e->pc, e->ctx, j, s->pc_chain, s->toks + j * TN_KVB, s->table[j]);
        }
        s->n_pub++;
    }
    swa_release(e, s, swa_first_block(e, s->n_done)); /* behind every window from now on */
}

/* OpenAI's presence / frequency penalties over the tokens generated so far (not the prompt):
 * logit[t] -= frequency_penalty * count[t] + presence_penalty * (count[t] > 0), on e->lrow. */
static void apply_penalties(tn_engine *e, const tn_seq *s) {
    const tn_req_params *p = &s->r->p;
    if (p->presence_penalty == 0 && p->frequency_penalty == 0) return;
    const tern_token *g = s->toks + s->n_prompt;
    for (int32_t i = 0; i < s->n_gen; i++) e->pcount[g[i]]++;
    for (int32_t i = 0; i < s->n_gen; i++) {
        int32_t c = e->pcount[g[i]];
        if (!c) continue; /* already applied */
        e->lrow[g[i]] -= p->frequency_penalty * (float)c + p->presence_penalty;
        e->pcount[g[i]] = 0;
    }
}

/* Log-softmax of the raw logits: out[0] = the sampled token, out[1..k] = the k most likely
 * (descending, lower id first on ties). */
static void logprobs_of(const float *lg, int32_t nv, tern_token t, int k, tn_lp *out) {
    const double lse = tn_op_logsumexp(lg, nv, NULL);
    out[0] = (tn_lp){t, (float)(lg[t] - lse)};
    int n = 0; /* insertion into the sorted top list */
    for (int32_t i = 0; i < nv && k > 0; i++) {
        if (n == k && lg[i] <= out[n].lp) continue;
        int j = n < k ? ++n : k;
        while (j > 1 && lg[i] > out[j - 1].lp) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = (tn_lp){i, lg[i]};
    }
    for (int j = 1; j <= n; j++) out[j].lp = (float)(out[j].lp - lse);
}

/* One engine step: builds the batch, runs one forward pass, samples. */
static void step(tn_engine *e) {
    int32_t n = 0, n_dec = 0, nl = 0;
    /* cancelled sequences leave first: their blocks are free for this very step */
    for (int i = 0; i < e->np; i++) {
        tn_seq *s = &e->seqs[i];
        if (s->active && atomic_load(&e->cancel_all)) atomic_store(&s->r->cancelled, 1);
        if (s->active && (atomic_load(&s->r->cancelled) || s->r->err.status)) seq_finish(e, s, NULL, 0, NULL);
    }
    for (int i = 0; i < e->np; i++) e->seqs[i].chunk = 0;
    /* the plan (sched.c): a row for every decoding sequence, prefill chunks oldest first sized
     * to keep the decoding sequences on their TPOT schedule */
    int n_plan = running_state(e, tn_srv_now(), e->plan, e->plan_seq);
    tn_shape planned;
    tn_sched_plan(&e->sch, e->plan, n_plan, &planned);
    if (e->spec.kmax > 0) tn_eng_plan_spec(e, n_plan, &planned);
    e->last_limit = tn_sched_limit(&e->sch, e->plan, n_plan);
    int64_t keys = 0;
    for (int j = 0; j < n_plan; j++) {
        tn_seq *s = &e->seqs[e->plan_seq[j]];
        int i = e->plan_seq[j];
        int32_t c = e->plan[j].chunk;
        if (c == 0) continue;
        bool dec = s->n_done >= s->n_prompt;
        if (dec && s->n_toks - s->n_done != 1) continue;
        if (dec) c += s->spec; /* its current token, then its drafts: logits on every row */
        if (!tn_eng_ensure_blocks(e, s, s->n_done + c - 1) || !swa_ensure(e, s, s->n_done + c - 1)) {
            TN_TRACE_INSTANT(TN_TK_STEP, "kv_cache_exhausted", -1);
            seq_finish(e, s, NULL, 500, "KV cache exhausted");
            continue;
        }
        bool last = dec || s->n_done + c == s->n_toks, all = !dec && wants_plp(s); /* logits: see b_lpos */
        for (int32_t k = 0; k < c; k++) {
            bool sp = dec && k > 0; /* a draft row */
            e->b_tok[n] = sp ? s->draft[k - 1] : s->toks[s->n_done + k];
            e->b_seq[n] = i;
            e->b_pos[n] = s->n_done + k;
            e->b_logits[n] = (int8_t)(all || dec || (last && k == c - 1));
            if (e->b_logits[n]) {
                e->b_owner[nl] = i;
                e->b_dj[nl] = dec ? k : 0;
                e->b_lpos[nl++] = dec || (last && k == c - 1) ? -1 : s->n_done + k;
            }
            n++;
        }
        s->chunk = c;
        n_dec += dec ? c : 0; /* its drafts too */
        keys += tn_chunk_keys(s->n_done, c);
    }
    if (n == 0) return;
    e->last_shape = (tn_shape){n, nl, keys};
    e->last_dec = n_dec;
    e->last_pred = tn_cost_step(&e->sch.cost, &e->last_shape);
    for (int i = 0; i < e->np; i++) e->tables[i] = e->seqs[i].table;
    tn_batch b = {n, e->b_tok, e->b_seq, e->b_pos, e->b_logits};
    tn_forward_batch(e->ctx, &b, e->tables, e->swa_tables);
    if (e->ctx->dev_status) { /* the GPU failed the pass: its sequences end with a 500, nothing is sampled */
        e->ctx->dev_status = TERN_OK;
        char msg[256];
        snprintf(msg, sizeof msg, "forward pass failed on the device: %s", tern_last_error());
        if (!e->cfg.quiet) fprintf(stderr, "tern serve: %s\n", msg);
        for (int i = 0; i < e->np; i++)
            if (e->seqs[i].active && e->seqs[i].chunk) seq_finish(e, &e->seqs[i], NULL, 500, msg);
        return;
    }
    double now = tn_srv_now();
    lock_met(e);
    e->met->steps++;
    e->met->batch_tokens += (uint64_t)n;
    unlock_met(e);
    /* K/V now exist for the chunk: advance and publish full blocks in the prefix cache */
    for (int i = 0; i < e->np; i++) {
        tn_seq *s = &e->seqs[i];
        if (!s->active || !s->chunk) continue;
        s->n_done += s->chunk - s->spec; /* drafts count once verified (below) */
        if (s->n_done >= s->n_prompt) s->r->prompt_ready = true;
        publish_blocks(e, s);
    }
    for (int k = 0; k < nl && k < e->ctx->n_logits; k++) {
        tn_seq *s = &e->seqs[e->b_owner[k]];
        if (!s->active) continue;
        const tn_req_params *p = &s->r->p;
        const float *raw = e->ctx->logits + (size_t)k * e->n_vocab, *lg = raw;
        if (e->b_lpos[k] >= 0) { /* a prompt row: the logprob of the prompt token after it */
            int32_t pos = e->b_lpos[k] + 1;
            logprobs_of(raw, e->n_vocab, p->prompt[pos], p->top_logprobs, s->r->plp + (size_t)pos * (1 + p->top_logprobs));
            continue;
        }
        if (p->n_bias || p->presence_penalty != 0 || p->frequency_penalty != 0) {
            memcpy(e->lrow, raw, (size_t)e->n_vocab * sizeof *raw);
            for (int j = 0; j < p->n_bias; j++) {
                float bv = p->bias_val[j];
                if (bv <= -100.0f) e->lrow[p->bias_tok[j]] = -INFINITY;
                else e->lrow[p->bias_tok[j]] += bv;
            }
            apply_penalties(e, s);
            lg = e->lrow;
        }
        if (wants_plp(s) && !s->r->echo_ready) { /* the prompt rows came first: its logprobs are complete */
            pthread_mutex_lock(&s->r->mu);
            s->r->echo_ready = true;
            pthread_cond_broadcast(&s->r->cv);
            pthread_mutex_unlock(&s->r->mu);
        }
        /* a drafted row counts while every pick before it equalled its draft: the sampler sees
         * the rows in order with the history one-token decoding would give it */
        const int32_t dj = e->b_dj[k];
        if (dj > 0 && s->spec_stop) continue;
        tern_token t = tern_sampler_sample(s->smp, lg);
        bool want = p->logprobs || p->n_return < p->n; /* best_of ranks candidates by mean logprob */
        if (want) logprobs_of(raw, e->n_vocab, t, p->logprobs ? p->top_logprobs : 0, e->lp_tmp);
        if (dj < s->spec) {
            if (t == s->draft[dj]) s->spec_acc++;
            else s->spec_stop = true;
        } else if (dj < s->n_draft && !e->spec.fixed) {
            /* the row after the verified drafts (all kept, or none verified): would the next draft
             * have been kept? One more observation of the rate, free, so a rate that fell to
             * "not worth verifying" can recover */
            s->acc = tn_spec_acc_update(s->acc, 1, t == s->draft[dj]);
        }
        on_token(e, s, t, want ? e->lp_tmp : NULL, now);
    }
    if (e->spec.kmax <= 0) return;
    /* the kept drafts' K/V count now; the rejected rows' blocks are simply overwritten later */
    uint64_t acc = 0;
    for (int i = 0; i < e->np; i++) {
        tn_seq *s = &e->seqs[i];
        if (!s->chunk || !s->spec) continue;
        acc += (uint64_t)s->spec_acc;
        if (!s->active) continue; /* finished inside its run: its blocks are gone */
        s->n_done += s->spec_acc;
        if (e->dctx) s->dn += TN_MIN(s->spec_acc, s->spec - 1); /* the drafts it was fed and were kept */
        s->acc = tn_spec_acc_update(s->acc, s->spec, s->spec_acc);
        publish_blocks(e, s);
        s->spec = 0;
    }
    lock_met(e);
    e->met->spec_accepted += acc;
    unlock_met(e);
    if (e->dctx) tn_eng_draft_catch_up(e);
}


static void *engine_main(void *arg) {
    tn_engine *e = arg;
    tn_trace_thread_name("engine", 0);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && e->n_active == 0 && e->qn == 0 && !e->task) {
            snapshot(e);
            pthread_cond_wait(&e->cv, &e->mu);
        }
        if (e->stop) {
            if (e->task) tn_eng_slot_refuse(e->task, 503, "the server is shutting down");
            e->task = NULL;
            pthread_cond_broadcast(&e->task_cv);
            pthread_mutex_unlock(&e->mu);
            break;
        }
        if (e->task) { /* a slot action, between steps */
            struct tn_slot_task *t = e->task;
            pthread_mutex_unlock(&e->mu);
            tn_eng_slot_run(e, t);
            pthread_mutex_lock(&e->mu);
            e->task = NULL;
            pthread_cond_broadcast(&e->task_cv);
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        fold_load(e);
        admit(e);
        snapshot(e);
        bool idle = e->n_active == 0;
        pthread_mutex_unlock(&e->mu);
        if (idle) { /* queued requests wait for KV blocks held by... nobody: cannot happen; back off */
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
            continue;
        }
        double t0 = tn_srv_now();
        TN_SPAN_B(TN_TK_STEP, "step", -1, 0, 0, 0, 0);
        step(e);
        if (TN_TRACE_ON()) { /* the step's shape: rows, logits rows, decoding rows; KV blocks in use */
            tn_trace_rec(TN_PH_END, TN_TK_STEP, "step", -1, 0, e->last_shape.rows, e->last_shape.logits, e->last_dec, 0);
            tn_trace_counter("kv_blocks_used", tn_kv_used(&e->kv));
        }
        if (e->cfg.step_delay_ms > 0) {
            struct timespec ts = {(time_t)(e->cfg.step_delay_ms / 1e3), (long)(fmod(e->cfg.step_delay_ms, 1e3) * 1e6)};
            nanosleep(&ts, NULL);
        }
        /* the draft model's passes are left out: the load factor corrects the target's step
         * prediction (the plan predicts the draft passes with the same factor) */
        e->last_actual = tn_srv_now() - t0 - e->d_time;
        e->d_time = 0;
        if (e->trace && e->last_pred > 0)
            fprintf(e->trace, "%.4f %d %d %d %lld %.2f %.2f %.3f %.3f %.2f\n", t0 - e->t_start, e->last_dec,
                    e->last_shape.rows - e->last_dec, e->last_shape.logits, (long long)e->last_shape.keys,
                    isinf(e->last_limit) ? -1.0 : e->last_limit * 1e3, e->last_pred * 1e3, e->sch.f_expect, e->sch.f_plan,
                    e->last_actual * 1e3);
    }
    return NULL;
}

/* ---- lifecycle -------------------------------------------------------------------------------- */
tern_status tn_engine_create(const tern_model *m, const tn_serve_config *cfg, tn_metrics *met, tn_engine **out) {
    *out = NULL;
    tn_engine *e = tn_calloc(1, sizeof *e);
    if (!e) return tn_err(TERN_ERR_NOMEM, "serve: engine");
    e->m = m;
    e->cfg = *cfg;
    e->met = met;
    e->np = cfg->n_parallel < 1 ? 1 : cfg->n_parallel;
    if (e->np > 64) e->np = 64;
    e->n_vocab = tern_model_n_vocab(m);
    int32_t train = tern_model_n_ctx_train(m);
    int32_t per = train < 4096 ? train : 4096;
    int64_t total = cfg->n_ctx > 0 ? cfg->n_ctx : (int64_t)per * e->np;
    if (total > (1 << 22)) total = 1 << 22;
    if (per > total) per = (int32_t)total;
    e->n_ctx_seq = per;
    e->max_blocks_seq = blocks_for(per) + 1;
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = (int32_t)total;
    cp.n_batch = cfg->n_batch > 0 ? cfg->n_batch : 512;
    if (cp.n_batch < e->np) cp.n_batch = e->np;
    if (cfg->n_threads > 0) cp.n_threads = cfg->n_threads;
    cp.device = cfg->device;
    cp.n_gpu_layers = cfg->n_gpu_layers;
    cp.type_k = cfg->type_k, cp.type_v = cfg->type_v, cp.kv_rotate = cfg->kv_rot;
    /* sliding-window layers: a pool of window blocks, twice what every sequence's window needs
     * at once (the rest keeps recent window blocks for prefix hits), on the CPU or the GPU --
     * unless --swa-full, or a pool no smaller than the global one */
    e->n_swa = m->hp.n_swa;
    int32_t swa_blocks = 0;
    if (e->n_swa > 0 && !cfg->swa_full) {
        e->swa_w = (cp.n_batch + e->n_swa - 2) / TN_KVB + 2; /* blocks one step's window can span */
        swa_blocks = (int32_t)TN_MIN((int64_t)2 * e->np * e->swa_w, INT32_MAX / 2);
    }
    tern_status s = tn_ctx_create_paged_seqs(m, &cp, swa_blocks, e->np, &e->ctx); /* tqc K: a window per sequence */
    if (s) goto fail;
    if (cfg->n_lora > 0 && (s = tern_ctx_set_lora(e->ctx, cfg->lora, cfg->lora_scales, cfg->n_lora))) goto fail;
    /* a request's tokens must not depend on what else is in its batch: on the GPU too */
    tn_cuda_set_batch_invariant(e->ctx->cuda, true);
    e->n_batch = e->ctx->n_batch;
    if (e->np > e->ctx->n_logits_cap) e->np = e->ctx->n_logits_cap;
    if ((s = tn_kv_init(&e->kv, e->ctx->kv_blocks))) goto fail;
    if (e->ctx->kv_swa_blocks > 0 && (s = tn_kv_init(&e->kv_swa, e->ctx->kv_swa_blocks))) goto fail;
    if (cfg->prompt_cache_dir) {
        if ((s = tn_pcache_open(m, e->ctx, cfg->prompt_cache_dir, cfg->prompt_cache_max_bytes, (tn_pc_quality)cfg->prompt_cache_quality,
                                &e->pc)))
            goto fail;
        if ((s = tn_pcache_usable(e->pc, e->ctx))) goto fail;
        /* stores off the engine thread: a block's rows are copied and queued (at most 256 MiB of
         * them; more are not stored), a thread encodes, compresses, writes and fsyncs them
         * (TERN_PCACHE_WRITER=0: on the engine thread, for comparison) */
        const char *wenv = getenv("TERN_PCACHE_WRITER");
        if (!(wenv && !strcmp(wenv, "0")) && tn_pcache_start_writer(e->pc, e->ctx, (size_t)256 << 20))
            tn_log(TERN_LOG_WARN, "prompt cache: %s; blocks are stored on the engine thread", tern_last_error());
    }
    if (!cfg->quiet) {
        fprintf(stderr, "tern serve: KV cache %.2f MiB (K %s%s, V %s%s): %d blocks of %d positions",
                (double)tern_ctx_kv_bytes(e->ctx) / 1048576.0, tern_kv_type_name(e->ctx->type_k), e->ctx->rot_k ? " rotated" : "",
                tern_kv_type_name(e->ctx->type_v), e->ctx->rot_v ? " rotated" : "", e->kv.n_blocks, TN_KVB);
        if (e->kv_swa.n_blocks)
            fprintf(stderr, " (global layers); sliding-window layers: %d blocks, up to %d per sequence (--swa-full: %d)",
                    e->kv_swa.n_blocks, e->swa_w, e->kv.n_blocks);
        fputc('\n', stderr);
    }
    e->qcap = cfg->max_queue > 0 ? cfg->max_queue : 0;
    e->q = tn_calloc((size_t)e->qcap + (size_t)e->np + 1, sizeof *e->q);
    e->seqs = tn_calloc((size_t)e->np, sizeof *e->seqs);
    e->b_tok = tn_calloc((size_t)e->n_batch, sizeof *e->b_tok);
    e->b_seq = tn_calloc((size_t)e->n_batch, sizeof *e->b_seq);
    e->b_pos = tn_calloc((size_t)e->n_batch, sizeof *e->b_pos);
    e->b_owner = tn_calloc((size_t)e->n_batch, sizeof *e->b_owner);
    e->b_lpos = tn_calloc((size_t)e->n_batch, sizeof *e->b_lpos);
    e->b_logits = tn_calloc((size_t)e->n_batch, sizeof *e->b_logits);
    e->b_dj = tn_calloc((size_t)e->n_batch, sizeof *e->b_dj);
    e->tables = tn_calloc((size_t)e->np, sizeof *e->tables);
    e->hbuf = tn_calloc((size_t)e->max_blocks_seq + 1, sizeof *e->hbuf);
    if (e->kv_swa.n_blocks) e->swa_tables = tn_calloc((size_t)e->np, sizeof *e->swa_tables);
    e->lrow = tn_malloc((size_t)e->n_vocab * sizeof *e->lrow);
    e->pcount = tn_calloc((size_t)e->n_vocab, sizeof *e->pcount);
    size_t nq = (size_t)e->qcap + (size_t)e->np + 1;
    e->plan = tn_calloc((size_t)e->np + 1, sizeof *e->plan);
    e->plan_seq = tn_calloc((size_t)e->np + 1, sizeof *e->plan_seq);
    e->plan_spec = tn_calloc((size_t)e->np + 1, sizeof *e->plan_spec);
    e->snap = tn_calloc((size_t)e->np + 1, sizeof *e->snap);
    e->snap_idx = tn_calloc((size_t)e->np + 1, sizeof *e->snap_idx);
    e->qsim = tn_calloc(nq, sizeof *e->qsim);
    e->qord = tn_calloc(nq, sizeof *e->qord);
    e->qttft = tn_calloc(nq, sizeof *e->qttft);
    if (!e->q || !e->seqs || !e->b_tok || !e->b_seq || !e->b_pos || !e->b_owner || !e->b_lpos || !e->b_logits || !e->b_dj || !e->tables || !e->hbuf ||
        (e->kv_swa.n_blocks && !e->swa_tables) || !e->lrow ||
        !e->pcount || !e->plan || !e->plan_seq || !e->plan_spec || !e->snap || !e->snap_idx || !e->qsim || !e->qord || !e->qttft) {
        s = tn_err(TERN_ERR_NOMEM, "serve: engine buffers");
        goto fail;
    }
    for (int i = 0; i < e->np; i++) {
        e->seqs[i].toks = tn_malloc((size_t)e->n_ctx_seq * sizeof(tern_token));
        e->seqs[i].table = tn_malloc((size_t)e->max_blocks_seq * sizeof(int32_t));
        e->seqs[i].swa_table = tn_malloc((size_t)e->max_blocks_seq * sizeof(int32_t));
        if (!e->seqs[i].toks || !e->seqs[i].table || !e->seqs[i].swa_table) {
            s = tn_err(TERN_ERR_NOMEM, "serve: sequence buffers");
            goto fail;
        }
    }
    for (int i = 0; e->swa_tables && i < e->np; i++) e->swa_tables[i] = e->seqs[i].swa_table;
    met->kv_blocks = e->kv.n_blocks;
    met->kv_swa_blocks = e->kv_swa.n_blocks;
    if (cfg->draft_model) { /* the draft model: paged on the same block tables (same n_ctx: same blocks) */
        tern_ctx_params dcp = cp;
        dcp.device = TERN_DEVICE_CPU;
        dcp.n_batch = e->n_batch;
        if ((s = tn_ctx_create_paged_seqs(cfg->draft_model, &dcp, 0, e->np, &e->dctx))) goto fail;
        if (e->dctx->kv_blocks != e->ctx->kv_blocks || e->dctx->n_logits_cap < e->np) {
            s = tn_err(TERN_ERR_INTERNAL, "--draft: its cache has %d blocks and %d logit rows (the model's %d, %d sequences)",
                       e->dctx->kv_blocks, e->dctx->n_logits_cap, e->ctx->kv_blocks, e->np);
            goto fail;
        }
        /* the two models run in turn: one set of threads, so the idle one's do not take cores */
        if (cp.device == TERN_DEVICE_CPU && (s = tern_ctx_share_threads(e->dctx, e->ctx))) goto fail;
    }
    if (cfg->spec_ngram || cfg->draft_model) { /* a sequence's run (current token + drafts) wants a logit row each */
        int32_t kmax = cfg->draft_max < TN_SPEC_KMAX ? cfg->draft_max : TN_SPEC_KMAX;
        if (kmax > e->ctx->n_logits_cap - 1) kmax = e->ctx->n_logits_cap - 1;
        if (kmax > e->n_batch - 1) kmax = e->n_batch - 1;
        if (kmax < 1 || cfg->draft_min > kmax) {
            s = tn_err(TERN_ERR_INVALID_ARG, "speculative decoding: --draft-min %d / --draft-max %d do not fit a step of %d rows with logits",
                       cfg->draft_min, cfg->draft_max, TN_MIN(e->ctx->n_logits_cap, e->n_batch));
            goto fail;
        }
        /* drafts never take a step across the row count where attention switches to f32 sums:
         * every row's logits would change (lossless means what plain decoding gives) */
        e->spec = (tn_spec_cfg){cfg->draft_min, kmax, cfg->spec_fixed, TN_ATTN_F32_ROWS, NULL, 0};
        met->spec = true;
    }
    tn_eng_measure_cost(e, e->ctx, &e->sch.cost, "cost model");
    if (e->dctx) { /* its passes are part of a speculating step's time (tn_sched_spec) */
        tn_eng_measure_cost(e, e->dctx, &e->d_cost, "draft model's cost model");
        e->spec.draft = &e->d_cost;
    }
    /* the testing-only pause after every step is part of every step's time: the scheduler plans
     * with it instead of learning it through the load factor (whose clamp, 50x, a 5 ms pause on
     * a model whose steps take microseconds would exceed) */
    if (e->cfg.step_delay_ms > 0)
        for (int i = 0; i < e->sch.cost.n_pts; i++) e->sch.cost.t[i] += e->cfg.step_delay_ms / 1e3;
    tn_load_init(&e->load);
    e->sch.tpot = cfg->tpot_slo_ms > 0 ? cfg->tpot_slo_ms * 1e-3 : 0;
    e->sch.bank_cap = 2 * e->sch.tpot;
    e->sch.n_batch = e->n_batch;
    e->sch.n_logits_cap = e->ctx->n_logits_cap;
    fold_load(e);
    e->t_start = tn_srv_now();
    const char *tp = getenv("TERN_SERVE_TRACE");
    if (tp && *tp && !(e->trace = fopen(tp, "w")))
        fprintf(stderr, "tern serve: warning: TERN_SERVE_TRACE: cannot write '%s': %s\n", tp, strerror(errno));
    if (e->trace) fprintf(e->trace, "# t_s decode_rows prefill_rows logit_rows keys limit_ms predicted_ms f_mean f_plan actual_ms\n");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->slot_mu, NULL);
    pthread_cond_init(&e->task_cv, NULL);
    if (pthread_create(&e->th, NULL, engine_main, e)) {
        s = tn_err(TERN_ERR_NOMEM, "serve: cannot start the engine thread");
        goto fail;
    }
    e->th_started = true;
    *out = e;
    return TERN_OK;
fail:
    tn_engine_destroy(e);
    return s;
}

static void fail_req(tn_sreq *r, int status, const char *msg) {
    pthread_mutex_lock(&r->mu);
    if (r->state != TN_SREQ_DONE) {
        tn_http_err_set(&r->err, status, "unavailable_error", NULL, "%s", msg);
        r->state = TN_SREQ_DONE;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void tn_engine_destroy(tn_engine *e) {
    if (!e) return;
    if (e->th_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->th, NULL);
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
        pthread_mutex_destroy(&e->slot_mu);
        pthread_cond_destroy(&e->task_cv);
    }
    for (int i = 0; e->q && i < e->qn; i++) { /* choices still running end below */
        tn_sreq *r = e->q[i];
        r->in_queue = false;
        if (r->n_live == 0) fail_req(r, 503, "server shutting down");
        tn_sreq_release(r);
    }
    e->qn = 0;
    if (e->seqs) {
        for (int i = 0; i < e->np; i++) {
            tn_seq *s = &e->seqs[i];
            if (s->active) seq_finish(e, s, NULL, 503, "server shutting down");
            tn_free(s->toks);
            tn_free(s->table);
            tn_free(s->swa_table);
            tn_free(s->gen);
        }
    }
    tn_free(e->q);
    tn_free(e->seqs);
    tn_free(e->b_tok);
    tn_free(e->b_seq);
    tn_free(e->b_pos);
    tn_free(e->b_owner);
    tn_free(e->b_lpos);
    tn_free(e->b_logits);
    tn_free(e->b_dj);
    tn_free(e->tables);
    tn_free(e->swa_tables);
    tn_free(e->hbuf);
    tn_free(e->lrow);
    tn_free(e->pcount);
    tn_free(e->plan);
    tn_free(e->plan_seq);
    tn_free(e->plan_spec);
    tn_free(e->snap);
    tn_free(e->snap_idx);
    tn_free(e->qsim);
    tn_free(e->qord);
    tn_free(e->qttft);
    tn_kv_free(&e->kv);
    tn_kv_free(&e->kv_swa);
    tern_ctx_free(e->dctx);
    tn_pcache_free(e->pc);
    if (e->trace) fclose(e->trace);
    tern_ctx_free(e->ctx);
    tn_free(e);
}

bool tn_engine_submit(tn_engine *e, tn_sreq *r, tn_http_err *err, int *retry_after_s) {
    *retry_after_s = 0;
    pthread_mutex_lock(&e->mu);
    if (e->draining || e->stop) {
        pthread_mutex_unlock(&e->mu);
        tn_http_err_set(err, 503, "unavailable_error", NULL, "the server is shutting down");
        lock_met(e);
        e->met->rejected_draining++;
        unlock_met(e);
        return false;
    }
    double now = tn_srv_now();
    /* the running sequences as of the engine's last snapshot, their TPOT banks aged to now */
    tn_sseq run[64];
    int n_run = e->n_snap;
    memcpy(run, e->snap, (size_t)n_run * sizeof *run);
    for (int i = 0; i < n_run; i++)
        if (run[i].pos >= run[i].prompt) run[i].bank -= now - e->snap_t;
    if (e->qn >= e->qcap + (e->np - n_run)) {
        /* Retry-After: the soonest a running sequence is done with its max_tokens */
        tn_shape full = {e->np, e->np, 0};
        double dstep = e->sch.f_expect * tn_cost_step(&e->sch.cost, &full), wait = INFINITY;
        for (int i = 0; i < n_run; i++)
            if (run[i].left * dstep < wait) wait = run[i].left * dstep;
        pthread_mutex_unlock(&e->mu);
        *retry_after_s = (int)ceil(isfinite(wait) && wait > 1 ? wait : 1);
        tn_http_err_set(err, 429, "rate_limit_error", NULL, "the request queue is full (%d waiting); retry later", e->qcap);
        lock_met(e);
        e->met->rejected_queue++;
        unlock_met(e);
        return false;
    }
    if (e->cfg.ttft_slo_ms > 0) {
        /* refuse now what would be late: its own predicted first token misses the objective,
         * or it would push a queued request past its deadline */
        double slo = e->cfg.ttft_slo_ms * 1e-3, mine = INFINITY;
        int k = queue_state(e, now, r), c = 0;
        while (e->qord[c] != e->qn) c++;
        bool ok = tn_sched_accept(&e->sch, run, n_run, e->np, e->qsim, k, c, slo, e->qttft, &mine);
        r->ttft_pred = mine;
        if (e->trace)
            fprintf(e->trace, "# submit %s prompt %d max_tokens %d queued %d running %d predicted_ttft_ms %.0f %s\n", r->id,
                    r->p.n_prompt, r->p.max_tokens, e->qn, n_run, mine * 1e3, ok ? "accepted" : "refused");
        if (!ok) {
            pthread_mutex_unlock(&e->mu);
            *retry_after_s = (int)ceil(isfinite(mine) && mine > 1 ? mine : 1);
            if (mine > slo && isfinite(mine))
                tn_http_err_set(err, 429, "rate_limit_error", NULL,
                                "predicted time to first token %.0f ms exceeds the %.0f ms objective; retry later", mine * 1e3,
                                e->cfg.ttft_slo_ms);
            else if (mine > slo)
                tn_http_err_set(err, 429, "rate_limit_error", NULL,
                                "predicted time to first token exceeds the %.0f ms objective; retry later", e->cfg.ttft_slo_ms);
            else
                tn_http_err_set(err, 429, "rate_limit_error", NULL,
                                "the server is at capacity: this request would make queued ones miss the %.0f ms "
                                "time-to-first-token objective; retry later",
                                e->cfg.ttft_slo_ms);
            lock_met(e);
            e->met->rejected_slo++;
            unlock_met(e);
            return false;
        }
    }
    pthread_mutex_lock(&r->mu);
    r->refs++;
    r->state = TN_SREQ_QUEUED;
    pthread_mutex_unlock(&r->mu);
    r->in_queue = true;
    if (TN_TRACE_ON()) tn_trace_thread_name("http", 0); /* the thread's name in a trace */
    TN_TRACE_ASYNC(TN_PH_ASYNC_BEGIN, "request", r);
    TN_TRACE_ASYNC(TN_PH_ASYNC_BEGIN, "queue", r);
    e->q[e->qn++] = r;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return true;
}

void tn_engine_drain(tn_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->draining = true;
    pthread_mutex_unlock(&e->mu);
}

void tn_engine_cancel_all(tn_engine *e) {
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->qn; i++) atomic_store(&e->q[i]->cancelled, 1);
    atomic_store(&e->cancel_all, 1); /* running sequences: the engine thread cancels them */
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

bool tn_engine_idle(tn_engine *e) {
    pthread_mutex_lock(&e->mu);
    bool idle = e->qn == 0 && e->n_active == 0;
    pthread_mutex_unlock(&e->mu);
    return idle;
}
