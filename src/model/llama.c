/*
 * llama.c — builds a tern_model of any registered family (model/arch/) from a parsed GGUF:
 * architecture, hyperparameters and weight views by role, every one validated (missing keys,
 * inconsistent sizes, missing, extra or wrongly shaped tensors, unsupported types fail with a
 * message naming the key or tensor, and the expected and found shape). Does not own inference
 * state.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kern/kern.h"
#include "model/model.h"
#include "quant/blocks.h"
#include "quant/repack.h"

#define TN_MAX_LAYERS 4096

tern_status tn_model_key_dim(const tn_gguf *g, const char *arch, const char *suffix, bool required, int64_t lo, int64_t hi,
                             int32_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!required && !tn_gguf_find(g, key)) return TERN_OK; /* absent: *out keeps its default */
    int64_t v = *out;
    tern_status s = tn_gguf_get_i64(g, key, required, &v);
    if (s) return s;
    if (v < lo || v > hi)
        return tn_err(TERN_ERR_FORMAT, "model: key '%s' = %lld is outside %lld..%lld", key, (long long)v, (long long)lo,
                      (long long)hi);
    *out = (int32_t)v;
    return TERN_OK;
}

tern_status tn_model_key_float(const tn_gguf *g, const char *arch, const char *suffix, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    tern_status s = tn_gguf_get_f32(g, key, false, out);
    if (s) return s;
    if (!isfinite(*out)) return tn_err(TERN_ERR_FORMAT, "model: key '%s' is not a finite number", key);
    return TERN_OK;
}

/* "[a, b]" or "[a]" of a shape, for messages. */
static void tn_shape_str(char *buf, size_t cap, int n_dims, const int64_t *ne) {
    int n = snprintf(buf, cap, "[%lld", (long long)ne[0]);
    for (int d = 1; d < n_dims && n > 0 && (size_t)n < cap; d++) n += snprintf(buf + n, cap - (size_t)n, ", %lld", (long long)ne[d]);
    if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "]");
}

/* Binds role r of layer il (-1: model-wide) by its registry name and shape, checking rank/shape and
 * that tern can compute with its type. need == TN_NEED_OPT: absent leaves t zeroed. */
static tern_status tn_bind(const tn_gguf *g, const tn_hparams *hp, tn_role r, int32_t il, tn_need need, tn_tensor *t) {
    memset(t, 0, sizeof *t);
    if (need == TN_NEED_NO) return TERN_OK;
    char name[96];
    tn_role_tensor_name(r, il, name, sizeof name);
    const tn_role_info *ri = &tn_roles[r];
    const int n_dims = ri->ne2 != TN_DIM_1 ? 3 : ri->ne1 == TN_DIM_1 ? 1 : 2;
    const int64_t want[3] = {tn_dim_value(hp, ri->ne0), tn_dim_value(hp, ri->ne1), tn_dim_value(hp, ri->ne2)};
    char ws[64];
    tn_shape_str(ws, sizeof ws, n_dims, want);
    const tn_gguf_tensor *gt = tn_gguf_find_tensor(g, name);
    if (!gt) {
        if (need == TN_NEED_OPT) return TERN_OK;
        return tn_err(TERN_ERR_FORMAT, "model: missing tensor '%s' (%s expects shape %s)", name, hp->family->name, ws);
    }
    bool ok = gt->ne[0] == want[0] && gt->ne[1] == want[1] && gt->ne[2] == want[2] && gt->ne[3] == 1;
    if (!ok) {
        char fs[96];
        tn_shape_str(fs, sizeof fs, (int)TN_MAX(gt->n_dims, 1), gt->ne);
        if (ri->ne2 == TN_DIM_EXPERT && gt->ne[0] == want[0] && gt->ne[1] == want[1] && gt->ne[3] == 1)
            return tn_err(TERN_ERR_FORMAT, "model: tensor '%s' has shape %s: %lld experts, but %s.expert_count is %d", name,
                          fs, (long long)gt->ne[2], hp->family->name, hp->n_expert);
        return tn_err(TERN_ERR_FORMAT, "model: tensor '%s' has shape %s, expected %s (%s)", name, fs, ws, hp->family->name);
    }
    const tn_dtype_traits *tr = tn_dtype_get(gt->type);
    const tn_kern_slot *slot = tr ? &tn_kern()->slot[gt->type] : NULL;
    if (!tr || !tr->supported || !slot || !slot->to_float)
        return tn_err(TERN_ERR_UNSUPPORTED, "model: tensor '%s': unsupported tensor type %s (%u)", name,
                      tn_dtype_name(gt->type), gt->type);
    if (ri->matrix && !slot->vec_dot)
        return tn_err(TERN_ERR_UNSUPPORTED, "model: tensor '%s': no matrix kernel for type %s", name, tr->name);
    if (!ri->matrix && gt->type != TN_F32)
        return tn_err(TERN_ERR_UNSUPPORTED, "model: tensor '%s' has type %s; norms and biases must be f32", name, tr->name);
    t->type = (tn_dtype)gt->type;
    t->ne[0] = gt->ne[0];
    t->ne[1] = gt->ne[1];
    t->ne[2] = gt->ne[2]; /* n_expert for the experts' matrices (tn_expert_view), else 1 */
    t->ne[3] = 1;
    t->data = gt->data;
    t->nbytes = gt->nbytes;
    t->name = gt->name;
    return TERN_OK;
}

