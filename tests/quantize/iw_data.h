/*
 * iw_data.h — inputs of the importance-weighted quantizer goldens, shared by test_quant_iw.c and
 * ggml_iw_golden_gen.c: IW_ROWS rows of IW_COLS values from tests/quant/quant_data.h's patterns
 * and importance vectors (one value per column, as an imatrix gives):
 *   0  g^2 + 2^-10 with g gaussian (exact float products of 24-bit values)
 *   1  the same with every 8th column 0 (unused columns)
 *   2  powers of two 2^-8 .. 2^8 (a wide dynamic range)
 */
#ifndef TN_TESTS_IW_DATA_H
#define TN_TESTS_IW_DATA_H

#include "quant_data.h"

#define IW_ROWS 2
#define IW_COLS 512
#define IW_N_IMAT 3

static inline void iw_fill(int v, float *w) {
    uint64_t s = 4242 + (uint64_t)v;
    for (int i = 0; i < IW_COLS; i++) {
        const float g = tq_gauss(&s);
        if (v == 2) w[i] = tq_pow2((int)(tq_next(&s) % 17) - 8);
        else w[i] = v == 1 && i % 8 == 3 ? 0.0f : g * g + tq_pow2(-10);
    }
}

#endif
