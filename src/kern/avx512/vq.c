/*
 * vq.c (avx512) — fused decode + dot product of tern's codebook type vq2 (quant/vq.h) against
 * q8_K activations, with the codebook in registers: no gathers, no dequantized row in memory.
 *
 * The codebook's 4 position tables (256 int8 each) sit in 16 zmm registers, +128 so they are
 * VPDPBUSD's unsigned operand. For a block, the 64 index bytes look up table p with two VPERMI2B
 * (entries 0..127 and 128..255; bit 6 picks the register of a pair) and a byte blend on bit 7:
 * 64 weights per 3 instructions, and they land where activation bytes 64 p .. 64 p + 63 are (the
 * format's vector layout), so VPDPBUSD multiplies them directly. A sign-symmetric codebook (entry
 * 128 + k = -entry k: what tern quantize fits; checked when the tables are loaded) needs only the
 * lower half: one VPERMI2B and a masked byte negation on bit 7, 64 weights per 2 instructions.
 * The +128 is taken back with the activations' per-lane sums (VPDPBUSD against ones; the gemm
 * computes them once per activation column for all rows): dword lane l holds vectors 4l .. 4l+3,
 * so lanes 2g, 2g + 1 are scale group g, and one variable shift and a VPERMPS table lookup turn
 * the 4-bit scales into float multipliers. The gemm looks each block up once per row and
 * multiplies it by up to 4 activation columns.
 * Integer sums are exact; the float accumulation order differs from the scalar reference
 * (parity-tested within rounding, tests/quantize/test_vq.c).
 */
#include <immintrin.h>
#include <string.h>

#include "core/cpu.h"
#include "kern/kern.h"
#include "quant/blocks.h"
#include "quant/vq.h"

typedef struct vq_tab {
    __m512i t[TN_VQ_DIM][4]; /* table p, entries 64q .. 64q + 63, + 128 */
    bool sym;                /* entry 128 + k = -entry k for every k and p (what tern quantize fits) */
} vq_tab;

/* A sign-symmetric codebook's upper half is its lower half negated, and so are their +128 forms:
 * (-c) + 128 = -(c + 128) mod 256. Then one VPERMI2B (entries 0..127) and a masked byte negation
 * on the index's bit 7 replace two VPERMI2B and a blend; the check is on the +128 bytes, so it
 * holds exactly when that negation gives the upper entry's byte. */
static inline void vq_tab_load(vq_tab *T, const int8_t *cb) {
    const __m512i bias = _mm512_set1_epi8((char)0x80), z = _mm512_setzero_si512();
    __mmask64 diff = 0;
    for (int p = 0; p < TN_VQ_DIM; p++) {
        for (int q = 0; q < 4; q++) T->t[p][q] = _mm512_xor_si512(_mm512_loadu_si512(cb + p * TN_VQ_K + 64 * q), bias);
        for (int q = 0; q < 2; q++) diff |= _mm512_cmpneq_epi8_mask(T->t[p][q + 2], _mm512_sub_epi8(z, T->t[p][q]));
    }
    T->sym = diff == 0;
}

/* Table p's 64 weights + 128 of the indices idx (top: their bit 7), for a general or a
 * sign-symmetric codebook. */
static inline __attribute__((always_inline)) __m512i vq_look(const vq_tab *T, int p, __m512i idx, __mmask64 top, bool sym) {
    const __m512i lo = _mm512_permutex2var_epi8(T->t[p][0], idx, T->t[p][1]);
    if (sym) return _mm512_mask_sub_epi8(lo, top, _mm512_setzero_si512(), lo);
    return _mm512_mask_blend_epi8(top, lo, _mm512_permutex2var_epi8(T->t[p][2], idx, T->t[p][3]));
}

/* The block's weights + 128: W[p] byte j = cb[p][qs[j]] + 128 (weight 64 p + j). */
static inline void vq_lookup(const vq_tab *T, const block_vq2 *b, __m512i W[TN_VQ_DIM]) {
    const __m512i idx = _mm512_loadu_si512(b->qs);
    const __mmask64 top = _mm512_movepi8_mask(idx);
    if (T->sym)
        for (int p = 0; p < TN_VQ_DIM; p++) W[p] = vq_look(T, p, idx, top, true);
    else
        for (int p = 0; p < TN_VQ_DIM; p++) W[p] = vq_look(T, p, idx, top, false);
}

