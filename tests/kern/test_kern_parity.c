/*
 * test_kern_parity.c — every ISA kernel against the scalar reference table.
 *
 * For each ISA level the CPU can run (tn_kern_at(isa) != NULL) and each table entry that level
 * overrides (its function differs from the scalar table's):
 *   vec_dot  at k = 1 block, small, tile-equal, larger and prime multiples of the block (and
 *            odd lengths for the float types, whose block is one element);
 *   gemm     at m, n in {1, tile-equal, tile +- 1, primes} for every tile shape the kernels use
 *            (1..8 rows), with padded row strides and ldy > m; cells outside the m x n result
 *            must stay untouched;
 *   from_float  bit-identical bytes (finite inputs, ties, zero blocks, subnormals, extremes);
 *   to_float    bit-identical floats (every f16/bf16 bit pattern).
 *
 * Weight rows come from two sources: the reference quantizer on random floats (realistic
 * scales) and random bytes with the fp16 scale fields made finite (every code pattern,
 * including q8_0's -128 and q6_K's -128 scales; tq2_0's unused code 3; mxfp4's denormal
 * exponents 0 and 1; every grid index and sign of the codebook i-quants, which have only this
 * source). Activations always come from the scalar
 * from_float of the weight type's vec_dot_type, as in the engine.
 *
 * Tolerance (dot products): both sides sum the same exact terms (integer block sums times float
 * scale products, or float products) in a different order, with FMA on one side. Each
 * accumulation rounds by at most 2^-24 of a partial sum, and partial sums are bounded by
 * S = sum |x_l| * (|w_l| + |min/offset part of w_l|) (see abs_terms); over n rounding steps of random sign the error grows like sqrt(n) * 2^-24
 * * S (the n * 2^-24 * S worst case needs every rounding in the same direction). We allow
 * 8 * sqrt(n + 16) * 2^-24 * S with n = k (+16 for the reductions and scale products); bf16
 * also treats subnormal results as zero, which the test data (normal floats of moderate range)
 * never produce. A wrong element, lane or block costs about S / k or more, which is above this
 * bound for every k tested.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/fp16.h"
#include "kern/kern.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/repack.h"
#include "core/cpu.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rng_uniform(void) { return (float)((rng_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

/* Random floats with a per-32 magnitude between 2^-6 and 2^6 and occasional outliers. */
static void fill_floats(float *x, int64_t n) {
    float scale = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) scale = ldexpf(1.0f, (int)(rng_u64() % 13) - 6);
        x[i] = rng_uniform() * scale;
        if (rng_u64() % 97 == 0) x[i] *= 8.0f;
    }
}

static const tn_isa isas[] = {TN_ISA_AVX2, TN_ISA_AVX512};

/* Weight types with a vec_dot (the table's other slots are activation-only). */
static const tn_dtype wtypes[] = {TN_F32, TN_F16,  TN_BF16, TN_Q4_0, TN_Q4_1, TN_Q5_0, TN_Q5_1,
                                  TN_Q8_0, TN_Q2_K, TN_Q3_K, TN_Q4_K, TN_Q5_K, TN_Q6_K,
                                  TN_IQ4_NL, TN_IQ4_XS, TN_MXFP4, TN_TQ1_0, TN_TQ2_0,
                                  TN_IQ2_XXS, TN_IQ2_XS, TN_IQ2_S, TN_IQ3_XXS, TN_IQ3_S, TN_IQ1_S, TN_IQ1_M};

