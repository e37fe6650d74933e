/*
 * test_spec.c — speculative decoding (src/model/spec.c) against decoding one token at a time.
 *
 * tn_spec_ngram on crafted histories (longest suffix first, most recent match, never past the
 * end, none when nothing repeats). tn_spec_verify on a tiny random model, CPU: for drafts that
 * are all right, right for a while, or wrong at once, greedy and sampled, the emitted tokens are
 * the ones a second context produces by tern_decode + tern_sampler_sample one token at a time
 * with an identically seeded sampler; afterwards both caches hold the same tokens (the next
 * logits agree), so the rejected rows were dropped. A step with more drafts than the context can
 * verify is refused with an error. tern_ctx_share_threads: two contexts on one set of threads, used
 * in turn as a draft model's and its target's are, give the logits each gives on its own threads;
 * unequal thread counts are refused; either context may be freed first.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/tiny_model.h"
#include "model/spec.h"

static void test_ngram(void **state) {
    (void)state;
    tern_token out[8];
    /* ... 5 6 7 8 9 ... 5 6 7 : the 3-gram "5 6 7" recurs, followed by 8 9 */
    const tern_token h1[] = {1, 5, 6, 7, 8, 9, 2, 5, 6, 7};
    assert_int_equal(tn_spec_ngram(h1, 10, 1, 3, 8, out), 6); /* 8 9 2 5 6 7: up to the end of the text */
    assert_int_equal(out[0], 8);
    assert_int_equal(out[1], 9);
    assert_int_equal(out[5], 7);
    assert_int_equal(tn_spec_ngram(h1, 10, 1, 3, 2, out), 2); /* kmax */
    /* the most recent earlier match wins: "4" occurs twice before, followed by 1 then by 3 */
    const tern_token h2[] = {4, 1, 0, 4, 3, 0, 4};
    assert_int_equal(tn_spec_ngram(h2, 7, 1, 1, 4, out), 3);
    assert_int_equal(out[0], 3);
    /* the longer suffix first: "0 4" recurs (followed by 3) though "4" also does */
    assert_int_equal(tn_spec_ngram(h2, 7, 1, 2, 1, out), 1);
    assert_int_equal(out[0], 3);
    /* nothing repeats: no draft; too short a text: none */
    const tern_token h3[] = {1, 2, 3, 4};
    assert_int_equal(tn_spec_ngram(h3, 4, 1, 3, 8, out), 0);
    assert_int_equal(tn_spec_ngram(h3, 1, 1, 3, 8, out), 0);
    /* nmin above every repeating length: none */
    assert_int_equal(tn_spec_ngram(h1, 10, 4, 4, 8, out), 0);
}

static tern_model *load_tiny(tiny_cfg *cfg) {
    tiny_cfg_default(cfg);
    cfg->wtype = TN_Q8_0;
    char path[512];
    tiny_tmp_path(path, sizeof path, "spec");
    assert_int_equal(tiny_model_write(path, cfg), TERN_OK);
    tern_model *m = NULL;
    assert_int_equal(tern_model_load(path, NULL, &m), TERN_OK);
    unlink(path);
    return m;
}

static tern_ctx *ctx_threads(const tern_model *m, int threads) {
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = 64;
    cp.n_threads = threads;
    tern_ctx *c = NULL;
    assert_int_equal(tern_ctx_create(m, &cp, &c), TERN_OK);
    return c;
}

static tern_ctx *ctx_of(const tern_model *m) { return ctx_threads(m, 2); }

static tern_sampler *sampler_of(const tern_model *m, float temp) {
    tern_sampler_params sp;
    tern_sampler_params_init(&sp);
    sp.temp = temp;
    sp.seed = 1234;
    tern_sampler *s = NULL;
    assert_int_equal(tern_sampler_create(m, &sp, &s), TERN_OK);
    return s;
}

/* the reference: n tokens after the prompt, one tern_decode + sample at a time */
static void reference(const tern_model *m, float temp, const tern_token *prompt, int32_t np, int32_t n, tern_token *out) {
    tern_ctx *c = ctx_of(m);
    tern_sampler *s = sampler_of(m, temp);
    assert_int_equal(tern_decode(c, prompt, np), TERN_OK);
    for (int32_t i = 0; i < n; i++) {
        out[i] = tern_sampler_sample(s, tern_get_logits(c, -1));
        assert_int_equal(tern_decode(c, &out[i], 1), TERN_OK);
    }
    tern_sampler_free(s);
    tern_ctx_free(c);
}

