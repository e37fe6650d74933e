/*
 * dot_iq.c (avx512) — vec_dot and gemm for iq4_xs, tq1_0, tq2_0 (x q8_K) and mxfp4 (x q8_0)
 * with 256-bit VNNI (vpdpbusd under AVX512-VL); the template is avx2/dot_iq.inc. A 16-entry
 * table fits one 128-bit lane, so pshufb does the lookup (vpermb would only be needed for
 * tables of 32 or 64 entries).
 */
#include "kern/avx512/kernels.h"

#define TN_ISA avx512
#define TN_VNNI 1
#include "kern/avx2/dot_iq.inc"
