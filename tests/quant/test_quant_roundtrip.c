/*
 * test_quant_roundtrip.c — quantize / dequantize against what each format guarantees, with every
 * expectation derived here from the format description rather than from tern's code:
 *
 *   - exact bytes of small hand-derived blocks (q8_0 of 0..31, q4_0 with negative and positive
 *     extremes, q4_1, q5_0, q5_1, q8_1, q8_K ramps, all-zero blocks of every type including
 *     ggml's -0.0 scale of q4_0/q5_0);
 *   - 32-element formats: per-element error bounds from the scale rule (d = amax/127, max/-8,
 *     (max-min)/15 ...) plus the fp16 rounding of the stored scale and min;
 *   - k-quants: the test decodes each group's grid (scale, min, level range) from the block bytes
 *     itself, checks that the dequantized value is a point of that grid and the grid point nearest
 *     to the input, and that the error stays inside a per-type envelope;
 *   - the generic entry points: F32/F16/BF16, partial blocks and unsupported types rejected with
 *     the output untouched, rows quantized independently.
 * Inputs: the patterns of quant_data.h (random, scales from fp16-subnormal to large, zero,
 * constant, outlier, negative-max, all-positive, all-negative, tiny, exact halves).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "quant/quant.h"
#include "quant_data.h"

#define N 1024
#define N_SEEDS 8

/* Worst-case absolute rounding error of storing v as fp16: half an ulp for normals (2^-11
 * relative), half the subnormal spacing 2^-24 below that. */
static double fp16_err(double v) {
    const double rel = fabs(v) * 0x1p-11;
    return rel > 0x1p-25 ? rel : 0x1p-25;
}

static double absmax(const float *x, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

static float f16(tn_fp16 h) { return tn_fp16_to_fp32(h); }

/* ---- exact bytes, derived by hand --------------------------------------------------------------- */

static void test_q8_0_ramp_exact(void **state) {
    (void)state;
    /* x = 0..31: d = 31/127 = 0.24409.. -> fp16 0x33D0 (1.953125 * 2^-3 = 0.244140625);
     * q_j = round(127 j / 31), never a tie since 127 j / 31 is never k + 1/2. */
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)j;
    block_q8_0 b;
    tn_quantize_row_q8_0_ref(x, &b, 32);
    assert_int_equal(b.d, 0x33D0);
    for (int j = 0; j < 32; j++) assert_int_equal(b.qs[j], (254 * j + 31) / 62);
    /* Dequantized: q_j * 0.244140625, exactly representable. */
    float y[32];
    tn_dequantize_row_q8_0(&b, y, 32);
    for (int j = 0; j < 32; j++) assert_true(y[j] == (float)((254 * j + 31) / 62) * 0.244140625f);

    /* Exact ties: x0 = 127 gives d = 1 (0x3C00) and id = 1, so x_j = j - 15.5 lands on halves;
     * roundf rounds them away from zero (2.5 -> 3, -2.5 -> -3), not to even. */
    for (int j = 0; j < 32; j++) x[j] = j == 0 ? 127.0f : (float)j - 15.5f;
    tn_quantize_row_q8_0_ref(x, &b, 32);
    assert_int_equal(b.d, 0x3C00);
    assert_int_equal(b.qs[0], 127);
    for (int j = 1; j < 32; j++) assert_int_equal(b.qs[j], j >= 16 ? j - 15 : j - 16);
}

