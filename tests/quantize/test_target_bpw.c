/*
 * test_target_bpw.c — `tern quantize --target-bpw X` and its allocator (tn_qmix_allocate).
 *   - allocate: the budget is respected; an infeasible budget returns false with the cheapest
 *     choice; a larger budget never gives a larger total error; free upgrades (same size, less
 *     error) are taken; on a small convex instance the result is no worse than the brute-force
 *     optimum of a budget one largest step smaller (greedy's guarantee);
 *   - cli: on a tiny random f32 model without probes (--calib-chunks 0), targets 2.5 / 3.5 / 4.5 /
 *     6 give whole-file bpw <= target and within 0.15 of it (one step of the largest tensor is
 *     ~0.1 bpw here), the total squared weight error (token_embd per row, as the allocator weighs
 *     it then) never grows with the target, and every matrix is a tq type of the requested
 *     family; with the default probes (self-generated text) the budget holds too; bad targets (0.2, text,
 *     below the smallest possible file, a llama.cpp TYPE) are usage errors (exit 64) with no file;
 *   - types: --target-types vq2,q4_K,q8_0 on the tiny model (--calib-chunks 0): bpw <= target and
 *     within 0.15 of it, every matrix a tq<b>g64a or one of those types (vq2 and q4_K only where a
 *     row is a multiple of 256), the error printed for a tensor as q8_0 equal to the squared error
 *     computed here from the reference q8_0 quantizer, the file generates; bad lists (no
 *     --target-bpw, an unknown type, a tq type, an i-quant without --imatrix) are usage errors;
 *   - moe: on a tiny qwen3moe (8 experts, top 2) with an importance matrix written here (skewed
 *     per-expert counts, one expert never routed), the error --target-bpw prints for an expert
 *     tensor at every width equals the one computed here from the reference quantizer: each
 *     expert's rows quantized and weighed with its own importances, times top_k x its count /
 *     all counts; without the imatrix, unweighted times top_k / n_expert; a dense tensor's error is
 *     its importance-weighted one.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/tiny_model.h"
#include "fmt/gguf.h"
#include "quant/imatrix.h"
#include "quant/mix.h"
#include "quant/quant.h"
#include "quant/tq.h"

static int run(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static double total_err(size_t n, const int *ch, const double *const *err) {
    double e = 0;
    for (size_t i = 0; i < n; i++) e += err[i][ch[i]];
    return e;
}

static void test_allocate(void **st) {
    (void)st;
    enum { N = 5, C = 4 };
    double bits[N][C], err[N][C];
    const double *bp[N], *ep[N];
    int nc[N], ch[N];
    uint64_t r = 5;
    for (int i = 0; i < N; i++) {
        double sz = 100 + 50 * i, s = 1 + i % 3;
        for (int c = 0; c < C; c++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            bits[i][c] = sz * (c + 2);
            err[i][c] = s * pow(0.25, c) * (1 + (double)(r >> 40) / (1 << 24) * 0.1);
        }
        bp[i] = bits[i], ep[i] = err[i], nc[i] = C;
    }
    double min_bits = 0, prev = INFINITY;
    for (int i = 0; i < N; i++) min_bits += bits[i][0];
    assert_false(tn_qmix_allocate(N, nc, bp, ep, min_bits - 1, ch));
    for (int i = 0; i < N; i++) assert_int_equal(ch[i], 0);
    for (double budget = min_bits; budget <= min_bits * 3; budget += 37) {
        assert_true(tn_qmix_allocate(N, nc, bp, ep, budget, ch));
        double used = 0;
        for (int i = 0; i < N; i++) used += bits[i][ch[i]];
        assert_true(used <= budget);
        const double e = total_err(N, ch, ep);
        assert_true(e <= prev);
        prev = e;
        /* greedy's guarantee on convex items: no worse than the exact optimum (brute force over
         * all C^N choices) of a budget one largest step (300 bits) smaller */
        double best = INFINITY;
        int k[N];
        for (int code = 0; code < C * C * C * C * C; code++) {
            int v = code;
            double u = 0, ee = 0;
            for (int i = 0; i < N; i++) k[i] = v % C, v /= C, u += bits[i][k[i]], ee += err[i][k[i]];
            if (u <= budget - 300 && ee < best) best = ee;
        }
        if (!(e <= best)) print_message("budget %g: greedy %g, optimum of budget - 300: %g\n", budget, e, best);
        assert_true(e <= best);
    }
    /* a free upgrade is taken even with no budget left */
    double fb[2][2] = {{10, 10}, {10, 20}}, fe[2][2] = {{5, 1}, {5, 4}};
    const double *fbp[2] = {fb[0], fb[1]}, *fep[2] = {fe[0], fe[1]};
    int fnc[2] = {2, 2}, fch[2];
    assert_true(tn_qmix_allocate(2, fnc, fbp, fep, 20, fch));
    assert_int_equal(fch[0], 1);
    assert_int_equal(fch[1], 0);
}

