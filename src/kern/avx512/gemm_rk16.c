/*
 * gemm_rk16.c (avx512) — tile products for q4_K, q5_K, q6_K, iq4_xs and tq2_0 weights in the load-time *_r16 layouts
 * (quant/repack.h), activations in q8_K, for every batch size: decode, serve steps and prefill.
 *
 * As gemm_r16.c: int32 lane r of every register is row r of a group of 16, so a VPDPBUSD of a
 * 64-byte code register against four activation bytes broadcast to all lanes adds four products
 * to each of the 16 rows, and no horizontal sums are needed. Per sub-block (32 codes for q4_K, 16
 * for q6_K) and activation column the exact integer dot of each row goes through 8 (4) VPDPBUSD
 * and is then multiplied by the row's sub-block scale (one byte load of 16 scales, widened) with
 * one VPMULLD and added up over the block, exactly; per block and column one conversion and one
 * FMA apply d_w * d_x.
 *   q4_K / q5_K: codes 0..15 from the low / high nibbles of the interleaved qs (q5_K: | bit j of
 *     the interleaved qh << 4 for sub-block j: codes 0..31); the min term
 *     dmin * sum_j m_j * (activation sum of sub-block j) is a second exact integer sum, 4 VPDPWSSD
 *     of the rows' mins as word pairs against the q8_K block's pair sums, and one more FMA.
 *   q6_K: codes 0..63 rebuilt (nibble of ql | two bits of qh << 4, unsigned); the -32 offset
 *     starts each sub-block's accumulator at -32 * (its activation sum), from q8_K's bsums.
 *   iq4_xs: each nibble through a VPSHUFB into the iq4_nl table + 128 (unsigned); the +128 is
 *     taken off the same way, -128 * (activation sum) at the start of each sub-block's sum.
 *   tq2_0: 2-bit codes by shift and mask, value code - 1: the block's sum starts at -(activation
 *     sum); no sub-block scales. Scales applied in the reference's order (bit for bit). Decode and
 *     pairs (n <= 2) mask the four code fields in place into four accumulators and shift the sums
 *     instead of the codes: one thread, in L2, 20.5 -> 33.9 GB/s; from DRAM 15.9 -> 22.5.
 * The unpacking of a block's codes is shared by up to 8 columns per pass; a group's rows are read
 * once per block of TN_RK16_CB columns and from cache by the later passes.
 * q6_K decode and small batches (n <= 4) have their own tile (tn_rk16_chunk_q6K): every code byte
 * loaded once, constant shifts, the chunk ahead prefetched a few lines per step. At n = 1 every
 * type reads two groups far apart together (tn_rk16_gemm2: two streams, as the file layout's gemv
 * does with two rows), prefetching a few lines per step. Measured on a 2-core Xeon (1 thread,
 * 2048 x 8192, 40 copies: from DRAM, best of 120 calls each, alternating with the file layout's
 * gemv, 2026-11-27, loaded machine: +-10%): q6_K 0.42x of the gemv -> 0.94-1.05x (k = 2048: 0.86-0.92x; in L2 1.55x),
 * q4_K 0.80x -> 1.35-1.39x.
 *
 * Integer sums are exact; only the float rounding differs from the references (per block, one
 * FMA on d_w * d_x instead of the references' per-lane products in their order).
 */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "core/fp16.h"
#include "kern/kern.h"
#include "quant/blocks.h"
#include "quant/repack.h"

#define TN_RK16_NC 8       /* columns per pass */
#define TN_RK16_CB 64      /* columns per block: a group's rows stay in cache across its passes */
#define TN_RK16_PF 4096 /* software prefetch distance, bytes: at least one q6_K_r16 chunk (3360) ahead */
#define TN_RK16_NROW (1 << 30) /* every batch size: whole thread ranges (kern.h gemm_nrow) */

