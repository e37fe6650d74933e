/*
 * gemv.c (avx512) — decode (n == 1) kernels: y[i] = dot(row i of w, x), one weight row at a time.
 *
 * Decode streams every weight byte once, so the kernels are built to run at memory speed on
 * row-major (not interleaved) weights: one long contiguous stream per row (the hardware
 * prefetchers follow it), VPDPBUSD / VPDPWSSD on full 512-bit registers, and all per-call work
 * on the activation row done once up front (x is rearranged into the register layout the weight
 * loads produce, with per-block scales and sums precomputed), so the per-row loop only loads
 * weights, multiplies and accumulates.
 *
 *   q4_0 / q8_0 (32-element blocks): 16 blocks per step. Register e (0..3) holds in its 128-bit
 *     lane L the first (lo) or second (hi) 16 codes of one block, as unsigned bytes (q4_0: the
 *     nibble 0..15; q8_0: q + 128), multiplied with the matching activations by VPDPBUSD; a 4x4
 *     unpack transpose turns the four registers into the 16 block sums; the offset (8 resp. 128
 *     times the block's activation sum, precomputed) is subtracted in integers, so each block's
 *     integer dot is exact; then one FMA with d_w * d_x over 16 blocks. q4_0: register e = blocks
 *     4e..4e+3 (one 72-byte window: two loads and one VPERMT2B put the codes in lanes, two more
 *     permutes pick the 16 fp16 scales out of the same windows); q8_0: block 4L+e from four lane
 *     loads, the scales gathered. Rows i and i + m/2 go through together (two streams, every
 *     activation register used twice). On Zen 4 this q4_0 path runs at ~30 GB/s per core from L2
 *     against ~20 GB/s for the lane-load + gather form it replaced, so decode is no longer bound by
 *     the kernel's arithmetic.
 *   q4_K: per super-block, 4 registers of 64 nibbles (two 32-groups each) times rearranged x by
 *     VPMADDUBSW, then VPDPWSSD with the groups' 6-bit scales as words: exact integer
 *     sum_g sc_g dot_g; the min term sum_g m_g (group activation sum) separately; one FMA each.
 *   q6_K: codes 0..63 rebuilt in registers (low nibbles | 2 high bits), VPMADDUBSW with x in its
 *     natural order, VPDPWSSD with the int8 sub-block scales, and the -32 offset folded in as
 *     -32 * sum_j sc_j bsum_j (one more VPDPWSSD); one FMA per super-block.
 * Integer sums are exact as in the references; only the float accumulation order differs.
 *
 * tn_kern_register_gemv_avx512 wraps the slot's gemm: n == 1 (q4_0 / q8_0: every n, in passes of
 * TN_GEMV_NMAX columns; f16: n <= TN_GEMV_F16_NMAX; q6_K: n <= TN_GEMV_Q6K_NMAX) goes
 * here, larger n to the previous (tiled) kernel; the slot's gemm_nrow tells the matmul driver to
 * hand such calls whole thread ranges.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "kern/kern.h"
#include "kern/scalar/kernels.h"
#include "quant/blocks.h"
#include "quant/quant.h"

#define TN_DECL_GEMV(name)                                                                                             \
    void name(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x, size_t x_rb, float *y,       \
              int64_t ldy);
TN_DECL_GEMV(tn_k_gemv_q4_0_q8_0__avx512)
TN_DECL_GEMV(tn_k_gemv_q8_0_q8_0__avx512)
TN_DECL_GEMV(tn_k_gemv_q4_K_q8_K__avx512)
TN_DECL_GEMV(tn_k_gemv_q6_K_q8_K__avx512)

/* Scratch for the rearranged activations: on the stack up to this size, else the heap. */
#define TN_GEMV_STACK 24576
#define TN_GEMV_PF 2048 /* software prefetch distance in bytes, per row stream (q4_0, q8_0, f16) */
#define TN_GEMV_NMAX 8 /* q4_0 / q8_0: columns per pass over the rows */
#define TN_GEMV_NBATCH (1 << 30) /* q4_0 / q8_0: every batch goes to the row kernels, in passes of
                                     NMAX columns (each pass streams the rows again; from n ~ 8 on
                                     the kernel is compute-bound, so that costs little). Measured on
                                     Zen 4, 1B model, 2 threads: serve steps of 2..32 rows 1.2-2.7x
                                     faster than the tiled gemm, pp512 q4_0 123 -> 137 t/s, q8_0
                                     94 -> 102 t/s. */
#define TN_GEMV_F16_NMAX 8 /* f16: batches up to this size through the row kernel (one pass) */
#define TN_GEMV_Q6K_NMAX 32 /* q6_K: batches up to this size through the row kernel (8 columns per
                                pass over a row in L1); measured on Zen 4, 16000 x 2048 (a 1B
                                model's output layer per thread), 8 columns: 10.4 ms in the tiled
                                gemm (25 GMAC/s), 4.1 ms here (64 GMAC/s); 32 columns 61 GMAC/s,
                                the tiled gemm's best (64 columns) 57 */
#ifndef TN_GEMV_PF_K
#define TN_GEMV_PF_K 2048 /* the same for the k-quant kernels (one stream per row) */
#endif

static inline void *tn_gemv_scratch(size_t need, uint8_t *stackbuf) {
    if (need <= TN_GEMV_STACK) return stackbuf;
    return aligned_alloc(64, (need + 63) & ~(size_t)63);
}

/* ---- q4_0 / q8_0 ------------------------------------------------------------------------------ */

/* Lanes L = 0..3: the 16 bytes at p + (4L + e) * S. */
static inline __m512i tn_ld4(const uint8_t *p, size_t S, int e) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + (size_t)e * S)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + (size_t)(4 + e) * S)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + (size_t)(8 + e) * S)), 2);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + (size_t)(12 + e) * S)), 3);
    return v;
}

