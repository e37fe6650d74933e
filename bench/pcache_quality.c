/*
 * pcache_quality — what the disk prompt cache's lossy qualities cost in accuracy and what they
 * save in bytes, measured through the cache itself: a prefix of P tokens is computed, stored
 * with `--prompt-cache-quality Q` (tn_pcache_store), loaded into a fresh context
 * (tn_pcache_load) and the next N tokens of the text are run on top of it (teacher-forced). Their
 * next-token distributions are compared with those of the same tokens computed without the cache
 * (KL divergence, top-1 agreement), and the bytes on disk per token with the f16 KV's.
 *
 * Averaged over W windows of the text (window w starts at token SKIP + w * (P + N): tune on one
 * SKIP, report on another). The in-memory cache types q8_0 and q4_0 (-ctk/-ctv) are measured the
 * same way for comparison (their bytes are those of the KV in memory, per token), and so is the
 * prefix alone rounded as q8_0 / q4_0 rows (round_prefix: the error those types put where the disk
 * cache puts its own, with the f16 kernels; works at any head size whose rows are whole blocks).
 *
 * usage: pcache_quality MODEL TEXT [P=64] [N=64] [W=8] [THREADS=2] [options]
 *   --skip T            windows start T tokens into the text (default 0)
 *   --high S, --balanced S, --medium S  that quality's steps instead of the built-in ones (tn_pc_steps), S =
 *                       dK,dV,chK,chV[,mul,n_first[,tiltK,tiltV]]: plane and channel steps per
 *                       RMS for K and V, layers < n_first mul times finer, the plane steps'
 *                       tilts (tn_pc_steps)
 *   --pre-rope          lossy keys coded before RoPE (re-applied at load), for comparison
 *   --only high|balanced|medium  that lossy quality only (no lossless row, no memory types)
 *   --try S             (repeatable) a lossy row with steps S instead of the qualities' rows and
 *                       the memory types: sweeps share one reference run
 *   --kv T              the disk rows' runs keep their KV in memory as T (q8_0, q4_0, tq4, ...;
 *                       -ctk/-ctv T, rotation auto) instead of f16: what the prompt cache stores
 *                       and loads for such a cache (the reference stays f16)
 * Not a test: no thresholds; docs/prompt-cache.md reports its output.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/file.h"
#include "core/fp16.h"
#include "model/ctx.h"
#include "model/pcache.h"
#include "tern/tern.h"

static int die(const char *what) {
    fprintf(stderr, "pcache_quality: %s: %s\n", what, tern_last_error());
    return 1;
}

/* A context with room for the prefix and the tokens after it, logits for every row. */
static tern_ctx *make_ctx(const tern_model *m, int32_t n_ctx, int threads, int32_t kv_type) {
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = n_ctx;
    cp.n_threads = threads;
    cp.logits_all = true;
    cp.type_k = cp.type_v = kv_type;
    tern_ctx *c = NULL;
    return tern_ctx_create(m, &cp, &c) ? NULL : c;
}

/* softmax of logits (double) into p */
static void softmax(const float *l, int32_t nv, double *p) {
    double mx = -INFINITY, s = 0;
    for (int32_t j = 0; j < nv; j++) mx = fmax(mx, l[j]);
    for (int32_t j = 0; j < nv; j++) s += p[j] = exp((double)l[j] - mx);
    for (int32_t j = 0; j < nv; j++) p[j] /= s;
}

typedef struct { double kl_sum, kl_max; int64_t agree, n; } score;

/* Scores the logits of c's last decode (n rows) against the reference rows. */
static void compare(const tern_ctx *c, const float *ref, int32_t n, int32_t nv, double *p, double *q, score *sc) {
    for (int32_t i = 0; i < n; i++) {
        const float *l = tern_get_logits(c, i), *r = ref + (size_t)i * nv;
        softmax(r, nv, p);
        softmax(l, nv, q);
        double kl = 0;
        int32_t ar = 0, al = 0;
        for (int32_t j = 0; j < nv; j++) {
            if (p[j] > 0) kl += p[j] * (log(p[j]) - log(fmax(q[j], 1e-300)));
            if (r[j] > r[ar]) ar = j;
            if (l[j] > l[al]) al = j;
        }
        sc->kl_sum += kl, sc->kl_max = fmax(sc->kl_max, kl), sc->agree += ar == al, sc->n++;
    }
}

static void row(const char *name, double bpt, double f16_bpt, const score *sc) {
    printf("| %s | %.0f | %.2fx smaller | %.2e | %.2e | %.1f%% |\n", name, bpt, f16_bpt / bpt, sc->kl_sum / (double)sc->n,
           sc->kl_max, 100.0 * (double)sc->agree / (double)sc->n);
}

