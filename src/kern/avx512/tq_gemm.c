/*
 * tq_gemm.c (avx512) — prefill (n > 1) kernels of tern's any-bit types: y[j][i] = row i of W ·
 * column j of X, for every tq type, with the weights decoded once per call and reused by every
 * column; and both decode and prefill for the load-time *_c16 layout (b = 2..8, at the end of
 * the file), plus the AVX-512 repack into it.
 *
 * Both sides are brought into one int8 layout per super-step of 16 chunks (512 codes): register
 * t (0..7) holds, on dword lane c, codes 4t .. 4t + 3 of chunk c. A weight row is unpacked into
 * that layout (every plane into 32 code bytes per chunk, element order, then a 16 x 8 dword
 * transpose) together with per-chunk d (and m) as floats; every activation column likewise
 * (the transpose of its q8_0 codes, per-chunk d_x, d_x * sum(x) or (2^b - 1) * sum(x)). The
 * micro-kernel then multiplies 4 rows x 3 columns: 8 VPDPBUSD per (row, column) and super-step
 * give 16 exact chunk sums in one register, and 2 FMAs scale them — no per-column unpacking,
 * folding or horizontal sums until the end of the row. Integer sums per chunk are exact as in
 * the reference; only the order of the float additions differs. Blocks after the last whole
 * super-step go to the slot's vec_dot.
 *
 * Needs AVX512 F/BW/VL/DQ/VNNI/VBMI (installed by tq.c only then).
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "kern/avx512/colcache.h"
#include "kern/avx512/tq_kern.h"
#include "kern/avx512/tq_plan.h"
#include "kern/scalar/kernels.h"
#include "kern/tq_list.inc"
#include "quant/repack.h"
#include "quant/tq.h"

#define TQ_SUPB 640 /* bytes per super-step of a decoded row or column: 8 x 64 codes, 2 x 16 floats */
#define TQ_RB 4     /* rows of the micro-kernel (2 x 4 did 30 MAC/cycle in L2, 4 x 3 36) */
#define TQ_CB 3     /* columns of the micro-kernel */

/* 16 x 8 dword transpose: in[c] = 8 dwords of chunk c (two chunks per zmm: z[p] = chunks 2p,
 * 2p + 1); out[t] dword c = in[c] dword t. Three rounds of 2-source dword permutes. */
TQ_INLINE void tq_transpose(const __m512i z[8], __m512i out[8]) {
    /* round 1: y[2q + h] = rows 4q..4q+3, dwords 4h..4h+3 (row-major 4 x 4) */
    const __m512i i1lo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i i1hi = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    __m512i y[8];
    for (int q = 0; q < 4; q++) {
        y[2 * q] = _mm512_permutex2var_epi32(z[2 * q], i1lo, z[2 * q + 1]);
        y[2 * q + 1] = _mm512_permutex2var_epi32(z[2 * q], i1hi, z[2 * q + 1]);
    }
    /* round 2: v[4g + 2h + e] = rows 8g..8g+7, dwords 4h + 2e, 4h + 2e + 1 (as [d0 of 8 rows, d1 of
     * 8 rows]) from y[4g + h] (rows 8g..8g+3) and y[4g + 2 + h] (rows 8g+4..8g+7) */
    const __m512i i2[2] = {_mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29),
                           _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31)};
    __m512i v[8];
    for (int g = 0; g < 2; g++)
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++) v[4 * g + 2 * h + e] = _mm512_permutex2var_epi32(y[4 * g + h], i2[e], y[4 * g + 2 + h]);
    /* round 3: out[4h + 2e + f] = rows 0..7 and 8..15 of dword 4h + 2e + f */
    const __m512i i3[2] = {_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23),
                           _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31)};
    for (int h = 0; h < 2; h++)
        for (int e = 0; e < 2; e++)
            for (int f = 0; f < 2; f++) out[4 * h + 2 * e + f] = _mm512_permutex2var_epi32(v[2 * h + e], i3[f], v[4 + 2 * h + e]);
}

