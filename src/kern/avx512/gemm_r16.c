/*
 * gemm_r16.c (avx512) — tile products for weights in the load-time *_r16 layouts (quant/repack.h:
 * q4_0, symmetric tq4g<G>, q8_0, iq4_nl), for every batch size: decode, serve steps and prefill.
 * q8_0 is the same without the unpacking: its codes are stored + 128, and the offset is
 * -128 * sum x; iq4_nl unpacks as q4_0, then one VPSHUFB per register maps each code to its table
 * value + 128 (1 .. 241, unsigned), with the same -128 * sum x offset.
 *
 * Per 32 codes of a chunk (16 rows, 256 bytes): the four 64-byte registers P_t are split into
 * low and high nibbles once (8 registers of unsigned codes, int32 lane r = row r), then for each
 * activation column: the accumulator starts at the code offset times the block's activation sum
 * (q4_0: -8 * sum x; tq4: codes doubled while unpacking, -15 * sum x, as 2 (q - 7.5) = 2q - 15),
 * exact in integers, and takes 8 VPDPBUSD, each against four activation bytes broadcast to all
 * lanes, so lane r ends as the exact integer dot of row r's 32 codes with the column's block — no
 * horizontal reduction. One conversion, one multiply (d_w of 16 rows times d_x, halved for tq4)
 * and one FMA apply the scales. Per 32 codes and column that is 8 VPDPBUSD + 3 float operations
 * for 512 products, against ~17 operations in the row-major row kernel (gemv.c: lanes hold 4
 * products of one row, reduced by a transpose per 16 blocks); the unpacking is shared by up to 8
 * columns per pass.
 *
 * Decode (one column) reads groups g and g + ceil(groups / 2) together (tn_r16_dec2: two
 * sequential streams, each block's activation broadcasts shared by both): one thread from DRAM,
 * 8192 x 2048, Zen 4, 2026-11-28: 22.8 against 21.3 GB/s for q4_0 and iq4_nl with one group at a time.
 *
 * Columns go through in passes of up to 8 (accumulators: 8 columns x 16 rows in registers); a
 * group's 16 rows are read from memory once per stack buffer of columns and from cache by the
 * later passes. Per-column
 * activation data (scale, offset term) is prepared once per call for up to a stack buffer's worth
 * of columns. The chunk stream is prefetched TN_R16_PF bytes ahead.
 *
 * Integer sums are exact; only the float rounding differs from the references (the scale is
 * applied by an FMA on d_w * d_x instead of the references' products in their order).
 */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "core/fp16.h"
#include "kern/kern.h"
#include "kern/scalar/kernels.h"
#include "quant/blocks.h"
#include "quant/repack.h"

#define TN_R16_NC 8          /* columns per pass */
#define TN_R16_PF 1536       /* software prefetch distance, bytes */
/* decode (tn_r16_dec2): into L2 (prefetcht1; a core has more misses to L2 in flight than to L1),
 * 1 KiB ahead in each stream. One thread from DRAM (8192 x 2048, Zen 4, 2026-11-28), two runs:
 * q4_0_r16 20.7-23.8 GB/s, iq4_nl_r16 25.2-25.5, against 13.5-20.9 and 20.2-21.3 with prefetcht0
 * 1.5 KiB ahead (the file layout's gemv: q4_0 19.4-20.4) */
#define TN_R16_PF_DEC 1024
#define TN_R16_META 65536    /* per-call activation data on the stack, bytes */
/* The matmul driver hands every batch size whole thread ranges (gemm_nrow): each group of 16 rows
 * is read from memory once per stack buffer of columns (k = 2048: 128 columns) and reused from
 * cache by every pass of 8. Measured on Zen 4, 1B q4_0, 2 threads: pp512 ~5-10% faster than the
 * driver's 64 x 64 cache blocks. */
#define TN_R16_NROW (1 << 30)

typedef struct {
    float d;   /* d_x */
    int32_t s; /* -offset * sum of the block's 32 activations */
} tn_r16_meta;

/* meta[j * nb + b] for n columns of nb blocks: d_x * dmul, -off * sum(x block) */
static void tn_r16_prep(const uint8_t *x, size_t x_rb, int64_t n, int64_t nb, int32_t off, float dmul,
                        tn_r16_meta *meta) {
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int64_t j = 0; j < n; j++) {
        const block_q8_0 *xb = (const block_q8_0 *)(x + (size_t)j * x_rb);
        for (int64_t b = 0; b < nb; b++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)xb[b].qs);
            const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
            meta[j * nb + b].d = tn_fp16_to_fp32(xb[b].d) * dmul;
            meta[j * nb + b].s = -off * _mm_cvtsi128_si32(h);
        }
    }
}

