/*
 * test_memplan.c — training that plans its own memory (train.h: tn_mem_plan, tn_mem_choose,
 * tn_tmodel_grads, m->recompute).
 *
 * - Gradient accumulation: a batch of B split into 2 and 4 micro-batches (tn_tmodel_grads) against
 *   the existing trainer run unsplit (tn_tmodel_forward + tn_tmodel_backward on the whole batch, as
 *   before this change). The split path reuses nothing of the unsplit one but those two calls (its
 *   own loop over micro-batches, the loss denominator of the whole batch, gradients added in
 *   backward), so agreement checks the accumulation; losses and weights after 3 AdamW steps agree
 *   within fp32 summation tolerance (the order of the gradient sums differs), with targets masked
 *   unevenly over the micro-batches.
 * - Recomputation: gradients (and the loss, and parameters after 2 AdamW steps) with --recompute
 *   attn and full are bit-identical to none (same ops in the same order) for llama, qwen2 and
 *   qwen3 and for LoRA over a Q4_0 base; test_grad checks recomputed gradients against central
 *   differences.
 * - Sizes: the plan's bytes equal sizes computed here from the shapes (written out below, not
 *   taken from tmodel.c), for every (micro-batch, recompute); the activation bytes fall by
 *   (n_layer - 1) layers of probabilities (attn) and of everything but the layer input (full).
 * - Chunked logits and cross-entropy: loss, gradients and params after 2 steps against one chunk
 *   within fp32 summation tolerance (llama, qwen2, qwen3, LoRA over Q4_0); the 15M-class config's
 *   activation bytes (computed here) fall >= 3x with full recomputation.
 * - Budget: for budgets at and 1 byte under every plan's peak, tn_mem_choose picks the first
 *   configuration in the documented order whose independently computed peak fits; below the
 *   smallest it refuses and names micro-batch 1 with full recomputation.
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
#include "tern/tern.h"
#include "train/rng.h"
#include "train/train.h"

static const tn_arch_desc *family(const char *name) {
    const tn_arch_desc *a = tn_arch_find(name, strlen(name));
    assert_non_null(a);
    return a;
}

static tn_train_cfg small_cfg(const char *fam) {
    const tn_arch_desc *a = family(fam);
    return (tn_train_cfg){.n_vocab = 19, .n_ctx = 8, .n_embd = 16, .n_layer = 3, .n_head = 4, .n_head_kv = 2, .n_ff = 24,
                          .rms_eps = a->rms_eps, .rope_base = 100.0f, .head_dim = !strcmp(fam, "qwen3") ? 6 : 0, .arch = a};
}

static void batch(int n, int V, uint64_t seed, int32_t *tok, int32_t *tgt) {
    uint64_t rng = seed;
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)tn_rng_below(&rng, (uint64_t)V);
        tgt[i] = (int32_t)tn_rng_below(&rng, (uint64_t)V);
    }
}

/* ---- gradient accumulation ------------------------------------------------------------------ */

/* 3 AdamW steps on batch (tok, tgt) of B sequences: n_micro == 0 the existing unsplit trainer
 * (forward, zero_grad, backward), else tn_tmodel_grads over n_micro micro-batches. */
static void accum_run(tn_train_cfg c, int B, int T, int n_micro, const int32_t *tok, const int32_t *tgt, double *losses,
                      float *params) {
    tn_tmodel *m;
    assert_int_equal(tn_tmodel_create(&c, 2, &m), TERN_OK);
    tn_tmodel_init_random(m, 5);
    assert_int_equal(tn_tmodel_plan(m, n_micro ? B / n_micro : B, T), TERN_OK);
    tn_adamw o;
    tn_adamw_default(&o);
    o.lr = 1e-2f;
    for (int step = 0; step < 3; step++) {
        if (!n_micro) {
            assert_int_equal(tn_tmodel_forward(m, tok, tgt, &losses[step]), TERN_OK);
            tn_tmodel_zero_grad(m);
            tn_tmodel_backward(m);
        } else {
            assert_int_equal(tn_tmodel_grads(m, tok, tgt, n_micro, &losses[step]), TERN_OK);
        }
        const double gn = tn_grad_norm(m);
        const float clip = gn > 1.0 ? (float)(1.0 / (gn + 1e-6)) : 1.0f;
        tn_adamw_step(m, &o, o.lr, step + 1, clip);
    }
    memcpy(params, m->params, m->n_params * sizeof(float));
    tn_tmodel_free(m);
}