/* One plane of one chunk (4 w bytes at p) -> 32 bytes of its field values, element order. */
TQ_INLINE __m256i tq_plane32(const int w, const uint8_t *p) {
    switch (w) {
    case 8: return _mm256_loadu_si256((const __m256i *)p);
    case 4: {
        const __m128i x = _mm_loadu_si128((const __m128i *)p), m4 = _mm_set1_epi8(15);
        return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m4), _mm_and_si128(x, m4));
    }
    case 2: {
        uint64_t u;
        memcpy(&u, p, 8);
        const __m256i v = _mm256_srlv_epi64(_mm256_set1_epi64x((long long)u), _mm256_set_epi64x(6, 4, 2, 0));
        return _mm256_and_si256(v, _mm256_set1_epi8(3));
    }
    default: {
        uint32_t u;
        memcpy(&u, p, 4);
        return _mm256_maskz_set1_epi8((__mmask32)u, 1);
    }
    }
}

/* Weight row -> nsup super-steps of decoded codes (8 x 64 bytes), d per chunk lane, m per lane. */
TQ_INLINE void tq_unpack_row(const int B, const int G, const int ASYM, const uint8_t *row, int64_t nsup, uint8_t *out) {
    const int W0 = TQ_W0(B), W1 = TQ_W1(B), W2 = TQ_W2(B), CPB = G / 32, HDR = ASYM ? 4 : 2;
    const int BB = HDR + G * B / 8;
    const int O1 = HDR + G * W0 / 8, O2 = O1 + G * W1 / 8;
    for (int64_t s = 0; s < nsup; s++, out += TQ_SUPB) {
        __m512i z[8];
        float *D = (float *)(out + 512), *M = D + 16;
        for (int c = 0; c < 16; c++) {
            const int64_t ch = s * 16 + c;
            const uint8_t *blk = row + (size_t)(ch / CPB) * BB;
            const int cc = (int)(ch % CPB);
            __m256i q = tq_plane32(W0, blk + HDR + cc * 4 * W0);
            if (W1) q = _mm256_or_si256(q, _mm256_slli_epi16(tq_plane32(W1, blk + O1 + cc * 4 * W1), W0));
            if (W2) q = _mm256_or_si256(q, _mm256_slli_epi16(tq_plane32(W2, blk + O2 + cc * 4 * W2), W0 + W1));
            z[c / 2] = c % 2 ? _mm512_inserti64x4(z[c / 2], q, 1) : _mm512_castsi256_si512(q);
            uint16_t h[2];
            memcpy(h, blk, ASYM ? 4 : 2);
            D[c] = _cvtsh_ss(h[0]);
            if (ASYM) M[c] = _cvtsh_ss(h[1]);
        }
        __m512i t[8];
        tq_transpose(z, t);
        for (int j = 0; j < 8; j++) _mm512_store_si512(out + 64 * j, t[j]);
    }
}

/* q8_0 column -> nsup super-steps: codes transposed like the weights, then DX (d_x; sym: d_x/2)
 * and MX (asym: d_x * sum(x)) or NX (sym: int32 (2^b - 1) * sum(x)) per chunk lane. */
static void tq_prep_col(int bits, int asym, const block_q8_0 *x, int64_t nsup, uint8_t *out) {
    const __m512i ones = _mm512_set1_epi8(1);
    const int nmax = (1 << bits) - 1;
    for (int64_t s = 0; s < nsup; s++, out += TQ_SUPB) {
        const block_q8_0 *xc = x + s * 16;
        __m512i z[8], t[8];
        for (int p = 0; p < 8; p++)
            z[p] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)xc[2 * p].qs)),
                                      _mm256_loadu_si256((const __m256i *)xc[2 * p + 1].qs), 1);
        tq_transpose(z, t);
        __m512i sum = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            _mm512_store_si512(out + 64 * j, t[j]);
            sum = _mm512_dpbusd_epi32(sum, ones, t[j]); /* lane c: sum of chunk c's codes */
        }
        uint16_t hv[16];
        for (int c = 0; c < 16; c++) memcpy(&hv[c], &xc[c].d, 2);
        const __m512 dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hv));
        if (asym) {
            _mm512_store_ps(out + 512, dx);
            _mm512_store_ps(out + 576, _mm512_mul_ps(dx, _mm512_cvtepi32_ps(sum)));
        } else {
            _mm512_store_ps(out + 512, _mm512_mul_ps(dx, _mm512_set1_ps(0.5f)));
            _mm512_store_si512(out + 576, _mm512_mullo_epi32(sum, _mm512_set1_epi32(nmax)));
        }
    }
}

