/*
 * train.h — training llama, qwen2 and qwen3 models on CPU (llm.c train_gpt2.c shape).
 *
 * The family comes from the registry (model/arch/): the sizes table holds the roles the family
 * requires (plus an untied output), with the registry's names and shapes (GGUF orientation: a
 * matrix ne = [k, m] holds m rows of k); the block's optional steps follow the roles present
 * (q/k/v biases, per-head q/k RMSNorm) and the descriptor's RoPE mode (adjacent pairs or halves).
 * The table lays out four flat f32 buffers with identical layouts: params, grads and the two
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
    int32_t head_dim;            /* 0: n_embd / n_head; query rows are n_head * head_dim   */
    const tn_arch_desc *arch;    /* the family (registry entry); NULL: llama                */
    bool forward_only;           /* zeroth-order training (train/zo.h): only the parameters are
                                  * allocated (no gradients, no AdamW moments) and the
                                  * activations hold one layer's buffers (no backward)        */
} tn_train_cfg;

/* One parameter tensor: its GGUF name and shape, its offset (floats) in every flat buffer. */
typedef struct tn_tparam {
    char name[64];
    tn_role role;
    int n_dims;
    int64_t ne[2];   /* ne[0] = row length */
    size_t off, n;
    bool decay;      /* weight decay applies (matrices), not to norm weights or biases */
    bool frozen;     /* LoRA: not trained (AdamW and the gradient norm skip it)                */
    const tn_tensor *base; /* LoRA: the frozen matrix in the base file (n == 0: not in params) */
    int lora;        /* LoRA: index of this matrix's lora_a (lora_b follows), 0 if none       */
} tn_tparam;

typedef struct tn_tmodel {
    tn_train_cfg cfg;
    tn_hparams hp;           /* the same hyperparameters struct inference uses         */
    int n_tensors;
    tn_tparam *t;            /* [0] token_embd, 1 + l*per_layer + j layers, then output_norm, output */
    int per_layer;           /* tensors per layer: the family's required per-layer roles  */
    int8_t slot[TN_ROLE_N_LAYER]; /* role -> position within a layer, -1 if not trained  */
    size_t n_params;
    float *params, *grads, *m, *v; /* one allocation, four equal views (cfg.forward_only:
                                    * params only, the others NULL)                     */
    /* activations (tn_tmodel_plan) */
    int B, T;
    float *acts;
    size_t acts_floats;
    float *rope_cs;          /* [T][n_rot] cos/sin from tn_op_rope_cache               */
    int32_t *tokens, *targets; /* [B*T]                                                */
    float *row_loss;         /* [B*T]                                                  */
    tn_pool *pool;
    int n_threads;
    int32_t tr_il;           /* tracing: the layer being run, -1 outside the layers       */
    /* LoRA (tn_tmodel_create_lora): the base stays in its file's type and is dequantized a tile
     * of tile_rows rows at a time in forward (x W^T) and backward (dY W); W' = W + scale B A. */
    const tern_model *base;  /* borrowed; NULL for full training                         */
    int lora_rank, n_lora;   /* rank; number of adapted matrices                          */
    float lora_alpha, lora_scale; /* scale = alpha / rank                                 */
    int64_t tile_rows;
    float *lora_u, *lora_du; /* [B*T][rank] scratch (tn_tmodel_plan)                      */
    float *wtile;            /* [tile_rows][max k] dequantized base rows                  */
    bool base_int8;          /* tn_lora_cfg.base_int8                                     */
    void *lora_xq;           /* base_int8: [B*T] rows of x in the activation format      */
    float *lora_tmp;         /* base_int8: [B*T][n_embd] product before a residual add    */
    /* memory (set before tn_tmodel_plan / a forward): what backward recomputes instead of keeping
     * per layer, and the number of targets the loss gradient is averaged over (0: this forward's;
     * gradient accumulation sets the whole batch's) */
    int recompute;           /* tn_recompute                                              */
    int ce_rows;             /* logits rows held at a time (tn_ce_rows; 0: auto); set before tn_tmodel_plan */
    int64_t ce_denom;
    int64_t ce_d;            /* the last forward's loss-gradient denominator              */
    /* Backward hook (NULL: none): called with l after layer l's gradients are final (l = n_layer-1
     * down to 0; the head's are final by then too) and with -1 when all are (after the embedding).
     * Data-parallel training starts all-reducing finished gradients here (train/dist.c). */
    void (*grads_ready)(void *user, int l);
    void *grads_ready_user;
} tn_tmodel;

