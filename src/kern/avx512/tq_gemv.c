/*
 * tq_gemv.c (avx512) — decode (n == 1) kernels of tern's any-bit types: y[i] = row i of W · x,
 * for every tq type (b = 1..8, G = 32..256, symmetric / asymmetric), streaming each row once.
 *
 * Register plan in tq_plan.h: per sub-step the row's bytes come in through one or two loads,
 * plane 0 yields J code registers with one GF2P8AFFINEQB each (a bit-matrix moving field j of
 * every byte to the low bits; an AND for j = 0), narrower planes are merged in
 * with VPMULTISHIFTQB + VPTERNLOG, VPDPBUSD sums the registers into one int32 accumulator per
 * sub-step; per super-step (512 codes) the accumulators are folded into one register of 16
 * exact chunk sums, the fp16 block headers converted once, and one FMA applies d_w * d_x (one
 * more the asymmetric offset). Two rows go through together so every activation register
 * loaded serves both — rows i and i + m/2, two separate sequential streams with every line
 * software-prefetched ~4 KiB ahead into L2 (adjacent rows interleaved streamed at half the DRAM rate on
 * Zen 4: 38% vs ~80% of a plain read, one thread). The activation row is rearranged once per
 * call (tn_tq_prep_x). Integer
 * sums per chunk are exact as in the reference; only the order of the float additions differs.
 * Blocks after the last whole super-step go to the slot's vec_dot.
 *
 * Needs AVX512 F/BW/VL/DQ/VNNI/VBMI and GFNI (used by tq_gemm.c's n == 1 path only then).
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "kern/avx512/colcache.h"
#include "kern/avx512/tq_kern.h"
#include "kern/avx512/tq_plan.h"
#include "kern/tq_list.inc"
#include "quant/tq.h"

/* GF2P8AFFINEQB: the whole file is built with -mgfni (CMakeLists.txt) and used only when the CPU
 * has it (tq.c checks). */

#define TQ_STACK 24576 /* activation scratch on the stack up to this size, else the heap */
#define TQ_PF_MIN 4096 /* software prefetch: at least this far ahead in the matrix (bytes) */

/* Per-call constants in registers: permutes and multishift controls of the plan. */
typedef struct {
    __m512i ip, ih, ihp, is1, is2, ms1[8], ms2[8], didx;
} tq_cv;

/* The L sub-step accumulators -> 16 chunk sums (lane order: plan ord, simulated in tq_plan.c). */
TQ_INLINE __m512i tq_fold(const int L, const __m512i *a) {
    if (L == 1) return a[0];
    if (L == 2) {
        const __m512 x = _mm512_castsi512_ps(a[0]), y = _mm512_castsi512_ps(a[1]);
        return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(x, y, 0x88)),
                                _mm512_castps_si512(_mm512_shuffle_ps(x, y, 0xDD)));
    }
    __m512i u[4];
    for (int i = 0; i < L / 2; i++)
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
    const __m512i v0 = _mm512_add_epi32(_mm512_unpacklo_epi64(u[0], u[1]), _mm512_unpackhi_epi64(u[0], u[1]));
    if (L == 4) return v0;
    const __m512i v1 = _mm512_add_epi32(_mm512_unpacklo_epi64(u[2], u[3]), _mm512_unpackhi_epi64(u[2], u[3]));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(v0, v1, 0x88), _mm512_shuffle_i32x4(v0, v1, 0xDD));
}

/* TQ_PAIR sub-steps: 32 bytes at p and at p + bb (the two blocks' plane 0), one per half. */
TQ_INLINE __m512i tq_pair256(const uint8_t *p, int bb) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                              _mm256_loadu_si256((const __m256i *)(p + bb)), 1);
}

/* TQ_PAIR sub-steps: the 8-byte 1-bit plane of each block in every qword of its half. */
TQ_INLINE __m512i tq_pair64(const uint8_t *p, int bb) {
    long long a, b;
    memcpy(&a, p, 8);
    memcpy(&b, p + bb, 8);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi64x(a)), _mm256_set1_epi64x(b), 1);
}

