/*
 * test_lora.c — LoRA over a quantized base (QLoRA): the trainer's forward and gradients against an
 * independent double-precision reference, training lowering the loss, the adapter file.
 *
 * The base is a tiny random llama/qwen3 GGUF with Q8_0 or Q4_0 matrices (tests/common/tiny_model).
 * The reference (ref_train.h) runs on a full f32 training model holding the base's dequantized
 * weights, with scale * (B A)[o][i] added in double to every adapted matrix element, where
 * scale = alpha / rank is computed here from the test's own alpha and rank. So it checks the
 * frozen tiled forward/backward (x W^T, dY W a tile of rows at a time), the adapter's forward and
 * the gradients of A and B by central differences. The LoRA model is run with tile_rows 3
 * (ragged tiles) and 2 threads; three targets are masked (-1), as a chat's prompt tokens.
 * Tolerances as test_grad.c: |analytic - numeric| <= 2e-3 * max(|numeric|, 1e-2) + 2e-5.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/tiny_model.h"
#include "ref_train.h"
#include "tern/tern.h"
#include "train/rng.h"
#include "train/train.h"

typedef struct lora_ref {
    const tn_tmodel *lm; /* the LoRA model whose A, B are read (with an optional override) */
    double scale;
    bool use_over;
    size_t over_i;
    double over_v;
} lora_ref;

static double lm_p(const lora_ref *u, size_t i) { return u->use_over && i == u->over_i ? u->over_v : (double)u->lm->params[i]; }

/* scale * sum_r B[o][r] A[r][i] for element j = o*k + i of the full model's tensor t. */
static double lora_extra(const ref_ctx *r, int t, size_t j) {
    const lora_ref *u = r->user;
    const tn_tmodel *lm = u->lm;
    if (r->m->t[t].n_dims != 2) return 0.0;
    const tn_tparam *w = &lm->t[t];
    if (!w->lora) return 0.0;
    const tn_tparam *ta = &lm->t[w->lora], *tb = &lm->t[w->lora + 1];
    const int64_t k = w->ne[0], R = ta->ne[1], o = (int64_t)j / k, i = (int64_t)j % k;
    double s = 0.0;
    for (int64_t q = 0; q < R; q++) s += lm_p(u, tb->off + (size_t)(o * R + q)) * lm_p(u, ta->off + (size_t)(q * k + i));
    return u->scale * s;
}

typedef struct setup {
    char path[512];
    tern_model *base;
    tn_train_cfg cfg;
    tn_tmodel *lm, *fm; /* LoRA model, full f32 model of the dequantized base (reference) */
} setup;

static bool g_base_int8; /* make(): tn_lora_cfg.base_int8 */

static void make(setup *S, const char *arch, tn_dtype wt, int rank, float alpha, uint32_t targets, int B, int T, int nth) {
    tiny_cfg tc;
    tiny_cfg_default(&tc);
    tc.arch = arch;
    tc.n_embd = 32, tc.n_layer = 2, tc.n_head = 4, tc.n_head_kv = 2, tc.n_ff = 64, tc.n_vocab = 270, tc.n_ctx = 16;
    tc.wtype = wt, tc.out_type = TN_Q8_0, tc.seed = 5;
    char stem[64];
    snprintf(stem, sizeof stem, "lora_%s_%d", arch, (int)wt);
    tiny_tmp_path(S->path, sizeof S->path, stem);
    assert_int_equal(tiny_model_write(S->path, &tc), TERN_OK);
    tern_model_params mp;
    tern_model_params_init(&mp);
    mp.repack = false;
    assert_int_equal(tern_model_load(S->path, &mp, &S->base), TERN_OK);
    assert_int_equal(tn_train_cfg_from(S->base, T, &S->cfg), TERN_OK);
    tn_lora_cfg lc = {.rank = rank, .alpha = alpha, .targets = targets, .seed = 3, .base_int8 = g_base_int8};
    assert_int_equal(tn_tmodel_create_lora(&S->cfg, S->base, &lc, nth, &S->lm), TERN_OK);
    S->lm->tile_rows = 3;
    assert_int_equal(tn_tmodel_plan(S->lm, B, T), TERN_OK);
    assert_int_equal(tn_tmodel_create(&S->cfg, 1, &S->fm), TERN_OK);
    assert_int_equal(tn_tmodel_init_from(S->fm, S->base), TERN_OK);
    assert_int_equal(tn_tmodel_plan(S->fm, B, T), TERN_OK);
}

static void unmake(setup *S) {
    tn_tmodel_free(S->lm);
    tn_tmodel_free(S->fm);
    tern_model_free(S->base);
    unlink(S->path);
}

