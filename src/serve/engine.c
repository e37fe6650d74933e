/*
 * engine.c — the continuous-batching engine: one thread owns the tern_ctx (paged KV cache), the
 * block manager (kv.c) and up to n_parallel sequences. Each step builds ONE batch: one token for
 * every decoding sequence plus chunks of pending prefills, runs tn_forward_batch once, samples
 * the sequences whose logits came out, and pushes text to their requests.
 *
 * Scheduling (SLO-aware, after DistServe's goodput: a request counts only if it meets both its
 * TTFT and TPOT objectives):
 *   - a cost model of one step, t = base + dec * n_decode + pf * n_prefill_tokens, is measured at
 *     start-up with real forward passes;
 *   - admission: bounded queue (429 beyond --max-queue); with --ttft-slo a request whose
 *     predicted TTFT misses the objective is refused at once (429) instead of being served late;
 *     the queue is served least-slack-first (deadline minus predicted prefill time);
 *   - prefill chunks are sized so a step stays within --tpot-slo for the running decodes;
 *   - KV: a request is admitted only when the blocks for prompt + max_tokens (minus blocks found
 *     in the prefix cache) can be reserved, so running sequences never run out of blocks.
 * Invariant: a sequence's tokens [0, n_done) have K/V in the blocks of its table; blocks below
 * n_pub are published in the prefix cache (shared, read-only from then on).
 */
#define _GNU_SOURCE 1 /* memmem */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base.h"
#include "model/ctx.h"
#include "model/ops.h"
#include "serve/kv.h"
#include "serve/serve.h"

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
    return r->ch != NULL;
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

/* ---- the engine ------------------------------------------------------------------------------- */
typedef struct tn_seq {
    tn_sreq *r;
    int ci;                /* which choice of r                                                */
    bool active;
    tern_token *toks;      /* [n_ctx_seq] prompt then generated                              */
    int32_t n_toks, n_prompt, n_done, n_gen;
    int32_t *table, n_table, n_resv;
    int32_t n_pub;
    uint64_t pub_hash;
    tern_sampler *smp;
    char *gen;             /* generated bytes (stop strings matched here)                     */
    size_t gen_len, gen_cap, emitted;
    int32_t n_chars;       /* code points in gen (logprobs text_offset)                       */
    double t_last;
    int32_t chunk;         /* tokens of this sequence in the current batch                    */
} tn_seq;

struct tn_engine {
    const tern_model *m;
    tern_ctx *ctx;
    tn_kv kv;
    tn_serve_config cfg;
    tn_metrics *met;
    int32_t n_ctx_seq, np, n_batch, n_vocab, max_blocks_seq;
    pthread_t th;
    bool th_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tn_sreq **q;
    int qn, qcap;
    bool draining, stop;
    atomic_int cancel_all;
    tn_seq *seqs;
    int n_active;
    tern_token *b_tok;
    int32_t *b_seq, *b_pos, *b_owner;
    int8_t *b_logits;
    const int32_t **tables;
    float *lrow;                    /* [n_vocab] logits after logit_bias and penalties         */
    int32_t *pcount;                /* [n_vocab] zero between uses: token counts for penalties  */
    tn_lp lp_tmp[1 + TN_SRV_MAX_TOP_LOGPROBS];
    double cost[3];                 /* base, per decode, per prefill token (seconds)          */
    double scale;                   /* EWMA of measured / predicted step time (load, delays)  */
    double last_pred, last_actual;  /* the last step, folded into scale by snapshot()         */
    /* snapshot for the admission predictor (under mu) */
    int64_t pending_prefill;
    int32_t *remaining;             /* [np] tokens left per running sequence, sorted          */
    int n_remaining;
};

int32_t tn_engine_n_ctx_seq(const tn_engine *e) { return e->n_ctx_seq; }
void tn_engine_cost(const tn_engine *e, double out[3]) { memcpy(out, e->cost, sizeof e->cost); }

static void lock_met(tn_engine *e) { pthread_mutex_lock(&e->met->mu); }
static void unlock_met(tn_engine *e) { pthread_mutex_unlock(&e->met->mu); }