/* r_e lane L dwords 0..3 -> element 4L + e of the result: their sum. */
static inline __m512i tn_red4(__m512i r0, __m512i r1, __m512i r2, __m512i r3) {
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(r0, r1), _mm512_unpackhi_epi32(r0, r1));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(r2, r3), _mm512_unpackhi_epi32(r2, r3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

/* Activation layout for 16-block groups: per group 512 bytes (e = 0..3: lo 64, hi 64; lane L of
 * lo_e = codes 0..15 of one block, hi_e = codes 16..31 of it), then per position d_x (float) and
 * off * sum(codes) (int32). Position 4L+e (the order tn_red4 produces) holds block 4L+e (q8_0) or,
 * with T (q4_0: lane L of register e = block 4e+L, four consecutive blocks per register), block
 * 4e+L. */
typedef struct {
    const int8_t *xr;
    const float *dx;
    const int32_t *sx;
} tn_x32;

static void tn_prep_x32(const block_q8_0 *xb, int64_t ng, int32_t off, const int T, uint8_t *buf, tn_x32 *o) {
    int8_t *xr = (int8_t *)buf;
    float *dx = (float *)(buf + (size_t)ng * 512);
    int32_t *sx = (int32_t *)(buf + (size_t)ng * 512 + (size_t)ng * 64);
    for (int64_t g = 0; g < ng; g++)
        for (int b = 0; b < 16; b++) {
            const block_q8_0 *q = &xb[g * 16 + b];
            const int e = T ? b / 4 : b % 4, L = T ? b % 4 : b / 4;
            memcpy(xr + g * 512 + e * 128 + L * 16, q->qs, 16);
            memcpy(xr + g * 512 + e * 128 + 64 + L * 16, q->qs + 16, 16);
            int s = 0;
            for (int j = 0; j < 32; j++) s += q->qs[j];
            dx[g * 16 + 4 * L + e] = tn_fp16_to_fp32(q->d);
            sx[g * 16 + 4 * L + e] = off * s;
        }
    o->xr = xr;
    o->dx = dx;
    o->sx = sx;
}

/* Blocks past the last full group of one row: scalar. */
static float tn_tail32(const uint8_t *row, int64_t b0, int64_t nb, const block_q8_0 *xb, const int Q8) {
    const size_t S = Q8 ? sizeof(block_q8_0) : sizeof(block_q4_0);
    float sumf = 0;
    for (int64_t b = b0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)b * S;
        const int8_t *xq = xb[b].qs;
        int sumi = 0;
        if (Q8) {
            const int8_t *wq = (const int8_t *)(blk + 2);
            for (int j = 0; j < 32; j++) sumi += wq[j] * xq[j];
        } else {
            for (int j = 0; j < 16; j++) sumi += ((blk[2 + j] & 15) - 8) * xq[j] + ((blk[2 + j] >> 4) - 8) * xq[j + 16];
        }
        tn_fp16 dw;
        memcpy(&dw, blk, 2);
        sumf = fmaf((float)sumi, tn_fp16_to_fp32(dw) * tn_fp16_to_fp32(xb[b].d), sumf);
    }
    return sumf;
}

/* Byte-permute indices of the q4_0 path: qidx moves the codes of the 4 blocks of a 72-byte window
 * (block L at 18L: fp16 d, 16 code bytes) into lane L; d01 / d23 put the scale of block 4e+L
 * (window e, byte 18L) into fp16 word 4L+e, e = 0,1 from windows 0,1 and e = 2,3 from 2,3. */
typedef struct {
    __m512i qidx, d01, d23;
} tn_q4c;

static void tn_q4c_init(tn_q4c *c) {
    _Alignas(64) uint8_t q[64], a[64] = {0}, b[64] = {0};
    for (int L = 0; L < 4; L++)
        for (int i = 0; i < 16; i++) q[16 * L + i] = (uint8_t)(18 * L + 2 + i);
    for (int L = 0; L < 4; L++)
        for (int e = 0; e < 4; e++)
            for (int i = 0; i < 2; i++) {
                const uint8_t src = (uint8_t)((e & 1) * 64 + 18 * L + i); /* second source: bit 6 */
                if (e < 2) a[2 * (4 * L + e) + i] = src;
                else b[2 * (4 * L + e) + i] = src;
            }
    c->qidx = _mm512_load_si512(q);
    c->d01 = _mm512_load_si512(a);
    c->d23 = _mm512_load_si512(b);
}

/* The 16-block group at p: register e's weight codes as unsigned bytes (lo: codes 0..15 of each
 * lane's block, hi: 16..31) and, once all four are unpacked, the 16 block scales d_w in the lane
 * order of tn_red4. q4_0: register e = the 72-byte window of blocks 4e..4e+3, its codes moved into
 * lanes by one byte permute, the scales picked out of the same windows (A keeps them); q8_0:
 * block 4L+e from four lane loads (+128), the scales gathered. */