/* What the forward keeps per layer for backward. NONE: everything. ATTN (Korthikanti et al.'s
 * selective recomputation): the matmul outputs, not the attention probabilities [B][H][T][T],
 * which backward recomputes from the kept q, k, v into one buffer shared by the layers. FULL:
 * only each layer's input; backward reruns the layer's forward (all but its last projection)
 * into one layer's buffers. Same ops in the same order: gradients are bit-identical. */
typedef enum tn_recompute { TN_RECOMPUTE_NONE, TN_RECOMPUTE_ATTN, TN_RECOMPUTE_FULL } tn_recompute;
/* "none", "attn", "full"; parse: false on another name. */
const char *tn_recompute_name(tn_recompute r);
bool tn_recompute_parse(const char *s, tn_recompute *r);

/* Chunked logits and cross-entropy. When a micro-batch has more than ce_rows tokens, the output
 * projection, softmax, loss and the logits' gradient run ce_rows rows at a time: forward keeps
 * only one chunk's logits [ce_rows][V] (the loss per row), backward recomputes each chunk's
 * logits, turns them into their gradient and adds d output / writes d xf per chunk (one more
 * output matmul per step, no [B*T][V] buffer). Otherwise one chunk, as before: forward's logits
 * become dlogits in place. TN_CE_ROWS is the default chunk; with large vocabularies fewer rows
 * (a chunk <= 32 MiB of f32, at least 32 rows). */
#define TN_CE_ROWS 256
/* Rows of logits held at a time for micro-batches of B x T tokens (ce_rows > 0: that many, <= 0:
 * the default above), never more than B*T. */
int64_t tn_ce_rows(const tn_train_cfg *c, int B, int T, int ce_rows);

/* Flat-buffer view of tensor i. */
static inline float *tn_tp(const tn_tmodel *m, float *buf, int i) { return buf + m->t[i].off; }
/* Index of layer l's tensor of role r (which the family must have: m->slot[r] >= 0). */
static inline int tn_tp_role(const tn_tmodel *m, int l, tn_role r) { return 1 + l * m->per_layer + m->slot[r]; }
/* Index of output_norm (output follows it). */
static inline int tn_tp_head(const tn_tmodel *m) { return 1 + m->cfg.n_layer * m->per_layer; }

/* The family of c (llama when c->arch is NULL). */
const tn_arch_desc *tn_train_arch(const tn_train_cfg *c);
/* Whether training runs family a's block: SwiGLU, RoPE on every layer, no embedding scale or
 * sliding window, and every role it requires is one the trainer has a backward for. */
bool tn_train_arch_ok(const tn_arch_desc *a);
/* "llama, qwen2, qwen3": the families tn_train_arch_ok accepts, into buf (for messages). */
void tn_train_arch_names(char *buf, size_t cap);
/* The training config of a loaded model: its family, shape, rms_eps, RoPE base; n_ctx capped at
 * its training context (0: that context). UNSUPPORTED when training does not run its family. */
tern_status tn_train_cfg_from(const tern_model *src, int32_t n_ctx, tn_train_cfg *c);
/* Validates cfg (a trainable family, head counts dividing, even head_dim, ...; INVALID_ARG
 * naming the field). */
tern_status tn_train_cfg_check(const tn_train_cfg *c);
/* Bytes that params+grads+moments and the (B, T) activations need. */
void tn_tmodel_mem(const tn_train_cfg *c, int B, int T, int n_threads, size_t *param_bytes, size_t *act_bytes);
/* Creates the model: sizes table, the parameter buffers (zeroed), a pool of n_threads; sets the
 * OpenBLAS thread count to n_threads. Fails with NOMEM naming how much it needed. */