/* Byte offsets of the fp16 scale fields inside one block (-1 ends the list). */
static void fp16_fields(tn_dtype t, int off[3]) {
    off[0] = off[1] = off[2] = -1;
    switch (t) {
    case TN_Q4_0: off[0] = offsetof(block_q4_0, d); break;
    case TN_Q5_0: off[0] = offsetof(block_q5_0, d); break;
    case TN_Q8_0: off[0] = offsetof(block_q8_0, d); break;
    case TN_Q4_1: off[0] = offsetof(block_q4_1, d), off[1] = offsetof(block_q4_1, m); break;
    case TN_Q5_1: off[0] = offsetof(block_q5_1, d), off[1] = offsetof(block_q5_1, m); break;
    case TN_Q2_K: off[0] = offsetof(block_q2_K, d), off[1] = offsetof(block_q2_K, dmin); break;
    case TN_Q3_K: off[0] = offsetof(block_q3_K, d); break;
    case TN_Q4_K: off[0] = offsetof(block_q4_K, d), off[1] = offsetof(block_q4_K, dmin); break;
    case TN_Q5_K: off[0] = offsetof(block_q5_K, d), off[1] = offsetof(block_q5_K, dmin); break;
    case TN_Q6_K: off[0] = offsetof(block_q6_K, d); break;
    case TN_IQ4_NL: off[0] = offsetof(block_iq4_nl, d); break;
    case TN_IQ4_XS: off[0] = offsetof(block_iq4_xs, d); break;
    case TN_TQ1_0: off[0] = offsetof(block_tq1_0, d); break;
    case TN_TQ2_0: off[0] = offsetof(block_tq2_0, d); break;
    case TN_IQ2_XXS: case TN_IQ2_XS: case TN_IQ2_S: case TN_IQ3_XXS: case TN_IQ3_S: case TN_IQ1_S: off[0] = 0; break;
    default: break; /* iq1_m: its scale is spread over nibbles (make_weight_row) */
    }
}

/* One weight row of k elements: reference-quantized floats, or (raw) random bytes with finite
 * scales in a moderate range. */
static void make_weight_row(tn_dtype t, int64_t k, void *row, int raw) {
    const tn_dtype_traits *tr = tn_dtype_get(t);
    const size_t rb = tn_dtype_row_size(t, k);
    /* the codebook i-quants have no reference quantizer (ggml has none either): random blocks */
    if (tn_dtype_is_iq_grid(t)) raw = 1;
    if (!raw) {
        float *f = malloc((size_t)k * sizeof(float));
        fill_floats(f, k);
        assert_true(tn_quantize_row_ref(t, f, row, k));
        free(f);
        return;
    }
    uint8_t *b = row;
    for (size_t i = 0; i < rb; i++) b[i] = (uint8_t)rng_u64();
    if (t == TN_F32) {
        for (int64_t i = 0; i < k; i++) ((float *)row)[i] = rng_uniform() * 4.0f;
    } else if (t == TN_F16) {
        for (int64_t i = 0; i < k; i++) ((tn_fp16 *)row)[i] = tn_fp32_to_fp16(rng_uniform() * 4.0f);
    } else if (t == TN_BF16) {
        for (int64_t i = 0; i < k; i++) ((tn_bf16 *)row)[i] = tn_fp32_to_bf16(rng_uniform() * 4.0f);
    } else {
        int off[3];
        fp16_fields(t, off);
        for (int64_t blk = 0; blk < k / tr->blck_size; blk++)
            for (int f = 0; f < 3 && off[f] >= 0; f++) {
                const tn_fp16 h = tn_fp32_to_fp16(rng_uniform() * 0.05f);
                memcpy(b + (size_t)blk * tr->type_size + off[f], &h, 2);
            }
        /* iq1_m: the fp16 scale lives in the top nibbles of its four scale words */
        if (t == TN_IQ1_M)
            for (int64_t blk = 0; blk < k / tr->blck_size; blk++) {
                const tn_fp16 h = tn_fp32_to_fp16(rng_uniform() * 0.05f);
                uint8_t *sc = b + (size_t)blk * tr->type_size + offsetof(block_iq1_m, scales);
                for (int w = 0; w < 4; w++) sc[2 * w + 1] = (uint8_t)((sc[2 * w + 1] & 15) | ((h >> 4 * w) & 15) << 4);
            }
        /* mxfp4's e8m0 exponent: scales 2^-20 .. 2^-1 (2^-128 and 2^-127 denormals included) */
        if (t == TN_MXFP4)
            for (int64_t blk = 0; blk < k / tr->blck_size; blk++) {
                const uint8_t e = blk % 7 == 3 ? (uint8_t)(blk % 2) : (uint8_t)(108 + rng_u64() % 20);
                b[(size_t)blk * tr->type_size + offsetof(block_mxfp4, e)] = e;
            }
    }
}