static void test_q4_0_signed_max_exact(void **state) {
    (void)state;
    /* ggml's q4_0 scale is d = max / -8 with max the SIGNED extreme. Block A: x0 = -16, others
     * j - 16 (-15..15): d = +2 (fp16 0x4000), q = floor(x/2 + 8.5) clamped to 15; x0 -> 0.
     * Block B: the mirror image, extreme +16: d = -2 (0xC000), q = floor(-x/2 + 8.5). */
    float x[64];
    for (int j = 0; j < 32; j++) {
        x[j] = j == 0 ? -16.0f : (float)(j - 16);
        x[32 + j] = -x[j];
    }
    block_q4_0 b[2];
    tn_quantize_row_q4_0_ref(x, b, 64);
    assert_int_equal(b[0].d, 0x4000);
    assert_int_equal(b[1].d, 0xC000);
    for (int blk = 0; blk < 2; blk++) {
        for (int j = 0; j < 16; j++) {
            int q[2];
            for (int h = 0; h < 2; h++) {
                const int v = blk == 0 ? (int)x[j + 16 * h] : -(int)x[32 + j + 16 * h]; /* v = x/d * 2 */
                q[h] = (v + 17) / 2;                                                     /* floor((v+17)/2), v+17 >= 1 */
                if (q[h] > 15) q[h] = 15;
            }
            assert_int_equal(b[blk].qs[j], q[0] | (q[1] << 4));
        }
    }
    /* The extreme is reproduced exactly: level 0 -> (0 - 8) * d. */
    float y[64];
    tn_dequantize_row_q4_0(b, y, 64);
    assert_true(y[0] == -16.0f && y[32] == 16.0f);
}

static void test_q4_1_q5_exact(void **state) {
    (void)state;
    /* q4_1: x = 3 + 2 (j % 16): min 3, max 33, d = 30/15 = 2 (0x4000), m = 3 (0x4200), q = j % 16. */
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = 3.0f + 2.0f * (float)(j % 16);
    block_q4_1 b41;
    tn_quantize_row_q4_1_ref(x, &b41, 32);
    assert_int_equal(b41.d, 0x4000);
    assert_int_equal(b41.m, 0x4200);
    for (int j = 0; j < 16; j++) assert_int_equal(b41.qs[j], j | (j << 4));

    /* q5_0: x = j - 15 (-15..16): extreme +16, d = 16/-16 = -1 (0xBC00), q = floor(16.5 - x)
     * = 31 - j; bit 4 set for j <= 15 -> qh = 0x0000FFFF little-endian. */
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 15);
    block_q5_0 b50;
    tn_quantize_row_q5_0_ref(x, &b50, 32);
    assert_int_equal(b50.d, 0xBC00);
    const uint8_t qh50[4] = {0xFF, 0xFF, 0x00, 0x00};
    assert_memory_equal(b50.qh, qh50, 4);
    for (int j = 0; j < 16; j++) assert_int_equal(b50.qs[j], ((31 - j) & 0xF) | (((31 - j - 16) & 0xF) << 4));

    /* q5_1: x = j: min 0, max 31, d = 1 (0x3C00), m = 0, q = j; bit 4 set for j >= 16. */
    for (int j = 0; j < 32; j++) x[j] = (float)j;
    block_q5_1 b51;
    tn_quantize_row_q5_1_ref(x, &b51, 32);
    assert_int_equal(b51.d, 0x3C00);
    assert_int_equal(b51.m, 0x0000);
    const uint8_t qh51[4] = {0x00, 0x00, 0xFF, 0xFF};
    assert_memory_equal(b51.qh, qh51, 4);
    for (int j = 0; j < 16; j++) assert_int_equal(b51.qs[j], j | (j << 4));

    /* q8_1: x0 = -127, x_j = 5 j - 80 (-75..75): d = 127/127 = 1 (0x3C00), q = x, and
     * s = d * sum(q) = -127 + 5 * 496 - 80 * 31 = -127 = -1.984375 * 2^6 -> fp16 0xD7F0. */
    for (int j = 0; j < 32; j++) x[j] = j == 0 ? -127.0f : (float)(5 * j - 80);
    block_q8_1 b81;
    tn_quantize_row_q8_1_ref(x, &b81, 32);
    assert_int_equal(b81.d, 0x3C00);
    for (int j = 0; j < 32; j++) assert_int_equal(b81.qs[j], (int)x[j]);
    assert_int_equal(b81.s, 0xD7F0);
}

