/*
 * bench_kern.c — kernel benchmark: a streaming-read roofline, then for every weight type and ISA
 * level the decode GEMV (n = 1) in GB/s of weights and the prefill gemm in GFLOP/s, at 1 and 2
 * threads (or --threads), printed as a table with % of the roofline.
 *
 *   bench_kern [--m M] [--k K] [--n N] [--threads T] [--types q4_0,q4_K,...] [--isa avx2,...]
 *              [--dram-mb MB] [--quick]
 *   bench_kern --iq [--m M] [--k K] [--n N] [--types iq2_xxs,...] [--quick]
 *   bench_kern --attn [--ctx T] [--types f16,q8_0,q4_0,tq2g32a,tq3g32a,tq4g32a] [--isa scalar,avx2,avx512] [--quick]
 *
 * --iq: the codebook i-quants (iq2_xxs ... iq1_m), one thread, old path against new in the same
 * process: prefill as the row-by-row vec_dot loop (tn_gemm_by_vec_dot, what prefill did before
 * the batched kernels) against the table's gemm on 256 weight rows x n activation rows, and
 * decode (n = 1) as the avx2 vec_dot against the avx512 table's, over m rows. The two are timed
 * alternately, each call on its own, best of several; only their ratio is printed (a shared
 * machine's absolute numbers are noise, the ratio of two interleaved bests much less so).
 *
 * --attn: decode attention over a cache of --ctx T positions (default 8192), one thread, every
 * K / V cache type pair (f16 / f16 through the plain kernel, the rest through attn_q; tern's tq2..tq4
 * KV types, tq<b>g32a, only when --types names them): one call is
 * one layer of the 1B-class model (32 query heads of 64 over 8 kv heads, the f16 accumulator of
 * decode), the calls cycle through 16 layers' caches (DRAM, as decode at that length reads them).
 * Printed: microseconds per layer, nanoseconds per key and query head, GB/s of K / V bytes read.
 *
 * --isa defaults to avx2,avx512 (add scalar to time the references' GEMV too).
 *
 * Two working sets per GEMV: "cache" is one m x k matrix read over and over (4096 x 4096 q4_0 is
 * 9.4 MB: it lives in a large L3), "dram" cycles through enough copies to exceed --dram-mb, as
 * decode does with a model's layers. Each is compared with the streaming read of a buffer of the
 * same size on the same number of threads. Weights are random bytes with finite scales: kernel
 * speed does not depend on the values. Every call (one GEMV over one matrix, one gemm over a
 * 256-row slice, one read of a matrix-sized chunk) is timed on its own and the fastest counts, so
 * a machine shared with other work still gives the unpreempted speed; ratios within one run are
 * the numbers to compare. Nothing here checks results: tests/kern does.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base.h"
#include "core/cpu.h"
#include "core/pool.h"
#include "kern/kern.h"
#include "quant/blocks.h"
#include "quant/quant.h"

typedef struct {
    int64_t m, k, n;
    int threads_max;
    int64_t dram_bytes;
    int quick;
    char types[256], isas[64];
} bench_opts;

/* ---- roofline: every thread sums its slice of the buffer ------------------------------------ */

typedef struct {
    const uint8_t *buf;
    size_t bytes;
    uint64_t sink[64];
} stream_arg;

static void stream_task(void *p, int ith, int nth) {
    stream_arg *a = p;
    int64_t i0, i1;
    tn_split((int64_t)(a->bytes / 64), ith, nth, 1, &i0, &i1);
    const uint64_t *q = (const uint64_t *)a->buf;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    for (int64_t c = i0; c < i1; c++) { /* one 64-byte line per step, 8 independent sums */
        const uint64_t *l = q + c * 8;
        s0 += l[0], s1 += l[1], s2 += l[2], s3 += l[3], s4 += l[4], s5 += l[5], s6 += l[6], s7 += l[7];
    }
    a->sink[ith] = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
}

/* Best GB/s of reading `chunk` bytes, over chunks that cycle through `ws` bytes (so a chunk comes
 * from wherever a working set of that size lives: cache or DRAM). Every chunk is timed on its
 * own and the fastest wins: on a shared machine a short read that was not preempted is the
 * measurement, a long average is not. */
