/*
 * cmd_profile.c — `tern profile [-o trace.json] [--summary-only] [--json] [--svg step.svg]
 * [--max-events N] -- generate|bench|perplexity|serve|train|finetune ...`: runs the subcommand in this process
 * with tracing on (core/trace.h), then writes
 *   - a Chrome/Perfetto trace (JSON "traceEvents": B/E spans per thread with their args, counters
 *     as "C", served requests as async "b"/"e" tracks, thread names as metadata; the summary
 *     below under "tern_profile"), atomically (temp file + rename);
 *   - a summary on stderr (or as one JSON line on stdout with --json): self time by op kind and
 *     time by layer, the matmuls' bytes, GB/s and share of the machine's roofline per weight type
 *     (decode against read bandwidth, prefill against the FMA / int8 dot peak: kern/peak.h; the
 *     training GEMMs, forward and backward, against the f32 FMA peak of the pool's threads),
 *     time per phase (prefill, decode; forward, backward, optimizer, eval, ... of training),
 *     barrier and idle share per thread, the top 10 spans by self time, dropped events;
 *   - with --svg, a timeline of one decode step and one prefill step (profile_svg.c).
 * Times are thread-time: a span on each of 4 threads counts 4 times. Self time = a span's time
 * minus its nested spans, so the op kinds add up to the traced time.
 * Training records its spans on the thread that drives the pool (train/tmodel.c): its matmul
 * spans are wall time over all the pool's threads, rated as such. Profiles one command per process.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core/file.h"
#include "kern/peak.h"
#include "profile.h"
#include "tensor/dtype.h"

#define PROF_MAX_DEPTH 64
#define PROF_MAX_LAYERS 512
#define PROF_GROUPS 8192 /* (name, layer) groups of the top-10 table; power of two */
#define PROF_BW_BYTES ((size_t)256 << 20)
#define PROF_PHASES 32 /* distinct phase names */
#define PROF_MM_PHASES 4
static const char *const prof_mm_phase[PROF_MM_PHASES] = {"decode", "prefill", "train_fwd", "train_bwd"};

/* ---- walking spans ------------------------------------------------------------------------- */
void tn_prof_walk(const tn_trace_thread *th, tn_prof_span_fn fn, void *user) {
    struct {
        const tn_trace_ev *b;
        uint64_t child;
    } st[PROF_MAX_DEPTH];
    int d = 0, skipped = 0; /* skipped: B's beyond the depth limit, ended without a span */
    uint64_t last = th->n ? th->ev[th->n - 1].ts : 0;
    for (int64_t i = 0; i < th->n; i++) {
        const tn_trace_ev *e = &th->ev[i];
        if (e->ph == TN_PH_BEGIN) {
            if (d == PROF_MAX_DEPTH) skipped++;
            else st[d].b = e, st[d++].child = 0;
        } else if (e->ph == TN_PH_END) {
            if (skipped) {
                skipped--;
                continue;
            }
            if (d == 0) continue; /* an end without its begin (tracing turned on mid-span) */
            d--;
            tn_prof_span s = {st[d].b, e, st[d].b->ts, e->ts, 0, d};
            const uint64_t dur = s.t1 - s.t0;
            s.self = dur > st[d].child ? dur - st[d].child : 0;
            if (d > 0) st[d - 1].child += dur;
            fn(user, th, &s);
        }
    }
    while (d > 0) { /* open at the end (buffer full): closed at the thread's last timestamp */
        d--;
        tn_prof_span s = {st[d].b, NULL, st[d].b->ts, last, 0, d};
        const uint64_t dur = s.t1 - s.t0;
        s.self = dur > st[d].child ? dur - st[d].child : 0;
        if (d > 0) st[d - 1].child += dur;
        fn(user, th, &s);
    }
}

/* ---- the summary --------------------------------------------------------------------------- */
typedef struct {
    const char *name;
    int32_t il;
    int kind;
    uint64_t self, n;
} prof_group;

typedef struct {
    uint64_t ns, bytes, n;
    double flops;
} prof_mm; /* matmuls of one weight type in one phase */

typedef struct {
    uint64_t first, last, busy, barrier, forward;
} prof_thr;

typedef struct {
    int n_th;
    const tn_trace_thread *th;
    uint64_t t_origin;
    uint64_t kind_self[TN_TK_COUNT], kind_n[TN_TK_COUNT];
    uint64_t layer_ns[PROF_MAX_LAYERS];
    int32_t n_layer;
    prof_mm mm[PROF_MM_PHASES][TN_DTYPE_SLOT_COUNT]; /* decode (n == 1), prefill (n > 1), training forward, backward */
    struct {
        const char *name;
        uint64_t ns, n;
    } phase[PROF_PHASES]; /* inclusive time per phase name */
    int n_phase;
    int train_threads; /* the pool's threads behind the training matmuls (0: not training) */
    prof_thr *thr;
    prof_group *groups;
    int n_pool; /* threads that ran forward passes */
    int64_t dropped, events;
    double peak_bw, peak_fma, peak_dot;
    /* the --svg windows: [0] a decode pass, [1] a prefill pass (t0, t1) */
    uint64_t win[2][2];
    int n_dec;
    int cur_thread;
} prof_sum;

