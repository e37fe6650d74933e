/*
 * tq.h — tern's any-bit group quantization ("tq" types): b bits per weight, b in 1..8, one
 * fp16 scale (and, asymmetric, one fp16 offset) per group of G = 32, 64, 128 or 256 weights.
 *
 *   asymmetric:  x = d * q + m                q in 0 .. 2^b - 1
 *   symmetric:   x = d * (q - (2^b - 1) / 2)  (odd grid, no zero; b = 1 is +-d/2)
 *
 * Dtype ids: TN_DTYPE_TERN_BASE + (b - 1) * 8 + log2(G / 32) * 2 + asym  (1024 .. 1087).
 * Names: "tq<b>g<G>" (symmetric) / "tq<b>g<G>a" (asymmetric); "tq<b>" alone means tq<b>g64a.
 *
 * Storage (docs/formats.md has the bit diagram): one block per group,
 *   fp16 d | fp16 m (asym only) | planes
 * the b bits of every code are split into planes of width 8, 4, 2, 1 (b = 8 | 4 | 2 | 1 | 2+1 |
 * 4+1 | 4+2 | 4+2+1), the widest plane holding the low bits. Each plane stores the group in chunks
 * of 32 codes (4*w bytes): w=8 byte j = v[j]; w=4 byte j = v[j] | v[j+16] << 4 (j < 16);
 * w=2 byte j = v[j] | v[j+8] << 2 | v[j+16] << 4 | v[j+24] << 6 (j < 8); w=1 bit n of the
 * little-endian u32 = v[n]. So every plane unpacks with shifts and masks into 32 byte lanes in
 * element order (the 1-bit plane with one mask-to-vector step), whatever b is.
 *
 * Dot products run against q8_0 activations (32 per block); k must be a multiple of G.
 */
#ifndef TN_QUANT_TQ_H
#define TN_QUANT_TQ_H

#include "quant/blocks.h"
#include "tensor/dtype.h"

#define TN_TQ_COUNT TN_DTYPE_TQ_COUNT

typedef struct tn_tq_params {
    int bits;   /* 1..8             */
    int group;  /* 32, 64, 128, 256 */
    bool asym;
} tn_tq_params;

static inline bool tn_tq_is(uint32_t t) { return t >= TN_DTYPE_TERN_BASE && t < TN_DTYPE_TERN_BASE + TN_TQ_COUNT; }
static inline void tn_tq_params_of(uint32_t t, tn_tq_params *p) {
    uint32_t i = t - TN_DTYPE_TERN_BASE;
    p->bits = (int)(i / 8) + 1;
    p->group = 32 << ((i / 2) % 4);
    p->asym = i % 2;
}
static inline uint32_t tn_tq_dtype(const tn_tq_params *p) {
    uint32_t gi = p->group == 32 ? 0 : p->group == 64 ? 1 : p->group == 128 ? 2 : 3;
    return TN_DTYPE_TERN_BASE + (uint32_t)(p->bits - 1) * 8 + gi * 2 + (p->asym ? 1 : 0);
}
/* Bytes of one block (group). */
static inline size_t tn_tq_block_bytes(const tn_tq_params *p) {
    return (size_t)(p->asym ? 4 : 2) + (size_t)p->group * (size_t)p->bits / 8;
}
/* Parses "tq3", "tq3g64", "tq3g64a", "tq4g128s" (case-insensitive). */
bool tn_tq_from_name(const char *name, tn_tq_params *out);
/* Canonical name into buf ("tq3g64a"). */
void tn_tq_name(const tn_tq_params *p, char *buf, size_t cap);

/* Plane widths of b bits, widest first, 0-terminated (at most 3). */
void tn_tq_planes(int bits, int widths[4]);

/* Reference quantizer: k floats (k % G == 0) into k / G blocks. imatrix (k importance weights,
 * one per column) may be NULL. Deterministic; search over scales minimizing weighted error. */
void tn_tq_quantize_row(const tn_tq_params *p, const float *x, void *y, int64_t k, const float *imatrix);
/* The last step of the reference quantizer for one group of G floats, once the search has chosen
 * the scale d and offset m (m unused when symmetric): rounds both to fp16, takes every code by
 * nearest rounding against the rounded values and packs the block. Vector quantizers that search
 * several groups at once finish each group here, so their bytes are the reference's. */
void tn_tq_finish_group(const tn_tq_params *p, const float *x, float d, float m, uint8_t *blk);
/* Plain round-to-nearest quantizer, for data written as it comes (the KV cache): per group
 * d = (max - min) / (2^b - 1), m = min (asym; sym: d = 2 max|x| / (2^b - 1)), then
 * tn_tq_finish_group. NaN-free input; deterministic. */
void tn_tq_quantize_row_rtn(const tn_tq_params *p, const float *x, void *y, int64_t k);
/* Reference dequantizer. */
void tn_tq_dequantize_row(const tn_tq_params *p, const void *x, float *y, int64_t k);
/* Unpacks the codes of one block into q[G] (0 .. 2^b - 1); returns d and m (sym: m = -d*(2^b-1)/2). */
void tn_tq_unpack_block(const tn_tq_params *p, const uint8_t *blk, uint8_t *q, float *d, float *m);
/* One block from its codes q[G] and the raw fp16 bits of d and m (m ignored when symmetric). */
void tn_tq_pack_block(const tn_tq_params *p, const uint8_t *q, uint16_t d, uint16_t m, uint8_t *blk);
/* Reference fused dequant-dot against q8_0 activations: per 32-code chunk
 *   da * (d * sum(q * qa) + m * sum(qa))   (sym: da * d * (2 sum(q qa) - (2^b-1) sum(qa)) / 2)
 * summed in element order. */
float tn_tq_vec_dot_ref(const tn_tq_params *p, int64_t k, const void *w, const block_q8_0 *a);

#endif
