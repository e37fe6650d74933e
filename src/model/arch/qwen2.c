/*
 * qwen2.c — the "qwen2" family (Qwen2, Qwen2.5): the llama block with q/k/v biases and RoPE on
 * halves ("neox": HF's rotate_half, rows not permuted). Tied output in the small models.
 */
#include "model/arch/arch.h"

const tn_arch_desc tn_arch_qwen2 = {
    .name = "qwen2",
    .id = TN_ARCH_QWEN2,
    .rope = TN_ROPE_NEOX,
    .ffn = TN_FFN_SWIGLU,
    .rms_eps = 1e-5f,
    .rope_base = 10000.0f,
    .need =
        {
            TN_NEED_CORE,
            [TN_ROLE_ATTN_Q_B] = TN_NEED_REQ,
            [TN_ROLE_ATTN_K_B] = TN_NEED_REQ,
            [TN_ROLE_ATTN_V_B] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT] = TN_NEED_OPT,
        },
};