/* The raw plane sources of sub-step q of the super-step at row pointer p (plane 0: P, narrower
 * planes: S1, S2 with each chunk's plane in every qword of its lanes); headers merged into H. */
TQ_INLINE void tq_fetch(const int B, const int G, const int ASYM, const tn_tq_plan *Pl, const tq_cv *cv, int q,
                        const uint8_t *p, __m512i *P, __m512i *S1, __m512i *S2, __m512i *H, __m512i *Akeep) {
    const int W0 = TQ_W0(B), L = W0, NC = 16 / L, NP = TQ_NP(B), CPB = G / 32, BLK = NC <= CPB;
    const int BB = (ASYM ? 4 : 2) + G * B / 8;
    if (!BLK) {
        const int HDRA = TQ_HDR_IN_A(B, G, ASYM);
        const int NBS = NC / CPB, WIN = NBS * BB;
        const uint8_t *wp = p + (size_t)q * WIN;
        const __m512i A = _mm512_maskz_loadu_epi8(Pl->mA, wp);
        const __m512i Bw = WIN > 64 ? _mm512_maskz_loadu_epi8(Pl->mB, wp + 64) : A;
        const int PAIR = TQ_PAIR(B, G); /* NBS == 2 */
        if (PAIR) *P = tq_pair256(wp + Pl->off[0], BB);
        else *P = _mm512_permutex2var_epi8(A, cv->ip, Bw);
        /* only the header bytes: the other halves of H stay 0 (they meet 0 in MXD, never NaN) */
        if (HDRA) *Akeep = A; /* headers of two sub-steps at a time, by tq_headers */
        else if (L == 1) *H = _mm512_maskz_permutex2var_epi8(Pl->hmask[0], A, cv->ih, Bw);
        else *H = _mm512_mask_mov_epi8(*H, Pl->hmask[q], _mm512_permutex2var_epi8(A, cv->ih, Bw));
        if (NP > 1) *S1 = PAIR && TQ_W1(B) == 1 ? tq_pair64(wp + Pl->off[1], BB) : _mm512_permutex2var_epi8(A, cv->is1, Bw);
        if (NP > 2) *S2 = PAIR && TQ_W2(B) == 1 ? tq_pair64(wp + Pl->off[2], BB) : _mm512_permutex2var_epi8(A, cv->is2, Bw);
    } else {
        const int NBS = CPB / NC, b = q / NBS, ss = q % NBS;
        const uint8_t *bp = p + (size_t)b * BB;
        if (ss == 0) {
            if (ASYM) {
                int32_t dm;
                memcpy(&dm, bp, 4);
                *H = _mm512_mask_set1_epi32(*H, (__mmask16)(1u << b), dm);
            } else {
                int16_t d;
                memcpy(&d, bp, 2);
                *H = _mm512_mask_set1_epi16(*H, (__mmask32)(1u << b), d);
            }
        }
        *P = _mm512_loadu_si512(bp + Pl->off[0] + ss * 64);
        if (NP > 1)
            *S1 = _mm512_permutexvar_epi8(cv->is1, _mm512_maskz_loadu_epi8(Pl->ml[1], bp + Pl->off[1] + ss * NC * 4 * TQ_W1(B)));
        if (NP > 2)
            *S2 = _mm512_permutexvar_epi8(cv->is2, _mm512_maskz_loadu_epi8(Pl->ml[2], bp + Pl->off[2] + ss * NC * 4 * TQ_W2(B)));
    }
}

/* H from the first 64 bytes of the L windows when every header lies there (TQ_HDR_IN_A): one
 * permute per two sub-steps instead of one per sub-step. */
TQ_INLINE __m512i tq_headers(const int L, const tn_tq_plan *Pl, const tq_cv *cv, const __m512i *A) {
    __m512i H = _mm512_maskz_permutex2var_epi8(Pl->hpair[0], A[0], cv->ihp, A[1]);
    for (int k = 1; k < L / 2; k++) H = _mm512_mask_mov_epi8(H, Pl->hpair[k], _mm512_permutex2var_epi8(A[2 * k], cv->ihp, A[2 * k + 1]));
    return H;
}