/* RB rows x CB columns over nsup super-steps; y[c * ldy + r] = dot (whole super-steps only). */
TQ_INLINE void tq_micro(const int ASYM, const int RB, const int CB, const uint8_t *const *w, const uint8_t *const *x,
                        int64_t nsup, float *y, int64_t ldy) {
    __m512 acc[TQ_RB][TQ_CB];
    for (int r = 0; r < RB; r++)
        for (int c = 0; c < CB; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nsup; s++) {
        const size_t o = (size_t)s * TQ_SUPB;
        __m512i ai[TQ_RB][TQ_CB];
        for (int r = 0; r < RB; r++)
            for (int c = 0; c < CB; c++) ai[r][c] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            __m512i X[TQ_CB];
            for (int c = 0; c < CB; c++) X[c] = _mm512_load_si512(x[c] + o + 64 * j);
            for (int r = 0; r < RB; r++) {
                const __m512i W = _mm512_load_si512(w[r] + o + 64 * j);
                for (int c = 0; c < CB; c++) ai[r][c] = _mm512_dpbusd_epi32(ai[r][c], W, X[c]);
            }
        }
        for (int r = 0; r < RB; r++) {
            const __m512 D = _mm512_load_ps(w[r] + o + 512);
            for (int c = 0; c < CB; c++) {
                const __m512 DX = _mm512_load_ps(x[c] + o + 512);
                if (ASYM) {
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[r][c]), _mm512_mul_ps(D, DX), acc[r][c]);
                    acc[r][c] = _mm512_fmadd_ps(_mm512_load_ps(w[r] + o + 576), _mm512_load_ps(x[c] + o + 576), acc[r][c]);
                } else {
                    const __m512i T = _mm512_sub_epi32(_mm512_add_epi32(ai[r][c], ai[r][c]), _mm512_load_si512(x[c] + o + 576));
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(T), _mm512_mul_ps(D, DX), acc[r][c]);
                }
            }
        }
    }
    for (int r = 0; r < RB; r++)
        for (int c = 0; c < CB; c++) y[c * ldy + r] = _mm512_reduce_add_ps(acc[r][c]);
}

TQ_INLINE void tq_micro_any(const int ASYM, int rb, int cb, const uint8_t *const *w, const uint8_t *const *x, int64_t nsup,
                            float *y, int64_t ldy) {
#define TQ_MC(R, C)                                                                                                 \
    if (rb == R && cb == C) return tq_micro(ASYM, R, C, w, x, nsup, y, ldy);
    TQ_MC(4, 3) TQ_MC(4, 2) TQ_MC(4, 1) TQ_MC(3, 3) TQ_MC(3, 2) TQ_MC(3, 1) TQ_MC(2, 3) TQ_MC(2, 2) TQ_MC(2, 1) TQ_MC(1, 3) TQ_MC(1, 2) TQ_MC(1, 1)
#undef TQ_MC
}

/* Rows i0 .. i0 + rb - 1 (unpacked at wr) against every column (prepared in xs, sb bytes each),
 * in micro-kernel tiles; the blocks after the last whole super-step (k_tail codes, done_bytes into
 * the row) by the tail dot. */
TQ_INLINE void tq_tiles(const int G, const int ASYM, const tn_tq_plan *Pl, int64_t k_tail, int64_t done_blocks,
                        size_t done_bytes, int rb, const uint8_t *const *wr, int64_t i0, int64_t n, const uint8_t *xs,
                        size_t sb, const void *w, size_t w_rb, const void *x, size_t x_rb, float *y, int64_t ldy) {
    const int64_t nsup = (int64_t)(sb / TQ_SUPB);
    for (int64_t j0 = 0; j0 < n; j0 += TQ_CB) {
        const int cb = (int)(n - j0 < TQ_CB ? n - j0 : TQ_CB);
        const uint8_t *xc[TQ_CB];
        for (int c = 0; c < cb; c++) xc[c] = xs + sb * (size_t)(j0 + c);
        tq_micro_any(ASYM, rb, cb, wr, xc, nsup, y + j0 * ldy + i0, ldy);
        if (k_tail)
            for (int c = 0; c < cb; c++)
                for (int r = 0; r < rb; r++) {
                    float t;
                    Pl->tail(k_tail, &t, (const uint8_t *)w + (size_t)(i0 + r) * w_rb + done_bytes,
                             (const block_q8_0 *)((const uint8_t *)x + (size_t)(j0 + c) * x_rb) + done_blocks * (G / 32));
                    y[(j0 + c) * ldy + i0 + r] += t;
                }
    }
}

