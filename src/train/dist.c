/*
 * dist.c — distributed training on MPI. See dist.h.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "train/dist.h"
#include "train/rng.h"

#ifdef TERN_HAVE_MPI
#include <mpi.h>
#endif

struct tn_dist {
    tn_dist_opts o;
    uint64_t seed;
    int rank, size;
    size_t n;            /* n_params                                                   */
    float *anchor, *mom; /* [n] diloco/noloco: parameters at the last outer step, momentum */
    float *buf, *rbuf;   /* [n + 1] what is exchanged (+ the loss), what a peer sent   */
    uint8_t *cbuf, *gbuf;/* --compress int8: this rank's message, all ranks' (allgather) */
    size_t csize;        /* bytes of one compressed message                             */
    int64_t n_exch;      /* exchanges done (stochastic rounding stream)                 */
    int64_t n_outer;     /* outer steps done                                            */
    uint64_t bytes;      /* passed to MPI calls                                         */
    double link_busy;    /* --sim-link: when the simulated link is free (tn_time_s)        */
    double link_wait;    /* --sim-link: seconds slept for it                                */
    /* dp buckets */
    size_t bucket;       /* floats per bucket; 0: one all-reduce after the backward        */
    size_t *final_from;  /* [n_layer]: grads [final_from[l], n) are final after layer l     */
    size_t sent_lo;      /* grads [sent_lo, n) are in flight this step                    */
    float *grads;        /* the model's                                                    */
    const tn_tmodel *model;
    int n_req, req_rc;   /* buckets started this step; the first failed start's code      */
    tern_status hook_s;  /* a failure in the backward hook, reported by tn_dist_grads      */
    bool weighed;        /* token_weighted: w is this step's                               */
    float w;             /* token_weighted: this rank's weight c_r N / C (else 1)           */
#ifdef TERN_HAVE_MPI
    MPI_Request *req;    /* [ceil(n / bucket)]                                             */
#endif
    /* ZeRO-1 */
    size_t lo, hi;       /* this rank's slice of the flat buffer                           */
    int *counts, *displs;/* [size] every rank's slice (floats)                              */
    double gnorm;        /* the step's global gradient norm                                */
};

void tn_dist_opts_default(tn_dist_opts *o) {
    *o = (tn_dist_opts){.method = TN_DIST_NONE, .outer_every = 100, .outer_lr = 0.7f, .outer_momentum = 0.9f,
                        .bucket_mb = 25.0};
}

static const char *const NAMES[] = {"none", "dp", "diloco", "noloco"};

bool tn_dist_parse(const char *name, tn_dist_method *out) {
    for (int i = 1; i < 4; i++)
        if (!strcmp(name, NAMES[i])) { *out = (tn_dist_method)i; return true; }
    return false;
}

const char *tn_dist_name(tn_dist_method m) { return (unsigned)m < 4 ? NAMES[m] : "?"; }
int tn_dist_rank(const tn_dist *d) { return d ? d->rank : 0; }
int tn_dist_size(const tn_dist *d) { return d ? d->size : 1; }
uint64_t tn_dist_bytes(const tn_dist *d) { return d ? d->bytes : 0; }
double tn_dist_link_wait(const tn_dist *d) { return d ? d->link_wait : 0.0; }

/* ---- the simulated link (--sim-link) ------------------------------------------------------- */

/* a number then a unit from units[] (case-insensitive), scaled by its factor; *end past it */
static bool parse_qty(const char *s, const char *const *units, const double *factor, int n_units, double *out,
                      const char **end) {
    if (!isdigit((unsigned char)*s) && *s != '.') return false; /* no sign, no "inf" / "nan" */
    char *e;
    errno = 0;
    const double v = strtod(s, &e);
    if (e == s || errno || !isfinite(v)) return false;
    for (int i = 0; i < n_units; i++) {
        const size_t k = strlen(units[i]);
        if (!strncasecmp(e, units[i], k) && (e[k] == 0 || e[k] == ',')) {
            *out = v * factor[i];
            *end = e + k;
            return true;
        }
    }
    return false;
}

bool tn_link_parse(const char *s, tn_link *out) {
    static const char *const RU[] = {"kbit", "mbit", "gbit"}, *const LU[] = {"us", "ms"};
    static const double RF[] = {1e3, 1e6, 1e9}, LF[] = {1e-6, 1e-3};
    tn_link l = {0};
    const char *e;
    if (!s || !parse_qty(s, RU, RF, 3, &l.bits_per_s, &e) || !(l.bits_per_s > 0)) return false;
    if (*e == ',' && (!parse_qty(e + 1, LU, LF, 2, &l.latency_s, &e) || *e)) return false;
    if (*e) return false;
    *out = l;
    return true;
}

double tn_link_delay(const tn_link *l, uint64_t bytes) {
    if (!(l->bits_per_s > 0)) return 0.0;
    return l->latency_s + 8.0 * (double)bytes / l->bits_per_s;
}

