/*
 * test_attn_kc.c — per-channel K (quant/kc.h, the KIVI layout) and the attention kernel that reads
 * it (kern.h tn_attn_kc_fn):
 *   - the quantizer's bytes decoded by this file from the documented layout (8 stats bytes, then
 *     tq's bit planes, written out here: width 4 / 2 / 1, widest plane the low bits), against
 *     codes and scales computed here from the documented rounding (per channel over the 16 rows:
 *     d = f16((max - min) / (2^b - 1)), m = f16(min), nearest code, clamped) — b = 2, 3, 4, with
 *     outlier channels and a constant channel; the reference dequantizer equals d q + m of those;
 *     every value within d / 2 (+ f16 rounding of m) of its input;
 *   - the scalar kernel against softmax(q . K) V in double: complete groups dequantized by this
 *     file, the open group's keys from an f16 window ring (garbage in its other rows), V f16 /
 *     q8_0; T = 1, 15, 16, 17, 40, 64; GQA; soft cap; acc16 — test_attn_q.c's bounds, with 3e-5 for
 *     its 1e-5 relative: these keys have outlier channels (up to 12 against 1), so the f32 scores'
 *     rounding is a few times larger;
 *   - every ISA's kernel (AVX-512: tn_aq_kc_group's q' = q d, q . m) against the reference, the
 *     same bounds; hd 32, 64, 128;
 *   - a paged cache (the blocks in reverse order) gives exactly the contiguous result, every ISA.
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
#include "quant/kc.h"
#include "quant/quant.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

static float h2f(uint16_t h) { return tn_fp16_to_fp32(h); }
static uint16_t f2h(float f) { return tn_fp32_to_fp16(f); }

/* The 32 codes of a chunk's planes (docs/formats.md, quant/tq.h): planes of width 4, 2, 1 (b = 2:
 * one of 2; 3: 2 then 1; 4: one of 4), the first plane the low bits. */
static void decode_planes(int bits, const uint8_t *p, uint8_t q[32]) {
    memset(q, 0, 32);
    int widths[2] = {bits == 3 ? 2 : bits, bits == 3 ? 1 : 0}, shift = 0;
    for (int pl = 0; pl < 2 && widths[pl]; pl++) {
        const int w = widths[pl];
        for (int i = 0; i < 32; i++) {
            int v;
            if (w == 4) v = (p[i % 16] >> (4 * (i / 16))) & 15;
            else if (w == 2) v = (p[i % 8] >> (2 * (i / 8))) & 3;
            else v = (p[i / 8] >> (i % 8)) & 1; /* bit i of the little-endian u32 */
            q[i] |= (uint8_t)(v << shift);
        }
        p += 4 * w;
        shift += w;
    }
}

/* Group of 16 rows of n values: codes and (d, m) decoded from the bytes as documented. */
static void decode_group(int bits, uint8_t *const rows[16], int64_t n, uint8_t *q, float *d, float *m) {
    const size_t cb = (size_t)(4 * bits + 8);
    for (int64_t j = 0; j < n / 32; j++)
        for (int r = 0; r < 16; r++) {
            const uint8_t *c = rows[r] + (size_t)j * cb;
            uint16_t st[4];
            memcpy(st, c, 8);
            d[j * 32 + 2 * r] = h2f(st[0]), m[j * 32 + 2 * r] = h2f(st[1]);
            d[j * 32 + 2 * r + 1] = h2f(st[2]), m[j * 32 + 2 * r + 1] = h2f(st[3]);
            decode_planes(bits, c + 8, q + r * n + j * 32);
        }
}

/* 16 x n keys with a few large channels (as keys have) and channel 5 constant. */
static void make_keys(float *x, int64_t n, uint64_t *seed) {
    for (int r = 0; r < 16; r++)
        for (int64_t i = 0; i < n; i++) {
            float v = frand(seed);
            if (i % 13 == 3) v = 8.0f * v + 4.0f; /* outlier channels */
            if (i == 5) v = 0.3125f;
            x[r * n + i] = v;
        }
}

