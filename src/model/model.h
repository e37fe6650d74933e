/*
 * model.h — a model as tern holds it: hyperparameters, weight views into the GGUF mapping (per
 * layer, indexed by tensor role), and the vocabulary. Shared by inference (forward.c), training
 * and serving. The families and their tensors are described in model/arch/ (arch.h).
 *
 * Weight tensors follow GGUF/ggml orientation: a matrix of ne = [k, m] holds m rows of k elements;
 * y = W x multiplies each row with x. Weights are never copied: views point into the file.
 */
#ifndef TN_MODEL_MODEL_H
#define TN_MODEL_MODEL_H

#include <pthread.h>
#include <stdatomic.h>

#include "fmt/gguf.h"
#include "model/arch/arch.h"
#include "model/tokenizer.h"
#include "tensor/dtype.h"

typedef struct tn_hparams {
    tn_arch arch;
    const tn_arch_desc *family; /* the registry entry of the family (static)          */
    int32_t n_vocab;
    int32_t n_ctx_train;  /* context_length                                        */
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t n_ff;
    int32_t head_dim;     /* attention.key_length (default n_embd / n_head); query
                           * rows are n_head * head_dim long (tn_hp_q_dim)            */
    int32_t n_rot;        /* rope.dimension_count (default head_dim)               */
    float rms_eps;
    float rope_freq_base;
    float rope_freq_scale;/* 1 / rope.scaling.factor for linear scaling           */
    tn_rope_mode rope_mode;
    int32_t nope_step;    /* > 0: layer il skips RoPE when (il + 1) % nope_step == 0 (smollm3) */
    tn_ffn_kind ffn;      /* the family's gated activation                               */
    float embd_scale;     /* > 0: token embeddings times this (gemma: sqrt(n_embd))      */
    float attn_scale;     /* scores = attn_scale * q.k (1 / sqrt(head_dim) by default)   */
    int32_t n_swa;        /* > 0: local layers attend to their last n_swa positions      */
    int32_t swa_period;   /* layer il is local when il % swa_period < swa_period - 1     */
    float rope_base_swa;  /* local layers' rope.freq_base                                */
    float rope_scale_swa; /* local layers' frequency scale (gemma3: 1; gemma2: the file's) */
    float logit_softcap;  /* > 0: logits = cap * tanh(logits / cap)                      */
    float attn_softcap;   /* > 0: attention scores = cap * tanh(scores / cap) (gemma2)   */
    int32_t n_ctx_orig;   /* rope.scaling.original_context_length (default n_ctx_train):
                           * LongRoPE uses the long factors in a context longer than it   */
    float rope_attn_factor; /* rope.scaling.attn_factor: rotated dims of q and k scaled by it
                             * (ggml's rope mscale; 1 by default)                            */
    float yarn_ext_factor;/* > 0: YaRN (rope.scaling.type yarn): the extrapolation mix    */
    float yarn_beta_fast, yarn_beta_slow; /* YaRN's correction range (32, 1)              */
    int32_t n_expert;     /* expert_count: > 0 in a mixture-of-experts model (0: dense)    */
    int32_t n_expert_used;/* expert_used_count: experts each token is routed to (top-k)   */
    int32_t n_ff_exp;     /* an expert's hidden rows (qwen3moe: expert_feed_forward_length;
                           * else n_ff)                                                  */
    int32_t n_ff_shexp;   /* the shared expert's hidden rows (qwen2moe:
                           * expert_shared_feed_forward_length, else n_ff)               */
    /* multi-head latent attention (deepseek2; 0 elsewhere): head_dim is the q/k head (nope +
     * n_rot), v_head the value head; a token caches kv_lora_rank + n_rot values per layer */
    int32_t n_lora_q;     /* attention.q_lora_rank (0: q projected directly)             */
    int32_t n_lora_kv;    /* attention.kv_lora_rank                                      */
    int32_t v_head;       /* attention.value_length_mla (or value_length in older files) */
    bool mla_kv_b;        /* an older file: one attn_kv_b instead of attn_k_b / attn_v_b  */
    int32_t n_layer_dense_lead; /* leading_dense_block_count: layers before the MoE ones  */
    /* DeepSeek routing: sigmoid instead of softmax probabilities; the top-k weights divided by
     * their sum (expert_weights_norm), times expert_weights_scale (0: 1); expert_group_count groups
     * of which the expert_group_used_count best (by their two best scores) are eligible */
    bool moe_sigmoid, moe_norm;
    float moe_scale;
    int32_t n_expert_groups, n_group_used;
} tn_hparams;

