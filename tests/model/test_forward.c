/*
 * test_forward.c — tern's forward pass against the independent double-precision reference
 * (ref_forward.c) on tiny random models of every supported weight type, llama, qwen2 and qwen3
 * (head_dim from key_length, wider than n_embd / n_head), smollm3, gemma2/3, phi3, tied and separate output; per-layer
 * residual streams and logits. Also: batched prefill equals token-by-token decoding; context-full
 * and bad-token errors. With file arguments (test_forward FILE...): the same comparison on each
 * file, e.g. one `tern synth --arch NAME` wrote from the registry; for a dense file without a
 * sliding window also its 12-token prefill against 12 decodes (1e-4) and its prompt in a
 * two-sequence batch against alone (bit for bit).
 *
 * Tolerances (relative L2 error, ||tern - ref|| / ||ref||): tern rounds what llama.cpp rounds —
 * q, K, V and attention probabilities to f16 (2^-11 relative each) and activations to the weight
 * type's vec_dot_type before every matrix product: f16 (2^-11), bf16 (2^-8) or 8-bit blocks
 * (q8_0/q8_1/q8_K: up to amax/254 per element, ~0.2% relative L2 per product). Errors add up over
 * the 2 layers × 7 products and the final projection, so the bounds are 5e-3 for f32 and f16
 * weights, 4e-2 for bf16 and 8-bit activations. A wrong rope pairing, head mapping, mask or norm
 * gives errors of order 1.
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

#include "quant/tq.h"

#include "common/tiny_model.h"
#include "model/blocks.h"
#include "model/ctx.h"
#include "ref_forward.h"

typedef struct {
    double *layers; /* captured residual streams for a 1-token step */
    int32_t n_embd;
} cap;

static void capture(void *user, int32_t il, const float *x, int32_t n, int32_t d) {
    cap *c = user;
    if (n != 1) return;
    for (int32_t i = 0; i < d; i++) c->layers[(size_t)il * d + i] = x[i];
}

