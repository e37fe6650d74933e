/*
 * tq.c (AVX-512) — fused dequant-dot for tern's any-bit types (body in kern/avx2/tq_dot.inc) with
 * AVX-512 VL/BW/VNNI on 256-bit vectors: the 1-bit plane expands with one mask move
 * (vpmovm2b-style maskz_set1), and dpbusd sums u8*s8 products exactly (no maddubs saturation,
 * so 8-bit codes need no split). Registered only if the CPU has AVX512-VNNI. The matrix kernels
 * (gemm slot) are the row-streaming ones of tq_gemv.c / tq_gemm.c.
 */
#include <immintrin.h>
#include <string.h>

#include "core/cpu.h"
#include "core/fp16.h"
#include "kern/avx512/kernels.h"
#include "kern/avx512/tq_kern.h"
#include "kern/avx512/tq_plan.h"
#include "kern/kern.h"
#include "kern/tq_list.inc"
#include "quant/repack.h"
#include "quant/tq.h"

#define TQ_EXPAND1(u) _mm256_maskz_set1_epi8((__mmask32)(u), 1)
#define TQ_DOT_U8S8(q, a) _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a)
#define TQ_SUM_S8(a) _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), a)
#include "kern/avx2/tq_dot.inc"

/* The table's gemm becomes the decode (n == 1, tq_gemv.c, which also needs GFNI; without it
 * decode stays per block) / prefill (n > 1, tq_gemm.c) pair, which needs VBMI as well; vec_dot
 * stays the per-block kernel above. */
void tn_kern_register_tq_avx512(tn_kern_table *t) {
    const tn_cpu *c = tn_cpu_get();
    t->tq_quantize = tn_k_tq_quantize__avx512; /* AVX512 F/DQ only (tq_quant.c) */
    t->tq_quantize_isa = TN_ISA_AVX512;
    if (!c->avx512vnni) return;
    tq_register(t, TN_ISA_AVX512);
    if (!c->avx512vbmi) return;
    tn_tq_plans_init(t, __builtin_cpu_supports("gfni"));
    for (int ti = 0; ti < TN_TQ_COUNT; ti++) t->slot[TN_DTYPE_TERN_BASE + ti].gemm = tn_tq_gemm_avx512(ti);
    if (!__builtin_cpu_supports("gfni")) return;
    for (int ti = 0; ti < TN_TQ_COUNT; ti++) /* the load-time c16 layouts (b >= 2; quant/repack.h) */
        if (tn_c16_file_type((tn_dtype)(TN_DTYPE_C16_BASE + ti))) {
            t->slot[TN_DTYPE_C16_BASE + ti].gemm = tn_tq_gemm_c16_avx512(ti);
            t->slot[TN_DTYPE_C16_BASE + ti].gemm_isa = TN_ISA_AVX512;
            tn_c16_put_fast[ti] = tn_tq_c16_put_avx512(ti); /* the load-time repack */
        }
}