static void test_grad_accum(void **st) {
    (void)st;
    const char *fams[2] = {"llama", "qwen3"};
    for (int f = 0; f < 2; f++) {
        tn_train_cfg c = small_cfg(fams[f]);
        const int B = 4, T = 8;
        int32_t tok[32], tgt[32];
        batch(B * T, c.n_vocab, 77 + f, tok, tgt);
        /* masked targets, unevenly: 6 in the first sequence, 1 in the third */
        for (int i = 1; i < 7; i++) tgt[i] = -1;
        tgt[2 * T + 3] = -1;
        size_t pb, ab;
        tn_tmodel_mem(&c, B, T, 2, &pb, &ab);
        const size_t np = pb / (4 * sizeof(float));
        float *p0 = malloc(np * sizeof(float)), *p1 = malloc(np * sizeof(float));
        double l0[3], l1[3];
        accum_run(c, B, T, 0, tok, tgt, l0, p0);
        for (int nm = 2; nm <= 4; nm += 2) {
            accum_run(c, B, T, nm, tok, tgt, l1, p1);
            double dl = 0, dp = 0, pmax = 0;
            for (int s = 0; s < 3; s++) dl = fmax(dl, fabs(l0[s] - l1[s]));
            for (size_t i = 0; i < np; i++) dp = fmax(dp, fabs((double)p0[i] - p1[i])), pmax = fmax(pmax, fabs(p0[i]));
            printf("%s: batch %d as %d micro-batches: losses %.7f %.7f %.7f (unsplit %.7f %.7f %.7f), max |d loss| %.2e, "
                   "max |d param| %.2e (params up to %.3f)\n", fams[f], B, nm, l1[0], l1[1], l1[2], l0[0], l0[1], l0[2], dl, dp, pmax);
            /* fp32: the gradient sums run in another order (~1e-7 relative each); 3 steps of lr 1e-2 */
            assert_true(dl < 1e-6 * fabs(l0[0]));
            assert_true(dp < 1e-5);
        }
        free(p0);
        free(p1);
    }
}

/* ---- recomputation -------------------------------------------------------------------------- */

/* Loss, gradients and the params after 2 AdamW steps of m (planned) on one batch. */
static void grads_of(tn_tmodel *m, const int32_t *tok, const int32_t *tgt, double *loss, float *grads, float *params) {
    assert_int_equal(tn_tmodel_forward(m, tok, tgt, loss), TERN_OK);
    tn_tmodel_zero_grad(m);
    tn_tmodel_backward(m);
    memcpy(grads, m->grads, m->n_params * sizeof(float));
    tn_adamw o;
    tn_adamw_default(&o);
    o.lr = 1e-2f;
    tn_adamw_step(m, &o, o.lr, 1, 1.0f);
    double l;
    assert_int_equal(tn_tmodel_grads(m, tok, tgt, 1, &l), TERN_OK);
    tn_adamw_step(m, &o, o.lr, 2, 1.0f);
    memcpy(params, m->params, m->n_params * sizeof(float));
}

/* Chunked logits (ce_rows < B*T) against one chunk: the rows' logits, losses and d xf come from
 * the same per-row ops, but output.weight's gradient is summed chunk by chunk (another order of
 * float sums), so gradients agree within fp32 summation tolerance, not bit for bit. */
