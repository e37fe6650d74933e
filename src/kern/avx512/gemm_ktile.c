/*
 * gemm_ktile.c (avx512) — batched q4_K, q5_K and q6_K x q8_K products straight from the file
 * layout, for weights that are not repacked at load: Mixture-of-Experts expert slices, which stay
 * mmapped (lazily paged, no second copy in anonymous memory) and reach the matmul driver one
 * expert at a time with the tokens routed to it.
 *
 * Each group of 16 weight rows is interleaved on the fly into the r16 layout (quant/repack.h), a
 * slice of up to TN_KT_SLICE blocks at a time, into a buffer on the stack (a q6_K slice of 8
 * blocks is 26.25 KiB: it stays in L1/L2), and the slot's r16 tile kernel (gemm_rk16.c) runs over
 * every activation column of the call from there. The interleave is one dword gather per 64-byte
 * register of codes plus a few byte permutes for the scales, amortized over the columns; it makes
 * the same bytes as tn_repack_r16 (the parity test checks them against it).
 *
 * Not here: fewer than tn_kt_nmin columns (decode and tiny expert groups) and the rows past the last whole
 * group of 16 keep the slot's previous gemm (gemv.c, dot_k.c); the slices' partial products add
 * up in float, so results differ from a one-pass product only by rounding.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kern/kern.h"
#include "quant/blocks.h"
#include "quant/repack.h"

#define TN_KT_SLICE 8 /* blocks of k per interleaved slice */
#define TN_KT_CB 64   /* columns per pass over a slice when k has several slices */

/* dword lanes r = 0..15: byte offset of row r (r * w_rb) */
static inline __m512i tn_kt_rows(size_t w_rb) {
    return _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                              _mm512_set1_epi32((int32_t)w_rb));
}
static inline __m512i tn_kt_g(__m512i vi, const uint8_t *p) { return _mm512_i32gather_epi32(vi, p, 1); }
/* n registers of dwords: register u, lane r = dword u at p of row r */
static inline void tn_kt_dwords(uint8_t *dst, __m512i vi, const uint8_t *p, int n) {
    for (int u = 0; u < n; u++) _mm512_storeu_si512(dst + 64 * u, tn_kt_g(vi, p + 4 * u));
}
/* bytes of dword lanes to byte-major: byte 16 j + r of the result = byte j of lane r */
static inline __m512i tn_kt_bytes_t(__m512i v) {
    static const uint8_t idx[64] = {
        0, 4, 8,  12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 1, 5, 9,  13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61,
        2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62, 3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63};
    return _mm512_permutexvar_epi8(_mm512_loadu_si512(idx), v);
}

/* q4_K / q5_K header of block b0 (row 0; row r at b0 + r * w_rb) -> chunk bytes 0 .. 255 */
static inline void tn_kt_head_k4(uint8_t *ch, __m512i vi, const uint8_t *b0) {
    const __m512i dd = tn_kt_g(vi, b0); /* d | dmin << 16 */
    _mm256_storeu_si256((__m256i *)ch, _mm512_cvtepi32_epi16(dd));
    _mm256_storeu_si256((__m256i *)(ch + 32), _mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
    /* ggml's get_scale_min_k4 on bytes s0 = q[0..3], s1 = q[4..7], s2 = q[8..11], bytewise */
    const __m512i s0 = tn_kt_g(vi, b0 + 4), s1 = tn_kt_g(vi, b0 + 8), s2 = tn_kt_g(vi, b0 + 12);
    const __m512i m3f = _mm512_set1_epi8(0x3F), m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30),
                  mc0 = _mm512_set1_epi8((char)0xC0);
    const __m512i sc_lo = _mm512_and_si512(s0, m3f), mn_lo = _mm512_and_si512(s1, m3f);
    const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(s2, m0f), _mm512_and_si512(_mm512_srli_epi32(s0, 2), m30));
    const __m512i mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(s2, 4), m0f),
                                          _mm512_and_si512(_mm512_srli_epi32(s1, 2), m30));
    /* scale bytes: sc | (bits 4..5 of mn) << 6 */
    const __m512i o_lo = _mm512_or_si512(sc_lo, _mm512_and_si512(_mm512_slli_epi32(mn_lo, 2), mc0));
    const __m512i o_hi = _mm512_or_si512(sc_hi, _mm512_and_si512(_mm512_slli_epi32(mn_hi, 2), mc0));
    _mm512_storeu_si512(ch + TN_R16_Q4K_SC, tn_kt_bytes_t(o_lo));
    _mm512_storeu_si512(ch + TN_R16_Q4K_SC + 64, tn_kt_bytes_t(o_hi));
    /* min nibbles: 128-bit lane j of a = min j (j = 0..3) or 4 + j of every row; pairs 2p, 2p + 1 */
    const __m512i a_lo = _mm512_and_si512(tn_kt_bytes_t(mn_lo), m0f), a_hi = _mm512_and_si512(tn_kt_bytes_t(mn_hi), m0f);
    const __m512i ev = _mm512_shuffle_i64x2(a_lo, a_hi, _MM_SHUFFLE(2, 0, 2, 0)),
                  od = _mm512_shuffle_i64x2(a_lo, a_hi, _MM_SHUFFLE(3, 1, 3, 1));
    _mm512_storeu_si512(ch + TN_R16_Q4K_MN, _mm512_or_si512(ev, _mm512_slli_epi32(od, 4)));
}

