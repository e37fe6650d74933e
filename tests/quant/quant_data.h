/*
 * quant_data.h — deterministic test inputs for the quantization tests, shared by the tests and by
 * ggml_golden_gen.c (which runs llama.cpp's own code on the very same inputs to produce the
 * golden hashes in test_quant_golden.c). Only integer arithmetic and exact float operations
 * (conversions of 24-bit integers, multiplications by powers of two, sums of a few such values)
 * are used, so every compiler produces the same floats.
 *
 * Patterns (any n; a last partial 32-block gets the first elements of a full one):
 *   0 gauss      sum of four uniforms, roughly N(0, 1)
 *   1 scales     uniform(-1, 1) times 2^(b%31 - 20) for 32-block b: fp16 subnormal to large scales
 *   2 edge32     per 32-block: zero, constant +-, one +/- outlier, all positive, all negative, tiny
 *   3 edge256    per 256-block: zero, constants, zero groups, weight-like, outlier over tiny values
 *   4 weights    gauss * 0.02 (trained-weight magnitudes)
 *   5 halves     multiples of 0.5 in [-4, 4] (exact ties for the roundings)
 */
#ifndef TN_TESTS_QUANT_DATA_H
#define TN_TESTS_QUANT_DATA_H

#include <stddef.h>
#include <stdint.h>

#define TQ_N_PATTERNS 6

static inline uint64_t tq_next(uint64_t *s) {
    /* splitmix64 */
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 24 bits: exact in float. */
static inline float tq_unif(uint64_t *s) { return (float)(tq_next(s) >> 40) * (1.0f / 16777216.0f); }

/* Uniform in [-1, 1). */
static inline float tq_sym(uint64_t *s) { return 2.0f * tq_unif(s) - 1.0f; }

/* Roughly standard normal: sum of four uniforms, centered, scaled by ~sqrt(3). */
static inline float tq_gauss(uint64_t *s) {
    /* Separate statements: the evaluation order of operands is unspecified in C. */
    float u = tq_unif(s);
    u += tq_unif(s);
    u += tq_unif(s);
    u += tq_unif(s);
    return (u - 2.0f) * 1.732421875f;
}

/* 2^e for -126 <= e <= 127, exactly, without libm. */
static inline float tq_pow2(int e) {
    float r = 1.0f;
    for (; e > 0; e--) r *= 2.0f;
    for (; e < 0; e++) r *= 0.5f;
    return r;
}

static inline void tq_fill(int pattern, uint64_t seed, float *x, int64_t n) {
    uint64_t s = seed * UINT64_C(0x100000001B3) + (uint64_t)pattern;
    for (int64_t b = 0; b < (n + 31) / 32; b++) {
        float xb[32];
        const int64_t blk256 = b / 8, grp = b % 8; /* which super-block, which 32-block in it */
        switch (pattern) {
        case 0:
            for (int j = 0; j < 32; j++) xb[j] = tq_gauss(&s);
            break;
        case 1: {
            const float sc = tq_pow2((int)(b % 31) - 20);
            for (int j = 0; j < 32; j++) xb[j] = tq_sym(&s) * sc;
            break;
        }
        case 2: {
            const int kind = (int)(b % 8);
            const int pos = (int)(tq_next(&s) % 32);
            for (int j = 0; j < 32; j++) {
                switch (kind) {
                case 0: xb[j] = 0.0f; break;
                case 1: xb[j] = 0.75f; break;
                case 2: xb[j] = -3.5f; break;
                case 3: xb[j] = j == pos ? 40.0f : tq_gauss(&s); break;
                case 4: xb[j] = j == pos ? -40.0f : tq_gauss(&s); break;
                case 5: xb[j] = 0.5f + 1.5f * tq_unif(&s); break;
                case 6: xb[j] = -0.5f - 1.5f * tq_unif(&s); break;
                default: xb[j] = tq_gauss(&s) * tq_pow2(-20); break;
                }
            }
            break;
        }
        case 3: {
            const int kind = (int)(blk256 % 6);
            for (int j = 0; j < 32; j++) {
                const int e = (int)grp * 32 + j; /* index inside the super-block */
                switch (kind) {
                case 0: xb[j] = 0.0f; break;
                case 1: xb[j] = 1.25f; break;
                case 2: xb[j] = -0.3f; break;
                case 3: xb[j] = (e / 16) % 2 ? 0.0f : tq_gauss(&s); break;
                case 4: xb[j] = tq_gauss(&s) * 0.02f; break;
                default: xb[j] = e == 77 ? -9.0f : tq_gauss(&s) * tq_pow2(-12); break;
                }
            }
            break;
        }
        case 4:
            for (int j = 0; j < 32; j++) xb[j] = tq_gauss(&s) * 0.02f;
            break;
        default:
            for (int j = 0; j < 32; j++) xb[j] = (float)((int)(tq_next(&s) % 17) - 8) * 0.5f;
            break;
        }
        for (int64_t j = 0; j < 32 && 32 * b + j < n; j++) x[32 * b + j] = xb[j];
    }
}

/* FNV-1a 64 of a byte range. */
static inline uint64_t tq_fnv1a(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

#endif
