/*
 * dist.h — distributed training on MPI (Open MPI's mpirun): data parallel, DiLoCo and NoLoCo.
 *
 * Every rank runs the whole trainer (run.c) on the same seed: same vocabulary, same init, same
 * data cursor. Each step the trainer draws the global batch of B*N windows and keeps batch items
 * r, r+N, r+2N, ... (tn_dist_shard), so the ranks see disjoint data and the cursor (a checkpoint's
 * data position) is the same on every rank. What is exchanged is always one vector of
 * n_params + 1 floats (the last slot carries the step's loss, so rank 0 logs the mean over ranks):
 *
 *   dp      every step, the gradients: MPI_Allreduce (sum, then / N) before clipping and the
 *           optimizer step, so 2 ranks x batch B == 1 process x batch 2B up to summation order.
 *   diloco  H inner optimizer steps on the local shard; then the parameter change since the last
 *           outer step (the outer gradient, anchor - params) is all-reduced and averaged and an
 *           outer Nesterov SGD step is applied to the anchor:
 *               v = mu v + d;  anchor -= lr_out (d + mu v);  params = anchor.
 *           With H = 1, lr_out = 1, mu = 0 and an inner optimizer linear in the gradient (SGD),
 *           this equals dp.
 *   noloco  no collectives: at every outer step rank r exchanges its parameters with ONE peer
 *           (MPI_Sendrecv), paired by a random permutation of the ranks drawn from (seed, outer
 *           step) — the same on every rank; with an odd N one rank sits out. The outer gradient
 *           is d = anchor - (params + params_peer) / 2, then the same Nesterov step. On 2 ranks
 *           (the peer is always the other rank) it equals diloco.
 *
 * --compress int8 (dp, diloco): the vector is sent as int8 in blocks of TN_DIST_QBLOCK values
 * with one f32 scale per block (max |x| / 127) and stochastic rounding (floor(x/scale + u), u
 * uniform from (seed, exchange, rank): unbiased and reproducible), plus the loss as f32; the ranks
 * MPI_Allgather these and every rank averages the dequantized vectors in rank order, so all ranks
 * apply the same update. Bytes per exchange: 4*ceil(n/TN_DIST_QBLOCK) + n + 4 instead of 4(n + 1).
 * noloco exchanges parameters, which int8 would blur: it refuses --compress.
 *
 * dp buckets (--bucket-mb, default 25 MiB): the backward finishes the flat gradient buffer from
 * its end (head, last layer) towards its start (first layer, embedding); once a bucket's range
 * [n - (k+1) b, n - k b) is final (tn_tmodel's grads_ready hook), its MPI_Iallreduce starts, and
 * tn_dist_grads waits for all. Buckets only split the vector: every element is summed over the
 * same ranks by the same reduction as one MPI_Allreduce (on 2 ranks a + b either way).
 *
 * ZeRO-1 (--zero 1, dp): rank r owns parameters [n r / N, n (r+1) / N) of the flat buffer and only
 * that slice of the AdamW moments (the rest of the moment buffers is given back to the OS with
 * madvise). Each step: MPI_Reduce_scatter of the gradients, one MPI_Allreduce of {loss, the
 * slice's squared gradient norm}, AdamW on the slice, MPI_Allgatherv of the parameters.
 * Checkpoints gather the moments to rank 0 (MPI_Gatherv) and hold the whole state, so --resume
 * works with any rank count.
 *
 * Masked data (token_weighted): the trainer's loss is each rank's mean over its own trained
 * targets; with c_r of them on rank r and C = sum c_r (one MPI_Allreduce of a double), rank r
 * scales its gradients and loss by w_r = c_r N / C before the exchange, so the mean over ranks
 * is the mean over all C targets — what one process with the whole batch computes. When every
 * rank has the same count w_r = 1 and nothing is scaled.
 *
 * Bytes communicated are counted in one wrapper per MPI call as what this rank passes to it
 * (count x datatype size of its send buffer; a root gathering in place passes nothing). Without MPI at build time (TERN_HAVE_MPI undefined) tn_dist_open fails
 * with a clear UNSUPPORTED error. Nothing here prints.
 *
 * --sim-link RATE[,LATENCY] (a simulated slow link, on one machine): every exchange (each MPI
 * wrapper call; for dp's buckets, the wait for them) then lasts at least
 *     latency + 8 * bytes / rate
 * seconds of wall time, bytes being what the wrapper counts for this rank (above), so the delay
 * and the "bytes communicated" line agree: after the MPI call returns the rank sleeps the rest.
 * The link carries one exchange at a time: an exchange started while an earlier one still holds
 * it (dp's buckets, started during the backward) begins when that one ends (tn_link_finish).
 * Only wall time changes: what is exchanged and computed is the same as without the flag.
 */
