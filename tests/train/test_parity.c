/*
 * test_parity.c — the training forward and the inference forward are the same model: the loss
 * the trainer computes on a batch equals the loss computed from the logits of the public
 * inference API (tern_model_load + tern_ctx with logits_all + tern_decode + tern_get_logits)
 * on the GGUF the trainer exported, for every family training runs: llama, qwen2 (q/k/v biases,
 * RoPE on halves) and qwen3 (per-head q/k RMSNorm, head_dim 32 over n_embd 64 / 4 heads, so query
 * rows are 128 wide; its descriptor's rms_eps 1e-6 and rope base 1e6). The exported file carries
 * the family's metadata: the inference loader validates every tensor against the registry.
 *
 * Tolerance: inference stores K and V in the KV cache as f16 (relative rounding 2^-11 ~ 4.9e-4
 * per element) and may use other summation orders in its f32 kernels; the attention output is a
 * convex combination of V rows, so it inherits ~5e-4 relative error, which reaches the logits
 * attenuated by the following projections. With weights ~N(0, 0.1) the logits have magnitude
 * ~1, so we allow |d logit| <= 5e-3 + 5e-3 * max|logit| and |d loss| <= 1e-3 (observed values
 * are printed; they are an order of magnitude below).
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
#include "train/bpe.h"
#include "train/rng.h"
#include "train/train.h"

static const char *TEXT = "In the beginning God created the heaven and the earth. And the earth was without form, "
                          "and void; and darkness was upon the face of the deep.\n";

static void run_parity(const char *arch, int32_t head_dim, tn_dtype out_type, double tol_loss) {
    const tn_arch_desc *ad = tn_arch_find(arch, strlen(arch));
    assert_non_null(ad);
    tn_vocab_data *v;
    const char *texts[1] = {TEXT};
    size_t lens[1] = {strlen(TEXT)};
    assert_int_equal(tn_bpe_train(texts, lens, 1, 300, &v), TERN_OK);
    tn_train_cfg cfg = {.n_vocab = v->n, .n_ctx = 64, .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
                        .n_ff = 128, .rms_eps = ad->rms_eps, .rope_base = ad->rope_base, .head_dim = head_dim, .arch = ad};
    tn_tmodel *m;
    assert_int_equal(tn_tmodel_create(&cfg, 2, &m), TERN_OK);
    uint64_t rng = 5;
    for (int i = 0; i < m->n_tensors; i++) {
        float *p = tn_tp(m, m->params, i);
        for (size_t j = 0; j < m->t[i].n; j++)
            p[j] = m->t[i].n_dims == 1 && !strstr(m->t[i].name, ".bias") ? (float)(1.0 + 0.2 * tn_rng_normal(&rng))
                                                                           : (float)(0.1 * tn_rng_normal(&rng));
    }
    const int T = 48;
    assert_int_equal(tn_tmodel_plan(m, 1, T), TERN_OK);
    int32_t tok[48], tgt[48];
    for (int i = 0; i < T; i++) {
        tok[i] = (int32_t)tn_rng_below(&rng, (uint64_t)v->n);
        tgt[i] = (int32_t)tn_rng_below(&rng, (uint64_t)v->n);
    }
    double loss;
    assert_int_equal(tn_tmodel_forward(m, tok, NULL, NULL), TERN_OK);
    float *logits = malloc(sizeof(float) * (size_t)T * (size_t)v->n);
    memcpy(logits, tn_tmodel_logits(m, 0), sizeof(float) * (size_t)T * (size_t)v->n);
    assert_int_equal(tn_tmodel_forward(m, tok, tgt, &loss), TERN_OK);
    char path[512];
    char stem[64];
    snprintf(stem, sizeof stem, "parity_%s_%s", arch, out_type == TN_F32 ? "f32" : "q8");
    tiny_tmp_path(path, sizeof path, stem);
    assert_int_equal(tn_tmodel_export(m, v, "parity", out_type, path), TERN_OK);

    tern_model *im;
    assert_int_equal(tern_model_load(path, NULL, &im), TERN_OK);
    const char *desc = tern_model_desc(im);
    printf("%s: loaded as %s\n", arch, desc);
    assert_true(!strncmp(desc, arch, strlen(arch)) && desc[strlen(arch)] == ' ');
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = 64;
    cp.logits_all = true;
    cp.n_threads = 2;
    tern_ctx *c;
    assert_int_equal(tern_ctx_create(im, &cp, &c), TERN_OK);
    assert_int_equal(tern_decode(c, tok, T), TERN_OK);
    double il = 0, max_d = 0, max_l = 0;
    for (int i = 0; i < T; i++) {
        const float *lg = tern_get_logits(c, i);
        assert_non_null(lg);
        double mx = -1e300, sum = 0;
        for (int j = 0; j < v->n; j++) {
            mx = fmax(mx, lg[j]);
            max_d = fmax(max_d, fabs((double)lg[j] - logits[(size_t)i * v->n + j]));
            max_l = fmax(max_l, fabs((double)logits[(size_t)i * v->n + j]));
        }
        for (int j = 0; j < v->n; j++) sum += exp(lg[j] - mx);
        il += log(sum) + mx - lg[tgt[i]];
    }
    il /= T;
    printf("%s %s: train loss %.7f  inference loss %.7f  |d loss| %.2e  max |d logit| %.2e (max |logit| %.2f)\n",
           arch, out_type == TN_F32 ? "f32" : "q8_0", loss, il, fabs(loss - il), max_d, max_l);
    assert_true(fabs(loss - il) <= tol_loss);
    if (out_type == TN_F32) assert_true(max_d <= 5e-3 + 5e-3 * max_l);
    tern_ctx_free(c);
    tern_model_free(im);
    unlink(path);
    free(logits);
    tn_tmodel_free(m);
    tn_vocab_data_free(v);
}

static void test_parity_f32(void **st) {
    (void)st;
    run_parity("llama", 0, TN_F32, 1e-3);
}

static void test_parity_qwen2_f32(void **st) {
    (void)st;
    run_parity("qwen2", 0, TN_F32, 1e-3);
}

static void test_parity_qwen3_f32(void **st) {
    (void)st;
    run_parity("qwen3", 32, TN_F32, 1e-3);
}

/* q8_0 export: weights are rounded to 8 bits (relative step 1/127 per block), so only a loose
 * check that the exported model is the same model. */
static void test_parity_q8_0(void **st) {
    (void)st;
    run_parity("llama", 0, TN_Q8_0, 5e-2);
    run_parity("qwen3", 32, TN_Q8_0, 5e-2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parity_f32),
        cmocka_unit_test(test_parity_qwen2_f32),
        cmocka_unit_test(test_parity_qwen3_f32),
        cmocka_unit_test(test_parity_q8_0),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