/* A weight view: type, shape (ne[0] = row length) and bytes in the mapped file. */
typedef struct tn_tensor {
    tn_dtype type;
    int64_t ne[4];
    const void *data;
    size_t nbytes;
    const char *name;
    _Atomic(const void *) *hot; /* experts' matrices with hot experts (tier.c): [n_expert], an entry
                                 * is a copy of that expert in fast memory or NULL; else NULL */
} tn_tensor;

/* The weights of one layer by role (arch.h); w[r].data == NULL when the layer has no such
 * tensor (the family lacks the role, or an optional one is absent). */
typedef struct tn_layer {
    tn_tensor w[TN_ROLE_N_LAYER];
} tn_layer;

/* Whether layer L routes its feed-forward through experts (it has a router). */
static inline bool tn_layer_moe(const tn_layer *L) { return L->w[TN_ROLE_FFN_GATE_INP].data != NULL; }
/* Whether layer L has a shared expert beside its routed ones. */
static inline bool tn_layer_shexp(const tn_layer *L) { return L->w[TN_ROLE_FFN_UP_SHEXP].data != NULL; }

/* Expert e of a 3-D expert matrix t as a 2-D matrix (a view of the same bytes). */
static inline tn_tensor tn_expert_view(const tn_tensor *t, int64_t e) {
    const size_t bytes = t->nbytes / (size_t)(t->ne[2] > 0 ? t->ne[2] : 1);
    tn_tensor v = *t;
    v.ne[2] = 1;
    const void *hot = t->hot ? atomic_load_explicit(&t->hot[e], memory_order_acquire) : NULL;
    v.data = hot ? hot : (const uint8_t *)t->data + (size_t)e * bytes;
    v.nbytes = bytes;
    v.hot = NULL;
    return v;
}

/* Whether layer il rotates q and k. */
static inline bool tn_hp_layer_rope(const tn_hparams *hp, int32_t il) {
    return hp->nope_step <= 0 || (il + 1) % hp->nope_step != 0;
}

/* Whether layer il is a sliding-window (local) layer. */
static inline bool tn_hp_layer_swa(const tn_hparams *hp, int32_t il) {
    return hp->n_swa > 0 && il % hp->swa_period < hp->swa_period - 1;
}

/* Values per position in an MLA layer's cache: the normed latent, then the roped shared key. */
static inline int64_t tn_hp_mla_kv(const tn_hparams *hp) { return (int64_t)hp->n_lora_kv + hp->n_rot; }

/* Width of the query and attention-output rows: n_head * head_dim (n_embd in most families). */
static inline int64_t tn_hp_q_dim(const tn_hparams *hp) { return (int64_t)hp->n_head * hp->head_dim; }