static inline __m512i tn_rk16_bcast(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* 16 bytes at p as int32 lanes: unsigned (q4_K) or signed (q6_K) */
static inline __m512i tn_rk16_u8(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline __m512i tn_rk16_i8(const uint8_t *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }

/* One line into L1. As an asm statement: GCC 12 deleted the loop of _mm_prefetch calls over a chunk
 * (36 / 53 lines, not unrolled) as free of side effects, which left every tile here without
 * software prefetch (objdump showed none). */
static inline void tn_rk16_prefetch_line(const uint8_t *p) { __asm__ volatile("prefetcht0 %0" : : "m"(*p)); }
/* One line into L2 (prefetcht1): the K-quant decode tiles. Their chunks are read in several
 * interleaved runs (q6_K: ql, ql + 512, qh), which the hardware prefetchers do not follow, and a
 * core has more misses to L2 in flight than to L1: one thread from DRAM (8192 x 2048, Zen 4,
 * 2026-11-28), against the file layout's gemv in the same run: q6_K_r16 0.57x -> 0.79-0.83x,
 * q4_K_r16 0.94x -> 1.27x, q5_K_r16 +10%; iq4_xs_r16 and tq2_0_r16 keep prefetcht0 (tq2_0_r16:
 * 15.9 -> 11.9 GB/s with prefetcht1). */
static inline void tn_rk16_prefetch_l2(const uint8_t *p) { __asm__ volatile("prefetcht1 %0" : : "m"(*p)); }

/* The chunk TN_RK16_PF bytes ahead of ch (cb bytes), in one burst: the prefill tiles, where each
 * chunk's arithmetic is long enough to hide it. */
static inline void tn_rk16_prefetch(const uint8_t *ch, size_t cb) {
    for (size_t l = 0; l < cb; l += 64) tn_rk16_prefetch_line(ch + TN_RK16_PF + l);
}

/* q4_K (Q5: q5_K): chunk ch (block b of a group's 16 rows) against NC columns into acc[c]. SPREAD:
 * the chunk ahead prefetched a few lines per sub-block step (decode) instead of in one burst. */
static inline __attribute__((always_inline)) void tn_rk16_chunk_k4(const int NC, const bool Q5, const bool SPREAD,
                                                                    const uint8_t *ch, int64_t b, const uint8_t *x,
                                                                    size_t x_rb, __m512 *acc) {
    const size_t cb = TN_R16_ROWS * (Q5 ? sizeof(block_q5_K) : sizeof(block_q4_K));
    const __m512i m4 = _mm512_set1_epi8(0x0F), m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15);
    const __m512i m10 = _mm512_set1_epi8(0x10);
    const int LP = (int)((cb / 64 + 7) / 8);
    if (!SPREAD) tn_rk16_prefetch(ch, cb);
    __m512i isum[TN_RK16_NC];
    for (int c = 0; c < NC; c++) isum[c] = _mm512_setzero_si512();
    for (int j = 0; j < 8; j++) {
        if (SPREAD) /* ceil(lines / 8) lines per step: 5 (q4_K), 6 (q5_K) */
            for (int l = LP * j; l < LP * (j + 1); l++)
                if (64 * l < (int)cb) tn_rk16_prefetch_l2(ch + TN_RK16_PF + 64 * l);
        const uint8_t *P = ch + (Q5 ? TN_R16_Q5K_QS : TN_R16_Q4K_QS) + 512 * (j / 2);
        __m512i q[8];
        for (int u = 0; u < 8; u++) {
            const __m512i v = _mm512_loadu_si512(P + 64 * u);
            q[u] = _mm512_and_si512(j % 2 ? _mm512_srli_epi16(v, 4) : v, m4);
            if (Q5) { /* bit j of each qh byte to bit 4 */
                const __m512i hb = _mm512_loadu_si512(ch + TN_R16_Q5K_QH + 64 * u);
                const __m512i hs = j < 4 ? _mm512_slli_epi16(hb, 4 - j) : _mm512_srli_epi16(hb, j - 4);
                q[u] = _mm512_or_si512(q[u], _mm512_and_si512(hs, m10));
            }
        }
        const __m512i sc = _mm512_and_si512(tn_rk16_u8(ch + TN_R16_Q4K_SC + 16 * j), m63);
        for (int c = 0; c < NC; c++) {
            const int8_t *xq = ((const block_q8_K *)(x + (size_t)c * x_rb))[b].qs + 32 * j;
            __m512i t = _mm512_setzero_si512();
            for (int u = 0; u < 8; u++) t = _mm512_dpbusd_epi32(t, q[u], tn_rk16_bcast(xq + 4 * u));
            isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(t, sc));
        }
    }
    /* mins as word pairs (min 2p | min 2p+1 << 16) of every row */
    __m512i mp[4];
    for (int p = 0; p < 4; p++) {
        const __m512i lo = tn_rk16_u8(ch + TN_R16_Q4K_MN + 16 * p);
        const __m512i h0 = _mm512_srli_epi32(tn_rk16_u8(ch + TN_R16_Q4K_SC + 32 * p), 6);
        const __m512i h1 = _mm512_srli_epi32(tn_rk16_u8(ch + TN_R16_Q4K_SC + 32 * p + 16), 6);
        const __m512i m0 = _mm512_or_si512(_mm512_and_si512(lo, m15), _mm512_slli_epi32(h0, 4));
        const __m512i m1 = _mm512_or_si512(_mm512_srli_epi32(lo, 4), _mm512_slli_epi32(h1, 4));
        mp[p] = _mm512_or_si512(m0, _mm512_slli_epi32(m1, 16));
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)ch));
    const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ch + 32)));
    for (int c = 0; c < NC; c++) {
        const block_q8_K *xb = &((const block_q8_K *)(x + (size_t)c * x_rb))[b];
        __m512i ms = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {
            const uint32_t s0 = (uint16_t)(xb->bsums[4 * p] + xb->bsums[4 * p + 1]);
            const uint32_t s1 = (uint16_t)(xb->bsums[4 * p + 2] + xb->bsums[4 * p + 3]);
            ms = _mm512_dpwssd_epi32(ms, mp[p], _mm512_set1_epi32((int32_t)(s0 | s1 << 16)));
        }
        const __m512 dx = _mm512_set1_ps(xb->d);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(dw, dx), acc[c]);
        acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(dm, dx), acc[c]);
    }
}

