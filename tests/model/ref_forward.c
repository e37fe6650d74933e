/*
 * ref_forward.c — see ref_forward.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern/kern.h"
#include "quant/quant.h"
#include "ref_forward.h"

typedef struct {
    float *w;
    int64_t rows, cols;
} ref_mat;

struct ref_model {
    const tern_model *m;
    tn_hparams hp;
    int32_t n_ctx, pos;
    ref_mat emb, out;
    ref_mat *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    /* mixture of experts: router [n_expert rows], experts as n_expert * rows stacked (expert e's
     * rows from e * rows); rows NULL in a dense model */
    ref_mat *wr, *xg, *xu, *xd;
    /* a shared expert (qwen2moe): gate, up, down rows (NULL: none) and its f32 gate vector */
    ref_mat *sg, *su, *sd;
    const float **sgate;
    /* gpt-oss, read from the file by llama.cpp's names: sinks [n_head], attention output bias,
     * the FFN's input norm (post_attention_norm), router bias, expert biases (NULL: none) */
    const float **sinks, **bo, **fnorm, **rbias, **gbias, **ubias, **dbias;
    double yarn_lo, yarn_hi; /* YaRN's ramp (yarn true): dims below lo keep the unscaled angle */
    bool yarn;
    double min_gap;  /* smallest probability gap between the k-th and (k+1)-th expert seen */
    double *kc, *vc; /* [layer][pos][kv_dim] */
    double *lc;      /* deepseek2 with ref_set_kv_types: the cached latent rows [c | k_pe], [layer][pos][kv_lora + n_rot] */
    const float *ff; /* RoPE frequency factors (llama 3.1's rope_freqs; phi3: LongRoPE's choice) */
    double mscale;   /* phi3: rope.scaling.attn_factor on the rotated dims                       */
    int32_t type_k, type_v; /* ref_set_kv_types: 0 / f16 none, else K / V rows rounded through it  */
    bool rot_k, rot_v;      /* ref_set_kv_rot                                                      */
    double *rot_sign;
    /* deepseek2, read from the file by llama.cpp's names (rows NULL: absent): q direct or
     * low-rank, kv_a_mqa, the per-head up-projections as k_b [n_head * kv_lora rows of nope],
     * v_b [n_head * v_head rows of kv_lora] or the older kv_b [n_head * (nope + v_head) rows] */
    ref_mat *mq, *mqa, *mqb, *mkva, *mkb, *mvb, *mkvb;
    const float **mqa_norm, **mkva_norm, **probs_b;
    int64_t kv_lora, v_head, dense_lead, n_groups, group_used, gating;
    double ds_scale;  /* the scores' scale: mscale^2 / sqrt(q/k head)              */
    double w_scale;   /* expert_weights_scale (0: none)                             */
    bool w_norm;
};

static ref_mat ref_deq_file_rows(const tern_model *m, const char *name, int64_t r0, int64_t rows);
static ref_mat ref_deq_file_3d(const tern_model *m, const char *name);

/* The file's tensor blk.l.<sfx> as rows (2-D, or 3-D stacked), or none. */
static ref_mat ref_layer_mat(const tern_model *m, int32_t l, const char *sfx) {
    char n[96];
    snprintf(n, sizeof n, "blk.%d.%s", (int)l, sfx);
    return ref_deq_file_3d(m, n);
}
static const float *ref_layer_vec(const tern_model *m, int32_t l, const char *sfx) {
    char n[96];
    snprintf(n, sizeof n, "blk.%d.%s", (int)l, sfx);
    const tn_gguf_tensor *t = tn_gguf_find_tensor(m->gguf, n);
    return t && t->type == TN_F32 ? (const float *)t->data : NULL;
}
static int64_t ref_key_int(const tern_model *m, const char *key, int64_t dflt) {
    int64_t v = dflt;
    tn_gguf_get_i64(m->gguf, key, false, &v);
    return v;
}

/* deepseek2's (and plm's: the same keys under its own name) reading of the file: keys by name,
 * matrices by llama.cpp's tensor names, the YaRN score scale as DeepSeek defines it
 * (yarn_get_mscale(factor, mscale_all_dim)^2 / sqrt(d), the converter storing 0.1 *
 * mscale_all_dim; plm has no YaRN keys: 1 / sqrt(d)). */
static void ref_ds_create(ref_model *r) {
    const tern_model *m = r->m;
    const char *an = r->hp.arch == TN_ARCH_PLM ? "plm" : "deepseek2";
    char k1[96], k2[96];
#define KEY(sfx) (snprintf(k1, sizeof k1, "%s." sfx, an), k1)
#define KEY2(sfx) (snprintf(k2, sizeof k2, "%s." sfx, an), k2)
    const int32_t nl = r->hp.n_layer;
    ref_mat **all[] = {&r->mq, &r->mqa, &r->mqb, &r->mkva, &r->mkb, &r->mvb, &r->mkvb};
    for (size_t i = 0; i < 7; i++) *all[i] = calloc((size_t)nl, sizeof(ref_mat));
    r->mqa_norm = calloc((size_t)nl, sizeof(float *));
    r->mkva_norm = calloc((size_t)nl, sizeof(float *));
    r->probs_b = calloc((size_t)nl, sizeof(float *));
    for (int32_t l = 0; l < nl; l++) {
        r->mq[l] = ref_layer_mat(m, l, "attn_q.weight");
        r->mqa[l] = ref_layer_mat(m, l, "attn_q_a.weight");
        r->mqb[l] = ref_layer_mat(m, l, "attn_q_b.weight");
        r->mkva[l] = ref_layer_mat(m, l, "attn_kv_a_mqa.weight");
        r->mkb[l] = ref_layer_mat(m, l, "attn_k_b.weight");
        r->mvb[l] = ref_layer_mat(m, l, "attn_v_b.weight");
        r->mkvb[l] = ref_layer_mat(m, l, "attn_kv_b.weight");
        r->mqa_norm[l] = ref_layer_vec(m, l, "attn_q_a_norm.weight");
        r->mkva_norm[l] = ref_layer_vec(m, l, "attn_kv_a_norm.weight");
        r->probs_b[l] = ref_layer_vec(m, l, "exp_probs_b.bias");
    }
    r->kv_lora = ref_key_int(m, KEY("attention.kv_lora_rank"), 0);
    const int64_t rot = ref_key_int(m, KEY("rope.dimension_count"), 0);
    const int64_t kmla = ref_key_int(m, KEY("attention.key_length_mla"), 0);
    r->v_head = ref_key_int(m, KEY("attention.value_length_mla"), ref_key_int(m, KEY2("attention.value_length"), 0));
    const int64_t hk = kmla ? kmla : ref_key_int(m, KEY("attention.key_length"), 0);
    r->dense_lead = ref_key_int(m, KEY("leading_dense_block_count"), 0);
    r->n_groups = ref_key_int(m, KEY("expert_group_count"), 0);
    r->group_used = ref_key_int(m, KEY("expert_group_used_count"), 0);
    r->gating = ref_key_int(m, KEY("expert_gating_func"), 1);
    bool wn = false;
    tn_gguf_get_bool(m->gguf, KEY("expert_weights_norm"), false, &wn);
    r->w_norm = wn;
    float ws = 0, factor = 0, lm = 0;
    tn_gguf_get_f32(m->gguf, KEY("expert_weights_scale"), false, &ws);
    tn_gguf_get_f32(m->gguf, KEY("rope.scaling.factor"), false, &factor);
    tn_gguf_get_f32(m->gguf, KEY("rope.scaling.yarn_log_multiplier"), false, &lm);
#undef KEY
#undef KEY2
    r->w_scale = ws;
    const double ms = factor > 1 ? 1.0 + 0.1 * (lm / 0.1) * log(factor) : 1.0;
    r->ds_scale = ms * ms / sqrt((double)hk);
    r->hp.head_dim = (int32_t)hk, r->hp.n_rot = (int32_t)rot; /* rope() rotates the first n_rot of head_dim strides */
}

