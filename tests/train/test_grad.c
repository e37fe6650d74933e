/*
 * test_grad.c — gradient checks of the training backward against central finite differences of
 * an independent double-precision forward (ref_train.h), on small shapes.
 *
 * Every backward op is reached through the parameter whose gradient depends on it:
 *   output.weight            cross-entropy (fused softmax) + output projection
 *   output_norm.weight       final RMSNorm (weight grad)
 *   blk.L.ffn_down/up/gate   SwiGLU backward + linear backward
 *   blk.L.ffn_norm           RMSNorm backward (weight) through the FFN
 *   blk.L.attn_output        attention output projection
 *   blk.L.attn_v             attention backward (dV through softmax probabilities), GQA sum
 *   blk.L.attn_q / attn_k    softmax backward, inverse RoPE, GQA accumulation of dK
 *   blk.L.attn_norm          RMSNorm input backward through the residual stream
 *   token_embd.weight        embedding scatter-add + every input gradient above (layer 0)
 * and, for qwen2 and qwen3 (the families' own steps):
 *   blk.L.attn_q/k/v.bias    bias backward (column sums) after the q/k inverse RoPE (halves)
 *   blk.L.attn_q/k_norm      per-head RMSNorm backward (weight grad); its input gradient is on
 *                            the path to attn_q / attn_k / attn_norm and token_embd
 *   attn_q, attn_output      with head_dim != n_embd / n_head (query rows n_head * head_dim)
 * Chunked logits / cross-entropy (several chunks, ragged) are checked the same way.
 * The float forward's loss is also checked against the double reference, and the training of
 * every family is deterministic: the same steps twice give bit-identical parameters (2 threads),
 * and 1 and 2 threads agree to float rounding.
 * Tolerance: |analytic - numeric| <= 2e-3 * max(|numeric|, 1e-2) + 2e-5 — the analytic side is
 * float32 (~1e-7 relative per op, a few hundred ops deep), the numeric side double with h = 1e-4
 * (truncation error O(h^2) ~ 1e-8).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "ref_train.h"
#include "train/rng.h"
#include "train/train.h"

/* The tensors layer 0 must have (written from llama.cpp's per-family tensor lists), NULL-ended. */
static void expect_tensors(const tn_tmodel *m, const char *const *want, const char *const *absent) {
    ref_ctx r = {.m = m, .P = m->params};
    for (; want && *want; want++) {
        if (ref_find(&r, *want, 0) < 0) printf("missing %s\n", *want);
        assert_true(ref_find(&r, *want, 0) >= 0);
    }
    for (; absent && *absent; absent++) assert_true(ref_find(&r, *absent, 0) < 0);
}

static int g_recompute; /* tn_recompute of the models check_cfg makes */
static int g_ce_rows;   /* logits rows at a time (0: default, one chunk at these sizes) */