/* Rows [r0, r0 + rows) of matrix t as a matrix of its own: a view into the same bytes (rows are
 * contiguous), named by what it is (no file tensor has that name, so tern quantize's probes, which
 * swap views by file name, leave slices alone). */
static tn_tensor tn_rows_view(const tn_tensor *t, int64_t r0, int64_t rows, const char *name) {
    const size_t rb = tn_dtype_row_size(t->type, t->ne[0]);
    tn_tensor v = *t;
    v.ne[1] = rows;
    v.data = (const uint8_t *)t->data + (size_t)r0 * rb;
    v.nbytes = (size_t)rows * rb;
    v.name = name;
    return v;
}

/* Fused matrices as the separate ones the blocks multiply, without copying: attn_qkv's rows are
 * q | k | v (llama.cpp's build_qkv splits it at these offsets), a gate_up_fused ffn_up's are
 * gate | up (ggml_swiglu: silu of the first half times the second). The fused view is dropped:
 * only its slices are matmul inputs (the repacker moves each slice on its own). */
static void tn_bind_fused(const tn_hparams *hp, tn_layer *L) {
    tn_tensor *w = L->w;
    if (w[TN_ROLE_ATTN_QKV].data) {
        const tn_tensor f = w[TN_ROLE_ATTN_QKV];
        const int64_t qd = tn_hp_q_dim(hp), kv = (int64_t)hp->n_head_kv * hp->head_dim;
        w[TN_ROLE_ATTN_Q] = tn_rows_view(&f, 0, qd, "attn_qkv.weight (q rows)");
        w[TN_ROLE_ATTN_K] = tn_rows_view(&f, qd, kv, "attn_qkv.weight (k rows)");
        w[TN_ROLE_ATTN_V] = tn_rows_view(&f, qd + kv, kv, "attn_qkv.weight (v rows)");
        memset(&w[TN_ROLE_ATTN_QKV], 0, sizeof w[TN_ROLE_ATTN_QKV]);
    }
    if (hp->family->post_attn_norm_ffn) { /* gpt-oss: post_attention_norm normalizes the FFN's input */
        w[TN_ROLE_FFN_NORM] = w[TN_ROLE_ATTN_POST_NORM];
        memset(&w[TN_ROLE_ATTN_POST_NORM], 0, sizeof w[TN_ROLE_ATTN_POST_NORM]);
    }
    if (hp->family->gate_up_fused && w[TN_ROLE_FFN_UP].data) {
        const tn_tensor f = w[TN_ROLE_FFN_UP];
        w[TN_ROLE_FFN_GATE] = tn_rows_view(&f, 0, hp->n_ff, "ffn_up.weight (gate rows)");
        w[TN_ROLE_FFN_UP] = tn_rows_view(&f, hp->n_ff, hp->n_ff, "ffn_up.weight (up rows)");
    }
}

const float *tn_model_rope_factors(const tern_model *m, int32_t n_ctx) {
    if (m->rope_freqs.data) return m->rope_freqs.data;
    return n_ctx > m->hp.n_ctx_orig ? m->rope_long.data : m->rope_short.data;
}

/* The hyperparameters every family shares (under "<arch>."), with the family's defaults, then the
 * family's own keys (desc->load_hparams). */
