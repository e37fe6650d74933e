/*
 * tq1_lut.c (avx512) — decode for 1-bit tq weights in the load-time *_l32 layout (quant/repack.h:
 * 32 rows interleaved, 16-bit word r of a register = 16 codes of row r) by table lookup, as in
 * T-MAC (PAPERS.md): the unpack-and-multiply kernels spend two vector operations per 64 codes on
 * the int8 multiplier ports (expand the bits to bytes, VPDPBUSD) and top out near 16 GB/s per
 * Zen 4 core, below a core's share of DRAM bandwidth. Here, per 32 activations of the column, 8
 * tables of the 16 possible sums of 4 consecutive activations are built once per call (int16,
 * exact: |sum| <= 4 * 127), and then one VPERMW looks up 4 codes of all 32 rows at once (the
 * nibble is the index; the table is duplicated into both halves so the 5th index bit VPERMW reads
 * does not matter), VPADDW accumulates, so a piece of 32 codes x 32 rows costs 8 lookups, 7 adds
 * and 6 shifts (nibbles 1..3 of each word) on the shuffle / ALU ports.
 *
 * Per piece the 16-bit sums (|sum| <= 32 * 127) are widened by two VPMADDWD (even and odd rows:
 * the layout keeps even and odd rows' scales apart), converted and scaled by the piece's
 * activation scale; per block the sum meets d_w (and, asymmetric, m_w times the block's
 * activation sum). Symmetric tables hold sums of +-x (codes 2q - 1), so one path serves both.
 * Integer sums are exact; float rounding differs from the reference (tn_tq_vec_dot_ref) only by
 * order.
 *
 * Tables: sum over bits e of nibble n of x[4j + e] (asym) or of (2 bit - 1) x[4j + e] (sym); for 16
 * entries at once: VPDPBUSD of a constant bit pattern (one dword per entry) with the 4
 * activations broadcast, two such registers packed to words by VPACKSSDW, whose in-lane order the
 * patterns are laid out for. Symmetric: u8 operand x + 128, s8 pattern +-1, accumulator started at
 * -128 * sum of the pattern.
 *
 * Batches (n > 1: prefill, serve steps) unpack the rows to the file layout in a scratch buffer and
 * run the file type's kernel: the lookups pay only when a table serves many rows of one column.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "core/fp16.h"
#include "kern/kern.h"
#include "kern/scalar/kernels.h"
#include "quant/blocks.h"
#include "quant/repack.h"
#include "quant/tq.h"

#define TN_L32_STACK 32768 /* tables + scales on the stack up to this size, else the heap */
#define TN_L32_NS 4            /* groups (streams) per pass over the tables                */
#define TN_L32_HINT _MM_HINT_T2 /* prefetch to L2: the tables keep L1                         */
#define TN_L32_PF 2048          /* software prefetch distance in each chunk stream, bytes   */

/* The file type's gemm (same ISA level) for batches, by tq1 index 0..7; set at registration. */
static tn_gemm_fn tn_l32_file_gemm[8];

/* Patterns: dword lane 4 L + i of register A computes entry 8 (L & 1) + i, of B entry
 * 8 (L & 1) + 4 + i, so that VPACKSSDW(A, B) puts entry (w & 15) on word w. Built once per
 * symmetry at registration (index 1: symmetric). */
typedef struct {
    uint8_t pa[64], pb[64]; /* asym: bytes bit_e(n) (u8 operand); sym: bytes 2 bit_e(n) - 1 (s8 operand) */
    int32_t ca[16], cb[16]; /* sym: -128 * sum_e (2 bit_e(n) - 1) (accumulator start); asym: 0      */
} tn_l32_pat_bytes;
static _Alignas(64) tn_l32_pat_bytes tn_l32_pats[2];

typedef struct {
    __m512i pa, pb, ca, cb;
} tn_l32_pat;

