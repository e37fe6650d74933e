/*
 * test_dist.c — the pieces of --dist that need no MPI: int8 quantization of what is exchanged
 * (dist.h) against its definition computed here (block max / 127 scales; every value within one
 * scale step of its input, rounded to one of the two neighbouring levels; unbiased: the mean over
 * many roundings converges to the input; reproducible from the seed), the rank-strided batch
 * shard (rows r, r+N, ... of the global batch), plain SGD against hand-computed updates, and the
 * backward's grads_ready hook (which gradients are final at each call); the one-byte ZO code
 * (zo.h) against hand-computed levels and clip updates, and a forward-only (zeroth-order) model:
 * no gradient or moment buffers, the same loss as the full model, gradients refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/dist.h"
#include "train/zo.h"

#define N 1000 /* 3 full blocks and a partial one */

/* --sim-link: values and delays computed by hand (1 Gbit/s = 1e9 bits/s; 8 bits per byte) */
static void test_link_parse(void **state) {
    (void)state;
    static const struct { const char *s; double rate, lat; } ok[] = {
        {"1gbit,2ms", 1e9, 2e-3}, {"100mbit", 1e8, 0.0}, {"10KBit,500us", 1e4, 5e-4},
        {"2.5Gbit,0ms", 2.5e9, 0.0}, {"1mbit,1.5ms", 1e6, 1.5e-3}, {".5gbit", 5e8, 0.0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        tn_link l = {-1, -1};
        assert_true(tn_link_parse(ok[i].s, &l));
        assert_float_equal(l.bits_per_s, ok[i].rate, ok[i].rate * 1e-12);
        assert_float_equal(l.latency_s, ok[i].lat, 1e-15);
    }
    static const char *const bad[] = {"", "gbit", "1", "1gbps", "1 gbit", "0gbit", "-1mbit", "+1mbit", "1gbit,",
                                      "1gbit,2", "1gbit,2s", "1gbit,-2ms", "1gbit,2ms,3us", "1gbit2ms", "nan",
                                      "infgbit", "1e400gbit", "1mbit,ms"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tn_link l = {7, 7};
        assert_false(tn_link_parse(bad[i], &l));
        assert_true(l.bits_per_s == 7 && l.latency_s == 7); /* untouched */
    }
    assert_false(tn_link_parse(NULL, &(tn_link){0}));
    char buf[96];
    tn_link_describe(&(tn_link){1e9, 2e-3}, buf, sizeof buf);
    assert_string_equal(buf, "1 Gbit/s + 2 ms per exchange");
    tn_link_describe(&(tn_link){1e8, 0}, buf, sizeof buf);
    assert_string_equal(buf, "100 Mbit/s, no latency");
    tn_link_describe(&(tn_link){1e4, 5e-4}, buf, sizeof buf);
    assert_string_equal(buf, "10 kbit/s + 500 us per exchange");
}

static void test_link_delay(void **state) {
    (void)state;
    const tn_link g = {1e9, 2e-3}, m = {1e8, 0}, k = {1e4, 5e-4}, off = {0, 0};
    assert_float_equal(tn_link_delay(&g, 1000000), 0.010, 1e-15);          /* 2 ms + 8e6 bits / 1e9 */
    assert_float_equal(tn_link_delay(&m, 1048576), 0.08388608, 1e-15);     /* 8388608 / 1e8 */
    assert_float_equal(tn_link_delay(&k, 0), 5e-4, 1e-15);                 /* latency only */
    assert_float_equal(tn_link_delay(&k, 1250), 1.0005, 1e-12);            /* 10000 bits / 1e4 + 0.5 ms */
    assert_true(tn_link_delay(&off, 1000000) == 0.0);
    /* dp on the tiny preset, 1 layer, vocab 340 (as dist_test.sh "bytes"): one all-reduce of
     * 4 x (n_params + 1) bytes per step; at 100 Mbit/s each step waits 8 x that / 1e8 s */
    const uint64_t P = 2 * 340 * 64 + 3 * 64 + 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 256; /* 105152 */
    assert_float_equal(tn_link_delay(&m, 4 * (P + 1)), 0.03364896, 1e-12);
    /* one exchange at a time: a second one started while the first holds the link waits for it */
    double busy = 0;
    assert_float_equal(tn_link_finish(&g, &busy, 1.0, 1000000), 1.010, 1e-12);
    assert_float_equal(busy, 1.010, 1e-12);
    assert_float_equal(tn_link_finish(&g, &busy, 1.005, 125000), 1.013, 1e-12); /* from 1.010: 2 ms + 1 ms */
    assert_float_equal(tn_link_finish(&g, &busy, 2.0, 0), 2.002, 1e-12);       /* free again: from 2.0 */
    assert_float_equal(busy, 2.002, 1e-12);
}

static void test_q8_levels(void **state) {
    (void)state;
    float x[N], sc[(N + TN_DIST_QBLOCK - 1) / TN_DIST_QBLOCK];
    int8_t q[N], q2[N];
    for (int i = 0; i < N; i++) x[i] = (float)sin(i * 0.37) * (1 + i / 300) * 1e-3f;
    x[5] = 0.0f;
    uint64_t rng = 42, rng2 = 42;
    tn_dist_q8(x, N, &rng, q, sc);
    tn_dist_q8(x, N, &rng2, q2, sc);
    assert_memory_equal(q, q2, sizeof q); /* the same seed rounds the same way */
    for (int b = 0; b * TN_DIST_QBLOCK < N; b++) {
        double amax = 0;
        for (int i = b * TN_DIST_QBLOCK; i < N && i < (b + 1) * TN_DIST_QBLOCK; i++) amax = fmax(amax, fabs(x[i]));
        assert_float_equal(sc[b], amax / 127.0, amax * 1e-6);
        for (int i = b * TN_DIST_QBLOCK; i < N && i < (b + 1) * TN_DIST_QBLOCK; i++) {
            const double v = x[i] / (amax / 127.0);
            assert_true(q[i] == (int)floor(v) || q[i] == (int)ceil(v) || fabs(v - q[i]) < 1e-4);
        }
    }
    assert_int_equal(q[5], 0);
    float acc[N] = {0};
    tn_dist_dq8_add(q, sc, N, acc);
    for (int i = 0; i < N; i++) assert_true(fabsf(acc[i] - x[i]) <= sc[i / TN_DIST_QBLOCK] * 1.0001f);
}

static void test_q8_unbiased(void **state) {
    (void)state;
    enum { M = 8, R = 4000 };
    float x[M] = {0.3f, -0.77f, 1.0f, 0.001f, -0.5f, 0.251f, -1.0f, 0.6666f}, sc[1];
    int8_t q[M];
    double mean[M] = {0};
    uint64_t rng = 7;
    for (int r = 0; r < R; r++) {
        tn_dist_q8(x, M, &rng, q, sc);
        for (int i = 0; i < M; i++) mean[i] += q[i] * (double)sc[0] / R;
    }
    /* one level is 1/127; the mean of R Bernoulli roundings is within ~4 sigma = 4 * 0.5/127/sqrt(R) */
    for (int i = 0; i < M; i++) assert_true(fabs(mean[i] - x[i]) < 4 * 0.5 / 127 / sqrt((double)R));
}

static void test_shard(void **state) {
    (void)state;
    tn_dist_opts o;
    tn_dist_opts_default(&o);
    assert_true(tn_dist_parse("diloco", &o.method));
    assert_false(tn_dist_parse("ring", &o.method));
    /* without distribution (NULL) rank 0 of 1 and the batch is left alone */
    int32_t tok[12], tgt[12];
    for (int i = 0; i < 12; i++) tok[i] = i, tgt[i] = 100 + i;
    tn_dist_shard(NULL, 6, 2, tok, tgt);
    assert_int_equal(tok[11], 11);
    assert_int_equal(tn_dist_rank(NULL), 0);
    assert_int_equal(tn_dist_size(NULL), 1);
}

static void test_sgd(void **state) {
    (void)state;
    tn_train_cfg c = {.n_vocab = 16, .n_ctx = 4, .n_embd = 8, .n_layer = 1, .n_head = 2, .n_head_kv = 1, .n_ff = 16,
                      .rms_eps = 1e-5f, .rope_base = 10000.0f};
    tn_tmodel *m;
    assert_int_equal(tn_tmodel_create(&c, 1, &m), TERN_OK);
    tn_tmodel_init_random(m, 3);
    float *p0 = malloc(m->n_params * sizeof(float));
    memcpy(p0, m->params, m->n_params * sizeof(float));
    for (size_t i = 0; i < m->n_params; i++) m->grads[i] = (float)((i % 7) - 3) * 0.01f;
    tn_adamw o;
    tn_adamw_default(&o);
    o.weight_decay = 0.1f;
    tn_sgd_step(m, &o, 0.5f, 0.25f);
    for (int t = 0; t < m->n_tensors; t++)
        for (size_t i = m->t[t].off; i < m->t[t].off + m->t[t].n; i++) {
            double p = p0[i];
            if (m->t[t].decay) p -= 0.5 * 0.1 * p;
            p -= 0.5 * 0.25 * m->grads[i];
            assert_float_equal(m->params[i], p, 1e-6 * (1 + fabs(p)));
        }
    free(p0);
    tn_tmodel_free(m);
}

/* The backward hook the dp buckets rely on (train.h grads_ready): called with n_layer-1, ..., 0,
 * then -1; at the call for layer l every gradient of layers >= l and of the head already holds
 * its final value (a snapshot taken there equals the gradient after the backward), while the
 * embedding's is still zero (so the check is not vacuous). */
#define HOOK_MAX 8
typedef struct hook_rec {
    const tn_tmodel *m;
    int n, layer[HOOK_MAX];
    float *snap[HOOK_MAX];
} hook_rec;

static void rec_hook(void *user, int l) {
    hook_rec *h = user;
    assert_true(h->n < HOOK_MAX);
    h->layer[h->n] = l;
    h->snap[h->n] = malloc(h->m->n_params * sizeof(float));
    memcpy(h->snap[h->n], h->m->grads, h->m->n_params * sizeof(float));
    h->n++;
}

static void test_grads_ready_hook(void **state) {
    (void)state;
    tn_train_cfg c = {.n_vocab = 16, .n_ctx = 4, .n_embd = 8, .n_layer = 3, .n_head = 2, .n_head_kv = 1, .n_ff = 16,
                      .rms_eps = 1e-5f, .rope_base = 10000.0f};
    tn_tmodel *m;
    assert_int_equal(tn_tmodel_create(&c, 2, &m), TERN_OK);
    tn_tmodel_init_random(m, 5);
    assert_int_equal(tn_tmodel_plan(m, 2, 4), TERN_OK);
    int32_t tok[8], tgt[8];
    for (int i = 0; i < 8; i++) tok[i] = (i * 5 + 1) % 16, tgt[i] = (i * 3 + 2) % 16;
    double loss;
    assert_int_equal(tn_tmodel_forward(m, tok, tgt, &loss), TERN_OK);
    tn_tmodel_zero_grad(m);
    hook_rec h = {.m = m};
    m->grads_ready = rec_hook;
    m->grads_ready_user = &h;
    tn_tmodel_backward(m);
    assert_int_equal(h.n, 4);
    const int head = tn_tp_head(m);
    for (int k = 0; k < 4; k++) {
        const int l = h.layer[k];
        assert_int_equal(l, 2 - k);
        for (int i = 0; i < m->n_tensors; i++) {
            const tn_tparam *t = &m->t[i];
            const int li = i == 0 ? -1 : i >= head ? c.n_layer : (i - 1) / m->per_layer;
            if (li >= l) assert_memory_equal(h.snap[k] + t->off, m->grads + t->off, t->n * sizeof(float));
        }
        if (l >= 0) /* the embedding's gradient comes last */
            for (size_t i = 0; i < m->t[0].n; i++) assert_true(h.snap[k][i] == 0.0f);
        free(h.snap[k]);
    }
    double e = 0;
    for (size_t i = 0; i < m->t[0].n; i++) e += fabs(m->grads[i]);
    assert_true(e > 0);
    tn_tmodel_free(m);
}

/* zo.h: q = clamp(floor(127 g / c + u), -127, 127), -128 for non-finite; hand-computed levels */
static void test_zo_q8(void **state) {
    (void)state;
    assert_int_equal(tn_zo_q8(0.5f, 1.0f, 0.0f), 63);    /* 63.5 down */
    assert_int_equal(tn_zo_q8(0.5f, 1.0f, 0.5f), 64);    /* 64.0 */
    assert_int_equal(tn_zo_q8(-0.5f, 1.0f, 0.49f), -64); /* -63.01 down */
    assert_int_equal(tn_zo_q8(0.25f, 2.0f, 0.0f), 15);   /* 15.875 down */
    assert_int_equal(tn_zo_q8(3.0f, 1.0f, 0.0f), 127);   /* clipped */
    assert_int_equal(tn_zo_q8(-3.0f, 1.0f, 0.9f), -127);
    assert_int_equal(tn_zo_q8(NAN, 1.0f, 0.0f), -128);
    assert_int_equal(tn_zo_q8(INFINITY, 1.0f, 0.0f), -128);
    /* unbiased inside the range: the mean of q c / 127 over u on a uniform grid is g */
    const float g = 0.3217f, c = 2.0f;
    double sum = 0;
    for (int i = 0; i < 10000; i++) sum += tn_zo_q8(g, c, (float)((i + 0.5) / 10000.0)) * (double)c / 127.0;
    assert_float_equal(sum / 10000.0, g, 1e-4);
}

/* zo.h: doubled on saturation, else 0.9 c + 0.1 max(4 rms, c / 8) (values by hand) */
static void test_zo_clip(void **state) {
    (void)state;
    const int8_t sat[3] = {0, 5, 127}, nsat[2] = {-127, 1}, zero[4] = {0}, mid[2] = {64, -64};
    assert_float_equal(tn_zo_clip_next(1.0f, sat, 3), 2.0f, 0);
    assert_float_equal(tn_zo_clip_next(0.5f, nsat, 2), 1.0f, 0);
    assert_float_equal(tn_zo_clip_next(1.0f, zero, 4), 0.9125f, 1e-7); /* 0.9 + 0.1 / 8 */
    /* rms = 64 x 2 / 127 = 1.0078740; 0.9 x 2 + 0.1 x 4 x 1.0078740 = 2.2031496 */
    assert_float_equal(tn_zo_clip_next(2.0f, mid, 2), 2.2031496f, 1e-6);
}

/* cfg.forward_only: the parameters alone are allocated, the forward gives the loss of the full
 * model bit for bit (its activations hold one layer's buffers), and gradients are refused. */
static void test_forward_only(void **state) {
    (void)state;
    tn_train_cfg c = {.n_vocab = 16, .n_ctx = 4, .n_embd = 8, .n_layer = 3, .n_head = 2, .n_head_kv = 1, .n_ff = 16,
                      .rms_eps = 1e-5f, .rope_base = 10000.0f};
    tn_tmodel *full, *fo;
    assert_int_equal(tn_tmodel_create(&c, 2, &full), TERN_OK);
    c.forward_only = true;
    assert_int_equal(tn_tmodel_create(&c, 2, &fo), TERN_OK);
    assert_null(fo->grads);
    assert_null(fo->m);
    assert_null(fo->v);
    tn_tmodel_init_random(full, 7);
    tn_tmodel_init_random(fo, 7);
    assert_int_equal(tn_tmodel_plan(full, 2, 4), TERN_OK);
    assert_int_equal(tn_tmodel_plan(fo, 2, 4), TERN_OK);
    assert_true(fo->acts_floats < full->acts_floats);
    tn_mem_plan pf, pz;
    tn_tmodel_mem_plan(full, 2, 1, 4, TN_RECOMPUTE_NONE, &pf);
    tn_tmodel_mem_plan(fo, 2, 1, 4, TN_RECOMPUTE_NONE, &pz);
    assert_int_equal(pz.grads, 0);
    assert_int_equal(pz.moments, 0);
    assert_int_equal(pz.params, full->n_params * sizeof(float));
    assert_int_equal(pf.grads + pf.moments, 3 * full->n_params * sizeof(float));
    assert_true(pz.peak < pf.peak);
    int32_t tok[8], tgt[8];
    for (int i = 0; i < 8; i++) tok[i] = (i * 5 + 1) % 16, tgt[i] = (i * 3 + 2) % 16;
    double lf, lz;
    assert_int_equal(tn_tmodel_forward(full, tok, tgt, &lf), TERN_OK);
    assert_int_equal(tn_tmodel_forward(fo, tok, tgt, &lz), TERN_OK);
    assert_true(lf == lz && lf > 0);
    assert_int_equal(tn_tmodel_grads(fo, tok, tgt, 1, &lz), TERN_ERR_STATE);
    tn_tmodel_free(full);
    tn_tmodel_free(fo);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_link_parse),
        cmocka_unit_test(test_link_delay),
        cmocka_unit_test(test_q8_levels),
        cmocka_unit_test(test_q8_unbiased),
        cmocka_unit_test(test_shard),
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_grads_ready_hook),
        cmocka_unit_test(test_zo_q8),
        cmocka_unit_test(test_zo_clip),
        cmocka_unit_test(test_forward_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