static tern_status tn_load_hparams(const tn_gguf *g, tn_hparams *hp) {
    tn_gguf_str a;
    memset(&a, 0, sizeof a);
    tern_status s = tn_gguf_get_str(g, "general.architecture", true, &a);
    if (s) return s;
    const tn_arch_desc *ad = tn_arch_find(a.data, (size_t)a.len);
    if (!ad) {
        char shown[40], names[256];
        snprintf(shown, sizeof shown, "%.*s", (int)TN_MIN(a.len, 32), a.data);
        tn_arch_names(names, sizeof names);
        return tn_err(TERN_ERR_UNSUPPORTED, "model: unsupported architecture '%s' (supported: %s)", shown, names);
    }
    const char *an = ad->name;
    memset(hp, 0, sizeof *hp);
    hp->arch = ad->id;
    hp->family = ad;
    hp->rope_mode = ad->rope;
    hp->nope_step = ad->nope_step;
    if ((s = tn_model_key_dim(g, an, "context_length", true, 1, 1 << 24, &hp->n_ctx_train))) return s;
    if ((s = tn_model_key_dim(g, an, "embedding_length", true, 1, 1 << 20, &hp->n_embd))) return s;
    if ((s = tn_model_key_dim(g, an, "block_count", true, 1, TN_MAX_LAYERS, &hp->n_layer))) return s;
    if ((s = tn_model_key_dim(g, an, "feed_forward_length", true, 1, 1 << 22, &hp->n_ff))) return s;
    if ((s = tn_model_key_dim(g, an, "attention.head_count", true, 1, 1 << 14, &hp->n_head))) return s;
    hp->n_head_kv = hp->n_head;
    if ((s = tn_model_key_dim(g, an, "attention.head_count_kv", false, 1, 1 << 14, &hp->n_head_kv))) return s;
    if (hp->n_head % hp->n_head_kv)
        return tn_err(TERN_ERR_FORMAT, "model: %s.attention.head_count %d is not a multiple of %s.attention.head_count_kv %d",
                      an, hp->n_head, an, hp->n_head_kv);
    /* head size: attention.key_length, else n_embd / n_head (which must then divide) */
    hp->head_dim = 0;
    if ((s = tn_model_key_dim(g, an, "attention.key_length", false, 1, 1 << 16, &hp->head_dim))) return s;
    if (!hp->head_dim) {
        if (hp->n_embd % hp->n_head)
            return tn_err(TERN_ERR_FORMAT, "model: %s.embedding_length %d is not a multiple of %s.attention.head_count %d", an,
                          hp->n_embd, an, hp->n_head);
        hp->head_dim = hp->n_embd / hp->n_head;
    }
    if ((int64_t)hp->head_dim * hp->n_head > (1 << 22))
        return tn_err(TERN_ERR_FORMAT, "model: %s.attention.head_count %d x key_length %d is too large", an, hp->n_head,
                      hp->head_dim);
    int32_t val_len = hp->head_dim;
    if ((s = tn_model_key_dim(g, an, "attention.value_length", false, 1, 1 << 16, &val_len))) return s;
    if (val_len != hp->head_dim && !ad->mla) /* MLA: the family's hook reads the heads */
        return tn_err(TERN_ERR_UNSUPPORTED, "model: %s.attention.value_length %d differs from key_length %d", an, val_len,
                      hp->head_dim);
    hp->n_rot = hp->head_dim;
    if ((s = tn_model_key_dim(g, an, "rope.dimension_count", false, 2, 1 << 16, &hp->n_rot))) return s;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return tn_err(TERN_ERR_FORMAT, "model: %s.rope.dimension_count %d must be even and <= head size %d", an, hp->n_rot,
                      hp->head_dim);
    hp->rms_eps = ad->rms_eps;
    if ((s = tn_model_key_float(g, an, "attention.layer_norm_rms_epsilon", &hp->rms_eps))) return s;
    if (!(hp->rms_eps > 0 && hp->rms_eps < 1))
        return tn_err(TERN_ERR_FORMAT, "model: %s.attention.layer_norm_rms_epsilon %g outside (0, 1)", an, hp->rms_eps);
    hp->rope_freq_base = ad->rope_base;
    if ((s = tn_model_key_float(g, an, "rope.freq_base", &hp->rope_freq_base))) return s;
    if (!(hp->rope_freq_base > 0)) return tn_err(TERN_ERR_FORMAT, "model: %s.rope.freq_base must be > 0", an);
    hp->rope_freq_scale = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", an);
    tn_gguf_str st = {0, NULL};
    if ((s = tn_gguf_get_str(g, key, false, &st))) return s;
    float factor = 0.0f;
    if ((s = tn_model_key_float(g, an, "rope.scaling.factor", &factor))) return s;
    const bool yarn = st.data && tn_gguf_str_eq(st, "yarn");
    if (st.data && !tn_gguf_str_eq(st, "none") && !tn_gguf_str_eq(st, "linear") && !tn_gguf_str_eq(st, "llama3") && !yarn)
        return tn_err(TERN_ERR_UNSUPPORTED, "model: rope scaling type '%.*s' is not supported (none, linear, llama3, yarn)",
                      (int)TN_MIN(st.len, 32), st.data);
    if (st.data && (tn_gguf_str_eq(st, "linear") || yarn) && factor > 0) hp->rope_freq_scale = 1.0f / factor;
    /* Legacy key: rope.scale_linear */
    float lin = 0.0f;
    if ((s = tn_model_key_float(g, an, "rope.scale_linear", &lin))) return s;
    if (lin > 0) hp->rope_freq_scale = 1.0f / lin;
    /* LongRoPE's switch point and the rotation's attention factor (llama.cpp reads both for every
     * family; the converters write them for phi3) */
    hp->n_ctx_orig = hp->n_ctx_train;
    if ((s = tn_model_key_dim(g, an, "rope.scaling.original_context_length", false, 1, 1 << 24, &hp->n_ctx_orig))) return s;
    hp->rope_attn_factor = 1.0f;
    if ((s = tn_model_key_float(g, an, "rope.scaling.attn_factor", &hp->rope_attn_factor))) return s;
    if (!(hp->rope_attn_factor > 0))
        return tn_err(TERN_ERR_FORMAT, "model: key '%s.rope.scaling.attn_factor' = %g must be a number > 0", an,
                      (double)hp->rope_attn_factor);
    /* YaRN (llama.cpp's defaults: ext_factor 1 for a yarn file, beta_fast 32, beta_slow 1; the
     * attention factor get_mscale(factor) / (1 + 0.1 ln factor), which the rotation's own
     * 1 + 0.1 ln factor then restores — llama-context.cpp, ggml's rope_yarn) */
    hp->yarn_ext_factor = 0.0f, hp->yarn_beta_fast = 32.0f, hp->yarn_beta_slow = 1.0f;
    if (yarn && hp->rope_freq_scale < 1.0f) {
        float log_mul = 0.0f;
        hp->yarn_ext_factor = 1.0f;
        if ((s = tn_model_key_float(g, an, "rope.scaling.yarn_ext_factor", &hp->yarn_ext_factor))) return s;
        if ((s = tn_model_key_float(g, an, "rope.scaling.yarn_beta_fast", &hp->yarn_beta_fast))) return s;
        if ((s = tn_model_key_float(g, an, "rope.scaling.yarn_beta_slow", &hp->yarn_beta_slow))) return s;
        if ((s = tn_model_key_float(g, an, "rope.scaling.yarn_log_multiplier", &log_mul))) return s;
        if (!(hp->yarn_ext_factor >= 0 && hp->yarn_ext_factor <= 1) || !(hp->yarn_beta_fast > 0) || !(hp->yarn_beta_slow > 0))
            return tn_err(TERN_ERR_FORMAT, "model: %s.rope.scaling.yarn_*: ext_factor %g must be in 0..1, betas %g, %g > 0", an,
                          (double)hp->yarn_ext_factor, (double)hp->yarn_beta_fast, (double)hp->yarn_beta_slow);
        const float f = 1.0f / hp->rope_freq_scale;
        const float ms1 = 0.1f * logf(f) + 1.0f, msl = 0.1f * log_mul * logf(f) + 1.0f;
        float yaf = log_mul != 0.0f ? ms1 / msl : ms1;
        if (hp->yarn_ext_factor != 0.0f) yaf *= 1.0f / (1.0f + 0.1f * logf(f));
        hp->rope_attn_factor *= yaf;
    }
    /* mixture of experts (llama.cpp reads these for every family; LLAMA_MAX_EXPERTS is 512) */
    if ((s = tn_model_key_dim(g, an, "expert_count", false, 0, 512, &hp->n_expert))) return s;
    if (hp->n_expert > 0 && ad->need[TN_ROLE_FFN_GATE_INP] == TN_NEED_NO)
        return tn_err(TERN_ERR_UNSUPPORTED, "model: %s.expert_count is %d, but tern runs architecture %s without experts", an,
                      hp->n_expert, an);
    if (hp->n_expert <= 0 && ad->need[TN_ROLE_FFN_GATE_INP] == TN_NEED_REQ)
        return tn_err(TERN_ERR_FORMAT, "model: %s needs %s.expert_count > 0 (a mixture-of-experts family)", an, an);
    if ((s = tn_model_key_dim(g, an, "expert_used_count", hp->n_expert > 0, 0, 512, &hp->n_expert_used))) return s;
    if (hp->n_expert > 0 && (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert))
        return tn_err(TERN_ERR_FORMAT, "model: %s.expert_used_count %d must be in 1..%s.expert_count %d (top-k of the experts)",
                      an, hp->n_expert_used, an, hp->n_expert);
    hp->n_ff_exp = hp->n_ff;
    if ((hp->arch == TN_ARCH_QWEN3MOE || hp->arch == TN_ARCH_QWEN2MOE) && hp->n_expert_used > 0) hp->n_ff_exp = hp->n_ff / hp->n_expert_used; /* llama.cpp's default */
    if ((s = tn_model_key_dim(g, an, "expert_feed_forward_length", false, 1, 1 << 22, &hp->n_ff_exp))) return s;
    if (hp->n_expert > 0 && hp->n_ff_exp < 1)
        return tn_err(TERN_ERR_FORMAT, "model: %s.feed_forward_length %d gives experts of no rows", an, hp->n_ff);
    hp->n_ff_shexp = hp->n_ff; /* llama.cpp's default */
    if ((s = tn_model_key_dim(g, an, "expert_shared_feed_forward_length", false, 1, 1 << 22, &hp->n_ff_shexp))) return s;
    hp->ffn = ad->ffn;
    hp->embd_scale = ad->embd_scale ? sqrtf((float)hp->n_embd) : 0.0f;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    if (ad->load_hparams && (s = ad->load_hparams(g, hp))) return s;
    return TERN_OK;
}