static void test_kc_format(void **state) {
    (void)state;
    uint64_t seed = 7;
    const int64_t ns[] = {32, 64, 96, 256};
    for (int bits = 2; bits <= 4; bits++)
        for (size_t in = 0; in < sizeof ns / sizeof *ns; in++) {
            const int64_t n = ns[in];
            const size_t rb = tn_kc_row_bytes(bits, n);
            assert_int_equal(rb, (size_t)(n / 32) * (size_t)(4 * bits + 8)); /* b + 2 bits a value */
            float *x = malloc((size_t)(16 * n) * 4), *y = malloc((size_t)(16 * n) * 4), d[256], m[256];
            uint8_t *buf = malloc(16 * (rb + 8)), *rows[16], *q = malloc((size_t)(16 * n));
            memset(buf, 0xA5, 16 * (rb + 8));
            for (int r = 0; r < 16; r++) rows[r] = buf + (size_t)r * (rb + 8); /* 8 guard bytes after each row */
            make_keys(x, n, &seed);
            tn_kc_quantize_group(bits, x, n, n, rows);
            for (int r = 0; r < 16; r++)
                for (int g = 0; g < 8; g++) assert_int_equal(rows[r][rb + (size_t)g], 0xA5);
            decode_group(bits, rows, n, q, d, m);
            const int nmax = (1 << bits) - 1;
            for (int64_t c = 0; c < n; c++) {
                float mn = x[c], mx = x[c];
                for (int r = 1; r < 16; r++) mn = fminf(mn, x[r * n + c]), mx = fmaxf(mx, x[r * n + c]);
                const float wd = h2f(f2h((mx - mn) / (float)nmax)), wm = h2f(f2h(mn));
                if (d[c] != wd || m[c] != wm)
                    fail_msg("b=%d n=%lld channel %lld: d, m = %g, %g; want %g, %g", bits, (long long)n, (long long)c, d[c], m[c], wd, wm);
                for (int r = 0; r < 16; r++) {
                    long want = wd != 0 ? lrintf((x[r * n + c] - wm) / wd) : 0;
                    want = want < 0 ? 0 : want > nmax ? nmax : want;
                    const float diff = (float)want - (x[r * n + c] - wm) / wd;
                    /* 1/d rounds differently from a division only at exact halves */
                    if (q[r * n + c] != want && !(wd != 0 && fabsf(fabsf(diff) - 0.5f) < 1e-4f))
                        fail_msg("b=%d n=%lld row %d channel %lld: code %d, want %ld", bits, (long long)n, r, (long long)c,
                                 q[r * n + c], want);
                }
            }
            tn_kc_dequantize_group(bits, (const uint8_t *const *)rows, n, y, n);
            for (int r = 0; r < 16; r++)
                for (int64_t c = 0; c < n; c++) {
                    assert_true(y[r * n + c] == d[c] * (float)q[r * n + c] + m[c]);
                    const float err = fabsf(y[r * n + c] - x[r * n + c]);
                    const float bound = 0.5f * d[c] * 1.001f + fabsf(x[r * n + c]) * 2e-3f + 1e-6f;
                    if (err > bound) fail_msg("b=%d row %d channel %lld: |%g - %g| > %g", bits, r, (long long)c, y[r * n + c], x[r * n + c], bound);
                }
            assert_true(d[5] == 0.0f && m[5] == 0.3125f && y[5] == 0.3125f); /* constant channel: exact */
            float tc[32];
            tn_kc_chunk_stats((const uint8_t *const *)rows, bits, 0, tc, tc); /* smoke: no crash, same pointer */
            free(x), free(y), free(buf), free(q);
        }
}

/* softmax(q . K) V in double over T keys of hd values, keys t >= Q against qw instead of q (the
 * window's f16 keys see the query as rounded with acc16); cap > 0: cap * tanh(s / cap). */
static void direct(int64_t hd, int64_t T, int64_t Q, const double *q, const double *qw, const double *K, const double *V,
                   double scale, double cap, double *out) {
    double *s = malloc((size_t)T * sizeof *s), mx = -1e300, sum = 0;
    for (int64_t t = 0; t < T; t++) {
        double a = 0;
        for (int64_t i = 0; i < hd; i++) a += (t < Q ? q : qw)[i] * K[t * hd + i];
        s[t] = a * scale;
        if (cap > 0) s[t] = cap * tanh(s[t] / cap);
        if (s[t] > mx) mx = s[t];
    }
    for (int64_t t = 0; t < T; t++) sum += (s[t] = exp(s[t] - mx));
    for (int64_t i = 0; i < hd; i++) {
        double a = 0;
        for (int64_t t = 0; t < T; t++) a += s[t] / sum * V[t * hd + i];
        out[i] = a;
    }
    free(s);
}

typedef struct {
    int64_t hd, nkv, T, R, W; /* R: cache rows (whole groups), W: window rows */
    int bits;
    int32_t tv;
    size_t krb, vrb;
    uint8_t *K, *V;
    uint16_t *Kw;
    double *Kd, *Vd; /* [nkv][T][hd] the keys and values as the kernel must read them */
} kc_cache;