/* iq4_xs: chunk ch (block b of a group's 16 rows) against NC columns into acc[c]. Each nibble
 * goes through one VPSHUFB into the iq4_nl table + 128 (1..241, VPDPBUSD's unsigned operand); the
 * 128 * (activation sum) that adds is where each sub-block's accumulator starts, negated, from
 * q8_K's bsums (as q6_K's -32). The 6-bit scale ls of sub-block j (low 4 bits from the scales_l
 * bytes, high 2 from scales_h) becomes ls - 32 for one VPMULLD per sub-block and column. SPREAD:
 * the chunk ahead prefetched a few lines per sub-block step (decode). */
static inline __attribute__((always_inline)) void tn_rk16_chunk_iq4(const int NC, const bool SPREAD, const uint8_t *ch,
                                                                     int64_t b, const uint8_t *x, size_t x_rb,
                                                                     __m512 *acc) {
    const size_t cb = TN_R16_ROWS * sizeof(block_iq4_xs);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m15 = _mm512_set1_epi32(15), m3 = _mm512_set1_epi32(3);
    const __m512i c32 = _mm512_set1_epi32(32);
    const __m512i kv = _mm512_broadcast_i32x4(_mm_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141, (char)153,
                                                            (char)166, (char)181, (char)197, (char)217, (char)241));
    const int LP = (int)((cb / 64 + 7) / 8);
    if (!SPREAD) tn_rk16_prefetch(ch, cb);
    const block_q8_K *xb[TN_RK16_NC];
    __m512i isum[TN_RK16_NC];
    for (int c = 0; c < NC; c++) {
        xb[c] = &((const block_q8_K *)(x + (size_t)c * x_rb))[b];
        isum[c] = _mm512_setzero_si512();
    }
    for (int j = 0; j < 8; j++) {
        if (SPREAD) /* ceil(lines / 8) = 5 lines per step */
            for (int l = LP * j; l < LP * (j + 1); l++)
                if (64 * l < (int)cb) tn_rk16_prefetch_line(ch + TN_RK16_PF + 64 * l);
        const uint8_t *P = ch + TN_R16_IQ4_QS + 256 * j;
        __m512i lo[4], hi[4];
        for (int u = 0; u < 4; u++) {
            const __m512i v = _mm512_loadu_si512(P + 64 * u);
            lo[u] = _mm512_shuffle_epi8(kv, _mm512_and_si512(v, m4));
            hi[u] = _mm512_shuffle_epi8(kv, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
        }
        const __m512i sl = tn_rk16_u8(ch + TN_R16_IQ4_SL + 16 * (j / 2)), sh = tn_rk16_u8(ch + TN_R16_IQ4_SH + 16 * (j / 4));
        const __m512i ls = _mm512_or_si512(_mm512_and_si512(j % 2 ? _mm512_srli_epi32(sl, 4) : sl, m15),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sh, 2 * (j % 4)), m3), 4));
        const __m512i sc = _mm512_sub_epi32(ls, c32);
        for (int c = 0; c < NC; c++) {
            const int8_t *xq = xb[c]->qs + 32 * j;
            __m512i t = _mm512_set1_epi32(-128 * (xb[c]->bsums[2 * j] + xb[c]->bsums[2 * j + 1]));
            for (int u = 0; u < 4; u++) {
                t = _mm512_dpbusd_epi32(t, lo[u], tn_rk16_bcast(xq + 4 * u));
                t = _mm512_dpbusd_epi32(t, hi[u], tn_rk16_bcast(xq + 16 + 4 * u));
            }
            isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(t, sc));
        }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)ch));
    for (int c = 0; c < NC; c++)
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(dw, _mm512_set1_ps(xb[c]->d)), acc[c]);
}

/* tq2_0: chunk ch (block b of a group's 16 rows) against NC columns into acc[c]. Each of the 16
 * code registers gives four registers of 2-bit codes (NC > 2: shifts by 0, 2, 4, 6 and a mask;
 * NC <= 2: the fields masked in place, below; VPDPBUSD's unsigned operand), whose value is code - 1:
 * the block's integer sum starts at -(activation sum), from q8_K's bsums. The scales are applied as ggml's reference does: (d_x d_w) rounded, times the
 * integer sum rounded, then added (no FMA), so the result equals it bit for bit. SPREAD: the chunk
 * ahead prefetched a line per register (decode). */
