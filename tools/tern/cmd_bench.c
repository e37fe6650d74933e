/*
 * cmd_bench.c — `tern bench`: llama-bench-compatible prompt-processing (ppN) and generation
 * (tgN) throughput, next to the machine's measured peaks in the same run — streaming read
 * bandwidth (1 thread and the run's threads), f32 FMA GFLOP/s and int8-dot GOP/s (kern/peak.h)
 * — and the share of its roofline each run reached: tg against the read bandwidth (bytes of
 * weights read per token x tokens/s) measured during each repetition (single 256 MiB read passes
 * interleaved with the decode, one before the first token, one after every 0.1 s of decoding and
 * one after the last token; each repetition's GB/s over the mean of its passes, so a neighbour
 * that takes bandwidth for a while moves both sides, and both sides are means over the same
 * seconds — a best-of-several probe picks the moments nothing else read), pp against the compute peak
 * of its weights (int8 dot for quantized weights, f32 FMA otherwise; 2 x matrix parameters per
 * token).
 * Mixture-of-experts files: a token reads the dense weights and its experts' slices only, so the
 * bytes per token are those (the distinct experts run per decoded token, from the context's
 * usage counters, model/ctx.h) and pp's ops count the parameters a token is routed through; the
 * output adds every weight's bytes, the tg roofline in tokens/s and how often each expert was
 * selected during the bench.
 *
 * `--sweep-bits` takes an f16/f32 model, quantizes it to tq1..tq8 (g64a by default) one at a
 * time into a temporary directory (removed afterwards) and benches each: tokens/s, bytes/token,
 * GB/s and % roofline per width.
 *
 * Timing excludes tokenization and sampling (as llama-bench does); one warm-up run first.
 * Output: markdown table (default) or JSON (-o json) on stdout; progress on stderr.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_spec.h"
#include "core/cpu.h"
#include "fmt/gguf.h"
#include "kern/peak.h"
#include "cuda/cuda.h"
#include "model/ctx.h"
#include "model/model.h"
#include "quant/tq.h"

#define BENCH_BW_BYTES ((size_t)512 << 20) /* read probe: 512 MiB, far past the caches */
/* tg: single read passes interleaved with the decode: on a machine shared with other work the
 * bandwidth moves from second to second, so each repetition is set against the mean of the
 * passes taken among its tokens (one before, one after every BENCH_BW_EVERY_S of decoding, one
 * after; the passes' time is not counted as decoding) */
#define BENCH_BW_NEAR_BYTES ((size_t)256 << 20)
#define BENCH_BW_EVERY_S 0.1

typedef struct {
    double bw1, bwn;    /* read GB/s, 1 thread and the run's threads */
    double fma, dot;    /* f32 GFLOP/s, int8 GOP/s, the run's threads */
    int threads;
} peaks;

typedef struct {
    char test[48];
    int n_prompt, n_gen, n_depth;
    double mean, sd;
    double rate;     /* tg: GB/s of weights; pp: GOP/s of matrix work */
    double pct_roof; /* of the read bandwidth (tg) / compute peak (pp); 0 = not measured */
    double bw_during; /* tg: mean read GB/s of the passes interleaved with the decode; 0 = none */
} bench_row;

typedef struct {
    char desc[160];
    double size, params, tok_bytes, mat_ops; /* bytes of weights, parameters, bytes/token, ops/token */
    bool quantized;                          /* matrices in a quantized type: int8 peak applies */
    int threads;
    /* mixture of experts (n_expert > 0): a decoded token reads the dense weights and, per layer,
     * the slices of the experts it is routed to. tok_bytes is then the measured active bytes (the
     * distinct experts run per decoded token, counted in tn_blk_moe), or the static estimate
     * (n_expert_used of n_expert) when no decode was counted (-n 0, --device cuda). */
    double all_bytes;      /* every weight a token could read: dense + all experts            */
    double exp_bytes;      /* of the expert matrices (the *_exps tensors)                    */
    double static_bytes;   /* dense + n_expert_used / n_expert of the experts                */
    double measured_bytes; /* dense + the experts' slices actually run per decoded token (0: none) */
    int32_t n_layer, n_expert, n_expert_used;
    uint64_t *usage;        /* [n_layer][n_expert] routed rows per expert over the whole bench (malloc) */
    uint64_t usage_tokens;  /* tokens routed through each layer over the whole bench           */
    bool gpu_persist;       /* --device cuda: one-token steps ran as one persistent kernel (TERN_CUDA_PERSIST=1) */
} model_info;

typedef struct {
    int64_t n_prompt, n_gen, reps, threads, n_batch;
    int64_t n_depth; /* -d: tokens in the cache before each test (llama-bench's -d), filled once */
    bool no_repack;
    int32_t device, ngl; /* --device cuda: the GPU's peaks replace the CPU's (gpu_peaks) */
    const tn_cli_lora *lora; /* --lora: adapters applied in the plain CPU bench (paths, scales)     */
    int32_t type_k, type_v; /* -ctk, -ctv (0: f16) */
    int32_t kv_rot;         /* --kv-rotate (0: auto) */
    uint64_t hot_experts;   /* --hot-experts (bytes; 0: off) */
} bench_opts;

/* --device cuda: the card's copy bandwidth (read + write, own kernel) and fp16 cuBLAS peak */
typedef struct {
    double copy_gbs, f16_tflops;
} gpu_peaks;

static void stats(const double *v, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) q += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0.0;
}

static void measure_peaks(int threads, peaks *pk) {
    fprintf(stderr, "tern bench: measuring the machine (read bandwidth 1 and %d threads, FMA, int8 dot)...\n", threads);
    pk->threads = threads;
    pk->bw1 = tn_peak_read_gbs(1, BENCH_BW_BYTES, 5);
    pk->bwn = threads == 1 ? pk->bw1 : tn_peak_read_gbs(threads, BENCH_BW_BYTES, 5);
    pk->fma = tn_peak_fma_gflops(threads);
    pk->dot = tn_peak_dot_gops(threads);
}

/* The MoE fields of mi from the model (after tok_bytes): expert bytes and the static estimate of
 * a decoded token's reads; tok_bytes becomes that estimate. A dense model: no experts. */