static void run_verify(const tern_model *m, float temp, int32_t n_right) {
    const tern_token prompt[] = {1, 270, 5, 300, 261, 380, 100};
    const int32_t np = 7, N = 24;
    tern_token ref[24];
    reference(m, temp, prompt, np, N, ref);
    tern_ctx *c = ctx_of(m);
    tern_sampler *s = sampler_of(m, temp);
    assert_int_equal(tern_decode(c, prompt, np), TERN_OK);
    tern_token got[40], cur = tern_sampler_sample(s, tern_get_logits(c, -1));
    int32_t n = 0;
    got[n++] = cur;
    while (n < N) {
        /* drafts: the reference's next tokens, the first n_right of them right, then wrong ones */
        tern_token draft[6];
        const int32_t k = 6;
        for (int32_t i = 0; i < k; i++) {
            const tern_token r = n + i < N ? ref[n + i] : 3;
            draft[i] = i < n_right ? r : (tern_token)((r + 1) % 384);
        }
        tern_token emit[8];
        int32_t ne = 0;
        assert_int_equal(tn_spec_verify(c, s, cur, draft, k, emit, &ne), TERN_OK);
        assert_true(ne >= 1 && ne <= k + 1);
        /* accepted: exactly the right drafts (a wrong draft can still be the sampler's pick only
         * if it equals the reference token, which it never does here) */
        assert_int_equal(ne - 1, n + TN_MIN(n_right, k) <= N ? TN_MIN(n_right, k) : ne - 1);
        for (int32_t i = 0; i < ne; i++) got[n++] = emit[i];
        assert_int_equal(tern_ctx_n_past(c), np + n - 1); /* the cache holds every token but the newest */
        cur = emit[ne - 1];
    }
    for (int32_t i = 0; i < N; i++)
        if (got[i] != ref[i]) fail_msg("temp %.1f, %d right drafts: token %d is %d, one at a time %d", temp, n_right, i, got[i], ref[i]);
    /* the rollback: decoding the same next token in both gives the same logits */
    tern_ctx *r = ctx_of(m);
    tern_token all[64];
    memcpy(all, prompt, sizeof prompt);
    memcpy(all + np, got, sizeof *got * (size_t)(n - 1));
    assert_int_equal(tern_decode(r, all, np + n - 1), TERN_OK);
    assert_int_equal(tern_decode(r, &cur, 1), TERN_OK);
    assert_int_equal(tern_decode(c, &cur, 1), TERN_OK);
    const int32_t nv = tern_model_n_vocab(m);
    double num = 0, den = 0;
    for (int32_t i = 0; i < nv; i++) {
        const double a = tern_get_logits(r, -1)[i], b = tern_get_logits(c, -1)[i];
        num += (a - b) * (a - b), den += a * a;
    }
    assert_true(sqrt(num / den) < 1e-4);
    tern_ctx_free(r);
    tern_sampler_free(s);
    tern_ctx_free(c);
}

static void test_verify(void **state) {
    (void)state;
    tiny_cfg cfg;
    tern_model *m = load_tiny(&cfg);
    for (int32_t right = 0; right <= 6; right += 3) {
        run_verify(m, 0.0f, right);
        run_verify(m, 0.9f, right);
    }
    /* more drafts than a context's logit rows: refused, nothing decoded */
    tern_ctx *c = ctx_of(m);
    tern_sampler *s = sampler_of(m, 0.0f);
    tern_token d[70] = {0}, e[72];
    int32_t ne = -1;
    assert_int_equal(tn_spec_verify(c, s, 1, d, 70, e, &ne), TERN_ERR_INVALID_ARG);
    assert_int_equal(ne, 0);
    assert_int_equal(tern_ctx_n_past(c), 0);
    tern_sampler_free(s);
    tern_ctx_free(c);
    tern_model_free(m);
}

