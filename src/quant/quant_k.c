/*
 * quant_k.c — reference quantizers and dequantizers of ggml's 256-element "k-quant" super-block
 * formats: q2_K, q3_K, q4_K, q5_K, q6_K and the activation format q8_K.
 *
 * A super-block holds 8 or 16 groups; each group gets its own scale (and for q2_K/q4_K/q5_K a
 * min), and those group scales are themselves quantized (4, 6 or 8 bits) against one fp16 super
 * scale d (and dmin). Quantizing is therefore a search: per group, find the scale (and min) that
 * minimizes a weighted error (ggml's make_*_quants helpers below), then quantize the group scales,
 * then requantize every element against the *stored* (rounded) scales.
 *
 * Invariant: bytes and floats identical to ggml's quantize_row_<t>_ref / dequantize_row_<t> at
 * llama.cpp 34af94cd9 (what llama-quantize uses without an importance matrix). The searches are
 * sensitive to every float rounding, so the arithmetic below keeps ggml's operations and their
 * order exactly; the code is organized and commented differently. Tree-wide ISO C11 compilation
 * keeps a*b+c unfused, matching ggml's baseline x86-64 build.
 *
 * Not here: the importance-matrix variants (quantize_row_<t>_impl with quant_weights), which are
 * in quant_iw.c and share tn_make_qx_quants (ksearch.h).
 */
#include <math.h>
#include <string.h>

#include "quant/ksearch.h"
#include "quant/quant.h"


/* Element of largest magnitude with its sign (first one wins on ties). */
static float tn_signed_absmax(const float *x, int n, float *amax_out) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    *amax_out = amax;
    return max;
}

/* ---- group scale searches (ggml's helpers) ------------------------------------------------- */

/*
 * Symmetric group: levels l in [-nmax, nmax-1], value = scale * l; returns scale, L[i] = l + nmax.
 * rmse_type 0: the plain scale max / -nmax. rmse_type 1: start there, then try 18 nearby inverse
 * scales -(nmax + 0.1 is)/max and keep the one with the best weighted least-squares fit, weights
 * qw (or x^2 when qw is NULL). ggml's other rmse types are unused by the references.
 */
