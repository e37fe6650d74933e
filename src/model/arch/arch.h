/*
 * arch.h — the architecture registry: one table of tensor roles (llama.cpp's tensor names and
 * their shapes as functions of the hyperparameters) and one descriptor per model family
 * (src/model/arch/<family>.c: its GGUF architecture name, which roles it has, its block recipe and
 * its own hyperparameter keys). The loader, tern info, tern synth, the repacker, the context
 * planner, the trainer and the test reference all read it; nothing here computes.
 *
 * Adding a family: a new <family>.c defining a tn_arch_desc, one line in arch.c's list, tests.
 * Shapes follow GGUF/ggml orientation: ne0 is the row length (a matrix [k, m] has m rows of k).
 */
#ifndef TN_MODEL_ARCH_ARCH_H
#define TN_MODEL_ARCH_ARCH_H

#include "fmt/gguf.h"

struct tn_hparams;

typedef enum tn_arch {
    TN_ARCH_LLAMA = 0,
    TN_ARCH_QWEN2,
    TN_ARCH_QWEN3,
    TN_ARCH_SMOLLM3,
    TN_ARCH_GEMMA3,
    TN_ARCH_GEMMA2,
    TN_ARCH_PHI3,
    TN_ARCH_QWEN3MOE,
    TN_ARCH_OLMOE,
    TN_ARCH_QWEN2MOE,
    TN_ARCH_GPT_OSS,
    TN_ARCH_DEEPSEEK2,
    TN_ARCH_PLM,
} tn_arch;
typedef enum tn_rope_mode { TN_ROPE_NORM = 0, TN_ROPE_NEOX } tn_rope_mode;
/* silu(gate) * up, gelu_tanh(gate) * up; gpt-oss's clamped SwiGLU: g = min(gate, 7),
 * u = clamp(up, -7, 7), g * sigmoid(1.702 g) * (u + 1) (ggml_swiglu_oai); not gated (PLM):
 * relu(up)^2, no ffn_gate (llama.cpp's LLM_FFN_RELU_SQR with LLM_FFN_SEQ) */
typedef enum tn_ffn_kind { TN_FFN_SWIGLU = 0, TN_FFN_GEGLU, TN_FFN_SWIGLU_OAI, TN_FFN_RELU_SQR } tn_ffn_kind;
/* How a router's logits become the experts and their weights: softmax over all experts, then the
 * top k (weights: their probabilities); or (gpt-oss) the top k logits, then a softmax over them. */
typedef enum tn_moe_gating { TN_MOE_SOFTMAX = 0, TN_MOE_SOFTMAX_WEIGHT } tn_moe_gating;