/* Whole-file bits per weight, the squared error of the matrices against the f32 original
 * (token_embd divided by its rows), and whether every quantized matrix is a tq<b>g64a. */
static void measure(const char *orig, const char *path, double *bpw, double *err, bool *family) {
    tn_gguf *a, *b;
    assert_int_equal(tn_gguf_open(orig, false, &a), TERN_OK);
    assert_int_equal(tn_gguf_open(path, false, &b), TERN_OK);
    double bytes = 0, el = 0, e = 0;
    *family = true;
    for (uint64_t i = 0; i < b->n_tensors; i++) {
        const tn_gguf_tensor *t = &b->tensors[i], *o = tn_gguf_find_tensor(a, t->name);
        assert_non_null(o);
        const int64_t n = t->ne[0] * t->ne[1], rows = t->ne[1];
        bytes += (double)t->nbytes;
        el += (double)n;
        if (t->n_dims < 2) continue;
        if (!tn_tq_is(t->type)) {
            *family = false;
            continue;
        }
        tn_tq_params p;
        tn_tq_params_of(t->type, &p);
        if (p.group != 64 || !p.asym) *family = false;
        float *y = malloc(sizeof(float) * (size_t)n);
        tn_tq_dequantize_row(&p, t->data, y, n);
        const float *x = (const float *)o->data;
        double te = 0;
        for (int64_t j = 0; j < n; j++) te += ((double)x[j] - y[j]) * ((double)x[j] - y[j]);
        e += strcmp(t->name, "token_embd.weight") ? te : te / (double)rows;
        free(y);
    }
    *bpw = 8 * bytes / el;
    *err = e;
    tn_gguf_free(a);
    tn_gguf_free(b);
}

/* Matrices (2-D tensors) of the file, and how many of them are tq types of `bits` bits. */
static void count_bits(const char *path, int bits, int *matrices, int *at_bits) {
    tn_gguf *g;
    assert_int_equal(tn_gguf_open(path, false, &g), TERN_OK);
    *matrices = *at_bits = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        if (t->n_dims < 2) continue;
        (*matrices)++;
        tn_tq_params p;
        if (tn_tq_is(t->type) && (tn_tq_params_of(t->type, &p), p.bits == bits)) (*at_bits)++;
    }
    tn_gguf_free(g);
}

static bool file_has(const char *path, const char *needle) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char buf[65536];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, needle) != NULL;
}

/* Each of the argument patterns (two %s: model, out) is a usage error (exit 64) with no file. */
static void expect_usage_errors(const char *tern, const char *model, const char *out, const char *const *bad, size_t n) {
    char args[2048], cmd[4096];
    for (size_t i = 0; i < n; i++) {
        snprintf(args, sizeof args, bad[i], model, out);
        snprintf(cmd, sizeof cmd, "'%s' quantize %s -t 1 2>/dev/null", tern, args);
        assert_int_equal(run(cmd), 64);
        assert_int_not_equal(access(out, F_OK), 0);
    }
}