static void check_cfg(tn_train_cfg cfg, int B, int T, int n_threads) {
    tn_tmodel *m;
    assert_int_equal(tn_tmodel_create(&cfg, n_threads, &m), TERN_OK);
    m->recompute = g_recompute;
    m->ce_rows = g_ce_rows;
    static const char *const common[] = {"token_embd.weight", "output_norm.weight", "output.weight", "blk.%d.attn_norm.weight",
                                         "blk.%d.attn_q.weight", "blk.%d.attn_k.weight", "blk.%d.attn_v.weight",
                                         "blk.%d.attn_output.weight", "blk.%d.ffn_norm.weight", "blk.%d.ffn_gate.weight",
                                         "blk.%d.ffn_up.weight", "blk.%d.ffn_down.weight", NULL};
    static const char *const biases[] = {"blk.%d.attn_q.bias", "blk.%d.attn_k.bias", "blk.%d.attn_v.bias", NULL};
    static const char *const qk_norms[] = {"blk.%d.attn_q_norm.weight", "blk.%d.attn_k_norm.weight", NULL};
    const char *fam = cfg.arch ? cfg.arch->name : "llama";
    expect_tensors(m, common, NULL);
    expect_tensors(m, !strcmp(fam, "qwen2") ? biases : NULL, !strcmp(fam, "qwen2") ? qk_norms : biases);
    expect_tensors(m, !strcmp(fam, "qwen3") ? qk_norms : NULL, !strcmp(fam, "qwen3") ? biases : qk_norms);
    printf("%s: %d tensors, head_dim %d, query rows %d\n", fam, m->n_tensors, m->hp.head_dim, m->hp.head_dim * cfg.n_head);
    tn_tmodel_init_random(m, 7);
    /* larger, less uniform weights so every path carries signal; norms away from 1 */
    uint64_t rng = 99;
    for (int i = 0; i < m->n_tensors; i++) {
        float *p = tn_tp(m, m->params, i);
        for (size_t j = 0; j < m->t[i].n; j++)
            p[j] = m->t[i].n_dims == 1 && !strstr(m->t[i].name, ".bias") ? (float)(1.0 + 0.3 * tn_rng_normal(&rng))
                                                                           : (float)(0.3 * tn_rng_normal(&rng));
    }
    assert_int_equal(tn_tmodel_plan(m, B, T), TERN_OK);
    int32_t tok[64], tgt[64];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)tn_rng_below(&rng, (uint64_t)cfg.n_vocab);
        tgt[i] = (int32_t)tn_rng_below(&rng, (uint64_t)cfg.n_vocab);
    }
    double loss;
    assert_int_equal(tn_tmodel_forward(m, tok, tgt, &loss), TERN_OK);
    ref_ctx r = {.m = m, .P = m->params};
    double rl = ref_loss(&r, tok, tgt, B, T);
    printf("loss float %.9f  double ref %.9f\n", loss, rl);
    assert_true(fabs(loss - rl) < 1e-5 * fabs(rl) + 1e-6);
    tn_tmodel_zero_grad(m);
    tn_tmodel_backward(m);
    int n_checked = 0, n_bad = 0;
    double worst = 0;
    for (int ti = 0; ti < m->n_tensors; ti++) {
        const tn_tparam *t = &m->t[ti];
        /* up to 12 entries per tensor, spread over it */
        size_t step = t->n > 12 ? t->n / 12 : 1;
        for (size_t j = (size_t)ti % step; j < t->n; j += step) {
            size_t i = t->off + j;
            const double h = 1e-4, p0 = m->params[i];
            r.use_over = true;
            r.over_i = i;
            r.over_v = p0 + h;
            double lp = ref_loss(&r, tok, tgt, B, T);
            r.over_v = p0 - h;
            double lm = ref_loss(&r, tok, tgt, B, T);
            r.use_over = false;
            double num = (lp - lm) / (2 * h), ana = m->grads[i];
            double tol = 2e-3 * fmax(fabs(num), 1e-2) + 2e-5;
            double err = fabs(ana - num);
            if (err / (fabs(num) + 1e-2) > worst) worst = err / (fabs(num) + 1e-2);
            if (err > tol) {
                n_bad++;
                printf("MISMATCH %s[%zu]: analytic %.8g numeric %.8g\n", t->name, j, ana, num);
            }
            n_checked++;
        }
    }
    printf("checked %d gradients (%d tensors), worst relative error %.3g, %d mismatches\n", n_checked, m->n_tensors, worst, n_bad);
    assert_int_equal(n_bad, 0);
    tn_tmodel_free(m);
}

static void test_grad_mha(void **st) {
    (void)st;
    tn_train_cfg c = {.n_vocab = 13, .n_ctx = 8, .n_embd = 8, .n_layer = 2, .n_head = 2, .n_head_kv = 2, .n_ff = 12,
                      .rms_eps = 1e-5f, .rope_base = 10000.0f};
    check_cfg(c, 2, 5, 1);
}

static void test_grad_gqa_threads(void **st) {
    (void)st;
    tn_train_cfg c = {.n_vocab = 11, .n_ctx = 8, .n_embd = 16, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 20,
                      .rms_eps = 1e-5f, .rope_base = 100.0f};
    check_cfg(c, 3, 6, 2);
}

static const tn_arch_desc *family(const char *name) {
    const tn_arch_desc *a = tn_arch_find(name, strlen(name));
    assert_non_null(a);
    return a;
}

