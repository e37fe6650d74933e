/*
 * test_quant_iq_quantize.c — the quantizers to the codebook i-quants (quant_iqgrid.c,
 * quant_iq1.c) and their search tables (iq_map.c), checked without llama.cpp (byte identity with
 * ggml is test_quant_iq_ggml.c and quantize_iq_peer):
 *   - the map inverts the grid: every entry of the format's codebook (iq_grid.h), read here as
 *     levels by ranking its distinct values, maps back to its own index, and no other key maps to
 *     an entry;
 *   - the neighbour lists, recomputed by brute force over the whole grid: each list is sorted by
 *     (squared distance, index), holds every entry closer than or as close as its farthest one,
 *     starts at the true minimum and spans exactly ggml's number of distinct distances (2 for
 *     iq2_xxs / iq2_xs / iq3_xxs, 1 for iq2_s, 3 for iq1_* / iq3_s: ggml-quants.c's nwant);
 *   - the round trip on random rows with random importance: per group of 8 (iq3: 4), the
 *     weighted error of the dequantized output is no better than the best of all grid entries
 *     at the block's own decoded scale and with free signs (a lower bound — a check of the
 *     decode), and in total within a fixed factor of that brute force; the whole row's error is
 *     well below that of writing zeros;
 *   - importance is required where ggml requires it (iq2_xxs, iq2_xs, iq1_s): refused without;
 *     an all-zero row gives all-zero values; the tables are built once under concurrent first use.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/base.h"
#include "quant/iq_grid.h"
#include "quant/quant.h"
#include "quant_data.h"

static const struct {
    tn_dtype t;
    int nwant; /* ggml's neighbour distances per list */
    double ratio; /* total error at most this many times the brute force's */
} types[] = {
    {TN_IQ2_XXS, 2, 2.0}, {TN_IQ2_XS, 2, 2.0}, {TN_IQ2_S, 1, 2.0}, {TN_IQ3_XXS, 2, 2.0},
    {TN_IQ3_S, 3, 2.0},   {TN_IQ1_S, 3, 2.0},  {TN_IQ1_M, 3, 2.0},
};

/* Entry e of type t's codebook as the format stores it: dim values. */
static int entry(tn_dtype t, int e, int j) {
    switch (t) {
    case TN_IQ2_XXS: return tn_iq_gbyte(tn_iq2xxs_grid[e], j);
    case TN_IQ2_XS: return tn_iq_gbyte(tn_iq2xs_grid[e], j);
    case TN_IQ2_S: return tn_iq_gbyte(tn_iq2s_grid[e], j);
    case TN_IQ3_XXS: return tn_iq_gbyte(tn_iq3xxs_grid[e], j);
    case TN_IQ3_S: return tn_iq_gbyte(tn_iq3s_grid[e], j);
    default: return tn_iq_gsbyte(tn_iq1s_grid[e], j);
    }
}

/* Rank of value v among the distinct values of the codebook (its level). */
static int rank_of(tn_dtype t, const tn_iq_map *m, int v) {
    int r = 0;
    bool seen[512] = {false};
    for (int e = 0; e < m->grid_size; e++)
        for (int j = 0; j < m->dim; j++) {
            const int u = entry(t, e, j);
            if (u < v && !seen[u + 256]) seen[u + 256] = true, r++;
        }
    return r;
}

static void test_map_inverts_grid(void **state) {
    (void)state;
    for (size_t i = 0; i < TN_ARRAY_LEN(types); i++) {
        const tn_dtype t = types[i].t;
        const tn_iq_map *m = tn_iq_map_get(t);
        assert_non_null(m);
        int lev[512];
        for (int v = -256; v < 256; v++) lev[v + 256] = rank_of(t, m, v);
        for (int e = 0; e < m->grid_size; e++) {
            int key = 0;
            for (int j = 0; j < m->dim; j++) {
                const int l = lev[entry(t, e, j) + 256];
                assert_int_equal(m->grid[e * m->dim + j], 2 * l + 1);
                key |= l << (m->bits * j);
            }
            assert_true(key < m->map_size);
            assert_int_equal(m->map[key], e);
        }
        int on = 0;
        for (int k = 0; k < m->map_size; k++) on += m->map[k] >= 0;
        assert_int_equal(on, m->grid_size);
    }
}

