/*
 * dot_iq.c (scalar) — reference dot products of the lookup-table and ternary types with their
 * activation types (kern/kern.h contract): iq4_nl and mxfp4 x q8_0, iq4_xs, tq1_0 and tq2_0 x
 * q8_K. Each is ggml's generic ggml_vec_dot_<w>_<a>: exact integer sums of table value times
 * activation per block (or per 32-element sub-block for iq4_xs), then the scales in float, in
 * ggml's order, so results are bit-identical to ggml's generic path.
 */
#include "kern/scalar/kernels.h"
#include "quant/quant.h"

/* Integer dot of 32 4-bit indices (q4_0 nibble order) looked up in tab with 32 int8 values. */
static int dot_nib32(const uint8_t *qs, const int8_t *tab, const int8_t *x) {
    int s1 = 0, s2 = 0;
    for (int j = 0; j < 16; j++) {
        s1 += x[j] * tab[qs[j] & 0xF];
        s2 += x[j + 16] * tab[qs[j] >> 4];
    }
    return s1 + s2;
}

static float scale_iq4_nl(const void *b) { return tn_fp16_to_fp32(((const block_iq4_nl *)b)->d); }
static float scale_mxfp4(const void *b) { return tn_e8m0_to_fp32_half(((const block_mxfp4 *)b)->e); }

/* 32-element blocks of bs bytes with 16 bytes of indices at offset off and a scale read by
 * scale(), against q8_0: sum of (d_x * d_w) * integer dot, ggml's order. */
static float dot_lut32_q8_0(int64_t k, const uint8_t *w, size_t bs, size_t off, const int8_t *tab,
                            float (*scale)(const void *), const block_q8_0 *x) {
    float sumf = 0;
    for (int64_t i = 0; i < k / 32; i++, w += bs) {
        const float d = tn_fp16_to_fp32(x[i].d) * scale(w);
        sumf += d * dot_nib32(w + off, tab, x[i].qs);
    }
    return sumf;
}

void tn_k_vec_dot_iq4_nl_q8_0__scalar(int64_t k, float *s, const void *w, const void *x) {
    *s = dot_lut32_q8_0(k, w, sizeof(block_iq4_nl), offsetof(block_iq4_nl, qs), tn_kvalues_iq4nl, scale_iq4_nl, x);
}

void tn_k_vec_dot_mxfp4_q8_0__scalar(int64_t k, float *s, const void *w, const void *x) {
    *s = dot_lut32_q8_0(k, w, sizeof(block_mxfp4), offsetof(block_mxfp4, qs), tn_kvalues_mxfp4, scale_mxfp4, x);
}

void tn_k_vec_dot_iq4_xs_q8_K__scalar(int64_t k, float *s, const void *w, const void *x) {
    const block_iq4_xs *wb = w;
    const block_q8_K *xb = x;
    float sumf = 0;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d4d8 = tn_fp16_to_fp32(wb[i].d) * xb[i].d;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const int ls = ((wb[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((wb[i].scales_h >> 2 * ib) & 3) << 4);
            sumf += d4d8 * (ls - 32) * dot_nib32(wb[i].qs + 16 * ib, tn_kvalues_iq4nl, xb[i].qs + 32 * ib);
        }
    }
    *s = sumf;
}

void tn_k_vec_dot_tq1_0_q8_K__scalar(int64_t k, float *s, const void *w, const void *x) {
    const block_tq1_0 *wb = w;
    const block_q8_K *xb = x;
    uint8_t t[QK_K];
    float sumf = 0;
    for (int64_t i = 0; i < k / QK_K; i++) {
        tn_tq1_0_trits(&wb[i], t);
        int sum = 0;
        for (int j = 0; j < QK_K; j++) sum += (t[j] - 1) * xb[i].qs[j];
        sumf += (float)sum * (tn_fp16_to_fp32(wb[i].d) * xb[i].d);
    }
    *s = sumf;
}

void tn_k_vec_dot_tq2_0_q8_K__scalar(int64_t k, float *s, const void *w, const void *x) {
    const block_tq2_0 *wb = w;
    const block_q8_K *xb = x;
    float sumf = 0;
    for (int64_t i = 0; i < k / QK_K; i++) {
        int32_t sumi = 0;
        for (int j = 0; j < (int)sizeof wb->qs; j += 32)
            for (int l = 0; l < 4; l++)
                for (int m = 0; m < 32; m++) sumi += xb[i].qs[4 * j + 32 * l + m] * (((wb[i].qs[j + m] >> (2 * l)) & 3) - 1);
        sumf += (float)sumi * (xb[i].d * tn_fp16_to_fp32(wb[i].d));
    }
    *s = sumf;
}
