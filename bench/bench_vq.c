/*
 * bench_vq.c — decode (n = 1) speed of tern's vq2 kernel against the 2-bit types next to it in the
 * same process: iq2_xxs, iq2_xs (ggml's codebook i-quants) and tq2g64a / tq2g256 (tern's any-bit),
 * each over an m x k matrix that stays in cache (so the kernels' compute, not memory, is timed),
 * one thread, at the CPU's best ISA. The types are timed alternately, each call on its own, best
 * of --reps; printed as ns per 256 weights and relative to vq2. Weights are random (vq2: a valid
 * layout with random indices and codebook, general and sign-symmetric ("vq2 sym": entry 128 + k =
 * -entry k, as tern quantize fits it; the kernel's faster path); others: random bytes with finite
 * fp16 scales). Nothing
 * here checks results: tests/quantize/test_vq.c does.
 *
 *   bench_vq [--m M] [--k K] [--reps R]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fp16.h"
#include "kern/kern.h"
#include "quant/vq.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 88172645463325252ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)g_rng;
}

/* m rows of type t (k weights) with finite scales; vq2 with its headers and codebook. */
static uint8_t *make(tn_dtype t, int64_t m, int64_t k, size_t *rb) {
    const tn_dtype_traits *tr = tn_dtype_get(t);
    *rb = tn_dtype_row_size(t, k);
    const size_t n = tn_vq_is(t) ? tn_dtype_tensor_size(t, k, m) : *rb * (size_t)m;
    uint8_t *w = malloc(n);
    for (size_t i = 0; i < n; i++) w[i] = (uint8_t)rnd();
    const size_t hdr = tn_vq_is(t) ? TN_VQ_HDR : 0;
    for (int64_t r = 0; r < m; r++) {
        uint8_t *row = w + (size_t)r * *rb;
        if (tn_vq_is(t)) {
            const uint32_t off = (uint32_t)((size_t)(m - r) * *rb);
            memcpy(row, &off, 4);
        }
        for (int64_t b = 0; b < k / tr->blck_size; b++) { /* fp16 d first in every one of these blocks */
            const tn_fp16 d = tn_fp32_to_fp16(0.01f);
            memcpy(row + hdr + (size_t)b * tr->type_size, &d, 2);
        }
    }
    return w;
}

int main(int argc, char **argv) {
    int64_t m = 256, k = 4096;
    int reps = 50;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--m")) m = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--k")) k = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    }
    if (m < 1 || k < 256 || k % 256 || reps < 1) {
        fprintf(stderr, "bench_vq: --m >= 1, --k a multiple of 256, --reps >= 1\n");
        return 64;
    }
    tn_dtype types[] = {TN_VQ2, TN_VQ2, TN_IQ2_XXS, TN_IQ2_XS, TN_TQ2_0, (tn_dtype)0, (tn_dtype)0};
    int nt = 5;
    if (tn_dtype_from_name("tq2g64a", &types[nt])) nt++;
    if (tn_dtype_from_name("tq2g256", &types[nt])) nt++;
    const tn_kern_table *kt = tn_kern();
    uint8_t *w[7], *x[7];
    size_t rb[7];
    double best[7];
    float *y = malloc(sizeof(float) * (size_t)m), *xf = malloc(sizeof(float) * (size_t)k);
    for (int64_t i = 0; i < k; i++) xf[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    for (int t = 0; t < nt; t++) {
        w[t] = make(types[t], m, k, &rb[t]);
        if (t == 1) { /* the sign-symmetric codebook */
            int8_t *cb = (int8_t *)w[t] + (size_t)m * rb[t];
            for (int p = 0; p < TN_VQ_DIM; p++)
                for (int e = 0; e < TN_VQ_K / 2; e++) {
                    if (cb[p * TN_VQ_K + e] == -128) cb[p * TN_VQ_K + e] = -127;
                    cb[p * TN_VQ_K + TN_VQ_K / 2 + e] = (int8_t)-cb[p * TN_VQ_K + e];
                }
        }
        const tn_dtype at = tn_dtype_get(types[t])->vec_dot_type;
        x[t] = malloc(tn_dtype_row_size(at, k));
        kt->slot[at].from_float(xf, x[t], k);
        best[t] = 1e30;
    }
    for (int r = 0; r < reps; r++)
        for (int t = 0; t < nt; t++) {
            const double t0 = now();
            kt->slot[types[t]].gemm(k, m, 1, w[t], rb[t], x[t], 0, y, m);
            const double dt = now() - t0;
            if (dt < best[t]) best[t] = dt;
        }
    printf("decode kernels, one thread, %lld x %lld (cache-resident), best of %d:\n", (long long)m, (long long)k, reps);
    for (int t = 0; t < nt; t++)
        printf("  %-8s %-7s %6.2f bpw  %7.1f ns / 256 weights  %5.2fx vq2's time\n", t == 1 ? "vq2 sym" : tn_dtype_name(types[t]),
               tn_isa_name(kt->slot[types[t]].gemm_isa), 8.0 * (double)rb[t] / (double)k,
               1e9 * best[t] / ((double)m * (double)k / 256), best[t] / best[0]);
    for (int t = 0; t < nt; t++) free(w[t]), free(x[t]);
    free(y), free(xf);
    return 0;
}