static void test_q8_K_ramp_exact(void **state) {
    (void)state;
    /* x = j - 128: extreme -128, iscale = -127 / -128 = 127/128 exactly, so q = nearest-even of
     * 127 x / 128 (ties at x = +-64 go to +-64), d = 128/127 as a float, bsums = sums of 16. */
    float x[256];
    for (int j = 0; j < 256; j++) x[j] = (float)(j - 128);
    block_q8_K b;
    tn_quantize_row_q8_K_ref(x, &b, 256);
    assert_true(b.d == 1.0f / (127.0f / 128.0f));
    for (int j = 0; j < 256; j++) {
        const int v = 127 * (j - 128); /* q = round_half_even(v / 128) */
        int q = (int)floor((double)v / 128.0);
        const int rem = v - 128 * q; /* 0..127 */
        if (rem > 64 || (rem == 64 && (q & 1))) q++;
        assert_int_equal(b.qs[j], q);
    }
    for (int g = 0; g < 16; g++) {
        int s = 0;
        for (int j = 0; j < 16; j++) s += b.qs[16 * g + j];
        assert_int_equal(b.bsums[g], s);
    }
}

/* All-zero input: every format stores zeros, except that ggml's d = max / -8 (-16) is -0.0 for
 * q4_0/q5_0 (fp16 0x8000) and every element then sits on the middle level (8, resp. 16). */
static void test_zero_blocks_exact(void **state) {
    (void)state;
    static const tn_dtype types[] = {TN_Q4_0, TN_Q4_1, TN_Q5_0, TN_Q5_1, TN_Q8_0, TN_Q8_1, TN_Q2_K,
                                     TN_Q3_K, TN_Q4_K, TN_Q5_K, TN_Q6_K, TN_Q8_K};
    static float x[512], y[512];
    static uint8_t q[1024], want[1024];
    memset(x, 0, sizeof x);
    for (size_t i = 0; i < TN_ARRAY_LEN(types); i++) {
        const tn_dtype t = types[i];
        const size_t nbytes = tn_dtype_row_size(t, 512);
        memset(q, 0xA5, sizeof q);
        assert_true(tn_quantize_row_ref(t, x, q, 512));
        memset(want, 0, nbytes);
        if (t == TN_Q4_0) {
            for (size_t b = 0; b < nbytes; b += sizeof(block_q4_0)) {
                want[b + 1] = 0x80;
                memset(want + b + 2, 0x88, 16);
            }
        } else if (t == TN_Q5_0) {
            for (size_t b = 0; b < nbytes; b += sizeof(block_q5_0)) {
                want[b + 1] = 0x80;
                memset(want + b + 2, 0xFF, 4); /* qh: every level is 16 = 0b10000 */
            }
        }
        if (memcmp(q, want, nbytes) != 0) fail_msg("zero block of %s: bytes differ", tn_dtype_name(t));
        assert_true(tn_dequantize_row(t, q, y, 512));
        for (int j = 0; j < 512; j++)
            if (y[j] != 0.0f) fail_msg("zero block of %s dequantizes to %g at %d", tn_dtype_name(t), y[j], j);
    }
}

/* ---- 32-element formats: derived error bounds ------------------------------------------------ */

/* Bound for element j of block x under type t (see the file comment); slop covers float rounding
 * of x * id and of the dequantization (a few ulps of the block's magnitude). */
static double legacy_bound(tn_dtype t, const float *x, int j) {
    float min = x[0], max = x[0];
    for (int i = 1; i < 32; i++) {
        min = fminf(min, x[i]);
        max = fmaxf(max, x[i]);
    }
    const double amax = absmax(x, 32);
    const double slop = 1e-6 * (amax + 1e-30);
    switch (t) {
    case TN_Q8_0:
    case TN_Q8_1: {
        const double d = amax / 127; /* q in -127..127, error half a step */
        return d / 2 + 127 * fp16_err(d) + slop;
    }
    case TN_Q4_0:
    case TN_Q5_0: {
        /* d = extreme / -nneg: levels -nneg..nneg-1 in units of d; the extreme sits on -nneg, its
         * mirror image would need +nneg and clamps to nneg-1 (error up to a full step). */
        const int nneg = t == TN_Q4_0 ? 8 : 16;
        const double d = amax / nneg;
        if (d == 0) return slop;
        float ext = 0; /* signed extreme */
        for (int i = 0; i < 32; i++)
            if (fabsf(x[i]) > fabsf(ext)) ext = x[i];
        const double tpos = x[j] / (ext / -(double)nneg); /* position on the level axis */
        const double grid = tpos > nneg - 0.5 ? (tpos - (nneg - 1)) * d : d / 2;
        return grid + nneg * fp16_err(d) + slop;
    }
    case TN_Q4_1:
    case TN_Q5_1: {
        const int nmax = t == TN_Q4_1 ? 15 : 31;
        const double d = ((double)max - min) / nmax;
        return d / 2 + nmax * fp16_err(d) + fp16_err(min) + slop;
    }
    default: fail(); return 0;
    }
}