static double roofline(tn_pool *pool, const uint8_t *buf, size_t ws, size_t chunk, double min_s) {
    const size_t nch = ws / chunk ? ws / chunk : 1;
    stream_arg a = {.buf = buf, .bytes = chunk};
    tn_pool_run(pool, stream_task, &a); /* warm up */
    double best = 1e30;
    const double t_end = tn_time_s() + min_s;
    for (size_t c = 0; tn_time_s() < t_end || c < 3 * nch; c++) {
        a.buf = buf + (c % nch) * chunk;
        const double t0 = tn_time_s();
        tn_pool_run(pool, stream_task, &a);
        const double t = tn_time_s() - t0;
        if (t < best) best = t;
    }
    return (double)chunk / best / 1e9;
}

/* ---- weights ----------------------------------------------------------------------------------- */

/* Offsets of fp16 scale fields of a block (made finite so no kernel sees NaN/Inf). */
static int fp16_offsets(tn_dtype t, int off[2]) {
    off[0] = off[1] = -1;
    switch (t) {
    case TN_Q4_0: case TN_Q5_0: case TN_Q8_0: off[0] = 0; return 1;
    case TN_Q4_1: case TN_Q5_1: case TN_Q4_K: case TN_Q5_K: off[0] = 0, off[1] = 2; return 2;
    case TN_Q2_K: off[0] = (int)offsetof(block_q2_K, d), off[1] = (int)offsetof(block_q2_K, dmin); return 2;
    case TN_Q3_K: off[0] = (int)offsetof(block_q3_K, d); return 1;
    case TN_Q6_K: off[0] = (int)offsetof(block_q6_K, d); return 1;
    case TN_IQ2_XXS: case TN_IQ2_XS: case TN_IQ2_S: case TN_IQ3_XXS: case TN_IQ3_S: case TN_IQ1_S: off[0] = 0; return 1;
    default: return 0;
    }
}

static void fill_weights(tn_dtype t, uint8_t *w, int64_t rows, int64_t k) {
    const tn_dtype_traits *tr = tn_dtype_get(t);
    const size_t rb = tn_dtype_row_size(t, k), total = rb * (size_t)rows;
    uint64_t s = 0x243F6A8885A308D3ull;
    for (size_t i = 0; i + 8 <= total; i += 8) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        memcpy(w + i, &s, 8);
    }
    if (t == TN_F32 || t == TN_F16 || t == TN_BF16) {
        for (size_t e = 0; e < total / tr->type_size; e++) {
            const float v = (float)((e * 2654435761u) % 2000) / 1000.0f - 1.0f;
            if (t == TN_F32) memcpy(w + e * 4, &v, 4);
            else {
                const uint16_t h = t == TN_F16 ? tn_fp32_to_fp16(v) : tn_fp32_to_bf16(v);
                memcpy(w + e * 2, &h, 2);
            }
        }
        return;
    }
    int off[2];
    const int nf = fp16_offsets(t, off);
    const tn_fp16 h = tn_fp32_to_fp16(0.01f);
    for (size_t b = 0; b < total / tr->type_size; b++)
        for (int f = 0; f < nf; f++) memcpy(w + b * tr->type_size + off[f], &h, 2);
    if (t == TN_IQ1_M) /* its fp16 scale is the top nibbles of the four scale words */
        for (size_t b = 0; b < total / tr->type_size; b++) {
            uint8_t *sc = w + b * tr->type_size + offsetof(block_iq1_m, scales);
            for (int q = 0; q < 4; q++) sc[2 * q + 1] = (uint8_t)((sc[2 * q + 1] & 15) | ((h >> 4 * q) & 15) << 4);
        }
}

/* ---- gemv / gemm tasks --------------------------------------------------------------------------- */

typedef struct {
    const tn_kern_slot *slot;
    int64_t m, k, n;
    const uint8_t *w;
    size_t w_rb;
    const uint8_t *x;
    size_t x_rb;
    float *y;
} mm_arg;

