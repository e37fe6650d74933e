/*
 * tokenizer.h — the vocabulary and tokenizer of a model, loaded from GGUF `tokenizer.ggml.*` keys.
 *
 * Two tokenizer families, both matching llama.cpp (commit 34af94cd9) token for token:
 *   - "llama" (SPM): SentencePiece-style BPE over UTF-8 characters driven by token scores; spaces
 *     become U+2581, an optional leading space, byte fallback to <0xXX> tokens, else unk.
 *   - "gpt2" (BPE): byte-level BPE driven by merge ranks, after the pre-tokenizer regex set named
 *     by `tokenizer.ggml.pre` (PCRE2) split the text into words.
 * Other `tokenizer.ggml.model` values (bert, t5, rwkv, ...) are TERN_ERR_UNSUPPORTED.
 *
 * Special tokens (control, user-defined, unknown) are split out of the raw text before the
 * tokenizer runs: user-defined tokens always, control/unknown ones only when parse_special.
 *
 * Ownership: tn_vocab_load copies everything it keeps (token texts, merges, pieces) into its own
 * allocations, so the tn_gguf may be freed right after loading. A loaded vocab is immutable:
 * every function below may be called from any number of threads at once.
 */
#ifndef TN_MODEL_TOKENIZER_H
#define TN_MODEL_TOKENIZER_H

#include "core/base.h"
#include "fmt/gguf.h"

typedef struct tn_vocab tn_vocab;

/* Token types as stored in tokenizer.ggml.token_type (0 = undefined, read as normal). */
enum {
    TN_TOKEN_TYPE_UNDEFINED = 0, TN_TOKEN_TYPE_NORMAL = 1, TN_TOKEN_TYPE_UNKNOWN = 2,
    TN_TOKEN_TYPE_CONTROL = 3, TN_TOKEN_TYPE_USER_DEFINED = 4, TN_TOKEN_TYPE_UNUSED = 5,
    TN_TOKEN_TYPE_BYTE = 6
};

/* Builds the vocabulary from g's tokenizer.ggml.* metadata. Validates: `model` is "llama" or
 * "gpt2" (else TERN_ERR_UNSUPPORTED naming it); tokens is a string array, scores an f32 array
 * and token_type an i32 array of the same length, token types 0..6, no duplicate token texts;
 * merges (gpt2) a string array whose entries contain a separating space; bos/eos/unk ids inside
 * the vocabulary (u32 0xFFFFFFFF or -1 mean "none"; other special ids out of range are ignored
 * with a warning, as llama.cpp does); byte tokens spelled <0xXX>. Errors are TERN_ERR_FORMAT
 * naming the key and index. An unknown `pre` falls back to "default" with a warning through
 * tn_log; a `pre` llama.cpp knows but tern does not implement is TERN_ERR_UNSUPPORTED. On
 * failure *out stays NULL. */
tern_status tn_vocab_load(const tn_gguf *g, tn_vocab **out);
void tn_vocab_free(tn_vocab *v);

int32_t tn_vocab_n(const tn_vocab *v);
int32_t tn_vocab_bos(const tn_vocab *v); /* -1 if none (all five) */
int32_t tn_vocab_eos(const tn_vocab *v);
int32_t tn_vocab_eot(const tn_vocab *v);
int32_t tn_vocab_unk(const tn_vocab *v);
int32_t tn_vocab_pad(const tn_vocab *v);
/* End of generation: eos, eot, eom and the tokens llama.cpp recognises by text (<|im_end|>,
 * <|endoftext|>, <end_of_turn>, ...). False for ids out of range. */
bool tn_vocab_is_eog(const tn_vocab *v, int32_t id);
bool tn_vocab_add_bos(const tn_vocab *v);
bool tn_vocab_add_eos(const tn_vocab *v);
bool tn_vocab_add_space_prefix(const tn_vocab *v);
const char *tn_vocab_type_name(const tn_vocab *v); /* "spm" or "bpe" */
const char *tn_vocab_pre_name(const tn_vocab *v);  /* pre-tokenizer in use, e.g. "llama3" */
/* Raw token text as stored in the vocabulary (NUL-terminated), NULL for ids out of range. */
const char *tn_vocab_text(const tn_vocab *v, int32_t id);
int32_t tn_vocab_token_type(const tn_vocab *v, int32_t id); /* TN_TOKEN_TYPE_*, -1 if out of range */

/* Tokenizes text[0..len) (any bytes; invalid UTF-8 is handled as llama.cpp does and never
 * fails). add_special: BOS (and EOS) as the vocabulary says. parse_special: control-token text
 * such as "<|eot_id|>" becomes that token. Writes min(count, cap) ids to out and the full count
 * to *n_out; if cap is too small returns TERN_ERR_FULL (*n_out = count needed). out may be NULL
 * when cap == 0. TERN_ERR_NOMEM on allocation failure, TERN_ERR_INVALID_ARG for NULL v/n_out or
 * a NULL text with len > 0. */
tern_status tn_tokenize(const tn_vocab *v, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t *out, int32_t cap, int32_t *n_out);

/* Writes the bytes of token id's piece to buf (no NUL). Returns the length, -(needed) if cap is
 * too small, INT32_MIN for an id out of range. special = false renders control and unknown
 * tokens as empty pieces. */
int32_t tn_token_to_piece(const tn_vocab *v, int32_t id, char *buf, int32_t cap, bool special);

/* Concatenates the pieces of ids[0..n) into buf, then (BPE vocabularies marked
 * clean_up_tokenization_spaces) removes the spaces before ?!., and in contractions as
 * llama.cpp does. remove_leading_space: when the vocabulary adds a space prefix (SPM), drop
 * one leading space of the first token's piece — llama.cpp's llama_detokenize with
 * remove_special = false (a leading BOS is that first token, so nothing is dropped then).
 * Returns the length, -(needed) if cap is too small, INT32_MIN if any id is out of range. */
int32_t tn_detokenize(const tn_vocab *v, const int32_t *ids, int32_t n, char *buf, int32_t cap,
                      bool remove_leading_space, bool special);

#endif
