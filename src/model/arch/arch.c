/*
 * arch.c — the registry: the tensor role table (names as llama.cpp's llama-arch.cpp spells them)
 * and the list of families. See arch.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

const tn_role_info tn_roles[TN_ROLE_COUNT] = {
    [TN_ROLE_ATTN_NORM] = {"attn_norm.weight", TN_DIM_EMBD, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_ATTN_Q] = {"attn_q.weight", TN_DIM_EMBD, TN_DIM_Q, true, TN_DIM_1},
    [TN_ROLE_ATTN_K] = {"attn_k.weight", TN_DIM_EMBD, TN_DIM_KV, true, TN_DIM_1},
    [TN_ROLE_ATTN_V] = {"attn_v.weight", TN_DIM_EMBD, TN_DIM_KV, true, TN_DIM_1},
    [TN_ROLE_ATTN_QKV] = {"attn_qkv.weight", TN_DIM_EMBD, TN_DIM_QKV, true, TN_DIM_1},
    [TN_ROLE_ATTN_OUT] = {"attn_output.weight", TN_DIM_O, TN_DIM_EMBD, true, TN_DIM_1},
    [TN_ROLE_ATTN_Q_B] = {"attn_q.bias", TN_DIM_Q, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_ATTN_K_B] = {"attn_k.bias", TN_DIM_KV, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_ATTN_V_B] = {"attn_v.bias", TN_DIM_KV, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_ATTN_Q_NORM] = {"attn_q_norm.weight", TN_DIM_Q_NORM, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_ATTN_K_NORM] = {"attn_k_norm.weight", TN_DIM_K_NORM, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_ATTN_POST_NORM] = {"post_attention_norm.weight", TN_DIM_EMBD, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_FFN_NORM] = {"ffn_norm.weight", TN_DIM_EMBD, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_FFN_GATE] = {"ffn_gate.weight", TN_DIM_EMBD, TN_DIM_FF, true, TN_DIM_1},
    [TN_ROLE_FFN_UP] = {"ffn_up.weight", TN_DIM_EMBD, TN_DIM_FF_UP, true, TN_DIM_1},
    [TN_ROLE_FFN_DOWN] = {"ffn_down.weight", TN_DIM_FF, TN_DIM_EMBD, true, TN_DIM_1},
    [TN_ROLE_FFN_POST_NORM] = {"post_ffw_norm.weight", TN_DIM_EMBD, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_FFN_GATE_INP] = {"ffn_gate_inp.weight", TN_DIM_EMBD, TN_DIM_EXPERT, true, TN_DIM_1},
    [TN_ROLE_FFN_GATE_EXPS] = {"ffn_gate_exps.weight", TN_DIM_EMBD, TN_DIM_FF_EXP, true, TN_DIM_EXPERT},
    [TN_ROLE_FFN_UP_EXPS] = {"ffn_up_exps.weight", TN_DIM_EMBD, TN_DIM_FF_EXP, true, TN_DIM_EXPERT},
    [TN_ROLE_FFN_DOWN_EXPS] = {"ffn_down_exps.weight", TN_DIM_FF_EXP, TN_DIM_EMBD, true, TN_DIM_EXPERT},
    [TN_ROLE_FFN_GATE_INP_SHEXP] = {"ffn_gate_inp_shexp.weight", TN_DIM_EMBD, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_FFN_GATE_SHEXP] = {"ffn_gate_shexp.weight", TN_DIM_EMBD, TN_DIM_FF_SHEXP, true, TN_DIM_1},
    [TN_ROLE_FFN_UP_SHEXP] = {"ffn_up_shexp.weight", TN_DIM_EMBD, TN_DIM_FF_SHEXP, true, TN_DIM_1},
    [TN_ROLE_FFN_DOWN_SHEXP] = {"ffn_down_shexp.weight", TN_DIM_FF_SHEXP, TN_DIM_EMBD, true, TN_DIM_1},
    [TN_ROLE_ATTN_SINKS] = {"attn_sinks.weight", TN_DIM_HEADS, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_ATTN_OUT_B] = {"attn_output.bias", TN_DIM_EMBD, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_FFN_GATE_INP_B] = {"ffn_gate_inp.bias", TN_DIM_EXPERT, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_FFN_GATE_EXPS_B] = {"ffn_gate_exps.bias", TN_DIM_FF_EXP, TN_DIM_EXPERT, false, TN_DIM_1},
    [TN_ROLE_FFN_UP_EXPS_B] = {"ffn_up_exps.bias", TN_DIM_FF_EXP, TN_DIM_EXPERT, false, TN_DIM_1},
    [TN_ROLE_FFN_DOWN_EXPS_B] = {"ffn_down_exps.bias", TN_DIM_EMBD, TN_DIM_EXPERT, false, TN_DIM_1},
    [TN_ROLE_ATTN_Q_A] = {"attn_q_a.weight", TN_DIM_EMBD, TN_DIM_Q_LORA, true, TN_DIM_1},
    [TN_ROLE_ATTN_Q_A_NORM] = {"attn_q_a_norm.weight", TN_DIM_Q_LORA, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_ATTN_Q_LB] = {"attn_q_b.weight", TN_DIM_Q_LORA, TN_DIM_Q, true, TN_DIM_1},
    [TN_ROLE_ATTN_KV_A_MQA] = {"attn_kv_a_mqa.weight", TN_DIM_EMBD, TN_DIM_KV_A, true, TN_DIM_1},
    [TN_ROLE_ATTN_KV_A_NORM] = {"attn_kv_a_norm.weight", TN_DIM_KV_LORA, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_ATTN_KV_B] = {"attn_kv_b.weight", TN_DIM_KV_LORA, TN_DIM_KV_B, true, TN_DIM_1},
    [TN_ROLE_ATTN_K_B_MLA] = {"attn_k_b.weight", TN_DIM_NOPE, TN_DIM_KV_LORA, true, TN_DIM_HEADS},
    [TN_ROLE_ATTN_V_B_MLA] = {"attn_v_b.weight", TN_DIM_KV_LORA, TN_DIM_V_HEAD, true, TN_DIM_HEADS},
    [TN_ROLE_FFN_EXP_PROBS_B] = {"exp_probs_b.bias", TN_DIM_EXPERT, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_TOKEN_EMBD] = {"token_embd.weight", TN_DIM_EMBD, TN_DIM_VOCAB, true, TN_DIM_1},
    [TN_ROLE_OUTPUT_NORM] = {"output_norm.weight", TN_DIM_EMBD, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_OUTPUT] = {"output.weight", TN_DIM_EMBD, TN_DIM_VOCAB, true, TN_DIM_1},
    [TN_ROLE_ROPE_FREQS] = {"rope_freqs.weight", TN_DIM_ROT_HALF, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_ROPE_FACTORS_LONG] = {"rope_factors_long.weight", TN_DIM_ROT_HALF, TN_DIM_1, false, TN_DIM_1},
    [TN_ROLE_ROPE_FACTORS_SHORT] = {"rope_factors_short.weight", TN_DIM_ROT_HALF, TN_DIM_1, false, TN_DIM_1},
};

extern const tn_arch_desc tn_arch_llama, tn_arch_qwen2, tn_arch_qwen3, tn_arch_smollm3, tn_arch_gemma2, tn_arch_gemma3,
    tn_arch_phi3, tn_arch_qwen3moe, tn_arch_olmoe, tn_arch_qwen2moe, tn_arch_gpt_oss, tn_arch_deepseek2, tn_arch_plm;

static const tn_arch_desc *const tn_all_archs[] = {&tn_arch_llama, &tn_arch_qwen2, &tn_arch_qwen3, &tn_arch_smollm3,
                                                   &tn_arch_gemma2, &tn_arch_gemma3, &tn_arch_phi3,
                                                   &tn_arch_qwen3moe, &tn_arch_olmoe, &tn_arch_qwen2moe,
                                                   &tn_arch_gpt_oss, &tn_arch_deepseek2, &tn_arch_plm};

size_t tn_arch_count(void) { return TN_ARRAY_LEN(tn_all_archs); }
const tn_arch_desc *tn_arch_at(size_t i) { return i < TN_ARRAY_LEN(tn_all_archs) ? tn_all_archs[i] : NULL; }

const tn_arch_desc *tn_arch_find(const char *name, size_t len) {
    for (size_t i = 0; i < TN_ARRAY_LEN(tn_all_archs); i++)
        if (strlen(tn_all_archs[i]->name) == len && !memcmp(tn_all_archs[i]->name, name, len)) return tn_all_archs[i];
    return NULL;
}

void tn_arch_names(char *buf, size_t cap) {
    size_t n = 0;
    if (cap) buf[0] = 0;
    for (size_t i = 0; i < TN_ARRAY_LEN(tn_all_archs) && n < cap; i++) {
        int k = snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", tn_all_archs[i]->name);
        if (k < 0) break;
        n += (size_t)k;
    }
}

int64_t tn_dim_value(const tn_hparams *hp, tn_dim d) {
    switch (d) {
    case TN_DIM_1: return 1;
    case TN_DIM_EMBD: return hp->n_embd;
    case TN_DIM_Q: return (int64_t)hp->n_head * hp->head_dim;
    case TN_DIM_KV: return (int64_t)hp->n_head_kv * hp->head_dim;
    case TN_DIM_HEAD: return hp->head_dim;
    case TN_DIM_FF: return hp->n_ff;
    case TN_DIM_VOCAB: return hp->n_vocab;
    case TN_DIM_ROT_HALF: return hp->n_rot / 2;
    case TN_DIM_QKV: return (int64_t)(hp->n_head + 2 * hp->n_head_kv) * hp->head_dim;
    case TN_DIM_FF_UP: return hp->family && hp->family->gate_up_fused ? 2 * (int64_t)hp->n_ff : hp->n_ff;
    case TN_DIM_EXPERT: return hp->n_expert;
    case TN_DIM_FF_EXP: return hp->n_ff_exp;
    case TN_DIM_FF_SHEXP: return hp->n_ff_shexp;
    case TN_DIM_HEADS: return hp->n_head;
    case TN_DIM_O: return (int64_t)hp->n_head * (hp->v_head > 0 ? hp->v_head : hp->head_dim);
    case TN_DIM_Q_LORA: return hp->n_lora_q;
    case TN_DIM_KV_LORA: return hp->n_lora_kv;
    case TN_DIM_KV_A: return (int64_t)hp->n_lora_kv + hp->n_rot;
    case TN_DIM_NOPE: return hp->head_dim - hp->n_rot;
    case TN_DIM_V_HEAD: return hp->v_head;
    case TN_DIM_KV_B: return (int64_t)hp->n_head * (hp->head_dim - hp->n_rot + hp->v_head);
    case TN_DIM_Q_NORM: return hp->family && hp->family->qk_norm_full ? (int64_t)hp->n_head * hp->head_dim : hp->head_dim;
    case TN_DIM_K_NORM: return hp->family && hp->family->qk_norm_full ? (int64_t)hp->n_head_kv * hp->head_dim : hp->head_dim;
    }
    return 0;
}

tn_need tn_arch_need(const tn_hparams *hp, tn_role r) {
    const uint8_t *need = hp->family->need;
    if (need[TN_ROLE_FFN_GATE_INP] == TN_NEED_NO) return (tn_need)need[r];
    const bool dense = r == TN_ROLE_FFN_GATE || r == TN_ROLE_FFN_UP || r == TN_ROLE_FFN_DOWN;
    if (TN_MOE_ROLE(r)) return hp->n_expert > 0 ? TN_NEED_REQ : TN_NEED_NO;
    if (dense && hp->n_expert > 0) return TN_NEED_NO;
    if (dense && need[r] == TN_NEED_OPT) return TN_NEED_REQ; /* a family that may have experts */
    return (tn_need)need[r];
}

