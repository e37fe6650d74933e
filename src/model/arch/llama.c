/*
 * llama.c — the "llama" family: Llama 1/2/3.x (incl. Llama 3.1 rope_freqs and linear scaling),
 * TinyLlama, SmolLM/SmolLM2, Mistral (attention.key_length may differ from n_embd / n_head, as in
 * Mistral Nemo). RMSNorm, RoPE on adjacent pairs (the converter permutes HF's q/k rows), GQA,
 * SwiGLU; optional q/k/v biases and tied output, as llama.cpp's loader allows.
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
    .need =
        {
            [TN_ROLE_ATTN_NORM] = TN_NEED_REQ,
            [TN_ROLE_ATTN_Q] = TN_NEED_REQ,
            [TN_ROLE_ATTN_K] = TN_NEED_REQ,
            [TN_ROLE_ATTN_V] = TN_NEED_REQ,
            [TN_ROLE_ATTN_OUT] = TN_NEED_REQ,
            [TN_ROLE_ATTN_Q_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_K_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_V_B] = TN_NEED_OPT,
            [TN_ROLE_FFN_NORM] = TN_NEED_REQ,
            [TN_ROLE_FFN_GATE] = TN_NEED_REQ,
            [TN_ROLE_FFN_UP] = TN_NEED_REQ,
            [TN_ROLE_FFN_DOWN] = TN_NEED_REQ,
            [TN_ROLE_TOKEN_EMBD] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT_NORM] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT] = TN_NEED_OPT,
            [TN_ROLE_ROPE_FREQS] = TN_NEED_OPT,
        },
};
