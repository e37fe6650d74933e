/*
 * api.c — the public tern_model / tern_ctx API (include/tern/tern.h) over the internal model,
 * tokenizer and forward pass. Validates every caller argument; plans all context memory up front.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/trace.h"
#include "cuda/cuda.h"
#include "kern/matmul.h"
#include "model/ctx.h"
#include "model/lora.h"
#include "quant/kc.h"

void tern_model_params_init(tern_model_params *p) {
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->use_mmap = true;
    p->repack = true;
}

static tern_status tn_check_tensors(const tn_gguf *g) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tn_gguf_tensor *t = &g->tensors[i];
        if (t->type != TN_F32 && t->type != TN_F16) continue;
        int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        for (int64_t j = 0; j < n; j++) {
            float v = t->type == TN_F32 ? ((const float *)t->data)[j] : tn_fp16_to_fp32(((const tn_fp16 *)t->data)[j]);
            if (v != v || v - v != 0)
                return tn_err(TERN_ERR_FORMAT, "model: tensor '%s' has a non-finite value at element %lld", t->name,
                              (long long)j);
        }
    }
    return TERN_OK;
}

tern_status tern_model_load(const char *path, const tern_model_params *pp, tern_model **out) {
    if (!out) return tn_err(TERN_ERR_INVALID_ARG, "tern_model_load: out is NULL");
    *out = NULL;
    if (!path) return tn_err(TERN_ERR_INVALID_ARG, "tern_model_load: path is NULL");
    tern_model_params p;
    tern_model_params_init(&p);
    if (pp) memcpy(&p, pp, TN_MIN(sizeof p, pp->struct_size ? pp->struct_size : sizeof p));
    tn_gguf *g = NULL;
    tern_status s = tn_gguf_open(path, p.use_mmap, &g);
    if (s) return s;
    if (p.check_tensors && (s = tn_check_tensors(g))) {
        tn_gguf_free(g);
        return tn_err_prefix(s, "%s", path);
    }
    const tn_gguf_kv *gt = tn_gguf_find(g, "general.type"); /* llama.cpp's adapters say "adapter" */
    if (gt && gt->type == TN_GGUF_STRING && tn_gguf_str_eq(gt->v.str, "adapter")) {
        tn_gguf_free(g);
        return tn_err(TERN_ERR_FORMAT, "%s: general.type is 'adapter': a LoRA adapter, not a model (give it with --lora)", path);
    }
    tern_model *m = NULL;
    if ((s = tn_model_load_gguf(g, &m))) {
        tn_gguf_free(g);
        return tn_err_prefix(s, "%s", path);
    }
    const char *env = getenv("TERN_REPACK"); /* TERN_REPACK=0: keep every file layout */
    if (env && !strcmp(env, "0")) p.repack = false;
    if (p.repack && (s = tn_model_repack(m, p.hot_experts))) {
        tern_model_free(m);
        return tn_err_prefix(s, "%s", path);
    }
    if ((s = tn_tier_init(m, p.hot_experts))) {
        tern_model_free(m);
        return tn_err_prefix(s, "%s", path);
    }
    m->path = tn_strdup(path);
    if (!m->path) {
        tern_model_free(m);
        return tn_err(TERN_ERR_NOMEM, "model: out of memory");
    }
    if (p.progress && p.progress(1, 1, p.progress_user)) {
        tern_model_free(m);
        return tn_err(TERN_ERR_ABORTED, "model load cancelled");
    }
    *out = m;
    return TERN_OK;
}

void tern_model_free(tern_model *m) {
    if (!m) return;
    tn_vocab_free(m->vocab);
    tn_gguf_free(m->gguf);
    tn_free(m->layers);
    tn_free_aligned(m->repacked);
    tn_tier_free(m->tier);
    tn_free(m->mla_split);
    tn_free(m->path);
    tn_free(m);
}

int32_t tern_model_n_vocab(const tern_model *m) { return m->hp.n_vocab; }
int32_t tern_model_n_ctx_train(const tern_model *m) { return m->hp.n_ctx_train; }
int32_t tern_model_n_embd(const tern_model *m) { return m->hp.n_embd; }
int32_t tern_model_n_layer(const tern_model *m) { return m->hp.n_layer; }
uint64_t tern_model_n_params(const tern_model *m) { return m->n_params; }
uint64_t tern_model_size_bytes(const tern_model *m) { return m->weight_bytes; }
const char *tern_model_desc(const tern_model *m) { return m->desc; }

