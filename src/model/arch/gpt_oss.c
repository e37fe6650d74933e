/*
 * gpt_oss.c — the "gpt-oss" family (gpt-oss-20b, gpt-oss-120b; llama.cpp's LLM_ARCH_OPENAI_MOE,
 * src/models/openai-moe.cpp). Per layer: RMSNorm, q/k/v with biases, RoPE on halves (YaRN-scaled:
 * rope.scaling.type yarn), attention with a learned sink per query head (attn_sinks: one more logit
 * in each head's softmax denominator), sliding-window attention (attention.sliding_window, 128) on
 * the even layers and full attention on the odd ones (sliding_window_pattern 2), the output
 * projection with a bias; then post_attention_norm (which is the FFN's input norm here: there is no
 * ffn_norm) and a mixture of experts on every layer: router logits with a bias, the top
 * expert_used_count logits and a softmax over just those as the weights (SOFTMAX_WEIGHT gating),
 * experts with biases on gate, up and down, and the clamped SwiGLU of gpt-oss (alpha 1.702,
 * limit 7). The experts are MXFP4 in the released files.
 */
#include "model/model.h"

static tern_status gpt_oss_hparams(const tn_gguf *g, tn_hparams *hp) {
    tern_status s;
    hp->swa_period = 2;
    if ((s = tn_model_key_dim(g, "gpt-oss", "attention.sliding_window", true, 1, 1 << 24, &hp->n_swa))) return s;
    if ((s = tn_model_key_dim(g, "gpt-oss", "attention.sliding_window_pattern", false, 1, 4096, &hp->swa_period))) return s;
    hp->rope_base_swa = hp->rope_freq_base, hp->rope_scale_swa = hp->rope_freq_scale;
    if ((s = tn_model_key_float(g, "gpt-oss", "rope.freq_base_swa", &hp->rope_base_swa))) return s;
    if (!(hp->rope_base_swa > 0)) return tn_err(TERN_ERR_FORMAT, "model: key 'gpt-oss.rope.freq_base_swa' must be > 0");
    return TERN_OK;
}

/* tern synth: the experts' rows and gpt-oss-20b's YaRN (factor 32 over 4096 positions; tiny
 * presets: over 32, so that the rotation's ramp covers their few dims too). */
static void gpt_oss_synth(tn_gguf_writer *w, tn_hparams *hp) {
    tn_gguf_set_u32(w, "gpt-oss.expert_feed_forward_length", (uint32_t)hp->n_ff_exp);
    tn_gguf_set_str(w, "gpt-oss.rope.scaling.type", "yarn");
    tn_gguf_set_f32(w, "gpt-oss.rope.scaling.factor", 32.0f);
    tn_gguf_set_u32(w, "gpt-oss.rope.scaling.original_context_length", hp->n_layer >= 16 ? 4096 : 32);
}

const tn_arch_desc tn_arch_gpt_oss = {
    .name = "gpt-oss",
    .id = TN_ARCH_GPT_OSS,
    .rope = TN_ROPE_NEOX,
    .ffn = TN_FFN_SWIGLU_OAI,
    .rms_eps = 1e-5f,
    .rope_base = 150000.0f,
    .head_dim_keys = true,
    .synth_swa = 4,
    .moe_gating = TN_MOE_SOFTMAX_WEIGHT,
    .post_attn_norm_ffn = true,
    .load_hparams = gpt_oss_hparams,
    .synth_keys = gpt_oss_synth,
    .need =
        {
            [TN_ROLE_ATTN_NORM] = TN_NEED_REQ,
            [TN_ROLE_ATTN_Q] = TN_NEED_REQ,
            [TN_ROLE_ATTN_K] = TN_NEED_REQ,
            [TN_ROLE_ATTN_V] = TN_NEED_REQ,
            [TN_ROLE_ATTN_OUT] = TN_NEED_REQ,
            [TN_ROLE_ATTN_Q_B] = TN_NEED_REQ,
            [TN_ROLE_ATTN_K_B] = TN_NEED_REQ,
            [TN_ROLE_ATTN_V_B] = TN_NEED_REQ,
            [TN_ROLE_ATTN_OUT_B] = TN_NEED_REQ,
            [TN_ROLE_ATTN_SINKS] = TN_NEED_REQ,
            [TN_ROLE_ATTN_POST_NORM] = TN_NEED_REQ,
            TN_NEED_MOE,
            [TN_ROLE_FFN_GATE_INP_B] = TN_NEED_REQ,
            [TN_ROLE_FFN_GATE_EXPS_B] = TN_NEED_REQ,
            [TN_ROLE_FFN_UP_EXPS_B] = TN_NEED_REQ,
            [TN_ROLE_FFN_DOWN_EXPS_B] = TN_NEED_REQ,
            [TN_ROLE_TOKEN_EMBD] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT_NORM] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT] = TN_NEED_OPT,
        },
};
