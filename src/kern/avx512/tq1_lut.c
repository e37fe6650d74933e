/*
 * tq1_lut.c (avx512) — decode for 1-bit tq weights in the load-time *_l32 layout (quant/repack.h:
 * 32 rows interleaved, 16-bit word r of a register = 16 codes of row r) by table lookup, as in
 * T-MAC (PAPERS.md): the unpack-and-multiply kernels spend two vector operations per 64 codes on
 * the int8 multiplier ports (expand the bits to bytes, VPDPBUSD) and top out near 16 GB/s per
 * Zen 4 core, below a core's share of DRAM bandwidth. Here, per 32 activations of the column,
 * tables of the possible sums of consecutive activations are built once per call (int16, exact:
 * |sum| <= 6 * 127): per 16 codes two tables of 64 sums of 6 activations and one of 16 sums of 4.
 * Then one VPERMI2W (64 entries in two registers, the low 6 index bits) looks up 6 codes of all 32
 * rows at once, and one VPERMW the last 4 (the table duplicated into both halves, so the 5th
 * index bit does not matter); VPADDW accumulates. A piece of 32 codes x 32 rows costs 6 lookups,
 * 5 adds and 4 shifts (bits 6 and 12 of each word), 15 operations, where 4-code tables took 8 + 7
 * + 6 = 21: on Zen 4 every one of them holds a 256-bit pipe for two cycles, so the count is the
 * speed (2048 x 2048 in L2: 35 -> 38 GB/s, from DRAM 20-22 -> 25-28 GB/s on one core).
 *
 * Per piece the 16-bit sums (|sum| <= 32 * 127) are widened by two VPMADDWD (even and odd rows:
 * the layout keeps even and odd rows' scales apart), converted and scaled by the piece's
 * activation scale; per block the sum meets d_w (and, asymmetric, m_w times the block's
 * activation sum). Symmetric tables hold sums of +-x (codes 2q - 1), so one path serves both.
 * Integer sums are exact; float rounding differs from the reference (tn_tq_vec_dot_ref) only by
 * order.
 *
 * Tables: entry n = sum over bits e of n of x[o + e] (asym) or of (2 bit - 1) x[o + e] (sym); 16
 * entries at once: one VPDPBUSD per 4 bits of a constant bit pattern (one dword per entry) with 4
 * activations broadcast, two such registers packed to words by VPACKSSDW, whose in-lane order the
 * patterns are laid out for. Symmetric: u8 operand x + 128, s8 pattern +-1 (0 pads), accumulator
 * started at -128 * sum of the pattern.
 *
 * Per thread, the last column's tables are kept and reused when the next call brings the same
 * column (compared byte for byte; colcache.h).
 *
 * Batches (n > 1: prefill, serve steps) unpack the rows to the file layout in a scratch buffer and
 * run the file type's kernel: the lookups pay only when a table serves many rows of one column.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "core/fp16.h"
#include "kern/avx512/colcache.h"
#include "kern/kern.h"
#include "kern/scalar/kernels.h"
#include "quant/blocks.h"
#include "quant/repack.h"
#include "quant/tq.h"

#define TN_L32_STACK 32768 /* tables + scales on the stack up to this size, else the heap */
#define TN_L32_NS 4            /* groups (streams) per pass over the tables                */
#ifndef TN_L32_HINT
#define TN_L32_HINT _MM_HINT_T2 /* prefetch to L2: the tables keep L1                         */
#endif
#ifndef TN_L32_PF
#define TN_L32_PF 2048          /* software prefetch distance in each chunk stream, bytes   */
#endif

/* The file type's gemm (same ISA level) for batches, by tq1 index 0..7; set at registration. */
static tn_gemm_fn tn_l32_file_gemm[8];

/* Tables per piece of 32 activations, for each half h (16 codes of a row = one 16-bit word):
 * two 64-entry tables of the sums of 6 activations (codes 16h + 0..5 and 16h + 6..11; each in two
 * registers, entries 0..31 and 32..63, looked up by VPERMI2W with the low 6 index bits) and one
 * 16-entry table of the sums of 4 (codes 16h + 12..15, duplicated into both halves of a register,
 * looked up by VPERMW). TN_L32_TW words per piece. */
