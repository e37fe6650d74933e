/*
 * test_hot_experts.c — hot experts (tern_model_params.hot_experts, src/model/tier.c) on a tiny
 * mixture-of-experts file given as argv[1]:
 *   - which experts a promotion copies: from routing counts made up by the test, the most used
 *     experts (ties by layer, expert) among those with at least their layer's mean share, while
 *     they fit the budget — the expected set worked out here by hand for the counts given;
 *   - the copies hold the bytes of the file's slices (compared with a second model that keeps
 *     every expert in the mapping), for every expert matrix of the layer;
 *   - promotion only adds: a second round keeps the first round's copies at the same addresses;
 *   - logits with hot experts equal those without, bit for bit (same bytes, same kernels), for a
 *     prefill and decode steps, and with the automatic promotions tern_decode makes;
 *   - the context's counters: rows routed, rows that went to hot experts (<= rows, > 0 once hot);
 *   - with hot experts asked for, the experts stay in the file mapping, while a model loaded
 *     without them (TERN_REPACK_EXPERTS unset) interleaves its q4_0 / q8_0 experts at load.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "model/ctx.h"
#include "quant/repack.h"

static const char *g_path;

static tern_model *load(uint64_t budget) {
    tern_model_params mp;
    tern_model_params_init(&mp);
    mp.hot_experts = budget;
    tern_model *m = NULL;
    if (tern_model_load(g_path, &mp, &m)) fail_msg("loading %s: %s", g_path, tern_last_error());
    return m;
}

static tern_ctx *make_ctx(const tern_model *m) {
    tern_ctx_params cp;
    tern_ctx_params_init(&cp);
    cp.n_ctx = 128, cp.n_threads = 2;
    tern_ctx *c = NULL;
    if (tern_ctx_create(m, &cp, &c)) fail_msg("context: %s", tern_last_error());
    return c;
}

static const int k_roles[3] = {TN_ROLE_FFN_GATE_EXPS, TN_ROLE_FFN_UP_EXPS, TN_ROLE_FFN_DOWN_EXPS};

/* One expert's bytes in the hot buffer: its slice of each expert matrix, each padded to 64 bytes. */
static size_t expert_bytes(const tern_model *m, int il) {
    size_t b = 0;
    for (int j = 0; j < 3; j++) {
        const tn_tensor *w = &m->layers[il].w[k_roles[j]];
        b += (w->nbytes / (size_t)w->ne[2] + 63) / 64 * 64;
    }
    return b;
}

static bool is_hot(const tern_model *m, int il, int e) {
    const tn_tensor *w = &m->layers[il].w[TN_ROLE_FFN_GATE_EXPS];
    return w->hot && atomic_load(&w->hot[e]) != NULL;
}

/* Every hot expert's copies == the same slices of a model that maps them all. */
static void check_bytes(const tern_model *hot, const tern_model *ref) {
    for (int il = 0; il < hot->hp.n_layer; il++)
        for (int e = 0; e < hot->hp.n_expert; e++)
            for (int j = 0; j < 3; j++) {
                const tn_tensor *w = &hot->layers[il].w[k_roles[j]], *r = &ref->layers[il].w[k_roles[j]];
                const void *h = w->hot ? atomic_load(&w->hot[e]) : NULL;
                assert_true(is_hot(hot, il, e) == (h != NULL)); /* all of a layer's matrices or none */
                if (!h) continue;
                const tn_tensor rv = tn_expert_view(r, e);
                assert_ptr_not_equal(h, rv.data);
                assert_int_equal(memcmp(h, rv.data, rv.nbytes), 0);
            }
}

static void test_choice_and_bytes(void **state) {
    (void)state;
    tern_model *ref = load(0);
    assert_int_equal(ref->hp.n_layer, 2);
    assert_int_equal(ref->hp.n_expert, 8);
    assert_null(ref->tier);
    const size_t eb = expert_bytes(ref, 0);
    assert_int_equal(eb, expert_bytes(ref, 1));
    tern_model *m = load(5 * eb); /* room for five experts */
    assert_non_null(m->tier);
    uint64_t cnt[2][8];
    for (int e = 0; e < 8; e++) cnt[0][e] = 1, cnt[1][e] = 2;
    cnt[0][5] = 100, cnt[0][2] = 50, cnt[0][7] = 40, cnt[0][1] = 30; /* layer 0 mean 28: 5, 2, 7, 1 qualify */
    cnt[1][3] = 45;                                                   /* layer 1 mean 7.4: only 3 */
    cnt[1][6] = 7;                                                    /* below the mean: never */
    assert_int_equal(tn_tier_promote(m, &cnt[0][0]), TERN_OK);
    /* by count: (0,5) 100, (0,2) 50, (1,3) 45, (0,7) 40, (0,1) 30: all five fit */
    const int want1[][2] = {{0, 5}, {0, 2}, {1, 3}, {0, 7}, {0, 1}};
    for (int il = 0; il < 2; il++)
        for (int e = 0; e < 8; e++) {
            bool w = false;
            for (int i = 0; i < 5; i++) w |= want1[i][0] == il && want1[i][1] == e;
            assert_true(is_hot(m, il, e) == w);
        }
    tern_ctx *c = make_ctx(m);
    tern_hot_experts h;
    tern_ctx_hot_experts(c, &h);
    assert_int_equal(h.n_hot, 5);
    assert_int_equal(h.used_bytes, 5 * eb);
    assert_int_equal(h.budget_bytes, 5 * eb);
    assert_int_equal(h.n_experts, 16);
    check_bytes(m, ref);
    tern_ctx_free(c);
    tern_model_free(m);

    /* a budget of three: the three most used */
    m = load(3 * eb);
    assert_int_equal(tn_tier_promote(m, &cnt[0][0]), TERN_OK);
    for (int il = 0; il < 2; il++)
        for (int e = 0; e < 8; e++) assert_true(is_hot(m, il, e) == ((il == 0 && (e == 5 || e == 2)) || (il == 1 && e == 3)));
    assert_true(m->tier->full);
    check_bytes(m, ref);
    tern_model_free(m);

    /* a budget of six: the five, then a second round adds while room is left and keeps the first
     * round's copies where they are */
    m = load(6 * eb);
    assert_int_equal(tn_tier_promote(m, &cnt[0][0]), TERN_OK);
    assert_int_equal(m->tier->n_hot, 5);
    assert_false(m->tier->full);
    const void *before = atomic_load(&m->layers[0].w[TN_ROLE_FFN_DOWN_EXPS].hot[5]);
    uint64_t cnt2[2][8];
    for (int e = 0; e < 8; e++) cnt2[0][e] = 0, cnt2[1][e] = 0;
    cnt2[1][0] = 9, cnt2[1][4] = 8, cnt2[0][5] = 1; /* layer 1 mean 2.1: 0 then 4, room for one */
    assert_int_equal(tn_tier_promote(m, &cnt2[0][0]), TERN_OK);
    assert_true(is_hot(m, 1, 0) && !is_hot(m, 1, 4) && is_hot(m, 0, 5) && is_hot(m, 1, 3) && is_hot(m, 0, 1));
    assert_ptr_equal(atomic_load(&m->layers[0].w[TN_ROLE_FFN_DOWN_EXPS].hot[5]), before);
    assert_int_equal(m->tier->n_hot, 6);
    assert_true(m->tier->full);
    check_bytes(m, ref);
    tern_model_free(m);
    tern_model_free(ref);
}