static void tn_l32_pattern_build(bool sym, tn_l32_pat_bytes *P) {
    for (int lane = 0; lane < 16; lane++) {
        const int L = lane / 4, i = lane % 4, na = 8 * (L & 1) + i, nb = na + 4;
        int sa = 0, sb = 0;
        for (int e = 0; e < 4; e++) {
            const int ba = (na >> e) & 1, bb = (nb >> e) & 1;
            P->pa[4 * lane + e] = (uint8_t)(sym ? 2 * ba - 1 : ba);
            P->pb[4 * lane + e] = (uint8_t)(sym ? 2 * bb - 1 : bb);
            sa += 2 * ba - 1, sb += 2 * bb - 1;
        }
        P->ca[lane] = sym ? -128 * sa : 0, P->cb[lane] = sym ? -128 * sb : 0;
    }
}

static tn_l32_pat tn_l32_pattern(bool sym) {
    const tn_l32_pat_bytes *b = &tn_l32_pats[sym];
    return (tn_l32_pat){_mm512_loadu_si512(b->pa), _mm512_loadu_si512(b->pb), _mm512_loadu_si512(b->ca),
                        _mm512_loadu_si512(b->cb)};
}

/* The 8 tables (8 x 32 int16) of one activation block of 32 codes. */
static inline void tn_l32_tables(bool sym, const tn_l32_pat *P, const block_q8_0 *xb, int16_t *tab) {
    for (int j = 0; j < 8; j++) {
        int32_t v;
        memcpy(&v, xb->qs + 4 * j, 4);
        if (sym) v ^= (int32_t)0x80808080u; /* x + 128 as the unsigned operand */
        const __m512i X = _mm512_set1_epi32(v);
        const __m512i A = sym ? _mm512_dpbusd_epi32(P->ca, X, P->pa) : _mm512_dpbusd_epi32(P->ca, P->pa, X);
        const __m512i B = sym ? _mm512_dpbusd_epi32(P->cb, X, P->pb) : _mm512_dpbusd_epi32(P->cb, P->pb, X);
        _mm512_store_si512(tab + 32 * j, _mm512_packs_epi32(A, B));
    }
}

/* NG (1 .. TN_L32_NS) groups of 32 rows, far apart in memory (separate sequential streams that
 * share every table load; with one stream the table loads missed L1 on every group):
 * out[g][r] = dot of row r of group g with the column (tables tab, per-piece scales dx,
 * per-block offset sums mx). */