static void test_cli(void **st) {
    (void)st;
    const char *tern = getenv("TERN_BIN");
    if (!tern || !*tern) skip();
    char model[512], out[512], cmd[4096];
    tiny_tmp_path(model, sizeof model, "tbpw-model");
    tiny_tmp_path(out, sizeof out, "tbpw-out");
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    assert_int_equal(tiny_model_write(model, &cfg), TERN_OK);
    const double targets[] = {2.5, 3.5, 4.5, 6};
    double prev = INFINITY;
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        snprintf(cmd, sizeof cmd, "'%s' quantize --target-bpw %g --calib-chunks 0 '%s' '%s' tq3g64a -t 2 2>/dev/null", tern,
                 targets[i], model, out);
        assert_int_equal(run(cmd), 0);
        double bpw, err;
        bool fam;
        measure(model, out, &bpw, &err, &fam);
        print_message("target %.2f: %.4f bpw, error %.5g\n", targets[i], bpw, err);
        assert_true(bpw <= targets[i]);
        assert_true(bpw >= targets[i] - 0.15);
        assert_true(err <= prev);
        assert_true(fam);
        prev = err;
        unlink(out);
    }
    /* the default: sensitivities probed on text the model writes itself */
    snprintf(cmd, sizeof cmd, "'%s' quantize --target-bpw 3.5 --calib-chunks 4 '%s' '%s' tq3g64a -t 2 2>/dev/null", tern, model, out);
    assert_int_equal(run(cmd), 0);
    double bpw, err;
    bool fam;
    measure(model, out, &bpw, &err, &fam);
    assert_true(bpw <= 3.5 && bpw >= 3.35 && fam);
    unlink(out);
    static const char *const bad[] = {"--target-bpw 0.2 %s %s tq3", "--target-bpw x %s %s tq3",
                                      "--target-bpw 1.0 %s %s tq3", "--target-bpw 4 %s %s Q4_K_M"};
    expect_usage_errors(tern, model, out, bad, sizeof bad / sizeof bad[0]);
    /* the sizes a plan can reach are known before any tensor is weighed: an unreachable target is
     * refused before the probes (no tensor's predicted KL printed), and a target above the all-8-bit
     * file puts every matrix the plan chooses at 8 bits without measuring */
    char log[512];
    tiny_tmp_path(log, sizeof log, "tbpw-log");
    snprintf(cmd, sizeof cmd, "'%s' quantize --target-bpw 1.0 '%s' '%s' tq3g64a -t 1 2>'%s'", tern, model, out, log);
    assert_int_equal(run(cmd), 64);
    assert_true(file_has(log, "below the smallest file possible with tq1g64a"));
    assert_false(file_has(log, "predicted KL"));
    assert_false(file_has(log, "measuring sensitivities"));
    snprintf(cmd, sizeof cmd, "'%s' quantize --target-bpw 12 '%s' '%s' tq3g64a -t 1 2>'%s'", tern, model, out, log);
    assert_int_equal(run(cmd), 0);
    assert_true(file_has(log, "no measuring needed"));
    assert_false(file_has(log, "predicted KL"));
    int mats, at8;
    count_bits(out, 8, &mats, &at8);
    /* every matrix of the tiny model is the plan's (rows of 64 or 256 numbers, no overrides) */
    assert_true(mats > 0);
    assert_int_equal(at8, mats);
    unlink(out), unlink(log);
    unlink(model);
}

/* The error --target-bpw printed for `name` as extra type `type` ("predicted KL as TYPE (B bpw) E"). */
static bool logged_extra(const char *log, const char *name, const char *type, double *out) {
    FILE *f = fopen(log, "r");
    if (!f) return false;
    char line[1024], nm[256], ty[64];
    double b, v;
    bool ok = false;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "target-bpw: %255s predicted KL as %63s (%lf bpw) %lf", nm, ty, &b, &v) == 4 && !strcmp(nm, name) &&
            !strcmp(ty, type))
            *out = v, ok = true;
    fclose(f);
    return ok;
}