/* Code register j of a sub-step from its plane sources. */
TQ_INLINE __m512i tq_codes(const int B, const tq_cv *cv, int j, __m512i P, __m512i S1, __m512i S2) {
    const int W0 = TQ_W0(B), NP = TQ_NP(B);
    const __m512i m0 = _mm512_set1_epi8((char)((1 << W0) - 1));
    /* field j of every byte: an AND for j == 0, else one GF2P8AFFINEQB whose matrix moves bits
     * W0 j .. W0 j + W0 - 1 to 0 .. W0 - 1 (output bit i = parity(row 7 - i & x)) */
    __m512i R;
    if (W0 == 8) R = P;
    else if (j == 0) R = _mm512_and_si512(P, m0);
    else {
        uint64_t A = 0;
        for (int i = 0; i < W0; i++) A |= (uint64_t)1 << (8 * (7 - i) + W0 * j + i);
        R = _mm512_gf2p8affine_epi64_epi8(P, _mm512_set1_epi64((long long)A), 0);
    }
    if (NP > 1) {
        const __m512i fm1 = _mm512_set1_epi8((char)(((1 << TQ_W1(B)) - 1) << W0));
        R = _mm512_ternarylogic_epi32(R, _mm512_multishift_epi64_epi8(cv->ms1[j], S1), fm1, 0xF8); /* R | (ms & fm) */
    }
    if (NP > 2) {
        const __m512i fm2 = _mm512_set1_epi8((char)(((1 << TQ_W2(B)) - 1) << (W0 + TQ_W1(B))));
        R = _mm512_ternarylogic_epi32(R, _mm512_multishift_epi64_epi8(cv->ms2[j], S2), fm2, 0xF8);
    }
    return R;
}

/* Float part of a super-step for one row: acc += cvt(S) * (d_w * d_x) [+ m_w * MXD]. */
TQ_INLINE void tq_scale(const int G, const int ASYM, const tq_cv *cv, const uint8_t *xs, __m512i S, __m512i H,
                        __m512 *accD, __m512 *accM) {
    const __m512 F = _mm512_cvtph_ps(_mm512_castsi512_si256(H));
    const __m512 DX = _mm512_load_ps(xs + 512);
    if (ASYM) {
        __m512 D;
        if (G == 32) {
            const __m512 F2 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(H, 1));
            D = _mm512_permutex2var_ps(F, cv->didx, F2);
            *accM = _mm512_fmadd_ps(F2, _mm512_load_ps(xs + 640), *accM);
        } else {
            D = _mm512_permutexvar_ps(cv->didx, F);
        }
        *accD = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_mul_ps(D, DX), *accD);
        *accM = _mm512_fmadd_ps(F, _mm512_load_ps(xs + 576), *accM);
    } else {
        const __m512 D = _mm512_permutexvar_ps(cv->didx, F);
        const __m512i T = _mm512_sub_epi32(_mm512_add_epi32(S, S), _mm512_load_si512(xs + 576));
        *accD = _mm512_fmadd_ps(_mm512_cvtepi32_ps(T), _mm512_mul_ps(D, DX), *accD);
    }
}

/* R (1 or 2) rows over nsup super-steps: out[r] = dot of row r's whole super-steps with x. The
 * rows are far apart (two streams); pf: prefetch distance in bytes. */
