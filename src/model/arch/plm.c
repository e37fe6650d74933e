/*
 * plm.c — the "plm" family (PLM-1.8B, PLM-Team; llama.cpp's LLM_ARCH_PLM, src/models/plm.cpp).
 * deepseek2's multi-head latent attention in its simplest form: q = Wq x (no low-rank q), each q
 * head nope + n_rot values (the rotated part last); attn_kv_a_mqa maps x to the latent c
 * (kv_lora_rank, RMS-normed by attn_kv_a_norm) and one shared rope key k_pe (n_rot); one
 * attn_kv_b gives a head's nope key and its value from c (split at load into the per-head
 * attn_k_b / attn_v_b tern's MLA block absorbs, as for older deepseek2 files); scores scaled by
 * 1 / sqrt(nope + n_rot) (no YaRN mscale). RoPE on adjacent pairs (llama_model_rope_type gives
 * LLAMA_ROPE_TYPE_NORM for PLM). The feed-forward is not gated: down(relu(up x)^2). The output
 * matrix is token_embd (llama.cpp loads token_embd as output; a file has no output.weight).
 * Keys (conversion/plm.py): plm.attention.kv_lora_rank, key_length = qk_nope + qk_rope,
 * value_length = v_head_dim, rope.dimension_count = qk_rope_head_dim.
 */
#include "model/model.h"

static tern_status plm_hparams(const tn_gguf *g, tn_hparams *hp) {
    const char *an = "plm";
    tern_status s;
    /* the common loader read key_length into head_dim (the q/k head, nope + rope) and n_rot */
    hp->v_head = hp->head_dim;
    if ((s = tn_model_key_dim(g, an, "attention.value_length", false, 1, 1 << 16, &hp->v_head))) return s;
    if ((s = tn_model_key_dim(g, an, "attention.kv_lora_rank", true, 1, 1 << 16, &hp->n_lora_kv))) return s;
    hp->mla_kv_b = true; /* one attn_kv_b, split at load */
    hp->n_lora_q = 0;
    if (hp->n_rot >= hp->head_dim)
        return tn_err(TERN_ERR_FORMAT, "model: plm.rope.dimension_count %d must be below the q/k head size %d (nope part >= 1)",
                      hp->n_rot, hp->head_dim);
    if ((int64_t)hp->n_head * TN_MAX(hp->head_dim, hp->v_head) > (1 << 22))
        return tn_err(TERN_ERR_FORMAT, "model: plm.attention.head_count %d x head size %d is too large", hp->n_head, hp->head_dim);
    if (hp->n_head_kv != hp->n_head)
        return tn_err(TERN_ERR_FORMAT, "model: plm.attention.head_count_kv %d must equal head_count %d (latent attention)",
                      hp->n_head_kv, hp->n_head);
    return TERN_OK; /* scores: 1 / sqrt(head_dim), the loader's default */
}

/* tern synth: the MLA sizes ride in the preset's fields (cmd_synth.c's mla_presets set n_lora_kv,
 * n_rot and v_head; head_dim is nope + n_rot); the keys PLM's converter writes. */
static void plm_synth(tn_gguf_writer *w, tn_hparams *hp) {
    tn_gguf_set_u32(w, "plm.attention.kv_lora_rank", (uint32_t)hp->n_lora_kv);
    tn_gguf_set_u32(w, "plm.attention.key_length", (uint32_t)hp->head_dim);
    tn_gguf_set_u32(w, "plm.attention.value_length", (uint32_t)hp->v_head);
    tn_gguf_set_u32(w, "plm.rope.dimension_count", (uint32_t)hp->n_rot);
    hp->mla_kv_b = true;
}

const tn_arch_desc tn_arch_plm = {
    .name = "plm",
    .id = TN_ARCH_PLM,
    .rope = TN_ROPE_NORM,
    .ffn = TN_FFN_RELU_SQR,
    .rms_eps = 1e-6f,
    .rope_base = 10000.0f,
    .mla = true,
    .load_hparams = plm_hparams,
    .synth_keys = plm_synth,
    .need =
        {
            [TN_ROLE_ATTN_NORM] = TN_NEED_REQ,
            [TN_ROLE_ATTN_Q] = TN_NEED_REQ,
            [TN_ROLE_ATTN_KV_A_MQA] = TN_NEED_REQ,
            [TN_ROLE_ATTN_KV_A_NORM] = TN_NEED_REQ,
            [TN_ROLE_ATTN_KV_B] = TN_NEED_REQ,
            [TN_ROLE_ATTN_OUT] = TN_NEED_REQ,
            [TN_ROLE_FFN_NORM] = TN_NEED_REQ,
            [TN_ROLE_FFN_UP] = TN_NEED_REQ,
            [TN_ROLE_FFN_DOWN] = TN_NEED_REQ,
            [TN_ROLE_TOKEN_EMBD] = TN_NEED_REQ,
            [TN_ROLE_OUTPUT_NORM] = TN_NEED_REQ,
        },
};