/* qwen2: q/k/v biases, RoPE on halves; its descriptor's defaults (rms_eps, rope base 1e4). */
static void test_grad_qwen2(void **st) {
    (void)st;
    const tn_arch_desc *a = family("qwen2");
    tn_train_cfg c = {.n_vocab = 13, .n_ctx = 8, .n_embd = 8, .n_layer = 2, .n_head = 2, .n_head_kv = 2, .n_ff = 12,
                      .rms_eps = a->rms_eps, .rope_base = a->rope_base, .arch = a};
    check_cfg(c, 2, 5, 1);
    c = (tn_train_cfg){.n_vocab = 11, .n_ctx = 8, .n_embd = 16, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 20,
                       .rms_eps = 1e-5f, .rope_base = 100.0f, .arch = a};
    check_cfg(c, 3, 6, 2);
}

/* qwen3: per-head q/k RMSNorm before RoPE on halves; head_dim 6 over n_embd 8 / 2 heads (query
 * rows 12 != n_embd, as Qwen3-0.6B's 16 x 128 over 1024), then the default head_dim with GQA. A
 * low rope base so that rotation angles differ a lot between pairs. */
static void test_grad_qwen3(void **st) {
    (void)st;
    const tn_arch_desc *a = family("qwen3");
    tn_train_cfg c = {.n_vocab = 13, .n_ctx = 8, .n_embd = 8, .n_layer = 2, .n_head = 2, .n_head_kv = 1, .n_ff = 12,
                      .rms_eps = a->rms_eps, .rope_base = 100.0f, .head_dim = 6, .arch = a};
    check_cfg(c, 2, 5, 1);
    c = (tn_train_cfg){.n_vocab = 11, .n_ctx = 8, .n_embd = 16, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 20,
                       .rms_eps = a->rms_eps, .rope_base = a->rope_base, .arch = a};
    check_cfg(c, 3, 6, 2);
    c.head_dim = 10; /* wider than n_embd / n_head */
    check_cfg(c, 2, 4, 2);
}

/* Backward that recomputes what forward did not keep (--recompute attn: the attention
 * probabilities; full: each layer from its input) against central differences, as above. */
static void test_grad_recompute(void **st) {
    (void)st;
    const tn_arch_desc *q3 = family("qwen3");
    tn_train_cfg c = {.n_vocab = 11, .n_ctx = 8, .n_embd = 16, .n_layer = 3, .n_head = 4, .n_head_kv = 2, .n_ff = 20,
                      .rms_eps = 1e-5f, .rope_base = 100.0f};
    for (int rc = TN_RECOMPUTE_ATTN; rc <= TN_RECOMPUTE_FULL; rc++) {
        g_recompute = rc;
        printf("recompute %s\n", tn_recompute_name((tn_recompute)rc));
        check_cfg(c, 3, 6, 2);
        tn_train_cfg c3 = {.n_vocab = 13, .n_ctx = 8, .n_embd = 8, .n_layer = 3, .n_head = 2, .n_head_kv = 1, .n_ff = 12,
                           .rms_eps = q3->rms_eps, .rope_base = 100.0f, .head_dim = 6, .arch = q3};
        check_cfg(c3, 2, 5, 2);
    }
    g_recompute = TN_RECOMPUTE_NONE;
}

/* Chunked logits and cross-entropy (train.h, tn_ce_rows): the output projection, softmax, loss
 * and the logits' gradient 4 and 5 rows at a time (ragged last chunks over 18 and 10 tokens;
 * backward recomputes each chunk's logits), with full recomputation too, against central
 * differences as above: output.weight's gradient is added over the chunks, every other one flows
 * from the chunks' d xf rows. */
static void test_grad_ce_chunked(void **st) {
    (void)st;
    const tn_arch_desc *q3 = family("qwen3");
    tn_train_cfg c = {.n_vocab = 11, .n_ctx = 8, .n_embd = 16, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 20,
                      .rms_eps = 1e-5f, .rope_base = 100.0f};
    tn_train_cfg c3 = {.n_vocab = 13, .n_ctx = 8, .n_embd = 8, .n_layer = 2, .n_head = 2, .n_head_kv = 1, .n_ff = 12,
                       .rms_eps = q3->rms_eps, .rope_base = 100.0f, .head_dim = 6, .arch = q3};
    for (int rows = 4; rows <= 5; rows++) {
        g_ce_rows = rows;
        printf("logits %d rows at a time\n", rows);
        assert_true(tn_ce_rows(&c, 3, 6, rows) == rows);
        check_cfg(c, 3, 6, 2);
        check_cfg(c3, 2, 5, 1);
    }
    g_recompute = TN_RECOMPUTE_FULL;
    check_cfg(c, 3, 6, 2);
    g_recompute = TN_RECOMPUTE_NONE;
    g_ce_rows = 0;
}

