/*
 * cmd_bench.c — `tern bench`: llama-bench-compatible prompt-processing (ppN) and generation
 * (tgN) throughput, plus the machine's measured read bandwidth in the same run and the share of
 * that roofline each generation run reached (bytes of weights read per token / time per token).
 *
 * Timing excludes tokenization and sampling (as llama-bench does); one warm-up run first.
 * Output: markdown table (default) or JSON (-o json) on stdout; progress on stderr.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/model.h"

typedef struct {
    const uint64_t *buf;
    size_t n;
    uint64_t sum;
} bw_arg;

static void *bw_thread(void *vp) {
    bw_arg *a = vp;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= a->n; i += 4) {
        s0 ^= a->buf[i];
        s1 ^= a->buf[i + 1];
        s2 ^= a->buf[i + 2];
        s3 ^= a->buf[i + 3];
    }
    a->sum = s0 ^ s1 ^ s2 ^ s3;
    return NULL;
}

/* Streaming-read bandwidth (GB/s) over a buffer much larger than the caches, best of reps. */
static double measure_bw(int threads, int reps) {
    const size_t bytes = (size_t)1 << 30, n = bytes / 8;
    uint64_t *buf = malloc(bytes);
    if (!buf) return 0.0;
    for (size_t i = 0; i < n; i++) buf[i] = i;
    double best = 0.0;
    pthread_t th[64];
    bw_arg args[64];
    if (threads > 64) threads = 64;
    for (int r = 0; r < reps; r++) {
        double t0 = tn_cli_now();
        for (int t = 0; t < threads; t++) {
            args[t] = (bw_arg){buf + n / (size_t)threads * (size_t)t, n / (size_t)threads, 0};
            pthread_create(&th[t], NULL, bw_thread, &args[t]);
        }
        uint64_t x = 0;
        for (int t = 0; t < threads; t++) {
            pthread_join(th[t], NULL);
            x ^= args[t].sum;
        }
        double dt = tn_cli_now() - t0;
        if (x == 42) fprintf(stderr, " "); /* keep the sum live */
        double gbs = (double)bytes / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    free(buf);
    return best;
}

typedef struct {
    char test[32];
    int n_prompt, n_gen;
    double mean, sd, pct_roof;
} bench_row;

static void stats(const double *v, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) q += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0.0;
}

int cmd_bench(int argc, char **argv) {
    const char *model_path = NULL, *fmt = "md";
    int64_t n_prompt = 512, n_gen = 128, reps = 5, threads = 0, n_batch = 512;
    bool roofline = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: tern bench -m model.gguf [-p 512] [-n 128] [-r 5] [-t N] [-b 512] [-o md|json] [--no-roofline]\n"
                   "  -p N  prompt tokens (pp test; 0 = skip)   -n N  generated tokens (tg test; 0 = skip)\n"
                   "  -r N  repetitions                           -o    output format\n");
            return 0;
        }
#define NUM(flag, var, lo, hi)                                                                 \
    else if (!strcmp(a, flag)) {                                                               \
        if (!val || !tn_cli_parse_i64(val, lo, hi, &var))                                      \
            return tn_cli_usage_error("%s needs a number in %lld..%lld", flag, (long long)(lo), (long long)(hi)); \
        i++;                                                                                   \
    }
        NUM("-p", n_prompt, 0, 1 << 20)
        NUM("-n", n_gen, 0, 1 << 20)
        NUM("-r", reps, 1, 1000)
        NUM("-t", threads, 1, 1024)
        NUM("-b", n_batch, 1, 65536)