static inline int32_t tn_r16_x4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* q[u] (u = 0..7): codes 4u..4u+3 of piece s of chunk ch for every row, VPDPBUSD's unsigned
 * operand (flags as tn_r16_tile; mask: the nibble mask, tbl: the iq4_nl table + 128). */
static inline __attribute__((always_inline)) void tn_r16_codes(const bool TQ, const bool Q8, const bool NL,
                                                                const uint8_t *ch, int s, __m512i mask, __m512i tbl,
                                                                __m512i q[8]) {
    if (Q8) {
        for (int u = 0; u < 8; u++) q[u] = _mm512_loadu_si512(ch + 32 + 64 * u);
        return;
    }
    for (int t = 0; t < 4; t++) {
        const __m512i p = _mm512_loadu_si512(ch + 32 + 256 * s + 64 * t);
        q[t] = _mm512_and_si512(TQ ? _mm512_slli_epi16(p, 1) : p, mask);
        q[4 + t] = _mm512_and_si512(_mm512_srli_epi16(p, TQ ? 3 : 4), mask);
        if (NL) q[t] = _mm512_shuffle_epi8(tbl, q[t]), q[4 + t] = _mm512_shuffle_epi8(tbl, q[4 + t]);
    }
}

/* acc + the block's integer sums a times d_w * d_x: one FMA, or for iq4_nl the reference's
 * (d_x d_w) * sumi rounded, then added (bit for bit). */
static inline __attribute__((always_inline)) __m512 tn_r16_scale_add(const bool NL, __m512 acc, __m512i a, __m512 dw,
                                                                      float dx) {
    const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(dx));
    return NL ? _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(a), dd)) : _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), dd, acc);
}

static inline __m512i tn_r16_nl_table(void) {
    return _mm512_broadcast_i32x4(_mm_xor_si128(_mm_loadu_si128((const __m128i *)tn_kvalues_iq4nl), _mm_set1_epi8((char)0x80)));
}

/* One group of 16 rows x NC columns: y[c * ldy + r] for r < 16, c < NC; S pieces of 32 codes per
 * chunk (G = 32 S), TQ: symmetric tq4 (codes doubled) instead of q4_0; Q8: q8_0 (8-bit codes, no
 * unpacking; S = 1); NL: iq4_nl (each code through one VPSHUFB into the iq4_nl table + 128). */
static inline __attribute__((always_inline)) void tn_r16_tile(const int NC, const int S, const bool TQ, const bool Q8,
                                                               const bool NL, const uint8_t *grp, int64_t nb, const uint8_t *x,
                                                               size_t x_rb, const tn_r16_meta *meta, float *y,
                                                               int64_t ldy) {
    const size_t cb = Q8 ? 32 + 512 : 32 + 256 * (size_t)S;
    __m512 acc[TN_R16_NC];
    for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    const __m512i mask = _mm512_set1_epi8(TQ ? 0x1E : 0x0F), tbl = tn_r16_nl_table();
    for (int64_t b0 = 0; b0 < nb; b0 += S) {
        const uint8_t *ch = grp + (size_t)(b0 / S) * cb;
        for (size_t l = 0; l < cb; l += 64) _mm_prefetch((const char *)ch + TN_R16_PF + l, _MM_HINT_T0);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)ch));
        for (int s = 0; s < S; s++) {
            const int64_t b = b0 + s;
            __m512i q[8];
            tn_r16_codes(TQ, Q8, NL, ch, s, mask, tbl, q);
            for (int c = 0; c < NC; c++) {
                const int8_t *xq = ((const block_q8_0 *)(x + (size_t)c * x_rb))[b].qs;
                const tn_r16_meta mt = meta[(size_t)c * (size_t)nb + (size_t)b];
                __m512i a = _mm512_set1_epi32(mt.s);
                for (int u = 0; u < 8; u++) a = _mm512_dpbusd_epi32(a, q[u], _mm512_set1_epi32(tn_r16_x4(xq + 4 * u)));
                acc[c] = tn_r16_scale_add(NL, acc[c], a, dw, mt.d);
            }
        }
    }
    for (int c = 0; c < NC; c++) _mm512_storeu_ps(y + c * ldy, acc[c]);
}

/* One column (decode): groups g0 and g1 (far apart: two sequential streams) chunk by chunk into
 * y0[0..16), y1[0..16); each block's eight activation broadcasts serve both groups. Same integer
 * sums and float operations per row as tn_r16_tile. */