static void check_legacy(tn_dtype t) {
    static float x[N], y[N];
    static uint8_t q[N * 2];
    int64_t checked = 0;
    for (int p = 0; p < TQ_N_PATTERNS; p++) {
        for (int seed = 1; seed <= N_SEEDS; seed++) {
            tq_fill(p, (uint64_t)seed, x, N);
            assert_true(tn_quantize_row_ref(t, x, q, N));
            assert_true(tn_dequantize_row(t, q, y, N));
            for (int b = 0; b < N / 32; b++) {
                for (int j = 0; j < 32; j++) {
                    const double err = fabs((double)x[32 * b + j] - y[32 * b + j]);
                    const double bound = legacy_bound(t, x + 32 * b, j);
                    if (!(err <= bound))
                        fail_msg("%s pattern %d seed %d block %d elem %d: x %.9g y %.9g err %.3g > bound %.3g",
                                 tn_dtype_name(t), p, seed, b, j, x[32 * b + j], y[32 * b + j], err, bound);
                    checked++;
                }
            }
        }
    }
    assert_true(checked == (int64_t)TQ_N_PATTERNS * N_SEEDS * N);
}

static void test_q8_0_bound(void **state) { (void)state; check_legacy(TN_Q8_0); }
static void test_q8_1_bound(void **state) { (void)state; check_legacy(TN_Q8_1); }
static void test_q4_0_bound(void **state) { (void)state; check_legacy(TN_Q4_0); }
static void test_q5_0_bound(void **state) { (void)state; check_legacy(TN_Q5_0); }
static void test_q4_1_bound(void **state) { (void)state; check_legacy(TN_Q4_1); }
static void test_q5_1_bound(void **state) { (void)state; check_legacy(TN_Q5_1); }

/* q8_1's s is d * sum(q) rounded to fp16: check it against the block's own quants. */
static void test_q8_1_sum_field(void **state) {
    (void)state;
    static float x[N];
    static block_q8_1 b[N / 32];
    for (int p = 0; p < TQ_N_PATTERNS; p++) {
        tq_fill(p, 3, x, N);
        tn_quantize_row_q8_1_ref(x, b, N);
        for (int i = 0; i < N / 32; i++) {
            const double d = absmax(x + 32 * i, 32) / 127;
            int sum = 0;
            for (int j = 0; j < 32; j++) sum += b[i].qs[j];
            const double want = d * sum;
            assert_true(fabs(f16(b[i].s) - want) <= fp16_err(want) + 1e-6 * fabs(want));
        }
    }
}

/* ---- k-quants: the test's own decoder of each group's grid ---------------------------------- */

/* The grid of element e of a block: value(l) = step * l - offset for lmin <= l <= lmax; and the
 * level the block stores for e. */
typedef struct { double step, offset; int lmin, lmax, level; } grid;

