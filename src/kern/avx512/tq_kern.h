/*
 * tq_kern.h (avx512) — internal declarations shared by the tq kernel files of this folder
 * (tq.c: per-block dot and registration, tq_gemv.c: decode, tq_gemm.c: prefill).
 */
#ifndef TN_KERN_AVX512_TQ_KERN_H
#define TN_KERN_AVX512_TQ_KERN_H

#include "kern/kern.h"
#include "quant/repack.h"

/* Plane widths of b bits as compile-time constants (tn_tq_planes): widest, second, third. */
#define TQ_W0(b) ((b) == 1 ? 1 : (b) <= 3 ? 2 : (b) <= 7 ? 4 : 8)
#define TQ_W1(b) ((b) == 3 || (b) == 5 ? 1 : (b) == 6 || (b) == 7 ? 2 : 0)
#define TQ_W2(b) ((b) == 7 ? 1 : 0)
#define TQ_NP(b) (1 + (TQ_W1(b) > 0) + (TQ_W2(b) > 0))
/* Window sub-steps (tq_plan.h) of >= 2 per super-step whose block headers all lie in the first
 * 64 bytes of their window: headers are then gathered two sub-steps per permute. */
#define TQ_HDR_IN_A(b, g, a)                                                                                        \
    (TQ_W0(b) >= 2 && 16 / TQ_W0(b) > (g) / 32 &&                                                                  \
     (16 / TQ_W0(b) / ((g) / 32) - 1) * ((a) ? 4 : 2) + (16 / TQ_W0(b) / ((g) / 32) - 1) * ((g) * (b) / 8) +          \
             ((a) ? 4 : 2) <= 64)
/* Window sub-steps of exactly two 64-code blocks with 4-bit plane 0 (tq_plan.h): plane 0 by two
 * 32-byte loads, 1-bit planes by two 8-byte broadcasts, instead of window permutes. */
#define TQ_PAIR(b, g) ((g) == 64 && TQ_W0(b) == 4)
/* Type index (dtype - TN_DTYPE_TERN_BASE) of tq<b>g<g>[a] as a constant expression. */
#define TQ_INDEX(b, g, a) (((b) - 1) * 8 + ((g) == 32 ? 0 : (g) == 64 ? 1 : (g) == 128 ? 2 : 3) * 2 + (a))
#define TQ_INLINE static inline __attribute__((always_inline))

/* One gemm-signature kernel TQ_PFX_<b>_<g>_<a> per tq type, each calling the always-inline
 * TQ_BODY(b, g, a, k, m, n, w, w_rb, x, x_rb, y, ldy), and lookup(ti) returning it by type index.
 * Define TQ_PFX and TQ_BODY, then write TQ_KERNELS(lookup) once (needs kern/tq_list.inc). */
#define TQ_CAT4_(p, b, g, a) p##_##b##_##g##_##a
#define TQ_CAT4(p, b, g, a) TQ_CAT4_(p, b, g, a)
#ifndef TQ_TARGET
#define TQ_TARGET /* a file may define it as a target attribute its kernels need (tq_gemm.c: gfni) */
#endif
#define TQ_KDEF(b, g, a)                                                                                            \
    static TQ_TARGET void TQ_CAT4(TQ_PFX, b, g, a)(int64_t k, int64_t m, int64_t n, const void *w, size_t w_rb, const void *x, \
                                         size_t x_rb, float *y, int64_t ldy) {                                      \
        TQ_BODY(b, g, a, k, m, n, w, w_rb, x, x_rb, y, ldy);                                                        \
    }
#define TQ_KREF(b, g, a) [TQ_INDEX(b, g, a)] = TQ_CAT4(TQ_PFX, b, g, a),
#define TQ_KERNELS(lookup)                                                                                          \
    TN_TQ_LIST(TQ_KDEF)                                                                                             \
    tn_gemm_fn lookup(int ti) {                                                                                     \
        static const tn_gemm_fn fns[TN_TQ_COUNT] = {TN_TQ_LIST(TQ_KREF)};                                           \
        return fns[ti];                                                                                             \
    }

/* Decode kernel (built for n == 1; loops over n) of tq type index ti = dtype - TN_DTYPE_TERN_BASE. */
tn_gemm_fn tn_tq_gemv_avx512(int ti);
/* The gemm entry of type index ti: prefill for n > 1, the decode kernel for n == 1. */
tn_gemm_fn tn_tq_gemm_avx512(int ti);
/* The same for the *_c16 layout of type index ti (needs GFNI; b >= 2). */
tn_gemm_fn tn_tq_gemm_c16_avx512(int ti);
/* File-layout super-steps -> c16 bytes of type index ti (quant/repack.h tn_c16_put_fn). */
tn_c16_put_fn tn_tq_c16_put_avx512(int ti);

#endif