static inline void tn_codes32(const int Q8, const uint8_t *p, int e, const tn_q4c *C4, __m512i *A, __m512i *lo,
                              __m512i *hi) {
    if (Q8) {
        const __m512i s80 = _mm512_set1_epi8((char)0x80);
        *lo = _mm512_xor_si512(tn_ld4(p + 2, sizeof(block_q8_0), e), s80);
        *hi = _mm512_xor_si512(tn_ld4(p + 18, sizeof(block_q8_0), e), s80);
    } else {
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        A[e] = _mm512_loadu_si512(p + 72 * e);
        const __m512i Bw = _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)(p + 72 * e + 64)));
        const __m512i v = _mm512_permutex2var_epi8(A[e], C4->qidx, Bw);
        *lo = _mm512_and_si512(v, m4);
        *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
}

static inline __m512 tn_scales32(const int Q8, const uint8_t *p, const __m512i *A, const tn_q4c *C4) {
    if (Q8) {
        const __m512i gidx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                _mm512_set1_epi32((int)sizeof(block_q8_0)));
        return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(gidx, (const void *)p, 1)));
    }
    const __m512i d01 = _mm512_permutex2var_epi8(A[0], C4->d01, A[1]);
    const __m512i d = _mm512_mask_mov_epi8(d01, 0xF0F0F0F0u, _mm512_permutex2var_epi8(A[2], C4->d23, A[3]));
    return _mm512_cvtph_ps(_mm512_castsi512_si256(d));
}

/* acc += the group's 16 block sums (exact integers, offset removed) * d_w * d_x: one vector
 * accumulator whose lanes are summed at the end, so no serial chain; the order differs from the
 * tiled gemm's only by float reassociation. */
static inline __m512 tn_acc32(const __m512i *r, const tn_x32 *X, int64_t g, __m512 dw, __m512 acc) {
    const __m512i isum = _mm512_sub_epi32(tn_red4(r[0], r[1], r[2], r[3]), _mm512_loadu_si512(X->sx + g * 16));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_loadu_ps(X->dx + g * 16)), acc);
}

/* NR rows against NC activation columns (NR = 2, NC = 1 for decode: two row streams share every
 * activation load; NR = 1, NC = 2..4 for batches: each unpacked weight register serves every
 * column, the row read from memory once for all). Q8 selects q8_0 weights (else q4_0). Every row
 * is a sequential stream, software-prefetched TN_GEMV_PF bytes ahead. out[r * NC + c]; blocks past
 * the last whole group are left to the caller (tn_tail32). */
static inline void tn_tile32(const int NR, const int NC, const uint8_t *const *rows, int64_t ng, const tn_x32 *X,
                             const int Q8, const tn_q4c *C4, float *out) {
    const size_t S = Q8 ? sizeof(block_q8_0) : sizeof(block_q4_0);
    const int NL = Q8 ? 9 : 5; /* cache lines per 16-block group, rounded up */
    __m512 vacc[2][4];
    for (int rr = 0; rr < NR; rr++)
        for (int c = 0; c < NC; c++) vacc[rr][c] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        for (int rr = 0; rr < NR; rr++) {
            const uint8_t *p = rows[rr] + (size_t)g * 16 * S;
            for (int l = 0; l < NL; l++) _mm_prefetch((const char *)p + TN_GEMV_PF + 64 * l, _MM_HINT_T0);
            __m512i r[4][4], A[4];
            for (int e = 0; e < 4; e++) {
                __m512i lo, hi;
                tn_codes32(Q8, p, e, C4, A, &lo, &hi);
                for (int c = 0; c < NC; c++) {
                    const int8_t *xr = X[c].xr + g * 512 + e * 128;
                    r[c][e] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512(xr)),
                                                  hi, _mm512_load_si512(xr + 64));
                }
            }
            const __m512 dw = tn_scales32(Q8, p, A, C4);
            for (int c = 0; c < NC; c++) vacc[rr][c] = tn_acc32(r[c], &X[c], g, dw, vacc[rr][c]);
        }
    }
    for (int rr = 0; rr < NR; rr++)
        for (int c = 0; c < NC; c++) out[rr * NC + c] = _mm512_reduce_add_ps(vacc[rr][c]);
}

/* Decode and small batches (n <= TN_GEMV_NMAX). n == 1: rows i and i + h (h = ceil(m/2)) go
 * through together: two sequential streams far apart (on Zen 4 two adjacent rows interleaved read
 * at about half the rate of a plain stream), each activation register loaded once for both.
 * n > 1: every row once, against up to 4 columns at a time (the row stays in L1 between them). */
