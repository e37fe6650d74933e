/*
 * peak.c — the machine-peak probes of kern/peak.h: threads started together (they wait for one
 * flag once all are created), each running the ISA loop (src/kern/<isa>/peak.c) or a plain C one, best of several runs.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base.h"
#include "core/cpu.h"
#include "kern/peak.h"

#define TN_PEAK_MAXT 256

static double tn_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef enum { TN_PK_READ, TN_PK_FMA, TN_PK_DOT } tn_pk_kind;

typedef struct {
    tn_pk_kind kind;
    tn_isa isa;
    bool vnni;
    const uint8_t *p;
    size_t bytes;
    int64_t iters;
    atomic_int *go;
    double t;
    uint64_t sink;
} tn_pk_arg;

uint64_t tn_peak_read__scalar(const void *vp, size_t bytes) { /* four prefetched streams, as the ISA loops */
    const uint8_t *p = vp;
    const size_t q = bytes / 4 / 128 * 128;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < q; i += 128)
        for (size_t j = 0; j < 4; j++) {
            const uint64_t *u = (const uint64_t *)(p + j * q + i);
            __builtin_prefetch((const uint8_t *)u + TN_PEAK_PF, 0, 1);
            __builtin_prefetch((const uint8_t *)u + TN_PEAK_PF + 64, 0, 1);
            for (int w = 0; w < 16; w += 4) s0 ^= u[w], s1 ^= u[w + 1], s2 ^= u[w + 2], s3 ^= u[w + 3];
        }
    for (size_t i = 4 * q; i + 8 <= bytes; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        s0 ^= v;
    }
    return s0 ^ s1 ^ s2 ^ s3;
}

static float fma_c(int64_t iters) {
    float a[16];
    for (int j = 0; j < 16; j++) a[j] = (float)j;
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 16; j++) a[j] = a[j] * 0.999999f + 1e-7f;
    float s = 0;
    for (int j = 0; j < 16; j++) s += a[j];
    return s;
}

static uint32_t dot_c(int64_t iters) {
    uint32_t a[16]; /* (unsigned: the chains wrap on long runs, as the vector registers do) */
    for (int j = 0; j < 16; j++) a[j] = (uint32_t)j;
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 16; j++) a[j] += (uint32_t)((uint8_t)a[j] * -5);
    uint32_t s = 0;
    for (int j = 0; j < 16; j++) s += a[j];
    return s;
}

/* Operations one round of the loop the arg selects performs (reads: unused). */
static double ops_per_iter(const tn_pk_arg *a) {
    if (a->kind == TN_PK_FMA) return a->isa == TN_ISA_AVX512 ? 512 : a->isa == TN_ISA_AVX2 ? 256 : 32;
    return a->isa == TN_ISA_AVX512 && a->vnni ? 2048 : a->isa >= TN_ISA_AVX2 ? 768 : 32;
}

static void *tn_pk_thread(void *vp) {
    tn_pk_arg *a = vp;
    while (!atomic_load(a->go)) sched_yield();
    const double t0 = tn_now();
    switch (a->kind) {
    case TN_PK_READ:
        a->sink = a->isa == TN_ISA_AVX512 ? tn_peak_read__avx512(a->p, a->bytes)
                  : a->isa == TN_ISA_AVX2 ? tn_peak_read__avx2(a->p, a->bytes)
                                          : tn_peak_read__scalar(a->p, a->bytes);
        break;
    case TN_PK_FMA: {
        const float f = a->isa == TN_ISA_AVX512 ? tn_peak_fma__avx512(a->iters)
                        : a->isa == TN_ISA_AVX2 ? tn_peak_fma__avx2(a->iters)
                                                : fma_c(a->iters);
        memcpy(&a->sink, &f, sizeof f);
        break;
    }
    case TN_PK_DOT:
        a->sink = (uint64_t)(a->isa == TN_ISA_AVX512 && a->vnni ? tn_peak_dot__avx512(a->iters)
                             : a->isa >= TN_ISA_AVX2            ? tn_peak_dot__avx2(a->iters)
                                                                : dot_c(a->iters));
        break;
    }
    a->t = tn_now() - t0;
    return NULL;
}