tern_status tn_tmodel_create(const tn_train_cfg *c, int n_threads, tn_tmodel **out);
void tn_tmodel_free(tn_tmodel *m);
/* ---- LoRA (QLoRA) ------------------------------------------------------------------------ */
/* Adapted matrices: one bit per role (1u << TN_ROLE_ATTN_Q, ...). */
typedef struct tn_lora_cfg {
    int rank;
    float alpha;             /* scale = alpha / rank; 0: alpha = rank                     */
    uint32_t targets;        /* bits of tn_role; 0: q, k, v, o, gate, up, down            */
    uint64_t seed;           /* lora_a init                                              */
    /* Forward products x W^T of quantized frozen matrices with inference's int8 kernels: x
     * quantized to the type's activation format (q8_0 / q8_K), as `tern generate` computes them,
     * instead of W dequantized to f32 for an f32 GEMM (several times faster; the backward's dY W
     * stays f32). false: f32 forward, the numerics the PyTorch golden and gradient tests pin. */
    bool base_int8;
} tn_lora_cfg;
/* Parses "q,k,v,o,gate,up,down" (any subset, comma-separated) into role bits; false on an unknown
 * name (written into bad, cap bytes). */
bool tn_lora_parse_targets(const char *s, uint32_t *bits, char *bad, size_t cap);
/* Creates a LoRA model over base (borrowed: it must outlive the model; load it with repack off):
 * the base's shape and family (as tn_tmodel_init_from checks), its matrices frozen in their file
 * type, its norm weights and biases copied (frozen), and per layer and target role a lora_a
 * [rank][k] ~ U(-1/sqrt(k), 1/sqrt(k)) and lora_b [m][rank] = 0 — the only trained tensors. */
tern_status tn_tmodel_create_lora(const tn_train_cfg *c, const tern_model *base, const tn_lora_cfg *lc, int n_threads,
                                  tn_tmodel **out);
/* Writes the adapter as llama.cpp's GGUF LoRA adapter: general.type "adapter", adapter.type "lora",
 * adapter.lora.alpha, general.architecture the base's; tensors "<base name>.lora_a" ne [k, rank]
 * and ".lora_b" ne [rank, m], f32. Atomic. */
tern_status tn_lora_export(const tn_tmodel *m, const char *name, const char *path);

/* Random init from seed: matrices N(0, 0.02) (attn_output, ffn_down scaled by 1/sqrt(2 n_layer)),
 * norm weights 1, biases 0. */
void tn_tmodel_init_random(tn_tmodel *m, uint64_t seed);
/* Copies weights from a loaded GGUF model (any tensor type, dequantized) of the same family and
 * shape; UNSUPPORTED naming what differs (family, a dimension, RoPE scaling, an extra tensor). */
tern_status tn_tmodel_init_from(tn_tmodel *m, const tern_model *src);
/* Plans and allocates the activations for batches of B sequences of T tokens (once). */
tern_status tn_tmodel_plan(tn_tmodel *m, int B, int T);

