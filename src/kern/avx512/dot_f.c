/*
 * dot_f.c (avx512) — vec_dot and gemm for the plain float types with 512-bit vectors: f32 x f32
 * with FMA; bf16 x bf16 with AVX512-BF16
 * vdpbf16ps (pairs of exact bf16 products added into f32; the instruction treats subnormal inputs
 * and outputs as zero). Results differ from the scalar references by float reassociation only
 * (and, for bf16, by flushed subnormals). f16 x f16 stays on the avx2 kernel: a 512-bit version
 * (vcvtph2ps zmm + FMA) measured slower on Zen 4 (gemm ~96 vs ~108 GFLOP/s).
 *
 * Any k works: the tail is read with masked loads (masked-off lanes are zero).
 */
#include "kern/avx2/simd.h"
#include "kern/avx512/kernels.h"

#define TN_ISA avx512
#define TN_UNROLL _Pragma("GCC unroll 16")
#define TN_F_RM 4 /* weight rows per tile; 4 + 4 row streams: float rows are often 2^n bytes apart,
                     and more streams than L1 ways on one set thrash */
#define TN_F_RN 4  /* activation rows per tile             */
#define TN_F_RM1 4 /* weight rows per decode pass (n == 1) */
#define TN_F_AMAX (TN_F_RM > TN_F_RM1 ? TN_F_RM : TN_F_RM1)

/* Per type: elements per step (EL), the full step load and the masked tail load as __m512
 * operands of STEP(acc, w, x). */
#define TN_EL_f32 16
#define TN_EL_bf16 32
/* m == all lanes takes the plain load (a constant after inlining in the main loops). */
TN_INLINE __m512 tn_ld_f32(const void *p, int64_t l, __mmask32 m) {
    if (m == 0xFFFF) return _mm512_loadu_ps((const float *)p + l);
    return _mm512_maskz_loadu_ps((__mmask16)m, (const float *)p + l);
}
/* bf16: 32 raw halves in a 512-bit register, consumed by vdpbf16ps */
TN_INLINE __m512 tn_ld_bf16(const void *p, int64_t l, __mmask32 m) {
    if (m == 0xFFFFFFFFu) return _mm512_castsi512_ps(_mm512_loadu_si512((const uint16_t *)p + l));
    return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, (const uint16_t *)p + l));
}
TN_INLINE __m512 tn_step_f32(__m512 acc, __m512 w, __m512 x) { return _mm512_fmadd_ps(w, x, acc); }
TN_INLINE __m512 tn_step_bf16(__m512 acc, __m512 w, __m512 x) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_castps_si512(w), (__m512bh)_mm512_castps_si512(x));
}

typedef void (*tn_f_tile_fn)(int64_t k, const uint8_t *w, size_t w_rb, const uint8_t *x, size_t x_rb, float *y,
                             int64_t ldy);

