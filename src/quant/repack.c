/*
 * repack.c — see repack.h.
 */
#include <pthread.h>
#include <string.h>

#include "core/cpu.h"
#include "quant/blocks.h"
#include "quant/iq_grid.h"
#include "quant/quant.h"
#include "quant/repack.h"
#include "quant/tq.h"

tn_dtype tn_r16_type_of(tn_dtype t) {
    if (t == TN_Q4_0) return TN_Q4_0_R16;
    if (t == TN_Q8_0) return TN_Q8_0_R16;
    if (t == TN_Q4_K) return TN_Q4_K_R16;
    if (t == TN_Q5_K) return TN_Q5_K_R16;
    if (t == TN_Q6_K) return TN_Q6_K_R16;
    if (t == TN_IQ4_XS) return TN_IQ4_XS_R16;
    if (t == TN_IQ4_NL) return TN_IQ4_NL_R16;
    if (t == TN_TQ2_0) return TN_TQ2_0_R16;
    if (t == TN_TQ1_0) return TN_TQ1_0_R16;
    if (!tn_tq_is(t)) return (tn_dtype)0;
    tn_tq_params p;
    tn_tq_params_of(t, &p);
    if (p.bits != 4 || p.asym) return (tn_dtype)0;
    return p.group == 32 ? TN_TQ4G32_R16 : p.group == 64 ? TN_TQ4G64_R16 : p.group == 128 ? TN_TQ4G128_R16 : TN_TQ4G256_R16;
}

tn_dtype tn_r16_file_type(tn_dtype t) {
    if (t == TN_Q4_0_R16) return TN_Q4_0;
    if (t == TN_Q8_0_R16) return TN_Q8_0;
    if (t == TN_Q4_K_R16) return TN_Q4_K;
    if (t == TN_Q5_K_R16) return TN_Q5_K;
    if (t == TN_Q6_K_R16) return TN_Q6_K;
    if (t == TN_IQ4_XS_R16) return TN_IQ4_XS;
    if (t == TN_IQ4_NL_R16) return TN_IQ4_NL;
    if (t == TN_TQ2_0_R16) return TN_TQ2_0;
    if (t == TN_TQ1_0_R16) return TN_TQ1_0;
    if (t < TN_TQ4G32_R16 || t > TN_TQ4G256_R16) return (tn_dtype)0;
    tn_tq_params p = {4, 32 << (t - TN_TQ4G32_R16), false};
    return (tn_dtype)tn_tq_dtype(&p);
}

/* Bytes of a file block of type ft; bytes of the chunk 16 such blocks become (repack.h: tq1_0's
 * are tq2_0's). */
static size_t tn_r16_block_bytes(tn_dtype ft) { return tn_dtype_get(ft)->type_size; }
static size_t tn_r16_chunk_bytes(tn_dtype ft) { return TN_R16_ROWS * tn_dtype_get(tn_r16_type_of(ft))->type_size; }

/* tq1_0 <-> tq2_0 blocks: the same d, each trit t (0..2, value t - 1) a 2-bit code. */
static void tn_tq1_to_tq2(const block_tq1_0 *b, block_tq2_0 *o) {
    uint8_t t[QK_K];
    tn_tq1_0_trits(b, t);
    memset(o->qs, 0, sizeof o->qs);
    for (int j = 0; j < (int)sizeof o->qs; j += 32) /* tq2_0: bits 2l of qs[j + m] = element 4j + 32l + m */
        for (int l = 0; l < 4; l++)
            for (int m = 0; m < 32; m++) o->qs[j + m] |= (uint8_t)(t[4 * j + 32 * l + m] << 2 * l);
    o->d = b->d;
}
/* The inverse of tn_tq1_to_tq2 for the bytes ggml's quantizer writes (a byte it never writes, 13
 * of the 256, has the same trits as one it does and comes back as that one). */
static void tn_tq2_to_tq1(const block_tq2_0 *b, block_tq1_0 *o) {
    uint8_t t[QK_K];
    for (int j = 0; j < (int)sizeof b->qs; j += 32)
        for (int l = 0; l < 4; l++)
            for (int m = 0; m < 32; m++) t[4 * j + 32 * l + m] = (uint8_t)(b->qs[j + m] >> 2 * l & 3);
    /* tn_tq1_0_trits' element order: qs[0..32) elements 32n + m, qs[32..48) 160 + 16n + m, qh 240 + 4n + j */
    for (int m = 0; m < 32; m++) o->qs[m] = tn_tq1_0_pack(t + m, 32, 5);
    for (int m = 0; m < 16; m++) o->qs[32 + m] = tn_tq1_0_pack(t + 160 + m, 16, 5);
    for (int j = 0; j < 4; j++) o->qh[j] = tn_tq1_0_pack(t + 240 + j, 4, 4);
    o->d = b->d;
}

/* n dwords of src -> dword r of n 64-byte registers at dst (XOR fx), and back. */
static void tn_r16_dw_put(uint8_t *dst, int r, const uint8_t *src, int64_t n, uint32_t fx) {
    for (int64_t u = 0; u < n; u++) {
        uint32_t v;
        memcpy(&v, src + 4 * u, 4);
        v ^= fx;
        memcpy(dst + 64 * u + 4 * r, &v, 4);
    }
}
static void tn_r16_dw_get(const uint8_t *src, int r, uint8_t *dst, int64_t n, uint32_t fx) {
    for (int64_t u = 0; u < n; u++) {
        uint32_t v;
        memcpy(&v, src + 64 * u + 4 * r, 4);
        v ^= fx;
        memcpy(dst + 4 * u, &v, 4);
    }
}

