/*
 * repack.h — load-time weight layouts for the batched kernels (the layouts are never written to
 * a file; their dtypes are internal, tensor/dtype.h).
 *
 * *_r16: 4-bit weights with 16 rows interleaved so that one 512-bit VPDPBUSD multiplies 16 rows
 * at once (int32 lane r = row r) by four activations broadcast to every lane; no horizontal sums,
 * and the nibble unpacking is shared by every activation column of a batch. Three file types have
 * the same shape of block — an fp16 scale d, then codes in 16-byte pieces of 32 nibbles (byte j:
 * low nibble = code j, high nibble = code j + 16):
 *   q4_0                      G = 32,  x = d * (q - 8)
 *   tq4g<G> (symmetric)       G = 32 .. 256,  x = d * (q - 7.5)
 *   iq4_nl                    G = 32,  x = d * table[q] (ggml's kvalues_iq4nl)
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
 *
 * q4_K, q5_K and q6_K (256 codes per block) keep the 16-row chunks (16 blocks' bytes: 2304, 2816,
 * 3360)
 * with their scales rearranged so that one byte load per sub-block gives all 16 rows' scales:
 *
 *   q4_K_r16 chunk c (block c of rows 0..15):
 *     bytes    0 ..   31    fp16 d of rows 0..15;  32 .. 63 fp16 dmin
 *     bytes   64 ..  191    byte 16 j + r: 6-bit scale j of row r | (bits 4..5 of min j) << 6
 *     bytes  192 ..  255    byte 16 p + r: bits 0..3 of min 2p | bits 0..3 of min 2p+1 << 4
 *     bytes  256 .. 2303    register P_{8p+u}, p = 0..3, u = 0..7: dword r = dword u of row r's
 *                           qs[32p .. 32p+31], so P & 0x0F holds codes 4u..4u+3 of sub-block 2p
 *                           of every row, (P >> 4) & 0x0F those of sub-block 2p+1
 *   q5_K_r16 chunk c: bytes 0 .. 255 as q4_K_r16's, then
 *     bytes  256 ..  767    registers H_u, u = 0..7: dword r = dword u of row r's qh (bit j of
 *                           byte l: bit 4 of code 32j + l)
 *     bytes  768 .. 2815    the qs registers as q4_K_r16's
 *   q6_K_r16 chunk c:
 *     bytes    0 ..   31    fp16 d of rows 0..15
 *     bytes   32 ..  287    byte 16 j + r: int8 scale j (16-code sub-block j) of row r
 *     bytes  288 .. 2335    registers L_{8p+u}: dword r = dword u of row r's ql[32p .. 32p+31]
 *     bytes 2336 .. 3359    registers H_{8h+u}: dword r = dword u of row r's qh[32h .. 32h+31]
 *                           (code 128h + 32e + l: nibble e/2 of ql[64h + 32(e%2) + l] | bits
 *                           2e, 2e+1 of qh[32h + l] << 4, minus 32 — ggml's q6_K)
 *
 *   iq4_xs_r16 chunk c (16 blocks' bytes: 2176):
 *     bytes    0 ..   31    fp16 d of rows 0..15
 *     bytes   32 ..   95    byte 16 p + r: scales_l[p] of row r (low 4 bits of the 6-bit scales of
 *                           sub-blocks 2p, low nibble, and 2p + 1)
 *     bytes   96 ..  127    byte 16 q + r: byte q of row r's scales_h (their high 2 bits, sub-block
 *                           4q + i in bits 2i, 2i + 1)
 *     bytes  128 .. 2175    registers P_u, u = 0..31: dword r = dword u of row r's qs, so P & 0x0F
 *                           holds codes 4t..4t+3 of sub-block u / 4 (t = u % 4) of every row and
 *                           (P >> 4) & 0x0F codes 16+4t..16+4t+3: indices into the iq4_nl table
 *
 *   tq2_0_r16 chunk c (16 blocks' bytes: 1056):
 *     bytes    0 ..   31    fp16 d of rows 0..15
 *     bytes   32 .. 1055    registers P_u, u = 0..15: dword r = dword u of row r's qs, so
 *                           (P_u >> 2l) & 3 holds the 2-bit codes (value = code - 1) of weights
 *                           128 (u / 8) + 32 l + 4 (u % 8) + 0..3 of every row (ggml's tq2_0: bits
 *                           2l, 2l + 1 of qs[32 h + m] are weight 128 h + 32 l + m)
 *
 * *_l32: 1-bit tq weights (tq1g<G>[a], any G, symmetric or asymmetric) with 32 rows interleaved
 * for the lookup-table decode kernel (src/kern/avx512/tq1_lut.c: one VPERMW looks up the partial
 * sums of 4 codes for 32 rows at once). A group of 32 rows (32 * k/G blocks of B bytes) becomes
 * k/G chunks of 32 B bytes, chunk b (block b of the 32 rows) =
 *
 *   bytes   0 ..  63        fp16 d of rows 0, 2, .., 30, then rows 1, 3, .., 31
 *   bytes  64 .. 127        fp16 m, same order (asymmetric types only)
 *   then per piece s of 32 codes (G / 32 of them) two 64-byte registers R_h, h = 0, 1:
 *                           16-bit word r of R_h = bits 16 h .. 16 h + 15 of row r's piece s
 *                           (the little-endian u32 of the 1-bit plane: bit n = code n)
 *
 * so bits 0-5, 6-11 and 12-15 of word r of R_h hold codes 16 h + 0..5, 6..11 and 12..15 of row
 * r: the indices into the kernel's tables of the possible sums of those activations. Even and odd rows' scales are apart because
 * the kernel widens its 16-bit sums with VPMADDWD, which splits even and odd words. The chunk
 * sizes add up to 32 rows of the file type, as for *_r16.
 */
