/*
 * vq.c (scalar) — the reference kernels of tern's codebook type vq2 (quant/vq.h) against q8_K
 * activations: a dot product written to be read, the gemm built on it, and the row decode. The
 * integer part of each block is exact (int32); blocks are added in order in float:
 *   dot = sum_b fp16(d_b) * xd_b * sum_j (2 s_{j/8} + 1) * sum_p cb[p][qs_j] * xq[64 p + j]
 * No from_float: a vq row cannot be made without its tensor's codebook (tern quantize fits it).
 */
#include "kern/scalar/kernels.h"
#include "quant/blocks.h"
#include "quant/vq.h"

void tn_k_vec_dot_vq2_q8_K__scalar(int64_t k, float *s, const void *w, const void *x) {
    const int8_t *cb = tn_vq_codebook(w);
    const block_vq2 *b = (const block_vq2 *)((const uint8_t *)w + TN_VQ_HDR);
    const block_q8_K *y = x;
    float sum = 0;
    for (int64_t i = 0; i < k / TN_VQ_QK; i++) {
        int32_t isum = 0;
        for (int g = 0; g < TN_VQ_NV / TN_VQ_GROUP; g++) {
            int32_t gs = 0;
            for (int j = g * TN_VQ_GROUP; j < (g + 1) * TN_VQ_GROUP; j++)
                for (int p = 0; p < TN_VQ_DIM; p++) gs += (int32_t)cb[p * TN_VQ_K + b[i].qs[j]] * y[i].qs[64 * p + j];
            isum += tn_vq_scale(&b[i], g) * gs;
        }
        sum += tn_fp16_to_fp32(b[i].d) * y[i].d * (float)isum;
    }
    *s = sum;
}

static void tn_k_gemm_vq2_q8_K__scalar(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                        size_t x_rb, float *y, int64_t ldy) {
    tn_gemm_by_vec_dot(tn_k_vec_dot_vq2_q8_K__scalar, k, m, n, w, w_rb, x, x_rb, y, ldy);
}

void tn_kern_register_vq_scalar(tn_kern_table *t) {
    tn_kern_slot *s = &t->slot[TN_VQ2];
    s->vec_dot = tn_k_vec_dot_vq2_q8_K__scalar;
    s->gemm = tn_k_gemm_vq2_q8_K__scalar;
    s->to_float = tn_vq2_dequantize_row;
    s->from_float = NULL;
    s->vec_dot_isa = s->gemm_isa = s->to_float_isa = TN_ISA_SCALAR;
}