double tn_link_finish(const tn_link *l, double *busy, double start, uint64_t bytes) {
    const double end = (start > *busy ? start : *busy) + tn_link_delay(l, bytes);
    *busy = end;
    return end;
}

void tn_link_describe(const tn_link *l, char *buf, size_t cap) {
    static const char *const U[] = {"bit/s", "kbit/s", "Mbit/s", "Gbit/s"};
    double r = l->bits_per_s;
    int u = 0;
    while (r >= 1000.0 && u < 3) { r /= 1000.0; u++; }
    if (l->latency_s >= 1e-3) snprintf(buf, cap, "%g %s + %g ms per exchange", r, U[u], l->latency_s * 1e3);
    else if (l->latency_s > 0) snprintf(buf, cap, "%g %s + %g us per exchange", r, U[u], l->latency_s * 1e6);
    else snprintf(buf, cap, "%g %s, no latency", r, U[u]);
}

bool tn_dist_zero(const tn_dist *d) { return d && d->o.zero; }

void tn_dist_shard(const tn_dist *d, int B, int T, int32_t *tok, int32_t *tgt) {
    if (!d || d->size == 1) return;
    for (int b = 0; b < B; b++) {
        size_t from = ((size_t)b * (size_t)d->size + (size_t)d->rank) * (size_t)T, to = (size_t)b * (size_t)T;
        memmove(tok + to, tok + from, (size_t)T * sizeof *tok);
        memmove(tgt + to, tgt + from, (size_t)T * sizeof *tgt);
    }
}

void tn_sgd_step(tn_tmodel *m, const tn_adamw *o, float lr, float clip_scale) {
    for (int ti = 0; ti < m->n_tensors; ti++) {
        const tn_tparam *t = &m->t[ti];
        const float wd = t->decay ? o->weight_decay : 0.0f;
        float *p = m->params + t->off;
        const float *g = m->grads + t->off;
        for (size_t i = 0; i < t->n; i++) {
            p[i] -= lr * wd * p[i];
            p[i] -= lr * (g[i] * clip_scale);
        }
    }
}