static prof_group *prof_group_of(prof_sum *S, const char *name, int32_t il, int kind) {
    size_t h = ((size_t)(uintptr_t)name * 31u + (size_t)(il + 1) * 0x9E3779B1u + (size_t)kind) & (PROF_GROUPS - 1);
    for (size_t k = 0; k < PROF_GROUPS; k++, h = (h + 1) & (PROF_GROUPS - 1)) {
        prof_group *g = &S->groups[h];
        if (!g->name) {
            g->name = name, g->il = il, g->kind = kind;
            return g;
        }
        if (g->name == name && g->il == il && g->kind == kind) return g;
    }
    return NULL; /* full: left out of the top 10 (still counted by kind) */
}

static void prof_on_span(void *user, const tn_trace_thread *th, const tn_prof_span *s) {
    prof_sum *S = user;
    prof_thr *T = &S->thr[S->cur_thread];
    const tn_trace_ev *b = s->b;
    const int kind = b->kind < TN_TK_COUNT ? b->kind : TN_TK_OTHER;
    const uint64_t dur = s->t1 - s->t0;
    (void)th;
    S->kind_self[kind] += s->self;
    S->kind_n[kind]++;
    if (s->depth == 0) T->busy += dur;
    if (kind == TN_TK_BARRIER) T->barrier += s->self;
    if (kind == TN_TK_FORWARD) T->forward += dur;
    if (kind == TN_TK_LAYER && b->il >= 0 && b->il < PROF_MAX_LAYERS) {
        S->layer_ns[b->il] += dur;
        if (b->il + 1 > S->n_layer) S->n_layer = b->il + 1;
    }
    if (kind == TN_TK_PHASE) {
        int k = 0;
        while (k < S->n_phase && strcmp(S->phase[k].name, b->name)) k++;
        if (k == S->n_phase && k < PROF_PHASES) S->phase[S->n_phase++].name = b->name;
        if (k < S->n_phase) S->phase[k].ns += dur, S->phase[k].n++;
    }
    const bool train_mm = kind == TN_TK_MATMUL && s->e && (s->e->a[3] == 1 || s->e->a[3] == 2);
    if (train_mm && b->a[0] >= 0 && b->a[0] < TN_DTYPE_SLOT_COUNT) { /* wall time on the pool: flops, bytes, threads */
        prof_mm *m = &S->mm[1 + s->e->a[3]][b->a[0]];
        m->ns += dur, m->n++;
        m->bytes += (uint64_t)s->e->a[1];
        m->flops += (double)s->e->a[0];
        S->train_threads = TN_MAX(S->train_threads, (int)s->e->a[2]);
    } else if (kind == TN_TK_MATMUL && b->a[0] >= 0 && b->a[0] < TN_DTYPE_SLOT_COUNT) {
        prof_mm *m = &S->mm[b->a[3] > 1][b->a[0]];
        m->ns += s->self, m->n++;
        if (s->e) { /* rows computed, bytes read */
            m->bytes += (uint64_t)s->e->a[1];
            m->flops += 2.0 * (double)s->e->a[0] * (double)b->a[2] * (double)b->a[3];
        }
    }
    /* --svg windows, from the first thread that runs forward passes: its first prefill pass and its
     * third decode pass (the first ones still warm caches up) */
    if (kind == TN_TK_FORWARD && S->n_pool == 0) {
        if (b->a[0] > 1 && !S->win[1][1]) S->win[1][0] = s->t0, S->win[1][1] = s->t1;
        if (b->a[0] == 1 && S->n_dec++ < 3) S->win[0][0] = s->t0, S->win[0][1] = s->t1;
    }
    prof_group *g = prof_group_of(S, b->name, b->il, kind);
    if (g) g->self += s->self, g->n++;
}

static int prof_group_cmp(const void *a, const void *b) {
    const prof_group *x = a, *y = b;
    return x->self < y->self ? 1 : x->self > y->self ? -1 : 0;
}

static bool prof_float_type(int t) { return t == TN_F32 || t == TN_F16 || t == TN_BF16; }

/* Walks every thread; measures the machine's peaks when there were matmuls (roofline). */
static int prof_summarize(prof_sum *S, bool roofline) {
    S->n_th = tn_trace_threads(&S->th);
    S->thr = calloc((size_t)S->n_th + 1, sizeof *S->thr);
    S->groups = calloc(PROF_GROUPS, sizeof *S->groups);
    if (!S->thr || !S->groups) {
        fprintf(stderr, "tern: error: profile: out of memory for the summary\n");
        return TN_EXIT_OSERR;
    }
    S->t_origin = UINT64_MAX;
    for (int i = 0; i < S->n_th; i++)
        if (S->th[i].n) S->t_origin = TN_MIN(S->t_origin, S->th[i].ev[0].ts);
    if (S->t_origin == UINT64_MAX) S->t_origin = 0;
    for (int i = 0; i < S->n_th; i++) {
        const tn_trace_thread *th = &S->th[i];
        S->cur_thread = i;
        S->thr[i].first = th->n ? th->ev[0].ts : 0;
        S->thr[i].last = th->n ? th->ev[th->n - 1].ts : 0;
        S->dropped += th->dropped;
        S->events += th->n;
        tn_prof_walk(th, prof_on_span, S);
        if (S->thr[i].forward) S->n_pool++;
    }
    bool any_mm = false;
    for (int p = 0; p < PROF_MM_PHASES; p++)
        for (int t = 0; t < TN_DTYPE_SLOT_COUNT; t++) any_mm |= S->mm[p][t].n > 0;
    if (!S->n_pool) S->n_pool = S->train_threads; /* training: the pool behind the driving thread's spans */
    if (roofline && any_mm) {
        const int nt = S->n_pool ? S->n_pool : 1;
        S->peak_bw = tn_peak_read_gbs(nt, PROF_BW_BYTES, 3);
        S->peak_fma = tn_peak_fma_gflops(nt);
        S->peak_dot = tn_peak_dot_gops(nt);
    }
    return TN_EXIT_OK;
}

