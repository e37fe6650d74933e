/*
 * Tensor sets are written out here by hand from llama.cpp's model code (src/models/<arch>.cpp), not
 * read from tern's registry, so the loader's registry is checked against an independent list.
 *
 * tiny_model.h — writes small random-weight GGUF files of every family (MoE ones included) for tests (no downloads):
 * a SentencePiece-style vocabulary (<unk> <s> </s>, 256 byte tokens, then word pieces) and
 * weights ~ N(0, scale) quantized to the requested type with tern's reference quantizers.
 */
#ifndef TN_TESTS_TINY_MODEL_H
#define TN_TESTS_TINY_MODEL_H

#include "core/base.h"
#include "tensor/dtype.h"

typedef struct tiny_cfg {
    const char *arch;     /* "llama", "qwen2", "qwen3", "smollm3" (llama's tensors), "gemma2", "gemma3"
                           * or "phi3" (fused attn_qkv and gate|up ffn_up, LongRoPE factors)  */
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    int64_t head_dim;     /* 0: n_embd / n_head; else written as attention.key_length / value_length */
    int64_t n_swa;        /* gemma: attention.sliding_window (0: not written)                         */
    float softcap;        /* gemma: final_logit_softcapping (0: not written)                         */
    float attn_softcap;   /* gemma2: attn_logit_softcapping (0: not written)                         */
    int64_t n_rot;        /* rope.dimension_count (0: not written; phi3 partial rotary)              */
    int64_t n_ctx_orig;   /* phi3: rope.scaling.original_context_length (0: not written)             */
    float rope_attn_factor; /* phi3: rope.scaling.attn_factor (0: not written)                       */
    int64_t n_expert, n_expert_used; /* > 0: experts instead of ffn_gate/up/down on every layer
                           * ("qwen3moe", "qwen2moe" with a shared expert, "olmoe", "gpt-oss" with
                           * sinks and biases, or "llama" as Mixtral); the router stays f32 */
    int64_t n_ff_exp;     /* qwen3moe: expert_feed_forward_length (experts' rows; else n_ff)  */
    int64_t n_ff_shexp;   /* qwen2moe: expert_shared_feed_forward_length (the shared expert's rows;
                           * 0: not written, n_ff)                                            */
    float yarn_factor;    /* > 0: rope.scaling.type yarn with this factor (gpt-oss; original context
                           * from n_ctx_orig)                                                 */
    /* deepseek2 (llama.cpp src/models/deepseek2.cpp; head_dim = nope + n_rot, both required):
     * kv_lora_rank, q_lora_rank (0: attn_q), value head, leading dense layers, shared experts of
     * n_ff_exp rows; kv_b: one attn_kv_b (older conversions) instead of attn_k_b / attn_v_b;
     * v3: sigmoid gating, exp_probs_b, expert groups (n_expert / 2 groups of 2, half used),
     * weights renormalised and scaled by 2.5 */
    int64_t kv_lora, q_lora, v_head, dense_lead, n_shared;
    bool kv_b, v3;
    tn_dtype wtype;       /* type of the matrices (norms/biases stay f32)  */
    tn_dtype out_type;    /* type of output.weight and token_embd          */
    bool tied;            /* no output.weight                              */
    float rope_base;
    uint64_t seed;
} tiny_cfg;

/* Defaults: llama, n_embd 256, 2 layers, 4 heads, 2 kv heads, n_ff 512, vocab 384, ctx 64, f32. */
void tiny_cfg_default(tiny_cfg *c);
/* A tiny mixture-of-experts config of the family arch ("qwen3moe", "qwen2moe", "olmoe", "llama"
 * with experts, "gpt-oss", "deepseek2", "deepseek2-v3", "deepseek2-kvb"), weights wt: 8 experts,
 * top 2 (gpt-oss 4), 2 layers over n_embd 256, the family's own expert shapes. */
tiny_cfg tiny_cfg_moe(const char *arch, tn_dtype wt);
tiny_cfg tiny_cfg_plm(tn_dtype wt);
tern_status tiny_model_write(const char *path, const tiny_cfg *c);
/* A temp path under $TERN_TEST_TMP (or /tmp) unique to this process: "<dir>/<stem>.<pid>.gguf". */
void tiny_tmp_path(char *buf, size_t cap, const char *stem);
/* Writes c to a temp file (stem tag), loads it with default parameters and removes the file; NULL
 * (tern_last_error says why) on failure. */
struct tern_model *tiny_model_load(const tiny_cfg *c, const char *tag);

#endif