static int bits2(const uint8_t *qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

/* 6-bit scale/min of group g of a q4_K/q5_K block, decoded from the 12-byte layout. */
static void k4_scale_min(const uint8_t *s, int g, int *sc, int *m) {
    if (g < 4) {
        *sc = s[g] & 63;
        *m = s[g + 4] & 63;
    } else {
        *sc = (s[g + 4] & 0xF) | ((s[g - 4] >> 6) << 4);
        *m = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
    }
}

static grid decode_grid(tn_dtype t, const uint8_t *blk, int e) {
    grid gr = {0};
    switch (t) {
    case TN_Q2_K: {
        const block_q2_K *b = (const block_q2_K *)blk;
        const int sc = b->scales[e / 16];
        gr.step = (double)f16(b->d) * (sc & 0xF);
        gr.offset = (double)f16(b->dmin) * (sc >> 4);
        gr.lmin = 0, gr.lmax = 3, gr.level = bits2(b->qs, e);
        break;
    }
    case TN_Q3_K: {
        const block_q3_K *b = (const block_q3_K *)blk;
        const int g = e / 16;
        const int lo = g < 8 ? b->scales[g] & 0xF : b->scales[g - 8] >> 4;
        const int hi = (b->scales[8 + g % 4] >> (2 * (g / 4))) & 3;
        gr.step = (double)f16(b->d) * ((lo | (hi << 4)) - 32);
        gr.lmin = -4, gr.lmax = 3;
        gr.level = bits2(b->qs, e) - (((b->hmask[e % 32] >> (e / 32)) & 1) ? 0 : 4);
        break;
    }
    case TN_Q4_K:
    case TN_Q5_K: {
        const bool q5 = t == TN_Q5_K;
        const uint8_t *scales = q5 ? ((const block_q5_K *)blk)->scales : ((const block_q4_K *)blk)->scales;
        const uint8_t *qs = q5 ? ((const block_q5_K *)blk)->qs : ((const block_q4_K *)blk)->qs;
        const tn_fp16 d = q5 ? ((const block_q5_K *)blk)->d : ((const block_q4_K *)blk)->d;
        const tn_fp16 dmin = q5 ? ((const block_q5_K *)blk)->dmin : ((const block_q4_K *)blk)->dmin;
        const int g = e / 32;
        int sc, m;
        k4_scale_min(scales, g, &sc, &m);
        gr.step = (double)f16(d) * sc;
        gr.offset = (double)f16(dmin) * m;
        gr.lmin = 0, gr.lmax = q5 ? 31 : 15;
        gr.level = (qs[32 * (g / 2) + e % 32] >> (4 * (g % 2))) & 0xF;
        if (q5 && ((((const block_q5_K *)blk)->qh[e % 32] >> g) & 1)) gr.level += 16;
        break;
    }
    case TN_Q6_K: {
        const block_q6_K *b = (const block_q6_K *)blk;
        const int h = e / 128, r = (e % 128) / 32, l = e % 32;
        const int lo = (b->ql[64 * h + l + 32 * (r % 2)] >> (4 * (r / 2))) & 0xF;
        const int hi = (b->qh[32 * h + l] >> (2 * r)) & 3;
        gr.step = (double)f16(b->d) * b->scales[e / 16];
        gr.lmin = -32, gr.lmax = 31, gr.level = (lo | (hi << 4)) - 32;
        break;
    }
    case TN_Q8_K: {
        const block_q8_K *b = (const block_q8_K *)blk;
        gr.step = b->d;
        gr.lmin = -128, gr.lmax = 127, gr.level = b->qs[e];
        break;
    }
    default: fail();
    }
    return gr;
}

/* Envelope of max |error| / amax(super-block), about 1.2-1.5x the worst seen on these patterns
 * (the scale searches can clip the extremes; the group scales are themselves 4/6/8-bit): a
 * sanity net for gross errors. Exactness is test_quant_golden's job. K is the largest integer
 * multiplier of the fp16 super-scales, for the absolute term K * 2^-25 of their rounding when they
 * underflow into fp16 subnormals (pattern 1's tiny blocks). */
static double k_envelope(tn_dtype t, double *K) {
    switch (t) {
    case TN_Q2_K: *K = 15 * 3 + 15; return 0.5;
    case TN_Q3_K: *K = 32 * 4; return 0.375;
    case TN_Q4_K: *K = 63 * 15 + 63; return 0.2;
    case TN_Q5_K: *K = 63 * 31 + 63; return 0.1;
    case TN_Q6_K: *K = 128 * 32; return 0.05;
    default: *K = 0; return 0.5 / 127 + 1e-6; /* q8_K: float scale, half a step */
    }
}

static void check_kquant(tn_dtype t) {
    static float x[N], y[N];
    static uint8_t q[N * 2];
    const size_t bb = tn_dtype_get(t)->type_size;
    double K;
    const double env = k_envelope(t, &K);
    for (int p = 0; p < TQ_N_PATTERNS; p++) {
        for (int seed = 1; seed <= N_SEEDS; seed++) {
            tq_fill(p, (uint64_t)seed, x, N);
            assert_true(tn_quantize_row_ref(t, x, q, N));
            assert_true(tn_dequantize_row(t, q, y, N));
            for (int b = 0; b < N / QK_K; b++) {
                const float *xb = x + QK_K * b, *yb = y + QK_K * b;
                const double amax = absmax(xb, QK_K);
                for (int e = 0; e < QK_K; e++) {
                    const grid g = decode_grid(t, q + bb * b, e);
                    const double scale_mag = fabs(g.step) * 64 + g.offset + amax;
                    /* 1. The dequantized value is the stored grid point. */
                    const double v = g.step * g.level - g.offset;
                    if (fabs(yb[e] - v) > 1e-6 * scale_mag + 1e-30)
                        fail_msg("%s p%d s%d blk %d e %d: dequantized %.9g, grid point %.9g", tn_dtype_name(t), p,
                                 seed, b, e, yb[e], v);
                    if (g.level < g.lmin || g.level > g.lmax) fail_msg("%s: level %d out of range", tn_dtype_name(t), g.level);
                    /* 2. It is the grid point nearest to x: clamp(round((x + offset) / step)). */
                    double best = fabs(xb[e] + g.offset); /* step 0: the only point is -offset */
                    if (g.step != 0) {
                        double l = nearbyint((xb[e] + g.offset) / g.step);
                        l = fmin(fmax(l, g.lmin), g.lmax);
                        best = fabs(xb[e] - (g.step * l - g.offset));
                    }
                    const double err = fabs((double)xb[e] - yb[e]);
                    if (err > best + 1e-6 * scale_mag + fabs(g.step) * 1e-4)
                        fail_msg("%s p%d s%d blk %d e %d: x %.9g -> %.9g, nearest grid point is %.3g away (got %.3g)",
                                 tn_dtype_name(t), p, seed, b, e, xb[e], yb[e], best, err);
                    /* 3. The envelope. */
                    if (err > env * amax + K * 0x1p-25 + 1e-7 * amax)
                        fail_msg("%s p%d s%d blk %d e %d: error %.3g > %.3g x amax %.3g", tn_dtype_name(t), p, seed, b, e,
                                 err, env, amax);
                }
            }
        }
    }
}

static void test_q2_K_grid(void **state) { (void)state; check_kquant(TN_Q2_K); }
static void test_q3_K_grid(void **state) { (void)state; check_kquant(TN_Q3_K); }
static void test_q4_K_grid(void **state) { (void)state; check_kquant(TN_Q4_K); }
static void test_q5_K_grid(void **state) { (void)state; check_kquant(TN_Q5_K); }
static void test_q6_K_grid(void **state) { (void)state; check_kquant(TN_Q6_K); }
static void test_q8_K_grid(void **state) { (void)state; check_kquant(TN_Q8_K); }

/* q8_K's bsums are the sums of each 16 quants. */
static void test_q8_K_bsums(void **state) {
    (void)state;
    static float x[N];
    static block_q8_K b[N / QK_K];
    for (int p = 0; p < TQ_N_PATTERNS; p++) {
        tq_fill(p, 5, x, N);
        tn_quantize_row_q8_K_ref(x, b, N);
        for (int i = 0; i < N / QK_K; i++) {
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++) s += b[i].qs[16 * g + j];
                assert_int_equal(b[i].bsums[g], s);
            }
        }
    }
}

