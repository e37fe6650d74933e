/*
 * bench_tq.c — decode GEMV speed of tern's any-bit types per bit width: y = W x for a
 * 4096 x 4096 matrix cycled through a DRAM-sized working set (like decode), one thread, in GB/s
 * of weights read, next to a streaming read of the same bytes (the roofline). Not a test (no
 * thresholds). Usage: bench_tq [--group G] [--sym] [--isa scalar|avx2|avx512] [--mb MB]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kern/kern.h"
#include "quant/quant.h"
#include "quant/tq.h"

static volatile uint64_t tn_bench_sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int group = 64, asym = 1;
    tn_isa isa = tn_cpu_isa();
    int64_t mb = 256;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--group") && i + 1 < argc) group = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sym")) asym = 0;
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *s = argv[++i];
            isa = !strcmp(s, "scalar") ? TN_ISA_SCALAR : !strcmp(s, "avx2") ? TN_ISA_AVX2 : TN_ISA_AVX512;
        }
    }
    const tn_kern_table *kt = tn_kern_at(isa);
    if (!kt) return fprintf(stderr, "ISA not available\n"), 1;
    const int64_t m = 4096, k = 4096;
    block_q8_0 *xq = malloc(sizeof(block_q8_0) * (k / 32));
    float *x = malloc(sizeof(float) * k), *y = malloc(sizeof(float) * m);
    for (int64_t i = 0; i < k; i++) x[i] = (float)((i * 7919) % 200 - 100) / 100.0f;
    tn_quantize_row_q8_0_ref(x, xq, k);
    printf("tq GEMV %lldx%lld, group %d %s, isa %s, 1 thread, working set %lld MB\n", (long long)m, (long long)k, group,
           asym ? "asym" : "sym", tn_isa_name(isa), (long long)mb);
    printf("%-10s %6s %10s %12s %10s\n", "type", "bpw", "GB/s", "read GB/s", "% roof");
    for (int b = 1; b <= 8; b++) {
        tn_tq_params p = {b, group, asym};
        const uint32_t t = tn_tq_dtype(&p);
        const size_t rb = tn_dtype_row_size((tn_dtype)t, k), mat = rb * (size_t)m;
        const size_t ncopy = (size_t)(mb << 20) / mat + 1;
        uint8_t *w = malloc(mat * ncopy);
        for (size_t i = 0; i < mat * ncopy; i++) w[i] = (uint8_t)(i * 2654435761u >> 13);
        for (size_t r = 0; r < (size_t)m * ncopy; r++) { /* finite scales */
            for (int64_t g = 0; g < k / group; g++) {
                uint8_t *blk = w + r * rb + (size_t)g * tn_tq_block_bytes(&p);
                blk[1] = 0x1c, blk[3] = 0x1c;
            }
        }
        double best = 1e9, bestr = 1e9;
        for (int it = 0; it < 3 * (int)ncopy; it++) {
            const uint8_t *wm = w + (size_t)(it % ncopy) * mat;
            double t0 = now();
            kt->slot[t].gemm(k, m, 1, wm, rb, xq, sizeof(block_q8_0) * (k / 32), y, m);
            double t1 = now();
            if (t1 - t0 < best) best = t1 - t0;
            const uint64_t *u = (const uint64_t *)(w + (size_t)((it + 1) % ncopy) * mat);
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            t0 = now();
            for (size_t i = 0; i + 4 <= mat / 8; i += 4) s0 += u[i], s1 += u[i + 1], s2 += u[i + 2], s3 += u[i + 3];
            t1 = now();
            tn_bench_sink += s0 + s1 + s2 + s3; /* keeps the read loop */
            if (t1 - t0 < bestr) bestr = t1 - t0;
        }
        const double gbs = mat / best / 1e9, rgbs = mat / bestr / 1e9;
        char nm[32];
        tn_tq_name(&p, nm, sizeof nm);
        printf("%-10s %6.3f %10.1f %12.1f %9.0f%%\n", nm, 8.0 * rb / k, gbs, rgbs, 100 * gbs / rgbs);
        free(w);
    }
    free(xq), free(x), free(y);
    return 0;
}