#define TN_L32_TW 320
enum { TN_L32_K6LO, TN_L32_K6HI, TN_L32_K4, TN_L32_NK };

/* Patterns: the entries of a table are computed 16 at a time, dword lane q of register A
 * holding entry e_A(q) and of register B entry e_A(q) + 4, so that VPACKSSDW(A, B) (in-lane
 * interleave of 4 dwords of each) puts entry w on word w (6-bit tables) or w & 15 (4-bit table).
 * Each dword lane is one or two VPDPBUSD of the bits of its entry with 4 activations broadcast:
 * p[.][.][0] for bits 0..3, p[.][.][1] for bits 4..5 (zero bytes pad the unused positions).
 * Built once per symmetry at registration (index 1: symmetric). */
typedef struct {
    uint8_t p[TN_L32_NK][2][2][64]; /* [kind][A/B][bits 0..3 / 4..5]: asym bit (u8 operand); sym 2 bit - 1 (s8) */
    int32_t c[TN_L32_NK][2][16];    /* sym: -128 * sum of the pattern's signs (accumulator start); asym: 0 */
} tn_l32_pat_bytes;
static _Alignas(64) tn_l32_pat_bytes tn_l32_pats[2];

static int tn_l32_entry(int kind, int sel, int q) {
    const int L = q / 4, i = q % 4;
    if (kind == TN_L32_K4) return 8 * (L & 1) + 4 * sel + i;
    return 8 * L + 4 * sel + i + (kind == TN_L32_K6HI ? 32 : 0);
}

static void tn_l32_pattern_build(bool sym, tn_l32_pat_bytes *P) {
    for (int kind = 0; kind < TN_L32_NK; kind++) {
        const int nbits = kind == TN_L32_K4 ? 4 : 6;
        for (int sel = 0; sel < 2; sel++)
            for (int q = 0; q < 16; q++) {
                const int n = tn_l32_entry(kind, sel, q);
                int sum = 0;
                for (int dp = 0; dp < 2; dp++)
                    for (int e = 0; e < 4; e++) {
                        const int bit = 4 * dp + e, b = (n >> bit) & 1;
                        uint8_t v = 0;
                        if (bit < nbits) v = (uint8_t)(sym ? 2 * b - 1 : b), sum += 2 * b - 1;
                        P->p[kind][sel][dp][4 * q + e] = v;
                    }
                P->c[kind][sel][q] = sym ? -128 * sum : 0;
            }
    }
}

/* One table (one register of 32 int16 entries) of kind `kind` over the activations at q8. */
static inline __m512i tn_l32_table(bool sym, const tn_l32_pat_bytes *P, int kind, const int8_t *q8) {
    int32_t v0, v1;
    memcpy(&v0, q8, 4);
    memcpy(&v1, q8 + 4, 4);
    if (sym) v0 ^= (int32_t)0x80808080u, v1 ^= (int32_t)0x80808080u; /* x + 128 as the unsigned operand */
    const __m512i X0 = _mm512_set1_epi32(v0), X1 = _mm512_set1_epi32(v1);
    __m512i r[2];
    for (int sel = 0; sel < 2; sel++) {
        const __m512i p0 = _mm512_load_si512(P->p[kind][sel][0]), p1 = _mm512_load_si512(P->p[kind][sel][1]);
        __m512i a = _mm512_load_si512(P->c[kind][sel]);
        a = sym ? _mm512_dpbusd_epi32(a, X0, p0) : _mm512_dpbusd_epi32(a, p0, X0);
        if (kind != TN_L32_K4) a = sym ? _mm512_dpbusd_epi32(a, X1, p1) : _mm512_dpbusd_epi32(a, p1, X1);
        r[sel] = a;
    }
    return _mm512_packs_epi32(r[0], r[1]);
}

/* The 10 tables (TN_L32_TW int16) of one activation block of 32 codes. */
static inline void tn_l32_tables(bool sym, const tn_l32_pat_bytes *P, const block_q8_0 *xb, int16_t *tab) {
    for (int h = 0; h < 2; h++) {
        const int8_t *q = xb->qs + 16 * h;
        int16_t *t = tab + 160 * h;
        for (int u = 0; u < 2; u++) {
            _mm512_store_si512(t + 64 * u, tn_l32_table(sym, P, TN_L32_K6LO, q + 6 * u));
            _mm512_store_si512(t + 64 * u + 32, tn_l32_table(sym, P, TN_L32_K6HI, q + 6 * u));
        }
        _mm512_store_si512(t + 128, tn_l32_table(sym, P, TN_L32_K4, q + 12));
    }
}