float tn_make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type, const float *qw) {
    float amax;
    const float max = tn_signed_absmax(x, n, &amax);
    /* An all-zero group: every level 0 (not nmax), scale 0. */
    if (amax < TN_GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.0f;
    }
    float iscale = -nmax / max;
    if (rmse_type == 0) {
        for (int i = 0; i < n; i++) L[i] = (int8_t)(nmax + tn_clampi(tn_nearest_int(iscale * x[i]), -nmax, nmax - 1));
        return 1 / iscale;
    }
    /* First candidate: the plain scale. sumlx / suml2 is the least-squares scale for the levels;
     * its fit quality is sumlx^2 / suml2 (larger is better). */
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = tn_clampi(tn_nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = qw ? qw[i] : x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    /* Nudge the inverse scale by +-0.1 .. +-0.9 levels; keep a candidate only if it fits better
     * (compared cross-multiplied, as ggml does: sumlx^2 > best * suml2). */
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = tn_clampi(tn_nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = qw ? qw[i] : x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) L[i] = (int8_t)(nmax + tn_clampi(tn_nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/*
 * Symmetric group for q3_K: levels in [-nmax, nmax-1]. With do_rmse, start from the plain scale
 * and then, up to 5 passes, move single elements to the level that the least-squares scale of
 * the others suggests, when that improves the weighted (x^2) fit. Returns the scale; L[i] = l + nmax.
 */
static float tn_make_q3_quants(int n, int nmax, const float *x, int8_t *L, bool do_rmse) {
    float amax;
    const float max = tn_signed_absmax(x, n, &amax);
    if (amax < TN_GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.0f;
    }
    const float iscale = -nmax / max;
    if (!do_rmse) {
        for (int i = 0; i < n; i++) L[i] = (int8_t)(tn_clampi(tn_nearest_int(iscale * x[i]), -nmax, nmax - 1) + nmax);
        return 1 / iscale;
    }
    /* Initial levels (kept signed during the search) and their fit sums. */
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = tn_clampi(tn_nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    /* Coordinate descent: for element i, take it out of the sums, pick its best level for the
     * scale the rest implies (x_i * sl2 / slx), and keep the change if the total fit improves. */
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                const int new_l = tn_clampi(tn_nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/*
 * Asymmetric group (q2_K, q4_K, q5_K): levels l in [0, nmax], value = scale * l - the_min, with
 * the_min >= 0 (the group minimum, clipped so that 0 is representable). Starts from the min..max
 * grid, then tries nstep+1 inverse scales (rmin + rdelta*is + nmax) / (max - min), each with the
 * weighted least-squares (scale, min) for its levels, keeping the lowest weighted error (squared,
 * or absolute with use_mad). Returns the scale; *the_min = -min.
 */
float tn_make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                          uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad) {
    /* Range and the weighted sums that do not depend on the levels. */
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    /* Constant (zero after clipping) group: levels 0, the min carries the value. */
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.0f;
    }
    /* Baseline: the plain min..max grid and its error. */
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        const int l = tn_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)tn_clampi(l, 0, nmax);
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    /* Candidate grids: levels from a stretched inverse scale, then the exact weighted fit
     * x ~ this_scale * l + this_min by 2x2 normal equations (determinant D). */
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = tn_clampi(tn_nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            /* A positive min is not representable (mins are stored as magnitudes subtracted):
             * refit the scale alone with min 0. */
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* 2-bit levels of 256 elements into 64 bytes: byte l of each 32-byte half holds elements
 * l, l+32, l+64, l+96 of its 128-element half in bits 0-1, 2-3, 4-5, 6-7 (q2_K and q3_K). */
static void tn_pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128) {
        for (int l = 0; l < 32; l++) {
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
        }
    }
}

/* q4_K/q5_K: 8 six-bit scales and 8 six-bit mins in 12 bytes. Groups 0-3 use the low 6 bits of
 * bytes 0-3 (scale) and 4-7 (min); groups 4-7 keep their low 4 bits in the nibbles of bytes
 * 8-11 and their top 2 bits in the top bits of bytes 0-3 (scale) and 4-7 (min). */
static void tn_pack_scale_min_k4(const uint8_t ls[8], const uint8_t lm[8], uint8_t q[K_SCALE_SIZE]) {
    for (int j = 0; j < QK_K / 32; j++) {
        if (j < 4) {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            q[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            q[j - 0] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* q3_K: sixteen 6-bit scales (biased by 32) in 12 bytes. Low 4 bits: nibbles of bytes 0-7
 * (groups 0-7 low nibble, 8-15 high nibble); top 2 bits: byte 8 + j%4, bit pair j/4. */
static int tn_q3k_scale(const uint8_t *sc, int j) {
    const int lo = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4;
    const int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* ---- q2_K: 16 groups of 16, 2-bit levels, 4-bit scale and 4-bit min per group ------------- */

void tn_quantize_row_q2_K_ref(const float *x, block_q2_K *y, int64_t k) {
    const int64_t nb = k / QK_K;
    const float q4scale = 15.f;
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];

    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        /* 1. Per group: best (scale, min) for levels 0..3, weights |x|, mean absolute error. */
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = tn_make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        /* 2. Group scales to 4 bits (low nibble) against d = max_scale / 15, mins likewise to the
         *    high nibble against dmin. */
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (uint8_t)tn_nearest_int(iscale * scales[j]);
            y[i].d = tn_fp32_to_fp16(max_scale / q4scale);
        } else {
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = 0;
            y[i].d = tn_fp32_to_fp16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] |= (uint8_t)(tn_nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = tn_fp32_to_fp16(max_min / q4scale);
        } else {
            y[i].dmin = tn_fp32_to_fp16(0.f);
        }
        /* 3. Requantize each element against the stored group scale and min (groups with a zero
         *    scale keep the levels of step 1; they dequantize to -min whatever they are). */
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = tn_fp16_to_fp32(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float dm = tn_fp16_to_fp32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++) L[16 * j + ii] = (uint8_t)tn_clampi(tn_nearest_int((x[16 * j + ii] + dm) / d), 0, 3);
        }
        /* 4. Pack the 2-bit levels. */
        tn_pack_2bit(L, y[i].qs);
    }
}

void tn_dequantize_row_q2_K(const block_q2_K *x, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const float d = tn_fp16_to_fp32(x[i].d);
        const float dmin = tn_fp16_to_fp32(x[i].dmin);
        /* Element e: 128-half h = e/128, shift 2*((e%128)/32), byte 32h + e%32; group e/16. */
        for (int e = 0; e < QK_K; e++) {
            const uint8_t sc = x[i].scales[e / 16];
            const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
            const int q = (x[i].qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
            *y++ = dl * q - ml;
        }
    }
}

/* ---- q3_K: 16 groups of 16, 3-bit signed levels, 6-bit scales ----------------------------- */

void tn_quantize_row_q3_K_ref(const float *x, block_q3_K *y, int64_t k) {
    const int64_t nb = k / QK_K;
    int8_t L[QK_K];
    float scales[QK_K / 16];

    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        /* 1. Per group: signed scale for levels -4..3 (coordinate-descent fit). Keep the signed
         *    group scale of largest magnitude. */
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = tn_make_q3_quants(16, 4, x + 16 * j, L + 16 * j, true);
            if (fabsf(scales[j]) > amax) {
                amax = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        /* 2. Group scales to 6 bits signed (-32..31, stored +32) with d = max_scale / -32. */
        memset(y[i].scales, 0, 12);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                int l = (int8_t)tn_nearest_int(iscale * scales[j]);
                l = tn_clampi(l, -32, 31) + 32;
                if (j < 8) y[i].scales[j] = (uint8_t)(l & 0xF);
                else y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                y[i].scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[i].d = tn_fp32_to_fp16(1 / iscale);
        } else {
            y[i].d = tn_fp32_to_fp16(0.f);
        }
        /* 3. Requantize against the stored scales: levels -4..3, stored +4. */
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = tn_fp16_to_fp32(y[i].d) * tn_q3k_scale(y[i].scales, j);
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) L[16 * j + ii] = (int8_t)(tn_clampi(tn_nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
        }
        /* 4. Bit 2 of each level goes to hmask: element e sets bit e/32 of hmask[e%32]. */
        memset(y[i].hmask, 0, QK_K / 8);
        for (int e = 0; e < QK_K; e++) {
            if (L[e] > 3) {
                y[i].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
                L[e] -= 4;
            }
        }
        /* 5. The low two bits as in q2_K. */
        tn_pack_2bit((const uint8_t *)L, y[i].qs);
    }
}

void tn_dequantize_row_q3_K(const block_q3_K *x, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const float d_all = tn_fp16_to_fp32(x[i].d);
        /* Element e: low bits as q2_K; a clear hmask bit means the level is 4 lower. */
        for (int e = 0; e < QK_K; e++) {
            const float dl = d_all * tn_q3k_scale(x[i].scales, e / 16);
            const int low = (x[i].qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
            const int high = (x[i].hmask[e % 32] >> (e / 32)) & 1;
            *y++ = dl * (low - (high ? 0 : 4));
        }
    }
}

/* ---- q4_K / q5_K: 8 groups of 32, 6-bit scale and min per group -------------------------- */

/* Steps 1-3 shared by q4_K (nmax 15) and q5_K (nmax 31): group fits, 6-bit scale/min packing,
 * requantization into L against the stored values. */
static void tn_quantize_k4_groups(const float *x, int nmax, float rmin, int nstep, tn_fp16 *d_out, tn_fp16 *dmin_out,
                                  uint8_t scales_out[K_SCALE_SIZE], uint8_t L[QK_K]) {
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    /* 1. Per group: weights av_x + |x| (av_x = group RMS), squared error. */
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = tn_make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    /* 2. Scales and mins to 6 bits against d = max_scale / 63 and dmin = max_min / 63. The
     *    uint8_t conversion and the clamp to 63 are ggml's. */
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[QK_K / 32], lm[QK_K / 32];
    for (int j = 0; j < QK_K / 32; j++) {
        ls[j] = (uint8_t)tn_nearest_int(inv_scale * scales[j]);
        lm[j] = (uint8_t)tn_nearest_int(inv_min * mins[j]);
        if (ls[j] > 63) ls[j] = 63;
        if (lm[j] > 63) lm[j] = 63;
    }
    tn_pack_scale_min_k4(ls, lm, scales_out);
    *d_out = tn_fp32_to_fp16(max_scale / 63.f);
    *dmin_out = tn_fp32_to_fp16(max_min / 63.f);
    /* 3. Requantize against the stored scale and min; zero-scale groups keep step-1 levels. */
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        tn_get_scale_min_k4(j, scales_out, &sc, &m);
        const float d = tn_fp16_to_fp32(*d_out) * sc;
        if (!d) continue;
        const float dm = tn_fp16_to_fp32(*dmin_out) * m;
        for (int ii = 0; ii < 32; ii++) L[32 * j + ii] = (uint8_t)tn_clampi(tn_nearest_int((x[32 * j + ii] + dm) / d), 0, nmax);
    }
}

void tn_quantize_row_q4_K_ref(const float *x, block_q4_K *y, int64_t k) {
    const int64_t nb = k / QK_K;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        tn_quantize_k4_groups(x, 15, -1.f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        /* 4. Pack: per 64 elements, 32 bytes with element l in the low nibble of byte l and
         *    element l+32 in its high nibble. */
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32) {
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
        }
    }
}

void tn_dequantize_row_q4_K(const block_q4_K *x, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const float d = tn_fp16_to_fp32(x[i].d);
        const float dmin = tn_fp16_to_fp32(x[i].dmin);
        /* Groups 2c and 2c+1 share the 32 bytes qs[32c..]: low nibbles, then high nibbles. */
        for (int g = 0; g < QK_K / 32; g++) {
            uint8_t sc, m;
            tn_get_scale_min_k4(g, x[i].scales, &sc, &m);
            const float dl = d * sc, ml = dmin * m;
            const uint8_t *q = x[i].qs + 32 * (g / 2);
            const int shift = 4 * (g % 2);
            for (int l = 0; l < 32; l++) *y++ = dl * ((q[l] >> shift) & 0xF) - ml;
        }
    }
}

void tn_quantize_row_q5_K_ref(const float *x, block_q5_K *y, int64_t k) {
    const int64_t nb = k / QK_K;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        tn_quantize_k4_groups(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        /* 4. Low 4 bits packed as q4_K; bit 4 of element e (group g = e/32) is bit g of qh[e%32]. */
        memset(y[i].qh, 0, QK_K / 8);
        uint8_t *ql = y[i].qs;
        for (int n = 0; n < QK_K; n += 64, ql += 32) {
            for (int j = 0; j < 32; j++) {
                const int l1 = L[n + j], l2 = L[n + j + 32];
                y[i].qh[j] |= (uint8_t)(((l1 >> 4) & 1) << (n / 32));
                y[i].qh[j] |= (uint8_t)(((l2 >> 4) & 1) << (n / 32 + 1));
                ql[j] = (uint8_t)((l1 & 0xF) | ((l2 & 0xF) << 4));
            }
        }
    }
}

void tn_dequantize_row_q5_K(const block_q5_K *x, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const float d = tn_fp16_to_fp32(x[i].d);
        const float dmin = tn_fp16_to_fp32(x[i].dmin);
        for (int g = 0; g < QK_K / 32; g++) {
            uint8_t sc, m;
            tn_get_scale_min_k4(g, x[i].scales, &sc, &m);
            const float dl = d * sc, ml = dmin * m;
            const uint8_t *ql = x[i].qs + 32 * (g / 2);
            const int shift = 4 * (g % 2);
            for (int l = 0; l < 32; l++) {
                const int q = ((ql[l] >> shift) & 0xF) + (((x[i].qh[l] >> g) & 1) ? 16 : 0);
                *y++ = dl * q - ml;
            }
        }
    }
}

