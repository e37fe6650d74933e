/*
 * vq.c (avx512) — fused decode + dot product of tern's codebook type vq2 (quant/vq.h) against
 * q8_K activations, with the codebook in registers: no gathers, no dequantized row in memory.
 *
 * The codebook's 4 position tables (256 int8 each) sit in 16 zmm registers, +128 so they are
 * VPDPBUSD's unsigned operand. For a block, the 64 index bytes look up table p with two VPERMI2B
 * (entries 0..127 and 128..255; bit 6 picks the register of a pair) and a byte blend on bit 7:
 * 64 weights per 3 instructions, and they land where activation bytes 64 p .. 64 p + 63 are (the
 * format's vector layout), so VPDPBUSD multiplies them directly. The +128 is taken back with the
 * activations' per-lane sums (VPDPBUSD against ones; the gemm computes them once per activation
 * column for all rows): dword lane l holds vectors 4l .. 4l+3, so lanes 2g, 2g + 1 are scale
 * group g, and one variable shift spreads the 4-bit scales. The gemm looks each block up once
 * per row and multiplies it by up to 4 activation columns.
 * Integer sums are exact; the float accumulation order differs from the scalar reference
 * (parity-tested within rounding, tests/kern/test_vq_kern.c).
 */
#include <immintrin.h>
#include <string.h>

#include "core/cpu.h"
#include "kern/kern.h"
#include "quant/blocks.h"
#include "quant/vq.h"

typedef struct vq_tab {
    __m512i t[TN_VQ_DIM][4]; /* table p, entries 64q .. 64q + 63, + 128 */
} vq_tab;

static inline void vq_tab_load(vq_tab *T, const int8_t *cb) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int p = 0; p < TN_VQ_DIM; p++)
        for (int q = 0; q < 4; q++) T->t[p][q] = _mm512_xor_si512(_mm512_loadu_si512(cb + p * TN_VQ_K + 64 * q), bias);
}

/* The block's weights + 128: W[p] byte j = cb[p][qs[j]] + 128 (weight 64 p + j). */
static inline void vq_lookup(const vq_tab *T, const block_vq2 *b, __m512i W[TN_VQ_DIM]) {
    const __m512i idx = _mm512_loadu_si512(b->qs);
    const __mmask64 top = _mm512_movepi8_mask(idx);
    for (int p = 0; p < TN_VQ_DIM; p++) {
        const __m512i lo = _mm512_permutex2var_epi8(T->t[p][0], idx, T->t[p][1]);
        const __m512i hi = _mm512_permutex2var_epi8(T->t[p][2], idx, T->t[p][3]);
        W[p] = _mm512_mask_blend_epi8(top, lo, hi);
    }
}

/* Per-lane scale multipliers 2 s + 1 of the block (lane l: group l / 2). */
static inline __m512i vq_scales(const block_vq2 *b) {
    uint32_t sc;
    memcpy(&sc, b->sc, sizeof sc);
    const __m512i sh = _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0);
    const __m512i s = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)sc), sh), _mm512_set1_epi32(15));
    return _mm512_add_epi32(_mm512_add_epi32(s, s), _mm512_set1_epi32(1));
}

/* 128 * (sum of the activations each dword lane of VPDPBUSD covers): what the +128 of the
 * looked-up weights adds to a lane, the same for every weight row. */
static inline __m512i vq_bias(const block_q8_K *y) {
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i sx = _mm512_setzero_si512();
    for (int p = 0; p < TN_VQ_DIM; p++) sx = _mm512_dpbusd_epi32(sx, ones, _mm512_loadu_si512(y->qs + 64 * p));
    return _mm512_slli_epi32(sx, 7);
}

/* acc += d * xd * (scales * ((W - 128) . X)) per lane; bias = vq_bias(y). */
static inline __m512 vq_fma(const __m512i W[TN_VQ_DIM], __m512i sv, float d, const block_q8_K *y, __m512i bias, __m512 acc) {
    __m512i dot = _mm512_setzero_si512();
    for (int p = 0; p < TN_VQ_DIM; p++) dot = _mm512_dpbusd_epi32(dot, W[p], _mm512_loadu_si512(y->qs + 64 * p));
    dot = _mm512_mullo_epi32(_mm512_sub_epi32(dot, bias), sv);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(d * y->d), acc);
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
        acc = vq_fma(W, vq_scales(&b[i]), _cvtsh_ss(b[i].d), &y[i], vq_bias(&y[i]), acc);
    }
    *s = _mm512_reduce_add_ps(acc);
}

/* One activation column (decode): two rows at a time, each component's lookup going straight into
 * its VPDPBUSD (two accumulators, the first started at -bias), so the two rows' dependent chains
 * interleave and few looked-up registers live next to the 16 tables; the activation loads and
 * the bias are shared. (+7% on Zen 4, cache-resident; the kernel stays bound by the shuffle and
 * integer-multiply pipes: 8 VPERMI2B and 4 VPDPBUSD per block.) Returns scales x (W . X) per lane. */
