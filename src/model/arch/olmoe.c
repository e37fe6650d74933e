/*
 * olmoe.c — the "olmoe" family (OLMoE-1B-7B: 16 layers, 64 experts, top 8): the llama block with
 * an RMSNorm of the whole q row and the whole k row (attn_q_norm [n_head * head_dim],
 * attn_k_norm [n_head_kv * head_dim]) after the projections and before neox RoPE, and a
 * mixture-of-experts feed-forward on every layer: softmax router, the top expert_used_count
 * experts with their softmax probabilities as weights, NOT renormalised (llama.cpp's
 * build_moe_ffn with norm_w = false), experts of n_ff rows. llama.cpp: src/models/olmoe.cpp.
 */
#include "model/model.h"

const tn_arch_desc tn_arch_olmoe = {
    .name = "olmoe",
    .id = TN_ARCH_OLMOE,
    .rope = TN_ROPE_NEOX,
    .ffn = TN_FFN_SWIGLU,
    .rms_eps = 1e-5f,
    .rope_base = 10000.0f,
    .qk_norm_full = true,
    .need =
        {
            TN_NEED_CORE_ATTN,
            TN_NEED_MOE,
            [TN_ROLE_ATTN_Q_NORM] = TN_NEED_REQ,
            [TN_ROLE_ATTN_K_NORM] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT] = TN_NEED_OPT,
        },
};