tn_need tn_arch_need_layer(const tn_hparams *hp, int32_t il, tn_role r) {
    if (!hp->family->mla) return tn_arch_need(hp, r);
    switch (r) { /* the q path by q_lora_rank, the up-projections by the file's form */
    case TN_ROLE_ATTN_Q: return hp->n_lora_q > 0 ? TN_NEED_NO : TN_NEED_REQ;
    case TN_ROLE_ATTN_Q_A:
    case TN_ROLE_ATTN_Q_A_NORM:
    case TN_ROLE_ATTN_Q_LB: return hp->n_lora_q > 0 ? TN_NEED_REQ : TN_NEED_NO;
    case TN_ROLE_ATTN_KV_B: return hp->mla_kv_b ? TN_NEED_REQ : TN_NEED_NO;
    case TN_ROLE_ATTN_K_B_MLA:
    case TN_ROLE_ATTN_V_B_MLA: return hp->mla_kv_b ? TN_NEED_NO : TN_NEED_REQ;
    default: break;
    }
    if (il < 0 || il >= hp->n_layer_dense_lead || r >= TN_ROLE_N_LAYER) return tn_arch_need(hp, r);
    /* a leading dense layer: the dense FFN, nothing of the experts */
    if (r == TN_ROLE_FFN_GATE || r == TN_ROLE_FFN_UP || r == TN_ROLE_FFN_DOWN) return TN_NEED_REQ;
    if (TN_MOE_ROLE(r) || r == TN_ROLE_FFN_EXP_PROBS_B || (r >= TN_ROLE_FFN_GATE_INP_SHEXP && r <= TN_ROLE_FFN_DOWN_SHEXP))
        return TN_NEED_NO;
    return tn_arch_need(hp, r);
}

void tn_role_tensor_name(tn_role r, int32_t il, char *buf, size_t cap) {
    if (r < TN_ROLE_N_LAYER) snprintf(buf, cap, "blk.%d.%s", (int)il, tn_roles[r].name);
    else snprintf(buf, cap, "%s", tn_roles[r].name);
}

bool tn_role_parse(const char *name, int32_t *layer, tn_role *role) {
    const char *suffix = name;
    *layer = -1;
    if (!strncmp(name, "blk.", 4)) {
        const char *p = name + 4;
        long v = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9' && digits < 9) v = v * 10 + (*p++ - '0'), digits++;
        if (!digits || *p != '.' || (digits > 1 && name[4] == '0')) return false;
        *layer = (int32_t)v;
        suffix = p + 1;
    }
    const int lo = *layer >= 0 ? 0 : TN_ROLE_N_LAYER, hi = *layer >= 0 ? TN_ROLE_N_LAYER : TN_ROLE_COUNT;
    for (int r = lo; r < hi; r++)
        if (!strcmp(suffix, tn_roles[r].name)) {
            *role = (tn_role)r;
            return true;
        }
    return false;
}