/* q4_K's 12 scale bytes <-> 6-bit scales sc[8] and mins mn[8] (ggml's get_scale_min_k4). */
static void tn_q4K_unpack_scales(const uint8_t *q, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 8; j++) tn_get_scale_min_k4(j, q, &sc[j], &mn[j]);
}
static void tn_q4K_pack_scales(const uint8_t sc[8], const uint8_t mn[8], uint8_t *q) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        q[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        q[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
}

/* File block blk of row r -> chunk ch (put), and back (get); layouts in repack.h. */
/* q4_K / q5_K header (d, dmin, 12 scale bytes at blk) -> row r of chunk ch, and back */
static void tn_r16_put_k4(uint8_t *ch, int r, const uint8_t *blk) {
    uint8_t sc[8], mn[8];
    memcpy(ch + 2 * r, blk, 2);
    memcpy(ch + 32 + 2 * r, blk + 2, 2);
    tn_q4K_unpack_scales(blk + 4, sc, mn);
    for (int j = 0; j < 8; j++) ch[TN_R16_Q4K_SC + 16 * j + r] = (uint8_t)(sc[j] | (mn[j] >> 4) << 6);
    for (int p = 0; p < 4; p++) ch[TN_R16_Q4K_MN + 16 * p + r] = (uint8_t)((mn[2 * p] & 15) | (mn[2 * p + 1] & 15) << 4);
}
static void tn_r16_get_k4(const uint8_t *ch, int r, uint8_t *blk) {
    uint8_t sc[8], mn[8];
    memcpy(blk, ch + 2 * r, 2);
    memcpy(blk + 2, ch + 32 + 2 * r, 2);
    for (int j = 0; j < 8; j++) {
        const uint8_t a = ch[TN_R16_Q4K_SC + 16 * j + r], lo = ch[TN_R16_Q4K_MN + 16 * (j / 2) + r];
        sc[j] = a & 63;
        mn[j] = (uint8_t)(((j % 2 ? lo >> 4 : lo) & 15) | (a >> 6) << 4);
    }
    tn_q4K_pack_scales(sc, mn, blk + 4);
}

static void tn_r16_put(tn_dtype ft, uint8_t *ch, int r, const uint8_t *blk) {
    if (ft == TN_Q4_K) {
        tn_r16_put_k4(ch, r, blk);
        tn_r16_dw_put(ch + TN_R16_Q4K_QS, r, ((const block_q4_K *)blk)->qs, QK_K / 8, 0);
    } else if (ft == TN_Q5_K) {
        tn_r16_put_k4(ch, r, blk);
        tn_r16_dw_put(ch + TN_R16_Q5K_QH, r, ((const block_q5_K *)blk)->qh, QK_K / 32, 0);
        tn_r16_dw_put(ch + TN_R16_Q5K_QS, r, ((const block_q5_K *)blk)->qs, QK_K / 8, 0);
    } else if (ft == TN_Q6_K) {
        const block_q6_K *b = (const block_q6_K *)blk;
        memcpy(ch + 2 * r, &b->d, 2);
        for (int j = 0; j < QK_K / 16; j++) ch[TN_R16_Q6K_SC + 16 * j + r] = (uint8_t)b->scales[j];
        tn_r16_dw_put(ch + TN_R16_Q6K_QL, r, b->ql, QK_K / 8, 0);
        tn_r16_dw_put(ch + TN_R16_Q6K_QH, r, b->qh, QK_K / 16, 0);
    } else if (ft == TN_IQ4_XS) {
        const block_iq4_xs *b = (const block_iq4_xs *)blk;
        memcpy(ch + 2 * r, &b->d, 2);
        for (int p = 0; p < QK_K / 64; p++) ch[TN_R16_IQ4_SL + 16 * p + r] = b->scales_l[p];
        for (int q = 0; q < 2; q++) ch[TN_R16_IQ4_SH + 16 * q + r] = (uint8_t)(b->scales_h >> 8 * q);
        tn_r16_dw_put(ch + TN_R16_IQ4_QS, r, b->qs, QK_K / 8, 0);
    } else if (ft == TN_TQ2_0 || ft == TN_TQ1_0) {
        block_tq2_0 e;
        const block_tq2_0 *b = (const block_tq2_0 *)blk;
        if (ft == TN_TQ1_0) tn_tq1_to_tq2((const block_tq1_0 *)blk, &e), b = &e;
        memcpy(ch + 2 * r, &b->d, 2);
        tn_r16_dw_put(ch + TN_R16_TQ2_QS, r, b->qs, QK_K / 16, 0);
    } else {
        memcpy(ch + 2 * r, blk, 2);
        tn_r16_dw_put(ch + 32, r, blk + 2, (int64_t)(tn_r16_block_bytes(ft) - 2) / 4, ft == TN_Q8_0 ? 0x80808080u : 0);
    }
}

static void tn_r16_get(tn_dtype ft, const uint8_t *ch, int r, uint8_t *blk) {
    if (ft == TN_Q4_K) {
        tn_r16_get_k4(ch, r, blk);
        tn_r16_dw_get(ch + TN_R16_Q4K_QS, r, ((block_q4_K *)blk)->qs, QK_K / 8, 0);
    } else if (ft == TN_Q5_K) {
        tn_r16_get_k4(ch, r, blk);
        tn_r16_dw_get(ch + TN_R16_Q5K_QH, r, ((block_q5_K *)blk)->qh, QK_K / 32, 0);
        tn_r16_dw_get(ch + TN_R16_Q5K_QS, r, ((block_q5_K *)blk)->qs, QK_K / 8, 0);
    } else if (ft == TN_Q6_K) {
        block_q6_K *b = (block_q6_K *)blk;
        memcpy(&b->d, ch + 2 * r, 2);
        for (int j = 0; j < QK_K / 16; j++) b->scales[j] = (int8_t)ch[TN_R16_Q6K_SC + 16 * j + r];
        tn_r16_dw_get(ch + TN_R16_Q6K_QL, r, b->ql, QK_K / 8, 0);
        tn_r16_dw_get(ch + TN_R16_Q6K_QH, r, b->qh, QK_K / 16, 0);
    } else if (ft == TN_IQ4_XS) {
        block_iq4_xs *b = (block_iq4_xs *)blk;
        memcpy(&b->d, ch + 2 * r, 2);
        for (int p = 0; p < QK_K / 64; p++) b->scales_l[p] = ch[TN_R16_IQ4_SL + 16 * p + r];
        b->scales_h = (uint16_t)(ch[TN_R16_IQ4_SH + r] | ch[TN_R16_IQ4_SH + 16 + r] << 8);
        tn_r16_dw_get(ch + TN_R16_IQ4_QS, r, b->qs, QK_K / 8, 0);
    } else if (ft == TN_TQ2_0 || ft == TN_TQ1_0) {
        block_tq2_0 e;
        block_tq2_0 *b = ft == TN_TQ1_0 ? &e : (block_tq2_0 *)blk;
        memcpy(&b->d, ch + 2 * r, 2);
        tn_r16_dw_get(ch + TN_R16_TQ2_QS, r, b->qs, QK_K / 16, 0);
        if (ft == TN_TQ1_0) tn_tq2_to_tq1(&e, (block_tq1_0 *)blk);
    } else {
        memcpy(blk, ch + 2 * r, 2);
        tn_r16_dw_get(ch + 32, r, blk + 2, (int64_t)(tn_r16_block_bytes(ft) - 2) / 4, ft == TN_Q8_0 ? 0x80808080u : 0);
    }
}

void tn_repack_r16(tn_dtype ft, const void *src, void *dst, int64_t m, int64_t k) {
    const int64_t G = tn_dtype_get(ft)->blck_size, nc = k / G;
    const size_t bb = tn_r16_block_bytes(ft), cb = tn_r16_chunk_bytes(ft);
    const uint8_t *s = src;
    uint8_t *d = dst;
    for (int64_t g = 0; g < m / TN_R16_ROWS; g++)
        for (int64_t c = 0; c < nc; c++)
            for (int r = 0; r < TN_R16_ROWS; r++)
                tn_r16_put(ft, d + (size_t)(g * nc + c) * cb, r, s + ((size_t)(g * TN_R16_ROWS + r) * (size_t)nc + (size_t)c) * bb);
}

void tn_unpack_row_r16(tn_dtype it, const void *w, int64_t k, int64_t i, void *row) {
    const tn_dtype ft = tn_r16_file_type(it);
    const int64_t G = tn_dtype_get(ft)->blck_size, nc = k / G, g = i / TN_R16_ROWS;
    const size_t bb = tn_r16_block_bytes(ft), cb = tn_r16_chunk_bytes(ft);
    const uint8_t *c0 = (const uint8_t *)w + (size_t)(g * nc) * cb;
    for (int64_t c = 0; c < nc; c++)
        tn_r16_get(ft, c0 + (size_t)c * cb, (int)(i % TN_R16_ROWS), (uint8_t *)row + (size_t)c * bb);
}

void tn_dequantize_row_r16(tn_dtype it, const void *w, int64_t k, int64_t i, float *out) {
    const tn_dtype ft = tn_r16_file_type(it);
    const int64_t G = tn_dtype_get(ft)->blck_size, nc = k / G, g = i / TN_R16_ROWS;
    const size_t cb = tn_r16_chunk_bytes(ft);
    const uint8_t *c0 = (const uint8_t *)w + (size_t)(g * nc) * cb;
    tn_tq_params p;
    const bool tq = tn_tq_is(ft);
    if (tq) tn_tq_params_of(ft, &p);
    _Alignas(8) uint8_t blk[sizeof(block_q6_K)]; /* the largest r16 block */
    for (int64_t c = 0; c < nc; c++) { /* block by block through the file type's dequantizer */
        tn_r16_get(ft, c0 + (size_t)c * cb, (int)(i % TN_R16_ROWS), blk);
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

/* ---- c16: one lane per chunk (repack.h) ---- */

tn_dtype tn_c16_type_of(tn_dtype t) {
    if (!tn_tq_is(t)) return (tn_dtype)0;
    tn_tq_params p;
    tn_tq_params_of(t, &p);
    return p.bits >= 2 ? (tn_dtype)(TN_DTYPE_C16_BASE + (t - TN_DTYPE_TERN_BASE)) : (tn_dtype)0;
}

tn_dtype tn_c16_file_type(tn_dtype t) {
    if (t < TN_DTYPE_C16_BASE || t >= TN_DTYPE_C16_BASE + TN_DTYPE_TQ_COUNT) return (tn_dtype)0;
    const tn_dtype ft = (tn_dtype)(TN_DTYPE_TERN_BASE + (t - TN_DTYPE_C16_BASE));
    return tn_c16_type_of(ft) ? ft : (tn_dtype)0;
}

/* The super-step geometry of tq type p: header bytes per block and in all, block and super-step
 * bytes, the planes (widths, low bit first). */
typedef struct {
    int hs, nb, hb, w[4];
    size_t bb, sb;
} tn_c16_geo;

static tn_c16_geo tn_c16_geo_of(const tn_tq_params *p) {
    tn_c16_geo g;
    tn_tq_planes(p->bits, g.w);
    g.hs = p->asym ? 4 : 2;
    g.nb = 512 / p->group;
    g.hb = g.nb * g.hs;
    g.bb = tn_tq_block_bytes(p);
    g.sb = (size_t)g.nb * g.bb;
    return g;
}

/* Where the plane-p value of code 4r + i of chunk c lives in a c16 super-step's planes (repack.h):
 * byte offset from the first plane vector (byte 4c + i of vector r / (8 / w) of the plane), and
 * bit shift inside that byte (field r % (8 / w)). */
static void tn_c16_at(const tn_c16_geo *g, int p, int r, int c, int i, size_t *byte, int *shift) {
    int base = 0; /* plane p's first vector */
    for (int q = 0; q < p; q++) base += g->w[q];
    const int w = g->w[p];
    *byte = (size_t)(64 * (base + r / (8 / w)) + 4 * c + i);
    *shift = w * (r % (8 / w));
}

/* One super-step: file blocks (src) -> c16 bytes (dst). */
static void tn_c16_put(const tn_tq_params *p, const tn_c16_geo *g, const uint8_t *src, uint8_t *dst) {
    uint8_t q[512];
    for (int b = 0; b < g->nb; b++) {
        float d, m;
        tn_tq_unpack_block(p, src + (size_t)b * g->bb, q + b * p->group, &d, &m);
        memcpy(dst + b * g->hs, src + (size_t)b * g->bb, (size_t)g->hs); /* d [m] as stored */
    }
    uint8_t *o = dst + g->hb;
    memset(o, 0, (size_t)64 * (size_t)p->bits);
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 16; c++)
            for (int i = 0; i < 4; i++)
                for (int pl = 0, sh = 0; g->w[pl]; sh += g->w[pl], pl++) {
                    size_t at;
                    int shift;
                    tn_c16_at(g, pl, r, c, i, &at, &shift);
                    o[at] |= (uint8_t)(((q[32 * c + 4 * r + i] >> sh) & ((1 << g->w[pl]) - 1)) << shift);
                }
}

/* One super-step: c16 bytes (src) -> file blocks (dst). */
static void tn_c16_get(const tn_tq_params *p, const tn_c16_geo *g, const uint8_t *src, uint8_t *dst) {
    uint8_t q[512];
    const uint8_t *o = src + g->hb;
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 16; c++)
            for (int i = 0; i < 4; i++) {
                int code = 0;
                for (int pl = 0, sh = 0; g->w[pl]; sh += g->w[pl], pl++) {
                    size_t at;
                    int shift;
                    tn_c16_at(g, pl, r, c, i, &at, &shift);
                    code |= ((o[at] >> shift) & ((1 << g->w[pl]) - 1)) << sh;
                }
                q[32 * c + 4 * r + i] = (uint8_t)code;
            }
    for (int b = 0; b < g->nb; b++) {
        uint16_t h[2] = {0, 0};
        memcpy(h, src + b * g->hs, (size_t)g->hs);
        tn_tq_pack_block(p, q + b * p->group, h[0], h[1], dst + (size_t)b * g->bb);
    }
}

tn_c16_put_fn tn_c16_put_fast[TN_DTYPE_TQ_COUNT];

void tn_repack_c16(tn_dtype ft, const void *src, void *dst, int64_t m, int64_t k) {
    tn_tq_params p;
    tn_tq_params_of(ft, &p);
    const tn_c16_geo g = tn_c16_geo_of(&p);
    const size_t rb = tn_dtype_row_size(ft, k);
    const int64_t ns = k / 512;
    const tn_c16_put_fn fast = tn_c16_put_fast[ft - TN_DTYPE_TERN_BASE];
    for (int64_t i = 0; i < m; i++) {
        const uint8_t *s = (const uint8_t *)src + (size_t)i * rb;
        uint8_t *d = (uint8_t *)dst + (size_t)i * rb;
        if (fast) fast(s, d, ns);
        else
            for (int64_t u = 0; u < ns; u++) tn_c16_put(&p, &g, s + (size_t)u * g.sb, d + (size_t)u * g.sb);
        memcpy(d + (size_t)ns * g.sb, s + (size_t)ns * g.sb, rb - (size_t)ns * g.sb); /* the tail blocks */
    }
}

void tn_unpack_row_c16(tn_dtype it, const void *row_c16, int64_t k, void *row) {
    tn_tq_params p;
    tn_tq_params_of(tn_c16_file_type(it), &p);
    const tn_c16_geo g = tn_c16_geo_of(&p);
    const size_t rb = tn_dtype_row_size(it, k);
    const int64_t ns = k / 512;
    for (int64_t u = 0; u < ns; u++) tn_c16_get(&p, &g, (const uint8_t *)row_c16 + (size_t)u * g.sb, (uint8_t *)row + (size_t)u * g.sb);
    memcpy((uint8_t *)row + (size_t)ns * g.sb, (const uint8_t *)row_c16 + (size_t)ns * g.sb, rb - (size_t)ns * g.sb);
}

/* ---- *_p3: iq2 grid entries expanded (blocks.h block_iq2_p3) ---- */

tn_dtype tn_xp_type_of(tn_dtype t) {
    switch (t) {
    case TN_IQ2_XXS: return TN_IQ2_XXS_P3;
    case TN_IQ2_XS: return TN_IQ2_XS_P3;
    case TN_IQ2_S: return TN_IQ2_S_P3;
    case TN_IQ3_XXS: return TN_IQ3_XXS_P4;
    case TN_IQ3_S: return TN_IQ3_S_P4;
    case TN_IQ1_S: return TN_IQ1_S_P2;
    case TN_IQ1_M: return TN_IQ1_M_P2;
    default: return (tn_dtype)0;
    }
}

tn_dtype tn_xp_file_type(tn_dtype it) {
    switch (it) {
    case TN_IQ2_XXS_P3: return TN_IQ2_XXS;
    case TN_IQ2_XS_P3: return TN_IQ2_XS;
    case TN_IQ2_S_P3: return TN_IQ2_S;
    case TN_IQ3_XXS_P4: return TN_IQ3_XXS;
    case TN_IQ3_S_P4: return TN_IQ3_S;
    case TN_IQ1_S_P2: return TN_IQ1_S;
    case TN_IQ1_M_P2: return TN_IQ1_M;
    default: return (tn_dtype)0;
    }
}

/* One file block of type ft -> its p3 block. Every grid byte b is 8, 25 or 43, whose bits 4..5 are
 * the magnitude code 0, 1, 2: eight codes of a grid entry e are (e >> 4) & 0x03..03, with the sign
 * bits (the file's sign byte for iq2_s, the 7-bit field and its parity bit, tn_iq_signs7, for the
 * others) spread one a byte into bit 2, then moved to their fields of hi / lo (blocks.h). Returns false if an entry has a byte
 * other than 8, 25, 43 (the grids have none; checked so that a bad table cannot pass silently). The
 * inverse, tn_p3_get, reads the p3 block through tn_iq_sub_decode. */
static bool tn_p3_put(tn_dtype ft, const uint8_t *blk, block_iq2_p3 *o) {
    memset(o, 0, sizeof *o);
    memcpy(&o->d, blk, sizeof o->d); /* every iq2 block starts with its fp16 d */
    uint64_t bad = 0;
    for (int gi = 0; gi < QK_K / 8; gi++) { /* group of 8 elements gi: elements 8 gi .. 8 gi + 7 */
        uint64_t e;
        unsigned sg;
        if (ft == TN_IQ2_XXS) {
            const block_iq2_xxs *b = (const block_iq2_xxs *)blk;
            const int ib = gi / 4, l = gi % 4;
            const uint32_t idx = tn_iq_rd32(b->qs + 4 * ib), a = tn_iq_rd32(b->qs + 4 * ib + 2);
            e = tn_iq2xxs_grid[idx >> 8 * l & 255];
            sg = tn_iq_signs7(a >> 7 * l);
            if (l == 0) o->scales[ib] = (uint8_t)((a >> 28) * 17); /* the sub-block's scale in both halves */
        } else if (ft == TN_IQ2_XS) {
            const block_iq2_xs *b = (const block_iq2_xs *)blk;
            e = tn_iq2xs_grid[b->qs[gi] & 511];
            sg = tn_iq_signs7(b->qs[gi] >> 9);
            if (gi % 4 == 0) o->scales[gi / 4] = b->scales[gi / 4];
        } else {
            const block_iq2_s *b = (const block_iq2_s *)blk;
            const int ib = gi / 4, l = gi % 4;
            e = tn_iq2s_grid[b->qs[gi] | (b->qh[ib] >> 2 * l & 3) << 8];
            sg = b->qs[QK_K / 8 + gi];
            if (l == 0) o->scales[ib] = b->scales[ib];
        }
        const uint64_t L1 = 0x0101010101010101ull, mag = e >> 4 & 3 * L1;
        bad |= e ^ (8 * L1 + 17 * mag + (mag >> 1 & L1)); /* byte = 8 + 17 m + m / 2: 8, 25, 43 */
        const uint64_t sb = (((uint64_t)(sg & 255) * L1 & 0x8040201008040201ull) + 0x7F * L1) >> 7 & L1;
        const uint64_t code = mag | sb << 2;
        const int c = gi / 8, j = 8 * (gi % 8);
        uint64_t h, n;
        memcpy(&h, o->hi + j, 8);
        memcpy(&n, o->lo + j % 32, 8);
        uint64_t nv = 0; /* the nibble's bits */
        if (c == 0) h |= code;
        else if (c == 1) h |= code << 3;
        else if (c == 2) h |= (code & 3 * L1) << 6, nv = code >> 2 & L1;
        else nv = code << 1;
        n |= j < 32 ? nv : nv << 4;
        memcpy(o->hi + j, &h, 8);
        memcpy(o->lo + j % 32, &n, 8);
    }
    return bad == 0;
}

/* The grid index of file type ft whose entry holds the values q[0 .. dim) (iq2 / iq3: their
 * magnitudes, the signs are stored apart), through the quantizers' map of the grid (iq_grid.h
 * tn_iq_map: a key of the values' levels, `bits` each, element 0 lowest), or -1. */
static int tn_xp_grid_index(tn_dtype ft, const int8_t *q) {
    const tn_iq_map *m = tn_iq_map_get(ft);
    if (!m) return -1;
    int key = 0;
    for (int j = 0; j < m->dim; j++) {
        const int v = q[j] < 0 ? -q[j] : q[j];
        const int l = ft == TN_IQ1_S || ft == TN_IQ1_M ? q[j] + 1        /* -1, 0, 1 */
                      : ft == TN_IQ3_XXS                ? (v - 4) >> 3    /* 4, 12, .., 52, 62 */
                      : ft == TN_IQ3_S                  ? v >> 1          /* 1, 3, .., 15 */
                                                        : v >> 4 & 3;     /* 8, 25, 43 */
        key |= l << (m->bits * j);
    }
    return key < m->map_size ? m->map[key] : -1;
}

/* The sign bits of q[0..8) as a byte (bit j: q[j] < 0). */
static unsigned tn_p3_sign_byte(const int8_t *q) {
    unsigned s = 0;
    for (int j = 0; j < 8; j++) s |= (unsigned)(q[j] < 0) << j;
    return s;
}

/* The inverse of tn_p3_put: a p3 block back in file type ft's bytes (each group's grid index from
 * the grid's map; the 7-bit sign fields keep the low 7 signs, the eighth is their parity). */
static void tn_p3_get(tn_dtype ft, const block_iq2_p3 *p, uint8_t *blk) {
    const tn_dtype it = tn_xp_type_of(ft);
    memset(blk, 0, tn_dtype_get(ft)->type_size);
    memcpy(blk, &p->d, sizeof p->d);
    tn_iq_sub sb;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        tn_iq_sub_decode(it, p, ib, &sb);
        const int s0 = sb.s[0], s1 = sb.s[1];
        switch (ft) {
        case TN_IQ2_XXS: {
            block_iq2_xxs *b = (block_iq2_xxs *)blk;
            uint32_t idx = 0, sg = (uint32_t)s0 << 28;
            for (int l = 0; l < 4; l++) {
                idx |= (uint32_t)tn_xp_grid_index(ft, sb.q + 8 * l) << 8 * l;
                sg |= (uint32_t)(tn_p3_sign_byte(sb.q + 8 * l) & 127) << 7 * l;
            }
            memcpy(b->qs + 4 * ib, &idx, 4);
            memcpy(b->qs + 4 * ib + 2, &sg, 4);
            break;
        }
        case TN_IQ2_XS: {
            block_iq2_xs *b = (block_iq2_xs *)blk;
            for (int l = 0; l < 4; l++)
                b->qs[4 * ib + l] = (uint16_t)(tn_xp_grid_index(ft, sb.q + 8 * l) |
                                               (tn_p3_sign_byte(sb.q + 8 * l) & 127) << 9);
            b->scales[ib] = (uint8_t)(s0 | s1 << 4);
            break;
        }
        default: { /* TN_IQ2_S */
            block_iq2_s *b = (block_iq2_s *)blk;
            for (int l = 0; l < 4; l++) {
                const int idx = tn_xp_grid_index(ft, sb.q + 8 * l);
                b->qs[4 * ib + l] = (uint8_t)(idx & 255);
                b->qh[ib] |= (uint8_t)((idx >> 8 & 3) << 2 * l);
                b->qs[QK_K / 8 + 4 * ib + l] = (uint8_t)tn_p3_sign_byte(sb.q + 8 * l);
            }
            b->scales[ib] = (uint8_t)(s0 | s1 << 4);
            break;
        }
        }
    }
}

