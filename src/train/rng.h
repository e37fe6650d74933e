/*
 * rng.h — the trainer's random numbers: splitmix64 (state = one u64, so checkpoints store it
 * exactly) and Box-Muller normals. Deterministic across platforms.
 */
#ifndef TN_TRAIN_RNG_H
#define TN_TRAIN_RNG_H

#include <math.h>
#include <stdint.h>

static inline uint64_t tn_rng_next(uint64_t *s) {
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}
/* uniform in (0, 1] */
static inline double tn_rng_unif(uint64_t *s) { return ((double)(tn_rng_next(s) >> 11) + 1.0) * 0x1.0p-53; }
static inline double tn_rng_normal(uint64_t *s) {
    double u1 = tn_rng_unif(s), u2 = tn_rng_unif(s);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
/* uniform integer in [0, n) (n > 0; bias negligible for n << 2^64) */
static inline uint64_t tn_rng_below(uint64_t *s, uint64_t n) { return tn_rng_next(s) % n; }

#endif
