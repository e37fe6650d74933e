/*
 * test_attn.c — the attention kernel: the scalar reference against a direct double-precision
 * softmax(q·K)·V (bounds: f32 mode 1e-5 relative; f16 mode, where q and the accumulator are
 * rounded to f16 after every update, 4e-3 relative ≈ 8 half-ulps), and every ISA variant
 * against the scalar reference (same rounding points; only the q·k summation order differs, so
 * 1e-5 in f32 mode and 2 f16 ulps of the accumulator in f16 mode). Sizes: head sizes 8 (tail
 * path), 16, 64, 128, 80; T = 1, 2, 17, 64, 257; per call 1..8 query heads over 1..4 kv heads
 * (grouped-query attention, rep query heads per kv head), every head checked on its own. The
 * soft-capped variant (gemma2) against the direct computation with the cap.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <cmocka.h>

#include "core/fp16.h"
#include "kern/kern.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

/* softmax(q . K) V in double for one head whose K / V rows are ld halves apart; cap > 0: scores
 * soft-capped, cap * tanh(s / cap) */
static void direct_cap(int64_t hd, int64_t T, const float *q, const uint16_t *K, const uint16_t *V, int64_t ld,
                       float scale, double cap, double *out) {
    double *s = malloc((size_t)T * sizeof *s), mx = -1e300, sum = 0;
    for (int64_t t = 0; t < T; t++) {
        double d = 0;
        for (int64_t i = 0; i < hd; i++) d += (double)q[i] * tn_fp16_to_fp32(K[t * ld + i]);
        s[t] = d * scale;
        if (cap > 0) s[t] = cap * tanh(s[t] / cap);
        if (s[t] > mx) mx = s[t];
    }
    for (int64_t t = 0; t < T; t++) sum += (s[t] = exp(s[t] - mx));
    for (int64_t i = 0; i < hd; i++) {
        double a = 0;
        for (int64_t t = 0; t < T; t++) a += s[t] / sum * tn_fp16_to_fp32(V[t * ld + i]);
        out[i] = a;
    }
    free(s);
}

static void direct(int64_t hd, int64_t T, const float *q, const uint16_t *K, const uint16_t *V, int64_t ld, float scale,
                   double *out) {
    direct_cap(hd, T, q, K, V, ld, scale, 0.0, out);
}

static void test_attn(void **state) {
    (void)state;
    const int64_t hds[] = {8, 16, 32, 48, 64, 80, 128}, Ts[] = {1, 2, 17, 64, 257};
    const int64_t cfg[][2] = {{1, 1}, {4, 4}, {4, 1}, {3, 1}, {2, 2}, {8, 4}, {6, 2}, {3, 3}, {16, 2}, {12, 12}, {11, 1}}; /* nh, rep */
    uint64_t seed = 1;
    const tn_kern_table *ref = tn_kern_at(TN_ISA_SCALAR);
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
        for (size_t b = 0; b < sizeof Ts / sizeof Ts[0]; b++)
            for (size_t g = 0; g < sizeof cfg / sizeof cfg[0]; g++) {
                const int64_t hd = hds[a], T = Ts[b], nh = cfg[g][0], rep = cfg[g][1], nkv = (nh + rep - 1) / rep;
                const int64_t ld = nkv * hd;
                float *q = malloc((size_t)(nh * hd) * 4), *o_ref = malloc((size_t)(nh * hd) * 4);
                float *o = malloc((size_t)(nh * hd) * 4), *scr = malloc((size_t)(nh * hd) * 8);
                uint16_t *K = malloc((size_t)(T * ld) * 2), *V = malloc((size_t)(T * ld) * 2);
                double *want = malloc((size_t)(nh * hd) * 8);
                for (int64_t i = 0; i < nh * hd; i++) q[i] = 2.0f * frand(&seed);
                for (int64_t i = 0; i < T * ld; i++) K[i] = tn_fp32_to_fp16(frand(&seed)), V[i] = tn_fp32_to_fp16(frand(&seed));
                const float scale = 1.0f / sqrtf((float)hd);
                for (int64_t j = 0; j < nh; j++) direct(hd, T, q + j * hd, K + (j / rep) * hd, V + (j / rep) * hd, ld, scale, want + j * hd);
                for (int acc16 = 0; acc16 <= 1; acc16++) {
                    ref->attn(hd, T, nh, rep, q, K, V, ld, NULL, 0, scale, acc16, o_ref, scr);
                    for (int64_t i = 0; i < nh * hd; i++) {
                        double tol = acc16 ? ldexp(sqrt((double)T + 1), -10) : 1e-5 * (fabs(want[i]) + 0.05);
                        if (fabs(o_ref[i] - want[i]) > tol)
                            fail_msg("scalar hd=%lld T=%lld nh=%lld rep=%lld acc16=%d [%lld]: %g vs %g", (long long)hd,
                                     (long long)T, (long long)nh, (long long)rep, acc16, (long long)i, o_ref[i], want[i]);
                    }
                    for (int isa = TN_ISA_AVX2; isa < TN_ISA_COUNT; isa++) {
                        const tn_kern_table *kt = tn_kern_at((tn_isa)isa);
                        if (!kt) continue;
                        kt->attn(hd, T, nh, rep, q, K, V, ld, NULL, 0, scale, acc16, o, scr);
                        for (int64_t i = 0; i < nh * hd; i++) {
                            double tol = acc16 ? ldexp(sqrt((double)T + 1), -10) : 1e-5 * (fabs(o_ref[i]) + 0.05);
                            if (fabs(o[i] - o_ref[i]) > tol)
                                fail_msg("%s hd=%lld T=%lld nh=%lld rep=%lld acc16=%d [%lld]: %g vs scalar %g",
                                         tn_isa_name((tn_isa)isa), (long long)hd, (long long)T, (long long)nh,
                                         (long long)rep, acc16, (long long)i, o[i], o_ref[i]);
                        }
                    }
                }
                free(q), free(o_ref), free(o), free(scr), free(K), free(V), free(want);
            }
}

