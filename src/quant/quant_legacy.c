/*
 * quant_legacy.c — reference quantizers and dequantizers of ggml's 32-element block formats:
 * q4_0, q4_1, q5_0, q5_1, q8_0 and q8_1 (q8_1 is an activation format; it has no dequantizer
 * in ggml, tern's lives in quant.c).
 *
 * Invariant: every function here produces the same bytes (quantize) or the same floats
 * (dequantize) as ggml's quantize_row_<t>_ref / dequantize_row_<t> at llama.cpp 34af94cd9. That
 * means the same float operations in the same order, the same rounding (roundf for q8, add-0.5
 * then truncate for q4/q5) and the same scale conventions, including ggml's quirks:
 *   - q4_0/q5_0 divide by the *signed* element of largest magnitude (d = max / -8), so the
 *     extreme element lands exactly on the most negative level and the scale may be negative;
 *   - scales are computed in float and rounded to fp16 only when stored; the quants are computed
 *     with the unrounded float scale.
 * The whole tree is compiled as ISO C11 (no FMA contraction), which keeps a*b+c two roundings,
 * as ggml's baseline x86-64 build does.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "quant/quant.h"

/* The element of largest magnitude, with its sign. On ties the first one wins (ggml's strict <). */
static float tn_signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

/* Largest magnitude (sign dropped), as ggml's MAX(amax, fabsf(v)) loop computes it. */
static float tn_absmax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
    return amax;
}

/* Minimum and maximum of a block (ggml starts from +-FLT_MAX). */
static void tn_minmax(const float *x, int n, float *min_out, float *max_out) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    *min_out = min;
    *max_out = max;
}

/* ---- q4_0: 32 x 4-bit, q in [0,15], value = (q - 8) * d ---------------------------------- */