/* greedy continuation of n tokens in c, checking each step's logits against ref's (same model) */
static int32_t g_nv;
static void shared_step(tern_ctx *c, tern_ctx *ref, tern_token t) {
    assert_int_equal(tern_decode(c, &t, 1), TERN_OK);
    assert_int_equal(tern_decode(ref, &t, 1), TERN_OK);
    const float *a = tern_get_logits(c, -1), *b = tern_get_logits(ref, -1);
    for (int32_t i = 0; i < g_nv; i++)
        if (a[i] != b[i]) fail_msg("token %d: logit %d is %g on shared threads, %g on its own", t, i, a[i], b[i]);
}

/* tn_spec_prob: softmax of a logit, against the sum written out (and a shifted copy, so a
 * large-logit overflow would show) */
static void test_prob(void **state) {
    (void)state;
    const float l[4] = {1.0f, -2.0f, 3.0f, 0.5f}, big[4] = {1001.0f, 998.0f, 1003.0f, 1000.5f};
    const double z = exp(1.0) + exp(-2.0) + exp(3.0) + exp(0.5);
    for (int t = 0; t < 4; t++) {
        const double want = exp((double)l[t]) / z;
        assert_true(fabs(tn_spec_prob(l, 4, t) - want) < 1e-12);
        assert_true(fabs(tn_spec_prob(big, 4, t) - want) < 1e-9);
    }
}

static void test_share_threads(void **state) {
    (void)state;
    tiny_cfg cfg;
    tern_model *m = load_tiny(&cfg);
    g_nv = tern_model_n_vocab(m);
    for (int order = 0; order < 2; order++) {
        tern_ctx *target = ctx_of(m), *draft = ctx_of(m), *rt = ctx_of(m), *rd = ctx_of(m);
        assert_int_equal(tern_ctx_share_threads(draft, target), TERN_OK);
        assert_int_equal(tern_ctx_share_threads(draft, target), TERN_OK); /* again: nothing changes */
        /* in turn, as speculation runs them: the draft a few tokens, the target a batch */
        const tern_token prompt[] = {1, 270, 5, 300, 261, 380, 100};
        assert_int_equal(tern_decode(target, prompt, 7), TERN_OK);
        assert_int_equal(tern_decode(rt, prompt, 7), TERN_OK);
        for (int i = 0; i < 12; i++) {
            shared_step(draft, rd, (tern_token)(7 + 29 * i));
            shared_step(target, rt, (tern_token)(11 + 31 * i));
        }
        if (order) { /* the owner first: the other keeps the threads */
            tern_ctx_free(target), target = NULL;
            shared_step(draft, rd, 5);
        } else {
            tern_ctx_free(draft), draft = NULL;
            shared_step(target, rt, 5);
        }
        tern_ctx_free(draft), tern_ctx_free(target), tern_ctx_free(rt), tern_ctx_free(rd);
    }
    tern_ctx *a = ctx_threads(m, 2), *b = ctx_threads(m, 1);
    assert_int_equal(tern_ctx_share_threads(b, a), TERN_ERR_INVALID_ARG);
    assert_int_equal(tern_decode(b, (tern_token[]){1, 2}, 2), TERN_OK); /* still on its own thread */
    tern_ctx_free(a), tern_ctx_free(b);
    tern_model_free(m);
}

/* Pearson's chi-square of counts against n * p over bins of expected count >= 5 (the rest pooled
 * into one bin); *df gets the degrees of freedom. */
static double chi_square(const int *count, const double *p, int32_t nv, int n, int *df) {
    double chi = 0, pool_e = 0, pool_o = 0;
    int bins = 0;
    for (int32_t i = 0; i < nv; i++) {
        const double e = n * p[i];
        if (e < 5) {
            pool_e += e, pool_o += count[i];
            continue;
        }
        chi += (count[i] - e) * (count[i] - e) / e, bins++;
    }
    if (pool_e > 0) chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e, bins++;
    *df = bins - 1;
    return chi;
}

/* The distribution of the token emitted at a drafted position is the target's: 4000 verification
 * steps (temperature 0.7, no top-k/p/min-p, a fresh seed each) with a fixed draft token (the
 * target's 4th most likely) against p = softmax(logits / 0.7) computed here in double from the
 * logits of one-token decoding. Pearson's chi-square must stay under the 0.001 critical value
 * (Wilson-Hilferty); the same draws under a biased rule (an unaccepted draft kept anyway 10% of
 * the time) must exceed it, so the test can tell. Seeds are fixed: the outcome is deterministic. */
