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

/* ---- l32: tq1 with 32 rows interleaved ---- */

tn_dtype tn_l32_type_of(tn_dtype t) {
    if (!tn_tq_is(t)) return (tn_dtype)0;
    tn_tq_params p;
    tn_tq_params_of(t, &p);
    if (p.bits != 1) return (tn_dtype)0;
    return (tn_dtype)(TN_TQ1G32_L32 + (t - TN_DTYPE_TERN_BASE)); /* tq1 ids are the first 8 */
}

tn_dtype tn_l32_file_type(tn_dtype t) {
    if (t < TN_TQ1G32_L32 || t > TN_TQ1G256A_L32) return (tn_dtype)0;
    return (tn_dtype)(TN_DTYPE_TERN_BASE + (t - TN_TQ1G32_L32));
}

/* Position of row r among the 32 scales of a chunk: even rows first, then odd rows. */
static int tn_l32_hpos(int r) { return (r % 2) * 16 + r / 2; }

/* Byte offsets inside a chunk of the l32 layout, for row r: its d, its m (asym), and the word of
 * piece s, half h of its codes. hs = header bytes of a file block (2 or 4). */
static size_t tn_l32_d_at(int r) { return 2 * (size_t)tn_l32_hpos(r); }
static size_t tn_l32_m_at(int r) { return 64 + 2 * (size_t)tn_l32_hpos(r); }
static size_t tn_l32_word_at(int hs, int64_t s, int h, int r) { return 32 * (size_t)hs + 128 * (size_t)s + 64 * (size_t)h + 2 * (size_t)r; }

/* File block blk (G codes, asym: 4-byte header) -> row r of chunk ch. */
static void tn_l32_put_block(uint8_t *ch, int r, int64_t G, bool asym, const uint8_t *blk) {
    const int hs = asym ? 4 : 2;
    memcpy(ch + tn_l32_d_at(r), blk, 2);
    if (asym) memcpy(ch + tn_l32_m_at(r), blk + 2, 2);
    for (int64_t s = 0; s < G / 32; s++)
        for (int h = 0; h < 2; h++) memcpy(ch + tn_l32_word_at(hs, s, h, r), blk + hs + 4 * s + 2 * h, 2);
}

/* Row r of chunk ch -> file block blk. */
static void tn_l32_get_block(const uint8_t *ch, int r, int64_t G, bool asym, uint8_t *blk) {
    const int hs = asym ? 4 : 2;
    memcpy(blk, ch + tn_l32_d_at(r), 2);
    if (asym) memcpy(blk + 2, ch + tn_l32_m_at(r), 2);
    for (int64_t s = 0; s < G / 32; s++)
        for (int h = 0; h < 2; h++) memcpy(blk + hs + 4 * s + 2 * h, ch + tn_l32_word_at(hs, s, h, r), 2);
}

void tn_repack_l32(tn_dtype ft, const void *src, void *dst, int64_t m, int64_t k) {
    tn_tq_params p;
    tn_tq_params_of(ft, &p);
    const int64_t nc = k / p.group;
    const size_t bb = tn_tq_block_bytes(&p), cb = TN_L32_ROWS * bb;
    for (int64_t g = 0; g < m / TN_L32_ROWS; g++)
        for (int64_t c = 0; c < nc; c++)
            for (int r = 0; r < TN_L32_ROWS; r++)
                tn_l32_put_block((uint8_t *)dst + (size_t)(g * nc + c) * cb, r, p.group, p.asym,
                                 (const uint8_t *)src + ((size_t)(g * TN_L32_ROWS + r) * (size_t)nc + (size_t)c) * bb);
}

void tn_unpack_block_l32(tn_dtype it, const void *chunk, int r, void *blk) {
    tn_tq_params p;
    tn_tq_params_of(tn_l32_file_type(it), &p);
    tn_l32_get_block(chunk, r, p.group, p.asym, blk);
}

void tn_unpack_row_l32(tn_dtype it, const void *w, int64_t k, int64_t i, void *row) {
    tn_tq_params p;
    tn_tq_params_of(tn_l32_file_type(it), &p);
    const int64_t nc = k / p.group, g = i / TN_L32_ROWS;
    const size_t bb = tn_tq_block_bytes(&p), cb = TN_L32_ROWS * bb;
    const uint8_t *c0 = (const uint8_t *)w + (size_t)(g * nc) * cb;
    for (int64_t c = 0; c < nc; c++)
        tn_l32_get_block(c0 + (size_t)c * cb, (int)(i % TN_L32_ROWS), p.group, p.asym, (uint8_t *)row + (size_t)c * bb);
}

/* ---- every load-time layout ---- */

tn_dtype tn_repack_type_of(tn_dtype t) {
    const tn_dtype r = tn_r16_type_of(t);
    return r ? r : tn_l32_type_of(t);
}

tn_dtype tn_repack_file_type(tn_dtype it) {
    const tn_dtype r = tn_r16_file_type(it);
    return r ? r : tn_l32_file_type(it);
}

int tn_repack_rows(tn_dtype it) { return tn_r16_file_type(it) ? TN_R16_ROWS : tn_l32_file_type(it) ? TN_L32_ROWS : 0; }

void tn_repack(tn_dtype ft, const void *src, void *dst, int64_t m, int64_t k) {
    if (tn_r16_type_of(ft)) tn_repack_r16(ft, src, dst, m, k);
    else tn_repack_l32(ft, src, dst, m, k);
}

void tn_unpack_row(tn_dtype it, const void *w, int64_t k, int64_t i, void *row) {
    if (tn_r16_file_type(it)) tn_unpack_row_r16(it, w, k, i, row);
    else tn_unpack_row_l32(it, w, k, i, row);
}

void tn_dequantize_row_repacked(tn_dtype it, const void *w, int64_t k, int64_t i, float *out) {
    if (tn_r16_file_type(it)) {
        tn_dequantize_row_r16(it, w, k, i, out);
        return;
    }
    tn_tq_params p;
    tn_tq_params_of(tn_l32_file_type(it), &p);
    const int64_t nc = k / p.group, g = i / TN_L32_ROWS;
    const size_t cb = TN_L32_ROWS * tn_tq_block_bytes(&p);
    uint8_t blk[36]; /* the largest tq1 block: tq1g256a */
    for (int64_t c = 0; c < nc; c++) { /* block by block through the file type's dequantizer */
        tn_l32_get_block((const uint8_t *)w + (size_t)(g * nc + c) * cb, (int)(i % TN_L32_ROWS), p.group, p.asym, blk);
        tn_tq_dequantize_row(&p, blk, out + c * p.group, p.group);
    }
}