static void ce_compare(const char *what, double l0, double l1, const float *g0, const float *g1, const float *p0,
                       const float *p1, size_t np) {
    double dg = 0, gmax = 0, dp = 0;
    for (size_t i = 0; i < np; i++) {
        dg = fmax(dg, fabs((double)g0[i] - g1[i])), gmax = fmax(gmax, fabs(g0[i]));
        dp = fmax(dp, fabs((double)p0[i] - p1[i]));
    }
    printf("%s: logits in chunks: loss %.9f (one chunk %.9f, %s), max |d grad| %.2e (grads up to %.3g; %s), max |d param| "
           "after 2 steps %.2e\n", what, l1, l0, l1 == l0 ? "bit-identical" : "differs", dg, gmax,
           memcmp(g0, g1, np * 4) ? "not bit-identical" : "bit-identical", dp);
    assert_true(fabs(l1 - l0) <= 1e-6 * fabs(l0));
    assert_true(dg <= 1e-5 * gmax);
    assert_true(dp < 1e-5);
}

static void test_recompute_bitwise(void **st) {
    (void)st;
    const char *fams[3] = {"llama", "qwen2", "qwen3"};
    for (int f = 0; f < 3; f++) {
        tn_train_cfg c = small_cfg(fams[f]);
        const int B = 3, T = 7;
        int32_t tok[21], tgt[21];
        batch(B * T, c.n_vocab, 5 + f, tok, tgt);
        double loss[4];
        float *g[4], *p[4];
        size_t np = 0;
        for (int rc = 0; rc < 4; rc++) { /* none, attn, full; then none with logits 4 rows at a time */
            tn_tmodel *m;
            assert_int_equal(tn_tmodel_create(&c, 2, &m), TERN_OK);
            tn_tmodel_init_random(m, 9);
            m->recompute = rc % 3;
            m->ce_rows = rc == 3 ? 4 : 0;
            assert_int_equal(tn_tmodel_plan(m, B, T), TERN_OK);
            np = m->n_params;
            g[rc] = malloc(np * sizeof(float));
            p[rc] = malloc(np * sizeof(float));
            grads_of(m, tok, tgt, &loss[rc], g[rc], p[rc]);
            tn_tmodel_free(m);
        }
        for (int rc = 1; rc < 3; rc++) {
            printf("%s: recompute %s: loss %.9f (none %.9f), gradients %s, params after 2 steps %s\n", fams[f],
                   tn_recompute_name((tn_recompute)rc), loss[rc], loss[0], memcmp(g[0], g[rc], np * 4) ? "DIFFER" : "bit-identical",
                   memcmp(p[0], p[rc], np * 4) ? "DIFFER" : "bit-identical");
            assert_true(loss[rc] == loss[0]);
            assert_memory_equal(g[0], g[rc], np * sizeof(float));
            assert_memory_equal(p[0], p[rc], np * sizeof(float));
        }
        ce_compare(fams[f], loss[0], loss[3], g[0], g[3], p[0], p[3], np);
        for (int rc = 0; rc < 4; rc++) free(g[rc]), free(p[rc]);
    }
}