/* Runs kind on n threads once; returns the slowest thread's seconds (0 on failure). */
static double tn_pk_run(tn_pk_kind kind, int n, const uint8_t *buf, size_t per, int64_t iters, double *ops) {
    pthread_t th[TN_PEAK_MAXT];
    tn_pk_arg arg[TN_PEAK_MAXT];
    atomic_int go = 0;
    const tn_cpu *c = tn_cpu_get();
    int started = 0;
    for (int i = 0; i < n; i++) {
        arg[i] = (tn_pk_arg){kind, tn_cpu_isa(), c->avx512vnni, buf ? buf + per * (size_t)i : NULL, per, iters, &go, 0, 0};
        if (pthread_create(&th[i], NULL, tn_pk_thread, &arg[i])) break;
        started++;
    }
    atomic_store(&go, 1);
    double tmax = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        if (arg[i].t > tmax) tmax = arg[i].t;
    }
    if (started < n) return 0;
    if (ops) *ops = ops_per_iter(&arg[0]) * (double)iters * n;
    return tmax;
}

static int clamp_threads(int threads) { return threads < 1 ? 1 : threads > TN_PEAK_MAXT ? TN_PEAK_MAXT : threads; }

struct tn_read_probe {
    int threads;
    size_t per;
    uint8_t *buf;
};

tn_read_probe *tn_read_probe_new(int threads, size_t bytes) {
    threads = clamp_threads(threads);
    const size_t per = bytes / (size_t)threads / 4096 * 4096;
    if (per == 0) return NULL;
    tn_read_probe *p = malloc(sizeof *p);
    uint8_t *buf = tn_malloc_huge(per * (size_t)threads); /* pages as the model's weights get */
    if (!p || !buf) {
        free(p), tn_free_aligned(buf);
        return NULL;
    }
    memset(buf, 1, per * (size_t)threads); /* fault the pages in before timing */
    *p = (tn_read_probe){threads, per, buf};
    return p;
}

double tn_read_probe_gbs(tn_read_probe *p) {
    const double t = tn_pk_run(TN_PK_READ, p->threads, p->buf, p->per, 0, NULL);
    return t > 0 ? (double)p->per * p->threads / t / 1e9 : 0.0;
}

void tn_read_probe_free(tn_read_probe *p) {
    if (p) tn_free_aligned(p->buf);
    free(p);
}

double tn_peak_read_gbs(int threads, size_t bytes, int reps) {
    tn_read_probe *p = tn_read_probe_new(threads, bytes);
    if (!p) return 0;
    double best = 0;
    for (int r = 0; r < reps; r++) {
        const double g = tn_read_probe_gbs(p);
        if (g > best) best = g;
    }
    tn_read_probe_free(p);
    return best;
}

/* Compute probes: ~5 ms per run, best of 10 (short runs: on a shared machine the best one is the
 * one nothing else interrupted). */
static double tn_peak_compute(tn_pk_kind kind, int threads) {
    threads = clamp_threads(threads);
    int64_t iters = 1 << 14;
    double ops = 0, t = tn_pk_run(kind, threads, NULL, 0, iters, &ops);
    while (t > 0 && t < 0.005 && iters < ((int64_t)1 << 40)) iters *= 2, t = tn_pk_run(kind, threads, NULL, 0, iters, &ops);
    double best = t > 0 ? ops / t / 1e9 : 0;
    for (int r = 0; r < 9; r++) {
        t = tn_pk_run(kind, threads, NULL, 0, iters, &ops);
        if (t > 0 && ops / t / 1e9 > best) best = ops / t / 1e9;
    }
    return best;
}

double tn_peak_fma_gflops(int threads) { return tn_peak_compute(TN_PK_FMA, threads); }
double tn_peak_dot_gops(int threads) { return tn_peak_compute(TN_PK_DOT, threads); }