static void tn_model_describe(tern_model *m) {
    const char *ty = "mixed";
    if (m->layers) ty = tn_dtype_name(m->layers[0].w[TN_ROLE_ATTN_Q].type);
    double p = (double)m->n_params;
    char size[32];
    if (p >= 1e9) snprintf(size, sizeof size, "%.1fB", p / 1e9);
    else if (p >= 1e6) snprintf(size, sizeof size, "%.0fM", p / 1e6);
    else snprintf(size, sizeof size, "%.0fK", p / 1e3);
    snprintf(m->desc, sizeof m->desc, "%s %s %s", m->hp.family->name, size, ty);
}

/* Every tensor of the file must be one the family has: a blk.N tensor past block_count, a role
 * the family lacks, or a name no role has is an error naming it. */
static tern_status tn_check_extra(const tn_gguf *g, const tn_hparams *hp) {
    const char *an = hp->family->name;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        char fs[96];
        tn_shape_str(fs, sizeof fs, (int)TN_MAX(t->n_dims, 1), t->ne);
        int32_t il;
        tn_role r;
        if (!tn_role_parse(t->name, &il, &r)) {
            if (!strncmp(t->name, "blk.", 4) && il >= hp->n_layer)
                return tn_err(TERN_ERR_FORMAT, "model: tensor '%s' exists but %s.block_count is %d", t->name, an,
                              (int)hp->n_layer);
            return tn_err(TERN_ERR_FORMAT, "model: unexpected tensor '%s' (shape %s): not a tensor of architecture %s",
                          t->name, fs, an);
        }
        if (il >= hp->n_layer)
            return tn_err(TERN_ERR_FORMAT, "model: tensor '%s' exists but %s.block_count is %d", t->name, an, (int)hp->n_layer);
        if (tn_arch_need_layer(hp, il, r) == TN_NEED_NO) {
            if (hp->family->mla && il >= 0 && hp->family->need[r] != TN_NEED_NO)
                return tn_err(TERN_ERR_FORMAT,
                              "model: unexpected tensor '%s' (shape %s): layer %d of %s (leading_dense_block_count %d, "
                              "q_lora_rank %d, %s) has none",
                              t->name, fs, (int)il, an, hp->n_layer_dense_lead, hp->n_lora_q,
                              hp->mla_kv_b ? "attn_kv_b form" : "attn_k_b / attn_v_b form");
            if (hp->family->need[r] != TN_NEED_NO) /* dense roles in a MoE file, or experts in a dense one */
                return tn_err(TERN_ERR_FORMAT, "model: unexpected tensor '%s' (shape %s): %s.expert_count is %d", t->name, fs,
                              an, hp->n_expert);
            return tn_err(TERN_ERR_FORMAT, "model: unexpected tensor '%s' (shape %s): architecture %s has no %s", t->name, fs,
                          an, tn_roles[r].name);
        }
    }
    return TERN_OK;
}

