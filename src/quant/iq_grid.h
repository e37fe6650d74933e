/*
 * iq_grid.h — the codebooks of ggml's codebook i-quants (data in iq_grids.c) and the sign bytes
 * they share.
 *
 * Grid entries pack one group of 8 (iq2_*, iq1_*) or 4 (iq3_*) elements, element j in byte j
 * (little-endian), so a dequantizer reads byte j of the entry; the byte order on the page is
 * the format's. Sign bytes: iq2_xxs, iq2_xs and iq3_xxs store 7 sign bits per 8 elements; the
 * eighth is chosen so the number of negative elements is even, i.e. sign byte = s7 | parity(s7)
 * << 7. Bit j set means element j is negative.
 */
#ifndef TN_QUANT_IQ_GRID_H
#define TN_QUANT_IQ_GRID_H

#include <stdint.h>
#include <string.h>

extern const uint64_t tn_iq2xxs_grid[256];
extern const uint64_t tn_iq2xs_grid[512];
extern const uint64_t tn_iq2s_grid[1024];
extern const uint32_t tn_iq3xxs_grid[256];
extern const uint32_t tn_iq3s_grid[512];
extern const uint64_t tn_iq1s_grid[2048];

/* iq1_s / iq1_m: the shift added to every grid value of a group of 8 is +-IQ1_DELTA. */
#define TN_IQ1_DELTA 0.125f

/* The full 8-bit sign mask of a 7-bit stored sign field (even parity). */
static inline uint8_t tn_iq_signs7(uint32_t s7) {
    s7 &= 127;
    uint32_t p = s7 ^ (s7 >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    return (uint8_t)(s7 | (p & 1) << 7);
}

/* Unaligned little-endian reads of a block's u32 / u16 fields. */
static inline uint32_t tn_iq_rd32(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline uint16_t tn_iq_rd16(const void *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Byte j of a grid entry (element j of its group). */
static inline int tn_iq_gbyte(uint64_t e, int j) { return (int)(uint8_t)(e >> 8 * j); }
static inline int tn_iq_gsbyte(uint64_t e, int j) { return (int)(int8_t)(uint8_t)(e >> 8 * j); }

#endif