/* Rounds the K and V rows of positions [0, P) of c's f16 cache as ggml's q8_0 (bits 8) or q4_0
 * (bits 4) would store them (blocks of 32 along the row: scale d = amax / 127 as f16, values
 * round(x / d) * d; q4_0: d = the largest-magnitude value / -8 as f16, values min(15, (int)(x / d
 * + 8.5)) - 8 times d), written out here from ggml's reference quantizers: the error of those types
 * on the prefix alone, as the disk cache has it, for models whose head size the in-memory types
 * refuse (stories260K: 8). false when a row is not a whole number of blocks. */
static bool round_prefix(tern_ctx *c, int32_t P, int bits) {
    const int64_t kvd = (int64_t)c->hp.n_head_kv * c->hp.head_dim;
    if (kvd % 32) return false;
    for (int32_t il = 0; il < c->hp.n_layer; il++)
        for (int kv = 0; kv < 2; kv++) {
            tn_fp16 *x = (tn_fp16 *)(kv ? c->v_cache : c->k_cache) + c->kv_off[il] * kvd;
            for (int64_t b = 0; b < (int64_t)P * kvd; b += 32) {
                float v[32], amax = 0, mx = 0;
                for (int j = 0; j < 32; j++) {
                    v[j] = tn_fp16_to_fp32(x[b + j]);
                    if (fabsf(v[j]) > amax) amax = fabsf(v[j]), mx = v[j];
                }
                const float d0 = bits == 8 ? amax / 127 : mx / -8, id = d0 != 0 ? 1.0f / d0 : 0; /* ggml: 1 / the unrounded scale */
                const float d = tn_fp16_to_fp32(tn_fp32_to_fp16(d0));
                for (int j = 0; j < 32; j++) {
                    const float q = bits == 8 ? roundf(v[j] * id) : (float)TN_MIN(15, (int)(v[j] * id + 8.5f)) - 8;
                    x[b + j] = tn_fp32_to_fp16(q * d);
                }
            }
        }
    return true;
}

/* "dK,dV,chK,chV[,mul,n_first[,tiltK,tiltV[,wK,wV]]]" into st; false when malformed */
static bool parse_steps(const char *v, tn_pc_steps *st) {
    float mul = 1, tk = 0, tv = 0, wk = 0, wv = 0;
    int nf = 0;
    const int k = sscanf(v, "%f,%f,%f,%f,%f,%d,%f,%f,%f,%f", &st->div[0], &st->div[1], &st->div_ch[0], &st->div_ch[1], &mul, &nf, &tk,
                         &tv, &wk, &wv);
    st->mul_first = mul, st->n_first = nf, st->tilt[0] = tk, st->tilt[1] = tv, st->wexp[0] = wk, st->wexp[1] = wv;
    return (k == 4 || k == 6 || k == 8 || k == 10) && st->div[0] >= 0 && st->div[1] >= 0 && st->div_ch[0] >= 0 && st->div_ch[1] >= 0 && mul > 0;
}

/* A lossy quality's value from its name; -1 if none (lossless has no steps). */
static int quality_of(const char *name) {
    const int q = tn_pc_quality_from_name(name);
    return q > TN_PC_LOSSLESS ? q : -1;
}