#define TN_GEMV_STACK_N 98304 /* rearranged activations of all n columns: stack up to this, else heap */
static inline void tn_gemv32(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x, size_t x_rb,
                             float *y, int64_t ldy, const int Q8) {
    const int64_t nb = k / 32, ng = nb / 16;
    const size_t per = (size_t)ng * (512 + 64 + 64);
    tn_q4c C4;
    tn_q4c_init(&C4);
    if (n > 1 && n <= TN_GEMV_NMAX) {
        _Alignas(64) uint8_t stackbuf[TN_GEMV_STACK_N];
        uint8_t *buf = per * (size_t)n <= sizeof stackbuf ? stackbuf : aligned_alloc(64, per * (size_t)n);
        if (buf) {
            tn_x32 X[TN_GEMV_NMAX];
            for (int64_t j = 0; j < n; j++)
                tn_prep_x32((const block_q8_0 *)((const uint8_t *)x + (size_t)j * x_rb), ng, Q8 ? 128 : 8, !Q8,
                            buf + (size_t)j * per, &X[j]);
            for (int64_t i = 0; i < m; i++) {
                const uint8_t *row = (const uint8_t *)w + (size_t)i * w_rb;
                for (int64_t j0 = 0; j0 < n; j0 += 4) {
                    const int nc = (int)(n - j0 < 4 ? n - j0 : 4);
                    float out[4];
                    switch (nc) {
                    case 4: tn_tile32(1, 4, &row, ng, X + j0, Q8, &C4, out); break;
                    case 3: tn_tile32(1, 3, &row, ng, X + j0, Q8, &C4, out); break;
                    case 2: tn_tile32(1, 2, &row, ng, X + j0, Q8, &C4, out); break;
                    default: tn_tile32(1, 1, &row, ng, X + j0, Q8, &C4, out); break;
                    }
                    for (int c = 0; c < nc; c++) {
                        const block_q8_0 *xb = (const block_q8_0 *)((const uint8_t *)x + (size_t)(j0 + c) * x_rb);
                        y[(j0 + c) * ldy + i] = out[c] + tn_tail32(row, ng * 16, nb, xb, Q8);
                    }
                }
            }
            if (buf != stackbuf) free(buf);
            return;
        }
        /* no scratch: the per-column path below (its own fallback runs every block in the tail) */
    }
    _Alignas(64) uint8_t stackbuf[TN_GEMV_STACK];
    uint8_t *buf = tn_gemv_scratch(per, stackbuf);
    const int64_t h = (m + 1) / 2;
    for (int64_t j = 0; j < n; j++) {
        const block_q8_0 *xb = (const block_q8_0 *)((const uint8_t *)x + (size_t)j * x_rb);
        tn_x32 X = {0};
        if (buf) tn_prep_x32(xb, ng, Q8 ? 128 : 8, !Q8, buf, &X);
        const int64_t ngu = buf ? ng : 0; /* no scratch (allocation failed): all blocks in the tail loop */
        for (int64_t i = 0; i < h; i++) {
            float out[2];
            const uint8_t *rows[2] = {(const uint8_t *)w + (size_t)i * w_rb, (const uint8_t *)w + (size_t)(i + h) * w_rb};
            const int nr = i + h < m ? 2 : 1;
            if (nr == 2) tn_tile32(2, 1, rows, ngu, &X, Q8, &C4, out);
            else tn_tile32(1, 1, rows, ngu, &X, Q8, &C4, out);
            for (int t = 0; t < nr; t++) y[j * ldy + i + t * h] = out[t] + tn_tail32(rows[t], ngu * 16, nb, xb, Q8);
        }
    }
    if (buf != stackbuf) free(buf);
}

void tn_k_gemv_q4_0_q8_0__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                 size_t x_rb, float *y, int64_t ldy) {
    tn_gemv32(k, m, n, w, w_rb, x, x_rb, y, ldy, 0);
}

void tn_k_gemv_q8_0_q8_0__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                 size_t x_rb, float *y, int64_t ldy) {
    tn_gemv32(k, m, n, w, w_rb, x, x_rb, y, ldy, 1);
}

/* ---- q4_K ------------------------------------------------------------------------------------- */

/* Activations per super-block: codes as [g0 g2][g1 g3][g4 g6][g5 g7] (64 bytes each, matching the
 * low/high nibbles of the two 64-byte halves of qs), group sums (int16 x 8), d. */
static void tn_prep_x_q4K(const block_q8_K *xb, int64_t nsb, uint8_t *buf, int8_t **xr, int16_t **gs, float **dx) {
    *xr = (int8_t *)buf;
    *gs = (int16_t *)(buf + (size_t)nsb * 256);
    *dx = (float *)(buf + (size_t)nsb * (256 + 16));
    static const int order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int64_t s = 0; s < nsb; s++) {
        for (int r = 0; r < 8; r++) memcpy(*xr + s * 256 + r * 32, xb[s].qs + 32 * order[r], 32);
        for (int g = 0; g < 8; g++) (*gs)[s * 8 + g] = (int16_t)(xb[s].bsums[2 * g] + xb[s].bsums[2 * g + 1]);
        (*dx)[s] = xb[s].d;
    }
}

/* ggml's unpacking of the 12 scale bytes: u bytes 0..7 = 6-bit scales, 8..15 = 6-bit mins. */
static inline __m128i tn_q4K_scales(const uint8_t *scales) {
    uint32_t u[4];
    memcpy(u, scales, 12);
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = uaux;
    u[0] &= kmask1;
    return _mm_loadu_si128((const __m128i *)u);
}

