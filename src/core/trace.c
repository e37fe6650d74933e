/*
 * trace.c — see trace.h. Timestamps: on x86 CPUs with an invariant TSC, events record raw TSC
 * ticks (RDTSC costs about half a clock_gettime) and tn_trace_stop converts them to CLOCK_MONOTONIC
 * nanoseconds with the rate measured between start and stop; elsewhere clock_gettime directly.
 * A registry of per-thread buffers under one mutex (taken once per thread
 * per run, at its first event); a run generation tells a thread that its cached buffer belongs to
 * an earlier run. Appending is a bounds check, a clock read and a store: no locks, no atomics
 * beyond the flag.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/trace.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <x86intrin.h>
#define TN_TRACE_HAVE_TSC 1
#endif

#define TN_TRACE_MAX_THREADS 256

typedef struct tn_trace_buf {
    tn_trace_thread pub;
    tn_trace_ev *ev; /* [cap] */
    int64_t cap;
} tn_trace_buf;

atomic_bool tn_trace_flag;

static pthread_mutex_t tn_trace_mu = PTHREAD_MUTEX_INITIALIZER;
static tn_trace_buf *tn_trace_bufs[TN_TRACE_MAX_THREADS];
static tn_trace_thread tn_trace_pub[TN_TRACE_MAX_THREADS]; /* snapshot handed out by tn_trace_threads */
static int tn_trace_nbuf;
static int64_t tn_trace_cap = TN_TRACE_DEFAULT_EVENTS;
static atomic_uint tn_trace_gen = 1; /* bumped by start: cached buffers of older runs are stale */
static bool tn_trace_tsc;            /* this run's events hold TSC ticks until stop converts them */
static uint64_t tn_trace_tsc0, tn_trace_ns0; /* the TSC and the clock at start */

static _Thread_local tn_trace_buf *tn_tl_buf;
static _Thread_local unsigned tn_tl_gen;
static _Thread_local char tn_tl_name[32];

static const char *const tn_trace_kinds[TN_TK_COUNT] = {
    [TN_TK_OTHER] = "other",     [TN_TK_PHASE] = "phase",     [TN_TK_STEP] = "step",       [TN_TK_FORWARD] = "forward",
    [TN_TK_LAYER] = "layer",     [TN_TK_EMBED] = "embed",     [TN_TK_NORM] = "norm",       [TN_TK_QUANT] = "quantize",
    [TN_TK_MATMUL] = "matmul",   [TN_TK_ROPE] = "rope",       [TN_TK_ATTENTION] = "attention",
    [TN_TK_OUTPUT] = "output",   [TN_TK_BARRIER] = "barrier", [TN_TK_SAMPLE] = "sampling", [TN_TK_REQUEST] = "request",
    [TN_TK_COUNTER] = "counter", [TN_TK_ACTIVATION] = "activation", [TN_TK_LOSS] = "loss", [TN_TK_OPTIMIZER] = "optimizer",
    [TN_TK_ROUTE] = "route",
};

const char *tn_trace_kind_name(int kind) { return kind >= 0 && kind < TN_TK_COUNT ? tn_trace_kinds[kind] : "other"; }

uint64_t tn_trace_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* An invariant TSC (CPUID 0x80000007 EDX bit 8): constant rate, running in every C-state. */
static bool tn_trace_tsc_ok(void) {
#ifdef TN_TRACE_HAVE_TSC
    unsigned a, b, c, d;
    return __get_cpuid(0x80000007, &a, &b, &c, &d) && (d & (1u << 8));
#else
    return false;
#endif
}

uint64_t tn_trace_now(void) {
#ifdef TN_TRACE_HAVE_TSC
    if (tn_trace_tsc) return __rdtsc();
#endif
    return tn_trace_ns();
}

void tn_trace_thread_name(const char *fmt, int n) {
    snprintf(tn_tl_name, sizeof tn_tl_name, fmt, n);
}

tern_status tn_trace_start(int64_t max_events) {
    atomic_store(&tn_trace_flag, false);
    tn_trace_reset();
    pthread_mutex_lock(&tn_trace_mu);
    tn_trace_cap = max_events > 0 ? max_events : TN_TRACE_DEFAULT_EVENTS;
    tn_trace_tsc = tn_trace_tsc_ok();
    tn_trace_ns0 = tn_trace_ns();
    tn_trace_tsc0 = tn_trace_now();
    atomic_fetch_add(&tn_trace_gen, 1);
    pthread_mutex_unlock(&tn_trace_mu);
    atomic_store(&tn_trace_flag, true);
    return TERN_OK;
}