int main(int argc, char **argv) {
    const char *pos[8] = {0}, *try_arg[64];
    tn_pc_steps tries[64];
    int npos = 0, only = 0, ntry = 0;
    int32_t skip = 0, kvt = TERN_KV_F16;
    bool pre_rope = false, set[TN_PC_N_QUALITY] = {false};
    tn_pc_steps steps[TN_PC_N_QUALITY];
    for (int q = 0; q < TN_PC_N_QUALITY; q++) steps[q] = tn_pc_steps_of((tn_pc_quality)q);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool bad = false;
        if (!strcmp(a, "--skip") && v) skip = atoi(v), i++, bad = skip < 0;
        else if (!strncmp(a, "--", 2) && quality_of(a + 2) > 0 && v) {
            const int q = quality_of(a + 2);
            bad = !parse_steps(v, &steps[q]), set[q] = true, i++;
        } else if (!strcmp(a, "--try") && v && ntry < 64) {
            tries[ntry] = tn_pc_steps_of(TN_PC_HIGH), try_arg[ntry] = v;
            bad = !parse_steps(v, &tries[ntry++]), i++;
        } else if (!strcmp(a, "--pre-rope")) pre_rope = true;
        else if (!strcmp(a, "--kv") && v) kvt = tern_kv_type_from_name(v), i++, bad = kvt < 0;
        else if (!strcmp(a, "--only") && v) only = quality_of(v), i++, bad = only <= 0;
        else if (a[0] != '-' && npos < 8) pos[npos++] = a;
        else bad = true;
        if (bad) return fprintf(stderr, "pcache_quality: bad argument '%s'%s%s\n", a, v ? " " : "", v ? v : ""), 64;
    }
    if (npos < 2) {
        fprintf(stderr, "usage: %s MODEL TEXT [P=64] [N=64] [W=8] [THREADS=2] [--skip T] [--high|--balanced|--medium dK,dV,chK,chV[,mul,n_first[,tK,tV]]] [--pre-rope] [--only high|balanced|medium] [--try S]... [--kv T]\n", argv[0]);
        return 64;
    }
    for (int q = 1; q < TN_PC_N_QUALITY; q++) steps[q].keys_pre_rope = pre_rope;
    for (int k = 0; k < ntry; k++) tries[k].keys_pre_rope = pre_rope;
    if (ntry) only = -1; /* the tries' rows only */
    const int32_t P = npos > 2 ? atoi(pos[2]) / 16 * 16 : 64, N = npos > 3 ? atoi(pos[3]) : 64, W = npos > 4 ? atoi(pos[4]) : 8;
    const int threads = npos > 5 ? atoi(pos[5]) : 2;
    if (P < 16 || N < 1 || W < 1) return fprintf(stderr, "pcache_quality: P >= 16, N >= 1, W >= 1\n"), 64;
    tern_model_params mp;
    tern_model_params_init(&mp);
    tern_model *m;
    if (tern_model_load(pos[0], &mp, &m)) return die(pos[0]);
    tn_map tm;
    if (tn_map_open(pos[1], true, &tm)) return die(pos[1]);
    const char *text = (const char *)tm.data;
    size_t len = tm.size;
    const size_t want = ((size_t)W * (size_t)(P + N) + (size_t)skip) * 16 + 4096; /* enough text */
    if (len > want) len = want;
    tern_token *toks = malloc(sizeof *toks * (len + 2));
    int32_t nt = 0;
    if (tern_tokenize(m, text, len, true, false, toks, (int32_t)len + 2, &nt)) return die("tokenize");
    if (nt < skip + W * (P + N)) return fprintf(stderr, "pcache_quality: %d tokens in the text, need %d\n", nt, skip + W * (P + N)), 65;
    const int32_t nv = tern_model_n_vocab(m);
    float *ref = malloc(sizeof *ref * (size_t)W * (size_t)N * (size_t)nv);
    double *p = malloc(sizeof *p * (size_t)nv), *q = malloc(sizeof *q * (size_t)nv);
    for (int32_t w = 0; w < W; w++) { /* the reference: f16 KV, no cache */
        const tern_token *t = toks + skip + (size_t)w * (P + N);
        tern_ctx *c = make_ctx(m, P + N, threads, TERN_KV_F16);
        if (!c || tern_decode(c, t, P) || tern_decode(c, t + P, N)) return die("reference run");
        for (int32_t i = 0; i < N; i++) memcpy(ref + ((size_t)w * N + i) * nv, tern_get_logits(c, i), sizeof *ref * (size_t)nv);
        tern_ctx_free(c);
    }
    printf("%s: %d windows of a %d-token prefix and %d tokens after it, from token %d%s\n", pos[0], W, P, N, skip,
           pre_rope ? "; keys coded before RoPE" : "");
    for (int q = 1; q < TN_PC_N_QUALITY; q++)
        if (set[q])
            printf("%s steps: K %g/%g tilt %g, V %g/%g tilt %g, layers < %d x%g\n", tn_pc_quality_name((tn_pc_quality)q), steps[q].div[0],
                   steps[q].div_ch[0], steps[q].tilt[0], steps[q].div[1], steps[q].div_ch[1], steps[q].tilt[1], steps[q].n_first,
                   steps[q].mul_first);
    printf("| KV | bytes/token | vs f16 KV | mean KLD | max KLD | top-1 agreement |\n|---|---:|---:|---:|---:|---:|\n");
    double f16_bpt = 0;
    static const int order[TN_PC_N_QUALITY] = {TN_PC_LOSSLESS, TN_PC_HIGH, TN_PC_BALANCED, TN_PC_MEDIUM};
    for (int oi = 0; oi < TN_PC_N_QUALITY + ntry; oi++) {
        const int qi = oi < TN_PC_N_QUALITY ? order[oi] : oi; /* a quality, or TN_PC_N_QUALITY + a try */
        if (qi < TN_PC_N_QUALITY && only && qi != only) continue;
        char dir[] = "/tmp/tern-pcq-XXXXXX", name[160];
        if (!mkdtemp(dir)) return fprintf(stderr, "pcache_quality: mkdtemp failed\n"), 74;
        tn_pcache *pc;
        tern_ctx *c0 = make_ctx(m, P + N, threads, kvt); /* the rows the cache is opened for */
        if (!c0) return die("context");
        if (tn_pcache_open(m, c0, dir, 0, qi < TN_PC_N_QUALITY ? (tn_pc_quality)qi : TN_PC_HIGH, &pc)) return die("prompt cache");
        tern_ctx_free(c0);
        tn_pcache_set_steps(pc, qi < TN_PC_N_QUALITY ? &steps[qi] : &tries[qi - TN_PC_N_QUALITY]);
        snprintf(name, sizeof name, "disk: %s%s%s%s", qi < TN_PC_N_QUALITY ? tn_pc_quality_name((tn_pc_quality)qi) : "steps ", qi < TN_PC_N_QUALITY ? "" : try_arg[qi - TN_PC_N_QUALITY],
                 kvt != TERN_KV_F16 ? ", rows " : "", kvt != TERN_KV_F16 ? tern_kv_type_name(kvt) : "");
        score sc = {0, 0, 0, 0};
        for (int32_t w = 0; w < W; w++) {
            const tern_token *t = toks + skip + (size_t)w * (P + N);
            tern_ctx *c = make_ctx(m, P + N, threads, kvt);
            if (!c || tern_decode(c, t, P) || tn_pcache_store(pc, c, t, P)) return die("store run");
            tern_ctx_free(c);
            c = make_ctx(m, P + N, threads, kvt);
            int32_t got = 0;
            if (!c || tn_pcache_load(pc, c, t, P + 1, 0, &got)) return die("load");
            if (got != P) return fprintf(stderr, "pcache_quality: loaded %d of %d tokens\n", got, P), 70;
            if (tern_decode(c, t + P, N)) return die("run after load");
            compare(c, ref + (size_t)w * N * nv, N, nv, p, q, &sc);
            tern_ctx_free(c);
        }
        const tn_pcache_stats *st = tn_pcache_get_stats(pc);
        f16_bpt = (double)st->f16_bytes_per_token;
        row(name, (double)st->bytes_stored / ((double)P * W), f16_bpt, &sc);
        tn_pcache_free(pc);
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd)) fprintf(stderr, "pcache_quality: could not remove %s\n", dir);
    }
    for (int bits = 8; bits >= 4 && !only; bits -= 4) { /* the prefix rounded as q8_0 / q4_0 rows (no kernel change) */
        score sc = {0, 0, 0, 0};
        bool ok = true;
        for (int32_t w = 0; w < W && ok; w++) {
            const tern_token *t = toks + skip + (size_t)w * (P + N);
            tern_ctx *c = make_ctx(m, P + N, threads, TERN_KV_F16);
            if (!c || tern_decode(c, t, P)) return die("rounded-prefix run");
            if ((ok = round_prefix(c, P, bits))) {
                if (tern_decode(c, t + P, N)) return die("rounded-prefix run");
                compare(c, ref + (size_t)w * N * nv, N, nv, p, q, &sc);
            }
            tern_ctx_free(c);
        }
        char name[64];
        snprintf(name, sizeof name, "prefix rounded as q%d_0", bits);
        if (ok) row(name, bits == 8 ? f16_bpt * 34 / 64 : f16_bpt * 18 / 64, f16_bpt, &sc);
    }
    static const int32_t kt[] = {TERN_KV_Q8_0, TERN_KV_Q4_0};
    for (int k = 0; k < 2 && !only; k++) { /* the in-memory cache types, for comparison */
        score sc = {0, 0, 0, 0};
        double bpt = 0;
        for (int32_t w = 0; w < W; w++) {
            const tern_token *t = toks + skip + (size_t)w * (P + N);
            tern_ctx *c = make_ctx(m, P + N, threads, kt[k]);
            if (!c) {
                printf("| memory: %s | (not available: %s) | | | | |\n", tern_kv_type_name(kt[k]), tern_last_error());
                break;
            }
            if (tern_decode(c, t, P) || tern_decode(c, t + P, N)) return die("quantized-cache run");
            compare(c, ref + (size_t)w * N * nv, N, nv, p, q, &sc);
            bpt = (double)tern_ctx_kv_bytes(c) / (P + N);
            tern_ctx_free(c);
        }
        char name[64];
        snprintf(name, sizeof name, "memory: %s", tern_kv_type_name(kt[k]));
        if (sc.n) row(name, bpt, f16_bpt, &sc);
    }
    free(ref), free(p), free(q), free(toks);
    tn_map_close(&tm);
    tern_model_free(m);
    return 0;
}
