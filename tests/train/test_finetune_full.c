/*
 * test_finetune_full.c — full fine-tuning of a GGUF model (run.h: opts.full, `tern finetune
 * --full`) through tn_train_run on tiny random F16 llama / qwen3 bases (tests/common/tiny_model):
 *
 * - a few AdamW steps on plain text lower the training loss (every step's loss from the progress
 *   callback; the mean of the last 3 below the first);
 * - the written model equals the trainer's final weights, type-converted: the run's checkpoint
 *   (written at the last step from the in-memory f32 parameters; its hash equals the run's
 *   weights_hash) read back into a fresh model, and every tensor of the output compared by name:
 *   f16 matrices bit-equal to tn_fp32_to_fp16 of the f32 weights, f32 vectors bit-equal, and a
 *   q8_0 output within half a quantization step of each block (d = max|x| / 127; plus d's fp16
 *   rounding times |q| <= 127);
 * - the output loads (tern_model_load) with the base's family, shape and tokenizer and decodes;
 * - a Q4_0 base is refused with UNSUPPORTED naming the tensor and LoRA, nothing written.
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
#include "core/fp16.h"
#include "model/model.h"
#include "quant/quant.h"
#include "tern/tern.h"
#include "train/ckpt.h"
#include "train/run.h"

static double g_loss[64];
static int g_n;
static void on_progress(const tn_train_progress *p, void *user) {
    (void)user;
    if (g_n < 64) g_loss[g_n++] = p->loss;
}

static void write_text(const char *path) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 200; i++) {
        fprintf(f, "the cat %d sat on the mat %d. ", i % 5, i % 3);
        if (i % 10 == 9) fprintf(f, "\n\n");
    }
    fclose(f);
}

static const tn_gguf_tensor *out_tensor(const tern_model *out, const char *name) {
    const tn_gguf_tensor *t = tn_gguf_find_tensor(out->gguf, name);
    if (!t) printf("output lacks %s\n", name);
    assert_non_null(t);
    return t;
}

/* Fine-tunes base (arch, F16) fully with out_type; checks loss, weights and loading. */
static void full_run(const char *arch, tn_dtype out_type) {
    tiny_cfg tc;
    tiny_cfg_default(&tc);
    tc.arch = arch;
    tc.n_embd = 64, tc.n_layer = 2, tc.n_head = 4, tc.n_head_kv = 2, tc.n_ff = 96, tc.n_ctx = 32, tc.seed = 3;
    tc.wtype = TN_F16, tc.out_type = TN_F16;
    char base[512], out[512], text[512], dir[512], stem[64];
    snprintf(stem, sizeof stem, "ftfull_%s_%s_", arch, tn_dtype_name(out_type));
    tiny_tmp_path(base, sizeof base, strcat(strcpy((char[80]){0}, stem), "base"));
    tiny_tmp_path(out, sizeof out, strcat(strcpy((char[80]){0}, stem), "out"));
    tiny_tmp_path(text, sizeof text, strcat(strcpy((char[80]){0}, stem), "text"));
    tiny_tmp_path(dir, sizeof dir, strcat(strcpy((char[80]){0}, stem), "ckpt"));
    assert_int_equal(tiny_model_write(base, &tc), TERN_OK);
    write_text(text);
    const char *data[1] = {text};
    tn_train_opts o;
    tn_train_opts_default(&o);
    o.init = base, o.full = true, o.data = data, o.n_data = 1, o.out = out, o.out_type = out_type;
    o.cfg.n_ctx = 16, o.batch = 2, o.steps = 10, o.warmup = 0, o.opt.lr = 3e-3f, o.opt.weight_decay = 0.0f;
    o.ckpt_dir = dir, o.ckpt_every = 10, o.val_split = 0.0, o.n_threads = 2, o.progress = on_progress;
    g_n = 0;
    tern_status s = tn_train_run(&o);
    if (s) printf("%s\n", tern_last_error());
    assert_int_equal(s, TERN_OK);
    assert_int_equal(g_n, 10);
    const double last3 = (g_loss[7] + g_loss[8] + g_loss[9]) / 3.0;
    printf("%s -> %s: loss %.4f at step 1, %.4f mean of steps 8-10\n", arch, tn_dtype_name(out_type), g_loss[0], last3);
    assert_true(last3 < g_loss[0] - 0.1);

    /* the trainer's final weights: the checkpoint of the last step */
    tern_model_params mp;
    tern_model_params_init(&mp);
    mp.repack = false;
    tern_model *bm, *om;
    assert_int_equal(tern_model_load(base, &mp, &bm), TERN_OK);
    tn_train_cfg c;
    assert_int_equal(tn_train_cfg_from(bm, 16, &c), TERN_OK);
    tn_tmodel *m;
    assert_int_equal(tn_tmodel_create(&c, 1, &m), TERN_OK);
    tn_train_state st = {0};
    st.vocab_hash = (uint64_t)bm->hp.n_vocab; /* what a run without a vocabulary of its own records */
    bool found = false;
    s = tn_ckpt_load(m, &st, dir, &found);
    if (s) printf("%s\n", tern_last_error());
    assert_int_equal(s, TERN_OK);
    assert_true(found);
    assert_int_equal(st.step, 10);
    assert_true(tn_hash64(m->params, m->n_params * sizeof(float), 0) == o.weights_hash);

    assert_int_equal(tern_model_load(out, &mp, &om), TERN_OK);
    assert_string_equal(om->hp.family->name, arch);
    assert_int_equal(om->hp.n_vocab, bm->hp.n_vocab);
    assert_int_equal(om->gguf->n_tensors, m->n_tensors);
    int n_f16 = 0, n_f32 = 0, n_q8 = 0;
    double worst_q8 = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const tn_tparam *t = &m->t[i];
        const tn_gguf_tensor *g = out_tensor(om, t->name);
        const float *p = m->params + t->off;
        assert_int_equal(g->ne[0], t->ne[0]);
        if (t->n_dims == 1 || out_type == TN_F32) {
            assert_int_equal(g->type, TN_F32);
            assert_memory_equal(g->data, p, t->n * sizeof(float));
            n_f32++;
        } else if (out_type == TN_F16) {
            assert_int_equal(g->type, TN_F16);
            const tn_fp16 *h = (const tn_fp16 *)g->data;
            for (size_t j = 0; j < t->n; j++) assert_int_equal(h[j], tn_fp32_to_fp16(p[j]));
            n_f16++;
        } else {
            assert_int_equal(g->type, TN_Q8_0);
            float row[256];
            const size_t rb = tn_dtype_row_size(TN_Q8_0, t->ne[0]);
            for (int64_t r = 0; r < t->ne[1]; r++) {
                assert_true(tn_dequantize_row(TN_Q8_0, g->data + rb * (size_t)r, row, t->ne[0]));
                for (int64_t b = 0; b < t->ne[0]; b += 32) {
                    double amax = 0;
                    for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(p[r * t->ne[0] + b + j]));
                    for (int j = 0; j < 32; j++) {
                        const double e = fabs((double)row[b + j] - p[r * t->ne[0] + b + j]);
                        worst_q8 = fmax(worst_q8, amax > 0 ? e / (amax / 127.0) : 0);
                        /* half a step, plus the step's own fp16 rounding (2^-11 relative) times |q| <= 127 */
                        assert_true(e <= amax / 127.0 * (0.5 + 127.0 / 2048.0) + 1e-7);
                    }
                }
            }
            n_q8++;
        }
    }
    printf("output %s: %d f16, %d q8_0 (worst error %.3f of a step), %d f32 tensors equal the trainer's weights\n",
           tn_dtype_name(out_type), n_f16, n_q8, worst_q8, n_f32);
    /* it decodes */
    tern_model_free(om);
    tern_model *lm;
    tern_model_params_init(&mp);
    assert_int_equal(tern_model_load(out, &mp, &lm), TERN_OK);
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = 16;
    cp.n_threads = 1;
    tern_ctx *ctx;
    assert_int_equal(tern_ctx_create(lm, &cp, &ctx), TERN_OK);
    const tern_token toks[3] = {1, 300, 301};
    assert_int_equal(tern_decode(ctx, toks, 3), TERN_OK);
    const float *logits = tern_get_logits(ctx, 0);
    assert_non_null(logits);
    assert_true(isfinite(logits[0]));
    tern_ctx_free(ctx);
    tern_model_free(lm);

    tn_train_state_free(&st);
    tn_tmodel_free(m);
    tern_model_free(bm);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    unlink(base), unlink(out), unlink(text);
    char extra[600];
    snprintf(extra, sizeof extra, "%.*s.loss.csv", (int)(strlen(out) - 5), out);
    unlink(extra);
    snprintf(extra, sizeof extra, "%.*s.loss.svg", (int)(strlen(out) - 5), out);
    unlink(extra);
}