TQ_INLINE void tq_gemm(const int B, const int G, const int ASYM, int64_t k, int64_t m, int64_t n, const void *w,
                       size_t w_rb, const void *x, size_t x_rb, float *y, int64_t ldy) {
    const tn_tq_params tp = {B, G, ASYM};
    const tn_tq_plan *Pl = tn_tq_plan_get(TQ_INDEX(B, G, ASYM));
    if (n == 1 && Pl->gemv) { /* decode: the row-streaming kernel */
        tn_tq_gemv_avx512(TQ_INDEX(B, G, ASYM))(k, m, n, w, w_rb, x, x_rb, y, ldy);
        return;
    }
    const int64_t nsup = tn_tq_nsup(k), done_blocks = nsup * (512 / G), k_tail = k - nsup * 512;
    const size_t done_bytes = (size_t)done_blocks * tn_tq_block_bytes(&tp), sb = (size_t)nsup * TQ_SUPB;
    uint8_t *xs = nsup && n > 1 ? aligned_alloc(64, sb * (size_t)n + sb * TQ_RB) : NULL;
    if (!xs) { /* decode without GFNI, nothing whole to decode, or no scratch: the per-block kernel */
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++)
                Pl->tail(k, &y[j * ldy + i], (const uint8_t *)w + (size_t)i * w_rb, (const uint8_t *)x + (size_t)j * x_rb);
        return;
    }
    uint8_t *ws = xs + sb * (size_t)n;
    for (int64_t j = 0; j < n; j++) tq_prep_col(B, ASYM, (const block_q8_0 *)((const uint8_t *)x + (size_t)j * x_rb), nsup, xs + sb * (size_t)j);
    for (int64_t i0 = 0; i0 < m; i0 += TQ_RB) {
        const int rb = (int)(m - i0 < TQ_RB ? m - i0 : TQ_RB);
        const uint8_t *wr[TQ_RB];
        for (int r = 0; r < rb; r++) {
            tq_unpack_row(B, G, ASYM, (const uint8_t *)w + (size_t)(i0 + r) * w_rb, nsup, ws + sb * (size_t)r);
            wr[r] = ws + sb * (size_t)r;
        }
        tq_tiles(G, ASYM, Pl, k_tail, done_blocks, done_bytes, rb, wr, i0, n, xs, sb, w, w_rb, x, x_rb, y, ldy);
    }
    free(xs);
}

#define TQ_PFX tq_gemm_k
#define TQ_BODY tq_gemm
TQ_KERNELS(tn_tq_gemm_avx512)

/* File-layout row -> c16 bytes (quant/repack.h), whole super-steps only: the prefill's unpacking
 * already yields the c16 register order (register r, lane c = codes 4r..4r+3 of chunk c), so each
 * plane's vectors are those registers' fields shifted into place; the headers are copied. The
 * load-time repack (tn_repack_c16) uses this when installed: ~40x its portable loop. */
TQ_INLINE void tq_c16_put(const int B, const int G, const int ASYM, const uint8_t *src, uint8_t *dst, int64_t nsup) {
    const int HS = ASYM ? 4 : 2, NB = 512 / G, BB = HS + G * B / 8, HB = NB * HS;
    const int W[3] = {TQ_W0(B), TQ_W1(B), TQ_W2(B)};
    _Alignas(64) uint8_t u[TQ_SUPB];
    for (int64_t s = 0; s < nsup; s++, src += NB * BB, dst += HB + 64 * B) {
        tq_unpack_row(B, G, ASYM, src, 1, u);
        for (int b = 0; b < NB; b++) memcpy(dst + b * HS, src + b * BB, (size_t)HS);
        uint8_t *o = dst + HB;
        for (int p = 0, sh = 0; p < 3 && W[p]; sh += W[p], p++) {
            const int w = W[p], per = 8 / w;
            const __m512i m = _mm512_set1_epi8((char)((1 << w) - 1));
            for (int v = 0; v < w; v++, o += 64) {
                __m512i acc = _mm512_setzero_si512();
                for (int f = 0; f < per; f++) { /* field f = register v per + f's plane bits */
                    const __m512i R = _mm512_load_si512(u + 64 * (v * per + f));
                    const __m512i x = _mm512_and_si512(_mm512_srli_epi16(R, sh), m); /* < 2^w: no carry across bytes */
                    acc = _mm512_or_si512(acc, _mm512_slli_epi16(x, w * f));
                }
                _mm512_storeu_si512(o, acc);
            }
        }
    }
}
#define TQ_PUT_DEF(b, g, a)                                                                                         \
    static void tq_c16_put_##b##_##g##_##a(const uint8_t *src, uint8_t *dst, int64_t nsup) {                       \
        tq_c16_put(b, g, a, src, dst, nsup);                                                                        \
    }
