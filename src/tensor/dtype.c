/*
 * dtype.c — the trait table (designated initializers, ggml-common.h sizes).
 */
#include <stdio.h>
#include <strings.h>

#include "quant/blocks.h"
#include "tensor/dtype.h"
#include "kern/tq_list.inc" /* the tq types, for their *_c16 layouts */

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
    /* lookup-table types (16-entry tables) and ggml's ternary types */
    [TN_IQ4_NL] = {"iq4_nl", QK4_NL, sizeof(block_iq4_nl), true, true, TN_Q8_0},
    [TN_IQ4_XS] = {"iq4_xs", QK_K, sizeof(block_iq4_xs), true, true, TN_Q8_K},
    [TN_MXFP4] = {"mxfp4", QK_MXFP4, sizeof(block_mxfp4), true, true, TN_Q8_0},
    [TN_TQ1_0] = {"tq1_0", QK_K, sizeof(block_tq1_0), true, true, TN_Q8_K},
    [TN_TQ2_0] = {"tq2_0", QK_K, sizeof(block_tq2_0), true, true, TN_Q8_K},
    /* codebook i-quants (quant/iq_grid.h) */
    [TN_IQ2_XXS] = {"iq2_xxs", QK_K, sizeof(block_iq2_xxs), true, true, TN_Q8_K},
    [TN_IQ2_XS] = {"iq2_xs", QK_K, sizeof(block_iq2_xs), true, true, TN_Q8_K},
    [TN_IQ2_S] = {"iq2_s", QK_K, sizeof(block_iq2_s), true, true, TN_Q8_K},
    [TN_IQ3_XXS] = {"iq3_xxs", QK_K, sizeof(block_iq3_xxs), true, true, TN_Q8_K},
    [TN_IQ3_S] = {"iq3_s", QK_K, sizeof(block_iq3_s), true, true, TN_Q8_K},
    [TN_IQ1_S] = {"iq1_s", QK_K, sizeof(block_iq1_s), true, true, TN_Q8_K},
    [TN_IQ1_M] = {"iq1_m", QK_K, sizeof(block_iq1_m), true, true, TN_Q8_K},
    [TN_I8] = {"i8", 1, 1, false, false, TN_I8},
    [TN_I16] = {"i16", 1, 2, false, false, TN_I16},
    [TN_I32] = {"i32", 1, 4, false, false, TN_I32},
    /* Known to ggml, not computed by tern: named so errors can say what they are. */
    [27] = {"i64", 1, 8, false, false, 0},
    [28] = {"f64", 1, 8, false, false, 0},
};

/* tern any-bit types (src/quant/tq.h): id TN_DTYPE_TERN_BASE + (bits-1)*8 + log2(G/32)*2 + asym;
 * block = fp16 d [+ fp16 m] + G*bits/8 bytes of codes. */
