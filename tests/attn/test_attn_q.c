/*
 * test_attn_q.c — attention over a quantized KV cache (kern.h tn_attn_q_fn): every K / V type pair
 * of f16, q8_0, q4_0, tq3 / tq7 / tq8 (tern's tq<b>g32a: every plane width) except f16 / f16 (the
 * plain kernel's), head sizes 32, 64, 128, T = 1, 2, 17,
 * 64, 257, 1..8 query heads over 1..4 kv heads, each head checked on its own:
 *   - the scalar reference against softmax(q · K) V computed directly in double from the rows as
 *     stored, dequantized by quant.h's dequantizers (and the query as the kernel uses it: q8_0 of q,
 *     dequantized, for a quantized K; f16-rounded for an f16 K with acc16), the same bounds as
 *     test_attn.c (1e-5 relative with an f32 accumulator, 2^-10 sqrt(T + 1) with f16 V and acc16);
 *   - every ISA's kernel against the reference, the same bounds; AVX2's with a quantized K bit for bit
 *     (it follows the reference's arithmetic step by step);
 *   - soft-capped scores (cap 0.5) against the direct computation with the cap;
 *   - a paged cache (blocks of 4 rows in reverse order) gives exactly the contiguous result;
 *   - the q8_0 / q4_0 rows the kernels read are ggml's block layout: a row quantized by quant.h's
 *     references, block by block at its head offset (what the model's KV write does).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/fp16.h"
#include "kern/kern.h"
#include "quant/quant.h"
#include "quant/tq.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

static tn_tq_params tqp(int32_t t) {
    tn_tq_params p;
    tn_tq_params_of((uint32_t)t, &p);
    return p;
}

static size_t row_bytes(int32_t t, int64_t n) {
    if (tn_tq_is((uint32_t)t)) {
        const tn_tq_params p = tqp(t);
        assert_int_equal(p.group, 32);
        assert_true(p.asym);
        return (size_t)(n / 32) * (4 + 4 * (size_t)p.bits); /* docs/formats.md: fp16 d, fp16 m, 32 b-bit codes */
    }
    return t == TN_Q8_0 ? (size_t)(n / 32) * sizeof(block_q8_0) : t == TN_Q4_0 ? (size_t)(n / 32) * sizeof(block_q4_0) : (size_t)n * 2;
}

static void store_row(int32_t t, const float *x, void *y, int64_t n) {
    const tn_tq_params p = tn_tq_is((uint32_t)t) ? tqp(t) : (tn_tq_params){0};
    if (t == TN_Q8_0) tn_quantize_row_q8_0_ref(x, y, n);
    else if (t == TN_Q4_0) tn_quantize_row_q4_0_ref(x, y, n);
    else if (p.bits) tn_tq_quantize_row_rtn(&p, x, y, n);
    else
        for (int64_t i = 0; i < n; i++) ((uint16_t *)y)[i] = tn_fp32_to_fp16(x[i]);
}

static void load_row(int32_t t, const void *x, float *y, int64_t n) {
    const tn_tq_params p = tn_tq_is((uint32_t)t) ? tqp(t) : (tn_tq_params){0};
    if (t == TN_Q8_0) tn_dequantize_row_q8_0(x, y, n);
    else if (t == TN_Q4_0) tn_dequantize_row_q4_0(x, y, n);
    else if (p.bits) tn_tq_dequantize_row(&p, x, y, n);
    else
        for (int64_t i = 0; i < n; i++) y[i] = tn_fp16_to_fp32(((const uint16_t *)x)[i]);
}

/* A cache of T rows of ld values each, of type t, from random values: bytes and dequantized floats. */
typedef struct {
    uint8_t *b;
    float *f;
    size_t rb;
} cache;

static cache make_cache(int32_t t, int64_t T, int64_t ld, uint64_t *seed) {
    cache c = {malloc(row_bytes(t, ld) * (size_t)T), malloc((size_t)(T * ld) * 4), row_bytes(t, ld)};
    float *x = malloc((size_t)ld * 4);
    for (int64_t r = 0; r < T; r++) {
        for (int64_t i = 0; i < ld; i++) x[i] = frand(seed);
        store_row(t, x, c.b + (size_t)r * c.rb, ld);
        load_row(t, c.b + (size_t)r * c.rb, c.f + r * ld, ld);
    }
    free(x);
    return c;
}