static json_t *prof_summary_json(const prof_sum *S) {
    json_t *o = json_object(), *kinds = json_object(), *layers = json_array(), *mms = json_array(), *thr = json_array(),
           *top = json_array(), *phases = json_object();
    for (int k = 0; k < S->n_phase; k++)
        json_object_set_new(phases, S->phase[k].name, json_pack("{s:f, s:I}", "ms", S->phase[k].ns / 1e6, "spans", (json_int_t)S->phase[k].n));
    uint64_t total = 0;
    for (int k = 0; k < TN_TK_COUNT; k++) total += S->kind_self[k];
    for (int k = 0; k < TN_TK_COUNT; k++)
        if (S->kind_n[k])
            json_object_set_new(kinds, tn_trace_kind_name(k),
                                json_pack("{s:f, s:I, s:f}", "self_ms", S->kind_self[k] / 1e6, "spans", (json_int_t)S->kind_n[k],
                                          "share", total ? (double)S->kind_self[k] / (double)total : 0.0));
    for (int32_t l = 0; l < S->n_layer; l++) json_array_append_new(layers, json_real(S->layer_ns[l] / 1e6));
    const int nt = S->n_pool ? S->n_pool : 1;
    for (int p = 0; p < PROF_MM_PHASES; p++)
        for (int t = 0; t < TN_DTYPE_SLOT_COUNT; t++) {
            const prof_mm *m = &S->mm[p][t];
            if (!m->n) continue;
            const bool train = p >= 2; /* wall time of the driving thread, not thread-time */
            const double wall = train ? m->ns / 1e9 : m->ns / 1e9 / nt; /* thread-time over the pool's threads */
            const double gbs = wall > 0 ? m->bytes / 1e9 / wall : 0, gops = wall > 0 ? m->flops / 1e9 / wall : 0;
            const double peak = p == 0 ? S->peak_bw : train || prof_float_type(t) ? S->peak_fma : S->peak_dot;
            const double pct = peak > 0 ? 100.0 * (p == 0 ? gbs : gops) / peak : 0;
            json_array_append_new(mms, json_pack("{s:s, s:s, s:I, s:f, s:I, s:f, s:f, s:s, s:f}", "phase", prof_mm_phase[p],
                                                 "type", tn_dtype_name((uint32_t)t), "calls", (json_int_t)m->n, "self_ms", m->ns / 1e6,
                                                 "bytes", (json_int_t)m->bytes, "gb_s", gbs, "gop_s", gops, "roofline",
                                                 p == 0 ? "read_bandwidth" : train || prof_float_type(t) ? "fma_f32" : "int8_dot",
                                                 "roofline_pct", pct));
        }
    for (int i = 0; i < S->n_th; i++) {
        const prof_thr *T = &S->thr[i];
        const uint64_t win = T->last - T->first;
        json_array_append_new(thr, json_pack("{s:i, s:s, s:f, s:f, s:f, s:f, s:f, s:I, s:I}", "tid", S->th[i].tid, "name",
                                             S->th[i].name, "window_ms", win / 1e6, "busy_ms", T->busy / 1e6, "barrier_ms",
                                             T->barrier / 1e6, "barrier_share", win ? (double)T->barrier / win : 0.0, "idle_share",
                                             win ? (double)(win - TN_MIN(win, T->busy)) / win : 0.0, "events",
                                             (json_int_t)S->th[i].n, "dropped", (json_int_t)S->th[i].dropped));
    }
    prof_group *g = malloc(PROF_GROUPS * sizeof *g);
    if (g) {
        memcpy(g, S->groups, PROF_GROUPS * sizeof *g);
        qsort(g, PROF_GROUPS, sizeof *g, prof_group_cmp);
        for (int i = 0; i < 10 && g[i].name; i++)
            json_array_append_new(top, json_pack("{s:s, s:s, s:i, s:I, s:f}", "name", g[i].name, "kind",
                                                 tn_trace_kind_name(g[i].kind), "layer", g[i].il, "spans", (json_int_t)g[i].n,
                                                 "self_ms", g[i].self / 1e6));
        free(g);
    }
    json_object_set_new(o, "kinds", kinds);
    json_object_set_new(o, "phases", phases);
    json_object_set_new(o, "traced_ms", json_real(total / 1e6));
    json_object_set_new(o, "layers_ms", layers);
    json_object_set_new(o, "matmuls", mms);
    json_object_set_new(o, "threads", thr);
    json_object_set_new(o, "top", top);
    json_object_set_new(o, "pool_threads", json_integer(S->n_pool));
    json_object_set_new(o, "peaks", json_pack("{s:f, s:f, s:f}", "read_gb_s", S->peak_bw, "fma_gflop_s", S->peak_fma,
                                              "int8_gop_s", S->peak_dot));
    json_object_set_new(o, "events", json_integer(S->events));
    json_object_set_new(o, "dropped_events", json_integer(S->dropped));
    return o;
}

