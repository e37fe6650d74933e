/*
 * quant.h — reference quantizers and dequantizers of the fixed ggml block formats.
 *
 * tn_quantize_row_<t>_ref is bit-exact with ggml's quantize_row_<t>_ref (what llama-quantize
 * uses when no importance matrix is given); tn_dequantize_row_<t> is bit-exact with ggml's
 * dequantize_row_<t>. k must be a multiple of the block length. These are readable scalar code:
 * the references every optimized kernel is tested against.
 */
#ifndef TN_QUANT_QUANT_H
#define TN_QUANT_QUANT_H

#include "quant/blocks.h"
#include "tensor/dtype.h"

void tn_quantize_row_q4_0_ref(const float *x, block_q4_0 *y, int64_t k);
void tn_quantize_row_q4_1_ref(const float *x, block_q4_1 *y, int64_t k);
void tn_quantize_row_q5_0_ref(const float *x, block_q5_0 *y, int64_t k);
void tn_quantize_row_q5_1_ref(const float *x, block_q5_1 *y, int64_t k);
void tn_quantize_row_q8_0_ref(const float *x, block_q8_0 *y, int64_t k);
void tn_quantize_row_q8_1_ref(const float *x, block_q8_1 *y, int64_t k);
void tn_quantize_row_q2_K_ref(const float *x, block_q2_K *y, int64_t k);
void tn_quantize_row_q3_K_ref(const float *x, block_q3_K *y, int64_t k);
void tn_quantize_row_q4_K_ref(const float *x, block_q4_K *y, int64_t k);
void tn_quantize_row_q5_K_ref(const float *x, block_q5_K *y, int64_t k);
void tn_quantize_row_q6_K_ref(const float *x, block_q6_K *y, int64_t k);
void tn_quantize_row_q8_K_ref(const float *x, block_q8_K *y, int64_t k);

/* Activation quantizers as ggml's x86 CPU path computes them (quant_act.c): 127/amax multiplier,
 * round half to even. The kernel table's from_float for q8_0/q8_1 uses these. */
void tn_quantize_row_q8_0_act(const float *x, block_q8_0 *y, int64_t k);
void tn_quantize_row_q8_1_act(const float *x, block_q8_1 *y, int64_t k);

void tn_dequantize_row_q4_0(const block_q4_0 *x, float *y, int64_t k);
void tn_dequantize_row_q4_1(const block_q4_1 *x, float *y, int64_t k);
void tn_dequantize_row_q5_0(const block_q5_0 *x, float *y, int64_t k);
void tn_dequantize_row_q5_1(const block_q5_1 *x, float *y, int64_t k);
void tn_dequantize_row_q8_0(const block_q8_0 *x, float *y, int64_t k);
void tn_dequantize_row_q2_K(const block_q2_K *x, float *y, int64_t k);
void tn_dequantize_row_q3_K(const block_q3_K *x, float *y, int64_t k);
void tn_dequantize_row_q4_K(const block_q4_K *x, float *y, int64_t k);
void tn_dequantize_row_q5_K(const block_q5_K *x, float *y, int64_t k);
void tn_dequantize_row_q6_K(const block_q6_K *x, float *y, int64_t k);
void tn_dequantize_row_q8_K(const block_q8_K *x, float *y, int64_t k);

/* Lookup-table and ternary types (quant_iq.c). The *_ref quantizers are ggml's quantize_row_*_ref;
 * tn_quantize_iq4_nl / tn_quantize_iq4_xs are ggml's quantize_iq4_nl / quantize_iq4_xs (what
 * llama-quantize writes, with importance weights qw[k] or NULL), which for iq4_nl searches more
 * scales than its _ref. */
void tn_quantize_row_iq4_nl_ref(const float *x, block_iq4_nl *y, int64_t k);
void tn_quantize_row_iq4_xs_ref(const float *x, block_iq4_xs *y, int64_t k);
void tn_quantize_row_mxfp4_ref(const float *x, block_mxfp4 *y, int64_t k);
void tn_quantize_row_tq1_0_ref(const float *x, block_tq1_0 *y, int64_t k);
void tn_quantize_row_tq2_0_ref(const float *x, block_tq2_0 *y, int64_t k);
void tn_quantize_iq4_nl(const float *x, block_iq4_nl *y, int64_t k, const float *qw);
void tn_quantize_iq4_xs(const float *x, block_iq4_xs *y, int64_t k, const float *qw);
void tn_dequantize_row_iq4_nl(const block_iq4_nl *x, float *y, int64_t k);
void tn_dequantize_row_iq4_xs(const block_iq4_xs *x, float *y, int64_t k);
void tn_dequantize_row_mxfp4(const block_mxfp4 *x, float *y, int64_t k);
void tn_dequantize_row_tq1_0(const block_tq1_0 *x, float *y, int64_t k);
void tn_dequantize_row_tq2_0(const block_tq2_0 *x, float *y, int64_t k);
/* The 256 trits (0, 1, 2 for -1, 0, +1) of a tq1_0 block in element order. */
void tn_tq1_0_trits(const block_tq1_0 *b, uint8_t t[QK_K]);
/* n trits t[i * stride] (0..2, the most significant first; n <= 5) as one tq1_0 byte: a base-3
 * fraction of 256 rounded up, as ggml's quantizer writes it. */
