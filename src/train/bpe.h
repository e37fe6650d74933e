/*
 * bpe.h — learning a byte-fallback BPE vocabulary and encoding text with it, written as a
 * SentencePiece-style "llama" vocabulary so that tern's and llama.cpp's SPM tokenizers load it:
 *   id 0 <unk> (unknown), 1 <s> (control, BOS), 2 </s> (control, EOS), 3..258 <0x00>..<0xFF>
 *   (byte tokens), then single characters of the corpus, then merges in rank order;
 *   score = -rank, so the SPM tokenizer (highest score merges first) replays the merges.
 * Text is normalised the SPM way: spaces become U+2581 "▁" and a "▁" is prefixed. Pre-tokens are
 * "▁word" runs and single newlines; no merge crosses them, so a learned token holds "▁" only at
 * its start and per-word encoding equals whole-text SPM encoding (llama.cpp llm_tokenizer_spm).
 *
 * The encoder here is the trainer's fast path (a word cache over the same SPM algorithm);
 * tests/train checks it token for token against model/tokenizer.h.
 */
#ifndef TN_TRAIN_BPE_H
#define TN_TRAIN_BPE_H

#include "core/base.h"
#include "fmt/gguf.h"

struct tn_vocab_data {
    int32_t n;
    char **text;      /* NUL-terminated token texts (tn_malloc'd) */
    float *score;
    int32_t *type;    /* TN_TOKEN_TYPE_* */
    int32_t bos, eos, unk;
};
typedef struct tn_vocab_data tn_vocab_data;

#define TN_BPE_FIRST_BYTE 3

/* Checks that text is valid UTF-8; FORMAT naming `what` and the byte offset otherwise. */
tern_status tn_utf8_check(const char *text, size_t len, const char *what);

/* Learns a vocabulary of exactly vocab_size tokens from texts[i][0..lens[i]) (valid UTF-8).
 * INVALID_ARG if the corpus is empty or cannot support vocab_size (says how many it supports). */
tern_status tn_bpe_train(const char *const *texts, const size_t *lens, int n_texts, int32_t vocab_size,
                         tn_vocab_data **out);
/* Reads tokenizer.ggml.{model,tokens,scores,token_type,*_token_id} ("llama" model only). */
tern_status tn_vocab_data_from_gguf(const tn_gguf *g, tn_vocab_data **out);
void tn_vocab_data_free(tn_vocab_data *v);
/* Writes the tokenizer.ggml.* keys. */
tern_status tn_vocab_data_write(const tn_vocab_data *v, tn_gguf_writer *w);
uint64_t tn_vocab_data_hash(const tn_vocab_data *v);

typedef struct tn_spm_enc tn_spm_enc;
tern_status tn_spm_enc_create(const tn_vocab_data *v, tn_spm_enc **out);
void tn_spm_enc_free(tn_spm_enc *e);
/* Appends the tokens of text[0..len) (with the "▁" prefix, no BOS) to *toks (tn_realloc'd,
 * *n used, *cap allocated). */
tern_status tn_spm_encode(tn_spm_enc *e, const char *text, size_t len, int32_t **toks, size_t *n, size_t *cap);

#endif