static void test_full_llama_f16(void **st) {
    (void)st;
    full_run("llama", TN_F16);
}

static void test_full_qwen3_q8_0(void **st) {
    (void)st;
    full_run("qwen3", TN_Q8_0);
}

static void test_full_f32(void **st) {
    (void)st;
    full_run("llama", TN_F32);
}

static void test_quantized_base_refused(void **st) {
    (void)st;
    tiny_cfg tc;
    tiny_cfg_default(&tc);
    tc.n_embd = 64, tc.n_layer = 1, tc.n_head = 4, tc.n_head_kv = 2, tc.n_ff = 96, tc.n_ctx = 32;
    tc.wtype = TN_Q4_0, tc.out_type = TN_Q4_0;
    char base[512], out[512], text[512];
    tiny_tmp_path(base, sizeof base, "ftfull_q4");
    tiny_tmp_path(out, sizeof out, "ftfull_q4out");
    tiny_tmp_path(text, sizeof text, "ftfull_q4text");
    assert_int_equal(tiny_model_write(base, &tc), TERN_OK);
    write_text(text);
    const char *data[1] = {text};
    tn_train_opts o;
    tn_train_opts_default(&o);
    o.init = base, o.full = true, o.data = data, o.n_data = 1, o.out = out, o.cfg.n_ctx = 16, o.batch = 2, o.steps = 2;
    assert_int_equal(tn_train_run(&o), TERN_ERR_UNSUPPORTED);
    printf("refused: %s\n", tern_last_error());
    assert_non_null(strstr(tern_last_error(), "q4_0"));
    assert_non_null(strstr(tern_last_error(), "LoRA"));
    assert_int_equal(access(out, F_OK), -1);
    unlink(base), unlink(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_llama_f16),
        cmocka_unit_test(test_full_qwen3_q8_0),
        cmocka_unit_test(test_full_f32),
        cmocka_unit_test(test_quantized_base_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