static inline __attribute__((always_inline)) void tn_rk16_chunk_tq2(const int NC, const bool SPREAD, const uint8_t *ch,
                                                                     int64_t b, const uint8_t *x, size_t x_rb,
                                                                     __m512 *acc) {
    const size_t cb = TN_R16_ROWS * sizeof(block_tq2_0);
    const __m512i m3 = _mm512_set1_epi8(3);
    if (!SPREAD) tn_rk16_prefetch(ch, cb);
    const block_q8_K *xb[TN_RK16_NC];
    __m512i isum[TN_RK16_NC];
    for (int c = 0; c < NC; c++) {
        xb[c] = &((const block_q8_K *)(x + (size_t)c * x_rb))[b];
        int32_t s = 0;
        for (int j = 0; j < QK_K / 16; j++) s += xb[c]->bsums[j];
        isum[c] = _mm512_set1_epi32(-s);
    }
    if (NC <= 2) {
        /* decode, pairs: the code fields masked in place (v & 3 << 2l: 4^l times the code, at most
         * 192, still VPDPBUSD's unsigned operand) into one accumulator per field, no shifts; each
         * sum is a multiple of 4^l (|sum| <= 16 * 4 * 192 * 128 < 2^21), so an arithmetic shift by 2l
         * divides it exactly */
        __m512i f[TN_RK16_NC][4];
        for (int c = 0; c < NC; c++)
            for (int l = 0; l < 4; l++) f[c][l] = l ? _mm512_setzero_si512() : isum[c];
        for (int u = 0; u < 16; u++) {
            if (SPREAD) tn_rk16_prefetch_line(ch + TN_RK16_PF + 64 * u + (u == 15 ? 64 : 0));
            const __m512i v = _mm512_loadu_si512(ch + TN_R16_TQ2_QS + 64 * u);
            const int w0 = 128 * (u / 8) + 4 * (u % 8);
            for (int l = 0; l < 4; l++) {
                const __m512i q = _mm512_and_si512(v, _mm512_set1_epi8((char)(3 << 2 * l)));
                for (int c = 0; c < NC; c++) f[c][l] = _mm512_dpbusd_epi32(f[c][l], q, tn_rk16_bcast(xb[c]->qs + w0 + 32 * l));
            }
        }
        for (int c = 0; c < NC; c++)
            isum[c] = _mm512_add_epi32(_mm512_add_epi32(f[c][0], _mm512_srai_epi32(f[c][1], 2)),
                                       _mm512_add_epi32(_mm512_srai_epi32(f[c][2], 4), _mm512_srai_epi32(f[c][3], 6)));
    } else {
        for (int u = 0; u < 16; u++) {
            const __m512i v = _mm512_loadu_si512(ch + TN_R16_TQ2_QS + 64 * u);
            __m512i q[4];
            q[0] = _mm512_and_si512(v, m3);
            q[1] = _mm512_and_si512(_mm512_srli_epi16(v, 2), m3);
            q[2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m3);
            q[3] = _mm512_and_si512(_mm512_srli_epi16(v, 6), m3);
            const int w0 = 128 * (u / 8) + 4 * (u % 8);
            for (int c = 0; c < NC; c++)
                for (int l = 0; l < 4; l++) isum[c] = _mm512_dpbusd_epi32(isum[c], q[l], tn_rk16_bcast(xb[c]->qs + w0 + 32 * l));
        }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)ch));
    for (int c = 0; c < NC; c++)
        acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(dw, _mm512_set1_ps(xb[c]->d))));
}

/* The tile (one group of 16 rows x NC columns of nb blocks) and the two-stream decode (groups g0
 * and g1 far apart, one column, chunk by chunk) of a type whose chunk function is
 * tn_rk16_chunk_<name>(NC, SPREAD, ch, b, x, x_rb, acc) with blocks of type BT: iq4_xs, tq2_0. */