static inline __attribute__((always_inline)) void tn_r16_dec2(const int S, const bool TQ, const bool Q8, const bool NL,
                                                               const uint8_t *g0, const uint8_t *g1, int64_t nb,
                                                               const uint8_t *x, const tn_r16_meta *meta, float *y0,
                                                               float *y1) {
    const size_t cb = Q8 ? 32 + 512 : 32 + 256 * (size_t)S;
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    const __m512i mask = _mm512_set1_epi8(TQ ? 0x1E : 0x0F), tbl = tn_r16_nl_table();
    const block_q8_0 *xb = (const block_q8_0 *)x;
    for (int64_t b0 = 0; b0 < nb; b0 += S) {
        const uint8_t *ch[2] = {g0 + (size_t)(b0 / S) * cb, g1 + (size_t)(b0 / S) * cb};
        __m512 dw[2];
        for (int g = 0; g < 2; g++) {
            for (size_t l = 0; l < cb; l += 64) _mm_prefetch((const char *)ch[g] + TN_R16_PF_DEC + l, _MM_HINT_T1);
            dw[g] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)ch[g]));
        }
        for (int s = 0; s < S; s++) {
            const int64_t b = b0 + s;
            __m512i xv[8];
            for (int u = 0; u < 8; u++) xv[u] = _mm512_set1_epi32(tn_r16_x4(xb[b].qs + 4 * u));
            const tn_r16_meta mt = meta[b];
            for (int g = 0; g < 2; g++) {
                __m512i q[8], a = _mm512_set1_epi32(mt.s);
                tn_r16_codes(TQ, Q8, NL, ch[g], s, mask, tbl, q);
                for (int u = 0; u < 8; u++) a = _mm512_dpbusd_epi32(a, q[u], xv[u]);
                acc[g] = tn_r16_scale_add(NL, acc[g], a, dw[g], mt.d);
            }
        }
    }
    _mm512_storeu_ps(y0, acc[0]);
    _mm512_storeu_ps(y1, acc[1]);
}

typedef void (*tn_r16_tile_fn)(const uint8_t *, int64_t, const uint8_t *, size_t, const tn_r16_meta *, float *,
                               int64_t);
typedef void (*tn_r16_dec2_fn)(const uint8_t *, const uint8_t *, int64_t, const uint8_t *, const tn_r16_meta *, float *,
                               float *);

#define TN_R16_TILE_FN(name, NC, S, TQ, Q8, NL)                                                                        \
    static void tn_r16_tile_##name##_##NC(const uint8_t *grp, int64_t nb, const uint8_t *x, size_t x_rb,              \
                                          const tn_r16_meta *meta, float *y, int64_t ldy) {                            \
        tn_r16_tile(NC, S, TQ, Q8, NL, grp, nb, x, x_rb, meta, y, ldy);                                                \
    }
#define TN_R16_TILES(name, S, TQ, Q8, NL)                                                                              \
    TN_R16_TILE_FN(name, 1, S, TQ, Q8, NL)                                                                             \
    TN_R16_TILE_FN(name, 2, S, TQ, Q8, NL)                                                                             \
    TN_R16_TILE_FN(name, 3, S, TQ, Q8, NL)                                                                             \
    TN_R16_TILE_FN(name, 4, S, TQ, Q8, NL)                                                                             \
    TN_R16_TILE_FN(name, 5, S, TQ, Q8, NL)                                                                             \
    TN_R16_TILE_FN(name, 6, S, TQ, Q8, NL)                                                                             \
    TN_R16_TILE_FN(name, 7, S, TQ, Q8, NL)                                                                             \
    TN_R16_TILE_FN(name, 8, S, TQ, Q8, NL)                                                                             \
    static const tn_r16_tile_fn tn_r16_tiles_##name[TN_R16_NC + 1] = {                                                 \
        NULL, tn_r16_tile_##name##_1, tn_r16_tile_##name##_2, tn_r16_tile_##name##_3, tn_r16_tile_##name##_4,          \
        tn_r16_tile_##name##_5, tn_r16_tile_##name##_6, tn_r16_tile_##name##_7, tn_r16_tile_##name##_8};             \
    static void tn_r16_dec2_##name(const uint8_t *g0, const uint8_t *g1, int64_t nb, const uint8_t *x,                 \
                                   const tn_r16_meta *meta, float *y0, float *y1) {                                    \
        tn_r16_dec2(S, TQ, Q8, NL, g0, g1, nb, x, meta, y0, y1);                                                       \
    }
TN_R16_TILES(q4_0, 1, false, false, false)
TN_R16_TILES(tq4g32, 1, true, false, false)
TN_R16_TILES(tq4g64, 2, true, false, false)
TN_R16_TILES(tq4g128, 4, true, false, false)
TN_R16_TILES(tq4g256, 8, true, false, false)
TN_R16_TILES(q8_0, 1, false, true, false)
TN_R16_TILES(iq4_nl, 1, false, false, true)