/* Tensor roles. Per-layer roles come first ("blk.%d." + name); the model-wide ones after. */
typedef enum tn_role {
    TN_ROLE_ATTN_NORM = 0,
    TN_ROLE_ATTN_Q,
    TN_ROLE_ATTN_K,
    TN_ROLE_ATTN_V,
    TN_ROLE_ATTN_QKV, /* q|k|v rows in one matrix (phi3); the loader binds ATTN_Q/K/V to its row
                       * slices and leaves this role's view empty */
    TN_ROLE_ATTN_OUT,
    TN_ROLE_ATTN_Q_B,
    TN_ROLE_ATTN_K_B,
    TN_ROLE_ATTN_V_B,
    TN_ROLE_ATTN_Q_NORM,
    TN_ROLE_ATTN_K_NORM,
    TN_ROLE_ATTN_POST_NORM,
    TN_ROLE_FFN_NORM,
    TN_ROLE_FFN_GATE,
    TN_ROLE_FFN_UP,
    TN_ROLE_FFN_DOWN,
    TN_ROLE_FFN_POST_NORM,
    /* Mixture of experts: the router and the experts' matrices, 3-D ([.., .., n_expert]: expert e
     * is the 2-D slice at data + e * ne1 * row_size(ne0)); a layer has these or FFN_GATE/UP/DOWN */
    TN_ROLE_FFN_GATE_INP,
    TN_ROLE_FFN_GATE_EXPS,
    TN_ROLE_FFN_UP_EXPS,
    TN_ROLE_FFN_DOWN_EXPS,
    /* A shared expert (qwen2moe): a dense SwiGLU every token runs beside its routed experts, its
     * output scaled by sigmoid(ffn_gate_inp_shexp . xb) where the layer has that gate vector */
    TN_ROLE_FFN_GATE_INP_SHEXP,
    TN_ROLE_FFN_GATE_SHEXP,
    TN_ROLE_FFN_UP_SHEXP,
    TN_ROLE_FFN_DOWN_SHEXP,
    /* gpt-oss: attention sinks (one logit per query head, in the softmax's denominator), the
     * attention output's bias, the router's and the experts' biases ([rows, n_expert]) */
    TN_ROLE_ATTN_SINKS,
    TN_ROLE_ATTN_OUT_B,
    TN_ROLE_FFN_GATE_INP_B,
    TN_ROLE_FFN_GATE_EXPS_B,
    TN_ROLE_FFN_UP_EXPS_B,
    TN_ROLE_FFN_DOWN_EXPS_B,
    /* Multi-head latent attention (deepseek2): q directly (ATTN_Q) or low-rank (attn_q_a, its
     * norm, attn_q_b); attn_kv_a_mqa to the latent (kv_lora_rank) and the shared rope key (n_rot),
     * the latent's norm; the up-projections per head, attn_k_b [nope, kv_lora_rank, n_head] and
     * attn_v_b [kv_lora_rank, v_head, n_head], or one attn_kv_b (older conversions); the router's
     * selection bias (exp_probs_b, DeepSeek-V3) */
    TN_ROLE_ATTN_Q_A,
    TN_ROLE_ATTN_Q_A_NORM,
    TN_ROLE_ATTN_Q_LB,
    TN_ROLE_ATTN_KV_A_MQA,
    TN_ROLE_ATTN_KV_A_NORM,
    TN_ROLE_ATTN_KV_B,
    TN_ROLE_ATTN_K_B_MLA,
    TN_ROLE_ATTN_V_B_MLA,
    TN_ROLE_FFN_EXP_PROBS_B,
    TN_ROLE_N_LAYER, /* number of per-layer roles */
    TN_ROLE_TOKEN_EMBD = TN_ROLE_N_LAYER,
    TN_ROLE_OUTPUT_NORM,
    TN_ROLE_OUTPUT,
    TN_ROLE_ROPE_FREQS,
    TN_ROLE_ROPE_FACTORS_LONG,  /* LongRoPE (phi3): frequency factors past the original context */
    TN_ROLE_ROPE_FACTORS_SHORT, /* ... and within it                                            */
    TN_ROLE_COUNT
} tn_role;

/* A dimension of a role's shape, resolved by tn_dim_value from the hyperparameters. */
typedef enum tn_dim {
    TN_DIM_1 = 0,    /* 1 (the ne1 of a vector)                        */
    TN_DIM_EMBD,     /* n_embd                                         */
    TN_DIM_Q,        /* n_head * head_dim: query and attention rows    */
    TN_DIM_KV,       /* n_head_kv * head_dim                           */
    TN_DIM_HEAD,     /* head_dim (per-head q/k norms)                  */
    TN_DIM_FF,       /* n_ff                                           */
    TN_DIM_VOCAB,    /* n_vocab                                        */
    TN_DIM_ROT_HALF, /* n_rot / 2 (RoPE frequency factors)             */
    TN_DIM_QKV,      /* n_head * head_dim + 2 n_head_kv * head_dim: fused q|k|v rows */
    TN_DIM_FF_UP,    /* ffn_up's rows: n_ff, or 2 n_ff (gate|up) in a gate_up_fused family */
    TN_DIM_EXPERT,   /* n_expert (expert_count)                        */
    TN_DIM_FF_EXP,   /* n_ff_exp: an expert's hidden rows              */
    TN_DIM_Q_NORM,   /* attn_q_norm's length: head_dim, or n_head * head_dim (qk_norm_full) */
    TN_DIM_K_NORM,   /* attn_k_norm's length: head_dim, or n_head_kv * head_dim (qk_norm_full) */
    TN_DIM_FF_SHEXP, /* n_ff_shexp: the shared expert's hidden rows    */
    TN_DIM_HEADS,    /* n_head (attention sinks)                       */
    TN_DIM_O,        /* attn_output's row length: n_head * v_head (v_head: head_dim unless MLA) */
    TN_DIM_Q_LORA,   /* q_lora_rank (deepseek2)                        */
    TN_DIM_KV_LORA,  /* kv_lora_rank                                   */
    TN_DIM_KV_A,     /* kv_lora_rank + n_rot: attn_kv_a_mqa's rows      */
    TN_DIM_NOPE,     /* head_dim - n_rot: a head's unrotated q/k part   */
    TN_DIM_V_HEAD,   /* v_head                                         */
    TN_DIM_KV_B,     /* n_head * (nope + v_head): attn_kv_b's rows     */
} tn_dim;