int32_t tern_model_meta_str(const tern_model *m, const char *key, char *buf, size_t cap) {
    const tn_gguf_kv *kv = tn_gguf_find(m->gguf, key);
    if (!kv) return -1;
    char tmp[1024];
    tn_gguf_kv_format(kv, tmp, sizeof tmp);
    size_t n = strlen(tmp);
    if (buf && cap) {
        size_t c = TN_MIN(n, cap - 1);
        memcpy(buf, tmp, c);
        buf[c] = 0;
    }
    return (int32_t)n;
}

/* ---- tokenizer wrappers ---- */
tern_token tern_token_bos(const tern_model *m) { return tn_vocab_bos(m->vocab); }
tern_token tern_token_eos(const tern_model *m) { return tn_vocab_eos(m->vocab); }
bool tern_token_is_eog(const tern_model *m, tern_token t) { return tn_vocab_is_eog(m->vocab, t); }
bool tern_vocab_add_bos(const tern_model *m) { return tn_vocab_add_bos(m->vocab); }

tern_status tern_tokenize(const tern_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                          tern_token *out, int32_t cap, int32_t *n_out) {
    if (!m || (!text && len) || !n_out || cap < 0 || (!out && cap))
        return tn_err(TERN_ERR_INVALID_ARG, "tern_tokenize: invalid arguments");
    return tn_tokenize(m->vocab, text ? text : "", len, add_special, parse_special, out, cap, n_out);
}

int32_t tern_token_to_piece(const tern_model *m, tern_token t, char *buf, int32_t cap, bool special) {
    return tn_token_to_piece(m->vocab, t, buf, cap, special);
}

int32_t tern_detokenize(const tern_model *m, const tern_token *toks, int32_t n, char *buf, int32_t cap,
                        bool remove_leading_space, bool special) {
    return tn_detokenize(m->vocab, toks, n, buf, cap, remove_leading_space, special);
}

/* ---- contexts ---- */
void tern_ctx_params_init(tern_ctx_params *p) {
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->n_ctx = 0;
    p->n_batch = 512;
    p->n_threads = tn_cpu_count();
    p->device = TERN_DEVICE_CPU;
    p->n_gpu_layers = -1;
}

static void *tn_ctx_alloc(tern_ctx *c, size_t bytes, bool *ok) {
    if (!*ok) return NULL;
    void *p = tn_malloc_aligned(bytes, 64);
    if (!p) *ok = false;
    else c->bytes += bytes;
    return p;
}

static_assert(TERN_KV_TQC(2) == TN_TQC2 && TERN_KV_TQC(4) == TN_TQC4, "TERN_KV_TQC ids are the tqc dtype ids");
static_assert(TN_KC_ROWS == TN_KV_BLOCK, "a per-channel K group is one cache block");

