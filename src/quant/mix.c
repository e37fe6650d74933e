/*
 * mix.c — llama.cpp's per-tensor quantization type selection (see mix.h), restricted to the
 * file types tern can write (legacy, k-quants, the i-quants IQ1_S .. IQ4_XS with their IQ2_M /
 * IQ3_XS / IQ3_M mixes, TQ1_0/TQ2_0, MXFP4_MOE, f16/bf16/f32) plus tern's any-bit types. Each
 * branch mirrors a branch of llama_tensor_get_type_impl (34af94cd9; the i-quant branches at
 * 3f545bec, which agrees on the others), in the same order, so a reader can diff the two.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "quant/mix.h"
#include "quant/tq.h"
#include "quant/vq.h"

static const struct {
    const char *name;
    tn_ftype f;
    tn_dtype t;
} ftypes[] = {
    {"F32", TN_FTYPE_ALL_F32, TN_F32},         {"F16", TN_FTYPE_MOSTLY_F16, TN_F16},
    {"BF16", TN_FTYPE_MOSTLY_BF16, TN_BF16},   {"Q4_0", TN_FTYPE_MOSTLY_Q4_0, TN_Q4_0},
    {"Q4_1", TN_FTYPE_MOSTLY_Q4_1, TN_Q4_1},   {"Q5_0", TN_FTYPE_MOSTLY_Q5_0, TN_Q5_0},
    {"Q5_1", TN_FTYPE_MOSTLY_Q5_1, TN_Q5_1},   {"Q8_0", TN_FTYPE_MOSTLY_Q8_0, TN_Q8_0},
    {"Q2_K", TN_FTYPE_MOSTLY_Q2_K, TN_Q2_K},   {"Q2_K_S", TN_FTYPE_MOSTLY_Q2_K_S, TN_Q2_K},
    {"Q3_K_S", TN_FTYPE_MOSTLY_Q3_K_S, TN_Q3_K}, {"Q3_K_M", TN_FTYPE_MOSTLY_Q3_K_M, TN_Q3_K},
    {"Q3_K_L", TN_FTYPE_MOSTLY_Q3_K_L, TN_Q3_K}, {"Q4_K_S", TN_FTYPE_MOSTLY_Q4_K_S, TN_Q4_K},
    {"Q4_K_M", TN_FTYPE_MOSTLY_Q4_K_M, TN_Q4_K}, {"Q5_K_S", TN_FTYPE_MOSTLY_Q5_K_S, TN_Q5_K},
    {"Q5_K_M", TN_FTYPE_MOSTLY_Q5_K_M, TN_Q5_K}, {"Q6_K", TN_FTYPE_MOSTLY_Q6_K, TN_Q6_K},
    {"IQ4_NL", TN_FTYPE_MOSTLY_IQ4_NL, TN_IQ4_NL}, {"IQ4_XS", TN_FTYPE_MOSTLY_IQ4_XS, TN_IQ4_XS},
    {"IQ2_XXS", TN_FTYPE_MOSTLY_IQ2_XXS, TN_IQ2_XXS}, {"IQ2_XS", TN_FTYPE_MOSTLY_IQ2_XS, TN_IQ2_XS},
    {"IQ2_S", TN_FTYPE_MOSTLY_IQ2_S, TN_IQ2_XS}, {"IQ2_M", TN_FTYPE_MOSTLY_IQ2_M, TN_IQ2_S},
    {"IQ3_XXS", TN_FTYPE_MOSTLY_IQ3_XXS, TN_IQ3_XXS}, {"IQ3_XS", TN_FTYPE_MOSTLY_IQ3_XS, TN_IQ3_S},
    {"IQ3_S", TN_FTYPE_MOSTLY_IQ3_S, TN_IQ3_S}, {"IQ3_M", TN_FTYPE_MOSTLY_IQ3_M, TN_IQ3_S},
    {"IQ1_S", TN_FTYPE_MOSTLY_IQ1_S, TN_IQ1_S}, {"IQ1_M", TN_FTYPE_MOSTLY_IQ1_M, TN_IQ1_M},
    {"TQ1_0", TN_FTYPE_MOSTLY_TQ1_0, TN_TQ1_0}, {"TQ2_0", TN_FTYPE_MOSTLY_TQ2_0, TN_TQ2_0},
    {"MXFP4_MOE", TN_FTYPE_MOSTLY_MXFP4_MOE, TN_MXFP4},
};

bool tn_ftype_from_name(const char *name, tn_ftype *out) {
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++)
        if (!strcasecmp(name, ftypes[i].name)) {
            *out = ftypes[i].f;
            return true;
        }
    /* llama-quantize also accepts Q3_K / Q4_K / Q5_K as the _M mixes */
    if (!strcasecmp(name, "Q3_K")) return (*out = TN_FTYPE_MOSTLY_Q3_K_M), true;
    if (!strcasecmp(name, "Q4_K")) return (*out = TN_FTYPE_MOSTLY_Q4_K_M), true;
    if (!strcasecmp(name, "Q5_K")) return (*out = TN_FTYPE_MOSTLY_Q5_K_M), true;
    /* the tensor type's name for the file type llama-quantize calls MXFP4_MOE */
    if (!strcasecmp(name, "MXFP4")) return (*out = TN_FTYPE_MOSTLY_MXFP4_MOE), true;
    return false;
}

