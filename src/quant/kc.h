/*
 * kc.h — per-channel K for the KV cache ("tqc<b>", b = 2..4): KIVI's grouping of each key channel
 * over tokens instead of each token over channels. Keys have a few channels much larger than the
 * rest; a per-token group's scale is set by them, while a channel's values over neighbouring
 * tokens are of one size. docs/formats.md has the bit diagram.
 *
 * A group is one paged block of the cache: TN_KC_ROWS (16) consecutive positions. Per channel c of
 * the group (asymmetric, round to nearest between the channel's minimum and maximum):
 *   d_c = f16((max_t x_tc - min_t x_tc) / (2^b - 1)),  m_c = f16(min_t x_tc)
 *   q_tc = clamp(round((x_tc - m_c) / d_c), 0, 2^b - 1)         (all 0 when d_c = 0)
 *   x_tc ~ d_c q_tc + m_c
 * Rows stay one position each (one size, whatever the block): a row of n values (n % 32 == 0) is
 * n / 32 chunks of 4 b + 8 bytes, chunk j holding channels 32 j .. 32 j + 31:
 *   8 bytes: f16 d, f16 m of channel 32 j + 2 r, then of channel 32 j + 2 r + 1  (r: the row's
 *            place in its group, 0..15 — the group's 32 (d, m) pairs of the chunk spread over
 *            its 16 rows)
 *   4 b bytes: the row's 32 codes in tq's bit planes (quant/tq.h: planes of width 4, 2, 1,
 *            widest first holding the low bits; chunks of 32 codes)
 * so b + 2 bits a value, and a kv head of hd values (hd % 32 == 0) is whole chunks: a head offset
 * is (offset / 32) chunks, as for the per-token types. A group is complete, and quantized, once
 * all its 16 positions are written; until then its keys are kept in f16 (model/ctx.h).
 */
#ifndef TN_QUANT_KC_H
#define TN_QUANT_KC_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/dtype.h"

#define TN_KC_ROWS 16

/* The dtype of b-bit per-channel K rows (b = 2..4), and the bits of a dtype (0: not tqc). */
static inline int32_t tn_kc_dtype(int bits) { return (int32_t)TN_TQC2 + bits - 2; }
static inline int tn_kc_bits(int32_t type) { return type >= (int32_t)TN_TQC2 && type <= (int32_t)TN_TQC4 ? type - (int32_t)TN_TQC2 + 2 : 0; }

/* Bytes of a row of n values (n % 32 == 0) at b bits. */
static inline size_t tn_kc_row_bytes(int bits, int64_t n) { return (size_t)(n / 32) * (size_t)(4 * bits + 8); }

/* Quantizes one group: x[r * ldx + i] (r < 16, i < n) into rows[r] (n values each, n % 32 == 0).
 * Deterministic; NaN-free input. */
void tn_kc_quantize_group(int bits, const float *x, int64_t ldx, int64_t n, uint8_t *const rows[TN_KC_ROWS]);
/* Reference dequantizer of one group: y[r * ldy + i] = d_c q_rc + m_c. */
void tn_kc_dequantize_group(int bits, const uint8_t *const rows[TN_KC_ROWS], int64_t n, float *y, int64_t ldy);
/* The (d, m) of the 32 channels of chunk j of a group, gathered from its 16 rows. */
void tn_kc_chunk_stats(const uint8_t *const rows[TN_KC_ROWS], int bits, int64_t j, float d[32], float m[32]);
/* The 32 codes (0 .. 2^b - 1) of chunk j of one row. */
void tn_kc_chunk_codes(const uint8_t *row, int bits, int64_t j, uint8_t q[32]);

#endif
