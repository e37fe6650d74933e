/*
 * vq.c (avx2) — tern's codebook type vq2 (quant/vq.h) against q8_K activations on CPUs without
 * AVX-512 VBMI (no 128-entry byte permutes): the codebook as 256 dword entries, one gather per
 * scale group.
 *
 * Per gemm call the codebook is rewritten entry-major, E[e] = the 4 components of entry e as the
 * bytes of one dword, and each activation column vector-major in int16, xv[4 j + p] = x[64 p + j]
 * (a chunk of blocks at a time). A scale group (vectors 8g .. 8g + 7) is then one VPGATHERDD of
 * its 8 indices: 32 int8 weights in the order of xv, widened to int16 and multiplied with
 * VPMADDWD (exact: no saturation, any int8 codebook and q8_K value), the group's int32 sums
 * scaled by fp16(d) (2 s_g + 1) x_d in float. The gemm gathers each group once per row for up
 * to 4 activation columns. Integer sums are exact; the float order differs from the scalar
 * reference (parity-tested within rounding, tests/quantize/test_vq.c). vec_dot is the gemm of one
 * row and one column (it rewrites the codebook each call: the matmul driver calls the gemm).
 */
#include <immintrin.h>
#include <string.h>

#include "kern/avx2/simd.h"
#include "kern/kern.h"
#include "quant/blocks.h"
#include "quant/vq.h"

#define VQ2_NCOL 4   /* activation columns per pass over the rows */
#define VQ2_CHUNK 16 /* blocks of activations rewritten at a time (4 columns: 32 KiB of int16) */

/* E[e]: components 0..3 of entry e in bytes 0..3. */
static void vq2_entries(const int8_t *cb, int32_t E[TN_VQ_K]) {
    for (int e = 0; e < TN_VQ_K; e++) {
        uint32_t v = 0;
        for (int p = 0; p < TN_VQ_DIM; p++) v |= (uint32_t)(uint8_t)cb[p * TN_VQ_K + e] << (8 * p);
        E[e] = (int32_t)v;
    }
}

/* Block y's activations vector-major in int16: xv[4 j + p] = y.qs[64 p + j]. */
static void vq2_xv(const block_q8_K *y, int16_t xv[TN_VQ_QK]) {
    for (int j = 0; j < TN_VQ_NV; j++)
        for (int p = 0; p < TN_VQ_DIM; p++) xv[4 * j + p] = y->qs[64 * p + j];
}

/* Group g of block b against nc columns' vector-major activations xv[c] (this block's 256):
 * acc[c] += (d (2 s_g + 1) x_d[c]) * (int32 sums of the group, 8 lanes). */
static inline void vq2_group(const int32_t *E, const block_vq2 *b, int g, int nc, const int16_t *const *xv,
                             const float *xd, float d, __m256 *acc) {
    const __m256i id = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * g)));
    const __m256i w = _mm256_i32gather_epi32((const int *)E, id, 4); /* 8 vectors x 4 int8 weights */
    const __m256i w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)), w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));
    const float s = d * (float)tn_vq_scale(b, g);
    for (int c = 0; c < nc; c++) {
        const int16_t *x = xv[c] + 32 * g;
        const __m256i p0 = _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)x));
        const __m256i p1 = _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(x + 16)));
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), _mm256_set1_ps(s * xd[c]), acc[c]);
    }
}

static void tn_k_gemm_vq2_q8_K__avx2(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                     size_t x_rb, float *y, int64_t ldy) {
    if (m <= 0 || n <= 0) return;
    _Alignas(32) int32_t E[TN_VQ_K];
    _Alignas(32) int16_t xbuf[VQ2_NCOL][VQ2_CHUNK * TN_VQ_QK];
    const int8_t *loaded = NULL;
    const int64_t nb = k / TN_VQ_QK;
    for (int64_t j0 = 0; j0 < n; j0 += VQ2_NCOL) {
        const int nc = n - j0 < VQ2_NCOL ? (int)(n - j0) : VQ2_NCOL;
        const block_q8_K *yc[VQ2_NCOL];
        for (int c = 0; c < nc; c++) yc[c] = (const block_q8_K *)((const uint8_t *)x + (size_t)(j0 + c) * x_rb);
        for (int64_t b0 = 0; b0 < nb; b0 += VQ2_CHUNK) {
            const int64_t nbc = nb - b0 < VQ2_CHUNK ? nb - b0 : VQ2_CHUNK;
            for (int c = 0; c < nc; c++)
                for (int64_t bi = 0; bi < nbc; bi++) vq2_xv(&yc[c][b0 + bi], xbuf[c] + bi * TN_VQ_QK);
            for (int64_t i = 0; i < m; i++) {
                const uint8_t *row = (const uint8_t *)w + (size_t)i * w_rb;
                const int8_t *cb = tn_vq_codebook(row);
                if (cb != loaded) vq2_entries(loaded = cb, E); /* rows of one tensor share it */
                const block_vq2 *b = (const block_vq2 *)(row + TN_VQ_HDR) + b0;
                __m256 acc[VQ2_NCOL];
                for (int c = 0; c < VQ2_NCOL; c++) acc[c] = _mm256_setzero_ps();
                for (int64_t bi = 0; bi < nbc; bi++) {
                    const int16_t *xv[VQ2_NCOL];
                    float xd[VQ2_NCOL];
                    for (int c = 0; c < nc; c++) xv[c] = xbuf[c] + bi * TN_VQ_QK, xd[c] = yc[c][b0 + bi].d;
                    const float d = tn_fp16_to_fp32(b[bi].d);
                    for (int g = 0; g < TN_VQ_NV / TN_VQ_GROUP; g++) vq2_group(E, &b[bi], g, nc, xv, xd, d, acc);
                }
                for (int c = 0; c < nc; c++) {
                    const float s = tn_hsum_ps256(acc[c]);
                    float *o = &y[(j0 + c) * ldy + i];
                    *o = b0 ? *o + s : s;
                }
            }
        }
    }
}

static void tn_k_vec_dot_vq2_q8_K__avx2(int64_t k, float *s, const void *w, const void *x) {
    tn_k_gemm_vq2_q8_K__avx2(k, 1, 1, w, 0, x, 0, s, 1);
}

void tn_kern_register_vq_avx2(tn_kern_table *t) {
    tn_kern_slot *s = &t->slot[TN_VQ2];
    s->vec_dot = tn_k_vec_dot_vq2_q8_K__avx2;
    s->gemm = tn_k_gemm_vq2_q8_K__avx2;
    s->vec_dot_isa = s->gemm_isa = TN_ISA_AVX2;
}
