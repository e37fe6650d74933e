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

#endif