/* Per-lane scales of a block: lane l (scale group g = l / 2) gets fp16(d) * tab[s_g], the 4-bit
 * scales shifted into place and looked up in tab (VPERMPS reads an index's low 4 bits; no integer
 * multiply). tab = vq_odd(): d (2 s_g + 1); vq_odd() times an activation scale: that times it. */
static inline __m512 vq_odd(void) { return _mm512_setr_ps(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31); }
static inline __m512 vq_lane_scales(const block_vq2 *b, __m512 tab) {
    uint32_t sc;
    memcpy(&sc, b->sc, sizeof sc);
    const __m512i sh = _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0);
    const __m512 s = _mm512_permutexvar_ps(_mm512_srlv_epi32(_mm512_set1_epi32((int)sc), sh), tab);
    return _mm512_mul_ps(s, _mm512_cvtph_ps(_mm256_set1_epi16((short)b->d)));
}

/* 128 * (sum of the activations each dword lane of VPDPBUSD covers): what the +128 of the
 * looked-up weights adds to a lane, the same for every weight row. */
static inline __m512i vq_bias(const block_q8_K *y) {
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i sx = _mm512_setzero_si512();
    for (int p = 0; p < TN_VQ_DIM; p++) sx = _mm512_dpbusd_epi32(sx, ones, _mm512_loadu_si512(y->qs + 64 * p));
    return _mm512_slli_epi32(sx, 7);
}

/* acc += sd * xd * ((W - 128) . X) per lane; sd = vq_lane_scales(b, vq_odd()), bias = vq_bias(y). */
static inline __m512 vq_fma(const __m512i W[TN_VQ_DIM], __m512 sd, const block_q8_K *y, __m512i bias, __m512 acc) {
    __m512i dot = _mm512_setzero_si512();
    for (int p = 0; p < TN_VQ_DIM; p++) dot = _mm512_dpbusd_epi32(dot, W[p], _mm512_loadu_si512(y->qs + 64 * p));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dot, bias)), _mm512_mul_ps(sd, _mm512_set1_ps(y->d)), acc);
}

static void tn_k_vec_dot_vq2_q8_K__avx512(int64_t k, float *s, const void *w, const void *x) {
    vq_tab T;
    vq_tab_load(&T, tn_vq_codebook(w));
    const block_vq2 *b = (const block_vq2 *)((const uint8_t *)w + TN_VQ_HDR);
    const block_q8_K *y = x;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < k / TN_VQ_QK; i++) {
        __m512i W[TN_VQ_DIM];
        vq_lookup(&T, &b[i], W);
        acc = vq_fma(W, vq_lane_scales(&b[i], vq_odd()), &y[i], vq_bias(&y[i]), acc);
    }
    *s = _mm512_reduce_add_ps(acc);
}

/* One activation column (decode): two rows at a time, each component's lookup going straight into
 * its VPDPBUSD (two accumulators, the first started at -bias), so the two rows' dependent chains
 * interleave and few looked-up registers live next to the 16 tables; the activation loads and
 * the bias are shared. (+7% on Zen 4, cache-resident; the kernel stays bound by the shuffle and
 * integer pipes: 8 VPERMI2B (4 with a sign-symmetric codebook) and 4 VPDPBUSD per block.)
 * Returns (W - 128) . X per lane, unscaled: vq_acc scales it in float (a table lookup instead of
 * an integer multiply on the same pipes). */
static inline __attribute__((always_inline)) __m512i vq_dot_row(const vq_tab *T, const block_vq2 *b, const block_q8_K *y,
                                                                  __m512i nbias, bool sym) {
    const __m512i idx = _mm512_loadu_si512(b->qs);
    const __mmask64 top = _mm512_movepi8_mask(idx);
    __m512i d0 = nbias, d1 = _mm512_setzero_si512();
    for (int p = 0; p < TN_VQ_DIM; p++) {
        const __m512i w = vq_look(T, p, idx, top, sym);
        if (p & 1) d1 = _mm512_dpbusd_epi32(d1, w, _mm512_loadu_si512(y->qs + 64 * p));
        else d0 = _mm512_dpbusd_epi32(d0, w, _mm512_loadu_si512(y->qs + 64 * p));
    }
    return _mm512_add_epi32(d0, d1);
}