/* x[0..n) through a q8_0 / q4_0 row (quant.h's reference quantizer, then its dequantizer); other
 * types: unchanged. act: q8_0 as the activation quantizer rounds (the query of a quantized K). */
/* tern's tq<b>g32a KV rows (TERN_KV_TQ(b)), written here from the format's definition
 * (docs/formats.md): per 32 values d = fp16((max - min) / (2^b - 1)), m = fp16(min), each value the
 * nearest of d c + m, c in 0 .. 2^b - 1. */
static void ref_round_tq(int bits, double *x, int64_t n) {
    const int nmax = (1 << bits) - 1;
    for (int64_t g = 0; g < n; g += 32) {
        float mn = (float)x[g], mx = (float)x[g];
        for (int64_t i = g; i < g + 32; i++) mn = fminf(mn, (float)x[i]), mx = fmaxf(mx, (float)x[i]);
        const float d = tn_fp16_to_fp32(tn_fp32_to_fp16((mx - mn) / (float)nmax)), m = tn_fp16_to_fp32(tn_fp32_to_fp16(mn));
        for (int64_t i = g; i < g + 32; i++) {
            long c = d > 0 ? lrint(((double)(float)x[i] - m) / d) : 0;
            c = c < 0 ? 0 : c > nmax ? nmax : c;
            x[i] = (double)(d * (float)c + m);
        }
    }
}

/* tern's per-channel K (TERN_KV_TQC(b)), written here from the format (quant/kc.h): once the 16
 * positions of a group are in (K rows g[0 .. 16), ld apart, as the f16 values the window held),
 * per channel d = fp16((max - min) / (2^b - 1)), m = fp16(min), each value the nearest d c + m. */
static void ref_round_kc_group(int bits, double *g, int64_t ld, int64_t n) {
    const int nmax = (1 << bits) - 1;
    for (int64_t i = 0; i < n; i++) {
        float v[16], mn, mx;
        for (int t = 0; t < 16; t++) v[t] = tn_fp16_to_fp32(tn_fp32_to_fp16((float)g[t * ld + i]));
        mn = mx = v[0];
        for (int t = 1; t < 16; t++) mn = fminf(mn, v[t]), mx = fmaxf(mx, v[t]);
        const float d = tn_fp16_to_fp32(tn_fp32_to_fp16((mx - mn) / (float)nmax)), m = tn_fp16_to_fp32(tn_fp32_to_fp16(mn));
        for (int t = 0; t < 16; t++) {
            long c = d > 0 ? lrint(((double)v[t] - m) / d) : 0;
            c = c < 0 ? 0 : c > nmax ? nmax : c;
            g[t * ld + i] = (double)(d * (float)c + m);
        }
    }
}

static void ref_round(int32_t type, bool act, double *x, int64_t n) {
    for (int bits = 2; bits <= 8; bits++)
        if (type == TERN_KV_TQ(bits)) {
            ref_round_tq(bits, x, n);
            return;
        }
    if (type != TN_Q8_0 && type != TN_Q4_0) return;
    float *f = malloc((size_t)n * sizeof *f);
    void *b = malloc((size_t)(n / 32) * sizeof(block_q8_0));
    for (int64_t i = 0; i < n; i++) f[i] = (float)x[i];
    if (type == TN_Q4_0) tn_quantize_row_q4_0_ref(f, b, n), tn_dequantize_row_q4_0(b, f, n);
    else if (act) tn_quantize_row_q8_0_act(f, b, n), tn_dequantize_row_q8_0(b, f, n);
    else tn_quantize_row_q8_0_ref(f, b, n), tn_dequantize_row_q8_0(b, f, n);
    for (int64_t i = 0; i < n; i++) x[i] = f[i];
    free(f), free(b);
}

void ref_set_kv_types(ref_model *r, int32_t type_k, int32_t type_v) {
    r->type_k = type_k, r->type_v = type_v;
}

void ref_set_kv_rot(ref_model *r, bool rot_k, bool rot_v, const float *signs) {
    const int32_t hd = r->m->hp.head_dim;
    r->rot_k = rot_k && signs, r->rot_v = rot_v && signs;
    free(r->rot_sign);
    r->rot_sign = NULL;
    if (!signs) return;
    r->rot_sign = malloc((size_t)hd * sizeof *r->rot_sign);
    for (int32_t i = 0; i < hd; i++) r->rot_sign[i] = signs[i];
}

/* x (one head) = R D x, or (inverse) D R^T x; R[i][j] = (-1)^popcount(i & j) / sqrt(B) within each
 * block of B (the largest power of 2 dividing hd), 0 across blocks. */
static void ref_rot_head(const ref_model *r, double *x, bool inverse) {
    const int32_t hd = r->m->hp.head_dim, B = hd & -hd;
    double y[1024];
    for (int32_t i = 0; i < hd; i++) {
        double acc = 0;
        for (int32_t j = (i / B) * B; j < (i / B + 1) * B; j++) {
            const double h = (__builtin_popcount((unsigned)(i % B) & (unsigned)(j % B)) & 1 ? -1.0 : 1.0) / sqrt((double)B);
            acc += inverse ? h * x[j] : h * r->rot_sign[j] * x[j]; /* R symmetric: R^T = R */
        }
        y[i] = inverse ? r->rot_sign[i] * acc : acc;
    }
    memcpy(x, y, (size_t)hd * sizeof *x);
}