/* Byte ranges of the quant codes inside one block (len 0 ends the list). */
static void code_fields(tn_dtype t, int off[2], int len[2]) {
    off[0] = off[1] = len[0] = len[1] = 0;
#define TN_F(i, B, f) (off[i] = (int)offsetof(B, f), len[i] = (int)sizeof(((B *)0)->f))
    switch (t) {
    case TN_Q4_0: TN_F(0, block_q4_0, qs); break;
    case TN_Q4_1: TN_F(0, block_q4_1, qs); break;
    case TN_Q5_0: TN_F(0, block_q5_0, qs), TN_F(1, block_q5_0, qh); break;
    case TN_Q5_1: TN_F(0, block_q5_1, qs), TN_F(1, block_q5_1, qh); break;
    case TN_Q8_0: TN_F(0, block_q8_0, qs); break;
    case TN_Q2_K: TN_F(0, block_q2_K, qs); break;
    case TN_Q3_K: TN_F(0, block_q3_K, qs), TN_F(1, block_q3_K, hmask); break;
    case TN_Q4_K: TN_F(0, block_q4_K, qs); break;
    case TN_Q5_K: TN_F(0, block_q5_K, qs), TN_F(1, block_q5_K, qh); break;
    case TN_Q6_K: TN_F(0, block_q6_K, ql), TN_F(1, block_q6_K, qh); break;
    default: break;
    }
#undef TN_F
}

/* The scale S of the rounding error: sum |x_l| * (|w_l| + |z_l|) over the dequantized rows,
 * where z is the row with every quant code zeroed, i.e. the offset or min part of each weight
 * (-8 d for q4_0, -dmin m for q4_K, m for q4_1 ...). Kernels and reference both compute the
 * code part and the min part of a block as separate terms that may cancel, so |code part| <=
 * |w| + |z| bounds every partial sum either side forms. */
static double abs_terms(tn_dtype wt, tn_dtype at, int64_t k, const void *w, const void *x) {
    const tn_dtype_traits *tr = tn_dtype_get(wt);
    const size_t rb = tn_dtype_row_size(wt, k);
    float *wf = malloc((size_t)k * sizeof(float)), *xf = malloc((size_t)k * sizeof(float));
    float *zf = calloc((size_t)k, sizeof(float));
    assert_true(tn_dequantize_row(wt, w, wf, k));
    assert_true(tn_dequantize_row(at, x, xf, k));
    int off[2], len[2];
    code_fields(wt, off, len);
    if (len[0]) {
        uint8_t *z = malloc(rb);
        memcpy(z, w, rb);
        for (int64_t b = 0; b < k / tr->blck_size; b++)
            for (int f = 0; f < 2; f++) memset(z + (size_t)b * tr->type_size + off[f], 0, (size_t)len[f]);
        assert_true(tn_dequantize_row(wt, z, zf, k));
        free(z);
    }
    double s = 0;
    for (int64_t l = 0; l < k; l++) s += fabs((double)xf[l]) * (fabs((double)wf[l]) + fabs((double)zf[l]));
    free(wf), free(xf), free(zf);
    return s;
}

static double dot_tol(int64_t k, double sabs) { return 8.0 * sqrt((double)k + 16.0) * 0x1p-24 * sabs + 1e-30; }

static int checks_dot, checks_gemm, checks_from, checks_to;

/* ---- vec_dot ---------------------------------------------------------------------------------- */

static void check_vec_dot(tn_isa isa, tn_dtype wt, int64_t k, int raw) {
    const tn_kern_table *ref = tn_kern_at(TN_ISA_SCALAR), *opt = tn_kern_at(isa);
    const tn_dtype at = tn_dtype_get(wt)->vec_dot_type;
    void *w = malloc(tn_dtype_row_size(wt, k)), *x = malloc(tn_dtype_row_size(at, k));
    float *xf = malloc((size_t)k * sizeof(float));
    make_weight_row(wt, k, w, raw);
    fill_floats(xf, k);
    ref->slot[at].from_float(xf, x, k);
    float r = 0, o = 0;
    ref->slot[wt].vec_dot(k, &r, w, x);
    opt->slot[wt].vec_dot(k, &o, w, x);
    const double tol = dot_tol(k, abs_terms(wt, at, k, w, x));
    if (!(fabs((double)r - o) <= tol))
        fail_msg("vec_dot %s %s k=%lld raw=%d: ref %.9g opt %.9g |diff| %.3g > tol %.3g", tn_isa_name(isa),
                 tn_dtype_name(wt), (long long)k, raw, r, o, fabs((double)r - o), tol);
    checks_dot++;
    free(w), free(x), free(xf);
}