static void test_neighbours_brute_force(void **state) {
    (void)state;
    for (size_t i = 0; i < TN_ARRAY_LEN(types); i++) {
        const tn_iq_map *m = tn_iq_map_get(types[i].t);
        assert_non_null(m);
        int *d2 = malloc(sizeof(int) * (size_t)m->grid_size);
        const int step = m->map_size > 5000 ? 7 : 1; /* every 7th key of the 2-bit maps */
        for (int key = 0; key < m->map_size; key += step) {
            if (m->map[key] >= 0) continue;
            const uint16_t *nb = m->neighbours - m->map[key] - 1;
            int pos[8], dmin = 1 << 30;
            for (int j = 0; j < m->dim; j++) pos[j] = 2 * (key >> (m->bits * j) & ((1 << m->bits) - 1)) + 1;
            for (int e = 0; e < m->grid_size; e++) {
                int d = 0;
                for (int j = 0; j < m->dim; j++) d += (m->grid[e * m->dim + j] - pos[j]) * (m->grid[e * m->dim + j] - pos[j]);
                d2[e] = d;
                if (d < dmin) dmin = d;
            }
            assert_true(nb[0] > 0);
            assert_int_equal(d2[nb[1]], dmin);
            int ndist = 1;
            for (int j = 2; j <= nb[0]; j++) {
                const int a = d2[nb[j - 1]], b = d2[nb[j]];
                assert_true(a < b || (a == b && nb[j - 1] < nb[j]));
                ndist += a < b;
            }
            assert_int_equal(ndist, types[i].nwant);
            int within = 0;
            for (int e = 0; e < m->grid_size; e++) within += d2[e] <= d2[nb[nb[0]]];
            assert_int_equal(within, nb[0]);
        }
        free(d2);
    }
}

enum { ROWS = 8, NPR = 1024 };

