/*
 * test_terms.h — the magnitude bound of a dot product's rounding for ggml's weight types, shared
 * by the kernel tests (tq types: test_tq.h).
 */
#ifndef TN_TEST_TERMS_H
#define TN_TEST_TERMS_H

#include <math.h>
#include <stdlib.h>

#include "core/fp16.h"
#include "kern/kern.h"
#include "quant/blocks.h"
#include "quant/quant.h"

/* S = sum |w_l x_l| over the dequantized values (x in wt's vec_dot_type), plus q4_K's / q5_K's min part
 * |dmin m_g| |x_l|: it bounds every partial sum either side of a parity test rounds. */
static inline double kq_abs_terms(tn_dtype wt, int64_t k, const uint8_t *w, const uint8_t *x) {
    const tn_kern_table *ref = tn_kern_at(TN_ISA_SCALAR);
    const tn_dtype at = tn_dtype_get(wt)->vec_dot_type;
    float *wf = malloc((size_t)k * sizeof(float)), *xf = malloc((size_t)k * sizeof(float));
    ref->slot[wt].to_float(w, wf, k);
    ref->slot[at].to_float(x, xf, k);
    double s = 0;
    for (int64_t l = 0; l < k; l++) s += fabs((double)wf[l] * xf[l]);
    if (wt == TN_Q4_K || wt == TN_Q5_K) { /* d, dmin, scales at the same offsets in both */
        const size_t bb = tn_dtype_get(wt)->type_size;
        for (int64_t l = 0; l < k; l++) {
            const block_q4_K *b = (const block_q4_K *)(w + (size_t)(l / QK_K) * bb);
            uint8_t sc, mn;
            tn_get_scale_min_k4((int)(l % QK_K) / 32, b->scales, &sc, &mn);
            s += fabs((double)tn_fp16_to_fp32(b->dmin) * mn * xf[l]);
        }
    }
    free(wf), free(xf);
    return s;
}

#endif
