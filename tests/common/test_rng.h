/*
 * test_rng.h — the deterministic generator the kernel parity tests share (splitmix64) and the
 * activation-like test data they feed kernels: uniform values with a random power-of-two scale
 * per 32 elements and an occasional 8x outlier. Header-only; each test has its own state.
 */
#ifndef TN_TESTS_TEST_RNG_H
#define TN_TESTS_TEST_RNG_H

#include <math.h>
#include <stdint.h>

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static inline uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform in [-1, 1) with 24 random bits */
static inline float rng_uniform(void) { return (float)((rng_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

static inline void fill_floats(float *x, int64_t n) {
    float scale = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) scale = ldexpf(1.0f, (int)(rng_u64() % 13) - 6);
        x[i] = rng_uniform() * scale;
        if (rng_u64() % 97 == 0) x[i] *= 8.0f;
    }
}

#endif