#ifndef TN_TRAIN_DIST_H
#define TN_TRAIN_DIST_H

#include "train/ckpt.h"
#include "train/train.h"

typedef enum tn_dist_method { TN_DIST_NONE = 0, TN_DIST_DP, TN_DIST_DILOCO, TN_DIST_NOLOCO } tn_dist_method;
typedef enum tn_optim { TN_OPTIM_ADAMW = 0, TN_OPTIM_SGD } tn_optim;
typedef enum tn_dist_compress { TN_COMPRESS_NONE = 0, TN_COMPRESS_INT8 } tn_dist_compress;

/* A simulated link (--sim-link): bits_per_s 0 = off. */
typedef struct tn_link {
    double bits_per_s;      /* the rate, bits per second                                  */
    double latency_s;       /* added to every exchange                                    */
} tn_link;

typedef struct tn_dist_opts {
    tn_dist_method method;
    int outer_every;        /* H (diloco, noloco); default 100                            */
    float outer_lr;         /* default 0.7                                                */
    float outer_momentum;   /* Nesterov momentum, default 0.9                             */
    tn_dist_compress compress; /* int8: dp and diloco exchange int8 + per-block scales    */
    double bucket_mb;       /* dp: all-reduce buckets of this many MiB, started during the
                             * backward; 0: one all-reduce after it. Default 25          */
    int zero;               /* dp: 1 = ZeRO-1 (AdamW moments sharded over the ranks)      */
    bool token_weighted;    /* dp: weight each rank's mean loss (and gradients) by its share
                             * of the trained targets (masked data: chats); one 8-byte
                             * all-reduce more per step. The trainer sets it for finetune  */
    bool zo;                /* --zo (zo.h): only tn_dist_allgather / tn_dist_allreduce_mean
                             * are used; tn_dist_begin allocates no exchange buffers       */
    tn_link link;           /* --sim-link; bits_per_s 0: the real transport only          */
} tn_dist_opts;

#define TN_DIST_QBLOCK 256

typedef struct tn_dist tn_dist;

void tn_dist_opts_default(tn_dist_opts *o);
/* "dp" | "diloco" | "noloco" → method; false if unknown. */
bool tn_dist_parse(const char *name, tn_dist_method *out);
const char *tn_dist_name(tn_dist_method m);

/* Initializes MPI (once per process) and the communicator state. */
tern_status tn_dist_open(const tn_dist_opts *o, uint64_t seed, tn_dist **out);
/* Allocates the exchange buffers for m and records the starting parameters as the anchor (call
 * after the weights are initialized or loaded). dp with buckets installs m's backward hook;
 * ZeRO-1 gives back the memory of the moments other ranks own. */
tern_status tn_dist_begin(tn_dist *d, tn_tmodel *m);
/* What the plan adds for d (buckets, ZeRO-1's moments on this rank), into buf; "" for NULL. */
void tn_dist_describe(const tn_dist *d, char *buf, size_t cap);
/* Whether d runs ZeRO-1 (the optimizer step is tn_dist_zero_step, not tn_adamw_step). */
bool tn_dist_zero(const tn_dist *d);
/* ZeRO-1, after tn_dist_grads: *gnorm = the global gradient norm; AdamW (step t, 1-based) on this
 * rank's slice of the parameters with the trainer's clipping; then every rank gets all of them. */
tern_status tn_dist_zero_step(tn_dist *d, tn_tmodel *m, const tn_adamw *o, float lr, int64_t t, double *gnorm);
/* Writes the checkpoint (ckpt.h) from rank 0; under ZeRO-1 every rank calls it (the moments are
 * gathered to rank 0 first). d NULL: writes it. */