/* LoRA over a Q4_0 base: the frozen tiled matmuls and the adapter recompute bit-identically. */
static void test_recompute_lora(void **st) {
    (void)st;
    tiny_cfg tc;
    tiny_cfg_default(&tc);
    tc.arch = "qwen3";
    tc.n_embd = 32, tc.n_layer = 2, tc.n_head = 4, tc.n_head_kv = 2, tc.n_ff = 64, tc.n_vocab = 270, tc.n_ctx = 16;
    tc.wtype = TN_Q4_0, tc.out_type = TN_Q8_0, tc.seed = 5;
    char path[512];
    tiny_tmp_path(path, sizeof path, "memplan_lora");
    assert_int_equal(tiny_model_write(path, &tc), TERN_OK);
    tern_model_params mp;
    tern_model_params_init(&mp);
    mp.repack = false;
    tern_model *base;
    assert_int_equal(tern_model_load(path, &mp, &base), TERN_OK);
    const int B = 2, T = 6;
    tn_train_cfg c;
    assert_int_equal(tn_train_cfg_from(base, T, &c), TERN_OK);
    int32_t tok[12], tgt[12];
    batch(B * T, c.n_vocab, 3, tok, tgt);
    double loss[4];
    float *g[4], *p[4];
    size_t np = 0;
    for (int rc = 0; rc < 4; rc++) { /* none, attn, full; none with the logits 5 rows at a time */
        tn_lora_cfg lc = {.rank = 4, .alpha = 8.0f, .targets = 0, .seed = 3};
        tn_tmodel *m;
        assert_int_equal(tn_tmodel_create_lora(&c, base, &lc, 2, &m), TERN_OK);
        m->tile_rows = 5;
        m->recompute = rc % 3;
        m->ce_rows = rc == 3 ? 5 : 0;
        assert_int_equal(tn_tmodel_plan(m, B, T), TERN_OK);
        uint64_t rng = 11; /* lora_b != 0 so the adapter takes part */
        for (int i = 0; i < m->n_tensors; i++)
            if (!m->t[i].frozen && strstr(m->t[i].name, ".lora_b"))
                for (size_t j = 0; j < m->t[i].n; j++) m->params[m->t[i].off + j] = (float)(0.05 * tn_rng_normal(&rng));
        np = m->n_params;
        g[rc] = malloc(np * sizeof(float));
        p[rc] = malloc(np * sizeof(float));
        grads_of(m, tok, tgt, &loss[rc], g[rc], p[rc]);
        tn_tmodel_free(m);
    }
    for (int rc = 1; rc < 3; rc++) {
        printf("LoRA qwen3 q4_0: recompute %s: loss %.9f (none %.9f), adapter gradients %s\n", tn_recompute_name((tn_recompute)rc),
               loss[rc], loss[0], memcmp(g[0], g[rc], np * 4) ? "DIFFER" : "bit-identical");
        assert_true(loss[rc] == loss[0]);
        assert_memory_equal(g[0], g[rc], np * sizeof(float));
        assert_memory_equal(p[0], p[rc], np * sizeof(float));
    }
    ce_compare("LoRA qwen3 q4_0", loss[0], loss[3], g[0], g[3], p[0], p[3], np);
    for (int rc = 0; rc < 4; rc++) free(g[rc]), free(p[rc]);
    tern_model_free(base);
    unlink(path);
}

/* ---- sizes and the budget -------------------------------------------------------------------- */

/* llama, every buffer a multiple of 16 floats (no alignment padding) for micro-batches 1, 2, 4. */
static const tn_train_cfg plan_cfg = {.n_vocab = 32, .n_ctx = 8, .n_embd = 16, .n_layer = 3, .n_head = 4, .n_head_kv = 2,
                                      .n_ff = 32, .rms_eps = 1e-5f, .rope_base = 10000.0f};
enum { PB = 4, PT = 8, PTH = 2 };

typedef struct expect { size_t peak, acts, probs_kept; } expect;

/* A llama shape: C = n_embd, H heads of hd, KV = n_head_kv * hd, F = n_ff, V vocab, L layers, T
 * ctx, nth threads. */
typedef struct shape { size_t C, H, hd, KV, F, V, L, T, nth; } shape;
static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

/* The sizes, from the shapes: written here from the block's description (train.h), not tmodel.c;
 * every buffer padded to 16 floats; logits ce_rows rows at a time. */