/* Threads split the weight rows (in multiples of 16 so tiles stay whole). */
static void mm_task(void *p, int ith, int nth) {
    const mm_arg *a = p;
    int64_t i0, i1;
    tn_split(a->m, ith, nth, 16, &i0, &i1);
    if (i1 > i0)
        a->slot->gemm(a->k, i1 - i0, a->n, a->w + (size_t)i0 * a->w_rb, a->w_rb, a->x, a->x_rb, a->y + i0, a->m);
}

/* Fastest call over `copies` weight matrices used in turn (each call timed on its own, as in
 * roofline()). */
static double time_mm(tn_pool *pool, mm_arg *a, const uint8_t *w0, size_t mat_bytes, int copies, double min_s) {
    double best = 1e30;
    a->w = w0;
    tn_pool_run(pool, mm_task, a); /* warm up */
    const double t_end = tn_time_s() + min_s;
    for (int c = 0; tn_time_s() < t_end || c < 3 * copies; c++) {
        a->w = w0 + (size_t)(c % copies) * mat_bytes;
        const double t0 = tn_time_s();
        tn_pool_run(pool, mm_task, a);
        const double t = tn_time_s() - t0;
        if (t < best) best = t;
    }
    return best;
}

#define GEMM_ROWS 256

static int listed(const char *list, const char *name) {
    if (!list[0]) return 1;
    const size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return 1;
    return 0;
}

/* ---- --iq: old path vs new kernel, alternating --------------------------------------------------- */

typedef struct {
    tn_vec_dot_fn dot; /* non-NULL: the row-by-row vec_dot loop */
    tn_gemm_fn gemm;
} iq_path;

static double iq_time(const iq_path *p, int64_t k, int64_t m, int64_t n, const uint8_t *w, size_t w_rb,
                      const uint8_t *x, size_t x_rb, float *y) {
    const double t0 = tn_time_s();
    if (p->dot) tn_gemm_by_vec_dot(p->dot, k, m, n, w, w_rb, x, x_rb, y, m);
    else p->gemm(k, m, n, w, w_rb, x, x_rb, y, m);
    return tn_time_s() - t0;
}

/* Best time of each path over `reps` alternating rounds (old first, then new, every round);
 * returns best(old) / best(new). */
static double iq_ratio(const iq_path *old, const iq_path *neu, int reps, int64_t k, int64_t m, int64_t n,
                       const uint8_t *w, size_t w_rb, const uint8_t *x, size_t x_rb, float *y) {
    double bo = 1e30, bn = 1e30;
    for (int r = 0; r < reps; r++) {
        const double to = iq_time(old, k, m, n, w, w_rb, x, x_rb, y), tn = iq_time(neu, k, m, n, w, w_rb, x, x_rb, y);
        if (to < bo) bo = to;
        if (tn < bn) bn = tn;
    }
    return bo / bn;
}

