/*
 * repack.c (scalar) — reference tile products for the load-time *_r16 layouts (quant/repack.h):
 * the file type's reference dot with each row's codes and scale read out of the interleaved
 * chunks, in the same float operations and order, so results equal the file type's reference on
 * the original rows bit for bit:
 *   q4_0:           exact integer sum of (q - 8) x per block, then (sumi * d_w) * d_x (ggml);
 *   tq4g<G> (sym):  per 32 codes d_x * d_w * (2 sum q x - 15 sum x) * 0.5 (tn_tq_vec_dot_ref);
 *   q8_0:           exact integer sum of q x per block (codes stored + 128), then sumi * (d_w * d_x);
 *   iq4_nl:         exact integer sum of table[q] x per block, then (d_x * d_w) * sumi (ggml);
 *   q4_K, q5_K, q6_K: each row unpacked and dotted by the file type's reference (x in q8_K).
 */
#include <stdlib.h>

#include "kern/scalar/kernels.h"
#include "kern/tq_list.inc"
#include "quant/blocks.h"
#include "quant/repack.h"
#include "quant/tq.h"

/* kind: 0 = q4_0, 1 = symmetric tq4 (G = 32 .. 256), 2 = q8_0, 3 = iq4_nl */
static void tn_r16_gemm_ref(int64_t G, int kind, int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,
                            const void *x, size_t x_rb, float *y, int64_t ldy) {
    const int64_t nc = k / G, S = G / 32;
    const size_t cb = kind == 2 ? 32 + 64 * 8 : 32 + (size_t)G * 8;
    for (int64_t j = 0; j < n; j++) {
        const block_q8_0 *xb = (const block_q8_0 *)((const uint8_t *)x + (size_t)j * x_rb);
        for (int64_t i = 0; i < m; i++) {
            const uint8_t *grp = (const uint8_t *)w + (size_t)(i / TN_R16_ROWS) * TN_R16_ROWS * w_rb;
            const int r = (int)(i % TN_R16_ROWS);
            float sumf = 0;
            for (int64_t c = 0; c < nc; c++) {
                const uint8_t *ch = grp + (size_t)c * cb;
                const float dw = tn_fp16_to_fp32((tn_fp16)(ch[2 * r] | ch[2 * r + 1] << 8));
                for (int64_t s = 0; s < S; s++) {
                    const block_q8_0 *a = &xb[c * S + s];
                    /* sqa = sum of stored code * x, sa = sum of x: exact integers */
                    int sqa = 0, sa = 0;
                    for (int t = 0; t < 4; t++)
                        for (int e = 0; e < 4; e++) {
                            int c0, c1; /* stored codes of elements 4t + e and 16 + 4t + e */
                            if (kind == 2) { /* dword t holds codes 4t.., dword 4 + t codes 16 + 4t.. */
                                c0 = ch[32 + 64 * t + 4 * r + e], c1 = ch[32 + 64 * (4 + t) + 4 * r + e];
                            } else {
                                const uint8_t q = ch[32 + 256 * s + 64 * t + 4 * r + e];
                                c0 = q & 0x0F, c1 = q >> 4;
                                if (kind == 3) c0 = tn_kvalues_iq4nl[c0], c1 = tn_kvalues_iq4nl[c1];
                            }
                            sqa += c0 * a->qs[4 * t + e] + c1 * a->qs[16 + 4 * t + e];
                            sa += a->qs[4 * t + e] + a->qs[16 + 4 * t + e];
                        }
                    const float da = tn_fp16_to_fp32(a->d);
                    if (kind == 1) sumf += da * dw * (float)(2 * sqa - 15 * sa) * 0.5f;
                    else if (kind == 2) sumf += (sqa - 128 * sa) * (dw * da); /* codes stored + 128 */
                    else if (kind == 3) sumf += (da * dw) * (float)sqa;
                    else sumf += (sqa - 8 * sa) * dw * da;
                }
            }
            y[j * ldy + i] = sumf;
        }
    }
}

#define TN_R16_REF(name, G, kind)                                                                                      \
    void tn_k_gemm_##name##_q8_0__scalar(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,  \
                                         size_t x_rb, float *y, int64_t ldy) {                                         \
        tn_r16_gemm_ref(G, kind, k, m, n, w, w_rb, x, x_rb, y, ldy);                                                   \
    }