/* softmax(q . K) V in double, one head, K / V rows ld floats apart; cap > 0: cap * tanh(s / cap) */
static void direct(int64_t hd, int64_t T, const double *q, const float *K, const float *V, int64_t ld, double scale,
                   double cap, double *out) {
    double *s = malloc((size_t)T * sizeof *s), mx = -1e300, sum = 0;
    for (int64_t t = 0; t < T; t++) {
        double d = 0;
        for (int64_t i = 0; i < hd; i++) d += q[i] * K[t * ld + i];
        s[t] = d * scale;
        if (cap > 0) s[t] = cap * tanh(s[t] / cap);
        if (s[t] > mx) mx = s[t];
    }
    for (int64_t t = 0; t < T; t++) sum += (s[t] = exp(s[t] - mx));
    for (int64_t i = 0; i < hd; i++) {
        double a = 0;
        for (int64_t t = 0; t < T; t++) a += s[t] / sum * V[t * ld + i];
        out[i] = a;
    }
    free(s);
}

/* The query as the kernel uses it in its dot products. */
static void query_as_used(int32_t tk, bool acc16, const float *q, int64_t hd, double *qd) {
    float *f = malloc((size_t)hd * 4);
    if (tk != TN_F16) {
        block_q8_0 *b = malloc((size_t)(hd / 32) * sizeof *b);
        tn_quantize_row_q8_0_act(q, b, hd);
        tn_dequantize_row_q8_0(b, f, hd);
        free(b);
    } else {
        for (int64_t i = 0; i < hd; i++) f[i] = acc16 ? tn_fp16_to_fp32(tn_fp32_to_fp16(q[i])) : q[i];
    }
    for (int64_t i = 0; i < hd; i++) qd[i] = f[i];
    free(f);
}

/* tern's tq<b>g32a: 3 = planes 2 + 1, 7 = 4 + 2 + 1, 8 = one plane of 8: every plane width */
static const int32_t types[] = {TN_F16, TN_Q8_0, TN_Q4_0, TERN_KV_TQ(3), TERN_KV_TQ(7), TERN_KV_TQ(8)};
#define NTYPES ((int)(sizeof types / sizeof *types))

static size_t head_off(int32_t t, int64_t hd, int64_t g) { return row_bytes(t, g * hd); }