static inline __attribute__((always_inline)) void tn_l32_groups(const int G, const bool asym, const int NG,
                                                                const uint8_t *const *grp, int64_t nb,
                                                                const int16_t *tab, const float *dx, const float *mx,
                                                                float *const *out) {
    const int S = G / 32, hdr = asym ? 128 : 64;
    const size_t cb = (size_t)32 * ((asym ? 4 : 2) + (size_t)G / 8);
    const __m512i lo = _mm512_set1_epi32(0x00000001), hi = _mm512_set1_epi32(0x00010000);
    __m512 accE[4], accO[4], mE[4], mO[4];
    for (int g = 0; g < NG; g++) accE[g] = accO[g] = mE[g] = mO[g] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512 tE[4], tO[4];
        for (int g = 0; g < NG; g++) {
            const uint8_t *ch = grp[g] + (size_t)b * cb;
            for (int c = 0; c < (int)(cb / 64); c++) _mm_prefetch((const char *)ch + TN_L32_PF + 64 * c, TN_L32_HINT);
            tE[g] = tO[g] = _mm512_setzero_ps();
        }
        for (int s = 0; s < S; s++) {
            const int16_t *T = tab + (size_t)(b * S + s) * 256;
            const __m512 d = _mm512_set1_ps(dx[b * S + s]);
            for (int g = 0; g < NG; g++) {
                const uint8_t *ch = grp[g] + (size_t)b * cb;
                const __m512i R0 = _mm512_loadu_si512(ch + hdr + 128 * s), R1 = _mm512_loadu_si512(ch + hdr + 128 * s + 64);
                __m512i a = _mm512_permutexvar_epi16(R0, _mm512_load_si512(T));
                __m512i a2 = _mm512_permutexvar_epi16(_mm512_srli_epi16(R0, 4), _mm512_load_si512(T + 32));
                a = _mm512_add_epi16(a, _mm512_permutexvar_epi16(_mm512_srli_epi16(R0, 8), _mm512_load_si512(T + 64)));
                a2 = _mm512_add_epi16(a2, _mm512_permutexvar_epi16(_mm512_srli_epi16(R0, 12), _mm512_load_si512(T + 96)));
                a = _mm512_add_epi16(a, _mm512_permutexvar_epi16(R1, _mm512_load_si512(T + 128)));
                a2 = _mm512_add_epi16(a2, _mm512_permutexvar_epi16(_mm512_srli_epi16(R1, 4), _mm512_load_si512(T + 160)));
                a = _mm512_add_epi16(a, _mm512_permutexvar_epi16(_mm512_srli_epi16(R1, 8), _mm512_load_si512(T + 192)));
                a2 = _mm512_add_epi16(a2, _mm512_permutexvar_epi16(_mm512_srli_epi16(R1, 12), _mm512_load_si512(T + 224)));
                a = _mm512_add_epi16(a, a2);
                tE[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(a, lo)), d, tE[g]);
                tO[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(a, hi)), d, tO[g]);
            }
        }
        for (int g = 0; g < NG; g++) {
            const uint8_t *ch = grp[g] + (size_t)b * cb;
            accE[g] = _mm512_fmadd_ps(tE[g], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)ch)), accE[g]);
            accO[g] = _mm512_fmadd_ps(tO[g], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ch + 32))), accO[g]);
            if (asym) {
                const __m512 m = _mm512_set1_ps(mx[b]);
                mE[g] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ch + 64))), m, mE[g]);
                mO[g] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ch + 96))), m, mO[g]);
            }
        }
    }
    /* lane i of accE is row 2i, of accO row 2i + 1 */
    const __m512i i0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i i1 = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int g = 0; g < NG; g++) {
        if (asym) accE[g] = _mm512_add_ps(accE[g], mE[g]), accO[g] = _mm512_add_ps(accO[g], mO[g]);
        _mm512_storeu_ps(out[g], _mm512_permutex2var_ps(accE[g], i0, accO[g]));
        _mm512_storeu_ps(out[g] + 16, _mm512_permutex2var_ps(accE[g], i1, accO[g]));
    }
}

static inline __attribute__((always_inline)) void tn_l32_gemm(const int ti, const int G, const bool asym, int64_t k,
                                                              int64_t m, int64_t n, const void *w, size_t w_rb,
                                                              const void *x, size_t x_rb, float *y, int64_t ldy) {
    if (n > 1) { /* batches: rows back in the file layout, the file type's kernel */
        uint8_t *rows = aligned_alloc(64, ((size_t)m * w_rb + 63) & ~(size_t)63);
        if (rows) {
            for (int64_t i = 0; i < m; i++) tn_unpack_row_l32(TN_TQ1G32_L32 + ti, w, k, i, rows + (size_t)i * w_rb);
            tn_l32_file_gemm[ti](k, m, n, rows, w_rb, x, x_rb, y, ldy);
            free(rows);
            return;
        }
        /* no memory: one column at a time through the lookup kernel below */
    }
    const int64_t nb = k / G, np = k / 32;
    const size_t need = (size_t)np * 512 + (size_t)np * 4 + (size_t)nb * 4;
    _Alignas(64) uint8_t stackbuf[TN_L32_STACK];
    uint8_t *buf = need <= TN_L32_STACK ? stackbuf : aligned_alloc(64, (need + 63) & ~(size_t)63);
    if (!buf) { /* no memory for the tables: the scalar reference */
        tn_k_gemm_tq1_l32_q8_0__scalar(TN_TQ1G32_L32 + ti, k, m, n, w, w_rb, x, x_rb, y, ldy);
        return;
    }
    int16_t *tab = (int16_t *)buf;
    float *dx = (float *)(buf + (size_t)np * 512), *mx = dx + np;
    const tn_l32_pat P = tn_l32_pattern(!asym);
    for (int64_t j = 0; j < n; j++) {
        const block_q8_0 *xb = (const block_q8_0 *)((const uint8_t *)x + (size_t)j * x_rb);
        for (int64_t p = 0; p < np; p++) {
            tn_l32_tables(!asym, &P, &xb[p], tab + (size_t)p * 256);
            const float da = tn_fp16_to_fp32(xb[p].d);
            dx[p] = asym ? da : 0.5f * da;
        }
        if (asym)
            for (int64_t b = 0; b < nb; b++) {
                float v = 0;
                for (int s = 0; s < G / 32; s++) {
                    const block_q8_0 *a = &xb[b * (G / 32) + s];
                    int32_t sa = 0;
                    for (int e = 0; e < 32; e++) sa += a->qs[e];
                    v += tn_fp16_to_fp32(a->d) * (float)sa;
                }
                mx[b] = v;
            }
        const int64_t ng = m / TN_L32_ROWS, q = (ng + TN_L32_NS - 1) / TN_L32_NS;
        for (int64_t g = 0; g < q; g++) { /* groups g, g + q, ..: TN_L32_NS streams */
            const uint8_t *grp[4] = {NULL, NULL, NULL, NULL};
            float *out[4] = {NULL, NULL, NULL, NULL};
            int ns = 0;
            for (int u = 0; u < TN_L32_NS && g + u * q < ng; u++, ns++) {
                grp[u] = (const uint8_t *)w + (size_t)(g + u * q) * TN_L32_ROWS * w_rb;
                out[u] = y + j * ldy + (g + u * q) * TN_L32_ROWS;
            }
            switch (ns) {
            case 4: tn_l32_groups(G, asym, 4, grp, nb, tab, dx, mx, out); break;
            case 3: tn_l32_groups(G, asym, 3, grp, nb, tab, dx, mx, out); break;
            case 2: tn_l32_groups(G, asym, 2, grp, nb, tab, dx, mx, out); break;
            default: tn_l32_groups(G, asym, 1, grp, nb, tab, dx, mx, out); break;
            }
        }
    }
    if (buf != stackbuf) free(buf);
}

