/*
 * deepseek2.c — the "deepseek2" family (DeepSeek-V2, V2-Lite, V2.5, V3 as llama.cpp names them;
 * src/models/deepseek2.cpp). Multi-head latent attention: q = Wq x (V2-Lite) or, with
 * attention.q_lora_rank > 0, q = Wq_b rmsnorm(Wq_a x); each q head is nope + n_rot values (the
 * rotated part last). attn_kv_a_mqa maps x to the latent c (kv_lora_rank, then RMS-normed by
 * attn_kv_a_norm) and one shared key part k_pe (n_rot, rotated); a head's key is
 * [W_kb,h c | k_pe] and its value W_vb,h c. tern caches [c | k_pe] per token (the compressed KV
 * cache) and absorbs the up-projections: q_nope,h W_kb,h into latent space, attention over the
 * cached rows (one shared kv head), then W_vb,h on the result — llama.cpp's MLA path with
 * attn_k_b / attn_v_b. Older files with one attn_kv_b are split into those at load.
 * RoPE on adjacent pairs; YaRN with DeepSeek's mscale (scores times mscale^2 / sqrt(nope + n_rot),
 * mscale = 1 + 0.1 yarn_log_multiplier / 0.1 ln factor). leading_dense_block_count dense SwiGLU
 * layers first, then MoE layers: softmax or sigmoid probabilities (expert_gating_func 1 / 2),
 * exp_probs_b added for selection only, grouped top-k (expert_group_count /
 * expert_group_used_count), the weights renormalised (expert_weights_norm) and scaled
 * (expert_weights_scale), plus expert_shared_count shared experts as one SwiGLU of
 * n_ff_exp * expert_shared_count rows, ungated.
 */
#include <math.h>

#include "model/model.h"