void tn_dist_q8(const float *x, size_t n, uint64_t *rng, int8_t *q, float *scales) {
    for (size_t b0 = 0, bi = 0; b0 < n; b0 += TN_DIST_QBLOCK, bi++) {
        const size_t b1 = TN_MIN(n, b0 + TN_DIST_QBLOCK);
        float amax = 0.0f;
        for (size_t i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float sc = amax / 127.0f, inv = sc > 0.0f ? 1.0f / sc : 0.0f;
        scales[bi] = sc;
        for (size_t i = b0; i < b1; i++) {
            float v = floorf(x[i] * inv + (float)(tn_rng_next(rng) >> 40) * 0x1.0p-24f);
            q[i] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
        }
    }
}

void tn_dist_dq8_add(const int8_t *q, const float *scales, size_t n, float *acc) {
    for (size_t i = 0; i < n; i++) acc[i] += (float)q[i] * scales[i / TN_DIST_QBLOCK];
}

/* The outer Nesterov step on the averaged outer gradient in d->buf[0..n). */
static void outer_apply(tn_dist *d, tn_tmodel *m) {
    const float mu = d->o.outer_momentum, lr = d->o.outer_lr;
    for (size_t i = 0; i < d->n; i++) {
        const float g = d->buf[i];
        d->mom[i] = mu * d->mom[i] + g;
        d->anchor[i] -= lr * (g + mu * d->mom[i]);
    }
    memcpy(m->params, d->anchor, d->n * sizeof(float));
    d->n_outer++;
}

/* This rank's peer at outer step k (-1: sits out): a permutation of the ranks drawn from
 * (seed, k), the same on every rank, paired as (perm[0], perm[1]), (perm[2], perm[3]), ... */
static int noloco_peer(const tn_dist *d, int64_t k, int *perm) {
    uint64_t s = d->seed ^ (UINT64_C(0xD1B54A32D192ED03) * (uint64_t)(k + 1));
    for (int i = 0; i < d->size; i++) perm[i] = i;
    for (int i = d->size - 1; i > 0; i--) {
        int j = (int)tn_rng_below(&s, (uint64_t)i + 1);
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < d->size; i++)
        if (perm[i] == d->rank) {
            int j = i ^ 1;
            return j < d->size ? perm[j] : -1;
        }
    return -1;
}

#ifdef TERN_HAVE_MPI

static tern_status mpi_err(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    return tn_err(TERN_ERR_IO, "train: --dist: %s failed: %s (a rank died or the network failed)", what, msg);
}

/* Sleeps until time `end` (tn_time_s), counting the sleep as the link's. */
static void link_sleep_until(tn_dist *d, double end) {
    const double t = tn_time_s();
    if (end <= t) return;
    const double rest = end - t;
    struct timespec ts = {.tv_sec = (time_t)rest, .tv_nsec = (long)((rest - floor(rest)) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR) {}
    d->link_wait += tn_time_s() - t;
}

/* After a blocking exchange of `bytes` that started at `start`: the rest of its simulated time. */
static void link_after(tn_dist *d, double start, uint64_t bytes) {
    if (d->o.link.bits_per_s > 0) link_sleep_until(d, tn_link_finish(&d->o.link, &d->link_busy, start, bytes));
}

/* The MPI calls, each counting what this rank passes to it (dist.h). */
static uint64_t type_bytes(MPI_Datatype t) {
    int n = 0;
    MPI_Type_size(t, &n);
    return (uint64_t)n;
}

static tern_status c_allreduce(tn_dist *d, void *buf, int cnt, MPI_Datatype t) {
    const uint64_t b = (uint64_t)cnt * type_bytes(t);
    const double t0 = tn_time_s();
    d->bytes += b;
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, cnt, t, MPI_SUM, MPI_COMM_WORLD);
    link_after(d, t0, b);
    return rc == MPI_SUCCESS ? TERN_OK : mpi_err(rc, "MPI_Allreduce");
}

/* non-blocking: the simulated link's time is slept in buckets_wait (link_busy) */
static int c_iallreduce(tn_dist *d, float *buf, int cnt, MPI_Request *req) {
    d->bytes += (uint64_t)cnt * sizeof(float);
    if (d->o.link.bits_per_s > 0) tn_link_finish(&d->o.link, &d->link_busy, tn_time_s(), (uint64_t)cnt * sizeof(float));
    return MPI_Iallreduce(MPI_IN_PLACE, buf, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, req);
}

static tern_status c_allgather(tn_dist *d, const void *msg, int bytes, void *all) {
    const double t0 = tn_time_s();
    d->bytes += (uint64_t)bytes;
    int rc = MPI_Allgather(msg, bytes, MPI_BYTE, all, bytes, MPI_BYTE, MPI_COMM_WORLD);
    link_after(d, t0, (uint64_t)bytes);
    return rc == MPI_SUCCESS ? TERN_OK : mpi_err(rc, "MPI_Allgather");
}

static tern_status c_sendrecv(tn_dist *d, const float *x, float *y, int cnt, int peer) {
    const double t0 = tn_time_s();
    d->bytes += (uint64_t)cnt * sizeof(float);
    int rc = MPI_Sendrecv(x, cnt, MPI_FLOAT, peer, 7, y, cnt, MPI_FLOAT, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    link_after(d, t0, (uint64_t)cnt * sizeof(float));
    return rc == MPI_SUCCESS ? TERN_OK : mpi_err(rc, "MPI_Sendrecv");
}

/* ZeRO-1: grads (all n) summed into this rank's slice y[counts[rank]] */
static tern_status c_reduce_scatter(tn_dist *d, const float *x, float *y) {
    const double t0 = tn_time_s();
    d->bytes += (uint64_t)d->n * sizeof(float);
    int rc = MPI_Reduce_scatter(x, y, d->counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    link_after(d, t0, (uint64_t)d->n * sizeof(float));
    return rc == MPI_SUCCESS ? TERN_OK : mpi_err(rc, "MPI_Reduce_scatter");
}

/* ZeRO-1: every rank's slice of x (in place) to every rank */
static tern_status c_allgatherv(tn_dist *d, float *x) {
    const double t0 = tn_time_s();
    d->bytes += (uint64_t)d->counts[d->rank] * sizeof(float);
    int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, d->counts, d->displs, MPI_FLOAT, MPI_COMM_WORLD);
    link_after(d, t0, (uint64_t)d->counts[d->rank] * sizeof(float));
    return rc == MPI_SUCCESS ? TERN_OK : mpi_err(rc, "MPI_Allgatherv");
}

/* ZeRO-1: every rank's slice of x (in place) to rank 0 */
static tern_status c_gatherv(tn_dist *d, float *x) {
    const uint64_t b = d->rank ? (uint64_t)d->counts[d->rank] * sizeof(float) : 0;
    const double t0 = tn_time_s();
    int rc;
    d->bytes += b;
    if (d->rank) rc = MPI_Gatherv(x + d->lo, d->counts[d->rank], MPI_FLOAT, NULL, NULL, NULL, MPI_FLOAT, 0, MPI_COMM_WORLD);
    else rc = MPI_Gatherv(MPI_IN_PLACE, 0, MPI_FLOAT, x, d->counts, d->displs, MPI_FLOAT, 0, MPI_COMM_WORLD);
    link_after(d, t0, b);
    return rc == MPI_SUCCESS ? TERN_OK : mpi_err(rc, "MPI_Gatherv");
}

tern_status tn_dist_open(const tn_dist_opts *o, uint64_t seed, tn_dist **out) {
    *out = NULL;
    if (o->method == TN_DIST_NONE) return TERN_OK;
    if (o->zero && o->method != TN_DIST_DP) return tn_err(TERN_ERR_INVALID_ARG, "train: --zero 1 applies to --dist dp");
    if (o->zero && o->compress)
        return tn_err(TERN_ERR_INVALID_ARG, "train: --zero 1 reduce-scatters f32 gradients; it does not combine with --compress int8");
    if (!(o->bucket_mb >= 0.0) || o->bucket_mb > 65536.0)
        return tn_err(TERN_ERR_INVALID_ARG, "train: --bucket-mb %g is not in [0, 65536]", o->bucket_mb);
    if (o->outer_every < 1) return tn_err(TERN_ERR_INVALID_ARG, "train: --outer-every must be at least 1");
    if (o->compress && o->method == TN_DIST_NOLOCO)
        return tn_err(TERN_ERR_INVALID_ARG, "train: --compress int8 applies to --dist dp and diloco (noloco exchanges "
                      "parameters, not changes)");
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
        int rc = MPI_Init(NULL, NULL);
        if (rc != MPI_SUCCESS) return tn_err(TERN_ERR_IO, "train: --dist: MPI_Init failed (%d)", rc);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    tn_dist *d = tn_calloc(1, sizeof *d);
    if (!d) return tn_err(TERN_ERR_NOMEM, "train: --dist state");
    d->o = *o;
    d->seed = seed;
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    *out = d;
    return TERN_OK;
}

/* --compress int8: buf[0..n] → message [scales][int8][loss f32] */
static void pack_q8(tn_dist *d) {
    const size_t nb = (d->n + TN_DIST_QBLOCK - 1) / TN_DIST_QBLOCK;
    uint64_t rng = d->seed ^ (UINT64_C(0x9E3779B97F4A7C15) * (uint64_t)(d->n_exch + 1)) ^ ((uint64_t)d->rank << 48);
    float *scales = (float *)(void *)d->cbuf;
    tn_dist_q8(d->buf, d->n, &rng, (int8_t *)(d->cbuf + nb * sizeof(float)), scales);
    memcpy(d->cbuf + nb * sizeof(float) + d->n, &d->buf[d->n], sizeof(float));
}

static tern_status allgather_q8(tn_dist *d) {
    const size_t nb = (d->n + TN_DIST_QBLOCK - 1) / TN_DIST_QBLOCK;
    pack_q8(d);
    tern_status s = c_allgather(d, d->cbuf, (int)d->csize, d->gbuf);
    d->n_exch++;
    if (s) return s;
    memset(d->buf, 0, (d->n + 1) * sizeof(float));
    for (int r = 0; r < d->size; r++) { /* rank order: the same sum on every rank */
        const uint8_t *msg = d->gbuf + (size_t)r * d->csize;
        float loss;
        tn_dist_dq8_add((const int8_t *)(msg + nb * sizeof(float)), (const float *)(const void *)msg, d->n, d->buf);
        memcpy(&loss, msg + nb * sizeof(float) + d->n, sizeof(float));
        d->buf[d->n] += loss;
    }
    for (size_t i = 0; i <= d->n; i++) d->buf[i] /= (float)d->size;
    return TERN_OK;
}

static tern_status allreduce_buf(tn_dist *d) {
    if (d->o.compress == TN_COMPRESS_INT8) return allgather_q8(d);
    const int cnt = (int)(d->n + 1);
    tern_status s = c_allreduce(d, d->buf, cnt, MPI_FLOAT);
    if (s) return s;
    const float inv = (float)d->size;
    for (int i = 0; i < cnt; i++) d->buf[i] /= inv;
    return TERN_OK;
}

static tern_status sendrecv_buf(tn_dist *d, int peer) {
    return c_sendrecv(d, d->buf, d->rbuf, (int)(d->n + 1), peer);
}

tern_status tn_dist_allreduce_mean(tn_dist *d, float *x, int n) {
    if (!d) return TERN_OK;
    tern_status s = c_allreduce(d, x, n, MPI_FLOAT);
    if (s) return s;
    for (int i = 0; i < n; i++) x[i] /= (float)d->size;
    return TERN_OK;
}

tern_status tn_dist_same(tn_dist *d, uint64_t hash, bool *same) {
    *same = true;
    if (!d) return TERN_OK;
    uint64_t stack[64];
    uint64_t *all = d->size <= 64 ? stack : tn_malloc((size_t)d->size * sizeof *all);
    if (!all) return tn_err(TERN_ERR_NOMEM, "train: --dist weights check");
    int rc = MPI_Allgather(&hash, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    for (int r = 0; rc == MPI_SUCCESS && r < d->size; r++) *same = *same && all[r] == hash;
    if (all != stack) tn_free(all);
    return rc == MPI_SUCCESS ? TERN_OK : mpi_err(rc, "MPI_Allgather");
}

/* token_weighted: d->w for this step from the trained targets of m's batch (dist.h) */
static tern_status weigh(tn_dist *d, const tn_tmodel *m) {
    d->w = 1.0f;
    d->weighed = true;
    if (!d->o.token_weighted) return TERN_OK;
    const size_t nt = (size_t)m->B * (size_t)m->T;
    double c = 0.0;
    for (size_t i = 0; i < nt; i++) c += m->targets[i] != -1;
    const double mine = c;
    tern_status s = c_allreduce(d, &c, 1, MPI_DOUBLE);
    if (s) return s;
    if (c > 0 && mine * d->size != c) d->w = (float)(mine * d->size / c);
    return TERN_OK;
}

static void scale(float *x, size_t n, float w) {
    if (w != 1.0f)
        for (size_t i = 0; i < n; i++) x[i] *= w;
}

/* ---- dp buckets ----------------------------------------------------------------------------- */

/* tn_tmodel's grads_ready hook: starts the buckets whose range is final (all of them at l = -1)
 * and lets MPI progress the ones in flight. */
static void on_grads_ready(void *user, int l) {
    tn_dist *d = user;
    if (!d->weighed && !d->hook_s) d->hook_s = weigh(d, d->model);
    const size_t avail = l < 0 ? 0 : d->final_from[l];
    while (d->sent_lo > avail && (l < 0 || d->sent_lo - avail >= d->bucket)) {
        const size_t lo = d->sent_lo > d->bucket ? d->sent_lo - d->bucket : 0;
        scale(d->grads + lo, d->sent_lo - lo, d->w);
        int rc = c_iallreduce(d, d->grads + lo, (int)(d->sent_lo - lo), &d->req[d->n_req]);
        if (rc != MPI_SUCCESS) {
            if (!d->req_rc) d->req_rc = rc;
            d->req[d->n_req] = MPI_REQUEST_NULL;
        }
        d->n_req++;
        d->sent_lo = lo;
    }
    int done = 0;
    if (d->n_req && !d->req_rc) MPI_Testall(d->n_req, d->req, &done, MPI_STATUSES_IGNORE);
}

static tern_status buckets_wait(tn_dist *d, double *loss) {
    if (d->sent_lo) on_grads_ready(d, -1); /* the backward did not report the end */
    int rc = MPI_Waitall(d->n_req, d->req, MPI_STATUSES_IGNORE);
    if (d->o.link.bits_per_s > 0) link_sleep_until(d, d->link_busy); /* the buckets' simulated time */
    if (d->req_rc) rc = d->req_rc;
    const tern_status hs = d->hook_s;
    d->n_req = 0;
    d->req_rc = 0;
    d->hook_s = TERN_OK;
    d->weighed = false;
    d->sent_lo = d->n;
    if (hs) return hs;
    if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Iallreduce");
    const float inv = (float)d->size;
    for (size_t i = 0; i < d->n; i++) d->grads[i] /= inv;
    float l = (float)(*loss * d->w);
    tern_status s = c_allreduce(d, &l, 1, MPI_FLOAT);
    if (s) return s;
    *loss = l / inv;
    return TERN_OK;
}

/* ---- ZeRO-1 ---------------------------------------------------------------------------------- */

static tern_status zero_grads(tn_dist *d, tn_tmodel *m, double *loss) {
    const size_t k = d->hi - d->lo;
    tern_status s = weigh(d, m);
    if (s) return s;
    d->weighed = false;
    scale(m->grads, d->n, d->w);
    if ((s = c_reduce_scatter(d, m->grads, d->buf))) return s;
    if (s) return s;
    double sq = 0.0, x[2];
    float *g = m->grads + d->lo;
    for (size_t i = 0; i < k; i++) g[i] = d->buf[i] / (float)d->size;
    for (int ti = 0; ti < m->n_tensors; ti++) { /* as tn_grad_norm: the trained tensors */
        const tn_tparam *t = &m->t[ti];
        const size_t a = TN_MAX(t->off, d->lo), b = TN_MIN(t->off + t->n, d->hi);
        for (size_t i = a; !t->frozen && i < b; i++) sq += (double)m->grads[i] * (double)m->grads[i];
    }
    x[0] = *loss * d->w;
    x[1] = sq;
    if ((s = c_allreduce(d, x, 2, MPI_DOUBLE))) return s;
    *loss = x[0] / d->size;
    d->gnorm = sqrt(x[1]);
    return TERN_OK;
}

tern_status tn_dist_zero_step(tn_dist *d, tn_tmodel *m, const tn_adamw *o, float lr, int64_t t, double *gnorm) {
    const double gn = *gnorm = d->gnorm;
    /* run.c's clipping, then tn_adamw_step's update on [lo, hi) */
    const float clip = o->grad_clip > 0 && gn > o->grad_clip ? (float)(o->grad_clip / (gn + 1e-6)) : 1.0f;
    const float bc1 = (float)(1.0 - pow(o->beta1, (double)t)), bc2 = (float)(1.0 - pow(o->beta2, (double)t));
    for (int ti = 0; ti < m->n_tensors; ti++) {
        const tn_tparam *tp = &m->t[ti];
        if (tp->frozen) continue;
        const size_t a = TN_MAX(tp->off, d->lo), b = TN_MIN(tp->off + tp->n, d->hi);
        const float wd = tp->decay ? o->weight_decay : 0.0f;
        float *p = m->params, *g = m->grads, *mm = m->m, *vv = m->v;
        for (size_t i = a; i < b; i++) {
            const float gi = g[i] * clip;
            mm[i] = o->beta1 * mm[i] + (1.0f - o->beta1) * gi;
            vv[i] = o->beta2 * vv[i] + (1.0f - o->beta2) * gi * gi;
            const float mh = mm[i] / bc1, vh = vv[i] / bc2;
            p[i] -= lr * wd * p[i];
            p[i] -= lr * (mh / (sqrtf(vh) + o->eps));
        }
    }
    return c_allgatherv(d, m->params);
}

/* Gives the pages of x[0..n) outside [lo, hi) back to the OS (they read as zeros after). */
static void zero_release(const tn_dist *d, float *x) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t r[2][2] = {{(uintptr_t)x, (uintptr_t)(x + d->lo)}, {(uintptr_t)(x + d->hi), (uintptr_t)(x + d->n)}};
    for (int i = 0; i < 2; i++) {
        const uintptr_t a = (r[i][0] + pg - 1) / pg * pg, b = r[i][1] / pg * pg;
        if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
    }
}

tern_status tn_dist_ckpt_save(tn_dist *d, tn_tmodel *m, const tn_train_state *st, const char *dir) {
    if (!d || !d->o.zero) return tn_dist_rank(d) ? TERN_OK : tn_ckpt_save(m, st, dir);
    tern_status s;
    if ((s = c_gatherv(d, m->m)) || (s = c_gatherv(d, m->v))) return s;
    if (d->rank) return TERN_OK;
    s = tn_ckpt_save(m, st, dir);
    zero_release(d, m->m);
    zero_release(d, m->v);
    return s;
}

void tn_dist_close(tn_dist *d, bool ok) {
    if (!d) return;
    tn_free(d->req);
    tn_free(d->anchor);
    tn_free(d->mom);
    tn_free(d->buf);
    tn_free(d->rbuf);
    tn_free(d->cbuf);
    tn_free(d->gbuf);
    tn_free(d->final_from);
    tn_free(d->counts);
    tn_free(d->displs);
    tn_free(d);
    int fin = 0;
    MPI_Finalized(&fin);
    if (ok && !fin) MPI_Finalize();
}

void tn_dist_abort(int code) {
    int init = 0, fin = 0, size = 1;
    MPI_Initialized(&init);
    if (!init) return;
    MPI_Finalized(&fin);
    if (fin) return;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
    MPI_Finalize();
}

#else /* no MPI */

tern_status tn_dist_open(const tn_dist_opts *o, uint64_t seed, tn_dist **out) {
    (void)seed;
    *out = NULL;
    if (o->method == TN_DIST_NONE) return TERN_OK;
    return tn_err(TERN_ERR_UNSUPPORTED, "train: --dist %s: this tern was built without MPI (install Open MPI, e.g. "
                  "libopenmpi-dev, and rebuild); it trains single-process only", tn_dist_name(o->method));
}
static tern_status allreduce_buf(tn_dist *d) { (void)d; return tn_err(TERN_ERR_UNSUPPORTED, "train: no MPI"); }
static tern_status sendrecv_buf(tn_dist *d, int peer) { (void)d; (void)peer; return tn_err(TERN_ERR_UNSUPPORTED, "train: no MPI"); }
tern_status tn_dist_allreduce_mean(tn_dist *d, float *x, int n) {
    (void)x; (void)n;
    return d ? tn_err(TERN_ERR_UNSUPPORTED, "train: no MPI") : TERN_OK;
}
static tern_status c_allgather(tn_dist *d, const void *msg, int bytes, void *all) {
    (void)d; (void)msg; (void)bytes; (void)all;
    return tn_err(TERN_ERR_UNSUPPORTED, "train: no MPI");
}
tern_status tn_dist_same(tn_dist *d, uint64_t hash, bool *same) {
    (void)hash;
    *same = true;
    return d ? tn_err(TERN_ERR_UNSUPPORTED, "train: no MPI") : TERN_OK;
}
void tn_dist_close(tn_dist *d, bool ok) {
    (void)ok;
    if (d) tn_free(d);
}
static void on_grads_ready(void *user, int l) { (void)user; (void)l; }
static tern_status weigh(tn_dist *d, const tn_tmodel *m) { (void)d; (void)m; return tn_err(TERN_ERR_UNSUPPORTED, "train: no MPI"); }
static void scale(float *x, size_t n, float w) { (void)x; (void)n; (void)w; }
static tern_status buckets_wait(tn_dist *d, double *loss) { (void)d; (void)loss; return tn_err(TERN_ERR_UNSUPPORTED, "train: no MPI"); }
static tern_status zero_grads(tn_dist *d, tn_tmodel *m, double *loss) {
    (void)d; (void)m; (void)loss;
    return tn_err(TERN_ERR_UNSUPPORTED, "train: no MPI");
}
static void zero_release(const tn_dist *d, float *x) { (void)d; (void)x; }
tern_status tn_dist_zero_step(tn_dist *d, tn_tmodel *m, const tn_adamw *o, float lr, int64_t t, double *gnorm) {
    (void)d; (void)m; (void)o; (void)lr; (void)t; (void)gnorm;
    return tn_err(TERN_ERR_UNSUPPORTED, "train: no MPI");
}
tern_status tn_dist_ckpt_save(tn_dist *d, tn_tmodel *m, const tn_train_state *st, const char *dir) {
    return d ? tn_err(TERN_ERR_UNSUPPORTED, "train: no MPI") : tn_ckpt_save(m, st, dir);
}
void tn_dist_abort(int code) { (void)code; }

#endif

tern_status tn_dist_allgather(tn_dist *d, const void *msg, int bytes, void *all) {
    if (!d) return memcpy(all, msg, (size_t)bytes), TERN_OK;
    return c_allgather(d, msg, bytes, all);
}

/* The layer whose backward step finishes tensor i's gradient: n_layer for the head, -1 for the
 * token embedding (finished last), a LoRA matrix's layer for its lora_a / lora_b. */
static int tensor_layer(const tn_tmodel *m, int i) {
    const int head = tn_tp_head(m), nb = head + 2;
    if (i >= nb) /* LoRA: the base tensor whose lora_a (or lora_b) is i */
        for (int j = 1; j < head; j++)
            if (m->t[j].lora && (m->t[j].lora == i || m->t[j].lora + 1 == i)) return (j - 1) / m->per_layer;
    return i == 0 ? -1 : i >= head ? m->cfg.n_layer : (i - 1) / m->per_layer;
}

/* dp buckets: final_from[l] = where the gradients final after layer l start (the end of the
 * highest tensor still to come), whatever the layout. */
static tern_status buckets_plan(tn_dist *d, tn_tmodel *m) {
    const int L = m->cfg.n_layer;
    d->bucket = (size_t)(d->o.bucket_mb * 1048576.0 / sizeof(float));
    if (d->o.bucket_mb > 0 && d->bucket < 1) d->bucket = 1;
    if (!d->bucket || d->o.compress || d->o.zero || d->o.method != TN_DIST_DP) { d->bucket = 0; return TERN_OK; }
    d->final_from = tn_calloc((size_t)TN_MAX(L, 1), sizeof *d->final_from);
#ifdef TERN_HAVE_MPI
    const size_t nreq = (d->n + d->bucket - 1) / d->bucket;
    d->req = tn_malloc(nreq * sizeof *d->req);
    if (!d->req) return tn_err(TERN_ERR_NOMEM, "train: --bucket-mb: %zu requests", nreq);
#endif
    if (!d->final_from) return tn_err(TERN_ERR_NOMEM, "train: --bucket-mb plan");
    for (int i = 0; i < m->n_tensors; i++) {
        const int li = tensor_layer(m, i);
        for (int l = li + 1; m->t[i].n && l < L; l++) d->final_from[l] = TN_MAX(d->final_from[l], m->t[i].off + m->t[i].n);
    }
    d->grads = m->grads;
    d->model = m;
    d->sent_lo = d->n;
    m->grads_ready = on_grads_ready;
    m->grads_ready_user = d;
    return TERN_OK;
}

/* ZeRO-1: the slices, the reduce-scatter buffer, the moments of other ranks given back. */
static tern_status zero_plan(tn_dist *d, tn_tmodel *m) {
    d->counts = tn_malloc((size_t)d->size * sizeof *d->counts);
    d->displs = tn_malloc((size_t)d->size * sizeof *d->displs);
    if (!d->counts || !d->displs) return tn_err(TERN_ERR_NOMEM, "train: --zero 1 plan");
    for (int r = 0; r < d->size; r++) {
        const size_t a = d->n * (size_t)r / (size_t)d->size, b = d->n * (size_t)(r + 1) / (size_t)d->size;
        d->displs[r] = (int)a;
        d->counts[r] = (int)(b - a);
    }
    d->lo = (size_t)d->displs[d->rank];
    d->hi = d->lo + (size_t)d->counts[d->rank];
    zero_release(d, m->m);
    zero_release(d, m->v);
    return TERN_OK;
}

void tn_dist_describe(const tn_dist *d, char *buf, size_t cap) {
    buf[0] = 0;
    if (!d) return;
    if (d->o.zo)
        snprintf(buf, cap, "; --zo: the ranks exchange the projected gradients only (no gradient buffers)");
    else if (d->o.zero)
        snprintf(buf, cap, "; ZeRO-1: this rank updates parameters [%zu, %zu) of %zu and holds their AdamW moments, "
                 "%zu bytes (1/%d of %zu)", d->lo, d->hi, d->n, 2 * (d->hi - d->lo) * sizeof(float), d->size,
                 2 * d->n * sizeof(float));
    else if (d->bucket)
        snprintf(buf, cap, "; gradients all-reduced in %zu buckets of <= %.3g MiB as the backward finishes them",
                 (d->n + d->bucket - 1) / d->bucket, (double)d->bucket * sizeof(float) / 1048576.0);
    else if (d->o.method == TN_DIST_DP)
        snprintf(buf, cap, "; gradients all-reduced once after the backward");
    if (d->o.link.bits_per_s > 0) {
        char l[96];
        tn_link_describe(&d->o.link, l, sizeof l);
        const size_t k = strlen(buf);
        snprintf(buf + k, cap - k, "; simulated link: %s (each exchange sleeps to last latency + bytes / rate)", l);
    }
}

tern_status tn_dist_begin(tn_dist *d, tn_tmodel *m) {
    if (!d) return TERN_OK;
    d->n = m->n_params;
    if (d->n >= (size_t)INT32_MAX)
        return tn_err(TERN_ERR_UNSUPPORTED, "train: --dist: %zu parameters exceed one MPI message (2^31 - 1 values)", d->n);
    tern_status s;
    if (d->o.zo) return TERN_OK; /* the projected gradients only (zo.h): no n-sized buffers */
    if ((s = buckets_plan(d, m))) return s;
    if (d->o.zero && (s = zero_plan(d, m))) return s;
    d->buf = tn_malloc((d->n + 1) * sizeof(float));
    if (!d->buf) return tn_err(TERN_ERR_NOMEM, "train: --dist exchange buffer (%zu floats)", d->n + 1);
    if (d->o.compress == TN_COMPRESS_INT8) {
        d->csize = (d->n + TN_DIST_QBLOCK - 1) / TN_DIST_QBLOCK * sizeof(float) + d->n + sizeof(float);
        d->cbuf = tn_malloc(d->csize);
        d->gbuf = tn_malloc(d->csize * (size_t)d->size);
        if (!d->cbuf || !d->gbuf)
            return tn_err(TERN_ERR_NOMEM, "train: --compress int8 buffers (%d x %zu bytes)", d->size + 1, d->csize);
        if (d->csize > (size_t)INT32_MAX) return tn_err(TERN_ERR_UNSUPPORTED, "train: --compress int8: %zu-byte messages", d->csize);
    }
    if (d->o.method == TN_DIST_DP) return TERN_OK;
    d->anchor = tn_malloc(d->n * sizeof(float));
    d->mom = tn_calloc(d->n, sizeof(float));
    if (d->o.method == TN_DIST_NOLOCO) d->rbuf = tn_malloc((d->n + 1) * sizeof(float));
    if (!d->anchor || !d->mom || (d->o.method == TN_DIST_NOLOCO && !d->rbuf))
        return tn_err(TERN_ERR_NOMEM, "train: --dist %s state (3 x %zu floats)", tn_dist_name(d->o.method), d->n);
    memcpy(d->anchor, m->params, d->n * sizeof(float));
    return TERN_OK;
}

tern_status tn_dist_grads(tn_dist *d, tn_tmodel *m, double *loss) {
    if (!d || d->o.method != TN_DIST_DP) return TERN_OK;
    if (d->bucket) return buckets_wait(d, loss);
    if (d->o.zero) return zero_grads(d, m, loss);
    tern_status s = weigh(d, m);
    if (s) return s;
    d->weighed = false;
    memcpy(d->buf, m->grads, d->n * sizeof(float));
    scale(d->buf, d->n, d->w);
    d->buf[d->n] = (float)(*loss * d->w);
    if ((s = allreduce_buf(d))) return s;
    memcpy(m->grads, d->buf, d->n * sizeof(float));
    *loss = d->buf[d->n];
    return TERN_OK;
}

tern_status tn_dist_outer(tn_dist *d, tn_tmodel *m, int64_t step, bool last, double *loss, bool *synced) {
    *synced = false;
    if (!d || d->o.method == TN_DIST_DP) return TERN_OK;
    if (step % d->o.outer_every && !last) return TERN_OK;
    tern_status s;
    if (d->o.method == TN_DIST_DILOCO) {
        for (size_t i = 0; i < d->n; i++) d->buf[i] = d->anchor[i] - m->params[i];
        d->buf[d->n] = (float)*loss;
        if ((s = allreduce_buf(d))) return s;
    } else {
        int stack[64];
        int *perm = d->size <= 64 ? stack : tn_malloc((size_t)d->size * sizeof *perm);
        if (!perm) return tn_err(TERN_ERR_NOMEM, "train: noloco schedule");
        const int peer = noloco_peer(d, d->n_outer, perm);
        if (perm != stack) tn_free(perm);
        memcpy(d->buf, m->params, d->n * sizeof(float));
        d->buf[d->n] = (float)*loss;
        if (peer >= 0) {
            if ((s = sendrecv_buf(d, peer))) return s;
            for (size_t i = 0; i < d->n; i++) d->buf[i] = ((d->anchor[i] - d->buf[i]) + (d->anchor[i] - d->rbuf[i])) / 2.0f;
            d->buf[d->n] = (d->buf[d->n] + d->rbuf[d->n]) / 2.0f;
        } else {
            for (size_t i = 0; i < d->n; i++) d->buf[i] = d->anchor[i] - d->buf[i];
        }
    }
    *loss = d->buf[d->n];
    outer_apply(d, m);
    *synced = true;
    return TERN_OK;
}
