/*
 * train.h — training a Llama-architecture model on CPU (llm.c train_gpt2.c shape).
 *
 * A sizes table of parameter tensors (GGUF names and orientation: a matrix ne = [k, m] holds m
 * rows of k) lays out four flat f32 buffers with identical layouts: params, grads and the two
 * AdamW moments. Activations for a (B, T) batch come from a second sizes table and one
 * allocation. The forward calls the same per-row ops as inference (model/ops.h: RMSNorm, RoPE,
 * SwiGLU) and stores what backward needs; backward is the forward mirrored. Matmuls go to
 * OpenBLAS sgemm, everything else is split over tern's thread pool with fixed chunking, so a run
 * is bit-reproducible for a given thread count.
 *
 * Not here: data (train/data.h), checkpoints and GGUF export (train/ckpt.c), tokenizer training
 * (train/bpe.h). Nothing in this module prints.
 */
#ifndef TN_TRAIN_TRAIN_H
#define TN_TRAIN_TRAIN_H

#include "core/base.h"
#include "core/pool.h"
#include "fmt/gguf.h"
#include "model/model.h"

typedef struct tn_train_cfg {
    int32_t n_vocab, n_ctx, n_embd, n_layer, n_head, n_head_kv, n_ff;
    float rms_eps, rope_base;
} tn_train_cfg;

/* One parameter tensor: its GGUF name and shape, its offset (floats) in every flat buffer. */
typedef struct tn_tparam {
    char name[64];
    int n_dims;
    int64_t ne[2];   /* ne[0] = row length */
    size_t off, n;
    bool decay;      /* weight decay applies (matrices), not to norm weights */
} tn_tparam;

/* Per-layer tensor order in the sizes table. */
enum { TN_TP_ATTN_NORM, TN_TP_WQ, TN_TP_WK, TN_TP_WV, TN_TP_WO, TN_TP_FFN_NORM, TN_TP_GATE, TN_TP_UP,
       TN_TP_DOWN, TN_TP_PER_LAYER };

typedef struct tn_tmodel {
    tn_train_cfg cfg;
    tn_hparams hp;           /* the same hyperparameters struct inference uses         */
    int n_tensors;
    tn_tparam *t;            /* [0] token_embd, 1 + l*9 + j layers, then output_norm, output */
    size_t n_params;
    float *params, *grads, *m, *v; /* one allocation, four equal views              */
    /* activations (tn_tmodel_plan) */
    int B, T;
    float *acts;
    size_t acts_floats;
    float *rope_cs;          /* [T][n_rot] cos/sin from tn_op_rope_cache               */
    int32_t *tokens, *targets; /* [B*T]                                                */
    float *row_loss;         /* [B*T]                                                  */
    tn_pool *pool;
    int n_threads;
} tn_tmodel;

/* Flat-buffer view of tensor i. */
static inline float *tn_tp(const tn_tmodel *m, float *buf, int i) { return buf + m->t[i].off; }
static inline int tn_tp_layer(int l, int j) { return 1 + l * TN_TP_PER_LAYER + j; }

/* Validates cfg (head counts dividing, even head_dim, ...; INVALID_ARG naming the field). */
tern_status tn_train_cfg_check(const tn_train_cfg *c);
/* Bytes that params+grads+moments and the (B, T) activations need. */
void tn_tmodel_mem(const tn_train_cfg *c, int B, int T, int n_threads, size_t *param_bytes, size_t *act_bytes);
/* Creates the model: sizes table, the parameter buffers (zeroed), a pool of n_threads; sets the
 * OpenBLAS thread count to n_threads. Fails with NOMEM naming how much it needed. */
tern_status tn_tmodel_create(const tn_train_cfg *c, int n_threads, tn_tmodel **out);
void tn_tmodel_free(tn_tmodel *m);
/* Random init from seed: matrices N(0, 0.02) (attn_output, ffn_down scaled by 1/sqrt(2 n_layer)),
 * norm weights 1. */
void tn_tmodel_init_random(tn_tmodel *m, uint64_t seed);
/* Copies weights from a loaded GGUF model (any tensor type, dequantized) of the same shape. */
tern_status tn_tmodel_init_from(tn_tmodel *m, const tern_model *src);
/* Plans and allocates the activations for batches of B sequences of T tokens (once). */
tern_status tn_tmodel_plan(tn_tmodel *m, int B, int T);

/* Forward over m->tokens; if targets != NULL computes the mean cross-entropy into *loss.
 * Logits stay in the activations (tn_tmodel_logits) unless backward follows. */
tern_status tn_tmodel_forward(tn_tmodel *m, const int32_t *tokens, const int32_t *targets, double *loss);
/* Logits row i (after a forward). */
const float *tn_tmodel_logits(const tn_tmodel *m, int64_t i);
/* Zeroes grads. */
void tn_tmodel_zero_grad(tn_tmodel *m);
/* Backward of the last forward (which must have had targets); accumulates into grads. */
void tn_tmodel_backward(tn_tmodel *m);

/* ---- optimizer ---------------------------------------------------------------------------- */
typedef struct tn_adamw {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
} tn_adamw;
void tn_adamw_default(tn_adamw *o);
/* Global grad L2 norm (double, fixed order). */
double tn_grad_norm(const tn_tmodel *m);
/* One AdamW step t (1-based) with learning rate lr; grads scaled by clip_scale first. */
void tn_adamw_step(tn_tmodel *m, const tn_adamw *o, float lr, int64_t t, float clip_scale);
/* Warmup (linear, steps 0..warmup-1 reach lr at step warmup-1) then cosine to lr*min_frac. */
float tn_lr_at(int64_t step, int64_t warmup, int64_t total, float lr, float min_frac);

/* ---- GGUF export / checkpoints (ckpt.c) ----------------------------------------------------- */
typedef struct tn_vocab_data tn_vocab_data; /* train/bpe.h */
/* Writes the weights as a llama GGUF (f32, or q8_0 for matrices with mtype == TN_Q8_0) with the
 * vocabulary's tokenizer metadata. Atomic. */
tern_status tn_tmodel_export(const tn_tmodel *m, const tn_vocab_data *voc, const char *name, tn_dtype mtype,
                             const char *path);

#endif