static void prof_summary_text(FILE *f, json_t *j) {
    const double total = json_real_value(json_object_get(j, "traced_ms"));
    fprintf(f, "\ntern profile: %.1f ms traced (thread-time, %lld pool threads)\n", total,
            (long long)json_integer_value(json_object_get(j, "pool_threads")));
    fprintf(f, "\nself time by op kind:\n");
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(j, "kinds"), k, v) {
        fprintf(f, "  %-10s %10.2f ms %5.1f%% %9lld spans\n", k, json_real_value(json_object_get(v, "self_ms")),
                100 * json_real_value(json_object_get(v, "share")), (long long)json_integer_value(json_object_get(v, "spans")));
    }
    if (json_object_size(json_object_get(j, "phases"))) {
        fprintf(f, "\nphases (inclusive; a forward inside eval counts in both):\n");
        json_object_foreach(json_object_get(j, "phases"), k, v) {
            fprintf(f, "  %-10s %10.2f ms %9lld spans\n", k, json_real_value(json_object_get(v, "ms")),
                    (long long)json_integer_value(json_object_get(v, "spans")));
        }
    }
    size_t i;
    json_t *layers = json_object_get(j, "layers_ms");
    if (json_array_size(layers)) {
        fprintf(f, "\ntime by layer (inclusive):\n");
        json_array_foreach(layers, i, v) fprintf(f, "  layer %-4zu %10.2f ms\n", i, json_real_value(v));
    }
    json_t *mms = json_object_get(j, "matmuls");
    if (json_array_size(mms)) {
        fprintf(f, "\nmatmuls (self time; rate over the pool's threads; roofline = read bandwidth for decode, FMA/int8 peak for prefill;\n"
                   "          train_fwd/train_bwd: wall time of the pool's GEMMs, against the f32 FMA peak):\n");
        fprintf(f, "  %-9s %-8s %7s %10s %10s %9s %9s %7s\n", "phase", "type", "calls", "ms", "MB read", "GB/s", "GOP/s", "roof%");
        json_array_foreach(mms, i, v) {
            fprintf(f, "  %-9s %-8s %7lld %10.2f %10.1f %9.2f %9.2f %6.1f%%\n", json_string_value(json_object_get(v, "phase")),
                    json_string_value(json_object_get(v, "type")), (long long)json_integer_value(json_object_get(v, "calls")),
                    json_real_value(json_object_get(v, "self_ms")), json_integer_value(json_object_get(v, "bytes")) / 1e6,
                    json_real_value(json_object_get(v, "gb_s")), json_real_value(json_object_get(v, "gop_s")),
                    json_real_value(json_object_get(v, "roofline_pct")));
        }
        json_t *pk = json_object_get(j, "peaks");
        if (json_real_value(json_object_get(pk, "read_gb_s")) <= 0) fprintf(f, "  (peaks not measured: no roofline %%)\n");
        else fprintf(f, "  peaks: read %.1f GB/s, f32 FMA %.1f GFLOP/s, int8 dot %.1f GOP/s\n",
                json_real_value(json_object_get(pk, "read_gb_s")), json_real_value(json_object_get(pk, "fma_gflop_s")),
                json_real_value(json_object_get(pk, "int8_gop_s")));
    }
    fprintf(f, "\nthreads (share of each thread's own first..last event):\n");
    json_array_foreach(json_object_get(j, "threads"), i, v) {
        fprintf(f, "  %-10s busy %9.2f ms  barrier %5.1f%%  idle %5.1f%%%s\n", json_string_value(json_object_get(v, "name")),
                json_real_value(json_object_get(v, "busy_ms")), 100 * json_real_value(json_object_get(v, "barrier_share")),
                100 * json_real_value(json_object_get(v, "idle_share")),
                json_integer_value(json_object_get(v, "dropped")) ? "  (buffer full: events dropped)" : "");
    }
    fprintf(f, "\ntop spans by self time:\n");
    json_array_foreach(json_object_get(j, "top"), i, v) {
        const int il = (int)json_integer_value(json_object_get(v, "layer"));
        char lbl[64];
        if (il >= 0) snprintf(lbl, sizeof lbl, "%s L%d", json_string_value(json_object_get(v, "name")), il);
        else snprintf(lbl, sizeof lbl, "%s", json_string_value(json_object_get(v, "name")));
        fprintf(f, "  %2zu. %-20s %-10s %10.2f ms %5.1f%% %8lld spans\n", i + 1, lbl, json_string_value(json_object_get(v, "kind")),
                json_real_value(json_object_get(v, "self_ms")),
                total > 0 ? 100 * json_real_value(json_object_get(v, "self_ms")) / total : 0.0,
                (long long)json_integer_value(json_object_get(v, "spans")));
    }
    const json_int_t dropped = json_integer_value(json_object_get(j, "dropped_events"));
    if (dropped)
        fprintf(f, "\nnote: %lld events were dropped (a thread's buffer filled; its later spans are missing). "
                   "Raise --max-events or profile a shorter run.\n", (long long)dropped);
}