static const tn_dtype_traits tn_traits_tq[TN_DTYPE_TQ_COUNT] = {
    {"tq1g32", 32, 6, true, true, TN_Q8_0},
    {"tq1g32a", 32, 8, true, true, TN_Q8_0},
    {"tq1g64", 64, 10, true, true, TN_Q8_0},
    {"tq1g64a", 64, 12, true, true, TN_Q8_0},
    {"tq1g128", 128, 18, true, true, TN_Q8_0},
    {"tq1g128a", 128, 20, true, true, TN_Q8_0},
    {"tq1g256", 256, 34, true, true, TN_Q8_0},
    {"tq1g256a", 256, 36, true, true, TN_Q8_0},
    {"tq2g32", 32, 10, true, true, TN_Q8_0},
    {"tq2g32a", 32, 12, true, true, TN_Q8_0},
    {"tq2g64", 64, 18, true, true, TN_Q8_0},
    {"tq2g64a", 64, 20, true, true, TN_Q8_0},
    {"tq2g128", 128, 34, true, true, TN_Q8_0},
    {"tq2g128a", 128, 36, true, true, TN_Q8_0},
    {"tq2g256", 256, 66, true, true, TN_Q8_0},
    {"tq2g256a", 256, 68, true, true, TN_Q8_0},
    {"tq3g32", 32, 14, true, true, TN_Q8_0},
    {"tq3g32a", 32, 16, true, true, TN_Q8_0},
    {"tq3g64", 64, 26, true, true, TN_Q8_0},
    {"tq3g64a", 64, 28, true, true, TN_Q8_0},
    {"tq3g128", 128, 50, true, true, TN_Q8_0},
    {"tq3g128a", 128, 52, true, true, TN_Q8_0},
    {"tq3g256", 256, 98, true, true, TN_Q8_0},
    {"tq3g256a", 256, 100, true, true, TN_Q8_0},
    {"tq4g32", 32, 18, true, true, TN_Q8_0},
    {"tq4g32a", 32, 20, true, true, TN_Q8_0},
    {"tq4g64", 64, 34, true, true, TN_Q8_0},
    {"tq4g64a", 64, 36, true, true, TN_Q8_0},
    {"tq4g128", 128, 66, true, true, TN_Q8_0},
    {"tq4g128a", 128, 68, true, true, TN_Q8_0},
    {"tq4g256", 256, 130, true, true, TN_Q8_0},
    {"tq4g256a", 256, 132, true, true, TN_Q8_0},
    {"tq5g32", 32, 22, true, true, TN_Q8_0},
    {"tq5g32a", 32, 24, true, true, TN_Q8_0},
    {"tq5g64", 64, 42, true, true, TN_Q8_0},
    {"tq5g64a", 64, 44, true, true, TN_Q8_0},
    {"tq5g128", 128, 82, true, true, TN_Q8_0},
    {"tq5g128a", 128, 84, true, true, TN_Q8_0},
    {"tq5g256", 256, 162, true, true, TN_Q8_0},
    {"tq5g256a", 256, 164, true, true, TN_Q8_0},
    {"tq6g32", 32, 26, true, true, TN_Q8_0},
    {"tq6g32a", 32, 28, true, true, TN_Q8_0},
    {"tq6g64", 64, 50, true, true, TN_Q8_0},
    {"tq6g64a", 64, 52, true, true, TN_Q8_0},
    {"tq6g128", 128, 98, true, true, TN_Q8_0},
    {"tq6g128a", 128, 100, true, true, TN_Q8_0},
    {"tq6g256", 256, 194, true, true, TN_Q8_0},
    {"tq6g256a", 256, 196, true, true, TN_Q8_0},
    {"tq7g32", 32, 30, true, true, TN_Q8_0},
    {"tq7g32a", 32, 32, true, true, TN_Q8_0},
    {"tq7g64", 64, 58, true, true, TN_Q8_0},
    {"tq7g64a", 64, 60, true, true, TN_Q8_0},
    {"tq7g128", 128, 114, true, true, TN_Q8_0},
    {"tq7g128a", 128, 116, true, true, TN_Q8_0},
    {"tq7g256", 256, 226, true, true, TN_Q8_0},
    {"tq7g256a", 256, 228, true, true, TN_Q8_0},
    {"tq8g32", 32, 34, true, true, TN_Q8_0},
    {"tq8g32a", 32, 36, true, true, TN_Q8_0},
    {"tq8g64", 64, 66, true, true, TN_Q8_0},
    {"tq8g64a", 64, 68, true, true, TN_Q8_0},
    {"tq8g128", 128, 130, true, true, TN_Q8_0},
    {"tq8g128a", 128, 132, true, true, TN_Q8_0},
    {"tq8g256", 256, 258, true, true, TN_Q8_0},
    {"tq8g256a", 256, 260, true, true, TN_Q8_0},
};

/* tern codebook types (src/quant/vq.h): 256-weight blocks of 70 bytes, a 4-byte row header (the
 * offset of the tensor's codebook from the row), a 1 KiB codebook after the rows. */
static const tn_dtype_traits tn_traits_vq[TN_DTYPE_VQ_COUNT] = {
    {"vq2", 256, 70, true, true, TN_Q8_K},
};

/* In-memory layouts (dtype.h): same block and bytes as their file type, rows interleaved (the
 * iq2 *_p3 layouts: larger blocks, rows as in the file). */
