/*
 * llama.c — the "llama" family: Llama 1/2/3.x (incl. Llama 3.1 rope_freqs and linear scaling),
 * TinyLlama, SmolLM/SmolLM2, Mistral (attention.key_length may differ from n_embd / n_head, as in
 * Mistral Nemo). RMSNorm, RoPE on adjacent pairs (the converter permutes HF's q/k rows), GQA,
 * SwiGLU; optional q/k/v biases and tied output, as llama.cpp's loader allows. Mixtral-style
 * files (llama.expert_count > 0) carry a router and expert matrices (ffn_gate_inp,
 * ffn_{gate,up,down}_exps, experts of n_ff rows) instead of ffn_gate/up/down on every layer:
 * softmax top-k routing with the weights divided by their sum (llama.cpp's llama.cpp graph,
 * build_moe_ffn with norm_w = true); tn_arch_need picks one set by expert_count.
 */
#include "model/arch/arch.h"

const tn_arch_desc tn_arch_llama = {
    .name = "llama",
    .id = TN_ARCH_LLAMA,
    .rope = TN_ROPE_NORM,
    .ffn = TN_FFN_SWIGLU,
    .rms_eps = 1e-5f,
    .rope_base = 10000.0f,
    .rope_dim_key = true,
    .moe_renorm = true,
    .need =
        {
            TN_NEED_CORE_ATTN,
            [TN_ROLE_FFN_GATE] = TN_NEED_OPT,
            [TN_ROLE_FFN_UP] = TN_NEED_OPT,
            [TN_ROLE_FFN_DOWN] = TN_NEED_OPT,
            [TN_ROLE_FFN_GATE_INP] = TN_NEED_OPT,
            [TN_ROLE_FFN_GATE_EXPS] = TN_NEED_OPT,
            [TN_ROLE_FFN_UP_EXPS] = TN_NEED_OPT,
            [TN_ROLE_FFN_DOWN_EXPS] = TN_NEED_OPT,
            [TN_ROLE_ATTN_Q_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_K_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_V_B] = TN_NEED_OPT,
            [TN_ROLE_OUTPUT] = TN_NEED_OPT,
            [TN_ROLE_ROPE_FREQS] = TN_NEED_OPT,
        },
};