/* ---- the trace file ------------------------------------------------------------------------ */
static void prof_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* The args of a begin event, by kind (trace.h lists what a[] holds). */
static void prof_args_b(FILE *f, const tn_trace_ev *e) {
    fprintf(f, ",\"args\":{");
    int n = 0;
#define ARG(fmt, ...) fprintf(f, "%s" fmt, n++ ? "," : "", __VA_ARGS__)
    if (e->il >= 0) ARG("\"layer\":%d", e->il);
    switch (e->kind) {
    case TN_TK_MATMUL:
        ARG("\"type\":\"%s\",\"m\":%lld,\"k\":%lld,\"n\":%lld", tn_dtype_name((uint32_t)e->a[0]), (long long)e->a[1],
            (long long)e->a[2], (long long)e->a[3]);
        break;
    case TN_TK_QUANT:
        ARG("\"type\":\"%s\",\"k\":%lld,\"n\":%lld", tn_dtype_name((uint32_t)e->a[0]), (long long)e->a[1], (long long)e->a[2]);
        break;
    case TN_TK_FORWARD: ARG("\"rows\":%lld,\"logits\":%lld", (long long)e->a[0], (long long)e->a[1]); break;
    case TN_TK_PHASE: ARG("\"tokens\":%lld", (long long)e->a[0]); break;
    case TN_TK_STEP:
        if (!strcmp(e->name, "train_step")) ARG("\"step\":%lld,\"tokens\":%lld", (long long)e->a[0], (long long)e->a[1]);
        break;
    case TN_TK_ACTIVATION:
    case TN_TK_LOSS: ARG("\"rows\":%lld,\"d\":%lld", (long long)e->a[0], (long long)e->a[1]); break;
    case TN_TK_NORM: ARG("\"rows\":%lld,\"n_embd\":%lld", (long long)e->a[0], (long long)e->a[1]); break;
    case TN_TK_ATTENTION: ARG("\"units\":%lld,\"heads_per_unit\":%lld", (long long)e->a[0], (long long)e->a[1]); break;
    case TN_TK_ROPE: ARG("\"q_heads\":%lld,\"kv_heads\":%lld", (long long)e->a[0], (long long)e->a[1]); break;
    case TN_TK_SAMPLE: ARG("\"n_vocab\":%lld", (long long)e->a[0]); break;
    case TN_TK_ROUTE: ARG("\"tokens\":%lld,\"experts\":%lld,\"used\":%lld", (long long)e->a[0], (long long)e->a[1], (long long)e->a[2]); break;
    default: break;
    }
#undef ARG
    fputc('}', f);
}

static void prof_args_e(FILE *f, const tn_trace_ev *e) {
    if (!e) {
        fprintf(f, ",\"args\":{\"truncated\":1}");
        return;
    }
    if (e->kind == TN_TK_MATMUL && (e->a[3] == 1 || e->a[3] == 2)) /* training (trace.h) */
        fprintf(f, ",\"args\":{\"flop\":%lld,\"bytes\":%lld,\"threads\":%lld,\"pass\":\"%s\"}", (long long)e->a[0],
                (long long)e->a[1], (long long)e->a[2], e->a[3] == 1 ? "forward" : "backward");
    else if (e->kind == TN_TK_MATMUL) fprintf(f, ",\"args\":{\"rows\":%lld,\"bytes\":%lld}", (long long)e->a[0], (long long)e->a[1]);
    else if (e->kind == TN_TK_STEP && !strcmp(e->name, "train_step"))
        fprintf(f, ",\"args\":{\"step\":%lld,\"tokens\":%lld}", (long long)e->a[0], (long long)e->a[1]);
    else if (e->kind == TN_TK_STEP)
        fprintf(f, ",\"args\":{\"rows\":%lld,\"logits\":%lld,\"decode_rows\":%lld}", (long long)e->a[0], (long long)e->a[1],
                (long long)e->a[2]);
    else if (e->kind == TN_TK_SAMPLE) fprintf(f, ",\"args\":{\"token\":%lld}", (long long)e->a[0]);
}

static void prof_ev_head(FILE *f, bool *first, const char *name, const char *cat, char ph, int pid, int tid, uint64_t ts,
                         uint64_t origin) {
    fprintf(f, "%s\n{\"name\":", *first ? "" : ",");
    *first = false;
    prof_json_str(f, name);
    const uint64_t t = ts - origin;
    fprintf(f, ",\"cat\":\"%s\",\"ph\":\"%c\",\"pid\":%d,\"tid\":%d,\"ts\":%llu.%03u", cat, ph, pid, tid,
            (unsigned long long)(t / 1000), (unsigned)(t % 1000));
}

