/*
 * gemma3.c — the "gemma3" family (Gemma 3 text models, 270M..27B): embeddings scaled by
 * sqrt(n_embd); RMSNorm before and after attention and the FFN (post_attention_norm,
 * post_ffw_norm; the converter stores Gemma's (1 + w) as the weight, so the norm is the usual
 * one); per-head q/k RMSNorm; RoPE on halves; GeGLU with tanh GELU; queries scaled by
 * 1/sqrt(head_dim) (27B: 1/sqrt(n_embd / n_head)); sliding-window attention on local layers
 * (il % pattern < pattern - 1, pattern 6 by default) with their own RoPE base (10000 unless
 * rope.freq_base_swa), global layers with the file's base and scaling; optional final logit
 * soft-capping. llama.cpp: src/models/gemma3.cpp.
 */
#include <math.h>

#include "model/model.h"

static tern_status gemma3_hparams(const tn_gguf *g, tn_hparams *hp) {
    int64_t v = 0;
    tern_status s;
    hp->n_swa = 0, hp->swa_period = 6, hp->rope_base_swa = 10000.0f, hp->rope_scale_swa = 1.0f;
    hp->logit_softcap = 0.0f;
    if (tn_gguf_find(g, "gemma3.attention.sliding_window")) {
        if ((s = tn_gguf_get_i64(g, "gemma3.attention.sliding_window", true, &v))) return s;
        if (v < 0 || v > (1 << 24))
            return tn_err(TERN_ERR_FORMAT, "model: key 'gemma3.attention.sliding_window' = %lld is outside 0..16777216",
                          (long long)v);
        hp->n_swa = (int32_t)v;
    }
    if (tn_gguf_find(g, "gemma3.attention.sliding_window_pattern")) {
        if ((s = tn_gguf_get_i64(g, "gemma3.attention.sliding_window_pattern", true, &v)))
            return tn_err_prefix(s, "model: gemma3.attention.sliding_window_pattern (tern reads a single period)");
        if (v < 1 || v > 4096)
            return tn_err(TERN_ERR_FORMAT, "model: key 'gemma3.attention.sliding_window_pattern' = %lld is outside 1..4096",
                          (long long)v);
        hp->swa_period = (int32_t)v;
    }
    if ((s = tn_gguf_get_f32(g, "gemma3.rope.freq_base_swa", false, &hp->rope_base_swa))) return s;
    if (!(hp->rope_base_swa > 0) || !isfinite(hp->rope_base_swa))
        return tn_err(TERN_ERR_FORMAT, "model: key 'gemma3.rope.freq_base_swa' must be a positive number");
    if ((s = tn_gguf_get_f32(g, "gemma3.final_logit_softcapping", false, &hp->logit_softcap))) return s;
    if (!(hp->logit_softcap >= 0) || !isfinite(hp->logit_softcap))
        return tn_err(TERN_ERR_FORMAT, "model: key 'gemma3.final_logit_softcapping' must be >= 0");
    if (hp->n_layer == 62) hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head)); /* 27B */
    return TERN_OK;
}

const tn_arch_desc tn_arch_gemma3 = {
    .name = "gemma3",
    .id = TN_ARCH_GEMMA3,
    .rope = TN_ROPE_NEOX,
    .ffn = TN_FFN_GEGLU,
    .rms_eps = 1e-6f,
    .rope_base = 1000000.0f,
    .head_dim_keys = true,
    .embd_scale = true,
    .synth_swa = 4,
    .load_hparams = gemma3_hparams,
    .need =
        {
            TN_NEED_CORE,
            [TN_ROLE_ATTN_Q_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_K_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_V_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_Q_NORM] = TN_NEED_REQ,
            [TN_ROLE_ATTN_K_NORM] = TN_NEED_REQ,
            [TN_ROLE_ATTN_POST_NORM] = TN_NEED_REQ,
            [TN_ROLE_FFN_POST_NORM] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT] = TN_NEED_OPT,
        },
};
