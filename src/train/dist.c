/*
 * dist.c — distributed training on MPI. See dist.h.
 */
#include <math.h>
#include <string.h>

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
};

void tn_dist_opts_default(tn_dist_opts *o) {
    *o = (tn_dist_opts){.method = TN_DIST_NONE, .outer_every = 100, .outer_lr = 0.7f, .outer_momentum = 0.9f};
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

tern_status tn_dist_open(const tn_dist_opts *o, uint64_t seed, tn_dist **out) {
    *out = NULL;
    if (o->method == TN_DIST_NONE) return TERN_OK;
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
    int rc = MPI_Allgather(d->cbuf, (int)d->csize, MPI_BYTE, d->gbuf, (int)d->csize, MPI_BYTE, MPI_COMM_WORLD);
    d->bytes += d->csize;
    d->n_exch++;
    if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Allgather");
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
    int rc = MPI_Allreduce(MPI_IN_PLACE, d->buf, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    d->bytes += (uint64_t)cnt * sizeof(float);
    if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Allreduce");
    const float inv = (float)d->size;
    for (int i = 0; i < cnt; i++) d->buf[i] /= inv;
    return TERN_OK;
}

static tern_status sendrecv_buf(tn_dist *d, int peer) {
    const int cnt = (int)(d->n + 1);
    int rc = MPI_Sendrecv(d->buf, cnt, MPI_FLOAT, peer, 7, d->rbuf, cnt, MPI_FLOAT, peer, 7, MPI_COMM_WORLD,
                          MPI_STATUS_IGNORE);
    d->bytes += (uint64_t)cnt * sizeof(float);
    if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Sendrecv");
    return TERN_OK;
}

tern_status tn_dist_allreduce_mean(tn_dist *d, float *x, int n) {
    if (!d) return TERN_OK;
    int rc = MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    d->bytes += (uint64_t)n * sizeof(float);
    if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Allreduce");
    for (int i = 0; i < n; i++) x[i] /= (float)d->size;
    return TERN_OK;
}

void tn_dist_close(tn_dist *d, bool ok) {
    if (!d) return;
    tn_free(d->anchor);
    tn_free(d->mom);
    tn_free(d->buf);
    tn_free(d->rbuf);
    tn_free(d->cbuf);
    tn_free(d->gbuf);
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
void tn_dist_close(tn_dist *d, bool ok) {
    (void)ok;
    if (d) tn_free(d);
}
void tn_dist_abort(int code) { (void)code; }

#endif

tern_status tn_dist_begin(tn_dist *d, const tn_tmodel *m) {
    if (!d) return TERN_OK;
    d->n = m->n_params;
    if (d->n >= (size_t)INT32_MAX)
        return tn_err(TERN_ERR_UNSUPPORTED, "train: --dist: %zu parameters exceed one MPI message (2^31 - 1 values)", d->n);
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
    memcpy(d->buf, m->grads, d->n * sizeof(float));
    d->buf[d->n] = (float)*loss;
    tern_status s = allreduce_buf(d);
    if (s) return s;
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
