/*
 * run.h — a whole training run: vocabulary, data shard, model, the step loop with validation,
 * checkpoints and resume, the output GGUF and the loss curve (CSV + SVG next to the output).
 * `tern train` is flag parsing around tn_train_run; tests call it directly.
 *
 * Nothing here prints: progress and notes go to the callbacks. A run stopped by *stop != 0
 * writes a checkpoint (when ckpt_dir is set) and returns TERN_ERR_ABORTED.
 */
#ifndef TN_TRAIN_RUN_H
#define TN_TRAIN_RUN_H

#include <signal.h>

#include "train/dist.h"
#include "train/zo.h"
#include "train/train.h"

typedef struct tn_train_progress {
    int64_t step, steps;     /* steps done / total                               */
    double loss, val_loss;   /* val_loss NaN when not evaluated at this step      */
    float lr;
    double tok_per_s, eta_s, grad_norm;
    uint64_t comm_bytes;     /* --dist: bytes this rank passed to MPI so far          */
    double link_wait_s;      /* --sim-link: seconds slept for the simulated link so far */
    bool final;
} tn_train_progress;

typedef struct tn_train_opts {
    const char *const *data;  /* text files */
    int n_data;
    const char *tokenizer;    /* GGUF with a llama (SPM) vocabulary, or NULL      */
    int32_t vocab_size;       /* when learning the vocabulary from the data       */
    const char *init;         /* GGUF model to fine-tune, or NULL                 */
    tn_train_cfg cfg;         /* ignored with init (taken from the model: family, shape,
                               * rms_eps, rope_base), except n_ctx                     */
    int batch, steps, warmup;
    tn_adamw opt;
    tn_optim optim;           /* AdamW (default) or SGD                            */
    tn_dist_opts dist;        /* --dist (dist.h); method TN_DIST_NONE: one process */
    tn_zo_opts zo;            /* --zo: SPSA steps instead of backward + optimizer  */
    float min_lr_frac;
    uint64_t seed;
    int n_threads;
    int val_every, val_batches;
    const char *ckpt_dir;
    int ckpt_every;
    bool resume;
    const char *out;
    const char *name;
    /* LoRA fine-tuning (`tern finetune`): lora.rank > 0 trains an adapter over init (the base,
     * frozen in its file's type); data are JSONL chats or plain text (train/ftdata.h), tokenized
     * with the base's tokenizer; out is the adapter (written also when stopped). */
    tn_lora_cfg lora;
    /* full fine-tuning (`tern finetune --full`, lora.rank 0): every weight of init (F32, F16 or
     * BF16 matrices; quantized bases are refused) trained in f32 on finetune's data (JSONL chats
     * or plain text, as LoRA); out is a model of out_type with init's tokenizer keys (written also
     * when stopped) */
    bool full;
    bool skip_bad_lines;
    double val_split;         /* LoRA: fraction held out (0: none)                       */
    double epochs;            /* > 0: steps = ceil(epochs * training samples / batch)      */
    tn_dtype out_type;        /* matrices' type in the output (tn_export_type_ok)  */
    /* memory (train.h, tn_mem_plan): each batch as grad_accum micro-batches (0: 1, or the
     * budget's choice), what backward recomputes (tn_recompute; -1: none, or the budget's
     * choice), a budget for the predicted peak in bytes (0: none; tn_mem_choose) */
    int grad_accum;
    int recompute;
    uint64_t mem_budget;
    int ce_rows;              /* logits rows at a time (tn_ce_rows; 0: its default)      */
    volatile sig_atomic_t *stop;
    void (*progress)(const tn_train_progress *p, void *user);
    void (*note)(const char *msg, void *user);
    void *user;
    /* results */
    double final_loss, final_val_loss, tok_per_s;
    uint64_t weights_hash;    /* tn_hash64 of the final f32 params                */
    size_t planned_bytes;     /* the plan's predicted peak                         */
    tn_mem_plan plan;
    uint64_t comm_bytes;      /* --dist: bytes this rank passed to MPI            */
    double link_wait_s;       /* --sim-link: seconds this rank slept for the simulated link */
    int dist_rank, dist_size; /* --dist: this rank, the number of ranks (else 0, 1) */
} tn_train_opts;

void tn_train_opts_default(tn_train_opts *o);
tern_status tn_train_run(tn_train_opts *o);

#endif