TN_R16_REF(q4_0_r16, 32, 0)
TN_R16_REF(tq4g32_r16, 32, 1)
TN_R16_REF(tq4g64_r16, 64, 1)
TN_R16_REF(tq4g128_r16, 128, 1)
TN_R16_REF(tq4g256_r16, 256, 1)
TN_R16_REF(q8_0_r16, 32, 2)
TN_R16_REF(iq4_nl_r16, 32, 3)

/* q4_K / q5_K / q6_K *_r16: row i unpacked to the file type's bytes, then the file type's reference dot
 * (x in q8_K): bit for bit the file type's reference for rows up to 64 KiB (k <= 79872 for q6_K);
 * longer rows go through in pieces of whole blocks, whose partial sums are added. */
static void tn_rk16_gemm_ref(tn_dtype ft, tn_vec_dot_fn dot, int64_t k, int64_t m, int64_t n, const void *w,
                             size_t w_rb, const void *x, size_t x_rb, float *y, int64_t ldy) {
    (void)w_rb;
    enum { ROW = 65536 };
    static _Thread_local uint8_t row[ROW];
    const size_t bb = tn_dtype_get(ft)->type_size;
    const int64_t nb = k / QK_K, PB = (int64_t)(ROW / bb);
    uint8_t *wide = NULL; /* the whole row when it is longer than the buffer */
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) y[j * ldy + i] = 0.0f;
        if (nb <= PB) {
            tn_unpack_row_r16(tn_r16_type_of(ft), w, k, i, row);
        } else {
            if (!wide) wide = malloc((size_t)nb * bb);
            if (!wide) continue; /* no memory: zeros rather than a crash (k beyond any model) */
            tn_unpack_row_r16(tn_r16_type_of(ft), w, k, i, wide);
        }
        const uint8_t *r = nb <= PB ? row : wide;
        for (int64_t j = 0; j < n; j++) {
            const block_q8_K *xb = (const block_q8_K *)((const uint8_t *)x + (size_t)j * x_rb);
            for (int64_t b0 = 0; b0 < nb; b0 += PB) {
                float s;
                dot((nb - b0 < PB ? nb - b0 : PB) * QK_K, &s, r + (size_t)b0 * bb, xb + b0);
                y[j * ldy + i] += s;
            }
        }
    }
    free(wide);
}

#define TN_RK16_REF(name, FT, dot)                                                                                     \
    void tn_k_gemm_##name##_r16_q8_K__scalar(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,            \
                                             const void *x, size_t x_rb, float *y, int64_t ldy) {                      \
        tn_rk16_gemm_ref(FT, dot, k, m, n, w, w_rb, x, x_rb, y, ldy);                                                  \
    }
TN_RK16_REF(q4_K, TN_Q4_K, tn_k_vec_dot_q4_K_q8_K__scalar)
TN_RK16_REF(q5_K, TN_Q5_K, tn_k_vec_dot_q5_K_q8_K__scalar)
TN_RK16_REF(q6_K, TN_Q6_K, tn_k_vec_dot_q6_K_q8_K__scalar)
TN_RK16_REF(iq4_xs, TN_IQ4_XS, tn_k_vec_dot_iq4_xs_q8_K__scalar)
TN_RK16_REF(tq2_0, TN_TQ2_0, tn_k_vec_dot_tq2_0_q8_K__scalar)
TN_RK16_REF(tq1_0, TN_TQ1_0, tn_k_vec_dot_tq1_0_q8_K__scalar)

/* tq1 *_l32: row i unpacked to the file type's bytes, then the file type's reference dot: the
 * result equals tn_tq_vec_dot_ref on the original row bit for bit (rows up to 64 KiB, k <= 262144
 * at any group; longer rows go through in pieces of 64 KiB, whose partial sums are added). */