static void moe_bytes(const tern_model *m, model_info *mi) {
    mi->all_bytes = mi->static_bytes = mi->tok_bytes;
    mi->exp_bytes = mi->measured_bytes = 0;
    mi->n_layer = m->hp.n_layer, mi->n_expert = m->hp.n_expert, mi->n_expert_used = m->hp.n_expert_used;
    mi->usage = NULL, mi->usage_tokens = 0;
    if (mi->n_expert <= 0) return;
    for (int32_t il = 0; il < m->hp.n_layer; il++)
        for (int r = 0; r < TN_ROLE_N_LAYER; r++)
            if (tn_roles[r].ne2 == TN_DIM_EXPERT) mi->exp_bytes += (double)m->layers[il].w[r].nbytes;
    mi->static_bytes = mi->all_bytes - mi->exp_bytes + mi->exp_bytes * mi->n_expert_used / mi->n_expert;
    mi->tok_bytes = mi->static_bytes;
}

/* Expert usage over the bench (mi->usage): each (layer, expert)'s share of its layer's routed
 * rows, min / max over all of them, and how many received none. false: no usage counted. */
static bool usage_stats(const model_info *mi, double *lo, double *hi, int64_t *never, uint64_t *rows) {
    if (!mi->usage || !mi->usage_tokens) return false;
    const double per_layer = (double)mi->usage_tokens * mi->n_expert_used;
    *lo = INFINITY, *hi = 0, *never = 0, *rows = 0;
    for (int64_t i = 0; i < (int64_t)mi->n_layer * mi->n_expert; i++) {
        const double sh = (double)mi->usage[i] / per_layer;
        *lo = sh < *lo ? sh : *lo, *hi = sh > *hi ? sh : *hi;
        *never += mi->usage[i] == 0, *rows += mi->usage[i];
    }
    return true;
}

/* MoE: the JSON members (after a ", ") of the bytes a decoded token reads, the tg roofline in
 * tokens/s at bw GB/s (0: not measured) and the expert usage; nothing for a dense model. */
static void print_moe_json(const model_info *mi, double bw) {
    if (mi->n_expert <= 0) return;
    printf(", \"n_expert\": %d, \"n_expert_used\": %d, \"bytes_per_token_all\": %.0f, \"expert_bytes\": %.0f, "
           "\"bytes_per_token_active_static\": %.0f, \"bytes_per_token_active_measured\": %.0f, \"roofline_tg_ts\": %.3f",
           mi->n_expert, mi->n_expert_used, mi->all_bytes, mi->exp_bytes, mi->static_bytes, mi->measured_bytes,
           bw > 0 ? bw * 1e9 / mi->tok_bytes : 0.0);
    double lo, hi;
    int64_t never;
    uint64_t rows;
    if (!usage_stats(mi, &lo, &hi, &never, &rows)) return;
    printf(", \"expert_usage\": {\"tokens\": %llu, \"routed_rows\": %llu, \"min_share\": %.6f, \"max_share\": %.6f, "
           "\"uniform_share\": %.6f, \"never_used\": %lld, \"per_layer\": [",
           (unsigned long long)mi->usage_tokens, (unsigned long long)rows, lo, hi, 1.0 / mi->n_expert, (long long)never);
    for (int32_t il = 0; il < mi->n_layer; il++) {
        printf("%s[", il ? ", " : "");
        for (int32_t e = 0; e < mi->n_expert; e++)
            printf("%s%llu", e ? ", " : "", (unsigned long long)mi->usage[(int64_t)il * mi->n_expert + e]);
        printf("]");
    }
    printf("]}");
}

/* MoE: the markdown lines of the same; nothing for a dense model. */
static void print_moe_md(const model_info *mi, double bw) {
    if (mi->n_expert <= 0) return;
    printf("\nexperts: %d, %d per token; a decoded token reads %.2f MiB of the %.2f MiB it could (dense %.2f MiB + experts "
           "%.2f of %.2f MiB: %s)", mi->n_expert, mi->n_expert_used, mi->tok_bytes / 1048576.0, mi->all_bytes / 1048576.0,
           (mi->all_bytes - mi->exp_bytes) / 1048576.0, (mi->tok_bytes - mi->all_bytes + mi->exp_bytes) / 1048576.0,
           mi->exp_bytes / 1048576.0,
           mi->measured_bytes > 0 ? "the distinct experts run per decoded token, counted" : "n_expert_used / n_expert, not counted");
    if (bw > 0) printf("; tg roofline at %.1f GB/s: %.1f t/s (all weights: %.1f t/s)", bw, bw * 1e9 / mi->tok_bytes, bw * 1e9 / mi->all_bytes);
    printf("\n");
    double lo, hi;
    int64_t never;
    uint64_t rows;
    if (usage_stats(mi, &lo, &hi, &never, &rows))
        printf("expert usage over the bench's %llu tokens (%llu routed rows): each (layer, expert)'s share of its layer's rows "
               "%.2f%% .. %.2f%% (uniform %.2f%%), %lld of %lld never selected\n",
               (unsigned long long)mi->usage_tokens, (unsigned long long)rows, 100.0 * lo, 100.0 * hi, 100.0 / mi->n_expert,
               (long long)never, (long long)mi->n_layer * mi->n_expert);
}

