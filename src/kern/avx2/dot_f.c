/*
 * dot_f.c (avx2) — vec_dot and gemm for the plain float types: f32 x f32, f16 x f16 (F16C) and
 * bf16 x bf16 (widened by a 16-bit shift, exact). Products are accumulated in f32 with FMA, 8
 * lanes per accumulator; the scalar references accumulate sequentially (in double for f16 and
 * bf16), so results differ by float reassociation only.
 *
 * Any k works: the last k % 8 elements are copied into a zero-padded vector.
 */
#include "kern/avx2/kernels.h"
#include "kern/avx2/simd.h"

#define TN_ISA avx2
#define TN_UNROLL _Pragma("GCC unroll 16")
#define TN_F_RM 4  /* weight rows per tile                  */
#define TN_F_RN 3  /* activation rows per tile              */
#define TN_F_RM1 4 /* weight rows per decode pass (n == 1)  */

/* 8 elements from p[l..l+8) as f32 */
TN_INLINE __m256 tn_ld_f32(const void *p, int64_t l) { return _mm256_loadu_ps((const float *)p + l); }
TN_INLINE __m256 tn_ld_f16(const void *p, int64_t l) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + l)));
}
TN_INLINE __m256 tn_ld_bf16(const void *p, int64_t l) {
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + l));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The r < 8 elements p[l..l+r) in a zero-padded copy (zeros add nothing to the dot). */
#define TN_TAIL(LD, ES, p, l, r, out)                                                                                  \
    do {                                                                                                               \
        _Alignas(32) uint8_t tb_[32] = {0};                                                                            \
        memcpy(tb_, (const uint8_t *)(p) + (size_t)(l) * (ES), (size_t)(r) * (ES));                                    \
        (out) = LD(tb_, 0);                                                                                            \
    } while (0)

typedef void (*tn_f_tile_fn)(int64_t k, const uint8_t *w, size_t w_rb, const uint8_t *x, size_t x_rb, float *y,
                             int64_t ldy);

#define TN_F_AMAX (TN_F_RM > TN_F_RM1 ? TN_F_RM : TN_F_RM1)