static expect expected_of(const shape *s, int mb, int rc, size_t ce_rows) {
    const size_t C = s->C, H = s->H, hd = s->hd, Q = H * hd, KV = s->KV, F = s->F, V = s->V, L = s->L, T = s->T;
    const size_t N = (size_t)mb * T;
    /* params: token_embd, per layer attn_norm q k v o ffn_norm gate up down, output_norm, output */
    const size_t np = V * C + L * (C + C * Q + C * KV * 2 + Q * C + C + 3 * C * F) + C + C * V;
    /* per layer: x_in, xn1, q, k, v, probabilities, y, x_mid, xn2, g, u, h */
    const size_t x_in = al16(N * C), probs = al16((size_t)mb * H * T * T);
    const size_t rest = al16(N * C) + 2 * al16(N * Q) + 2 * al16(N * KV) + 2 * al16(N * C) + 3 * al16(N * F); /* all but x_in, probs */
    size_t kept = x_in, shared = 0;
    if (rc == TN_RECOMPUTE_NONE) kept += probs + rest;
    if (rc == TN_RECOMPUTE_ATTN) kept += rest, shared = probs;
    if (rc == TN_RECOMPUTE_FULL) shared = probs + rest;
    const size_t head = 2 * al16(N * C) + al16(ce_rows * V);
    const size_t scratch = 2 * al16(N * C) + 2 * al16(N * Q) + 2 * al16(N * KV) + 3 * al16(N * F) + al16(s->nth * T) +
                           al16(s->nth * (C > hd ? C : hd));
    const size_t caches = T * hd + 3 * N;
    expect e;
    e.acts = 4 * (L * kept + shared + head + scratch + caches);
    e.peak = 16 * np + e.acts;
    e.probs_kept = rc == TN_RECOMPUTE_NONE ? 4 * L * probs : 0;
    return e;
}

static const shape plan_shape = {.C = 16, .H = 4, .hd = 4, .KV = 8, .F = 32, .V = 32, .L = 3, .T = PT, .nth = PTH};
/* at these sizes (<= 32 tokens) the logits are one chunk */
static expect expected(int mb, int rc) { return expected_of(&plan_shape, mb, rc, (size_t)mb * PT); }

/* The 15M-class config (`--preset 15m --batch 8`, ctx 256, the default model's 4096-token
 * vocabulary): activation bytes with --recompute full against none, from the sizes above. The
 * logits in chunks of 256 rows (the default) take the fall past 3x; all at once (the path of
 * before) it was 2.80x. The plan's bytes equal the sizes computed here. */
static void test_plan_15m(void **st) {
    (void)st;
    const shape s15 = {.C = 288, .H = 6, .hd = 48, .KV = 288, .F = 768, .V = 4096, .L = 6, .T = 256, .nth = 2};
    const tn_train_cfg c = {.n_vocab = 4096, .n_ctx = 256, .n_embd = 288, .n_layer = 6, .n_head = 6, .n_head_kv = 6,
                            .n_ff = 768, .rms_eps = 1e-5f, .rope_base = 10000.0f};
    const int B = 8;
    const expect en = expected_of(&s15, B, TN_RECOMPUTE_NONE, 256), ef = expected_of(&s15, B, TN_RECOMPUTE_FULL, 256);
    const expect en1 = expected_of(&s15, B, TN_RECOMPUTE_NONE, (size_t)B * 256),
                 ef1 = expected_of(&s15, B, TN_RECOMPUTE_FULL, (size_t)B * 256);
    const double fall = (double)en.acts / (double)ef.acts, fall1 = (double)en1.acts / (double)ef1.acts;
    printf("15m, batch 8, vocab 4096: activations none %.1f MiB, full %.1f MiB: %.2fx less (logits all at once: %.1f -> "
           "%.1f MiB, %.2fx)\n", en.acts / 1048576.0, ef.acts / 1048576.0, fall, en1.acts / 1048576.0, ef1.acts / 1048576.0, fall1);
    assert_true(fall >= 3.0);
    tn_tmodel *m;
    assert_int_equal(tn_tmodel_create(&c, 2, &m), TERN_OK);
    tn_mem_plan pn, pf;
    tn_tmodel_mem_plan(m, B, 1, 256, TN_RECOMPUTE_NONE, &pn);
    tn_tmodel_mem_plan(m, B, 1, 256, TN_RECOMPUTE_FULL, &pf);
    assert_int_equal(pn.acts, en.acts);
    assert_int_equal(pf.acts, ef.acts);
    assert_int_equal(pn.peak, en.peak);
    assert_int_equal(pn.ce_rows, 256);
    assert_int_equal(pn.logits, 256 * 4096 * 4);
    m->ce_rows = B * 256; /* all at once */
    tn_tmodel_mem_plan(m, B, 1, 256, TN_RECOMPUTE_NONE, &pn);
    tn_tmodel_mem_plan(m, B, 1, 256, TN_RECOMPUTE_FULL, &pf);
    assert_int_equal(pn.acts, en1.acts);
    assert_int_equal(pf.acts, ef1.acts);
    tn_tmodel_free(m);
}

