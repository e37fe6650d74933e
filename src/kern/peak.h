/*
 * peak.h — measured peaks of this machine, the denominators of tern bench's rooflines: streaming
 * read bandwidth (decode is bandwidth-bound), f32 FMA throughput and int8 dot-product throughput
 * (prefill is compute-bound: f32 for float weights, int8 for quantized ones).
 *
 * Each probe runs the widest loop the CPU has (TERN_ISA caps it like the kernels; loops live in
 * src/kern/<isa>/peak.c), on `threads` threads started together, several repetitions, and
 * returns the best. Reads stream a buffer far larger than the caches, split into one
 * contiguous part per thread, which each thread reads as four sequential streams (its quarters)
 * with software prefetch TN_PEAK_PF bytes ahead into L2, the access pattern of the decode
 * kernels: on the development machine (Zen 4, shared host) one plain stream per thread read
 * ~30% less at 2 threads and ~45% less at 1, so it understated the machine. Takes a fraction of a second; allocates only for the read probe
 * (returns 0 if that fails). Not for use while other work runs in the same process.
 */
#ifndef TN_KERN_PEAK_H
#define TN_KERN_PEAK_H

#include <stddef.h>
#include <stdint.h>

/* Best GB/s (1e9 bytes/s) reading `bytes` (rounded down to 4 KiB per thread) over reps runs. */
double tn_peak_read_gbs(int threads, size_t bytes, int reps);

/* A read probe kept for repeated single passes (tern bench interleaves them with decoding, so
 * the bandwidth it sets a run against is measured in the same seconds, by the same statistic:
 * the mean of passes, not the best). new: allocates and faults in `bytes` (rounded down to 4 KiB
 * per thread), NULL if that fails; gbs: GB/s of one pass of all threads started together (the
 * slowest thread's time), 0 on failure. */
typedef struct tn_read_probe tn_read_probe;
tn_read_probe *tn_read_probe_new(int threads, size_t bytes);
double tn_read_probe_gbs(tn_read_probe *p);
void tn_read_probe_free(tn_read_probe *p);
/* f32 GFLOP/s (an FMA = 2 flops) of independent FMA chains, all threads together. */
double tn_peak_fma_gflops(int threads);
/* int8 GOP/s (a multiply-add of u8 x s8 = 2 ops) of VNNI dot products (or their AVX2 /
 * scalar equivalent), all threads together. */
double tn_peak_dot_gops(int threads);

#define TN_PEAK_PF 4096 /* read probe: prefetch distance in each stream, bytes */

/* The ISA loops (iters rounds; return a value that depends on every operation). The read loops
 * read every 8-byte word of p[0 .. bytes) (bytes a multiple of 64) and return a fold of them
 * that is 0 for a zero buffer and not 0 when exactly one word is not 0. The dot loops' sums wrap
 * (unsigned): their chains run past the int32 range on long runs. */
uint64_t tn_peak_read__scalar(const void *p, size_t bytes);
uint64_t tn_peak_read__avx512(const void *p, size_t bytes);
uint64_t tn_peak_read__avx2(const void *p, size_t bytes);
float tn_peak_fma__avx512(int64_t iters); /* 256 FMAs (16 x 16 lanes) per round   */
float tn_peak_fma__avx2(int64_t iters);   /* 128 FMAs (16 x 8 lanes) per round    */
uint32_t tn_peak_dot__avx512(int64_t iters); /* 1024 u8 x s8 MACs (16 x 64) per round */
uint32_t tn_peak_dot__avx2(int64_t iters);   /* 384 MACs (12 x 32) per round          */

#endif
