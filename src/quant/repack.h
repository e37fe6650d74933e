/*
 * repack.h — load-time weight layouts for the batched kernels (the layouts are never written to
 * a file; their dtypes are internal, tensor/dtype.h).
 *
 * *_r16: 4-bit weights with 16 rows interleaved so that one 512-bit VPDPBUSD multiplies 16 rows
 * at once (int32 lane r = row r) by four activations broadcast to every lane; no horizontal sums,
 * and the nibble unpacking is shared by every activation column of a batch. Two file types have
 * the same shape of block — an fp16 scale d, then codes in 16-byte pieces of 32 nibbles (byte j:
 * low nibble = code j, high nibble = code j + 16):
 *   q4_0                      G = 32,  x = d * (q - 8)
 *   tq4g<G> (symmetric)       G = 32 .. 256,  x = d * (q - 7.5)
 * and q8_0 (G = 32, 32 int8 codes, x = d q) takes the same shape with 8-bit codes, stored + 128
 * (XOR 0x80) so that they are VPDPBUSD's unsigned operand.
 * A group of 16 rows (16 * k/G blocks of B bytes) becomes k/G chunks of 32 + 16 (B - 2) bytes,
 * chunk c =
 *
 *   bytes   0 ..  31        fp16 d of block c of rows 0..15
 *   then one 64-byte register P_u per dword u of the block's codes (u = 0 .. (B - 2)/4 - 1):
 *                           dword r of P_u = dword u of row r's codes
 *
 * so for the 4-bit types, with u = 4s + t (s = piece of 32 codes), P_u & 0x0F holds codes
 * 4t..4t+3 of piece s of every row and (P_u >> 4) & 0x0F codes 16+4t..16+4t+3; for q8_0 P_u holds
 * codes 4u..4u+3 (+ 128). The chunk sizes add up to 16 rows of the file type: a row-major view of group g
 * starts at g * 16 * row_size, as before, so the matmul driver's 16-aligned thread ranges and row
 * offsets stay valid.
 */
#ifndef TN_QUANT_REPACK_H
#define TN_QUANT_REPACK_H

#include "core/base.h"
#include "tensor/dtype.h"

#define TN_R16_ROWS 16

/* The interleaved type for file type t (q4_0, tq4g<G> symmetric, q8_0), or 0 if there is none. */
tn_dtype tn_r16_type_of(tn_dtype t);
/* The file type an interleaved type came from (0 if t is not one). */
tn_dtype tn_r16_file_type(tn_dtype t);

/* dst (m rows, m % 16 == 0, k % G == 0) = src (row-major, file type ft) interleaved. dst and
 * src must not overlap. */
void tn_repack_r16(tn_dtype ft, const void *src, void *dst, int64_t m, int64_t k);
/* Row i of an interleaved matrix (type it) back in its file type's bytes (k / G blocks). */
void tn_unpack_row_r16(tn_dtype it, const void *w, int64_t k, int64_t i, void *row);
/* Row i of an interleaved matrix as k floats (what the file type's dequantization gives). */
void tn_dequantize_row_r16(tn_dtype it, const void *w, int64_t k, int64_t i, float *out);

#endif