#define TN_F_TILE(T)                                                                                                   \
    TN_INLINE void tn_##T##_ftile(const int RM, const int RN, int64_t k, const uint8_t *w, size_t w_rb,                \
                                  const uint8_t *x, size_t x_rb, float *y, int64_t ldy) {                              \
        const int EL = TN_EL_##T;                                                                                      \
        const __mmask32 all = (__mmask32)((1ull << EL) - 1);                                                           \
        __m512 acc[TN_F_AMAX][TN_F_RN];                                                                                \
        TN_UNROLL for (int i = 0; i < RM; i++) TN_UNROLL for (int j = 0; j < RN; j++) acc[i][j] =                      \
            _mm512_setzero_ps();                                                                                       \
        int64_t l = 0;                                                                                                 \
        for (; l + EL <= k; l += EL) {                                                                                 \
            __m512 xv[TN_F_RN];                                                                                        \
            TN_UNROLL for (int j = 0; j < RN; j++) xv[j] = tn_ld_##T(x + j * x_rb, l, all);                            \
            TN_UNROLL for (int i = 0; i < RM; i++) {                                                                   \
                const __m512 wv = tn_ld_##T(w + i * w_rb, l, all);                                                     \
                TN_UNROLL for (int j = 0; j < RN; j++) acc[i][j] = tn_step_##T(acc[i][j], wv, xv[j]);                  \
            }                                                                                                          \
        }                                                                                                              \
        if (l < k) {                                                                                                   \
            const __mmask32 msk = (__mmask32)((1ull << (k - l)) - 1);                                                  \
            __m512 xv[TN_F_RN];                                                                                        \
            TN_UNROLL for (int j = 0; j < RN; j++) xv[j] = tn_ld_##T(x + j * x_rb, l, msk);                            \
            TN_UNROLL for (int i = 0; i < RM; i++) {                                                                   \
                const __m512 wv = tn_ld_##T(w + i * w_rb, l, msk);                                                     \
                TN_UNROLL for (int j = 0; j < RN; j++) acc[i][j] = tn_step_##T(acc[i][j], wv, xv[j]);                  \
            }                                                                                                          \
        }                                                                                                              \
        TN_UNROLL for (int j = 0; j < RN; j++) TN_UNROLL for (int i = 0; i < RM; i++) y[j * ldy + i] =                 \
            _mm512_reduce_add_ps(acc[i][j]);                                                                           \
    }                                                                                                                  \
    /* One row pair: four independent accumulators hide the latency. */                                               \
    TN_INLINE float tn_##T##_fdot(int64_t k, const uint8_t *w, const uint8_t *x) {                                    \
        const int EL = TN_EL_##T;                                                                                      \
        const __mmask32 all = (__mmask32)((1ull << EL) - 1);                                                           \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                                    \
        int64_t l = 0;                                                                                                 \
        for (; l + 4 * EL <= k; l += 4 * EL) {                                                                         \
            a0 = tn_step_##T(a0, tn_ld_##T(w, l, all), tn_ld_##T(x, l, all));                                          \
            a1 = tn_step_##T(a1, tn_ld_##T(w, l + EL, all), tn_ld_##T(x, l + EL, all));                                \
            a2 = tn_step_##T(a2, tn_ld_##T(w, l + 2 * EL, all), tn_ld_##T(x, l + 2 * EL, all));                        \
            a3 = tn_step_##T(a3, tn_ld_##T(w, l + 3 * EL, all), tn_ld_##T(x, l + 3 * EL, all));                        \
        }                                                                                                              \
        for (; l < k; l += EL) {                                                                                       \
            const __mmask32 msk = k - l >= EL ? all : (__mmask32)((1ull << (k - l)) - 1);                              \
            a0 = tn_step_##T(a0, tn_ld_##T(w, l, msk), tn_ld_##T(x, l, msk));                                          \
        }                                                                                                              \
        return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));                      \
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
    TN_NOINLINE void tn_##T##_fcol3(int64_t k, const uint8_t *w, size_t w_rb, const uint8_t *x, size_t x_rb, float *y, \
                                    int64_t ldy) {                                                                     \
        tn_##T##_ftile(TN_F_RM, 3, k, w, w_rb, x, x_rb, y, ldy);                                                       \
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
        const tn_f_tile_fn cols[TN_F_RN] = {NULL, tn_##T##_fcol1, tn_##T##_fcol2, tn_##T##_fcol3};                     \
        tn_f_gemm(k, m, n, (const uint8_t *)w, w_rb, (const uint8_t *)x, x_rb, y, ldy, tn_##T##_ffull,                 \
                  tn_##T##_frow1, cols, tn_##T##_fgemv, tn_##T##_fone);                                                \
    }                                                                                                                  \
    void TN_KNAME(vec_dot_##T##_##T)(int64_t k, float *s, const void *w, const void *x) {                              \
        *s = tn_##T##_fdot(k, (const uint8_t *)w, (const uint8_t *)x);                                                 \
    }

/* Blocking: activation rows in L2-sized chunks; a weight tile stays in L1 across them. */
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

TN_F_TILE(f32)
TN_F_TILE(bf16)