/* ---- memory plan ---------------------------------------------------------------------------- */
/* Activation kinds per layer (the plan's rows). */
enum { TN_MEM_SAVED_IN, TN_MEM_ATTN_QKV, TN_MEM_ATTN_PROBS, TN_MEM_FFN, TN_MEM_N_KIND };
/* The bytes of one configuration, as tn_tmodel_plan allocates them (and the mapped base). */
typedef struct tn_mem_plan {
    int batch, micro_batch, accum, T;
    tn_recompute recompute;
    size_t params, grads, moments; /* trained f32 buffers (moments: both)                     */
    size_t frozen;                 /* LoRA: the base file's weights, mapped (read, not copied) */
    size_t kept[TN_MEM_N_KIND];    /* per layer kept for backward, over all layers: saved
                                    * inputs (x, normed x, q/k before their norm), q/k/v and
                                    * the attention output, the probabilities, FFN gate/up/hidden */
    size_t recomp[TN_MEM_N_KIND];  /* the one layer's buffers backward recomputes into         */
    size_t head;                   /* final norm input and output                              */
    size_t logits;                 /* [ce_rows][n_vocab] (dlogits in place)                    */
    int64_t ce_rows;               /* logits rows at a time (micro_batch*T: not chunked)        */
    size_t scratch;                /* backward gradients, per-thread partials, LoRA u/du + tile */
    size_t caches;                 /* RoPE cos/sin, tokens, targets, row losses                */
    size_t acts;                   /* everything tn_tmodel_plan allocates (kept..caches)       */
    size_t peak;                   /* params + grads + moments + frozen + acts                 */
} tn_mem_plan;
/* The plan of m for batches of `batch` sequences of T tokens split into accum micro-batches
 * (accum must divide batch) with recomputation rc. */
void tn_tmodel_mem_plan(const tn_tmodel *m, int batch, int accum, int T, tn_recompute rc, tn_mem_plan *p);
/* Chooses the configuration for a peak <= budget bytes: micro-batches (divisors of batch, largest
 * first) with no recomputation, then attn, for each micro-batch in turn; then full recomputation
 * from the largest micro-batch down. accum > 0 or rc >= 0 fix that part. Returns false when
 * nothing fits, *p then holding the smallest allowed configuration (micro-batch 1, full). */
bool tn_mem_choose(const tn_tmodel *m, int batch, int T, size_t budget, int accum, int rc, tn_mem_plan *p);
/* The plan as text lines for a log (each without a newline; the callback's user is passed). */
void tn_mem_plan_lines(const tn_mem_plan *p, int n_layer, void (*line)(const char *text, void *user), void *user);
/* Forward + backward over n_micro micro-batches of m->B sequences each (tokens and targets
 * [n_micro * m->B * m->T]) into zeroed grads: the gradient of the mean loss over all their
 * targets, *loss that mean. Gradient accumulation: the update of one batch of n_micro * m->B. */
tern_status tn_tmodel_grads(tn_tmodel *m, const int32_t *tokens, const int32_t *targets, int n_micro, double *loss);

/* Forward over m->tokens; if targets != NULL computes the mean cross-entropy into *loss over the
 * targets that are not -1 (masked: no loss, no gradient; 0 when all are).
 * Logits stay in the activations (tn_tmodel_logits) unless backward follows (with targets and one
 * chunk they become dlogits); chunked (tn_ce_rows < B*T), only the last chunk's rows stay. */
tern_status tn_tmodel_forward(tn_tmodel *m, const int32_t *tokens, const int32_t *targets, double *loss);
/* Logits row i (after a forward); NULL for a row not held (chunked: before the last chunk). */
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
/* Writes the weights as a GGUF of the model's family (its general.architecture and keys; vectors
 * f32, matrices converted to mtype with its reference quantizer — rows that are not whole blocks
 * of mtype stay f32) with the vocabulary's tokenizer metadata. Atomic. UNSUPPORTED for a type
 * without a reference quantizer (tn_export_type_ok). */
tern_status tn_tmodel_export(const tn_tmodel *m, const tn_vocab_data *voc, const char *name, tn_dtype mtype,
                             const char *path);
/* The same with either voc or, when voc is NULL, every tokenizer.* key of tok_src copied as it is
 * (full fine-tuning keeps the base's tokenizer and chat template). */
tern_status tn_tmodel_export_tok(const tn_tmodel *m, const tn_vocab_data *voc, const tn_gguf *tok_src, const char *name,
                                 tn_dtype mtype, const char *path);
/* Whether tn_tmodel_export can write matrices of type t (f32, f16, bf16, q8_0, q4_0, q4_K, ...:
 * the types with a reference quantizer that needs no importance matrix). */
bool tn_export_type_ok(tn_dtype t);

#endif