static kc_cache make(int bits, int32_t tv, int64_t hd, int64_t nkv, int64_t T, const int32_t *blocks, uint64_t *seed) {
    kc_cache c = {hd, nkv, T, (T + 15) / 16 * 16, 48, bits, tv, 0, 0, NULL, NULL, NULL, NULL, NULL};
    const int64_t ld = nkv * hd, Q = T - T % 16;
    c.krb = tn_kc_row_bytes(bits, ld);
    c.vrb = tv == TN_F16 ? (size_t)ld * 2 : (size_t)(ld / 32) * sizeof(block_q8_0);
    c.K = calloc((size_t)c.R, c.krb), c.V = calloc((size_t)c.R, c.vrb), c.Kw = malloc((size_t)(c.W * ld) * 2);
    c.Kd = malloc((size_t)(nkv * T * hd) * 8), c.Vd = malloc((size_t)(nkv * T * hd) * 8);
    for (int64_t i = 0; i < c.W * ld; i++) c.Kw[i] = f2h(100.0f); /* rows the kernel must not read */
    float *x = malloc((size_t)(16 * ld) * 4), *v = malloc((size_t)ld * 4), *vf = malloc((size_t)ld * 4);
    uint8_t *q = malloc((size_t)(16 * ld));
    float d[TN_KC_MAX_HD * 4], m[TN_KC_MAX_HD * 4];
    for (int64_t g = 0; g < c.R; g += 16) {
        make_keys(x, ld, seed);
        uint8_t *rows[16];
        for (int r = 0; r < 16; r++) rows[r] = c.K + (size_t)tn_kv_row(blocks, 16, g + r) * c.krb;
        if (g < Q) {
            tn_kc_quantize_group(bits, x, ld, ld, rows);
            decode_group(bits, rows, ld, q, d, m);
        }
        for (int r = 0; r < 16 && g + r < T; r++) {
            const int64_t t = g + r;
            for (int64_t i = 0; i < ld; i++) {
                double k;
                if (g < Q) k = (double)(d[i] * (float)q[r * ld + i] + m[i]);
                else c.Kw[(t % c.W) * ld + i] = f2h(x[r * ld + i]), k = h2f(f2h(x[r * ld + i]));
                c.Kd[((i / hd) * T + t) * hd + i % hd] = k;
            }
            for (int64_t i = 0; i < ld; i++) v[i] = frand(seed);
            uint8_t *vr = c.V + (size_t)tn_kv_row(blocks, 16, t) * c.vrb;
            if (tv == TN_F16)
                for (int64_t i = 0; i < ld; i++) ((uint16_t *)vr)[i] = f2h(v[i]), vf[i] = h2f(f2h(v[i]));
            else tn_quantize_row_q8_0_ref(v, (block_q8_0 *)vr, ld), tn_dequantize_row_q8_0((const block_q8_0 *)vr, vf, ld);
            for (int64_t i = 0; i < ld; i++) c.Vd[((i / hd) * T + t) * hd + i % hd] = vf[i];
        }
    }
    free(x), free(v), free(vf), free(q);
    return c;
}

static void drop(kc_cache *c) { free(c->K), free(c->V), free(c->Kw), free(c->Kd), free(c->Vd); }