TQ_INLINE void tq_rows(const int B, const int G, const int ASYM, const int R, const tn_tq_plan *Pl, const tq_cv *cv,
                       const uint8_t *const *rows, const uint8_t *xs, int64_t nsup, size_t pf, float *out) {
    const int W0 = TQ_W0(B), L = W0, J = 8 / L, NP = TQ_NP(B);
    const int BB = (ASYM ? 4 : 2) + G * B / 8, SUPB = 512 / G * BB;
    const size_t XS = (size_t)(9 + (ASYM && G == 32 ? 2 : 1)) * 64;
    __m512 accD[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}, accM[2] = {accD[0], accD[0]};
    for (int64_t s = 0; s < nsup; s++, xs += XS) {
        /* every line of this super-step's bytes pf ahead (the same place in a later row of the
         * same stream) into L2 (prefetcht2): far enough to cover the memory latency at decode's
         * instruction mix. Paired A/B on the tq4 / tq5 1B models: 4 KiB + prefetcht2 +1 to +15%
         * t/s over 2 KiB + prefetcht0 (most at high bandwidth); 2, 6, 8 KiB or prefetcht1 no better */
        for (int r = 0; r < R; r++)
            for (int c = 0; c < (SUPB + 63) / 64; c++) _mm_prefetch((const char *)rows[r] + (size_t)s * SUPB + pf + 64 * c, _MM_HINT_T2);
        __m512i acc[2][8], H[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()}, Ak[2][8];
        for (int q = 0; q < L; q++) {
            __m512i P[2], S1[2] = {H[0], H[0]}, S2[2] = {H[0], H[0]};
            for (int r = 0; r < R; r++)
                tq_fetch(B, G, ASYM, Pl, cv, q, rows[r] + (size_t)s * SUPB, &P[r], &S1[r], &S2[r], &H[r], &Ak[r][q]);
            /* NA independent dpbusd chains per row (latency ~4 cycles each) */
            const int NA = J >= 2 ? 2 : 1;
            __m512i a[2][4];
            for (int r = 0; r < R; r++)
                for (int t = 0; t < NA; t++) a[r][t] = _mm512_setzero_si512();
            for (int j = 0; j < J; j++) {
                const __m512i X = _mm512_load_si512(xs + (size_t)(q * J + j) * 64);
                for (int r = 0; r < R; r++) a[r][j % NA] = _mm512_dpbusd_epi32(a[r][j % NA], tq_codes(B, cv, j, P[r], S1[r], S2[r]), X);
            }
            for (int r = 0; r < R; r++) {
                __m512i t = a[r][0];
                for (int u = 1; u < NA; u++) t = _mm512_add_epi32(t, a[r][u]);
                acc[r][q] = t;
            }
        }
        (void)NP;
        if (TQ_HDR_IN_A(B, G, ASYM))
            for (int r = 0; r < R; r++) H[r] = tq_headers(L, Pl, cv, Ak[r]);
        for (int r = 0; r < R; r++) tq_scale(G, ASYM, cv, xs, tq_fold(L, acc[r]), H[r], &accD[r], &accM[r]);
    }
    for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(ASYM ? _mm512_add_ps(accD[r], accM[r]) : accD[r]);
}

