/*
 * model.h — the Llama-family model as tern holds it: hyperparameters, weight views into the
 * GGUF mapping, and the vocabulary. Shared by inference (forward.c), training and serving.
 *
 * Supported architectures: "llama" (Llama 1/2/3, TinyLlama, SmolLM, Mistral: RMSNorm, RoPE in
 * adjacent-pair ("normal") mode, GQA, SwiGLU, optional tied output) and "qwen2" (same plus Q/K/V
 * biases, RoPE in half-split ("neox") mode).
 *
 * Weight tensors follow GGUF/ggml orientation: a matrix of ne = [k, m] holds m rows of k elements;
 * y = W x multiplies each row with x. Weights are never copied: views point into the file.
 */
#ifndef TN_MODEL_MODEL_H
#define TN_MODEL_MODEL_H

#include "fmt/gguf.h"
#include "model/tokenizer.h"
#include "tensor/dtype.h"

typedef enum tn_arch { TN_ARCH_LLAMA = 0, TN_ARCH_QWEN2 } tn_arch;
typedef enum tn_rope_mode { TN_ROPE_NORM = 0, TN_ROPE_NEOX } tn_rope_mode;

typedef struct tn_hparams {
    tn_arch arch;
    int32_t n_vocab;
    int32_t n_ctx_train;  /* context_length                                        */
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t n_ff;
    int32_t head_dim;     /* n_embd / n_head (attention.key_length if given)       */
    int32_t n_rot;        /* rope.dimension_count (default head_dim)               */
    float rms_eps;
    float rope_freq_base;
    float rope_freq_scale;/* 1 / rope.scaling.factor for linear scaling           */
    tn_rope_mode rope_mode;
} tn_hparams;

/* A weight view: type, shape (ne[0] = row length) and bytes in the mapped file. */
typedef struct tn_tensor {
    tn_dtype type;
    int64_t ne[4];
    const void *data;
    size_t nbytes;
    const char *name;
} tn_tensor;

typedef struct tn_layer {
    tn_tensor attn_norm, wq, wk, wv, wo;
    tn_tensor bq, bk, bv; /* qwen2 biases (f32); data == NULL when absent */
    tn_tensor ffn_norm, w_gate, w_up, w_down;
} tn_layer;

struct tern_model {
    tn_hparams hp;
    tn_gguf *gguf;
    tn_vocab *vocab;
    tn_tensor tok_embd, output_norm, output; /* output == tok_embd when tied */
    tn_tensor rope_freqs;                    /* Llama 3.1 frequency factors, optional */
    tn_layer *layers;
    uint64_t n_params;
    uint64_t weight_bytes;
    char desc[128];
    char *path;
    void *repacked; /* the matrices moved out of the file mapping at load (tn_model_repack: interleaved
                     * layouts, other types as they are; 2 MiB pages), or NULL */
};

/* Loads and validates hyperparameters and every tensor's presence, type and shape; errors name
 * the key or tensor (robustness.md G25..G28). */
tern_status tn_model_load_gguf(tn_gguf *g, tern_model **out);

/* Moves q4_0, q8_0 and symmetric tq4 weight matrices into the *_r16 layouts and tq1 matrices into
 * the *_l32 layouts (quant/repack.h; rows a multiple of the layout's group; not a tied output)
 * where the kernel table has a SIMD kernel for them; from a mapped file, every other matrix (not a
 * tied output) is copied as it is, so that all of them sit in one buffer of 2 MiB pages
 * (TERN_HUGEPAGES=0: 4 KiB). The file pages of moved tensors are released from the mapping. */
tern_status tn_model_repack(tern_model *m);

/* Row `row` of a weight matrix as floats (k = ne[0]); used for embedding lookup. */
void tn_tensor_get_row(const tn_tensor *t, int64_t row, float *out);

#endif