static void test_vec_dot(void **state) {
    (void)state;
    /* multiples of the block: 1, 2, 3 (prime), 4 and 8 (tile-like), 7, 13, 31, 67 (primes),
     * 16, 64, 128 (a 4096-wide row of 32-blocks) */
    static const int64_t nblk[] = {1, 2, 3, 4, 7, 8, 13, 16, 31, 64, 67, 128};
    /* float types: every tail length around the 8/16/32-element steps, primes, 4096 + tails */
    static const int64_t kf[] = {1,  2,  3,  5,  7,  8,  9,  15,  16,  17,  23,  31,   32,   33,
                                 47, 63, 64, 65, 97, 127, 128, 129, 255, 256, 257, 1031, 4096, 4099};
    for (size_t a = 0; a < sizeof isas / sizeof isas[0]; a++) {
        const tn_kern_table *opt = tn_kern_at(isas[a]), *ref = tn_kern_at(TN_ISA_SCALAR);
        if (!opt) continue;
        for (size_t t = 0; t < sizeof wtypes / sizeof wtypes[0]; t++) {
            const tn_dtype wt = wtypes[t];
            if (opt->slot[wt].vec_dot == ref->slot[wt].vec_dot) continue;
            const int64_t blk = tn_dtype_get(wt)->blck_size;
            if (blk == 1) {
                for (size_t i = 0; i < sizeof kf / sizeof kf[0]; i++)
                    for (int raw = 0; raw < 2; raw++) check_vec_dot(isas[a], wt, kf[i], raw);
            } else {
                for (size_t i = 0; i < sizeof nblk / sizeof nblk[0]; i++) {
                    if (blk == QK_K && nblk[i] > 32) continue; /* 8192 is plenty for 256-blocks */
                    for (int raw = 0; raw < 2; raw++) check_vec_dot(isas[a], wt, nblk[i] * blk, raw);
                }
            }
        }
    }
}

/* ---- gemm ------------------------------------------------------------------------------------- */

static void check_gemm(tn_isa isa, tn_dtype wt, int64_t k, int64_t m, int64_t n) {
    const tn_kern_table *ref = tn_kern_at(TN_ISA_SCALAR), *opt = tn_kern_at(isa);
    const tn_dtype at = tn_dtype_get(wt)->vec_dot_type;
    const size_t wrow = tn_dtype_row_size(wt, k), xrow = tn_dtype_row_size(at, k);
    /* padded strides, 4-byte aligned (f32 and q8_K hold floats) but never vector aligned */
    const size_t w_rb = wrow + 64 + 4, x_rb = xrow + 32 + 4;
    const int64_t ldy = m + 3;
    uint8_t *w = calloc((size_t)m, w_rb), *x = calloc((size_t)n, x_rb);
    float *xf = malloc((size_t)k * sizeof(float));
    float *yr = malloc((size_t)(n * ldy) * sizeof(float)), *yo = malloc((size_t)(n * ldy) * sizeof(float));
    for (int64_t i = 0; i < m; i++) make_weight_row(wt, k, w + i * w_rb, (int)(i & 1));
    for (int64_t j = 0; j < n; j++) {
        fill_floats(xf, k);
        ref->slot[at].from_float(xf, x + j * x_rb, k);
    }
    for (int64_t c = 0; c < n * ldy; c++) yr[c] = yo[c] = -12345.0f; /* canary */
    ref->slot[wt].gemm(k, m, n, w, w_rb, x, x_rb, yr, ldy);
    opt->slot[wt].gemm(k, m, n, w, w_rb, x, x_rb, yo, ldy);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t i = 0; i < ldy; i++) {
            const float r = yr[j * ldy + i], o = yo[j * ldy + i];
            if (i >= m) {
                if (o != -12345.0f)
                    fail_msg("gemm %s %s k=%lld m=%lld n=%lld wrote outside the result at (%lld, %lld)",
                             tn_isa_name(isa), tn_dtype_name(wt), (long long)k, (long long)m, (long long)n,
                             (long long)i, (long long)j);
                continue;
            }
            const double tol = dot_tol(k, abs_terms(wt, at, k, w + i * w_rb, x + j * x_rb));
            if (!(fabs((double)r - o) <= tol))
                fail_msg("gemm %s %s k=%lld m=%lld n=%lld at (%lld, %lld): ref %.9g opt %.9g |diff| %.3g > tol %.3g",
                         tn_isa_name(isa), tn_dtype_name(wt), (long long)k, (long long)m, (long long)n, (long long)i,
                         (long long)j, r, o, fabs((double)r - o), tol);
        }
    }
    checks_gemm++;
    free(w), free(x), free(xf), free(yr), free(yo);
}

