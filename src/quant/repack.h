/*
 * repack.h — load-time weight layouts for the batched kernels (the layout is never written to a
 * file; its dtype is internal, tensor/dtype.h).
 *
 * q4_0_r16: q4_0 with 16 rows interleaved so that one 512-bit VPDPBUSD multiplies 16 rows at once
 * (int32 lane r = row r) by four activations broadcast to every lane; no horizontal sums, and the
 * nibble unpacking is shared by every activation column of a batch. Same bytes as q4_0: a group of
 * 16 rows (16 * k/32 blocks) becomes k/32 chunks of 288 bytes, chunk b =
 *
 *   bytes   0 ..  31   fp16 d of block b of rows 0..15
 *   bytes  32 .. 287   four 64-byte registers P_t (t = 0..3): dword r of P_t = dword t of row r's
 *                      qs[16] (byte i: low nibble = code 4t+i, high nibble = code 16+4t+i)
 *
 * so P_t & 0x0F holds codes 4t..4t+3 of every row and (P_t >> 4) & 0x0F codes 16+4t..16+4t+3.
 * A row-major view of group g starts at g * 16 * row_size, as before: the matmul driver's
 * 16-aligned thread ranges and row offsets stay valid.
 */
#ifndef TN_QUANT_REPACK_H
#define TN_QUANT_REPACK_H

#include "core/base.h"

#define TN_R16_ROWS 16
#define TN_R16_CHUNK 288 /* bytes per block of 16 rows */

/* dst (m rows, m % 16 == 0, k % 32 == 0) = src (row-major q4_0) in the q4_0_r16 layout. dst and
 * src must not overlap. */
void tn_repack_q4_0_r16(const void *src, void *dst, int64_t m, int64_t k);
/* Row i of a q4_0_r16 matrix back as q4_0 blocks (k / 32 of them). */
void tn_unpack_row_q4_0_r16(const void *w, int64_t k, int64_t i, void *row);
/* Row i of a q4_0_r16 matrix as k floats (what q4_0's dequantization gives for the original row). */
void tn_dequantize_row_q4_0_r16(const void *w, int64_t k, int64_t i, float *out);

#endif