#define TN_F_TILE(T, ES)                                                                                               \
    TN_INLINE void tn_##T##_ftile(const int RM, const int RN, int64_t k, const uint8_t *w, size_t w_rb,                \
                                  const uint8_t *x, size_t x_rb, float *y, int64_t ldy) {                              \
        __m256 acc[TN_F_AMAX][TN_F_RN];                                                                                \
        TN_UNROLL for (int i = 0; i < RM; i++) TN_UNROLL for (int j = 0; j < RN; j++) acc[i][j] =                      \
            _mm256_setzero_ps();                                                                                       \
        int64_t l = 0;                                                                                                 \
        for (; l + 8 <= k; l += 8) {                                                                                   \
            __m256 xv[TN_F_RN];                                                                                        \
            TN_UNROLL for (int j = 0; j < RN; j++) xv[j] = tn_ld_##T(x + j * x_rb, l);                                 \
            TN_UNROLL for (int i = 0; i < RM; i++) {                                                                   \
                const __m256 wv = tn_ld_##T(w + i * w_rb, l);                                                          \
                TN_UNROLL for (int j = 0; j < RN; j++) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);              \
            }                                                                                                          \
        }                                                                                                              \
        if (l < k) {                                                                                                   \
            __m256 xv[TN_F_RN];                                                                                        \
            TN_UNROLL for (int j = 0; j < RN; j++) TN_TAIL(tn_ld_##T, ES, x + j * x_rb, l, k - l, xv[j]);              \
            TN_UNROLL for (int i = 0; i < RM; i++) {                                                                   \
                __m256 wv;                                                                                             \
                TN_TAIL(tn_ld_##T, ES, w + i * w_rb, l, k - l, wv);                                                    \
                TN_UNROLL for (int j = 0; j < RN; j++) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);              \
            }                                                                                                          \
        }                                                                                                              \
        TN_UNROLL for (int j = 0; j < RN; j++) {                                                                       \
            int i = 0;                                                                                                 \
            TN_UNROLL for (; i + 4 <= RM; i += 4) _mm_storeu_ps(                                                       \
                y + j * ldy + i, tn_hsum4_ps256(acc[i][j], acc[i + 1][j], acc[i + 2][j], acc[i + 3][j]));              \
            TN_UNROLL for (; i < RM; i++) y[j * ldy + i] = tn_hsum_ps256(acc[i][j]);                                   \
        }                                                                                                              \
    }                                                                                                                  \
    /* One row pair: four independent accumulators hide the FMA latency. */                                           \
    TN_INLINE float tn_##T##_fdot(int64_t k, const uint8_t *w, const uint8_t *x) {                                    \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                                    \
        int64_t l = 0;                                                                                                 \
        for (; l + 32 <= k; l += 32) {                                                                                 \
            a0 = _mm256_fmadd_ps(tn_ld_##T(w, l), tn_ld_##T(x, l), a0);                                                \
            a1 = _mm256_fmadd_ps(tn_ld_##T(w, l + 8), tn_ld_##T(x, l + 8), a1);                                        \
            a2 = _mm256_fmadd_ps(tn_ld_##T(w, l + 16), tn_ld_##T(x, l + 16), a2);                                      \
            a3 = _mm256_fmadd_ps(tn_ld_##T(w, l + 24), tn_ld_##T(x, l + 24), a3);                                      \
        }                                                                                                              \
        for (; l + 8 <= k; l += 8) a0 = _mm256_fmadd_ps(tn_ld_##T(w, l), tn_ld_##T(x, l), a0);                         \
        if (l < k) {                                                                                                   \
            __m256 wv, xv;                                                                                             \
            TN_TAIL(tn_ld_##T, ES, w, l, k - l, wv);                                                                   \
            TN_TAIL(tn_ld_##T, ES, x, l, k - l, xv);                                                                   \
            a1 = _mm256_fmadd_ps(wv, xv, a1);                                                                          \
        }                                                                                                              \
        return tn_hsum_ps256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));                             \
    }                                                                                                                  \
    TN_NOINLINE void tn_##T##_ffull(int64_t k, const uint8_t *w, size_t w_rb, const uint8_t *x, size_t x_rb, float *y, \
                                    int64_t ldy) {                                                                     \
        tn_##T##_ftile(TN_F_RM, TN_F_RN, k, w, w_rb, x, x_rb, y, ldy);                                                 \
    }                                                                                                                  \
    TN_NOINLINE void tn_##T##_frow1(int64_t k, const uint8_t *w, size_t w_rb, const uint8_t *x, size_t x_rb, float *y, \
                                    int64_t ldy) {                                                                     \
        tn_##T##_ftile(1, TN_F_RN, k, w, w_rb, x, x_rb, y, ldy);                                                       \
    }                                                                                                                  \
    TN_NOINLINE void tn_##T##_fcol1(int64_t k, const uint8_t *w, size_t w_rb, const uint8_t *x, size_t x_rb, float *y, \
                                    int64_t ldy) {                                                                     \
        tn_##T##_ftile(TN_F_RM, 1, k, w, w_rb, x, x_rb, y, ldy);                                                       \
    }                                                                                                                  \
    TN_NOINLINE void tn_##T##_fcol2(int64_t k, const uint8_t *w, size_t w_rb, const uint8_t *x, size_t x_rb, float *y, \
                                    int64_t ldy) {                                                                     \
        tn_##T##_ftile(TN_F_RM, 2, k, w, w_rb, x, x_rb, y, ldy);                                                       \
    }                                                                                                                  \
    TN_NOINLINE void tn_##T##_fgemv(int64_t k, const uint8_t *w, size_t w_rb, const uint8_t *x, size_t x_rb, float *y, \
                                    int64_t ldy) {                                                                     \
        tn_##T##_ftile(TN_F_RM1, 1, k, w, w_rb, x, x_rb, y, ldy);                                                      \
    }                                                                                                                  \
    TN_NOINLINE void tn_##T##_fone(int64_t k, const uint8_t *w, size_t w_rb, const uint8_t *x, size_t x_rb, float *y,  \
                                   int64_t ldy) {                                                                      \
        (void)w_rb, (void)x_rb, (void)ldy;                                                                             \
        *y = tn_##T##_fdot(k, w, x);                                                                                   \
    }                                                                                                                  \
    void TN_KNAME(gemm_##T##_##T)(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x,          \
                                  size_t x_rb, float *y, int64_t ldy) {                                                \
        const tn_f_tile_fn cols[TN_F_RN] = {NULL, tn_##T##_fcol1, tn_##T##_fcol2};                                     \
        tn_f_gemm(k, m, n, (const uint8_t *)w, w_rb, (const uint8_t *)x, x_rb, y, ldy, tn_##T##_ffull,                 \
                  tn_##T##_frow1, cols, tn_##T##_fgemv, tn_##T##_fone);                                                \
    }                                                                                                                  \
    void TN_KNAME(vec_dot_##T##_##T)(int64_t k, float *s, const void *w, const void *x) {                              \
        *s = tn_##T##_fdot(k, (const uint8_t *)w, (const uint8_t *)x);                                                 \
    }

/* Blocking as in dot_q.inc: activation rows in L2-sized chunks, a weight tile stays in L1. */
#define TN_F_XCHUNK_BYTES (256 * 1024)

TN_INLINE void tn_f_gemm(int64_t k, int64_t m, int64_t n, const uint8_t *w, size_t w_rb, const uint8_t *x,
                         size_t x_rb, float *y, int64_t ldy, tn_f_tile_fn full, tn_f_tile_fn row1,
                         const tn_f_tile_fn *cols, tn_f_tile_fn gemv, tn_f_tile_fn one) {
    if (n == 1) {
        int64_t i = 0;
        for (; i + TN_F_RM1 <= m; i += TN_F_RM1) gemv(k, w + i * w_rb, w_rb, x, x_rb, y + i, ldy);
        for (; i < m; i++) one(k, w + i * w_rb, w_rb, x, x_rb, y + i, ldy);
        return;
    }
    int64_t chunk = (int64_t)(TN_F_XCHUNK_BYTES / (x_rb ? x_rb : 1)) / TN_F_RN * TN_F_RN;
    if (chunk < TN_F_RN) chunk = TN_F_RN;
    for (int64_t j0 = 0; j0 < n; j0 += chunk) {
        const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
        const int64_t jf = j0 + (j1 - j0) / TN_F_RN * TN_F_RN;
        int64_t i = 0;
        for (; i + TN_F_RM <= m; i += TN_F_RM) {
            for (int64_t j = j0; j < jf; j += TN_F_RN)
                full(k, w + i * w_rb, w_rb, x + j * x_rb, x_rb, y + j * ldy + i, ldy);
            /* the n % RN last columns in one tile: each weight row is read once per chunk */
            if (jf < j1) cols[j1 - jf](k, w + i * w_rb, w_rb, x + jf * x_rb, x_rb, y + jf * ldy + i, ldy);
        }
        for (; i < m; i++) {
            for (int64_t j = j0; j < jf; j += TN_F_RN)
                row1(k, w + i * w_rb, w_rb, x + j * x_rb, x_rb, y + j * ldy + i, ldy);
            for (int64_t j = jf; j < j1; j++) one(k, w + i * w_rb, w_rb, x + j * x_rb, x_rb, y + j * ldy + i, ldy);
        }
    }
}

TN_F_TILE(f32, 4)
TN_F_TILE(f16, 2)
TN_F_TILE(bf16, 2)