static void test_gemm(void **state) {
    (void)state;
    /* 1, the tile sizes in use (rows 1, 2, 4, 8; activation rows 1, 3, 4, 6), tile +- 1, two
     * tiles, primes */
    static const int64_t ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17};
    static const int64_t ns[] = {1, 2, 3, 4, 5, 6, 7, 11, 13};
    for (size_t a = 0; a < sizeof isas / sizeof isas[0]; a++) {
        const tn_kern_table *opt = tn_kern_at(isas[a]), *ref = tn_kern_at(TN_ISA_SCALAR);
        if (!opt) continue;
        for (size_t t = 0; t < sizeof wtypes / sizeof wtypes[0]; t++) {
            const tn_dtype wt = wtypes[t];
            if (opt->slot[wt].gemm == ref->slot[wt].gemm) continue;
            const int64_t blk = tn_dtype_get(wt)->blck_size;
            /* k: one block, and a prime number of blocks (floats: a tail-heavy prime, a step multiple) */
            const int64_t ks[2] = {blk == 1 ? 37 : blk, blk == 1 ? 256 : 5 * blk};
            for (int kk = 0; kk < 2; kk++)
                for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
                    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                        check_gemm(isas[a], wt, ks[kk], ms[mi], ns[ni]);
            /* one larger case with chunking over many activation rows */
            check_gemm(isas[a], wt, blk == 1 ? 1024 : 4 * blk, 17, 37);
        }
    }
}

/* ---- from_float ------------------------------------------------------------------------------- */

static const tn_dtype acttypes[] = {TN_Q8_0, TN_Q8_1, TN_Q8_K, TN_F16, TN_BF16};

/* Inputs that stress rounding: random, exact ties after scaling, zero blocks, negative and
 * positive extremes first, subnormals, large values. */
static void fill_act_case(int c, float *x, int64_t k) {
    switch (c) {
    case 0: fill_floats(x, k); break;
    case 1: /* amax 127 -> d = 1: x = n + 0.5 are exact ties for roundf and nearest-even */
        for (int64_t i = 0; i < k; i++) x[i] = (float)((int)(rng_u64() % 254) - 127) + ((i & 1) ? 0.5f : 0.0f);
        for (int64_t i = 0; i < k; i += 32) x[i] = (i / 32) & 1 ? 127.0f : -127.0f;
        break;
    case 2: /* zero blocks between random ones */
        fill_floats(x, k);
        for (int64_t i = 0; i < k; i++)
            if ((i / 256) % 2 == 0 || (i / 32) % 3 == 0) x[i] = 0.0f;
        break;
    case 3: /* equal magnitudes of both signs: the first one wins in q8_K */
        fill_floats(x, k);
        for (int64_t i = 0; i < k; i += 16) x[i] = (i / 16) & 1 ? 3.0f : -3.0f;
        break;
    case 4: /* subnormal and tiny values (f16/bf16 subnormal outputs) */
        for (int64_t i = 0; i < k; i++) x[i] = rng_uniform() * ldexpf(1.0f, -(int)(rng_u64() % 140));
        break;
    default: /* large: f16 overflow to inf, bf16 rounding near FLT_MAX */
        for (int64_t i = 0; i < k; i++) x[i] = rng_uniform() * ldexpf(1.0f, (int)(rng_u64() % 128));
        break;
    }
}