#undef NUM
        else if (!strcmp(a, "-m") && val) model_path = argv[++i];
        else if (!strcmp(a, "-o") && val) {
            fmt = argv[++i];
            if (strcmp(fmt, "md") && strcmp(fmt, "json")) return tn_cli_usage_error("-o: '%s' is not md or json", fmt);
        } else if (!strcmp(a, "--no-roofline")) roofline = false;
        else return tn_cli_usage_error("unknown option or missing value '%s'", a);
    }
    char defp[4096];
    if (!model_path) {
        if (!tn_cli_default_model(defp, sizeof defp)) return tn_cli_usage_error("bench needs -m model.gguf");
        model_path = defp;
    }
    tern_model *m = NULL;
    tern_status s = tern_model_load(model_path, NULL, &m);
    if (s) return tn_cli_fail(s, "loading the model");
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    if (threads) cp.n_threads = (int32_t)threads;
    cp.n_ctx = (int32_t)(n_prompt + n_gen + 1);
    cp.n_batch = (int32_t)n_batch;
    tern_ctx *c = NULL;
    if ((s = tern_ctx_create(m, &cp, &c))) {
        tern_model_free(m);
        return tn_cli_fail(s, "creating the context");
    }
    int nt = cp.n_threads;
    double bw = 0.0;
    if (roofline) {
        fprintf(stderr, "tern bench: measuring read bandwidth with %d threads...\n", nt);
        bw = measure_bw(nt, 5);
    }
    int32_t nv = tern_model_n_vocab(m);
    int64_t nmax = n_prompt > n_gen ? n_prompt : n_gen;
    tern_token *toks = malloc((size_t)(nmax + 1) * sizeof *toks);
    double *tv = malloc((size_t)reps * sizeof *tv);
    bench_row rows[2];
    int nrows = 0;
    uint64_t x = 12345;
    for (int64_t i = 0; i <= nmax; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        toks[i] = (tern_token)((x >> 33) % (uint64_t)nv);
    }
    const double wbytes = (double)tern_model_size_bytes(m);
    /* bytes a generated token reads: every weight but the embedding table (one row of it), which
     * is read in full only when the output projection is tied to it */
    const double tok_bytes = wbytes - (m->output.data == m->tok_embd.data ? 0.0 : (double)m->tok_embd.nbytes);
    for (int test = 0; test < 2; test++) {
        int64_t n = test == 0 ? n_prompt : n_gen;
        if (n == 0) continue;
        for (int64_t r = -1; r < reps; r++) { /* r = -1 is the warm-up */
            tern_ctx_truncate(c, 0);
            double t0 = tn_cli_now();
            if (test == 0) {
                s = tern_decode(c, toks, (int32_t)n);
            } else {
                s = tern_decode(c, toks, 1); /* first token; llama-bench's tg also starts from an empty cache */
                tern_ctx_truncate(c, 0);
                t0 = tn_cli_now();
                for (int64_t i = 0; i < n && !s; i++) s = tern_decode(c, &toks[i], 1);
            }
            double dt = tn_cli_now() - t0;
            if (s) {
                free(toks);
                free(tv);
                tern_ctx_free(c);
                tern_model_free(m);
                return tn_cli_fail(s, "benchmark");
            }
            if (r >= 0) tv[r] = (double)n / dt;
            fprintf(stderr, "\r%s%lld rep %lld/%lld: %.2f t/s   ", test ? "tg" : "pp", (long long)n, (long long)r + 1,
                    (long long)reps, (double)n / dt);
        }
        bench_row *row = &rows[nrows++];
        snprintf(row->test, sizeof row->test, "%s%lld", test ? "tg" : "pp", (long long)n);
        row->n_prompt = test ? 0 : (int)n;
        row->n_gen = test ? (int)n : 0;
        stats(tv, (int)reps, &row->mean, &row->sd);
        row->pct_roof = (test == 1 && bw > 0) ? 100.0 * (tok_bytes * row->mean / 1e9) / bw : 0.0;
    }
    fprintf(stderr, "\n");
    double size_mib = wbytes / 1048576.0, params = (double)tern_model_n_params(m);
    if (!strcmp(fmt, "json")) {
        printf("[\n");
        for (int i = 0; i < nrows; i++) {
            printf("  {\"model_filename\": \"%s\", \"model_type\": \"%s\", \"model_size\": %.0f, \"model_n_params\": %.0f, "
                   "\"n_threads\": %d, \"n_batch\": %lld, \"n_prompt\": %d, \"n_gen\": %d, \"avg_ts\": %.6f, \"stddev_ts\": %.6f, "
                   "\"read_bw_gbs\": %.3f, \"bytes_per_token\": %.0f, \"roofline_pct\": %.2f}%s\n",
                   model_path, tern_model_desc(m), wbytes, params, nt, (long long)n_batch, rows[i].n_prompt, rows[i].n_gen,
                   rows[i].mean, rows[i].sd, bw, tok_bytes, rows[i].pct_roof, i + 1 < nrows ? "," : "");
        }
        printf("]\n");
    } else {
        printf("| model                          |       size |     params | backend    | threads |            test |                  t/s | roofline |\n");
        printf("| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: | -------: |\n");
        for (int i = 0; i < nrows; i++) {
            char ts[64], roof[32] = "";
            snprintf(ts, sizeof ts, "%.2f ± %.2f", rows[i].mean, rows[i].sd);
            if (rows[i].pct_roof > 0) snprintf(roof, sizeof roof, "%.1f%%", rows[i].pct_roof);
            printf("| %-30s | %7.2f MiB | %8.2f M | CPU        | %7d | %15s | %20s | %8s |\n", tern_model_desc(m), size_mib,
                   params / 1e6, nt, rows[i].test, ts, roof);
        }
        if (bw > 0) printf("\nread bandwidth (%d threads, streaming 1 GiB): %.1f GB/s; %.1f MiB of weights read per token\n", nt, bw, tok_bytes / 1048576.0);
    }
    free(toks);
    free(tv);
    tern_ctx_free(c);
    tern_model_free(m);
    return 0;
}