static ref_mat ref_deq(const tn_tensor *t) {
    ref_mat r = {NULL, t->ne[1], t->ne[0]};
    r.w = malloc((size_t)(r.rows * r.cols) * sizeof(float));
    /* the model's own row reader: also knows the load-time layouts (q4_0_r16) */
    for (int64_t i = 0; i < r.rows; i++) tn_tensor_get_row(t, i, r.w + i * r.cols);
    return r;
}

/* Rows r0 .. r0 + rows - 1 of file tensor `name` (a fused matrix), dequantized from the file's
 * bytes with the type's plain row converter: the split is the reference's own, not the loader's. */
static ref_mat ref_deq_file_rows(const tern_model *m, const char *name, int64_t r0, int64_t rows) {
    const tn_gguf_tensor *gt = tn_gguf_find_tensor(m->gguf, name);
    ref_mat r = {NULL, rows, gt ? gt->ne[0] : 0};
    if (!gt) return r;
    r.w = malloc((size_t)(r.rows * r.cols) * sizeof(float));
    const size_t rb = tn_dtype_row_size(gt->type, gt->ne[0]);
    for (int64_t i = 0; i < rows; i++)
        tn_kern()->slot[gt->type].to_float((const uint8_t *)gt->data + (size_t)(r0 + i) * rb, r.w + i * r.cols, r.cols);
    return r;
}

/* 3-D file tensor `name` ([ne0, ne1, ne2]) as ne1 * ne2 rows of ne0, from the file's bytes. */
static ref_mat ref_deq_file_3d(const tern_model *m, const char *name) {
    const tn_gguf_tensor *gt = tn_gguf_find_tensor(m->gguf, name);
    return gt ? ref_deq_file_rows(m, name, 0, gt->ne[1] * gt->ne[2]) : (ref_mat){NULL, 0, 0};
}

/* phi3: q | k | v rows of attn_qkv, gate | up rows of ffn_up (llama.cpp build_qkv / ggml_swiglu);
 * LongRoPE's factor set for a context of n_ctx and its attention factor, read from the file. */
static void ref_phi3(ref_model *r, int32_t l) {
    const tn_hparams *hp = &r->hp;
    const int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    char n[64];
    snprintf(n, sizeof n, "blk.%d.attn_qkv.weight", (int)l);
    r->wq[l] = ref_deq_file_rows(r->m, n, 0, qd);
    r->wk[l] = ref_deq_file_rows(r->m, n, qd, kvd);
    r->wv[l] = ref_deq_file_rows(r->m, n, qd + kvd, kvd);
    snprintf(n, sizeof n, "blk.%d.ffn_up.weight", (int)l);
    r->wg[l] = ref_deq_file_rows(r->m, n, 0, hp->n_ff);
    r->wu[l] = ref_deq_file_rows(r->m, n, hp->n_ff, hp->n_ff);
    if (l) return;
    int64_t orig = 0;
    float af = 1.0f;
    if (tn_gguf_get_i64(r->m->gguf, "phi3.rope.scaling.original_context_length", false, &orig) || !orig)
        tn_gguf_get_i64(r->m->gguf, "phi3.context_length", true, &orig);
    tn_gguf_get_f32(r->m->gguf, "phi3.rope.scaling.attn_factor", false, &af);
    const tn_gguf_tensor *f = tn_gguf_find_tensor(r->m->gguf, r->n_ctx > orig ? "rope_factors_long.weight" : "rope_factors_short.weight");
    r->ff = f ? (const float *)f->data : NULL;
    r->mscale = af;
}

