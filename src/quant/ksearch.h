/*
 * ksearch.h — pieces shared by the k-quant references (quant_k.c) and the importance-weighted
 * quantizers (quant_iw.c): ggml's rounding and its symmetric group scale search. Internal to
 * src/quant.
 */
#ifndef TN_QUANT_KSEARCH_H
#define TN_QUANT_KSEARCH_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "quant/blocks.h"

/* ggml's threshold below which a group counts as all zero. */
#define TN_GROUP_MAX_EPS 1e-15f

/* Round to nearest, ties to even, for |v| <= 2^22: adding 1.5 * 2^23 leaves no fraction bits in
 * the float, so the addition itself rounds; the integer is then read from the mantissa. This is
 * ggml's nearest_int, independent of the FPU rounding mode setting of lrintf. */
static inline int tn_nearest_int(float v) {
    const float biased = v + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &biased, sizeof bits);
    return (bits & 0x007fffff) - 0x00400000;
}

static inline int tn_clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/*
 * Symmetric group: levels l in [-nmax, nmax-1], value = scale * l; returns scale, L[i] = l + nmax.
 * rmse_type 0: the plain scale max / -nmax. rmse_type 1: start there, then try 18 nearby inverse
 * scales -(nmax + 0.1 is)/max and keep the one with the best weighted least-squares fit, weights
 * qw (or x^2 when qw is NULL). ggml's make_qx_quants (other rmse types unused).
 */
float tn_make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type, const float *qw);

/*
 * Asymmetric group (q2_K, q4_K, q5_K, q4_1, q5_1): levels l in [0, nmax], value = scale * l -
 * the_min, the_min >= 0. Starts from the min..max grid, then tries nstep+1 inverse scales
 * (rmin + rdelta*is + nmax) / (max - min), each with the weighted least-squares (scale, min) for
 * its levels, keeping the lowest weighted error (squared, or absolute with use_mad). weights must
 * not be NULL. ggml's make_qkx2_quants, and make_qkx3_quants with weights (the same arithmetic).
 */
float tn_make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min, uint8_t *Laux,
                          float rmin, float rdelta, int nstep, bool use_mad);

/* Non-negative values to levels 0..nmax with weights quant_weights: a search over 9 inverse
 * scales, then up to 5 passes moving single levels to the least-squares optimum; returns the
 * scale. ggml's make_qp_quants (quant_iw.c; the k-quants' scale packing and iq2_xxs's start). */
float tn_make_qp_quants(int n, int nmax, const float *x, uint8_t *L, const float *quant_weights);

/* q6_K with group-scale weights qw[k] (ggml's quantize_row_q6_K_impl: the raw importances, no
 * sqrt(sigma2 + x^2) factor), or x^2 when qw is NULL (the reference). */
void tn_quantize_row_q6_K_w(const float *x, block_q6_K *y, int64_t k, const float *qw);

#endif
