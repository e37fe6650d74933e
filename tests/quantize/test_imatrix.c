/*
 * test_imatrix.c — importance matrices: the accumulator and llama.cpp's GGUF imatrix layout, and
 * `tern imatrix` end to end against an independent computation.
 *   - acc_save_load: sums of squares and row counts of weights sharing an input; the file has
 *     llama-imatrix's keys (general.type, imatrix.datasets/chunk_count/chunk_size), 1-D f32
 *     "<W>.in_sum2"/"<W>.counts" tensors in name order; loading gives sum / count; non-finite
 *     activations and a column-count mismatch are refused;
 *   - cli_vs_reference: `tern imatrix` on a tiny random f32 model: the entries of layer 0's and
 *     layer 1's attention weights equal the mean squared inputs computed with the plain double
 *     reference forward (tests/model/ref_forward.c: rmsnorm of the embedding, and of the residual
 *     stream after layer 0), wq = wk = wv and w_gate = w_up, ffn_down has n_ff columns, counts are
 *     chunks x ctx; tern quantize --imatrix accepts the file; a model file as --imatrix, a
 *     too-short text and missing flags are clear errors.
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
#include "model/model.h"
#include "quant/imatrix.h"
#include "ref_forward.h"

static int run(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_acc_save_load(void **st) {
    (void)st;
    tn_imatrix_acc *a;
    assert_int_equal(tn_imatrix_acc_create(&a), TERN_OK);
    size_t idx[3];
    assert_int_equal(tn_imatrix_acc_entry(a, "blk.0.attn_q.weight", 4, &idx[0]), TERN_OK);
    assert_int_equal(tn_imatrix_acc_entry(a, "blk.0.attn_k.weight", 4, &idx[1]), TERN_OK);
    assert_int_equal(tn_imatrix_acc_entry(a, "blk.0.ffn_down.weight", 2, &idx[2]), TERN_OK);
    size_t again;
    assert_int_equal(tn_imatrix_acc_entry(a, "blk.0.attn_q.weight", 4, &again), TERN_OK);
    assert_int_equal(again, idx[0]);
    assert_int_equal(tn_imatrix_acc_entry(a, "blk.0.attn_q.weight", 5, &again), TERN_ERR_INVALID_ARG);
    const float x[3][4] = {{1, 2, 3, 4}, {-1, 0, 0.5f, 2}, {0, 0, 0, 1}};
    assert_int_equal(tn_imatrix_acc_add(a, idx, 2, &x[0][0], 3, 4), TERN_OK);
    const float y[2] = {3, -4};
    assert_int_equal(tn_imatrix_acc_add(a, &idx[2], 1, y, 1, 2), TERN_OK);
    assert_int_equal(tn_imatrix_acc_add(a, &idx[2], 1, y, 1, 2), TERN_OK);
    const float bad[2] = {INFINITY, 1};
    assert_int_equal(tn_imatrix_acc_add(a, &idx[2], 1, bad, 1, 2), TERN_ERR_FORMAT);
    assert_int_equal(tn_imatrix_acc_add(a, &idx[2], 1, y, 1, 4), TERN_ERR_INVALID_ARG);
    int64_t ne0, cnt;
    const double *s = tn_imatrix_acc_get(a, idx[1], &ne0, &cnt);
    assert_int_equal(ne0, 4);
    assert_int_equal(cnt, 3);
    assert_true(s[0] == 2 && s[1] == 4 && s[2] == 9.25 && s[3] == 21);

    char path[512];
    tiny_tmp_path(path, sizeof path, "imatrix-acc");
    assert_int_equal(tn_imatrix_acc_save(a, path, "calib.txt", 7, 512), TERN_OK);
    tn_imatrix_acc_free(a);

    /* the file as llama-imatrix writes it */
    tn_gguf *g;
    assert_int_equal(tn_gguf_open(path, false, &g), TERN_OK);
    tn_gguf_str str;
    assert_int_equal(tn_gguf_get_str(g, "general.type", true, &str), TERN_OK);
    assert_true(tn_gguf_str_eq(str, "imatrix"));
    uint32_t v;
    assert_int_equal(tn_gguf_get_u32(g, "imatrix.chunk_count", true, &v), TERN_OK);
    assert_int_equal(v, 7);
    assert_int_equal(tn_gguf_get_u32(g, "imatrix.chunk_size", true, &v), TERN_OK);
    assert_int_equal(v, 512);
    const tn_gguf_kv *ds;
    assert_int_equal(tn_gguf_get_arr(g, "imatrix.datasets", true, TN_GGUF_STRING, &ds), TERN_OK);
    assert_int_equal(ds->arr_n, 1);
    assert_true(tn_gguf_str_eq(ds->arr_strs[0], "calib.txt"));
    assert_int_equal(g->n_tensors, 6);
    static const char *const order[] = {"blk.0.attn_k.weight.in_sum2", "blk.0.attn_k.weight.counts",
                                        "blk.0.attn_q.weight.in_sum2", "blk.0.attn_q.weight.counts",
                                        "blk.0.ffn_down.weight.in_sum2", "blk.0.ffn_down.weight.counts"};
    for (int i = 0; i < 6; i++) {
        assert_string_equal(g->tensors[i].name, order[i]);
        assert_int_equal(g->tensors[i].n_dims, 1);
        assert_int_equal(g->tensors[i].type, 0);
    }
    float c;
    memcpy(&c, g->tensors[5].data, 4);
    assert_true(c == 2.0f);
    tn_gguf_free(g);

    tn_imatrix *m;
    assert_int_equal(tn_imatrix_load(path, &m), TERN_OK);
    assert_int_equal(tn_imatrix_count(m), 3);
    const float *q = tn_imatrix_find(m, "blk.0.attn_q.weight", 4);
    assert_non_null(q);
    assert_true(fabsf(q[2] - 9.25f / 3) < 1e-6f);
    const float *d = tn_imatrix_find(m, "blk.0.ffn_down.weight", 2);
    assert_true(d[0] == 9 && d[1] == 16);
    assert_null(tn_imatrix_find(m, "blk.0.ffn_down.weight", 3));
    assert_null(tn_imatrix_find(m, "blk.9.ffn_down.weight", 2));
    uint32_t cc, cs;
    const char *dsn;
    tn_imatrix_meta(m, &cc, &cs, &dsn);
    assert_int_equal(cc, 7);
    assert_int_equal(cs, 512);
    assert_string_equal(dsn, "calib.txt");
    tn_imatrix_free(m);
    unlink(path);
}

