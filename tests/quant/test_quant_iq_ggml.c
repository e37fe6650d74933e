/*
 * test_quant_iq_ggml.c — tern's iq4_nl, iq4_xs, mxfp4, tq1_0, tq2_0 against ggml's own functions,
 * loaded at run time from a llama.cpp build made outside this repo ($TERN_LLAMA_BIN with
 * libggml-base.so and libggml-cpu.so; exit 77 = skipped, saying why, without it):
 *   - dequantize_row_<t> on random blocks: bit-identical floats;
 *   - quantize_row_<t>_ref and ggml_quantize_chunk (the file quantizer, with and without
 *     importance weights) on random rows with mixed scales and zero blocks: identical bytes;
 *   - ggml_vec_dot_<t>_<a>_generic against tern's scalar reference on the same bytes: equal up to
 *     one float rounding per block (nb * 2^-23 * sum |w x|) — the same exact integer block sums and
 *     scale products, but a llama.cpp built for this CPU contracts ggml's sumf += d * sumi into an
 *     FMA, which tern's baseline reference does not (without FMA the two are bit-identical:
 *     tests/quant/ggml_golden_gen.c builds ggml's code that way).
 * The codebook i-quants (iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m): on random bytes
 * with finite scales, dequantize_row_<t> bit-identical and vec_dot within the same tolerance;
 * ggml_quantize_chunk (what llama-quantize writes) on every tq_fill pattern (mixed scales, zero,
 * constant and spiky blocks), with importance weights and — for the types ggml allows it —
 * without, against tn_quantize_row_imat: identical bytes.
 * Nothing from llama.cpp is linked or committed; the symbols are looked up by name.
 */
#include <dlfcn.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kern/kern.h"
#include "quant/quant.h"
#include "quant_data.h"

typedef void (*g_deq)(const void *, float *, int64_t);
typedef void (*g_qref)(const float *, void *, int64_t);
typedef size_t (*g_chunk)(int type, const float *src, void *dst, int64_t start, int64_t nrows, int64_t n_per_row,
                          const float *imatrix);
typedef void (*g_dot)(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);

static void *base, *cpu;

static void *sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) fail_msg("symbol %s not found in the llama.cpp build", name);
    return p;
}

static const struct {
    tn_dtype t;
    const char *name;
    const char *dot; /* ggml's generic vec_dot */
} types[] = {
    {TN_IQ4_NL, "iq4_nl", "ggml_vec_dot_iq4_nl_q8_0_generic"}, {TN_IQ4_XS, "iq4_xs", "ggml_vec_dot_iq4_xs_q8_K_generic"},
    {TN_MXFP4, "mxfp4", "ggml_vec_dot_mxfp4_q8_0_generic"},    {TN_TQ1_0, "tq1_0", "ggml_vec_dot_tq1_0_q8_K_generic"},
    {TN_TQ2_0, "tq2_0", "ggml_vec_dot_tq2_0_q8_K_generic"},
};

enum { ROWS = 6, NPR = 1024 };