/* An older deepseek2 file's attn_kv_b ([kv_lora_rank] rows: per head nope k rows, then v_head v
 * rows) as the per-head matrices the MLA block multiplies, in f32 (what convert_hf_to_gguf.py
 * writes today): attn_k_b,h [nope][kv_lora_rank] holds the head's k rows transposed (its rows
 * index the latent), attn_v_b,h its v rows as they are. The kv_b view is dropped. */
static tern_status tn_mla_split_kv_b(tern_model *m) {
    const tn_hparams *hp = &m->hp;
    const int64_t H = hp->n_head, np = hp->head_dim - hp->n_rot, R = hp->n_lora_kv, vh = hp->v_head;
    const int64_t per = H * (np * R + R * vh);
    m->mla_split = tn_malloc((size_t)(per * hp->n_layer) * sizeof(float));
    float *row = tn_malloc((size_t)R * sizeof(float));
    if (!m->mla_split || !row) {
        tn_free(row);
        return tn_err(TERN_ERR_NOMEM, "model: out of memory splitting attn_kv_b");
    }
    for (int32_t il = 0; il < hp->n_layer; il++) {
        tn_tensor *w = m->layers[il].w;
        float *kb = m->mla_split + per * il, *vb = kb + H * np * R;
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < np + vh; i++) {
                tn_tensor_get_row(&w[TN_ROLE_ATTN_KV_B], h * (np + vh) + i, row);
                if (i < np)
                    for (int64_t c = 0; c < R; c++) kb[(h * R + c) * np + i] = row[c];
                else memcpy(vb + (h * vh + i - np) * R, row, (size_t)R * sizeof(float));
            }
        const tn_tensor k = {TN_F32, {np, R, H, 1}, kb, (size_t)(H * np * R) * sizeof(float), "attn_kv_b.weight (k part)", NULL};
        const tn_tensor v = {TN_F32, {R, vh, H, 1}, vb, (size_t)(H * R * vh) * sizeof(float), "attn_kv_b.weight (v part)", NULL};
        w[TN_ROLE_ATTN_K_B_MLA] = k, w[TN_ROLE_ATTN_V_B_MLA] = v;
        memset(&w[TN_ROLE_ATTN_KV_B], 0, sizeof w[TN_ROLE_ATTN_KV_B]);
    }
    tn_free(row);
    return TERN_OK;
}