/* Loads path, runs pp and tg (whichever is > 0), fills rows (up to 2) and mi. */
static int bench_model(const char *path, const bench_opts *o, const peaks *pk, bench_row *rows, int *nrows,
                       model_info *mi) {
    *nrows = 0;
    tern_model *m = NULL;
    tern_model_params mp;
    tern_model_params_init(&mp);
    mp.repack = !o->no_repack && o->device == TERN_DEVICE_CPU;
    mp.hot_experts = o->hot_experts;
    tern_status s = tern_model_load(path, &mp, &m);
    if (s) return tn_cli_fail(s, "loading the model");
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    if (o->threads) cp.n_threads = (int32_t)o->threads;
    cp.n_ctx = (int32_t)(o->n_depth + o->n_prompt + o->n_gen + 1);
    cp.n_batch = (int32_t)o->n_batch;
    cp.device = o->device;
    cp.n_gpu_layers = o->ngl;
    cp.type_k = o->type_k, cp.type_v = o->type_v, cp.kv_rotate = o->kv_rot;
    tern_ctx *c = NULL;
    if ((s = tern_ctx_create(m, &cp, &c))) {
        tern_model_free(m);
        return tn_cli_fail(s, "creating the context");
    }
    tn_cli_lora lora = {0}; /* this model's adapters (the paths stay the caller's) */
    if (o->lora && o->lora->n) {
        lora = *o->lora;
        memset(lora.a, 0, sizeof lora.a);
        const int lrc = tn_cli_lora_open(&lora, m, c);
        if (lrc != TN_EXIT_OK) {
            for (int i = 0; i < lora.n; i++) tern_lora_free(lora.a[i]);
            tern_ctx_free(c), tern_model_free(m);
            return lrc;
        }
        char desc[1024];
        tn_cli_lora_desc(&lora, desc, sizeof desc);
        fprintf(stderr, "tern bench: with adapters%s\n", desc);
    }
    const int32_t nv = tern_model_n_vocab(m);
    const int64_t nmax = o->n_prompt > o->n_gen ? o->n_prompt : o->n_gen, depth = o->n_depth;
    tern_token *toks0 = malloc((size_t)(depth + nmax + 1) * sizeof *toks0), *toks = toks0 ? toks0 + depth : NULL;
    double *tv = malloc((size_t)o->reps * sizeof *tv), *bw = calloc((size_t)o->reps, sizeof *bw);
    /* no memory for the read passes: tokens/s without the tg roofline */
    tn_read_probe *probe = pk && o->n_gen > 0 ? tn_read_probe_new(cp.n_threads, BENCH_BW_NEAR_BYTES) : NULL;
    if (pk && o->n_gen > 0 && !probe)
        fprintf(stderr, "tern bench: no memory for the %zu MiB read passes; tg roofline not measured\n",
                BENCH_BW_NEAR_BYTES >> 20);
    if (!toks || !tv || !bw) {
        free(toks0), free(tv), free(bw), tn_read_probe_free(probe);
        for (int i = 0; i < lora.n; i++) tern_lora_free(lora.a[i]);
        tern_ctx_free(c), tern_model_free(m);
        return tn_cli_fail(TERN_ERR_NOMEM, "benchmark buffers");
    }
    uint64_t x = 12345;
    for (int64_t i = 0; i <= depth + nmax; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        toks0[i] = (tern_token)((x >> 33) % (uint64_t)nv);
    }
    if (depth > 0) { /* the cache filled once; every repetition truncates back to it */
        fprintf(stderr, "tern bench: filling the cache with %lld tokens\n", (long long)depth);
        s = tern_decode(c, toks0, (int32_t)depth);
    }
    snprintf(mi->desc, sizeof mi->desc, "%s", tern_model_desc(m));
    mi->gpu_persist = false;
    mi->size = (double)tern_model_size_bytes(m);
    mi->params = (double)tern_model_n_params(m);
    mi->threads = cp.n_threads;
    const bool tied = m->output.data == m->tok_embd.data;
    /* bytes a generated token reads: every weight but the embedding table (one row of it), which
     * is read in full only when the output projection is tied to it — in memory, so with what the
     * larger load-time layouts (iq2 *_p3) added */
    mi->tok_bytes = mi->size + (double)m->repack_grown - (tied ? 0.0 : (double)m->tok_embd.nbytes);
    moe_bytes(m, mi);
    double *slice = NULL; /* [n_layer] bytes of one expert's slices of every *_exps matrix */
    uint64_t *touched0 = NULL, *tokens0 = NULL; /* the counters when the tg test starts */
    if (mi->n_expert > 0) {
        slice = calloc((size_t)mi->n_layer, sizeof *slice);
        touched0 = calloc((size_t)mi->n_layer, sizeof *touched0), tokens0 = calloc((size_t)mi->n_layer, sizeof *tokens0);
        mi->usage = calloc((size_t)mi->n_layer * (size_t)mi->n_expert, sizeof *mi->usage);
        if (!slice || !touched0 || !tokens0 || !mi->usage) s = TERN_ERR_NOMEM;
        for (int32_t il = 0; !s && il < mi->n_layer; il++)
            for (int r = 0; r < TN_ROLE_N_LAYER; r++)
                if (tn_roles[r].ne2 == TN_DIM_EXPERT) slice[il] += (double)m->layers[il].w[r].nbytes / mi->n_expert;
        tn_ctx_moe_usage_reset(c);
    }
    /* matrix work per token: 2 ops per parameter of every matrix but the embedding lookup (MoE:
     * of the parameters a token is routed through, as tern info counts them) */
    const double embd_params = (double)m->tok_embd.ne[0] * (double)m->tok_embd.ne[1];
    mi->mat_ops = 2.0 * ((mi->n_expert > 0 ? (double)m->n_params_active : mi->params) - (tied ? 0.0 : embd_params));
    const tn_dtype_traits *wt = m->hp.n_layer > 0 ? tn_dtype_get(m->layers[0].w[mi->n_expert > 0 ? TN_ROLE_FFN_UP_EXPS : TN_ROLE_FFN_UP].type) : NULL;
    mi->quantized = wt && wt->is_quantized;
    for (int test = 0; test < 2 && !s; test++) {
        const int64_t n = test == 0 ? o->n_prompt : o->n_gen;
        if (n == 0) continue;
        if (test == 1 && c->moe_count)
            for (int32_t il = 0; il < mi->n_layer; il++) touched0[il] = c->moe_touched[il], tokens0[il] = c->moe_tokens[il];
        for (int64_t r = -1; r < o->reps && !s; r++) { /* r = -1 is the warm-up */
            tern_ctx_truncate(c, (int32_t)depth);
            double t0 = tn_cli_now(), dt = 0;
            if (test == 0) {
                s = tern_decode(c, toks, (int32_t)n);
                dt = tn_cli_now() - t0;
            } else {
                s = tern_decode(c, toks, 1); /* first token; llama-bench's tg also starts from an empty cache (or -d) */
                tern_ctx_truncate(c, (int32_t)depth);
                const bool probing = probe && r >= 0;
                double bws = probing ? tn_read_probe_gbs(probe) : 0;
                int nbw = probing;
                t0 = tn_cli_now();
                for (int64_t i = 0; i < n && !s; i++) {
                    s = tern_decode(c, &toks[i], 1);
                    const double t1 = tn_cli_now();
                    if (probing && (t1 - t0 >= BENCH_BW_EVERY_S || i + 1 == n)) { /* a pass; not decode time */
                        dt += t1 - t0;
                        bws += tn_read_probe_gbs(probe), nbw++;
                        t0 = tn_cli_now();
                    }
                }
                if (!probing) dt = tn_cli_now() - t0;
                if (probing) bw[r] = bws / nbw;
            }
            if (r >= 0) tv[r] = (double)n / dt;
            fprintf(stderr, "\r%s%lld rep %lld/%lld: %.2f t/s   ", test ? "tg" : "pp", (long long)n, (long long)r + 1,
                    (long long)o->reps, (double)n / dt);
        }
        if (s) break;
        if (test == 1 && c->moe_count) { /* the experts run per decoded token, from the counters */
            double b = mi->all_bytes - mi->exp_bytes;
            int32_t counted = 0; /* none on a GPU's layers: the static estimate stays */
            for (int32_t il = 0; il < mi->n_layer; il++) {
                const uint64_t nt = c->moe_tokens[il] - tokens0[il];
                if (nt) b += slice[il] * (double)(c->moe_touched[il] - touched0[il]) / (double)nt, counted++;
            }
            if (counted == mi->n_layer) mi->measured_bytes = mi->tok_bytes = b;
        }
        bench_row *row = &rows[(*nrows)++];
        if (depth) snprintf(row->test, sizeof row->test, "%s%lld @ d%lld", test ? "tg" : "pp", (long long)n, (long long)depth);
        else snprintf(row->test, sizeof row->test, "%s%lld", test ? "tg" : "pp", (long long)n);
        row->n_prompt = test ? 0 : (int)n;
        row->n_gen = test ? (int)n : 0;
        row->n_depth = (int)depth;
        stats(tv, (int)o->reps, &row->mean, &row->sd);
        row->bw_during = 0;
        if (test == 1) {
            row->rate = mi->tok_bytes * row->mean / 1e9;
            row->pct_roof = 0;
            if (probe) { /* each repetition against the bandwidth measured during it */
                double pct = 0, bws = 0;
                int nok = 0;
                for (int64_t r = 0; r < o->reps; r++)
                    if (bw[r] > 0) pct += 100.0 * mi->tok_bytes * tv[r] / 1e9 / bw[r], bws += bw[r], nok++;
                row->bw_during = nok ? bws / nok : 0.0;
                row->pct_roof = nok ? pct / nok : 0.0;
            }
        } else {
            row->rate = mi->mat_ops * row->mean / 1e9;
            const double peak = pk ? (mi->quantized ? pk->dot : pk->fma) : 0;
            row->pct_roof = peak > 0 ? 100.0 * row->rate / peak : 0.0;
        }
    }
    fprintf(stderr, "\n");
    if (c->moe_count && mi->usage) {
        memcpy(mi->usage, c->moe_count, sizeof(uint64_t) * (size_t)mi->n_layer * (size_t)mi->n_expert);
        mi->usage_tokens = c->moe_tokens[0];
    }
    tn_cli_hot_experts_report(c);
    free(slice), free(touched0), free(tokens0);
    if (s) free(mi->usage), mi->usage = NULL;
    mi->gpu_persist = c->cuda && tn_cuda_persistent(c->cuda); /* (after the runs: a launch it could not make turns it off) */
    free(toks0), free(tv), free(bw), tn_read_probe_free(probe);
    for (int i = 0; i < lora.n; i++) tern_lora_free(lora.a[i]);
    tern_ctx_free(c);
    tern_model_free(m);
    return s ? tn_cli_fail(s, "benchmark") : TN_EXIT_OK;
}

