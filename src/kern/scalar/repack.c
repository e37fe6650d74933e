/*
 * repack.c (scalar) — reference tile product for the load-time q4_0_r16 layout (quant/repack.h):
 * the q4_0 reference dot (vec_dot.c: exact integer block sums, then (sumi * dw) * dx in ggml's
 * order) with each row's codes and scale read out of the interleaved chunks, so its results equal
 * the q4_0 reference on the original rows bit for bit.
 */
#include "kern/scalar/kernels.h"
#include "quant/blocks.h"
#include "quant/repack.h"

void tn_k_gemm_q4_0_r16_q8_0__scalar(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                     size_t x_rb, float *y, int64_t ldy) {
    const int64_t nb = k / QK4_0;
    for (int64_t j = 0; j < n; j++) {
        const block_q8_0 *xb = (const block_q8_0 *)((const uint8_t *)x + (size_t)j * x_rb);
        for (int64_t i = 0; i < m; i++) {
            const uint8_t *grp = (const uint8_t *)w + (size_t)(i / TN_R16_ROWS) * TN_R16_ROWS * w_rb;
            const int r = (int)(i % TN_R16_ROWS);
            float sumf = 0;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *c = grp + (size_t)b * TN_R16_CHUNK;
                int sumi = 0;
                for (int t = 0; t < 4; t++)
                    for (int e = 0; e < 4; e++) {
                        const uint8_t q = c[32 + 64 * t + 4 * r + e];
                        sumi += ((q & 0x0F) - 8) * xb[b].qs[4 * t + e];
                        sumi += ((q >> 4) - 8) * xb[b].qs[16 + 4 * t + e];
                    }
                const tn_fp16 dw = (tn_fp16)(c[2 * r] | c[2 * r + 1] << 8);
                sumf += sumi * tn_fp16_to_fp32(dw) * tn_fp16_to_fp32(xb[b].d);
            }
            y[j * ldy + i] = sumf;
        }
    }
}