static inline float tn_row_q4K(const block_q4_K *wb, int64_t nsb, const int8_t *xr, const int16_t *gs,
                               const float *dx, const __m512i sidx[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 accA = _mm512_setzero_ps();
    __m128 accM = _mm_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const block_q4_K *b = &wb[s];
        _mm_prefetch((const char *)b + TN_GEMV_PF_K, _MM_HINT_T0);
        _mm_prefetch((const char *)b + TN_GEMV_PF_K + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)b + TN_GEMV_PF_K + 128, _MM_HINT_T0);
        const __m128i sm = tn_q4K_scales(b->scales);
        const __m256i sm16 = _mm256_cvtepu8_epi16(sm); /* words: sc0..7, m0..7 */
        const __m512i sw = _mm512_zextsi256_si512(sm16);
        const __m512i v0 = _mm512_loadu_si512(b->qs), v1 = _mm512_loadu_si512(b->qs + 64);
        const int8_t *xs = xr + s * 256;
        const __m512i q0 = _mm512_and_si512(v0, m4), q1 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
        const __m512i q2 = _mm512_and_si512(v1, m4), q3 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
        const __m512i p0 = _mm512_maddubs_epi16(q0, _mm512_load_si512(xs));
        const __m512i p1 = _mm512_maddubs_epi16(q1, _mm512_load_si512(xs + 64));
        const __m512i p2 = _mm512_maddubs_epi16(q2, _mm512_load_si512(xs + 128));
        const __m512i p3 = _mm512_maddubs_epi16(q3, _mm512_load_si512(xs + 192));
        __m512i a0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), p0, _mm512_permutexvar_epi16(sidx[0], sw));
        __m512i a1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), p1, _mm512_permutexvar_epi16(sidx[1], sw));
        a0 = _mm512_dpwssd_epi32(a0, p2, _mm512_permutexvar_epi16(sidx[2], sw));
        a1 = _mm512_dpwssd_epi32(a1, p3, _mm512_permutexvar_epi16(sidx[3], sw));
        const __m512i isum = _mm512_add_epi32(a0, a1);
        const __m128i msum = _mm_madd_epi16(_mm256_extracti128_si256(sm16, 1), _mm_loadu_si128((const __m128i *)(gs + s * 8)));
        uint32_t dm;
        memcpy(&dm, b, 4); /* d, dmin */
        const __m128 dd = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dm)), _mm_set1_ps(dx[s]));
        accA = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_broadcastss_ps(dd), accA);
        accM = _mm_fmadd_ps(_mm_cvtepi32_ps(msum), _mm_permute_ps(dd, 0x55), accM);
    }
    __m128 t = _mm_add_ps(accM, _mm_movehl_ps(accM, accM));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm512_reduce_add_ps(accA) - _mm_cvtss_f32(t);
}

/* Word w of register r (64 codes: groups a | b, 16 words each) takes group a's or b's scale. */
static void tn_q4K_sidx(__m512i sidx[4]) {
    static const int ga[4] = {0, 1, 4, 5}, gb[4] = {2, 3, 6, 7};
    for (int r = 0; r < 4; r++) {
        uint16_t ix[32];
        for (int w = 0; w < 32; w++) ix[w] = (uint16_t)(w < 16 ? ga[r] : gb[r]);
        sidx[r] = _mm512_loadu_si512(ix);
    }
}

void tn_k_gemv_q4_K_q8_K__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                 size_t x_rb, float *y, int64_t ldy) {
    const int64_t nsb = k / QK_K;
    _Alignas(64) uint8_t stackbuf[TN_GEMV_STACK];
    uint8_t *buf = tn_gemv_scratch((size_t)nsb * (256 + 16 + 4), stackbuf);
    if (!buf) { /* no scratch: the reference per row */
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                tn_k_vec_dot_q4_K_q8_K__scalar(k, &y[j * ldy + i], (const uint8_t *)w + (size_t)i * w_rb,
                                               (const uint8_t *)x + (size_t)j * x_rb);
            }
        return;
    }
    __m512i sidx[4];
    tn_q4K_sidx(sidx);
    for (int64_t j = 0; j < n; j++) {
        int8_t *xr;
        int16_t *gs;
        float *dx;
        tn_prep_x_q4K((const block_q8_K *)((const uint8_t *)x + (size_t)j * x_rb), nsb, buf, &xr, &gs, &dx);
        for (int64_t i = 0; i < m; i++)
            y[j * ldy + i] = tn_row_q4K((const block_q4_K *)((const uint8_t *)w + (size_t)i * w_rb), nsb, xr, gs, dx, sidx);
    }
    if (buf != stackbuf) free(buf);
}

/* ---- q6_K ------------------------------------------------------------------------------------- */

/* One q6_K super-block, decoded once for any number of columns: q[r] = 64 codes (0..63) of
 * register r, ps[r] = its sub-block scales widened and permuted per word, off = -32 * scales
 * (the offset term, against the column's bsums); prefetches the row TN_GEMV_PF_K ahead. */
static inline __attribute__((always_inline)) void tn_q6K_decode(const block_q6_K *b, const __m512i sidx[4],
                                                                 __m512i q[4], __m512i ps[4], __m512i *off) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* per 16-bit word: first 32 bytes (r = 0 / 2) vs last 32 (r = 1 / 3) of a 64-byte ql half */
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    for (int c = 0; c < 4; c++) _mm_prefetch((const char *)b + TN_GEMV_PF_K + 64 * c, _MM_HINT_T0);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    const __m512i sw = _mm512_zextsi256_si512(sc16);
    /* offset -32 per code: -32 * sum_j sc_j bsum_j */
    *off = _mm512_zextsi256_si512(_mm256_mullo_epi16(sc16, _mm256_set1_epi16(-32)));
    for (int h = 0; h < 2; h++) {
        const __m512i Q = _mm512_loadu_si512(b->ql + 64 * h);
        const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * h)));
        q[2 * h] = _mm512_or_si512(_mm512_and_si512(Q, m4), _mm512_and_si512(_mm512_sllv_epi16(H, shl), m30));
        q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(Q, 4), m4),
                                       _mm512_and_si512(_mm512_srlv_epi16(H, shr), m30));
    }
    for (int r = 0; r < 4; r++) ps[r] = _mm512_permutexvar_epi16(sidx[r], sw);
}