/* ---- generic entry points --------------------------------------------------------------------- */

static void test_float_formats(void **state) {
    (void)state;
    static float x[N], y[N];
    static uint8_t q[N * 4];
    tq_fill(0, 9, x, N);
    /* F32: an exact copy. */
    assert_true(tn_quantize_row_ref(TN_F32, x, q, N));
    assert_memory_equal(q, x, sizeof x);
    assert_true(tn_dequantize_row(TN_F32, q, y, N));
    assert_memory_equal(y, x, sizeof x);
    /* F16 / BF16: round to nearest, so the error is at most half an ulp (11 / 8 significant bits). */
    assert_true(tn_quantize_row_ref(TN_F16, x, q, N));
    assert_true(tn_dequantize_row(TN_F16, q, y, N));
    for (int i = 0; i < N; i++) assert_true(fabs((double)x[i] - y[i]) <= fp16_err(x[i]));
    assert_true(tn_quantize_row_ref(TN_BF16, x, q, N));
    assert_true(tn_dequantize_row(TN_BF16, q, y, N));
    for (int i = 0; i < N; i++) assert_true(fabs((double)x[i] - y[i]) <= fabs(x[i]) * 0x1p-8);
}

static void test_generic_rejects(void **state) {
    (void)state;
    static float x[64], y[64];
    static uint8_t q[512];
    tq_fill(0, 1, x, 64);
    memset(q, 0x5A, sizeof q);
    memset(y, 0, sizeof y);
    /* Not whole blocks. */
    assert_false(tn_quantize_row_ref(TN_Q4_0, x, q, 48));
    assert_false(tn_quantize_row_ref(TN_Q4_K, x, q, 64));
    assert_false(tn_dequantize_row(TN_Q8_0, q, y, 33));
    /* Types without a reference. */
    assert_false(tn_quantize_row_ref(TN_I8, x, q, 64));
    assert_false(tn_quantize_row_ref((tn_dtype)16 /* iq2_xxs: no reference yet */, x, q, 256));
    assert_false(tn_dequantize_row((tn_dtype)999, q, y, 64));
    assert_int_equal(tn_quantize_rows_ref(TN_I32, x, q, 2, 32), 0);
    assert_int_equal(tn_quantize_rows_ref(TN_Q8_0, x, q, 2, 20), 0);
    /* Nothing was written. */
    for (size_t i = 0; i < sizeof q; i++) assert_int_equal(q[i], 0x5A);
    for (int i = 0; i < 64; i++) assert_true(y[i] == 0.0f);
}