TQ_INLINE void tq_gemv(const int B, const int G, const int ASYM, int64_t k, int64_t m, int64_t n, const void *w,
                       size_t w_rb, const void *x, size_t x_rb, float *y, int64_t ldy) {
    const tn_tq_params tp = {B, G, ASYM};
    const tn_tq_plan *Pl = tn_tq_plan_get((int)(tn_tq_dtype(&tp) - TN_DTYPE_TERN_BASE));
    const int J = 8 / TQ_W0(B), NP = TQ_NP(B);
    const int64_t nsup = tn_tq_nsup(k), done_blocks = nsup * (512 / G);
    const size_t done_bytes = (size_t)done_blocks * (size_t)Pl->bb;
    const int64_t k_tail = k - nsup * 512;
    _Alignas(64) uint8_t stackbuf[TQ_STACK];
    const size_t need = (size_t)nsup * tn_tq_xsup_bytes(Pl);
    /* one column: this thread's last prepared column is reused when the type, k and the column's
     * bytes match (colcache.h: the tail chunks of a one-token matmul, gate and up, bring the same
     * column again) */
    const size_t xbytes = (size_t)(k / 32) * sizeof(block_q8_0);
    tn_colcache *C = n == 1 ? tn_colcache_get(TN_COLCACHE_TQ, xbytes, need) : NULL;
    const uint64_t key = (uint64_t)k << 16 | (uint64_t)B << 10 | (uint64_t)G << 1 | (uint64_t)ASYM;
    const bool have = C && tn_colcache_hit(C, key, x, xbytes);
    uint8_t *xs = C ? C->buf : need <= TQ_STACK ? stackbuf : aligned_alloc(64, (need + 63) & ~(size_t)63);
    if (!xs) { /* no scratch: the per-block kernel */
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++)
                Pl->tail(k, &y[j * ldy + i], (const uint8_t *)w + (size_t)i * w_rb, (const uint8_t *)x + (size_t)j * x_rb);
        return;
    }
    tq_cv cv;
    cv.ip = _mm512_loadu_si512(Pl->ip);
    cv.ih = _mm512_loadu_si512(Pl->ih);
    cv.ihp = _mm512_loadu_si512(Pl->ihp);
    cv.is1 = _mm512_loadu_si512(Pl->is[1]);
    cv.is2 = _mm512_loadu_si512(Pl->is[2]);
    cv.didx = _mm512_loadu_si512(Pl->didx);
    /* TQ_PAIR sub-steps broadcast each block's whole 8-byte 1-bit plane (tq_pair64): the bits of
     * the block's second chunk (lanes 4..7 and 12..15 of the sub-step) sit 32 bits further in */
    const __m512i half = _mm512_setr_epi32(0, 0, 0, 0, 0x20202020, 0x20202020, 0x20202020, 0x20202020, 0, 0, 0, 0,
                                           0x20202020, 0x20202020, 0x20202020, 0x20202020);
    const __m512i m63 = _mm512_set1_epi8(63);
    const int PAIR = TQ_PAIR(B, G);
    for (int j = 0; j < J; j++) {
        if (NP > 1) cv.ms1[j] = _mm512_loadu_si512(Pl->ms[1][j]);
        if (NP > 2) cv.ms2[j] = _mm512_loadu_si512(Pl->ms[2][j]);
        if (NP > 1 && PAIR && TQ_W1(B) == 1) cv.ms1[j] = _mm512_and_si512(_mm512_add_epi8(cv.ms1[j], half), m63);
        if (NP > 2 && PAIR && TQ_W2(B) == 1) cv.ms2[j] = _mm512_and_si512(_mm512_add_epi8(cv.ms2[j], half), m63);
    }
    const size_t pf = w_rb * ((TQ_PF_MIN + w_rb - 1) / w_rb);
    const int64_t h = (m + 1) / 2;
    for (int64_t j = 0; j < n; j++) {
        const uint8_t *xj = (const uint8_t *)x + (size_t)j * x_rb;
        if (!have) {
            tn_tq_prep_x(Pl, xj, k, xs);
            if (C) tn_colcache_set(C, key, xj, xbytes);
        }
        for (int64_t i = 0; i < h; i++) {
            const int64_t i2 = i + h;
            const uint8_t *rows[2] = {(const uint8_t *)w + (size_t)i * w_rb, (const uint8_t *)w + (size_t)i2 * w_rb};
            const int R = i2 < m ? 2 : 1;
            float r[2];
            if (R == 2) tq_rows(B, G, ASYM, 2, Pl, &cv, rows, xs, nsup, pf, r);
            else tq_rows(B, G, ASYM, 1, Pl, &cv, rows, xs, nsup, pf, r);
            for (int t = 0; t < R; t++) {
                if (k_tail) {
                    float tl;
                    Pl->tail(k_tail, &tl, rows[t] + done_bytes, (const block_q8_0 *)xj + done_blocks * (G / 32));
                    r[t] += tl;
                }
                y[j * ldy + (t ? i2 : i)] = r[t];
            }
        }
    }
    if (!C && xs != stackbuf) free(xs);
}

#define TQ_PFX tq_gemv_k
#define TQ_BODY tq_gemv
TQ_KERNELS(tn_tq_gemv_avx512)