/* y = x / rms(x) * w in double, as ref_forward does */
static void rmsnorm(const double *x, const float *w, double *y, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double r = 1.0 / sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

static double rel_l2(const double *ref, const float *got, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = got[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

/* Expert entries: per matrix sums over the rows routed to it (gathered by index), a count per
 * matrix, written as [ne0][n_mat] / [1][n_mat] and loaded back as sum / count per expert
 * (hand-computed values; an expert without rows gets importance 1). */
static void test_acc_experts(void **st) {
    (void)st;
    tn_imatrix_acc *a;
    assert_int_equal(tn_imatrix_acc_create(&a), TERN_OK);
    size_t idx;
    assert_int_equal(tn_imatrix_acc_entry_mat(a, "blk.0.ffn_up_exps.weight", 2, 3, &idx), TERN_OK);
    size_t again;
    assert_int_equal(tn_imatrix_acc_entry_mat(a, "blk.0.ffn_up_exps.weight", 2, 4, &again), TERN_ERR_INVALID_ARG);
    const float x[4][2] = {{1, 2}, {3, -1}, {0.5f, 0}, {-2, 2}};
    const int32_t rows0[2] = {0, 3}, rows2[1] = {1};
    assert_int_equal(tn_imatrix_acc_add_rows(a, &idx, 1, 0, &x[0][0], rows0, 2, 2), TERN_OK); /* 1+4, 4+4 */
    assert_int_equal(tn_imatrix_acc_add_rows(a, &idx, 1, 2, &x[0][0], rows2, 1, 2), TERN_OK); /* 9, 1 */
    assert_int_equal(tn_imatrix_acc_add_rows(a, &idx, 1, 2, &x[2][0], NULL, 1, 2), TERN_OK);  /* 0.25, 0 */
    assert_int_equal(tn_imatrix_acc_add_rows(a, &idx, 1, 3, &x[0][0], NULL, 1, 2), TERN_ERR_INVALID_ARG);
    int64_t ne0, cnt;
    const double *s = tn_imatrix_acc_get(a, idx, &ne0, &cnt);
    assert_int_equal(ne0, 2);
    assert_int_equal(cnt, 2);
    assert_true(s[0] == 5 && s[1] == 8 && s[2] == 0 && s[3] == 0 && s[4] == 9.25 && s[5] == 1);
    char path[512];
    tiny_tmp_path(path, sizeof path, "imatrix-exps");
    assert_int_equal(tn_imatrix_acc_save(a, path, "calib.txt", 1, 64), TERN_OK);
    tn_imatrix_acc_free(a);
    tn_gguf *g;
    assert_int_equal(tn_gguf_open(path, false, &g), TERN_OK);
    const tn_gguf_tensor *t = tn_gguf_find_tensor(g, "blk.0.ffn_up_exps.weight.in_sum2");
    const tn_gguf_tensor *c = tn_gguf_find_tensor(g, "blk.0.ffn_up_exps.weight.counts");
    assert_non_null(t);
    assert_non_null(c);
    assert_true(t->n_dims == 2 && t->ne[0] == 2 && t->ne[1] == 3);
    assert_true(c->n_dims == 2 && c->ne[0] == 1 && c->ne[1] == 3);
    float cv[3];
    memcpy(cv, c->data, sizeof cv);
    assert_true(cv[0] == 2 && cv[1] == 0 && cv[2] == 2);
    tn_gguf_free(g);
    tn_imatrix *m;
    assert_int_equal(tn_imatrix_load(path, &m), TERN_OK);
    assert_null(tn_imatrix_find(m, "blk.0.ffn_up_exps.weight", 2));
    const float *imp = tn_imatrix_find(m, "blk.0.ffn_up_exps.weight", 6);
    assert_non_null(imp);
    assert_true(imp[0] == 2.5f && imp[1] == 4 && imp[2] == 1 && imp[3] == 1 && imp[4] == 4.625f && imp[5] == 0.5f);
    tn_imatrix_free(m);
    remove(path);
}

static void test_cli_vs_reference(void **st) {
    (void)st;
    const char *tern = getenv("TERN_BIN");
    if (!tern || !*tern) skip();
    char model[512], text[512], out[512], q[512], cmd[4096];
    tiny_tmp_path(model, sizeof model, "imatrix-model");
    tiny_tmp_path(text, sizeof text, "imatrix-text");
    tiny_tmp_path(out, sizeof out, "imatrix-out");
    tiny_tmp_path(q, sizeof q, "imatrix-q");
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    assert_int_equal(tiny_model_write(model, &cfg), TERN_OK);
    static const char *words[] = {"the", "a", "and", "of", "to", "in", "it", "was", "he", "she", "once", "upon", "time", "xyz"};
    FILE *f = fopen(text, "w");
    assert_non_null(f);
    uint64_t r = 99;
    for (int i = 0; i < 400; i++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        fprintf(f, "%s%s", words[(r >> 33) % 14], i % 17 == 16 ? ".\n" : " ");
    }
    fclose(f);
    const int c = 32, chunks = 3;
    snprintf(cmd, sizeof cmd, "'%s' imatrix -m '%s' -f '%s' -c %d --chunks %d -t 2 -o '%s' 2>/dev/null", tern, model, text, c,
             chunks, out);
    assert_int_equal(run(cmd), 0);

    tern_model *m;
    tern_model_params mp;
    tern_model_params_init(&mp);
    assert_int_equal(tern_model_load(model, &mp, &m), TERN_OK);
    const tn_hparams *hp = &m->hp;
    const int64_t d = hp->n_embd;

    /* counts and the entries' shapes, straight from the file */
    tn_gguf *g;
    assert_int_equal(tn_gguf_open(out, false, &g), TERN_OK);
    assert_int_equal(g->n_tensors, 2 * 7 * hp->n_layer);
    const tn_gguf_tensor *cnt = tn_gguf_find_tensor(g, "blk.1.ffn_down.weight.counts");
    assert_non_null(cnt);
    float cv;
    memcpy(&cv, cnt->data, 4);
    assert_true(cv == (float)(c * chunks));
    const tn_gguf_tensor *dn = tn_gguf_find_tensor(g, "blk.1.ffn_down.weight.in_sum2");
    assert_non_null(dn);
    assert_int_equal(dn->ne[0], hp->n_ff);
    tn_gguf_free(g);

    /* independent: mean of squared attention inputs of layers 0 and 1 over the same chunks */
    int32_t n_tok = 0, cap = 4096;
    tern_token *toks = malloc(sizeof *toks * (size_t)cap);
    char *buf = malloc(1 << 16);
    f = fopen(text, "r");
    const size_t len = fread(buf, 1, 1 << 16, f);
    fclose(f);
    assert_int_equal(tern_tokenize(m, buf, len, true, false, toks, cap, &n_tok), TERN_OK);
    assert_true(n_tok >= c * chunks);
    double *sum0 = calloc((size_t)d, sizeof *sum0), *sum1 = calloc((size_t)d, sizeof *sum1);
    double *layers = malloc(sizeof *layers * (size_t)d * (size_t)(hp->n_layer + 1));
    double *logits = malloc(sizeof *logits * (size_t)hp->n_vocab), *xe = malloc(sizeof *xe * (size_t)d);
    double *y = malloc(sizeof *y * (size_t)d);
    float *e = malloc(sizeof *e * (size_t)d);
    for (int ci = 0; ci < chunks; ci++) {
        ref_model *rm = ref_create(m, c);
        for (int t = 0; t < c; t++) {
            const tern_token tok = t == 0 ? tern_token_bos(m) : toks[ci * c + t];
            tn_tensor_get_row(&m->tok_embd, tok, e);
            for (int64_t i = 0; i < d; i++) xe[i] = e[i];
            rmsnorm(xe, m->layers[0].w[TN_ROLE_ATTN_NORM].data, y, d, hp->rms_eps);
            for (int64_t i = 0; i < d; i++) sum0[i] += y[i] * y[i];
            ref_step(rm, tok, logits, layers);
            rmsnorm(layers, m->layers[1].w[TN_ROLE_ATTN_NORM].data, y, d, hp->rms_eps);
            for (int64_t i = 0; i < d; i++) sum1[i] += y[i] * y[i];
        }
        ref_free(rm);
    }
    for (int64_t i = 0; i < d; i++) sum0[i] /= c * chunks, sum1[i] /= c * chunks;

    tn_imatrix *im;
    assert_int_equal(tn_imatrix_load(out, &im), TERN_OK);
    const float *q0 = tn_imatrix_find(im, "blk.0.attn_q.weight", d), *k0 = tn_imatrix_find(im, "blk.0.attn_k.weight", d);
    const float *v0 = tn_imatrix_find(im, "blk.0.attn_v.weight", d), *q1 = tn_imatrix_find(im, "blk.1.attn_q.weight", d);
    const float *g1 = tn_imatrix_find(im, "blk.1.ffn_gate.weight", d), *u1 = tn_imatrix_find(im, "blk.1.ffn_up.weight", d);
    assert_true(q0 && k0 && v0 && q1 && g1 && u1);
    assert_non_null(tn_imatrix_find(im, "blk.1.attn_output.weight", d));
    assert_non_null(tn_imatrix_find(im, "blk.0.ffn_down.weight", hp->n_ff));
    assert_memory_equal(q0, k0, sizeof(float) * (size_t)d);
    assert_memory_equal(q0, v0, sizeof(float) * (size_t)d);
    assert_memory_equal(g1, u1, sizeof(float) * (size_t)d);
    const double e0 = rel_l2(sum0, q0, d), e1 = rel_l2(sum1, q1, d);
    print_message("imatrix vs reference: layer 0 rel L2 %.3g, layer 1 %.3g\n", e0, e1);
    assert_true(e0 < 1e-5);
    assert_true(e1 < 5e-3); /* tern's forward vs the double reference (test_forward's bound) */
    tn_imatrix_free(im);

    /* tern quantize takes it; a model file is not an importance matrix; bad inputs are clear */
    snprintf(cmd, sizeof cmd, "'%s' quantize --imatrix '%s' '%s' '%s' tq3 -t 1 2>/dev/null", tern, out, model, q);
    assert_int_equal(run(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' quantize --imatrix '%s' '%s' '%s' tq3 -t 1 2>/dev/null", tern, model, model, q);
    assert_int_equal(run(cmd), 65);
    snprintf(cmd, sizeof cmd, "'%s' imatrix -m '%s' -f '%s' -c 4096 -o '%s' 2>/dev/null", tern, model, text, q);
    assert_int_equal(run(cmd), 65);
    snprintf(cmd, sizeof cmd, "'%s' imatrix -m '%s' -o '%s' 2>/dev/null", tern, model, q);
    assert_int_equal(run(cmd), 64);
    snprintf(cmd, sizeof cmd, "'%s' imatrix -m '%s' -f /nonexistent/calib.txt -o '%s' 2>/dev/null", tern, model, q);
    assert_int_equal(run(cmd), 66);

    free(toks), free(buf), free(sum0), free(sum1), free(layers), free(logits), free(xe), free(y), free(e);
    tern_model_free(m);
    unlink(model), unlink(text), unlink(out), unlink(q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_acc_save_load),
        cmocka_unit_test(test_acc_experts),
        cmocka_unit_test(test_cli_vs_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