#define TN_RK16_TILE_DEC2(name, BT)                                                                                    \
    static inline __attribute__((always_inline)) void tn_rk16_tile_##name(const int NC, const uint8_t *grp, int64_t nb, \
                                                                          const uint8_t *x, size_t x_rb, float *y,     \
                                                                          int64_t ldy) {                               \
        const size_t cb = TN_R16_ROWS * sizeof(BT);                                                                    \
        __m512 acc[TN_RK16_NC];                                                                                        \
        for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();                                                     \
        for (int64_t b = 0; b < nb; b++) tn_rk16_chunk_##name(NC, NC == 1, grp + (size_t)b * cb, b, x, x_rb, acc);    \
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(y + c * ldy, acc[c]);                                            \
    }                                                                                                                  \
    static void tn_rk16_dec2_##name(const uint8_t *g0, const uint8_t *g1, int64_t nb, const uint8_t *x, float *y0,     \
                                    float *y1) {                                                                       \
        const size_t cb = TN_R16_ROWS * sizeof(BT);                                                                    \
        __m512 a0[1] = {_mm512_setzero_ps()}, a1[1] = {_mm512_setzero_ps()};                                           \
        for (int64_t b = 0; b < nb; b++) {                                                                             \
            tn_rk16_chunk_##name(1, true, g0 + (size_t)b * cb, b, x, 0, a0);                                           \
            tn_rk16_chunk_##name(1, true, g1 + (size_t)b * cb, b, x, 0, a1);                                           \
        }                                                                                                              \
        _mm512_storeu_ps(y0, a0[0]);                                                                                   \
        _mm512_storeu_ps(y1, a1[0]);                                                                                   \
    }
TN_RK16_TILE_DEC2(iq4, block_iq4_xs)
TN_RK16_TILE_DEC2(tq2, block_tq2_0)

/* q4_K (Q5: q5_K): one group of 16 rows x NC columns of nb blocks each */
static inline __attribute__((always_inline)) void tn_rk16_tile_k4(const int NC, const bool Q5, const uint8_t *grp,
                                                                   int64_t nb, const uint8_t *x, size_t x_rb, float *y,
                                                                   int64_t ldy) {
    const size_t cb = TN_R16_ROWS * (Q5 ? sizeof(block_q5_K) : sizeof(block_q4_K));
    __m512 acc[TN_RK16_NC];
    for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) tn_rk16_chunk_k4(NC, Q5, NC == 1, grp + (size_t)b * cb, b, x, x_rb, acc);
    for (int c = 0; c < NC; c++) _mm512_storeu_ps(y + c * ldy, acc[c]);
}

/* q4_K (Q5: q5_K), one column: groups g0 and g1 far apart (two streams) chunk by chunk. */
static inline __attribute__((always_inline)) void tn_rk16_dec2_k4(const bool Q5, const uint8_t *g0, const uint8_t *g1,
                                                                   int64_t nb, const uint8_t *x, float *y0, float *y1) {
    const size_t cb = TN_R16_ROWS * (Q5 ? sizeof(block_q5_K) : sizeof(block_q4_K));
    __m512 a0[1] = {_mm512_setzero_ps()}, a1[1] = {_mm512_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        tn_rk16_chunk_k4(1, Q5, true, g0 + (size_t)b * cb, b, x, 0, a0);
        tn_rk16_chunk_k4(1, Q5, true, g1 + (size_t)b * cb, b, x, 0, a1);
    }
    _mm512_storeu_ps(y0, a0[0]);
    _mm512_storeu_ps(y1, a1[0]);
}

/* q6_K, decode and small batches (NC <= 4): one chunk (block b of a group's 16 rows) into acc[c].
 * Each code byte is loaded and rebuilt once: per half h and register u the two ql registers (low
 * nibbles: e = 0, 1; high: e = 2, 3) and the qh register (bit pair e) give all four code
 * registers e at once, every shift has a constant count, and 4 * NC accumulators (one per code
 * register and column) keep the VPDPBUSD chains independent. */
static inline __attribute__((always_inline)) void tn_rk16_chunk_q6K(const int NC, const uint8_t *ch, int64_t b,
                                                                     const uint8_t *x, size_t x_rb, __m512 acc[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const block_q8_K *xb[4];
    __m512i isum[4];
    for (int c = 0; c < NC; c++) {
        xb[c] = &((const block_q8_K *)(x + (size_t)c * x_rb))[b];
        isum[c] = _mm512_setzero_si512();
    }
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 2; s++) { /* registers u = 4s .. 4s + 3: sub-blocks 8h + 2e + s */
            __m512i t[4][4];
            for (int e = 0; e < 4; e++)
                for (int c = 0; c < NC; c++) t[e][c] = _mm512_set1_epi32(-32 * xb[c]->bsums[8 * h + 2 * e + s]);
            for (int u = 4 * s; u < 4 * s + 4; u++) {
                for (int l = 4 * (8 * h + u); l < 4 * (8 * h + u) + 4; l++) /* the chunk ahead, spread over the loop */
                    if (64 * l < (int)(TN_R16_ROWS * sizeof(block_q6_K)))
                        tn_rk16_prefetch_l2(ch + TN_RK16_PF + 64 * l);
                const __m512i l0 = _mm512_loadu_si512(ch + TN_R16_Q6K_QL + 1024 * h + 64 * u);
                const __m512i l1 = _mm512_loadu_si512(ch + TN_R16_Q6K_QL + 1024 * h + 512 + 64 * u);
                const __m512i hb = _mm512_loadu_si512(ch + TN_R16_Q6K_QH + 512 * h + 64 * u);
                __m512i q[4];
                q[0] = _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30));
                q[1] = _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(_mm512_slli_epi16(hb, 2), m30));
                q[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), _mm512_and_si512(hb, m30));
                q[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
                                       _mm512_and_si512(_mm512_srli_epi16(hb, 2), m30));
                for (int e = 0; e < 4; e++)
                    for (int c = 0; c < NC; c++)
                        t[e][c] = _mm512_dpbusd_epi32(t[e][c], q[e],
                                                      tn_rk16_bcast(xb[c]->qs + 128 * h + 32 * e + 4 * u));
            }
            for (int e = 0; e < 4; e++) {
                const __m512i sc = tn_rk16_i8(ch + TN_R16_Q6K_SC + 16 * (8 * h + 2 * e + s));
                for (int c = 0; c < NC; c++) isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(t[e][c], sc));
            }
        }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)ch));
    for (int c = 0; c < NC; c++)
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(dw, _mm512_set1_ps(xb[c]->d)), acc[c]);
}

