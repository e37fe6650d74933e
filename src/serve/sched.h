/*
 * sched.h — tern serve's scheduling policy as pure functions: no clock, thread or model. The
 * engine (engine.c, where the policy is described) feeds them its state; tests/serve feed them
 * made-up states and step times.
 */
#ifndef TN_SERVE_SCHED_H
#define TN_SERVE_SCHED_H

#include <stdbool.h>
#include <stdint.h>

/* ---- step cost model --------------------------------------------------------------------------- */
#define TN_COST_NPTS 8
/* Seconds of one engine step (forward pass + sampling) on a quiet machine:
 *   t(rows) + logit * (rows with logits - 1) + key * (query, key) pairs of attention
 * where t(rows) is interpolated between measured batch sizes (a step with one logit row and
 * next to no context). Matmul time is not linear in rows: one row streams the weights
 * (memory-bound), a few rows cost little more, many rows are compute-bound. */
typedef struct tn_cost {
    int n_pts;
    int32_t rows[TN_COST_NPTS]; /* ascending, rows[0] = 1                                        */
    double t[TN_COST_NPTS];     /* seconds for that many rows                                    */
    double logit;               /* per extra row whose logits are computed (output matmul, sampling) */
    double key;                 /* per (query, key) pair: attention over long contexts           */
} tn_cost;

typedef struct tn_shape {
    int32_t rows, logits;
    int64_t keys;               /* sum over rows of the keys each attends to (position + 1)      */
} tn_shape;

double tn_cost_rows(const tn_cost *c, int32_t rows);
double tn_cost_step(const tn_cost *c, const tn_shape *s);
/* Keys read by a chunk of n rows starting at position pos: n * pos + n (n + 1) / 2. */
int64_t tn_chunk_keys(int32_t pos, int32_t n);

/* ---- load correction ----------------------------------------------------------------------------- */
/* Exponentially weighted mean and variance of actual / predicted step time: the machine is
 * slower (other jobs on the cores) or faster than at start-up. Steps are planned with
 * mean + TN_LOAD_Z * sd, so the margin widens by itself while step times jump around and
 * narrows when they are steady; durations are predicted with the mean. */
#define TN_LOAD_ALPHA 0.25
#define TN_LOAD_Z 1.0
typedef struct tn_load {
    double mean, var;
    int64_t n;
} tn_load;

void tn_load_init(tn_load *l);
void tn_load_observe(tn_load *l, double predicted, double actual);
double tn_load_plan(const tn_load *l);
double tn_load_sd(const tn_load *l);

/* ---- one step --------------------------------------------------------------------------------- */
typedef struct tn_sched {
    tn_cost cost;
    double f_plan;              /* load factor steps are planned with (tn_load_plan)             */
    double f_expect;            /* load factor durations are predicted with (the mean)           */
    double tpot;                /* TPOT objective, seconds; 0 = none                             */
    double bank_cap;            /* most banked seconds one step may spend                        */
    int32_t n_batch, n_logits_cap;
} tn_sched;

/* A running sequence as the policy sees it. Decoding when pos >= prompt (one sampled token to
 * feed), prefilling otherwise. */
typedef struct tn_sseq {
    int32_t pos;                /* tokens with K/V                                               */
    int32_t prompt;             /* prompt tokens                                                 */
    int32_t left;               /* tokens still to generate (upper bound: max_tokens)            */
    double bank;                /* decoding: seconds ahead of its TPOT schedule, i.e.
                                 * (tokens - 1) * tpot - (now - first token time); may be < 0     */
    int32_t chunk;              /* out: rows of this sequence in the planned step                */
    bool lp_rows;               /* prefilling: every prompt row wants logits (echo + logprobs)   */
} tn_sseq;

/* Longest step the decoding sequences allow: min over them of tpot + min(bank, bank_cap)
 * (keeping every one on schedule keeps its mean TPOT within the objective); INFINITY without
 * a TPOT objective or without decoding sequences. */
double tn_sched_limit(const tn_sched *s, const tn_sseq *q, int n);

/* Plans one step over q[0..n): chunk = 1 for every decoding sequence; then prefill chunks in
 * array order (first sequence first), the most tokens such that f_plan x predicted time stays
 * within tn_sched_limit, n_batch rows and n_logits_cap logit rows (a chunk's last row when it
 * ends the prompt, or every row with lp_rows). Returns the step's predicted
 * seconds at an unloaded machine (0 for an empty step); *shape gets its shape. */
double tn_sched_plan(const tn_sched *s, tn_sseq *q, int n, tn_shape *shape);

/* ---- speculative decoding: the speculation length per sequence and step ---------------------- */
/* After "The Synergy of Speculative Decoding and Batching in Serving Large Language Models": a
 * decoding sequence verifying k drafts with per-token acceptance rate a emits
 * (1 - a^(k+1)) / (1 - a) tokens in expectation (k + 1 at a = 1), and its k rows make the whole
 * step slower by what the cost model says. tn_sched_spec adds draft rows one at a time, each
 * to the sequence whose next draft is the most likely to be kept (a^(k+1)), while the step's
 * rows, logit rows and time stay within n_batch, n_logits_cap and tn_sched_limit (the TPOT
 * objective), and keeps the number of rows that maximises expected tokens / predicted time.
 * Rows are nearly free while a step is memory-bound (few rows): k grows with the acceptance
 * rate; once rows cost their share (a full batch, compute-bound) a draft row that yields a < 1
 * tokens costs more than it gives and k falls to 0. */