static tern_status deepseek2_hparams(const tn_gguf *g, tn_hparams *hp) {
    const char *an = "deepseek2";
    tern_status s;
    /* key_length / value_length: 576 / 512 (the cached latent + rope, the latent) in current files,
     * with the heads in *_mla; older files: the heads themselves and one attn_kv_b */
    const int32_t kl = hp->head_dim;
    int32_t vl = kl, kmla = 0, vmla = 0;
    if ((s = tn_model_key_dim(g, an, "attention.value_length", false, 1, 1 << 16, &vl))) return s;
    if ((s = tn_model_key_dim(g, an, "attention.key_length_mla", false, 1, 1 << 16, &kmla))) return s;
    if ((s = tn_model_key_dim(g, an, "attention.value_length_mla", false, 1, 1 << 16, &vmla))) return s;
    if ((kmla > 0) != (vmla > 0))
        return tn_err(TERN_ERR_FORMAT, "model: deepseek2.attention.key_length_mla and value_length_mla go together (one is missing)");
    hp->mla_kv_b = kmla == 0;
    hp->head_dim = kmla > 0 ? kmla : kl;
    hp->v_head = vmla > 0 ? vmla : vl;
    if ((s = tn_model_key_dim(g, an, "attention.q_lora_rank", false, 0, 1 << 16, &hp->n_lora_q))) return s;
    if ((s = tn_model_key_dim(g, an, "attention.kv_lora_rank", true, 1, 1 << 16, &hp->n_lora_kv))) return s;
    if (hp->n_rot >= hp->head_dim)
        return tn_err(TERN_ERR_FORMAT, "model: deepseek2.rope.dimension_count %d must be below the q/k head size %d (nope part >= 1)",
                      hp->n_rot, hp->head_dim);
    if (!hp->mla_kv_b && (kl != hp->n_lora_kv + hp->n_rot || vl != hp->n_lora_kv))
        return tn_err(TERN_ERR_FORMAT,
                      "model: deepseek2.attention.key_length %d / value_length %d must be kv_lora_rank + rope dims (%d) / "
                      "kv_lora_rank (%d) in an MLA file",
                      kl, vl, hp->n_lora_kv + hp->n_rot, hp->n_lora_kv);
    if ((int64_t)hp->n_head * TN_MAX(hp->head_dim, hp->v_head) > (1 << 22))
        return tn_err(TERN_ERR_FORMAT, "model: deepseek2.attention.head_count %d x head size %d is too large", hp->n_head, hp->head_dim);
    if (hp->n_head_kv != hp->n_head && hp->n_head_kv != 1)
        return tn_err(TERN_ERR_FORMAT, "model: deepseek2.attention.head_count_kv %d must equal head_count %d", hp->n_head_kv,
                      hp->n_head);
    hp->n_head_kv = hp->n_head;
    if ((s = tn_model_key_dim(g, an, "leading_dense_block_count", false, 0, hp->n_layer, &hp->n_layer_dense_lead))) return s;
    int32_t n_shared = 0, gating = 0;
    bool norm = false;
    if ((s = tn_model_key_dim(g, an, "expert_shared_count", false, 0, 64, &n_shared))) return s;
    hp->n_ff_shexp = hp->n_ff_exp * TN_MAX(n_shared, 1);
    if ((s = tn_model_key_dim(g, an, "expert_gating_func", false, 0, 2, &gating))) return s;
    hp->moe_sigmoid = gating == 2; /* 0 (absent in V2 files) and 1: softmax */
    if ((s = tn_gguf_get_bool(g, "deepseek2.expert_weights_norm", false, &norm))) return s;
    hp->moe_norm = norm;
    if ((s = tn_model_key_float(g, an, "expert_weights_scale", &hp->moe_scale))) return s;
    if ((s = tn_model_key_dim(g, an, "expert_group_count", false, 0, 512, &hp->n_expert_groups))) return s;
    if ((s = tn_model_key_dim(g, an, "expert_group_used_count", false, 0, 512, &hp->n_group_used))) return s;
    if (hp->n_expert_groups > 1 &&
        (hp->n_expert % hp->n_expert_groups || hp->n_group_used < 1 || hp->n_group_used > hp->n_expert_groups ||
         (int64_t)hp->n_group_used * (hp->n_expert / hp->n_expert_groups) < hp->n_expert_used || hp->n_expert / hp->n_expert_groups < 2))
        return tn_err(TERN_ERR_FORMAT,
                      "model: deepseek2.expert_group_count %d / expert_group_used_count %d do not fit %d experts, top %d",
                      hp->n_expert_groups, hp->n_group_used, hp->n_expert, hp->n_expert_used);
    /* YaRN as llama.cpp runs DeepSeek: the rotation's own factor cancelled (the rotated dims keep
     * the file's attn_factor), the scores scaled by mscale^2 with mscale = attn_factor *
     * (1 + 0.1 m ln f), m = yarn_log_multiplier / 0.1 (the converter's 0.1 * mscale_all_dim) */
    float af = 1.0f, log_mul = 0.0f;
    if ((s = tn_model_key_float(g, an, "rope.scaling.attn_factor", &af))) return s;
    if ((s = tn_model_key_float(g, an, "rope.scaling.yarn_log_multiplier", &log_mul))) return s;
    const float f = 1.0f / hp->rope_freq_scale;
    float mscale = af;
    if (hp->yarn_ext_factor != 0.0f) {
        hp->rope_attn_factor = af / (1.0f + 0.1f * logf(f));
        mscale = af * (1.0f + 0.1f * (log_mul / 0.1f) * logf(f));
    }
    hp->attn_scale = mscale * mscale / sqrtf((float)hp->head_dim);
    return TERN_OK;
}

/* tern synth: the MLA sizes ride in the preset's head fields (tools/tern/cmd_synth.c sets
 * n_lora_kv, n_rot, v_head, n_lora_q before calling); V2-Lite's routing and YaRN. */