tern_status tn_model_load_gguf(tn_gguf *g, tern_model **out) {
    *out = NULL;
    tern_model *m = tn_calloc(1, sizeof *m);
    if (!m) return tn_err(TERN_ERR_NOMEM, "model: out of memory");
    tern_status s = tn_load_hparams(g, &m->hp);
    if (s) goto fail;
    tn_hparams *hp = &m->hp;
    if ((s = tn_vocab_load(g, &m->vocab))) goto fail;
    hp->n_vocab = tn_vocab_n(m->vocab);
    if ((s = tn_bind(g, hp, TN_ROLE_TOKEN_EMBD, -1, TN_NEED_REQ, &m->tok_embd))) goto fail;
    if ((s = tn_bind(g, hp, TN_ROLE_OUTPUT_NORM, -1, TN_NEED_REQ, &m->output_norm))) goto fail;
    if ((s = tn_bind(g, hp, TN_ROLE_OUTPUT, -1, tn_arch_need(hp, TN_ROLE_OUTPUT), &m->output))) goto fail;
    if (!m->output.data) m->output = m->tok_embd; /* tied embeddings */
    if ((s = tn_bind(g, hp, TN_ROLE_ROPE_FREQS, -1, tn_arch_need(hp, TN_ROLE_ROPE_FREQS), &m->rope_freqs))) goto fail;
    if ((s = tn_bind(g, hp, TN_ROLE_ROPE_FACTORS_LONG, -1, tn_arch_need(hp, TN_ROLE_ROPE_FACTORS_LONG), &m->rope_long))) goto fail;
    if ((s = tn_bind(g, hp, TN_ROLE_ROPE_FACTORS_SHORT, -1, tn_arch_need(hp, TN_ROLE_ROPE_FACTORS_SHORT), &m->rope_short))) goto fail;
    m->layers = tn_calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        s = tn_err(TERN_ERR_NOMEM, "model: out of memory");
        goto fail;
    }
    for (int32_t il = 0; il < hp->n_layer; il++) {
        for (int r = 0; r < TN_ROLE_N_LAYER; r++)
            if ((s = tn_bind(g, hp, (tn_role)r, il, tn_arch_need_layer(hp, il, (tn_role)r), &m->layers[il].w[r]))) goto fail;
        tn_bind_fused(hp, &m->layers[il]);
    }
    if ((s = tn_check_extra(g, hp))) goto fail;
    if (hp->family->mla && hp->mla_kv_b && (s = tn_mla_split_kv_b(m))) goto fail;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        const uint64_t ne = (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
        int32_t il;
        tn_role r;
        /* a token reads n_expert_used of an expert matrix's n_expert slices */
        const bool exps = tn_role_parse(t->name, &il, &r) && tn_roles[r].ne2 == TN_DIM_EXPERT;
        m->n_params += ne;
        m->n_params_active += exps ? ne / (uint64_t)t->ne[2] * (uint64_t)hp->n_expert_used : ne;
        m->weight_bytes += t->nbytes;
    }
    m->gguf = g;
    tn_model_describe(m);
    *out = m;
    return TERN_OK;
fail:
    tn_vocab_free(m->vocab);
    tn_free(m->mla_split);
    tn_free(m->layers);
    tn_free(m);
    return s;
}

/* The load-time layout t moves to, or 0: a file type with one, rows a multiple of its group, a
 * SIMD kernel (TERN_REPACK=0 / --no-repack skip the whole repack, api.c). TERN_REPACK_Q6K=0 keeps
 * q6_K alone in the file layout: its interleaved kernel prefills ~2.3x faster, but decodes at
 * 0.9-1.0x of the file layout's gemv (kernel-only, 2026-11-27, docs/kernels.md). */