#define TN_SPEC_KMAX 32          /* most drafts per sequence and step                            */
#define TN_SPEC_ACC_ALPHA 0.2    /* weight of one verified draft in the acceptance rate          */
#define TN_SPEC_ACC_START 0.5    /* acceptance rate of a new sequence                            */
typedef struct tn_spec_cfg {
    int32_t kmin, kmax;          /* --draft-min, --draft-max: fewer than kmin drafts are not tried */
    bool fixed;                  /* every sequence verifies min(kmax, drafts) (if >= kmin) as   */
                                 /* long as rows and logit rows allow: no cost model            */
    int32_t rows_cap;            /* > 0: draft rows never take a step of fewer rows to this many */
                                 /* (the forward pass's numerics change there: TN_ATTN_F32_ROWS) */
    const tn_cost *draft;        /* --draft: the draft model's step cost (NULL: n-gram drafts,  */
                                 /* free): drafting k tokens takes k batched passes of it, pass */
                                 /* p over the sequences verifying >= p drafts (tn_spec_draft_cost) */
    int32_t backlog;             /* > 0: requests are waiting for this many sequence slots: a    */
                                 /* draft row must then yield the work per second of a step of  */
                                 /* `backlog` decoding rows, what the slots could be doing      */
} tn_spec_cfg;

typedef struct tn_spec_seq {     /* a running sequence's side of speculation (parallel to tn_sseq) */
    int32_t drafts;              /* in: drafted tokens it could verify                          */
    double acc;                  /* in: its acceptance rate (tn_spec_acc_update)                */
    int32_t k;                   /* out: drafts it verifies in this step                        */
} tn_spec_seq;

/* Expected tokens emitted by one verification of k drafts at acceptance rate a. */
double tn_spec_expected(double a, int32_t k);
/* The acceptance rate after verifying `drafted` drafts of which the first `accepted` were kept:
 * an exponentially weighted mean (TN_SPEC_ACC_ALPHA) over the verified positions: each kept
 * draft counts 1, the first rejected one 0 (the drafts behind it are not tested). */
double tn_spec_acc_update(double a, int32_t drafted, int32_t accepted);
/* Seconds of the draft model's passes for the lengths sp[i].k: pass p (1..max k) runs one row
 * for each sequence with k >= p, each wanting logits and attending to pos + p keys. 0 without a
 * draft model. */
double tn_spec_draft_cost(const tn_spec_cfg *cfg, const tn_sseq *q, const tn_spec_seq *sp, int n);
/* Chooses sp[i].k for a step planned by tn_sched_plan (q[i].chunk and *shape set): 0 for every
 * sequence not decoding in it, else a length in {0} u [kmin, min(kmax, drafts)]. *shape grows by
 * the draft rows (each wants logits), within n_batch, n_logits_cap and rows_cap. The time a
 * choice costs is the target's step plus, with a draft model, its passes (tn_spec_draft_cost),
 * so a slow draft model drafts less, or not at all. Returns the step's predicted seconds, the
 * draft passes included. */
double tn_sched_spec(const tn_sched *s, const tn_sseq *q, tn_spec_seq *sp, int n, const tn_spec_cfg *cfg, tn_shape *shape);

/* ---- admission and TTFT prediction ------------------------------------------------------------ */
typedef struct tn_sreq_sim {
    int32_t prompt, left;       /* prompt tokens to compute, tokens to generate                  */
    int n;                      /* choices: sequence slots it takes                              */
    double waited;              /* seconds since it arrived                                      */
    bool started;               /* its first choice runs already (never refused)                 */
} tn_sreq_sim;

/* Would request r start now: q[0..n) are the running sequences (q has room for one more), and
 * the plan with r behind them gives r prompt tokens, or nothing runs. */
bool tn_sched_starts(const tn_sched *s, tn_sseq *q, int n, const tn_sreq_sim *r);

/* Runs the policy forward from the running sequences q[0..n) with n_slots sequence slots: each
 * step planned by tn_sched_plan and lasting f_expect x its prediction; decoding sequences finish
 * after their `left` tokens; queued requests r[0..nr) start in that order, each when a slot is
 * free and tn_sched_starts says so (as the engine admits). ttft[j] gets the predicted seconds
 * from now to request j's first token, INFINITY if it is not reached within horizon seconds. */
void tn_sched_simulate(const tn_sched *s, const tn_sseq *q, int n, int n_slots, const tn_sreq_sim *r, int nr,
                       double horizon, double *ttft);

/* The queue r[0..nr) in service order: index of the first request not yet started that is
 * predicted to miss the TTFT objective slo (waited + predicted > slo), -1 when none; ttft
 * (nr entries) gets the predictions. */
int tn_sched_first_late(const tn_sched *s, const tn_sseq *q, int n, int n_slots, const tn_sreq_sim *r, int nr, double slo,
                        double *ttft);

/* Admission of an arriving request, r[c] of the queue r[0..nr) in service order: true when its
 * own predicted first token meets slo and it makes no queued request late that would not be
 * late without it. *ttft_c gets its prediction (seconds from now). ttft: scratch of nr. */
bool tn_sched_accept(const tn_sched *s, const tn_sseq *q, int n, int n_slots, tn_sreq_sim *r, int nr, int c, double slo,
                     double *ttft, double *ttft_c);

#endif