static void random_batch(int n, int V, uint64_t seed, int32_t *tok, int32_t *tgt) {
    uint64_t rng = seed;
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)tn_rng_below(&rng, (uint64_t)V);
        tgt[i] = (int32_t)tn_rng_below(&rng, (uint64_t)V);
    }
}

/* Forward loss and the gradients of every lora_a / lora_b (up to 12 entries each). */
static void check_grads(const char *arch, tn_dtype wt, uint32_t targets) {
    const int B = 2, T = 5, rank = 4;
    const float alpha = 6.0f;
    setup S;
    make(&S, arch, wt, rank, alpha, targets, B, T, 2);
    tn_tmodel *lm = S.lm;
    printf("%s %s: %d adapted matrices, %d tensors, %zu floats\n", arch, tn_dtype_name(wt), lm->n_lora, lm->n_tensors,
           lm->n_params);
    /* B != 0 so the adapter takes part in the forward and A's gradient is not zero */
    uint64_t rng = 11;
    for (int i = 0; i < lm->n_tensors; i++)
        if (!lm->t[i].frozen && strstr(lm->t[i].name, ".lora_b"))
            for (size_t j = 0; j < lm->t[i].n; j++) lm->params[lm->t[i].off + j] = (float)(0.2 * tn_rng_normal(&rng));
    int32_t tok[64], tgt[64];
    random_batch(B * T, S.cfg.n_vocab, 21, tok, tgt);
    tgt[0] = tgt[3] = tgt[T + 1] = -1; /* masked targets (a chat's prompt): no loss, no gradient */
    double loss;
    assert_int_equal(tn_tmodel_forward(lm, tok, tgt, &loss), TERN_OK);
    lora_ref u = {.lm = lm, .scale = (double)alpha / rank};
    ref_ctx r = {.m = S.fm, .P = S.fm->params, .extra = lora_extra, .user = &u};
    for (int i = 0; i < tn_tp_head(S.fm) + 2; i++) assert_string_equal(S.fm->t[i].name, lm->t[i].name);
    const double rl = ref_loss(&r, tok, tgt, B, T);
    printf("loss float %.9f  double ref %.9f\n", loss, rl);
    assert_true(fabs(loss - rl) < 1e-5 * fabs(rl) + 1e-6);
    tn_tmodel_zero_grad(lm);
    tn_tmodel_backward(lm);
    int n_checked = 0, n_bad = 0, n_tensors = 0;
    double worst = 0;
    for (int ti = 0; ti < lm->n_tensors; ti++) {
        const tn_tparam *t = &lm->t[ti];
        if (t->frozen) continue;
        n_tensors++;
        size_t step = t->n > 12 ? t->n / 12 : 1;
        for (size_t j = (size_t)ti % step; j < t->n; j += step) {
            const double h = 1e-4, p0 = lm->params[t->off + j];
            u.use_over = true;
            u.over_i = t->off + j;
            u.over_v = p0 + h;
            const double lp = ref_loss(&r, tok, tgt, B, T);
            u.over_v = p0 - h;
            const double lmn = ref_loss(&r, tok, tgt, B, T);
            u.use_over = false;
            const double num = (lp - lmn) / (2 * h), ana = lm->grads[t->off + j];
            const double err = fabs(ana - num), tol = 2e-3 * fmax(fabs(num), 1e-2) + 2e-5;
            if (err / (fabs(num) + 1e-2) > worst) worst = err / (fabs(num) + 1e-2);
            if (err > tol) {
                n_bad++;
                printf("MISMATCH %s[%zu]: analytic %.8g numeric %.8g\n", t->name, j, ana, num);
            }
            n_checked++;
        }
    }
    printf("checked %d gradients (%d adapter tensors), worst relative error %.3g, %d mismatches\n", n_checked, n_tensors,
           worst, n_bad);
    assert_int_equal(n_tensors, 2 * lm->n_lora);
    assert_int_equal(n_bad, 0);
    unmake(&S);
}

static void test_grad_llama_q8_0(void **st) {
    (void)st;
    check_grads("llama", TN_Q8_0, 0);
}

static void test_grad_llama_q4_0_some_targets(void **st) {
    (void)st;
    uint32_t bits;
    char bad[64];
    assert_true(tn_lora_parse_targets("q,v,down", &bits, bad, sizeof bad));
    assert_int_equal(bits, (1u << TN_ROLE_ATTN_Q) | (1u << TN_ROLE_ATTN_V) | (1u << TN_ROLE_FFN_DOWN));
    assert_false(tn_lora_parse_targets("q,kv", &bits, bad, sizeof bad));
    assert_string_equal(bad, "kv");
    assert_true(tn_lora_parse_targets("q,v,down", &bits, bad, sizeof bad));
    check_grads("llama", TN_Q4_0, bits);
}