static void test_from_float(void **state) {
    (void)state;
    for (size_t a = 0; a < sizeof isas / sizeof isas[0]; a++) {
        const tn_kern_table *opt = tn_kern_at(isas[a]), *ref = tn_kern_at(TN_ISA_SCALAR);
        if (!opt) continue;
        for (size_t t = 0; t < sizeof acttypes / sizeof acttypes[0]; t++) {
            const tn_dtype at = acttypes[t];
            if (opt->slot[at].from_float == ref->slot[at].from_float) continue;
            const int64_t blk = tn_dtype_get(at)->blck_size;
            /* blocks: 1, 2, 3, 7, 16, 17; float types: every length 1..40 (vector tails) and more */
            int64_t ks[64];
            int nk = 0;
            if (blk > 1) {
                static const int64_t nblk[] = {1, 2, 3, 7, 16, 17};
                for (size_t i = 0; i < sizeof nblk / sizeof nblk[0]; i++) ks[nk++] = nblk[i] * blk;
            } else {
                for (int64_t l = 1; l <= 40; l++) ks[nk++] = l;
                ks[nk++] = 255, ks[nk++] = 256, ks[nk++] = 4099;
            }
            for (int c = 0; c < 6; c++) {
                if (blk > 1 && c >= 4) continue; /* q8 scales of subnormal/huge blocks overflow 1/d (UB in the reference) */
                for (int i = 0; i < nk; i++) {
                    const int64_t k = ks[i];
                    const size_t rb = tn_dtype_row_size(at, k);
                    float *x = malloc((size_t)k * sizeof(float));
                    uint8_t *yr = malloc(rb), *yo = malloc(rb);
                    fill_act_case(c, x, k);
                    memset(yr, 0xA5, rb), memset(yo, 0xA5, rb);
                    ref->slot[at].from_float(x, yr, k);
                    opt->slot[at].from_float(x, yo, k);
                    if (memcmp(yr, yo, rb) != 0) {
                        size_t p = 0;
                        while (yr[p] == yo[p]) p++;
                        fail_msg("from_float %s %s k=%lld case %d: first differing byte %zu (ref %02x opt %02x)",
                                 tn_isa_name(isas[a]), tn_dtype_name(at), (long long)k, c, p, yr[p], yo[p]);
                    }
                    checks_from++;
                    free(x), free(yr), free(yo);
                }
            }
        }
    }
}

/* ---- to_float ---------------------------------------------------------------------------------- */

static void test_to_float(void **state) {
    (void)state;
    static const tn_dtype types[] = {TN_F16, TN_BF16, TN_Q4_0, TN_Q4_1, TN_Q5_0, TN_Q5_1, TN_Q8_0,
                                     TN_Q2_K, TN_Q3_K, TN_Q4_K, TN_Q5_K, TN_Q6_K, TN_Q8_K, TN_IQ4_NL};
    for (size_t a = 0; a < sizeof isas / sizeof isas[0]; a++) {
        const tn_kern_table *opt = tn_kern_at(isas[a]), *ref = tn_kern_at(TN_ISA_SCALAR);
        if (!opt) continue;
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            const tn_dtype ty = types[t];
            if (opt->slot[ty].to_float == ref->slot[ty].to_float) continue;
            const int64_t blk = tn_dtype_get(ty)->blck_size;
            /* f16/bf16: all 65536 bit patterns (+ a tail of 5); quant types: random-byte rows */
            const int64_t k = blk == 1 ? 65536 + 5 : 67 * blk;
            const size_t rb = tn_dtype_row_size(ty, k);
            uint8_t *x = malloc(rb);
            float *yr = malloc((size_t)k * sizeof(float)), *yo = malloc((size_t)k * sizeof(float));
            if (blk == 1)
                for (int64_t i = 0; i < k; i++) ((uint16_t *)x)[i] = (uint16_t)i;
            else if (ty == TN_Q8_K) {
                float *f = malloc((size_t)k * sizeof(float));
                fill_floats(f, k);
                ref->slot[ty].from_float(f, x, k);
                free(f);
            } else
                make_weight_row(ty, k, x, 1);
            ref->slot[ty].to_float(x, yr, k);
            opt->slot[ty].to_float(x, yo, k);
            for (int64_t i = 0; i < k; i++) {
                uint32_t br, bo;
                memcpy(&br, &yr[i], 4), memcpy(&bo, &yo[i], 4);
                if (br != bo)
                    fail_msg("to_float %s %s k=%lld at %lld: ref %08x opt %08x", tn_isa_name(isas[a]),
                             tn_dtype_name(ty), (long long)k, (long long)i, br, bo);
            }
            checks_to++;
            free(x), free(yr), free(yo);
        }
    }
}

/* ---- swiglu --------------------------------------------------------------------------------- */

/* Every table's SwiGLU against the formula in double precision (independent of libm's expf and
 * of the vector exp): within 4 float ulps of the exact value, or 1e-30 absolute where the exact
 * value underflows (g < -87: silu(g) ~ g e^g). Inputs: uniform in [-20, 20], a sweep over
 * [-120, 120], +-0, and lengths 1..37 and 8195 (masked tails). */