static void test_distribution(void **state) {
    (void)state;
    tiny_cfg cfg;
    tern_model *m = load_tiny(&cfg);
    const int32_t nv = tern_model_n_vocab(m);
    const tern_token prompt[] = {1, 270, 5, 300, 261, 380, 100}, cur = 42;
    const int32_t np = 7;
    const float temp = 0.7f;
    tern_ctx *r = ctx_of(m);
    assert_int_equal(tern_decode(r, prompt, np), TERN_OK);
    assert_int_equal(tern_decode(r, &cur, 1), TERN_OK);
    const float *l = tern_get_logits(r, -1);
    double *p = calloc((size_t)nv, sizeof *p), mx = -1e300, z = 0;
    for (int32_t i = 0; i < nv; i++) mx = fmax(mx, (double)l[i] / temp);
    for (int32_t i = 0; i < nv; i++) z += p[i] = exp((double)l[i] / temp - mx);
    for (int32_t i = 0; i < nv; i++) p[i] /= z;
    tern_token top[4] = {-1, -1, -1, -1}; /* the 4 most likely tokens, in order */
    for (int rank = 0; rank < 4; rank++)
        for (int32_t i = 0; i < nv; i++) {
            bool taken = false;
            for (int j = 0; j < rank; j++) taken |= top[j] == i;
            if (!taken && (top[rank] < 0 || p[i] > p[top[rank]])) top[rank] = i;
        }
    const tern_token draft = top[3];
    tern_ctx *c = ctx_threads(m, 1);
    assert_int_equal(tern_decode(c, prompt, np), TERN_OK);
    enum { N = 4000 };
    int *fair = calloc((size_t)nv, sizeof *fair), *biased = calloc((size_t)nv, sizeof *biased), accepted = 0;
    uint64_t rs = 0x9E3779B97F4A7C15u;
    for (int i = 0; i < N; i++) {
        tern_sampler_params sp;
        tern_sampler_params_init(&sp);
        sp.temp = temp, sp.top_k = 0, sp.top_p = 1.0f, sp.min_p = 0.0f, sp.seed = (uint64_t)(1000 + i);
        tern_sampler *s = NULL;
        assert_int_equal(tern_sampler_create(m, &sp, &s), TERN_OK);
        tern_token out[2];
        int32_t ne = 0;
        assert_int_equal(tn_spec_verify(c, s, cur, &draft, 1, out, &ne), TERN_OK);
        assert_int_equal(tern_ctx_truncate(c, np), TERN_OK);
        tern_sampler_free(s);
        fair[out[0]]++;
        accepted += ne == 2;
        rs = rs * 6364136223846793005u + 1442695040888963407u;
        const bool keep_anyway = out[0] != draft && (rs >> 40) % 10 == 0;
        biased[keep_anyway ? draft : out[0]]++;
    }
    int df = 0, df_b = 0;
    const double chi = chi_square(fair, p, nv, N, &df), chi_b = chi_square(biased, p, nv, N, &df_b);
    const double h = 2.0 / (9.0 * df), crit = df * pow(1 - h + 3.090232 * sqrt(h), 3); /* z(0.999) */
    print_message("draft token %d (p %.4f) accepted %d of %d; chi-square %.1f (df %d, 0.001 critical %.1f), biased rule %.1f\n",
                  draft, p[draft], accepted, N, chi, df, crit, chi_b);
    if (!(chi < crit)) fail_msg("speculative sampling: chi-square %.1f >= %.1f (df %d)", chi, crit, df);
    if (!(chi_b > crit)) fail_msg("the biased rule was not detected: chi-square %.1f <= %.1f", chi_b, crit);
    assert_true(df > 10);
    free(p), free(fair), free(biased);
    tern_ctx_free(c);
    tern_ctx_free(r);
    tern_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_ngram), cmocka_unit_test(test_verify),
                                       cmocka_unit_test(test_share_threads), cmocka_unit_test(test_prob),
                                       cmocka_unit_test(test_distribution)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