/* ---- q6_K: 16 groups of 16, 6-bit signed levels, int8 scales ------------------------------ */

void tn_quantize_row_q6_K_ref(const float *x, block_q6_K *y, int64_t k) { tn_quantize_row_q6_K_w(x, y, k, NULL); }

void tn_quantize_row_q6_K_w(const float *x, block_q6_K *y, int64_t k, const float *qw) {
    const int64_t nb = k / QK_K;
    int8_t L[QK_K];
    float scales[QK_K / 16];

    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        /* 1. Per group: signed scale for levels -32..31 (rmse search, weights x^2 or the raw
         *    importances qw); keep the signed group scale of largest magnitude. */
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            scales[ib] = tn_make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1, qw ? qw + QK_K * i + 16 * ib : NULL);
            if (fabsf(scales[ib]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        /* A (near) zero super-block is all zero bytes. */
        if (max_abs_scale < TN_GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* 2. Group scales to int8 against d = max_scale / -128 (the largest maps to -128). */
        const float iscale = -128.f / max_scale;
        y[i].d = tn_fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const int l = tn_nearest_int(iscale * scales[ib]);
            y[i].scales[ib] = (int8_t)(l < 127 ? l : 127);
        }
        /* 3. Requantize against the stored scales: levels -32..31, stored +32. */
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = tn_fp16_to_fp32(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) L[16 * j + ii] = (int8_t)(tn_clampi(tn_nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
        }
        /* 4. Pack per 128-element half: ql byte l holds elements l (low) and l+64 (high nibble),
         *    ql byte l+32 holds l+32 and l+96; qh byte l holds the top 2 bits of l, l+32, l+64,
         *    l+96 in bit pairs 0, 1, 2, 3. */
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const uint8_t *Lu = (const uint8_t *)L + j + l;
                ql[l] = (uint8_t)((Lu[0] & 0xF) | ((Lu[64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((Lu[32] & 0xF) | ((Lu[96] & 0xF) << 4));
                qh[l] = (uint8_t)((Lu[0] >> 4) | ((Lu[32] >> 4) << 2) | ((Lu[64] >> 4) << 4) | ((Lu[96] >> 4) << 6));
            }
        }
    }
}

void tn_dequantize_row_q6_K(const block_q6_K *x, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const float d = tn_fp16_to_fp32(x[i].d);
        /* Element e: half h = e/128, quarter r = (e%128)/32, l = e%32. Low nibble from
         * ql[64h + l + 32(r%2)] (high nibble when r >= 2), top bits from qh[32h + l] pair r. */
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, r = (e % 128) / 32, l = e % 32;
            const int lo = (x[i].ql[64 * h + l + 32 * (r % 2)] >> (4 * (r / 2))) & 0xF;
            const int hi = (x[i].qh[32 * h + l] >> (2 * r)) & 3;
            const int q = (lo | (hi << 4)) - 32;
            *y++ = d * x[i].scales[e / 16] * q;
        }
    }
}

/* ---- q8_K: 256 x int8 with a float scale and 16-element sums ------------------------------ */

void tn_quantize_row_q8_K_ref(const float *x, block_q8_K *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float amax;
        const float max = tn_signed_absmax(x, QK_K, &amax);
        /* All zero: d = 0 and zero quants. ggml leaves bsums unwritten here; tern zeroes them. */
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* The signed extreme maps to -127 (ggml: -127 rather than -128 keeps its AVX paths
         * simple); 127 clamps the opposite end. */
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            const int v = tn_nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        /* Sums of each 16 quants, used by the k-quant dots for the min terms. */
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[i].qs[16 * j + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

void tn_dequantize_row_q8_K(const block_q8_K *x, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        for (int j = 0; j < QK_K; j++) *y++ = x[i].d * x[i].qs[j];
    }
}