static void test_rows(void **state) {
    (void)state;
    /* 3 rows of 512: tn_quantize_rows_ref returns 3 * row_size and equals row-by-row calls. */
    static const tn_dtype types[] = {TN_F16, TN_BF16, TN_Q4_0, TN_Q4_1, TN_Q5_0, TN_Q5_1, TN_Q8_0,
                                     TN_Q8_1, TN_Q2_K, TN_Q3_K, TN_Q4_K, TN_Q5_K, TN_Q6_K, TN_Q8_K};
    static float x[3 * 512];
    static uint8_t a[3 * 2048], b[3 * 2048];
    tq_fill(2, 4, x, 3 * 512);
    for (size_t i = 0; i < TN_ARRAY_LEN(types); i++) {
        const size_t rs = tn_dtype_row_size(types[i], 512);
        assert_int_equal(tn_quantize_rows_ref(types[i], x, a, 3, 512), 3 * rs);
        for (int r = 0; r < 3; r++) assert_true(tn_quantize_row_ref(types[i], x + 512 * r, b + rs * (size_t)r, 512));
        assert_memory_equal(a, b, 3 * rs);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_0_ramp_exact),  cmocka_unit_test(test_q4_0_signed_max_exact),
        cmocka_unit_test(test_q4_1_q5_exact),    cmocka_unit_test(test_q8_K_ramp_exact),
        cmocka_unit_test(test_zero_blocks_exact), cmocka_unit_test(test_q8_0_bound),
        cmocka_unit_test(test_q8_1_bound),       cmocka_unit_test(test_q4_0_bound),
        cmocka_unit_test(test_q5_0_bound),       cmocka_unit_test(test_q4_1_bound),
        cmocka_unit_test(test_q5_1_bound),       cmocka_unit_test(test_q8_1_sum_field),
        cmocka_unit_test(test_q2_K_grid),        cmocka_unit_test(test_q3_K_grid),
        cmocka_unit_test(test_q4_K_grid),        cmocka_unit_test(test_q5_K_grid),
        cmocka_unit_test(test_q6_K_grid),        cmocka_unit_test(test_q8_K_grid),
        cmocka_unit_test(test_q8_K_bsums),       cmocka_unit_test(test_float_formats),
        cmocka_unit_test(test_generic_rejects),  cmocka_unit_test(test_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
