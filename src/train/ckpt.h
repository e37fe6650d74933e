/*
 * ckpt.h — training checkpoints (robustness.md §3.2).
 *
 * A checkpoint is a GGUF file <dir>/ckpt-<step>.gguf holding the flat params and both AdamW
 * moments as three f32 tensors, plus the step, the data cursor, the seed, the config (with the
 * family and head_dim), the vocabulary hash and the loss history under tern.train.* keys. It is
 * written atomically (temp + fsync + rename); then the manifest <dir>/latest (text: file name,
 * size, 64-bit hash of the file) is written the same way. The manifest is the commit point: a
 * checkpoint it does not name, or whose size/hash does not match, is never loaded. Once the new manifest is durable the
 * directory keeps the new and the previous checkpoint (older ones are deleted) and loses temp
 * files left by writers that died (kill -9 during a save).
 */
#ifndef TN_TRAIN_CKPT_H
#define TN_TRAIN_CKPT_H

#include "train/train.h"

typedef struct tn_train_state {
    int64_t step;            /* steps done */
    int64_t epoch, pos;      /* data cursor */
    uint64_t seed;
    uint64_t vocab_hash;
    float *loss;             /* [step] training loss per step (tn_malloc'd, capacity loss_cap) */
    float *lr;               /* [step] */
    int64_t loss_cap;
    int32_t *val_step;       /* [n_val] */
    float *val_loss;
    int64_t n_val, val_cap;
    float zo_clip;           /* --zo one-byte exchange: the adaptive clip range after step
                              * `step` (zo.h); 0: not started (written only when > 0)      */
} tn_train_state;

void tn_train_state_free(tn_train_state *s);
tern_status tn_train_state_push(tn_train_state *s, float loss, float lr);
tern_status tn_train_state_push_val(tn_train_state *s, int32_t step, float loss);

tern_status tn_ckpt_save(const tn_tmodel *m, const tn_train_state *st, const char *dir);
/* Loads the checkpoint named by <dir>/latest into m and st (st's arrays replaced). *found = false
 * (and TERN_OK) when there is no manifest. Corrupt or mismatching checkpoints are TERN_ERR_FORMAT. */
tern_status tn_ckpt_load(tn_tmodel *m, tn_train_state *st, const char *dir, bool *found);
/* 64-bit hash of a buffer (used for manifests and weight hashes). */
uint64_t tn_hash64(const void *p, size_t n, uint64_t h);

#endif