void tn_quantize_row_q4_0_ref(const float *x, block_q4_0 *y, int64_t k) {
    const int64_t nb = k / QK4_0;
    for (int64_t i = 0; i < nb; i++, x += QK4_0) {
        /* Scale from the signed extreme: that element maps to level 0 (value -8 d). */
        const float max = tn_signed_absmax(x, QK4_0);
        const float d = max / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tn_fp32_to_fp16(d);
        /* Element j goes to the low nibble of qs[j], element j+16 to the high nibble. The +8.5
         * then truncation rounds half up onto [0,16]; 16 (only reachable at x = -max) clamps to 15. */
        for (int j = 0; j < QK4_0 / 2; j++) {
            int lo = (int)(x[j] * id + 8.5f);
            int hi = (int)(x[j + QK4_0 / 2] * id + 8.5f);
            lo = lo < 15 ? lo : 15;
            hi = hi < 15 ? hi : 15;
            y[i].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void tn_dequantize_row_q4_0(const block_q4_0 *x, float *y, int64_t k) {
    const int64_t nb = k / QK4_0;
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        const float d = tn_fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = ((x[i].qs[j] & 0x0F) - 8) * d;
            y[j + QK4_0 / 2] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

/* ---- q4_1: 32 x 4-bit, q in [0,15], value = q * d + m ------------------------------------- */

void tn_quantize_row_q4_1_ref(const float *x, block_q4_1 *y, int64_t k) {
    const int64_t nb = k / QK4_1;
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        /* Affine grid from min to max in 15 steps; m is the block minimum. */
        float min, max;
        tn_minmax(x, QK4_1, &min, &max);
        const float d = (max - min) / ((1 << 4) - 1);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tn_fp32_to_fp16(d);
        y[i].m = tn_fp32_to_fp16(min);
        /* Round half up by +0.5 and truncation; clamp guards the top against rounding noise. */
        for (int j = 0; j < QK4_1 / 2; j++) {
            int lo = (int)((x[j] - min) * id + 0.5f);
            int hi = (int)((x[j + QK4_1 / 2] - min) * id + 0.5f);
            lo = lo < 15 ? lo : 15;
            hi = hi < 15 ? hi : 15;
            y[i].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void tn_dequantize_row_q4_1(const block_q4_1 *x, float *y, int64_t k) {
    const int64_t nb = k / QK4_1;
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        const float d = tn_fp16_to_fp32(x[i].d);
        const float m = tn_fp16_to_fp32(x[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (x[i].qs[j] & 0x0F) * d + m;
            y[j + QK4_1 / 2] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

/* ---- q5_0: 32 x 5-bit, q in [0,31], value = (q - 16) * d; bit 4 of q_j is bit j of qh ---- */

void tn_quantize_row_q5_0_ref(const float *x, block_q5_0 *y, int64_t k) {
    const int64_t nb = k / QK5_0;
    for (int64_t i = 0; i < nb; i++, x += QK5_0) {
        /* Same signed-extreme scale as q4_0, with 16 negative levels. */
        const float max = tn_signed_absmax(x, QK5_0);
        const float d = max / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tn_fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            int lo = (int)(x[j] * id + 16.5f);
            int hi = (int)(x[j + QK5_0 / 2] * id + 16.5f);
            lo = lo < 31 ? lo : 31;
            hi = hi < 31 ? hi : 31;
            /* Low 4 bits packed in nibbles as q4_0; the 5th bit of element e goes to qh bit e. */
            y[i].qs[j] = (uint8_t)((lo & 0x0F) | ((hi & 0x0F) << 4));
            qh |= (uint32_t)((lo >> 4) & 1) << j;
            qh |= (uint32_t)((hi >> 4) & 1) << (j + QK5_0 / 2);
        }
        memcpy(y[i].qh, &qh, sizeof qh); /* little-endian, as ggml */
    }
}

void tn_dequantize_row_q5_0(const block_q5_0 *x, float *y, int64_t k) {
    const int64_t nb = k / QK5_0;
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        const float d = tn_fp16_to_fp32(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int lo = (x[i].qs[j] & 0x0F) | (int)(((qh >> j) & 1) << 4);
            const int hi = (x[i].qs[j] >> 4) | (int)(((qh >> (j + QK5_0 / 2)) & 1) << 4);
            y[j] = (lo - 16) * d;
            y[j + QK5_0 / 2] = (hi - 16) * d;
        }
    }
}

/* ---- q5_1: 32 x 5-bit, q in [0,31], value = q * d + m -------------------------------------- */

void tn_quantize_row_q5_1_ref(const float *x, block_q5_1 *y, int64_t k) {
    const int64_t nb = k / QK5_1;
    for (int64_t i = 0; i < nb; i++, x += QK5_1) {
        float min, max;
        tn_minmax(x, QK5_1, &min, &max);
        const float d = (max - min) / ((1 << 5) - 1);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tn_fp32_to_fp16(d);
        y[i].m = tn_fp32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            /* ggml does not clamp here: (x - min) * id <= 31 up to rounding, so +0.5 and
             * truncation stays <= 31. The bit masks below mirror ggml for any value. */
            const unsigned lo = (unsigned)(uint8_t)((x[j] - min) * id + 0.5f);
            const unsigned hi = (unsigned)(uint8_t)((x[j + QK5_1 / 2] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((lo & 0x0F) | ((hi & 0x0F) << 4));
            qh |= ((lo >> 4) & 1u) << j;
            qh |= ((hi >> 4) & 1u) << (j + QK5_1 / 2);
        }
        memcpy(y[i].qh, &qh, sizeof qh);
    }
}

void tn_dequantize_row_q5_1(const block_q5_1 *x, float *y, int64_t k) {
    const int64_t nb = k / QK5_1;
    for (int64_t i = 0; i < nb; i++, y += QK5_1) {
        const float d = tn_fp16_to_fp32(x[i].d);
        const float m = tn_fp16_to_fp32(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int lo = (x[i].qs[j] & 0x0F) | (int)(((qh >> j) & 1) << 4);
            const int hi = (x[i].qs[j] >> 4) | (int)(((qh >> (j + QK5_1 / 2)) & 1) << 4);
            y[j] = lo * d + m;
            y[j + QK5_1 / 2] = hi * d + m;
        }
    }
}

/* ---- q8_0: 32 x int8, value = q * d, d = amax / 127 --------------------------------------- */

void tn_quantize_row_q8_0_ref(const float *x, block_q8_0 *y, int64_t k) {
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        const float d = tn_absmax(x, QK8_0) / ((1 << 7) - 1);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tn_fp32_to_fp16(d);
        /* roundf: half away from zero; |x * id| <= 127 up to rounding, so it fits int8. */
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

void tn_dequantize_row_q8_0(const block_q8_0 *x, float *y, int64_t k) {
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        const float d = tn_fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = x[i].qs[j] * d;
    }
}

/* ---- q8_1: q8_0 plus s = d * sum(q), the activation side of q4_1/q5_1 dot products -------- */

void tn_quantize_row_q8_1_ref(const float *x, block_q8_1 *y, int64_t k) {
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++, x += QK8_1) {
        const float d = tn_absmax(x, QK8_1) / ((1 << 7) - 1);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tn_fp32_to_fp16(d);
        /* The sum of the quants times the float (not fp16) scale lets the dot product add the
         * weight block's min term without touching the quants again. */
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = tn_fp32_to_fp16(sum * d);
    }
}
