/*
 * dot_q.c (avx512) — vec_dot and gemm for q4_0, q5_0, q8_0 (x q8_0) and q4_1, q5_1 (x q8_1)
 * with 256-bit VNNI (vpdpbusd under AVX512-VL) and 32 vector registers. The algorithm is the
 * template avx2/dot_q.inc. 256-bit vectors on purpose: a 32-element block fills one, and on
 * cores that split 512-bit ops in halves (Zen 4) they give the same throughput.
 */
#include "kern/avx512/kernels.h"

#define TN_ISA avx512
#define TN_VNNI 1
#define TN_Q_RM 8
#define TN_Q_RN 4
#define TN_Q_RM1 8
#include "kern/avx2/dot_q.inc"