void tn_trace_stop(void) {
    if (!atomic_exchange(&tn_trace_flag, false)) return;
    if (!tn_trace_tsc) return;
    /* ticks -> ns at the rate of this run (start .. stop: long enough for a precise ratio) */
    pthread_mutex_lock(&tn_trace_mu);
    const uint64_t ns1 = tn_trace_ns(), t1 = tn_trace_now();
    const double ns_per_tick = t1 > tn_trace_tsc0 ? (double)(ns1 - tn_trace_ns0) / (double)(t1 - tn_trace_tsc0) : 1.0;
    for (int i = 0; i < tn_trace_nbuf; i++) {
        tn_trace_buf *b = tn_trace_bufs[i];
        for (int64_t k = 0; k < b->pub.n; k++) {
            const int64_t dt = (int64_t)(b->ev[k].ts - tn_trace_tsc0); /* a thread's TSC may lag start's a little */
            b->ev[k].ts = (uint64_t)((int64_t)tn_trace_ns0 + llround((double)dt * ns_per_tick));
        }
    }
    tn_trace_tsc = false;
    pthread_mutex_unlock(&tn_trace_mu);
}

void tn_trace_reset(void) {
    pthread_mutex_lock(&tn_trace_mu);
    for (int i = 0; i < tn_trace_nbuf; i++) {
        tn_free(tn_trace_bufs[i]->ev);
        tn_free(tn_trace_bufs[i]);
        tn_trace_bufs[i] = NULL;
    }
    tn_trace_nbuf = 0;
    atomic_fetch_add(&tn_trace_gen, 1);
    pthread_mutex_unlock(&tn_trace_mu);
}

int tn_trace_threads(const tn_trace_thread **out) {
    pthread_mutex_lock(&tn_trace_mu);
    for (int i = 0; i < tn_trace_nbuf; i++) {
        tn_trace_pub[i] = tn_trace_bufs[i]->pub;
        tn_trace_pub[i].ev = tn_trace_bufs[i]->ev;
    }
    const int n = tn_trace_nbuf;
    pthread_mutex_unlock(&tn_trace_mu);
    *out = tn_trace_pub;
    return n;
}

/* The calling thread's buffer for this run, registered on first use; NULL when the registry is
 * full or memory ran out (the thread then records nothing; its events are not counted). */
static tn_trace_buf *tn_trace_self(void) {
    const unsigned gen = atomic_load_explicit(&tn_trace_gen, memory_order_acquire);
    if (TN_LIKELY(tn_tl_gen == gen)) return tn_tl_buf;
    pthread_mutex_lock(&tn_trace_mu);
    tn_trace_buf *b = NULL;
    if (tn_trace_nbuf < TN_TRACE_MAX_THREADS && (b = tn_calloc(1, sizeof *b))) {
        /* malloc, not calloc: pages of the buffer are touched only as events arrive */
        b->ev = tn_malloc((size_t)tn_trace_cap * sizeof *b->ev);
        b->cap = b->ev ? tn_trace_cap : 0;
        b->pub.tid = tn_trace_nbuf + 1;
        if (tn_tl_name[0]) memcpy(b->pub.name, tn_tl_name, sizeof b->pub.name);
        else snprintf(b->pub.name, sizeof b->pub.name, "thread %d", b->pub.tid);
        tn_trace_bufs[tn_trace_nbuf++] = b;
    }
    tn_tl_buf = b;
    tn_tl_gen = atomic_load(&tn_trace_gen);
    pthread_mutex_unlock(&tn_trace_mu);
    return b;
}

static tn_trace_ev *tn_trace_slot(void) {
    tn_trace_buf *b = tn_trace_self();
    if (!b) return NULL;
    if (TN_UNLIKELY(b->pub.n >= b->cap)) { /* full: stop recording on this thread, count the loss */
        b->pub.dropped++;
        return NULL;
    }
    return &b->ev[b->pub.n++];
}

void tn_trace_rec(uint8_t ph, uint8_t kind, const char *name, int32_t il, uint64_t ts, int64_t a0, int64_t a1,
                  int64_t a2, int64_t a3) {
    tn_trace_ev *e = tn_trace_slot();
    if (!e) return;
    e->ts = ts ? ts : tn_trace_now();
    e->name = name;
    e->a[0] = a0, e->a[1] = a1, e->a[2] = a2, e->a[3] = a3;
    e->il = il;
    e->ph = ph;
    e->kind = kind;
}

void tn_trace_counter(const char *name, double v) {
    tn_trace_ev *e = tn_trace_slot();
    if (!e) return;
    e->ts = tn_trace_now();
    e->name = name;
    e->d[0] = v, e->d[1] = e->d[2] = e->d[3] = 0;
    e->il = -1;
    e->ph = TN_PH_COUNTER;
    e->kind = TN_TK_COUNTER;
}