ref_model *ref_create(const tern_model *m, int32_t n_ctx) {
    ref_model *r = calloc(1, sizeof *r);
    r->m = m;
    r->hp = m->hp;
    r->n_ctx = n_ctx;
    r->ff = m->rope_freqs.data;
    r->mscale = 1.0;
    int32_t nl = r->hp.n_layer;
    r->emb = ref_deq(&m->tok_embd);
    r->out = ref_deq(&m->output);
    ref_mat **all[] = {&r->wq, &r->wk, &r->wv, &r->wo, &r->wg, &r->wu, &r->wd, &r->wr, &r->xg, &r->xu, &r->xd,
                       &r->sg, &r->su, &r->sd};
    for (size_t i = 0; i < 14; i++) *all[i] = calloc((size_t)nl, sizeof(ref_mat));
    r->sgate = calloc((size_t)nl, sizeof *r->sgate);
    const float ***gv[] = {&r->sinks, &r->bo, &r->fnorm, &r->rbias, &r->gbias, &r->ubias, &r->dbias};
    static const char *const gvn[] = {"attn_sinks.weight", "attn_output.bias", "post_attention_norm.weight",
                                      "ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"};
    const bool gpt_oss = r->hp.arch == TN_ARCH_GPT_OSS;
    for (size_t i = 0; i < 7; i++) {
        *gv[i] = calloc((size_t)nl, sizeof(float *));
        for (int32_t l = 0; gpt_oss && l < nl; l++) {
            char n[96];
            snprintf(n, sizeof n, "blk.%d.%s", (int)l, gvn[i]);
            const tn_gguf_tensor *t = tn_gguf_find_tensor(m->gguf, n);
            (*gv[i])[l] = t && t->type == TN_F32 ? (const float *)t->data : NULL;
        }
    }
    /* YaRN (gpt-oss files): rope.scaling.factor s over original_context_length L0; dim pair i
     * keeps its unscaled angle where i is below the dim at which a frequency turns beta_fast (32)
     * times over L0, the interpolated one (angle / s) above where it turns beta_slow (1) times, a
     * linear ramp between; cos and sin are scaled by 1 + 0.1 ln s (the YaRN paper's sqrt(1/t)) */
    const bool ds = r->hp.arch == TN_ARCH_DEEPSEEK2 || r->hp.arch == TN_ARCH_PLM; /* latent attention */
    if (ds) ref_ds_create(r);
    if (gpt_oss || ds) {
        const tn_hparams *hp = &r->hp;
        const double s_ = 1.0 / hp->rope_freq_scale, L0 = hp->n_ctx_orig, b = hp->rope_freq_base;
        const double lo = floor(hp->n_rot * log(L0 / (32.0 * 2 * 3.14159265358979323846)) / (2 * log(b)));
        const double hi = ceil(hp->n_rot * log(L0 / (1.0 * 2 * 3.14159265358979323846)) / (2 * log(b)));
        r->yarn = s_ > 1, r->yarn_lo = lo > 0 ? lo : 0, r->yarn_hi = hi < hp->n_rot - 1 ? hi : hp->n_rot - 1;
        r->mscale = ds ? 1.0 : 1.0 + 0.1 * log(s_); /* DeepSeek: mscale / mscale_all_dim = 1 on cos, sin */
    }
    r->min_gap = INFINITY;
    for (int32_t l = 0; l < nl; l++) {
        const tn_tensor *w = m->layers[l].w;
        char n[64];
        snprintf(n, sizeof n, "blk.%d.ffn_gate_inp.weight", (int)l);
        if (tn_gguf_find_tensor(m->gguf, n)) { /* experts, read from the file by llama.cpp's names */
            const tn_gguf_tensor *gt = tn_gguf_find_tensor(m->gguf, n);
            r->wr[l] = ref_deq_file_rows(m, n, 0, gt->ne[1]);
            snprintf(n, sizeof n, "blk.%d.ffn_gate_exps.weight", (int)l);
            r->xg[l] = ref_deq_file_3d(m, n);
            snprintf(n, sizeof n, "blk.%d.ffn_up_exps.weight", (int)l);
            r->xu[l] = ref_deq_file_3d(m, n);
            snprintf(n, sizeof n, "blk.%d.ffn_down_exps.weight", (int)l);
            r->xd[l] = ref_deq_file_3d(m, n);
            snprintf(n, sizeof n, "blk.%d.ffn_gate_shexp.weight", (int)l);
            const tn_gguf_tensor *sh = tn_gguf_find_tensor(m->gguf, n);
            if (sh) { /* the shared expert, by llama.cpp's names */
                r->sg[l] = ref_deq_file_rows(m, n, 0, sh->ne[1]);
                snprintf(n, sizeof n, "blk.%d.ffn_up_shexp.weight", (int)l);
                r->su[l] = ref_deq_file_rows(m, n, 0, sh->ne[1]);
                snprintf(n, sizeof n, "blk.%d.ffn_down_shexp.weight", (int)l);
                r->sd[l] = ref_deq_file_rows(m, n, 0, (int64_t)m->hp.n_embd);
                snprintf(n, sizeof n, "blk.%d.ffn_gate_inp_shexp.weight", (int)l);
                const tn_gguf_tensor *gv = tn_gguf_find_tensor(m->gguf, n);
                r->sgate[l] = gv && gv->type == TN_F32 ? (const float *)gv->data : NULL;
            }
        }
        if (r->hp.arch == TN_ARCH_PHI3) {
            ref_phi3(r, l);
        } else if (r->hp.arch == TN_ARCH_PLM) { /* not gated: up, by llama.cpp's name */
            r->wu[l] = ref_layer_mat(m, l, "ffn_up.weight");
        } else if (ds) {
            if (!r->wr[l].w) r->wg[l] = ref_deq(&w[TN_ROLE_FFN_GATE]), r->wu[l] = ref_deq(&w[TN_ROLE_FFN_UP]);
        } else {
            r->wq[l] = ref_deq(&w[TN_ROLE_ATTN_Q]);
            r->wk[l] = ref_deq(&w[TN_ROLE_ATTN_K]);
            r->wv[l] = ref_deq(&w[TN_ROLE_ATTN_V]);
            if (!r->wr[l].w) {
                r->wg[l] = ref_deq(&w[TN_ROLE_FFN_GATE]);
                r->wu[l] = ref_deq(&w[TN_ROLE_FFN_UP]);
            }
        }
        r->wo[l] = ref_deq(&w[TN_ROLE_ATTN_OUT]);
        if (!r->wr[l].w) r->wd[l] = ref_deq(&w[TN_ROLE_FFN_DOWN]);
    }
    size_t kvn = (size_t)nl * (size_t)n_ctx * (size_t)(r->hp.n_head_kv * r->hp.head_dim);
    r->kc = calloc(kvn, sizeof(double));
    r->vc = calloc(kvn, sizeof(double));
    if (r->kv_lora > 0) r->lc = calloc((size_t)nl * (size_t)n_ctx * (size_t)(r->kv_lora + r->hp.n_rot), sizeof(double));
    return r;
}

void ref_free(ref_model *r) {
    if (!r) return;
    free(r->emb.w);
    free(r->out.w);
    ref_mat *all[] = {r->wq, r->wk, r->wv, r->wo, r->wg, r->wu, r->wd, r->wr, r->xg, r->xu, r->xd, r->sg, r->su, r->sd};
    for (size_t i = 0; i < 14; i++) {
        for (int32_t l = 0; l < r->hp.n_layer; l++) free(all[i][l].w);
        free(all[i]);
    }
    free(r->sgate);
    free(r->rot_sign);
    const float **gv[] = {r->sinks, r->bo, r->fnorm, r->rbias, r->gbias, r->ubias, r->dbias};
    for (size_t i = 0; i < 7; i++) free(gv[i]);
    if (r->mq) {
        ref_mat *ds[] = {r->mq, r->mqa, r->mqb, r->mkva, r->mkb, r->mvb, r->mkvb};
        for (size_t i = 0; i < 7; i++) {
            for (int32_t l = 0; l < r->hp.n_layer; l++) free(ds[i][l].w);
            free(ds[i]);
        }
        free(r->mqa_norm), free(r->mkva_norm), free(r->probs_b);
    }
    free(r->kc);
    free(r->lc);
    free(r->vc);
    free(r);
}

static void matvec(const ref_mat *W, const double *x, double *y) {
    for (int64_t i = 0; i < W->rows; i++) {
        double s = 0;
        for (int64_t j = 0; j < W->cols; j++) s += (double)W->w[i * W->cols + j] * x[j];
        y[i] = s;
    }
}

static void rmsnorm(const double *x, const float *w, double *y, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    double sc = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * sc * w[i];
}

double ref_min_route_gap(const ref_model *r) { return r->min_gap; }

/* Rows e * rows .. (e + 1) * rows - 1 of a stacked expert matrix times x. */
static void matvec_expert(const ref_mat *W, int64_t e, int64_t rows, const double *x, double *y) {
    ref_mat v = {W->w + e * rows * W->cols, rows, W->cols};
    matvec(&v, x, y);
}

/* The mixture-of-experts FFN of layer l on the normed row xb into out[d] (llama.cpp's
 * build_moe_ffn for softmax gating): p = softmax(router xb); the k largest p (equal ones: lower
 * index first); weights p, divided by their sum in qwen3moe and Mixtral-style llama (norm_w) but
 * not in olmoe; out = sum_j w_j * down_j(silu(gate_j xb) * up_j xb). */
