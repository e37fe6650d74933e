/*
 * dot_k.c (avx2) — vec_dot and gemm for the k-quants (q2_K .. q6_K x q8_K) with AVX2
 * maddubs/madd. The algorithm is the template dot_k.inc (shared with avx512, which uses VNNI);
 * this file only picks the tile shape for 16 ymm registers.
 */
#include "kern/avx2/kernels.h"

#define TN_ISA avx2
#define TN_VNNI 0
#define TN_K_RM 2  /* weight rows per tile     */
#define TN_K_RN 4  /* activation rows per tile */
#define TN_K_RM1 1 /* weight rows per decode pass (n == 1) */
#define TN_K_TO_FLOAT
#include "kern/avx2/dot_k.inc"