/* Three AdamW steps of a family's model with n_threads; returns the final loss, params into out. */
static double run_steps(tn_train_cfg cfg, int n_threads, float *out) {
    tn_tmodel *m;
    assert_int_equal(tn_tmodel_create(&cfg, n_threads, &m), TERN_OK);
    tn_tmodel_init_random(m, 3);
    const int B = 2, T = 7;
    assert_int_equal(tn_tmodel_plan(m, B, T), TERN_OK);
    int32_t tok[14], tgt[14];
    uint64_t rng = 17;
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)tn_rng_below(&rng, (uint64_t)cfg.n_vocab);
        tgt[i] = (int32_t)tn_rng_below(&rng, (uint64_t)cfg.n_vocab);
    }
    tn_adamw o;
    tn_adamw_default(&o);
    o.lr = 1e-2f;
    double loss = 0;
    for (int step = 0; step < 3; step++) {
        assert_int_equal(tn_tmodel_forward(m, tok, tgt, &loss), TERN_OK);
        tn_tmodel_zero_grad(m);
        tn_tmodel_backward(m);
        tn_adamw_step(m, &o, o.lr, step + 1, 1.0f);
    }
    assert_int_equal(tn_tmodel_forward(m, tok, tgt, &loss), TERN_OK);
    memcpy(out, m->params, m->n_params * sizeof(float));
    tn_tmodel_free(m);
    return loss;
}

static void test_determinism(void **st) {
    (void)st;
    const char *fams[3] = {"llama", "qwen2", "qwen3"};
    for (int f = 0; f < 3; f++) {
        const tn_arch_desc *a = family(fams[f]);
        tn_train_cfg c = {.n_vocab = 17, .n_ctx = 8, .n_embd = 16, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 24,
                          .rms_eps = a->rms_eps, .rope_base = a->rope_base, .head_dim = f == 2 ? 8 : 0, .arch = a};
        size_t pb, ab;
        tn_tmodel_mem(&c, 2, 7, 2, &pb, &ab);
        const size_t np = pb / (4 * sizeof(float));
        float *p1 = malloc(np * sizeof(float)), *p2 = malloc(np * sizeof(float)), *p3 = malloc(np * sizeof(float));
        double l1 = run_steps(c, 2, p1), l2 = run_steps(c, 2, p2), l3 = run_steps(c, 1, p3);
        double dmax = 0;
        for (size_t i = 0; i < np; i++) dmax = fmax(dmax, fabs((double)p1[i] - p3[i]));
        printf("%s: loss after 3 steps %.7f (2 threads, twice: %s), 1 thread %.7f, max |d param| 1 vs 2 threads %.2e\n",
               fams[f], l1, memcmp(p1, p2, np * sizeof(float)) ? "DIFFER" : "bit-identical", l3, dmax);
        assert_memory_equal(p1, p2, np * sizeof(float));
        assert_true(l1 == l2);
        /* 1 vs 2 threads: only the order of the RMSNorm weight gradients' per-thread partial sums
         * differs (float rounding, ~1e-7 relative; observed <= 1.2e-7 after 3 steps of lr 1e-2) */
        assert_true(fabs(l1 - l3) < 1e-5);
        assert_true(dmax < 1e-5);
        free(p1);
        free(p2);
        free(p3);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_mha),
        cmocka_unit_test(test_grad_gqa_threads),
        cmocka_unit_test(test_grad_qwen2),
        cmocka_unit_test(test_grad_qwen3),
        cmocka_unit_test(test_grad_recompute),
        cmocka_unit_test(test_grad_ce_chunked),
        cmocka_unit_test(test_determinism),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
