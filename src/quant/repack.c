/*
 * repack.c — see repack.h.
 */
#include <string.h>

#include "quant/blocks.h"
#include "quant/repack.h"

void tn_repack_q4_0_r16(const void *src, void *dst, int64_t m, int64_t k) {
    const int64_t nb = k / QK4_0;
    const block_q4_0 *s = src;
    uint8_t *d = dst;
    for (int64_t g = 0; g < m / TN_R16_ROWS; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *c = d + (size_t)(g * nb + b) * TN_R16_CHUNK;
            for (int r = 0; r < TN_R16_ROWS; r++) {
                const block_q4_0 *blk = &s[(g * TN_R16_ROWS + r) * nb + b];
                memcpy(c + 2 * r, &blk->d, 2);
                for (int t = 0; t < 4; t++) memcpy(c + 32 + 64 * t + 4 * r, blk->qs + 4 * t, 4);
            }
        }
}

void tn_unpack_row_q4_0_r16(const void *w, int64_t k, int64_t i, void *row) {
    const int64_t nb = k / QK4_0, g = i / TN_R16_ROWS;
    const int r = (int)(i % TN_R16_ROWS);
    const uint8_t *c0 = (const uint8_t *)w + (size_t)(g * nb) * TN_R16_CHUNK;
    block_q4_0 *o = row;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c = c0 + (size_t)b * TN_R16_CHUNK;
        memcpy(&o[b].d, c + 2 * r, 2);
        for (int t = 0; t < 4; t++) memcpy(o[b].qs + 4 * t, c + 32 + 64 * t + 4 * r, 4);
    }
}

void tn_dequantize_row_q4_0_r16(const void *w, int64_t k, int64_t i, float *out) {
    const int64_t nb = k / QK4_0, g = i / TN_R16_ROWS;
    const int r = (int)(i % TN_R16_ROWS);
    const uint8_t *c0 = (const uint8_t *)w + (size_t)(g * nb) * TN_R16_CHUNK;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c = c0 + (size_t)b * TN_R16_CHUNK;
        const float d = tn_fp16_to_fp32((tn_fp16)(c[2 * r] | c[2 * r + 1] << 8));
        for (int t = 0; t < 4; t++)
            for (int e = 0; e < 4; e++) {
                const uint8_t q = c[32 + 64 * t + 4 * r + e];
                out[b * QK4_0 + 4 * t + e] = ((q & 0x0F) - 8) * d;
                out[b * QK4_0 + 16 + 4 * t + e] = ((q >> 4) - 8) * d;
            }
    }
}