static inline __attribute__((always_inline)) void tn_rk16_dec_q6K(const int NC, const uint8_t *grp, int64_t nb,
                                                                   const uint8_t *x, size_t x_rb, float *y,
                                                                   int64_t ldy) {
    __m512 acc[4];
    for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    const size_t cb = TN_R16_ROWS * sizeof(block_q6_K);
    for (int64_t b = 0; b < nb; b++) tn_rk16_chunk_q6K(NC, grp + (size_t)b * cb, b, x, x_rb, acc);
    for (int c = 0; c < NC; c++) _mm512_storeu_ps(y + c * ldy, acc[c]);
}

/* q6_K, one column: groups g0 and g1 (far apart: two sequential streams, as the file layout's gemv
 * reads rows i and i + m/2) chunk by chunk. */
static void tn_rk16_dec2_q6K(const uint8_t *g0, const uint8_t *g1, int64_t nb, const uint8_t *x, float *y0,
                             float *y1) {
    const size_t cb = TN_R16_ROWS * sizeof(block_q6_K);
    __m512 a0[4] = {_mm512_setzero_ps()}, a1[4] = {_mm512_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        tn_rk16_chunk_q6K(1, g0 + (size_t)b * cb, b, x, 0, a0);
        tn_rk16_chunk_q6K(1, g1 + (size_t)b * cb, b, x, 0, a1);
    }
    _mm512_storeu_ps(y0, a0[0]);
    _mm512_storeu_ps(y1, a1[0]);
}

/* q6_K: one group of 16 rows x NC columns (NC <= 4: tn_rk16_dec_q6K) */
static inline __attribute__((always_inline)) void tn_rk16_tile_q6K(const int NC, const uint8_t *grp, int64_t nb,
                                                                    const uint8_t *x, size_t x_rb, float *y,
                                                                    int64_t ldy) {
    if (NC <= 4) {
        tn_rk16_dec_q6K(NC, grp, nb, x, x_rb, y, ldy);
        return;
    }
    const size_t cb = TN_R16_ROWS * sizeof(block_q6_K);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[TN_RK16_NC];
    for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *ch = grp + (size_t)b * cb;
        tn_rk16_prefetch(ch, cb);
        __m512i isum[TN_RK16_NC];
        for (int c = 0; c < NC; c++) isum[c] = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 4; e++) { /* codes 128h + 32e + (0..31): sub-blocks j0, j0 + 1 */
                const uint8_t *L = ch + TN_R16_Q6K_QL + 512 * (2 * h + e % 2), *H = ch + TN_R16_Q6K_QH + 512 * h;
                __m512i q[8];
                for (int u = 0; u < 8; u++) {
                    const __m512i l = _mm512_loadu_si512(L + 64 * u), hb = _mm512_loadu_si512(H + 64 * u);
                    const __m512i lo = _mm512_and_si512(e / 2 ? _mm512_srli_epi16(l, 4) : l, m4);
                    /* bits 2e, 2e + 1 of each qh byte to bits 4, 5 */
                    const __m512i hs = e < 2 ? _mm512_slli_epi16(hb, 4 - 2 * e) : _mm512_srli_epi16(hb, 2 * e - 4);
                    q[u] = _mm512_or_si512(lo, _mm512_and_si512(hs, m30));
                }
                const int j0 = 8 * h + 2 * e;
                const __m512i s0 = tn_rk16_i8(ch + TN_R16_Q6K_SC + 16 * j0);
                const __m512i s1 = tn_rk16_i8(ch + TN_R16_Q6K_SC + 16 * (j0 + 1));
                for (int c = 0; c < NC; c++) {
                    const block_q8_K *xb = &((const block_q8_K *)(x + (size_t)c * x_rb))[b];
                    const int8_t *xq = xb->qs + 128 * h + 32 * e;
                    __m512i t0 = _mm512_set1_epi32(-32 * xb->bsums[j0]);
                    __m512i t1 = _mm512_set1_epi32(-32 * xb->bsums[j0 + 1]);
                    for (int u = 0; u < 4; u++) {
                        t0 = _mm512_dpbusd_epi32(t0, q[u], tn_rk16_bcast(xq + 4 * u));
                        t1 = _mm512_dpbusd_epi32(t1, q[4 + u], tn_rk16_bcast(xq + 16 + 4 * u));
                    }
                    isum[c] = _mm512_add_epi32(isum[c], _mm512_add_epi32(_mm512_mullo_epi32(t0, s0), _mm512_mullo_epi32(t1, s1)));
                }
            }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)ch));
        for (int c = 0; c < NC; c++) {
            const __m512 dx = _mm512_set1_ps(((const block_q8_K *)(x + (size_t)c * x_rb))[b].d);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(dw, dx), acc[c]);
        }
    }
    for (int c = 0; c < NC; c++) _mm512_storeu_ps(y + c * ldy, acc[c]);
}