static double rel_err(const double *ref, const float *got, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = (double)got[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static double rel_err_d(const double *ref, const double *got, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static double tol_for(tn_dtype t) {
    switch (t) {
    case TN_F32:
    case TN_F16: return 5e-3;
    default: return 4e-2;
    }
}

/* tern vs the reference on model m: a 9-token prefill, then 6 decode steps (every layer's stream
 * and the logits); wt is the type the tolerance is chosen by. */
static void run_model(tern_model *m, const char *arch, tn_dtype wt, tn_dtype ot, bool tied, int threads) {
    const tn_hparams *hp = &m->hp;
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = 32;
    cp.n_threads = threads;
    tern_ctx *c = NULL;
    assert_int_equal(tern_ctx_create(m, &cp, &c), TERN_OK);
    const int32_t d = hp->n_embd, nv = hp->n_vocab, nl = hp->n_layer;
    cap cp_ = {calloc((size_t)(nl + 1) * d, sizeof(double)), d};
    c->debug_layer = capture;
    c->debug_user = &cp_;
    ref_model *r = ref_create(m, 32);
    double *rl = malloc((size_t)nv * sizeof *rl), *rlay = malloc((size_t)(nl + 1) * d * sizeof *rlay);
    const tern_token prompt[] = {1, 270, 5, 300, 261, 380, 100, 259, 3};
    const int32_t np = (int32_t)(sizeof prompt / sizeof prompt[0]);
    /* prefill in one batch: compare logits of the last prompt token */
    assert_int_equal(tern_decode(c, prompt, np), TERN_OK);
    for (int32_t i = 0; i < np; i++) ref_step(r, prompt[i], rl, NULL);
    double e = rel_err(rl, tern_get_logits(c, -1), nv), tol = tol_for(wt == TN_F32 ? ot : wt);
    if (e > tol) fail_msg("%s %s/%s tied=%d t=%d: prefill logits rel err %.3g > %.3g (closest routing %.3g)", arch, tn_dtype_name(wt), tn_dtype_name(ot), tied, threads, e, tol, ref_min_route_gap(r));
    /* decode steps: per-layer residual streams and logits */
    double worst = e;
    tern_token t = 261;
    for (int step = 0; step < 6; step++) {
        assert_int_equal(tern_decode(c, &t, 1), TERN_OK);
        ref_step(r, t, rl, rlay);
        for (int32_t il = 0; il <= nl; il++) {
            double le = rel_err_d(rlay + (size_t)il * d, cp_.layers + (size_t)il * d, d);
            if (le > tol) fail_msg("%s %s: step %d layer %d rel err %.3g > %.3g (closest routing %.3g)", arch, tn_dtype_name(wt), step, il, le, tol, ref_min_route_gap(r));
        }
        e = rel_err(rl, tern_get_logits(c, -1), nv);
        if (e > tol) fail_msg("%s %s: step %d logits rel err %.3g > %.3g", arch, tn_dtype_name(wt), step, e, tol);
        if (e > worst) worst = e;
        t = (tern_token)(259 + (step * 37) % 100);
    }
    printf("  %-6s %-5s/%-5s tied=%d threads=%d: worst logits rel err %.2e (bound %.0e)", arch, tn_dtype_name(wt),
           tn_dtype_name(ot), tied, threads, worst, tol);
    if (hp->n_expert > 0) printf(", closest routing %.2e", ref_min_route_gap(r));
    printf("\n");
    ref_free(r);
    free(rl);
    free(rlay);
    free(cp_.layers);
    tern_ctx_free(c);
}

static void run_cfg(tiny_cfg cfg, int threads) {
    char path[512];
    tiny_tmp_path(path, sizeof path, "fwd");
    assert_int_equal(tiny_model_write(path, &cfg), TERN_OK);
    tern_model *m = NULL;
    tern_status s = tern_model_load(path, NULL, &m);
    if (s) fail_msg("load: %s", tern_last_error());
    unlink(path);
    run_model(m, cfg.arch, cfg.wtype, cfg.out_type, cfg.tied, threads);
    tern_model_free(m);
}

static void run_case(const char *arch, tn_dtype wt, tn_dtype ot, bool tied, int threads) {
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.arch = arch;
    cfg.wtype = wt;
    cfg.out_type = ot;
    cfg.tied = tied;
    run_cfg(cfg, threads);
}

/* 16 query heads of 64 over 4 kv heads: one-token attention in groups of 4 heads per call, each
 * thread preparing its own groups' RoPE and cache rows (no barrier before attention). */
static void test_head_groups(void **state) {
    (void)state;
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.n_embd = 1024, cfg.n_head = 16, cfg.n_head_kv = 4, cfg.n_ff = 256, cfg.n_layer = 2;
    cfg.wtype = TN_Q8_0;
    run_cfg(cfg, 2);
    cfg.n_head_kv = 16; /* multi-head attention: groups of 4 kv heads */
    run_cfg(cfg, 2);
}

static void test_llama_types(void **state) {
    (void)state;
    const tn_dtype types[] = {TN_F32, TN_F16, TN_BF16, TN_Q8_0, TN_Q4_0, TN_Q4_1, TN_Q5_0,
                              TN_Q5_1, TN_Q2_K, TN_Q3_K, TN_Q4_K, TN_Q5_K, TN_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) run_case("llama", types[i], TN_F32, false, 2);
    /* tq1 (rows of 256 and 512: the 32-row lookup-table layout on AVX-512), sym and asym */
    const tn_tq_params tq1[] = {{1, 64, true}, {1, 32, false}};
    for (size_t i = 0; i < 2; i++) run_case("llama", (tn_dtype)tn_tq_dtype(&tq1[i]), TN_F32, false, 2);
}

static void test_qwen2_and_tied(void **state) {
    (void)state;
    run_case("qwen2", TN_F32, TN_F32, false, 1);
    run_case("qwen2", TN_Q8_0, TN_Q6_K, false, 2);
    run_case("llama", TN_Q4_K, TN_Q6_K, true, 2);
    run_case("llama", TN_F16, TN_F16, true, 3);
    /* llama with attention.key_length != n_embd / n_head (Mistral Nemo's shape: 4 heads of 128
     * over n_embd 256), and qwen2 likewise (its biases q_dim long) */
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.head_dim = 128, cfg.wtype = TN_Q8_0;
    run_cfg(cfg, 2);
    cfg.arch = "qwen2", cfg.wtype = TN_F32;
    run_cfg(cfg, 1);
}

/* qwen3: per-head q/k RMSNorm (random norm weights) before neox RoPE; head_dim 128 from
 * attention.key_length over n_embd 256 / 4 heads, so q and the attention output are 512 wide and
 * attn_output is [512 -> 256]; f32 and quantized weights, 1-3 threads, tied output; and 16 heads
 * over 4 kv heads (attention in head groups, each thread norming and rotating its own heads). */
static void test_qwen3(void **state) {
    (void)state;
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.arch = "qwen3";
    cfg.head_dim = 128;
    const tn_dtype types[] = {TN_F32, TN_F16, TN_Q8_0, TN_Q4_0, TN_Q4_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        cfg.wtype = types[i];
        run_cfg(cfg, i % 3 + 1);
    }
    cfg.wtype = TN_Q8_0, cfg.out_type = TN_Q8_0, cfg.tied = true;
    run_cfg(cfg, 2);
    cfg.tied = false, cfg.out_type = TN_F32;
    cfg.n_embd = 512, cfg.n_head = 16, cfg.n_head_kv = 4, cfg.head_dim = 64, cfg.wtype = TN_Q8_0;
    run_cfg(cfg, 2);
    cfg.head_dim = 0; /* key_length absent: n_embd / n_head */
    run_cfg(cfg, 2);
}

/* smollm3: the llama block without RoPE on layers 3, 7, ...: 8 layers (two NoPE layers). */
static void test_smollm3(void **state) {
    (void)state;
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.arch = "smollm3";
    cfg.n_layer = 8;
    cfg.wtype = TN_F32;
    run_cfg(cfg, 1);
    cfg.wtype = TN_Q8_0;
    run_cfg(cfg, 2);
}

/* gemma3: embeddings * sqrt(n_embd), post-attention and post-FFN norms, q/k norms, GeGLU (tanh
 * GELU), 7 layers with sliding_window 4 (layers 0-4 and 6 local with RoPE base 10000, layer 5
 * global with the file's 1e6): the 15 positions of a run outgrow the window; head_dim 128 over
 * n_embd 256 / 4 heads; final logit soft-capping at 3 (a bound the logits reach). */
static void test_gemma3(void **state) {
    (void)state;
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.arch = "gemma3";
    cfg.n_layer = 7, cfg.head_dim = 128, cfg.n_swa = 4, cfg.rope_base = 1e6f;
    const tn_dtype types[] = {TN_F32, TN_Q8_0, TN_Q4_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        cfg.wtype = types[i];
        run_cfg(cfg, i % 3 + 1);
    }
    cfg.wtype = TN_F16, cfg.softcap = 3.0f, cfg.tied = true, cfg.out_type = TN_F16;
    run_cfg(cfg, 2);
    cfg.n_swa = 0, cfg.softcap = 0, cfg.tied = false, cfg.out_type = TN_F32; /* no sliding window: every layer global */
    run_cfg(cfg, 2);
}

/* gemma2: embeddings * sqrt(n_embd), post norms, no q/k norms, GeGLU, one RoPE base; 4 layers
 * alternating local (0, 2: window 4) and global (1, 3), so the 15 positions of a run outgrow the
 * window; attention scores soft-capped at 1 and logits at 3 (bounds both reach: q.k / sqrt(hd)
 * of these weights is O(1)); the output is the embedding table (gemma2 has no output.weight).
 * F32 weights, f16 and two block types, 1-3 threads (prefill of 9 tokens, then 6 one-token steps);
 * and the caps at llama.cpp's defaults (50, 30: absent keys). */
static void test_gemma2(void **state) {
    (void)state;
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.arch = "gemma2";
    cfg.n_layer = 4, cfg.head_dim = 128, cfg.n_swa = 4, cfg.tied = true;
    cfg.attn_softcap = 1.0f, cfg.softcap = 3.0f;
    const tn_dtype types[] = {TN_F32, TN_F16, TN_Q8_0, TN_Q4_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        cfg.wtype = types[i], cfg.out_type = types[i] == TN_F32 || types[i] == TN_F16 ? types[i] : TN_Q8_0;
        run_cfg(cfg, (int)(i % 3) + 1);
    }
    cfg.attn_softcap = 0, cfg.softcap = 0, cfg.wtype = TN_Q8_0;
    run_cfg(cfg, 2);
}

/* phi3: q, k, v from one attn_qkv matrix and gate, up from one ffn_up (2 n_ff rows, gate first),
 * both split by the reference itself from the file's bytes; partial rotary (48 of 64 dims, neox);
 * LongRoPE: the contexts of run_model (32 positions) are above an original context of 16 (the
 * long factors) and within one of 64 (the short ones), the rotated dims scaled by an attention
 * factor of 1.2 (scores 1.44x sharper: errors ~1.3x llama's); 4 heads over 2 kv heads, 2 layers; F32,
 * F16, Q8_0 and Q4_0 weights, 1-3 threads,
 * prefill and one-token steps; tied and separate output. */
static void test_phi3(void **state) {
    (void)state;
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.arch = "phi3";
    cfg.n_rot = 48, cfg.rope_attn_factor = 1.2f; /* 2 layers: the bounds' budget (see the top) */
    const tn_dtype types[] = {TN_F32, TN_F16, TN_Q8_0, TN_Q4_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        for (int orig = 16; orig <= 64; orig *= 4) {
            cfg.wtype = types[i], cfg.n_ctx_orig = orig;
            run_cfg(cfg, (int)(i % 3) + 1);
        }
    cfg.wtype = TN_Q8_0, cfg.out_type = TN_Q8_0, cfg.tied = true, cfg.n_rot = 0, cfg.rope_attn_factor = 0;
    run_cfg(cfg, 2); /* full rotary, no attention factor, the output tied */
}

/* Mixture of experts against the reference (its own routing: softmax, top-k, renormalised for
 * qwen3moe and Mixtral-style llama, not for olmoe; experts read from the file's 3-D tensors):
 * qwen3moe (per-head q/k norms, head_dim 128), olmoe (q/k norms over whole rows), llama with
 * experts, qwen2moe (q/k/v biases, probabilities not renormalised, a gated shared expert), gpt-oss
 * (attention sinks, biases everywhere, softmax over the top-k logits, clamped SwiGLU, YaRN, a
 * sliding window on even layers), deepseek2 (latent attention with a dense first layer, 2 shared
 * experts, YaRN; -v3: q low-rank, sigmoid, exp_probs_b, groups, renormalised and scaled; -kvb: an
 * older file's attn_kv_b, split at load) against the reference's per-head decompressed attention;
 * F32, Q8_0 and Q4_K experts, 1-3 threads, a 9-token prefill and one-token decode steps. */
static void test_moe(void **state) {
    (void)state;
    const char *archs[] = {"qwen3moe", "olmoe", "llama", "qwen2moe", "gpt-oss", "deepseek2", "deepseek2-v3", "deepseek2-kvb"};
    const tn_dtype types[] = {TN_F32, TN_Q8_0};
    for (size_t a = 0; a < 8; a++)
        for (size_t i = 0; i < (a == 7 ? 1u : 2u); i++) /* kv_b: F32 only (its split into f32 k_b / v_b at load
                                                          * dequantizes exactly; at Q8_0 a routing decision of
                                                          * this seed flips, 10% off at layer 2) */
            run_cfg(tiny_cfg_moe(archs[a], types[i]), (int)((a + i) % 3) + 1);
}

/* Sequence 0's 9-token prompt alone in a batch, and interleaved with sequence 1's 7 tokens: the
 * logits of its last token equal bit for bit (1 and 2 threads). */
static void check_mixed_batch(const tern_model *m, const char *name) {
    for (int threads = 1; threads <= 2; threads++) {
        tern_ctx_params cp;
        tern_ctx_params_init(&cp);
        cp.n_ctx = 64, cp.n_threads = threads;
        tern_ctx *a = NULL, *b = NULL;
        assert_int_equal(tern_ctx_create(m, &cp, &a), TERN_OK);
        assert_int_equal(tern_ctx_create(m, &cp, &b), TERN_OK);
        const tern_token p0[9] = {1, 270, 5, 300, 261, 380, 100, 259, 3}, p1[7] = {1, 40, 41, 42, 43, 44, 45};
        const int32_t t0[1] = {0}, t1[1] = {1}, *tables[2] = {t0, t1};
        /* alone: the 9 tokens of sequence 0 */
        int32_t seq[16], pos[16];
        int8_t lg[16];
        for (int i = 0; i < 9; i++) seq[i] = 0, pos[i] = i, lg[i] = i == 8;
        const tn_batch ba = {9, p0, seq, pos, lg};
        tn_forward_batch(a, &ba, tables, NULL);
        assert_int_equal(a->n_logits, 1);
        /* mixed: sequence 1's 7 tokens interleaved (0, 1, 0, 1, ...; then the rest of 0) */
        tern_token tk[16];
        int32_t sq[16], ps[16];
        int8_t lm[16];
        int n0 = 0, n1 = 0, last0 = -1;
        for (int i = 0; i < 16; i++) {
            const bool one = (i % 2 == 1 && n1 < 7) || n0 == 9;
            tk[i] = one ? p1[n1] : p0[n0], sq[i] = one, ps[i] = one ? n1++ : n0++;
            if (!one && n0 == 9) last0 = i;
            lm[i] = 0;
        }
        lm[last0] = 1;
        const tn_batch bb = {16, tk, sq, ps, lm};
        tn_forward_batch(b, &bb, tables, NULL);
        assert_int_equal(b->n_logits, 1);
        if (memcmp(a->logits, b->logits, sizeof(float) * (size_t)m->hp.n_vocab))
            fail_msg("%s threads %d: a prompt's logits in a mixed batch differ from the prompt alone", name, threads);
        tern_ctx_free(a);
        tern_ctx_free(b);
    }
}

/* Dropless routing is per token: a prompt's logits from a batch where another sequence's tokens
 * are interleaved with it (so every expert's group of rows differs) equal, bit for bit, those of
 * the prompt in a batch alone; on qwen3moe, olmoe, qwen2moe and gpt-oss, F32 and Q8_0, 1 and 2 threads. */
static void test_moe_mixed_batch(void **state) {
    (void)state;
    const char *archs[] = {"qwen3moe", "olmoe", "qwen2moe", "gpt-oss", "deepseek2-v3"};
    const tn_dtype types[] = {TN_F32, TN_Q8_0};
    for (int v = 0; v < 10; v++) {
        tiny_cfg cfg = tiny_cfg_moe(archs[v % 5], types[v / 5]);
        char path[512];
        tiny_tmp_path(path, sizeof path, "moemix");
        assert_int_equal(tiny_model_write(path, &cfg), TERN_OK);
        tern_model *m = NULL;
        assert_int_equal(tern_model_load(path, NULL, &m), TERN_OK);
        unlink(path);
        char name[64];
        snprintf(name, sizeof name, "%s %s", archs[v % 5], tn_dtype_name(types[v / 5]));
        check_mixed_batch(m, name);
        tern_model_free(m);
    }
}

/* A 12-token prefill in one batch against 12 one-token decodes (2 threads): every position's
 * logits within 1e-4 relative. */
static void check_prefill_decode(const tern_model *m, const char *name) {
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = 32, cp.n_threads = 2, cp.logits_all = true;
    tern_ctx *a = NULL, *b = NULL;
    assert_int_equal(tern_ctx_create(m, &cp, &a), TERN_OK);
    assert_int_equal(tern_ctx_create(m, &cp, &b), TERN_OK);
    tern_token toks[12];
    for (int i = 0; i < 12; i++) toks[i] = (tern_token)(3 + (i * 53) % 380);
    assert_int_equal(tern_decode(a, toks, 12), TERN_OK);
    const int32_t nv = m->hp.n_vocab;
    double worst = 0;
    for (int i = 0; i < 12; i++) {
        assert_int_equal(tern_decode(b, &toks[i], 1), TERN_OK);
        const float *la = tern_get_logits(a, i), *lb = tern_get_logits(b, -1);
        double num = 0, den = 0;
        for (int32_t j = 0; j < nv; j++) num += (la[j] - lb[j]) * (la[j] - lb[j]), den += (double)lb[j] * lb[j];
        const double e = sqrt(num / den);
        worst = e > worst ? e : worst;
        if (e > 1e-4) fail_msg("%s: position %d: prefill vs one-token decode rel err %.3g > 1e-4", name, i, e);
    }
    printf("  %-14s prefill vs 12 decodes: worst rel err %.2e\n", name, worst);
    tern_ctx_free(a);
    tern_ctx_free(b);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* The median of e[0 .. n-1] and how many exceed bound (e is sorted). */
static double median_over(double *e, int n, double bound, int *over) {
    qsort(e, (size_t)n, sizeof *e, cmp_double);
    *over = 0;
    for (int i = 0; i < n; i++) *over += e[i] > bound;
    return e[n / 2];
}

/* OLMoE with k-quant experts (q4_K, q5_K, q6_K: the file layout, not repacked at load; a prefill's
 * experts run through the interleaving batched kernel, avx512 gemm_ktile.c, once 5 (q6_K: 12) or
 * more tokens route to them) over n_embd 512 and experts of 2304 rows (k = 9 blocks: a slice of 8
 * and a tail), 2 threads: a 48-token prefill (96 routed rows over 8 experts) against
 *   - the reference forward, token by token: median over positions within the quantized bound
 *     and at most 1 in 8 positions above it;
 *   - 48 one-token decodes (the decode kernels, gemv.c's row kernels): the same criterion.
 * Not every position: with 48 positions x 2 layers some routing decisions are near ties, and a
 * choice that flips between q8_K-rounded activations and the reference's doubles (0.3 at one
 * position, the same with TERN_ISA=avx2, where this kernel is absent) or between the batched and
 * the row kernels' float orders (1e-3 .. 1e-2 there and, through attention, smaller at the later
 * positions: q6_K's median 4.7e-3, worst 7e-2; the same with TERN_KTILE=0, the kernels before this
 * one) moves logits at some positions. A wrong kernel is off at every position whose experts it
 * computed: at the median. The exact check of the kernel is tests/kern's parity test. */
static void test_moe_kquant_prefill(void **state) {
    (void)state;
    const tn_dtype types[] = {TN_Q4_K, TN_Q5_K, TN_Q6_K};
    for (int v = 0; v < 3; v++) {
        tiny_cfg cfg = tiny_cfg_moe("olmoe", types[v]);
        cfg.n_embd = 512, cfg.n_ff = 2304;
        tern_model *m = tiny_model_load(&cfg, "moekq");
        assert_non_null(m);
        tern_ctx_params cp;
        tern_ctx_params_init(&cp);
        cp.n_ctx = 64, cp.n_threads = 2, cp.logits_all = true;
        tern_ctx *c = NULL, *d = NULL;
        assert_int_equal(tern_ctx_create(m, &cp, &c), TERN_OK);
        assert_int_equal(tern_ctx_create(m, &cp, &d), TERN_OK);
        ref_model *r = ref_create(m, 64);
        enum { NP = 48 };
        const int32_t nv = m->hp.n_vocab;
        tern_token toks[NP];
        for (int i = 0; i < NP; i++) toks[i] = (tern_token)(3 + (i * 53) % 380);
        assert_int_equal(tern_decode(c, toks, NP), TERN_OK);
        double *rl = malloc((size_t)nv * sizeof *rl), e_ref[NP], e_dec[NP];
        for (int i = 0; i < NP; i++) {
            ref_step(r, toks[i], rl, NULL);
            e_ref[i] = rel_err(rl, tern_get_logits(c, i), nv);
            assert_int_equal(tern_decode(d, &toks[i], 1), TERN_OK);
            const float *la = tern_get_logits(c, i), *lb = tern_get_logits(d, -1);
            double num = 0, den = 0;
            for (int32_t j = 0; j < nv; j++) num += (la[j] - lb[j]) * (la[j] - lb[j]), den += (double)lb[j] * lb[j];
            e_dec[i] = sqrt(num / den);
        }
        const double tol = tol_for(types[v]);
        int over_ref, over_dec;
        const double med_ref = median_over(e_ref, NP, tol, &over_ref), med_dec = median_over(e_dec, NP, tol, &over_dec);
        printf("  olmoe %-5s 48-token prefill: vs reference median rel err %.2e, %d of 48 above %.0e (worst %.2e, closest "
               "routing %.2e); vs 48 decodes median %.2e, %d above (worst %.2e)\n",
               tn_dtype_name(types[v]), med_ref, over_ref, tol, e_ref[NP - 1], ref_min_route_gap(r), med_dec, over_dec,
               e_dec[NP - 1]);
        if (med_ref > tol || over_ref > NP / 8)
            fail_msg("olmoe %s prefill vs reference: median rel err %.3g (bound %.3g), %d of 48 positions above", tn_dtype_name(types[v]),
                     med_ref, tol, over_ref);
        if (med_dec > tol || over_dec > NP / 8)
            fail_msg("olmoe %s prefill vs one-token decodes: median rel err %.3g (bound %.3g), %d of 48 positions above",
                     tn_dtype_name(types[v]), med_dec, tol, over_dec);
        free(rl);
        ref_free(r);
        tern_ctx_free(c);
        tern_ctx_free(d);
        tern_model_free(m);
    }
}

/* Prefill of 12 tokens in one batch (grouped experts, the batched kernels) against 12 one-token
 * decodes (each thread norming the token itself, only the chosen experts read): the logits of
 * every position agree within 1e-4 relative (the dense families' batch-equivalence bound), on
 * qwen3moe, olmoe, Mixtral-style llama, qwen2moe and gpt-oss, F32 and Q8_0, 2 threads. */
static void test_moe_prefill_vs_decode(void **state) {
    (void)state;
    const char *archs[] = {"qwen3moe", "olmoe", "llama", "qwen2moe", "gpt-oss", "deepseek2", "deepseek2-v3"};
    const tn_dtype types[] = {TN_F32, TN_Q8_0};
    for (int v = 0; v < 14; v++) {
        tiny_cfg cfg = tiny_cfg_moe(archs[v % 7], types[v / 7]);
        tern_model *m = tiny_model_load(&cfg, "moepd");
        assert_non_null(m);
        char name[64];
        snprintf(name, sizeof name, "%s %s", archs[v % 7], tn_dtype_name(types[v / 7]));
        check_prefill_decode(m, name);
        tern_model_free(m);
    }
}

/* deepseek2's cache holds the latent: per position and layer kv_lora_rank + n_rot f16 values (64 +
 * 32 here) in K rows and nothing in V rows — against per-head K and V of n_head * (head_dim +
 * v_head) values (4 * (96 + 64)): 192 bytes a layer instead of 1280, 6.7x smaller. */
static void test_mla_cache_size(void **state) {
    (void)state;
    tiny_cfg cfg = tiny_cfg_moe("deepseek2", TN_F32);
    tern_model *m = tiny_model_load(&cfg, "mlakv");
    assert_non_null(m);
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = 64;
    tern_ctx *c = NULL;
    assert_int_equal(tern_ctx_create(m, &cp, &c), TERN_OK);
    const uint64_t per_token = (uint64_t)(cfg.kv_lora + cfg.n_rot) * 2 * (uint64_t)cfg.n_layer;
    assert_int_equal(c->k_rb, (size_t)(cfg.kv_lora + cfg.n_rot) * 2);
    assert_int_equal(c->v_rb, 0);
    assert_int_equal(c->kv_bytes, 64 * per_token);
    const uint64_t per_head = (uint64_t)cfg.n_head * (uint64_t)(cfg.head_dim + cfg.v_head) * 2 * (uint64_t)cfg.n_layer;
    printf("  deepseek2 KV cache: %llu bytes per token (latent + rope key) vs %llu per-head K/V (%.1fx)\n",
           (unsigned long long)per_token, (unsigned long long)per_head, (double)per_head / (double)per_token);
    tern_ctx_free(c);
    /* a V cache type other than K's is refused: the values are read from the K rows */
    cp.type_v = TERN_KV_Q8_0;
    assert_int_not_equal(tern_ctx_create(m, &cp, &c), TERN_OK);
    assert_non_null(strstr(tern_last_error(), "V cache type q8_0 differs from K's f16"));
    tern_model_free(m);
}

/* A 7-layer gemma3 tiny model (head_dim 128, Q8_0) with sliding window n_swa, loaded. */
static tern_model *load_gemma3_q8(int32_t n_swa, const char *tag) {
    tiny_cfg cfg;
    tiny_cfg_default(&cfg);
    cfg.arch = "gemma3";
    cfg.n_layer = 7, cfg.head_dim = 128, cfg.n_swa = n_swa, cfg.rope_base = 1e6f, cfg.wtype = TN_Q8_0;
    char path[512];
    tiny_tmp_path(path, sizeof path, tag);
    assert_int_equal(tiny_model_write(path, &cfg), TERN_OK);
    tern_model *m = NULL;
    assert_int_equal(tern_model_load(path, NULL, &m), TERN_OK);
    unlink(path);
    return m;
}

/* Paged caches (tern serve): a sliding-window layer gathers its window from the block table; one
 * token at a time over a permuted table (window 20 over blocks of 16: unaligned starts) gives the
 * contiguous cache's logits bit for bit, 40 positions. */
static void test_gemma3_paged_window(void **state) {
    (void)state;
    tern_model *m = load_gemma3_q8(20, "paged");
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = 48;
    cp.n_threads = 2;
    tern_ctx *a = NULL, *p = NULL;
    assert_int_equal(tern_ctx_create(m, &cp, &a), TERN_OK);
    assert_int_equal(tern_ctx_create(m, &cp, &p), TERN_OK);
    const int32_t table[3] = {2, 0, 1}, *tables[1] = {table}, nv = m->hp.n_vocab;
    for (int32_t pos = 0; pos < 40; pos++) {
        const tern_token tok = (tern_token)(3 + (pos * 37) % 380);
        assert_int_equal(tern_decode(a, &tok, 1), TERN_OK);
        const int32_t seq = 0;
        const int8_t want = 1;
        const tn_batch b = {1, &tok, &seq, &pos, &want};
        tn_forward_batch(p, &b, tables, NULL);
        assert_int_equal(p->n_logits, 1);
        if (memcmp(tern_get_logits(a, -1), p->logits, sizeof(float) * (size_t)nv))
            fail_msg("position %d: the paged cache's logits differ from the contiguous cache's", pos);
    }
    tern_ctx_free(a);
    tern_ctx_free(p);
    tern_model_free(m);
}

/* The ring of a sliding-window layer (swa_full off): window 4, batches of 3, so local layers keep
 * 16 rows of a 64-row cache, written at position % 16, read in place or (where the window wraps)
 * gathered. Against the same model with every position kept (swa_full): the same logits bit for
 * bit over 50 positions (a 10-token prefill in chunks of 3, then single tokens), after a
 * rollback of 3 positions (within what the ring keeps) and new tokens; a rollback of 14 (more
 * than the ring's 16 - 4 + 1 = 13) clears the cache. The KV bytes: 1 global layer of 64 rows and
 * 6 local layers of 16 (gemma3's pattern of 6: layer 5 global), K and V in f16. */
static void test_gemma3_ring(void **state) {
    (void)state;
    tern_model *m = load_gemma3_q8(4, "ring");
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = 64, cp.n_batch = 3, cp.n_threads = 2;
    tern_ctx *r = NULL, *f = NULL;
    assert_int_equal(tern_ctx_create(m, &cp, &r), TERN_OK);
    cp.swa_full = true;
    assert_int_equal(tern_ctx_create(m, &cp, &f), TERN_OK);
    const uint64_t kv_dim = (uint64_t)m->hp.n_head_kv * (uint64_t)m->hp.head_dim;
    assert_int_equal(tern_ctx_kv_bytes(f), 7 * 64 * kv_dim * 2 * 2);
    assert_int_equal(tern_ctx_kv_bytes(r), (1 * 64 + 6 * 16) * kv_dim * 2 * 2);
    const int32_t nv = m->hp.n_vocab;
    tern_token toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (tern_token)(3 + (i * 37) % 380);
    assert_int_equal(tern_decode(r, toks, 10), TERN_OK);
    assert_int_equal(tern_decode(f, toks, 10), TERN_OK);
    for (int32_t pos = 10; pos <= 50; pos++) {
        if (memcmp(tern_get_logits(r, -1), tern_get_logits(f, -1), sizeof(float) * (size_t)nv))
            fail_msg("position %d: the ring's logits differ from the full cache's", pos);
        if (pos == 50) break;
        assert_int_equal(tern_decode(r, &toks[pos], 1), TERN_OK);
        assert_int_equal(tern_decode(f, &toks[pos], 1), TERN_OK);
    }
    assert_int_equal(tern_ctx_truncate(r, 47), TERN_OK);
    assert_int_equal(tern_ctx_truncate(f, 47), TERN_OK);
    assert_int_equal(tern_ctx_n_past(r), 47);
    const tern_token again[4] = {7, 9, 11, 13};
    assert_int_equal(tern_decode(r, again, 4), TERN_OK);
    assert_int_equal(tern_decode(f, again, 4), TERN_OK);
    if (memcmp(tern_get_logits(r, -1), tern_get_logits(f, -1), sizeof(float) * (size_t)nv))
        fail_msg("after a rollback of 3: the ring's logits differ from the full cache's");
    assert_int_equal(tern_ctx_truncate(r, 51 - 14), TERN_OK);
    assert_int_equal(tern_ctx_n_past(r), 0);
    tern_ctx_free(r);
    tern_ctx_free(f);
    tern_model_free(m);
}

/* Prefill in one batch, in chunks, and token by token must agree (same kernels modulo tiling). */
/* The default tiny model with weights of type wt, written and loaded (the file removed). */
static tern_model *load_tiny(tn_dtype wt, const char *tag, tiny_cfg *cfg) {
    tiny_cfg_default(cfg);
    cfg->wtype = wt;
    char path[512];
    tiny_tmp_path(path, sizeof path, tag);
    assert_int_equal(tiny_model_write(path, cfg), TERN_OK);
    tern_model *m = NULL;
    assert_int_equal(tern_model_load(path, NULL, &m), TERN_OK);
    unlink(path);
    return m;
}

static void test_batch_equivalence(void **state) {
    (void)state;
    tiny_cfg cfg;
    tern_model *m = load_tiny(TN_Q4_0, "batch", &cfg);
    tern_token toks[20];
    for (int i = 0; i < 20; i++) toks[i] = (tern_token)(3 + (i * 53) % 380);
    float *ref = NULL;
    int32_t nv = tern_model_n_vocab(m);
    int32_t batches[] = {20, 7, 1};
    for (size_t b = 0; b < 3; b++) {
        tern_ctx_params cp;
        tern_ctx_params_init(&cp);
        cp.n_ctx = 32;
        cp.n_batch = batches[b];
        cp.n_threads = 2;
        tern_ctx *c = NULL;
        assert_int_equal(tern_ctx_create(m, &cp, &c), TERN_OK);
        assert_int_equal(tern_decode(c, toks, 20), TERN_OK);
        assert_int_equal(tern_ctx_n_past(c), 20);
        const float *l = tern_get_logits(c, -1);
        if (!ref) {
            ref = malloc((size_t)nv * sizeof *ref);
            memcpy(ref, l, (size_t)nv * sizeof *ref);
        } else {
            double num = 0, den = 0;
            for (int32_t i = 0; i < nv; i++) num += (l[i] - ref[i]) * (l[i] - ref[i]), den += ref[i] * ref[i];
            assert_true(sqrt(num / den) < 1e-4);
        }
        /* errors: context full, bad token */
        tern_token big[13] = {0};
        assert_int_equal(tern_decode(c, big, 13), TERN_ERR_FULL);
        tern_token bad = nv;
        assert_int_equal(tern_decode(c, &bad, 1), TERN_ERR_INVALID_ARG);
        assert_non_null(strstr(tern_last_error(), "outside vocabulary"));
        tern_ctx_free(c);
    }
    free(ref);
    tern_model_free(m);
}

/* Partial passes (c->start_layer, tern quantize's probes): fed the residual stream a full pass had
 * entering layer l0, the pass from l0 gives the full pass's logits bit for bit, for every l0 up
 * to n_layer (straight to the output); fed another layer's stream, it does not. */
typedef struct {
    float *xs; /* [n_layer + 1][n][n_embd]: xs[l] = the stream entering layer l */
    int32_t n, d, n_layer;
} stream_cap;

static void capture_stream(void *user, int32_t il, const float *x, int32_t n, int32_t d) {
    stream_cap *sc = user;
    if (n != sc->n || d != sc->d || il >= sc->n_layer) return; /* il = n_layer: the normed rows */
    memcpy(sc->xs + (size_t)(il + 1) * n * d, x, sizeof(float) * (size_t)n * d);
}

static void test_start_layer(void **state) {
    (void)state;
    tiny_cfg cfg;
    tern_model *m = load_tiny(TN_Q8_0, "start", &cfg);
    const int32_t n = 12, nv = tern_model_n_vocab(m), d = (int32_t)cfg.n_embd, nl = (int32_t)cfg.n_layer;
    tern_token toks[12];
    for (int i = 0; i < n; i++) toks[i] = (tern_token)(3 + (i * 71) % 380);
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = cp.n_batch = 16;
    cp.logits_all = true;
    cp.n_threads = 2;
    tern_ctx *c = NULL;
    assert_int_equal(tern_ctx_create(m, &cp, &c), TERN_OK);
    stream_cap sc = {calloc((size_t)(nl + 1) * n * d, sizeof(float)), n, d, nl};
    c->debug_layer = capture_stream;
    c->debug_user = &sc;
    assert_int_equal(tern_decode(c, toks, n), TERN_OK);
    c->debug_layer = NULL;
    float *ref = malloc(sizeof(float) * (size_t)n * nv);
    for (int32_t t = 0; t < n; t++) memcpy(ref + (size_t)t * nv, tern_get_logits(c, t), sizeof(float) * (size_t)nv);
    for (int32_t l0 = 1; l0 <= nl; l0++)
        for (int wrong = 0; wrong <= 1; wrong++) {
            assert_int_equal(tern_ctx_truncate(c, 0), TERN_OK);
            c->start_layer = l0;
            c->start_x = sc.xs + (size_t)(wrong ? l0 - 1 : l0) * n * d;
            assert_int_equal(tern_decode(c, toks, n), TERN_OK);
            c->start_layer = 0, c->start_x = NULL;
            bool same = true;
            for (int32_t t = 0; t < n; t++)
                same = same && memcmp(ref + (size_t)t * nv, tern_get_logits(c, t), sizeof(float) * (size_t)nv) == 0;
            if (same == (bool)wrong) fail_msg("start_layer %d fed the stream of layer %d: logits %s the full pass's", l0,
                                              wrong ? l0 - 1 : l0, same ? "equal" : "differ from");
        }
    free(ref), free(sc.xs);
    tern_ctx_free(c);
    tern_model_free(m);
}

static char **g_files;
static int g_n_files;

static void test_files(void **state) {
    (void)state;
    for (int i = 0; i < g_n_files; i++) {
        tern_model *m = NULL;
        if (tern_model_load(g_files[i], NULL, &m)) fail_msg("load: %s", tern_last_error());
        run_model(m, m->hp.family->name, m->layers[0].w[TN_ROLE_ATTN_Q].type, m->output.type,
                  m->output.data == m->tok_embd.data, 2);
        if (m->hp.n_expert == 0 && m->hp.n_swa == 0) { /* dense, no window (MoE and windowed files: their own tests) */
            char name[64];
            snprintf(name, sizeof name, "%s %s", m->hp.family->name, tn_dtype_name(m->layers[0].w[TN_ROLE_ATTN_Q].type));
            check_prefill_decode(m, name); /* one batch == token by token */
            check_mixed_batch(m, name);    /* a prompt beside another sequence == alone */
        }
        tern_model_free(m);
    }
}

/* tn_attn_split: for prompts from position 0 and later, mixed serve batches (decodes far along
 * next to a prompt), 1..7 threads and 1..8 units per token, the threads' ranges are contiguous,
 * cover every unit once, and each thread's cost (pos + 1 + TN_ATTN_UNIT_COST per unit, summed here
 * in double) is within one unit's cost of the even share; an equal count split of a 512-token
 * prompt is not (the check can fail). */
static void test_attn_split(void **state) {
    (void)state;
    enum { N = 512 };
    static int32_t pos[N];
    for (int pat = 0; pat < 4; pat++) {
        static const int ns[] = {1, 2, 3, 4, 5, 7, 8, 17, 63, 64, 100, 255, 256, 511, 512};
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int n = ns[ni];
            for (int t = 0; t < n; t++)
                pos[t] = pat == 0 ? t : pat == 1 ? 1000 + t : pat == 2 ? (t % 3 ? t : 4000 + t) : 7;
            const tn_batch b = {.n = n, .pos = pos};
            for (int64_t nu = 1; nu <= 8; nu *= 2)
                for (int nth = 1; nth <= 7; nth++) {
                    double tot = 0, wmax = 0;
                    for (int t = 0; t < n; t++) {
                        const double w = pos[t] + 1.0 + TN_ATTN_UNIT_COST;
                        tot += w * (double)nu;
                        if (w > wmax) wmax = w;
                    }
                    int64_t prev = 0;
                    for (int i = 0; i < nth; i++) {
                        int64_t p0, p1;
                        tn_attn_split(&b, nu, i, nth, &p0, &p1);
                        assert_int_equal(p0, prev);
                        assert_true(p1 >= p0);
                        double c = 0;
                        for (int64_t p = p0; p < p1; p++) c += pos[p / nu] + 1.0 + TN_ATTN_UNIT_COST;
                        if (fabs(c - tot / nth) > wmax + 1e-6)
                            fail_msg("pattern %d n %d nu %lld thread %d/%d: cost %.0f, even share %.1f", pat, n,
                                     (long long)nu, i, nth, c, tot / nth);
                        prev = p1;
                    }
                    assert_int_equal(prev, (int64_t)n * nu);
                }
        }
    }
    /* the equal count split this replaces: thread 1 of 2 gets ~3x thread 0's cost on a prompt */
    for (int t = 0; t < N; t++) pos[t] = t;
    double c0 = 0, c1 = 0;
    for (int t = 0; t < N; t++) {
        if (t < N / 2) c0 += pos[t] + 1.0 + TN_ATTN_UNIT_COST;
        else c1 += pos[t] + 1.0 + TN_ATTN_UNIT_COST;
    }
    assert_true(c1 > 2.5 * c0);
}

int main(int argc, char **argv) {
    if (argc > 1) { /* the reference comparison on each given file */
        g_files = argv + 1, g_n_files = argc - 1;
        const struct CMUnitTest files[] = {cmocka_unit_test(test_files)};
        return cmocka_run_group_tests(files, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_types),
        cmocka_unit_test(test_qwen2_and_tied),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_smollm3),
        cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_gemma2),
        cmocka_unit_test(test_phi3),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_moe_mixed_batch),
        cmocka_unit_test(test_moe_prefill_vs_decode),
        cmocka_unit_test(test_moe_kquant_prefill),
        cmocka_unit_test(test_mla_cache_size),
        cmocka_unit_test(test_gemma3_paged_window),
        cmocka_unit_test(test_gemma3_ring),
        cmocka_unit_test(test_head_groups),
        cmocka_unit_test(test_batch_equivalence),
        cmocka_unit_test(test_attn_split),
        cmocka_unit_test(test_start_layer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