/* A markdown row's t/s, roofline and rate cells (32+ bytes each; ts 64). */
static void row_cells(const bench_row *R, char *ts, char *roof, char *rate) {
    snprintf(ts, 64, "%.2f ± %.2f", R->mean, R->sd);
    roof[0] = 0;
    if (R->pct_roof > 0) snprintf(roof, 32, "%.1f%%", R->pct_roof);
    if (R->n_gen) snprintf(rate, 32, "%.1f", R->rate);
    else snprintf(rate, 32, "%.0f*", R->rate);
}

static void print_peaks_md(const peaks *pk) {
    printf("\nmachine: read %.1f GB/s (1 thread), %.1f GB/s (%d threads), streaming %zu MiB, best of 5; "
           "f32 FMA %.0f GFLOP/s, int8 dot %.0f GOP/s (%d threads)\n",
           pk->bw1, pk->bwn, pk->threads, BENCH_BW_BYTES >> 20, pk->fma, pk->dot, pk->threads);
}

static void print_peaks_json(const peaks *pk) {
    printf("\"read_bw_gbs\": %.3f, \"read_bw_1t_gbs\": %.3f, \"fma_gflops\": %.1f, \"int8_gops\": %.1f", pk->bwn, pk->bw1,
           pk->fma, pk->dot);
}

/* ---- --sweep-bits: tq1..tq8 of one f16/f32 model ------------------------------------------- */

/* --sweep-bits quantizes from the model's own weights: they must be float (f32 / f16 / bf16), or
 * every width would carry the first quantization's error as well. */
static int sweep_check_input(const char *path) {
    tn_gguf *g = NULL;
    tern_status s = tn_gguf_open(path, true, &g);
    if (s) return tn_cli_fail(s, "--sweep-bits");
    const tn_gguf_tensor *q = NULL; /* the first quantized matrix */
    for (uint64_t i = 0; i < g->n_tensors && !q; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        if (t->n_dims >= 2 && t->type != TN_F32 && t->type != TN_F16 && t->type != TN_BF16) q = t;
    }
    int rc = TN_EXIT_OK;
    if (q) {
        fprintf(stderr, "tern: error: --sweep-bits needs an f32, f16 or bf16 model; '%s' has %s weights (%s)\n", path,
                tn_dtype_name(q->type), q->name);
        rc = TN_EXIT_DATAERR;
    }
    tn_gguf_free(g);
    return rc;
}

/* A tg row's roofline percentage against the whole file's weights instead of the bytes read. */
static double roof_of_size(const bench_row *R, const model_info *mi) { return R->pct_roof * mi->size / mi->tok_bytes; }

