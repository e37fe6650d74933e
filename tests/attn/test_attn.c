/*
 * test_attn.c — the attention kernel: the scalar reference against a direct double-precision
 * softmax(q·K)·V (bounds: f32 mode 1e-5 relative; f16 mode, where q and the accumulator are
 * rounded to f16 after every update, 4e-3 relative ≈ 8 half-ulps), and every ISA variant
 * against the scalar reference (same rounding points; only the q·k summation order differs, so
 * 1e-5 in f32 mode and 2 f16 ulps of the accumulator in f16 mode). Sizes: head sizes 8 (tail
 * path), 16, 64, 128, 80; T = 1, 2, 17, 64, 257.
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

static void direct(int64_t hd, int64_t T, const float *q, const uint16_t *K, const uint16_t *V, float scale, double *out) {
    double *s = malloc((size_t)T * sizeof *s), mx = -1e300, sum = 0;
    for (int64_t t = 0; t < T; t++) {
        double d = 0;
        for (int64_t i = 0; i < hd; i++) d += (double)q[i] * tn_fp16_to_fp32(K[t * hd + i]);
        s[t] = d * scale;
        if (s[t] > mx) mx = s[t];
    }
    for (int64_t t = 0; t < T; t++) sum += (s[t] = exp(s[t] - mx));
    for (int64_t i = 0; i < hd; i++) {
        double a = 0;
        for (int64_t t = 0; t < T; t++) a += s[t] / sum * tn_fp16_to_fp32(V[t * hd + i]);
        out[i] = a;
    }
    free(s);
}

static void test_attn(void **state) {
    (void)state;
    const int64_t hds[] = {8, 16, 64, 80, 128}, Ts[] = {1, 2, 17, 64, 257};
    uint64_t seed = 1;
    const tn_kern_table *ref = tn_kern_at(TN_ISA_SCALAR);
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 5; b++) {
            const int64_t hd = hds[a], T = Ts[b];
            float *q = malloc((size_t)hd * 4), *o_ref = malloc((size_t)hd * 4), *o = malloc((size_t)hd * 4), *scr = malloc((size_t)hd * 8);
            uint16_t *K = malloc((size_t)(T * hd) * 2), *V = malloc((size_t)(T * hd) * 2);
            double *want = malloc((size_t)hd * 8);
            for (int64_t i = 0; i < hd; i++) q[i] = 2.0f * frand(&seed);
            for (int64_t i = 0; i < T * hd; i++) K[i] = tn_fp32_to_fp16(frand(&seed)), V[i] = tn_fp32_to_fp16(frand(&seed));
            const float scale = 1.0f / sqrtf((float)hd);
            direct(hd, T, q, K, V, scale, want);
            for (int acc16 = 0; acc16 <= 1; acc16++) {
                ref->attn(hd, T, q, K, V, hd, NULL, 0, scale, acc16, o_ref, scr);
                for (int64_t i = 0; i < hd; i++) {
                    double tol = acc16 ? ldexp(sqrt((double)T + 1), -10) : 1e-5 * (fabs(want[i]) + 0.05);
                    if (fabs(o_ref[i] - want[i]) > tol)
                        fail_msg("scalar hd=%lld T=%lld acc16=%d [%lld]: %g vs %g", (long long)hd, (long long)T, acc16,
                                 (long long)i, o_ref[i], want[i]);
                }
                for (int isa = TN_ISA_AVX2; isa < TN_ISA_COUNT; isa++) {
                    const tn_kern_table *kt = tn_kern_at((tn_isa)isa);
                    if (!kt) continue;
                    kt->attn(hd, T, q, K, V, hd, NULL, 0, scale, acc16, o, scr);
                    for (int64_t i = 0; i < hd; i++) {
                        double tol = acc16 ? ldexp(sqrt((double)T + 1), -10) : 1e-5 * (fabs(o_ref[i]) + 0.05);
                        if (fabs(o[i] - o_ref[i]) > tol)
                            fail_msg("%s hd=%lld T=%lld acc16=%d [%lld]: %g vs scalar %g", tn_isa_name((tn_isa)isa),
                                     (long long)hd, (long long)T, acc16, (long long)i, o[i], o_ref[i]);
                    }
                }
            }
            free(q), free(o_ref), free(o), free(scr), free(K), free(V), free(want);
        }
}

/* A paged cache (blocks of 4 rows placed in reverse order) gives exactly the contiguous result. */
static void test_attn_paged(void **state) {
    (void)state;
    const int64_t hd = 64, T = 37, B = 4, nblk = (T + B - 1) / B;
    uint64_t seed = 9;
    float q[64], o1[64], o2[64], scr[128];
    uint16_t *K = malloc((size_t)(nblk * B * hd) * 2), *V = malloc((size_t)(nblk * B * hd) * 2);
    uint16_t *Kp = malloc((size_t)(nblk * B * hd) * 2), *Vp = malloc((size_t)(nblk * B * hd) * 2);
    int32_t blocks[16];
    for (int64_t j = 0; j < nblk; j++) blocks[j] = (int32_t)(nblk - 1 - j);
    for (int64_t i = 0; i < hd; i++) q[i] = frand(&seed);
    for (int64_t t = 0; t < nblk * B; t++)
        for (int64_t i = 0; i < hd; i++) {
            K[t * hd + i] = tn_fp32_to_fp16(frand(&seed));
            V[t * hd + i] = tn_fp32_to_fp16(frand(&seed));
            const int64_t row = (int64_t)blocks[t / B] * B + t % B;
            Kp[row * hd + i] = K[t * hd + i];
            Vp[row * hd + i] = V[t * hd + i];
        }
    for (int isa = 0; isa < TN_ISA_COUNT; isa++) {
        const tn_kern_table *kt = tn_kern_at((tn_isa)isa);
        if (!kt) continue;
        for (int acc16 = 0; acc16 <= 1; acc16++) {
            kt->attn(hd, T, q, K, V, hd, NULL, 0, 0.125f, acc16, o1, scr);
            kt->attn(hd, T, q, Kp, Vp, hd, blocks, B, 0.125f, acc16, o2, scr);
            assert_memory_equal(o1, o2, sizeof o1);
        }
    }
    free(K), free(V), free(Kp), free(Vp);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_attn), cmocka_unit_test(test_attn_paged)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
