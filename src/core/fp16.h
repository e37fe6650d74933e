/*
 * fp16.h — scalar IEEE half and bfloat16 conversions (round to nearest even), bit-exact with
 * ggml's portable conversions. Kernels use F16C/AVX-512 instructions in src/kern/<isa>/; these
 * are the references they are checked against.
 */
#ifndef TN_CORE_FP16_H
#define TN_CORE_FP16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t tn_fp16;
typedef uint16_t tn_bf16;

static inline float tn_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t tn_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float tn_fp16_to_fp32(tn_fp16 h) {
    /* Maxim Vasilev / ggml method: exponent rebias through float multiplication. */
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = UINT32_C(0xE0) << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized_value = tn_bits_f32((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = UINT32_C(126) << 23;
    const float magic_bias = 0.5f;
    const float denormalized_value = tn_bits_f32((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denormalized_cutoff = UINT32_C(1) << 27;
    const uint32_t result = sign | (two_w < denormalized_cutoff ? tn_f32_bits(denormalized_value)
                                                                 : tn_f32_bits(normalized_value));
    return tn_bits_f32(result);
}

static inline tn_fp16 tn_fp32_to_fp16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (f < 0 ? -f : f) * scale_to_inf;
    base *= scale_to_zero;
    const uint32_t w = tn_f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & UINT32_C(0x80000000);
    uint32_t bias = shl1_w & UINT32_C(0xFF000000);
    if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);
    base = tn_bits_f32((bias >> 1) + UINT32_C(0x07800000)) + base;
    const uint32_t bits = tn_f32_bits(base);
    const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
    const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (tn_fp16)((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT16_C(0x7E00) : nonsign));
}

static inline float tn_bf16_to_fp32(tn_bf16 h) { return tn_bits_f32((uint32_t)h << 16); }

static inline tn_bf16 tn_fp32_to_bf16(float f) {
    uint32_t u = tn_f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (tn_bf16)((u >> 16) | 64); /* quiet NaN */
    return (tn_bf16)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

#endif