static void test_against_ggml(void **state) {
    (void)state;
    const tn_kern_table *kt = tn_kern_at(TN_ISA_SCALAR);
    float *x = malloc(ROWS * NPR * sizeof(float)), *yt = malloc(ROWS * NPR * sizeof(float)),
          *yg = malloc(ROWS * NPR * sizeof(float)), *imat = malloc(NPR * sizeof(float));
    uint8_t *qt = malloc(ROWS * NPR * 2), *qg = malloc(ROWS * NPR * 2), *act = malloc(ROWS * NPR * 2);
    g_chunk chunk = (g_chunk)sym(base, "ggml_quantize_chunk");
    for (size_t i = 0; i < TN_ARRAY_LEN(types); i++) {
        const tn_dtype t = types[i].t;
        const size_t rb = tn_dtype_row_size(t, NPR), tot = ROWS * rb;
        char name[64];
        for (int p = 0; p < TQ_N_PATTERNS; p++) {
            tq_fill(p, 40 + (uint64_t)i, x, ROWS * NPR);
            tq_fill(1, 50 + (uint64_t)p, imat, NPR);
            for (int j = 0; j < NPR; j++) imat[j] = imat[j] * imat[j] + 1e-3f;
            /* the _ref quantizer */
            snprintf(name, sizeof name, "quantize_row_%s_ref", types[i].name);
            memset(qt, 0, tot), memset(qg, 0, tot);
            ((g_qref)sym(base, name))(x, qg, ROWS * NPR);
            assert_true(tn_quantize_row_ref(t, x, qt, ROWS * NPR));
            /* ggml's quantize_row_iq4_nl_ref leaves the codes of an all-zero first block as
             * uninitialized stack bytes (later zero blocks repeat the previous block's codes, as
             * tern's do); with scale 0 they carry no value, so such blocks compare as equal */
            if (t == TN_IQ4_NL)
                for (size_t b = 0; b < tot / sizeof(block_iq4_nl); b++) {
                    block_iq4_nl *bt = (block_iq4_nl *)qt + b, *bg = (block_iq4_nl *)qg + b;
                    if (bt->d == 0 && bg->d == 0) memcpy(bg->qs, bt->qs, sizeof bt->qs);
                }
            if (memcmp(qt, qg, tot)) {
                size_t at = 0;
                while (qt[at] == qg[at]) at++;
                fail_msg("%s: quantize_row_ref bytes differ (pattern %d) at byte %zu (block %zu)", types[i].name, p, at, at / tn_dtype_get(t)->type_size);
            }
            /* the file quantizer, plain and with importance weights (only iq4 uses them) */
            for (int w = 0; w < 2; w++) {
                memset(qt, 0, tot), memset(qg, 0, tot);
                assert_int_equal(chunk((int)t, x, qg, 0, ROWS, NPR, w ? imat : NULL), tot);
                for (int r = 0; r < ROWS; r++) assert_true(tn_quantize_row_imat(t, x + r * NPR, qt + r * rb, NPR, w ? imat : NULL));
                if (memcmp(qt, qg, tot)) fail_msg("%s: file quantizer bytes differ (pattern %d, imatrix %d)", types[i].name, p, w);
            }
            /* dequantize: random bytes with finite scales */
            for (size_t b = 0; b < tot; b++) qg[b] = (uint8_t)(b * 2654435761u >> 13) ^ (uint8_t)p;
            const tn_dtype_traits *tr = tn_dtype_get(t);
            for (size_t b = 0; b < tot / tr->type_size; b++) {
                uint8_t *blk = qg + b * tr->type_size;
                if (t == TN_MXFP4) blk[0] = (uint8_t)(b < 2 ? b : 100 + b % 50);
                else {
                    const tn_fp16 h = tn_fp32_to_fp16(0.01f * (float)((int)(b % 17) - 8));
                    memcpy(blk + (t == TN_IQ4_NL || t == TN_IQ4_XS ? 0 : tr->type_size - 2), &h, 2);
                }
            }
            snprintf(name, sizeof name, "dequantize_row_%s", types[i].name);
            ((g_deq)sym(base, name))(qg, yg, ROWS * NPR);
            assert_true(tn_dequantize_row(t, qg, yt, ROWS * NPR));
            if (memcmp(yt, yg, ROWS * NPR * sizeof(float))) fail_msg("%s: dequantized floats differ (pattern %d)", types[i].name, p);
            /* vec_dot on those weights and tern-quantized activations: identical floats */
            const tn_dtype at = tr->vec_dot_type;
            const size_t arb = tn_dtype_row_size(at, NPR);
            tq_fill(0, 60 + (uint64_t)p, x, ROWS * NPR);
            for (int r = 0; r < ROWS; r++) kt->slot[at].from_float(x + r * NPR, act + r * arb, NPR);
            assert_true(tn_dequantize_row(at, act, x, ROWS * NPR));
            for (int r = 0; r < ROWS; r++) {
                float st = NAN, sg = NAN;
                kt->slot[t].vec_dot(NPR, &st, qg + r * rb, act + r * arb);
                ((g_dot)sym(cpu, types[i].dot))(NPR, &sg, 0, qg + r * rb, 0, act + r * arb, 0, 1);
                double mag = 0;
                for (int j = 0; j < NPR; j++) mag += fabs((double)yt[r * NPR + j] * x[r * NPR + j]);
                const double tol = (double)(NPR / tr->blck_size) * 0x1p-23 * mag + 1e-30;
                if (!(fabs((double)st - sg) <= tol))
                    fail_msg("%s: vec_dot row %d: tern %.9g ggml %.9g (tol %.3g)", types[i].name, r, st, sg, tol);
            }
        }
    }
    free(x), free(yt), free(yg), free(imat), free(qt), free(qg), free(act);
}

