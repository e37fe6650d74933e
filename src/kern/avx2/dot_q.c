/*
 * dot_q.c (avx2) — vec_dot and gemm for q4_0, q5_0, q8_0 (x q8_0) and q4_1, q5_1 (x q8_1) with
 * AVX2 maddubs/madd. The algorithm is the template dot_q.inc (shared with avx512, which uses
 * VNNI); this file only picks the tile shape for 16 ymm registers.
 */
#include "kern/avx2/kernels.h"

#define TN_ISA avx2
#define TN_VNNI 0
#define TN_Q_RM 4  /* weight rows per tile      */
#define TN_Q_RN 3  /* activation rows per tile  */
#define TN_Q_RM1 8 /* weight rows per decode pass (n == 1) */
#define TN_Q_TO_FLOAT
#include "kern/avx2/dot_q.inc"
