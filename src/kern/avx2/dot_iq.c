/*
 * dot_iq.c (avx2) — vec_dot and gemm for iq4_xs, tq1_0, tq2_0 (x q8_K) and mxfp4 (x q8_0) with
 * AVX2 maddubs/madd and pshufb table lookups. The algorithm is the template dot_iq.inc (shared
 * with avx512, which uses VNNI); iq4_nl is in dot_q.inc's tile.
 */
#include "kern/avx2/kernels.h"

#define TN_ISA avx2
#define TN_VNNI 0
#include "kern/avx2/dot_iq.inc"