TN_TQ_LIST(TQ_PUT_DEF)
#undef TQ_PUT_DEF

tn_c16_put_fn tn_tq_c16_put_avx512(int ti) {
#define TQ_PUT_REF(b, g, a) [TQ_INDEX(b, g, a)] = tq_c16_put_##b##_##g##_##a,
    static const tn_c16_put_fn fns[TN_TQ_COUNT] = {TN_TQ_LIST(TQ_PUT_REF)};
#undef TQ_PUT_REF
    return fns[ti];
}

/* ---- *_c16 rows (quant/repack.h): one lane per chunk, as stored ------------------------------
 * A c16 super-step is read as it is: headers (one masked load), then register r is, per plane,
 * its field of one of the plane's vectors moved into the code's bit position (an AND for plane 0's
 * field 0, else one GF2P8AFFINEQB), the planes ORed together. Decode
 * dots the registers with the column prepared as for prefill (tq_prep_col: register r, lane c =
 * codes 4r..4r+3 of chunk c), so the dword lanes are the chunks' exact sums with no folding; prefill
 * stores the registers and per-chunk d, m as its unpacked rows and runs the same micro-kernel. */
/* Registered only when the CPU has GFNI (tq.c): these functions alone are compiled for it, by a
 * target attribute both gcc and clang take (the kernels TQ_KERNELS defines too: TQ_TARGET). */
#define TQ_GFNI TQ_INLINE __attribute__((target("gfni")))
#undef TQ_TARGET
#define TQ_TARGET __attribute__((target("gfni")))

/* Field f (width w) of every byte of V moved to bits sh .. sh + w - 1, the other bits 0: an AND
 * when it is already there, else one GF2P8AFFINEQB (output bit o = parity(row 7 - o & x)). */
TQ_GFNI __m512i tq_c16_field(const int w, const int f, const int sh, __m512i V) {
    if (w == 8) return V;
    if (f == 0 && sh == 0) return _mm512_and_si512(V, _mm512_set1_epi8((char)((1 << w) - 1)));
    uint64_t A = 0;
    for (int i = 0; i < w; i++) A |= (uint64_t)1 << (8 * (7 - (sh + i)) + w * f + i);
    return _mm512_gf2p8affine_epi64_epi8(V, _mm512_set1_epi64((long long)A), 0);
}

/* Register r of the c16 super-step whose planes start at p (after the headers; quant/repack.h):
 * each plane's field of r moved into its bit position, ORed (one VPTERNLOG for three planes). */
TQ_GFNI __m512i tq_c16_codes(const int B, const uint8_t *p, int r) {
    const int W0 = TQ_W0(B), W1 = TQ_W1(B), W2 = TQ_W2(B);
    const __m512i R = tq_c16_field(W0, r % (8 / W0), 0, _mm512_loadu_si512(p + 64 * (r / (8 / W0))));
    if (!W1) return R;
    const __m512i R1 = tq_c16_field(W1, r % (8 / W1), W0, _mm512_loadu_si512(p + 64 * (W0 + r / (8 / W1))));
    if (!W2) return _mm512_or_si512(R, R1);
    const __m512i R2 = tq_c16_field(W2, r % (8 / W2), W0 + W1, _mm512_loadu_si512(p + 64 * (W0 + W1 + r / (8 / W2))));
    return _mm512_ternarylogic_epi64(R, R1, R2, 0xFE); /* R | R1 | R2 */
}