uint8_t tn_tq1_0_pack(const uint8_t *t, int stride, int n);

/* Codebook i-quants (quant_iq2.c, layouts in blocks.h, grids in iq_grid.h): iq2_xxs, iq2_xs,
 * iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m. A 32-element sub-block decodes to signed integer grid
 * values q, a scale code s per 16-element half and (iq1 only) the sign of each group of 8's 1/8
 * shift (+1 for the other types). */
typedef struct tn_iq_sub {
    int8_t q[32];
    uint8_t s[2];
    int8_t delta[4];
} tn_iq_sub;
/* Sub-block ib (0..7) of one block of type t (one of the seven above, or the load-time iq2 *_p3
 * layouts, repack.h; other types: all zero). */
void tn_iq_sub_decode(tn_dtype t, const void *blk, int ib, tn_iq_sub *o);
/* The block's fp16 super-block scale as a float. */
float tn_iq_block_d(tn_dtype t, const void *blk);
/* Dequantization, bit-exact with ggml's dequantize_row_<t>; k % 256 == 0. */
void tn_dequantize_row_iq(tn_dtype t, const void *x, float *y, int64_t k);
static inline bool tn_dtype_is_iq_grid(tn_dtype t) {
    return t == TN_IQ2_XXS || t == TN_IQ2_XS || t == TN_IQ2_S || t == TN_IQ3_XXS || t == TN_IQ3_S || t == TN_IQ1_S ||
           t == TN_IQ1_M;
}

/* Quantizers to the codebook i-quants (quant_iqgrid.c, quant_iq1.c), byte-identical with ggml's
 * quantize_<t> (what llama-quantize writes), with importance qw[k] (the columns' imatrix entries)
 * or NULL. Return false (y untouched) for another type, k % 256 != 0, a type that cannot work
 * without importance (iq2_xxs, iq2_xs, iq1_s, iq1_m: ggml asserts) given NULL, or no memory for
 * the grid's search tables (iq_map.c). Thread-safe. */
bool tn_quantize_iq_grid(tn_dtype t, const float *x, void *y, int64_t k, const float *qw);
static inline bool tn_iq_needs_weights(tn_dtype t) { return t == TN_IQ2_XXS || t == TN_IQ2_XS || t == TN_IQ1_S; }
bool tn_quantize_iq1(tn_dtype t, const float *x, void *y, int64_t k, const float *qw);

/* Type-generic entry points (F32, F16, BF16 and every type above). Return false for a type
 * without a reference (y untouched). */
bool tn_quantize_row_ref(tn_dtype t, const float *x, void *y, int64_t k);
bool tn_dequantize_row(tn_dtype t, const void *x, float *y, int64_t k);

/* One row of k floats (the whole row: legacy types weigh by the row's mean square) quantized with
 * the importance imat[k] of its columns, bit-exact with ggml's quantize_row_<t>_impl (what
 * llama-quantize --imatrix writes) for q2_K..q6_K, q4_0, q4_1, q5_0, q5_1; other types, and
 * imat == NULL, use tn_quantize_row_ref — except iq4_nl / iq4_xs, which take ggml's file
 * quantizer (tn_quantize_iq4_*) with or without imat, as llama-quantize does. quant_iw.c. */
bool tn_quantize_row_imat(tn_dtype t, const float *x, void *y, int64_t k, const float *imat);

/* Quantizes nrows rows of n_per_row floats; returns bytes written (0 on unsupported type). */
size_t tn_quantize_rows_ref(tn_dtype t, const float *x, void *y, int64_t nrows, int64_t n_per_row);

/* k-quant scale packing helper shared by q4_K/q5_K (ggml get_scale_min_k4). */
static inline void tn_get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

#endif