static void test_attn_q(void **state) {
    (void)state;
    const int64_t hds[] = {32, 64, 128}, Ts[] = {1, 2, 17, 64, 257};
    const int64_t cfg[][2] = {{1, 1}, {4, 4}, {4, 1}, {3, 1}, {8, 4}, {6, 2}}; /* nh, rep */
    const tn_kern_table *ref = tn_kern_at(TN_ISA_SCALAR);
    uint64_t seed = 3;
    int checked = 0;
    for (int ik = 0; ik < NTYPES; ik++)
        for (int iv = 0; iv < NTYPES; iv++) {
            if (!ik && !iv) continue;
            const int32_t tk = types[ik], tv = types[iv];
            for (size_t a = 0; a < 3; a++)
                for (size_t b = 0; b < 5; b++)
                    for (size_t g = 0; g < sizeof cfg / sizeof cfg[0]; g++) {
                        const int64_t hd = hds[a], T = Ts[b], nh = cfg[g][0], rep = cfg[g][1], nkv = (nh + rep - 1) / rep;
                        const int64_t ld = nkv * hd;
                        cache K = make_cache(tk, T, ld, &seed), V = make_cache(tv, T, ld, &seed);
                        float *q = malloc((size_t)(nh * hd) * 4), *o_ref = malloc((size_t)(nh * hd) * 4);
                        float *o = malloc((size_t)(nh * hd) * 4), *scr = malloc((size_t)(nh * hd) * 8);
                        double *want = malloc((size_t)(nh * hd) * 8), *qd = malloc((size_t)hd * 8);
                        for (int64_t i = 0; i < nh * hd; i++) q[i] = 2.0f * frand(&seed);
                        const float scale = 1.0f / sqrtf((float)hd);
                        for (int acc16 = 0; acc16 <= 1; acc16++)
                            for (int capped = 0; capped <= 1; capped++) {
                                const float cap = capped ? 0.5f : 0.0f;
                                for (int64_t j = 0; j < nh; j++) {
                                    query_as_used(tk, acc16, q + j * hd, hd, qd);
                                    direct(hd, T, qd, K.f + (j / rep) * hd, V.f + (j / rep) * hd, ld, scale, cap, want + j * hd);
                                }
                                const bool f16acc = acc16 && tv == TN_F16;
                                ref->attn_q(hd, T, nh, rep, q, tk, K.b, K.rb, tv, V.b, V.rb, NULL, 0, scale, cap, acc16, o_ref, scr);
                                for (int64_t i = 0; i < nh * hd; i++) {
                                    const double tol = f16acc ? ldexp(sqrt((double)T + 1), -10) : 1e-5 * (fabs(want[i]) + 0.05);
                                    if (fabs(o_ref[i] - want[i]) > tol)
                                        fail_msg("scalar K %s V %s hd=%lld T=%lld nh=%lld rep=%lld acc16=%d cap=%g [%lld]: %g vs %g",
                                                 tn_dtype_name((uint32_t)tk), tn_dtype_name((uint32_t)tv), (long long)hd, (long long)T,
                                                 (long long)nh, (long long)rep, acc16, cap, (long long)i, o_ref[i], want[i]);
                                }
                                for (int isa = TN_ISA_AVX2; isa < TN_ISA_COUNT; isa++) {
                                    const tn_kern_table *kt = tn_kern_at((tn_isa)isa);
                                    if (!kt) continue;
                                    kt->attn_q(hd, T, nh, rep, q, tk, K.b, K.rb, tv, V.b, V.rb, NULL, 0, scale, cap, acc16, o, scr);
                                    /* the AVX2 kernel follows the reference step by step: with a quantized K
                                     * (integer block dots) its output is the reference's bits */
                                    if (kt->attn_q_isa == TN_ISA_AVX2 && tk != TN_F16 && memcmp(o, o_ref, (size_t)(nh * hd) * 4))
                                        fail_msg("avx2 K %s V %s hd=%lld T=%lld nh=%lld acc16=%d cap=%g: not the reference's bits",
                                                 tn_dtype_name((uint32_t)tk), tn_dtype_name((uint32_t)tv), (long long)hd,
                                                 (long long)T, (long long)nh, acc16, cap);
                                    for (int64_t i = 0; i < nh * hd; i++) {
                                        const double tol = f16acc ? ldexp(sqrt((double)T + 1), -10) : 1e-5 * (fabs(o_ref[i]) + 0.05);
                                        if (fabs(o[i] - o_ref[i]) > tol)
                                            fail_msg("%s K %s V %s hd=%lld T=%lld nh=%lld rep=%lld acc16=%d cap=%g [%lld]: %g vs scalar %g",
                                                     tn_isa_name((tn_isa)isa), tn_dtype_name((uint32_t)tk), tn_dtype_name((uint32_t)tv),
                                                     (long long)hd, (long long)T, (long long)nh, (long long)rep, acc16, cap,
                                                     (long long)i, o[i], o_ref[i]);
                                    }
                                    checked++;
                                }
                            }
                        free(K.b), free(K.f), free(V.b), free(V.f), free(q), free(o_ref), free(o), free(scr), free(want), free(qd);
                    }
        }
    if (!checked) print_message("attn_q: no vector ISA on this CPU; only the scalar reference was checked\n");
}

/* Paged == contiguous, bit for bit, for every table and type pair, one head and 4 heads over 2 kv
 * heads, soft-capped or not. */
