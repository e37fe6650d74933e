/*
 * qwen3.c — the "qwen3" family (Qwen3 dense, 0.6B..32B): the qwen2 block without required
 * biases, plus a per-head RMSNorm of q and k (weights attn_q_norm / attn_k_norm, head_dim long,
 * the model's rms epsilon) after the projections and before RoPE (neox). head_dim comes from
 * attention.key_length (128 in every Qwen3), so query rows are n_head * head_dim long, which need
 * not be n_embd (Qwen3-0.6B: 16 x 128 = 2048 over n_embd 1024); attn_output maps them back.
 * llama.cpp: src/models/qwen3.cpp (biases optional there too, via create_tensor_qkv).
 */
#include "model/arch/arch.h"

const tn_arch_desc tn_arch_qwen3 = {
    .name = "qwen3",
    .id = TN_ARCH_QWEN3,
    .rope = TN_ROPE_NEOX,
    .ffn = TN_FFN_SWIGLU,
    .rms_eps = 1e-6f,
    .rope_base = 1000000.0f,
    .head_dim_keys = true,
    .need =
        {
            TN_NEED_CORE,
            [TN_ROLE_ATTN_Q_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_K_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_V_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_Q_NORM] = TN_NEED_REQ,
            [TN_ROLE_ATTN_K_NORM] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT] = TN_NEED_OPT,
        },
};