static tern_status tn_ctx_create_impl(const tern_model *m, const tern_ctx_params *pp, int32_t swa_blocks, int32_t n_seq, tern_ctx **out) {
    if (!out) return tn_err(TERN_ERR_INVALID_ARG, "tern_ctx_create: out is NULL");
    *out = NULL;
    if (!m) return tn_err(TERN_ERR_INVALID_ARG, "tern_ctx_create: model is NULL");
    tern_ctx_params p;
    tern_ctx_params_init(&p);
    if (pp) memcpy(&p, pp, TN_MIN(sizeof p, pp->struct_size ? pp->struct_size : sizeof p));
    const tn_hparams *hp = &m->hp;
    if (p.n_ctx == 0) p.n_ctx = hp->n_ctx_train;
    if (p.n_ctx < 1 || p.n_ctx > (1 << 22)) return tn_err(TERN_ERR_INVALID_ARG, "context size %d outside 1..4194304", p.n_ctx);
    if (p.n_batch < 1 || p.n_batch > 65536) return tn_err(TERN_ERR_INVALID_ARG, "batch size %d outside 1..65536", p.n_batch);
    if (p.n_batch > p.n_ctx) p.n_batch = p.n_ctx;
    if (p.n_threads < 1 || p.n_threads > 1024) return tn_err(TERN_ERR_INVALID_ARG, "thread count %d outside 1..1024", p.n_threads);

    const int64_t d = hp->n_embd, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim, nb = p.n_batch, T = p.n_ctx;
    const int64_t qd = tn_hp_q_dim(hp); /* query and attention-output rows */
    /* KV cache types: f16 (0: the default), q8_0 or q4_0, whose 32-value blocks must not cross a head */
    const int32_t types[2] = {p.type_k ? p.type_k : TERN_KV_F16, p.type_v ? p.type_v : TERN_KV_F16};
    if (p.kv_rotate < TERN_KV_ROT_AUTO || p.kv_rotate > TERN_KV_ROT_KV)
        return tn_err(TERN_ERR_INVALID_ARG, "KV rotation %d is not one of TERN_KV_ROT_AUTO, _NONE, _K, _V, _KV", p.kv_rotate);
    /* multi-head latent attention: a K row is the latent and the shared rope key of a position,
     * no V rows (the values are the latent part of the K rows) */
    const bool mla = hp->family && hp->family->mla;
    const int64_t row_dim[2] = {mla ? tn_hp_mla_kv(hp) : kv_dim, mla ? 0 : kv_dim};
    if (mla && types[1] != types[0])
        return tn_err(TERN_ERR_INVALID_ARG, "V cache type %s differs from K's %s: %s caches one latent row per position "
                      "(the values are its first kv_lora_rank values), so both must be the same",
                      tern_kv_type_name(types[1]) ? tern_kv_type_name(types[1]) : "?",
                      tern_kv_type_name(types[0]) ? tern_kv_type_name(types[0]) : "?", hp->family->name);
    size_t rb[2];
    for (int i = 0; i < 2; i++) {
        const char *kv = i ? "V" : "K", *tname = tern_kv_type_name(types[i]);
        if (!tname)
            return tn_err(TERN_ERR_INVALID_ARG, "KV cache type of %s: %d is not f16, q8_0, q4_0, tq2 .. tq8 or (K) tqc2 .. tqc4", kv, types[i]);
        const tn_dtype_traits *tr = tn_dtype_get((uint32_t)types[i]);
        const int64_t unit = mla ? (int64_t)hp->n_lora_kv : hp->head_dim; /* what a block must not cross */
        if (unit % tr->blck_size || row_dim[i] % tr->blck_size)
            return tn_err(TERN_ERR_INVALID_ARG, "%s cache type %s needs a head size that is a multiple of %lld; this model's is %lld",
                          kv, tname, (long long)tr->blck_size, (long long)(mla ? row_dim[0] : hp->head_dim));
        rb[i] = (size_t)(row_dim[i] / tr->blck_size) * tr->type_size;
    }
    /* per-channel K: groups of one block of positions, the open group in an f16 window */
    const int32_t kc_bits = tn_kc_bits(types[0]);
    if (tn_kc_bits(types[1]))
        return tn_err(TERN_ERR_INVALID_ARG, "V cache type %s: per-channel quantization is for K only (use tq%d for V)",
                      tern_kv_type_name(types[1]), tn_kc_bits(types[1]));
    if (kc_bits) {
        const char *why = NULL;
        bool sinks = false;
        for (int32_t il = 0; il < hp->n_layer; il++) sinks |= m->layers[il].w[TN_ROLE_ATTN_SINKS].data != NULL;
        if (mla) why = "a latent (MLA) cache";
        else if (hp->n_swa > 0) why = "sliding-window layers";
        else if (sinks) why = "attention sinks";
        else if (hp->head_dim > TN_KC_MAX_HD) why = "heads over 512 values";
        if (why)
            return tn_err(TERN_ERR_UNSUPPORTED, "K cache type %s is not supported with %s (this model: %s)", tern_kv_type_name(types[0]),
                          why, hp->family ? hp->family->name : "?");
    }
    /* KV cache: kv_rows per global layer; a sliding-window layer keeps a ring of its window plus
     * one batch (a batch writes all its rows before attending) unless swa_full (on the GPU too: its
     * layers keep the same ring). Size check before allocating: rows * (K row bytes + V row bytes) */
    const int64_t kv_blocks = (T + TN_KV_BLOCK - 1) / TN_KV_BLOCK, kv_rows = kv_blocks * TN_KV_BLOCK;
    int64_t kv_ring = 0, kv_layer_rows = 0;
    if (hp->n_swa > 0 && !p.swa_full && swa_blocks <= 0)
        kv_ring = TN_PAD((int64_t)hp->n_swa + nb, TN_KV_BLOCK);
    if (hp->n_swa <= 0 || swa_blocks >= kv_blocks) swa_blocks = 0;
    if (swa_blocks > 0) kv_ring = (int64_t)swa_blocks * TN_KV_BLOCK; /* the local layers' rows (paged) */
    if (kv_ring >= kv_rows) kv_ring = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) kv_layer_rows += kv_ring && tn_hp_layer_swa(hp, il) ? kv_ring : kv_rows;
    uint64_t kv_bytes;
    if (!tn_mul_ok((uint64_t)kv_layer_rows, (uint64_t)(rb[0] + rb[1]), &kv_bytes) || kv_bytes > ((uint64_t)1 << 40))
        return tn_err(TERN_ERR_NOMEM, "KV cache for n_ctx %d would need more than 1 TiB", p.n_ctx);

    tern_ctx *c = tn_calloc(1, sizeof *c);
    if (!c) return tn_err(TERN_ERR_NOMEM, "context: out of memory");
    c->model = m;
    c->hp = *hp;
    c->n_ctx = p.n_ctx;
    c->n_batch = p.n_batch;
    c->n_threads = p.n_threads;
    c->logits_all = p.logits_all;
    c->kt = tn_kern();
    c->rope_ff = tn_model_rope_factors(m, c->n_ctx); /* LongRoPE: long or short by this context's size */
    c->kv_blocks = (int32_t)kv_blocks;
    c->kv_rows = kv_rows;
    c->kv_ring = swa_blocks > 0 ? 0 : kv_ring;
    c->kv_swa_blocks = swa_blocks > 0 ? swa_blocks : 0;
    c->kv_bytes = kv_bytes;
    c->type_k = types[0], c->type_v = types[1];
    c->k_rb = rb[0], c->v_rb = rb[1];
    bool ok = true;
    { /* rotation: the quantized halves asked for (auto: K); never f16 or a latent cache */
        const int32_t r = p.kv_rotate;
        const bool want_k = r == TERN_KV_ROT_AUTO || r == TERN_KV_ROT_K || r == TERN_KV_ROT_KV;
        const bool want_v = r == TERN_KV_ROT_V || r == TERN_KV_ROT_KV;
        /* per-channel K: its groups are per channel, which a rotation would mix; only when asked */
        c->rot_k = !mla && want_k && types[0] != TERN_KV_F16 && !(kc_bits && r == TERN_KV_ROT_AUTO);
        c->rot_v = !mla && want_v && types[1] != TERN_KV_F16;
    }
    if (c->rot_k || c->rot_v) {
        c->rot_sign = tn_ctx_alloc(c, (size_t)hp->head_dim * sizeof(float), &ok);
        c->rot_blk = hp->head_dim & -hp->head_dim;
        uint64_t z = 0x7465726e2d726f74ULL; /* "tern-rot": fixed, so a saved cache reads back */
        for (int32_t i = 0; ok && i < hp->head_dim; i++) {
            z += 0x9e3779b97f4a7c15ULL;
            uint64_t y = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
            y = (y ^ (y >> 27)) * 0x94d049bb133111ebULL;
            c->rot_sign[i] = (y ^ (y >> 31)) >> 63 ? -1.0f : 1.0f;
        }
    }
    /* on the GPU (tn_cuda_ctx_create) layers 0 .. ngl - 1 keep their cache in device memory: the
     * host holds rows only for the layers the CPU runs (kv_bytes stays the whole cache's size) */
    const int32_t gpu_layers = p.device != TERN_DEVICE_CUDA ? 0
                               : p.n_gpu_layers < 0 || p.n_gpu_layers > hp->n_layer ? hp->n_layer
                                                                                      : p.n_gpu_layers;
    int64_t host_rows = 0;
    c->kv_off = tn_ctx_alloc(c, (size_t)hp->n_layer * sizeof(int64_t), &ok);
    for (int64_t il = 0; ok && il < hp->n_layer; il++) {
        c->kv_off[il] = host_rows;
        if (il >= gpu_layers) host_rows += kv_ring && tn_hp_layer_swa(hp, (int32_t)il) ? kv_ring : kv_rows;
    }
    c->k_cache = tn_ctx_alloc(c, (size_t)host_rows * rb[0], &ok);
    c->v_cache = tn_ctx_alloc(c, (size_t)host_rows * rb[1], &ok);
    if (ok) { /* zeroed so attention over the cache never reads uninitialised rows */
        memset(c->k_cache, 0, (size_t)host_rows * rb[0]);
        memset(c->v_cache, 0, (size_t)host_rows * rb[1]);
    }
    if (kc_bits) { /* the window holds the open group before a batch and the batch (+ a group for truncation) */
        c->kc_bits = kc_bits;
        c->kc_w = TN_PAD(nb, TN_KV_BLOCK) + 2 * TN_KV_BLOCK;
        c->kc_nseq = n_seq > 1 ? n_seq : 1;
        c->kc_win = tn_ctx_alloc(c, (size_t)c->kc_nseq * (size_t)hp->n_layer * (size_t)(c->kc_w * kv_dim) * 2, &ok);
        c->kc_x = tn_ctx_alloc(c, (size_t)p.n_threads * (size_t)(TN_KV_BLOCK * kv_dim) * sizeof(float), &ok);
    }
    c->x = tn_ctx_alloc(c, (size_t)(nb * d) * sizeof(float), &ok);
    c->xb = tn_ctx_alloc(c, (size_t)(nb * d) * sizeof(float), &ok);
    c->q = tn_ctx_alloc(c, (size_t)(nb * qd) * sizeof(float), &ok);
    c->kv = tn_ctx_alloc(c, (size_t)(nb * TN_MAX(2 * kv_dim, row_dim[0])) * sizeof(float), &ok); /* MLA: [c | k_pe] rows */
    c->att = tn_ctx_alloc(c, (size_t)(nb * TN_MAX(qd, tn_dim_value(hp, TN_DIM_O))) * sizeof(float), &ok);
    if (mla) { /* absorbed queries and latent attention outputs, every head; q's low-rank rows */
        const int64_t hq = (int64_t)hp->n_head * row_dim[0];
        c->mla_q = tn_ctx_alloc(c, (size_t)(nb * hq) * sizeof(float), &ok);
        c->mla_o = tn_ctx_alloc(c, (size_t)(nb * hq) * sizeof(float), &ok);
        c->mla_a = tn_ctx_alloc(c, (size_t)(nb * TN_MAX((int64_t)hp->n_lora_q, row_dim[0])) * sizeof(float), &ok);
    }
    /* MoE: every token's n_expert_used routed rows, each n_ff_exp wide */
    const int64_t ne = hp->n_expert > 0 ? nb * hp->n_expert_used : 0, hbw = TN_MAX(nb * TN_MAX(hp->n_ff, hp->n_ff_shexp), ne * hp->n_ff_exp);
    c->hb = tn_ctx_alloc(c, (size_t)hbw * sizeof(float), &ok);
    c->hb2 = tn_ctx_alloc(c, (size_t)hbw * sizeof(float), &ok);
    if (ne) {
        c->moe_logits = tn_ctx_alloc(c, (size_t)(nb * hp->n_expert) * sizeof(float), &ok);
        c->moe_sel = tn_ctx_alloc(c, (size_t)ne * sizeof(int32_t), &ok);
        c->moe_w = tn_ctx_alloc(c, (size_t)ne * sizeof(float), &ok);
        c->moe_off = tn_ctx_alloc(c, (size_t)(hp->n_expert + 1) * sizeof(int32_t), &ok);
        c->moe_tok = tn_ctx_alloc(c, (size_t)ne * sizeof(int32_t), &ok);
        c->moe_row = tn_ctx_alloc(c, (size_t)ne * sizeof(int32_t), &ok);
        c->moe_x = tn_ctx_alloc(c, (size_t)(ne * d) * sizeof(float), &ok);
        const size_t nl = (size_t)hp->n_layer;
        c->moe_count = tn_ctx_alloc(c, nl * (size_t)hp->n_expert * sizeof(uint64_t), &ok);
        c->moe_touched = tn_ctx_alloc(c, nl * sizeof(uint64_t), &ok);
        c->moe_passes = tn_ctx_alloc(c, nl * sizeof(uint64_t), &ok);
        c->moe_tokens = tn_ctx_alloc(c, nl * sizeof(uint64_t), &ok);
        if (ok) tn_ctx_moe_usage_reset(c);
    }
    c->tmp = tn_ctx_alloc(c, (size_t)(nb * d) * sizeof(float), &ok);
    c->rope_cs = tn_ctx_alloc(c, (size_t)(nb * hp->n_rot) * sizeof(float), &ok);
    if (hp->n_swa > 0) { /* sliding-window layers: their rope table, the window of a paged cache */
        c->rope_cs_swa = tn_ctx_alloc(c, (size_t)(nb * hp->n_rot) * sizeof(float), &ok);
        c->swa_kv = tn_ctx_alloc(c, (size_t)p.n_threads * (size_t)TN_MIN(hp->n_swa, T) * (rb[0] + rb[1]), &ok);
    }
    /* widest activation row set over every matrix the model multiplies (its row length ne[0]);
     * xq1: the per-thread copies of one token's normed and quantized activations (forward.c) */
    size_t xq = tn_matmul_xq_size(m->output.type, d, nb), xq1 = tn_matmul_xq_size(m->output.type, d, 1);
    for (int32_t il = 0; il < hp->n_layer; il++)
        for (int r = 0; r < TN_ROLE_N_LAYER; r++) {
            const tn_tensor *w = &m->layers[il].w[r];
            if (!tn_roles[r].matrix || !w->data) continue;
            const int64_t rows = tn_roles[r].ne2 == TN_DIM_EXPERT ? TN_MAX(ne, nb) : tn_roles[r].ne2 == TN_DIM_HEADS ? nb * hp->n_head : nb;
            xq = TN_MAX(xq, tn_matmul_xq_size(w->type, w->ne[0], rows)); /* per-head matrices: every head's rows at once */
            xq1 = TN_MAX(xq1, tn_matmul_xq_size(w->type, w->ne[0], 1));
        }
    c->xq = tn_ctx_alloc(c, xq, &ok);
    c->pxq_stride = (xq1 + 63) & ~(size_t)63;
    c->mm_next = tn_ctx_alloc(c, (size_t)(TN_MM_PER_LAYER * hp->n_layer + 1) * sizeof(atomic_int), &ok);
    if (p.n_threads > 1) {
        c->pxb = tn_ctx_alloc(c, (size_t)(p.n_threads - 1) * (size_t)d * sizeof(float), &ok);
        c->pxq = tn_ctx_alloc(c, (size_t)(p.n_threads - 1) * c->pxq_stride, &ok);
    }
    c->scores_stride = TN_PAD(2 * TN_MAX((int64_t)hp->head_dim, row_dim[0]) * hp->n_head, 16); /* up to every head per call */
    c->scores = tn_ctx_alloc(c, (size_t)p.n_threads * (size_t)c->scores_stride * sizeof(float), &ok);
    /* logits rows: every token with logits_all; else up to 64 (one per sequence of a batch) */
    c->n_logits_cap = p.logits_all ? (int32_t)nb : (int32_t)TN_MIN(nb, 64);
    c->b_seq = tn_ctx_alloc(c, (size_t)nb * sizeof(int32_t), &ok);
    c->b_pos = tn_ctx_alloc(c, (size_t)nb * sizeof(int32_t), &ok);
    c->out_rows = tn_ctx_alloc(c, (size_t)nb * sizeof(int32_t), &ok);
    c->b_logits = tn_ctx_alloc(c, (size_t)nb, &ok);
    c->logits = tn_ctx_alloc(c, (size_t)c->n_logits_cap * (size_t)hp->n_vocab * sizeof(float), &ok);
    if (!ok) {
        uint64_t need = c->bytes;
        tern_ctx_free(c);
        return tn_err(TERN_ERR_NOMEM, "context: out of memory (n_ctx %d, n_batch %d; %.1f MiB allocated before failing)",
                      p.n_ctx, p.n_batch, (double)need / 1048576.0);
    }
    tern_status s = tn_pool_create(p.n_threads, &c->pool);
    if (s) {
        tern_ctx_free(c);
        return s;
    }
    if (p.device == TERN_DEVICE_CUDA) {
        s = tn_cuda_ctx_create(c, gpu_layers, &c->cuda); /* the layers whose rows the host left out */
        if (s) {
            tern_ctx_free(c);
            return s;
        }
    } else if (p.device != TERN_DEVICE_CPU) {
        tern_ctx_free(c);
        return tn_err(TERN_ERR_INVALID_ARG, "tern_ctx_create: unknown device %d", p.device);
    }
    *out = c;
    return TERN_OK;
}