const char *tn_ftype_name(tn_ftype f) {
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++)
        if (ftypes[i].f == f) return ftypes[i].name;
    return f == TN_FTYPE_TERN ? "TERN" : NULL;
}

bool tn_ftype_default_type(tn_ftype f, tn_dtype *out) {
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++)
        if (ftypes[i].f == f) {
            *out = ftypes[i].t;
            return true;
        }
    return false;
}

/* ---- order ---------------------------------------------------------------------------------- */

static int layer_of(const char *name) {
    int l = -1;
    if (sscanf(name, "blk.%d.", &l) != 1) l = -1;
    return l;
}

void tn_qmix_sort(const char *const *names, size_t n, size_t *idx) {
    /* insertion sort keeps this re-entrant (no global state); n is a few thousand at most */
    for (size_t i = 0; i < n; i++) idx[i] = i;
    for (size_t i = 1; i < n; i++) {
        size_t v = idx[i], j = i;
        while (j > 0) {
            const char *a = names[idx[j - 1]], *b = names[v];
            int la = layer_of(a), lb = layer_of(b);
            int c = la != lb ? (la < lb ? -1 : 1) : strcmp(a, b);
            if (c <= 0) break;
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = v;
    }
}

/* ---- categories ----------------------------------------------------------------------------- */

typedef enum cat {
    CAT_OTHER, CAT_OUTPUT, CAT_TOKEN_EMBD, CAT_ATTN_QKV, CAT_ATTN_KV_B, CAT_ATTN_V, CAT_ATTN_K,
    CAT_ATTN_Q, CAT_ATTN_OUTPUT, CAT_FFN_UP, CAT_FFN_GATE, CAT_FFN_DOWN
} cat;

static bool has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static cat category(const char *n) {
    if (!strcmp(n, "output.weight")) return CAT_OUTPUT;
    if (!strcmp(n, "token_embd.weight") || !strcmp(n, "per_layer_token_embd.weight")) return CAT_TOKEN_EMBD;
    if (has(n, "attn_qkv.weight")) return CAT_ATTN_QKV;
    if (has(n, "attn_kv_b.weight")) return CAT_ATTN_KV_B;
    if (has(n, "attn_v.weight")) return CAT_ATTN_V;
    if (has(n, "attn_k.weight")) return CAT_ATTN_K;
    if (has(n, "attn_q.weight")) return CAT_ATTN_Q;
    if (has(n, "attn_output.weight")) return CAT_ATTN_OUTPUT;
    if (has(n, "ffn_up")) return CAT_FFN_UP;
    if (has(n, "ffn_gate")) return CAT_FFN_GATE;
    if (has(n, "ffn_down")) return CAT_FFN_DOWN;
    return CAT_OTHER;
}

static bool is_attn_v(cat c) { return c == CAT_ATTN_V || c == CAT_ATTN_QKV || c == CAT_ATTN_KV_B; }

static int n_dims_of(const tn_qmix_tensor *t) {
    for (int i = 3; i >= 1; i--)
        if (t->ne[i] > 1) return i + 1;
    return 1;
}

/* tensor_allows_quantization */
static bool allows_quantization(const tn_qmix_opts *o, const tn_qmix_tensor *t) {
    if (n_dims_of(t) < 2) return false;
    const char *n = t->name;
    size_t len = strlen(n);
    bool q = len >= 6 && !strcmp(n + len - 6, "weight");
    q &= !has(n, "_norm.weight");
    q &= !o->leave_output || strcmp(n, "output.weight") != 0;
    static const char *const never[] = {
        "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
        "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
        "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
        "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
        "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
        "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
        "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos",
        ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd"};
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++) q &= !has(n, never[i]);
    q &= strcmp(n, "position_embd.weight") != 0;
    q &= strcmp(n, "token_types.weight") != 0;
    return q;
}

static int64_t blck(uint32_t t) {
    const tn_dtype_traits *tr = tn_dtype_get(t);
    return tr ? tr->blck_size : 1;
}

static bool is_quantized(uint32_t t) {
    const tn_dtype_traits *tr = tn_dtype_get(t);
    return tr && tr->is_quantized;
}

/* tensor_type_fallback */
static uint32_t fallback(const tn_qmix_tensor *t, uint32_t target, bool *fell) {
    const int64_t ncols = t->ne[0];
    const bool vq_3d = tn_vq_is(target) && t->ne[2] > 1; /* a codebook per 2-D tensor (quant/vq.h) */
    if (ncols % blck(target) == 0 && !vq_3d) return target;
    *fell = true;
    uint32_t r;
    switch (target) {
    case TN_Q2_K:
    case TN_Q3_K:
    case TN_TQ1_0:
    case TN_TQ2_0: r = TN_Q4_0; break;
    case TN_IQ1_S:
    case TN_IQ1_M:
    case TN_IQ2_XXS:
    case TN_IQ2_XS:
    case TN_IQ2_S:
    case TN_IQ3_XXS:
    case TN_IQ3_S:
    case TN_IQ4_XS: r = TN_IQ4_NL; break;
    case TN_Q4_K: r = TN_Q5_0; break;
    case TN_Q5_K: r = TN_Q5_1; break;
    case TN_Q6_K: r = TN_Q8_0; break;
    default:
        /* tern types: the same bits with the smallest group that fits, else q8_0 */
        if (tn_tq_is(target)) {
            tn_tq_params p;
            tn_tq_params_of(target, &p);
            r = TN_Q8_0;
            for (int g = p.group; g >= 32; g /= 2)
                if (ncols % g == 0) {
                    p.group = g;
                    r = tn_tq_dtype(&p);
                    break;
                }
        } else if (tn_vq_is(target)) {
            r = TN_Q4_0;
        } else {
            r = TN_F16; /* llama.cpp throws here; no llama.cpp type tern writes reaches it */
        }
    }
    if (ncols % blck(r) != 0) r = TN_F16;
    return r;
}

typedef struct state {
    int n_attention_wv, i_attention_wv;
    int n_ffn_down, i_ffn_down, n_ffn_gate, i_ffn_gate, n_ffn_up, i_ffn_up;
    bool has_tied_embeddings;
} state;

/* the file types whose mixes keep most tensors at 1-2 bits (one branch of llama.cpp's) */
static bool low_iq(tn_ftype f) {
    return f == TN_FTYPE_MOSTLY_IQ2_XXS || f == TN_FTYPE_MOSTLY_IQ2_XS || f == TN_FTYPE_MOSTLY_IQ1_S ||
           f == TN_FTYPE_MOSTLY_IQ2_S || f == TN_FTYPE_MOSTLY_IQ2_M || f == TN_FTYPE_MOSTLY_IQ1_M;
}

/* IQ2_S and IQ2_M raise to iq3_s where the other low mixes raise to q2_K */
static uint32_t low_iq_more(tn_ftype f) {
    return f == TN_FTYPE_MOSTLY_IQ2_S || f == TN_FTYPE_MOSTLY_IQ2_M ? TN_IQ3_S : TN_Q2_K;
}

/* layer_info: the layer of a ffn tensor is its counter, or (experts) the number in its name */
static int ffn_layer(const tn_qmix_model *m, const tn_qmix_tensor *t, int i_layer, int n_layer) {
    if (m->n_expert > 1) {
        int l = -1;
        if (sscanf(t->name, "blk.%d.", &l) == 1 && l >= 0 && l < n_layer) i_layer = l;
    }
    return i_layer;
}

static bool use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

/* tern any-bit mixes: the same shape as *_K_M (more bits where llama.cpp spends them) */
static uint32_t tq_more(uint32_t t, int extra) {
    tn_tq_params p;
    tn_tq_params_of(t, &p);
    p.bits = p.bits + extra > 8 ? 8 : p.bits + extra;
    return tn_tq_dtype(&p);
}

/* llama_tensor_get_type_impl */
static uint32_t type_impl(state *qs, const tn_qmix_model *m, const tn_qmix_opts *o, uint32_t new_type,
                          const tn_qmix_tensor *t, tn_ftype ftype, cat c) {
    const bool falcon = m->falcon;
    const int n_gqa = m->n_head_kv > 0 ? m->n_head / m->n_head_kv : 1;
    const bool tq = tn_tq_is(new_type);

    if (c == CAT_OUTPUT || (qs->has_tied_embeddings && c == CAT_TOKEN_EMBD)) {
        if (o->output_type >= 0) {
            new_type = (uint32_t)o->output_type;
        } else {
            const int64_t nx = t->ne[0];
            const int64_t qk_k = blck(new_type);
            if (ftype == TN_FTYPE_MOSTLY_MXFP4_MOE || falcon || nx % qk_k != 0) new_type = TN_Q8_0;
            else if (low_iq(ftype) || ftype == TN_FTYPE_MOSTLY_IQ3_XXS) new_type = TN_Q5_K;
            else if (new_type != TN_Q8_0) new_type = TN_Q6_K;
            if (tq && new_type == TN_Q6_K && nx % 256 != 0) new_type = TN_Q8_0;
        }
    } else if (ftype == TN_FTYPE_MOSTLY_MXFP4_MOE) {
        /* expert tensors (3-D) mxfp4, every other tensor q8_0; no counters advance */
        new_type = t->ne[2] > 1 ? TN_MXFP4 : TN_Q8_0;
    } else if (c == CAT_TOKEN_EMBD) {
        if (o->token_embd_type >= 0) new_type = (uint32_t)o->token_embd_type;
        else if (tq) new_type = tq_more(new_type, 2); /* embeddings: higher precision */
        else if (ftype == TN_FTYPE_MOSTLY_IQ2_XXS || ftype == TN_FTYPE_MOSTLY_IQ2_XS || ftype == TN_FTYPE_MOSTLY_IQ1_S ||
                 ftype == TN_FTYPE_MOSTLY_IQ1_M)
            new_type = TN_Q2_K;
        else if (ftype == TN_FTYPE_MOSTLY_IQ2_S || ftype == TN_FTYPE_MOSTLY_IQ2_M || ftype == TN_FTYPE_MOSTLY_IQ3_XXS)
            new_type = TN_IQ3_S;
        else if (ftype == TN_FTYPE_MOSTLY_TQ1_0 || ftype == TN_FTYPE_MOSTLY_TQ2_0) new_type = TN_Q4_K;
    } else if (low_iq(ftype)) {
        /* no ffn_gate / ffn_up counters advance here (they only matter to IQ3_XS) */
        if (is_attn_v(c)) {
            new_type = n_gqa >= 4 || m->n_expert >= 4 ? TN_Q4_K : low_iq_more(ftype);
            ++qs->i_attention_wv;
        } else if (m->n_expert == 8 && c == CAT_ATTN_K) {
            new_type = TN_Q4_K;
        } else if (c == CAT_FFN_DOWN) {
            if (qs->i_ffn_down < qs->n_ffn_down / 8) new_type = low_iq_more(ftype);
            ++qs->i_ffn_down;
        } else if (c == CAT_ATTN_OUTPUT) {
            if (m->n_expert == 8) new_type = TN_Q5_K;
            else if (ftype == TN_FTYPE_MOSTLY_IQ1_S || ftype == TN_FTYPE_MOSTLY_IQ1_M) new_type = TN_IQ2_XXS;
            else if (ftype == TN_FTYPE_MOSTLY_IQ2_S || ftype == TN_FTYPE_MOSTLY_IQ2_M) new_type = TN_IQ3_S;
        }
    } else if (is_attn_v(c)) {
        if (tq) {
            if (use_more_bits(qs->i_attention_wv, qs->n_attention_wv)) new_type = tq_more(new_type, 1);
        } else if (ftype == TN_FTYPE_MOSTLY_Q2_K) {
            new_type = n_gqa >= 4 ? TN_Q4_K : TN_Q3_K;
        } else if (ftype == TN_FTYPE_MOSTLY_Q2_K_S && n_gqa >= 4) {
            new_type = TN_Q4_K;
        } else if (ftype == TN_FTYPE_MOSTLY_IQ3_XXS) {
            new_type = n_gqa >= 4 ? TN_Q4_K : !o->has_imatrix ? TN_IQ3_S : TN_IQ3_XXS;
        } else if ((ftype == TN_FTYPE_MOSTLY_IQ3_XS || ftype == TN_FTYPE_MOSTLY_IQ3_S) && n_gqa >= 4) {
            new_type = TN_Q4_K;
        } else if (ftype == TN_FTYPE_MOSTLY_IQ3_M) {
            new_type = TN_Q4_K;
        } else if (ftype == TN_FTYPE_MOSTLY_Q3_K_M) {
            new_type = qs->i_attention_wv < 2 ? TN_Q5_K : TN_Q4_K;
        } else if (ftype == TN_FTYPE_MOSTLY_Q3_K_L) {
            new_type = TN_Q5_K;
        } else if ((ftype == TN_FTYPE_MOSTLY_IQ4_NL || ftype == TN_FTYPE_MOSTLY_IQ4_XS) && n_gqa >= 4) {
            new_type = TN_Q5_K;
        } else if ((ftype == TN_FTYPE_MOSTLY_Q4_K_M || ftype == TN_FTYPE_MOSTLY_Q5_K_M) &&
                   use_more_bits(qs->i_attention_wv, qs->n_attention_wv)) {
            new_type = TN_Q6_K;
        } else if (ftype == TN_FTYPE_MOSTLY_Q4_K_S && qs->i_attention_wv < 4) {
            new_type = TN_Q5_K;
        }
        if (m->is_70b && (new_type == TN_Q3_K || new_type == TN_Q4_K)) new_type = TN_Q5_K;
        if (m->n_expert == 8) new_type = TN_Q8_0;
        ++qs->i_attention_wv;
    } else if (c == CAT_ATTN_K) {
        if (m->n_expert == 8) new_type = TN_Q8_0;
        else if (ftype == TN_FTYPE_MOSTLY_IQ3_XS) new_type = TN_IQ3_XXS;
        else if (ftype == TN_FTYPE_MOSTLY_IQ3_XXS) new_type = TN_IQ2_S;
    } else if (c == CAT_ATTN_Q) {
        if (ftype == TN_FTYPE_MOSTLY_IQ3_XS) new_type = TN_IQ3_XXS;
        else if (ftype == TN_FTYPE_MOSTLY_IQ3_XXS) new_type = TN_IQ2_S;
    } else if (c == CAT_FFN_DOWN) {
        const int n_layer = qs->n_ffn_down, i_layer = ffn_layer(m, t, qs->i_ffn_down, n_layer);
        if (tq) {
            if (use_more_bits(i_layer, n_layer)) new_type = tq_more(new_type, 1);
        } else if (ftype == TN_FTYPE_MOSTLY_Q2_K) {
            new_type = TN_Q3_K;
        } else if (ftype == TN_FTYPE_MOSTLY_Q2_K_S) {
            if (i_layer < n_layer / 8) new_type = TN_Q4_K;
        } else if (ftype == TN_FTYPE_MOSTLY_IQ3_XXS && !o->has_imatrix) {
            new_type = i_layer < n_layer / 8 ? TN_Q4_K : TN_Q3_K;
        } else if (ftype == TN_FTYPE_MOSTLY_Q3_K_M) {
            new_type = i_layer < n_layer / 16                      ? TN_Q5_K
                       : !falcon || use_more_bits(i_layer, n_layer) ? TN_Q4_K
                                                                    : TN_Q3_K;
        } else if (ftype == TN_FTYPE_MOSTLY_IQ3_M &&
                   (i_layer < n_layer / 8 || (m->n_expert == 8 && use_more_bits(i_layer, n_layer)))) {
            new_type = TN_Q4_K;
        } else if (ftype == TN_FTYPE_MOSTLY_Q3_K_L) {
            new_type = falcon ? TN_Q4_K : TN_Q5_K;
        } else if (ftype == TN_FTYPE_MOSTLY_Q4_K_M) {
            if (falcon) {
                new_type = i_layer < n_layer / 16 ? TN_Q6_K : use_more_bits(i_layer, n_layer) ? TN_Q5_K : TN_Q4_K;
            } else if (use_more_bits(i_layer, n_layer)) {
                new_type = TN_Q6_K;
            }
        } else if (i_layer < n_layer / 8 && (ftype == TN_FTYPE_MOSTLY_IQ4_NL || ftype == TN_FTYPE_MOSTLY_IQ4_XS) &&
                   !o->has_imatrix) {
            new_type = TN_Q5_K;
        } else if (ftype == TN_FTYPE_MOSTLY_Q5_K_M && use_more_bits(i_layer, n_layer)) {
            new_type = TN_Q6_K;
        } else if (ftype == TN_FTYPE_MOSTLY_Q4_K_S && !falcon && i_layer < n_layer / 8) {
            new_type = TN_Q5_K;
        } else if ((ftype == TN_FTYPE_MOSTLY_Q4_0 || ftype == TN_FTYPE_MOSTLY_Q5_0) && o->has_imatrix &&
                   i_layer < n_layer / 8) {
            new_type = ftype == TN_FTYPE_MOSTLY_Q4_0 ? TN_Q4_1 : TN_Q5_1;
        }
        ++qs->i_ffn_down;
    } else if (c == CAT_ATTN_OUTPUT) {
        if (!falcon) {
            if (m->n_expert == 8) {
                if (ftype == TN_FTYPE_MOSTLY_Q2_K || ftype == TN_FTYPE_MOSTLY_IQ3_XS ||
                    ftype == TN_FTYPE_MOSTLY_IQ3_XXS || ftype == TN_FTYPE_MOSTLY_Q3_K_S ||
                    ftype == TN_FTYPE_MOSTLY_Q3_K_M || ftype == TN_FTYPE_MOSTLY_IQ4_NL ||
                    ftype == TN_FTYPE_MOSTLY_Q4_K_S || ftype == TN_FTYPE_MOSTLY_Q4_K_M ||
                    ftype == TN_FTYPE_MOSTLY_IQ3_S || ftype == TN_FTYPE_MOSTLY_IQ3_M || ftype == TN_FTYPE_MOSTLY_IQ4_XS)
                    new_type = TN_Q5_K;
            } else {
                if (ftype == TN_FTYPE_MOSTLY_Q2_K) new_type = TN_Q3_K;
                else if (ftype == TN_FTYPE_MOSTLY_IQ3_XXS) new_type = TN_IQ3_S;
                else if (ftype == TN_FTYPE_MOSTLY_Q3_K_M) new_type = TN_Q4_K;
                else if (ftype == TN_FTYPE_MOSTLY_Q3_K_L) new_type = TN_Q5_K;
                else if (ftype == TN_FTYPE_MOSTLY_IQ3_M) new_type = TN_Q4_K;
            }
        } else {
            if (ftype == TN_FTYPE_MOSTLY_Q3_K_L) new_type = TN_Q4_K;
        }
    } else if (c == CAT_ATTN_QKV) {
        if (ftype == TN_FTYPE_MOSTLY_Q3_K_M || ftype == TN_FTYPE_MOSTLY_Q3_K_L || ftype == TN_FTYPE_MOSTLY_IQ3_M)
            new_type = TN_Q4_K;
        else if (ftype == TN_FTYPE_MOSTLY_Q4_K_M) new_type = TN_Q5_K;
        else if (ftype == TN_FTYPE_MOSTLY_Q5_K_M) new_type = TN_Q6_K;
    } else if (c == CAT_FFN_GATE || c == CAT_FFN_UP) {
        int *cnt = c == CAT_FFN_GATE ? &qs->i_ffn_gate : &qs->i_ffn_up;
        const int n_layer = c == CAT_FFN_GATE ? qs->n_ffn_gate : qs->n_ffn_up, i_layer = ffn_layer(m, t, *cnt, n_layer);
        if (ftype == TN_FTYPE_MOSTLY_IQ3_XS && i_layer >= n_layer / 8 && i_layer < 7 * n_layer / 8) new_type = TN_IQ3_XXS;
        ++*cnt;
    }
    return new_type;
}

void tn_qmix_plan(tn_ftype ftype, tn_dtype default_type, const tn_qmix_model *m, const tn_qmix_opts *o,
                  const tn_qmix_tensor *t, size_t n, tn_qmix_choice *out) {
    state qs = {0};
    qs.has_tied_embeddings = true;
    for (size_t i = 0; i < n; i++) {
        cat c = category(t[i].name);
        if (is_attn_v(c)) ++qs.n_attention_wv;
        if (c == CAT_OUTPUT) qs.has_tied_embeddings = false;
    }
    qs.n_ffn_down = qs.n_ffn_gate = qs.n_ffn_up = m->n_layer;

    for (size_t i = 0; i < n; i++) {
        tn_qmix_choice *ch = &out[i];
        memset(ch, 0, sizeof *ch);
        ch->type = t[i].type;
        ch->quantizable = allows_quantization(o, &t[i]);
        if (!ch->quantizable) {
            ch->wanted = ch->type;
            continue;
        }
        cat c = category(t[i].name);
        if (o->token_embd_type >= 0 && c == CAT_TOKEN_EMBD) {
            ch->type = ch->wanted = (uint32_t)o->token_embd_type;
            continue;
        }
        if (o->output_type >= 0 && c == CAT_OUTPUT) {
            ch->type = ch->wanted = (uint32_t)o->output_type;
            continue;
        }
        uint32_t nt = (uint32_t)default_type;
        if (is_quantized(nt)) {
            if (o->override) {
                int ov = o->override(o->override_user, t[i].name);
                if (ov >= 0) {
                    nt = (uint32_t)ov;
                    ch->manual = true;
                }
            }
            if (!ch->manual && !o->pure) nt = type_impl(&qs, m, o, nt, &t[i], ftype, c);
            ch->wanted = nt;
            nt = fallback(&t[i], nt, &ch->fallback);
        }
        ch->wanted = ch->fallback ? ch->wanted : nt;
        ch->type = nt;
    }
}

bool tn_qmix_requires_imatrix(const char *name, uint32_t t, tn_ftype ftype) {
    const cat c = category(name);
    if (c == CAT_TOKEN_EMBD || c == CAT_OUTPUT) return false;
    switch (t) {
    case TN_IQ3_XXS:
    case TN_IQ2_XXS:
    case TN_IQ2_XS:
    case TN_IQ2_S:
    case TN_IQ1_M:
    case TN_IQ1_S: return true;
    case TN_Q2_K: return ftype == TN_FTYPE_MOSTLY_Q2_K_S;
    default: return false;
    }
}

/* ---- budgeted allocation (--target-bpw) ------------------------------------------------------ */

bool tn_qmix_allocate(size_t n, const int *n_cand, const double *const *bits, const double *const *err, double budget,
                      int *choice) {
    double used = 0;
    for (size_t i = 0; i < n; i++) choice[i] = 0, used += bits[i][0];
    if (used > budget) return false;
    for (;;) {
        double best = 0;
        size_t bi = 0;
        int bc = -1;
        for (size_t i = 0; i < n; i++) {
            const int c = choice[i];
            for (int c2 = c + 1; c2 < n_cand[i]; c2++) {
                const double db = bits[i][c2] - bits[i][c], de = err[i][c] - err[i][c2];
                if (de <= 0 || used + db > budget) continue;
                /* a free upgrade (same size, less error) is always taken first */
                const double gain = db > 0 ? de / db : INFINITY;
                if (gain > best) best = gain, bi = i, bc = c2;
            }
        }
        if (bc < 0) break;
        used += bits[bi][bc] - bits[bi][choice[bi]];
        choice[bi] = bc;
    }
    /* local search: move one tensor to any other candidate and another to any candidate that the
     * freed (or remaining) bits allow, while that lowers the total error (greedy leaves gaps when
     * the steps are coarse); each accepted move lowers the error, so this ends */
    for (int round = 0; round < 1000; round++) {
        double best = 0;
        size_t bi = 0, bj = 0;
        int bci = -1, bcj = -1;
        for (size_t i = 0; i < n; i++)
            for (int ci = 0; ci < n_cand[i]; ci++) {
                if (ci == choice[i]) continue;
                const double di = bits[i][ci] - bits[i][choice[i]], ei = err[i][ci] - err[i][choice[i]];
                for (size_t j = 0; j < n; j++) {
                    if (j == i) continue;
                    for (int cj = 0; cj < n_cand[j]; cj++) {
                        const double dj = cj == choice[j] ? 0 : bits[j][cj] - bits[j][choice[j]];
                        const double ej = cj == choice[j] ? 0 : err[j][cj] - err[j][choice[j]];
                        if (used + di + dj > budget) continue;
                        const double gain = -(ei + ej);
                        if (gain > best * (1 + 1e-12) + 1e-300) best = gain, bi = i, bj = j, bci = ci, bcj = cj;
                    }
                }
            }
        if (bci < 0) break;
        used += bits[bi][bci] - bits[bi][choice[bi]] + bits[bj][bcj] - bits[bj][choice[bj]];
        choice[bi] = bci;
        choice[bj] = bcj;
    }
    return true;
}