static const struct {
    tn_dtype t;
    const char *name;
} grid_types[] = {{TN_IQ2_XXS, "iq2_xxs"}, {TN_IQ2_XS, "iq2_xs"}, {TN_IQ2_S, "iq2_s"}, {TN_IQ3_XXS, "iq3_xxs"},
                  {TN_IQ3_S, "iq3_s"},     {TN_IQ1_S, "iq1_s"},   {TN_IQ1_M, "iq1_m"}};

/* Random blocks of a codebook type: every byte random, then a finite fp16 scale (iq1_m: spread
 * over the top nibbles of its four scale words). */
static void grid_random_blocks(tn_dtype t, uint8_t *q, size_t nblk, uint64_t seed) {
    const size_t bs = tn_dtype_get(t)->type_size;
    for (size_t b = 0; b < nblk * bs; b++) q[b] = (uint8_t)((b + seed) * 2654435761u >> 13) ^ (uint8_t)(seed * 131);
    for (size_t b = 0; b < nblk; b++) {
        uint8_t *blk = q + b * bs;
        const tn_fp16 h = tn_fp32_to_fp16(0.01f * (float)((int)((b + seed) % 17) - 8));
        if (t == TN_IQ1_M) {
            block_iq1_m *m = (block_iq1_m *)blk;
            for (int w = 0; w < 4; w++) {
                uint16_t sc;
                memcpy(&sc, m->scales + 2 * w, 2);
                sc = (uint16_t)((sc & 0x0fff) | ((h >> 4 * w) & 15) << 12);
                memcpy(m->scales + 2 * w, &sc, 2);
            }
            assert_int_equal(tn_iq1_m_scale(m), h);
        } else {
            memcpy(blk, &h, 2);
        }
    }
}

static void test_grid_against_ggml(void **state) {
    (void)state;
    const tn_kern_table *kt = tn_kern_at(TN_ISA_SCALAR);
    float *x = malloc(ROWS * NPR * sizeof(float)), *yt = malloc(ROWS * NPR * sizeof(float)),
          *yg = malloc(ROWS * NPR * sizeof(float));
    uint8_t *q = malloc(ROWS * NPR), *act = malloc(ROWS * NPR * 2);
    for (size_t i = 0; i < TN_ARRAY_LEN(grid_types); i++) {
        const tn_dtype t = grid_types[i].t;
        const size_t rb = tn_dtype_row_size(t, NPR);
        char name[64];
        for (uint64_t p = 0; p < 4; p++) {
            grid_random_blocks(t, q, ROWS * NPR / QK_K, 7 * p + i);
            snprintf(name, sizeof name, "dequantize_row_%s", grid_types[i].name);
            ((g_deq)sym(base, name))(q, yg, ROWS * NPR);
            assert_true(tn_dequantize_row(t, q, yt, ROWS * NPR));
            for (int j = 0; j < ROWS * NPR; j++)
                if (memcmp(&yt[j], &yg[j], sizeof(float)))
                    fail_msg("%s: dequantized element %d differs: tern %.9g ggml %.9g", grid_types[i].name, j, yt[j], yg[j]);
            const size_t arb = tn_dtype_row_size(TN_Q8_K, NPR);
            tq_fill(0, 70 + p, x, ROWS * NPR);
            for (int r = 0; r < ROWS; r++) kt->slot[TN_Q8_K].from_float(x + r * NPR, act + r * arb, NPR);
            assert_true(tn_dequantize_row(TN_Q8_K, act, x, ROWS * NPR));
            snprintf(name, sizeof name, "ggml_vec_dot_%s_q8_K_generic", grid_types[i].name);
            for (int r = 0; r < ROWS; r++) {
                float st = NAN, sg = NAN;
                kt->slot[t].vec_dot(NPR, &st, q + r * rb, act + r * arb);
                ((g_dot)sym(cpu, name))(NPR, &sg, 0, q + r * rb, 0, act + r * arb, 0, 1);
                double mag = 0;
                for (int j = 0; j < NPR; j++) mag += fabs((double)yt[r * NPR + j] * x[r * NPR + j]);
                const double tol = (double)(NPR / QK_K) * 0x1p-23 * mag + 1e-30;
                if (!(fabs((double)st - sg) <= tol))
                    fail_msg("%s: vec_dot row %d: tern %.9g ggml %.9g (tol %.3g)", grid_types[i].name, r, st, sg, tol);
            }
        }
    }
    free(x), free(yt), free(yg), free(q), free(act);
}

