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
 * The float forward's loss is also checked against the double reference.
 * Tolerance: |analytic - numeric| <= 2e-3 * max(|numeric|, 1e-2) + 2e-5 — the analytic side is
 * float32 (~1e-7 relative per op, a few hundred ops deep), the numeric side double with h = 1e-4
 * (truncation error O(h^2) ~ 1e-8).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

#include "ref_train.h"
#include "train/rng.h"
#include "train/train.h"

static void check_cfg(tn_train_cfg cfg, int B, int T, int n_threads) {
    tn_tmodel *m;
    assert_int_equal(tn_tmodel_create(&cfg, n_threads, &m), TERN_OK);
    tn_tmodel_init_random(m, 7);
    /* larger, less uniform weights so every path carries signal; norms away from 1 */
    uint64_t rng = 99;
    for (int i = 0; i < m->n_tensors; i++) {
        float *p = tn_tp(m, m->params, i);
        for (size_t j = 0; j < m->t[i].n; j++)
            p[j] = m->t[i].n_dims == 1 ? (float)(1.0 + 0.3 * tn_rng_normal(&rng)) : (float)(0.3 * tn_rng_normal(&rng));
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_mha),
        cmocka_unit_test(test_grad_gqa_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