static void test_plan_sizes(void **st) {
    (void)st;
    tn_tmodel *m;
    assert_int_equal(tn_tmodel_create(&plan_cfg, PTH, &m), TERN_OK);
    for (int accum = 1; accum <= PB; accum *= 2)
        for (int rc = 0; rc < 3; rc++) {
            tn_mem_plan p;
            tn_tmodel_mem_plan(m, PB, accum, PT, (tn_recompute)rc, &p);
            const expect e = expected(PB / accum, rc);
            printf("micro-batch %d, recompute %s: peak %zu (expected %zu), activations %zu (expected %zu)\n", PB / accum,
                   tn_recompute_name((tn_recompute)rc), p.peak, e.peak, p.acts, e.acts);
            assert_int_equal(p.micro_batch, PB / accum);
            assert_int_equal(p.accum, accum);
            assert_int_equal(p.peak, e.peak);
            assert_int_equal(p.acts, e.acts);
            assert_int_equal(p.kept[TN_MEM_ATTN_PROBS], e.probs_kept);
            size_t sum = p.head + p.logits + p.scratch + p.caches;
            for (int k = 0; k < TN_MEM_N_KIND; k++) sum += p.kept[k] + p.recomp[k];
            assert_int_equal(sum, p.acts); /* the table's rows add up to the total */
        }
    /* the fall: attn drops n_layer - 1 layers of probabilities, full all but the layer inputs */
    const size_t N = PB * PT, probs = (size_t)PB * 4 * PT * PT, rest = N * (16 + 16 + 16 + 16 + 16 + 16 + 3 * 32);
    tn_mem_plan pn, pa, pf;
    tn_tmodel_mem_plan(m, PB, 1, PT, TN_RECOMPUTE_NONE, &pn);
    tn_tmodel_mem_plan(m, PB, 1, PT, TN_RECOMPUTE_ATTN, &pa);
    tn_tmodel_mem_plan(m, PB, 1, PT, TN_RECOMPUTE_FULL, &pf);
    assert_int_equal(pn.acts - pa.acts, 4 * 2 * probs);
    assert_int_equal(pn.acts - pf.acts, 4 * 2 * (probs + rest));
    printf("activations: none %zu, attn %zu (%.2fx less), full %zu (%.2fx less)\n", pn.acts, pa.acts,
           (double)pn.acts / (double)pa.acts, pf.acts, (double)pn.acts / (double)pf.acts);
    /* the real model's activations equal the plan */
    for (int rc = 0; rc < 3; rc++) {
        tn_tmodel *mm;
        assert_int_equal(tn_tmodel_create(&plan_cfg, PTH, &mm), TERN_OK);
        mm->recompute = rc;
        assert_int_equal(tn_tmodel_plan(mm, PB, PT), TERN_OK);
        assert_int_equal((mm->acts_floats + PT * 4 + 3 * N) * 4, expected(PB, rc).acts);
        tn_tmodel_free(mm);
    }
    tn_tmodel_free(m);
}