/* Async request tracks: per request id the open sub-spans (queue, prefill, decode), closed when
 * the request ends or at the end of the trace. */
typedef struct {
    int64_t id;
    const char *open[4];
    int n;
} prof_req;

typedef struct {
    const tn_trace_ev *e;
    int tid;
} prof_aev;

static int prof_aev_cmp(const void *a, const void *b) {
    const prof_aev *x = a, *y = b;
    if (x->e->ts != y->e->ts) return x->e->ts < y->e->ts ? -1 : 1;
    return x->tid != y->tid ? (x->tid < y->tid ? -1 : 1) : (x->e < y->e ? -1 : x->e > y->e);
}

/* The served requests' async events of every thread (a request begins on an HTTP thread and ends
 * on the engine's), in time order: an end closes what is still open of its request. */
static void prof_write_async(FILE *f, bool *first, const prof_sum *S, int pid, int64_t n_async, uint64_t t_end) {
    prof_aev *A = malloc((size_t)(n_async ? n_async : 1) * sizeof *A);
    prof_req *reqs = NULL;
    int n_req = 0, cap_req = 0;
    if (!A) return;
    int64_t n = 0;
    for (int i = 0; i < S->n_th; i++)
        for (int64_t j = 0; j < S->th[i].n && n < n_async; j++)
            if (S->th[i].ev[j].ph == TN_PH_ASYNC_BEGIN || S->th[i].ev[j].ph == TN_PH_ASYNC_END)
                A[n++] = (prof_aev){&S->th[i].ev[j], S->th[i].tid};
    qsort(A, (size_t)n, sizeof *A, prof_aev_cmp);
    const char *cat = tn_trace_kind_name(TN_TK_REQUEST);
    for (int64_t x = 0; x < n; x++) {
        const tn_trace_ev *e = A[x].e;
        const int tid = A[x].tid;
        int r = 0;
        while (r < n_req && reqs[r].id != e->a[0]) r++;
        if (r == n_req) {
            if (e->ph == TN_PH_ASYNC_END) continue;
            if (n_req == cap_req) {
                prof_req *nr = realloc(reqs, (size_t)(cap_req = cap_req ? 2 * cap_req : 16) * sizeof *nr);
                if (!nr) break;
                reqs = nr;
            }
            reqs[n_req++] = (prof_req){e->a[0], {0}, 0};
        }
        prof_req *q = &reqs[r];
        const bool whole = !strcmp(e->name, "request");
        if (e->ph == TN_PH_ASYNC_END && whole) /* close what is still open of this request */
            while (q->n > 0) {
                prof_ev_head(f, first, q->open[--q->n], cat, 'e', pid, tid, e->ts, S->t_origin);
                fprintf(f, ",\"id\":\"0x%llx\"}", (unsigned long long)e->a[0]);
            }
        if (e->ph == TN_PH_ASYNC_BEGIN && !whole && q->n < 4) q->open[q->n++] = e->name;
        if (e->ph == TN_PH_ASYNC_END && !whole) {
            int k = q->n - 1;
            while (k >= 0 && strcmp(q->open[k], e->name)) k--;
            if (k < 0) continue; /* not open: nothing to end */
            memmove(&q->open[k], &q->open[k + 1], (size_t)(q->n - k - 1) * sizeof q->open[0]);
            q->n--;
        }
        prof_ev_head(f, first, e->name, cat, (char)e->ph, pid, tid, e->ts, S->t_origin);
        fprintf(f, ",\"id\":\"0x%llx\"}", (unsigned long long)e->a[0]);
        if (e->ph == TN_PH_ASYNC_END && whole) reqs[r] = reqs[--n_req];
    }
    for (int r = 0; r < n_req; r++) { /* requests still running at the end */
        while (reqs[r].n > 0) {
            prof_ev_head(f, first, reqs[r].open[--reqs[r].n], cat, 'e', pid, 0, t_end, S->t_origin);
            fprintf(f, ",\"id\":\"0x%llx\"}", (unsigned long long)reqs[r].id);
        }
        prof_ev_head(f, first, "request", cat, 'e', pid, 0, t_end, S->t_origin);
        fprintf(f, ",\"id\":\"0x%llx\"}", (unsigned long long)reqs[r].id);
    }
    free(reqs);
    free(A);
}

