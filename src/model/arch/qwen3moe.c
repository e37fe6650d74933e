/*
 * qwen3moe.c — the "qwen3moe" family (Qwen3-30B-A3B, Qwen3-235B-A22B): qwen3's attention
 * (per-head q/k RMSNorm before neox RoPE, head_dim from attention.key_length) and a
 * mixture-of-experts feed-forward on every layer: a router (ffn_gate_inp, [n_embd, n_expert]),
 * softmax over the experts, the top expert_used_count of them, their weights divided by their sum
 * (norm_topk_prob; llama.cpp's build_moe_ffn with norm_w = true), each a SwiGLU of
 * expert_feed_forward_length rows (llama.cpp: n_ff_exp, else n_ff / n_expert_used).
 * llama.cpp: src/models/qwen3moe.cpp.
 */
#include "model/model.h"

static void qwen3moe_synth(tn_gguf_writer *w, tn_hparams *hp) {
    tn_gguf_set_u32(w, "qwen3moe.expert_feed_forward_length", (uint32_t)hp->n_ff_exp);
}

const tn_arch_desc tn_arch_qwen3moe = {
    .name = "qwen3moe",
    .id = TN_ARCH_QWEN3MOE,
    .rope = TN_ROPE_NEOX,
    .ffn = TN_FFN_SWIGLU,
    .rms_eps = 1e-6f,
    .rope_base = 1000000.0f,
    .head_dim_keys = true,
    .moe_renorm = true,
    .synth_keys = qwen3moe_synth,
    .need =
        {
            TN_NEED_CORE_ATTN,
            TN_NEED_MOE,
            [TN_ROLE_ATTN_Q_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_K_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_V_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_Q_NORM] = TN_NEED_REQ,
            [TN_ROLE_ATTN_K_NORM] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT] = TN_NEED_OPT,
        },
};