static int bench_iq(const bench_opts *o, const float *xf, uint8_t *mem, float *y, uint8_t *xq) {
    static const tn_dtype iq[] = {TN_IQ2_XXS, TN_IQ2_XS, TN_IQ2_S, TN_IQ3_XXS, TN_IQ3_S, TN_IQ1_S, TN_IQ1_M};
    const tn_kern_table *a2 = tn_kern_at(TN_ISA_AVX2), *a5 = tn_kern_at(TN_ISA_AVX512);
    if (!a2) {
        printf("SKIP: no AVX2 on this CPU: no i-quant kernels to compare\n");
        return 0;
    }
    const int reps = o->quick ? 3 : 7;
    const int64_t rows = o->m < GEMM_ROWS ? o->m : GEMM_ROWS;
    printf("i-quant kernels, 1 thread, k=%lld; ratios old/new (> 1: new is faster), best of %d alternating "
           "calls each, measured under load (shared machine)\n", (long long)o->k, reps);
    printf("%-8s | %-28s | %-28s | %s\n", "type", "prefill avx2: vec_dot loop /", "prefill avx512: vec_dot loop /",
           "decode n=1, m rows:");
    printf("%-8s | %-28s | %-28s | %s\n", "", "batched gemm", "batched gemm", "avx2 vec_dot / avx512 vec_dot");
    for (size_t ti = 0; ti < sizeof iq / sizeof iq[0]; ti++) {
        const tn_dtype wt = iq[ti];
        if (!listed(o->types, tn_dtype_name(wt))) continue;
        const size_t w_rb = tn_dtype_row_size(wt, o->k), x_rb = tn_dtype_row_size(TN_Q8_K, o->k);
        fill_weights(wt, mem, o->m, o->k);
        for (int64_t j = 0; j < o->n; j++) a2->slot[TN_Q8_K].from_float(xf + j * o->k, xq + j * x_rb, o->k);
        printf("%-8s |", tn_dtype_name(wt));
        const tn_kern_table *tabs[2] = {a2, a5};
        for (int a = 0; a < 2; a++) {
            const tn_kern_table *tb = tabs[a];
            if (!tb) {
                printf(" %-28s |", "(no avx512)");
                continue;
            }
            const iq_path old = {.dot = tb->slot[wt].vec_dot}, neu = {.gemm = tb->slot[wt].gemm};
            const double r = iq_ratio(&old, &neu, reps, o->k, rows, o->n, mem, w_rb, xq, x_rb, y);
            printf(" n=%-4lld %6.2fx (%-6s gemm) |", (long long)o->n, r, tn_isa_name(tb->slot[wt].gemm_isa));
        }
        if (a5 && a5->slot[wt].vec_dot != a2->slot[wt].vec_dot) {
            const iq_path old = {.dot = a2->slot[wt].vec_dot}, neu = {.dot = a5->slot[wt].vec_dot};
            printf(" m=%lld %6.2fx\n", (long long)o->m, iq_ratio(&old, &neu, reps, o->k, o->m, 1, mem, w_rb, xq, x_rb, y));
        } else {
            printf(" (same vec_dot)\n");
        }
    }
    return 0;
}


/* ---- --attn: decode attention per cache type ------------------------------------------------------ */