static void prof_write_events(FILE *f, const prof_sum *S, int pid, const char *what) {
    bool first = true;
    fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[");
    fprintf(f, "\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":", pid);
    prof_json_str(f, what);
    fprintf(f, "}}");
    first = false;
    uint64_t t_end = S->t_origin;
    int64_t n_async = 0;
    for (int i = 0; i < S->n_th; i++) {
        const tn_trace_thread *th = &S->th[i];
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":", pid, th->tid);
        prof_json_str(f, th->name);
        fprintf(f, "}}");
        const tn_trace_ev *st[PROF_MAX_DEPTH];
        int d = 0, skipped = 0;
        for (int64_t j = 0; j < th->n; j++) {
            const tn_trace_ev *e = &th->ev[j];
            t_end = TN_MAX(t_end, e->ts);
            const char *cat = tn_trace_kind_name(e->kind);
            switch (e->ph) {
            case TN_PH_BEGIN:
                if (d == PROF_MAX_DEPTH) {
                    skipped++;
                    break;
                }
                st[d++] = e;
                prof_ev_head(f, &first, e->name, cat, 'B', pid, th->tid, e->ts, S->t_origin);
                prof_args_b(f, e);
                fputc('}', f);
                break;
            case TN_PH_END:
                if (skipped) {
                    skipped--;
                    break;
                }
                if (d == 0) break;
                d--;
                prof_ev_head(f, &first, st[d]->name, tn_trace_kind_name(st[d]->kind), 'E', pid, th->tid, e->ts, S->t_origin);
                prof_args_e(f, e);
                fputc('}', f);
                break;
            case TN_PH_COUNTER:
                prof_ev_head(f, &first, e->name, cat, 'C', pid, th->tid, e->ts, S->t_origin);
                fprintf(f, ",\"args\":{\"value\":%.6g}}", e->d[0]);
                break;
            case TN_PH_INSTANT:
                prof_ev_head(f, &first, e->name, cat, 'i', pid, th->tid, e->ts, S->t_origin);
                fprintf(f, ",\"s\":\"t\"}");
                break;
            case TN_PH_ASYNC_BEGIN:
            case TN_PH_ASYNC_END: n_async++; break; /* written below, all threads' in time order */
            default: break;
            }
        }
        const uint64_t last = th->n ? th->ev[th->n - 1].ts : S->t_origin;
        while (d > 0) { /* buffer full: the open spans end at the thread's last event */
            d--;
            prof_ev_head(f, &first, st[d]->name, tn_trace_kind_name(st[d]->kind), 'E', pid, th->tid, last, S->t_origin);
            prof_args_e(f, NULL);
            fputc('}', f);
        }
    }
    prof_write_async(f, &first, S, pid, n_async, t_end);
    fprintf(f, "\n]");
}

/* Writes path atomically (core/file.h: a temp file renamed over it when complete). Returns 0, or
 * prints the error and returns its exit code (nothing left behind). body(f, user) writes. */
static int prof_write_atomic(const char *path, void (*body)(FILE *, void *), void *user, const char *what) {
    tn_wfile w;
    tern_status s = tn_wfile_open(path, &w);
    if (s) {
        fprintf(stderr, "tern: error: profile: cannot write %s '%s': %s\n", what, path, tern_last_error());
        return TN_EXIT_IOERR;
    }
    body(w.f, user);
    if (ferror(w.f)) {
        tn_wfile_abort(&w);
        fprintf(stderr, "tern: error: profile: writing %s '%s' failed\n", what, path);
        return TN_EXIT_IOERR;
    }
    if ((s = tn_wfile_commit(&w))) {
        fprintf(stderr, "tern: error: profile: %s: %s\n", what, tern_last_error());
        return TN_EXIT_IOERR;
    }
    return TN_EXIT_OK;
}

/* Fails early (before the command runs) when the output cannot be created where asked. */
static int prof_check_writable(const char *path, const char *what) {
    tn_wfile w;
    if (tn_wfile_open(path, &w)) {
        fprintf(stderr, "tern: error: profile: cannot write %s '%s': %s\n", what, path, tern_last_error());
        return TN_EXIT_IOERR;
    }
    tn_wfile_abort(&w);
    return TN_EXIT_OK;
}

typedef struct {
    const prof_sum *S;
    const char *what;
    char *summary; /* JSON text */
} prof_trace_job;

static void prof_trace_body(FILE *f, void *user) {
    prof_trace_job *J = user;
    prof_write_events(f, J->S, (int)getpid(), J->what);
    fprintf(f, ",\n\"tern_profile\":%s}\n", J->summary);
}

typedef struct {
    const prof_sum *S;
} prof_svg_job;

static void prof_svg_body(FILE *f, void *user) {
    const prof_sum *S = ((prof_svg_job *)user)->S;
    const int rows = S->n_th;
    const int n_win = (S->win[0][1] > 0) + (S->win[1][1] > 0);
    const double h1 = 70.0 + 26.0 * rows;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1000\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            h1 * n_win + 40);
    double y = 10;
    if (S->win[0][1]) {
        tn_prof_svg_window(f, S->th, S->n_th, S->win[0][0], S->win[0][1], "one decode step (forward pass, 1 token)", y);
        y += h1;
    }
    if (S->win[1][1]) tn_prof_svg_window(f, S->th, S->n_th, S->win[1][0], S->win[1][1], "one prefill step (forward pass of the prompt)", y);
    fprintf(f, "</svg>\n");
}