static void decode_logits(tern_ctx *c, const tern_token *t, int n, float *out, int32_t nv) {
    assert_int_equal(tern_decode(c, t, n), TERN_OK);
    memcpy(out, tern_get_logits(c, -1), sizeof(float) * (size_t)nv);
}

static void test_logits_equal(void **state) {
    (void)state;
    tern_model *ref = load(0), *m = load((uint64_t)1 << 30); /* room for every expert */
    tern_ctx *cr = make_ctx(ref), *c = make_ctx(m);
    const int32_t nv = tern_model_n_vocab(ref);
    float *a = malloc(sizeof(float) * (size_t)nv), *b = malloc(sizeof(float) * (size_t)nv);
    assert_non_null(a);
    assert_non_null(b);
    tern_token prompt[24];
    for (int i = 0; i < 24; i++) prompt[i] = (tern_token)((i * 37 + 11) % nv);
    decode_logits(cr, prompt, 24, a, nv);
    decode_logits(c, prompt, 24, b, nv); /* 24 tokens >= 2 x 8 experts / top-2: a promotion follows */
    assert_memory_equal(a, b, sizeof(float) * (size_t)nv);
    tern_hot_experts h;
    tern_ctx_hot_experts(c, &h);
    assert_true(h.n_hot > 0);
    assert_int_equal(h.rows, 24 * 2 * 2); /* tokens x top-2 x layers */
    assert_int_equal(h.rows_hot, 0);      /* promoted after this batch */
    for (int step = 0; step < 40; step++) { /* decode through hot experts (more rounds promote more) */
        tern_token t = (tern_token)((step * 101 + 7) % nv);
        decode_logits(cr, &t, 1, a, nv);
        decode_logits(c, &t, 1, b, nv);
        assert_memory_equal(a, b, sizeof(float) * (size_t)nv);
    }
    tern_ctx_hot_experts(c, &h);
    assert_int_equal(h.rows, 64 * 2 * 2);
    assert_true(h.rows_hot > 0 && h.rows_hot <= h.rows);
    check_bytes(m, ref);
    free(a), free(b);
    tern_ctx_free(c), tern_ctx_free(cr);
    tern_model_free(m), tern_model_free(ref);
}

/* Without hot experts a small model's q4_0 / q8_0 experts are interleaved at load (moved out of the
 * mapping, same byte count) where the CPU has the kernels for that layout; with them they stay in
 * the file's layout. */
static void test_experts_repacked(void **state) {
    (void)state;
    unsetenv("TERN_REPACK_EXPERTS");
    tern_model *m = load(0), *h = load(1u << 20);
    setenv("TERN_REPACK_EXPERTS", "0", 1);
    for (int il = 0; il < m->hp.n_layer; il++)
        for (int j = 0; j < 3; j++) {
            const tn_tensor *w = &m->layers[il].w[k_roles[j]], *wh = &h->layers[il].w[k_roles[j]];
            const tn_dtype it = tn_repack_type_of(wh->type);
            assert_int_not_equal(it, 0); /* a file type with an interleaved layout */
            if (tn_kern()->slot[it].gemm_isa < TN_ISA_AVX512) { /* no kernel for it here: nothing moves */
                assert_int_equal(w->type, wh->type);
                continue;
            }
            assert_int_equal(tn_repack_file_type(w->type), wh->type);
            assert_int_equal(w->nbytes, wh->nbytes);
            assert_ptr_not_equal(w->data, wh->data);
        }
    tern_model_free(m);
    tern_model_free(h);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s moe-model.gguf\n", argv[0]);
        return 2;
    }
    g_path = argv[1];
    /* the models without hot experts keep theirs in the file mapping too (a small model's experts
     * are otherwise interleaved at load, tn_model_repack): the same bytes through the same kernels */
    setenv("TERN_REPACK_EXPERTS", "0", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_experts_repacked),
        cmocka_unit_test(test_choice_and_bytes),
        cmocka_unit_test(test_logits_equal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
