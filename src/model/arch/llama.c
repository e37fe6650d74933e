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
            TN_NEED_CORE,
            [TN_ROLE_ATTN_Q_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_K_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_V_B] = TN_NEED_OPT,
            [TN_ROLE_OUTPUT] = TN_NEED_OPT,
            [TN_ROLE_ROPE_FREQS] = TN_NEED_OPT,
        },
};