static void test_grid_quantize_against_ggml(void **state) {
    (void)state;
    float *x = malloc(ROWS * NPR * sizeof(float)), *imat = malloc(NPR * sizeof(float));
    uint8_t *qt = malloc(ROWS * NPR), *qg = malloc(ROWS * NPR);
    g_chunk chunk = (g_chunk)sym(base, "ggml_quantize_chunk");
    for (size_t i = 0; i < TN_ARRAY_LEN(grid_types); i++) {
        const tn_dtype t = grid_types[i].t;
        const size_t rb = tn_dtype_row_size(t, NPR), tot = ROWS * rb;
        for (int p = 0; p < TQ_N_PATTERNS; p++) {
            tq_fill(p, 80 + (uint64_t)i, x, ROWS * NPR);
            tq_fill(1, 90 + (uint64_t)p, imat, NPR);
            for (int j = 0; j < NPR; j++) imat[j] = imat[j] * imat[j] + 1e-3f;
            for (int w = 1; w >= 0; w--) {
                if (!w && tn_iq_needs_weights(t)) { /* ggml asserts; tern refuses */
                    assert_false(tn_quantize_row_imat(t, x, qt, NPR, NULL));
                    continue;
                }
                memset(qt, 0xA5, tot), memset(qg, 0x5A, tot);
                assert_int_equal(chunk((int)t, x, qg, 0, ROWS, NPR, w ? imat : NULL), tot);
                for (int r = 0; r < ROWS; r++) assert_true(tn_quantize_row_imat(t, x + r * NPR, qt + r * rb, NPR, w ? imat : NULL));
                if (memcmp(qt, qg, tot)) {
                    size_t at = 0;
                    while (qt[at] == qg[at]) at++;
                    fail_msg("%s: quantized bytes differ (pattern %d, imatrix %d) at byte %zu (block %zu): tern %02x ggml %02x",
                             grid_types[i].name, p, w, at, at / tn_dtype_get(t)->type_size, qt[at], qg[at]);
                }
            }
        }
    }
    free(x), free(imat), free(qt), free(qg);
}

int main(void) {
    const char *dir = getenv("TERN_LLAMA_BIN");
    char path[4096];
    if (!dir || !*dir) {
        printf("skipped: TERN_LLAMA_BIN (a llama.cpp build's bin/ folder) is not set\n");
        return 77;
    }
    snprintf(path, sizeof path, "%s/libggml-base.so", dir);
    base = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    snprintf(path, sizeof path, "%s/libggml-cpu.so", dir);
    cpu = base ? dlopen(path, RTLD_NOW) : NULL;
    if (!base || !cpu) {
        printf("skipped: cannot load ggml from %s (%s)\n", dir, dlerror());
        return 77;
    }
    /* fills ggml-cpu's fp16 conversion table, which its generic dot products read */
    ((void (*)(void))sym(cpu, "ggml_cpu_init"))();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_ggml), cmocka_unit_test(test_grid_against_ggml),
                                       cmocka_unit_test(test_grid_quantize_against_ggml)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