/* One iq3_xxs / iq3_s block -> its p4 block. Grid bytes: iq3_xxs 4 + 8 m (m = 0..6) and 62
 * (m = 7), iq3_s 1 + 2 m: m is (b - 4) >> 3, or b >> 1, eight at a time; each group's sign bits
 * (the 7-bit field and its parity, or iq3_s's sign byte) spread one a byte into bit 3; then codes
 * 64 c + j go to nibble c % 2 of qs[64 (c / 2) + j]. Returns false on a byte no grid has. */
static bool tn_p4_put(tn_dtype ft, const uint8_t *blk, block_iq3_p4 *o) {
    memset(o, 0, sizeof *o);
    memcpy(&o->d, blk, sizeof o->d);
    const uint64_t L1 = 0x0101010101010101ull;
    uint64_t bad = 0;
    for (int gi = 0; gi < QK_K / 8; gi++) { /* elements 8 gi .. 8 gi + 7: two grid entries */
        const int ib = gi / 4, l = gi % 4;
        uint64_t e, mag, want;
        unsigned sg;
        if (ft == TN_IQ3_XXS) {
            const block_iq3_xxs *b = (const block_iq3_xxs *)blk;
            const uint32_t a = tn_iq_rd32(b->qs + QK_K / 4 + 4 * ib);
            e = (uint64_t)tn_iq3xxs_grid[b->qs[8 * ib + 2 * l]] | (uint64_t)tn_iq3xxs_grid[b->qs[8 * ib + 2 * l + 1]] << 32;
            sg = tn_iq_signs7(a >> 7 * l);
            if (l == 0) o->scales[ib] = (uint8_t)((a >> 28) * 17);
            mag = ((e | 3 * L1) - 4 * L1) >> 3 & 7 * L1; /* bytes >= 4: no borrow */
            want = 4 * L1 + 8 * mag + (mag >> 2 & mag >> 1 & mag & L1) * 2; /* 7 -> 62, not 60 */
        } else {
            const block_iq3_s *b = (const block_iq3_s *)blk;
            const int i0 = b->qs[8 * ib + 2 * l] | (b->qh[ib] >> 2 * l & 1) << 8;
            const int i1 = b->qs[8 * ib + 2 * l + 1] | (b->qh[ib] >> (2 * l + 1) & 1) << 8;
            e = (uint64_t)tn_iq3s_grid[i0] | (uint64_t)tn_iq3s_grid[i1] << 32;
            sg = b->signs[gi];
            if (l == 0) o->scales[ib] = (uint8_t)((b->scales[ib / 2] >> 4 * (ib % 2) & 15) * 17);
            mag = e >> 1 & 7 * L1;
            want = L1 + 2 * mag;
        }
        bad |= e ^ want;
        const uint64_t sb = (((uint64_t)(sg & 255) * L1 & 0x8040201008040201ull) + 0x7F * L1) >> 7 & L1;
        const uint64_t code = mag | sb << 3;
        const int c = gi / 8, j = 64 * (c / 2) + 8 * (gi % 8);
        uint64_t q;
        memcpy(&q, o->qs + j, 8);
        q |= code << 4 * (c % 2);
        memcpy(o->qs + j, &q, 8);
    }
    return bad == 0;
}