static void test_attn_kc(void **state) {
    (void)state;
    const tn_kern_table *ref = tn_kern_at(TN_ISA_SCALAR);
    const int64_t hds[] = {32, 64, 128}, Ts[] = {1, 15, 16, 17, 40, 64};
    const int64_t cfg[][2] = {{1, 1}, {4, 2}, {3, 3}}; /* nh, rep */
    const int32_t vts[] = {TN_F16, TN_Q8_0};
    uint64_t seed = 5;
    for (int bits = 2; bits <= 4; bits++)
        for (int iv = 0; iv < 2; iv++)
            for (size_t a = 0; a < 3; a++)
                for (size_t b = 0; b < sizeof Ts / sizeof *Ts; b++)
                    for (size_t g = 0; g < 3; g++) {
                        const int64_t hd = hds[a], T = Ts[b], nh = cfg[g][0], rep = cfg[g][1], nkv = (nh + rep - 1) / rep;
                        const int32_t tv = vts[iv];
                        kc_cache c = make(bits, tv, hd, nkv, T, NULL, &seed);
                        float q[4 * 128], o[4 * 128], o2[4 * 128], scr[8 * 128];
                        double qd[128], qw[128], want[4 * 128];
                        for (int64_t i = 0; i < nh * hd; i++) q[i] = 2.0f * frand(&seed);
                        const float scale = 1.0f / sqrtf((float)hd);
                        for (int acc16 = 0; acc16 <= 1; acc16++)
                            for (int capped = 0; capped <= 1; capped++) {
                                const float cap = capped ? 0.5f : 0.0f;
                                ref->attn_kc(hd, T, nh, rep, q, bits, c.K, c.krb, c.Kw, nkv * hd, c.W, tv, c.V, c.vrb, NULL,
                                             scale, cap, acc16, o, scr);
                                for (int64_t j = 0; j < nh; j++) {
                                    for (int64_t i = 0; i < hd; i++)
                                        qd[i] = q[j * hd + i], qw[i] = acc16 ? h2f(f2h(q[j * hd + i])) : q[j * hd + i];
                                    direct(hd, T, T - T % 16, qd, qw, c.Kd + (j / rep) * T * hd, c.Vd + (j / rep) * T * hd, scale,
                                           cap, want + j * hd);
                                }
                                const bool f16acc = acc16 && tv == TN_F16;
                                for (int64_t i = 0; i < nh * hd; i++) {
                                    const double tol = f16acc ? ldexp(sqrt((double)T + 1), -10) : 3e-5 * (fabs(want[i]) + 0.05);
                                    if (fabs(o[i] - want[i]) > tol)
                                        fail_msg("tqc%d V %s hd=%lld T=%lld nh=%lld rep=%lld acc16=%d cap=%g [%lld]: %g vs %g", bits,
                                                 tn_dtype_name((uint32_t)tv), (long long)hd, (long long)T, (long long)nh,
                                                 (long long)rep, acc16, cap, (long long)i, o[i], want[i]);
                                }
                                /* every ISA's kernel against the reference, test_attn_q.c's bounds */
                                for (int isa = TN_ISA_AVX2; isa < TN_ISA_COUNT; isa++) {
                                    const tn_kern_table *kt = tn_kern_at((tn_isa)isa);
                                    if (!kt) continue;
                                    kt->attn_kc(hd, T, nh, rep, q, bits, c.K, c.krb, c.Kw, nkv * hd, c.W, tv, c.V, c.vrb, NULL,
                                                scale, cap, acc16, o2, scr);
                                    for (int64_t i = 0; i < nh * hd; i++) {
                                        const double tol = f16acc ? ldexp(sqrt((double)T + 1), -10) : 3e-5 * (fabs(o[i]) + 0.05);
                                        if (fabs(o2[i] - o[i]) > tol)
                                            fail_msg("%s tqc%d V %s hd=%lld T=%lld nh=%lld rep=%lld acc16=%d cap=%g [%lld]: %g vs scalar %g",
                                                     tn_isa_name((tn_isa)isa), bits, tn_dtype_name((uint32_t)tv), (long long)hd,
                                                     (long long)T, (long long)nh, (long long)rep, acc16, cap, (long long)i, o2[i], o[i]);
                                    }
                                }
                            }
                        drop(&c);
                    }
}

/* Blocks in reverse order: the same bits as the contiguous cache. */
static void test_attn_kc_paged(void **state) {
    (void)state;
    const tn_kern_table *ref = tn_kern_at(TN_ISA_SCALAR);
    const int64_t hd = 64, T = 53, nb = (T + 15) / 16;
    int32_t blocks[8];
    for (int64_t i = 0; i < nb; i++) blocks[i] = (int32_t)(nb - 1 - i);
    for (int bits = 2; bits <= 4; bits++) {
        uint64_t s1 = 9, s2 = 9;
        kc_cache a = make(bits, TN_F16, hd, 2, T, NULL, &s1), b = make(bits, TN_F16, hd, 2, T, blocks, &s2);
        float q[4 * 64], o1[4 * 64], o2[4 * 64], scr[8 * 64];
        for (int64_t i = 0; i < 4 * hd; i++) q[i] = frand(&s1);
        for (int isa = 0; isa < TN_ISA_COUNT; isa++) {
            const tn_kern_table *kt = isa ? tn_kern_at((tn_isa)isa) : ref;
            if (!kt) continue;
            kt->attn_kc(hd, T, 4, 2, q, bits, a.K, a.krb, a.Kw, 2 * hd, a.W, TN_F16, a.V, a.vrb, NULL, 0.125f, 0, true, o1, scr);
            kt->attn_kc(hd, T, 4, 2, q, bits, b.K, b.krb, b.Kw, 2 * hd, b.W, TN_F16, b.V, b.vrb, blocks, 0.125f, 0, true, o2, scr);
            assert_memory_equal(o1, o2, sizeof o1);
        }
        drop(&a), drop(&b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kc_format),
        cmocka_unit_test(test_attn_kc),
        cmocka_unit_test(test_attn_kc_paged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