typedef struct tn_role_info {
    const char *name; /* llama.cpp's name ("attn_q.weight"; per-layer roles get "blk.%d." first) */
    tn_dim ne0, ne1;
    bool matrix;      /* a weight the matmuls read (any type with a matrix kernel); else an f32 vector */
    tn_dim ne2;       /* TN_DIM_1, or TN_DIM_EXPERT for the experts' 3-D matrices */
} tn_role_info;

extern const tn_role_info tn_roles[TN_ROLE_COUNT];

typedef enum tn_need { TN_NEED_NO = 0, TN_NEED_OPT, TN_NEED_REQ } tn_need;

/* A model family. Tensor-driven steps of the block (biases, q/k norms, post norms) run when the
 * layer has the tensor; the loader makes the file's tensors match need[] exactly. */
/* The roles every family requires (the llama block's matrices and norms, embeddings, final norm):
 * the first entries of a descriptor's need table; the family adds its own after. */
#define TN_NEED_CORE_ATTN                                                                                   \
    [TN_ROLE_ATTN_NORM] = TN_NEED_REQ, [TN_ROLE_ATTN_Q] = TN_NEED_REQ, [TN_ROLE_ATTN_K] = TN_NEED_REQ,     \
    [TN_ROLE_ATTN_V] = TN_NEED_REQ, [TN_ROLE_ATTN_OUT] = TN_NEED_REQ, [TN_ROLE_FFN_NORM] = TN_NEED_REQ,   \
    [TN_ROLE_TOKEN_EMBD] = TN_NEED_REQ, [TN_ROLE_OUTPUT_NORM] = TN_NEED_REQ
#define TN_NEED_CORE                                                                                  \
    TN_NEED_CORE_ATTN, [TN_ROLE_FFN_GATE] = TN_NEED_REQ, [TN_ROLE_FFN_UP] = TN_NEED_REQ,                   \
    [TN_ROLE_FFN_DOWN] = TN_NEED_REQ
/* A mixture-of-experts feed-forward on every layer: router and the three expert matrices. */
#define TN_NEED_MOE                                                                                   \
    [TN_ROLE_FFN_GATE_INP] = TN_NEED_REQ, [TN_ROLE_FFN_GATE_EXPS] = TN_NEED_REQ,                          \
    [TN_ROLE_FFN_UP_EXPS] = TN_NEED_REQ, [TN_ROLE_FFN_DOWN_EXPS] = TN_NEED_REQ