static int bench_attn(const bench_opts *o, int64_t T) {
    const int64_t hd = 64, nh = 32, nkv = 8, rep = nh / nkv, ld = nkv * hd, L = 16;
    /* tern's tq<b>g32a (tq4g32a ...) only when --types names them */
    static const int32_t types[] = {TN_F16, TN_Q8_0, TN_Q4_0, TERN_KV_TQ(2), TERN_KV_TQ(3), TERN_KV_TQ(4)};
    const int ntypes = (int)(sizeof types / sizeof *types);
    const int reps = o->quick ? 3 : 8;
    float *q = malloc((size_t)(nh * hd) * 4), *out = malloc((size_t)(nh * hd) * 4), *scr = malloc((size_t)(nh * hd) * 8);
    float *row = malloc((size_t)ld * 4);
    int32_t *blocks = malloc((size_t)((T + 15) / 16) * sizeof *blocks);
    if (!q || !out || !scr || !row || !blocks) return 1;
    for (int64_t i = 0; i < nh * hd; i++) q[i] = sinf((float)i * 0.91f);
    for (int64_t j = 0; j < (T + 15) / 16; j++) blocks[j] = (int32_t)j;
    printf("decode attention, 1 thread, %lld positions, 32 heads of 64 over 8 kv heads, %lld layers cycled; "
           "best of %d passes\n", (long long)T, (long long)L, reps);
    printf("%-5s %-5s %-7s | %9s | %12s | %8s\n", "K", "V", "isa", "us/layer", "ns/key/head", "KV GB/s");
    for (int ik = 0; ik < ntypes; ik++)
        for (int iv = 0; iv < ntypes; iv++) {
            const int32_t tk = types[ik], tv = types[iv];
            if (!listed(o->types, tn_dtype_name((uint32_t)tk)) && !listed(o->types, tn_dtype_name((uint32_t)tv))) continue;
            if ((ik >= 3 || iv >= 3) && !o->types[0]) continue;
            const size_t krb = tn_dtype_row_size((tn_dtype)tk, ld), vrb = tn_dtype_row_size((tn_dtype)tv, ld);
            const size_t lb = (krb + vrb) * (size_t)T;
            uint8_t *kv = aligned_alloc(64, (lb * (size_t)L + 63) / 64 * 64);
            if (!kv) return 1;
            const tn_kern_table *ref = tn_kern_at(TN_ISA_SCALAR);
            for (int64_t l = 0; l < L; l++)
                for (int64_t t = 0; t < T; t++) {
                    uint8_t *K = kv + (size_t)l * lb + (size_t)t * krb, *V = kv + (size_t)l * lb + (size_t)T * krb + (size_t)t * vrb;
                    for (int64_t i = 0; i < ld; i++) row[i] = sinf((float)(t * ld + i) * 0.37f + (float)l);
                    ref->slot[tk].from_float(row, K, ld);
                    for (int64_t i = 0; i < ld; i++) row[i] = cosf((float)(t * ld + i) * 0.29f + (float)l);
                    ref->slot[tv].from_float(row, V, ld);
                }
            for (int a = 0; a < (int)TN_ISA_COUNT; a++) {
                const tn_kern_table *tab = tn_kern_at((tn_isa)a);
                if (!tab || !listed(o->isas, tn_isa_name((tn_isa)a))) continue;
                const bool plain = tk == TN_F16 && tv == TN_F16;
                double best = 1e30;
                for (int r = 0; r < reps; r++)
                    for (int64_t l = 0; l < L; l++) {
                        const uint8_t *K = kv + (size_t)l * lb, *V = K + (size_t)T * krb;
                        const double t0 = tn_time_s();
                        for (int64_t g = 0; g < nkv; g++) {
                            const size_t ko = tn_kv_head_off(tk, hd, g), vo = tn_kv_head_off(tv, hd, g);
                            if (plain)
                                tab->attn(hd, T, rep, rep, q + g * rep * hd, (const uint16_t *)(K + ko), (const uint16_t *)(V + vo),
                                          ld, blocks, 16, 0.125f, true, out + g * rep * hd, scr);
                            else
                                tab->attn_q(hd, T, rep, rep, q + g * rep * hd, tk, K + ko, krb, tv, V + vo, vrb, blocks, 16,
                                            0.125f, 0.0f, true, out + g * rep * hd, scr);
                        }
                        const double s = tn_time_s() - t0;
                        if (s < best) best = s;
                    }
                printf("%-5s %-5s %-7s | %9.1f | %12.2f | %8.1f\n", tn_dtype_name((uint32_t)tk), tn_dtype_name((uint32_t)tv),
                       tn_isa_name(plain ? tab->attn_isa : tab->attn_q_isa), best * 1e6, best * 1e9 / (double)(T * nh),
                       (double)lb / best / 1e9);
            }
            free(kv);
        }
    free(q), free(out), free(scr), free(row), free(blocks);
    return 0;
}

static const tn_dtype bench_types[] = {TN_F32,  TN_F16,  TN_BF16, TN_Q8_0, TN_Q4_0, TN_Q4_1, TN_Q5_0,
                                       TN_Q5_1, TN_Q2_K, TN_Q3_K, TN_Q4_K, TN_Q5_K, TN_Q6_K};