/* d (and m) of every chunk lane from a super-step's headers H (fp16, block order). */
TQ_GFNI void tq_c16_dm(const int G, const int ASYM, __m512i H, __m512 *D, __m512 *M) {
    const int CPB = G / 32;
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i blk = CPB == 1 ? lane : _mm512_srli_epi32(lane, CPB == 2 ? 1 : CPB == 4 ? 2 : 3);
    const __m512 F = _mm512_cvtph_ps(_mm512_castsi512_si256(H));
    if (!ASYM) {
        *D = _mm512_permutexvar_ps(blk, F);
        return;
    }
    const __m512i di = _mm512_add_epi32(blk, blk), mi = _mm512_add_epi32(di, _mm512_set1_epi32(1));
    if (G == 32) { /* 16 blocks: 32 halves */
        const __m512 F2 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(H, 1));
        *D = _mm512_permutex2var_ps(F, di, F2);
        *M = _mm512_permutex2var_ps(F, mi, F2);
    } else {
        *D = _mm512_permutexvar_ps(di, F);
        *M = _mm512_permutexvar_ps(mi, F);
    }
}

/* R (1 or 2) c16 rows, far apart (two streams), over nsup super-steps against a column prepared
 * by tq_prep_col; pf: prefetch distance in bytes (into L2, as tq_gemv.c). */
TQ_GFNI void tq_c16_rows(const int B, const int G, const int ASYM, const int R, const uint8_t *const *rows,
                           const uint8_t *xs, int64_t nsup, size_t pf, float *out) {
    const int HB = 512 / G * (ASYM ? 4 : 2), SUPB = HB + 64 * B;
    const __mmask64 hm = HB >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << HB) - 1;
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t s = 0; s < nsup; s++, xs += TQ_SUPB) {
        __m512i a[2][2];
        for (int r = 0; r < R; r++) {
            for (int c = 0; c < (SUPB + 63) / 64; c++) _mm_prefetch((const char *)rows[r] + (size_t)s * SUPB + pf + 64 * c, _MM_HINT_T2);
            a[r][0] = a[r][1] = _mm512_setzero_si512();
        }
        for (int j = 0; j < 8; j++) {
            const __m512i X = _mm512_load_si512(xs + 64 * j);
            for (int r = 0; r < R; r++)
                a[r][j & 1] = _mm512_dpbusd_epi32(a[r][j & 1], tq_c16_codes(B, rows[r] + (size_t)s * SUPB + HB, j), X);
        }
        const __m512 DX = _mm512_load_ps(xs + 512);
        for (int r = 0; r < R; r++) {
            const __m512i S = _mm512_add_epi32(a[r][0], a[r][1]);
            __m512 D, M;
            tq_c16_dm(G, ASYM, _mm512_maskz_loadu_epi8(hm, rows[r] + (size_t)s * SUPB), &D, &M);
            if (ASYM) {
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_mul_ps(D, DX), acc[r]);
                acc[r] = _mm512_fmadd_ps(M, _mm512_load_ps(xs + 576), acc[r]);
            } else {
                const __m512i T = _mm512_sub_epi32(_mm512_add_epi32(S, S), _mm512_load_si512(xs + 576));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(T), _mm512_mul_ps(D, DX), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
}

/* c16 row -> nsup super-steps of decoded codes and per-chunk d, m (tq_unpack_row's format). */
TQ_GFNI void tq_c16_unpack_row(const int B, const int G, const int ASYM, const uint8_t *row, int64_t nsup, uint8_t *out) {
    const int HB = 512 / G * (ASYM ? 4 : 2), SUPB = HB + 64 * B;
    const __mmask64 hm = HB >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << HB) - 1;
    for (int64_t s = 0; s < nsup; s++, out += TQ_SUPB, row += SUPB) {
        for (int j = 0; j < 8; j++) _mm512_store_si512(out + 64 * j, tq_c16_codes(B, row + HB, j));
        __m512 D, M = _mm512_setzero_ps();
        tq_c16_dm(G, ASYM, _mm512_maskz_loadu_epi8(hm, row), &D, &M);
        _mm512_store_ps(out + 512, D);
        _mm512_store_ps(out + 576, M);
    }
}

/* The c16 tile product: decode (n == 1) streams two rows at a time against the column prepared
 * once (kept per thread like tq_gemv.c's, colcache.h); prefill is tq_gemm's with the c16 row
 * unpacking. The blocks after the last whole super-step are in the file's bytes (the tail dot). */