static void test_roundtrip_bound(void **state) {
    (void)state;
    float *x = malloc(sizeof(float) * ROWS * NPR), *y = malloc(sizeof(float) * ROWS * NPR), *imat = malloc(sizeof(float) * NPR);
    uint8_t *q = malloc(ROWS * NPR);
    for (size_t i = 0; i < TN_ARRAY_LEN(types); i++) {
        const tn_dtype t = types[i].t;
        const tn_iq_map *m = tn_iq_map_get(t);
        const size_t rb = tn_dtype_row_size(t, NPR);
        const bool iq1 = t == TN_IQ1_S || t == TN_IQ1_M;
        tq_fill(0, 100 + i, x, ROWS * NPR);
        tq_fill(1, 200 + i, imat, NPR);
        for (int j = 0; j < NPR; j++) imat[j] = imat[j] * imat[j] + 1e-3f;
        for (int r = 0; r < ROWS; r++) assert_true(tn_quantize_row_imat(t, x + r * NPR, q + r * rb, NPR, imat));
        assert_true(tn_dequantize_row(t, q, y, ROWS * NPR));
        double eq = 0, ebf = 0, ez = 0;
        for (int g = 0; g < ROWS * NPR / m->dim; g++) {
            const float *xg = x + g * m->dim, *yg = y + g * m->dim;
            const float *w = imat + (g * m->dim) % NPR;
            /* the group's decoded scale and, for iq1, its shift (from one element: y = db (q + delta)) */
            tn_iq_sub o;
            const int e0 = g * m->dim, blk = e0 / QK_K, in_blk = e0 % QK_K;
            const uint8_t *b = q + (size_t)(blk / (NPR / QK_K)) * rb + (size_t)(blk % (NPR / QK_K)) * tn_dtype_get(t)->type_size;
            tn_iq_sub_decode(t, b, in_blk / 32, &o);
            const int qv = o.q[in_blk % 32];
            const double delta = iq1 ? (o.delta[(in_blk % 32) / 8] < 0 ? -TN_IQ1_DELTA : TN_IQ1_DELTA) : 0;
            const double db = (double)yg[0] / (qv + delta);
            double e_own = 0, e_zero = 0, best = INFINITY;
            for (int j = 0; j < m->dim; j++) {
                e_own += w[j] * ((double)xg[j] - yg[j]) * ((double)xg[j] - yg[j]);
                e_zero += w[j] * (double)xg[j] * xg[j];
            }
            for (int e = 0; e < m->grid_size; e++) {
                double err = 0;
                for (int j = 0; j < m->dim; j++) {
                    const double v = iq1 ? db * (entry(t, e, j) + delta) : db * entry(t, e, j) * (xg[j] < 0 ? -1 : 1);
                    err += w[j] * ((double)xg[j] - v) * ((double)xg[j] - v);
                }
                if (err < best) best = err;
            }
            if (!isfinite(db)) best = e_own; /* a zero scale: nothing to compare */
            if (e_own < best * (1 - 1e-5) - 1e-30)
                fail_msg("%s: group %d beats the brute force at its own scale (%.9g < %.9g)", tn_dtype_name(t), g, e_own, best);
            eq += e_own, ebf += best, ez += e_zero;
        }
        printf("%-8s weighted error %.4g, brute force at the same scales %.4g (x%.3f), zeros %.4g (x%.3f)\n", tn_dtype_name(t),
               eq, ebf, eq / ebf, ez, eq / ez);
        if (!(eq <= types[i].ratio * ebf)) fail_msg("%s: error %.6g above %.1fx the brute force's %.6g", tn_dtype_name(t), eq, types[i].ratio, ebf);
        if (!(eq <= 0.5 * ez)) fail_msg("%s: error %.6g not below half of the zero output's %.6g", tn_dtype_name(t), eq, ez);
    }
    free(x), free(y), free(imat), free(q);
}

static void test_refusals_and_zeros(void **state) {
    (void)state;
    float x[QK_K] = {0}, y[QK_K], imat[QK_K];
    uint8_t q[QK_K];
    for (int j = 0; j < QK_K; j++) imat[j] = 1;
    for (size_t i = 0; i < TN_ARRAY_LEN(types); i++) {
        const tn_dtype t = types[i].t;
        const bool needs = t == TN_IQ2_XXS || t == TN_IQ2_XS || t == TN_IQ1_S;
        memset(q, 0x55, sizeof q);
        assert_int_equal(tn_quantize_row_imat(t, x, q, QK_K, NULL), !needs);
        if (needs) assert_int_equal(q[0], 0x55); /* untouched */
        assert_true(tn_quantize_row_imat(t, x, q, QK_K, imat));
        assert_true(tn_dequantize_row(t, q, y, QK_K));
        for (int j = 0; j < QK_K; j++) assert_true(y[j] == 0);
        assert_false(tn_quantize_row_imat(t, x, q, QK_K / 2, imat)); /* not whole blocks */
    }
    assert_null(tn_iq_map_get(TN_Q4_0));
}

static void *get_map(void *arg) { return (void *)tn_iq_map_get(*(const tn_dtype *)arg); }

static void test_concurrent_first_use(void **state) {
    (void)state;
    /* iq2_xs may already be built by an earlier test; iq1 is the slowest build, so both threads
     * race for it unless an earlier test ran first — the pointers must agree either way */
    const tn_dtype t = TN_IQ1_M;
    pthread_t th[4];
    void *got[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, get_map, (void *)&t), 0);
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_join(th[i], &got[i]), 0);
    for (int i = 0; i < 4; i++) assert_ptr_equal(got[i], tn_iq_map_get(TN_IQ1_S));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_first_use), cmocka_unit_test(test_map_inverts_grid),
        cmocka_unit_test(test_neighbours_brute_force), cmocka_unit_test(test_roundtrip_bound),
        cmocka_unit_test(test_refusals_and_zeros),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
