/*
 * smollm3.c — the "smollm3" family (SmolLM3-3B): the llama block (its converter is llama's: q/k
 * rows permuted, RoPE on adjacent pairs) without RoPE on every fourth layer ("NoPE" layers: 3, 7,
 * 11, ...; llama.cpp src/models/smollm3.cpp, n_no_rope_layer_step = 4, not a file key).
 */
#include "model/arch/arch.h"

const tn_arch_desc tn_arch_smollm3 = {
    .name = "smollm3",
    .id = TN_ARCH_SMOLLM3,
    .rope = TN_ROPE_NORM,
    .ffn = TN_FFN_SWIGLU,
    .rms_eps = 1e-6f,
    .rope_base = 5000000.0f,
    .rope_dim_key = true,
    .nope_step = 4,
    .need =
        {
            TN_NEED_CORE,
            [TN_ROLE_ATTN_Q_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_K_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_V_B] = TN_NEED_OPT,
            [TN_ROLE_OUTPUT] = TN_NEED_OPT,
        },
};
