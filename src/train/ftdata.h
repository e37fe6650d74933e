/*
 * ftdata.h — fine-tuning samples from the user's files, tokenized with the base model's own
 * tokenizer (tern_tokenize), for tn_data_from_samples.
 *
 * A file whose name ends in ".jsonl" holds one chat per line: {"messages": [{"role": "system" |
 * "user" | "assistant", "content": "..."}, ...]} (blank lines ignored). Each chat is rendered
 * with the model's chat template (tern_chat_template_detect), one sample of up to T+1 tokens
 * (longer chats are cut; shorter ones padded with masked targets): the loss is taken on the
 * assistant turns only — the text each assistant message adds after the template's generation
 * prompt, its end-of-turn marker included. A malformed line, or a chat with no assistant turn, is
 * an error naming the file and line (or, with skip_bad, a note and the line is skipped).
 * Any other file is plain text: paragraphs (blank-line separated) with BOS, concatenated and cut
 * into windows of T+1 tokens that overlap by one; every target is trained.
 */
#ifndef TN_TRAIN_FTDATA_H
#define TN_TRAIN_FTDATA_H

#include "tern/tern.h"

typedef struct tn_ft_stats {
    int64_t n_chats, n_skipped, n_cut, n_text_windows;
    int64_t n_tokens, n_trained; /* tokens in samples (without padding); targets trained */
} tn_ft_stats;

/* Reads paths[0..n) into *n_samples samples of T+1 tokens: *tok (ids) and *keep (1 where the
 * target at that position is trained), both tn_malloc'd (caller frees). note (may be NULL) gets
 * the skipped lines' messages. FORMAT naming file:line on bad data, IO on unreadable files. */
tern_status tn_ft_samples(const tern_model *m, const char *const *paths, int n, int T, bool skip_bad,
                          void (*note)(const char *msg, void *user), void *user, int32_t **tok, uint8_t **keep,
                          int64_t *n_samples, tn_ft_stats *st);

#endif
