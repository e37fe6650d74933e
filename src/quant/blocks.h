/*
 * blocks.h — the fixed block formats of ggml, bit-exact (ggml-common.h layouts). Each struct is
 * one block; the bits-per-weight comment counts scales. Static asserts pin the sizes, so files
 * written by llama.cpp read as-is.
 *
 * Conventions (ggml's): d = scale (fp16), m = min (fp16), qs = packed quants, qh = high bits.
 * Q4_0 element j of a block is (qs[j] & 0xF) for j < 16 and (qs[j-16] >> 4) for j >= 16.
 */
#ifndef TN_QUANT_BLOCKS_H
#define TN_QUANT_BLOCKS_H

#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "core/fp16.h"

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct { tn_fp16 d; uint8_t qs[QK4_0 / 2]; } block_q4_0;                 /* 4.5 bpw  */
static_assert(sizeof(block_q4_0) == 2 + QK4_0 / 2, "block_q4_0 size");

typedef struct { tn_fp16 d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;              /* 5.0 bpw  */
static_assert(sizeof(block_q4_1) == 4 + QK4_1 / 2, "block_q4_1 size");

typedef struct { tn_fp16 d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;  /* 5.5 bpw  */
static_assert(sizeof(block_q5_0) == 2 + 4 + QK5_0 / 2, "block_q5_0 size");

typedef struct { tn_fp16 d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1; /* 6.0 bpw */
static_assert(sizeof(block_q5_1) == 4 + 4 + QK5_1 / 2, "block_q5_1 size");

typedef struct { tn_fp16 d; int8_t qs[QK8_0]; } block_q8_0;                      /* 8.5 bpw  */
static_assert(sizeof(block_q8_0) == 2 + QK8_0, "block_q8_0 size");

/* Activation format for q4_1/q5_1: d = scale, s = d * sum(qs). */
typedef struct { tn_fp16 d, s; int8_t qs[QK8_1]; } block_q8_1;                   /* 9.0 bpw  */
static_assert(sizeof(block_q8_1) == 4 + QK8_1, "block_q8_1 size");

/* 16 sub-blocks of 16: 4-bit scale and 4-bit min each; 2-bit quants.                 2.625 bpw */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; tn_fp16 d, dmin; } block_q2_K;
static_assert(sizeof(block_q2_K) == 2 * 2 + QK_K / 16 + QK_K / 4, "block_q2_K size");

/* 16 sub-blocks of 16: 6-bit scales; 3-bit quants (low 2 in qs, high 1 in hmask).   3.4375 bpw */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; tn_fp16 d; } block_q3_K;
static_assert(sizeof(block_q3_K) == 2 + QK_K / 4 + QK_K / 8 + 12, "block_q3_K size");

/* 8 sub-blocks of 32: 6-bit scale + 6-bit min packed in 12 bytes; 4-bit quants.       4.5 bpw */
typedef struct { tn_fp16 d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
static_assert(sizeof(block_q4_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2, "block_q4_K size");

/* as q4_K plus one high bit per quant in qh.                                            5.5 bpw */
typedef struct { tn_fp16 d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
static_assert(sizeof(block_q5_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2 + QK_K / 8, "block_q5_K size");

/* 16 sub-blocks of 16 with int8 scales; 6-bit quants (low 4 in ql, high 2 in qh).     6.5625 bpw */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; tn_fp16 d; } block_q6_K;
static_assert(sizeof(block_q6_K) == 2 + QK_K / 16 + 3 * QK_K / 4, "block_q6_K size");

/* Activation format for k-quants: float scale, int8 quants, sums of each 16 quants.       */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;
static_assert(sizeof(block_q8_K) == 4 + QK_K + QK_K / 16 * 2, "block_q8_K size");

/* ---- non-linear and lookup-table types: 4-bit indices into a 16-entry value table ------------ */
#define QK4_NL 32
#define QK_MXFP4 32

/* The value tables (format constants of ggml-common.h). IQ4_NL's levels are non-uniform, denser
 * near zero; MXFP4's are the OCP e2m1 values doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
 * negatives times 2), so a block's scale is 2^(e-128), half its e8m0 exponent's value. */
extern const int8_t tn_kvalues_iq4nl[16];
extern const int8_t tn_kvalues_mxfp4[16];

/* d times the table value of each 4-bit index; element j < 16 in the low nibble of qs[j],
 * element j >= 16 in the high nibble of qs[j-16] (q4_0's order).                        4.5 bpw */
typedef struct { tn_fp16 d; uint8_t qs[QK4_NL / 2]; } block_iq4_nl;
static_assert(sizeof(block_iq4_nl) == 2 + QK4_NL / 2, "block_iq4_nl size");

/* 8 sub-blocks of 32 (each laid out as one iq4_nl block's qs), sub-block scale
 * d * (ls - 32) with the 6-bit ls split: low 4 bits in scales_l (sub-block 2i low nibble, 2i+1
 * high nibble), high 2 bits in scales_h (bits 2i, 2i+1 for sub-block i).             4.25 bpw */
typedef struct { tn_fp16 d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;
static_assert(sizeof(block_iq4_xs) == 2 + 2 + QK_K / 64 + QK_K / 2, "block_iq4_xs size");

/* OCP microscaling FP4: e8m0 shared exponent e (value 2^(e-127); 0 and 1 are 2^-127 and 2^-126
 * as denormal floats) and 4-bit e2m1 codes in q4_0's nibble order.                  4.25 bpw */
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } block_mxfp4;
static_assert(sizeof(block_mxfp4) == 1 + QK_MXFP4 / 2, "block_mxfp4 size");

/* ggml's ternary types (BitNet b1.58, TriLM): values d * {-1, 0, 1}. Not tern's tq<b>g<G> types
 * (quant/tq.h), whose names only look alike.
 * tq1_0: 5 trits per byte in qs (240 values, as a base-3 fraction of 256: byte = ceil(n * 256 /
 * 243)), 4 per byte in qh (16 values), then d.                                       1.6875 bpw
 * tq2_0: 2-bit codes c (value c - 1), 4 per byte, 32-byte groups (byte m of a 32-byte group holds
 * elements m, m+32, m+64, m+96 of its 128 in bits 0-1, 2-3, 4-5, 6-7), then d.      2.0625 bpw */
typedef struct { uint8_t qs[(QK_K - 4 * QK_K / 64) / 5]; uint8_t qh[QK_K / 64]; tn_fp16 d; } block_tq1_0;
static_assert(sizeof(block_tq1_0) == 2 + QK_K / 64 + (QK_K - 4 * QK_K / 64) / 5, "block_tq1_0 size");
typedef struct { uint8_t qs[QK_K / 4]; tn_fp16 d; } block_tq2_0;
static_assert(sizeof(block_tq2_0) == 2 + QK_K / 4, "block_tq2_0 size");

/* ---- codebook i-quants (quant/iq_grid.h): groups of 8 (iq3: 4) elements replaced by an index
 * into a fixed grid of magnitude vectors (the format's codebooks), plus sign bits and 4-bit (iq1:
 * 3-bit) sub-block scales. 256-element super-blocks, 32-element sub-blocks. ----------------- */

/* qs[4 ib .. 4 ib + 4) for sub-block ib as two uint32: the first holds four 8-bit grid indices
 * (one per group of 8), the second four 7-bit sign fields (bits 7 l ..) and, in bits 28-31, the
 * scale s: value d * (0.5 + s) / 4 * grid * sign.                                       2.0625 bpw */
typedef struct { tn_fp16 d; uint16_t qs[QK_K / 8]; } block_iq2_xxs;
static_assert(sizeof(block_iq2_xxs) == 2 + QK_K / 4, "block_iq2_xxs size");

/* qs[i]: 9-bit grid index (low) and 7-bit sign field (high) of group i; scales[ib]: 4-bit scales
 * of sub-block ib's halves (low nibble first), value d * (0.5 + s) / 4 * grid * sign.   2.3125 bpw */
typedef struct { tn_fp16 d; uint16_t qs[QK_K / 8]; uint8_t scales[QK_K / 32]; } block_iq2_xs;
static_assert(sizeof(block_iq2_xs) == 2 + QK_K / 4 + QK_K / 32, "block_iq2_xs size");

/* qs[0..32): low 8 bits of the 10-bit grid index of each group (high 2 bits: qh[ib] bits 2 l..),
 * qs[32..64): a full 8-bit sign byte per group; scales as iq2_xs.                      2.5625 bpw */
typedef struct { tn_fp16 d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t scales[QK_K / 32]; } block_iq2_s;
static_assert(sizeof(block_iq2_s) == 2 + QK_K / 4 + QK_K / 16, "block_iq2_s size");

/* tern's load-time layout of iq2_xxs / iq2_xs / iq2_s (quant/repack.h *_p3; never in a file): the
 * grid entries (every byte 8, 25 or 43 in all three grids) expanded to a 3-bit code per element,
 * 3.3125 bpw: code(e) = m | s << 2, m = 0, 1, 2 for 8, 25, 43, s = 1 for a negative element.
 * For j = 0..63, with nib(j) = j < 32 ? lo[j] & 15 : lo[j - 32] >> 4:
 *   hi[j]  bits 0..2 code(j), bits 3..5 code(64 + j), bits 6..7 bits 0..1 of code(128 + j)
 *   nib(j) bit 0 bit 2 of code(128 + j), bits 1..3 code(192 + j)
 * d and the 4-bit scales as iq2_xs (iq2_xxs: the sub-block's scale in both halves). Value
 * d * (0.5 + s) / 4 * g * sign. */
typedef struct { tn_fp16 d; uint8_t scales[QK_K / 32]; uint8_t hi[QK_K / 4]; uint8_t lo[QK_K / 8]; } block_iq2_p3;
static_assert(sizeof(block_iq2_p3) == 2 + QK_K / 32 + QK_K / 4 + QK_K / 8, "block_iq2_p3 size");

/* The same for iq3_xxs / iq3_s (quant/repack.h *_p4): every byte of the iq3_xxs grid is one of 4,
 * 12, 20, 28, 36, 44, 52, 62 and of the iq3_s grid one of 1, 3, .., 15, so each element is a
 * 4-bit code m | s << 3 (m = 0..7 indexes those eight, s = 1 for a negative element), 4.31 bpw:
 * qs[j] (j < 64) low nibble code(j), high nibble code(64 + j); qs[64 + j] code(128 + j) and
 * code(192 + j). d and scales as block_iq2_p3 (the sub-block's 4-bit scale in both nibbles).
 * Value as the file type's: iq3_xxs d * (0.5 + s) / 2 * g * sign, iq3_s d * (1 + 2 s) * g * sign. */
typedef struct { tn_fp16 d; uint8_t scales[QK_K / 32]; uint8_t qs[QK_K / 2]; } block_iq3_p4;
static_assert(sizeof(block_iq3_p4) == 2 + QK_K / 32 + QK_K / 2, "block_iq3_p4 size");

/* The same for iq1_s / iq1_m (quant/repack.h *_p2): every iq1 grid byte is -1, 0 or 1, stored as
 * the 2-bit code g + 1: codes[j] bits 2c, 2c + 1 hold code(64 c + j); delta bit gi (of 32) is set
 * when group gi of 8 (elements 8 gi .. 8 gi + 7) has the negative 1/8 shift; scales: the 3-bit
 * scale of 16-element half 2i in the low nibble of byte i, 2i + 1 in the high (iq1_s: the
 * sub-block's in both); d the fp16 super-block scale (iq1_m: the one its scale words assemble).
 * Value d * (2 s + 1) * (g +- 1/8), as the file type's.                                2.44 bpw */
typedef struct { tn_fp16 d; uint8_t scales[QK_K / 32]; uint8_t delta[QK_K / 64]; uint8_t codes[QK_K / 4]; } block_iq1_p2;
static_assert(sizeof(block_iq1_p2) == 2 + QK_K / 32 + QK_K / 64 + QK_K / 4, "block_iq1_p2 size");

/* qs[0..64): 8-bit grid index per group of 4; qs[64..96): per sub-block one uint32 with four 7-bit
 * sign fields (one per 8 elements) and the scale s in bits 28-31: d * (0.5 + s) / 2.  3.0625 bpw */
typedef struct { tn_fp16 d; uint8_t qs[3 * QK_K / 8]; } block_iq3_xxs;
static_assert(sizeof(block_iq3_xxs) == 2 + 3 * QK_K / 8, "block_iq3_xxs size");

/* qs: low 8 bits of the 9-bit grid index per group of 4 (ninth bit: qh, one byte per sub-block,
 * bit i for group i); signs: a full sign byte per 8 elements; scales: 4-bit per sub-block (pairs
 * per byte), value d * (1 + 2 s).                                                       3.4375 bpw */
typedef struct { tn_fp16 d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t signs[QK_K / 8]; uint8_t scales[QK_K / 64]; } block_iq3_s;
static_assert(sizeof(block_iq3_s) == 2 + 13 * (QK_K / 32) + QK_K / 64, "block_iq3_s size");

/* qs: low 8 bits of the 11-bit grid index per group of 8; qh[ib]: the high 3 bits of each of the
 * sub-block's four indices (bits 3 l ..), its 3-bit scale s (bits 12-14) and the delta's sign
 * (bit 15): value d * (2 s + 1) * (grid + delta), delta = +-1/8.                     1.5625 bpw */
typedef struct { tn_fp16 d; uint8_t qs[QK_K / 8]; uint16_t qh[QK_K / 32]; } block_iq1_s;
static_assert(sizeof(block_iq1_s) == 2 + QK_K / 8 + QK_K / 16, "block_iq1_s size");

/* qs as iq1_s; qh[2 ib + h]: high 3 index bits of group 2h (bits 0-2) and 2h+1 (bits 4-6) and
 * their deltas' signs (bits 3, 7); scales: four uint16, each with two sub-blocks' pairs of 3-bit
 * scales in bits 0-11, and the fp16 super-block scale spread over their top nibbles (word w's
 * bits 12-15 = fp16 bits 4w..4w+3). Value d * (2 s + 1) * (grid + delta).             1.75 bpw */
typedef struct { uint8_t qs[QK_K / 8]; uint8_t qh[QK_K / 16]; uint8_t scales[QK_K / 32]; } block_iq1_m;
static_assert(sizeof(block_iq1_m) == QK_K / 8 + QK_K / 16 + QK_K / 32, "block_iq1_m size");

/* The fp16 super-block scale of an iq1_m block, from the top nibbles of its four scale words. */
static inline tn_fp16 tn_iq1_m_scale(const block_iq1_m *b) {
    uint16_t sc[4];
    memcpy(sc, b->scales, sizeof sc);
    const uint16_t u = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    tn_fp16 h;
    memcpy(&h, &u, sizeof h);
    return h;
}

/* 2^(e-128) as a float (e8m0's value halved, for the doubled mxfp4 table), bit-exact with ggml's
 * ggml_e8m0_to_fp32_half: e < 2 are the denormals 2^-128 and 2^-127. */
static inline float tn_e8m0_to_fp32_half(uint8_t e) {
    const uint32_t bits = e < 2 ? UINT32_C(0x00200000) << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#endif