/* A paged cache (blocks of 4 rows placed in reverse order) gives exactly the contiguous result,
 * for one head and for four query heads over two kv heads, soft-capped or not. */
static void test_attn_paged(void **state) {
    (void)state;
    const int64_t hd = 64, T = 37, B = 4, nblk = (T + B - 1) / B, ld = 2 * hd;
    uint64_t seed = 9;
    float q[4 * 64], o1[4 * 64], o2[4 * 64], scr[8 * 64];
    uint16_t *K = malloc((size_t)(nblk * B * ld) * 2), *V = malloc((size_t)(nblk * B * ld) * 2);
    uint16_t *Kp = malloc((size_t)(nblk * B * ld) * 2), *Vp = malloc((size_t)(nblk * B * ld) * 2);
    int32_t blocks[16];
    for (int64_t j = 0; j < nblk; j++) blocks[j] = (int32_t)(nblk - 1 - j);
    for (int64_t i = 0; i < 4 * hd; i++) q[i] = frand(&seed);
    for (int64_t t = 0; t < nblk * B; t++)
        for (int64_t i = 0; i < ld; i++) {
            K[t * ld + i] = tn_fp32_to_fp16(frand(&seed));
            V[t * ld + i] = tn_fp32_to_fp16(frand(&seed));
            const int64_t row = (int64_t)blocks[t / B] * B + t % B;
            Kp[row * ld + i] = K[t * ld + i];
            Vp[row * ld + i] = V[t * ld + i];
        }
    for (int isa = 0; isa < TN_ISA_COUNT; isa++) {
        const tn_kern_table *kt = tn_kern_at((tn_isa)isa);
        if (!kt) continue;
        for (int acc16 = 0; acc16 <= 1; acc16++)
            for (int64_t nh = 1; nh <= 4; nh += 3) {
                kt->attn(hd, T, nh, 2, q, K, V, ld, NULL, 0, 0.125f, acc16, o1, scr);
                kt->attn(hd, T, nh, 2, q, Kp, Vp, ld, blocks, B, 0.125f, acc16, o2, scr);
                assert_memory_equal(o1, o2, (size_t)(nh * hd) * sizeof(float));
                kt->attn_softcap(hd, T, nh, 2, q, K, V, ld, NULL, 0, 0.125f, 0.5f, acc16, o1, scr); /* gemma2's */
                kt->attn_softcap(hd, T, nh, 2, q, Kp, Vp, ld, blocks, B, 0.125f, 0.5f, acc16, o2, scr);
                assert_memory_equal(o1, o2, (size_t)(nh * hd) * sizeof(float));
            }
    }
    free(K), free(V), free(Kp), free(Vp);
}

