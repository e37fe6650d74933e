/*
 * test_quant_iq_grid.c — the codebook i-quants (iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s,
 * iq1_m) against their format, written here a second time and independently of
 * src/quant/quant_iq2.c (which reads blocks through one sub-block decoder):
 *   - the sign bytes: 7 stored bits plus an eighth that makes the count of negatives even,
 *     checked by counting bits for all 128 fields;
 *   - dequantization of random blocks (every index, sign and scale pattern, finite fp16 scales)
 *     equals a per-element decoder written from the layout (element e -> its group, the index
 *     bits and sign bit of that group, its scale field), looking the index up in the format's
 *     grids (the codebooks are the format: iq_grid.h);
 *   - the scalar vec_dot against q8_K equals the double sum of the spec-dequantized weights times
 *     the dequantized activations, within a few float roundings of sum |w x| per block (the
 *     reference sums exact integers and rounds only in its few float scale products).
 * ggml's own functions are compared in test_quant_iq_ggml.c (with a llama.cpp build).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kern/kern.h"
#include "quant/iq_grid.h"
#include "quant/quant.h"
#include "quant_data.h"

static int popcount8(unsigned v) {
    int n = 0;
    for (int j = 0; j < 8; j++) n += v >> j & 1;
    return n;
}

/* the sign bit of element j (0..7) of a group whose 7-bit stored field is f */
static int neg7(unsigned f, int j) {
    f &= 127;
    if (j < 7) return f >> j & 1;
    return popcount8(f) % 2; /* the eighth makes the number of negatives even */
}