/* block c of 16 rows (row 0's at b0) -> one r16 chunk at ch */
static inline void tn_kt_chunk(tn_dtype ft, uint8_t *ch, __m512i vi, const uint8_t *b0) {
    if (ft == TN_Q4_K) {
        tn_kt_head_k4(ch, vi, b0);
        tn_kt_dwords(ch + TN_R16_Q4K_QS, vi, b0 + offsetof(block_q4_K, qs), QK_K / 8);
    } else if (ft == TN_Q5_K) {
        tn_kt_head_k4(ch, vi, b0);
        tn_kt_dwords(ch + TN_R16_Q5K_QH, vi, b0 + offsetof(block_q5_K, qh), QK_K / 32);
        tn_kt_dwords(ch + TN_R16_Q5K_QS, vi, b0 + offsetof(block_q5_K, qs), QK_K / 8);
    } else { /* q6_K: d is the block's last 2 bytes: gather the dword ending there (no read past it) */
        const __m512i dd = tn_kt_g(vi, b0 + offsetof(block_q6_K, d) - 2);
        _mm256_storeu_si256((__m256i *)ch, _mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
        for (int c = 0; c < QK_K / 64; c++)
            _mm512_storeu_si512(ch + TN_R16_Q6K_SC + 64 * c, tn_kt_bytes_t(tn_kt_g(vi, b0 + offsetof(block_q6_K, scales) + 4 * c)));
        tn_kt_dwords(ch + TN_R16_Q6K_QL, vi, b0 + offsetof(block_q6_K, ql), QK_K / 8);
        tn_kt_dwords(ch + TN_R16_Q6K_QH, vi, b0 + offsetof(block_q6_K, qh), QK_K / 16);
    }
}

void tn_k_interleave_r16_k__avx512(tn_dtype ft, const void *w, size_t w_rb, int64_t nb, void *dst) {
    const size_t bb = tn_dtype_get(ft)->type_size, cb = TN_R16_ROWS * bb;
    const __m512i vi = tn_kt_rows(w_rb);
    for (int64_t c = 0; c < nb; c++) tn_kt_chunk(ft, (uint8_t *)dst + (size_t)c * cb, vi, (const uint8_t *)w + (size_t)c * bb);
}

/* the slot's gemm before this file, and the r16 tile gemm, per file type (set once, at registration) */
static tn_gemm_fn tn_kt_prev[3], tn_kt_r16[3];
/* Fewest columns worth the interleave, per type; fewer go to the previous kernel. Measured with
 * 1024 x 2048 matrices, 1 thread (2026-11-27, shared 2-core Xeon): q4_K and q5_K break even at 4
 * columns (0.95x, 1.05x) and gain 1.3-1.7x at 5-8, ~2x from 32; q6_K's row kernel (gemv.c, up to 32
 * columns) stays ahead up to 8 (0.8x at 4, 0.95x at 8), 1.1x at 12, 1.4-1.6x from 24. */
static const int64_t tn_kt_nmin[3] = {5, 5, 12};

static void tn_kt_gemm(int i, tn_dtype ft, int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                       size_t x_rb, float *y, int64_t ldy) {
    const int64_t mg = m / TN_R16_ROWS * TN_R16_ROWS, nb = k / QK_K;
    if (n < tn_kt_nmin[i] || mg == 0 || w_rb > INT32_MAX / TN_R16_ROWS) {
        tn_kt_prev[i](k, m, n, w, w_rb, x, x_rb, y, ldy);
        return;
    }
    const size_t bb = tn_dtype_get(ft)->type_size;
    _Alignas(64) uint8_t buf[TN_KT_SLICE * TN_R16_ROWS * sizeof(block_q6_K)]; /* the largest of the three */
    _Alignas(64) float part[TN_KT_CB * TN_R16_ROWS];
    for (int64_t g = 0; g < mg; g += TN_R16_ROWS) {
        const uint8_t *wg = (const uint8_t *)w + (size_t)g * w_rb;
        for (int64_t s0 = 0; s0 < nb; s0 += TN_KT_SLICE) {
            const int64_t ns = nb - s0 < TN_KT_SLICE ? nb - s0 : TN_KT_SLICE;
            tn_k_interleave_r16_k__avx512(ft, wg + (size_t)s0 * bb, w_rb, ns, buf);
            const uint8_t *xs = (const uint8_t *)x + (size_t)s0 * sizeof(block_q8_K);
            if (s0 == 0) { /* the first slice writes y; later ones add */
                tn_kt_r16[i](ns * QK_K, TN_R16_ROWS, n, buf, (size_t)ns * bb, xs, x_rb, y + g, ldy);
                continue;
            }
            for (int64_t j0 = 0; j0 < n; j0 += TN_KT_CB) {
                const int64_t nj = n - j0 < TN_KT_CB ? n - j0 : TN_KT_CB;
                tn_kt_r16[i](ns * QK_K, TN_R16_ROWS, nj, buf, (size_t)ns * bb, xs + (size_t)j0 * x_rb, x_rb, part, TN_R16_ROWS);
                for (int64_t j = 0; j < nj; j++) {
                    float *yj = y + (j0 + j) * ldy + g;
                    _mm512_storeu_ps(yj, _mm512_add_ps(_mm512_loadu_ps(yj), _mm512_load_ps(part + j * TN_R16_ROWS)));
                }
            }
        }
    }
    if (mg < m) tn_kt_prev[i](k, m - mg, n, (const uint8_t *)w + (size_t)mg * w_rb, w_rb, x, x_rb, y + mg, ldy);
}

static void tn_kt_gemm_q4_K(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x, size_t x_rb,
                            float *y, int64_t ldy) {
    tn_kt_gemm(0, TN_Q4_K, k, m, n, w, w_rb, x, x_rb, y, ldy);
}
static void tn_kt_gemm_q5_K(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x, size_t x_rb,
                            float *y, int64_t ldy) {
    tn_kt_gemm(1, TN_Q5_K, k, m, n, w, w_rb, x, x_rb, y, ldy);
}
static void tn_kt_gemm_q6_K(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x, size_t x_rb,
                            float *y, int64_t ldy) {
    tn_kt_gemm(2, TN_Q6_K, k, m, n, w, w_rb, x, x_rb, y, ldy);
}

void tn_kern_register_ktile_avx512(tn_kern_table *t) {
    const tn_cpu *c = tn_cpu_get();
    if (!c->avx512vnni || !c->avx512vbmi) return;
    const char *env = getenv("TERN_KTILE"); /* 0: keep the file-layout kernels (A/B comparisons) */
    if (env && !strcmp(env, "0")) return;
    const tn_dtype ft[3] = {TN_Q4_K, TN_Q5_K, TN_Q6_K}, it[3] = {TN_Q4_K_R16, TN_Q5_K_R16, TN_Q6_K_R16};
    const tn_gemm_fn fns[3] = {tn_kt_gemm_q4_K, tn_kt_gemm_q5_K, tn_kt_gemm_q6_K};
    for (int i = 0; i < 3; i++) {
        if (!t->slot[it[i]].gemm || !t->slot[ft[i]].gemm || t->slot[ft[i]].gemm == fns[i]) continue;
        tn_kt_prev[i] = t->slot[ft[i]].gemm;
        tn_kt_r16[i] = t->slot[it[i]].gemm;
        t->slot[ft[i]].gemm = fns[i];
        t->slot[ft[i]].gemm_isa = TN_ISA_AVX512;
    }
}