/* Software prefetch for decode: both lines a block touches, in each of the two row streams, at the
 * same place VQ_PF_MIN or more bytes (whole rows) ahead, into L2 (prefetcht2), as tq_gemv.c does.
 * The two rows a pass reads are far apart (i and i + m/2): adjacent rows interleaved stream at
 * half the DRAM rate on Zen 4. 1B-class vq2 decode, 2 threads, AMD EPYC Zen 4, 2026-12-06: rows i,
 * i + 1 with prefetcht0 4 KiB ahead 19-21 GB/s of weights whatever the distance (1-8 KiB, t0 or
 * t1) and the DRAM bandwidth; far rows: see docs/performance.md. */
#define VQ_PF_MIN 4096
static inline void vq_prefetch(const uint8_t *p) {
    _mm_prefetch((const char *)p, _MM_HINT_T2);
    _mm_prefetch((const char *)p + sizeof(block_vq2) - 1, _MM_HINT_T2);
}

/* What decode needs of an activation block for every row: -128 x its lane sums (vq_bias) and the
 * odd scale multipliers 1, 3, .. 31 times its scale, for vq_lane_scales' lookup. */
typedef struct vq_col {
    __m512i nbias;
    __m512 ysc;
} vq_col;

static inline vq_col vq_col_of(const block_q8_K *y) {
    return (vq_col){_mm512_sub_epi32(_mm512_setzero_si512(), vq_bias(y)), _mm512_mul_ps(vq_odd(), _mm512_set1_ps(y->d))};
}

/* acc += (d x per-lane scale x activation scale) x dot for one row's block. */
static inline __m512 vq_acc(const block_vq2 *b, __m512i dot, __m512 ysc, __m512 acc) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), vq_lane_scales(b, ysc), acc);
}

/* Rows r0 (and r1, when not NULL) of nb blocks against one activation column (col: its vq_col
 * per block, or NULL to make them here). */
static inline __attribute__((always_inline)) void vq_gemv_rows(const vq_tab *T, const block_vq2 *b0, const block_vq2 *b1,
                                                               int64_t nb, const block_q8_K *y, const vq_col *col, size_t pf,
                                                               float *out0, float *out1, bool sym) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (int64_t bi = 0; bi < nb; bi++) {
        vq_prefetch((const uint8_t *)&b0[bi] + pf);
        if (b1) vq_prefetch((const uint8_t *)&b1[bi] + pf);
        const vq_col c = col ? col[bi] : vq_col_of(&y[bi]);
        a0 = vq_acc(&b0[bi], vq_dot_row(T, &b0[bi], &y[bi], c.nbias, sym), c.ysc, a0);
        if (b1) a1 = vq_acc(&b1[bi], vq_dot_row(T, &b1[bi], &y[bi], c.nbias, sym), c.ysc, a1);
    }
    *out0 = _mm512_reduce_add_ps(a0);
    if (b1) *out1 = _mm512_reduce_add_ps(a1);
}

/* vq_gemv_rows with its sym and one-row variants chosen at run time. */
static void vq_gemv_any(const vq_tab *T, const block_vq2 *b0, const block_vq2 *b1, int64_t nb, const block_q8_K *y,
                        const vq_col *col, size_t pf, float *out0, float *out1) {
    if (T->sym && b1) vq_gemv_rows(T, b0, b1, nb, y, col, pf, out0, out1, true);
    else if (T->sym) vq_gemv_rows(T, b0, NULL, nb, y, col, pf, out0, out1, true);
    else if (b1) vq_gemv_rows(T, b0, b1, nb, y, col, pf, out0, out1, false);
    else vq_gemv_rows(T, b0, NULL, nb, y, col, pf, out0, out1, false);
}

/* Decode: rows i and i + h (h = ceil(m / 2)) together, two sequential streams sharing the
 * activation loads (one row at a time when the other is past the end or in another tensor). */
