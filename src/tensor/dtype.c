/*
 * dtype.c — the trait table (designated initializers, ggml-common.h sizes).
 */
#include <stdio.h>
#include <strings.h>

#include "quant/blocks.h"
#include "tensor/dtype.h"

static const tn_dtype_traits tn_traits[TN_DTYPE_GGML_COUNT] = {
    [TN_F32] = {"f32", 1, 4, false, true, TN_F32},
    [TN_F16] = {"f16", 1, 2, false, true, TN_F16},
    [TN_BF16] = {"bf16", 1, 2, false, true, TN_BF16},
    [TN_Q4_0] = {"q4_0", QK4_0, sizeof(block_q4_0), true, true, TN_Q8_0},
    [TN_Q4_1] = {"q4_1", QK4_1, sizeof(block_q4_1), true, true, TN_Q8_1},
    [TN_Q5_0] = {"q5_0", QK5_0, sizeof(block_q5_0), true, true, TN_Q8_0},
    [TN_Q5_1] = {"q5_1", QK5_1, sizeof(block_q5_1), true, true, TN_Q8_1},
    [TN_Q8_0] = {"q8_0", QK8_0, sizeof(block_q8_0), true, true, TN_Q8_0},
    [TN_Q8_1] = {"q8_1", QK8_1, sizeof(block_q8_1), true, false, TN_Q8_1},
    [TN_Q2_K] = {"q2_K", QK_K, sizeof(block_q2_K), true, true, TN_Q8_K},
    [TN_Q3_K] = {"q3_K", QK_K, sizeof(block_q3_K), true, true, TN_Q8_K},
    [TN_Q4_K] = {"q4_K", QK_K, sizeof(block_q4_K), true, true, TN_Q8_K},
    [TN_Q5_K] = {"q5_K", QK_K, sizeof(block_q5_K), true, true, TN_Q8_K},
    [TN_Q6_K] = {"q6_K", QK_K, sizeof(block_q6_K), true, true, TN_Q8_K},
    [TN_Q8_K] = {"q8_K", QK_K, sizeof(block_q8_K), true, false, TN_Q8_K},
    [TN_I8] = {"i8", 1, 1, false, false, TN_I8},
    [TN_I16] = {"i16", 1, 2, false, false, TN_I16},
    [TN_I32] = {"i32", 1, 4, false, false, TN_I32},
    /* Known to ggml, not computed by tern: named so errors can say what they are. */
    [16] = {"iq2_xxs", 256, 66, true, false, 0},
    [17] = {"iq2_xs", 256, 74, true, false, 0},
    [18] = {"iq3_xxs", 256, 98, true, false, 0},
    [19] = {"iq1_s", 256, 50, true, false, 0},
    [20] = {"iq4_nl", 32, 18, true, false, 0},
    [21] = {"iq3_s", 256, 110, true, false, 0},
    [22] = {"iq2_s", 256, 82, true, false, 0},
    [23] = {"iq4_xs", 256, 136, true, false, 0},
    [27] = {"i64", 1, 8, false, false, 0},
    [28] = {"f64", 1, 8, false, false, 0},
    [29] = {"iq1_m", 256, 56, true, false, 0},
    [34] = {"tq1_0", 256, 54, true, false, 0},
    [35] = {"tq2_0", 256, 66, true, false, 0},
    [39] = {"mxfp4", 32, 17, true, false, 0},
};

const tn_dtype_traits *tn_dtype_get(uint32_t t) {
    if (t >= TN_DTYPE_GGML_COUNT) return NULL;
    return tn_traits[t].name ? &tn_traits[t] : NULL;
}

const char *tn_dtype_name(uint32_t t) {
    const tn_dtype_traits *tr = tn_dtype_get(t);
    if (tr) return tr->name;
    static _Thread_local char buf[32];
    snprintf(buf, sizeof buf, "type#%u", t);
    return buf;
}

bool tn_dtype_from_name(const char *name, tn_dtype *out) {
    for (uint32_t t = 0; t < TN_DTYPE_GGML_COUNT; t++) {
        if (tn_traits[t].name && !strcasecmp(tn_traits[t].name, name)) {
            *out = (tn_dtype)t;
            return true;
        }
    }
    return false;
}

size_t tn_dtype_row_size(tn_dtype t, int64_t ne0) {
    const tn_dtype_traits *tr = tn_dtype_get(t);
    if (!tr || ne0 < 0 || ne0 % tr->blck_size) return 0;
    uint64_t r;
    if (!tn_mul_ok((uint64_t)(ne0 / tr->blck_size), tr->type_size, &r) || r > SIZE_MAX) return 0;
    return (size_t)r;
}