/* ---- the command --------------------------------------------------------------------------- */
static void prof_usage(FILE *f) {
    fprintf(f, "usage: tern profile [-o trace.json] [--summary-only] [--json] [--svg step.svg] [--max-events N] [--no-roofline]\n"
               "                    -- generate|bench|perplexity|serve|train|finetune [their flags]\n"
               "Runs the command with tracing on; writes a Chrome/Perfetto trace (open it in ui.perfetto.dev) and prints\n"
               "a summary of where the time went (stderr; --json: one JSON line on stdout).\n"
               "  -o FILE          trace file (default trace.json)\n"
               "  --summary-only   no trace file, only the summary\n"
               "  --json           the summary as JSON on stdout\n"
               "  --svg FILE       an SVG timeline of one decode and one prefill step\n"
               "  --max-events N   events kept per thread (default %d); a full buffer stops that thread's recording\n"
               "  --no-roofline    do not measure the machine's peaks (no roofline %%)\n",
            TN_TRACE_DEFAULT_EVENTS);
}

int cmd_profile(int argc, char **argv) {
    const char *out = "trace.json", *svg = NULL;
    bool summary_only = false, as_json = false, roofline = true;
    int64_t max_events = 0;
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--")) break;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            prof_usage(stdout);
            return TN_EXIT_OK;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            TN_CLI_NEED_VAL();
            out = val;
        } else if (!strcmp(a, "--svg")) {
            TN_CLI_NEED_VAL();
            svg = val;
        } else if (!strcmp(a, "--summary-only")) {
            summary_only = true;
        } else if (!strcmp(a, "--json")) {
            as_json = true;
        } else if (!strcmp(a, "--no-roofline")) {
            roofline = false;
        } else if (!strcmp(a, "--max-events")) {
            TN_CLI_NEED_VAL();
            if (!tn_cli_parse_i64(val, 16, (int64_t)1 << 28, &max_events))
                return tn_cli_usage_error("--max-events: '%s' is not a number in 16..%lld", val, (long long)1 << 28);
        } else if (a[0] != '-') {
            return tn_cli_usage_error("profile: missing '--' before '%s' (tern profile [flags] -- %s ...)", a, a);
        } else {
            return tn_cli_usage_error("profile: unknown flag '%s' (the command to profile goes after '--'; see tern profile --help)", a);
        }
    }
    if (i >= argc) return tn_cli_usage_error("profile: missing '--' and the command to profile, e.g. tern profile -- generate -p \"hi\" -n 16");
    if (i + 1 >= argc) return tn_cli_usage_error("profile: no command after '--' (generate, bench, perplexity, serve, train or finetune)");
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {{"generate", cmd_generate}, {"bench", cmd_bench},  {"perplexity", cmd_perplexity},
                {"serve", cmd_serve},       {"train", cmd_train}, {"finetune", cmd_finetune}};
    const char *sub = argv[i + 1];
    int (*fn)(int, char **) = NULL;
    for (size_t k = 0; k < TN_ARRAY_LEN(cmds); k++)
        if (!strcmp(sub, cmds[k].name)) fn = cmds[k].fn;
    if (!fn)
        return tn_cli_usage_error("profile: cannot profile '%s' (profile runs generate, bench, perplexity, serve, train or finetune)", sub);
    int rc;
    if (!summary_only && (rc = prof_check_writable(out, "trace"))) return rc;
    if (svg && (rc = prof_check_writable(svg, "SVG"))) return rc;

    tn_trace_thread_name("main", 0);
    if (tn_trace_start(max_events) != TERN_OK) return tn_cli_fail(TERN_ERR_NOMEM, "profile");
    rc = fn(argc - i - 1, argv + i + 1);
    tn_trace_stop();
    if (rc != TN_EXIT_OK) {
        fprintf(stderr, "tern: error: profile: '%s' failed (exit %d); no trace written\n", sub, rc);
        tn_trace_reset();
        return rc;
    }
    prof_sum S;
    memset(&S, 0, sizeof S);
    rc = prof_summarize(&S, roofline);
    json_t *js = rc ? NULL : prof_summary_json(&S);
    char *summary = js ? json_dumps(js, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    if (!rc && !summary) {
        fprintf(stderr, "tern: error: profile: out of memory for the summary\n");
        rc = TN_EXIT_OSERR;
    }
    if (!rc && !summary_only) {
        char what[64];
        snprintf(what, sizeof what, "tern %s", sub);
        prof_trace_job J = {&S, what, summary};
        rc = prof_write_atomic(out, prof_trace_body, &J, "trace");
    }
    if (!rc && svg) {
        if (!S.win[0][1] && !S.win[1][1]) {
            fprintf(stderr, "tern: error: profile: no inference forward pass was traced, so there is no step to draw in '%s' "
                            "(--svg draws generate/bench/perplexity/serve steps)\n", svg);
            rc = TN_EXIT_DATAERR;
        } else {
            prof_svg_job J = {&S};
            rc = prof_write_atomic(svg, prof_svg_body, &J, "SVG");
        }
    }
    if (!rc) {
        if (as_json) printf("%s\n", summary);
        else prof_summary_text(stderr, js);
        if (!summary_only) fprintf(stderr, "tern profile: trace written to %s (open in ui.perfetto.dev)\n", out);
        if (svg) fprintf(stderr, "tern profile: timeline written to %s\n", svg);
    }
    free(summary);
    json_decref(js);
    free(S.thr);
    free(S.groups);
    tn_trace_reset();
    return rc;
}