static void test_cli_types(void **st) {
    (void)st;
    const char *tern = getenv("TERN_BIN");
    if (!tern || !*tern) skip();
    char model[512], out[512], log[512], cmd[4096];
    tiny_tmp_path(model, sizeof model, "tbpwx-model");
    tiny_tmp_path(out, sizeof out, "tbpwx-out");
    tiny_tmp_path(log, sizeof log, "tbpwx-log");
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    assert_int_equal(tiny_model_write(model, &cfg), TERN_OK);
    const double target = 3.0;
    snprintf(cmd, sizeof cmd, "'%s' quantize --target-bpw %g --target-types vq2,q4_K,q8_0 --calib-chunks 0 '%s' '%s' tq3g64a -t 2 2>'%s'",
             tern, target, model, out, log);
    assert_int_equal(run(cmd), 0);
    tn_gguf *a, *b;
    assert_int_equal(tn_gguf_open(model, false, &a), TERN_OK);
    assert_int_equal(tn_gguf_open(out, false, &b), TERN_OK);
    double bytes = 0, el = 0;
    int extra = 0;
    for (uint64_t i = 0; i < b->n_tensors; i++) {
        const tn_gguf_tensor *t = &b->tensors[i];
        bytes += (double)t->nbytes, el += (double)(t->ne[0] * t->ne[1]);
        if (t->n_dims < 2) continue;
        tn_tq_params p;
        const bool fam = tn_tq_is(t->type) && (tn_tq_params_of(t->type, &p), p.group == 64 && p.asym);
        const bool wide = t->type == TN_VQ2 || t->type == TN_Q4_K;
        if (!fam && !wide && t->type != TN_Q8_0) fail_msg("%s is %s: not a candidate", t->name, tn_dtype_name(t->type));
        if (wide && t->ne[0] % 256) fail_msg("%s is %s with rows of %lld", t->name, tn_dtype_name(t->type), (long long)t->ne[0]);
        extra += !fam;
    }
    const double bpw = 8 * bytes / el;
    print_message("--target-types: %.4f bpw, %d matrices of the extra types\n", bpw, extra);
    assert_true(bpw <= target && bpw >= target - 0.15);
    /* the error it weighed blk.0.ffn_down.weight with as q8_0, computed here */
    const tn_gguf_tensor *o = tn_gguf_find_tensor(a, "blk.0.ffn_down.weight");
    assert_non_null(o);
    const int64_t ne0 = o->ne[0], rows = o->ne[1];
    const size_t rb = tn_dtype_row_size(TN_Q8_0, ne0);
    uint8_t *q = malloc(rb);
    float *y = malloc(sizeof(float) * (size_t)ne0);
    double want = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = (const float *)o->data + r * ne0;
        assert_true(tn_quantize_row_ref(TN_Q8_0, x, q, ne0));
        assert_true(tn_dequantize_row(TN_Q8_0, q, y, ne0));
        for (int64_t j = 0; j < ne0; j++) want += ((double)x[j] - y[j]) * ((double)x[j] - y[j]);
    }
    free(q), free(y);
    double got = -1;
    assert_true(logged_extra(log, "blk.0.ffn_down.weight", "q8_0", &got));
    print_message("blk.0.ffn_down.weight as q8_0: logged %.6g, computed %.6g\n", got, want);
    assert_true(fabs(got - want) <= 1e-3 * want);
    tn_gguf_free(a);
    tn_gguf_free(b);
    snprintf(cmd, sizeof cmd, "'%s' generate -m '%s' -p hello -n 4 --temp 0 >/dev/null 2>&1", tern, out);
    assert_int_equal(run(cmd), 0);
    unlink(out);
    static const char *const bad[] = {"--target-types vq2 %s %s tq3g64a", "--target-bpw 3 --target-types vq2,foo %s %s tq3g64a",
                                      "--target-bpw 3 --target-types tq4 %s %s tq3g64a",
                                      "--target-bpw 3 --target-types iq2_xs %s %s tq3g64a",
                                      "--target-bpw 3 --target-types vq2,,q4_K %s %s tq3g64a"};
    expect_usage_errors(tern, model, out, bad, sizeof bad / sizeof bad[0]);
    unlink(log), unlink(model);
}

