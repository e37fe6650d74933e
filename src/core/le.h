/*
 * le.h — little-endian loads and stores of 32- and 64-bit integers at any alignment (file headers
 * of the prompt cache and of tern serve's slot files).
 */
#ifndef TN_CORE_LE_H
#define TN_CORE_LE_H

#include <stdint.h>

static inline void tn_put_le32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i); }
static inline void tn_put_le64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i); }
static inline uint32_t tn_get_le32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static inline uint64_t tn_get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

#endif
