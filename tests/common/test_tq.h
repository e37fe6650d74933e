/*
 * test_tq.h — shared by the kernel tests of tq (any-bit) weights: the magnitude bound of a dot
 * product's rounding.
 */
#ifndef TN_TEST_TQ_H
#define TN_TEST_TQ_H

#include <math.h>

#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/tq.h"

/* S: sum over codes of the magnitudes of the terms any lane split can form: |d dx q x| + |m dx x|
 * (sym: |d dx (2q - nmax) x / 2|, i.e. |w x|). Every partial sum either side rounds is at most S. */
static inline double tq_abs_terms(const tn_tq_params *p, int64_t k, const uint8_t *w, const block_q8_0 *x) {
    const size_t bb = tn_tq_block_bytes(p);
    const int nmax = (1 << p->bits) - 1;
    uint8_t q[256];
    double s = 0;
    for (int64_t b = 0; b < k / p->group; b++) {
        float d, m;
        tn_tq_unpack_block(p, w + b * bb, q, &d, &m);
        for (int c = 0; c < p->group / 32; c++) {
            const block_q8_0 *xc = &x[b * (p->group / 32) + c];
            const double dx = tn_fp16_to_fp32(xc->d);
            for (int j = 0; j < 32; j++) {
                const double xv = dx * xc->qs[j];
                if (p->asym) s += fabs(d * q[c * 32 + j] * xv) + fabs(m * xv);
                else s += fabs(d * (2 * q[c * 32 + j] - nmax) * 0.5 * xv);
            }
        }
    }
    return s;
}

#endif