static int checks_swiglu;
static void test_swiglu(void **state) {
    (void)state;
    for (int a = 0; a < (int)TN_ISA_COUNT; a++) {
        const tn_kern_table *t = tn_kern_at((tn_isa)a);
        if (!t || !t->swiglu) continue;
        const int64_t ns[] = {1, 2, 15, 16, 17, 31, 37, 8195};
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int64_t n = ns[ni];
            float *g = malloc((size_t)n * sizeof(float)), *u = malloc((size_t)n * sizeof(float));
            double *want = malloc((size_t)n * sizeof(double));
            for (int64_t i = 0; i < n; i++) {
                g[i] = n == 8195 ? -120.0f + 240.0f * (float)i / (float)(n - 1) : 20.0f * rng_uniform();
                if (i == 3) g[i] = 0.0f;
                if (i == 4) g[i] = -0.0f;
                u[i] = 2.0f * rng_uniform();
                want[i] = (double)g[i] / (1.0 + exp(-(double)g[i])) * (double)u[i];
            }
            t->swiglu(g, u, n);
            for (int64_t i = 0; i < n; i++) {
                const double tol = 4.0 * ldexp(fabs(want[i]), -23) + 1e-30;
                if (!(fabs((double)g[i] - want[i]) <= tol))
                    fail_msg("swiglu %s n=%lld at %lld: got %.9g want %.9g (tol %.3g)", tn_isa_name((tn_isa)a), (long long)n,
                             (long long)i, g[i], want[i], tol);
            }
            checks_swiglu++;
            free(g), free(u), free(want);
        }
    }
}

/* ---- geglu ---------------------------------------------------------------------------------- */

/* Every table's GeGLU (the reference included) against the formula in double precision:
 * g u / (1 + exp(-2y)), y = sqrt(2/pi) (g + 0.044715 g^3), which equals 0.5 g (1 + tanh(y)) u.
 * Within 8 float ulps of the exact value plus 2e-7 |g u|: the reference's 1 + tanhf(y) loses
 * digits to cancellation as tanh(y) nears -1 (absolute error ~6e-8 there), the vector versions
 * carry their exp's error times |2y|, which is large only where the result is tiny. Inputs as
 * for SwiGLU. */
static int checks_geglu;
static void test_geglu(void **state) {
    (void)state;
    for (int a = 0; a < (int)TN_ISA_COUNT; a++) {
        const tn_kern_table *t = tn_kern_at((tn_isa)a);
        if (!t || !t->geglu) continue;
        const int64_t ns[] = {1, 2, 15, 16, 17, 31, 37, 8195};
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int64_t n = ns[ni];
            float *g = malloc((size_t)n * sizeof(float)), *u = malloc((size_t)n * sizeof(float));
            double *want = malloc((size_t)n * sizeof(double)), *gu = malloc((size_t)n * sizeof(double));
            for (int64_t i = 0; i < n; i++) {
                g[i] = n == 8195 ? -120.0f + 240.0f * (float)i / (float)(n - 1) : 20.0f * rng_uniform();
                if (i == 3) g[i] = 0.0f;
                if (i == 4) g[i] = -0.0f;
                u[i] = 2.0f * rng_uniform();
                const double x = g[i], y = 0.79788456080286535588 * x * (1.0 + 0.044715 * x * x);
                want[i] = x / (1.0 + exp(-2.0 * y)) * (double)u[i];
                gu[i] = fabs(x * (double)u[i]);
            }
            t->geglu(g, u, n);
            for (int64_t i = 0; i < n; i++) {
                const double tol = 8.0 * ldexp(fabs(want[i]), -23) + 2e-7 * gu[i] + 1e-30;
                if (!(fabs((double)g[i] - want[i]) <= tol))
                    fail_msg("geglu %s n=%lld at %lld: got %.9g want %.9g (tol %.3g)", tn_isa_name((tn_isa)a), (long long)n,
                             (long long)i, g[i], want[i], tol);
            }
            checks_geglu++;
            free(g), free(u), free(want), free(gu);
        }
    }
}