static void test_attn_q_paged(void **state) {
    (void)state;
    const int64_t hd = 64, T = 37, B = 4, nblk = (T + B - 1) / B, ld = 2 * hd, R = nblk * B;
    uint64_t seed = 11;
    float q[4 * 64], o1[4 * 64], o2[4 * 64], scr[8 * 64];
    int32_t blocks[16];
    for (int64_t j = 0; j < nblk; j++) blocks[j] = (int32_t)(nblk - 1 - j);
    for (int64_t i = 0; i < 4 * hd; i++) q[i] = frand(&seed);
    for (int ik = 0; ik < NTYPES; ik++)
        for (int iv = 0; iv < NTYPES; iv++) {
            const int32_t tk = types[ik], tv = types[iv];
            cache K = make_cache(tk, R, ld, &seed), V = make_cache(tv, R, ld, &seed);
            uint8_t *Kp = malloc(K.rb * (size_t)R), *Vp = malloc(V.rb * (size_t)R);
            for (int64_t t = 0; t < R; t++) {
                const int64_t row = (int64_t)blocks[t / B] * B + t % B;
                memcpy(Kp + (size_t)row * K.rb, K.b + (size_t)t * K.rb, K.rb);
                memcpy(Vp + (size_t)row * V.rb, V.b + (size_t)t * V.rb, V.rb);
            }
            for (int isa = 0; isa < TN_ISA_COUNT; isa++) {
                const tn_kern_table *kt = tn_kern_at((tn_isa)isa);
                if (!kt) continue;
                for (int acc16 = 0; acc16 <= 1; acc16++)
                    for (int64_t nh = 1; nh <= 4; nh += 3)
                        for (int capped = 0; capped <= 1; capped++) {
                            const float cap = capped ? 0.5f : 0.0f;
                            kt->attn_q(hd, T, nh, 2, q, tk, K.b, K.rb, tv, V.b, V.rb, NULL, 0, 0.125f, cap, acc16, o1, scr);
                            kt->attn_q(hd, T, nh, 2, q, tk, Kp, K.rb, tv, Vp, V.rb, blocks, B, 0.125f, cap, acc16, o2, scr);
                            assert_memory_equal(o1, o2, (size_t)(nh * hd) * sizeof(float));
                        }
            }
            free(K.b), free(K.f), free(V.b), free(V.f), free(Kp), free(Vp);
        }
}

/* The per-head offsets the kernels use are whole blocks of ggml's layout: kv head 1 of a row whose
 * two heads were quantized as one row reads the same as a row holding head 1 alone. */
static void test_attn_q_head_offsets(void **state) {
    (void)state;
    const int64_t hd = 64, T = 5, ld = 2 * hd;
    uint64_t seed = 21;
    float q[64], o1[64], o2[64], scr[2 * 64];
    for (int64_t i = 0; i < hd; i++) q[i] = frand(&seed);
    for (int ik = 1; ik < NTYPES; ik++) {
        const int32_t t = types[ik];
        cache KV = make_cache(t, T, ld, &seed);
        const size_t rb1 = row_bytes(t, hd);
        uint8_t *h1 = malloc(rb1 * (size_t)T);
        for (int64_t r = 0; r < T; r++) {
            if (tn_tq_is((uint32_t)t)) { /* head 1 quantized on its own: its groups are the row's */
                float x[64];
                for (int64_t i = 0; i < hd; i++) x[i] = frand(&seed);
                store_row(t, x, h1 + (size_t)r * rb1, hd);
                memcpy(KV.b + (size_t)r * KV.rb + head_off(t, hd, 1), h1 + (size_t)r * rb1, rb1);
            } else { /* requantizing dequantized blocks gives the same bytes */
                store_row(t, KV.f + r * ld + hd, h1 + (size_t)r * rb1, hd);
                assert_memory_equal(h1 + (size_t)r * rb1, KV.b + (size_t)r * KV.rb + head_off(t, hd, 1), rb1);
            }
        }
        const tn_kern_table *kt = tn_kern();
        float q2[128], o[128], scr2[256];
        memcpy(q2, q, sizeof q), memcpy(q2 + hd, q, sizeof q);
        kt->attn_q(hd, T, 2, 1, q2, t, KV.b, KV.rb, t, KV.b, KV.rb, NULL, 0, 0.125f, 0.0f, false, o, scr2);
        kt->attn_q(hd, T, 1, 1, q, t, h1, rb1, t, h1, rb1, NULL, 0, 0.125f, 0.0f, false, o1, scr);
        memcpy(o2, o + hd, sizeof o2);
        assert_memory_equal(o1, o2, sizeof o1);
        free(KV.b), free(KV.f), free(h1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_attn_q), cmocka_unit_test(test_attn_q_paged),
                                       cmocka_unit_test(test_attn_q_head_offsets)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