/* The inverse of tn_p4_put (each group of 4's grid index from the grid's map; the 7-bit iq3_xxs
 * sign fields keep the low 7 signs of each 8, the eighth is their parity). */
static void tn_p4_get(tn_dtype ft, const block_iq3_p4 *p, uint8_t *blk) {
    memset(blk, 0, tn_dtype_get(ft)->type_size);
    memcpy(blk, &p->d, sizeof p->d);
    tn_iq_sub sb;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        tn_iq_sub_decode(tn_xp_type_of(ft), p, ib, &sb);
        if (ft == TN_IQ3_XXS) {
            block_iq3_xxs *b = (block_iq3_xxs *)blk;
            uint32_t a = (uint32_t)sb.s[0] << 28;
            for (int l = 0; l < 4; l++) {
                for (int h = 0; h < 2; h++) b->qs[8 * ib + 2 * l + h] = (uint8_t)tn_xp_grid_index(ft, sb.q + 8 * l + 4 * h);
                a |= (uint32_t)(tn_p3_sign_byte(sb.q + 8 * l) & 127) << 7 * l;
            }
            memcpy(b->qs + QK_K / 4 + 4 * ib, &a, 4);
        } else {
            block_iq3_s *b = (block_iq3_s *)blk;
            for (int l = 0; l < 4; l++) {
                for (int h = 0; h < 2; h++) {
                    const int idx = tn_xp_grid_index(ft, sb.q + 8 * l + 4 * h);
                    b->qs[8 * ib + 2 * l + h] = (uint8_t)(idx & 255);
                    b->qh[ib] |= (uint8_t)((idx >> 8 & 1) << (2 * l + h));
                }
                b->signs[4 * ib + l] = (uint8_t)tn_p3_sign_byte(sb.q + 8 * l);
            }
            b->scales[ib / 2] |= (uint8_t)(sb.s[0] << 4 * (ib % 2));
        }
    }
}