static void deepseek2_synth(tn_gguf_writer *w, tn_hparams *hp) {
    tn_gguf_set_u32(w, "deepseek2.attention.q_lora_rank", (uint32_t)hp->n_lora_q);
    tn_gguf_set_u32(w, "deepseek2.attention.kv_lora_rank", (uint32_t)hp->n_lora_kv);
    tn_gguf_set_u32(w, "deepseek2.attention.key_length", (uint32_t)(hp->n_lora_kv + hp->n_rot));
    tn_gguf_set_u32(w, "deepseek2.attention.value_length", (uint32_t)hp->n_lora_kv);
    tn_gguf_set_u32(w, "deepseek2.attention.key_length_mla", (uint32_t)hp->head_dim);
    tn_gguf_set_u32(w, "deepseek2.attention.value_length_mla", (uint32_t)hp->v_head);
    tn_gguf_set_u32(w, "deepseek2.rope.dimension_count", (uint32_t)hp->n_rot);
    tn_gguf_set_u32(w, "deepseek2.leading_dense_block_count", (uint32_t)hp->n_layer_dense_lead);
    tn_gguf_set_u32(w, "deepseek2.expert_feed_forward_length", (uint32_t)hp->n_ff_exp);
    tn_gguf_set_u32(w, "deepseek2.expert_shared_count", (uint32_t)(hp->n_ff_shexp / hp->n_ff_exp));
    tn_gguf_set_f32(w, "deepseek2.expert_weights_scale", hp->moe_scale > 0 ? hp->moe_scale : 1.0f);
    tn_gguf_set_bool(w, "deepseek2.expert_weights_norm", hp->moe_norm);
    tn_gguf_set_u32(w, "deepseek2.expert_gating_func", hp->moe_sigmoid ? 2 : 1);
    if (hp->n_expert_groups > 1) {
        tn_gguf_set_u32(w, "deepseek2.expert_group_count", (uint32_t)hp->n_expert_groups);
        tn_gguf_set_u32(w, "deepseek2.expert_group_used_count", (uint32_t)hp->n_group_used);
    }
    /* V2-Lite: YaRN factor 40 over 4096 positions, mscale_all_dim 0.707 (tiny presets: over 32) */
    tn_gguf_set_str(w, "deepseek2.rope.scaling.type", "yarn");
    tn_gguf_set_f32(w, "deepseek2.rope.scaling.factor", 40.0f);
    tn_gguf_set_u32(w, "deepseek2.rope.scaling.original_context_length", hp->n_layer >= 16 ? 4096 : 32);
    tn_gguf_set_f32(w, "deepseek2.rope.scaling.yarn_log_multiplier", 0.0707f);
}

const tn_arch_desc tn_arch_deepseek2 = {
    .name = "deepseek2",
    .id = TN_ARCH_DEEPSEEK2,
    .rope = TN_ROPE_NORM,
    .ffn = TN_FFN_SWIGLU,
    .rms_eps = 1e-6f,
    .rope_base = 10000.0f,
    .mla = true,
    .load_hparams = deepseek2_hparams,
    .synth_keys = deepseek2_synth,
    .need =
        {
            [TN_ROLE_ATTN_NORM] = TN_NEED_REQ,
            [TN_ROLE_ATTN_Q] = TN_NEED_OPT, /* by q_lora_rank: tn_arch_need_layer */
            [TN_ROLE_ATTN_Q_A] = TN_NEED_OPT,
            [TN_ROLE_ATTN_Q_A_NORM] = TN_NEED_OPT,
            [TN_ROLE_ATTN_Q_LB] = TN_NEED_OPT,
            [TN_ROLE_ATTN_KV_A_MQA] = TN_NEED_REQ,
            [TN_ROLE_ATTN_KV_A_NORM] = TN_NEED_REQ,
            [TN_ROLE_ATTN_KV_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_K_B_MLA] = TN_NEED_OPT,
            [TN_ROLE_ATTN_V_B_MLA] = TN_NEED_OPT,
            [TN_ROLE_ATTN_OUT] = TN_NEED_REQ,
            [TN_ROLE_FFN_NORM] = TN_NEED_REQ,
            [TN_ROLE_FFN_GATE] = TN_NEED_OPT, /* the leading dense layers */
            [TN_ROLE_FFN_UP] = TN_NEED_OPT,
            [TN_ROLE_FFN_DOWN] = TN_NEED_OPT,
            TN_NEED_MOE,
            [TN_ROLE_FFN_EXP_PROBS_B] = TN_NEED_OPT,
            [TN_ROLE_FFN_GATE_SHEXP] = TN_NEED_REQ,
            [TN_ROLE_FFN_UP_SHEXP] = TN_NEED_REQ,
            [TN_ROLE_FFN_DOWN_SHEXP] = TN_NEED_REQ,
            [TN_ROLE_TOKEN_EMBD] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT_NORM] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT] = TN_NEED_OPT,
        },
};