/* The eight errors --target-bpw printed for `name` ("predicted KL at 1..8 bits"). */
static bool logged_errs(const char *log, const char *name, double out[8]) {
    FILE *f = fopen(log, "r");
    if (!f) return false;
    char line[1024], nm[256];
    double v[8];
    bool ok = false;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "target-bpw: %255s predicted KL at 1..8 bits %lf %lf %lf %lf %lf %lf %lf %lf", nm, &v[0], &v[1], &v[2],
                   &v[3], &v[4], &v[5], &v[6], &v[7]) == 9 &&
            !strcmp(nm, name)) {
            memcpy(out, v, sizeof v);
            ok = true;
        }
    fclose(f);
    return ok;
}

/* sum over rows of w(row's matrix) x sum_j imp_j (x_j - q(x)_j)^2 with the reference quantizer,
 * rows in matrices of mat_rows, imp one row of ne0 per matrix (NULL: 1). */
static double ref_err(const tn_tq_params *p, const float *x, int64_t rows, int64_t ne0, int64_t mat_rows, const float *imp,
                      const double *w) {
    uint8_t *q = malloc(tn_dtype_row_size((tn_dtype)tn_tq_dtype(p), ne0));
    float *y = malloc(sizeof(float) * (size_t)ne0);
    assert_non_null(q);
    assert_non_null(y);
    double tot = 0;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t m = r / mat_rows;
        const float *im = imp ? imp + m * ne0 : NULL;
        tn_tq_quantize_row(p, x + r * ne0, q, ne0, im);
        tn_tq_dequantize_row(p, q, y, ne0);
        double e = 0;
        for (int64_t j = 0; j < ne0; j++) {
            const double d = (double)x[r * ne0 + j] - y[j];
            e += (im ? im[j] : 1.0) * d * d;
        }
        tot += (w ? w[m] : 1.0) * e;
    }
    free(q), free(y);
    return tot;
}