/* One iq1_s / iq1_m block -> its p2 block, through the file type's decoder (grid values -1, 0, 1
 * become codes 0, 1, 2). Returns false on a value outside -1..1 (no iq1 grid has one). */
static bool tn_p2_put(tn_dtype ft, const uint8_t *blk, block_iq1_p2 *o) {
    memset(o, 0, sizeof *o);
    o->d = ft == TN_IQ1_M ? tn_iq1_m_scale((const block_iq1_m *)blk) : tn_iq_rd16(blk);
    tn_iq_sub sb;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        tn_iq_sub_decode(ft, blk, ib, &sb);
        o->scales[ib] = (uint8_t)(sb.s[0] | sb.s[1] << 4);
        for (int l = 0; l < 4; l++)
            if (sb.delta[l] < 0) o->delta[ib / 2] |= (uint8_t)(1u << (4 * (ib % 2) + l));
        for (int j = 0; j < 32; j++) {
            const int e = 32 * ib + j;
            if (sb.q[j] < -1 || sb.q[j] > 1) return false;
            o->codes[e % 64] |= (uint8_t)((sb.q[j] + 1) << 2 * (e / 64));
        }
    }
    return true;
}

/* The inverse of tn_p2_put (each group's grid index from the grid's map). */
static void tn_p2_get(tn_dtype ft, const block_iq1_p2 *p, uint8_t *blk) {
    memset(blk, 0, tn_dtype_get(ft)->type_size);
    tn_iq_sub sb;
    uint16_t sc[4] = {0, 0, 0, 0};
    for (int ib = 0; ib < QK_K / 32; ib++) {
        tn_iq_sub_decode(tn_xp_type_of(ft), p, ib, &sb);
        for (int l = 0; l < 4; l++) {
            const int idx = tn_xp_grid_index(ft, sb.q + 8 * l);
            if (ft == TN_IQ1_S) {
                block_iq1_s *b = (block_iq1_s *)blk;
                b->qs[4 * ib + l] = (uint8_t)(idx & 255);
                b->qh[ib] |= (uint16_t)((idx >> 8 & 7) << 3 * l);
            } else {
                block_iq1_m *b = (block_iq1_m *)blk;
                b->qs[4 * ib + l] = (uint8_t)(idx & 255);
                b->qh[2 * ib + l / 2] |= (uint8_t)(((idx >> 8 & 7) | (sb.delta[l] < 0 ? 8 : 0)) << 4 * (l % 2));
            }
        }
        if (ft == TN_IQ1_S) {
            block_iq1_s *b = (block_iq1_s *)blk;
            b->qh[ib] |= (uint16_t)(sb.s[0] << 12 | (sb.delta[0] < 0 ? 0x8000 : 0));
        } else {
            sc[ib / 2] |= (uint16_t)((sb.s[0] | sb.s[1] << 3) << 6 * (ib % 2));
        }
    }
    if (ft == TN_IQ1_S) {
        memcpy(blk, &p->d, sizeof p->d);
    } else { /* the fp16 d over the scale words' top nibbles (blocks.h tn_iq1_m_scale) */
        for (int w = 0; w < 4; w++) sc[w] |= (uint16_t)((p->d >> 4 * w & 15) << 12);
        memcpy(((block_iq1_m *)blk)->scales, sc, sizeof sc);
    }
}

