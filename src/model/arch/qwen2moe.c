/*
 * qwen2moe.c — the "qwen2moe" family (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): qwen2's attention
 * (q/k/v biases, neox RoPE) and on every layer a mixture-of-experts feed-forward beside a shared
 * expert: the router (ffn_gate_inp) takes a softmax over the experts and the top
 * expert_used_count of them with their probabilities as weights, not renormalised (llama.cpp's
 * build_moe_ffn with norm_w = false); experts of expert_feed_forward_length rows (absent:
 * n_ff / n_expert_used). Every token also runs the shared expert, a SwiGLU of
 * expert_shared_feed_forward_length rows (absent: n_ff), whose output is scaled by
 * sigmoid(ffn_gate_inp_shexp . x) and added to the routed experts' sum.
 * llama.cpp: src/models/qwen2moe.cpp.
 */
#include "model/model.h"

static void qwen2moe_synth(tn_gguf_writer *w, tn_hparams *hp) {
    tn_gguf_set_u32(w, "qwen2moe.expert_feed_forward_length", (uint32_t)hp->n_ff_exp);
    tn_gguf_set_u32(w, "qwen2moe.expert_shared_feed_forward_length", (uint32_t)hp->n_ff_shexp);
}

const tn_arch_desc tn_arch_qwen2moe = {
    .name = "qwen2moe",
    .id = TN_ARCH_QWEN2MOE,
    .rope = TN_ROPE_NEOX,
    .ffn = TN_FFN_SWIGLU,
    .rms_eps = 1e-6f,
    .rope_base = 1000000.0f,
    .synth_keys = qwen2moe_synth,
    .need =
        {
            TN_NEED_CORE_ATTN,
            TN_NEED_MOE,
            [TN_ROLE_ATTN_Q_B] = TN_NEED_REQ,
            [TN_ROLE_ATTN_K_B] = TN_NEED_REQ,
            [TN_ROLE_ATTN_V_B] = TN_NEED_REQ,
            [TN_ROLE_FFN_GATE_INP_SHEXP] = TN_NEED_REQ,
            [TN_ROLE_FFN_GATE_SHEXP] = TN_NEED_REQ,
            [TN_ROLE_FFN_UP_SHEXP] = TN_NEED_REQ,
            [TN_ROLE_FFN_DOWN_SHEXP] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT] = TN_NEED_OPT,
        },
};