struct tern_model {
    tn_hparams hp;
    tn_gguf *gguf;
    tn_vocab *vocab;
    tn_tensor tok_embd, output_norm, output; /* output == tok_embd when tied */
    tn_tensor rope_freqs;                    /* Llama 3.1 frequency factors, optional */
    tn_tensor rope_long, rope_short;         /* LongRoPE factors (phi3), optional; a context
                                              * picks one set (tn_model_rope_factors)   */
    tn_layer *layers;
    uint64_t n_params;
    uint64_t n_params_active; /* read per token: n_params less the experts a token is not routed to */
    uint64_t weight_bytes;
    uint64_t repack_grown; /* bytes the load-time layouts added to weight_bytes' matrices (iq2 *_p3) */
    char desc[128];
    char *path;
    float *mla_split; /* an older deepseek2 file: attn_kv_b split into per-head f32 attn_k_b / attn_v_b
                       * (tn_mla_split_kv_b), which the layers' views point into; else NULL */
    void *repacked; /* the matrices moved out of the file mapping at load (tn_model_repack: interleaved
                     * layouts, other types as they are; 2 MiB pages), or NULL */
    struct tn_tier *tier; /* hot experts (tern_model_params.hot_experts), or NULL */
};

/* Hot experts (FreqTier, tier.c): up to cap bytes of the most used experts copied into 2 MiB
 * pages; the expert matrices' views (tn_tensor.hot) point at the copies. Only grows. */
typedef struct tn_tier {
    pthread_mutex_t mu;
    uint8_t *buf;              /* cap bytes of 2 MiB pages, allocated at the first promotion */
    size_t cap, used;
    int64_t n_hot;
    bool full;                 /* no candidate fits any more (or the buffer could not be had) */
    uint8_t *hot;              /* [n_layer][n_expert]: 1 once copied */
    _Atomic(const void *) *ptr; /* [n_layer][TN_ROLE_N_LAYER][n_expert]: the views' hot tables */
} tn_tier;

/* Sets up the tables for a budget of bytes (0, or a dense model: none). */
tern_status tn_tier_init(tern_model *m, uint64_t budget);
void tn_tier_free(tn_tier *t);
/* Copies the most used experts not yet hot (counts [n_layer][n_expert]: rows routed to each;
 * only experts with at least their layer's mean share) into the buffer while they fit. */
tern_status tn_tier_promote(const tern_model *m, const uint64_t *counts);

/* Loads and validates hyperparameters and every tensor's presence, type and shape; errors name
 * the key or tensor (robustness.md G25..G28). */
tern_status tn_model_load_gguf(tn_gguf *g, tern_model **out);

/* Key "<arch>.<suffix>" as an integer in lo..hi into *out (absent and not required: *out keeps its
 * default); out of range or of the wrong type: TERN_ERR_FORMAT naming the key and the value. */
tern_status tn_model_key_dim(const tn_gguf *g, const char *arch, const char *suffix, bool required, int64_t lo, int64_t hi,
                             int32_t *out);
/* Optional key "<arch>.<suffix>" as a finite float into *out (absent: *out keeps its default). */
tern_status tn_model_key_float(const tn_gguf *g, const char *arch, const char *suffix, float *out);

/* Moves q4_0, q8_0 and symmetric tq4 weight matrices into the *_r16 layouts and tq1 matrices into
 * the *_l32 layouts (quant/repack.h; rows a multiple of the layout's group; not a tied output)
 * where the kernel table has a SIMD kernel for them; from a mapped file, every other matrix (not a
 * tied output) is copied as it is, so that all of them sit in one buffer of 2 MiB pages
 * (TERN_HUGEPAGES=0: 4 KiB). The file pages of moved tensors are released from the mapping.
 * Expert matrices move too when hot_experts is 0 and either the file was read into memory or the
 * moved bytes are at most half of MemAvailable (TERN_REPACK_EXPERTS=0/1 forces it either way). */
tern_status tn_model_repack(tern_model *m, uint64_t hot_experts);

/* The RoPE frequency factors (n_rot / 2 floats, or NULL) a context of n_ctx positions uses:
 * rope_freqs, else LongRoPE's long set when n_ctx > n_ctx_orig and its short set otherwise
 * (llama.cpp's llama_model::get_rope_factors). */
const float *tn_model_rope_factors(const tern_model *m, int32_t n_ctx);

/* Row `row` of a weight matrix as floats (k = ne[0]); used for embedding lookup. */
void tn_tensor_get_row(const tn_tensor *t, int64_t row, float *out);

#endif