typedef void (*tn_rk16_tile_fn)(const uint8_t *, int64_t, const uint8_t *, size_t, float *, int64_t);

static inline __attribute__((always_inline)) void tn_rk16_tile_q4K(const int NC, const uint8_t *grp, int64_t nb,
                                                                    const uint8_t *x, size_t x_rb, float *y,
                                                                    int64_t ldy) {
    tn_rk16_tile_k4(NC, false, grp, nb, x, x_rb, y, ldy);
}
static inline __attribute__((always_inline)) void tn_rk16_tile_q5K(const int NC, const uint8_t *grp, int64_t nb,
                                                                    const uint8_t *x, size_t x_rb, float *y,
                                                                    int64_t ldy) {
    tn_rk16_tile_k4(NC, true, grp, nb, x, x_rb, y, ldy);
}

#define TN_RK16_TILE_FN(name, NC)                                                                                      \
    static void tn_rk16_tile_##name##_##NC(const uint8_t *grp, int64_t nb, const uint8_t *x, size_t x_rb, float *y,   \
                                           int64_t ldy) {                                                              \
        tn_rk16_tile_##name(NC, grp, nb, x, x_rb, y, ldy);                                                             \
    }
#define TN_RK16_TILES(name)                                                                                            \
    TN_RK16_TILE_FN(name, 1)                                                                                           \
    TN_RK16_TILE_FN(name, 2)                                                                                           \
    TN_RK16_TILE_FN(name, 3)                                                                                           \
    TN_RK16_TILE_FN(name, 4)                                                                                           \
    TN_RK16_TILE_FN(name, 5)                                                                                           \
    TN_RK16_TILE_FN(name, 6)                                                                                           \
    TN_RK16_TILE_FN(name, 7)                                                                                           \
    TN_RK16_TILE_FN(name, 8)                                                                                           \
    static const tn_rk16_tile_fn tn_rk16_tiles_##name[TN_RK16_NC + 1] = {                                              \
        NULL, tn_rk16_tile_##name##_1, tn_rk16_tile_##name##_2, tn_rk16_tile_##name##_3, tn_rk16_tile_##name##_4,      \
        tn_rk16_tile_##name##_5, tn_rk16_tile_##name##_6, tn_rk16_tile_##name##_7, tn_rk16_tile_##name##_8};
TN_RK16_TILES(q4K)
TN_RK16_TILES(q5K)
TN_RK16_TILES(q6K)
TN_RK16_TILES(iq4)
TN_RK16_TILES(tq2)

static void tn_rk16_gemm(const tn_rk16_tile_fn *tiles, int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,
                         const void *x, size_t x_rb, float *y, int64_t ldy) {
    const int64_t nb = k / QK_K;
    for (int64_t j0 = 0; j0 < n; j0 += TN_RK16_CB) {
        const int64_t nj = n - j0 < TN_RK16_CB ? n - j0 : TN_RK16_CB;
        const uint8_t *xj = (const uint8_t *)x + (size_t)j0 * x_rb;
        for (int64_t g = 0; g < m / TN_R16_ROWS; g++) {
            const uint8_t *grp = (const uint8_t *)w + (size_t)g * TN_R16_ROWS * w_rb;
            for (int64_t c0 = 0; c0 < nj; c0 += TN_RK16_NC) {
                const int nc = (int)(nj - c0 < TN_RK16_NC ? nj - c0 : TN_RK16_NC);
                tiles[nc](grp, nb, xj + (size_t)c0 * x_rb, x_rb, y + (j0 + c0) * ldy + g * TN_R16_ROWS, ldy);
            }
        }
    }
}