/* The integer dot of a decoded super-block with one column's super-block (16 lanes to add). */
static inline __attribute__((always_inline)) __m512i tn_q6K_isum(const __m512i q[4], const __m512i ps[4], __m512i off,
                                                                 const block_q8_K *xs) {
    __m512i isum = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                       _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)xs->bsums)), off);
    __m512i isum2 = _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
        isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(q[2 * h], _mm512_loadu_si512(xs->qs + 128 * h)), ps[2 * h]);
        isum2 = _mm512_dpwssd_epi32(isum2, _mm512_maddubs_epi16(q[2 * h + 1], _mm512_loadu_si512(xs->qs + 128 * h + 64)),
                                    ps[2 * h + 1]);
    }
    return _mm512_add_epi32(isum, isum2);
}

/* Two rows far apart (two sequential streams) against one column: a one-token matmul. */
static inline void tn_rows2_q6K(const block_q6_K *const *wb, const block_q8_K *xb, int64_t nsb, const __m512i sidx[4],
                                float *out) {
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t s = 0; s < nsb; s++)
        for (int r = 0; r < 2; r++) {
            const block_q6_K *b = &wb[r][s];
            __m512i q[4], ps[4], off;
            tn_q6K_decode(b, sidx, q, ps, &off);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tn_q6K_isum(q, ps, off, &xb[s])),
                                     _mm512_set1_ps(tn_fp16_to_fp32(b->d) * xb[s].d), acc[r]);
        }
    out[0] = _mm512_reduce_add_ps(acc[0]);
    out[1] = _mm512_reduce_add_ps(acc[1]);
}

/* One row against NC activation columns: the codes are rebuilt and the scales widened and
 * permuted once per super-block for all columns; per column 4 VPMADDUBSW + 4 VPDPWSSD + the offset
 * term, one FMA. out[c] = dot(row, x column c). */
static inline __attribute__((always_inline)) void tn_rows_q6K(const int NC, const block_q6_K *wb,
                                                               const block_q8_K *const *xb, int64_t nsb,
                                                               const __m512i sidx[4], float *out) {
    __m512 acc[TN_GEMV_NMAX];
    for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const block_q6_K *b = &wb[s];
        __m512i q[4], ps[4], off;
        tn_q6K_decode(b, sidx, q, ps, &off);
        const float dw = tn_fp16_to_fp32(b->d);
        for (int c = 0; c < NC; c++) {
            const block_q8_K *xs = &xb[c][s];
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tn_q6K_isum(q, ps, off, xs)), _mm512_set1_ps(dw * xs->d), acc[c]);
        }
    }
    for (int c = 0; c < NC; c++) out[c] = _mm512_reduce_add_ps(acc[c]);
}

#define TN_ROWS_Q6K_FN(NC)                                                                                             \
    static void tn_rows_q6K_##NC(const block_q6_K *wb, const block_q8_K *const *xb, int64_t nsb,                       \
                                 const __m512i sidx[4], float *out) {                                                  \
        tn_rows_q6K(NC, wb, xb, nsb, sidx, out);                                                                       \
    }
TN_ROWS_Q6K_FN(1)
TN_ROWS_Q6K_FN(2)
TN_ROWS_Q6K_FN(3)
TN_ROWS_Q6K_FN(4)
TN_ROWS_Q6K_FN(5)
TN_ROWS_Q6K_FN(6)
TN_ROWS_Q6K_FN(7)
TN_ROWS_Q6K_FN(8)
typedef void (*tn_rows_q6K_fn)(const block_q6_K *, const block_q8_K *const *, int64_t, const __m512i[4], float *);
static const tn_rows_q6K_fn tn_rows_q6K_nc[TN_GEMV_NMAX + 1] = {NULL,           tn_rows_q6K_1, tn_rows_q6K_2,
                                                                tn_rows_q6K_3,  tn_rows_q6K_4, tn_rows_q6K_5,
                                                                tn_rows_q6K_6,  tn_rows_q6K_7, tn_rows_q6K_8};

/* Rows outer, columns in passes of up to TN_GEMV_NMAX inner: each row is read from memory once
 * (later passes find it in L1). */
