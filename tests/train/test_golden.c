/*
 * test_golden.c — end-to-end golden: tern's training loop (tn_tmodel forward/backward, global-norm
 * clipping, warmup+cosine schedule, AdamW with decay on matrices) on a tiny config reproduces the
 * losses PyTorch computes independently (scripts/train_golden.py → tests/golden/train_tiny.txt):
 * the loss at step 0 and the loss before each of 10 steps and after the last.
 *
 * Tolerance 2e-5 absolute: PyTorch's float32 and float64 runs agree to ~3e-7, so the remaining
 * difference is float32 summation order (BLAS blocking, our fused softmax) amplified by 10
 * Adam steps whose update g/sqrt(v) is insensitive to gradient scale; observed <= 3e-7.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/rng.h"
#include "train/train.h"

#ifndef TERN_SOURCE_DIR
#define TERN_SOURCE_DIR "."
#endif

static void test_golden_tiny(void **st) {
    (void)st;
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/train_tiny.txt", TERN_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    double want[11];
    int n = 0;
    char line[512];
    while (fgets(line, sizeof line, f) && n < 11) {
        if (line[0] == '#') continue;
        int i;
        double a, b;
        if (sscanf(line, "%d %lf %lf", &i, &a, &b) == 3 && i == n) want[n++] = a;
    }
    fclose(f);
    assert_int_equal(n, 11);

    tn_train_cfg cfg = {.n_vocab = 32, .n_ctx = 8, .n_embd = 16, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 32,
                        .rms_eps = 1e-5f, .rope_base = 10000.0f};
    const int B = 2, T = 8, STEPS = 10;
    tn_tmodel *m;
    assert_int_equal(tn_tmodel_create(&cfg, 2, &m), TERN_OK);
    tn_tmodel_init_random(m, 1234);
    assert_int_equal(tn_tmodel_plan(m, B, T), TERN_OK);
    int32_t tok[16], tgt[16];
    uint64_t rng = 42;
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(tn_rng_next(&rng) % 32);
    for (int i = 0; i < B * T; i++) tgt[i] = (int32_t)(tn_rng_next(&rng) % 32);
    tn_adamw o = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
    double worst = 0;
    for (int step = 0; step <= STEPS; step++) {
        double loss;
        assert_int_equal(tn_tmodel_forward(m, tok, tgt, &loss), TERN_OK);
        double d = fabs(loss - want[step]);
        worst = fmax(worst, d);
        printf("step %2d  tern %.7f  torch %.7f  |d| %.1e\n", step, loss, want[step], d);
        assert_true(d < 2e-5);
        if (step == STEPS) break;
        tn_tmodel_zero_grad(m);
        tn_tmodel_backward(m);
        double gn = tn_grad_norm(m);
        float clip = gn > o.grad_clip ? (float)(o.grad_clip / (gn + 1e-6)) : 1.0f;
        tn_adamw_step(m, &o, tn_lr_at(step, 2, STEPS, o.lr, 0.1f), step + 1, clip);
    }
    printf("worst |loss difference| vs PyTorch: %.2e\n", worst);
    tn_tmodel_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_golden_tiny)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