/* The k-quants' batched gemm from the file layout (avx512 gemm_ktile.c: 16-row groups interleaved
 * on the fly, k in slices of 8 blocks, 64 columns per pass): against the reference at token counts
 * per expert 1 .. 70 (below and at the thresholds 5 and 12, one and two column passes), rows in
 * whole groups and with a tail, k of one slice, a slice + 1 block and 3 slices with a tail; and the
 * interleave byte for byte against quant's tn_repack_r16 on random blocks. */
static void test_gemm_ktile(void **state) {
    (void)state;
    const tn_kern_table *opt = tn_kern_at(TN_ISA_AVX512), *ref = tn_kern_at(TN_ISA_SCALAR);
    if (!opt || !opt->slot[TN_Q4_K_R16].gemm || !tn_cpu_get()->avx512vbmi) {
        print_message("skip: the interleaving k-quant gemm needs AVX512-VNNI and VBMI, which this CPU lacks\n");
        skip();
    }
    static const tn_dtype ts[] = {TN_Q4_K, TN_Q5_K, TN_Q6_K};
    static const int64_t nbs[] = {8, 9, 19}, ms[] = {16, 37, 64}, ns[] = {1, 4, 5, 12, 17, 64, 70};
    for (size_t t = 0; t < 3; t++) {
        assert_ptr_not_equal(opt->slot[ts[t]].gemm, ref->slot[ts[t]].gemm);
        for (size_t a = 0; a < 3; a++)
            for (size_t b = 0; b < 3; b++)
                for (size_t c = 0; c < 7; c++) check_gemm(TN_ISA_AVX512, ts[t], nbs[a] * QK_K, ms[b], ns[c]);
        /* interleave: 16 padded rows of 19 blocks, random bytes and quantizer rows */
        const int64_t nb = 19, k = nb * QK_K;
        const size_t row = tn_dtype_row_size(ts[t], k), w_rb = row + 68;
        uint8_t *w = calloc(TN_R16_ROWS, w_rb), *packed = malloc(TN_R16_ROWS * row), *rowmajor = malloc(TN_R16_ROWS * row);
        uint8_t *mine = malloc(TN_R16_ROWS * row);
        for (int r = 0; r < TN_R16_ROWS; r++) {
            make_weight_row(ts[t], k, w + r * w_rb, r % 3 != 0);
            memcpy(rowmajor + r * row, w + r * w_rb, row);
        }
        tn_repack_r16(ts[t], rowmajor, packed, TN_R16_ROWS, k);
        tn_k_interleave_r16_k__avx512(ts[t], w, w_rb, nb, mine);
        for (size_t i = 0; i < TN_R16_ROWS * row; i++)
            if (mine[i] != packed[i])
                fail_msg("interleave %s: byte %zu of the r16 group is %u, tn_repack_r16 wrote %u", tn_dtype_name(ts[t]), i,
                         mine[i], packed[i]);
        free(w), free(packed), free(rowmajor), free(mine);
    }
}

static void test_summary(void **state) {
    (void)state;
    print_message("parity checks: vec_dot %d, gemm %d, from_float %d, to_float %d, swiglu %d, geglu %d\n", checks_dot,
                  checks_gemm, checks_from, checks_to, checks_swiglu, checks_geglu);
    for (int a = 0; a < (int)TN_ISA_COUNT; a++) {
        const tn_kern_table *t = tn_kern_at((tn_isa)a);
        if (!t) continue;
        int nd = 0, nf = 0, nt = 0;
        for (int s = 0; s < TN_DTYPE_GGML_COUNT; s++) {
            nd += t->slot[s].vec_dot && t->slot[s].vec_dot_isa == (tn_isa)a;
            nf += t->slot[s].from_float && t->slot[s].from_float_isa == (tn_isa)a;
            nt += t->slot[s].to_float && t->slot[s].to_float_isa == (tn_isa)a;
        }
        print_message("  %-7s table: %d vec_dot/gemm, %d from_float, %d to_float entries of its own\n",
                      tn_isa_name((tn_isa)a), nd, nf, nt);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vec_dot),    cmocka_unit_test(test_gemm),    cmocka_unit_test(test_gemm_ktile), cmocka_unit_test(test_from_float),
        cmocka_unit_test(test_to_float),   cmocka_unit_test(test_swiglu), cmocka_unit_test(test_geglu),  cmocka_unit_test(test_summary),
    };
    if (!tn_kern_at(TN_ISA_AVX2)) print_message("note: CPU without AVX2; only the scalar table exists\n");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
