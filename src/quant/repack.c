/*
 * repack.c — see repack.h.
 */
#include <string.h>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/repack.h"
#include "quant/tq.h"

tn_dtype tn_r16_type_of(tn_dtype t) {
    if (t == TN_Q4_0) return TN_Q4_0_R16;
    if (!tn_tq_is(t)) return (tn_dtype)0;
    tn_tq_params p;
    tn_tq_params_of(t, &p);
    if (p.bits != 4 || p.asym) return (tn_dtype)0;
    return p.group == 32 ? TN_TQ4G32_R16 : p.group == 64 ? TN_TQ4G64_R16 : p.group == 128 ? TN_TQ4G128_R16 : TN_TQ4G256_R16;
}

tn_dtype tn_r16_file_type(tn_dtype t) {
    if (t == TN_Q4_0_R16) return TN_Q4_0;
    if (t < TN_TQ4G32_R16 || t > TN_TQ4G256_R16) return (tn_dtype)0;
    tn_tq_params p = {4, 32 << (t - TN_TQ4G32_R16), false};
    return (tn_dtype)tn_tq_dtype(&p);
}

int tn_r16_group(tn_dtype t) { return (int)tn_dtype_get(t)->blck_size; }

/* file block of type ft: bytes, and the offset of its codes (after the fp16 d) */
static size_t tn_r16_block_bytes(tn_dtype ft) { return tn_dtype_get(ft)->type_size; }

void tn_repack_r16(tn_dtype ft, const void *src, void *dst, int64_t m, int64_t k) {
    const int64_t G = tn_dtype_get(ft)->blck_size, nc = k / G, S = G / 32;
    const size_t bb = tn_r16_block_bytes(ft), cb = 32 + (size_t)G * 8;
    const uint8_t *s = src;
    uint8_t *d = dst;
    for (int64_t g = 0; g < m / TN_R16_ROWS; g++)
        for (int64_t c = 0; c < nc; c++) {
            uint8_t *ch = d + (size_t)(g * nc + c) * cb;
            for (int r = 0; r < TN_R16_ROWS; r++) {
                const uint8_t *blk = s + ((size_t)(g * TN_R16_ROWS + r) * (size_t)nc + (size_t)c) * bb;
                memcpy(ch + 2 * r, blk, 2);
                for (int64_t p = 0; p < S; p++)
                    for (int t = 0; t < 4; t++) memcpy(ch + 32 + 256 * p + 64 * t + 4 * r, blk + 2 + 16 * p + 4 * t, 4);
            }
        }
}

/* Block c of row r (in the group whose chunks start at c0) in the file type's bytes. */
static void tn_r16_get_block(const uint8_t *ch, int r, int64_t S, uint8_t *blk) {
    memcpy(blk, ch + 2 * r, 2);
    for (int64_t p = 0; p < S; p++)
        for (int t = 0; t < 4; t++) memcpy(blk + 2 + 16 * p + 4 * t, ch + 32 + 256 * p + 64 * t + 4 * r, 4);
}

void tn_unpack_row_r16(tn_dtype it, const void *w, int64_t k, int64_t i, void *row) {
    const tn_dtype ft = tn_r16_file_type(it);
    const int64_t G = tn_dtype_get(ft)->blck_size, nc = k / G, g = i / TN_R16_ROWS;
    const size_t bb = tn_r16_block_bytes(ft), cb = 32 + (size_t)G * 8;
    const uint8_t *c0 = (const uint8_t *)w + (size_t)(g * nc) * cb;
    for (int64_t c = 0; c < nc; c++)
        tn_r16_get_block(c0 + (size_t)c * cb, (int)(i % TN_R16_ROWS), G / 32, (uint8_t *)row + (size_t)c * bb);
}

void tn_dequantize_row_r16(tn_dtype it, const void *w, int64_t k, int64_t i, float *out) {
    const tn_dtype ft = tn_r16_file_type(it);
    const int64_t G = tn_dtype_get(ft)->blck_size, nc = k / G, g = i / TN_R16_ROWS;
    const size_t cb = 32 + (size_t)G * 8;
    const uint8_t *c0 = (const uint8_t *)w + (size_t)(g * nc) * cb;
    tn_tq_params p;
    if (ft != TN_Q4_0) tn_tq_params_of(ft, &p);
    uint8_t blk[2 + 128];
    for (int64_t c = 0; c < nc; c++) { /* block by block through the file type's dequantizer */
        tn_r16_get_block(c0 + (size_t)c * cb, (int)(i % TN_R16_ROWS), G / 32, blk);
        if (ft == TN_Q4_0) (void)tn_dequantize_row(TN_Q4_0, blk, out + c * G, G);
        else tn_tq_dequantize_row(&p, blk, out + c * G, G);
    }
}