static void ref_moe(ref_model *r, int32_t l, const double *xb, double *out) {
    const tn_hparams *hp = &r->hp;
    const int64_t d = hp->n_embd, nx = r->wr[l].rows, k = hp->n_expert_used, ff = r->xg[l].rows / nx;
    double *p = malloc((size_t)nx * sizeof *p), *g = malloc((size_t)ff * sizeof *g), *u = malloc((size_t)ff * sizeof *u);
    double *y = malloc((size_t)d * sizeof *y), mx = -INFINITY, sum = 0;
    int64_t *sel = malloc((size_t)k * sizeof *sel);
    matvec(&r->wr[l], xb, p);
    const bool gpt_oss = hp->arch == TN_ARCH_GPT_OSS;
    if (r->rbias[l])
        for (int64_t e = 0; e < nx; e++) p[e] += r->rbias[l][e];
    const bool ds = hp->arch == TN_ARCH_DEEPSEEK2;
    if (ds && r->gating == 2) { /* DeepSeek-V3: sigmoid scores */
        for (int64_t e = 0; e < nx; e++) p[e] = 1.0 / (1.0 + exp(-p[e]));
    } else if (!gpt_oss) { /* softmax over every expert; gpt-oss selects on the logits */
        for (int64_t e = 0; e < nx; e++) mx = p[e] > mx ? p[e] : mx;
        for (int64_t e = 0; e < nx; e++) sum += (p[e] = exp(p[e] - mx));
        for (int64_t e = 0; e < nx; e++) p[e] /= sum;
    }
    /* the scores experts are chosen by: p, plus DeepSeek-V3's bias; its groups: only the experts
     * of the group_used groups with the largest sums of their two best scores */
    double *ps = malloc((size_t)nx * sizeof *ps);
    for (int64_t e = 0; e < nx; e++) ps[e] = p[e] + (ds && r->probs_b[l] ? r->probs_b[l][e] : 0.0);
    if (ds && r->n_groups > 1) {
        const int64_t G = r->n_groups, per = nx / G;
        double *gsum = malloc((size_t)G * sizeof *gsum);
        for (int64_t g = 0; g < G; g++) {
            double b1 = -INFINITY, b2 = -INFINITY;
            for (int64_t e = g * per; e < (g + 1) * per; e++) {
                if (ps[e] > b1) b2 = b1, b1 = ps[e];
                else if (ps[e] > b2) b2 = ps[e];
            }
            gsum[g] = b1 + b2;
        }
        for (int64_t g = 0; g < G; g++) { /* group g is kept if fewer than group_used groups beat it */
            int64_t better = 0;
            for (int64_t o = 0; o < G; o++) better += gsum[o] > gsum[g] || (gsum[o] == gsum[g] && o < g);
            if (better >= r->group_used)
                for (int64_t e = g * per; e < (g + 1) * per; e++) ps[e] = -INFINITY;
        }
        free(gsum);
    }
    double wsum = 0;
    for (int64_t j = 0; j < k; j++) { /* the j-th largest: the largest not yet taken */
        int64_t best = -1;
        for (int64_t e = 0; e < nx; e++) {
            bool taken = false;
            for (int64_t i = 0; i < j; i++) taken = taken || sel[i] == e;
            if (!taken && (best < 0 || ps[e] > ps[best])) best = e;
        }
        sel[j] = best;
        wsum += p[best];
    }
    double next = -INFINITY; /* the (k+1)-th: how close the routing came to another choice */
    for (int64_t e = 0; e < nx; e++) {
        bool taken = false;
        for (int64_t i = 0; i < k; i++) taken = taken || sel[i] == e;
        if (!taken && ps[e] > next) next = ps[e];
    }
    if (next > -INFINITY && ps[sel[k - 1]] - next < r->min_gap) r->min_gap = ps[sel[k - 1]] - next;
    free(ps);
    /* qwen2moe and olmoe use the probabilities as they are */
    const bool renorm = hp->arch == TN_ARCH_QWEN3MOE || hp->arch == TN_ARCH_LLAMA;
    double *sw = malloc((size_t)k * sizeof *sw); /* gpt-oss: softmax over the k selected logits */
    if (gpt_oss) {
        double smx = -INFINITY, ssum = 0;
        for (int64_t j = 0; j < k; j++) smx = p[sel[j]] > smx ? p[sel[j]] : smx;
        for (int64_t j = 0; j < k; j++) ssum += (sw[j] = exp(p[sel[j]] - smx));
        for (int64_t j = 0; j < k; j++) sw[j] /= ssum;
    }
    for (int64_t i = 0; i < d; i++) out[i] = 0;
    for (int64_t j = 0; j < k; j++) {
        const int64_t e = sel[j];
        matvec_expert(&r->xg[l], e, ff, xb, g);
        matvec_expert(&r->xu[l], e, ff, xb, u);
        if (gpt_oss) { /* biases, then SwiGLU with gate <= 7, up in [-7, 7], sigmoid(1.702 gate), up + 1 */
            for (int64_t i = 0; i < ff; i++) {
                double gi = g[i] + (r->gbias[l] ? r->gbias[l][e * ff + i] : 0), ui = u[i] + (r->ubias[l] ? r->ubias[l][e * ff + i] : 0);
                gi = gi < 7.0 ? gi : 7.0;
                ui = ui < -7.0 ? -7.0 : ui > 7.0 ? 7.0 : ui;
                g[i] = gi / (1.0 + exp(-1.702 * gi)) * (ui + 1.0);
            }
        } else {
            for (int64_t i = 0; i < ff; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        }
        matvec_expert(&r->xd[l], e, d, g, y);
        if (r->dbias[l])
            for (int64_t i = 0; i < d; i++) y[i] += r->dbias[l][e * d + i];
        double wj = gpt_oss ? sw[j] : renorm || (ds && r->w_norm) ? p[e] / wsum : p[e];
        if (ds && r->w_scale != 0) wj *= r->w_scale; /* DeepSeek's routed_scaling_factor */
        for (int64_t i = 0; i < d; i++) out[i] += wj * y[i];
    }
    free(sw);
    free(p), free(g), free(u), free(y), free(sel);
    if (!r->sg[l].w) return;
    /* qwen2moe's shared expert: out += sigmoid(gate . xb) * down(silu(gate_sh xb) * up_sh xb) */
    const int64_t fs = r->sg[l].rows;
    g = malloc((size_t)fs * sizeof *g), u = malloc((size_t)fs * sizeof *u), y = malloc((size_t)d * sizeof *y);
    matvec(&r->sg[l], xb, g);
    matvec(&r->su[l], xb, u);
    for (int64_t i = 0; i < fs; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
    matvec(&r->sd[l], g, y);
    double gs = 1.0;
    if (r->sgate[l]) {
        double dot = 0;
        for (int64_t i = 0; i < d; i++) dot += (double)r->sgate[l][i] * xb[i];
        gs = 1.0 / (1.0 + exp(-dot));
    }
    for (int64_t i = 0; i < d; i++) out[i] += gs * y[i];
    free(g), free(u), free(y);
}

/* Rotates the first n_rot dims of each head (the rest untouched: partial rotary), by angles
 * pos * fscale * base^(-2i/n_rot) / ff[i], the rotated values times mscale. */
static void rope(const ref_model *r, const tn_hparams *hp, double base, double fscale, const float *ff, double mscale, double *v,
                 int32_t n_heads, int32_t pos) {
    for (int32_t h = 0; h < n_heads; h++) {
        double *x = v + (int64_t)h * hp->head_dim;
        for (int32_t i = 0; i < hp->n_rot / 2; i++) {
            double freq = pow(base, -2.0 * i / hp->n_rot) * fscale / (ff ? ff[i] : 1.0);
            if (r->yarn) { /* the ramp's share of the unscaled frequency */
                const double y = (i - r->yarn_lo) / (r->yarn_hi - r->yarn_lo > 0.001 ? r->yarn_hi - r->yarn_lo : 0.001);
                const double mix = 1.0 - (y < 0 ? 0 : y > 1 ? 1 : y);
                freq = freq * (1 - mix) + (freq / fscale) * mix;
            }
            double ang = pos * freq, co = cos(ang), si = sin(ang);
            /* llama and smollm3 (their converter permutes HF's q/k rows) rotate adjacent pairs;
             * qwen2/qwen3 rotate halves */
            const bool adjacent = hp->arch == TN_ARCH_LLAMA || hp->arch == TN_ARCH_SMOLLM3 || hp->arch == TN_ARCH_DEEPSEEK2 ||
                                  hp->arch == TN_ARCH_PLM; /* gemma3: halves */
            int32_t a = adjacent ? 2 * i : i;
            int32_t b = adjacent ? 2 * i + 1 : i + hp->n_rot / 2;
            double x0 = x[a], x1 = x[b];
            x[a] = (x0 * co - x1 * si) * mscale;
            x[b] = (x0 * si + x1 * co) * mscale;
        }
    }
}

/* deepseek2's attention of layer l for the normed row xb into o[n_embd], decompressed per head
 * (DeepSeek-V2's modeling: keys [W_kb,h c | k_pe], values W_vb,h c, both cached per head in the
 * reference's double cache), not the latent-space form tern runs. */
static void ref_ds_attn(ref_model *r, int32_t l, const double *xb, double *o, int32_t pos) {
    const tn_hparams *hp = &r->hp;
    const int64_t H = hp->n_head, hd = hp->head_dim, nr = hp->n_rot, np = hd - nr, R = r->kv_lora, vh = r->v_head;
    const int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim; /* the cache's row: H * hd >= H * vh */
    double *q = malloc((size_t)(H * hd) * sizeof *q), *kva = malloc((size_t)(R + nr) * sizeof *kva);
    double *att = calloc((size_t)(H * vh), sizeof *att), *sc = malloc((size_t)(pos + 1) * sizeof *sc);
    if (r->mqa[l].w) { /* q = Wq_b rmsnorm(Wq_a x) */
        double *qa = malloc((size_t)r->mqa[l].rows * sizeof *qa);
        matvec(&r->mqa[l], xb, qa);
        rmsnorm(qa, r->mqa_norm[l], qa, r->mqa[l].rows, hp->rms_eps);
        matvec(&r->mqb[l], qa, q);
        free(qa);
    } else {
        matvec(&r->mq[l], xb, q);
    }
    matvec(&r->mkva[l], xb, kva);
    rmsnorm(kva, r->mkva_norm[l], kva, R, hp->rms_eps);
    tn_hparams hq = *hp;
    rope(r, &hq, hp->rope_freq_base, hp->rope_freq_scale, NULL, r->mscale, q + np, (int32_t)H, pos);
    rope(r, &hq, hp->rope_freq_base, hp->rope_freq_scale, NULL, r->mscale, kva + R, 1, pos);
    /* ref_set_kv_types: the cached row [c | k_pe] rounded through the cache's type (as tern caches it)
     * before the heads decompress it, and the scores taken as a quantized cache takes them: the
     * head's query in latent space (q_nope,h W_kb,h | q_pe,h) rounded as q8 blocks, dotted with the
     * cached rows */
    const bool lat = r->type_k != 0 && r->type_k != TN_F16 && r->lc;
    if (lat) ref_round(r->type_k, false, kva, R + nr);
    double *Lc = lat ? r->lc + (size_t)l * r->n_ctx * (size_t)(R + nr) : NULL;
    if (lat) memcpy(Lc + (size_t)pos * (size_t)(R + nr), kva, sizeof(double) * (size_t)(R + nr));
    double *K = r->kc + ((size_t)l * r->n_ctx + (size_t)pos) * kvd, *V = r->vc + ((size_t)l * r->n_ctx + (size_t)pos) * kvd;
    for (int64_t h = 0; h < H; h++) {
        for (int64_t i = 0; i < np; i++) { /* k_nope,h = W_kb,h c: attn_k_b's rows are c's index */
            double s = 0;
            for (int64_t c = 0; c < R; c++)
                s += (r->mkb[l].w ? (double)r->mkb[l].w[(h * R + c) * np + i] : (double)r->mkvb[l].w[(h * (np + vh) + i) * R + c]) * kva[c];
            K[h * hd + i] = s;
        }
        for (int64_t i = 0; i < nr; i++) K[h * hd + np + i] = kva[R + i];
        for (int64_t j = 0; j < vh; j++) {
            double s = 0;
            for (int64_t c = 0; c < R; c++)
                s += (r->mvb[l].w ? (double)r->mvb[l].w[(h * vh + j) * R + c] : (double)r->mkvb[l].w[(h * (np + vh) + np + j) * R + c]) * kva[c];
            V[h * vh + j] = s;
        }
    }
    const double *K0 = r->kc + (size_t)l * r->n_ctx * kvd, *V0 = r->vc + (size_t)l * r->n_ctx * kvd;
    double *qa = lat ? malloc(sizeof(double) * (size_t)(R + nr)) : NULL;
    for (int64_t h = 0; h < H; h++) {
        double mx = -INFINITY, sum = 0;
        if (lat) {
            for (int64_t c = 0; c < R; c++) {
                double s = 0;
                for (int64_t i = 0; i < np; i++)
                    s += q[h * hd + i] *
                         (r->mkb[l].w ? (double)r->mkb[l].w[(h * R + c) * np + i] : (double)r->mkvb[l].w[(h * (np + vh) + i) * R + c]);
                qa[c] = s;
            }
            for (int64_t i = 0; i < nr; i++) qa[R + i] = q[h * hd + np + i];
            ref_round(TN_Q8_0, true, qa, R + nr);
        }
        for (int32_t t = 0; t <= pos; t++) {
            double s = 0;
            if (lat)
                for (int64_t i = 0; i < R + nr; i++) s += qa[i] * Lc[(size_t)t * (size_t)(R + nr) + i];
            else
                for (int64_t i = 0; i < hd; i++) s += q[h * hd + i] * K0[(size_t)t * kvd + h * hd + i];
            sc[t] = s * r->ds_scale;
            mx = sc[t] > mx ? sc[t] : mx;
        }
        for (int32_t t = 0; t <= pos; t++) sum += (sc[t] = exp(sc[t] - mx));
        for (int32_t t = 0; t <= pos; t++)
            for (int64_t j = 0; j < vh; j++) att[h * vh + j] += sc[t] / sum * V0[(size_t)t * kvd + h * vh + j];
    }
    matvec(&r->wo[l], att, o);
    free(q), free(kva), free(att), free(sc), free(qa);
}

void ref_step(ref_model *r, int32_t token, double *logits, double *layers) {
    const tn_hparams *hp = &r->hp;
    const int64_t d = hp->n_embd, hd = hp->head_dim, kvd = (int64_t)hp->n_head_kv * hd, ff = hp->n_ff;
    const int64_t qd = (int64_t)hp->n_head * hd; /* qwen3: head_dim from key_length, qd != d */
    double *x = malloc((size_t)d * sizeof *x), *xb = malloc((size_t)d * sizeof *xb), *q = malloc((size_t)qd * sizeof *q);
    double *k = malloc((size_t)kvd * sizeof *k), *v = malloc((size_t)kvd * sizeof *v), *att = malloc((size_t)qd * sizeof *att);
    double *o = malloc((size_t)d * sizeof *o), *g = malloc((size_t)ff * sizeof *g), *u = malloc((size_t)ff * sizeof *u);
    double *sc = malloc((size_t)r->n_ctx * sizeof *sc);
    const int32_t pos = r->pos;
    const bool gemma2 = hp->arch == TN_ARCH_GEMMA2, gemma = hp->arch == TN_ARCH_GEMMA3 || gemma2;
    for (int64_t i = 0; i < d; i++) x[i] = r->emb.w[(int64_t)token * d + i] * (gemma ? sqrt((double)d) : 1.0);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const tn_tensor *w = r->m->layers[l].w;
        rmsnorm(x, w[TN_ROLE_ATTN_NORM].data, xb, d, hp->rms_eps);
        if (hp->arch == TN_ARCH_DEEPSEEK2 || hp->arch == TN_ARCH_PLM) { /* latent attention, then the FFN below */
            ref_ds_attn(r, l, xb, o, pos);
            for (int64_t i = 0; i < d; i++) x[i] += o[i];
            goto ffn;
        }
        matvec(&r->wq[l], xb, q);
        matvec(&r->wk[l], xb, k);
        matvec(&r->wv[l], xb, v);
        if (w[TN_ROLE_ATTN_Q_B].data)
            for (int64_t i = 0; i < qd; i++) q[i] += ((const float *)w[TN_ROLE_ATTN_Q_B].data)[i];
        if (w[TN_ROLE_ATTN_K_B].data)
            for (int64_t i = 0; i < kvd; i++) k[i] += ((const float *)w[TN_ROLE_ATTN_K_B].data)[i];
        if (w[TN_ROLE_ATTN_V_B].data)
            for (int64_t i = 0; i < kvd; i++) v[i] += ((const float *)w[TN_ROLE_ATTN_V_B].data)[i];
        /* qwen3: every head of q and of k RMS-normalized over its head_dim values (Qwen3Attention's
         * q_norm / k_norm), then rotated */
        /* olmoe: the whole q row and the whole k row normalized (OlmoeAttention's q_norm / k_norm) */
        if (hp->arch == TN_ARCH_OLMOE) {
            rmsnorm(q, w[TN_ROLE_ATTN_Q_NORM].data, q, qd, hp->rms_eps);
            rmsnorm(k, w[TN_ROLE_ATTN_K_NORM].data, k, kvd, hp->rms_eps);
        }
        if (hp->arch == TN_ARCH_QWEN3 || hp->arch == TN_ARCH_QWEN3MOE || hp->arch == TN_ARCH_GEMMA3) {
            for (int32_t h = 0; h < hp->n_head; h++) rmsnorm(q + h * hd, w[TN_ROLE_ATTN_Q_NORM].data, q + h * hd, hd, hp->rms_eps);
            for (int32_t h = 0; h < hp->n_head_kv; h++) rmsnorm(k + h * hd, w[TN_ROLE_ATTN_K_NORM].data, k + h * hd, hd, hp->rms_eps);
        }
        /* smollm3: no rotation on every fourth layer (SmolLM3's no_rope_layers: 3, 7, 11, ...) */
        const bool nope = hp->arch == TN_ARCH_SMOLLM3 && l % 4 == 3;
        /* gemma3: local (sliding-window) layers are all but every swa_period-th, RoPE base 10000
         * (or rope.freq_base_swa) without scaling; global layers the file's base and scaling */
        /* gemma2: the even layers are local (Gemma 2 alternates local and global attention, first
         * local), one RoPE for all */
        /* gpt-oss: the even layers are local (sliding_window_pattern 2), with the same RoPE */
        const bool gpt_oss = hp->arch == TN_ARCH_GPT_OSS;
        const bool local = gemma2 || gpt_oss ? hp->n_swa > 0 && l % 2 == 0
                                  : gemma && hp->n_swa > 0 && l % hp->swa_period != hp->swa_period - 1;
        const double base = local && !gemma2 && !gpt_oss ? hp->rope_base_swa : hp->rope_freq_base;
        const double fscale = local && !gemma2 && !gpt_oss ? 1.0 : hp->rope_freq_scale;
        if (!nope) {
            rope(r, hp, base, fscale, r->ff, r->mscale, q, hp->n_head, pos);
            rope(r, hp, base, fscale, r->ff, r->mscale, k, hp->n_head_kv, pos);
        }
        /* scores: q.k / sqrt(head_dim); gemma3 27B (62 layers), gemma2 27B (46): / sqrt(n_embd / n_head);
         * gemma2 soft-caps them: cap * tanh(s / cap) */
        const bool big = (gemma2 && hp->n_layer == 46) || (gemma && !gemma2 && hp->n_layer == 62);
        const double qscale = big ? 1.0 / sqrt((double)(d / hp->n_head)) : 1.0 / sqrt((double)hd);
        const int32_t t_first = local && pos >= hp->n_swa ? pos - hp->n_swa + 1 : 0; /* the window: n_swa positions */
        double *K = r->kc + ((size_t)l * r->n_ctx) * kvd, *V = r->vc + ((size_t)l * r->n_ctx) * kvd;
        if (r->rot_k) {
            for (int32_t h = 0; h < hp->n_head; h++) ref_rot_head(r, q + h * hd, false);
            for (int32_t h = 0; h < hp->n_head_kv; h++) ref_rot_head(r, k + h * hd, false);
        }
        if (r->rot_v)
            for (int32_t h = 0; h < hp->n_head_kv; h++) ref_rot_head(r, v + h * hd, false);
        const int kc_bits = r->type_k >= TERN_KV_TQC(2) && r->type_k <= TERN_KV_TQC(4) ? r->type_k - TERN_KV_TQC(0) : 0;
        if (kc_bits) { /* per-channel K: rounded a group at a time below, q as it is */
        } else if (r->type_k != 0 && r->type_k != TN_F16) { /* ref_set_kv_types: each head's K and q rounded */
            for (int32_t h = 0; h < hp->n_head_kv; h++) ref_round(r->type_k, false, k + h * hd, hd);
            for (int32_t h = 0; h < hp->n_head; h++) ref_round(TN_Q8_0, true, q + h * hd, hd);
        }
        for (int32_t h = 0; h < hp->n_head_kv; h++) ref_round(r->type_v, false, v + h * hd, hd);
        memcpy(K + (size_t)pos * kvd, k, (size_t)kvd * sizeof *k);
        memcpy(V + (size_t)pos * kvd, v, (size_t)kvd * sizeof *v);
        if (kc_bits && (pos + 1) % 16 == 0) ref_round_kc_group(kc_bits, K + (size_t)(pos - 15) * kvd, kvd, kvd);
        for (int32_t h = 0; h < hp->n_head; h++) {
            int32_t kh = h / (hp->n_head / hp->n_head_kv);
            double mx = -1e300, sum = 0;
            for (int32_t t = t_first; t <= pos; t++) {
                double s = 0;
                for (int64_t i = 0; i < hd; i++) s += q[h * hd + i] * K[(size_t)t * kvd + kh * hd + i];
                sc[t] = s * qscale;
                if (gemma2) sc[t] = hp->attn_softcap * tanh(sc[t] / hp->attn_softcap);
                if (sc[t] > mx) mx = sc[t];
            }
            /* gpt-oss: the head's sink is one more logit in the softmax, with no value */
            const double sink = r->sinks[l] ? r->sinks[l][h] : -INFINITY;
            if (sink > mx) mx = sink;
            for (int32_t t = t_first; t <= pos; t++) sum += (sc[t] = exp(sc[t] - mx));
            if (r->sinks[l]) sum += exp(sink - mx);
            for (int64_t i = 0; i < hd; i++) {
                double acc = 0;
                for (int32_t t = t_first; t <= pos; t++) acc += sc[t] / sum * V[(size_t)t * kvd + kh * hd + i];
                att[h * hd + i] = acc;
            }
            if (r->rot_v) ref_rot_head(r, att + h * hd, true);
        }
        matvec(&r->wo[l], att, o);
        if (r->bo[l])
            for (int64_t i = 0; i < d; i++) o[i] += r->bo[l][i];
        if (gemma) rmsnorm(o, w[TN_ROLE_ATTN_POST_NORM].data, o, d, hp->rms_eps); /* post-attention norm */
        for (int64_t i = 0; i < d; i++) x[i] += o[i];
    ffn:
        /* gpt-oss: post_attention_norm (from the file) is the FFN's input norm */
        rmsnorm(x, r->fnorm[l] ? r->fnorm[l] : (const float *)w[TN_ROLE_FFN_NORM].data, xb, d, hp->rms_eps);
        if (r->wr[l].w) { /* experts */
            ref_moe(r, l, xb, o);
            for (int64_t i = 0; i < d; i++) x[i] += o[i];
            if (layers) memcpy(layers + (size_t)l * d, x, (size_t)d * sizeof *x);
            continue;
        }
        matvec(&r->wu[l], xb, u);
        if (hp->arch == TN_ARCH_PLM) /* PLM's MLP: down(relu(up x)^2), no gate */
            for (int64_t i = 0; i < ff; i++) g[i] = u[i] > 0 ? u[i] * u[i] : 0.0;
        else matvec(&r->wg[l], xb, g);
        for (int64_t i = 0; hp->arch != TN_ARCH_PLM && i < ff; i++) /* SwiGLU; gemma: GeGLU with GELU's tanh approximation */
            g[i] = gemma ? 0.5 * g[i] * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (g[i] + 0.044715 * g[i] * g[i] * g[i]))) * u[i]
                         : g[i] / (1.0 + exp(-g[i])) * u[i];
        double *dn = malloc((size_t)d * sizeof *dn);
        matvec(&r->wd[l], g, dn);
        if (gemma) rmsnorm(dn, w[TN_ROLE_FFN_POST_NORM].data, dn, d, hp->rms_eps); /* post-FFN norm */
        for (int64_t i = 0; i < d; i++) x[i] += dn[i];
        free(dn);
        if (layers) memcpy(layers + (size_t)l * d, x, (size_t)d * sizeof *x);
    }
    rmsnorm(x, r->m->output_norm.data, xb, d, hp->rms_eps);
    if (layers) memcpy(layers + (size_t)hp->n_layer * d, xb, (size_t)d * sizeof *xb);
    matvec(&r->out, xb, logits);
    if (gemma && hp->logit_softcap > 0)
        for (int64_t i = 0; i < hp->n_vocab; i++) logits[i] = hp->logit_softcap * tanh(logits[i] / hp->logit_softcap);
    r->pos++;
    free(x), free(xb), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(sc);
}
