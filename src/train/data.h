/*
 * data.h — training data: text → token shard → shuffled (B, T) batches.
 *
 * Shard file (little-endian): "TNTK" magic u32, version u32 (1), vocab hash u64 (bpe.h), text
 * hash u64 (FNV-1a of the source texts, to reuse a cached shard), n_tokens u64, then n_tokens
 * i32 ids. Written atomically, memory-mapped for reading, validated (size, ids < n_vocab).
 * Text is cut into paragraphs at blank lines; each paragraph is <s> + its SPM tokens.
 *
 * Samples are windows of T+1 tokens starting at multiples of T. Every 20th window (index % 20 ==
 * 19) is held out for validation. Training windows are visited in a permutation drawn per epoch
 * from (seed, epoch); the cursor (epoch, position) is all the state a checkpoint needs.
 */
#ifndef TN_TRAIN_DATA_H
#define TN_TRAIN_DATA_H

#include "core/file.h"
#include "train/bpe.h"

#define TN_SHARD_MAGIC 0x4B544E54u /* "TNTK" */
#define TN_SHARD_VERSION 1u
#define TN_SHARD_HEADER 32

typedef struct tn_data {
    tn_map map;
    const int32_t *tok;
    /* in-memory samples (tn_data_from_samples): window w is tok[w*(T+1) .. w*(T+1)+T], a target
     * masked (-1) where keep[...] == 0; owned */
    int32_t *own_tok;
    uint8_t *keep;
    uint64_t n_tok;
    int T;
    uint64_t seed;
    int64_t *train_w, *val_w; /* window indices */
    int64_t n_train, n_val;
    int64_t *perm;
    int64_t epoch, pos;       /* cursor */
} tn_data;

/* Tokenizes the UTF-8 texts into a shard at shard_path (reusing it if its header matches). */
tern_status tn_shard_build(const char *const *texts, const size_t *lens, int n_texts, const tn_vocab_data *v,
                           const char *shard_path, uint64_t *n_tokens);
/* Opens a shard; checks magic, version, vocab hash, size and ids. */
tern_status tn_data_open(const char *shard_path, const tn_vocab_data *v, int T, uint64_t seed, tn_data *d);
void tn_data_close(tn_data *d);
/* Next B training windows → tokens/targets [B*T]; advances the cursor. */
tern_status tn_data_next(tn_data *d, int B, int32_t *tokens, int32_t *targets);
/* Takes n samples of T+1 tokens (tok, and keep: 0 where a target is not trained; both tn_malloc'd,
 * owned by d from the call on, even on failure) as windows; val_frac of them (every
 * round(1/val_frac)-th; at least one when val_frac > 0) held out for validation. */
tern_status tn_data_from_samples(int32_t *tok, uint8_t *keep, int64_t n, int T, double val_frac, uint64_t seed, tn_data *d);
/* Sets the cursor (from a checkpoint). */
tern_status tn_data_seek(tn_data *d, int64_t epoch, int64_t pos);
/* Validation batch i of B windows (cycling if fewer); returns false past n_batches. */
void tn_data_val(const tn_data *d, int64_t i, int B, int32_t *tokens, int32_t *targets);
uint64_t tn_text_hash(const char *const *texts, const size_t *lens, int n_texts);

#endif
