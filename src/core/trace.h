/*
 * trace.h — tern's built-in tracer: spans (begin/end), counters, instants and async (request)
 * events with monotonic nanosecond timestamps, recorded into per-thread append-only buffers.
 * `tern profile` turns them into a Chrome/Perfetto trace and a summary (tools/tern/cmd_profile.c).
 *
 * Compiled in always, off by default. With tracing off a call site costs one predictable branch
 * on a global flag: every recording goes through TN_TRACE_ON() (the TN_SPAN_* macros do that).
 * With it on, a thread registers itself once (its first event: one mutex, one allocation of its
 * buffer) and then appends without locks. Buffers are bounded: when one fills, that thread stops
 * recording (sticky) and counts what it dropped; tn_trace_threads() reports it. Never grows,
 * never crashes.
 *
 * Not re-entrant across start/stop: tn_trace_start and tn_trace_stop are called while no other
 * thread records (e.g. around a whole command); buffers are read (tn_trace_threads) after stop
 * and stay valid until tn_trace_reset or the next start.
 *
 * Event names are static strings (never copied). The meaning of a[0..3] depends on the kind:
 *   matmul  B: weight type (tn_dtype id), m, k, n        E: rows this thread computed, bytes read
 *   forward B: rows in the batch, rows with logits
 *   step    B: rows, logits rows, decoding rows, KV blocks in use
 *   phase   B: tokens
 *   train matmul (tern train/finetune) B: weight type, m, k, n (rows of the batch)
 *           E: flops, bytes of the weight read, threads of the pool, 1 forward / 2 backward
 *   train step B: step number, tokens       E: step, tokens
 *   async   a[0]: request id
 *   counter d: the value (tn_trace_counter)
 */
#ifndef TN_CORE_TRACE_H
#define TN_CORE_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/base.h"

/* What a span is (the summary's op kinds); names in tn_trace_kind_name. */
typedef enum {
    TN_TK_OTHER = 0,
    TN_TK_PHASE,     /* prefill, decode (tern_decode); training: forward, backward, optimizer, ... */
    TN_TK_STEP,      /* one tern serve engine step, or one training step (train_step) */
    TN_TK_FORWARD,   /* one forward pass on one thread                       */
    TN_TK_LAYER,     /* one layer of a forward pass                          */
    TN_TK_EMBED,     /* token embedding + RoPE tables                        */
    TN_TK_NORM,      /* RMSNorm of the residual stream                       */
    TN_TK_QUANT,     /* quantization of a matmul's activations               */
    TN_TK_MATMUL,    /* weight matmuls (attn_q/k/v/out, ffn_gate_up, ffn_down, output; experts) */
    TN_TK_ROPE,      /* q/k biases, q/k norms, RoPE and the K/V cache store  */
    TN_TK_ATTENTION, /* softmax(q K^T) V over the cache                      */
    TN_TK_OUTPUT,    /* final norm + logits (the output matmul nested; training: + loss) */
    TN_TK_BARRIER,   /* waiting at a pool barrier or for the pool to finish  */
    TN_TK_SAMPLE,    /* choosing a token from logits                         */
    TN_TK_REQUEST,   /* async: a served request and its queue/prefill/decode */
    TN_TK_COUNTER,
    TN_TK_ACTIVATION, /* training: SwiGLU and bias adds (and their backward)  */
    TN_TK_LOSS,      /* training: softmax cross-entropy and dlogits          */
    TN_TK_OPTIMIZER, /* training: gradient norm, the AdamW / SGD update      */
    TN_TK_ROUTE,     /* mixture of experts: routing, grouping rows by expert, the weighted sum */
    TN_TK_COUNT
} tn_trace_kind;

typedef enum {
    TN_PH_BEGIN = 'B',
    TN_PH_END = 'E',
    TN_PH_INSTANT = 'i',
    TN_PH_COUNTER = 'C',
    TN_PH_ASYNC_BEGIN = 'b',
    TN_PH_ASYNC_END = 'e',
} tn_trace_ph;

typedef struct tn_trace_ev {
    uint64_t ts;      /* ns since an arbitrary monotonic origin (CLOCK_MONOTONIC) */
    const char *name; /* static                                                */
    union {
        int64_t a[4];
        double d[4];
    };
    int32_t il;   /* layer, -1 for none */
    uint8_t ph;   /* tn_trace_ph        */
    uint8_t kind; /* tn_trace_kind      */
} tn_trace_ev;