#ifndef TN_QUANT_REPACK_H
#define TN_QUANT_REPACK_H

#include "core/base.h"
#include "tensor/dtype.h"

#define TN_R16_ROWS 16
/* byte offsets inside a q4_K_r16 / q6_K_r16 chunk (above) */
#define TN_R16_Q4K_SC 64
#define TN_R16_Q4K_MN 192
#define TN_R16_Q4K_QS 256
#define TN_R16_Q5K_QH 256
#define TN_R16_Q5K_QS 768
#define TN_R16_Q6K_SC 32
#define TN_R16_Q6K_QL 288
#define TN_R16_Q6K_QH 2336
#define TN_R16_IQ4_SL 32
#define TN_R16_IQ4_SH 96
#define TN_R16_IQ4_QS 128
#define TN_R16_TQ2_QS 32

/* The interleaved type for file type t (q4_0, tq4g<G> symmetric, q8_0, q4_K, q5_K, q6_K, iq4_xs, iq4_nl,
 * tq2_0, and tq1_0 expanded into tq2_0_r16's chunks), or 0. */
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

#define TN_L32_ROWS 32

/* The tq1 lookup-table layout for file type t (tq1g<G>[a]), or 0. */
tn_dtype tn_l32_type_of(tn_dtype t);
/* The file type an l32 type came from (0 if t is not one). */
tn_dtype tn_l32_file_type(tn_dtype t);
/* dst (m rows, m % 32 == 0) = src (row-major tq1 file type ft) in the l32 layout; no overlap. */
void tn_repack_l32(tn_dtype ft, const void *src, void *dst, int64_t m, int64_t k);
/* Row r (0..31) of one chunk of an l32 matrix (block b of a group starts at b * 32 * block bytes)
 * back in the file type's block bytes. */
void tn_unpack_block_l32(tn_dtype it, const void *chunk, int r, void *blk);
/* Row i of an l32 matrix back in its file type's bytes. */
void tn_unpack_row_l32(tn_dtype it, const void *w, int64_t k, int64_t i, void *row);

/* *_c16: tq rows of b = 2..8 bits (any G, symmetric or asymmetric) with each whole super-step of
 * 512 codes (16 chunks of 32, 512 / G blocks) rearranged so that the decode kernels load it as it
 * is (src/kern/avx512/tq_gemm.c): register r (0..7) of a super-step holds, on dword lane c,
 * codes 4r .. 4r + 3 of chunk c — one lane per chunk, as the prefill kernel's unpacked rows. A
 * super-step of the file's bytes (same size) becomes
 *
 *   bytes 0 .. HB - 1       the blocks' headers as in the file (d [m] fp16 per block, block order)
 *   then the planes (widths w0 >= w1 >= w2, low bits first, quant/tq.h), each w 64-byte vectors:
 *                           byte 4c + i of vector v of the plane holds, in field f (bits w f ..
 *                           w f + w - 1), the plane's bits of code 4r + i of chunk c, for
 *                           register r = v (8 / w) + f
 *
 * so register r is, per plane, one field of one vector moved into the code's bit position (an AND
 * for plane 0's field 0, else one GF2P8AFFINEQB), ORed together — no permutes and no folding of
 * lanes (fields beat 64-bit masks with masked byte adds: 1.33-1.83x vs 1.26-1.75x the file
 * layout's kernel for b = 3, 5, and 0.73x for b = 7). The blocks after the last whole
 * super-step stay in the file's bytes; rows keep their size, so the layout is per row
 * (tn_repack_rows = 1). */

