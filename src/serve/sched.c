/*
 * sched.c — the scheduling policy of tern serve (sched.h; the policy is described in engine.c):
 * the step cost model, the load correction, one step's plan and the TTFT predictor that runs
 * the plan forward.
 */
#include "serve/sched.h"

#include <math.h>
#include <string.h>

/* ---- cost model -------------------------------------------------------------------------------- */
double tn_cost_rows(const tn_cost *c, int32_t rows) {
    if (rows <= 0 || c->n_pts <= 0) return 0;
    if (c->n_pts == 1) return c->t[0] * rows / c->rows[0];
    int i = 1;
    while (i < c->n_pts - 1 && c->rows[i] < rows) i++;
    /* segment [i-1, i]; below rows[0] and past the last point the end segments extend */
    double x0 = c->rows[i - 1], x1 = c->rows[i], y0 = c->t[i - 1], y1 = c->t[i];
    double t = y0 + (y1 - y0) * (rows - x0) / (x1 - x0);
    return t > 0 ? t : 0;
}

double tn_cost_step(const tn_cost *c, const tn_shape *s) {
    if (s->rows <= 0) return 0;
    int32_t extra = s->logits > 1 ? s->logits - 1 : 0;
    return tn_cost_rows(c, s->rows) + c->logit * extra + c->key * (double)s->keys;
}

int64_t tn_chunk_keys(int32_t pos, int32_t n) { return (int64_t)n * pos + (int64_t)n * (n + 1) / 2; }

/* ---- load correction ----------------------------------------------------------------------------- */
void tn_load_init(tn_load *l) {
    l->mean = 1.0;
    l->var = 0.01; /* sd 0.1 until steps are seen */
    l->n = 0;
}

void tn_load_observe(tn_load *l, double predicted, double actual) {
    if (!(predicted > 0) || !(actual > 0)) return;
    double r = actual / predicted;
    if (r < 0.25) r = 0.25;
    if (r > 50) r = 50;
    double d = r - l->mean, a = TN_LOAD_ALPHA;
    l->mean += a * d;
    l->var = (1 - a) * (l->var + a * d * d); /* exponentially weighted variance */
    l->n++;
}

double tn_load_sd(const tn_load *l) { return sqrt(l->var > 0 ? l->var : 0); }
double tn_load_plan(const tn_load *l) { return l->mean + TN_LOAD_Z * tn_load_sd(l); }

/* ---- one step ---------------------------------------------------------------------------------- */
static bool decoding(const tn_sseq *q) { return q->pos >= q->prompt; }

double tn_sched_limit(const tn_sched *s, const tn_sseq *q, int n) {
    double lim = INFINITY;
    if (s->tpot <= 0) return lim;
    for (int i = 0; i < n; i++) {
        if (!decoding(&q[i])) continue;
        double b = q[i].bank < s->bank_cap ? q[i].bank : s->bank_cap;
        if (s->tpot + b < lim) lim = s->tpot + b;
    }
    return lim;
}

double tn_sched_plan(const tn_sched *s, tn_sseq *q, int n, tn_shape *shape) {
    tn_shape sh = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        q[i].chunk = 0;
        if (!decoding(&q[i]) || sh.rows >= s->n_batch) continue;
        q[i].chunk = 1;
        sh.rows++;
        sh.logits++;
        sh.keys += q[i].pos + 1;
    }
    double lim = tn_sched_limit(s, q, n), f = s->f_plan > 0 ? s->f_plan : 1;
    for (int i = 0; i < n; i++) {
        if (decoding(&q[i])) continue;
        int32_t left = q[i].prompt - q[i].pos, hi = s->n_batch - sh.rows, lp = q[i].lp_rows;
        if (hi > left) hi = left;
        if (lp && hi > s->n_logits_cap - sh.logits) hi = s->n_logits_cap - sh.logits; /* a logit row each */
        if (!lp && hi == left && sh.logits >= s->n_logits_cap) hi = left - 1;          /* none for its end */
        /* the largest chunk k in [0, hi] whose step fits the limit (time grows with k) */
        int32_t lo = 0;
        while (lo < hi) {
            int32_t k = lo + (hi - lo + 1) / 2;
            tn_shape t = {sh.rows + k, sh.logits + (lp ? k : k == left), sh.keys + tn_chunk_keys(q[i].pos, k)};
            if (isinf(lim) || f * tn_cost_step(&s->cost, &t) <= lim) lo = k;
            else hi = k - 1;
        }
        if (lo == 0) break; /* prefills go in order: nothing for the ones behind either */
        q[i].chunk = lo;
        sh.rows += lo;
        sh.logits += lp ? lo : lo == left;
        sh.keys += tn_chunk_keys(q[i].pos, lo);
    }
    if (shape) *shape = sh;
    return tn_cost_step(&s->cost, &sh);
}

