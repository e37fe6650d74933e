/*
 * tq.c (AVX-512) — fused dequant-dot for tern's any-bit types (body in kern/avx2/tq_dot.inc) with
 * AVX-512 VL/BW/VNNI on 256-bit vectors: the 1-bit plane expands with one mask move
 * (vpmovm2b-style maskz_set1), and dpbusd sums u8*s8 products exactly (no maddubs saturation,
 * so 8-bit codes need no split). Registered only if the CPU has AVX512-VNNI.
 */
#include <immintrin.h>
#include <string.h>

#include "core/cpu.h"
#include "core/fp16.h"
#include "kern/kern.h"
#include "kern/tq_list.inc"
#include "quant/tq.h"

#define TQ_EXPAND1(u) _mm256_maskz_set1_epi8((__mmask32)(u), 1)
#define TQ_DOT_U8S8(q, a) _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a)
#define TQ_SUM_S8(a) _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), a)
#include "kern/avx2/tq_dot.inc"

void tn_kern_register_tq_avx512(tn_kern_table *t) {
    if (tn_cpu_get()->avx512vnni) tq_register(t, TN_ISA_AVX512);
}
