/*
 * peak.h — measured peaks of this machine, the denominators of tern bench's rooflines: streaming
 * read bandwidth (decode is bandwidth-bound), f32 FMA throughput and int8 dot-product throughput
 * (prefill is compute-bound: f32 for float weights, int8 for quantized ones).
 *
 * Each probe runs the widest loop the CPU has (TERN_ISA caps it like the kernels; loops live in
 * src/kern/<isa>/peak.c), on `threads` threads started together, several repetitions, and
 * returns the best. Reads stream a buffer far larger than the caches, split into one
 * contiguous part per thread. Takes a fraction of a second; allocates only for the read probe
 * (returns 0 if that fails). Not for use while other work runs in the same process.
 */
#ifndef TN_KERN_PEAK_H
#define TN_KERN_PEAK_H

#include <stddef.h>
#include <stdint.h>

/* Best GB/s (1e9 bytes/s) reading `bytes` (rounded down to 4 KiB per thread) over reps runs. */
double tn_peak_read_gbs(int threads, size_t bytes, int reps);
/* f32 GFLOP/s (an FMA = 2 flops) of independent FMA chains, all threads together. */
double tn_peak_fma_gflops(int threads);
/* int8 GOP/s (a multiply-add of u8 x s8 = 2 ops) of VNNI dot products (or their AVX2 /
 * scalar equivalent), all threads together. */
double tn_peak_dot_gops(int threads);

/* The ISA loops (iters rounds; return a value that depends on every operation). */
uint64_t tn_peak_read__avx512(const void *p, size_t bytes);
uint64_t tn_peak_read__avx2(const void *p, size_t bytes);
float tn_peak_fma__avx512(int64_t iters); /* 256 FMAs (16 x 16 lanes) per round   */
float tn_peak_fma__avx2(int64_t iters);   /* 128 FMAs (16 x 8 lanes) per round    */
int32_t tn_peak_dot__avx512(int64_t iters); /* 1024 u8 x s8 MACs (16 x 64) per round */
int32_t tn_peak_dot__avx2(int64_t iters);   /* 384 MACs (12 x 32) per round          */

#endif