static void test_grad_qwen3_q8_0(void **st) {
    (void)st;
    check_grads("qwen3", TN_Q8_0, 0);
}

/* With B = 0 (the initial adapter) the LoRA model's logits are the dequantized base's (the full
 * f32 model's, computed without tiles); AdamW steps on one batch lower the loss and leave every
 * frozen tensor untouched. */
static void test_train_lowers_loss(void **st) {
    (void)st;
    const int B = 2, T = 8;
    setup S;
    make(&S, "llama", TN_Q4_0, 8, 16.0f, 0, B, T, 2);
    int32_t tok[64], tgt[64];
    random_batch(B * T, S.cfg.n_vocab, 9, tok, tgt);
    double l0 = 0, lf;
    assert_int_equal(tn_tmodel_forward(S.fm, tok, NULL, NULL), TERN_OK);
    assert_int_equal(tn_tmodel_forward(S.lm, tok, NULL, NULL), TERN_OK);
    double max_d = 0;
    for (int i = 0; i < B * T; i++)
        for (int j = 0; j < S.cfg.n_vocab; j++)
            max_d = fmax(max_d, fabs((double)tn_tmodel_logits(S.lm, i)[j] - tn_tmodel_logits(S.fm, i)[j]));
    printf("B = 0: max |logit LoRA - logit base| = %.3g\n", max_d);
    assert_true(max_d < 1e-4);
    assert_int_equal(tn_tmodel_forward(S.fm, tok, tgt, &lf), TERN_OK);
    float *frozen0 = malloc(S.lm->n_params * sizeof(float));
    memcpy(frozen0, S.lm->params, S.lm->n_params * sizeof(float));
    tn_adamw o;
    tn_adamw_default(&o);
    o.weight_decay = 0.0f;
    double loss = 0;
    for (int step = 0; step < 30; step++) {
        assert_int_equal(tn_tmodel_forward(S.lm, tok, tgt, &loss), TERN_OK);
        if (step == 0) {
            l0 = loss;
            assert_true(fabs(l0 - lf) < 1e-4); /* B = 0: the base's loss */
        }
        tn_tmodel_zero_grad(S.lm);
        tn_tmodel_backward(S.lm);
        const double gn = tn_grad_norm(S.lm);
        tn_adamw_step(S.lm, &o, 1e-2f, step + 1, gn > 1.0 ? (float)(1.0 / gn) : 1.0f);
    }
    printf("loss %.4f -> %.4f after 30 steps\n", l0, loss);
    assert_true(loss < 0.7 * l0);
    for (int i = 0; i < S.lm->n_tensors; i++) {
        const tn_tparam *t = &S.lm->t[i];
        if (t->frozen) assert_memory_equal(S.lm->params + t->off, frozen0 + t->off, t->n * sizeof(float));
    }
    free(frozen0);
    unmake(&S);
}

/* base_int8: the forward products of the frozen q4_0 / q8_0 matrices with int8 activations. With
 * B = 0 the logits are the dequantized base's (the full f32 model's) up to the activations' q8
 * rounding: not equal (the int8 path ran), within 5% of the largest logit (measured 1.9-2.7%),
 * and nearer inference's (tern_decode) than the f32 forward's; the loss within 1%; the adapter's
 * gradients (the backward is f32 either way) point the same way as the f32
 * forward's (cosine > 0.999); and 30 AdamW steps lower the loss as much. */