static void test_budget(void **st) {
    (void)st;
    tn_tmodel *m;
    assert_int_equal(tn_tmodel_create(&plan_cfg, PTH, &m), TERN_OK);
    /* the documented order: per micro-batch (4, 2, 1) none then attn; then full for 4, 2, 1 */
    int order[9][2] = {{4, 0}, {4, 1}, {2, 0}, {2, 1}, {1, 0}, {1, 1}, {4, 2}, {2, 2}, {1, 2}};
    int n_checked = 0;
    for (int i = 0; i < 9; i++)
        for (int under = 0; under <= 1; under++) {
            const size_t budget = expected(order[i][0], order[i][1]).peak - (size_t)under;
            int want = -1;
            for (int j = 0; j < 9 && want < 0; j++)
                if (expected(order[j][0], order[j][1]).peak <= budget) want = j;
            tn_mem_plan p;
            const bool ok = tn_mem_choose(m, PB, PT, budget, 0, -1, &p);
            assert_int_equal(ok, want >= 0);
            if (want >= 0) {
                assert_int_equal(p.micro_batch, order[want][0]);
                assert_int_equal((int)p.recompute, order[want][1]);
                assert_int_equal(p.accum, PB / order[want][0]);
            }
            n_checked++;
        }
    /* a budget between (4, none) and (4, attn) picks attn at micro-batch 4 */
    tn_mem_plan p;
    const size_t mid = (expected(4, 0).peak + expected(4, 1).peak) / 2;
    assert_true(tn_mem_choose(m, PB, PT, mid, 0, -1, &p));
    assert_int_equal(p.micro_batch, 4);
    assert_int_equal((int)p.recompute, TN_RECOMPUTE_ATTN);
    /* too small: refused, the smallest configuration named */
    assert_false(tn_mem_choose(m, PB, PT, expected(1, 2).peak - 1, 0, -1, &p));
    assert_int_equal(p.micro_batch, 1);
    assert_int_equal((int)p.recompute, TN_RECOMPUTE_FULL);
    assert_int_equal(p.peak, expected(1, 2).peak);
    /* fixed parts: --recompute none varies only the micro-batch, --grad-accum 2 only recompute */
    assert_true(tn_mem_choose(m, PB, PT, expected(2, 0).peak, 0, TN_RECOMPUTE_NONE, &p));
    assert_int_equal(p.micro_batch, 2);
    assert_true(tn_mem_choose(m, PB, PT, expected(2, 2).peak, 2, -1, &p));
    assert_int_equal(p.micro_batch, 2);
    assert_int_equal((int)p.recompute, expected(2, 1).peak <= expected(2, 2).peak ? 1 : 2);
    printf("budget: %d budgets checked against the order computed here\n", n_checked);
    tn_tmodel_free(m);
}

static void test_parse_size(void **st) {
    (void)st;
    uint64_t b;
    assert_true(tn_mem_parse_size("4G", &b));
    assert_true(b == 4ull << 30);
    assert_true(tn_mem_parse_size("512M", &b));
    assert_true(b == 512ull << 20);
    assert_true(tn_mem_parse_size("1.5KiB", &b));
    assert_true(b == 1536);
    assert_true(tn_mem_parse_size("123", &b));
    assert_true(b == 123);
    assert_false(tn_mem_parse_size("0", &b));
    assert_false(tn_mem_parse_size("-1G", &b));
    assert_false(tn_mem_parse_size("4X", &b));
    assert_false(tn_mem_parse_size("G", &b));
    tn_recompute r;
    assert_true(tn_recompute_parse("attn", &r) && r == TN_RECOMPUTE_ATTN);
    assert_false(tn_recompute_parse("some", &r));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_accum),     cmocka_unit_test(test_recompute_bitwise), cmocka_unit_test(test_recompute_lora),
        cmocka_unit_test(test_plan_sizes),     cmocka_unit_test(test_plan_15m),          cmocka_unit_test(test_budget),
        cmocka_unit_test(test_parse_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