typedef struct tn_arch_desc {
    const char *name;           /* general.architecture                                        */
    tn_arch id;
    tn_rope_mode rope;          /* llama: adjacent pairs (GGUF permutes q/k rows); neox: halves */
    tn_ffn_kind ffn;
    float rms_eps;              /* default of <arch>.attention.layer_norm_rms_epsilon          */
    float rope_base;            /* default of <arch>.rope.freq_base                            */
    bool head_dim_keys;         /* its converter writes attention.key_length / value_length     */
    bool rope_dim_key;          /* its converter writes rope.dimension_count                    */
    int32_t nope_step;          /* > 0: layers il with (il + 1) % nope_step == 0 skip RoPE      */
    bool embd_scale;            /* token embeddings scaled by sqrt(n_embd) (gemma)              */
    int32_t synth_swa;          /* tern synth: attention.sliding_window it writes (0: none)    */
    bool gate_up_fused;         /* ffn_up holds gate then up rows (2 n_ff), no ffn_gate (phi3); the
                                 * loader binds FFN_GATE and FFN_UP to its two row halves      */
    bool qk_norm_full;          /* attn_q_norm / attn_k_norm normalise the whole q / k row (olmoe),
                                 * not each head                                                */
    bool moe_renorm;            /* the top-k routing weights divided by their sum (llama.cpp's
                                 * norm_w: qwen3moe, Mixtral) or used as they are (olmoe)       */
    tn_moe_gating moe_gating;   /* how the router's logits choose and weigh experts             */
    bool mla;                   /* multi-head latent attention (deepseek2): the latent is cached */
    bool post_attn_norm_ffn;    /* post_attention_norm is the FFN's input norm (gpt-oss: no
                                 * ffn_norm; the loader binds it to FFN_NORM)                   */
    uint8_t need[TN_ROLE_COUNT];/* tn_need of every role; a family with the MoE roles and the
                                 * dense FFN ones both TN_NEED_OPT (llama) takes one set or the
                                 * other by expert_count (tn_arch_need)                         */
    /* The family's own keys and checks, after the common ones (NULL: none). Errors name the key. */
    tern_status (*load_hparams)(const tn_gguf *g, struct tn_hparams *hp);
    /* tern synth: the family's own metadata keys (NULL: none), written before the common ones;
     * it may adjust hp (n_rot: partial rotary), from which the common keys and shapes follow. */
    void (*synth_keys)(tn_gguf_writer *w, struct tn_hparams *hp);
} tn_arch_desc;

/* The need of role r in a model of hyperparameters hp: the family's table, where a family that
 * may have experts (need[FFN_GATE_INP] != NO) requires the MoE roles and none of the dense FFN
 * ones when hp->n_expert > 0, and the dense ones and no MoE role otherwise. */
tn_need tn_arch_need(const struct tn_hparams *hp, tn_role r);
/* tn_arch_need for layer il: in an MLA family, the q path and the up-projections the
 * hyperparameters choose (q_lora_rank; attn_k_b/v_b or attn_kv_b), and the first
 * n_layer_dense_lead layers dense (no router, experts, shared expert or selection bias). */
tn_need tn_arch_need_layer(const struct tn_hparams *hp, int32_t il, tn_role r);
/* The roles of a MoE layer's feed-forward block (router, gate, up, down experts). */
#define TN_MOE_ROLE(r) ((r) >= TN_ROLE_FFN_GATE_INP && (r) <= TN_ROLE_FFN_DOWN_EXPS)

/* The family with GGUF architecture name (name, len), or NULL. */
const tn_arch_desc *tn_arch_find(const char *name, size_t len);
/* Every registered family, i < tn_arch_count(). */
size_t tn_arch_count(void);
const tn_arch_desc *tn_arch_at(size_t i);
/* "llama, qwen2, ..." into buf (for error messages). */
void tn_arch_names(char *buf, size_t cap);
/* The value of dimension d for hyperparameters hp. */
int64_t tn_dim_value(const struct tn_hparams *hp, tn_dim d);
/* The file name of role r (layer il for per-layer roles) into buf. */
void tn_role_tensor_name(tn_role r, int32_t il, char *buf, size_t cap);
/* Splits a file tensor name into (layer, role): layer -1 for model-wide roles. False if the name
 * is no role's (or its layer number is malformed). */
bool tn_role_parse(const char *name, int32_t *layer, tn_role *role);

#endif