static int sweep_bits(const char *path, const bench_opts *o, const peaks *pk, int group, bool asym, bool json) {
    const char *tmp = getenv("TMPDIR");
    char dir[1024], out[1024 + 64];
    snprintf(dir, sizeof dir, "%s/tern-sweep-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return tn_cli_fail(tn_err(TERN_ERR_IO, "bench: cannot create a temporary directory in %s", tmp && *tmp ? tmp : "/tmp"), "--sweep-bits");
    typedef struct {
        char type[32];
        model_info mi;
        bench_row rows[2];
        int nrows;
    } width;
    width wv[8];
    int rc = TN_EXIT_OK, nw = 0;
    char thr[32];
    snprintf(thr, sizeof thr, "%d", o->threads ? (int)o->threads : tn_cpu_count());
    for (int b = 1; b <= 8 && rc == TN_EXIT_OK; b++) {
        width *W = &wv[nw];
        const tn_tq_params tp = {b, group, asym};
        tn_tq_name(&tp, W->type, sizeof W->type);
        const int len = snprintf(out, sizeof out, "%s/%s.gguf", dir, W->type);
        if (len < 0 || (size_t)len >= sizeof out) {
            rc = tn_cli_usage_error("TMPDIR is too long");
            break;
        }
        fprintf(stderr, "tern bench --sweep-bits: quantizing to %s...\n", W->type);
        char *qargv[] = {"quantize", "-t", thr, (char *)path, out, W->type, NULL};
        rc = cmd_quantize(6, qargv);
        if (rc == TN_EXIT_OK) rc = bench_model(out, o, pk, W->rows, &W->nrows, &W->mi);
        if (rc == TN_EXIT_OK) free(W->mi.usage), W->mi.usage = NULL; /* the sweep reports bytes, not usage */
        unlink(out);
        if (rc == TN_EXIT_OK) nw++;
    }
    rmdir(dir);
    if (rc != TN_EXIT_OK) return rc;
    if (json) {
        printf("[\n");
        for (int i = 0; i < nw; i++) {
            const width *W = &wv[i];
            const bench_row *tg = NULL, *pp = NULL;
            for (int r = 0; r < W->nrows; r++) *(W->rows[r].n_gen ? &tg : &pp) = &W->rows[r];
            printf("  {\"bits\": %d, \"type\": \"%s\", \"model_filename\": \"%s\", \"model_size\": %.0f, \"model_n_params\": %.0f, "
                   "\"bpw\": %.4f, \"n_threads\": %d, \"bytes_per_token\": %.0f, ",
                   i + 1, W->type, path, W->mi.size, W->mi.params, 8.0 * W->mi.size / W->mi.params, W->mi.threads,
                   W->mi.tok_bytes);
            if (tg)
                printf("\"n_gen\": %d, \"tg_ts\": %.6f, \"tg_stddev_ts\": %.6f, \"tg_gbs\": %.3f, \"roofline_pct\": %.2f, "
                       "\"roofline_size_pct\": %.2f, \"read_bw_during_gbs\": %.3f, ",
                       tg->n_gen, tg->mean, tg->sd, tg->rate, tg->pct_roof, roof_of_size(tg, &W->mi),
                       tg->bw_during);
            if (pp)
                printf("\"n_prompt\": %d, \"pp_ts\": %.6f, \"pp_stddev_ts\": %.6f, \"pp_gops\": %.1f, \"pp_peak_pct\": %.2f, ",
                       pp->n_prompt, pp->mean, pp->sd, pp->rate, pp->pct_roof);
            print_peaks_json(pk);
            printf("}%s\n", i + 1 < nw ? "," : "");
        }
        printf("]\n");
        return TN_EXIT_OK;
    }
    printf("| b | type       |   bpw | file MiB | MiB/token | test  |        t/s |  GB/s | roofline | of size | read GB/s |\n");
    printf("| -: | ---------- | ----: | -------: | --------: | ----- | ---------: | ----: | -------: | ------: | --------: |\n");
    for (int i = 0; i < nw; i++) {
        const width *W = &wv[i];
        for (int r = 0; r < W->nrows; r++) {
            const bench_row *R = &W->rows[r];
            char roof[32] = "", roof_size[32] = "", rate[32], during[32] = "";
            if (R->pct_roof > 0) snprintf(roof, sizeof roof, "%.1f%%", R->pct_roof);
            if (R->pct_roof > 0 && R->n_gen) snprintf(roof_size, sizeof roof_size, "%.1f%%", roof_of_size(R, &W->mi));
            if (R->bw_during > 0) snprintf(during, sizeof during, "%.1f", R->bw_during);
            if (R->n_gen) snprintf(rate, sizeof rate, "%.1f", R->rate);
            else snprintf(rate, sizeof rate, "%.0f*", R->rate);
            printf("| %d | %-10s | %5.2f | %8.1f | %9.1f | %-5s | %10.2f | %5s | %8s | %7s | %9s |\n", i + 1, W->type,
                   8.0 * W->mi.size / W->mi.params, W->mi.size / 1048576.0, W->mi.tok_bytes / 1048576.0, R->test, R->mean,
                   rate, roof, roof_size, during);
        }
    }
    printf("\ntg: GB/s = bytes of weights read per token (all but the token embedding) x tokens/s, roofline = that / "
           "read bandwidth (%d threads) measured during each repetition (read GB/s: mean of read passes interleaved with "
           "the decode); of size: the same against the whole file's weights (t/s x file MiB / read bandwidth); pp (*): "
           "GOP/s of matrix work, roofline = that / int8 dot peak\n", pk->threads);
    if (pk->bwn > 0) print_peaks_md(pk);
    return TN_EXIT_OK;
}

/* --device cuda: tokens/s with the card's copy bandwidth (measured before and after the runs,
 * their mean) as tg's roofline and its fp16 cuBLAS peak as pp's. */
static int bench_gpu(const char *path, const bench_opts *o, bool roofline, bool json) {
    gpu_peaks gp = {0, 0};
    const size_t bw_bytes = (size_t)1 << 30;
    if (roofline) {
        fprintf(stderr, "tern bench: measuring the GPU (copy bandwidth, fp16 matrix product)...\n");
        gp.copy_gbs = tn_cuda_peak_copy_gbs(bw_bytes, 10);
        gp.f16_tflops = tn_cuda_peak_f16_tflops(8192, 5);
    }
    bench_row rows[2];
    int nrows = 0;
    model_info mi;
    const int rc = bench_model(path, o, NULL, rows, &nrows, &mi);
    if (rc != TN_EXIT_OK) return rc;
    free(mi.usage), mi.usage = NULL; /* not counted on the GPU */
    if (roofline) gp.copy_gbs = 0.5 * (gp.copy_gbs + tn_cuda_peak_copy_gbs(bw_bytes, 10));
    for (int i = 0; i < nrows; i++) {
        bench_row *R = &rows[i];
        if (R->n_gen) R->pct_roof = gp.copy_gbs > 0 ? 100.0 * R->rate / gp.copy_gbs : 0;
        else R->pct_roof = gp.f16_tflops > 0 ? 100.0 * R->rate / (gp.f16_tflops * 1000.0) : 0;
    }
    tn_cuda_info info;
    if (tn_cuda_device_info(0, &info)) snprintf(info.name, sizeof info.name, "?");
    if (json) {
        printf("[\n");
        for (int i = 0; i < nrows; i++)
            printf("  {\"model_filename\": \"%s\", \"model_type\": \"%s\", \"backend\": \"CUDA\", \"gpu\": \"%s\", "
                   "\"model_size\": %.0f, \"model_n_params\": %.0f, \"n_gpu_layers\": %d, \"n_prompt\": %d, \"n_gen\": %d, "
                   "\"avg_ts\": %.6f, \"stddev_ts\": %.6f, \"bytes_per_token\": %.0f, \"%s\": %.3f, \"roofline_pct\": %.2f, "
                   "\"gpu_copy_gbs\": %.1f, \"gpu_f16_tflops\": %.1f, \"decode_kernel\": \"%s\"}%s\n",
                   path, mi.desc, info.name, mi.size, mi.params, (int)o->ngl, rows[i].n_prompt, rows[i].n_gen, rows[i].mean,
                   rows[i].sd, mi.tok_bytes, rows[i].n_gen ? "gbs" : "gops", rows[i].rate, rows[i].pct_roof, gp.copy_gbs,
                   gp.f16_tflops, mi.gpu_persist ? "persistent" : "launches", i + 1 < nrows ? "," : "");
        printf("]\n");
        return TN_EXIT_OK;
    }
    printf("| model                          |       size |     params | backend    |            test |                  t/s |     GB/s | roofline |\n");
    printf("| ------------------------------ | ---------: | ---------: | ---------- | --------------: | -------------------: | -------: | -------: |\n");
    for (int i = 0; i < nrows; i++) {
        char ts[64], roof[32], rate[32];
        row_cells(&rows[i], ts, roof, rate);
        printf("| %-30s | %7.2f MiB | %8.2f M | CUDA       | %15s | %20s | %8s | %8s |\n", mi.desc, mi.size / 1048576.0,
               mi.params / 1e6, rows[i].test, ts, rate, roof);
    }
    printf("\nGPU %s: copy bandwidth %.1f GB/s (own copy kernel, read + write, mean of before and after), fp16 cuBLAS "
           "%.1f TFLOP/s (8192^3); tg: GB/s of weights read (%.1f MiB per token), roofline = that / copy bandwidth; pp (*): "
           "GOP/s of matrix work, roofline = that / fp16 peak\n",
           info.name, gp.copy_gbs, gp.f16_tflops, mi.tok_bytes / 1048576.0);
    if (mi.gpu_persist) printf("one-token steps: one persistent kernel (TERN_CUDA_PERSIST=1)\n");
    return TN_EXIT_OK;
}

/* A built-in prompt for --spec: a passage, then the request to repeat it (the copying that n-gram
 * drafting is for; --spec-prompt FILE gives another). */
static const char spec_default_prompt[] =
    "Lily had a little red ball. She liked to play with it in the park every day. One day the ball "
    "rolled into the pond, and a big duck swam to it and pushed it back to her. Lily said thank you "
    "to the duck, and they played together until the sun went down.\n\nTell the story again:\n"
    "Lily had a little red ball.";

typedef struct {
    double ts[2][64]; /* tokens/s per repetition: plain, speculative */
    int64_t steps, drafted, accepted;
    int32_t first_diff; /* first token where the two runs differ (-1: none) */
} spec_result;

/* n_gen tokens after the prompt, greedy, one token per pass (spec == NULL) or with speculation;
 * out gets the tokens; returns seconds (< 0 on an error, printed). */
static double spec_run_once(tern_ctx *c, tern_sampler *smp, tn_cli_spec *spec, const tern_token *prompt, int32_t np,
                            int32_t n_gen, tern_token *out) {
    tern_ctx_truncate(c, 0);
    tern_status s = tern_decode(c, prompt, np);
    if (s) return tn_cli_fail(s, "prompt processing"), -1.0;
    const double t0 = tn_cli_now();
    int32_t n = 0;
    tern_token emit[64];
    int32_t n_emit = 1;
    emit[0] = tern_sampler_sample(smp, tern_get_logits(c, -1));
    if (spec) {
        tn_cli_spec_reset(spec);
        memcpy(spec->hist, prompt, sizeof *prompt * (size_t)np);
        spec->n_hist = np;
    }
    for (;;) {
        for (int32_t j = 0; j < n_emit && n < n_gen; j++) {
            out[n++] = emit[j];
            if (spec) spec->hist[spec->n_hist++] = emit[j];
        }
        if (n >= n_gen) break;
        if (spec) {
            s = tn_cli_spec_step(spec, c, smp, (int32_t)TN_MIN(spec->kmax, (int64_t)(n_gen - n)), emit, &n_emit);
        } else {
            s = tern_decode(c, &out[n - 1], 1);
            if (!s) emit[0] = tern_sampler_sample(smp, tern_get_logits(c, -1)), n_emit = 1;
        }
        if (s) return tn_cli_fail(s, "decoding"), -1.0;
    }
    return tn_cli_now() - t0;
}

/* tern bench --spec ngram | --draft FILE: greedy decoding of -n tokens after a prompt with and
 * without speculation, alternating, -r repetitions each after one warm-up of each: tokens/s,
 * accepted drafts per verification pass, the acceptance rate and the speedup; and whether both
 * runs gave the same tokens (they should: exact-match verification). */
static int bench_spec(const char *path, const bench_opts *o, tn_cli_spec *spec, const char *prompt_file, bool json) {
    char *text = NULL;
    size_t len = 0;
    tern_status s;
    if (prompt_file && (s = tn_cli_read_file(prompt_file, &text, &len))) return tn_cli_fail(s, "reading --spec-prompt");
    const char *ptxt = text ? text : spec_default_prompt;
    if (!text) len = strlen(spec_default_prompt);
    tern_model *m = NULL;
    tern_ctx *c = NULL;
    tern_sampler *smp = NULL;
    tern_token *prompt = NULL, *out[2] = {NULL, NULL};
    int32_t np = 0, rc = TN_EXIT_OK;
    spec_result R;
    memset(&R, 0, sizeof R);
    R.first_diff = -1;
    const int32_t n_gen = (int32_t)(o->n_gen > 0 ? o->n_gen : 128), reps = (int32_t)TN_MIN(o->reps, 64);
    tern_model_params mp;
    tern_model_params_init(&mp);
    mp.repack = !o->no_repack;
    if ((s = tern_model_load(path, &mp, &m))) {
        rc = tn_cli_fail(s, "loading the model");
        goto out;
    }
    if ((s = tn_cli_tokenize(m, ptxt, len, true, false, &prompt, &np))) {
        rc = tn_cli_fail(s, "tokenizing the prompt");
        goto out;
    }
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = np + n_gen + (int32_t)spec->kmax + 2;
    cp.n_batch = (int32_t)TN_MAX(o->n_batch, spec->kmax + 1);
    if (o->threads) cp.n_threads = (int32_t)o->threads;
    cp.type_k = o->type_k, cp.type_v = o->type_v, cp.kv_rotate = o->kv_rot;
    tern_sampler_params sp;
    tern_sampler_params_init(&sp);
    sp.temp = 0.0f;
    if ((s = tern_ctx_create(m, &cp, &c)) || (s = tern_sampler_create(m, &sp, &smp))) {
        rc = tn_cli_fail(s, "creating the context");
        goto out;
    }
    if ((rc = tn_cli_spec_open(spec, m, c, &cp, cp.n_ctx)) != TN_EXIT_OK) goto out;
    out[0] = malloc(sizeof(tern_token) * (size_t)n_gen), out[1] = malloc(sizeof(tern_token) * (size_t)n_gen);
    if (!out[0] || !out[1]) {
        rc = tn_cli_fail(TERN_ERR_NOMEM, "bench --spec");
        goto out;
    }
    for (int32_t r = -1; r < reps; r++) { /* r = -1: warm-up of both */
        const int64_t d0 = spec->drafted, a0 = spec->accepted, st0 = spec->steps;
        for (int mode = 0; mode < 2; mode++) {
            const double t = spec_run_once(c, smp, mode ? spec : NULL, prompt, np, n_gen, out[mode]);
            if (t < 0) {
                rc = TN_EXIT_SOFTWARE;
                goto out;
            }
            if (r >= 0) R.ts[mode][r] = n_gen / (t > 0 ? t : 1e-9);
        }
        if (r < 0) spec->drafted = d0, spec->accepted = a0, spec->steps = st0;
        for (int32_t i = 0; i < n_gen && R.first_diff < 0; i++)
            if (out[0][i] != out[1][i]) R.first_diff = i;
        fprintf(stderr, "\rtern bench: spec rep %d/%d   ", r + 1, reps);
    }
    fprintf(stderr, "\n");
    double mean[2], sd[2];
    for (int mode = 0; mode < 2; mode++) stats(R.ts[mode], reps, &mean[mode], &sd[mode]);
    const double per_pass = spec->steps ? (double)(spec->accepted + spec->steps) / (double)spec->steps : 0;
    const double rate = spec->drafted ? (double)spec->accepted / (double)spec->drafted : 0;
    const char *how = spec->ngram && spec->draft_path ? "ngram+draft" : spec->ngram ? "ngram" : "draft";
    if (json) {
        printf("[\n  {\"model_filename\": \"%s\", \"n_prompt\": %d, \"n_gen\": %d, \"spec\": \"%s\", \"draft_max\": %lld, \"draft_p_min\": %.3f, "
               "\"plain_ts\": %.6f, \"plain_stddev_ts\": %.6f, \"spec_ts\": %.6f, \"spec_stddev_ts\": %.6f, \"speedup\": %.4f, "
               "\"passes\": %lld, \"drafted\": %lld, \"accepted\": %lld, \"tokens_per_pass\": %.4f, \"acceptance\": %.4f, "
               "\"same_tokens\": %s}\n]\n",
               path, np, n_gen, how, (long long)spec->kmax, (double)spec->dm.p_min, mean[0], sd[0], mean[1], sd[1], mean[1] / mean[0],
               (long long)spec->steps, (long long)spec->drafted, (long long)spec->accepted, per_pass, rate,
               R.first_diff < 0 ? "true" : "false");
    } else {
        printf("| model | test | speculation | t/s | speedup | tokens per pass | drafts accepted |\n|---|---|---|---:|---:|---:|---:|\n");
        printf("| %s | tg%d after %d | none | %.2f ± %.2f | 1.00x | 1.00 | - |\n", path, n_gen, np, mean[0], sd[0]);
        printf("| %s | tg%d after %d | %s (<= %lld) | %.2f ± %.2f | %.2fx | %.2f | %.1f%% |\n", path, n_gen, np, how,
               (long long)spec->kmax, mean[1], sd[1], mean[1] / mean[0], per_pass, 100.0 * rate);
        printf("\ngreedy, %d repetitions of each alternating (after one warm-up of each); tokens per pass = "
               "tokens emitted per verification pass (accepted drafts + 1)%s\n",
               reps, R.first_diff < 0 ? "; both runs gave the same tokens" : "");
    }
    if (R.first_diff >= 0)
        fprintf(stderr, "tern bench: warning: speculation gave another token at %d (a near-tie rounded differently in the batched pass)\n",
                R.first_diff);
out:
    free(out[0]), free(out[1]);
    free(prompt);
    free(text);
    tern_sampler_free(smp);
    tern_ctx_free(c);
    tern_model_free(m);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    const char *model_path = NULL, *fmt = "md";
    bench_opts o = {512, 128, 5, 0, 512, 0, false, TERN_DEVICE_CPU, -1, NULL, 0, 0, 0, 0};
    tn_cli_lora lora = {0};
    o.lora = &lora;
    int dv;
    bool roofline = true, sweep = false, sweep_asym = true, np_set = false;
    int64_t group = 64;
    tn_cli_spec spec;
    tn_cli_spec_init(&spec);
    const char *spec_prompt = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: tern bench -m model.gguf [-p 512] [-n 128] [-d 0] [-r 5] [-t N] [-b 512] [-o md|json] [--no-roofline]\n"
                   "       [--no-repack] [--device cpu|cuda] [-ngl N] [--lora FILE[:S]]... [-ctk T] [-ctv T]\n"
                   "       tern bench --sweep-bits -m model-f16.gguf [--group 64] [--sym] [-n 128] [-p 0] ...\n"
                   "       tern bench -m model.gguf --spec ngram | --draft small.gguf [--draft-max 8] [--draft-p-min P] [--spec-prompt FILE] [-n 128] [-r 5]\n"
                   "  -p N  prompt tokens (pp test; 0 = skip)   -n N  generated tokens (tg test; 0 = skip)\n"
                   "  -d N  tokens already in the cache before each test (as llama-bench's -d; filled once, not timed)\n"
                   "  -r N  repetitions                           -o    output format\n"
                   "  --no-repack   keep q4_0/q8_0/q4_K/q5_K/q6_K/tq weights in the file layout (default: interleaved at load)\n"
                   "  --lora FILE[:S]  bench with a LoRA adapter applied (scale S, default 1; repeatable; --lora-scaled FILE S)\n"
                   TN_CLI_CACHE_TYPE_HELP TN_CLI_HOT_EXPERTS_HELP
                   "  --sweep-bits  quantize an f16/f32 model to tq1..tq8 (g<group>, asymmetric unless --sym) in a\n"
                   "                temporary directory and bench each width (pp skipped unless -p is given)\n");
            return 0;
        }