/* Sum of one half's lookups: 16 codes of 32 rows (word r of R = row r). */
static inline __attribute__((always_inline)) __m512i tn_l32_half(__m512i R, __m512i T0, __m512i T1, __m512i T2,
                                                                 __m512i T3, __m512i T4) {
    const __m512i a = _mm512_permutex2var_epi16(T0, R, T1);
    const __m512i b = _mm512_permutex2var_epi16(T2, _mm512_srli_epi16(R, 6), T3);
    const __m512i c = _mm512_permutexvar_epi16(_mm512_srli_epi16(R, 12), T4);
    return _mm512_add_epi16(_mm512_add_epi16(a, b), c);
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
            const int16_t *T = tab + (size_t)(b * S + s) * TN_L32_TW;
            const __m512 d = _mm512_set1_ps(dx[b * S + s]);
            const __m512i T0 = _mm512_load_si512(T), T1 = _mm512_load_si512(T + 32), T2 = _mm512_load_si512(T + 64),
                          T3 = _mm512_load_si512(T + 96), T4 = _mm512_load_si512(T + 128),
                          U0 = _mm512_load_si512(T + 160), U1 = _mm512_load_si512(T + 192),
                          U2 = _mm512_load_si512(T + 224), U3 = _mm512_load_si512(T + 256),
                          U4 = _mm512_load_si512(T + 288);
            for (int g = 0; g < NG; g++) {
                const uint8_t *ch = grp[g] + (size_t)b * cb;
                const __m512i R0 = _mm512_loadu_si512(ch + hdr + 128 * s), R1 = _mm512_loadu_si512(ch + hdr + 128 * s + 64);
                const __m512i a = _mm512_add_epi16(tn_l32_half(R0, T0, T1, T2, T3, T4),
                                                   tn_l32_half(R1, U0, U1, U2, U3, U4));
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
    const size_t need = (size_t)np * TN_L32_TW * 2 + (size_t)np * 4 + (size_t)nb * 4;
    _Alignas(64) uint8_t stackbuf[TN_L32_STACK];
    const size_t xbytes = (size_t)np * sizeof(block_q8_0);
    /* one column: this thread's last column's tables are reused when k, G, the symmetry and the
     * column's bytes match (colcache.h) */
    tn_colcache *C = n == 1 ? tn_colcache_get(TN_COLCACHE_L32, xbytes, need) : NULL;
    const uint64_t key = (uint64_t)k << 16 | (uint64_t)G << 1 | (uint64_t)asym;
    bool have = false; /* the tables in buf are this column's */
    uint8_t *buf;
    if (C) {
        buf = C->buf;
        have = tn_colcache_hit(C, key, x, xbytes);
    } else {
        buf = need <= TN_L32_STACK ? stackbuf : aligned_alloc(64, (need + 63) & ~(size_t)63);
    }
    if (!buf) { /* no memory for the tables: the scalar reference */
        tn_k_gemm_tq1_l32_q8_0__scalar(TN_TQ1G32_L32 + ti, k, m, n, w, w_rb, x, x_rb, y, ldy);
        return;
    }
    int16_t *tab = (int16_t *)buf;
    float *dx = (float *)(buf + (size_t)np * TN_L32_TW * 2), *mx = dx + np;
    const tn_l32_pat_bytes *P = &tn_l32_pats[!asym];
    for (int64_t j = 0; j < n; j++) {
        const block_q8_0 *xb = (const block_q8_0 *)((const uint8_t *)x + (size_t)j * x_rb);
        for (int64_t p = 0; p < np && !have; p++) {
            tn_l32_tables(!asym, P, &xb[p], tab + (size_t)p * TN_L32_TW);
            const float da = tn_fp16_to_fp32(xb[p].d);
            dx[p] = asym ? da : 0.5f * da;
        }
        if (asym && !have)
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
        if (C && !have) tn_colcache_set(C, key, x, xbytes); /* remember this column */
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
    if (!C && buf != stackbuf) free(buf);
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
