/*
 * dot_k.c (avx512) — vec_dot and gemm for the k-quants (q2_K .. q6_K x q8_K) with 256-bit VNNI
 * (vpdpwssd under AVX512-VL) and 32 vector registers. The algorithm is the template
 * avx2/dot_k.inc.
 */
#include "kern/avx512/kernels.h"

#define TN_ISA avx512
#define TN_VNNI 1
#define TN_K_RM 2
#define TN_K_RN 4
#define TN_K_RM1 4
#include "kern/avx2/dot_k.inc"
