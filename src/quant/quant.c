/*
 * quant.c — type-generic entry points over the reference quantizers (quant_legacy.c,
 * quant_k.c) and the plain float formats: one switch from a tn_dtype to its row function.
 *
 * F32 is a copy, F16 and BF16 round to nearest even (core/fp16.h, as ggml's row converters).
 * Q8_1 has no dequantizer in ggml; the one here (q * d, ignoring s) is tern's, for tests and
 * tools. Unsupported types and lengths that are not a whole number of blocks return false / 0
 * and leave the output untouched.
 */
#include <string.h>

#include "quant/quant.h"

static void tn_dequantize_row_q8_1(const block_q8_1 *x, float *y, int64_t k) {
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++, y += QK8_1) {
        const float d = tn_fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK8_1; j++) y[j] = x[i].qs[j] * d;
    }
}

/* True if k elements form whole blocks of type t (and t is a type with row functions). */
static bool tn_row_ok(tn_dtype t, int64_t k) {
    const tn_dtype_traits *tr = tn_dtype_get((uint32_t)t);
    return tr && k >= 0 && k % tr->blck_size == 0;
}

bool tn_quantize_row_ref(tn_dtype t, const float *x, void *y, int64_t k) {
    if (!tn_row_ok(t, k)) return false;
    switch (t) {
    case TN_F32: memmove(y, x, (size_t)k * sizeof(float)); return true;
    case TN_F16:
        for (int64_t i = 0; i < k; i++) ((tn_fp16 *)y)[i] = tn_fp32_to_fp16(x[i]);
        return true;
    case TN_BF16:
        for (int64_t i = 0; i < k; i++) ((tn_bf16 *)y)[i] = tn_fp32_to_bf16(x[i]);
        return true;
    case TN_Q4_0: tn_quantize_row_q4_0_ref(x, y, k); return true;
    case TN_Q4_1: tn_quantize_row_q4_1_ref(x, y, k); return true;
    case TN_Q5_0: tn_quantize_row_q5_0_ref(x, y, k); return true;
    case TN_Q5_1: tn_quantize_row_q5_1_ref(x, y, k); return true;
    case TN_Q8_0: tn_quantize_row_q8_0_ref(x, y, k); return true;
    case TN_Q8_1: tn_quantize_row_q8_1_ref(x, y, k); return true;
    case TN_Q2_K: tn_quantize_row_q2_K_ref(x, y, k); return true;
    case TN_Q3_K: tn_quantize_row_q3_K_ref(x, y, k); return true;
    case TN_Q4_K: tn_quantize_row_q4_K_ref(x, y, k); return true;
    case TN_Q5_K: tn_quantize_row_q5_K_ref(x, y, k); return true;
    case TN_Q6_K: tn_quantize_row_q6_K_ref(x, y, k); return true;
    case TN_Q8_K: tn_quantize_row_q8_K_ref(x, y, k); return true;
    case TN_IQ4_NL: tn_quantize_row_iq4_nl_ref(x, y, k); return true;
    case TN_IQ4_XS: tn_quantize_row_iq4_xs_ref(x, y, k); return true;
    case TN_MXFP4: tn_quantize_row_mxfp4_ref(x, y, k); return true;
    case TN_TQ1_0: tn_quantize_row_tq1_0_ref(x, y, k); return true;
    case TN_TQ2_0: tn_quantize_row_tq2_0_ref(x, y, k); return true;
    default: return false;
    }
}

bool tn_dequantize_row(tn_dtype t, const void *x, float *y, int64_t k) {
    if (!tn_row_ok(t, k)) return false;
    switch (t) {
    case TN_F32: memmove(y, x, (size_t)k * sizeof(float)); return true;
    case TN_F16:
        for (int64_t i = 0; i < k; i++) y[i] = tn_fp16_to_fp32(((const tn_fp16 *)x)[i]);
        return true;
    case TN_BF16:
        for (int64_t i = 0; i < k; i++) y[i] = tn_bf16_to_fp32(((const tn_bf16 *)x)[i]);
        return true;
    case TN_Q4_0: tn_dequantize_row_q4_0(x, y, k); return true;
    case TN_Q4_1: tn_dequantize_row_q4_1(x, y, k); return true;
    case TN_Q5_0: tn_dequantize_row_q5_0(x, y, k); return true;
    case TN_Q5_1: tn_dequantize_row_q5_1(x, y, k); return true;
    case TN_Q8_0: tn_dequantize_row_q8_0(x, y, k); return true;
    case TN_Q8_1: tn_dequantize_row_q8_1(x, y, k); return true;
    case TN_Q2_K: tn_dequantize_row_q2_K(x, y, k); return true;
    case TN_Q3_K: tn_dequantize_row_q3_K(x, y, k); return true;
    case TN_Q4_K: tn_dequantize_row_q4_K(x, y, k); return true;
    case TN_Q5_K: tn_dequantize_row_q5_K(x, y, k); return true;
    case TN_Q6_K: tn_dequantize_row_q6_K(x, y, k); return true;
    case TN_Q8_K: tn_dequantize_row_q8_K(x, y, k); return true;
    case TN_IQ4_NL: tn_dequantize_row_iq4_nl(x, y, k); return true;
    case TN_IQ4_XS: tn_dequantize_row_iq4_xs(x, y, k); return true;
    case TN_MXFP4: tn_dequantize_row_mxfp4(x, y, k); return true;
    case TN_TQ1_0: tn_dequantize_row_tq1_0(x, y, k); return true;
    case TN_TQ2_0: tn_dequantize_row_tq2_0(x, y, k); return true;
    case TN_IQ2_XXS:
    case TN_IQ2_XS:
    case TN_IQ2_S:
    case TN_IQ3_XXS:
    case TN_IQ3_S:
    case TN_IQ1_S:
    case TN_IQ1_M: tn_dequantize_row_iq(t, x, y, k); return true;
    default: return false;
    }
}

size_t tn_quantize_rows_ref(tn_dtype t, const float *x, void *y, int64_t nrows, int64_t n_per_row) {
    /* Row size 0 covers unknown types, partial blocks and overflow. */
    const size_t row_size = tn_dtype_row_size(t, n_per_row);
    if (row_size == 0 || nrows < 0) return 0;
    /* Probe support before writing anything, so an unsupported type leaves y untouched. */
    if (!tn_quantize_row_ref(t, x, y, 0)) return 0;
    /* Blocks never straddle rows, so row by row equals ggml's one call over nrows*n_per_row. */
    for (int64_t r = 0; r < nrows; r++) {
        tn_quantize_row_ref(t, x + r * n_per_row, (uint8_t *)y + (size_t)r * row_size, n_per_row);
    }
    return (size_t)nrows * row_size;
}