tern_status tern_ctx_create(const tern_model *m, const tern_ctx_params *p, tern_ctx **out) {
    return tn_ctx_create_impl(m, p, 0, 1, out);
}

tern_status tn_ctx_create_paged_seqs(const tern_model *m, const tern_ctx_params *pp, int32_t swa_blocks, int32_t n_seq,
                                     tern_ctx **out) {
    tern_ctx_params p;
    tern_ctx_params_init(&p);
    if (pp) memcpy(&p, pp, TN_MIN(sizeof p, pp->struct_size ? pp->struct_size : sizeof p));
    p.swa_full = true; /* without a pool of their own, sliding-window layers keep every position */
    return tn_ctx_create_impl(m, &p, swa_blocks, n_seq, out);
}
tern_status tn_ctx_create_paged(const tern_model *m, const tern_ctx_params *pp, int32_t swa_blocks, tern_ctx **out) {
    return tn_ctx_create_paged_seqs(m, pp, swa_blocks, 1, out);
}

void tern_ctx_free(tern_ctx *c) {
    if (!c) return;
    tn_lora_ctx_clear(c);
    tn_cuda_ctx_free(c->cuda);
    tn_pool_free(c->pool);
    void *bufs[] = {c->kv_off, c->k_cache, c->v_cache, c->x, c->xb, c->q, c->kv, c->att, c->hb, c->hb2,
                    c->moe_logits, c->moe_sel, c->moe_w, c->moe_off, c->moe_tok, c->moe_row, c->moe_x, c->moe_count, c->moe_touched, c->moe_passes, c->moe_tokens, c->tmp, c->rope_cs, c->rope_cs_swa, c->swa_kv, c->xq, c->pxb, c->pxq, c->mm_next, c->scores, c->logits, c->b_seq, c->b_pos, c->out_rows,
                    c->b_logits, c->mla_q, c->mla_o, c->mla_a, c->rot_sign, c->kc_win, c->kc_x};
    for (size_t i = 0; i < TN_ARRAY_LEN(bufs); i++) tn_free_aligned(bufs[i]);
    tn_free(c);
}