/* ---- speculative decoding ------------------------------------------------------------------------ */
double tn_spec_expected(double a, int32_t k) {
    if (k <= 0) return 1;
    if (a >= 1) return k + 1;
    if (a <= 0) return 1;
    return (1 - pow(a, k + 1)) / (1 - a);
}

double tn_spec_acc_update(double a, int32_t drafted, int32_t accepted) {
    for (int32_t j = 0; j < accepted; j++) a += TN_SPEC_ACC_ALPHA * (1 - a);
    if (accepted < drafted) a -= TN_SPEC_ACC_ALPHA * a;
    return a;
}

/* One more draft row for a sequence on shape sh: false when rows or logit rows run out. */
static bool spec_grow(const tn_sched *s, const tn_sseq *q, const tn_spec_seq *p, tn_shape *sh, int32_t max_rows) {
    if (sh->rows + 1 > max_rows || sh->logits + 1 > s->n_logits_cap) return false;
    sh->rows++;
    sh->logits++;
    sh->keys += q->pos + p->k + 2; /* draft j sits at pos + 1 + j */
    return true;
}

static bool spec_decoding(const tn_sseq *q) { return decoding(q) && q->chunk == 1; }

double tn_spec_draft_cost(const tn_spec_cfg *cfg, const tn_sseq *q, const tn_spec_seq *sp, int n) {
    if (!cfg->draft) return 0;
    int32_t kmax = 0;
    for (int i = 0; i < n; i++)
        if (sp[i].k > kmax) kmax = sp[i].k;
    double t = 0;
    for (int32_t p = 1; p <= kmax; p++) {
        tn_shape sh = {0, 0, 0};
        for (int i = 0; i < n; i++)
            if (sp[i].k >= p) sh.rows++, sh.logits++, sh.keys += q[i].pos + p;
        t += tn_cost_step(cfg->draft, &sh);
    }
    return t;
}

/* The decoding sequence whose next draft is the most likely to be kept, -1 if none can grow. */
static int spec_best(const tn_sseq *q, const tn_spec_seq *sp, int n, const tn_spec_cfg *cfg) {
    int best = -1;
    double g = -1;
    for (int i = 0; i < n; i++) {
        int32_t lim = sp[i].drafts < cfg->kmax ? sp[i].drafts : cfg->kmax;
        if (!spec_decoding(&q[i]) || sp[i].k >= lim) continue;
        double gi = pow(sp[i].acc, sp[i].k + 1);
        if (gi > g) g = gi, best = i;
    }
    return best;
}

/* The step's work before drafts: a token per decoding row and a unit per prompt row of a
 * prefill chunk. A prompt row is work the queue needs done as much as an output token, so a
 * draft row pays only if its expected tokens beat what its time does for the whole step: in a
 * prefill-heavy (compute-bound) step at saturation they do not, while counting output tokens
 * alone would credit drafts with the time the prompt rows take anyway. */
static double spec_work(const tn_sseq *q, int n) {
    double w = 0;
    for (int i = 0; i < n; i++) w += q[i].chunk > 0 ? q[i].chunk : 0;
    return w;
}

/* Adds up to m draft rows in the greedy order within the caps and the time limit; with
 * ratio_best, records in *m_best the count after which expected work / time was highest. */
