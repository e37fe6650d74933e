/*
 * test_lora_golden.c — end-to-end golden for LoRA fine-tuning (QLoRA): tern's LoRA training loop
 * (frozen base in its file type dequantized on the fly, adapters on q, k, v, o, gate, up, down,
 * forward/backward, clipping over the adapters, warmup+cosine schedule, AdamW with the adapters
 * undecayed) on the tiny llama that tests/common/tiny_model.c writes, in f32 and q8_0, reproduces
 * the losses PyTorch computes independently (scripts/lora_golden.py → tests/golden/lora_tiny.txt,
 * which rebuilds the same weights, quantization, adapter init and batch in numpy/torch): the loss
 * before each of 10 steps and after the last.
 *
 * Tolerance 2e-5 absolute, as test_golden: PyTorch's float32 and float64 runs agree to ~7e-7;
 * what remains is float32 summation order amplified by 10 Adam steps. The q8_0 and f32 bases'
 * losses differ by up to 1.7e-3, so a base read in the wrong type fails.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/tiny_model.h"
#include "tern/tern.h"
#include "train/rng.h"
#include "train/train.h"

#ifndef TERN_SOURCE_DIR
#define TERN_SOURCE_DIR "."
#endif

enum { STEPS = 10, B = 2, T = 8 };

/* The golden losses of one base type ("f32", "q8_0"), float32 column. */
static void read_golden(const char *base, double want[STEPS + 1]) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/lora_tiny.txt", TERN_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int n = 0;
    char line[512], ty[16];
    while (fgets(line, sizeof line, f)) {
        int i;
        double a, b;
        if (line[0] == '#' || sscanf(line, "%15s %d %lf %lf", ty, &i, &a, &b) != 4 || strcmp(ty, base)) continue;
        assert_int_equal(i, n);
        want[n++] = a;
    }
    fclose(f);
    assert_int_equal(n, STEPS + 1);
}

static void golden(tn_dtype wt, const char *name) {
    double want[STEPS + 1];
    read_golden(name, want);
    tiny_cfg tc;
    tiny_cfg_default(&tc);
    tc.n_embd = 32, tc.n_layer = 2, tc.n_head = 4, tc.n_head_kv = 2, tc.n_ff = 64, tc.n_vocab = 270, tc.n_ctx = 16;
    tc.wtype = wt, tc.out_type = TN_F32, tc.seed = 5;
    char path[512];
    tiny_tmp_path(path, sizeof path, name);
    assert_int_equal(tiny_model_write(path, &tc), TERN_OK);
    tern_model_params mp;
    tern_model_params_init(&mp);
    mp.repack = false;
    tern_model *base;
    assert_int_equal(tern_model_load(path, &mp, &base), TERN_OK);
    tn_train_cfg cfg;
    assert_int_equal(tn_train_cfg_from(base, T, &cfg), TERN_OK);
    tn_lora_cfg lc = {.rank = 4, .alpha = 8.0f, .targets = 0, .seed = 3};
    tn_tmodel *m;
    assert_int_equal(tn_tmodel_create_lora(&cfg, base, &lc, 2, &m), TERN_OK);
    assert_int_equal(tn_tmodel_plan(m, B, T), TERN_OK);
    int32_t tok[B * T], tgt[B * T];
    uint64_t rng = 9;
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)tn_rng_below(&rng, 270);
        tgt[i] = (int32_t)tn_rng_below(&rng, 270);
    }
    /* weight decay 0.1 set: the adapters are not decayed (PyTorch's run has none) */
    tn_adamw o = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
    double worst = 0;
    for (int step = 0; step <= STEPS; step++) {
        double loss;
        assert_int_equal(tn_tmodel_forward(m, tok, tgt, &loss), TERN_OK);
        const double d = fabs(loss - want[step]);
        worst = fmax(worst, d);
        printf("%s step %2d  tern %.7f  torch %.7f  |d| %.1e\n", name, step, loss, want[step], d);
        assert_true(d < 2e-5);
        if (step == STEPS) break;
        tn_tmodel_zero_grad(m);
        tn_tmodel_backward(m);
        const double gn = tn_grad_norm(m);
        const float clip = gn > o.grad_clip ? (float)(o.grad_clip / (gn + 1e-6)) : 1.0f;
        tn_adamw_step(m, &o, tn_lr_at(step, 2, STEPS, o.lr, 0.1f), step + 1, clip);
    }
    printf("%s: worst |loss difference| vs PyTorch: %.2e\n", name, worst);
    tn_tmodel_free(m);
    tern_model_free(base);
    unlink(path);
}

static void test_golden_f32(void **st) {
    (void)st;
    golden(TN_F32, "f32");
}

static void test_golden_q8_0(void **st) {
    (void)st;
    golden(TN_Q8_0, "q8_0");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_golden_f32), cmocka_unit_test(test_golden_q8_0)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