static tn_dtype tn_repack_target(const tn_tensor *t, bool mapped, bool xp) {
    const tn_dtype it = t->data ? tn_repack_type_of(t->type) : (tn_dtype)0;
    if (!it || t->ne[1] % tn_repack_rows(it) || tn_kern()->slot[it].gemm_isa < TN_ISA_AVX512) return (tn_dtype)0;
    if (it == TN_Q6_K_R16) {
        const char *e = getenv("TERN_REPACK_Q6K");
        if (e && !strcmp(e, "0")) return (tn_dtype)0;
    }
    /* the expanded layouts (iq1 p2, iq2 p3, iq3 p4, tq1_0_r16) are larger than the file's blocks (78
     * bytes against 50-56, 106 against 66-82, 138 against 98-110, 66 against 54): made only into the new buffer of
     * a mapped file, and only when the moved weights take at most half the memory available (xp:
     * tn_model_repack, which also applies TERN_REPACK_IQ) */
    if (tn_repack_grows(it) && (!mapped || !xp)) return (tn_dtype)0;
    return it;
}

/* Bytes of tensor t in layout it (t's own when it is 0). */
static size_t tn_repacked_bytes(const tn_tensor *t, tn_dtype it) {
    if (!it || !tn_repack_grows(it)) return t->nbytes;
    const int64_t rows = (int64_t)(t->nbytes / tn_dtype_row_size(t->type, t->ne[0]));
    return (size_t)rows * tn_dtype_row_size(it, t->ne[0]);
}

/* The weight views of layer i that only matmuls read (i = -1: the output, unless tied): the
 * layer's matrix roles it has; its expert matrices too when `experts` (an expert tensor's ne[1]
 * rows per expert are a multiple of the layout's row group, so no group crosses two experts and
 * tn_expert_view's slices stay where they were). */
static int tn_matmul_views(tern_model *m, int64_t i, bool tied, bool experts, tn_tensor *v[TN_ROLE_N_LAYER]) {
    if (i < 0) {
        v[0] = &m->output;
        return tied ? 0 : 1;
    }
    tn_layer *L = &m->layers[i];
    int n = 0;
    for (int r = 0; r < TN_ROLE_N_LAYER; r++)
        if (tn_roles[r].matrix && L->w[r].data && (tn_roles[r].ne2 == TN_DIM_1 || experts)) v[n++] = &L->w[r];
    return n;
}

/* Rows of a matrix, every expert's of an expert tensor. */
static int64_t tn_repack_nrows(const tn_tensor *t) { return (int64_t)(t->nbytes / tn_dtype_row_size(t->type, t->ne[0])); }

/* The bytes tn_model_repack moves (mapped) and the largest row group it interleaves in place. */
static void tn_repack_sizes(tern_model *m, bool tied, bool experts, bool mapped, bool xp, size_t *total,
                            size_t *scratch) {
    *total = *scratch = 0;
    for (int64_t i = -1; i < m->hp.n_layer; i++) {
        tn_tensor *v[TN_ROLE_N_LAYER];
        const int nv = tn_matmul_views(m, i, tied, experts, v);
        for (int j = 0; j < nv; j++) {
            const tn_dtype it = tn_repack_target(v[j], mapped, xp);
            if (it) {
                *total += (tn_repacked_bytes(v[j], it) + 63) & ~(size_t)63;
                *scratch = TN_MAX(*scratch, TN_L32_ROWS * tn_dtype_row_size(v[j]->type, v[j]->ne[0]));
            } else if (mapped && v[j]->data) {
                *total += (v[j]->nbytes + 63) & ~(size_t)63; /* moved as they are, see below */
            }
        }
    }
}