void tn_k_gemv_q6_K_q8_K__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                 size_t x_rb, float *y, int64_t ldy) {
    const int64_t nsb = k / QK_K;
    /* register q (64 codes = 4 sub-blocks of 16): word w -> sub-block 4 q + w / 8 */
    __m512i sidx[4];
    for (int q = 0; q < 4; q++) {
        uint16_t ix[32];
        for (int wd = 0; wd < 32; wd++) ix[wd] = (uint16_t)(4 * q + wd / 8);
        sidx[q] = _mm512_loadu_si512(ix);
    }
    if (n == 1 && m > 1) { /* one column: rows i and i + h together (two streams; one core from DRAM 20 -> 25 GB/s) */
        const int64_t h = (m + 1) / 2;
        for (int64_t i = 0; i < m - h; i++) {
            const block_q6_K *wb[2] = {(const block_q6_K *)((const uint8_t *)w + (size_t)i * w_rb),
                                       (const block_q6_K *)((const uint8_t *)w + (size_t)(i + h) * w_rb)};
            float out[2];
            tn_rows2_q6K(wb, (const block_q8_K *)x, nsb, sidx, out);
            y[i] = out[0], y[i + h] = out[1];
        }
        if (m - h < h) { /* m odd: the middle row alone */
            const block_q8_K *xb[1] = {(const block_q8_K *)x};
            tn_rows_q6K_1((const block_q6_K *)((const uint8_t *)w + (size_t)(h - 1) * w_rb), xb, nsb, sidx, &y[h - 1]);
        }
        return;
    }
    for (int64_t i = 0; i < m; i++) {
        const block_q6_K *wb = (const block_q6_K *)((const uint8_t *)w + (size_t)i * w_rb);
        for (int64_t j0 = 0; j0 < n; j0 += TN_GEMV_NMAX) {
            const int nc = (int)(n - j0 < TN_GEMV_NMAX ? n - j0 : TN_GEMV_NMAX);
            const block_q8_K *xb[TN_GEMV_NMAX];
            float out[TN_GEMV_NMAX];
            for (int c = 0; c < nc; c++) xb[c] = (const block_q8_K *)((const uint8_t *)x + (size_t)(j0 + c) * x_rb);
            tn_rows_q6K_nc[nc](wb, xb, nsb, sidx, out);
            for (int c = 0; c < nc; c++) y[(j0 + c) * ldy + i] = out[c];
        }
    }
}


/* ---- f16 x f16 -------------------------------------------------------------------------------------
 * Rows i and i + h (h = ceil(m/2)) go through together, two sequential streams, each software-
 * prefetched TN_GEMV_PF bytes ahead; the activation row stays in f16 (half the L1 footprint of an
 * f32 copy: at k = 8192 an f32 copy fills L1 and the row kernel ran at ~60% of a plain read) and
 * every converted activation register serves both rows. 256-bit F16C conversions (on Zen 4 the
 * 512-bit vcvtph2ps halves the speed). Products of two f16 values are exact in f32, so only the
 * order of the f32 sum differs from the reference. */
static inline float tn_hsum256(__m256 t) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Decode (n == 1) and small batches (n <= TN_GEMV_F16_NMAX: the verify step of speculative
 * decoding, a serve step of a few sequences) alike: the two row streams, each weight register
 * converted once and multiplied with up to TN_GEMV_F16_NC activation rows (TN_F16_U accumulators per row and
 * column), so a pass reads the weights once for all its columns. (Widening the activation rows to an f32 copy
 * once per call, to save the conversion per column, measured no faster: 4-8 columns slower.) */
#define TN_GEMV_F16_NC 8
/* U independent accumulators per row and column (the k steps of 8 take turns), so 8 or more FMA
 * chains are in flight: fewer columns are bound by the FMA latency, not its throughput. */
#define TN_F16_U(NC) ((NC) >= 5 ? 1 : (NC) == 1 ? 4 : 2)
static inline __attribute__((always_inline)) void tn_rows_f16_nc(const int NR, const int NC, const uint16_t *const *wr,
                                                                 int64_t k, const uint16_t *const *xh, float *out) {
    const int U = TN_F16_U(NC);
    const int64_t k8 = k / 8 * 8, ku = k / (8 * U) * (8 * U);
    __m256 a[2][TN_GEMV_F16_NC][4];
    for (int rr = 0; rr < 2; rr++)
        for (int c = 0; c < NC; c++)
            for (int u = 0; u < U; u++) a[rr][c][u] = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j < ku; j += 8 * U)
        for (int u = 0; u < U; u++) {
            const int64_t l = j + 8 * u;
            if ((l & 31) == 0)
                for (int rr = 0; rr < NR; rr++) _mm_prefetch((const char *)(wr[rr] + l) + TN_GEMV_PF, _MM_HINT_T0);
            __m256 wv[2];
            for (int rr = 0; rr < NR; rr++) wv[rr] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wr[rr] + l)));
            for (int c = 0; c < NC; c++) {
                const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xh[c] + l)));
                for (int rr = 0; rr < NR; rr++) a[rr][c][u] = _mm256_fmadd_ps(wv[rr], xv, a[rr][c][u]);
            }
        }
    for (; j < k8; j += 8) {
        __m256 wv[2];
        for (int rr = 0; rr < NR; rr++) wv[rr] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wr[rr] + j)));
        for (int c = 0; c < NC; c++) {
            const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xh[c] + j)));
            for (int rr = 0; rr < NR; rr++) a[rr][c][0] = _mm256_fmadd_ps(wv[rr], xv, a[rr][c][0]);
        }
    }
    for (int rr = 0; rr < NR; rr++)
        for (int c = 0; c < NC; c++) {
            __m256 t = a[rr][c][0];
            for (int u = 1; u < U; u++) t = _mm256_add_ps(t, a[rr][c][u]);
            float sum = tn_hsum256(t);
            for (int64_t l = k8; l < k; l++) sum += tn_fp16_to_fp32(wr[rr][l]) * tn_fp16_to_fp32(xh[c][l]);
            out[rr * TN_GEMV_F16_NC + c] = sum;
        }
}

typedef void (*tn_rows_f16_fn)(int nr, const uint16_t *const *wr, int64_t k, const uint16_t *const *xh, float *out);
#define TN_ROWS_F16_NC(NC)                                                                                             \
    static void tn_rows_f16_##NC(int nr, const uint16_t *const *wr, int64_t k, const uint16_t *const *xh,              \
                                 float *out) {                                                                         \
        if (nr == 2) tn_rows_f16_nc(2, NC, wr, k, xh, out);                                                            \
        else tn_rows_f16_nc(1, NC, wr, k, xh, out);                                                                    \
    }