/* Blocks [b0, b1) of a tn_repack_xp call (one thread's share). */
typedef struct {
    tn_dtype ft;
    const uint8_t *src;
    void *dst;
    int64_t b0, b1;
    bool ok;
} tn_xp_job;

static void *tn_xp_run(void *arg) {
    tn_xp_job *j = arg;
    const size_t fb = tn_dtype_get(j->ft)->type_size;
    const bool iq3 = j->ft == TN_IQ3_XXS || j->ft == TN_IQ3_S, iq1 = j->ft == TN_IQ1_S || j->ft == TN_IQ1_M;
    j->ok = true;
    for (int64_t i = j->b0; i < j->b1 && j->ok; i++) {
        const uint8_t *s = j->src + (size_t)i * fb;
        j->ok = iq1   ? tn_p2_put(j->ft, s, (block_iq1_p2 *)j->dst + i)
                : iq3 ? tn_p4_put(j->ft, s, (block_iq3_p4 *)j->dst + i)
                      : tn_p3_put(j->ft, s, (block_iq2_p3 *)j->dst + i);
    }
    return NULL;
}

bool tn_repack_xp(tn_dtype ft, const void *src, void *dst, int64_t m, int64_t k) {
    const int64_t nb = m * (k / QK_K);
    /* a model's matrices are converted at load: on every core when there is enough to share
     * (a 1B iq2_xs model: ~0.9 s on one core) */
    enum { TN_XP_THREADS = 16 };
    int nt = tn_cpu_count();
    if (nt > TN_XP_THREADS) nt = TN_XP_THREADS;
    if (nb < 8192 || nt < 2) nt = 1;
    tn_xp_job jobs[TN_XP_THREADS];
    pthread_t th[TN_XP_THREADS];
    bool started[TN_XP_THREADS] = {false};
    for (int t = 0; t < nt; t++) {
        jobs[t] = (tn_xp_job){ft, src, dst, nb * t / nt, nb * (t + 1) / nt, false};
        if (t > 0) started[t] = pthread_create(&th[t], NULL, tn_xp_run, &jobs[t]) == 0;
    }
    tn_xp_run(&jobs[0]);
    bool ok = jobs[0].ok;
    for (int t = 1; t < nt; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        else tn_xp_run(&jobs[t]); /* no thread: this one does the share */
        ok = ok && jobs[t].ok;
    }
    return ok;
}