void tn_k_gemm_tq1_l32_q8_0__scalar(tn_dtype it, int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,
                                    const void *x, size_t x_rb, float *y, int64_t ldy) {
    tn_tq_params p;
    tn_tq_params_of(tn_l32_file_type(it), &p);
    enum { ROW = 65536 };
    static _Thread_local uint8_t row[ROW];
    const size_t bb = tn_tq_block_bytes(&p), cb = TN_L32_ROWS * bb;
    const int64_t G = p.group, nb = k / G, PB = (int64_t)(ROW / bb);
    for (int64_t i = 0; i < m; i++) {
        const uint8_t *grp = (const uint8_t *)w + (size_t)(i / TN_L32_ROWS) * TN_L32_ROWS * w_rb;
        for (int64_t j = 0; j < n; j++) {
            const block_q8_0 *xb = (const block_q8_0 *)((const uint8_t *)x + (size_t)j * x_rb);
            float sum = 0;
            for (int64_t b0 = 0; b0 < nb; b0 += PB) {
                const int64_t nbb = nb - b0 < PB ? nb - b0 : PB;
                for (int64_t b = 0; b < nbb; b++)
                    tn_unpack_block_l32(it, grp + (size_t)(b0 + b) * cb, (int)(i % TN_L32_ROWS), row + (size_t)b * bb);
                sum += tn_tq_vec_dot_ref(&p, nbb * G, row, xb + b0 * (G / 32));
            }
            y[j * ldy + i] = sum;
        }
    }
}
#define TN_L32_REF(name, it)                                                                                           \
    void tn_k_gemm_##name##_q8_0__scalar(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,  \
                                         size_t x_rb, float *y, int64_t ldy) {                                         \
        tn_k_gemm_tq1_l32_q8_0__scalar(it, k, m, n, w, w_rb, x, x_rb, y, ldy);                                         \
    }
TN_L32_REF(tq1g32_l32, TN_TQ1G32_L32)
TN_L32_REF(tq1g32a_l32, TN_TQ1G32A_L32)
TN_L32_REF(tq1g64_l32, TN_TQ1G64_L32)
TN_L32_REF(tq1g64a_l32, TN_TQ1G64A_L32)
TN_L32_REF(tq1g128_l32, TN_TQ1G128_L32)
TN_L32_REF(tq1g128a_l32, TN_TQ1G128A_L32)
TN_L32_REF(tq1g256_l32, TN_TQ1G256_L32)
TN_L32_REF(tq1g256a_l32, TN_TQ1G256A_L32)

/* tq *_c16: each row back in the file type's bytes (tn_unpack_row_c16), then the reference dot
 * (bit for bit the file type's reference for rows up to 64 KiB; longer rows go through in pieces
 * of whole super-steps, whose partial sums are added). */
void tn_k_gemm_tq_c16_q8_0__scalar(tn_dtype it, int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,
                                   const void *x, size_t x_rb, float *y, int64_t ldy) {
    tn_tq_params p;
    tn_tq_params_of(tn_c16_file_type(it), &p);
    enum { ROW = 65536 };
    static _Thread_local uint8_t row[ROW];
    const size_t sb = (size_t)(512 / p.group) * tn_tq_block_bytes(&p);
    const int64_t piece = (int64_t)(ROW / sb) * 512; /* codes per piece: whole super-steps */
    for (int64_t i = 0; i < m; i++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)i * w_rb;
        for (int64_t j = 0; j < n; j++) y[j * ldy + i] = 0.0f;
        for (int64_t k0 = 0; k0 < k; k0 += piece) {
            const int64_t kk = k - k0 < piece ? k - k0 : piece;
            const size_t off = (size_t)(k0 / 512) * sb;
            tn_unpack_row_c16(it, wr + off, kk, row);
            for (int64_t j = 0; j < n; j++)
                y[j * ldy + i] += tn_tq_vec_dot_ref(&p, kk, row, (const block_q8_0 *)((const uint8_t *)x + (size_t)j * x_rb) + k0 / 32);
        }
    }
}
#define TN_C16_REF(b, g, a)                                                                                            \
    static void tn_k_gemm_c16_##b##_##g##_##a(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,           \
                                              const void *x, size_t x_rb, float *y, int64_t ldy) {                    \
        const tn_tq_params p = {b, g, a};                                                                              \
        tn_k_gemm_tq_c16_q8_0__scalar(tn_c16_type_of((tn_dtype)tn_tq_dtype(&p)), k, m, n, w, w_rb, x, x_rb, y, ldy); \
    }
TN_TQ_LIST(TN_C16_REF)
#undef TN_C16_REF

tn_gemm_fn tn_k_gemm_c16__scalar(tn_dtype it) {
#define TN_C16_FN(b, g, a) tn_k_gemm_c16_##b##_##g##_##a,
    static const tn_gemm_fn fns[TN_TQ_COUNT] = {TN_TQ_LIST(TN_C16_FN)};
#undef TN_C16_FN
    return tn_c16_file_type(it) ? fns[it - TN_DTYPE_C16_BASE] : NULL;
}