TQ_GFNI void tq_gemm_c16(const int B, const int G, const int ASYM, int64_t k, int64_t m, int64_t n, const void *w,
                           size_t w_rb, const void *x, size_t x_rb, float *y, int64_t ldy) {
    const tn_tq_params tp = {B, G, ASYM};
    const tn_tq_plan *Pl = tn_tq_plan_get(TQ_INDEX(B, G, ASYM));
    const int64_t nsup = tn_tq_nsup(k), done_blocks = nsup * (512 / G), k_tail = k - nsup * 512;
    const size_t done_bytes = (size_t)done_blocks * tn_tq_block_bytes(&tp), sb = (size_t)nsup * TQ_SUPB;
    const size_t xbytes = (size_t)(k / 32) * sizeof(block_q8_0);
    tn_colcache *C = n == 1 && nsup ? tn_colcache_get(TN_COLCACHE_TQ, xbytes, sb) : NULL;
    const uint64_t key = (uint64_t)k << 16 | (uint64_t)1 << 14 | (uint64_t)B << 10 | (uint64_t)G << 1 | (uint64_t)ASYM;
    const bool have = C && tn_colcache_hit(C, key, x, xbytes);
    uint8_t *xs = C ? C->buf : nsup ? aligned_alloc(64, sb * (size_t)n + sb * TQ_RB) : NULL;
    if (!xs) { /* nothing whole, or no scratch: the reference (rows back in the file's bytes) */
        tn_k_gemm_tq_c16_q8_0__scalar((tn_dtype)(TN_DTYPE_C16_BASE + TQ_INDEX(B, G, ASYM)), k, m, n, w, w_rb, x, x_rb, y, ldy);
        return;
    }
    if (n == 1) {
        if (!have) {
            tq_prep_col(B, ASYM, x, nsup, xs);
            if (C) tn_colcache_set(C, key, x, xbytes);
        }
        const size_t pf = w_rb * ((4096 + w_rb - 1) / w_rb); /* the same place >= 4 KiB ahead in the stream */
        const int64_t h = (m + 1) / 2;
        for (int64_t i = 0; i < h; i++) {
            const int64_t i2 = i + h;
            const uint8_t *rows[2] = {(const uint8_t *)w + (size_t)i * w_rb, (const uint8_t *)w + (size_t)i2 * w_rb};
            const int R = i2 < m ? 2 : 1;
            float r[2];
            if (R == 2) tq_c16_rows(B, G, ASYM, 2, rows, xs, nsup, pf, r);
            else tq_c16_rows(B, G, ASYM, 1, rows, xs, nsup, pf, r);
            for (int t = 0; t < R; t++) {
                if (k_tail) {
                    float tl;
                    Pl->tail(k_tail, &tl, rows[t] + done_bytes, (const block_q8_0 *)x + done_blocks * (G / 32));
                    r[t] += tl;
                }
                y[t ? i2 : i] = r[t];
            }
        }
        if (!C) free(xs);
        return;
    }
    uint8_t *ws = xs + sb * (size_t)n;
    for (int64_t j = 0; j < n; j++) tq_prep_col(B, ASYM, (const block_q8_0 *)((const uint8_t *)x + (size_t)j * x_rb), nsup, xs + sb * (size_t)j);
    for (int64_t i0 = 0; i0 < m; i0 += TQ_RB) {
        const int rb = (int)(m - i0 < TQ_RB ? m - i0 : TQ_RB);
        const uint8_t *wr[TQ_RB];
        for (int r = 0; r < rb; r++) {
            tq_c16_unpack_row(B, G, ASYM, (const uint8_t *)w + (size_t)(i0 + r) * w_rb, nsup, ws + sb * (size_t)r);
            wr[r] = ws + sb * (size_t)r;
        }
        tq_tiles(G, ASYM, Pl, k_tail, done_blocks, done_bytes, rb, wr, i0, n, xs, sb, w, w_rb, x, x_rb, y, ldy);
    }
    free(xs);
}

#undef TQ_PFX
#undef TQ_BODY
#define TQ_PFX tq_gemm_c16_k
#define TQ_BODY tq_gemm_c16
TQ_KERNELS(tn_tq_gemm_c16_avx512)
#undef TQ_TARGET
#define TQ_TARGET