/* The c16 layout of file type t (tq<b>g<G>[a], b = 2..8), or 0. */
tn_dtype tn_c16_type_of(tn_dtype t);
/* The file type of a c16 type (0 if t is not one). */
tn_dtype tn_c16_file_type(tn_dtype t);
/* dst (m rows of k codes) = src (file type ft) in the c16 layout; no overlap. */
void tn_repack_c16(tn_dtype ft, const void *src, void *dst, int64_t m, int64_t k);
/* Whole super-steps of a file-layout row -> c16 bytes, nsup of them: an optional faster
 * implementation of the same bytes, installed by the SIMD kernels (src/kern/avx512/tq.c) in
 * tn_c16_put_fast[tq index]; tn_repack_c16 uses it when set. */
typedef void (*tn_c16_put_fn)(const uint8_t *src, uint8_t *dst, int64_t nsup);
extern tn_c16_put_fn tn_c16_put_fast[TN_DTYPE_TQ_COUNT];
/* One row of a c16 matrix (type it) back in its file type's bytes. */
void tn_unpack_row_c16(tn_dtype it, const void *row_c16, int64_t k, void *row);

/* *_p3: iq2_xxs, iq2_xs and iq2_s rows with each block's grid entries expanded (blocks.h
 * block_iq2_p3: 106 bytes a block against 66 / 74 / 82 in the file). Every byte of the three
 * grids is 8, 25 or 43, so a 2-bit magnitude code and a sign bit per weight keep the block exactly;
 * the decode kernel then needs one byte shuffle per 64 weights where the file layout loads eight
 * grid entries one by one (src/kern/avx512/dot_iq2.c). Rows keep their order (tn_repack_rows = 1)
 * but grow, so the layout is made only into a new buffer (a mapped file), never in place. */

/* *_p4: the same for iq3_xxs and iq3_s (blocks.h block_iq3_p4: a 4-bit code per weight, 138 bytes a
 * block against 98 / 110): one VPSHUFB per 64 weights. */

/* The expanded layout (p3, p4) of file type t (iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s), or 0. */
tn_dtype tn_xp_type_of(tn_dtype t);
/* The file type of an expanded type (0 if it is not one). */
tn_dtype tn_xp_file_type(tn_dtype it);
/* dst (m rows of k, k % 256 == 0, m * k / 256 expanded blocks) = src (file type ft) expanded;
 * false if a block holds a value no grid of ft has (dst is then incomplete). No overlap. */
bool tn_repack_xp(tn_dtype ft, const void *src, void *dst, int64_t m, int64_t k);
/* Row i of an expanded matrix back in its file type's bytes. */
void tn_unpack_row_xp(tn_dtype it, const void *w, int64_t k, int64_t i, void *row);

/* ---- every load-time layout (r16, l32, p3 and c16) ---- */
/* The layout file type t moves to (tn_r16_type_of, then tn_l32_type_of, tn_xp_type_of, tn_c16_type_of), or 0. */
tn_dtype tn_repack_type_of(tn_dtype t);
/* The file type of layout it, or 0 if it is not a load-time layout. */
tn_dtype tn_repack_file_type(tn_dtype it);
/* True for the layouts larger than their file type's blocks (the expanded i-quants p2 / p3 / p4,
 * tq1_0_r16): made only into a new buffer, never in place. */
bool tn_repack_grows(tn_dtype it);
/* Rows per interleaved group of layout it (16, 32, or 1 for c16; 0 if it is not one). */
int tn_repack_rows(tn_dtype it);
/* dst = src (file type ft, m rows, a multiple of tn_repack_rows) in layout tn_repack_type_of(ft);
 * dst holds tn_dtype_tensor_size(layout, k, m) bytes (more than src for p3). */
void tn_repack(tn_dtype ft, const void *src, void *dst, int64_t m, int64_t k);
/* Row i of a matrix in layout it back in its file type's bytes. */
void tn_unpack_row(tn_dtype it, const void *w, int64_t k, int64_t i, void *row);
/* Row i of a matrix in layout it as k floats (the file type's dequantization). */
void tn_dequantize_row_repacked(tn_dtype it, const void *w, int64_t k, int64_t i, float *out);

#endif