void tn_unpack_row_xp(tn_dtype it, const void *w, int64_t k, int64_t i, void *row) {
    const tn_dtype ft = tn_xp_file_type(it);
    const int64_t nb = k / QK_K;
    const size_t fb = tn_dtype_get(ft)->type_size;
    for (int64_t b = 0; b < nb; b++) {
        if (ft == TN_IQ1_S || ft == TN_IQ1_M) tn_p2_get(ft, (const block_iq1_p2 *)w + i * nb + b, (uint8_t *)row + (size_t)b * fb);
        else if (ft == TN_IQ3_XXS || ft == TN_IQ3_S) tn_p4_get(ft, (const block_iq3_p4 *)w + i * nb + b, (uint8_t *)row + (size_t)b * fb);
        else tn_p3_get(ft, (const block_iq2_p3 *)w + i * nb + b, (uint8_t *)row + (size_t)b * fb);
    }
}

/* ---- every load-time layout ---- */

tn_dtype tn_repack_type_of(tn_dtype t) {
    tn_dtype r = tn_r16_type_of(t);
    if (!r) r = tn_l32_type_of(t);
    if (!r) r = tn_xp_type_of(t);
    return r ? r : tn_c16_type_of(t);
}

tn_dtype tn_repack_file_type(tn_dtype it) {
    tn_dtype r = tn_r16_file_type(it);
    if (!r) r = tn_l32_file_type(it);
    if (!r) r = tn_xp_file_type(it);
    return r ? r : tn_c16_file_type(it);
}