static const tn_dtype_traits tn_traits_internal[TN_DTYPE_SLOT_COUNT - TN_DTYPE_INTERNAL_BASE] = {
    {"q4_0_r16", QK4_0, sizeof(block_q4_0), true, true, TN_Q8_0},
    {"tq4g32_r16", 32, 18, true, true, TN_Q8_0},
    {"tq4g64_r16", 64, 34, true, true, TN_Q8_0},
    {"tq4g128_r16", 128, 66, true, true, TN_Q8_0},
    {"tq4g256_r16", 256, 130, true, true, TN_Q8_0},
    {"q8_0_r16", QK8_0, sizeof(block_q8_0), true, true, TN_Q8_0},
    {"tq1g32_l32", 32, 6, true, true, TN_Q8_0},
    {"tq1g32a_l32", 32, 8, true, true, TN_Q8_0},
    {"tq1g64_l32", 64, 10, true, true, TN_Q8_0},
    {"tq1g64a_l32", 64, 12, true, true, TN_Q8_0},
    {"tq1g128_l32", 128, 18, true, true, TN_Q8_0},
    {"tq1g128a_l32", 128, 20, true, true, TN_Q8_0},
    {"tq1g256_l32", 256, 34, true, true, TN_Q8_0},
    {"tq1g256a_l32", 256, 36, true, true, TN_Q8_0},
    {"q4_K_r16", QK_K, sizeof(block_q4_K), true, true, TN_Q8_K},
    {"q5_K_r16", QK_K, sizeof(block_q5_K), true, true, TN_Q8_K},
    {"q6_K_r16", QK_K, sizeof(block_q6_K), true, true, TN_Q8_K},
    {"iq4_xs_r16", QK_K, sizeof(block_iq4_xs), true, true, TN_Q8_K},
    {"iq2_xxs_p3", QK_K, sizeof(block_iq2_p3), true, true, TN_Q8_K},
    {"iq2_xs_p3", QK_K, sizeof(block_iq2_p3), true, true, TN_Q8_K},
    {"iq2_s_p3", QK_K, sizeof(block_iq2_p3), true, true, TN_Q8_K},
    {"iq3_xxs_p4", QK_K, sizeof(block_iq3_p4), true, true, TN_Q8_K},
    {"iq3_s_p4", QK_K, sizeof(block_iq3_p4), true, true, TN_Q8_K},
    {"iq1_s_p2", QK_K, sizeof(block_iq1_p2), true, true, TN_Q8_K},
    {"iq1_m_p2", QK_K, sizeof(block_iq1_p2), true, true, TN_Q8_K},
    {"iq4_nl_r16", QK4_NL, sizeof(block_iq4_nl), true, true, TN_Q8_0},
    {"tq2_0_r16", QK_K, sizeof(block_tq2_0), true, true, TN_Q8_K},
    {"tq1_0_r16", QK_K, sizeof(block_tq2_0), true, true, TN_Q8_K}, /* tq2_0_r16's blocks */
    {"tqc2", 32, 16, true, false, TN_Q8_0}, /* KV cache rows only (quant/kc.h) */
    {"tqc3", 32, 20, true, false, TN_Q8_0},
    {"tqc4", 32, 24, true, false, TN_Q8_0},
#define TN_C16_SFX_0 ""
#define TN_C16_SFX_1 "a"
#define TN_C16_TRAITS(b, g, a) {"tq" #b "g" #g TN_C16_SFX_##a "_c16", g, (a ? 4 : 2) + g * b / 8, true, b > 1, TN_Q8_0},
    TN_TQ_LIST(TN_C16_TRAITS)
#undef TN_C16_TRAITS
#undef TN_C16_SFX_0
#undef TN_C16_SFX_1
};

const tn_dtype_traits *tn_dtype_get(uint32_t t) {
    if (tn_dtype_is_internal(t)) return &tn_traits_internal[t - TN_DTYPE_INTERNAL_BASE];
    if (t >= TN_DTYPE_TERN_BASE && t < TN_DTYPE_TERN_BASE + TN_DTYPE_TQ_COUNT) return &tn_traits_tq[t - TN_DTYPE_TERN_BASE];
    if (t >= TN_DTYPE_VQ_BASE && t < TN_DTYPE_VQ_BASE + TN_DTYPE_VQ_COUNT)
        return tn_traits_vq[t - TN_DTYPE_VQ_BASE].name ? &tn_traits_vq[t - TN_DTYPE_VQ_BASE] : NULL;
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
    for (uint32_t i = 0; i < TN_DTYPE_TQ_COUNT; i++) {
        if (!strcasecmp(tn_traits_tq[i].name, name)) {
            *out = (tn_dtype)(TN_DTYPE_TERN_BASE + i);
            return true;
        }
    }
    for (uint32_t i = 0; i < TN_DTYPE_VQ_COUNT; i++) {
        if (tn_traits_vq[i].name && !strcasecmp(tn_traits_vq[i].name, name)) {
            *out = (tn_dtype)(TN_DTYPE_VQ_BASE + i);
            return true;
        }
    }
    return false;
}

size_t tn_dtype_row_size(tn_dtype t, int64_t ne0) {
    const tn_dtype_traits *tr = tn_dtype_get(t);
    if (!tr || ne0 < 0 || ne0 % tr->blck_size) return 0;
    uint64_t r;
    if (!tn_mul_ok((uint64_t)(ne0 / tr->blck_size), tr->type_size, &r) || !tn_add_ok(r, tn_dtype_row_hdr(t), &r) || r > SIZE_MAX)
        return 0;
    return (size_t)r;
}

size_t tn_dtype_tensor_size(tn_dtype t, int64_t ne0, int64_t rows) {
    const size_t rb = tn_dtype_row_size(t, ne0);
    uint64_t r;
    if (!rb || rows <= 0 || !tn_mul_ok(rb, (uint64_t)rows, &r) || !tn_add_ok(r, tn_dtype_tensor_tail(t), &r) || r > SIZE_MAX)
        return 0;
    return (size_t)r;
}