tern_status tn_model_repack(tern_model *m, uint64_t hot_experts) {
    if (m->repacked) return TERN_OK;
    const int64_t nl = m->hp.n_layer;
    /* every matrix only the matmuls read; a tied output is also the embedding table (row reads) */
    const bool tied = m->output.data == m->tok_embd.data;
    const long pg = sysconf(_SC_PAGESIZE);
    /* a mapped file is read-only: the interleaved weights go to a new buffer and the file's pages
     * are released — and so do the matrices of types with no interleaved layout (copied as they
     * are), so that all of them sit in huge pages; a file read into memory (use_mmap = false) is
     * ours: interleaved in place, one row group (16 or 32 rows) at a time through a scratch copy */
    const bool mapped = !m->gguf || m->gguf->map.mapped;
    /* experts too, as llama.cpp's CPU backend does, when they are ours (read into memory) or when
     * the moved weights fit in the memory available with a margin left for the context and the
     * system (an eighth of it, at least 1 GiB): the file's pages are released as each tensor moves
     * (and the page cache is reclaimable), so the whole model becomes resident once, and the
     * experts' products run on the interleaved kernels (Qwen3-30B-A3B's shapes in q4_0, 16.9 GB
     * on a 24 GB machine: pp64 8x, tg 2.1x the mapped experts', docs/performance.md). Otherwise (a
     * model near or over the machine's memory, or hot experts asked for: FreqTier's tiering) they
     * stay in the file mapping, where the page cache can drop the cold ones.
     * TERN_REPACK_EXPERTS=0/1 forces it. */
    bool experts = m->hp.n_expert > 1 && !hot_experts;
    size_t total, scratch;
    if (experts && mapped) {
        tn_repack_sizes(m, tied, true, mapped, false, &total, &scratch);
        const uint64_t avail = tn_mem_available(), margin = TN_MAX(avail / 8, (uint64_t)1 << 30);
        experts = avail > margin && (uint64_t)total <= avail - margin;
    }
    const char *env = getenv("TERN_REPACK_EXPERTS");
    if (env && m->hp.n_expert > 1) experts = strcmp(env, "0") != 0;
    /* the expanded i-quant layouts grow the weights by up to ~1.6x: only when everything moved
     * still takes at most half the memory available (a model near the machine's memory keeps its
     * file layouts rather than risk the OOM killer). TERN_REPACK_IQ=0 keeps the file layouts
     * (less memory, slower decode), =1 expands whatever the memory. */
    const char *xenv = getenv("TERN_REPACK_IQ");
    bool xp = !(xenv && !strcmp(xenv, "0"));
    tn_repack_sizes(m, tied, experts, mapped, xp, &total, &scratch);
    if (xp && mapped && total && !(xenv && !strcmp(xenv, "1"))) {
        const uint64_t avail = tn_mem_available();
        if (avail && (uint64_t)total > avail / 2) {
            xp = false;
            tn_repack_sizes(m, tied, experts, mapped, xp, &total, &scratch);
        }
    }
    if (!total) return TERN_OK;
    /* the moved weights in 2 MiB pages (tn_malloc_huge): decode streams every byte once per
     * token (1B tq1 decode: ~8% more tokens/s than with 4 KiB pages) */
    uint8_t *buf = mapped ? tn_malloc_huge(total) : tn_malloc_aligned(scratch, 64);
    if (!buf)
        return tn_err(TERN_ERR_NOMEM, "model: out of memory for %.0f MiB of repacked weights (load without repacking)",
                      (double)(mapped ? total : scratch) / 1048576.0);
    size_t off = 0;
    for (int64_t i = -1; i < nl; i++) {
        tn_tensor *v[TN_ROLE_N_LAYER];
        const int nv = tn_matmul_views(m, i, tied, experts, v);
        for (int j = 0; j < nv; j++) {
            tn_tensor *t = v[j];
            const tn_dtype it = tn_repack_target(t, mapped, xp);
            if (!it && !(mapped && t->data)) continue;
            if (mapped) { /* types with no interleaved layout move as they are: into the 2 MiB pages */
                const size_t nb = tn_repacked_bytes(t, it);
                if (it) tn_repack(t->type, t->data, buf + off, tn_repack_nrows(t), t->ne[0]);
                else memcpy(buf + off, t->data, t->nbytes);
                if (pg > 0) { /* the file's pages of this tensor are not read again */
                    uintptr_t a = ((uintptr_t)t->data + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
                    uintptr_t e = ((uintptr_t)t->data + t->nbytes) & ~((uintptr_t)pg - 1);
                    if (e > a) (void)madvise((void *)a, e - a, MADV_DONTNEED);
                }
                t->data = buf + off;
                m->repack_grown += nb - t->nbytes;
                t->nbytes = nb; /* p3: the expanded blocks' bytes (tn_expert_view divides these) */
                off += (nb + 63) & ~(size_t)63;
                if (!it) continue;
            } else {
                const int rows = tn_repack_rows(it);
                const size_t gb = (size_t)rows * tn_dtype_row_size(t->type, t->ne[0]);
                uint8_t *d = (uint8_t *)(uintptr_t)t->data;
                for (int64_t g = 0; g < tn_repack_nrows(t) / rows; g++) {
                    memcpy(buf, d + (size_t)g * gb, gb);
                    tn_repack(t->type, buf, d + (size_t)g * gb, rows, t->ne[0]);
                }
            }
            t->type = it;
        }
    }
    if (mapped) m->repacked = buf;
    else tn_free_aligned(buf);
    return TERN_OK;
}

void tn_tensor_get_row(const tn_tensor *t, int64_t row, float *out) {
    if (tn_repack_file_type(t->type)) {
        tn_dequantize_row_repacked(t->type, t->data, t->ne[0], row, out);
        return;
    }
    size_t rb = tn_dtype_row_size(t->type, t->ne[0]);
    tn_kern()->slot[t->type].to_float((const uint8_t *)t->data + (size_t)row * rb, out, t->ne[0]);
}