/* Soft-capped scores (gemma2), every table's kernel (the scalar reference, AVX-512's), against the direct
 * computation with the caps applied: caps 0.5 and 4 over scores up to ~4 (q of 4 * U(-1, 1),
 * scale 1 / sqrt(hd) * 4), so tanh saturates on some keys and not others; the same bounds as the
 * plain kernel. A cap far above the scores gives the plain kernel's output within 1e-4 (scores reach
 * ~15 here, and scale / cap * cap is rounded). */
static void test_attn_softcap(void **state) {
    (void)state;
    const int64_t hds[] = {64, 128, 80}, Ts[] = {1, 17, 257};
    uint64_t seed = 5;
    for (int isa = 0; isa < TN_ISA_COUNT; isa++) {
        const tn_kern_table *kt = tn_kern_at((tn_isa)isa);
        if (!kt) continue;
        assert_non_null(kt->attn_softcap);
        for (size_t a = 0; a < 3; a++)
            for (size_t b = 0; b < 3; b++) {
                const int64_t hd = hds[a], T = Ts[b], nh = 4, rep = 2, ld = 2 * hd;
                float *q = malloc((size_t)(nh * hd) * 4), *o = malloc((size_t)(nh * hd) * 4);
                float *o2 = malloc((size_t)(nh * hd) * 4), *scr = malloc((size_t)(nh * hd) * 8);
                uint16_t *K = malloc((size_t)(T * ld) * 2), *V = malloc((size_t)(T * ld) * 2);
                double *want = malloc((size_t)(nh * hd) * 8);
                for (int64_t i = 0; i < nh * hd; i++) q[i] = 4.0f * frand(&seed);
                for (int64_t i = 0; i < T * ld; i++) K[i] = tn_fp32_to_fp16(frand(&seed)), V[i] = tn_fp32_to_fp16(frand(&seed));
                const float scale = 4.0f / sqrtf((float)hd), caps[] = {0.5f, 4.0f};
                for (int c = 0; c < 2; c++) {
                    for (int64_t j = 0; j < nh; j++)
                        direct_cap(hd, T, q + j * hd, K + (j / rep) * hd, V + (j / rep) * hd, ld, scale, caps[c], want + j * hd);
                    for (int acc16 = 0; acc16 <= 1; acc16++) {
                        kt->attn_softcap(hd, T, nh, rep, q, K, V, ld, NULL, 0, scale, caps[c], acc16, o, scr);
                        for (int64_t i = 0; i < nh * hd; i++) {
                            double tol = acc16 ? ldexp(sqrt((double)T + 1), -10) : 1e-5 * (fabs(want[i]) + 0.05);
                            if (fabs(o[i] - want[i]) > tol)
                                fail_msg("%s softcap %g hd=%lld T=%lld acc16=%d [%lld]: %g vs %g", tn_isa_name((tn_isa)isa),
                                         caps[c], (long long)hd, (long long)T, acc16, (long long)i, o[i], want[i]);
                        }
                    }
                }
                kt->attn_softcap(hd, T, nh, rep, q, K, V, ld, NULL, 0, scale, 1e6f, false, o, scr);
                kt->attn(hd, T, nh, rep, q, K, V, ld, NULL, 0, scale, false, o2, scr);
                for (int64_t i = 0; i < nh * hd; i++)
                    if (fabs(o[i] - o2[i]) > 1e-4 * (fabs(o2[i]) + 0.05)) /* scale / cap * cap: float rounding */
                        fail_msg("%s cap 1e6 hd=%lld T=%lld [%lld]: %g vs plain %g", tn_isa_name((tn_isa)isa), (long long)hd,
                                 (long long)T, (long long)i, o[i], o2[i]);
                free(q), free(o), free(o2), free(scr), free(K), free(V), free(want);
            }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_attn), cmocka_unit_test(test_attn_paged),
                                       cmocka_unit_test(test_attn_softcap)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
