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

#include "tensor/dtype.h"

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

/*
 * The quantizers' view of a codebook (iq_map.c), built from the tables above at first use:
 * ggml's iq2xs_init_impl / iq3xs_init_impl computed in tern's code. An element's level l
 * (0..2 for iq2/iq1, 0..7 for iq3: the rank of its grid value) is stored as 2 l + 1; a key packs
 * the levels of one group, `bits` per element, element 0 lowest. map[key] is the grid index of the
 * entry with those levels, or -(o + 1) when no entry has them: neighbours[o] is then a count n
 * and neighbours[o + 1 .. o + n] are the grid entries nearest to the key's point (squared
 * distance in 2 l + 1 units) — every entry at the nwant smallest distances (2 for iq2_xxs /
 * iq2_xs / iq3_xxs, 1 for iq2_s, 3 for iq1_s / iq1_m / iq3_s), by distance then index.
 * Keys cover every level pattern with l <= 2 (2-bit) or l <= 7 (3-bit).
 */
typedef struct tn_iq_map {
    int dim;                    /* elements per group: 8, or 4 for iq3                      */
    int bits;                   /* bits per element in a key: 2, or 3 for iq3                */
    int grid_size;              /* 256, 512, 1024 or 2048                                    */
    int map_size;               /* number of keys                                            */
    const int8_t *grid;         /* [grid_size][dim] levels as 2 l + 1                        */
    const int32_t *map;         /* [map_size]                                                */
    const uint16_t *neighbours; /* lists of the keys not on the grid                          */
} tn_iq_map;

/* The map of type t's grid (iq1_s and iq1_m share one), built once under a lock at the first
 * call and kept for the life of the process; thread-safe. NULL for a type without a grid, or when
 * memory ran out (a later call tries again). */
const tn_iq_map *tn_iq_map_get(tn_dtype t);

#endif