static inline __m512i vq_dot_row(const vq_tab *T, const block_vq2 *b, const block_q8_K *y, __m512i nbias) {
    const __m512i idx = _mm512_loadu_si512(b->qs);
    const __mmask64 top = _mm512_movepi8_mask(idx);
    __m512i d0 = nbias, d1 = _mm512_setzero_si512();
    for (int p = 0; p < TN_VQ_DIM; p++) {
        const __m512i lo = _mm512_permutex2var_epi8(T->t[p][0], idx, T->t[p][1]);
        const __m512i hi = _mm512_permutex2var_epi8(T->t[p][2], idx, T->t[p][3]);
        const __m512i w = _mm512_mask_blend_epi8(top, lo, hi);
        if (p & 1) d1 = _mm512_dpbusd_epi32(d1, w, _mm512_loadu_si512(y->qs + 64 * p));
        else d0 = _mm512_dpbusd_epi32(d0, w, _mm512_loadu_si512(y->qs + 64 * p));
    }
    return _mm512_mullo_epi32(_mm512_add_epi32(d0, d1), vq_scales(b));
}

/* Software prefetch for decode: VQ_PF bytes (about 7 rows of k = 2048) ahead of the block being
 * read in each of the two row streams, into L1 (an asm statement: GCC may drop prefetch
 * intrinsics it sees no use for); one 64-byte line per 70-byte block and stream. Without it the
 * kernel waited on the index loads from DRAM (perf annotate: ~60% of its samples on the first use
 * of a block's indices): 1B-class vq2 decode, 2 threads, AMD EPYC (Zen 5-like), 2026-11-28:
 * 47 -> 100-105 tokens/s; 1024 / 2048 / 8192 / 12288 bytes ahead: 63-65 / 73-75 / 100-102 / 97;
 * prefetcht1 no better. */
#define VQ_PF 4096
static inline void vq_prefetch(const uint8_t *p) { __asm__ volatile("prefetcht0 %0" : : "m"(*p)); }

static void vq_gemv(vq_tab *T, const int8_t **loaded, const uint8_t *w, size_t w_rb, int64_t m, int64_t nb,
                    const block_q8_K *y, const __m512i *bias, float *out) {
    for (int64_t i = 0; i < m;) {
        const uint8_t *r0 = w + (size_t)i * w_rb, *r1 = r0 + w_rb;
        const int8_t *cb = tn_vq_codebook(r0);
        if (cb != *loaded) vq_tab_load(T, *loaded = cb); /* rows of one tensor share it */
        const block_vq2 *b0 = (const block_vq2 *)(r0 + TN_VQ_HDR), *b1 = (const block_vq2 *)(r1 + TN_VQ_HDR);
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        if (i + 1 < m && tn_vq_codebook(r1) == cb) {
            for (int64_t bi = 0; bi < nb; bi++) {
                vq_prefetch((const uint8_t *)&b0[bi] + VQ_PF), vq_prefetch((const uint8_t *)&b1[bi] + VQ_PF);
                const __m512i bs = _mm512_sub_epi32(_mm512_setzero_si512(), bias ? bias[bi] : vq_bias(&y[bi]));
                const __m512i s0 = vq_dot_row(T, &b0[bi], &y[bi], bs), s1 = vq_dot_row(T, &b1[bi], &y[bi], bs);
                a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_set1_ps(_cvtsh_ss(b0[bi].d) * y[bi].d), a0);
                a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_set1_ps(_cvtsh_ss(b1[bi].d) * y[bi].d), a1);
            }
            out[i] = _mm512_reduce_add_ps(a0), out[i + 1] = _mm512_reduce_add_ps(a1);
            i += 2;
        } else {
            for (int64_t bi = 0; bi < nb; bi++) {
                vq_prefetch((const uint8_t *)&b0[bi] + VQ_PF);
                const __m512i s0 = vq_dot_row(T, &b0[bi], &y[bi], _mm512_sub_epi32(_mm512_setzero_si512(), bias ? bias[bi] : vq_bias(&y[bi])));
                a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_set1_ps(_cvtsh_ss(b0[bi].d) * y[bi].d), a0);
            }
            out[i] = _mm512_reduce_add_ps(a0);
            i += 1;
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
        for (int c = 0; keep && c < nc; c++)
            for (int64_t bi = 0; bi < nb; bi++) bias[c * nb + bi] = vq_bias(&yc[c][bi]);
        if (nc == 1) {
            vq_gemv(&T, &loaded, (const uint8_t *)w, w_rb, m, nb, yc[0], keep ? bias : NULL, y + j0 * ldy);
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
                const __m512i sv = vq_scales(&b[bi]);
                const float d = _cvtsh_ss(b[bi].d);
                for (int c = 0; c < nc; c++)
                    acc[c] = vq_fma(W, sv, d, &yc[c][bi], keep ? bias[c * nb + bi] : vq_bias(&yc[c][bi]), acc[c]);
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