#define TN_L32_KERNEL(name, ti, G, asym)                                                                               \
    static void tn_k_gemm_##name##_q8_0__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,           \
                                                const void *x, size_t x_rb, float *y, int64_t ldy) {                    \
        tn_l32_gemm(ti, G, asym, k, m, n, w, w_rb, x, x_rb, y, ldy);                                                   \
    }
TN_L32_KERNEL(tq1g32_l32, 0, 32, false)
TN_L32_KERNEL(tq1g32a_l32, 1, 32, true)
TN_L32_KERNEL(tq1g64_l32, 2, 64, false)
TN_L32_KERNEL(tq1g64a_l32, 3, 64, true)
TN_L32_KERNEL(tq1g128_l32, 4, 128, false)
TN_L32_KERNEL(tq1g128a_l32, 5, 128, true)
TN_L32_KERNEL(tq1g256_l32, 6, 256, false)
TN_L32_KERNEL(tq1g256a_l32, 7, 256, true)

void tn_kern_register_l32_avx512(tn_kern_table *t) {
    const tn_cpu *c = tn_cpu_get();
    if (!c->avx512vnni || !c->avx512bw) return;
    const tn_gemm_fn fns[8] = {tn_k_gemm_tq1g32_l32_q8_0__avx512,  tn_k_gemm_tq1g32a_l32_q8_0__avx512,
                               tn_k_gemm_tq1g64_l32_q8_0__avx512,  tn_k_gemm_tq1g64a_l32_q8_0__avx512,
                               tn_k_gemm_tq1g128_l32_q8_0__avx512, tn_k_gemm_tq1g128a_l32_q8_0__avx512,
                               tn_k_gemm_tq1g256_l32_q8_0__avx512, tn_k_gemm_tq1g256a_l32_q8_0__avx512};
    tn_l32_pattern_build(false, &tn_l32_pats[0]);
    tn_l32_pattern_build(true, &tn_l32_pats[1]);
    for (int i = 0; i < 8; i++) {
        tn_l32_file_gemm[i] = t->slot[TN_DTYPE_TERN_BASE + i].gemm;
        t->slot[TN_TQ1G32_L32 + i].gemm = fns[i];
        t->slot[TN_TQ1G32_L32 + i].gemm_isa = TN_ISA_AVX512;
    }
}