tern_status tern_ctx_share_threads(tern_ctx *c, tern_ctx *with) {
    if (!c || !with) return tn_err(TERN_ERR_INVALID_ARG, "tern_ctx_share_threads: NULL context");
    if (c == with || c->pool == with->pool) return TERN_OK;
    if (c->cuda || with->cuda) return tn_err(TERN_ERR_UNSUPPORTED, "tern_ctx_share_threads: CPU contexts only");
    /* the per-thread scratch buffers are sized for the context's own thread count */
    if (tn_pool_n(c->pool) != tn_pool_n(with->pool))
        return tn_err(TERN_ERR_INVALID_ARG, "tern_ctx_share_threads: %d threads and %d: the counts must be equal",
                      tn_pool_n(c->pool), tn_pool_n(with->pool));
    tn_pool_free(c->pool);
    c->pool = tn_pool_retain(with->pool);
    return TERN_OK;
}

int32_t tern_ctx_n_ctx(const tern_ctx *c) { return c->n_ctx; }
uint64_t tern_ctx_kv_bytes(const tern_ctx *c) { return c->kv_bytes; }
int32_t tern_ctx_type_k(const tern_ctx *c) { return c->type_k; }
int32_t tern_ctx_type_v(const tern_ctx *c) { return c->type_v; }
int32_t tern_ctx_kv_rotated(const tern_ctx *c) { return (c->rot_k ? 1 : 0) | (c->rot_v ? 2 : 0); }
int32_t tern_kv_rotate_from_name(const char *name) {
    static const char *const names[] = {"auto", "none", "k", "v", "kv"};
    for (int32_t i = 0; name && i < 5; i++)
        if (!strcasecmp(name, names[i])) return i;
    return -1;
}