static void vq_gemv(vq_tab *T, const int8_t **loaded, const uint8_t *w, size_t w_rb, int64_t m, int64_t nb,
                    const block_q8_K *y, const vq_col *col, float *out) {
    const size_t pf = w_rb * ((VQ_PF_MIN + w_rb - 1) / w_rb);
    const int64_t h = (m + 1) / 2;
    for (int64_t i = 0; i < h; i++) {
        const uint8_t *r[2] = {w + (size_t)i * w_rb, w + (size_t)(i + h) * w_rb};
        const int nr = i + h < m ? 2 : 1;
        const bool pair = nr == 2 && tn_vq_codebook(r[0]) == tn_vq_codebook(r[1]);
        for (int k = 0; k < nr; k += pair ? 2 : 1) {
            const int8_t *cb = tn_vq_codebook(r[k]);
            if (cb != *loaded) vq_tab_load(T, *loaded = cb); /* rows of one tensor share it */
            const block_vq2 *b0 = (const block_vq2 *)(r[k] + TN_VQ_HDR);
            const block_vq2 *b1 = pair ? (const block_vq2 *)(r[1] + TN_VQ_HDR) : NULL;
            vq_gemv_any(T, b0, b1, nb, y, col, pf, out + i + k * h, out + i + h);
        }
    }
}

#define VQ_NCOL 4
#define VQ_BIAS_MAX 128 /* blocks whose activation biases the gemm keeps per column (k <= 32768; 32 KiB) */

static void tn_k_gemm_vq2_q8_K__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,
                                        size_t x_rb, float *y, int64_t ldy) {
    if (m <= 0) return;
    vq_tab T;
    const int8_t *loaded = tn_vq_codebook(w);
    vq_tab_load(&T, loaded);
    const int64_t nb = k / TN_VQ_QK;
    for (int64_t j0 = 0; j0 < n; j0 += VQ_NCOL) {
        const int nc = n - j0 < VQ_NCOL ? (int)(n - j0) : VQ_NCOL;
        const block_q8_K *yc[VQ_NCOL];
        for (int c = 0; c < nc; c++) yc[c] = (const block_q8_K *)((const uint8_t *)x + (size_t)(j0 + c) * x_rb);
        /* the columns' biases once for all rows (when they fit; else per block) */
        const bool keep = nb <= VQ_BIAS_MAX;
        __m512i bias[VQ_NCOL * VQ_BIAS_MAX];
        for (int c = 0; keep && nc > 1 && c < nc; c++)
            for (int64_t bi = 0; bi < nb; bi++) bias[c * nb + bi] = vq_bias(&yc[c][bi]);
        if (nc == 1) {
            vq_col col[VQ_BIAS_MAX];
            for (int64_t bi = 0; keep && bi < nb; bi++) col[bi] = vq_col_of(&yc[0][bi]);
            vq_gemv(&T, &loaded, (const uint8_t *)w, w_rb, m, nb, yc[0], keep ? col : NULL, y + j0 * ldy);
            continue;
        }
        for (int64_t i = 0; i < m; i++) {
            const uint8_t *row = (const uint8_t *)w + (size_t)i * w_rb;
            const int8_t *cb = tn_vq_codebook(row);
            if (cb != loaded) vq_tab_load(&T, loaded = cb); /* rows of one tensor share it */
            const block_vq2 *b = (const block_vq2 *)(row + TN_VQ_HDR);
            __m512 acc[VQ_NCOL];
            for (int c = 0; c < VQ_NCOL; c++) acc[c] = _mm512_setzero_ps();
            for (int64_t bi = 0; bi < nb; bi++) {
                __m512i W[TN_VQ_DIM];
                vq_lookup(&T, &b[bi], W);
                const __m512 sd = vq_lane_scales(&b[bi], vq_odd());
                for (int c = 0; c < nc; c++)
                    acc[c] = vq_fma(W, sd, &yc[c][bi], keep ? bias[c * nb + bi] : vq_bias(&yc[c][bi]), acc[c]);
            }
            for (int c = 0; c < nc; c++) y[(j0 + c) * ldy + i] = _mm512_reduce_add_ps(acc[c]);
        }
    }
}

void tn_kern_register_vq_avx512(tn_kern_table *t) {
    const tn_cpu *c = tn_cpu_get();
    if (!c->avx512vnni || !c->avx512vbmi) return;
    tn_kern_slot *s = &t->slot[TN_VQ2];
    s->vec_dot = tn_k_vec_dot_vq2_q8_K__avx512;
    s->gemm = tn_k_gemm_vq2_q8_K__avx512;
    s->vec_dot_isa = s->gemm_isa = TN_ISA_AVX512;
}