static unsigned u16at(const uint8_t *p) { return (unsigned)p[0] | (unsigned)p[1] << 8; }
static uint32_t u32at(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static int gbyte(uint64_t e, int j) { return (int)(e >> (8 * j) & 255); }

/* element e (0..255) of one block of type t, as the format defines it */
static double spec_value(tn_dtype t, const uint8_t *b, int e) {
    const int ib = e / 32, g = e / 8, j = e % 8, w = e % 4;
    const float d = tn_fp16_to_fp32((tn_fp16)u16at(b));
    float db;
    int mag = 0, neg = 0;
    switch (t) {
    case TN_IQ2_XXS: { /* d, then per sub-block 8 bytes: 4 index bytes, a uint32 of signs + scale */
        const uint8_t *sb = b + 2 + 8 * ib;
        const uint32_t aux = u32at(sb + 4);
        mag = gbyte(tn_iq2xxs_grid[sb[g % 4]], j);
        neg = neg7(aux >> (7 * (g % 4)), j);
        db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
        break;
    }
    case TN_IQ2_XS: { /* d, 32 uint16 (9-bit index | 7-bit signs), 8 scale bytes */
        const unsigned v = u16at(b + 2 + 2 * g);
        mag = gbyte(tn_iq2xs_grid[v & 511], j);
        neg = neg7(v >> 9, j);
        db = d * (0.5f + (float)(b[2 + 64 + ib] >> (e % 32 < 16 ? 0 : 4) & 15)) * 0.25f;
        break;
    }
    case TN_IQ2_S: { /* d, 32 index bytes, 32 sign bytes, 8 qh bytes, 8 scale bytes */
        const int idx = b[2 + g] | (b[2 + 64 + ib] >> (2 * (g % 4)) & 3) << 8;
        mag = gbyte(tn_iq2s_grid[idx], j);
        neg = b[2 + 32 + g] >> j & 1;
        db = d * (0.5f + (float)(b[2 + 72 + ib] >> (e % 32 < 16 ? 0 : 4) & 15)) * 0.25f;
        break;
    }
    case TN_IQ3_XXS: { /* d, 64 index bytes (one per 4 elements), 8 uint32 signs + scale */
        const uint32_t aux = u32at(b + 2 + 64 + 4 * ib);
        mag = (int)(tn_iq3xxs_grid[b[2 + e / 4]] >> (8 * w) & 255);
        neg = neg7(aux >> (7 * (g % 4)), j);
        db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
        break;
    }
    case TN_IQ3_S: { /* d, 64 index bytes, 8 qh (ninth index bit), 32 sign bytes, 4 scale bytes */
        const int q4 = e / 4;
        const int idx = b[2 + q4] | (b[2 + 64 + ib] >> (q4 % 8) & 1) << 8;
        mag = (int)(tn_iq3s_grid[idx] >> (8 * w) & 255);
        neg = b[2 + 72 + g] >> j & 1;
        db = d * (float)(1 + 2 * (b[2 + 104 + ib / 2] >> (ib % 2 ? 4 : 0) & 15));
        break;
    }
    case TN_IQ1_S: { /* d, 32 index bytes, 8 uint16 (3 high bits per group, scale, delta sign) */
        const unsigned qh = u16at(b + 2 + 32 + 2 * ib);
        const int idx = b[2 + g] | (qh >> (3 * (g % 4)) & 7) << 8;
        const float dl = d * (float)(2 * (qh >> 12 & 7) + 1);
        return dl * ((float)(int8_t)gbyte(tn_iq1s_grid[idx], j) + (qh & 0x8000 ? -0.125f : 0.125f));
    }
    case TN_IQ1_M: { /* 32 index bytes, 16 qh bytes (per group: 3 bits + delta sign), 4 scale words */
        const unsigned h = b[32 + g / 2] >> (4 * (g % 2)) & 15;
        const int idx = b[g] | (h & 7) << 8;
        unsigned sc[4], f16 = 0;
        for (int k = 0; k < 4; k++) sc[k] = u16at(b + 48 + 2 * k), f16 |= (sc[k] >> 12) << (4 * k);
        const float dm = tn_fp16_to_fp32((tn_fp16)f16);
        const int s = sc[ib / 2] >> (6 * (ib % 2) + 3 * (e % 32 >= 16)) & 7;
        const float dl = dm * (float)(2 * s + 1);
        return dl * ((float)(int8_t)gbyte(tn_iq1s_grid[idx], j) + (h & 8 ? -0.125f : 0.125f));
    }
    default: fail_msg("not a codebook type"); return 0;
    }
    return (double)(db * (float)(neg ? -mag : mag));
}

static const tn_dtype types[] = {TN_IQ2_XXS, TN_IQ2_XS, TN_IQ2_S, TN_IQ3_XXS, TN_IQ3_S, TN_IQ1_S, TN_IQ1_M};

/* random bytes, then a finite fp16 scale in a moderate range (iq1_m: in the scale nibbles) */
static void random_blocks(tn_dtype t, uint8_t *q, int nblk, uint64_t seed) {
    const size_t bs = tn_dtype_get(t)->type_size;
    for (size_t i = 0; i < nblk * bs; i++) q[i] = (uint8_t)tq_next(&seed);
    for (int k = 0; k < nblk; k++) {
        const tn_fp16 h = tn_fp32_to_fp16(tq_sym(&seed) * 0.05f);
        uint8_t *b = q + k * bs;
        if (t == TN_IQ1_M)
            for (int w = 0; w < 4; w++) b[48 + 2 * w + 1] = (uint8_t)((b[48 + 2 * w + 1] & 15) | ((h >> 4 * w) & 15) << 4);
        else memcpy(b, &h, 2);
    }
}

static void test_signs(void **state) {
    (void)state;
    for (unsigned f = 0; f < 128; f++) {
        const uint8_t s = tn_iq_signs7(f);
        assert_int_equal(s & 127, f);
        assert_int_equal(popcount8(s) % 2, 0);
    }
}

enum { NB = 12 };

static void test_dequant_and_dot(void **state) {
    (void)state;
    const tn_kern_table *kt = tn_kern_at(TN_ISA_SCALAR);
    const int64_t k = NB * QK_K;
    uint8_t *q = malloc(NB * 128);
    float *y = malloc(k * sizeof(float)), *xf = malloc(k * sizeof(float));
    void *act = malloc(tn_dtype_row_size(TN_Q8_K, k));
    for (size_t i = 0; i < TN_ARRAY_LEN(types); i++) {
        const tn_dtype t = types[i];
        const tn_dtype_traits *tr = tn_dtype_get(t);
        assert_non_null(tr);
        assert_true(tr->supported);
        assert_int_equal(tr->blck_size, QK_K);
        assert_int_equal(tr->vec_dot_type, TN_Q8_K);
        for (uint64_t p = 0; p < 20; p++) {
            random_blocks(t, q, NB, 1000 * i + p);
            assert_true(tn_dequantize_row(t, q, y, k));
            for (int b = 0; b < NB; b++)
                for (int e = 0; e < QK_K; e++) {
                    const double v = spec_value(t, q + b * tr->type_size, e);
                    if ((double)y[b * QK_K + e] != v)
                        fail_msg("%s: block %d element %d: %.9g, the format gives %.9g", tr->name, b, e, y[b * QK_K + e], v);
                }
            tq_fill((int)(p % 2 ? 0 : 1), 77 + p, xf, k);
            kt->slot[TN_Q8_K].from_float(xf, act, k);
            assert_true(tn_dequantize_row(TN_Q8_K, act, xf, k));
            double ref = 0, mag = 0;
            for (int b = 0; b < NB; b++)
                for (int e = 0; e < QK_K; e++) {
                    const double wv = spec_value(t, q + b * tr->type_size, e);
                    ref += wv * xf[b * QK_K + e];
                    mag += fabs(wv * xf[b * QK_K + e]);
                }
            float s = NAN;
            kt->slot[t].vec_dot(k, &s, q, act);
            const double tol = (NB + 4) * 0x1p-22 * mag + 1e-30;
            if (!(fabs((double)s - ref) <= tol)) fail_msg("%s: vec_dot %.9g, double sum %.9g (tol %.3g)", tr->name, s, ref, tol);
        }
    }
    free(q), free(y), free(xf), free(act);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_signs), cmocka_unit_test(test_dequant_and_dot)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
