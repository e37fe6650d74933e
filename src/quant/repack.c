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
    if (t == TN_Q8_0) return TN_Q8_0_R16;
    if (!tn_tq_is(t)) return (tn_dtype)0;
    tn_tq_params p;
    tn_tq_params_of(t, &p);
    if (p.bits != 4 || p.asym) return (tn_dtype)0;
    return p.group == 32 ? TN_TQ4G32_R16 : p.group == 64 ? TN_TQ4G64_R16 : p.group == 128 ? TN_TQ4G128_R16 : TN_TQ4G256_R16;
}

tn_dtype tn_r16_file_type(tn_dtype t) {
    if (t == TN_Q4_0_R16) return TN_Q4_0;
    if (t == TN_Q8_0_R16) return TN_Q8_0;
    if (t < TN_TQ4G32_R16 || t > TN_TQ4G256_R16) return (tn_dtype)0;
    tn_tq_params p = {4, 32 << (t - TN_TQ4G32_R16), false};
    return (tn_dtype)tn_tq_dtype(&p);
}

/* Bytes of a file block of type ft; dwords of codes in it (after the fp16 d); bytes of the chunk
 * 16 such blocks become (repack.h); the byte XOR the layout applies (q8_0: + 128). */
static size_t tn_r16_block_bytes(tn_dtype ft) { return tn_dtype_get(ft)->type_size; }
static int64_t tn_r16_dwords(tn_dtype ft) { return (int64_t)(tn_r16_block_bytes(ft) - 2) / 4; }
static size_t tn_r16_chunk_bytes(tn_dtype ft) { return TN_R16_ROWS * tn_r16_block_bytes(ft); }
static uint32_t tn_r16_xor(tn_dtype ft) { return ft == TN_Q8_0 ? 0x80808080u : 0; }

void tn_repack_r16(tn_dtype ft, const void *src, void *dst, int64_t m, int64_t k) {
    const int64_t G = tn_dtype_get(ft)->blck_size, nc = k / G, D = tn_r16_dwords(ft);
    const size_t bb = tn_r16_block_bytes(ft), cb = tn_r16_chunk_bytes(ft);
    const uint32_t fx = tn_r16_xor(ft);
    const uint8_t *s = src;
    uint8_t *d = dst;
    for (int64_t g = 0; g < m / TN_R16_ROWS; g++)
        for (int64_t c = 0; c < nc; c++) {
            uint8_t *ch = d + (size_t)(g * nc + c) * cb;
            for (int r = 0; r < TN_R16_ROWS; r++) {
                const uint8_t *blk = s + ((size_t)(g * TN_R16_ROWS + r) * (size_t)nc + (size_t)c) * bb;
                memcpy(ch + 2 * r, blk, 2);
                for (int64_t u = 0; u < D; u++) {
                    uint32_t v;
                    memcpy(&v, blk + 2 + 4 * u, 4);
                    v ^= fx;
                    memcpy(ch + 32 + 64 * u + 4 * r, &v, 4);
                }
            }
        }
}

/* Block c of row r (in the group whose chunks start at c0) in the file type's bytes. */
static void tn_r16_get_block(const uint8_t *ch, int r, int64_t D, uint32_t fx, uint8_t *blk) {
    memcpy(blk, ch + 2 * r, 2);
    for (int64_t u = 0; u < D; u++) {
        uint32_t v;
        memcpy(&v, ch + 32 + 64 * u + 4 * r, 4);
        v ^= fx;
        memcpy(blk + 2 + 4 * u, &v, 4);
    }
}

void tn_unpack_row_r16(tn_dtype it, const void *w, int64_t k, int64_t i, void *row) {
    const tn_dtype ft = tn_r16_file_type(it);
    const int64_t G = tn_dtype_get(ft)->blck_size, nc = k / G, g = i / TN_R16_ROWS, D = tn_r16_dwords(ft);
    const size_t bb = tn_r16_block_bytes(ft), cb = tn_r16_chunk_bytes(ft);
    const uint8_t *c0 = (const uint8_t *)w + (size_t)(g * nc) * cb;
    for (int64_t c = 0; c < nc; c++)
        tn_r16_get_block(c0 + (size_t)c * cb, (int)(i % TN_R16_ROWS), D, tn_r16_xor(ft), (uint8_t *)row + (size_t)c * bb);
}

void tn_dequantize_row_r16(tn_dtype it, const void *w, int64_t k, int64_t i, float *out) {
    const tn_dtype ft = tn_r16_file_type(it);
    const int64_t G = tn_dtype_get(ft)->blck_size, nc = k / G, g = i / TN_R16_ROWS, D = tn_r16_dwords(ft);
    const size_t cb = tn_r16_chunk_bytes(ft);
    const uint8_t *c0 = (const uint8_t *)w + (size_t)(g * nc) * cb;
    tn_tq_params p;
    const bool tq = tn_tq_is(ft);
    if (tq) tn_tq_params_of(ft, &p);
    uint8_t blk[2 + 128];
    for (int64_t c = 0; c < nc; c++) { /* block by block through the file type's dequantizer */
        tn_r16_get_block(c0 + (size_t)c * cb, (int)(i % TN_R16_ROWS), D, tn_r16_xor(ft), blk);
        if (tq) tn_tq_dequantize_row(&p, blk, out + c * G, G);
        else (void)tn_dequantize_row(ft, blk, out + c * G, G);
    }
}