/* One registered thread's buffer (read after tn_trace_stop). */
typedef struct tn_trace_thread {
    int tid;              /* 1, 2, ... in registration order */
    char name[32];        /* "main", "pool 1", "engine", ...  */
    const tn_trace_ev *ev;
    int64_t n;            /* events recorded                  */
    int64_t dropped;      /* events not recorded (buffer full) */
} tn_trace_thread;

extern atomic_bool tn_trace_flag;
#define TN_TRACE_ON() TN_UNLIKELY(atomic_load_explicit(&tn_trace_flag, memory_order_relaxed))

#define TN_TRACE_DEFAULT_EVENTS (1 << 20) /* per thread: 56 MiB reserved, touched as used */

/* Frees the previous run's buffers and turns tracing on with room for max_events per thread
 * (0: TN_TRACE_DEFAULT_EVENTS). NOMEM only for the registry itself. */
tern_status tn_trace_start(int64_t max_events);
/* Turns tracing off (events already recorded stay). */
void tn_trace_stop(void);
/* Frees every buffer (tracing must be off). */
void tn_trace_reset(void);
/* The registered threads (valid until reset/start); returns their count. */
int tn_trace_threads(const tn_trace_thread **out);

/* Names the calling thread in the trace ("pool %d" style, truncated to 31 bytes). Cheap (a
 * thread-local copy), so threads call it when they start, traced or not. */
void tn_trace_thread_name(const char *fmt, int n);

/* An event timestamp for tn_trace_rec (raw TSC ticks while a run records them; converted to
 * CLOCK_MONOTONIC ns by tn_trace_stop): not for measuring durations — tn_trace_ns is. */
uint64_t tn_trace_now(void);
uint64_t tn_trace_ns(void); /* CLOCK_MONOTONIC in ns */
/* Records one event at ts (0: now). Callers check TN_TRACE_ON() first. */
void tn_trace_rec(uint8_t ph, uint8_t kind, const char *name, int32_t il, uint64_t ts, int64_t a0, int64_t a1,
                  int64_t a2, int64_t a3);
void tn_trace_counter(const char *name, double v);
const char *tn_trace_kind_name(int kind);

#define TN_SPAN_B(kind, name, il, a0, a1, a2, a3)                                           \
    do {                                                                                    \
        if (TN_TRACE_ON()) tn_trace_rec(TN_PH_BEGIN, (kind), (name), (il), 0, (a0), (a1), (a2), (a3)); \
    } while (0)
#define TN_SPAN_E(kind, name, il, a0, a1)                                                   \
    do {                                                                                    \
        if (TN_TRACE_ON()) tn_trace_rec(TN_PH_END, (kind), (name), (il), 0, (a0), (a1), 0, 0); \
    } while (0)
/* Ends one span and begins the next at the same instant (back-to-back spans, no gap between). */
#define TN_SPAN_NEXT(kind_e, name_e, il_e, kind_b, name_b, il_b)                            \
    do {                                                                                    \
        if (TN_TRACE_ON()) {                                                                \
            const uint64_t tn_ts_ = tn_trace_now();                                         \
            tn_trace_rec(TN_PH_END, (kind_e), (name_e), (il_e), tn_ts_, 0, 0, 0, 0);        \
            tn_trace_rec(TN_PH_BEGIN, (kind_b), (name_b), (il_b), tn_ts_, 0, 0, 0, 0);      \
        }                                                                                   \
    } while (0)
#define TN_TRACE_ASYNC(ph, name, id)                                                        \
    do {                                                                                    \
        if (TN_TRACE_ON()) tn_trace_rec((ph), TN_TK_REQUEST, (name), -1, 0, (int64_t)(id), 0, 0, 0); \
    } while (0)
#define TN_TRACE_INSTANT(kind, name, il)                                                    \
    do {                                                                                    \
        if (TN_TRACE_ON()) tn_trace_rec(TN_PH_INSTANT, (kind), (name), (il), 0, 0, 0, 0, 0); \
    } while (0)
#define TN_TRACE_COUNTER(name, v)                                                           \
    do {                                                                                    \
        if (TN_TRACE_ON()) tn_trace_counter((name), (v));                                   \
    } while (0)

#endif