int main(int argc, char **argv) {
    bench_opts o = {.m = 4096, .k = 4096, .n = 128, .threads_max = 2, .dram_bytes = 512ll << 20,
                    .isas = "avx2,avx512"};
    int iq_mode = 0, attn_mode = 0;
    int64_t ctx = 8192;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--m")) o.m = atoll(v), i++;
        else if (!strcmp(argv[i], "--k")) o.k = atoll(v), i++;
        else if (!strcmp(argv[i], "--n")) o.n = atoll(v), i++;
        else if (!strcmp(argv[i], "--threads")) o.threads_max = atoi(v), i++;
        else if (!strcmp(argv[i], "--dram-mb")) o.dram_bytes = atoll(v) << 20, i++;
        else if (!strcmp(argv[i], "--types")) snprintf(o.types, sizeof o.types, "%s", v), i++;
        else if (!strcmp(argv[i], "--isa")) snprintf(o.isas, sizeof o.isas, "%s", v), i++;
        else if (!strcmp(argv[i], "--quick")) o.quick = 1;
        else if (!strcmp(argv[i], "--iq")) iq_mode = 1;
        else if (!strcmp(argv[i], "--attn")) attn_mode = 1;
        else if (!strcmp(argv[i], "--ctx")) ctx = atoll(v), i++;
        else {
            fprintf(stderr, "usage: %s [--m M] [--k K] [--n N] [--threads T] [--types a,b] [--isa a,b] "
                            "[--dram-mb MB] [--quick] [--iq] [--attn [--ctx T]]\n", argv[0]);
            return 2;
        }
    }
    if (attn_mode) {
        if (ctx < 1) {
            fprintf(stderr, "bench_kern: --ctx must be >= 1\n");
            return 2;
        }
        return bench_attn(&o, ctx);
    }
    if (iq_mode) o.dram_bytes = 0; /* the i-quant comparison reads one matrix: no DRAM working set */
    if (o.k % QK_K || o.m < 1 || o.n < 1 || o.threads_max < 1) {
        fprintf(stderr, "bench_kern: k must be a multiple of 256, m, n, threads >= 1\n");
        return 2;
    }
    const double min_s = o.quick ? 0.05 : 0.2;
    const tn_cpu *cpu = tn_cpu_get();
    printf("cpu: %s, %d cpus, best ISA %s\n", cpu->brand, tn_cpu_count(), tn_isa_name(tn_cpu_isa()));
    printf("GEMV: y[m] = W[m x k] x[k], m=%lld k=%lld; gemm: n=%lld activation rows; threads split rows\n\n",
           (long long)o.m, (long long)o.k, (long long)o.n);

    int nthr[2] = {1, o.threads_max};
    const int nt_count = o.threads_max > 1 ? 2 : 1;
    tn_pool *pools[2] = {0};
    for (int t = 0; t < nt_count; t++)
        if (tn_pool_create(nthr[t], &pools[t]) != TERN_OK) {
            fprintf(stderr, "bench_kern: pool: %s\n", tern_last_error());
            return 1;
        }

    /* One big buffer serves as roofline source and as the dram-regime weight copies. */
    const size_t big = (size_t)o.dram_bytes + ((size_t)o.m * o.k * 4);
    uint8_t *mem = aligned_alloc(64, (big + 63) / 64 * 64);
    float *xf = malloc((size_t)o.k * o.n * sizeof(float));
    float *y = malloc((size_t)o.m * o.n * sizeof(float));
    uint8_t *xq = malloc((size_t)o.k * sizeof(float) * (size_t)o.n); /* f32 is the widest activation row */
    if (!mem || !xf || !y || !xq) {
        fprintf(stderr, "bench_kern: out of memory\n");
        return 1;
    }
    memset(mem, 1, big);
    for (int64_t i = 0; i < o.k * o.n; i++) xf[i] = sinf((float)i * 0.37f);
    if (iq_mode) {
        const int rc = bench_iq(&o, xf, mem, y, xq);
        for (int t = 0; t < nt_count; t++) tn_pool_free(pools[t]);
        free(mem), free(xf), free(y), free(xq);
        return rc;
    }

    /* roofline at the working-set sizes used below */
    printf("%-28s", "streaming read");
    for (int t = 0; t < nt_count; t++) printf("  %dt GB/s", nthr[t]);
    printf("\n");
    const size_t probe[] = {(size_t)o.m * o.k / 2, (size_t)o.m * o.k * 2, (size_t)o.dram_bytes};
    const char *probe_name[] = {"4-bit matrix (cache)", "16-bit matrix", "dram working set"};
    for (int p = 0; p < 3; p++) {
        printf("  %-20s %5.0f MB", probe_name[p], probe[p] / 1048576.0);
        for (int t = 0; t < nt_count; t++) printf("  %9.1f", roofline(pools[t], mem, probe[p], probe[0], min_s));
        printf("\n");
    }
    printf("\n");

    printf("%-6s %-7s %8s | %-25s | %-25s | %s\n", "type", "isa", "MB", "GEMV cache GB/s (%roof)",
           "GEMV dram GB/s (%roof)", "gemm GFLOP/s");
    printf("%-6s %-7s %8s | %-12s %-12s | %-12s %-12s |", "", "", "", "1t", "2t", "1t", "2t");
    for (int t = 0; t < nt_count; t++) printf(" %6dt", nthr[t]);
    printf("\n");
    for (size_t ti = 0; ti < sizeof bench_types / sizeof bench_types[0]; ti++) {
        const tn_dtype wt = bench_types[ti];
        if (!listed(o.types, tn_dtype_name(wt))) continue;
        const tn_dtype at = tn_dtype_get(wt)->vec_dot_type;
        const size_t w_rb = tn_dtype_row_size(wt, o.k), x_rb = tn_dtype_row_size(at, o.k);
        const size_t mat = w_rb * (size_t)o.m;
        int copies = (int)((size_t)o.dram_bytes / mat);
        if (copies < 2) copies = 2;
        if ((size_t)copies * mat > big) copies = (int)(big / mat);
        fill_weights(wt, mem, o.m, o.k);
        for (int c = 1; c < copies; c++) memcpy(mem + (size_t)c * mat, mem, mat);
        for (int a = 0; a < (int)TN_ISA_COUNT; a++) {
            const tn_kern_table *tab = tn_kern_at((tn_isa)a);
            if (!tab || !listed(o.isas, tn_isa_name((tn_isa)a))) continue;
            const tn_kern_slot *slot = &tab->slot[wt];
            if (!slot->gemm) continue;
            tab->slot[at].from_float(xf, xq, o.k); /* decode: one activation row */
            /* label the ISA the kernel really comes from (a level may keep a lower one's entry) */
            printf("%-6s %-7s %8.1f |", tn_dtype_name(wt), tn_isa_name(slot->gemm_isa), mat / 1048576.0);
            if (a != (int)slot->gemm_isa) {
                printf(" (same kernel as %s)\n", tn_isa_name(slot->gemm_isa));
                continue;
            }
            mm_arg g = {.slot = slot, .m = o.m, .k = o.k, .n = 1, .w_rb = w_rb, .x = xq, .x_rb = x_rb, .y = y};
            for (int reg = 0; reg < 2; reg++) {
                const int cp = reg == 0 ? 1 : copies;
                for (int t = 0; t < 2; t++) {
                    if (t >= nt_count) {
                        printf(" %-12s", "-");
                        continue;
                    }
                    const double s = time_mm(pools[t], &g, mem, mat, cp, min_s);
                    const double gbs = mat / s / 1e9;
                    const double roof = roofline(pools[t], mem, mat * cp, mat, min_s / 2);
                    printf(" %5.1f (%3.0f%%)", gbs, 100.0 * gbs / roof);
                }
                printf(" |");
            }
            /* prefill: n activation rows; skipped for the scalar references (too slow to matter) */
            if (a == (int)TN_ISA_SCALAR) {
                printf(" (scalar: gemm = vec_dot loop)\n");
                continue;
            }
            for (int64_t j = 0; j < o.n; j++) tab->slot[at].from_float(xf + j * o.k, xq + j * x_rb, o.k);
            /* timed on a slice of GEMM_ROWS weight rows (a few ms per call) */
            const int64_t rows = o.m < GEMM_ROWS ? o.m : GEMM_ROWS;
            mm_arg gm = {.slot = slot, .m = rows, .k = o.k, .n = o.n, .w_rb = w_rb, .x = xq, .x_rb = x_rb, .y = y};
            for (int t = 0; t < nt_count; t++) {
                const double s = time_mm(pools[t], &gm, mem, w_rb * (size_t)rows, (int)(o.m / rows), min_s);
                printf(" %7.1f", 2.0 * rows * o.n * o.k / s / 1e9);
            }
            printf("\n");
        }
    }
    for (int t = 0; t < nt_count; t++) tn_pool_free(pools[t]);
    free(mem), free(xf), free(y), free(xq);
    return 0;
}