const char *tern_kv_type_name(int32_t type) {
    static const char *const tq[] = {"tq2", "tq3", "tq4", "tq5", "tq6", "tq7", "tq8"}, *const tqc[] = {"tqc2", "tqc3", "tqc4"};
    for (int b = 2; b <= 8; b++)
        if (type == TERN_KV_TQ(b)) return tq[b - 2];
    for (int b = 2; b <= 4; b++)
        if (type == TERN_KV_TQC(b)) return tqc[b - 2];
    return type == TERN_KV_F16 ? "f16" : type == TERN_KV_Q8_0 ? "q8_0" : type == TERN_KV_Q4_0 ? "q4_0" : NULL;
}
int32_t tern_kv_type_from_name(const char *name) {
    static const int32_t types[] = {TERN_KV_F16, TERN_KV_Q8_0, TERN_KV_Q4_0, TERN_KV_TQ(2), TERN_KV_TQ(3), TERN_KV_TQ(4),
                                    TERN_KV_TQ(5), TERN_KV_TQ(6), TERN_KV_TQ(7), TERN_KV_TQ(8),
                                    TERN_KV_TQC(2), TERN_KV_TQC(3), TERN_KV_TQC(4)};
    for (size_t i = 0; name && i < sizeof types / sizeof *types; i++)
        if (!strcasecmp(name, tern_kv_type_name(types[i]))) return types[i];
    return -1;
}
int32_t tern_ctx_n_past(const tern_ctx *c) { return c->n_past; }