static void test_base_int8(void **st) {
    (void)st;
    const int B = 2, T = 8;
    for (int wi = 0; wi < 2; wi++) {
        const tn_dtype wt = wi ? TN_Q8_0 : TN_Q4_0;
        setup S, F;
        g_base_int8 = true;
        make(&S, "llama", wt, 8, 16.0f, 0, B, T, 2);
        g_base_int8 = false;
        make(&F, "llama", wt, 8, 16.0f, 0, B, T, 2);
        assert_true(S.lm->base_int8 && !F.lm->base_int8);
        int32_t tok[64], tgt[64];
        random_batch(B * T, S.cfg.n_vocab, 9, tok, tgt);
        double ls, lf, lb;
        assert_int_equal(tn_tmodel_forward(S.fm, tok, NULL, NULL), TERN_OK);
        assert_int_equal(tn_tmodel_forward(S.lm, tok, NULL, NULL), TERN_OK);
        double max_d = 0, max_l = 0;
        for (int i = 0; i < B * T; i++)
            for (int j = 0; j < S.cfg.n_vocab; j++) {
                max_d = fmax(max_d, fabs((double)tn_tmodel_logits(S.lm, i)[j] - tn_tmodel_logits(S.fm, i)[j]));
                max_l = fmax(max_l, fabs((double)tn_tmodel_logits(S.fm, i)[j]));
            }
        assert_true(max_d > 0.0 && max_d < 0.05 * max_l);
        /* the same products as inference: tern_decode of the first sequence (its activations
         * quantized the same way, its attention and norms computed independently of the
         * trainer's, its K/V kept in f16) is nearer the int8 forward's logits than the f32
         * forward's (measured 0.047 vs 0.115 for q4_0, 0.052 vs 0.073 for q8_0) */
        tern_ctx_params cp;
        tern_ctx_params_init(&cp);
        cp.n_threads = 2, cp.logits_all = true, cp.n_ctx = T;
        tern_ctx *ctx;
        assert_int_equal(tern_ctx_create(S.base, &cp, &ctx), TERN_OK);
        assert_int_equal(tern_decode(ctx, tok, T), TERN_OK);
        double d_i8 = 0, d_f32 = 0;
        for (int i = 0; i < T; i++)
            for (int j = 0; j < S.cfg.n_vocab; j++) {
                const double r = tern_get_logits(ctx, i)[j];
                d_i8 = fmax(d_i8, fabs(tn_tmodel_logits(S.lm, i)[j] - r));
                d_f32 = fmax(d_f32, fabs(tn_tmodel_logits(S.fm, i)[j] - r));
            }
        tern_ctx_free(ctx);
        printf("  vs tern_decode's logits: int8 forward %.3g, f32 forward %.3g\n", d_i8, d_f32);
        assert_true(d_i8 < d_f32 && d_i8 < 0.05 * max_l);
        assert_int_equal(tn_tmodel_forward(S.fm, tok, tgt, &lb), TERN_OK);
        assert_int_equal(tn_tmodel_forward(S.lm, tok, tgt, &ls), TERN_OK);
        assert_int_equal(tn_tmodel_forward(F.lm, tok, tgt, &lf), TERN_OK);
        printf("%s base, int8 forward: max |logit - f32 base logit| = %.3g (max |logit| %.3g); loss %.5f vs %.5f\n",
               tn_dtype_name(wt), max_d, max_l, ls, lb);
        assert_true(fabs(ls - lb) < 0.01 * fabs(lb));
        assert_true(fabs(lf - lb) < 1e-4);
        /* one step on both so that B != 0, then compare the adapters' gradients */
        tn_adamw o;
        tn_adamw_default(&o);
        o.weight_decay = 0.0f;
        tn_tmodel *ms[2] = {S.lm, F.lm};
        for (int k = 0; k < 2; k++) {
            double l;
            assert_int_equal(tn_tmodel_forward(ms[k], tok, tgt, &l), TERN_OK);
            tn_tmodel_zero_grad(ms[k]);
            tn_tmodel_backward(ms[k]);
        }
        double dot = 0, na = 0, nb = 0;
        for (size_t i = 0; i < S.lm->n_params; i++) {
            dot += (double)S.lm->grads[i] * F.lm->grads[i];
            na += (double)S.lm->grads[i] * S.lm->grads[i];
            nb += (double)F.lm->grads[i] * F.lm->grads[i];
        }
        const double cosv = dot / sqrt(na * nb);
        printf("  adapter gradients: cosine(int8 forward, f32 forward) = %.6f\n", cosv);
        assert_true(na > 0 && cosv > 0.999);
        double l0[2] = {0, 0}, l1[2] = {0, 0};
        for (int k = 0; k < 2; k++)
            for (int step = 0; step < 30; step++) {
                double l;
                assert_int_equal(tn_tmodel_forward(ms[k], tok, tgt, &l), TERN_OK);
                if (step == 0) l0[k] = l;
                l1[k] = l;
                tn_tmodel_zero_grad(ms[k]);
                tn_tmodel_backward(ms[k]);
                const double gn = tn_grad_norm(ms[k]);
                tn_adamw_step(ms[k], &o, 1e-2f, step + 1, gn > 1.0 ? (float)(1.0 / gn) : 1.0f);
            }
        printf("  30 steps: int8 forward %.4f -> %.4f, f32 forward %.4f -> %.4f\n", l0[0], l1[0], l0[1], l1[1]);
        assert_true(l1[0] < 0.7 * l0[0] && l1[0] < 1.1 * l1[1]);
        unmake(&S);
        unmake(&F);
    }
}