TN_ROWS_F16_NC(1)
TN_ROWS_F16_NC(2)
TN_ROWS_F16_NC(3)
TN_ROWS_F16_NC(4)
TN_ROWS_F16_NC(5)
TN_ROWS_F16_NC(6)
TN_ROWS_F16_NC(7)
TN_ROWS_F16_NC(8)
static const tn_rows_f16_fn tn_rows_f16_ncs[TN_GEMV_F16_NC + 1] = {
    NULL, tn_rows_f16_1, tn_rows_f16_2, tn_rows_f16_3, tn_rows_f16_4, tn_rows_f16_5, tn_rows_f16_6, tn_rows_f16_7,
    tn_rows_f16_8};

void tn_k_gemv_f16_f16__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                               size_t x_rb, float *y, int64_t ldy) {
    const int64_t h = (m + 1) / 2;
    for (int64_t j0 = 0; j0 < n; j0 += TN_GEMV_F16_NC) { /* passes of up to NC columns */
        const int nc = (int)(n - j0 < TN_GEMV_F16_NC ? n - j0 : TN_GEMV_F16_NC);
        const uint16_t *xh[TN_GEMV_F16_NC];
        for (int c = 0; c < nc; c++) xh[c] = (const uint16_t *)((const uint8_t *)x + (size_t)(j0 + c) * x_rb);
        for (int64_t i = 0; i < h; i++) {
            float out[2 * TN_GEMV_F16_NC];
            const uint16_t *wr[2] = {(const uint16_t *)((const uint8_t *)w + (size_t)i * w_rb),
                                     (const uint16_t *)((const uint8_t *)w + (size_t)(i + h) * w_rb)};
            const int nr = i + h < m ? 2 : 1;
            tn_rows_f16_ncs[nc](nr, wr, k, xh, out);
            for (int c = 0; c < nc; c++) {
                y[(j0 + c) * ldy + i] = out[c];
                if (nr == 2) y[(j0 + c) * ldy + i + h] = out[TN_GEMV_F16_NC + c];
            }
        }
    }
}

/* ---- registration: wrap the slot's gemm ----------------------------------------------------------- */

#define TN_GEMV_WRAP(wt, at, nmax)                                                                                     \
    static tn_gemm_fn tn_gemv_prev_##wt;                                                                              \
    static void tn_gemv_wrap_##wt(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,       \
                                  size_t x_rb, float *y, int64_t ldy) {                                              \
        if (n <= (nmax))                                                                                               \
            for (int64_t j0 = 0; j0 < n; j0 += TN_GEMV_NMAX) /* column chunks: each streams the rows again */         \
                tn_k_gemv_##wt##_##at##__avx512(k, m, n - j0 < TN_GEMV_NMAX ? n - j0 : TN_GEMV_NMAX, w, w_rb,          \
                                                (const uint8_t *)x + (size_t)j0 * x_rb, x_rb, y + j0 * ldy, ldy);       \
        else                                                                                                           \
            tn_gemv_prev_##wt(k, m, n, w, w_rb, x, x_rb, y, ldy);                                                      \
    }
TN_GEMV_WRAP(q4_0, q8_0, TN_GEMV_NBATCH)
TN_GEMV_WRAP(q8_0, q8_0, TN_GEMV_NBATCH)
TN_GEMV_WRAP(q4_K, q8_K, 1)
/* q6_K: the kernel takes all columns itself (rows outer), up to TN_GEMV_Q6K_NMAX */
static tn_gemm_fn tn_gemv_prev_q6_K;
static void tn_gemv_wrap_q6_K(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x, size_t x_rb,
                              float *y, int64_t ldy) {
    if (n <= TN_GEMV_Q6K_NMAX) tn_k_gemv_q6_K_q8_K__avx512(k, m, n, w, w_rb, x, x_rb, y, ldy);
    else tn_gemv_prev_q6_K(k, m, n, w, w_rb, x, x_rb, y, ldy);
}
TN_GEMV_WRAP(f16, f16, TN_GEMV_F16_NMAX)

#define TN_GEMV_INSTALL(T, wt, nmax)                                                                                   \
    do {                                                                                                               \
        if (t->slot[T].gemm != tn_gemv_wrap_##wt) {                                                                    \
            tn_gemv_prev_##wt = t->slot[T].gemm;                                                                       \
            t->slot[T].gemm = tn_gemv_wrap_##wt;                                                                       \
            t->slot[T].gemm_isa = TN_ISA_AVX512;                                                                       \
            t->slot[T].gemm_nrow = (nmax);                                                                             \
        }                                                                                                              \
    } while (0)

void tn_kern_register_gemv_avx512(tn_kern_table *t) {
    const tn_cpu *c = tn_cpu_get();
    if (!c->avx512vnni || !c->avx512vbmi) return;
    TN_GEMV_INSTALL(TN_Q4_0, q4_0, TN_GEMV_NBATCH);
    TN_GEMV_INSTALL(TN_Q8_0, q8_0, TN_GEMV_NBATCH);
    TN_GEMV_INSTALL(TN_Q4_K, q4_K, 1);
    TN_GEMV_INSTALL(TN_Q6_K, q6_K, TN_GEMV_Q6K_NMAX);
    TN_GEMV_INSTALL(TN_F16, f16, TN_GEMV_F16_NMAX);
}