tern_status tern_ctx_truncate(tern_ctx *c, int32_t n_past) {
    if (!c || n_past < 0 || n_past > c->n_past)
        return tn_err(TERN_ERR_INVALID_ARG, "truncate to %d: context holds %d tokens", n_past, c ? c->n_past : 0);
    /* a ring keeps positions n_past - kv_ring .. n_past - 1; the next token at n_past' needs the
     * window n_past' - n_swa + 1 .. n_past' - 1 of it */
    if (c->kv_ring && n_past > 0 && (int64_t)c->n_past - n_past > c->kv_ring - c->hp.n_swa + 1) n_past = 0;
    /* per-channel K: the new open group's keys must still be in the f16 window (positions
     * n_past - kc_w .. n_past - 1); else back to the group's start, below which every group is
     * complete (its quantized rows are what the longer context read too) */
    if (c->kc_bits && n_past % TN_KV_BLOCK && n_past - n_past % TN_KV_BLOCK < (int64_t)c->n_past - c->kc_w)
        n_past -= n_past % TN_KV_BLOCK;
    c->n_past = n_past;
    c->n_logits = 0;
    return TERN_OK;
}

tern_status tern_decode(tern_ctx *c, const tern_token *toks, int32_t n) {
    if (!c || (!toks && n) || n < 0) return tn_err(TERN_ERR_INVALID_ARG, "tern_decode: invalid arguments");
    if (n == 0) return TERN_OK;
    if ((int64_t)c->n_past + n > c->n_ctx)
        return tn_err(TERN_ERR_FULL, "context full: %d tokens in cache + %d new > n_ctx %d", c->n_past, n, c->n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= c->hp.n_vocab)
            return tn_err(TERN_ERR_INVALID_ARG, "tern_decode: token %d at index %d outside vocabulary 0..%d", toks[i], i,
                          c->hp.n_vocab - 1);
    const char *phase = n == 1 ? "decode" : "prefill"; /* trace: the phase span, tokens/s as a counter */
    const uint64_t t0 = TN_TRACE_ON() ? tn_trace_ns() : 0;
    TN_SPAN_B(TN_TK_PHASE, phase, -1, n, 0, 0, 0);
    for (int32_t i = 0; i < n; i += c->n_batch) {
        tn_forward(c, toks + i, TN_MIN(c->n_batch, n - i));
        if (c->dev_status) {
            tern_status s = c->dev_status;
            c->dev_status = TERN_OK;
            c->n_past -= TN_MIN(c->n_batch, n - i);
            TN_SPAN_E(TN_TK_PHASE, phase, -1, 0, 0);
            return s;
        }
    }
    TN_SPAN_E(TN_TK_PHASE, phase, -1, 0, 0);
    if (t0) TN_TRACE_COUNTER(n == 1 ? "decode_tokens_per_s" : "prefill_tokens_per_s", n * 1e9 / (double)(tn_trace_ns() - t0 + 1));
    return TERN_OK;
}

const float *tern_get_logits(const tern_ctx *c, int32_t i) {
    if (!c || c->n_logits == 0) return NULL;
    if (i < 0) i = c->n_logits - 1;
    if (!c->logits_all) return c->logits; /* only the last token's logits are kept */
    if (i >= c->n_logits) return NULL;
    return c->logits + (size_t)i * c->hp.n_vocab;
}