#define NUM(flag, var, lo, hi)                                                                                         \
    else if (!strcmp(a, flag)) {                                                                                       \
        if (!val || !tn_cli_parse_i64(val, lo, hi, &var))                                                              \
            return tn_cli_usage_error("%s needs a number in %lld..%lld", flag, (long long)(lo), (long long)(hi));       \
        i++;                                                                                                           \
    }
        NUM("-p", o.n_prompt, 0, 1 << 20)
        NUM("-d", o.n_depth, 0, 1 << 20)
        NUM("-n", o.n_gen, 0, 1 << 20)
        NUM("-r", o.reps, 1, 1000)
        NUM("-t", o.threads, 1, 1024)
        NUM("-b", o.n_batch, 1, 65536)
        NUM("--group", group, 32, 256)
#undef NUM
        else if (!strcmp(a, "-m") && val) model_path = argv[++i];
        else if (!strcmp(a, "-o") && val) {
            fmt = argv[++i];
            if (strcmp(fmt, "md") && strcmp(fmt, "json")) return tn_cli_usage_error("-o: '%s' is not md or json", fmt);
        } else if (!strcmp(a, "--no-roofline")) roofline = false;
        else if (!strcmp(a, "--no-repack")) o.no_repack = true;
        else if (!strcmp(a, "--sweep-bits")) sweep = true;
        else if (!strcmp(a, "--sym")) sweep_asym = false;
        else if (!strcmp(a, "--spec-prompt") && val) spec_prompt = argv[++i];
        else if ((dv = tn_cli_spec_flag(argc, argv, &i, &spec)) != 0) {
            if (dv < 0) return TN_EXIT_USAGE;
            continue;
        }
        else if ((dv = tn_cli_device_flag(argc, argv, &i, &o.device, &o.ngl)) != 0 ||
                 (dv = tn_cli_cache_type_flag(argc, argv, &i, &o.type_k, &o.type_v, &o.kv_rot)) != 0 ||
                 (dv = tn_cli_hot_experts_flag(argc, argv, &i, &o.hot_experts)) != 0) {
            if (dv < 0) return TN_EXIT_USAGE;
            continue;
        } else if ((dv = tn_cli_lora_flag(argc, argv, &i, &lora)) != 0) {
            if (dv < 0) return TN_EXIT_USAGE;
            continue;
        } else return tn_cli_usage_error("unknown option or missing value '%s'", a);
        if (!strcmp(a, "-p")) np_set = true;
    }
    if (group != 32 && group != 64 && group != 128 && group != 256) return tn_cli_usage_error("--group must be 32, 64, 128 or 256");
    char defp[4096];
    if (!model_path) {
        if (sweep || !tn_cli_default_model(defp, sizeof defp)) return tn_cli_usage_error("bench needs -m model.gguf");
        model_path = defp;
    }
    if (sweep && !np_set) o.n_prompt = 0;
    const int nt = o.threads ? (int)o.threads : tn_cpu_count();
    peaks pk = {0};
    if (sweep) { /* before the machine is measured: a wrong input fails at once */
        const int in_rc = sweep_check_input(model_path);
        if (in_rc != TN_EXIT_OK) return in_rc;
    }
    if (sweep && o.device == TERN_DEVICE_CUDA) return tn_cli_usage_error("--sweep-bits runs on the CPU; drop --device cuda");
    if (tn_cli_spec_on(&spec) || spec_prompt) {
        if (!tn_cli_spec_on(&spec)) return tn_cli_usage_error("--spec-prompt needs --spec ngram or --draft FILE");
        if (sweep || o.device == TERN_DEVICE_CUDA) return tn_cli_usage_error("--spec / --draft bench the CPU decode alone");
        const int src = bench_spec(model_path, &o, &spec, spec_prompt, !strcmp(fmt, "json"));
        tn_cli_spec_free(&spec);
        return src;
    }
    if (lora.n && (sweep || o.device == TERN_DEVICE_CUDA || tn_cli_spec_on(&spec)))
        return tn_cli_usage_error("--lora applies to the plain CPU bench (not --sweep-bits, --spec, --draft or --device cuda)");
    if (o.device == TERN_DEVICE_CUDA) return bench_gpu(model_path, &o, roofline, !strcmp(fmt, "json"));
    if (roofline) measure_peaks(nt, &pk);
    if (sweep) return sweep_bits(model_path, &o, roofline ? &pk : NULL, (int)group, sweep_asym, !strcmp(fmt, "json"));

    bench_row rows[2];
    int nrows = 0;
    model_info mi;
    const int rc = bench_model(model_path, &o, roofline ? &pk : NULL, rows, &nrows, &mi);
    tn_cli_lora_free(&lora);
    if (rc != TN_EXIT_OK) return rc;
    if (!strcmp(fmt, "json")) {
        printf("[\n");
        for (int i = 0; i < nrows; i++) {
            printf("  {\"model_filename\": \"%s\", \"model_type\": \"%s\", \"model_size\": %.0f, \"model_n_params\": %.0f, "
                   "\"n_threads\": %d, \"n_batch\": %lld, \"n_prompt\": %d, \"n_gen\": %d, \"n_depth\": %d, \"avg_ts\": %.6f, "
                   "\"stddev_ts\": %.6f, \"bytes_per_token\": %.0f, \"%s\": %.3f, \"roofline_pct\": %.2f, \"read_bw_during_gbs\": %.3f, ",
                   model_path, mi.desc, mi.size, mi.params, mi.threads, (long long)o.n_batch, rows[i].n_prompt, rows[i].n_gen, rows[i].n_depth,
                   rows[i].mean, rows[i].sd, mi.tok_bytes, rows[i].n_gen ? "gbs" : "gops", rows[i].rate, rows[i].pct_roof,
                   rows[i].bw_during);
            print_peaks_json(&pk);
            print_moe_json(&mi, rows[i].bw_during > 0 ? rows[i].bw_during : pk.bwn);
            printf("}%s\n", i + 1 < nrows ? "," : "");
        }
        printf("]\n");
        free(mi.usage);
        return TN_EXIT_OK;
    }
    printf("| model                          |       size |     params | backend    | threads |            test |                  t/s |     GB/s | roofline |\n");
    printf("| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: | -------: | -------: |\n");
    for (int i = 0; i < nrows; i++) {
        char ts[64], roof[32], rate[32];
        row_cells(&rows[i], ts, roof, rate);
        printf("| %-30s | %7.2f MiB | %8.2f M | CPU        | %7d | %15s | %20s | %8s | %8s |\n", mi.desc, mi.size / 1048576.0,
               mi.params / 1e6, mi.threads, rows[i].test, ts, rate, roof);
    }
    double during = 0;
    for (int i = 0; i < nrows; i++)
        if (rows[i].bw_during > 0) during = rows[i].bw_during;
    printf("\ntg: GB/s of weights read (%.1f MiB per token), roofline = that / read bandwidth measured during each "
           "repetition (mean of read passes interleaved with the decode: %.1f GB/s); pp (*): GOP/s of matrix work, roofline = that / %s peak\n",
           mi.tok_bytes / 1048576.0, during, mi.quantized ? "int8 dot" : "f32 FMA");
    print_moe_md(&mi, during > 0 ? during : pk.bwn);
    if (roofline) print_peaks_md(&pk);
    free(mi.usage);
    return TN_EXIT_OK;
}