tern_status tn_dist_ckpt_save(tn_dist *d, tn_tmodel *m, const tn_train_state *st, const char *dir);
/* NULL-safe: rank 0 / size 1 without distribution. */
int tn_dist_rank(const tn_dist *d);
int tn_dist_size(const tn_dist *d);
/* Keeps this rank's rows (r, r+N, ...) of a global batch of B*N rows of T tokens, in place. */
void tn_dist_shard(const tn_dist *d, int B, int T, int32_t *tok, int32_t *tgt);
/* dp: all-reduces grads and *loss (mean over ranks): waits for the buckets the backward started
 * (the sum per element is the one a single all-reduce makes), or all-reduces them all now; under
 * ZeRO-1 reduce-scatters them (this rank's slice is the mean; the rest is stale). No-op for the
 * others. */
tern_status tn_dist_grads(tn_dist *d, tn_tmodel *m, double *loss);
/* After the inner optimizer step `step` (1-based): diloco/noloco run the outer step when step is
 * a multiple of H or `last`; *synced tells whether it ran, and then *loss becomes the mean over
 * the ranks that exchanged. No-op for dp. */
tern_status tn_dist_outer(tn_dist *d, tn_tmodel *m, int64_t step, bool last, double *loss, bool *synced);
/* Averages x[0..n) over the ranks (MPI_Allreduce sum / N, counted); no-op for d NULL. */
tern_status tn_dist_allreduce_mean(tn_dist *d, float *x, int n);
/* Every rank's `bytes` bytes of msg into all[size][bytes] in rank order (MPI_Allgather, counted);
 * d NULL: all = msg. */
tern_status tn_dist_allgather(tn_dist *d, const void *msg, int bytes, void *all);
/* Whether every rank holds the same hash (one MPI_Allgather of 8 bytes, not counted: a check at
 * the end of a run); true for d NULL. */
tern_status tn_dist_same(tn_dist *d, uint64_t hash, bool *same);
/* Bytes this rank passed to MPI calls so far. */
uint64_t tn_dist_bytes(const tn_dist *d);
/* Seconds this rank slept so far for the simulated link (--sim-link); 0 without it or d NULL. */
double tn_dist_link_wait(const tn_dist *d);

/* --sim-link's value "RATE[,LATENCY]": RATE a positive number with kbit, mbit or gbit (per
 * second, decimal: 1gbit = 1e9 bits/s), LATENCY a number >= 0 with us or ms (default 0); units
 * are case-insensitive. False (out untouched) for anything else. */
bool tn_link_parse(const char *s, tn_link *out);
/* The least wall time of one exchange of `bytes` (this rank's): latency + 8 bytes / rate
 * seconds; 0 when the link is off. */
double tn_link_delay(const tn_link *l, uint64_t bytes);
/* When an exchange of `bytes` started at time `start` (seconds) ends on a link that is busy until
 * *busy: max(start, *busy) + tn_link_delay; *busy becomes that time. */
double tn_link_finish(const tn_link *l, double *busy, double start, uint64_t bytes);
/* "1 Gbit/s + 2 ms per exchange" style, into buf. */
void tn_link_describe(const tn_link *l, char *buf, size_t cap);
/* Frees d; with ok, finalizes MPI. After a failure MPI is left up for tn_dist_abort. */
void tn_dist_close(tn_dist *d, bool ok);
/* When MPI runs with more than one rank and was not finalized: MPI_Abort(code), so a rank that
 * failed stops the whole job instead of leaving the others waiting. No-op otherwise. */
void tn_dist_abort(int code);

/* Plain SGD with the trainer's decoupled weight decay: p -= lr*wd*p (matrices), p -= lr*clip*g. */
/* Quantizes x[0..n) to q (int8) and scales[ceil(n/TN_DIST_QBLOCK)] with stochastic rounding
 * drawn from *rng; and back. Exposed for tests. */
void tn_dist_q8(const float *x, size_t n, uint64_t *rng, int8_t *q, float *scales);
void tn_dist_dq8_add(const int8_t *q, const float *scales, size_t n, float *acc);

void tn_sgd_step(tn_tmodel *m, const tn_adamw *o, float lr, float clip_scale);

#endif
