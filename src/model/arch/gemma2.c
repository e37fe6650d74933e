/*
 * gemma2.c — the "gemma2" family (Gemma 2 2B, 9B, 27B): embeddings scaled by sqrt(n_embd); RMSNorm
 * before and after attention and the FFN (post_attention_norm, post_ffw_norm; the converter
 * stores Gemma's (1 + w)); no q/k norms; RoPE on halves with one base for every layer; GeGLU with
 * tanh GELU; queries scaled by 1/sqrt(head_dim) (27B, 46 layers: 1/sqrt(n_embd / n_head));
 * attention scores soft-capped, cap * tanh(s / cap) before the softmax (attn_logit_softcapping,
 * 50 by default), and the logits likewise (final_logit_softcapping, 30); sliding-window attention
 * (attention.sliding_window, 4096 by default) on the even layers (il % 2 < 1; pattern 2 unless
 * attention.sliding_window_pattern); the output is always the embedding table (llama.cpp loads no
 * output.weight for gemma2). llama.cpp: src/models/gemma2.cpp.
 */
#include <math.h>

#include "model/model.h"

/* An optional soft-cap key: a finite number > 0 (llama.cpp divides by it). */
static tern_status gemma2_cap(const tn_gguf *g, const char *suffix, float *cap) {
    tern_status s = tn_model_key_float(g, "gemma2", suffix, cap);
    if (s) return s;
    if (!(*cap > 0))
        return tn_err(TERN_ERR_FORMAT, "model: key 'gemma2.%s' = %g must be a number > 0", suffix, (double)*cap);
    return TERN_OK;
}

static tern_status gemma2_hparams(const tn_gguf *g, tn_hparams *hp) {
    tern_status s;
    hp->n_swa = 4096, hp->swa_period = 2;
    hp->attn_softcap = 50.0f, hp->logit_softcap = 30.0f;
    if ((s = tn_model_key_dim(g, "gemma2", "attention.sliding_window", false, 1, 1 << 24, &hp->n_swa))) return s;
    if ((s = tn_model_key_dim(g, "gemma2", "attention.sliding_window_pattern", false, 1, 4096, &hp->swa_period))) return s;
    hp->rope_base_swa = hp->rope_freq_base, hp->rope_scale_swa = hp->rope_freq_scale;
    if ((s = tn_model_key_float(g, "gemma2", "rope.freq_base_swa", &hp->rope_base_swa))) return s;
    if (!(hp->rope_base_swa > 0)) return tn_err(TERN_ERR_FORMAT, "model: key 'gemma2.rope.freq_base_swa' must be > 0");
    if ((s = gemma2_cap(g, "attn_logit_softcapping", &hp->attn_softcap))) return s;
    if ((s = gemma2_cap(g, "final_logit_softcapping", &hp->logit_softcap))) return s;
    if (hp->n_layer == 46) hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head)); /* 27B */
    return TERN_OK;
}

/* tern synth: Gemma 2's soft-caps (the window is synth_swa's). */
static void gemma2_synth(tn_gguf_writer *w, tn_hparams *hp) {
    (void)hp;
    tn_gguf_set_f32(w, "gemma2.attn_logit_softcapping", 50.0f);
    tn_gguf_set_f32(w, "gemma2.final_logit_softcapping", 30.0f);
}

const tn_arch_desc tn_arch_gemma2 = {
    .name = "gemma2",
    .id = TN_ARCH_GEMMA2,
    .rope = TN_ROPE_NEOX,
    .ffn = TN_FFN_GEGLU,
    .rms_eps = 1e-6f,
    .rope_base = 10000.0f,
    .head_dim_keys = true,
    .embd_scale = true,
    .synth_swa = 4,
    .load_hparams = gemma2_hparams,
    .synth_keys = gemma2_synth,
    .need =
        {
            TN_NEED_CORE,
            [TN_ROLE_ATTN_Q_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_K_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_V_B] = TN_NEED_OPT,
            [TN_ROLE_ATTN_POST_NORM] = TN_NEED_REQ,
            [TN_ROLE_FFN_POST_NORM] = TN_NEED_REQ,
        },
};