static void test_moe(void **st) {
    (void)st;
    const char *tern = getenv("TERN_BIN");
    if (!tern || !*tern) skip();
    char model[512], out[512], imf[512], log[512], cmd[4096];
    tiny_tmp_path(model, sizeof model, "tbpw-moe");
    tiny_tmp_path(out, sizeof out, "tbpw-moe-out");
    tiny_tmp_path(imf, sizeof imf, "tbpw-moe-imat");
    tiny_tmp_path(log, sizeof log, "tbpw-moe-log");
    snprintf(cmd, sizeof cmd, "'%s' synth --arch qwen3moe --preset tiny --type f32 -o '%s' >/dev/null 2>&1", tern, model);
    assert_int_equal(run(cmd), 0);
    tn_gguf *g = NULL;
    assert_int_equal(tn_gguf_open(model, false, &g), TERN_OK);
    int64_t n_exp = 0, k = 0;
    assert_int_equal(tn_gguf_get_i64(g, "qwen3moe.expert_count", true, &n_exp), TERN_OK);
    assert_int_equal(tn_gguf_get_i64(g, "qwen3moe.expert_used_count", true, &k), TERN_OK);
    const char *ename = "blk.0.ffn_up_exps.weight", *dname = "blk.0.attn_q.weight";
    const tn_gguf_tensor *te = tn_gguf_find_tensor(g, ename), *td = tn_gguf_find_tensor(g, dname);
    assert_non_null(te);
    assert_non_null(td);
    assert_int_equal(te->type, 0);
    assert_int_equal(td->type, 0);
    assert_int_equal(te->ne[2], n_exp);
    const int64_t ne0 = te->ne[0], erows = te->ne[1] * te->ne[2], dne0 = td->ne[0], drows = td->ne[1];
    /* importances: per column, per expert; counts 0, 5, 10, ... (expert 0 never routed: importance 1) */
    float *esum = malloc(sizeof(float) * (size_t)(ne0 * n_exp)), *ecnt = malloc(sizeof(float) * (size_t)n_exp);
    float *eimp = malloc(sizeof(float) * (size_t)(ne0 * n_exp)), *dsum = malloc(sizeof(float) * (size_t)dne0);
    float *dimp = malloc(sizeof(float) * (size_t)dne0), dcnt = 7;
    double *w = malloc(sizeof(double) * (size_t)n_exp), *wu = malloc(sizeof(double) * (size_t)n_exp), ctot = 0;
    assert_true(esum && ecnt && eimp && dsum && dimp && w && wu);
    uint64_t r = 11;
    for (int64_t e = 0; e < n_exp; e++) {
        ecnt[e] = (float)(5 * e);
        ctot += ecnt[e];
        for (int64_t j = 0; j < ne0; j++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            const float v = 0.1f + 3.0f * (float)(r >> 40) / (float)(1 << 24);
            esum[e * ne0 + j] = v * ecnt[e];
            eimp[e * ne0 + j] = e == 0 ? 1.0f : esum[e * ne0 + j] / ecnt[e]; /* as the loader divides, in float */
        }
    }
    for (int64_t e = 0; e < n_exp; e++) w[e] = (double)k * ecnt[e] / ctot, wu[e] = (double)k / (double)n_exp;
    for (int64_t j = 0; j < dne0; j++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        dsum[j] = dcnt * (0.2f + 2.0f * (float)(r >> 40) / (float)(1 << 24));
        dimp[j] = dsum[j] / dcnt;
    }
    const char *names[2] = {dname, ename};
    const int64_t ne0s[2] = {dne0, ne0}, nmat[2] = {1, n_exp};
    const float *sums[2] = {dsum, esum}, *cnts[2] = {&dcnt, ecnt};
    assert_int_equal(tn_imatrix_save(imf, 2, names, ne0s, nmat, sums, cnts, "test", 1, 64), TERN_OK);
    tn_tq_params fam;
    assert_true(tn_tq_from_name("tq3g64a", &fam));
    for (int with = 0; with < 2; with++) {
        snprintf(cmd, sizeof cmd, "'%s' quantize %s%s%s --target-bpw 4 --calib-chunks 0 '%s' '%s' tq3g64a -t 2 2>'%s'", tern,
                 with ? "--imatrix '" : "", with ? imf : "", with ? "'" : "", model, out, log);
        assert_int_equal(run(cmd), 0);
        double got_e[8], got_d[8];
        assert_true(logged_errs(log, ename, got_e));
        assert_true(logged_errs(log, dname, got_d));
        for (int b = 1; b <= 8; b++) {
            tn_tq_params p = fam;
            p.bits = b;
            const double want_e = ref_err(&p, (const float *)te->data, erows, ne0, te->ne[1], with ? eimp : NULL, with ? w : wu);
            const double want_d = ref_err(&p, (const float *)td->data, drows, dne0, drows, with ? dimp : NULL, NULL);
            print_message("%s imatrix, %d bits: expert tensor %.4e (want %.4e), dense %.4e (want %.4e)\n", with ? "with" : "without",
                          b, got_e[b - 1], want_e, got_d[b - 1], want_d);
            assert_true(fabs(got_e[b - 1] - want_e) <= 0.01 * want_e);
            assert_true(fabs(got_d[b - 1] - want_d) <= 0.01 * want_d);
        }
        unlink(out), unlink(log);
    }
    tn_gguf_free(g);
    free(esum), free(ecnt), free(eimp), free(dsum), free(dimp), free(w), free(wu);
    unlink(model), unlink(imf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allocate),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_cli_types),
        cmocka_unit_test(test_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