typedef void (*tn_rk16_dec2_fn)(const uint8_t *, const uint8_t *, int64_t, const uint8_t *, float *, float *);

static void tn_rk16_dec2_q4K(const uint8_t *g0, const uint8_t *g1, int64_t nb, const uint8_t *x, float *y0, float *y1) {
    tn_rk16_dec2_k4(false, g0, g1, nb, x, y0, y1);
}
static void tn_rk16_dec2_q5K(const uint8_t *g0, const uint8_t *g1, int64_t nb, const uint8_t *x, float *y0, float *y1) {
    tn_rk16_dec2_k4(true, g0, g1, nb, x, y0, y1);
}

/* Every batch size; one column (n = 1): groups g and g + h (h = ceil(groups / 2)) together
 * through dec2 (two streams), ng odd: the middle group alone. */
static void tn_rk16_gemm2(const tn_rk16_tile_fn *tiles, tn_rk16_dec2_fn dec2, int64_t k, int64_t m, int64_t n,
                          const void *w, size_t w_rb, const void *x, size_t x_rb, float *y, int64_t ldy) {
    const int64_t ng = m / TN_R16_ROWS, h = (ng + 1) / 2, gb = TN_R16_ROWS * (int64_t)w_rb;
    if (n > 1 || ng < 2) {
        tn_rk16_gemm(tiles, k, m, n, w, w_rb, x, x_rb, y, ldy);
        return;
    }
    for (int64_t g = 0; g < ng - h; g++)
        dec2((const uint8_t *)w + g * gb, (const uint8_t *)w + (g + h) * gb, k / QK_K, x, y + g * TN_R16_ROWS,
             y + (g + h) * TN_R16_ROWS);
    if (ng - h < h) tiles[1]((const uint8_t *)w + (h - 1) * gb, k / QK_K, x, x_rb, y + (h - 1) * TN_R16_ROWS, ldy);
}

static void tn_k_gemm_q4_K_r16_q8_K__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,
                                            const void *x, size_t x_rb, float *y, int64_t ldy) {
    tn_rk16_gemm2(tn_rk16_tiles_q4K, tn_rk16_dec2_q4K, k, m, n, w, w_rb, x, x_rb, y, ldy);
}
static void tn_k_gemm_q5_K_r16_q8_K__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,
                                            const void *x, size_t x_rb, float *y, int64_t ldy) {
    tn_rk16_gemm2(tn_rk16_tiles_q5K, tn_rk16_dec2_q5K, k, m, n, w, w_rb, x, x_rb, y, ldy);
}
static void tn_k_gemm_q6_K_r16_q8_K__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,
                                            const void *x, size_t x_rb, float *y, int64_t ldy) {
    tn_rk16_gemm2(tn_rk16_tiles_q6K, tn_rk16_dec2_q6K, k, m, n, w, w_rb, x, x_rb, y, ldy);
}

static void tn_k_gemm_iq4_xs_r16_q8_K__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,
                                              const void *x, size_t x_rb, float *y, int64_t ldy) {
    tn_rk16_gemm2(tn_rk16_tiles_iq4, tn_rk16_dec2_iq4, k, m, n, w, w_rb, x, x_rb, y, ldy);
}

static void tn_k_gemm_tq2_0_r16_q8_K__avx512(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb,
                                             const void *x, size_t x_rb, float *y, int64_t ldy) {
    tn_rk16_gemm2(tn_rk16_tiles_tq2, tn_rk16_dec2_tq2, k, m, n, w, w_rb, x, x_rb, y, ldy);
}

void tn_kern_register_repack_k_avx512(tn_kern_table *t) {
    const tn_cpu *c = tn_cpu_get();
    if (!c->avx512vnni) return;
    /* tq1_0_r16 is tq2_0_r16's layout (tq1_0's trits as 2-bit codes) */
    const tn_dtype ids[] = {TN_Q4_K_R16, TN_Q5_K_R16, TN_Q6_K_R16, TN_IQ4_XS_R16, TN_TQ2_0_R16, TN_TQ1_0_R16};
    const tn_gemm_fn fns[] = {tn_k_gemm_q4_K_r16_q8_K__avx512,   tn_k_gemm_q5_K_r16_q8_K__avx512,
                              tn_k_gemm_q6_K_r16_q8_K__avx512,   tn_k_gemm_iq4_xs_r16_q8_K__avx512,
                              tn_k_gemm_tq2_0_r16_q8_K__avx512, tn_k_gemm_tq2_0_r16_q8_K__avx512};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        t->slot[ids[i]].gemm = fns[i];
        t->slot[ids[i]].gemm_isa = TN_ISA_AVX512;
        t->slot[ids[i]].gemm_nrow = TN_RK16_NROW;
    }
}