static void tn_r16_gemm(const tn_r16_tile_fn *tiles, tn_r16_dec2_fn dec2, tn_gemm_fn ref, int32_t off, float dmul,
                        int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x, size_t x_rb,
                        float *y, int64_t ldy) {
    const int64_t nb = k / QK8_0;
    const size_t col_meta = (size_t)nb * sizeof(tn_r16_meta);
    if (col_meta > TN_R16_META) { /* k > 262144: beyond any model; the reference handles it */
        ref(k, m, n, w, w_rb, x, x_rb, y, ldy);
        return;
    }
    _Alignas(64) uint8_t buf[TN_R16_META];
    tn_r16_meta *meta = (tn_r16_meta *)buf;
    const int64_t ncol = (int64_t)(TN_R16_META / col_meta); /* columns prepared at once */
    for (int64_t j0 = 0; j0 < n; j0 += ncol) {
        const int64_t nj = n - j0 < ncol ? n - j0 : ncol;
        const uint8_t *xj = (const uint8_t *)x + (size_t)j0 * x_rb;
        tn_r16_prep(xj, x_rb, nj, nb, off, dmul, meta);
        const int64_t ng = m / TN_R16_ROWS, h = (ng + 1) / 2, gb = TN_R16_ROWS * (int64_t)w_rb;
        if (n == 1 && ng >= 2) { /* decode: groups g and g + h together (two streams), ng odd: the middle alone */
            for (int64_t g = 0; g < ng - h; g++)
                dec2((const uint8_t *)w + g * gb, (const uint8_t *)w + (g + h) * gb, nb, xj, meta, y + g * TN_R16_ROWS,
                     y + (g + h) * TN_R16_ROWS);
            if (ng - h < h) tiles[1]((const uint8_t *)w + (h - 1) * gb, nb, xj, x_rb, meta, y + (h - 1) * TN_R16_ROWS, ldy);
            return;
        }
        for (int64_t g = 0; g < m / TN_R16_ROWS; g++) {
            const uint8_t *grp = (const uint8_t *)w + (size_t)g * TN_R16_ROWS * w_rb;
            for (int64_t c0 = 0; c0 < nj; c0 += TN_R16_NC) {
                const int nc = (int)(nj - c0 < TN_R16_NC ? nj - c0 : TN_R16_NC);
                tiles[nc](grp, nb, xj + (size_t)c0 * x_rb, x_rb, meta + c0 * nb, y + (j0 + c0) * ldy + g * TN_R16_ROWS,
                          ldy);
            }
        }
    }
}

#define TN_R16_GEMM(name, off, dmul)                                                                                   \
    static void tn_k_gemm_##name##_r16_q8_0__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,             \
                                             const void *x, size_t x_rb, float *y, int64_t ldy) {                      \
        tn_r16_gemm(tn_r16_tiles_##name, tn_r16_dec2_##name, tn_k_gemm_##name##_r16_q8_0__scalar, off, dmul, k, m, n, w, \
                    w_rb, x, x_rb, y, ldy);                                                                            \
    }
TN_R16_GEMM(q4_0, 8, 1.0f)
TN_R16_GEMM(tq4g32, 15, 0.5f)
TN_R16_GEMM(tq4g64, 15, 0.5f)
TN_R16_GEMM(tq4g128, 15, 0.5f)
TN_R16_GEMM(tq4g256, 15, 0.5f)
TN_R16_GEMM(q8_0, 128, 1.0f)
TN_R16_GEMM(iq4_nl, 128, 1.0f)

void tn_kern_register_repack_avx512(tn_kern_table *t) {
    const tn_cpu *c = tn_cpu_get();
    if (!c->avx512vnni) return;
    const tn_dtype ids[] = {TN_Q4_0_R16,    TN_TQ4G32_R16,  TN_TQ4G64_R16,
                            TN_TQ4G128_R16, TN_TQ4G256_R16, TN_Q8_0_R16,   TN_IQ4_NL_R16};
    const tn_gemm_fn fns[] = {tn_k_gemm_q4_0_r16_q8_0__avx512,    tn_k_gemm_tq4g32_r16_q8_0__avx512,
                              tn_k_gemm_tq4g64_r16_q8_0__avx512,  tn_k_gemm_tq4g128_r16_q8_0__avx512,
                              tn_k_gemm_tq4g256_r16_q8_0__avx512, tn_k_gemm_q8_0_r16_q8_0__avx512,
                              tn_k_gemm_iq4_nl_r16_q8_0__avx512};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        t->slot[ids[i]].gemm = fns[i];
        t->slot[ids[i]].gemm_isa = TN_ISA_AVX512;
        t->slot[ids[i]].gemm_nrow = TN_R16_NROW;
    }
}