/* The request is over (no choice running, none left to admit): wake its connection, count it. */
static void req_done(tn_engine *e, tn_sreq *r) {
    double now = tn_srv_now();
    pthread_mutex_lock(&r->mu);
    r->t_done = now;
    r->state = TN_SREQ_DONE;
    bool failed = r->err.status != 0, all = true;
    for (int i = 0; i < r->p.n; i++) all &= r->ch[i].finish != NULL;
    const char *reason = r->ch[0].finish;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);

    tn_metrics *m = e->met;
    lock_met(e);
    if (failed) {
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
    if (err_status) req_fail_locked(r, err_status, err_msg);
    else c->finish = reason;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);

    lock_met(e);
    e->met->gen_tokens += (uint64_t)s->n_gen;
    unlock_met(e);

    /* give back KV: shared/published blocks go to the prefix cache when their last user leaves */
    for (int32_t j = 0; j < s->n_table; j++) tn_kv_release(&e->kv, s->table[j]);
    tn_kv_unreserve(&e->kv, s->n_resv);
    s->n_table = s->n_resv = 0;
    tern_sampler_free(s->smp);
    s->smp = NULL;
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
    else if (s->t_last > 0) tn_hist_add(&e->met->itl, now - s->t_last);
    unlock_met(e);
    if (r->t_first == 0) r->t_first = now;
    s->t_last = now;
    r->t_last = now;
    if (!r->p.ignore_eos && tern_token_is_eog(e->m, t)) {
        seq_finish(e, s, "stop", 0, NULL);
        return;
    }
    s->toks[s->n_toks++] = t;
    s->n_gen++;
    if (s->n_gen > r->max_gen) r->max_gen = s->n_gen;
    if (lp && !record_logprobs(s, lp)) {
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

static int32_t blocks_for(int32_t n_tokens) { return (n_tokens + TN_KVB - 1) / TN_KVB; }

/* Index of the next request to admit (FCFS, or least slack with a TTFT objective). */
static int pick_next(tn_engine *e, double now) {
    if (e->cfg.ttft_slo_ms <= 0 || e->qn <= 1) return 0;
    int best = 0;
    double best_slack = 1e300;
    for (int i = 0; i < e->qn; i++) {
        tn_sreq *r = e->q[i];
        double slack = r->t_arrival + e->cfg.ttft_slo_ms * 1e-3 - now - r->p.n_prompt * e->cost[2];
        if (slack < best_slack) best_slack = slack, best = i;
    }
    return best;
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
    while (e->qn > 0 && e->n_active < e->np) {
        int qi = pick_next(e, now);
        tn_sreq *r = e->q[qi];
        const tn_req_params *p = &r->p;
        if (r->n_admitted > 0 && !r->prompt_ready && p->n_prompt - 1 >= TN_KVB) break;
        tn_seq *s = NULL;
        for (int i = 0; i < e->np; i++)
            if (!e->seqs[i].active) {
                s = &e->seqs[i];
                break;
            }
        /* prefix cache: reuse full blocks of the prompt, keeping >= 1 token to compute */
        int32_t hits = 0;
        uint64_t h = 0;
        while ((hits + 1) * TN_KVB <= p->n_prompt - 1) {
            int32_t id = tn_kv_lookup(&e->kv, hits ? s->table[hits - 1] : -1, h, p->prompt + hits * TN_KVB);
            if (id < 0) break;
            s->table[hits++] = id;
            h = tn_kv_hash(h, p->prompt + (hits - 1) * TN_KVB);
        }
        int32_t total = p->n_prompt + p->max_tokens;
        if (total > e->n_ctx_seq) total = e->n_ctx_seq;
        int32_t need = blocks_for(total) - hits;
        if (need < 0) need = 0;
        if (!tn_kv_reserve(&e->kv, need)) {
            for (int32_t j = 0; j < hits; j++) tn_kv_release(&e->kv, s->table[j]);
            break; /* wait for blocks */
        }
        tern_sampler_params sp = p->sp;
        if (r->n_admitted > 0) sp.seed = choice_seed(r->base_seed, r->n_admitted);
        tern_status st = tern_sampler_create(e->m, &sp, &s->smp);
        if (st) {
            for (int32_t j = 0; j < hits; j++) tn_kv_release(&e->kv, s->table[j]);
            tn_kv_unreserve(&e->kv, need);
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
        s->n_gen = 0;
        s->n_table = hits;
        s->n_resv = need;
        s->n_pub = hits;
        s->pub_hash = h;
        s->gen_len = s->emitted = 0;
        s->n_chars = 0;
        s->t_last = 0;
        e->n_active++;
        bool first = r->n_admitted == 0;
        r->n_admitted++;
        r->n_live++;
        pthread_mutex_lock(&r->mu);
        r->refs++; /* the sequence's */
        if (first) {
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

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Refreshes the predictor snapshot and gauges (caller holds mu). */
static void snapshot(tn_engine *e) {
    int64_t pend = 0;
    e->n_remaining = 0;
    for (int i = 0; i < e->qn; i++) pend += (int64_t)e->q[i]->p.n_prompt * (e->q[i]->p.n - e->q[i]->n_admitted);
    for (int i = 0; i < e->np; i++) {
        tn_seq *s = &e->seqs[i];
        if (!s->active) continue;
        if (s->n_done < s->n_prompt) pend += s->n_prompt - s->n_done;
        e->remaining[e->n_remaining++] = s->r->p.max_tokens - s->n_gen;
    }
    qsort(e->remaining, (size_t)e->n_remaining, sizeof *e->remaining, cmp_i32);
    if (e->last_pred > 0 && e->last_actual > 0) { /* the machine is slower or faster than measured */
        double r = e->last_actual / e->last_pred;
        if (r < 0.25) r = 0.25;
        if (r > 1000) r = 1000;
        e->scale = 0.8 * e->scale + 0.2 * r;
        e->last_pred = e->last_actual = 0;
    }
    e->pending_prefill = pend;
    lock_met(e);
    e->met->running = e->n_active;
    e->met->waiting = e->qn;
    e->met->kv_usage = (double)tn_kv_used(&e->kv) / e->kv.n_blocks;
    e->met->kv_used = tn_kv_used(&e->kv);
    e->met->kv_reserved = e->kv.n_reserved;
    unlock_met(e);
}

static bool ensure_blocks(tn_engine *e, tn_seq *s, int32_t last_pos) {
    while (s->n_table * TN_KVB <= last_pos) {
        if (s->n_table >= e->max_blocks_seq) return false;
        int32_t id = tn_kv_alloc(&e->kv, s->n_resv > 0);
        if (id < 0) return false;
        if (s->n_resv > 0) s->n_resv--;
        s->table[s->n_table++] = id;
    }
    return true;
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
    /* 1. every decoding sequence contributes its last sampled token */
    for (int i = 0; i < e->np; i++) {
        tn_seq *s = &e->seqs[i];
        if (!s->active || s->n_done < s->n_prompt || s->n_toks - s->n_done != 1) continue;
        if (!ensure_blocks(e, s, s->n_done)) {
            seq_finish(e, s, NULL, 500, "KV cache exhausted");
            continue;
        }
        e->b_tok[n] = s->toks[s->n_done];
        e->b_seq[n] = i;
        e->b_pos[n] = s->n_done;
        e->b_logits[n] = 1;
        e->b_owner[nl++] = i;
        s->chunk = 1;
        n++;
        n_dec++;
    }
    /* 2. prefill chunks, sized so the step keeps the running decodes within the TPOT objective */
    int32_t budget = e->n_batch - n;
    if (e->cfg.tpot_slo_ms > 0 && n_dec > 0 && e->cost[2] > 0) {
        double room = e->cfg.tpot_slo_ms * 1e-3 * 0.9 - e->cost[0] - e->cost[1] * n_dec;
        int32_t cap = (int32_t)(room / e->cost[2]);
        if (cap < TN_KVB) cap = TN_KVB; /* always make some progress */
        if (cap < budget) budget = cap;
    }
    /* prefill in admission order (oldest first) */
    for (int pass = 0; pass < e->np && budget > 0; pass++) {
        tn_seq *best = NULL;
        for (int i = 0; i < e->np; i++) {
            tn_seq *s = &e->seqs[i];
            if (!s->active || s->chunk || s->n_done >= s->n_prompt) continue;
            if (!best || s->r->t_admit < best->r->t_admit) best = s;
        }
        if (!best) break;
        tn_seq *s = best;
        int i = (int)(s - e->seqs);
        int32_t c = s->n_toks - s->n_done;
        if (c > budget) c = budget;
        bool last = s->n_done + c == s->n_toks;
        if (last && nl >= e->ctx->n_logits_cap) {
            if (c == 1) break;
            c--, last = false;
        }
        if (!ensure_blocks(e, s, s->n_done + c - 1)) {
            seq_finish(e, s, NULL, 500, "KV cache exhausted");
            continue;
        }
        for (int32_t k = 0; k < c; k++) {
            e->b_tok[n] = s->toks[s->n_done + k];
            e->b_seq[n] = i;
            e->b_pos[n] = s->n_done + k;
            e->b_logits[n] = (int8_t)(last && k == c - 1);
            n++;
        }
        if (last) e->b_owner[nl++] = i;
        s->chunk = c;
        budget -= c;
    }
    if (n == 0) return;
    e->last_pred = e->cost[0] + e->cost[1] * n_dec + e->cost[2] * (n - n_dec);
    for (int i = 0; i < e->np; i++) e->tables[i] = e->seqs[i].table;
    tn_batch b = {n, e->b_tok, e->b_seq, e->b_pos, e->b_logits};
    tn_forward_batch(e->ctx, &b, e->tables);
    double now = tn_srv_now();
    lock_met(e);
    e->met->steps++;
    e->met->batch_tokens += (uint64_t)n;
    unlock_met(e);
    /* K/V now exist for the chunk: advance and publish full blocks in the prefix cache */
    for (int i = 0; i < e->np; i++) {
        tn_seq *s = &e->seqs[i];
        if (!s->active || !s->chunk) continue;
        s->n_done += s->chunk;
        if (s->n_done >= s->n_prompt) s->r->prompt_ready = true;
        while ((s->n_pub + 1) * TN_KVB <= s->n_done) {
            int32_t j = s->n_pub;
            tn_kv_publish(&e->kv, s->table[j], j ? s->table[j - 1] : -1, s->pub_hash, s->toks + j * TN_KVB);
            s->pub_hash = tn_kv_hash(s->pub_hash, s->toks + j * TN_KVB);
            s->n_pub++;
        }
    }
    for (int k = 0; k < nl && k < e->ctx->n_logits; k++) {
        tn_seq *s = &e->seqs[e->b_owner[k]];
        if (!s->active) continue;
        const tn_req_params *p = &s->r->p;
        const float *raw = e->ctx->logits + (size_t)k * e->n_vocab, *lg = raw;
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
        tern_token t = tern_sampler_sample(s->smp, lg);
        if (p->logprobs) logprobs_of(raw, e->n_vocab, t, p->top_logprobs, e->lp_tmp);
        on_token(e, s, t, p->logprobs ? e->lp_tmp : NULL, now);
    }
}

static void *engine_main(void *arg) {
    tn_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && e->n_active == 0 && e->qn == 0) {
            snapshot(e);
            pthread_cond_wait(&e->cv, &e->mu);
        }
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
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
        step(e);
        if (e->cfg.step_delay_ms > 0) {
            struct timespec ts = {(time_t)(e->cfg.step_delay_ms / 1e3), (long)(fmod(e->cfg.step_delay_ms, 1e3) * 1e6)};
            nanosleep(&ts, NULL);
        }
        e->last_actual = tn_srv_now() - t0;
    }
    return NULL;
}

/* ---- start-up cost model ---------------------------------------------------------------------- */
static double timed_forward(tn_engine *e, int32_t n) {
    tn_batch b = {n, e->b_tok, e->b_seq, e->b_pos, e->b_logits};
    double t0 = tn_srv_now();
    tn_forward_batch(e->ctx, &b, e->tables);
    return tn_srv_now() - t0;
}

static void measure_cost(tn_engine *e) {
    int32_t P = e->n_batch < 128 ? e->n_batch : 128;
    if (P > e->n_ctx_seq - 1) P = e->n_ctx_seq - 1;
    int np = e->np;
    int32_t need = blocks_for(P + 1) + (np - 1);
    if (P < 1 || need > e->kv.n_blocks) {
        e->cost[0] = 1e-3, e->cost[1] = 1e-3, e->cost[2] = 1e-4;
        return;
    }
    for (int i = 0; i < np; i++) {
        e->seqs[i].n_table = 0;
        ensure_blocks(e, &e->seqs[i], i == 0 ? P : 0);
        e->tables[i] = e->seqs[i].table;
    }
    double tp = 1e30, t1 = 1e30, tn = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        for (int32_t k = 0; k < P; k++) {
            e->b_tok[k] = (k * 7 + 1) % e->n_vocab;
            e->b_seq[k] = 0;
            e->b_pos[k] = k;
            e->b_logits[k] = k == P - 1;
        }
        double t = timed_forward(e, P);
        if (t < tp) tp = t;
        e->b_tok[0] = 1, e->b_seq[0] = 0, e->b_pos[0] = P, e->b_logits[0] = 1;
        t = timed_forward(e, 1);
        if (t < t1) t1 = t;
        for (int i = 0; i < np; i++) {
            e->b_tok[i] = 1, e->b_seq[i] = i, e->b_pos[i] = i == 0 ? P : 0, e->b_logits[i] = 1;
        }
        t = timed_forward(e, np);
        if (t < tn) tn = t;
    }
    for (int i = 0; i < np; i++) {
        for (int32_t j = 0; j < e->seqs[i].n_table; j++) tn_kv_release(&e->kv, e->seqs[i].table[j]);
        e->seqs[i].n_table = 0;
    }
    double dec = np > 1 ? (tn - t1) / (np - 1) : t1 * 0.1;
    if (dec < 1e-7) dec = 1e-7;
    double base = t1 - dec;
    if (base < 0) base = 0;
    double pf = (tp - base) / P;
    if (pf < 1e-8) pf = 1e-8;
    e->cost[0] = base, e->cost[1] = dec, e->cost[2] = pf;
    if (!e->cfg.quiet)
        fprintf(stderr,
                "tern serve: cost model: step %.3f ms + %.3f ms per decode + %.4f ms per prefill token "
                "(decode: batch 1 %.1f tok/s, batch %d %.1f tok/s)\n",
                base * 1e3, dec * 1e3, pf * 1e3, 1.0 / t1, np, np / tn);
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
    tern_status s = tern_ctx_create(m, &cp, &e->ctx);
    if (s) goto fail;
    e->n_batch = e->ctx->n_batch;
    if (e->np > e->ctx->n_logits_cap) e->np = e->ctx->n_logits_cap;
    if ((s = tn_kv_init(&e->kv, e->ctx->kv_blocks))) goto fail;
    e->qcap = cfg->max_queue > 0 ? cfg->max_queue : 0;
    e->q = tn_calloc((size_t)e->qcap + (size_t)e->np + 1, sizeof *e->q);
    e->seqs = tn_calloc((size_t)e->np, sizeof *e->seqs);
    e->b_tok = tn_calloc((size_t)e->n_batch, sizeof *e->b_tok);
    e->b_seq = tn_calloc((size_t)e->n_batch, sizeof *e->b_seq);
    e->b_pos = tn_calloc((size_t)e->n_batch, sizeof *e->b_pos);
    e->b_owner = tn_calloc((size_t)e->n_batch, sizeof *e->b_owner);
    e->b_logits = tn_calloc((size_t)e->n_batch, sizeof *e->b_logits);
    e->tables = tn_calloc((size_t)e->np, sizeof *e->tables);
    e->lrow = tn_malloc((size_t)e->n_vocab * sizeof *e->lrow);
    e->pcount = tn_calloc((size_t)e->n_vocab, sizeof *e->pcount);
    e->remaining = tn_calloc((size_t)e->np, sizeof *e->remaining);
    if (!e->q || !e->seqs || !e->b_tok || !e->b_seq || !e->b_pos || !e->b_owner || !e->b_logits || !e->tables || !e->lrow ||
        !e->pcount || !e->remaining) {
        s = tn_err(TERN_ERR_NOMEM, "serve: engine buffers");
        goto fail;
    }
    for (int i = 0; i < e->np; i++) {
        e->seqs[i].toks = tn_malloc((size_t)e->n_ctx_seq * sizeof(tern_token));
        e->seqs[i].table = tn_malloc((size_t)e->max_blocks_seq * sizeof(int32_t));
        if (!e->seqs[i].toks || !e->seqs[i].table) {
            s = tn_err(TERN_ERR_NOMEM, "serve: sequence buffers");
            goto fail;
        }
    }
    met->kv_blocks = e->kv.n_blocks;
    measure_cost(e);
    e->scale = 1.0;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
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
            tn_free(s->gen);
        }
    }
    tn_free(e->q);
    tn_free(e->seqs);
    tn_free(e->b_tok);
    tn_free(e->b_seq);
    tn_free(e->b_pos);
    tn_free(e->b_owner);
    tn_free(e->b_logits);
    tn_free(e->tables);
    tn_free(e->lrow);
    tn_free(e->pcount);
    tn_free(e->remaining);
    tn_kv_free(&e->kv);
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
    /* predicted wait for a sequence slot: running sequences finish after their remaining
     * tokens, queued requests ahead take the earliest free slot in turn (max_tokens is an upper
     * bound: EOS can come sooner) */
    double sc = e->scale > 0 ? e->scale : 1.0;
    double step = sc * (e->cost[0] + e->cost[1] * e->np), pf = sc * e->cost[2];
    double fin[64] = {0};
    for (int i = 0; i < e->np; i++) fin[i] = i < e->n_remaining ? e->remaining[i] * step : 0;
    for (int k = 0; k < e->qn; k++)
        for (int c = e->q[k]->n_admitted; c < e->q[k]->p.n; c++) { /* each choice takes a slot */
            int j = 0;
            for (int i = 1; i < e->np; i++)
                if (fin[i] < fin[j]) j = i;
            fin[j] += e->q[k]->p.n_prompt * pf + e->q[k]->p.max_tokens * step;
        }
    double slot_wait = fin[0];
    for (int i = 1; i < e->np; i++)
        if (fin[i] < slot_wait) slot_wait = fin[i];
    if (e->qn >= e->qcap + (e->np - e->n_remaining)) {
        pthread_mutex_unlock(&e->mu);
        *retry_after_s = (int)ceil(slot_wait > 1 ? slot_wait : 1);
        tn_http_err_set(err, 429, "rate_limit_error", NULL, "the request queue is full (%d waiting); retry later", e->qcap);
        lock_met(e);
        e->met->rejected_queue++;
        unlock_met(e);
        return false;
    }
    if (e->cfg.ttft_slo_ms > 0) {
        double ttft = slot_wait + r->p.n_prompt * pf + ceil((double)r->p.n_prompt / e->n_batch) * step;
        if (ttft * 1e3 > e->cfg.ttft_slo_ms) {
            pthread_mutex_unlock(&e->mu);
            *retry_after_s = (int)ceil(ttft > 1 ? ttft : 1);
            tn_http_err_set(err, 429, "rate_limit_error", NULL,
                            "predicted time to first token %.0f ms exceeds the %.0f ms objective; retry later", ttft * 1e3,
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
    e->q[e->qn++] = r;
    e->pending_prefill += (int64_t)r->p.n_prompt * r->p.n;
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
