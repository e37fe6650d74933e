/*
 * phi3.c — the "phi3" family (Phi-3 / Phi-3.5 mini and medium, Phi-4-mini): the llama block with
 * q, k and v in one matrix (attn_qkv, rows q | k | v) and the FFN's gate and up in one (ffn_up,
 * 2 n_ff rows, gate first; no ffn_gate), which the loader binds as row slices of the file's bytes
 * (llama.c tn_bind_fused) so the blocks multiply them as separate matrices; RoPE on halves (neox),
 * partial where rope.dimension_count < head_dim (Phi-4-mini: 96 of 128); LongRoPE for the 128k
 * models: frequency factors rope_factors_long / rope_factors_short (n_rot / 2 each), the long set
 * in a context longer than rope.scaling.original_context_length, and the rotated dims scaled by
 * rope.scaling.attn_factor (the converter computes sqrt(1 + ln(s) / ln(orig)), s = context_length
 * / orig; absent: 1, as llama.cpp). attention.sliding_window (Phi-3-mini-4k: 2047) is read and
 * checked but not applied: llama.cpp disables Phi's SWA (its PR 13676), so tern attends to every
 * position as llama.cpp does. llama.cpp: src/models/phi3.cpp.
 */
#include <math.h>

#include "model/model.h"

static tern_status phi3_hparams(const tn_gguf *g, tn_hparams *hp) {
    int32_t swa = 0;
    tern_status s = tn_model_key_dim(g, "phi3", "attention.sliding_window", false, 0, 1 << 24, &swa);
    if (s) return s;
    hp->n_swa = 0; /* as llama.cpp: read, not applied */
    if (tn_hp_q_dim(hp) != hp->n_embd)
        return tn_err(TERN_ERR_FORMAT, "model: phi3 needs n_head * head_dim (%lld) == n_embd (%d)",
                      (long long)tn_hp_q_dim(hp), hp->n_embd);
    return TERN_OK;
}

/* tern synth: Phi-4-mini's partial rotary (3/4 of each head), and LongRoPE as the converter
 * writes it for a model whose context is 4x the original (factor sets and attention factor). */
static void phi3_synth(tn_gguf_writer *w, tn_hparams *hp) {
    hp->n_rot = (hp->head_dim * 3 / 4) & ~1;
    const int32_t orig = hp->n_ctx_train / 4;
    tn_gguf_set_u32(w, "phi3.rope.scaling.original_context_length", (uint32_t)orig);
    tn_gguf_set_f32(w, "phi3.rope.scaling.attn_factor", sqrtf(1.0f + logf(4.0f) / logf((float)orig)));
    tn_gguf_set_u32(w, "phi3.attention.sliding_window", (uint32_t)hp->n_ctx_train);
}

const tn_arch_desc tn_arch_phi3 = {
    .name = "phi3",
    .id = TN_ARCH_PHI3,
    .rope = TN_ROPE_NEOX,
    .ffn = TN_FFN_SWIGLU,
    .rms_eps = 1e-5f,
    .rope_base = 10000.0f,
    .rope_dim_key = true,
    .gate_up_fused = true,
    .load_hparams = phi3_hparams,
    .synth_keys = phi3_synth,
    .need =
        {
            [TN_ROLE_ATTN_NORM] = TN_NEED_REQ,
            [TN_ROLE_ATTN_QKV] = TN_NEED_REQ,
            [TN_ROLE_ATTN_OUT] = TN_NEED_REQ,
            [TN_ROLE_FFN_NORM] = TN_NEED_REQ,
            [TN_ROLE_FFN_UP] = TN_NEED_REQ,
            [TN_ROLE_FFN_DOWN] = TN_NEED_REQ,
            [TN_ROLE_TOKEN_EMBD] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT_NORM] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT] = TN_NEED_OPT,
            [TN_ROLE_ROPE_FACTORS_LONG] = TN_NEED_OPT,
            [TN_ROLE_ROPE_FACTORS_SHORT] = TN_NEED_OPT,
        },
};