bool tn_repack_grows(tn_dtype it) {
    const tn_dtype ft = tn_repack_file_type(it);
    return ft && tn_dtype_get(it)->type_size > tn_dtype_get(ft)->type_size;
}

int tn_repack_rows(tn_dtype it) {
    return tn_r16_file_type(it) ? TN_R16_ROWS : tn_l32_file_type(it) ? TN_L32_ROWS : tn_c16_file_type(it) || tn_xp_file_type(it) ? 1 : 0;
}

void tn_repack(tn_dtype ft, const void *src, void *dst, int64_t m, int64_t k) {
    if (tn_xp_type_of(ft)) (void)tn_repack_xp(ft, src, dst, m, k);
    else if (tn_r16_type_of(ft)) tn_repack_r16(ft, src, dst, m, k);
    else if (tn_l32_type_of(ft)) tn_repack_l32(ft, src, dst, m, k);
    else tn_repack_c16(ft, src, dst, m, k);
}

void tn_unpack_row(tn_dtype it, const void *w, int64_t k, int64_t i, void *row) {
    if (tn_r16_file_type(it)) tn_unpack_row_r16(it, w, k, i, row);
    else if (tn_l32_file_type(it)) tn_unpack_row_l32(it, w, k, i, row);
    else if (tn_xp_file_type(it)) tn_unpack_row_xp(it, w, k, i, row);
    else tn_unpack_row_c16(it, (const uint8_t *)w + (size_t)i * tn_dtype_row_size(it, k), k, row);
}

void tn_dequantize_row_repacked(tn_dtype it, const void *w, int64_t k, int64_t i, float *out) {
    if (tn_xp_file_type(it)) { /* rows as in the file: the i-quant dequantizer reads p3 blocks */
        tn_dequantize_row_iq(it, (const uint8_t *)w + (size_t)i * tn_dtype_row_size(it, k), out, k);
        return;
    }
    if (tn_r16_file_type(it)) {
        tn_dequantize_row_r16(it, w, k, i, out);
        return;
    }
    if (tn_c16_file_type(it)) { /* the row back in the file's bytes, then the file type's dequantizer */
        tn_tq_params p;
        tn_tq_params_of(tn_c16_file_type(it), &p);
        const tn_c16_geo g = tn_c16_geo_of(&p);
        const uint8_t *row = (const uint8_t *)w + (size_t)i * tn_dtype_row_size(it, k);
        uint8_t blk[576]; /* one super-step in the file's bytes; the largest: tq8g32a, 16 x 36 */
        int64_t done = 0;
        for (; done + 512 <= k; done += 512, row += g.sb) {
            tn_c16_get(&p, &g, row, blk);
            tn_tq_dequantize_row(&p, blk, out + done, 512);
        }
        if (done < k) tn_tq_dequantize_row(&p, row, out + done, k - done);
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