/* The adapter file, read back with tern's GGUF reader: llama.cpp's keys and tensor names/shapes. */
static void test_adapter_file(void **st) {
    (void)st;
    setup S;
    make(&S, "qwen3", TN_Q8_0, 4, 8.0f, 0, 1, 4, 1);
    char out[600];
    snprintf(out, sizeof out, "%s.adapter.gguf", S.path);
    assert_int_equal(tn_lora_export(S.lm, "test", out), TERN_OK);
    tn_gguf *g;
    assert_int_equal(tn_gguf_open(out, true, &g), TERN_OK);
    tn_gguf_str str;
    assert_int_equal(tn_gguf_get_str(g, "general.type", true, &str), TERN_OK);
    assert_true(str.len == 7 && !memcmp(str.data, "adapter", 7));
    assert_int_equal(tn_gguf_get_str(g, "adapter.type", true, &str), TERN_OK);
    assert_true(str.len == 4 && !memcmp(str.data, "lora", 4));
    assert_int_equal(tn_gguf_get_str(g, "general.architecture", true, &str), TERN_OK);
    assert_true(str.len == 5 && !memcmp(str.data, "qwen3", 5));
    float alpha;
    assert_int_equal(tn_gguf_get_f32(g, "adapter.lora.alpha", true, &alpha), TERN_OK);
    assert_true(alpha == 8.0f);
    /* 2 layers x 7 targets x (a, b) */
    assert_int_equal((int)g->n_tensors, 2 * 7 * 2);
    static const char *const mats[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    for (int l = 0; l < 2; l++)
        for (int j = 0; j < 7; j++) {
            char bn[96], an[112], bbn[112];
            snprintf(bn, sizeof bn, "blk.%d.%s.weight", l, mats[j]);
            snprintf(an, sizeof an, "%s.lora_a", bn);
            snprintf(bbn, sizeof bbn, "%s.lora_b", bn);
            const tn_gguf_tensor *base = tn_gguf_find_tensor(S.base->gguf, bn), *ta = tn_gguf_find_tensor(g, an),
                                 *tb = tn_gguf_find_tensor(g, bbn);
            assert_non_null(base);
            assert_non_null(ta);
            assert_non_null(tb);
            /* llama.cpp: a ne = [n_in, r], b ne = [r, n_out], the base ne = [n_in, n_out] */
            assert_int_equal(ta->type, TN_F32);
            assert_int_equal(tb->type, TN_F32);
            assert_true(ta->ne[0] == base->ne[0] && ta->ne[1] == 4 && tb->ne[0] == 4 && tb->ne[1] == base->ne[1]);
            /* contents: lora_a as trained (random init), lora_b zero */
            int ia = -1;
            for (int i = 0; i < S.lm->n_tensors; i++)
                if (!strcmp(S.lm->t[i].name, an)) ia = i;
            assert_true(ia > 0);
            assert_memory_equal(ta->data, S.lm->params + S.lm->t[ia].off, ta->nbytes);
            for (size_t e = 0; e < tb->nbytes / 4; e++) assert_true(((const float *)tb->data)[e] == 0.0f);
        }
    tn_gguf_free(g);
    unlink(out);
    unmake(&S);
}

/* Bad configs: one clear error each. */
static void test_bad_config(void **st) {
    (void)st;
    setup S;
    make(&S, "llama", TN_Q8_0, 4, 0.0f, 0, 1, 4, 1);
    tn_tmodel *m = NULL;
    tn_lora_cfg lc = {.rank = 33, .alpha = 1.0f};
    assert_int_equal(tn_tmodel_create_lora(&S.cfg, S.base, &lc, 1, &m), TERN_ERR_INVALID_ARG);
    printf("rank 33: %s\n", tern_last_error());
    assert_non_null(strstr(tern_last_error(), "rank 33"));
    assert_null(m);
    tn_train_cfg c2 = S.cfg;
    c2.n_ff = 48;
    lc.rank = 4;
    assert_int_equal(tn_tmodel_create_lora(&c2, S.base, &lc, 1, &m), TERN_ERR_UNSUPPORTED);
    printf("shape: %s\n", tern_last_error());
    assert_null(m);
    assert_true(S.lm->lora_scale == 1.0f); /* alpha 0: alpha = rank */
    unmake(&S);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_llama_q8_0),
        cmocka_unit_test(test_grad_llama_q4_0_some_targets),
        cmocka_unit_test(test_grad_qwen3_q8_0),
        cmocka_unit_test(test_train_lowers_loss),
        cmocka_unit_test(test_base_int8),
        cmocka_unit_test(test_adapter_file),
        cmocka_unit_test(test_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