static void spec_add(const tn_sched *s, const tn_sseq *q, tn_spec_seq *sp, int n, const tn_spec_cfg *cfg, tn_shape *sh, int m,
                     int32_t max_rows, double lim, double *ratio_best, int *m_best) {
    double f = s->f_plan > 0 ? s->f_plan : 1, tok = spec_work(q, n);
    for (int added = 0; added < m; added++) {
        int i = spec_best(q, sp, n, cfg);
        if (i < 0) break;
        tn_shape t = *sh;
        if (!spec_grow(s, &q[i], &sp[i], &t, max_rows)) break;
        sp[i].k++;
        double dt = tn_cost_step(&s->cost, &t) + tn_spec_draft_cost(cfg, q, sp, n);
        if (!isinf(lim) && f * dt > lim) {
            sp[i].k--;
            break;
        }
        tok += pow(sp[i].acc, sp[i].k);
        *sh = t;
        if (ratio_best && dt > 0 && tok / dt > *ratio_best * (1 + 1e-9)) *ratio_best = tok / dt, *m_best = added + 1;
    }
}

double tn_sched_spec(const tn_sched *s, const tn_sseq *q, tn_spec_seq *sp, int n, const tn_spec_cfg *cfg, tn_shape *shape) {
    for (int i = 0; i < n; i++) sp[i].k = 0;
    tn_shape sh = *shape;
    int32_t kmin = cfg->kmin > 1 ? cfg->kmin : 1, max_rows = s->n_batch;
    if (cfg->rows_cap > 0 && sh.rows < cfg->rows_cap && max_rows > cfg->rows_cap - 1) max_rows = cfg->rows_cap - 1;
    if (cfg->fixed) {
        for (int i = 0; i < n; i++) {
            int32_t want = sp[i].drafts < cfg->kmax ? sp[i].drafts : cfg->kmax;
            if (!spec_decoding(&q[i]) || want < kmin) continue;
            if (sh.rows + want > max_rows || sh.logits + want > s->n_logits_cap) continue;
            while (sp[i].k < want) spec_grow(s, &q[i], &sp[i], &sh, max_rows), sp[i].k++;
        }
    } else {
        /* the greedy order once to find the best number of rows, then again up to it */
        double lim = tn_sched_limit(s, q, n), t0 = tn_cost_step(&s->cost, &sh), best;
        int m_best = 0, n_dec = 0;
        for (int i = 0; i < n; i++) n_dec += spec_decoding(&q[i]);
        if (n_dec == 0 || !(t0 > 0)) return t0;
        best = spec_work(q, n) / t0;
        if (cfg->backlog > 0) { /* the rate of a full batch of decodes: what a draft row displaces */
            tn_shape full = {cfg->backlog, cfg->backlog, sh.keys / (n_dec > 0 ? n_dec : 1) * cfg->backlog};
            const double tf = tn_cost_step(&s->cost, &full);
            if (tf > 0 && cfg->backlog / tf > best) best = cfg->backlog / tf;
        }
        tn_shape tmp = sh;
        spec_add(s, q, sp, n, cfg, &tmp, 1 << 30, max_rows, lim, &best, &m_best);
        for (int i = 0; i < n; i++) sp[i].k = 0;
        spec_add(s, q, sp, n, cfg, &sh, m_best, max_rows, lim, NULL, NULL);
        /* lengths under kmin are not tried: their rows go */
        for (int i = 0; i < n; i++)
            if (sp[i].k > 0 && sp[i].k < kmin) {
                sh.rows -= sp[i].k;
                sh.logits -= sp[i].k;
                sh.keys -= tn_chunk_keys(q[i].pos + 1, sp[i].k);
                sp[i].k = 0;
            }
    }
    *shape = sh;
    return tn_cost_step(&s->cost, &sh) + tn_spec_draft_cost(cfg, q, sp, n);
}

/* ---- admission and TTFT prediction ------------------------------------------------------------ */
bool tn_sched_starts(const tn_sched *s, tn_sseq *q, int n, const tn_sreq_sim *r) {
    q[n] = (tn_sseq){0, r->prompt > 0 ? r->prompt : 1, r->left, 0, 0, false};
    tn_sched_plan(s, q, n + 1, NULL);
    return n == 0 || q[n].chunk > 0;
}

#define SIM_MAX 128
#define SIM_STEPS 100000

typedef struct sim_seq {
    tn_sseq q;
    int req;                    /* index of the queued request it started for, or -1             */
} sim_seq;

void tn_sched_simulate(const tn_sched *s, const tn_sseq *q, int n, int n_slots, const tn_sreq_sim *r, int nr,
                       double horizon, double *ttft) {
    for (int j = 0; j < nr; j++) ttft[j] = INFINITY;
    sim_seq a[SIM_MAX];
    tn_sseq plan[SIM_MAX + 1];
    int na = 0, used = 0, next = 0, done = 0;
    if (n_slots > SIM_MAX) n_slots = SIM_MAX;
    for (int i = 0; i < n && na < n_slots; i++) {
        a[na].q = q[i];
        a[na++].req = -1;
        used++;
    }
    double t = 0, f = s->f_expect > 0 ? s->f_expect : 1;
    for (int steps = 0; done < nr && t <= horizon && steps < SIM_STEPS; steps++) {
        /* start queued requests while slots are free and the step would give them tokens */
        while (next < nr && na < SIM_MAX) {
            int w = r[next].n > 0 ? r[next].n : 1;
            if (used + w > n_slots) break;
            for (int i = 0; i < na; i++) plan[i] = a[i].q;
            if (!tn_sched_starts(s, plan, na, &r[next])) break;
            a[na].q = plan[na];
            a[na].q.chunk = 0;
            a[na++].req = next++;
            used += w;
        }
        if (na == 0) break; /* a request wants more slots than there are */
        for (int i = 0; i < na; i++) plan[i] = a[i].q;
        double dt = f * tn_sched_plan(s, plan, na, NULL);
        if (dt < 1e-6) dt = 1e-6;
        t += dt;
        int w = 0, spawn = 0;
        sim_seq extra = {{0, 0, 0, 0, 0, false}, -1};
        for (int i = 0; i < na; i++) {
            sim_seq x = a[i];
            int32_t c = plan[i].chunk;
            if (decoding(&x.q)) {
                if (c) {
                    x.q.pos++;
                    x.q.left--;
                    x.q.bank += s->tpot - dt;
                } else {
                    x.q.bank -= dt;
                }
            } else if (c) {
                x.q.pos += c;
                if (decoding(&x.q)) { /* the prompt is in: first token now */
                    x.q.left--;
                    x.q.bank = 0;
                    if (x.req >= 0) {
                        if (t <= horizon) ttft[x.req] = t;
                        done++;
                        /* its other choices decode next to it (their short prefills ignored) */
                        spawn += r[x.req].n - 1;
                        extra = (sim_seq){x.q, -1};
                    }
                }
            }
            if (decoding(&x.q) && x.q.left <= 0) {
                used--; /* finished: its slot is free */
                continue;
            }
            a[w++] = x;
        }
        for (; spawn > 0 && w < SIM_MAX; spawn--) a[w++] = extra;
        used -= spawn; /* slots of choices that did not fit the simulation */
        na = w;
    }
}

/* Requests of r[0..nr) not started and predicted late. */
static int count_late(const tn_sreq_sim *r, int nr, const double *ttft, double slo, int skip) {
    int k = 0;
    for (int j = 0; j < nr; j++) k += j != skip && !r[j].started && r[j].waited + ttft[j] > slo;
    return k;
}

int tn_sched_first_late(const tn_sched *s, const tn_sseq *q, int n, int n_slots, const tn_sreq_sim *r, int nr, double slo,
                        double *ttft) {
    tn_sched_simulate(s, q, n, n_slots, r, nr, slo, ttft);
    for (int j = 0; j < nr; j++)
        if (!r[j].started && r[j].waited + ttft[j] > slo) return j;
    return -1;
}

bool tn_sched_accept(const tn_sched *s, const tn_sseq *q, int n, int n_slots, tn_sreq_sim *r, int nr, int c, double slo,
                     double *ttft, double *ttft_c) {
    tn_sched_simulate(s, q, n, n_slots, r, nr, slo, ttft);
    *ttft_c = ttft[c];
    if (r[c].waited + ttft[c] > slo) return false;
    int late_with = count_late(r, nr, ttft, slo, c);
    if (late_with == 0) return true;
    /* the queue without it: shift r[c+1..] down by one, simulate, put it back */
    tn_sreq_sim me = r[c];
    for (int j = c; j < nr - 1; j++) r[j] = r[j + 1];
    tn_sched_simulate(s, q, n, n_slots, r, nr - 1, slo, ttft);
    int late_without = count_late(r, nr - 1, ttft, slo, -1);
    for (int j = nr - 1; j > c; j--) r[j] = r[j - 1];
    r[c] = me;
    return late_with <= late_without;
}
